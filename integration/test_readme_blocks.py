"""Every python code block of the README and of the docs pages runs, as a reader would paste them.

The README's blocks run in order in one namespace; each page under docs/ runs its blocks in
order in a namespace of its own (a reader may open any page first, so a page imports what it
uses). ``spark`` (the test session) is given, and paths under ``/data/`` and ``/chk/`` are moved
into a temporary folder, one per page. Only blocks fenced as ```` ```python ```` run: a block
that cannot run here (it needs a Redis server, a bucket, a catalog file, a shell) is fenced as
```` ```py ````, ```` ```bash ````, ```` ```text ```` or ```` ```toml ````. A block that fails
names its file and line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from helpers import CONNECT

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """(line number, code) of each ```python block."""
    text = path.read_text()
    return [
        (text[: m.start()].count("\n") + 1, m.group(1))
        for m in re.finditer(r"^```python\n(.*?)^```$", text, flags=re.M | re.S)
    ]


def pages_with_code() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if python_blocks(p))


def run_blocks(spark, path: Path, workdir: Path) -> None:  # type: ignore[no-untyped-def]
    name = str(path.relative_to(ROOT))
    namespace: dict[str, object] = {"spark": spark}
    try:
        for line, code in python_blocks(path):
            code = code.replace('"/data/', f'"{workdir}/data/').replace(
                '"/chk/', f'"{workdir}/chk/'
            )
            if CONNECT:  # a Connect user's session comes from remote(...), as the test's does
                remote = f'remote("{os.environ["ROWTIME_CONNECT_URL"]}")'
                code = code.replace('master("local[2]")', remote)
            try:
                exec(compile(code, f"{name}:{line}", "exec"), namespace)
            except Exception as e:
                raise AssertionError(f"the python block at {name}:{line} failed: {e!r}") from e
    finally:
        for query in spark.streams.active:
            query.stop()


def test_readme_python_blocks_run(spark, workdir: Path) -> None:
    blocks = python_blocks(README)
    assert len(blocks) >= 2, "the README should show a session and the example A to E"
    run_blocks(spark, README, workdir)


def test_the_docs_pages_have_code_to_run() -> None:
    # A guard against a pattern or a folder that silently finds nothing to run.
    names = {str(p.relative_to(DOCS)) for p in pages_with_code()}
    expected = {
        "users/reader.md",
        "users/windows.md",
        "users/sink.md",
        "adapters/api.md",
        "tables.md",
    }
    assert expected <= names, sorted(names)


@pytest.mark.parametrize(
    "page", pages_with_code(), ids=[str(p.relative_to(DOCS)) for p in pages_with_code()]
)
def test_docs_page_python_blocks_run(spark, workdir: Path, page: Path) -> None:
    run_blocks(spark, page, workdir)

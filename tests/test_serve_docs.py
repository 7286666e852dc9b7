"""The Python blocks of docs/adapters/any-language.md run, without Spark: a server started as
the page starts it, pyarrow's Flight client and ADBC's Go driver against it.
(integration/test_readme_blocks.py runs them again with every other page.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parent.parent / "docs" / "adapters" / "any-language.md"


def test_the_any_language_pages_python_blocks_run(tmp_path: Path) -> None:
    pytest.importorskip("adbc_driver_flightsql")
    text = PAGE.read_text()
    blocks = [
        (text[: m.start()].count("\n") + 1, m.group(1))
        for m in re.finditer(r"^```python\n(.*?)^```$", text, flags=re.M | re.S)
    ]
    assert len(blocks) == 2, "the Flight client and the ADBC ingest"
    namespace: dict[str, object] = {}
    try:
        for line, code in blocks:
            code = code.replace('"/data/', f'"{tmp_path}/data/')
            exec(compile(code, f"{PAGE.name}:{line}", "exec"), namespace)
    finally:
        server = namespace.get("server")
        if server is not None and server.poll() is None:  # type: ignore[attr-defined]
            server.kill()  # type: ignore[attr-defined]
            server.wait()  # type: ignore[attr-defined]

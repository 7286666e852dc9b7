"""Every python code block of the README runs, in order, as a reader would paste them.

The blocks share one namespace with ``spark`` (the test session), and their paths under
``/data/`` and ``/chk/`` are moved into a temporary folder. A block that fails names itself.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from helpers import CONNECT

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[tuple[int, str]]:
    """(line number, code) of each ```python block."""
    text = README.read_text()
    return [
        (text[: m.start()].count("\n") + 1, m.group(1))
        for m in re.finditer(r"^```python\n(.*?)^```$", text, flags=re.M | re.S)
    ]


def test_readme_python_blocks_run(spark, workdir: Path) -> None:
    blocks = python_blocks()
    assert len(blocks) >= 4, "the README should show the reader, windows, sink and adapter API"
    namespace: dict[str, object] = {"spark": spark}
    try:
        for line, code in blocks:
            code = code.replace('"/data/', f'"{workdir}/data/').replace(
                '"/chk/', f'"{workdir}/chk/'
            )
            if CONNECT:  # a Connect user's session comes from remote(...), as the test's does
                remote = f'remote("{os.environ["ROWTIME_CONNECT_URL"]}")'
                code = code.replace('master("local[2]")', remote)
            try:
                exec(compile(code, f"README.md:{line}", "exec"), namespace)
            except Exception as e:
                raise AssertionError(
                    f"the README's python block at line {line} failed: {e!r}"
                ) from e
    finally:
        for query in spark.streams.active:
            query.stop()

"""The README's option tables list exactly the options the code accepts (no Spark needed).

Every option the reader or the sink knows must be in its table, and nothing else, so a new
option cannot ship undocumented and a removed one cannot linger. (The README's code blocks are
run by integration/test_readme_blocks.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

from pyspark_rowtime.datasource.options import READER_OPTIONS
from pyspark_rowtime.sink.options import SINK_OPTIONS

README = Path(__file__).resolve().parent.parent / "README.md"


def table_names(header: str) -> list[str]:
    """The backticked first cells of the table whose header row is ``header``."""
    lines = README.read_text().splitlines()
    start = lines.index(header)
    names = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cell = line.split("|")[1]
        match = re.fullmatch(r"\s*`([^`]+)`\s*", cell)
        assert match, f"README table {header!r}: first cell {cell!r} is not one `option`"
        names.append(match.group(1))
    return names


def test_reader_table_lists_every_reader_option() -> None:
    names = table_names("| option | accepts |")
    assert len(names) == len(set(names))
    assert {n.lower() for n in names} == set(READER_OPTIONS)


def test_sink_table_lists_every_sink_option() -> None:
    names = table_names("| sink option | accepts |")
    assert len(names) == len(set(names))
    assert {n.lower() for n in names} == set(SINK_OPTIONS)

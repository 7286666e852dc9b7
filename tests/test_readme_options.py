"""The docs' option tables list exactly the options the code accepts (no Spark needed).

Every option the reader or the sink knows must be in its table (docs/users/reader.md and
docs/users/sink.md, where the README's tables moved), and nothing else, so a new option cannot
ship undocumented and a removed one cannot linger. (The code blocks of the README and the docs
are run by integration/test_readme_blocks.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

from pyspark_rowtime.datasource.options import READER_OPTIONS
from pyspark_rowtime.sink.options import SINK_OPTIONS

USERS = Path(__file__).resolve().parent.parent / "docs" / "users"


def table_names(page: str, header: str) -> list[str]:
    """The backticked first cells of the table of ``page`` whose header row is ``header``."""
    lines = (USERS / page).read_text().splitlines()
    start = lines.index(header)
    names = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cell = line.split("|")[1]
        match = re.fullmatch(r"\s*`([^`]+)`\s*", cell)
        assert match, f"{page} table {header!r}: first cell {cell!r} is not one `option`"
        names.append(match.group(1))
    return names


def test_reader_table_lists_every_reader_option() -> None:
    names = table_names("reader.md", "| option | accepts |")
    assert len(names) == len(set(names))
    assert {n.lower() for n in names} == set(READER_OPTIONS)


def test_sink_table_lists_every_sink_option() -> None:
    names = table_names("sink.md", "| sink option | accepts |")
    assert len(names) == len(set(names))
    assert {n.lower() for n in names} == set(SINK_OPTIONS)

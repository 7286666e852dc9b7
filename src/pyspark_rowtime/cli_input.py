"""Rows from text for ``rowtime insert``: JSON lines or CSV, the format from ``--format`` or
the file's extension, each row's values converted to the stream's columns."""

from __future__ import annotations

import datetime as dt
import os
import select
from collections.abc import Iterable, Iterator
from typing import IO, Any

from .bounds.errors import RowtimeError
from .streams.text_lines import BadLine, csv_records, decoded_lines, json_records
from .streams.text_values import Convert, ValueReader

__all__ = ["BadLine", "convert_row", "input_format", "input_waiting", "records"]


def records(f: Iterable[bytes | str], fmt: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) pairs from JSON lines or CSV with a header, read strictly
    (:mod:`pyspark_rowtime.streams.text_lines`: a :class:`BadLine` names the first line that
    is not a row); blank lines skipped. ``f`` yields lines as bytes (decoded here as strict
    UTF-8, so a bad byte is named by its line) or as text."""
    lines = decoded_lines(f)
    if fmt == "csv":
        return csv_records(lines)
    return json_records(lines)


#: The input formats by file extension: what ``rowtime insert FILE`` reads without --format.
FORMAT_OF_EXTENSION = {".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl"}
FORMAT_NAMES = {"csv": "CSV with a header", "jsonl": "JSON lines"}


def input_format(given: str | None, file: str) -> tuple[str, str]:
    """The format ``rowtime insert`` reads ``file`` in, and why: ``--format`` when given, else
    the file's extension (.csv; .jsonl, .json, .ndjson), else JSON lines (standard input and
    files of another extension)."""
    if given is not None:
        return given, "--format"
    if file in (None, "-"):
        return "jsonl", "standard input; --format csv for CSV"
    ext = os.path.splitext(file)[1].lower()
    if ext in FORMAT_OF_EXTENSION:
        fmt = FORMAT_OF_EXTENSION[ext]
        other = "jsonl" if fmt == "csv" else "csv"
        return fmt, f"its extension {ext}; --format {other} to read it otherwise"
    return "jsonl", f"extension {ext or '(none)'} not known; --format csv for CSV"


def input_waiting(f: IO[str]) -> bool:
    """Whether more input is ready without blocking (pipes and terminals; files: always)."""
    try:
        ready, _, _ = select.select([f], [], [], 0)
    except (OSError, ValueError, TypeError):
        return True
    return bool(ready)


def in_context(e: RowtimeError, where: str, after: str = "") -> None:
    """Put ``where`` in front of ``e``'s message and ``after`` behind it (the input line or
    file it came from), for the caller to re-raise ``e`` itself: its class, cause and
    attributes stay as they were."""
    e.args = (f"{where}: {e}{after}", *e.args[1:])


def convert_row(
    raw: dict[str, Any],
    payload: dict[str, Convert],
    rowtime_col: str | None,
    reader: ValueReader,
    lineno: int,
) -> tuple[dict[str, Any], dt.datetime | None]:
    rowtime = None
    if rowtime_col is not None:
        value = raw.get(rowtime_col) if rowtime_col in payload else raw.pop(rowtime_col, None)
        if value is None:
            raise BadLine(
                lineno,
                f"no value in the rowtime column {rowtime_col!r}; give every row its rowtime",
            )
        try:
            rowtime = reader.instant(value)
        except RowtimeError as e:
            in_context(e, f"line {lineno}: rowtime column {rowtime_col!r}")
            raise
    row = {}
    for key, value in raw.items():
        convert = payload.get(key)
        if convert is None or value is None:
            row[key] = value  # unknown keys are reported by the writer, with the column names
            continue
        try:
            row[key] = convert(value)
        except (ValueError, TypeError, ArithmeticError, RowtimeError) as e:
            shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
            raise BadLine(lineno, f"column {key!r}: cannot read {shown}: {e}") from None
    return row, rowtime

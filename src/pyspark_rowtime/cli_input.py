"""Rows from text for ``rowtime insert``: JSON lines or CSV, the format from ``--format`` or
the file's extension, each row's values converted to the stream's columns."""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import select
from collections.abc import Iterator
from decimal import InvalidOperation
from typing import IO, Any

from .bounds.errors import RowtimeError, SchemaError
from .streams.text_values import Convert, ValueReader


def records(f: IO[str], fmt: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) pairs from JSON lines or CSV with a header; blank lines skipped."""
    if fmt == "csv":
        reader = csv.DictReader(f)
        for row in reader:
            if None in row:
                raise SchemaError(f"line {reader.line_num}: more cells than the header has columns")
            yield reader.line_num, {k: (v if v != "" else None) for k, v in row.items()}
        return
    for lineno, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SchemaError(
                f"line {lineno}: not valid JSON ({e.msg} at column {e.colno})"
            ) from None
        if not isinstance(row, dict):
            raise SchemaError(
                f"line {lineno}: a JSON object per line is expected, got {type(row).__name__}"
            )
        yield lineno, row


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
            raise SchemaError(f"line {lineno}: no value in the rowtime column {rowtime_col!r}")
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
        except (ValueError, TypeError, InvalidOperation, RowtimeError) as e:
            raise SchemaError(
                f"line {lineno}: column {key!r}: cannot read {value!r}: {e}"
            ) from None
    return row, rowtime

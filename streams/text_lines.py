r"""Rows from text, read strictly: JSON lines and CSV with a header, as ``rowtime insert`` and
the directory connector read them (SPEC 9: bad input is refused, never half taken or guessed).

A line is refused, as a ``BadLineError`` naming its number (1-based; a CSV record that spans
lines is named by the line it starts on), when it is

* not UTF-8 (the byte and its place are named), or holds a NUL byte (text has none: a binary
  file, or a file in UTF-16);
* JSON that does not parse, is not one object, repeats a key in an object (the second would
  silently win), nests deeper than ``MAX_JSON_DEPTH`` levels, or escapes half of a UTF-16
  surrogate pair (``"\ud800"`` is no character: the store cannot hold it);
* CSV whose quoted cell is never closed (without this check the rest of the input becomes
  that one cell), has text after a closing quote, or has fewer or more cells than the header;
* a CSV header with an empty or a repeated column name.

``NaN`` and ``Infinity`` are read as the floats they name: a column of a floating type holds
them and every other column refuses them, naming the line (``text_values``, the writer).
A UTF-8 byte-order mark at the start of the input is dropped. Blank lines are skipped.

What is not checked here is the row's fit to a stream's columns: that is
``text_values`` (each value to its column type) and the writer (names, nulls, order).
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Collection, Iterable, Iterator
from typing import Any

from ..bounds.errors import SchemaError

__all__ = [
    "MAX_JSON_DEPTH",
    "BadLine",
    "BadLineError",
    "csv_header",
    "csv_line",
    "csv_records",
    "decoded_lines",
    "json_object",
    "json_records",
]

#: The deepest JSON a line may hold (the line's object is level 1). A stream's nested column
#: types are rarely past 5; the limit stops a line of ten thousand ``[`` long before Python's
#: recursion limit (about 1000 levels), which would end the command with a traceback.
MAX_JSON_DEPTH = 64

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class BadLineError(SchemaError):
    """A line of text input that is not a row: ``line`` is its number, ``why`` the reason.

    Examples:
        Also a ``SchemaError``; ``BadLine``, its name before 0.3, still works:

        >>> import pyspark_rowtime as rt
        >>> issubclass(rt.BadLineError, rt.SchemaError)
        True
    """

    def __init__(self, line: int, why: str) -> None:
        super().__init__(f"line {line}: {why}")
        self.line = line
        self.why = why


#: The name before 0.3: code that catches ``BadLine`` keeps working.
BadLine = BadLineError


def decode_line(raw: bytes | str, line: int, offset: int | None = None) -> str:
    """``raw`` as text: strict UTF-8 (``offset``: the byte of the input it starts at, for the
    message), no NUL byte."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            at = "" if offset is None else f", byte {offset + e.start} of the input"
            raise BadLineError(
                line,
                f"not UTF-8: byte 0x{raw[e.start]:02x} at column {e.start + 1}{at} ({e.reason}); "
                "save the file as UTF-8",
            ) from None
    else:
        text = raw
    nul = text.find("\x00")
    if nul >= 0:
        raise BadLineError(
            line,
            f"a NUL byte at column {nul + 1}: text input has none (a binary file, or text in "
            "UTF-16? save it as UTF-8)",
        )
    return text


def decoded_lines(f: Iterable[bytes | str]) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of ``f`` (bytes decoded strictly as UTF-8, or text
    already decoded), its line break kept; a byte-order mark at the start dropped."""
    offset = 0
    for line, raw in enumerate(f, 1):
        text = decode_line(raw, line, offset)
        offset += len(raw)
        if line == 1 and text.startswith("\ufeff"):
            text = text[1:]
        yield line, text


# -- JSON ----------------------------------------------------------------------------------------


class _DuplicateKey(ValueError):
    pass


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    row = dict(pairs)
    if len(row) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return row


def _too_deep(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        if children is None:
            continue
        if depth > MAX_JSON_DEPTH:
            return True
        stack.extend((c, depth + 1) for c in children)
    return False


def json_object(text: str, line: int) -> dict[str, Any]:
    """The JSON object on ``line``, read strictly (see the module docstring)."""
    deep = f"nested deeper than {MAX_JSON_DEPTH} levels; no column type nests that deep"
    try:
        row = json.loads(text, object_pairs_hook=_object)
    except _DuplicateKey as e:
        raise BadLineError(
            line, f"key {e.args[0]!r} appears twice in one object; give each key once"
        ) from None
    except json.JSONDecodeError as e:
        raise BadLineError(line, f"not valid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise BadLineError(line, deep) from None
    if not isinstance(row, dict):
        raise BadLineError(line, f"a JSON object per line is expected, got {type(row).__name__}")
    # Only a line with that many brackets can nest that deep: most lines skip the walk.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _too_deep(row):
        raise BadLineError(line, deep)
    if _SURROGATE_ESCAPE.search(text):
        try:
            json.dumps(row, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            raise BadLineError(
                line,
                f"escapes half of a UTF-16 surrogate pair ({e.object[e.start]!r}), which is no "
                "character; give the character itself or both halves of its pair",
            ) from None
    return row


def json_records(lines: Iterable[tuple[int, str]]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line."""
    for line, text in lines:
        if text.strip():
            yield line, json_object(text, line)


# -- CSV -----------------------------------------------------------------------------------------


def csv_header(
    cells: list[str], line: int, known: Collection[str] | None = None, what: str = ""
) -> list[str]:
    """The column names of a CSV header: none empty, none twice, and (``known`` given) each
    one of ``known`` (``what``: the names a reader of the file can take, for the message), so
    that a misspelt header is named at its own line, even in a file of no rows."""
    for i, name in enumerate(cells, 1):
        if not name.strip():
            raise BadLineError(
                line, f"the header's column {i} has no name; name every column of the header"
            )
    seen: dict[str, int] = {}
    for i, name in enumerate(cells, 1):
        if name in seen:
            raise BadLineError(
                line,
                f"the header names column {name!r} twice (columns {seen[name]} and {i}); name "
                "each column once",
            )
        seen[name] = i
    if known is not None:
        unknown = [name for name in cells if name not in known]
        if unknown:
            raise BadLineError(
                line,
                f"the header names column(s) {', '.join(map(repr, unknown))} the stream does not "
                f"have; {what or 'the columns are ' + ', '.join(sorted(known))}",
            )
    return cells


def _cells_row(
    cells: list[str], header: list[str], line: int, header_line: int
) -> dict[str, str | None]:
    if len(cells) != len(header):
        fewer = "fewer" if len(cells) < len(header) else "more"
        raise BadLineError(
            line,
            f"{len(cells)} cell(s), {fewer} than the {len(header)} column(s) of the header "
            f"(line {header_line}); give one cell per column (an empty cell is null)",
        )
    # An empty cell is null, as in Spark's CSV reader.
    return {k: v or None for k, v in zip(header, cells, strict=True)}


def _csv_error(e: csv.Error, start: int, at: int) -> BadLineError:
    text = str(e)
    if "unexpected end of data" in text:
        return BadLineError(
            start,
            'a quoted cell opened on this line is never closed (a " is missing); the rest of '
            "the input would have been that one cell",
        )
    if "field larger than field limit" in text:
        return BadLineError(
            start,
            f"a cell longer than {csv.field_size_limit()} characters begins on this line: most "
            'likely a quote (") that is never closed',
        )
    seen = "" if at == start else f", seen on line {at}"
    return BadLineError(
        start,
        f"the record that starts on this line is not valid CSV ({text}{seen}); a quoted cell "
        'ends at its closing quote, and a quote inside it is doubled ("")',
    )


def csv_records(
    lines: Iterable[tuple[int, str]], known: Collection[str] | None = None, what: str = ""
) -> Iterator[tuple[int, dict[str, str | None]]]:
    """(line number, row) for each record after the header (checked by ``csv_header``
    with ``known`` and ``what``); a quoted cell may hold line breaks (RFC 4180), and the
    record is named by the line it starts on."""
    at = [0]  # the last line the CSV reader took

    def texts() -> Iterator[str]:
        for line, text in lines:
            at[0] = line
            yield text

    reader = csv.reader(texts(), strict=True)
    header: list[str] | None = None
    header_line = 0
    while True:
        start = at[0] + 1
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise _csv_error(e, start, at[0]) from None
        if not cells:
            continue  # a blank line
        if header is None:
            header, header_line = csv_header(cells, start, known, what), start
            continue
        yield start, _cells_row(cells, header, start, header_line)


def csv_line(
    text: str, header: list[str], line: int, header_line: int = 1
) -> dict[str, str | None]:
    """The row on one CSV line (a file read line by line: a quoted cell may not hold a line
    break, so a quote not closed on its line is refused)."""
    try:
        cells = next(csv.reader([text], strict=True))
    except csv.Error as e:
        raise _csv_error(e, line, line) from None
    return _cells_row(cells, header, line, header_line)

"""``rowtime insert``: rows from JSON lines or CSV, the format from ``--format`` or the file's
extension, read strictly (``pyspark_rowtime.streams.text_lines``), each row's values
converted to the stream's columns, and stored with a true account (``cmd_insert``): a file
whole or not at all; a pipe as it comes, up to its first bad line."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import select
import stat
import sys
from collections.abc import Collection, Iterable, Iterator
from typing import IO, Any

from .api import open_writer
from .bounds.errors import RowtimeError
from .bounds.time import TimeFormat
from .cli_tables import CLI_PROG as PROG
from .streams.storage import StreamStorage, open_stream
from .streams.text_lines import BadLineError, csv_records, decoded_lines, json_records
from .streams.text_values import Convert, ValueReader

__all__ = ["BadLineError", "cmd_insert", "convert_row", "input_format", "input_waiting", "records"]


def records(
    f: Iterable[bytes | str], fmt: str, known: Collection[str] | None = None, what: str = ""
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) pairs from JSON lines or CSV with a header, read strictly
    (``pyspark_rowtime.streams.text_lines``: a ``BadLineError`` names the first line that
    is not a row); blank lines skipped. ``f`` yields lines as bytes (decoded here as strict
    UTF-8, so a bad byte is named by its line) or as text. ``known``: the names a CSV header
    may hold (``what`` says them in the message)."""
    lines = decoded_lines(f)
    if fmt == "csv":
        return csv_records(lines, known, what)
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
            raise BadLineError(
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
            raise BadLineError(lineno, f"column {key!r}: cannot read {shown}: {e}") from None
    return row, rowtime


# -- the command --------------------------------------------------------------------------------

#: A file is one append however large (see ``cmd_insert``): the writer never flushes early.
_ONE_APPEND = 1 << 62
#: Standard input that streams is committed at least every this many rows, and whenever the
#: pipe is quiet (the writer's own limit, taken by the command so that it knows each commit).
_STREAM_FLUSH_ROWS = 1 << 17


def cmd_insert(args: argparse.Namespace) -> int:
    """Insert JSON lines or CSV into one partition.

    A file (and standard input redirected from a file) is stored whole or not at all: every
    line is read and checked (``pyspark_rowtime.streams.text_lines``, each value against its
    column, each row by the writer) before the one append that stores them all, so a bad line
    stores nothing and is named. The rows wait in memory until that append.

    Standard input that is a pipe or a terminal streams: what came is committed whenever the
    pipe is quiet (and every ``_STREAM_FLUSH_ROWS`` rows), so a producer's rows are visible as
    they come. At a bad line the good rows before it are committed and the error says how many
    and from which line to send the input again: rows before line K stored, none from it on.
    """
    stream = open_stream(args.path)
    meta = stream.meta
    defaults = meta.defaults
    unit = args.rowtime_unit or defaults.get("rowtime_unit", "ms")
    reader = ValueReader(
        TimeFormat(unit, defaults.get("rowtime_timezone", "UTC"), defaults.get("rowtime_format"))
    )
    fmt, why = input_format(args.format, args.file)
    csv_cells = fmt == "csv"
    payload = {f.name: reader.converter(f.type, csv_cells) for f in meta.payload_schema}
    rowtime_col = args.rowtime_column
    if rowtime_col is None and defaults.get("rowtime_column"):
        rowtime_col = defaults["rowtime_column"]
    source: Any
    if args.file in (None, "-"):
        # Bytes where there are any, so that a byte that is not UTF-8 is named by its line.
        source, name = getattr(sys.stdin, "buffer", sys.stdin), "standard input"
        whole = _is_regular_file(sys.stdin)
    else:
        source, name, whole = open(args.file, "rb"), args.file, True
    read_as = f" (read as {FORMAT_NAMES[fmt]}: {why})"

    known = {*payload, *([rowtime_col] if rowtime_col else [])}
    what = f"its columns are {', '.join(payload)}"
    if rowtime_col is not None and rowtime_col not in payload:
        what += f", and the rowtime column is {rowtime_col!r}"

    def rows() -> Iterator[tuple[int, dict[str, Any], dt.datetime | None]]:
        for lineno, raw in records(source, fmt, known, what):
            try:
                yield (lineno, *convert_row(raw, payload, rowtime_col, reader, lineno))
            except RowtimeError as e:
                _bad_line(e, lineno)
                raise

    try:
        if whole:
            count = _insert_whole(stream, args.partition, rows(), name, read_as)
        else:
            count = _insert_streamed(stream, args.partition, rows(), source, name, read_as)
    finally:
        if source is not sys.stdin and source is not getattr(sys.stdin, "buffer", None):
            source.close()
    print(f"{PROG} insert: read {name} as {FORMAT_NAMES[fmt]} ({why})", file=sys.stderr)
    print(f"inserted {count} row(s) into partition {args.partition} of {meta.location}")
    return 0


def _is_regular_file(f: Any) -> bool:
    """Whether ``f`` is a regular file (standard input redirected from one): not a pipe,
    terminal or socket, and not a Python object without a descriptor (tests)."""
    try:
        return stat.S_ISREG(os.fstat(f.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):
        return False


def _bad_line(e: RowtimeError, lineno: int) -> None:
    """Name ``lineno`` in ``e`` (its message and its ``line``) unless it is named already."""
    if getattr(e, "line", None) is None:
        if not str(e).startswith(f"line {lineno}:"):
            in_context(e, f"line {lineno}")
        e.line = lineno  # type: ignore[attr-defined]
    # The writer's "nothing was written" is of its one row: the command gives the account.
    e.args = (str(e).replace(". Nothing was written", ""), *e.args[1:])


def _insert_whole(
    stream: StreamStorage,
    partition: int,
    rows: Iterator[tuple[int, dict[str, Any], dt.datetime | None]],
    name: str,
    read_as: str,
) -> int:
    """Every row of ``rows`` as one append, or none of them (see ``cmd_insert``)."""
    writer = open_writer(stream, partition, flush_records=_ONE_APPEND, flush_bytes=_ONE_APPEND)
    count = lineno = 0
    try:
        for lineno, row, rowtime in rows:
            try:
                writer.insert(row, rowtime=rowtime)
            except RowtimeError as e:
                _bad_line(e, lineno)
                raise
            count += 1
    except RowtimeError as e:
        writer.abort()
        line = getattr(e, "line", lineno)
        in_context(
            e,
            name,
            f"; nothing of {name} was stored (it is stored whole or not at all): fix line "
            f"{line} and insert the whole input again{read_as}",
        )
        raise
    except OSError as e:
        writer.abort()
        raise OSError(
            e.errno, f"{name}: reading it failed: {e.strerror or e}; nothing of it was stored"
        ) from e
    except BaseException:
        writer.abort()  # an interrupt: nothing is stored
        raise
    try:
        writer.flush()
    except (RowtimeError, OSError) as e:
        writer.abort()
        account = (
            f"; the {count} row(s) of {name} are one append, stored whole or not at all: "
            f"`{PROG} describe` shows which{read_as}"
        )
        if isinstance(e, RowtimeError):
            in_context(e, name, account)
            raise
        raise OSError(e.errno, f"{name}: {e.strerror or e}{account}") from e
    writer.close()
    return count


def _insert_streamed(
    stream: StreamStorage,
    partition: int,
    rows: Iterator[tuple[int, dict[str, Any], dt.datetime | None]],
    source: Any,
    name: str,
    read_as: str,
) -> int:
    """The rows of a pipe, committed as they come (see ``cmd_insert``); at a bad line the
    rows before it are committed and the error says so."""
    writer = open_writer(stream, partition, flush_records=_ONE_APPEND, flush_bytes=_ONE_APPEND)
    start = writer.end_offset  # the partition's one writer: only this command appends to it
    last = 0  # the line of the last row buffered

    def commit() -> None:
        try:
            writer.flush()
        except (RowtimeError, OSError) as e:
            writer.abort()
            account = (
                f"; {writer.end_offset - start} row(s) of {name} were stored before this "
                f"commit, which held the rows up to line {last}{read_as}"
            )
            if isinstance(e, RowtimeError):
                in_context(e, name, account)
                raise
            raise OSError(e.errno, f"{name}: {e.strerror or e}{account}") from e

    try:
        for lineno, row, rowtime in rows:
            try:
                writer.insert(row, rowtime=rowtime)
            except RowtimeError as e:
                _bad_line(e, lineno)
                raise
            last = lineno
            if writer.pending >= _STREAM_FLUSH_ROWS or not input_waiting(source):
                commit()  # the pipe is quiet: make what came so far visible
    except RowtimeError as e:
        line = getattr(e, "line", None)
        if line is None or writer.closed:
            raise  # not a bad line: a commit that failed, its account given
        commit()  # every row before the bad line is a good row
        writer.close()
        stored = writer.end_offset - start
        done = f"the {stored} row(s) before line {line} were stored, none" if stored else "nothing"
        in_context(
            e,
            name,
            f"; {done} from line {line} on was stored: fix line {line} and send the input "
            f"from it{read_as}",
        )
        raise
    except KeyboardInterrupt:
        writer.close()  # the rows read are good rows: keep them, as a pipe's reader would
        raise
    except BaseException:
        if not writer.closed:
            writer.abort()
        raise
    writer.close()
    return writer.end_offset - start

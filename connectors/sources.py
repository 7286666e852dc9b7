"""The directory and generator connectors: each turns its source into rows and bounds on a
``feed.Feed``, one batch per ``step``, and names its position in the source."""

from __future__ import annotations

import csv
import os
import random
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from ..bounds.errors import OptionError, RowtimeError
from ..bounds.time import TimeFormat, parse_duration_us
from ..streams.text_lines import BadLineError, csv_header, csv_line, decode_line, json_object
from ..streams.text_values import ValueReader
from .feed import Feed, wall_us

BOUND_FIELD = "rowtime_bound"


class BadInputError(RowtimeError, ValueError):
    """A line of an input file that is not a row of the stream (file and line named).

    Examples:
        ``BadInput``, its name before 0.3, still works:

        >>> import pyspark_rowtime as rt
        >>> rt.BadInput is rt.BadInputError and issubclass(rt.BadInputError, ValueError)
        True
    """


#: The name before 0.3: user code that catches ``BadInput`` keeps working.
BadInput = BadInputError


class DirectorySource:
    """JSON-lines or CSV files renamed into ``path``; each ingested once, in (mtime, name)
    order, then moved to ``path/_done/``. Names starting with ``.`` or ``_`` are skipped
    (write files elsewhere or under such a name, then rename them in). CSV: a header line,
    one record per line (no line breaks inside quoted cells). Lines are read as strictly as
    ``rowtime insert`` reads them (``streams.text_lines``: UTF-8, no NUL, quotes closed,
    one cell per header column, no repeated JSON key, a bounded depth). A line that is not a
    row of the stream stops the connector naming file and line (``on_error = "fail"``, the
    default) or is kept in the connector's ``rejected.jsonl`` and counted (``on_error =
    "skip"``); a bad CSV header makes every line of its file bad for that reason. A file is
    read in steps of ``batch_rows`` lines, each committed with the position after it (a file
    is not one append: the connector stores a good line once, and a bad one never)."""

    def __init__(self, feed: Feed, settings: Mapping[str, Any], fail: Any) -> None:
        self.feed = feed
        path = settings.get("path")
        if not isinstance(path, str) or not path:
            raise fail("path", "must be the folder files are renamed into")
        self.path = os.path.join(os.path.dirname(feed.entry.catalog), os.path.expanduser(path))
        if not os.path.isdir(self.path):
            raise fail("path", f"{self.path} is not a folder")
        self.done = os.path.join(self.path, "_done")
        os.makedirs(self.done, exist_ok=True)
        self.format = settings.get("format", "jsonl")
        if self.format not in ("jsonl", "csv"):
            raise fail("format", "must be jsonl or csv")
        self.rowtime_field = settings.get("rowtime_field")
        if feed.strategy.holds and self.rowtime_field is None:
            raise fail(
                "bounds.strategy",
                "strategy lateness holds rows by their rowtime: name the field that holds it "
                'with rowtime_field = "..." (rows without one take their arrival time, which '
                "never goes back)",
            )
        self.time = TimeFormat(
            settings.get("rowtime_unit", "ms"),
            settings.get("rowtime_timezone", "UTC"),
            settings.get("rowtime_format"),
        )
        self.batch = int(settings.get("batch_rows", 10_000))
        self.on_error = settings.get("on_error", "fail")
        if self.on_error not in ("fail", "skip"):
            raise fail(
                "on_error",
                "must be fail (stop, naming the file and line) or skip (keep the line in the "
                "connector's rejected.jsonl, count it as discarded, and go on)",
            )
        self.schema = feed.storage.meta.payload_schema
        # CSV cells are text: each payload column's conversion, as `rowtime insert` does it
        # (the rowtime field keeps its text: it is read with the connector's time format below).
        #: The names a CSV header may hold: the stream's columns and the rowtime field.
        self.known = {*self.schema.names, *([self.rowtime_field] if self.rowtime_field else [])}
        values = self.values = ValueReader(self.time)
        self.cells = {
            f.name: values.converter(f.type, csv_cell=True)
            for f in self.schema
            if f.name != self.rowtime_field
        }

    def _pending_files(self) -> list[str]:
        names = []
        for name in os.listdir(self.path):
            if name.startswith((".", "_")):
                continue
            full = os.path.join(self.path, name)
            if os.path.isfile(full):
                names.append((os.stat(full).st_mtime_ns, name))
        return [n for _, n in sorted(names)]

    def _finish(self, name: str) -> None:
        src = os.path.join(self.path, name)
        if os.path.exists(src):
            os.replace(src, os.path.join(self.done, name))

    def step(self) -> bool:
        """Ingest up to ``batch_rows`` lines; True if there was anything to read."""
        feed = self.feed
        pos = feed.position or {}
        name = pos.get("file")
        if name is not None and pos.get("done"):
            self._finish(name)  # the rename a kill may have cut off; idempotent
            feed.commit(None)
            return True
        if name is None or not os.path.exists(os.path.join(self.path, name)):
            files = self._pending_files()
            if not files:
                return False
            name, offset, line = files[0], 0, 0
        else:
            offset, line = int(pos["offset"]), int(pos["line"])
        full = os.path.join(self.path, name)
        with open(full, "rb") as f:
            header: list[str] | BadLineError | None = None
            if self.format == "csv":
                header = self._header(f.readline(), self.known)
                if offset == 0:
                    offset, line = f.tell(), 1
            f.seek(offset)
            committed = line
            for _ in range(self.batch):
                raw = f.readline()
                if not raw:
                    break
                line += 1
                try:
                    self._record(name, line, raw, offset, header)
                except BadInputError as e:
                    first = 1 if self.format == "csv" else 0  # the header is no row
                    done = (
                        f"no row of {name} is committed"
                        if committed <= first
                        else f"the lines of {name} up to {committed} are committed, none after"
                    )
                    e.args = (
                        f"{e}; {done}: fix the line, and the connector goes on from line "
                        f"{committed + 1} when it starts again",
                    )
                    raise
                offset += len(raw)
            at_end = f.read(1) == b""
        feed.bound()
        feed.commit({"file": name, "offset": offset, "line": line, "done": at_end})
        if at_end:
            self._finish(name)
            feed.commit(None)
        return True

    @staticmethod
    def _header(raw: bytes, known: set[str]) -> list[str] | BadLineError:
        """The CSV header's names, or why there are none (each line of the file is then bad
        for that reason: named, and failed or skipped as ``on_error`` says)."""
        try:
            text = decode_line(raw, 1, 0)
            if text.startswith("\ufeff"):
                text = text[1:]
            return csv_header(next(csv.reader([text], strict=True), []), 1, known)
        except BadLineError as e:
            return e if e.why.startswith("the header") else BadLineError(1, f"the header: {e.why}")
        except csv.Error as e:
            return BadLineError(1, f"the header is not valid CSV ({e})")

    def _record(
        self, name: str, line: int, raw: bytes, offset: int, header: list[str] | BadLineError | None
    ) -> None:
        where = f"{os.path.join(self.path, name)}:{line}"
        text = raw.decode("utf-8", "backslashreplace").strip()  # for the rejects file
        try:
            text = decode_line(raw, line, offset).strip()
            if not text:
                return
            if isinstance(header, BadLineError):
                where = f"{os.path.join(self.path, name)}:1"  # the line at fault
                raise header
            if header is None:
                row: dict[str, Any] = json_object(text, line)
                if set(row) == {BOUND_FIELD}:
                    self.feed.source_bound(self.time.read(row[BOUND_FIELD]))
                    self.feed.bound()  # where the source put it: rows after it may not go below
                    return
            else:
                row = {}
                for key, cell in csv_line(text, header, line).items():
                    convert = self.cells.get(key)
                    row[key] = cell if convert is None or cell is None else convert(cell)
            rowtime_us = None
            if self.rowtime_field is not None:
                value = row.get(self.rowtime_field)
                if value is None:
                    raise ValueError(f"no rowtime in field {self.rowtime_field!r}")
                rowtime_us = self.time.read(self.values.epoch_text(value))
                if self.rowtime_field not in self.schema.names:
                    row = {k: v for k, v in row.items() if k != self.rowtime_field}
                else:
                    field = self.schema.field(self.rowtime_field)
                    if pa.types.is_timestamp(field.type):
                        row[self.rowtime_field] = pa.scalar(
                            rowtime_us, pa.timestamp("us", "UTC")
                        ).as_py()
            self.feed.insert(row, rowtime_us, where)
        # (Decimal's errors are ArithmeticErrors, not ValueErrors)
        except (ValueError, TypeError, ArithmeticError, RowtimeError) as e:
            why = e.why if isinstance(e, BadLineError) else str(e)
            if self.on_error == "skip":
                self.feed.reject("bad", where, why, text)
                return
            raise BadInputError(
                f"{where}: {' '.join(why.split())} (on_error=skip skips such lines)"
            ) from None


class GeneratorSource:
    """Rows for tests and demos: ``rate`` rows per second of this machine's clock, each with a
    rowtime ``skew`` behind its schedule and up to ``disorder`` earlier still (seeded, so a
    restart regenerates the same rows), none during ``gap_for`` at the end of every
    ``gap_every``; ``count`` stops it after that many rows. Its own bound (strategy source) is
    the schedule minus ``skew`` and ``disorder``: exact."""

    def __init__(self, feed: Feed, settings: Mapping[str, Any], fail: Any) -> None:
        self.feed = feed

        def duration(key: str, default: int) -> int:
            if key not in settings or settings[key] in (0, "0", "0s"):
                return default
            try:
                return parse_duration_us(settings[key], what=key)
            except OptionError as e:
                raise fail(key, str(e)) from None

        rate = settings.get("rate", 10)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0:
            raise fail("rate", "must be a positive number of rows per second")
        self.interval_us = max(int(1_000_000 / rate), 1)
        self.skew_us = duration("skew", 0)
        self.disorder_us = duration("disorder", 0)
        self.gap_every_us = duration("gap_every", 0)
        self.gap_for_us = duration("gap_for", 0)
        self.count = settings.get("count")
        self.seed = int(settings.get("seed", 0))
        self.schema = feed.storage.meta.payload_schema

    def _values(self, i: int, rowtime_us: int) -> dict[str, Any]:
        row: dict[str, Any] = {}
        for f in self.schema:
            t = pa.types
            if t.is_integer(f.type):
                row[f.name] = i % 100 if t.is_int8(f.type) else i
            elif t.is_floating(f.type):
                row[f.name] = i * 0.5
            elif t.is_string(f.type):
                row[f.name] = f"{f.name}-{i % 10}"
            elif t.is_boolean(f.type):
                row[f.name] = i % 2 == 0
            elif t.is_timestamp(f.type):
                row[f.name] = pa.scalar(rowtime_us, pa.timestamp("us", "UTC")).as_py()
            else:
                row[f.name] = None
        return row

    def step(self) -> bool:
        feed = self.feed
        pos = feed.position or {"next": 0, "start_us": wall_us()}
        i, start = int(pos["next"]), int(pos["start_us"])
        now = wall_us()
        made = False
        while (self.count is None or i < self.count) and start + i * self.interval_us <= now:
            scheduled = start + i * self.interval_us
            in_gap = (
                self.gap_every_us
                and (scheduled - start) % self.gap_every_us >= self.gap_every_us - self.gap_for_us
            )
            if not in_gap:
                jitter = random.Random(self.seed * 1_000_003 + i).random()
                rowtime = scheduled - self.skew_us - int(jitter * self.disorder_us)
                feed.insert(self._values(i, rowtime), rowtime, f"generated row {i}")
                made = True
            i += 1
            if i - int(pos["next"]) >= 10_000:
                break
        feed.source_bound(start + i * self.interval_us - self.skew_us - self.disorder_us)
        feed.bound()
        feed.commit({"next": i, "start_us": start})
        return made

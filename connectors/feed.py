"""The part every connector shares: one partition's writer, the progress file, the bounds.

Exactly once across a kill at any point. A connector's position in its source (file and byte,
generated row, Redis entry ID) must move exactly when the rows read up to it are committed. The
rows go into the stream by one atomic append (one :meth:`Writer.flush`); the position goes into
``progress.json`` (temporary file, fsync, rename). The two cannot be one write, so each append
is preceded by an *intent* in the progress file: the old position, the new one, and the
partition's end offset before and after the append (``before``, ``after``; the connector holds the
partition's one writer lock, so nobody else appends in between). After a crash the end offset
tells what happened: ``after`` means the append committed (take the new position), ``before``
means it did not (read the same rows again). Any other end means someone else wrote to the
partition while the connector was down: an error, since the connector cannot tell its rows from
theirs (a connector must be its partition's only writer).

The progress file lives beside the stream (``<stream>/_rowtime_connect/<connector>/``) for local
streams, or where the entry's ``state`` key says (required for redis:// streams).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from ..bounds.errors import BoundError, LateRowError, RowtimeError
from ..bounds.time import from_rowtime_us
from ..streams.catalog import CatalogError, StreamEntry, ensure_stream, redact
from ..streams.meta import fsync_dir
from ..streams.writer import Writer
from .strategies import BoundStrategy

PROGRESS_FILE = "progress.json"
#: The writer never flushes on its own: every append goes through :meth:`Feed.commit`.
_NEVER = 1 << 62


def wall_us() -> int:
    return time.time_ns() // 1000


def state_dir(entry: StreamEntry, connector: str, state: Any) -> str:
    if state is not None:
        return os.path.abspath(os.path.join(os.path.dirname(entry.catalog), str(state)))
    if "://" in entry.location:
        raise CatalogError(
            f"connector {connector!r}: stream {entry.name!r} is not a local folder, so the "
            'connector\'s progress cannot be kept beside it; set state = "/var/lib/rowtime/..."'
        )
    return os.path.join(entry.location, "_rowtime_connect", connector)


@dataclass
class Stats:
    """What the connector did since it started (for its log lines)."""

    rows: int = 0
    bounds: int = 0
    discarded: int = 0
    appends: int = 0
    notes: list[str] = field(default_factory=list)


class Feed:
    """One partition of a stream, written by one connector, with its progress."""

    def __init__(
        self,
        entry: StreamEntry,
        connector: str,
        partition: int,
        strategy: BoundStrategy,
        state: Any = None,
    ) -> None:
        self.entry = entry
        self.connector = connector
        self.strategy = strategy
        self.storage = ensure_stream(entry)
        if not 0 <= partition < self.storage.meta.partitions:
            raise CatalogError(
                f"connector {connector!r}: partition {partition} does not exist; stream "
                f"{entry.name!r} has partitions 0..{self.storage.meta.partitions - 1}"
            )
        self.partition = partition
        self.dir = state_dir(entry, connector, state)
        os.makedirs(self.dir, exist_ok=True)
        self.path = os.path.join(self.dir, PROGRESS_FILE)
        self.writer = Writer(self.storage, partition, flush_records=_NEVER, flush_bytes=_NEVER)
        self.stats = Stats()
        self.started_us = wall_us()
        self.position: Any = None
        self._recover()

    # -- progress -----------------------------------------------------------------------------

    def _read(self) -> dict[str, Any]:
        try:
            with open(self.path, encoding="utf-8") as f:
                return dict(json.load(f))
        except FileNotFoundError:
            return {}
        except ValueError as e:
            raise RowtimeError(f"progress file {self.path} cannot be read: {e}") from None

    def _write(self, doc: dict[str, Any]) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fsync_dir(self.dir)

    def _recover(self) -> None:
        doc = self._read()
        self.position = doc.get("position")
        pending = doc.get("pending")
        end = self.writer.end_offset
        if pending is not None:
            if end == pending["after"]:
                self.position = pending["position"]
            elif end != pending["before"]:
                raise RowtimeError(
                    f"connector {self.connector!r}: partition {self.partition} of stream "
                    f"{self.entry.name!r} ends at offset {end}, but the connector's last append "
                    f"went from {pending['before']} to {pending['after']} ({self.path}): another "
                    "writer appended while the connector was down. A connector must be its "
                    "partition's only writer; give it a partition of its own"
                )
        self._write({"position": self.position, "pending": None, "end": end})

    def commit(self, position: Any) -> bool:
        """Append everything buffered and move the position to ``position``, as one step a kill
        cannot split (see the module docstring). True if anything was appended."""
        if not self.writer.pending:
            if position != self.position:
                self._write({"position": position, "pending": None, "end": self.writer.end_offset})
                self.position = position
            return False
        before = self.writer.end_offset
        after = before + self.writer.pending
        intent = {"position": position, "before": before, "after": after}
        self._write({"position": self.position, "pending": intent, "end": before})
        self.writer.flush()
        self.position = position
        self.stats.appends += 1
        return True

    # -- records ------------------------------------------------------------------------------

    def insert(self, row: dict[str, Any], rowtime_us: int | None) -> bool:
        """Buffer a row (``rowtime_us`` None: the arrival time); False (and counted as
        discarded) if it is late under order=reject."""
        rowtime = None if rowtime_us is None else from_rowtime_us(rowtime_us)
        try:
            self.writer.insert(row, rowtime=rowtime)
        except LateRowError as e:
            self.stats.discarded += 1
            if len(self.stats.notes) < 5:
                self.stats.notes.append(str(e))
            return False
        self.stats.rows += 1
        now = wall_us()
        self.strategy.saw_row(rowtime_us if rowtime_us is not None else now, now)
        return True

    def source_bound(self, bound_us: int) -> None:
        self.strategy.saw_source_bound(bound_us)

    def bound(self) -> None:
        """Buffer the strategy's bound if it moves the partition clock."""
        bound = self.strategy.bound_us(wall_us(), self.started_us)
        clock = self.writer.clock_us
        if bound is None or (clock is not None and bound <= clock):
            return
        try:
            self.writer.set_rowtime_bound(from_rowtime_us(bound))
        except BoundError:  # pragma: no cover - checked against the clock above
            return
        self.stats.bounds += 1

    def clock_us(self) -> int | None:
        return self.writer.clock_us

    def close(self, position: Any) -> None:
        """Commit what is buffered and give the partition up."""
        try:
            self.commit(position)
        except BaseException:
            self.writer.abort()  # never flush without an intent: that could duplicate rows
            raise
        self.writer.close()

    def describe(self) -> str:
        where = redact(self.entry.location)
        return f"partition {self.partition} of stream {self.entry.name!r} ({where})"

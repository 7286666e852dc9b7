"""The part every connector shares: one partition's writer, the progress file, the bounds, the
holding buffer of strategy ``lateness`` and the rejects file.

Exactly once across a kill at any point. A connector's position in its source (file and byte,
generated row, Redis entry ID) must move exactly when what was read up to it is committed: the
rows written to the stream, the rows still held (strategy ``lateness``), the rows rejected. The
rows go into the stream by one atomic append (one ``Writer.flush``); the rest of the state
goes into ``progress.json`` (temporary file, fsync, rename). The two cannot be one write, so each
append is preceded by an *intent* in the progress file: the old state, the new one, and the
partition's end offset before and after the append (``before``, ``after``; the connector holds the
partition's one writer lock, so nobody else appends in between). After a crash the end offset
tells what happened: ``after`` means the append committed (take the new state), ``before``
means it did not (read the same input again from the old position). Any other end means someone
else wrote to the partition while the connector was down: an error, since the connector cannot
tell its rows from theirs (a connector must be its partition's only writer).

The state a position carries, besides the position itself:

* the *held* rows (strategy ``lateness``): rows read but not yet written, because their rowtime is
  above the bound. They are snapshotted to ``held-N.arrow`` (written and fsync'd before the
  intent names it; a snapshot no committed state names is deleted on recovery), so the
  position may move past rows that are held, and a SIGKILL loses none of them. Why not keep the
  position behind the oldest held row instead and read again? A directory connector moves a
  file to ``_done/`` once read, and a held row may come from a file three files back; rows
  read again would also have to be told apart from rows already written. A snapshot is one
  rule for every source. Its cost: the held rows (about rate x lateness of them) are rewritten
  at each commit in which they changed.
* the size of ``rejected.jsonl``: late rows (under ``order=reject``) and bad input are appended
  there (fsync'd) before the state that counts them is committed, and cut back to the committed
  size on recovery, so a rejected row is listed once, however often the connector is killed.
* what the strategy has seen (highest rowtime, the source's last bound), so that bounds go on
  from where they were.

The state lives beside the stream (``<stream>/_rowtime_connect/<connector>/``) for local
streams, or where the entry's ``state`` key says: a local folder, required for streams that are
not in one (redis://, s3://, az://), as the state is local files (fsync, rename).
"""

from __future__ import annotations

import heapq
import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..bounds.errors import BoundError, LateRowError, RowtimeError, SchemaError
from ..bounds.time import format_rowtime, from_rowtime_us
from ..streams.catalog import CatalogError, StreamEntry, ensure_stream, redact
from ..streams.meta import fsync_dir
from ..streams.writer import Writer
from .strategies import BoundStrategy

PROGRESS_FILE = "progress.json"
#: Late rows (under order=reject) and bad input, one JSON object per line, kept for people.
REJECTS_FILE = "rejected.jsonl"
_HELD = re.compile(r"held-(\d+)\.arrow\Z")
_STATE = ("position", "held", "rejects", "seen")
#: The rowtime column of a held-rows snapshot (beside the payload columns).
_HELD_RT = "__rowtime_us"
#: The writer never flushes on its own: every append goes through ``Feed.commit``.
_NEVER = 1 << 62


def wall_us() -> int:
    return time.time_ns() // 1000


def state_problem(entry: StreamEntry, connector: str, state: Any) -> str | None:
    """Why the connector's ``state`` setting cannot hold its progress (None: it can). The state
    is local files (fsync'd, renamed): a local folder, needed when the stream is not one."""
    if state is None:
        if "://" not in entry.location:
            return None  # kept beside the stream
        return (
            f"is missing: stream {entry.name!r} is at {redact(entry.location)}, not in a local "
            "folder, so the connector's progress cannot be kept beside it; set "
            f'state = "/var/lib/rowtime/{connector}" in the connector\'s table (a local folder of '
            "its own; a relative path is relative to the catalog file)"
        )
    if not isinstance(state, str) or not state.strip():
        return "must be a local folder (relative to the catalog file) for the connector's progress"
    if "://" in state:
        return (
            "must be a local folder (relative to the catalog file), not a URL: the connector's "
            "progress is local files written with fsync and rename, on the machine it runs on"
        )
    return None


def state_dir(entry: StreamEntry, connector: str, state: Any) -> str:
    """The folder of the connector's progress: ``state`` (relative to the catalog file), else
    ``<stream>/_rowtime_connect/<connector>/`` for a stream in a local folder."""
    problem = state_problem(entry, connector, state)
    if problem is not None:
        raise CatalogError(f"connector {connector!r}: state {problem}")
    if state is not None:
        path = os.path.expanduser(str(state).strip())
        return os.path.abspath(os.path.join(os.path.dirname(entry.catalog), path))
    return os.path.join(entry.location, "_rowtime_connect", connector)


def committed_state(doc: dict[str, Any], end: int) -> dict[str, Any]:
    """The committed state (position, held, rejects, seen) of progress document ``doc`` when
    the partition ends at offset ``end``: the intent's if its append committed (the partition
    ends at its ``after``), else the one before it. ValueError when the partition ends
    elsewhere (someone else appended)."""
    state = {k: doc.get(k) for k in _STATE}
    pending = doc.get("pending")
    if pending is not None:
        if end == pending["after"]:
            return {k: pending.get(k) for k in _STATE}
        if end != pending["before"]:
            raise ValueError(
                f"ends at offset {end}, but the connector's last append went from "
                f"{pending['before']} to {pending['after']}"
            )
    return state


@dataclass
class Stats:
    """What the connector did since it started (for its log lines)."""

    rows: int = 0
    bounds: int = 0
    discarded: int = 0
    late: int = 0
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
        self.dir = state_dir(entry, connector, state)  # refused before the stream is created
        self.storage = ensure_stream(entry)
        if not 0 <= partition < self.storage.meta.partitions:
            raise CatalogError(
                f"connector {connector!r}: partition {partition} does not exist; stream "
                f"{entry.name!r} has partitions 0..{self.storage.meta.partitions - 1}"
            )
        self.partition = partition
        self.schema: pa.Schema = self.storage.meta.payload_schema
        self.reject_late = self.storage.meta.defaults.get("order") == "reject"
        os.makedirs(self.dir, exist_ok=True)
        self.path = os.path.join(self.dir, PROGRESS_FILE)
        self.rejects_path = os.path.join(self.dir, REJECTS_FILE)
        self.writer = Writer(self.storage, partition, flush_records=_NEVER, flush_bytes=_NEVER)
        self.stats = Stats()
        self.started_us = wall_us()
        self.position: Any = None
        #: The holding buffer: a heap of (rowtime us, arrival order, row).
        self.held: list[tuple[int, int, dict[str, Any]]] = []
        self._seq = 0
        self._held_dirty = False
        self._rejects: list[str] = []
        self._committed: dict[str, Any] = {}
        try:
            self._recover()
        except BaseException:
            self.writer.abort()
            raise

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
        end = self.writer.end_offset
        try:
            state = committed_state(self._read(), end)
        except ValueError as e:
            raise RowtimeError(
                f"connector {self.connector!r}: partition {self.partition} of stream "
                f"{self.entry.name!r} {e} ({self.path}): another writer appended while the "
                "connector was down. A connector must be its partition's only writer; give it "
                "a partition of its own"
            ) from None
        self._committed = state
        self.position = state["position"]
        self.strategy.restore(state["seen"])
        # Rejects appended by a step that did not commit are listed again when it is redone.
        size = int(state["rejects"] or 0)
        if os.path.exists(self.rejects_path) and os.path.getsize(self.rejects_path) > size:
            with open(self.rejects_path, "r+b") as f:
                f.truncate(size)
                os.fsync(f.fileno())
        if state["held"]:
            self._load_held(os.path.join(self.dir, state["held"]))
        for name in os.listdir(self.dir):
            if _HELD.match(name) and name != state["held"]:
                os.remove(os.path.join(self.dir, name))  # a snapshot no committed state names
        self._write({**state, "pending": None, "end": end})

    def _load_held(self, path: str) -> None:
        with pa.OSFile(path, "rb") as f:
            table = pa.ipc.open_file(f).read_all()
        rowtimes = table.column(_HELD_RT).to_pylist()
        rows = table.drop_columns([_HELD_RT]).to_pylist()
        for rt, row in zip(rowtimes, rows, strict=True):
            self.held.append((rt, self._seq, row))
            self._seq += 1
        heapq.heapify(self.held)

    def _snapshot_held(self) -> str | None:
        """The name of the snapshot of the held rows (written now if they changed)."""
        if not self._held_dirty:
            return self._committed.get("held")
        self._held_dirty = False
        if not self.held:
            return None
        last = _HELD.match(self._committed.get("held") or "")
        name = f"held-{int(last.group(1)) + 1 if last else 1}.arrow"
        rows = sorted(self.held)
        table = pa.Table.from_pylist([r for _, _, r in rows], schema=self.schema)
        table = table.append_column(_HELD_RT, pa.array([t for t, _, _ in rows], pa.int64()))
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            with pa.ipc.new_file(f, table.schema) as w:
                w.write_table(table)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(self.dir)
        return name

    def _append_rejects(self) -> int:
        """Append the rejects of this step (fsync'd); the file's size after them."""
        size = int(self._committed.get("rejects") or 0)
        if not self._rejects:
            return size
        with open(self.rejects_path, "ab") as f:
            f.write("".join(line + "\n" for line in self._rejects).encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        self._rejects.clear()
        return size

    def commit(self, position: Any) -> bool:
        """Append everything buffered and move the position to ``position`` (with the held rows,
        the rejects and the strategy's state), as one step a kill cannot split (see the module
        docstring). True if anything was appended."""
        state = {
            "position": position,
            "held": self._snapshot_held(),
            "rejects": self._append_rejects(),
            "seen": self.strategy.state(),
        }
        old_held = self._committed.get("held")
        appended = False
        if not self.writer.pending:
            if state != self._committed:
                self._write({**state, "pending": None, "end": self.writer.end_offset})
        else:
            before = self.writer.end_offset
            after = before + self.writer.pending
            intent = {**state, "before": before, "after": after}
            self._write({**self._committed, "pending": intent, "end": before})
            self.writer.flush()
            self.stats.appends += 1
            appended = True
        self._committed = state
        self.position = position
        if old_held and old_held != state["held"]:
            os.remove(os.path.join(self.dir, old_held))
        return appended

    # -- records ------------------------------------------------------------------------------

    def reject(
        self, kind: str, where: str, why: str, row: Any = None, rowtime_us: int | None = None
    ) -> None:
        """Keep an input the stream does not take (``kind`` late or bad) in the rejects file,
        committed with the position; counted as late or discarded."""
        if kind == "late":
            self.stats.late += 1
        else:
            self.stats.discarded += 1
        doc = {
            "kind": kind,
            "source": where,
            "why": " ".join(why.split()),
            "rowtime": None if rowtime_us is None else format_rowtime(rowtime_us),
            "row": row,
            "connector": self.connector,
        }
        self._rejects.append(json.dumps(doc, default=str, ensure_ascii=False))
        if len(self.stats.notes) < 5:
            self.stats.notes.append(f"{kind}: {where}: {doc['why']}")

    def insert(self, row: dict[str, Any], rowtime_us: int | None, where: str = "") -> bool:
        """Take a row read from ``where`` (``rowtime_us`` None: the arrival time). Under strategy
        ``lateness`` it is held until the bound passes it; a row below the partition clock is
        late (kept, see ``reject``). Raises (ValueError, TypeError, RowtimeError) for a row
        that does not fit the stream's schema; False if the row did not go to the stream."""
        now = wall_us()
        clock = self.writer.clock_us
        late = rowtime_us is not None and clock is not None and rowtime_us < clock
        if late:
            why = (
                f"rowtime {format_rowtime(rowtime_us)} is below the partition clock "
                f"{format_rowtime(clock)}"
            )
            if self.reject_late:
                self.reject(
                    "late", where, f"{why} and the stream's order is reject", row, rowtime_us
                )
                return False
            # Written: the reader's policy (order=drop: its quarantine; adjust: moved up) has it.
            self.stats.late += 1
            if len(self.stats.notes) < 5:
                self.stats.notes.append(f"late: {where}: {why} (written; the readers' policy)")
        if self.strategy.holds and rowtime_us is not None and not late:
            unknown = [k for k in row if k not in self.schema.names]
            if unknown:
                raise SchemaError(
                    f"unknown column(s) {', '.join(map(repr, unknown))}; the stream's columns "
                    f"are {', '.join(self.schema.names)}"
                )
            pa.Table.from_pylist([row], schema=self.schema)  # fits the schema, or raises now
            heapq.heappush(self.held, (rowtime_us, self._seq, row))
            self._seq += 1
            self._held_dirty = True
            self.strategy.saw_row(rowtime_us, now)
            return True
        rowtime = None if rowtime_us is None else from_rowtime_us(rowtime_us)
        try:
            self.writer.insert(row, rowtime=rowtime)
        except LateRowError as e:  # below the clock under order=reject (checked above)
            self.reject("late", where, str(e), row, rowtime_us)
            return False
        if not late:
            self.stats.rows += 1
            self.strategy.saw_row(rowtime_us if rowtime_us is not None else now, now)
        return True

    def _release(self, upto_us: int | None) -> None:
        """Write the held rows with rowtime ``<= upto_us`` (all if None), in rowtime order."""
        held = self.held
        while held and (upto_us is None or held[0][0] <= upto_us):
            rowtime_us, _, row = heapq.heappop(held)
            self._held_dirty = True
            try:
                self.writer.insert(row, rowtime=from_rowtime_us(rowtime_us))
            except (RowtimeError, ValueError, TypeError) as e:
                self.reject("bad", "held row", str(e), row, rowtime_us)
                continue
            self.stats.rows += 1

    def source_bound(self, bound_us: int) -> None:
        self.strategy.saw_source_bound(bound_us)

    def bound(self) -> None:
        """Write the held rows the strategy's bound has passed, then the bound if it moves the
        partition clock (a heartbeat's at most once per its interval)."""
        now = wall_us()
        bound, beat = self.strategy.bound_us(now, self.started_us)
        if bound is None:
            return
        self._release(bound)
        clock = self.writer.clock_us
        if clock is not None and bound <= clock:
            return
        try:
            self.writer.set_rowtime_bound(from_rowtime_us(bound))
        except BoundError:  # pragma: no cover - checked against the clock above
            return
        self.stats.bounds += 1
        if beat:
            self.strategy.wrote_heartbeat(now)

    def clock_us(self) -> int | None:
        return self.writer.clock_us

    def close(self, position: Any) -> None:
        """Write the held rows (all of them: nothing is lost on a clean stop), commit what is
        buffered and give the partition up."""
        try:
            self._release(None)
            self.commit(position)
        except BaseException:
            self.writer.abort()  # never flush without an intent: that could duplicate rows
            raise
        self.writer.close()

    def describe(self) -> str:
        where = redact(self.entry.location)
        return f"partition {self.partition} of stream {self.entry.name!r} ({where})"

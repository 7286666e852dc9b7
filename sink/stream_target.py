"""A rowtime-stream target: a query's output appended to a stream, exactly once, with bounds.

The target is a stream (a folder of the embedded log, or another backend's location, whose
backend may keep the sink's state with the stream:
``streams.sink_state.backend_sink_state``) with the query's payload columns (its columns
minus ``rowtime`` and ``is_bound``). Data rows are appended with their ``rowtime`` as explicit
rowtime, each partition in rowtime order; the batch's clock (bound records or watermark,
``sink.clock``) becomes a bound record after them in every partition it moves, so a query
reading the target sees the same progress (SQLstream pumps pass bounds on the same way).

**Partitions.** A new target gets option ``partitions``, or by default one partition per write
task of its first batch (a pass-through query keeps its source's partitioning: task ``i``
writes partition ``i``), except with ``clock=watermark`` for a query that keeps state
(windows, deduplication, joins: its checkpoint has Spark's ``state`` folder,
``sink.clock.checkpoint_keeps_state``), whose results come from Spark's shuffle tasks and
get one partition: one ordered stream of windows. So the driver merges rows only where one
ordered stream is asked for; a pass-through query's rows go from the executors to the target
by a link, whatever its clock (a merged partition funnels every row of every batch through the
driver). It is created when the query starts if option ``partitions`` is given, else
by the first commit. Task ``i`` writes partition ``i mod partitions``.

**The data moves once, on the executors.** ``write()`` sorts the task's rows by rowtime (a
pass-through query's rows already are; ``SORT_BYTES`` at a time, beyond which sorted runs
are merged at the end, ``spill``) and stages them, in runs of up to ``RUN_BYTES``,
as files already in the log's segment format: system columns, payload, and footer statistics
that continue the partition the task writes for (first offset, clock, arrival), each file
fsync'd. When that partition has not moved meanwhile, which is the normal case since the query
alone writes the target, the driver's ``commit()`` publishes the files as the partition's next
segments by a hard link: no record is copied or even read on the driver. Only when several
tasks share a partition (more tasks than partitions, the one ordered partition) or a task's
files do not continue it (its rows would go below the partition's clock) does the driver merge
those tasks' runs into rowtime order, staged as runs that continue the partition and linked in
turn (``merge``, ``sink.merge``). Their rows are then written twice, so tasks writing for a
target of one partition on a folder leave their runs unsynced (``_stage_lazily``): only the
merged runs are made durable, and runs the commit links as they are are synced by it first.

**Two-phase commit.** ``commit()`` (driver, another process) takes every partition's writer
lock (a flock that dies with its process) and, for a batch it has not seen:

1. plans the batch: which tasks go to which partition, ``link`` or ``merge``, and where each
   partition's part starts (``start``), how many data rows it appends and whether a bound
   follows; a merged part's runs are merged and staged durably (``merged``); that plan is
   the batch's manifest entry, its *intent*, written atomically and fsync'd before anything
   is appended, naming the staged files it uses;
2. carries the plan out, partition by partition.

A replay (Spark restarts and re-runs the batch) finds the intent: its write tasks stage
nothing, and its commit carries out what the intent left undone, from the files the intent
names (they are removed only once the batch is wholly applied). How far a partition got is its
end offset minus ``start``: links are made file by file in order (a merged part's bound is
the last record of its last run; a linked part's is a segment after its runs), so every crash
point leaves a prefix of the plan. A crash before the intent leaves nothing to replay: Spark
runs the batch's tasks again. (An intent of an earlier version names a merge without its
runs: the replay merges then.) A partition that holds
more than its part says, or stops inside a file, was written by someone else meanwhile: the
target belongs to the query, so adapters should write elsewhere.

The target's clock is the stream's clock (the minimum of its partitions' clocks), read with
``get_rowtime_bound(path)`` like any stream's. A row below it fails the batch (the promise was
made), before anything is written.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..bounds.arrays import to_arrow
from ..bounds.bounds import NO_TIME, merge_clock
from ..bounds.errors import CorruptLogError, LateRowError, OptionError, SchemaError
from ..bounds.versions import newer_format
from ..streams.columns import SPARK_ROWTIME
from ..streams.ddl import to_ddl
from ..streams.meta import payload_schema
from ..streams.segments import (
    WRITE_ROWS,
    data_run_stats,
    segment_record_batches,
    segment_schema,
)
from ..streams.sink_state import SINK_KIND_STREAM
from ..streams.storage import LocationKind, StreamStorage, create_stream, open_stream, what_is_at
from ..streams.writer import Writer, wall_clock_us
from .clock import checkpoint_keeps_state
from .contiguous import Contiguous
from .layout import FolderSinkState, open_sink_state, wait_for_lock
from .manifest import StreamEntry, StreamPart
from .merge import merge_staged
from .options import SinkConfig
from .spill import Spill
from .target import stage_task
from .task import StagedFile, TaskInfo, TaskReport, as_datetime, iso, reports_query_id

__all__ = ["StreamTarget"]

KIND = SINK_KIND_STREAM
#: A staged run (and so a segment of the target) holds at most about this many bytes ...
RUN_BYTES = 128 << 20
#: ... and this many rows.
RUN_ROWS = 1 << 23
#: Rows that come out of rowtime order are sorted in memory up to this many bytes (copied as
#: they arrive into one chunk per column, ``contiguous``; the sorted rows are gathered and
#: written a piece of ``GATHER_ROWS`` at a time): a write task of 5 M rows of four columns
#: sorts once. Beyond it, sorted runs are kept aside and merged at the end (``spill``).
SORT_BYTES = 256 << 20
#: The rows gathered into rowtime order at a time, on their way to a file: one record batch of
#: the file, whose memory the next one reuses (larger pieces would take fresh pages from the
#: system each time).
GATHER_ROWS = WRITE_ROWS
#: Room beyond ``RUN_ROWS`` in a run's columns (``contiguous``): a run is cut before
#: the batch that passes its size, so it may hold that batch too.
_SLACK_ROWS = 1 << 20
_SLACK_BYTES = 64 << 20
#: The writer appends only a part's bound record, at the flush that ends the part.
_NO_AUTO_FLUSH = 1 << 62


def _compatible(stream_schema: pa.Schema, query_schema: pa.Schema) -> str | None:
    """Why the query's payload cannot be appended to the stream, or None if it can."""
    if stream_schema.names != query_schema.names:
        return (
            f"the stream has columns ({', '.join(stream_schema.names)}) and the query "
            f"({', '.join(query_schema.names)})"
        )
    for have, want in zip(stream_schema, query_schema, strict=True):
        if have.type != want.type:
            return f"column {have.name!r} is {have.type} in the stream and {want.type} in the query"
        if not have.nullable and want.nullable:
            return f"column {have.name!r} is NOT NULL in the stream and nullable in the query"
    return None


def _is_sorted(rt: np.ndarray) -> bool:
    return len(rt) < 2 or bool(np.all(rt[1:] >= rt[:-1]))


class _Runs:
    """One task's data rows, staged as sorted runs in the target's segment format.

    The footer of each run continues partition ``partition`` from offset ``first`` and clock
    ``base_clock_us`` as if the runs before it had been appended; ``ordered`` says whether
    they really do continue one another (each run starts at or after the last rowtime of the
    one before). Rows that come out of order are sorted a run at a time and merged at the end
    (``spill``), so their runs continue one another too. Memory: one run at a time
    (``RUN_BYTES`` of rows in order, ``SORT_BYTES`` out of order) and a piece of
    ``GATHER_ROWS`` rows gathered into order.
    """

    def __init__(
        self,
        target: StreamTarget,
        info: TaskInfo,
        file_schema: pa.Schema,
        first: int,
        base_clock_us: int | None,
        arrival_us: int,
        lazy: FolderSinkState | None = None,
    ) -> None:
        self.target = target
        self.lazy = lazy  # the folder to stage in for the commit's merge (unsynced), if any
        self.info = info
        self.file_schema = file_schema
        self.next_first = first
        self.clock = NO_TIME if base_clock_us is None else base_clock_us
        self.arrival = arrival_us
        self.files: list[StagedFile] = []
        self.ordered = True
        self._top: int | None = None  # the last rowtime of the runs written
        self._syncer = concurrent.futures.ThreadPoolExecutor(1, "rowtime-fsync")
        self._syncs: list[concurrent.futures.Future[None]] = []
        self._pending: list[pa.RecordBatch] = []
        self._times: list[np.ndarray] = []  # the rowtimes of the rows held as batches
        self._rows = 0
        self._bytes = 0
        self._sorted = True  # the pending rows are in rowtime order
        self._last: int | None = None  # the last pending rowtime, while sorted
        self._spill = Spill()  # sorted runs kept aside when rows come out of order
        self._dense: Contiguous | None = None  # the pending rows, once out of order
        self._seen_rows = 0
        self._seen_bytes = 0

    def add(self, data: pa.RecordBatch, rt: np.ndarray) -> None:
        cap = RUN_BYTES if self._sorted else SORT_BYTES
        if self._rows and (self._bytes >= cap or self._rows >= RUN_ROWS):
            self._write_run(more=True)  # a full run, and this batch shows more rows follow
        if self._sorted and (
            (self._last is not None and int(rt[0]) < self._last) or not _is_sorted(rt)
        ):
            self._sorted = False
            # From here the run is gathered: its rows go into one chunk per column as they
            # come (.contiguous), which Arrow gathers from faster than from the batches.
            self._dense = Contiguous.of(
                data.schema, RUN_ROWS + _SLACK_ROWS, SORT_BYTES + _SLACK_BYTES
            )
            if self._dense is not None:
                held, times = self._pending, self._times
                self._pending, self._times = [], []
                for batch, batch_rt in zip(held, times, strict=True):
                    self._hold(batch, batch_rt)
        self._last = int(rt[-1])
        self._hold(data, rt)
        self._rows += data.num_rows
        self._bytes += data.nbytes
        self._seen_rows += data.num_rows
        self._seen_bytes += data.nbytes

    def _hold(self, batch: pa.RecordBatch, rt: np.ndarray) -> None:
        """Keep ``batch`` (rowtimes ``rt``) pending: copied into the run's columns once rows
        came out of order, else as it is. A copied batch is let go whole: its rowtimes are
        read back from the run's ``rowtime`` column, since ``rt`` is a view of the batch's
        memory and would keep it, so that each batch from Spark would take fresh memory
        (a page fault a page)."""
        if self._dense is None:
            self._pending.append(batch)
            self._times.append(rt)
            return
        if self._dense.add(batch):
            return
        # more than the run's room: keep the rows as batches from here
        dense, self._dense = self._dense, None
        self._pending = [*dense.table().to_batches(), batch]
        self._times = [_dense_times(dense), rt]

    def _held_times(self) -> np.ndarray:
        """The pending rows' rowtimes (int64 microseconds), in the order they are held."""
        if self._dense is not None:
            return _dense_times(self._dense)
        return np.concatenate(self._times) if self._times else np.empty(0, dtype=np.int64)

    def _run_table(self) -> pa.Table:
        """The pending rows as a table (one chunk per column once rows came out of order)."""
        if self._dense is None:
            return pa.Table.from_batches(self._pending)
        dense, self._dense = self._dense, None
        return dense.table()  # holds every pending row (the batches were let go)

    def close(self) -> list[StagedFile]:
        """Write what is pending; return the files once every one is durable."""
        try:
            if self._spill:  # the kept runs and the last, merged: staged in order
                last_rt = self._held_times()
                batches = self._run_table().to_batches() if self._rows else []
                self._pending, self._times = [], []
                for piece, times in self._spill.merged(batches, last_rt, self._piece_rows()):
                    self._stage(piece, len(times), int(times[0]), int(times[-1]))
            elif self._rows:
                self._write_run(more=False)
        finally:
            self._spill.close()
        try:
            for sync in self._syncs:
                sync.result()
        finally:
            self._syncer.shutdown()
        return self.files

    def discard(self) -> None:
        self._spill.close()
        self._syncer.shutdown(wait=True, cancel_futures=True)
        self.target.state.discard_staged([f.staged for f in self.files])
        self.files = []

    def _piece_rows(self) -> int:
        """Rows of a staged run (``RUN_BYTES``, at the bytes a row the task has seen)."""
        per_row = max(1, self._seen_bytes // max(1, self._seen_rows))
        return max(1, min(RUN_ROWS, RUN_BYTES // per_row))

    def _write_run(self, more: bool) -> None:
        """Stage the pending rows as sorted runs; or, when rows came out of order and ``more``
        follow, keep them aside for the merge at the end (``spill``), so that the task's
        runs continue one another and the commit links them."""
        ordered, rt = self._sorted, self._held_times()
        table = None if ordered else self._run_table()
        batches = self._pending
        self._pending, self._times, self._rows, self._bytes = [], [], 0, 0
        self._sorted, self._last = True, None
        if ordered and not (more and self._spill):
            self._stage(batches, len(rt), int(rt[0]), int(rt[-1]))  # as Spark sent them
            return
        if ordered:  # in order, but kept aside beside the runs before it
            self._spill.add(batches, rt)
            return
        assert table is not None
        order = np.argsort(rt, kind="stable")
        if more:
            self._spill.add(_gathered(table, order), rt[order])
            return
        step = self._piece_rows()  # a segment of at most RUN_BYTES, as for rows in order
        for s in range(0, len(rt), step):
            e = min(len(rt), s + step)
            lo, hi = int(rt[order[s]]), int(rt[order[e - 1]])
            self._stage(_gathered(table, order[s:e]), e - s, lo, hi)

    def _stage(self, batches: Iterable[pa.RecordBatch], n: int, lo: int, hi: int) -> None:
        """Stage ``n`` rows in rowtime order, from ``lo`` to ``hi``, as the next run."""
        if self._top is not None and lo < self._top:
            self.ordered = False
        self._top = hi if self._top is None else max(hi, self._top)
        stats = data_run_stats(
            self.next_first,
            n,
            min_rowtime_us=lo,
            max_rowtime_us=hi,
            last_rowtime_us=hi,
            arrival_us=self.arrival,
            clock_before_us=self.clock,
        )
        self.clock = stats.clock_us
        name = f"{self.info.task:05d}-{self.info.attempt}-{uuid.uuid4().hex[:12]}.arrow"
        chunks = segment_record_batches(batches, self.file_schema, self.arrival, SPARK_ROWTIME)
        if self.lazy is not None:
            handle, _ = self.lazy.stage_segment(
                self.info.batch_id, name, stats, self.file_schema, chunks, lazy=True
            )
        else:
            handle, durable = self.target.state.stage_segment(
                self.info.batch_id, name, stats, self.file_schema, chunks
            )
            # The store catches up while the task goes on receiving rows; close() waits for it.
            self._syncs.append(self._syncer.submit(durable))
        self.files.append(StagedFile(staged=handle, rows=n, first=self.next_first))
        self.next_first += n


class StreamTarget:
    """The rowtime-stream target of one query. Holds only picklable configuration."""

    def __init__(self, cfg: SinkConfig) -> None:
        self.cfg = cfg
        self.state = open_sink_state(cfg.location)
        self.where = f"target stream {self.state.target}"  # without a password

    def _stream(self) -> StreamStorage | None:
        """The target stream, or None before the first commit created it."""
        if what_is_at(self.cfg.location).kind is not LocationKind.STREAM:
            return None
        return open_stream(self.cfg.location)

    def _payload(self) -> pa.Schema:
        try:
            return payload_schema(self.cfg.payload_schema)
        except SchemaError as e:
            raise SchemaError(f"{self.where}: the query's payload cannot be a stream: {e}") from e

    def _new_partitions(self, tasks: int) -> int:
        """How many partitions a target created by a commit of ``tasks`` tasks gets (see the
        module's docstring): the option, else 1 for a query that keeps state, else one per
        task."""
        if self.cfg.partitions:
            return self.cfg.partitions
        if self.cfg.clock == "watermark" and checkpoint_keeps_state(self.cfg.checkpoint):
            return 1
        return max(1, tasks)

    # -- driver, when the query starts --------------------------------------------------------

    def prepare(self) -> None:
        """Check an existing stream can take the query's rows, or create the stream when its
        partition count is known now (option ``partitions``); else the first commit creates
        it, when the number of write tasks, and whether the query keeps state, are known."""
        cfg = self.cfg
        wanted = self._payload()
        stream = self._stream()
        if stream is None:
            kind = (self.state.read_target() or {"kind": KIND}).get("kind")
            if kind != KIND:
                raise OptionError(
                    f"option path={self.state.target!r} holds a parquet target of this sink; "
                    "target=stream writes a rowtime stream: choose another path"
                )
        if stream is not None:
            why = _compatible(stream.meta.payload_schema, wanted)
            if why is not None:
                raise SchemaError(
                    f"{self.where} cannot take this query's rows: {why}. Write to a new path, "
                    f"or select columns matching the stream's "
                    f"({to_ddl(stream.meta.payload_schema)})"
                )
            have = stream.meta.partitions
            if cfg.partitions is not None and cfg.partitions != have:
                raise OptionError(
                    f"option partitions={cfg.partitions} is for a new target, and {self.where} "
                    f"already has {have} partitions: remove the option, or write to a new path"
                )
        self.state.define_target({"kind": KIND})
        if stream is None and cfg.partitions is not None:
            create_stream(cfg.location, wanted, cfg.partitions, **cfg.retention)

    # -- executors ----------------------------------------------------------------------------

    def _stage_lazily(self, stream: StreamStorage | None) -> FolderSinkState | None:
        """The folder a task stages its runs in unsynced, or None to stage them durably.

        A target of one partition (the one ordered partition: option ``partitions=1``, or a
        stateful query's results) gets every task's rows, which the commit merges and writes
        again, durably (``sink.merge``): the runs it merges need not reach the disk. On a
        folder they are left to the page cache, and the commit makes them durable only if it
        links them (one task with rows). Other stores make a run durable as they stage it."""
        if not isinstance(self.state, FolderSinkState):
            return None
        if stream is not None:
            one = stream.meta.partitions == 1
        elif self.cfg.partitions is not None:
            one = self.cfg.partitions == 1
        else:
            one = self.cfg.clock == "watermark" and checkpoint_keeps_state(self.cfg.checkpoint)
        return self.state if one else None

    def write(self, info: TaskInfo, batches: Iterable[pa.RecordBatch]) -> TaskReport:
        """Stage this task's data rows as sorted runs in the segment format (see the module's
        docstring); nothing when the batch already has an intent (a replay)."""
        assumed: dict[str, Any] = {}

        def begin() -> tuple[int | None, _Runs]:
            stream = self._stream()
            if stream is None:  # the first commit creates it, with this many partitions
                partitions = self.cfg.partitions
                partition = info.task if partitions is None else info.task % partitions
                first, base_clock, last_arrival, floor = 0, None, None, None
                file_schema = segment_schema(self._payload())
            else:
                partition = info.task % stream.meta.partitions
                tail = stream.tail(partition)
                first, base_clock, last_arrival = tail.end, tail.clock_us, tail.last_arrival_us
                floor = stream.stream_clock_us()
                file_schema = stream.file_schema
            arrival = wall_clock_us()
            if last_arrival is not None:
                arrival = max(arrival, last_arrival)
            lazy = self._stage_lazily(stream)
            assumed.update(
                partition=partition, base_clock_us=base_clock, arrival_us=arrival,
                synced=lazy is None,
            )  # fmt: skip
            return floor, _Runs(self, info, file_schema, first, base_clock, arrival, lazy)

        report, runs = stage_task(self, info, batches, begin)
        if runs is None:
            return report
        assert isinstance(runs, _Runs)
        return dataclasses.replace(report, ordered=runs.ordered, **assumed)

    # -- driver, per batch --------------------------------------------------------------------

    def commit(
        self, reports: Sequence[TaskReport], batch_id: int, candidate_us: int | None
    ) -> StreamEntry | None:
        """Append batch ``batch_id`` exactly once; returns its manifest entry (None when the
        batch appends nothing). ``candidate_us`` is the clock the batch would move to."""
        state = self.state
        entry = self._entry(batch_id)
        stream = self._stream()
        if stream is None:
            if entry is not None:
                raise CorruptLogError(
                    f"{self.where}: batch {batch_id} has an intent, and the stream is missing"
                )
            stream = create_stream(
                self.cfg.location,
                self._payload(),
                self._new_partitions(len(reports)),
                **self.cfg.retention,
            )
        # Every partition's lock, in order (waiting while a killed driver's commit runner
        # finishes). On any error buffers are discarded (abort), never flushed.
        writers: list[Writer] = []

        def open_partition(p: int) -> Writer:
            return Writer(stream, p, flush_records=_NO_AUTO_FLUSH, flush_bytes=_NO_AUTO_FLUSH)

        try:
            for p in range(stream.meta.partitions):
                writers.append(wait_for_lock(functools.partial(open_partition, p)))
            replayed = entry is not None
            if entry is None:
                entry = self._plan(writers, reports, batch_id, candidate_us)
                if entry is not None:
                    entry = self._stage_parts(writers, entry, reports, stream.file_schema)
                    # The intent, durable before anything is appended.
                    state.replace_entry(batch_id, entry.to_dict())
            done = entry is None or not self._apply(writers, entry, stream.file_schema)
        except BaseException:
            for w in writers:
                w.abort()
            raise
        for w in writers:
            w.close()
        if entry is not None and not (replayed and done):
            state.prune()
        state.clean_staging(batch_id)
        if entry is not None and replayed and done:
            return entry.as_replayed()
        return entry

    def _entry(self, batch_id: int) -> StreamEntry | None:
        """The intent of batch ``batch_id`` if it has one; one of another format is refused."""
        doc = self.state.entry(batch_id)
        if doc is None:
            return None
        found = int(doc.get("format", 1))
        if found > StreamEntry.FORMAT:
            raise newer_format(
                f"{self.where}: batch {batch_id}'s manifest entry", found, StreamEntry.FORMAT,
                CorruptLogError,
            )  # fmt: skip
        if found != StreamEntry.FORMAT:
            raise CorruptLogError(
                f"{self.where}: batch {batch_id}'s manifest entry has format "
                f"{doc.get('format', 1)}; this version replays format {StreamEntry.FORMAT}: "
                "finish the batch with the version that started it"
            )
        return StreamEntry.from_dict(doc)

    def _plan(
        self,
        writers: Sequence[Writer],
        reports: Sequence[TaskReport],
        batch_id: int,
        candidate_us: int | None,
    ) -> StreamEntry | None:
        """The intent of a batch not seen before (None when it appends nothing)."""
        n = len(writers)
        ends = [w.end_offset for w in writers]
        clocks = [w.clock_us for w in writers]
        stream_clock = merge_clock(clocks)
        with_rows = sorted((r for r in reports if r.files), key=lambda r: r.info.task)
        if with_rows:
            low = min(r.min_rowtime_us for r in with_rows if r.min_rowtime_us is not None)
            if stream_clock is not None and low < stream_clock:
                raise LateRowError(
                    f"{self.where}: batch {batch_id} has a row with rowtime {iso(low)}, "
                    f"below the stream's clock {iso(stream_clock)}; nothing of the batch was "
                    "written"
                )
        # Each task goes to the partition it wrote for, unless that partition's clock has
        # passed its rows; then to the partition with the lowest clock (never above them).
        floors = [NO_TIME if c is None else c for c in clocks]
        lowest = min(range(n), key=lambda q: (floors[q], q))
        assigned: dict[int, list[TaskReport]] = {}
        for r in with_rows:
            p = r.partition if r.partition is not None and r.partition < n else r.info.task % n
            assert r.min_rowtime_us is not None
            if floors[p] > r.min_rowtime_us:
                p = lowest
            assigned.setdefault(p, []).append(r)
        parts = []
        after_all = []
        for p, w in enumerate(writers):
            rs = assigned.get(p, [])
            rows = sum(r.rows for r in rs)
            after = clocks[p]
            for r in rs:
                assert r.max_rowtime_us is not None
                after = r.max_rowtime_us if after is None else max(after, r.max_rowtime_us)
            bound = candidate_us is not None and (after is None or candidate_us > after)
            after_all.append(candidate_us if bound else after)
            if not rows and not bound:
                continue
            last_arrival = w.last_arrival_us
            link = (
                len(rs) == 1
                and rs[0].ordered
                and rs[0].partition == p
                and rs[0].files[0].first == ends[p]
                and rs[0].base_clock_us == clocks[p]
                and rs[0].arrival_us is not None
                and (last_arrival is None or rs[0].arrival_us >= last_arrival)
            )
            parts.append(
                StreamPart(
                    partition=p,
                    start=ends[p],
                    rows=rows,
                    bound_us=candidate_us if bound else None,
                    mode="link" if link else "merge",
                    files=tuple((f.staged, f.rows) for r in rs for f in r.files),
                )
            )
        if not parts:
            return None
        new_clock = merge_clock(after_all)
        return StreamEntry(
            batch=batch_id,
            query_id=reports_query_id(reports),
            rows=sum(p.rows for p in parts),
            clock_us=new_clock,
            clock=iso(new_clock),
            previous_clock_us=stream_clock,
            parts=tuple(parts),
        )

    def _stage_parts(
        self,
        writers: Sequence[Writer],
        entry: StreamEntry,
        reports: Sequence[TaskReport],
        file_schema: pa.Schema,
    ) -> StreamEntry:
        """Before the intent of a batch not seen before: merge every merged part's runs into
        runs staged durably (``sink.merge``), and make the runs a link part takes durable if
        their task left them unsynced, so that the intent names only durable runs. (A crash
        before the intent leaves nothing to replay: Spark runs the batch's tasks again.)"""
        unsynced = {f.staged for r in reports if not r.synced for f in r.files}
        parts = []
        for part in entry.parts:
            if part.mode == "merge" and part.files:
                part = self._merge(writers[part.partition], entry, part, file_schema)
            elif part.mode == "link":
                lazy = [path for path, _ in part.files if path in unsynced]
                if lazy:
                    assert isinstance(self.state, FolderSinkState)  # where tasks stage lazily
                    self.state.sync_staged(lazy)
            parts.append(part)
        return dataclasses.replace(entry, parts=tuple(parts))

    def _apply(self, writers: Sequence[Writer], entry: StreamEntry, file_schema: pa.Schema) -> bool:
        """Carry out what the intent ``entry`` has not done yet; True if anything was left.
        ``file_schema``: the target's segment columns, for the runs a merge stages."""
        did = False
        for i, part in enumerate(entry.parts):
            p, start, records = part.partition, part.start, part.records
            if p >= len(writers):
                raise CorruptLogError(
                    f"{self.where}: batch {entry.batch} was to append to partition {p}, and "
                    f"the stream has {len(writers)} partitions"
                )
            w = writers[p]
            done = w.end_offset - start
            if done >= records:
                continue
            if done < 0:
                raise self._foreign(entry, p, start, records, w.end_offset)
            did = True
            if part.mode == "merge" and part.files and not part.merged:
                # An intent of an earlier version, which merged when it applied it.
                if done != 0:
                    raise self._foreign(entry, p, start, records, w.end_offset)
                part = self._merge(w, entry, part, file_schema)
                entry = dataclasses.replace(
                    entry, parts=(*entry.parts[:i], part, *entry.parts[i + 1 :])
                )
                # The merged runs, durable, named before any of them is linked.
                self.state.replace_entry(entry.batch, entry.to_dict())
            files = list(part.merged if part.mode == "merge" else part.files)
            pos, todo = 0, []
            for path, count in files:
                if pos + count <= done:
                    pos += count
                    continue
                if pos < done:  # the partition stops inside this file
                    raise self._foreign(entry, p, start, records, w.end_offset)
                todo.append(path)
                pos += count
            if todo:
                self._check_staged(entry, todo)
                # The executors (or the merge) built the runs from rows they checked: trust
                # the footers, so that the driver reads no record (on a folder).
                self.state.append_staged(w, todo)
            if part.bound_us is not None and not part.merged:  # a merge's last run holds it
                w.set_rowtime_bound(as_datetime(part.bound_us))
                w.flush()  # the bound's segment, durable
        return did

    def _merge(
        self, w: Writer, entry: StreamEntry, part: StreamPart, file_schema: pa.Schema
    ) -> StreamPart:
        """Merge the staged runs of ``part`` (a merge) into rowtime order, staged as runs that
        continue partition ``w`` (``sink.merge``); the part with them as its ``merged``."""
        handles = [path for path, _ in part.files]
        self._check_staged(entry, handles)
        arrival = wall_clock_us()
        if w.last_arrival_us is not None:
            arrival = max(arrival, w.last_arrival_us)
        runs = merge_staged(
            self.state,
            entry.batch,
            handles,
            file_schema,
            first=w.end_offset,
            clock_before_us=w.clock_us,
            bound_us=part.bound_us,
            arrival_us=arrival,
            run_rows=RUN_ROWS,
            run_bytes=RUN_BYTES,
            where=self.where,
        )
        if sum(r.rows for r in runs) != part.records:
            raise CorruptLogError(
                f"{self.where}: batch {entry.batch}'s staged runs for partition "
                f"{part.partition} hold {sum(r.rows for r in runs) - (part.bound_us is not None)} "
                f"rows, and its intent says {part.rows}; was the sink's staging area changed "
                "by hand?"
            )
        return dataclasses.replace(part, merged=tuple((r.staged, r.rows) for r in runs))

    def _check_staged(self, entry: StreamEntry, handles: Sequence[str]) -> None:
        missing = self.state.missing_staged(handles)
        if missing:
            raise CorruptLogError(
                f"{self.where}: batch {entry.batch} is planned but its staged run "
                f"{missing[0]} is gone ({len(missing)} missing), so the batch cannot be "
                "finished; was the sink's staging area cleaned by hand?"
            )

    def _foreign(
        self, entry: StreamEntry, p: int, start: int, records: int, end: int
    ) -> CorruptLogError:
        return CorruptLogError(
            f"{self.where}: batch {entry.batch} was to append records [{start}, "
            f"{start + records}) to partition {p}, which holds {end}: another writer appended "
            "to the target meanwhile; the target stream must be written by the query alone"
        )

    def abort(self, reports: Sequence[TaskReport | None], batch_id: int) -> None:
        """Remove what the batch staged, unless an intent names it (a replay finishes it)."""
        if self.state.entry(batch_id) is None:
            self.state.drop_staging(batch_id)

    # -- reading ------------------------------------------------------------------------------

    def clock_us(self) -> int | None:
        stream = self._stream()
        return None if stream is None else stream.stream_clock_us()


def _dense_times(dense: Contiguous) -> np.ndarray:
    """The rowtimes of the rows copied into ``dense`` (a view of its ``rowtime`` column)."""
    return dense.values(dense.schema.get_field_index(SPARK_ROWTIME))


def _gathered(table: pa.Table, order: np.ndarray) -> Iterator[pa.RecordBatch]:
    """``table``'s rows in the order ``order`` gives, a record batch of ``GATHER_ROWS``
    at a time: the sorted copy never exists whole. Rows out of order come as one chunk per
    column (``contiguous``), which Arrow gathers from faster than from many."""
    for s in range(0, len(order), GATHER_ROWS):
        yield from table.take(to_arrow(order[s : s + GATHER_ROWS])).to_batches()

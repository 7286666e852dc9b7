"""The Spark reader: ``spark.readStream.format("rowtime")`` and ``spark.read.format("rowtime")``.

The driver plans time; executors move bytes (DESIGN). ``latestOffset`` reads only the rowtime
columns of new records, runs each partition's policy and the alignment across partitions
(:mod:`pyspark_rowtime.bounds.plan`) and writes everything it decided into the end offset: per
partition the policy state, and the stream clock. ``read()`` runs on an executor in a freshly
unpickled reader: it reads the same records (payload too) from the start offset's state,
replays the same decision and emits the rows it released as Arrow record batches. The same
offsets always give the same rows and the same bound record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..bounds.errors import InvalidRowtimeError, SchemaError
from ..bounds.plan import StreamPosition, bound_to_emit, choose_ends, stream_clock
from ..bounds.policies import (
    NO_TIME,
    AdjustPolicy,
    Classified,
    PartitionScan,
    PartitionState,
    Policy,
    classify,
    scan_partition,
)
from ..bounds.time import rowtime_array_us, to_rowtime_us
from ..streams.columns import (
    LOG_ARRIVAL_US,
    LOG_IS_BOUND,
    LOG_ROWTIME_US,
    LOG_SYSTEM_COLUMNS,
    SPARK_IS_BOUND,
    SPARK_ROWTIME,
)
from ..streams.storage import StreamStorage, open_storage
from .options import ReaderConfig

TS_TYPE = pa.timestamp("us", tz="UTC")
#: Rows per Arrow record batch handed to Spark.
BATCH_ROWS = 1 << 16
#: New records per piece when the policies run over a step (see :func:`classify_pieces`).
PIECE_RECORDS = 1 << 18

#: Columns of the quarantine (``output=discarded``) besides the payload and ``rowtime``.
QUARANTINE_COLUMNS = [
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("arrival", TS_TYPE),
    pa.field("reason", pa.string()),
    pa.field("clock", TS_TYPE),
]


def output_arrow_schema(payload: pa.Schema, output: str = "rows") -> pa.Schema:
    """The Arrow schema of what the reader emits; payload fields become nullable because the
    payload of a bound record is null."""
    fields = [f.with_nullable(True) for f in payload]
    names = {f.name.lower(): f.name for f in fields}
    extra = [pa.field(SPARK_ROWTIME, TS_TYPE), pa.field(SPARK_IS_BOUND, pa.bool_())]
    if output == "discarded":
        extra = [pa.field(SPARK_ROWTIME, TS_TYPE), *QUARANTINE_COLUMNS]
    for f in extra:
        if f.name.lower() in names:
            raise SchemaError(
                f"payload column {names[f.name.lower()]!r} clashes with the column {f.name!r} "
                "that format rowtime adds; rename the payload column in the stream's schema"
            )
    return pa.schema(fields + extra)


def where_of(cfg: ReaderConfig, partition: int) -> str:
    return f"stream {cfg.location!r} partition {partition}"


def record_times(
    table: pa.Table, cfg: ReaderConfig, partition: int, first_offset: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each record's time: a data row's rowtime (promoted column, explicit, or arrival) or a
    bound record's bound, as int64 microseconds; and which records are bounds."""
    is_bound = table.column(LOG_IS_BOUND).to_numpy()
    explicit = pc.coalesce(table.column(LOG_ROWTIME_US), table.column(LOG_ARRIVAL_US))
    t = np.asarray(explicit.to_numpy(), dtype=np.int64)
    if cfg.rowtime_column is None or len(t) == 0:
        return t, is_bound
    column = table.column(cfg.rowtime_column)
    data = np.flatnonzero(~is_bound)
    values = column if len(data) == len(t) else column.take(pa.array(data))
    what = f"rowtime.column {cfg.rowtime_column!r} of {where_of(cfg, partition)}"
    try:
        promoted = rowtime_array_us(
            values,
            unit=cfg.rowtime_unit,
            tz=cfg.rowtime_timezone,
            fmt=cfg.rowtime_format,
            what=what,
        )
    except InvalidRowtimeError:
        raise _first_bad_rowtime(values, data, cfg, partition, first_offset) from None
    t = t.copy()
    t[data] = promoted
    return t, is_bound


def _first_bad_rowtime(
    values: pa.ChunkedArray | pa.Array,
    data: np.ndarray,
    cfg: ReaderConfig,
    partition: int,
    first_offset: int,
) -> InvalidRowtimeError:
    """Find the record behind a failed conversion, so the error names its offset."""
    for i, value in enumerate(values.to_pylist()):
        try:
            if value is None:
                raise InvalidRowtimeError("the value is null")
            to_rowtime_us(
                value, unit=cfg.rowtime_unit, tz=cfg.rowtime_timezone, fmt=cfg.rowtime_format
            )
        except InvalidRowtimeError as e:
            return InvalidRowtimeError(
                f"{where_of(cfg, partition)}, offset {first_offset + int(data[i])}: "
                f"rowtime.column {cfg.rowtime_column!r} holds {value!r}, which is not a rowtime "
                f"({e}); fix rowtime.unit/rowtime.format/rowtime.timezone, or the record"
            )
    return InvalidRowtimeError(f"rowtime.column {cfg.rowtime_column!r}: a value is not a rowtime")


def time_columns(cfg: ReaderConfig) -> list[str]:
    cols = list(LOG_SYSTEM_COLUMNS)
    if cfg.rowtime_column is not None:
        cols.append(cfg.rowtime_column)
    return cols


@dataclass
class _Window:
    first: int
    t: np.ndarray
    is_bound: np.ndarray

    @property
    def end(self) -> int:
        return self.first + len(self.t)


class Planner:
    """The driver's side: turns a start offset and the log into an end offset.

    It keeps, per partition, the rowtimes of the records still alive, so each micro-batch reads
    only the new records' time columns; after a restart the cache starts empty and is rebuilt
    from the offset (the result is the same, only slower once).
    """

    def __init__(self, cfg: ReaderConfig) -> None:
        self.cfg = cfg
        self._stream: StreamStorage | None = None
        self._cache: dict[int, _Window] = {}

    @property
    def stream(self) -> StreamStorage:
        if self._stream is None:
            self._stream = open_storage(self.cfg.location)
        return self._stream

    def available(self) -> list[int]:
        s = self.stream
        return [s.end_offset(p) for p in range(s.meta.partitions)]

    def window(self, partition: int, start: int, end: int) -> _Window:
        cached = self._cache.get(partition)
        if cached is not None and cached.first <= start <= cached.end <= end:
            lo = start - cached.first
            t, b = cached.t[lo:], cached.is_bound[lo:]
            if cached.end < end:
                nt, nb = self._read(partition, cached.end, end)
                t, b = np.concatenate([t, nt]), np.concatenate([b, nb])
        else:
            t, b = self._read(partition, start, end)
        w = _Window(start, t, b)
        self._cache[partition] = w
        return w

    def _read(self, partition: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        table = self.stream.read(partition, start, end, columns=time_columns(self.cfg))
        return record_times(table, self.cfg, partition, start)

    def plan(
        self, pos: StreamPosition, available: Sequence[int], max_rows: int | None
    ) -> StreamPosition | None:
        """The next position, or None when there is nothing new to read.

        The same position as :func:`pyspark_rowtime.bounds.plan.step` over the whole step, but
        computed piece by piece (:func:`classify_pieces`)."""
        ends = choose_ends(pos, available, max_rows)
        if ends == [p.next for p in pos.partitions]:
            return None
        policy = self.cfg.policy
        windows = [self.window(p, st.scan, ends[p]) for p, st in enumerate(pos.partitions)]
        parts = list(zip(pos.partitions, windows, strict=True))
        wheres = [where_of(self.cfg, p) for p in range(len(parts))]
        at_end = [
            end_scan(policy, st, win.t, win.is_bound, where)
            for (st, win), where in zip(parts, wheres, strict=True)
        ]
        clock = stream_clock(at_end, pos.clock_us)
        states = []
        for (st, win), where in zip(parts, wheres, strict=True):
            pieces = classify_pieces(policy, st, win.t, win.is_bound, pos.clock_us, clock, where)
            *_, (_, last) = pieces
            states.append(last.state)
        new = StreamPosition(clock, states)
        for p, state in enumerate(new.partitions):
            w = self._cache.get(p)
            if w is not None and w.first <= state.scan:
                lo = state.scan - w.first
                self._cache[p] = _Window(state.scan, w.t[lo:], w.is_bound[lo:])
        return new

    def start_position(self) -> StreamPosition:
        n = self.stream.meta.partitions
        if self.cfg.starting == "latest":
            return StreamPosition.start(self.available())
        return StreamPosition.start([0] * n)


def _opt(value: int) -> int | None:
    return None if value == NO_TIME else int(value)


def end_scan(
    policy: Policy,
    prev: PartitionState,
    t: np.ndarray,
    is_bound: np.ndarray,
    where: str,
    piece: int = PIECE_RECORDS,
) -> PartitionScan:
    """Scan the new records ``[prev.next, prev.scan + len(t))`` piece by piece (``t`` and
    ``is_bound`` start at ``prev.scan``) and return the last piece's scan: its ``clock_us()``
    is the partition clock at the end, as one scan of the whole window would say. Under
    ``reject`` a late row raises here, naming its offset."""
    state = PartitionState(
        next=prev.next, scan=prev.next, scan_ref_us=prev.ref_us, scan_bound_us=prev.bound_us
    )
    i = prev.next - prev.scan
    while True:
        j = min(len(t), i + piece)
        scan = scan_partition(policy, state, t[i:j], is_bound[i:j], where=where)
        if j == len(t):
            return scan
        ref, bound = scan.state_at_end()
        at = prev.scan + j
        state = PartitionState(next=at, scan=at, scan_ref_us=_opt(ref), scan_bound_us=_opt(bound))
        i = j


def classify_pieces(
    policy: Policy,
    prev: PartitionState,
    t: np.ndarray,
    is_bound: np.ndarray,
    clock_before_us: int | None,
    clock_after_us: int | None,
    where: str,
    piece: int = PIECE_RECORDS,
) -> Iterator[tuple[int, Classified]]:
    """One partition's step, ``scan_partition`` + ``classify`` over at most ``piece`` new
    records at a time; yields ``(first offset of the piece's window, what it decided)``.

    Why: over a backlog of millions of records, one pass allocates a dozen arrays as large as
    the backlog; pieces keep them in the CPU caches and reuse memory (4-5x faster planning in
    a fresh process, measured by ``bench/reader.py``). The result is the same as one pass: each
    piece resumes from the state the previous one left (its window starts at the first record
    still alive), and later pieces take the stream clock after the step as the clock before,
    since the earlier pieces already emitted every released row up to it. Rows come out in the
    same order: a row released in a later piece is above every row released earlier (the
    ordering argument in :mod:`pyspark_rowtime.bounds.policies`). ``adjust.maxHeld`` is checked
    at the end of the step only, as one pass does. When more rows stay alive than a piece
    (a partition far ahead of the others), the rest is done in one pass, so the work never
    grows beyond one pass's.
    """
    end = prev.scan + len(t)
    loose = policy
    if isinstance(policy, AdjustPolicy):
        loose = dataclasses.replace(policy, max_held=np.iinfo(np.int64).max)
    state, before = prev, clock_before_us
    while True:
        stop = end if state.next - state.scan > piece else min(end, state.next + piece)
        lo, hi = state.scan - prev.scan, stop - prev.scan
        last = stop == end
        scan = scan_partition(
            policy if last else loose, state, t[lo:hi], is_bound[lo:hi], where=where
        )
        c = classify(scan, before, clock_after_us)
        yield state.scan, c
        if last:
            return
        state, before = c.state, clock_after_us


def partition_tasks(
    cfg: ReaderConfig, start: dict[str, Any], end: dict[str, Any]
) -> list[ReadTask]:
    """One task per stream partition; the first also carries the step's bound record."""
    s = StreamPosition.from_dict(start)
    e = StreamPosition.from_dict(end)
    bound = bound_to_emit(s.clock_us, e.clock_us)
    tasks = []
    for p, (a, b) in enumerate(zip(s.partitions, e.partitions, strict=True)):
        tasks.append(
            ReadTask(
                partition=p,
                prev=a.to_dict(),
                end=b.next,
                clock_before=s.clock_us,
                clock_after=e.clock_us,
                bound=bound if p == 0 else None,
            )
        )
    return tasks


@dataclass
class ReadTask:
    """What an executor needs to replay one partition's part of a step (picklable)."""

    partition: int
    prev: dict[str, Any]
    end: int
    clock_before: int | None
    clock_after: int | None
    bound: int | None


def _timestamps(values_us: np.ndarray) -> pa.Array:
    return pa.array(values_us, type=pa.int64()).view(TS_TYPE)


def _emit_rows(table: pa.Table, c: Classified) -> pa.Table:
    idx = c.emit
    n = len(idx)
    if n and int(idx[-1]) - int(idx[0]) + 1 == n and bool(np.all(np.diff(idx) > 0)):
        return table.slice(int(idx[0]), n)  # in order and contiguous: zero copy
    return table.take(pa.array(idx, type=pa.int64()))


def read_task(cfg: ReaderConfig, task: ReadTask, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Replay one partition's step and yield what it emits, as batches of ``schema``."""
    stream = open_storage(cfg.location)
    prev = PartitionState.from_dict(task.prev)
    payload = [f.name for f in stream.meta.payload_schema]
    where = where_of(cfg, task.partition)
    if task.end > prev.scan:
        table = stream.read(task.partition, prev.scan, task.end)
        t, b = record_times(table, cfg, task.partition, prev.scan)
        pieces = classify_pieces(cfg.policy, prev, t, b, task.clock_before, task.clock_after, where)
        for first, c in pieces:
            window = table.slice(first - prev.scan, c.state.next - first)
            if cfg.output == "discarded":
                yield from _discarded_batches(window, c, task.partition, first, payload, schema)
            elif len(c.emit):
                rows = _emit_rows(window, c).select(payload)
                arrays = [*rows.columns, _timestamps(c.emit_rowtime_us)]
                arrays.append(pa.array(np.zeros(len(c.emit), dtype=bool)))
                out = pa.Table.from_arrays(arrays, schema=schema)
                yield from out.to_batches(max_chunksize=BATCH_ROWS)
    if task.bound is not None and cfg.output == "rows":
        arrays = [pa.nulls(1, type=f.type) for f in schema][:-2]
        arrays += [_timestamps(np.array([task.bound], dtype=np.int64)), pa.array([True])]
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)


def _discarded_batches(
    table: pa.Table,
    c: Classified,
    partition: int,
    first: int,
    payload: list[str],
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    if not len(c.discarded):
        return
    idx = pa.array(c.discarded, type=pa.int64())
    rows = table.take(idx)
    arrays = [*rows.select(payload).columns, _timestamps(c.discarded_rowtime_us)]
    arrays += [
        pa.array(np.full(len(idx), partition, dtype=np.int32)),
        pa.array(c.discarded + first, type=pa.int64()),
        rows.column(LOG_ARRIVAL_US).cast(pa.int64()).combine_chunks().view(TS_TYPE),
        pa.array(c.discarded_reason, type=pa.string()),
        _timestamps(c.discarded_clock_us),
    ]
    yield from pa.Table.from_arrays(arrays, schema=schema).to_batches(max_chunksize=BATCH_ROWS)

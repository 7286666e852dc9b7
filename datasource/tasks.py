"""The reader's task types and the step the driver and the executors share.

A step of ``format("rowtime")`` is planned on the driver (``planner``) and read on the
executors (``executor``); what crosses from one to the other is here: the
``ReadTask`` of each partition (pickled into Spark's plan), the runs of offsets it emits
(``EmitRuns``), the output schema, and the pure functions both sides run over the same
records to decide the same rows (``record_times``, ``classify_pieces``, the late
masks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..bounds.arrays import as_numpy, to_arrow
from ..bounds.errors import InvalidRowtimeError, SchemaError
from ..bounds.policies import (
    AdjustPolicy,
    Classified,
    PartitionState,
    Policy,
    classify,
    scan_partition,
)
from ..streams.columns import (
    LOG_ARRIVAL_US,
    LOG_IS_BOUND,
    LOG_ROWTIME_US,
    LOG_SYSTEM_COLUMNS,
    SPARK_IS_BOUND,
    SPARK_ROWTIME,
)
from .options import ReaderConfig

TS_TYPE = pa.timestamp("us", tz="UTC")
#: Most rows per Arrow record batch handed to Spark, and (``BATCH_BYTES``) most bytes: the
#: smaller of the two. Spark takes large batches as fast as small ones while the reader pays a
#: little per batch, so batches are large (``./dev bench suite`` compares sizes; the figures
#: are on docs/benchmarks.md, "The reader"). The byte cap keeps wide rows from making batches
#: of gigabytes on the JVM side.
BATCH_ROWS = 1 << 20
BATCH_BYTES = 64 << 20
#: Fewest rows per batch, however wide the rows.
MIN_BATCH_ROWS = 1 << 10


def batch_rows(payload: pa.Table) -> int:
    """Rows per batch for rows like ``payload``'s (plus the rowtime and ``is_bound``)."""
    n = payload.num_rows
    if not n:
        return BATCH_ROWS
    width = payload.nbytes / n + 9
    return int(min(BATCH_ROWS, max(MIN_BATCH_ROWS, BATCH_BYTES // width)))


#: New records per piece when the policies run over a step (see ``classify_pieces``).
PIECE_RECORDS = 1 << 18
#: Most runs of consecutive emitted offsets a task carries (16 bytes each). A step whose
#: emitted offsets break into more (many discarded rows, many bounds) is replayed by the
#: executor instead: beyond this, shipping the runs would cost more than rebuilding them.
MAX_EMIT_RUNS = 1 << 16
#: Emitted rows a task reads at once when they go out as they lie (see
#: ``_ordered_batches``).
RUN_CHUNK_RECORDS = 1 << 20
#: Emitted rows a task reads and orders at once (see ``_runs_batches``), more
#: while more rows are held. Small enough that the arrays of the ordering stay in the
#: processor's caches and the allocator reuses their memory, which larger pieces would take
#: fresh from the system each time (what each size costs is on docs/benchmarks.md).
SORT_CHUNK_RECORDS = 1 << 17

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


def stored_times(table: pa.Table | pa.RecordBatch) -> np.ndarray:
    """Each record's stored time: its explicit rowtime, else its arrival (implicit rowtimes),
    as int64 microseconds; a view of the log's buffer where it can be (no rowtime stored, or
    every one stored, in one chunk)."""
    explicit = table.column(LOG_ROWTIME_US)
    if explicit.null_count == len(explicit):  # implicit rowtimes: the arrival is the rowtime
        return as_numpy(table.column(LOG_ARRIVAL_US))
    if explicit.null_count:
        explicit = pc.coalesce(explicit, table.column(LOG_ARRIVAL_US))
    return as_numpy(explicit)


def record_times(
    table: pa.Table, cfg: ReaderConfig, partition: int, first_offset: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each record's time: a data row's rowtime (promoted column, explicit, or arrival) or a
    bound record's bound, as int64 microseconds; and which records are bounds."""
    is_bound = as_numpy(table.column(LOG_IS_BOUND))
    t = stored_times(table)
    if cfg.rowtime_column is None or len(t) == 0:
        return t, is_bound
    column = table.column(cfg.rowtime_column)
    data = np.flatnonzero(~is_bound)
    values = column if len(data) == len(t) else column.take(to_arrow(data))
    what = f"rowtime.column {cfg.rowtime_column!r} of {where_of(cfg, partition)}"
    try:
        promoted = cfg.time_format.read_array(values, what=what)
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
            cfg.time_format.read(value)
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


_NO_OFFSETS = np.empty(0, dtype=np.int64)


def late_offsets(
    st: PartitionState, late: np.ndarray, clock: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The offsets of the rows ``late`` marks among the records from ``st.next`` on, and the
    stream clock each was judged against (what a task needs to replay the step)."""
    i = np.flatnonzero(late)
    return i.astype(np.int64) + st.next, clock[i]


def late_mask(
    st: PartitionState, n: int, late: np.ndarray, clock: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``late``/``clock`` (over the records from ``st.next``) as arrays over a window of ``n``
    records from ``st.scan``, as ``classify`` takes them."""
    i = st.next - st.scan
    mask = np.zeros(n, dtype=bool)
    clocks = np.zeros(n, dtype=np.int64)
    k = min(n - i, len(late))
    mask[i : i + k] = late[:k]
    clocks[i : i + k] = clock[:k]
    return mask, clocks


def mask_of_offsets(
    st: PartitionState, n: int, offsets: np.ndarray, clocks: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``late_mask`` from offsets and clocks (as ``late_offsets`` gives them)."""
    mask = np.zeros(n, dtype=bool)
    out = np.zeros(n, dtype=np.int64)
    i = np.asarray(offsets, dtype=np.int64) - st.scan
    ok = (i >= 0) & (i < n)
    mask[i[ok]] = True
    out[i[ok]] = np.asarray(clocks, dtype=np.int64)[ok]
    return mask, out


def classify_pieces(
    policy: Policy,
    prev: PartitionState,
    t: np.ndarray,
    is_bound: np.ndarray,
    clock_before_us: int | None,
    clock_after_us: int | None,
    where: str,
    piece: int = PIECE_RECORDS,
    *,
    order: bool = True,
    idle_late: np.ndarray | None = None,
    idle_clock: np.ndarray | None = None,
) -> Iterator[tuple[int, Classified]]:
    """One partition's step, ``scan_partition`` + ``classify`` over at most ``piece`` new
    records at a time; yields ``(first offset of the piece's window, what it decided)``.

    Why: over a backlog of millions of records, one pass allocates a dozen arrays as large as
    the backlog; pieces keep them in the CPU caches and reuse memory (``bench/reader.py``
    measures it; the figures are on the benchmarks page). The result is the same as one pass: each
    piece resumes from the state the previous one left (its window starts at the first record
    still alive), and later pieces take the stream clock after the step as the clock before,
    since the earlier pieces already emitted every released row up to it. Rows come out in the
    same order: a row released in a later piece is above every row released earlier (the
    ordering argument in ``pyspark_rowtime.bounds.policies``). ``adjust.maxHeld`` is checked
    at the end of the step only, as one pass does. When more rows stay alive than a piece
    (a partition far ahead of the others), the rest is done in one pass, so the work never
    grows beyond one pass's. ``idle_late``/``idle_clock`` (idle.timeout): as ``classify``
    takes them, over the whole window ``t``.
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
        if idle_late is not None:
            assert idle_clock is not None
            c = classify(
                scan,
                before,
                clock_after_us,
                order=order,
                idle_late=idle_late[lo:hi],
                idle_clock=idle_clock[lo:hi],
            )
        else:
            c = classify(scan, before, clock_after_us, order=order)
        yield state.scan, c
        if last:
            return
        state, before = c.state, clock_after_us


@dataclass(frozen=True)
class EmitRuns:
    """The offsets one partition emits in a step, as runs ``[starts[i], ends[i])`` of
    consecutive offsets, ascending and disjoint (the emission order is by rowtime, which the
    executor restores with a stable sort: ties stay in offset order, as ``classify`` has
    them). Picklable; 16 bytes a run."""

    starts: np.ndarray  # int64
    ends: np.ndarray  # int64
    #: The rows at these runs are in rowtime order as they stand, in offset order (the driver
    #: found the step's records in order: ``sorted_step``), so a task that needs
    #: no other time than the stored one emits them as slices (``executor``). False says
    #: nothing: the task restores the order.
    ordered: bool = False

    @classmethod
    def of_mask(cls, emitted: np.ndarray, first: int) -> EmitRuns | None:
        """Runs of the True entries of ``emitted`` (entry ``i`` is offset ``first + i``); None
        when there are more than ``MAX_EMIT_RUNS``."""
        if not len(emitted):
            return cls(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
        edges = np.flatnonzero(emitted[1:] != emitted[:-1]) + 1  # where a run starts or ends
        if emitted[0]:
            edges = np.concatenate([[0], edges])
        if emitted[-1]:
            edges = np.concatenate([edges, [len(emitted)]])
        if len(edges) > 2 * MAX_EMIT_RUNS:
            return None
        return cls(edges[0::2].astype(np.int64) + first, edges[1::2].astype(np.int64) + first)

    @property
    def rows(self) -> int:
        return int(np.sum(self.ends - self.starts))


@dataclass
class ReadTask:
    """What an executor needs to read one partition's part of a step (picklable).

    ``runs``: the offsets the driver decided this task emits; None: replay the policy from
    ``prev``. ``ends_now``: replay as if an end-of-stream bound followed record ``end - 1`` (a
    batch read of everything written so far): the policy releases every row it holds."""

    partition: int
    prev: dict[str, Any]
    end: int
    clock_before: int | None
    clock_after: int | None
    bound: int | None
    ends_now: bool = False
    runs: EmitRuns | None = None
    #: idle.timeout: offsets of the step's rows late after idleness, and the stream clock
    #: each was judged against (the driver's decision: a task sees one partition only)
    late: tuple[np.ndarray, np.ndarray] | None = None

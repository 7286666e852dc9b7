"""The reader's executor side: one ``ReadTask`` as Arrow record batches.

An executor reads only the records of its task, sorts them by rowtime when they are out of
order, and emits them; with no runs from the driver it replays the policy from the task's
start state instead (``read_task``). Both give the same rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..bounds.arrays import to_arrow
from ..bounds.bounds import END_OF_STREAM_US
from ..bounds.policies import (
    NO_TIME,
    Classified,
    PartitionState,
    truncate_array_us,
)
from ..streams.columns import LOG_ARRIVAL_US, LOG_ROWTIME_US
from ..streams.storage import StreamStorage, open_stream
from .options import ReaderConfig
from .tasks import (
    _NO_OFFSETS,
    RUN_CHUNK_RECORDS,
    SORT_CHUNK_RECORDS,
    TS_TYPE,
    EmitRuns,
    ReadTask,
    batch_rows,
    classify_pieces,
    mask_of_offsets,
    record_times,
    where_of,
)


def _timestamps(values_us: np.ndarray) -> pa.Array:
    return to_arrow(values_us, pa.int64()).view(TS_TYPE)


def _emit_rows(table: pa.Table, c: Classified) -> pa.Table:
    idx = c.emit
    n = len(idx)
    if n and int(idx[-1]) - int(idx[0]) + 1 == n and bool(np.all(np.diff(idx) > 0)):
        return table.slice(int(idx[0]), n)  # in order and contiguous: zero copy
    return table.take(to_arrow(idx, pa.int64()))


def read_task(
    cfg: ReaderConfig, task: ReadTask, schema: pa.Schema, stream: StreamStorage | None = None
) -> Iterator[pa.RecordBatch]:
    """Replay one partition's step and yield what it emits, as batches of ``schema``; from the
    stream at ``cfg.location``, or from ``stream`` (a table's versions: ``datasource.tables``)."""
    stream = stream if stream is not None else open_stream(cfg.location)
    prev = PartitionState.from_dict(task.prev)
    # the payload columns ``schema`` keeps (a user-given schema may leave some out)
    payload = [n for n in stream.meta.payload_schema.names if n in schema.names]
    where = where_of(cfg, task.partition)
    if task.runs is not None and cfg.output == "rows":
        yield from _runs_batches(cfg, task.partition, task.runs, stream, payload, schema)
    elif task.end > prev.scan:
        table = stream.read(task.partition, prev.scan, task.end)
        t, b = record_times(table, cfg, task.partition, prev.scan)
        if task.ends_now:  # a virtual end of stream after the last record; never emitted
            t = np.append(t, np.int64(END_OF_STREAM_US))
            b = np.append(b, True)
        idle_late = idle_clock = None
        if cfg.idle_timeout_us is not None:
            offsets, clocks = task.late if task.late is not None else (_NO_OFFSETS, _NO_OFFSETS)
            idle_late, idle_clock = mask_of_offsets(prev, len(t), offsets, clocks)
        pieces = classify_pieces(
            cfg.policy,
            prev,
            t,
            b,
            task.clock_before,
            task.clock_after,
            where,
            idle_late=idle_late,
            idle_clock=idle_clock,
        )
        for first, c in pieces:
            window = table.slice(first - prev.scan, c.state.next - first)
            if cfg.output == "discarded":
                yield from _discarded_batches(window, c, task.partition, first, payload, schema)
            elif len(c.emit):
                rows = _emit_rows(window, c).select(payload)
                arrays = [*rows.columns, _timestamps(c.emit_rowtime_us)]
                arrays.append(to_arrow(np.zeros(len(c.emit), dtype=bool)))
                out = pa.Table.from_arrays(arrays, schema=schema)
                yield from out.to_batches(max_chunksize=batch_rows(rows))
    if task.bound is not None and cfg.output == "rows":
        arrays = [pa.nulls(1, type=f.type) for f in schema][:-2]
        arrays += [_timestamps(np.array([task.bound], dtype=np.int64)), to_arrow([True])]
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)


def _run_chunks(runs: EmitRuns, size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``runs`` cut into consecutive pieces of at most ``size`` rows: (starts, ends) each."""
    cum = np.cumsum(runs.ends - runs.starts)
    n = int(cum[-1])
    for a in range(0, n, size):
        yield _run_piece(runs, cum, a, min(n, a + size))


def _run_piece(runs: EmitRuns, cum: np.ndarray, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``[a, b)`` of ``runs`` (counted over the runs one after the other; ``cum``: the
    runs' lengths summed) as runs: (starts, ends)."""
    starts, ends = runs.starts, runs.ends
    i = int(np.searchsorted(cum, a, side="right"))  # the run holding row a
    j = int(np.searchsorted(cum, b, side="left"))  # the run holding row b - 1
    s, e = starts[i : j + 1].copy(), ends[i : j + 1].copy()
    s[0] = ends[i] - (int(cum[i]) - a)
    e[-1] = ends[j] - (int(cum[j]) - b)
    return s, e


def _ramp(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Every offset of the runs ``[starts[i], ends[i])``, in order."""
    lengths = ends - starts
    n = int(lengths.sum())
    return np.arange(n, dtype=np.int64) + np.repeat(
        starts - (np.cumsum(lengths) - lengths), lengths
    )


def _ordered_batches(
    read: Callable[[int, int], pa.Table], runs: EmitRuns, payload: list[str], schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """``_runs_batches`` when the driver found the rows in rowtime order as they stand
    (``runs.ordered``) and their rowtime is the stored one (no ``adjust.unit`` to truncate to,
    no ``rowtime.column`` to convert): offset order is then the emission order, so the rows go
    out as slices of what ``read(lo, hi)`` gives, with the stored rowtimes as their column, and
    no pass over their times. The same rows, in the same order, as restoring the order (a
    property test holds the two together); read ``RUN_CHUNK_RECORDS`` at a time."""
    size = 0
    for starts, ends in _run_chunks(runs, RUN_CHUNK_RECORDS):
        lo, hi = int(starts[0]), int(ends[-1])
        table = read(lo, hi)
        if len(starts) > 1:  # the bound records between runs stay out
            pieces = zip(starts.tolist(), ends.tolist(), strict=True)
            table = pa.concat_tables([table.slice(a - lo, b - a) for a, b in pieces])
        rowtime = table.column(LOG_ROWTIME_US)
        if rowtime.null_count:  # implicit rowtimes: the arrival is the rowtime
            rowtime = pc.coalesce(rowtime, table.column(LOG_ARRIVAL_US))
        rowtime = pa.chunked_array([c.view(TS_TYPE) for c in rowtime.chunks], type=TS_TYPE)
        rows = table.select(payload)
        size = size or batch_rows(rows)
        false = to_arrow(np.zeros(table.num_rows, dtype=bool))
        out = pa.Table.from_arrays([*rows.columns, rowtime, false], schema=schema)
        yield from out.to_batches(max_chunksize=size)


def _runs_batches(
    cfg: ReaderConfig,
    partition: int,
    runs: EmitRuns,
    stream: StreamStorage,
    payload: list[str],
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    """The rows at ``runs`` in emission order: by (truncated) rowtime, ties by offset.

    The runs are read ``SORT_CHUNK_RECORDS`` rows at a time, or as many as are held when
    more (so that a piece's work stays in proportion to the rows it reads), so a task's memory
    follows that and the rows ``adjust`` reorders, not the length of the step. Why a chunk's
    rows can go out before the next chunk is read: every row emitted at a later offset is at or
    above the partition clock there (it was not discarded), the clock never goes back, and it is
    at least the reference time minus ``adjust.range``, the reference time being the largest
    rowtime so far; so rows below ``largest so far - range`` are below every later row.
    """
    if not runs.rows:
        return
    if runs.ordered and cfg.policy.unit_us == 1 and cfg.rowtime_column is None:
        yield from _ordered_batches(partial(stream.read, partition), runs, payload, schema)
        return
    unit, slack = cfg.policy.unit_us, cfg.policy.range_us
    held_off = np.empty(0, dtype=np.int64)  # rows read, not yet emitted: offsets, rowtimes
    held_t = np.empty(0, dtype=np.int64)
    spans: list[tuple[int, int, pa.Table]] = []  # tables read: [lo, hi) of the partition
    top = NO_TIME
    false: pa.Array | None = None
    cum = np.cumsum(runs.ends - runs.starts)
    total, a = int(cum[-1]), 0
    while a < total:
        b = min(total, a + max(SORT_CHUNK_RECORDS, len(held_off)))
        starts, ends = _run_piece(runs, cum, a, b)
        more, a = b < total, b
        lo, hi = int(starts[0]), int(ends[-1])
        # While rows are held the spans stay adjacent (read from where the last one ended), so
        # that their concatenation is indexed by offset.
        first = spans[-1][1] if spans else lo
        table = stream.read(partition, first, hi)
        spans.append((first, hi, table.select(payload)))
        if false is None:  # the batch size, from the first rows read
            size = batch_rows(spans[-1][2])
            false = to_arrow(np.zeros(size, dtype=bool))
        t, _ = record_times(table, cfg, partition, first)
        if len(starts) == 1 and first == lo:
            off = np.arange(lo, hi, dtype=np.int64)
        else:
            off = _ramp(starts, ends)
            t = t[off - first]
        t = truncate_array_us(t, unit)
        top = max(top, int(t.max()))
        if len(held_off):
            off, t = np.concatenate([held_off, off]), np.concatenate([held_t, t])
            held_off, held_t = held_off[:0], held_t[:0]
        in_order = len(t) < 2 or bool(np.all(t[1:] >= t[:-1]))
        if more:
            line = max(top - slack, NO_TIME)
            if in_order:  # the rows below the line are a prefix: views, no copies
                cut = int(np.searchsorted(t, line, side="left"))
                held_off, held_t = off[cut:], t[cut:]
                off, t = off[:cut], t[:cut]
            else:
                ready = t < line
                held_off, held_t = off[~ready], t[~ready]
                off, t = off[ready], t[ready]
        if not in_order:
            order = np.argsort(t, kind="stable")
            off, t = off[order], t[order]
        assert false is not None
        if len(off):
            # in order, the offsets ascend (held rows come before the chunk's own)
            yield from _emit_batches(spans, off, t, schema, false, ascending=in_order)
        keep = int(held_off.min()) if len(held_off) else hi
        spans = [sp for sp in spans if sp[1] > keep]


def _emit_batches(
    spans: list[tuple[int, int, pa.Table]],
    off: np.ndarray,
    t: np.ndarray,
    schema: pa.Schema,
    false: pa.Array,
    *,
    ascending: bool,
) -> Iterator[pa.RecordBatch]:
    """The payload rows at offsets ``off`` (rowtimes ``t``) as batches of ``schema``, from the
    ``spans`` read (ascending, adjacent) that hold them. ``ascending``: ``off`` ascends, so a
    batch is consecutive offsets when its ends are."""
    base = spans[0][0]
    rows = spans[0][2] if len(spans) == 1 else pa.concat_tables([sp[2] for sp in spans])
    n, size = len(off), len(false)
    for a in range(0, n, size):
        b = min(n, a + size)
        i = off[a:b] - base
        first, last = int(i[0]), int(i[-1])
        if ascending and last - first + 1 == b - a:
            part = rows.slice(first, b - a)  # consecutive offsets: zero copy
        else:
            # Take from the span the batch's rows lie in: rows come nearly in offset order,
            # so it is short, and a take over the whole chunked table would first
            # concatenate every chunk of it.
            first, last = int(i.min()), int(i.max())
            span = rows.slice(first, last - first + 1)
            part = span.take(to_arrow(i - first, pa.int64()))
        arrays = [*part.columns, _timestamps(t[a:b]), false.slice(0, b - a)]
        yield from pa.Table.from_arrays(arrays, schema=schema).to_batches()


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
    idx = to_arrow(c.discarded, pa.int64())
    rows = table.take(idx)
    arrays = [*rows.select(payload).columns, _timestamps(c.discarded_rowtime_us)]
    arrays += [
        to_arrow(np.full(len(idx), partition, dtype=np.int32)),
        to_arrow(c.discarded + first, pa.int64()),
        rows.column(LOG_ARRIVAL_US).cast(pa.int64()).combine_chunks().view(TS_TYPE),
        pa.array(c.discarded_reason, type=pa.string()),
        _timestamps(c.discarded_clock_us),
    ]
    out = pa.Table.from_arrays(arrays, schema=schema)
    yield from out.to_batches(max_chunksize=batch_rows(rows))

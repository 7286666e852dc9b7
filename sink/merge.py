"""The commit's merge of staged runs into one rowtime order, staged again as runs to link.

Where several write tasks share a partition (the one ordered partition of a stateful query's
results, ``partitions=1``), their staged runs overlap in rowtime and the driver merges them. The
merged rows are staged as runs of their own, in the target's segment format, with footers that
continue the partition from where the batch starts it; the commit then links them as it links
the executors' runs (``sink.stream_target``): no row goes through the log's writer, and so no
row is checked, buffered or copied by it a second time.

**The merge.** Every staged run is in rowtime order (``_Runs._stage``). So a stable merge of
the runs, in the order the plan names them, takes a prefix of each run for each piece of the
output: a piece of ``GATHER_ROWS`` rows is the next rows of a few runs, taken as slices and
interleaved by one gather. Ties keep the order of the runs (the tasks' order, then each task's
runs), as the merge before runs did. The output's runs are written on threads, one a processor
(Arrow's gathers, the checksums' numpy sums and the file writes let go of the GIL): the driver
merges while the executors wait, so it has their cores. Memory: the inputs are memory-mapped
(on a folder) or the bytes a backend returned, plus 16 bytes a row for the merged order.

**Exactly once.** Only the runs' footers depend on the partition (first offset, clock before,
arrival), and the commit holds the partition's lock while it merges: nothing moves the
partition meanwhile. The merged runs are durable before the commit names them in the batch's
intent (``StreamPart.merged``); a crash before that leaves the intent without them, and the
replay merges again (the inputs stay until the batch is wholly applied).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pyarrow as pa

from ..bounds.arrays import as_numpy, take_rows, to_arrow
from ..bounds.bounds import NO_TIME
from ..bounds.errors import CorruptLogError
from ..streams.columns import LOG_ROWTIME_US, LOG_SYSTEM_COLUMNS
from ..streams.segments import WRITE_ROWS, data_run_stats
from ..streams.sink_state import SinkState

__all__ = ["MergedRun", "merge_staged"]

_T = TypeVar("_T")
_R = TypeVar("_R")

#: Rows gathered at a time into the merged order: one record batch of a merged run.
GATHER_ROWS = WRITE_ROWS
#: A merge's rows are split into runs for the processors to write only in runs of at least
#: this many rows (a small part stays one segment).
SPLIT_ROWS = 1 << 20


@dataclass(frozen=True)
class MergedRun:
    """A run of the merge, staged: its handle, rows, and the offset of its first record."""

    staged: str
    rows: int
    first: int


@dataclass(frozen=True)
class _Inputs:
    """The staged runs of one part, opened: each as its payload columns, and their rowtimes."""

    tables: list[pa.Table]
    times: list[np.ndarray]

    @property
    def rows(self) -> int:
        return sum(len(t) for t in self.times)


def _open(state: SinkState, handles: Sequence[str], where: str) -> _Inputs:
    """The staged runs, opened and checked (``open_staged``: a damaged one must not get a
    fresh checksum) on threads, one a run."""

    def one(handle: str) -> tuple[pa.Table, np.ndarray]:
        table = state.open_staged(handle)
        times = as_numpy(table.column(LOG_ROWTIME_US))
        if len(times) > 1 and not bool(np.all(times[1:] >= times[:-1])):
            raise CorruptLogError(
                f"{where}: staged run {handle} is not in rowtime order, as every staged run "
                "is written; was it changed by hand? The batch cannot be finished"
            )
        return table.drop_columns(list(LOG_SYSTEM_COLUMNS)), times

    opened = _on_threads(one, handles)
    return _Inputs([t for t, _ in opened], [rt for _, rt in opened])


def _on_threads(work: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    """``work`` over ``items`` on threads (one a processor), results in order; the first
    error in order is raised."""
    workers = max(1, min(len(items), os.cpu_count() or 1))
    if workers == 1:
        return [work(item) for item in items]
    with concurrent.futures.ThreadPoolExecutor(workers, "rowtime-merge") as pool:
        return list(pool.map(work, items))


def merge_staged(
    state: SinkState,
    batch_id: int,
    handles: Sequence[str],
    file_schema: pa.Schema,
    *,
    first: int,
    clock_before_us: int | None,
    bound_us: int | None,
    arrival_us: int,
    run_rows: int,
    run_bytes: int,
    where: str,
) -> list[MergedRun]:
    """Merge the staged runs ``handles`` into rowtime order and stage the result as runs of at
    most ``run_rows`` rows and about ``run_bytes`` bytes (of at least ``SPLIT_ROWS``, fewer
    so that every processor writes one) that continue a partition from offset ``first`` and
    clock ``clock_before_us``, every record arriving at ``arrival_us``, the last run ending with
    a bound record at ``bound_us`` if not None (so that a small part is one segment, as the
    writer would make it). Each run is durable when this returns. ``where`` names the target in
    errors."""
    inputs = _open(state, handles, where)
    n = inputs.rows
    if n == 0:
        raise CorruptLogError(f"{where}: batch {batch_id}'s staged runs {handles} hold no rows")
    per_row = max(1, sum(t.nbytes for t in inputs.tables) // n)
    share = max(SPLIT_ROWS, -(-n // (os.cpu_count() or 1)))
    per_run = max(1, min(run_rows, run_bytes // per_row, share))
    ranges = _ranges(inputs.times, -(-n // per_run))
    base_clock = NO_TIME if clock_before_us is None else clock_before_us

    def stage_range(j: int) -> list[MergedRun]:
        """The merged rows of rowtime range ``j``, staged as runs of at most ``per_run``."""
        lo_at, hi_at = ranges[j], ranges[j + 1]
        part = _Inputs(
            [
                t.slice(int(a), int(b - a))
                for t, a, b in zip(inputs.tables, lo_at, hi_at, strict=True)
            ],
            [t[a:b] for t, a, b in zip(inputs.times, lo_at, hi_at, strict=True)],
        )
        m = part.rows
        offset = int(sum(lo_at))  # merged rows before the range: those below its rowtimes
        before = base_clock
        for t, a in zip(inputs.times, lo_at, strict=True):
            if a:
                before = max(before, int(t[a - 1]))
        rt = np.concatenate(part.times)
        starts = np.cumsum([0] + [len(t) for t in part.times[:-1]])
        # Timsort finds the sorted runs and merges them: linear in the rows for a few runs.
        order = np.argsort(rt, kind="stable")
        merged_rt = rt[order]
        sizes = [len(t) for t in part.times]
        run_of = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)[order]
        taken = np.zeros(len(sizes), dtype=np.int64)
        out = []
        for lo in range(0, m, per_run):
            hi = min(m, lo + per_run)
            stats = data_run_stats(
                first + offset + lo,
                hi - lo,
                min_rowtime_us=int(merged_rt[lo]),
                max_rowtime_us=int(merged_rt[hi - 1]),
                last_rowtime_us=int(merged_rt[hi - 1]),
                arrival_us=arrival_us,
                clock_before_us=before,
            )
            before = stats.clock_us
            bound = bound_us if offset + hi == n else None
            if bound is not None:
                stats = dataclasses.replace(
                    stats, count=stats.count + 1, bounds=1, last_bound_us=bound,
                    clock_us=max(stats.clock_us, bound),
                )  # fmt: skip
            pieces = _pieces(part, order, run_of, starts, merged_rt, lo, hi, taken)
            chunks = _segment_batches(pieces, file_schema, arrival_us, bound)
            name = f"merged-{offset + lo:012d}-{uuid.uuid4().hex[:12]}.arrow"
            handle, durable = state.stage_segment(batch_id, name, stats, file_schema, chunks)
            durable()
            out.append(MergedRun(handle, stats.count, first + offset + lo))
            taken += np.bincount(run_of[lo:hi], minlength=len(sizes))
        return out

    # Each range merged and written on a thread of its own. A run staged before an error is
    # not named by the intent: nothing links it, and it goes with the batch's staging.
    return [r for runs in _on_threads(stage_range, range(len(ranges) - 1)) for r in runs]


def _ranges(times: Sequence[np.ndarray], count: int) -> list[np.ndarray]:
    """Where ``count`` ranges of rowtime, of about as many rows each, start in each input
    (sorted ``times``), and the inputs' ends: a list of ``count + 1`` or fewer arrays of one
    index an input. A range takes every row of every input from its start to the next one's,
    so that ranges merged apart, one after the other, are the whole merged in order: rows of
    one rowtime are all in one range, ties in the inputs' order."""
    ends = np.array([len(t) for t in times], dtype=np.int64)
    n = int(ends.sum())
    if count <= 1 or n == 0:
        return [np.zeros(len(times), dtype=np.int64), ends]
    stride = max(1, n // (64 * count))  # a sample of the rowtimes, sorted, gives the cuts
    sample = np.sort(np.concatenate([t[::stride] for t in times]))
    cuts = np.unique(sample[(np.arange(1, count) * len(sample)) // count])
    at = [np.zeros(len(times), dtype=np.int64)]
    for c in cuts:
        here = np.array([np.searchsorted(t, c, side="left") for t in times], dtype=np.int64)
        if int(here.sum()) > int(at[-1].sum()):
            at.append(here)
    if int(at[-1].sum()) < n:
        at.append(ends)
    return at


def _pieces(
    inputs: _Inputs,
    order: np.ndarray,
    run_of: np.ndarray,
    starts: np.ndarray,
    merged_rt: np.ndarray,
    lo: int,
    hi: int,
    taken: np.ndarray,
) -> Iterator[tuple[pa.Table, np.ndarray]]:
    """The merged rows ``[lo, hi)`` as payload tables of up to ``GATHER_ROWS`` rows, with their
    rowtimes; ``taken`` says how many rows of each input the merged rows before ``lo`` hold
    (left as it is)."""
    runs = len(inputs.tables)
    taken = taken.copy()
    for s in range(lo, hi, GATHER_ROWS):
        e = min(hi, s + GATHER_ROWS)
        idx, run = order[s:e], run_of[s:e]
        counts = np.bincount(run, minlength=runs)
        # A stable merge of sorted runs takes a prefix of each: this piece holds the next
        # counts[i] rows of input i, a slice of it.
        parts = [i for i in range(runs) if counts[i]]
        base = np.zeros(runs, dtype=np.int64)
        base[parts] = np.cumsum([0] + [int(counts[i]) for i in parts[:-1]])
        local = idx - starts[run] - taken[run] + base[run]
        table = pa.concat_tables(
            [inputs.tables[i].slice(int(taken[i]), int(counts[i])) for i in parts]
        )
        if len(parts) > 1:
            table = take_rows(table, to_arrow(local))
        taken += counts
        yield table, merged_rt[s:e]


def _segment_batches(
    pieces: Iterator[tuple[pa.Table, np.ndarray]],
    file_schema: pa.Schema,
    arrival_us: int,
    bound_us: int | None,
) -> Iterator[pa.RecordBatch]:
    """Record batches of the segment format from payload pieces and their rowtimes (the
    arrival and ``is_bound`` columns are the same block for every batch), then a bound record
    at ``bound_us`` if not None."""
    payload = list(file_schema)[len(LOG_SYSTEM_COLUMNS) :]
    arrival = to_arrow(np.full(GATHER_ROWS, arrival_us, dtype=np.int64))
    no_bound = to_arrow(np.zeros(GATHER_ROWS, dtype=np.bool_))
    for table, times in pieces:
        table = table.combine_chunks()
        m = table.num_rows
        arrays = [arrival.slice(0, m), to_arrow(times), no_bound.slice(0, m)]
        for f in payload:
            column = table.column(f.name)
            arrays.append(column.chunk(0) if column.num_chunks else pa.array([], f.type))
        yield pa.RecordBatch.from_arrays(arrays, schema=file_schema)
    if bound_us is not None:
        arrays = [
            to_arrow(np.array([arrival_us], dtype=np.int64)),
            to_arrow(np.array([bound_us], dtype=np.int64)),
            to_arrow(np.ones(1, dtype=np.bool_)),
        ]
        arrays += [pa.nulls(1, f.type) for f in payload]
        yield pa.RecordBatch.from_arrays(arrays, schema=file_schema)

"""Validity intervals in the reader: the ``rowtime_end`` column (SPEC 10, seed 001).

Odysseus gives every row a validity ``[rowtime, rowtime_end)``; window operators set the end.
The reader sets it with one of two options (``options``):

* ``interval.duration`` (time based): ``rowtime_end = rowtime + duration``, capped at the end of
  stream (``INFINITY_US``). Computed per emitted row.
  With ``interval.slide`` the window moves in steps (Odysseus' advance, its
  ``calcSlidingDeltaWindowEnd``): ``rowtime_end = floor(rowtime / slide) * slide + duration``.
* ``interval.count = N`` (element based): ``rowtime_end`` is the rowtime of the N-th later row of
  the same partition, in the partition's emission order (the rows the policy keeps; discarded
  rows are not rows of the stream). Ties give ``rowtime_end == rowtime``: an empty interval,
  superseded at the instant it became valid, which overlaps nothing.

**How a row waits for its N-th successor, in order.** Only ``order=reject`` and ``order=drop``
are accepted with ``interval.count``: under them a partition's kept rows come out in offset
order, so "the N-th later row" is the N-th later kept record, final as soon as it is written.
The driver hides from the planner every record of a partition from its first row whose N-th
successor is not yet written (``hold_from``): those rows, the later rows and the bound
records after them are planned as if not yet written, so the partition clock (and with it the
stream clock) stays at or below the held row, and no row of any partition and no bound record
overtakes it. Only the **end of stream** settles a row without successor (its ``rowtime_end``
is then the end of stream: valid until the stream ends, as Odysseus' infinity). An ordinary
bound cannot settle it: it says the next row comes at or after the bound, not when. So a
partition whose writer goes quiet holds the stream clock at its last N rows until more rows, or
``end_stream()``, arrive.

Executors read ahead (``Successors``): the emitted rows of a task are the first kept rows
from the start state's first alive record, in order, and their successors are the kept records
after them in the log. The log is immutable and the driver planned only rows whose successors
were written, so a replay from the same offsets gives the same ``rowtime_end`` (SPEC 7).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from ..bounds.arrays import as_numpy, to_arrow
from ..bounds.bounds import END_OF_STREAM_US, NO_TIME
from ..bounds.errors import RowtimeError, SchemaError
from ..bounds.intervals import INFINITY_US, sliding_window_ends
from ..bounds.policies import PartitionState
from ..streams.columns import SPARK_IS_BOUND, SPARK_ROWTIME
from ..streams.storage import StreamStorage, open_stream
from .executor import read_task
from .options import ReaderConfig
from .tasks import TS_TYPE, ReadTask, record_times, time_columns

#: The column the interval options add, after ``rowtime``.
ROWTIME_END = "rowtime_end"
#: Records an executor reads ahead at first when it looks for successors; doubled as needed.
READ_AHEAD = 1 << 12


def with_rowtime_end(schema: pa.Schema) -> pa.Schema:
    """``schema`` (the reader's output) with ``rowtime_end`` inserted after ``rowtime``."""
    clash = [f.name for f in schema if f.name.lower() == ROWTIME_END]
    if clash:
        raise SchemaError(
            f"payload column {clash[0]!r} clashes with the column {ROWTIME_END!r} that options "
            "interval.duration / interval.count add; rename the payload column in the stream's "
            "schema"
        )
    i = schema.get_field_index(SPARK_ROWTIME)
    return schema.insert(i + 1, pa.field(ROWTIME_END, TS_TYPE))


def without_rowtime_end(schema: pa.Schema) -> pa.Schema:
    return schema.remove(schema.get_field_index(ROWTIME_END))


def kept_rows(
    t: np.ndarray, is_bound: np.ndarray, clock_us: int | None
) -> tuple[np.ndarray, int | None]:
    """The kept data rows among records under ``reject``/``drop``, and where the stream ends.

    ``t``/``is_bound`` as ``record_times`` gives them; ``clock_us`` is the
    partition clock just before the first record. Under both policies the partition clock is
    the running maximum of every rowtime and bound seen, and a row below it is discarded
    (``reject`` fails the query when it reaches such a row; looking ahead, it is skipped like a
    dropped one). Returns (indexes of the kept rows, index of the end-of-stream bound or None);
    records after an end of stream are ignored.
    """
    t = np.asarray(t, dtype=np.int64)
    is_bound = np.asarray(is_bound, dtype=bool)
    eos = np.flatnonzero(is_bound & (t == END_OF_STREAM_US))
    end = int(eos[0]) if len(eos) else None
    if end is not None:
        t, is_bound = t[:end], is_bound[:end]
    before = np.empty(len(t), dtype=np.int64)
    if len(t):
        before[0] = NO_TIME if clock_us is None else clock_us
        np.maximum.accumulate(t[:-1], out=before[1:])
        np.maximum(before, before[0], out=before)
    return np.flatnonzero(~is_bound & (t >= before)), end


def start_clock(state: PartitionState) -> int | None:
    """The partition clock just before ``state.scan`` under ``reject``/``drop``."""
    known = [v for v in (state.scan_ref_us, state.scan_bound_us) if v is not None]
    return max(known) if known else None


def hold_from(state: PartitionState, t: np.ndarray, is_bound: np.ndarray, n: int) -> int:
    """The first offset the planner must not see yet under ``interval.count = n``.

    ``t``/``is_bound``: every record written from ``state.scan`` on. That is the first of the
    last ``n`` kept rows (their ``n``-th successor is not written yet), or the end of the
    records when none must wait (an end of stream settles every row). Never below
    ``state.next``: records before it were planned when their successors were already written.
    """
    kept, eos = kept_rows(t, is_bound, start_clock(state))
    if eos is not None or not len(kept):
        first = len(t)
    else:
        first = int(kept[max(0, len(kept) - n)])
    return max(state.next, state.scan + first)


class Successors:
    """One partition's kept rowtimes from a task's first alive record on, read as needed.

    Row ``i`` emitted by the task (counting data rows from 0) is kept row ``i``; its
    ``rowtime_end`` is kept row ``i + n``'s rowtime, or the end of stream when the stream ends
    before it.
    """

    def __init__(self, cfg: ReaderConfig, task: ReadTask, stream: StreamStorage) -> None:
        self.cfg, self.task, self.stream = cfg, task, stream
        prev = PartitionState.from_dict(task.prev)
        self.pos = prev.scan
        self.clock = start_clock(prev)
        self.rowtimes = np.empty(0, dtype=np.int64)
        self.ended = False
        # A batch read of what is written (ends_now) ends the stream after its last record.
        self.limit = task.end if task.ends_now else None
        self.step = max(READ_AHEAD, task.end - prev.scan + READ_AHEAD)

    def _read_more(self) -> None:
        last = self.limit if self.limit is not None else self.stream.end_offset(self.task.partition)
        if self.pos >= last:
            if self.limit is not None:
                self.ended = True
                return
            raise RowtimeError(
                f"stream {self.cfg.location!r} partition {self.task.partition}: the log ends at "
                f"offset {last}, before the successors the driver saw when it planned this "
                "micro-batch (option interval.count); the log was changed under the query"
            )
        hi = min(last, self.pos + self.step)
        self.step *= 2
        table = self.stream.read(self.task.partition, self.pos, hi, columns=time_columns(self.cfg))
        t, b = record_times(table, self.cfg, self.task.partition, self.pos)
        kept, eos = kept_rows(t, b, self.clock)
        self.rowtimes = np.concatenate([self.rowtimes, t[kept]])
        if eos is not None:
            self.ended = True
            return
        if len(t):
            top = int(np.max(t))
            self.clock = top if self.clock is None else max(self.clock, top)
        self.pos = hi

    def ends(self, first: int, count: int) -> np.ndarray:
        """``rowtime_end`` of emitted rows ``first .. first + count - 1``."""
        if count == 0:  # a batch of bound records only: no successor to look for
            return np.empty(0, dtype=np.int64)
        n = int(self.cfg.interval_count or 0)
        need = first + count + n
        while len(self.rowtimes) < need and not self.ended:
            self._read_more()
        out = np.full(count, INFINITY_US, dtype=np.int64)
        have = self.rowtimes[first + n : need]
        out[: len(have)] = have
        return out


def read_task_with_intervals(
    cfg: ReaderConfig, task: ReadTask, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """``read_task`` with the ``rowtime_end`` column ``schema`` has (bound
    records: null)."""
    base = without_rowtime_end(schema)
    at = schema.get_field_index(ROWTIME_END)
    successors = None
    if cfg.interval_count is not None:
        successors = Successors(cfg, task, open_stream(cfg.location))
    emitted = 0
    for batch in read_task(cfg, task, base):
        bound = as_numpy(batch.column(SPARK_IS_BOUND))
        data = np.flatnonzero(~bound)
        start = as_numpy(batch.column(SPARK_ROWTIME).cast(pa.int64()))
        end = np.zeros(len(bound), dtype=np.int64)
        if successors is not None:
            end[data] = successors.ends(emitted, len(data))
        else:
            end[data] = sliding_window_ends(
                start[data], int(cfg.interval_duration_us or 0), cfg.interval_slide_us or 1
            )
        emitted += len(data)
        column = to_arrow(end, pa.int64(), mask=bound).view(TS_TYPE)
        arrays = batch.columns
        arrays.insert(at, column)
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)

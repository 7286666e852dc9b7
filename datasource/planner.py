"""The reader's driver side: from a start offset and the log to an end offset and tasks.

``latestOffset`` reads only the rowtime columns of new records, runs each partition's policy
and the alignment across partitions (``pyspark_rowtime.bounds.plan``) and writes everything
it decided into the end offset (``Planner``); ``partitions()`` turns a step into
``ReadTask`` s (``partition_tasks``, ``batch_tasks`` for a batch read).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from ..bounds.arrays import as_numpy, each_on_threads
from ..bounds.bounds import END_OF_STREAM_US
from ..bounds.errors import HeldRowsOverflowError, LateRowError
from ..bounds.plan import (
    IdleStep,
    StreamPosition,
    bound_to_emit,
    choose_ends,
    idle_partitions,
    idle_step,
)
from ..bounds.policies import (
    NO_TIME,
    PartitionState,
    RejectPolicy,
)
from ..bounds.time import format_rowtime
from ..streams.columns import LOG_ARRIVAL_US, LOG_IS_BOUND
from ..streams.retention import DataLossError
from ..streams.storage import StreamStorage, open_stream
from ..streams.writer import wall_clock_us
from .intervals import hold_from
from .options import ReaderConfig
from .ordered import (
    _FEW_BOUNDS,
    LateScan,
    OrderedTimes,
    TimesPiece,
    _ascending,
    as_arrays,
    clock_at_end,
    late_decide,
    late_scan,
    merge_clocks,
    ordered_clock_at_end,
    ordered_step,
    sorted_step,
)
from .retention import earliest_position
from .tasks import (
    _NO_OFFSETS,
    MAX_EMIT_RUNS,
    EmitRuns,
    ReadTask,
    classify_pieces,
    late_mask,
    late_offsets,
    record_times,
    stored_times,
    time_columns,
    where_of,
)

_T = TypeVar("_T")


@dataclass
class _Window:
    first: int
    t: np.ndarray
    is_bound: np.ndarray
    #: the records' arrival times, kept only by readers with idle.timeout
    arrival: np.ndarray | None = None

    @property
    def end(self) -> int:
        return self.first + len(self.t)

    def view(self, start: int, end: int | None = None) -> _Window:
        lo = start - self.first
        hi = len(self.t) if end is None else end - self.first
        a = None if self.arrival is None else self.arrival[lo:hi]
        return _Window(start, self.t[lo:hi], self.is_bound[lo:hi], a)


class Planner:
    """The driver's side: turns a start offset and the log into an end offset.

    It keeps, per partition, the rowtimes of the records still alive, so each micro-batch reads
    only the new records' time columns; after a restart the cache starts empty and is rebuilt
    from the offset (the result is the same, only slower once).
    """

    def __init__(self, cfg: ReaderConfig, stream: StreamStorage | None = None) -> None:
        self.cfg = cfg
        #: the stream at ``cfg.location``, opened when first needed; or the records of another
        #: source given here (a table's versions: ``datasource.tables``)
        self._stream: StreamStorage | None = stream
        self._cache: dict[int, _Window] = {}
        #: Time columns an ordered step read and found out of order, for the general path to
        #: take rather than read again (an object store would fetch them twice): partition ->
        #: (start, end, table). Emptied by every plan.
        self._tried: dict[int, tuple[int, int, pa.Table]] = {}
        #: The last step planned: (start, end) offsets as dicts, and each partition's runs.
        self._last: tuple[dict[str, Any], dict[str, Any], list[EmitRuns | None]] | None = None
        #: The same step's rows late after idleness (idle.timeout): offsets and clocks.
        self._late: (
            tuple[dict[str, Any], dict[str, Any], list[tuple[np.ndarray, np.ndarray]]] | None
        ) = None

    @property
    def last_position(self) -> StreamPosition | None:
        """The end of the last step this planner planned (None before any)."""
        return None if self._last is None else StreamPosition.from_dict(self._last[1])

    def runs_for(self, start: dict[str, Any], end: dict[str, Any]) -> list[EmitRuns | None] | None:
        """The emitted runs of the step ``start`` -> ``end`` if this planner planned it last.

        Compared as positions: Spark's offsets carry more than the position (the stream's id),
        and a step whose runs are not found makes every task replay the policy."""
        if self._last is None:
            return None
        same = (
            StreamPosition.from_dict(start).to_dict() == self._last[0]
            and StreamPosition.from_dict(end).to_dict() == self._last[1]
        )
        return self._last[2] if same else None

    @property
    def stream(self) -> StreamStorage:
        if self._stream is None:
            self._stream = open_stream(self.cfg.location)
        return self._stream

    def available(self) -> list[int]:
        s = self.stream
        return [s.end_offset(p) for p in range(s.meta.partitions)]

    def window(self, partition: int, start: int, end: int) -> _Window:
        cached = self._cache.get(partition)
        if cached is not None and cached.first <= start <= end <= cached.end:
            # Read further already (interval.count looks ahead of the step): a view, and the
            # cache keeps what lies beyond.
            return cached.view(start, end)
        if cached is not None and cached.first <= start <= cached.end <= end:
            w = cached.view(start)
            if cached.end < end:
                more = self._read(partition, cached.end, end)
                arrival = None
                if w.arrival is not None and more.arrival is not None:
                    arrival = np.concatenate([w.arrival, more.arrival])
                w = _Window(
                    start,
                    np.concatenate([w.t, more.t]),
                    np.concatenate([w.is_bound, more.is_bound]),
                    arrival,
                )
        else:
            w = self._read(partition, start, end)
        self._cache[partition] = w
        return w

    def _read(self, partition: int, start: int, end: int) -> _Window:
        tried = self._tried.pop(partition, None)
        if tried is not None and tried[0] <= start and tried[1] == end:
            table = tried[2].slice(start - tried[0])
        else:
            table = self.stream.read(partition, start, end, columns=time_columns(self.cfg))
        t, b = record_times(table, self.cfg, partition, start)
        arrival = None
        if self.cfg.idle_timeout_us is not None:
            arrival = as_numpy(table.column(LOG_ARRIVAL_US))
        return _Window(start, t, b, arrival)

    def plan(
        self,
        pos: StreamPosition,
        available: Sequence[int],
        max_rows: int | None,
        whole: bool = False,
    ) -> StreamPosition | None:
        """The next position, or None when there is nothing new to read. ``whole``: a batch
        read, which takes every record written now (with idle.timeout it waits for the newest
        to settle rather than leave them to a next step; see ``settled``).

        The same position as ``pyspark_rowtime.bounds.plan.step`` over the whole step, but
        computed piece by piece (``classify_pieces``)."""
        if self.cfg.idle_timeout_us is not None:
            return self._plan_idle(pos, available, max_rows, whole)
        ends = choose_ends(pos, available, max_rows)
        if self.cfg.interval_count is not None:
            ends = self._hold_back(pos, ends, available)
        if ends == [p.next for p in pos.partitions]:
            return None
        policy = self.cfg.policy
        if self.cfg.interval_count is None:
            ordered = self._plan_ordered(pos, ends)
            if ordered is not None:
                return ordered
        try:
            windows = [self.window(p, st.scan, ends[p]) for p, st in enumerate(pos.partitions)]
        finally:
            self._tried.clear()
        parts = list(zip(pos.partitions, windows, strict=True))
        wheres = [where_of(self.cfg, p) for p in range(len(parts))]
        clock = merge_clocks(
            [clock_at_end(policy, st, win.t, win.is_bound) for st, win in parts], pos.clock_us
        )

        def decide(
            part: tuple[PartitionState, _Window], where: str
        ) -> tuple[PartitionState, EmitRuns | None]:
            st, win = part
            fast = sorted_step(policy, st, win.t, win.is_bound, pos.clock_us, clock)
            if fast is not None:
                return fast
            emitted = np.zeros(len(win.t), dtype=bool)
            last = None
            for first, c in classify_pieces(
                policy, st, win.t, win.is_bound, pos.clock_us, clock, where, order=False
            ):
                emitted[c.emit_set + (first - st.scan)] = True
                last = c
            assert last is not None
            return last.state, EmitRuns.of_mask(emitted, st.scan)

        decided = _each_partition(decide, parts, wheres, sum(len(w.t) for w in windows))
        states = [state for state, _ in decided]
        runs: list[EmitRuns | None] = [r for _, r in decided]
        return self._planned(pos, StreamPosition(clock, states), runs)

    def _planned(
        self, pos: StreamPosition, new: StreamPosition, runs: list[EmitRuns | None]
    ) -> StreamPosition:
        """Keep the step ``pos`` -> ``new`` and its runs (``runs_for``), and only the times
        of the records still alive in the window cache."""
        self._last = (pos.to_dict(), new.to_dict(), runs)
        for p, state in enumerate(new.partitions):
            w = self._cache.get(p)
            if w is not None and w.first <= state.scan:
                self._cache[p] = w.view(state.scan)
        return new

    def _plan_ordered(self, pos: StreamPosition, ends: Sequence[int]) -> StreamPosition | None:
        """``plan`` from the step's times where the log holds them (``_step_times``),
        never joined into one array, when each partition's records ascend (and no
        ``adjust.unit`` truncates them: ``ordered_step``), or, under ``adjust``, when no
        row is discarded (``late_scan``, ``late_decide``); None otherwise, or when
        these leave the decision to the general path.

        Why: in-order data is the common case, and there ``ordered_step`` needs only a
        check of the order and a few binary searches; late rows within ``adjust.range`` are
        the next, and there a few passes a block at a time decide what the general path's
        dozen over the whole step decide. Joining every record's time into one array first
        (the window) writes 9 bytes a record of fresh memory, which costs far more than reading
        the times where they lie, and more still when the system is slow to give memory
        (docs/benchmarks.md). The same position and runs as the general path (a property
        test holds them together). Only without ``rowtime.column``: the times are then the
        stored ones."""
        policy = self.cfg.policy
        if self.cfg.rowtime_column is not None:
            return None
        States = tuple[PartitionState, list[TimesPiece], np.ndarray, LateScan | None, bool]

        def scan(p: int) -> tuple[States, int | None] | None:
            """The partition's times, and its clock after the step (None: the general path)."""
            st = pos.partitions[p]
            got = self._step_times(p, st.scan, ends[p])
            if got is None:
                return None
            pieces, bounds_at, ascending = got
            if ascending and (policy.unit_us == 1 or not pieces):
                clock = ordered_clock_at_end(policy, st, OrderedTimes(pieces), bounds_at)
                return (st, pieces, bounds_at, None, ascending), clock
            if policy.holds:
                late = late_scan(policy, st, as_arrays(pieces), bounds_at)
                if late is not None:
                    return (st, pieces, bounds_at, late, ascending), late.clock_us
            return None

        records = sum(e - st.scan for e, st in zip(ends, pos.partitions, strict=True))
        threaded = records >= PARALLEL_PLAN_RECORDS
        parts = range(len(pos.partitions))
        scanned = each_on_threads(scan, parts, threaded, "rowtime-plan")
        read = [r[0] for r in scanned if r is not None]
        if len(read) < len(scanned):
            return None
        clock = merge_clocks([r[1] for r in scanned if r is not None], pos.clock_us)

        def decide(r: States) -> tuple[PartitionState, EmitRuns | None] | None:
            st, pieces, bounds_at, late, ascending = r
            if not pieces:  # nothing alive, nothing new: the state stays, nothing is emitted
                return st, EmitRuns(np.empty(0, np.int64), np.empty(0, np.int64))
            if late is None:
                return ordered_step(
                    policy, st, OrderedTimes(pieces), bounds_at, pos.clock_us, clock
                )
            step = late_decide(policy, st, as_arrays(pieces), bounds_at, late, pos.clock_us, clock)
            if step is None or step[1] is None or not ascending:
                return step
            # in order with adjust.unit: rows go out as they lie, as sorted_step says
            return step[0], dataclasses.replace(step[1], ordered=True)

        steps = each_on_threads(decide, read, threaded, "rowtime-plan")
        decided = [step for step in steps if step is not None]
        if len(decided) < len(steps):
            return None
        self._tried.clear()
        new = StreamPosition(clock, [state for state, _ in decided])
        return self._planned(pos, new, [runs for _, runs in decided])

    def _step_times(
        self, partition: int, start: int, end: int
    ) -> tuple[list[TimesPiece], np.ndarray, bool] | None:
        """The times of records ``[start, end)`` of ``partition`` as the log holds them (one
        array a record batch, no copy where the log is memory-mapped), the positions of the
        bound records among them, and whether the times ascend; None when bound records are
        many (``_FEW_BOUNDS``). The general path takes what was read (``_read``). A
        record's time is the stored one (``stored_times``), as ``record_times`` says
        without ``rowtime.column``.

        A log that knows its records' times ascend without reading them (a table's versions,
        from their files' statistics: ``ordered_times``) gives them as
        ``RangeTimes``, read only where ``ordered_step`` looks inside; not
        with ``adjust.unit``, whose path (``late_scan``) reads every time."""
        if end <= start:  # nothing alive, nothing new: nothing to read
            return [], np.empty(0, dtype=np.int64), True
        ordered_times = getattr(self.stream, "ordered_times", None)
        if ordered_times is not None and self.cfg.policy.unit_us == 1:
            known = ordered_times(partition, start, end)
            if known is not None:
                return known
        table = self.stream.read(partition, start, end, columns=time_columns(self.cfg))
        self._tried[partition] = (start, end, table)
        pieces: list[TimesPiece] = []
        bounds: list[np.ndarray] = []
        last, at, nbounds, ascending = NO_TIME, 0, 0, True
        for batch in table.to_batches():
            n = batch.num_rows
            if not n:
                continue
            t = stored_times(batch)
            ascending = ascending and int(t[0]) >= last and _ascending(t)
            last = int(t[-1])
            is_bound = batch.column(LOG_IS_BOUND)
            if is_bound.true_count:
                bounds.append(np.flatnonzero(as_numpy(is_bound)) + at)
                nbounds += len(bounds[-1])
                if nbounds > _FEW_BOUNDS:
                    return None
            pieces.append(t)
            at += n
        bounds_at = np.concatenate(bounds) if bounds else np.empty(0, dtype=np.int64)
        return pieces, bounds_at, ascending

    def plan_joined(
        self, pos: StreamPosition, available: Sequence[int], max_rows: int, most: int
    ) -> StreamPosition | None:
        """``plan`` with at most ``max_rows`` new records, continued a further ``max_rows``
        at a time up to ``most`` new records in all: one step over a backlog, planned a cap at
        a time.

        Why: the cap on a step bounds what the planner holds per record while it plans, and
        each further step costs the query a micro-batch (Spark's cycle, the tasks' start;
        docs/benchmarks.md). What a step leaves once planned is small: its end position, its
        emitted runs and the times of the records still alive (the window cache, as between
        micro-batches). And two steps planned one after the other emit what one step over both
        emits: whether a row is discarded follows from running maxima, a released row stays
        released, and the rows of both are emitted up to the second's clock. So the steps are
        joined into one: the same end and the same rows as ``plan`` from ``pos`` to that
        end in one piece (a property test holds the two together), with the memory of one
        cap. ``idle.timeout`` and ``interval.count`` plan across steps and are not joined; a
        step whose runs are too many to ship ends the joining, before it, as does an error
        (a late row under ``reject``, too many rows held), left to fail the next step as it
        would have."""
        new = self.plan(pos, available, max_rows)
        cfg = self.cfg
        if new is None or cfg.idle_timeout_us is not None or cfg.interval_count is not None:
            return new
        assert self._last is not None
        runs = self._last[2]
        while all(r is not None for r in runs):
            pairs = zip(pos.partitions, new.partitions, strict=True)
            room = min(max_rows, most - sum(b.next - a.next for a, b in pairs))
            if room <= 0:
                break
            try:
                more = self.plan(new, available, room)
            except (LateRowError, HeldRowsOverflowError):
                break
            if more is None:
                break
            assert self._last is not None
            joined = [_joined(a, b) for a, b in zip(runs, self._last[2], strict=True)]
            if not all(r is not None for r in joined):
                break  # the next step plans these records again
            runs, new = joined, more
        self._last = (pos.to_dict(), new.to_dict(), runs)
        return new

    # -- idle.timeout (SPEC 12) ---------------------------------------------------------------

    def _with_last(self, p: int, st: PartitionState) -> PartitionState:
        """``st`` with its last arrival: as the offset has it, else the stream's creation
        (no record yet) or the stored arrival of record ``next - 1`` (an offset written
        without idleness)."""
        if st.last_arrival_us is not None:
            return st
        kept = self.stream.start_offset(p)
        if st.next == 0:
            last = self.stream.meta.created_us
        elif st.next - 1 < kept:
            # record next - 1 was removed by retention: its trim keeps that arrival; a trim
            # without it falls back to the first kept record's (a partition then looks active
            # a little longer, never idle too early)
            last = self.stream.trim_state(p).last_arrival_us
            if last is None:
                table = self.stream.read(p, kept, kept + 1, columns=[LOG_ARRIVAL_US])
                last = int(table.column(0)[0].as_py()) if table.num_rows else None
        else:
            table = self.stream.read(p, st.next - 1, st.next, columns=[LOG_ARRIVAL_US])
            last = int(table.column(0)[0].as_py())
        return dataclasses.replace(st, last_arrival_us=last)

    def _arrival_prefix(
        self, pos: StreamPosition, ends: list[int], available: Sequence[int]
    ) -> list[int]:
        """``ends`` cut so that the step holds every record up to an arrival time and none
        after it (idleness is decided in arrival order across partitions). Only needed when a
        partition stops short of what is available (``maxRowsPerBatch``, a large backlog)."""
        short = [p for p, (e, a) in enumerate(zip(ends, available, strict=True)) if e < a]
        if not short:
            return ends
        starts = [st.next for st in pos.partitions]

        def arrivals(p: int, end: int) -> np.ndarray:
            w = self.window(p, pos.partitions[p].scan, end)
            assert w.arrival is not None
            return w.arrival[starts[p] - w.first :]

        # records arriving at or after the first record left out of any partition wait
        cut = min(int(arrivals(p, ends[p] + 1)[-1]) for p in short)
        out = [s + int(np.searchsorted(arrivals(p, e), cut, side="left")) for p, (s, e) in
               enumerate(zip(starts, ends, strict=True))]  # fmt: skip
        if out != starts:
            return out
        # nothing arrived before it: take every record that arrived with the earliest
        firsts = [int(arrivals(p, s + 1)[0]) for p, s in enumerate(starts) if available[p] > s]
        first = min(firsts)
        out = []
        for p, s in enumerate(starts):
            end = s
            while end < available[p]:
                step = min(available[p], max(end + 1, 2 * end - s + 1024))
                a = arrivals(p, step)
                end = s + int(np.searchsorted(a, first, side="right"))
                if end < step:
                    break
            out.append(end)
        return out

    def idle_decisions(self, pos: StreamPosition, ends: Sequence[int]) -> IdleStep:
        """What idleness decides over the step from ``pos`` to ``ends``: the stream clock after
        it and each partition's late rows (``idle_step``)."""
        timeout = self.cfg.idle_timeout_us
        assert timeout is not None
        states = [self._with_last(p, st) for p, st in enumerate(pos.partitions)]
        ts, bs, arrs = [], [], []
        for p, st in enumerate(states):
            w = self.window(p, st.scan, ends[p])
            assert w.arrival is not None
            i = st.next - st.scan
            ts.append(w.t[i:])
            bs.append(w.is_bound[i:])
            arrs.append(w.arrival[i:])
        step = idle_step(self.cfg.policy, states, pos.clock_us, ts, bs, arrs, timeout)
        step.states = states
        step.times = ts
        return step

    def _arrived_by(self, pos: StreamPosition, p: int, end: int, cut: int) -> int:
        """The end of partition ``p``'s new records (from ``pos``, up to ``end``) that arrived
        at or before ``cut`` (arrivals never go down in a partition). Read through the window
        cache: the step reads the same records next."""
        st = pos.partitions[p]
        w = self.window(p, st.scan, end)
        assert w.arrival is not None
        new = w.arrival[st.next - w.first :]
        return st.next + int(np.searchsorted(new, cut, side="right"))

    def settled(self, pos: StreamPosition, whole: bool = False) -> list[int]:
        """Each partition's end over the records that arrived at least ``idle.commitGrace``
        before now, listed now (SPEC 12, idle.timeout).

        A writer stamps a commit's arrival as it begins it, so a commit still under way may
        hold records that arrived before records other partitions already show. Idleness is
        decided in arrival order across partitions, so a step must hold every record up to
        an arrival time: the records of the last ``grace`` wait for a later step, when every
        commit that began before them has ended. If that leaves nothing new while there are
        new records, or ``whole`` (a batch read: everything written now), this waits once (at
        most ``grace``) for the newest to settle, and then takes at least every record up to
        the newest arrival seen before the wait (whatever the writers' clocks say against this
        one: arrivals "in the future" of a writer whose clock runs ahead still come through).
        The wall clock only chooses how far to plan: what is decided comes from the stored
        arrivals alone."""
        grace = self.cfg.idle_commit_grace_us
        starts = [st.next for st in pos.partitions]
        floor: int | None = None  # after the wait: the newest arrival seen before it
        while True:
            now = wall_clock_us()
            # each partition's end and last arrival in one call (no record is read for them)
            tails = [self.stream.tail(p) for p in range(len(starts))]
            cut = now - grace if floor is None else max(now - grace, floor)
            out, newest = [], None
            for p, (s, t) in enumerate(zip(starts, tails, strict=True)):
                if t.end <= s:
                    out.append(t.end)
                    continue
                assert t.last_arrival_us is not None
                newest = t.last_arrival_us if newest is None else max(newest, t.last_arrival_us)
                out.append(
                    t.end if t.last_arrival_us <= cut else self._arrived_by(pos, p, t.end, cut)
                )
            if floor is not None or newest is None:
                return out
            if newest <= cut or (not whole and out != starts):
                return out
            time.sleep(min(max(newest + grace - wall_clock_us(), 0), grace) / 1e6)
            floor = newest

    def _plan_idle(
        self,
        pos: StreamPosition,
        available: Sequence[int],
        max_rows: int | None,
        whole: bool = False,
    ) -> StreamPosition | None:
        # ``available`` is the caller's limit (an availableNow target): records past it, and
        # any that arrived after the first of them, wait (_arrival_prefix)
        settled = self.settled(pos, whole)
        limit = [min(a, e) for a, e in zip(available, settled, strict=True)]
        ends = self._arrival_prefix(pos, choose_ends(pos, limit, max_rows), settled)
        if ends == [p.next for p in pos.partitions]:
            return None
        policy = self.cfg.policy
        idle = self.idle_decisions(pos, ends)
        if isinstance(policy, RejectPolicy):
            _reject_late(self.cfg, idle)
        states = []
        runs: list[EmitRuns | None] = []
        late: list[tuple[np.ndarray, np.ndarray]] = []
        for p, st in enumerate(idle.states):
            win = self.window(p, st.scan, ends[p])
            late.append(late_offsets(st, idle.late[p], idle.late_clock[p]))
            # Without late rows, and with the stream clock never above the partition's, the
            # step is what it is without idleness: the in-order fast path may decide it.
            if not len(late[-1][0]) and _at_most(pos.clock_us, st.clock_us(policy)):
                end_clock = clock_at_end(policy, st, win.t, win.is_bound)
                fast = None
                if _at_most(idle.clock_us, end_clock):
                    fast = sorted_step(policy, st, win.t, win.is_bound, pos.clock_us, idle.clock_us)
                if fast is not None:
                    states.append(
                        dataclasses.replace(fast[0], last_arrival_us=idle.last_arrival_us[p])
                    )
                    runs.append(fast[1])
                    continue
            mask, clocks = late_mask(st, len(win.t), idle.late[p], idle.late_clock[p])
            emitted = np.zeros(len(win.t), dtype=bool)
            last = None
            for first, c in classify_pieces(
                policy,
                st,
                win.t,
                win.is_bound,
                pos.clock_us,
                idle.clock_us,
                where_of(self.cfg, p),
                order=False,
                idle_late=mask,
                idle_clock=clocks,
            ):
                emitted[c.emit_set + (first - st.scan)] = True
                last = c
            assert last is not None
            states.append(dataclasses.replace(last.state, last_arrival_us=idle.last_arrival_us[p]))
            runs.append(EmitRuns.of_mask(emitted, st.scan))
        new = StreamPosition(idle.clock_us, states)
        self._last = (pos.to_dict(), new.to_dict(), runs)
        self._late = (self._last[0], self._last[1], late)
        for p, state in enumerate(new.partitions):
            w = self._cache.get(p)
            if w is not None and w.first <= state.scan:
                self._cache[p] = w.view(state.scan)
        return new

    def late_for(
        self, start: dict[str, Any], end: dict[str, Any]
    ) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """Per partition, the offsets of the step's rows late after idleness and the stream
        clock each was judged against; None without idle.timeout. Recomputed from the log when
        this planner did not plan the step (the driver restarted): the same decisions."""
        if self.cfg.idle_timeout_us is None:
            return None
        s = StreamPosition.from_dict(start)
        e = StreamPosition.from_dict(end)
        if self._late is not None and (s.to_dict(), e.to_dict()) == self._late[:2]:
            return self._late[2]
        ends = [p.next for p in e.partitions]
        if ends == [p.next for p in s.partitions]:
            return [(_NO_OFFSETS, _NO_OFFSETS) for _ in ends]
        idle = self.idle_decisions(s, ends)
        return [
            late_offsets(st, idle.late[p], idle.late_clock[p]) for p, st in enumerate(idle.states)
        ]

    def _hold_back(
        self, pos: StreamPosition, ends: list[int], available: Sequence[int]
    ) -> list[int]:
        """``ends`` cut before each partition's rows still waiting for their N-th successor
        (option interval.count; ``intervals.hold_from``)."""
        n = int(self.cfg.interval_count or 0)
        out = []
        for p, (st, end) in enumerate(zip(pos.partitions, ends, strict=True)):
            if end > st.next:
                w = self.window(p, st.scan, max(end, available[p]))
                end = min(end, hold_from(st, w.t, w.is_bound, n))
            out.append(end)
        return out

    def start_position(self) -> StreamPosition:
        if self.cfg.starting == "latest":
            return StreamPosition.start(self.available())
        return earliest_position(self.stream, self.cfg)  # each partition from its first kept record


#: A step of at least this many records plans its partitions on threads of their own.
PARALLEL_PLAN_RECORDS = 1 << 20


def _each_partition(
    decide: Callable[[Any, str], _T], parts: Sequence[Any], wheres: Sequence[str], records: int
) -> list[_T]:
    """``decide`` for each partition, in order. A large step (``PARALLEL_PLAN_RECORDS``)
    runs them on threads (``each_on_threads``): the policies' passes are numpy's, and
    while the driver plans a backlog the executors wait for it (what the threads save is on
    docs/benchmarks.md). The first partition's error, in order, is the one
    raised, as one after the other."""
    pairs = list(zip(parts, wheres, strict=True))
    threaded = records >= PARALLEL_PLAN_RECORDS
    return each_on_threads(lambda pair: decide(*pair), pairs, threaded, "rowtime-plan")


def _joined(first: EmitRuns | None, then: EmitRuns | None) -> EmitRuns | None:
    """The runs of two consecutive steps as one step's: the offsets of both (a row is emitted
    once, so the runs are disjoint; rows held in the first may go out in the second, before
    its other runs), as ascending runs, those that touch made one again. None when either is
    None or together they are more than a task carries (``MAX_EMIT_RUNS``)."""
    if first is None or then is None:
        return None
    starts = np.concatenate([first.starts, then.starts])
    ends = np.concatenate([first.ends, then.ends])
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    if len(starts) > 1:
        cut = np.flatnonzero(ends[:-1] != starts[1:])  # where a run does not go on into the next
        starts = np.concatenate([starts[:1], starts[cut + 1]])
        ends = np.concatenate([ends[cut], ends[-1:]])
    if len(starts) > MAX_EMIT_RUNS:
        return None
    return EmitRuns(starts, ends, ordered=first.ordered and then.ordered)


def _at_most(clock: int | None, partition_clock: int | None) -> bool:
    """Whether a stream clock is at most a partition clock (no stream clock: yes)."""
    return clock is None or (partition_clock is not None and clock <= partition_clock)


def _reject_late(cfg: ReaderConfig, idle: IdleStep) -> None:
    """order=reject: the first row late after idleness, in arrival order, is an error."""
    for p, st in enumerate(idle.states):
        hits = np.flatnonzero(idle.late[p])
        if len(hits):
            i = int(hits[0])
            raise LateRowError(
                f"{where_of(cfg, p)}, offset {st.next + i}: a row arrived after the partition "
                f"was idle (idle.timeout) with rowtime {format_rowtime(int(idle.times[p][i]))} "
                f"below the stream clock {format_rowtime(int(idle.late_clock[p][i]))} as of its "
                "arrival, and order=reject forbids rows that go back in time; use order=drop or "
                "order=adjust to discard such rows (reason idle, kept in the quarantine), or a "
                "longer idle.timeout (nothing in the log was changed)"
            )


def batch_tasks(cfg: ReaderConfig, planner: Planner | None = None) -> list[ReadTask]:
    """The tasks of a batch read (``spark.read``): the history as one step, every partition
    from its first kept record (the state retention stored there), to the stream clock
    (``endingOffsets=clock``) or to what is written (``latest``)."""
    planner = planner or Planner(cfg)
    if cfg.ending == "latest" and cfg.idle_timeout_us is None:
        available = planner.available()
        return written_tasks(available, earliest_position(planner.stream, cfg).partitions, None)
    planner, available, start, end, late = whole_step(cfg, planner)
    s, e = start.to_dict(), end.to_dict()
    if cfg.ending == "latest":
        return written_tasks(available, start.partitions, late)
    return partition_tasks(s, e, planner.runs_for(s, e), late)


#: How often a batch read plans again when a trim overtakes its planning.
_TRIM_RETRIES = 5


def whole_step(
    cfg: ReaderConfig, planner: Planner | None = None
) -> tuple[
    Planner,
    list[int],
    StreamPosition,
    StreamPosition,
    list[tuple[np.ndarray, np.ndarray]] | None,
]:
    """The history as one step, as a batch read (or ``rowtime metrics``) plans it: the
    planner that planned it, the ends listed, the step's start (every partition at its first
    kept record) and end, and its rows late after idleness (``Planner.late_for``). A
    writer's trim that removes records while this plans from them makes it plan again from the
    new first kept records (the executors may still meet a later trim: that read fails naming
    it, to be run again)."""
    planner = planner or Planner(cfg)
    for attempt in range(_TRIM_RETRIES):
        try:
            available = planner.available()
            start = earliest_position(planner.stream, cfg)
            end = planner.plan(start, available, None, whole=True) or start
            late = planner.late_for(start.to_dict(), end.to_dict())
            return planner, available, start, end, late
        except DataLossError:
            if attempt == _TRIM_RETRIES - 1:
                raise
            planner = Planner(cfg)
    raise AssertionError("unreachable")


def progress_report(planner: Planner) -> dict[str, Any]:
    """What a streaming query's progress shows for the source (``reportLatestOffset``): the
    records written per partition and, once a step is planned, the stream clock (ISO and
    microseconds) and, with idle.timeout, the idle partitions. A plain dict of primitives."""
    report: dict[str, Any] = {"records": {str(p): n for p, n in enumerate(planner.available())}}
    last = planner.last_position
    if last is not None:
        clock = last.clock_us
        report["clock"] = None if clock is None else format_rowtime(clock)
        report["clock_us"] = clock
        timeout = planner.cfg.idle_timeout_us
        if timeout is not None:
            lasts = [p.last_arrival_us for p in last.partitions]
            report["idle"] = [str(p) for p in idle_partitions(lasts, timeout)]
    return report


def partition_tasks(
    start: dict[str, Any],
    end: dict[str, Any],
    runs: Sequence[EmitRuns | None] | None = None,
    late: Sequence[tuple[np.ndarray, np.ndarray]] | None = None,
) -> list[ReadTask]:
    """One task per stream partition; the first also carries the step's bound record.

    ``runs``: what ``Planner.runs_for`` kept for this step (each task then reads only its
    partition's runs); None makes every task replay the policy. ``late``: what
    ``Planner.late_for`` says for this step (idle.timeout)."""
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
                runs=runs[p] if runs is not None else None,
                late=late[p] if late is not None else None,
            )
        )
    return tasks


def written_tasks(
    ends: Sequence[int],
    starts: Sequence[PartitionState] | None = None,
    late: Sequence[tuple[np.ndarray, np.ndarray]] | None = None,
) -> list[ReadTask]:
    """A batch read of every record written so far (``endingOffsets=latest``): each partition
    from its start (``starts[p]``: its first kept record; offset 0 without) to ``ends[p]`` under
    its policy as if an end of stream followed, with no alignment between partitions and no
    bound record. ``late`` (idle.timeout): the rows late after idleness over the whole log
    (``Planner.late_for``), discarded as the streaming query discards them."""
    return [
        ReadTask(
            partition=p,
            prev=(starts[p] if starts is not None else PartitionState()).to_dict(),
            end=end,
            clock_before=None,
            clock_after=END_OF_STREAM_US,
            bound=None,
            ends_now=True,
            late=late[p] if late is not None else None,
        )
        for p, end in enumerate(ends)
    ]

"""The driver's fast paths, for the common steps: records in rowtime order (what a step
decides from a check of the order and a few binary searches: ``sorted_step`` over an array,
``ordered_step`` over times where the log holds them) and, under ``adjust``, rows late only
within the range (``late_scan``, ``late_decide``: a few passes a block at a time); and a
partition's clock at the end of a step from its maxima (``clock_at_end``). The general path
is ``classify_pieces``; property tests hold them together
(``tests/test_reader_sorted_step.py``, ``tests/test_reader_ordered_plan.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..bounds.bounds import END_OF_STREAM_US, merge_clock
from ..bounds.policies import NO_TIME, PartitionState, Policy, truncate_array_us
from .tasks import MAX_EMIT_RUNS, EmitRuns


def _opt(value: int) -> int | None:
    return None if value == NO_TIME else int(value)


def clock_at_end(
    policy: Policy, prev: PartitionState, t: np.ndarray, is_bound: np.ndarray
) -> int | None:
    """The partition clock after the records ``[prev.scan, prev.scan + len(t))`` (``t`` and
    ``is_bound`` start at ``prev.scan``): what a ``scan_partition`` of the new records would
    say at its end, from two maxima instead of a scan. The reference time and the writer bound
    are running maxima and truncation is monotone, so the last ones are the maxima. A late row
    under ``reject`` is not looked for here (``classify_pieces`` raises for it)."""
    i = prev.next - prev.scan
    tn, bn = t[i:], is_bound[i:]
    ref = NO_TIME if prev.ref_us is None else prev.ref_us
    bound = NO_TIME if prev.bound_us is None else prev.bound_us
    unit = policy.unit_us
    if len(tn):
        bounds_at = np.flatnonzero(bn)
        data_max = _max_between(tn, bounds_at)
        if data_max != NO_TIME:
            ref = max(ref, data_max - data_max % unit)
        bound_max = int(tn[bounds_at].max()) if len(bounds_at) else NO_TIME
        if bound_max != NO_TIME:
            if bound_max != END_OF_STREAM_US:
                bound_max -= bound_max % unit
            bound = max(bound, bound_max)
    line = ref - policy.range_us if ref != NO_TIME else NO_TIME
    return _opt(max(line, bound))


def ordered_clock_at_end(
    policy: Policy, prev: PartitionState, t: OrderedTimes, bounds_at: np.ndarray
) -> int | None:
    """``clock_at_end`` over times known to ascend (``bounds_at``: the positions of the
    bound records among them): the last data record and the last bound record from
    ``prev.next`` on hold the maxima."""
    i = prev.next - prev.scan
    ref = NO_TIME if prev.ref_us is None else prev.ref_us
    bound = NO_TIME if prev.bound_us is None else prev.bound_us
    unit = policy.unit_us
    bound_set = set(bounds_at.tolist())
    k = len(t) - 1
    while k >= i and k in bound_set:  # the last data record (bounds are few)
        k -= 1
    if k >= i:
        data_max = t.at(k)
        ref = max(ref, data_max - data_max % unit)
    if len(bounds_at) and int(bounds_at[-1]) >= i:
        bound_max = t.at(int(bounds_at[-1]))
        if bound_max != END_OF_STREAM_US:
            bound_max -= bound_max % unit
        bound = max(bound, bound_max)
    line = ref - policy.range_us if ref != NO_TIME else NO_TIME
    return _opt(max(line, bound))


#: Most bound records ``_max_between`` skips one slice at a time.
_FEW_BOUNDS = 256


def _max_between(t: np.ndarray, skip: np.ndarray) -> int:
    """The largest of ``t`` outside the ascending positions ``skip`` (NO_TIME if none).

    Bound records are few (one per writer flush or heartbeat), so the maxima of the slices
    between them cost one pass over ``t`` and no array as large as it: planning a step of
    millions of records spent a quarter of its time masking them out with ``np.where``."""
    if len(skip) > _FEW_BOUNDS:
        keep = np.ones(len(t), dtype=bool)
        keep[skip] = False
        return int(t.max(where=keep, initial=NO_TIME))
    best, lo = NO_TIME, 0
    for hi in (*skip.tolist(), len(t)):
        if hi > lo:
            best = max(best, int(t[lo:hi].max()))
        lo = hi + 1
    return best


def merge_clocks(clocks: Sequence[int | None], before: int | None) -> int | None:
    """The stream clock from partition clocks, as ``stream_clock`` says it from scans."""
    clock = merge_clock(clocks)
    if clock is None:
        return before
    if before is not None and clock < before:
        return before
    return clock


#: Records ``_ascending`` compares at a time.
_ORDER_BLOCK = 1 << 16


def _ascending(t: np.ndarray) -> bool:
    """Whether ``t`` never goes down; block by block, so that records out of order are found
    after a block, not after a pass over millions (and an array as long) for nothing."""
    n = len(t)
    for a in range(0, n - 1, _ORDER_BLOCK):
        b = min(n, a + _ORDER_BLOCK + 1)  # blocks overlap by one: every neighbour pair is seen
        if not bool(np.all(t[a + 1 : b] >= t[a : b - 1])):
            return False
    return True


class RangeTimes:
    """The ascending times of ``n`` records of which only the first and the last are known
    (a table's version, from its files' statistics: ``table_log.TableLog.ordered_times``);
    the others are read (``load``) only when a binary search or a position lands between them.
    Planning an in-order step needs a few positions and searches, which mostly fall at the
    edges of the pieces: the driver then reads no record's time."""

    def __init__(self, n: int, first: int, last: int, load: Callable[[], np.ndarray]) -> None:
        self.n, self.first, self.last = n, first, last
        self._load = load
        self._values: np.ndarray | None = None

    def __len__(self) -> int:
        return self.n

    @property
    def loaded(self) -> bool:
        return self._values is not None

    def values(self) -> np.ndarray:
        if self._values is None:
            self._values = self._load()
            assert len(self._values) == self.n
        return self._values

    def at(self, i: int) -> int:
        if i == 0:
            return self.first
        if i == self.n - 1:
            return self.last
        return int(self.values()[i])

    def searchsorted(self, value: int, side: Literal["left", "right"]) -> int:
        if value < self.first or (side == "left" and value == self.first):
            return 0
        if value > self.last or (side == "right" and value == self.last):
            return self.n
        return int(np.searchsorted(self.values(), value, side=side))


#: A piece of ``OrderedTimes``: the times as read, or their range alone.
TimesPiece = np.ndarray | RangeTimes


class OrderedTimes:
    """Record times known to ascend, held as the pieces they were read in (views of the log's
    buffers where the log lies in memory maps, no copy; or ``RangeTimes``, the first and
    last time alone): what ``ordered_step`` reads of a step, by position (``at``) and
    by binary search (``searchsorted``), without joining the pieces into one array."""

    def __init__(self, pieces: Sequence[TimesPiece]) -> None:
        self.pieces = [p for p in pieces if len(p)]
        self.starts = np.cumsum([0, *(len(p) for p in self.pieces)])
        self.lasts = np.array([_last(p) for p in self.pieces], dtype=np.int64)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def at(self, i: int) -> int:
        """The time of record ``i`` (0 <= i < len)."""
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        piece, j = self.pieces[k], i - int(self.starts[k])
        return piece.at(j) if isinstance(piece, RangeTimes) else int(piece[j])

    def searchsorted(self, value: int, side: Literal["left", "right"]) -> int:
        """``np.searchsorted`` over the pieces joined: the pieces ascend one after the other,
        so the first piece whose last time reaches ``value`` holds the position."""
        k = int(np.searchsorted(self.lasts, value, side=side))
        if k == len(self.pieces):
            return len(self)
        piece = self.pieces[k]
        if isinstance(piece, RangeTimes):
            return int(self.starts[k]) + piece.searchsorted(value, side)
        return int(self.starts[k]) + int(np.searchsorted(piece, value, side=side))


def _last(piece: TimesPiece) -> int:
    return piece.last if isinstance(piece, RangeTimes) else int(piece[-1])


def as_arrays(pieces: Sequence[TimesPiece]) -> list[np.ndarray]:
    """The times of ``pieces`` as arrays (a ``RangeTimes`` read), for the passes that
    look at every time."""
    return [p.values() if isinstance(p, RangeTimes) else p for p in pieces]


def sorted_step(
    policy: Policy,
    prev: PartitionState,
    t: np.ndarray,
    is_bound: np.ndarray,
    clock_before_us: int | None,
    clock_after_us: int | None,
) -> tuple[PartitionState, EmitRuns] | None:
    """What ``classify_pieces`` decides for one partition's step, for the driver, when the
    records ``[prev.scan, prev.scan + len(t))`` are in rowtime order; None otherwise (or when
    the general path must speak: rows beyond ``adjust.maxHeld``, many bound records).

    Why: in-order data is the common case, and there every decision is a prefix of the window.
    Nothing is discarded (each record is at or above every earlier one, hence at or above the
    clock before it, once the first is); a row is released up to a position found by binary
    search (all of them, for ``reject`` and ``drop``); it is emitted up to the stream clock,
    again a prefix. So one ordered-ness pass and a few binary searches replace the dozen
    passes of ``scan_partition`` and ``classify`` over the step (what that saves is on
    the benchmarks page, docs/benchmarks.md).
    The result (state and emitted runs) is the same as the general path's; a property test
    holds the two together (``tests/test_reader_sorted_step.py``).
    """
    if len(t) == 0:
        return None
    t = np.asarray(t, dtype=np.int64)
    # In order before truncation means in order after it (truncation is monotone); records in
    # disorder only within a unit take the general path, which decides the same.
    if not _ascending(t):
        return None
    if policy.unit_us != 1:
        truncated = truncate_array_us(t, policy.unit_us)
        t = np.where(t == END_OF_STREAM_US, t, truncated) if is_bound.any() else truncated
    bounds_at = np.flatnonzero(is_bound)
    return ordered_step(policy, prev, OrderedTimes([t]), bounds_at, clock_before_us, clock_after_us)


def ordered_step(
    policy: Policy,
    prev: PartitionState,
    t: OrderedTimes,
    bounds_at: np.ndarray,
    clock_before_us: int | None,
    clock_after_us: int | None,
) -> tuple[PartitionState, EmitRuns] | None:
    """``sorted_step`` once the times ``t`` of records ``[prev.scan, prev.scan + len(t))``
    are known to ascend (already truncated to ``adjust.unit``), with the positions of their
    bound records ``bounds_at`` (ascending, relative to ``prev.scan``). It reads the times only
    by position and binary search, so ``t`` may lie where it was read."""
    n = len(t)
    n_prev = prev.next - prev.scan
    if n == 0 or not 0 <= n_prev <= n:
        return None
    if len(bounds_at) > _FEW_BOUNDS:
        return None
    bound_list = bounds_at.tolist()
    bound_set = set(bound_list)
    ref0 = NO_TIME if prev.scan_ref_us is None else prev.scan_ref_us
    bound0 = NO_TIME if prev.scan_bound_us is None else prev.scan_bound_us
    line0 = ref0 - policy.range_us if ref0 != NO_TIME else NO_TIME
    if t.at(0) < max(line0, bound0):
        return None  # the first record may be below the clock: let the general path judge

    def before(k: int) -> tuple[int, int]:
        """(reference time, writer bound) after the records ``[0, k)`` of the window."""
        nb = int(np.searchsorted(bounds_at, k))
        bound = max(bound0, t.at(bound_list[nb - 1])) if nb else bound0
        i = k - 1
        while i >= 0 and i in bound_set:  # the last data record before k (bounds are few)
            i -= 1
        ref = max(ref0, t.at(i)) if i >= 0 else ref0
        return ref, bound

    def released_to(ref: int, bound: int) -> int:
        """Rows before this position are released (``policies._released`` as a prefix)."""
        if not policy.holds:
            return n
        line = ref - policy.range_us if ref != NO_TIME else NO_TIME
        by_bound = t.searchsorted(bound, side="right")
        return max(by_bound, t.searchsorted(line, side="left"))

    def at_most(clock: int | None) -> int:
        return 0 if clock is None else t.searchsorted(clock, side="right")

    ref_n, bound_n = before(n)
    if n_prev:
        done = min(n_prev, released_to(*before(n_prev)), at_most(clock_before_us))
    else:
        done = 0
    emit_end = max(done, min(released_to(ref_n, bound_n), at_most(clock_after_us)))
    held = 0
    if policy.holds:
        rel = released_to(ref_n, bound_n)
        held = (n - rel) - (len(bound_list) - int(np.searchsorted(bounds_at, rel)))
        if held > policy.max_held:
            return None
    j = emit_end
    while j < n and j in bound_set:  # the first record still alive: the first data row left
        j += 1
    scan_ref, scan_bound = before(j)
    state = PartitionState(
        next=prev.scan + n,
        scan=prev.scan + j,
        scan_ref_us=_opt(scan_ref),
        scan_bound_us=_opt(scan_bound),
        ref_us=_opt(ref_n),
        bound_us=_opt(bound_n),
        held=held,
        discarded=prev.discarded,
    )
    # the emitted rows: [done, emit_end) without its bound records
    starts, ends, lo = [], [], done
    for b in (*(x for x in bound_list if done <= x < emit_end), emit_end):
        if b > lo:
            starts.append(lo)
            ends.append(b)
        lo = b + 1
    base = prev.scan
    runs = EmitRuns(
        np.array(starts, dtype=np.int64) + base,
        np.array(ends, dtype=np.int64) + base,
        ordered=True,
    )
    return state, runs


# -- rows out of order, none discarded (adjust) ---------------------------------------------

#: Records ``late_scan`` and ``late_decide`` take at a time: their arrays stay in the
#: processor's caches and the allocator reuses their memory.
_LATE_BLOCK = 1 << 17


def _blocks(
    pieces: Sequence[np.ndarray], bounds_at: np.ndarray, unit: int
) -> Iterator[tuple[int, np.ndarray, bool]]:
    """The times of ``pieces`` (one after the other, in any order) truncated to ``unit`` (an end
    of stream stays as it is), a block at a time, each bound record (positions ``bounds_at``)
    a block of its own: (position of the block's first record, its times, whether it is a
    bound record)."""
    cuts = bounds_at.tolist()
    first = 0
    for piece in pieces:
        end = first + len(piece)
        a = first
        while a < end:
            while cuts and cuts[0] < a:
                cuts.pop(0)
            if cuts and cuts[0] == a:
                value = int(piece[a - first])
                if value != END_OF_STREAM_US:
                    value -= value % unit
                yield a, np.array([value], dtype=np.int64), True
                a += 1
                continue
            b = min(end, a + _LATE_BLOCK, cuts[0] if cuts else end)
            block = piece[a - first : b - first]
            yield a, (block if unit == 1 else truncate_array_us(block, unit)), False
            a = b
        first = end


@dataclass(frozen=True)
class LateScan:
    """What ``late_scan`` found over a partition's step: the reference time and the writer
    bound after it (``ref_us``, ``bound_us``) and just before ``prev.next`` (``ref_prev_us``,
    ``bound_prev_us``), and the partition clock after it (for the stream clock)."""

    ref_us: int
    bound_us: int
    ref_prev_us: int
    bound_prev_us: int
    clock_us: int | None


def late_scan(
    policy: Policy, prev: PartitionState, pieces: Sequence[np.ndarray], bounds_at: np.ndarray
) -> LateScan | None:
    """The first pass of ``late_decide``: the running reference time and writer bound over
    the records ``[prev.scan, ...)`` whose times are ``pieces`` (bound records at
    ``bounds_at``), and whether a row is below the partition clock before it; None if one is
    (it would be discarded: the general path decides then), or when ``prev`` does not fit.

    As ``scan_partition`` decides, without its arrays as
    long as the step: the reference time is the running maximum of the rows' (truncated)
    rowtimes from ``prev.scan_ref_us`` on, the writer bound that of the bound records' from
    ``prev.scan_bound_us`` on, and the clock before a row ``max(reference before it - range,
    writer bound before it)``."""
    n, n_prev = sum(len(p) for p in pieces), prev.next - prev.scan
    if n == 0 or not 0 <= n_prev <= n:
        return None
    ref = NO_TIME if prev.scan_ref_us is None else prev.scan_ref_us
    bound = NO_TIME if prev.scan_bound_us is None else prev.scan_bound_us
    slack = policy.range_us
    ref_prev, bound_prev = ref, bound
    for first, block, is_bound in _blocks(pieces, bounds_at, policy.unit_us):
        if is_bound:
            bound = max(bound, int(block[0]))
        else:
            run = np.maximum.accumulate(block)
            np.maximum(run, ref, out=run)
            clock_first = max(ref - slack, bound) if ref != NO_TIME else bound
            if block[0] < clock_first:
                return None
            if len(block) > 1:
                before = run[:-1] - slack
                np.maximum(before, bound, out=before)
                if bool((block[1:] < before).any()):
                    return None
        if first < n_prev:  # the state just before prev.next
            k = min(n_prev, first + len(block)) - first
            ref_prev = ref if is_bound else int(run[k - 1])
            bound_prev = bound
        if not is_bound:
            ref = int(run[-1])
    line = ref - slack if ref != NO_TIME else NO_TIME
    return LateScan(ref, bound, ref_prev, bound_prev, _opt(max(line, bound)))


def late_decide(
    policy: Policy,
    prev: PartitionState,
    pieces: Sequence[np.ndarray],
    bounds_at: np.ndarray,
    scan: LateScan,
    clock_before_us: int | None,
    clock_after_us: int | None,
) -> tuple[PartitionState, EmitRuns | None] | None:
    """What ``classify_pieces`` decides for one partition's step under ``adjust``
    when no row of it is discarded (``late_scan`` said so), the rows in any order: a block
    at a time over the times where the log holds them, where the general path holds a window
    of the step and makes a dozen passes over it. None when more rows are held than
    ``adjust.maxHeld`` (the general path raises). The runs are None when they are too many to
    ship (``MAX_EMIT_RUNS``), as the general path says.

    A row is released below ``reference time - range`` or at the writer bound (both after the
    step), and emitted once released and at or below the stream clock after the step; rows
    before ``prev.next`` that the step before emitted (released then and at or below the clock
    before) are not emitted again; bound records are never emitted. The first row neither
    emitted now nor before is where the next step starts (``scan``), with the reference time
    and the writer bound just before it."""
    n, n_prev = sum(len(p) for p in pieces), prev.next - prev.scan
    slack = policy.range_us
    line = scan.ref_us - slack if scan.ref_us != NO_TIME else NO_TIME
    line_prev = scan.ref_prev_us - slack if scan.ref_prev_us != NO_TIME else NO_TIME
    b_prev = NO_TIME if clock_before_us is None else clock_before_us
    b_new = NO_TIME if clock_after_us is None else clock_after_us
    ref_j = NO_TIME if prev.scan_ref_us is None else prev.scan_ref_us
    bound_j = NO_TIME if prev.scan_bound_us is None else prev.scan_bound_us
    held, j = 0, n
    edges: list[np.ndarray] = []
    last_on = False
    for first, block, is_bound in _blocks(pieces, bounds_at, policy.unit_us):
        if is_bound:
            emit = np.zeros(1, dtype=bool)
            if j == n:
                bound_j = max(bound_j, int(block[0]))
        else:
            released = (block <= scan.bound_us) | (block < line)
            held += len(block) - int(np.count_nonzero(released))
            emit = released & (block <= b_new)
            alive = ~emit
            if first < n_prev:
                k = min(n_prev, first + len(block)) - first
                head = block[:k]
                done = ((head <= scan.bound_prev_us) | (head < line_prev)) & (head <= b_prev)
                emit[:k] &= ~done
                alive[:k] = ~emit[:k] & ~done
            if j == n:
                hit = np.flatnonzero(alive)
                if len(hit):
                    j = first + int(hit[0])
                    ref_j = max(ref_j, int(block[: int(hit[0])].max(initial=NO_TIME)))
                else:
                    ref_j = max(ref_j, int(block.max()))
        # where runs of emitted rows start or end, as EmitRuns.of_mask finds them
        change = np.flatnonzero(emit[1:] != emit[:-1]) + 1
        if bool(emit[0]) != last_on:
            change = np.concatenate([[0], change])
        edges.append(change + first)
        last_on = bool(emit[-1])
    if held > policy.max_held:
        return None
    at = np.concatenate(edges) if edges else np.empty(0, dtype=np.int64)
    if last_on:
        at = np.append(at, n)
    state = PartitionState(
        next=prev.scan + n,
        scan=prev.scan + j,
        scan_ref_us=_opt(ref_j),
        scan_bound_us=_opt(bound_j),
        ref_us=_opt(scan.ref_us),
        bound_us=_opt(scan.bound_us),
        held=held,
        discarded=prev.discarded,
    )
    if len(at) > 2 * MAX_EMIT_RUNS:
        return state, None
    base = prev.scan
    return state, EmitRuns(at[0::2].astype(np.int64) + base, at[1::2].astype(np.int64) + base)

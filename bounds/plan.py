"""Planning a step over a whole stream: policies per partition, then alignment across them.

A stream's clock is the minimum of its partitions' clocks (SPEC 5). A released row is emitted
only once its rowtime is at or below the stream clock, so a partition that runs ahead waits for
the others and a max-based watermark downstream (Spark's) never passes a row still to come.

Everything a step decides lives in a ``StreamPosition``, a JSON dict of primitives that a
Spark offset carries. Replaying the same step from the same position over the same records gives
the same rows and the same bound (SPEC 7).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .bounds import END_OF_STREAM_US, NO_TIME, merge_clock
from .errors import OffsetError
from .policies import Classified, PartitionScan, PartitionState, Policy, classify
from .versions import newer_format

FORMAT_VERSION = 1


@dataclass
class StreamPosition:
    """The stream clock after a step and each partition's policy state."""

    clock_us: int | None
    partitions: list[PartitionState]

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": FORMAT_VERSION,
            "clock": self.clock_us,
            "partitions": {str(i): p.to_dict() for i, p in enumerate(self.partitions)},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StreamPosition:
        """A position as ``to_dict`` wrote it; ``OffsetError`` for anything else."""
        version = d.get("v") if isinstance(d, dict) else None
        if isinstance(version, int) and version > FORMAT_VERSION:
            raise newer_format("this query's checkpoint: its offset", version, FORMAT_VERSION,
                               OffsetError)  # fmt: skip
        if version != FORMAT_VERSION:  # every version so far is 1: anything else is damage
            raise OffsetError(
                f"offset {str(d)[:200]} has no valid format version ({version!r}); the "
                "checkpoint cannot be resumed"
            )
        try:
            parts = d["partitions"]
            return cls(
                clock_us=d.get("clock"),
                partitions=[PartitionState.from_dict(parts[str(i)]) for i in range(len(parts))],
            )
        except (KeyError, TypeError, ValueError) as e:
            raise OffsetError(
                f"offset {str(d)[:200]} is damaged ({type(e).__name__}: {e}); the checkpoint "
                "cannot be resumed"
            ) from e

    @classmethod
    def start(cls, positions: Sequence[int]) -> StreamPosition:
        """A fresh position that starts reading each partition at the given offset."""
        return cls(None, [PartitionState(next=p, scan=p) for p in positions])

    @property
    def discarded(self) -> int:
        return sum(p.discarded for p in self.partitions)

    @property
    def held(self) -> int:
        return sum(p.held for p in self.partitions)


def stream_clock(scans: Sequence[PartitionScan], before: int | None) -> int | None:
    """The stream clock after the scans: the minimum partition clock, never below ``before``."""
    clock = merge_clock(s.clock_us() for s in scans)
    if clock is None:
        return before
    if before is not None and clock < before:
        # Cannot happen while every partition clock is monotone; guard the promise anyway.
        return before
    return clock


def step(
    prev: StreamPosition, scans: Sequence[PartitionScan]
) -> tuple[StreamPosition, list[Classified]]:
    """One step over every partition: the new position and what each partition emits."""
    clock = stream_clock(scans, prev.clock_us)
    out = [classify(s, prev.clock_us, clock) for s in scans]
    return StreamPosition(clock, [c.state for c in out]), out


def bound_to_emit(before: int | None, after: int | None) -> int | None:
    """The bound record a step carries: the new stream clock when it advanced, else None."""
    if after is None:
        return None
    if before is None or after > before:
        return after
    return None


def choose_ends(prev: StreamPosition, available: Sequence[int], max_rows: int | None) -> list[int]:
    """End offsets for the next step, admitting at most ``max_rows`` new records in all.

    The budget is shared evenly; what a partition cannot use goes to the others. At least one
    record is admitted when any is available, so a query always makes progress.
    """
    starts = [p.next for p in prev.partitions]
    backlog = [max(0, a - s) for a, s in zip(available, starts, strict=True)]
    if max_rows is None or sum(backlog) <= max_rows:
        return [s + b for s, b in zip(starts, backlog, strict=True)]
    budget = max(1, max_rows)
    take = [0] * len(starts)
    open_parts = [i for i, b in enumerate(backlog) if b > 0]
    while budget > 0 and open_parts:
        share = max(1, budget // len(open_parts))
        still = []
        for i in open_parts:
            k = min(share, backlog[i] - take[i], budget)
            take[i] += k
            budget -= k
            if take[i] < backlog[i]:
                still.append(i)
            if budget == 0:
                break
        open_parts = still
    return [s + k for s, k in zip(starts, take, strict=True)]


# -- silent partitions (idle.timeout, SPEC 12) --------------------------------------------------

#: Last arrival of a partition that can never be idle (no record and no creation time known).
NEVER_IDLE = np.iinfo(np.int64).max // 4
#: Distinct arrival times ``idle_step`` looks at together (memory: partitions x this).
_IDLE_CHUNK = 1 << 15


def _groups(arrival: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each run of equal arrival times starts, and its length (``arrival`` ascends)."""
    n = len(arrival)
    starts = np.flatnonzero(arrival[1:] != arrival[:-1]) + 1
    starts = np.concatenate([[0], starts]) if n else starts
    return starts, np.diff(np.append(starts, n))


def clocks_at(
    policy: Policy, state: PartitionState, t: np.ndarray, is_bound: np.ndarray, starts: np.ndarray
) -> np.ndarray:
    """The partition clock after each group of the records ``[state.next, ...)`` (groups
    start at ``starts``; ``t``: raw rowtimes or bounds), from the state at ``state.next``:
    what ``scan_partition`` says after the group's last record, without judging rows and
    without an array as long as the records beyond one masked copy when bounds are among
    them."""
    t = np.asarray(t, dtype=np.int64)
    is_bound = np.asarray(is_bound, dtype=bool)
    if not len(t):
        return np.empty(0, dtype=np.int64)
    unit = policy.unit_us
    any_bound = bool(is_bound.any())
    data = np.where(is_bound, NO_TIME, t) if any_bound else t
    ref = np.maximum.reduceat(data, starts)
    if unit != 1:
        ref = np.where(ref == NO_TIME, ref, (ref // unit) * unit)
    ref[0] = max(int(ref[0]), NO_TIME if state.ref_us is None else state.ref_us)
    np.maximum.accumulate(ref, out=ref)
    clock = ref - policy.range_us if policy.range_us else ref
    np.maximum(clock, NO_TIME, out=clock)
    bound0 = NO_TIME if state.bound_us is None else state.bound_us
    if any_bound:
        bounds = np.maximum.reduceat(np.where(is_bound, t, NO_TIME), starts)
        if unit != 1:
            keep = (bounds == NO_TIME) | (bounds == END_OF_STREAM_US)
            bounds = np.where(keep, bounds, (bounds // unit) * unit)
        np.maximum.accumulate(bounds, out=bounds)
        np.maximum(clock, bounds, out=clock)
    if bound0 != NO_TIME:
        np.maximum(clock, bound0, out=clock)
    return clock


@dataclass
class IdleStep:
    """What idleness decided over a step (``idle_step``).

    ``clock_us``: the stream clock after the step. Per partition, over its new records:
    ``late`` marks the data rows below the stream clock as of their arrival, ``late_clock``
    holds that clock for each record (meaningful where ``late``), ``last_arrival_us`` is the
    arrival of its last record after the step (its creation, or None, without any)."""

    clock_us: int | None
    late: list[np.ndarray]
    late_clock: list[np.ndarray]
    last_arrival_us: list[int | None]
    #: for the caller's use: the states the step started from, the new records' times
    states: list[PartitionState] = field(default_factory=list)
    times: list[np.ndarray] = field(default_factory=list)


def idle_step(
    policy: Policy,
    states: Sequence[PartitionState],
    clock_before_us: int | None,
    t: Sequence[np.ndarray],
    is_bound: Sequence[np.ndarray],
    arrival: Sequence[np.ndarray],
    timeout_us: int,
) -> IdleStep:
    """The stream clock over a step with silent partitions (SPEC 12), and the rows it makes late.

    The records ``[states[p].next, ...)`` of every partition (``t``: raw rowtimes or bounds,
    ``arrival``: their stored arrival times) must be every record of the stream whose arrival
    is at most the latest among them: a prefix of the stream in arrival order. Partition ``p``
    is idle at time ``x`` when some record of another partition has arrived by ``x`` more than
    ``timeout_us`` after ``p``'s last record (its creation before any:
    ``states[p].last_arrival_us``; None: never idle before its first record). Since the record
    at ``x`` is the latest, that is ``x > last_p(x) + timeout``. At every distinct arrival time
    the stream clock becomes the largest of what it was and the minimum of the non-idle
    partitions' clocks, so it never goes back. A record is judged against the clock after every
    record that arrived strictly before it: a data row below it is late (the caller discards it
    as ``idle`` unless its policy discards it first, or fails under ``reject``).

    Everything here comes from stored arrivals, so a replay of the same records decides the
    same. Vectorised: the distinct arrival times are looked at a chunk at a time, each
    partition's clock and last arrival found there by binary search.
    """
    n_parts = len(states)
    arrivals = [np.asarray(a, dtype=np.int64) for a in arrival]
    groups = [_groups(a) for a in arrivals]  # per partition: (starts, lengths) of equal arrivals
    marks = [a[g[0]] for a, g in zip(arrivals, groups, strict=True)]  # its distinct arrivals
    clocks = [
        clocks_at(policy, st, tp, bp, g[0])
        for st, tp, bp, g in zip(states, t, is_bound, groups, strict=True)
    ]
    last0 = np.array(
        [NEVER_IDLE if st.last_arrival_us is None else st.last_arrival_us for st in states],
        dtype=np.int64,
    )
    clock0 = np.array([_arr_time(st.clock_us(policy)) for st in states], dtype=np.int64)
    s0 = _arr_time(clock_before_us)
    # Every partition's distinct arrival times merged into one ascending sequence; from the
    # partition each came from, ``count[p]`` is how many of ``p``'s times are at or before
    # each distinct time (one pass each, no binary search) and ``group[p]`` where each of
    # ``p``'s times is in it.
    cat = np.concatenate(marks) if n_parts else np.empty(0, dtype=np.int64)
    origin_all = np.repeat(np.arange(n_parts), [len(m) for m in marks])
    order = np.argsort(cat, kind="stable")  # merges sorted runs (timsort)
    merged = cat[order]
    origin = origin_all[order]
    is_last = np.append(merged[1:] != merged[:-1], True) if len(merged) else merged.astype(bool)
    times = merged[is_last]
    group_of = np.cumsum(is_last) - is_last  # each merged entry's distinct-time index
    count, group = [], []
    for p in range(n_parts):
        mine = origin == p
        count.append(np.cumsum(mine)[is_last])
        group.append(group_of[mine])
    # the stream clock after each distinct arrival time
    after = np.empty(len(times), dtype=np.int64)
    running = s0
    inf = np.iinfo(np.int64).max
    for a in range(0, len(times), _IDLE_CHUNK):
        x = times[a : a + _IDLE_CHUNK]
        low = np.full(len(x), inf, dtype=np.int64)
        for p in range(n_parts):
            mp = marks[p]
            if len(mp):
                k = count[p][a : a + _IDLE_CHUNK]
                has = k > 0
                i = np.maximum(k - 1, 0)
                last = np.where(has, mp[i], last0[p])
                clock = np.where(has, clocks[p][i], clock0[p])
                busy = x <= last + timeout_us
            else:
                clock = clock0[p]
                busy = x <= last0[p] + timeout_us
            np.minimum(low, np.where(busy, clock, inf), out=low)
        low[low == inf] = NO_TIME
        np.maximum.accumulate(low, out=low)
        np.maximum(low, running, out=low)
        after[a : a + len(x)] = low
        if len(x):
            running = int(low[-1])
    before = np.empty(len(times), dtype=np.int64)
    if len(times):
        before[0] = s0
        before[1:] = after[:-1]
    late, late_clock, lasts = [], [], []
    for p in range(n_parts):
        mp = marks[p]
        judged_g = before[group[p]]
        tp = np.asarray(t[p], dtype=np.int64)
        data = ~np.asarray(is_bound[p], dtype=bool)
        if not len(mp) or int(judged_g.max()) == NO_TIME:
            late.append(np.zeros(len(tp), dtype=bool))
            late_clock.append(np.full(len(tp), NO_TIME, dtype=np.int64))
        else:
            judged = np.repeat(judged_g, groups[p][1])
            if policy.unit_us != 1:
                tp = (tp // policy.unit_us) * policy.unit_us
            late.append(data & (tp < judged))
            late_clock.append(judged)
        lasts.append(int(mp[-1]) if len(mp) else states[p].last_arrival_us)
    return IdleStep(_opt_time(running), late, late_clock, lasts)


def idle_partitions(lasts: Sequence[int | None], timeout_us: int) -> list[int]:
    """The partitions idle after the records whose last arrivals are ``lasts`` (per partition;
    None: never idle): those whose last record came more than the timeout before the latest."""
    known = [x for x in lasts if x is not None]
    if not known:
        return []
    latest = max(known)
    return [p for p, x in enumerate(lasts) if x is not None and latest > x + timeout_us]


def _arr_time(value: int | None) -> int:
    return NO_TIME if value is None else int(value)


def _opt_time(value: int) -> int | None:
    return None if value == NO_TIME else int(value)

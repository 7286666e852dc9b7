"""Keeping a partition in rowtime order: the ``reject``, ``drop`` and ``adjust`` policies.

The rules are SPEC section 6. This module implements them *vectorised* and *resumable*:

* The input is a partition's records in offset order, as two numpy arrays: ``t`` (int64
  microseconds: a data row's rowtime, or a bound record's bound) and ``is_bound``.
* A partition's state at a position is a handful of integers (``PartitionState``),
  JSON-able, so that a Spark offset can carry it. It never holds the held rows themselves; it
  points back to the first record that is still *alive* (held, or released but not yet emitted),
  and the caller supplies the records from there on again.

Why this works without storing held rows. Let ``ref`` be the highest (truncated) data rowtime
seen, ``R`` the adjustment range in microseconds (``adjust`` only) and ``wb`` the highest bound
the writer sent. Then, after any prefix of the partition:

* the partition clock is ``max(ref - R, wb)`` for ``adjust`` and ``max(ref, wb)`` for ``drop``
  and ``reject`` (SPEC 6.5);
* a data row is *discarded* iff its rowtime is below the clock just before it arrived;
* a kept row is *released* iff ``t < ref - R`` (earlier than the range: SPEC 6.4) or
  ``t <= wb`` (a bound releases rows below it and ties at it, which no later row can precede).
  ``drop`` and ``reject`` release every kept row at once.

``ref`` and ``wb`` only grow, so "released by position P" needs only the state at P, and whether
a row was discarded needs only the running maxima from any earlier position: a state at the
first alive record is enough to rebuild everything after it.

Released rows come out in ascending rowtime, ties in arrival (offset) order. That order is
global: a row released later can never precede one released earlier, because it was either held
(so ``t >= ref - R`` and ``t > wb`` at the earlier release) or arrived later at or above the
clock.

One refinement of SDP's wording, stated here because it is visible: a row that arrives with
rowtime equal to the writer's current bound is released at once (no later row can precede it),
rather than being held until the reference time moves. The order of rows is the same either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from .bounds import END_OF_STREAM_US, MIN_ROWTIME_US, NO_TIME
from .errors import HeldRowsOverflowError, LateRowError, OptionError
from .units import ADJUST_UNITS_US

#: Reasons recorded with a discarded row.
REASON_BELOW_RANGE = "below_adjust_range"
REASON_BELOW_BOUND = "below_rowtime_bound"
REASON_LATE = "below_partition_clock"
#: A row below the stream clock as of its arrival, after its partition was idle (SPEC 12).
REASON_IDLE = "idle"


@dataclass(frozen=True)
class Policy:
    """Base of the three ordering policies: frozen, validated configuration only."""

    name: ClassVar[str] = ""

    @property
    def unit_us(self) -> int:
        """Rowtimes are truncated to a multiple of this (1 = no truncation)."""
        return 1

    @property
    def range_us(self) -> int:
        return 0

    @property
    def max_held(self) -> int:
        return 0

    @property
    def holds(self) -> bool:
        """Whether the policy holds rows back (only ``adjust`` does)."""
        return False


@dataclass(frozen=True)
class RejectPolicy(Policy):
    """A row below the partition clock is an error (SQLstream).

    Examples:
        A stream's default, ``order="reject"``; a reader's ``option("order", "reject")``:

        >>> import pyspark_rowtime as rt
        >>> rt.RejectPolicy().name, rt.RejectPolicy().holds
        ('reject', False)
    """

    name: ClassVar[str] = "reject"


@dataclass(frozen=True)
class DropPolicy(Policy):
    """A row below the partition clock is discarded (counted and quarantined, never silent).

    Examples:
        ``order="drop"``, as a stream's default or a reader's option:

        >>> import pyspark_rowtime as rt
        >>> rt.DropPolicy().name
        'drop'
    """

    name: ClassVar[str] = "drop"


#: ``adjust.maxHeld`` when not given: rows ``adjust`` may hold at once.
DEFAULT_MAX_HELD = 1_000_000


@dataclass(frozen=True)
class AdjustPolicy(Policy):
    """The SDP timestamp adjustment (SPEC 6, seed 000).

    ``unit`` (``sec``, ``msec``, ``usec``) truncates rowtimes toward the past; ``range`` (in that
    unit, ``>= 0``) is how far below the reference time rows are held to be reordered;
    ``max_held`` bounds the rows held at once (SDP's maxKeepTupleCount).

    Examples:
        ``order="adjust"`` with ``adjust_unit="sec"``, ``adjust_range=5``: rowtimes truncated
        to the second, rows held up to 5 seconds below the reference time to be reordered:

        >>> import pyspark_rowtime as rt
        >>> policy = rt.AdjustPolicy(unit="sec", range=5)
        >>> policy.unit_us, policy.range_us, policy.holds
        (1000000, 5000000, True)
        >>> rt.AdjustPolicy(unit="min")
        Traceback (most recent call last):
        ...
        pyspark_rowtime.bounds.errors.OptionError: ...
    """

    name: ClassVar[str] = "adjust"
    unit: str = "usec"
    range: int = 0
    max_held: int = DEFAULT_MAX_HELD

    def __post_init__(self) -> None:
        if self.unit not in ADJUST_UNITS_US:
            raise OptionError(f"adjust.unit must be one of sec, msec, usec; got {self.unit!r}")
        # A range past Spark's whole timestamp span means nothing and would overflow int64.
        span = (END_OF_STREAM_US - MIN_ROWTIME_US) // ADJUST_UNITS_US[self.unit]
        if (
            isinstance(self.range, bool)
            or not isinstance(self.range, int)
            or not 0 <= self.range <= span
        ):
            raise OptionError(
                f"adjust.range must be a whole number of {self.unit} >= 0, at most {span} (the "
                f"span of Spark timestamps); got {self.range!r}"
            )
        if (
            isinstance(self.max_held, bool)
            or not isinstance(self.max_held, int)
            or self.max_held <= 0
        ):
            raise OptionError(
                f"adjust.maxHeld must be a whole number of rows > 0; got {self.max_held!r}"
            )

    @property
    def unit_us(self) -> int:
        return ADJUST_UNITS_US[self.unit]

    @property
    def range_us(self) -> int:
        return self.range * ADJUST_UNITS_US[self.unit]

    @property
    def holds(self) -> bool:
        return True


def make_policy(
    order: str, *, unit: str = "usec", range: int = 0, max_held: int = DEFAULT_MAX_HELD
) -> Policy:
    """Build a policy from its option values (``order``, ``adjust.*``)."""
    if order == "reject":
        return RejectPolicy()
    if order == "drop":
        return DropPolicy()
    if order == "adjust":
        return AdjustPolicy(unit=unit, range=range, max_held=max_held)
    raise OptionError(f"order must be one of reject, drop, adjust; got {order!r}")


def _opt(value: int) -> int | None:
    return None if value == NO_TIME else int(value)


def _arr(value: int | None) -> int:
    return NO_TIME if value is None else int(value)


@dataclass
class PartitionState:
    """A partition's policy state at position ``next`` (the next offset to consume).

    ``scan`` is the first offset whose record is still alive (held, or released and waiting for
    the other partitions); ``scan_ref_us``/``scan_bound_us`` are the reference time and writer
    bound just before ``scan``. ``ref_us``/``bound_us`` are the same at ``next``. ``held`` counts
    the rows held at ``next`` and ``discarded`` every row discarded before it.
    ``last_arrival_us`` is the arrival time of record ``next - 1`` (or the stream's creation
    when ``next`` is 0); only readers with ``idle.timeout`` keep it, None otherwise (and in
    offsets written before idleness). All JSON-able.
    """

    next: int = 0
    scan: int = 0
    scan_ref_us: int | None = None
    scan_bound_us: int | None = None
    ref_us: int | None = None
    bound_us: int | None = None
    held: int = 0
    discarded: int = 0
    last_arrival_us: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {
            "next": self.next,
            "scan": self.scan,
            "scan_ref": self.scan_ref_us,
            "scan_bound": self.scan_bound_us,
            "ref": self.ref_us,
            "bound": self.bound_us,
            "held": self.held,
            "discarded": self.discarded,
        }
        if self.last_arrival_us is not None:  # offsets without idleness stay as they were
            d["arrival"] = self.last_arrival_us
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PartitionState:
        return cls(
            next=int(d["next"]),
            scan=int(d["scan"]),
            scan_ref_us=d.get("scan_ref"),
            scan_bound_us=d.get("scan_bound"),
            ref_us=d.get("ref"),
            bound_us=d.get("bound"),
            held=int(d.get("held", 0)),
            discarded=int(d.get("discarded", 0)),
            last_arrival_us=None if d.get("arrival") is None else int(d["arrival"]),
        )

    def clock_us(self, policy: Policy) -> int | None:
        """The partition clock at ``next`` (SPEC 6.5), or None before any row or bound."""
        return _opt(_clock(policy, _arr(self.ref_us), _arr(self.bound_us)))


def _clock(policy: Policy, ref: int, bound: int) -> int:
    line = ref - policy.range_us if ref != NO_TIME else NO_TIME
    return max(line, bound)


def _release_line(policy: Policy, ref: int) -> int:
    """Kept rows with ``t`` below this are released (``adjust``); others release at once."""
    if not policy.holds:
        return np.iinfo(np.int64).max
    return ref - policy.range_us if ref != NO_TIME else NO_TIME


@dataclass
class PartitionScan:
    """The records ``[state.scan, end)`` of one partition, with their running state.

    Built by ``scan_partition``; ``clock_us`` is the clock at ``end``. Call
    ``classify`` once the stream clock is known.
    """

    policy: Policy
    prev: PartitionState
    t: np.ndarray  # int64, truncated rowtimes (data) or bounds
    is_bound: np.ndarray  # bool
    ref_run: np.ndarray  # int64, reference time after each record
    bound_run: np.ndarray  # int64, writer bound after each record
    discarded: np.ndarray  # bool
    clock_before: np.ndarray  # int64, clock just before each record
    where: str = "partition"

    @property
    def first(self) -> int:
        return self.prev.scan

    @property
    def end(self) -> int:
        return self.prev.scan + len(self.t)

    def _state_before(self, i: int) -> tuple[int, int]:
        """(ref, bound) just before window index ``i``."""
        if i <= 0:
            return _arr(self.prev.scan_ref_us), _arr(self.prev.scan_bound_us)
        return int(self.ref_run[i - 1]), int(self.bound_run[i - 1])

    def state_at_end(self) -> tuple[int, int]:
        return self._state_before(len(self.t))

    def clock_us(self) -> int | None:
        ref, bound = self.state_at_end()
        return _opt(_clock(self.policy, ref, bound))


def truncate_array_us(t: np.ndarray, unit_us: int) -> np.ndarray:
    """Floor each rowtime to a multiple of ``unit_us`` (toward the past, also before 1970)."""
    if unit_us == 1:
        return t
    return (t // unit_us) * unit_us


def scan_partition(
    policy: Policy,
    prev: PartitionState,
    t: np.ndarray,
    is_bound: np.ndarray,
    *,
    where: str = "partition",
) -> PartitionScan:
    """Run the policy over the records ``[prev.scan, prev.scan + len(t))``.

    ``t`` holds each record's rowtime (data rows, before truncation) or bound (bound records).
    The records before ``prev.next`` are the ones already seen; they are replayed, not
    re-judged. Under ``reject`` a new row below the clock raises ``LateRowError`` naming
    ``where``, the offset, the rowtime and the clock.
    """
    t = np.asarray(t, dtype=np.int64)
    is_bound = np.asarray(is_bound, dtype=bool)
    if len(t) != len(is_bound):
        raise ValueError("t and is_bound must have the same length")
    if len(t) < prev.next - prev.scan:
        raise ValueError(
            f"{where}: records from offset {prev.scan} to at least {prev.next} are needed, "
            f"got {len(t)}"
        )
    if policy.unit_us != 1:
        # Bounds are truncated too: a bound b promises rows >= b, hence truncated rows >= floor(b).
        # (End of stream stays the largest timestamp; only a bound record can carry it.)
        truncated = truncate_array_us(t, policy.unit_us)
        t = np.where(t == END_OF_STREAM_US, t, truncated) if is_bound.any() else truncated
    ref0 = _arr(prev.scan_ref_us)
    bound0 = _arr(prev.scan_bound_us)

    any_bound = bool(is_bound.any())
    ref_run = np.where(is_bound, NO_TIME, t) if any_bound else t.copy()
    if ref0 != NO_TIME and len(ref_run):
        # a running maximum: raising the first entry to ref0 raises them all (one pass fewer)
        ref_run[0] = max(int(ref_run[0]), ref0)
    np.maximum.accumulate(ref_run, out=ref_run)
    if any_bound:
        bound_run = np.where(is_bound, t, NO_TIME)
        np.maximum.accumulate(bound_run, out=bound_run)
        if bound0 != NO_TIME:
            np.maximum(bound_run, bound0, out=bound_run)
    else:  # no bound among the records (the common case): the bound stays where it was
        bound_run = np.full(len(t), bound0, dtype=np.int64)

    # the clock after each record, max(ref - range, bound), built in one new array
    clock_after = ref_run - policy.range_us if policy.range_us else ref_run.copy()
    if any_bound or bound0 != NO_TIME:
        np.maximum(clock_after, bound_run, out=clock_after)
    clock_before = np.empty_like(clock_after)
    if len(t):
        clock_before[0] = _clock(policy, ref0, bound0)
        clock_before[1:] = clock_after[:-1]
    discarded = t < clock_before
    if any_bound:
        discarded &= ~is_bound

    scan = PartitionScan(
        policy, prev, t, is_bound, ref_run, bound_run, discarded, clock_before, where
    )
    if isinstance(policy, RejectPolicy):
        new = prev.next - prev.scan
        late = np.flatnonzero(discarded[new:])
        if len(late):
            i = new + int(late[0])
            raise LateRowError(
                f"{where}, offset {prev.scan + i}: rowtime {int(t[i])} us is below the partition "
                f"clock {int(clock_before[i])} us, and order=reject forbids rows that go back in "
                "time; use order=drop or order=adjust to keep the query running (nothing in the "
                "log was changed)"
            )
    return scan


@dataclass
class Classified:
    """What one step decided for one partition.

    ``emit`` indexes the scan's window in emission order (ascending rowtime, ties by offset);
    ``emit_rowtime_us`` are their (truncated) rowtimes; ``emit_set`` holds the same indexes in
    offset order. ``discarded`` indexes rows newly
    discarded in this step, with the clock at the time and the reason.
    """

    state: PartitionState
    emit: np.ndarray
    emit_rowtime_us: np.ndarray
    discarded: np.ndarray
    discarded_rowtime_us: np.ndarray
    discarded_clock_us: np.ndarray
    discarded_reason: list[str] = field(default_factory=list)
    emit_set: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))


def _released(policy: Policy, t: np.ndarray, ref: int, bound: int) -> np.ndarray:
    rel = t <= bound
    if policy.holds:
        rel |= t < _release_line(policy, ref)
        return rel
    return np.ones(len(t), dtype=bool)


def classify(
    scan: PartitionScan,
    stream_clock_before_us: int | None,
    stream_clock_us: int | None,
    *,
    order: bool = True,
    idle_late: np.ndarray | None = None,
    idle_clock: np.ndarray | None = None,
) -> Classified:
    """Decide what the step emits, given the stream clock before and after it.

    A row is emitted once it is released and its rowtime is at or below the stream clock
    (alignment: a partition that is ahead waits for the others). Without idleness
    ``stream_clock_us`` is at most this partition's clock at the end of the scan.
    ``order=False`` leaves ``emit`` in offset order (as ``emit_set``), for a caller that needs
    only which rows are emitted.

    ``idle_late`` (readers with ``idle.timeout``; a mask over the scan's window, read for the
    records from ``prev.next`` on) marks rows below the stream clock as of their arrival
    (``pyspark_rowtime.bounds.plan.idle_step``), ``idle_clock`` that clock for each: they
    are discarded with reason ``idle`` unless the policy discards them first. With idleness
    the stream clock may pass the rows a partition holds while it is silent, so a kept row
    strictly below the stream clock is released too: it goes out in the step whose clock
    passes it, never below an earlier step's clock. Records before ``prev.next`` need no mask:
    a kept row below the clock before the step went out in an earlier step, or was late.
    """
    policy, prev = scan.policy, scan.prev
    t, is_bound, discarded = scan.t, scan.is_bound, scan.discarded
    n = len(t)
    n_prev = prev.next - prev.scan
    b_prev = _arr(stream_clock_before_us)
    b_new = _arr(stream_clock_us)
    idle = idle_late is not None
    late = np.zeros(n, dtype=bool)
    if idle_late is not None and n > n_prev:
        late[n_prev:] = idle_late[n_prev:n] & ~discarded[n_prev:]
    live = ~is_bound & ~discarded & ~late if idle else ~is_bound & ~discarded

    ref_p, bound_p = scan._state_before(n_prev)
    ref_n, bound_n = scan._state_before(n)

    policy_rel = _released(policy, t, ref_n, bound_n)
    rel_new = live & (policy_rel | (t < b_new)) if idle else live & policy_rel
    done_before = np.zeros(n, dtype=bool)
    if n_prev:
        tp = t[:n_prev]
        rel_p = _released(policy, tp, ref_p, bound_p)
        if idle:
            rel_p |= tp < b_prev
        done_before[:n_prev] = live[:n_prev] & rel_p & (tp <= b_prev)
    emit_mask = rel_new & (t <= b_new) & ~done_before
    alive = live & ~done_before & ~emit_mask
    held_mask = live & ~rel_new
    held = int(np.count_nonzero(held_mask))
    if held > policy.max_held and policy.holds:
        raise HeldRowsOverflowError(
            f"{scan.where}: adjust would hold {held} rows, more than adjust.maxHeld="
            f"{policy.max_held}; raise adjust.maxHeld or lower adjust.range (every row is still "
            "in the log, nothing was lost)"
        )

    emit = emit_set = np.flatnonzero(emit_mask)
    et = t[emit]
    if order and len(et) > 1 and not bool(np.all(et[1:] >= et[:-1])):
        by_time = np.argsort(et, kind="stable")
        emit = emit[by_time]
        et = et[by_time]

    alive_idx = np.flatnonzero(alive)
    j = int(alive_idx[0]) if len(alive_idx) else n
    scan_ref, scan_bound = scan._state_before(j)

    gone = discarded | late if idle else discarded
    new_disc = np.flatnonzero(gone[n_prev:]) + n_prev
    clocks = scan.clock_before[new_disc]
    reasons: list[str] = []
    if len(new_disc):
        bound_before = np.empty(n, dtype=np.int64)
        bound_before[0] = _arr(prev.scan_bound_us)
        bound_before[1:] = scan.bound_run[:-1]
        below_bound = clocks == bound_before[new_disc]
        if policy.holds:
            reasons = [REASON_BELOW_BOUND if b else REASON_BELOW_RANGE for b in below_bound]
        else:
            reasons = [REASON_BELOW_BOUND if b else REASON_LATE for b in below_bound]
        if idle:
            is_late = late[new_disc]
            if is_late.any():
                assert idle_clock is not None
                clocks = np.where(is_late, idle_clock[new_disc], clocks)
                reasons = [REASON_IDLE if x else r for x, r in zip(is_late, reasons, strict=True)]

    state = PartitionState(
        next=scan.end,
        scan=prev.scan + j,
        scan_ref_us=_opt(scan_ref),
        scan_bound_us=_opt(scan_bound),
        ref_us=_opt(ref_n),
        bound_us=_opt(bound_n),
        held=held,
        discarded=prev.discarded + len(new_disc),
    )
    return Classified(
        state=state,
        emit=emit,
        emit_rowtime_us=et,
        discarded=new_disc,
        discarded_rowtime_us=t[new_disc],
        discarded_clock_us=clocks,
        discarded_reason=reasons,
        emit_set=emit_set,
    )


@dataclass
class Released:
    """Rows a ``PolicyRun`` step released, in order; and rows it discarded."""

    offsets: np.ndarray
    rowtime_us: np.ndarray
    discarded_offsets: np.ndarray
    discarded_rowtime_us: np.ndarray
    discarded_clock_us: np.ndarray
    discarded_reason: list[str]
    clock_us: int | None


class PolicyRun:
    """A policy running over one partition, fed chunk by chunk, resumable from a snapshot.

    ``PolicyRun(policy)`` starts at offset 0; ``PolicyRun(policy, snapshot)`` resumes: its first
    ``push`` must then start at ``snapshot["scan"]`` (``needs_from``), i.e. include the
    records the snapshot points back to. The run keeps the alive part of the window between
    pushes, so later pushes pass only new records.
    """

    def __init__(
        self, policy: Policy, snapshot: dict[str, Any] | None = None, *, where: str = "partition"
    ) -> None:
        self.policy = policy
        self.where = where
        self.state = PartitionState.from_dict(snapshot) if snapshot else PartitionState()
        self._t = np.empty(0, dtype=np.int64)
        self._b = np.empty(0, dtype=bool)
        self._have_window = snapshot is None or self.state.scan == self.state.next

    @property
    def needs_from(self) -> int:
        """The offset the next ``push`` must start at."""
        return self.state.next if self._have_window else self.state.scan

    @property
    def clock_us(self) -> int | None:
        return self.state.clock_us(self.policy)

    def snapshot(self) -> dict[str, Any]:
        """The state as a small JSON-able dict (positions, reference time, bound, counts)."""
        return self.state.to_dict()

    def push(
        self, t: np.ndarray, is_bound: np.ndarray, first_offset: int | None = None
    ) -> Released:
        t = np.asarray(t, dtype=np.int64)
        is_bound = np.asarray(is_bound, dtype=bool)
        if first_offset is not None and first_offset != self.needs_from:
            raise ValueError(
                f"{self.where}: expected records from offset {self.needs_from}, got {first_offset}"
            )
        if self._have_window:
            wt = np.concatenate([self._t, t])
            wb = np.concatenate([self._b, is_bound])
        else:
            wt, wb = t, is_bound
        scan = scan_partition(self.policy, self.state, wt, wb, where=self.where)
        clock = scan.clock_us()
        # A lone partition is its own stream: its clock is the stream clock.
        out = classify(scan, self.state.clock_us(self.policy), clock)
        keep = out.state.scan - self.state.scan
        self._t = wt[keep:]
        self._b = wb[keep:]
        self._have_window = True
        base = self.state.scan
        self.state = out.state
        return Released(
            offsets=out.emit + base,
            rowtime_us=out.emit_rowtime_us,
            discarded_offsets=out.discarded + base,
            discarded_rowtime_us=out.discarded_rowtime_us,
            discarded_clock_us=out.discarded_clock_us,
            discarded_reason=out.discarded_reason,
            clock_us=clock,
        )

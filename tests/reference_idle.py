"""A row-at-a-time transcription of SPEC 12's silent partitions, kept deliberately naive.

The vectorised planner (``bounds.plan.idle_step`` with ``bounds.policies.classify``, driven by
``datasource.reader.Planner``) is checked against it on generated multi-partition streams.

Records of every partition are taken in arrival order; those that arrived at the same instant
are all judged against the state as it stood just before that instant. Per record:

* a bound raises its partition's writer bound;
* a data row below its partition clock is discarded by the policy (SPEC 6), else a row below
  the stream clock as of its arrival is late (reason ``idle``), else it is kept. A late row
  still raises its partition's reference time, as the policy sees every row it does not
  discard itself: that changes only which reason later rows of the partition are discarded
  for, never whether they are (they are below the stream clock either way).

After each instant ``x``, partition ``p`` is idle when ``x`` is more than the timeout after its
last record (its creation before any); the stream clock becomes the largest of what it was and
the minimum clock of the partitions that are not idle (unchanged while one of those has none).

A kept row is emitted by stream clock ``S`` when the policy released it or it lies strictly
below ``S``, and its rowtime is at most ``S``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.bounds.errors import LateRowError
from pyspark_rowtime.bounds.policies import (
    REASON_BELOW_BOUND,
    REASON_BELOW_RANGE,
    REASON_IDLE,
    REASON_LATE,
    Policy,
)


@dataclass
class Record:
    partition: int
    offset: int
    t: int  # microseconds: a data row's rowtime or a bound record's bound
    is_bound: bool
    arrival: int


@dataclass
class _Part:
    last: int | None
    ref: int | None = None
    wb: int | None = None
    kept: list[tuple[int, int]] = field(default_factory=list)  # (rowtime, offset)


@dataclass
class IdleReference:
    policy: Policy
    partitions: int
    timeout_us: int
    created_us: int | None
    clock: int | None = None
    discarded: list[tuple[int, int, int, str, int]] = field(default_factory=list)
    # (partition, offset, rowtime, reason, clock)

    def __post_init__(self) -> None:
        self.parts = [_Part(self.created_us) for _ in range(self.partitions)]

    def part_clock(self, p: _Part) -> int | None:
        line = None if p.ref is None else p.ref - self.policy.range_us
        if line is None:
            return p.wb
        return line if p.wb is None else max(line, p.wb)

    def run(self, records: list[Record]) -> None:
        """Feed every record (any order: they are taken by arrival, then offset)."""
        by_time: dict[int, list[Record]] = {}
        for r in records:
            by_time.setdefault(r.arrival, []).append(r)
        for x in sorted(by_time):
            before = self.clock
            for r in sorted(by_time[x], key=lambda r: (r.partition, r.offset)):
                self._judge(r, before)
            self._after(x)

    def _judge(self, r: Record, stream_clock: int | None) -> None:
        p = self.parts[r.partition]
        u = self.policy.unit_us
        t = r.t if r.t == END_OF_STREAM_US else (r.t // u) * u
        p.last = r.arrival
        if r.is_bound:
            p.wb = t if p.wb is None else max(p.wb, t)
            return
        c = self.part_clock(p)
        if c is not None and t < c:
            if self.policy.name == "reject":
                raise LateRowError(f"partition {r.partition} offset {r.offset}")
            if c == p.wb:
                reason = REASON_BELOW_BOUND
            else:
                reason = REASON_BELOW_RANGE if self.policy.holds else REASON_LATE
            self.discarded.append((r.partition, r.offset, t, reason, c))
            return
        p.ref = t if p.ref is None else max(p.ref, t)
        if stream_clock is not None and t < stream_clock:
            if self.policy.name == "reject":
                raise LateRowError(f"partition {r.partition} offset {r.offset} (idle)")
            self.discarded.append((r.partition, r.offset, t, REASON_IDLE, stream_clock))
            return
        p.kept.append((t, r.offset))

    def _after(self, x: int) -> None:
        clocks = []
        for p in self.parts:
            idle = p.last is not None and x > p.last + self.timeout_us
            if not idle:
                clocks.append(self.part_clock(p))
        if not clocks or any(c is None for c in clocks):
            return
        low = min(c for c in clocks if c is not None)
        self.clock = low if self.clock is None else max(self.clock, low)

    def idle(self) -> list[int]:
        """The partitions idle after the last record fed."""
        lasts = [p.last for p in self.parts if p.last is not None]
        if not lasts:
            return []
        x = max(lasts)
        return [
            i
            for i, p in enumerate(self.parts)
            if p.last is not None and x > p.last + self.timeout_us
        ]

    def emitted(self) -> dict[int, list[tuple[int, int]]]:
        """Per partition, the kept rows emitted by the current stream clock, as (offset,
        rowtime) in emission order (rowtime, then offset)."""
        out: dict[int, list[tuple[int, int]]] = {}
        s = self.clock
        for i, p in enumerate(self.parts):
            rows = []
            for t, off in p.kept:
                if s is None or t > s:
                    continue
                released = not self.policy.holds or t < s
                if self.policy.holds and p.ref is not None:
                    released |= t < p.ref - self.policy.range_us
                if p.wb is not None:
                    released |= t <= p.wb
                if released:
                    rows.append((t, off))
            out[i] = [(off, t) for t, off in sorted(rows)]
        return out

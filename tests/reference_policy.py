"""A row-at-a-time transcription of SPEC section 6, kept deliberately naive.

The vectorised engine in ``pyspark_rowtime.bounds.policies`` is checked against it on thousands
of generated streams. It holds rows in a list and releases them exactly as the SPEC words it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.bounds.errors import LateRowError
from pyspark_rowtime.bounds.policies import Policy


@dataclass
class ReferencePolicy:
    policy: Policy
    ref: int | None = None
    wb: int | None = None
    held: list[tuple[int, int]] = field(default_factory=list)  # (rowtime, offset)
    out: list[tuple[int, int]] = field(default_factory=list)  # (offset, rowtime)
    discarded: list[tuple[int, int, int]] = field(default_factory=list)  # (offset, rowtime, clock)
    clocks: list[int | None] = field(default_factory=list)
    offset: int = 0

    def clock(self) -> int | None:
        line = None if self.ref is None else self.ref - self.policy.range_us
        if line is None:
            return self.wb
        if self.wb is None:
            return line
        return max(line, self.wb)

    def _release(self, predicate) -> None:
        ready = sorted(h for h in self.held if predicate(h[0]))
        self.held = [h for h in self.held if not predicate(h[0])]
        self.out.extend((o, t) for t, o in ready)

    def push(self, t: int, is_bound: bool) -> None:
        u = self.policy.unit_us
        if t != END_OF_STREAM_US:
            t = (t // u) * u
        off = self.offset
        self.offset += 1
        if is_bound:
            if self.wb is None or t > self.wb:
                self.wb = t
            wb = self.wb
            self._release(lambda x: x <= wb)
        else:
            c = self.clock()
            if c is not None and t < c:
                if self.policy.name == "reject":
                    raise LateRowError(f"offset {off}")
                self.discarded.append((off, t, c))
            else:
                self.ref = t if self.ref is None else max(self.ref, t)
                if not self.policy.holds:
                    self.out.append((off, t))
                else:
                    self.held.append((t, off))
                    line = self.ref - self.policy.range_us
                    wb = self.wb
                    self._release(lambda x: x < line or (wb is not None and x <= wb))
        self.clocks.append(self.clock())

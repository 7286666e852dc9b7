"""Planning a step over a whole stream: policies per partition, then alignment across them.

A stream's clock is the minimum of its partitions' clocks (SPEC 5). A released row is emitted
only once its rowtime is at or below the stream clock, so a partition that runs ahead waits for
the others and a max-based watermark downstream (Spark's) never passes a row still to come.

Everything a step decides lives in a :class:`StreamPosition`, a JSON dict of primitives that a
Spark offset carries. Replaying the same step from the same position over the same records gives
the same rows and the same bound (SPEC 7).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .bounds import merge_clock
from .errors import OffsetError
from .policies import Classified, PartitionScan, PartitionState, classify
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
        """A position as :meth:`to_dict` wrote it; :class:`OffsetError` for anything else."""
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

"""overlap_join's per-key step, without Spark: batch after batch, as Spark calls it.

The results over all batches must be exactly the brute-force join of every left row with every
right row whose validities overlap (each pair once, valid in the intersection), while the state
keeps only intervals that end after the watermark.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from pyspark_rowtime.bounds.intervals import INFINITY_US, ValidityInterval, combine
from pyspark_rowtime.windows.join import Side, join_step, overlap_pairs


def test_overlap_pairs_are_half_open() -> None:
    i, j = overlap_pairs(
        np.array([0, 10, 5]), np.array([10, 20, 5]), np.array([10, 9]), np.array([15, 11])
    )
    # [0,10) touches [10,15) only: no overlap; [5,5) is empty: overlaps nothing.
    assert sorted(zip(i.tolist(), j.tolist(), strict=True)) == [(0, 1), (1, 0), (1, 1)]


def side(rows: list[tuple[int, int, str]]) -> Side:
    return Side(
        np.array([r[0] for r in rows], dtype=np.int64),
        np.array([r[1] for r in rows], dtype=np.int64),
        [r[2] for r in rows],
    )


Rows = list[tuple[int, int, str]]


def streams(seed: int) -> tuple[list[tuple[Rows, Rows]], list[int]]:
    """Batches of (start, end, name) per side; each side's starts never go below its clock,
    the clock being the highest start so far (as the rowtime reader guarantees)."""
    rnd = random.Random(seed)
    clocks = [0, 0]
    batches: list[tuple[Rows, Rows]] = []
    after: list[int] = []
    for b in range(12):
        sides: list[Rows] = [[], []]
        for s in (0, 1):
            for k in range(rnd.randint(0, 4)):
                clocks[s] += rnd.choice([0, 1000, 2500, 7000])
                length = rnd.choice([0, 500, 3000, 20_000, INFINITY_US - clocks[s]])
                sides[s].append((clocks[s], clocks[s] + length, f"{'lr'[s]}{b}.{k}"))
            clocks[s] += rnd.choice([0, 4000])  # a bound moves the clock without rows
        batches.append((sides[0], sides[1]))
        after.append(min(clocks))
    return batches, after


@pytest.mark.parametrize("seed", range(20))
def test_join_step_over_batches_equals_the_brute_force_join(seed: int) -> None:
    batches, clocks = streams(seed)
    state = (Side(), Side())
    got = []
    watermark_ms = 0
    most_kept = 0
    for (lft, rgt), clock in zip(batches, clocks, strict=True):
        step = join_step(state, (side(lft), side(rgt)), watermark_ms)
        got += step.results
        state = step.state or (Side(), Side())
        most_kept = max(most_kept, step.kept)
        for s in state:  # only what may still overlap a later row stays
            assert np.all(s.end > watermark_ms * 1000) and np.all(s.start < s.end)
        # Spark's watermark for the next batch: the lower clock minus 1 ms, in whole ms.
        watermark_ms = max(watermark_ms, (clock - 1000) // 1000)
    lefts = [r for lft, _ in batches for r in lft]
    rights = [r for _, rgt in batches for r in rgt]
    expected = []
    for ls, le, ln in lefts:
        for rs, re, rn in rights:
            if ls < le and rs < re:
                both = combine(ValidityInterval(ls, le), ValidityInterval(rs, re))
                if both is not None:
                    expected.append((ln, rn, both.start_us, both.end_us))
    assert sorted(got) == sorted(expected)
    assert len(got) == len(set(got))


def test_state_drops_intervals_that_ended_before_the_watermark() -> None:
    old = (side([(0, 5000, "a"), (0, INFINITY_US, "forever")]), side([(1000, 9000, "b")]))
    step = join_step(old, (Side(), Side()), watermark_ms=6)
    assert step.results == []
    assert step.state is not None
    assert step.state[0].rows == ["forever"] and step.state[1].rows == ["b"]
    # The next wake-up: once the watermark is above ceil(9000 / 1000) - 1 = 8 ms.
    assert step.timeout_ms == 8
    # Only intervals valid until the end of stream: wake up when both streams end.
    forever = join_step((side([(0, INFINITY_US, "f")]), Side()), (Side(), Side()), 6)
    assert forever.timeout_ms is not None and forever.timeout_ms + 1 == INFINITY_US // 1000 - 1
    # Both streams ended (Spark's watermark: the end of stream minus 1 ms): nothing stays.
    assert join_step(old, (Side(), Side()), watermark_ms=INFINITY_US // 1000 - 1).state is None

"""Benchmark: the ordering policies over 10 million rowtimes, beside numpy's own sort.

The Spark driver runs these on every new rowtime, so they must not be the bottleneck.
Run: ./dev bench core [--rows N]
"""

from __future__ import annotations

import argparse

import numpy as np
from benchutil import best_of

from pyspark_rowtime.bounds.plan import StreamPosition, step
from pyspark_rowtime.bounds.policies import (
    AdjustPolicy,
    DropPolicy,
    Policy,
    RejectPolicy,
    scan_partition,
)


def one_step(policy: Policy, t: np.ndarray, b: np.ndarray) -> None:
    pos = StreamPosition.start([0])
    scan = scan_partition(policy, pos.partitions[0], t, b)
    step(pos, [scan])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    n = ap.parse_args().rows
    rng = np.random.default_rng(7)
    start = 1_700_000_000_000_000
    in_order = start + np.cumsum(rng.integers(0, 200, n), dtype=np.int64)  # ~100 us apart
    jittered = in_order.copy()
    late = rng.random(n) < 0.01
    jittered[late] -= rng.integers(1, 500_000, int(late.sum()))  # up to 0.5 s late, within range
    no_bounds = np.zeros(n, dtype=bool)

    sort_s = best_of(lambda: np.sort(jittered, kind="stable"))
    print(f"rowtimes: {n:,}; numpy stable sort of the jittered array: {sort_s * 1e3:.0f} ms "
          f"({n / sort_s / 1e6:.1f} M rows/s)")  # fmt: skip
    cases = [
        ("reject, in order", RejectPolicy(), in_order),
        ("drop, in order", DropPolicy(), in_order),
        ("adjust msec/999, in order", AdjustPolicy("msec", 999), in_order),
        ("drop, 1% late", DropPolicy(), jittered),
        ("adjust msec/999, 1% out of order in range", AdjustPolicy("msec", 999), jittered),
    ]
    print(f"{'case':<44}{'ms':>8}{'M rows/s':>10}{'vs sort':>9}")
    for name, policy, t in cases:
        s = best_of(lambda policy=policy, t=t: one_step(policy, t, no_bounds))
        print(f"{name:<44}{s * 1e3:8.0f}{n / s / 1e6:10.1f}{sort_s / s:9.2f}")


if __name__ == "__main__":
    main()

"""The demo's data set has the properties the demo claims, and its brute-force answers agree
with the row-at-a-time transcription of SPEC 6 (no Spark)."""

from __future__ import annotations

import numpy as np
import pytest
from reference_policy import ReferencePolicy

from pyspark_rowtime.bounds.policies import make_policy
from pyspark_rowtime.cli import build_parser
from pyspark_rowtime.demo_data import (
    ADJUST_RANGE_S,
    JITTER_S,
    SECOND,
    DemoConfig,
    adjust_discards,
    expected,
    generate,
    log_order,
)

SMALL = DemoConfig(rows=8000, partitions=3, minutes=6, tick_s=90, seed=3)


def test_same_config_same_data() -> None:
    a, b = generate(SMALL), generate(SMALL)
    for p in range(SMALL.partitions):
        assert np.array_equal(a.rowtime[p], b.rowtime[p])
        assert np.array_equal(a.arrival[p], b.arrival[p])
        assert np.array_equal(a.lane_flow[p], b.lane_flow[p])
    assert np.array_equal(a.bounds, b.bounds)


def test_skew_disorder_lateness_and_gap() -> None:
    data = generate(SMALL)
    assert data.lags_s[-1] - data.lags_s[0] >= 180  # districts skewed by minutes
    g0, g1 = data.gap_us
    for p in range(SMALL.partitions):
        t, a, late = data.rowtime[p], data.arrival[p], data.too_late[p]
        assert np.all(np.diff(a) >= 0)  # replayed in arrival order
        assert not np.any((a >= g0) & (a < g1))  # nothing arrives in the quiet gap
        delay = a - t - data.lags_s[p] * SECOND
        assert np.all((delay[~late] >= 0) & (delay[~late] < JITTER_S * SECOND))
        assert np.all(delay[late] >= 90 * SECOND) and late.any()
        # out of order: some reading arrives after a later-measured one
        assert np.any(np.diff(t[~late]) < 0)


def test_bounds_are_promises_the_log_accepts() -> None:
    """A bound is never below what the partition already holds (the writer would refuse it),
    bounds only grow, and only far-too-late readings break them."""
    data = generate(SMALL)
    for p in range(SMALL.partitions):
        t, is_bound, row = log_order(data, p)
        top = -1
        for i in range(len(t)):
            if is_bound[i]:
                assert t[i] >= top
            elif top >= 0 and t[i] < top and not data.too_late[p][row[i]]:
                # a punctual reading below an earlier bound would be a broken promise
                assert not is_bound[:i].any() or t[i] >= t[:i][is_bound[:i]].max()
            top = max(top, int(t[i]))
        assert (data.bounds[:, p] >= 0).any(), "the adapters send bounds in the gap"


def test_brute_force_discards_match_the_spec_transcription() -> None:
    data = generate(SMALL)
    policy = make_policy("adjust", unit="sec", range=ADJUST_RANGE_S)
    discarded, best = expected(data)
    for p in range(SMALL.partitions):
        t, is_bound, row = log_order(data, p)
        ref = ReferencePolicy(policy)
        for ti, bi in zip(t.tolist(), is_bound.tolist(), strict=True):
            ref.push(ti, bi)
        assert {row[o] for o, _t, _c in ref.discarded} == set(np.flatnonzero(discarded[p]))
        assert np.array_equal(adjust_discards(t, is_bound), np.isin(np.arange(len(t)),
                              [o for o, _t, _c in ref.discarded]))  # fmt: skip
        assert set(np.flatnonzero(discarded[p])) <= set(np.flatnonzero(data.too_late[p]))
    starts = {start for _fw, start in best}
    assert len(best) == 4 * len(starts)  # every freeway has a maximum in every pane


def test_demo_help_lists_its_options() -> None:
    text = build_parser()._subparsers._group_actions[0].choices["demo"].format_help()  # type: ignore[union-attr]
    for option in ("--rows", "--tick", "--out", "--partitions", "--minutes", "--no-figure"):
        assert option in text
    assert "data size" in text and "speed" in text and "output folder" in text


@pytest.mark.parametrize("bad", [{"rows": 10}, {"partitions": 1}, {"minutes": 1}, {"tick_s": 1}])
def test_bad_config_says_what_to_give(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="give"):
        DemoConfig(**bad)

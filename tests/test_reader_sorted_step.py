"""The driver's fast path for in-order records (datasource.reader.sorted_step) decides exactly
what the general path (classify_pieces: scan_partition + classify) decides: the same partition
state and the same emitted offsets, step after step, under every policy; and it is taken for
in-order records, so the reader's planning really is the cheap one there."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_strategies import POLICIES, streams

from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.bounds.policies import (
    AdjustPolicy,
    LateRowError,
    PartitionState,
    Policy,
    RejectPolicy,
)
from pyspark_rowtime.datasource.reader import (
    EmitRuns,
    classify_pieces,
    clock_at_end,
    sorted_step,
)


def general(policy, st_, t, b, before, after, piece):  # type: ignore[no-untyped-def]
    """The general path as Planner.plan runs it: the last state and the emitted mask's runs."""
    emitted = np.zeros(len(t), dtype=bool)
    last = None
    for first, c in classify_pieces(
        policy, st_, t, b, before, after, "p", piece=piece, order=False
    ):
        emitted[c.emit_set + (first - st_.scan)] = True
        last = c
    assert last is not None
    return last.state, EmitRuns.of_mask(emitted, st_.scan)


def same_runs(a: EmitRuns | None, b: EmitRuns) -> bool:
    assert a is not None
    return np.array_equal(a.starts, b.starts) and np.array_equal(a.ends, b.ends)


def in_order(t: np.ndarray, b: np.ndarray, policy: Policy) -> bool:
    unit = policy.unit_us
    tt = np.where(b & (t == END_OF_STREAM_US), t, (t // unit) * unit)
    return bool(np.all(tt[1:] >= tt[:-1]))


@settings(max_examples=400, deadline=None)
@given(
    policy=POLICIES,
    records=streams(max_len=80),
    cuts=st.lists(st.integers(0, 80), max_size=4),
    lag=st.lists(st.integers(0, 3), min_size=5, max_size=5),
    piece=st.sampled_from([1, 3, 1 << 18]),
)
def test_the_fast_path_decides_what_the_general_path_decides(
    policy: Policy, records, cuts, lag, piece
) -> None:  # type: ignore[no-untyped-def]
    t_all, b_all = records
    ends = sorted({min(c, len(t_all)) for c in cuts} | {len(t_all)})
    state = PartitionState(next=0, scan=0)
    clock: int | None = None
    for k, end in enumerate(ends):
        t = t_all[state.scan : end]
        b = b_all[state.scan : end]
        if not len(t):
            continue
        partition_clock = clock_at_end(policy, state, t, b)
        # The stream clock after the step: the partition's, or lower (another partition lags
        # behind), never below the clock before.
        after = partition_clock
        if after is not None and lag[k % len(lag)]:
            after = after - lag[k % len(lag)] * policy.unit_us
        if clock is not None and (after is None or after < clock):
            after = clock
        try:
            want_state, want_runs = general(policy, state, t, b, clock, after, piece)
        except LateRowError:
            # reject's late row: the fast path must not have taken this window
            assert sorted_step(policy, state, t, b, clock, after) is None
            return
        got = sorted_step(policy, state, t, b, clock, after)
        if got is not None:
            assert got[0] == want_state
            assert same_runs(want_runs, got[1])
        state, clock = want_state, after


def test_in_order_records_take_the_fast_path_and_emit_up_to_the_stream_clock() -> None:
    t = np.arange(0, 1000, dtype=np.int64) * 10
    b = np.zeros(len(t), dtype=bool)
    b[[100, 500]] = True  # bound records equal to the rows around them stay in order
    t[100], t[500] = t[99], t[499]
    for policy in (RejectPolicy(), AdjustPolicy(unit="usec", range=50)):
        start = PartitionState(next=0, scan=0)
        partition_clock = clock_at_end(policy, start, t, b)
        assert partition_clock is not None
        stream_clock = 4000  # another partition is behind: rows above 4000 wait
        got = sorted_step(policy, start, t, b, None, stream_clock)
        assert got is not None
        state, runs = got
        want_state, want_runs = general(policy, start, t, b, None, stream_clock, 1 << 18)
        assert state == want_state and same_runs(want_runs, runs)
        assert list(zip(runs.starts.tolist(), runs.ends.tolist(), strict=True)) == [
            (0, 100),
            (101, 401),
        ]
        assert state.scan == 401  # the first row above the stream clock is still alive
        if isinstance(policy, AdjustPolicy):
            assert state.held == 6  # the rows at or above 9990 - 50: 9940, 9950, ..., 9990
    out_of_order = t.copy()
    out_of_order[10], out_of_order[11] = out_of_order[11], out_of_order[10]
    assert sorted_step(RejectPolicy(), PartitionState(0, 0), out_of_order, b, None, 10) is None


def test_adjust_holds_in_order_rows_at_the_reference_time_though_the_clock_covers_them() -> None:
    """Under adjust a row is released below ``reference - range`` (strictly) or at or below the
    writer's bound; the clock is ``max(reference - range, bound)``, so rows equal to it are
    within the clock yet held: the fast path must not emit them (nor count them done later)."""
    policy = AdjustPolicy(unit="usec", range=0)
    t = np.array([1, 2, 3, 3, 4, 4], dtype=np.int64)
    b = np.zeros(len(t), dtype=bool)
    first = PartitionState(next=0, scan=0)
    clock = clock_at_end(policy, first, t[:4], b[:4])
    assert clock == 3
    got = sorted_step(policy, first, t[:4], b[:4], None, clock)
    assert got is not None
    state, runs = got
    assert (runs.starts.tolist(), runs.ends.tolist()) == ([0], [2])  # 1 and 2; both 3s held
    assert (state.scan, state.held) == (2, 2)
    # the next step: a 4 releases the 3s, which the stream clock (now 4) covers
    got2 = sorted_step(policy, state, t[2:], b[2:], clock, 4)
    want2 = general(policy, state, t[2:], b[2:], clock, 4, 1 << 18)
    assert got2 is not None and got2[0] == want2[0] and same_runs(want2[1], got2[1])
    assert (got2[1].starts.tolist(), got2[1].ends.tolist()) == ([2], [4])

"""The ordering policies (SPEC 6) and their worked examples (SPEC 11)."""

from __future__ import annotations

import itertools
from datetime import datetime, timezone

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.bounds.errors import (
    HeldRowsOverflowError,
    LateRowError,
    OptionError,
    RowtimeError,
)
from pyspark_rowtime.bounds.policies import (
    REASON_BELOW_BOUND,
    REASON_BELOW_RANGE,
    AdjustPolicy,
    DropPolicy,
    Policy,
    PolicyRun,
    RejectPolicy,
    make_policy,
)
from reference_policy import ReferencePolicy

BASE_US = int(datetime(2009, 3, 1, 12, 15, tzinfo=timezone.utc).timestamp()) * 1_000_000


def sdp(seconds: str) -> int:
    """'22.345678901' seconds after 12:15:00, truncated to microseconds."""
    whole, frac = seconds.split(".")
    return BASE_US + int(whole) * 1_000_000 + int(frac[:6])


# Seed 000, tuples A to E in arrival order, then end of stream.
SEED = [("A", "22.345678901"), ("B", "22.123456789"), ("C", "23.123456789"),
        ("D", "22.890123456"), ("E", "24.123456789")]  # fmt: skip


@pytest.mark.parametrize(
    ("unit", "range_", "expected", "discarded"),
    [
        ("sec", 1, [("A", "22"), ("B", "22"), ("D", "22"), ("C", "23"), ("E", "24")], []),
        ("msec", 999,
         [("B", "22.123"), ("A", "22.345"), ("D", "22.890"), ("C", "23.123"), ("E", "24.123")],
         []),
        ("usec", 999, [("A", "22.345678"), ("C", "23.123456"), ("E", "24.123456")], ["B", "D"]),
        ("sec", 0, [("A", "22"), ("B", "22"), ("C", "23"), ("E", "24")], ["D"]),
    ],
)  # fmt: skip
def test_spec_section_11_worked_examples(unit, range_, expected, discarded):
    run = PolicyRun(AdjustPolicy(unit=unit, range=range_))
    names = [n for n, _ in SEED] + ["<end>"]
    t = np.array([sdp(s) for _, s in SEED] + [END_OF_STREAM_US], dtype=np.int64)
    is_bound = np.array([False] * 5 + [True])
    out = run.push(t, is_bound)
    got = [(names[o], r) for o, r in zip(out.offsets, out.rowtime_us, strict=True)]
    want = [(n, BASE_US + round(float(s) * 1_000_000)) for n, s in expected]
    assert got == want
    assert [names[o] for o in out.discarded_offsets] == discarded
    assert run.clock_us == END_OF_STREAM_US
    assert run.state.held == 0


def test_seed_examples_fed_one_row_at_a_time_match_the_single_push():
    for unit, range_ in [("sec", 1), ("msec", 999), ("usec", 999), ("sec", 0)]:
        whole = PolicyRun(AdjustPolicy(unit=unit, range=range_))
        t = np.array([sdp(s) for _, s in SEED] + [END_OF_STREAM_US], dtype=np.int64)
        b = np.array([False] * 5 + [True])
        expected = whole.push(t, b)
        step = PolicyRun(AdjustPolicy(unit=unit, range=range_))
        offsets: list[int] = []
        for i in range(len(t)):
            offsets += step.push(t[i : i + 1], b[i : i + 1]).offsets.tolist()
        assert offsets == expected.offsets.tolist()


def test_discarded_rows_carry_reason_and_clock():
    run = PolicyRun(AdjustPolicy(unit="usec", range=10))
    out = run.push(np.array([100, 50, 200, 150, 190], dtype=np.int64), np.zeros(5, dtype=bool))
    assert out.discarded_offsets.tolist() == [1, 3]
    assert out.discarded_clock_us.tolist() == [90, 190]
    assert out.discarded_reason == [REASON_BELOW_RANGE, REASON_BELOW_RANGE]
    out = run.push(np.array([500, 400], dtype=np.int64), np.array([True, False]))
    assert out.discarded_offsets.tolist() == [6]
    assert out.discarded_reason == [REASON_BELOW_BOUND]
    assert run.state.discarded == 3


def test_reject_names_partition_offset_rowtime_and_clock():
    run = PolicyRun(RejectPolicy(), where="stream 'orders' partition 1")
    run.push(np.array([10, 20], dtype=np.int64), np.zeros(2, dtype=bool))
    before = run.snapshot()
    with pytest.raises(LateRowError) as err:
        run.push(np.array([30, 25], dtype=np.int64), np.zeros(2, dtype=bool))
    msg = str(err.value)
    assert "stream 'orders' partition 1" in msg and "offset 3" in msg
    assert "25 us" in msg and "30 us" in msg and "order=drop" in msg
    assert isinstance(err.value, ValueError) and isinstance(err.value, RowtimeError)
    assert run.snapshot() == before  # nothing moved


def test_drop_releases_at_once_and_discards_late_rows():
    run = PolicyRun(DropPolicy())
    out = run.push(np.array([10, 5, 10, 30, 20], dtype=np.int64), np.zeros(5, dtype=bool))
    assert out.offsets.tolist() == [0, 2, 3]
    assert out.discarded_offsets.tolist() == [1, 4]
    assert run.clock_us == 30


def test_bound_releases_held_rows_below_it_and_ties_at_it():
    run = PolicyRun(AdjustPolicy(unit="usec", range=1000))
    out = run.push(np.array([100, 90, 95], dtype=np.int64), np.zeros(3, dtype=bool))
    assert out.offsets.tolist() == []
    assert run.clock_us == 100 - 1000
    out = run.push(np.array([95], dtype=np.int64), np.array([True]))
    assert out.offsets.tolist() == [1, 2]  # 90 and the tie at 95; 100 is still held
    assert run.clock_us == 95
    assert run.state.held == 1


def test_max_held_overflow_fails_clearly_and_keeps_state():
    run = PolicyRun(AdjustPolicy(unit="usec", range=1000, max_held=3))
    run.push(np.array([1, 2, 3], dtype=np.int64), np.zeros(3, dtype=bool))
    snap = run.snapshot()
    with pytest.raises(HeldRowsOverflowError, match=r"adjust.maxHeld=3.*nothing was lost"):
        run.push(np.array([4], dtype=np.int64), np.zeros(1, dtype=bool))
    assert run.snapshot() == snap


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"order": "sort"}, "order must be one of reject, drop, adjust; got 'sort'"),
        ({"order": "adjust", "unit": "min"}, "adjust.unit must be one of sec, msec, usec"),
        ({"order": "adjust", "range": -1}, r"adjust.range must be a whole number of usec >= 0"),
        ({"order": "adjust", "max_held": 0}, r"adjust.maxHeld must be .* > 0; got 0"),
    ],
)
def test_bad_policy_options_name_the_option(kwargs, match):
    with pytest.raises(OptionError, match=match):
        make_policy(**kwargs)


# ---------------------------------------------------------------------------- properties

POLICIES = st.one_of(
    st.just(RejectPolicy()),
    st.just(DropPolicy()),
    st.builds(
        AdjustPolicy,
        unit=st.sampled_from(["usec", "msec", "sec"]),
        range=st.integers(0, 30),
        max_held=st.just(10**9),
    ),
)


@st.composite
def streams(draw, max_len=60):
    """Records (rowtime or bound, is_bound), mostly increasing with jitter, bounds sprinkled."""
    n = draw(st.integers(0, max_len))
    scale = draw(st.sampled_from([1, 1000, 1_000_000]))
    jitter = draw(st.integers(0, 40))
    now = draw(st.integers(-(10**6), 10**6)) * scale
    t, b = [], []
    bound = None
    for _ in range(n):
        now += draw(st.integers(0, 10)) * scale
        if draw(st.integers(0, 9)) == 0:
            value = now + draw(st.integers(-5, 5)) * scale
            bound = value if bound is None else max(bound, value)
            t.append(bound)
            b.append(True)
        else:
            t.append(now - draw(st.integers(0, jitter)) * scale)
            b.append(False)
    if draw(st.booleans()):
        t.append(END_OF_STREAM_US)
        b.append(True)
    return np.array(t, dtype=np.int64), np.array(b, dtype=bool)


def reference(policy: Policy, t, b):
    ref = ReferencePolicy(policy)
    for x, y in zip(t.tolist(), b.tolist(), strict=True):
        ref.push(x, y)
    return ref


def tolerant(policy: Policy) -> Policy:
    return DropPolicy() if isinstance(policy, RejectPolicy) else policy


@given(policy=POLICIES, data=streams(), cuts=st.lists(st.integers(0, 70), max_size=6))
def test_vectorised_engine_equals_row_at_a_time_reference(policy, data, cuts):
    policy = tolerant(policy)
    t, b = data
    ref = reference(policy, t, b)
    run = PolicyRun(policy)
    offsets, rowtimes, discarded = [], [], []
    bounds = sorted({0, len(t), *[min(c, len(t)) for c in cuts]})
    for lo, hi in itertools.pairwise(bounds):
        out = run.push(t[lo:hi], b[lo:hi])
        offsets += out.offsets.tolist()
        rowtimes += out.rowtime_us.tolist()
        discarded += out.discarded_offsets.tolist()
        assert run.clock_us == ref.clocks[hi - 1] if hi else True
    assert list(zip(offsets, rowtimes, strict=True)) == ref.out
    assert discarded == [d[0] for d in ref.discarded]
    assert run.state.held == len(ref.held)


@given(policy=POLICIES, data=streams(), cut=st.integers(0, 70))
def test_released_in_order_clock_monotone_and_every_row_accounted_once(policy, data, cut):
    policy = tolerant(policy)
    t, b = data
    cut = min(cut, len(t))
    run = PolicyRun(policy)
    released, discarded, clocks = [], [], []
    for lo, hi in [(0, cut), (cut, len(t))]:
        out = run.push(t[lo:hi], b[lo:hi])
        released += list(zip(out.rowtime_us.tolist(), out.offsets.tolist(), strict=True))
        discarded += out.discarded_offsets.tolist()
        clocks.append(run.clock_us)
    # ascending rowtime, ties in arrival order
    assert released == sorted(released)
    # the clock never moves back, and no released row is below the clock before it
    known = [c for c in clocks if c is not None]
    assert known == sorted(known)
    # every data row: released, discarded or held, exactly once
    rows = set(np.flatnonzero(~b).tolist())
    out_offsets = [o for _, o in released]
    assert len(out_offsets) == len(set(out_offsets))
    assert not set(out_offsets) & set(discarded)
    assert len(out_offsets) + len(discarded) + run.state.held == len(rows)
    assert set(out_offsets) | set(discarded) <= rows
    if len(b) and b[-1] and t[-1] == END_OF_STREAM_US:
        assert run.state.held == 0


@given(policy=POLICIES, data=streams(), cut=st.integers(0, 70), cut2=st.integers(0, 70))
def test_snapshot_and_resume_at_any_point_equals_an_uninterrupted_run(policy, data, cut, cut2):
    policy = tolerant(policy)
    t, b = data
    cut, cut2 = sorted([min(cut, len(t)), min(cut2, len(t))])
    whole = PolicyRun(policy)
    expected = whole.push(t, b)

    first = PolicyRun(policy)
    a = first.push(t[:cut], b[:cut])
    snap = first.snapshot()
    assert set(snap) >= {"next", "scan", "ref", "bound"}
    assert all(v is None or isinstance(v, int) for v in snap.values())  # JSON of primitives
    resumed = PolicyRun(policy, snap)
    start = resumed.needs_from
    assert start <= cut
    r1 = resumed.push(t[start:cut2], b[start:cut2], first_offset=start)
    r2 = resumed.push(t[cut2:], b[cut2:])
    got = a.offsets.tolist() + r1.offsets.tolist() + r2.offsets.tolist()
    assert got == expected.offsets.tolist()
    disc = a.discarded_offsets.tolist() + r1.discarded_offsets.tolist()
    disc += r2.discarded_offsets.tolist()
    assert disc == expected.discarded_offsets.tolist()
    assert resumed.snapshot() == whole.snapshot()


@given(data=streams())
def test_reject_raises_exactly_where_the_reference_does(data):
    t, b = data
    ref = ReferencePolicy(RejectPolicy())
    want = None
    for i, (x, y) in enumerate(zip(t.tolist(), b.tolist(), strict=True)):
        try:
            ref.push(x, y)
        except LateRowError:
            want = i
            break
    run = PolicyRun(RejectPolicy())
    if want is None:
        run.push(t, b)
    else:
        with pytest.raises(LateRowError, match=f"offset {want}:"):
            run.push(t, b)

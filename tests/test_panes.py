"""IBM Streams timeInterval panes (SPEC section 10, seed 002)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyspark_rowtime.bounds.errors import BoundError, InvalidRowtimeError, OptionError
from pyspark_rowtime.bounds.panes import (
    PaneResult,
    TimeIntervalSpec,
    TimeIntervalWindow,
    assign_panes,
    assign_panes_array,
)

S = 1_000_000  # microseconds per second
MIN = 60 * S
H = 3600 * S


# ---------------------------------------------------------------------------------------------
# Validation

SPEC_US: list[tuple[str, dict[str, Any], tuple[int, int, int, int]]] = [
    ("tumbling default", {"interval_duration_s": 3600.0}, (H, H, 0, 0)),
    ("seed: one hour every 20 minutes",
     {"interval_duration_s": 3600.0, "creation_period_s": 1200.0}, (H, 20 * MIN, 0, 0)),
    ("seed: offset 1200", {"interval_duration_s": 3600.0, "interval_offset_s": 1200.0},
     (H, H, 0, 20 * MIN)),
    ("seed: traffic flow", {"interval_duration_s": 50.0, "creation_period_s": 25.0,
                            "discard_age_s": 1000.0}, (50 * S, 25 * S, 1000 * S, 0)),
    ("float seconds read as printed", {"interval_duration_s": 0.1, "discard_age_s": 0.3},
     (100_000, 100_000, 300_000, 0)),
    ("microsecond precision", {"interval_duration_s": 0.000001}, (1, 1, 0, 0)),
    ("int and Decimal seconds", {"interval_duration_s": 10, "discard_age_s": Decimal("2.5")},
     (10 * S, 10 * S, 2_500_000, 0)),
    ("gaps allowed", {"interval_duration_s": 10, "creation_period_s": 30}, (10 * S, 30 * S, 0, 0)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "expected"), [c[1:] for c in SPEC_US], ids=[c[0] for c in SPEC_US]
)
def test_spec_converts_seconds_to_exact_microseconds(
    kwargs: dict[str, Any], expected: tuple[int, int, int, int]
) -> None:
    spec = TimeIntervalSpec(**kwargs)
    got = (
        spec.interval_duration_us,
        spec.creation_period_us,
        spec.discard_age_us,
        spec.interval_offset_us,
    )
    assert got == expected


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("zero duration", {"interval_duration_s": 0.0}, "intervalDuration=0.0 must be greater than 0"),
    ("negative duration", {"interval_duration_s": -1}, "intervalDuration=-1"),
    ("zero creation period", {"interval_duration_s": 1, "creation_period_s": 0},
     "creationPeriod=0 must be greater than 0"),
    ("negative discard age", {"interval_duration_s": 1, "discard_age_s": -0.5},
     "discardAge=-0.5 must be 0 or more"),
    ("offset equal to duration", {"interval_duration_s": 3600, "interval_offset_s": 3600},
     "intervalOffset=3600 must be in [0, intervalDuration)"),
    ("negative offset", {"interval_duration_s": 3600, "interval_offset_s": -1},
     "intervalOffset=-1"),
    ("sub-microsecond", {"interval_duration_s": 1e-7}, "finer than a microsecond"),
    ("bool", {"interval_duration_s": True}, "intervalDuration=True is not a number"),
    ("string", {"interval_duration_s": "1h"}, "intervalDuration='1h' is not a number"),
    ("nan", {"interval_duration_s": float("nan")}, "intervalDuration=nan must be a finite"),
    ("infinite discard age", {"interval_duration_s": 1, "discard_age_s": float("inf")},
     "discardAge=inf"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_spec_rejects_with_ibm_parameter_names(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionError) as info:
        TimeIntervalSpec(**kwargs)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_offset_error_says_why() -> None:
    with pytest.raises(OptionError, match="same panes"):
        TimeIntervalSpec(3600, interval_offset_s=4000)


def test_spec_is_frozen_and_compares_by_parameters() -> None:
    spec = TimeIntervalSpec(3600.0, 1200.0)
    with pytest.raises(AttributeError):
        spec.discard_age_s = 1.0  # type: ignore[misc]
    assert spec == TimeIntervalSpec(3600.0, 1200.0)


# ---------------------------------------------------------------------------------------------
# Assignment

HOURLY_20 = TimeIntervalSpec(3600.0, creation_period_s=1200.0)
HOURLY_AT_20 = TimeIntervalSpec(3600.0, interval_offset_s=1200.0)
HOURLY = TimeIntervalSpec(3600.0)
GAPPY = TimeIntervalSpec(10.0, creation_period_s=30.0)

ASSIGN: list[tuple[str, TimeIntervalSpec, int, list[tuple[int, int]]]] = [
    ("seed: 00:00 is in three overlapping panes", HOURLY_20, 0,
     [(-40 * MIN, 20 * MIN), (-20 * MIN, 40 * MIN), (0, H)]),
    ("seed: 00:30 is in three overlapping panes", HOURLY_20, 30 * MIN,
     [(-20 * MIN, 40 * MIN), (0, H), (20 * MIN, 80 * MIN)]),
    ("seed: offset 1200 gives [00:20, 01:20)", HOURLY_AT_20, 30 * MIN, [(20 * MIN, 80 * MIN)]),
    ("seed: offset 1200, 00:19:59.999999 is in the pane before", HOURLY_AT_20, 20 * MIN - 1,
     [(-40 * MIN, 20 * MIN)]),
    ("seed: offset 1200, panes are adjacent at 01:20", HOURLY_AT_20, 80 * MIN,
     [(80 * MIN, 140 * MIN)]),
    ("start is included", HOURLY, H, [(H, 2 * H)]),
    ("end is excluded", HOURLY, H - 1, [(0, H)]),
    ("before 1970", HOURLY, -1, [(-H, 0)]),
    ("before 1970, sliding", HOURLY_20, -1,
     [(-60 * MIN, 0), (-40 * MIN, 20 * MIN), (-20 * MIN, 40 * MIN)]),
    ("traffic flow: 50 s every 25 s", TimeIntervalSpec(50.0, 25.0), 30 * S,
     [(0, 50 * S), (25 * S, 75 * S)]),
    ("gap between panes holds no row", GAPPY, 15 * S, []),
    ("gappy pane start", GAPPY, 30 * S, [(30 * S, 40 * S)]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "rowtime_us", "expected"), [c[1:] for c in ASSIGN], ids=[c[0] for c in ASSIGN]
)
def test_assign_panes_table(
    spec: TimeIntervalSpec, rowtime_us: int, expected: list[tuple[int, int]]
) -> None:
    assert assign_panes(rowtime_us, spec) == expected
    rows, starts, ends = assign_panes_array(np.array([rowtime_us]), spec)
    assert list(zip(starts.tolist(), ends.tolist(), strict=True)) == expected
    assert rows.tolist() == [0] * len(expected)


@pytest.mark.parametrize("bad", [1.5, True, "0", None])
def test_assign_panes_rejects_non_int_rowtimes(bad: Any) -> None:
    with pytest.raises(InvalidRowtimeError, match="rowtime_us"):
        assign_panes(bad, HOURLY)


specs = st.builds(
    lambda d, p, o: TimeIntervalSpec(d / S, p / S, 0, (o % d) / S),
    st.integers(1, 5000),
    st.integers(1, 5000),
    st.integers(0, 5000),
)


@given(specs, st.integers(-(10**7), 10**7))
def test_assign_panes_equals_brute_force_enumeration(spec: TimeIntervalSpec, t: int) -> None:
    p, d, o = spec.creation_period_us, spec.interval_duration_us, spec.interval_offset_us
    around = t // p  # every pane containing t has n within (d + o) // p + 2 of this
    reach = (d + o) // p + 2
    brute = [
        (n * p + o, n * p + o + d)
        for n in range(around - reach, around + reach + 1)
        if n * p + o <= t < n * p + o + d
    ]
    assert assign_panes(t, spec) == brute


@given(specs, st.lists(st.integers(-(10**12), 10**12), max_size=40))
def test_assign_panes_array_equals_the_scalar_function(
    spec: TimeIntervalSpec, rowtimes: list[int]
) -> None:
    rows, starts, ends = assign_panes_array(np.array(rowtimes, dtype=np.int64), spec)
    expected = [(i, s, e) for i, t in enumerate(rowtimes) for s, e in assign_panes(t, spec)]
    assert list(zip(rows.tolist(), starts.tolist(), ends.tolist(), strict=True)) == expected


@given(
    st.integers(1, 5000),
    st.integers(0, 5000),
    st.lists(st.integers(-(10**12), 10**12), max_size=40),
)
def test_assign_panes_array_of_tumbling_panes_equals_the_scalar_function(
    d: int, o: int, rowtimes: list[int]
) -> None:
    # Tumbling panes take a path of their own (one pane per row, nothing expanded), which the
    # independent draws of the test above almost never reach.
    spec = TimeIntervalSpec(d / S, None, 0, (o % d) / S)
    rows, starts, ends = assign_panes_array(np.array(rowtimes, dtype=np.int64), spec)
    expected = [(i, s, e) for i, t in enumerate(rowtimes) for s, e in assign_panes(t, spec)]
    assert list(zip(rows.tolist(), starts.tolist(), ends.tolist(), strict=True)) == expected
    assert rows.tolist() == list(range(len(rowtimes)))


# ---------------------------------------------------------------------------------------------
# Trigger policy


def summary(results: list[PaneResult]) -> list[tuple[int, int, list[Any], bool]]:
    return [(r.start_us, r.end_us, r.values, r.retrigger) for r in results]


def test_pane_triggers_when_the_watermark_reaches_its_end() -> None:
    window = TimeIntervalWindow(HOURLY)
    window.insert(10 * MIN, "a")
    window.insert(50 * MIN, "b")
    window.insert(70 * MIN, "c")
    assert window.advance_watermark(H - 1) == []
    results = window.advance_watermark(H)
    assert summary(results) == [(0, H, ["a", "b"], False)]
    assert results[0].rowtime_us == H
    assert summary(window.advance_watermark(2 * H)) == [(H, 2 * H, ["c"], False)]


def test_panes_trigger_in_end_order_and_rows_go_to_every_pane() -> None:
    window = TimeIntervalWindow(HOURLY_20)
    window.insert(0, "x")
    results = window.advance_watermark(H)
    assert summary(results) == [
        (-40 * MIN, 20 * MIN, ["x"], False),
        (-20 * MIN, 40 * MIN, ["x"], False),
        (0, H, ["x"], False),
    ]
    assert [r.rowtime_us for r in results] == [20 * MIN, 40 * MIN, H]


def test_late_row_retriggers_at_the_next_watermark_update_then_discard_closes() -> None:
    """Seed 002: discardAge six hours; a 00:00 row before watermark 07:00 is processed late,
    after watermark 07:00 it is ignored and counted."""
    spec = TimeIntervalSpec(3600.0, creation_period_s=1200.0, discard_age_s=6 * 3600.0)
    window = TimeIntervalWindow(spec)
    window.insert(5 * MIN, "early")
    first = window.advance_watermark(H)
    assert [(r.start_us, r.end_us, r.retrigger) for r in first] == [
        (-40 * MIN, 20 * MIN, False),
        (-20 * MIN, 40 * MIN, False),
        (0, H, False),
    ]

    # At watermark 06:00 every pane of a 00:00 row is still open: it goes into all three.
    window.advance_watermark(6 * H)
    window.insert(0, "late")
    assert window.ignored_count == 0
    again = window.advance_watermark(6 * H)  # an update, even without moving, re-triggers
    assert summary(again) == [
        (-40 * MIN, 20 * MIN, ["early", "late"], True),
        (-20 * MIN, 40 * MIN, ["early", "late"], True),
        (0, H, ["early", "late"], True),
    ]
    assert [r.late_rows for r in again] == [1, 1, 1]
    assert window.advance_watermark(6 * H) == []  # nothing new, nothing fires

    # At 06:59 the panes ending 00:20 and 00:40 are closed; [00:00, 01:00) still takes it.
    window.advance_watermark(6 * H + 59 * MIN)
    assert window.open_panes == [(0, H)]
    window.insert(0, "later")
    assert window.ignored_count == 2
    assert [(i.start_us, i.end_us) for i in window.ignored] == [
        (-40 * MIN, 20 * MIN),
        (-20 * MIN, 40 * MIN),
    ]
    # Watermark exactly 07:00 = end + discardAge: not yet past it, so a last re-trigger.
    results = window.advance_watermark(7 * H)
    assert summary(results) == [(0, H, ["early", "late", "later"], True)]
    window.insert(0, "at seven")  # still taken by [00:00, 01:00), ignored by the other two
    assert window.ignored_count == 4
    # Past 07:00 the pane fires what it holds one last time, then is deleted.
    assert summary(window.advance_watermark(7 * H + 1)) == [
        (0, H, ["early", "late", "later", "at seven"], True)
    ]
    assert window.open_panes == []
    window.insert(0, "too late")
    assert window.ignored_count == 7
    last = window.ignored[-1]
    assert (last.rowtime_us, last.value, last.start_us, last.end_us) == (0, "too late", 0, H)
    assert last.watermark_us == 7 * H + 1
    assert last.late_by_us == 6 * H + 1
    assert "closed" in last.reason
    assert window.advance_watermark(8 * H) == []


def test_late_first_row_of_a_pane_triggers_it_once_not_as_a_retrigger() -> None:
    window = TimeIntervalWindow(TimeIntervalSpec(60.0, discard_age_s=600.0))
    window.advance_watermark(5 * MIN)
    window.insert(30 * S, "late but first")
    assert summary(window.advance_watermark(5 * MIN)) == [(0, MIN, ["late but first"], False)]


def test_default_discard_age_zero_closes_once_past_the_end() -> None:
    window = TimeIntervalWindow(HOURLY)
    window.insert(0, "a")
    assert len(window.advance_watermark(H)) == 1
    window.insert(1, "b")  # watermark == end: lateness 0 is not more than discardAge 0
    assert summary(window.advance_watermark(H + 1)) == [(0, H, ["a", "b"], True)]
    window.insert(2, "c")
    assert window.ignored_count == 1
    assert window.advance_watermark(H + 2) == []


def test_rows_in_gaps_are_recorded_not_dropped_silently() -> None:
    window = TimeIntervalWindow(GAPPY)
    window.insert(15 * S, "gap")
    assert window.ignored_count == 1
    (ignored,) = window.take_ignored()
    assert ignored.start_us is None and "no pane" in ignored.reason
    assert window.ignored == [] and window.ignored_count == 1


def test_watermark_never_moves_back() -> None:
    window = TimeIntervalWindow(HOURLY)
    window.advance_watermark(H)
    with pytest.raises(BoundError, match="watermark_us=0 is below"):
        window.advance_watermark(0)
    assert window.watermark_us == H


def test_window_needs_a_spec() -> None:
    with pytest.raises(OptionError, match="TimeIntervalSpec"):
        TimeIntervalWindow({"intervalDuration": 1})  # type: ignore[arg-type]


@given(
    specs,
    st.lists(
        st.one_of(
            st.tuples(st.just("row"), st.integers(-(10**5), 10**5)),
            st.tuples(st.just("wm"), st.integers(0, 5000)),
        ),
        max_size=60,
    ),
    st.integers(0, 3000),
)
def test_every_row_is_either_in_a_trigger_or_ignored(
    spec: TimeIntervalSpec, script: list[tuple[str, int]], discard_us: int
) -> None:
    """Nothing lost: after end of stream, each (row, pane) pair was emitted or ignored."""
    spec = TimeIntervalSpec(
        spec.interval_duration_s, spec.creation_period_s, discard_us / S, spec.interval_offset_s
    )
    window = TimeIntervalWindow(spec)
    watermark = -(10**6)
    emitted: dict[tuple[int, int], tuple[tuple[int, Any], ...]] = {}
    pairs: set[tuple[int, int, int]] = set()
    for i, (kind, amount) in enumerate(script):
        if kind == "row":
            window.insert(amount, i)
            for start, end in assign_panes(amount, spec):
                pairs.add((i, start, end))
        else:
            watermark += amount
            for result in window.advance_watermark(watermark):
                assert result.end_us <= watermark
                emitted[(result.start_us, result.end_us)] = result.rows
    for result in window.advance_watermark(10**9):
        emitted[(result.start_us, result.end_us)] = result.rows
    ignored = {(x.value, x.start_us, x.end_us) for x in window.ignored}
    shown = {(value, s, e) for (s, e), rows in emitted.items() for _, value in rows}
    assert shown | ignored == pairs | {
        (x.value, None, None) for x in window.ignored if x.start_us is None
    }
    assert not shown & ignored
    assert window.open_panes == []

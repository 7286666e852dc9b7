"""Odysseus validity intervals (SPEC section 10, seed 001)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US, MIN_ROWTIME_US
from pyspark_rowtime.bounds.errors import InvalidRowtimeError, OptionError
from pyspark_rowtime.bounds.intervals import (
    INFINITY_US,
    ValidityInterval,
    combine,
    combine_all,
    element_window_ends,
    intersection,
    intersection_arrays,
    overlaps,
    time_window_end,
)

V = ValidityInterval


def test_end_starts_at_infinity_which_spark_can_store() -> None:
    interval = V(5)
    assert interval.end_us == INFINITY_US == END_OF_STREAM_US
    assert interval.is_infinite
    assert not V(5, 6).is_infinite


INVALID: list[tuple[str, Any, Any, str]] = [
    ("empty", 5, 5, "end_us=5 must be greater than start_us=5"),
    ("reversed", 6, 5, "end_us=5 must be greater"),
    ("past infinity", 0, INFINITY_US + 1, "at most INFINITY_US"),
    ("starting at infinity", INFINITY_US, INFINITY_US, "start_us="),
    ("before Spark's first instant", MIN_ROWTIME_US - 1, 0, "out of range"),
    ("float start", 1.5, 3, "start_us=1.5 is not an int"),
    ("bool end", 0, True, "end_us=True is not an int"),
]


@pytest.mark.parametrize(
    ("start", "end", "message"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_validity_interval_rejects(start: Any, end: Any, message: str) -> None:
    with pytest.raises(InvalidRowtimeError) as info:
        V(start, end)
    assert message in str(info.value)


def test_interval_is_half_open() -> None:
    interval = V(10, 20)
    assert interval.contains(10) and interval.contains(19)
    assert not interval.contains(20) and not interval.contains(9)
    assert interval.duration_us == 10


PAIRS: list[tuple[str, V, V, V | None]] = [
    ("disjoint", V(0, 10), V(20, 30), None),
    ("touching ends do not overlap", V(0, 10), V(10, 20), None),
    ("one microsecond in common", V(0, 11), V(10, 20), V(10, 11)),
    ("nested", V(0, 100), V(10, 20), V(10, 20)),
    ("equal", V(3, 7), V(3, 7), V(3, 7)),
    ("both infinite", V(5), V(9), V(9)),
    ("infinite and finite", V(5), V(0, 8), V(5, 8)),
    ("before 1970", V(-10, -1), V(-5, 3), V(-5, -1)),
]


@pytest.mark.parametrize(("a", "b", "expected"), [c[1:] for c in PAIRS], ids=[c[0] for c in PAIRS])
def test_overlap_intersection_and_combine_table(a: V, b: V, expected: V | None) -> None:
    assert overlaps(a, b) == (expected is not None)
    assert intersection(a, b) == expected
    assert combine(a, b) == expected
    assert combine(b, a) == expected


def test_combine_all_is_the_intersection_of_every_row() -> None:
    assert combine_all([V(0, 10), V(2, 12), V(5)]) == V(5, 10)
    assert combine_all([V(0, 10), V(2, 12), V(10)]) is None
    assert combine_all([V(0, 10), V(20, 30), V(5, 25)]) is None
    assert combine_all([V(3, 4)]) == V(3, 4)
    assert combine_all([]) is None


TIME_WINDOWS = [
    ("start plus size", 1_000, 500, 1_500),
    ("before 1970", -1_000, 500, -500),
    ("capped at infinity", END_OF_STREAM_US - 5, 10, INFINITY_US),
]


@pytest.mark.parametrize(
    ("start", "size", "end"), [c[1:] for c in TIME_WINDOWS], ids=[c[0] for c in TIME_WINDOWS]
)
def test_time_window_end(start: int, size: int, end: int) -> None:
    assert time_window_end(start, size) == end


@pytest.mark.parametrize("size", [0, -1, 1.5, True])
def test_time_window_rejects_non_positive_sizes(size: Any) -> None:
    with pytest.raises(OptionError, match="size_us="):
        time_window_end(0, size)


ELEMENT_WINDOWS: list[tuple[str, list[int], int, list[int]]] = [
    ("n=1: valid until the next row", [10, 20, 30], 1, [20, 30, INFINITY_US]),
    ("n=2", [10, 20, 30, 40], 2, [30, 40, INFINITY_US, INFINITY_US]),
    ("fewer rows than n", [10, 20], 5, [INFINITY_US, INFINITY_US]),
    ("empty partition", [], 3, []),
    ("ties give an empty interval", [10, 10, 20], 1, [10, 20, INFINITY_US]),
    ("before 1970", [-30, -20, -10], 1, [-20, -10, INFINITY_US]),
]


@pytest.mark.parametrize(
    ("starts", "n", "ends"), [c[1:] for c in ELEMENT_WINDOWS], ids=[c[0] for c in ELEMENT_WINDOWS]
)
def test_element_window_ends(starts: list[int], n: int, ends: list[int]) -> None:
    got = element_window_ends(np.array(starts, dtype=np.int64), n)
    assert got.dtype == np.int64
    assert got.tolist() == ends


def test_element_window_needs_rows_in_order() -> None:
    with pytest.raises(InvalidRowtimeError, match=r"starts_us\[2\]=5 is below starts_us\[1\]=20"):
        element_window_ends(np.array([10, 20, 5]), 1)


@pytest.mark.parametrize("n", [0, -1, 1.0, True])
def test_element_window_rejects_non_positive_n(n: Any) -> None:
    with pytest.raises(OptionError, match="n="):
        element_window_ends(np.array([1, 2]), n)


def test_element_window_rejects_non_integer_arrays() -> None:
    with pytest.raises(InvalidRowtimeError, match="one-dimensional integer"):
        element_window_ends(np.array([1.0, 2.0]), 1)


# ---------------------------------------------------------------------------------------------
# Properties

bound = st.integers(-(10**6), 10**6)


@st.composite
def intervals(draw: st.DrawFn) -> V:
    start = draw(bound)
    if draw(st.booleans()):
        return V(start)
    return V(start, start + draw(st.integers(1, 10**6)))


@given(intervals(), intervals())
def test_intersection_is_commutative_contained_and_empty_iff_disjoint(a: V, b: V) -> None:
    both = intersection(a, b)
    assert both == intersection(b, a)
    assert (both is None) == (not overlaps(a, b))
    if both is not None:
        for outer in (a, b):
            assert outer.start_us <= both.start_us and both.end_us <= outer.end_us
        # Every instant of the intersection is in both, and the ends are tight.
        assert a.contains(both.start_us) and b.contains(both.start_us)
        assert a.contains(both.end_us - 1) and b.contains(both.end_us - 1)
        assert not (a.contains(both.end_us) and b.contains(both.end_us))


@given(intervals(), intervals(), st.integers(-(10**6), 3 * 10**6))
def test_an_instant_is_in_the_intersection_iff_in_both(a: V, b: V, t: int) -> None:
    both = intersection(a, b)
    in_both = a.contains(t) and b.contains(t)
    assert in_both == (both is not None and both.contains(t))


@given(st.lists(st.tuples(intervals(), intervals()), max_size=30))
def test_intersection_arrays_agree_with_pairs(pairs: list[tuple[V, V]]) -> None:
    start, end, overlap = intersection_arrays(
        [a.start_us for a, _ in pairs],
        [a.end_us for a, _ in pairs],
        [b.start_us for _, b in pairs],
        [b.end_us for _, b in pairs],
    )
    for i, (a, b) in enumerate(pairs):
        expected = intersection(a, b)
        assert bool(overlap[i]) == (expected is not None)
        if expected is not None:
            assert (int(start[i]), int(end[i])) == (expected.start_us, expected.end_us)


@given(st.lists(bound, max_size=40), st.integers(1, 6))
def test_element_window_end_is_the_start_n_rows_later(raw: list[int], n: int) -> None:
    starts = np.sort(np.array(raw, dtype=np.int64))
    ends = element_window_ends(starts, n)
    for i, end in enumerate(ends.tolist()):
        assert end == (int(starts[i + n]) if i + n < len(starts) else INFINITY_US)
        assert end >= starts[i]


def test_sliding_window_ends_follow_odysseus_advance() -> None:
    from pyspark_rowtime.bounds.intervals import sliding_window_ends

    starts = np.array([0, 999, 1000, 2500, -1], dtype=np.int64)
    # size 3000, slide 1000: floor(start / 1000) * 1000 + 3000 (floor, also before 1970)
    assert sliding_window_ends(starts, 3000, 1000).tolist() == [3000, 3000, 4000, 5000, 2000]
    # slide 1: the plain time window; slide = size: tumbling windows
    assert sliding_window_ends(starts, 3000).tolist() == (starts + 3000).tolist()
    assert sliding_window_ends(starts, 1000, 1000).tolist() == [1000, 1000, 2000, 3000, 0]
    assert sliding_window_ends(np.array([INFINITY_US - 5]), 3000, 1000)[0] == INFINITY_US
    with pytest.raises(OptionError, match="slide_us=2000 is above size_us=1000"):
        sliding_window_ends(starts, 1000, 2000)

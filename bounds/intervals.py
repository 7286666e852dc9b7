"""Odysseus validity intervals (SPEC section 10, seed 001), in integer microseconds.

A row may carry ``[rowtime, rowtime_end)``, the half-open interval in which it is valid: from
its start (included) up to its end (excluded). The end starts at infinity; window operators
set it (time based: start plus size; element based: the start of the N-th later row of the
same partition). Two rows may be combined (join, aggregate) only if their intervals overlap,
and the result is valid in the intersection.

Infinity is ``INFINITY_US``, which is Spark's largest timestamp (``END_OF_STREAM_US``)
so that it can be stored in a TimestampType column as it is. A consequence: an interval must
start below it, and "valid forever" means valid up to, not including, the end of stream.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from numbers import Integral

import numpy as np
import numpy.typing as npt

from .bounds import END_OF_STREAM_US, MIN_ROWTIME_US
from .errors import InvalidRowtimeError, OptionError

__all__ = [
    "INFINITY_US",
    "ValidityInterval",
    "combine",
    "combine_all",
    "element_window_ends",
    "intersection",
    "intersection_arrays",
    "overlaps",
    "range_reduce",
    "sliding_window_ends",
    "stretches",
    "time_window_end",
]

#: The end of an interval that no window has limited: valid until the end of stream.
INFINITY_US = END_OF_STREAM_US

Int64Array = npt.NDArray[np.int64]


def _int_us(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise InvalidRowtimeError(f"{name}={value!r} is not an int of microseconds")
    return int(value)


@dataclass(frozen=True, order=True)
class ValidityInterval:
    """The half-open validity ``[start_us, end_us)`` of a row, in microseconds since the epoch.

    ``start_us`` is included, ``end_us`` excluded; ``MIN_ROWTIME_US <= start_us < end_us <=
    INFINITY_US``. ``end_us`` defaults to ``INFINITY_US`` (valid until the end of stream).
    Ordered by start, then end.

    Raises:
        InvalidRowtimeError: a bound is not an int, is out of range, or the interval is empty.

    Examples:
        >>> import pyspark_rowtime as rt
        >>> v = rt.ValidityInterval(rt.to_rowtime_us("2026-12-02T10:00:00Z"),
        ...                         rt.to_rowtime_us("2026-12-02T10:00:05Z"))
        >>> v.duration_us, v.contains(v.start_us), v.contains(v.end_us), v.is_infinite
        (5000000, True, False, False)
        >>> rt.ValidityInterval(v.end_us, v.start_us)
        Traceback (most recent call last):
        ...
        pyspark_rowtime.bounds.errors.InvalidRowtimeError: ...
    """

    start_us: int
    end_us: int = INFINITY_US

    def __post_init__(self) -> None:
        start = _int_us("start_us", self.start_us)
        end = _int_us("end_us", self.end_us)
        if not MIN_ROWTIME_US <= start < INFINITY_US:
            raise InvalidRowtimeError(
                f"start_us={start} is out of range: a validity interval starts in "
                f"[{MIN_ROWTIME_US}, {INFINITY_US}) us (INFINITY_US, the end of stream, is "
                "only an end)"
            )
        if not start < end <= INFINITY_US:
            raise InvalidRowtimeError(
                f"end_us={end} must be greater than start_us={start} and at most INFINITY_US="
                f"{INFINITY_US}: the interval [start_us, end_us) excludes its end, so "
                "end_us <= start_us would be valid at no instant"
            )

    @property
    def is_infinite(self) -> bool:
        """True while no window has limited the interval (``end_us == INFINITY_US``)."""
        return self.end_us == INFINITY_US

    @property
    def duration_us(self) -> int:
        """``end_us - start_us``."""
        return self.end_us - self.start_us

    def contains(self, rowtime_us: int) -> bool:
        """True if ``start_us <= rowtime_us < end_us``."""
        return self.start_us <= rowtime_us < self.end_us


def overlaps(a: ValidityInterval, b: ValidityInterval) -> bool:
    """True if some instant lies in both: ``a.start < b.end and b.start < a.end``.

    Intervals that only touch (``a.end == b.start``) do not overlap: the end is excluded.
    """
    return a.start_us < b.end_us and b.start_us < a.end_us


def intersection(a: ValidityInterval, b: ValidityInterval) -> ValidityInterval | None:
    """``[max(starts), min(ends))``, or None when the intervals do not overlap."""
    start = max(a.start_us, b.start_us)
    end = min(a.end_us, b.end_us)
    return ValidityInterval(start, end) if start < end else None


def combine(a: ValidityInterval, b: ValidityInterval) -> ValidityInterval | None:
    """The validity of a join result of two rows: their intersection, or None (no result).

    Odysseus joins only rows valid at the same time, and the result is valid where both are.
    """
    return intersection(a, b)


def combine_all(intervals: Iterable[ValidityInterval]) -> ValidityInterval | None:
    """The validity of an aggregate of several rows: the intersection of all, or None.

    None when the rows are not all valid at one common instant, or when there are none.
    """
    result: ValidityInterval | None = None
    for count, interval in enumerate(intervals):
        if count == 0:
            result = interval
            continue
        if result is None:
            return None
        result = intersection(result, interval)
    return result


def time_window_end(start_us: int, size_us: int) -> int:
    """The end a time window of ``size_us`` gives a row starting at ``start_us``.

    ``start_us + size_us``, capped at ``INFINITY_US``: the row is valid in
    ``[start_us, start_us + size_us)``.

    Raises:
        OptionError: ``size_us`` is not a positive int.
    """
    start = _int_us("start_us", start_us)
    if isinstance(size_us, bool) or not isinstance(size_us, Integral) or size_us <= 0:
        raise OptionError(
            f"size_us={size_us!r} must be a positive int of microseconds: a time window of "
            "size 0 would leave every row valid at no instant"
        )
    return min(start + int(size_us), INFINITY_US)


def element_window_ends(starts_us: npt.ArrayLike, n: int) -> Int64Array:
    """The ends an element window of ``n`` rows gives one partition's rows, in order.

    Row ``i`` stays valid until the row ``n`` places later starts: ``end[i] = starts[i + n]``,
    or ``INFINITY_US`` while that row has not arrived (the last ``n`` rows). With ``n = 1``
    each row is valid until the next one. Rows with equal starts can give ``end == start``: a
    row superseded at the instant it became valid, whose (empty) interval overlaps nothing.

    Raises:
        OptionError: ``n`` is not a positive int.
        InvalidRowtimeError: ``starts_us`` is not one-dimensional or not in non-decreasing
            order (a partition in rowtime order); the message names the first offending index.
    """
    if isinstance(n, bool) or not isinstance(n, Integral) or n <= 0:
        raise OptionError(
            f"n={n!r} must be a positive int: an element window keeps each row valid until "
            "the n-th later row of its partition arrives"
        )
    starts = np.asarray(starts_us)
    if starts.ndim != 1 or not (starts.size == 0 or np.issubdtype(starts.dtype, np.integer)):
        raise InvalidRowtimeError(
            f"starts_us must be a one-dimensional integer array of microseconds, not "
            f"{starts.dtype} with shape {starts.shape}"
        )
    starts = starts.astype(np.int64, copy=False)
    if starts.size > 1:
        back = np.flatnonzero(starts[1:] < starts[:-1])
        if back.size:
            i = int(back[0]) + 1
            raise InvalidRowtimeError(
                f"starts_us[{i}]={int(starts[i])} is below starts_us[{i - 1}]="
                f"{int(starts[i - 1])}: element windows need one partition's rows in rowtime "
                "order"
            )
    ends = np.full(starts.size, INFINITY_US, dtype=np.int64)
    k = int(n)
    if k < starts.size:
        ends[: starts.size - k] = starts[k:]
    return ends


def intersection_arrays(
    a_start_us: npt.ArrayLike,
    a_end_us: npt.ArrayLike,
    b_start_us: npt.ArrayLike,
    b_end_us: npt.ArrayLike,
) -> tuple[Int64Array, Int64Array, npt.NDArray[np.bool_]]:
    """Element-wise ``intersection`` of pairs of half-open intervals.

    Returns ``(start_us, end_us, overlap)``: ``start = max(starts)``, ``end = min(ends)``, and
    ``overlap`` is ``start < end``; where it is False there is no result (the start and end
    there mean nothing).
    """
    start = np.maximum(np.asarray(a_start_us, np.int64), np.asarray(b_start_us, np.int64))
    end = np.minimum(np.asarray(a_end_us, np.int64), np.asarray(b_end_us, np.int64))
    return start, end, start < end


def stretches(
    starts_us: npt.ArrayLike,
    ends_us: npt.ArrayLike,
    from_us: int | None,
    upto_us: int,
) -> tuple[Int64Array, Int64Array, Int64Array]:
    """The maximal stretches of constant validity of some rows, and which rows cover which.

    Rows are half-open intervals ``[start, end)`` (empty ones, ``end <= start``, are valid at no
    instant and change nothing). The *change points* are the starts and ends of the non-empty
    rows: at each, the set of valid rows changes (a row enters or leaves), and between two
    consecutive ones it does not. Only points in ``[from_us, upto_us]`` count: ``from_us`` (if
    not None) is itself a point, where an earlier stretch was cut, and rows that started before
    it are treated as starting at it; points above ``upto_us`` are not known to be final.

    Returns ``(points, lo, hi)``: the sorted distinct points; stretch ``i`` is ``[points[i],
    points[i + 1])`` for ``i < len(points) - 1``; row ``r`` is valid in exactly the stretches
    ``lo[r] <= i < hi[r]`` (``lo[r] >= hi[r]``: in none of them).
    """
    start = np.asarray(starts_us, dtype=np.int64)
    end = np.asarray(ends_us, dtype=np.int64)
    live = start < end
    if from_us is not None:
        start = np.maximum(start, from_us)
        live &= end > from_us
    candidates = [start[live], end[live]]
    if from_us is not None:
        candidates.append(np.array([from_us], dtype=np.int64))
    points = np.sort(np.concatenate(candidates))  # sorted, then distinct: np.unique hashes,
    if points.size:  # and is several times slower on a million points
        points = points[np.append(True, points[1:] != points[:-1])]
    points = points[points <= upto_us]
    m = max(len(points) - 1, 0)
    lo = np.minimum(np.searchsorted(points, start, side="left"), m).astype(np.int64)
    hi = np.minimum(np.searchsorted(points, end, side="left"), m).astype(np.int64)
    hi[~live] = 0
    return points, lo, hi


_REDUCERS = {"add": np.add, "min": np.minimum, "max": np.maximum}


def range_reduce(
    kind: str, lo: npt.ArrayLike, hi: npt.ArrayLike, values: npt.ArrayLike, m: int
) -> np.ndarray:
    """For each of ``m`` slots, the ``kind`` (``add``, ``min`` or ``max``) of the ``values`` of
    the rows whose range ``[lo, hi)`` covers it; slots no row covers get the identity (0, the
    dtype's highest or lowest value).

    A segment tree applied offline: each range updates at most ``2 log2(m)`` disjoint nodes, and
    one pass down the tree gives every slot its value, so the work is ``O((rows + m) log m)``
    whatever the overlap, and a float sum adds each row once to a node (no running sum that
    adds then subtracts, which would lose precision). Integers add exactly in any order: their
    sums take a difference array and one running sum, ``O(rows + m)``.
    """
    ufunc = _REDUCERS[kind]
    v = np.asarray(values)
    if v.dtype.kind == "f":
        v = v.astype(np.float64, copy=False)
        info_hi, info_lo = np.inf, -np.inf
    else:
        v = v.astype(np.int64, copy=False)
        info_hi, info_lo = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    identity = {"add": 0, "min": info_hi, "max": info_lo}[kind]
    if kind == "add" and v.dtype.kind != "f":
        # Integers add exactly in any order: a difference array and one running sum.
        first = np.asarray(lo, dtype=np.int64)
        stop = np.asarray(hi, dtype=np.int64)
        keep = first < stop
        diff = np.zeros(m + 1, dtype=np.int64)
        np.add.at(diff, first[keep], v[keep])
        np.subtract.at(diff, stop[keep], v[keep])
        return np.cumsum(diff[:m])
    size = 1
    while size < max(m, 1):
        size *= 2
    tree = np.full(2 * size, identity, dtype=v.dtype)
    left = np.asarray(lo, dtype=np.int64).copy()
    right = np.asarray(hi, dtype=np.int64).copy()
    keep = left < right
    left, right, v = left[keep] + size, right[keep] + size, v[keep]
    while left.size:
        odd = (left & 1) == 1
        ufunc.at(tree, left[odd], v[odd])
        left[odd] += 1
        odd = (right & 1) == 1
        right[odd] -= 1
        ufunc.at(tree, right[odd], v[odd])
        left >>= 1
        right >>= 1
        go = left < right
        left, right, v = left[go], right[go], v[go]
    width = 1
    while width < size:
        parent = np.arange(width, 2 * width)
        tree[2 * parent] = ufunc(tree[2 * parent], tree[parent])
        tree[2 * parent + 1] = ufunc(tree[2 * parent + 1], tree[parent])
        width *= 2
    return tree[size : size + m]


def sliding_window_ends(starts_us: npt.ArrayLike, size_us: int, slide_us: int = 1) -> Int64Array:
    """The ends a time window of ``size_us`` moving in steps of ``slide_us`` gives rows.

    Odysseus' sliding time window with an advance (its ``calcSlidingDeltaWindowEnd``):
    ``floor(start / slide) * slide + size``: a row is valid from its start until ``size`` after
    the start of the slide step it falls in, so the window's content changes only at the
    steps' starts as rows leave (rows still enter as they come). A slide of 1 us is the plain
    time window (``start + size``); a slide equal to the size gives tumbling windows (each row
    valid until the end of its window). Capped at ``INFINITY_US``.

    Raises:
        OptionError: a size or slide that is not a positive int, or a slide above the size
            (rows in the gaps would be valid at no instant).
    """
    for name, value in (("size_us", size_us), ("slide_us", slide_us)):
        if isinstance(value, bool) or not isinstance(value, Integral) or value <= 0:
            raise OptionError(f"{name}={value!r} must be a positive int of microseconds")
    if slide_us > size_us:
        raise OptionError(
            f"slide_us={slide_us} is above size_us={size_us}: rows between two windows would "
            "be valid at no instant; give a slide at most the size"
        )
    starts = np.asarray(starts_us, dtype=np.int64)
    base = starts // int(slide_us) * int(slide_us)
    return np.minimum(base, INFINITY_US - int(size_us)) + int(size_us)

"""IBM Streams ``timeInterval`` panes (SPEC section 10, seed 002), in integer microseconds.

Pane ``N`` (any integer; negative before 1970) covers the half-open interval::

    [N * creationPeriod + intervalOffset, N * creationPeriod + intervalDuration + intervalOffset)

with 0 at the Unix epoch. A row belongs to every pane whose interval contains its rowtime: none
(a gap, when ``creationPeriod > intervalDuration``), one (tumbling, the default) or several
(sliding, ``creationPeriod < intervalDuration``).

``assign_panes`` is the pure assignment; ``TimeIntervalWindow`` keeps panes and applies
IBM's default trigger policy as the watermark, passed in by the caller, advances. Nothing here
reads a wall clock.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from numbers import Integral, Real
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import BoundError, InvalidRowtimeError, OptionError

__all__ = [
    "IgnoredRow",
    "PaneResult",
    "TimeIntervalSpec",
    "TimeIntervalWindow",
    "assign_panes",
    "assign_panes_array",
]

_US_PER_S = 1_000_000


def _seconds_to_us(name: str, value: object) -> int:
    """Seconds (int, float or Decimal) as exact microseconds, or an OptionError naming ``name``.

    A float is read as the decimal it prints as (``0.1`` is 100000 us), not its binary value.
    """
    if isinstance(value, bool) or not isinstance(value, (Real, Decimal)):
        raise OptionError(
            f"{name}={value!r} is not a number of seconds: give an int or float, e.g. 3600.0"
        )
    if isinstance(value, Decimal):
        exact = value
    elif isinstance(value, Integral):
        exact = Decimal(int(value))
    else:
        number = float(value)
        if not math.isfinite(number):
            raise OptionError(f"{name}={value!r} must be a finite number of seconds")
        exact = Decimal(repr(number))
    if not exact.is_finite():
        raise OptionError(f"{name}={value!r} must be a finite number of seconds")
    scaled = exact * _US_PER_S
    if scaled != scaled.to_integral_value():
        raise OptionError(
            f"{name}={value!r} is finer than a microsecond, the precision of rowtimes: give "
            "whole microseconds (at most 6 decimal places of seconds)"
        )
    return int(scaled)


@dataclass(frozen=True)
class TimeIntervalSpec:
    """The parameters of an IBM Streams ``timeInterval`` window, in seconds as IBM writes them.

    Args:
        interval_duration_s: ``intervalDuration``, the length of each pane; ``> 0``.
        creation_period_s: ``creationPeriod``, the distance between the starts of adjacent
            panes; ``> 0``; ``None`` means equal to ``intervalDuration`` (tumbling panes).
        discard_age_s: ``discardAge``, how long after a pane's end late rows are still taken
            in; ``>= 0``.
        interval_offset_s: ``intervalOffset``, a start of some pane; in
            ``[0, intervalDuration)``.

    The ``*_us`` properties give the same values as exact integer microseconds; a value finer
    than a microsecond is refused rather than rounded.

    Raises:
        OptionError: a parameter breaks its rule: the message names the IBM parameter, the
            value, what is accepted and why.

    Examples:
        Panes of 10 seconds, a new one every 5 seconds; late rows taken for 2 seconds more:

        >>> import pyspark_rowtime as rt
        >>> spec = rt.TimeIntervalSpec(10, creation_period_s=5, discard_age_s=2)
        >>> spec.interval_duration_us, spec.creation_period_us, spec.discard_age_us
        (10000000, 5000000, 2000000)
        >>> rt.TimeIntervalSpec(0)
        Traceback (most recent call last):
        ...
        pyspark_rowtime.bounds.errors.OptionError: ...
    """

    interval_duration_s: float
    creation_period_s: float | None = None
    discard_age_s: float = 0.0
    interval_offset_s: float = 0.0
    _duration_us: int = field(init=False, repr=False, compare=False)
    _period_us: int = field(init=False, repr=False, compare=False)
    _discard_us: int = field(init=False, repr=False, compare=False)
    _offset_us: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        duration = _seconds_to_us("intervalDuration", self.interval_duration_s)
        if duration <= 0:
            raise OptionError(
                f"intervalDuration={self.interval_duration_s!r} must be greater than 0 "
                "seconds: it is the length of every pane, and an empty pane holds no row"
            )
        if self.creation_period_s is None:
            period = duration
        else:
            period = _seconds_to_us("creationPeriod", self.creation_period_s)
            if period <= 0:
                raise OptionError(
                    f"creationPeriod={self.creation_period_s!r} must be greater than 0 seconds "
                    "(or left out to equal intervalDuration): it is the distance between the "
                    "starts of adjacent panes, and 0 would put infinitely many panes at one start"
                )
        discard = _seconds_to_us("discardAge", self.discard_age_s)
        if discard < 0:
            raise OptionError(
                f"discardAge={self.discard_age_s!r} must be 0 or more seconds: it is how long "
                "after a pane's end late rows are still accepted; 0 closes a pane as soon as "
                "the watermark passes its end"
            )
        offset = _seconds_to_us("intervalOffset", self.interval_offset_s)
        if not 0 <= offset < duration:
            raise OptionError(
                f"intervalOffset={self.interval_offset_s!r} must be in [0, intervalDuration) = "
                f"[0, {self.interval_duration_s!r}) seconds: it names one pane start, and "
                "shifting by a whole intervalDuration or more describes the same panes as a "
                "smaller offset"
            )
        object.__setattr__(self, "_duration_us", duration)
        object.__setattr__(self, "_period_us", period)
        object.__setattr__(self, "_discard_us", discard)
        object.__setattr__(self, "_offset_us", offset)

    @property
    def interval_duration_us(self) -> int:
        """``intervalDuration`` in microseconds."""
        return self._duration_us

    @property
    def creation_period_us(self) -> int:
        """``creationPeriod`` in microseconds (``intervalDuration`` when not given)."""
        return self._period_us

    @property
    def discard_age_us(self) -> int:
        """``discardAge`` in microseconds."""
        return self._discard_us

    @property
    def interval_offset_us(self) -> int:
        """``intervalOffset`` in microseconds."""
        return self._offset_us

    def pane(self, n: int) -> tuple[int, int]:
        """Pane ``n`` as ``(start_us, end_us)``, the half-open ``[start_us, end_us)``."""
        start = n * self._period_us + self._offset_us
        return start, start + self._duration_us


def _check_rowtime(rowtime_us: object) -> int:
    if isinstance(rowtime_us, bool) or not isinstance(rowtime_us, Integral):
        raise InvalidRowtimeError(
            f"rowtime_us={rowtime_us!r} is not an int of microseconds since the epoch"
        )
    return int(rowtime_us)


def assign_panes(rowtime_us: int, spec: TimeIntervalSpec) -> list[tuple[int, int]]:
    """Every pane containing ``rowtime_us``, as ``(start_us, end_us)`` in ascending start.

    Pane ``N`` contains ``t`` when ``N * P + O <= t < N * P + O + D``, so
    ``N`` runs from ``floor((t - O - D) / P) + 1`` to ``floor((t - O) / P)``: empty in a gap
    between panes, otherwise ``floor(D / P)`` or ``ceil(D / P)`` panes.

    Examples:
        The panes of 10 seconds, one every 5 seconds, that hold a row at 12 s past the epoch:

        >>> import pyspark_rowtime as rt
        >>> rt.assign_panes(12_000_000, rt.TimeIntervalSpec(10, creation_period_s=5))
        [(5000000, 15000000), (10000000, 20000000)]
    """
    t = _check_rowtime(rowtime_us)
    period, offset, duration = (
        spec.creation_period_us,
        spec.interval_offset_us,
        spec.interval_duration_us,
    )
    last = (t - offset) // period
    first = (t - offset - duration) // period + 1
    return [spec.pane(n) for n in range(first, last + 1)]


def assign_panes_array(
    rowtimes_us: npt.ArrayLike, spec: TimeIntervalSpec
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Vectorised ``assign_panes``: ``(row_index, start_us, end_us)``, one entry per pair.

    Pairs come in row order, and within a row in ascending start, exactly as
    ``[(i, *p) for i, t in enumerate(rowtimes_us) for p in assign_panes(t, spec)]``.
    Rowtimes must keep ``t - intervalOffset - intervalDuration`` within int64.
    """
    t = np.asarray(rowtimes_us, dtype=np.int64)
    period, offset, duration = (
        spec.creation_period_us,
        spec.interval_offset_us,
        spec.interval_duration_us,
    )
    last = (t - offset) // period
    if duration == period:
        # Tumbling: every row in exactly one pane, ``last`` (``first`` equals it); the same
        # pairs as below without expanding them, the common case of a window per pane.
        start = last * period + offset
        return np.arange(t.size, dtype=np.int64), start, start + duration
    first = (t - offset - duration) // period + 1
    counts = np.maximum(last - first + 1, 0)
    rows = np.repeat(np.arange(t.size, dtype=np.int64), counts)
    # Position of each pair within its row: 0, 1, ... counts[i] - 1.
    starts_at = np.cumsum(counts) - counts
    within = np.arange(rows.size, dtype=np.int64) - np.repeat(starts_at, counts)
    n = first[rows] + within
    start = n * period + offset
    return rows, start, start + duration


@dataclass(frozen=True)
class PaneResult:
    """A pane that triggered: ``[start_us, end_us)``, with ``rowtime_us == end_us``.

    ``rows`` is the pane's whole content as ``(rowtime_us, value)`` pairs in arrival order, so a
    re-trigger carries the late rows together with the earlier ones and the handler recomputes
    from scratch. ``retrigger`` is False the first time the pane triggers, True afterwards.
    ``late_rows`` counts the rows that arrived after the previous trigger.
    """

    start_us: int
    end_us: int
    rows: tuple[tuple[int, Any], ...]
    retrigger: bool
    late_rows: int = 0

    @property
    def rowtime_us(self) -> int:
        """The result's rowtime: the pane's end (exclusive), as SPEC section 10 requires."""
        return self.end_us

    @property
    def values(self) -> list[Any]:
        """The rows' values, in arrival order."""
        return [value for _, value in self.rows]


@dataclass(frozen=True)
class IgnoredRow:
    """A row (or one of its panes) that the window did not take, and why.

    ``start_us``/``end_us`` name the closed pane, or are None when the row falls in no pane
    (a gap: ``creationPeriod > intervalDuration``). ``watermark_us`` is the watermark when the
    row arrived; ``late_by_us`` how far the watermark was past the pane's end.
    """

    rowtime_us: int
    value: Any
    start_us: int | None
    end_us: int | None
    watermark_us: int | None
    reason: str

    @property
    def late_by_us(self) -> int | None:
        if self.end_us is None or self.watermark_us is None:
            return None
        return self.watermark_us - self.end_us


class _Pane:
    __slots__ = ("end_us", "late", "rows", "start_us", "triggered")

    def __init__(self, start_us: int, end_us: int) -> None:
        self.start_us = start_us
        self.end_us = end_us
        self.rows: list[tuple[int, Any]] = []
        self.triggered = False
        self.late = 0  # rows added since the last trigger, once triggered


class TimeIntervalWindow:
    """A ``timeInterval`` window with IBM's default trigger policy, driven by the caller.

    - [`insert`][.insert] puts a row into every pane containing its rowtime.
    - [`advance_watermark`][.advance_watermark] moves the event-time clock; it returns, in
      ascending ``(end_us, start_us)``, the panes that trigger:
        * a pane triggers when the watermark reaches its end (``watermark_us >= end_us``);
        * a row that arrives for a pane that has already triggered (a late row) makes the
          pane trigger again at the next watermark update, even one that does not move the
          watermark;
        * a pane is closed, and deleted, once ``watermark_us > end_us + discardAge`` (after a
          last trigger if it still had one due). A row that arrives for a closed pane is
          ignored: it is counted in ``ignored_count`` and recorded in ``ignored`` with the
          pane and the watermark, never dropped silently. A row in several panes is counted
          once per closed pane, and rows that fall in no pane at all are recorded as well.

    The watermark never moves back: a lower one raises ``BoundError``.

    Examples:
        >>> import pyspark_rowtime as rt
        >>> window = rt.TimeIntervalWindow(rt.TimeIntervalSpec(10))
        >>> window.insert(rt.to_rowtime_us("2026-12-02T10:00:03Z"), "a")
        >>> window.advance_watermark(rt.to_rowtime_us("2026-12-02T10:00:09Z"))
        []
        >>> (pane,) = window.advance_watermark(rt.to_rowtime_us("2026-12-02T10:00:10Z"))
        >>> rt.from_rowtime_us(pane.start_us), pane.rows[0][1], pane.retrigger
        (datetime.datetime(2026, 12, 2, 10, 0, tzinfo=datetime.timezone.utc), 'a', False)
    """

    def __init__(self, spec: TimeIntervalSpec) -> None:
        if not isinstance(spec, TimeIntervalSpec):
            raise OptionError(f"spec={spec!r} must be a TimeIntervalSpec")
        self.spec = spec
        self.watermark_us: int | None = None
        self.ignored_count = 0
        self.ignored: list[IgnoredRow] = []
        self._panes: dict[int, _Pane] = {}
        self._untriggered: list[tuple[int, int]] = []  # heap of (end_us, start_us)
        self._closing: list[tuple[int, int]] = []  # heap of (end_us, start_us), every open pane
        self._dirty: set[int] = set()  # starts of triggered panes with late rows

    @property
    def open_panes(self) -> list[tuple[int, int]]:
        """The panes currently held, as ``(start_us, end_us)`` in ascending start."""
        return sorted((p.start_us, p.end_us) for p in self._panes.values())

    def _is_closed(self, end_us: int) -> bool:
        return (
            self.watermark_us is not None and self.watermark_us > end_us + self.spec.discard_age_us
        )

    def insert(self, rowtime_us: int, value: Any = None) -> None:
        """Add a row to every pane containing ``rowtime_us`` that is not closed."""
        t = _check_rowtime(rowtime_us)
        panes = assign_panes(t, self.spec)
        if not panes:
            self._ignore(t, value, None, None, "in no pane: a gap between panes "
                         "(creationPeriod > intervalDuration)")  # fmt: skip
            return
        for start, end in panes:
            if self._is_closed(end):
                self._ignore(t, value, start, end, "pane closed: the watermark passed its end "
                             "plus discardAge")  # fmt: skip
                continue
            pane = self._panes.get(start)
            if pane is None:
                pane = self._panes[start] = _Pane(start, end)
                heapq.heappush(self._untriggered, (end, start))
                heapq.heappush(self._closing, (end, start))
            pane.rows.append((t, value))
            if pane.triggered:
                pane.late += 1
                self._dirty.add(start)

    def _ignore(self, t: int, value: Any, start: int | None, end: int | None, reason: str) -> None:
        self.ignored_count += 1
        self.ignored.append(IgnoredRow(t, value, start, end, self.watermark_us, reason))

    def take_ignored(self) -> list[IgnoredRow]:
        """The ignored rows recorded since the last call (``ignored_count`` keeps counting)."""
        taken, self.ignored = self.ignored, []
        return taken

    def advance_watermark(self, watermark_us: int) -> list[PaneResult]:
        """Move the watermark to ``watermark_us`` and return the panes that trigger.

        Raises:
            BoundError: ``watermark_us`` is below the current watermark.
        """
        w = _check_rowtime(watermark_us)
        if self.watermark_us is not None and w < self.watermark_us:
            raise BoundError(
                f"watermark_us={w} is below the window's watermark {self.watermark_us}: "
                "watermarks never move backwards"
            )
        self.watermark_us = w
        due: list[tuple[int, int, bool]] = []  # (end, start, retrigger)
        while self._untriggered and self._untriggered[0][0] <= w:
            end, start = heapq.heappop(self._untriggered)
            due.append((end, start, False))
        due.extend((self._panes[s].end_us, s, True) for s in self._dirty)
        self._dirty.clear()
        due.sort()
        results = []
        for end, start, retrigger in due:
            pane = self._panes[start]
            results.append(
                PaneResult(start, end, tuple(pane.rows), retrigger, pane.late if retrigger else 0)
            )
            pane.triggered = True
            pane.late = 0
        discard = self.spec.discard_age_us
        while self._closing and self._closing[0][0] + discard < w:
            _, start = heapq.heappop(self._closing)
            del self._panes[start]
        return results

    def insert_many(self, rows: Iterable[tuple[int, Any]]) -> None:
        """``insert`` for each ``(rowtime_us, value)`` pair, in order."""
        for rowtime_us, value in rows:
            self.insert(rowtime_us, value)

"""Rowtime bounds: punctuation that promises what later rows of a partition will carry.

A bound ``t`` (microseconds since the epoch) on a partition promises that every later data row of
that partition has ``rowtime_us >= t``. SQLstream's strict form (``rowtime > t``) is normalised to
the non-strict ``t + 1`` so the rest of the project handles a single form. A data row with
rowtime ``t`` implies the bound ``t``; bounds never move backwards; end of stream is the bound
:data:`END_OF_STREAM_US`, Spark's largest timestamp.
"""

from __future__ import annotations

from collections.abc import Iterable

from .errors import BoundError

#: Spark's largest timestamp, 9999-12-31T23:59:59.999999Z, in microseconds: the end of stream.
END_OF_STREAM_US = 253_402_300_799_999_999
#: Spark's smallest timestamp, 0001-01-01T00:00:00Z, in microseconds.
MIN_ROWTIME_US = -62_135_596_800_000_000
#: Below every rowtime: the clock of a partition that has none yet, where an ``int`` is needed
#: (far from int64's minimum, so that adding a range or a bound never wraps).
NO_TIME = -(2**62)


def normalize_bound(t_us: int, strict: bool = False) -> int:
    """The non-strict bound equal to ``t_us`` (or to ``> t_us`` when ``strict``)."""
    if strict:
        return min(t_us + 1, END_OF_STREAM_US)
    return t_us


def merge_clock(clocks: Iterable[int | None]) -> int | None:
    """The clock of several partitions: the minimum, or None while any of them has none.

    A merge cannot promise more than its slowest input (Odysseus union, SQLstream merge,
    Flink's minimum watermark): a partition that has said nothing yet holds the stream at None.
    """
    result: int | None = None
    for clock in clocks:
        if clock is None:
            return None
        result = clock if result is None else min(result, clock)
    return result


class BoundTracker:
    """The current bound of one partition, as a writer or reader advances it.

    ``clock_us`` is None until the first row or bound. Raising leaves the tracker unchanged.
    """

    __slots__ = ("clock_us", "where")

    def __init__(self, clock_us: int | None = None, where: str = "partition") -> None:
        self.clock_us = clock_us
        self.where = where

    def check_bound(self, t_us: int) -> None:
        """Raise :class:`BoundError` if a bound ``t_us`` would move the clock back."""
        if self.clock_us is not None and t_us < self.clock_us:
            raise BoundError(
                f"rowtime bound {t_us} us is below the current bound {self.clock_us} us of "
                f"{self.where}: bounds never move backwards; send a bound >= {self.clock_us} us"
            )

    def set_bound(self, t_us: int, strict: bool = False) -> int:
        """Advance to the bound ``t_us`` (normalised); returns the new clock."""
        t_us = normalize_bound(t_us, strict)
        self.check_bound(t_us)
        self.clock_us = t_us
        return t_us

    def observe_row(self, rowtime_us: int) -> int:
        """A data row implies the bound equal to its rowtime; returns the new clock."""
        if self.clock_us is None or rowtime_us > self.clock_us:
            self.clock_us = rowtime_us
        return self.clock_us

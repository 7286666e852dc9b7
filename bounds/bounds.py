"""Rowtime bounds: punctuation that promises what later rows of a partition will carry.

A bound ``t`` (microseconds since the epoch) on a partition promises that every later data row of
that partition has ``rowtime_us >= t``. SQLstream's strict form (``rowtime > t``) is normalised to
the non-strict ``t + 1`` so the rest of the project handles a single form. A data row with
rowtime ``t`` implies the bound ``t``; bounds never move backwards; end of stream is the bound
``END_OF_STREAM_US``, Spark's largest timestamp.
"""

from __future__ import annotations

from collections.abc import Iterable

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

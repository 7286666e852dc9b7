"""Durations for options (``heartbeat``, a watermark's ``delay``), as whole microseconds."""

from __future__ import annotations

import datetime as _dt
import math
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from numbers import Integral

import numpy as np

from .bounds import END_OF_STREAM_US, MIN_ROWTIME_US
from .errors import OptionError, shown
from .units import US_PER_DAY, US_PER_HOUR, US_PER_S

__all__ = ["parse_duration_us"]

_ONE_US = _dt.timedelta(microseconds=1)


_DURATION_UNITS_US: Mapping[str, int] = {
    **dict.fromkeys(("us", "µs", "usec", "usecs", "micro", "micros"), 1),
    **dict.fromkeys(("microsecond", "microseconds"), 1),
    **dict.fromkeys(("ms", "msec", "msecs", "milli", "millis"), 1_000),
    **dict.fromkeys(("millisecond", "milliseconds"), 1_000),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), US_PER_S),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60 * US_PER_S),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), US_PER_HOUR),
    **dict.fromkeys(("d", "day", "days"), US_PER_DAY),
}
_DURATION = re.compile(r"\s*([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))\s*([A-Za-zµ]*)\s*", re.ASCII)
_MAX_DURATION_US = END_OF_STREAM_US - MIN_ROWTIME_US


def parse_duration_us(value: object, *, what: str) -> int:
    """A positive duration, as whole microseconds, for an option named ``what``.

    Accepts an int or float number of seconds, a ``datetime.timedelta``, or a string: a number
    with an optional unit (seconds if none) such as ``"250ms"``, ``"5s"``, ``"1.5 seconds"``,
    ``"2 minutes"``, ``"1h"``, ``"10us"``, ``"1 day"``. Parts finer than a microsecond are
    truncated. Numbers are read as the decimals they print as (``0.1`` is 100000 us exactly).

    Raises:
        OptionError: unreadable, zero or negative (after truncation); the message names
            ``what``, the value and the accepted forms.
    """
    accepted = (
        "give a positive number of seconds, a datetime.timedelta, or a string such as "
        "'250ms', '5s', '1.5 seconds', '2 minutes', '1h', '10us', '1 day' "
        "(units: us, ms, s, min, h, day)"
    )
    if isinstance(value, (bool, np.bool_)):
        raise OptionError(f"{what}={shown(value)} is a bool, not a duration: {accepted}")
    amount: Decimal | None = None
    if isinstance(value, _dt.timedelta):
        total = value // _ONE_US
        amount = Decimal(total)
        scale = 1
    elif isinstance(value, Integral):
        amount, scale = Decimal(int(value)), US_PER_S
    elif isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            raise OptionError(f"{what}={shown(value)} is not a finite duration: {accepted}")
        amount, scale = Decimal(repr(float(value))), US_PER_S
    elif isinstance(value, Decimal) and value.is_finite():
        amount, scale = value, US_PER_S
    elif isinstance(value, str):
        match = _DURATION.fullmatch(value)
        unit_name = match.group(2) if match else ""
        key = unit_name if unit_name in _DURATION_UNITS_US else unit_name.lower()
        if match is None or (unit_name and key not in _DURATION_UNITS_US):
            raise OptionError(f"{what}={shown(value)} is not a duration: {accepted}")
        try:
            amount = Decimal(match.group(1))
        except InvalidOperation:  # pragma: no cover - the regex only lets numbers through
            raise OptionError(f"{what}={shown(value)} is not a duration: {accepted}") from None
        scale = _DURATION_UNITS_US[key] if unit_name else US_PER_S
    else:
        raise OptionError(
            f"{what}={shown(value)} of type {type(value).__name__} is not a duration: {accepted}"
        )
    duration_us = math.floor(amount * scale)
    if duration_us <= 0:
        raise OptionError(
            f"{what}={shown(value)} must be positive (at least 1 microsecond): {accepted}"
        )
    if duration_us > _MAX_DURATION_US:
        raise OptionError(
            f"{what}={shown(value)} is longer than Spark's whole timestamp range: {accepted}"
        )
    return duration_us

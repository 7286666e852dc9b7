"""Reading event times into integer microseconds, and durations for options.

Inside the core a rowtime is an ``int`` of microseconds since the Unix epoch (UTC), the
precision of Spark's TimestampType. Integers, not floats: a float64 holds only 15-16 significant
digits, fewer than the 16 of a present-day epoch in microseconds, so floats would lose or invent
microseconds. The range is Spark's, ``[MIN_ROWTIME_US, END_OF_STREAM_US]`` (years 1 to 9999),
both ends included.

Finer input (nanoseconds, up to 9 fractional digits) is truncated toward the past, never rounded,
also before 1970: ``-1 ns`` is ``-1 us`` and ``1969-12-31T23:59:59.9999999Z`` is ``-1 us``.

Naive wall-clock times (no offset) are read in a time zone ``tz``: an IANA name such as
``"Europe/Berlin"`` (via :mod:`zoneinfo`), ``"UTC"``, or a fixed offset such as ``"+05:30"``.
In a zone with daylight saving time a wall time that occurs twice takes the earlier instant, and
one that does not exist (skipped by a spring-forward) is read with the offset in force before
the change, so it lands that many hours later (Python's ``fold=0``, Java's ``ZonedDateTime``).

:func:`to_rowtime_us` reads one value; :func:`rowtime_array_us` reads a whole Arrow column with
the same rules, vectorised; the two agree value for value.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from numbers import Integral
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from .bounds import END_OF_STREAM_US, MIN_ROWTIME_US
from .errors import InvalidRowtimeError, OptionError

__all__ = [
    "EPOCH_UNITS_US",
    "format_rowtime",
    "from_rowtime_us",
    "parse_duration_us",
    "rowtime_array_us",
    "to_rowtime_us",
    "truncate_us",
]

#: Units of an integer epoch (and of Arrow timestamps) as ``(multiplier, divisor)``:
#: ``rowtime_us = value * mul // div``.
#: The floor division truncates nanoseconds toward the past (``-1 ns`` is ``-1 us``).
EPOCH_UNITS_US: Mapping[str, tuple[int, int]] = {
    "s": (1_000_000, 1),
    "ms": (1_000, 1),
    "us": (1, 1),
    "ns": (1, 1_000),
}

_US_PER_S = 1_000_000
_US_PER_HOUR = 3_600 * _US_PER_S
_US_PER_DAY = 24 * _US_PER_HOUR
_ONE_US = _dt.timedelta(microseconds=1)
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_EPOCH_NAIVE = _dt.datetime(1970, 1, 1)
_MAX_SHOWN = 80

Int64Array = npt.NDArray[np.int64]


def _show(value: object) -> str:
    """The repr of a value for an error message, truncated if long."""
    text = repr(value)
    if len(text) > _MAX_SHOWN:
        text = text[: _MAX_SHOWN - 3] + "..."
    return text


def _accepted(unit: str, tz: str, fmt: str | None) -> str:
    strings = (
        f"a string matching fmt={fmt!r}"
        if fmt is not None
        else "an ISO-8601 string (2009-03-01T12:15:22.345678Z; offset optional) or the SDP form "
        "yyyy/MM/dd HH:mm:ss:fffffffff (2009/03/01 12:15:22:345678901)"
    )
    return (
        f"accepted: {strings}, naive times read in tz={tz!r}; a datetime or date; an int or "
        f"float epoch in unit={unit!r} (one of s, ms, us, ns); numpy.datetime64; pandas.Timestamp"
    )


def _out_of_range(shown: str, rowtime_us: int | None = None) -> InvalidRowtimeError:
    at = f" ({rowtime_us} us)" if rowtime_us is not None else ""
    return InvalidRowtimeError(
        f"rowtime {shown}{at} is out of range: Spark timestamps run from "
        f"0001-01-01T00:00:00Z ({MIN_ROWTIME_US} us) to 9999-12-31T23:59:59.999999Z "
        f"({END_OF_STREAM_US} us)"
    )


def _checked(rowtime_us: int, value: object) -> int:
    if not MIN_ROWTIME_US <= rowtime_us <= END_OF_STREAM_US:
        raise _out_of_range(_show(value), rowtime_us)
    return rowtime_us


def _check_unit(unit: object) -> tuple[int, int]:
    try:
        return EPOCH_UNITS_US[unit]  # type: ignore[index]
    except (KeyError, TypeError):
        raise OptionError(
            f"unit={_show(unit)} is not an epoch unit: use one of 's', 'ms', 'us', 'ns' "
            "(the unit of integer and float epochs; default 'ms', as in Odysseus)"
        ) from None


# --------------------------------------------------------------------------------------------
# Time zones


_FIXED_OFFSET = re.compile(r"(?:UTC|GMT)?([+-])([0-9]{2}):?([0-9]{2})?", re.ASCII)
_UTC_NAMES = frozenset({"UTC", "Z", "GMT", "Etc/UTC", "Etc/GMT", "Etc/Zulu", "Zulu"})


@lru_cache(maxsize=256)
def _zone(tz: str) -> int | ZoneInfo:
    """A fixed offset in microseconds, or a ZoneInfo for zones with rules."""
    if not isinstance(tz, str):
        raise OptionError(f"tz={_show(tz)} is not a time zone: give a string such as 'UTC'")
    if tz in _UTC_NAMES:
        return 0
    fixed = _FIXED_OFFSET.fullmatch(tz)
    if fixed:
        sign, hours, minutes = fixed.groups()
        if int(hours) > 18 or int(minutes or 0) > 59:
            raise OptionError(f"tz={tz!r} is not a valid offset: offsets run from -18:00 to +18:00")
        off = (int(hours) * 3600 + int(minutes or 0) * 60) * _US_PER_S
        return -off if sign == "-" else off
    try:
        return ZoneInfo(tz)
    except (ValueError, OSError, KeyError) as exc:  # ZoneInfoNotFoundError is a KeyError
        raise OptionError(
            f"tz={tz!r} is not a known time zone: use an IANA name such as 'Europe/Berlin', "
            "'UTC', or a fixed offset such as '+05:30'"
        ) from exc


def _wall_offset_us(wall_us: int, zone: ZoneInfo) -> int:
    """The UTC offset (us) that ``zone`` gives a wall time, with ``fold=0``."""
    # Clamp to what datetime can hold; values outside fail the range check afterwards.
    wall_us = min(max(wall_us, MIN_ROWTIME_US), END_OF_STREAM_US)
    wall = _EPOCH_NAIVE + _dt.timedelta(microseconds=wall_us)
    off = wall.replace(tzinfo=zone).utcoffset()
    return 0 if off is None else off // _ONE_US


def _wall_to_utc_scalar(wall_us: int, tz: str) -> int:
    zone = _zone(tz)
    if isinstance(zone, int):
        return wall_us - zone
    return wall_us - _wall_offset_us(wall_us, zone)


def _wall_to_utc_array(wall_us: Int64Array, tz: str) -> Int64Array:
    """Vectorised :func:`_wall_to_utc_scalar`, with exactly the same (``fold=0``) semantics.

    The offset is looked up once per distinct wall-clock hour present, with zoneinfo itself, so
    the result cannot drift from the scalar path (Arrow's own time zone code stops applying
    daylight saving time after 2037 with slim tz databases). Inside an hour where the offset
    changes, the switching point is found by bisection. Assumes at most one change per hour.
    """
    zone = _zone(tz)
    if isinstance(zone, int):
        return wall_us - zone
    if wall_us.size == 0:
        return wall_us.copy()
    hours = wall_us // _US_PER_HOUR
    lo, hi = int(hours.min()), int(hours.max())
    if hi - lo <= 4 * hours.size + 1024:
        # Dense table over the span: O(n) instead of sorting.
        present = np.zeros(hi - lo + 1, dtype=bool)
        present[hours - lo] = True
        unique = np.flatnonzero(present) + lo
        slot = np.full(hi - lo + 1, -1, dtype=np.int64)
        slot[unique - lo] = np.arange(unique.size)
        inverse = slot[hours - lo]
    else:
        unique, inverse = np.unique(hours, return_inverse=True)
    first = np.empty(unique.size, dtype=np.int64)
    second = np.empty(unique.size, dtype=np.int64)
    switch = np.empty(unique.size, dtype=np.int64)
    for k, hour in enumerate(unique.tolist()):
        start = hour * _US_PER_HOUR
        end = start + _US_PER_HOUR - 1
        off_start = _wall_offset_us(start, zone)
        off_end = _wall_offset_us(end, zone)
        first[k] = off_start
        second[k] = off_end
        if off_start == off_end:
            switch[k] = end + 1
            continue
        # Smallest wall time in the hour that already has the later offset.
        low, high = start, end
        while low < high:
            mid = (low + high) // 2
            if _wall_offset_us(mid, zone) == off_start:
                low = mid + 1
            else:
                high = mid
        switch[k] = low
    offsets = np.where(wall_us < switch[inverse], first[inverse], second[inverse])
    return wall_us - offsets


# --------------------------------------------------------------------------------------------
# String forms: one regex per form, run by Python's re for one value and by Arrow's RE2
# (pyarrow.compute.extract_regex) for a column. Both engines accept the subset used here:
# [0-9] rather than \d (Python's \d matches every Unicode digit), named groups, (?i:...).

_OFFSET_RE = r"(?:(?P<offz>[Zz])|(?P<offsign>[+-])(?P<offh>[0-9]{2})(?::?(?P<offm>[0-9]{2}))?)"
_ISO_RE = (
    r"(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})"
    r"(?:[Tt ](?P<hour>[0-9]{2}):(?P<minute>[0-9]{2})"
    r"(?::(?P<second>[0-9]{2})(?:[.,](?P<frac>[0-9]{1,9}))?)?)?"
    r" ?" + _OFFSET_RE + "?"
)
_SDP_RE = (
    r"(?P<year>[0-9]{4})/(?P<month>[0-9]{2})/(?P<day>[0-9]{2}) "
    r"(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})"
    r"(?:[:.](?P<frac>[0-9]{1,9}))?"
)
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTH_NAMES = (
    "january|february|march|april|may|june|july|august|september|october|november|december"
)
_DAY_ABBR = "mon|tue|wed|thu|fri|sat|sun"
_DAY_NAMES = "monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_SPACE = "[ \t]*"


@dataclass(frozen=True)
class _Form:
    name: str
    body: str

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(re.compile(self.body).groupindex)

    @property
    def python(self) -> re.Pattern[str]:
        return _compiled(_SPACE + self.body + _SPACE)

    @property
    def re2(self) -> str:
        return "^" + _SPACE + self.body + _SPACE + "$"


@lru_cache(maxsize=64)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.ASCII)


_ISO = _Form("ISO-8601", _ISO_RE)
_SDP = _Form("SDP", _SDP_RE)


def _escape(ch: str) -> str:
    """A literal character for both re and RE2."""
    return "\\" + ch if ch in r".^$*+?()[]{}|\-/#&~" else ch


def _pattern_error(fmt: str, why: str) -> OptionError:
    return OptionError(
        f"fmt={fmt!r}: {why}. Supported Spark/Java pattern letters: yyyy or uuuu (year), yy, "
        "M/MM/MMM/MMMM (month), d/dd, H/HH, h/hh with a (AM/PM), m/mm, s/ss, S to SSSSSSSSS "
        "(fraction, 1 to that many digits), X/XX/XXX, x/xx/xxx, Z/ZZ/ZZZ/ZZZZZ (offsets), VV "
        "(zone id), E/EEE/EEEE (day name, ignored); 'text' in single quotes; [optional]"
    )


@lru_cache(maxsize=64)
def _pattern_form(fmt: str) -> _Form:
    """Translate a Spark/Java datetime pattern into a regex with the named groups we read."""
    if not isinstance(fmt, str) or not fmt:
        raise OptionError(f"fmt={_show(fmt)} is not a datetime pattern: give e.g. 'yyyy-MM-dd'")
    out: list[str] = []
    seen: set[str] = set()
    depth = 0
    i = 0

    def group(field: str, regex: str) -> str:
        if field in seen:
            raise _pattern_error(fmt, f"the {field} appears twice")
        seen.add(field)
        return f"(?P<{field}>{regex})"

    while i < len(fmt):
        ch = fmt[i]
        if ch == "'":
            end = fmt.find("'", i + 1)
            if end == i + 1:  # '' is a literal quote
                out.append("'")
                i += 2
                continue
            if end < 0:
                raise _pattern_error(fmt, f"unclosed quote at position {i}")
            out.extend(_escape(c) for c in fmt[i + 1 : end])
            i = end + 1
            continue
        if ch == "[":
            out.append("(?:")
            depth += 1
            i += 1
            continue
        if ch == "]":
            if depth == 0:
                raise _pattern_error(fmt, f"']' without '[' at position {i}")
            out.append(")?")
            depth -= 1
            i += 1
            continue
        if not ("a" <= ch <= "z" or "A" <= ch <= "Z"):
            out.append(_escape(ch))
            i += 1
            continue
        n = 1
        while i + n < len(fmt) and fmt[i + n] == ch:
            n += 1
        i += n
        if ch in "yu":
            out.append(group("year2", "[0-9]{2}") if n == 2 else group("year", f"[0-9]{{{n},4}}"))
        elif ch in "ML":
            if n == 1:
                out.append(group("month", "[0-9]{1,2}"))
            elif n == 2:
                out.append(group("month", "[0-9]{2}"))
            elif n == 3:
                out.append(group("monname", "(?i:" + "|".join(_MONTHS) + ")"))
            elif n == 4:
                out.append(group("monname", "(?i:" + _MONTH_NAMES + ")"))
            else:
                raise _pattern_error(fmt, f"{ch * n} is not a month field")
        elif ch in "dHhms":
            field = {"d": "day", "H": "hour", "h": "hour12", "m": "minute", "s": "second"}[ch]
            if n > 2:
                raise _pattern_error(fmt, f"{ch * n} has too many letters (at most 2)")
            out.append(group(field, "[0-9]{1,2}" if n == 1 else "[0-9]{2}"))
        elif ch == "S":
            if n > 9:
                raise _pattern_error(fmt, "a fraction has at most 9 digits (SSSSSSSSS)")
            out.append(group("frac", f"[0-9]{{1,{n}}}"))
        elif ch == "a":
            out.append(group("ampm", "(?i:am|pm)"))
        elif ch == "E":
            out.append("(?i:" + (_DAY_NAMES if n >= 4 else _DAY_ABBR) + ")")
        elif ch in "XxZ":
            if "offset" in seen:
                raise _pattern_error(fmt, "the offset appears twice")
            seen.add("offset")
            allow_z = ch == "X" or (ch == "Z" and n == 5)
            body = r"(?P<offsign>[+-])(?P<offh>[0-9]{2})(?::?(?P<offm>[0-9]{2}))?"
            out.append(f"(?:(?P<offz>[Zz])|{body})" if allow_z else f"(?:{body})")
        elif ch == "V" and n == 2:
            out.append(group("zone", r"[A-Za-z][A-Za-z0-9_+\-]*(?:\/[A-Za-z0-9_+\-]+)*"))
        else:
            raise _pattern_error(fmt, f"pattern letter {ch!r} ({ch * n}) is not supported")
    if depth:
        raise _pattern_error(fmt, "'[' without ']'")
    if "year" not in seen and "year2" not in seen:
        raise _pattern_error(fmt, "it has no year (yyyy)")
    if "month" not in seen and "monname" not in seen:
        raise _pattern_error(fmt, "it has no month (MM)")
    if "day" not in seen:
        raise _pattern_error(fmt, "it has no day of month (dd)")
    if ("hour12" in seen) != ("ampm" in seen):
        raise _pattern_error(fmt, "h (hour 1-12) needs a (AM/PM) and a needs h; use HH for 0-23")
    if "hour" in seen and "hour12" in seen:
        raise _pattern_error(fmt, "it has both H and h")
    form = _Form(f"pattern {fmt!r}", "".join(out))
    try:  # both engines must accept it; fail here rather than on the first value
        _compiled(form.body)
    except re.error as exc:  # pragma: no cover - the translation only emits valid regexes
        raise _pattern_error(fmt, f"it does not translate to a regex ({exc})") from exc
    return form


def _forms(fmt: str | None) -> tuple[_Form, ...]:
    return (_pattern_form(fmt),) if fmt is not None else (_ISO, _SDP)


def _days_from_civil(year: Any, month: Any, day: Any) -> Any:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant); ints or int arrays."""
    year = year - (month <= 2)
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + np.where(month > 2, -3, 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


def _string_to_us(text: str, value: object, tz: str, fmt: str | None, unit: str) -> int:
    for form in _forms(fmt):
        match = form.python.fullmatch(text)
        if match is None:
            continue
        g = match.groupdict()
        try:
            year = int(g["year"]) if g.get("year") else 2000 + int(g["year2"])
            if g.get("monname"):
                month = _MONTHS.index(g["monname"][:3].lower()) + 1
            else:
                month = int(g["month"])
            hour = int(g.get("hour") or 0)
            if g.get("hour12"):
                hour12 = int(g["hour12"])
                if not 1 <= hour12 <= 12:
                    raise ValueError("hour must be in 1..12 with AM/PM")
                hour = hour12 % 12 + (12 if g["ampm"].lower() == "pm" else 0)
            frac = g.get("frac") or ""
            micro = int((frac + "000000")[:6])
            wall = _dt.datetime(
                year, month, int(g["day"]), hour, int(g.get("minute") or 0),
                int(g.get("second") or 0), micro,
            )  # fmt: skip
            offh, offm = int(g.get("offh") or 0), int(g.get("offm") or 0)
            if offh > 18 or offm > 59:
                raise ValueError("offsets run from -18:00 to +18:00")
        except ValueError as exc:
            raise InvalidRowtimeError(
                f"rowtime {_show(value)} has the {form.name} form but an invalid field ({exc}); "
                + _accepted(unit, tz, fmt)
            ) from None
        wall_us = (wall - _EPOCH_NAIVE) // _ONE_US
        if g.get("offz"):
            return _checked(wall_us, value)
        if g.get("offsign"):
            off = (offh * 3600 + offm * 60) * _US_PER_S
            return _checked(wall_us - (off if g["offsign"] == "+" else -off), value)
        zone = g.get("zone")
        if zone:
            try:
                _zone(zone)
            except OptionError:
                raise InvalidRowtimeError(
                    f"rowtime {_show(value)} names an unknown time zone {zone!r} (zone ids are "
                    "IANA names such as 'Europe/Berlin'); " + _accepted(unit, tz, fmt)
                ) from None
            return _checked(_wall_to_utc_scalar(wall_us, zone), value)
        return _checked(_wall_to_utc_scalar(wall_us, tz), value)
    raise InvalidRowtimeError(
        f"cannot read a rowtime from {_show(value)}; " + _accepted(unit, tz, fmt)
    )


# --------------------------------------------------------------------------------------------
# Floats. A float is a binary approximation of the decimal its writer meant: 0.29 s is
# 0.28999999999999998 s. A product within two units in the last place of a whole microsecond is
# taken as that microsecond; anything else is truncated toward the past. Scalar and array use
# the same rule so they agree.


def _float_to_us(value: float, unit: str, shown: str, tz: str, fmt: str | None) -> int:
    if not math.isfinite(value):
        raise InvalidRowtimeError(
            f"cannot read a rowtime from {shown}; " + _accepted(unit, tz, fmt)
        )
    mul, div = EPOCH_UNITS_US[unit]
    scaled = value * mul / div
    if not float(MIN_ROWTIME_US) - 2 <= scaled <= float(END_OF_STREAM_US) + 2:
        raise _out_of_range(shown)
    nearest = round(scaled)
    if abs(scaled - nearest) <= 2 * math.ulp(scaled):
        return nearest
    return math.floor(scaled)


def _floats_to_us(values: npt.NDArray[np.float64], unit: str) -> Int64Array:
    mul, div = EPOCH_UNITS_US[unit]
    scaled = values * mul / div
    nearest = np.rint(scaled)
    snapped = np.where(
        np.abs(scaled - nearest) <= 2 * np.spacing(np.abs(scaled)), nearest, np.floor(scaled)
    )
    return snapped.astype(np.int64)


# --------------------------------------------------------------------------------------------
# One value


def _datetime64_to_us(value: np.datetime64, shown: str) -> int:
    if np.isnat(value):
        raise InvalidRowtimeError(f"rowtime {shown} is NaT (not a time): a rowtime is required")
    unit, count = np.datetime_data(value.dtype)
    if unit in ("ns", "ps", "fs", "as"):
        per_us = {"ns": 1_000, "ps": 1_000_000, "fs": 10**9, "as": 10**12}[unit]
        return int(value.astype(np.int64)) * count // per_us
    return int(value.astype("datetime64[us]").astype(np.int64))


def to_rowtime_us(
    value: object, *, unit: str = "ms", tz: str = "UTC", fmt: str | None = None
) -> int:
    """Read one event time as microseconds since the epoch (UTC).

    Accepts a timezone-aware ``datetime`` (exact), a naive ``datetime`` or a ``date`` (midnight)
    read in ``tz``; an ``int`` epoch in ``unit`` (``"s"``, ``"ms"`` (default, as in Odysseus),
    ``"us"``, ``"ns"``); a ``float`` or ``Decimal`` epoch in ``unit``; ``numpy.datetime64`` and
    ``pandas.Timestamp`` (nanoseconds truncated); and strings: ISO-8601 with or without an offset
    or ``Z`` (up to 9 fractional digits), the SDP form ``yyyy/MM/dd HH:mm:ss:fffffffff`` (the last
    field is the fraction, 1 to 9 digits), or, when ``fmt`` is given, only strings matching that
    Spark/Java datetime pattern. ``bool`` is rejected, not read as 0 or 1.

    Sub-microsecond parts are truncated toward the past. The result lies in
    ``[MIN_ROWTIME_US, END_OF_STREAM_US]``.

    Raises:
        InvalidRowtimeError: the value cannot be read or is out of range; the message shows
            the value and the accepted forms.
        OptionError: ``unit``, ``tz`` or ``fmt`` is not valid.
    """
    mul, div = _check_unit(unit)
    _zone(tz)
    if fmt is not None:
        _pattern_form(fmt)
    if isinstance(value, (bool, np.bool_)):
        raise InvalidRowtimeError(
            f"rowtime {_show(value)} is a bool, not a time; " + _accepted(unit, tz, fmt)
        )
    if isinstance(value, _dt.datetime):
        if type(value).__name__ == "NaTType":  # pandas.NaT passes isinstance(datetime)
            raise InvalidRowtimeError(f"rowtime {_show(value)} is NaT (not a time)")
        # pandas.Timestamp is a datetime: its datetime fields already floor to microseconds.
        if value.tzinfo is not None and value.utcoffset() is not None:
            return _checked((value - _EPOCH) // _ONE_US, value)
        wall_us = (value.replace(tzinfo=None) - _EPOCH_NAIVE) // _ONE_US
        return _checked(_wall_to_utc_scalar(wall_us, tz), value)
    if isinstance(value, _dt.date):
        wall_us = (value - _EPOCH_NAIVE.date()).days * _US_PER_DAY
        return _checked(_wall_to_utc_scalar(wall_us, tz), value)
    if isinstance(value, Integral):
        return _checked(int(value) * mul // div, value)
    if isinstance(value, float):  # includes numpy.float64
        return _checked(_float_to_us(value, unit, _show(value), tz, fmt), value)
    if isinstance(value, np.floating):
        return _checked(_float_to_us(float(value), unit, _show(value), tz, fmt), value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise InvalidRowtimeError(f"cannot read a rowtime from {_show(value)}")
        return _checked(math.floor(value * mul / div), value)
    if isinstance(value, np.datetime64):
        return _checked(_datetime64_to_us(value, _show(value)), value)
    if isinstance(value, str):
        return _string_to_us(value, value, tz, fmt, unit)
    if isinstance(value, pa.Scalar):
        if not value.is_valid:
            raise InvalidRowtimeError(f"rowtime {_show(value)} is null: a rowtime is required")
        # Through the array path: as_py() would drop nanoseconds before we can floor them.
        array = pa.array([value], type=value.type)
        return int(rowtime_array_us(array, unit=unit, tz=tz, fmt=fmt, what="value")[0])
    raise InvalidRowtimeError(
        f"cannot read a rowtime from {_show(value)} of type {type(value).__name__}; "
        + _accepted(unit, tz, fmt)
    )


def from_rowtime_us(rowtime_us: int) -> _dt.datetime:
    """The timezone-aware UTC ``datetime`` of a rowtime, exact to the microsecond.

    Works over the whole range, ``END_OF_STREAM_US`` and times before 1970 included.

    Raises:
        InvalidRowtimeError: ``rowtime_us`` is not an int or is out of range.
    """
    if isinstance(rowtime_us, (bool, np.bool_)) or not isinstance(rowtime_us, Integral):
        raise InvalidRowtimeError(
            f"rowtime_us={_show(rowtime_us)} is not an integer number of microseconds"
        )
    rowtime_us = _checked(int(rowtime_us), rowtime_us)
    return _EPOCH + _dt.timedelta(microseconds=rowtime_us)


#: How :func:`format_rowtime` writes :data:`END_OF_STREAM_US`; the CLI reads the same word back.
END_OF_STREAM_TEXT = "end-of-stream"


def format_rowtime(rowtime_us: int | None) -> str:
    """A rowtime for people, logs and JSON files: ISO-8601 UTC with ``Z``, exact to the
    microsecond (the fraction is written when it is not zero).

    ``END_OF_STREAM_US`` (and above) is :data:`END_OF_STREAM_TEXT`, ``None`` (no clock yet) is
    ``"none"``, and an int below Spark's range (a corrupt file being reported) is
    ``"<n> us"``: formatting never raises, so an error message is never lost to its formatter.
    """
    if rowtime_us is None:
        return "none"
    if rowtime_us >= END_OF_STREAM_US:
        return END_OF_STREAM_TEXT
    if rowtime_us < MIN_ROWTIME_US:
        return f"{rowtime_us} us"
    return from_rowtime_us(rowtime_us).isoformat().replace("+00:00", "Z")


def truncate_us(rowtime_us: int, unit_us: int) -> int:
    """``rowtime_us`` floored to a multiple of ``unit_us`` (toward the past, also before 1970).

    Raises:
        OptionError: ``unit_us`` is not a positive int.
    """
    if isinstance(unit_us, bool) or not isinstance(unit_us, Integral) or unit_us <= 0:
        raise OptionError(f"unit_us={_show(unit_us)} must be a positive integer of microseconds")
    return rowtime_us - rowtime_us % unit_us


# --------------------------------------------------------------------------------------------
# Whole columns


def rowtime_array_us(
    values: pa.Array | pa.ChunkedArray,
    *,
    unit: str = "ms",
    tz: str = "UTC",
    fmt: str | None = None,
    what: str = "column",
) -> Int64Array:
    """Read a whole Arrow column of event times as an int64 numpy array of microseconds.

    The same rules as :func:`to_rowtime_us`, vectorised: timestamps of any unit (floored to
    microseconds; naive ones read in ``tz``, zoned ones exact), ``date32``/``date64`` (midnight in
    ``tz``), integers (epoch in ``unit``), floats, and strings (ISO-8601 and SDP, or ``fmt``), read
    with Arrow's own ISO parser or RE2 regexes, so no Python loop runs per value.
    Dictionary-encoded columns are decoded first. Naive values in a zone with rules cost one
    zoneinfo lookup per distinct wall-clock hour.

    The result may be a read-only view of the column's buffer (int64 microseconds need no
    copy): copy it before writing into it.

    Raises:
        InvalidRowtimeError: a null, an unreadable or out-of-range value; the message names
            ``what``, the index of the first bad value and the value.
        OptionError: ``unit``, ``tz`` or ``fmt`` is not valid.
    """
    _check_unit(unit)
    _zone(tz)
    if fmt is not None:
        _pattern_form(fmt)
    if isinstance(values, pa.ChunkedArray):
        parts: list[Int64Array] = []
        base = 0
        for chunk in values.chunks:
            parts.append(_array_to_us(chunk, unit, tz, fmt, what, base))
            base += len(chunk)
        if not parts:
            return np.empty(0, dtype=np.int64)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)
    if not isinstance(values, pa.Array):
        raise OptionError(
            f"{what}: rowtime_array_us needs a pyarrow Array or ChunkedArray, "
            f"not {type(values).__name__}"
        )
    return _array_to_us(values, unit, tz, fmt, what, 0)


def _bad_value(
    what: str, base: int, index: int, value: object, why: str, unit: str, tz: str, fmt: str | None
) -> InvalidRowtimeError:
    return InvalidRowtimeError(
        f"{what}: value at index {base + index} is {_show(value)}: {why}; "
        + _accepted(unit, tz, fmt)
    )


def _array_to_us(
    array: pa.Array, unit: str, tz: str, fmt: str | None, what: str, base: int
) -> Int64Array:
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if array.null_count:
        index = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
        raise _bad_value(
            what, base, index, None, "a null, but a rowtime is required", unit, tz, fmt
        )
    kind = array.type

    def check_range(result: Int64Array, source: pa.Array | None = None) -> Int64Array:
        if result.size == 0:
            return result
        if result.min() < MIN_ROWTIME_US or result.max() > END_OF_STREAM_US:
            bad = (result < MIN_ROWTIME_US) | (result > END_OF_STREAM_US)
            index = int(np.flatnonzero(bad)[0])
            shown = _item(source if source is not None else array, index)
            raise _bad_value(
                what, base, index, shown,
                f"out of range ({int(result[index])} us): Spark timestamps run from "
                f"{MIN_ROWTIME_US} to {END_OF_STREAM_US} us",
                unit, tz, fmt,
            )  # fmt: skip
        return result

    if pa.types.is_timestamp(kind):
        raw = array.view(pa.int64()).to_numpy(zero_copy_only=False)
        result = _scale_ints(raw, *EPOCH_UNITS_US[kind.unit], array, what, base, unit, tz, fmt)
        if kind.tz is None:
            result = _wall_to_utc_array(result, tz)
        return check_range(result)
    if pa.types.is_date32(kind):
        days = array.view(pa.int32()).to_numpy(zero_copy_only=False).astype(np.int64)
        return check_range(_wall_to_utc_array(days * _US_PER_DAY, tz))
    if pa.types.is_date64(kind):
        ms = array.view(pa.int64()).to_numpy(zero_copy_only=False)
        result = _scale_ints(ms, 1_000, 1, array, what, base, unit, tz, fmt)
        return check_range(_wall_to_utc_array(result, tz))
    if pa.types.is_integer(kind):
        if pa.types.is_uint64(kind):
            big = pc.greater(array, pa.scalar(2**63 - 1, pa.uint64()))
            if pc.any(big).as_py():
                index = int(np.flatnonzero(big.to_numpy(zero_copy_only=False))[0])
                raise _bad_value(
                    what, base, index, _item(array, index), "out of range", unit, tz, fmt
                )
        raw = array.cast(pa.int64(), safe=False).to_numpy(zero_copy_only=False)
        return check_range(
            _scale_ints(raw, *EPOCH_UNITS_US[unit], array, what, base, unit, tz, fmt)
        )
    if pa.types.is_floating(kind):
        floats = array.cast(pa.float64()).to_numpy(zero_copy_only=False)
        finite = np.isfinite(floats)
        mul, div = EPOCH_UNITS_US[unit]
        limit = (np.abs(floats) * mul / div) <= float(END_OF_STREAM_US) + 2
        ok = finite & limit
        if not ok.all():
            index = int(np.flatnonzero(~ok)[0])
            why = "not a finite number" if not finite[index] else "out of range"
            raise _bad_value(what, base, index, float(floats[index]), why, unit, tz, fmt)
        return check_range(_floats_to_us(floats, unit))
    if pa.types.is_decimal(kind):
        # Rare: exact per value, with the scalar rule.
        items = array.to_pylist()
        try:
            out = [to_rowtime_us(v, unit=unit, tz=tz, fmt=fmt) for v in items]
        except InvalidRowtimeError:
            for index, v in enumerate(items):
                try:
                    to_rowtime_us(v, unit=unit, tz=tz, fmt=fmt)
                except InvalidRowtimeError as exc:
                    raise _bad_value(what, base, index, v, str(exc), unit, tz, fmt) from None
            raise
        return np.array(out, dtype=np.int64)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or _is_string_view(kind):
        strings = array.cast(pa.string()) if not pa.types.is_string(kind) else array
        return check_range(_strings_to_us(strings, unit, tz, fmt, what, base), strings)
    raise OptionError(
        f"{what}: an Arrow column of type {kind} cannot hold rowtimes: use a timestamp, date, "
        "integer or float epoch, or string column"
    )


def _item(array: pa.Array, index: int) -> object:
    """One value for an error message; a timestamp Python cannot hold shows as its raw int."""
    try:
        return array[index].as_py()
    except (OverflowError, ValueError):
        return f"{array.type} {array.view(pa.int64())[index].as_py()}"


def _is_string_view(kind: pa.DataType) -> bool:
    check: Callable[[pa.DataType], bool] | None = getattr(pa.types, "is_string_view", None)
    return bool(check and check(kind))


def _scale_ints(
    raw: Int64Array,
    mul: int,
    div: int,
    array: pa.Array,
    what: str,
    base: int,
    unit: str,
    tz: str,
    fmt: str | None,
) -> Int64Array:
    """``raw * mul // div`` without int64 overflow (checked on the input before multiplying)."""
    if div != 1:
        return raw // div  # floor division: toward the past, also for negatives
    if mul == 1:
        return raw
    if raw.size:
        lo, hi = -(-MIN_ROWTIME_US // mul), END_OF_STREAM_US // mul
        if raw.min() < lo or raw.max() > hi:
            index = int(np.flatnonzero((raw < lo) | (raw > hi))[0])
            raise _bad_value(
                what, base, index, _item(array, index),
                f"out of range: Spark timestamps run from {MIN_ROWTIME_US} to "
                f"{END_OF_STREAM_US} us",
                unit, tz, fmt,
            )  # fmt: skip
    return raw * mul


def _digits(field: pa.Array, default: str = "0") -> Int64Array:
    """A column of ASCII digit strings as int64; empty strings (absent groups) read as default."""
    filled = pc.if_else(pc.equal(pc.utf8_length(field), 0), default, field)
    return filled.cast(pa.int64()).to_numpy(zero_copy_only=False)


def _strings_to_us(
    strings: pa.Array, unit: str, tz: str, fmt: str | None, what: str, base: int
) -> Int64Array:
    n = len(strings)
    out = np.empty(n, dtype=np.int64)
    remaining = np.arange(n, dtype=np.int64)
    pending = strings
    for form in _forms(fmt):
        if remaining.size == 0:
            break
        fast = _arrow_fast(pending, form, tz)
        if fast is not None:
            matched, converted = fast
            out[remaining[matched]] = converted
        else:
            extracted = pc.extract_regex(pending, pattern=form.re2)
            matched = extracted.is_valid().to_numpy(zero_copy_only=False)
            if matched.any():
                rows = remaining[matched]
                fields = extracted.filter(pa.array(matched))
                out[rows] = _fields_to_us(fields, form, rows, strings, unit, tz, fmt, what, base)
        if not matched.all():
            keep = ~matched
            remaining = remaining[keep]
            pending = pending.filter(pa.array(keep))
        else:
            remaining = remaining[:0]
    if remaining.size:
        index = int(remaining[0])
        value = strings[index].as_py()
        raise _bad_value(what, base, index, value, "not a form that can be read", unit, tz, fmt)
    return out


# A time of day followed by an offset or Z, at the end of an ISO string.
_ISO_ZONED_RE = (
    r"[0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:[.,][0-9]+)?)? ?(?:[Zz]|[+-][0-9]{2}(?::?[0-9]{2})?)[ \t]*$"
)
# SDP with a fraction, rewritten as naive ISO for Arrow's parser.
_SDP_AS_ISO = (
    r"^[ \t]*([0-9]{4})/([0-9]{2})/([0-9]{2}) ([0-9]{2}:[0-9]{2}:[0-9]{2})[:.]([0-9]{1,9})[ \t]*$",
    r"\1-\2-\3 \4.\5",
)


def _arrow_fast(
    strings: pa.Array, form: _Form, tz: str
) -> tuple[npt.NDArray[np.bool_], Int64Array] | None:
    """ISO-8601 and SDP through Arrow's own parser, several times faster than regex captures.

    Only for values that match our regex for the form (so Arrow never reads a form we reject),
    and only when Arrow reads every one of them: it parses into nanoseconds (years 1677 to
    2262) and reads zoned and naive strings each into its own type; anything it refuses goes
    the slow, exact way. Returns ``(matched, rowtimes_us of the matched)`` or None.
    """
    if form is not _ISO and form is not _SDP:
        return None
    matched = pc.match_substring_regex(strings, pattern=form.re2)
    mask = matched.to_numpy(zero_copy_only=False)
    if not mask.any():
        return None
    subset = strings if mask.all() else strings.filter(matched)
    if form is _SDP:
        iso = pc.replace_substring_regex(subset, pattern=_SDP_AS_ISO[0], replacement=_SDP_AS_ISO[1])
        zoned = np.zeros(len(subset), dtype=bool)
    else:
        iso = subset
        # Scan rather than guess: a cast that fails costs far more than this regex.
        zoned = pc.match_substring_regex(subset, pattern=_ISO_ZONED_RE).to_numpy(
            zero_copy_only=False
        )
    out = np.empty(len(subset), dtype=np.int64)
    for want_zoned, kind in ((True, pa.timestamp("ns", "UTC")), (False, pa.timestamp("ns"))):
        picked = zoned if want_zoned else ~zoned
        if not picked.any():
            continue
        part = iso if picked.all() else iso.filter(pa.array(picked))
        try:
            ns = pc.cast(part, kind)
        except pa.ArrowInvalid:
            return None
        us = ns.view(pa.int64()).to_numpy(zero_copy_only=False) // 1_000
        out[picked] = us if want_zoned else _wall_to_utc_array(us, tz)
    return mask, out


def _fields_to_us(
    fields: pa.StructArray,
    form: _Form,
    rows: Int64Array,
    strings: pa.Array,
    unit: str,
    tz: str,
    fmt: str | None,
    what: str,
    base: int,
) -> Int64Array:
    names = set(form.fields)

    def col(name: str) -> pa.Array:
        return fields.field(name)

    if "year" in names:
        year = _digits(col("year"))
    else:
        year = _digits(col("year2")) + 2000
    if "monname" in names:
        prefix = pc.utf8_lower(pc.utf8_slice_codeunits(col("monname"), 0, 3))
        month = pc.index_in(prefix, value_set=pa.array(_MONTHS)).to_numpy(zero_copy_only=False)
        month = month.astype(np.int64) + 1
    else:
        month = _digits(col("month"))
    day = _digits(col("day"))
    hour = _digits(col("hour")) if "hour" in names else np.zeros(len(fields), dtype=np.int64)
    valid = np.ones(len(fields), dtype=bool)
    if "hour12" in names:
        hour12 = _digits(col("hour12"))
        valid &= (hour12 >= 1) & (hour12 <= 12)
        pm = pc.equal(pc.utf8_lower(col("ampm")), "pm").to_numpy(zero_copy_only=False)
        hour = hour12 % 12 + np.where(pm, 12, 0)
    minute = _digits(col("minute")) if "minute" in names else 0
    second = _digits(col("second")) if "second" in names else 0
    if "frac" in names:
        frac_ns = pc.utf8_rpad(col("frac"), width=9, padding="0").cast(pa.int64())
        micro = frac_ns.to_numpy(zero_copy_only=False) // 1_000
    else:
        micro = 0

    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    month_ok = (month >= 1) & (month <= 12)
    days_in = np.array([0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)[
        np.where(month_ok, month, 0)
    ] + ((month == 2) & leap)
    valid &= (year >= 1) & (year <= 9999) & month_ok & (day >= 1) & (day <= days_in)
    valid &= (hour >= 0) & (hour <= 23)
    valid &= (np.asarray(minute) <= 59) & (np.asarray(second) <= 59)
    offset = np.zeros(len(fields), dtype=np.int64)
    has_offset = np.zeros(len(fields), dtype=bool)
    if "offsign" in names:
        offh = _digits(col("offh"))
        offm = _digits(col("offm"))
        valid &= (offh <= 18) & (offm <= 59)
        minus = pc.equal(col("offsign"), "-").to_numpy(zero_copy_only=False)
        has_sign = pc.greater(pc.utf8_length(col("offsign")), 0).to_numpy(zero_copy_only=False)
        offset = np.where(minus, -1, 1) * (offh * 3600 + offm * 60) * _US_PER_S
        offset = np.where(has_sign, offset, 0)
        has_offset = has_sign
    if "offz" in names:
        has_offset = has_offset | pc.greater(pc.utf8_length(col("offz")), 0).to_numpy(
            zero_copy_only=False
        )
    if not valid.all():
        index = int(rows[np.flatnonzero(~valid)[0]])
        raise _bad_value(
            what, base, index, strings[index].as_py(),
            f"it has the {form.name} form but an invalid field (date, hour, minute, second or "
            "offset out of range)",
            unit, tz, fmt,
        )  # fmt: skip
    days = _days_from_civil(year, month, day)
    wall = (((days * 24 + hour) * 60 + minute) * 60 + second) * _US_PER_S + micro
    result = np.asarray(wall - offset, dtype=np.int64)
    naive = ~has_offset
    if "zone" in names:
        zones = col("zone")
        zone_values = zones.to_numpy(zero_copy_only=False)
        has_zone = pc.greater(pc.utf8_length(zones), 0).to_numpy(zero_copy_only=False)
        for name in pc.unique(zones.filter(pa.array(has_zone & naive))).to_pylist():
            picked = naive & has_zone & (zone_values == name)
            try:
                _zone(name)
            except OptionError:
                index = int(rows[np.flatnonzero(picked)[0]])
                raise _bad_value(
                    what, base, index, strings[index].as_py(),
                    f"unknown time zone {name!r}", unit, tz, fmt,
                ) from None  # fmt: skip
            result[picked] = _wall_to_utc_array(result[picked], name)
        naive &= ~has_zone
    if naive.all():
        return _wall_to_utc_array(result, tz)
    if naive.any():
        result[naive] = _wall_to_utc_array(result[naive], tz)
    return result


# --------------------------------------------------------------------------------------------
# Durations for options

_DURATION_UNITS_US: Mapping[str, int] = {
    **dict.fromkeys(("us", "µs", "usec", "usecs", "micro", "micros"), 1),
    **dict.fromkeys(("microsecond", "microseconds"), 1),
    **dict.fromkeys(("ms", "msec", "msecs", "milli", "millis"), 1_000),
    **dict.fromkeys(("millisecond", "milliseconds"), 1_000),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), _US_PER_S),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60 * _US_PER_S),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), _US_PER_HOUR),
    **dict.fromkeys(("d", "day", "days"), _US_PER_DAY),
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
        raise OptionError(f"{what}={_show(value)} is a bool, not a duration: {accepted}")
    amount: Decimal | None = None
    if isinstance(value, _dt.timedelta):
        total = value // _ONE_US
        amount = Decimal(total)
        scale = 1
    elif isinstance(value, Integral):
        amount, scale = Decimal(int(value)), _US_PER_S
    elif isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            raise OptionError(f"{what}={_show(value)} is not a finite duration: {accepted}")
        amount, scale = Decimal(repr(float(value))), _US_PER_S
    elif isinstance(value, Decimal) and value.is_finite():
        amount, scale = value, _US_PER_S
    elif isinstance(value, str):
        match = _DURATION.fullmatch(value)
        unit_name = match.group(2) if match else ""
        key = unit_name if unit_name in _DURATION_UNITS_US else unit_name.lower()
        if match is None or (unit_name and key not in _DURATION_UNITS_US):
            raise OptionError(f"{what}={_show(value)} is not a duration: {accepted}")
        try:
            amount = Decimal(match.group(1))
        except InvalidOperation:  # pragma: no cover - the regex only lets numbers through
            raise OptionError(f"{what}={_show(value)} is not a duration: {accepted}") from None
        scale = _DURATION_UNITS_US[key] if unit_name else _US_PER_S
    else:
        raise OptionError(
            f"{what}={_show(value)} of type {type(value).__name__} is not a duration: {accepted}"
        )
    duration_us = math.floor(amount * scale)
    if duration_us <= 0:
        raise OptionError(
            f"{what}={_show(value)} must be positive (at least 1 microsecond): {accepted}"
        )
    if duration_us > _MAX_DURATION_US:
        raise OptionError(
            f"{what}={_show(value)} is longer than Spark's whole timestamp range: {accepted}"
        )
    return duration_us

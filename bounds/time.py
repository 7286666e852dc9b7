"""Reading event times into integer microseconds: one value, or a whole Arrow column.

Inside the core a rowtime is an ``int`` of microseconds since the Unix epoch (UTC), the
precision of Spark's TimestampType. Integers, not floats: a float64 holds only 15-16 significant
digits, fewer than the 16 of a present-day epoch in microseconds, so floats would lose or invent
microseconds. The range is Spark's, ``[MIN_ROWTIME_US, END_OF_STREAM_US]`` (years 1 to 9999),
both ends included.

Finer input (nanoseconds, up to 9 fractional digits) is truncated toward the past, never rounded,
also before 1970: ``-1 ns`` is ``-1 us`` and ``1969-12-31T23:59:59.9999999Z`` is ``-1 us``.

How values are read is one ``TimeFormat``: the ``unit`` of epochs, the zone ``tz`` of naive
wall-clock times (rules in ``zones``) and an optional pattern ``fmt`` for strings (forms in
``patterns``), validated once when it is built. ``TimeFormat.read`` reads one value;
``TimeFormat.read_array`` reads a whole Arrow column with the same rules, vectorised; the two
agree value for value. ``to_rowtime_us`` and ``rowtime_array_us`` do the same for a
format given as keywords. Durations for options live in ``durations``.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from numbers import Integral
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from .arrays import as_numpy, to_arrow
from .bounds import END_OF_STREAM_US, MIN_ROWTIME_US
from .durations import parse_duration_us
from .errors import InvalidRowtimeError, OptionError, shown
from .patterns import ISO, MONTHS, SDP, Form, forms, pattern_form
from .units import EPOCH_UNITS_US, US_PER_DAY, US_PER_S
from .zones import EPOCH_NAIVE, ONE_US, check_zone, wall_to_utc_array, wall_to_utc_scalar

__all__ = [
    "EPOCH_UNITS_US",
    "TimeFormat",
    "format_rowtime",
    "from_rowtime_us",
    "parse_duration_us",  # defined in .durations; importable here as before
    "rowtime_array_us",
    "to_rowtime_us",
    "truncate_us",
]

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)

Int64Array = npt.NDArray[np.int64]


def _out_of_range(shown: str, rowtime_us: int | None = None) -> InvalidRowtimeError:
    at = f" ({rowtime_us} us)" if rowtime_us is not None else ""
    return InvalidRowtimeError(
        f"rowtime {shown}{at} is out of range: Spark timestamps run from "
        f"0001-01-01T00:00:00Z ({MIN_ROWTIME_US} us) to 9999-12-31T23:59:59.999999Z "
        f"({END_OF_STREAM_US} us)"
    )


def _checked(rowtime_us: int, value: object) -> int:
    if not MIN_ROWTIME_US <= rowtime_us <= END_OF_STREAM_US:
        raise _out_of_range(shown(value), rowtime_us)
    return rowtime_us


def _check_unit(unit: object) -> tuple[int, int]:
    try:
        return EPOCH_UNITS_US[unit]  # type: ignore[index]
    except (KeyError, TypeError):
        raise OptionError(
            f"unit={shown(unit)} is not an epoch unit: use one of 's', 'ms', 'us', 'ns' "
            "(the unit of integer and float epochs; default 'ms', as in Odysseus)"
        ) from None


# --------------------------------------------------------------------------------------------
# The format


@dataclass(frozen=True)
class TimeFormat:
    """How event times are read, validated once when built (then read any number of values).

    ``unit`` is the unit of int, float and Decimal epochs (``"s"``, ``"ms"`` (default, as in
    Odysseus), ``"us"``, ``"ns"``); ``tz`` the zone naive wall-clock times are read in (an IANA
    name, ``"UTC"`` (default) or a fixed offset such as ``"+05:30"``); ``fmt`` a Spark/Java
    datetime pattern, the only string form accepted when given (else ISO-8601 and SDP's).

    ``names`` are what the caller's user calls the three in errors (``("option rowtime.unit",
    "option rowtime.timezone", "option rowtime.format")`` for the reader); they do not take part
    in equality.

    Raises:
        OptionError: ``unit``, ``tz`` or ``fmt`` is not valid; the message names it as
            ``names`` spells it and says what it accepts.
    """

    unit: str = "ms"
    tz: str = "UTC"
    fmt: str | None = None
    names: tuple[str, str, str] = field(default=("unit", "tz", "fmt"), compare=False, repr=False)

    def __post_init__(self) -> None:
        checks: tuple[tuple[str, str, object, Callable[[Any], object]], ...] = (
            (self.names[0], "unit", self.unit, _check_unit),
            (self.names[1], "tz", self.tz, check_zone),
            (self.names[2], "fmt", self.fmt, pattern_form),
        )
        for name, own, value, check in checks:
            if own == "fmt" and value is None:
                continue
            try:
                check(value)
            except OptionError as e:
                if name == own:
                    raise
                raise OptionError(f"{name}={value!r} is not valid: {e}") from None

    def accepted(self) -> str:
        """What this format reads, for error messages."""
        strings = (
            f"a string matching fmt={self.fmt!r}"
            if self.fmt is not None
            else "an ISO-8601 string (2009-03-01T12:15:22.345678Z; offset optional) or the SDP "
            "form yyyy/MM/dd HH:mm:ss:fffffffff (2009/03/01 12:15:22:345678901)"
        )
        return (
            f"accepted: {strings}, naive times read in tz={self.tz!r}; a datetime or date; an int "
            f"or float epoch in unit={self.unit!r} (one of s, ms, us, ns); numpy.datetime64; "
            "pandas.Timestamp"
        )

    def read(self, value: object) -> int:
        """One event time as microseconds since the epoch (UTC): see ``to_rowtime_us``.

        Raises:
            InvalidRowtimeError: the value cannot be read or is out of range; the message shows
                the value and the accepted forms.
        """
        return _value_to_us(value, self)

    def read_array(self, values: pa.Array | pa.ChunkedArray, *, what: str = "column") -> Int64Array:
        """A whole Arrow column as int64 microseconds: see ``rowtime_array_us``.

        Raises:
            InvalidRowtimeError: a null, an unreadable or out-of-range value; the message names
                ``what``, the index of the first bad value and the value.
            OptionError: ``values`` is not an Arrow array, or of a type that holds no times.
        """
        return _column_to_us(values, self, what)


# --------------------------------------------------------------------------------------------
# Strings


def _days_from_civil(year: Any, month: Any, day: Any) -> Any:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant); ints or int arrays."""
    year = year - (month <= 2)
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + np.where(month > 2, -3, 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


def _string_to_us(text: str, value: object, tf: TimeFormat) -> int:
    for form in forms(tf.fmt):
        match = form.python.fullmatch(text)
        if match is None:
            continue
        g = match.groupdict()
        try:
            year = int(g["year"]) if g.get("year") else 2000 + int(g["year2"])
            if g.get("monname"):
                month = MONTHS.index(g["monname"][:3].lower()) + 1
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
                f"rowtime {shown(value)} has the {form.name} form but an invalid field ({exc}); "
                + tf.accepted()
            ) from None
        wall_us = (wall - EPOCH_NAIVE) // ONE_US
        if g.get("offz"):
            return _checked(wall_us, value)
        if g.get("offsign"):
            off = (offh * 3600 + offm * 60) * US_PER_S
            return _checked(wall_us - (off if g["offsign"] == "+" else -off), value)
        zone = g.get("zone")
        if zone:
            try:
                check_zone(zone)
            except OptionError:
                raise InvalidRowtimeError(
                    f"rowtime {shown(value)} names an unknown time zone {zone!r} (zone ids are "
                    "IANA names such as 'Europe/Berlin'); " + tf.accepted()
                ) from None
            return _checked(wall_to_utc_scalar(wall_us, zone), value)
        return _checked(wall_to_utc_scalar(wall_us, tf.tz), value)
    raise InvalidRowtimeError(f"cannot read a rowtime from {shown(value)}; " + tf.accepted())


# --------------------------------------------------------------------------------------------
# Floats. A float is a binary approximation of the decimal its writer meant: 0.29 s is
# 0.28999999999999998 s. A product within two units in the last place of a whole microsecond is
# taken as that microsecond; anything else is truncated toward the past. Scalar and array use
# the same rule so they agree.


def _float_to_us(value: float, shown: str, tf: TimeFormat) -> int:
    if not math.isfinite(value):
        raise InvalidRowtimeError(f"cannot read a rowtime from {shown}; " + tf.accepted())
    mul, div = EPOCH_UNITS_US[tf.unit]
    scaled = value * mul / div
    if not float(MIN_ROWTIME_US) - 2 <= scaled <= float(END_OF_STREAM_US) + 2:
        raise _out_of_range(shown)
    nearest = round(scaled)
    if abs(scaled - nearest) <= 2 * math.ulp(scaled):
        return nearest
    return math.floor(scaled)


def _floats_to_us(values: npt.NDArray[np.float64], tf: TimeFormat) -> Int64Array:
    mul, div = EPOCH_UNITS_US[tf.unit]
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

    Examples:
        >>> import datetime as dt
        >>> import pyspark_rowtime as rt
        >>> rt.to_rowtime_us("2026-12-02T10:00:00Z")
        1796205600000000
        >>> rt.to_rowtime_us(1796205600000)  # an int: epoch milliseconds
        1796205600000000
        >>> rt.to_rowtime_us(dt.datetime(2026, 12, 2, 11, 0), tz="Europe/Berlin")
        1796205600000000
        >>> rt.to_rowtime_us("2026/12/02 10:00:00:5")  # the SDP form: half a second
        1796205600500000
    """
    return TimeFormat(unit, tz, fmt).read(value)


def _value_to_us(value: object, tf: TimeFormat) -> int:
    mul, div = EPOCH_UNITS_US[tf.unit]
    if isinstance(value, (bool, np.bool_)):
        raise InvalidRowtimeError(f"rowtime {shown(value)} is a bool, not a time; " + tf.accepted())
    if isinstance(value, _dt.datetime):
        if type(value).__name__ == "NaTType":  # pandas.NaT passes isinstance(datetime)
            raise InvalidRowtimeError(f"rowtime {shown(value)} is NaT (not a time)")
        # pandas.Timestamp is a datetime: its datetime fields already floor to microseconds.
        if value.tzinfo is not None and value.utcoffset() is not None:
            return _checked((value - _EPOCH) // ONE_US, value)
        wall_us = (value.replace(tzinfo=None) - EPOCH_NAIVE) // ONE_US
        return _checked(wall_to_utc_scalar(wall_us, tf.tz), value)
    if isinstance(value, _dt.date):
        wall_us = (value - EPOCH_NAIVE.date()).days * US_PER_DAY
        return _checked(wall_to_utc_scalar(wall_us, tf.tz), value)
    if isinstance(value, Integral):
        return _checked(int(value) * mul // div, value)
    if isinstance(value, float):  # includes numpy.float64
        return _checked(_float_to_us(value, shown(value), tf), value)
    if isinstance(value, np.floating):
        return _checked(_float_to_us(float(value), shown(value), tf), value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise InvalidRowtimeError(f"cannot read a rowtime from {shown(value)}")
        return _checked(math.floor(value * mul / div), value)
    if isinstance(value, np.datetime64):
        return _checked(_datetime64_to_us(value, shown(value)), value)
    if isinstance(value, str):
        return _string_to_us(value, value, tf)
    if isinstance(value, pa.Scalar):
        if not value.is_valid:
            raise InvalidRowtimeError(f"rowtime {shown(value)} is null: a rowtime is required")
        # Through the array path: as_py() would drop nanoseconds before we can floor them.
        array = pa.array([value], type=value.type)
        return int(_column_to_us(array, tf, "value")[0])
    raise InvalidRowtimeError(
        f"cannot read a rowtime from {shown(value)} of type {type(value).__name__}; "
        + tf.accepted()
    )


def from_rowtime_us(rowtime_us: int) -> _dt.datetime:
    """The timezone-aware UTC ``datetime`` of a rowtime, exact to the microsecond.

    Works over the whole range, ``END_OF_STREAM_US`` and times before 1970 included.

    Raises:
        InvalidRowtimeError: ``rowtime_us`` is not an int or is out of range.

    Examples:
        >>> import pyspark_rowtime as rt
        >>> rt.from_rowtime_us(1796205600500000)
        datetime.datetime(2026, 12, 2, 10, 0, 0, 500000, tzinfo=datetime.timezone.utc)
        >>> print(rt.from_rowtime_us(-1))
        1969-12-31 23:59:59.999999+00:00
    """
    if isinstance(rowtime_us, (bool, np.bool_)) or not isinstance(rowtime_us, Integral):
        raise InvalidRowtimeError(
            f"rowtime_us={shown(rowtime_us)} is not an integer number of microseconds"
        )
    rowtime_us = _checked(int(rowtime_us), rowtime_us)
    return _EPOCH + _dt.timedelta(microseconds=rowtime_us)


#: How ``format_rowtime`` writes ``END_OF_STREAM_US``; the CLI reads the same word back.
END_OF_STREAM_TEXT = "end-of-stream"


def format_rowtime(rowtime_us: int | None) -> str:
    """A rowtime for people, logs and JSON files: ISO-8601 UTC with ``Z``, exact to the
    microsecond (the fraction is written when it is not zero).

    ``END_OF_STREAM_US`` (and above) is ``END_OF_STREAM_TEXT``, ``None`` (no clock yet) is
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
        raise OptionError(f"unit_us={shown(unit_us)} must be a positive integer of microseconds")
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

    The same rules as ``to_rowtime_us``, vectorised: timestamps of any unit (floored to
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
    return TimeFormat(unit, tz, fmt).read_array(values, what=what)


def _column_to_us(values: pa.Array | pa.ChunkedArray, tf: TimeFormat, what: str) -> Int64Array:
    if isinstance(values, pa.ChunkedArray):
        parts: list[Int64Array] = []
        base = 0
        for chunk in values.chunks:
            parts.append(_array_to_us(chunk, tf, what, base))
            base += len(chunk)
        if not parts:
            return np.empty(0, dtype=np.int64)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)
    if not isinstance(values, pa.Array):
        raise OptionError(
            f"{what}: rowtime_array_us needs a pyarrow Array or ChunkedArray, "
            f"not {type(values).__name__}"
        )
    return _array_to_us(values, tf, what, 0)


def _bad_value(
    what: str, base: int, index: int, value: object, why: str, tf: TimeFormat
) -> InvalidRowtimeError:
    return InvalidRowtimeError(
        f"{what}: value at index {base + index} is {shown(value)}: {why}; " + tf.accepted()
    )


def _array_to_us(array: pa.Array, tf: TimeFormat, what: str, base: int) -> Int64Array:
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if array.null_count:
        index = int(np.flatnonzero(as_numpy(array.is_null()))[0])
        raise _bad_value(what, base, index, None, "a null, but a rowtime is required", tf)
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
                tf,
            )  # fmt: skip
        return result

    if pa.types.is_timestamp(kind):
        raw = as_numpy(array.view(pa.int64()))
        result = _scale_ints(raw, *EPOCH_UNITS_US[kind.unit], array, what, base, tf)
        if kind.tz is None:
            result = wall_to_utc_array(result, tf.tz)
        return check_range(result)
    if pa.types.is_date32(kind):
        days = as_numpy(array.view(pa.int32())).astype(np.int64)
        return check_range(wall_to_utc_array(days * US_PER_DAY, tf.tz))
    if pa.types.is_date64(kind):
        ms = as_numpy(array.view(pa.int64()))
        result = _scale_ints(ms, 1_000, 1, array, what, base, tf)
        return check_range(wall_to_utc_array(result, tf.tz))
    if pa.types.is_integer(kind):
        if pa.types.is_uint64(kind):
            big = pc.greater(array, pa.scalar(2**63 - 1, pa.uint64()))
            if pc.any(big).as_py():
                index = int(np.flatnonzero(as_numpy(big))[0])
                raise _bad_value(what, base, index, _item(array, index), "out of range", tf)
        raw = as_numpy(array.cast(pa.int64(), safe=False))
        return check_range(_scale_ints(raw, *EPOCH_UNITS_US[tf.unit], array, what, base, tf))
    if pa.types.is_floating(kind):
        floats = as_numpy(array.cast(pa.float64()))
        finite = np.isfinite(floats)
        mul, div = EPOCH_UNITS_US[tf.unit]
        limit = (np.abs(floats) * mul / div) <= float(END_OF_STREAM_US) + 2
        ok = finite & limit
        if not ok.all():
            index = int(np.flatnonzero(~ok)[0])
            why = "not a finite number" if not finite[index] else "out of range"
            raise _bad_value(what, base, index, float(floats[index]), why, tf)
        return check_range(_floats_to_us(floats, tf))
    if pa.types.is_decimal(kind):
        # Rare: exact per value, with the scalar rule.
        items = array.to_pylist()
        try:
            out = [_value_to_us(v, tf) for v in items]
        except InvalidRowtimeError:
            for index, v in enumerate(items):
                try:
                    _value_to_us(v, tf)
                except InvalidRowtimeError as exc:
                    raise _bad_value(what, base, index, v, str(exc), tf) from None
            raise
        return np.array(out, dtype=np.int64)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or _is_string_view(kind):
        strings = array.cast(pa.string()) if not pa.types.is_string(kind) else array
        return check_range(_strings_to_us(strings, tf, what, base), strings)
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
    tf: TimeFormat,
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
                tf,
            )  # fmt: skip
    return raw * mul


def _digits(field: pa.Array, default: str = "0") -> Int64Array:
    """A column of ASCII digit strings as int64; empty strings (absent groups) read as default."""
    filled = pc.if_else(pc.equal(pc.utf8_length(field), 0), default, field)
    return as_numpy(filled.cast(pa.int64()))


def _strings_to_us(strings: pa.Array, tf: TimeFormat, what: str, base: int) -> Int64Array:
    n = len(strings)
    out = np.empty(n, dtype=np.int64)
    remaining = np.arange(n, dtype=np.int64)
    pending = strings
    for form in forms(tf.fmt):
        if remaining.size == 0:
            break
        fast = _arrow_fast(pending, form, tf.tz)
        if fast is not None:
            matched, converted = fast
            out[remaining[matched]] = converted
        else:
            extracted = pc.extract_regex(pending, pattern=form.re2)
            matched = as_numpy(extracted.is_valid())
            if matched.any():
                rows = remaining[matched]
                fields = extracted.filter(to_arrow(matched))
                out[rows] = _fields_to_us(fields, form, rows, strings, tf, what, base)
        if not matched.all():
            keep = ~matched
            remaining = remaining[keep]
            pending = pending.filter(to_arrow(keep))
        else:
            remaining = remaining[:0]
    if remaining.size:
        index = int(remaining[0])
        value = strings[index].as_py()
        raise _bad_value(what, base, index, value, "not a form that can be read", tf)
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
    strings: pa.Array, form: Form, tz: str
) -> tuple[npt.NDArray[np.bool_], Int64Array] | None:
    """ISO-8601 and SDP through Arrow's own parser, several times faster than regex captures.

    Only for values that match our regex for the form (so Arrow never reads a form we reject),
    and only when Arrow reads every one of them: it parses into nanoseconds (years 1677 to
    2262) and reads zoned and naive strings each into its own type; anything it refuses goes
    the slow, exact way. Returns ``(matched, rowtimes_us of the matched)`` or None.
    """
    if form is not ISO and form is not SDP:
        return None
    matched = pc.match_substring_regex(strings, pattern=form.re2)
    mask = as_numpy(matched)
    if not mask.any():
        return None
    subset = strings if mask.all() else strings.filter(matched)
    if form is SDP:
        iso = pc.replace_substring_regex(subset, pattern=_SDP_AS_ISO[0], replacement=_SDP_AS_ISO[1])
        zoned = np.zeros(len(subset), dtype=bool)
    else:
        iso = subset
        # Scan rather than guess: a cast that fails costs far more than this regex.
        zoned = as_numpy(pc.match_substring_regex(subset, pattern=_ISO_ZONED_RE))
    out = np.empty(len(subset), dtype=np.int64)
    for want_zoned, kind in ((True, pa.timestamp("ns", "UTC")), (False, pa.timestamp("ns"))):
        picked = zoned if want_zoned else ~zoned
        if not picked.any():
            continue
        part = iso if picked.all() else iso.filter(to_arrow(picked))
        try:
            ns = pc.cast(part, kind)
        except pa.ArrowInvalid:
            return None
        us = as_numpy(ns.view(pa.int64())) // 1_000
        out[picked] = us if want_zoned else wall_to_utc_array(us, tz)
    return mask, out


def _fields_to_us(
    fields: pa.StructArray,
    form: Form,
    rows: Int64Array,
    strings: pa.Array,
    tf: TimeFormat,
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
        month = pc.index_in(prefix, value_set=pa.array(MONTHS)).to_numpy(zero_copy_only=False)
        month = month.astype(np.int64) + 1
    else:
        month = _digits(col("month"))
    day = _digits(col("day"))
    hour = _digits(col("hour")) if "hour" in names else np.zeros(len(fields), dtype=np.int64)
    valid = np.ones(len(fields), dtype=bool)
    if "hour12" in names:
        hour12 = _digits(col("hour12"))
        valid &= (hour12 >= 1) & (hour12 <= 12)
        pm = as_numpy(pc.equal(pc.utf8_lower(col("ampm")), "pm"))
        hour = hour12 % 12 + np.where(pm, 12, 0)
    minute = _digits(col("minute")) if "minute" in names else 0
    second = _digits(col("second")) if "second" in names else 0
    if "frac" in names:
        frac_ns = pc.utf8_rpad(col("frac"), width=9, padding="0").cast(pa.int64())
        micro: np.ndarray | int = as_numpy(frac_ns) // 1_000
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
        minus = as_numpy(pc.equal(col("offsign"), "-"))
        has_sign = as_numpy(pc.greater(pc.utf8_length(col("offsign")), 0))
        offset = np.where(minus, -1, 1) * (offh * 3600 + offm * 60) * US_PER_S
        offset = np.where(has_sign, offset, 0)
        has_offset = has_sign
    if "offz" in names:
        has_offset = has_offset | as_numpy(pc.greater(pc.utf8_length(col("offz")), 0))
    if not valid.all():
        index = int(rows[np.flatnonzero(~valid)[0]])
        raise _bad_value(
            what, base, index, strings[index].as_py(),
            f"it has the {form.name} form but an invalid field (date, hour, minute, second or "
            "offset out of range)",
            tf,
        )  # fmt: skip
    days = _days_from_civil(year, month, day)
    wall = (((days * 24 + hour) * 60 + minute) * 60 + second) * US_PER_S + micro
    result = np.asarray(wall - offset, dtype=np.int64)
    naive = ~has_offset
    if "zone" in names:
        zones = col("zone")
        zone_values = zones.to_numpy(zero_copy_only=False)
        has_zone = as_numpy(pc.greater(pc.utf8_length(zones), 0))
        for name in pc.unique(zones.filter(to_arrow(has_zone & naive))).to_pylist():
            picked = naive & has_zone & (zone_values == name)
            try:
                check_zone(name)
            except OptionError:
                index = int(rows[np.flatnonzero(picked)[0]])
                raise _bad_value(
                    what, base, index, strings[index].as_py(),
                    f"unknown time zone {name!r}", tf,
                ) from None  # fmt: skip
            result[picked] = wall_to_utc_array(result[picked], name)
        naive &= ~has_zone
    if naive.all():
        return wall_to_utc_array(result, tf.tz)
    if naive.any():
        result[naive] = wall_to_utc_array(result[naive], tf.tz)
    return result

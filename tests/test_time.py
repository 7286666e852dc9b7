"""Reading event times into integer microseconds (SPEC section 2) and durations for options."""

from __future__ import annotations

import datetime as dt
import pickle
import re
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US, MIN_ROWTIME_US
from pyspark_rowtime.bounds.errors import InvalidRowtimeError, OptionError, RowtimeError
from pyspark_rowtime.bounds.time import (
    EPOCH_UNITS_US,
    TimeFormat,
    format_rowtime,
    from_rowtime_us,
    parse_duration_us,
    rowtime_array_us,
    to_rowtime_us,
    truncate_us,
)

UTC = dt.timezone.utc
PLUS_1 = dt.timezone(dt.timedelta(hours=1))
# 2009-03-01T12:15:00Z, the base of seed 000's examples.
T0_US = 1_235_909_700_000_000


def us(*args: int, tz: dt.tzinfo = UTC) -> int:
    """Microseconds of a datetime built independently of the code under test."""
    delta = dt.datetime(*args, tzinfo=tz) - dt.datetime(1970, 1, 1, tzinfo=UTC)  # type: ignore[misc]
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


# ---------------------------------------------------------------------------------------------
# Scalars: one table per input form

ACCEPTED: list[tuple[str, Any, dict[str, Any], int]] = [
    # datetimes
    ("aware datetime is exact", dt.datetime(2009, 3, 1, 12, 15, 22, 345678, UTC), {},
     T0_US + 22_345_678),
    ("aware non-UTC datetime", dt.datetime(2009, 3, 1, 13, 15, tzinfo=PLUS_1), {}, T0_US),
    ("naive datetime defaults to UTC", dt.datetime(2009, 3, 1, 12, 15), {}, T0_US),
    ("naive datetime in fixed offset tz", dt.datetime(2009, 3, 1, 17, 45), {"tz": "+05:30"}, T0_US),
    ("naive datetime in IANA tz, winter", dt.datetime(2009, 3, 1, 13, 15), {"tz": "Europe/Berlin"},
     T0_US),
    ("naive datetime in IANA tz, summer", dt.datetime(2009, 7, 1, 14, 0), {"tz": "Europe/Berlin"},
     us(2009, 7, 1, 12)),
    ("date is midnight UTC", dt.date(2009, 3, 1), {}, us(2009, 3, 1)),
    ("date is midnight in tz", dt.date(2009, 3, 1), {"tz": "-04:30"}, us(2009, 3, 1, 4, 30)),
    ("datetime before 1970", dt.datetime(1969, 12, 31, 23, 59, 59, 999999, UTC), {}, -1),
    ("first Spark instant", dt.datetime(1, 1, 1, tzinfo=UTC), {}, MIN_ROWTIME_US),
    ("last Spark instant", dt.datetime(9999, 12, 31, 23, 59, 59, 999999, UTC), {},
     END_OF_STREAM_US),
    # integer epochs
    ("int default unit is ms (Odysseus)", 1_235_909_700_000, {}, T0_US),
    ("int seconds", 1_235_909_700, {"unit": "s"}, T0_US),
    ("int microseconds", T0_US + 7, {"unit": "us"}, T0_US + 7),
    ("int nanoseconds truncated", T0_US * 1000 + 999, {"unit": "ns"}, T0_US),
    ("-1 ns is -1 us, toward the past", -1, {"unit": "ns"}, -1),
    ("-1001 ns is -2 us", -1001, {"unit": "ns"}, -2),
    ("numpy int64", np.int64(1_235_909_700_000), {}, T0_US),
    ("negative ms", -1, {}, -1000),
    # floats and decimals
    ("float seconds", 1_235_909_700.5, {"unit": "s"}, T0_US + 500_000),
    ("float ms with a binary approximation", 0.29, {"unit": "s"}, 290_000),
    ("float truncated toward the past", 1.9999, {"unit": "us"}, 1),
    ("negative float truncated toward the past", -0.5, {"unit": "us"}, -1),
    ("float ns", 1500.0, {"unit": "ns"}, 1),
    ("numpy float32", np.float32(2.5), {"unit": "s"}, 2_500_000),
    ("Decimal exact", Decimal("-0.0000001"), {"unit": "s"}, -1),
    # numpy / pandas
    ("datetime64[ns] truncated", np.datetime64("2009-03-01T12:15:22.345678901"), {},
     T0_US + 22_345_678),
    ("datetime64[ns] before 1970", np.datetime64(-1, "ns"), {}, -1),
    ("datetime64[D]", np.datetime64("2009-03-01"), {}, us(2009, 3, 1)),
    ("datetime64[s]", np.datetime64(5, "s"), {}, 5_000_000),
    ("pandas Timestamp truncated", pd.Timestamp("2009-03-01T12:15:22.345678901Z"), {},
     T0_US + 22_345_678),
    ("pandas Timestamp before 1970", pd.Timestamp("1969-12-31T23:59:59.999999999"), {}, -1),
    ("naive pandas Timestamp in tz", pd.Timestamp("2009-03-01T13:15"), {"tz": "Europe/Berlin"},
     T0_US),
    ("arrow scalar ns", pa.scalar(-1, pa.timestamp("ns")), {}, -1),
    # ISO-8601
    ("ISO with Z", "2009-03-01T12:15:22.345678Z", {}, T0_US + 22_345_678),
    ("ISO with 9 digits truncated", "2009-03-01T12:15:22.345678901Z", {}, T0_US + 22_345_678),
    ("ISO with offset", "2009-03-01T13:15:00+01:00", {}, T0_US),
    ("ISO with compact offset", "2009-03-01T13:15:00+0100", {}, T0_US),
    ("ISO with hour offset", "2009-03-01T07:15:00-05", {}, T0_US),
    ("ISO naive is UTC by default", "2009-03-01T12:15:00", {}, T0_US),
    ("ISO naive in tz", "2009-03-01T13:15:00", {"tz": "Europe/Berlin"}, T0_US),
    ("ISO offset wins over tz", "2009-03-01T12:15:00Z", {"tz": "Europe/Berlin"}, T0_US),
    ("ISO with space", "2009-03-01 12:15:00", {}, T0_US),
    ("ISO without seconds", "2009-03-01T12:15", {}, T0_US),
    ("ISO date only", "2009-03-01", {}, us(2009, 3, 1)),
    ("ISO comma fraction", "2009-03-01T12:15:00,5Z", {}, T0_US + 500_000),
    ("ISO one-digit fraction", "2009-03-01T12:15:00.1", {}, T0_US + 100_000),
    ("ISO surrounded by spaces", "  2009-03-01T12:15:00Z ", {}, T0_US),
    ("ISO before 1970 truncated toward the past", "1969-12-31T23:59:59.9999999Z", {}, -1),
    ("ISO before 1970 exact", "1969-12-31T23:59:59.000001Z", {}, -999_999),
    ("ISO leap day", "2008-02-29T00:00:00Z", {}, us(2008, 2, 29)),
    ("ISO last instant", "9999-12-31T23:59:59.999999999Z", {}, END_OF_STREAM_US),
    ("ISO first instant", "0001-01-01T00:00:00Z", {}, MIN_ROWTIME_US),
    # SDP (seed 000)
    ("SDP A", "2009/03/01 12:15:22:345678901", {}, T0_US + 22_345_678),
    ("SDP B", "2009/03/01 12:15:22:123456789", {}, T0_US + 22_123_456),
    ("SDP C", "2009/03/01 12:15:23:123456789", {}, T0_US + 23_123_456),
    ("SDP D", "2009/03/01 12:15:22:890123456", {}, T0_US + 22_890_123),
    ("SDP E", "2009/03/01 12:15:24:123456789", {}, T0_US + 24_123_456),
    ("SDP one fraction digit", "2009/03/01 12:15:22:3", {}, T0_US + 22_300_000),
    ("SDP without fraction", "2009/03/01 12:15:22", {}, T0_US + 22_000_000),
    ("SDP naive in tz", "2009/03/01 13:15:00:0", {"tz": "Europe/Berlin"}, T0_US),
    # user patterns
    ("fmt dd.MM.yyyy HH:mm:ss", "01.03.2009 12:15:22", {"fmt": "dd.MM.yyyy HH:mm:ss"},
     T0_US + 22_000_000),
    ("fmt fraction SSS takes 1 to 3 digits", "2009-03-01 12:15:22.3",
     {"fmt": "yyyy-MM-dd HH:mm:ss.SSS"}, T0_US + 22_300_000),
    ("fmt 9-digit fraction truncated", "20090301121522345678901",
     {"fmt": "yyyyMMddHHmmssSSSSSSSSS"}, T0_US + 22_345_678),
    ("fmt quoted T and XXX", "2009-03-01T13:15:00+01:00", {"fmt": "yyyy-MM-dd'T'HH:mm:ssXXX"},
     T0_US),
    ("fmt XXX accepts Z", "2009-03-01T12:15:00Z", {"fmt": "yyyy-MM-dd'T'HH:mm:ssXXX"}, T0_US),
    ("fmt Z offset", "01/Mar/2009:13:15:00 +0100", {"fmt": "dd/MMM/yyyy:HH:mm:ss Z"}, T0_US),
    ("fmt month name, am/pm", "Sun, March 1 2009 1:15 PM",
     {"fmt": "EEE, MMMM d yyyy h:mm a"}, T0_US + 3_600_000_000),
    ("fmt 12 AM is midnight", "2009-03-01 12:00 am", {"fmt": "yyyy-MM-dd hh:mm a"},
     us(2009, 3, 1)),
    ("fmt two-digit year", "09-03-01", {"fmt": "yy-MM-dd"}, us(2009, 3, 1)),
    ("fmt zone id", "2009-03-01 13:15 Europe/Berlin", {"fmt": "yyyy-MM-dd HH:mm VV"}, T0_US),
    ("fmt optional section present", "2009-03-01 12:15:22", {"fmt": "yyyy-MM-dd HH:mm[:ss]"},
     T0_US + 22_000_000),
    ("fmt optional section absent", "2009-03-01 12:15", {"fmt": "yyyy-MM-dd HH:mm[:ss]"}, T0_US),
    ("fmt naive in tz", "2009-03-01 13:15", {"fmt": "yyyy-MM-dd HH:mm", "tz": "Europe/Berlin"},
     T0_US),
    ("fmt quoted quote", "2009'03'01", {"fmt": "yyyy''MM''dd"}, us(2009, 3, 1)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("value", "options", "expected"),
    [case[1:] for case in ACCEPTED],
    ids=[case[0] for case in ACCEPTED],
)
def test_to_rowtime_us_reads_each_accepted_form(value: Any, options: dict, expected: int) -> None:
    assert to_rowtime_us(value, **options) == expected


def test_seed_000_sdp_string_truncates_nanoseconds_to_microseconds() -> None:
    got = to_rowtime_us("2009/03/01 12:15:22:345678901")
    assert from_rowtime_us(got) == dt.datetime(2009, 3, 1, 12, 15, 22, 345678, UTC)


# Daylight saving time: fold=0 (earlier instant for repeated times, pre-change offset for gaps).
DST: list[tuple[str, str, str, int]] = [
    ("ambiguous fall-back time takes the earlier instant", "2021-11-07T01:30:00",
     "America/New_York", us(2021, 11, 7, 5, 30)),
    ("time after fall-back", "2021-11-07T02:30:00", "America/New_York", us(2021, 11, 7, 7, 30)),
    ("skipped spring-forward time shifts forward", "2021-03-14T02:30:00", "America/New_York",
     us(2021, 3, 14, 7, 30)),
    ("time after spring-forward", "2021-03-14T03:00:00", "America/New_York",
     us(2021, 3, 14, 7, 0)),
    ("summer time after 2037 still applies", "2100-07-01T12:00:00", "America/New_York",
     us(2100, 7, 1, 16)),
    ("half-hour zone", "2009-03-01T17:45:00", "Asia/Kolkata", T0_US),
    ("southern hemisphere summer", "2009-01-15T13:00:00", "Australia/Sydney",
     us(2009, 1, 15, 2)),
]  # fmt: skip


@pytest.mark.parametrize(("text", "tz", "expected"), [c[1:] for c in DST], ids=[c[0] for c in DST])
def test_naive_times_in_dst_zones_follow_fold_0(text: str, tz: str, expected: int) -> None:
    assert to_rowtime_us(text, tz=tz) == expected
    assert rowtime_array_us(pa.array([text]), tz=tz).tolist() == [expected]
    naive = dt.datetime.fromisoformat(text)
    assert to_rowtime_us(naive, tz=tz) == expected
    assert rowtime_array_us(pa.array([naive], pa.timestamp("us")), tz=tz).tolist() == [expected]


# ---------------------------------------------------------------------------------------------
# Rejections: each names the value and what is accepted

REJECTED: list[tuple[str, Any, dict[str, Any], type[Exception], str]] = [
    ("garbage string", "yesterday", {}, InvalidRowtimeError, "'yesterday'"),
    ("bool is not an int", True, {}, InvalidRowtimeError, "True"),
    ("None", None, {}, InvalidRowtimeError, "None"),
    ("numeric string is not a guess", "1235909700000", {}, InvalidRowtimeError, "'1235909700000'"),
    ("month 13", "2009-13-01", {}, InvalidRowtimeError, "'2009-13-01'"),
    ("February 30", "2009-02-30T00:00:00Z", {}, InvalidRowtimeError, "2009-02-30"),
    ("hour 24", "2009-03-01T24:00:00Z", {}, InvalidRowtimeError, "24:00"),
    ("leap second", "2009-03-01T23:59:60Z", {}, InvalidRowtimeError, "23:59:60"),
    ("10 fractional digits", "2009-03-01T12:15:22.1234567890Z", {}, InvalidRowtimeError,
     "1234567890"),
    ("offset over 18 hours", "2009-03-01T12:15:22+19:00", {}, InvalidRowtimeError, "+19:00"),
    ("ISO when fmt is given", "2009-03-01T12:15:00Z", {"fmt": "dd.MM.yyyy"}, InvalidRowtimeError,
     "fmt='dd.MM.yyyy'"),
    ("year 0", "0000-12-31T23:59:59Z", {}, InvalidRowtimeError, "0000-12-31"),
    ("after year 9999", "9999-12-31T23:59:59-01:00", {}, InvalidRowtimeError, "out of range"),
    ("int too large", 10**20, {}, InvalidRowtimeError, "out of range"),
    ("int too small", -(10**20), {"unit": "us"}, InvalidRowtimeError, "out of range"),
    ("NaN", float("nan"), {}, InvalidRowtimeError, "nan"),
    ("infinity", float("inf"), {}, InvalidRowtimeError, "inf"),
    ("NaT", np.datetime64("NaT"), {}, InvalidRowtimeError, "NaT"),
    ("pandas NaT", pd.NaT, {}, InvalidRowtimeError, "NaT"),
    ("unknown type", object(), {}, InvalidRowtimeError, "object"),
    ("bad unit", 1, {"unit": "minutes"}, OptionError, "unit='minutes'"),
    ("bad tz", 1, {"tz": "Mars/Olympus"}, OptionError, "tz='Mars/Olympus'"),
    ("bad fmt letter", "x", {"fmt": "yyyy-MM-dd Q"}, OptionError, "fmt='yyyy-MM-dd Q'"),
    ("fmt without day", "x", {"fmt": "yyyy-MM"}, OptionError, "no day"),
    ("fmt h without a", "x", {"fmt": "yyyy-MM-dd hh"}, OptionError, "needs a"),
    ("fmt unknown zone id", "2009-03-01 Mars/Olympus", {"fmt": "yyyy-MM-dd VV"},
     InvalidRowtimeError, "Mars/Olympus"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("value", "options", "error", "shown"),
    [case[1:] for case in REJECTED],
    ids=[case[0] for case in REJECTED],
)
def test_to_rowtime_us_rejects_with_the_value_and_the_accepted_forms(
    value: Any, options: dict, error: type[Exception], shown: str
) -> None:
    with pytest.raises(error) as info:
        to_rowtime_us(value, **options)
    message = str(info.value)
    assert shown in message
    if error is InvalidRowtimeError:
        assert "accepted" in message or "range" in message or "NaT" in message


def test_errors_derive_from_the_root_and_from_value_error() -> None:
    with pytest.raises(RowtimeError):
        to_rowtime_us("nope")
    with pytest.raises(ValueError):
        to_rowtime_us(1, unit="fortnights")


def test_long_values_are_truncated_in_messages() -> None:
    with pytest.raises(InvalidRowtimeError) as info:
        to_rowtime_us("x" * 10_000)
    assert "xxx..." in str(info.value)
    assert len(str(info.value)) < 1000


# ---------------------------------------------------------------------------------------------
# from_rowtime_us and truncate_us

FROM: list[tuple[int, dt.datetime]] = [
    (0, dt.datetime(1970, 1, 1, tzinfo=UTC)),
    (-1, dt.datetime(1969, 12, 31, 23, 59, 59, 999999, UTC)),
    (T0_US + 22_345_678, dt.datetime(2009, 3, 1, 12, 15, 22, 345678, UTC)),
    (END_OF_STREAM_US, dt.datetime(9999, 12, 31, 23, 59, 59, 999999, UTC)),
    (MIN_ROWTIME_US, dt.datetime(1, 1, 1, tzinfo=UTC)),
]


@pytest.mark.parametrize(("rowtime_us", "expected"), FROM)
def test_from_rowtime_us_is_aware_utc_and_exact(rowtime_us: int, expected: dt.datetime) -> None:
    got = from_rowtime_us(rowtime_us)
    assert got == expected
    assert got.utcoffset() == dt.timedelta(0)


@pytest.mark.parametrize("bad", [END_OF_STREAM_US + 1, MIN_ROWTIME_US - 1, 1.5, True, "0"])
def test_from_rowtime_us_rejects_non_ints_and_out_of_range(bad: Any) -> None:
    with pytest.raises(InvalidRowtimeError, match="rowtime"):
        from_rowtime_us(bad)


def test_a_time_format_reads_like_the_keyword_functions_and_survives_pickling() -> None:
    tf = TimeFormat("s", "Europe/Berlin", "dd.MM.yyyy HH:mm")
    assert tf.read("01.03.2009 13:15") == to_rowtime_us(
        "01.03.2009 13:15", unit="s", tz="Europe/Berlin", fmt="dd.MM.yyyy HH:mm"
    )
    assert tf.read(7) == 7_000_000
    column = pa.array(["01.03.2009 13:15", "01.07.2009 14:15"])
    assert tf.read_array(column).tolist() == [us(2009, 3, 1, 12, 15), us(2009, 7, 1, 12, 15)]
    assert pickle.loads(pickle.dumps(tf)) == tf


@pytest.mark.parametrize(
    ("kwargs", "option", "keyword"),
    [
        ({"unit": "min"}, "option rowtime.unit='min' is not valid", "unit='min'"),
        ({"tz": "Mars/Olympus"}, "option rowtime.timezone='Mars/Olympus' is not valid", "tz="),
        ({"fmt": "HH:mm"}, "option rowtime.format='HH:mm' is not valid", "fmt='HH:mm'"),
    ],
)
def test_a_bad_time_format_fails_when_built_naming_the_option(
    kwargs: dict[str, str], option: str, keyword: str
) -> None:
    names = ("option rowtime.unit", "option rowtime.timezone", "option rowtime.format")
    with pytest.raises(OptionError, match=re.escape(option)):
        TimeFormat(**kwargs, names=names)
    with pytest.raises(OptionError, match="^" + re.escape(keyword)):
        TimeFormat(**kwargs)  # without names, the keyword argument is named


def test_format_rowtime_reads_back_and_never_raises() -> None:
    t = us(2009, 3, 1, 12, 15, 22) + 345_678
    assert format_rowtime(t) == "2009-03-01T12:15:22.345678Z"
    assert to_rowtime_us(format_rowtime(t)) == t
    assert format_rowtime(MIN_ROWTIME_US) == "0001-01-01T00:00:00Z"
    # the CLI reads "end-of-stream" back as the end of stream
    assert format_rowtime(END_OF_STREAM_US) == format_rowtime(END_OF_STREAM_US + 1)
    assert format_rowtime(END_OF_STREAM_US) == "end-of-stream"
    assert format_rowtime(None) == "none"
    assert format_rowtime(MIN_ROWTIME_US - 1) == f"{MIN_ROWTIME_US - 1} us"


TRUNCATE = [
    (1_999_999, 1_000_000, 1_000_000),
    (2_000_000, 1_000_000, 2_000_000),
    (-1, 1_000_000, -1_000_000),
    (-1_000_000, 1_000_000, -1_000_000),
    (-1_000_001, 1_000, -1_001_000),
    (12_345, 1, 12_345),
]


@pytest.mark.parametrize(("rowtime_us", "unit_us", "expected"), TRUNCATE)
def test_truncate_us_floors_toward_the_past(rowtime_us: int, unit_us: int, expected: int) -> None:
    assert truncate_us(rowtime_us, unit_us) == expected


@pytest.mark.parametrize("bad", [0, -1, True, 1.0])
def test_truncate_us_rejects_non_positive_units(bad: Any) -> None:
    with pytest.raises(OptionError, match="unit_us"):
        truncate_us(1, bad)


def test_each_epoch_unit_scales_ints_and_truncates_nanoseconds_toward_the_past() -> None:
    assert [to_rowtime_us(7, unit=u) for u in EPOCH_UNITS_US] == [7_000_000, 7_000, 7, 0]
    assert to_rowtime_us(-7, unit="ns") == -1
    got = rowtime_array_us(pa.array([7, -7], pa.int64()), unit="ns").tolist()
    assert got == [0, -1]


# ---------------------------------------------------------------------------------------------
# Durations

DURATIONS: list[tuple[Any, int]] = [
    (5, 5_000_000),
    (1.5, 1_500_000),
    (0.1, 100_000),
    (Decimal("0.000001"), 1),
    (dt.timedelta(milliseconds=250), 250_000),
    ("250ms", 250_000),
    ("5s", 5_000_000),
    ("5", 5_000_000),
    ("1.5 seconds", 1_500_000),
    ("2 minutes", 120_000_000),
    ("2 min", 120_000_000),
    ("1h", 3_600_000_000),
    ("1 hour", 3_600_000_000),
    ("10us", 10),
    ("10 µs", 10),
    ("1 day", 86_400_000_000),
    ("3 Days", 259_200_000_000),
    ("1.0000019us", 1),
    (" 7 msec ", 7_000),
]


@pytest.mark.parametrize(("value", "expected"), DURATIONS, ids=[repr(d[0]) for d in DURATIONS])
def test_parse_duration_us_reads_each_form(value: Any, expected: int) -> None:
    assert parse_duration_us(value, what="heartbeat") == expected


@pytest.mark.parametrize(
    "bad",
    [0, -1, "0s", "-5s", "0.5us", "5 parsecs", "soon", "", True, None, float("nan"),
     dt.timedelta(0), [5], "1e3s"],
)  # fmt: skip
def test_parse_duration_us_rejects_naming_the_option_and_forms(bad: Any) -> None:
    with pytest.raises(OptionError) as info:
        parse_duration_us(bad, what="heartbeat")
    message = str(info.value)
    assert "heartbeat=" in message
    assert repr(bad)[:20] in message
    assert "250ms" in message


# ---------------------------------------------------------------------------------------------
# Arrays


def test_array_of_int_epochs_in_each_unit() -> None:
    values = pa.array([-1, 0, 1_235_909_700_000], pa.int64())
    assert rowtime_array_us(values).tolist() == [-1000, 0, T0_US]
    assert rowtime_array_us(values, unit="ns").tolist() == [-1, 0, T0_US // 1_000_000]
    assert rowtime_array_us(pa.array([1, 2], pa.uint8()), unit="s").tolist() == [
        1_000_000,
        2_000_000,
    ]


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
@pytest.mark.parametrize("tz", [None, "UTC", "Asia/Kolkata"])
def test_array_of_timestamps_any_unit_floors_to_microseconds(unit: str, tz: str | None) -> None:
    raw = [-1, 0, 1_235_909_722]
    values = pa.array(raw, pa.int64()).cast(pa.timestamp(unit, tz))
    per_us = {"s": (10**6, 1), "ms": (1000, 1), "us": (1, 1), "ns": (1, 1000)}[unit]
    assert rowtime_array_us(values).tolist() == [r * per_us[0] // per_us[1] for r in raw]


def test_naive_timestamp_array_is_read_in_tz() -> None:
    values = pa.array([dt.datetime(2009, 3, 1, 13, 15)], pa.timestamp("us"))
    assert rowtime_array_us(values, tz="Europe/Berlin").tolist() == [T0_US]
    aware = pa.array([T0_US], pa.int64()).cast(pa.timestamp("us", "Europe/Berlin"))
    assert rowtime_array_us(aware, tz="Asia/Tokyo").tolist() == [T0_US]


def test_date_arrays_are_midnight_in_tz() -> None:
    days = pa.array([dt.date(2009, 3, 1), dt.date(1969, 12, 31)], pa.date32())
    assert rowtime_array_us(days).tolist() == [us(2009, 3, 1), -86_400_000_000]
    assert rowtime_array_us(days.cast(pa.date64()), tz="+01:00").tolist() == [
        us(2009, 2, 28, 23),
        -86_400_000_000 - 3_600_000_000,
    ]


def test_float_and_decimal_arrays_agree_with_scalars() -> None:
    floats = [0.29, -0.5, 1.9999, 1_235_909_700.5, 2.5]
    got = rowtime_array_us(pa.array(floats), unit="s").tolist()
    assert got == [to_rowtime_us(f, unit="s") for f in floats]
    decimals = pa.array([Decimal("1.5"), Decimal("-0.0005")], pa.decimal128(10, 4))
    assert rowtime_array_us(decimals).tolist() == [1_500, -1]


def test_string_arrays_mix_iso_sdp_and_offsets() -> None:
    texts = [
        "2009/03/01 12:15:22:345678901",
        "2009-03-01T13:15:00+01:00",
        "2009-03-01T12:15:00",
        "1969-12-31T23:59:59.9999999Z",
        "2009-03-01",
    ]
    expected = [T0_US + 22_345_678, T0_US, T0_US, -1, us(2009, 3, 1)]
    assert rowtime_array_us(pa.array(texts)).tolist() == expected
    assert rowtime_array_us(pa.array(texts, pa.large_string())).tolist() == expected
    dictionary = pa.array(texts).dictionary_encode()
    assert rowtime_array_us(dictionary).tolist() == expected


def test_string_array_with_fmt() -> None:
    texts = pa.array(["01.03.2009 13:15", "31.12.1969 23:59"])
    got = rowtime_array_us(texts, fmt="dd.MM.yyyy HH:mm", tz="+01:00")
    assert got.tolist() == [T0_US, us(1969, 12, 31, 22, 59)]


def test_chunked_array_reports_the_global_index() -> None:
    chunked = pa.chunked_array(
        [pa.array(["2009-03-01", "2009-03-02"]), pa.array(["2009-03-03", "bad"])]
    )
    with pytest.raises(InvalidRowtimeError) as info:
        rowtime_array_us(chunked, what="column 'dataTime'")
    assert "column 'dataTime'" in str(info.value)
    assert "index 3" in str(info.value)
    assert "'bad'" in str(info.value)
    assert rowtime_array_us(pa.chunked_array([], pa.int64())).tolist() == []


ARRAY_REJECTED: list[tuple[str, pa.Array, dict[str, Any], str]] = [
    ("null int", pa.array([1, None], pa.int64()), {}, "index 1 is None"),
    ("null timestamp", pa.array([None], pa.timestamp("us")), {}, "index 0 is None"),
    ("unparseable string", pa.array(["2009-03-01", "nope"]), {}, "index 1 is 'nope'"),
    ("invalid date", pa.array(["2009-02-30"]), {}, "index 0 is '2009-02-30'"),
    ("int overflow", pa.array([0, 10**17], pa.int64()), {}, "index 1"),
    ("timestamp overflow", pa.array([0, 10**17], pa.timestamp("s")), {}, "timestamp[s] 10000"),
    ("uint64 overflow", pa.array([2**63], pa.uint64()), {"unit": "us"}, "index 0"),
    ("nan", pa.array([1.0, float("nan")]), {}, "index 1 is nan"),
    ("out of range string", pa.array(["9999-12-31T23:59:59-01:00"]), {}, "out of range"),
    ("string not matching fmt", pa.array(["2009-03-01"]), {"fmt": "dd.MM.yyyy"}, "index 0"),
    ("unknown zone id", pa.array(["2009-03-01 Mars/X"]), {"fmt": "yyyy-MM-dd VV"}, "Mars/X"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("values", "options", "shown"),
    [c[1:] for c in ARRAY_REJECTED],
    ids=[c[0] for c in ARRAY_REJECTED],
)
def test_array_errors_name_what_the_index_and_the_value(
    values: pa.Array, options: dict, shown: str
) -> None:
    with pytest.raises(InvalidRowtimeError) as info:
        rowtime_array_us(values, what="column 'dataTime'", **options)
    assert str(info.value).startswith("column 'dataTime': ")
    assert shown in str(info.value)


def test_array_of_unsupported_type_is_an_option_error() -> None:
    with pytest.raises(OptionError, match="binary"):
        rowtime_array_us(pa.array([b"x"]), what="column 'payload'")


# ---------------------------------------------------------------------------------------------
# Properties

rowtimes = st.integers(MIN_ROWTIME_US, END_OF_STREAM_US)
# ns arrays and Arrow's fast ISO path are limited to years 1677..2262; cover both sides.
near_now = st.integers(-(2**62) // 1000, 2**62 // 1000)


@given(rowtimes)
def test_round_trip_over_the_whole_range(rowtime_us: int) -> None:
    assert to_rowtime_us(from_rowtime_us(rowtime_us)) == rowtime_us


@given(
    st.lists(st.integers(-(2**62), 2**62), max_size=30), st.sampled_from(["s", "ms", "us", "ns"])
)
def test_int_array_agrees_with_scalars(raw: list[int], unit: str) -> None:
    mul, div = EPOCH_UNITS_US[unit]
    raw = [r for r in raw if MIN_ROWTIME_US <= r * mul // div <= END_OF_STREAM_US]
    got = rowtime_array_us(pa.array(raw, pa.int64()), unit=unit).tolist()
    assert got == [to_rowtime_us(r, unit=unit) for r in raw]


@given(st.lists(st.integers(-(2**63) + 1, 2**63 - 1), max_size=30), st.sampled_from([None, "UTC"]))
def test_ns_timestamp_array_agrees_with_scalars(raw: list[int], tz: str | None) -> None:
    values = pa.array(raw, pa.int64()).cast(pa.timestamp("ns", tz))
    expected = [to_rowtime_us(np.datetime64(r, "ns")) for r in raw]
    assert rowtime_array_us(values).tolist() == expected


@given(
    st.lists(rowtimes, min_size=1, max_size=20),
    st.sampled_from(["UTC", "+05:30", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe"]),
)
@settings(max_examples=200)
def test_naive_timestamp_array_agrees_with_scalars_in_any_zone(raw: list[int], tz: str) -> None:
    values = pa.array(raw, pa.int64()).cast(pa.timestamp("us"))
    walls = [dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=r) for r in raw]
    expected = []
    for wall in walls:
        try:
            expected.append(to_rowtime_us(wall, tz=tz))
        except InvalidRowtimeError:
            return  # a wall time at the very ends that leaves the range in this zone
    assert rowtime_array_us(values, tz=tz).tolist() == expected


def _iso(rowtime_us: int, digits: int, suffix: str) -> str:
    d = from_rowtime_us(rowtime_us)  # not strftime: %Y drops leading zeros before year 1000
    text = f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{d.hour:02d}:{d.minute:02d}:{d.second:02d}"
    fraction = f"{rowtime_us % 1_000_000:06d}{rowtime_us % 1000:03d}"[:digits]
    return text + ("." + fraction if digits else "") + suffix


@given(
    st.lists(st.one_of(rowtimes, near_now), min_size=1, max_size=20),
    st.integers(0, 9),
    st.sampled_from(["", "Z", "+00:00", "-0000", "+00"]),
)
@settings(max_examples=200)
def test_iso_string_array_agrees_with_scalars(raw: list[int], digits: int, suffix: str) -> None:
    texts = [_iso(r, digits, suffix) for r in raw]
    expected = [to_rowtime_us(t) for t in texts]
    assert rowtime_array_us(pa.array(texts)).tolist() == expected
    for r, got in zip(raw, expected, strict=True):
        assert got == r - r % 10 ** max(0, 6 - digits)


@given(st.lists(st.tuples(rowtimes, st.booleans()), min_size=1, max_size=20), st.integers(1, 9))
def test_mixed_iso_and_sdp_array_agrees_with_scalars(
    raw: list[tuple[int, bool]], digits: int
) -> None:
    texts = []
    for r, sdp in raw:
        text = _iso(r, digits, "Z" if not sdp else "")
        if sdp:
            text = text.replace("-", "/", 2).replace("T", " ").replace(".", ":")
        texts.append(text)
    assert rowtime_array_us(pa.array(texts)).tolist() == [to_rowtime_us(t) for t in texts]


ISO_VARIANTS = [
    f"{date}{time}{offset}"
    for date in ("2009-03-01", "1969-12-31", "2262-04-11", "1677-09-21", "0001-01-02", "9999-12-30")
    for time in ("", "T12:15", " 12:15", "T12:15:22", "t12:15:22", "T23:59:59.9",
                 "T00:00:00.123456789", "T12:15:22,5")
    for offset in ("", "Z", "z", "+01:00", "-0530", "+05", "-00:00", " +01:00")
    if time or not offset.startswith(" ")
]  # fmt: skip


def test_every_iso_variant_reads_the_same_in_arrays_and_scalars() -> None:
    """The array path hands most ISO strings to Arrow's parser: it must agree with ours."""
    expected = [to_rowtime_us(text) for text in ISO_VARIANTS]
    assert rowtime_array_us(pa.array(ISO_VARIANTS)).tolist() == expected
    for text, want in zip(ISO_VARIANTS, expected, strict=True):
        assert rowtime_array_us(pa.array([text] * 3)).tolist() == [want] * 3, text
        assert rowtime_array_us(pa.array([text]), tz="Asia/Kolkata").tolist() == [
            to_rowtime_us(text, tz="Asia/Kolkata")
        ], text

"""Values read from text (JSON lines, CSV cells) turned into what a payload column of a given
Arrow type takes: the one conversion the ``rowtime insert`` command and the directory connector
share, so a file means the same in both.

A converter raises (ValueError, TypeError, ArithmeticError) for a value its column cannot
hold, so that the line is named while it is read: whole numbers past the column's range and
numbers past a double's or a duration's range included, which the writer would otherwise
only meet when its buffer becomes Arrow, after the line is long gone."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pyarrow as pa

from ..bounds.time import TimeFormat, from_rowtime_us

Convert = Callable[[Any], Any]


class ValueReader:
    """Turns JSON or CSV values into the Python values a payload column takes."""

    def __init__(self, time_format: TimeFormat) -> None:
        self.time_format = time_format

    @staticmethod
    def epoch_text(value: Any) -> Any:
        """An epoch in the time format's unit written as text (a CSV cell) as its number."""
        if isinstance(value, str) and _WHOLE_TEXT.fullmatch(value):
            return int(value)
        return value

    def instant(self, value: Any) -> dt.datetime:
        return from_rowtime_us(self.time_format.read(self.epoch_text(value)))

    def converter(self, dtype: pa.DataType, csv_cell: bool) -> Convert:
        """A function from a JSON value (or a CSV cell's text) to a column value."""
        t = pa.types
        if t.is_timestamp(dtype):
            return self.instant
        if t.is_date32(dtype):
            return lambda v: dt.date.fromisoformat(v) if isinstance(v, str) else v
        if t.is_decimal(dtype):
            return lambda v: Decimal(str(v)) if isinstance(v, (str, int, float)) else v
        if t.is_binary(dtype):
            return lambda v: v.encode("utf-8") if isinstance(v, str) else v
        if t.is_duration(dtype):
            return _duration
        if t.is_time(dtype):
            return lambda v: dt.time.fromisoformat(v) if isinstance(v, str) else v
        if t.is_list(dtype) or t.is_large_list(dtype) or t.is_map(dtype) or t.is_struct(dtype):
            nested = self.nested(dtype)
            if csv_cell:
                return lambda v: nested(json.loads(v)) if isinstance(v, str) else nested(v)
            return nested
        if t.is_integer(dtype):
            return _whole(dtype, csv_cell)
        if t.is_floating(dtype):
            return _csv_float if csv_cell else _json_float
        if not csv_cell:
            return _same
        if t.is_boolean(dtype):
            return _csv_bool
        return _same

    def nested(self, dtype: pa.DataType) -> Convert:
        t = pa.types
        if t.is_list(dtype) or t.is_large_list(dtype):
            item = self.converter(dtype.value_type, csv_cell=False)
            return lambda v: (
                [None if x is None else item(x) for x in v] if isinstance(v, list) else v
            )
        if t.is_map(dtype):
            key = self.converter(dtype.key_type, csv_cell=True)  # JSON object keys are text
            val = self.converter(dtype.item_type, csv_cell=False)
            return lambda v: (
                [(key(k), None if x is None else val(x)) for k, x in v.items()]
                if isinstance(v, dict)
                else v
            )
        if t.is_struct(dtype):
            fields = {f.name: self.converter(f.type, csv_cell=False) for f in dtype}
            return lambda v: (
                {
                    k: (None if x is None else fields[k](x)) if k in fields else x
                    for k, x in v.items()
                }
                if isinstance(v, dict)
                else v
            )
        return self.converter(dtype, csv_cell=False)


def _same(value: Any) -> Any:
    return value


_INT64_MAX = 2**63 - 1
# Python's int() and float() also take "1_000" and digits of other scripts ("١٢"): a CSV cell
# is read as Spark reads one, ASCII digits only (spaces around it allowed).
_WHOLE_TEXT = re.compile(r"\s*[+-]?[0-9]+\s*", re.ASCII)
_NUMBER_TEXT = re.compile(
    r"\s*[+-]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?|nan|inf|infinity)\s*",
    re.ASCII | re.IGNORECASE,
)


def _whole(dtype: pa.DataType, csv_cell: bool) -> Convert:
    """A whole number within ``dtype``'s range (a CSV cell's text read as one)."""
    bits = dtype.bit_width
    lo, hi = (
        (0, 2**bits - 1)
        if pa.types.is_unsigned_integer(dtype)
        else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    )

    def whole(v: Any) -> Any:
        if csv_cell and isinstance(v, str):
            if not _WHOLE_TEXT.fullmatch(v):
                raise ValueError("not a whole number (digits, an optional sign)")
            v = int(v)
        if type(v) is int and not lo <= v <= hi:
            raise ValueError(f"out of the range [{lo}, {hi}] of {dtype}")
        return v

    return whole


def _json_float(v: Any) -> Any:
    if type(v) is int:
        float(v)  # OverflowError past a double's range
    return v


def _csv_float(v: Any) -> Any:
    if not isinstance(v, str):
        return _json_float(v)
    if not _NUMBER_TEXT.fullmatch(v):
        raise ValueError("not a number (such as 12, -1.5, 2e-3, NaN or Infinity)")
    return float(v)


def _duration(v: Any) -> Any:
    """Microseconds (a number, or its text) as a timedelta, within a duration's int64 range."""
    if isinstance(v, str) and not _WHOLE_TEXT.fullmatch(v):
        raise ValueError("not a whole number of microseconds")
    if isinstance(v, (int, str)) and not isinstance(v, bool):
        us = int(v)
        if not -_INT64_MAX - 1 <= us <= _INT64_MAX:
            raise ValueError("microseconds out of a duration's range (int64)")
        return dt.timedelta(microseconds=us)
    return v


def _csv_bool(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    text = value.strip().lower()
    if text in ("true", "t", "1", "yes"):
        return True
    if text in ("false", "f", "0", "no"):
        return False
    raise ValueError(f"{value!r} is not a boolean (true/false)")

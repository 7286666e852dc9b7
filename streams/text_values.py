"""Values read from text (JSON lines, CSV cells) turned into what a payload column of a given
Arrow type takes: the one conversion the ``rowtime insert`` command and the directory connector
share, so a file means the same in both."""

from __future__ import annotations

import datetime as dt
import json
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

    def instant(self, value: Any) -> dt.datetime:
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)  # an epoch in `unit` written as text (CSV)
        return from_rowtime_us(self.time_format.read(value))

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
            return lambda v: dt.timedelta(microseconds=int(v)) if isinstance(v, (int, str)) else v
        if t.is_time(dtype):
            return lambda v: dt.time.fromisoformat(v) if isinstance(v, str) else v
        if t.is_list(dtype) or t.is_large_list(dtype) or t.is_map(dtype) or t.is_struct(dtype):
            nested = self.nested(dtype)
            if csv_cell:
                return lambda v: nested(json.loads(v)) if isinstance(v, str) else nested(v)
            return nested
        if not csv_cell:
            return _same
        if t.is_integer(dtype):
            return lambda v: int(v) if isinstance(v, str) else v
        if t.is_floating(dtype):
            return lambda v: float(v) if isinstance(v, str) else v
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


def _csv_bool(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    text = value.strip().lower()
    if text in ("true", "t", "1", "yes"):
        return True
    if text in ("false", "f", "0", "no"):
        return False
    raise ValueError(f"{value!r} is not a boolean (true/false)")

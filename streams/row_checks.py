"""What the writer checks of a row before it buffers it, besides its columns' names: which
Python values pass without asking pyarrow (``fast_types``, ``INT_RANGES``), and the
size limit of one record, ``MAX_RECORD_BYTES`` of string and binary values.

A record's top-level ``STRING`` and ``BINARY`` columns (UTF-8 bytes for strings) hold at most
64 MiB together; the writer refuses a larger row at insert, naming it, and buffers nothing of
that call (``Writer.insert``, ``Writer.insert_arrow``). Every backend can store a record of
that size in one piece (a Redis entry's bulk string is capped at 512 MiB, an Arrow string
array at 2 GiB), and a reader's batch of such records stays within a task's memory. Fixed-width
columns are small by their type; nested columns are not counted.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..bounds.arrays import as_numpy
from ..bounds.errors import SchemaError

__all__ = [
    "INT_RANGES",
    "MAX_RECORD_BYTES",
    "check_row",
    "check_table",
    "counted_columns",
    "fast_types",
]

INT_RANGES = {
    pa.int8(): (-(2**7), 2**7 - 1),
    pa.int16(): (-(2**15), 2**15 - 1),
    pa.int32(): (-(2**31), 2**31 - 1),
    pa.int64(): (-(2**63), 2**63 - 1),
}


def fast_types(dtype: pa.DataType) -> frozenset[type]:
    """Python types that need no further check for a column of ``dtype`` (besides int range).

    Anything else goes through ``writer.Writer._check_row``, which asks pyarrow.
    """
    t = pa.types
    if t.is_integer(dtype):
        return frozenset({int})
    if t.is_floating(dtype):
        return frozenset({float, int})
    if t.is_boolean(dtype):
        return frozenset({bool})
    if t.is_string(dtype):
        return frozenset({str})
    if t.is_binary(dtype):
        return frozenset({bytes, bytearray})
    if t.is_timestamp(dtype):
        return frozenset({dt.datetime})
    if t.is_date32(dtype):
        return frozenset({dt.date})
    if t.is_duration(dtype):
        return frozenset({dt.timedelta})
    if t.is_time(dtype):
        return frozenset({dt.time})
    return frozenset()  # decimal, nested: checked by pyarrow every time


#: The most bytes of string and binary values one record may hold.
MAX_RECORD_BYTES = 64 << 20
#: A character takes at most 4 bytes in UTF-8: rows with fewer characters pass unencoded.
ROW_ROOM_CHARS = MAX_RECORD_BYTES // 4

_COUNTED = (
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_binary,
    pa.types.is_large_binary,
)


def counted_columns(schema: pa.Schema) -> tuple[int, ...]:
    """The indexes of the columns whose values count toward ``MAX_RECORD_BYTES``."""
    return tuple(i for i, f in enumerate(schema) if any(is_(f.type) for is_ in _COUNTED))


def too_large(size: int, names: Sequence[str], where: str, index: int | None) -> SchemaError:
    what = "the row" if index is None else f"row {index} of the inserted table"
    return SchemaError(
        f"{what} holds {size} bytes in its string and binary columns ({', '.join(names)}), "
        f"more than the {MAX_RECORD_BYTES >> 20} MiB a record of {where} may hold; keep large "
        "values elsewhere (a file, an object) and insert their reference, or split them across "
        "records. Nothing was written"
    )


def check_row(
    values: Sequence[Any], counted: Sequence[int], names: Sequence[str], where: str
) -> None:
    """Raise ``SchemaError`` when the row ``values`` holds more than the limit (the
    writer calls it only for rows of more than ``ROW_ROOM_CHARS`` characters)."""
    size = 0
    for i in counted:
        v = values[i]
        if v is not None:
            size += len(v.encode("utf-8")) if isinstance(v, str) else len(v)
    if size > MAX_RECORD_BYTES:
        raise too_large(size, [names[i] for i in counted], where, None)


def check_table(
    columns: Sequence[pa.ChunkedArray], counted: Sequence[int], names: Sequence[str], where: str
) -> None:
    """Raise ``SchemaError`` naming the first row of ``columns`` over the limit."""
    if not counted or not len(columns[0]):
        return
    sizes = np.zeros(len(columns[0]), dtype=np.int64)
    for i in counted:
        sizes += as_numpy(pc.binary_length(columns[i]).fill_null(0)).astype(np.int64, copy=False)
    if int(sizes.max()) > MAX_RECORD_BYTES:
        first = int(np.flatnonzero(sizes > MAX_RECORD_BYTES)[0])
        raise too_large(int(sizes[first]), [names[i] for i in counted], where, first)

"""Arrow columns as numpy arrays and numpy arrays as Arrow columns, without pyarrow's pandas path.

``pa.Array.to_numpy`` goes through pyarrow's pandas conversion, whose first use in a process
imports pandas when it is installed, a fixed cost of a large import. Spark starts a new Python
process for the driver side of every streaming query (``latestOffset``, ``partitions``) and
every Python worker begins fresh, so the reader would pay that import again in the first
planning step of every query, however small (the planning's share of a drain is on
docs/benchmarks.md, "The reader"). These functions read the Arrow buffers directly: a view
for fixed-width values, one vectorised unpack for booleans. Arrays with nulls keep pyarrow's
own conversion (and its meaning of a null). And ``each_on_threads``, the driver's array
work spread over threads, with ``take_rows``, the gather of a large table a column a
thread.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import pyarrow as pa

#: Arrow types whose values buffer numpy reads as it is, by bit width (int64 for the times).
_SIGNED = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}
_UNSIGNED = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
_FLOAT = {32: np.float32, 64: np.float64}


def _dtype(t: pa.DataType) -> np.dtype | None:
    if pa.types.is_signed_integer(t):
        return np.dtype(_SIGNED[t.bit_width])
    if pa.types.is_unsigned_integer(t):
        return np.dtype(_UNSIGNED[t.bit_width])
    if pa.types.is_floating(t) and t.bit_width in _FLOAT:
        return np.dtype(_FLOAT[t.bit_width])
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t):
        return np.dtype(np.int64)
    if pa.types.is_date32(t):
        return np.dtype(np.int32)
    return None


def _one(a: pa.Array) -> np.ndarray:
    n, off = len(a), a.offset
    if a.null_count or n == 0:
        return a.to_numpy(zero_copy_only=False)
    buf = a.buffers()[1]
    if pa.types.is_boolean(a.type):
        bits = np.frombuffer(buf, dtype=np.uint8, count=(off + n + 7) // 8)
        return np.unpackbits(bits, count=off + n, bitorder="little")[off:].view(np.bool_)
    dtype = _dtype(a.type)
    if dtype is None:
        return a.to_numpy(zero_copy_only=False)
    return np.frombuffer(buf, dtype=dtype, count=n, offset=off * dtype.itemsize)


def as_numpy(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``values`` as a numpy array: the same values as ``values.to_numpy(zero_copy_only=False)``.

    Without nulls, integers, floats, timestamps, durations and dates come as a read-only view of
    the Arrow buffer when there is one chunk (a copy that joins the chunks otherwise), booleans
    as a new array of ``np.bool_``; timestamps, durations and dates as their integer storage
    (int64, or int32 for date32). With nulls, or for other types, pyarrow converts.
    """
    if isinstance(values, pa.ChunkedArray):
        chunks = values.chunks
        if len(chunks) == 1:
            return _one(chunks[0])
        if not chunks:
            return _one(pa.array([], type=values.type))
        return np.concatenate([_one(c) for c in chunks])
    return _one(values)


def to_arrow(
    values: np.ndarray | list[bool] | list[int],
    type: pa.DataType | None = None,
    mask: np.ndarray | None = None,
) -> pa.Array:
    """A one-dimensional numpy array of booleans or numbers (a list: as numpy reads it) as an
    Arrow array: the same array as ``pa.array(values, type=type, mask=mask)``, without pyarrow's
    pandas path. ``pa.array`` (and ``pa.scalar``) ask pandas whether the values are
    categorical, and the first call in a process imports pandas, a cost each of Spark's fresh
    Python workers and planners would pay again. ``type``, when given, is an
    integer, floating point or boolean type the values are converted to (numpy's rules, as a
    ``safe=False`` cast); ``mask``, when given, is True where the value is null."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"to_arrow takes one-dimensional arrays, not {array.ndim}-dimensional")
    if array.dtype.kind not in "biuf":
        raise TypeError(f"to_arrow makes boolean and number arrays, not of numpy {array.dtype}")
    if mask is not None and len(mask) != len(array):
        raise ValueError(f"to_arrow: a mask of {len(mask)} for {len(array)} values")
    if type is not None:
        array = array.astype(_numpy_dtype(type), copy=False)
    if array.dtype == np.bool_:
        data = np.packbits(array, bitorder="little")
        arrow_type = pa.bool_()
    else:
        data = np.ascontiguousarray(array)
        arrow_type = pa.from_numpy_dtype(array.dtype)
    validity, nulls = None, 0
    if mask is not None:
        nulls = int(np.count_nonzero(mask))
        if nulls:
            validity = pa.py_buffer(np.packbits(~np.asarray(mask, dtype=bool), bitorder="little"))
    buffers = [validity, pa.py_buffer(data)]
    return pa.Array.from_buffers(arrow_type, len(array), buffers, null_count=nulls)


def _numpy_dtype(t: pa.DataType) -> np.dtype:
    if pa.types.is_boolean(t):
        return np.dtype(np.bool_)
    dtype = _dtype(t)
    if dtype is None or not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        raise TypeError(f"to_arrow makes boolean, integer and floating point arrays, not {t}")
    return dtype


_T = TypeVar("_T")
_R = TypeVar("_R")


def each_on_threads(
    work: Callable[[_T], _R], items: Sequence[_T], threaded: bool, name: str
) -> list[_R]:
    """``work`` over ``items``, results in order. When ``threaded`` (the caller's judgement
    that the work is large) and there are two items and two processors or more, on threads,
    one a processor at most: numpy's passes over whole arrays and Arrow's kernels let go of the
    GIL, so the driver's work spreads over the cores its executors are not using meanwhile.
    The first item's error, in order, is the one raised, as one after the other."""
    workers = min(len(items), os.cpu_count() or 1)
    if not threaded or workers < 2:
        return [work(item) for item in items]
    with concurrent.futures.ThreadPoolExecutor(workers, name) as pool:
        return list(pool.map(work, items))


#: A table of at least this many rows is gathered a column a thread (``take_rows``).
PARALLEL_TAKE_ROWS = 1 << 20


def take_rows(table: pa.Table, indices: pa.Array) -> pa.Table:
    """``table.take(indices)``; a large table (``PARALLEL_TAKE_ROWS``) has its columns
    gathered on threads (``each_on_threads``). Arrow's ``Table.take`` gathers one column
    after the other on the calling thread: the sink's commit merges a micro-batch's staged
    runs this way on the driver, alone, while the executors wait for it (docs/benchmarks.md,
    "The sink")."""
    if table.num_rows < PARALLEL_TAKE_ROWS:
        return table.take(indices)
    columns = each_on_threads(lambda c: c.take(indices), table.columns, True, "rowtime-take")
    return pa.Table.from_arrays(columns, schema=table.schema)

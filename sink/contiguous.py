"""Record batches copied, as they arrive, into one chunk per column.

A write task sorts the rows that reach it out of rowtime order: it gathers them by ``take``.
Arrow gathers from one chunk faster than from Spark's hundreds of record batches (from
groups of batches combined, no faster than from the batches: docs/benchmarks.md, "The sink"),
and combining them when the run is full
would hold a second copy of it. So, once rows come out of order, each batch's values are
copied into columns that hold the whole run, and the batch is let go: the run is one chunk,
held once. The columns are allocated at the run's largest size and filled as rows come (the
system gives memory a page at a time as it is written, not at the allocation), and kept for the
process's next run (``_empty``).

Fixed-width columns (integers, floats, times) and strings and binaries are copied; a run with
another type (booleans, decimals, nested) keeps its batches as they are (``Contiguous.of``
says None) and is gathered from them.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pyarrow as pa

from ..bounds.arrays import as_numpy

__all__ = ["Contiguous"]

_OFFSETS = {pa.string(): np.int32, pa.binary(): np.int32}
_LARGE = {pa.large_string(): np.int64, pa.large_binary(): np.int64}


def _fixed(t: pa.DataType) -> np.dtype | None:
    """The numpy type of a fixed-width column's values, or None."""
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return np.dtype(t.to_pandas_dtype())
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t):
        return np.dtype(np.int64)
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return np.dtype(np.int32)
    if pa.types.is_time64(t):
        return np.dtype(np.int64)
    return None


#: The columns of this process's runs, each reused by a later run once nothing holds it.
_KEPT: list[np.ndarray] = []
#: At most this many kept (a run has an array a fixed-width column, two a string column).
_KEEP = 16
_KEPT_LOCK = threading.Lock()  # Spark runs one task a worker; a process may run more


def _empty(n: int, dtype: np.dtype | type) -> np.ndarray:
    """An array of ``n`` values of ``dtype``, uninitialised: one an earlier run of this process
    used, when nothing holds it any more, else a new one (then kept).

    A Spark Python worker runs task after task; memory it frees goes back to the system and
    comes again page by page, each page a fault the system fills with zeros, a cost that grows
    with the run (docs/benchmarks.md, "The sink"). Kept, a run's columns cost nothing the next time.
    Spark stops a worker idle for a minute, and with it what it kept."""
    dtype = np.dtype(dtype)
    with _KEPT_LOCK:
        for i in range(len(_KEPT)):
            # 2: the list's reference and getrefcount's own; a view, or an Arrow buffer over
            # the array, holds one more: then a table of the run it was is still in use.
            if _KEPT[i].dtype == dtype and len(_KEPT[i]) == n and sys.getrefcount(_KEPT[i]) == 2:
                return _KEPT[i]
        array = np.empty(n, dtype=dtype)
        free = [i for i in range(len(_KEPT)) if sys.getrefcount(_KEPT[i]) == 2]
        if len(_KEPT) >= _KEEP and free:
            del _KEPT[free[0]]  # the oldest no one holds
        if len(_KEPT) < _KEEP:
            _KEPT.append(array)
        return array


class _Column:
    """One column of the run: values (or offsets and bytes), and which rows are null."""

    def __init__(self, field: pa.Field, rows: int, data_bytes: int) -> None:
        self.type = field.type
        self.fixed = _fixed(field.type)
        self.offsets_type = {**_OFFSETS, **_LARGE}.get(field.type)
        if self.fixed is not None:
            self.values = _empty(rows, self.fixed)
        else:
            assert self.offsets_type is not None
            self.values = _empty(rows + 1, self.offsets_type)
            self.values[0] = 0
            if self.offsets_type is np.int32:  # 32-bit offsets address 2 GiB
                data_bytes = min(data_bytes, 2**31 - 1)
            self.data = _empty(data_bytes, np.uint8)
            self.used = 0
        self.valid: np.ndarray | None = None  # made at the first null

    def fits(self, array: pa.Array) -> bool:
        if self.fixed is not None:
            return True
        offsets = self._offsets(array)
        return self.used + int(offsets[-1] - offsets[0]) <= len(self.data)

    def _offsets(self, array: pa.Array) -> np.ndarray:
        buf = array.buffers()[1]
        assert self.offsets_type is not None
        return np.frombuffer(buf, dtype=self.offsets_type)[
            array.offset : array.offset + len(array) + 1
        ]

    def put(self, array: pa.Array, at: int) -> None:
        """Copy ``array``'s values in as rows ``at`` on."""
        n = len(array)
        if not n:
            return
        buffers = array.buffers()
        if self.fixed is not None:
            values = np.frombuffer(buffers[1], dtype=self.fixed)
            self.values[at : at + n] = values[array.offset : array.offset + n]
        else:
            offsets = self._offsets(array)
            start, end = int(offsets[0]), int(offsets[-1])
            data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else None
            if end > start and data is not None:
                self.data[self.used : self.used + end - start] = data[start:end]
            self.values[at + 1 : at + n + 1] = offsets[1:] - start + self.used
            self.used += end - start
        if array.null_count:
            if self.valid is None:
                self.valid = np.ones(len(self.values), dtype=np.bool_)
            self.valid[at : at + n] = as_numpy(array.is_valid())
        elif self.valid is not None:
            self.valid[at : at + n] = True

    def array(self, rows: int) -> pa.Array:
        validity = None
        if self.valid is not None and not self.valid[:rows].all():
            validity = pa.py_buffer(np.packbits(self.valid[:rows], bitorder="little"))
        if self.fixed is not None:
            return pa.Array.from_buffers(
                self.type, rows, [validity, pa.py_buffer(self.values[:rows])]
            )
        offsets = pa.py_buffer(self.values[: rows + 1])
        return pa.Array.from_buffers(
            self.type, rows, [validity, offsets, pa.py_buffer(self.data[: self.used])]
        )


class Contiguous:
    """The rows of one run, one chunk per column, filled a record batch at a time."""

    def __init__(self, schema: pa.Schema, rows: int, data_bytes: int) -> None:
        self.schema = schema
        self.rows = 0
        self._columns = [_Column(f, rows, data_bytes) for f in schema]
        self._capacity = rows

    @classmethod
    def of(cls, schema: pa.Schema, rows: int, data_bytes: int) -> Contiguous | None:
        """Room for ``rows`` rows and ``data_bytes`` bytes of each string column, or None when
        a column's type is not copied here."""
        for f in schema:
            if _fixed(f.type) is None and f.type not in _OFFSETS and f.type not in _LARGE:
                return None
        try:
            return cls(schema, rows, data_bytes)
        except MemoryError:  # a system that counts memory allocated, not written (overcommit)
            return None

    def add(self, batch: pa.RecordBatch) -> bool:
        """Copy ``batch``'s rows in; False (and nothing copied) when they do not fit."""
        n = batch.num_rows
        if self.rows + n > self._capacity or not all(
            c.fits(batch.column(i)) for i, c in enumerate(self._columns)
        ):
            return False
        for i, c in enumerate(self._columns):
            c.put(batch.column(i), self.rows)
        self.rows += n
        return True

    def values(self, i: int) -> np.ndarray:
        """The values of fixed-width column ``i`` copied in so far (a view; timestamps as
        their int64 storage)."""
        column = self._columns[i]
        assert column.fixed is not None, "values() is for fixed-width columns"
        return column.values[: self.rows]

    def table(self) -> pa.Table:
        """The rows copied in, as a table of one chunk per column (its buffers are this
        object's: it must not be filled again while the table is in use)."""
        arrays = [c.array(self.rows) for c in self._columns]
        return pa.Table.from_arrays(arrays, schema=self.schema)

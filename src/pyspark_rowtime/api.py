"""The public functions for adapter authors, tools and ops (re-exported by ``pyspark_rowtime``).

* :func:`create_stream` makes a stream (a folder) with a payload schema and ops' defaults;
* :func:`open_writer` appends rows and rowtime bounds to one partition (SQLstream's RowSink);
* :func:`get_rowtime_bound` reads a stream's clock (SQLstream's ``getRowtimeBound``);
* :func:`read_stream` returns every record, for tests, tools and small streams.

Locations are local paths or ``file://`` URLs.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

import numpy as np
import pyarrow as pa

from .bounds.time import from_rowtime_us
from .sink.parquet_target import parquet_clock_us
from .streams.columns import LOG_ARRIVAL_US, LOG_IS_BOUND, LOG_ROWTIME_US
from .streams.storage import (
    LocationKind,
    StreamStorage,
    create_storage,
    open_storage,
    what_is_at,
)
from .streams.writer import Writer
from .streams.writer import open_writer as _open_writer

__all__ = [
    "create_stream",
    "get_rowtime_bound",
    "open_stream",
    "open_writer",
    "read_stream",
]

UTC_US = pa.timestamp("us", tz="UTC")


def create_stream(
    location: str | os.PathLike[str],
    schema: str | pa.Schema,
    partitions: int = 1,
    **defaults: Any,
) -> StreamStorage:
    """Create a stream at ``location`` and return it opened.

    Args:
        location: a local path or ``file://`` URL; the folder is created.
        schema: the payload columns, as a Spark DDL string (``"a INT, b STRING, ts TIMESTAMP"``)
            or a pyarrow schema (stored in Spark's Arrow form). Columns named ``rowtime`` or
            ``is_bound``, or starting with ``__``, are refused (the reader and the log add them).
        partitions: how many partitions (each with its own writer and clock), >= 1.
        defaults: the ops' defaults for readers: ``order`` (reject|drop|adjust),
            ``adjust_unit`` (sec|msec|usec), ``adjust_range`` (int >= 0), ``adjust_max_held``
            (int > 0), ``rowtime_column`` (a payload column), ``rowtime_unit`` (s|ms|us|ns),
            ``rowtime_format``, ``rowtime_timezone``. Writers use the last three to read rowtimes
            and check ``order=reject`` at insert time.

    Creating a stream that exists with the same schema and partitions (and defaults, if given)
    is a no-op; anything different raises (:class:`SchemaError`, :class:`OptionError`).
    """
    return create_storage(location, schema, partitions, **defaults)


def open_stream(location: str | os.PathLike[str]) -> StreamStorage:
    """The stream at ``location`` opened for reading (see :class:`~.streams.storage.
    StreamStorage` for what it offers); :class:`StreamNotFoundError` says how to create one."""
    return open_storage(location)


def open_writer(
    location: str | os.PathLike[str] | StreamStorage,
    partition: int = 0,
    heartbeat: Any = None,
    **options: Any,
) -> Writer:
    """A writer for one partition, to use as a context manager.

    ``insert(row, rowtime=None)``, ``insert_arrow(table, rowtime_column=None)``,
    ``set_rowtime_bound(t, strict=False)``, ``end_stream()``, ``flush()``, ``close()``. Inserts
    buffer; ``flush()`` makes them durable and visible (returns the committed record count);
    the buffer is also flushed past a size and on close. ``heartbeat`` (a duration such as
    ``"1s"``) writes a bound at the arrival time whenever the writer has been idle that long.
    A second writer on the same partition raises :class:`WriterLockedError` while the first
    lives. See :mod:`pyspark_rowtime.streams.writer` for the guarantees.
    """
    return _open_writer(location, partition, heartbeat, **options)


# -- clocks ------------------------------------------------------------------------------------


def rowtime_bound_us(location: str | os.PathLike[str]) -> int | None:
    """:func:`get_rowtime_bound` in microseconds since the epoch."""
    where = what_is_at(location)
    if where.kind is LocationKind.STREAM:
        return open_storage(location).stream_clock_us()
    if where.kind is LocationKind.PARQUET_TARGET:
        return parquet_clock_us(where.resolved)
    if where.kind is LocationKind.PENDING_STREAM_TARGET:
        return None  # a stream target whose first batch has not committed yet
    return open_storage(location).stream_clock_us()  # raises StreamNotFoundError, saying what to do


def get_rowtime_bound(location: str | os.PathLike[str]) -> dt.datetime | None:
    """The clock of the stream at ``location`` (SQLstream's ``getRowtimeBound``), or of a
    Parquet target written by ``writeStream.format("rowtime")``.

    A timezone-aware UTC datetime: every row written later has a rowtime at or above it (for
    the ``reject`` policy; ``drop`` and ``adjust`` discard rows below it). It is the minimum of
    the partition clocks, each the highest bound or data rowtime of its partition (SPEC 5), and
    None while any partition is empty. End of stream is 9999-12-31T23:59:59.999999Z. For a
    Parquet target it is the clock the sink committed (None before its first), below which
    every time partition is complete. A stream target whose query has not committed its first
    batch (which creates the stream) has none yet either.
    """
    clock = rowtime_bound_us(location)
    return None if clock is None else from_rowtime_us(clock)


# -- reading everything ------------------------------------------------------------------------


def read_stream(location: str | os.PathLike[str] | StreamStorage) -> pa.Table:
    """Every record of every partition, partition by partition, in offset order.

    Columns: ``partition`` (int32), ``offset`` (int64), ``arrival`` (timestamp UTC), ``rowtime``
    (timestamp UTC: the explicit rowtime, the bound of a bound record, null where the writer gave
    none), ``is_bound`` (bool), then the payload columns (null on bound records). Reads only
    committed records, from each partition's first kept offset (retention); meant for tests,
    tools and small streams (it holds everything at once).
    """
    stream = location if isinstance(location, StreamStorage) else open_stream(location)
    payload = stream.meta.payload_schema
    schema = pa.schema(
        [
            pa.field("partition", pa.int32(), nullable=False),
            pa.field("offset", pa.int64(), nullable=False),
            pa.field("arrival", UTC_US, nullable=False),
            pa.field("rowtime", UTC_US),
            pa.field("is_bound", pa.bool_(), nullable=False),
            *(f.with_nullable(True) for f in payload),
        ]
    )
    parts = []
    for p in range(stream.meta.partitions):
        end = stream.end_offset(p)
        first = stream.start_offset(p)  # retention may have removed the records before it
        if end == first:
            continue
        t = stream.read(p, first, end)
        columns = [
            pa.chunked_array([pa.array(np.full(end - first, p, dtype=np.int32))]),
            pa.chunked_array([pa.array(np.arange(first, end, dtype=np.int64))]),
            t.column(LOG_ARRIVAL_US).cast(UTC_US),
            t.column(LOG_ROWTIME_US).cast(UTC_US),
            t.column(LOG_IS_BOUND),
            *(t.column(f.name) for f in payload),
        ]
        parts.append(pa.Table.from_arrays(columns, schema=schema))
    if not parts:
        return schema.empty_table()
    return pa.concat_tables(parts)

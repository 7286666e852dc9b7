"""The public functions for adapter authors, tools and ops (re-exported by ``pyspark_rowtime``).

* [`create_stream`][pyspark_rowtime.api.create_stream] makes a stream with a payload schema
  and ops' defaults;
* [`open_writer`][pyspark_rowtime.api.open_writer] appends rows and rowtime bounds to one
  partition (SQLstream's RowSink);
* [`get_rowtime_bound`][pyspark_rowtime.api.get_rowtime_bound] reads a stream's clock
  (SQLstream's ``getRowtimeBound``), or a sink target's;
* [`wait_for_rowtime_bound`][pyspark_rowtime.api.wait_for_rowtime_bound] waits until that
  clock reaches a time (``rowtime wait``);
* [`open_stream`][pyspark_rowtime.api.open_stream] opens a stream to read, and
  [`read_stream`][pyspark_rowtime.api.read_stream] returns every record, for tests, tools and
  small streams.

A location is a local path or ``file://`` URL (the embedded log), ``redis://`` or
``rediss://`` (Redis Streams), ``s3://``, ``az://``, ``abfs://`` or ``abfss://`` (object
storage); the clock functions also read sink targets: Parquet folders, Delta tables and
``iceberg://CATALOG/NAMESPACE.TABLE``.
"""

from __future__ import annotations

import datetime as dt
import os
import time as _time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from .bounds.durations import parse_duration_us
from .bounds.errors import CorruptLogError, StreamNotFoundError
from .bounds.time import from_rowtime_us, to_rowtime_us
from .sink.parquet_target import parquet_clock_us
from .streams.columns import LOG_ARRIVAL_US, LOG_IS_BOUND, LOG_ROWTIME_US
from .streams.storage import (
    LocationKind,
    StreamStorage,
    redact_url,
    what_is_at,
)
from .streams.storage import create_stream as _create_stream
from .streams.storage import open_stream as _open_stream
from .streams.tables import (
    CLOCK_KEY,
    delta_table,
    iceberg_table,
    is_iceberg_location,
    parse_iceberg_location,
)
from .streams.writer import Writer
from .streams.writer import open_writer as _open_writer
from .wait import DEFAULT_POLL_S, parse_timeout_s, wait_for_clock

__all__ = [
    "create_stream",
    "get_rowtime_bound",
    "open_stream",
    "open_writer",
    "read_stream",
    "rowtime_bound_us",
    "wait_for_rowtime_bound",
]

UTC_US = pa.timestamp("us", tz="UTC")


def create_stream(
    location: str | os.PathLike[str],
    schema: str | pa.Schema,
    partitions: int = 1,
    **defaults: Any,
) -> StreamStorage:
    """Create a stream at ``location`` and return it opened.

    Creating a stream that exists with the same schema and partitions (and defaults, if given)
    is a no-op; anything different raises.

    Args:
        location: where the stream lives (see the module): a local path or ``file://`` URL
            (the folder is created), ``redis://``, ``s3://``, ``az://``...
        schema: the payload columns, as a Spark DDL string (``"a INT, b STRING, ts TIMESTAMP"``)
            or a pyarrow schema (stored in Spark's Arrow form). Columns named ``rowtime`` or
            ``is_bound``, or starting with ``__``, are refused (the reader and the log add them).
        partitions: how many partitions (each with its own writer and clock), >= 1.
        defaults: the ops' defaults for readers: ``order`` (reject|drop|adjust),
            ``adjust_unit`` (sec|msec|usec), ``adjust_range`` (int >= 0), ``adjust_max_held``
            (int > 0), ``rowtime_column`` (a payload column), ``rowtime_unit`` (s|ms|us|ns),
            ``rowtime_format``, ``rowtime_timezone``. Writers use the last three to read rowtimes
            and check ``order=reject`` at insert time.

    Returns:
        The stream, opened (as [`open_stream`][pyspark_rowtime.api.open_stream] returns it).

    Raises:
        SchemaError: a stream exists at ``location`` with another schema, or ``schema`` holds
            a column the reader or the log adds.
        OptionError: a default is unknown or out of range, or differs from the existing
            stream's.

    Examples:
        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> path = tempfile.mkdtemp() + "/speeds"
        >>> stream = rt.create_stream(path, "sensor STRING, speed DOUBLE", partitions=2)
        >>> stream.meta.partitions
        2
        >>> stream.meta.payload_schema.names
        ['sensor', 'speed']
        >>> rt.create_stream(path, "sensor STRING, speed INT")
        Traceback (most recent call last):
        ...
        pyspark_rowtime.bounds.errors.SchemaError: ...
    """
    return _create_stream(location, schema, partitions, **defaults)


def open_stream(location: str | os.PathLike[str]) -> StreamStorage:
    """The stream at ``location`` opened for reading.

    Args:
        location: where the stream lives (see the module).

    Returns:
        The stream: its ``meta`` (payload schema, partitions, ops' defaults), each
        partition's ``end_offset(p)`` and ``clock_us(p)``, ``stream_clock_us()``.

    Raises:
        StreamNotFoundError: no stream at ``location``; the message says how to create one.

    Examples:
        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> path = tempfile.mkdtemp() + "/speeds"
        >>> _ = rt.create_stream(path, "sensor STRING, speed DOUBLE")
        >>> stream = rt.open_stream(path)
        >>> stream.end_offset(0), stream.stream_clock_us()
        (0, None)
        >>> rt.open_stream(path + "-typo")
        Traceback (most recent call last):
        ...
        pyspark_rowtime.bounds.errors.StreamNotFoundError: ...
    """
    return _open_stream(location)


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
    the buffer is also flushed past a size and on close. See
    [`Writer`][pyspark_rowtime.streams.writer.Writer] for the guarantees.

    Args:
        location: where the stream lives (see the module), or a stream already opened.
        partition: the partition to write, from 0.
        heartbeat: a duration (seconds, a ``timedelta`` or a string such as ``"1s"``): the
            writer writes a bound at the arrival time whenever it has been idle that long.
            None (default): no heartbeat.
        **options: the writer's options (its buffer's size, the rowtime's column, unit and
            format: see [`Writer`][pyspark_rowtime.streams.writer.Writer]).

    Returns:
        The writer, holding the partition until it is closed.

    Raises:
        WriterLockedError: another live writer holds the partition.
        StreamNotFoundError: no stream at ``location``.

    Examples:
        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> path = tempfile.mkdtemp() + "/speeds"
        >>> _ = rt.create_stream(path, "sensor STRING, speed DOUBLE")
        >>> with rt.open_writer(path) as w:
        ...     w.insert({"sensor": "a", "speed": 61.5}, rowtime="2026-12-02T10:00:00Z")
        ...     w.insert({"sensor": "b", "speed": 48.0}, rowtime="2026-12-02T10:00:01Z")
        ...     w.set_rowtime_bound("2026-12-02T10:00:05Z")
        ...     w.flush()
        3
    """
    return _open_writer(location, partition, heartbeat, **options)


# -- clocks ------------------------------------------------------------------------------------


def rowtime_bound_us(location: str | os.PathLike[str]) -> int | None:
    """``get_rowtime_bound`` in microseconds since the epoch."""
    return ClockReader(location)()


class ClockReader:
    """Reads the clock at one location, again and again (``wait_for_rowtime_bound``): a
    Delta or Iceberg table found once is kept and brought up to date (delta-rs reads only the
    commits since, pyiceberg the current metadata), other kinds are looked at afresh each time
    (a stream target becomes a stream with its first commit)."""

    def __init__(self, location: str | os.PathLike[str]) -> None:
        self.location = location
        self._delta: Any = None
        self._iceberg: Any = None

    def __call__(self) -> int | None:
        if self._delta is not None:
            self._delta.update_incremental()
            return _clock(self._delta.transaction_version(CLOCK_KEY), self.location)
        if self._iceberg is not None:
            self._iceberg.refresh()
            return _clock(self._iceberg.properties.get(CLOCK_KEY), self.location)
        if is_iceberg_location(self.location):  # one catalog read, not two
            table = iceberg_table(os.fspath(self.location))
            if table is None:
                raise missing_table_error(self.location) or StreamNotFoundError(self.location)
            self._iceberg = table
            return _clock(table.properties.get(CLOCK_KEY), self.location)
        where = what_is_at(self.location)
        if where.kind is LocationKind.STREAM:
            return open_stream(self.location).stream_clock_us()
        if where.kind is LocationKind.PARQUET_TARGET:
            return parquet_clock_us(where.resolved)
        if where.kind is LocationKind.DELTA_TARGET:
            table = delta_table(where.resolved)
            if table is None:
                return None  # the query started; its first commit creates the table
            self._delta = table
            return _clock(table.transaction_version(CLOCK_KEY), self.location)
        if where.kind is LocationKind.PENDING_STREAM_TARGET:
            return None  # a stream target whose first batch has not committed yet
        return open_stream(self.location).stream_clock_us()  # raises, saying what to do


def missing_table_error(location: str | os.PathLike[str]) -> StreamNotFoundError | None:
    """The error for an ``iceberg://`` location with no table (None for other locations: their
    backends say what is missing)."""
    if not is_iceberg_location(location):
        return None
    shown = parse_iceberg_location(os.fspath(location))
    return StreamNotFoundError(
        f"no Iceberg table {shown}: a sink with .option('target', 'iceberg') creates it; check "
        "the table's name and the catalog's configuration"
    )


def _clock(value: Any, location: str | os.PathLike[str]) -> int | None:
    """A table's ``rowtime.clock`` as an int (None: not set yet); a value that is not a whole
    number of microseconds is named, not a traceback."""
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise CorruptLogError(
            f"the clock of {redact_url(os.fspath(location))} (rowtime.clock = {value!r}) is not "
            "a whole number of microseconds: something other than the sink wrote it"
        ) from None


def get_rowtime_bound(location: str | os.PathLike[str]) -> dt.datetime | None:
    """The clock of the stream at ``location`` (SQLstream's ``getRowtimeBound``), or of a target.

    A target is what ``writeStream.format("rowtime")`` writes: a Parquet folder, a Delta table,
    an Iceberg table (``iceberg://CATALOG/NAMESPACE.TABLE``) or another stream.

    The clock promises that every row written later has a rowtime at or above it (for the
    ``reject`` policy; ``drop`` and ``adjust`` discard rows below it). It is the minimum of
    the partition clocks, each the highest bound or data rowtime of its partition (SPEC 5), and
    None while any partition is empty. End of stream is 9999-12-31T23:59:59.999999Z. For a
    sink target it is the clock the sink committed (None before its first), below which
    every time partition is complete: a Parquet target's ``clock.json``, a Delta table's app
    transaction ``rowtime.clock``, an Iceberg table's property ``rowtime.clock``. A stream
    target whose query has not committed its first batch (which creates the stream) has none
    yet either.

    Args:
        location: a stream (see the module) or a sink target.

    Returns:
        The clock, a timezone-aware UTC datetime, or None while there is none.

    Raises:
        StreamNotFoundError: nothing at ``location`` has a clock.

    Examples:
        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> path = tempfile.mkdtemp() + "/speeds"
        >>> _ = rt.create_stream(path, "sensor STRING, speed DOUBLE")
        >>> print(rt.get_rowtime_bound(path))
        None
        >>> with rt.open_writer(path) as w:
        ...     w.set_rowtime_bound("2026-12-02T10:00:05Z")
        >>> print(rt.get_rowtime_bound(path))
        2026-12-02 10:00:05+00:00
    """
    clock = rowtime_bound_us(location)
    return None if clock is None else from_rowtime_us(clock)


def wait_for_rowtime_bound(
    location: str | os.PathLike[str],
    time: Any,
    timeout: Any = None,
    poll: Any = DEFAULT_POLL_S,
    *,
    now: Callable[[], float] | None = None,
    sleep: Callable[[float], Any] | None = None,
) -> dt.datetime:
    """Wait until the clock at ``location`` reaches ``time``.

    The clock is the one [`get_rowtime_bound`][pyspark_rowtime.api.get_rowtime_bound] reads:
    of a stream, a stream target, a Parquet, Delta or Iceberg target. Once it reaches ``time``,
    everything with a rowtime below ``time`` is written.

    Args:
        location: a stream (see the module) or a sink target.
        time: a datetime (naive: UTC), an ISO-8601 string, or anything
            [`to_rowtime_us`][pyspark_rowtime.bounds.time.to_rowtime_us] reads (an int is
            epoch milliseconds).
        timeout: how long to wait at most: seconds, a ``timedelta`` or a string such as
            ``"90s"``, ``"2 h"``; 0 reads the clock once; None (default) waits as long as it
            takes.
        poll: the longest pause between reads (default 5 s): pauses start at 0.1 s and double
            up to it.
        now: monotonic seconds (default ``time.monotonic``), for tests that drive time.
        sleep: a pause (default ``time.sleep``), for tests that drive time.

    Returns:
        The clock read, a UTC datetime ``>= time``.

    Raises:
        WaitTimeoutError: the timeout passed first (a ``TimeoutError``; ``clock_us``,
            ``until_us`` and ``waited_s`` say where things stood).
        StreamNotFoundError: nothing at ``location`` to wait on.
        InvalidRowtimeError: ``time`` cannot be read.
        OptionError: ``timeout`` or ``poll`` cannot be read.

    Examples:
        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> path = tempfile.mkdtemp() + "/speeds"
        >>> _ = rt.create_stream(path, "sensor STRING, speed DOUBLE")
        >>> with rt.open_writer(path) as w:
        ...     w.set_rowtime_bound("2026-12-02T10:00:05Z")
        >>> print(rt.wait_for_rowtime_bound(path, "2026-12-02T10:00:00Z", timeout="10s"))
        2026-12-02 10:00:05+00:00
        >>> rt.wait_for_rowtime_bound(path, "2026-12-02T11:00:00Z", timeout=0)
        Traceback (most recent call last):
        ...
        pyspark_rowtime.bounds.errors.WaitTimeoutError: ...
    """
    until_us = to_rowtime_us(time)
    timeout_s = None if timeout is None else parse_timeout_s(timeout, what="timeout")
    poll_s = parse_duration_us(poll, what="poll") / 1e6
    waited = wait_for_clock(
        ClockReader(location),
        until_us,
        timeout_s=timeout_s,
        poll_s=poll_s,
        now=now or _time.monotonic,
        sleep=sleep or _time.sleep,
        what=f"the clock of {redact_url(os.fspath(location))}",
    )
    return from_rowtime_us(waited.clock_us)


# -- reading everything ------------------------------------------------------------------------


def read_stream(location: str | os.PathLike[str] | StreamStorage) -> pa.Table:
    """Every record of every partition, partition by partition, in offset order.

    Reads only committed records, from each partition's first kept offset (retention); meant
    for tests, tools and small streams (it holds everything at once).

    Args:
        location: where the stream lives (see the module), or a stream already opened.

    Returns:
        A pyarrow table. Columns: ``partition`` (int32), ``offset`` (int64), ``arrival``
        (timestamp UTC), ``rowtime`` (timestamp UTC: the explicit rowtime, the bound of a
        bound record, null where the writer gave none), ``is_bound`` (bool), then the payload
        columns (null on bound records).

    Raises:
        StreamNotFoundError: no stream at ``location``.

    Examples:
        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> path = tempfile.mkdtemp() + "/speeds"
        >>> _ = rt.create_stream(path, "sensor STRING, speed DOUBLE")
        >>> with rt.open_writer(path) as w:
        ...     w.insert({"sensor": "a", "speed": 61.5}, rowtime="2026-12-02T10:00:00Z")
        ...     w.set_rowtime_bound("2026-12-02T10:00:05Z")
        >>> records = rt.read_stream(path)
        >>> records.column("is_bound").to_pylist(), records.column("speed").to_pylist()
        ([False, True], [61.5, None])
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

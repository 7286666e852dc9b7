"""The adapter-facing writer: insert rows and bounds into one partition of a stream.

In the spirit of SQLstream's ``RowSink`` and ``setRowtimeBound``::

    with open_writer("/data/orders", partition=0) as w:
        w.insert({"ticker": "ORCL"}, rowtime="2006-09-11T12:00:00Z")
        w.insert({"ticker": "MSFT"})                    # implicit rowtime: the time of insert
        w.set_rowtime_bound(datetime(2006, 9, 11, 12, 5, tzinfo=timezone.utc))
        w.flush()                                       # durable when this returns

What is guaranteed:

* Every record stores its arrival time: the time its buffer commits (the injected ``clock``
  read at the flush, microseconds, made non-decreasing per partition, also across writers: a
  new writer starts from the last stored arrival), so a record never shows an arrival older
  than the moment it could be read, beyond the commit's own duration (SPEC 12; readers with
  ``idle.timeout`` rely on it). An implicit rowtime is the time of insert, stored as the row's
  rowtime (streams written before 0.2.0 store null there and mean the arrival). Explicit
  rowtimes are stored as given; the reader applies the ordering policy.
* ``insert``, ``insert_arrow`` and ``set_rowtime_bound`` either append everything they were given
  to the buffer or raise and append nothing: wrong keys or types, a bound below the partition
  clock, and (when the stream's default ``order`` is ``reject``) a row below the partition clock.
* ``flush`` makes the buffer one committed segment: durable and visible to readers as a whole,
  never in part. A flush that raised may or may not have committed (a store's lost reply);
  its records stay buffered, and calling ``flush()`` again completes that same append or finds
  it committed, never both (each backend knows the retried append by its id). Without a
  flush the buffer is flushed when it grows past ``flush_records``
  records or ``flush_bytes`` bytes of Arrow data, on ``close`` and by heartbeats.
* A partition's clock is the highest bound or data rowtime (explicit, the time of insert for
  implicit rows, or the arrival of an implicit row written before 0.2.0). After
  ``end_stream()`` the clock is the end of stream and no row can follow.
* One writer per partition: a second one gets ``WriterLockedError`` while the first lives.
* A record holds at most 64 MiB of string and binary values (``row_checks``); a larger
  row is refused at insert, naming it, and nothing of the call is buffered.

Rowtimes are read with one ``pyspark_rowtime.bounds.time.TimeFormat`` built from the
stream's defaults ``rowtime_unit`` (else ``ms``), ``rowtime_timezone`` (else UTC) and
``rowtime_format`` when the writer opens. When the stream names a ``rowtime_column`` and a row
comes without an explicit rowtime, that column's value is the row's explicit rowtime (what
readers promote).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa

from ..bounds.arrays import as_numpy, to_arrow
from ..bounds.bounds import END_OF_STREAM_US, NO_TIME, normalize_bound
from ..bounds.errors import (
    BoundError,
    CorruptLogError,
    InvalidRowtimeError,
    LateRowError,
    OptionError,
    RowtimeError,
    SchemaError,
    UnflushedRecordsError,
    WriterClosedError,
    WriterLockedError,
)
from ..bounds.time import TimeFormat, parse_duration_us
from ..bounds.time import format_rowtime as _iso  # the one formatter, short for messages
from .ddl import type_to_ddl
from .retention import RetentionCheck
from .row_checks import INT_RANGES, ROW_ROOM_CHARS, check_row, check_table, counted_columns
from .row_checks import fast_types as _fast_types
from .segments import SegmentStats, clock_before, data_run_stats
from .storage import StreamStorage, open_stream

__all__ = ["Writer", "open_writer", "wall_clock_us"]

DEFAULT_FLUSH_RECORDS = 1 << 17
DEFAULT_FLUSH_BYTES = 256 << 20


_time_ns = time.time_ns


def wall_clock_us() -> int:
    """The system's wall clock in microseconds since the epoch (the default arrival clock)."""
    return time.time_ns() // 1000


#: Rows per block of a column whose every value is the same (see ``constant_int64``).
_CONSTANT_BLOCK = 1 << 20


def constant_int64(n: int, value: int) -> pa.ChunkedArray:
    """``n`` copies of ``value`` as a chunked array whose chunks share one block of at most
    ``_CONSTANT_BLOCK`` values: the arrival column of a large insert costs no memory (and
    no page faults) per row; the IPC writer writes the chunks one after another."""
    block = to_arrow(np.full(min(n, _CONSTANT_BLOCK), value, dtype=np.int64))
    full, rest = divmod(n, _CONSTANT_BLOCK)
    chunks = [block] * full
    if rest:
        chunks.append(block.slice(0, rest))
    return pa.chunked_array(chunks, type=pa.int64())


def _with_arrival(chunk: pa.Table, stamp: int) -> pa.Table:
    """``chunk`` (in the record schema: arrival first) with every arrival ``stamp``."""
    return chunk.set_column(0, chunk.schema.field(0), constant_int64(chunk.num_rows, stamp))


class Writer:
    """Appends rows and bounds to one partition. Use ``open_writer`` to make one.

    Thread-safe (a heartbeat thread shares it). Not fork-safe: open writers in the process that
    uses them.
    """

    def __init__(
        self,
        stream: StreamStorage,
        partition: int = 0,
        *,
        heartbeat: Any = None,
        clock: Callable[[], int] | None = None,
        flush_records: int = DEFAULT_FLUSH_RECORDS,
        flush_bytes: int = DEFAULT_FLUSH_BYTES,
    ) -> None:
        self.stream = stream
        self.partition = partition
        self._where = f"partition {partition} of stream {stream.location}"
        heartbeat_us = None if heartbeat is None else parse_duration_us(heartbeat, what="heartbeat")
        for name, value in (("flush_records", flush_records), ("flush_bytes", flush_bytes)):
            # bool is an int to Python, and a str or float would fail later, mid-insert.
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise OptionError(f"{name}={value!r} must be a whole number >= 1")
        self._now = clock  # None: the wall clock, read inline on the hot path
        self._flush_records = flush_records
        self._flush_bytes = flush_bytes

        meta = stream.meta
        self._schema = meta.payload_schema
        self._file_schema = stream.file_schema
        fields = list(self._schema)
        self._names = tuple(f.name for f in fields)
        self._name_set = frozenset(self._names)
        self._accept = tuple(
            _fast_types(f.type) | ({type(None)} if f.nullable else set()) for f in fields
        )
        # Tuples of value types already known to need no per-value check (the fast path).
        self._good_types: set[tuple[type, ...]] = set()
        # int64 is checked when the buffer becomes Arrow (a Python int past 2**63 is rare).
        self._ranges = tuple(
            (i, *INT_RANGES[f.type])
            for i, f in enumerate(fields)
            if f.type in INT_RANGES and f.type != pa.int64()
        )
        self._wide = counted_columns(self._schema)  # the record size limit's columns
        defaults = meta.defaults
        self._reject = defaults.get("order") == "reject"
        # Built (and so checked) once per writer, not on every insert().
        self._time = TimeFormat(
            defaults.get("rowtime_unit", "ms"),
            defaults.get("rowtime_timezone", "UTC"),
            defaults.get("rowtime_format"),
            names=("rowtime_unit", "rowtime_timezone", "rowtime_format"),
        )
        promote = defaults.get("rowtime_column")
        self._promote = promote
        self._promote_index = self._names.index(promote) if promote in self._names else None

        self._mutex = threading.Lock()
        # The partition's one appender (validates the partition, takes its lock).
        self._appender = stream.lock_partition(partition, self._where)
        # The stream's retention, applied after appends (at most every few seconds).
        self._retention = RetentionCheck(stream, partition)
        self._closed = False
        tail = self._appender.tail()
        self._end = tail.end
        self._clock = NO_TIME if tail.clock_us is None else tail.clock_us
        self._arrival = NO_TIME if tail.last_arrival_us is None else tail.last_arrival_us
        # The row buffer, by column: plain lists are the cheapest thing to append to, and
        # pyarrow converts each in one call when the buffer is sealed.
        self._arrivals: list[int] = []
        self._rowtimes: list[int | None] = []
        self._bound_at: list[int] = []  # indexes of bound records in the row buffer
        self._columns: list[list[Any]] = [[] for _ in fields]
        self._sink = deque[Any](maxlen=0).extend  # runs a map for its side effects, in C
        self._chunks: list[pa.Table] = []
        self._chunk_stats: list[SegmentStats] = []
        self._chunk_records = 0
        self._chunk_bytes = 0
        # A flush that raised: (its stats, its chunks as sent, how many buffered chunks it
        # holds), retried first by the next flush.
        self._attempt: tuple[SegmentStats, list[pa.Table], int] | None = None
        self._row_room = flush_records  # rows the row buffer may take before a flush
        # When a call last wrote (heartbeats wait for a quiet interval after it).
        self._activity_us = self._clock_now() if heartbeat_us is not None else NO_TIME
        self._bg_error: BaseException | None = None
        self._usable = True  # open and no heartbeat error pending: the hot path's one check
        self._heartbeat_us = heartbeat_us
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if heartbeat_us is not None:
            period_s = min(max(heartbeat_us / 4e6, 0.001), 1.0)
            self._thread = threading.Thread(
                target=self._heartbeat_loop,
                args=(period_s,),
                name=f"rowtime-heartbeat-{partition}",
                daemon=True,
            )
            self._thread.start()

    # -- state --------------------------------------------------------------------------------

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.pending} pending"
        return f"Writer({self._where}, committed={self._end}, {state})"

    def __enter__(self) -> Writer:
        return self

    def __del__(self) -> None:
        # Like an unclosed file: say so (ResourceWarning), the lock goes with the process.
        if not getattr(self, "_closed", True) and getattr(self, "_arrivals", None) is not None:
            if self.pending:
                warnings.warn(
                    f"{self!r} was never closed: its {self.pending} buffered record(s) were "
                    "not written; use `with open_writer(...)` or call close()",
                    ResourceWarning,
                    stacklevel=1,
                )

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()  # rows inserted before the error are kept, as a file keeps them
        except Exception:
            self._release()  # the first error is the one that matters

    @property
    def end_offset(self) -> int:
        """Records committed (durable and visible) in this partition."""
        return self._end

    @property
    def pending(self) -> int:
        """Records buffered, not yet flushed."""
        return len(self._arrivals) + self._chunk_records

    @property
    def clock_us(self) -> int | None:
        """The partition clock including buffered records; None before any record."""
        return None if self._clock == NO_TIME else self._clock

    @property
    def last_arrival_us(self) -> int | None:
        """The arrival time of the partition's last record (buffered or committed)."""
        return None if self._arrival == NO_TIME else self._arrival

    @property
    def closed(self) -> bool:
        return self._closed

    def _clock_now(self) -> int:
        return _time_ns() // 1000 if self._now is None else self._now()

    def _count_chunks(self, records: int) -> None:
        self._chunk_records = records
        self._row_room = max(self._flush_records - records, 1)

    def _check_open(self) -> None:
        if self._closed:
            raise WriterClosedError(f"the writer of {self._where} is closed; open a new one")
        if self._bg_error is not None:
            error, self._bg_error = self._bg_error, None
            self._usable = True
            raise error

    # -- rows ---------------------------------------------------------------------------------

    def insert(self, row: Mapping[str, Any], rowtime: Any = None) -> None:
        """Buffer one data row (a mapping of payload column to value; missing columns are null).

        ``rowtime``: None for the arrival time (implicit), or a datetime, an epoch number in the
        stream's ``rowtime_unit`` (default ms), or a string (ISO-8601, SDP form, or the stream's
        ``rowtime_format``). Raises and buffers nothing on unknown keys, wrong types, a bad
        rowtime, or (``order=reject``) a rowtime below the partition clock.
        """
        with self._mutex:
            if not self._usable:
                self._check_open()
            try:
                values = tuple(map(row.get, self._names))
                known = self._name_set.issuperset(row)
            except (AttributeError, TypeError):
                raise SchemaError(
                    f"a row must be a mapping of column name to value (a dict), got "
                    f"{type(row).__name__}; the columns of {self._where} are "
                    f"{', '.join(self._names)}"
                ) from None
            types = tuple(map(type, values))
            if not known or types not in self._good_types:
                self._check_row(row, values, types)
            for i, lo, hi in self._ranges:
                v = values[i]
                if v is not None and not lo <= v <= hi:
                    self._bad_value(self._names[i], v, f"out of range [{lo}, {hi}]")
            if self._wide:
                size = 0
                for i in self._wide:
                    v = values[i]
                    if v is not None:
                        size += len(v)
                if size > ROW_ROOM_CHARS:
                    check_row(values, self._wide, self._names, self._where)
            if rowtime is None and self._promote_index is not None:
                rowtime = values[self._promote_index]
                if rowtime is None:
                    raise InvalidRowtimeError(
                        f"the row has no value in column {self._promote!r}, the rowtime column "
                        f"of {self._where}; give one, or pass rowtime= explicitly. Nothing was "
                        "written"
                    )
            now = self._now
            arrival = _time_ns() // 1000 if now is None else now()
            if arrival < self._arrival:
                arrival = self._arrival
            if rowtime is None:
                # An implicit rowtime is the time of insert, stored as the row's rowtime: its
                # arrival is stamped when the buffer commits (SPEC 12).
                rowtime_us = effective = arrival
            else:
                rowtime_us = self._rowtime_us(rowtime)
                effective = rowtime_us
            clock = self._clock
            # After the end of stream nothing follows, not even a row at the end of time.
            if (effective < clock and self._reject) or clock == END_OF_STREAM_US:
                self._late(effective, clock, rowtime is None)
            # Checked: from here on nothing raises before the row is buffered.
            self._arrival = arrival
            if effective > clock:
                self._clock = effective
            arrivals = self._arrivals
            arrivals.append(arrival)
            self._rowtimes.append(rowtime_us)
            self._sink(map(list.append, self._columns, values))
            if len(arrivals) >= self._row_room:
                self._flush_locked()

    def _rowtime_us(self, value: Any) -> int:
        return self._time.read(value)

    def _check_row(
        self, row: Mapping[str, Any], values: tuple[Any, ...], types: tuple[type, ...]
    ) -> None:
        """The slow path of ``insert``: raise naming the first bad column, or return.

        A row whose value types all pass without asking pyarrow teaches the fast path."""
        unknown = [k for k in row if k not in self._name_set]
        if unknown:
            raise SchemaError(
                f"row has unknown column{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(map(repr, unknown))}; the columns of {self._where} are "
                f"{', '.join(self._names)}. Nothing was written"
            )
        for field, value, fast in zip(self._schema, values, self._accept, strict=True):
            if type(value) in fast:
                continue
            if value is None:
                raise SchemaError(
                    f"column {field.name!r} of {self._where} is NOT NULL but the row has no "
                    "value for it. Nothing was written"
                )
            dtype = field.type
            if isinstance(value, (bool, np.bool_)) and not pa.types.is_boolean(dtype):
                self._bad_value(field.name, value, "a bool is not a number")
            if pa.types.is_integer(dtype) and isinstance(value, (float, np.floating, Decimal)):
                self._bad_value(field.name, value, "not a whole number type")
            if pa.types.is_date32(dtype) and isinstance(value, dt.datetime):
                self._bad_value(field.name, value, "a datetime is not a date (use .date())")
            try:
                pa.scalar(value, type=dtype)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
                self._bad_value(field.name, value, str(e))
        if len(self._good_types) < 1024 and all(
            t in fast for t, fast in zip(types, self._accept, strict=True)
        ):
            self._good_types.add(types)

    def _bad_value(self, name: str, value: Any, why: str) -> None:
        dtype = type_to_ddl(self._schema.field(name).type, name)
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        raise SchemaError(
            f"column {name!r} of {self._where} is {dtype} and cannot hold {shown} "
            f"({type(value).__name__}): {why}. Nothing was written"
        )

    def _late(
        self, rowtime_us: int, clock_us: int, implicit: bool, index: int | None = None
    ) -> None:
        what = "the row" if index is None else f"row {index} of the inserted table"
        kind = "arrival time (implicit rowtime)" if implicit else "rowtime"
        if clock_us == END_OF_STREAM_US:
            raise LateRowError(
                f"{what} comes after the end of stream of {self._where} (end_stream() was "
                f"called); its {kind} is {_iso(rowtime_us)}. Nothing was written"
            )
        raise LateRowError(
            f"{what} has {kind} {_iso(rowtime_us)} ({rowtime_us} us), below the clock "
            f"{_iso(clock_us)} ({clock_us} us) of {self._where}: under the stream's order=reject "
            "rows may not go back in time. Send rows in rowtime order, or create the stream with "
            "order=drop or order=adjust. Nothing was written"
        )

    def insert_arrow(
        self, data: pa.Table | pa.RecordBatch, rowtime_column: str | None = None
    ) -> None:
        """Buffer every row of an Arrow table or record batch, as one unit.

        Columns are matched by name (order does not matter; missing nullable columns are null)
        and cast to the stream's types when that loses nothing. ``rowtime_column`` names a
        column (payload or extra) whose values are the explicit rowtimes, read like
        ``rowtime=`` in ``insert``; without it the stream's ``rowtime_column`` default is
        used if the table has that column, else every row gets the arrival time. Raises and
        buffers nothing if any row is bad.
        """
        with self._mutex:
            self._check_open()
            if isinstance(data, pa.RecordBatch):
                table = pa.Table.from_batches([data])
            elif isinstance(data, pa.Table):
                table = data
            else:
                raise SchemaError(
                    f"insert_arrow takes a pyarrow Table or RecordBatch, got {type(data).__name__}"
                )
            names = table.column_names
            if len(set(names)) != len(names):
                dupes = sorted({n for n in names if names.count(n) > 1})
                raise SchemaError(f"the inserted table has duplicate columns {dupes}")
            if rowtime_column is not None and rowtime_column not in names:
                raise SchemaError(
                    f"rowtime_column={rowtime_column!r} is not a column of the inserted table "
                    f"({', '.join(names)})"
                )
            rt_col = rowtime_column
            if rt_col is None and self._promote in names:
                rt_col = self._promote
            unknown = [n for n in names if n not in self._name_set and n != rt_col]
            if unknown:
                raise SchemaError(
                    f"the inserted table has column{'s' if len(unknown) > 1 else ''} "
                    f"{', '.join(map(repr, unknown))} that {self._where} does not have; its "
                    f"columns are {', '.join(self._names)}. Nothing was written"
                )
            n = table.num_rows
            columns: list[pa.ChunkedArray] = []
            for field in self._schema:
                if field.name in names:
                    col = table.column(field.name)
                    if col.type != field.type:
                        try:
                            col = col.cast(field.type, safe=True)
                        except (pa.ArrowException, TypeError, ValueError) as e:
                            raise SchemaError(
                                f"column {field.name!r} of the inserted table is {col.type}, and "
                                f"{self._where} has {type_to_ddl(field.type, field.name)} "
                                f"({field.type}); the cast fails: {e}. Nothing was written"
                            ) from None
                    if not field.nullable and col.null_count:
                        first = int(np.flatnonzero(as_numpy(col.is_null()))[0])
                        raise SchemaError(
                            f"column {field.name!r} of {self._where} is NOT NULL, but row {first} "
                            "of the inserted table has null there. Nothing was written"
                        )
                elif field.nullable:
                    col = pa.chunked_array([pa.nulls(n, field.type)])
                else:
                    raise SchemaError(
                        f"the inserted table has no column {field.name!r}, which is NOT NULL in "
                        f"{self._where}. Nothing was written"
                    )
                columns.append(col)
            if n == 0:
                return
            check_table(columns, self._wide, self._names, self._where)
            arrival = max(self._clock_now(), self._arrival)
            clock = self._clock
            check_late = self._reject or clock == END_OF_STREAM_US
            if rt_col is not None:
                rt = self._time.read_array(
                    table.column(rt_col), what=f"rowtime column {rt_col!r} of the inserted table"
                )
                top = int(rt.max())
                if check_late:
                    # The clock before each row: the partition clock, then the running maximum.
                    before = clock_before(rt, clock)
                    late = (rt < before) | (before == END_OF_STREAM_US)
                    if late.any():
                        i = int(np.flatnonzero(late)[0])
                        self._late(int(rt[i]), int(before[i]), False, index=i)
                rowtime_arr = pa.chunked_array([to_arrow(rt, pa.int64())])
                low, last = int(rt.min()), int(rt[-1])
            else:
                top = arrival
                if check_late and (arrival < clock or clock == END_OF_STREAM_US):
                    self._late(arrival, clock, True, index=0)
                rowtime_arr = constant_int64(n, arrival)  # the time of insert, kept as given
                low = last = arrival
            stats = data_run_stats(
                0,
                n,
                min_rowtime_us=low,
                max_rowtime_us=top,
                last_rowtime_us=last,
                arrival_us=arrival,
                clock_before_us=clock,
            )
            system = [
                constant_int64(n, arrival),
                rowtime_arr,
                pa.chunked_array([to_arrow(np.zeros(n, dtype=np.bool_))]),
            ]
            chunk = pa.Table.from_arrays([*system, *columns], schema=self._file_schema)
            # Everything checked: from here on nothing raises.
            self._seal_rows()
            self._chunks.append(chunk)
            self._chunk_stats.append(stats)
            self._count_chunks(self._chunk_records + n)
            self._chunk_bytes += chunk.nbytes
            self._arrival = arrival
            if top > clock:
                self._clock = top
            self._activity_us = arrival
            if self.pending >= self._flush_records or self._chunk_bytes >= self._flush_bytes:
                self._flush_locked()

    # -- bounds -------------------------------------------------------------------------------

    def set_rowtime_bound(self, t: Any, strict: bool = False) -> None:
        """Buffer a bound: every later row of this partition has rowtime ``>= t`` (``> t`` if
        ``strict``). ``t`` is read like an explicit rowtime. A bound below the partition clock
        raises ``BoundError`` and buffers nothing; one equal to it is written."""
        with self._mutex:
            self._check_open()
            bound_us = normalize_bound(self._rowtime_us(t), strict)
            self._append_bound(bound_us, self._clock_now())

    def _append_bound(self, bound_us: int, now_us: int) -> None:
        clock = self._clock
        if bound_us < clock:
            raise BoundError(
                f"rowtime bound {_iso(bound_us)} ({bound_us} us) is below the clock "
                f"{_iso(clock)} ({clock} us) of {self._where}: bounds never move backwards. "
                f"Send a bound >= {_iso(clock)}. Nothing was written"
            )
        arrival = max(now_us, self._arrival)
        self._bound_at.append(len(self._arrivals))
        self._arrivals.append(arrival)
        self._rowtimes.append(bound_us)
        for column in self._columns:
            column.append(None)
        self._arrival = arrival
        self._clock = bound_us
        self._activity_us = arrival
        if self.pending >= self._flush_records:
            self._flush_locked()

    def end_stream(self) -> int:
        """Write the end-of-stream bound (it releases every held row) and flush; returns
        ``end_offset``. No row can follow."""
        with self._mutex:
            self._check_open()
            self._append_bound(END_OF_STREAM_US, self._clock_now())
            return self._flush_locked()

    # -- durability ---------------------------------------------------------------------------

    def flush(self, *, producers: str | None = None) -> int:
        """Commit the buffer as one segment (durable, visible to readers as a whole, with
        ``producers`` in its footer) and return ``end_offset``. A no-op with an empty buffer.

        When it returns, every record buffered before the call is committed, once. When it
        raises, the append may or may not have been committed (the store may have applied it
        and lost its reply: a timeout, a reset connection); the records stay in the buffer
        (do not insert them again) and **calling** ``flush()`` **again is safe**: it completes
        that same append, or finds it already committed, never both, then commits whatever was
        inserted since. So an adapter retries ``flush()`` (with a backoff) until it returns, or
        gives up and, before writing the same rows elsewhere, opens a new writer to see what
        was committed (``end_offset``). A ``WriterLockedError`` (another writer
        took the partition over) is final for this writer. The records of a retried append
        keep the arrival time of its first attempt."""
        with self._mutex:
            self._check_open()
            return self._flush_locked(producers)

    def append_segment_files(self, paths: Sequence[str], *, verify: bool = True) -> int:
        """Commit segment files written elsewhere as this partition's next segments, in order,
        without copying a record; returns ``end_offset``.

        Each file must be complete and fsync'd, on the stream's filesystem, in the segment
        format of this stream (``write_segment_file``), and continue the
        partition exactly: its footer's first offset is the partition's end, its footer
        statistics are those of its records with the partition clock carried over them, its
        arrival times never go below the partition's last, and its records obey the rules
        ``insert_arrow`` and ``set_rowtime_bound`` enforce (no bound below the clock;
        under ``order=reject`` no row below it; nothing after the end of stream).

        ``verify=False`` checks the footers only (first offset, counts, clock, first arrival)
        and trusts them for the rest, so that no record is read: for callers that built the
        files from records they checked themselves (the sink's executors do).

        A file gets a second name (a hard link) in the partition; the caller may remove its own
        name afterwards. Files are checked before any is committed: if a check fails nothing
        is. Nothing may be buffered: ``UnflushedRecordsError`` says to flush first.
        """
        with self._mutex:
            self._check_open()
            if self.pending:
                raise UnflushedRecordsError(
                    f"{self._where}: {self.pending} buffered record(s) must be flushed before "
                    "segment files are appended: call flush() first"
                )
            self._appender.append_segment_files(paths, reject=self._reject, verify=verify)
            self._retention.after_append()
            tail = self._appender.tail()
            if tail.end != self._end:
                assert tail.clock_us is not None and tail.last_arrival_us is not None
                self._end, self._clock, self._arrival = (
                    tail.end,
                    tail.clock_us,
                    tail.last_arrival_us,
                )
                self._activity_us = max(self._activity_us, self._arrival)
            return self._end

    def _seal_rows(self) -> None:
        """Turn the row buffer into an Arrow chunk (so an Arrow chunk can follow it)."""
        n = len(self._arrivals)
        if not n:
            return
        # Arrivals and rowtimes are checked ints (None: an implicit rowtime). Built through numpy,
        # and a column of nulls (a bound's payload) as nulls: pyarrow's own conversion imports
        # pandas the first time, and the sink's commit, which writes its bounds through here,
        # runs in a fresh Python process of Spark's (bounds/arrays.py).
        arrival_np = np.array(self._arrivals, dtype=np.int64)
        rts = self._rowtimes
        if None not in rts:  # every rowtime given (as fast as pyarrow's conversion)
            rowtime_np, has_rowtime = np.array(rts, dtype=np.int64), np.ones(n, dtype=np.bool_)
        elif rts.count(None) == n:  # every rowtime implicit
            rowtime_np, has_rowtime = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.bool_)
        else:
            has_rowtime = np.array([t is not None for t in rts], dtype=np.bool_)
            rowtime_np = np.array([0 if t is None else t for t in rts], dtype=np.int64)
        is_bound_np = np.zeros(n, dtype=np.bool_)
        is_bound_np[self._bound_at] = True
        rowtime = to_arrow(rowtime_np, mask=~has_rowtime)
        arrays = [to_arrow(arrival_np), rowtime, to_arrow(is_bound_np)]
        for values, field in zip(self._columns, self._schema, strict=True):
            if all(v is None for v in values):
                arrays.append(pa.nulls(n, field.type))
                continue
            try:
                arrays.append(pa.array(values, type=field.type))
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                self._drop_unconvertible(field, values)
        chunk = pa.Table.from_arrays(arrays, schema=self._file_schema)
        stats = SegmentStats.compute(0, arrival_np, rowtime_np, has_rowtime, is_bound_np, None)
        self._chunks.append(chunk)
        self._chunk_stats.append(stats)
        self._count_chunks(self._chunk_records + n)
        self._chunk_bytes += chunk.nbytes
        self._clear_rows()

    def _clear_rows(self) -> None:
        self._arrivals = []
        self._rowtimes = []
        self._bound_at = []
        self._columns = [[] for _ in self._columns]

    def _drop_unconvertible(self, field: pa.Field, values: list[Any]) -> None:
        """A value passed insert()'s checks but pyarrow refuses it (an int64 past 2**63, a
        string with lone surrogates, ...). Remove that row from the buffer, so the rest can
        still be flushed, and say so."""
        for i, value in enumerate(values):
            try:
                pa.scalar(value, type=field.type)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
                del self._arrivals[i]
                del self._rowtimes[i]
                for column in self._columns:
                    del column[i]
                self._bound_at = [b if b < i else b - 1 for b in self._bound_at if b != i]
                raise SchemaError(
                    f"column {field.name!r} of {self._where} cannot store {value!r}: {e}. That "
                    "row was removed from the buffer; the other buffered rows are not written "
                    "yet: call flush() again to write them"
                ) from None
        raise SchemaError(f"column {field.name!r} of {self._where}: values cannot be converted")

    def _flush_locked(self, producers: str | None = None) -> int:
        self._seal_rows()
        if self._attempt is not None:
            # A flush that raised: retry exactly that append (same records, same arrival, same
            # offsets), which the backend completes or recognises as committed (its id), then
            # go on with what was inserted since.
            stats, chunks, count = self._attempt
            self._append(stats, chunks)
            self._attempt = None
            self._committed(stats, count)
        if not self._chunks:
            return self._end
        # Every record of a commit arrives when it commits (SPEC 12: arrival is the commit's
        # time, not the insert's), so that a reader never sees a record appear with an arrival
        # older than records it already read from other partitions, beyond the commit's own
        # duration: idleness (idle.timeout) decides from arrivals alone, and a reader planning
        # later must find the same records before each arrival time as one planning now.
        stamp = max(self._clock_now(), self._arrival)
        chunks = [_with_arrival(chunk, stamp) for chunk in self._chunks]
        stats = SegmentStats.merge(self._chunk_stats)
        rows = stats.rows > 0
        stats = SegmentStats(
            **{
                **stats.__dict__,
                "first": self._end,
                "clock_us": self._clock,  # exact clock
                "last_arrival_us": stamp,
                "last_row_arrival_us": stamp if rows else None,
                "max_skew_us": (
                    stamp - stats.min_rowtime_us
                    if rows and stats.min_rowtime_us is not None
                    else None
                ),
                "producers": producers,
            }
        )
        try:
            self._append(stats, chunks)
        except BaseException:
            # Kept as sent: a retry must be the same append (the backend knows it by its
            # first offset and id), and later inserts must not arrive before it.
            self._attempt = (stats, chunks, len(self._chunks))
            self._arrival = max(self._arrival, stamp)
            raise
        self._committed(stats, len(self._chunks))
        return self._end

    def _append(self, stats: SegmentStats, chunks: list[pa.Table]) -> None:
        try:
            self._appender.append_run(stats, chunks)
        except (WriterLockedError, CorruptLogError):
            raise  # final for this writer: its message says what to do
        except RowtimeError as e:
            if not isinstance(e, ConnectionError):
                raise
            # The store did not answer (after its own timeouts and retries): the append may
            # have been applied, its reply lost. Say what the caller may do.
            raise type(e)(
                f"{e}. flush() of {stats.count} record(s) [{stats.first}, {stats.end}) of "
                f"{self._where} did not complete: it may or may not be committed. The records "
                "are kept in the buffer (do not insert them again): call flush() again, which "
                "completes this append or finds it committed, never both"
            ) from None
        except OSError as e:
            # A full disk, a read-only folder: the segment is not committed (its temporary file
            # is gone) and the buffer, this call's records included, is intact for a retry.
            raise OSError(
                e.errno,
                f"writing {self.pending} buffered record(s) to {self._where} failed: "
                f"{e.strerror or e}. Nothing was committed; the records are kept in the buffer "
                "(this call's too: do not insert them again). Free space or fix the folder, "
                "then call flush() again",
            ) from e

    def _committed(self, stats: SegmentStats, count: int) -> None:
        """The first ``count`` buffered chunks are committed as ``stats``."""
        done = self._chunks[:count]
        del self._chunks[:count]
        del self._chunk_stats[:count]
        self._count_chunks(self._chunk_records - sum(c.num_rows for c in done))
        self._chunk_bytes = sum(c.nbytes for c in self._chunks)
        self._end = stats.end
        assert stats.last_arrival_us is not None
        self._arrival = max(self._arrival, stats.last_arrival_us)
        self._retention.after_append()

    def close(self) -> None:
        """Flush, stop the heartbeat and release the partition. Idempotent."""
        if self._closed:
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._mutex:
            if self._closed:
                return
            try:
                error, self._bg_error = self._bg_error, None
                self._flush_locked()
                if error is not None:
                    raise error
            finally:
                self._closed = True
                self._usable = False
                self._appender.release()

    def abort(self) -> None:
        """Discard the buffer (nothing more is written) and release the partition."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._mutex:
            self._clear_rows()
            self._attempt = None
            self._chunks = []
            self._chunk_stats = []
            self._count_chunks(0)
            self._release()

    def _release(self) -> None:
        self._stop.set()
        self._closed = True
        self._usable = False
        self._appender.release()

    # -- heartbeats ---------------------------------------------------------------------------

    def _heartbeat_loop(self, period_s: float) -> None:
        while not self._stop.wait(period_s):
            try:
                self._beat()
            except BaseException as e:  # surfaced at the next call on the writer
                self._bg_error = e
                self._usable = False
                return

    def _beat(self) -> bool:
        """One heartbeat check; True if it wrote a bound. While the writer has been idle for a
        heartbeat interval, append a bound at the arrival time (if it moves the clock) and
        flush (the bound follows any buffered rows in the log)."""
        assert self._heartbeat_us is not None
        with self._mutex:
            if self._closed:
                return False
            now = max(self._clock_now(), self._arrival)
            if now - max(self._activity_us, self._arrival) < self._heartbeat_us:
                return False
            wrote = now > self._clock
            if wrote:
                self._append_bound(now, now)
            self._activity_us = now
            if self.pending:
                self._flush_locked()
            return wrote


def open_writer(
    location: Any,
    partition: int = 0,
    heartbeat: Any = None,
    **options: Any,
) -> Writer:
    """A ``Writer`` on ``partition`` of the stream at ``location`` (a context manager).

    ``heartbeat`` (a duration: seconds, ``"500ms"``, a timedelta) makes a background thread
    write a bound at the arrival time whenever the writer has been idle that long.
    ``options``: ``clock`` (a callable returning microseconds, for tests), ``flush_records``,
    ``flush_bytes``.
    """
    stream = location if isinstance(location, StreamStorage) else open_stream(location)
    return Writer(stream, partition, heartbeat=heartbeat, **options)

"""The log's file format: segment files, their footers, and the checks a partition applies.

A segment is an Arrow IPC *file* (random access, memory-mappable): the system columns of
``columns``, then the payload columns (all nullable in the file: a bound record's payload is
null). Its schema metadata (``rowtime.*`` keys) is its footer, a ``SegmentStats``: first
offset, record count, the partition clock after it, min/max data rowtime, last bound, last
arrival, skew. ``rowtime.format_version`` says which version of this format wrote the file; a
reader refuses a newer one (``FORMAT_VERSION``) with ``CorruptLogError`` naming the
file, instead of misreading it.

Arrow IPC files carry no checksum: a byte flipped on disk inside a value buffer reads as another
value. So each record batch carries, in its own custom metadata, a checksum of its IPC message
(``checksums``), and every read that returns records checks the batches it returns them
from before any of it is used (``open_checked_segment``, ``read_ipc_checked``): a batch
that does not match fails the read with ``CorruptLogError`` naming the file (object,
entry) and its records, as Kafka's consumers check CRCs and PostgreSQL its page checksums. On
the embedded log a batch is checked once per process, when a read first touches it (cached by
file identity), so the cost is one pass over the bytes a process reads, not one per read; stores
that fetch whole objects or values check each fetch. A read of the system columns alone (the
reader's planner, on the driver) checks nothing, since a checksum covers the whole batch: the
tasks that read the same records check them before a row reaches the query.
``verify_segment_file`` (``rowtime describe --verify``) checks every batch of a file.
Batches written before checksums (segments of early versions, Redis entries of 0.1.0 and 0.2.0)
have none and read as before. What the checks cost is on docs/benchmarks.md ("Reads that
verify").

Everything that writes or checks segment files lives here: the writer's flushes
(``write_segment_file``), the sink's staged runs (``segment_record_batches``), and the
checks that decide whether files written elsewhere continue a partition
(``check_segment_files``). Times are ``int`` microseconds since the epoch, UTC.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..bounds.arrays import as_numpy, to_arrow
from ..bounds.bounds import END_OF_STREAM_US, NO_TIME
from ..bounds.errors import BoundError, CorruptLogError, LateRowError
from ..bounds.time import format_rowtime
from ..bounds.versions import newer_format
from .checksums import (
    CHECKSUM_KEY,
    SegmentChecks,
    batch_checksum,
    check_batch,
    checksum_of,
    file_identity,
    read_checked,
)
from .columns import LOG_ARRIVAL_US, LOG_IS_BOUND, LOG_ROWTIME_US, LOG_SYSTEM_COLUMNS
from .meta import fsync_file
from .storage import PartitionTail

__all__ = [
    "CHECKSUM_KEY",
    "FORMAT_VERSION",
    "SYSTEM_FIELDS",
    "SegmentChecks",
    "SegmentStats",
    "check_batch",
    "check_segment_files",
    "clock_before",
    "data_run_stats",
    "open_checked_segment",
    "open_segment_file",
    "open_verified_segment",
    "read_ipc_checked",
    "segment_name",
    "segment_record_batches",
    "segment_schema",
    "verify_segment_file",
    "write_segment_file",
]

#: The segment format this code writes and the newest it reads.
FORMAT_VERSION = 1

SYSTEM_FIELDS = (
    pa.field(LOG_ARRIVAL_US, pa.int64(), nullable=False),
    pa.field(LOG_ROWTIME_US, pa.int64(), nullable=True),
    pa.field(LOG_IS_BOUND, pa.bool_(), nullable=False),
)

SEGMENT_RE = re.compile(r"(\d{20})-(\d{10})\.arrow\Z")

#: Rows per record batch of a staged run (``segment_record_batches``).
WRITE_ROWS = 1 << 16


def segment_name(first: int, count: int) -> str:
    return f"{first:020d}-{count:010d}.arrow"


def segment_schema(payload: pa.Schema) -> pa.Schema:
    """The columns of every segment of a stream with this payload schema."""
    return pa.schema([*SYSTEM_FIELDS, *(f.with_nullable(True) for f in payload)])


# -- footers ---------------------------------------------------------------------------------

#: Footer fields kept as text (every other field is an int).
_TEXT_FIELDS = frozenset({"producers"})


#: The footer fields without a default in ``SegmentStats``.
_REQUIRED_FOOTER = ("first", "count", "rows", "bounds", "clock_us", "last_arrival_us")


@dataclass(frozen=True)
class SegmentStats:
    """What a segment's footer says about it. Times are microseconds since the epoch.

    ``clock_us`` is the partition clock *after* this segment: the highest bound or data rowtime
    (explicit, or arrival for implicit rows) of the partition up to and including it. The
    ``*_rowtime_us`` and ``*skew*`` fields cover data rows only and are None without any.

    ``producers`` (text, not a time: JSON ``{"WRITER": SEQ, ...}``, None for most segments) is
    the last sequence number committed by each writer of ``rowtime serve`` on this partition,
    as of this segment: stored with the records it covers, in the same atomic commit, so that a
    message resent after a lost acknowledgement (or a server restart) is known as a duplicate
    (``pyspark_rowtime.serve``). A merge keeps the last one; every backend stores the footer
    whole, so every backend keeps it.
    """

    first: int
    count: int
    rows: int
    bounds: int
    clock_us: int
    last_arrival_us: int
    min_rowtime_us: int | None = None
    max_rowtime_us: int | None = None
    last_bound_us: int | None = None
    max_skew_us: int | None = None
    last_row_arrival_us: int | None = None
    last_row_rowtime_us: int | None = None
    producers: str | None = None

    @property
    def end(self) -> int:
        return self.first + self.count

    def to_metadata(self) -> dict[bytes, bytes]:
        out = {}
        for key, value in self.__dict__.items():
            if isinstance(value, str):
                out[f"rowtime.{key}".encode()] = value.encode()
            elif value is not None:
                out[f"rowtime.{key}".encode()] = str(int(value)).encode()
        out[b"rowtime.format_version"] = str(FORMAT_VERSION).encode()
        return out

    @classmethod
    def from_metadata(cls, metadata: dict[bytes, bytes] | None, where: str) -> SegmentStats:
        """The footer of the segment ``where`` (named in errors). A footer written by a newer
        version of the format is refused: its fields may not mean what this version reads."""
        meta = metadata or {}
        raw_version = meta.get(b"rowtime.format_version")
        try:
            version = int(raw_version) if raw_version is not None else None
        except ValueError:
            version = -1
        if version is None or version < 1:
            raise CorruptLogError(
                f"segment {where} has no valid rowtime footer: its format_version is "
                f"{raw_version!r}"
            )
        if version > FORMAT_VERSION:
            raise newer_format(f"segment {where}", version, FORMAT_VERSION, CorruptLogError)
        values: dict[str, int | str | None] = {}
        try:
            for name in cls.__dataclass_fields__:
                raw = meta.get(f"rowtime.{name}".encode())
                if name in _TEXT_FIELDS:
                    values[name] = raw.decode() if raw is not None else None
                else:
                    values[name] = int(raw) if raw is not None else None
        except (TypeError, ValueError) as e:  # UnicodeDecodeError is a ValueError
            raise CorruptLogError(f"segment {where} has no valid rowtime footer: {e}") from e
        # Every version of the format writes these: one missing is a damaged footer.
        missing = [n for n in _REQUIRED_FOOTER if values[n] is None]
        if missing:
            raise CorruptLogError(
                f"segment {where} has no valid rowtime footer: it lacks {', '.join(missing)}"
            )
        return cls(**values)  # type: ignore[arg-type]

    @classmethod
    def compute(
        cls,
        first: int,
        arrival: np.ndarray,
        rowtime: np.ndarray,
        has_rowtime: np.ndarray,
        is_bound: np.ndarray,
        prev_clock_us: int | None,
    ) -> SegmentStats:
        """Statistics of records ``[first, first + len(arrival))`` from their system columns."""
        n = len(arrival)
        if n == 0:
            raise ValueError("a segment holds at least one record")
        effective = np.where(has_rowtime, rowtime, arrival)
        data = ~is_bound
        rows = int(data.sum())
        clock = int(effective.max())
        if prev_clock_us is not None and prev_clock_us > clock:
            clock = prev_clock_us
        kw: dict[str, Any] = {}
        if rows:
            eff_rows = effective[data]
            arr_rows = arrival[data]
            kw.update(
                min_rowtime_us=int(eff_rows.min()),
                max_rowtime_us=int(eff_rows.max()),
                max_skew_us=int((arr_rows - eff_rows).max()),
                last_row_arrival_us=int(arr_rows[-1]),
                last_row_rowtime_us=int(eff_rows[-1]),
            )
        if rows < n:
            kw["last_bound_us"] = int(effective[is_bound][-1])
        return cls(
            first=first,
            count=n,
            rows=rows,
            bounds=n - rows,
            clock_us=clock,
            last_arrival_us=int(arrival[-1]),
            **kw,
        )

    @staticmethod
    def merge(parts: Sequence[SegmentStats]) -> SegmentStats:
        """The statistics of consecutive segments taken as one."""
        last = parts[-1]

        def pick(values: Iterable[int | None], fn: Any) -> int | None:
            present = [v for v in values if v is not None]
            return fn(present) if present else None

        with_rows = [p for p in parts if p.rows]
        with_bounds = [p for p in parts if p.bounds]
        return SegmentStats(
            first=parts[0].first,
            count=sum(p.count for p in parts),
            rows=sum(p.rows for p in parts),
            bounds=sum(p.bounds for p in parts),
            clock_us=last.clock_us,
            last_arrival_us=last.last_arrival_us,
            min_rowtime_us=pick((p.min_rowtime_us for p in parts), min),
            max_rowtime_us=pick((p.max_rowtime_us for p in parts), max),
            last_bound_us=with_bounds[-1].last_bound_us if with_bounds else None,
            max_skew_us=pick((p.max_skew_us for p in parts), max),
            last_row_arrival_us=with_rows[-1].last_row_arrival_us if with_rows else None,
            last_row_rowtime_us=with_rows[-1].last_row_rowtime_us if with_rows else None,
            producers=next((p.producers for p in reversed(parts) if p.producers), None),
        )


def data_run_stats(
    first: int,
    count: int,
    *,
    min_rowtime_us: int,
    max_rowtime_us: int,
    last_rowtime_us: int,
    arrival_us: int,
    clock_before_us: int,
) -> SegmentStats:
    """The footer of ``count`` data rows (no bound) that all arrived at ``arrival_us``, from
    offset ``first``, on a partition whose clock was ``clock_before_us`` (``NO_TIME`` when
    it had none). ``last_rowtime_us`` is the rowtime of the last row."""
    return SegmentStats(
        first=first,
        count=count,
        rows=count,
        bounds=0,
        clock_us=max(max_rowtime_us, clock_before_us),
        last_arrival_us=arrival_us,
        min_rowtime_us=min_rowtime_us,
        max_rowtime_us=max_rowtime_us,
        max_skew_us=arrival_us - min_rowtime_us,
        last_row_arrival_us=arrival_us,
        last_row_rowtime_us=last_rowtime_us,
    )


def clock_before(times: np.ndarray, clock_us: int) -> np.ndarray:
    """The partition clock just before each record: ``clock_us`` (``NO_TIME`` for none)
    before the first, then the running maximum of ``clock_us`` and the records' effective
    rowtimes ``times`` (int64 microseconds)."""
    before = np.empty_like(times)
    if len(times):
        before[0] = clock_us
        np.maximum(np.maximum.accumulate(times)[:-1], clock_us, out=before[1:])
    return before


# -- files -----------------------------------------------------------------------------------


def open_segment_file(path: str) -> pa.Table:
    """A segment as a table whose buffers point into a read-only memory map (no copy)."""
    with pa.memory_map(path, "r") as source:
        return pa.ipc.open_file(source).read_all()


def write_segment_file(
    path: str,
    stats: SegmentStats,
    schema: pa.Schema,
    chunks: Iterable[pa.Table | pa.RecordBatch],
    *,
    sync: bool = True,
) -> None:
    """Write records in the segment format (``schema``, ``stats`` in the footer) to ``path``
    and fsync it (unless ``sync=False``: then the caller calls ``fsync_file`` before the
    file is linked). The file is not part of any partition until the log links it."""
    with pa.OSFile(path, "wb") as sink:
        write_segment_to(sink, stats, schema, chunks, written=_writeback(sink.fileno()))
    if sync:
        fsync_file(path)


#: How many bytes a segment file is written between requests to the disk to start writing
#: them back (RocksDB's ``bytes_per_sync``): the fsync at the end then waits for the last
#: few, not for the whole file.
WRITEBACK_BYTES = 8 << 20
_SYNC_FILE_RANGE_WRITE = 2  # start writeback of dirty pages in the range, do not wait


@functools.cache
def _sync_file_range() -> Any:
    """Linux's ``sync_file_range`` (not in Python's ``os``), or None where there is none."""
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError, TypeError):  # TypeError: no C library by None (Windows)
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call


def _writeback(fd: int) -> Callable[[int], None] | None:
    """A function to call with the bytes of file ``fd`` written so far: every
    ``WRITEBACK_BYTES`` it asks the disk to start writing them back, without waiting
    (a hint: the fsync is what makes the file durable)."""
    call = _sync_file_range()
    if call is None:
        return None
    started = 0

    def written(upto: int) -> None:
        nonlocal started
        if upto - started >= WRITEBACK_BYTES:
            call(fd, started, upto - started, _SYNC_FILE_RANGE_WRITE)  # errors: only a hint
            started = upto

    return written


def write_segment_to(
    sink: pa.NativeFile,
    stats: SegmentStats,
    schema: pa.Schema,
    chunks: Iterable[pa.Table | pa.RecordBatch],
    written: Callable[[int], None] | None = None,
) -> None:
    """Write records in the segment format to an open ``sink`` (a file, or a buffer that a
    backend uploads: ``objstore``); ``written`` is called with the bytes written so far
    after each record batch."""
    file_schema = schema.with_metadata(stats.to_metadata())
    with pa.ipc.new_file(sink, file_schema) as writer:
        for chunk in chunks:
            for batch in [chunk] if isinstance(chunk, pa.RecordBatch) else chunk.to_batches():
                writer.write_batch(batch, custom_metadata={CHECKSUM_KEY: batch_checksum(batch)})
                if written is not None:
                    written(sink.tell())


# -- verifying what is read -----------------------------------------------------------------


def open_checked_segment(path: str) -> tuple[pa.Table, SegmentChecks]:
    """A segment file as a table whose buffers point into a read-only memory map (no copy), and
    its batches' checksums to check as its records are read (``SegmentChecks``; the first
    offset, from the footer, is read by the caller: 0 until it sets ``first``)."""
    identity = file_identity(path)
    with pa.memory_map(path, "r") as source:
        table, batches, wants = read_checked(pa.ipc.open_file(source))
    return table, SegmentChecks(f"segment file {path}", 0, batches, wants, identity)


def open_verified_segment(path: str) -> pa.Table:
    """A segment file as a memory-mapped table, every record batch checked against its
    checksum first (for files read whole to be written again: a sink's staged runs; a damaged
    one must not get a fresh checksum). Raises ``CorruptLogError`` naming the file and the
    records of a damaged batch."""
    try:
        table, checks = open_checked_segment(path)
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as e:
        raise CorruptLogError(f"segment file {path} cannot be read: {e}") from e
    checks.first = SegmentStats.from_metadata(table.schema.metadata, path).first
    checks.check()
    return table


def read_ipc_checked(
    data: Any, where: str, first: int | None = None, *, stream: bool = False
) -> pa.Table:
    """Arrow IPC bytes (a file, or with ``stream`` an IPC stream) as a table, every record
    batch checked against its checksum first (``check_batch``; ``where`` names them in
    errors, ``first`` is the partition offset of their first record, by default the footer's):
    what a backend that fetches whole objects or values returns. Schema metadata is kept."""
    buffer = pa.py_buffer(data)
    if stream:
        reader = pa.ipc.open_stream(buffer)
        batches, wants = [], []
        while True:
            try:
                batch, metadata = reader.read_next_batch_with_custom_metadata()
            except StopIteration:
                break
            batches.append(batch)
            wants.append(checksum_of(metadata))
        table = pa.Table.from_batches(batches, schema=reader.schema)
    else:
        table, batches, wants = read_checked(pa.ipc.open_file(buffer))
    if first is None:
        first = SegmentStats.from_metadata(table.schema.metadata, where).first
    SegmentChecks(where, first, batches, wants).check()
    return table


def verify_segment_file(path: str) -> tuple[int, int]:
    """Check each record batch of the segment file ``path`` against its checksum; returns how
    many batches were checked and how many had no checksum (written before checksums).

    Raises ``CorruptLogError`` naming the file, the batch and the records it holds
    (partition offsets, from the footer's first offset) when a batch does not match or cannot
    be read. Reads every byte of the file.
    """
    checked = unchecked = 0
    try:
        with pa.memory_map(path, "r") as source:
            reader = pa.ipc.open_file(source)
            stats = SegmentStats.from_metadata(reader.schema.metadata, path)
            offset = stats.first
            for i in range(reader.num_record_batches):
                where = f"record batch {i} (records from offset {offset})"
                try:
                    batch, metadata = reader.get_batch_with_custom_metadata(i)
                except (OSError, pa.ArrowException) as e:
                    raise CorruptLogError(
                        f"segment file {path}: {where} cannot be read ({e}): the file was "
                        f"damaged; the partition cannot be read from offset {offset} on; "
                        "restore the file from a backup (other partitions are unaffected)"
                    ) from e
                if check_batch(batch, checksum_of(metadata), f"segment file {path}", i, offset):
                    checked += 1
                else:
                    unchecked += 1
                offset += batch.num_rows
    except FileNotFoundError:
        raise  # merged away meanwhile: the caller lists again
    except (OSError, pa.ArrowException) as e:
        raise CorruptLogError(f"segment file {path} cannot be read: {e}") from e
    return checked, unchecked


def segment_record_batches(
    batches: Iterable[pa.RecordBatch],
    file_schema: pa.Schema,
    arrival_us: int,
    rowtime_column: str,
) -> Iterator[pa.RecordBatch]:
    """Data rows (payload columns and ``rowtime_column``, a timestamp) as record batches of the
    segment format, every row arriving at ``arrival_us``, of about ``WRITE_ROWS`` rows:
    each gathered from a few small batches into memory the next one reuses, so a run is
    written without a copy of it."""
    payload = list(file_schema)[len(LOG_SYSTEM_COLUMNS) :]
    blocks: list[pa.Array] = []  # [arrival, false], shared by every batch made

    def build(group: list[pa.RecordBatch], n: int) -> pa.RecordBatch:
        if len(group) == 1:
            data = group[0]
            columns = {name: data.column(name) for name in data.schema.names}
        else:
            table = pa.Table.from_batches(group).combine_chunks()
            columns = {name: table.column(name).chunk(0) for name in table.column_names}
        if not blocks or len(blocks[0]) < n:
            size = max(n, WRITE_ROWS)
            blocks[:] = [
                to_arrow(np.full(size, arrival_us, dtype=np.int64)),
                to_arrow(np.zeros(size, dtype=np.bool_)),
            ]
        arrays = [
            blocks[0].slice(0, n),
            columns[rowtime_column].cast(pa.int64()),
            blocks[1].slice(0, n),
        ]
        for f in payload:
            col = columns[f.name]
            arrays.append(col if col.type == f.type else col.cast(f.type))
        return pa.RecordBatch.from_arrays(arrays, schema=file_schema)

    group: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        group.append(batch)
        rows += batch.num_rows
        if rows >= WRITE_ROWS:
            yield build(group, rows)
            group, rows = [], 0
    if group:
        yield build(group, rows)


# -- checking files written elsewhere --------------------------------------------------------


def _segment_file(path: str, file_schema: pa.Schema) -> pa.Table:
    """A segment file's records (memory-mapped), checked to have the stream's segment columns
    and at least one record."""
    try:
        table = open_segment_file(path)
    except (OSError, pa.ArrowInvalid) as e:
        raise CorruptLogError(f"segment file {path} cannot be read: {e}") from e
    if not table.schema.remove_metadata().equals(file_schema.remove_metadata()):
        raise CorruptLogError(
            f"segment file {path} has columns {table.schema.remove_metadata()}, and the "
            f"stream's segments have {file_schema.remove_metadata()}"
        )
    if table.num_rows == 0:
        raise CorruptLogError(f"segment file {path} holds no records")
    return table


def _late_in_file(path: str, where: str, index: int | None, rowtime_us: int, clock_us: int) -> None:
    what = f"record {index} of segment file {path}" if index is not None else f"segment file {path}"
    if clock_us == END_OF_STREAM_US:
        raise LateRowError(
            f"{what} has a row after the end of stream of {where} (end_stream() was called); "
            f"its rowtime is {format_rowtime(rowtime_us)}. Nothing was written"
        )
    raise LateRowError(
        f"{what} has a row with rowtime {format_rowtime(rowtime_us)} ({rowtime_us} us), below the "
        f"clock {format_rowtime(clock_us)} ({clock_us} us) of {where}: under the stream's "
        "order=reject rows may not go back in time. Nothing was written"
    )


def _check_footer(
    table: pa.Table, path: str, where: str, tail: PartitionTail, reject: bool, late: bool
) -> SegmentStats:
    """A segment file's footer, checked to continue the partition at ``tail``; ``late``: also
    refuse late rows from the footer's minimum (when the records are not read, so which
    record it is stays unknown)."""
    clock = NO_TIME if tail.clock_us is None else tail.clock_us
    arrival = NO_TIME if tail.last_arrival_us is None else tail.last_arrival_us
    stats = SegmentStats.from_metadata(table.schema.metadata, path)
    if stats.count != table.num_rows or stats.rows + stats.bounds != stats.count:
        raise CorruptLogError(
            f"segment file {path} holds {table.num_rows} records and its footer says "
            f"{stats.count} ({stats.rows} rows, {stats.bounds} bounds)"
        )
    if (stats.rows and stats.max_rowtime_us is None) or (
        stats.bounds and stats.last_bound_us is None
    ):
        raise CorruptLogError(f"segment file {path} has no rowtime statistics in its footer")
    if stats.first != tail.end:
        raise CorruptLogError(
            f"segment file {path} starts at offset {stats.first}, and {where} continues at "
            f"{tail.end}"
        )
    first_arrival = int(table.column(0)[0].as_py())
    top = max(clock, *(t for t in (stats.max_rowtime_us, stats.last_bound_us) if t is not None))
    if stats.clock_us != top or first_arrival < arrival:
        raise CorruptLogError(
            f"segment file {path} does not continue {where}: its footer clock is "
            f"{stats.clock_us} (the partition's would be {top}) and its first arrival "
            f"{first_arrival} (the partition's last is {arrival})"
        )
    if clock == END_OF_STREAM_US and not stats.rows:
        raise BoundError(
            f"segment file {path} has a bound after the end of stream of {where} (end_stream() "
            "was called): nothing can follow it. Nothing was written"
        )
    if late and stats.rows and stats.min_rowtime_us is not None:
        if clock == END_OF_STREAM_US or (reject and stats.min_rowtime_us < clock):
            # Which record is late is known only from the records (verify=True finds it).
            _late_in_file(path, where, None, stats.min_rowtime_us, clock)
    return stats


#: 0 as an int64 scalar made without ``pa.scalar``, which imports pandas (bounds/arrays.py).
_ZERO = to_arrow([0], pa.int64())[0]


def _verify_records(
    table: pa.Table, stats: SegmentStats, path: str, where: str, clock: int, reject: bool
) -> None:
    """A segment file's records, checked against its footer and the partition's rules."""
    arrivals = as_numpy(table.column(LOG_ARRIVAL_US))
    rowtime = table.column(LOG_ROWTIME_US)
    has_rt = as_numpy(rowtime.is_valid())
    rt = as_numpy(pc.fill_null(rowtime, _ZERO))
    is_bound = as_numpy(table.column(LOG_IS_BOUND))
    if len(arrivals) > 1 and not bool(np.all(arrivals[1:] >= arrivals[:-1])):
        raise CorruptLogError(f"segment file {path} has arrival times that go back")
    prev = None if clock == NO_TIME else clock
    actual = SegmentStats.compute(stats.first, arrivals, rt, has_rt, is_bound, prev)
    # The writers' record is what a writer says, not a property of the records.
    actual = replace(actual, producers=stats.producers)
    if actual != stats:
        raise CorruptLogError(
            f"segment file {path} has a footer that does not describe its records: it "
            f"says {stats}, its records give {actual}"
        )
    effective = np.where(has_rt, rt, arrivals)
    before = clock_before(effective, clock)
    low_bounds = is_bound & (effective < before)
    if low_bounds.any():
        i = int(np.flatnonzero(low_bounds)[0])
        raise BoundError(
            f"segment file {path} has a bound at record {i}, {format_rowtime(int(effective[i]))}, "
            f"below the clock {format_rowtime(int(before[i]))} of {where}: bounds never move "
            "backwards. Nothing was written"
        )
    late = ~is_bound & (effective < before)
    if (reject or clock == END_OF_STREAM_US) and late.any():
        i = int(np.flatnonzero(late)[0])
        _late_in_file(path, where, i, int(effective[i]), int(before[i]))


def check_appended_files(
    appender: Any, paths: Sequence[str], *, reject: bool, verify: bool = True
) -> list[tuple[str, SegmentStats]]:
    """``check_segment_files`` for a partition's appender: its stream's record schema, the
    end it holds (``tail()``), and its name in errors (``where``)."""
    return check_segment_files(
        paths,
        appender.stream.file_schema,
        appender.tail(),
        where=appender.where,
        reject=reject,
        verify=verify,
    )


def check_segment_files(
    paths: Sequence[str],
    file_schema: pa.Schema,
    tail: PartitionTail,
    *,
    where: str,
    reject: bool,
    verify: bool = True,
) -> list[tuple[str, SegmentStats]]:
    """Check that segment files continue, in order, a partition that ends at ``tail``; return
    each file's footer. ``where`` names the partition in errors; ``reject``: the stream's order
    is ``reject`` (no data row below the clock).

    Each file must have the stream's columns and at least one record; its footer's first offset
    is the partition's end, its clock the partition clock carried over its records, its first
    arrival at or after the partition's last; no bound goes below the clock, nothing follows
    the end of stream. ``verify=True`` also reads the records and checks that the footer
    describes them and that arrivals never go back; ``verify=False`` trusts the footers (for
    files built from records the caller checked). Raises ``CorruptLogError``,
    ``BoundError`` or ``LateRowError``, naming the file and the record.
    """
    checked: list[tuple[str, SegmentStats]] = []
    for path in paths:
        table = _segment_file(path, file_schema)
        stats = _check_footer(table, path, where, tail, reject, late=not verify)
        if verify:  # finds a late record itself, by its index
            clock = NO_TIME if tail.clock_us is None else tail.clock_us
            _verify_records(table, stats, path, where, clock, reject)
        checked.append((path, stats))
        tail = PartitionTail(stats.end, stats.clock_us, stats.last_arrival_us)
    return checked


def append_segment_blobs(appender: Any, blobs: Iterable[bytes], prefix: str) -> None:
    """Commit segment files held as bytes (runs a sink's tasks staged in a store) through
    ``appender.append_segment_files`` in one append: written to a private temporary folder
    first, as the appender links or uploads files, then removed."""
    folder = tempfile.mkdtemp(prefix=prefix)
    try:
        paths = []
        for i, blob in enumerate(blobs):
            path = os.path.join(folder, f"{i:06d}.arrow")
            with open(path, "wb") as f:
                f.write(blob)
            paths.append(path)
        appender.append_segment_files(paths, verify=False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class StagedBlobs:
    """``open_staged`` and ``append_staged``
    of a sink store that keeps each staged run as one blob in the segment format (object
    storage, Redis): the store fetches a blob (``_blob``); appending writes the blobs to
    temporary files (named from ``_blob_prefix``) and appends them as segment files, which the
    backend's appender commits in one unit."""

    _blob_prefix = "rowtime-sink-"

    def _blob(self, handle: str) -> bytes:
        raise NotImplementedError

    def open_staged(self, handle: str) -> pa.Table:
        """A staged run's records, every batch checked first: they are written again as a new
        segment, whose fresh checksums would hide a damaged one."""
        return read_ipc_checked(self._blob(handle), f"staged run {handle}")

    def append_staged(self, appender: Any, handles: Sequence[str]) -> None:
        append_segment_blobs(appender, (self._blob(h) for h in handles), self._blob_prefix)

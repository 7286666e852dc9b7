"""A table's history as a log of one partition: what the reader's planner and executors read.

``TableLog`` serves the part of ``StreamStorage`` the reader uses
(``meta``, ``end_offset``, ``tail``, ``read``) over a list of ``Version`` s, the versions
of the table from an ``Anchor`` on that hold records:

* the version's rows: every row of the data files its commit added, in rowtime order (a stable
  sort: ties keep the order of the commit's files, then of the rows in each file), offsets
  ``[base, base + rows)``;
* then, when its commit moved the table's clock, its bound record at offset ``base + rows``,
  the bound the new clock.

Every record's arrival is its version's commit time (``arrival_us``, never below the version
before's). The rows of a version are sorted because a commit's files come from many tasks and
its rows in no order a reader can rely on; a version is the unit a table is committed in, as a
run is a stream's, so nothing later can come between two of its rows. Sorting costs the
version's rowtimes (8 bytes a row, plus the permutation) on the driver, and on an executor the
version's rows: a task reads whole versions (``TableLog.read`` keeps the last one read, so
the reader's chunked reads of one version read its files once).

The driver plans versions in rowtime order from their files' Parquet footers
(``TableLog.ordered_times``: a version's first and last time are its files' extremes),
and reads their rowtimes only where those do not say.

The same offsets always give the same records: a version's records follow from its commit
alone (its files, the clock in it) and the anchor before it (the clock and commit time so far),
and a committed version never changes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..bounds.arrays import to_arrow
from ..bounds.errors import InvalidRowtimeError, OffsetError, OptionError, RowtimeError
from ..bounds.time import TimeFormat
from ..streams.columns import LOG_ARRIVAL_US, LOG_IS_BOUND, LOG_ROWTIME_US, LOG_SYSTEM_COLUMNS
from ..streams.meta import StreamMeta
from ..streams.retention import TrimState
from ..streams.storage import PartitionTail, pick_columns
from .ordered import _FEW_BOUNDS, RangeTimes
from .tasks import stored_times

__all__ = [
    "Anchor",
    "DataFile",
    "TableColumns",
    "TableFiles",
    "TableLog",
    "Version",
    "replace_frontier",
    "with_versions",
]

_SYSTEM_FIELDS = [
    pa.field(LOG_ARRIVAL_US, pa.int64(), nullable=False),
    pa.field(LOG_ROWTIME_US, pa.int64()),
    pa.field(LOG_IS_BOUND, pa.bool_(), nullable=False),
]


@dataclass(frozen=True)
class Anchor:
    """Where the records of ``version`` begin: its first record's offset (``base``), and what
    the versions before it leave (the table's clock, the last commit time), from which the
    records of ``version`` and every later version follow. JSON-able: each Spark offset of a
    table carries the anchor of its first alive record (``TableLog.anchor_at``)."""

    version: int
    base: int = 0
    clock_us: int | None = None
    arrival_us: int | None = None
    #: the highest rowtime read so far (kept only by reads with bounds.lateness or
    #: idle.timeout, whose bounds follow from it)
    high_us: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "version": self.version,
            "base": self.base,
            "clock": self.clock_us,
            "arrival": self.arrival_us,
        }
        if self.high_us is not None:  # absent otherwise: offsets without it read as before
            d["high"] = self.high_us
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Anchor:
        try:
            high = d.get("high")
            return cls(
                int(d["version"]),
                int(d["base"]),
                d.get("clock"),
                d.get("arrival"),
                None if high is None else int(high),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise OffsetError(
                f"a table offset's anchor {str(d)[:200]} is damaged ({type(e).__name__}: {e}); "
                "the checkpoint cannot be resumed"
            ) from e


@dataclass(frozen=True)
class DataFile:
    """A data file a commit added: where (as the table's log names it), its rows, and the
    values of the table's partition columns (as the log writes them, text; None: null)."""

    path: str
    rows: int
    partition: tuple[tuple[str, str | None], ...] = ()


@dataclass(frozen=True)
class Version:
    """The records of one version of a table (see the module docstring)."""

    #: the version and what the versions before it left
    anchor: Anchor
    files: tuple[DataFile, ...]
    #: the bound record after the rows (the clock the commit moved the table to), or None
    bound_us: int | None
    #: the table's clock after this version (the bound, or the one before it)
    clock_us: int | None
    #: the commit time of this version, never below the one before (microseconds)
    arrival_us: int
    #: the highest rowtime read up to this version (None: the anchor's, see Anchor.high_us)
    high_us: int | None = None
    #: an idle bound alone (idle.timeout): no commit of the table, the anchor's version still
    #: to read after it
    idle: bool = False

    @property
    def version(self) -> int:
        return self.anchor.version

    @property
    def base(self) -> int:
        return self.anchor.base

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def end(self) -> int:
        return self.base + self.rows + (self.bound_us is not None)

    def after(self) -> Anchor:
        """The anchor of the next version."""
        high = self.high_us if self.high_us is not None else self.anchor.high_us
        step = 0 if self.idle else 1
        return Anchor(self.version + step, self.end, self.clock_us, self.arrival_us, high)


@dataclass(frozen=True)
class TableColumns:
    """The columns a table's records have: the payload the reader emits (the table's columns,
    without ``rowtime`` when that is the time column, as in a table this sink wrote), the
    column that holds each row's event time and how its values are read."""

    payload: pa.Schema
    time_column: str
    time_format: TimeFormat
    #: the table's columns (the Spark form of their types), as data files are read
    table: pa.Schema


class TableFiles(Protocol):
    """A table's data files as a format reads them (picklable: executors read them)."""

    def read(self, file: DataFile, columns: Sequence[str], schema: pa.Schema) -> pa.Table:
        """The rows of ``file``: ``columns`` of ``schema`` (the table's), in that order and of
        those types; a column the file lacks (added to the table later) as nulls."""
        ...

    # A format's files may also have ``footer(file) -> pq.FileMetaData``, the Parquet footer
    # of ``file`` read alone (its row groups' statistics), from which the driver plans without
    # reading the time column (``TableLog.ordered_times``); without it, it reads the column.


class TableLog:
    """The records of a table's versions from ``versions[0]`` on (or from ``frontier`` when
    there are none): one partition, offsets ``[first, end)``.

    On the driver the list grows at the end as the table gets versions (``extend``) and is
    cut at the front as the query moves on (``forget_before``); an executor's is the
    versions its task reads, shipped with the task."""

    def __init__(
        self,
        location: str,
        columns: TableColumns,
        files: TableFiles,
        frontier: Anchor,
        versions: Sequence[Version] = (),
        table_id: str = "",
        where: str = "",
    ) -> None:
        self.location = location
        self.columns = columns
        self.files = files
        self.versions: list[Version] = list(versions)
        #: the first version not read yet, and the offset its records begin at
        self.frontier = frontier if not versions else versions[-1].after()
        self.where = where or f"table {location}"
        self.meta = StreamMeta(
            location=location, payload_schema=columns.payload, partitions=1, stream_id=table_id
        )
        self._cached: tuple[Anchor, tuple[str, ...], pa.Table] | None = None
        #: version -> the first and last time of its rows in rowtime order, from the footers
        #: of its files (None: not known from them); the driver's, for ``ordered_times``
        self._ranges: dict[Version, tuple[int, int] | None] = {}

    # -- the index ----------------------------------------------------------------------------

    @property
    def first(self) -> int:
        return self.versions[0].base if self.versions else self.frontier.base

    @property
    def end(self) -> int:
        return self.frontier.base

    def add(self, version: Version) -> None:
        """``version``, the frontier's, read: the frontier moves past it (a version without
        records is kept out of the list)."""
        a, f = version.anchor, self.frontier
        # a format may number its versions with gaps (Iceberg's sequence numbers): the next
        # version is the first from the frontier's number on
        if a.version < f.version or (a.base, a.clock_us, a.arrival_us) != (
            f.base,
            f.clock_us,
            f.arrival_us,
        ):
            raise AssertionError(f"version {a} read at frontier {f}")
        if version.end > version.base:
            self.versions.append(version)
        self.frontier = version.after()

    def covers(self, anchor: Anchor) -> bool:
        """Whether the records from ``anchor`` on are the ones this log has (the same version
        begins at the same offset)."""
        if anchor == self.frontier:
            return True
        return any(v.anchor == anchor for v in self.versions)

    def forget_before(self, anchor: Anchor) -> None:
        """Drop the versions before ``anchor``'s (the query no longer needs their records)."""
        self.versions = [v for v in self.versions if v.version >= anchor.version]
        self._ranges = {k: r for k, r in self._ranges.items() if k.version >= anchor.version}

    def anchor_at(self, offset: int) -> Anchor:
        """The anchor of the version that holds record ``offset`` (the frontier's at the end)."""
        for v in self.versions:
            if v.base <= offset < v.end:
                return v.anchor
        if offset == self.frontier.base:
            return self.frontier
        raise OffsetError(
            f"{self.where}: offset {offset} is outside the versions read ({self.first} to "
            f"{self.end}); the checkpoint does not belong to this table"
        )

    def versions_between(self, start: int, end: int) -> list[Version]:
        """The versions holding records ``[start, end)``."""
        return [v for v in self.versions if v.end > start and v.base < end]

    def where_is(self, offset: int) -> str:
        """Record ``offset`` as a user finds it in the table: its version, and its place."""
        for v in self.versions:
            if v.base <= offset < v.end:
                if v.idle:
                    return f"the idle bound record before version {v.version}"
                if offset - v.base >= v.rows:
                    return f"the bound record after version {v.version}"
                return f"row {offset - v.base} of version {v.version} in rowtime order"
        return f"offset {offset}"

    # -- what the reader reads ------------------------------------------------------------------

    @property
    def file_schema(self) -> pa.Schema:
        return pa.schema([*_SYSTEM_FIELDS, *self.columns.payload])

    def end_offset(self, partition: int) -> int:
        self._check(partition)
        return self.end

    def tail(self, partition: int) -> PartitionTail:
        self._check(partition)
        last = self.versions[-1] if self.versions else None
        return PartitionTail(
            self.end,
            self.frontier.clock_us,
            last.arrival_us if last is not None else self.frontier.arrival_us,
        )

    def clock_us(self, partition: int) -> int | None:
        return self.tail(partition).clock_us

    def stream_clock_us(self) -> int | None:
        return self.frontier.clock_us

    def start_offset(self, partition: int) -> int:
        """0: offsets count from the anchor the query started at; a version the query needs
        that the table no longer has fails as the format says (``table_delta``)."""
        self._check(partition)
        return 0

    def trim_state(self, partition: int) -> TrimState:
        self._check(partition)
        return TrimState()

    def partition_stats(self, partition: int) -> list[Any]:
        raise OptionError(f"{self.where} is a table: it keeps no segment statistics")

    def lock_partition(self, partition: int, where: str) -> Any:
        raise OptionError(f"{self.where} is read as a stream; write to it with its own writers")

    def read(
        self, partition: int, start: int, end: int, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """Records ``[start, end)`` (see the module docstring), ``columns`` of
        ``file_schema`` (None: all)."""
        self._check(partition)
        names = pick_columns(self.file_schema, columns, self.where)
        if not start <= end or start < self.first or end > self.end:
            raise OffsetError(
                f"{self.where}: records [{start}, {end}) asked for, and the versions read hold "
                f"[{self.first}, {self.end})"
            )
        payload = tuple(n for n in names if n not in LOG_SYSTEM_COLUMNS)
        parts = []
        for v in self.versions_between(start, end):
            table = self._version_table(v, payload)
            lo, hi = max(start, v.base) - v.base, min(end, v.end) - v.base
            parts.append(table.slice(lo, hi - lo).select(names))
        if not parts:
            return self.file_schema.empty_table().select(names)
        return parts[0] if len(parts) == 1 else pa.concat_tables(parts)

    def ordered_times(
        self, partition: int, start: int, end: int
    ) -> tuple[list[np.ndarray | RangeTimes], np.ndarray, bool] | None:
        """What the planner reads of records ``[start, end)`` when they ascend
        (``_step_times``), known without reading a time where the data
        files' statistics say it: the pieces (a whole version's rows as a
        ``RangeTimes``, its first and last time from the footers of its files,
        the others read only if the planner looks between them; a part of a version, and a
        bound record, as read), the positions of the bound records, True. None when the
        statistics do not say the records ascend (or are not there, or cannot be trusted:
        ``_file_range``): the planner then reads the times.

        Why: reading the time column of every file to plan a micro-batch took the driver as
        long as a quarter of the executor's whole read of the same files (docs/benchmarks.md),
        and an in-order step needs a few binary searches, which mostly fall at the edges of
        the versions. A version's rows are in rowtime order (the module docstring), so its
        first and last time are the smallest and the largest in its files."""
        self._check(partition)
        if not self.first <= start <= end <= self.end:
            return None  # read() says what is wrong
        pieces: list[np.ndarray | RangeTimes] = []
        bounds: list[int] = []
        last, at = None, 0
        for v in self.versions_between(start, end):
            lo, hi = max(start, v.base) - v.base, min(end, v.end) - v.base
            piece: np.ndarray | RangeTimes | None = None
            rows_hi = min(hi, v.rows)
            if lo < rows_hi:
                if lo == 0 and rows_hi == v.rows:
                    known = self._range(v)
                    if known is None:
                        return None
                    load = functools.partial(self._read_times, v.base, v.base + v.rows)
                    piece = RangeTimes(v.rows, *known, load=load)
                else:  # a version cut by an earlier micro-batch: its times as read
                    piece = self._read_times(v.base + lo, v.base + rows_hi)
                first = piece.first if isinstance(piece, RangeTimes) else int(piece[0])
                if last is not None and first < last:
                    return None
                pieces.append(piece)
                last = piece.last if isinstance(piece, RangeTimes) else int(piece[-1])
                at += rows_hi - lo
            if hi > v.rows:  # the bound record
                assert v.bound_us is not None
                if last is not None and v.bound_us < last:
                    return None
                pieces.append(np.array([v.bound_us], dtype=np.int64))
                bounds.append(at)
                last = v.bound_us
                at += 1
        assert at == end - start, (start, end, at)
        if len(bounds) > _FEW_BOUNDS:
            return None
        return pieces, np.array(bounds, dtype=np.int64), True

    def _read_times(self, start: int, end: int) -> np.ndarray:
        return stored_times(self.read(0, start, end, columns=list(LOG_SYSTEM_COLUMNS)))

    def _range(self, v: Version) -> tuple[int, int] | None:
        """The first and last time of version ``v``'s rows in rowtime order (the smallest and
        the largest of its files), from the files' footers; None where a file's do not say."""
        if v in self._ranges:  # the same files (a version read again may lack vacuumed ones)
            return self._ranges[v]
        footer = getattr(self.files, "footer", None)
        known: tuple[int, int] | None = None
        if footer is not None and v.files:
            cols = self.columns
            field = cols.table.field(cols.time_column)
            what = f"column {cols.time_column!r} of {self.where} version {v.version}"
            ranges = []
            for f in v.files:
                got = None
                if cols.time_column not in dict(f.partition):
                    got = _file_range(footer(f), f.rows, field, cols.time_format, what)
                if got is None:
                    break
                ranges.append(got)
            else:
                known = (min(r[0] for r in ranges), max(r[1] for r in ranges))
        self._ranges[v] = known
        return known

    def _check(self, partition: int) -> None:
        if partition != 0:
            raise OptionError(f"{self.where} is read as one partition (0), not {partition!r}")

    def _version_table(self, v: Version, payload: tuple[str, ...]) -> pa.Table:
        """Every record of version ``v``, system columns and ``payload``: its rows in rowtime
        order, then its bound record. The last one made is kept (a task reads a version in
        chunks)."""
        cached = self._cached
        if cached is not None and cached[0] == v.anchor and set(payload) <= set(cached[1]):
            return cached[2]
        cols = self.columns
        wanted = list(dict.fromkeys([cols.time_column, *payload]))
        parts = [self.files.read(f, wanted, cols.table) for f in v.files]
        schema = pa.schema([cols.table.field(n) for n in wanted])
        data = pa.concat_tables(parts) if parts else schema.empty_table()
        t = self._times(v, data, parts)
        if len(t) > 1 and not bool(np.all(t[1:] >= t[:-1])):
            order = np.argsort(t, kind="stable")
            data, t = data.take(to_arrow(order, pa.int64())), t[order]
        n = len(t)
        arrival = np.full(n, v.arrival_us, dtype=np.int64)
        is_bound = np.zeros(n, dtype=bool)
        if v.bound_us is not None:
            t = np.append(t, np.int64(v.bound_us))
            arrival = np.append(arrival, np.int64(v.arrival_us))
            is_bound = np.append(is_bound, True)
        arrays: list[Any] = [to_arrow(arrival), to_arrow(t), to_arrow(is_bound)]
        fields = list(_SYSTEM_FIELDS)
        for name in payload:
            column = data.column(name)
            if v.bound_us is not None:
                column = pa.chunked_array([*column.chunks, pa.nulls(1, column.type)], column.type)
            arrays.append(column)
            fields.append(cols.payload.field(name))
        table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
        self._cached = (v.anchor, payload, table)
        return table

    def _times(self, v: Version, data: pa.Table, parts: list[pa.Table]) -> np.ndarray:
        """The event time of each row of ``data`` (microseconds); an error naming the file and
        row of the first value that is not one."""
        cols = self.columns
        what = f"column {cols.time_column!r} of {self.where} version {v.version}"
        try:
            return np.asarray(cols.time_format.read_array(data.column(cols.time_column), what=what))
        except InvalidRowtimeError:
            pass
        for f, part in zip(v.files, parts, strict=True):
            try:
                cols.time_format.read_array(part.column(cols.time_column), what=what)
            except InvalidRowtimeError as e:
                raise InvalidRowtimeError(
                    f"{self.where} version {v.version}, file {f.path}: {e}; every row needs an "
                    f"event time in column {cols.time_column!r} (option rowtime.column, with "
                    "rowtime.unit/rowtime.format for numbers and text)"
                ) from None
        raise AssertionError("a bad event time in no file")


#: The Parquet logical types whose INT64 statistics are a column's values as Arrow reads them
#: (signed order; a timestamp's unit as the Arrow type's).
_TIMESTAMP_UNITS = {"milliseconds": "ms", "microseconds": "us", "nanoseconds": "ns"}


def _file_range(
    meta: pq.FileMetaData, rows: int, field: pa.Field, time_format: TimeFormat, what: str
) -> tuple[int, int] | None:
    """The smallest and the largest event time (microseconds) of column ``field`` of a data
    file, from the statistics of its row groups in its footer ``meta``; None unless they are
    certainly its values' extremes:

    * the column is a top-level INT64 of the table's type exactly (read without a cast), a
      timestamp with a time zone (a naive one is read in ``rowtime.tz``, not monotone across
      a change of the clocks) or a signed integer (``rowtime.unit``): kinds whose Parquet
      statistics are the values themselves in their own order (the Delta log's
      ``minValues``/``maxValues`` of a timestamp are cut to milliseconds by delta-rs and by
      Delta's own writer, so those are never used);
    * every row group with rows has its minimum, maximum and null count, and no null (a null
      is the reader's error: the column is read then, to raise it where it would);
    * the row groups hold ``rows`` rows, as the table's log says.

    The time of a value is read as the column's (``time_format``), an increasing function, so
    the extremes' times are the extremes of the times; a value it refuses (out of range) makes
    this None, and reading the column then names the row."""
    if meta.num_rows != rows:
        return None
    arrow = meta.schema.to_arrow_schema()
    if arrow.get_field_index(field.name) < 0:
        return None
    kind, stored = field.type, arrow.field(field.name).type
    if pa.types.is_timestamp(kind):
        # another zone's name is the same instants (the read casts them unchanged)
        if kind.tz is None or not pa.types.is_timestamp(stored) or stored.tz is None:
            return None
    elif not (pa.types.is_int64(kind) and stored.equals(kind)):
        return None
    index = next(
        (i for i in range(meta.num_columns) if meta.schema.column(i).path == field.name), None
    )
    if index is None:
        return None
    column = meta.schema.column(index)
    logical = column.logical_type.to_json()
    if column.physical_type != "INT64":
        return None
    if pa.types.is_timestamp(kind):
        if '"Type":"Timestamp"' not in logical:
            return None
        unit = next((u for k, u in _TIMESTAMP_UNITS.items() if f'"{k}"' in logical), None)
        if unit != kind.unit:
            return None
    elif logical != '{"Type":"None"}' and '"isSigned":true' not in logical:
        return None
    lo: int | None = None
    hi: int | None = None
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        if group.num_rows == 0:
            continue
        stats = group.column(index).statistics
        if stats is None or not stats.has_min_max or not stats.has_null_count:
            return None
        if stats.null_count != 0:
            return None
        a, b = int(stats.min_raw), int(stats.max_raw)
        lo = a if lo is None else min(lo, a)
        hi = b if hi is None else max(hi, b)
    if lo is None or hi is None:
        return None
    values = to_arrow(np.array([lo, hi], dtype=np.int64))  # pa.array of a list imports pandas
    if pa.types.is_timestamp(kind):
        values = values.view(kind)
    try:
        times = time_format.read_array(values, what=what)
    except (RowtimeError, pa.ArrowException, OverflowError, ValueError):
        return None
    return int(times[0]), int(times[1])


def with_versions(log: TableLog, versions: Sequence[Version]) -> TableLog:
    """A log of ``versions`` alone, as an executor gets it (nothing to read of the table's
    log itself)."""
    frontier = versions[0].anchor if versions else log.frontier
    return TableLog(
        log.location, log.columns, log.files, frontier, versions, log.meta.stream_id, log.where
    )


def replace_frontier(log: TableLog, anchor: Anchor) -> None:
    """Start ``log`` over at ``anchor`` (a checkpoint's offset the log does not cover)."""
    log.versions = []
    log.frontier = anchor
    log._cached = None

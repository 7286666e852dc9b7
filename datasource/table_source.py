"""Delta Lake tables read as rowtime streams: ``spark.readStream.format("rowtime")
.option("table", "delta").load(PATH)``, and ``spark.read`` of the same; this module without
Spark (options, offsets, micro-batches, tasks), ``table_spark`` the thin Spark face.

The reader's whole machinery (the policies, the quarantine, the caps, the offsets Spark keeps)
works on partitions of records in offset order (``Planner``,
``read_task``). A table's history is made into exactly that, a log of one
partition (``TableLog``), and the machinery runs on it unchanged:

* each **version** (a commit of the table's log) becomes a run of records: the rows its commit
  added, in rowtime order (stable: ties in the order of the commit's files and of the rows in
  them), then, when its commit moved the table's clock, one **bound record** at that clock. A
  commit that only moved the clock is a bound record alone; one that added no rows and did not
  move the clock (a compaction, whose files have ``dataChange=false``, a property change) is
  no record, and a log checkpoint is no commit at all;
* a record's **offset** counts the records before it in that log; what the offsets mean is
  kept in every Spark offset as ``table``, the ``Anchor`` of the first record
  still alive (its version, that version's first offset, the clock and commit time before it),
  so that the driver reads the table's log onwards from there, never its whole history, and a
  replay from a checkpoint maps the same offsets to the same versions and rows; ``stream`` is
  the table's id (a table deleted and made again at the path is another table);
* a record's **arrival** is its version's commit time (never below the one before);
* **files per micro-batch** (``maxFilesPerTrigger``, Delta's option, default 1000): a
  micro-batch admits whole versions until their files reach the cap (at least one version; a
  clock-only version counts as one file); ``maxRowsPerBatch`` then cuts inside a version as it
  cuts a stream;
* an **error** that names a record's offset also names its version
  (``where_is``);
* a table **without a clock** gets bounds from ``bounds.lateness`` (after each version, the
  highest rowtime so far less the lateness: ``TableSource._timed``, the highest rowtime
  carried in the anchor) and ``idle.timeout`` (an idle bound record, a version of no commit,
  at the highest rowtime once the table was quiet that long in commit time:
  ``TableSource._idle``); both follow from the versions alone, so replays agree;
* a version's **data files that are gone** (a VACUUM) follow ``failOnDataLoss``
  (``TableSource._kept``), as versions that the log's clean-up removed do.

``TableSource`` is what the Spark face calls, one method per Spark call; the tests drive
it directly. ``table_delta`` reads the versions from ``_delta_log/<version>.json``.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from ..bounds.durations import parse_duration_us
from ..bounds.errors import (
    HeldRowsOverflowError,
    InvalidRowtimeError,
    LateRowError,
    OffsetError,
    OptionError,
    SchemaError,
)
from ..bounds.plan import StreamPosition
from ..bounds.time import TimeFormat, format_rowtime
from ..bounds.units import ADJUST_UNITS_US
from ..streams.columns import LOG_ROWTIME_US, SPARK_ROWTIME
from ..streams.options import OptionTable
from ..streams.retention import DataLossError
from ..streams.tables import is_iceberg_location, parse_iceberg_location
from .executor import read_task
from .options import ReaderConfig, parse_reader_options
from .planner import Planner, batch_tasks, partition_tasks
from .table_delta import DeltaFiles, DeltaVersions, delta_schema
from .table_iceberg import IcebergFiles, IcebergVersions, iceberg_schema
from .table_log import (
    Anchor,
    TableColumns,
    TableLog,
    Version,
    replace_frontier,
    with_versions,
)
from .tasks import EmitRuns, ReadTask, output_arrow_schema

__all__ = ["TABLE_OPTIONS", "TableRead", "TableSource", "TableTask", "parse_table_options"]

_T = TypeVar("_T")

log = logging.getLogger("pyspark_rowtime")

#: The options of a table read besides the reader's (lower case, as Spark passes them).
TABLE_OPTIONS: dict[str, str] = {
    "table": (
        "delta: read the Delta table at the path as a rowtime stream (iceberg: the Iceberg"
        " table of an iceberg:// path, which needs no option)"
    ),
    "skipchangecommits": (
        "true or false (default): skip versions that delete, update or overwrite rows (else"
        " the query fails naming the version)"
    ),
    "streaming-skip-overwrite-snapshots": (
        "Iceberg: true or false (default): skip overwrite snapshots (Iceberg's own option)"
    ),
    "streaming-skip-delete-snapshots": (
        "Iceberg: true or false (default): skip delete snapshots (Iceberg's own option)"
    ),
    "maxfilespertrigger": "a whole number > 0 of data files per micro-batch (default 1000)",
    "bounds.lateness": (
        "a positive duration (seconds, or a string such as '10 minutes'): after each version, a"
        " bound at the highest rowtime read so far minus it (for a table without a clock)"
    ),
}
_SPELLING = {
    "skipchangecommits": "skipChangeCommits",
    "maxfilespertrigger": "maxFilesPerTrigger",
    "bounds.lateness": "bounds.lateness",
    "streaming-skip-overwrite-snapshots": "streaming-skip-overwrite-snapshots",
    "streaming-skip-delete-snapshots": "streaming-skip-delete-snapshots",
}
_OPTIONS = OptionTable(TABLE_OPTIONS, "format('rowtime') of a table", "the table reader", _SPELLING)

#: Reader options a table read does not take (yet), and why.
_NOT_FOR_TABLES = {
    "stream": "a table is named by its path",
    "catalog": "a table is named by its path",
    "interval.duration": "validity intervals are not read from tables yet",
    "interval.count": "validity intervals are not read from tables yet",
    "interval.slide": "validity intervals are not read from tables yet",
}

#: maxFilesPerTrigger when not given (Delta's own default).
DEFAULT_MAX_FILES = 1000


@dataclass(frozen=True)
class TableRead:
    """A table read's configuration, validated once; picklable."""

    kind: str
    location: str
    #: what the planner and the executors run with: the table's log holds each row's event
    #: time already (``__rowtime_us``), so no column is promoted there
    cfg: ReaderConfig
    columns: TableColumns
    #: the reader's output schema (payload, ``rowtime``, ``is_bound``; or the quarantine's)
    output: pa.Schema
    table_id: str
    #: the version whose schema the read has (later schema changes fail the query)
    schema_version: int
    skip_change_commits: bool = False
    #: Iceberg: the operations of snapshots skipped rather than failing the query
    skip_snapshots: tuple[str, ...] = ()
    max_files: int = DEFAULT_MAX_FILES
    #: Iceberg: the catalog's properties from options ``iceberg.<property>``
    overrides: tuple[tuple[str, str], ...] = ()
    #: bounds.lateness: a bound after each version at the highest rowtime so far minus this
    lateness_us: int | None = None
    #: idle.timeout: a bound at the highest rowtime so far once the table was quiet this long
    #: (in commit time; the newest version's against the driver's clock less the grace)
    idle_timeout_us: int | None = None
    idle_grace_us: int = 1_000_000

    @property
    def tracks_high(self) -> bool:
        """Whether the read keeps the highest rowtime so far (its bounds follow from it)."""
        return self.lateness_us is not None or self.idle_timeout_us is not None

    @property
    def where(self) -> str:
        return f"{'Delta' if self.kind == 'delta' else 'Iceberg'} table {self.location}"

    def versions(self) -> DeltaVersions | IcebergVersions:
        """The driver's reader of the table's versions."""
        if self.kind == "delta":
            return DeltaVersions(
                self.location,
                self.columns.table,
                self.schema_version,
                skip_change_commits=self.skip_change_commits,
            )
        return IcebergVersions(
            self.location,
            dict(self.overrides),
            self.columns.table,
            self.schema_version,
            skip=self.skip_snapshots,
        )

    def files(self) -> DeltaFiles | IcebergFiles:
        """The table's data files, as executors read them."""
        if self.kind == "delta":
            return DeltaFiles(self.location)
        return IcebergFiles(self.location, self.overrides)


def _path(options: Mapping[str, Any]) -> str:
    return str(next((v for k, v in options.items() if str(k).lower() == "path"), ""))


def is_table_read(options: Mapping[str, Any]) -> bool:
    """Whether ``options`` read a table (option ``table``, or an ``iceberg://`` path) rather
    than a rowtime stream."""
    return any(str(k).lower() == "table" for k in options) or is_iceberg_location(
        _path(options).strip()
    )


def parse_table_options(options: Mapping[str, Any]) -> TableRead:
    """A table read's options (the reader's, and ``TABLE_OPTIONS``) as a
    ``TableRead``, the table's schema read once."""
    given = {str(k).lower(): v for k, v in options.items()}
    for key, why in _NOT_FOR_TABLES.items():
        if key in given:
            raise OptionError(f"option {key} does not apply to a table read ({why}); remove it")
    iceberg = is_iceberg_location(_path(given).strip())
    kind = str(given.pop("table", "iceberg" if iceberg else "delta")).strip().lower()
    if kind not in ("delta", "iceberg") or (kind == "iceberg") != iceberg:
        raise OptionError(
            f"option table={kind!r}: the reader reads Delta tables at a path (table=delta) "
            "and Iceberg tables named iceberg://CATALOG/NAMESPACE.TABLE (no option needed); "
            "remove the option to read a rowtime stream"
        )
    overrides = tuple(
        sorted(
            (k[len("iceberg.") :], str(given.pop(k)))
            for k in list(given)
            if k.startswith("iceberg.")
        )
    )
    if overrides and kind != "iceberg":
        raise OptionError(
            f"option iceberg.{overrides[0][0]} configures an Iceberg catalog; this is a Delta "
            "table: remove it"
        )
    skip = _flag(given.pop("skipchangecommits", "false"), "skipchangecommits")
    skip_snapshots = tuple(
        operation
        for operation in ("overwrite", "delete")
        if _flag(given.pop(f"streaming-skip-{operation}-snapshots", "false"),
                 f"streaming-skip-{operation}-snapshots")
        or skip
    )  # fmt: skip
    if kind == "delta" and any(k.startswith("streaming-skip-") for k in options_given(options)):
        raise OptionError(
            "options streaming-skip-overwrite-snapshots and streaming-skip-delete-snapshots are "
            "Iceberg's; this is a Delta table: set option skipChangeCommits=true instead"
        )
    max_files = _positive(given.pop("maxfilespertrigger", DEFAULT_MAX_FILES), "maxfilespertrigger")
    lateness_us = _lateness(given)
    user = parse_reader_options(given)
    location = user.location
    if kind == "delta":
        schema, version, table_id, _ = delta_schema(location)
    else:
        location = str(parse_iceberg_location(location))
        schema, version, table_id = iceberg_schema(location, dict(overrides))
    where = f"{'Delta' if kind == 'delta' else 'Iceberg'} table {location}"
    columns = _columns(user, schema, where)
    # idle.timeout is decided here, over the versions' commit times (``TableSource._idle``):
    # the planner's, across partitions, has no other partition to compare with
    cfg = dataclasses.replace(
        user, rowtime_column=None, time_format=TimeFormat(), idle_timeout_us=None
    )
    return TableRead(
        kind=kind,
        location=location,
        cfg=cfg,
        columns=columns,
        output=output_arrow_schema(columns.payload, user.output),
        table_id=table_id,
        schema_version=version,
        skip_change_commits=skip,
        skip_snapshots=skip_snapshots,
        max_files=max_files,
        overrides=overrides,
        lateness_us=lateness_us,
        idle_timeout_us=user.idle_timeout_us,
        idle_grace_us=user.idle_commit_grace_us,
    )


def _lateness(given: dict[str, Any]) -> int | None:
    """bounds.lateness (microseconds), popped from ``given``, and the policy it needs set there.

    A row is late when it is below the clock. Under ``reject`` and ``drop`` every row moves
    the clock to its rowtime, so a bound below the highest rowtime read adds nothing; rows up
    to the lateness late are taken in rowtime order only by holding them, which is ``adjust``:
    without ``order``, the lateness is ``order=adjust`` with an ``adjust.range`` of the
    lateness (then the clock entering a version is exactly the lateness bound after the one
    before: Flink's bounded out-of-orderness, decided per version)."""
    value = given.pop("bounds.lateness", None)
    if value is None:
        return None
    lateness_us = parse_duration_us(str(value).strip(), what="option bounds.lateness")
    order = str(given.get("order", "adjust")).strip().lower()
    if order != "adjust":
        raise OptionError(
            f"option bounds.lateness holds rows up to the lateness late, and order={order} "
            "makes every row below the highest rowtime read late: leave order out (the "
            "lateness is then order=adjust with adjust.range the lateness), or set "
            "order=adjust"
        )
    given.setdefault("order", "adjust")
    if "adjust.range" not in given:
        unit = str(given.setdefault("adjust.unit", "usec")).strip().lower()
        unit_us = ADJUST_UNITS_US.get(unit)
        if unit_us is not None:  # else the reader's options name the bad unit
            given["adjust.range"] = str(-(-lateness_us // unit_us))
    return lateness_us


def options_given(options: Mapping[str, Any]) -> set[str]:
    return {str(k).lower() for k in options}


def _flag(value: Any, name: str) -> bool:
    v = str(value).strip().lower()
    if v not in ("true", "false"):
        raise _OPTIONS.bad(name, value)
    return v == "true"


def _positive(value: Any, name: str) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        raise _OPTIONS.bad(name, value) from None
    if n < 1 or isinstance(value, bool):
        raise _OPTIONS.bad(name, value)
    return n


def _columns(user: ReaderConfig, schema: pa.Schema, where: str) -> TableColumns:
    """Which of the table's columns holds event time: ``rowtime.column``, else ``rowtime``
    (the column this sink writes); a ``rowtime`` column is the reader's own ``rowtime``, not a
    payload column."""
    names = {n.lower(): n for n in schema.names}
    column = user.rowtime_column
    if column is None:
        if SPARK_ROWTIME not in names:
            raise OptionError(
                f"{where} has no column {SPARK_ROWTIME!r} (a table this sink wrote has one): set "
                "option rowtime.column to the column that holds each row's event time (with "
                f"rowtime.unit for numbers); its columns are {', '.join(schema.names)}"
            )
        column = names[SPARK_ROWTIME]
        time_format = TimeFormat()
    else:
        if column.lower() not in names:
            raise OptionError(
                f"option rowtime.column={column!r} names no column of {where}; its columns are "
                f"{', '.join(schema.names)}"
            )
        column = names[column.lower()]
        time_format = user.time_format
    payload = schema
    if column.lower() == SPARK_ROWTIME:
        payload = pa.schema([f for f in schema if f.name != column])
    return TableColumns(payload, column, time_format, schema)


@dataclass
class TableTask:
    """One task of a table read: the reader's task and the versions it reads (picklable)."""

    task: ReadTask
    versions: tuple[Version, ...]


class TableSource:
    """The driver's side of one table read (streaming or batch); see the module docstring."""

    def __init__(self, read: TableRead) -> None:
        self.read_cfg = read
        self.versions = read.versions()
        self.files = read.files()
        self.log = TableLog(
            read.location,
            read.columns,
            self.files,
            Anchor(0),
            table_id=read.table_id,
            where=read.where,
        )
        self.planner = Planner(read.cfg, stream=self.log)
        #: availableNow: the newest version when the trigger was prepared
        self.target_version: int | None = None
        #: versions skipped because the log's clean-up removed them (failOnDataLoss=false),
        #: and where each skip moved an anchor to (a step planned across it is read so)
        self.skipped_versions = 0
        self._moved: dict[Anchor, Anchor] = {}
        #: data files a version needs that are gone (VACUUM, a clean-up), skipped with
        #: failOnDataLoss=false: how many, and their rows
        self.lost_files = 0
        self.lost_rows = 0
        self._lost: set[int] = set()
        #: the driver's clock (microseconds), which idle.timeout compares the newest commit with
        self.now_us: Callable[[], int] = lambda: time.time_ns() // 1000
        #: while tasks() reads a planned micro-batch: the offset it ends at
        self._replay_end: int | None = None

    # -- offsets ----------------------------------------------------------------------------

    def offset(self, pos: StreamPosition) -> dict[str, Any]:
        d = pos.to_dict()
        d["table"] = self.log.anchor_at(pos.partitions[0].scan).to_dict()
        d["stream"] = self.read_cfg.table_id
        return d

    def _position(self, offset: dict[str, Any]) -> StreamPosition:
        """The position of a Spark offset of this table, the log made to hold its records."""
        was = offset.get("stream") if isinstance(offset, dict) else None
        if was != self.read_cfg.table_id:
            raise OffsetError(
                f"the query's checkpoint holds positions in table {was}, and the "
                f"{self.read_cfg.where} is table {self.read_cfg.table_id}: it was deleted and "
                "created again since, or the checkpoint is another query's. Start the query "
                "with a new checkpointLocation"
            )
        anchor = Anchor.from_dict(offset.get("table"))
        anchor = self._moved.get(anchor, anchor)
        if not self.log.covers(anchor):
            replace_frontier(self.log, anchor)
            self.planner = Planner(self.read_cfg.cfg, stream=self.log)
        return StreamPosition.from_dict(offset)

    def initial_offset(self) -> dict[str, Any]:
        if self.read_cfg.cfg.starting == "latest":
            version = self.versions.latest() + 1
            anchor = Anchor(version, 0, self.versions.clock_before(version))
        else:
            anchor = Anchor(self.versions.start_version())
        replace_frontier(self.log, anchor)
        return self.offset(StreamPosition.start([anchor.base]))

    def prepare_available_now(self) -> None:
        self.target_version = self.versions.latest()

    # -- planning ---------------------------------------------------------------------------

    def _extend(self, until: Callable[[], bool]) -> None:
        """Read versions at the log's frontier until ``until()`` or the table has no more (or
        the availableNow target is read)."""
        target = self.target_version
        while not until():
            version = None
            if target is None or self.log.frontier.version <= target:
                try:
                    version = self.versions.read(self.log.frontier)
                except DataLossError:
                    if self.read_cfg.cfg.fail_on_data_loss:
                        raise
                    self._skip_removed()
                    continue
            if self._idle(version):
                continue  # the version (if any) is read again after the idle bound
            if version is None:
                return
            self.log.add(self._timed(self._kept(version)))

    def _idle(self, version: Version | None) -> bool:
        """idle.timeout: whether the table was quiet long enough before ``version`` (None:
        before now) for a bound at the highest rowtime read so far, which is then added.

        Decided over commit times, so that a replay decides the same: a version committed more
        than the timeout after the one before has the idle bound before it; with no newer
        version, the driver's clock must be past the timeout plus ``idle.commitGrace`` (a
        commit the writer stamps earlier than the driver's clock says, by at most the grace,
        still comes after the idle bound's time)."""
        timeout = self.read_cfg.idle_timeout_us
        f = self.log.frontier
        if timeout is None or f.high_us is None or f.arrival_us is None:
            return False
        if f.clock_us is not None and f.clock_us >= f.high_us:
            return False  # nothing for it to release
        due = f.arrival_us + timeout
        if version is not None:
            quiet = version.arrival_us > due
        elif self._replay_end is not None and self.log.end < self._replay_end:
            # a micro-batch of the checkpoint ends beyond the newest version: only this idle
            # bound can be there, which the driver that planned it decided (its clock then)
            quiet = True
        else:
            quiet = self.now_us() > due + self.read_cfg.idle_grace_us
        if quiet:
            self.log.add(Version(f, (), f.high_us, f.high_us, due, f.high_us, idle=True))
        return quiet

    def _timed(self, version: Version) -> Version:
        """``version`` with the highest rowtime so far, and (bounds.lateness) its bound at that
        less the lateness where that moves the clock. A table with a clock of its own keeps
        the higher of the two. The rowtimes are read on the driver (the version's time
        column, once: a version is read once)."""
        read = self.read_cfg
        if not read.tracks_high:
            return version
        high = version.anchor.high_us
        if version.rows:
            one = with_versions(self.log, [dataclasses.replace(version, bound_us=None)])
            times = one.read(0, version.base, version.base + version.rows, [LOG_ROWTIME_US])
            top = int(times.column(0)[-1].as_py())  # in rowtime order
            high = top if high is None else max(high, top)
        bound, clock = version.bound_us, version.clock_us
        if read.lateness_us is not None and high is not None:
            candidate = high - read.lateness_us
            if clock is None or candidate > clock:
                bound = clock = candidate
        return dataclasses.replace(version, bound_us=bound, clock_us=clock, high_us=high)

    def _kept(self, version: Version) -> Version:
        """``version`` without the data files that are gone (a VACUUM or ``expire_snapshots``
        with file clean-up removed them while the query still needed the version): an error
        naming the version and failOnDataLoss, or with failOnDataLoss=false the version's other
        rows read, the lost ones counted and warned about."""
        if not version.files:
            return version
        gone = self.files.missing(version.files)
        if not gone:
            return version
        read = self.read_cfg
        what = "version" if read.kind == "delta" else "snapshot of sequence number"
        if read.cfg.fail_on_data_loss:
            raise DataLossError(
                f"{read.where}: {what} {version.version} is needed, and {len(gone)} of its "
                f"data files are gone ({gone[0].path}{', ...' if len(gone) > 1 else ''}): a "
                "VACUUM (Delta) or a clean-up of expired snapshots' files (Iceberg) removed "
                "them. Set option failOnDataLoss=false to read the version without them (their "
                "rows are lost, and counted), or start the query with a new checkpointLocation; "
                "keep files longer than a query may stop"
            )
        rows = sum(f.rows for f in gone)
        if version.version in self._lost:
            return dataclasses.replace(
                version, files=tuple(f for f in version.files if f not in gone)
            )
        self._lost.add(version.version)  # a version is read again when the query goes back
        self.lost_files += len(gone)
        self.lost_rows += rows
        log.warning(
            "%s: %s %d is needed, and %d of its data files are gone (%d rows); "
            "failOnDataLoss=false: read without them",
            read.where,
            what,
            version.version,
            len(gone),
            rows,
        )
        return dataclasses.replace(version, files=tuple(f for f in version.files if f not in gone))

    def _skip_removed(self) -> None:
        """``failOnDataLoss=false``: the versions the log's clean-up removed are skipped (their
        rows are lost, as Delta's own source loses them), the frontier moved to the first kept
        version, with the clock as of the version before it; a warning says how many."""
        was = self.log.frontier
        first = self.versions.first_kept(was.version)
        clock = self.versions.clock_before(first)
        if was.clock_us is not None and (clock is None or clock < was.clock_us):
            log.warning(
                "%s: the table's clock as of version %d is %s (an expired app transaction, "
                "delta.setTransactionRetentionDuration, or a writer that moved it back); the "
                "clock never goes back: it stays at %s",
                self.read_cfg.where,
                first - 1,
                "gone" if clock is None else format_rowtime(clock),
                format_rowtime(was.clock_us),
            )
            clock = was.clock_us
        self.log.frontier = self._moved[was] = dataclasses.replace(
            was, version=first, clock_us=clock
        )
        self.skipped_versions += first - was.version
        log.warning(
            "%s: versions %d to %d are needed, and the log's clean-up removed them; "
            "failOnDataLoss=false: skipped to version %d (their rows are not read)",
            self.read_cfg.where,
            was.version,
            first - 1,
            first,
        )

    def _admitted(self, start: int, capped: bool) -> int:
        """The end of what a micro-batch from offset ``start`` may take: the log's end, or
        (``capped``) the end of the version whose files reach ``maxFilesPerTrigger``."""
        most = self.read_cfg.max_files
        # counted as versions are read (each once: counting all after each read made a
        # micro-batch of 1000 clock-only versions take seconds)
        seen, files, cut = 0, 0, None

        def files_from() -> int:
            nonlocal seen, files, cut
            for v in self.log.versions[seen:]:
                if v.end > start and cut is None:
                    files += max(1, len(v.files))
                    if capped and files >= most:
                        cut = v.end
            seen = len(self.log.versions)
            return files

        self._extend(lambda: capped and files_from() >= most)
        files_from()
        return cut if cut is not None else self.log.end

    def latest_offset(
        self, start: dict[str, Any], max_rows: int | None, most: int | None = None
    ) -> dict[str, Any]:
        """The end of the micro-batch from ``start``: ``max_rows`` new records planned at a
        time, up to ``most`` in all (joined steps, as the stream reader plans them); the
        ``start`` itself when there is nothing new."""
        pos = self._position(start)
        end = self._admitted(pos.partitions[0].next, capped=max_rows is not None)
        if most is not None and max_rows is not None:
            new = self._named(lambda: self.planner.plan_joined(pos, [end], max_rows, most))
        else:
            new = self._named(lambda: self.planner.plan(pos, [end], max_rows))
        return start if new is None else self.offset(new)

    def tasks(
        self, start: dict[str, Any], end: dict[str, Any], runs: Sequence[EmitRuns | None] | None
    ) -> list[TableTask]:
        """The tasks of the micro-batch ``start`` -> ``end`` (``runs``: the planner's, or None:
        the tasks replay the policy)."""
        self._position(start)
        last = StreamPosition.from_dict(end).partitions[0].next
        self._replay_end = last
        try:
            self._extend(lambda: self.log.end >= last)
        finally:
            self._replay_end = None
        if self.log.end < last:
            raise OffsetError(
                f"{self.read_cfg.where}: the checkpoint's micro-batch ends at offset {last}, and "
                f"the table's versions hold records up to {self.log.end}: the checkpoint is not "
                "this table's. Start the query with a new checkpointLocation"
            )
        return self._wrap(partition_tasks(start, end, runs, None))

    def runs_for(self, start: dict[str, Any], end: dict[str, Any]) -> list[EmitRuns | None] | None:
        return self.planner.runs_for(start, end)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark finished the micro-batch ending at ``end``: versions before its first alive
        record are not needed again."""
        self.log.forget_before(Anchor.from_dict(end.get("table")))

    def batch_tasks(self) -> list[TableTask]:
        """A batch read: the table's history as one step, from version 0 to the newest."""
        replace_frontier(self.log, Anchor(self.versions.start_version()))
        self.target_version = self.versions.latest()
        self._extend(lambda: False)
        self.planner = Planner(self.read_cfg.cfg, stream=self.log)
        return self._wrap(self._named(lambda: batch_tasks(self.read_cfg.cfg, self.planner)))

    def _wrap(self, tasks: list[ReadTask]) -> list[TableTask]:
        out = []
        for t in tasks:
            scan = int(t.prev["scan"])
            out.append(TableTask(t, tuple(self.log.versions_between(scan, t.end))))
        return out

    def progress(self) -> dict[str, Any]:
        """What the query's progress shows of the table: the versions read so far."""
        out: dict[str, Any] = {"version": self.log.frontier.version - 1, "records": self.log.end}
        if self.skipped_versions:
            out["skipped_versions"] = self.skipped_versions
        if self.lost_files:
            out["lost_files"] = self.lost_files
            out["lost_rows"] = self.lost_rows
        return out

    def _named(self, plan: Callable[[], _T]) -> _T:
        return _named(self.log, plan)


def _named(log: TableLog, call: Callable[[], _T]) -> _T:
    """``call()``, an error naming a record's offset also naming its version."""
    try:
        return call()
    except (LateRowError, HeldRowsOverflowError, InvalidRowtimeError) as e:
        raise _renamed(log, e) from None


def _renamed(log: TableLog, e: Exception) -> Exception:
    m = re.search(r"offset (\d+)", str(e))
    if m is None:
        return e
    return type(e)(f"{e} (offset {m[1]}: {log.where_is(int(m[1]))} of the {log.where})")


def read_table_task(
    read: TableRead, task: TableTask, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """Executor: one task's rows and bound record, as batches of ``schema``."""
    frontier = task.versions[0].anchor if task.versions else Anchor(0, task.task.end)
    log = TableLog(
        read.location,
        read.columns,
        read.files(),
        frontier,
        task.versions,
        read.table_id,
        read.where,
    )
    batches = read_task(read.cfg, task.task, schema, stream=log)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (LateRowError, HeldRowsOverflowError, InvalidRowtimeError) as e:
            raise _renamed(log, e) from None
        except FileNotFoundError as e:
            raise _lost(read, task, e) from None
        yield batch


def _lost(read: TableRead, task: TableTask, e: FileNotFoundError) -> DataLossError:
    """A data file removed after the micro-batch that reads it was planned: the batch's rows
    are fixed in the checkpoint, so it cannot skip them; the error names the version."""
    files = read.files()
    where = next(
        (f"version {v.version}" for v in task.versions if files.missing(v.files)), "a version"
    )
    return DataLossError(
        f"{read.where}: a data file of {where} was removed while the micro-batch reading it "
        f"ran ({e}); a VACUUM or a clean-up of expired snapshots' files removed a file a query "
        "still needed. Restart the query: with option failOnDataLoss=false it then reads the "
        "versions without the files that are gone, counting their rows; keep files longer "
        "than a query may stop"
    )


def check_columns(read: TableRead, names: Sequence[str]) -> None:
    """Refuse a user-given schema that is not the table's."""
    if list(names) != read.output.names:
        raise SchemaError(
            f"the schema given to format rowtime ({', '.join(names)}) is not the "
            f"{read.where}'s ({', '.join(read.output.names)}); give no schema"
        )

"""An Iceberg table's snapshots as the versions of a ``TableLog``.

``iceberg://CATALOG/NAMESPACE.TABLE``, the catalog resolved as the sink resolves it
(``iceberg_catalog``: pyiceberg's own configuration, options
``iceberg.<property>`` on top). A version is a snapshot of the table's main branch, numbered by
its sequence number (a number per commit that only grows; the numbers of one branch may skip
those of another, which is why a version is found as the first snapshot from a number on).
What each snapshot means here, as Iceberg's own Spark streaming source reads them:

* ``append``: the data files the snapshot added (its own manifests' entries with status
  ADDED), their rows;
* ``replace`` (a compaction, a rewrite): nothing;
* ``overwrite`` and ``delete``: rows changed, which a stream of appends cannot take back: the
  query fails naming the snapshot, unless ``skipChangeCommits=true`` (Iceberg's source calls
  its options ``streaming-skip-overwrite-snapshots`` and ``streaming-skip-delete-snapshots``);
* the summary key ``rowtime.clock`` (the sink writes it with every commit, ``add_files([])``
  with only the clock when a batch only moves it): the snapshot's bound record when it moves
  the clock forward;
* a snapshot whose schema is not the one the query read fails naming the column.

Snapshots a query still needs that ``expire_snapshots`` removed follow ``failOnDataLoss``.
The table's metadata holds every kept snapshot, so the driver reads it once per planning (as
Iceberg's own source refreshes the table) and the manifests of the new snapshots only.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..bounds.errors import OptionError, SchemaError
from ..bounds.time import format_rowtime
from ..streams.ddl import normalize_schema
from ..streams.retention import DataLossError
from ..streams.tables import CLOCK_KEY, iceberg_table
from .table_delta import TableChangeError, _first_difference
from .table_log import Anchor, DataFile, Version

__all__ = ["IcebergFiles", "IcebergVersions", "iceberg_schema"]

log = logging.getLogger("pyspark_rowtime")


def _load(location: str, overrides: Mapping[str, str]) -> Any:
    table = iceberg_table(location, overrides)
    if table is None:
        raise OptionError(
            f"there is no Iceberg table {location} in its catalog; give an existing table "
            "(iceberg://CATALOG/NAMESPACE.TABLE)"
        )
    return table


def _arrow(schema: Any, where: str) -> pa.Schema:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    try:
        return normalize_schema(schema_to_pyarrow(schema, include_field_ids=False))
    except SchemaError as e:
        raise SchemaError(f"{where}: {e}") from None


def iceberg_schema(location: str, overrides: Mapping[str, str]) -> tuple[pa.Schema, int, str]:
    """The table's schema now (Spark's form), its current snapshot's sequence number (0
    before any) and the table's uuid."""
    table = _load(location, overrides)
    if int(table.format_version) < 2:
        raise OptionError(
            f"Iceberg table {location} is of format version {table.format_version}, whose "
            "snapshots carry no sequence numbers, by which the reader keeps its place; upgrade "
            "the table (table.transaction().upgrade_table_version(2)) to read it as a stream"
        )
    snapshot = table.current_snapshot()
    version = 0 if snapshot is None else int(snapshot.sequence_number)
    return (
        _arrow(table.schema(), f"Iceberg table {location}"),
        version,
        str(table.metadata.table_uuid),
    )


def _main_line(table: Any) -> list[Any]:
    """The main branch's snapshots, oldest first (the current one and its kept ancestors)."""
    by_id = {s.snapshot_id: s for s in table.metadata.snapshots}
    out = []
    snapshot = table.current_snapshot()
    while snapshot is not None:
        out.append(snapshot)
        snapshot = by_id.get(snapshot.parent_snapshot_id)
    return out[::-1]


@dataclass
class IcebergFiles:
    """An Iceberg table's data files, as executors read them (picklable): through the table's
    own FileIO, loaded from its catalog when the first file is read (once per task: each task
    gets its own)."""

    location: str
    overrides: tuple[tuple[str, str], ...] = ()
    _io: Any = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location, "overrides": self.overrides, "_io": None}

    def _open(self, file: DataFile) -> Any:
        if self._io is None:
            self._io = _load(self.location, dict(self.overrides)).io
        return self._io.new_input(file.path).open()

    def footer(self, file: DataFile) -> pq.FileMetaData:
        with self._open(file) as f:
            return pq.read_metadata(f)

    def read(self, file: DataFile, columns: Sequence[str], schema: pa.Schema) -> pa.Table:
        with self._open(file) as f:
            source = pq.ParquetFile(f)
            have = set(source.schema_arrow.names)
            data = source.read(columns=[c for c in columns if c in have])
        arrays = []
        for name in columns:
            field_ = schema.field(name)
            if name in have:
                arrays.append(data.column(name).cast(field_.type))
            else:  # a column the table got after this file was written
                arrays.append(pa.nulls(data.num_rows, field_.type))
        return pa.Table.from_arrays(arrays, names=list(columns))

    def missing(self, files: Sequence[DataFile]) -> list[DataFile]:
        """Those of ``files`` that are gone (removed with the snapshots that expired)."""
        if self._io is None:
            self._io = _load(self.location, dict(self.overrides)).io
        return [f for f in files if not self._io.new_input(f.path).exists()]


class IcebergVersions:
    """The driver's reader of an Iceberg table's snapshots."""

    def __init__(
        self,
        location: str,
        overrides: Mapping[str, str],
        schema: pa.Schema,
        schema_version: int,
        *,
        skip: Sequence[str] = (),
    ) -> None:
        self.location = location
        self.overrides = dict(overrides)
        self.schema = schema
        self.schema_version = schema_version
        #: the operations of snapshots skipped (overwrite, delete) rather than failing
        self.skip = tuple(skip)
        self.where = f"Iceberg table {location}"
        self._table: Any = None

    def _line(self) -> tuple[Any, list[Any]]:
        self._table = _load(self.location, self.overrides)
        return self._table, _main_line(self._table)

    def start_version(self) -> int:
        """Where a read from the beginning starts: the oldest kept snapshot."""
        _, line = self._line()
        return int(line[0].sequence_number) if line else 1

    def latest(self) -> int:
        _, line = self._line()
        return int(line[-1].sequence_number) if line else 0

    def clock_before(self, version: int) -> int | None:
        """The clock of the newest snapshot before ``version`` that carries one."""
        _, line = self._line()
        for s in reversed(line):
            if s.sequence_number < version and CLOCK_KEY in (s.summary.additional_properties):
                return int(s.summary.additional_properties[CLOCK_KEY])
        return None

    def first_kept(self, version: int) -> int:
        _, line = self._line()
        return int(line[0].sequence_number) if line else version

    def read(self, at: Anchor) -> Version | None:
        """The first snapshot of the main branch from sequence number ``at.version`` on, as
        records from ``at``; None when there is none yet."""
        table, line = self._line()
        # Numbers below the oldest kept snapshot: expired (pyiceberg's expire_snapshots also
        # drops the kept one's parent id, so the gap is all that is left to see). A query
        # reads from the oldest kept snapshot when it starts, so its anchor is never below
        # unless snapshots it needed went away.
        if line and at.version < line[0].sequence_number:
            raise DataLossError(
                f"{self.where}: snapshots from sequence number {at.version} are needed, and the "
                f"oldest kept is {line[0].sequence_number} (expire_snapshots removed the ones "
                "before it). Set option failOnDataLoss=false to skip to it (their rows are not "
                "read), or start the query with a new checkpointLocation"
            )
        for s in line:
            if s.sequence_number >= at.version:
                return self._version(
                    table, s, dataclasses.replace(at, version=int(s.sequence_number))
                )
        return None

    def _version(self, table: Any, s: Any, at: Anchor) -> Version:
        summary = s.summary
        operation = str(getattr(summary.operation, "value", summary.operation))
        props = summary.additional_properties
        files: list[DataFile] = []
        if operation in ("overwrite", "delete"):
            if operation not in self.skip:
                raise TableChangeError(
                    f"{self.where}: snapshot {s.snapshot_id} (sequence number "
                    f"{s.sequence_number}, {operation}) changes rows already in the table, "
                    "which a stream of its appends cannot take back. Set option "
                    f"streaming-skip-{operation}-snapshots=true (Iceberg's) or "
                    "skipChangeCommits=true (both kinds) to skip such snapshots (their rows are "
                    "not read), or start over with a new checkpointLocation"
                )
        elif operation == "append":
            self._check_schema(table, s)
            files = self._added(table, s)
        clock = at.clock_us
        bound = None
        if CLOCK_KEY in props:
            candidate = int(props[CLOCK_KEY])
            if clock is None or candidate > clock:
                bound = clock = candidate
            elif candidate < clock:
                log.warning(
                    "%s: snapshot %d sets the clock %s back to %s; it stays at %s",
                    self.where,
                    s.snapshot_id,
                    format_rowtime(clock),
                    format_rowtime(candidate),
                    format_rowtime(clock),
                )
        arrival = int(s.timestamp_ms) * 1000
        if at.arrival_us is not None:
            arrival = max(arrival, at.arrival_us)
        return Version(at, tuple(files), bound, clock, arrival)

    def _added(self, table: Any, s: Any) -> list[DataFile]:
        from pyiceberg.manifest import ManifestContent, ManifestEntryStatus

        out = []
        for manifest in s.manifests(table.io):
            if manifest.added_snapshot_id != s.snapshot_id:
                continue
            if manifest.content != ManifestContent.DATA:
                continue  # delete files come with overwrite or delete snapshots
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == s.snapshot_id:
                    df = entry.data_file
                    out.append(DataFile(df.file_path, int(df.record_count)))
        return out

    def _check_schema(self, table: Any, s: Any) -> None:
        if s.sequence_number <= self.schema_version or s.schema_id is None:
            return
        schema = next((x for x in table.metadata.schemas if x.schema_id == s.schema_id), None)
        if schema is None:
            return
        new = _arrow(schema, self.where)
        if new.equals(self.schema):
            return
        raise TableChangeError(
            f"{self.where}: snapshot {s.snapshot_id} is written with another schema "
            f"({_first_difference(self.schema, new)}); a stream's columns are fixed when its "
            "query starts. Restart the query (from its checkpoint): it then reads with the new "
            "schema, earlier rows with nulls in added columns"
        )

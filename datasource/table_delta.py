"""A Delta table's versions, read one commit file at a time, as the records of a
``TableLog``.

The driver reads ``_delta_log/<20-digit version>.json`` (one JSON action a line), each version
once, from the anchor of the query's offset on: never the whole history, never a snapshot of
the table per micro-batch (delta-rs' ``DeltaTable(path)`` replays the log from its last
checkpoint: fine once at a query's start, too slow for every batch). A log checkpoint is no
version and is never read. What each action of a commit means here, as Delta's own streaming
source (``DeltaSource``) reads them:

* ``add`` with ``dataChange=true``: a data file whose rows the version adds;
* ``add``/``remove`` with ``dataChange=false``: a compaction (``optimize``) or another rewrite
  that changes no row: nothing;
* ``remove`` with ``dataChange=true``: a delete, an update, a merge or an overwrite: the
  version changes rows already read, which a stream cannot take back, so the query fails
  naming the version, unless ``skipChangeCommits=true`` (Delta's option), which skips the
  version's files (the clock it carries still counts);
* ``txn(appId="rowtime.clock", version=<µs>)``: the clock this sink keeps in the table
  (``sink.delta_target``); the version's bound record when it moves the clock forward. A
  clock that goes back (another writer) keeps the last one, with a warning;
* ``metaData`` whose schema is not the one the query reads (a Python data source fixes its
  schema when the query starts): the query fails naming the column, unless the version is at
  or before the one whose schema the query read (the table got there);
* ``commitInfo``: the commit time (``inCommitTimestamp`` where the table keeps one, else
  ``timestamp``), each record's arrival.

Data files are read with pyarrow, a partition column's value from the ``add`` action (Delta
keeps it there, not in the file), through pyarrow's local filesystem for a folder and through
delta-rs' own object store (``deltalake.fs.DeltaStorageHandler``) for a URL, so a table reads
wherever delta-rs reads it, with the same environment variables.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..bounds.errors import OptionError, SchemaError
from ..bounds.time import format_rowtime
from ..streams.ddl import normalize_schema
from ..streams.retention import DataLossError
from ..streams.tables import CLOCK_KEY, delta_table, delta_uri, require_deltalake
from .table_log import Anchor, DataFile, Version

__all__ = ["DeltaFiles", "DeltaVersions", "TableChangeError", "delta_schema"]

log = logging.getLogger("pyspark_rowtime")


class TableChangeError(SchemaError):
    """A version of a table that changes rows a stream has read (a delete, an update, an
    overwrite), or its schema.

    Examples:
        Also a ``SchemaError``:

        >>> import pyspark_rowtime as rt
        >>> issubclass(rt.TableChangeError, rt.SchemaError)
        True
    """


def _filesystem(location: str) -> tuple[Any, str]:
    """The filesystem a table's files are read through, and the root its paths join."""
    uri = delta_uri(location)
    if "://" not in uri:
        return pa.fs.LocalFileSystem(), uri
    require_deltalake()
    from deltalake.fs import DeltaStorageHandler

    return pa.fs.PyFileSystem(DeltaStorageHandler(uri)), ""


def _join(root: str, rel: str) -> str:
    return os.path.join(root, rel) if root else rel


def delta_schema(location: str) -> tuple[pa.Schema, int, str, list[str]]:
    """The table's schema now (Spark's form of its types), its version, its id and its
    partition columns; refuses tables whose files this reader cannot read as they lie."""
    table = delta_table(location)
    if table is None:
        raise OptionError(
            f"option table=delta: there is no Delta table at {location!r} (no _delta_log); "
            "give the folder of a table, or leave the option out for a rowtime stream"
        )
    meta = table.metadata()
    config = dict(meta.configuration or {})
    mode = config.get("delta.columnMapping.mode", "none")
    if mode != "none":
        raise OptionError(
            f"Delta table {location}: delta.columnMapping.mode={mode}, whose data files name "
            "columns by ids this reader does not map; read a table without column mapping"
        )
    try:
        schema = normalize_schema(pa.schema(table.schema().to_arrow()))
    except SchemaError as e:
        raise SchemaError(f"Delta table {location}: {e}") from None
    return schema, int(table.version()), str(meta.id), list(meta.partition_columns)


@dataclass(frozen=True)
class DeltaFiles:
    """A Delta table's data files, as executors read them (picklable)."""

    location: str

    def read(self, file: DataFile, columns: Sequence[str], schema: pa.Schema) -> pa.Table:
        fs, root = _filesystem(self.location)
        path = _data_path(root, file.path)
        parts = dict(file.partition)
        in_file = [c for c in columns if c not in parts]
        source = pq.ParquetFile(fs.open_input_file(path))
        have = set(source.schema_arrow.names)
        data = source.read(columns=[c for c in in_file if c in have]) if in_file else None
        n = file.rows if data is None else data.num_rows
        arrays = []
        for name in columns:
            field = schema.field(name)
            if name in parts:
                arrays.append(_partition_value(parts[name], field, n, file))
            elif data is not None and name in have:
                arrays.append(data.column(name).cast(field.type))
            else:  # a column the table got after this file was written
                arrays.append(pa.nulls(n, field.type))
        return pa.Table.from_arrays(arrays, names=list(columns))

    def missing(self, files: Sequence[DataFile]) -> list[DataFile]:
        """Those of ``files`` that are gone (a VACUUM removed them): one listing call."""
        fs, root = _filesystem(self.location)
        infos = fs.get_file_info([_data_path(root, f.path) for f in files])
        return [f for f, i in zip(files, infos, strict=True) if i.type == pa.fs.FileType.NotFound]

    def footer(self, file: DataFile) -> pq.FileMetaData:
        fs, root = _filesystem(self.location)
        return pq.read_metadata(_data_path(root, file.path), filesystem=fs)


def _data_path(root: str, path: str) -> str:
    """A data file's path as the log writes it (a URL-encoded path relative to the table, or an
    absolute URL) as the filesystem takes it."""
    url = urllib.parse.urlparse(path)
    if url.scheme == "file":
        return urllib.parse.unquote(url.path)
    if url.scheme:
        return path  # an absolute URL: read by the table's object store (same account)
    return _join(root, urllib.parse.unquote(path))


def _partition_value(value: str | None, field: pa.Field, n: int, file: DataFile) -> pa.Array:
    """A partition column's value (text, as Delta keeps it) as ``n`` values of its type."""
    if value is None:
        return pa.nulls(n, field.type)
    text = pa.array([value] * n, pa.string())
    if pa.types.is_string(field.type):
        return text
    try:
        if pa.types.is_timestamp(field.type) and field.type.tz is not None:
            return text.cast(pa.timestamp(field.type.unit)).cast(field.type)
        return text.cast(field.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise SchemaError(
            f"data file {file.path}: partition value {value!r} of column {field.name!r} is not "
            f"a {field.type} ({e})"
        ) from None


class DeltaVersions:
    """The driver's reader of a Delta table's versions (one commit file each)."""

    def __init__(
        self,
        location: str,
        schema: pa.Schema,
        schema_version: int,
        *,
        skip_change_commits: bool = False,
    ) -> None:
        self.location = location
        self.schema = schema
        self.schema_version = schema_version
        self.skip_change_commits = skip_change_commits
        self._fs, self._root = _filesystem(location)
        self.where = f"Delta table {location}"

    def _text(self, name: str) -> str | None:
        try:
            with self._fs.open_input_stream(_join(self._root, f"_delta_log/{name}")) as f:
                return bytes(f.read()).decode("utf-8")
        except FileNotFoundError:
            return None

    def start_version(self) -> int:
        """Where a read from the beginning starts: version 0."""
        return 0

    def latest(self) -> int:
        """The newest version now (found from the log's last checkpoint on, one file at a
        time)."""
        v = self._last_checkpoint() or 0
        if self._text(f"{v:020d}.json") is None and v == 0:
            raise OptionError(f"{self.where}: the log has no version 0 and no checkpoint")
        while self._text(f"{v + 1:020d}.json") is not None:
            v += 1
        return v

    def _last_checkpoint(self) -> int | None:
        text = self._text("_last_checkpoint")
        if text is None:
            return None
        try:
            return int(json.loads(text)["version"])
        except (ValueError, KeyError, TypeError):
            return None

    def clock_before(self, version: int) -> int | None:
        """The table's clock as of the version before ``version`` (a query that starts
        there): one snapshot of the table, read once; None when that version is gone."""
        if version <= 0:
            return None
        deltalake = require_deltalake()
        try:
            table = deltalake.DeltaTable(delta_uri(self.location), version=version - 1)
        except deltalake.exceptions.TableNotFoundError:
            return None  # that version is gone from the log: the caller keeps its clock
        value = table.transaction_version(CLOCK_KEY)
        return None if value is None else int(value)

    def read(self, at: Anchor) -> Version | None:
        """Version ``at.version`` as records from ``at`` on; None when the table has no such
        version yet. A version that the log's clean-up removed (older than the newest
        checkpoint, its commit file gone) is a ``DataLossError``."""
        text = self._text(f"{at.version:020d}.json")
        if text is None:
            last = self._last_checkpoint()
            if last is not None and last >= at.version:
                raise DataLossError(
                    f"{self.where}: version {at.version} is needed, and its commit file is gone "
                    f"(the log's clean-up removed versions before its checkpoint {last}: "
                    "delta.logRetentionDuration). Set option failOnDataLoss=false to skip to "
                    "the first version kept (their rows are not read), or start the query with a "
                    "new checkpointLocation; keep the log longer than a query may stop"
                )
            return None
        return self.parse(at, text)

    def first_kept(self, version: int) -> int:
        """The first version from ``version`` on whose commit file is still in the log."""
        last = self._last_checkpoint() or version
        for v in range(version, last + 1):
            if self._text(f"{v:020d}.json") is not None:
                return v
        return last + 1

    def parse(self, at: Anchor, text: str) -> Version:
        """The records of one commit file's text (see the module docstring)."""
        v = at.version
        files: list[DataFile] = []
        changes = 0
        candidate: int | None = None
        commit_ms: int | None = None
        for line in text.splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "add" in action:
                add = action["add"]
                if not add.get("dataChange", True):
                    continue
                if add.get("deletionVector"):
                    changes += 1
                    continue
                files.append(self._data_file(add, v))
            elif "remove" in action:
                if action["remove"].get("dataChange", True):
                    changes += 1
            elif "txn" in action:
                txn = action["txn"]
                if txn.get("appId") == CLOCK_KEY:
                    candidate = int(txn["version"])
            elif "metaData" in action:
                self._check_schema(action["metaData"], v)
            elif "commitInfo" in action:
                info = action["commitInfo"]
                ts = info.get("inCommitTimestamp", info.get("timestamp"))
                commit_ms = int(ts) if ts is not None else None
        if changes:
            if not self.skip_change_commits:
                raise TableChangeError(
                    f"{self.where}: version {v} changes rows already in the table (a delete, "
                    "update, merge or overwrite), which a stream of its appends cannot take "
                    "back. Set option skipChangeCommits=true to skip such versions (their rows "
                    "are not read), or start over with a new checkpointLocation"
                )
            files = []
        clock = at.clock_us
        bound = None
        if candidate is not None:
            if clock is None or candidate > clock:
                bound = clock = candidate
            elif candidate < clock:
                log.warning(
                    "%s: version %d sets the clock %s back to %s; the clock never goes back: "
                    "it stays at %s",
                    self.where,
                    v,
                    format_rowtime(clock),
                    format_rowtime(candidate),
                    format_rowtime(clock),
                )
        arrival = commit_ms * 1000 if commit_ms is not None else (at.arrival_us or 0)
        if at.arrival_us is not None:
            arrival = max(arrival, at.arrival_us)
        return Version(at, tuple(files), bound, clock, arrival)

    def _data_file(self, add: dict[str, Any], version: int) -> DataFile:
        rows = None
        stats = add.get("stats")
        if stats:
            try:
                rows = json.loads(stats).get("numRecords")
            except ValueError:
                rows = None
        if rows is None:  # a writer that keeps no statistics: the file's footer says
            rows = pq.read_metadata(
                _data_path(self._root, add["path"]), filesystem=self._fs
            ).num_rows
        parts = tuple(sorted((add.get("partitionValues") or {}).items()))
        return DataFile(add["path"], int(rows), parts)

    def _check_schema(self, meta: dict[str, Any], version: int) -> None:
        if version <= self.schema_version:
            return  # on the way to the schema the query reads
        require_deltalake()
        from deltalake import Schema

        try:
            new = normalize_schema(pa.schema(Schema.from_json(meta["schemaString"]).to_arrow()))
        except (KeyError, ValueError, SchemaError) as e:
            raise TableChangeError(
                f"{self.where}: version {version} has a schema this reader cannot read ({e})"
            ) from None
        if new.equals(self.schema):
            return
        column = _first_difference(self.schema, new)
        raise TableChangeError(
            f"{self.where}: version {version} changes the table's schema ({column}); a stream's "
            "columns are fixed when its query starts. Restart the query (from its checkpoint): "
            "it then reads with the new schema, earlier rows with nulls in added columns"
        )


def _first_difference(old: pa.Schema, new: pa.Schema) -> str:
    for f in new:
        if f.name not in old.names:
            return f"column {f.name!r} added"
        if not old.field(f.name).type.equals(f.type):
            return f"column {f.name!r} is now {f.type}, was {old.field(f.name).type}"
    for f in old:
        if f.name not in new.names:
            return f"column {f.name!r} dropped"
    return "the columns' order or nullability"

"""A Delta Lake target: the batch's files and the clock in one commit of the Delta log.

``writeStream.format("rowtime").option("target", "delta").start(PATH)`` writes a Delta table at
``PATH`` (a local folder, ``s3://``, ``az://``, ``abfs[s]://``), created on first use and
partitioned by a string column ``rowtime_<granularity>`` (``rowtime_hour=2024-05-01T10``, as the
Parquet target names its folders). Written through delta-rs (``deltalake``); read by anything
that reads Delta: delta-rs, Spark with Delta Lake, DuckDB, Polars, Trino.

Each batch is one Delta commit (``sink.table_target`` has the protocol) carrying:

* an ``add`` action for each data file, with ``numRecords`` and the ``rowtime`` column's
  minimum, maximum and null count, taken from the footer the file's writer wrote (delta-rs
  never validates an add action: a file without statistics reads as 0 rows in ``count()``, so
  every file gets them);
* ``txn(appId=<query id>, version=<batch id>)``, the app transaction Delta's own streaming sink
  (``DeltaSink``) commits and checks: a batch whose version the table already has for the query
  is skipped. delta-rs does not refuse a duplicate app transaction outside a race, so the check
  is the sink's, made on the same snapshot the commit is based on; two commits racing with the
  same app id conflict (``CommitFailedError``), and the loser checks again;
* ``txn(appId="rowtime.clock", version=<clock in microseconds>)``: the clock, readable in one
  call with delta-rs alone, ``DeltaTable(path).transaction_version("rowtime.clock")``, and kept
  through log checkpoints and ``optimize.compact()``;
* commitInfo keys ``rowtime.clock``, ``rowtime.batch``, ``rowtime.query-id`` and
  ``userMetadata`` (the text Spark's ``DESCRIBE HISTORY`` shows).

The sink's own folder ``_rowtime_sink/`` beside ``_delta_log/`` says what the target is
(``kind`` delta, granularity, schema) and which query owns it; Delta's ``VACUUM`` skips folders
whose names start with ``_``.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..bounds.errors import CorruptLogError, OptionError, SchemaError
from ..streams.columns import SPARK_ROWTIME
from ..streams.ddl import to_ddl
from ..streams.sink_state import SINK_KIND_DELTA, TargetFiles
from ..streams.storage import LocationKind, what_is_at
from ..streams.tables import CLOCK_KEY, delta_table, delta_uri, require_deltalake
from .layout import open_sink_state
from .options import SinkConfig
from .parquet_target import WrittenFile, target_files_at
from .table_target import TableCommit, TableTarget, partition_value
from .task import StagedFile

__all__ = ["DeltaFormat", "DeltaTarget"]


def _rowtime_range_us(footer: pq.FileMetaData) -> tuple[int, int]:
    """The lowest and highest rowtime (microseconds) of a data file, from the statistics of
    its row groups in the footer its writer wrote."""
    lo = hi = None
    for i in range(footer.num_row_groups):
        group = footer.row_group(i)
        column = next(
            group.column(j)
            for j in range(group.num_columns)
            if group.column(j).path_in_schema == SPARK_ROWTIME
        )
        stats = column.statistics
        unit = json.loads(stats.logical_type.to_json()).get("timeUnit") if stats else None
        if stats is None or not stats.has_min_max or unit != "microseconds":
            raise CorruptLogError(
                f"a data file's footer has no microsecond statistics of {SPARK_ROWTIME} "
                f"({stats}); the sink writes them with every file"
            )
        lo = stats.min_raw if lo is None else min(lo, stats.min_raw)
        hi = stats.max_raw if hi is None else max(hi, stats.max_raw)
    assert lo is not None and hi is not None  # a file has at least one row group
    return int(lo), int(hi)


def _ms_floor(us: int) -> str:
    t = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=us)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


class DeltaFormat:
    """The Delta side of ``TableTarget``."""

    name = "delta"

    def __init__(self, cfg: SinkConfig) -> None:
        self.cfg = cfg
        self.column = f"rowtime_{cfg.granularity}"

    def load(self) -> Any:
        table = delta_table(self.cfg.location)
        if table is None:
            raise CorruptLogError(
                f"delta target {self.cfg.location}: the Delta table is gone (no _delta_log); it "
                "was deleted while the query ran. Restore it, or start over with a new "
                "checkpointLocation and path"
            )
        return table

    def committed_batch(self, table: Any, query_id: str) -> int | None:
        version = table.transaction_version(query_id)
        return None if version is None else int(version)

    def clock_us(self, table: Any) -> int | None:
        version = table.transaction_version(CLOCK_KEY)
        return None if version is None else int(version)

    def data_files(self, table: Any) -> tuple[TargetFiles, str]:
        return target_files_at(self.cfg.location), ""

    def file_schema(self, table: Any) -> None:
        return None  # the rows' own: the partition column is in the add action, not the file

    def file_stats(self, table: Any, written: WrittenFile) -> str:
        lo, hi = _rowtime_range_us(written.footer)
        # Delta keeps timestamp statistics in milliseconds: the minimum rounds down and the
        # maximum up, so that skipping files by rowtime never skips a row.
        stats = {
            "numRecords": written.footer.num_rows,
            "minValues": {SPARK_ROWTIME: _ms_floor(lo)},
            "maxValues": {SPARK_ROWTIME: _ms_floor(hi + 999)},
            "nullCount": {SPARK_ROWTIME: 0},
        }
        return json.dumps(stats, separators=(",", ":"))

    def commit(
        self, table: Any, files: Sequence[StagedFile], entry: TableCommit, summary: dict[str, str]
    ) -> bool:
        deltalake = require_deltalake()
        from deltalake.transaction import AddAction, CommitProperties, Transaction

        now_ms = int(time.time() * 1000)
        actions = []
        for f in files:
            assert f.size is not None and f.key is not None and f.stats is not None
            value = partition_value(f.key, self.cfg.granularity)
            actions.append(AddAction(f.staged, f.size, {self.column: value}, now_ms, True, f.stats))
        txns = [Transaction(entry.query_id, entry.batch)]
        if entry.clock_us is not None:
            txns.append(Transaction(CLOCK_KEY, entry.clock_us))
        text = (
            f"pyspark-rowtime: clock {entry.clock or 'none'}, batch {entry.batch} of query "
            f"{entry.query_id}"
        )
        try:
            table.create_write_transaction(
                actions,
                mode="append",
                schema=table.schema(),
                partition_by=[self.column],
                commit_properties=CommitProperties(
                    custom_metadata={**summary, "userMetadata": text}, app_transactions=txns
                ),
            )
        except deltalake.exceptions.CommitFailedError:
            return False
        return True


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether a column of type ``b`` can be written as Delta's type ``a``: Delta has one string,
    one binary and one list type, and names no list or map children."""
    t = pa.types
    if (t.is_list(a) or t.is_large_list(a)) and (t.is_list(b) or t.is_large_list(b)):
        return _same_type(a.value_type, b.value_type)
    if t.is_map(a) and t.is_map(b):
        return _same_type(a.key_type, b.key_type) and _same_type(a.item_type, b.item_type)
    if t.is_struct(a) and t.is_struct(b):
        if [f.name for f in a] != [f.name for f in b]:
            return False
        return all(_same_type(fa.type, fb.type) for fa, fb in zip(a, b, strict=True))
    if t.is_timestamp(a) and t.is_timestamp(b):
        return a.unit == b.unit and (a.tz is None) == (b.tz is None)
    if (t.is_string(a) or t.is_large_string(a)) and (t.is_string(b) or t.is_large_string(b)):
        return True
    if (t.is_binary(a) or t.is_large_binary(a)) and (t.is_binary(b) or t.is_large_binary(b)):
        return True
    return bool(a == b)


class DeltaTarget(TableTarget):
    """The Delta target of one query."""

    def __init__(self, cfg: SinkConfig) -> None:
        super().__init__(cfg, DeltaFormat(cfg), open_sink_state(cfg.location))

    def prepare(self) -> None:
        """Create the table (or check the existing one can take this query's rows)."""
        cfg = self.cfg
        kind = what_is_at(cfg.location).kind
        if kind not in (LocationKind.NOTHING, LocationKind.DELTA_TARGET):
            raise OptionError(
                f"option path={cfg.location!r} is a {kind.value}; target=delta writes a Delta "
                "table: choose another path"
            )
        require_deltalake()
        from deltalake import DeltaTable

        fmt = self.format
        assert isinstance(fmt, DeltaFormat)
        rowtime = cfg.schema.field(SPARK_ROWTIME).with_type(pa.timestamp("us", tz="UTC"))
        want = pa.schema(
            [*cfg.payload_schema, rowtime, pa.field(fmt.column, pa.string(), nullable=False)]
        )
        table = delta_table(cfg.location)
        if table is None:
            DeltaTable.create(
                delta_uri(cfg.location), want, mode="ignore", partition_by=[fmt.column]
            )
            table = fmt.load()
        self._check(table, want)
        doc = {"kind": SINK_KIND_DELTA, "granularity": cfg.granularity, "schema": to_ddl(want)}
        have = self.state.define_target(doc)
        for key in ("kind", "granularity"):
            if have.get(key) != doc[key]:
                raise OptionError(
                    f"{self.where} was created with {key} {have.get(key)!r}, and this query has "
                    f"{doc[key]!r}; a target keeps its {key}: write to another path"
                )

    def _check(self, table: Any, want: pa.Schema) -> None:
        """Refuse, before anything is written, a table whose columns cannot take the rows."""
        fmt = self.format
        assert isinstance(fmt, DeltaFormat)
        parts = list(table.metadata().partition_columns)
        if parts != [fmt.column]:
            raise SchemaError(
                f"{self.where}: the Delta table is partitioned by {parts or 'nothing'}, and the "
                f"sink writes partitions by {fmt.column} (granularity {self.cfg.granularity}); "
                "write to a new path, or give the granularity the table has"
            )
        have = pa.schema(table.schema().to_arrow())
        for f in want:
            if f.name not in have.names:
                raise SchemaError(
                    f"{self.where}: the query's column {f.name!r} ({f.type}) is not in the Delta "
                    f"table (columns {', '.join(have.names)}); the sink does not change a table's "
                    "schema: add the column to the table, or drop it from the query"
                )
            got = have.field(f.name).type
            if not _same_type(got, f.type):
                raise SchemaError(
                    f"{self.where}: column {f.name!r} is {got} in the Delta table and {f.type} "
                    "in the query; cast it in the query, or write to a new path"
                )
        for f in have:
            if f.name not in want.names and not f.nullable:
                raise SchemaError(
                    f"{self.where}: the Delta table's column {f.name!r} is NOT NULL and the "
                    "query has no such column; add it to the query"
                )

"""An Apache Iceberg target: the batch's files, the batch and the clock in one metadata commit.

``writeStream.format("rowtime").option("target", "iceberg").start("iceberg://CATALOG/NS.TABLE")``
writes an Iceberg table through pyiceberg, the catalog resolved as pyiceberg resolves it
(``.pyiceberg.yaml``, ``PYICEBERG_CATALOG__<NAME>__*``), sink options ``iceberg.<property>`` on
top (``iceberg.uri``, ``iceberg.warehouse``, ``iceberg.s3.endpoint``, ...). Namespace and table
are created on first use, partitioned by ``hour(rowtime)`` or ``day(rowtime)`` (option
``granularity``; Iceberg has no minute transform).

Each batch is one Iceberg commit (``sink.table_target`` has the protocol): a fast append of the
batch's data files (one per time partition per task, written by the executors with Iceberg field
ids, their ``DataFile`` statistics computed there) together with the table properties
``rowtime.clock`` (microseconds as text), ``rowtime.batch`` and ``rowtime.query-id`` in the same
metadata file, and the same keys in the snapshot's summary, as Flink's committer keeps
``flink.job-id`` and ``flink.max-committed-checkpoint-id`` there. Properties outlive expired
snapshots and rewrites (a compaction's snapshot carries none of the sink's summary), so the
batch check and the clock read the properties: one read, no walk through history.

pyiceberg retries a conflicting commit by itself (``commit.retry.num-retries``, default 4) by
rebasing it onto the new head, without the sink's batch check, and two commits of one batch
then both land. The sink commits through a view of the table whose retries are 0 (the table's
own property is not changed) and does its own retry: reload, check, commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ..bounds.errors import CorruptLogError, OptionError, SchemaError
from ..streams.columns import SPARK_ROWTIME
from ..streams.sink_state import TargetFiles, owner_conflict
from ..streams.tables import (
    CLOCK_KEY,
    iceberg_catalog,
    iceberg_table,
    parse_iceberg_location,
    require_pyiceberg,
)
from .options import SinkConfig
from .parquet_target import WrittenFile, target_files_at
from .table_target import TableCommit, TableTarget
from .task import StagedFile

__all__ = ["IcebergFormat", "IcebergTarget"]

BATCH_KEY = "rowtime.batch"
QUERY_KEY = "rowtime.query-id"
GRANULARITY_KEY = "rowtime.granularity"
RETRIES = "commit.retry.num-retries"


def _local_or_url(location: str) -> str:
    """A table location as ``streams`` takes it (``file:`` URLs become paths)."""
    if location.startswith("file://"):
        return location[len("file://") :]
    if location.startswith("file:"):
        return location[len("file:") :]
    return location


def _same_type(a: Any, b: Any) -> bool:
    """Whether two Iceberg types are the same, field ids aside."""
    from pyiceberg.types import ListType, MapType, StructType

    if isinstance(a, StructType) and isinstance(b, StructType):
        fa = {f.name: f.field_type for f in a.fields}
        fb = {f.name: f.field_type for f in b.fields}
        return fa.keys() == fb.keys() and all(_same_type(fa[k], fb[k]) for k in fa)
    if isinstance(a, ListType) and isinstance(b, ListType):
        return _same_type(a.element_type, b.element_type)
    if isinstance(a, MapType) and isinstance(b, MapType):
        return _same_type(a.key_type, b.key_type) and _same_type(a.value_type, b.value_type)
    return bool(a == b)


class IcebergFormat:
    """The Iceberg side of ``TableTarget``."""

    name = "iceberg"

    def __init__(self, cfg: SinkConfig) -> None:
        self.cfg = cfg
        self.loc = parse_iceberg_location(cfg.location)

    def load(self) -> Any:
        table = iceberg_table(self.cfg.location, self.cfg.table_options)
        if table is None:
            raise CorruptLogError(
                f"iceberg target {self.cfg.location}: the table is gone from its catalog; it was "
                "dropped while the query ran. Restore it, or start over with a new "
                "checkpointLocation and table"
            )
        return table

    def committed_batch(self, table: Any, query_id: str) -> int | None:
        props = table.properties
        owner = props.get(QUERY_KEY)
        if owner is None:
            return None
        if owner != query_id:
            raise owner_conflict(self.cfg.location, owner, query_id)
        return int(props[BATCH_KEY])

    def clock_us(self, table: Any) -> int | None:
        value = table.properties.get(CLOCK_KEY)
        return None if value is None else int(value)

    def data_files(self, table: Any) -> tuple[TargetFiles, str]:
        return target_files_at(_local_or_url(table.location())), "data"

    def file_schema(self, table: Any) -> pa.Schema:
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        # Field ids in the file (the table's schema), so readers match columns by id.
        return schema_to_pyarrow(table.schema(), include_field_ids=True)

    def file_stats(self, table: Any, written: WrittenFile) -> Any:
        path = f"{table.location().rstrip('/')}/{written.rel}"
        return _data_file(table.metadata, path, written.size, written.footer)

    def commit(
        self, table: Any, files: Sequence[StagedFile], entry: TableCommit, summary: dict[str, str]
    ) -> bool:
        from pyiceberg.exceptions import CommitFailedException
        from pyiceberg.table import Table

        # A view whose commits are not retried by pyiceberg (see the module docstring).
        meta = table.metadata.model_copy(
            update={"properties": {**table.metadata.properties, RETRIES: "0"}}
        )
        view = Table(table._identifier, meta, table.metadata_location, table.io, table.catalog)
        tx = view.transaction()
        tx.set_properties(summary)
        with tx.update_snapshot(snapshot_properties=summary).fast_append() as append:
            for f in files:
                assert f.stats is not None
                append.append_data_file(f.stats)
        try:
            tx.commit_transaction()
        except CommitFailedException:
            return False
        return True


def _data_file(metadata: Any, path: str, size: int, footer: Any) -> Any:
    """The ``DataFile`` of a Parquet file just written with the table's schema (field ids
    included), from the footer its writer returned. pyiceberg's ``parquet_file_to_data_file``
    gives the same but reads the footer back from storage first (a read per file, a GET on
    object storage); this is what pyiceberg's own ``write_file`` does with its writer's
    footer."""
    from pyiceberg.io.pyarrow import (
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    schema = metadata.schema()
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=footer,
        stats_columns=compute_statistics_plan(schema, metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=statistics.partition(metadata.spec(), schema),
        file_size_in_bytes=size,
        sort_order_id=None,
        spec_id=metadata.default_spec_id,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )


class _IcebergState:
    """The sink state of an Iceberg target: the table's own properties."""

    def __init__(self, fmt: IcebergFormat) -> None:
        self.format = fmt

    def read_target(self) -> dict[str, Any] | None:
        table = iceberg_table(self.format.cfg.location, self.format.cfg.table_options)
        if table is None:
            return None
        return {"kind": "iceberg", "granularity": table.properties.get(GRANULARITY_KEY)}

    def claim(self, query_id: str | None) -> None:
        """Refuse a query other than the one whose batches the table records."""
        if query_id is None:
            return
        table = iceberg_table(self.format.cfg.location, self.format.cfg.table_options)
        if table is not None:
            self.format.committed_batch(table, query_id)


class IcebergTarget(TableTarget):
    """The Iceberg target of one query."""

    def __init__(self, cfg: SinkConfig) -> None:
        fmt = IcebergFormat(cfg)
        super().__init__(cfg, fmt, _IcebergState(fmt))

    def prepare(self) -> None:
        """Create namespace and table (or check the existing table can take the rows)."""
        require_pyiceberg()
        from pyiceberg.exceptions import TableAlreadyExistsError

        cfg = self.cfg
        fmt = self.format
        assert isinstance(fmt, IcebergFormat)
        rowtime = cfg.schema.field(SPARK_ROWTIME).with_type(pa.timestamp("us", tz="UTC"))
        want = _iceberg_schema(pa.schema([*cfg.payload_schema, rowtime]))
        table = iceberg_table(cfg.location, cfg.table_options)
        if table is None:
            catalog = iceberg_catalog(fmt.loc, cfg.table_options)
            catalog.create_namespace_if_not_exists(fmt.loc.namespace)
            try:
                catalog.create_table(
                    fmt.loc.identifier,
                    schema=want,
                    partition_spec=_spec(want, cfg.granularity),
                    properties={GRANULARITY_KEY: cfg.granularity},
                )
            except TableAlreadyExistsError:
                pass  # created by a racing query start: checked below like any existing table
            table = fmt.load()
        self._check(table, want)

    def _check(self, table: Any, want: Any) -> None:
        """Refuse, before anything is written, a table that cannot take the rows."""
        from pyiceberg.transforms import DayTransform, HourTransform

        have = table.schema()
        names = {f.name: f for f in have.fields}
        for f in want.fields:
            got = names.get(f.name)
            if got is None:
                raise SchemaError(
                    f"{self.where}: the query's column {f.name!r} ({f.field_type}) is not in "
                    f"the table (columns {', '.join(names)}); the sink does not change a "
                    "table's schema: add the column to the table, or drop it from the query"
                )
            if not _same_type(got.field_type, f.field_type):
                raise SchemaError(
                    f"{self.where}: column {f.name!r} is {got.field_type} in the table and "
                    f"{f.field_type} in the query; cast it in the query, or write to a new table"
                )
        for f in have.fields:
            if f.name not in {w.name for w in want.fields} and f.required:
                raise SchemaError(
                    f"{self.where}: the table's column {f.name!r} is required and the query has "
                    "no such column; add it to the query"
                )
        transform: type = HourTransform if self.cfg.granularity == "hour" else DayTransform
        rowtime_id = names[SPARK_ROWTIME].field_id
        spec = table.spec()
        ok = [
            p
            for p in spec.fields
            if p.source_id == rowtime_id and isinstance(p.transform, transform)
        ]
        if len(spec.fields) != 1 or not ok:
            raise SchemaError(
                f"{self.where}: the table is partitioned by {spec}, and the sink writes one "
                f"file per {self.cfg.granularity} of rowtime (partition spec "
                f"{self.cfg.granularity}(rowtime)); write to a new table, or give the "
                "granularity the table has"
            )


def _iceberg_schema(arrow: pa.Schema) -> Any:
    """The Iceberg schema of the query's columns, with field ids assigned."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import assign_fresh_schema_ids

    try:
        return assign_fresh_schema_ids(Catalog._convert_schema_if_needed(arrow))
    except (TypeError, ValueError) as e:
        raise SchemaError(f"the query's columns cannot be an Iceberg table's ({e})") from e


def _spec(schema: Any, granularity: str) -> Any:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform, HourTransform

    if granularity not in ("hour", "day"):
        raise OptionError(
            f"option granularity={granularity}: Iceberg partitions time by hour or day (there is "
            "no minute transform); use granularity hour or day with target=iceberg"
        )
    transform: Any = HourTransform() if granularity == "hour" else DayTransform()
    source = schema.find_field(SPARK_ROWTIME).field_id
    return PartitionSpec(
        PartitionField(
            source_id=source, field_id=1000, transform=transform, name=f"rowtime_{granularity}"
        )
    )

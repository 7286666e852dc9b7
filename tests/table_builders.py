"""Delta and Iceberg targets built the way the sink lays them out (``streams/tables.py``), with
the tables' own libraries, so the readers can be tested without Spark and without the sink.

Delta: a table partitioned by a string column ``rowtime_<granularity>``, the sink's
``_rowtime_sink/target.json`` (kind delta), and per batch one commit of the batch's files with
the app transaction ``rowtime.clock`` and commitInfo ``rowtime.clock``, ``rowtime.batch``,
``rowtime.query-id``, ``userMetadata``. Iceberg: a table partitioned by ``hour(rowtime)`` or
``day(rowtime)`` in a SQL catalog on SQLite, and per batch one transaction adding the files,
with the snapshot summary and table properties ``rowtime.clock``, ``rowtime.batch``,
``rowtime.query-id`` (and ``rowtime.granularity``).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pyspark_rowtime.sink.options import GRANULARITY_US
from pyspark_rowtime.sink.parquet_target import partition_name

UTC_US = pa.timestamp("us", tz="UTC")
PAYLOAD = pa.schema([("k", pa.int64()), ("rowtime", UTC_US)])


def _rows(rows: list[tuple[int, int]]) -> pa.Table:
    return pa.table(
        {"k": [k for k, _ in rows], "rowtime": pa.array([t for _, t in rows], UTC_US)},
        schema=PAYLOAD,
    )


def _by_partition(rows: list[tuple[int, int]], granularity: str) -> dict[int, pa.Table]:
    width = GRANULARITY_US[granularity]
    keys: dict[int, list[tuple[int, int]]] = {}
    for k, t in rows:
        keys.setdefault(t // width, []).append((k, t))
    return {key: _rows(part) for key, part in sorted(keys.items())}


# -- Delta ---------------------------------------------------------------------------------------


def make_delta_target(path: Path, granularity: str = "hour", table: bool = True) -> str:
    """A Delta target at ``path`` as the sink leaves it when its query started (``table``:
    the table exists too, as after the sink's first commit)."""
    from deltalake import DeltaTable

    column = f"rowtime_{granularity}"
    sink = path / "_rowtime_sink"
    sink.mkdir(parents=True)
    doc = {
        "format": "pyspark-rowtime-sink",
        "format_version": 1,
        "kind": "delta",
        "granularity": granularity,
        "schema": "k BIGINT, rowtime TIMESTAMP",
    }
    (sink / "target.json").write_text(json.dumps(doc))
    if table:
        schema = pa.schema([*PAYLOAD, (column, pa.string())])
        DeltaTable.create(str(path), schema, partition_by=[column])
    return str(path)


def delta_commit(
    path: str,
    rows: list[tuple[int, int]],
    clock_us: int | None,
    batch: int,
    query_id: str = "q-1",
    granularity: str = "hour",
) -> None:
    """One sink commit: the batch's files (one per time partition), the clock moved with it."""
    from deltalake import CommitProperties, DeltaTable, Transaction
    from deltalake.transaction import AddAction

    column = f"rowtime_{granularity}"
    table = DeltaTable(path)
    actions = []
    for key, part in _by_partition(rows, granularity).items():
        folder = partition_name(key, granularity)
        value = folder.partition("=")[2]
        name = f"{folder}/part-{batch:020d}-{uuid.uuid4().hex[:8]}.parquet"
        os.makedirs(os.path.join(path, folder), exist_ok=True)
        pq.write_table(part, os.path.join(path, name))
        stats = json.dumps({"numRecords": part.num_rows})
        size = os.path.getsize(os.path.join(path, name))
        actions.append(AddAction(name, size, {column: value}, 0, True, stats))
    metadata = {"rowtime.batch": str(batch), "rowtime.query-id": query_id}
    txns = []
    if clock_us is not None:
        metadata["rowtime.clock"] = str(clock_us)
        metadata["userMetadata"] = f"rowtime clock {clock_us} us, batch {batch}"
        txns = [Transaction("rowtime.clock", clock_us)]
    table.create_write_transaction(
        actions,
        "append",
        table.schema(),
        partition_by=[column],
        commit_properties=CommitProperties(custom_metadata=metadata, app_transactions=txns),
    )


# -- Iceberg -------------------------------------------------------------------------------------


def iceberg_catalog_env(monkeypatch, root: Path, name: str = "local") -> None:
    """Configure the SQL catalog ``name`` on SQLite below ``root`` as a user would, through
    pyiceberg's environment variables. pyiceberg reads them once, when ``pyiceberg.catalog`` is
    imported, so its configuration is read again here (a process started later reads them
    itself)."""
    import pyiceberg.catalog
    from pyiceberg.utils.config import Config

    warehouse = root / "warehouse"
    warehouse.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv(f"PYICEBERG_CATALOG__{name.upper()}__URI", f"sqlite:///{root}/catalog.db")
    monkeypatch.setenv(f"PYICEBERG_CATALOG__{name.upper()}__WAREHOUSE", f"file://{warehouse}")
    monkeypatch.setattr(pyiceberg.catalog, "_ENV_CONFIG", Config())


def make_iceberg_target(location: str, granularity: str = "hour") -> None:
    """The Iceberg table of ``location`` (``iceberg://CATALOG/NS.TABLE``), partitioned by
    ``hour(rowtime)`` or ``day(rowtime)``."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import DayTransform, HourTransform
    from pyiceberg.types import LongType, NestedField, TimestamptzType

    from pyspark_rowtime.streams.tables import parse_iceberg_location

    loc = parse_iceberg_location(location)
    catalog = load_catalog(loc.catalog)
    catalog.create_namespace_if_not_exists(loc.namespace)
    schema = Schema(
        NestedField(1, "k", LongType(), required=False),
        NestedField(2, "rowtime", TimestamptzType(), required=False),
    )
    transform = HourTransform() if granularity == "hour" else DayTransform()
    spec = PartitionSpec(
        PartitionField(
            source_id=2, field_id=1000, transform=transform, name=f"rowtime_{granularity}"
        )
    )
    catalog.create_table(
        loc.identifier, schema, partition_spec=spec, properties={"rowtime.granularity": granularity}
    )


def iceberg_commit(
    location: str,
    rows: list[tuple[int, int]],
    clock_us: int | None,
    batch: int,
    query_id: str = "q-1",
    granularity: str = "hour",
) -> None:
    """One sink commit: the batch's files added and the clock property set in one transaction."""
    from pyspark_rowtime.streams.tables import iceberg_table

    table = iceberg_table(location)
    assert table is not None
    folder = table.location().removeprefix("file://") + "/data"
    os.makedirs(folder, exist_ok=True)
    files = []
    for part in _by_partition(rows, granularity).values():
        name = f"{folder}/{batch:020d}-{uuid.uuid4().hex[:8]}.parquet"
        pq.write_table(part, name)
        files.append(f"file://{name}")
    props = {"rowtime.batch": str(batch), "rowtime.query-id": query_id}
    if clock_us is not None:
        props["rowtime.clock"] = str(clock_us)
    with table.transaction() as tx:
        tx.add_files(files, snapshot_properties=props)
        tx.set_properties(props)


# -- windows counted by hand, and as a windowed query wrote them -------------------------------


def tumbling_counts(times: list[int], width_us: int) -> list[tuple[int, int]]:
    """Brute force: each row's tumbling window of ``width_us`` (by its end), and how many rows
    fall in it, sorted by the end."""
    counts: dict[int, int] = {}
    for t in times:
        end = t - t % width_us + width_us
        counts[end] = counts.get(end, 0) + 1
    return sorted(counts.items())


def delta_counts(path: str) -> list[tuple[int, int]]:
    """``(rowtime, n)`` of every row of the Delta table at ``path``, read with delta-rs, sorted:
    what a windowed count wrote through the sink."""
    from deltalake import DeltaTable

    got = DeltaTable(path).to_pyarrow_table()
    ends = got.column("rowtime").cast(pa.int64()).to_pylist()
    return sorted(zip(ends, got.column("n").to_pylist(), strict=True))

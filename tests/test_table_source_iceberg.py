"""Iceberg tables read as rowtime streams (``iceberg://CATALOG/NAMESPACE.TABLE``), without
Spark: the source driven one Spark call at a time over tables of a real SQL catalog on SQLite,
written as the sink writes them (tests/table_builders.py) and by pyiceberg's own ``append``,
checked against brute force. Nothing is mocked."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest
from table_builders import iceberg_catalog_env, iceberg_commit, make_iceberg_target
from test_table_source import bounds_of, records, rows_of

from pyspark_rowtime.bounds.errors import LateRowError, OptionError
from pyspark_rowtime.datasource.table_delta import TableChangeError
from pyspark_rowtime.datasource.table_source import (
    TableSource,
    is_table_read,
    parse_table_options,
)
from pyspark_rowtime.streams.retention import DataLossError
from pyspark_rowtime.streams.tables import iceberg_table

pytest.importorskip("pyiceberg.catalog", reason="the iceberg extra is not installed")

HOUR_US = 3_600_000_000
T0_US = 1_700_000_000_000_000 - 1_700_000_000_000_000 % HOUR_US
LOCATION = "iceberg://local/db.events"


@pytest.fixture
def catalog(monkeypatch, tmp_path) -> str:
    iceberg_catalog_env(monkeypatch, tmp_path / "iceberg")
    return LOCATION


def stream(location: str, **options: Any) -> tuple[Any, list[list[dict[str, Any]]]]:
    read = parse_table_options({"path": location, **options})
    source = TableSource(read)
    start = source.initial_offset()
    batches = []
    while True:
        end = source.latest_offset(start, int(options.get("maxRowsPerBatch", 1 << 24)))
        if end == start:
            return (source, start), batches
        batches.append(records(read, source.tasks(start, end, source.runs_for(start, end))))
        source.commit(end)
        start = end


def test_an_iceberg_location_is_a_table_read_without_an_option():
    assert is_table_read({"path": LOCATION})
    assert not is_table_read({"path": "/data/orders"})


def test_a_sink_table_reads_each_row_once_in_order_with_its_clock_as_bounds(catalog):
    make_iceberg_target(catalog)
    commits = [
        ([(1, T0_US + 30), (2, T0_US + 10)], T0_US + 40),
        ([], T0_US + HOUR_US),  # only the clock: add_files([]) with the property
        ([(3, T0_US + HOUR_US), (4, T0_US + 2 * HOUR_US + 1)], T0_US + 2 * HOUR_US + 1),
    ]
    for batch, (rows, clock) in enumerate(commits):
        iceberg_commit(catalog, rows, clock, batch)
    (source, start), batches = stream(catalog, maxRowsPerBatch="1")
    rows = rows_of(batches)
    assert rows == [
        (2, T0_US + 10),
        (1, T0_US + 30),
        (3, T0_US + HOUR_US),
        (4, T0_US + 2 * HOUR_US + 1),
    ]
    assert T0_US + HOUR_US in bounds_of(batches)  # the clock-only snapshot's bound
    assert bounds_of(batches)[-1] == T0_US + 2 * HOUR_US + 1
    iceberg_commit(catalog, [], T0_US + 3 * HOUR_US, 3)  # the upstream went quiet
    end = source.latest_offset(start, 1 << 24)
    got = records(source.read_cfg, source.tasks(start, end, source.runs_for(start, end)))
    assert [(r["is_bound"], r["rowtime"]) for r in got] == [(True, T0_US + 3 * HOUR_US)]


def test_pyicebergs_own_append_reads_with_rowtime_column(catalog):
    from pyiceberg.catalog import load_catalog

    cat = load_catalog("local")
    cat.create_namespace_if_not_exists("db")
    ts = pa.timestamp("us", tz="UTC")
    schema = pa.schema([("id", pa.int64()), ("at", ts)])
    table = cat.create_table("db.events", schema=schema)
    for rows in ([(1, 20), (2, 10)], [(3, 30)]):
        data = pa.table(
            {"id": [i for i, _ in rows], "at": pa.array([T0_US + m for _, m in rows], ts)},
            schema=schema,
        )
        table.append(data)
    _, batches = stream(catalog, **{"rowtime.column": "at"})
    assert [(r["id"], r["rowtime"]) for b in batches for r in b if not r["is_bound"]] == [
        (2, T0_US + 10),
        (1, T0_US + 20),
        (3, T0_US + 30),
    ]
    read = parse_table_options({"path": catalog, "rowtime.column": "at"})
    whole = records(read, TableSource(read).batch_tasks())
    assert sorted(r["id"] for r in whole if not r["is_bound"]) == [1, 2, 3]
    # a delete changes rows read: the query fails naming the snapshot, or skips it
    table = cat.load_table("db.events")
    table.delete("id = 1")
    snapshot = table.current_snapshot().snapshot_id
    with pytest.raises(TableChangeError, match=f"snapshot {snapshot}"):
        stream(catalog, **{"rowtime.column": "at"})
    _, batches = stream(catalog, skipChangeCommits="true", **{"rowtime.column": "at"})
    assert sorted(r["id"] for b in batches for r in b if not r["is_bound"]) == [1, 2, 3]


def test_a_late_row_from_another_writer_is_an_error_under_reject(catalog):
    make_iceberg_target(catalog)
    iceberg_commit(catalog, [(1, T0_US + HOUR_US)], T0_US + HOUR_US, 0)
    iceberg_commit(catalog, [(2, T0_US)], None, 1)
    with pytest.raises(LateRowError, match="row 0 of version 2"):
        stream(catalog)
    _, batches = stream(catalog, order="drop")
    assert [k for k, _ in rows_of(batches)] == [1]


def test_snapshots_expire_snapshots_removed_follow_fail_on_data_loss(catalog):
    make_iceberg_target(catalog)
    iceberg_commit(catalog, [(1, T0_US)], T0_US + 1, 0)
    (source, start), _ = stream(catalog)
    for b in range(1, 4):
        iceberg_commit(catalog, [(b + 1, T0_US + b * 10)], T0_US + b * 10 + 1, b)
    table = iceberg_table(catalog)
    now = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1)
    table.maintenance.expire_snapshots().older_than(now).commit()
    with pytest.raises(DataLossError, match="failOnDataLoss=false"):
        source.latest_offset(start, 1 << 24)
    lossy = TableSource(parse_table_options({"path": catalog, "failOnDataLoss": "false"}))
    end = lossy.latest_offset(start, 1 << 24)
    got = records(lossy.read_cfg, lossy.tasks(start, end, lossy.runs_for(start, end)))
    assert [r["k"] for r in got if not r["is_bound"]] == [4]


def test_an_iceberg_warehouse_on_object_storage_reads_as_in_a_folder(
    monkeypatch, tmp_path, object_server
):
    # moto's S3 and Azurite: pyiceberg writes the table; the reader resolves the catalog as
    # the sink does (the endpoints from the standard variables the servers set)
    import pyiceberg.catalog
    from pyiceberg.catalog import load_catalog
    from pyiceberg.utils.config import Config
    from table_helpers import iceberg_props

    scheme = "s3" if object_server.scheme == "s3" else "abfs"
    warehouse = f"{scheme}://{object_server.bucket}/iceberg-{tmp_path.name}"
    uri = f"sqlite:///{tmp_path}/catalog.db"
    monkeypatch.setenv("PYICEBERG_CATALOG__OBJ__URI", uri)
    monkeypatch.setenv("PYICEBERG_CATALOG__OBJ__WAREHOUSE", warehouse)
    monkeypatch.setattr(pyiceberg.catalog, "_ENV_CONFIG", Config())
    cat = load_catalog("obj", **iceberg_props(uri, warehouse))
    cat.create_namespace_if_not_exists("db")
    ts = pa.timestamp("us", tz="UTC")
    schema = pa.schema([("id", pa.int64()), ("rowtime", ts)])
    table = cat.create_table("db.events", schema=schema)
    table.append(pa.table({"id": [1, 2], "rowtime": pa.array([T0_US + 9, T0_US], ts)}, schema))
    _, batches = stream("iceberg://obj/db.events")
    assert [(r["id"], r["rowtime"]) for b in batches for r in b if not r["is_bound"]] == [
        (2, T0_US),
        (1, T0_US + 9),
    ]


def test_a_format_version_1_table_is_refused_saying_how_to_upgrade(catalog):
    from pyiceberg.catalog import load_catalog

    cat = load_catalog("local")
    cat.create_namespace_if_not_exists("db")
    schema = pa.schema([("id", pa.int64()), ("rowtime", pa.timestamp("us", tz="UTC"))])
    cat.create_table("db.events", schema=schema, properties={"format-version": "1"})
    with pytest.raises(OptionError, match=r"format version 1.*upgrade_table_version"):
        parse_table_options({"path": catalog})

"""What tables do between versions, read by the table source without Spark: an Iceberg
compaction (a real ``replace`` snapshot), overwrites and deletes, a schema change, and data
files that a Delta VACUUM or an Iceberg clean-up removed while a query still needed them
(``failOnDataLoss``). The tables are written by delta-rs and pyiceberg; nothing is mocked."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from table_builders import iceberg_catalog_env
from test_table_source import records

from pyspark_rowtime.bounds.errors import OptionError
from pyspark_rowtime.datasource.table_delta import TableChangeError
from pyspark_rowtime.datasource.table_source import TableSource, parse_table_options
from pyspark_rowtime.streams.retention import DataLossError

deltalake = pytest.importorskip("deltalake", reason="the delta extra is not installed")
pytest.importorskip("pyiceberg.catalog", reason="the iceberg extra is not installed")

T0_US = 1_700_000_000_000_000
UTC_US = pa.timestamp("us", tz="UTC")
LOCATION = "iceberg://local/db.events"
SCHEMA = pa.schema([("id", pa.int64()), ("rowtime", UTC_US)])


def rows(*ids: int) -> pa.Table:
    return pa.table(
        {"id": list(ids), "rowtime": pa.array([T0_US + i for i in ids], UTC_US)}, SCHEMA
    )


def run(source: TableSource, start: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
    """The ids of the rows the source reads from ``start`` now, and where it ends."""
    ids = []
    while (end := source.latest_offset(start, 1 << 24)) != start:
        got = records(source.read_cfg, source.tasks(start, end, source.runs_for(start, end)))
        ids += [r["id"] for r in got if not r["is_bound"]]
        source.commit(end)
        start = end
    return start, ids


def started(path: str, **options: Any) -> tuple[TableSource, dict[str, Any], list[int]]:
    source = TableSource(parse_table_options({"path": path, **options}))
    start, ids = run(source, source.initial_offset())
    return source, start, ids


# -- Iceberg ---------------------------------------------------------------------------------


@pytest.fixture
def table(monkeypatch, tmp_path) -> Any:
    """An unpartitioned Iceberg table of a SQL catalog on SQLite (pyiceberg's own append)."""
    from pyiceberg.catalog import load_catalog

    iceberg_catalog_env(monkeypatch, tmp_path / "iceberg")
    catalog = load_catalog("local")
    catalog.create_namespace_if_not_exists("db")
    return catalog.create_table("db.events", schema=SCHEMA)


def compact(table: Any) -> Any:
    """What Iceberg's ``rewrite_data_files`` commits: every data file replaced by one holding
    the same rows, a ``replace`` snapshot. pyiceberg 0.12 makes none through its public API;
    its own snapshot producer writes the manifests, and only its summary update refuses the
    operation, so the summary is made as for an overwrite (the totals Iceberg's spec asks
    for) and given the operation ``replace``."""
    from pyiceberg.io.pyarrow import parquet_file_to_data_file, schema_to_pyarrow
    from pyiceberg.table.snapshots import Operation, Summary
    from pyiceberg.table.update.snapshot import _OverwriteFiles

    class Replace(_OverwriteFiles):
        def _summary(self, snapshot_properties: Any = None) -> Summary:
            self._operation = Operation.OVERWRITE
            try:
                summary = super()._summary(snapshot_properties or {})
            finally:
                self._operation = Operation.REPLACE
            return Summary(Operation.REPLACE, **summary.additional_properties)

    old = [task.file for task in table.scan().plan_files()]
    data = table.scan().to_arrow().cast(schema_to_pyarrow(table.schema()))
    path = f"{table.location()}/data/compacted-{uuid.uuid4().hex}.parquet"
    with table.io.new_output(path).create() as out:
        pq.write_table(data, out)
    with table.transaction() as tx:
        producer = Replace(operation=Operation.REPLACE, transaction=tx, io=table.io, branch="main")
        for data_file in old:
            producer.delete_data_file(data_file)
        producer.append_data_file(parquet_file_to_data_file(table.io, table.metadata, path))
        producer.commit()
    return table.refresh()


def test_an_iceberg_compaction_a_replace_snapshot_reads_as_nothing(table):
    for i in (1, 2, 3):
        table.append(rows(i))
    source, start, ids = started(LOCATION)
    assert ids == [1, 2, 3]
    table = compact(table)
    snapshot = table.current_snapshot()
    assert str(snapshot.summary.operation.value) == "replace"
    assert len(list(table.scan().plan_files())) == 1  # three files rewritten into one
    assert source.latest_offset(start, 1 << 24) == start  # nothing new
    table.append(rows(4))
    assert run(source, start)[1] == [4]
    # a query from scratch reads each row once: the rewritten file is not read again
    assert started(LOCATION)[2] == [1, 2, 3, 4]


def test_an_overwrite_or_a_delete_fails_naming_its_snapshot_unless_icebergs_option_skips_it(
    table,
):
    table.append(rows(1, 2))  # one file
    source, start, _ = started(LOCATION)
    table.delete("id = 1")  # the file rewritten without row 1: an overwrite snapshot
    overwrite = table.refresh().current_snapshot()
    assert str(overwrite.summary.operation.value) == "overwrite"
    match = rf"snapshot {overwrite.snapshot_id} .*overwrite.*streaming-skip-overwrite-snapshots"
    with pytest.raises(TableChangeError, match=match):
        source.latest_offset(start, 1 << 24)
    skip = {"streaming-skip-overwrite-snapshots": "true"}
    assert started(LOCATION, **skip)[2] == [1, 2]  # the rewritten file is not read again
    table.refresh().delete("id = 2")  # the whole file goes: a delete snapshot
    delete = table.refresh().current_snapshot()
    assert str(delete.summary.operation.value) == "delete"
    with pytest.raises(TableChangeError, match=r"delete.*streaming-skip-delete-snapshots"):
        started(LOCATION, **skip)
    both = {**skip, "streaming-skip-delete-snapshots": "true"}
    assert started(LOCATION, **both)[2] == [1, 2]
    assert started(LOCATION, skipChangeCommits="true")[2] == [1, 2]  # Delta's name: both


def test_icebergs_skip_options_on_a_delta_table_name_deltas(tmp_path):
    path = str(tmp_path / "d")
    deltalake.write_deltalake(path, rows(1))
    with pytest.raises(OptionError, match=r"Iceberg's.*skipChangeCommits=true"):
        parse_table_options(
            {"path": path, "table": "delta", "streaming-skip-overwrite-snapshots": "true"}
        )


def test_an_iceberg_schema_change_fails_naming_the_column_and_the_fix(table):
    from pyiceberg.types import StringType

    table.append(rows(1))
    source, start, _ = started(LOCATION)
    with table.update_schema() as update:
        update.add_column("extra", StringType())
    wider = rows(2).append_column("extra", pa.array(["x"]))
    table.refresh().append(wider)
    with pytest.raises(TableChangeError, match=r"column 'extra' added.*Restart the query"):
        source.latest_offset(start, 1 << 24)
    # restarted, the query reads with the new schema: the earlier row with a null there
    again = parse_table_options({"path": LOCATION})
    got = records(again, TableSource(again).batch_tasks())
    assert [(r["id"], r["extra"]) for r in got if not r["is_bound"]] == [(1, None), (2, "x")]


def test_an_iceberg_data_file_removed_while_needed_follows_fail_on_data_loss(table):
    table.append(rows(1))
    source, start, _ = started(LOCATION)
    table.append(rows(2))
    table.append(rows(3))
    table = table.refresh()
    files = [t.file for t in table.scan().plan_files()]
    gone = next(f for f in files if _ids(table, f.file_path) == [2])
    table.io.delete(gone.file_path)  # an orphan-file clean-up that went too far
    sequence = table.metadata.snapshots[1].sequence_number
    with pytest.raises(
        DataLossError, match=rf"sequence number {sequence} is needed.*failOnDataLoss=false"
    ):
        source.latest_offset(start, 1 << 24)
    lossy = TableSource(parse_table_options({"path": LOCATION, "failOnDataLoss": "false"}))
    assert run(lossy, start)[1] == [3]
    assert (lossy.progress()["lost_files"], lossy.progress()["lost_rows"]) == (1, 1)


def _ids(table: Any, path: str) -> list[int]:
    with table.io.new_input(path).open() as f:
        return pq.read_table(f).column("id").to_pylist()


# -- Delta ------------------------------------------------------------------------------------


def vacuumed(path: str) -> None:
    """Optimize, then VACUUM with no retention: the appended files of every version before the
    compaction are deleted."""
    table = deltalake.DeltaTable(path)
    table.optimize.compact()
    removed = deltalake.DeltaTable(path).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False
    )
    assert removed


def test_a_delta_file_vacuum_removed_follows_fail_on_data_loss(tmp_path):
    path = str(tmp_path / "d")
    deltalake.write_deltalake(path, rows(1))
    source, start, _ = started(path, table="delta")
    deltalake.write_deltalake(path, rows(2), mode="append")  # version 1
    deltalake.write_deltalake(path, rows(3), mode="append")  # version 2
    vacuumed(path)
    with pytest.raises(
        DataLossError,
        match=r"version 1 is needed, and 1 of its data files are gone.*"
        r"failOnDataLoss=false",
    ):
        source.latest_offset(start, 1 << 24)
    lossy = TableSource(
        parse_table_options({"path": path, "table": "delta", "failOnDataLoss": "false"})
    )
    end, ids = run(lossy, start)
    assert ids == []  # versions 1 and 2 are lost; the compaction and the vacuum read as nothing
    assert (lossy.progress()["lost_files"], lossy.progress()["lost_rows"]) == (2, 2)
    deltalake.write_deltalake(path, rows(4), mode="append")
    assert run(lossy, end)[1] == [4]


def test_a_delta_file_removed_after_its_micro_batch_was_planned_names_the_version(tmp_path):
    path = str(tmp_path / "d")
    deltalake.write_deltalake(path, rows(1))
    read = parse_table_options({"path": path, "table": "delta"})
    source = TableSource(read)
    start = source.initial_offset()
    end = source.latest_offset(start, 1 << 24)
    tasks = source.tasks(start, end, source.runs_for(start, end))
    for name in os.listdir(path):
        if name.endswith(".parquet"):
            os.remove(os.path.join(path, name))
    with pytest.raises(DataLossError, match=r"a data file of version 0 was removed.*Restart"):
        records(read, tasks)

"""The Delta Lake and Iceberg targets' protocol, driven as Spark drives it (no Spark here).

Each test writes through the target (``write()`` per task, the reports through pickle, then
``commit()``), and reads the table back with its own library alone: delta-rs
(``DeltaTable(...).to_pyarrow_table()``, ``transaction_version``) or pyiceberg
(``scan().to_arrow()``, ``properties``). The traps these tests pin down were measured with both
libraries (a duplicate Delta app transaction is not refused; pyiceberg's own retries rebase a
losing commit and land a batch twice; an add action without ``numRecords`` counts as 0 rows).
"""

from __future__ import annotations

import datetime as dt
import pickle
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sink_helpers import HOUR, SCHEMA, T0, records

from pyspark_rowtime.bounds.errors import LateRowError, OptionError, SchemaError
from pyspark_rowtime.sink.clock import bounds_clock_us
from pyspark_rowtime.sink.options import parse_sink_options
from pyspark_rowtime.sink.table_target import TableTarget
from pyspark_rowtime.sink.task import TaskInfo, TaskReport
from pyspark_rowtime.streams.storage import LocationKind, what_is_at

deltalake = pytest.importorskip("deltalake", reason="the delta extra is not installed")
pytest.importorskip("pyiceberg.catalog", reason="the iceberg extra is not installed")

from pyiceberg.catalog import load_catalog  # noqa: E402

from pyspark_rowtime.sink.delta_target import DeltaTarget  # noqa: E402
from pyspark_rowtime.sink.iceberg_target import IcebergTarget  # noqa: E402

KINDS = ["delta", "iceberg"]
MIN = 60_000_000


class Table:
    """A table target under test, and its table as its own library reads it."""

    def __init__(self, root: Path, kind: str, **options: str) -> None:
        self.kind = kind
        self.root = root
        if kind == "delta":
            self.location = str(root / "table")
            self.options: dict[str, str] = {}
        else:
            (root / "wh").mkdir(exist_ok=True)
            self.location = "iceberg://t/db.events"
            self.options = {
                "iceberg.uri": f"sqlite:///{root}/catalog.db",
                "iceberg.warehouse": f"file://{root}/wh",
            }
        self.extra = options

    def target(self, schema: pa.Schema = SCHEMA) -> TableTarget:
        opts = {"path": self.location, "target": self.kind, **self.options, **self.extra}
        cfg = parse_sink_options(opts, schema)
        target: TableTarget = DeltaTarget(cfg) if self.kind == "delta" else IcebergTarget(cfg)
        target.prepare()
        return target

    def iceberg(self) -> Any:
        props = {k.removeprefix("iceberg."): v for k, v in self.options.items()}
        return load_catalog("t", **props).load_table("db.events")

    def rows(self) -> list[tuple[int, int]]:
        if self.kind == "delta":
            t = deltalake.DeltaTable(self.location).to_pyarrow_table()
        else:
            t = self.iceberg().scan().to_arrow()
        times = t.column("rowtime").cast(pa.int64()).to_pylist()
        return sorted(zip(t.column("id").to_pylist(), times, strict=True))

    def count(self) -> int:
        """Rows as the table's statistics count them (no file is read)."""
        if self.kind == "delta":
            actions = pa.table(deltalake.DeltaTable(self.location).get_add_actions(flatten=True))
            return sum(actions.column("num_records").to_pylist())
        snap = self.iceberg().current_snapshot()
        return int(snap.summary["total-records"])

    def clock(self) -> int | None:
        if self.kind == "delta":
            return deltalake.DeltaTable(self.location).transaction_version("rowtime.clock")
        value = self.iceberg().properties.get("rowtime.clock")
        return None if value is None else int(value)

    def versions(self) -> int:
        """Commits (Delta versions, Iceberg snapshots) so far."""
        if self.kind == "delta":
            return int(deltalake.DeltaTable(self.location).version())
        return len(self.iceberg().snapshots())


@pytest.fixture(autouse=True)
def catalog_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catalog ``t`` as pyiceberg's users configure it (the sink's options say it again)."""
    monkeypatch.setenv("PYICEBERG_CATALOG__T__URI", f"sqlite:///{tmp_path}/catalog.db")
    monkeypatch.setenv("PYICEBERG_CATALOG__T__WAREHOUSE", f"file://{tmp_path}/wh")


@pytest.fixture(params=KINDS)
def table(request: pytest.FixtureRequest, tmp_path: Path) -> Table:
    return Table(tmp_path, request.param)


def write(
    target: TableTarget, batch_id: int, tasks: list[list[pa.RecordBatch]], query: str = "q1"
) -> list[TaskReport]:
    reports = [
        target.write(TaskInfo(batch_id, i, 0, query), iter(batches))
        for i, batches in enumerate(tasks)
    ]
    return pickle.loads(pickle.dumps(reports))  # they travel to the driver


def run(target: TableTarget, batch_id: int, tasks: list[list[pa.RecordBatch]]) -> Any:
    reports = write(target, batch_id, tasks)
    return target.commit(reports, batch_id, bounds_clock_us(r.bound_us for r in reports))


def rows(first: int, n: int, step: int = MIN) -> list[tuple[int, int]]:
    return [(i, T0 + i * step) for i in range(first, first + n)]


def test_a_batch_lands_once_with_its_clock_in_the_table_metadata(table):
    target = table.target()
    assert what_is_at(table.location).kind is (
        LocationKind.DELTA_TARGET if table.kind == "delta" else LocationKind.ICEBERG_TARGET
    )
    entry = run(target, 0, [[records(rows(0, 30), bound=T0 + 30 * MIN)], [records(rows(30, 30))]])
    assert entry.rows == 60 and entry.clock_us == T0 + 30 * MIN
    assert table.rows() == rows(0, 60)
    assert table.count() == 60  # statistics say what the files hold
    assert table.clock() == T0 + 30 * MIN


def test_a_replayed_batch_is_a_no_op_and_its_rewritten_files_stay_invisible(table):
    target = table.target()
    run(target, 0, [[records(rows(0, 10), bound=T0 + 10 * MIN)]])
    commits = table.versions()
    # Spark replays batch 0 after a crash that lost its commit log entry: the tasks see the
    # table has the batch and stage nothing; the commit commits nothing
    reports = write(target, 0, [[records(rows(0, 10), bound=T0 + 10 * MIN)]])
    assert all(r.skipped and not r.files for r in reports)
    assert target.commit(reports, 0, T0 + 10 * MIN) is None
    # tasks that ran before the first commit landed, committed after it: still once
    late = write(target, 1, [[records(rows(10, 5), bound=T0 + 20 * MIN)]])
    run(target, 1, [[records(rows(10, 5), bound=T0 + 20 * MIN)]])
    assert target.commit(late, 1, T0 + 20 * MIN) is None
    assert table.rows() == rows(0, 15)
    assert table.versions() == commits + 1


def test_two_drivers_committing_one_batch_at_once_land_it_once(table):
    """A killed driver's commit runner and the restarted driver's replay race for one batch:
    the table's optimistic concurrency lets one win, and the loser, checking again, finds the
    batch there (without the sink's own check, both Delta and pyiceberg's retries land both)."""
    target = table.target()
    run(target, 0, [[records(rows(0, 5), bound=T0 + 5 * MIN)]])
    reports = write(target, 1, [[records(rows(5, 20), bound=T0 + 30 * MIN)]])
    results: list[Any] = []
    barrier = threading.Barrier(4)

    def commit() -> None:
        barrier.wait()
        results.append(target.commit(reports, 1, T0 + 30 * MIN))

    threads = [threading.Thread(target=commit) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r is not None for r in results) == 1
    assert table.rows() == rows(0, 25)
    assert table.clock() == T0 + 30 * MIN


def test_another_writer_appending_meanwhile_loses_nothing_and_doubles_nothing(table):
    target = table.target()
    run(target, 0, [[records(rows(0, 5), bound=T0 + 5 * MIN)]])
    reports = write(target, 1, [[records(rows(5, 5), bound=T0 + 10 * MIN)]])
    other = pa.table(
        {
            "id": pa.array([100, 101], pa.int64()),
            "rowtime": pa.array([T0 + 50 * MIN, T0 + 51 * MIN], pa.int64()).cast(SCHEMA[1].type),
        }
    )
    if table.kind == "delta":
        other = other.append_column("rowtime_hour", pa.array(["2023-11-14T22"] * 2))
        deltalake.write_deltalake(table.location, other, mode="append")
    else:
        iceberg = table.iceberg()
        iceberg.append(other.cast(iceberg.schema().as_arrow()))
    assert target.commit(reports, 1, T0 + 10 * MIN) is not None
    assert target.commit(reports, 1, T0 + 10 * MIN) is None
    assert table.rows() == sorted([*rows(0, 10), (100, T0 + 50 * MIN), (101, T0 + 51 * MIN)])
    assert table.clock() == T0 + 10 * MIN


def test_a_clock_only_batch_commits_metadata_and_an_idle_one_nothing(table):
    target = table.target()
    run(target, 0, [[records(rows(0, 3), bound=T0 + 5 * MIN)]])
    commits = table.versions()
    entry = run(target, 1, [[records([], bound=T0 + 2 * HOUR)]])
    assert entry.rows == 0 and entry.files == ()
    assert table.clock() == T0 + 2 * HOUR and table.versions() == commits + 1
    assert run(target, 2, [[records([])]]) is None  # no row, no bound: nothing to say
    assert run(target, 3, [[records([], bound=T0 + HOUR)]]) is None  # a lower bound: no move
    assert table.clock() == T0 + 2 * HOUR and table.versions() == commits + 1
    assert table.rows() == rows(0, 3)


def test_the_clock_survives_compaction_and_checkpoints(table):
    target = table.target()
    for b in range(4):
        run(target, b, [[records(rows(b * 5, 5), bound=T0 + (b + 1) * 5 * MIN)]])
    if table.kind == "delta":
        delta = deltalake.DeltaTable(table.location)
        delta.optimize.compact()
        delta.create_checkpoint()
    else:
        # expire every snapshot but the current one: the sink's summaries go with them
        now = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1)
        table.iceberg().maintenance.expire_snapshots().older_than(now).commit()
        assert len(table.iceberg().snapshots()) == 1
    assert table.clock() == T0 + 20 * MIN
    # and the batch check too: a replay of batch 3 after the compaction is a no-op
    assert run(target, 3, [[records(rows(15, 5), bound=T0 + 20 * MIN)]]) is None
    run(target, 4, [[records(rows(20, 5), bound=T0 + 25 * MIN)]])
    assert table.rows() == rows(0, 25)
    assert table.clock() == T0 + 25 * MIN


def test_rows_are_partitioned_by_time_one_file_per_partition_per_task(table):
    target = table.target()
    entry = run(
        target,
        0,
        [[records(rows(0, 6, step=30 * MIN))], [records(rows(6, 2, step=30 * MIN))]],
    )
    # task 0: hours 22, 23, 00 (3 files); task 1: hour 01 (1 file)
    assert len(entry.files) == 4
    assert all(f.split("/")[-2].startswith("rowtime_hour=") for f in entry.files)
    if table.kind == "delta":
        parts = deltalake.DeltaTable(table.location).metadata().partition_columns
        assert parts == ["rowtime_hour"]
        t = deltalake.DeltaTable(table.location).to_pyarrow_table()
        got = sorted(set(t.column("rowtime_hour").to_pylist()))
        assert got == ["2023-11-14T22", "2023-11-14T23", "2023-11-15T00", "2023-11-15T01"]
    else:
        spec = table.iceberg().spec()
        assert [str(f.transform) for f in spec.fields] == ["hour"]


def test_a_row_below_the_clock_fails_the_task_and_commits_nothing(table):
    target = table.target()
    run(target, 0, [[records(rows(0, 3), bound=T0 + HOUR)]])
    with pytest.raises(LateRowError, match="below the target's clock"):
        write(target, 1, [[records(rows(10, 1))]])
    assert table.rows() == rows(0, 3)


def test_another_query_cannot_write_a_table_another_owns(table):
    target = table.target()
    target.state.claim("q1")
    run(target, 0, [[records(rows(0, 3), bound=T0 + HOUR)]])
    with pytest.raises(OptionError, match="another streaming query"):
        table.target().state.claim("q2")


def test_a_query_whose_columns_do_not_fit_the_table_is_refused_naming_the_column(table):
    table.target()
    other = pa.schema([("id", pa.string()), SCHEMA.field("rowtime"), SCHEMA.field("is_bound")])
    with pytest.raises(SchemaError, match="column 'id'"):
        table.target(other)
    more = pa.schema([*SCHEMA, ("extra", pa.int32())])
    with pytest.raises(SchemaError, match="'extra'"):
        table.target(more)


def test_every_spark_type_maps_to_the_table_and_reads_back(table):
    ts = SCHEMA.field("rowtime").type
    schema = pa.schema(
        [
            ("b", pa.int8()),
            ("s", pa.int16()),
            ("i", pa.int32()),
            ("l", pa.int64()),
            ("f", pa.float32()),
            ("d", pa.float64()),
            ("dec", pa.decimal128(12, 3)),
            ("txt", pa.string()),
            ("bin", pa.binary()),
            ("ok", pa.bool_()),
            ("day", pa.date32()),
            ("at", ts),
            ("tags", pa.list_(pa.string())),
            ("attrs", pa.map_(pa.string(), pa.int64())),
            ("where", pa.struct([("x", pa.float64()), ("y", pa.float64())])),
            ("rowtime", ts),
            ("is_bound", pa.bool_()),
        ]
    )
    import decimal

    row = {
        "b": 1,
        "s": 2,
        "i": 3,
        "l": 4,
        "f": 1.5,
        "d": 2.25,
        "dec": decimal.Decimal("12.345"),
        "txt": "é",
        "bin": b"\x00\x01",
        "ok": True,
        "day": dt.date(2024, 5, 1),
        "at": T0 + 7,
        "tags": ["a", "b"],
        "attrs": [("k", 1)],
        "where": {"x": 1.0, "y": 2.0},
        "rowtime": T0 + 11,
        "is_bound": False,
    }
    batch = pa.RecordBatch.from_pylist([row], schema=schema)
    target = table.target(schema)
    reports = write(target, 0, [[batch]])
    target.commit(reports, 0, None)
    if table.kind == "delta":
        got = deltalake.DeltaTable(table.location).to_pyarrow_table()
    else:
        got = table.iceberg().scan().to_arrow()
    back = got.to_pylist()[0]
    for name in ("b", "s", "i", "l", "f", "d", "dec", "txt", "bin", "ok", "day", "tags", "where"):
        assert back[name] == batch.column(name).to_pylist()[0], name
    assert dict(back["attrs"]) == {"k": 1}
    assert back["at"] == batch.column("at").to_pylist()[0]
    assert back["rowtime"] == batch.column("rowtime").to_pylist()[0]


def test_delta_commits_say_the_clock_in_their_history(tmp_path):
    table = Table(tmp_path, "delta")
    target = table.target()
    run(target, 0, [[records(rows(0, 3), bound=T0 + HOUR)]])
    last = deltalake.DeltaTable(table.location).history(1)[0]
    assert last["rowtime.clock"] == str(T0 + HOUR)
    assert last["rowtime.batch"] == "0" and last["rowtime.query-id"] == "q1"
    assert "clock 2023-11-14T23:00:00" in last["userMetadata"]


def test_iceberg_snapshots_carry_the_clock_in_their_summary(tmp_path):
    table = Table(tmp_path, "iceberg")
    target = table.target()
    run(target, 0, [[records(rows(0, 3), bound=T0 + HOUR)]])
    iceberg = table.iceberg()
    summary = iceberg.current_snapshot().summary
    assert summary["rowtime.clock"] == str(T0 + HOUR)
    assert summary["rowtime.batch"] == "0" and summary["rowtime.query-id"] == "q1"
    assert iceberg.properties.get("commit.retry.num-retries") is None  # left as it was


def test_iceberg_refuses_minute_partitions_and_a_path_that_is_not_a_table(tmp_path):
    with pytest.raises(OptionError, match="no minute transform"):
        parse_sink_options(
            {"path": "iceberg://t/db.x", "target": "iceberg", "granularity": "minute"}, SCHEMA
        )
    with pytest.raises(OptionError, match=r"iceberg://CATALOG/NAMESPACE\.TABLE"):
        parse_sink_options({"path": str(tmp_path / "x"), "target": "iceberg"}, SCHEMA)
    with pytest.raises(OptionError, match="target=iceberg only"):
        parse_sink_options(
            {"path": str(tmp_path / "x"), "target": "delta", "iceberg.uri": "x"}, SCHEMA
        )

"""What the reader and sink do on each supported Spark, without starting one (issue 26).

The Spark-version checks read ``pyspark_rowtime.streams.spark_compat``'s module values, so a
test sets them to another version's and calls the source exactly as that Spark would:
``schema()``, ``reader()``, ``streamReader()``, ``streamWriter()``, and for Spark 4.1 the
stream reader's methods in 4.1's order (``latestOffset()`` with no arguments, before
``initialOffset()``; ``partitions(end, end)`` on a restart). The same checks on a real Spark
4.1 and 4.0 run in ``./dev matrix`` (integration/test_spark_versions.py).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.errors import OptionError
from pyspark_rowtime.datasource.spark import RowtimeStreamReader
from pyspark_rowtime.source import RowtimeDataSource
from pyspark_rowtime.streams import spark_compat
from pyspark_rowtime.streams.spark_compat import SparkVersionError

US = 1_000_000
BASE_US = 1_700_000_000 * US


def write(location: Path, partition: int, first: int, n: int, bound_s: int) -> None:
    with pr.open_writer(str(location), partition) as w:
        for i in range(first, first + n):
            w.insert({"p": partition, "i": i}, rowtime=pr.from_rowtime_us(BASE_US + i * US // 10))
        w.set_rowtime_bound(pr.from_rowtime_us(BASE_US + bound_s * US))
        w.flush()


@pytest.fixture
def stream(tmp_path: Path) -> Path:
    location = tmp_path / "s"
    pr.create_stream(str(location), "p INT, i INT", partitions=2)
    for p in (0, 1):
        write(location, p, 0, 100, 10)
    return location


def as_spark_4_0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spark_compat, "SPARK_VERSION", (4, 0, 5))
    monkeypatch.setattr(spark_compat, "SPARK_VERSION_TEXT", "4.0.5")
    monkeypatch.setattr(spark_compat, "HAS_ADMISSION_CONTROL", False)


def as_spark_4_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spark_compat, "SPARK_VERSION", (4, 1, 4))
    monkeypatch.setattr(spark_compat, "SPARK_VERSION_TEXT", "4.1.4")
    monkeypatch.setattr(spark_compat, "HAS_ADMISSION_CONTROL", False)


@pytest.mark.parametrize(
    ("version", "want"),
    [("4.1.4", (4, 1, 4)), ("4.2.0.dev1", (4, 2, 0)), ("4.3.0rc2", (4, 3, 0)), ("5", (5, 0, 0))],
)
def test_versions_are_read_as_numbers(version: str, want: tuple[int, int, int]) -> None:
    assert spark_compat._parse(version) == want


def test_on_spark_4_0_every_entry_point_spark_calls_names_both_versions(
    monkeypatch: pytest.MonkeyPatch, stream: Path, tmp_path: Path
) -> None:
    as_spark_4_0(monkeypatch)
    source = RowtimeDataSource({"path": str(stream)})
    schema = StructType(
        [
            StructField("p", IntegerType()),
            StructField("i", IntegerType()),
            StructField("rowtime", TimestampType()),
            StructField("is_bound", BooleanType()),
        ]
    )
    calls = {
        "schema()": source.schema,
        "reader()": lambda: source.reader(schema),
        "streamReader()": lambda: source.streamReader(schema),
        "streamWriter()": lambda: RowtimeDataSource({"path": str(tmp_path / "t")}).streamWriter(
            schema, False
        ),
    }
    for where, call in calls.items():
        with pytest.raises(SparkVersionError) as err:
            call()
        text = str(err.value)
        assert where in text and "needs Spark 4.1 or later" in text and "Spark 4.0.5" in text
    assert not (tmp_path / "t").exists()  # refused before the sink created anything


def test_on_spark_4_1_max_rows_per_batch_is_refused_naming_the_option_and_versions(
    monkeypatch: pytest.MonkeyPatch, stream: Path
) -> None:
    as_spark_4_1(monkeypatch)
    source = RowtimeDataSource({"path": str(stream), "maxRowsPerBatch": "30"})
    schema = source.schema()  # reading the schema needs no read limit
    with pytest.raises(OptionError) as err:  # also a SparkVersionError
        source.streamReader(schema)
    assert isinstance(err.value, SparkVersionError)
    text = str(err.value)
    for part in ("maxRowsPerBatch=30", "needs Spark 4.2 or later", "Spark 4.1.4", "availableNow"):
        assert part in text, text
    # a batch read ignores maxRowsPerBatch on every version: it is one step
    assert source.reader(schema).partitions()


def read_ids(reader: RowtimeStreamReader, start: dict, end: dict) -> list[tuple[int, int]]:
    out = []
    for part in reader.partitions(start, end):
        for batch in reader.read(part):
            table = pa.Table.from_batches([batch])
            rows = table.filter(pa.compute.invert(table.column("is_bound"))).to_pylist()
            out += [(r["p"], r["i"]) for r in rows]
    return sorted(out)


def test_spark_4_1_call_order_reads_the_whole_backlog_in_one_step_past_the_cap(
    stream: Path,
) -> None:
    """Spark 4.1 calls latestOffset() with no arguments, first (availableNow's target) before
    initialOffset(); no step cap applies, so the first answer covers every record."""
    source = RowtimeDataSource({"path": str(stream)})
    schema = source.schema()
    reader = source.streamReader(schema)
    assert isinstance(reader, RowtimeStreamReader)
    reader.step_records = 16  # far below the 200-record backlog

    end = reader.latestOffset()
    start = reader.initialOffset()
    assert read_ids(reader, start, end) == [(p, i) for p in (0, 1) for i in range(100)]
    assert reader.latestOffset() == end  # nothing more: the query is done

    # A restart: a new reader, told the checkpoint's last end by partitions(end, end) (Spark's
    # setLatestSeenOffset), then new records: exactly those are read, in one step again.
    for p in (0, 1):
        write(stream, p, 100, 100, 20)
    again = source.streamReader(schema)
    assert isinstance(again, RowtimeStreamReader)
    again.step_records = 16
    assert read_ids(again, end, end) == []
    new_end = again.latestOffset()
    assert read_ids(again, end, new_end) == [(p, i) for p in (0, 1) for i in range(100, 200)]


def test_spark_4_2_still_sees_admission_control_and_caps_steps(stream: Path) -> None:
    """pyspark 4.2+ gives a stream reader admission control when its latestOffset takes
    parameters (python_streaming_source_runner.check_support_func counts them): the defaults
    that let 4.1 call it bare must not hide them."""
    source = RowtimeDataSource({"path": str(stream)})
    reader = source.streamReader(source.schema())
    assert isinstance(reader, RowtimeStreamReader)
    assert len(inspect.signature(reader.latestOffset).parameters) == 2
    if not spark_compat.HAS_ADMISSION_CONTROL:
        pytest.skip(f"Spark {spark_compat.SPARK_VERSION_TEXT} has no admission control")
    assert isinstance(reader, spark_compat.SupportsTriggerAvailableNow)
    # the cap, and steps joined into micro-batches of micro_batch_records (planned 16 at a time)
    for most, joined in ((16, False), (48, True)):
        reader = source.streamReader(source.schema())
        assert isinstance(reader, RowtimeStreamReader)
        reader.step_records, reader.micro_batch_records = 16, most
        start = reader.initialOffset()
        seen: list[tuple[int, int]] = []
        sizes = []
        while (end := reader.latestOffset(start, spark_compat.ReadAllAvailable())) != start:
            ids = read_ids(reader, start, end)
            sizes.append(len(ids))
            seen += ids
            start = end
        assert sorted(seen) == [(p, i) for p in (0, 1) for i in range(100)]
        assert max(sizes) <= most and len(sizes) >= 200 // most
        assert (max(sizes) > 16) == joined


def test_the_sink_schema_is_utc_and_small_types_on_this_spark() -> None:
    schema = StructType(
        [
            StructField("s", StringType()),
            StructField("rowtime", TimestampType()),
            StructField("b", BinaryType()),
        ]
    )
    arrow = spark_compat.arrow_schema_utc(schema)
    assert arrow.field("rowtime").type == pa.timestamp("us", tz="UTC")
    assert arrow.field("s").type == pa.string() and arrow.field("b").type == pa.binary()


@pytest.mark.parametrize("idle", [False, True], ids=["reject", "idle.timeout"])
def test_a_joined_micro_batch_run_after_a_restart_gives_its_tasks_runs(
    stream: Path, idle: bool
) -> None:
    """A micro-batch joined of several steps that the reader did not plan (the query restarted
    between planning and running it) is planned again a step at a time: its tasks get the
    same runs as the planner that planned it (not a replay of the whole micro-batch, up to
    four steps in one task) and read the same rows. ``idle.timeout`` steps are planned as
    they are: their tasks replay, and read the same rows too."""
    options = {"order": "reject", **({"idle.timeout": "1h"} if idle else {})}
    source = RowtimeDataSource({"path": str(stream), **options})
    reader = source.streamReader(source.schema())
    assert isinstance(reader, RowtimeStreamReader)
    reader.step_records, reader.micro_batch_records = 16, 64
    start = reader.initialOffset()
    end = reader.latestOffset(start, spark_compat.ReadAllAvailable())
    planned = [p.task.runs for p in reader.partitions(start, end)]
    ids = read_ids(reader, start, end)
    assert (len(ids) > 16) != idle  # joined, but for idleness's steps
    restarted = source.streamReader(source.schema())
    assert isinstance(restarted, RowtimeStreamReader)
    restarted.step_records, restarted.micro_batch_records = 16, 64
    again = [p.task.runs for p in restarted.partitions(start, end)]
    if idle:
        assert all(r is None for r in again)
    else:
        assert all(r is not None for r in again)
        assert [(r.starts.tolist(), r.ends.tolist(), r.ordered) for r in again] == [
            (r.starts.tolist(), r.ends.tolist(), r.ordered) for r in planned
        ]
    assert read_ids(restarted, start, end) == ids

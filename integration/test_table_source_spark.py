"""Delta tables read back as rowtime streams: ``readStream.format("rowtime").option("table",
"delta")``, in real Spark, on tables written by this sink and by delta-rs' ``write_deltalake``.

Every result is checked against brute force: the rows the test wrote (read back with delta-rs
alone where the sink wrote them), once each, in rowtime order within a micro-batch, and the
windows counted by hand. Queries are driven to quiescence (``processAllAvailable``,
``availableNow``); nothing sleeps.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest
from helpers import Run, batch_reader, drain, plain, reader, start
from pyspark.sql import functions as F
from table_builders import delta_commit, delta_counts, make_delta_target, tumbling_counts

from pyspark_rowtime.api import create_stream, open_writer
from pyspark_rowtime.watermark import with_watermark

deltalake = pytest.importorskip("deltalake", reason="the delta extra is not installed")
pytest.importorskip("pyiceberg.catalog", reason="the iceberg extra is not installed")

#: An embedded Iceberg catalog (SQL on SQLite) named ``hops``, configured as users configure
#: pyiceberg, through its environment variables, set at collection, before Spark starts, so
#: that the JVM and the Python workers it starts inherit them.
_ICEBERG_ROOT = Path(tempfile.mkdtemp(prefix="rowtime-hops-"))
(_ICEBERG_ROOT / "warehouse").mkdir()
os.environ["PYICEBERG_CATALOG__HOPS__URI"] = f"sqlite:///{_ICEBERG_ROOT}/catalog.db"
os.environ["PYICEBERG_CATALOG__HOPS__WAREHOUSE"] = f"file://{_ICEBERG_ROOT}/warehouse"

MINUTE_US = 60_000_000
HOUR_US = 60 * MINUTE_US
T0_US = 1_700_000_000_000_000 - 1_700_000_000_000_000 % HOUR_US  # 2023-11-14T22:00:00Z
UTC_US = pa.timestamp("us", tz="UTC")


def at(us: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=us)


def sink_to_delta(spark, src: Path, table: str, checkpoint: Path) -> None:  # type: ignore[no-untyped-def]
    """Hop 1: the stream at ``src`` into the Delta table, everything available now."""
    (
        reader(spark, src)
        .writeStream.format("rowtime")
        .option("checkpointLocation", str(checkpoint))
        .option("target", "delta")
        .trigger(availableNow=True)
        .start(table)
        .awaitTermination()
    )


@pytest.mark.connect("the table reader started from a Connect client (the same code in the server)")
def test_a_two_hop_pipeline_closes_its_last_windows_when_the_source_goes_quiet(spark, workdir):
    # stream -> sink -> Delta -> the table read as a stream -> windowed counts. The source's
    # last rows are followed by a bound only: nothing new arrives downstream but the table's
    # clock, and that must close the last windows.
    src, table, out = workdir / "src", str(workdir / "table"), str(workdir / "counts")
    create_stream(src, "id BIGINT", partitions=2)
    times = [T0_US + i * 7 * MINUTE_US for i in range(30)]  # 3.5 hours of rows
    with open_writer(src, partition=0) as w0, open_writer(src, partition=1) as w1:
        for i, t in enumerate(times):
            (w0 if i % 2 else w1).insert({"id": i}, rowtime=at(t))
        # the source is complete up to here: every window closes (with_watermark keeps the
        # watermark 1 ms below the bound, so the bound passes the last window's end)
        last = T0_US + 4 * HOUR_US + MINUTE_US
        w0.set_rowtime_bound(at(last))
        w1.set_rowtime_bound(at(last))
    sink_to_delta(spark, src, table, workdir / "ck1")
    assert deltalake.DeltaTable(table).transaction_version("rowtime.clock") == last

    df = with_watermark(reader(spark, table, table="delta"))
    counts = (
        df.groupBy(F.window("rowtime", "1 hour"))
        .agg(F.count("*").alias("n"))
        .select(F.col("window.end").alias("rowtime"), "n")
    )
    (
        counts.writeStream.format("rowtime")
        .option("checkpointLocation", str(workdir / "ck2"))
        .option("target", "delta")
        .trigger(availableNow=True)
        .start(out)
        .awaitTermination()
    )
    expected = tumbling_counts(times, HOUR_US)
    assert delta_counts(out) == expected
    # the last window (ending at T0 + 4 h) is in: only the clock closed it
    assert expected[-1][0] == T0_US + 4 * HOUR_US
    # the counts' table keeps the watermark as its clock: the bound, less with_watermark's 1 ms
    assert deltalake.DeltaTable(out).transaction_version("rowtime.clock") == last - 1000


def test_a_table_written_by_delta_rs_reads_in_rowtime_order_within_each_version(spark, workdir):
    # Another writer's table: no rowtime column, no clock; rowtime.column names the time.
    path = str(workdir / "other")
    versions = [
        [(1, 30), (2, 10), (3, 20)],  # one commit, rows out of order
        [(4, 40), (5, 35)],
        [(6, 50)],
    ]
    for rows in versions:
        data = pa.table(
            {
                "id": pa.array([i for i, _ in rows], pa.int64()),
                "ts": pa.array([T0_US + m * MINUTE_US for _, m in rows], UTC_US),
                "part": pa.array(["a" if i % 2 else "b" for i, _ in rows]),
            }
        )
        deltalake.write_deltalake(path, data, mode="append", partition_by=["part"])
    run = Run()
    q = start(reader(spark, path, table="delta", **{"rowtime.column": "ts"}), workdir / "ck", run)
    drain(q, run)
    q.stop()
    by_batch = [[r for r in rows if not r["is_bound"]] for _, rows in run.batches]
    rows = [r for b in by_batch for r in b]
    assert sorted(r["id"] for r in rows) == [1, 2, 3, 4, 5, 6]
    for b in by_batch:  # each micro-batch in rowtime order
        assert [r["rowtime"] for r in b] == sorted(r["rowtime"] for r in b)
    assert all(r["rowtime"] == r["ts"] for r in rows)
    assert set(rows[0]) == {"id", "ts", "part", "rowtime", "is_bound"}

    # a batch read of the same history, under the same policy: the same rows
    batch = plain(batch_reader(spark, path, table="delta", **{"rowtime.column": "ts"}))
    assert sorted(r["id"] for r in batch if not r["is_bound"]) == [1, 2, 3, 4, 5, 6]


def test_a_compaction_between_micro_batches_reads_as_nothing(spark, workdir):
    src, table = workdir / "src", str(workdir / "table")
    create_stream(src, "id BIGINT")
    run = Run()
    query = None
    expected = []
    for step in range(3):
        with open_writer(src) as w:
            for i in range(10):
                n = step * 10 + i
                w.insert({"id": n}, rowtime=at(T0_US + n * MINUTE_US))
                expected.append(n)
            w.set_rowtime_bound(at(T0_US + (step + 1) * 10 * MINUTE_US))
        sink_to_delta(spark, src, table, workdir / "ck1")
        if step == 1:
            t = deltalake.DeltaTable(table)
            t.optimize.compact()
            t.create_checkpoint()
        if query is None:
            query = start(reader(spark, table, table="delta"), workdir / "ck2", run)
        drain(query, run)
    assert query is not None
    query.stop()
    assert sorted(r["id"] for r in run.rows) == expected  # once each: the compaction adds none
    assert run.bounds[-1] == T0_US + 30 * MINUTE_US


def test_a_replay_from_the_checkpoint_reads_the_same_rows_into_the_same_micro_batch(spark, workdir):
    # a table laid out as the sink lays it out, four commits of rows in no order, each
    # moving the clock to the end of its rows
    table = make_delta_target(workdir / "table")
    for batch in range(4):
        rows = [(n, T0_US + (n * 37 % 10 + batch * 10) * MINUTE_US) for n in range(10)]
        delta_commit(table, rows, T0_US + (batch + 1) * 10 * MINUTE_US, batch)
    run = Run()
    df = reader(spark, table, table="delta", maxRowsPerBatch="7")
    q = start(df, workdir / "ck2", run, available_now=True)
    q.awaitTermination()
    first = run.batches
    assert len(first) >= 3
    # forget that the last micro-batch ran: Spark replays it from the offsets it kept
    last_id = first[-1][0]
    os.remove(workdir / "ck2" / "commits" / str(last_id))
    again = Run()
    q = start(df, workdir / "ck2", again, available_now=True)
    q.awaitTermination()
    replayed = [b for b in again.batches if b[0] == last_id]
    assert replayed and replayed[0][1] == first[-1][1]
    offsets = (workdir / "ck2" / "offsets" / str(last_id)).read_text().splitlines()
    assert json.loads(offsets[-1])["table"]["version"] >= 1


def test_three_hops_through_delta_and_iceberg_close_their_last_windows(spark, workdir):
    # stream -> Delta -> 10-minute counts -> Iceberg -> hourly sums. The source's rows end
    # at T0 + 2 h and its bound says nothing before T0 + 3 h 1 min follows: every clock
    # downstream follows from that one bound, and the last hour closes with no row after it.
    src, delta = workdir / "src", str(workdir / "raw")
    iceberg = f"iceberg://hops/rt_{workdir.name.replace('-', '_')[-40:]}.counts"
    create_stream(src, "id BIGINT")
    times = [T0_US + i * 4 * MINUTE_US for i in range(30)]  # 10:00 to 11:56
    bound = T0_US + 3 * HOUR_US + MINUTE_US
    with open_writer(src) as w:
        for i, t in enumerate(times):
            w.insert({"id": i}, rowtime=at(t))
        w.set_rowtime_bound(at(bound))
    sink_to_delta(spark, src, delta, workdir / "ck1")

    counts = (
        with_watermark(reader(spark, delta, table="delta"))
        .groupBy(F.window("rowtime", "10 minutes"))
        .agg(F.count("*").alias("n"))
        .select(F.col("window.end").alias("rowtime"), "n")
    )
    (
        counts.writeStream.format("rowtime")
        .option("checkpointLocation", str(workdir / "ck2"))
        .option("target", "iceberg")
        .trigger(availableNow=True)
        .start(iceberg)
        .awaitTermination()
    )
    sums = (
        with_watermark(reader(spark, iceberg))
        .groupBy(F.window("rowtime", "1 hour"))
        .agg(F.sum("n").alias("total"))
        .select(F.col("window.end").alias("end"), "total")
    )
    run = Run()
    q = start(sums, workdir / "ck3", run, available_now=True)
    q.awaitTermination()
    # brute force: each row's 10-minute window end, then the hour that end falls in
    expected: dict[int, int] = {}
    for t in times:
        end10 = t - t % (10 * MINUTE_US) + 10 * MINUTE_US
        hour_end = end10 - end10 % HOUR_US + HOUR_US
        expected[hour_end] = expected.get(hour_end, 0) + 1
    got = sorted((r["end"], r["total"]) for r in run.records)
    assert got == sorted(expected.items())
    assert max(expected) == T0_US + 3 * HOUR_US  # the hour [2 h, 3 h): closed by clocks alone


#: Why CI reads each table library on one object store (the other in ./dev long).
ONE_STORE_A_LIBRARY = (
    "CI reads a Delta table on S3 and an Iceberg table on Azure Blob: each library and each "
    "store once"
)


@pytest.mark.long_cases(
    "az",
    why=ONE_STORE_A_LIBRARY,
)
@pytest.mark.classic_only("the store does not depend on the mode; classic runs it")
def test_a_delta_table_on_object_storage_is_read_by_spark(spark, workdir, object_server):
    # moto's S3 and Azurite: delta-rs writes the table there; one query to quiescence reads
    # it through delta-rs' object store, with the variables the servers set
    path = object_server.url(f"delta-{workdir.name}")
    for rows in ([(1, 20), (2, 10)], [(3, 30)]):
        data = pa.table(
            {
                "id": pa.array([i for i, _ in rows], pa.int64()),
                "ts": pa.array([T0_US + m * MINUTE_US for _, m in rows], UTC_US),
            }
        )
        deltalake.write_deltalake(path, data, mode="append")
    run = Run()
    df = reader(
        spark, path, table="delta", **{"rowtime.column": "ts", "bounds.lateness": "5 minutes"}
    )
    start(df, workdir / "ck", run, available_now=True).awaitTermination()
    # rows 2 and 1 are released by the bound after version 1 (30 - 5 minutes); 3 is held
    assert [r["id"] for r in run.rows] == [2, 1]
    assert run.bounds[-1] == T0_US + 25 * MINUTE_US


@pytest.mark.long_cases(
    "s3",
    why=ONE_STORE_A_LIBRARY,
)
@pytest.mark.classic_only("the store does not depend on the mode; classic runs it")
def test_an_iceberg_table_on_object_storage_is_read_by_spark(spark, workdir, object_server):
    # pyiceberg writes the table into a warehouse on moto's S3 or on Azurite (a SQLite
    # catalog beside the test); the reader resolves the catalog from its iceberg.<property>
    # options, as the sink does, and reads the data files through pyiceberg's file IO there
    from pyiceberg.catalog import load_catalog
    from table_helpers import iceberg_props

    warehouse = object_server.url(f"iceberg-{workdir.name}").replace("az://", "abfs://", 1)
    props = iceberg_props(f"sqlite:///{workdir}/catalog.db", warehouse)
    catalog = load_catalog("store", **props)
    catalog.create_namespace("ns")
    schema = pa.schema([("id", pa.int64()), ("ts", UTC_US)])
    table = catalog.create_table("ns.events", schema=schema)
    for rows in ([(1, 20), (2, 10)], [(3, 30)]):
        table.append(
            pa.table(
                {
                    "id": pa.array([i for i, _ in rows], pa.int64()),
                    "ts": pa.array([T0_US + m * MINUTE_US for _, m in rows], UTC_US),
                },
                schema=schema,
            )
        )
    options = {f"iceberg.{k}": v for k, v in props.items()}
    run = Run()
    df = reader(
        spark,
        "iceberg://store/ns.events",
        **options,
        **{"rowtime.column": "ts", "bounds.lateness": "5 minutes"},
    )
    start(df, workdir / "ck", run, available_now=True).awaitTermination()
    # as for Delta: rows 2 and 1 are released by the bound after the second snapshot (30 - 5
    # minutes); 3 is held
    assert [r["id"] for r in run.rows] == [2, 1]
    assert run.bounds[-1] == T0_US + 25 * MINUTE_US

"""The Spark reader on Redis only: streams written by ordinary XADD clients, a password that
stays out of Spark's plan strings, and a server restart in the middle of a stream.

The reader tests shared with the embedded log run on both backends (``stream_at`` in
test_reader.py); these are what only Redis has."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from pyspark.sql import SparkSession
from redis_server import RedisServer, redis_server
from test_reader import BASE_US, US, Run, at, batch_reader, drain, plain, reader, start

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.streams.redis import register_external

SECRET = "Spark-Plan-Secret-9"


def test_a_stream_written_by_xadd_clients_reads_through_spark(
    spark: SparkSession, redis_for_tests: Any, tmp_path: Path
) -> None:
    r = redis_for_tests.client()
    key = "orders-from-a-shop"
    r.delete(key)
    r.xadd(key, {"sym": "ORCL", "qty": "5", "ts": "2023-11-14T22:13:21Z"})
    bad = r.xadd(key, {"sym": "MSFT", "qty": "five", "ts": "2023-11-14T22:13:22Z"}).decode()
    r.xadd(key, {"sym": "IBM", "qty": "7", "ts": "1700000003000"})  # epoch ms in a field
    url = redis_for_tests.url("shop")
    s = register_external(url, "sym STRING, qty INT", [key], rowtime_field="ts")
    rows = plain(batch_reader(spark, url))
    assert [(x["sym"], x["qty"], x["rowtime"]) for x in rows if not x["is_bound"]] == [
        ("ORCL", 5, BASE_US + 1 * US),
        ("IBM", 7, BASE_US + 3 * US),
    ]
    assert [b.entry_id for b in s.bad_entries(0)] == [bad]

    run = Run()
    q = start(reader(spark, url), tmp_path / "ck", run)
    try:
        drain(q, run)
        r.xadd(key, {"sym": "SAP", "qty": "1", "ts": "2023-11-14T22:13:25Z"})
        drain(q, run)
    finally:
        q.stop()
    assert [x["sym"] for x in run.rows] == ["ORCL", "IBM", "SAP"]
    assert run.bounds[-1] == BASE_US + 5 * US


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with redis_server(tmp_path_factory.mktemp("redis-plan"), password=SECRET) as s:
        yield s


def test_the_password_stays_out_of_spark_plans(
    spark: SparkSession, secured: RedisServer, tmp_path: Path
) -> None:
    url = secured.url("planned")
    pr.create_stream(url, "id INT")
    with pr.open_writer(url, 0) as w:
        w.insert({"id": 1}, rowtime=at(BASE_US))
        w.end_stream()
    batch = batch_reader(spark, url)._jdf.queryExecution()
    texts = [batch.toString(), batch.simpleString()]
    run = Run()
    q = start(reader(spark, url), tmp_path / "ck", run)
    try:
        drain(q, run)
        texts += [q._jsq.explainInternal(True), str(q.lastProgress), str(q.recentProgress)]
    finally:
        q.stop()
    assert [x["id"] for x in run.rows] == [1] and run.bounds == [END_OF_STREAM_US]
    assert all(SECRET not in t for t in texts), [t for t in texts if SECRET in t]
    assert [x["id"] for x in plain(batch_reader(spark, url))] == [1, None]
    bad = url.replace(SECRET, "not-" + SECRET)
    with pytest.raises(Exception) as info:
        batch_reader(spark, bad).collect()
    assert SECRET not in str(info.value) and "credentials" in str(info.value)


def test_the_password_stays_out_of_a_redis_sinks_plans_and_progress(
    spark: SparkSession, secured: RedisServer, tmp_path: Path
) -> None:
    source, target = secured.url("sink_in"), secured.url("sink_out")
    pr.create_stream(source, "id INT")
    with pr.open_writer(source, 0) as w:
        w.insert({"id": 7}, rowtime=at(BASE_US))
        w.end_stream()
    q = (
        reader(spark, source)
        .writeStream.format("rowtime")
        .option("path", target)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        q.processAllAvailable()
        texts = [q._jsq.explainInternal(True), str(q.lastProgress), str(q.recentProgress)]
    finally:
        q.stop()
    written = pr.read_stream(target).column("id").to_pylist()
    assert [v for v in written if v is not None] == [7]  # it did write (bound records: None)
    assert pr.get_rowtime_bound(target) is not None
    assert all(SECRET not in t for t in texts), [t for t in texts if SECRET in t]


def test_a_server_restart_mid_stream_loses_and_repeats_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    with redis_server(tmp_path / "redis", appendonly=True) as server:
        url = server.url("restart") + "?retries=20&backoff=20ms&backoff_cap=500ms"
        pr.create_stream(url, "i INT")

        def write(first: int, n: int, end: bool = False) -> None:
            with pr.open_writer(url, 0) as w:
                for i in range(first, first + n):
                    w.insert({"i": i}, rowtime=at(BASE_US + i * US))
                if end:
                    w.end_stream()

        run = Run()
        write(0, 10)
        q = start(reader(spark, url, maxRowsPerBatch=4), tmp_path / "ck", run)
        try:
            drain(q, run)
        finally:
            q.stop()
        server.kill()  # a crash; appendfsync always: every acknowledged run comes back
        server.restart()
        write(10, 10, end=True)
        q = start(reader(spark, url, maxRowsPerBatch=4), tmp_path / "ck", run)
        try:
            drain(q, run)
        finally:
            q.stop()
    assert [x["i"] for x in run.rows] == list(range(20))
    assert run.bounds[-1] == END_OF_STREAM_US


def test_a_query_fails_clearly_while_the_server_is_down_and_resumes_exactly_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Source and sink target on a Redis server that crashes while the query runs: the query
    fails naming the location (never its password), and restarted from its checkpoint once
    the server is back its target holds every row once (issue 12, item 4)."""
    from pyspark.errors import StreamingQueryException

    settings = "?connect_timeout=200ms&socket_timeout=2s&retries=2&backoff=20ms"
    with redis_server(tmp_path / "redis", password=SECRET, appendonly=True) as server:
        src, out = server.url("src") + settings, server.url("out") + settings
        pr.create_stream(src, "i INT")

        def write(first: int, n: int, end: bool = False) -> None:
            with pr.open_writer(src, 0) as w:
                for i in range(first, first + n):
                    w.insert({"i": i}, rowtime=at(BASE_US + i * US))
                w.set_rowtime_bound(at(BASE_US + (first + n) * US))
                if end:
                    w.end_stream()

        def query(**trigger: bool) -> Any:
            df = spark.readStream.format("rowtime").option("maxRowsPerBatch", 4).load(src)
            writer = df.writeStream.format("rowtime").option("checkpointLocation", str(tmp_path))
            return (writer.trigger(**trigger) if trigger else writer).start(out)

        write(0, 10)
        q = query()
        try:
            q.processAllAvailable()
            server.kill()  # a crash while the query polls for new records
            with pytest.raises(StreamingQueryException) as info:
                q.awaitTermination(180)
                pytest.fail("the query went on without its server")
        finally:
            q.stop()
        text = str(info.value)
        assert "did not answer" in text and "redis://:***@127.0.0.1" in text
        assert SECRET not in text

        server.restart()
        write(10, 10, end=True)
        q = query(availableNow=True)
        try:
            q.awaitTermination()
        finally:
            q.stop()
        t = pr.read_stream(out)
        rows = t.filter(pc.invert(t.column("is_bound")))
        assert sorted(rows.column("i").to_pylist()) == list(range(20))  # once each
        assert pr.get_rowtime_bound(out) == pr.get_rowtime_bound(src)

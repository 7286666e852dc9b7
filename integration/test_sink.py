"""``writeStream.format("rowtime")`` in real Spark: targets, the clock, chains (SPEC 8).

Queries are driven to quiescence with ``processAllAvailable()`` or ``availableNow``; nothing
sleeps. No two queries here run batches at the same time: Spark 4.3 can fail a micro-batch
with "Task not serializable: Illegal size N of collection" when two queries over Python data
sources serialize their jobs at the same moment (a race inside the JVM, seen while developing
the crash test; not this sink's doing).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest
from helpers import CONNECT
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from pyspark_rowtime.api import create_stream, get_rowtime_bound, open_writer, read_stream
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.sink.parquet_target import COMPLETE_MARKER, parquet_clock_us, partition_name
from pyspark_rowtime.streams.storage import open_stream
from pyspark_rowtime.watermark import with_watermark

MINUTE_US = 60_000_000
HOUR_US = 60 * MINUTE_US
T0_US = 1_700_000_000_000_000 - 1_700_000_000_000_000 % HOUR_US  # 2023-11-14T22:00:00Z


def at(us: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=us)


def stream_clock(path: Path | str) -> int | None:
    return open_stream(path).stream_clock_us()


def data_of(path: Path) -> list[tuple]:
    """(rowtime_us, payload...) of the data rows of a stream, in log order."""
    t = read_stream(path)
    names = [n for n in t.column_names if n not in ("partition", "offset", "arrival", "is_bound")]
    rows = t.filter(pa.compute.invert(t.column("is_bound"))).select(names)
    rows = rows.set_column(0, "rowtime", rows.column("rowtime").cast(pa.int64()))
    return [tuple(r.values()) for r in rows.to_pylist()]


def bounds_of(path: Path) -> list[int]:
    t = read_stream(path)
    t = t.filter(t.column("is_bound"))
    return t.column("rowtime").cast(pa.int64()).to_pylist()


def assert_passed_through(path: Path, expected: list[tuple]) -> None:
    """The target of a pass-through from a 2-partition source whose rows are tagged p0 / p1:
    every row once with its rowtime, and partition p of the target holds the rows of
    partition p of the source, its records (rows and bounds) in rowtime order."""
    assert sorted(data_of(path)) == sorted(expected)
    assert open_stream(path).meta.partitions == 2
    t = read_stream(path)
    for p in range(2):
        part = t.filter(pa.compute.equal(t.column("partition"), p))
        data = part.filter(pa.compute.invert(part.column("is_bound")))
        assert set(data.column("tag").to_pylist()) == {f"p{p}"}
        times = part.column("rowtime").cast(pa.int64()).to_pylist()
        assert times == sorted(times)


def start(df, path: Path | str, checkpoint: Path, **options: str):  # type: ignore[no-untyped-def]
    writer = df.writeStream.format("rowtime").option("checkpointLocation", str(checkpoint))
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer.start(str(path))


def fail_at_start(df, workdir: Path, **options: str) -> str:  # type: ignore[no-untyped-def]
    query = start(df, workdir / "never", workdir / "ck-never", **options)
    with pytest.raises(StreamingQueryException) as e:
        query.awaitTermination()
    assert query.lastProgress is None  # failed before running a batch
    return str(e.value)


# -- start ---------------------------------------------------------------------------------------


@pytest.mark.connect("an error raised in the server's Python reaches the client whole")
def test_a_query_without_rowtime_fails_at_start_naming_the_column(spark, workdir):
    create_stream(workdir / "src", "id BIGINT")
    df = spark.readStream.format("rowtime").load(str(workdir / "src"))
    message = fail_at_start(df.select("id", F.col("rowtime").alias("ts")), workdir)
    assert "needs a column named rowtime" in message and "id, ts" in message
    assert not (workdir / "never").exists()


@pytest.mark.connect("an error raised in the server's Python reaches the client whole")
def test_unknown_sink_options_fail_at_start_naming_them(spark, workdir):
    create_stream(workdir / "src", "id BIGINT")
    df = spark.readStream.format("rowtime").load(str(workdir / "src"))
    message = fail_at_start(df, workdir, granularty="day")
    assert "unknown option 'granularty'" in message and "the sink accepts" in message


# -- pass-through: the clock follows the source's bounds, batch by batch ------------------------

#: Targets: a stream in a folder, Parquet files, a stream on Redis, a stream on S3 (moto's
#: server): the same test for each. Under Spark Connect the two kinds of target only: the
#: backend below a stream does not depend on the mode.
TARGETS = ["stream", "parquet"] if CONNECT else ["stream", "parquet", "redis", "s3"]


def target_at(request, workdir: Path, target: str) -> tuple[Path | str, str]:  # type: ignore[no-untyped-def]
    """Where the test's target goes and its option ``target``."""
    if target == "redis":
        return request.getfixturevalue("redis_for_tests").url(f"out-{workdir.name}"), "stream"
    if target == "s3":
        return request.getfixturevalue("s3_server").url(f"out-{workdir.name}"), "stream"
    return workdir / "out", target


@pytest.mark.connect("one pass of each sink target, started from the client")
@pytest.mark.spark_subset
@pytest.mark.parametrize("target", TARGETS)
def test_pass_through_clock_follows_the_source_bounds_without_waiting(
    spark, workdir, target, request
):
    src = workdir / "src"
    out, target = target_at(request, workdir, target)
    create_stream(src, "id BIGINT, name STRING")
    df = spark.readStream.format("rowtime").load(str(src))
    # filter and project, keeping the bound records (their payload is null)
    projected = df.where("is_bound OR id % 2 = 0").select(
        (F.col("id") * 10).alias("id10"), "name", "rowtime", "is_bound"
    )
    query = start(projected, out, workdir / "ck", target=target)
    expected = []
    next_id = 0
    with open_writer(src) as w:
        for _step in range(3):
            for _ in range(20):
                t = T0_US + next_id * 5 * MINUTE_US  # 20 rows span 100 minutes
                w.insert({"id": next_id, "name": f"n{next_id}"}, rowtime=at(t))
                if next_id % 2 == 0:
                    expected.append((t, next_id * 10, f"n{next_id}"))
                next_id += 1
            bound = T0_US + next_id * 5 * MINUTE_US - MINUTE_US
            w.set_rowtime_bound(at(bound))
            w.flush()
            query.processAllAvailable()
            # the batch that carried the bound moved the clock: no later batch was needed
            assert stream_clock(src) == bound
            if target == "stream":
                assert stream_clock(out) == bound
                assert data_of(out) == expected
                assert bounds_of(out)[-1] == bound
            else:
                assert parquet_clock_us(str(out)) == bound
                # every hour that ended by the clock is marked complete, and no other
                for key in range(T0_US // HOUR_US, bound // HOUR_US + 2):
                    folder = out / partition_name(key, "hour")
                    if folder.exists():
                        complete = (folder / COMPLETE_MARKER).exists()
                        assert complete == ((key + 1) * HOUR_US <= bound)
    query.stop()
    if target == "parquet":
        files = spark.read.parquet(str(out))
        assert sorted(files.columns) == ["id10", "name", "rowtime", "rowtime_hour"]
        got = sorted(
            (int(r.rowtime.timestamp() * 1_000_000), r.id10, r.name)
            for r in files.select("rowtime", "id10", "name").collect()
        )
        assert got == expected
    assert get_rowtime_bound(out) == at(bound)


# -- a windowed aggregation: the clock is the watermark each batch ran with ---------------------


@pytest.mark.long_cases(
    "redis",
    "s3",
    why=(
        "the clock is the sink's over any stream target; on Redis and S3 in CI the pass-"
        "through and chain tests write it"
    ),
)
@pytest.mark.spark_subset
@pytest.mark.parametrize("target", TARGETS)
def test_windowed_aggregation_clock_covers_every_window_written_and_no_more(
    spark, workdir, target, request
):
    src = workdir / "src"
    out, target = target_at(request, workdir, target)
    create_stream(src, "id BIGINT")
    df = with_watermark(spark.readStream.format("rowtime").load(str(src)))
    windows = (
        df.groupBy(F.window("rowtime", "10 minutes"))
        .agg(F.count("*").alias("n"), F.sum("id").alias("total"))
        .select(F.col("window.end").alias("rowtime"), "n", "total")
    )
    query = start(windows, out, workdir / "ck", target=target)
    counts: dict[int, int] = {}  # window end -> rows

    def written() -> dict[int, int]:
        if target == "stream":
            return {t: n for t, n, _total in data_of(out)}
        if not any(out.glob("rowtime_hour=*")):
            return {}
        return {
            int(r.rowtime.timestamp() * 1_000_000): r.n
            for r in spark.read.parquet(str(out)).collect()
        }

    def check() -> int:
        query.processAllAvailable()
        clock = stream_clock(out) if target == "stream" else parquet_clock_us(str(out))
        if clock is None:
            assert not written()
            return -1
        # every window that ended by the clock is written, none that ends after it
        assert written() == {end: n for end, n in counts.items() if end <= clock}
        return clock

    def insert(w, minutes: range) -> None:  # type: ignore[no-untyped-def]
        for i in minutes:  # one row a minute: windows end at +10, +20, +30 minutes
            t = T0_US + i * MINUTE_US + 7
            w.insert({"id": i}, rowtime=at(t))
            end = (t // (10 * MINUTE_US) + 1) * 10 * MINUTE_US
            counts[end] = counts.get(end, 0) + 1
        w.flush()

    with open_writer(src) as w:
        insert(w, range(25))  # the source's clock: its last row, 24 minutes in
        first = check()
        assert first >= T0_US + 20 * MINUTE_US  # the windows the clock closed are written ...
        assert first < T0_US + 30 * MINUTE_US  # ... and the open one is not claimed
        insert(w, range(25, 30))
        assert check() < T0_US + 30 * MINUTE_US
        # the source goes quiet: only bounds from here on
        w.set_rowtime_bound(at(T0_US + 29 * MINUTE_US + 30_000_000))
        w.flush()
        assert check() < T0_US + 30 * MINUTE_US
        w.set_rowtime_bound(at(T0_US + 31 * MINUTE_US))
        w.flush()
        assert check() >= T0_US + 30 * MINUTE_US  # written, and covered by the clock
        w.end_stream()
    assert check() == END_OF_STREAM_US
    query.stop()
    assert written() == counts
    if target == "parquet":
        assert all((p / COMPLETE_MARKER).exists() for p in out.glob("rowtime_hour=*"))
    else:  # results of Spark's shuffle tasks (2 here): one stream in rowtime order
        assert open_stream(out).meta.partitions == 1
        times = [t for t, _n, _total in data_of(out)]
        assert times == sorted(times)


def test_a_pass_through_with_the_watermark_clock_keeps_a_partition_per_task(spark, workdir):
    """Spark's own Parquet source has no ``is_bound``, so the clock is the watermark; a query
    that keeps no state gets a partition per write task, each in rowtime order, and its tasks'
    runs are linked: the driver copies no row (issue 35)."""
    import pyarrow.parquet as pq

    from pyspark_rowtime.sink.layout import FolderSinkState

    src = workdir / "files"
    src.mkdir()
    expected = []
    for f in range(2):  # two files: two read tasks, whose rows interleave in rowtime
        times = [T0_US + (2 * i + f) * 1_000_000 for i in range(50)]
        ids = [2 * i + f for i in range(50)]
        expected += list(zip(times, ids, strict=True))
        table = pa.table({"id": ids, "rowtime": pa.array(times, pa.timestamp("us", tz="UTC"))})
        pq.write_table(table, src / f"part-{f}.parquet")
    df = spark.readStream.schema("id BIGINT, rowtime TIMESTAMP").parquet(str(src))
    out = workdir / "out"
    query = start(df.withWatermark("rowtime", "1 second"), out, workdir / "ck")
    query.processAllAvailable()
    query.stop()
    assert sorted(data_of(out)) == sorted(expected)
    assert open_stream(out).meta.partitions == 2
    t = read_stream(out)
    for p in range(2):
        times = t.filter(pa.compute.equal(t.column("partition"), p)).column("rowtime")
        assert times.cast(pa.int64()).to_pylist() == sorted(times.cast(pa.int64()).to_pylist())
    state = FolderSinkState(str(out))
    parts = [part for batch in state.batches() for part in state.entry(batch)["parts"]]
    assert parts and all(part["mode"] == "link" for part in parts if part["rows"])


# -- chains: A -> query -> B -> query -> C ------------------------------------------------------


@pytest.mark.long_cases(
    "s3",
    why=(
        "CI runs the chain on the folder and on Redis; S3's reads and commits under Spark"
        " are test_objstore_spark.py's"
    ),
)
def test_a_chain_of_streams_carries_rows_and_bounds_in_order(spark, workdir, stream_at):
    a, b, c = stream_at("a"), stream_at("b"), stream_at("c")
    create_stream(a, "id BIGINT, tag STRING", partitions=2)
    names = {a: "a", b: "b", c: "c"}

    def hop(source: str, target: str, batch_rows: int) -> None:
        """Run the query source -> target until it has read everything (availableNow)."""
        df = spark.readStream.format("rowtime").option("maxRowsPerBatch", batch_rows)
        writer = df.load(str(source)).writeStream.format("rowtime").trigger(availableNow=True)
        checkpoint = workdir / f"ck-{names[source]}{names[target]}"
        writer.option("checkpointLocation", str(checkpoint)).start(str(target)).awaitTermination()

    expected = []
    next_id = 0
    # two rounds, each hop resuming from its checkpoint, then the end of stream: every round
    # is five to eight micro-batches of queries that each cost seconds, on three backends
    for _step in range(2):
        for p in range(2):
            with open_writer(a, partition=p) as w:
                for _ in range(6):
                    t = T0_US + next_id * 1_000_000 + p
                    w.insert({"id": next_id, "tag": f"p{p}"}, rowtime=at(t))
                    expected.append((t, next_id, f"p{p}"))
                    next_id += 1
                w.set_rowtime_bound(at(T0_US + next_id * 1_000_000))
        hop(a, b, 7)
        hop(b, c, 5)
        assert stream_clock(c) == stream_clock(b) == stream_clock(a)
    for p in range(2):
        with open_writer(a, partition=p) as w:
            w.end_stream()
    hop(a, b, 7)
    hop(b, c, 5)
    for path in (b, c):
        assert_passed_through(path, expected)
    # the bounds passed on: each hop ended with the same clock at A, B and C (checked above),
    # and the end of stream reached C through B
    assert stream_clock(c) == END_OF_STREAM_US
    assert max(bounds_of(b)) == max(bounds_of(c)) == END_OF_STREAM_US


# -- executors in separate processes: they stage, the driver links ------------------------------

CLUSTER_SCENARIO = """
import json
for name, options in (("b", {}), ("pq", {"target": "parquet", "granularity": "minute"})):
    q = (
        spark.readStream.format("rowtime").option("maxRowsPerBatch", 40).load(source)
        .writeStream.format("rowtime").options(**options)
        .option("checkpointLocation", work + "/ck-" + name)
        .trigger(availableNow=True).start(work + "/" + name)
    )
    q.awaitTermination()
executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
print("RESULT " + json.dumps({"executors": executors}))
spark.stop()
"""


@pytest.mark.classic_only("runs its own local-cluster Spark (classic) in a child process")
@pytest.mark.long_cases(
    why="integration/test_executor_lost.py runs the same two queries (a stream target in a "
    "folder, a Parquet target) in local-cluster[2,1,1024], an executor lost in each, and checks "
    "that the committed parts were linked, not copied"
)
def test_in_local_cluster_executors_stage_segments_and_the_driver_links_them(workdir):
    import json

    import pyarrow.dataset as ds
    from helpers import run_in_local_cluster

    from pyspark_rowtime.sink.layout import FolderSinkState

    source = workdir / "a"
    create_stream(source, "id BIGINT, tag STRING", partitions=2)
    expected = []
    for p in range(2):
        with open_writer(source, partition=p) as w:
            for i in range(150):
                t = T0_US + i * 1_000_000 + p
                w.insert({"id": 2 * i + p, "tag": f"p{p}"}, rowtime=at(t))
                expected.append((t, 2 * i + p, f"p{p}"))
                if i % 50 == 49:
                    w.set_rowtime_bound(at(t))
            w.end_stream()
    code = f"source, work = {str(source)!r}, {str(workdir)!r}\n" + CLUSTER_SCENARIO
    stdout = run_in_local_cluster(code)
    line = next(x for x in stdout.splitlines() if x.startswith("RESULT "))
    assert json.loads(line[len("RESULT ") :])["executors"] == 2

    b = workdir / "b"
    assert_passed_through(b, expected)
    assert stream_clock(b) == END_OF_STREAM_US
    state = FolderSinkState(str(b))
    entries = [state.entry(batch) for batch in state.batches()]
    assert len(entries) >= 4  # 300 rows, 40 a batch
    data_parts = [part for e in entries for part in e["parts"] if part["rows"]]
    assert data_parts and all(part["mode"] == "link" for part in data_parts)  # nothing copied

    files = ds.dataset(workdir / "pq", format="parquet", partitioning="hive").to_table()
    got = zip(
        files.column("rowtime").cast(pa.int64()).to_pylist(),
        files.column("id").to_pylist(),
        files.column("tag").to_pylist(),
        strict=True,
    )
    assert sorted(got) == sorted(expected)
    assert parquet_clock_us(str(workdir / "pq")) == END_OF_STREAM_US


@pytest.mark.connect("an error raised in the server's Python reaches the client whole")
def test_reading_a_target_stream_before_its_first_commit_says_why_it_is_not_there(spark, workdir):
    from pyspark_rowtime.sink.options import parse_sink_options
    from pyspark_rowtime.sink.stream_target import StreamTarget

    schema = pa.schema([("id", pa.int64()), ("rowtime", pa.timestamp("us", tz="UTC"))])
    schema = schema.append(pa.field("is_bound", pa.bool_()))
    pending = workdir / "pending"
    StreamTarget(parse_sink_options({"path": str(pending)}, schema)).prepare()  # query started
    with pytest.raises(Exception, match="has not committed its first batch"):
        # .columns: a Spark Connect client meets the error at the first analysis, not at load()
        _ = spark.readStream.format("rowtime").load(str(pending)).columns
    given = workdir / "given"  # with option partitions the stream exists from the start
    StreamTarget(parse_sink_options({"path": str(given), "partitions": "2"}, schema)).prepare()
    df = spark.readStream.format("rowtime").load(str(given))
    assert df.columns == ["id", "rowtime", "is_bound"]

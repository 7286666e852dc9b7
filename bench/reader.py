"""Benchmark: this reader beside Spark's own Parquet file stream source, over the same rows.

Both read the same 20 million rows (2 partitions; columns id BIGINT, v DOUBLE, s STRING of a
few characters, and the rowtime) in one Spark session, drained with
``trigger(availableNow=True)`` into the ``noop`` sink. Each case runs once to warm up, then
``--repeat`` times; the best run counts. Cases:

* ``reject``: rows in rowtime order, ``order=reject``;
* ``adjust``: 1% of the rows out of order within the range, ``order=adjust`` (msec, 999).

Parquet reads the same rows as files, one per stream partition, with the rowtime as a
TIMESTAMP column; it does no ordering at all, so the ratio is the price of the guarantees.
Targets: ratio >= 0.7 (reject) and >= 0.5 (adjust).

A third source, ``floor``, is the cheapest any Python data source can be over the same log: it
memory-maps the segment files and yields their record batches as they are (no planning, no
policy, no copy). What it costs beside Parquet is Spark's (a Python worker per task, Arrow over
a socket, rows built in the JVM), not this reader's. ``./dev bench suite`` measures them all in
interleaved rounds.

A fourth, ``redis``, is this reader over the same rows kept in Redis Streams (a local
``redis-server`` on a free loopback port, or ``--redis URL``; ``--redis none`` skips it); its
ratio is to the reader over the embedded log. Target: >= 0.5.

Run: ``./dev bench reader [--rows N] [--repeat R] [--dir PATH] [--redis URL|none]``. The
reader's micro-batch durations (``latestOffset`` = planning on the driver, ``addBatch`` =
reading on the executors) are printed beside the rates, so a miss says where the time went.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from benchutil import spark_session
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

import pyspark_rowtime as pr

PARTITIONS = 2
#: Rows per insert_arrow call and per Parquet row group.
CHUNK = 1_000_000
START_US = 1_700_000_000_000_000
STEP_US = 100  # ~10,000 rows per second of event time per partition
WORDS = np.array(["ORCL", "MSFT", "IBM", "SAP", "AAPL", "GOOG", "AMZN", "META"])


def rowtimes(first: int, n: int, late_share: float, rng: np.random.Generator) -> np.ndarray:
    """Rowtimes in order, but ``late_share`` of them up to 0.5 s early (within adjust's range)."""
    t = START_US + (np.arange(first, first + n, dtype=np.int64) * STEP_US)
    if late_share:
        late = rng.random(n) < late_share
        t[late] -= rng.integers(1, 500_000, int(late.sum()))  # up to 0.5 s early: in range
    return t


def chunk(
    partition: int,
    first: int,
    n: int,
    late_share: float,
    rng: np.random.Generator,
    partitions: int = PARTITIONS,
) -> pa.Table:
    ids = np.arange(first, first + n, dtype=np.int64) * partitions + partition
    words = pa.DictionaryArray.from_arrays(
        pa.array(rng.integers(0, len(WORDS), n).astype(np.int32)), pa.array(WORDS)
    ).cast(pa.string())
    t = rowtimes(first, n, late_share, rng)
    return pa.table(
        {
            "id": ids,
            "v": rng.random(n),
            "s": words,
            "rowtime": pa.array(t, type=pa.int64()).view(pa.timestamp("us", tz="UTC")),
        }
    )


def write_data(
    root: str,
    rows: int,
    late_share: float,
    parquet_copy: bool = True,
    redis: str | None = None,
    partitions: int = PARTITIONS,
) -> tuple[str, str]:
    """The same rows as a rowtime stream, (``parquet_copy``) as Parquet files and (``redis``)
    as a stream at that Redis location; the first two locations. ``late_share`` of the rows
    come up to 0.5 s out of order. ``rows`` are split evenly over ``partitions``."""
    stream = os.path.join(root, "stream")
    parquet = os.path.join(root, "parquet")
    os.makedirs(parquet, exist_ok=True)
    copies = [stream] if redis is None else [stream, redis]
    for loc in copies:
        pr.create_stream(loc, "id BIGINT, v DOUBLE, s STRING", partitions=partitions)
    per_partition = rows // partitions
    for p in range(partitions):
        rng = np.random.default_rng(p + int(late_share * 1_000_000))
        path = os.path.join(parquet, f"part-{p}.parquet")
        schema = chunk(p, 0, 1, late_share, rng).schema
        writers = [pr.open_writer(loc, p) for loc in copies]
        with pq.ParquetWriter(path, schema) if parquet_copy else contextlib.nullcontext() as pw:
            for first in range(0, per_partition, CHUNK):
                n = min(CHUNK, per_partition - first)
                table = chunk(p, first, n, late_share, rng, partitions)
                for w in writers:
                    w.insert_arrow(table, rowtime_column="rowtime")
                if pw is not None:
                    pw.write_table(table, row_group_size=CHUNK)
        for w in writers:
            w.end_stream()
            w.close()
    return stream, parquet


class FloorSource(DataSource):
    """The cheapest Python source over the same log (issue 16's floor): each task
    memory-maps its partition's segment files and yields their record batches as they are,
    with the payload columns selected, ``__rowtime_us`` cast to a timestamp and
    ``__is_bound`` renamed. Nothing is filtered, copied, combined or planned: one
    micro-batch, one task per stream partition."""

    @classmethod
    def name(cls) -> str:
        return "rowtime_floor"

    def schema(self) -> str:
        return "id BIGINT, v DOUBLE, s STRING, rowtime TIMESTAMP, is_bound BOOLEAN"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return FloorReader(
            self.options["path"],
            int(self.options.get("batchrows", 0)),
            int(self.options.get("tasks", 1)),
        )


FLOOR_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("v", pa.float64()),
        pa.field("s", pa.string()),
        pa.field("rowtime", pa.timestamp("us", tz="UTC")),
        pa.field("is_bound", pa.bool_()),
    ]
)


class FloorReader(DataSourceStreamReader):
    """``batch_rows``: when > 0, each record batch is cut (zero copy) into batches of at most
    that many rows, to see what Spark's cost per batch is. ``tasks``: tasks per stream
    partition, each yielding every ``tasks``-th record batch (do more tasks raise the floor?)."""

    def __init__(self, path: str, batch_rows: int = 0, tasks: int = 1) -> None:
        self.path = path
        self.batch_rows = batch_rows
        self.tasks = tasks

    def initialOffset(self) -> dict:
        return {"read": False}

    def latestOffset(self) -> dict:
        return {"read": True}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [InputPartition((p, k)) for p in range(PARTITIONS) for k in range(self.tasks)]

    def commit(self, end: dict) -> None:
        pass

    def read(self, partition: InputPartition) -> Any:
        from pyspark_rowtime.streams.local.folder import list_segments, partition_dirname

        p, k = partition.value
        chain, _, _ = list_segments(os.path.join(self.path, partition_dirname(p)))
        ts = FLOOR_SCHEMA.field("rowtime").type
        n = 0
        for seg in chain:
            with pa.memory_map(seg.path, "r") as source:
                file = pa.ipc.open_file(source)
                for i in range(file.num_record_batches):
                    n += 1
                    if (n - 1) % self.tasks != k:
                        continue
                    b = file.get_batch(i)
                    out = pa.RecordBatch.from_arrays(
                        [
                            b.column("id"),
                            b.column("v"),
                            b.column("s"),
                            b.column("__rowtime_us").cast(ts),
                            b.column("__is_bound"),
                        ],
                        schema=FLOOR_SCHEMA,
                    )
                    if self.batch_rows <= 0:
                        yield out
                    else:
                        for a in range(0, out.num_rows, self.batch_rows):
                            yield out.slice(a, self.batch_rows)


def drain(spark: SparkSession, df: Any, root: str) -> tuple[float, dict[str, int]]:
    """Seconds to drain ``df`` with availableNow into noop, and the summed batch durations."""
    checkpoint = os.path.join(root, "checkpoints", uuid.uuid4().hex)
    t0 = time.perf_counter()
    q = (
        df.writeStream.format("noop")
        .trigger(availableNow=True)
        .option("checkpointLocation", checkpoint)
        .start()
    )
    q.awaitTermination()
    seconds = time.perf_counter() - t0
    durations: dict[str, int] = {}
    for p in q.recentProgress:
        for k, v in p["durationMs"].items():
            durations[k] = durations.get(k, 0) + v
    shutil.rmtree(checkpoint, ignore_errors=True)
    return seconds, durations


def best(spark: SparkSession, make: Any, root: str, repeat: int) -> tuple[float, dict[str, int]]:
    drain(spark, make(), root)  # warm up: JIT, Python workers, file listings, page cache
    runs = [drain(spark, make(), root) for _ in range(repeat)]
    return min(runs, key=lambda r: r[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--dir", default=None, help="where to write the data (default: a temp dir)")
    ap.add_argument("--cases", default="reject,adjust")
    ap.add_argument("--redis", default=None, help="a redis:// base location, or none")
    args = ap.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="bench-reader-")
    server = None
    redis_base = None if args.redis == "none" else args.redis
    if args.redis is None:
        import sys

        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
        from redis_server import RedisServer

        server = RedisServer(Path(base) / "redis").start()
        redis_base = server.url("bench")

    spark = spark_session("bench-reader")
    spark.dataSource.register(FloorSource)
    schema = "id BIGINT, v DOUBLE, s STRING, rowtime TIMESTAMP"
    targets = {"reject": 0.7, "adjust": 0.5}
    options = {
        "reject": {"order": "reject"},
        "adjust": {"order": "adjust", "adjust.unit": "msec", "adjust.range": "999"},
    }
    print(f"rows: {args.rows:,} in {PARTITIONS} partitions; Spark {spark.version}, local[2]")
    header = f"{'case':<10}{'source':<10}{'seconds':>9}{'M rows/s':>10}{'ratio':>7}{'target':>8}"
    print(header + "   reader batches: latestOffset / addBatch ms")
    try:
        for case in args.cases.split(","):
            root = os.path.join(base, case)
            t0 = time.perf_counter()
            on_redis = None if redis_base is None else f"{redis_base}-{case}-{uuid.uuid4().hex[:8]}"
            late = 0.01 if case == "adjust" else 0.0
            stream, parquet = write_data(root, args.rows, late, redis=on_redis)
            print(f"{case:<10}(wrote both copies in {time.perf_counter() - t0:.0f} s)")

            def parquet_df(parquet: str = parquet) -> Any:
                return spark.readStream.format("parquet").schema(schema).load(parquet)

            def rowtime_df(stream: str = stream, case: str = case) -> Any:
                r = spark.readStream.format("rowtime")
                for k, v in options[case].items():
                    r = r.option(k, v)
                return r.load(stream)

            def floor_df(stream: str = stream) -> Any:
                return spark.readStream.format("rowtime_floor").load(stream)

            pq_s, _ = best(spark, parquet_df, root, args.repeat)
            floor_s, _ = best(spark, floor_df, root, args.repeat)
            rt_s, d = best(spark, rowtime_df, root, args.repeat)
            ratio = pq_s / rt_s
            verdict = "ok" if ratio >= targets[case] else "MISS"
            print(f"{case:<10}{'parquet':<10}{pq_s:9.2f}{args.rows / pq_s / 1e6:10.2f}")
            print(
                f"{case:<10}{'floor':<10}{floor_s:9.2f}{args.rows / floor_s / 1e6:10.2f}"
                f"{pq_s / floor_s:7.2f}"
            )
            print(
                f"{case:<10}{'rowtime':<10}{rt_s:9.2f}{args.rows / rt_s / 1e6:10.2f}"
                f"{ratio:7.2f}{targets[case]:>8} {verdict}   "
                f"{d.get('latestOffset', 0)} / {d.get('addBatch', 0)}"
            )
            if on_redis is not None:
                redis_s, d = best(spark, lambda r=on_redis: rowtime_df(r), root, args.repeat)
                print(
                    f"{case:<10}{'redis':<10}{redis_s:9.2f}{args.rows / redis_s / 1e6:10.2f}"
                    f"{rt_s / redis_s:7.2f}{0.5:>8} {'ok' if rt_s / redis_s >= 0.5 else 'MISS'}"
                    f"   {d.get('latestOffset', 0)} / {d.get('addBatch', 0)}"
                    "   (ratio to rowtime on the embedded log)"
                )
            shutil.rmtree(root, ignore_errors=True)
    finally:
        if server is not None:
            server.close()
        spark.stop()
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

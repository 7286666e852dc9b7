"""Benchmark: this sink (both targets) beside Spark's own Parquet file sink, over the same rows.

One Spark session; one source for every case: a rowtime stream of 20 million rows (2
partitions; columns id BIGINT, v DOUBLE, s STRING of a few characters; bounds every million
rows and the end of stream), read with ``spark.readStream.format("rowtime")`` and drained with
``trigger(availableNow=True)`` into:

* ``parquet``: Spark's file sink, ``writeStream.format("parquet")`` (snappy, the reference);
* ``stream``: ``writeStream.format("rowtime")`` into a rowtime stream (a partition per source
  partition, each in rowtime order, bounds passed on; the executors write the segments and the
  commit links them);
* ``files``: ``writeStream.format("rowtime").option("target", "parquet")``: snappy Parquet
  files in hourly partitions, ``_COMPLETE`` markers and the clock.

Every case reads the same source, so the ratio is the price of the sink alone. For context
the bench also runs ``python-noop``, a Python data source sink whose ``write()`` only drains its
Arrow batches: what any Python sink pays for Spark handing rows to Python, before doing
anything with them. A small warm-up query runs first (JIT, Python workers); then the cases run
interleaved, ``--repeat`` rounds (so a busy moment on the machine hits every case alike), and
each case's best run counts. Target: ratio >= 0.6 for both targets.

Run: ``./dev bench sink [--rows N] [--repeat R] [--dir PATH]``. The summed micro-batch
durations (``addBatch`` = read + write() on executors + commit() on the driver) are printed
beside the rates.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
from benchutil import spark_session
from pyspark.sql import DataFrame
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

import pyspark_rowtime as pr

PARTITIONS = 2
CHUNK = 1_000_000
START_US = 1_700_000_000_000_000
STEP_US = 100  # ~10,000 rows per second of event time per partition
WORDS = np.array(["ORCL", "MSFT", "IBM", "SAP", "AAPL", "GOOG", "AMZN", "META"])
TARGET_RATIO = 0.6


class _Drained(WriterCommitMessage):
    pass


class _DrainWriter(DataSourceStreamArrowWriter):
    def write(self, iterator: Any) -> _Drained:
        for _ in iterator:
            pass
        return _Drained()

    def commit(self, messages: Any, batchId: int) -> None:
        pass


class PythonNoop(DataSource):
    """A Python sink that only drains its input: the floor for any Python data source sink."""

    @classmethod
    def name(cls) -> str:
        return "python-noop"

    def streamWriter(self, schema: Any, overwrite: bool) -> _DrainWriter:
        return _DrainWriter()


def chunk(partition: int, first: int, n: int, rng: np.random.Generator) -> pa.Table:
    ids = np.arange(first, first + n, dtype=np.int64) * PARTITIONS + partition
    words = pa.DictionaryArray.from_arrays(
        pa.array(rng.integers(0, len(WORDS), n).astype(np.int32)), pa.array(WORDS)
    ).cast(pa.string())
    t = START_US + np.arange(first, first + n, dtype=np.int64) * STEP_US
    return pa.table(
        {
            "id": ids,
            "v": rng.random(n),
            "s": words,
            "rowtime": pa.array(t, type=pa.int64()).view(pa.timestamp("us", tz="UTC")),
        }
    )


def write_source(path: str, rows: int) -> None:
    pr.create_stream(path, "id BIGINT, v DOUBLE, s STRING", partitions=PARTITIONS)
    per_partition = rows // PARTITIONS
    for p in range(PARTITIONS):
        rng = np.random.default_rng(p)
        with pr.open_writer(path, p) as w:
            for first in range(0, per_partition, CHUNK):
                n = min(CHUNK, per_partition - first)
                table = chunk(p, first, n, rng)
                w.insert_arrow(table, rowtime_column="rowtime")
                w.set_rowtime_bound(table.column("rowtime")[-1].as_py())
            w.end_stream()


def drain(df: DataFrame, fmt: str, path: str, root: str, **options: str) -> tuple[float, int]:
    """Seconds to drain ``df`` into the sink, and the summed addBatch milliseconds."""
    checkpoint = os.path.join(root, "checkpoints", uuid.uuid4().hex)
    writer = df.writeStream.format(fmt).trigger(availableNow=True)
    for key, value in {"checkpointLocation": checkpoint, **options}.items():
        writer = writer.option(key, value)
    t0 = time.perf_counter()
    query = writer.start(path)
    query.awaitTermination()
    seconds = time.perf_counter() - t0
    add_batch = sum(p["durationMs"].get("addBatch", 0) for p in query.recentProgress)
    shutil.rmtree(checkpoint, ignore_errors=True)
    return seconds, add_batch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write the data (default: a temp dir)")
    args = ap.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="bench-sink-")
    spark = spark_session("bench-sink")
    spark.dataSource.register(PythonNoop)
    cases: dict[str, tuple[str, dict[str, str]]] = {
        "parquet": ("parquet", {}),
        "python-noop": ("python-noop", {}),
        "stream": ("rowtime", {}),
        "files": ("rowtime", {"target": "parquet"}),
    }
    try:
        t0 = time.perf_counter()
        source = os.path.join(base, "source")
        write_source(source, args.rows)
        warm = os.path.join(base, "warm")
        write_source(warm, 200_000)
        print(
            f"rows: {args.rows:,} in {PARTITIONS} partitions (source written in "
            f"{time.perf_counter() - t0:.0f} s); Spark {spark.version}, local[2]"
        )

        def read(path: str) -> Any:
            return spark.readStream.format("rowtime").load(path)

        for name, (fmt, options) in cases.items():  # warm up every sink once, small
            drain(read(warm), fmt, os.path.join(base, f"warm-{name}"), base, **options)

        runs: dict[str, list[tuple[float, int]]] = {name: [] for name in cases}
        for i in range(args.repeat):
            for name, (fmt, options) in cases.items():
                out = os.path.join(base, f"out-{name}-{i}")
                runs[name].append(drain(read(source), fmt, out, base, **options))
                shutil.rmtree(out, ignore_errors=True)
        print(f"{'sink':<12}{'seconds':>9}{'M rows/s':>10}{'ratio':>7}{'target':>8}  addBatch ms")
        reference, _ = min(runs["parquet"])
        for name, results in runs.items():
            seconds, add_batch = min(results)
            rate = args.rows / seconds / 1e6
            ratio = reference / seconds
            if name in ("stream", "files"):
                verdict = f"{TARGET_RATIO:>8} {'ok' if ratio >= TARGET_RATIO else 'MISS'}"
            else:
                verdict = " " * 11
            print(f"{name:<12}{seconds:9.2f}{rate:10.2f}{ratio:7.2f}{verdict}  {add_batch}")
    finally:
        spark.stop()
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

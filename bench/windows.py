"""Benchmark: ``time_interval_aggregate`` beside Spark's own ``groupBy(window(...))``.

Both read the same rows from one rowtime stream (2 partitions; columns id BIGINT, v DOUBLE,
s STRING of 8 values, and the rowtime, ~20,000 rows per second of event time) through
``format("rowtime")`` in one Spark session, with the same ``maxRowsPerBatch``, and aggregate
them per ``s`` over tumbling 10 s windows (count, sum, max, max_by) into the ``noop`` sink,
drained with ``trigger(availableNow=True)``:

* ``spark``: ``with_watermark(df).groupBy("s", window("rowtime", "10 seconds")).agg(...)``;
* ``rowtime``: ``time_interval_aggregate(df, ..., interval_duration=10, partition_by="s")``.

Each round runs both, in alternating order, after one warm-up round; the figures are the
median over rounds and the spread (min-max) of rows/s. The ratio is rowtime / spark, per round,
then its median; target >= 0.5. Both pay for the reader (a Python data source), so the ratio
is the price of the window alone on top of what the query already pays.

Run: ``./dev bench windows [--rows N] [--rounds R] [--batch ROWS]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
from benchutil import spark_session
from pyspark.sql import functions as F

import pyspark_rowtime as pr

PARTITIONS = 2
CHUNK = 1_000_000
START_US = 1_700_000_000_000_000
STEP_US = 100  # per partition: ~10,000 rows per second of event time
WORDS = np.array(["ORCL", "MSFT", "IBM", "SAP", "AAPL", "GOOG", "AMZN", "META"])
TARGET = 0.5


def write_data(path: str, rows: int) -> None:
    pr.create_stream(path, "id BIGINT, v DOUBLE, s STRING", partitions=PARTITIONS)
    per_partition = rows // PARTITIONS
    for p in range(PARTITIONS):
        rng = np.random.default_rng(p)
        with pr.open_writer(path, p) as w:
            for first in range(0, per_partition, CHUNK):
                n = min(CHUNK, per_partition - first)
                t = START_US + np.arange(first, first + n, dtype=np.int64) * STEP_US
                words = WORDS[rng.integers(0, len(WORDS), n)]
                table = pa.table(
                    {
                        "id": np.arange(first, first + n, dtype=np.int64) * PARTITIONS + p,
                        "v": rng.random(n),
                        "s": pa.array(words.tolist(), pa.string()),
                        "rowtime": pa.array(t, pa.int64()).view(pa.timestamp("us", tz="UTC")),
                    }
                )
                w.insert_arrow(table, rowtime_column="rowtime")
            w.end_stream()


def aggs() -> list[Any]:
    return [
        F.count("*").alias("n"),
        F.sum("v").alias("total"),
        F.max("v").alias("top"),
        F.max_by("id", "v").alias("top_id"),
    ]


def drain(df: Any, root: str) -> tuple[float, int]:
    """Seconds to drain ``df`` into noop with availableNow, and the rows it wrote."""
    checkpoint = os.path.join(root, "checkpoints", uuid.uuid4().hex)
    t0 = time.perf_counter()
    q = (
        df.writeStream.format("noop")
        .outputMode("append")
        .trigger(availableNow=True)
        .option("checkpointLocation", checkpoint)
        .start()
    )
    q.awaitTermination()
    seconds = time.perf_counter() - t0
    out = sum(p["sink"].get("numOutputRows", 0) or 0 for p in q.recentProgress)
    shutil.rmtree(checkpoint, ignore_errors=True)
    return seconds, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1_000_000, help="maxRowsPerBatch")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="bench-windows-")
    spark = spark_session("bench-windows")
    try:
        stream = os.path.join(base, "stream")
        t0 = time.perf_counter()
        write_data(stream, args.rows)
        print(
            f"rows: {args.rows:,} in {PARTITIONS} partitions, maxRowsPerBatch {args.batch:,}; "
            f"Spark {spark.version}, local[2] (wrote in {time.perf_counter() - t0:.0f} s)"
        )

        def source() -> Any:
            return (
                spark.readStream.format("rowtime")
                .option("maxRowsPerBatch", str(args.batch))
                .load(stream)
            )

        def native() -> Any:
            return (
                pr.with_watermark(source())
                .groupBy("s", F.window("rowtime", "10 seconds"))
                .agg(*aggs())
            )

        def ours() -> Any:
            return pr.time_interval_aggregate(
                source(), aggs(), interval_duration=10, partition_by="s"
            )

        cases = {"spark": native, "rowtime": ours}
        rates: dict[str, list[float]] = {name: [] for name in cases}
        ratios: list[float] = []
        outputs: dict[str, int] = {}
        for r in range(args.rounds + 1):  # round 0 warms up
            order = list(cases) if r % 2 else list(reversed(cases))
            this: dict[str, float] = {}
            for name in order:
                seconds, out = drain(cases[name](), base)
                this[name] = args.rows / seconds
                outputs[name] = out
            # The machine may be shared: the load beside every round tells how far to trust it.
            load = " ".join(f"{x:.2f}" for x in os.getloadavg())
            print(
                f"round {r}{' (warm-up)' if not r else ''}: "
                + ", ".join(f"{name} {this[name] / 1e6:.3f} M rows/s" for name in cases)
                + f", ratio {this['rowtime'] / this['spark']:.2f}; load average {load}",
                flush=True,
            )
            if r:
                for name in cases:
                    rates[name].append(this[name])
                ratios.append(this["rowtime"] / this["spark"])
        print(f"{'query':<10}{'median M rows/s':>17}{'spread':>16}{'windows out':>13}")
        for name in cases:
            xs = rates[name]
            print(
                f"{name:<10}{statistics.median(xs) / 1e6:17.3f}"
                f"{f'{min(xs) / 1e6:.3f}-{max(xs) / 1e6:.3f}':>16}{outputs[name]:>13,}"
            )
        ratio = statistics.median(ratios)
        verdict = "ok" if ratio >= TARGET else "MISS"
        print(
            f"ratio rowtime/spark: median {ratio:.2f} (spread {min(ratios):.2f}-"
            f"{max(ratios):.2f}), target >= {TARGET} {verdict}"
        )
    finally:
        spark.stop()
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

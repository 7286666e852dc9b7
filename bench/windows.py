"""Benchmark: ``time_interval_aggregate`` beside Spark's own ``groupBy(window(...))``.

Both read the same rows from one rowtime stream (2 partitions; columns id BIGINT, v DOUBLE,
s STRING of 8 values, and the rowtime, ~20,000 rows per second of event time) through
``format("rowtime")`` in one Spark session, with the same ``maxRowsPerBatch``, and aggregate
them per ``s`` over tumbling 10 s windows (count, sum, max, max_by) into the ``noop`` sink,
drained with ``trigger(availableNow=True)``:

* ``spark``: ``with_watermark(df).groupBy("s", window("rowtime", "10 seconds")).agg(...)``;
* ``rowtime``: ``time_interval_aggregate(df, ..., interval_duration=10, partition_by="s")``.

Each round runs both, in alternating order, after one warm-up round
(``benchutil.interleaved``); the figures are the median over rounds and the spread (min-max)
of rows/s. The ratio is rowtime / spark, per round, then its median; target >= 0.5. Both pay
for the reader (a Python data source), so the ratio is the price of the window alone on top
of what the query already pays.

Run: ``./dev bench windows [--rows N] [--rounds R] [--batch ROWS]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any

from benchutil import PARTITIONS, drain, interleaved, spark_session, write_stream
from pyspark.sql import functions as F

import pyspark_rowtime as pr

TARGET = 0.5


def aggs() -> list[Any]:
    return [
        F.count("*").alias("n"),
        F.sum("v").alias("total"),
        F.max("v").alias("top"),
        F.max_by("id", "v").alias("top_id"),
    ]


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
        write_stream(stream, args.rows)
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

        cases = {
            "windows": {
                "spark": lambda: drain(native(), base),
                "rowtime": lambda: drain(ours(), base),
            }
        }
        ratio = interleaved(cases, args.rounds, {"windows": args.rows})["windows"]
        print(f"target >= {TARGET}: {'ok' if ratio >= TARGET else 'MISS'}")
    finally:
        spark.stop()
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

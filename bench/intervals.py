"""Benchmark: validity intervals (seed 001) beside what Spark's own operators can do.

Two rowtime streams, ``a`` and ``b`` (2 partitions each; id BIGINT, v DOUBLE, s STRING of 8
values, k BIGINT of 5,000 values; ~20,000 rows per second of event time per stream), read
through ``format("rowtime")`` with ``interval.duration`` in one Spark session. Each round runs
the four queries below, each pair in alternating order, after one warm-up round
(``benchutil.interleaved``, as ``./dev bench windows``); the figures are the median over rounds
of the input rows per second with their spread, and the ratio is ours / Spark's per round,
then its median.

* **Aggregate over intervals** (``a`` alone, valid 100 ms, per ``s``: count, sum, avg):
  - ``rowtime``: ``interval_aggregate`` (streaming, ``availableNow``, into ``noop``);
  - ``spark``: the same answer from Spark's own operators, a *batch* sweep over the change
    points: each row gives ``(+1, +v)`` at its start and ``(-1, -v)`` at its end, summed per
    ``(s, instant)``; running sums over a window ``PARTITION BY s ORDER BY instant`` give the
    count and sum from each instant to the next (``lead``), instants with no row valid dropped.
    Spark has no streaming operator for it (window functions are refused on streams, and a
    stream-stream self-join pairs every change point with every row valid at it, rows x
    overlap), so the batch sweep is the fastest Spark-only form: it sorts once and never holds
    state. It does not merge stretches split by a change point that changes nothing (an empty
    interval: none here) and, like any running sum, it subtracts floats. ``rowtime`` also
    emits min and max in no extra pass; they are left out here so both compute the same.
* **Left join** (``a`` valid 100 ms left, ``b`` valid 100 ms right, on ``k``: a left row meets
  about one right row, and about 45% meet none):
  - ``rowtime``: ``overlap_join(a, b, "k", how="left")``;
  - ``spark``: Spark's stream-stream left outer join with the time-range condition of two
    overlapping intervals (``b.rowtime < a.rowtime + 100 ms AND a.rowtime < b.rowtime + 100 ms``) on
    ``with_watermark`` of each, then the intersection as columns.

Both sides of each comparison pay for the reader (a Python data source), so a ratio is the
price of the operator on top of what the query already pays.

Run: ``./dev bench intervals [--rows N] [--rounds R] [--batch ROWS]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any

from benchutil import PARTITIONS, drain, interleaved, spark_session, write_stream
from pyspark.sql import Window
from pyspark.sql import functions as F

import pyspark_rowtime as pr

KEYS = 5_000


def run_batch(df: Any) -> tuple[float, int]:
    """Seconds to run a batch ``df`` into noop, and the rows it has (counted apart)."""
    t0 = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t0, -1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows per stream")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1_000_000, help="maxRowsPerBatch")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="bench-intervals-")
    spark = spark_session("bench-intervals")
    try:
        a, b = os.path.join(base, "a"), os.path.join(base, "b")
        t0 = time.perf_counter()
        write_stream(a, args.rows, seed=1, keys=KEYS)
        write_stream(b, args.rows, seed=2, keys=KEYS)
        print(
            f"rows: {args.rows:,} per stream in {PARTITIONS} partitions, maxRowsPerBatch "
            f"{args.batch:,}; Spark {spark.version}, local[2] (wrote in "
            f"{time.perf_counter() - t0:.0f} s)"
        )

        def source(path: str, duration: str) -> Any:
            return (
                spark.readStream.format("rowtime")
                .option("maxRowsPerBatch", str(args.batch))
                .option("interval.duration", duration)
                .load(path)
            )

        def agg_ours() -> tuple[float, int]:
            df = pr.interval_aggregate(
                source(a, "100 milliseconds"),
                {"n": "count(*)", "total": "sum(v)", "mean": "avg(v)"},
                partition_by="s",
            )
            return drain(df, base)

        def agg_spark() -> tuple[float, int]:
            rows = (
                spark.read.format("rowtime")
                .option("interval.duration", "100 milliseconds")
                .load(a)
                .where(~F.col("is_bound"))
            )
            events = rows.select(
                "s", F.col("rowtime").alias("t"), F.lit(1).alias("dn"), F.col("v").alias("dv")
            ).unionByName(
                rows.select(
                    "s",
                    F.col("rowtime_end").alias("t"),
                    F.lit(-1).alias("dn"),
                    (-F.col("v")).alias("dv"),
                )
            )
            points = events.groupBy("s", "t").agg(F.sum("dn").alias("dn"), F.sum("dv").alias("dv"))
            w = Window.partitionBy("s").orderBy("t")
            running = points.select(
                "s",
                F.col("t").alias("rowtime"),
                F.lead("t").over(w).alias("rowtime_end"),
                F.sum("dn").over(w).alias("n"),
                F.sum("dv").over(w).alias("total"),
            )
            out = running.where(F.col("n") > 0).select(
                "s",
                "rowtime",
                "rowtime_end",
                "n",
                "total",
                (F.col("total") / F.col("n")).alias("mean"),
            )
            return run_batch(out)

        def join_ours() -> tuple[float, int]:
            left = source(a, "100 milliseconds").select(
                "k", "id", "v", "rowtime", "rowtime_end", "is_bound"
            )
            right = source(b, "100 milliseconds").select(
                "k", "id", "v", "rowtime", "rowtime_end", "is_bound"
            )
            return drain(pr.overlap_join(left, right, "k", how="left"), base)

        def join_spark() -> tuple[float, int]:
            left = pr.with_watermark(source(a, "100 milliseconds")).select(
                F.col("k").alias("lk"),
                F.col("id").alias("left_id"),
                F.col("v").alias("left_v"),
                F.col("rowtime").alias("lt"),
                F.col("rowtime_end").alias("le"),
            )
            right = pr.with_watermark(source(b, "100 milliseconds")).select(
                F.col("k").alias("rk"),
                F.col("id").alias("right_id"),
                F.col("v").alias("right_v"),
                F.col("rowtime").alias("rt"),
                F.col("rowtime_end").alias("re"),
            )
            cond = F.expr(
                "lk = rk AND rt < lt + INTERVAL 100 MILLISECONDS"
                " AND lt < rt + INTERVAL 100 MILLISECONDS"
            )
            joined = left.join(right, cond, "leftOuter").select(
                F.col("lk").alias("k"),
                "left_id",
                "left_v",
                "right_id",
                "right_v",
                F.greatest("lt", F.coalesce("rt", "lt")).alias("rowtime"),
                F.least("le", F.coalesce("re", "le")).alias("rowtime_end"),
            )
            return drain(joined, base)

        cases = {
            "aggregate": {"spark": agg_spark, "rowtime": agg_ours},
            "left join": {"spark": join_spark, "rowtime": join_ours},
        }
        interleaved(cases, args.rounds, {"aggregate": args.rows, "left join": 2 * args.rows})
    finally:
        spark.stop()
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

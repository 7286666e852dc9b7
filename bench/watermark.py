"""Benchmark: what ``with_watermark``'s barrier costs on the reader's drain.

``with_watermark`` removes bound records with a filter whose condition holds a
non-deterministic, always-true conjunct (``spark_partition_id() >= 0``), so that Spark's
optimizer cannot push later predicates below the watermark (see pyspark_rowtime.watermark).
This measures that conjunct: the same stream (``order=reject``, rows in order, as in
``bench/reader.py``), drained with ``availableNow`` into ``noop`` three ways in one session,
in interleaved rounds so that a busy machine slows each alike:

* ``reader``: ``format("rowtime")`` alone (no watermark): the reader's own cost;
* ``old filter``: ``withWatermark`` + the deterministic filter ``with_watermark`` used before
  the barrier (bounds cut off by any later filter);
* ``with_watermark``: the helper as it is, barrier included.

Each case prints the median of ``--rounds`` rounds with the spread (min-max); the ratio
``with_watermark / old filter`` is the barrier's price. Run: ``./dev bench watermark``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from typing import Any

from benchutil import spark_session
from pyspark.sql import functions as F
from reader import drain, write_data

import pyspark_rowtime as pr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench-watermark-")
    spark = spark_session("bench-watermark")
    try:
        stream, _ = write_data(root, args.rows, 0.0, parquet_copy=False)

        def source() -> Any:
            return spark.readStream.format("rowtime").load(stream)

        def old_filter() -> Any:
            df = source().withWatermark("rowtime", "1 millisecond")
            data_rows = F.when(F.col("rowtime").isNotNull(), ~F.col("is_bound")).otherwise(False)
            return df.where(data_rows).drop("is_bound")

        cases = {
            "reader": source,
            "old filter": old_filter,
            "with_watermark": lambda: pr.with_watermark(source()),
        }
        for make in cases.values():  # warm up: JIT, Python workers, page cache
            drain(spark, make(), root)
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, make in cases.items():
                times[name].append(drain(spark, make(), root)[0])
        print(f"rows: {args.rows:,}; Spark {spark.version}, local[2]; {args.rounds} rounds")
        print(f"{'case':<16}{'median s':>9}{'spread s':>16}{'M rows/s':>10}")
        for name, ts in times.items():
            med = statistics.median(ts)
            print(
                f"{name:<16}{med:9.2f}{f'{min(ts):.2f}-{max(ts):.2f}':>16}"
                f"{args.rows / med / 1e6:10.2f}"
            )
        ratios = [b / a for a, b in zip(times["old filter"], times["with_watermark"], strict=True)]
        print(
            f"barrier price (with_watermark / old filter, per round): median "
            f"{statistics.median(ratios):.3f}, spread {min(ratios):.3f}-{max(ratios):.3f}"
        )
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

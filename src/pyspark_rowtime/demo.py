"""The main job, end to end: an adapter feeds a stream, Spark counts per window, the sink keeps
a clock.

Run: ``./dev demo`` (or ``python -m pyspark_rowtime.demo [--dir DIR]``).

1. ``create_stream`` makes ``orders`` with two partitions and ops' default ``order=adjust``
   (SDP's timestamp adjustment: ``usec``, range 999, which discards B and D).
2. Two writers insert the seed tuples A to E of SDP's documentation (partition 0) and a few
   orders a minute apart (partition 1), then send rowtime bounds.
3. A streaming query reads ``format("rowtime")``, applies ``with_watermark`` and counts orders
   per 10-second window; the sink writes the windows into the rowtime stream ``counts``, each
   with its window end as rowtime, and advances that stream's clock.
4. It prints the windows, the target clock, and the quarantine of discarded rows.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pyspark_rowtime.demo", description=__doc__.split("\n")[0])
    ap.add_argument("--dir", help="working folder (default: a new temporary one)")
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import pyspark_rowtime as rt

    work = Path(args.dir or tempfile.mkdtemp(prefix="rowtime-demo-"))
    for sub in ("orders", "counts", "checkpoint"):
        shutil.rmtree(work / sub, ignore_errors=True)
    orders, counts = str(work / "orders"), str(work / "counts")

    rt.create_stream(orders, "item STRING, qty INT", partitions=2,
                     order="adjust", adjust_unit="usec", adjust_range=999)  # fmt: skip
    with rt.open_writer(orders, partition=0) as w:
        # SDP's tuples A to E, in arrival order, with nanosecond times (truncated to ms here)
        for name, t in [("A", "22:345678901"), ("B", "22:123456789"), ("C", "23:123456789"),
                        ("D", "22:890123456"), ("E", "24:123456789")]:  # fmt: skip
            w.insert({"item": name, "qty": 1}, rowtime=f"2009/03/01 12:15:{t}")
        w.set_rowtime_bound("2009-03-01T12:16:00Z")
    with rt.open_writer(orders, partition=1) as w:
        for i, second in enumerate([5, 12, 31, 47]):
            w.insert(
                {"item": f"order-{i}", "qty": i + 1}, rowtime=f"2009-03-01T12:15:{second:02d}Z"
            )
        w.set_rowtime_bound("2009-03-01T12:16:00Z")

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    stream = spark.readStream.format("rowtime").load(orders)
    windows = (
        rt.with_watermark(stream)
        .groupBy(F.window("rowtime", "10 seconds"))
        .agg(F.count("*").alias("orders"), F.sum("qty").alias("qty"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("rowtime"),
            "orders",
            "qty",
        )
    )
    query = (
        windows.writeStream.format("rowtime")
        .option("path", counts)
        .option("checkpointLocation", str(work / "checkpoint"))
        .outputMode("append")
        .start()
    )
    # Spark applies a watermark one batch after it learns it: drive until nothing is left.
    query.processAllAvailable()
    query.processAllAvailable()
    query.stop()

    print(f"\nwindows written to {counts} (rowtime = window end):")
    spark.read.format("rowtime").load(counts).where("not is_bound").orderBy("rowtime").show(
        truncate=False
    )
    print(f"clock of {orders}: {rt.get_rowtime_bound(orders)}")
    print(f"clock of {counts}: {rt.get_rowtime_bound(counts)}")
    print("\nrows the adjust policy discarded (kept in the quarantine, never silent):")
    spark.read.format("rowtime").option("output", "discarded").load(orders).show(truncate=False)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

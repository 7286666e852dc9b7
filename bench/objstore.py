"""Benchmark: streams on object storage (S3 on moto's server, Azure Blob on Azurite) beside the
embedded log, in one run: ``insert_arrow()``, the Spark reader and the Spark sink.

* ``insert_arrow``: ``--rows`` rows in flushes of ``--flush`` rows (each flush: one segment object
  and one commit object on a store; one fsync'd segment file on the log);
* reader: ``spark.read.format("rowtime")`` of the whole stream, counted (driver plan and executor
  reads of every segment);
* sink: ``readStream`` of an embedded-log stream of the same rows into a stream target of each
  backend, ``availableNow`` (executors stage runs on the store, the driver commits them).

The servers are started here on loopback ports (tests/objstore_servers.py: moto's object writes
serialised, as in the tests; Azurite with --disableTelemetry), so figures are of local emulators
on this machine, not of a cloud: they show the protocol's cost (requests per commit), not S3's.

Run: ./dev bench objstore [--rows N] [--flush N] [--skip-spark]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from objstore_servers import azurite_server, moto_server

from pyspark_rowtime.api import create_stream, open_writer

SCHEMA = "id BIGINT, price DOUBLE, qty INT, name STRING"


def make_table(n: int, start: int = 0) -> pa.Table:
    rng = np.random.default_rng(7 + start)
    names = np.array([f"name-{i:03d}" for i in range(1000)], dtype=object)
    return pa.table(
        {
            "id": np.arange(start, start + n, dtype=np.int64),
            "price": rng.random(n) * 100,
            "qty": rng.integers(0, 1000, n, dtype=np.int32),
            "name": pa.array(names[rng.integers(0, 1000, n)], pa.string()),
        }
    )


def insert(location: str, rows: int, flush: int) -> float:
    create_stream(location, SCHEMA)
    chunks = [make_table(min(flush, rows - i), i) for i in range(0, rows, flush)]
    t0 = time.perf_counter()
    with open_writer(location, 0) as w:
        for chunk in chunks:
            w.insert_arrow(chunk)
            w.flush()
    return time.perf_counter() - t0


def spark_read(spark, location: str, rows: int) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    n = spark.read.format("rowtime").load(location).where("NOT is_bound").count()
    took = time.perf_counter() - t0
    assert n == rows, (n, rows)
    return took


def spark_sink(spark, source: str, target: str, checkpoint: str) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    query = (
        spark.readStream.format("rowtime")
        .load(source)
        .writeStream.format("rowtime")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(target)
    )
    query.awaitTermination()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--flush", type=int, default=50_000)
    ap.add_argument("--skip-spark", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rowtime-bench-objstore-"))
    with moto_server() as s3, azurite_server(work / "azurite") as az:
        # Spark's workers inherit the environment the JVM started with: set both first.
        os.environ.update(s3.env)
        os.environ.update(az.env)
        places = {
            "log": lambda name: str(work / name),
            "s3 (moto)": s3.url,
            "az (Azurite)": az.url,
        }
        results: dict[str, dict[str, float]] = {}
        streams: dict[str, str] = {}
        for backend, at in places.items():
            loc = at("insert")
            took = insert(loc, args.rows, args.flush)
            streams[backend] = loc
            results[backend] = {"insert_arrow": args.rows / took}
            print(f"{backend:14s} insert_arrow {args.rows / took / 1e6:6.2f} M rows/s", flush=True)
        if not args.skip_spark:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from benchutil import spark_session

            spark = spark_session("bench-objstore")
            # warm the JVM and the workers: a read and a streaming query, measured by no one
            spark_read(spark, streams["log"], args.rows)
            spark_sink(spark, streams["log"], str(work / "warm"), str(work / "ck-warm"))
            for backend, at in places.items():
                took = spark_read(spark, streams[backend], args.rows)
                results[backend]["reader"] = args.rows / took
                print(f"{backend:14s} reader       {args.rows / took / 1e6:6.2f} M rows/s")
                took = spark_sink(
                    spark, streams["log"], at("sink"), str(work / f"ck-{backend[:2]}")
                )
                results[backend]["sink"] = args.rows / took
                print(f"{backend:14s} sink         {args.rows / took / 1e6:6.2f} M rows/s")
            spark.stop()
        print()
        print(f"rows {args.rows}, flushes of {args.flush}; rows/s (millions)")
        print(f"{'backend':14s} {'insert_arrow':>12s} {'reader':>8s} {'sink':>8s}")
        for backend, r in results.items():
            cells = [f"{r.get(k, float('nan')) / 1e6:8.2f}" for k in ("reader", "sink")]
            print(f"{backend:14s} {r['insert_arrow'] / 1e6:12.2f} {' '.join(cells)}")


if __name__ == "__main__":
    main()

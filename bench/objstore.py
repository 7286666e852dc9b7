"""Benchmark: streams on object storage (S3 on moto's server, Azure Blob on Azurite) beside the
embedded log, in one run: ``insert_arrow()``, the Spark reader and the Spark sink.

* ``insert_arrow``: ``--rows`` rows in flushes of ``--flush`` rows (each flush: one segment object
  and one commit object on a store; one fsync'd segment file on the log);
* reader: ``spark.read.format("rowtime")`` of the whole stream, counted (driver plan and executor
  reads of every segment);
* sink: ``readStream`` of an embedded-log stream of the same rows into a stream target of each
  backend, ``availableNow`` (executors stage runs on the store, the driver commits them);
* parquet: the same query into a Parquet target (``target=parquet``) in a local folder or on the
  store (executors upload the files as multipart uploads, the driver publishes them by
  server-side copy).

``--rounds`` rounds (default 3) run the backends in turn within each round, so a drift of the
machine's speed touches all of them; the table gives each figure's median over the rounds with
its range, and each store's median ratio to the embedded log of the same round.

The servers are started here on loopback ports (tests/objstore_servers.py: moto's object writes
serialised, as in the tests; Azurite with --disableTelemetry), so figures are of local emulators
on this machine, not of a cloud: they show the protocol's cost (requests per commit), not S3's.

Run: ./dev bench objstore [--rows N] [--flush N] [--rounds N] [--skip-spark]
"""

from __future__ import annotations

import argparse
import os
import statistics
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


def spark_sink(
    spark, source: str, target: str, checkpoint: str, options: dict[str, str] | None = None
) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    query = (
        spark.readStream.format("rowtime")
        .load(source)
        .writeStream.format("rowtime")
        .options(**(options or {}))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(target)
    )
    query.awaitTermination()
    return time.perf_counter() - t0


FIGURES = ("insert_arrow", "reader", "sink", "parquet")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--flush", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-spark", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rowtime-bench-objstore-"))
    with moto_server() as s3, azurite_server(work / "azurite") as az:
        # Spark's workers inherit the environment the JVM started with: set both first.
        os.environ.update(s3.env)
        os.environ.update(az.env)
        places = {
            "log": lambda name: str(work / f"{name}-{time.monotonic_ns()}"),
            "s3 (moto)": s3.url,
            "az (Azurite)": az.url,
        }
        spark = None
        if not args.skip_spark:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from benchutil import spark_session

            spark = spark_session("bench-objstore")
        # rounds[r][backend][figure] = rows/s
        rounds: list[dict[str, dict[str, float]]] = []
        for r in range(args.rounds + (spark is not None)):
            warm = spark is not None and r == 0  # the JVM's and workers' first round: not counted
            got: dict[str, dict[str, float]] = {}
            source = ""  # this round's stream in the embedded log: the sinks' input
            for backend, at in places.items():
                fig = got.setdefault(backend, {})
                loc = at("insert")
                fig["insert_arrow"] = args.rows / insert(loc, args.rows, args.flush)
                source = source or loc
                if spark is None:
                    continue
                fig["reader"] = args.rows / spark_read(spark, loc, args.rows)
                ck = str(work / f"ck-{r}-{backend[:2]}")
                fig["sink"] = args.rows / spark_sink(spark, source, at("sink"), ck)
                fig["parquet"] = args.rows / spark_sink(
                    spark, source, at("pq"), ck + "-pq", {"target": "parquet"}
                )
            label = "warm-up (not counted)" if warm else f"round {len(rounds) + 1}"
            figures = "; ".join(
                f"{b} " + " ".join(f"{k} {v / 1e6:.2f}" for k, v in f.items())
                for b, f in got.items()
            )
            print(f"{label}: {figures}", flush=True)
            if not warm:
                rounds.append(got)
        if spark is not None:
            spark.stop()
    report(rounds, args.rows, args.flush)


def report(rounds: list[dict[str, dict[str, float]]], rows: int, flush: int) -> None:
    """Medians over the rounds with their range, and each store's median ratio to the log."""
    print()
    print(f"rows {rows}, flushes of {flush}, {len(rounds)} rounds; M rows/s, median (min-max);")
    print("x log: the backend's figure over the embedded log's in the same round, median")
    figures = [f for f in FIGURES if f in rounds[0]["log"]]
    print(f"{'backend':14s} " + " ".join(f"{f:>26s}" for f in figures))
    for backend in rounds[0]:
        cells = []
        for f in figures:
            vals = [rd[backend][f] / 1e6 for rd in rounds]
            cell = f"{statistics.median(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})"
            if backend != "log":
                ratio = statistics.median(rd[backend][f] / rd["log"][f] for rd in rounds)
                cell += f" x{ratio:.2f}"
            cells.append(f"{cell:>26s}")
        print(f"{backend:14s} " + " ".join(cells))


if __name__ == "__main__":
    main()

"""Benchmark: ``time_interval_aggregate`` beside Spark's own ``groupBy(window(...))``.

Both read the same rows from one rowtime stream (2 partitions; columns id BIGINT, v DOUBLE,
s STRING of 8 values, and the rowtime, ~20,000 rows per second of event time) through
``format("rowtime")`` in one Spark session, with the same ``maxRowsPerBatch``, and aggregate
them per ``s`` (count, sum, max, max_by) into the ``noop`` sink, drained with
``trigger(availableNow=True)``. Two cases:

* ``tumbling``: panes of 10 s; Spark: ``with_watermark(df).groupBy("s", window("rowtime",
  "10 seconds")).agg(...)``, ours: ``time_interval_aggregate(df, ..., interval_duration=10,
  partition_by="s")``;
* ``sliding``: panes of 10 s every 2 s (each row in 5 panes); Spark: ``window("rowtime",
  "10 seconds", "2 seconds")``, ours: ``creation_period=2``.

With ``--ship``, the tumbling case runs a third query, ``ship``: the same rows handed to a
Python worker (``mapInArrow`` over the columns ours reads) and only counted there, with no
shuffle and no state: what handing every row to Python costs alone, which any operator that
runs in Python over every row pays; its ratio to Spark is printed beside the others, with no
target.

With ``--floors``, every case runs one more query, ``floor``: ours with its step replaced by one
that takes every frame and emits and keeps nothing (``benchutil.ConsumeOnly``): the rows read,
pre-aggregated in Python, shuffled and handed to Spark's ``applyInPandasWithState``, the best
that plan can do before any step; its ratio to Spark is printed beside the others, with no
target (the part of the gap that is Spark's stateful Python operator, not the step).

Each round runs every case, its queries in alternating order, after one warm-up round
(``benchutil.interleaved``); the figures are the median over rounds and the spread (min-max)
of input rows/s. The ratio is rowtime / spark, per round, then its median; the target is
``TARGET`` for each case (issue 54). Both pay for the reader (a Python data source), so the
ratio is the price of the window alone on top of what the query already pays.

Run: ``./dev bench windows [--rows N] [--rounds R] [--batch ROWS] [--cases tumbling,sliding]
[--ship] [--floors] [--json FILE]``; the JSON holds ``meta`` (``when``, ``load_min``, ``load_max``,
``cpus``...), each case's ratios and every run's seconds with the load beside it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from benchutil import (
    PARTITIONS,
    consume_only,
    drain,
    interleaved,
    round_ratios,
    run_meta,
    spark_session,
    timed,
    verdict,
    write_json,
    write_stream,
)
from pyspark.sql import functions as F

import pyspark_rowtime as pr
from pyspark_rowtime.watermark import watermark_rowtime
from pyspark_rowtime.windows import aggregate as aggregate_module

TARGET = 0.8
#: Each case: (Spark's window() arguments after the column, ours' pane parameters).
CASES: dict[str, tuple[tuple[str, ...], dict[str, object]]] = {
    "tumbling": (("10 seconds",), {"interval_duration": 10}),
    "sliding": (("10 seconds", "2 seconds"), {"interval_duration": 10, "creation_period": 2}),
}


def aggs() -> list[Any]:
    return [
        F.count("*").alias("n"),
        F.sum("v").alias("total"),
        F.max("v").alias("top"),
        F.max_by("id", "v").alias("top_id"),
    ]


def count_rows(batches: Iterator[Any]) -> Iterator[Any]:
    """The rows of a partition, counted (the ``ship`` query's Python side)."""
    import pyarrow as pa

    yield pa.RecordBatch.from_pydict({"n": [sum(b.num_rows for b in batches)]})


def verdicts(runs: list[dict[str, Any]], rows: int) -> dict[str, dict[str, Any]]:
    """Per case, the ratio rowtime / spark of each measured round (round 0 warms up), their
    median and whether it meets ``TARGET``; printed as ``ratio 0.83 (rounds ...), target``."""
    out = {}
    for case in dict.fromkeys(r["case"] for r in runs):
        seconds = {q: [r["seconds"] for r in runs if r["case"] == case and r["query"] == q]
                   for q in ("spark", "rowtime")}  # fmt: skip
        ratios = round_ratios(runs, case)
        median, ok = verdict(case, ratios, TARGET)
        ship = [r["seconds"] for r in runs if r["case"] == case and r["query"] == "ship"]
        if ship:
            ceiling = round_ratios(runs, case, ours="ship")
            rounds = ", ".join(f"{x:.2f}" for x in ceiling)
            print(f"{case}: every row to a Python worker and counted (ship): ratio "
                  f"{statistics.median(ceiling):.2f} (rounds {rounds}), the transfer alone: no "
                  "shuffle, no state")  # fmt: skip
        rates = {q: statistics.median(rows / s for s in xs[1:]) for q, xs in seconds.items()}
        out[case] = {"ratio": median, "rounds": ratios, "target": TARGET, "ok": ok,
                     "rows_per_s": rates}  # fmt: skip
        if ship:
            out[case]["ship_ratio"] = statistics.median(ceiling)
            out[case]["ship_rounds"] = ceiling
        if any(r["case"] == case and r["query"] == "floor" for r in runs):
            floor = round_ratios(runs, case, ours="floor")
            out[case]["floor_ratio"] = statistics.median(floor)
            out[case]["floor_rounds"] = floor
            print(f"{case}: the floor (no step) at {statistics.median(floor):.2f} of Spark "
                  f"(rounds {', '.join(f'{x:.2f}' for x in floor)}), no target")  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1_000_000, help="maxRowsPerBatch")
    ap.add_argument("--cases", default=",".join(CASES), help=f"of: {', '.join(CASES)}")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--ship", action="store_true", help="add the ship query (see above)")
    ap.add_argument("--floors", action="store_true", help="add the floor query (see above)")
    ap.add_argument("--json", default=None, help="write the figures to this file")
    args = ap.parse_args()
    chosen = args.cases.split(",")
    unknown = [c for c in chosen if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    base = args.dir or tempfile.mkdtemp(prefix="bench-windows-")
    spark = spark_session("bench-windows")
    runs: list[dict[str, Any]] = []
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

        def native(window: tuple[str, ...]) -> Any:
            return (
                pr.with_watermark(source()).groupBy("s", F.window("rowtime", *window)).agg(*aggs())
            )

        def ours(panes: dict[str, object]) -> Any:
            return pr.time_interval_aggregate(source(), aggs(), partition_by="s", **panes)

        def ship() -> Any:
            rows = watermark_rowtime(source(), late_rows_handled=True).select(
                "s", F.unix_micros("rowtime").alias("__t"), "v", "id"
            )
            return rows.mapInArrow(count_rows, "n BIGINT")

        cases: dict[str, dict[str, Any]] = {
            case: {
                "spark": timed(runs, case, "spark", lambda w=window: drain(native(w), base)),
                "rowtime": timed(runs, case, "rowtime", lambda p=panes: drain(ours(p), base)),
            }
            for case, (window, panes) in CASES.items()
            if case in chosen
        }

        def floor(panes: dict[str, object]) -> Any:
            with consume_only(aggregate_module, "PanesLogic"):
                return drain(ours(panes), base)

        if args.floors:
            for case, (_, panes) in CASES.items():
                if case in cases:
                    cases[case]["floor"] = timed(runs, case, "floor", lambda p=panes: floor(p))
        if args.ship and "tumbling" in cases:
            cases["tumbling"]["ship"] = timed(runs, "tumbling", "ship", lambda: drain(ship(), base))
        interleaved(cases, args.rounds, {case: args.rows for case in cases})
        summary = verdicts(runs, args.rows)
    finally:
        spark.stop()
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    meta = run_meta(runs, rows=args.rows, partitions=PARTITIONS, rounds=args.rounds,
                    batch=args.batch, master="local[2]")  # fmt: skip
    print(f"load average (1 min) during the rounds: {meta['load_min']:.1f}-{meta['load_max']:.1f}")
    if args.json:
        folder, name = os.path.split(os.path.abspath(args.json))
        print("wrote", write_json(folder, name, {"meta": meta, "summary": summary, "runs": runs}))


if __name__ == "__main__":
    main()

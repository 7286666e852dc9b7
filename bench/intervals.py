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
* **Left join, buckets**: the same two queries, ours defined with
  ``spark.rowtime.state.buckets`` = ``--buckets`` (default 64): the 5,000 keys in that many
  groups of Spark's state store (``windows/stateful.py``), for new checkpoints.

With ``--floors``, each case runs one more query, ``floor``: the operator's own plan with its
step replaced by one that takes every row and emits nothing and keeps nothing
(``ConsumeOnly``): what reading the rows, shuffling them and handing each group to Python costs
before any step, the best any operator built on ``applyInPandasWithState`` with that grouping
can do. Its ratio to Spark is printed beside the others, with no target. The per-key join
runs one more, ``wake`` (``ConsumeThenWake``): the same, but each key keeps its latest rowtime
and is woken once the watermark passes it, as the left join must be to emit the rows that met
nothing: two calls a key, the floor of any operator that emits at the watermark with a state
per key.

Both sides of each comparison pay for the reader (a Python data source), so a ratio is the
price of the operator on top of what the query already pays. Each case's ratio is printed beside
its target (issue 54: ``TARGETS``), at every size asked for: the cost per key and per call must
not decide the ratio at small sizes.

Run: ``./dev bench intervals [--rows N[,N...]] [--rounds R] [--batch ROWS] [--cases
aggregate,join,join-buckets] [--buckets N] [--floors] [--json FILE] [--jfr FILE] [--only
CASE:QUERY]``.
``--rows 200000,1000000`` measures each size in turn (new streams each); the JSON holds
``meta`` (``when``, ``load_min``, ``load_max``, ``cpus``...), per size each case's ratios and
every run's seconds with the load beside it. ``--only aggregate:rowtime`` runs that one query
once per size and measures nothing (to profile it: py-spy on the workers, ``--jfr`` on the
driver).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

from benchutil import (
    PARTITIONS,
    ConsumeOnly,
    ConsumeThenWake,
    consume_only,
    drain,
    interleaved,
    round_ratios,
    spark_session,
    timed,
    verdict,
    write_json,
    write_stream,
)
from pyspark.sql import Window
from pyspark.sql import functions as F

import pyspark_rowtime as pr
from pyspark_rowtime.windows import join as join_module
from pyspark_rowtime.windows import validity as validity_module

KEYS = 5_000
#: Each case's target, ours / Spark's (issue 54).
TARGETS = {"aggregate": 0.8, "left join": 1.0, "left join, buckets": 1.0}
#: The ``--floors`` queries, as the summary names them.
FLOORS = {"floor": "the floor (no step)", "wake": "the floor with a timer a key"}
#: The names ``--cases`` and ``--only`` take.
CASE_NAMES = {"aggregate": "aggregate", "join": "left join", "join-buckets": "left join, buckets"}


def run_batch(df: Any) -> tuple[float, int]:
    """Seconds to run a batch ``df`` into noop, and the rows it has (counted apart)."""
    t0 = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t0, -1


def verdicts(runs: list[dict[str, Any]], rows: int) -> dict[str, dict[str, Any]]:
    """Per case, the ratio rowtime / spark of each measured round (round 0 warms up), their
    median and whether it meets its target, printed as ``ratio 0.83 (rounds ...), target``."""
    out = {}
    for case in dict.fromkeys(r["case"] for r in runs):
        seconds = {q: [r["seconds"] for r in runs if r["case"] == case and r["query"] == q]
                   for q in ("spark", "rowtime")}  # fmt: skip
        ratios = round_ratios(runs, case)
        target = TARGETS[case]
        median, ok = verdict(f"{rows:,} rows, {case}", ratios, target)
        rates = {q: statistics.median(rows / s for s in xs[1:]) for q, xs in seconds.items()}
        out[case] = {"ratio": median, "rounds": ratios, "target": target, "ok": ok,
                     "input_rows_per_s": rates}  # fmt: skip
        for query, what in FLOORS.items():
            if not any(r["case"] == case and r["query"] == query for r in runs):
                continue
            floor = round_ratios(runs, case, ours=query)
            out[case][f"{query}_ratio"] = statistics.median(floor)
            out[case][f"{query}_rounds"] = floor
            print(f"{rows:,} rows, {case}: {what} at {statistics.median(floor):.2f} of Spark "
                  f"(rounds {', '.join(f'{x:.2f}' for x in floor)}), no target",
                  flush=True)  # fmt: skip
    return out


def one_size(spark: Any, base: str, rows: int, args: Any) -> dict[str, Any]:
    """Write the two streams of ``rows`` rows each under ``base`` and measure (or, with
    ``--only``, run once) the cases asked for: the size's summary and runs, for the JSON."""
    a, b = os.path.join(base, "a"), os.path.join(base, "b")
    t0 = time.perf_counter()
    write_stream(a, rows, seed=1, keys=KEYS)
    write_stream(b, rows, seed=2, keys=KEYS)
    print(
        f"rows: {rows:,} per stream in {PARTITIONS} partitions, maxRowsPerBatch "
        f"{args.batch:,}; Spark {spark.version}, local[2] (wrote in "
        f"{time.perf_counter() - t0:.0f} s)",
        flush=True,
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
        valid = (
            spark.read.format("rowtime")
            .option("interval.duration", "100 milliseconds")
            .load(a)
            .where(~F.col("is_bound"))
        )
        events = valid.select(
            "s", F.col("rowtime").alias("t"), F.lit(1).alias("dn"), F.col("v").alias("dv")
        ).unionByName(
            valid.select(
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

    def join_buckets() -> tuple[float, int]:
        # The same join with its 5,000 keys in --buckets groups of Spark's state store.
        spark.conf.set("spark.rowtime.state.buckets", str(args.buckets))
        try:
            left = source(a, "100 milliseconds").select(
                "k", "id", "v", "rowtime", "rowtime_end", "is_bound"
            )
            right = source(b, "100 milliseconds").select(
                "k", "id", "v", "rowtime", "rowtime_end", "is_bound"
            )
            df = pr.overlap_join(left, right, "k", how="left")
        finally:
            spark.conf.unset("spark.rowtime.state.buckets")
        return drain(df, base)

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

    def floor(query: Any, module: Any, name: str, logic: Any = ConsumeOnly) -> Any:
        def run() -> tuple[float, int]:
            with consume_only(module, name, logic):
                return query()

        return run

    queries = {
        "aggregate": {"spark": agg_spark, "rowtime": agg_ours},
        "left join": {"spark": join_spark, "rowtime": join_ours},
        "left join, buckets": {"spark": join_spark, "rowtime": join_buckets},
    }
    if args.floors:
        queries["aggregate"]["floor"] = floor(agg_ours, validity_module, "IntervalLogic")
        queries["left join"]["floor"] = floor(join_ours, join_module, "JoinLogic")
        queries["left join, buckets"]["floor"] = floor(join_buckets, join_module, "JoinLogic")
        queries["left join"]["wake"] = floor(join_ours, join_module, "JoinLogic", ConsumeThenWake)
    if args.only:
        case, name = args.only
        seconds, out = queries[case][name]()
        print(f"{case}, {name}: {seconds:.1f} s, {out:,} rows out (one run, not measured)")
        return {"only": [case, name], "seconds": seconds, "rows_out": out}
    runs: list[dict[str, Any]] = []
    cases = {
        case: {name: timed(runs, case, name, q) for name, q in queries[case].items()}
        for case in args.cases
    }
    rows_in = {"aggregate": rows, "left join": 2 * rows, "left join, buckets": 2 * rows}
    interleaved(cases, args.rounds, {case: rows_in[case] for case in cases})
    summary = verdicts(runs, rows)
    loads = [x for r in runs for x in (r["load_before"], r["load_after"])]
    return {"rows": rows, "load_min": min(loads), "load_max": max(loads), "summary": summary,
            "runs": runs}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1000000", help="rows per stream, N or N,N,...")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1_000_000, help="maxRowsPerBatch")
    ap.add_argument("--cases", default=",".join(CASE_NAMES), help="aggregate,join,join-buckets")
    ap.add_argument("--floors", action="store_true", help="run each case's floor query too")
    ap.add_argument("--buckets", type=int, default=64,
                    help="spark.rowtime.state.buckets of the join-buckets case")  # fmt: skip
    ap.add_argument("--only", default=None,
                    help="CASE:QUERY (rowtime, spark, floor or wake), run once")  # fmt: skip
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", default=None, help="write the figures to this file")
    ap.add_argument("--jfr", default=None, help="record the JVM with JFR into this file")
    args = ap.parse_args()
    sizes = [int(x.replace("_", "")) for x in args.rows.split(",")]
    names = args.cases.split(",")
    unknown = [c for c in names if c not in CASE_NAMES]
    if unknown:
        ap.error(f"--cases: unknown {unknown}; known: {', '.join(CASE_NAMES)}")
    args.cases = [CASE_NAMES[c] for c in names]
    if args.only:
        case, _, name = args.only.partition(":")
        args.floors = args.floors or name in ("floor", "wake")
        if case not in CASE_NAMES or name not in ("rowtime", "spark", "floor", "wake"):
            ap.error(f"--only={args.only}: give CASE:QUERY, CASE of {list(CASE_NAMES)}, "
                     "QUERY rowtime, spark, floor or wake (wake: join only)")  # fmt: skip
        args.only = (CASE_NAMES[case], name)
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    root = args.dir or tempfile.mkdtemp(prefix="bench-intervals-")
    spark = spark_session("bench-intervals", jfr=args.jfr)
    done = []
    try:
        for rows in sizes:
            folder = os.path.join(root, str(rows))
            done.append(one_size(spark, folder, rows, args))
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        spark.stop()
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    if args.only:
        return
    print("summary, ours / Spark's (median of the measured rounds):")
    for size in done:
        for case, v in size["summary"].items():
            rounds = ", ".join(f"{x:.2f}" for x in v["rounds"])
            print(f"  {size['rows']:>9,} rows, {case:<9}: ratio {v['ratio']:.2f} (rounds "
                  f"{rounds}), target >= {v['target']}: {'ok' if v['ok'] else 'MISS'}; "
                  f"load {size['load_min']:.1f}-{size['load_max']:.1f}")  # fmt: skip
    meta = {
        "rows": sizes,
        "partitions": PARTITIONS,
        "keys": KEYS,
        "buckets": args.buckets,
        "rounds": args.rounds,
        "batch": args.batch,
        "master": "local[2]",
        "cpus": os.cpu_count(),
        "load_min": min(s["load_min"] for s in done),
        "load_max": max(s["load_max"] for s in done),
        "when": when,
    }
    if args.json:
        folder, name = os.path.split(os.path.abspath(args.json))
        print("wrote", write_json(folder, name, {"meta": meta, "sizes": done}))


if __name__ == "__main__":
    main()

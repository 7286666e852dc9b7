"""Benchmark suite (issue 16): the reader against the floor of a Python source, in one session.

Over the same rows (``--rows``, default 20 million, in 2 partitions; columns id BIGINT,
v DOUBLE, s STRING and the rowtime), each drained with ``trigger(availableNow=True)`` into the
``noop`` sink, warm, in one Spark session (local[2] unless ``--master``):

* ``floor``: the cheapest Python source over the log (``bench/reader.py``'s ``FloorSource``:
  memory-mapped segment files, record batches as they are);
* ``reject``: this reader, rows in rowtime order, ``order=reject``;
* ``adjust 0.1%`` / ``1%`` / ``10%``: this reader, ``order=adjust`` (msec, 999) over rows of
  which that share comes up to 0.5 s out of order;
* ``parquet``: Spark's own Parquet file stream source over the same in-order rows;
* ``window rowtime`` / ``window parquet``: a query users run, a windowed count in append mode
  (``groupBy(window("rowtime", "1 minute")).count()``) over this reader after
  ``with_watermark`` (``order=reject``), and over Parquet's stream source after Spark's
  ``withWatermark("rowtime", "1 millisecond")`` (the delay ``with_watermark`` uses);
* ``window columns``: ``window rowtime`` with ``readStream.schema("rowtime TIMESTAMP, is_bound
  BOOLEAN")``, so that the reader ships only the columns the query reads (Spark 4.1-4.3 tell a
  Python source nothing of the columns a query uses; Parquet's scan reads the one it needs);
* ``window floor``: the same query over the floor (``withWatermark``; its few bound records
  are counted as rows), the most any Python source could give it, through ``FloorNowSource``:
  the floor taking part in ``availableNow`` as this reader does, so that its query too runs
  the no-data batch that emits the windows. Every windowed case must emit the same windows
  (the suite checks it); target (issue 54): ``window rowtime`` >= 0.9 of ``window floor``;
* ``window floor once`` (not in the default run): the plain floor, which Spark runs under
  ``availableNow`` as ``Trigger.Once`` (one micro-batch, no no-data batch, no window emitted:
  the figure issue 16 and the benchmarks page compared with before issue 54);
* (not in the default run) ``reject 64K`` / ``reject 256K`` / ``reject 1M``: ``reject`` with
  the reader's Arrow batches of at most that many rows instead of ``BATCH_ROWS``;
  ``reject 4M steps``: ``reject`` with ``maxRowsPerBatch`` 4,194,304 (several micro-batches);
  ``floor 64K``: the floor cut into 64K batches; ``floor 2 tasks``: the floor with two tasks per
  stream partition.

Every case runs once to warm up, then ``--rounds`` rounds, each running every case once in
turn (interleaved, so a change of machine load hits every case alike). A figure is the median
of the rounds, with the spread (lowest and highest). Beside each reader case: the share of the
drain the driver spends planning (``latestOffset`` + ``partitions``, timed inside the driver's
Python process that Spark runs them in). The load average (``os.getloadavg``) is recorded
around every round: on a shared machine, compare only figures of the same run.

Targets (issue 16): ``reject`` >= 0.9 of the floor, ``adjust 1%`` >= 0.8 of the floor, planning
< 10% of the drain; (issue 54) ``window rowtime`` and ``window columns`` >= 0.9 of ``window
floor``; each ratio is printed beside its target, with its round-by-round values.

Run: ``./dev bench suite [--rows N] [--rounds R] [--cases a,b] [--out DIR] [--name F]
[--master M]``. Writes ``DIR/F.json`` and ``DIR/F.png`` (default ``bench-results/suite``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from benchutil import drain, run_meta, spark_session, write_json
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from reader import PARTITIONS, FloorReader, FloorSource, write_data

import pyspark_rowtime as pr
from pyspark_rowtime.datasource import tasks as reader_tasks
from pyspark_rowtime.datasource.spark import RowtimeReaderSource, RowtimeStreamReader, _config
from pyspark_rowtime.streams.spark_compat import SupportsTriggerAvailableNow

SCHEMA = "id BIGINT, v DOUBLE, s STRING, rowtime TIMESTAMP"
ADJUST = {"order": "adjust", "adjust.unit": "msec", "adjust.range": "999"}
#: case -> (data set, source, options); the data set is the share of rows out of order.
CASES: dict[str, tuple[float, str, dict[str, str]]] = {
    "floor": (0.0, "floor", {}),
    "reject": (0.0, "rowtime", {"order": "reject"}),
    "adjust 0.1%": (0.001, "rowtime", ADJUST),
    "adjust 1%": (0.01, "rowtime", ADJUST),
    "adjust 10%": (0.1, "rowtime", ADJUST),
    "parquet": (0.0, "parquet", {}),
    "window rowtime": (0.0, "rowtime", {"order": "reject"}),
    "window parquet": (0.0, "parquet", {}),
    # the same over the floor: the most any Python source could give this query
    "window floor": (0.0, "floor now", {}),
    # the same over the floor as Spark runs it without SupportsTriggerAvailableNow: one
    # micro-batch, no no-data batch, no window emitted (not in the default run)
    "window floor once": (0.0, "floor", {}),
    # the same over this reader, given a schema that keeps only the columns the query reads
    "window columns": (0.0, "rowtime", {"order": "reject"}),
    # not in the default run: the floor with the reader's batch size (is Spark's cost per batch?)
    "floor 64K": (0.0, "floor", {"batchRows": str(1 << 16)}),
    # and with two tasks per stream partition (each every other record batch)
    "floor 2 tasks": (0.0, "floor", {"tasks": "2"}),
    # and the reader with other most rows per batch than BATCH_ROWS
    "reject 64K": (0.0, "rowtime", {"order": "reject", "bench.batchRows": str(1 << 16)}),
    "reject 256K": (0.0, "rowtime", {"order": "reject", "bench.batchRows": str(1 << 18)}),
    "reject 1M": (0.0, "rowtime", {"order": "reject", "bench.batchRows": str(1 << 20)}),
    # and in steps of at most 4M records (what a cap on the step costs)
    "reject 4M steps": (0.0, "rowtime", {"order": "reject", "maxRowsPerBatch": str(1 << 22)}),
}
DEFAULT_CASES = [
    "floor",
    "reject",
    "adjust 0.1%",
    "adjust 1%",
    "adjust 10%",
    "parquet",
    "window rowtime",
    "window parquet",
    "window columns",
    "window floor",
]
#: case -> (reference case, lowest ratio reference seconds / case seconds)
TARGETS = {"reject": ("floor", 0.9), "adjust 1%": ("floor", 0.8)}
TARGETS["window rowtime"] = ("window floor", 0.9)
TARGETS["window columns"] = ("window floor", 0.9)
TARGETS["window floor"] = ("window parquet", 0.7)
WINDOWED = {
    "window rowtime",
    "window parquet",
    "window columns",
    "window floor",
    "window floor once",
}
#: The columns ``window columns`` asks the reader for (``readStream.schema``).
WINDOW_COLUMNS = "rowtime TIMESTAMP, is_bound BOOLEAN"
PLANNING_TARGET = 0.10
TIMINGS_OPTION = "bench.timings"
BATCH_ROWS_OPTION = "bench.batchrows"


class FloorNowSource(FloorSource):
    """The floor for the windowed query: ``FloorSource`` whose reader implements
    ``SupportsTriggerAvailableNow``, as this reader does. Without it Spark runs an
    ``availableNow`` query over a Python source as ``Trigger.Once``: one micro-batch and no
    no-data batch, so the windowed count over the plain floor never applies the watermark its
    rows moved and emits no window at all, while the same query over this reader runs the
    no-data batch that emits every window. With it both queries do the same work and give the
    same windows (the suite checks the counts)."""

    @classmethod
    def name(cls) -> str:
        return "rowtime_floor_now"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        base = super().streamReader(schema)
        assert isinstance(base, FloorReader)
        return FloorNowReader(base.path, base.batch_rows, base.tasks)


class FloorNowReader(FloorReader, SupportsTriggerAvailableNow):
    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        return {"read": True}  # Spark 4.2 and later pass both (admission control)

    def prepareForTriggerAvailableNow(self) -> None:
        pass  # latestOffset is the whole log already: the run's target


class TimedSource(RowtimeReaderSource):
    """``format("rowtime")`` whose stream reader appends how long each driver call took to the
    file named by option ``bench.timings`` (the calls run in a Python process Spark starts)."""

    @classmethod
    def name(cls) -> str:
        return "rowtime_timed"

    def _reading(self) -> Any:
        bench = (TIMINGS_OPTION, BATCH_ROWS_OPTION)
        return _config({k: v for k, v in self.options.items() if k.lower() not in bench})

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        base = super().streamReader(schema)
        assert isinstance(base, RowtimeStreamReader)
        batch_rows = int(self.options.get(BATCH_ROWS_OPTION, reader_tasks.BATCH_ROWS))
        return TimedStreamReader(
            base.cfg, base.arrow_schema, self.options[TIMINGS_OPTION], batch_rows
        )


class TimedStreamReader(RowtimeStreamReader):
    def __init__(self, cfg: Any, arrow_schema: Any, timings: str, batch_rows: int) -> None:
        super().__init__(cfg, arrow_schema)
        self.timings = timings
        self.batch_rows = batch_rows

    def read(self, partition: InputPartition) -> Any:
        # Python workers are reused across queries: set the batch size on every task (the
        # default case sets it back), before read_task's generator starts.
        reader_tasks.BATCH_ROWS = self.batch_rows
        return super().read(partition)

    def _note(self, what: str, seconds: float) -> None:
        with open(self.timings, "a") as f:
            f.write(json.dumps({"call": what, "s": seconds}) + "\n")

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        t0 = time.perf_counter()
        out = super().latestOffset(start, limit)
        self._note("latestOffset", time.perf_counter() - t0)
        return out

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        t0 = time.perf_counter()
        out = super().partitions(start, end)
        self._note("partitions", time.perf_counter() - t0)
        return out


def planning_seconds(path: str) -> float:
    if not os.path.exists(path):
        return 0.0
    with open(path) as f:
        return sum(json.loads(line)["s"] for line in f if line.strip())


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def rounds(
    spark: Any, cases: list[str], data: dict[float, tuple[str, str]], n: int, root: str
) -> Iterator[dict[str, Any]]:
    """Round 0 warms up; rounds 1..n are measured. Yields one record per measured drain."""
    for r in range(n + 1):
        load_before = os.getloadavg()[0]
        for case in cases:
            late, source, options = CASES[case]
            stream, parquet = data[late]
            timings = os.path.join(root, f"timings-{uuid.uuid4().hex}.jsonl")
            if source == "parquet":
                df = spark.readStream.format("parquet").schema(SCHEMA).load(parquet)
            elif source in ("floor", "floor now"):
                name = "rowtime_floor" if source == "floor" else "rowtime_floor_now"
                df = spark.readStream.format(name).options(**options).load(stream)
            else:
                reader = spark.readStream.format("rowtime_timed").option(TIMINGS_OPTION, timings)
                for k, v in options.items():
                    reader = reader.option(k, v)
                if case == "window columns":
                    reader = reader.schema(WINDOW_COLUMNS)
                df = reader.load(stream)
            if case in WINDOWED:
                if source != "rowtime":
                    df = df.withWatermark("rowtime", "1 millisecond")
                else:
                    df = pr.with_watermark(df)
                df = df.groupBy(F.window("rowtime", "1 minute")).count()
            for attempt in range(3):
                try:
                    seconds, windows = drain(df, root)  # and the rows (windows) out
                    break
                except Exception as e:
                    # At a load above 20 Spark's planner process can fail to connect back
                    # within Spark's fixed timeout: the query never started, so run it again.
                    print(f"  round {r} {case}: the drain failed ({str(e)[:120]})", flush=True)
                    if attempt == 2:
                        return  # keep the whole rounds done so far
            else:
                return
            planning = planning_seconds(timings)
            if r:
                yield {
                    "round": r,
                    "case": case,
                    "seconds": seconds,
                    "planning_seconds": planning,
                    "rows_out": windows,
                    "load_before": load_before,
                    "load_after": os.getloadavg()[0],
                }
            print(
                f"  round {r}{' (warm-up)' if not r else ''} {case:<12} {seconds:7.2f} s"
                f"  planning {planning:5.2f} s  load {os.getloadavg()[0]:.1f}",
                flush=True,
            )


def summarise(runs: list[dict[str, Any]], cases: list[str], rows: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    by_round: dict[int, dict[str, float]] = {}
    for run in runs:
        by_round.setdefault(run["round"], {})[run["case"]] = run["seconds"]
    for case in cases:
        mine = [r for r in runs if r["case"] == case]
        secs = [r["seconds"] for r in mine]
        entry: dict[str, Any] = {
            "seconds": spread(secs),
            "mrows_per_s": spread([rows / s / 1e6 for s in secs]),
        }
        if CASES[case][1] == "rowtime":
            entry["planning_share"] = spread([r["planning_seconds"] / r["seconds"] for r in mine])
        if "floor" in cases and case != "floor" and case not in WINDOWED:
            # The ratio within each round (same load), then its median over rounds: with a
            # noisy machine it can differ from the ratio of the median rates.
            entry["of_floor"] = spread([rd["floor"] / rd[case] for rd in by_round.values()])
        reference = TARGETS.get(case, ("floor",))[0]
        if reference != "floor" and reference in cases:
            ratios = [by_round[r][reference] / by_round[r][case] for r in sorted(by_round)]
            entry["of_reference"] = spread(ratios)
            entry["of_reference_rounds"] = ratios
        if case in WINDOWED:
            entry["rows_out"] = sorted({r["rows_out"] for r in mine})
        out[case] = entry
    return out


def target_lines(summary: dict[str, Any]) -> list[str]:
    """Each ratio beside its target, with the ratio of every round (issue 54, item 6), e.g.
    ``window rowtime / window floor: ratio 0.83 (rounds 0.81, 0.86, 0.79), target >= 0.9:
    MISS``; and whether the windowed queries that should give the same windows did."""
    lines = []
    for case, e in summary.items():
        if case not in TARGETS:
            continue
        reference, share = TARGETS[case]
        if reference == "floor" and "of_floor" in e:
            ratio, rounds_ = e["of_floor"], None
        elif "of_reference" in e:
            ratio, rounds_ = e["of_reference"], e["of_reference_rounds"]
        else:
            continue
        each = f" (rounds {', '.join(f'{x:.2f}' for x in rounds_)})" if rounds_ else ""
        verdict = "ok" if ratio["median"] >= share else "MISS"
        lines.append(
            f"{case} / {reference}: ratio {ratio['median']:.2f}{each}, target >= {share}: {verdict}"
        )
    # The plain floor under availableNow emits no window (see "window floor once").
    same = {
        c: e["rows_out"] for c, e in summary.items() if c in WINDOWED and c != "window floor once"
    }
    if len(same) > 1:
        agree = len({tuple(v) for v in same.values()}) == 1
        outs = ", ".join(f"{c} {'/'.join(str(x) for x in v)}" for c, v in same.items())
        lines.append(f"windows out: {outs}: {'the same' if agree else 'DIFFERENT'}")
    return lines


def print_table(summary: dict[str, Any], rows: int) -> None:
    def fmt(s: dict[str, float], digits: int = 2) -> str:
        return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"

    print(f"\n{'case':<18}{'seconds':>20}{'M rows/s':>20}{'of floor':>20}{'planning':>22}  target")
    for case, e in summary.items():
        of_floor = fmt(e["of_floor"]) if "of_floor" in e else "-"
        plan = fmt(e["planning_share"]) if "planning_share" in e else "-"
        target = ""
        if case in TARGETS:
            reference, share = TARGETS[case]
            key = "of_floor" if reference == "floor" else "of_reference"
            if key in e:
                ok = e[key]["median"] >= share
                target = f">= {share} of {reference} {'ok' if ok else 'MISS'}"
                if key == "of_reference":
                    target += f" ({fmt(e[key])})"
        if "planning_share" in e:
            ok = e["planning_share"]["median"] < PLANNING_TARGET
            target += f"; planning {'ok' if ok else 'MISS'}"
        print(
            f"{case:<18}{fmt(e['seconds']):>20}{fmt(e['mrows_per_s']):>20}{of_floor:>20}"
            f"{plan:>22}  {target}"
        )
    print("(median [lowest-highest] over the rounds; 'of floor' = floor seconds / case seconds)")
    for line in target_lines(summary):
        print(line)


def plot(summary: dict[str, Any], meta: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(summary)
    med = [summary[c]["mrows_per_s"]["median"] for c in cases]
    lo = [m - summary[c]["mrows_per_s"]["min"] for c, m in zip(cases, med, strict=True)]
    hi = [summary[c]["mrows_per_s"]["max"] - m for c, m in zip(cases, med, strict=True)]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    colors = ["#888888" if "floor" in c or "parquet" in c else "#3b6ea8" for c in cases]
    ax.bar(cases, med, yerr=[lo, hi], capsize=4, color=colors)
    if "floor" in summary:
        floor = summary["floor"]["mrows_per_s"]["median"]
        for share, style in ((0.9, "--"), (0.8, ":")):
            ax.axhline(
                floor * share,
                color="#c0392b",
                linestyle=style,
                linewidth=1,
                label=f"{share} of the floor's median",
            )
        ax.legend(loc="upper left", fontsize=8)
    labels = []
    for c in cases:
        e = summary[c]
        label = c
        if "of_floor" in e:
            label += f"\n{e['of_floor']['median']:.2f} of floor"
        if "of_reference" in e:
            label += f"\n{e['of_reference']['median']:.2f} of {TARGETS[c][0]}"
        if "planning_share" in e:
            label += f"\nplanning {e['planning_share']['median']:.0%}"
        labels.append(label)
    ax.set_xticks(range(len(cases)), labels, fontsize=8)
    ax.set_ylabel("M rows/s (median; whiskers: lowest-highest)")
    ax.set_xlabel("'of floor': median over rounds of floor seconds / case seconds in that round")
    ax.set_title(
        f"{meta['rows'] / 1e6:g} M rows, {PARTITIONS} partitions, {meta['master']}, "
        f"{meta['rounds']} interleaved rounds; "
        f"load avg {meta['load_min']:.1f}-{meta['load_max']:.1f}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    # argparse expands % in help texts; the case names hold it ("adjust 1%")
    cases = ", ".join(CASES).replace("%", "%%")
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"of: {cases}")
    ap.add_argument("--out", default="bench-results", help="folder for NAME.json and NAME.png")
    ap.add_argument("--name", default="suite", help="file name of the JSON and plot, no suffix")
    ap.add_argument("--dir", default=None, help="where to write the data (default: a temp dir)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument(
        "--jfr", default=None, help="record the JVM with Flight Recorder into this .jfr file"
    )
    ap.add_argument(
        "--java-options",
        default="",
        help="options for Spark's JVM, e.g. -Darrow.enable_unsafe_memory_access=true",
    )
    args = ap.parse_args(argv)
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    base = args.dir or tempfile.mkdtemp(prefix="bench-suite-")
    spark = spark_session(
        "bench-suite", master=args.master, jfr=args.jfr, java_options=args.java_options
    )
    spark.dataSource.register(FloorSource)
    spark.dataSource.register(FloorNowSource)
    spark.dataSource.register(TimedSource)
    spark_version = spark.version
    print(f"rows: {args.rows:,} in {PARTITIONS} partitions; Spark {spark_version}, {args.master}")
    try:
        data: dict[float, tuple[str, str]] = {}
        for late in sorted({CASES[c][0] for c in cases}):
            t0 = time.perf_counter()
            root = os.path.join(base, f"late-{late}")
            data[late] = write_data(root, args.rows, late, parquet_copy=late == 0.0)
            print(f"wrote {late:.1%} out of order in {time.perf_counter() - t0:.0f} s", flush=True)
        runs = list(rounds(spark, cases, data, args.rounds, base))
        complete = {r["round"] for r in runs if r["case"] == cases[-1]}
        runs = [r for r in runs if r["round"] in complete]  # whole rounds only
        if not runs:
            raise SystemExit("no round completed")
    finally:
        spark.stop()
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    summary = summarise(runs, cases, args.rows)
    meta = run_meta(runs, rows=args.rows, partitions=PARTITIONS, rounds=args.rounds,
                    master=args.master, java_options=args.java_options)  # fmt: skip
    meta["spark"] = spark_version
    print_table(summary, args.rows)
    print(f"load average (1 min) during the rounds: {meta['load_min']:.1f}-{meta['load_max']:.1f}")
    result = {"meta": meta, "summary": summary, "runs": runs}
    write_json(args.out, f"{args.name}.json", result)
    if not args.no_plot:
        plot(summary, meta, os.path.join(args.out, f"{args.name}.png"))
    done = f"{args.out}/{args.name}.json" + ("" if args.no_plot else " and .png")
    print(f"wrote {done}")
    return result


if __name__ == "__main__":
    main()

"""The main job: freeway sensors through this project and through plain Spark, side by side.

``rowtime demo`` (or ``./dev demo``, which sets up the venv first):

1. generates the freeway data set (``demo_data``: districts skewed by minutes, readings out
   of order by seconds, a few far too late, a quiet gap) and replays it step by step through the
   adapter API into the rowtime stream ``traffic`` (``order=adjust``, unit sec, range 5), and
   the same readings into Parquet files, one per step, as a plain Spark pipeline would land them;
2. after each step runs both queries once, one after the other:
   (a) ``format("rowtime")`` -> ``time_interval_aggregate`` (IBM's traffic example: maximum lane
   flow per freeway over 50-second intervals every 25 seconds) -> the rowtime sink, stream
   ``maxflow``; (b) the Parquet files -> ``withWatermark("rowtime", "10 seconds")`` ->
   ``groupBy(window(rowtime, "50 seconds", "25 seconds"), freeway)``;
3. ends the stream, copies ``maxflow`` to Parquet with the rowtime sink (files with
   ``_COMPLETE`` markers), reads the quarantine, and prints the comparison against the answer
   computed by brute force from the generated data; draws ``demo.png`` if matplotlib is there.

Arrival times are simulated (each step stands for ``--tick`` seconds of arrival); rowtimes are
the readings' own. Everything the comparison says is read back from Spark and the log.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import pyspark_rowtime as rt

from .api import rowtime_bound_us
from .bounds.bounds import END_OF_STREAM_US
from .demo_data import (
    ADJUST_RANGE_S,
    FREEWAYS,
    INTERVAL_S,
    PERIOD_S,
    SECOND,
    DemoConfig,
    DemoData,
    expected,
    generate,
)
from .demo_figure import draw

#: Plain Spark's watermark delay: enough for readings out of order by a few seconds, which is
#: what a developer would pick from looking at one sensor's feed.
SPARK_DELAY_S = 10
SCHEMA_DDL = "freeway STRING, sensor INT, lane_flow INT"
INSTALL_HINT = "pip install 'pyspark-rowtime[demo]'  (or: pip install matplotlib)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The demo's options (shared by ``rowtime demo`` and ``python -m pyspark_rowtime.demo``)."""
    d = DemoConfig()
    p.add_argument(
        "--rows",
        type=int,
        default=d.rows,
        help=f"readings to generate (data size; default {d.rows:,})",
    )
    p.add_argument(
        "--partitions",
        type=int,
        default=d.partitions,
        help=f"districts, one stream partition each (default {d.partitions})",
    )
    p.add_argument(
        "--minutes",
        type=float,
        default=d.minutes,
        help=f"minutes of event time (default {d.minutes:g})",
    )
    p.add_argument(
        "--tick",
        type=int,
        default=d.tick_s,
        help=f"speed: seconds of arrival time per replay step; each step runs both queries once, "
        f"so a larger tick finishes sooner with coarser timing (default {d.tick_s})",
    )
    p.add_argument("--seed", type=int, default=d.seed, help=argparse.SUPPRESS)
    p.add_argument(
        "--out",
        default=None,
        help="output folder for the streams, Parquet files, checkpoints and demo.png "
        "(default: a new temporary folder; an existing folder's demo output is replaced)",
    )
    p.add_argument("--no-figure", action="store_true", help="skip the PNG figure")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="rowtime demo", description=__doc__.split("\n")[0] if __doc__ else None
    )
    add_arguments(ap)
    return run(ap.parse_args(argv))


# -- what the run records -------------------------------------------------------------------------


@dataclass
class Trace:
    """What each query did, step by step (arrival times in simulated microseconds)."""

    step_arrival: list[int] = field(default_factory=list)
    stream_clock: list[int | None] = field(default_factory=list)
    partition_clock: list[list[int | None]] = field(default_factory=list)
    a_watermark: list[int | None] = field(default_factory=list)
    b_watermark: list[int | None] = field(default_factory=list)
    #: watermark each data batch of (b) ran with, per step (None: no data batch in that step)
    b_batch_watermark: list[int | None] = field(default_factory=list)
    b_dropped_metric: int = 0
    #: (freeway, start_us, end_us, max_flow, step emitted)
    a_windows: list[tuple[str, int, int, int, int]] = field(default_factory=list)
    b_windows: list[tuple[str, int, int, int, int]] = field(default_factory=list)


def _us(value: Any) -> int | None:
    """A progress watermark (ISO string) or a datetime, in microseconds."""
    if value is None:
        return None
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return round(value.timestamp() * 1_000_000)


def _at(value: Any) -> int:
    """A window bound (never null) in microseconds."""
    us = _us(value)
    assert us is not None, "a window without a start or end"
    return us


def _hms(us: int | None) -> str:
    """A time of day (UTC) for the report; ``end`` for the end of stream."""
    if us is None:
        return "none"
    if us >= END_OF_STREAM_US:
        return "end"
    return dt.datetime.fromtimestamp(us / 1e6, dt.timezone.utc).strftime("%H:%M:%S")


def _progress(query: Any, seen: set[tuple[int, str]]) -> list[dict[str, Any]]:
    """Progress reports not returned before. Keyed by batch id *and* time: while a query is
    idle Spark also reports progress (no rows) under the id of the batch still to come."""
    new = [p for p in query.recentProgress if (p["batchId"], p["timestamp"]) not in seen]
    seen.update((p["batchId"], p["timestamp"]) for p in new)
    return new


# -- the run --------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        config = DemoConfig(args.rows, args.partitions, args.minutes, args.tick, args.seed)
    except ValueError as e:
        print(f"rowtime demo: error: {e}", file=sys.stderr)
        return 2
    figure = not args.no_figure
    if figure:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(f"rowtime demo: no matplotlib, so no figure; to draw it: {INSTALL_HINT}")
            figure = False
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="rowtime-demo-"))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Spark's Python workers inherit this: pandas' FutureWarnings from inside pyspark's own
    # worker code would bury the progress lines, and are nothing the user can act on.
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")

    data = generate(config)
    print(
        f"data: {data.rows:,} readings from {len(FREEWAYS)} freeways in {config.partitions} "
        f"districts (partitions), {config.minutes:g} minutes of event time from "
        f"{_hms(int(data.rowtime[0].min()))} UTC; districts deliver "
        f"{', '.join(f'{int(s)}s' for s in data.lags_s)} late, out of order within a few "
        f"seconds; {sum(int(t.sum()) for t in data.too_late)} readings far too late; no "
        f"reading arrives {_hms(data.gap_us[0])}-{_hms(data.gap_us[1])} (arrival)"
    )
    print(f"output folder: {out}")
    print("starting Spark ...", flush=True)

    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("rowtime demo")
        # Four freeways, four keys: one state partition saves a Python worker per step.
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        outcome = run_queries(spark, data, out)
    finally:
        spark.stop()
    trace, counts, discards = outcome.trace, outcome.counts, outcome.discards
    truth_discarded, truth = expected(data)
    report = _compare(data, trace, counts, discards, truth_discarded, truth)
    print(report)
    # What each query did, step by step, for plots of your own (times in microseconds).
    (out / "trace.json").write_text(
        json.dumps({"trace": asdict(trace), "discarded": discards}, default=str)
    )
    if figure:
        png = out / "demo.png"
        lost_all, _ = plain_losses(data, trace)
        draw(data, trace, discards, png, spark_delay_s=SPARK_DELAY_S, lost_all=lost_all)
        print(f"figure: {png}")
    print(f"done in {time.monotonic() - started:.0f} s")
    return 0


@dataclass
class Outcome:
    """What ``run_queries`` saw: the trace, counts, and the quarantine's rows."""

    trace: Trace
    counts: dict[str, int]
    discards: list[dict[str, Any]]


def run_queries(spark: Any, data: DemoData, out: Path) -> Outcome:
    """Replay ``data`` into ``out`` (its demo folders are replaced) and run both queries, the
    quarantine read and the Parquet copy on ``spark`` (left running)."""
    out.mkdir(parents=True, exist_ok=True)
    for sub in (
        "traffic",
        "landing",
        "maxflow",
        "maxflow_parquet",
        "checkpoints",
        "demo.png",
        "trace.json",
    ):
        target = out / sub
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    # Every step's progress is read back; Spark keeps the last 100 by default.
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "1000")
    trace, counts = _replay(spark, data, out)
    discards = _quarantine(spark, out)
    _to_parquet(spark, out)
    return Outcome(trace, counts, discards)


def _replay(spark: Any, data: DemoData, out: Path) -> tuple[Trace, dict[str, int]]:
    from pyspark.sql import functions as F

    traffic, landing, maxflow = out / "traffic", out / "landing", out / "maxflow"
    chk = out / "checkpoints"
    rt.create_stream(
        traffic,
        SCHEMA_DDL,
        partitions=data.config.partitions,
        order="adjust",
        adjust_unit="sec",
        adjust_range=ADJUST_RANGE_S,
    )
    landing.mkdir()
    names = np.array(FREEWAYS)

    # (a) this project: the reader keeps each district in order (adjust), aligns the districts
    # and moves the watermark with bounds; the window is IBM's; the sink keeps a clock.
    source = spark.readStream.format("rowtime").load(str(traffic))
    panes = rt.time_interval_aggregate(
        source,
        [F.max("lane_flow").alias("max_flow"), F.max_by("sensor", "lane_flow").alias("sensor")],
        interval_duration=INTERVAL_S,
        creation_period=PERIOD_S,
        partition_by="freeway",
    )
    query_a = (
        panes.writeStream.format("rowtime")
        .option("path", str(maxflow))
        .option("checkpointLocation", str(chk / "a"))
        .start()
    )
    # (b) plain Spark: the same readings from Parquet files, Spark's own watermark and window.
    trace = Trace()
    current = {"step": -1}

    def collect(batch: Any, _batch_id: int) -> None:
        for r in batch.collect():
            trace.b_windows.append(
                (r["freeway"], _at(r["start"]), _at(r["end"]), r["max_flow"], current["step"])
            )

    plain = (
        spark.readStream.schema(f"{SCHEMA_DDL}, rowtime TIMESTAMP")
        .option("maxFilesPerTrigger", 1)  # one step's file per batch, as files landing one by one
        .parquet(str(landing))
        .withWatermark("rowtime", f"{SPARK_DELAY_S} seconds")
        .groupBy(F.window("rowtime", f"{INTERVAL_S} seconds", f"{PERIOD_S} seconds"), "freeway")
        .agg(F.max("lane_flow").alias("max_flow"))
        .select("freeway", "window.start", "window.end", "max_flow")
    )
    query_b = (
        plain.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(chk / "b"))
        .outputMode("append")
        .start()
    )

    writers = [rt.open_writer(traffic, partition=p) for p in range(data.config.partitions)]
    seen_a: set[tuple[int, str]] = set()
    seen_b: set[tuple[int, str]] = set()
    a_rows_seen = 0
    counts = {"rows_in": 0}
    top = [-1] * data.config.partitions
    steps = len(data.ticks)
    try:
        for k in range(steps + 1):
            current["step"] = k
            final = k == steps
            if not final:
                arrived = []
                for p, s in enumerate(data.step_slices(k)):
                    n = s.stop - s.start
                    if n:
                        table = pa.table(
                            {
                                "freeway": names[data.freeway[p][s]],
                                "sensor": data.sensor[p][s],
                                "lane_flow": data.lane_flow[p][s],
                                "rowtime": pa.array(data.rowtime[p][s], pa.timestamp("us", "UTC")),
                            }
                        )
                        writers[p].insert_arrow(table, rowtime_column="rowtime")
                        arrived.append(table)
                        top[p] = max(top[p], int(data.rowtime[p][s].max()))
                    if data.bounds[k, p] >= 0:
                        writers[p].set_rowtime_bound(rt.from_rowtime_us(int(data.bounds[k, p])))
                    writers[p].flush()
                    counts["rows_in"] += n
                if arrived:
                    # Written aside, then renamed: Spark's file source skips names starting with
                    # "_" and must never list a file that is half written.
                    part = landing / f"_step-{k:04d}.parquet"
                    pq.write_table(pa.concat_tables(arrived), part)
                    part.rename(landing / f"step-{k:04d}.parquet")
            else:
                for w in writers:
                    w.end_stream()
            t0 = time.monotonic()
            written = [w.end_offset for w in writers]
            _settle(query_a, lambda written=written: _read_up_to(query_a) == written)
            t1 = time.monotonic()
            if not final:
                _settle(query_b, lambda: _rows_read(query_b) == counts["rows_in"])
            t2 = time.monotonic()
            # What each query did in this step.
            arrival = (
                int(data.ticks[k])
                if not final
                else int(data.ticks[-1]) + data.config.tick_s * SECOND
            )
            trace.step_arrival.append(arrival)
            clock = rowtime_bound_us(traffic)
            trace.stream_clock.append(clock)
            trace.partition_clock.append(
                [_partition_clock(traffic, p) for p in range(data.config.partitions)]
            )
            pa_ = _progress(query_a, seen_a)
            pb = _progress(query_b, seen_b)
            trace.a_watermark.append(_last_watermark(pa_, trace.a_watermark))
            trace.b_watermark.append(_last_watermark(pb, trace.b_watermark))
            data_batches = [b for b in pb if b["numInputRows"] > 0]
            trace.b_batch_watermark.append(
                _us(data_batches[0]["eventTime"].get("watermark")) if data_batches else None
            )
            for b in pb:
                for op in b.get("stateOperators", []):
                    trace.b_dropped_metric += int(op.get("numRowsDroppedByWatermark", 0))
            if rowtime_bound_us(maxflow) is not None:
                emitted = rt.read_stream(maxflow)
                rows = emitted.filter(pa.compute.invert(emitted["is_bound"])).to_pylist()
                for r in rows[a_rows_seen:]:
                    trace.a_windows.append(
                        (
                            r["freeway"],
                            _at(r["interval_start"]),
                            _at(r["interval_end"]),
                            r["max_flow"],
                            k,
                        )
                    )
                a_rows_seen = len(rows)
            na = sum(1 for w in trace.a_windows if w[4] == k)
            nb = sum(1 for w in trace.b_windows if w[4] == k)
            label = "end of stream" if final else f"arrival {_hms(arrival)}"
            print(
                f"  step {k + 1:>2}/{steps + 1} {label:>16} | in {counts['rows_in']:>8,} | "
                f"rowtime: clock {_hms(clock)}, +{na:>2} windows | plain Spark: watermark "
                f"{_hms(trace.b_watermark[-1])}, +{nb:>2} windows | {_ran(pa_)}+{_ran(pb)} batches "
                f"{t1 - t0:.1f}+{t2 - t1:.1f} s",
                flush=True,
            )
    finally:
        for w in writers:
            w.close()
        query_a.stop()
        query_b.stop()
    return trace, counts


def _ran(progress: list[dict[str, Any]]) -> int:
    """How many of these reports are batches that ran (an idle report has no addBatch)."""
    return sum(1 for p in progress if "addBatch" in p.get("durationMs", {}))


def _settle(query: Any, caught_up: Any) -> None:
    """Run ``query`` until it has read everything written and a further round ran no batch
    (so the watermark's own follow-up batch has run too). ``processAllAvailable`` alone can
    return before the stream thread sees a file or log segment written just before the call."""
    for _ in range(100):
        before = query.lastProgress["batchId"] if query.lastProgress else -1
        query.processAllAvailable()
        after = query.lastProgress["batchId"] if query.lastProgress else -1
        if after == before and caught_up():
            return
    raise RuntimeError(f"query {query.name or query.id} did not catch up with its input")


def _read_up_to(query: Any) -> list[int] | None:
    """The log offset each partition of the rowtime source has been read up to."""
    progress = query.lastProgress
    if not progress or not progress["sources"]:
        return None
    end = progress["sources"][0].get("endOffset")
    if isinstance(end, str):
        end = json.loads(end)
    if not end:
        return None
    parts = end["partitions"]
    return [int(parts[str(p)]["next"]) for p in range(len(parts))]


def _rows_read(query: Any) -> int:
    return sum(int(p["numInputRows"]) for p in query.recentProgress)


def _last_watermark(progress: list[dict[str, Any]], before: list[int | None]) -> int | None:
    """The watermark after the step's batches (Spark reports the one each batch ran with)."""
    given = [_us(p["eventTime"].get("watermark")) for p in progress if p.get("eventTime")]
    marks = [m for m in given if m]  # Spark reports 1970-01-01 (0) before its first watermark
    return max(marks) if marks else (before[-1] if before else None)


def _partition_clock(traffic: Path, p: int) -> int | None:
    return rt.open_stream(traffic).clock_us(p)


def _quarantine(spark: Any, out: Path) -> list[dict[str, Any]]:
    """The rows the policy discarded, read back from the log's quarantine."""
    q = spark.read.format("rowtime").option("output", "discarded").load(str(out / "traffic"))
    return [
        r.asDict() for r in q.select("partition", "offset", "rowtime", "reason", "clock").collect()
    ]


def _to_parquet(spark: Any, out: Path) -> None:
    """A downstream job: copy the windows stream to Parquet files with the rowtime sink (hourly
    partitions, each marked ``_COMPLETE`` once the clock passes its end)."""
    windows = spark.readStream.format("rowtime").load(str(out / "maxflow"))
    query = (
        windows.writeStream.format("rowtime")
        .option("target", "parquet")
        .option("granularity", "minute")
        .option("path", str(out / "maxflow_parquet"))
        .option("checkpointLocation", str(out / "checkpoints" / "parquet"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def _windows_vs(
    emitted: list[tuple[str, int, int, int, int]], truth: dict[tuple[str, int], int]
) -> dict[str, int]:
    """How one query's windows compare with the brute-force answer (last emission wins)."""
    final: dict[tuple[str, int], int] = {}
    for fw, start, _end, value, _step in emitted:
        final[(fw, start)] = value
    right = sum(1 for key, v in final.items() if truth.get(key) == v)
    return {
        "emitted": len(emitted),
        "distinct": len(final),
        "right": right,
        "wrong": len(final) - right,
        "missing": sum(1 for key in truth if key not in final),
    }


def plain_losses(data: DemoData, trace: Trace) -> tuple[int, int]:
    """Readings plain Spark lost, from the data and the watermark each of its data batches ran
    with (Spark drops a row's contribution to a window whose end is at or below it): readings
    lost from every window they belong to, and from at least one."""
    lost_all = lost_some = 0
    period, length = PERIOD_S * SECOND, INTERVAL_S * SECOND
    for k in range(len(data.ticks)):
        w = trace.b_batch_watermark[k]
        if w is None:
            continue
        for p, s in enumerate(data.step_slices(k)):
            t = data.rowtime[p][s]
            last_end = (t // period) * period + length  # the latest window holding t
            first_end = last_end - period
            lost_all += int((last_end <= w).sum())
            lost_some += int((first_end <= w).sum())
    return lost_all, lost_some


def _compare(
    data: DemoData,
    trace: Trace,
    counts: dict[str, int],
    discards: list[dict[str, Any]],
    truth_discarded: list[np.ndarray],
    truth: dict[tuple[str, int], int],
) -> str:
    reasons: dict[str, int] = {}
    for d in discards:
        reasons[d["reason"]] = reasons.get(d["reason"], 0) + 1
    predicted = sum(int(x.sum()) for x in truth_discarded)
    a, b = _windows_vs(trace.a_windows, truth), _windows_vs(trace.b_windows, truth)
    lost_all, lost_some = plain_losses(data, trace)
    arrival = trace.step_arrival

    def latency(windows: list[tuple[str, int, int, int, int]]) -> str:
        delays = [(arrival[step] - end) / SECOND for _fw, _s, end, _v, step in windows]
        if not delays:
            return "-"
        return f"{np.median(delays):.0f} s"

    g0, g1 = data.gap_us
    # Steps wholly inside the gap: nothing arrived in them, only the adapters' bounds.
    in_gap = [
        k for k in range(1, len(data.ticks)) if data.ticks[k - 1] >= g0 and data.ticks[k] <= g1
    ]
    before = in_gap[0] - 1 if in_gap else None

    def gap_line(windows: list[tuple[str, int, int, int, int]], clocks: list[int | None]) -> str:
        if not in_gap or before is None:
            return "no replay step fell wholly inside the gap (use a --tick of 180 s or less)"
        n = sum(1 for w in windows if w[4] in in_gap)
        return (
            f"{_hms(clocks[before])} -> {_hms(clocks[in_gap[-1]])} between arrival "
            f"{_hms(arrival[before])} and {_hms(arrival[in_gap[-1]])}, {n} windows emitted"
        )

    still_open = b["missing"]
    lines = [
        "",
        "== what came in ==",
        f"readings replayed            {counts['rows_in']:>9,}   ({data.config.partitions} "
        f"partitions, {len(data.ticks)} steps of {data.config.tick_s} s arrival time)",
        "",
        "== rows left out, and whether you can tell ==",
        f"(a) rowtime, discarded by order=adjust  {len(discards):>6,}   kept in the quarantine "
        f"(brute force from the data: {predicted:,})",
        *(f"      {reason:<28} {n:>6,}" for reason, n in sorted(reasons.items())),
        "      read them: spark.read.format('rowtime').option('output', 'discarded').load(path)",
        f"(b) plain Spark, numRowsDroppedByWatermark {trace.b_dropped_metric:>6,}   no trace of "
        "which rows (and Spark counts partial aggregates, not readings)",
        f"      readings lost from every window (computed here from the data)  {lost_all:>8,}",
        f"      readings lost from at least one window                         {lost_some:>8,}",
        "",
        f"== windows: max lane flow per freeway, {INTERVAL_S} s every {PERIOD_S} s ==",
        f"brute-force answer                  {len(truth):>5} windows",
        f"(a) rowtime: emitted {a['distinct']:>5}, right {a['right']:>5}, "
        f"wrong {a['wrong']:>4}, "
        f"missing {a['missing']:>4}; median emission {latency(trace.a_windows)} after window end",
        f"(b) plain Spark: emitted {b['distinct']:>5}, right {b['right']:>5}, "
        f"wrong {b['wrong']:>4}, "
        f"missing {b['missing']:>4}; median emission {latency(trace.b_windows)} after window end",
        f"    ((a) waits for the slowest district, {int(data.lags_s.max())} s behind; (b) follows "
        f"the fastest one, {SPARK_DELAY_S} s delay, and drops what the others send as late;",
        f"     {still_open} windows of (b) never closed: its watermark needs newer data)",
        "",
        f"== the quiet gap: no reading arrives {_hms(g0)}-{_hms(g1)} (arrival time) ==",
        "(a) stream clock, moved by the adapters' bounds: "
        + gap_line(trace.a_windows, trace.stream_clock),
        "(b) plain Spark watermark, moved by data only:   "
        + gap_line(trace.b_windows, trace.b_watermark),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())

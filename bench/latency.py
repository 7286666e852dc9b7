"""Benchmark (issue 16, item 4): the latency of time, from a bound written to the sink's clock.

A writer process appends rows and bounds to a rowtime stream (``--partitions``, default 2) at a
steady pace: every ``--tick`` seconds (default 0.1) it writes ``--rows-per-tick`` rows to each
partition with rowtimes up to the wall clock, then a bound at the wall clock, and flushes; it
notes when the bound was durable in every partition. Meanwhile one query reads the stream with
``format("rowtime")``, applies ``with_watermark`` (delay 1 ms), counts rows per
``--window`` (default 1 second) in append mode and writes the counts (``window.end`` as
``rowtime``) into the rowtime sink's Parquet target, with a 200 ms processing-time trigger.

For every bound ``B`` written after the first ``--warmup`` seconds:

* the batch that reads it, ``r``: the first micro-batch whose end offset's stream clock
  (what the reader planned) is at or above ``B``;
* the batch whose commit covers it, ``s``: the first micro-batch after which the sink's clock
  (its manifest entry for that batch) is at or above ``B - 1 ms``: the windowed sink's clock is
  Spark's watermark, which ``with_watermark`` keeps 1 ms below the bound;
* ``s - r`` micro-batches, and the milliseconds from the bound being durable in the log to the
  sink's manifest entry of ``s`` being written (file times, same machine clock), and to the end
  of batch ``r``.

Target: ``s - r <= 2`` (within 2 micro-batches of the batch that reads the bound). Spark
applies a watermark one batch after it learns it (sink/clock.py), so 1 is expected. The query's
progress events (a StreamingQueryListener) give each batch's end offset, and the sink's
manifest entry of that batch its clock. The load average is printed beside the figures: on a
loaded machine a batch takes longer than the trigger interval and milliseconds grow, while
the count of batches should not.

Run: ``./dev bench latency [--seconds S] [--tick T] [--rows-per-tick N] [--out DIR]``; writes
``DIR/latency.json`` (default ``bench-results``). The writer paces itself with sleeps (a
benchmark, not a test).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa
from benchutil import spark_session, write_json

import pyspark_rowtime as pr

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
DELAY_US = 1000  # with_watermark's delay: the sink's clock stays this far below the bound
TARGET_BATCHES = 2


def write(path: str, partitions: int, seconds: float, tick: float, rows: int, log: str) -> None:
    """The writer process: rows and a bound per partition every ``tick`` seconds, paced on the
    wall clock; appends ``{"bound_us", "durable_ns"}`` per bound to ``log``. With ``seconds``
    0: one tick (the warm-up the query starts on)."""
    writers = [pr.open_writer(path, p) for p in range(partitions)]
    start = time.time()
    next_id = int(start * 1e6)  # ids of later runs follow
    last_us = 0
    with open(log, "a") as out:
        k = 0
        while time.time() - start < seconds or k == 0:
            wake = start + k * tick
            k += 1
            pause = wake - time.time()
            if pause > 0:
                time.sleep(pause)  # pacing the writer: the benchmark's steady rate
            now_us = max(time.time_ns() // 1000, last_us + 1)
            # rows spread over the last tick, in order, up to now, none below the last bound
            tick_us = int(tick * 1e6)
            t = now_us - tick_us + np.arange(1, rows + 1, dtype=np.int64) * tick_us // rows
            t = np.maximum(t, last_us)
            bound = EPOCH + dt.timedelta(microseconds=int(now_us))
            for p, w in enumerate(writers):
                ids = np.arange(next_id, next_id + rows, dtype=np.int64) * partitions + p
                table = pa.table(
                    {
                        "id": ids,
                        "v": np.ones(rows),
                        "rowtime": pa.array(t, type=pa.int64()).view(pa.timestamp("us", tz="UTC")),
                    }
                )
                w.insert_arrow(table, rowtime_column="rowtime")
                w.set_rowtime_bound(bound)
                w.flush()
            next_id += rows
            last_us = now_us
            out.write(json.dumps({"bound_us": now_us, "durable_ns": time.time_ns()}) + "\n")
            out.flush()
    for w in writers:
        w.close()


class Progress:
    """Each micro-batch's reader clock, end time and the sink's clock after it."""

    def __init__(self, target: str) -> None:
        self.manifest = os.path.join(target, "_rowtime_sink", "manifest")
        self.batches: dict[int, dict[str, Any]] = {}
        self.sink_clock: int | None = None

    def on_progress(self, progress: Any) -> None:
        batch = int(progress.batchId)
        end = progress.sources[0].endOffset if progress.sources else None
        clock = json.loads(end).get("clock") if end else None
        entry_path = os.path.join(self.manifest, f"{batch:020d}.json")
        committed_ns = None
        if os.path.exists(entry_path):
            with open(entry_path) as f:
                entry = json.load(f)
            if entry.get("clock_us") is not None:
                self.sink_clock = max(self.sink_clock or 0, int(entry["clock_us"]))
            committed_ns = os.stat(entry_path).st_mtime_ns
        self.batches[batch] = {
            "reader_clock_us": clock,
            "sink_clock_us": self.sink_clock,
            "committed_ns": committed_ns,
            "progress_ns": time.time_ns(),
            "rows": int(progress.numInputRows),
            "duration_ms": int(progress.batchDuration),
        }


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values, dtype=float), q))


def measure(bounds: list[dict[str, Any]], batches: dict[int, dict[str, Any]]) -> list[dict]:
    ids = sorted(batches)
    out = []
    for b in bounds:
        read = next((i for i in ids if (batches[i]["reader_clock_us"] or 0) >= b["bound_us"]), None)
        covered = next(
            (i for i in ids if (batches[i]["sink_clock_us"] or 0) >= b["bound_us"] - DELAY_US),
            None,
        )
        if read is None or covered is None:
            continue
        done_ns = batches[covered]["committed_ns"] or batches[covered]["progress_ns"]
        out.append(
            {
                "bound_us": b["bound_us"],
                "read_batch": read,
                "covered_batch": covered,
                "batches": covered - read,
                "ms_to_read": (batches[read]["progress_ns"] - b["durable_ns"]) / 1e6,
                "ms_to_sink": (done_ns - b["durable_ns"]) / 1e6,
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0, help="how long the writer writes")
    ap.add_argument("--warmup", type=float, default=1.0, help="bounds of the first S s skipped")
    ap.add_argument("--tick", type=float, default=0.1, help="seconds between bounds")
    ap.add_argument("--rows-per-tick", type=int, default=1000, help="rows per partition a tick")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--window", default="1 second")
    ap.add_argument("--trigger", default="200 milliseconds")
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--writer", nargs=2, metavar=("PATH", "LOG"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.writer:
        path, log = args.writer
        write(path, args.partitions, args.seconds, args.tick, args.rows_per_tick, log)
        return

    from pyspark.sql import functions as F
    from pyspark.sql.streaming import StreamingQueryListener

    base = tempfile.mkdtemp(prefix="bench-latency-")
    stream = os.path.join(base, "stream")
    target = os.path.join(base, "target")
    log = os.path.join(base, "bounds.jsonl")
    pr.create_stream(stream, "id BIGINT, v DOUBLE", partitions=args.partitions)
    spark = spark_session("bench-latency")
    progress = Progress(target)

    class Listener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            progress.on_progress(event.progress)

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    listener = Listener()
    spark.streams.addListener(listener)
    writer = None
    load = [os.getloadavg()[0]]
    try:
        df = pr.with_watermark(spark.readStream.format("rowtime").load(stream))
        counts = df.groupBy(F.window("rowtime", args.window)).count()
        counts = counts.select(F.col("window.end").alias("rowtime"), "count")
        q = (
            counts.writeStream.format("rowtime")
            .option("target", "parquet")
            .option("checkpointLocation", os.path.join(base, "checkpoint"))
            .outputMode("append")
            .trigger(processingTime=args.trigger)
            .start(target)
        )
        # Warm up: one tick written and covered by the sink's clock before the writer starts,
        # so the first, slow micro-batches (JIT, Python workers, state store) are not measured.
        write(stream, args.partitions, 0, args.tick, args.rows_per_tick, log + ".warmup")
        deadline = time.time() + 300
        while progress.sink_clock is None and time.time() < deadline:
            if q.exception() is not None:
                raise RuntimeError(f"the query failed: {q.exception()}")
            time.sleep(0.2)  # waiting for the warm-up batches
        print(f"warm after {len(progress.batches)} micro-batches", flush=True)
        writer = subprocess.Popen(
            [
                sys.executable,
                os.path.abspath(__file__),
                *("--writer", stream, log),
                *(f"--seconds={args.seconds}", f"--tick={args.tick}"),
                *(f"--rows-per-tick={args.rows_per_tick}", f"--partitions={args.partitions}"),
            ]
        )
        while writer.poll() is None:
            time.sleep(1)  # the writer runs on its own; note the load meanwhile
            load.append(os.getloadavg()[0])
            if q.exception() is not None:
                raise RuntimeError(f"the query failed: {q.exception()}")
        if writer.returncode:
            raise RuntimeError(f"the writer process failed ({writer.returncode})")
        with open(log) as f:
            bounds = [json.loads(line) for line in f if line.strip()]
        last = bounds[-1]["bound_us"] - DELAY_US
        deadline = time.time() + 60
        while (progress.sink_clock or 0) < last and time.time() < deadline and q.isActive:
            time.sleep(0.2)  # the query is still catching up with the last bounds
        q.stop()
    finally:
        if writer is not None and writer.poll() is None:
            writer.kill()
        spark.streams.removeListener(listener)
        spark.stop()
    first_ns = min(b["durable_ns"] for b in bounds)
    measured = measure(
        [b for b in bounds if b["durable_ns"] - first_ns >= args.warmup * 1e9], progress.batches
    )
    shutil.rmtree(base, ignore_errors=True)
    if not measured:
        raise SystemExit("no bound was covered by the sink's clock: nothing to report")
    report: dict[str, Any] = {
        "meta": {
            "seconds": args.seconds,
            "tick": args.tick,
            "rows_per_tick": args.rows_per_tick,
            "partitions": args.partitions,
            "window": args.window,
            "trigger": args.trigger,
            "bounds": len(measured),
            "batches": len(progress.batches),
            "load_min": min(load),
            "load_max": max(load),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "summary": {},
        "bounds": measured,
        "micro_batches": progress.batches,
    }
    durations = [b["duration_ms"] for b in progress.batches.values()]
    print(
        f"{len(measured)} bounds over {len(progress.batches)} micro-batches "
        f"(trigger {args.trigger}; batch duration median {statistics.median(durations):.0f} ms, "
        f"p95 {percentile(durations, 95):.0f} ms); load average {min(load):.1f}-{max(load):.1f}"
    )
    print(f"{'from a bound durable in the log':<40}{'median':>10}{'p95':>10}{'max':>10}")
    for key, label in (
        ("batches", "micro-batches, read -> sink clock"),
        ("ms_to_read", "ms to the end of the batch reading it"),
        ("ms_to_sink", "ms to the sink's clock covering it"),
    ):
        values = [m[key] for m in measured]
        stats = {
            "median": statistics.median(values),
            "p95": percentile(values, 95),
            "max": max(values),
        }
        report["summary"][key] = stats
        print(f"{label:<40}{stats['median']:>10.1f}{stats['p95']:>10.1f}{stats['max']:>10.1f}")
    ok = report["summary"]["batches"]["p95"] <= TARGET_BATCHES
    print(f"target: within {TARGET_BATCHES} micro-batches (p95): {'ok' if ok else 'MISS'}")
    print(f"wrote {write_json(args.out, 'latency.json', report)}")


if __name__ == "__main__":
    main()

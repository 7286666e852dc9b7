"""Benchmark (issue 16, item 5): how the reader scales with rows and partitions, and its memory.

**Scaling** (``--rows-list``, default 1,5,20,50 million rows in 2 partitions; then
``--partitions-list``, default 1,2,4,8 partitions of ``--rows`` rows, default 20 million):
the reader under ``order=reject`` over rows in rowtime order (``bench/reader.py``'s data),
drained with ``availableNow`` into ``noop`` in one Spark session, the smallest case once to warm
up and then ``--rounds`` interleaved rounds (median and spread). Printed: M rows/s and the cost
per row in ns; target: the cost per row from 5 to 50 million rows within 20% of each other.

**Memory** (``--memory``): ``order=adjust`` (msec) with ranges of 1 s, 10 s and 100 s over the
same ``--memory-rows`` rows (default 20 million, 1% of them up to 0.5 s out of order), each
drained by a fresh Spark (a child process, so that every peak is that case's alone) while this
process samples the resident memory of every process below it every 50 ms: the JVM (Spark's
driver, executors included in local mode), the Python process that runs the reader's driver
side (``latestOffset``/``partitions``: Spark's ``python_streaming_source_runner``), and the
Python workers that run its tasks (``pyspark.worker``; the largest one). The rows held by
``adjust`` follow the range (10,000 rows per second of event time per partition here), so
its memory should follow the range, not the length of the stream.

The load average is printed beside every figure: compare figures of one run only.
Run: ``./dev bench scaling [--rounds R] [--rows-list ...] [--partitions-list ...] [--memory]
[--no-scaling] [--out DIR]``; writes ``DIR/scaling.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from benchutil import spark_session, write_json
from reader import drain, write_data

TARGET_FLAT = 0.20
RANGES_S = (1, 10, 100)


def scaling(args: argparse.Namespace, base: str) -> dict[str, Any]:
    cases: list[tuple[str, int, int]] = [
        (f"{r:g}M x 2", int(r * 1_000_000), 2) for r in _floats(args.rows_list)
    ]
    millions = args.rows // 1_000_000
    cases += [(f"{millions}M x {p}", args.rows, p) for p in _ints(args.partitions_list)]
    cases = list({name: (name, r, p) for name, r, p in cases}.values())  # 20M x 2 once
    streams = {}
    for name, rows, parts in cases:
        t0 = time.perf_counter()
        streams[name], _ = write_data(
            os.path.join(base, name.replace(" ", "")), rows, 0.0, False, partitions=parts
        )
        print(f"wrote {name} in {time.perf_counter() - t0:.0f} s", flush=True)
    spark = spark_session("bench-scaling")
    times: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    loads = []
    try:
        for r in range(args.rounds + 1):
            # round 0 warms up (JIT, Python workers) on the smallest case only
            for name, rows, _ in cases if r else cases[:1]:
                source = spark.readStream.format("rowtime").option("order", "reject")
                try:
                    seconds, _ = drain(spark, source.load(streams[name]), base)
                except Exception as e:  # a loaded machine: keep the whole rounds done so far
                    print(f"  round {r} {name}: the drain failed ({str(e)[:200]}); stopping")
                    break
                else:
                    load = os.getloadavg()[0]
                    loads.append(load)
                    if r:
                        times[name].append(seconds)
                    print(
                        f"  round {r}{' (warm-up)' if not r else ''} {name:<10} {seconds:7.2f} s "
                        f"{rows / seconds / 1e6:6.2f} M rows/s  load {load:.1f}",
                        flush=True,
                    )
            else:
                continue
            break  # a drain failed
    finally:
        spark.stop()
    done = min(len(ts) for ts in times.values())
    times = {name: ts[:done] for name, ts in times.items()}  # whole rounds only
    if not done:
        raise SystemExit("no round completed")
    out = {}
    print(f"\n{'case':<12}{'seconds':>22}{'M rows/s':>10}{'ns/row':>9}")
    for name, rows, parts in cases:
        ts = times[name]
        med = statistics.median(ts)
        out[name] = {
            "rows": rows,
            "partitions": parts,
            "seconds": {"median": med, "min": min(ts), "max": max(ts)},
            "mrows_per_s": rows / med / 1e6,
            "ns_per_row": med / rows * 1e9,
        }
        print(
            f"{name:<12}{f'{med:.2f} [{min(ts):.2f}-{max(ts):.2f}]':>22}"
            f"{rows / med / 1e6:10.2f}{med / rows * 1e9:9.0f}"
        )
    flat = [e["ns_per_row"] for e in out.values() if e["partitions"] == 2 and e["rows"] >= 5e6]
    if len(flat) > 1:
        spread = max(flat) / min(flat) - 1
        verdict = "ok" if spread <= TARGET_FLAT else "MISS"
        print(f"cost per row from 5M rows up: highest {spread:.0%} above lowest ({verdict})")
    print(f"load average during the rounds: {min(loads):.1f}-{max(loads):.1f}")
    return {"cases": out, "load_min": min(loads), "load_max": max(loads)}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _kind(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    if "java" in cmd.split(" ")[0]:
        return "jvm"
    if "python_streaming_source_runner" in cmd:
        return "planner"
    if "pyspark.daemon pyspark.worker" in cmd or "pyspark.worker" in cmd:
        return "worker"
    return None


def _rss_bytes(pid: int) -> tuple[int, int]:
    """(resident, resident anonymous) bytes. Resident counts the pages of the memory-mapped
    segment files a process has touched too: page cache the kernel can drop, shared with every
    other reader; anonymous memory is the process's own (arrays, Arrow buffers, the heap)."""
    rss = anon = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("RssAnon:"):
                    anon = int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, anon


def sample_peaks(proc: subprocess.Popen, every: float = 0.05) -> dict[str, int]:
    """Peak RSS per kind of process below ``proc`` until it exits (for workers: the largest
    single worker, and the largest sum of all of them at one moment); ``KIND_anon``: the peak
    of the anonymous part alone."""
    peaks = {"jvm": 0, "planner": 0, "worker": 0, "workers_sum": 0}
    peaks.update({"jvm_anon": 0, "planner_anon": 0, "worker_anon": 0})
    while proc.poll() is None:
        workers = 0
        for pid in _descendants(proc.pid):
            kind = _kind(pid)
            if kind is None:
                continue
            rss, anon = _rss_bytes(pid)
            peaks[kind] = max(peaks[kind], rss)
            peaks[f"{kind}_anon"] = max(peaks[f"{kind}_anon"], anon)
            if kind == "worker":
                workers += rss
        peaks["workers_sum"] = max(peaks["workers_sum"], workers)
        time.sleep(every)
    return peaks


def memory_case(stream: str, range_s: int, root: str) -> None:
    """The child process: one drain under adjust with that range, in a fresh Spark."""
    spark = spark_session("bench-scaling-memory")
    try:
        df = (
            spark.readStream.format("rowtime")
            .option("order", "adjust")
            .option("adjust.unit", "msec")
            .option("adjust.range", str(range_s * 1000 - 1))
            .load(stream)
        )
        for attempt in range(3):
            try:
                seconds, _ = drain(spark, df, root)
                break
            except Exception:
                # a loaded machine: the planner process did not connect back; run it again
                if attempt == 2:
                    raise
        print(json.dumps({"seconds": seconds}), flush=True)
    finally:
        spark.stop()


def memory(args: argparse.Namespace, base: str) -> dict[str, Any]:
    stream, _ = write_data(os.path.join(base, "memory"), args.memory_rows, 0.01, False)
    out: dict[str, Any] = {}
    print(
        f"\n{'adjust.range':<14}{'seconds':>9}{'JVM MiB':>9}{'planner MiB':>13}"
        f"{'worker MiB':>12}{'workers MiB':>13}  load"
    )
    for range_s in RANGES_S:
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--memory-case", stream, str(range_s)],
            stdout=subprocess.PIPE,
            text=True,
        )
        result: dict[str, Any] = {}
        reader = threading.Thread(
            target=lambda p=proc, r=result: r.update(out=p.stdout.read() if p.stdout else "")
        )
        reader.start()
        peaks = sample_peaks(proc)
        reader.join()
        if proc.returncode:
            raise RuntimeError(f"the memory case for range {range_s} s failed")
        seconds = json.loads(result["out"].strip().splitlines()[-1])["seconds"]
        load = os.getloadavg()[0]
        mib = {k: v / 2**20 for k, v in peaks.items()}
        out[f"{range_s} s"] = {"seconds": seconds, "peak_mib": mib, "load": load}
        print(
            f"{f'{range_s} s':<14}{seconds:9.2f}{mib['jvm']:9.0f}{mib['planner']:13.0f}"
            f"{mib['worker']:12.0f}{mib['workers_sum']:13.0f}{mib['planner_anon']:15.0f}"
            f"{mib['worker_anon']:8.0f}  {load:.1f}",
            flush=True,
        )
    print(
        "(peak resident memory; 'worker': the largest Python worker, 'workers': all at once; "
        "anon: without the pages of memory-mapped files)"
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rows-list", default="1,5,20,50", help="millions of rows, 2 partitions")
    ap.add_argument("--partitions-list", default="1,2,4,8")
    ap.add_argument("--rows", type=int, default=20_000_000, help="rows for the partition cases")
    ap.add_argument("--no-scaling", action="store_true")
    ap.add_argument("--memory", action="store_true", help="also the memory cases")
    ap.add_argument("--memory-rows", type=int, default=20_000_000)
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--memory-case", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_case:
        stream, range_s = args.memory_case
        root = tempfile.mkdtemp(prefix="bench-memory-")
        try:
            memory_case(stream, int(range_s), root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    base = tempfile.mkdtemp(prefix="bench-scaling-")
    report: dict[str, Any] = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        if not args.no_scaling:
            report["scaling"] = scaling(args, base)
        if args.memory:
            report["memory"] = memory(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"wrote {write_json(args.out, 'scaling.json', report)}")


if __name__ == "__main__":
    main()

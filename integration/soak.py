"""A soak test with its own time limit: ``./dev soak [seconds]`` (default 300).

Four writer processes feed four partitions of a stream (``order=adjust``, 50 ms range) with rows
at the wall clock, 1% of them up to 200 ms early (some held and reordered, some discarded),
bounds at random moments and heartbeats; every few seconds one writer is killed with SIGKILL at
a random point and started again. Meanwhile one streaming query reads the stream and writes a
rowtime stream target on its own trigger (sampled once a second: its clock and memory), and a
second query reads the same stream on its own trigger and checks each micro-batch as it comes
(``helpers.Spec7``: one aggregation per batch on the executors). When the time is up every
partition gets its end of stream and both queries drain. Then:

* counts: rows in the target + rows the policy discarded == data rows committed to the source,
  and the target holds exactly the source's rows that were not discarded, each once;
* SPEC 7, per micro-batch of the reader: at most one bound record, above the previous clock,
  and every data row between the previous clock and the batch's; the checking query saw as
  many rows as the target holds (it saw every batch);
* clocks: the target's clock, sampled every round, never went back; each target partition's
  records (rows and bounds) are in rowtime order (SPEC 7 as the target records it);
* memory: the resident memory of the driver (its JVM and Python processes) and of Spark's
  Python workers grew by less than a margin between the first quarter and the end.

Prints one JSON line of figures; exits 1 (printing why) if a check fails.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from helpers import Spec7

#: Allowed growth of resident memory from the first quarter of the run to its end.
MEMORY_MARGIN_MB = 300
PARTITIONS = 4

WRITER = textwrap.dedent(
    """
    import random, sys, time
    from pyspark_rowtime.api import open_writer
    from pyspark_rowtime.bounds.time import from_rowtime_us
    loc, p, gen, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rnd = random.Random(seed)
    with open_writer(loc, p, heartbeat="300ms", flush_records=200) as w:
        i = 0
        while True:
            now_us = time.time_ns() // 1000
            t = now_us - rnd.randint(0, 200_000) if rnd.random() < 0.01 else now_us
            w.insert({"id": f"{p}-{gen}-{i}", "v": i}, rowtime=t // 1000)
            i += 1
            if rnd.random() < 0.02:
                w.set_rowtime_bound(from_rowtime_us(max(w.clock_us, now_us - 20_000)))
            if rnd.random() < 0.05:
                w.flush()
            time.sleep(rnd.random() * 0.01)
    """
)


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            pass
    return total / 2**20


def descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.split("\n"):
        if line.strip():
            c, parent = map(int, line.split())
            children.setdefault(parent, []).append(c)
    found, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found


def spec7_failures(spec: Spec7, released: int) -> list[str]:
    """What the checking query found: the batches that broke SPEC 7 (the first 20), and a
    count that differs from the target's ``released`` rows (a batch it did not see)."""
    failures = [f"SPEC 7: {v}" for v in spec.violations[:20]]
    if spec.rows != released:
        failures.append(f"the checking query saw {spec.rows} rows, the target holds {released}")
    if not spec.batches:
        failures.append("the checking query saw no batch")
    return failures


def main(seconds: float) -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    from helpers import Spec7, spark_builder

    from pyspark_rowtime.api import create_stream, open_stream, open_writer, read_stream

    work = Path(tempfile.mkdtemp(prefix="rowtime-soak-"))
    src, out, ck = work / "src", work / "out", work / "ck"
    create_stream(
        str(src), "id STRING, v BIGINT", partitions=PARTITIONS,
        order="adjust", adjust_unit="msec", adjust_range=50,
    )  # fmt: skip
    rnd = random.Random(int(os.environ.get("ROWTIME_SOAK_SEED", "20261122")))
    generation = 0

    def start_writer(p: int) -> subprocess.Popen[bytes]:
        nonlocal generation
        generation += 1
        return subprocess.Popen(
            [
                sys.executable,
                "-c",
                WRITER,
                str(src),
                str(p),
                str(generation),
                str(rnd.randrange(2**31)),
            ]
        )

    spark = (
        spark_builder()
        .config("spark.ui.showConsoleProgress", "false")
        # On a loaded machine (writers included) a Python worker may take longer than the
        # default 15 s to start and connect back; the soak tests this project, not that.
        .config("spark.python.authenticate.socketTimeout", "180s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    query = (
        spark.readStream.format("rowtime").load(str(src))
        .writeStream.format("rowtime").option("checkpointLocation", str(ck)).start(str(out))
    )  # fmt: skip
    query.processAllAvailable()  # the reader is up before the writers take the CPU
    # Started after the first one is up: Spark 4.3 can fail two Python-source queries started
    # at the same moment.
    spec = Spec7()
    checker = (
        spark.readStream.format("rowtime").load(str(src))
        .writeStream.foreachBatch(spec.frame).option("checkpointLocation", str(work / "ck-spec"))
        .start()
    )  # fmt: skip
    checker.processAllAvailable()
    writers = {p: start_writer(p) for p in range(PARTITIONS)}
    own = {w.pid for w in writers.values()}
    started = time.monotonic()
    next_kill = started + rnd.uniform(2, 6)
    kills, rounds, clocks, samples = 0, 0, [], []
    failures: list[str] = []
    try:
        while time.monotonic() - started < seconds:
            # The query runs on its own trigger; processAllAvailable() would never return while
            # writers keep writing. This only paces the sampling (once a second).
            time.sleep(1.0)
            for q in (query, checker):
                if q.exception() is not None:
                    raise q.exception()  # type: ignore[misc]
            rounds += 1
            try:
                clocks.append(open_stream(str(out)).stream_clock_us())
            except Exception:  # the target appears with its first commit
                clocks.append(None)
            spark_pids = [
                pid for pid in descendants(os.getpid()) if pid not in own
            ]  # the JVM and Spark's Python workers
            elapsed = time.monotonic() - started
            samples.append((elapsed, rss_mb([os.getpid(), *spark_pids])))
            for p, w in writers.items():
                if w.poll() is not None:  # a writer must only ever stop by our SIGKILL
                    failures.append(f"writer of partition {p} exited by itself ({w.returncode})")
                    writers[p] = start_writer(p)
                    own.add(writers[p].pid)
            if time.monotonic() >= next_kill:
                p = rnd.randrange(PARTITIONS)
                writers[p].send_signal(signal.SIGKILL)
                writers[p].wait()
                kills += 1
                writers[p] = start_writer(p)
                own.add(writers[p].pid)
                next_kill = time.monotonic() + rnd.uniform(2, 6)
    finally:
        for w in writers.values():
            w.send_signal(signal.SIGKILL)
            w.wait()
    for p in range(PARTITIONS):
        with open_writer(str(src), p) as w:
            w.end_stream()
    query.processAllAvailable()
    query.stop()
    checker.processAllAvailable()
    checker.stop()

    source = read_stream(src)
    source_rows = source.filter(pc.invert(source.column("is_bound")))
    inserted = source_rows.column("id").to_pylist()
    target = read_stream(out)
    released = target.filter(pc.invert(target.column("is_bound"))).column("id").to_pylist()
    discarded_df = spark.read.format("rowtime").option("output", "discarded").load(str(src))
    discarded = [r.id for r in discarded_df.select("id").collect()]
    spark.stop()

    if not inserted:
        failures.append("no row was written")
    if len(released) + len(discarded) != len(inserted):
        failures.append(
            f"released {len(released)} + discarded {len(discarded)} != inserted {len(inserted)}"
        )
    if len(set(released)) != len(released):
        failures.append("a row was written to the target twice")
    if set(released) | set(discarded) != set(inserted) or set(released) & set(discarded):
        failures.append("the target and the quarantine are not a partition of the source rows")
    failures += spec7_failures(spec, len(released))
    known = [c for c in clocks if c is not None]
    if any(b < a for a, b in itertools.pairwise(known)):
        failures.append("the target's clock went back")
    times = target.column("rowtime").cast(pa.int64()).to_numpy()
    parts = target.column("partition").to_numpy()
    for p in set(parts.tolist()):
        mine = times[parts == p]
        if len(mine) > 1 and (mine[1:] < mine[:-1]).any():
            failures.append(f"target partition {p} has a record below an earlier one")
    quarter = [m for t, m in samples if t >= seconds / 4] or [m for _, m in samples]
    growth = samples[-1][1] - quarter[0] if samples else 0.0
    if growth > MEMORY_MARGIN_MB:
        failures.append(f"memory grew by {growth:.0f} MB (more than {MEMORY_MARGIN_MB} MB)")
    figures = {
        "seconds": round(time.monotonic() - started),
        "inserted": len(inserted),
        "released": len(released),
        "discarded": len(discarded),
        "writer_kills": kills,
        "reader_batches_checked": spec.batches,
        "spec7_violations": len(spec.violations),
        "rounds": rounds,
        "memory_mb_first_quarter": round(quarter[0]) if samples else None,
        "memory_mb_end": round(samples[-1][1]) if samples else None,
        "ok": not failures,
    }
    print(json.dumps(figures), flush=True)
    for f in failures:
        print(f"soak: FAILED: {f}", file=sys.stderr)
    if failures:
        print(f"soak: the streams are kept in {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1]) if len(sys.argv) > 1 else 300.0))

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
  Python workers grew by less than a margin between the first quarter and the end, counted
  over the processes running at both moments (workers come and go with tasks), each from its
  first sample SETTLE_S after it appeared (a new worker's imports are start-up, not growth).
  Sums are judged only in runs of at least SETTLED_S (two minutes: ``./dev soak``), as the
  JVM's heap and Spark's Python workers are still growing to their working size before; a
  shorter run (CI's 30 s) judges each Python process alone, with a margin that a leak shows
  through and a working set does not (MEMORY_MARGIN_MB). A failure names the processes that
  grew most.

Prints one JSON line of figures; exits 1 (printing why) if a check fails.

**A month in minutes** (``./dev soak month [SECONDS] [DAYS]``, default 1800 s for 30 days;
``integration/test_soak.py`` runs 3 days in 75 s, 4 in 120 s under ``./dev long``): ``DAYS`` of
rowtime pass in ``SECONDS`` of wall time. Three writer processes write explicit rowtimes at a
steady rate (20 rows a wall second each, a commit every 0.1 s) to a stream with ``order=drop``
and a retention of one simulated day; the writer of partition 1 is SIGKILLed at a fifth of the
run and never restarted (with ``idle.timeout`` its partition goes idle and the clock goes on
without it); the writer of partition 2 is SIGKILLed at half the run and restarted after a
simulated hour of silence (at least three idle timeouts of wall time: idleness is decided from
arrival times), and first writes the rows of its silence, below the clock that went on: late,
discarded with reason ``idle``. A query reads (``idle.timeout``, ``failOnDataLoss=false``) into
a rowtime stream target that has the same retention; every 2 s a batch read takes the quarantine
(``output=discarded``, batch reads only) and then ``rowtime trim`` runs on both streams and
``rowtime metrics`` on the source. Each round (0.25 s) reads every newly committed record of
both streams (before a trim can remove it) and samples both clocks and their disk use. At the
end the live partitions get their end of stream, the query drains, the quarantine is read a last
time, and:

* every committed row is in the target, discarded with a reason, or beyond retention (in an
  offset range a trim removed before a query had read it), and none of them twice;
* the clocks of the source and the target never went back, and the target's clock passed the
  killed partition's last row by more than a simulated day (time went on);
* disk use (both streams) after the second simulated day stays within 1.5 times the second
  day's highest: flat once the retention is reached; the live partitions of the source were
  trimmed at all;
* the restarted writer had rows discarded with reason ``idle``; ``rowtime trim`` and ``rowtime
  metrics`` always succeeded, and the metrics had ``rowtime_*`` series.

A failed month keeps its streams and, beside them, what it takes to decide again offline: every
committed row with its arrival (``source-rows.jsonl``, the whole log that retention cut) and
each quarantine read's first kept offsets, trims and discarded ids (``quarantine-reads.json``).
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
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from helpers import Spec7

#: Allowed growth of resident memory from the first quarter of the run to its end, in runs of at
#: least SETTLED_S: of all sampled processes (Spark's JVM with them), and of the Python processes
#: (this project's code: the driver's Python, the planner, Spark's Python workers) alone.
#: Shorter runs judge no sum: the JVM's heap grows to its working size in its first minutes (in
#: the 30 s run of integration/test_soak.py the JVM grew 114-148 MB from the first quarter), and
#: so do Spark's long-lived Python workers. Under load, in 30 s runs, the Python processes grew
#: 142-208 MB together (four of them 46-59 MB each, each measured from SETTLE_S after it
#: started): a sum over them that passed 200 MB once in a stranger's run of ./dev test, from
#: nothing but working sets. A short run judges each Python process alone (PROCESS_MARGIN_MB,
#: twice the most one grew there): a leak of the sink or the reader, which holds a batch per
#: micro-batch, shows in the one process that leaks.
MEMORY_MARGIN_MB = 300
PYTHON_MARGIN_MB = 200
PROCESS_MARGIN_MB = 120
#: A process is judged from its first sample this long after it appeared (rss_growth_mb).
SETTLE_S = 5.0
#: Runs at least this long judge the sums (MEMORY_MARGIN_MB, PYTHON_MARGIN_MB).
SETTLED_S = 120
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


def rss_mb(pids: list[int]) -> dict[int, float]:
    """The resident memory of each of ``pids`` that still runs, in MB."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                out[pid] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
        except (OSError, ValueError):
            pass
    return out


def rss_growth_mb(
    samples: list[tuple[float, dict[int, float]]], since: float, only: set[int] | None = None
) -> dict[int, float]:
    """Per process (of ``only``, when given) that runs at the last of ``samples`` (elapsed
    seconds, MB per pid), how much it grew from its first sample at or after ``since`` and at
    least SETTLE_S after it first appeared. Spark starts and stops Python workers as tasks
    come, and a new one imports pyarrow and this package (~100 MB) in its first seconds: that
    is start-up, and the sum over whatever runs at a moment jumps with their count; a leak is
    a process that keeps growing once started."""
    if not samples:
        return {}
    first_seen: dict[int, float] = {}
    for t, mb in samples:
        for pid in mb:
            first_seen.setdefault(pid, t)
    last = samples[-1][1]
    growth = {}
    for pid, end_mb in last.items():
        if only is not None and pid not in only:
            continue
        start = max(since, first_seen[pid] + SETTLE_S)
        base = next((mb[pid] for t, mb in samples if t >= start and pid in mb), None)
        if base is not None:
            growth[pid] = end_mb - base
    return growth


def process_name(pid: int) -> str:
    """A short name of a process for a failure line: its command line, cut."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return "?"
    return " ".join(a.decode(errors="replace") for a in args if a)[:80]


def memory_failures(python: dict[int, float], jvm_growth: float, seconds: float) -> list[str]:
    """The memory checks (MEMORY_MARGIN_MB): ``python`` is the MB each Python process grew
    from the first quarter to the end (rss_growth_mb), ``jvm_growth`` Spark's JVM's, in a run
    of ``seconds``."""
    failures = []
    grown = sum(python.values())
    if seconds >= SETTLED_S:
        if grown > PYTHON_MARGIN_MB:
            failures.append(
                f"the Python processes (driver, planner, workers) grew by {grown:.0f} MB "
                f"(more than {PYTHON_MARGIN_MB} MB)"
            )
        if grown + jvm_growth > MEMORY_MARGIN_MB:
            failures.append(
                f"memory grew by {grown + jvm_growth:.0f} MB (more than {MEMORY_MARGIN_MB} MB; "
                f"the JVM's share {jvm_growth:.0f} MB)"
            )
        return failures
    for pid, mb in sorted(python.items(), key=lambda kv: -kv[1]):
        if mb > PROCESS_MARGIN_MB:
            failures.append(
                f"Python process {pid} grew by {mb:.0f} MB (more than {PROCESS_MARGIN_MB} MB "
                f"for one process in a run shorter than {SETTLED_S} s)"
            )
    return failures


def is_jvm(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"java" in f.read().split(b"\0")[0]
    except OSError:
        return False


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
    jvms: set[int] = set()  # the JVM among the sampled processes (Spark's driver)
    names: dict[int, str] = {}
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
            for pid in samples[-1][1]:  # named now: they are gone when a failure names them
                names.setdefault(pid, process_name(pid))
            jvms.update(pid for pid in spark_pids if pid not in jvms and is_jvm(pid))
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
    grown = rss_growth_mb(samples, seconds / 4)
    growth = sum(grown.values())
    jvm_growth = sum(mb for pid, mb in grown.items() if pid in jvms)
    python = {pid: mb for pid, mb in grown.items() if pid not in jvms}
    memory = memory_failures(python, jvm_growth, seconds)
    most = sorted(grown.items(), key=lambda kv: -kv[1])[:4]
    if memory:  # name the processes that grew most
        memory.append("grew most: " + "; ".join(
            f"pid {pid} +{mb:.0f} MB ({names.get(pid, '?')})" for pid, mb in most
        ))  # fmt: skip
    failures += memory
    figures = {
        "seconds": round(time.monotonic() - started),
        "inserted": len(inserted),
        "released": len(released),
        "discarded": len(discarded),
        "writer_kills": kills,
        "reader_batches_checked": spec.batches,
        "spec7_violations": len(spec.violations),
        "rounds": rounds,
        "memory_mb_first_quarter": round(sum(quarter[0].values())) if samples else None,
        "memory_mb_end": round(sum(samples[-1][1].values())) if samples else None,
        "memory_growth_mb": round(growth),
        "memory_growth_jvm_mb": round(jvm_growth),
        "memory_growth_most_mb": [[round(mb), names.get(pid, "?")[:40]] for pid, mb in most],
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


# -- a month in minutes (./dev soak month [SECONDS] [DAYS]) ----------------------------------------

#: The month mode's stream: partition 0 writes all along, partition 1's writer is killed and never
#: restarted, partition 2's is killed and restarted after a simulated hour of silence.
MONTH_PARTITIONS = 3
STEADY, KILLED, SILENT = 0, 1, 2
#: Rows per wall second of each writer, and how often it commits (one segment each).
MONTH_RATE = 20
MONTH_FLUSH_S = 0.1
#: idle.timeout, in wall seconds: idleness is decided from arrival (commit) times (SPEC 12).
MONTH_IDLE_S = 1.0
#: How many times a quarantine read overtaken by a trim runs again before the soak gives up.
QUARANTINE_ATTEMPTS = 12
#: The reader's default idle.commitGrace: how long a step waits for commits under way to land.
COMMIT_GRACE_S = 1.0
#: The silence lasts at least this many wall seconds (three idle timeouts), so that the silent
#: partition goes idle even when a simulated hour is shorter (short runs).
MONTH_SILENCE_MIN_S = 3.0
#: Disk use after the second simulated day may exceed the second day's highest by this factor.
DISK_MARGIN = 1.5
MONTH_START_US = 1_767_225_600 * 1_000_000  # 2026-01-01T00:00:00Z
DAY_US = 86_400 * 1_000_000

MONTH_WRITER = textwrap.dedent(
    """
    import sys, time
    from pyspark_rowtime.api import open_writer
    from pyspark_rowtime.bounds.time import from_rowtime_us
    loc, p, gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sim0, wall0 = int(sys.argv[4]), float(sys.argv[5])
    speed, rate, flush_s = float(sys.argv[6]), float(sys.argv[7]), float(sys.argv[8])
    report = sys.argv[9]  # the longest commit so far (seconds), for the figures
    longest = 0.0
    step = int(speed * 1e6 / rate)  # simulated microseconds between two rows

    def sim_now():
        return sim0 + int((time.time() - wall0) * 1e6 * speed)

    with open_writer(loc, p) as w:
        # After a silence the partition's clock is where it stopped: the rows of the silence
        # come first (a backlog), below the stream clock that went on without this partition.
        t = max(w.clock_us if w.clock_us is not None else sim0, sim0)
        i = 0
        while True:
            now = sim_now()
            n = 0
            while t + step <= now and n < 5000:
                t += step
                w.insert({"id": f"{p}-{gen}-{i}", "v": t}, rowtime=from_rowtime_us(t))
                i += 1
                n += 1
            w.flush()
            # from the commit's arrival stamp to now: at least how long it took to land
            took = (time.time_ns() // 1000 - (w.last_arrival_us or 0)) / 1e6 if n else 0.0
            if took > longest:
                longest = took
                with open(report, "w") as f:
                    f.write(str(longest))
            time.sleep(flush_s)
    """
)


def disk_bytes(path: Path) -> int:
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name)).st_size
            except FileNotFoundError:  # trimmed meanwhile
                pass
    return total


class Ledger:
    """Every data row of a stream, read as it is committed (before any trim can remove it):
    ``rows[id] = (partition, offset, rowtime_us)`` and how often each id was seen."""

    def __init__(self, location: Path) -> None:
        self.location = location
        self.seen: dict[int, int] = {}
        self.rows: dict[str, tuple[int, int, int]] = {}
        self.arrivals: dict[str, int] = {}
        self.copies: Counter[str] = Counter()
        self.missed: list[str] = []
        self.lock = threading.Lock()

    def catch_up(self) -> None:
        with self.lock:
            self._catch_up()

    def _catch_up(self) -> None:
        from pyspark_rowtime.api import open_stream
        from pyspark_rowtime.streams.columns import LOG_ARRIVAL_US, LOG_IS_BOUND, LOG_ROWTIME_US

        try:
            stream = open_stream(str(self.location))
        except Exception:  # a sink target appears with its first commit
            return
        for p in range(stream.meta.partitions):
            start, end = self.seen.get(p, 0), stream.end_offset(p)
            first = first_kept(stream, p)
            if first > start:
                self.missed.append(f"{self.location.name} partition {p} [{start}, {first})")
                start = first
            if end <= start:
                continue
            t = stream.read(p, start, end)
            data = pc.invert(t.column(LOG_IS_BOUND))
            offsets = pa.array(range(start, end)).filter(data).to_pylist()
            ids = t.column("id").filter(data).to_pylist()
            times = t.column(LOG_ROWTIME_US).filter(data).to_pylist()
            arrivals = t.column(LOG_ARRIVAL_US).filter(data).to_pylist()
            for i, o, rt, a in zip(ids, offsets, times, arrivals, strict=True):
                self.rows.setdefault(i, (p, o, rt))
                self.arrivals.setdefault(i, a)
                self.copies[i] += 1
            self.seen[p] = end


class Follower(threading.Thread):
    """Catches ``ledgers`` up every ``every`` seconds beside the rounds: a round waits for
    Spark's batch reads and the CLI, seconds each on a loaded machine, while the writers'
    retention may remove a record a simulated day after its commit (30 s of wall time in
    integration/test_soak.py's run). The first error stops it and is raised by :meth:`check`."""

    def __init__(self, ledgers: dict[str, Ledger], every: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.ledgers, self.every = ledgers, every
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        while not self.done.wait(self.every):
            try:
                for ledger in self.ledgers.values():
                    ledger.catch_up()
            except BaseException as e:
                self.error = e
                return

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self.done.set()
        self.join()
        self.check()


def first_kept(stream: Any, partition: int) -> int:
    """The first offset still stored (retention moves it up; 0 without one)."""
    get = getattr(stream, "start_offset", None)
    return int(get(partition)) if get is not None else 0


def query_next(query: Any) -> dict[int, int]:
    """Per source partition, the next offset a query will read (its last progress's end offset:
    ``partitions.<p>.next`` of the reader's offset); empty before its first batch."""
    progress = query.recentProgress
    if not progress:
        return {}
    last = progress[-1]
    doc = json.loads(last.json) if hasattr(last, "json") else last
    offset = doc["sources"][0]["endOffset"]
    offset = json.loads(offset) if isinstance(offset, str) else offset
    return {int(p): int(state["next"]) for p, state in offset["partitions"].items()}


def month_failures(
    source: dict[str, tuple[int, int, int]],
    first_kept_at_end: dict[int, int],
    target: Counter[str],
    discarded: Counter[tuple[str, str]],
    clocks: dict[str, list[int]],
    disk: list[tuple[float, int]],
    restarted_late: int,
    skipped: dict[int, list[tuple[int, int]]] | None = None,
    judged_after_trim: set[str] | None = None,
) -> tuple[list[str], dict[str, int]]:
    """The month's checks, from what was recorded: ``source`` every committed data row (id ->
    partition, offset, rowtime), ``first_kept_at_end`` per source partition, ``target`` the ids
    the target received (with copies), ``discarded`` (id, reason) pairs of the quarantine reads,
    ``clocks`` sampled clocks by name, ``disk`` (simulated day, bytes), and how many of the
    restarted writer's rows were discarded with reason ``idle``; ``skipped`` the offset ranges
    per source partition that a trim removed before a query had read them; ``judged_after_trim``
    the rows discarded only by reads that started after trims, each with a rowtime below the
    highest partition clock those trims stored (docs/limits.md: such a read may discard such a
    row as idle where the streaming query kept it). Returns the failures and the accounting: every
    committed row is in the target, discarded with a reason, or beyond retention (in a range
    trimmed before a query read it), and none twice (but a row in the target that only such
    reads discarded, counted in ``in_target`` and apart in ``judged_after_trim``): the figures
    ``in_target``, ``discarded``, ``beyond_retention`` and ``lost`` add up to ``committed``."""
    failures: list[str] = []
    dropped = Counter(i for i, _ in discarded.elements())
    in_target = only_discarded = beyond = lost = after_trim = 0
    for i, (p, offset, _) in source.items():
        n, d = target.get(i, 0), dropped.get(i, 0)
        if n == 1 and d > 0 and i in (judged_after_trim or set()):
            in_target += 1  # counted once, in the target, and apart
            after_trim += 1
        elif n + d > 1:
            failures.append(f"row {i} is in the target {n} times and discarded {d} times")
        elif n == 1:
            in_target += 1
        elif d == 1:
            only_discarded += 1
        elif (
            d == 0
            and offset < first_kept_at_end.get(p, 0)
            and any(a <= offset < b for a, b in (skipped or {}).get(p, []))
        ):
            beyond += 1  # trimmed before a query read it (failOnDataLoss=false skipped it)
        elif d == 0:
            lost += 1
            if lost <= 5:
                failures.append(f"row {i} (partition {p}, offset {offset}) is nowhere")
    if lost > 5:
        failures.append(f"... {lost} rows in all are nowhere")
    strangers = [i for i in target if i not in source] + [i for i in dropped if i not in source]
    if strangers:
        failures.append(f"{len(strangers)} rows not committed to the source, e.g. {strangers[:3]}")
    for name, values in clocks.items():
        if any(b < a for a, b in itertools.pairwise(values)):
            failures.append(f"the {name} clock went back")
    day2 = [b for day, b in disk if 1 <= day < 2]
    later = [b for day, b in disk if day >= 2]
    if not day2 or not later:
        failures.append("the run was too short to see disk use after the first simulated day")
    elif max(later) > DISK_MARGIN * max(day2):
        failures.append(
            f"disk use grew after the first simulated day: {max(later)} bytes, more than "
            f"{DISK_MARGIN} x the second day's highest ({max(day2)})"
        )
    if restarted_late < 1:
        failures.append("the writer restarted after its silence had no row discarded as idle")
    figures = {
        "committed": len(source),
        "in_target": in_target,
        "discarded": only_discarded,  # rows discarded and not in the target
        "beyond_retention": beyond,
        "lost": lost,
        "judged_after_trim": after_trim,
    }
    return failures, figures


def missing_features() -> list[str]:
    """The interfaces the month mode needs that this installation lacks (SPEC 12: retention,
    ``rowtime trim``, ``idle.timeout``, ``failOnDataLoss``, ``rowtime metrics``)."""
    from pyspark_rowtime.datasource.options import READER_OPTIONS
    from pyspark_rowtime.streams.meta import KNOWN_DEFAULTS

    missing = []
    if "retention" not in KNOWN_DEFAULTS:
        missing.append("the stream default retention")
    for option in ("idle.timeout", "failOnDataLoss"):
        if option.lower() not in READER_OPTIONS:
            missing.append(f"the reader option {option}")
    for command in ("trim", "metrics"):
        done = subprocess.run(
            [sys.executable, "-m", "pyspark_rowtime.cli", command, "--help"],
            capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            missing.append(f"the command rowtime {command}")
    return missing


def month(seconds: float, days: float = 30.0) -> int:
    """``days`` of rowtime in ``seconds`` of wall time (see the module's docstring)."""
    missing = missing_features()
    if missing:
        print(f"soak month: this installation lacks {', '.join(missing)}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).parent))
    from helpers import spark_builder

    from pyspark_rowtime.api import create_stream, open_stream, open_writer

    speed = days * DAY_US / (seconds * 1e6)  # simulated seconds per wall second
    hour_wall_s = 3600 / speed
    silence_s = max(hour_wall_s, MONTH_SILENCE_MIN_S)
    work = Path(tempfile.mkdtemp(prefix="rowtime-month-"))
    src, out = work / "src", work / "out"
    schema = "id STRING, v BIGINT"
    idle = f"{MONTH_IDLE_S} seconds"
    # The stream's own idle_timeout lets retention go on past the killed writer's partition (a
    # query with the stream's defaults no longer waits for it: SPEC 12).
    create_stream(
        str(src), schema, partitions=MONTH_PARTITIONS, order="drop", retention="1 day",
        idle_timeout=idle,
    )  # fmt: skip
    create_stream(str(out), schema, partitions=MONTH_PARTITIONS, retention="1 day")
    spark = (
        spark_builder()
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.authenticate.socketTimeout", "180s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    def read(**options: str) -> Any:
        r = spark.readStream.format("rowtime")
        for k, v in {"idle.timeout": idle, "failOnDataLoss": "false", **options}.items():
            r = r.option(k, v)
        return r.load(str(src))

    query = (
        read().writeStream.format("rowtime").option("checkpointLocation", str(work / "ck"))
        .trigger(processingTime="500 milliseconds").start(str(out))
    )  # fmt: skip
    query.processAllAvailable()
    discarded: set[tuple[str, str]] = set()
    judged_whole: set[str] = set()  # discarded by a read that decides it as the whole log does
    reads: list[dict[str, Any]] = []  # each quarantine read (kept with a failed run's streams)

    def read_quarantine() -> None:
        """The quarantine as a batch read now (the stream's kept records, with the query's
        idle.timeout; ``output=discarded`` is for batch reads only): read every second, so that
        no discarded row is trimmed unseen."""
        r = spark.read.format("rowtime").option("output", "discarded").option("idle.timeout", idle)
        # A read starts at the first kept record, the next that the writers' retention (every
        # CHECK_EVERY_S per partition) removes: on a loaded machine, where a read takes
        # seconds, several in a row can be overtaken.
        for attempt in range(QUARANTINE_ATTEMPTS):
            try:
                rows = r.load(str(src)).select("id", "reason").collect()
                break
            except Exception as e:  # a writer's trim overtook the read: run it again, as asked
                if "first kept offset" not in str(e) or attempt == QUARANTINE_ATTEMPTS - 1:
                    raise
                polls["reread"] += 1
        # A read that starts after trims starts each partition from the state stored with its
        # trim, without the stream clock's history before the cuts: it may discard as idle a
        # row the streaming query kept, but only one whose rowtime is below the highest
        # partition clock its trims stored (``below``; docs/limits.md, "idle.timeout over a
        # trimmed stream", and tests/test_idle_plan.py prove the bound). A row discarded only
        # by such reads is counted apart. The trims are read after the read (they only move
        # on), so ``below`` may count a trim that came while the read ran: a second at most.
        kept_now = open_stream(str(src))
        trims = [kept_now.trim_state(p) for p in range(kept_now.meta.partitions)]
        cut_clocks = [t.clock_us for t in trims if t.start and t.clock_us is not None]
        below = max(cut_clocks, default=None)
        ledgers["source"].catch_up()
        rowtimes = ledgers["source"].rows
        for row in rows:
            discarded.add((row.id, row.reason))
            known = rowtimes.get(row.id)
            if below is None or known is None or known[2] >= below:
                judged_whole.add(row.id)
        # what each read saw, for the failure's report (which reads discarded a row, and
        # from which first kept records they started)
        reads.append({
            "at_s": round(time.time() - wall0, 3),
            "first_kept": [t.start for t in trims],
            "trim_clocks_us": [t.clock_us for t in trims],
            "below_us": below,
            "discarded": sorted(row.id for row in rows),
        })  # fmt: skip

    wall0 = time.time()
    generation = 0

    def start_writer(p: int) -> subprocess.Popen[bytes]:
        nonlocal generation
        generation += 1
        args = [src, p, generation, MONTH_START_US, wall0, speed, MONTH_RATE, MONTH_FLUSH_S,
                work / f"commit-{p}-{generation}.txt"]  # fmt: skip
        return subprocess.Popen([sys.executable, "-c", MONTH_WRITER, *map(str, args)])

    def sim_day() -> float:
        return (time.time() - wall0) * 1e6 * speed / DAY_US

    writers = {p: start_writer(p) for p in range(MONTH_PARTITIONS)}
    kill_day, silence_day = 0.2 * days, 0.5 * days
    silent_since: float | None = None
    restarted_gen: int | None = None
    ledgers = {"source": Ledger(src), "target": Ledger(out)}
    follower = Follower(ledgers)
    follower.start()
    clocks: dict[str, list[int]] = {"source": [], "target": []}
    disk: list[tuple[float, int]] = []
    polls = {"trim": 0, "metrics": 0, "reread": 0}
    series: set[str] = set()
    failures: list[str] = []
    skipped: dict[int, list[tuple[int, int]]] = {}
    next_poll = 0.0

    running: list[tuple[subprocess.Popen[str], tuple[str, ...]]] = []

    def cli(*args: str) -> None:
        """Start ``rowtime ARGS`` without waiting (collect() takes its result): on a loaded
        machine each takes seconds, and the rounds must go on meanwhile."""
        running.append((subprocess.Popen(
            [sys.executable, "-m", "pyspark_rowtime.cli", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ), args))  # fmt: skip

    def collect(wait: bool = False) -> bool:
        """Take the results of the commands started, if all have ended (or ``wait``)."""
        nonlocal series
        if not wait and any(proc.poll() is None for proc, _ in running):
            return False
        for proc, args in running:
            out, err = proc.communicate(timeout=120)
            if proc.returncode != 0:
                failures.append(f"rowtime {' '.join(args)} exited {proc.returncode}: "
                                f"{err.strip()[-300:]}")  # fmt: skip
            if args[0] == "metrics":
                series |= {line.split("{")[0].split()[0] for line in out.splitlines()
                           if line.startswith("rowtime_")}  # fmt: skip
        running.clear()
        return True

    next_quarantine = 0.0
    try:
        while time.time() - wall0 < seconds:
            time.sleep(0.25)  # paces the rounds; the queries run on their own triggers
            if query.exception() is not None:
                raise query.exception()  # type: ignore[misc]
            follower.check()  # it reads what is committed before any trim can remove it
            for name, path in (("source", src), ("target", out)):
                try:
                    clock = open_stream(str(path)).stream_clock_us()
                except Exception:
                    clock = None
                if clock is not None:
                    clocks[name].append(clock)
            disk.append((sim_day(), disk_bytes(src) + disk_bytes(out)))
            kept_now = open_stream(str(src))
            for p, nxt in query_next(query).items():
                first_now = first_kept(kept_now, p)
                if first_now > nxt:
                    skipped.setdefault(p, []).append((nxt, first_now))
            if time.time() >= next_quarantine:
                # A discarded row lives a simulated day (30 s of wall time in CI's run) before
                # retention removes it: read the quarantine at least every second.
                read_quarantine()
                next_quarantine = time.time() + 1.0
            if collect() and time.time() >= next_poll:  # rowtime trim and metrics, every 2 s
                for name, path in (("source", src), ("target", out)):
                    # read right before the trim: what was committed since the round's
                    # catch-up may already be a day old on a loaded machine
                    ledgers[name].catch_up()
                    cli("trim", str(path))
                    polls["trim"] += 1
                cli("metrics", str(src))
                polls["metrics"] += 1
                next_poll = time.time() + 2.0
            day = sim_day()
            if day >= kill_day and writers.get(KILLED) is not None:
                writers[KILLED].send_signal(signal.SIGKILL)  # never restarted
                writers[KILLED].wait()
                writers[KILLED] = None  # type: ignore[assignment]
            if day >= silence_day and silent_since is None:
                writers[SILENT].send_signal(signal.SIGKILL)
                writers[SILENT].wait()
                silent_since = time.time()
            if silent_since is not None and restarted_gen is None:
                if time.time() - silent_since >= silence_s:
                    writers[SILENT] = start_writer(SILENT)
                    restarted_gen = generation
            for p, w in writers.items():
                if (
                    w is not None
                    and w.poll() is not None
                    and not (p == SILENT and silent_since is not None and restarted_gen is None)
                ):
                    failures.append(f"writer of partition {p} exited by itself ({w.returncode})")
    finally:
        for w in writers.values():
            if w is not None and w.poll() is None:
                w.send_signal(signal.SIGKILL)
                w.wait()
    collect(wait=True)
    follower.stop()
    end_day = sim_day()
    for p in (STEADY, SILENT):  # the killed partition stays silent: it must not hold the clock
        with open_writer(str(src), p) as w:
            w.end_stream()
    ledgers["source"].catch_up()
    query.processAllAvailable()
    query.stop()
    read_quarantine()
    ledgers["target"].catch_up()
    spark.stop()

    source = ledgers["source"]
    stream = open_stream(str(src))
    first = {p: first_kept(stream, p) for p in range(MONTH_PARTITIONS)}
    mine = f"{SILENT}-{restarted_gen}-"
    restarted_late = sum(1 for i, why in discarded if why == "idle" and i.startswith(mine))
    found, accounting = month_failures(
        source.rows, first, ledgers["target"].copies, Counter(discarded), clocks, disk,
        restarted_late, skipped, {i for i, _ in discarded} - judged_whole,
    )  # fmt: skip
    failures += found
    for ledger in ledgers.values():
        failures += [f"rows trimmed before the soak read them: {m}" for m in ledger.missed]
    for p in (STEADY, SILENT):  # days old, their first rows are beyond a day's retention
        if end_day >= 2 and first[p] == 0:
            failures.append(f"retention removed nothing from source partition {p}")
    killed_rows = [rt for i, (p, _, rt) in source.rows.items() if p == KILLED]
    target_clock = clocks["target"][-1] if clocks["target"] else None
    if killed_rows and (target_clock is None or target_clock < max(killed_rows) + DAY_US):
        failures.append("time did not go on past the killed writer's partition")
    if polls["metrics"] and not series:
        failures.append("rowtime metrics printed no rowtime_* series")
    day2 = [b for d, b in disk if 1 <= d < 2]
    longest_commit = max(
        (float(f.read_text() or 0) for f in work.glob("commit-*.txt")), default=0.0
    )
    if failures and longest_commit > COMMIT_GRACE_S:
        # SPEC 12: arrival is stamped as a commit begins; idle.commitGrace (1 s) is how long
        # a step waits for commits under way to land. A longer commit can change decisions.
        failures.append(
            f"a writer's commit took {longest_commit:.1f} s from its arrival stamp, longer than "
            f"idle.commitGrace ({COMMIT_GRACE_S:.0f} s)"
        )
    figures = {
        "mode": "month",
        "seconds": round(time.time() - wall0),
        "simulated_days": round(end_day, 2),
        **accounting,
        "discarded_by_reason": dict(Counter(reason for _, reason in discarded)),
        "discarded_by_partition": dict(
            Counter(str(source.rows[i][0]) for i, _ in discarded if i in source.rows)
        ),
        "restarted_writer_late_rows": restarted_late,
        "silence_simulated_hours": round(silence_s * speed / 3600, 2),
        "idle_timeout_s": MONTH_IDLE_S,
        "trims": polls["trim"],
        "metrics_polls": polls["metrics"],
        "quarantine_rereads": polls["reread"],
        "longest_commit_s": round(longest_commit, 2),
        "metrics_series": sorted(series),
        "disk_mb_day2_max": round(max(day2) / 2**20, 2) if day2 else None,
        "disk_mb_after_max": round(max((b for d, b in disk if d >= 2), default=0) / 2**20, 2),
        "disk_mb_end": round(disk[-1][1] / 2**20, 2) if disk else None,
        "ok": not failures,
    }
    print(json.dumps(figures), flush=True)
    for f in failures:
        print(f"soak month: FAILED: {f}", file=sys.stderr)
    if failures:
        keep_month_evidence(work, source, reads, ledgers["target"].copies)
        print(f"soak month: the streams are kept in {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


def keep_month_evidence(
    work: Path, source: Ledger, reads: list[dict[str, Any]], target: Counter[str]
) -> None:
    """Beside a failed month's streams: every committed row of the source with its arrival
    (``source-rows.jsonl``: the whole log, which retention has since cut, to decide again),
    each quarantine read (``quarantine-reads.json``), and on stderr, for each row both in the
    target and discarded, the reads that discarded it."""
    with open(work / "source-rows.jsonl", "w") as f:
        for i, (p, offset, rowtime) in source.rows.items():
            row = {"id": i, "p": p, "offset": offset, "rowtime_us": rowtime}
            f.write(json.dumps({**row, "arrival_us": source.arrivals.get(i)}) + "\n")
    (work / "quarantine-reads.json").write_text(json.dumps(reads))
    for read in reads:
        both = [i for i in read["discarded"] if target.get(i)]
        for i in both[:5]:
            print(
                f"soak month: row {i} (rowtime {source.rows.get(i, (0, 0, None))[2]}, arrival "
                f"{source.arrivals.get(i)}) was discarded by the read at {read['at_s']} s "
                f"(first kept {read['first_kept']}, trims' clocks {read['trim_clocks_us']}) "
                "and is in the target",
                file=sys.stderr,
            )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "month":
        sys.exit(
            month(
                float(sys.argv[2]) if len(sys.argv) > 2 else 1800.0,
                float(sys.argv[3]) if len(sys.argv) > 3 else 30.0,
            )
        )
    sys.exit(main(float(sys.argv[1]) if len(sys.argv) > 1 else 300.0))

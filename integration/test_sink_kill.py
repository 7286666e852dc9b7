"""Exactly once through driver crashes: SIGKILL the whole Spark driver, many times, mid-run.

A child process runs two streaming queries, one after the other (a pass-through filter into a
rowtime stream and into a Parquet target) over a prepared source, ``availableNow``, restarting
from their checkpoints each time it is started. The test kills the child's whole process group
(Python driver, JVM, and with them the commits in flight) with SIGKILL at moments drawn from a
fixed seed: a fraction of a second after a write task starts staging, or after one to three
committed batches. It samples both targets' clocks while the child runs and between restarts,
and finally lets a run finish. The targets must then hold exactly
the expected rows, each once, and their clocks must never have gone back. The stream target
is a folder, a stream on Redis or one on S3 (``stream_at``); with S3, the Parquet target is on
S3 too. (A killed driver's lease on an object store partition, or on a Parquet target's commit,
ends after ROWTIME_LEASE_S, 5 s here: the restarted driver's commit waits for it.)

How many kills: in ``./dev test`` (and CI) two on every backend, the first aimed between
commits and the second at a write task's staging (the fixed seed's first two draws; where it
lands depends on timing, and the test prints what each kill interrupted), about 5 minutes for
the three backends; ``./dev long`` (``ROWTIME_LONG=1``) runs six kills for a folder and four for
the others, about 7.5 minutes.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
from sink_helpers import published_parquet

from pyspark_rowtime.api import create_stream, open_writer, read_stream
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.sink.layout import SINK_DIR, open_sink_state
from pyspark_rowtime.sink.parquet_target import (
    CLOCK_NAME,
    COMPLETE_MARKER,
    parquet_clock_us,
    target_files_at,
)
from pyspark_rowtime.streams.storage import LocationKind, open_storage, what_is_at

ROWS = 2400
BOUND_EVERY = 100  # rows between the writer's bounds
ROWS_PER_BATCH = 150  # the reader's maxRowsPerBatch: records per micro-batch
T0_US = 1_700_000_000_000_000
#: ``./dev long`` (ROWTIME_LONG=1): the long form of this test.
LONG = os.environ.get("ROWTIME_LONG") == "1"
KILLS = 6 if LONG else 2
#: Over Redis and S3, fewer: the sink's protocol is the same, the backend's steps are covered by
#: tests/test_sink_protocol.py's crashes at every step, and each S3 kill waits out a lease.
KILLS_REMOTE = 4 if LONG else 2
#: A kill waits for 1 to this many commits after it is armed (or for staged files after one).
MAX_WAIT_COMMITS = 3
#: The random choices (which phase each kill aims at, how long it waits) are the same on every
#: run; ROWTIME_KILL_SEED explores others.
SEED = 20_240_611
#: Micro-batches the two queries run in all: data rows, bounds and the end of stream, cut into
#: batches of ROWS_PER_BATCH records, once per target.
BATCHES = 2 * -(-(ROWS + ROWS // BOUND_EVERY + 1) // ROWS_PER_BATCH)
# Each kill uses at most MAX_WAIT_COMMITS commits and the one in flight: leave batches for all.
assert KILLS * (MAX_WAIT_COMMITS + 1) < BATCHES, "too few micro-batches for every kill"

CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {integration!r})
    from helpers import spark_builder
    spark = spark_builder().getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    work = {work!r}
    df = (spark.readStream.format("rowtime").option("maxRowsPerBatch", {rows_per_batch})
          .load(work + "/src").where("is_bound OR id % 3 != 0"))
    to_stream = df.writeStream.format("rowtime").option("checkpointLocation", work + "/ck-stream")
    to_parquet = (df.writeStream.format("rowtime").option("target", "parquet")
                  .option("granularity", "minute")
                  .option("checkpointLocation", work + "/ck-parquet"))
    runs = [(to_stream, {out!r}), (to_parquet, {pq!r})]
    # One query after the other (the parent alternates which goes first, so kills hit both):
    # Spark 4.3 can fail a micro-batch with "Task not serializable: Illegal size N of
    # collection" when two queries over Python data sources serialize their jobs at the same
    # moment (a race inside the JVM, not in this sink).
    for writer, path in (runs if sys.argv[1] == "stream-first" else runs[::-1]):
        writer.trigger(availableNow=True).start(path).awaitTermination()
    print("done", flush=True)
    """
)


def commits(checkpoint: Path) -> list[int]:
    """Batches Spark has logged as committed (its checkpoint's commits/ folder)."""
    try:
        return sorted(int(n) for n in os.listdir(checkpoint / "commits") if n.isdigit())
    except FileNotFoundError:
        return []


def staging(out: str, pq: str) -> bool:
    """Whether a write task has staged runs for a batch not yet committed."""
    return bool(open_sink_state(out).staged() or open_sink_state(pq).staged())


class Clocks:
    """Samples of both targets' clocks; asserts they never go back."""

    def __init__(self, out: str, pq: str) -> None:
        self.out = out
        self.pq = pq
        self.samples: list[tuple[int | None, int | None]] = []

    def sample(self) -> None:
        out = self.out
        exists = what_is_at(out).kind is LocationKind.STREAM
        stream = open_storage(out).stream_clock_us() if exists else None
        pq = parquet_clock_us(self.pq)
        if self.samples:
            last_stream, last_pq = self.samples[-1]
            assert last_stream is None or (stream is not None and stream >= last_stream)
            assert last_pq is None or (pq is not None and pq >= last_pq)
        self.samples.append((stream, pq))


def where_it_died(work: Path, location: str, pq_at: str) -> str:
    """What a kill interrupted, judged from the targets' state (for the test's report)."""
    notes = []
    out = open_sink_state(location)
    latest = out.latest()
    if latest is not None and what_is_at(location).kind is LocationKind.STREAM:
        stream = open_storage(location)
        for part in latest["parts"]:
            records = part["rows"] + (part["bound_us"] is not None)
            if stream.end_offset(part["partition"]) < part["start"] + records:
                notes.append(f"stream: intent of batch {latest['batch']} not yet appended")
                break
    pq = open_sink_state(pq_at)
    latest = pq.latest()
    applied = target_files_at(pq_at).read_json(CLOCK_NAME) or {}
    if latest is not None and applied.get("batch", -1) < latest["batch"]:
        notes.append(f"parquet: batch {latest['batch']} committed, not yet applied")
    for state, checkpoint in ((out, "ck-stream"), (pq, "ck-parquet")):
        name = Path(state.target).name
        if state.staged():
            notes.append(f"{name}: runs staged")
        ids = state.batches()
        logged = commits(work / checkpoint)
        if ids and (not logged or ids[-1] > logged[-1]):
            notes.append(f"{name}: batch {ids[-1]} committed by the sink, not yet by Spark")
    return "; ".join(notes) or "between the sink's commits"


def test_sigkill_the_driver_many_times_and_the_targets_hold_each_row_once(workdir: Path, stream_at):
    seed = int(os.environ.get("ROWTIME_KILL_SEED", SEED))
    print(f"ROWTIME_KILL_SEED={seed}")
    rng = random.Random(seed)
    src = workdir / "src"
    create_stream(src, "id BIGINT, name STRING")
    expected = []
    with open_writer(src) as w:
        for i in range(ROWS):
            t = T0_US + i * 2_500_000  # 2400 rows over 100 minutes
            w.insert({"id": i, "name": f"n{i}"}, rowtime=t // 1000)
            if i % 3 != 0:
                expected.append((t, i, f"n{i}"))
            if i % BOUND_EVERY == BOUND_EVERY - 1:
                w.set_rowtime_bound(t // 1000)
        w.end_stream()

    out = stream_at("out")
    # The Parquet target goes where the stream target goes when that is object storage.
    pq_at = stream_at("pq") if "://" in out and not out.startswith("redis") else str(workdir / "pq")
    code = CHILD.format(
        integration=str(Path(__file__).parent),
        work=str(workdir),
        out=out,
        pq=pq_at,
        rows_per_batch=ROWS_PER_BATCH,
    )
    clocks = Clocks(out, pq_at)
    kills = KILLS if "://" not in out else KILLS_REMOTE
    landed = 0
    runs = 0
    while True:
        runs += 1
        # every run but the last is killed: more runs means a run neither finished nor died
        assert runs <= kills + 1, f"run {runs}: the queries neither finished nor were killed"
        log = open(workdir / f"run-{runs}.log", "w+")  # a pipe could fill up and stall it
        child = subprocess.Popen(
            [sys.executable, "-P", "-c", code, "stream-first" if runs % 2 else "parquet-first"],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: the driver, its JVM, ...
            env={**os.environ, "PYSPARK_PYTHON": sys.executable, "ROWTIME_LEASE_S": "5"},
        )
        kill = landed < kills
        # Half the kills come a random moment after a write task starts staging (inside the
        # sink's two phases), the others a random moment after some batches commit.
        on_staging = rng.random() < 0.5
        before = len(commits(workdir / "ck-stream")) + len(commits(workdir / "ck-parquet"))
        wait_commits = rng.randint(1, MAX_WAIT_COMMITS)
        extra_s = rng.uniform(0.0, 0.3 if on_staging else 0.6)
        killed_at = None
        while child.poll() is None:
            clocks.sample()
            if kill and killed_at is None:
                now = len(commits(workdir / "ck-stream")) + len(commits(workdir / "ck-parquet"))
                if (
                    (staging(out, pq_at) and now > before)
                    if on_staging
                    else now - before >= wait_commits
                ):
                    killed_at = time.monotonic() + extra_s
            if killed_at is not None and time.monotonic() >= killed_at:
                os.killpg(child.pid, signal.SIGKILL)
                break
            time.sleep(0.01)  # polling the checkpoint for a kill point, not waiting on Spark
        child.wait(timeout=120)
        log.seek(0)
        output = log.read()
        log.close()
        clocks.sample()
        if child.returncode == -signal.SIGKILL:
            landed += 1
            print(f"kill {landed}: {where_it_died(workdir, out, pq_at)}")
            continue
        assert child.returncode == 0, f"run {runs} failed:\n{output[-6000:]}"
        assert "done" in output
        assert landed == kills, (
            f"the queries finished after {landed} of {kills} kills: they ran out of "
            f"micro-batches to kill in (seed {seed}, {BATCHES} batches); give the source more "
            "rows or lower ROWS_PER_BATCH"
        )
        break

    # the stream: every expected row once, in rowtime order, then the end of stream
    t = read_stream(out)
    rows = t.filter(pa.compute.invert(t.column("is_bound")))
    got = list(
        zip(
            rows.column("rowtime").cast(pa.int64()).to_pylist(),
            rows.column("id").to_pylist(),
            rows.column("name").to_pylist(),
            strict=True,
        )
    )
    assert got == expected
    assert open_storage(out).stream_clock_us() == END_OF_STREAM_US

    # Parquet: the same rows, once; every minute complete
    table = published_parquet(pq_at)
    assert table is not None
    got_pq = sorted(
        zip(
            table.column("rowtime").cast(pa.int64()).to_pylist(),
            table.column("id").to_pylist(),
            table.column("name").to_pylist(),
            strict=True,
        )
    )
    assert got_pq == expected
    names = target_files_at(pq_at).list("")
    minutes = {n.split("/")[0] for n in names if n.startswith("rowtime_minute=")}
    assert len(minutes) == len({t // 60_000_000 for t, _, _ in expected})
    assert all(f"{m}/{COMPLETE_MARKER}" in names for m in minutes)
    assert not any(n.startswith(f"{SINK_DIR}/staging/") for n in names)
    assert parquet_clock_us(pq_at) == END_OF_STREAM_US
    assert len(clocks.samples) > kills

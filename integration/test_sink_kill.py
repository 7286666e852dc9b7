"""Exactly once through driver crashes: SIGKILL the whole Spark driver, many times, mid-run.

A child process runs four streaming queries, one after the other (a pass-through filter into a
rowtime stream, a Parquet target, a Delta table and an Iceberg table) over a prepared source,
``availableNow``, restarting from their checkpoints each time it is started. The test kills the
child's whole process group (Python driver, JVM, and with them the commits in flight) with
SIGKILL at moments drawn from a fixed seed: a fraction of a second after a write task starts
staging (for a table: after Spark logged the batch's offsets and before it logged its commit),
or after one to three committed batches. Each kill aims at one target, in turn: that target's
query runs first in the killed run. It samples every target's clock while the child runs and
between restarts, and finally lets a run finish. The targets must then hold exactly the
expected rows, each once, and their clocks must never have gone back. The stream target is a
folder, a stream on Redis or one on S3 (``stream_at``); with S3, the Parquet target, the Delta
table and the Iceberg warehouse are on S3 too, and with Redis they are on Azure Blob
(Azurite), so that each of them meets kills in a folder, on S3 and on Azure Blob. (A killed
driver's lease on an object store
partition, or on a Parquet target's commit, ends after ROWTIME_LEASE_S, 5 s here: the restarted
driver's commit waits for it.)

The tables have another writer: before the first run, and after every kill, another
application appends rows of its own to both tables (delta-rs ``write_deltalake(mode="append")``,
pyiceberg ``add_files``; it created both tables, and the sink takes them over) and compacts them
(delta-rs ``optimize.compact()`` and a log checkpoint; pyiceberg 0.12 has no file compaction, so
``expire_snapshots`` drops the history instead). The tables must hold the sink's rows and the
other writer's, each once, read with delta-rs and pyiceberg.

How many kills: in ``./dev test`` (and CI) two for a folder, the first aimed between commits
and the second at a write task's staging (the fixed seed's first two draws; where it lands
depends on timing, and the test prints what each kill interrupted). ``./dev long``
(``ROWTIME_LONG=1``) adds Redis and S3, each killed at a write task's staging (inside the
sink's two phases, where a remote store's half-done writes are), the targets killed rotating
with the backend (a folder: Delta, stream; Redis: Iceberg; S3: Parquet), and runs six kills for
a folder and four for the others: every target on every backend, in both phases. On every
stop, the sink's protocol is crashed at each of its steps on Redis and S3 without Spark
(``tests/test_sink_protocol.py``).
"""

from __future__ import annotations

import os
import random
import signal
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest
from helpers import kill_child_spark, start_child_spark
from sink_helpers import published_parquet
from table_helpers import (
    compact,
    iceberg_catalog_env,
    iceberg_props,
    other_rows,
    other_writer_appends,
    read_table,
    rows_of,
    table_clock,
)

from pyspark_rowtime.api import create_stream, open_writer, read_stream
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.sink.layout import SINK_DIR, open_sink_state
from pyspark_rowtime.sink.parquet_target import (
    CLOCK_NAME,
    COMPLETE_MARKER,
    parquet_clock_us,
    target_files_at,
)
from pyspark_rowtime.streams.storage import LocationKind, open_stream, what_is_at

ROWS = 2400
BOUND_EVERY = 100  # rows between the writer's bounds
T0_US = 1_700_000_000_000_000
#: ``./dev long`` (ROWTIME_LONG=1): the long form of this test.
LONG = os.environ.get("ROWTIME_LONG") == "1"
#: The reader's maxRowsPerBatch, records per micro-batch: 9 micro-batches a query in the long
#: form (6 kills), 5 in CI's (2 kills, one a target): a micro-batch costs the same whatever its
#: rows, and CI's kills need no more.
ROWS_PER_BATCH = 300 if LONG else 600
KILLS = 6 if LONG else 2
#: Over Redis and S3, fewer: the sink's protocol is the same, the backend's steps are covered by
#: tests/test_sink_protocol.py's crashes at every step, and each S3 kill waits out a lease. A
#: child run costs about 25 s (its JVM and four queries); CI's one kill a remote backend aims at
#: the staging phase.
KILLS_REMOTE = 4 if LONG else 1
#: A kill waits for 1 to this many commits after it is armed (or for staged files after one).
MAX_WAIT_COMMITS = 3
#: The random choices (which phase each kill aims at, how long it waits) are the same on every
#: run; ROWTIME_KILL_SEED explores others.
SEED = 20_240_611
#: The targets, in the order kills aim at them (each kill at the next); where a backend starts.
TARGETS = ["delta", "stream", "iceberg", "parquet"]
FIRST_AIM = {"log": 0, "redis": 2, "s3": 3}
#: Micro-batches each query runs: data rows, bounds and the end of stream, cut into batches of
#: ROWS_PER_BATCH records.
BATCHES = -(-(ROWS + ROWS // BOUND_EVERY + 1) // ROWS_PER_BATCH)
# Each kill uses at most MAX_WAIT_COMMITS commits of its target and the one in flight: leave
# batches for all the kills aimed at one target.
assert -(-KILLS // len(TARGETS)) * (MAX_WAIT_COMMITS + 1) < BATCHES, "too few micro-batches"
#: Rows the other writer appends to each table, before the first run and after each kill.
OTHER_ROWS = 5

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
    def to(target, **options):
        w = df.writeStream.format("rowtime").option("target", target)
        for k, v in options.items():
            w = w.option(k, v)
        return w.option("checkpointLocation", work + "/ck-" + target)
    runs = {{
        "stream": (to("stream"), {out!r}),
        "parquet": (to("parquet", granularity="minute"), {pq!r}),
        "delta": (to("delta", granularity="hour"), {delta!r}),
        "iceberg": (to("iceberg", granularity="hour"), {iceberg!r}),
    }}
    # One query after the other, in the order the parent gives (the target a kill aims at
    # first): Spark 4.3 can fail a micro-batch with "Task not serializable: Illegal size N of
    # collection" when two queries over Python data sources serialize their jobs at the same
    # moment (a race inside the JVM, not in this sink).
    for name in sys.argv[1].split(","):
        writer, path = runs[name]
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


def offsets(checkpoint: Path) -> list[int]:
    """Batches Spark has logged as started (its checkpoint's offsets/ folder)."""
    try:
        return sorted(int(n) for n in os.listdir(checkpoint / "offsets") if n.isdigit())
    except FileNotFoundError:
        return []


def staging(work: Path, target: str, at: dict[str, str]) -> bool:
    """Whether ``target`` is inside a batch: a write task has staged runs for a batch not yet
    committed (stream, Parquet); for a table, whose tasks write data files in place, Spark has
    logged the batch's offsets and not yet its commit."""
    if target in ("stream", "parquet"):
        return bool(open_sink_state(at[target]).staged())
    started, done = offsets(work / f"ck-{target}"), commits(work / f"ck-{target}")
    return bool(started) and (not done or started[-1] > done[-1])


class Clocks:
    """Samples of every target's clock; asserts none goes back. The tables' clocks are read
    with their own libraries (``transaction_version("rowtime.clock")``, the Iceberg property),
    at most every second while the child runs (each read loads the table: at every 0.2 s the
    test's own process took a fifth of the test's CPU, beside the Spark it waits on)."""

    def __init__(self, at: dict[str, str], props: dict[str, str]) -> None:
        self.at = at
        self.props = props
        self.samples: list[dict[str, int | None]] = []
        self.last_table_read = 0.0

    def sample(self, tables: bool = True) -> None:
        out = self.at["stream"]
        exists = what_is_at(out).kind is LocationKind.STREAM
        now: dict[str, int | None] = {
            "stream": open_stream(out).stream_clock_us() if exists else None,
            "parquet": parquet_clock_us(self.at["parquet"]),
        }
        if tables or time.monotonic() - self.last_table_read > 1.0:
            self.last_table_read = time.monotonic()
            for kind in ("delta", "iceberg"):
                now[kind] = table_clock(kind, self.at[kind], self.props)
        if self.samples:
            last = {k: v for s in self.samples for k, v in s.items() if v is not None}
            for k, v in now.items():
                assert k not in last or (v is not None and v >= last[k]), (k, last[k], v)
        self.samples.append(now)


def where_it_died(work: Path, at: dict[str, str]) -> str:
    """What a kill interrupted, judged from the targets' state (for the test's report)."""
    location, pq_at = at["stream"], at["parquet"]
    notes = []
    out = open_sink_state(location)
    latest = out.latest()
    if latest is not None and what_is_at(location).kind is LocationKind.STREAM:
        stream = open_stream(location)
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
    for kind in ("delta", "iceberg"):
        started, done = offsets(work / f"ck-{kind}"), commits(work / f"ck-{kind}")
        if started and (not done or started[-1] > done[-1]):
            notes.append(f"{kind}: batch {started[-1]} started, not committed by Spark")
    return "; ".join(notes) or "between the sink's commits"


@pytest.mark.long_cases(
    "redis",
    "s3",
    why=(
        "CI kills the driver over a folder (its four targets there); the sink's protocol "
        "is crashed at each of its steps on Redis and S3 in tests/test_sink_protocol.py"
    ),
)
def test_sigkill_the_driver_many_times_and_the_targets_hold_each_row_once(
    workdir: Path, stream_at, request: pytest.FixtureRequest
):
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
    backend = "redis" if out.startswith("redis") else "s3" if "://" in out else "log"
    # The Parquet target and the tables go where the stream target goes when that is S3, and
    # on Azurite when it is Redis (the Iceberg catalog, a SQLite file, stays local).
    place = None
    if backend == "s3":
        place = stream_at
    elif backend == "redis":
        place = request.getfixturevalue("az_server").url
    if place is None:
        (workdir / "warehouse").mkdir()
        warehouse = (workdir / "warehouse").as_uri()
    else:  # pyiceberg's Azure file IO takes abfs://CONTAINER/PATH
        warehouse = place("warehouse").replace("az://", "abfs://", 1)
    props = iceberg_props(f"sqlite:///{workdir}/catalog.db", warehouse)
    at = {
        "stream": out,
        "parquet": place("pq") if place else str(workdir / "pq"),
        "delta": place("delta") if place else str(workdir / "delta"),
        "iceberg": "iceberg://kill/crash.events",
    }
    code = CHILD.format(
        integration=str(Path(__file__).parent),
        work=str(workdir),
        out=out,
        pq=at["parquet"],
        delta=at["delta"],
        iceberg=at["iceberg"],
        rows_per_batch=ROWS_PER_BATCH,
    )
    clocks = Clocks(at, props)
    kills = KILLS if backend == "log" else KILLS_REMOTE

    # The other writer: ids from 10**6 on, rowtimes inside the stream's 100 minutes.
    others: list[tuple[int, int, str]] = []

    def other_application(when: str) -> None:
        for kind in ("delta", "iceberg"):
            first = 10**6 + len(others)
            ids = list(range(first, first + OTHER_ROWS))
            times = [T0_US + (i - 10**6) * 61_000_000 for i in ids]
            other_writer_appends(kind, at[kind], other_rows(ids, times, kind), props)
            if kind == "iceberg":
                others.extend((t, i, f"other{i}") for t, i in zip(times, ids, strict=True))
            clocks.sample()
            print(f"{when}: {kind}: {OTHER_ROWS} rows appended, {compact(kind, at[kind], props)}")
            clocks.sample()

    other_application("before the first run")
    landed = 0
    runs = 0
    while True:
        runs += 1
        # every run but the last is killed: more runs means a run neither finished nor died
        assert runs <= kills + 1, f"run {runs}: the queries neither finished nor were killed"
        aim = TARGETS[(FIRST_AIM[backend] + landed) % len(TARGETS)]
        order = TARGETS[TARGETS.index(aim) :] + TARGETS[: TARGETS.index(aim)]
        log = open(workdir / f"run-{runs}.log", "w+")  # a pipe could fill up and stall it
        child = start_child_spark(
            code,
            ",".join(order),
            env={**iceberg_catalog_env("kill", props), "ROWTIME_LEASE_S": "5"},
            log=log,
        )
        kill = landed < kills
        # Half the kills come a random moment after a write task starts staging (inside the
        # sink's two phases), the others a random moment after some batches commit.
        on_staging = rng.random() < 0.5
        if kills == 1:  # a backend's only kill goes inside the sink's two phases
            on_staging = True
        checkpoint = workdir / f"ck-{aim}"
        before = len(commits(checkpoint))
        wait_commits = rng.randint(1, MAX_WAIT_COMMITS)
        extra_s = rng.uniform(0.0, 0.3 if on_staging else 0.6)
        killed_at = None
        next_sample = 0.0
        while child.poll() is None:
            if time.monotonic() >= next_sample:  # the clocks every 0.1 s, the kill point below
                clocks.sample(tables=False)  # every 10 ms
                next_sample = time.monotonic() + 0.1
            if kill and killed_at is None:
                now = len(commits(checkpoint))
                if (
                    (staging(workdir, aim, at) and now > before)
                    if on_staging
                    else now - before >= wait_commits
                ):
                    killed_at = time.monotonic() + extra_s
            if killed_at is not None and time.monotonic() >= killed_at:
                kill_child_spark(child)
                break
            time.sleep(0.01)  # polling the checkpoint for a kill point, not waiting on Spark
        child.wait(timeout=120)
        log.seek(0)
        output = log.read()
        log.close()
        clocks.sample()
        if child.returncode == -signal.SIGKILL:
            landed += 1
            print(f"kill {landed} (aimed at {aim}): {where_it_died(workdir, at)}")
            other_application(f"after kill {landed}")
            continue
        assert child.returncode == 0, f"run {runs} failed:\n{output[-6000:]}"
        assert "done" in output
        assert landed == kills, (
            f"the queries finished after {landed} of {kills} kills: they ran out of "
            f"micro-batches to kill in (seed {seed}, {BATCHES} batches a query); give the "
            "source more rows or lower ROWS_PER_BATCH"
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
    assert open_stream(out).stream_clock_us() == END_OF_STREAM_US

    # Parquet: the same rows, once; every minute complete
    pq_at = at["parquet"]
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

    # the tables, read by delta-rs and pyiceberg: the sink's rows and the other writer's, once
    for kind in ("delta", "iceberg"):
        assert rows_of(read_table(kind, at[kind], props)) == sorted(expected + others), kind
        assert table_clock(kind, at[kind], props) == END_OF_STREAM_US, kind
    assert len(clocks.samples) > kills

"""An executor lost in the middle of a micro-batch, in ``local-cluster`` mode: its task is retried
on another executor and nothing is lost or written twice.

One child process (``local-cluster[2,1,1024]``: two executors, each its own JVM with its own
Python workers) runs seven streaming queries (four in CI: ``KILL_AT``) one after the other over
the same prepared source:
the reader into ``foreachBatch``, and the sink into a stream target in a folder, a stream target
on Redis, a stream target on S3 (moto's server, tests/objstore_servers.py), a Parquet target, a
Delta table on Azure Blob (Azurite) and an Iceberg table (a SQLite catalog, its warehouse on S3).
The tables are read back with their own libraries (delta-rs, pyiceberg) and their clocks with
them too. (The driver SIGKILL test has both tables in a folder, on S3 and on Azure Blob.)
Each query passes its rows through a step (``mapInArrow``) in the same stage as the reader's
scan and the sink's write tasks. The first task attempt that meets the case's chosen row (a
fixed partition, in the middle of a middle micro-batch) passes the rows before it on, then
SIGKILLs its own executor's JVM (the ancestor of the Python worker that runs the step) and waits
until it is gone. Which attempt kills is decided once, by a marker file created with
``O_EXCL``, not by timing. Spark then retries the task (``spark.task.maxFailures``, 4 outside
local mode) on the other executor or on the one the standalone master starts in place of the
dead one, and the query goes on.

Proof that an executor really was lost and the task retried: the marker names the killed JVM
(its command line is an executor's, ``CoarseGrainedExecutorBackend``); a later attempt of the
same partition and batch, on another JVM, went through the whole partition and left a file
saying so; Spark's status store lists one removed executor per case (for example "Command exited
with code 137") and, for the stage the kill hit, a failed task and every task completed.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from helpers import BASE_US, US, Run, check_batches, plain, reader, run_available_now, write_rows
from helpers import run_in_local_cluster as run_in_cluster
from pyspark.sql import SparkSession
from table_helpers import iceberg_catalog_env, iceberg_props, read_table, rows_of, table_clock

import pyspark_rowtime as pr
from pyspark_rowtime.api import rowtime_bound_us
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.sink.layout import FolderSinkState

PARTITIONS = 2
ROUNDS = 6
ROWS_PER_ROUND = 50  # per partition; a bound after each round, the end of stream after the last
OPTIONS = {"maxRowsPerBatch": 200}  # about 100 records a partition: 4 micro-batches
#: The case -> the row (partition, index) whose first task attempt kills its executor: each in
#: the middle of its partition's share of a middle micro-batch (the tests check that rows of
#: the task passed the step before it, and that the batch is neither the first nor the last).
KILL_AT = {
    "reader": (0, 125),
    "folder": (1, 175),
    "redis": (0, 220),
    "s3": (1, 230),
    "parquet": (1, 140),
    "delta": (0, 160),
    "iceberg": (1, 210),
}
#: CI's short form leaves out the stream targets on Redis and on S3 and the Delta table (each
#: case is a query and an executor the master starts again, 10-15 s): object storage still
#: loses an executor under the Iceberg table (its warehouse on S3), whose data files a table
#: target's tasks write as the Delta table's do (sink/table_target.py), and a killed driver over
#: S3 is integration/test_sink_kill.py's. ``./dev long`` (ROWTIME_LONG=1) runs all seven.
LONG_ONLY = ("redis", "s3", "delta")
if os.environ.get("ROWTIME_LONG") != "1":
    KILL_AT = {case: at for case, at in KILL_AT.items() if case not in LONG_ONLY}
STREAM_CASES = [case for case in ("folder", "redis", "s3") if case in KILL_AT]
#: The Iceberg table of the case ``iceberg``: its catalog ``lost`` is configured through
#: pyiceberg's environment variables, which the child (and its executors) inherit.
ICEBERG_AT = "iceberg://lost/crash.events"


def row_id(partition: int, i: int) -> int:
    return partition * 100_000 + i


def rowtime_us(partition: int, i: int) -> int:
    return BASE_US + i * US + partition * 1000


def make_source(location: Path) -> list[tuple[int, int, str]]:
    """Two partitions of ``ROUNDS * ROWS_PER_ROUND`` rows, one segment a round; the expected
    data rows as ``(rowtime_us, id, name)``, sorted."""
    pr.create_stream(str(location), "id BIGINT, name STRING", partitions=PARTITIONS)
    expected = []
    for r in range(ROUNDS):
        for p in range(PARTITIONS):
            rows = []
            for i in range(r * ROWS_PER_ROUND, (r + 1) * ROWS_PER_ROUND):
                rows.append(({"id": row_id(p, i), "name": f"n{p}-{i}"}, rowtime_us(p, i)))
                expected.append((rowtime_us(p, i), row_id(p, i), f"n{p}-{i}"))
            last = r == ROUNDS - 1
            write_rows(location, p, rows, bound_us=None if last else rows[-1][1], end=last)
    return sorted(expected)


#: The child: ``work``, ``src``, ``redis_out``, ``s3_out``, ``delta_at`` and ``kill_at`` are set
#: before it; it prints ``RESULT <json>``.
CHILD = """
import json, os, time
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener
from pyspark_rowtime.api import rowtime_bound_us
from pyspark_rowtime.bounds.errors import StreamNotFoundError


def kill_step(case, kill_id, marks):
    # Runs in a Python worker on an executor: a pass-through that, in the first task attempt
    # to meet row kill_id (and only that one: the O_EXCL marker), passes the rows before it on
    # and kills the executor's JVM. An attempt that meets the row later notes it once it has
    # passed on its whole partition.
    def executor_jvm():
        pid = os.getpid()
        while pid > 1:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            if comm == "java":
                return pid
            pid = int(stat[stat.rindex(")") + 2 :].split()[1])
        raise RuntimeError("no java process above this Python worker")

    def cmdline(pid):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\\0", b" ").decode()

    def note(name, doc):
        fd = os.open(os.path.join(marks, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
            f.flush()
            os.fsync(f.fileno())

    def step(batches):
        import signal, time
        import pyarrow.compute as pc
        from pyspark import TaskContext

        ctx = TaskContext.get()
        rows_before = 0
        retry = None
        for b in batches:
            at = pc.index(b.column("id"), kill_id).as_py() if retry is None else -1
            if at < 0:
                rows_before += b.num_rows
                yield b
                continue
            jvm = executor_jvm()
            doc = {"jvm": jvm, "cmdline": cmdline(jvm), "partition": ctx.partitionId(),
                   "attempt": ctx.attemptNumber(), "stage": ctx.stageId(),
                   "batch": ctx.getLocalProperty("streaming.sql.batchId"),
                   "rows_before": rows_before + at}
            try:
                note(f"{case}.kill", doc)
            except FileExistsError:  # a retry: pass everything on
                retry = doc
                yield b
                continue
            if at:
                yield b.slice(0, at)
            os.kill(jvm, signal.SIGKILL)
            # Wait until the JVM is gone, so the task fails by the executor's loss and not by
            # this worker's exit (polling a process's death, not waiting on Spark).
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    with open(f"/proc/{jvm}/stat") as f:
                        if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                            break
                except FileNotFoundError:
                    break
                time.sleep(0.01)
            os._exit(1)
        if retry is not None:  # this attempt went through to the end of its partition
            note(f"{case}.retry.{ctx.attemptNumber()}", retry)

    return step


def clock_of(location):
    # tables: their own libraries, one read; the others: the project's reader of clocks
    if location.startswith("iceberg://"):
        from pyiceberg.catalog import load_catalog
        catalog, _, name = location.removeprefix("iceberg://").partition("/")
        value = load_catalog(catalog).load_table(name).properties.get("rowtime.clock")
        return None if value is None else int(value)
    if location == delta_at:
        from deltalake import DeltaTable
        return DeltaTable(location).transaction_version("rowtime.clock")
    return rowtime_bound_us(location)


class Clocks(StreamingQueryListener):
    # The target's clock after each batch's progress, by query id: it must never go back.
    def __init__(self):
        self.location = None
        self.samples = {}

    def onQueryStarted(self, event):
        pass

    def onQueryProgress(self, event):
        if self.location is not None:
            try:
                clock = clock_of(self.location)
            except StreamNotFoundError:  # a stream target before its first commit
                clock = None
            p = event.progress
            self.samples.setdefault(str(p.id), []).append([p.batchId, clock])

    def onQueryIdle(self, event):
        pass

    def onQueryTerminated(self, event):
        pass


clocks = Clocks()
spark.streams.addListener(clocks)


def records(df):
    cols = [F.unix_micros(c).alias(c) if t == "timestamp" else c for c, t in df.dtypes]
    return [r.asDict() for r in df.select(*cols).collect()]


def source(case):
    df = spark.readStream.format("rowtime").option("maxRowsPerBatch", rows_per_batch).load(src)
    return df.mapInArrow(kill_step(case, kill_at[case], work + "/marks"), df.schema)


result = {"batches": [], "clocks": {}, "seconds": {}}
os.mkdir(work + "/marks")
started = time.monotonic()
q = (source("reader").writeStream
     .foreachBatch(lambda df, b: result["batches"].append([b, records(df)]))
     .option("checkpointLocation", work + "/ck-reader").trigger(availableNow=True).start())
q.awaitTermination()
result["seconds"]["reader"] = round(time.monotonic() - started, 1)

for case, out, target in [("folder", work + "/out", "stream"), ("redis", redis_out, "stream"),
                          ("s3", s3_out, "stream"), ("parquet", work + "/pq", "parquet"),
                          ("delta", delta_at, "delta"), ("iceberg", iceberg_at, "iceberg")]:
    if case not in kill_at:  # CI's short form (KILL_AT)
        continue
    clocks.location = out
    w = source(case).writeStream.format("rowtime").option("target", target)
    if target == "parquet":
        w = w.option("granularity", "minute")
    if target in ("delta", "iceberg"):
        w = w.option("granularity", "hour")
    q = (w.option("checkpointLocation", work + "/ck-" + case).trigger(availableNow=True).start(out))
    q.awaitTermination()
    # the listener bus delivers progress after the query returns: drain it before moving on
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
    result["clocks"][case] = clocks.samples.get(str(q.id), [])
    result["seconds"][case] = round(time.monotonic() - started - sum(result["seconds"].values()), 1)
    clocks.location = None

executors = spark.sparkContext._jsc.sc().statusStore().executorList(False)
result["executors"] = []
for k in range(executors.size()):
    e = executors.apply(k)
    if e.id() == "driver":
        continue
    reason = e.removeReason()
    result["executors"].append({
        "id": e.id(), "active": e.isActive(),
        "remove_reason": reason.get() if reason.isDefined() else None,
    })
# the stage each kill hit: its tasks all completed in the end, after failed attempts
result["stages"] = {}
for name in os.listdir(work + "/marks"):
    if name.endswith(".kill"):
        with open(os.path.join(work, "marks", name)) as f:
            stage = json.load(f)["stage"]
        info = spark.sparkContext.statusTracker().getStageInfo(stage)
        result["stages"][name[: -len(".kill")]] = {
            "tasks": info.numTasks, "completed": info.numCompletedTasks,
            "failed": info.numFailedTasks,
        }
print("RESULT " + json.dumps(result))
spark.stop()
"""


@pytest.fixture(scope="module")
def lost(
    tmp_path_factory: pytest.TempPathFactory, redis_for_tests: Any, s3_server: Any, az_server: Any
) -> dict[str, Any]:
    """Runs the child once for all cases (local-cluster takes 10-20 s to start)."""
    work = tmp_path_factory.mktemp("executor-lost")
    expected = make_source(work / "src")
    redis_out = redis_for_tests.url("executor-lost-out")
    s3_out = s3_server.url("executor-lost-out")  # the child inherits the variables reaching it
    kill_at = {case: row_id(*at) for case, at in KILL_AT.items()}
    delta_at = az_server.url("executor-lost-delta")
    props = iceberg_props(f"sqlite:///{work}/catalog.db", s3_server.url("executor-lost-warehouse"))
    setup = (
        f"work, src, redis_out = {str(work)!r}, {str(work / 'src')!r}, {redis_out!r}\n"
        f"s3_out, iceberg_at, delta_at = {s3_out!r}, {ICEBERG_AT!r}, {delta_at!r}\n"
        f"rows_per_batch = {OPTIONS['maxRowsPerBatch']}\nkill_at = {kill_at!r}\n"
    )
    # the child, its executors and their Python workers inherit the catalog's configuration
    with pytest.MonkeyPatch.context() as env:
        for key, value in iceberg_catalog_env("lost", props).items():
            env.setenv(key, value)
        stdout = run_in_cluster(setup + textwrap.dedent(CHILD))
    line = next(x for x in stdout.splitlines() if x.startswith("RESULT "))
    marks = {f.name: json.loads(f.read_text()) for f in (work / "marks").iterdir()}
    result = json.loads(line[len("RESULT ") :])
    # for -s and for failures: where each kill landed and how long each case took
    for name, doc in sorted(marks.items()):
        print(name, {k: v for k, v in doc.items() if k != "cmdline"})
    print("seconds per case:", result["seconds"])
    return {
        "work": work,
        "expected": expected,
        "redis_out": redis_out,
        "s3_out": s3_out,
        "delta_at": delta_at,
        "iceberg_props": props,
        "result": result,
        "marks": marks,
    }


def assert_lost_and_retried(lost: dict[str, Any], case: str) -> None:
    """The case's kill hit an executor JVM in the middle of the chosen partition, and a later
    attempt of that partition, on another JVM, finished it."""
    kill = lost["marks"][f"{case}.kill"]
    assert kill["attempt"] == 0 and kill["rows_before"] > 0, kill
    assert "CoarseGrainedExecutorBackend" in kill["cmdline"], kill["cmdline"]
    assert not Path(f"/proc/{kill['jvm']}/cmdline").exists() or (
        "CoarseGrainedExecutorBackend" not in Path(f"/proc/{kill['jvm']}/cmdline").read_text()
    ), "the killed executor is still running"
    retries = [v for k, v in lost["marks"].items() if k.startswith(f"{case}.retry.")]
    assert len(retries) == 1, retries
    (retry,) = retries
    assert retry["attempt"] >= 1 and retry["partition"] == kill["partition"], (kill, retry)
    assert retry["batch"] == kill["batch"] and retry["jvm"] != kill["jvm"], (kill, retry)
    assert "CoarseGrainedExecutorBackend" in retry["cmdline"]
    stage = lost["result"]["stages"][case]
    assert stage["failed"] >= 1 and stage["completed"] == stage["tasks"], stage


def test_spark_saw_one_executor_lost_per_case(lost: dict[str, Any]) -> None:
    executors = lost["result"]["executors"]
    removed = [e for e in executors if not e["active"]]
    # one removed executor a kill (no other reason removes one here: no dynamic allocation),
    # each with the reason Spark gave, e.g. "Command exited with code 137" (SIGKILL)
    assert len(removed) == len(KILL_AT), executors
    assert all(e["remove_reason"] for e in removed), executors
    # (the replacement of the last one may still be starting)
    assert sum(e["active"] for e in executors) >= 1, executors
    assert {name.split(".")[0] for name in lost["marks"]} == set(KILL_AT)


def test_the_reader_loses_an_executor_mid_batch_and_gives_what_local_mode_gives(
    spark: SparkSession, lost: dict[str, Any], tmp_path: Path
) -> None:
    assert_lost_and_retried(lost, "reader")
    local = run_available_now(reader(spark, lost["work"] / "src", **OPTIONS), tmp_path / "ck")
    cluster = [(b, recs) for b, recs in lost["result"]["batches"]]
    assert cluster == local.batches
    check_batches(Run(batches=cluster))
    rows = [(r["rowtime"], r["id"], r["name"]) for _, recs in cluster for r in recs]
    assert sorted(r for r in rows if r[1] is not None) == lost["expected"]
    # the kill landed in a micro-batch that is neither the first nor the last
    assert 0 < int(lost["marks"]["reader.kill"]["batch"]) < cluster[-1][0]


def clocks_never_went_back(lost: dict[str, Any], case: str) -> None:
    """The target's clock sampled after each batch's progress only grew, through the batch
    whose task was retried, up to the end of stream."""
    samples = lost["result"]["clocks"][case]
    batches = [b for b, _ in samples]
    assert min(batches) < int(lost["marks"][f"{case}.kill"]["batch"]) < max(batches), samples
    seen = [c for _, c in samples if c is not None]
    assert seen == sorted(seen), samples
    assert seen[-1] == END_OF_STREAM_US


def stream_rows(location: str) -> list[tuple[int, int, str]]:
    t = pr.read_stream(location)
    for p in set(t.column("partition").to_pylist()):
        # each partition in rowtime order, its bound records strictly increasing: no clock went
        # back inside the target either
        part = t.filter(pa.compute.equal(t.column("partition"), p))
        times = part.column("rowtime").cast(pa.int64()).to_pylist()
        assert times == sorted(times)
        bounds = part.filter(part.column("is_bound")).column("rowtime").cast(pa.int64())
        assert bounds.to_pylist() == sorted(set(bounds.to_pylist()))
    data = t.filter(pa.compute.invert(t.column("is_bound")))
    return sorted(
        zip(
            data.column("rowtime").cast(pa.int64()).to_pylist(),
            data.column("id").to_pylist(),
            data.column("name").to_pylist(),
            strict=True,
        )
    )


@pytest.mark.parametrize("case", STREAM_CASES)
def test_a_stream_target_holds_each_row_once_after_an_executor_is_lost(
    lost: dict[str, Any], case: str
) -> None:
    assert_lost_and_retried(lost, case)
    location = str(lost["work"] / "out") if case == "folder" else lost[f"{case}_out"]
    assert stream_rows(location) == lost["expected"]
    assert rowtime_bound_us(location) == END_OF_STREAM_US
    clocks_never_went_back(lost, case)
    if case == "folder":
        # The executors staged the segments, the retried task's too, and the driver's commits
        # linked them into the target: no part of any batch was copied.
        state = FolderSinkState(location)
        entries = [state.entry(batch) for batch in state.batches()]
        parts = [part for e in entries if e for part in e["parts"] if part["rows"]]
        assert len(entries) >= 4 and parts, entries
        assert all(part["mode"] == "link" for part in parts), parts


def test_a_parquet_target_holds_each_row_once_after_an_executor_is_lost(
    lost: dict[str, Any],
) -> None:
    assert_lost_and_retried(lost, "parquet")
    files = ds.dataset(lost["work"] / "pq", format="parquet", partitioning="hive").to_table()
    got = sorted(
        zip(
            files.column("rowtime").cast(pa.int64()).to_pylist(),
            files.column("id").to_pylist(),
            files.column("name").to_pylist(),
            strict=True,
        )
    )
    assert got == lost["expected"]
    assert rowtime_bound_us(str(lost["work"] / "pq")) == END_OF_STREAM_US
    clocks_never_went_back(lost, "parquet")


def test_spark_reads_the_parquet_target_with_no_rows_of_the_lost_attempt(
    spark: SparkSession, lost: dict[str, Any]
) -> None:
    """Spark's own Parquet reader sees no staged or half-written file of the killed attempt."""
    df = spark.read.parquet(str(lost["work"] / "pq"))
    assert sorted((r["id"], r["name"]) for r in plain(df)) == sorted(
        (i, n) for _, i, n in lost["expected"]
    )


@pytest.mark.long_cases(
    "delta",
    why="CI's short form loses an executor under the Iceberg table alone (LONG_ONLY)",
)
@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_table_holds_each_row_once_after_an_executor_is_lost(
    lost: dict[str, Any], kind: str
) -> None:
    """The killed attempt's data files are in the table's folder and in no commit: delta-rs and
    pyiceberg read each row once; the clock, read with them, never went back."""
    assert_lost_and_retried(lost, kind)
    at = lost["delta_at"] if kind == "delta" else ICEBERG_AT
    props = lost["iceberg_props"]
    assert rows_of(read_table(kind, at, props)) == lost["expected"]
    assert table_clock(kind, at, props) == END_OF_STREAM_US
    clocks_never_went_back(lost, kind)

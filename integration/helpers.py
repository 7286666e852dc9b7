"""What the integration tests share: a SparkSession builder, readers, a streaming-run recorder
with its SPEC 7 checks, stream writers, and a ``local-cluster`` runner.

One module, imported by the test modules and by the child processes some tests start (which put
this folder on ``sys.path``), so no test module imports another.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pickle
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import TimestampType

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.time import from_rowtime_us
from pyspark_rowtime.streams.spark_compat import SPARK_VERSION

US = 1_000_000
#: 2023-11-14T22:13:20Z, a round number of seconds.
BASE_US = 1_700_000_000 * US

#: ``./dev long`` (``ROWTIME_LONG=1``): the long forms of what CI runs short.
LONG = os.environ.get("ROWTIME_LONG") == "1"


def stop_points(restart_after: int) -> tuple[int, ...]:
    """The runs of a test "with a restart": the run stopped after round ``restart_after`` and
    started again from its checkpoint, each checked against brute force; under ``./dev long``
    also the uninterrupted run (``-1``) first, and the test asserts that both gave the same rows.
    CI runs the restarted one alone: the uninterrupted run is held to the same brute force, and
    each run is seconds of micro-batches."""
    return (-1, restart_after) if LONG else (restart_after,)


#: The JVMs of the test runs (the session's, a Connect server's, the child drivers' and the
#: local-cluster executors') compile with C1 only and collect with one thread: the tests start
#: a few dozen short-lived JVMs over tiny data, where C2's compiler threads and a parallel
#: collector cost more CPU than they save. Measured on 12 rounds of a pass-through and of a
#: windowed count (2 cores, loaded): the driver JVM's CPU time 77 s -> 44 s and 59 s -> 38 s.
#: Nothing Spark computes depends on them; users' JVMs keep their own.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def jvm_options(archive: bool = True) -> str:
    """:data:`TEST_JVM_OPTIONS`, and the run's class-data archive when there is one
    (``integration/jvm_archive.py``: it halves a Spark JVM's start)."""
    path = os.environ.get("ROWTIME_JVM_ARCHIVE", "0")
    if archive and path != "0" and os.path.isfile(path):
        return f"{TEST_JVM_OPTIONS} -XX:SharedArchiveFile={path}"
    return TEST_JVM_OPTIONS


#: Spark's checkpoints (offsets, commits, state store files) on the local disk, written through
#: Hadoop's FileSystem API over its raw local file system. Spark's default writes them through
#: Hadoop's FileContext, whose rename asks for the target's link status; without Hadoop's native
#: library (PySpark ships none) ``RawLocalFileSystem`` learns it by starting a ``readlink``
#: process, and sets each new file's permissions by starting ``chmod``. Traced on a windowed
#: count, a round of two micro-batches started about 11 such processes from the JVM (147
#: ``readlink`` and 43 ``chmod`` in 10 s), a quarter of the round's CPU time. The FileSystem
#: manager renames without ``readlink``; the raw file system writes no ``.crc`` file beside each
#: file, so fewer ``chmod`` s. test_intervals.py alone, interleaved runs: 229 and 193 CPU-s with
#: Spark's defaults, 171 and 162 with the FileSystem manager, 148 and 161 with both (the JVM
#: starting processes by vfork instead: no change). A checkpoint holds the same files either
#: way (the upgrade tests restart from 0.1.0's, written with the defaults). Users' sessions keep
#: Spark's defaults. Spark 4.1 moved the class into ``checkpointing``.
LOCAL_CHECKPOINT_CONFS = {
    "spark.sql.streaming.checkpointFileManagerClass": "org.apache.spark.sql.execution.streaming."
    + ("checkpointing." if SPARK_VERSION >= (4, 1) else "")
    + "FileSystemBasedCheckpointFileManager",
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
}


def spark_confs() -> dict[str, str]:
    """The test session's settings, the same in both modes (a Connect server gets them at
    launch)."""
    return {
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.sql.streaming.stateStore.providerClass":
            "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
        "spark.driver.memory": "2g",
        "spark.driver.extraJavaOptions": jvm_options(),
        "spark.executor.extraJavaOptions": jvm_options(),
        **LOCAL_CHECKPOINT_CONFS,
    }  # fmt: skip


def spark_builder(master: str = "local[2]"):  # type: ignore[no-untyped-def]
    builder = SparkSession.builder.master(master).appName("pyspark-rowtime-tests")
    for k, v in spark_confs().items():
        builder = builder.config(k, v)
    return builder


#: ``ROWTIME_SPARK_MODE=connect`` runs the integration tests in a Spark Connect session.
MODE = os.environ.get("ROWTIME_SPARK_MODE", "classic")
CONNECT = MODE == "connect"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def connect_server(log: Path, master: str = "local[2]") -> Iterator[str]:
    """A Spark Connect server in its own JVM (``spark-submit`` of Spark's
    ``SparkConnectServer``, as ``sbin/start-connect-server.sh --wait`` runs it), listening on a
    free port of 127.0.0.1 only; yields its ``sc://`` URL and stops it on exit.

    Why not ``remote("local[2]")``: that starts the server inside this process, whose client
    then has a JVM (and Py4J) at hand and listens on port 15002 of every interface unless
    ``SPARK_TESTING`` is set. A server of its own keeps the client JVM-free, as a user's is.
    The server's Python (data source lookup, planning, reading, UDFs) is ``PYSPARK_PYTHON``.
    """
    from pyspark.find_spark_home import _find_spark_home

    port = free_port()
    confs = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.log.level": "WARN",  # the server's INFO lines: one per RPC
        **spark_confs(),
    }
    cmd = [
        os.path.join(_find_spark_home(), "bin", "spark-submit"),
        "--master", master,
        "--name", "pyspark-rowtime-tests (Spark Connect)",
        "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
        *[a for k, v in confs.items() for a in ("--conf", f"{k}={v}")],
    ]  # fmt: skip
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    # foreachBatch functions run in the server's Python: it imports this folder's modules (the
    # helpers and the test module a function comes from) by name, as the client does.
    here = str(Path(__file__).parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    for var in ("SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE_ENABLED"):
        env.pop(var, None)
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        # The server is ready when its port accepts connections (a JVM start: 10-60 s here).
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the Spark Connect server exited ({proc.returncode}):\n"
                            f"{log.read_text()[-6000:]}")  # fmt: skip
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if time.monotonic() > deadline:
                pytest.fail(f"the Spark Connect server did not listen:\n{log.read_text()[-6000:]}")
            time.sleep(0.2)
        yield f"sc://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_in_local_cluster(code: str, timeout: int = 600) -> str:
    """Run ``code`` in a new Python process whose SparkSession is ``local-cluster[2,1,1024]``
    (two executors, each a separate JVM with its own Python workers); returns its stdout.

    The code finds a ready ``spark`` variable. Fails the test with the child's output on error.
    """
    prelude = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, %r)
        from helpers import spark_builder
        spark = spark_builder("local-cluster[2,1,1024]").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        """
    ) % str(Path(__file__).parent)
    proc = subprocess.run(
        [sys.executable, "-P", "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    if proc.returncode != 0:
        pytest.fail(f"local-cluster run failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    return proc.stdout


def start_child_spark(
    code: str, *args: str, env: dict[str, str] | None = None, log: Any = None
) -> subprocess.Popen[str]:
    """A child driver: a new Python running ``code`` (which puts this folder on ``sys.path``
    and builds its session with :func:`spark_builder`) with ``args``, its Python workers this
    interpreter, in a process group of its own, so that :func:`kill_child_spark` kills the
    driver and the JVM it started at once, as a crash of the host would. Output goes to
    ``log`` (a file: a pipe could fill up and stall the child), else to this process's."""
    return subprocess.Popen(
        [sys.executable, "-P", "-c", code, *args],
        stdout=log,
        stderr=subprocess.STDOUT if log is not None else None,
        text=True,
        start_new_session=True,
        env={**os.environ, **(env or {}), "PYSPARK_PYTHON": sys.executable},
    )


def kill_child_spark(child: subprocess.Popen[str]) -> None:
    """SIGKILL a child of :func:`start_child_spark`: its driver and its JVM, no clean-up."""
    import signal

    os.killpg(child.pid, signal.SIGKILL)
    child.wait(timeout=120)


def at(t_us: int) -> Any:
    """A rowtime for the writer: an aware datetime (an int would be read as milliseconds)."""
    return from_rowtime_us(t_us)


def reader(spark: SparkSession, location: Path | str, **options: Any):  # type: ignore[no-untyped-def]
    r = spark.readStream.format("rowtime")
    for k, v in options.items():
        r = r.option(k, v)
    return r.load(str(location))


def batch_reader(spark: SparkSession, location: Path | str, **options: Any):  # type: ignore[no-untyped-def]
    r = spark.read.format("rowtime")
    for k, v in options.items():
        r = r.option(k, v)
    return r.load(str(location))


def plain(df: DataFrame) -> list[dict[str, Any]]:
    """Collect a DataFrame, every timestamp column (``rowtime``...) as integer microseconds."""
    cols = [
        F.unix_micros(f.name).alias(f.name) if isinstance(f.dataType, TimestampType) else f.name
        for f in df.schema.fields
    ]
    return [r.asDict() for r in df.select(*cols).collect()]


def batch_recorder(
    folder: Path, convert: Callable[[Any], Any] | None = None
) -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function that keeps each micro-batch's rows (``plain``, or
    ``convert`` of each collected Row) in a file of ``folder``; :func:`recorded_batches` reads
    them. Files, not a list: under Spark Connect the function runs in the server's Python."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    def record(df: DataFrame, batch_id: int) -> None:
        rows = plain(df) if convert is None else [convert(r) for r in df.collect()]
        name = f"{time.time_ns():020d}-{batch_id}"
        (folder / f"{name}.tmp").write_bytes(pickle.dumps((batch_id, rows)))
        (folder / f"{name}.tmp").rename(folder / f"{name}.batch")

    return record


def recorded_batches(folder: Path) -> list[tuple[int, list[Any]]]:
    """What a :func:`batch_recorder` kept, in the order the batches ran."""
    return [pickle.loads(p.read_bytes()) for p in sorted(Path(folder).glob("*.batch"))]


class Run:
    """What a streaming query produced: each micro-batch's records, in batch order.

    ``sink`` is the query's ``foreachBatch`` function (a :func:`batch_recorder`, so it works in
    both modes); ``batches`` may also be given (records collected elsewhere)."""

    def __init__(self, batches: list[tuple[int, list[dict[str, Any]]]] | None = None) -> None:
        self._given = list(batches or [])
        self.folder = Path(tempfile.mkdtemp(prefix="rowtime-run-"))
        atexit.register(shutil.rmtree, self.folder, True)
        self.sink = batch_recorder(self.folder)
        self.progress: list[dict[str, Any]] = []

    @property
    def batches(self) -> list[tuple[int, list[dict[str, Any]]]]:
        return self._given + recorded_batches(self.folder)

    @property
    def records(self) -> list[dict[str, Any]]:
        return [r for _, rows in self.batches for r in rows]

    @property
    def rows(self) -> list[dict[str, Any]]:
        return [r for r in self.records if not r["is_bound"]]

    @property
    def bounds(self) -> list[int]:
        return [r["rowtime"] for r in self.records if r["is_bound"]]

    def end_offset(self, batch_id: int) -> dict[str, Any]:
        """The source's end offset of a batch, from the query's progress reports."""
        for p in self.progress:
            if p["batchId"] == batch_id and "addBatch" in p["durationMs"]:
                offset = p["sources"][0]["endOffset"]
                return json.loads(offset) if isinstance(offset, str) else offset
        raise AssertionError(f"no progress for batch {batch_id}")


def start_writer(writer: Any) -> Any:
    """``writer.start()``, again (twice at most) when a Spark Connect server's Python worker
    for ``foreachBatch`` did not connect back in time. Spark waits 10 s for it (hard-coded in
    ``PythonWorkerFactory``), and a worker importing pyspark's Connect modules takes longer on a
    busy machine; the query did not start, so nothing is lost or done twice."""
    for attempt in range(3):
        try:
            return writer.start()
        except Exception as e:
            if "Python worker failed to connect back" not in str(e) or attempt == 2:
                raise
    raise AssertionError("unreachable")


def start(df: DataFrame, checkpoint: Path, run: Run, *, available_now: bool = False):  # type: ignore[no-untyped-def]
    w = df.writeStream.foreachBatch(run.sink).option("checkpointLocation", str(checkpoint))
    if available_now:
        w = w.trigger(availableNow=True)
    return start_writer(w)


def drain(query: Any, run: Run) -> None:
    """Process everything available now and keep the query's progress reports."""
    query.processAllAvailable()
    keep = {(p["batchId"], p["timestamp"]) for p in run.progress}
    for p in query.recentProgress:
        d = json.loads(p.json)
        if (d["batchId"], d["timestamp"]) not in keep:
            run.progress.append(d)


def observed(progress: Any, name: str) -> dict[str, Any] | None:
    """The observed metric ``name`` of a progress report (a dict or a
    ``StreamingQueryProgress``) as ``{field: value}``, or None. A Spark Connect server reports
    it as ``{"values": [...], "schema": {...}}`` (a Row's JSON), classic Spark by field names."""
    d = json.loads(progress.json) if hasattr(progress, "json") else progress
    metric = d.get("observedMetrics", {}).get(name)
    if metric is None:
        return None
    if set(metric) == {"values", "schema"}:
        names = [f["name"] for f in metric["schema"]["fields"]]
        return dict(zip(names, metric["values"], strict=True))
    return dict(metric)


def input_rows(progress: Any) -> int:
    """A progress report's rows read. A Spark Connect server's report has no top-level
    ``numInputRows``; each source's count is there in both modes."""
    d = json.loads(progress.json) if hasattr(progress, "json") else progress
    return int(sum(source["numInputRows"] for source in d["sources"]))


def forget_commit(checkpoint: Path, batch_id: int) -> None:
    """Remove Spark's record that ``batch_id`` was committed, as a driver that died between
    the sink's commit and Spark's would leave the checkpoint: a restart runs the batch again
    from its logged offsets. Its Hadoop checksum file goes too where there is one (Spark's
    defaults write it; the test sessions' ``LOCAL_CHECKPOINT_CONFS`` do not)."""
    (checkpoint / "commits" / str(batch_id)).unlink()
    (checkpoint / "commits" / f".{batch_id}.crc").unlink(missing_ok=True)


def run_available_now(df: DataFrame, checkpoint: Path) -> Run:
    run = Run()
    q = start(df, checkpoint, run, available_now=True)
    q.awaitTermination()
    drain(q, run)
    return run


@dataclass
class Spec7:
    """SPEC 7 checked one micro-batch at a time, in batch order, from a summary of its records
    (so a long run need not keep them): at most one bound record, above the previous clock;
    every data row has a rowtime with ``B(b-1) <= rowtime <= B(b)``.

    ``clock`` is ``B(b)`` after the last batch seen (None before the first bound);
    ``violations`` says, per broken rule, which batch broke it and how.
    """

    clock: int | None = None
    batches: int = 0
    rows: int = 0
    violations: list[str] = field(default_factory=list)

    def batch(
        self,
        batch_id: int,
        bounds: list[int],
        rows: int,
        lowest: int | None,
        highest: int | None,
        null_rowtimes: int = 0,
    ) -> list[str]:
        """Check batch ``batch_id``: its bound records' rowtimes (microseconds), its number of
        data rows, their lowest and highest rowtime (None when it has none) and how many data
        rows had no rowtime. Returns (and keeps) what it broke."""
        bad = []
        clock = self.clock
        if len(bounds) > 1:
            bad.append(f"batch {batch_id} carries {len(bounds)} bound records {sorted(bounds)}")
        new = max(bounds) if bounds else clock
        if bounds and clock is not None and min(bounds) <= clock:
            bad.append(f"batch {batch_id}: bound {min(bounds)} <= previous clock {clock}")
        if null_rowtimes:
            bad.append(f"batch {batch_id}: {null_rowtimes} data rows without a rowtime")
        if highest is not None and (new is None or highest > new):
            bad.append(f"batch {batch_id}: a row at {highest} is above the batch's clock {new}")
        if lowest is not None and clock is not None and lowest < clock:
            bad.append(f"batch {batch_id}: a row at {lowest} is below the previous clock {clock}")
        self.clock = new
        self.batches += 1
        self.rows += rows
        self.violations += bad
        return bad

    def records(self, batch_id: int, records: list[dict[str, Any]]) -> list[str]:
        """:meth:`batch` on collected records (``plain``: rowtimes in microseconds)."""
        times = [r["rowtime"] for r in records if not r["is_bound"]]
        known = [t for t in times if t is not None]
        return self.batch(
            batch_id,
            [r["rowtime"] for r in records if r["is_bound"]],
            len(times),
            min(known, default=None),
            max(known, default=None),
            len(times) - len(known),
        )

    def frame(self, df: DataFrame, batch_id: int) -> list[str]:
        """:meth:`batch` on a micro-batch DataFrame of the reader (a ``foreachBatch`` function):
        one aggregation, so the records stay on the executors."""
        row, data = F.col("is_bound"), ~F.col("is_bound")
        t = F.unix_micros("rowtime")
        s = df.agg(
            F.collect_list(F.when(row, t)).alias("bounds"),
            F.count(F.when(data, 1)).alias("rows"),
            F.min(F.when(data, t)).alias("lowest"),
            F.max(F.when(data, t)).alias("highest"),
            F.count(F.when(data & F.col("rowtime").isNull(), 1)).alias("null_rowtimes"),
        ).first()
        assert s is not None
        return self.batch(batch_id, **s.asDict())


def check_batches(run: Run) -> None:
    """SPEC 7 on every micro-batch of ``run`` (see :class:`Spec7`)."""
    spec = Spec7()
    for batch_id, records in run.batches:
        spec.records(batch_id, records)
    assert not spec.violations, spec.violations


def write_rows(
    location: Path | str,
    partition: int,
    rows: Iterable[tuple[dict[str, Any], int]],
    *,
    bound_us: int | None = None,
    end: bool = False,
) -> None:
    """Append ``(row, rowtime_us)`` pairs to a partition, then a bound or the end of stream,
    and flush (one committed segment per call)."""
    with pr.open_writer(str(location), partition) as w:
        for row, t_us in rows:
            w.insert(row, rowtime=at(t_us))
        if bound_us is not None:
            w.set_rowtime_bound(at(bound_us))
        if end:
            w.end_stream()
        w.flush()


def jittered_rows(
    seed: int, partition: int, first: int, n: int
) -> list[tuple[dict[str, Any], int]]:
    """In rowtime order 100 ms apart, but every fifth row up to 400 ms early (inside
    adjust msec/500) and every eleventh 2 s early (discarded)."""
    rng = random.Random(seed * 100 + partition)
    out = []
    for i in range(first, first + n):
        t = BASE_US + partition * 700_000 + i * 100_000
        if i % 11 == 10:
            t -= 2 * US
        elif i % 5 == 4:
            t -= rng.randrange(1, 400) * 1000
        out.append(({"p": partition, "i": i}, t))
    return out


# -- the SDP examples (seed 000, SPEC 11) --------------------------------------------------------

#: 2009-03-01 12:15:00Z; the tuples' times are seconds after it.
T0_US = 1_235_909_700 * US
SDP_INPUT = [
    ("A", "2009/03/01 12:15:22:345678901"),
    ("B", "2009/03/01 12:15:22:123456789"),
    ("C", "2009/03/01 12:15:23:123456789"),
    ("D", "2009/03/01 12:15:22:890123456"),
    ("E", "2009/03/01 12:15:24:123456789"),
]


def s(seconds: str) -> int:
    """``"22.345"`` seconds after T0, in microseconds."""
    whole, _, frac = seconds.partition(".")
    return T0_US + int(whole) * US + int((frac + "000000")[:6])


#: SPEC section 11: (unit, range) -> rows in order with rowtimes, and the discarded rows with
#: their (truncated) rowtime and the partition clock when they arrived.
SDP_TABLE = {
    ("sec", 1): (
        [("A", s("22")), ("B", s("22")), ("D", s("22")), ("C", s("23")), ("E", s("24"))],
        [],
    ),
    ("msec", 999): (
        [
            ("B", s("22.123")),
            ("A", s("22.345")),
            ("D", s("22.890")),
            ("C", s("23.123")),
            ("E", s("24.123")),
        ],
        [],
    ),
    ("usec", 999): (
        [("A", s("22.345678")), ("C", s("23.123456")), ("E", s("24.123456"))],
        [
            ("B", 1, s("22.123456"), s("22.344679")),
            ("D", 3, s("22.890123"), s("23.122457")),
        ],
    ),
    ("sec", 0): (
        [("A", s("22")), ("B", s("22")), ("C", s("23")), ("E", s("24"))],
        [("D", 3, s("22"), s("23"))],
    ),
}


def names_and_rowtimes(records: Iterable[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(r["name"], r["rowtime"]) for r in records if not r["is_bound"]]


# -- stateful queries -----------------------------------------------------------------------------


def start_append(df: DataFrame, checkpoint: Path, run: Run):  # type: ignore[no-untyped-def]
    return start_writer(
        df.writeStream.outputMode("append")
        .foreachBatch(run.sink)
        .option("checkpointLocation", str(checkpoint))
    )


def dropped_by_watermark(run: Run) -> int:
    return sum(
        op["numRowsDroppedByWatermark"] for p in run.progress for op in p.get("stateOperators", [])
    )

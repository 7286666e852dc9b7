"""Spark through a faulty network (issue 34): the reader and the sink on Redis, every request
of the driver (the planner, the sink's commits) and of the executors (read tasks, the sink's
write tasks) through ``tests/fault_proxy.py``. The proxy resets connections before the server
sees the request, loses replies after the server applied it, cuts replies halfway and adds
latency, seeded: the seed is printed, and ``ROWTIME_FAULT_SEED`` replays it.

A query that fails on a fault is started again from its checkpoint, as an operator (or a
scheduler) would. What must hold: the target holds every row of the source once, in rowtime
order, with the end of stream (brute force over what the writer wrote); its clock, sampled
after every run past the proxy, never went back; and each restart resumed where the failed
run stopped (no micro-batch of the target is written twice: the sink's exactly-once protocol).

On Redis the query runs in the test's session: a location names its server's port, so the
proxy sits in front of it for this test alone. The object-store backends (moto's S3, Azurite)
take their endpoint from the environment a Spark process starts with: there the query runs in
a child Spark whose environment points the driver and its Python workers at the proxy, and
which waits after each failed run until the test has read the target's clock past the proxy.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import threading
from collections import deque
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from fault_proxy import FaultProxy, Faults
from fault_writes import port_of
from helpers import BASE_US, US
from objstore_servers import ObjectServer
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

import pyspark_rowtime as pr
from pyspark_rowtime.api import read_stream, rowtime_bound_us
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.bounds.errors import StreamNotFoundError

ROWS = 1200
PARTITIONS = 2
#: Records per micro-batch: about 8 micro-batches a run that is not cut short.
MAX_ROWS = 160
#: Runs the test allows before it calls the faults too many (each fault fails at most one run).
MAX_RUNS = 40


def _seed() -> int:
    seed = int(os.environ.get("ROWTIME_FAULT_SEED", random.randrange(10**6)))
    print(f"ROWTIME_FAULT_SEED={seed}")
    return seed


def _write_source(src: str) -> list[tuple[int, int]]:
    """The source stream, written past the proxy; the (rowtime, id) of its rows, sorted."""
    pr.create_stream(src, "id BIGINT, p INT", partitions=PARTITIONS)
    expected = []
    for p in range(PARTITIONS):
        with pr.open_writer(src, p) as w:
            for i in range(p, ROWS, PARTITIONS):
                t = BASE_US + i * US // 4
                w.insert({"id": i, "p": p}, rowtime=t // 1000)
                expected.append((t // 1000 * 1000, i))
                if i % 100 < PARTITIONS:
                    w.set_rowtime_bound(t // 1000)
            w.end_stream()
    return sorted(expected)


def _check_target(
    out: str, expected: list[tuple[int, int]], clocks: list[int | None], failures: list[str]
) -> None:
    """Every row once, the clock never back and at the end of stream, and runs that failed."""
    assert failures, "no run failed: the faults did not reach the queries"
    seen = [c for c in clocks if c is not None]
    assert seen == sorted(seen), clocks  # the target's clock never went back
    assert seen[-1] == END_OF_STREAM_US
    t = read_stream(out)
    rows = t.filter(pa.compute.invert(t.column("is_bound")))
    got = sorted(
        zip(
            rows.column("rowtime").cast(pa.int64()).to_pylist(),
            rows.column("id").to_pylist(),
            strict=True,
        )
    )
    assert got == expected, f"{len(got)} rows, {len(set(got))} distinct; {len(expected)} expected"


@pytest.mark.long_cases(
    why=(
        "CI runs S3 through the proxy under Spark; Redis's resets, delays and lost replies are "
        "tests/test_faults_wire.py's and tests/test_fault_proxy.py's, on every backend call"
    )
)
def test_reader_and_sink_on_redis_through_a_faulty_network(
    spark: SparkSession, redis_for_tests: Any, tmp_path: Path
) -> None:
    seed = _seed()
    name = f"faults-{seed}-{os.getpid()}"
    src, out = redis_for_tests.url(f"{name}-src"), redis_for_tests.url(f"{name}-out")
    expected = _write_source(src)

    failures: list[str] = []
    clocks: list[int | None] = []
    with FaultProxy(redis_for_tests.port, seed) as proxy:
        # One client retry: a lost reply is then sent again by redis-py itself (the backend's
        # commands must bear it), and a fault the retry does not absorb fails the run.
        def via(url: str) -> str:
            through = url.replace(f":{redis_for_tests.port}/", f":{proxy.port}/")
            return through + "?socket_timeout=2s&retries=1&backoff=20ms"

        proxy.faults = Faults.mix(0.06, latency_s=0.01)
        for run in range(1, MAX_RUNS + 1):
            try:
                # load() reads the stream's schema and start() claims the target, both through
                # the proxy: a fault there fails the run as a fault in a micro-batch does
                query = (
                    spark.readStream.format("rowtime")
                    .option("maxRowsPerBatch", MAX_ROWS)
                    .load(via(src))
                    .writeStream.format("rowtime")
                    .option("checkpointLocation", str(tmp_path / "ck"))
                    .trigger(availableNow=True)
                    .start(via(out))
                )
                query.awaitTermination()
                finished = True
            except PySparkException as e:
                # the cause as the user reads it: our error, naming the store and the step
                cause = [line for line in str(e).splitlines() if "Redis at " in line]
                failures.append(f"run {run}: {(cause or str(e).splitlines())[0].strip()[:300]}")
                finished = False
            clocks.append(_clock(out))  # read past the proxy
            if finished:
                break
        else:
            raise AssertionError(f"{MAX_RUNS} runs did not finish:\n" + "\n".join(failures))
        print(proxy.summary())
        print("\n".join(failures) or "no run failed")
        assert proxy.injected > 0, proxy.summary()
    # runs failed on faults and were restarted from the checkpoint; a failure raised by our
    # code says which store did not answer and in which step (a failed write job may reach
    # the query as Spark's own "Writing job failed", its cause in the executor's log)
    assert any("Redis at " in f and " while " in f for f in failures), failures
    _check_target(out, expected, clocks, failures)


#: The child Spark of the object-store cases: runs the query from its checkpoint until a run
#: finishes, printing each run's end on a line of its own, and after a failed run waits for a
#: line on stdin (the test has read the target's clock).
CHILD = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {integration!r})
    from helpers import spark_builder
    from pyspark.errors import PySparkException
    spark = spark_builder().getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    for run in range(1, {max_runs} + 1):
        try:
            query = (
                spark.readStream.format("rowtime").option("maxRowsPerBatch", {max_rows})
                .load({src!r})
                .writeStream.format("rowtime").option("checkpointLocation", {checkpoint!r})
                .trigger(availableNow=True).start({out!r})
            )
            query.awaitTermination()
            print("RUN " + json.dumps({{"run": run, "error": None}}), flush=True)
            break
        except PySparkException as e:
            print("RUN " + json.dumps({{"run": run, "error": str(e)}}), flush=True)
            sys.stdin.readline()
    """
)

#: Short client timeouts in the child, so that a lost reply fails its request in seconds.
CHILD_TIMEOUTS = {
    "ROWTIME_STORE_TIMEOUT_S": "2",
    "ROWTIME_STORE_CONNECT_TIMEOUT_S": "1",
    "ROWTIME_STORE_RETRIES": "1",
    "ROWTIME_STORE_RETRY_TIMEOUT_S": "4",
}


#: The fault rates of the object-store cases: a few failed runs each (a case's runs make some
#: 1,300 to 2,500 requests in all; at 4% S3 took 15 runs and 127 s, at 1.2% 6 runs and 75 s,
#: at 0.8% once 1 run: too close to none, which fails the test's "a run failed").
FAULT_RATE = {"s3": 0.015, "az": 0.02}
#: What the child may take, all its runs together, before the test kills it and fails.
CHILD_LIMIT_S = 900


@pytest.mark.long_cases(
    "az",
    why=(
        "CI runs S3 through the proxy under Spark; Azure Blob's retries are "
        "tests/test_faults_wire.py's"
    ),
)
@pytest.mark.parametrize("store", ["s3", "az"])
def test_reader_and_sink_on_object_storage_through_a_faulty_network(
    store: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    server: ObjectServer = request.getfixturevalue(f"{store}_server")
    summary, failures = spark_through_faults(server, FAULT_RATE[store], _seed(), tmp_path)
    print(summary)
    print("\n".join(failures))


def spark_through_faults(
    server: ObjectServer, rate: float, seed: int, workdir: Path
) -> tuple[str, list[str]]:
    """The object-store case: a child Spark through a proxy at ``rate``, run again from its
    checkpoint until a run finishes, then the checks (AssertionError when one fails). Returns
    the proxy's summary and the failed runs. ``integration/soak_faults.py`` runs it too."""
    store = server.scheme
    src, out = server.url("faults-src"), server.url("faults-out")
    expected = _write_source(src)  # straight to the server, as is every read of the test's
    port = port_of(server)

    failures: list[str] = []
    clocks: list[int | None] = []
    with FaultProxy(port, seed) as proxy:
        env = {
            **os.environ,
            **{k: v.replace(f":{port}", f":{proxy.port}") for k, v in server.env.items()},
            **CHILD_TIMEOUTS,
            "PYSPARK_PYTHON": sys.executable,
        }
        code = CHILD.format(
            integration=str(Path(__file__).parent),
            max_runs=MAX_RUNS,
            max_rows=MAX_ROWS,
            src=src,
            out=out,
            checkpoint=str(workdir / f"ck-{seed}"),
        )
        proxy.faults = Faults.mix(rate, latency_s=0.01)
        # and a run fails whatever the seed draws: the sink's first commit is reset as often
        # as the client may try it, so the error reaches the query (a random rate alone once
        # gave no failed run at all; the client does not retry a reset conditional PUT, so
        # with the rate at 0 the two resets fail two runs)
        tries = int(CHILD_TIMEOUTS["ROWTIME_STORE_RETRIES"]) + 1
        proxy.target("reset", b"PUT ", b"/_commits/", times=tries)
        child = subprocess.Popen(
            [sys.executable, "-P", "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        assert child.stdin is not None and child.stdout is not None
        tail: deque[str] = deque(maxlen=200)
        finished = False
        watchdog = threading.Timer(CHILD_LIMIT_S, child.kill)  # a hung child fails the test
        watchdog.start()
        for line in child.stdout:
            tail.append(line)
            if not line.startswith("RUN "):
                continue
            run = json.loads(line[4:])
            clocks.append(_clock(out))  # read straight from the server
            if run["error"] is None:
                finished = True
                break
            text = run["error"]
            cause = [x for x in text.splitlines() if "the object store did not complete" in x]
            failures.append(f"run {run['run']}: {(cause or text.splitlines())[0].strip()[:300]}")
            child.stdin.write("\n")
            child.stdin.flush()
        child.stdin.close()
        rest = child.stdout.read()
        watchdog.cancel()
        assert child.wait(timeout=120) == 0 and finished, "".join(tail)[-6000:] + rest[-2000:]
        summary = proxy.summary()
        assert proxy.injected > 0, summary
    assert any("the object store did not complete" in f and f"{store}://" in f for f in failures), (
        failures
    )
    _check_target(out, expected, clocks, failures)
    return summary, failures


def _clock(location: str) -> int | None:
    """The target's clock; None before it exists (the sink creates it when it claims it)."""
    try:
        return rowtime_bound_us(location)
    except StreamNotFoundError:
        return None

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

Redis, because a location names its server's port, so the proxy sits in front of it for this
test alone; the object-store backends take their endpoint from the environment the session's
Spark workers started with, and ``tests/test_faults_wire.py`` drives them through the proxy
without Spark.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
from fault_proxy import FaultProxy, Faults
from helpers import BASE_US, US
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


def test_reader_and_sink_on_redis_through_a_faulty_network(
    spark: SparkSession, redis_for_tests: Any, tmp_path: Path
) -> None:
    seed = _seed()
    name = f"faults-{seed}-{os.getpid()}"
    src, out = redis_for_tests.url(f"{name}-src"), redis_for_tests.url(f"{name}-out")
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
    expected.sort()

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
    assert failures, "no run failed: the faults did not reach the queries"
    assert any("Redis at " in f and " while " in f for f in failures), failures

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


def _clock(location: str) -> int | None:
    """The target's clock; None before it exists (the sink creates it when it claims it)."""
    try:
        return rowtime_bound_us(location)
    except StreamNotFoundError:
        return None

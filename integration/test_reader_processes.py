"""The reader across processes: a driver killed mid-run and restarted from its checkpoint, and
executors in separate JVMs (``local-cluster``). Each compares with an uninterrupted run on the
session's own ``local[2]`` Spark.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    Run,
    check_batches,
    jittered_rows,
    reader,
    run_available_now,
    run_in_local_cluster,
    write_rows,
)
from pyspark.sql import SparkSession

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US

OPTIONS = {"order": "adjust", "adjust.unit": "msec", "adjust.range": 500, "maxRowsPerBatch": 15}


def adjusted_stream(location: Path, rounds: int = 3) -> Path:
    """Two partitions at different speeds, out of order within the range and beyond it, a
    segment per round, then the end of stream."""
    pr.create_stream(str(location), "p INT, i INT", partitions=2)
    for r in range(rounds):
        for p in range(2):
            n = 11 if p == 0 else 6
            write_rows(location, p, jittered_rows(r, p, r * n, n), end=r == rounds - 1)
    return location


# -- 6. kill the driver --------------------------------------------------------------------------

#: The driver of a streaming query in its own process. Each micro-batch's records are written to
#: ``<out>/<batchId>.json`` (replace by name: idempotent per batch id) and, for the test, to
#: ``<out>/<batchId>.<pid>.attempt``. At batch ``kill_at`` it says so on stdout and waits, to
#: be killed with SIGKILL before Spark commits that batch.
DRIVER = """
import json, os, sys
sys.path.insert(0, {integration!r})
from helpers import plain, spark_builder

location, checkpoint, out, kill_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
options = json.loads(sys.argv[5])
spark = spark_builder().getOrCreate()
spark.sparkContext.setLogLevel("ERROR")


def sink(df, batch_id):
    records = json.dumps(plain(df))
    tmp = os.path.join(out, f".{{batch_id}}.{{os.getpid()}}.tmp")
    with open(tmp, "w") as f:
        f.write(records)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(out, f"{{batch_id}}.json"))
    with open(os.path.join(out, f"{{batch_id}}.{{os.getpid()}}.attempt"), "w") as f:
        f.write(records)
    if batch_id == kill_at:
        print(f"batch {{batch_id}} written", flush=True)
        sys.stdin.readline()  # blocks: the test kills this process here


r = spark.readStream.format("rowtime")
for k, v in options.items():
    r = r.option(k, v)
q = (
    r.load(location).writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    .trigger(availableNow=True).start()
)
q.awaitTermination()
print("done", flush=True)
"""


def driver(location: Path, checkpoint: Path, out: Path, kill_at: int) -> subprocess.Popen[str]:
    code = DRIVER.format(integration=str(Path(__file__).parent))
    args = [str(location), str(checkpoint), str(out), str(kill_at), json.dumps(OPTIONS)]
    return subprocess.Popen(
        [sys.executable, "-P", "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=out,
        start_new_session=True,  # its own process group: the driver and its JVM die together
    )


def test_a_driver_killed_mid_run_restarts_from_the_checkpoint_with_the_same_output(
    spark: SparkSession, tmp_path: Path
) -> None:
    location = adjusted_stream(tmp_path / "s")
    whole = run_available_now(reader(spark, location, **OPTIONS), tmp_path / "ck-whole")
    assert len(whole.batches) >= 4
    kill_at = 1

    out = tmp_path / "out"
    out.mkdir()
    checkpoint = tmp_path / "ck"
    first = driver(location, checkpoint, out, kill_at)
    try:
        assert first.stdout is not None
        line = first.stdout.readline()  # blocks until the driver is inside batch kill_at
        assert line.strip() == f"batch {kill_at} written", first.stderr.read()  # type: ignore[union-attr]
        os.killpg(first.pid, signal.SIGKILL)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.communicate()
    assert first.returncode == -signal.SIGKILL
    # Spark had logged the batch's offsets but not its commit.
    assert (checkpoint / "offsets" / str(kill_at)).exists()
    assert not (checkpoint / "commits" / str(kill_at)).exists()

    second = driver(location, checkpoint, out, -1)
    stdout, stderr = second.communicate(timeout=600)
    assert second.returncode == 0 and stdout.strip() == "done", stderr[-5000:]

    committed = {
        int(f.name.split(".")[0]): json.loads(f.read_text()) for f in out.glob("[0-9]*.json")
    }
    assert sorted(committed) == [b for b, _ in whole.batches]
    assert [(b, committed[b]) for b in sorted(committed)] == whole.batches
    attempts = [json.loads(f.read_text()) for f in out.glob(f"{kill_at}.*.attempt")]
    assert len(attempts) == 2 and attempts[0] == attempts[1] == committed[kill_at]
    assert whole.bounds[-1] == END_OF_STREAM_US


# -- 8. distributed: local-cluster gives what local mode gives ----------------------------------

#: Runs with a ready ``spark`` and ``location``/``workdir``; leaves a JSON-able ``result``.
SCENARIO = """
import json
from pyspark.sql import functions as F

def records(df):
    cols = [F.unix_micros(c).alias(c) if t == "timestamp" else c for c, t in df.dtypes]
    return [r.asDict() for r in df.select(*cols).collect()]

def load(reader, options):
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(location)

whole = {k: v for k, v in options.items() if k != "maxRowsPerBatch"}  # for the batch reads

batches = []
q = (
    load(spark.readStream.format("rowtime"), options).writeStream
    .foreachBatch(lambda df, b: batches.append([b, records(df)]))
    .option("checkpointLocation", workdir + "/ck-rows").trigger(availableNow=True).start()
)
q.awaitTermination()

history = records(load(spark.read.format("rowtime"), whole))
discarded = load(spark.read.format("rowtime"), {**whole, "output": "discarded"})
result = {
    "batches": batches, "history": history,
    "quarantine": records(discarded.drop("arrival")),
    "executors": spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1,
}
"""


@pytest.mark.long_cases(
    why=(
        "integration/test_executor_lost.py's reader case runs the reader in "
        "local-cluster[2,1,1024] and checks it against local mode, with an executor lost "
        "mid-batch besides"
    )
)
def test_local_cluster_gives_the_same_result_as_local_mode(
    spark: SparkSession, tmp_path: Path
) -> None:
    location = adjusted_stream(tmp_path / "s")
    setup = f"location, options = {str(location)!r}, {OPTIONS!r}\n"

    local_dir = tmp_path / "local"
    local_dir.mkdir()
    scope: dict[str, Any] = {"spark": spark}
    exec(setup + f"workdir = {str(local_dir)!r}\n" + SCENARIO, scope)
    local = json.loads(json.dumps(scope["result"]))  # tuples to lists, as from the child

    cluster_dir = tmp_path / "cluster"
    cluster_dir.mkdir()
    code = setup + f"workdir = {str(cluster_dir)!r}\n" + SCENARIO
    code += textwrap.dedent(
        """
        print("RESULT " + json.dumps(result))
        spark.stop()
        """
    )
    stdout = run_in_local_cluster(code)
    line = next(x for x in stdout.splitlines() if x.startswith("RESULT "))
    cluster = json.loads(line[len("RESULT ") :])

    assert cluster.pop("executors") == 2
    local.pop("executors")
    assert cluster == local
    assert len(local["batches"]) >= 4 and len(local["quarantine"]) >= 2
    check_batches(Run(batches=[(b, recs) for b, recs in local["batches"]]))

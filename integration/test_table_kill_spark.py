"""A driver SIGKILL during a hop of a pipeline of tables: a child driver runs a windowed query
from one Delta table (laid out as this sink writes it, a clock in every commit) into the next
(through the sink, ``clock=watermark``), one version per micro-batch; the test kills the whole
driver (its JVM too) once some micro-batches committed, starts it again from its checkpoint,
and checks the next table against brute force: every window once, with its count, and the
last windows closed by the upstream table's clock alone."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import pytest
from helpers import kill_child_spark, start_child_spark
from table_builders import delta_commit, delta_counts, make_delta_target, tumbling_counts

deltalake = pytest.importorskip("deltalake", reason="the delta extra is not installed")

pytestmark = pytest.mark.classic_only("a child driver of its own; the mode does not matter")

MINUTE_US = 60_000_000
HOUR_US = 60 * MINUTE_US
T0_US = 1_700_000_000_000_000 - 1_700_000_000_000_000 % HOUR_US
LONG = os.environ.get("ROWTIME_LONG") == "1"
#: Versions of the upstream table: one micro-batch each (maxFilesPerTrigger=1); CI's form is
#: short (two child drivers cost most of it), ./dev long's kills later into a longer history
VERSIONS = 12 if LONG else 4
#: Micro-batches the child commits before the kill
KILL_AFTER = 5 if LONG else 1
CHILD_LIMIT_S = 300

CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {integration!r})
    from helpers import spark_builder
    from pyspark.sql import functions as F
    from pyspark_rowtime.watermark import with_watermark
    spark = spark_builder().getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    raw = (spark.readStream.format("rowtime").option("table", "delta")
           .option("maxFilesPerTrigger", "1").load({src!r}))
    counts = (with_watermark(raw).groupBy(F.window("rowtime", "10 minutes"))
              .agg(F.count("*").alias("n")).select(F.col("window.end").alias("rowtime"), "n"))
    (counts.writeStream.format("rowtime").option("target", "delta")
     .option("checkpointLocation", {checkpoint!r}).trigger(availableNow=True)
     .start({out!r}).awaitTermination())
    print("done", flush=True)
    """
)


def test_a_driver_killed_during_a_table_hop_restarts_with_each_window_once(workdir: Path):
    src = make_delta_target(workdir / "raw")
    times = []
    for v in range(VERSIONS):  # 7 rows a version inside its own 10 minutes, in no order
        rows = [
            (v * 10 + i, T0_US + v * 10 * MINUTE_US + (i * 3 % 7) * MINUTE_US) for i in range(7)
        ]
        times += [t for _, t in rows]
        delta_commit(src, rows, T0_US + (v + 1) * 10 * MINUTE_US, batch=v)
    # the upstream goes quiet: a commit of its clock alone, past the last window's end
    delta_commit(src, [], T0_US + VERSIONS * 10 * MINUTE_US + MINUTE_US, batch=VERSIONS)
    out, checkpoint = str(workdir / "counts"), workdir / "ck"
    code = CHILD.format(
        integration=str(Path(__file__).parent), src=src, out=out, checkpoint=str(checkpoint)
    )
    log = open(workdir / "run-1.log", "w+")
    child = start_child_spark(code, log=log)
    deadline = time.monotonic() + CHILD_LIMIT_S
    commits = checkpoint / "commits"
    while child.poll() is None and time.monotonic() < deadline:
        if (
            commits.is_dir()
            and len([p for p in commits.iterdir() if p.name.isdigit()]) >= KILL_AFTER
        ):
            kill_child_spark(child)
            break
        time.sleep(0.01)  # polling the checkpoint for the kill point, not waiting on Spark
    log.seek(0)
    assert child.returncode == -9, f"the child was not killed mid-run:\n{log.read()[-6000:]}"
    committed = len([p for p in commits.iterdir() if p.name.isdigit()])
    assert committed < VERSIONS, "killed after the last micro-batch: nothing left to restart"

    again = open(workdir / "run-2.log", "w+")
    child = start_child_spark(code, log=again)
    assert child.wait(timeout=CHILD_LIMIT_S) == 0, again.read()[-6000:]
    again.seek(0)
    assert "done" in again.read()

    expected = tumbling_counts(times, 10 * MINUTE_US)
    assert delta_counts(out) == expected  # every window once: none lost, none twice
    # the last window closed by the upstream's last clock alone (no row after it)
    assert expected[-1][0] == T0_US + VERSIONS * 10 * MINUTE_US

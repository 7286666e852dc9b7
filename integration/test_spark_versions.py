"""``format("rowtime")`` on each Spark it supports, and refused by name where it cannot work
(issue 26). Every test here is in the ``spark_subset`` that ``./dev matrix`` runs on each older
Spark; each checks what the running Spark should do, so one file serves every version:

* 4.2 and later: a micro-batch admits at most ``maxRowsPerBatch`` (else the reader's step cap)
  new records, and ``availableNow`` reads the whole backlog in several of them;
* 4.1: Spark applies no read limit and takes the first ``latestOffset()`` as an
  ``availableNow`` query's target, so the reader plans the whole backlog in one micro-batch and
  refuses ``maxRowsPerBatch`` naming the option and both versions; no record is left unread;
* 4.0: ``format("rowtime")`` is found (the package imports) and every entry point Spark calls
  raises the error naming Spark 4.0 and 4.1, not ``DATA_SOURCE_NOT_FOUND``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from helpers import BASE_US, US, Run, reader, run_available_now, write_rows
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from pyspark_rowtime.streams.spark_compat import (
    HAS_ADMISSION_CONTROL,
    SPARK_VERSION,
    SPARK_VERSION_TEXT,
)

pytestmark = pytest.mark.spark_subset

SUPPORTED = SPARK_VERSION[:2] >= (4, 1)
needs_supported = pytest.mark.skipif(not SUPPORTED, reason=f"Spark {SPARK_VERSION_TEXT} < 4.1")

#: The step cap of the small-steps source below, and the rows written per run.
CAP = 40
ROWS_PER_PARTITION = 150


def small_steps_source(cap: int) -> Any:
    """``format("rowtime_small_steps")``: the rowtime source with a step cap of ``cap`` records
    (``RowtimeStreamReader.step_records``), so a small backlog is larger than the cap. Made at
    run time with ``__module__ = "__main__"`` so that Spark pickles it by value to its workers."""
    from pyspark_rowtime.datasource.spark import RowtimeStreamReader
    from pyspark_rowtime.source import RowtimeDataSource

    attrs = {"step_records": cap, "micro_batch_records": cap}  # micro-batches of one step
    reader_cls = type("SmallStepsReader", (RowtimeStreamReader,), attrs)
    reader_cls.__module__ = "__main__"

    def stream_reader(self: Any, schema: Any) -> Any:
        r = RowtimeDataSource.streamReader(self, schema)
        r.__class__ = reader_cls
        return r

    source = type(
        "SmallStepsSource",
        (RowtimeDataSource,),
        {"name": classmethod(lambda cls: "rowtime_small_steps"), "streamReader": stream_reader},
    )
    source.__module__ = "__main__"
    return source


def write_backlog(location: Path, first: int, bound_s: int) -> None:
    """Rows ``first..first+ROWS_PER_PARTITION`` in each of two partitions, 10 a second, in
    rowtime order, then a bound at ``bound_s`` seconds after BASE_US."""
    for p in (0, 1):
        rows = [
            ({"p": p, "i": i}, BASE_US + i * US // 10 + p)
            for i in range(first, first + ROWS_PER_PARTITION)
        ]
        write_rows(location, p, rows, bound_us=BASE_US + bound_s * US)


def ids(run: Run) -> list[tuple[int, int]]:
    return sorted((r["p"], r["i"]) for r in run.rows)


@needs_supported
def test_available_now_reads_the_whole_backlog_past_the_step_cap_and_after_a_restart(
    spark: SparkSession, tmp_path: Path
) -> None:
    import pyspark_rowtime as pr

    location = tmp_path / "s"
    pr.create_stream(str(location), "p INT, i INT", partitions=2)
    write_backlog(location, 0, 15)
    spark.dataSource.register(small_steps_source(CAP))
    df = spark.readStream.format("rowtime_small_steps").load(str(location))
    checkpoint = tmp_path / "cp"

    first = run_available_now(df, checkpoint)
    assert ids(first) == [(p, i) for p in (0, 1) for i in range(ROWS_PER_PARTITION)]
    batches = [b for b in first.batches if b[1]]
    if HAS_ADMISSION_CONTROL:
        # Spark 4.2+: steps of at most CAP new records, and Spark asks until the target
        assert len(batches) >= 2 * ROWS_PER_PARTITION // CAP
        assert all(len(rows) <= CAP + 1 for _, rows in batches)  # + the bound record
    else:
        # Spark 4.1: one micro-batch, the whole backlog (a capped one would end the query)
        assert len(batches) == 1

    # more rows, then the same query again from its checkpoint: each row once, none lost
    write_backlog(location, ROWS_PER_PARTITION, 30)
    second = run_available_now(df, checkpoint)
    assert ids(second) == [
        (p, i) for p in (0, 1) for i in range(ROWS_PER_PARTITION, 2 * ROWS_PER_PARTITION)
    ]
    assert second.bounds and max(second.bounds) == BASE_US + 30 * US


@needs_supported
def test_max_rows_per_batch_caps_batches_or_is_refused_naming_the_versions(
    spark: SparkSession, tmp_path: Path
) -> None:
    import pyspark_rowtime as pr

    location = tmp_path / "s"
    pr.create_stream(str(location), "p INT, i INT", partitions=2)
    write_backlog(location, 0, 15)
    df = reader(spark, location, maxRowsPerBatch=25)
    if HAS_ADMISSION_CONTROL:
        run = run_available_now(df, tmp_path / "cp")
        assert ids(run) == [(p, i) for p in (0, 1) for i in range(ROWS_PER_PARTITION)]
        # each micro-batch admits at most 25 new log records (rows above the stream clock are
        # emitted by a later one, so a batch's rows can be more): count them in the offsets
        admitted = [
            sum(p["next"] for p in run.end_offset(b)["partitions"].values()) for b, _ in run.batches
        ]
        steps = [b - a for a, b in zip([0, *admitted], admitted, strict=False)]
        assert steps and all(0 <= n <= 25 for n in steps), steps
        assert admitted[-1] == 2 * (ROWS_PER_PARTITION + 1)  # every row and bound record
        return
    with pytest.raises(PySparkException) as err:  # the StreamingQueryException
        run_available_now(df, tmp_path / "cp")
    text = str(err.value)
    for part in ("maxRowsPerBatch=25", "needs Spark 4.2 or later", f"Spark {SPARK_VERSION_TEXT}"):
        assert part in text, text


@pytest.mark.skipif(SUPPORTED, reason="Spark 4.0 only: the refusal where Spark calls the source")
def test_spark_4_0_finds_format_rowtime_and_every_entry_point_names_the_versions(
    spark: SparkSession, tmp_path: Path
) -> None:
    import pyspark_rowtime as pr

    location = tmp_path / "s"
    pr.create_stream(str(location), "p INT, i INT", partitions=1)
    write_rows(location, 0, [({"p": 0, "i": 1}, BASE_US)], bound_us=BASE_US + US)
    wanted = ("needs Spark 4.1 or later", f"this is Spark {SPARK_VERSION_TEXT}")

    def refused(action: Any) -> None:
        with pytest.raises(PySparkException) as err:  # Spark wraps the Python error
            action()
        text = str(err.value)
        assert "DATA_SOURCE_NOT_FOUND" not in text, text
        for part in wanted:
            assert part in text, text

    refused(lambda: spark.read.format("rowtime").load(str(location)).collect())
    refused(lambda: spark.readStream.format("rowtime").load(str(location)))
    rate = spark.readStream.format("rate").load()

    def write() -> None:
        q = (
            rate.writeStream.format("rowtime")
            .option("checkpointLocation", str(tmp_path / "cp"))
            .start(str(tmp_path / "t"))
        )
        try:
            q.processAllAvailable()
        finally:
            q.stop()

    refused(write)


#: The driver-memory check on Spark 4.1 (docs/getting-started.md, Spark versions): 4 M rows, as in
#: integration/test_driver_memory.py, planned in Spark 4.1's order as one step.
MEMORY_ROWS = 4_000_000
BYTES_PER_RECORD = 18
FIXED_BYTES = 48 << 20

PLAN_AS_SPARK_4_1 = """
import json, sys, tracemalloc
import pyarrow as pa
from pyspark_rowtime.datasource.spark import RowtimeStreamReader, _config

cfg, arrow = _config(json.loads(sys.argv[1]))
reader = RowtimeStreamReader(cfg, arrow)
tracemalloc.start()
end = reader.latestOffset()  # Spark 4.1: no arguments, and first (availableNow's target)
start = reader.initialOffset()
rows = sum(p.task.runs.rows for p in reader.partitions(start, end))
_, numpy_peak = tracemalloc.get_traced_memory()
print(json.dumps({
    "rows": rows,
    "again": reader.latestOffset() == end,
    "peak": numpy_peak + pa.default_memory_pool().max_memory(),
}))
"""


@needs_supported
def test_spark_4_1_plans_a_backlog_in_one_step_within_the_stated_memory(tmp_path: Path) -> None:
    """On 4.1 the planner holds the whole backlog (no step cap can apply): every record in
    the first latestOffset(), within 18 bytes a record + 48 MiB (numpy's traced peak and
    Arrow's pool peak; docs/benchmarks.md gives traced peaks at 20 M and 50 M rows)."""
    import pyspark_rowtime as pr

    location = tmp_path / "backlog"
    pr.create_stream(str(location), "id BIGINT", partitions=2)
    rng = np.random.default_rng(26)
    for p in (0, 1):
        with pr.open_writer(str(location), p) as w:
            for first in range(0, MEMORY_ROWS // 2, 1_000_000):
                t = BASE_US + np.arange(first, first + 1_000_000, dtype=np.int64) * 100
                early = rng.random(len(t)) < 0.01
                t[early] -= rng.integers(1, 500_000, int(early.sum()))
                ids = pa.array(np.arange(first, first + 1_000_000, dtype=np.int64))
                table = pa.table(
                    {"id": ids, "rowtime": pa.array(t).view(pa.timestamp("us", tz="UTC"))}
                )
                w.insert_arrow(table, rowtime_column="rowtime")
            w.end_stream()
    options = {"path": str(location), "order": "adjust", "adjust.unit": "msec"}
    options["adjust.range"] = "999"
    out = subprocess.run(
        [sys.executable, "-c", PLAN_AS_SPARK_4_1, json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["rows"] == MEMORY_ROWS and got["again"]
    assert got["peak"] < BYTES_PER_RECORD * MEMORY_ROWS + FIXED_BYTES, got


# -- availableNow runs the no-data batch: what the last bound closes comes out in the same run --


def write_minutes(location: Path, first_s: int, last_s: int, bound_s: int) -> list[int]:
    """A row every half second of ``[first_s, last_s)`` after BASE_US, alternating between two
    partitions, with key ``k`` a or b; then a bound at ``bound_s`` in each. Returns the
    rowtimes."""
    times = [BASE_US + h * US // 2 for h in range(2 * first_s, 2 * last_s)]
    for p in (0, 1):
        rows = [
            ({"p": p, "i": h, "k": "ab"[h % 4 // 2]}, t)
            for h, t in enumerate(times, start=2 * first_s)
            if h % 2 == p
        ]
        write_rows(location, p, rows, bound_us=BASE_US + bound_s * US)
    return times


def closed_minutes(times: list[int], watermark_us: int) -> Counter[int]:
    """Rows per one-minute window (its start, µs) of the windows ending at or below the
    watermark: what a windowed count in append mode has emitted once Spark applied it."""
    minute = 60 * US
    return Counter(
        t // minute * minute for t in times if t // minute * minute + minute <= watermark_us
    )


@needs_supported
def test_available_now_emits_the_windows_panes_and_joined_rows_its_last_bound_closes(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 34: Spark 4.1 runs ``availableNow`` over a Python source as ``Trigger.Once``
    unless ``with_watermark`` turned on Spark's wrapper; a windowed count, a
    ``time_interval_aggregate`` and a left ``overlap_join`` then emit, in the run, everything
    their last bound closes, as 4.2 and later do, and a second run from the checkpoint adds
    what its own bound closes."""
    from pyspark.sql import functions as F

    import pyspark_rowtime as pr
    from pyspark_rowtime.watermark import AVAILABLE_NOW_WRAPPER

    location = tmp_path / "s"
    pr.create_stream(str(location), "p INT, i INT, k STRING", partitions=2)
    times = write_minutes(location, 0, 150, 150)  # 22:13:20 to 22:15:50, bound 22:15:50

    def windowed(spark_df: Any) -> Any:
        counts = pr.with_watermark(spark_df).groupBy(F.window("rowtime", "1 minute")).count()
        return counts.select(F.col("window.start").alias("start"), "count")

    def minutes(run: Run) -> Counter[int]:
        return Counter({r["start"]: r["count"] for r in run.records})

    # the 1 ms delay of with_watermark: a window ending exactly at a bound stays open
    first = run_available_now(windowed(reader(spark, location)), tmp_path / "cp-w")
    assert minutes(first) == closed_minutes(times, BASE_US + 150 * US - 1000) != Counter()
    if SPARK_VERSION[:2] == (4, 1):
        assert spark.conf.get(AVAILABLE_NOW_WRAPPER) == "true"
    more = write_minutes(location, 150, 270, 270)
    second = run_available_now(windowed(reader(spark, location)), tmp_path / "cp-w")
    closed = closed_minutes(times + more, BASE_US + 270 * US - 1000)
    assert minutes(second) == closed - minutes(first) != Counter()

    panes = pr.time_interval_aggregate(
        reader(spark, location), F.count("*").alias("n"), interval_duration="1 minute"
    )
    run = run_available_now(panes, tmp_path / "cp-p")
    assert Counter({r["interval_start"]: r["n"] for r in run.records}) == closed

    # a left join: left rows valid 2 s, one right row valid 1 s at the start with key a; the
    # left rows that meet it form pairs, every other one comes out alone once the watermark
    # (both clocks) passed its end, those the last bound closes included
    right = tmp_path / "r"
    pr.create_stream(str(right), "p INT, i INT, k STRING", partitions=1)
    write_rows(right, 0, [({"p": 0, "i": -1, "k": "a"}, BASE_US)], bound_us=BASE_US + 270 * US)
    joined = pr.overlap_join(
        reader(spark, location, **{"interval.duration": "2 seconds"}),
        reader(spark, right, **{"interval.duration": "1 second"}),
        "k",
        how="left",
    )
    run = run_available_now(joined, tmp_path / "cp-j")
    pairs = sorted(r["left_i"] for r in run.records if r["right_i"] is not None)
    alone = sorted(r["left_i"] for r in run.records if r["right_i"] is None)
    watermark = BASE_US + 270 * US - 1000
    assert pairs == [0, 1]  # a at 0 s and 0.5 s overlap [0 s, 1 s)
    assert alone == [h for h, t in enumerate(times + more) if h > 1 and t + 2 * US <= watermark]

    if SPARK_VERSION[:2] == (4, 1):  # a session where the user turned the wrapper off: warned
        spark.conf.set(AVAILABLE_NOW_WRAPPER, "false")
        try:
            with caplog.at_level("WARNING", logger="pyspark_rowtime"):
                pr.with_watermark(reader(spark, location))
            assert f"{AVAILABLE_NOW_WRAPPER}=false" in caplog.text
            assert "processingTime" in caplog.text
        finally:
            spark.conf.set(AVAILABLE_NOW_WRAPPER, "true")

"""Every public function works in a Spark Connect session (issue 22).

``./dev test`` runs this file in both modes; under Spark Connect the client has no JVM of its
own (its server is another process, ``helpers.connect_server``), so a function that reached
for Py4J (``_jdf``, ``_jvm``, ``sparkContext``...) fails here. The calls run in the Connect
pass only: in classic Spark each function has its own tests and its example
(``test_api_examples_spark.py``); the checks below them run in both modes. The list of calls
is checked against ``pyspark_rowtime.__all__``: a public function added without a call here
fails the first test, so each new one is run under Connect too.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    BASE_US,
    CONNECT,
    US,
    at,
    batch_recorder,
    reader,
    recorded_batches,
    start_writer,
    write_rows,
)
from pyspark.sql import functions as F

import pyspark_rowtime as pr
from pyspark_rowtime.watermark import check_dataframe


def _stream(workdir: Path, name: str = "s", schema: str = "k STRING, v INT") -> str:
    location = str(workdir / name)
    pr.create_stream(location, schema)
    return location


def _quiet_stream(workdir: Path, name: str = "s") -> str:
    """Three rows, then the end of the stream."""
    location = _stream(workdir, name)
    rows = [({"k": "a", "v": i}, BASE_US + i * US) for i in range(3)]
    write_rows(location, 0, rows, end=True)
    return location


def _run_to_end(df: Any, workdir: Path, name: str) -> list[Any]:
    """Run ``df`` once over everything available; the rows it wrote."""
    folder = workdir / f"{name}-out"
    q = start_writer(
        df.writeStream.foreachBatch(batch_recorder(folder))
        .option("checkpointLocation", str(workdir / f"{name}-ck"))
        .trigger(availableNow=True)
    )
    q.awaitTermination()
    assert q.exception() is None
    return [r for _, rows in recorded_batches(folder) for r in rows]


# -- one call per public function: what a user does with it ---------------------------------------


def call_with_watermark(spark: Any, workdir: Path) -> None:
    df = pr.with_watermark(reader(spark, _quiet_stream(workdir)))
    assert df.columns == ["k", "v", "rowtime"]
    assert sorted(r["v"] for r in _run_to_end(df, workdir, "ww")) == [0, 1, 2]


def call_check_query(spark: Any, workdir: Path) -> None:
    location = _stream(workdir)
    pr.watch_queries(spark)  # under Spark Connect, the check of a query is taken at its start
    bare = reader(spark, location).withWatermark("rowtime", "1 second").groupBy("k").count()
    q = bare.writeStream.outputMode("update").format("noop")
    q = q.option("checkpointLocation", str(workdir / "ck")).start()
    try:
        problems = pr.check_query(q)
    finally:
        q.stop()
    assert len(problems) == 1 and "without pyspark_rowtime.with_watermark" in problems[0]


def call_watch_queries(spark: Any, workdir: Path) -> None:
    pr.watch_queries(spark)
    pr.watch_queries(spark)  # idempotent


def call_use_catalog(spark: Any, workdir: Path) -> None:
    _quiet_stream(workdir, "data")
    catalog = workdir / "catalog.toml"
    catalog.write_text('[streams.orders]\nlocation = "data"\nschema = "k STRING, v INT"\n')
    assert pr.use_catalog(spark, str(catalog)) == str(catalog)
    df = spark.readStream.format("rowtime").option("stream", "orders").load()
    assert sorted(r["v"] for r in _run_to_end(df, workdir, "cat") if not r["is_bound"]) == [0, 1, 2]


def call_time_interval_aggregate(spark: Any, workdir: Path) -> None:
    df = reader(spark, _quiet_stream(workdir))
    out = pr.time_interval_aggregate(
        df, [F.count("*").alias("n"), F.max("v").alias("top")], interval_duration="10 seconds"
    )
    assert out.columns == ["interval_start", "interval_end", "n", "top", "rowtime"]
    got = [(r["n"], r["top"]) for r in _run_to_end(out, workdir, "tia")]
    assert got == [(3, 2)]
    with pytest.raises(pr.OptionError, match="is not an aggregate the window can keep"):
        pr.time_interval_aggregate(df, F.count_distinct("v"), interval_duration=10)


def call_overlap_join(spark: Any, workdir: Path) -> None:
    left = _quiet_stream(workdir, "left")
    right = _quiet_stream(workdir, "right")
    read = lambda loc: reader(spark, loc, **{"interval.count": "1"})  # noqa: E731
    out = pr.overlap_join(read(left), read(right), "k")
    assert {"k", "rowtime", "rowtime_end"} <= set(out.columns)
    # Rows i of both sides are valid over [i, i + 1) s (the next row supersedes them; the
    # last until the end of stream): each overlaps only its twin.
    assert len(_run_to_end(out, workdir, "oj")) == 3


def call_interval_aggregate(spark: Any, workdir: Path) -> None:
    df = reader(spark, _quiet_stream(workdir), **{"interval.count": "1"})
    out = pr.interval_aggregate(df, {"n": "count(*)", "top": "max(v)"})
    assert {"n", "top", "rowtime", "rowtime_end"} <= set(out.columns)
    # rows i valid over [i, i + 1) s, the last until the end of stream: one stretch each
    got = sorted((r["rowtime"], r["n"], r["top"]) for r in _run_to_end(out, workdir, "ia"))
    assert [(n, top) for _, n, top in got] == [(1, 0), (1, 1), (1, 2)]


def call_windows(spark: Any, workdir: Path) -> None:
    """The grouped element window (also sliding) and the predicate window, each into
    interval_aggregate, and a window into overlap_join."""
    df = reader(spark, _quiet_stream(workdir))
    rows = pr.interval_aggregate(pr.rows_window(df, 2, partition_by="k"), {"n": "count(*)"})
    got = sorted((r["rowtime"], r["n"]) for r in _run_to_end(rows, workdir, "rw"))
    # row i is valid until row i + 2 starts: {0} over [0, 1) s, {0, 1} over [1, 2), then {1, 2}
    # (another set of rows: another stretch, though its count is the same)
    assert [n for _, n in got] == [1, 2, 2]
    df = reader(spark, _quiet_stream(workdir, "w"))
    hot = pr.interval_aggregate(pr.while_window(df, "v >= 1", partition_by="k"), {"n": "count(*)"})
    got = sorted((r["rowtime"], r["n"]) for r in _run_to_end(hot, workdir, "ww2"))
    # rows 1 and 2 hold the condition and nothing closes them: 1 from 1 s, 2 from 2 s on
    assert [n for _, n in got] == [1, 2]
    df = reader(spark, _quiet_stream(workdir, "slid"))
    slid = pr.interval_aggregate(
        pr.rows_window(df, 2, slide=2, partition_by="k"), {"n": "count(*)"}
    )
    got = sorted((r["rowtime"], r["n"]) for r in _run_to_end(slid, workdir, "rs"))
    # rows 0 and 1 (one block) valid until row 2 starts; row 2 until the end of stream
    assert [n for _, n in got] == [1, 2, 1]
    left = pr.rows_window(reader(spark, _quiet_stream(workdir, "wl")), 1, partition_by="k")
    right = reader(spark, _quiet_stream(workdir, "wr"), **{"interval.count": "1"})
    # a window into the join: rows i of both sides valid over [i, i + 1) s, each meets its twin
    assert len(_run_to_end(pr.overlap_join(left, right, "k"), workdir, "wj")) == 3


def call_streams_api(spark: Any, workdir: Path) -> None:
    """The adapter API needs no Spark: create, open, write, read, clocks."""
    location = str(workdir / "api")
    stream = pr.create_stream(location, "k STRING")
    with pr.open_writer(stream) as w:
        w.insert({"k": "x"}, rowtime=at(BASE_US))
        w.set_rowtime_bound(at(BASE_US + US))
        w.flush()
    assert pr.read_stream(location).num_rows == 2
    assert pr.open_stream(location).meta.partitions == 1
    assert pr.to_rowtime_us(pr.get_rowtime_bound(location)) == BASE_US + US
    # the clock has reached the bound: one read, no wait
    reached = pr.wait_for_rowtime_bound(location, at(BASE_US + US), timeout=0)
    assert pr.to_rowtime_us(reached) == BASE_US + US
    with pytest.raises(pr.WaitTimeoutError, match=r"the clock of .* is .*, waiting for"):
        pr.wait_for_rowtime_bound(location, at(BASE_US + 2 * US), timeout=0)
    assert pr.from_rowtime_us(BASE_US) == at(BASE_US)


def call_panes(spark: Any, workdir: Path) -> None:
    spec = pr.TimeIntervalSpec(10, 5)
    assert pr.assign_panes(BASE_US + 7 * US, spec)
    window = pr.TimeIntervalWindow(spec)
    window.insert(BASE_US, {"v": 1})
    assert window.advance_watermark(BASE_US + 60 * US)


def call_check_dataframe(spark: Any, workdir: Path) -> None:
    """Names the shapes before start (the check Spark Connect users run before ``start()``)."""
    location = _stream(workdir)
    good = pr.with_watermark(reader(spark, location)).where("k = 'a'").groupBy("k").count()
    assert check_dataframe(good) == []
    bare = reader(spark, location).withWatermark("rowtime", "1 second").where("v > 0")
    (problem,) = check_dataframe(bare)
    assert problem.startswith("withWatermark('rowtime') on a format('rowtime') stream")
    union = reader(spark, location).union(reader(spark, location))
    problems = check_dataframe(union.withWatermark("rowtime", "1 second"))
    assert any("one watermark over 2 rowtime streams" in p for p in problems), problems


CALLS: dict[str, Callable[[Any, Path], None]] = {
    "with_watermark": call_with_watermark,
    "check_query": call_check_query,
    "check_dataframe": call_check_dataframe,
    "watch_queries": call_watch_queries,
    "use_catalog": call_use_catalog,
    "time_interval_aggregate": call_time_interval_aggregate,
    "overlap_join": call_overlap_join,
    "interval_aggregate": call_interval_aggregate,
    "rows_window": call_windows,
    "while_window": call_windows,
    "create_stream": call_streams_api,
    "open_writer": call_streams_api,
    "open_stream": call_streams_api,
    "read_stream": call_streams_api,
    "get_rowtime_bound": call_streams_api,
    "wait_for_rowtime_bound": call_streams_api,
    "to_rowtime_us": call_streams_api,
    "from_rowtime_us": call_streams_api,
    "assign_panes": call_panes,
    "TimeIntervalSpec": call_panes,
    "TimeIntervalWindow": call_panes,
    # format("rowtime") itself: every call above reads through it.
    "DefaultSource": call_with_watermark,
    "RowtimeDataSource": call_with_watermark,
}

#: Public names that are values a user passes, not functions that could reach Spark.
PLAIN = {"AdjustPolicy", "DropPolicy", "RejectPolicy", "ValidityInterval"}


def test_every_public_function_has_a_call_here() -> None:
    public = {
        name
        for name in pr.__all__
        if not (inspect.isclass(getattr(pr, name)) and issubclass(getattr(pr, name), Exception))
    }
    missing = sorted(public - set(CALLS) - PLAIN)
    assert not missing, f"add a call for each public function to CALLS: {missing}"
    assert not set(CALLS) - set(pr.__all__), "CALLS names something that is not public"


@pytest.mark.skipif(
    not CONNECT,
    reason="the Connect pass's proof; classic Spark runs each public function in its own tests "
    "and its example (test_api_examples_spark.py)",
)
@pytest.mark.parametrize("call", sorted(set(CALLS.values()), key=lambda f: f.__name__))
def test_the_public_function_works_in_this_session(
    spark: Any, workdir: Path, call: Callable[[Any, Path], None]
) -> None:
    if CONNECT:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        # The client has no JVM: a Py4J call in the project would fail, not pass unnoticed.
        assert SparkContext._active_spark_context is None
        assert SparkSession._instantiatedSession is None
    call(spark, workdir)


# -- the checks give the same findings in both modes (the findings themselves) --------------------


def test_a_filter_before_with_watermark_is_refused_in_this_session(spark: Any, workdir: Path):
    location = _stream(workdir)
    with pytest.raises(pr.QueryShapeError, match=r"a filter \(k = a\) stands between"):
        pr.with_watermark(reader(spark, location).where("k = 'a'"))
    na_drop = r"a filter atleastnnonnulls\(4, k, v, rowtime, is_bound\) stands"
    with pytest.raises(pr.QueryShapeError, match=na_drop):
        pr.with_watermark(reader(spark, location).na.drop().select("k", "rowtime", "is_bound"))


UNWATCHED = """
import os, sys
from pyspark.sql import SparkSession
import pyspark_rowtime as pr
spark = SparkSession.builder.remote(os.environ["ROWTIME_CONNECT_URL"]).getOrCreate()
df = pr.with_watermark(spark.readStream.format("rowtime").load(sys.argv[1]))
assert df.isStreaming
spark.stop()
print("stopped", flush=True)
"""


@pytest.mark.skipif(not CONNECT, reason="Spark Connect only: the warning is its client's")
def test_a_stopped_connect_session_exits_without_a_listener_warning(spark: Any, workdir: Path):
    """``with_watermark`` adds a query listener to the session (``watermark.watch_queries``).
    A user's program that stops its Spark Connect session and exits must not be told, by
    PySpark's ``SparkSession.__del__``, that the listener could not be removed and to remove it
    again: the listener went with the session. (PySpark's handler thread of listener events
    may still warn that it "received exception" when stop() closes its channel under it: a
    race of the client's own, whatever listener is added.)"""
    location = _stream(workdir)
    done = subprocess.run(
        [sys.executable, "-c", UNWATCHED, location],
        capture_output=True, text=True, timeout=120, cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0 and "stopped" in done.stdout, done.stderr[-3000:]
    assert "Failed to remove the listener" not in done.stderr, done.stderr[-3000:]

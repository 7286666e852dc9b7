"""Bounds reach Spark's watermark whatever the user writes after ``with_watermark`` (issue 9).

Each test scripts a stream with a *quiet ending*: after the last row only bound records follow,
so anything that closes after it was closed by bounds alone. Each compares Spark's output with
a brute-force computation over the same rows, and checks that Spark dropped no row as late.
The optimizer's side is checked on the plan each query really ran: no filter stands between a
``rowtime`` source and its watermark.
"""

from __future__ import annotations

import contextlib
import io
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    BASE_US,
    US,
    Run,
    drain,
    dropped_by_watermark,
    reader,
    start_append,
    write_rows,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType

import pyspark_rowtime as pr
from pyspark_rowtime.watermark import PlanNode, parse_plan

MINUTE = 60 * US
#: with_watermark's minimum delay: Spark's watermark is the highest event time minus 1 ms.
DELAY_US = 1000


def keyed_rows(n: int, step_us: int, keys: str = "abc", first_us: int = BASE_US):
    """``n`` rows ``{"k", "v"}``, one every ``step_us``, keys cycling through ``keys``."""
    return [({"k": keys[i % len(keys)], "v": i}, first_us + i * step_us) for i in range(n)]


def feed(location: Path, rows: list[tuple[dict[str, Any], int]], partitions: int = 1) -> None:
    """Rows dealt round-robin over the partitions, one flushed segment per partition."""
    for p in range(partitions):
        write_rows(location, p, rows[p::partitions])


def quiet_ending(location: Path, bound_us: int, partitions: int = 1) -> None:
    """Bounds only: no row follows."""
    for p in range(partitions):
        write_rows(location, p, [], bound_us=bound_us)


def settle(query: Any, run: Run) -> None:
    """Spark applies a watermark one batch after it learns it: two rounds, the second a
    no-data batch."""
    drain(query, run)
    drain(query, run)


def emitted(run: Run) -> list[dict[str, Any]]:
    return [r for _, recs in run.batches for r in recs]


def window_counts(rows: list[tuple[dict[str, Any], int]], size_us: int) -> dict[int, int]:
    out: dict[int, int] = {}
    for _, t in rows:
        start = t - t % size_us
        out[start] = out.get(start, 0) + 1
    return out


def optimized_plan(query: Any) -> str:
    """The optimized logical plan of the query's last micro-batch, as Spark's text (the
    query's ``explain(True)``: classic Spark and Spark Connect print the same)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        query.explain(True)
    text = out.getvalue()
    assert "== Optimized Logical Plan ==" in text, text
    return text.split("== Optimized Logical Plan ==", 1)[1].split("\n== ", 1)[0].strip("\n")


def filters_below_watermarks(plan: str) -> list[str]:
    """The filter conditions between any watermark node and the scans below it."""
    found: list[str] = []
    root = parse_plan(plan)
    assert root is not None, plan

    def walk(n: PlanNode, below: bool) -> None:
        if below and n.name == "Filter":
            found.append(n.args)
        for c in n.children:
            walk(c, below or n.name == "EventTimeWatermark")

    walk(root, False)
    return found


def highest_event_time_us(run: Run) -> int:
    """The highest ``rowtime`` the query's watermark nodes saw (the ``max`` of each batch's
    event-time stats): what Spark's next watermark is derived from, stateful or not."""
    seen = [p["eventTime"]["max"] for p in run.progress if "max" in p.get("eventTime", {})]
    return max(int(pr.to_rowtime_us(t)) for t in seen)


def stream(location: Path, partitions: int = 1) -> Path:
    pr.create_stream(str(location), "k STRING, v INT", partitions=partitions)
    return location


# -- each shape keeps the bounds above the optimizer's reach ------------------------------------


def _udf_filter(df: DataFrame) -> DataFrame:
    is_a = F.udf(lambda k: k == "a", BooleanType())
    return df.where(is_a("k"))


def _join(df: DataFrame, other: DataFrame) -> DataFrame:
    left = df.select(F.col("k").alias("lk"), F.col("rowtime").alias("lt"))
    right = other.select(F.col("k").alias("rk"), F.col("rowtime").alias("rt"))
    cond = (F.col("lk") == F.col("rk")) & F.col("rt").between(
        F.col("lt"), F.col("lt") + F.expr("INTERVAL 30 SECONDS")
    )
    return left.join(right, cond, "leftOuter")


SHAPES: dict[str, Callable[[DataFrame, DataFrame], DataFrame]] = {
    "payload-filter": lambda df, _: df.where("k = 'a'"),
    "projection-then-filter": lambda df, _: df.select("k", "rowtime").where(F.col("k") != "b"),
    "na-drop": lambda df, _: df.na.drop(),
    "udf-filter": lambda df, _: _udf_filter(df),
    "window-after-filter": lambda df, _: (
        df.where("v >= 0").groupBy(F.window("rowtime", "1 minute")).count()
    ),
    "left-outer-join-on-key": _join,
    "drop-duplicates-within-watermark": lambda df, _: df.where(
        "k IS NOT NULL"
    ).dropDuplicatesWithinWatermark(["k"]),
    "union-then-filter": lambda df, other: df.union(other).where("k = 'a'"),
}

STATEFUL = {"window-after-filter", "left-outer-join-on-key", "drop-duplicates-within-watermark"}

#: The shapes the Spark Connect pass runs too: one of each kind of plan a client sends (a SQL
#: filter, a Python UDF the client pickles, a stateful join of two watermarked streams, a union).
#: What a shape does to the watermark is the server's optimizer's, the same in both modes.
CONNECT_SHAPES = {"payload-filter", "udf-filter", "left-outer-join-on-key", "union-then-filter"}
#: Why the other shapes, and the brute-force tests of a shape the list has, are classic only.
SERVER_SIDE = (
    "the watermark's way through this shape is the server's; the Connect pass runs one shape of "
    "each kind a client sends (CONNECT_SHAPES)"
)


@pytest.mark.spark_subset
@pytest.mark.parametrize(
    "shape",
    [
        s if s in CONNECT_SHAPES else pytest.param(s, marks=pytest.mark.classic_only(SERVER_SIDE))
        for s in SHAPES
    ],
)
def test_the_watermark_follows_the_stream_clock_through_every_shape(
    spark: SparkSession, tmp_path: Path, shape: str
) -> None:
    a, b = stream(tmp_path / "a"), stream(tmp_path / "b")
    query_df = SHAPES[shape](
        pr.with_watermark(reader(spark, a)), pr.with_watermark(reader(spark, b))
    )
    run = Run()
    q = start_append(query_df, tmp_path / "ck", run)
    try:
        for location in (a, b):
            feed(location, keyed_rows(6, 10 * US))
        drain(q, run)
        bound = BASE_US + 10 * MINUTE
        for location in (a, b):
            quiet_ending(location, bound)
        settle(q, run)
        plan = optimized_plan(q)
        problems = pr.check_query(q)
        last_watermark = q.lastProgress["eventTime"].get("watermark")
    finally:
        q.stop()
    assert filters_below_watermarks(plan) == [], plan
    assert highest_event_time_us(run) == bound
    if shape in STATEFUL:  # these run a no-data batch with the new watermark
        assert int(pr.to_rowtime_us(last_watermark)) == bound - DELAY_US
    assert problems == []
    assert dropped_by_watermark(run) == 0


# -- the shapes, with brute-force expectations ---------------------------------------------------


def test_a_tumbling_window_after_a_payload_filter_closes_on_bounds_alone(
    spark: SparkSession, tmp_path: Path
) -> None:
    location = stream(tmp_path / "s", partitions=2)
    rows = keyed_rows(90, 7 * US)  # 10.5 minutes, keys a, b, c
    df = pr.with_watermark(reader(spark, location)).where("k = 'a'")
    counts = df.groupBy(F.window("rowtime", "1 minute")).count()
    run = Run()
    q = start_append(counts.select("window.start", "count"), tmp_path / "ck", run)
    try:
        for i in range(0, len(rows), 30):
            feed(location, rows[i : i + 30], partitions=2)
            drain(q, run)
        quiet_ending(location, rows[-1][1] + 2 * MINUTE, partitions=2)
        settle(q, run)
    finally:
        q.stop()
    expected = window_counts([r for r in rows if r[0]["k"] == "a"], MINUTE)
    got = [(r["start"], r["count"]) for r in emitted(run)]
    assert sorted(got) == sorted(expected.items())  # each window once, the last one included
    assert len(got) == len(expected) == 11
    assert dropped_by_watermark(run) == 0


def sessions(times: list[int], gap_us: int) -> list[tuple[int, int, int]]:
    """Brute force session windows: (start, end, count), end = last row + gap."""
    out: list[tuple[int, int, int]] = []
    for t in sorted(times):
        if out and t < out[-1][1]:
            start, _, n = out[-1]
            out[-1] = (start, t + gap_us, n + 1)
        else:
            out.append((t, t + gap_us, 1))
    return out


@pytest.mark.classic_only(SERVER_SIDE)
def test_a_session_window_after_a_filter_closes_on_bounds_alone(
    spark: SparkSession, tmp_path: Path
) -> None:
    location = stream(tmp_path / "s")
    # Bursts of rows 2 s apart, separated by 40 s of silence; gap 20 s.
    rows = []
    for burst in range(4):
        for i in range(5):
            t = BASE_US + burst * 50 * US + i * 2 * US
            rows.append(({"k": "ab"[i % 2], "v": burst * 5 + i}, t))
    df = pr.with_watermark(reader(spark, location)).where(F.col("v") % 3 != 0)
    grouped = df.groupBy(F.session_window("rowtime", "20 seconds"), "k").count()
    out = grouped.select("k", "session_window.start", "session_window.end", "count")
    run = Run()
    q = start_append(out, tmp_path / "ck", run)
    try:
        feed(location, rows[:10])
        drain(q, run)
        feed(location, rows[10:])
        drain(q, run)
        quiet_ending(location, rows[-1][1] + MINUTE)
        settle(q, run)
    finally:
        q.stop()
    kept = [(r["k"], t) for r, t in rows if r["v"] % 3 != 0]
    expected = sorted(
        (k, s, e, n)
        for k in "ab"
        for s, e, n in sessions([t for kk, t in kept if kk == k], 20 * US)
    )
    got = sorted((r["k"], r["start"], r["end"], r["count"]) for r in emitted(run))
    assert got == expected
    assert dropped_by_watermark(run) == 0


@pytest.mark.classic_only(SERVER_SIDE)
def test_stream_stream_joins_on_a_key_release_unmatched_rows_once_both_clocks_pass(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A left outer join emits a left row without a match once both watermarks pass the end of
    its time range; with the bounds cut off (Spark's inferred ``isnotnull(key)`` pushed below
    the watermark) they never came. The inner join gives the matches, each once."""
    left_loc, right_loc = stream(tmp_path / "left"), stream(tmp_path / "right")
    window_us = 30 * US
    left_rows = keyed_rows(40, 5 * US, keys="abcd")
    # The right side matches keys a and b only, 10 s after the left row.
    right_rows = [(r, t + 10 * US) for r, t in left_rows if r["k"] in "ab"]

    def side(location: Path, prefix: str) -> DataFrame:
        df = pr.with_watermark(reader(spark, location))
        return df.select(
            F.col("k").alias(f"{prefix}k"),
            F.col("v").alias(f"{prefix}v"),
            F.col("rowtime").alias(f"{prefix}t"),
        )

    cond = (F.col("lk") == F.col("rk")) & F.col("rt").between(
        F.col("lt"), F.col("lt") + F.expr("INTERVAL 30 SECONDS")
    )
    runs = {how: Run() for how in ("inner", "leftOuter")}
    queries = {
        how: start_append(
            side(left_loc, "l").join(side(right_loc, "r"), cond, how), tmp_path / how, runs[how]
        )
        for how in runs
    }
    # After each round: the min of both clocks, and how many batches each query had run.
    clocks: list[int] = []
    batches_after_round: dict[str, list[int]] = {how: [] for how in runs}

    def round_(left: list, right: list, bound_us: int | None = None) -> None:
        write_rows(left_loc, 0, left, bound_us=bound_us)
        write_rows(right_loc, 0, right, bound_us=bound_us)
        clocks.append(bound_us if bound_us is not None else min(left[-1][1], right[-1][1]))
        for how, q in queries.items():
            settle(q, runs[how])
            batches_after_round[how].append(len(runs[how].batches))

    try:
        round_(left_rows[:20], right_rows[:10])
        round_(left_rows[20:], right_rows[10:])
        quiet_ending_us = left_rows[-1][1] + 2 * MINUTE
        round_([], [], bound_us=quiet_ending_us)
    finally:
        for q in queries.values():
            q.stop()

    pairs = sorted(
        (lr["v"], rr["v"])
        for lr, lt in left_rows
        for rr, rt in right_rows
        if lr["k"] == rr["k"] and lt <= rt <= lt + window_us
    )
    inner = sorted((r["lv"], r["rv"]) for r in emitted(runs["inner"]))
    assert inner == pairs
    outer = emitted(runs["leftOuter"])
    assert sorted((r["lv"], r["rv"]) for r in outer if r["rv"] is not None) == pairs
    unmatched = sorted(r["lv"] for r in outer if r["rv"] is None)
    matched_v = {lv for lv, _ in pairs}
    expected_unmatched = sorted(r["v"] for r, _ in left_rows if r["v"] not in matched_v)
    assert unmatched == expected_unmatched  # each once, the last ones on bounds alone
    assert len(expected_unmatched) == 20

    # None early: an unmatched row comes out only in a round whose clocks passed its range.
    left_time = {r["v"]: t for r, t in left_rows}
    batch_round = {}
    for i, n in enumerate(batches_after_round["leftOuter"]):
        for b in range(n):
            batch_round.setdefault(b, i)
    for b, (_, recs) in enumerate(runs["leftOuter"].batches):
        for r in recs:
            if r["rv"] is None:
                assert clocks[batch_round[b]] > left_time[r["lv"]] + window_us, (r, b)
    for run in runs.values():
        assert dropped_by_watermark(run) == 0


@pytest.mark.classic_only(SERVER_SIDE)
def test_drop_duplicates_within_watermark_after_a_filter_forgets_keys_on_bounds_alone(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A key's state lives until the watermark passes its first row plus the delay. Here only
    a bound moves the watermark past it, so the key's next row is new again; with the bounds
    cut off below the watermark it would still be suppressed."""
    location = stream(tmp_path / "s")
    df = pr.with_watermark(reader(spark, location), delay="10 seconds").where("v >= 0")
    out = df.dropDuplicatesWithinWatermark(["k"]).select("k", "v")
    run = Run()
    q = start_append(out, tmp_path / "ck", run)
    try:
        write_rows(
            location,
            0,
            [
                ({"k": "x", "v": 0}, BASE_US),
                ({"k": "y", "v": 1}, BASE_US + 1 * US),
                ({"k": "x", "v": 2}, BASE_US + 5 * US),  # a duplicate within 10 s
            ],
        )
        drain(q, run)
        quiet_ending(location, BASE_US + MINUTE)  # only a bound: the watermark passes x's expiry
        settle(q, run)
        write_rows(location, 0, [({"k": "x", "v": 3}, BASE_US + MINUTE + US)])
        drain(q, run)
        quiet_ending(location, BASE_US + 2 * MINUTE)
        settle(q, run)
    finally:
        q.stop()
    assert sorted((r["k"], r["v"]) for r in emitted(run)) == [("x", 0), ("x", 3), ("y", 1)]
    assert dropped_by_watermark(run) == 0


def test_two_rowtime_streams_unioned_then_windowed_close_at_the_slower_clock(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Each stream gets its own watermark (with_watermark on each, then union); Spark takes
    their minimum, as the stream clock would. The stream that runs three minutes behind holds
    the windows open, and no row of it is dropped as late."""
    fast, slow = stream(tmp_path / "fast"), stream(tmp_path / "slow")
    fast_rows = keyed_rows(60, 5 * US, first_us=BASE_US + 3 * MINUTE)
    slow_rows = keyed_rows(60, 5 * US)
    union = pr.with_watermark(reader(spark, fast)).union(pr.with_watermark(reader(spark, slow)))
    counts = union.where("k != 'c'").groupBy(F.window("rowtime", "1 minute")).count()
    run = Run()
    q = start_append(counts.select("window.start", "count"), tmp_path / "ck", run)
    try:
        for i in range(0, 60, 20):
            write_rows(fast, 0, fast_rows[i : i + 20])
            write_rows(slow, 0, slow_rows[i : i + 20])
            settle(q, run)
        # Early windows may close only up to the slow stream's clock.
        slow_clock = slow_rows[-1][1]
        assert all(r["start"] + MINUTE <= slow_clock for r in emitted(run))
        end = fast_rows[-1][1] + 2 * MINUTE
        quiet_ending(fast, end)
        quiet_ending(slow, end)
        settle(q, run)
    finally:
        q.stop()
    kept = [r for r in fast_rows + slow_rows if r[0]["k"] != "c"]
    assert sorted((r["start"], r["count"]) for r in emitted(run)) == sorted(
        window_counts(kept, MINUTE).items()
    )
    assert dropped_by_watermark(run) == 0


# -- what cannot be protected is refused or named ------------------------------------------------


def test_a_filter_before_with_watermark_is_refused_naming_it_and_the_fix(
    spark: SparkSession, tmp_path: Path
) -> None:
    location = stream(tmp_path / "s")
    with pytest.raises(pr.QueryShapeError) as excinfo:
        pr.with_watermark(reader(spark, location).where("k = 'a'"))
    text = str(excinfo.value)
    assert "a filter (k = a) stands between" in text, text
    assert "then write filters, joins, unions and aggregations after it" in text


def test_one_watermark_over_a_union_of_two_rowtime_streams_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    a, b = stream(tmp_path / "a"), stream(tmp_path / "b")
    with pytest.raises(pr.QueryShapeError) as excinfo:
        pr.with_watermark(reader(spark, a).union(reader(spark, b)))
    assert "call with_watermark on each stream and union the results" in str(excinfo.value)


def test_projections_before_with_watermark_are_allowed(spark: SparkSession, tmp_path: Path) -> None:
    location = stream(tmp_path / "s")
    df = reader(spark, location).select(F.col("k").alias("key"), "rowtime", "is_bound")
    assert pr.with_watermark(df).columns == ["key", "rowtime"]


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.seen.set()


def test_spark_withwatermark_on_rowtime_without_the_helper_is_named_at_start(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Spark's own ``withWatermark`` keeps bound records in the query as rows: the check names
    it, and the listener that ``with_watermark`` installs logs it when such a query starts."""
    location = stream(tmp_path / "s")
    pr.watch_queries(spark)
    handler = _Collect()
    logging.getLogger("pyspark_rowtime").addHandler(handler)
    bare = reader(spark, location).withWatermark("rowtime", "1 second").groupBy("k").count()
    q = bare.writeStream.outputMode("update").format("noop")
    q = q.option("checkpointLocation", str(tmp_path / "ck")).start()
    try:
        problems = pr.check_query(q)
        # The listener runs on Spark's listener thread just after start(): a signal, no sleep.
        assert handler.seen.wait(timeout=60), "no warning was logged for the query"
    finally:
        q.stop()
        logging.getLogger("pyspark_rowtime").removeHandler(handler)
    assert len(problems) == 1 and "without pyspark_rowtime.with_watermark" in problems[0]
    assert any(
        "bound records (is_bound = true, null payload) reach the rest of the query" in m
        and "call pyspark_rowtime.with_watermark(df) directly" in m
        for m in handler.messages
    ), handler.messages

"""``time_interval_aggregate`` in real Spark (SPEC 10, seed 002), batch by batch.

Spark's output of every micro-batch is compared with a brute-force computation over the same
rows: the pure core's ``TimeIntervalWindow`` says which panes trigger at each batch's watermark
(read from the query's progress), and the aggregates are computed over each pane's rows the
obvious way. Queries are driven with ``processAllAvailable()`` or ``availableNow`` runs, one at
a time.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from helpers import LONG, batch_recorder, input_rows, observed, recorded_batches, start_writer
from pyspark.sql import functions as F

from pyspark_rowtime import time_interval_aggregate
from pyspark_rowtime.api import create_stream, open_writer, read_stream
from pyspark_rowtime.bounds.errors import OptionError
from pyspark_rowtime.bounds.panes import TimeIntervalSpec, TimeIntervalWindow
from pyspark_rowtime.streams.local.log import open_stream
from pyspark_rowtime.windows.aggregate import make_spec

S = 1_000_000
HOUR = 3600 * S
T0 = 1_700_000_000 * S - 1_700_000_000 * S % HOUR  # 2023-11-14T22:00:00Z
EPOCH = dt.datetime(1970, 1, 1)


def at(us: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=us)


def us(value: dt.datetime) -> int:
    """Microseconds of a TIMESTAMP collected from Spark (naive, in the session's UTC)."""
    return (value.replace(tzinfo=None) - EPOCH) // dt.timedelta(microseconds=1)


class Run:
    """A query over ``df`` into foreachBatch: its output and watermark, batch by batch."""

    def __init__(self, df: Any, checkpoint: Path, convert: Callable[[Any], tuple]) -> None:
        self.df, self.checkpoint, self.convert = df, checkpoint, convert
        self.given: dict[int, list[tuple]] | None = None
        self.batches = checkpoint.parent / f"{checkpoint.name}-batches"
        self.watermark_ms: dict[int, int] = {}
        self.input_rows: dict[int, int] = {}
        self.discarded = 0
        self.query: Any = None

    @property
    def out(self) -> dict[int, list[tuple]]:
        """Each batch's output (the last run of a batch id wins)."""
        if self.given is not None:
            return self.given
        return dict(recorded_batches(self.batches))

    @out.setter
    def out(self, value: dict[int, list[tuple]]) -> None:
        self.given = value

    def _writer(self) -> Any:
        # A file per batch: under Spark Connect the function runs in the server's Python.
        return self.df.writeStream.foreachBatch(batch_recorder(self.batches, self.convert)).option(
            "checkpointLocation", str(self.checkpoint)
        )

    def _progress(self, query: Any) -> None:
        for p in query.recentProgress:
            self.watermark_ms[p["batchId"]] = iso_ms(p["eventTime"]["watermark"])
            self.input_rows[p["batchId"]] = input_rows(p)
            metric = observed(p, "time_interval_aggregate")
            if metric is not None:
                self.discarded += metric["discarded_rows"]

    def start(self) -> None:
        self.query = start_writer(self._writer())

    def settle(self) -> None:
        self.query.processAllAvailable()

    def stop(self) -> None:
        self.query.stop()
        self._progress(self.query)

    def available_now(self) -> list[int]:
        """Run once over what is available (a restart from the checkpoint); its batch ids."""
        before = set(self.watermark_ms)
        query = start_writer(self._writer().trigger(availableNow=True))
        query.awaitTermination()
        self._progress(query)
        return sorted(set(self.watermark_ms) - before)


def iso_ms(text: str) -> int:
    t = dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ")
    return (t - EPOCH) // dt.timedelta(milliseconds=1)


def reference(
    spec: TimeIntervalSpec,
    watermark_ms: dict[int, int],
    rows_at: dict[int, list[tuple[int, str, dict]]],
    aggregate: Callable[[list[tuple[int, dict]]], tuple],
) -> tuple[dict[int, Counter], int]:
    """Brute force: per batch, the core windows (one per key) advance to the batch's watermark
    when it moved and emit, then take the rows that batch read (``rows_at[-1]``: before the
    first batch). A pane's output is (key, start, end, *aggregate(its rows)); also the rows the
    windows ignored (too late, or in no pane)."""
    windows: dict[str, TimeIntervalWindow] = {}

    def insert(rows: list[tuple[int, str, dict]]) -> None:
        for t, key, row in rows:
            windows.setdefault(key, TimeIntervalWindow(spec)).insert(t, row)

    insert(rows_at.get(-1, []))
    expected: dict[int, Counter] = {}
    last = None
    for b in sorted(watermark_ms):
        w = watermark_ms[b]
        emitted: Counter = Counter()
        if last is None or w > last:
            for key, window in windows.items():
                for pane in window.advance_watermark(w * 1000):
                    emitted[(key, pane.start_us, pane.end_us, *aggregate(list(pane.rows)))] += 1
            last = w
        expected[b] = emitted
        insert(rows_at.get(b, []))
    return expected, sum(w.ignored_count for w in windows.values())


def assert_batches(run: Run, expected: dict[int, Counter]) -> None:
    assert run.watermark_ms, "no batch ran"
    for b in sorted(run.watermark_ms):
        assert Counter(run.out.get(b, [])) == expected[b], f"batch {b}"
    assert sum(len(v) for v in run.out.values()) > 0


# -- the seed's traffic example ------------------------------------------------------------------

TRAFFIC = "freeway STRING, lane INT, laneFlow DOUBLE"


def traffic_rows(first: int, n: int, start_us: int) -> list[tuple[int, str, dict]]:
    """n readings 7 s apart from ``start_us`` on, alternating freeways, distinct flows."""
    rows = []
    for i in range(first, first + n):
        t = start_us + (i - first) * 7 * S
        flow = float((i * 37) % 101) + i / 1000  # distinct: ArgMax has no ties
        rows.append((t, f"I-{5 + 400 * (i % 2)}", {"lane": i % 4, "laneFlow": flow}))
    return rows


def traffic_query(spark: Any, src: Path) -> Any:
    df = spark.readStream.format("rowtime").load(str(src))
    return time_interval_aggregate(
        df,
        [
            F.max_by("lane", "laneFlow").alias("lane"),
            F.max_by("rowtime", "laneFlow").alias("eventtime"),
            F.max("laneFlow").alias("laneFlow"),
        ],
        interval_duration=50.0,
        creation_period="25 seconds",
        discard_age=1000.0,
        interval_offset=0.0,
        partition_by="freeway",
    )


def traffic_convert(r: Any) -> tuple:
    return (r.freeway, us(r.interval_start), us(r.interval_end), r.lane, us(r.eventtime),
            r.laneFlow, us(r.rowtime))  # fmt: skip


def traffic_brute(rows: list[tuple[int, dict]]) -> tuple:
    t, top = max(rows, key=lambda r: r[1]["laneFlow"])
    return top["lane"], t, top["laneFlow"]


def write(w: Any, rows: list[tuple[int, str, dict]]) -> None:
    for t, key, row in rows:
        w.insert({"freeway": key, **row}, rowtime=at(t))


def run_traffic(spark: Any, workdir: Path, name: str, restart_after: int | None) -> Run:
    src = workdir / f"src-{name}"
    create_stream(src, TRAFFIC)
    run = Run(traffic_query(spark, src), workdir / f"ck-{name}", traffic_convert)
    rows: list[tuple[int, str, dict]] = []
    run.start()
    with open_writer(src) as w:
        for step in range(4):
            burst = traffic_rows(step * 20, 20, T0 + step * 140 * S)
            write(w, burst)
            rows += burst
            w.flush()
            run.settle()
            if step == restart_after:
                run.stop()
                run.start()
        # quiet: only bounds, until every pane has ended
        last = max(t for t, _, _ in rows)
        w.set_rowtime_bound(at(last + 51 * S))
        w.flush()
        run.settle()
    run.stop()
    spec = make_spec(50.0, 25.0, 1000.0, 0.0)
    expected, ignored = reference(spec, run.watermark_ms, {-1: rows}, traffic_brute)
    assert all(r[-1] == r[2] for out in run.out.values() for r in out)  # rowtime = interval_end
    assert_batches(_with(run, {b: [r[:-1] for r in out] for b, out in run.out.items()}), expected)
    # every pane that has rows was emitted exactly once
    assert Counter(r[:3] for out in run.out.values() for r in out) == Counter(
        {(key, s, e): 1 for t, key, _ in rows for s, e in _panes(spec, t)}
    )
    assert run.discarded == ignored == 0
    return run


def _with(run: Run, out: dict[int, list[tuple]]) -> Run:
    copy = Run.__new__(Run)
    copy.__dict__.update(run.__dict__)
    copy.out = out
    return copy


def _panes(spec: TimeIntervalSpec, t: int) -> list[tuple[int, int]]:
    from pyspark_rowtime.bounds.panes import assign_panes

    return assign_panes(t, spec)


@pytest.mark.spark_subset
def test_traffic_example_max_flow_per_freeway_over_sliding_panes(spark, workdir):
    run_traffic(spark, workdir, "traffic", restart_after=None)


@pytest.mark.spark_subset
def test_a_restart_from_the_checkpoint_gives_the_uninterrupted_output(spark, workdir):
    """The restarted run against brute force (run_traffic checks every pane of every batch),
    which the uninterrupted run above is checked against too; ``./dev long`` also runs the
    uninterrupted one here and compares the two runs' rows, as stop_points does elsewhere."""
    restarted = run_traffic(spark, workdir, "restarted", restart_after=1)
    if LONG:
        whole = run_traffic(spark, workdir, "whole", restart_after=None)
        everything = lambda run: Counter(r for out in run.out.values() for r in out)  # noqa: E731
        assert everything(restarted) == everything(whole)


# -- the offset example: [00:20, 01:20) ----------------------------------------------------------


def test_offset_example_hours_starting_twenty_minutes_past(spark, workdir):
    src = workdir / "src"
    create_stream(src, "id BIGINT, amount DOUBLE")
    df = spark.readStream.format("rowtime").load(str(src))
    out = time_interval_aggregate(
        df,
        [F.count("*").alias("n"), F.sum("amount").alias("total")],
        interval_duration=3600.0,
        interval_offset="20 minutes",
    )
    run = Run(out, workdir / "ck", lambda r: ("", us(r.interval_start), us(r.interval_end),
                                              r.n, r.total))  # fmt: skip
    rows = []
    run.start()
    with open_writer(src) as w:
        for i in range(40):  # one row every 11 minutes, over 7 hours
            t = T0 + i * 11 * 60 * S
            w.insert({"id": i, "amount": float(i)}, rowtime=at(t))
            rows.append((t, "", {"amount": float(i)}))
            if i % 10 == 9:
                w.flush()
                run.settle()
        w.set_rowtime_bound(at(T0 + 9 * HOUR))
        w.flush()
        run.settle()
    run.stop()
    spec = make_spec(3600.0, interval_offset=1200.0)

    def brute(pane: list[tuple[int, dict]]) -> tuple:
        return len(pane), sum(r["amount"] for _, r in pane)

    expected, ignored = reference(spec, run.watermark_ms, {-1: rows}, brute)
    assert_batches(run, expected)
    assert run.discarded == ignored == 0
    starts = sorted(r[1] for v in run.out.values() for r in v)
    assert all((s - T0) % HOUR == 20 * 60 * S for s in starts)  # [hh:20, hh+1:20)
    assert starts[0] == T0 - 40 * 60 * S  # the first row (22:00) is in [21:20, 22:20)


# -- late rows: re-trigger until discardAge, then counted ----------------------------------------


def test_late_rows_re_trigger_their_pane_until_discard_age_then_are_counted(spark, workdir):
    """Two streams unioned: B lags behind A, so its rows come after A's bounds moved the
    watermark past their panes. Each step is an availableNow run: a restart from the
    checkpoint, whose first batch reads exactly that step's rows."""
    a_src, b_src = workdir / "a", workdir / "b"
    for src in (a_src, b_src):
        create_stream(src, "id BIGINT, v DOUBLE")
    union = (
        spark.readStream.format("rowtime")
        .load(str(a_src))
        .unionByName(spark.readStream.format("rowtime").load(str(b_src)))
    )
    out = time_interval_aggregate(
        union,
        [F.count("v").alias("n"), F.sum("v").alias("total"), F.max_by("id", "v").alias("top")],
        interval_duration="10 seconds",
        discard_age=20,
    )
    run = Run(out, workdir / "ck", lambda r: ("", us(r.interval_start), us(r.interval_end),
                                              r.n, r.total, r.top))  # fmt: skip
    ids = iter(range(1000))
    # per step: rows of A, bound of A, rows of B, bound of B (seconds after T0)
    steps = [
        ([1, 2, 5], 12, [], None),
        ([13, 14], 15, [3], 4),  # B's 3 s is late for [0, 10): re-triggers it
        ([], 35, [], None),  # watermark 35 s > 10 + 20: [0, 10) closes
        ([36], 40, [6, 21], 22),  # 6 s: discarded; 21 s: re-triggers [20, 30)
        ([], 60, [], 60),
    ]
    rows_at: dict[int, list] = {}
    with open_writer(a_src) as wa, open_writer(b_src) as wb:
        for a_rows, a_bound, b_rows, b_bound in steps:
            step_rows = []
            for w, times, bound in ((wa, a_rows, a_bound), (wb, b_rows, b_bound)):
                for s in times:
                    i = next(ids)
                    w.insert({"id": i, "v": float(i * 3 % 7) + i / 100}, rowtime=at(T0 + s * S))
                    step_rows.append((T0 + s * S, "", {"id": i, "v": float(i * 3 % 7) + i / 100}))
                if bound is not None:
                    w.set_rowtime_bound(at(T0 + bound * S))
                w.flush()
            batches = run.available_now()
            assert batches, "the run ran no batch"
            # the run's first batch read every row of the step, no later batch read any
            assert run.input_rows[batches[0]] >= len(step_rows)
            assert all(run.input_rows[b] == 0 for b in batches[1:])
            rows_at[batches[0]] = step_rows
    spec = make_spec(10, discard_age=20)

    def brute(pane: list[tuple[int, dict]]) -> tuple:
        top = max(pane, key=lambda r: r[1]["v"])[1]["id"]
        return len(pane), sum(r["v"] for _, r in pane), top

    expected, ignored = reference(spec, run.watermark_ms, rows_at, brute)
    assert_batches(run, expected)
    emitted = Counter(r[1] - T0 for out in run.out.values() for r in out)
    assert emitted[0] == 2  # [0, 10): once, then once more, corrected, with B's late row
    assert emitted[10 * S] == emitted[20 * S] == emitted[30 * S] == 1
    assert run.discarded == ignored == 1  # B's row at 6 s, after [0, 10) closed


# -- bounds through windows, end to end: the rowtime sink's clock --------------------------------


def test_sink_clock_covers_exactly_the_emitted_panes_when_only_bounds_follow(spark, workdir):
    src, target = workdir / "src", workdir / "out"
    create_stream(src, TRAFFIC)
    query = (
        traffic_query(spark, src)
        .writeStream.format("rowtime")
        .option("checkpointLocation", str(workdir / "ck"))
        .start(str(target))
    )
    spec = make_spec(50.0, 25.0, 1000.0, 0.0)

    def written() -> set[tuple[str, int]]:
        if not target.exists():
            return set()
        t = read_stream(target)
        t = t.filter(pa.compute.invert(t.column("is_bound")))
        ends = t.column("rowtime").cast(pa.int64()).to_pylist()
        return set(zip(t.column("freeway").to_pylist(), ends, strict=True))

    def clock() -> int | None:
        return open_stream(target).stream_clock_us() if target.exists() else None

    rows = traffic_rows(0, 30, T0)
    panes = {(key, e) for t, key, _ in rows for _, e in _panes(spec, t)}
    last_end = max(e for _, e in panes)
    with open_writer(src) as w:
        write(w, rows)  # the burst
        w.flush()
        query.processAllAvailable()
        c = clock()
        assert c is not None and c < last_end  # the last pane is still open
        assert written() == {p for p in panes if p[1] <= c}
        # the source goes quiet: bounds only, no row
        for bound in (last_end - 10 * S, last_end + 2_000):
            w.set_rowtime_bound(at(bound))
            w.flush()
            query.processAllAvailable()
            c = clock()
            assert c is not None
            assert written() == {p for p in panes if p[1] <= c}  # all it covers, no more
    query.stop()
    assert c >= last_end  # the last pane appeared and the clock passed it without a new row
    assert written() == panes


# -- parameters are checked before any query starts ----------------------------------------------


@pytest.mark.connect("the refusals are raised in the client, before a plan is sent")
def test_invalid_parameters_and_aggregates_fail_before_a_query_starts(spark, workdir):
    create_stream(workdir / "src", TRAFFIC)
    df = spark.readStream.format("rowtime").load(str(workdir / "src"))
    ok = [F.max("laneFlow")]
    cases = [
        (dict(aggs=ok, interval_duration=0), "interval_duration=0"),
        (dict(aggs=ok, interval_duration=10, creation_period=-1), "creation_period=-1"),
        (dict(aggs=ok, interval_duration=10, discard_age=-2), "discard_age=-2"),
        (dict(aggs=ok, interval_duration=10, interval_offset=10), "interval_offset=10"),
        (dict(aggs=[F.col("laneFlow")], interval_duration=10), "is not an aggregate"),
        (dict(aggs=[F.collect_list("lane")], interval_duration=10), "is not an aggregate the"),
        (dict(aggs=[F.count_distinct("lane")], interval_duration=10), "DISTINCT"),
        (dict(aggs=[F.max("nope")], interval_duration=10), "is not an aggregate"),
        (dict(aggs=ok, interval_duration=10, partition_by="nope"), "partition_by='nope'"),
    ]
    for kwargs, message in cases:
        with pytest.raises(OptionError) as e:
            time_interval_aggregate(df, **kwargs)
        assert message in str(e.value), kwargs
    assert not spark.streams.active

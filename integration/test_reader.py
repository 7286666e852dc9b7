"""The Spark reader (SPEC 7) against real Spark: options, output, batch invariants, the SDP
examples, discarded rows, watermarks and replay from a checkpoint.

Every test writes a real stream with the adapter API, runs a real query on the session's
``local[2]`` Spark and drives it to quiescence with ``processAllAvailable()`` or
``trigger(availableNow=True)``; nothing sleeps and nothing is mocked. Micro-batches are
collected with ``foreachBatch`` (rowtimes as integer microseconds, so the Python process's
time zone never matters) and checked against what the SPEC says, computed independently from
the log where that is possible.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    BASE_US,
    SDP_INPUT,
    SDP_TABLE,
    US,
    Run,
    at,
    batch_reader,
    check_batches,
    drain,
    dropped_by_watermark,
    forget_commit,
    jittered_rows,
    names_and_rowtimes,
    plain,
    reader,
    run_available_now,
    start,
    start_append,
    write_rows,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, TimestampType

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US

#: The reader's output tests over Redis and S3 run in ./dev long only (integration/conftest.py).
REMOTE_IN_LONG = pytest.mark.long_cases(
    "redis",
    "s3",
    why=(
        "the reader computes this the same over any backend; the backend's part is "
        "tests/test_storage_contract.py's on all four, and its restart, checksum and "
        "skewed-partition tests run on Redis and S3 in CI"
    ),
)


# -- 2. options ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_stream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    location = tmp_path_factory.mktemp("options") / "orders"
    pr.create_stream(str(location), "id INT, name STRING, ts STRING")
    write_rows(location, 0, [({"id": 1, "name": "a", "ts": "x"}, BASE_US)], bound_us=BASE_US + US)
    return location


BAD_OPTIONS = [
    pytest.param({"ordr": "drop"}, ["unknown option 'ordr'", "accepts", "order"], id="unknown"),
    pytest.param({"order": "sort"}, ["order='sort'", "reject, drop or adjust"], id="order"),
    pytest.param(
        {"order": "adjust", "adjust.range": "-1"},
        ["adjust.range='-1'", "a whole number >= 0 of adjust.unit"],
        id="range-negative",
    ),
    pytest.param(
        {"order": "adjust", "adjust.range": "one"},
        ["adjust.range='one'", "a whole number >= 0"],
        id="range-type",
    ),
    pytest.param(
        {"order": "adjust", "adjust.unit": "minute"},
        ["adjust.unit='minute'", "sec, msec or usec"],
        id="adjust-unit",
    ),
    pytest.param(
        {"order": "adjust", "adjust.maxHeld": "0"},
        ["adjust.maxHeld='0'", "whole number of rows > 0"],
        id="max-held",
    ),
    pytest.param(
        {"maxRowsPerBatch": "0"}, ["maxRowsPerBatch='0'", "whole number of records > 0"], id="rows"
    ),
    pytest.param(
        {"maxRowsPerBatch": 1.5}, ["maxRowsPerBatch='1.5'", "whole number of records"], id="rows-t"
    ),
    pytest.param(
        {"rowtime.column": "nope"},
        ["rowtime.column='nope'", "names no payload column", "id, name, ts"],
        id="rowtime-column",
    ),
    pytest.param(
        {"order": "drop", "adjust.unit": "sec"},
        ["adjust.unit only applies with order=adjust", "order=drop"],
        id="adjust-without-adjust",
    ),
    pytest.param(
        {"rowtime.unit": "s"}, ["rowtime.unit", "rowtime.column is not set"], id="unit-alone"
    ),
    pytest.param(
        {"rowtime.column": "ts", "rowtime.unit": "minutes"},
        ["rowtime.unit='minutes'", "s, ms, us or ns"],
        id="rowtime-unit",
    ),
    pytest.param(
        {"rowtime.column": "ts", "rowtime.timezone": "Mars/Olympus"},
        ["rowtime.timezone='Mars/Olympus'"],
        id="timezone",
    ),
    pytest.param(
        {"startingOffsets": "middle"},
        ["startingOffsets='middle'", "earliest (default) or latest"],
        id="starting",
    ),
    pytest.param({"output": "all"}, ["output='all'", "rows (default) or discarded"], id="output"),
    pytest.param(
        {"endingOffsets": "soon"},
        ["endingOffsets='soon'", "clock (default) or latest"],
        id="ending",
    ),
]


def error_text(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    return str(excinfo.value)


@pytest.mark.spark_subset
@pytest.mark.parametrize(("options", "fragments"), BAD_OPTIONS)
def test_bad_option_fails_at_load_naming_the_option_and_what_it_accepts(
    spark: SparkSession, small_stream: Path, options: dict[str, Any], fragments: list[str]
) -> None:
    with pytest.raises(Exception) as excinfo:
        reader(spark, small_stream, **options)
    text = error_text(excinfo)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in: {text}"


def test_batch_read_checks_options_the_same_way(spark: SparkSession, small_stream: Path) -> None:
    with pytest.raises(Exception) as excinfo:
        batch_reader(spark, small_stream, order="adjust", **{"adjust.range": "-1"})
    assert "adjust.range='-1'" in error_text(excinfo)


def test_missing_path_fails_at_load_naming_option_path(spark: SparkSession) -> None:
    with pytest.raises(Exception) as excinfo:
        spark.readStream.format("rowtime").load()
    assert "option path is required" in error_text(excinfo)
    with pytest.raises(Exception) as excinfo:
        spark.read.format("rowtime").option("order", "drop").load()
    assert "option path is required" in error_text(excinfo)


def test_path_with_no_stream_fails_at_load_naming_the_path(
    spark: SparkSession, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-stream"
    with pytest.raises(Exception) as excinfo:
        reader(spark, missing)
    text = error_text(excinfo)
    assert str(missing) in text and "create_stream" in text, text


def test_output_discarded_on_a_streaming_read_fails_at_start(
    spark: SparkSession, small_stream: Path, tmp_path: Path
) -> None:
    with pytest.raises(Exception) as excinfo:
        df = reader(spark, small_stream, output="discarded")
        q = start(df, tmp_path / "ck", Run())
        try:
            q.processAllAvailable()
        finally:
            q.stop()
    assert "output=discarded is for batch reads" in error_text(excinfo)


# -- 3. output -----------------------------------------------------------------------------------


@REMOTE_IN_LONG
@pytest.mark.spark_subset
def test_output_is_payload_then_rowtime_and_is_bound_with_null_payload_on_bounds(
    spark: SparkSession, tmp_path: Path, stream_at: Callable[[str], str]
) -> None:
    location = stream_at("s")
    pr.create_stream(location, "id INT, name STRING")
    write_rows(location, 0, [({"id": 1, "name": "a"}, BASE_US)], bound_us=BASE_US + 5 * US)

    df = reader(spark, location)
    assert [(f.name, f.dataType) for f in df.schema.fields][2:] == [
        ("rowtime", TimestampType()),
        ("is_bound", BooleanType()),
    ]
    assert df.columns == ["id", "name", "rowtime", "is_bound"]
    assert batch_reader(spark, location).schema == df.schema

    run = run_available_now(df, tmp_path / "ck")
    assert run.records == [
        {"id": 1, "name": "a", "is_bound": False, "rowtime": BASE_US},
        {"id": None, "name": None, "is_bound": True, "rowtime": BASE_US + 5 * US},
    ]
    assert plain(batch_reader(spark, location)) == run.records


@pytest.mark.parametrize("column", ["rowtime", "IS_BOUND", "RowTime"])
def test_a_payload_column_named_like_an_added_column_is_refused(
    spark: SparkSession, tmp_path: Path, column: str
) -> None:
    with pytest.raises(pr.RowtimeError) as excinfo:
        pr.create_stream(str(tmp_path / "s"), f"id INT, {column} STRING")
    assert f"payload column {column!r} clashes" in str(excinfo.value)
    assert "rename the column" in str(excinfo.value)


def test_a_stream_whose_metadata_has_a_clashing_column_fails_at_load_naming_both(
    spark: SparkSession, tmp_path: Path
) -> None:
    # A stream written by another tool that did not check names: the reader must refuse it.
    import pyarrow as pa

    from pyspark_rowtime.streams.meta import StreamMeta, write_meta_once

    location = tmp_path / "foreign"
    (location / "partition-0000").mkdir(parents=True)
    schema = pa.schema([pa.field("id", pa.int32()), pa.field("Is_Bound", pa.string())])
    assert write_meta_once(StreamMeta(str(location), schema, 1))
    with pytest.raises(Exception) as excinfo:
        reader(spark, location)
    text = error_text(excinfo)
    assert "payload column 'Is_Bound' clashes with the column 'is_bound'" in text, text


# -- 4. the SDP examples (SPEC 11) under order=adjust --------------------------------------------


def sdp_stream(location: Path | str, **defaults: Any) -> Path | str:
    """The five tuples of seed 000 in arrival order (explicit SDP rowtimes), then end of
    stream; one segment per tuple so that maxRowsPerBatch can split anywhere."""
    pr.create_stream(str(location), "name STRING", **defaults)
    with pr.open_writer(str(location), 0) as w:
        for name, sdp in SDP_INPUT:
            w.insert({"name": name}, rowtime=sdp)
            w.flush()
        w.end_stream()
    return location


@REMOTE_IN_LONG
@pytest.mark.parametrize(("unit", "range_"), list(SDP_TABLE))
def test_sdp_examples_come_out_of_spark_as_the_spec_table_says(
    spark: SparkSession, tmp_path: Path, unit: str, range_: int, stream_at: Callable[[str], str]
) -> None:
    rows, discarded = SDP_TABLE[(unit, range_)]
    location = sdp_stream(stream_at("sdp"))
    options = {"order": "adjust", "adjust.unit": unit, "adjust.range": range_}

    # Two records per micro-batch: held rows cross batch boundaries, carried by the offsets.
    run = run_available_now(reader(spark, location, maxRowsPerBatch=2, **options), tmp_path / "ck")
    check_batches(run)
    assert names_and_rowtimes(run.records) == rows
    assert run.bounds[-1] == END_OF_STREAM_US
    last = run.batches[-1][0]
    assert run.end_offset(last)["partitions"]["0"]["discarded"] == len(discarded)

    # The whole history in one batch read gives the same rows, then the end-of-stream bound.
    history = plain(batch_reader(spark, location, **options))
    assert names_and_rowtimes(history) == rows
    assert [r["rowtime"] for r in history if r["is_bound"]] == [END_OF_STREAM_US]

    quarantine = plain(batch_reader(spark, location, output="discarded", **options))
    assert [(r["name"], r["offset"], r["rowtime"], r["clock"]) for r in quarantine] == discarded
    for r in quarantine:
        assert r["partition"] == 0 and r["reason"] == "below_adjust_range"
        assert r["arrival"] is not None


@pytest.mark.spark_subset
def test_stream_defaults_set_the_policy_and_options_override_them(
    spark: SparkSession, tmp_path: Path
) -> None:
    location = sdp_stream(tmp_path / "sdp", order="adjust", adjust_unit="sec", adjust_range=1)
    expected, _ = SDP_TABLE[("sec", 1)]
    run = run_available_now(reader(spark, location), tmp_path / "ck")
    assert names_and_rowtimes(run.records) == expected
    assert names_and_rowtimes(plain(batch_reader(spark, location))) == expected

    # An option overrides one default; the others still come from the stream.
    overridden, _ = SDP_TABLE[("sec", 0)]
    history = plain(batch_reader(spark, location, **{"adjust.range": 0}))
    assert names_and_rowtimes(history) == overridden

    # order=reject on this stream: B goes back in time, and the query says where.
    q = start(reader(spark, location, order="reject"), tmp_path / "ck-reject", Run())
    with pytest.raises(Exception) as excinfo:
        q.processAllAvailable()
    q.stop()
    text = error_text(excinfo)
    assert f"stream {str(location)!r} partition 0, offset 1" in text, text
    assert "order=reject forbids rows that go back in time" in text


# -- 4. batch invariants with partitions at different speeds -------------------------------------


def partition_clocks(location: Path | str) -> dict[int, list[int | None]]:
    """Independently of the reader: each partition's clock after each prefix of its records
    (``clocks[p][n]`` after ``n`` records) under ``reject``: the highest rowtime or bound."""
    log = pr.read_stream(str(location)).to_pylist()
    out: dict[int, list[int | None]] = {}
    for r in log:
        clocks = out.setdefault(r["partition"], [None])
        t = int(r["rowtime"].timestamp() * US) if r["rowtime"].year < 9999 else END_OF_STREAM_US
        # timestamp() loses nothing here: these rowtimes are whole milliseconds.
        prev = clocks[-1]
        clocks.append(t if prev is None else max(prev, t))
    return out


@pytest.mark.long_cases(
    "redis",
    "s3",
    why="the skew is aligned above the store (datasource/), the same code whatever the backend; "
    "this file's restart and damaged-value tests run the reader over Redis and S3, and "
    "tests/test_storage_contract.py holds the stores to the folder's behaviour",
)
def test_every_micro_batch_keeps_the_spec_7_invariants_with_skewed_partitions(
    spark: SparkSession, tmp_path: Path, stream_at: Callable[[str], str]
) -> None:
    location = stream_at("skewed")
    pr.create_stream(location, "p INT, i INT", partitions=3)
    step_ms = {0: 1000, 1: 3000, 2: 500}  # partition 1 is slow, 2 is fast
    written: dict[int, int] = {0: 0, 1: 0, 2: 0}

    def rows(p: int, n: int, base_us: int = BASE_US) -> list[tuple[dict[str, Any], int]]:
        first = written[p]
        written[p] += n
        return [
            ({"p": p, "i": i}, base_us + i * step_ms[p] * 1000) for i in range(first, first + n)
        ]

    run = Run()
    q = start(reader(spark, location, maxRowsPerBatch=5), tmp_path / "ck", run)
    try:
        for p, n in ((0, 5), (1, 2), (2, 6)):  # round 1: everyone, at their own speed
            write_rows(location, p, rows(p, n))
        drain(q, run)
        for p, n in ((0, 3), (2, 6)):  # round 2: the slow partition is quiet; rows wait
            write_rows(location, p, rows(p, n))
        drain(q, run)
        write_rows(location, 1, rows(1, 3))  # round 3: it catches up
        drain(q, run)
        high = BASE_US + 60 * US
        for p in range(3):  # round 4: bounds past every row release everything
            write_rows(location, p, [], bound_us=high)
        drain(q, run)
        for p in range(3):  # round 5: only bounds: a batch with only a bound record
            write_rows(location, p, [], bound_us=high + 10 * US)
        drain(q, run)
        write_rows(location, 2, rows(2, 2, high + 20 * US))  # round 6: one ahead, clock still
        drain(q, run)
        for p in range(3):
            write_rows(location, p, [], end=True)
        drain(q, run)
    finally:
        q.stop()

    check_batches(run)
    assert len(run.batches) >= 8, [b for b, _ in run.batches]

    # The bound of each batch is the stream clock its end offset implies, computed here from
    # the log; exactly one bound record when it advanced, none otherwise.
    clocks = partition_clocks(location)
    before: int | None = None
    for batch_id, records in run.batches:
        end = run.end_offset(batch_id)
        nexts = [end["partitions"][str(p)]["next"] for p in range(3)]
        per_partition = [clocks.get(p, [None])[n] for p, n in enumerate(nexts)]
        expected = None if None in per_partition else min(per_partition)  # type: ignore[type-var]
        assert end["clock"] == expected, (batch_id, end, expected)
        bounds = [r["rowtime"] for r in records if r["is_bound"]]
        if expected is not None and (before is None or expected > before):
            assert bounds == [expected], (batch_id, bounds, expected)
        else:
            assert bounds == [], (batch_id, bounds)
        before = expected
    assert run.bounds[-1] == END_OF_STREAM_US

    # Every row exactly once, each partition's rows in rowtime order across batches.
    out = [(r["p"], r["i"]) for r in run.rows]
    assert sorted(out) == [(p, i) for p in range(3) for i in range(written[p])]
    for p in range(3):
        assert [i for q_, i in out if q_ == p] == list(range(written[p]))

    # A batch with nothing but a bound record (round 5), and rows that waited for the slow
    # partition: emitted in a later batch than the one that first read them.
    assert any(len(recs) == 1 and recs[0]["is_bound"] for _, recs in run.batches)
    first_read: dict[tuple[int, int], int] = {}
    for batch_id, _ in run.batches:
        end = run.end_offset(batch_id)
        for p in range(3):
            for i in range(end["partitions"][str(p)]["next"]):
                first_read.setdefault((p, i), batch_id)
    emitted = {(r["p"], r["i"]): b for b, recs in run.batches for r in recs if not r["is_bound"]}
    waited = [k for k, b in emitted.items() if first_read[k] < b]
    assert len(waited) >= 3, waited


# -- 5. watermarks -------------------------------------------------------------------------------


def windowed_counts(df: DataFrame, size: str = "10 seconds") -> DataFrame:
    w = df.groupBy(F.window("rowtime", size)).count()
    return w.select(F.col("window.start").alias("start"), F.col("window.end").alias("end"), "count")


@REMOTE_IN_LONG
@pytest.mark.spark_subset
def test_a_bound_alone_closes_a_window_in_append_mode(
    spark: SparkSession, tmp_path: Path, stream_at: Callable[[str], str]
) -> None:
    location = stream_at("s")
    pr.create_stream(location, "id INT")
    run = Run()
    q = start_append(
        windowed_counts(pr.with_watermark(reader(spark, location))), tmp_path / "ck", run
    )
    try:
        rows = [({"id": i}, BASE_US + t * US) for i, t in enumerate((1, 2, 5))]
        write_rows(location, 0, rows)
        drain(q, run)
        assert [r for _, recs in run.batches for r in recs] == []  # the window is still open
        # No data follows, only a bound past the window's end. Spark applies a watermark one
        # batch after it learns it, hence two rounds (the second is a no-data batch).
        write_rows(location, 0, [], bound_us=BASE_US + 11 * US)
        drain(q, run)
        drain(q, run)
    finally:
        q.stop()
    out = [r for _, recs in run.batches for r in recs]
    assert out == [{"start": BASE_US, "end": BASE_US + 10 * US, "count": 3}]


def test_a_row_at_the_last_bound_is_not_late(spark: SparkSession, tmp_path: Path) -> None:
    """Spark drops rows at or below its watermark, which it keeps in whole milliseconds; the
    helper's minimum delay keeps a row exactly at the last bound. Beside it, Spark's own
    ``withWatermark`` with no delay drops that row: the reason the helper sets one."""
    location = tmp_path / "s"
    pr.create_stream(str(location), "id INT")
    source = reader(spark, location)
    helper, bare = Run(), Run()
    # The helper's own filter (it keeps the bounds above the watermark), without its delay.
    data_rows = F.when(F.col("rowtime").isNotNull(), ~F.col("is_bound")).otherwise(False)
    raw = source.withWatermark("rowtime", "0 seconds").where(data_rows)
    queries = [
        start_append(pr.with_watermark(source).groupBy("rowtime").count(), tmp_path / "a", helper),
        start_append(raw.groupBy("rowtime").count(), tmp_path / "b", bare),
    ]
    try:
        bound = BASE_US + 10 * US
        write_rows(location, 0, [({"id": 1}, BASE_US + US)], bound_us=bound)
        for q, run in zip(queries, (helper, bare), strict=True):
            drain(q, run)
        write_rows(location, 0, [({"id": 2}, bound)])  # exactly at the bound: allowed
        write_rows(location, 0, [], bound_us=bound + 10 * US)
        for q, run in zip(queries, (helper, bare), strict=True):
            drain(q, run)
            drain(q, run)
    finally:
        for q in queries:
            q.stop()
    counted = {r["rowtime"]: r["count"] for _, recs in helper.batches for r in recs}
    assert counted == {BASE_US + US: 1, bound: 1}
    assert dropped_by_watermark(helper) == 0
    assert dropped_by_watermark(bare) == 1
    assert {r["rowtime"] for _, recs in bare.batches for r in recs} == {BASE_US + US}


def test_skewed_partitions_lose_no_row_to_the_watermark(
    spark: SparkSession, tmp_path: Path
) -> None:
    location = tmp_path / "s"
    pr.create_stream(str(location), "p INT, i INT", partitions=2)
    ahead_us = 5 * 60 * US  # partition 1 runs five minutes ahead of partition 0
    per_round, rounds = 20, 3
    run = Run()
    df = pr.with_watermark(reader(spark, location, maxRowsPerBatch=per_round))
    q = start_append(windowed_counts(df, "1 minute"), tmp_path / "ck", run)
    expected: dict[int, int] = {}
    try:
        for r in range(rounds):
            for p in range(2):
                rows = []
                for i in range(r * per_round, (r + 1) * per_round):
                    t = BASE_US + p * ahead_us + i * 10 * US
                    rows.append(({"p": p, "i": i}, t))
                    start_ = t - (t % (60 * US))
                    expected[start_] = expected.get(start_, 0) + 1
                write_rows(location, p, rows)
            drain(q, run)
        for p in range(2):
            write_rows(location, p, [], end=True)
        drain(q, run)
        drain(q, run)
    finally:
        q.stop()
    # maxRowsPerBatch admits at most half a round's records per micro-batch
    assert len([p for p in run.progress if "addBatch" in p["durationMs"]]) >= 2 * rounds
    assert dropped_by_watermark(run) == 0
    got = {r["start"]: r["count"] for _, recs in run.batches for r in recs}
    assert got == expected
    assert sum(got.values()) == 2 * rounds * per_round


def optimized_plan(query: Any) -> str:
    """The optimized logical plan of the query's last micro-batch (what ``explain(True)``
    prints)."""
    text = query._jsq.explainInternal(True)
    start_ = text.index("== Optimized Logical Plan ==")
    return text[start_ : text.index("== Physical Plan ==")]


def test_a_plain_filter_on_is_bound_is_pushed_below_the_watermark_and_freezes_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Why ``with_watermark`` exists: ``withWatermark(...).where(~is_bound)`` looks right, but
    Spark's optimizer pushes the filter below the watermark node, so bound records never reach
    it and a quiet source never closes a window. The helper's predicate references
    ``rowtime`` and stays above."""
    location = tmp_path / "s"
    pr.create_stream(str(location), "id INT")
    source = reader(spark, location)
    naive = source.withWatermark("rowtime", "1 millisecond").where(~F.col("is_bound"))
    helper, plain_run = Run(), Run()
    queries = [
        (start_append(windowed_counts(pr.with_watermark(source)), tmp_path / "a", helper), helper),
        (start_append(windowed_counts(naive), tmp_path / "b", plain_run), plain_run),
    ]
    try:
        write_rows(location, 0, [({"id": 1}, BASE_US + US)])
        for q, run in queries:
            drain(q, run)
        write_rows(location, 0, [], bound_us=BASE_US + 30 * US)
        for q, run in queries:
            drain(q, run)
            drain(q, run)
        plans = [optimized_plan(q) for q, _ in queries]
        watermarks = [q.lastProgress["eventTime"]["watermark"] for q, _ in queries]
    finally:
        for q, _ in queries:
            q.stop()
    window = {"start": BASE_US, "end": BASE_US + 10 * US, "count": 1}
    assert [r for _, recs in helper.batches for r in recs] == [window]
    assert [r for _, recs in plain_run.batches for r in recs] == []
    assert watermarks == ["2023-11-14T22:13:49.999Z", "2023-11-14T22:13:20.999Z"]

    def below_watermark(plan: str) -> str:
        return plan[plan.index("EventTimeWatermark") :]

    assert "is_bound" in below_watermark(plans[1]) and "Filter" in below_watermark(plans[1])
    assert "Filter" not in below_watermark(plans[0])


# -- 7. discarded rows: counted in the offsets, readable as the quarantine -----------------------


def ms(seconds: float) -> int:
    return BASE_US + round(seconds * 1000) * 1000


def late_stream(location: Path) -> Path:
    """Two partitions with late rows: below the running maximum, and below a writer bound."""
    pr.create_stream(str(location), "p INT, i INT", partitions=2)
    with pr.open_writer(str(location), 0) as w:
        for i, t in enumerate((1, 2, 3, 1.5, 4)):  # offset 3 (1.5 s) is late
            w.insert({"p": 0, "i": i}, rowtime=at(ms(t)))
        w.flush()
        w.set_rowtime_bound(at(ms(10)))  # offset 5
        w.insert({"p": 0, "i": 5}, rowtime=at(ms(8)))  # offset 6: below the bound
        w.insert({"p": 0, "i": 6}, rowtime=at(ms(11)))
        w.end_stream()
    with pr.open_writer(str(location), 1) as w:
        for i, t in enumerate((1, 2, 3, 4, 5, 6, 2.5, 7)):  # offset 6 (2.5 s) is late
            w.insert({"p": 1, "i": i}, rowtime=at(ms(t)))
            if i % 3 == 2:
                w.flush()
        w.end_stream()
    return location


#: (partition, offset, rowtime, reason, clock) of the discarded rows, per policy.
DISCARDED = {
    "drop": [
        (0, 3, ms(1.5), "below_partition_clock", ms(3)),
        (0, 6, ms(8), "below_rowtime_bound", ms(10)),
        (1, 6, ms(2.5), "below_partition_clock", ms(6)),
    ],
    # adjust sec/1 truncates to seconds; the clock is the reference time minus one second.
    "adjust": [
        (0, 3, ms(1), "below_adjust_range", ms(2)),
        (0, 6, ms(8), "below_rowtime_bound", ms(10)),
        (1, 6, ms(2), "below_adjust_range", ms(5)),
    ],
}


@pytest.mark.parametrize("order", ["drop", "adjust"])
def test_discarded_rows_are_counted_in_offsets_and_kept_in_the_quarantine(
    spark: SparkSession, tmp_path: Path, order: str
) -> None:
    location = late_stream(tmp_path / "late")
    options: dict[str, Any] = {"order": order}
    if order == "adjust":
        options.update({"adjust.unit": "sec", "adjust.range": 1})
    run = run_available_now(reader(spark, location, maxRowsPerBatch=6, **options), tmp_path / "ck")
    check_batches(run)
    assert len(run.batches) >= 3

    # Counted per partition in the offsets, visible in the query's progress.
    expected = DISCARDED[order]
    last = run.end_offset(run.batches[-1][0])
    per_partition = {p: sum(1 for d in expected if d[0] == p) for p in (0, 1)}
    assert {p: last["partitions"][str(p)]["discarded"] for p in (0, 1)} == per_partition
    assert run.progress[-1]["sources"][0]["endOffset"] is not None

    emitted = sorted((r["p"], r["i"]) for r in run.rows)
    assert emitted == sorted(
        [(0, i) for i in (0, 1, 2, 4, 6)] + [(1, i) for i in range(8) if i != 6]
    )

    quarantine = plain(batch_reader(spark, location, output="discarded", **options))
    got = sorted(
        (r["partition"], r["offset"], r["rowtime"], r["reason"], r["clock"]) for r in quarantine
    )
    assert got == expected
    by_offset = {(r["partition"], r["offset"]): r for r in quarantine}
    assert by_offset[(0, 3)]["i"] == 3 and by_offset[(1, 6)]["i"] == 6  # the payload is kept
    assert all(r["arrival"] is not None for r in quarantine)


# -- 6. replay from the checkpoint ---------------------------------------------------------------


def test_a_restart_from_the_checkpoint_gives_exactly_the_uninterrupted_output(
    spark: SparkSession, tmp_path: Path, stream_at: Callable[[str], str]
) -> None:
    location = stream_at("s")
    pr.create_stream(location, "p INT, i INT", partitions=2)
    # Five records per partition and round, five per partition and batch: a round always ends
    # on a batch boundary, so a run that stops after a round cuts batches where an
    # uninterrupted run does, and the two outputs can be compared batch by batch.
    options = {"order": "adjust", "adjust.unit": "msec", "adjust.range": 500, "maxRowsPerBatch": 10}

    def write_round(r: int, end: bool = False) -> None:
        for p in range(2):
            write_rows(location, p, jittered_rows(r, p, r * 5, 5), end=end)

    def run(checkpoint: str, into: Run) -> None:
        q = start(
            reader(spark, location, **options), tmp_path / checkpoint, into, available_now=True
        )
        q.awaitTermination()
        drain(q, into)

    parts = Run()
    write_round(0)
    write_round(1)
    run("b", parts)  # stops when it has read the first two rounds
    # Forget that the last batch was committed: the restart must run it again from its offsets,
    # though the log has grown meanwhile, and give the same rows and the same bound.
    last = parts.batches[-1][0]
    forget_commit(tmp_path / "b", last)
    write_round(2, end=True)
    run("b", parts)  # restarts from the checkpoint
    whole = Run()
    run("a", whole)  # everything at once, uninterrupted

    ids = [i for i, _ in parts.batches]
    assert ids.count(last) == 2, ids
    replays = [recs for i, recs in parts.batches if i == last]
    assert replays[0] == replays[1] and any(r["is_bound"] for r in replays[0])
    deduplicated = list({i: (i, recs) for i, recs in parts.batches}.values())
    assert deduplicated == whole.batches
    check_batches(whole)
    assert len(whole.batches) >= 4
    assert len(whole.rows) == 30 - 2  # i = 10 is 2 s early: discarded, in each partition
    assert whole.bounds[-1] == END_OF_STREAM_US


# -- 9. planning and reading in pieces equals one pass (no Spark) --------------------------------


def test_planning_and_reading_in_pieces_equal_one_pass_over_the_step() -> None:
    """``datasource.reader`` runs the policies over at most a piece of records at a time (for
    speed on large backlogs); the positions, emitted rows (in order) and discarded rows must be
    exactly what one pass of the core (``bounds.plan.step``) gives, errors included."""
    import random

    import numpy as np

    from pyspark_rowtime.bounds.errors import HeldRowsOverflowError, LateRowError
    from pyspark_rowtime.bounds.plan import StreamPosition, step
    from pyspark_rowtime.bounds.policies import (
        AdjustPolicy,
        DropPolicy,
        RejectPolicy,
        scan_partition,
    )
    from pyspark_rowtime.datasource.reader import classify_pieces, clock_at_end, merge_clocks

    rng = random.Random(4)

    def partition(n: int) -> tuple[np.ndarray, np.ndarray]:
        t, b, cur = [], [], 1000
        for _ in range(n):
            bound = rng.random() < 0.1
            cur += rng.randrange(0, 30 if bound else 20)
            late = not bound and rng.random() < 0.3
            t.append(cur - rng.randrange(0, 60) if late else cur)
            b.append(bound)
        if rng.random() < 0.3:
            t.append(END_OF_STREAM_US)
            b.append(True)
        return np.array(t, dtype=np.int64), np.array(b, dtype=bool)

    def decided(first: int, c: Any) -> tuple[list[Any], list[Any]]:
        rows = [(first + int(i), int(r)) for i, r in zip(c.emit, c.emit_rowtime_us, strict=True)]
        gone = zip(c.discarded, c.discarded_clock_us, c.discarded_reason, strict=True)
        return rows, [(first + int(i), int(k), why) for i, k, why in gone]

    def in_pieces(policy: Any, pos: Any, win: list[Any], piece: int) -> tuple[Any, list[Any]]:
        pairs = list(zip(pos.partitions, win, strict=True))
        clock = merge_clocks([clock_at_end(policy, s, t, b) for s, (t, b) in pairs], pos.clock_us)
        out = []
        for s, (t, b) in pairs:
            rows, gone, state = [], [], None
            for first, c in classify_pieces(policy, s, t, b, pos.clock_us, clock, "p", piece):
                r, g = decided(first, c)
                rows, gone, state = rows + r, gone + g, c.state.to_dict()
            out.append((rows, gone, state))
        return clock, out

    compared = 0
    for _ in range(1500):
        policy = rng.choice(
            [
                RejectPolicy(),
                DropPolicy(),
                AdjustPolicy("usec", rng.randrange(0, 40), max_held=rng.choice([4, 999])),
                AdjustPolicy("msec", 0),
            ]
        )
        parts = [partition(rng.randrange(0, 40)) for _ in range(rng.randrange(1, 4))]
        piece = rng.randrange(1, 8)
        pos = StreamPosition.start([0] * len(parts))
        cut = [0] * len(parts)
        for _ in range(5):
            cut = [
                min(len(t), c + rng.randrange(0, 25)) for (t, _), c in zip(parts, cut, strict=True)
            ]
            win = [
                (t[s.scan : e], b[s.scan : e])
                for (t, b), s, e in zip(parts, pos.partitions, cut, strict=True)
            ]
            try:
                scans = [
                    scan_partition(policy, s, t, b)
                    for s, (t, b) in zip(pos.partitions, win, strict=True)
                ]
                one, outs = step(pos, scans)
            except (LateRowError, HeldRowsOverflowError) as e:  # a late row, or too many held
                with pytest.raises(type(e)):  # the same error, not just any
                    in_pieces(policy, pos, win, piece)
                break
            clock, got = in_pieces(policy, pos, win, piece)
            assert clock == one.clock_us
            expected = [
                (*decided(s.scan, c), c.state.to_dict())
                for s, c in zip(pos.partitions, outs, strict=True)
            ]
            assert got == expected
            compared += len(got)
            pos = one
    assert compared > 3000


# -- damaged values ------------------------------------------------------------------------------


def test_a_flipped_byte_in_a_stored_value_fails_the_query_naming_the_unit_and_its_records(
    spark: SparkSession, stream_at: Callable[[str], str], tmp_path: Path
) -> None:
    from damage import flip_stored
    from pyspark.errors import StreamingQueryException

    location = stream_at("damaged")
    pr.create_stream(location, "name STRING", partitions=2)
    write_rows(location, 0, [({"name": "a"}, BASE_US), ({"name": "b"}, BASE_US + US)])
    write_rows(location, 0, [({"name": "xxxxxxxx"}, BASE_US + 2 * US)], end=True)
    write_rows(location, 1, [({"name": "c"}, BASE_US)], end=True)
    unit = flip_stored(location, b"xxxxxxxx")  # records [2, 4): the row and the end of stream

    run = Run()
    query = start(reader(spark, location, order="reject"), tmp_path / "ck", run)
    try:
        with pytest.raises(StreamingQueryException) as e:
            drain(query, run)
    finally:
        query.stop()
    message = str(e.value)
    assert unit in message and "records [2, 4)" in message and "checksum" in message, message
    assert run.batches == []  # the micro-batch failed whole: nothing of it reached the query

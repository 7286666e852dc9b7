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

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, TimestampType
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.bounds.time import from_rowtime_us

import pyspark_rowtime as pr

US = 1_000_000
#: 2023-11-14T22:13:20Z, a round number of seconds.
BASE_US = 1_700_000_000 * US


# -- helpers -------------------------------------------------------------------------------------


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


@dataclass
class Run:
    """What a streaming query produced: each micro-batch's records, in batch order."""

    batches: list[tuple[int, list[dict[str, Any]]]] = field(default_factory=list)
    progress: list[dict[str, Any]] = field(default_factory=list)

    def sink(self, df: DataFrame, batch_id: int) -> None:
        self.batches.append((batch_id, plain(df)))

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


def start(df: DataFrame, checkpoint: Path, run: Run, *, available_now: bool = False):  # type: ignore[no-untyped-def]
    w = df.writeStream.foreachBatch(run.sink).option("checkpointLocation", str(checkpoint))
    if available_now:
        w = w.trigger(availableNow=True)
    return w.start()


def drain(query: Any, run: Run) -> None:
    """Process everything available now and keep the query's progress reports."""
    query.processAllAvailable()
    keep = {(p["batchId"], p["timestamp"]) for p in run.progress}
    for p in query.recentProgress:
        d = json.loads(p.json)
        if (d["batchId"], d["timestamp"]) not in keep:
            run.progress.append(d)


def run_available_now(df: DataFrame, checkpoint: Path) -> Run:
    run = Run()
    q = start(df, checkpoint, run, available_now=True)
    q.awaitTermination()
    drain(q, run)
    return run


def check_batches(run: Run) -> None:
    """SPEC 7 on every micro-batch: at most one bound record, which is above the previous
    one; every data row between the previous batch's clock and this batch's clock."""
    clock: int | None = None
    for batch_id, records in run.batches:
        bounds = [r["rowtime"] for r in records if r["is_bound"]]
        assert len(bounds) <= 1, f"batch {batch_id} carries {len(bounds)} bound records"
        new = bounds[0] if bounds else clock
        if bounds and clock is not None:
            assert bounds[0] > clock, f"batch {batch_id}: bound {bounds[0]} <= previous {clock}"
        for r in records:
            if r["is_bound"]:
                continue
            assert r["rowtime"] is not None
            assert new is not None and r["rowtime"] <= new, (batch_id, r, new)
            assert clock is None or r["rowtime"] >= clock, (batch_id, r, clock)
        clock = new


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
]


def error_text(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    return str(excinfo.value)


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


def test_output_is_payload_then_rowtime_and_is_bound_with_null_payload_on_bounds(
    spark: SparkSession, tmp_path: Path
) -> None:
    location = tmp_path / "s"
    pr.create_stream(str(location), "id INT, name STRING")
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

#: 2009-03-01 12:15:00Z; the tuples' times are seconds after it.
T0_US = 1_235_909_700 * US
SDP_INPUT = [
    ("A", "2009/03/01 12:15:22:345678901"),
    ("B", "2009/03/01 12:15:22:123456789"),
    ("C", "2009/03/01 12:15:23:123456789"),
    ("D", "2009/03/01 12:15:22:890123456"),
    ("E", "2009/03/01 12:15:24:123456789"),
]


def sdp_stream(location: Path, **defaults: Any) -> Path:
    """The five tuples of seed 000 in arrival order (explicit SDP rowtimes), then end of
    stream; one segment per tuple so that maxRowsPerBatch can split anywhere."""
    pr.create_stream(str(location), "name STRING", **defaults)
    with pr.open_writer(str(location), 0) as w:
        for name, sdp in SDP_INPUT:
            w.insert({"name": name}, rowtime=sdp)
            w.flush()
        w.end_stream()
    return location


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


@pytest.mark.parametrize(("unit", "range_"), list(SDP_TABLE))
def test_sdp_examples_come_out_of_spark_as_the_spec_table_says(
    spark: SparkSession, tmp_path: Path, unit: str, range_: int
) -> None:
    rows, discarded = SDP_TABLE[(unit, range_)]
    location = sdp_stream(tmp_path / "sdp")
    options = {"order": "adjust", "adjust.unit": unit, "adjust.range": range_}

    # One record per micro-batch: held rows cross batch boundaries, carried by the offsets.
    run = run_available_now(reader(spark, location, maxRowsPerBatch=1, **options), tmp_path / "ck")
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

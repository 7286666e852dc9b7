"""What a batch read returns (issue 9, item 4): by default what a streaming query would have
emitted by now; with ``endingOffsets=latest`` every row written so far, for backfills and
audits. The expectation is SPEC section 11's table of seed 000, written without an end of
stream beside a second partition that lags far behind."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import (
    SDP_INPUT,
    SDP_TABLE,
    T0_US,
    US,
    batch_reader,
    names_and_rowtimes,
    plain,
    write_rows,
)
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

import pyspark_rowtime as pr


def lagging_sdp_stream(location: Path | str) -> Path | str:
    """Partition 0: the five SDP tuples and no end of stream (the last ones are still held
    under adjust). Partition 1: one row at T0 + 1 s, so the stream clock stays far below
    partition 0's rows (a bound at T0 + 2 s releases it under every policy)."""
    pr.create_stream(str(location), "name STRING", partitions=2)
    with pr.open_writer(str(location), 0) as w:
        for name, sdp in SDP_INPUT:
            w.insert({"name": name}, rowtime=sdp)
        w.flush()
    write_rows(location, 1, [({"name": "Z"}, T0_US + US)], bound_us=T0_US + 2 * US)
    return location


@pytest.mark.spark_subset
@pytest.mark.parametrize(("unit", "range_"), list(SDP_TABLE))
def test_a_batch_read_returns_rows_up_to_the_stream_clock_or_every_row_written_with_latest(
    spark: SparkSession, unit: str, range_: int, stream_at: Callable[[str], str]
) -> None:
    # On both backends: on Redis too the quarantine (output=discarded) is read back from the
    # stream, the discarded rows kept with their offsets and the clock that passed them.
    location = lagging_sdp_stream(stream_at("sdp"))
    options = {"order": "adjust", "adjust.unit": unit, "adjust.range": range_}
    rows, discarded = SDP_TABLE[(unit, range_)]
    z = ("Z", T0_US + US)

    # Default: what a streaming query would have emitted by now. Partition 1's clock (2 s)
    # is the stream clock: of partition 0 nothing is at or below it yet.
    now = plain(batch_reader(spark, location, **options))
    assert names_and_rowtimes(now) == [z]
    assert [r["rowtime"] for r in now if r["is_bound"]] == [T0_US + 2 * US]

    # latest: every row written so far, each partition in rowtime order under its policy as
    # if it ended now (held rows released), no bound record, discarded rows left out.
    everything = plain(batch_reader(spark, location, endingOffsets="latest", **options))
    assert [r for r in everything if r["is_bound"]] == []
    by_partition: dict[str, list[tuple[str, int]]] = {"0": [], "1": []}
    for name, t in names_and_rowtimes(everything):
        by_partition["1" if name == "Z" else "0"].append((name, t))
    assert by_partition == {"0": rows, "1": [z]}

    quarantine = plain(
        batch_reader(spark, location, endingOffsets="latest", output="discarded", **options)
    )
    assert [(r["name"], r["offset"], r["rowtime"], r["clock"]) for r in quarantine] == discarded


def test_ending_offsets_on_a_streaming_read_fails_at_start_saying_it_is_for_batch_reads(
    spark: SparkSession, tmp_path: Path
) -> None:
    location = lagging_sdp_stream(tmp_path / "sdp")
    stream = spark.readStream.format("rowtime").option("endingOffsets", "latest")
    query = stream.load(str(location)).writeStream.format("noop")
    query = query.option("checkpointLocation", str(tmp_path / "ck")).start()
    try:
        with pytest.raises(StreamingQueryException, match="endingOffsets=latest is for batch"):
            query.processAllAvailable()
    finally:
        query.stop()

"""Silent partitions in real Spark (idle.timeout, SPEC 12).

A two-partition stream whose partition 1 falls silent: its windows wait while partition 0's
records arrive within the timeout, and close once partition 0's records arrive past it. When
partition 1 comes back, its rows below the stream clock go to the quarantine with reason
``idle`` (counted in the offsets), never to Spark as late rows; a restart from the checkpoint
replays the last batch exactly; the source's progress shows the stream clock and the idle
partitions. Arrival times are injected through the writers' clocks, so nothing waits for time
to pass.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers import (
    BASE_US,
    US,
    Run,
    at,
    batch_reader,
    check_batches,
    drain,
    dropped_by_watermark,
    forget_commit,
    plain,
    reader,
    run_available_now,
    start_append,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import pyspark_rowtime as pr
from pyspark_rowtime.streams.storage import open_stream

OPTIONS = {"order": "drop", "idle.timeout": "5 seconds"}


class Arrival:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def put(location: str, partition: int, arrival_us: int, rowtimes_s: list[int]) -> None:
    """Rows ``i = rowtime in seconds after BASE`` into a partition, arriving at ``arrival_us``."""
    with pr.open_writer(location, partition, clock=Arrival(arrival_us)) as w:
        for t in rowtimes_s:
            w.insert({"p": partition, "i": t}, rowtime=at(BASE_US + t * US))


def windowed_counts(df: DataFrame) -> DataFrame:
    w = df.groupBy(F.window("rowtime", "10 seconds")).count()
    start = (F.unix_micros(F.col("window.start")) - BASE_US) / US
    return w.select(start.cast("int").alias("start"), "count")


def windows(run: Run) -> list[tuple[int, int]]:
    return sorted((r["start"], r["count"]) for r in run.records)


def source_progress(query: Any) -> dict[str, Any]:
    latest = query.lastProgress["sources"][0]["latestOffset"]
    return json.loads(latest) if isinstance(latest, str) else latest


def test_a_silent_partition_stops_holding_windows_and_its_late_rows_are_quarantined(
    spark: SparkSession, tmp_path: Path
) -> None:
    location = str(tmp_path / "s")
    pr.create_stream(location, "p INT, i INT", partitions=2)
    c0 = open_stream(location).meta.created_us
    assert c0 is not None
    ck = tmp_path / "ck"
    query_df = windowed_counts(pr.with_watermark(reader(spark, location, **OPTIONS)))

    run = Run()
    q = start_append(query_df, ck, run)
    try:
        put(location, 0, c0 + 1 * US, [1, 2])
        put(location, 1, c0 + 1 * US, [1, 3])
        # partition 1 falls silent; partition 0 writes on, within the timeout: its windows
        # wait for partition 1, whose clock is 3 s
        put(location, 0, c0 + 4 * US, list(range(11, 26)))
        drain(q, run)
        drain(q, run)
        assert windows(run) == []
        assert source_progress(q)["clock_us"] == BASE_US + 3 * US
        assert source_progress(q)["idle"] == []

        # partition 0's next record arrives 9 s after partition 1's last: partition 1 is idle,
        # the stream clock follows partition 0 and the windows before it close
        put(location, 0, c0 + 10 * US, [31])
        drain(q, run)
        drain(q, run)
        assert windows(run) == [(0, 4), (10, 9), (20, 6)]
        progress = source_progress(q)
        assert progress["clock_us"] == BASE_US + 31 * US
        assert progress["clock"] == pr.bounds.time.format_rowtime(BASE_US + 31 * US)
        assert progress["idle"] == ["1"]

        # partition 1 comes back: two rows below the stream clock (late), two above
        put(location, 1, c0 + 12 * US, [5, 15, 35, 45])
        put(location, 0, c0 + 13 * US, [41])
        drain(q, run)
        drain(q, run)
        assert windows(run) == [(0, 4), (10, 9), (20, 6), (30, 2)]
        assert source_progress(q)["idle"] == []
        assert dropped_by_watermark(run) == 0  # Spark was never handed a late row
        last_batch = max(b for b, _ in run.batches)
        q.stop()

        # the offsets count the two in partition 1
        offsets = sorted((ck / "offsets").glob("[0-9]*"), key=lambda f: int(f.name))
        end = json.loads(offsets[-1].read_text().splitlines()[-1])
        assert end["partitions"]["1"]["discarded"] == 2
        assert end["partitions"]["0"]["discarded"] == 0

        # a restart from the checkpoint that forgets the last commit replays that batch
        forget_commit(ck, last_batch)
        replay = Run()
        q = start_append(query_df, ck, replay)
        drain(q, replay)
    finally:
        q.stop()
    original = [recs for b, recs in run.batches if b == last_batch]
    again = [recs for b, recs in replay.batches if b == last_batch]
    assert again == original

    quarantine = plain(batch_reader(spark, location, output="discarded", **OPTIONS))
    got = sorted((r["partition"], r["i"], r["reason"], r["clock"]) for r in quarantine)
    assert got == [(1, 5, "idle", BASE_US + 31 * US), (1, 15, "idle", BASE_US + 31 * US)]

    # A query in small steps and a batch read give the same rows, SPEC 7 in every batch
    steps = reader(spark, location, maxRowsPerBatch=3, **OPTIONS)
    passthrough = run_available_now(steps, tmp_path / "ck2")
    check_batches(passthrough)
    batch = plain(batch_reader(spark, location, **OPTIONS))
    rows = sorted((r["p"], r["i"]) for r in batch if not r["is_bound"])
    assert sorted((r["p"], r["i"]) for r in passthrough.rows) == rows
    assert (1, 35) in rows and (1, 45) not in rows  # the stream clock is 41 s
    assert (1, 5) not in rows and (1, 15) not in rows

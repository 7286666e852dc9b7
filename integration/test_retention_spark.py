"""Retention against real Spark (SPEC 12): a streaming query restarted from its checkpoint after
a trim removed records it still needed fails naming stream, partition and the first kept
offset; with ``failOnDataLoss=false`` (the option of Spark's Kafka source) it skips to the first
kept record, emits exactly the kept rows, and counts what it skipped in its progress. A fresh
batch read starts from the first kept record. These are the promises Spark's Kafka source makes
for a topic whose retention passed a query's offsets."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import BASE_US, US, Run, at, batch_reader, plain, reader, start
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

import pyspark_rowtime as pr
from pyspark_rowtime.streams.retention import apply_retention
from pyspark_rowtime.streams.storage import open_stream


def write(location: str, first: int, last: int, per_flush: int) -> None:
    """Rows k = first..last-1 with rowtime BASE + k seconds, committed ``per_flush`` at a time
    (each commit one stored unit that retention may remove whole)."""
    with pr.open_writer(location, 0) as w:
        for k in range(first, last):
            w.insert({"k": k}, rowtime=at(BASE_US + k * US))
            if (k + 1) % per_flush == 0:
                w.flush()


def run_once(spark: SparkSession, location: str, checkpoint: Path, **options: str) -> Run:
    run = Run()
    query = start(reader(spark, location, **options), checkpoint, run, available_now=True)
    try:
        query.awaitTermination()
    finally:
        query.stop()
    for p in query.recentProgress:
        run.progress.append(json.loads(p.json))
    return run


def test_a_query_restarted_after_a_trim_fails_or_skips_and_counts(
    spark: SparkSession, workdir: Path, stream_at: Callable[[str], str]
) -> None:
    location = stream_at("trimmed")
    pr.create_stream(location, "k INT")
    write(location, 0, 10, per_flush=5)
    checkpoint = workdir / "checkpoint"
    first = run_once(spark, location, checkpoint)
    assert sorted(r["k"] for r in first.rows) == list(range(10))

    write(location, 10, 40, per_flush=10)
    trimmed = apply_retention(open_stream(location), before_us=BASE_US + 25 * US)
    assert [(r.before.start, r.after.start) for r in trimmed] == [(0, 20)]

    with pytest.raises(StreamingQueryException) as failed:
        run_once(spark, location, checkpoint)
    message = str(failed.value)
    assert "partition 0" in message and "first kept offset is 20" in message
    assert "from offset 10" in message and "failOnDataLoss=false" in message

    skipped = run_once(spark, location, checkpoint, failOnDataLoss="false")
    assert sorted(r["k"] for r in skipped.rows) == list(range(20, 40))  # no duplicate, no gap
    reports = [p["sources"][0].get("latestOffset") for p in skipped.progress]
    reports = [json.loads(r) if isinstance(r, str) else r for r in reports if r]
    counts = [r["skipped"] for r in reports if "skipped" in r]
    assert counts and counts[-1] == {"0": 10}

    # a batch read (and a new query) starts at the first kept record
    rows = plain(batch_reader(spark, location, endingOffsets="latest"))
    assert sorted(r["k"] for r in rows if not r["is_bound"]) == list(range(20, 40))

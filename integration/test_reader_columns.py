"""A schema given to the reader selects the payload columns it ships (issue 16).

Spark pushes no projection into a Python data source, so without a schema every payload
column crosses from the Python worker to the JVM even when the query reads one. With
``readStream.schema(...)`` keeping some payload columns (and the columns the reader adds), the
tasks emit only those: same rows, same order, same bounds, fewer columns.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import (
    T0_US,
    US,
    at,
    batch_reader,
    jittered_rows,
    plain,
    reader,
    run_available_now,
)
from pyspark.sql import SparkSession

import pyspark_rowtime as pr

OPTIONS = {"order": "adjust", "adjust.unit": "msec", "adjust.range": 500}


def three_columns(location: Path) -> Path:
    """Two partitions of rows out of order (some within adjust's range, some beyond it, which
    are discarded), columns name, n, note."""
    pr.create_stream(str(location), "name STRING, n BIGINT, note STRING", partitions=2)
    for p in range(2):
        rows = jittered_rows(7, p, 0, 40)
        with pr.open_writer(str(location), p) as w:
            for row, t_us in rows:
                i = row["i"]
                w.insert({"name": f"r{i}", "n": i, "note": f"p{p}-{i}"}, rowtime=at(t_us))
            w.end_stream()
    return location


def test_a_schema_keeps_the_columns_it_names_and_every_row(
    spark: SparkSession, tmp_path: Path
) -> None:
    location = three_columns(tmp_path / "s")
    whole = run_available_now(reader(spark, location, **OPTIONS), tmp_path / "ck-all")
    df = spark.readStream.format("rowtime").schema("n BIGINT, rowtime TIMESTAMP, is_bound BOOLEAN")
    for k, v in OPTIONS.items():
        df = df.option(k, v)
    some = run_available_now(df.load(str(location)), tmp_path / "ck-some")

    assert [sorted(r) for r in some.records[:1]] == [["is_bound", "n", "rowtime"]]
    keep = ("n", "rowtime", "is_bound")
    assert [[{k: r[k] for k in keep} for r in rows] for _, rows in whole.batches] == [
        rows for _, rows in some.batches
    ]
    assert len(some.rows) > 60 and some.bounds

    batch = spark.read.format("rowtime").schema("note STRING, rowtime TIMESTAMP, is_bound BOOLEAN")
    got = plain(batch.options(**OPTIONS).load(str(location)))
    everything = plain(batch_reader(spark, location, **OPTIONS))
    assert got == [{k: r[k] for k in ("note", "rowtime", "is_bound")} for r in everything]


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        pytest.param(
            "n BIGINT, colour STRING, rowtime TIMESTAMP, is_bound BOOLEAN",
            ["colour", "must be columns of the stream", "name, n, note, rowtime, is_bound"],
            id="unknown",
        ),
        pytest.param(
            "n BIGINT, rowtime TIMESTAMP", ["followed by rowtime, is_bound"], id="no-is_bound"
        ),
        pytest.param(
            "note STRING, n BIGINT, rowtime TIMESTAMP, is_bound BOOLEAN",
            ["keep the stream's order"],
            id="order",
        ),
        pytest.param(
            "n INT, rowtime TIMESTAMP, is_bound BOOLEAN",
            ["column 'n' as int", "the stream has bigint"],
            id="type",
        ),
    ],
)
def test_a_schema_the_reader_cannot_give_is_refused_by_name(
    spark: SparkSession, tmp_path: Path, schema: str, words: list[str]
) -> None:
    location = tmp_path / "s"
    pr.create_stream(str(location), "name STRING, n BIGINT, note STRING", partitions=1)
    with pr.open_writer(str(location), 0) as w:
        w.insert({"name": "a", "n": 1, "note": "x"}, rowtime=at(T0_US + US))
        w.end_stream()
    with pytest.raises(Exception) as caught:  # Spark wraps the SchemaError
        spark.read.format("rowtime").schema(schema).load(str(location)).collect()
    for word in words:
        assert word in str(caught.value)

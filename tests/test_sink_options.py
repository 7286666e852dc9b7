"""The sink's options and the query's columns: parsed once, every mistake named (SPEC 9)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark_rowtime.bounds.errors import OptionError, RowtimeError, SchemaError
from pyspark_rowtime.sink.options import GRANULARITY_US, parse_sink_options

TS = pa.timestamp("us", tz="UTC")
WITH_BOUNDS = pa.schema([("id", pa.int64()), ("rowtime", TS), ("is_bound", pa.bool_())])
WINDOWED = pa.schema([("rowtime", TS), ("n", pa.int64())])


def parse(schema=WITH_BOUNDS, overwrite=False, **options):
    options.setdefault("path", "/tmp/out")
    return parse_sink_options(options, schema, overwrite)


def test_defaults_a_pass_through_query_writes_a_stream_clocked_by_its_bounds():
    cfg = parse()
    assert (cfg.target, cfg.clock, cfg.payload, cfg.has_is_bound) == (
        "stream",
        "bounds",
        ("id",),
        True,
    )
    assert cfg.location == "/tmp/out"


def test_without_is_bound_the_clock_defaults_to_the_watermark_and_needs_the_checkpoint():
    cfg = parse(WINDOWED, checkpointlocation="file:///tmp/ck")
    assert (cfg.clock, cfg.checkpoint, cfg.payload) == ("watermark", "/tmp/ck", ("n",))
    with pytest.raises(OptionError, match="checkpointLocation is required with clock=watermark"):
        parse(WINDOWED)


def test_clock_bounds_without_is_bound_is_refused_with_what_to_do():
    with pytest.raises(OptionError, match="clock=bounds needs the query's is_bound column"):
        parse(WINDOWED, clock="bounds", checkpointlocation="/tmp/ck")


def test_clock_watermark_may_be_chosen_for_a_query_that_keeps_is_bound():
    assert parse(clock="Watermark", checkpointLocation="/tmp/ck").clock == "watermark"


@pytest.mark.parametrize("granularity", sorted(GRANULARITY_US))
def test_parquet_granularities(granularity):
    cfg = parse(target="parquet", granularity=granularity.upper())
    assert (cfg.target, cfg.granularity) == ("parquet", granularity)
    assert cfg.granularity_us == GRANULARITY_US[granularity]


def test_parquet_defaults_to_hourly_snappy_files():
    cfg = parse(target="parquet")
    assert (cfg.granularity, cfg.compression) == ("hour", "snappy")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"target": "kafka"}, r"option target='kafka' is not valid.*stream.*parquet"),
        ({"target": "parquet", "granularity": "week"}, r"granularity='week'.*minute, hour"),
        ({"target": "parquet", "compression": "brotli"}, r"compression='brotli'"),
        ({"clock": "rows"}, r"option clock='rows' is not valid.*bounds.*watermark"),
        ({"granularity": "day"}, r"option granularity applies to target=parquet only"),
        ({"path": "  "}, r"option path is required"),
    ],
)
def test_bad_values_name_the_option_and_what_it_accepts(options, message):
    with pytest.raises(OptionError, match=message):
        parse(**options)


def test_unknown_options_are_named_all_at_once():
    with pytest.raises(OptionError) as e:
        parse(granularty="day", Foo="1")
    text = str(e.value)
    assert "'granularty'" in text and "'Foo'" in text and "the sink accepts" in text
    assert isinstance(e.value, ValueError) and isinstance(e.value, RowtimeError)


def test_spark_own_options_are_accepted():
    assert parse(queryName="q", checkpointLocation="/tmp/ck").checkpoint == "/tmp/ck"


def test_complete_output_mode_is_refused():
    with pytest.raises(OptionError, match="outputMode"):
        parse(overwrite=True)


def test_a_query_without_rowtime_is_refused_naming_the_column_and_the_columns_it_has():
    schema = pa.schema([("id", pa.int64()), ("ts", TS)])
    with pytest.raises(SchemaError, match=r"needs a column named rowtime.*columns are id, ts"):
        parse(schema)


def test_rowtime_in_another_case_is_pointed_out():
    schema = pa.schema([("RowTime", TS)])
    with pytest.raises(SchemaError, match="there is 'RowTime'"):
        parse(schema)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (pa.schema([("rowtime", pa.int64())]), "column rowtime must be a TIMESTAMP"),
        (pa.schema([("rowtime", pa.timestamp("us"))]), "column rowtime must be a TIMESTAMP"),
        (pa.schema([("rowtime", TS), ("is_bound", pa.int32())]), "is_bound must be BOOLEAN"),
        (pa.schema([("rowtime", TS), ("__x", pa.int32())]), "clashes"),
    ],
)
def test_bad_columns_are_named(schema, message):
    with pytest.raises(SchemaError, match=message):
        parse(schema, checkpointlocation="/tmp/ck")


def test_the_config_is_picklable_for_executors():
    import pickle

    cfg = parse(target="parquet")
    assert pickle.loads(pickle.dumps(cfg)) == cfg

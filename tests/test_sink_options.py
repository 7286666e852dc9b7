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
def test_each_granularity_is_accepted_in_any_case_with_its_length_in_microseconds(granularity):
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
        ({"granularity": "day"}, r"option granularity applies to target=parquet, delta or ice"),
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


@pytest.mark.parametrize(
    ("value", "partitions"), [("3", 3), ("1", 1), ("10000", 10000), (" 7 ", 7)]
)
def test_partitions_sets_the_partitions_of_a_new_stream_target(value, partitions):
    cfg = parse(partitions=value)
    assert (cfg.target, cfg.partitions) == ("stream", partitions)


def test_partitions_is_unset_by_default_and_its_name_is_case_insensitive():
    assert parse().partitions is None
    assert parse(Partitions="2").partitions == 2


@pytest.mark.parametrize("value", ["0", "-1", "x", "1.5", "10001", "", "3 4"])
def test_bad_partitions_are_refused_naming_the_option_and_what_it_accepts(value):
    with pytest.raises(OptionError) as e:
        parse(partitions=value)
    text = str(e.value)
    assert f"option partitions={value!r} is not valid" in text
    assert "a whole number from 1 to 10000" in text


@pytest.mark.parametrize("value", ["3", "0"])
def test_partitions_is_refused_for_a_parquet_target(value):
    with pytest.raises(OptionError, match="option partitions applies to target=stream only"):
        parse(target="parquet", partitions=value)


def test_a_redis_location_takes_a_stream_target_and_refuses_parquet_without_its_password():
    # The sink keeps a stream target's state with the stream on Redis (no server is asked
    # here); Parquet files need a folder.
    url = "redis://ops:Sink-Secret-1@127.0.0.1:6379/0/out"
    with pytest.raises(OptionError) as info:
        parse(path=url, target="parquet")
    assert "option path" in str(info.value) and "local folder" in str(info.value)
    assert "Sink-Secret-1" not in str(info.value)
    assert parse(path=url).location == url  # the executors need the credentials

"""Where the target's clock comes from (SPEC 8): bound records, or the batch's watermark."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.bounds.errors import CorruptLogError, OptionError
from pyspark_rowtime.sink.clock import (
    advance,
    batch_watermark_ms,
    bounds_clock_us,
    checkpoint_keeps_state,
    checkpoint_query_id,
    watermark_clock_us,
)
from pyspark_rowtime.sink.options import parse_sink_options


def write_offsets(checkpoint, batch_id, watermark_ms):
    folder = checkpoint / "offsets"
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": watermark_ms, "batchTimestampMs": 1, "conf": {}}
    source = {"v": 1, "clock": 5, "partitions": {}}
    (folder / str(batch_id)).write_text(f"v1\n{json.dumps(meta)}\n{json.dumps(source)}")


def test_the_watermark_a_batch_ran_with_is_read_from_the_checkpoint(tmp_path):
    write_offsets(tmp_path, 7, 1_700_000_000_123)
    assert batch_watermark_ms(str(tmp_path), 7) == 1_700_000_000_123
    assert watermark_clock_us(1_700_000_000_123) == 1_700_000_000_123_000


def test_a_missing_offsets_file_says_which_option_to_check(tmp_path):
    with pytest.raises(OptionError, match="checkpointLocation"):
        batch_watermark_ms(str(tmp_path), 3)


def test_an_offsets_file_without_watermark_is_reported(tmp_path):
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text('v9\n{"x": 1}\n')
    with pytest.raises(CorruptLogError, match="batchWatermarkMs"):
        batch_watermark_ms(str(tmp_path), 0)


def test_sparks_no_watermark_yet_moves_nothing():
    assert watermark_clock_us(0) is None
    assert advance(5, watermark_clock_us(0)) == 5


def test_a_watermark_in_sparks_last_year_is_the_end_of_stream():
    import datetime as dt

    last_year_ms = int(dt.datetime(9999, 1, 1, tzinfo=dt.timezone.utc).timestamp()) * 1000
    assert watermark_clock_us(END_OF_STREAM_US // 1000) == END_OF_STREAM_US
    assert watermark_clock_us(END_OF_STREAM_US // 1000 - 2) == END_OF_STREAM_US  # minus a delay
    assert watermark_clock_us(last_year_ms) == END_OF_STREAM_US
    assert watermark_clock_us(last_year_ms - 1) == (last_year_ms - 1) * 1000


def test_bounds_clock_is_the_highest_bound_any_task_saw():
    assert bounds_clock_us([None, 5, 9, None]) == 9
    assert bounds_clock_us([None, None]) is None


@given(st.lists(st.one_of(st.none(), st.integers(-(10**12), 10**12)), max_size=30))
def test_advance_never_goes_back(candidates):
    clock = None
    for c in candidates:
        new = advance(clock, c)
        if clock is not None:
            assert new is not None and new >= clock
        if c is not None:
            assert new is not None and new >= c
        clock = new


def test_the_query_id_is_read_from_the_checkpoint_metadata(tmp_path):
    (tmp_path / "metadata").write_text('{"id":"abc-123"}')
    assert checkpoint_query_id(str(tmp_path)) == "abc-123"
    assert checkpoint_query_id(str(tmp_path / "nope")) is None
    assert checkpoint_query_id(None) is None


def test_a_checkpoint_on_object_storage_is_read_where_spark_wrote_it(object_server):
    """A cluster with no shared disk keeps its checkpoints on the store its streams are on
    (``checkpointLocation="s3a://..."`` or ``abfss://...``): the sink reads the query's id and
    each batch's watermark from there."""
    import obstore

    from pyspark_rowtime.streams.objstore.location import parse_location, store_for

    url = object_server.url("ck")
    if url.startswith("s3://"):
        url = "s3a://" + url[len("s3://") :]  # as Spark users write it for hadoop-aws
    loc = parse_location(url)
    meta = {"batchWatermarkMs": 1_700_000_000_123, "batchTimestampMs": 1, "conf": {}}
    offsets = f"v1\n{json.dumps(meta)}\n{json.dumps({'v': 1})}"
    obstore.put(store_for(loc), loc.key("offsets", "7"), offsets.encode())
    obstore.put(store_for(loc), loc.key("metadata"), b'{"id":"q-on-the-store"}\n')
    schema = pa.schema([("id", pa.int64()), ("rowtime", pa.timestamp("us", tz="UTC"))])
    cfg = parse_sink_options(
        {"path": "/tmp/t", "clock": "watermark", "checkpointLocation": url}, schema
    )
    assert cfg.checkpoint is not None and "://" in cfg.checkpoint
    assert batch_watermark_ms(cfg.checkpoint, 7) == 1_700_000_000_123
    assert checkpoint_query_id(cfg.checkpoint) == "q-on-the-store"
    with pytest.raises(OptionError, match="offsets/8"):
        batch_watermark_ms(cfg.checkpoint, 8)
    assert not checkpoint_keeps_state(cfg.checkpoint)
    # What Spark writes when it plans a stateful query's first batch (operator 0's metadata)
    obstore.put(store_for(loc), loc.key("state", "0", "_metadata", "metadata"), b"v1\n{}")
    assert checkpoint_keeps_state(cfg.checkpoint)


def test_a_query_keeps_state_when_its_checkpoint_has_sparks_state_folder(tmp_path):
    """Spark makes ``<checkpoint>/state`` when it plans a stateful query's first batch (windows,
    deduplication, joins), before any task runs; a stateless query has none (measured on Spark
    4.3: a window count and dropDuplicates have ``state/0/...`` in their first foreachBatch, a
    pass-through has no ``state``)."""
    assert not checkpoint_keeps_state(None)
    assert not checkpoint_keeps_state(str(tmp_path))
    (tmp_path / "offsets").mkdir()
    assert not checkpoint_keeps_state(str(tmp_path))
    (tmp_path / "state" / "0" / "_metadata").mkdir(parents=True)
    assert checkpoint_keeps_state(str(tmp_path))


def test_a_checkpoint_where_the_sink_cannot_read_is_refused_naming_the_option():
    schema = pa.schema([("id", pa.int64()), ("rowtime", pa.timestamp("us", tz="UTC"))])
    with pytest.raises(OptionError, match=r"checkpointLocation='gs://b/ck'.*object storage"):
        parse_sink_options(
            {"path": "/tmp/t", "clock": "watermark", "checkpointLocation": "gs://b/ck"}, schema
        )

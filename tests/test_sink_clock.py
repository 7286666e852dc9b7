"""Where the target's clock comes from (SPEC 8): bound records, or the batch's watermark."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.bounds.errors import CorruptLogError, OptionError
from pyspark_rowtime.sink.clock import (
    advance,
    batch_watermark_ms,
    bounds_clock_us,
    checkpoint_query_id,
    watermark_clock_us,
)


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

"""The storage seam: one function says what sits at a location, and the embedded log is a
backend like any other would be (registered for plain paths and file:// URLs)."""

from __future__ import annotations

import pytest

from pyspark_rowtime.api import create_stream, get_rowtime_bound
from pyspark_rowtime.bounds.errors import OptionError, StreamNotFoundError
from pyspark_rowtime.sink.layout import SinkState
from pyspark_rowtime.streams.storage import (
    LocationKind,
    PartitionAppender,
    StreamStorage,
    backend_for,
    open_storage,
    what_is_at,
)


def test_what_is_at_tells_the_four_kinds_of_location_apart(tmp_path):
    create_stream(tmp_path / "stream", "a INT")
    SinkState(str(tmp_path / "pending")).define_target({"kind": "stream"})
    SinkState(str(tmp_path / "parquet")).define_target({"kind": "parquet"})
    kinds = {
        name: what_is_at(tmp_path / name).kind
        for name in ("stream", "pending", "parquet", "nothing")
    }
    assert kinds == {
        "stream": LocationKind.STREAM,
        "pending": LocationKind.PENDING_STREAM_TARGET,
        "parquet": LocationKind.PARQUET_TARGET,
        "nothing": LocationKind.NOTHING,
    }
    # get_rowtime_bound asks the same function: no clock yet for either target, and a
    # location with nothing says how to create a stream.
    assert get_rowtime_bound(tmp_path / "pending") is None
    assert get_rowtime_bound(tmp_path / "parquet") is None
    with pytest.raises(StreamNotFoundError, match="create_stream"):
        get_rowtime_bound(tmp_path / "nothing")


def test_a_stream_target_that_exists_is_a_stream(tmp_path):
    create_stream(tmp_path / "s", "a INT")
    SinkState(str(tmp_path / "s")).define_target({"kind": "stream"})
    assert what_is_at(f"file://{tmp_path / 's'}").kind is LocationKind.STREAM


def test_the_embedded_log_implements_the_storage_interface(tmp_path):
    stream = create_stream(tmp_path / "s", "a INT", partitions=2)
    assert isinstance(stream, StreamStorage)
    assert isinstance(open_storage(tmp_path / "s"), StreamStorage)
    appender = stream.lock_partition(1, "partition 1 of s")
    try:
        assert isinstance(appender, PartitionAppender)
        tail = appender.tail()
        assert (tail.end, tail.clock_us, tail.last_arrival_us) == (0, None, None)
    finally:
        appender.release()


def test_a_scheme_no_backend_serves_is_refused_naming_it():
    # redis:// is served by the Redis backend (streams.redis): take a scheme nobody serves.
    with pytest.raises(OptionError, match=r"\(not kafka://\)"):
        backend_for("kafka://localhost:9092/orders")

"""The embedded log: what only a folder does (its files on disk, segments, merges, links).

What every backend does (creating, appends, reads, clocks, errors) is in
test_storage_contract.py, which runs against this log too."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
from clocks import T0, FakeClock

from pyspark_rowtime.api import (
    create_stream,
    get_rowtime_bound,
    open_writer,
    read_stream,
)
from pyspark_rowtime.bounds.errors import (
    CorruptLogError,
    OptionError,
    SchemaError,
    StreamNotFoundError,
)
from pyspark_rowtime.bounds.time import from_rowtime_us
from pyspark_rowtime.streams.columns import LOG_ARRIVAL_US, LOG_IS_BOUND
from pyspark_rowtime.streams.local.folder import COMPACT_FANIN
from pyspark_rowtime.streams.local.log import SegmentStats, open_stream
from pyspark_rowtime.streams.meta import KNOWN_DEFAULTS


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` with its bytes (lock files aside), to prove nothing changed."""
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            if name == "_writer.lock":
                continue
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = f.read()
    return out


# -- create ------------------------------------------------------------------------------------


def test_create_writes_metadata_with_arrow_schema_readable_ddl_partitions_and_defaults(tmp_path):
    loc = tmp_path / "s"
    create_stream(
        loc, "a INT, ts TIMESTAMP", 3, order="adjust", adjust_unit="msec", adjust_range=999
    )
    doc = json.loads((loc / "_stream.json").read_text())
    assert doc["format_version"] == 1
    assert doc["partitions"] == 3
    assert doc["schema"]["ddl"] == "a INT, ts TIMESTAMP"
    assert doc["defaults"] == {"order": "adjust", "adjust_unit": "msec", "adjust_range": 999}
    stream = open_stream(loc)
    assert stream.meta.payload_schema == pa.schema(
        [("a", pa.int32()), ("ts", pa.timestamp("us", tz="UTC"))]
    )
    assert stream.meta.partitions == 3
    assert stream.meta.location == str(loc)
    assert sorted(p.name for p in loc.iterdir()) == [
        "_stream.json",
        "partition-0000",
        "partition-0001",
        "partition-0002",
    ]


def test_create_accepts_file_urls_and_pyarrow_schemas(tmp_path):
    schema = pa.schema([("a", pa.int64()), ("b", pa.large_string())])
    create_stream(f"file://{tmp_path}/s", schema)
    assert open_stream(tmp_path / "s").meta.payload_schema == pa.schema(
        [("a", pa.int64()), ("b", pa.string())]
    )
    assert open_stream(f"file://{tmp_path}/s").location == str(tmp_path / "s")


def test_creating_the_same_stream_again_is_a_no_op(tmp_path):
    create_stream(tmp_path / "s", "a INT", 2, order="drop")
    before = snapshot(tmp_path)
    create_stream(tmp_path / "s", "a int", 2)  # same schema, defaults not given
    create_stream(tmp_path / "s", "a INT", 2, order="drop")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("kwargs", "error", "says"),
    [
        ({"schema": "a BIGINT"}, SchemaError, "another schema: it has (a INT), not (a BIGINT)"),
        ({"partitions": 3}, OptionError, "with 2 partitions, not 3"),
        ({"order": "reject"}, OptionError, "defaults are fixed"),
    ],
)
def test_creating_a_different_stream_where_one_exists_is_an_error(tmp_path, kwargs, error, says):
    create_stream(tmp_path / "s", "a INT", 2, order="drop")
    before = snapshot(tmp_path)
    args = {"schema": "a INT", "partitions": 2, **kwargs}
    with pytest.raises(error) as info:
        create_stream(tmp_path / "s", args.pop("schema"), args.pop("partitions"), **args)
    assert says in str(info.value)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("defaults", "says"),
    [
        ({"colour": "red"}, "unknown stream default 'colour'; known defaults: order, adjust_unit"),
        ({"order": "sort"}, "order must be one of reject, drop, adjust"),
        ({"adjust_unit": "minute"}, "adjust_unit must be one of sec, msec, usec"),
        ({"adjust_range": -1}, "adjust_range must be a whole number >= 0"),
        ({"adjust_range": 1.5}, "adjust_range"),
        ({"adjust_range": True}, "adjust_range"),
        ({"adjust_max_held": 0}, "adjust_max_held must be a whole number > 0"),
        ({"rowtime_column": "nope"}, "must be a payload column, one of a, ts, s"),
        ({"rowtime_column": "a"}, "TIMESTAMP, integer or STRING column; a is double"),
        ({"rowtime_unit": "h"}, "rowtime_unit must be one of s, ms, us, ns"),
        ({"rowtime_timezone": "Mars/Olympus"}, "rowtime_timezone='Mars/Olympus' is not valid"),
        ({"rowtime_format": "qqq"}, "rowtime_format='qqq' is not valid"),
    ],
)
def test_bad_defaults_are_refused_naming_the_default_and_what_it_accepts(tmp_path, defaults, says):
    with pytest.raises(OptionError) as info:
        create_stream(tmp_path / "s", "a DOUBLE, ts TIMESTAMP, s STRING", **defaults)
    assert says in str(info.value)
    assert not (tmp_path / "s" / "_stream.json").exists()


def test_known_defaults_are_typed_and_spark_spellings_accepted(tmp_path):
    stream = create_stream(
        tmp_path / "s",
        "ts TIMESTAMP, v STRING",
        **{
            "order": "ADJUST",
            "adjust.unit": "msec",
            "adjust_range": "999",
            "adjust.maxHeld": "10",
            "rowtime.column": "ts",
            "rowtime_unit": "us",
            "rowtime_format": "yyyy-MM-dd HH:mm:ss",
            "rowtime_timezone": "Europe/Paris",
            "retention": "168 hours",
            "retention.size": "1 GiB",
            "idle.timeout": "5 minutes",
        },
    )
    assert stream.meta.defaults == {
        "order": "adjust",
        "adjust_unit": "msec",
        "adjust_range": 999,
        "adjust_max_held": 10,
        "rowtime_column": "ts",
        "rowtime_unit": "us",
        "rowtime_format": "yyyy-MM-dd HH:mm:ss",
        "rowtime_timezone": "Europe/Paris",
        "retention": "7 days",
        "retention_size": 1 << 30,
        "idle_timeout": "5 minutes",
    }
    # interval_count goes with reject or drop only
    other = create_stream(tmp_path / "t", "v STRING", **{"interval.count": "2"}).meta.defaults
    assert other == {"interval_count": 2}
    assert set(stream.meta.defaults) | set(other) == set(KNOWN_DEFAULTS)


def test_a_folder_holding_other_files_is_not_turned_into_a_stream(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "notes.txt").write_text("mine")
    with pytest.raises(OptionError, match="already holds other files"):
        create_stream(tmp_path / "s", "a INT")


def test_other_url_schemes_are_refused_clearly(tmp_path):
    with pytest.raises(OptionError, match=r"only local paths and .*file:// URLs") as info:
        create_stream("gs://bucket/s", "a INT")
    assert "(not gs://)" in str(info.value)
    assert "{" not in str(info.value)


def test_the_embedded_log_names_the_scheme_it_refuses():
    from pyspark_rowtime.streams.local.log import resolve_location

    with pytest.raises(OptionError, match="only local paths and file:// URLs") as info:
        resolve_location("hdfs://nn/s")
    assert "(not hdfs://)" in str(info.value)


# -- open --------------------------------------------------------------------------------------


def test_opening_a_missing_stream_names_the_location_and_how_to_create_one(tmp_path):
    with pytest.raises(StreamNotFoundError) as info:
        open_stream(tmp_path / "nope")
    message = str(info.value)
    assert str(tmp_path / "nope") in message
    assert "create_stream(" in message and "rowtime create" in message
    assert isinstance(info.value, FileNotFoundError)
    (tmp_path / "empty").mkdir()
    with pytest.raises(StreamNotFoundError, match=r"no _stream\.json"):
        open_stream(tmp_path / "empty")


# -- reading -----------------------------------------------------------------------------------


@pytest.fixture
def written(tmp_path):
    """A stream with two partitions: p0 has rows, bounds and an Arrow batch; p1 is empty."""
    loc = tmp_path / "s"
    create_stream(loc, "a INT, b STRING", 2)
    clock = FakeClock()
    with open_writer(loc, 0, clock=clock) as w:
        w.insert({"a": 1, "b": "x"})  # inserted at T0, implicit: its rowtime
        # (the flush commits at T0 + 2: the arrival of the first two records)
        w.insert({"a": 2}, rowtime=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc))
        w.flush()
        w.set_rowtime_bound(dt.datetime(2024, 1, 2, tzinfo=dt.timezone.utc))
        w.insert_arrow(pa.table({"b": ["p", "q"], "a": pa.array([5, 6], pa.int64())}))
    return loc


def test_reads_point_into_the_memory_mapped_segment_without_copying(written):
    stream = open_stream(written)
    first = stream.read(0, 0, 2, columns=["a"])
    again = stream.read(0, 0, 2, columns=["a"])
    buf1 = first.column("a").chunk(0).buffers()[1]
    buf2 = again.column("a").chunk(0).buffers()[1]
    assert buf1.address == buf2.address  # the same mapped bytes, nothing materialised


# -- segments on disk --------------------------------------------------------------------------


def test_segments_are_arrow_ipc_files_named_by_first_offset_and_count(written):
    names = sorted(p.name for p in (written / "partition-0000").glob("*.arrow"))
    assert names == [
        "00000000000000000000-0000000002.arrow",
        "00000000000000000002-0000000003.arrow",
    ]
    with pa.memory_map(str(written / "partition-0000" / names[1])) as source:
        reader = pa.ipc.open_file(source)
        table = reader.read_all()
    assert table.num_rows == 3
    assert table.schema.field(LOG_ARRIVAL_US).nullable is False
    stats = SegmentStats.from_metadata(reader.schema.metadata, names[1])
    assert (stats.first, stats.count, stats.rows, stats.bounds) == (2, 3, 2, 1)
    assert stats.last_bound_us == 1_704_153_600_000_000
    assert stats.last_arrival_us == T0 + 5


def test_temporary_files_are_ignored_by_readers_and_removed_by_the_next_writer(written):
    part = written / "partition-0000"
    tmp = part / ".tmp.999.deadbeef.arrow"
    tmp.write_bytes(b"half a segment")
    assert open_stream(written).read(0, 0, 5).num_rows == 5
    with open_writer(written, 0):
        pass
    assert not tmp.exists()


def test_a_missing_segment_in_the_middle_is_reported_as_corruption(written):
    os.unlink(written / "partition-0000" / "00000000000000000000-0000000002.arrow")
    with pytest.raises(CorruptLogError, match=r"no segment for offsets \[0, 2\)"):
        open_stream(written).end_offset(0)


def test_a_damaged_segment_is_reported_naming_the_file(written):
    path = written / "partition-0000" / "00000000000000000002-0000000003.arrow"
    path.write_bytes(b"garbage")
    with pytest.raises(CorruptLogError, match=r"00000000000000000002-0000000003\.arrow"):
        open_stream(written).read(0, 0, 5)


def test_a_segment_of_a_newer_log_format_is_refused_naming_the_file_and_the_version(written):
    # A later version of the format may give footer fields another meaning: refuse to guess.
    path = written / "partition-0000" / "00000000000000000002-0000000003.arrow"
    table = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
    metadata = {**table.schema.metadata, b"rowtime.format_version": b"2"}
    os.unlink(path)  # segments are read-only once committed: write a new file in its place
    with pa.OSFile(str(path), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema.with_metadata(metadata)) as writer:
            writer.write_table(table)
    with pytest.raises(CorruptLogError) as info:
        open_stream(written).read(0, 0, 5)
    message = str(info.value)
    assert "00000000000000000002-0000000003.arrow" in message
    assert "format version 2" in message and "up to 1" in message
    assert open_stream(written).read(0, 0, 2).num_rows == 2  # the older segment still reads


def test_small_segments_are_merged_without_changing_what_is_read(tmp_path):
    create_stream(tmp_path / "s", "a INT")
    clock = FakeClock()
    with open_writer(tmp_path / "s", clock=clock) as w:
        for i in range(3 * COMPACT_FANIN + 5):
            w.insert({"a": i})
            if i % 7 == 0:
                w.set_rowtime_bound(from_rowtime_us(clock.now))
            w.flush()
    stream = open_stream(tmp_path / "s")
    files = list((tmp_path / "s" / "partition-0000").glob("*.arrow"))
    n = stream.end_offset(0)
    assert len(files) <= 15  # 53 flushes
    t = stream.read(0, 0, n)
    flags = t.column(LOG_IS_BOUND).to_pylist()
    rows = [a for a, b in zip(t.column("a").to_pylist(), flags, strict=True) if not b]
    assert rows == list(range(3 * COMPACT_FANIN + 5))
    arrivals = t.column(LOG_ARRIVAL_US).to_pylist()
    assert arrivals == sorted(arrivals)
    stats = stream.partition_stats(0)
    assert sum(s.count for s in stats) == n
    assert stats[-1].clock_us == stream.clock_us(0)


def test_leftovers_of_an_interrupted_merge_are_ignored_then_cleaned(tmp_path):
    create_stream(tmp_path / "s", "a INT")
    with open_writer(tmp_path / "s") as w:
        for i in range(3):
            w.insert({"a": i})
            w.flush()
    part = tmp_path / "s" / "partition-0000"
    small = sorted(part.glob("*.arrow"))
    # Simulate a merge that committed [0, 3) but died before removing the parts.
    stream = open_stream(tmp_path / "s")
    merged = pa.concat_tables(stream.read(0, 0, 3) for _ in [0])
    from pyspark_rowtime.streams.local.folder import write_segment

    stats = SegmentStats.merge([stream.stats(s) for s in stream.segments(0)])
    write_segment(str(part), stats, stream.file_schema, [merged])
    assert len(list(part.glob("*.arrow"))) == 4
    assert open_stream(tmp_path / "s").read(0, 0, 3).column("a").to_pylist() == [0, 1, 2]
    with open_writer(tmp_path / "s"):
        pass
    assert all(not p.exists() for p in small)
    assert open_stream(tmp_path / "s").read(0, 0, 3).column("a").to_pylist() == [0, 1, 2]


@pytest.mark.parametrize(
    ("counts", "start"),
    [
        ([1] * 15, None),  # not enough yet
        ([1] * 16, 0),
        ([300] + [1] * 16, 1),  # the tiny ones merge among themselves first
        ([300] + [1] * 15, None),  # never rewrite the big one for 15 tiny ones
        ([70_000] + [1] * 16, 1),  # large segments are left alone
        ([20] * 16 + [3], 0),  # 16 of class 1 and a class-0 straggler at the tail
        ([20] * 15 + [3] * 15, None),
        ([20000, 5, 300, 20000] * 4, None),  # mixed sizes: 8 of class 3 so far
        ([20000, 5, 300, 20000] * 8, 0),  # 16 of class 3: all of them, the small ones too
    ],
)
def test_merges_take_sixteen_segments_of_a_size_class_from_the_tail(counts, start):
    from pyspark_rowtime.streams.local.folder import Segment
    from pyspark_rowtime.streams.local.merge import _merge_start

    chain, first = [], 0
    for count in counts:
        chain.append(Segment(first, count, f"{first}"))
        first += count
    assert _merge_start(chain) == start


def test_get_rowtime_bound_reads_the_clock_of_a_parquet_sink_target(tmp_path):
    from pyspark_rowtime.sink import layout

    target = tmp_path / "target"
    (target / layout.SINK_DIR).mkdir(parents=True)
    (target / layout.SINK_DIR / layout.TARGET_FILE).write_text(json.dumps({"kind": "parquet"}))
    assert get_rowtime_bound(target) is None  # no batch has moved it yet
    (target / layout.SINK_DIR / layout.CLOCK_FILE).write_text(json.dumps({"clock_us": T0}))
    assert get_rowtime_bound(target) == from_rowtime_us(T0)


def test_filesystems_without_hard_links_still_commit_segments(tmp_path, monkeypatch):
    import errno

    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    create_stream(tmp_path / "s", "a INT")
    with open_writer(tmp_path / "s") as w:
        w.insert({"a": 1})
        w.flush()
        w.insert({"a": 2})
    assert read_stream(tmp_path / "s").column("a").to_pylist() == [1, 2]
    names = [p.name for p in (tmp_path / "s" / "partition-0000").iterdir()]
    assert not [n for n in names if n.startswith(".tmp")]


def test_a_stream_created_again_at_the_same_path_is_read_afresh(tmp_path):
    import shutil

    create_stream(tmp_path / "s", "a INT")
    assert open_stream(tmp_path / "s").meta.payload_schema.names == ["a"]
    shutil.rmtree(tmp_path / "s")
    create_stream(tmp_path / "s", "b STRING", 2)
    meta = open_stream(tmp_path / "s").meta
    assert (meta.payload_schema.names, meta.partitions) == (["b"], 2)
    meta.defaults["order"] = "drop"  # a caller's copy: the next reader is not affected
    assert open_stream(tmp_path / "s").meta.defaults == {}

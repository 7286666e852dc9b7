"""The adapter-facing writer: what each call stores, and what it refuses without storing."""

from __future__ import annotations

import datetime as dt
import os
import time
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest
from clocks import T0, FakeClock

from pyspark_rowtime.api import create_stream, open_writer, read_stream
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.bounds.errors import (
    BoundError,
    InvalidRowtimeError,
    LateRowError,
    OptionError,
    SchemaError,
    WriterClosedError,
    WriterLockedError,
)
from pyspark_rowtime.bounds.time import from_rowtime_us
from pyspark_rowtime.streams.columns import LOG_ARRIVAL_US, LOG_IS_BOUND, LOG_ROWTIME_US
from pyspark_rowtime.streams.local import log as log_module
from pyspark_rowtime.streams.local.log import open_stream

UTC = dt.timezone.utc
JAN1 = dt.datetime(2024, 1, 1, tzinfo=UTC)
JAN1_US = 1_704_067_200_000_000
UTC_US = pa.timestamp("us", tz="UTC")


def at(t_us: int) -> dt.datetime:
    return from_rowtime_us(t_us)


@pytest.fixture
def loc(tmp_path):
    path = tmp_path / "s"
    create_stream(path, "a INT, b STRING, ts TIMESTAMP")
    return path


def records(loc) -> list[dict]:
    return read_stream(loc).to_pylist()


def system(loc, column: str, partition: int = 0) -> list:
    stream = open_stream(loc)
    return stream.read(partition, 0, stream.end_offset(partition), [column]).column(0).to_pylist()


# -- buffering and durability ------------------------------------------------------------------


def test_inserts_are_buffered_until_flush_then_visible_as_one_batch(loc):
    stream = open_stream(loc)
    with open_writer(loc) as w:
        w.insert({"a": 1})
        w.insert({"a": 2})
        assert stream.end_offset(0) == 0 and w.pending == 2
        assert w.flush() == 2
        assert stream.end_offset(0) == 2 and w.pending == 0
        assert w.flush() == 2  # an empty flush is a no-op
    assert len(list((loc / "partition-0000").glob("*.arrow"))) == 1


def test_the_buffer_is_flushed_when_it_reaches_flush_records(loc):
    stream = open_stream(loc)
    with open_writer(loc, flush_records=3) as w:
        for i in range(7):
            w.insert({"a": i})
        assert stream.end_offset(0) == 6 and w.pending == 1
    assert stream.end_offset(0) == 7


def test_close_flushes_and_a_failing_with_block_keeps_rows_inserted_before_the_error(loc):
    with pytest.raises(RuntimeError), open_writer(loc) as w:
        w.insert({"a": 1})
        raise RuntimeError("adapter failed")
    assert [r["a"] for r in records(loc)] == [1]
    assert w.closed


def test_a_closed_writer_refuses_work_and_close_is_idempotent(loc):
    w = open_writer(loc)
    w.close()
    w.close()
    with pytest.raises(WriterClosedError, match="closed; open a new one"):
        w.insert({"a": 1})
    with pytest.raises(WriterClosedError):
        w.flush()


def test_a_failed_flush_keeps_the_buffer_and_commits_nothing(loc, monkeypatch):
    real = log_module.write_segment

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with open_writer(loc) as w:
        w.insert({"a": 1})
        monkeypatch.setattr(log_module, "write_segment", disk_full)
        with pytest.raises(OSError, match="No space"):
            w.flush()
        assert w.pending == 1 and open_stream(loc).end_offset(0) == 0
        monkeypatch.setattr(log_module, "write_segment", real)
        assert w.flush() == 1
    assert [r["a"] for r in records(loc)] == [1]


# -- arrival time --------------------------------------------------------------------------------


def test_arrival_is_stored_with_every_record_and_never_decreases(loc):
    clock = FakeClock(T0, step=-5)  # a wall clock stepping backwards
    with open_writer(loc, clock=clock) as w:
        w.insert({"a": 1})
        w.insert({"a": 2})
        w.set_rowtime_bound(JAN1)
        w.insert_arrow(pa.table({"a": [3, 4]}))
    assert system(loc, LOG_ARRIVAL_US) == [T0] * 5


def test_a_new_writer_continues_arrival_from_the_last_stored_one(loc):
    with open_writer(loc, clock=FakeClock(T0 + 100)) as w:
        w.insert({"a": 1})
    with open_writer(loc, clock=FakeClock(T0)) as w:  # this process's clock is behind
        w.insert({"a": 2})
    # the first commit arrives at T0 + 101 (its flush reads the clock once more); the second
    # writer's clock is behind, so its row and commit take the partition's last arrival
    assert system(loc, LOG_ARRIVAL_US) == [T0 + 101, T0 + 101]


# -- rowtimes ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rowtime",
    [
        JAN1,
        "2024-01-01T00:00:00Z",
        "2024/01/01 00:00:00:000000000",
        1_704_067_200_000,  # epoch milliseconds, the default unit
        np.datetime64("2024-01-01T00:00:00"),
    ],
    ids=["datetime", "iso", "sdp", "epoch-ms", "datetime64"],
)
def test_explicit_rowtimes_are_stored_in_microseconds_as_given(loc, rowtime):
    with open_writer(loc) as w:
        w.insert({"a": 1}, rowtime=rowtime)
    assert system(loc, LOG_ROWTIME_US) == [JAN1_US]


def test_implicit_rowtime_is_the_time_of_insert_and_arrival_the_time_of_commit(loc):
    clock = FakeClock(step=10)
    with open_writer(loc, clock=clock) as w:
        w.insert({"a": 1})  # T0
        w.insert({"a": 2})  # T0 + 10
    # committed at close (T0 + 20): the rowtimes stay the times of insert
    assert system(loc, LOG_ROWTIME_US) == [T0, T0 + 10]
    assert system(loc, LOG_ARRIVAL_US) == [T0 + 20, T0 + 20]
    assert open_stream(loc).clock_us(0) == T0 + 10


def test_nanosecond_rowtimes_are_truncated_toward_the_past(loc):
    with open_writer(loc) as w:
        w.insert({"a": 1}, rowtime="2024-01-01T00:00:00.000000999Z")
    assert system(loc, LOG_ROWTIME_US) == [JAN1_US]


def test_the_streams_rowtime_unit_and_column_defaults_apply(tmp_path):
    loc = tmp_path / "s"
    create_stream(loc, "ts BIGINT, v STRING", rowtime_column="ts", rowtime_unit="s")
    with open_writer(loc) as w:
        w.insert({"ts": 1_704_067_200, "v": "x"})  # promoted from the column, in seconds
        w.insert({"ts": 0, "v": "y"}, rowtime=JAN1)  # an explicit rowtime wins
        with pytest.raises(InvalidRowtimeError, match="no value in column 'ts'"):
            w.insert({"v": "z"})
    assert system(loc, LOG_ROWTIME_US) == [JAN1_US, JAN1_US]


def test_an_unreadable_rowtime_raises_and_buffers_nothing(loc):
    with open_writer(loc) as w:
        with pytest.raises(InvalidRowtimeError, match="yesterday"):
            w.insert({"a": 1}, rowtime="yesterday")
        assert w.pending == 0


def test_rows_below_the_clock_are_stored_as_given_unless_the_policy_is_reject(loc):
    with open_writer(loc) as w:
        w.insert({"a": 1}, rowtime=JAN1 + dt.timedelta(seconds=5))
        w.insert({"a": 2}, rowtime=JAN1)  # goes back: the reader's policy decides
    assert system(loc, LOG_ROWTIME_US) == [JAN1_US + 5_000_000, JAN1_US]


@pytest.fixture
def reject_loc(tmp_path):
    path = tmp_path / "r"
    create_stream(path, "a INT", order="reject")
    return path


def test_under_reject_a_late_row_raises_naming_stream_partition_rowtime_and_clock(reject_loc):
    with open_writer(reject_loc) as w:
        w.insert({"a": 1}, rowtime=JAN1 + dt.timedelta(seconds=5))
        w.flush()
        w.insert({"a": 2}, rowtime=JAN1 + dt.timedelta(seconds=6))
        with pytest.raises(LateRowError) as info:
            w.insert({"a": 3}, rowtime=JAN1)
        message = str(info.value)
        for part in (
            str(reject_loc),
            "partition 0",
            "2024-01-01T00:00:00Z",
            "2024-01-01T00:00:06Z",
            "order=reject",
            "Nothing was written",
        ):
            assert part in message
        assert w.pending == 1
        w.insert({"a": 4}, rowtime=JAN1 + dt.timedelta(seconds=6))  # equal is not late
    assert [r["a"] for r in records(reject_loc)] == [1, 2, 4]


def test_under_reject_an_implicit_row_below_a_future_bound_is_late(reject_loc):
    with open_writer(reject_loc, clock=FakeClock()) as w:
        w.set_rowtime_bound(at(T0 + 1_000))
        with pytest.raises(LateRowError, match="arrival time"):
            w.insert({"a": 1})


def test_under_reject_a_late_arrow_batch_is_refused_whole_naming_the_row(reject_loc):
    with open_writer(reject_loc) as w:
        w.insert({"a": 0}, rowtime=JAN1)
        batch = pa.table(
            {"a": [1, 2, 3], "t": pa.array([JAN1_US + 2, JAN1_US + 3, JAN1_US + 1], pa.int64())}
        )
        with pytest.raises(LateRowError, match="row 2 of the inserted table"):
            w.insert_arrow(batch.set_column(1, "t", batch["t"].cast(UTC_US)), "t")
        assert w.pending == 1
    assert [r["a"] for r in records(reject_loc)] == [0]


# -- bounds --------------------------------------------------------------------------------------


def test_bounds_are_records_with_the_bound_as_rowtime_and_null_payload(loc):
    with open_writer(loc, clock=FakeClock()) as w:
        w.insert({"a": 1, "b": "x"})
        w.set_rowtime_bound(JAN1)
        w.set_rowtime_bound(JAN1, strict=True)
    recs = records(loc)
    assert [r["is_bound"] for r in recs] == [False, True, True]
    assert recs[1]["rowtime"] == JAN1 and recs[1]["a"] is None and recs[1]["b"] is None
    assert recs[2]["rowtime"] == JAN1 + dt.timedelta(microseconds=1)  # strict: t + 1 us
    assert open_stream(loc).clock_us(0) == JAN1_US + 1


def test_a_bound_that_goes_back_raises_and_writes_nothing(loc):
    with open_writer(loc) as w:
        w.insert({"a": 1}, rowtime=JAN1)
        w.set_rowtime_bound(JAN1)  # equal to the clock: fine
        with pytest.raises(BoundError) as info:
            w.set_rowtime_bound(JAN1 - dt.timedelta(microseconds=1))
        assert "bounds never move backwards" in str(info.value)
        assert "2024-01-01T00:00:00Z" in str(info.value) and "partition 0" in str(info.value)
        assert w.pending == 2
    assert len(records(loc)) == 2


def test_a_bound_below_a_row_already_stored_goes_back(loc):
    with open_writer(loc) as w:
        w.insert({"a": 1}, rowtime=JAN1 + dt.timedelta(hours=1))
    with open_writer(loc) as w, pytest.raises(BoundError):
        w.set_rowtime_bound(JAN1)


def test_end_stream_writes_the_maximum_bound_flushes_and_no_row_may_follow(loc):
    with open_writer(loc) as w:
        w.insert({"a": 1})
        assert w.end_stream() == 2
        assert open_stream(loc).end_offset(0) == 2
        with pytest.raises(LateRowError, match="after the end of stream"):
            w.insert({"a": 2}, rowtime=JAN1)
        w.end_stream()  # repeating the end is allowed
    assert system(loc, LOG_ROWTIME_US)[1] == END_OF_STREAM_US
    with open_writer(loc) as w, pytest.raises(LateRowError, match="end of stream"):
        w.insert_arrow(pa.table({"a": [1]}))


# -- bad rows ------------------------------------------------------------------------------------

BAD_ROWS = [
    ({"a": 1, "zz": 2}, "unknown column 'zz'; the columns of partition 0"),
    ({"a": "1"}, "column 'a' of partition 0 of stream"),
    ({"a": 1.5}, "not a whole number"),
    ({"a": True}, "a bool is not a number"),
    ({"a": 2**31}, "out of range [-2147483648, 2147483647]"),
    ({"b": 5}, "column 'b'"),
    ({"ts": "2024-01-01"}, "column 'ts'"),
    ([("a", 1)], "a row must be a mapping"),
]


@pytest.mark.parametrize(("row", "says"), BAD_ROWS, ids=[str(r[0]) for r in BAD_ROWS])
def test_bad_rows_raise_naming_the_column_and_buffer_nothing(loc, row, says):
    with open_writer(loc) as w:
        w.insert({"a": 0})
        with pytest.raises(SchemaError) as info:
            w.insert(row)
        assert says in str(info.value)
        assert w.pending == 1
    assert [r["a"] for r in records(loc)] == [0]


def test_not_null_columns_must_have_a_value(tmp_path):
    create_stream(tmp_path / "s", "a INT NOT NULL, b STRING")
    with open_writer(tmp_path / "s") as w:
        with pytest.raises(SchemaError, match=r"'a' .* is NOT NULL"):
            w.insert({"b": "x"})
        w.set_rowtime_bound(JAN1)  # bounds carry no payload, NOT NULL or not
        assert w.pending == 1


def test_every_spark_type_takes_its_python_values(tmp_path):
    loc = tmp_path / "s"
    create_stream(
        loc,
        "i TINYINT, l BIGINT, f FLOAT, d DECIMAL(5,2), s STRING, bin BINARY, day DATE, "
        "ts TIMESTAMP, n TIMESTAMP_NTZ, ok BOOLEAN, xs ARRAY<INT>, m MAP<STRING,INT>, "
        "st STRUCT<x: INT, y: STRING>",
    )
    row = {
        "i": np.int8(5),
        "l": 2**62,
        "f": 1,
        "d": Decimal("123.45"),
        "s": "é",
        "bin": b"\x00\x01",
        "day": dt.date(2024, 1, 1),
        "ts": JAN1,
        "n": dt.datetime(2024, 1, 1, 12),
        "ok": False,
        "xs": [1, None, 3],
        "m": {"k": 1},
        "st": {"x": 1, "y": "z"},
    }
    with open_writer(loc) as w:
        w.insert(row)
        w.insert({})
        with pytest.raises(SchemaError, match="'d'"):
            w.insert({"d": Decimal("1234.5")})
        with pytest.raises(SchemaError, match="a datetime is not a date"):
            w.insert({"day": JAN1})
        with pytest.raises(SchemaError, match="'st'"):
            w.insert({"st": {"x": "not an int"}})
    got = records(loc)[0]
    assert got["i"] == 5 and got["d"] == Decimal("123.45") and got["m"] == [("k", 1)]
    assert got["xs"] == [1, None, 3] and got["st"] == {"x": 1, "y": "z"}
    assert got["ts"] == JAN1 and got["n"] == dt.datetime(2024, 1, 1, 12)


def test_a_value_pyarrow_refuses_at_flush_is_named_and_only_its_row_dropped(tmp_path):
    loc = tmp_path / "s"
    create_stream(loc, "l BIGINT")
    with open_writer(loc) as w:
        w.insert({"l": 1})
        w.insert({"l": 2**64})  # past int64: checked when the buffer becomes Arrow
        w.insert({"l": 3})
        with pytest.raises(SchemaError, match=r"'l' .* cannot store 18446744073709551616"):
            w.flush()
        assert open_stream(loc).end_offset(0) == 0
        assert w.flush() == 2
    assert [r["l"] for r in records(loc)] == [1, 3]


# -- Arrow ---------------------------------------------------------------------------------------


def test_insert_arrow_matches_columns_by_name_casts_losslessly_and_fills_missing_with_null(loc):
    table = pa.table({"b": ["x", "y"], "a": pa.array([1, 2], pa.int64())})
    with open_writer(loc, clock=FakeClock()) as w:
        w.insert({"a": 0})
        w.insert_arrow(table)
        w.insert_arrow(table.to_batches()[0])
        w.insert_arrow(table.slice(0, 0))  # empty: nothing
    recs = records(loc)
    assert [r["a"] for r in recs] == [0, 1, 2, 1, 2]
    assert [r["b"] for r in recs] == [None, "x", "y", "x", "y"]
    assert all(r["ts"] is None for r in recs)
    # implicit rowtimes: the time of each insert; arrival: the one commit's, at close
    assert system(loc, LOG_ROWTIME_US) == [T0, T0 + 1, T0 + 1, T0 + 2, T0 + 2]
    assert system(loc, LOG_ARRIVAL_US) == [T0 + 3] * 5


def test_insert_arrow_takes_rowtimes_from_a_column_which_may_be_extra(loc):
    table = pa.table(
        {"a": [1, 2], "event_time": ["2024-01-01T00:00:00Z", "2024-01-01T00:00:01.5Z"]}
    )
    with open_writer(loc) as w:
        w.insert_arrow(table, rowtime_column="event_time")
    assert system(loc, LOG_ROWTIME_US) == [JAN1_US, JAN1_US + 1_500_000]
    assert "event_time" not in read_stream(loc).column_names


@pytest.mark.parametrize(
    ("table", "kwargs", "error", "says"),
    [
        (pa.table({"a": [1], "zz": [1]}), {}, SchemaError, "column 'zz' that partition 0"),
        (pa.table({"a": [2**40]}), {}, SchemaError, "column 'a' of the inserted table is int64"),
        (pa.table({"a": ["x"]}), {}, SchemaError, "the cast fails"),
        (pa.table({"a": [1]}), {"rowtime_column": "t"}, SchemaError, "not a column"),
        (pa.table({"a": [1], "t": ["soon"]}), {"rowtime_column": "t"}, InvalidRowtimeError, "soon"),
        ([1, 2], {}, SchemaError, "takes a pyarrow Table or RecordBatch"),
    ],
)
def test_insert_arrow_refuses_bad_tables_whole(loc, table, kwargs, error, says):
    with open_writer(loc) as w:
        with pytest.raises(error, match=says):
            w.insert_arrow(table, **kwargs)
        assert w.pending == 0
    assert open_stream(loc).end_offset(0) == 0


def test_insert_arrow_checks_not_null_columns(tmp_path):
    create_stream(tmp_path / "s", "a INT NOT NULL, b INT")
    with open_writer(tmp_path / "s") as w:
        with pytest.raises(SchemaError, match="NOT NULL, but row 1"):
            w.insert_arrow(pa.table({"a": [1, None]}))
        with pytest.raises(SchemaError, match="no column 'a', which is NOT NULL"):
            w.insert_arrow(pa.table({"b": [1]}))


# -- one writer per partition ------------------------------------------------------------------


def test_a_second_writer_on_a_partition_is_refused_naming_it_and_the_holder(tmp_path):
    create_stream(tmp_path / "s", "a INT", 2)
    first = open_writer(tmp_path / "s", 0)
    with pytest.raises(WriterLockedError) as info:
        open_writer(tmp_path / "s", 0)
    assert "partition 0" in str(info.value) and str(os.getpid()) in str(info.value)
    with open_writer(tmp_path / "s", 1):  # another partition is free
        pass
    first.close()
    with open_writer(tmp_path / "s", 0):  # released on close
        pass


def test_a_partition_that_does_not_exist_is_refused(tmp_path):
    create_stream(tmp_path / "s", "a INT", 2)
    with pytest.raises(OptionError, match="numbered 0 to 1"):
        open_writer(tmp_path / "s", 2)


# -- heartbeats ----------------------------------------------------------------------------------


def test_a_heartbeat_writes_an_arrival_time_bound_only_while_the_writer_is_idle(loc):
    clock = FakeClock(T0, step=0)
    with open_writer(loc, heartbeat="1s", clock=clock) as w:
        w._stop.set()  # the test drives the beats itself
        w.insert({"a": 1})
        clock.now += 500_000
        assert not w._beat()  # active half a second ago
        clock.now += 500_000
        assert w._beat()  # idle for a second: a bound at now, flushed with the row
        assert open_stream(loc).end_offset(0) == 2
        assert not w._beat()  # the heartbeat itself counts as activity
        clock.now += 1_000_000
        assert w._beat()
    recs = records(loc)
    assert [r["is_bound"] for r in recs] == [False, True, True]
    assert [r["rowtime"] for r in recs[1:]] == [at(T0 + 1_000_000), at(T0 + 2_000_000)]


def test_a_heartbeat_does_not_write_a_bound_that_would_not_move_the_clock(loc):
    clock = FakeClock(T0, step=0)
    with open_writer(loc, heartbeat=1, clock=clock) as w:
        w._stop.set()
        w.insert({"a": 1}, rowtime=at(T0 + 10_000_000))  # a row ahead of the wall clock
        clock.now += 2_000_000
        assert not w._beat()
        assert w.pending == 0  # but the quiet writer's rows were flushed
    assert len(records(loc)) == 1


def test_the_heartbeat_thread_writes_bounds_while_idle(loc):
    stream = open_stream(loc)
    with open_writer(loc, heartbeat="20ms") as w:
        w.insert({"a": 1})
        deadline = time.monotonic() + 10
        while stream.end_offset(0) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    flags = system(loc, LOG_IS_BOUND)
    assert flags[0] is False and flags[1:3] == [True, True]
    rowtimes = system(loc, LOG_ROWTIME_US)[1:]
    assert rowtimes == sorted(rowtimes)


@pytest.mark.parametrize("heartbeat", [0, -1, "soon", True])
def test_a_bad_heartbeat_is_refused_naming_the_option(loc, heartbeat):
    with pytest.raises(OptionError, match="heartbeat"):
        open_writer(loc, heartbeat=heartbeat)
    with open_writer(loc):  # and the partition was not left locked
        pass


def test_flushes_through_the_log_module_commit_whole_segments(loc, monkeypatch):
    seen = []
    real = log_module.write_segment

    def spy(part_dir, stats, schema, chunks):
        seen.append((stats.first, stats.count))
        return real(part_dir, stats, schema, chunks)

    monkeypatch.setattr(log_module, "write_segment", spy)
    with open_writer(loc, clock=FakeClock()) as w:
        w.insert({"a": 1})
        w.insert_arrow(pa.table({"a": [2, 3]}))
        w.insert({"a": 4})
        w.flush()
        w.set_rowtime_bound(JAN1)
    assert seen == [(0, 4), (4, 1)]


def test_a_writer_dropped_without_close_warns_that_its_buffer_was_lost(loc):
    w = open_writer(loc)
    w.insert({"a": 1})
    with pytest.warns(ResourceWarning, match="1 buffered record"):
        w.__del__()
    w.close()

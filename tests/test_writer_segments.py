"""Writer.append_segment_files: segment files written elsewhere become the partition's next
segments by hard link (no record copied), and a file that does not continue the partition
exactly is refused before anything is committed.

The files are made the way the sink's executors make them (``sink.stream_target._Runs``): the
system columns, then the payload, the footer from :class:`SegmentStats`, written with
:func:`write_segment_file`. Nothing is mocked: real streams and files in ``tmp_path``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from clocks import T0, FakeClock
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_rowtime.api import create_stream, open_stream, open_writer, read_stream
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.bounds.errors import (
    BoundError,
    CorruptLogError,
    LateRowError,
    UnflushedRecordsError,
    WriterClosedError,
)
from pyspark_rowtime.bounds.time import from_rowtime_us
from pyspark_rowtime.streams import checksums
from pyspark_rowtime.streams.segments import SegmentStats, segment_name, write_segment_file
from pyspark_rowtime.streams.writer import Writer

DDL = "a INT, b STRING"

#: A record of a segment file: (arrival, rowtime or None, is_bound, a, b, ...).
Record = tuple[Any, ...]


def row(arrival: int, rowtime: int | None = None, a: int | None = None, b: str | None = None):
    return (arrival, rowtime, False, a, b)


def bound(arrival: int, t: int):
    return (arrival, t, True, None, None)


def at(t_us: int) -> dt.datetime:
    return from_rowtime_us(t_us)


def segment_file(
    path: Path,
    schema: pa.Schema,
    first: int,
    records: list[Record],
    prev_clock_us: int | None,
    **footer: int | None,
) -> str:
    """Write ``records`` as a segment file continuing a partition at offset ``first`` whose
    clock is ``prev_clock_us``; ``footer`` overrides fields of the computed statistics."""
    arrival = np.array([r[0] for r in records], dtype=np.int64)
    rowtimes = [r[1] for r in records]
    is_bound = np.array([r[2] for r in records], dtype=np.bool_)
    has_rowtime = np.array([t is not None for t in rowtimes], dtype=np.bool_)
    rt = np.array([0 if t is None else t for t in rowtimes], dtype=np.int64)
    if records:
        stats = SegmentStats.compute(first, arrival, rt, has_rowtime, is_bound, prev_clock_us)
    else:
        stats = SegmentStats(first=first, count=0, rows=0, bounds=0, clock_us=0, last_arrival_us=0)
    stats = dataclasses.replace(stats, **footer)
    columns = [
        pa.array(arrival, pa.int64()),
        pa.array(rowtimes, pa.int64()),
        pa.array(is_bound, pa.bool_()),
    ]
    for i, field in enumerate(list(schema)[3:]):
        values = [r[3 + i] if 3 + i < len(r) else None for r in records]
        columns.append(pa.array(values, field.type))
    write_segment_file(str(path), stats, schema, [pa.Table.from_arrays(columns, schema=schema)])
    return str(path)


@pytest.fixture
def loc(tmp_path: Path) -> Path:
    path = tmp_path / "s"
    create_stream(path, DDL, order="reject")
    return path


@pytest.fixture
def stage(tmp_path: Path) -> Path:
    path = tmp_path / "staging"
    path.mkdir()
    return path


def part_dir(loc: Path, partition: int = 0) -> Path:
    return loc / f"partition-{partition:04d}"


def segment_names(loc: Path) -> set[str]:
    return {p.name for p in part_dir(loc).glob("*.arrow")}


def committed(loc: Path) -> tuple[int, int | None, set[str]]:
    """What a freshly opened stream sees: end offset, clock, segment files."""
    stream = open_stream(loc)
    return stream.end_offset(0), stream.clock_us(0), segment_names(loc)


def raw(loc: Path, columns: list[str] | None = None) -> list[dict]:
    stream = open_stream(loc)
    return stream.read(0, 0, stream.end_offset(0), columns).to_pylist()


def same_file(a: str | Path, b: str | Path) -> bool:
    sa, sb = os.stat(a), os.stat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


# -- committed by link ------------------------------------------------------------------------


def test_a_segment_file_is_committed_as_a_hard_link_and_read_back(loc, stage):
    stream = open_stream(loc)
    records = [
        row(T0 + 10, T0 + 5, 1, "x"),
        row(T0 + 11, None, 2, "y"),  # implicit: the arrival is the rowtime
        bound(T0 + 12, T0 + 20),
        row(T0 + 13, T0 + 30, 3, None),
    ]
    path = segment_file(stage / "run-1.arrow", stream.file_schema, 0, records, None)
    with open_writer(loc, clock=FakeClock()) as w:
        assert w.append_segment_files([path]) == 4
        assert (w.end_offset, w.clock_us, w.last_arrival_us, w.pending) == (4, T0 + 30, T0 + 13, 0)
        segment = part_dir(loc) / segment_name(0, 4)
        assert segment_names(loc) == {segment.name}
        assert same_file(segment, path) and os.stat(path).st_nlink == 2
        assert committed(loc) == (w.end_offset, w.clock_us, {segment.name})

    assert raw(loc) == [
        {"__arrival_us": t, "__rowtime_us": r, "__is_bound": bd, "a": a, "b": b}
        for t, r, bd, a, b in records
    ]
    table = read_stream(loc)
    assert table.column("offset").to_pylist() == [0, 1, 2, 3]
    assert table.column("is_bound").to_pylist() == [False, False, True, False]
    assert table.column("a").to_pylist() == [1, 2, None, 3]
    assert table.column("b").to_pylist() == ["x", "y", None, None]

    os.unlink(path)  # the caller may drop its own name: the segment keeps the records
    assert os.stat(segment).st_nlink == 1
    assert [r["a"] for r in raw(loc)] == [1, 2, None, 3]


def test_consecutive_files_continue_flushed_rows_and_a_new_writer_continues_them(loc, stage):
    stream = open_stream(loc)
    schema = stream.file_schema
    with open_writer(loc, clock=FakeClock()) as w:
        w.insert({"a": 1}, rowtime=at(T0 + 100))
        w.insert({"a": 2}, rowtime=at(T0 + 200))
        assert w.flush() == 2
        files = [
            segment_file(
                stage / "f1.arrow",
                schema,
                2,
                [row(T0 + 1000, T0 + 300, 3), row(T0 + 1001, T0 + 400, 4)],
                T0 + 200,
            ),
            segment_file(stage / "f2.arrow", schema, 4, [bound(T0 + 1002, T0 + 500)], T0 + 400),
            segment_file(stage / "f3.arrow", schema, 5, [row(T0 + 1003, T0 + 600, 6)], T0 + 500),
        ]
        assert w.append_segment_files(files) == 6
        assert (w.end_offset, w.clock_us, w.last_arrival_us) == (6, T0 + 600, T0 + 1003)
        for path, (first, count) in zip(files, [(2, 2), (4, 1), (5, 1)], strict=True):
            segment = part_dir(loc) / segment_name(first, count)
            assert same_file(segment, path) and os.stat(path).st_nlink == 2
        assert committed(loc)[:2] == (6, T0 + 600)

    rows = raw(loc)
    assert [r["__rowtime_us"] - T0 for r in rows] == [100, 200, 300, 400, 500, 600]
    assert [r["a"] for r in rows] == [1, 2, 3, 4, None, 6]
    assert [r["__is_bound"] for r in rows] == [False] * 4 + [True, False]
    with open_writer(loc) as again:
        assert (again.end_offset, again.clock_us, again.last_arrival_us) == (
            6,
            T0 + 600,
            T0 + 1003,
        )


def test_no_files_is_a_no_op(loc):
    with open_writer(loc, clock=FakeClock()) as w:
        w.insert({"a": 1}, rowtime=at(T0 + 100))
        w.flush()
        before = committed(loc)
        assert w.append_segment_files([]) == 1
        assert (w.end_offset, w.clock_us) == (1, T0 + 100)
    assert committed(loc) == before


def test_under_order_adjust_a_file_with_rows_below_the_clock_is_committed(tmp_path, stage):
    loc = tmp_path / "adjusted"
    stream = create_stream(loc, DDL, order="adjust", adjust_unit="usec", adjust_range=1000)
    with open_writer(loc, clock=FakeClock()) as w:
        w.insert({"a": 1}, rowtime=at(T0 + 500))
        w.flush()
        path = segment_file(
            stage / "late.arrow", stream.file_schema, 1, [row(T0 + 10, T0 + 100, 2)], T0 + 500
        )
        assert w.append_segment_files([path]) == 2
        assert w.clock_us == T0 + 500  # the clock never goes back
    assert committed(loc)[:2] == (2, T0 + 500)
    assert [r["a"] for r in raw(loc)] == [1, 2]


# -- refused, and nothing committed -----------------------------------------------------------

# The partition the refusal tests start from: two rows committed by the writer.
BASE_END, BASE_CLOCK, BASE_ARRIVAL = 2, T0 + 200, T0 + 2  # arrival: the flush's time


@pytest.fixture
def base(loc):
    """A writer (order=reject) whose partition holds two committed rows; yields it."""
    w = open_writer(loc, clock=FakeClock())
    w.insert({"a": 1}, rowtime=at(T0 + 100))
    w.insert({"a": 2}, rowtime=at(T0 + 200))
    w.flush()
    assert (w.end_offset, w.clock_us, w.last_arrival_us) == (BASE_END, BASE_CLOCK, BASE_ARRIVAL)
    yield w
    w.close()


def good_file(loc: Path, stage: Path) -> str:
    """A valid continuation of the base partition: offsets [2, 4), clock T0 + 400."""
    return segment_file(
        stage / "good.arrow",
        open_stream(loc).file_schema,
        BASE_END,
        [row(T0 + 10, T0 + 300, 3), row(T0 + 11, T0 + 400, 4)],
        BASE_CLOCK,
    )


GOOD_END, GOOD_CLOCK, GOOD_ARRIVAL = 4, T0 + 400, T0 + 11


def _bad_first_ahead(path, schema, first, clock, arrival):
    return segment_file(path, schema, first + 1, [row(arrival + 5, clock + 10, 9)], clock)


def _bad_first_behind(path, schema, first, clock, arrival):
    return segment_file(path, schema, first - 1, [row(arrival + 5, clock + 10, 9)], clock)


def _extra_column(path, schema, first, clock, arrival):
    wider = pa.schema([*schema, pa.field("c", pa.int32())])
    return segment_file(path, wider, first, [(arrival + 5, clock + 10, False, 9, "z", 7)], clock)


def _missing_column(path, schema, first, clock, arrival):
    narrower = pa.schema(list(schema)[:-1])
    return segment_file(path, narrower, first, [row(arrival + 5, clock + 10, 9)], clock)


def _other_type(path, schema, first, clock, arrival):
    other = schema.set(3, pa.field("a", pa.int64()))
    return segment_file(path, other, first, [row(arrival + 5, clock + 10, 9)], clock)


def _arrival_before_last(path, schema, first, clock, arrival):
    return segment_file(path, schema, first, [row(arrival - 1, clock + 10, 9)], clock)


def _clock_above_records(path, schema, first, clock, arrival):
    return segment_file(
        path, schema, first, [row(arrival + 5, clock + 10, 9)], clock, clock_us=clock + 11
    )


def _clock_below_records(path, schema, first, clock, arrival):
    return segment_file(
        path, schema, first, [row(arrival + 5, clock + 10, 9)], clock, clock_us=clock + 9
    )


def _clock_below_partition(path, schema, first, clock, arrival):
    # A footer clock below the clock the partition already has (clocks never go back).
    return segment_file(
        path, schema, first, [bound(arrival + 5, clock + 10)], clock, clock_us=clock - 1
    )


def _count_above_records(path, schema, first, clock, arrival):
    return segment_file(path, schema, first, [row(arrival + 5, clock + 10, 9)], clock, count=2)


def _no_records(path, schema, first, clock, arrival):
    return segment_file(path, schema, first, [], clock)


def _not_arrow(path, schema, first, clock, arrival):
    Path(path).write_bytes(b"not an arrow file at all")
    return str(path)


def _missing(path, schema, first, clock, arrival):
    return str(path)


#: name: (how to make the file, what the refusal says).
BAD_FILES = {
    "first offset past the partition's end": (_bad_first_ahead, "starts at offset"),
    "first offset before the partition's end": (_bad_first_behind, "starts at offset"),
    "an extra column": (_extra_column, "has columns"),
    "a missing column": (_missing_column, "has columns"),
    "a column of another type": (_other_type, "has columns"),
    "first arrival before the partition's last": (_arrival_before_last, "first arrival"),
    "footer clock above its records": (_clock_above_records, "footer clock"),
    "footer clock below its records": (_clock_below_records, "footer clock"),
    "footer clock below the partition clock": (_clock_below_partition, "footer clock"),
    "footer count above its records": (_count_above_records, "its footer says 2"),
    "no records": (_no_records, "holds no records"),
    "not an Arrow file": (_not_arrow, "cannot be read"),
    "no such file": (_missing, "cannot be read"),
}


def assert_nothing_committed(w: Writer, loc: Path, before: tuple) -> None:
    assert (w.end_offset, w.clock_us, w.last_arrival_us) == (BASE_END, BASE_CLOCK, BASE_ARRIVAL)
    assert committed(loc) == before
    assert [r["a"] for r in raw(loc)] == [1, 2]


def assert_refused(
    w: Writer, loc: Path, files: list[str], error: type[Exception], match: str | None = None
) -> None:
    """Appending ``files`` raises ``error`` and commits nothing."""
    before = committed(loc)
    with pytest.raises(error, match=match):
        w.append_segment_files(files)
    assert_nothing_committed(w, loc, before)


@pytest.mark.parametrize(("make_bad", "says"), BAD_FILES.values(), ids=BAD_FILES.keys())
def test_a_file_that_does_not_continue_the_partition_is_refused(base, loc, stage, make_bad, says):
    schema = open_stream(loc).file_schema
    bad = make_bad(stage / "bad.arrow", schema, BASE_END, BASE_CLOCK, BASE_ARRIVAL)
    assert_refused(base, loc, [bad], CorruptLogError, match=says)
    # The writer is not stuck: a file that continues the partition is taken afterwards.
    assert base.append_segment_files([good_file(loc, stage)]) == GOOD_END
    assert committed(loc)[:2] == (GOOD_END, GOOD_CLOCK)


@pytest.mark.parametrize(("make_bad", "says"), BAD_FILES.values(), ids=BAD_FILES.keys())
def test_when_the_second_file_is_bad_the_first_is_not_committed_either(
    base, loc, stage, make_bad, says
):
    schema = open_stream(loc).file_schema
    good = good_file(loc, stage)
    bad = make_bad(stage / "bad.arrow", schema, GOOD_END, GOOD_CLOCK, GOOD_ARRIVAL)
    assert_refused(base, loc, [good, bad], CorruptLogError, match=says)
    assert os.stat(good).st_nlink == 1  # never linked
    assert base.append_segment_files([good]) == GOOD_END


def test_the_same_file_twice_is_refused_and_nothing_is_committed(base, loc, stage):
    good = good_file(loc, stage)
    assert_refused(base, loc, [good, good], CorruptLogError, match="starts at offset 2")
    assert base.append_segment_files([good]) == GOOD_END
    with pytest.raises(CorruptLogError):  # and once committed, it cannot come again
        base.append_segment_files([good])
    assert committed(loc)[:2] == (GOOD_END, GOOD_CLOCK)


# -- late rows and the end of stream ----------------------------------------------------------


def test_the_stream_created_with_order_reject_is_what_the_late_checks_below_rely_on(loc):
    assert open_stream(loc).meta.defaults.get("order") == "reject"


@pytest.mark.parametrize(
    "records",
    [
        [row(T0 + 10, BASE_CLOCK - 1, 9)],  # explicit rowtime below the clock
        [row(T0 + 10, BASE_CLOCK + 5, 8), row(T0 + 11, BASE_CLOCK - 50, 9)],
        [row(T0 + 50, None, 9)],  # implicit: its arrival T0 + 50 is below the clock T0 + 200
    ],
    ids=["explicit", "second row", "implicit"],
)
def test_under_order_reject_a_file_with_rows_below_the_partition_clock_is_late(
    base, loc, stage, records
):
    path = segment_file(stage / "late.arrow", open_stream(loc).file_schema, 2, records, BASE_CLOCK)
    assert_refused(base, loc, [path], LateRowError, match="order=reject")


def test_a_late_record_is_named_by_its_own_index_in_its_file(base, loc, stage):
    records = [row(T0 + 10, BASE_CLOCK + 5, 7), row(T0 + 11, BASE_CLOCK + 9, 8)]
    records.append(row(T0 + 12, BASE_CLOCK - 50, 9))  # the third record goes back
    path = segment_file(stage / "late.arrow", open_stream(loc).file_schema, 2, records, BASE_CLOCK)
    assert_refused(base, loc, [path], LateRowError, match=r"record 2 of segment file .*late\.arrow")


def test_a_late_second_file_leaves_the_first_uncommitted(base, loc, stage):
    good = good_file(loc, stage)
    # Above the committed clock (T0 + 200) but below the clock after the first file (T0 + 400).
    late = segment_file(
        stage / "late.arrow",
        open_stream(loc).file_schema,
        GOOD_END,
        [row(GOOD_ARRIVAL + 1, T0 + 300, 9)],
        GOOD_CLOCK,
    )
    assert_refused(base, loc, [good, late], LateRowError)
    assert os.stat(good).st_nlink == 1


@pytest.mark.parametrize("order", ["reject", "adjust"])
def test_after_end_stream_a_file_with_rows_is_refused(tmp_path, stage, order):
    loc = tmp_path / order
    stream = create_stream(loc, DDL, order=order)
    with open_writer(loc, clock=FakeClock()) as w:
        w.insert({"a": 1}, rowtime=at(T0 + 100))
        assert w.end_stream() == 2
        assert w.clock_us == END_OF_STREAM_US
        path = segment_file(
            stage / "after.arrow",
            stream.file_schema,
            2,
            [row(T0 + 1000, T0 + 5000, 9)],
            END_OF_STREAM_US,  # the footer carries the end-of-stream clock: only lateness is wrong
        )
        before = committed(loc)
        with pytest.raises(LateRowError, match="end of stream"):
            w.append_segment_files([path])
        assert (w.end_offset, w.clock_us) == (2, END_OF_STREAM_US)
        assert committed(loc) == before


def test_after_end_stream_a_file_of_bounds_only_is_refused_too(loc, stage):
    stream = open_stream(loc)
    with open_writer(loc, clock=FakeClock()) as w:
        w.insert({"a": 1}, rowtime=at(T0 + 100))
        w.end_stream()
        path = segment_file(
            stage / "after.arrow",
            stream.file_schema,
            2,
            [bound(T0 + 1000, T0 + 5000)],
            END_OF_STREAM_US,
        )
        before = committed(loc)
        with pytest.raises(BoundError, match="has a bound after the end of stream"):
            w.append_segment_files([path])
        assert committed(loc) == before


def test_a_file_with_a_bound_below_the_partition_clock_is_refused(base, loc, stage):
    path = segment_file(
        stage / "bound.arrow",
        open_stream(loc).file_schema,
        BASE_END,
        [bound(T0 + 10, BASE_CLOCK - 100)],
        BASE_CLOCK,
    )
    with pytest.raises(BoundError):
        base.set_rowtime_bound(at(BASE_CLOCK - 100))  # what the writer says to the same bound
    assert_refused(base, loc, [path], BoundError, match="below the clock")


def test_under_order_reject_a_file_whose_rows_go_back_in_time_is_late(base, loc, stage):
    path = segment_file(
        stage / "unsorted.arrow",
        open_stream(loc).file_schema,
        BASE_END,
        [row(T0 + 10, T0 + 400, 3), row(T0 + 11, T0 + 300, 4)],  # both above the clock T0+200
        BASE_CLOCK,
    )
    assert_refused(base, loc, [path], LateRowError)


def test_a_footer_without_rowtime_statistics_is_corrupt(base, loc, stage):
    path = segment_file(
        stage / "bare.arrow",
        open_stream(loc).file_schema,
        BASE_END,
        [row(T0 + 10, T0 + 300, 3)],
        BASE_CLOCK,
        max_rowtime_us=None,
    )
    assert_refused(base, loc, [path], CorruptLogError)


def test_a_footer_whose_last_arrival_is_below_the_files_arrivals_is_refused(base, loc, stage):
    path = segment_file(
        stage / "lying.arrow",
        open_stream(loc).file_schema,
        BASE_END,
        [row(T0 + 10, T0 + 300, 3), row(T0 + 20, T0 + 400, 4)],
        BASE_CLOCK,
        last_arrival_us=T0 + 10,
    )
    assert_refused(base, loc, [path], CorruptLogError, match="does not describe its records")


# -- the writer's own state -------------------------------------------------------------------


@pytest.mark.parametrize("buffered", ["insert", "insert_arrow", "set_rowtime_bound"])
def test_the_writer_refuses_while_it_has_buffered_records(base, loc, stage, buffered):
    if buffered == "insert":
        base.insert({"a": 3}, rowtime=at(T0 + 250))
    elif buffered == "insert_arrow":
        t = pa.array([T0 + 250], pa.timestamp("us", tz="UTC"))
        base.insert_arrow(pa.table({"a": pa.array([3], pa.int32()), "t": t}), "t")
    else:
        base.set_rowtime_bound(at(T0 + 250))
    good = good_file(loc, stage)
    before = committed(loc)
    with pytest.raises(UnflushedRecordsError, match="flushed"):
        base.append_segment_files([good])
    assert base.pending == 1
    assert base.end_offset == BASE_END and committed(loc) == before
    assert os.stat(good).st_nlink == 1
    # After the flush the partition continues at 3: a file for offset 2 no longer fits.
    assert base.flush() == 3
    with pytest.raises(CorruptLogError, match="continues at 3"):
        base.append_segment_files([good])


def test_a_closed_writer_refuses(loc, stage):
    w = open_writer(loc, clock=FakeClock())
    w.close()
    path = segment_file(
        stage / "f.arrow", open_stream(loc).file_schema, 0, [row(T0, T0 + 1, 1)], None
    )
    with pytest.raises(WriterClosedError):
        w.append_segment_files([path])
    assert committed(loc) == (0, None, set())


def test_inserts_bounds_and_flushes_continue_the_partition_after_an_append(loc, stage):
    stream = open_stream(loc)
    schema = stream.file_schema
    # The writer's own clock is far behind the file's arrivals: later arrivals are clamped.
    with open_writer(loc, clock=FakeClock(T0)) as w:
        f1 = segment_file(
            stage / "f1.arrow",
            schema,
            0,
            [row(T0 + 1000, T0 + 5000, 1), row(T0 + 1001, T0 + 6000, 2)],
            None,
        )
        assert w.append_segment_files([f1]) == 2
        # The clock came over from the footer: below it is late, a bound below it is refused.
        with pytest.raises(LateRowError):
            w.insert({"a": 0}, rowtime=at(T0 + 5999))
        with pytest.raises(BoundError):
            w.set_rowtime_bound(at(T0 + 5999))
        assert w.pending == 0

        w.insert({"a": 3}, rowtime=at(T0 + 7000))
        w.set_rowtime_bound(at(T0 + 8000))
        assert w.clock_us == T0 + 8000
        assert w.flush() == 4
        assert segment_names(loc) == {segment_name(0, 2), segment_name(2, 2)}

        # And a file can follow the writer's own segment.
        f2 = segment_file(stage / "f2.arrow", schema, 4, [row(T0 + 2000, T0 + 9000, 4)], T0 + 8000)
        assert w.append_segment_files([f2]) == 5
        w.insert({"a": 5}, rowtime=at(T0 + 9500))
        assert w.flush() == 6
        assert (w.end_offset, w.clock_us, w.last_arrival_us) == (6, T0 + 9500, T0 + 2000)
        assert committed(loc)[:2] == (6, T0 + 9500)

    rows = raw(loc)
    assert [r["__rowtime_us"] - T0 for r in rows] == [5000, 6000, 7000, 8000, 9000, 9500]
    assert [r["__is_bound"] for r in rows] == [False, False, False, True, False, False]
    assert [r["a"] for r in rows] == [1, 2, 3, None, 4, 5]
    assert [r["__arrival_us"] - T0 for r in rows] == [1000, 1001, 1001, 1001, 2000, 2000]
    assert read_stream(loc).column("offset").to_pylist() == list(range(6))


def test_a_segment_file_asks_the_disk_to_write_back_as_it_goes(tmp_path, monkeypatch):
    """Every WRITEBACK_BYTES written, a segment file asks the disk to start writing them back
    (``sync_file_range``, a hint, as RocksDB's ``bytes_per_sync``), so that the fsync at the
    end waits for little: the ranges follow one another from the start of the file, and the
    file reads back whole, each batch matching its checksum."""
    from pyspark_rowtime.streams import segments

    if segments._sync_file_range() is None:
        pytest.skip("this system has no sync_file_range (Linux only): the hint is left out")
    asked: list[tuple[int, int, int]] = []
    real = segments._sync_file_range()
    monkeypatch.setattr(segments, "WRITEBACK_BYTES", 1 << 16)
    monkeypatch.setattr(
        segments,
        "_sync_file_range",
        lambda: (
            lambda fd, start, n, flags: asked.append((start, n, flags)) or real(fd, start, n, flags)
        ),
    )
    n = 200_000
    rt = np.arange(n, dtype=np.int64)
    arrival = np.full(n, 7, dtype=np.int64)
    flags = np.zeros(n, dtype=np.bool_)
    stats = SegmentStats.compute(0, arrival, rt, ~flags, flags, None)
    schema = segments.segment_schema(pa.schema([("a", pa.int64())]))
    table = pa.table([arrival, rt, flags, rt * 3], schema=schema)
    path = tmp_path / "s.arrow"
    write_segment_file(str(path), stats, schema, table.to_batches(max_chunksize=10_000))
    assert len(asked) >= 10  # 4.8 MB written, a hint every 64 KiB or so
    assert asked[0][0] == 0 and all(flag == segments._SYNC_FILE_RANGE_WRITE for *_, flag in asked)
    assert all(a[0] + a[1] == b[0] for a, b in itertools.pairwise(asked))  # one after another
    assert asked[-1][0] + asked[-1][1] <= os.path.getsize(path)
    assert segments.verify_segment_file(str(path)) == (20, 0)
    assert segments.open_segment_file(str(path)).column("a").to_pylist() == (rt * 3).tolist()


_VALUES = {
    "i": (pa.int64(), st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))),
    "s": (pa.string(), st.one_of(st.none(), st.text(max_size=40))),
    "b": (pa.bool_(), st.one_of(st.none(), st.booleans())),
    "l": (pa.list_(pa.int32()), st.one_of(st.none(), st.lists(st.integers(0, 2**31 - 1)))),
    "d": (pa.float64(), st.one_of(st.none(), st.floats(allow_nan=False))),
}


@given(
    columns=st.lists(st.sampled_from(sorted(_VALUES)), min_size=1, max_size=4, unique=True),
    rows=st.integers(0, 1500),
    cut=st.tuples(st.integers(0, 1500), st.integers(0, 1500)),
    data=st.data(),
)
@settings(max_examples=40, deadline=None)
def test_the_checksum_summed_in_place_is_the_one_of_the_serialized_message(
    columns: list[str], rows: int, cut: tuple[int, int], data: Any
) -> None:
    """Readers sum a batch's message as Arrow's writer hands out its pieces (buffers where they
    are); the checksums written so far were summed over ``batch.serialize()``. They must agree
    for every batch, sliced or not, or a sound segment would read as damaged."""
    arrays = {}
    for name in columns:
        kind, values = _VALUES[name]
        drawn = data.draw(st.lists(values, min_size=min(rows, 20), max_size=min(rows, 20)))
        arrays[name] = pa.array((drawn * (rows // max(len(drawn), 1) + 1))[:rows], kind)
    batch = pa.RecordBatch.from_arrays(list(arrays.values()), names=list(arrays))
    lo, n = min(cut[0], batch.num_rows), cut[1]
    for b in (batch, batch.slice(lo, n)):
        assert checksums.batch_checksum(b) == checksums._serialized_checksum(b)

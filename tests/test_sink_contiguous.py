"""A run's rows copied into one chunk per column as they arrive (``sink.contiguous``): the
table it gives holds exactly the rows of the batches, nulls, slices and strings included."""

from __future__ import annotations

import datetime as dt
import pickle
from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_rowtime.api import read_stream
from pyspark_rowtime.sink import contiguous
from pyspark_rowtime.sink.contiguous import Contiguous
from pyspark_rowtime.sink.options import parse_sink_options
from pyspark_rowtime.sink.stream_target import StreamTarget
from pyspark_rowtime.sink.task import TaskInfo

TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema(
    [
        ("i", pa.int64()),
        ("f", pa.float32()),
        ("s", pa.string()),
        ("b", pa.large_binary()),
        ("d", pa.date32()),
        ("rowtime", TS),
    ]
)

rows_st = st.lists(
    st.tuples(
        st.none() | st.integers(-(2**63), 2**63 - 1),
        st.none() | st.floats(width=32, allow_nan=False),
        st.none() | st.text(max_size=5),
        st.none() | st.binary(max_size=4),
        st.none() | st.integers(0, 20000),
        st.integers(0, 10**15),
    ),
    max_size=9,
)


def _batch(rows: list[tuple], cut: int) -> pa.RecordBatch:
    """A batch of ``rows``, sliced from ``cut`` on (Arrow arrays with an offset)."""
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in SCHEMA]
    arrays = []
    for field, values in zip(SCHEMA, columns, strict=True):
        if field.type == pa.date32():
            values = [None if v is None else dt.date(1970, 1, 1) + dt.timedelta(v) for v in values]
        arrays.append(pa.array(list(values), type=field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA).slice(min(cut, len(rows)))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(rows_st, st.integers(0, 3)), max_size=6))
def test_the_table_holds_every_row_of_the_batches(batches):
    made = [_batch(rows, cut) for rows, cut in batches]
    dense = Contiguous.of(SCHEMA, 64, 1024)
    assert dense is not None
    for b in made:
        assert dense.add(b)
    got = dense.table()
    assert got.num_rows == sum(b.num_rows for b in made)
    assert all(c.num_chunks == 1 for c in got.columns)
    assert got.to_pylist() == pa.Table.from_batches(made, schema=SCHEMA).to_pylist()


def test_a_batch_that_does_not_fit_is_refused_whole():
    dense = Contiguous.of(SCHEMA, 3, 4)
    assert dense is not None
    row = (1, 1.0, "ab", b"x", 1, 5)
    assert dense.add(_batch([row, row], 0))  # 4 bytes of strings: full
    assert not dense.add(_batch([row], 0))  # no room for its bytes
    assert not dense.add(_batch([row, row], 0))  # nor for its rows
    assert dense.table().num_rows == 2


@pytest.mark.parametrize("other", [pa.bool_(), pa.decimal128(10, 2), pa.list_(pa.int64())])
def test_other_types_keep_their_batches(other):
    assert Contiguous.of(pa.schema([("x", other), ("rowtime", TS)]), 8, 8) is None


def test_a_system_that_refuses_the_room_keeps_the_batches():
    """Where memory is counted when allocated (strict overcommit), the run's columns may be
    refused: the task keeps Spark's batches and gathers from them."""
    with (
        mock.patch("numpy.empty", side_effect=MemoryError),
        mock.patch.object(contiguous, "_KEPT", []),
    ):
        assert Contiguous.of(SCHEMA, 1 << 20, 1 << 20) is None


def test_a_run_reuses_the_columns_of_the_run_before_once_nothing_holds_them():
    """A worker's next run fills the memory of the run before (no fresh pages from the
    system), never while a table of that run, or any array over it, is still in use."""
    rows = [(i, i / 2, f"s{i}", b"b" * (i % 3), i, 10**12 + i) for i in range(50)]
    batch = _batch(rows, 0)

    def filled() -> tuple[Contiguous, pa.Table]:
        run = Contiguous.of(batch.schema, 64, 1024)
        assert run is not None and run.add(batch)
        return run, run.table()

    def addresses(table: pa.Table) -> set[int]:
        return {b.address for c in table.columns for b in c.chunk(0).buffers() if b is not None}

    with mock.patch.object(contiguous, "_KEPT", []):
        first, table = filled()
        held = addresses(table)
        _second, other = filled()  # the first run's table is in use: new memory
        assert not held & addresses(other)
        assert other.equals(table)
        expected = table.to_pylist()
        del first, table
        _third, again = filled()  # the first run is gone: its memory again
        assert held & addresses(again)
        assert again.to_pylist() == expected
        assert other.to_pylist() == expected  # the second run, still held, untouched


SMALL = pa.schema([("id", pa.int64()), ("s", pa.string()), ("rowtime", TS)])


def _target(tmp_path) -> StreamTarget:
    """A new stream target for rows of :data:`SMALL`, claimed by query ``q``."""
    cfg = parse_sink_options(
        {"path": str(tmp_path / "t"), "checkpointLocation": str(tmp_path / "ck")}, SMALL
    )
    target = StreamTarget(cfg)
    target.prepare()
    target.state.claim("q")
    return target


@pytest.mark.parametrize(
    ("times", "order"),
    [
        # out of order from the second batch on; the strings outgrow the room later
        ([5, 3, 9, 1, 7, 2, 8], [3, 5, 1, 0, 4, 6, 2]),
        # five batches held in order, then an earlier row: the held rows do not all fit
        ([1, 2, 3, 4, 5, 0], [5, 0, 1, 2, 3, 4]),
    ],
)
def test_a_task_whose_rows_outgrow_the_run_keeps_them_as_batches(tmp_path, times, order):
    """Rows out of order go into one chunk per column (held rows in order too, once a row
    comes out of order); when their strings outgrow the room the task keeps the rest as
    batches and sorts every row (sink.stream_target)."""
    from pyspark_rowtime.sink import stream_target

    target = _target(tmp_path)
    batches = [
        pa.RecordBatch.from_arrays(
            [pa.array([i]), pa.array(["x" * 4 * i]), pa.array([t * 1000], pa.int64()).cast(TS)],
            schema=SMALL,
        )
        for i, t in enumerate(times)
    ]
    with (  # runs of 8 bytes, and room for 16 bytes of strings
        mock.patch.object(stream_target, "SORT_BYTES", 8),
        mock.patch.object(stream_target, "_SLACK_BYTES", 8),
    ):
        report = target.write(TaskInfo(0, 0, 0, "q"), iter(batches))
    target.commit(pickle.loads(pickle.dumps([report])), 0, None)
    t = read_stream(target.cfg.location)
    assert t.column("id").to_pylist() == order
    assert t.column("s").to_pylist() == ["x" * 4 * i for i in order]
    assert t.column("rowtime").cast(pa.int64()).to_pylist() == [t * 1000 for t in sorted(times)]


def test_a_batch_copied_into_the_run_is_let_go(tmp_path):
    """Once rows come out of order each batch is copied and let go whole (its rowtimes too):
    a task holds its run once, not Spark's batches beside it, so each batch Spark sends can
    reuse the memory of the one before (issue 35)."""
    target = _target(tmp_path)
    rows, n = 1000, 200
    held: list[int] = []

    def batches():  # each a fresh batch in Arrow's memory, as read from Spark's stream
        for k in range(n):
            first = (n - k) * rows  # each batch earlier than the one before
            batch = pa.RecordBatch.from_arrays(
                [
                    pa.array(range(first, first + rows), pa.int64()),
                    pa.array([f"w{i % 7}" for i in range(rows)]),
                    pa.array(range(first, first + rows), pa.int64()).cast(TS),
                ],
                schema=SMALL,
            )
            yield pa.ipc.read_record_batch(batch.serialize(), SMALL)
            held.append(pa.total_allocated_bytes())

    base = pa.total_allocated_bytes()
    report = target.write(TaskInfo(0, 0, 0, "q"), batches())
    one = 24 * rows  # about one batch
    assert max(held) - base < 8 * one, (max(held) - base, n * one)
    target.commit(pickle.loads(pickle.dumps([report])), 0, None)
    t = read_stream(target.cfg.location)
    assert t.column("id").to_pylist() == sorted(range(rows, (n + 1) * rows))

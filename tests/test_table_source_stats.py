"""A table's micro-batches planned from its data files' statistics (``TableLog.ordered_times``):
the same micro-batches, rows and errors as planning from the time column read, and the column
read where the statistics cannot be trusted. Tables written by delta-rs and pyiceberg and
files by pyarrow; nothing is mocked (a source is made to read the column by handing its log
the table's files without their footers)."""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from table_builders import delta_commit, iceberg_catalog_env, make_delta_target
from test_table_source import HOUR_US, T0_US, UTC_US, records, rows_of

from pyspark_rowtime.bounds.errors import InvalidRowtimeError, LateRowError
from pyspark_rowtime.bounds.time import TimeFormat
from pyspark_rowtime.datasource.ordered import OrderedTimes, RangeTimes
from pyspark_rowtime.datasource.table_log import DataFile, _file_range
from pyspark_rowtime.datasource.table_source import TableSource, parse_table_options

deltalake = pytest.importorskip("deltalake", reason="the delta extra is not installed")


class WithoutFooters:
    """A table's files that can only be read whole: the log then reads the time column."""

    def __init__(self, files: Any) -> None:
        self.files = files

    def read(self, file: DataFile, columns: Sequence[str], schema: pa.Schema) -> pa.Table:
        return self.files.read(file, columns, schema)


class CountingReads:
    """A table's files, counting the reads of their rows (footers are not counted)."""

    def __init__(self, files: Any) -> None:
        self.files, self.reads = files, 0

    def read(self, file: DataFile, columns: Sequence[str], schema: pa.Schema) -> pa.Table:
        self.reads += 1
        return self.files.read(file, columns, schema)

    def footer(self, file: DataFile) -> pq.FileMetaData:
        return self.files.footer(file)


def drain(path: str, wrap: Any = None, **options: Any) -> tuple[Any, Any]:
    """(every micro-batch's records, or the error that stopped the query; the source)."""
    read = parse_table_options({"path": path, **options})
    source = TableSource(read)
    if wrap is not None:
        source.log.files = wrap(source.log.files)
    cap = int(options.get("maxRowsPerBatch", 1 << 24))
    start, batches = source.initial_offset(), []
    try:
        while (end := source.latest_offset(start, cap)) != start:
            tasks = source.tasks(start, end, source.runs_for(start, end))
            batches.append((end, records(read, tasks)))
            source.commit(end)
            start = end
    except (LateRowError, InvalidRowtimeError) as e:
        return (type(e).__name__, str(e)), source
    return batches, source


def append(path: str, times: Sequence[int], first_k: int, hour: bool = False) -> None:
    """A commit by delta-rs' own writer (statistics in the log and in the footer); ``hour``:
    into the sink's table, with its partition column."""
    columns = {
        "k": pa.array(range(first_k, first_k + len(times)), pa.int64()),
        "rowtime": pa.array(list(times), UTC_US),
    }
    if hour:
        hours = pa.array(list(times), UTC_US).cast(pa.timestamp("us"))
        columns["rowtime_hour"] = pc.strftime(hours, "%Y-%m-%dT%H")
    parts = ["rowtime_hour"] if hour else None
    deltalake.write_deltalake(path, pa.table(columns), mode="append", partition_by=parts)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**32 - 1),
    order=st.sampled_from(["reject", "drop", "adjust"]),
    cap=st.sampled_from([2, 5, 1 << 24]),
)
def test_planning_from_statistics_gives_the_same_micro_batches_as_reading_the_times(
    tmp_path_factory, seed, order, cap
):
    # sink commits with clocks, and a second writer's commits that may go back in time
    rnd = random.Random(seed)
    path = make_delta_target(tmp_path_factory.mktemp("t") / "table")
    low, k = T0_US, 0
    for batch in range(rnd.randrange(2, 5)):
        times = sorted(low + rnd.randrange(2 * HOUR_US) for _ in range(rnd.randrange(0, 6)))
        rows = [(k + i, t) for i, t in enumerate(times)]
        if rnd.random() < 0.5:
            rnd.shuffle(rows)  # a commit's rows come in any order
        k += len(rows)
        clock = rnd.choice([None, max(times, default=low)])
        delta_commit(path, rows, clock, batch)
        if rnd.random() < 0.5:
            back = rnd.randrange(-HOUR_US, HOUR_US)  # maybe below the clock
            append(path, [max(times, default=low) + back], k, hour=True)
            k += 1
        low = max(times, default=low)
    options = {"table": "delta", "order": order, "maxRowsPerBatch": str(cap)}
    if order == "adjust":
        options["adjust.range"] = str(HOUR_US // 2)  # in adjust.unit, 1 us
    from_stats, _ = drain(path, **options)
    from_column, _ = drain(path, WithoutFooters, **options)
    assert from_stats == from_column


def test_an_in_order_table_is_planned_from_its_footers_alone(tmp_path):
    path = str(tmp_path / "t")
    for v in range(4):
        append(path, [T0_US + v * HOUR_US + i for i in range(3)], 3 * v)
    batches, source = drain(path, CountingReads, table="delta")
    assert source.log.files.reads == 0  # the driver read no row
    assert [k for _, b in batches for k, _ in rows_of([b])] == list(range(12))
    # a micro-batch cut inside a version (maxRowsPerBatch) reads that version's times
    batches, source = drain(path, CountingReads, table="delta", maxRowsPerBatch="2")
    assert [k for _, b in batches for k, _ in rows_of([b])] == list(range(12))
    assert 0 < source.log.files.reads <= 4


def test_a_row_back_in_time_within_a_millisecond_is_late(tmp_path):
    # delta-rs cuts a timestamp's statistics in the log to milliseconds: version 0's maximum
    # (T0 + 1.9 ms) and version 1's minimum (T0 + 1.5 ms) both say T0 + 1 ms there, as if in
    # order. The footers' are exact: the versions are read as out of order.
    path = str(tmp_path / "t")
    append(path, [T0_US + 1000, T0_US + 1900], 0)
    append(path, [T0_US + 1500], 2)
    stats = pa.table(deltalake.DeltaTable(path).get_add_actions(flatten=True)).to_pydict()
    assert sorted(stats["min.rowtime"])[-1] == sorted(stats["max.rowtime"])[0]  # as if in order
    error, _ = drain(path, table="delta")  # order=reject: a row that goes back is an error
    assert error[0] == "LateRowError" and "row 0 of version 1" in error[1]
    batches, _ = drain(path, table="delta", order="drop")  # the row is dropped
    assert [rows_of([b]) for _, b in batches] == [[(0, T0_US + 1000), (1, T0_US + 1900)]]
    assert batches == drain(path, WithoutFooters, table="delta", order="drop")[0]


def test_a_null_rowtime_fails_the_planning_naming_its_file_as_when_read(tmp_path):
    path = str(tmp_path / "t")
    append(path, [T0_US], 0)
    data = pa.table(
        {"k": pa.array([1, 2], pa.int64()), "rowtime": pa.array([T0_US + 1, None], UTC_US)}
    )
    deltalake.write_deltalake(path, data, mode="append")
    error, _ = drain(path, table="delta")
    assert error == drain(path, WithoutFooters, table="delta")[0]
    assert error[0] == "InvalidRowtimeError" and "version 1, file part-" in error[1]


def test_an_iceberg_table_pyiceberg_appended_to_is_planned_from_its_footers(monkeypatch, tmp_path):
    iceberg_catalog_env(monkeypatch, tmp_path / "iceberg")
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("local")
    catalog.create_namespace("db")
    schema = pa.schema([("k", pa.int64()), ("at", UTC_US)])
    table = catalog.create_table("db.events", schema=schema)
    for v in range(3):
        times = [T0_US + v * HOUR_US + 7 * i for i in range(3)]
        table.append(
            pa.table({"k": range(3 * v, 3 * v + 3), "at": pa.array(times, UTC_US)}, schema)
        )
    options = {"rowtime.column": "at"}
    batches, source = drain("iceberg://local/db.events", CountingReads, **options)
    assert source.log.files.reads == 0
    assert batches == drain("iceberg://local/db.events", WithoutFooters, **options)[0]
    assert [k for _, b in batches for k, _ in rows_of([b])] == list(range(9))


def footer_of(tmp_path: Path, table: pa.Table, **write: Any) -> pq.FileMetaData:
    path = tmp_path / f"f{len(list(tmp_path.iterdir()))}.parquet"
    pq.write_table(table, path, row_group_size=3, **write)
    return pq.read_metadata(path)


def test_only_statistics_certain_to_be_the_extremes_are_used(tmp_path):
    times = [T0_US + 9, T0_US + 1, T0_US + 5, T0_US + 3, T0_US + 7]  # 2 row groups
    utc = pa.field("rowtime", UTC_US)
    fmt, what = TimeFormat(), "rowtime"

    def extremes(table: pa.Table, field: pa.Field = utc, **write: Any) -> Any:
        return _file_range(footer_of(tmp_path, table, **write), table.num_rows, field, fmt, what)

    ts = pa.table({"rowtime": pa.array(times, UTC_US)})
    assert extremes(ts) == (T0_US + 1, T0_US + 9)
    other_zone = pa.table({"rowtime": pa.array(times, pa.timestamp("us", tz="+01:00"))})
    assert extremes(other_zone) == (T0_US + 1, T0_US + 9)  # the same instants
    assert extremes(ts, write_statistics=False) is None
    with_null = pa.table({"rowtime": pa.array([*times, None], UTC_US)})
    assert extremes(with_null) is None  # reading it raises the reader's error
    naive = pa.table({"rowtime": pa.array(times, pa.timestamp("us"))})
    assert extremes(naive, pa.field("rowtime", pa.timestamp("us"))) is None  # rowtime.tz
    assert extremes(naive) is None  # a cast the read would make
    ms = pa.table({"rowtime": pa.array([t // 1000 for t in times], pa.timestamp("ms", tz="UTC"))})
    assert extremes(ms) is None
    int96 = extremes(ts, use_deprecated_int96_timestamps=True)
    assert int96 is None
    ms_unit = pa.field("at", pa.int64())
    ints = pa.table({"at": pa.array([t // 1000 for t in times], pa.int64())})
    got = _file_range(footer_of(tmp_path, ints), 5, ms_unit, TimeFormat(unit="ms"), what)
    assert got == ((T0_US + 1) // 1000 * 1000, (T0_US + 9) // 1000 * 1000)
    strings = pa.table({"at": pa.array([str(t) for t in times])})
    assert (
        _file_range(footer_of(tmp_path, strings), 5, pa.field("at", pa.string()), fmt, what) is None
    )
    assert _file_range(footer_of(tmp_path, ts), 6, utc, fmt, what) is None  # not the log's rows


@settings(max_examples=60, deadline=None)
@given(
    pieces=st.lists(
        st.lists(st.integers(0, 30), min_size=1, max_size=6).map(sorted), min_size=1, max_size=5
    ),
    ranged=st.lists(st.booleans(), min_size=5, max_size=5),
    probes=st.lists(st.integers(-2, 32), min_size=1, max_size=8),
)
def test_times_known_by_their_range_answer_as_the_times_themselves(pieces, ranged, probes):
    # pieces that ascend one after the other, some known only by their first and last time
    lifted, at = [], 0
    for p in pieces:
        lifted.append([at + x for x in p])
        at = lifted[-1][-1]
    arrays = [np.array(p, dtype=np.int64) for p in lifted]
    mixed = [
        RangeTimes(len(a), int(a[0]), int(a[-1]), load=functools.partial(np.copy, a)) if r else a
        for a, r in zip(arrays, ranged, strict=False)
    ]
    whole, known = OrderedTimes(arrays), OrderedTimes(mixed)
    flat = np.concatenate(arrays)
    for v in probes:
        for side in ("left", "right"):
            assert known.searchsorted(v, side) == whole.searchsorted(v, side)
            assert known.searchsorted(v, side) == int(np.searchsorted(flat, v, side=side))
    for i in range(len(flat)):
        assert known.at(i) == int(flat[i])

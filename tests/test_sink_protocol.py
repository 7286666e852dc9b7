"""The sink's two-phase commit, driven directly the way Spark drives it (no Spark here).

``write()`` stages one task's rows; ``commit(reports, batch_id, clock)`` publishes a batch.
A *crash* is simulated by raising at the n-th filesystem publish step (``os.rename``,
``os.replace``, ``os.link``: every rename of a staged file, manifest entry, intent, marker,
clock file and log segment), or, for a stream target on Redis, at the n-th write of the sink's
state or atomic append, so every point between two durable steps is reached; a *restart*
then replays the batch as Spark does (same batch id, same rows, new task attempts).

Stream targets run on every backend (``at``: a folder, a stream on a real Redis server,
``tests/redis_server.py``, or on moto's S3 server, ``tests/objstore_servers.py``), the same
test for each; Parquet targets in a folder and on object storage (moto's S3 and Azurite).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis_server import RedisServer, redis_server
from sink_helpers import HOUR, SCHEMA, T0, TS, make, published_parquet, records, run

from pyspark_rowtime.api import read_stream
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.bounds.errors import (
    InvalidRowtimeError,
    LateRowError,
    OptionError,
    SchemaError,
)
from pyspark_rowtime.sink.layout import MANIFEST_KEEP, SINK_DIR
from pyspark_rowtime.sink.parquet_target import (
    COMPLETE_MARKER,
    ParquetTarget,
    describe_parquet_target,
    is_parquet_target,
    parquet_clock_us,
    partition_name,
)
from pyspark_rowtime.sink.stream_target import StreamTarget
from pyspark_rowtime.sink.task import TaskInfo, TaskReport
from pyspark_rowtime.streams.objstore.files import ObjectTargetFiles
from pyspark_rowtime.streams.objstore.log import ObjectAppender
from pyspark_rowtime.streams.objstore.sink import ObjectSinkState
from pyspark_rowtime.streams.redis.appender import RedisAppender
from pyspark_rowtime.streams.redis.sink import RedisSinkState
from pyspark_rowtime.streams.storage import LocationKind, open_stream, what_is_at

_names = iter(range(10**6))


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis"), appendonly=True) as server:
        yield server


@pytest.fixture(params=["log", "redis", "s3"])
def at(request: pytest.FixtureRequest) -> str | None:
    """Where a stream target goes: None for a folder under the test's tmp_path, else a fresh
    stream location on the test Redis server or on moto's S3 server (objstore_servers.py)."""
    if request.param == "log":
        return None
    if request.param == "s3":
        return str(request.getfixturevalue("s3_server").url("target"))
    server = request.getfixturevalue("redis")
    return str(server.url(f"target-{next(_names)}"))


def data_rows(target: StreamTarget | ParquetTarget) -> list[tuple[int, int]]:
    """(id, rowtime_us) of every published data row: log order for a stream, sorted for
    Parquet."""
    location = target.cfg.location
    if isinstance(target, StreamTarget):
        if what_is_at(location).kind is not LocationKind.STREAM:
            return []  # created by the first commit
        t = read_stream(location)
        t = t.filter(pa.compute.invert(t.column("is_bound")))
        return list(
            zip(
                t.column("id").to_pylist(),
                t.column("rowtime").cast(pa.int64()).to_pylist(),
                strict=True,
            )
        )
    t = parquet_table(target)
    if t is None:
        return []
    return sorted(
        zip(
            t.column("id").to_pylist(),
            t.column("rowtime").cast(pa.int64()).to_pylist(),
            strict=True,
        )
    )


def parquet_table(target: ParquetTarget) -> pa.Table | None:
    """Every published Parquet file of the target (not its staging), as one table."""
    t = published_parquet(target.cfg.location)
    return None if t is None else t.select(["id", "rowtime"])


def marked_complete(target: ParquetTarget, key: int) -> bool:
    return target.files.exists(f"{partition_name(key, target.cfg.granularity)}/{COMPLETE_MARKER}")


def clock(target: StreamTarget | ParquetTarget) -> int | None:
    return target.clock_us()


class Crash(BaseException):
    """A simulated SIGKILL: nothing after it runs (BaseException: no handler swallows it)."""


#: The durable steps of a stream target on Redis or object storage: the sink state's writes
#: and the appends (commits).
_REDIS_STEPS = {
    RedisSinkState: ("replace_entry", "put_entry_once", "prune", "drop_staging"),
    RedisAppender: ("_append",),
    ObjectSinkState: ("replace_entry", "put_entry_once", "prune", "drop_staging"),
    ObjectAppender: ("_commit_runs",),
    ObjectTargetFiles: ("publish", "create_json", "advance_json"),
}


@contextmanager
def crash_at(n: int | None) -> Iterator[list[int]]:
    """Raise :class:`Crash` instead of the ``n``-th (0-based) rename, replace or link, or
    write of a Redis target's state or append (a test uses one backend)."""
    calls = [0]
    originals = {name: getattr(os, name) for name in ("rename", "replace", "link")}

    def wrap(name: str, original):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            if calls[0] == n:
                calls[0] += 1
                raise Crash(f"{name} {args}")
            calls[0] += 1
            return original(*args, **kwargs)

        return call

    with contextlib.ExitStack() as stack:
        stack.enter_context(
            mock.patch.multiple(os, **{name: wrap(name, f) for name, f in originals.items()})
        )
        for cls, names in _REDIS_STEPS.items():
            for name in names:
                stack.enter_context(
                    mock.patch.object(
                        cls, name, autospec=True, side_effect=wrap(name, getattr(cls, name))
                    )
                )
        yield calls


#: Kinds of target: a stream in a folder, Parquet files, a stream on Redis, a stream on S3,
#: Parquet files on S3 and on Azure Blob.
TARGETS = ["stream", "parquet", "redis", "s3", "parquet-s3", "parquet-az"]


@pytest.fixture(scope="module")
def make_kind(redis: RedisServer, s3_server, az_server):  # type: ignore[no-untyped-def]
    """``make_kind(root, kind, **options)``: :func:`make` for a kind of :data:`TARGETS`."""

    def build(root: Path, kind: str, **options: str) -> StreamTarget | ParquetTarget:
        if kind == "redis":
            return make(root, "stream", location=redis.url(f"target-{next(_names)}"), **options)
        if kind == "s3":
            return make(root, "stream", location=s3_server.url("target"), **options)
        if kind == "parquet-s3":
            return make(root, "parquet", location=s3_server.url("pq"), **options)
        if kind == "parquet-az":
            return make(root, "parquet", location=az_server.url("pq"), **options)
        return make(root, kind, **options)

    return build


# -- the plain path ------------------------------------------------------------------------------


def test_a_stream_target_gets_a_partition_per_task_and_links_the_staged_runs(tmp_path, at):
    target = make(tmp_path, "stream", location=at)
    run(
        target,
        0,
        [
            [records([(1, T0 + 10), (3, T0 + 30)])],
            [records([(2, T0 + 20)], bound=T0 + 40)],
        ],
    )
    t = read_stream(target.cfg.location)
    assert t.column("partition").to_pylist() == [0, 0, 0, 1, 1]
    assert t.column("id").to_pylist() == [1, 3, None, 2, None]
    assert t.column("is_bound").to_pylist() == [False, False, True, False, True]
    assert clock(target) == T0 + 40
    entry = target.state.entry(0)
    assert [part["mode"] for part in entry["parts"]] == ["link", "link"]  # nothing copied
    run(target, 1, [[records([(4, T0 + 50)])], [records([(5, T0 + 45)], bound=T0 + 60)]])
    assert [part["mode"] for part in target.state.entry(1)["parts"]] == ["link", "link"]
    assert data_rows(target) == [
        (1, T0 + 10),
        (3, T0 + 30),
        (4, T0 + 50),
        (2, T0 + 20),
        (5, T0 + 45),
    ]
    assert clock(target) == T0 + 60


def test_rows_of_several_tasks_for_one_partition_are_merged_in_rowtime_order(tmp_path, at):
    target = make(tmp_path, "stream", location=at, partitions="1")
    run(
        target,
        0,
        [
            [records([(1, T0 + 30), (3, T0 + 10)])],  # a task's rows out of order are sorted
            [records([(2, T0 + 20)], bound=T0 + 40)],
        ],
    )
    t = read_stream(target.cfg.location)
    assert t.column("is_bound").to_pylist() == [False, False, False, True]
    assert t.column("id").to_pylist() == [3, 2, 1, None]
    assert t.column("rowtime").cast(pa.int64()).to_pylist() == [T0 + 10, T0 + 20, T0 + 30, T0 + 40]
    assert clock(target) == T0 + 40
    assert [part["mode"] for part in target.state.entry(0)["parts"]] == ["merge"]
    assert len(open_stream(target.cfg.location).partition_stats(0)) == 1


def test_a_task_whose_partition_moved_past_its_rows_goes_to_the_lowest_partition(tmp_path, at):
    target = make(tmp_path, "stream", location=at)
    run(target, 0, [[records([(1, T0 + 50)])], [records([(2, T0 + 10)], bound=T0 + 20)]])
    # partition 0's clock is T0 + 50 (its row), partition 1's T0 + 20 (the bound): a row at
    # T0 + 30 keeps the target's promise (its clock is T0 + 20) but cannot follow in partition 0
    run(target, 1, [[records([(3, T0 + 30)])], [records([])]])
    t = read_stream(target.cfg.location)
    data = t.filter(pa.compute.invert(t.column("is_bound")))
    ids, partitions = data.column("id").to_pylist(), data.column("partition").to_pylist()
    where = dict(zip(ids, partitions, strict=True))
    assert where == {1: 0, 2: 1, 3: 1}


def test_more_tasks_than_partitions_share_them(tmp_path, at):
    target = make(tmp_path, "stream", location=at, partitions="2")
    run(target, 0, [[records([(i, T0 + i)])] for i in range(5)])
    t = read_stream(target.cfg.location)
    assert t.column("partition").to_pylist() == [0, 0, 0, 1, 1]
    assert t.column("id").to_pylist() == [0, 2, 4, 1, 3]
    modes = {part["partition"]: part["mode"] for part in target.state.entry(0)["parts"]}
    assert modes == {0: "merge", 1: "merge"}


def test_large_tasks_stage_several_runs_that_become_consecutive_segments(tmp_path, at):
    from pyspark_rowtime.sink import stream_target

    target = make(tmp_path, "stream", location=at)
    batches = [records([(i, T0 + i)]) for i in range(7)]
    with mock.patch.object(stream_target, "RUN_ROWS", 3):
        reports = run(target, 0, [batches])
    assert [f.rows for f in reports[0].files] == [3, 3, 1]
    assert len(open_stream(target.cfg.location).partition_stats(0)) == 3
    assert data_rows(target) == [(i, T0 + i) for i in range(7)]


@pytest.mark.parametrize(
    ("times", "mode", "segments"),
    [
        # runs [10 20 30] [20 40 50] [0 60], each out of order: kept aside, merged by the task
        ([30, 10, 20, 50, 20, 40, 60, 0], "link", 3),
        # [10 20 30] out of order and kept aside; [40 50 60] in order, kept beside it
        ([30, 10, 20, 40, 50, 60, 5, 0], "link", 3),
        # [10 20 30] came in order and was staged; then [5 20 50] [0 40], earlier than it
        ([10, 20, 30, 20, 5, 50, 40, 0], "merge", 1),
    ],
)
def test_a_task_whose_rows_come_out_of_order_stages_runs_that_continue_one_another(
    tmp_path, at, times, mode, segments
):
    """Rows reaching one task out of order in more runs than one (here runs of 3): each run
    is sorted and kept aside in Spark's local folder, and the task merges them (ties in the
    order the rows came) into pieces that continue one another, so the commit links them: the
    driver copies no row (issue 35). A run staged before rows earlier than it came cannot be
    taken back: then the task's runs overlap and the commit merges them into one segment. The
    task's local files are gone when it ends, the staged runs once the batch is published."""
    from pyspark_rowtime.sink import stream_target

    target = make(tmp_path, "stream", location=at)
    batches = [records([(i, T0 + t)]) for i, t in enumerate(times)]
    spills = tmp_path / "local"
    spills.mkdir()
    with (
        mock.patch.object(stream_target, "RUN_ROWS", 3),
        mock.patch.dict(os.environ, {"SPARK_LOCAL_DIRS": str(spills)}),
    ):
        report = target.write(TaskInfo(0, 0, 0, "q1"), iter(batches))
    assert [(f.rows, f.first) for f in report.files] == [(3, 0), (3, 3), (2, 6)]
    assert report.ordered == (mode == "link")
    assert list(spills.iterdir()) == []
    target.state.claim("q1")
    target.commit([report], 0, None)
    assert [part["mode"] for part in target.state.entry(0)["parts"]] == [mode]
    expected = sorted(enumerate(times), key=lambda r: r[1])  # stable: ties as they came
    assert data_rows(target) == [(i, T0 + t) for i, t in expected]
    assert len(open_stream(target.cfg.location).partition_stats(0)) == segments
    assert target.state.staged() == []


def test_a_stream_target_is_created_by_the_first_commit_with_the_payload_columns(tmp_path, at):
    target = make(tmp_path, "stream", location=at)
    assert clock(target) is None
    run(target, 0, [[records([])], [records([])], [records([])]])
    stream = open_stream(target.cfg.location)
    assert stream.meta.payload_schema.names == ["id"]
    assert stream.meta.partitions == 3  # one per write task of the first batch


def _watermark_run(tmp_path, at, stateful: bool) -> tuple[StreamTarget, list[TaskReport]]:
    """Batch 0 of a clock=watermark query whose two tasks write rows that interleave in rowtime;
    a stateful query's checkpoint has Spark's ``state`` folder by then."""
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    if stateful:
        (checkpoint / "state" / "0").mkdir(parents=True)
    target = make(
        tmp_path, "stream", location=at, clock="watermark", checkpointLocation=str(checkpoint)
    )
    assert isinstance(target, StreamTarget)
    assert what_is_at(target.cfg.location).kind is LocationKind.PENDING_STREAM_TARGET
    tasks = [[records([(1, T0 + 10), (3, T0 + 30)])], [records([(2, T0 + 20), (4, T0 + 40)])]]
    return target, run(target, 0, tasks)


def test_a_watermark_clock_gives_a_pass_through_query_a_partition_per_task(tmp_path, at):
    """A query that keeps no state (its checkpoint has no ``state`` folder) writes its rows as
    its tasks hold them, one partition each, linked: the driver reads no row (issue 35)."""
    target, _ = _watermark_run(tmp_path, at, stateful=False)
    stream = open_stream(target.cfg.location)
    assert stream.meta.partitions == 2
    entry = target.state.entry(0)
    assert entry is not None
    assert [part["mode"] for part in entry["parts"]] == ["link", "link"]
    t = read_stream(target.cfg.location)
    assert t.column("id").to_pylist() == [1, 3, 2, 4]  # partition 0, then partition 1


def test_a_watermark_clock_gives_a_stateful_query_one_ordered_partition(tmp_path, at):
    """Windows, deduplication and joins come from Spark's shuffle tasks: their results are one
    stream in rowtime order, the tasks' rows merged by the commit."""
    target, _ = _watermark_run(tmp_path, at, stateful=True)
    assert open_stream(target.cfg.location).meta.partitions == 1
    entry = target.state.entry(0)
    assert entry is not None
    assert [part["mode"] for part in entry["parts"]] == ["merge"]
    assert read_stream(target.cfg.location).column("id").to_pylist() == [1, 2, 3, 4]


def test_a_bound_below_the_rows_of_its_batch_adds_no_bound_record(tmp_path, at):
    target = make(tmp_path, "stream", location=at)
    run(target, 0, [[records([(1, T0 + 50)], bound=T0 + 40)]])
    t = read_stream(target.cfg.location)
    assert t.column("is_bound").to_pylist() == [False]
    assert clock(target) == T0 + 50  # the log's clock: a row implies its own bound


@pytest.fixture(params=["folder", "s3", "az"])
def pq_at(request: pytest.FixtureRequest) -> str | None:
    """Where a Parquet target goes: None for a folder under the test's tmp_path, else a fresh
    location on moto's S3 server or on Azurite (objstore_servers.py)."""
    if request.param == "folder":
        return None
    return str(request.getfixturevalue(f"{request.param}_server").url("pq"))


def test_parquet_files_are_partitioned_by_hour_and_complete_hours_are_marked(tmp_path, pq_at):
    target = make(tmp_path, "parquet", location=pq_at)
    assert isinstance(target, ParquetTarget)
    run(target, 0, [[records([(1, T0 + 5), (2, T0 + HOUR + 5)], bound=T0 + HOUR)]])
    first, second = partition_name(T0 // HOUR, "hour"), partition_name(T0 // HOUR + 1, "hour")
    assert first == "rowtime_hour=2023-11-14T22"
    assert marked_complete(target, T0 // HOUR)
    assert not marked_complete(target, T0 // HOUR + 1)
    names = [n for n in target.files.list("") if not n.startswith(SINK_DIR)]
    assert [n.split("/")[0] for n in names] == [first, first, second]  # file, marker; file
    assert data_rows(target) == [(1, T0 + 5), (2, T0 + HOUR + 5)]
    location = target.cfg.location
    assert parquet_clock_us(location) == T0 + HOUR
    assert is_parquet_target(location) and not is_parquet_target(str(tmp_path))

    run(target, 1, [[records([], bound=T0 + 2 * HOUR)]])
    assert marked_complete(target, T0 // HOUR + 1)
    assert clock(target) == T0 + 2 * HOUR
    assert not target.state.staged()  # published files leave the staging area
    info = describe_parquet_target(location)  # what `rowtime describe` prints
    assert info["partitions"] == [
        {"partition": first, "files": 1, "complete": True},
        {"partition": second, "files": 1, "complete": True},
    ]
    assert (info["last_batch"], info["clock_us"], info["query_id"]) == (1, T0 + 2 * HOUR, "q1")


def test_the_parquet_files_hold_the_payload_and_rowtime_in_utc(tmp_path, pq_at):
    target = make(tmp_path, "parquet", location=pq_at)
    assert isinstance(target, ParquetTarget)
    run(target, 0, [[records([(1, T0 + 5)])]])
    t = parquet_table(target)
    assert t is not None and t.schema.field("rowtime").type == TS
    if pq_at is None:
        (path,) = Path(target.cfg.location).glob("rowtime_hour=*/*.parquet")
        import pyarrow.parquet as pq

        assert pq.read_schema(path).names == ["id", "rowtime"]


@pytest.mark.parametrize(
    ("key_us", "granularity", "name"),
    [
        (T0, "hour", "rowtime_hour=2023-11-14T22"),
        (T0 + 59 * 60_000_000, "minute", "rowtime_minute=2023-11-14T2259"),
        (T0, "day", "rowtime_day=2023-11-14"),
        (-1, "hour", "rowtime_hour=1969-12-31T23"),  # floor, not truncation toward zero
        (-62_135_596_800_000_000, "day", "rowtime_day=0001-01-01"),
    ],
)
def test_a_time_partition_is_named_by_its_start_floored_to_the_granularity(
    key_us, granularity, name
):
    from pyspark_rowtime.sink.options import GRANULARITY_US

    assert partition_name(key_us // GRANULARITY_US[granularity], granularity) == name


def test_end_of_stream_completes_every_partition_with_data(tmp_path, pq_at):
    target = make(tmp_path, "parquet", location=pq_at, granularity="minute")
    assert isinstance(target, ParquetTarget)
    run(target, 0, [[records([(i, T0 + i * 60_000_000) for i in range(5)])]])
    assert not any(marked_complete(target, T0 // 60_000_000 + i) for i in range(5))
    run(target, 1, [[records([], bound=END_OF_STREAM_US)]])
    assert all(marked_complete(target, T0 // 60_000_000 + i) for i in range(5))
    markers = [n for n in target.files.list("") if n.endswith("/" + COMPLETE_MARKER)]
    assert len(markers) == 5
    assert clock(target) == END_OF_STREAM_US


# -- exactly once --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", TARGETS)
def test_a_replayed_batch_is_a_no_op(tmp_path, kind, make_kind):
    target = make_kind(tmp_path, kind)
    batch = [[records([(1, T0 + 1), (2, T0 + 2)], bound=T0 + 3)]]
    run(target, 0, batch)
    before = data_rows(target), clock(target)
    reports = run(target, 0, batch, attempt=0)  # Spark restarted and re-ran batch 0
    assert all(r.skipped for r in reports)
    assert (data_rows(target), clock(target)) == before
    assert not target.state.staged()


@pytest.mark.parametrize("kind", TARGETS)
def test_a_replay_whose_tasks_ran_before_the_commit_is_still_published_once(
    tmp_path, kind, make_kind
):
    target = make_kind(tmp_path, kind)
    batch = [[records([(1, T0 + 1)], bound=T0 + 3)]]
    lost = [target.write(TaskInfo(0, 0, 0, "q1"), iter(batch[0]))]  # driver died after write
    assert lost[0].files
    run(target, 0, batch)
    run(target, 0, batch)
    assert data_rows(target) == [(1, T0 + 1)]
    assert not target.state.staged()  # the lost attempt is cleaned


@pytest.mark.parametrize("kind", TARGETS)
def test_abort_removes_what_was_staged(tmp_path, kind, make_kind):
    target = make_kind(tmp_path, kind)
    reports = [target.write(TaskInfo(0, 0, 0, "q1"), iter([records([(1, T0 + 1)])]))]
    staged = [reports[0].files[0].staged]
    if isinstance(target, ParquetTarget):
        assert target.files.exists(staged[0]) and target.state.staged()
        target.abort([*reports, None], 0)
        assert not target.files.exists(staged[0]) and not target.state.staged()
        assert data_rows(target) == []
        return
    assert not target.state.missing_staged(staged)
    target.abort([*reports, None], 0)
    assert target.state.missing_staged(staged) == staged
    assert data_rows(target) == []


@pytest.mark.parametrize("kind", TARGETS)
def test_abort_after_a_commit_keeps_the_batch(tmp_path, kind, make_kind):
    target = make_kind(tmp_path, kind)
    reports = run(target, 0, [[records([(1, T0 + 1)], bound=T0 + 2)]])
    target.abort(reports, 0)
    assert data_rows(target) == [(1, T0 + 1)]


@pytest.mark.parametrize("published", [0, 1])  # staged files published before the crash
def test_parquet_crash_after_the_manifest_entry_is_rolled_forward(tmp_path, pq_at, published):
    target = make(tmp_path, "parquet", location=pq_at)
    assert isinstance(target, ParquetTarget)
    batch = [[records([(1, T0 + 1)])], [records([(2, T0 + HOUR + 1)], bound=T0 + HOUR)]]
    # calls: 0 = the manifest entry (link, or a conditional create), 1.. = the staged files'
    # renames (or copies)
    with crash_at(1 + published), pytest.raises(Crash):
        run(target, 0, batch)
    assert target.state.entry(0) is not None  # committed ...
    assert clock(target) is None  # ... but not yet published: the clock still says nothing
    run(target, 0, batch)  # the restart replays batch 0: roll forward, then a no-op
    assert data_rows(target) == [(1, T0 + 1), (2, T0 + HOUR + 1)]
    assert clock(target) == T0 + HOUR
    assert marked_complete(target, T0 // HOUR)
    assert not target.state.staged()


def test_parquet_crash_before_the_manifest_entry_publishes_nothing(tmp_path, pq_at):
    target = make(tmp_path, "parquet", location=pq_at)
    batch = [[records([(1, T0 + 1)], bound=T0 + 2)]]
    with crash_at(0), pytest.raises(Crash):
        run(target, 0, batch)
    assert target.state.entry(0) is None
    assert data_rows(target) == [] and clock(target) is None
    run(target, 0, batch)
    assert data_rows(target) == [(1, T0 + 1)]


def test_stream_crash_between_intent_and_append_is_redone(tmp_path, at):
    target = make(tmp_path, "stream", location=at, partitions="1")
    run(target, 0, [[records([], bound=T0)]])
    batch = [[records([(1, T0 + 1), (2, T0 + 2)])], [records([(3, T0 + 1)], bound=T0 + 3)]]
    # calls: 0 = the intent (replace), 1 = the merged segment (link)
    with crash_at(1), pytest.raises(Crash):
        run(target, 1, batch)
    assert target.state.entry(1) is not None and data_rows(target) == []
    reports = run(target, 1, batch)
    assert all(r.skipped for r in reports)  # the replay carries out the intent's plan
    assert data_rows(target) == [(1, T0 + 1), (3, T0 + 1), (2, T0 + 2)]
    assert clock(target) == T0 + 3


def test_stream_crash_between_linked_runs_finishes_the_rest(tmp_path):
    from pyspark_rowtime.sink import stream_target

    target = make(tmp_path, "stream")
    run(target, 0, [[records([], bound=T0)]])
    batch = [[records([(i, T0 + i)]) for i in range(1, 6)] + [records([], bound=T0 + 9)]]
    # calls: 0 = the intent, 1-3 = the three runs (links), 4 = the bound's segment
    with mock.patch.object(stream_target, "RUN_ROWS", 2):
        with crash_at(3), pytest.raises(Crash):
            run(target, 1, batch)
        assert data_rows(target) == [(1, T0 + 1), (2, T0 + 2), (3, T0 + 3), (4, T0 + 4)]
        assert clock(target) == T0 + 4  # a prefix: the clock is its last row
        run(target, 1, batch)
    assert data_rows(target) == [(i, T0 + i) for i in range(1, 6)]
    assert clock(target) == T0 + 9


def test_stream_crash_after_the_append_is_not_repeated(tmp_path, at):
    target = make(tmp_path, "stream", location=at)
    batch = [[records([(1, T0 + 1)], bound=T0 + 3)]]
    with mock.patch.object(type(target.state), "prune", side_effect=Crash("after append")):
        with pytest.raises(Crash):
            run(target, 0, batch)
    assert data_rows(target) == [(1, T0 + 1)]
    run(target, 0, batch)
    assert data_rows(target) == [(1, T0 + 1)]
    assert clock(target) == T0 + 3


@pytest.mark.parametrize("partitions", ["1", "2"])  # merge, link
def test_stream_target_written_by_another_writer_meanwhile_is_reported(tmp_path, partitions, at):
    from pyspark_rowtime.api import open_writer
    from pyspark_rowtime.bounds.errors import CorruptLogError

    target = make(tmp_path, "stream", location=at, partitions=partitions)
    run(target, 0, [[records([], bound=T0)]])
    batch = [[records([(1, T0 + 1), (2, T0 + 2)])]]
    with crash_at(1), pytest.raises(Crash):
        run(target, 1, batch)
    with open_writer(target.cfg.location) as w:
        w.insert({"id": 9}, rowtime=(T0 + 5) // 1000)
    with pytest.raises(CorruptLogError, match="written by the query alone"):
        run(target, 1, batch)


def test_a_new_target_takes_option_partitions_and_an_existing_one_keeps_its_own(tmp_path, at):
    target = make(tmp_path, "stream", location=at, partitions="3")
    run(target, 0, [[records([(1, T0)])]])
    assert open_stream(target.cfg.location).meta.partitions == 3
    make(tmp_path, "stream", location=at)  # without the option: fine
    with pytest.raises(OptionError, match="partitions=2 is for a new target"):
        make(tmp_path, "stream", location=at, partitions="2")


# -- the clock's promise -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", TARGETS)
def test_a_row_below_the_clock_fails_the_task_and_stages_nothing(tmp_path, kind, make_kind):
    target = make_kind(tmp_path, kind)
    run(target, 0, [[records([(1, T0 + 10)], bound=T0 + 20)]])
    with pytest.raises(LateRowError, match="below the target's clock"):
        target.write(TaskInfo(1, 0, 0, "q1"), iter([records([(2, T0 + 19)])]))
    assert not target.state.staged()
    run(target, 1, [[records([(2, T0 + 20)])]])  # at the clock is fine
    assert (2, T0 + 20) in data_rows(target)


@pytest.mark.parametrize("kind", TARGETS)
def test_a_data_row_without_rowtime_is_refused(tmp_path, kind, make_kind):
    target = make_kind(tmp_path, kind)
    bad = pa.RecordBatch.from_arrays(
        [pa.array([1], pa.int64()), pa.array([None], TS), pa.array([False])], schema=SCHEMA
    )
    with pytest.raises(InvalidRowtimeError, match="null rowtime"):
        target.write(TaskInfo(0, 0, 0, "q1"), iter([bad]))


def test_parquet_batches_that_change_nothing_leave_no_manifest_entry(tmp_path, pq_at):
    target = make(tmp_path, "parquet", location=pq_at)
    run(target, 0, [[records([], bound=T0)]])
    run(target, 1, [[records([])]])
    run(target, 2, [[records([], bound=T0)]])
    assert target.state.batches() == [0]


def test_the_manifest_keeps_only_the_batches_spark_can_replay(tmp_path):
    target = make(tmp_path, "parquet")
    for b in range(MANIFEST_KEEP + 5):
        run(target, b, [[records([], bound=T0 + b)]])
    assert target.state.batches() == list(range(5, MANIFEST_KEEP + 5))


@pytest.mark.parametrize("kind", TARGETS)
def test_another_query_cannot_write_a_target_it_does_not_own(tmp_path, kind, make_kind):
    target = make_kind(tmp_path, kind, owner=None)
    run(target, 0, [[records([(1, T0)])]], query_id="first")
    with pytest.raises(OptionError, match="written by another streaming query"):
        run(target, 0, [[records([(1, T0)])]], query_id="second")


# -- existing targets ----------------------------------------------------------------------------


def test_an_existing_stream_with_other_columns_is_refused(tmp_path, at):
    from pyspark_rowtime.api import create_stream

    create_stream(at or tmp_path / "target", "name STRING")
    with pytest.raises(SchemaError, match="cannot take this query's rows"):
        make(tmp_path, "stream", location=at)


def test_an_existing_stream_with_nullable_columns_takes_the_rows(tmp_path, at):
    from pyspark_rowtime.api import create_stream

    create_stream(at or tmp_path / "target", "id BIGINT")
    target = make(tmp_path, "stream", location=at)
    run(target, 0, [[records([(1, T0)])]])
    assert data_rows(target) == [(1, T0)]


def test_a_parquet_target_keeps_its_granularity(tmp_path, pq_at):
    make(tmp_path, "parquet", location=pq_at)
    with pytest.raises(OptionError, match="granularity"):
        make(tmp_path, "parquet", location=pq_at, granularity="day")


def test_a_parquet_file_whose_upload_never_finished_is_not_there(object_server, tmp_path):
    """A task killed while writing leaves nothing a reader of the target would take: on an
    object store, an upload that never completed is no object at all."""
    target = make(tmp_path, "parquet", location=object_server.url("pq"))
    assert isinstance(target, ParquetTarget)
    name = f"{SINK_DIR}/staging/00000000000000000000/t/part.parquet"
    out = target.files.open_output(name)
    out.write(b"x" * (20 << 20))  # past one part: a multipart upload is under way
    assert not target.files.exists(name)
    del out  # the task dies without finishing it
    assert not target.files.exists(name)
    assert target.files.list(f"{SINK_DIR}/staging") == []


@pytest.mark.parametrize(("first", "second"), [("stream", "parquet"), ("parquet", "stream")])
def test_one_kind_of_target_cannot_be_written_as_the_other(tmp_path, first, second):
    make(tmp_path, first)
    with pytest.raises(OptionError, match="choose another path"):
        make(tmp_path, second)


# -- a property: whatever the crashes, exactly once and a clock that never goes back -----------

batch_plan = st.lists(
    st.tuples(
        st.lists(st.lists(st.integers(0, 3 * HOUR), max_size=4), min_size=1, max_size=3),
        st.one_of(st.none(), st.integers(0, 3 * HOUR)),  # the bound's step past the clock
        st.one_of(st.none(), st.integers(0, 8)),  # where the first run of the batch crashes
        st.booleans(),  # whether the first run also lost its tasks' reports
    ),
    min_size=1,
    max_size=6,
)


#: A fifth of the profile's examples (tests/conftest.py): each one runs a whole sequence of
#: batches over every kind of target, a second a case on a loaded machine. CI draws 20 (new ones
#: each run), ./dev long 400.
CRASH_EXAMPLES = max(10, settings.default.max_examples // 5)


@settings(max_examples=CRASH_EXAMPLES, deadline=None)
@given(kind=st.sampled_from(TARGETS), plan=batch_plan)
def test_exactly_once_and_a_monotone_clock_whatever_the_crashes(make_kind, kind, plan):
    from pyspark_rowtime.sink import stream_target

    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(stream_target, "RUN_ROWS", 2):
        target = make_kind(Path(tmp), kind)
        expected: list[tuple[int, int]] = []
        clock_now = T0
        final_bound = None
        next_id = 0
        samples: list[int | None] = []
        for batch_id, (tasks_offsets, bound_step, crash, lose) in enumerate(plan):
            tasks = []
            for offsets in tasks_offsets:
                rows = []
                for off in offsets:
                    rows.append((next_id, clock_now + off))
                    next_id += 1
                tasks.append(rows)
            top = max([t for rows in tasks for _, t in rows], default=clock_now)
            bound = None if bound_step is None else top + bound_step
            # A batch a row (task 0's bound with its last row, as before), in runs of at most
            # two rows: a task's rows out of order overlap from run to run, and its commit
            # merges them (one task or several).
            batches = []
            for i, rows in enumerate(tasks):
                b = bound if i == 0 else None
                last = len(rows) - 1
                batch = [records([r], b if k == last else None) for k, r in enumerate(rows)]
                batches.append(batch or [records([], b)])
            if lose:
                target.write(TaskInfo(batch_id, 0, 0, "q1"), iter(batches[0]))
            if crash is not None:
                try:
                    with crash_at(crash):
                        run(target, batch_id, batches)
                except Crash:
                    pass
                samples.append(clock(target))
            run(target, batch_id, batches)  # the (re)run that completes
            samples.append(clock(target))
            run(target, batch_id, batches)  # and a replay for good measure
            samples.append(clock(target))
            expected += [r for rows in tasks for r in rows]
            if bound is not None:
                final_bound = bound if final_bound is None else max(final_bound, bound)
            clock_now = max(top, bound if bound is not None else top)
        got = data_rows(target)
        assert sorted(got) == sorted(expected)  # no row lost, none doubled
        if not kind.startswith("parquet"):
            t = read_stream(target.cfg.location)
            for p in set(t.column("partition").to_pylist()):
                times = t.filter(pa.compute.equal(t.column("partition"), p)).column("rowtime")
                ordered = times.cast(pa.int64()).to_pylist()
                assert ordered == sorted(ordered)  # each partition in rowtime order
        present = [s for s in samples if s is not None]
        assert present == sorted(present)  # the clock never went back
        if kind.startswith("parquet"):
            assert clock(target) == final_bound
            for key in {t // HOUR for _, t in expected}:
                marked = marked_complete(target, key)
                assert marked == (final_bound is not None and (key + 1) * HOUR <= final_bound)
        assert not target.state.staged()


def test_a_redis_target_before_its_first_commit_is_a_pending_stream_target(tmp_path, make_kind):
    target = make_kind(tmp_path, "redis")  # the query started; no batch committed yet
    location = target.cfg.location
    assert what_is_at(location).kind is LocationKind.PENDING_STREAM_TARGET
    assert target.state.read_target()["kind"] == "stream"
    run(target, 0, [[records([(1, T0 + 1)], bound=T0 + 2)]])
    assert what_is_at(location).kind is LocationKind.STREAM
    assert data_rows(target) == [(1, T0 + 1)] and clock(target) == T0 + 2

"""The commit's merge of a shared partition (``sink.merge``): the tasks' runs merged into rowtime
order, staged as runs that continue the partition, named by the intent and linked; driven the
way Spark drives the sink (no Spark here), on a folder."""

from __future__ import annotations

import os
from unittest import mock

import pyarrow as pa
import pytest
from sink_helpers import T0, make, records, run

from pyspark_rowtime.api import read_stream
from pyspark_rowtime.sink import layout, merge, stream_target
from pyspark_rowtime.sink.task import TaskInfo
from pyspark_rowtime.streams.segments import verify_segment_file
from pyspark_rowtime.streams.storage import open_stream


def rows_of(target) -> list[tuple[int | None, int, bool]]:  # type: ignore[no-untyped-def]
    t = read_stream(target.cfg.location)
    return list(
        zip(
            t.column("id").to_pylist(),
            t.column("rowtime").cast(pa.int64()).to_pylist(),
            t.column("is_bound").to_pylist(),
            strict=True,
        )
    )


def two_tasks(n: int, bound: int | None = None) -> list[list[pa.RecordBatch]]:
    """Two tasks whose rows interleave in rowtime: ids 0, 2, ... at T0 + 0, 2, ... and ids
    1, 3, ... at T0 + 1, 3, ..., a batch of 2 rows at a time; task 0 sends the bound."""
    tasks = []
    for k in range(2):
        ids = list(range(k, n, 2))
        batches = [records([(i, T0 + i) for i in ids[s : s + 2]]) for s in range(0, len(ids), 2)]
        if k == 0 and bound is not None:
            batches.append(records([], bound=bound))
        tasks.append(batches)
    return tasks


def test_ties_across_the_rowtime_ranges_keep_the_order_of_the_tasks(tmp_path, small_runs):
    """Rows of one rowtime fall in one range, whatever the cuts: a stable merge, task 0's
    rows before task 1's."""
    target = make(tmp_path, "stream", partitions="1")
    times = [0, 1, 1, 1, 1, 1, 2, 3]
    tasks = [[records([(k * 100 + i, T0 + t)]) for i, t in enumerate(times)] for k in range(2)]
    run(target, 0, tasks)
    got = [(r[1] - T0, r[0]) for r in rows_of(target)]
    want = sorted(((t, k * 100 + i) for k in range(2) for i, t in enumerate(times)))
    assert got == want  # by rowtime, then task, then the order in the task
    stats = open_stream(target.cfg.location).partition_stats(0)
    assert sum(s.rows for s in stats) == 16 and len(stats) > 1


@pytest.fixture
def small_runs():  # type: ignore[no-untyped-def]
    """Runs of at most 4 rows, and a merge split into runs from 1 row on."""
    with (
        mock.patch.object(stream_target, "RUN_ROWS", 4),
        mock.patch.object(merge, "SPLIT_ROWS", 1),
    ):
        yield


def test_a_merged_part_is_staged_as_runs_that_continue_the_partition_and_is_linked(
    tmp_path, small_runs
):
    target = make(tmp_path, "stream", partitions="1")
    run(target, 0, [[records([], bound=T0)]])
    run(target, 1, two_tasks(10, bound=T0 + 20))
    part = target.state.entry(1)["parts"][0]
    assert part["mode"] == "merge" and len(part["files"]) == 4  # two runs a task
    # the merged runs, three rowtime ranges (each merged on a thread): every row once, the
    # bound the last record of the last
    assert [rows for _, rows in part["merged"]] == [3, 3, 5]
    assert rows_of(target) == [
        (None, T0, True),
        *((i, T0 + i, False) for i in range(10)),
        (None, T0 + 20, True),
    ]
    stats = open_stream(target.cfg.location).partition_stats(0)
    assert [(s.first, s.count, s.bounds) for s in stats] == [
        (0, 1, 1),
        (1, 3, 0),
        (4, 3, 0),
        (7, 5, 1),
    ]
    assert [s.clock_us for s in stats] == [T0, T0 + 2, T0 + 5, T0 + 20]
    folder = open_stream(target.cfg.location).partition_dir(0)
    segments = sorted(n for n in os.listdir(folder) if n.endswith(".arrow"))
    assert len(segments) == 4
    for name in segments:
        checked, unchecked = verify_segment_file(os.path.join(folder, name))
        assert checked >= 1 and unchecked == 0  # every batch carries its checksum
    assert target.state.staged() == []


def test_a_crash_between_the_merged_runs_leaves_a_prefix_and_the_replay_finishes(
    tmp_path, small_runs
):
    from test_sink_protocol import Crash, crash_at

    target = make(tmp_path, "stream", partitions="1")
    run(target, 0, [[records([], bound=T0)]])
    batch = two_tasks(10, bound=T0 + 20)
    # renames and links: 0 = the intent, 1 and 2 = the first two merged runs, 3 = the third
    with crash_at(3), pytest.raises(Crash):
        run(target, 1, batch)
    assert [r[0] for r in rows_of(target)] == [None, *range(6)]
    assert target.clock_us() == T0 + 5  # a prefix: its last row
    reports = run(target, 1, batch)
    assert all(r.skipped for r in reports)  # the intent's merged runs, not a new merge
    assert [r[0] for r in rows_of(target)] == [None, *range(10), None]
    assert target.clock_us() == T0 + 20
    run(target, 1, batch)  # a replay of a finished batch appends nothing
    assert len(rows_of(target)) == 12


def test_a_crash_before_the_intent_leaves_nothing_and_the_batch_runs_again(tmp_path, small_runs):
    from test_sink_protocol import Crash

    target = make(tmp_path, "stream", partitions="1")
    run(target, 0, [[records([], bound=T0)]])
    batch = two_tasks(10, bound=T0 + 20)
    with (
        mock.patch.object(type(target.state), "replace_entry", side_effect=Crash("intent")),
        pytest.raises(Crash),
    ):
        run(target, 1, batch)
    assert target.state.entry(1) is None and len(rows_of(target)) == 1
    run(target, 1, batch, attempt=1)  # Spark runs the tasks again
    assert [r[0] for r in rows_of(target)] == [None, *range(10), None]
    assert target.state.staged() == []


def test_tasks_of_a_one_partition_folder_target_leave_their_runs_to_the_page_cache(tmp_path):
    """The commit merges their rows and writes them again, durably: the tasks' runs need not
    reach the disk. A task whose runs the commit links (it alone had rows) has them synced
    before the intent names them."""
    target = make(tmp_path, "stream", partitions="1")
    synced: list[str] = []
    real = layout.fsync_file

    def spy(path: str) -> None:
        synced.append(path)
        real(path)

    with mock.patch.object(layout, "fsync_file", spy):
        report = target.write(TaskInfo(0, 0, 0, "q1"), iter([records([(1, T0 + 1)])]))
        assert not report.synced and synced == []
        target.state.claim("q1")
        target.commit([report], 0, None)
    assert target.state.entry(0)["parts"][0]["mode"] == "link"
    assert [os.path.basename(p) for p in synced] == [os.path.basename(report.files[0].staged)]
    assert [r[0] for r in rows_of(target)] == [1]
    # a target of more partitions: its tasks' runs are linked as they are, synced by the task
    wide = make(tmp_path / "wide", "stream", partitions="2")
    assert wide.write(TaskInfo(0, 0, 0, "q1"), iter([records([(1, T0 + 1)])])).synced


def test_an_intent_of_an_earlier_version_is_merged_when_it_is_replayed(tmp_path):
    """0.2.0 wrote a merge's intent without its merged runs and merged when it applied it: a
    replay of such an intent by this version merges, then links."""
    target = make(tmp_path, "stream", partitions="1")
    run(target, 0, [[records([], bound=T0)]])
    batch = two_tasks(6, bound=T0 + 9)
    reports = [target.write(TaskInfo(1, k, 0, "q1"), iter(b)) for k, b in enumerate(batch)]
    stream = open_stream(target.cfg.location)
    from pyspark_rowtime.streams.writer import Writer

    with Writer(stream, 0) as w:
        entry = target._plan([w], reports, 1, T0 + 9)
    assert entry is not None and not entry.parts[0].merged
    target.state.replace_entry(1, entry.to_dict())  # as the earlier version left it
    run(target, 1, batch)
    assert [r[0] for r in rows_of(target)] == [None, *range(6), None]
    assert target.state.entry(1)["parts"][0]["merged"]
    assert target.clock_us() == T0 + 9

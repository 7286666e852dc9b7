"""Delta tables read as rowtime streams (``datasource.table_source``), without Spark: the
source driven one Spark call at a time, over tables written with delta-rs (as the sink lays
them out, tests/table_builders.py, and by ``write_deltalake``), checked against brute force.
Nothing is mocked: the tables are real, and so are their logs and files."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from table_builders import delta_commit, make_delta_target

from pyspark_rowtime.bounds.errors import LateRowError, OffsetError, OptionError
from pyspark_rowtime.datasource.table_delta import TableChangeError
from pyspark_rowtime.datasource.table_source import (
    TableSource,
    parse_table_options,
    read_table_task,
)
from pyspark_rowtime.streams.retention import DataLossError

deltalake = pytest.importorskip("deltalake", reason="the delta extra is not installed")

MINUTE_US = 60_000_000
HOUR_US = 60 * MINUTE_US
T0_US = 1_700_000_000_000_000 - 1_700_000_000_000_000 % HOUR_US
UTC_US = pa.timestamp("us", tz="UTC")


def records(read: Any, tasks: list[Any]) -> list[dict[str, Any]]:
    """What the tasks emit, as dicts (rowtime in microseconds)."""
    out = []
    for task in tasks:
        for batch in read_table_task(read, task, read.output):
            t = batch.to_pydict()
            t["rowtime"] = batch.column("rowtime").cast(pa.int64()).to_pylist()
            out += [dict(zip(t, row, strict=True)) for row in zip(*t.values(), strict=True)]
    return out


def stream(path: str, **options: Any) -> tuple[Any, list[list[dict[str, Any]]]]:
    """Every micro-batch a streaming query reads now (``maxRowsPerBatch`` as the step cap, as
    Spark 4.2 passes it), each batch's records; and the source, for more."""
    read = parse_table_options({"path": path, "table": "delta", **options})
    source = TableSource(read)
    start = source.initial_offset()
    cap = int(options.get("maxRowsPerBatch", 1 << 24))
    batches = []
    while True:
        end = source.latest_offset(start, cap)
        if end == start:
            return (source, start), batches
        batches.append(records(read, source.tasks(start, end, source.runs_for(start, end))))
        source.commit(end)
        start = end


def rows_of(batches: list[list[dict[str, Any]]]) -> list[tuple[int, int]]:
    return [(r["k"], r["rowtime"]) for b in batches for r in b if not r["is_bound"]]


def bounds_of(batches: list[list[dict[str, Any]]]) -> list[int]:
    return [r["rowtime"] for b in batches for r in b if r["is_bound"]]


def sink_table(tmp_path: Path, commits: list[tuple[list[tuple[int, int]], int | None]]) -> str:
    path = make_delta_target(tmp_path / "table")
    for batch, (rows, clock) in enumerate(commits):
        delta_commit(path, rows, clock, batch)
    return path


def test_a_sink_table_reads_each_row_once_in_rowtime_order_with_its_clock_as_bounds(tmp_path):
    commits = [
        ([(1, T0_US + 30), (2, T0_US + 10), (3, T0_US + HOUR_US + 5)], T0_US + HOUR_US + 5),
        ([], T0_US + 2 * HOUR_US),  # a commit that only moves the clock
        ([(4, T0_US + 2 * HOUR_US), (5, T0_US + 3 * HOUR_US)], T0_US + 3 * HOUR_US),
    ]
    path = sink_table(tmp_path, commits)
    _, batches = stream(path)
    rows = rows_of(batches)
    assert sorted(rows) == sorted(r for rs, _ in commits for r in rs)
    assert [t for _, t in rows] == sorted(t for _, t in rows)
    assert bounds_of(batches)[-1] == T0_US + 3 * HOUR_US
    # the columns: the table's, its rowtime as the reader's, and is_bound
    assert set(batches[0][0]) == {"k", "rowtime_hour", "rowtime", "is_bound"}


def test_a_clock_only_commit_is_a_micro_batch_of_one_bound_record(tmp_path):
    path = sink_table(tmp_path, [([(1, T0_US)], T0_US + 1)])
    (source, start), batches = stream(path)
    assert bounds_of(batches) == [T0_US + 1]
    delta_commit(path, [], T0_US + HOUR_US, batch=1)  # the upstream went quiet: clock only
    end = source.latest_offset(start, 1 << 24)
    assert end != start
    got = records(source.read_cfg, source.tasks(start, end, source.runs_for(start, end)))
    assert [(r["is_bound"], r["rowtime"]) for r in got] == [(True, T0_US + HOUR_US)]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.integers(0, 12), min_size=1, max_size=6),
    cap=st.integers(1, 9),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_cap_reads_the_same_rows_as_brute_force_and_a_batch_read(
    tmp_path_factory, sizes, cap, seed
):
    # brute force: commit by commit, each commit's rows in rowtime order, every row once
    rnd = random.Random(seed)
    tmp = tmp_path_factory.mktemp("t")
    commits = []
    low, k = T0_US, 0
    for n in sizes:
        rows = [(k + i, low + rnd.randrange(3 * HOUR_US)) for i in range(n)]
        k += n
        clock = max([t for _, t in rows], default=low)
        commits.append((rows, clock))
        low = clock
    path = sink_table(tmp, commits)
    _, batches = stream(path, maxRowsPerBatch=str(cap))
    expected = [r for rows, _ in commits for r in sorted(rows, key=lambda r: r[1])]
    got = rows_of(batches)
    assert sorted(got) == sorted(expected)
    assert [t for _, t in got] == sorted(t for _, t in got)  # in rowtime order throughout
    assert all(sum(not r["is_bound"] for r in b) <= cap for b in batches)
    read = parse_table_options({"path": path, "table": "delta"})
    whole = records(read, TableSource(read).batch_tasks())
    assert sorted((r["k"], r["rowtime"]) for r in whole if not r["is_bound"]) == sorted(expected)


def test_a_replay_after_a_restart_reads_the_same_records(tmp_path):
    commits = [([(i, T0_US + (i * 7 % 10) * MINUTE_US + b * HOUR_US) for i in range(10)],
                T0_US + (b + 1) * HOUR_US) for b in range(3)]  # fmt: skip
    path = sink_table(tmp_path, commits)
    read = parse_table_options({"path": path, "table": "delta", "maxRowsPerBatch": "4"})
    source = TableSource(read)
    start = source.initial_offset()
    steps = []
    for _ in range(4):
        end = source.latest_offset(start, 4)
        steps.append(
            (start, end, records(read, source.tasks(start, end, source.runs_for(start, end))))
        )
        start = end
    # a new driver (the query restarted): each step from the checkpoint's offsets, JSON and all
    for start, end, got in steps:
        again = TableSource(read)
        s, e = json.loads(json.dumps(start)), json.loads(json.dumps(end))
        assert records(read, again.tasks(s, e, None)) == got


def test_each_micro_batch_reads_only_the_new_commit_files(tmp_path):
    path = sink_table(tmp_path, [([(i, T0_US + i)], T0_US + i + 1) for i in range(30)])
    (source, start), _ = stream(path)
    seen: list[str] = []
    text = source.versions._text

    def counted(name: str) -> str | None:
        seen.append(name)
        return text(name)

    source.versions._text = counted  # type: ignore[method-assign]
    delta_commit(path, [(99, T0_US + 99)], T0_US + 100, batch=30)
    end = source.latest_offset(start, 1 << 24)
    assert end != start
    # the new version's commit file, and the one after it (not there yet): no history
    assert seen == [f"{31:020d}.json", f"{32:020d}.json", "_last_checkpoint"]


def test_a_compaction_and_a_checkpoint_read_as_nothing(tmp_path):
    path = sink_table(tmp_path, [([(1, T0_US), (2, T0_US + 1)], T0_US + 2)])
    delta_commit(path, [(3, T0_US + 3)], T0_US + 4, batch=1)
    (source, start), _ = stream(path)
    table = deltalake.DeltaTable(path)
    table.optimize.compact()
    table.create_checkpoint()
    assert source.latest_offset(start, 1 << 24) == start  # nothing new
    delta_commit(path, [(4, T0_US + 5)], T0_US + 6, batch=2)
    end = source.latest_offset(start, 1 << 24)
    got = records(source.read_cfg, source.tasks(start, end, source.runs_for(start, end)))
    assert [(r["k"], r["is_bound"]) for r in got] == [(4, False), (None, True)]


def test_a_delete_fails_naming_its_version_unless_change_commits_are_skipped(tmp_path):
    path = sink_table(tmp_path, [([(1, T0_US), (2, T0_US + 1)], T0_US + 2)])
    deltalake.DeltaTable(path).delete("k = 1")  # version 2
    delta_commit(path, [(3, T0_US + 3)], T0_US + 4, batch=1)
    with pytest.raises(TableChangeError, match=r"version 2 changes rows.*skipChangeCommits=true"):
        stream(path)
    _, batches = stream(path, skipChangeCommits="true")
    assert [k for k, _ in rows_of(batches)] == [1, 2, 3]


def test_a_schema_change_fails_naming_the_column(tmp_path):
    path = str(tmp_path / "t")
    data = pa.table({"k": pa.array([1], pa.int64()), "ts": pa.array([T0_US], UTC_US)})
    deltalake.write_deltalake(path, data)
    read = parse_table_options({"path": path, "table": "delta", "rowtime.column": "ts"})
    source = TableSource(read)
    start = source.initial_offset()
    wider = data.append_column("extra", pa.array(["x"]))
    deltalake.write_deltalake(path, wider, mode="append", schema_mode="merge")
    with pytest.raises(TableChangeError, match=r"version 1 changes the table's schema.*'extra'"):
        source.latest_offset(start, 1 << 24)


def test_another_writers_table_needs_rowtime_column_and_reads_numbers_in_its_unit(tmp_path):
    path = str(tmp_path / "t")
    ms = T0_US // 1000
    data = pa.table(
        {"k": pa.array([1, 2], pa.int64()), "at_ms": pa.array([ms + 5, ms], pa.int64())}
    )
    deltalake.write_deltalake(path, data)
    with pytest.raises(OptionError, match=r"no column 'rowtime'.*rowtime\.column"):
        parse_table_options({"path": path, "table": "delta"})
    _, batches = stream(path, **{"rowtime.column": "at_ms", "rowtime.unit": "ms"})
    assert rows_of(batches) == [(2, T0_US), (1, T0_US + 5000)]
    assert [r["at_ms"] for r in batches[0] if not r["is_bound"]] == [ms, ms + 5]


def test_a_late_row_is_an_error_naming_its_version_under_reject_and_quarantined_under_drop(
    tmp_path,
):
    path = sink_table(tmp_path, [([(1, T0_US + HOUR_US)], T0_US + HOUR_US)])
    delta_commit(path, [(2, T0_US)], T0_US + HOUR_US, batch=1)  # below the clock read
    with pytest.raises(LateRowError, match="row 0 of version 2"):
        stream(path)
    _, batches = stream(path, order="drop")
    assert [k for k, _ in rows_of(batches)] == [1]
    read = parse_table_options(
        {"path": path, "table": "delta", "order": "drop", "output": "discarded"}
    )
    quarantine = records(read, TableSource(read).batch_tasks())
    assert [(r["k"], r["reason"]) for r in quarantine] == [(2, "below_rowtime_bound")]


def test_files_per_trigger_admit_whole_versions(tmp_path):
    # each commit: two files (its rows in two hours); one file per trigger takes one version
    commits = [
        ([(i, T0_US + 2 * i * HOUR_US), (i + 100, T0_US + (2 * i + 1) * HOUR_US)], None)
        for i in range(4)
    ]
    path = sink_table(tmp_path, commits)
    assert all(len(deltalake.DeltaTable(path, version=v + 1).get_add_actions()) == 2 * (v + 1)
               for v in range(4))  # fmt: skip
    _, batches = stream(path, maxFilesPerTrigger="1")
    assert [sorted(k for k, _ in rows_of([b])) for b in batches] == [[i, i + 100] for i in range(4)]


def test_a_checkpoint_of_another_table_is_refused(tmp_path):
    a = sink_table(tmp_path / "a", [([(1, T0_US)], T0_US)])
    b = sink_table(tmp_path / "b", [([(1, T0_US)], T0_US)])
    ra = parse_table_options({"path": a, "table": "delta"})
    rb = parse_table_options({"path": b, "table": "delta"})
    start = TableSource(ra).initial_offset()
    with pytest.raises(OffsetError, match="new checkpointLocation"):
        TableSource(rb).latest_offset(start, 10)


def test_versions_the_logs_clean_up_removed_follow_fail_on_data_loss(tmp_path):
    path = str(tmp_path / "t")
    retention = {"delta.logRetentionDuration": "interval 0 seconds"}
    ms = T0_US // 1000

    def append(k: int) -> None:
        data = pa.table({"k": pa.array([k], pa.int64()), "at": pa.array([ms + k], pa.int64())})
        deltalake.write_deltalake(path, data, mode="append", configuration=retention)

    append(0)
    options = {"rowtime.column": "at"}
    (source, start), batches = stream(path, **options)
    assert [k for k, _ in rows_of(batches)] == [0]
    for k in range(1, 5):
        append(k)
    table = deltalake.DeltaTable(path)
    table.create_checkpoint()  # at version 4
    append(5)
    deltalake.DeltaTable(path).cleanup_metadata()  # versions 1 to 3 are gone from the log
    with pytest.raises(DataLossError, match=r"version 1 is needed.*failOnDataLoss=false"):
        source.latest_offset(start, 1 << 24)
    lossy = TableSource(parse_table_options({"path": path, "table": "delta", **options,
                                             "failOnDataLoss": "false"}))  # fmt: skip
    end = lossy.latest_offset(start, 1 << 24)
    got = records(lossy.read_cfg, lossy.tasks(start, end, lossy.runs_for(start, end)))
    assert [r["k"] for r in got if not r["is_bound"]] == [4, 5]
    assert lossy.progress()["skipped_versions"] == 3


def test_the_readers_page_lists_exactly_the_table_options():
    from test_readme_options import table_names

    from pyspark_rowtime.datasource.table_source import TABLE_OPTIONS

    names = table_names("reader.md", "| table option | accepts |")
    assert {n.lower() for n in names} == set(TABLE_OPTIONS)


def test_a_second_writers_appends_between_micro_batches_are_data_judged_by_the_policy(tmp_path):
    path = sink_table(tmp_path, [([(1, T0_US + 10)], T0_US + 20)])
    (_, start), batches = stream(path, order="drop")
    hour = pa.array(["2023-11-14T22"] * 2)
    other = pa.table(
        {
            "k": pa.array([50, 51], pa.int64()),
            "rowtime": pa.array([T0_US + 5, T0_US + 30], UTC_US),  # one below the clock read
            "rowtime_hour": hour,
        }
    )
    deltalake.write_deltalake(path, other, mode="append", partition_by=["rowtime_hour"])
    delta_commit(path, [(2, T0_US + 40)], T0_US + 50, batch=1)
    read = parse_table_options({"path": path, "table": "delta", "order": "drop"})
    again = TableSource(read)
    more = []
    while (end := again.latest_offset(start, 1 << 24)) != start:
        more.append(records(read, again.tasks(start, end, again.runs_for(start, end))))
        start = end
    assert [k for k, _ in rows_of(batches + more)] == [1, 51, 2]  # 50 was late: discarded
    quarantine = parse_table_options(
        {"path": path, "table": "delta", "order": "drop", "output": "discarded"}
    )
    assert [r["k"] for r in records(quarantine, TableSource(quarantine).batch_tasks())] == [50]


def test_a_table_on_object_storage_reads_as_on_a_folder(object_server):
    # moto's S3 and Azurite: delta-rs writes the table, the reader reads its log and files
    # through delta-rs' object store, with the standard variables the servers set
    path = object_server.url("delta")
    for rows in ([(1, 20), (2, 10)], [(3, 30)]):
        data = pa.table(
            {
                "k": pa.array([k for k, _ in rows], pa.int64()),
                "rowtime": pa.array([T0_US + m for _, m in rows], UTC_US),
            }
        )
        deltalake.write_deltalake(path, data, mode="append")
    _, batches = stream(path)
    assert rows_of(batches) == [(2, T0_US + 10), (1, T0_US + 20), (3, T0_US + 30)]

"""Time for tables without a clock of their own (``bounds.lateness``, ``idle.timeout``), and a
clock that a writer moved back or that vanished: the table source driven one Spark call at a
time over Delta tables that delta-rs' ``write_deltalake`` wrote (another application, no
clock), checked against brute force and against a replay from the checkpoint's offsets.
Nothing is mocked; the driver's clock is the source's ``now_us``, set where a test needs the
table to have been quiet for a while."""

from __future__ import annotations

import json
import logging
import os
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from table_builders import delta_commit, make_delta_target
from test_table_source import records

from pyspark_rowtime.bounds.errors import OptionError
from pyspark_rowtime.datasource.table_source import TableSource, parse_table_options

deltalake = pytest.importorskip("deltalake", reason="the delta extra is not installed")

MINUTE_US = 60_000_000
HOUR_US = 60 * MINUTE_US
T0_US = 1_700_000_000_000_000 - 1_700_000_000_000_000 % HOUR_US
UTC_US = pa.timestamp("us", tz="UTC")
LATENESS_US = 10 * MINUTE_US
#: hypothesis examples: a few in CI, a sweep in ./dev long
EXAMPLES = 300 if os.environ.get("ROWTIME_LONG") == "1" else 8


def append(path: str, rows: list[tuple[int, int]]) -> None:
    """Another application's commit: rows ``(k, rowtime_us)``, column ``ts``, no clock."""
    data = pa.table(
        {
            "k": pa.array([k for k, _ in rows], pa.int64()),
            "ts": pa.array([t for _, t in rows], UTC_US),
        }
    )
    deltalake.write_deltalake(path, data, mode="append")


def options(**more: Any) -> dict[str, Any]:
    return {"table": "delta", "rowtime.column": "ts", "bounds.lateness": "10 minutes", **more}


def run(source: TableSource, start: dict[str, Any], cap: int) -> tuple[Any, list[Any]]:
    """Every micro-batch the source plans from ``start`` now: (start, end, records) each."""
    steps = []
    while True:
        end = source.latest_offset(start, cap)
        if end == start:
            return start, steps
        got = records(source.read_cfg, source.tasks(start, end, source.runs_for(start, end)))
        steps.append((start, end, got))
        source.commit(end)
        start = end


def emitted(steps: list[Any]) -> tuple[list[int], list[int]]:
    """The rows' keys and the bounds, in the order the query receives them."""
    recs = [r for _, _, got in steps for r in got]
    rows = [r["k"] for r in recs if not r["is_bound"]]
    return rows, [r["rowtime"] for r in recs if r["is_bound"]]


def brute_force(versions: list[list[tuple[int, int]]], lateness: int) -> dict[str, Any]:
    """Flink's bounded out-of-orderness decided per version: a row of a version is late when
    it is below the highest rowtime of the versions before less the lateness; the kept rows
    come out in rowtime order (ties in the order read: version, then the version's rowtime
    order), each once the bound (the highest rowtime so far less the lateness) reaches it."""
    high: int | None = None
    kept, late = [], []
    for n, rows in enumerate(versions):
        for i, (k, t) in enumerate(sorted(rows, key=lambda r: r[1])):
            if high is not None and t < high - lateness:
                late.append(k)
            else:
                kept.append((t, n, i, k))
        top = max(t for _, t in rows)
        high = top if high is None else max(high, top)
    bound = None if high is None else high - lateness
    out = [k for t, _, _, k in sorted(kept) if bound is not None and t <= bound]
    return {"rows": out, "late": sorted(late), "bound": bound, "high": high}


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    sizes=st.lists(st.integers(0, 8), min_size=1, max_size=5),
    cap=st.integers(1, 7),
    seed=st.integers(0, 2**32 - 1),
)
def test_lateness_bounds_follow_brute_force_per_version_for_any_cap(
    tmp_path_factory, sizes, cap, seed
):
    rnd = random.Random(seed)
    path = str(tmp_path_factory.mktemp("t") / "t")
    versions, k = [], 0
    for n in sizes:
        # disorder across versions of up to twice the lateness: some rows late, most not
        base = T0_US + len(versions) * 5 * MINUTE_US
        rows = [(k + i, base + rnd.randrange(-20 * MINUTE_US, 20 * MINUTE_US)) for i in range(n)]
        k += n
        if rows:  # write_deltalake of no rows writes no version
            append(path, rows)
            versions.append(rows)
    if not versions:
        return
    want = brute_force(versions, LATENESS_US)
    read = parse_table_options({"path": path, **options(maxRowsPerBatch=str(cap))})
    source = TableSource(read)
    _, steps = run(source, source.initial_offset(), cap)
    rows, bounds = emitted(steps)
    assert rows == want["rows"]
    assert bounds == sorted(bounds) and bounds[-1] == want["bound"]
    # the quarantine of a batch read holds exactly the late rows, under the same rules
    discarded = parse_table_options({"path": path, **options(output="discarded")})
    quarantine = records(discarded, TableSource(discarded).batch_tasks())
    assert sorted(r["k"] for r in quarantine) == want["late"]


def test_each_version_moves_the_bound_to_its_highest_rowtime_less_the_lateness(tmp_path):
    path = str(tmp_path / "t")
    append(path, [(1, T0_US + 30 * MINUTE_US), (2, T0_US)])
    append(path, [(3, T0_US + 25 * MINUTE_US)])  # within the lateness of 30: not late
    append(path, [(4, T0_US + 10 * MINUTE_US)])  # below 30 - 10: late, quarantined
    read = parse_table_options({"path": path, **options()})
    source = TableSource(read)
    _, steps = run(source, source.initial_offset(), 1 << 24)
    rows, bounds = emitted(steps)
    assert rows == [2]  # 3 and 1 are held until the bound (20 minutes) passes them
    assert bounds == [T0_US + 20 * MINUTE_US]
    discarded = parse_table_options({"path": path, **options(output="discarded")})
    assert [r["k"] for r in records(discarded, TableSource(discarded).batch_tasks())] == [4]


def test_lateness_refuses_a_policy_under_which_no_row_may_be_late(tmp_path):
    path = str(tmp_path / "t")
    append(path, [(1, T0_US)])
    with pytest.raises(OptionError, match=r"order=drop makes every row.*leave order out"):
        parse_table_options({"path": path, **options(order="drop")})


def quiet_table(path: str) -> None:
    append(path, [(1, T0_US), (2, T0_US + 30 * MINUTE_US)])
    append(path, [(3, T0_US + 28 * MINUTE_US)])


def commit_us(path: str, version: int) -> int:
    text = Path(path, "_delta_log", f"{version:020d}.json").read_text()
    info = next(json.loads(x)["commitInfo"] for x in text.splitlines() if "commitInfo" in x)
    return int(info["timestamp"]) * 1000


def test_idle_timeout_closes_a_quiet_table_once_its_last_commit_is_that_old(tmp_path):
    path = str(tmp_path / "t")
    quiet_table(path)
    last = commit_us(path, 1)
    read = parse_table_options({"path": path, **options(**{"idle.timeout": "5 minutes"})})
    source = TableSource(read)
    source.now_us = lambda: last + 5 * MINUTE_US  # quiet, but not longer than timeout + grace
    end, steps = run(source, source.initial_offset(), 1 << 24)
    rows, bounds = emitted(steps)
    assert (rows, bounds) == ([1], [T0_US + 20 * MINUTE_US])
    source.now_us = lambda: last + 6 * MINUTE_US + 1  # past the timeout and the grace
    _, more = run(source, end, 1 << 24)
    # one micro-batch: the idle bound at the highest rowtime read, which releases what it held
    assert len(more) == 1
    assert emitted(more) == ([3, 2], [T0_US + 30 * MINUTE_US])
    assert run(source, more[-1][1], 1 << 24)[1] == []  # once: the clock never goes back


def test_idle_between_versions_is_decided_by_their_commit_times_not_the_drivers_clock(tmp_path):
    path = str(tmp_path / "t")
    quiet_table(path)
    gap_us = commit_us(path, 1) - commit_us(path, 0)
    assert gap_us >= 1000  # two commits are more than a millisecond apart
    read = parse_table_options({"path": path, **options(**{"idle.timeout": "1ms"})})
    source = TableSource(read)
    source.now_us = lambda: 0  # a driver whose clock is far behind: only the commits count
    _, steps = run(source, source.initial_offset(), 1 << 24)
    rows, bounds = emitted(steps)
    # version 1 came more than 1 ms after version 0: the idle bound at 30 minutes first, so
    # row 3 (28 minutes) is late
    assert rows == [1, 2]
    assert bounds == [T0_US + 30 * MINUTE_US]
    discarded = parse_table_options(
        {"path": path, **options(**{"idle.timeout": "1ms", "output": "discarded"})}
    )
    assert [r["k"] for r in records(discarded, TableSource(discarded).batch_tasks())] == [3]


def test_a_replay_from_the_checkpoints_offsets_reads_the_same_records_and_bounds(tmp_path):
    path = str(tmp_path / "t")
    rnd = random.Random(7)
    for v in range(4):
        base = T0_US + v * 15 * MINUTE_US
        append(path, [(10 * v + i, base + rnd.randrange(-12 * MINUTE_US, 12 * MINUTE_US))
                      for i in range(6)])  # fmt: skip
    last = commit_us(path, 3)
    read = parse_table_options(
        {"path": path, **options(maxRowsPerBatch="4", **{"idle.timeout": "1 minute"})}
    )
    source = TableSource(read)
    source.now_us = lambda: last + HOUR_US
    _, steps = run(source, source.initial_offset(), 4)
    assert steps[-1][2][-1]["is_bound"]  # the last micro-batch ends with the idle bound
    for start, end, got in steps:
        again = TableSource(read)  # a new driver: the query restarted, its offsets as JSON
        s, e = json.loads(json.dumps(start)), json.loads(json.dumps(end))
        assert records(read, again.tasks(s, e, None)) == got
    # and a query from scratch plans the same micro-batches
    fresh = TableSource(read)
    fresh.now_us = lambda: last + HOUR_US
    assert run(fresh, fresh.initial_offset(), 4)[1] == steps


def test_a_clock_a_writer_moves_back_stays_where_it_was_and_the_log_says_so(tmp_path, caplog):
    path = make_delta_target(tmp_path / "t")
    delta_commit(path, [(1, T0_US)], T0_US + HOUR_US, batch=0)
    delta_commit(path, [(2, T0_US + HOUR_US)], T0_US + 10, batch=1)  # back by an hour
    read = parse_table_options({"path": path, "table": "delta"})
    source = TableSource(read)
    with caplog.at_level(logging.WARNING, logger="pyspark_rowtime"):
        _, steps = run(source, source.initial_offset(), 1 << 24)
    assert emitted(steps) == ([1, 2], [T0_US + HOUR_US])
    assert "version 2 sets the clock" in caplog.text and "it stays at" in caplog.text


def test_a_clock_gone_with_the_versions_that_held_it_stays_and_the_log_says_so(tmp_path, caplog):
    path = make_delta_target(tmp_path / "t")
    deltalake.DeltaTable(path).alter.set_table_properties(
        {"delta.logRetentionDuration": "interval 0 seconds"}
    )
    delta_commit(path, [(0, T0_US)], T0_US + 1, batch=0)
    read = parse_table_options({"path": path, "table": "delta", "failOnDataLoss": "false"})
    source = TableSource(read)
    start, _ = run(source, source.initial_offset(), 1 << 24)
    for b in range(1, 5):  # another writer's appends: no clock in them
        append_rows = pa.table(
            {
                "k": pa.array([b], pa.int64()),
                "rowtime": pa.array([T0_US + b], UTC_US),
                "rowtime_hour": pa.array(["2023-11-14T22"]),
            }
        )
        deltalake.write_deltalake(path, append_rows, mode="append")
    deltalake.DeltaTable(path).create_checkpoint()
    deltalake.DeltaTable(path).cleanup_metadata()
    with caplog.at_level(logging.WARNING, logger="pyspark_rowtime"):
        _, steps = run(source, start, 1 << 24)
    assert "the clock never goes back: it stays at" in caplog.text
    assert source.skipped_versions > 0
    assert all(r["rowtime"] >= T0_US + 1 for _, _, got in steps for r in got if r["is_bound"])

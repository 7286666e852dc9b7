"""The reader's validity intervals (options interval.duration / interval.count), without Spark.

The driver's planner and the executors' reads run here as Spark runs them (plan a step, hand
each partition's task to a read), over a real embedded log written in rounds. Each output is
compared with a brute force over what the reader emitted: ``rowtime_end`` of a row is its
rowtime plus the duration, or the rowtime of the N-th later row its partition emitted (the end
of stream when none follows before it).
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from pyspark_rowtime.api import create_stream, open_writer
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.bounds.errors import OptionError
from pyspark_rowtime.bounds.intervals import INFINITY_US, element_window_ends
from pyspark_rowtime.bounds.plan import StreamPosition
from pyspark_rowtime.bounds.policies import PartitionState
from pyspark_rowtime.datasource.intervals import (
    hold_from,
    kept_rows,
    read_task_with_intervals,
    with_rowtime_end,
)
from pyspark_rowtime.datasource.options import parse_reader_options
from pyspark_rowtime.datasource.reader import (
    Planner,
    output_arrow_schema,
    partition_tasks,
    written_tasks,
)
from pyspark_rowtime.streams.local.log import open_stream

S = 1_000_000
T0 = 1_700_000_000 * S


def at(us: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=us)


# -- options -----------------------------------------------------------------------------------


def test_interval_options_parse_durations_and_counts() -> None:
    assert parse_reader_options({"path": "x", "interval.duration": "25 seconds"}) \
        .interval_duration_us == 25 * S  # fmt: skip
    assert parse_reader_options({"path": "x", "interval.duration": "1.5"}).interval_duration_us \
        == 1_500_000  # fmt: skip
    assert parse_reader_options({"path": "x", "interval.count": "3"}).interval_count == 3
    plain = parse_reader_options({"path": "x"})
    assert not plain.has_rowtime_end


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"interval.duration": "1", "interval.count": "1"}, "interval.duration and interval.count"),
        ({"interval.count": "0"}, "interval.count='0'"),
        ({"interval.count": "two"}, "interval.count='two'"),
        ({"interval.duration": "0"}, "option interval.duration"),
        ({"interval.duration": "soon"}, "option interval.duration"),
        ({"interval.count": "2", "order": "adjust"}, "interval.count needs order=reject"),
    ],
)
def test_interval_options_reject_bad_values(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_reader_options({"path": "x", **options})


def test_rowtime_end_goes_after_rowtime_and_refuses_a_payload_column_of_that_name() -> None:
    schema = with_rowtime_end(output_arrow_schema(pa.schema([("v", pa.int64())])))
    assert schema.names == ["v", "rowtime", "rowtime_end", "is_bound"]
    with pytest.raises(Exception, match="rowtime_end"):
        with_rowtime_end(output_arrow_schema(pa.schema([("ROWTIME_END", pa.int64())])))


# -- the pure parts ------------------------------------------------------------------------------


def test_kept_rows_skip_late_rows_and_stop_at_the_end_of_stream() -> None:
    t = np.array([10, 5, 20, 20, 15, END_OF_STREAM_US, 30])
    b = np.array([False, False, True, False, False, True, False])
    kept, eos = kept_rows(t, b, None)
    assert kept.tolist() == [0, 3]  # 5 is below 10, 15 below the bound 20; 30 after the end
    assert eos == 5
    assert kept_rows(np.array([10, 11]), np.array([False, False]), 11)[0].tolist() == [1]


def test_hold_from_keeps_back_the_last_n_kept_rows_and_what_follows() -> None:
    t = np.array([10, 20, 25, 30, 40])
    b = np.array([False, False, True, False, False])
    state = PartitionState(next=0, scan=0)
    assert hold_from(state, t, b, 1) == 4  # row 40 waits; the bound 25 and row 30 go
    assert hold_from(state, t, b, 2) == 3  # rows 30 and 40 wait (and nothing after 30)
    assert hold_from(state, t, b, 9) == 0
    end = np.append(t, END_OF_STREAM_US)
    assert hold_from(state, end, np.append(b, True), 9) == 6  # the end settles every row
    # Never below what an earlier step consumed.
    assert hold_from(PartitionState(next=4, scan=3), t[3:], b[3:], 2) == 4


# -- the planner and the reads, end to end -----------------------------------------------------


Writer = Callable[[Path], None]


def random_rounds(seed: int, partitions: int, late: bool) -> list[Writer]:
    """Rounds of writes: rows with ties and (if ``late``) rows below their partition's clock,
    bounds now and then; the last round ends every partition."""
    rnd = random.Random(seed)
    clocks = [T0] * partitions
    serial = [0] * partitions
    rounds: list[Writer] = []
    for r in range(6):
        plan: list[tuple[int, str, int]] = []
        for p in range(partitions):
            for _ in range(rnd.randint(0, 6)):
                kind = rnd.random()
                if kind < 0.15:
                    clocks[p] += rnd.randint(0, 3) * S
                    plan.append((p, "bound", clocks[p]))
                elif late and kind < 0.3 and clocks[p] > T0 + 2 * S:
                    plan.append((p, "row", clocks[p] - S))  # below the clock: drop discards it
                else:
                    clocks[p] += rnd.choice([0, 0, S, 2 * S, 500_000])
                    plan.append((p, "row", clocks[p]))
        last = r == 5

        def write(path: Path, plan: list[tuple[int, str, int]] = plan, last: bool = last) -> None:
            for p in range(partitions):
                with open_writer(str(path), partition=p) as w:
                    for q, kind, t in plan:
                        if q != p:
                            continue
                        if kind == "bound":
                            w.set_rowtime_bound(at(t))
                        else:
                            serial[p] += 1
                            w.insert({"p": p, "i": serial[p]}, rowtime=at(t))
                    w.flush()
                    if last:
                        w.end_stream()

        rounds.append(write)
    return rounds


def drive(
    path: Path, options: dict[str, str], rounds: list[Writer], replay: bool = False
) -> list[dict[str, Any]]:
    """Plan and read step after step as Spark would, writing one round before each step; the
    output of every step, in order, checked for the reader's order promise (SPEC 7)."""
    steps = drive_steps(path, options, rounds, replay)
    check_order(steps)
    return [r for step in steps for r in step]


def drive_steps(
    path: Path, options: dict[str, str], rounds: list[Writer], replay: bool = False
) -> list[list[dict[str, Any]]]:
    cfg = parse_reader_options({"path": str(path), **options})
    schema = with_rowtime_end(output_arrow_schema(open_stream(str(path)).meta.payload_schema))
    planner = Planner(cfg)
    pos = planner.start_position()
    steps: list[list[dict[str, Any]]] = []
    for write in rounds:
        write(path)
        new = planner.plan(pos, planner.available(), None)
        if new is None:
            continue
        start, end = pos.to_dict(), new.to_dict()
        runs = None if replay else planner.runs_for(start, end)
        step = []
        for task in partition_tasks(start, end, runs):
            for batch in read_task_with_intervals(cfg, task, schema):
                step.extend(batch.to_pylist())
        steps.append(step)
        pos = StreamPosition.from_dict(end)
    return steps


def us(value: dt.datetime) -> int:
    return (value - at(0)) // dt.timedelta(microseconds=1)


def check_order(steps: list[list[dict[str, Any]]]) -> None:
    """No row below an earlier step's bound or rows (a row waiting for its successor is not
    overtaken), none above its own step's bound; each partition's rows in rowtime order."""
    floor = None
    last: dict[int, int] = {}
    for step in steps:
        rows = [r for r in step if not r["is_bound"]]
        bounds = [us(r["rowtime"]) for r in step if r["is_bound"]]
        assert all(r["rowtime_end"] is None for r in step if r["is_bound"])
        for r in rows:
            t = us(r["rowtime"])
            assert floor is None or t >= floor, f"row {r} overtaken by a bound or row at {floor}"
            assert t >= last.get(r["p"], t)
            last[r["p"]] = t
            if bounds:
                assert t <= bounds[0]
        top = max([*bounds, *(us(r["rowtime"]) for r in rows)], default=None)
        if top is not None:
            floor = top if floor is None else max(floor, top)


def expected_ends(out: list[dict[str, Any]], n: int) -> dict[tuple[int, int], int]:
    ends = {}
    for p in {r["p"] for r in out if not r["is_bound"]}:
        rows = [r for r in out if not r["is_bound"] and r["p"] == p]
        got = element_window_ends(np.array([us(r["rowtime"]) for r in rows], dtype=np.int64), n)
        ends.update({(p, r["i"]): int(e) for r, e in zip(rows, got, strict=True)})
    return ends


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("n", "order"), [(1, "reject"), (2, "reject"), (3, "drop")])
def test_interval_count_matches_brute_force(tmp_path: Path, seed: int, n: int, order: str) -> None:
    path = tmp_path / "s"
    create_stream(str(path), "p int, i long", partitions=2)
    out = drive(path, {"interval.count": str(n), "order": order},
                random_rounds(seed, 2, order == "drop"))  # fmt: skip
    rows = [r for r in out if not r["is_bound"]]
    assert rows, "the scenario wrote rows"
    expected = expected_ends(out, n)
    assert {(r["p"], r["i"]): us(r["rowtime_end"]) for r in rows} == expected
    # Every row came out: the end of stream settles the last n rows of each partition.
    log = open_stream(str(path))
    written = sum(
        int((~log.read(p, 0, log.end_offset(p)).column("__is_bound").to_numpy()).sum())
        for p in range(2)
    ) if order == "reject" else len(rows)  # fmt: skip
    assert len(rows) == written


@pytest.mark.parametrize("seed", range(3))
def test_replaying_a_step_from_its_offsets_gives_the_same_rows(tmp_path: Path, seed: int) -> None:
    """Without the driver's runs (a restart), executors replay the policy: same output."""
    outs = []
    for replay in (False, True):
        path = tmp_path / f"s{replay}"
        create_stream(str(path), "p int, i long", partitions=2)
        outs.append(drive(path, {"interval.count": "2"}, random_rounds(seed, 2, False), replay))
    assert outs[0] == outs[1]


def test_rows_wait_for_their_successor_and_the_clock_waits_with_them(tmp_path: Path) -> None:
    path = tmp_path / "s"
    create_stream(str(path), "p int, i long", partitions=1)

    def first(p: Path) -> None:
        with open_writer(str(p)) as w:
            for i in range(3):
                w.insert({"p": 0, "i": i}, rowtime=at(T0 + i * S))
            w.set_rowtime_bound(at(T0 + 10 * S))  # a bound does not settle row 2
            w.flush()

    def second(p: Path) -> None:
        with open_writer(str(p)) as w:
            w.insert({"p": 0, "i": 3}, rowtime=at(T0 + 12 * S))
            w.flush()

    out = drive(path, {"interval.count": "1"}, [first])
    assert [(r["i"], us(r["rowtime_end"]) - T0) for r in out if not r["is_bound"]] == [
        (0, S),
        (1, 2 * S),
    ]
    assert max(us(r["rowtime"]) for r in out if r["is_bound"]) <= T0 + 2 * S
    path2 = tmp_path / "s2"
    create_stream(str(path2), "p int, i long", partitions=1)
    out = drive(path2, {"interval.count": "1"}, [first, second])
    rows = [(r["i"], us(r["rowtime_end"]) - T0) for r in out if not r["is_bound"]]
    assert rows == [(0, S), (1, 2 * S), (2, 12 * S)]
    bounds = [us(r["rowtime"]) - T0 for r in out if r["is_bound"]]
    assert bounds[-1] == 10 * S  # the bound came out once row 2 did, after it


def test_interval_duration_adds_the_duration_to_every_row(tmp_path: Path) -> None:
    path = tmp_path / "s"
    create_stream(str(path), "p int, i long", partitions=2)
    out = drive(path, {"interval.duration": "2.5 seconds"}, random_rounds(7, 2, False))
    rows = [r for r in out if not r["is_bound"]]
    assert rows
    assert all(us(r["rowtime_end"]) == us(r["rowtime"]) + 2_500_000 for r in rows)


def test_a_batch_read_of_everything_written_ends_each_partition(tmp_path: Path) -> None:
    path = tmp_path / "s"
    create_stream(str(path), "p int, i long", partitions=1)
    with open_writer(str(path)) as w:
        for i in range(4):
            w.insert({"p": 0, "i": i}, rowtime=at(T0 + i * S))
        w.flush()
    cfg = parse_reader_options({"path": str(path), "interval.count": "2"})
    schema = with_rowtime_end(output_arrow_schema(open_stream(str(path)).meta.payload_schema))
    planner = Planner(cfg)
    out = [
        r
        for task in written_tasks(planner.available())
        for batch in read_task_with_intervals(cfg, task, schema)
        for r in batch.to_pylist()
    ]
    assert [us(r["rowtime_end"]) for r in out] == [T0 + 2 * S, T0 + 3 * S, INFINITY_US, INFINITY_US]


def test_a_step_of_bounds_only_reads_no_successor(tmp_path: Path) -> None:
    """A partition whose first records are bounds (no row yet) under interval.count: the step
    emits the bound and looks for no successor (it used to fail as if the log had shrunk)."""
    path = tmp_path / "s"
    create_stream(str(path), "p int, i long", partitions=2)

    def bounds_only(p: Path) -> None:
        for q in range(2):
            with open_writer(str(p), partition=q) as w:
                w.set_rowtime_bound(at(T0 + S))
                w.flush()

    def rows(p: Path) -> None:
        for q in range(2):
            with open_writer(str(p), partition=q) as w:
                w.insert({"p": q, "i": 1}, rowtime=at(T0 + 2 * S))
                w.insert({"p": q, "i": 2}, rowtime=at(T0 + 3 * S))
                w.end_stream()

    out = drive(path, {"interval.count": "1"}, [bounds_only, rows])
    got = sorted((r["p"], r["i"], us(r["rowtime_end"]) - T0) for r in out if not r["is_bound"])
    forever = INFINITY_US - T0
    assert got == [(0, 1, 3 * S), (0, 2, forever), (1, 1, 3 * S), (1, 2, forever)]


def test_interval_slide_moves_the_time_window_in_steps(tmp_path: Path) -> None:
    path = tmp_path / "s"
    create_stream(str(path), "p int, i long", partitions=2)
    options = {"interval.duration": "3 seconds", "interval.slide": "2 seconds"}
    out = drive(path, options, random_rounds(9, 2, False))
    rows = [r for r in out if not r["is_bound"]]
    assert rows
    for r in rows:
        t = us(r["rowtime"])
        assert us(r["rowtime_end"]) == t // (2 * S) * (2 * S) + 3 * S


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"interval.slide": "1 second"}, "set option interval.duration too"),
        ({"interval.count": "3", "interval.slide": "2"}, r"rows_window\(df, n, slide=rows"),
        ({"interval.duration": "1", "interval.slide": "2"}, "longer than interval.duration"),
        ({"interval.duration": "1", "interval.slide": "0"}, "interval.slide"),
    ],
)
def test_interval_slide_refuses_what_it_cannot_mean(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_reader_options({"path": "/x", **options})

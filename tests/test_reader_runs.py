"""A task emitting the driver's runs reads and orders them a chunk at a time
(datasource.reader._runs_batches), holding back only the rows a later chunk could still
precede: over random streams, every policy, several steps, chunks and batches of many sizes,
it gives the same rows in the same order as a task that replays the policy over the whole step.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.errors import LateRowError
from pyspark_rowtime.bounds.plan import StreamPosition
from pyspark_rowtime.datasource import executor as executor_module
from pyspark_rowtime.datasource import tasks as tasks_module
from pyspark_rowtime.datasource.executor import _run_chunks
from pyspark_rowtime.datasource.options import parse_reader_options
from pyspark_rowtime.datasource.reader import (
    EmitRuns,
    Planner,
    output_arrow_schema,
    partition_tasks,
    read_task,
)
from pyspark_rowtime.streams.storage import open_stream

OPTIONS = [
    {"order": "reject"},
    {"order": "drop"},
    {"order": "adjust", "adjust.unit": "msec", "adjust.range": "5"},
    # rowtimes below are in milliseconds, late by up to 15 s: this range reorders every one
    {"order": "adjust", "adjust.unit": "sec", "adjust.range": "20"},
    # and this one without truncation, so the stored rowtimes are the ones emitted
    {"order": "adjust", "adjust.unit": "usec", "adjust.range": "20000000"},
]


def write(
    location: str,
    rng: random.Random,
    late_share: float = 0.0,
    *,
    late_from: int = 0,
    implicit: bool = False,
    least: int = 100,
) -> None:
    """Two partitions of ``least`` to 400 rows ``k`` in rowtime order (milliseconds), with bound
    records among them and flushes (a step's records in several segments); from row
    ``late_from`` on, ``late_share`` of the rows up to 15 s early. ``ts`` is another time, 1 ms
    ahead of the rowtime, for ``rowtime.column``: in order with the bounds too, as each bound
    comes after a step of 1 ms. ``implicit``: rows without a rowtime, and no bounds."""
    pr.create_stream(location, "k INT, ts BIGINT", partitions=2)
    for p in range(2):
        with pr.open_writer(location, p) as w:
            cur = 1_000_000
            for k in range(rng.randrange(least, 400)):
                cur += rng.randrange(0, 3_000)
                if rng.random() < 0.03 and not implicit:
                    cur += 1
                    w.set_rowtime_bound(cur)
                late = k >= late_from and rng.random() < late_share
                at = cur - rng.randrange(1, 15_000) if late else cur
                w.insert({"k": k, "ts": at + 1}, rowtime=None if implicit else at)
                if rng.random() < 0.05:
                    w.flush()


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(o.values()))
def test_chunked_runs_give_the_rows_and_order_of_a_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int, options: dict[str, str]
) -> None:
    monkeypatch.setattr(executor_module, "RUN_CHUNK_RECORDS", chunk)
    monkeypatch.setattr(executor_module, "SORT_CHUNK_RECORDS", chunk)
    monkeypatch.setattr(tasks_module, "BATCH_ROWS", 5)
    rng = random.Random(chunk * 31 + len(options))
    compared = chunked = 0
    for case in range(6):
        location = str(tmp_path / f"s{case}")
        write(location, rng, 0.0 if options["order"] == "reject" else 0.25)
        cfg = parse_reader_options({"path": location, **options})
        schema = output_arrow_schema(open_stream(location).meta.payload_schema)
        planner = Planner(cfg)
        pos = planner.start_position()
        while (new := planner.plan(pos, planner.available(), rng.randrange(20, 300))) is not None:
            start, end = pos.to_dict(), new.to_dict()
            runs = planner.runs_for(start, end)
            assert runs is not None and all(r is not None for r in runs)
            for by_runs, replayed in zip(
                partition_tasks(start, end, runs), partition_tasks(start, end), strict=True
            ):
                got = pa.Table.from_batches(list(read_task(cfg, by_runs, schema)), schema)
                want = pa.Table.from_batches(list(read_task(cfg, replayed, schema)), schema)
                assert got.to_pylist() == want.to_pylist()
                compared += got.num_rows
                assert by_runs.runs is not None
                chunked += by_runs.runs.rows > chunk
            pos = new
    assert compared > 500
    if chunk < 64:
        assert chunked  # the chunked path really ran


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(o.values()))
def test_partitions_planned_on_threads_decide_as_one_after_the_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, str]
) -> None:
    """A large step plans its partitions on threads (planner._each_partition): forced on for
    every step here, the positions and each partition's runs are those of planning them one
    after the other, step after step; under ``reject`` the same partition's late row fails the
    step, with the same words."""
    from pyspark_rowtime.bounds.errors import LateRowError
    from pyspark_rowtime.datasource import planner as planner_module

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    rng = random.Random(len(str(options)))
    steps = failed = 0
    for case in range(4):
        location = str(tmp_path / f"s{case}")
        late = 0.25 if options["order"] != "reject" or case % 2 else 0.0
        write(location, rng, late)
        cfg = parse_reader_options({"path": location, **options})
        planners = {"threads": Planner(cfg), "in turn": Planner(cfg)}
        pos = planners["in turn"].start_position()
        while True:
            step = rng.randrange(20, 300)
            outcome: dict[str, object] = {}
            for name, planner in planners.items():
                threshold = 1 if name == "threads" else 1 << 60
                monkeypatch.setattr(planner_module, "PARALLEL_PLAN_RECORDS", threshold)
                try:
                    new = planner.plan(pos, planner.available(), step)
                except LateRowError as e:
                    outcome[name] = str(e)
                    continue
                runs = None if new is None else planner.runs_for(pos.to_dict(), new.to_dict())
                outcome[name] = None if new is None else (
                    new.to_dict(),
                    [(r.starts.tolist(), r.ends.tolist()) for r in runs or [] if r is not None],
                )  # fmt: skip
            assert outcome["threads"] == outcome["in turn"]
            if not isinstance(outcome["in turn"], tuple):
                failed += isinstance(outcome["in turn"], str)
                break  # the end of what was written, or the same late row in both
            pos = StreamPosition.from_dict(outcome["in turn"][0])
            steps += 1
    assert steps >= 4
    assert failed == (2 if options["order"] == "reject" else 0)


def test_run_chunks_cover_the_runs_exactly_in_pieces_of_at_most_the_size() -> None:
    rng = random.Random(5)
    for _ in range(200):
        starts, ends, at = [], [], 0
        for _ in range(rng.randrange(1, 8)):
            at += rng.randrange(0, 5)
            starts.append(at)
            at += rng.randrange(1, 9)
            ends.append(at)
        runs = EmitRuns(np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64))
        size = rng.randrange(1, 12)
        want = [o for s, e in zip(starts, ends, strict=True) for o in range(s, e)]
        got: list[int] = []
        for s, e in _run_chunks(runs, size):
            piece = [o for a, b in zip(s.tolist(), e.tolist(), strict=True) for o in range(a, b)]
            assert 0 < len(piece) <= size
            assert all(b > a for a, b in zip(s.tolist(), e.tolist(), strict=True))
            got += piece
        assert got == want


def test_batches_are_capped_by_rows_and_by_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Narrow rows come BATCH_ROWS to a batch; wide rows as many as fit in BATCH_BYTES, so a
    batch of kilobyte rows is not a gigabyte on Spark's side; never fewer than MIN_BATCH_ROWS."""
    from pyspark_rowtime.datasource.reader import BATCH_BYTES, BATCH_ROWS, batch_rows

    narrow = pa.table({"v": pa.array(np.arange(1000, dtype=np.int64))})
    assert batch_rows(narrow) == BATCH_ROWS
    wide = pa.table({"s": pa.array(["x" * 4000] * 100)})
    rows = batch_rows(wide)
    assert rows < BATCH_ROWS and rows * (wide.nbytes / 100) <= BATCH_BYTES
    assert rows * (wide.nbytes / 100 + 9) > BATCH_BYTES - 2 * (wide.nbytes / 100 + 9)
    monkeypatch.setattr(tasks_module, "BATCH_BYTES", 1)
    assert batch_rows(wide) == tasks_module.MIN_BATCH_ROWS
    assert batch_rows(narrow.slice(0, 0)) == BATCH_ROWS


#: Options over rows in order: the first three emit the stored rowtimes; the others must not
#: take the stored ones (adjust.unit truncates them; rowtime.column promotes another column).
IN_ORDER = [
    ({"order": "reject"}, True),
    ({"order": "drop"}, True),
    ({"order": "adjust", "adjust.unit": "usec", "adjust.range": "5"}, True),
    ({"order": "adjust", "adjust.unit": "sec", "adjust.range": "20"}, False),
    ({"order": "reject", "rowtime.column": "ts", "rowtime.unit": "ms"}, False),
]


def _ids(value: object) -> str:
    return "-".join(value.values()) if isinstance(value, dict) else str(value)


#: Each with explicit rowtimes, and with implicit ones where that reads anything (the implicit
#: rows of one test arrive within a second, so a range of 20 s holds them all; a promoted
#: column is the same with both).
SLICE_CASES = [
    (options, stored, implicit)
    for options, stored in IN_ORDER
    for implicit in (False, True)
    if not implicit or (options.get("adjust.unit") != "sec" and "rowtime.column" not in options)
]
SLICE_IDS = ["-".join([*o.values(), "implicit" if i else "explicit"]) for o, _, i in SLICE_CASES]


@pytest.mark.parametrize("options,stored,implicit", SLICE_CASES, ids=SLICE_IDS)
def test_runs_found_in_order_go_out_as_slices_with_the_rows_and_order_of_a_replay(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    options: dict[str, str],
    stored: bool,
    implicit: bool,
) -> None:
    """Runs the driver found in order (``EmitRuns.ordered``: :func:`sorted_step`) are emitted
    as slices of what is read, with the stored rowtimes, when those are the rowtimes to emit:
    the same rows in the same order as restoring the order (``ordered`` off) and as a replay,
    over bounds between runs, steps across segments, chunks smaller than a step, implicit
    rowtimes and a schema that leaves a payload column out. Where the stored rowtimes are not
    the ones to emit (a unit to truncate to, a promoted column), the task still restores them."""
    monkeypatch.setattr(executor_module, "RUN_CHUNK_RECORDS", 37)
    monkeypatch.setattr(executor_module, "SORT_CHUNK_RECORDS", 37)
    monkeypatch.setattr(tasks_module, "BATCH_ROWS", 11)
    sliced = []
    slices = executor_module._ordered_batches
    monkeypatch.setattr(
        executor_module, "_ordered_batches", lambda *a: sliced.append(1) or slices(*a)
    )
    rng = random.Random(len(str(options)) * 7 + implicit)
    ordered = compared = 0
    for case in range(4):
        location = str(tmp_path / f"s{case}")
        write(location, rng, implicit=implicit)
        cfg = parse_reader_options({"path": location, **options})
        payload = open_stream(location).meta.payload_schema
        if case % 2:  # a user schema without ``ts``
            payload = pa.schema([payload.field("k")])
        schema = output_arrow_schema(payload)
        planner = Planner(cfg)
        pos = planner.start_position()
        while (new := planner.plan(pos, planner.available(), rng.randrange(20, 300))) is not None:
            start, end = pos.to_dict(), new.to_dict()
            runs = planner.runs_for(start, end)
            assert runs is not None
            for by_runs, replayed in zip(
                partition_tasks(start, end, runs), partition_tasks(start, end), strict=True
            ):
                assert by_runs.runs is not None
                ordered += by_runs.runs.ordered
                unordered = dataclasses.replace(
                    by_runs, runs=dataclasses.replace(by_runs.runs, ordered=False)
                )
                want = pa.Table.from_batches(list(read_task(cfg, replayed, schema)), schema)
                for task in (by_runs, unordered):
                    batches = list(read_task(cfg, task, schema))
                    assert all(b.num_rows <= 11 for b in batches)
                    got = pa.Table.from_batches(batches, schema)
                    assert got.to_pylist() == want.to_pylist()
                compared += want.num_rows
            pos = new
    assert compared > 500
    assert ordered >= 8  # the driver found the rows in order
    assert bool(sliced) == stored  # and the tasks took the slices where the rowtimes allow


#: and a range that reorders the rows out of order, with the stored rowtimes
REORDERS = ({"order": "adjust", "adjust.unit": "usec", "adjust.range": "20000000"}, True)


@pytest.mark.parametrize("options", [o for o, _ in (*IN_ORDER, REORDERS)], ids=_ids)
def test_steps_joined_are_the_step_planned_in_one_piece(
    tmp_path: Path, options: dict[str, str]
) -> None:
    """``plan_joined`` continues a step a cap at a time: each joined step ends where it may
    (at most ``most`` new records), at the same position and with the same emitted runs as the
    step from its start to that end planned in one piece, and its tasks give the rows of a
    replay, over rows in order (runs that stay ``ordered``) and out of order. A late row under
    ``reject`` fails the step that reaches it, after every row before that step was planned."""
    rng = random.Random(len(str(options)) * 13)
    joined = unordered = steps = 0
    for case in range(4):
        location = str(tmp_path / f"s{case}")
        late_at = None if case % 2 == 0 else rng.randrange(60, 140)
        late = 0.0 if late_at is None else 0.1
        write(location, rng, late, late_from=late_at or 0, least=150)
        cfg = parse_reader_options({"path": location, **options})
        schema = output_arrow_schema(open_stream(location).meta.payload_schema)
        capped, whole = Planner(cfg), Planner(cfg)
        pos = capped.start_position()
        while True:
            cap = rng.randrange(5, 60)
            most = cap * rng.randrange(1, 6)
            try:
                new = capped.plan_joined(pos, capped.available(), cap, most)
            except LateRowError:
                assert options["order"] == "reject" and late_at is not None
                with pytest.raises(LateRowError):  # the step that reaches it, as capped
                    Planner(cfg).plan(pos, capped.available(), cap)
                break
            if new is None:
                break
            pairs = zip(pos.partitions, new.partitions, strict=True)
            taken = sum(b.next - a.next for a, b in pairs)
            assert 0 < taken <= most
            start, end = pos.to_dict(), new.to_dict()
            one = whole.plan(pos, [p.next for p in new.partitions], None)
            assert one is not None and one.to_dict() == end
            runs, runs_one = capped.runs_for(start, end), whole.runs_for(start, end)
            assert runs is not None and runs_one is not None
            assert [(r.starts.tolist(), r.ends.tolist()) for r in runs if r is not None] == [
                (r.starts.tolist(), r.ends.tolist()) for r in runs_one if r is not None
            ]
            for by_runs, replayed in zip(
                partition_tasks(start, end, runs), partition_tasks(start, end), strict=True
            ):
                got = pa.Table.from_batches(list(read_task(cfg, by_runs, schema)), schema)
                want = pa.Table.from_batches(list(read_task(cfg, replayed, schema)), schema)
                assert got.to_pylist() == want.to_pylist()
            joined += taken > cap
            unordered += taken > cap and not all(r is not None and r.ordered for r in runs)
            steps += 1
            pos = new
    assert steps >= 10
    assert joined >= 3  # steps were joined
    if options["order"] != "reject":
        assert unordered  # and steps over rows out of order among them


def test_a_step_that_would_hold_too_many_rows_ends_the_joining_before_it(tmp_path: Path) -> None:
    """``adjust.maxHeld`` is checked at the end of each planned step: a joined micro-batch
    stops before the step that would hold too many rows (and keeps the steps before it), and
    the next micro-batch fails on it with the error a capped step gives."""
    from pyspark_rowtime.bounds.errors import HeldRowsOverflowError

    location = str(tmp_path / "s")
    pr.create_stream(location, "k INT", partitions=1)
    with pr.open_writer(location, 0) as w:
        for k in range(100):
            w.insert({"k": k}, rowtime=1_000_000 + k)
    # a range of a day holds every row: 20 records a step stay under 30 held, 40 do not
    options = {"order": "adjust", "adjust.unit": "sec", "adjust.range": "86400"}
    cfg = parse_reader_options({"path": location, **options, "adjust.maxHeld": "30"})
    planner = Planner(cfg)
    pos = planner.start_position()
    first = planner.plan_joined(pos, planner.available(), 20, 100)
    assert first is not None and [p.next for p in first.partitions] == [20]
    with pytest.raises(HeldRowsOverflowError):
        planner.plan_joined(first, planner.available(), 20, 100)
    with pytest.raises(HeldRowsOverflowError):
        Planner(cfg).plan(first, planner.available(), 20)

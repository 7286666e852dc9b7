"""A step is planned from its times where the log holds them (``Planner._plan_ordered``),
never joined into one array, when its records ascend (``datasource.ordered.ordered_step``) or,
under ``adjust``, when no row is discarded (``late_scan``, ``late_decide``): over random
streams of one to three partitions (ties, bound records, ends of stream, flushes, implicit
rowtimes, quiet partitions, rows out of order within ``adjust.range`` and beyond it), every
policy and step caps of many sizes, step after step, it gives the general path's position and
runs, and its errors where a record goes back in time under ``reject`` or ``adjust`` holds too
many rows.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pyspark_rowtime as pr
from pyspark_rowtime.datasource import ordered as ordered_module
from pyspark_rowtime.datasource import planner as planner_module
from pyspark_rowtime.datasource.options import parse_reader_options
from pyspark_rowtime.datasource.ordered import OrderedTimes
from pyspark_rowtime.datasource.reader import Planner

OPTIONS = [
    {"order": "reject"},
    {"order": "drop"},
    # rowtimes below are in milliseconds: this range holds the last 2 s of rows back
    {"order": "adjust", "adjust.unit": "usec", "adjust.range": "2000000"},
    {"order": "adjust", "adjust.unit": "usec", "adjust.range": "0"},
    # more rows held than allowed: both paths fail the step alike
    {"order": "adjust", "adjust.unit": "usec", "adjust.range": "2000000", "adjust.maxHeld": "6"},
    # truncation: rows in order too go the way of late rows
    {"order": "adjust", "adjust.unit": "msec", "adjust.range": "2000"},
]


def write(
    location: str, rng: random.Random, *, implicit: bool, disorder: float, bounds: bool
) -> None:
    """One to three partitions of 0 to 300 rows in rowtime order (milliseconds; ties too),
    bound records among them (``bounds``, rowtimes explicit) and now and then an end of stream,
    flushed now and then (a step's records in several segments, a segment in several
    batches); ``disorder``: the share of rows up to 2.2 s early."""
    partitions = rng.randrange(1, 4)
    pr.create_stream(location, "k INT", partitions=partitions)
    for p in range(partitions):
        with pr.open_writer(location, p) as w:
            cur = 1_000_000
            for k in range(rng.choice([0, rng.randrange(1, 300)])):
                cur += rng.choice([0, 0, 1, rng.randrange(1, 2_000)])
                if bounds and not implicit and rng.random() < 0.04:
                    w.set_rowtime_bound(cur)
                at = cur - rng.randrange(1, 2_200) if rng.random() < disorder else cur
                w.insert({"k": k}, rowtime=None if implicit else at)
                if rng.random() < 0.06:
                    w.flush()
            if bounds and rng.random() < 0.3:
                w.end_stream()


def _runs(planner: Planner, start: Any, end: Any) -> list[Any]:
    runs = planner.runs_for(start.to_dict(), end.to_dict())
    assert runs is not None
    return [None if r is None else (r.starts.tolist(), r.ends.tolist()) for r in runs]


def _plan(planner: Planner, pos: Any, cap: int, most: int | None) -> tuple[str, Any]:
    try:
        if most is None:
            return "ok", planner.plan(pos, planner.available(), cap)
        return "ok", planner.plan_joined(pos, planner.available(), cap, most)
    except Exception as e:  # the same error on both paths, with the same words
        return type(e).__name__, str(e)


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(o.values()))
def test_steps_planned_where_they_lie_decide_as_the_general_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, str]
) -> None:
    rng = random.Random(len(str(options)))
    fast = general_steps = errors = 0
    late = [0]
    decide = planner_module.late_decide
    monkeypatch.setattr(
        planner_module, "late_decide", lambda *a: late.__setitem__(0, late[0] + 1) or decide(*a)
    )
    for case in range(40):
        few = rng.choice([256, 256, 2])  # few bounds, or more than the ordered path takes
        monkeypatch.setattr(planner_module, "_FEW_BOUNDS", few)
        monkeypatch.setattr(ordered_module, "_FEW_BOUNDS", few)
        monkeypatch.setattr(ordered_module, "_LATE_BLOCK", rng.choice([1, 3, 1 << 17]))
        location = str(tmp_path / f"s{case}")
        disorder = rng.choice([0.0, 0.0, 0.05, 0.3])
        implicit, bounds = rng.random() < 0.25, rng.random() < 0.5
        write(location, rng, implicit=implicit, disorder=disorder, bounds=bounds)
        cfg = parse_reader_options({"path": location, **options})
        ordered, general = Planner(cfg), Planner(cfg)
        general._plan_ordered = lambda pos, ends: None  # type: ignore[method-assign]
        took = []
        plan_ordered = ordered._plan_ordered

        def counted(pos: Any, ends: Any, plan_ordered: Any = plan_ordered, took: Any = took) -> Any:
            took.append(plan_ordered(pos, ends))
            return took[-1]

        ordered._plan_ordered = counted  # type: ignore[method-assign]
        pos = ordered.start_position()
        assert pos.to_dict() == general.start_position().to_dict()
        while True:
            cap, most = rng.randrange(1, 80), rng.choice([None, rng.randrange(1, 300)])
            got, want = _plan(ordered, pos, cap, most), _plan(general, pos, cap, most)
            if got[0] != "ok" or want[0] != "ok":
                assert got == want
                errors += 1
                break
            new = got[1]
            assert (None if new is None else new.to_dict()) == (
                None if want[1] is None else want[1].to_dict()
            )
            if new is None:
                break
            assert _runs(ordered, pos, new) == _runs(general, pos, new)
            # rows found in order are marked so on both paths (the tasks need not order them)
            flags = [
                [r is not None and r.ordered for r in p.runs_for(pos.to_dict(), new.to_dict())]
                for p in (ordered, general)
            ]
            assert flags[0] == flags[1]
            if took and all(t is not None for t in took):  # every step of it
                fast += 1
            else:
                general_steps += 1
            took.clear()
            pos = new
    least = 5 if "adjust.maxHeld" in options else 20  # steps stop at the error there
    assert fast > least  # the paths where the times lie really ran
    assert general_steps  # and the general path where they do not apply
    if options["order"] == "adjust" and options["adjust.range"] != "0":
        assert late[0] > least  # and the one for late rows
    if options["order"] == "reject" or "adjust.maxHeld" in options:
        assert errors  # a record back in time, or too many held, fail both paths alike


def test_ordered_times_search_as_numpy_over_the_pieces_joined() -> None:
    """``OrderedTimes`` reads positions and binary searches over its pieces as numpy does over
    their concatenation, at every value between and beyond the pieces', both sides; empty
    pieces are left out."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        pieces = [np.sort(rng.integers(0, 40, size=int(rng.integers(0, 6)))) for _ in range(4)]
        joined = np.sort(np.concatenate(pieces))
        cut = np.cumsum([len(p) for p in pieces])[:-1]
        pieces = np.split(joined, cut)
        times = OrderedTimes(pieces)
        assert len(times) == len(joined)
        assert [times.at(i) for i in range(len(joined))] == joined.tolist()
        for value in range(-1, 42):
            for side in ("left", "right"):
                want = int(np.searchsorted(joined, value, side=side))
                assert times.searchsorted(value, side=side) == want


ADJUST_2S = {"order": "adjust", "adjust.unit": "usec", "adjust.range": "2000000"}


def _emitted_on_both_paths(location: str, steps: list[tuple[int, Any]]) -> list[int]:
    """Plan ``steps`` (a cap, and what to write before the step or None) under ``adjust`` with a
    2 s range, with and without the paths where the times lie; each step's position and runs
    must be the same: partition 0's emitted offsets, step after step."""
    cfg = parse_reader_options({"path": location, **ADJUST_2S})
    ordered, general = Planner(cfg), Planner(cfg)
    general._plan_ordered = lambda pos, ends: None  # type: ignore[method-assign]
    pos = ordered.start_position()
    emitted = []
    for cap, append in steps:
        if append is not None:
            append()
        new = ordered.plan(pos, ordered.available(), cap)
        want = general.plan(pos, general.available(), cap)
        assert new is not None and want is not None and new.to_dict() == want.to_dict()
        assert _runs(ordered, pos, new) == _runs(general, pos, new)
        runs = ordered.runs_for(pos.to_dict(), new.to_dict())
        assert runs is not None and runs[0] is not None
        emitted += [
            o for a, b in zip(runs[0].starts, runs[0].ends, strict=True) for o in range(a, b)
        ]
        pos = new
    return emitted


def test_a_row_at_the_release_line_waits_then_goes_out_on_both_paths(tmp_path: Path) -> None:
    """Under ``adjust`` a row exactly ``range`` below the largest rowtime is not released (the
    line is strict) and the clock stops at it; when later rows raise the line, it goes out:
    the step after must not take it for emitted by the step before."""
    location = str(tmp_path / "s")
    pr.create_stream(location, "k INT", partitions=1)
    with pr.open_writer(location, 0) as w:
        for k, at in enumerate([10_000, 8_000, 12_000, 13_000]):
            w.insert({"k": k}, rowtime=at)
    emitted = _emitted_on_both_paths(location, [(2, None), (1, None), (1, None)])
    assert emitted == [1, 0]  # 8 000 once 12 000 is in, 10 000 once 13 000 is


def test_a_row_held_at_the_line_goes_out_with_the_bound_that_releases_it(tmp_path: Path) -> None:
    """Under ``adjust`` a row exactly ``range`` below the largest rowtime waits, and the clock
    stops at it; a bound record in the next step releases it: that step must judge the rows of
    the step before by the bound as it was then (none), and emit it now."""
    location = str(tmp_path / "s")
    pr.create_stream(location, "k INT", partitions=1)
    with pr.open_writer(location, 0) as w:
        w.insert({"k": 0}, rowtime=10_000)
        w.insert({"k": 1}, rowtime=8_000)  # at the line: held, and the clock is 8 000

    def bound_then_row() -> None:
        with pr.open_writer(location, 0) as w:
            w.set_rowtime_bound(10_000)
            w.insert({"k": 2}, rowtime=10_500)

    emitted = _emitted_on_both_paths(location, [(100, None), (100, bound_then_row)])
    assert emitted == [0, 1]  # both at the bound; 10 500 waits

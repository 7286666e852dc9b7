"""A step over records in rowtime order is planned from their times where the log holds them
(``Planner._plan_ordered``, ``datasource.ordered.ordered_step``), never joined into one array:
over random streams of one to three partitions (ties, bound records, flushes, implicit
rowtimes, quiet partitions, a record out of order now and then), every policy and step caps of
many sizes, step after step, it gives the general path's position and runs, and its error
where a record goes back in time under ``reject``.
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
    # truncation: the general path decides (the ordered one does not run)
    {"order": "adjust", "adjust.unit": "msec", "adjust.range": "2000"},
]


def write(location: str, rng: random.Random, *, implicit: bool, disorder: float) -> None:
    """One to three partitions of 0 to 300 rows in rowtime order (milliseconds; ties too),
    bound records among them when rowtimes are explicit, flushed now and then (a step's
    records in several segments, a segment in several batches); ``disorder``: the share of
    rows 1 to 3 s early."""
    partitions = rng.randrange(1, 4)
    pr.create_stream(location, "k INT", partitions=partitions)
    for p in range(partitions):
        with pr.open_writer(location, p) as w:
            cur = 1_000_000
            for k in range(rng.choice([0, rng.randrange(1, 300)])):
                cur += rng.choice([0, 0, 1, rng.randrange(1, 2_000)])
                if not implicit and rng.random() < 0.04:
                    w.set_rowtime_bound(cur)
                at = cur - rng.randrange(1_000, 3_000) if rng.random() < disorder else cur
                w.insert({"k": k}, rowtime=None if implicit else at)
                if rng.random() < 0.06:
                    w.flush()


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
def test_steps_in_order_planned_where_they_lie_decide_as_the_general_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, str]
) -> None:
    rng = random.Random(len(str(options)))
    ordered_steps = general_steps = errors = 0
    for case in range(30):
        few = rng.choice([256, 256, 2])  # few bounds, or more than the ordered path takes
        monkeypatch.setattr(planner_module, "_FEW_BOUNDS", few)
        monkeypatch.setattr(ordered_module, "_FEW_BOUNDS", few)
        location = str(tmp_path / f"s{case}")
        disorder = rng.choice([0.0, 0.0, 0.0, 0.05])
        write(location, rng, implicit=rng.random() < 0.25, disorder=disorder)
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
            if took and all(t is not None for t in took):  # every step of it
                ordered_steps += 1
                runs = ordered.runs_for(pos.to_dict(), new.to_dict())
                assert runs is not None and all(r is not None and r.ordered for r in runs)
            else:
                general_steps += 1
            took.clear()
            pos = new
    if options.get("adjust.unit", "usec") == "usec":
        assert ordered_steps > 20  # the ordered path really ran
    else:
        assert ordered_steps == 0  # truncation is the general path's
    assert general_steps > 5
    if options["order"] == "reject":
        assert errors  # a record back in time fails both paths alike


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

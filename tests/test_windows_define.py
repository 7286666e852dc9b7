"""Grouped element windows and predicate windows (seed 001), without Spark.

The ends :func:`assign_ends` sets batch after batch, inside ``interval_aggregate``'s state, must
be those of the window over the whole stream (brute force: each group's rows in rowtime order);
and the aggregate over them, driven as Spark drives it, the relational answer at every instant.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_rowtime.bounds.intervals import INFINITY_US
from pyspark_rowtime.windows.define import WindowDef, assign_ends
from pyspark_rowtime.windows.validity import _END_MS, IntervalAgg, _load, _save, interval_step

Row = tuple[int, str, bool, int]  # start, group, condition, serial

AGGS = [IntervalAgg("n", "count", None, None), IntervalAgg("ids", "sum", "__in0", "__nn0", True)]


def brute_force_ends(window: WindowDef, rows: list[Row]) -> dict[int, int]:
    ends: dict[int, int] = {}
    for g in {r[1] for r in rows}:
        mine = [r for r in rows if r[1] == g]  # arrival order: rowtime, ties as they came
        for j, (t, _, on, serial) in enumerate(mine):
            if window.kind == "rows":  # row j ends where row floor(j / slide) * slide + n starts
                at = j // window.slide * window.slide + window.n
                ends[serial] = mine[at][0] if at < len(mine) else INFINITY_US
            elif not on:
                ends[serial] = t
            else:
                closing = next((r for r in mine[j + 1 :] if not r[2]), None)
                ends[serial] = INFINITY_US if closing is None else closing[0]
    return ends


def frame(rows: list[Row]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "__t": np.array([r[0] for r in rows], dtype=np.int64),
            "__e": np.full(len(rows), INFINITY_US, dtype=np.int64),
            "__open": pd.Series([None] * len(rows), dtype="object"),
            "__g": [r[1] for r in rows],
            "__on": np.array([r[2] for r in rows], dtype=bool),
            "__in0": np.array([r[3] for r in rows], dtype=np.int64),
            "__nn0": np.ones(len(rows), dtype=bool),
        }
    )


@st.composite
def grouped(draw: st.DrawFn) -> tuple[WindowDef, list[list[Row]]]:
    window = draw(
        st.sampled_from(
            [
                WindowDef("rows", 1, ("g",)),
                WindowDef("rows", 3, ("g",)),
                WindowDef("rows", 3, ("g",), slide=2),
                WindowDef("rows", 3, ("g",), slide=3),
                WindowDef("rows", 2, ("g",), slide=2),
                WindowDef("while", 0, ("g",)),
            ]
        )
    )
    clock, serial = 0, 0
    batches: list[list[Row]] = []
    for _ in range(draw(st.integers(1, 6))):
        rows: list[Row] = []
        for _ in range(draw(st.integers(0, 5))):
            clock += draw(st.sampled_from([0, 1000, 3000]))
            serial += 1
            rows.append((clock, draw(st.sampled_from("ab")), draw(st.booleans()), serial))
        batches.append(rows)
    return window, batches


@settings(max_examples=200, deadline=None)
@given(grouped())
def test_ends_set_batch_after_batch_are_the_window_over_the_whole_stream(
    case: tuple[WindowDef, list[list[Row]]],
) -> None:
    window, batches = case
    kept = None
    ends: dict[int, int] = {}
    arrival: list[Row] = []
    for rows in batches:
        # Within a batch ties go by the rows' values; serials grow with rowtime here, so the
        # brute force's arrival order is rowtime then serial.
        arrival += sorted(rows, key=lambda r: (r[0], r[1], r[2], r[3]))
        settled = assign_ends(window, pd.concat([f for f in (kept, frame(rows)) if f is not None]))
        for s, e, o in zip(settled["__in0"], settled["__e"], settled["__open"], strict=True):
            if not o:
                ends[int(s)] = int(e)
        kept = settled[settled["__open"].astype(bool)]
    if kept is not None:
        for s in kept["__in0"]:
            ends[int(s)] = INFINITY_US  # the end of stream: still valid
    assert ends == brute_force_ends(window, arrival)


def test_a_while_window_closes_on_the_first_row_that_breaks_the_condition() -> None:
    w = WindowDef("while", 0, ("g",))
    rows = [
        (0, "a", True, 1),
        (1000, "a", True, 2),
        (1500, "b", False, 3),
        (2000, "a", False, 4),
        (3000, "a", True, 5),
    ]
    out = assign_ends(w, frame(rows))
    got = dict(
        zip(
            out["__in0"].tolist(),
            zip(out["__e"].tolist(), out["__open"].tolist(), strict=True),
            strict=True,
        )
    )
    assert got == {
        1: (2000, False),
        2: (2000, False),
        3: (1500, False),
        4: (2000, False),
        5: (INFINITY_US, True),
    }


def drive(window: WindowDef, batches: list[list[Row]], clocks: list[int]) -> list[Any]:
    """The stretches ``interval_step`` emits batch after batch, as Spark drives it: the state
    through its stored form, each call with the watermark of the batch before."""
    blob: bytes | None = None
    watermark = -(2**62)
    got: list[Any] = []
    for rows, clock in zip(batches, clocks, strict=True):
        old, from_us = _load(blob) if blob is not None else (None, None)
        result = interval_step(
            AGGS, old, from_us, frame(rows) if rows else None, watermark, window=window
        )
        got += result.stretches
        blob = None if result.rows is None else _save(result.rows, result.from_us)
        watermark = _END_MS if clock >= INFINITY_US else clock // 1000 - 1
    return got


def test_the_aggregate_over_a_grouped_window_is_the_relational_answer() -> None:
    """rows_window(1) per group, aggregated over everything: at each instant, one row per
    group (the latest), as the brute force over the settled ends says."""
    w = WindowDef("rows", 1, ("g",))
    batches = [
        [(0, "a", True, 1), (1000, "b", True, 2)],
        [(3000, "a", True, 3)],
        [(5000, "b", True, 4)],
        [],
        [],
    ]
    got = drive(w, batches, [2000, 4000, 6000, INFINITY_US, INFINITY_US])
    assert [(a, b, v) for a, b, v in got] == [
        (0, 1000, [1, 1]),
        (1000, 3000, [2, 3]),
        (3000, 5000, [2, 5]),
        (5000, INFINITY_US, [2, 7]),
    ]


def test_a_sliding_rows_window_moves_in_blocks_across_batches() -> None:
    """rows_window(2, slide=2): tumbling blocks of two rows per group, each valid until the
    first row of the next block, a block split across batches and the state."""
    w = WindowDef("rows", 2, ("g",), slide=2)
    batches = [[(0, "a", True, 1), (1000, "a", True, 2), (2000, "a", True, 3)], [], [], []]
    batches[1] = [(3000, "a", True, 4), (4000, "a", True, 5)]
    # Each call sees the watermark of the batch before (as Spark gives it).
    got = drive(w, batches, [2500, 4500, INFINITY_US, INFINITY_US])
    # rows 1, 2 valid [t, 2000); rows 3, 4 [t, 4000); row 5 until the end of stream
    assert [(a, b, v) for a, b, v in got] == [
        (0, 1000, [1, 1]),
        (1000, 2000, [2, 3]),
        (2000, 3000, [1, 3]),
        (3000, 4000, [2, 7]),
        (4000, INFINITY_US, [1, 5]),
    ]

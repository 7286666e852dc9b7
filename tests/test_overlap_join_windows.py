"""overlap_join over windows whose ends depend on later rows (rows_window, while_window), without
Spark: the per-key step, driven as Spark drives it, against the brute-force answer.

The brute force settles every window row's end over the whole stream (each group's rows in
arrival order: rowtime, ties by their values) and then joins as SPEC 10 says: every
overlapping pair once with the intersection; with ``how="left"`` every left row that meets no
right row once, with nulls and its own interval, never before both clocks passed its end.
Streams have ties, empty intervals (a while window's closing row, ties in a rows window), rows
valid until the end of stream and quiet endings.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_overlap_join_left import brute_force
from test_windows_define import brute_force_ends

from pyspark_rowtime.bounds.intervals import INFINITY_US
from pyspark_rowtime.windows.define import WindowDef
from pyspark_rowtime.windows.join import (
    _END_MS,
    Pending,
    Side,
    _load_state,
    _save,
    window_join_step,
)

#: A window side's row: start, window group, condition, serial; a plain side's: start, end,
#: serial. Rows are named by side and serial (zero padded: their text sorts as the serial).
WinRow = tuple[int, str, bool, int]
PlainRow = tuple[int, int, int]

WINDOWS = [
    WindowDef("rows", 1, ("k", "g")),
    WindowDef("rows", 2, ("k", "g"), slide=2),
    WindowDef("rows", 3, ("k", "g"), slide=2),
    WindowDef("while", 0, ("k", "g")),
]


def name(side: int, serial: int) -> str:
    return f"{'lr'[side]}{serial:04d}"


@st.composite
def streams(draw: st.DrawFn) -> dict[str, Any]:
    windows = draw(
        st.sampled_from(
            [(w, None) for w in WINDOWS] + [(None, w) for w in WINDOWS] + [(WINDOWS[0], WINDOWS[3])]
        )
    )
    clocks, serial = [0, 0], 0
    batches: list[list[list[Any]]] = []
    after: list[tuple[int, int]] = []
    n_batches = draw(st.integers(1, 7))
    for b in range(n_batches + draw(st.integers(0, 2))):  # then quiet: bounds only
        sides: list[list[Any]] = [[], []]
        for s in (0, 1):
            for _ in range(draw(st.integers(0, 3)) if b < n_batches else 0):
                clocks[s] += draw(st.sampled_from([0, 0, 1000, 2500, 7000]))
                serial += 1
                if windows[s] is not None:
                    g, on = draw(st.sampled_from("ab")), draw(st.booleans())
                    sides[s].append((clocks[s], g, on, serial))
                else:
                    length = draw(st.sampled_from([0, 1000, 3000, 20_000, None]))
                    end = INFINITY_US if length is None else clocks[s] + length
                    sides[s].append((clocks[s], end, serial))
            clocks[s] += draw(st.sampled_from([0, 1000, 4000, 30_000]))
        batches.append(sides)
        after.append((clocks[0], clocks[1]))
    batches += [[[], []], [[], []]]
    after += [(INFINITY_US, INFINITY_US)] * 2
    return {"windows": windows, "batches": batches, "clocks": after}


def new_side(window: WindowDef | None, rows: list[Any], side: int) -> Side | Pending:
    if window is None:
        return Side(
            np.array([r[0] for r in rows], dtype=np.int64),
            np.array([r[1] for r in rows], dtype=np.int64),
            [name(side, r[2]) for r in rows],
        )
    return Pending(
        [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
        [name(side, r[3]) for r in rows],
    )  # fmt: skip


def settled(window: WindowDef | None, batches: list[list[Any]], side: int) -> list[Any]:
    """Every row of a side as (start, end, name), window ends from the whole stream."""
    rows = [r for b in batches for r in b[side]]
    if window is None:
        return [(t, e, name(side, s)) for t, e, s in rows]
    arrival: list[WinRow] = []
    for b in batches:  # a batch's ties by group, condition, then serial (the rows' text)
        arrival += sorted(b[side], key=lambda r: (r[0], r[1], r[2], r[3]))
    ends = brute_force_ends(window, arrival)
    return [(t, ends[s], name(side, s)) for t, _, _, s in arrival]


@settings(max_examples=400, deadline=None)
@given(streams(), st.booleans())
def test_a_join_over_windows_equals_the_brute_force_answer(
    case: dict[str, Any], left_outer: bool
) -> None:
    windows, batches, clocks = case["windows"], case["batches"], case["clocks"]
    blob: bytes | None = None
    timeout: int | None = None
    watermark = -(2**62)
    got: list[tuple[Any, ...]] = []
    for sides, (cl, cr) in zip(batches, clocks, strict=True):
        due = blob is not None and timeout is not None and watermark > timeout
        if sides[0] or sides[1] or due:
            empty = (Side(), Side(), Pending(), Pending())
            old = _load_state(blob) if blob is not None else empty
            new = (new_side(windows[0], sides[0], 0), new_side(windows[1], sides[1], 1))
            step, waiting = window_join_step(
                old, new, watermark, windows=windows, left_outer=left_outer
            )
            for row in step.results:
                if row[1] is None:  # never before the watermark reached the left row's end
                    assert watermark >= _END_MS or watermark * 1000 >= row[3]
            got += step.results
            blob = None
            if step.state is not None or len(waiting[0]) or len(waiting[1]):
                blob = _save(step.state, left_outer, waiting)
                assert step.timeout_ms is not None
            timeout = step.timeout_ms
        low = min(cl, cr)
        watermark = max(watermark, _END_MS if low >= INFINITY_US else low // 1000 - 1)
    assert blob is None  # both streams ended: nothing is kept, nothing waits
    lefts, rights = settled(windows[0], batches, 0), settled(windows[1], batches, 1)
    want = brute_force(lefts, rights)
    if not left_outer:
        want = [w for w in want if w[1] is not None]
    assert sorted(got, key=repr) == sorted(want, key=repr)


def test_a_waiting_row_keeps_what_it_may_meet_past_the_watermark() -> None:
    """A left rows_window(1) row at 0 waits for its successor; a right row [1000, 2000) ends
    below the watermark (5 ms) but stays, and meets it once the successor (at 9000) arrives."""
    window = WindowDef("rows", 1, ("k",))
    windows = (window, None)
    empty = (Side(), Side(), Pending(), Pending())
    first, waiting = window_join_step(
        empty,
        (Pending([0], ["a"], [True], ["l1"]), Side(np.array([1000]), np.array([2000]), ["r1"])),
        5,
        windows=windows,
        left_outer=True,
    )
    assert first.results == [] and len(waiting[0]) == 1
    assert first.state is not None and first.state[1].rows == ["r1"]
    old = _load_state(_save(first.state, True, waiting))
    second, waiting = window_join_step(
        old, (Pending([9000], ["a"], [True], ["l2"]), Side()), 8, windows=windows, left_outer=True
    )
    assert second.results == [("l1", "r1", 1000, 2000)]
    assert len(waiting[0]) == 1 and waiting[0].rows == ["l2"]

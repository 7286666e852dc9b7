"""overlap_join(how="left")'s per-key step, without Spark, against the brute-force answer.

SPEC 10: every overlapping pair once, with the intersection; a left row that overlaps no right
row once, with nulls and its own interval, as soon as both clocks pass its end and never before;
half-open intervals (a right row starting at a left row's end does not meet it). The step is
driven as Spark drives it (the watermark one batch behind the lower clock, a key called only
with rows or a due timer, the state through its stored form), over streams with ties,
zero-length intervals, intervals valid until the end of stream and quiet endings.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_rowtime.bounds.intervals import INFINITY_US
from pyspark_rowtime.windows.join import (
    _END_MS,
    JoinConfig,
    JoinLogic,
    Side,
    _load,
    _save,
    join_step,
)
from pyspark_rowtime.windows.stateful import as_frames

Rows = list[tuple[int, int, str]]


def side(rows: Rows) -> Side:
    return Side(
        np.array([r[0] for r in rows], dtype=np.int64),
        np.array([r[1] for r in rows], dtype=np.int64),
        [r[2] for r in rows],
    )


def brute_force(lefts: Rows, rights: Rows) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for ls, le, ln in lefts:
        met = False
        for rs, re, rn in rights:
            s, e = max(ls, rs), min(le, re)
            if ls < le and rs < re and s < e:
                out.append((ln, rn, s, e))
                met = True
        if not met and ls < le:
            out.append((ln, None, ls, le))
    return out


@st.composite
def two_streams(draw: st.DrawFn) -> tuple[list[tuple[Rows, Rows]], list[tuple[int, int]]]:
    clocks = [0, 0]
    batches: list[tuple[Rows, Rows]] = []
    after: list[tuple[int, int]] = []
    for b in range(draw(st.integers(1, 8))):
        sides: list[Rows] = [[], []]
        for s in (0, 1):
            for k in range(draw(st.integers(0, 3))):
                clocks[s] += draw(st.sampled_from([0, 0, 1000, 2500, 7000]))
                length = draw(st.sampled_from([0, 1, 1000, 3000, 20_000, None]))
                end = INFINITY_US if length is None else clocks[s] + length
                sides[s].append((clocks[s], end, f"{'lr'[s]}{b}.{k}"))
            clocks[s] += draw(st.sampled_from([0, 1000, 4000]))
        batches.append((sides[0], sides[1]))
        after.append((clocks[0], clocks[1]))
    for _ in range(draw(st.integers(0, 3))):  # quiet endings: bounds only
        for s in (0, 1):
            clocks[s] += draw(st.sampled_from([0, 1000, 30_000]))
        batches.append(([], []))
        after.append((clocks[0], clocks[1]))
    batches += [([], []), ([], [])]
    after += [(INFINITY_US, INFINITY_US)] * 2
    return batches, after


@settings(max_examples=300, deadline=None)
@given(two_streams())
def test_left_join_over_batches_equals_the_brute_force_answer(
    case: tuple[list[tuple[Rows, Rows]], list[tuple[int, int]]],
) -> None:
    batches, clocks = case
    blob: bytes | None = None
    timeout: int | None = None
    watermark = -(2**62)
    got: list[tuple[Any, ...]] = []
    ends = {r[2]: r[1] for lft, _ in batches for r in lft}
    for (lft, rgt), (cl, cr) in zip(batches, clocks, strict=True):
        if lft or rgt or (blob is not None and timeout is not None and watermark > timeout):
            old = _load(blob) if blob is not None else (Side(), Side())
            step = join_step(old, (side(lft), side(rgt)), watermark, left_outer=True)
            for row in step.results:
                if row[1] is None:  # never before the watermark reached the left row's end
                    assert watermark >= _END_MS or watermark * 1000 >= ends[row[0]]
            got += step.results
            blob = None if step.state is None else _save(step.state, left_outer=True)
            timeout = step.timeout_ms
            if step.state is not None:  # as soon as: nothing unmatched is kept past its end
                left = step.state[0]
                w_us = INFINITY_US if watermark >= _END_MS else watermark * 1000
                assert not np.any((left.end <= w_us) & ~left.met())
        low = min(cl, cr)
        watermark = max(watermark, _END_MS if low >= INFINITY_US else low // 1000 - 1)
    assert blob is None  # both streams ended: nothing is kept
    lefts = [r for lft, _ in batches for r in lft]
    rights = [r for _, rgt in batches for r in rgt]
    assert sorted(got, key=repr) == sorted(brute_force(lefts, rights), key=repr)


def test_a_right_row_starting_at_the_left_end_does_not_meet_it() -> None:
    step = join_step(
        (Side(), Side()), (side([(0, 5000, "l")]), side([(5000, 9000, "r")])), 5, left_outer=True
    )
    assert step.results == [("l", None, 0, 5000)]


def test_an_inner_join_state_keeps_its_0_1_0_form() -> None:
    """An inner join stores (starts, ends, rows) per side, as 0.1.0 did, now inside the
    versioned envelope (format version 1); the bare form of 0.1.0 reads too. A left join adds
    the matched flags as a fourth field, read back as they were."""
    import pickle

    old = (side([(0, 5000, "a")]), side([(1000, 9000, "b")]))
    stored = pickle.loads(_save(old))
    assert stored["v"] == 1 and [len(s) for s in stored["state"]] == [3, 3]
    assert _load(pickle.dumps(stored["state"]))[1].rows == ["b"]  # as 0.1.0 stored it
    loaded = _load(_save(old))
    assert loaded[0].rows == ["a"] and loaded[1].rows == ["b"]
    assert join_step(loaded, (Side(), Side()), 6).results == []
    flags = join_step((Side(), Side()), old, 0, left_outer=True).state
    assert flags is not None
    assert _load(_save(flags, left_outer=True))[0].met().tolist() == [True]


def spark_frame(lft: Rows, rgt: Rows) -> pd.DataFrame:
    """A key's rows as Spark's worker hands them to the logic: both sides in one frame, each
    side's payload a struct (a dict here) and the other side's null."""
    rows = [(s, e, {"name": n}, None) for s, e, n in lft]
    rows += [(s, e, None, {"name": n}) for s, e, n in rgt]
    return pd.DataFrame(
        {
            "k": [7] * len(rows),
            "__t": np.array([r[0] for r in rows], dtype=np.int64),
            "__e": np.array([r[1] for r in rows], dtype=np.int64),
            "__l": [r[2] for r in rows],
            "__r": [r[3] for r in rows],
            "__never_late": np.full(len(rows), 2**63 - 1, dtype=np.int64),
        }
    )


@settings(max_examples=50, deadline=None)  # the step's own property runs 300
@given(two_streams())
def test_the_logic_over_spark_shaped_frames_equals_the_brute_force_answer(
    case: tuple[list[tuple[Rows, Rows]], list[tuple[int, int]]],
) -> None:
    """``JoinLogic.step`` as ``stateful.run_on_state_store`` calls it (a row's side told by
    which struct it carries, the state through the left join's format) emits the brute-force
    answer as plain columns (times in microseconds, ``__kept`` < 0 on a result row), and one
    metric row per call with the intervals kept."""
    batches, clocks = case
    logic = JoinLogic(JoinConfig(("k",), True, (None, None)))
    blob: bytes | None = None
    timeout: int | None = None
    watermark = -(2**62)
    got: list[tuple[Any, ...]] = []
    for (lft, rgt), (cl, cr) in zip(batches, clocks, strict=True):
        if lft or rgt or (blob is not None and timeout is not None and watermark > timeout):
            state = None if blob is None else logic.format.loads(blob)
            frames = iter([spark_frame(lft, rgt)] if lft or rgt else [])
            step = logic.step((7,), frames, state, watermark)
            (out,) = as_frames(step.frames)
            records = out.to_dict("records")
            metric = records.pop()
            kept = 0 if step.state is None else len(step.state.left) + len(step.state.right)
            assert metric["__kept"] == kept
            for r in records:
                assert r["__kept"] < 0 and r["k"] == 7
                right = None if r["__r"] is None else r["__r"]["name"]
                got.append((r["__l"]["name"], right, int(r["__ts"]), int(r["__te"])))
            blob = None if step.state is None else logic.format.dumps(step.state)
            timeout = step.timeout_ms
        low = min(cl, cr)
        watermark = max(watermark, _END_MS if low >= INFINITY_US else low // 1000 - 1)
    assert blob is None
    lefts = [r for lft, _ in batches for r in lft]
    rights = [r for _, rgt in batches for r in rgt]
    assert sorted(got, key=repr) == sorted(brute_force(lefts, rights), key=repr)

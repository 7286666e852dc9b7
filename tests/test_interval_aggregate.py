"""interval_aggregate's core and per-key step, without Spark, against the relational answer.

The reference (:func:`relational`) looks at every instant: the rows valid there, aggregated as
SQL aggregates them (nulls skipped), with adjacent instants merged only when their *sets of
rows* are equal (SPEC 10). The step is driven batch after batch as Spark drives it: the
watermark one batch behind the clock, a key called only when it has rows or its timer is due,
streams with ties, zero-length intervals, intervals valid until the end of stream and quiet
endings (only bounds after the last row).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_rowtime.bounds.errors import OptionError
from pyspark_rowtime.bounds.intervals import INFINITY_US, range_reduce, stretches
from pyspark_rowtime.windows import validity
from pyspark_rowtime.windows.stateful import as_frames
from pyspark_rowtime.windows.validity import (
    _END_MS,
    INTERVAL_FORMAT,
    IntervalAgg,
    IntervalConfig,
    IntervalLogic,
    _load,
    _save,
    interval_step,
    parse_aggs,
)

Row = tuple[int, int, Any, Any]  # start, end, an int or None, a string or None

AGGS = [
    IntervalAgg("n", "count", None, None),
    IntervalAgg("n_v", "count", "__in0", "__nn0", True),
    IntervalAgg("sum_v", "sum", "__in0", "__nn0", True),
    IntervalAgg("avg_v", "avg", "__in0", "__nn0", True),
    IntervalAgg("min_v", "min", "__in1", "__nn1", True),
    IntervalAgg("max_s", "max", "__in2", "__nn2", False),
    IntervalAgg("min_s", "min", "__in2", "__nn2", False),
]


def relational(rows: list[Row]) -> list[tuple[int, int, list[Any]]]:
    """Every maximal stretch of constant, non-empty row set, with SQL's aggregates over it."""
    points = sorted({p for s, e, _, _ in rows if s < e for p in (s, e)})
    out: list[tuple[int, int, frozenset[int], list[Any]]] = []
    for a, b in itertools.pairwise(points):
        valid = frozenset(i for i, (s, e, _, _) in enumerate(rows) if s <= a < e)
        if not valid:
            continue
        if out and out[-1][1] == a and out[-1][2] == valid:
            out[-1] = (out[-1][0], b, valid, out[-1][3])
            continue
        vs = [rows[i][2] for i in valid if rows[i][2] is not None]
        ss = [rows[i][3] for i in valid if rows[i][3] is not None]
        values = [
            len(valid),
            len(vs),
            sum(vs) if vs else None,
            sum(vs) / len(vs) if vs else None,
            min(vs) if vs else None,
            max(ss) if ss else None,
            min(ss) if ss else None,
        ]
        out.append((a, b, valid, values))
    return [(a, b, v) for a, b, _, v in out]


def frame(rows: list[Row]) -> pd.DataFrame:
    v = [r[2] for r in rows]
    s = [r[3] for r in rows]
    return pd.DataFrame(
        {
            "__t": np.array([r[0] for r in rows], dtype=np.int64),
            "__e": np.array([r[1] for r in rows], dtype=np.int64),
            "__in0": np.array([0 if x is None else x for x in v], dtype=np.int64),
            "__nn0": np.array([x is not None for x in v]),
            "__in1": pd.Series(v, dtype="object").astype("Int64").fillna(0).astype(np.int64),
            "__nn1": np.array([x is not None for x in v]),
            "__in2": pd.Series(s, dtype="object"),
            "__nn2": np.array([x is not None for x in s]),
        }
    )


def run(batches: list[list[Row]], clocks: list[int]) -> tuple[list[Any], int]:
    """Drive the step as Spark does: batch b's watermark is the clock after batch b - 1 minus
    1 ms, in whole ms; the key is called when it has rows or its timer is due; the state goes
    through its stored form. Returns the emitted stretches and the most rows ever kept."""
    blob: bytes | None = None
    timeout: int | None = None
    out: list[Any] = []
    most = 0
    watermark = -(2**62)
    for rows, clock in zip(batches, clocks, strict=True):
        if rows or (blob is not None and timeout is not None and watermark > timeout):
            old, from_us = _load(blob) if blob is not None else (None, None)
            result = interval_step(AGGS, old, from_us, frame(rows) if rows else None, watermark)
            assert result.discarded == 0
            out.extend(result.stretches)
            blob = None if result.rows is None else _save(result.rows, result.from_us)
            timeout = result.timeout_ms
            most = max(most, 0 if result.rows is None else len(result.rows))
        watermark = max(watermark, _END_MS if clock >= INFINITY_US else clock // 1000 - 1)
    return out, most


def close(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9)
    return bool(a == b)


def same(got: list[Any], want: list[Any]) -> None:
    assert [(a, b) for a, b, _ in got] == [(a, b) for a, b, _ in want]
    for (a, b, g), (_, _, w) in zip(got, want, strict=True):
        assert all(close(x, y) for x, y in zip(g, w, strict=True)), (a, b, g, w)


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[list[Row]], list[int]]:
    clock = draw(st.integers(0, 5)) * 1000
    batches: list[list[Row]] = []
    clocks: list[int] = []
    for _ in range(draw(st.integers(1, 8))):
        rows: list[Row] = []
        for _ in range(draw(st.integers(0, 4))):
            clock += draw(st.sampled_from([0, 0, 1000, 2500, 7000]))  # ties
            length = draw(st.sampled_from([0, 1, 1000, 3000, 20_000, None]))  # zero, infinite
            end = INFINITY_US if length is None else clock + length
            v = draw(st.one_of(st.none(), st.integers(-5, 5)))
            s = draw(st.one_of(st.none(), st.sampled_from(["a", "b", "c"])))
            rows.append((clock, end, v, s))
        clock += draw(st.sampled_from([0, 1000, 4000]))  # a bound moves the clock on
        batches.append(rows)
        clocks.append(clock)
    # A quiet ending: bounds only, then the end of stream, then Spark's batch after it.
    for _ in range(draw(st.integers(0, 3))):
        clock += draw(st.sampled_from([1000, 30_000]))
        batches.append([])
        clocks.append(clock)
    batches += [[], []]
    clocks += [INFINITY_US, INFINITY_US]
    return batches, clocks


@settings(max_examples=300, deadline=None)
@given(streams())
def test_the_step_over_batches_gives_the_relational_answer_at_every_instant(
    case: tuple[list[list[Row]], list[int]],
) -> None:
    batches, clocks = case
    got, _ = run(batches, clocks)
    same(got, relational([r for b in batches for r in b]))


def test_stretches_cut_only_where_the_set_changes() -> None:
    # [0,10) and [10,20) give two stretches with different sets; an empty row at 5 changes
    # nothing; a row starting at 20 exactly after [10,20) ends gives a third.
    rows = [(0, 10, 1, None), (10, 20, 1, None), (5, 5, 7, None), (20, 30, 1, None)]
    got, _ = run([rows, [], []], [30, INFINITY_US, INFINITY_US])
    assert [(a, b, v[0], v[2]) for a, b, v in got] == [
        (0, 10, 1, 1),
        (10, 20, 1, 1),
        (20, 30, 1, 1),
    ]


def test_a_stretch_is_emitted_once_the_watermark_passes_its_end_and_not_before() -> None:
    old = None
    rows = [(0, 5000, 1, None), (2000, INFINITY_US, 2, None)]
    result = interval_step(AGGS, old, None, frame(rows), 1)  # W = 1 ms: nothing ended
    assert result.stretches == []
    result = interval_step(AGGS, result.rows, result.from_us, None, 4)  # W = 4 ms: [0, 2 ms)
    assert [(a, b) for a, b, _ in result.stretches] == [(0, 2000)]
    result = interval_step(AGGS, result.rows, result.from_us, None, 5)
    assert [(a, b) for a, b, _ in result.stretches] == [(2000, 5000)]
    result = interval_step(AGGS, result.rows, result.from_us, None, 10**12)
    assert result.stretches == [] and result.rows is not None  # infinity waits for the end
    result = interval_step(AGGS, result.rows, result.from_us, None, _END_MS)
    assert [(a, b) for a, b, _ in result.stretches] == [(5000, INFINITY_US)]
    assert result.rows is None


def test_a_row_starting_at_the_watermark_ends_the_stretch_before_it_at_once() -> None:
    """A row that starts exactly at the watermark (5 ms) cuts the stretch ``[0, 5 ms)``, which
    no later row can change: it is emitted in this batch, not the next; the rows that start
    after the watermark are kept, untouched."""
    rows = [(0, 10_000, 1, None), (5000, 8000, 2, None), (6000, 9000, 3, None)]
    result = interval_step(AGGS, None, None, frame(rows), 5)
    assert [(a, b) for a, b, _ in result.stretches] == [(0, 5000)]
    assert result.rows is not None and sorted(result.rows["__t"]) == [0, 5000, 6000]
    result = interval_step(AGGS, result.rows, result.from_us, None, 9)
    assert [(a, b) for a, b, _ in result.stretches] == [(5000, 6000), (6000, 8000), (8000, 9000)]


def test_state_stays_flat_on_a_long_stream() -> None:
    """A time window of 10 ms over a row per ms, 20,000 rows in 200 batches: the key never
    keeps more than the rows of a window and a batch, however long the stream."""
    batches, clocks, t = [], [], 0
    for _ in range(200):
        rows = []
        for _ in range(100):
            rows.append((t, t + 10_000, 1, "a"))
            t += 1000
        batches.append(rows)
        clocks.append(t)
    batches += [[], []]
    clocks += [INFINITY_US, INFINITY_US]
    got, most = run(batches, clocks)
    assert most <= 100 + 12
    assert got[-1][1] == t - 1000 + 10_000
    assert max(v[0] for _, _, v in got) == 10


def test_late_rows_are_counted_not_used() -> None:
    first = interval_step(AGGS, None, None, frame([(0, 5000, 1, None)]), 3)
    assert first.from_us == 0
    first = interval_step(AGGS, first.rows, first.from_us, None, 6)
    assert first.rows is None  # all given: the key keeps nothing
    late = interval_step(AGGS, None, 5000, frame([(1000, 9000, 1, None)]), 6)
    assert late.discarded == 1 and late.stretches == [] and late.rows is None


def test_range_reduce_equals_a_loop() -> None:
    rng = np.random.default_rng(7)
    for m in (1, 2, 3, 17, 64, 100):
        lo = rng.integers(0, m + 1, 300)
        hi = rng.integers(0, m + 1, 300)
        for v in (rng.integers(-100, 100, 300), rng.integers(-100, 100, 300) / 8):
            for kind, f, ident in (("add", sum, 0), ("min", min, None), ("max", max, None)):
                got = range_reduce(kind, lo, hi, v, m)  # eighths add exactly in floats too
                for i in range(m):
                    covered = [x for a, b, x in zip(lo, hi, v.tolist(), strict=True) if a <= i < b]
                    if covered:
                        assert got[i] == f(covered)
                    elif ident is not None:
                        assert got[i] == ident


def test_stretches_clip_rows_that_began_before_the_cut() -> None:
    points, lo, hi = stretches([0, 5, 8], [10, 7, 8], 6, 9)
    assert points.tolist() == [6, 7]
    assert (lo[0], hi[0]) == (0, 1) and (lo[1], hi[1]) == (0, 1)
    assert lo[2] >= hi[2]  # empty


def test_parse_aggs() -> None:
    assert parse_aggs({"n": "count(*)", "t": "SUM(v * 2)", "m": "mean(x)"}) == [
        ("n", "count", None),
        ("t", "sum", "v * 2"),
        ("m", "avg", "x"),
    ]
    for bad, message in [
        ({}, "non-empty dict"),
        ({"x": "median(v)"}, "is not one of count"),
        ({"x": "sum(*)"}, "only count takes *"),
        ({"rowtime": "count(*)"}, "other than"),
        ({"x": "sum()"}, "has no argument"),
    ]:
        with pytest.raises(OptionError, match=message.replace("(", r"\(")):
            parse_aggs(bad)  # type: ignore[arg-type]


def run_logic(batches: list[list[Row]], clocks: list[int], chunk: int | None = None) -> list[Any]:
    """``run`` through the operator's logic, as ``stateful.run_on_state_store`` calls it: the
    key's rows as the frames Spark hands over (``chunk`` rows each, as Spark's
    ``maxRecordsPerBatch`` cuts them; None: one frame), the state through ``INTERVAL_FORMAT``,
    and the rows it emits unpacked as the query does (each row's arrays side by side,
    ``inline``): at least one row a call, the metrics on each."""
    columns = ("__t", "__e", "__in0", "__nn0", "__in1", "__nn1", "__in2", "__nn2")
    logic = IntervalLogic(IntervalConfig(tuple(AGGS), None, ("s",), columns))
    blob: bytes | None = None
    timeout: int | None = None
    out: list[Any] = []
    watermark = -(2**62)
    for rows, clock in zip(batches, clocks, strict=True):
        if rows or (blob is not None and timeout is not None and watermark > timeout):
            state = None if blob is None else INTERVAL_FORMAT.loads(blob)
            full = frame(rows).assign(s="x", __never_late=2**63 - 1)
            size = chunk or max(len(full), 1)
            frames = iter(
                [full.iloc[i : i + size].reset_index(drop=True) for i in range(0, len(full), size)]
            )
            step = logic.step(("x",), frames, state, watermark)
            emitted = [r for f in as_frames(step.frames) for r in f.to_dict("records")]
            assert emitted, "a row a call, for the metrics"
            kept = 0 if step.state is None else len(step.state.rows)
            assert {r["__kept"] for r in emitted} == {kept}
            assert sum(r["__discarded"] for r in emitted) == 0
            for r in emitted:
                assert r["s"] == "x"
                assert len(r["__ts"]) <= validity.PACK
                assert len(r["__ts"]) or len(emitted) == 1, "an empty row only alone"
                arrays = [r[a.name] for a in AGGS]
                assert all(len(a) == len(r["__ts"]) for a in [r["__te"], *arrays])
                for i, (ts, te) in enumerate(zip(r["__ts"], r["__te"], strict=True)):
                    values = [a[i] for a in arrays]
                    values = [None if v is None or v is pd.NA or v != v else v for v in values]
                    out.append((int(ts), int(te), values))
            blob = None if step.state is None else INTERVAL_FORMAT.dumps(step.state)
            timeout = step.timeout_ms
        watermark = max(watermark, _END_MS if clock >= INFINITY_US else clock // 1000 - 1)
    assert blob is None
    return out


@settings(max_examples=25, deadline=None)  # the step's own property runs 300
@given(streams(), st.sampled_from([1, 2, 3, validity.PACK]), st.sampled_from([None, 1, 2, 3]))
def test_the_logic_emits_the_relational_answer_packed(
    case: tuple[list[list[Row]], list[int]], pack: int, chunk: int | None
) -> None:
    """The rows the logic hands Spark (times as microseconds, up to ``PACK`` stretches a row,
    one row at least a call) hold the relational answer, as the step's own output does,
    whatever the size of the pieces and however Spark cuts a key's rows into frames."""
    batches, clocks = case
    real = validity.PACK
    validity.PACK = pack
    try:
        got = run_logic(batches, clocks, chunk)
    finally:
        validity.PACK = real
    same(got, relational([r for b in batches for r in b]))

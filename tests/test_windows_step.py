"""The per-key step of ``time_interval_aggregate`` (no Spark): parameters, and the panes it
emits batch by batch against the pure core's ``TimeIntervalWindow`` with brute-force
aggregates, under Spark's calling rules (a key is called when it has rows or its event-time
timeout is below the watermark)."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pandas as pd
import pytest

from pyspark_rowtime.bounds.errors import OptionError
from pyspark_rowtime.bounds.panes import TimeIntervalSpec, TimeIntervalWindow
from pyspark_rowtime.windows.aggregate import make_spec
from pyspark_rowtime.windows.step import (
    PARTIAL_COLUMNS,
    AggPlan,
    merge_step,
    preaggregate,
    run_step,
)

S = 1_000_000  # microseconds per second

# -- parameters ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"interval_duration": 0}, ["interval_duration=0", "greater than 0"]),
        ({"interval_duration": -5}, ["interval_duration=-5", "greater than 0"]),
        ({"interval_duration": 10, "creation_period": 0}, ["creation_period=0", "greater than"]),
        ({"interval_duration": 10, "discard_age": -1}, ["discard_age=-1", "0 or more"]),
        ({"interval_duration": 10, "interval_offset": 10}, ["interval_offset=10", "[0, "]),
        ({"interval_duration": 10, "interval_offset": -1}, ["interval_offset=-1", "[0, "]),
        ({"interval_duration": "ten seconds"}, ["interval_duration", "'ten seconds'"]),
        ({"interval_duration": "-3 seconds"}, ["interval_duration", "'-3 seconds'"]),
    ],
)
def test_each_invalid_parameter_is_named_with_its_rule(kwargs, names):
    with pytest.raises(OptionError) as e:
        make_spec(**kwargs)
    for part in names:
        assert part in str(e.value)


def test_durations_are_seconds_as_numbers_or_strings():
    spec = make_spec("50 seconds", creation_period=25, discard_age="0 seconds")
    assert (spec.interval_duration_us, spec.creation_period_us, spec.discard_age_us) == (
        50 * S,
        25 * S,
        0,
    )
    assert make_spec("1h", interval_offset="20 minutes").interval_offset_us == 1200 * S
    assert make_spec(Decimal("0.5")).interval_duration_us == S // 2
    assert make_spec(3600).creation_period_us == 3600 * S  # tumbling by default


# -- the step against the core, batch by batch ---------------------------------------------------

AGGS = [
    AggPlan("count", ()),
    AggPlan("count", ("nn",)),
    AggPlan("sum", ("v",)),
    AggPlan("avg", ("v",)),
    AggPlan("min", ("v",)),
    AggPlan("max", ("v",)),
    AggPlan("max_by", ("id", "v")),
    AggPlan("min_by", ("id", "v")),
]


def brute(rows: list[tuple[int, dict]]) -> list:
    """The aggregates of AGGS over a pane's rows, computed the obvious way."""
    vs = [r["v"] for _, r in rows if r["v"] is not None]
    by = [(r["v"], r["id"]) for _, r in rows if r["v"] is not None]
    return [
        len(rows),
        sum(r["nn"] for _, r in rows),
        sum(vs) if vs else None,
        sum(vs) / len(vs) if vs else None,
        min(vs) if vs else None,
        max(vs) if vs else None,
        max(by, key=lambda p: p[0])[1] if by else None,
        min(by, key=lambda p: p[0])[1] if by else None,
    ]


def frame(rows: list[tuple[int, dict]]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "__t": np.array([t for t, _ in rows], dtype=np.int64),
            "v": pd.Series([r["v"] for _, r in rows], dtype="float64"),
            "id": np.array([r["id"] for _, r in rows], dtype=np.int64),
            "nn": np.array([r["nn"] for _, r in rows], dtype=np.int64),
        }
    )


def simulate(spec: TimeIntervalSpec, batches: list[tuple[int, list[tuple[int, dict]]]]):
    """Spark's calls of the step for one key: (batch, emitted panes, discarded) per batch."""
    blob, timeout, out = None, None, []
    for b, (w_ms, rows) in enumerate(batches):
        if rows or (timeout is not None and w_ms > timeout):
            r = run_step(spec, AGGS, [frame(rows)] if rows else [], blob, w_ms)
            blob, timeout = r.state, r.timeout_ms
            assert timeout is None or timeout >= w_ms  # Spark refuses a timeout below it
            out.append((b, [(s, e, v) for s, e, v in r.panes], r.discarded))
        else:
            out.append((b, [], 0))
    return out


def reference(spec: TimeIntervalSpec, batches: list[tuple[int, list[tuple[int, dict]]]]):
    """The core window: advance to each new watermark (emits), then take the batch's rows."""
    window = TimeIntervalWindow(spec)
    last, out = None, []
    for b, (w_ms, rows) in enumerate(batches):
        emitted = []
        if last is None or w_ms > last:
            emitted = [(p.start_us, p.end_us, brute(list(p.rows))) for p in
                       window.advance_watermark(w_ms * 1000)]  # fmt: skip
            last = w_ms
        before = window.ignored_count
        window.insert_many(rows)
        out.append((b, emitted, window.ignored_count - before))
    return out


def settled(batches: list) -> tuple[list, list[float]]:
    """The batches that emit or discard something, with their floats taken out (sums of the
    same values in another order differ in the last bits: compare those with approx)."""
    floats: list[float] = []

    def value(x: object) -> object:
        if isinstance(x, float):
            floats.append(x)
            return "float"
        return None if x is None else int(x)  # type: ignore[call-overload]

    exact = [
        (b, [(s, e, [value(x) for x in v]) for s, e, v in panes], n)
        for b, panes, n in batches
        if panes or n
    ]
    return exact, floats


def assert_same(got: list, want: list) -> None:
    (got_exact, got_floats), (want_exact, want_floats) = settled(got), settled(want)
    assert got_exact == want_exact
    assert got_floats == pytest.approx(want_floats, rel=1e-12)


def random_batches(rng: np.random.Generator, late: bool) -> list[tuple[int, list]]:
    t0 = 1_700_000_000 * S
    w_ms, batches, next_id = t0 // 1000, [], 0
    for _ in range(30):
        rows = []
        for _ in range(int(rng.integers(0, 6))):
            # mostly at or after the watermark (aligned rows), some late when asked
            back = int(rng.integers(0, 120 * S)) if late and rng.random() < 0.3 else 0
            t = w_ms * 1000 + int(rng.integers(1000, 20 * S)) - back
            v = None if rng.random() < 0.1 else float(rng.integers(0, 1000)) + next_id * 1e-6
            rows.append((t, {"v": v, "id": next_id, "nn": int(rng.random() < 0.7)}))
            next_id += 1
        batches.append((w_ms, rows))
        if rng.random() < 0.7:
            w_ms += int(rng.integers(1, 30_000))  # the watermark moves in most batches
    batches.append((w_ms + 10_000_000, []))  # far ahead: everything due triggers and closes
    return batches


@pytest.mark.parametrize(
    "params",
    [
        {"interval_duration": 10},
        {"interval_duration": 50, "creation_period": 25, "discard_age": 30},
        {"interval_duration": 10, "creation_period": 15, "discard_age": 5},  # gaps
        {"interval_duration": 20, "creation_period": 7, "interval_offset": 13.5},
        {"interval_duration": 0.0015, "discard_age": 0.0025},  # panes finer than Spark's ms
    ],
)
@pytest.mark.parametrize("seed", range(2))  # 0: aligned rows, 1: some late
def test_step_emits_what_the_core_window_triggers_batch_by_batch(params, seed):
    spec = make_spec(**params)
    batches = random_batches(np.random.default_rng(seed), late=seed % 2 == 1)
    want = reference(spec, batches)
    assert_same(simulate(spec, batches), want)
    assert any(b[1] for b in want)  # the case emits something


def test_a_late_row_re_triggers_its_pane_at_the_next_watermark_until_discard_age():
    spec = make_spec(10, discard_age=20)
    row = lambda t, v: (t, {"v": v, "id": t, "nn": 1})  # noqa: E731
    batches = [
        (0, [row(1 * S, 5.0), row(2 * S, 7.0)]),
        (10_000, []),  # watermark 10 s: [0, 10) triggers
        (10_000, [row(3 * S, 9.0)]),  # late, within discardAge
        (12_000, []),  # next watermark: [0, 10) again, corrected
        (31_000, [row(4 * S, 1.0)]),  # 31 s > 10 + 20: closed, discarded
    ]
    got = simulate(spec, batches)
    assert got[1][1] == [(0, 10 * S, brute([row(1 * S, 5.0), row(2 * S, 7.0)]))]
    assert got[2][1] == []  # no re-trigger in the batch the late row came in
    assert got[3][1] == [(0, 10 * S, brute([row(1 * S, 5.0), row(2 * S, 7.0), row(3 * S, 9.0)]))]
    assert got[4] == (4, [], 1)


@pytest.mark.parametrize(
    "params",
    [
        {"interval_duration": 50, "creation_period": 25, "discard_age": 30},  # a row in 2 panes
        {"interval_duration": 10, "creation_period": 15, "discard_age": 5},  # gaps
    ],
)
@pytest.mark.parametrize("objects", [False, True])  # numbers reduce in numpy, objects in pandas
def test_partials_of_keys_and_pieces_merge_to_what_each_keys_rows_give(params, objects):
    """Spark pre-aggregates each partition's rows (in chunks) per key and pane, and the state
    function merges the partials of a key in arrival order: any split of the rows, and rows of
    other keys in the same frame, must give each key exactly its own panes and discards."""
    spec = make_spec(**params)
    rng = np.random.default_rng(11)
    batches = random_batches(rng, late=True)
    keys = ["a", "b", None]  # a null key is a key of its own, as in Spark's groupBy
    keyed = [(w_ms, [(t, {**r, "k": keys[int(rng.integers(0, 3))]}) for t, r in rows])
             for w_ms, rows in batches]  # fmt: skip
    states: dict[object, tuple] = {k: (None, None) for k in keys}
    got: dict[object, list] = {k: [] for k in keys}
    for b, (w_ms, rows) in enumerate(keyed):
        # The batch's rows in random pieces (partitions, chunks), each pre-aggregated alone.
        cuts = sorted(int(c) for c in rng.integers(0, len(rows) + 1, size=2))
        partials: dict[object, list[pd.DataFrame]] = {k: [] for k in keys}
        for lo, hi in zip([0, *cuts], [*cuts, len(rows)], strict=True):
            if hi <= lo:
                continue
            piece = frame(rows[lo:hi]).assign(k=[r["k"] for _, r in rows[lo:hi]])
            if objects:  # as Spark hands over decimals, strings...: objects, None for null
                piece["v"] = pd.Series([r["v"] for _, r in rows[lo:hi]], dtype=object)
                piece["id"] = piece["id"].astype(object)
            out = preaggregate(spec, AGGS, piece, ["k"])
            assert list(out.columns) == ["k", *PARTIAL_COLUMNS]
            for k in keys:
                mine = out[out["k"].isna()] if k is None else out[out["k"] == k]
                if len(mine):
                    partials[k].append(mine)
        for k in keys:
            blob, timeout = states[k]
            if partials[k] or (timeout is not None and w_ms > timeout):
                r = merge_step(spec, AGGS, partials[k], blob, w_ms)
                states[k] = (r.state, r.timeout_ms)
                got[k].append((b, r.panes, r.discarded))
            else:
                got[k].append((b, [], 0))
    for k in keys:
        mine = [(w_ms, [(t, r) for t, r in rows if r["k"] == k]) for w_ms, rows in keyed]
        want = reference(spec, mine)
        assert_same(got[k], want)
        assert any(b[1] for b in want)


def test_strings_timestamps_and_narrow_numbers_aggregate_as_spark_does():
    """Inputs that are not plain 64-bit numbers (Spark hands strings and decimals as objects,
    None for null; INT as int32): nulls are skipped, and sums do not wrap at 32 bits."""
    names = [None, "b", "a", "b", None]
    stamps = pd.to_datetime([5, 1, 4, 2, 3], unit="s")
    df = pd.DataFrame(
        {
            "__t": np.arange(5, dtype=np.int64) * S,
            "i": np.full(5, 2**31 - 1, dtype=np.int32),
            "o": pd.Series(names, dtype=object),
            "ts": stamps,
            "none": pd.Series([None] * 5, dtype=object),
        }
    )
    aggs = [
        AggPlan("sum", ("i",)),
        AggPlan("min", ("o",)),
        AggPlan("max", ("o",)),
        AggPlan("max", ("ts",)),
        AggPlan("max_by", ("ts", "o")),
        AggPlan("min_by", ("ts", "o")),
        AggPlan("max", ("none",)),
        AggPlan("sum", ("none",)),
    ]
    spec = make_spec(10)
    held = run_step(spec, aggs, [df], None, 0)
    (pane,) = run_step(spec, aggs, [], held.state, 10_000).panes
    present = [n for n in names if n is not None]
    first_max = names.index(max(present))  # ties: the first row with the highest ordering
    assert pane == (
        0,
        10 * S,
        [
            5 * (2**31 - 1),
            min(present),
            max(present),
            stamps.max(),
            stamps[first_max],
            stamps[names.index(min(present))],
            None,
            None,
        ],
    )

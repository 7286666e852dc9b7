"""The stateful operators' skeleton (windows/stateful.py): each operator's state is versioned and
reads every form a release stored, and one shared piece runs all three on Spark's state store.

The stored forms, per operator, as the releases wrote them (plain values, pickled):

* ``time_interval_aggregate``: a bare list of ``(start, end, triggered, pending_ms, partials)``
  (0.1.0 and 0.2.0); ``{"v": 1, "state": that list}`` since the skeleton.
* ``overlap_join``: a bare list of two sides ``(starts, ends, rows)`` (0.1.0, and an inner join
  of 0.2.0), the left side with a fourth field, the matched flags (a left join of 0.2.0), and a
  third element with each side's rows waiting for their end (a window side, 0.2.0); in the
  envelope since the skeleton.
* ``interval_aggregate`` (after 0.1.0): its bare dict ``{"from", "columns"}`` (its first
  form), then ``{"v": 1, "state": that dict}``.

Each test continues a key from every form and checks the step decides the same as from the
form written today: a restart from an old checkpoint goes on as an uninterrupted run would.
"""

from __future__ import annotations

import ast
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from pyspark_rowtime.bounds.errors import CorruptLogError
from pyspark_rowtime.windows.aggregate import make_spec
from pyspark_rowtime.windows.define import WindowDef
from pyspark_rowtime.windows.join import (
    JoinState,
    Pending,
    Side,
    _load_state,
    join_format,
    window_join_step,
)
from pyspark_rowtime.windows.step import PANES_FORMAT, AggPlan, merge_step, preaggregate
from pyspark_rowtime.windows.validity import (
    INTERVAL_FORMAT,
    IntervalAgg,
    IntervalState,
    _load,
    interval_step,
)

S = 1_000_000
T0 = 1_700_000_000 * S
WINDOWS = Path(__file__).resolve().parent.parent / "windows"


def test_a_time_interval_aggregate_key_goes_on_from_every_form_a_release_stored() -> None:
    spec = make_spec(10)
    aggs = [AggPlan("count", ()), AggPlan("sum", ("v",))]
    # One open pane [T0, T0 + 10 s) holding 2 rows summing to 5.0, and a pane re-triggering.
    panes = [
        (T0, T0 + 10 * S, False, None, [2, [5.0, 2]]),
        (T0 - 10 * S, T0, True, 9, [1, [1.0, 1]]),
    ]
    forms = {
        "0.1.0 and 0.2.0 (bare)": pickle.dumps(panes),
        "the skeleton (envelope)": PANES_FORMAT.dumps(PANES_FORMAT.read[1](panes)),
    }
    new = preaggregate(spec, aggs, pd.DataFrame({"__t": [T0 + 3 * S], "v": [2.5]}), [])
    end_ms = (T0 + 10 * S) // 1000
    runs = {}
    for name, blob in forms.items():
        # The open pane's end: it triggers with what it held, the row comes late and
        # re-triggers it at the next watermark; the re-triggering pane goes out again.
        first = merge_step(spec, aggs, [new], blob, end_ms)
        second = merge_step(spec, aggs, [], first.state, end_ms + 1)
        runs[name] = (first, second)
        assert first.state is not None and pickle.loads(first.state)["v"] == 1, name
    first, second = runs["the skeleton (envelope)"]
    assert first.panes == [(T0 - 10 * S, T0, [1, 1.0]), (T0, T0 + 10 * S, [2, 5.0])]
    assert second.panes == [(T0, T0 + 10 * S, [3, 7.5])]
    for name, (one, two) in runs.items():
        for got, want in ((one, first), (two, second)):
            assert (got.panes, got.discarded, got.timeout_ms) == (
                want.panes, want.discarded, want.timeout_ms,
            ), name  # fmt: skip
        assert PANES_FORMAT.loads(one.state or b"") == PANES_FORMAT.loads(first.state or b"")
        assert two.state is None  # the pane closed (discardAge 0): nothing left to keep


def _sides(left: list[tuple[int, int, str]], right: list[tuple[int, int, str]]) -> list[Any]:
    return [([s for s, _, _ in rows], [e for _, e, _ in rows], [r for _, _, r in rows])
            for rows in (left, right)]  # fmt: skip


def test_an_overlap_join_key_goes_on_from_every_form_a_release_stored() -> None:
    left = [(T0, T0 + 5 * S, "l0"), (T0 + S, T0 + 9 * S, "l1")]
    right = [(T0 + 6 * S, T0 + 8 * S, "r0")]
    inner = _sides(left, right)
    outer = [(*inner[0], [False, True]), inner[1]]  # l1 met r0 (both kept)
    window = WindowDef("rows", 1, ("k",))
    waiting = [*outer, [([T0 + 2 * S], ["k"], [True], ["l2"]), ([], [], [], [])]]
    cases = [  # (form, how it was stored, left_outer, window of the left side)
        ("0.1.0 inner", inner, False, None),
        ("0.2.0 left", outer, True, None),
        ("0.2.0 left, window rows waiting", waiting, True, window),
    ]
    new = (Side(), Side(np.array([T0 + 3 * S]), np.array([T0 + 20 * S]), ["r1"]))
    for name, plain, left_outer, win in cases:
        fmt = join_format(left_outer)
        old = _load_state(pickle.dumps(plain))  # bare, as the release stored it
        again = _load_state(fmt.dumps(JoinState(old[0], old[1], (old[2], old[3]))))
        assert pickle.loads(fmt.dumps(fmt.loads(pickle.dumps(plain))))["v"] == 1
        fresh: tuple[Side | Pending, Side | Pending] = (Pending(), new[1]) if win else new
        steps = [
            window_join_step(
                s, fresh, (T0 + 6 * S) // 1000, windows=(win, None), left_outer=left_outer
            )
            for s in (old, again)
        ]
        (a, wait_a), (b, wait_b) = steps
        assert a.results == b.results and a.timeout_ms == b.timeout_ms, name
        assert [r[:2] for r in a.results] == [("l0", "r1"), ("l1", "r1")], name
        assert [w.rows for w in wait_a] == [w.rows for w in wait_b], name
        assert a.state is not None and b.state is not None
        assert a.state[0].met().tolist() == b.state[0].met().tolist(), name
        if win is not None:
            assert wait_a[0].rows == ["l2"], name  # still waiting for its end


def test_an_interval_aggregate_key_goes_on_from_every_form_a_release_stored() -> None:
    aggs = [
        IntervalAgg("n", "count", None, None),
        IntervalAgg("total", "sum", "__in0", "__nn0", True),
    ]
    plain = {
        "from": T0,
        "columns": {"__t": [T0, T0 + S], "__e": [T0 + 4 * S, T0 + 6 * S], "__in0": [3, 4],
                    "__nn0": [True, True]},
    }  # fmt: skip
    forms = {
        "first form (bare dict)": pickle.dumps(plain),
        "0.2.0 (envelope)": pickle.dumps({"v": 1, "state": plain}),
        "the skeleton": INTERVAL_FORMAT.dumps(INTERVAL_FORMAT.read[1](plain)),
    }
    new = pd.DataFrame({"__t": [T0 + 2 * S], "__e": [T0 + 3 * S], "__in0": [5], "__nn0": [True]})
    steps = {}
    for name, blob in forms.items():
        rows, from_us = _load(blob)
        steps[name] = interval_step(aggs, rows, from_us, new, (T0 + 5 * S) // 1000)
    today = steps["the skeleton"]
    assert today.stretches == [
        (T0, T0 + S, [1, 3]),
        (T0 + S, T0 + 2 * S, [2, 7]),
        (T0 + 2 * S, T0 + 3 * S, [3, 12]),
        (T0 + 3 * S, T0 + 4 * S, [2, 7]),
    ]  # fmt: skip (from T0 up to the watermark; [T0 + 4 s, T0 + 6 s) is not over yet)
    for name, step in steps.items():
        assert step.stretches == today.stretches and step.timeout_ms == today.timeout_ms, name
        assert step.rows is not None and step.rows.equals(today.rows), name


@pytest.mark.parametrize(
    ("fmt", "operator"),
    [
        (PANES_FORMAT, "time_interval_aggregate"),
        (INTERVAL_FORMAT, "interval_aggregate"),
        (join_format(False), "overlap_join"),
        (join_format(True), "overlap_join"),
    ],
)
def test_each_operator_writes_its_version_and_refuses_what_it_cannot_read(
    fmt: Any, operator: str
) -> None:
    with pytest.raises(CorruptLogError) as newer:
        fmt.loads(pickle.dumps({"v": fmt.version + 1, "state": []}))
    assert operator in str(newer.value) and f"up to {fmt.version}" in str(newer.value)
    # Version 1 that does not hold what version 1 holds: altered, named, never half read.
    with pytest.raises(CorruptLogError) as damaged:
        fmt.loads(pickle.dumps({"v": 1, "state": 42}))
    assert operator in str(damaged.value) and "altered" in str(damaged.value)
    # interval_aggregate writes version 3 (numeric columns compressed); the others version 1.
    assert fmt.version == (3 if operator == "interval_aggregate" else 1)
    assert pickle.loads(fmt.dumps(fmt.read[1](_PLAIN_V1[operator])))["v"] == fmt.version


#: A version 1 state of each operator, plain, as a release stored it.
_PLAIN_V1: dict[str, Any] = {
    "time_interval_aggregate": [(T0, T0 + 10 * S, False, None, [1, [1.0, 1]])],
    "interval_aggregate": {"from": None, "columns": {"__t": [T0], "__e": [T0 + S]}},
    "overlap_join": [([T0], [T0 + S], ["l"]), ([], [], [])],
}


def _calls(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
    }


def test_the_three_operators_run_on_the_state_store_through_one_shared_piece() -> None:
    """Spark's stateful API, timeouts and observed metrics are called in stateful.py only; each
    operator module hands its logic to it (issue 54's speed-ups go in that one place)."""
    spark_state = {"applyInPandasWithState", "setTimeoutTimestamp", "observe", "update", "remove"}
    for path in sorted(WINDOWS.glob("*.py")):
        used = _calls(path) & spark_state
        if path.name == "stateful.py":
            assert used == spark_state
        else:
            assert not used & {"applyInPandasWithState", "setTimeoutTimestamp", "observe"}, path
    for module in ("aggregate.py", "validity.py", "join.py"):
        assert "run_on_state_store" in _calls(WINDOWS / module), module


def test_a_large_state_is_kept_as_base64_text_and_every_stored_form_reads() -> None:
    """From ``ARMOR_FROM_BYTES`` on a state goes to Spark's state store as base64 text (the
    fast path of the JVM's pickler, which hands it back to Python with every chunk of rows);
    below it, and as every release stored it, the pickle itself; both read back the same.
    Text that is neither is refused by name, never unpickled."""
    from pyspark_rowtime.windows import stateful

    small = INTERVAL_FORMAT.dumps(INTERVAL_FORMAT.read[1](_PLAIN_V1["interval_aggregate"]))
    assert small[:1] == b"\x80" and stateful.to_store(small) == small
    rows = pd.DataFrame({"__t": np.arange(10_000) * S, "__e": np.arange(10_000) * S + 3 * S,
                         "__in0": np.random.default_rng(1).random(10_000)})  # fmt: skip
    large = INTERVAL_FORMAT.dumps(IntervalState(rows, T0))
    assert len(large) >= stateful.ARMOR_FROM_BYTES
    stored = stateful.to_store(large)
    assert stored.isascii() and stored != large
    for kept in (stored, bytearray(stored), large, bytearray(small)):  # Spark hands bytearrays
        back = stateful.from_store(kept, INTERVAL_FORMAT.what)
        assert bytes(back) in (large, small)
    again = INTERVAL_FORMAT.loads(stateful.from_store(stored, INTERVAL_FORMAT.what))
    assert again.rows.equals(rows) and again.from_us == T0
    with pytest.raises(CorruptLogError, match=r"interval_aggregate key.*neither a pickle"):
        stateful.from_store(b"not*base64", INTERVAL_FORMAT.what)

"""Keys by the bucket (``spark.rowtime.state.buckets``): what comes out is what a group per key
gives, row for row, and a checkpoint's layout is never read as the other.

``stateful.step_bucket`` is driven as Spark drives a bucket (called with the rows of its keys,
or when the watermark passes its timeout, the state through its stored form) beside each key
driven on its own as Spark drives a group per key, over several keys, batches and bucket
counts; the left join is the operator (its null rows and timers are where a bucket could
differ), and both are checked against the brute-force answer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_overlap_join_left import Rows, brute_force, spark_frame

from pyspark_rowtime.bounds.errors import CorruptLogError
from pyspark_rowtime.bounds.intervals import INFINITY_US
from pyspark_rowtime.windows.join import _END_MS, JoinConfig, JoinLogic
from pyspark_rowtime.windows.stateful import (
    BUCKET_FORMAT,
    BUCKETS_CONF,
    MASKED_FROM_ROWS,
    BucketState,
    _is_bucket,
    as_frames,
    key_column,
    rows_column,
    step_bucket,
)

Batch = dict[int, tuple[Rows, Rows]]


@st.composite
def keyed_streams(draw: st.DrawFn) -> tuple[list[Batch], list[int]]:
    """Batches of rows of keys 0-5 on both sides (each side's clock never going back, every
    row starting at or after it) and the watermark after each batch (the lower clock - 1 ms),
    ending with both streams at the end."""
    clocks = [0, 0]
    batches: list[Batch] = []
    watermarks: list[int] = []
    for _ in range(draw(st.integers(1, 6))):
        batch: Batch = {}
        for key in draw(st.sets(st.integers(0, 5), max_size=4)):
            sides: list[Rows] = [[], []]
            for s in (0, 1):
                for _ in range(draw(st.integers(0, 3))):
                    start = clocks[s] + draw(st.integers(0, 3)) * 1000
                    length = draw(st.sampled_from([0, 1000, 2000, 5000, INFINITY_US]))
                    end = INFINITY_US if length == INFINITY_US else start + length
                    sides[s].append((start, end, f"{key}{'lr'[s]}{len(batches)}.{len(sides[s])}"))
                    clocks[s] = max(clocks[s], start)
            batch[key] = (sides[0], sides[1])
        for s in (0, 1):
            clocks[s] += draw(st.integers(0, 4)) * 1000
        batches.append(batch)
        watermarks.append(min(clocks) // 1000 - 1)
    # Both streams end, then the no-data batch that runs with that watermark fires every timer.
    batches += [{}, {}]
    watermarks += [_END_MS, _END_MS]
    return batches, watermarks


def frame_of(key: int, lft: Rows, rgt: Rows) -> pd.DataFrame:
    return spark_frame(lft, rgt).assign(k=key)


def results(frames: list[tuple[int, pd.DataFrame]]) -> list[tuple[Any, ...]]:
    """The result rows, each with the batch that emitted it."""
    out = []
    for batch, f in frames:
        for r in f.to_dict("records"):
            if r["__kept"] < 0:
                right = None if r["__r"] is None else r["__r"]["name"]
                out.append((batch, r["k"], r["__l"]["name"], right, int(r["__ts"]), int(r["__te"])))
    return sorted(out, key=repr)


def due_at(timeout: int | None, watermark: int) -> bool:
    """Spark fires an event-time timeout once the watermark is above it."""
    return timeout is not None and watermark > timeout


def per_key(logic: JoinLogic, batches: list[Batch], watermarks: list[int]) -> list[Any]:
    """Each key as its own group: called with its rows, or when the watermark passed its
    timeout (the watermark a batch runs with is the one the batch before it ended with)."""
    stored: dict[int, tuple[bytes, int | None]] = {}
    frames: list[tuple[int, pd.DataFrame]] = []
    watermark = -(2**62)
    for i, (batch, after) in enumerate(zip(batches, watermarks, strict=True)):
        due = [
            k for k, (_, t) in stored.items() if k not in batch and t is not None and watermark > t
        ]
        for key in [*batch, *due]:
            blob = stored.pop(key, (None, None))[0]
            state = None if blob is None else logic.format.loads(blob)
            rows = iter([frame_of(key, *batch[key])] if key in batch else [])
            step = logic.step((key,), rows, state, watermark)
            frames += [(i, f) for f in as_frames(step.frames)]
            if step.state is not None:
                stored[key] = (logic.format.dumps(step.state), step.timeout_ms)
        watermark = max(watermark, after)
    assert not stored
    return results(frames)


def by_bucket(logic: JoinLogic, batches: list[Batch], watermarks: list[int], n: int) -> list[Any]:
    """The same keys in ``n`` buckets (key % n), each bucket a group as Spark drives one: a
    key's results come in the batch they came in per key (a timer fires as early, no
    earlier)."""
    stored: dict[int, tuple[bytes, int | None]] = {}
    frames: list[tuple[int, pd.DataFrame]] = []
    watermark = -(2**62)
    for i, (batch, after) in enumerate(zip(batches, watermarks, strict=True)):
        rows: dict[int, list[pd.DataFrame]] = {}
        for key, (lft, rgt) in batch.items():
            rows.setdefault(key % n, []).append(frame_of(key, lft, rgt))
        due = [
            b for b, (_, t) in stored.items() if b not in rows and t is not None and watermark > t
        ]
        for b in [*rows, *due]:
            blob = stored.pop(b, (None, None))[0]
            state = None if blob is None else BUCKET_FORMAT.loads(blob)
            out, kept, timeout = step_bucket(
                logic, ["k"], n, iter(rows.get(b, [])), state, watermark
            )
            frames += [(i, f) for f in out]
            if kept is not None:
                assert timeout is not None  # a left join's kept interval always has a timer
                stored[b] = (BUCKET_FORMAT.dumps(kept), timeout)
        watermark = max(watermark, after)
    assert not stored
    return results(frames)


@settings(max_examples=60, deadline=None)
@given(keyed_streams(), st.sampled_from([1, 2, 3, 64]))
def test_buckets_give_what_a_group_per_key_gives(
    case: tuple[list[Batch], list[int]], buckets: int
) -> None:
    batches, watermarks = case
    logic = JoinLogic(JoinConfig(("k",), True, (None, None)))
    want = per_key(logic, batches, watermarks)
    assert by_bucket(logic, batches, watermarks, buckets) == want
    expected = []
    for key in {k for b in batches for k in b}:
        lefts = [r for b in batches if key in b for r in b[key][0]]
        rights = [r for b in batches if key in b for r in b[key][1]]
        expected += [(key, *r) for r in brute_force(lefts, rights)]
    assert sorted([r[1:] for r in want], key=repr) == sorted(expected, key=repr)


def test_a_key_state_is_never_read_as_a_bucket_and_back() -> None:
    """A checkpoint of 0.1.0/0.2.0 (a state per key) read by a query defined with buckets, and
    a bucket read per key, stop with the setting the checkpoint needs, not as damage."""
    logic = JoinLogic(JoinConfig(("k",), True, (None, None)))
    step = logic.step((7,), iter([frame_of(7, [(0, 5000, "a")], [])]), None, -1)
    assert step.state is not None
    key_blob = logic.format.dumps(step.state)
    with pytest.raises(CorruptLogError, match=f"{BUCKETS_CONF}=0 to go on"):
        BUCKET_FORMAT.loads(key_blob)
    assert _is_bucket(key_blob) is None
    bucket_blob = BUCKET_FORMAT.dumps(BucketState(16, {(7,): (key_blob, 4)}))
    assert _is_bucket(bucket_blob) == 16
    with pytest.raises(CorruptLogError):
        logic.format.loads(bucket_blob)  # what run_on_state_store turns into the named error
    back = BUCKET_FORMAT.loads(bucket_blob)
    assert back.buckets == 16 and logic.format.loads(back.keys[(7,)][0]).left.rows == [
        {"name": "a"}
    ]


def test_a_bucket_joins_its_keys_columns_exactly() -> None:
    """One frame per call: the keys' columns end to end, a 64-bit integer beside a lone null
    kept exact (not a float), a tuple kept one value; a large frame's integer and boolean
    columns in pandas' masked types (Spark's worker would make them objects), same values."""
    big = 2**60 + 1
    (f,) = as_frames(
        [
            {"k": key_column("a", 1), "v": [None], "t": np.array([1])},
            {"k": key_column("b", 1), "v": pd.array([big], dtype="Int64"), "t": np.array([2])},
            {"k": key_column("c", 1), "v": rows_column([(1, 2)], 1), "t": np.array([3])},
        ]
    )
    assert f.to_dict("list") == {"k": ["a", "b", "c"], "v": [None, big, (1, 2)], "t": [1, 2, 3]}
    n = MASKED_FROM_ROWS
    (f,) = as_frames([{"t": np.arange(n), "ok": np.arange(n) % 2 == 0, "x": np.ones(n)}])
    assert [str(d) for d in f.dtypes] == ["Int64", "boolean", "float64"]
    assert f["t"].tolist() == list(range(n)) and f["ok"].sum() == n // 2
    (small,) = as_frames([{"t": np.arange(3)}])
    assert small["t"].dtype == np.int64

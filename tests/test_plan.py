"""Alignment across partitions (SPEC 5 and 7): the stream clock and what each step emits."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.bounds.plan import StreamPosition, bound_to_emit, choose_ends, step
from pyspark_rowtime.bounds.policies import AdjustPolicy, DropPolicy, PolicyRun, scan_partition
from test_policies import POLICIES, streams, tolerant


def run_steps(policy, parts, schedule):
    """Drive a stream of several partitions through steps; each step admits some records."""
    pos = StreamPosition.start([0] * len(parts))
    batches = []
    for ends in schedule:
        # a position survives a trip through JSON, as in a Spark offset log
        pos = StreamPosition.from_dict(json.loads(json.dumps(pos.to_dict())))
        scans = []
        for p, (t, b) in enumerate(parts):
            st_ = pos.partitions[p]
            scans.append(scan_partition(policy, st_, t[st_.scan : ends[p]], b[st_.scan : ends[p]]))
        new, out = step(policy, pos, scans)
        rows = [
            [(int(st_.scan + i), int(r)) for i, r in zip(c.emit, c.emit_rowtime_us, strict=True)]
            for st_, c in zip(pos.partitions, out, strict=True)
        ]
        batches.append(
            (pos.clock_us, new.clock_us, rows, bound_to_emit(pos.clock_us, new.clock_us))
        )
        pos = new
    return pos, batches


@st.composite
def multi(draw):
    k = draw(st.integers(1, 3))
    parts = []
    for _ in range(k):
        t, b = draw(streams(max_len=30))
        if len(b) == 0 or not (b[-1] and t[-1] == END_OF_STREAM_US):
            t = np.append(t, END_OF_STREAM_US)
            b = np.append(b, True)
        parts.append((t, b))
    steps = draw(st.integers(1, 6))
    schedule = []
    cur = [0] * k
    for _ in range(steps):
        cur = [min(len(parts[i][0]), c + draw(st.integers(0, 12))) for i, c in enumerate(cur)]
        schedule.append(list(cur))
    schedule.append([len(p[0]) for p in parts])
    return parts, schedule


@given(policy=POLICIES, data=multi())
def test_steps_keep_rows_between_consecutive_stream_clocks(policy, data):
    policy = tolerant(policy)
    parts, schedule = data
    final, batches = run_steps(policy, parts, schedule)
    for before, after, rows, bound in batches:
        for prow in rows:
            for _, r in prow:
                assert after is not None and r <= after
                assert before is None or r >= before
        # one bound record exactly when the stream clock advanced
        assert (bound is not None) == (after is not None and (before is None or after > before))
        if before is not None:
            assert after is not None and after >= before
    assert final.clock_us == END_OF_STREAM_US


@given(policy=POLICIES, data=multi())
def test_alignment_delays_rows_but_never_loses_reorders_or_doubles_them(policy, data):
    policy = tolerant(policy)
    parts, schedule = data
    _, batches = run_steps(policy, parts, schedule)
    for p, (t, b) in enumerate(parts):
        alone = PolicyRun(policy).push(t, b)
        got = [o for _, _, rows, _ in batches for o, _ in rows[p]]
        assert got == alone.offsets.tolist()


@given(policy=POLICIES, data=multi(), redo=st.integers(0, 6))
def test_replaying_a_step_from_its_offset_gives_the_same_rows_and_bound(policy, data, redo):
    policy = tolerant(policy)
    parts, schedule = data
    redo = min(redo, len(schedule) - 1)
    _, batches = run_steps(policy, parts, schedule)
    # restart: run the first `redo` steps, then replay step `redo` again from its start offset
    _, again = run_steps(policy, parts, schedule[: redo + 1])
    assert again[redo] == batches[redo]


def test_a_quiet_partition_holds_the_stream_clock_until_it_sends_a_bound():
    policy = DropPolicy()
    fast = (np.array([10, 20, 30], dtype=np.int64), np.zeros(3, dtype=bool))
    quiet = (np.array([5, 25], dtype=np.int64), np.array([False, True]))
    _, batches = run_steps(policy, [fast, quiet], [[3, 1], [3, 2]])
    (b0, a0, rows0, bound0), (_b1, a1, rows1, bound1) = batches
    assert (b0, a0, bound0) == (None, 5, 5)
    assert rows0 == [[], [(0, 5)]]
    assert (a1, bound1) == (25, 25)
    assert rows1 == [[(0, 10), (1, 20)], []]  # 30 waits for the quiet partition


def test_choose_ends_shares_the_budget_and_always_progresses():
    pos = StreamPosition.start([0, 0, 0])
    assert choose_ends(pos, [100, 100, 100], None) == [100, 100, 100]
    assert choose_ends(pos, [100, 100, 100], 30) == [10, 10, 10]
    assert choose_ends(pos, [2, 100, 100], 30) == [2, 14, 14]
    assert sum(choose_ends(pos, [5, 5, 5], 1)) == 1
    assert choose_ends(pos, [0, 0, 0], 10) == [0, 0, 0]


def test_adjust_positions_are_small_json_of_primitives():
    policy = AdjustPolicy(unit="msec", range=999)
    t = np.arange(0, 10_000_000, 1000, dtype=np.int64)
    _, _batches = run_steps(policy, [(t, np.zeros(len(t), dtype=bool))], [[len(t)]])
    pos = StreamPosition.start([0])
    scan = scan_partition(policy, pos.partitions[0], t, np.zeros(len(t), dtype=bool))
    new, _ = step(policy, pos, [scan])
    text = json.dumps(new.to_dict())
    assert len(text) < 300
    assert new.partitions[0].held == 1000  # the last 999 ms (and the reference row) are held


def test_the_core_imports_neither_pyspark_nor_the_log():
    code = (
        "import sys, pyspark_rowtime.bounds, pyspark_rowtime.bounds.plan, "
        "pyspark_rowtime.bounds.policies\n"
        "import pkgutil, importlib\n"
        "for m in pkgutil.iter_modules(pyspark_rowtime.bounds.__path__):\n"
        "    importlib.import_module('pyspark_rowtime.bounds.' + m.name)\n"
        "bad = [m for m in sys.modules if m.startswith(('pyspark.', 'py4j', "
        "'pyspark_rowtime.streams', 'pyspark_rowtime.datasource', 'pyspark_rowtime.sink'))"
        " or m == 'pyspark']\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""


@pytest.mark.parametrize(
    "offset",
    [{"v": 99, "partitions": {}}, {"partitions": {}}, {"v": 1}, {"v": 1, "partitions": {"0": 5}}],
    ids=["newer version", "no version", "no partitions", "damaged partition"],
)
def test_an_offset_that_cannot_be_read_is_an_offset_error(offset):
    from pyspark_rowtime.bounds.errors import OffsetError

    with pytest.raises(OffsetError, match="offset"):
        StreamPosition.from_dict(offset)

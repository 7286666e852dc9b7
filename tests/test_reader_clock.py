"""The planner's partition clock takes the largest data rowtime between bound records without
masking the whole step (datasource.reader._max_between): the same maximum as a mask, with few
bound records (slice by slice) and with many (one masked reduction)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pyspark_rowtime.bounds.policies import NO_TIME
from pyspark_rowtime.datasource.ordered import _FEW_BOUNDS, _max_between

TIMES = st.integers(min_value=-(2**62), max_value=2**62)


@given(st.lists(st.tuples(TIMES, st.booleans()), max_size=60))
def test_the_largest_data_time_skips_bound_records(records: list[tuple[int, bool]]) -> None:
    t = np.array([r[0] for r in records], dtype=np.int64)
    is_bound = np.array([r[1] for r in records], dtype=bool)
    expected = max((x for x, b in records if not b), default=NO_TIME)
    assert _max_between(t, np.flatnonzero(is_bound)) == expected


def test_many_bound_records_give_the_same_maximum() -> None:
    rng = np.random.default_rng(16)
    t = rng.integers(-(10**15), 10**15, 50_000)
    is_bound = rng.random(len(t)) < 0.3
    skip = np.flatnonzero(is_bound)
    assert len(skip) > _FEW_BOUNDS
    assert _max_between(t, skip) == int(t[~is_bound].max())
    assert _max_between(t, np.arange(len(t))) == NO_TIME


def test_a_step_keeps_its_emitted_runs_when_spark_offsets_carry_the_stream_id(tmp_path) -> None:
    """Spark hands ``partitions`` the offsets ``latestOffset`` returned, which name the stream
    (its id) beside the position: the planner must still find the runs it planned for them, or
    every task replays the policy on the executors (correct, several times slower)."""
    import pyspark_rowtime as pr
    from pyspark_rowtime.bounds.plan import StreamPosition
    from pyspark_rowtime.datasource.options import parse_reader_options
    from pyspark_rowtime.datasource.reader import Planner, partition_tasks

    location = tmp_path / "s"
    pr.create_stream(location, "v INT", partitions=2)
    for p in range(2):
        with pr.open_writer(location, p) as w:
            for i in range(5):
                w.insert({"v": i}, rowtime=1_700_000_000 + i)
            w.end_stream()
    planner = Planner(parse_reader_options({"path": str(location)}))
    start = StreamPosition.start([0, 0])
    new = planner.plan(start, planner.available(), None)
    assert new is not None
    s, e = start.to_dict(), new.to_dict()
    s["stream"] = e["stream"] = "an-id"  # as RowtimeStreamReader._offset adds it
    runs = planner.runs_for(s, e)
    assert runs is not None and all(r is not None and r.rows == 5 for r in runs)
    assert all(t.runs is not None for t in partition_tasks(s, e, runs))
    e["partitions"]["0"]["next"] += 1  # another step: not the one planned
    assert planner.runs_for(s, e) is None

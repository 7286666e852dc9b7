"""The planner's partition clock takes the largest data rowtime between bound records without
masking the whole step (datasource.reader._max_between): the same maximum as a mask, with few
bound records (slice by slice) and with many (one masked reduction)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pyspark_rowtime.bounds.policies import NO_TIME
from pyspark_rowtime.datasource.reader import _FEW_BOUNDS, _max_between

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

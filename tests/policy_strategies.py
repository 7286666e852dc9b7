"""Hypothesis strategies the policy and alignment tests share: policies and record streams."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.bounds.policies import AdjustPolicy, DropPolicy, Policy, RejectPolicy

POLICIES = st.one_of(
    st.just(RejectPolicy()),
    st.just(DropPolicy()),
    st.builds(
        AdjustPolicy,
        unit=st.sampled_from(["usec", "msec", "sec"]),
        range=st.integers(0, 30),
        max_held=st.just(10**9),
    ),
)


@st.composite
def streams(draw, max_len=60):
    """Records (rowtime or bound, is_bound), mostly increasing with jitter, bounds sprinkled."""
    n = draw(st.integers(0, max_len))
    scale = draw(st.sampled_from([1, 1000, 1_000_000]))
    jitter = draw(st.integers(0, 40))
    now = draw(st.integers(-(10**6), 10**6)) * scale
    t, b = [], []
    bound = None
    for _ in range(n):
        now += draw(st.integers(0, 10)) * scale
        if draw(st.integers(0, 9)) == 0:
            value = now + draw(st.integers(-5, 5)) * scale
            bound = value if bound is None else max(bound, value)
            t.append(bound)
            b.append(True)
        else:
            t.append(now - draw(st.integers(0, jitter)) * scale)
            b.append(False)
    if draw(st.booleans()):
        t.append(END_OF_STREAM_US)
        b.append(True)
    return np.array(t, dtype=np.int64), np.array(b, dtype=bool)


def tolerant(policy: Policy) -> Policy:
    return DropPolicy() if isinstance(policy, RejectPolicy) else policy

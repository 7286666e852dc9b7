"""``time_interval_aggregate``'s pre-aggregation of Arrow batches (no Spark): for plain numbers
it reads Spark's Arrow batches without pandas rows (``aggregate._arrow_partials``), and must
give exactly the partials of the pandas path (``step.preaggregate``) that it replaces, bit for
bit, so the panes, their re-triggers and the discarded counts stay what they were."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_rowtime.windows.aggregate import _arrow_partials, _arrow_ready, make_spec
from pyspark_rowtime.windows.step import AggPlan, _segment_order, merge_step, preaggregate

S = 1_000_000
T0 = 1_700_000_000 * S
PLANS = [
    AggPlan("count", ()),
    AggPlan("count", ("__in2",)),
    AggPlan("sum", ("__in0",)),
    AggPlan("avg", ("__in1",)),
    AggPlan("min", ("__in1",)),
    AggPlan("max", ("__in0",)),
    AggPlan("max_by", ("__in1", "__in0")),
    AggPlan("min_by", ("__in0", "__in1")),
]


def plain(batch: Any, keys: list[str]) -> list[tuple]:
    """The partial rows of either path as plain values, the partials unpickled."""
    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    if not isinstance(table, pa.Table):  # a pandas frame of preaggregate
        table = pa.Table.from_pandas(table, preserve_index=False)
    rows = []
    for r in table.to_pylist():
        p = None if r["__p"] is None else pickle.loads(r["__p"])
        rows.append((*[r[k] for k in keys], r["__start"], r["__end"], r["__n"], repr(p)))
    return rows


specs = st.sampled_from(
    [
        make_spec(10),  # tumbling
        make_spec(10, 2),  # sliding: every row in 5 panes
        make_spec(3, 5, 0, 1),  # gaps: rows in no pane are counted per key
        make_spec("0.5 seconds"),
    ]
)
words = st.one_of(st.none(), st.sampled_from(["ORCL", "IBM", "SAP", ""]))
numbers = st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False), st.just(0.5))


@settings(max_examples=25, deadline=None)
@given(
    spec=specs,
    rows=st.lists(
        st.tuples(
            st.integers(0, 40 * S),
            words,
            st.integers(0, 3),
            numbers,
            st.one_of(st.none(), st.integers(-5, 5)),
        ),
        min_size=1,
        max_size=60,
    ),
    two_keys=st.booleans(),
)
def test_arrow_partials_are_the_pandas_partials_bit_for_bit(spec, rows, two_keys):
    """Nulls in keys and values, ties in the orderings, rows out of order, two keys."""
    keys = ["s", "k"] if two_keys else ["s"]
    table = pa.table(
        {
            "s": pa.array([r[1] for r in rows], pa.string()),
            "k": pa.array([r[2] for r in rows], pa.int32()),
            "__t": pa.array([T0 + r[0] for r in rows], pa.int64()),
            "__in0": pa.array([r[3] for r in rows], pa.float64()),
            "__in1": pa.array([r[4] for r in rows], pa.int64()),
            "__in2": pa.array([int(r[3] is not None) for r in rows], pa.int32()),
        }
    )
    ours = _arrow_partials(spec, PLANS, table, keys)
    theirs = preaggregate(spec, PLANS, table.to_pandas(), keys)
    assert ours.schema.field("s").type == pa.string()  # the key keeps its Arrow type
    assert sorted(plain(ours, keys), key=repr) == sorted(plain(theirs, keys), key=repr)
    # Within a key, partials come in ascending pane start (the order the step merges them).
    starts = [(r[:-4], r[-4]) for r in plain(ours, keys) if r[-1] != "None"]
    for key in {k for k, _ in starts}:
        mine = [s for k, s in starts if k == key]
        assert mine == sorted(mine)


def test_without_keys_the_whole_stream_is_one_key_and_its_panes_step_alike():
    spec = make_spec(10)
    table = pa.table({"__key": pa.array([0] * 4, pa.int32()),
                      "__t": pa.array([T0 + i * 4 * S for i in range(4)], pa.int64()),
                      "__in0": [1.0, 2.0, 4.0, 8.0], "__in1": [1, 2, 3, 4],
                      "__in2": pa.array([1] * 4, pa.int32())})  # fmt: skip
    ours = _arrow_partials(spec, PLANS, table, ["__key"])
    theirs = preaggregate(spec, PLANS, table.to_pandas(), ["__key"])
    assert plain(ours, ["__key"]) == plain(theirs, ["__key"])
    first_ms, end_ms = T0 // 1000, (T0 + 20 * S) // 1000
    a = merge_step(spec, PLANS, [], merge_step(spec, PLANS, [ours.to_pandas()], None,
                                               first_ms).state, end_ms)  # fmt: skip
    b = merge_step(spec, PLANS, [], merge_step(spec, PLANS, [theirs], None, first_ms).state,
                   end_ms)  # fmt: skip
    assert a.panes == b.panes
    assert [p[:2] for p in a.panes] == [(T0, T0 + 10 * S), (T0 + 10 * S, T0 + 20 * S)]
    assert a.panes[0][2][:3] == [3, 3, 7.0]


@settings(max_examples=25, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 9)), max_size=80),
    spread=st.sampled_from([1, 10**6]),
)
def test_segment_order_is_lexsort_by_key_then_start_then_arrival(pairs, spread):
    """Dense (ranked by table, radix-sorted) and sparse (codes far apart: lexsort) alike."""
    codes = np.array([c * spread for c, _ in pairs], dtype=np.int64)
    starts = np.array([T0 + n * 2 * S for _, n in pairs], dtype=np.int64)
    order, seg = _segment_order(codes, starts, 2 * S)
    want = np.lexsort((np.arange(codes.size), starts, codes))
    assert order.tolist() == want.tolist()
    ranked = sorted(set(zip(codes.tolist(), starts.tolist(), strict=True)))
    assert seg.tolist() == [ranked.index((c, s)) for c, s in zip(codes, starts, strict=True)]


def test_only_plain_numbers_take_the_arrow_path():
    from pyspark.sql.types import (
        DoubleType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    def schema(*fields: tuple[str, Any]) -> StructType:
        return StructType([StructField(n, t) for n, t in fields])

    keys = ["s"]
    numbers = schema(("s", StringType()), ("__t", LongType()), ("__in0", DoubleType()))
    assert _arrow_ready(numbers, keys)
    # max_by(rowtime, ...): a timestamp value goes the pandas way, as Spark converts it.
    stamps = schema(("s", StringType()), ("__t", LongType()), ("__in0", TimestampType()))
    assert not _arrow_ready(stamps, keys)
    strings = schema(("s", StringType()), ("__t", LongType()), ("__in0", StringType()))
    assert not _arrow_ready(strings, keys)

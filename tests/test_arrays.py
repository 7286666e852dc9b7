"""Arrow columns as numpy without pyarrow's pandas path (bounds.arrays.as_numpy): the same
values as pyarrow's own conversion, for sliced, chunked, empty and null-holding columns; and
the reader's planning step does not import pandas (0.3-0.4 s in each query's fresh process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.arrays import as_numpy

TYPES = [pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.float32(), pa.float64(), pa.bool_()]


def expected(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return values.to_numpy(zero_copy_only=False)


@pytest.mark.parametrize("typ", TYPES, ids=str)
@given(
    data=st.lists(st.integers(0, 100), max_size=70),
    cut=st.tuples(st.integers(0, 70), st.integers(0, 70)),
    chunks=st.integers(1, 4),
)
def test_the_same_values_as_pyarrow_for_slices_and_chunks(typ, data, cut, chunks) -> None:  # type: ignore[no-untyped-def]
    values = [bool(x % 3) for x in data] if pa.types.is_boolean(typ) else data
    whole = pa.array(values, type=typ)
    lo, hi = min(cut), max(cut)
    sliced = whole.slice(lo, hi - lo)  # an offset that is not a multiple of 8 for booleans
    assert np.array_equal(as_numpy(sliced), expected(sliced))
    size = max(1, len(values) // chunks)
    parts = [whole.slice(i, size) for i in range(0, len(values), size)] or [whole]
    chunked = pa.chunked_array(parts, type=typ)
    got = as_numpy(chunked)
    assert got.dtype == expected(chunked).dtype
    assert np.array_equal(got, expected(chunked))


def test_times_come_as_their_integer_storage_and_nulls_as_pyarrow_has_them() -> None:
    ts = pa.array([0, 1_700_000_000_000_000, -5], type=pa.timestamp("us", tz="UTC"))
    got = as_numpy(ts)
    assert got.dtype == np.int64 and got.tolist() == [0, 1_700_000_000_000_000, -5]
    assert as_numpy(pa.array([1, None, 3], type=pa.int64())).tolist()[0] == 1.0
    assert as_numpy(pa.chunked_array([], type=pa.int64())).tolist() == []
    assert as_numpy(pa.array(["a", "b"])).tolist() == ["a", "b"]


def test_planning_a_step_does_not_import_pandas(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Spark runs a streaming query's ``latestOffset`` in a new Python process: an import
    there is paid by every query, before its first micro-batch."""
    location = str(tmp_path / "s")
    pr.create_stream(location, "v INT", partitions=2)
    for p in range(2):
        with pr.open_writer(location, p) as w:
            for i in range(50):
                w.insert({"v": i}, rowtime=1_700_000_000 + i)
            w.set_rowtime_bound(1_700_000_060)
    code = textwrap.dedent(
        f"""
        import sys
        from pyspark_rowtime.bounds.plan import StreamPosition
        from pyspark_rowtime.datasource.options import parse_reader_options
        from pyspark_rowtime.datasource.reader import Planner

        for order in ("reject", "drop", "adjust"):
            options = {{"path": {location!r}, "order": order}}
            planner = Planner(parse_reader_options(options))
            assert planner.plan(StreamPosition.start([0, 0]), planner.available(), None)
        print("pandas" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "False"

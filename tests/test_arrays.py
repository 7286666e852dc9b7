"""Arrow columns as numpy and back without pyarrow's pandas path (bounds.arrays.as_numpy and
to_arrow): the same values as pyarrow's own conversions, for sliced, chunked, empty and
null-holding columns; and neither the reader's planning step nor its tasks nor the sink's tasks
and commits import pandas (0.3-0.4 s and 40 MB in each of Spark's fresh Python processes). The
gather a column a thread (take_rows) is Arrow's own take."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pyspark_rowtime as pr
from pyspark_rowtime.bounds import arrays
from pyspark_rowtime.bounds.arrays import as_numpy, take_rows, to_arrow

TYPES = [pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.float32(), pa.float64(), pa.bool_()]


@given(
    rows=st.lists(
        st.tuples(
            st.integers(-5, 5),
            st.none() | st.text(max_size=3),
            st.none() | st.floats(allow_nan=False),
        ),
        max_size=60,
    ),
    chunks=st.integers(1, 5),
    order=st.randoms(use_true_random=False),
    parallel_from=st.sampled_from([0, 1, 7, 1 << 20]),
)
def test_take_rows_is_arrows_take_whether_on_threads_or_not(  # type: ignore[no-untyped-def]
    rows, chunks, order, parallel_from
) -> None:
    """The commit's gather (``take_rows``): the columns gathered a thread each, from tables of
    several chunks with nulls and strings, give Arrow's own ``take``: values, column order,
    types and the schema's metadata."""
    schema = pa.schema(
        [("k", pa.int64()), ("s", pa.string()), ("x", pa.float64())], metadata={b"m": b"1"}
    )
    whole = pa.Table.from_pylist(
        [dict(zip(schema.names, r, strict=True)) for r in rows], schema=schema
    )
    size = max(1, len(rows) // chunks)
    table = pa.Table.from_batches(whole.to_batches(max_chunksize=size), schema=schema)
    picks = list(range(len(rows))) * 2
    order.shuffle(picks)
    indices = pa.array(picks[: len(picks) * 3 // 4], type=pa.int64())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(arrays, "PARALLEL_TAKE_ROWS", parallel_from)
        got = take_rows(table, indices)
    want = table.take(indices)
    assert got.schema.equals(want.schema, check_metadata=True)
    assert got.equals(want)


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
    assert out.stdout.strip() == "False", out.stderr[-6000:]


NUMPY_TYPES = [np.bool_, np.int8, np.int32, np.int64, np.uint16, np.float32, np.float64]


@pytest.mark.parametrize("dtype", NUMPY_TYPES, ids=lambda d: np.dtype(d).name)
@given(
    data=st.lists(st.integers(-100, 100), max_size=70),
    nulls=st.lists(st.booleans(), max_size=70),
    step=st.integers(1, 3),
    to=st.sampled_from([None, pa.int64(), pa.int32(), pa.float64(), pa.bool_()]),
)
def test_to_arrow_makes_the_array_pyarrow_makes(dtype, data, nulls, step, to) -> None:  # type: ignore[no-untyped-def]
    values = np.array(data, dtype=np.int64).astype(dtype)[::step]  # a strided view too
    mask = np.array((nulls + [False] * len(values))[: len(values)], dtype=bool)
    with np.errstate(all="ignore"):
        want = pa.array(values, type=to, mask=mask)
        got = to_arrow(values, to, mask=mask)
    got.validate(full=True)
    assert got.type == want.type and got.null_count == want.null_count
    assert got.equals(want), (got, want)
    assert to_arrow(values).equals(pa.array(values))


def test_to_arrow_refuses_what_it_does_not_make() -> None:
    with pytest.raises(ValueError, match="one-dimensional"):
        to_arrow(np.zeros((2, 2)))
    with pytest.raises(TypeError, match="not string"):
        to_arrow(np.zeros(2), pa.string())
    with pytest.raises(TypeError, match="numpy object"):
        to_arrow(np.array([1, None], dtype=object))
    with pytest.raises(ValueError, match="a mask of 1 for 2 values"):
        to_arrow(np.zeros(2), mask=np.array([True]))
    assert to_arrow([True]).to_pylist() == [True]


def test_reading_tasks_and_the_sinks_write_nothing_that_imports_pandas(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Spark runs the reader's tasks and the sink's writes in its Python workers and the sink's
    commit in a planner-like process of its own: an import there is paid by each of them. The
    reader under every policy, by runs and by replay, with a promoted rowtime column and
    validity intervals; the stream and Parquet targets over two micro-batches of rows out of
    order, split over several hours."""
    for name, late in (("ordered", 0), ("s", 40)):  # some out of order: adjust holds, drop drops
        pr.create_stream(str(tmp_path / name), "v INT, at BIGINT", partitions=2)
        for p in range(2):
            with pr.open_writer(str(tmp_path / name), p) as w:
                for i in range(300):
                    t = 1_700_000_000 + i - (late if i % 7 == 3 else 0)
                    w.insert({"v": i, "at": t}, rowtime=t)
                    if i % 50 == 49:
                        w.set_rowtime_bound(1_700_000_000 + i)
    location = str(tmp_path / "s")
    tests = str(Path(__file__).parent)
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {tests!r})
        import numpy as np
        import pyarrow as pa
        from pathlib import Path
        from pyspark_rowtime.bounds.arrays import to_arrow
        from pyspark_rowtime.datasource.options import parse_reader_options
        from pyspark_rowtime.datasource.reader import (
            Planner, output_arrow_schema, partition_tasks, read_task,
        )
        from pyspark_rowtime.datasource.intervals import (
            read_task_with_intervals, with_rowtime_end,
        )
        from pyspark_rowtime.streams.storage import open_stream
        from sink_helpers import HOUR, SCHEMA, T0, make, run

        read = 0
        for options in ({{"order": "reject", "path": {str(tmp_path / "ordered")!r}}},
                        {{"order": "drop"}},
                        {{"order": "adjust", "adjust.range": "60"}},
                        {{"order": "adjust", "adjust.range": "60", "rowtime.column": "at"}},
                        {{"order": "drop", "interval.duration": "10 seconds"}}):
            cfg = parse_reader_options({{"path": {location!r}, **options}})
            payload = open_stream(cfg.location).meta.payload_schema
            schema = output_arrow_schema(payload)
            planner = Planner(cfg)
            pos = planner.start_position()
            while (new := planner.plan(pos, planner.available(), 170)) is not None:
                start, end = pos.to_dict(), new.to_dict()
                runs = planner.runs_for(start, end)
                for tasks in (partition_tasks(start, end, runs), partition_tasks(start, end)):
                    for task in tasks:
                        if cfg.has_rowtime_end:
                            out = read_task_with_intervals(cfg, task, with_rowtime_end(schema))
                        else:
                            out = read_task(cfg, task, schema)
                        read += sum(b.num_rows for b in out)
                pos = new
        assert read > 1000, read

        def batch(ids, base, bound=None):  # rows out of order over three hours from base
            times = base + np.array([(i * 7919) % 900 for i in ids], dtype=np.int64) * (HOUR // 300)
            flags = np.zeros(len(ids), dtype=bool)
            ids = np.array(ids, dtype=np.int64)
            if bound is not None:
                ids, times = np.append(ids, 0), np.append(times, bound)
                flags = np.append(flags, True)
            return pa.RecordBatch.from_arrays(
                [to_arrow(ids, mask=flags), to_arrow(times).view(SCHEMA.field(1).type),
                 to_arrow(flags)], schema=SCHEMA)

        for kind in ("stream", "parquet"):
            target = make(Path({str(tmp_path)!r}) / kind, kind)
            run(target, 0, [[batch(range(0, 40), T0)], [batch(range(40, 90), T0, T0 + 3 * HOUR)]])
            late = T0 + 3 * HOUR
            run(target, 1, [[batch(range(90, 200), late, late + 3 * HOUR)], [batch([7, 8], late)]])
        print("pandas" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "False", out.stderr[-6000:]

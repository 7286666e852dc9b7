"""A write task's sorted runs kept aside and merged (``sink.spill``): the merge is the stable
sort of the rows as they came, piece after piece, whatever the runs and the piece size."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_rowtime.sink.spill import Spill, local_dir

runs_st = st.lists(st.lists(st.integers(0, 9), max_size=12), min_size=1, max_size=5)


def _run(times: list[int], first_id: int) -> tuple[list[pa.RecordBatch], np.ndarray]:
    """A sorted run as record batches of up to 4 rows (ids in arrival order, strings too)."""
    order = sorted(range(len(times)), key=lambda i: times[i])  # stable, as the task sorts
    rt = np.array([times[i] for i in order], dtype=np.int64)
    ids = [first_id + i for i in order]
    table = pa.table({"id": ids, "s": [f"r{i}" for i in ids], "rowtime": rt})
    return table.to_batches(max_chunksize=4), rt


@settings(max_examples=200, deadline=None)
@given(runs_st, st.integers(1, 20))
def test_the_merge_is_the_stable_sort_of_the_rows_as_they_came(runs, piece):
    spill = Spill()
    came: list[tuple[int, int]] = []  # (rowtime, id) in arrival order
    made = []
    for times in runs:
        made.append(_run(times, len(came)))
        came += [(t, len(came) + i) for i, t in enumerate(times)]
    *kept, _ = made
    last_times = runs[-1]  # the rows still in memory: in the order they came
    ids = range(len(came) - len(last_times), len(came))
    last = pa.table(
        {"id": list(ids), "s": [f"r{i}" for i in ids], "rowtime": last_times}
    ).to_batches(max_chunksize=4)
    last_rt = np.array(last_times, dtype=np.int64)
    for batches, rt in kept:
        if len(rt):
            spill.add(batches, rt)
    got: list[tuple[int, int]] = []
    for batches, rt in spill.merged(last, last_rt, piece):
        assert 0 < len(rt) <= piece
        table = pa.Table.from_batches(batches)
        assert table.column("rowtime").to_pylist() == rt.tolist()
        assert table.column("s").to_pylist() == [f"r{i}" for i in table.column("id").to_pylist()]
        got += zip(rt.tolist(), table.column("id").to_pylist(), strict=True)
    assert got == sorted(came, key=lambda r: r[0])
    spill.close()


def test_runs_are_kept_in_sparks_local_folder_and_removed_at_close(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path},/elsewhere")
    assert local_dir() == str(tmp_path)
    spill = Spill()
    batches, rt = _run([3, 1, 2], 0)
    spill.add(batches, rt)
    assert next(p.name for p in tmp_path.iterdir()).startswith("rowtime-spill-")
    assert [rt.tolist() for _, rt in spill.merged([], np.empty(0, np.int64), 10)] == [[1, 2, 3]]
    spill.close()
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "missing"))
    assert local_dir() is None  # the system's temporary folder

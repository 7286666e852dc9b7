"""A write task's sorted runs kept aside in local files, then merged into one order.

A task whose rows reach it out of rowtime order (a file source whose files overlap in time, a
query after a shuffle) sorts them a run at a time (``stream_target.SORT_BYTES``), so that its
memory holds one run. Staged as they are, such runs overlap: the driver's commit would have to
merge them, alone, every row of every task, while the executors wait (the one part of the
sink's work that does not grow with the cluster). Instead the task keeps each sorted run but
the last in a file of its own local disk (Spark's ``SPARK_LOCAL_DIRS``, where PySpark spills
too: nothing that needs to survive the task), and at the end merges the kept runs and the last
one into the pieces it stages, in rowtime order, so that the commit links them like any
in-order rows. The merge is stable (rows of equal rowtime keep the order they came in) and a
piece at a time, so the task's memory still holds one run's worth of rows beside the rowtimes
and their merged order (16 bytes a row).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from ..bounds.arrays import take_rows, to_arrow
from ..streams.segments import WRITE_ROWS

__all__ = ["Spill", "local_dir"]


def local_dir() -> str | None:
    """Where a Python worker may keep files for the length of a task: the first of Spark's
    ``SPARK_LOCAL_DIRS`` (set for every Python worker), else the system's temporary folder."""
    first = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0].strip()
    return first if first and os.path.isdir(first) else None


class Spill:
    """Sorted runs of one task in local files, merged by ``merged``; ``close`` removes
    them (also after an error)."""

    def __init__(self) -> None:
        self._dir: str | None = None
        self._files: list[str] = []
        self._times: list[np.ndarray] = []  # each run's rowtimes, in its (sorted) order

    def __bool__(self) -> bool:
        return bool(self._files)

    def add(self, batches: Iterable[pa.RecordBatch], rt: np.ndarray) -> None:
        """Keep a sorted run: its record batches in rowtime order, and their rowtimes."""
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="rowtime-spill-", dir=local_dir())
        path = os.path.join(self._dir, f"{len(self._files)}.arrow")
        rest = iter(batches)
        first = next(rest, None)
        with pa.OSFile(path, "wb") as f:
            if first is not None:
                with pa.ipc.new_file(f, first.schema) as writer:
                    writer.write_batch(first)
                    for batch in rest:
                        writer.write_batch(batch)
        self._files.append(path)
        self._times.append(rt)

    def merged(
        self, last: Sequence[pa.RecordBatch], last_rt: np.ndarray, piece_rows: int
    ) -> Iterator[tuple[list[pa.RecordBatch], np.ndarray]]:
        """The kept runs and ``last`` (the rows still in memory, in the order they came, and
        their rowtimes; maybe none) merged in rowtime order, in pieces of at most
        ``piece_rows`` rows: each piece's record batches and rowtimes. Ties keep the order the
        rows came in. Each row is gathered once: the rows in memory are not sorted first."""
        tables = [pa.ipc.open_file(pa.memory_map(p)).read_all() for p in self._files]
        times = list(self._times)
        tail = pa.Table.from_batches(last) if len(last_rt) else None
        tail_order = np.argsort(last_rt, kind="stable") if tail is not None else None
        if tail is not None:
            times.append(last_rt[tail_order])
        if not times:
            return
        rt = np.concatenate(times)
        starts = np.cumsum([0] + [len(t) for t in times[:-1]])
        # Timsort finds the sorted runs and merges them: linear in the rows for a few runs.
        order = np.argsort(rt, kind="stable")
        runs = len(times)
        taken = np.zeros(runs, dtype=np.int64)  # rows of each run in earlier pieces
        for s in range(0, len(rt), piece_rows):
            idx = order[s : s + piece_rows]
            run = np.searchsorted(starts, idx, side="right") - 1
            counts = np.bincount(run, minlength=runs)
            # A stable merge of sorted runs takes a prefix of each run: this piece holds the
            # next counts[i] rows of run i, a contiguous slice of a kept run; the rows in
            # memory are taken where they lie (the whole table is in the piece, unsliced).
            parts = [i for i in range(len(tables)) if counts[i]]
            sizes = [int(counts[i]) for i in parts]
            base = np.zeros(runs, dtype=np.int64)
            base[parts] = np.cumsum([0, *sizes[:-1]])
            local = idx - starts[run] - taken[run] + base[run]
            pieces = [tables[i].slice(int(taken[i]), int(counts[i])) for i in parts]
            if tail is not None and tail_order is not None and counts[-1]:
                mine = run == runs - 1
                local[mine] = sum(sizes) + tail_order[idx[mine] - starts[-1]]
                pieces.append(tail)
            out = take_rows(pa.concat_tables(pieces), to_arrow(local))
            taken += counts
            yield out.to_batches(max_chunksize=WRITE_ROWS), rt[idx]

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir, self._files, self._times = None, [], []

"""What every target of the sink is, and the part of a write task they all share.

``Target`` is the protocol ``sink.spark`` drives (``prepare`` when the query starts,
``write`` on the executors, ``commit``/``abort`` on the driver, ``clock_us`` for readers);
``StreamTarget`` and ``ParquetTarget`` implement
it. ``stage_task`` is the skeleton of ``write()`` both use: skip a batch that is already
committed (a replay), split the rows from the bound records and check them
(``RowSplitter``), hand the rows to the target's own ``Stager``, and discard
whatever it staged if anything fails, so a failed task leaves no file behind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from ..streams.sink_state import SinkState
from .options import SinkConfig
from .task import RowSplitter, StagedFile, TaskInfo, TaskReport

__all__ = ["Stager", "Target", "stage_task"]


class Stager(Protocol):
    """One task's staging area in a target's own format."""

    def add(self, data: pa.RecordBatch, rowtime_us: np.ndarray) -> None:
        """Stage data rows (payload, then ``rowtime``) with their rowtimes (int64 us)."""
        ...

    def close(self) -> list[StagedFile]:
        """Finish staging; the files, each durable, when this returns."""
        ...

    def discard(self) -> None:
        """Remove everything staged (the task failed)."""
        ...


class Target(Protocol):
    """A target of ``writeStream.format("rowtime")``; holds only picklable configuration."""

    cfg: SinkConfig
    where: str

    @property
    def state(self) -> SinkState:
        """Where the target's manifest and staged runs live (``sink.layout``)."""
        ...

    def prepare(self) -> None:
        """Driver, when the query starts: create the target or check it can take the query."""
        ...

    def write(self, info: TaskInfo, batches: Iterable[pa.RecordBatch]) -> TaskReport:
        """Executor: stage one task's rows; the report travels to ``commit``."""
        ...

    def commit(self, reports: Sequence[TaskReport], batch_id: int, candidate_us: int | None) -> Any:
        """Driver: publish batch ``batch_id`` exactly once; ``candidate_us`` is the clock the
        batch would move to. Returns the batch's manifest entry (None when it changed
        nothing)."""
        ...

    def abort(self, reports: Sequence[TaskReport | None], batch_id: int) -> None:
        """Driver: remove what the batch staged, unless it is committed (or intended)."""
        ...

    def clock_us(self) -> int | None:
        """The target's clock in microseconds; None before it has one."""
        ...


def stage_task(
    target: Target,
    info: TaskInfo,
    batches: Iterable[pa.RecordBatch],
    begin: Callable[[], tuple[int | None, Stager]],
    committed: Callable[[], bool] | None = None,
) -> tuple[TaskReport, Stager | None]:
    """The shared part of ``write()``.

    A batch that already has a manifest entry is a replay: its rows are drained (Spark expects
    the iterator consumed) and a ``skipped`` report is returned, with no stager. Otherwise
    ``begin()`` gives the target's clock before this batch (rows below it fail the task) and a
    fresh ``Stager``; the rows go to it and, on any error, it is discarded before the
    error propagates. The report carries the staged files; the target adds its own fields.
    ``committed`` tells a replay where the target's state is not a manifest (table targets:
    the table's own log).
    """
    if committed() if committed else target.state.entry(info.batch_id) is not None:
        for _ in batches:  # the commit finishes the batch from its own records
            pass
        return TaskReport(info=info, skipped=True), None
    floor_us, stager = begin()
    splitter = RowSplitter(target.cfg, info, floor_us, target.where)
    try:
        for batch in batches:
            split = splitter.split(batch)
            if split is not None:
                stager.add(*split)
        files = stager.close()
    except BaseException:
        stager.discard()
        raise
    return dataclasses.replace(splitter.report(), files=tuple(files)), stager

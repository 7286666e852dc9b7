"""What one write task does before a target stages anything, and what it reports.

A Spark write task (``write()``, on an executor) gets the batch's rows as Arrow record batches.
``RowSplitter`` separates data rows from bound records, checks every data row against the
clock the target had promised before the batch (the promise is that no later row is below it),
and hands on the data rows as payload plus ``rowtime``. The task's ``TaskReport`` travels
to the driver in Spark's commit message: nothing is kept in memory between ``write()`` and
``commit()``, which run in different processes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..bounds.arrays import as_numpy, to_arrow
from ..bounds.errors import InvalidRowtimeError, LateRowError
from ..bounds.time import format_rowtime, from_rowtime_us
from ..streams.columns import SPARK_IS_BOUND, SPARK_ROWTIME
from .options import SinkConfig

UTC_US = pa.timestamp("us", tz="UTC")
#: A null flag is no bound. (``pa.scalar(False)``, which ``pc.fill_null`` makes of ``False``,
#: imports pandas: bounds/arrays.py.)
_FALSE = to_arrow([False])[0]


#: The sink's name for the one rowtime formatter (kept so the targets' call sites stay short).
iso = format_rowtime


@dataclass(frozen=True)
class TaskInfo:
    """Who is writing: the micro-batch, the task (Spark partition) and its attempt."""

    batch_id: int
    task: int
    attempt: int
    query_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> TaskInfo:
        return cls(
            batch_id=int(doc["batch_id"]),
            task=int(doc["task"]),
            attempt=int(doc["attempt"]),
            query_id=doc.get("query_id"),
        )


@dataclass(frozen=True)
class StagedFile:
    """A file a task staged. Paths are relative to the target's folder.

    ``final`` and ``key`` (the time partition's index: ``rowtime // granularity``) are set for
    Parquet targets, which publish a staged file by renaming it to ``final``. ``first`` is set
    for stream targets: the offset the file's first record gets if the file becomes a segment
    of the partition the task wrote for as it is. Table targets (Delta, Iceberg) write a file
    where it stays and set ``size`` (bytes) and ``stats``: what the table's commit records of
    the file (Delta's add-action statistics as JSON text; Iceberg's ``DataFile``, which travels
    to the driver inside Spark's commit message).
    """

    staged: str
    rows: int
    final: str | None = None
    key: int | None = None
    first: int | None = None
    size: int | None = None
    stats: Any = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> StagedFile:
        def opt(name: str) -> Any:
            return doc.get(name)

        return cls(
            staged=str(doc["staged"]),
            rows=int(doc["rows"]),
            final=opt("final"),
            key=None if opt("key") is None else int(doc["key"]),
            first=None if opt("first") is None else int(doc["first"]),
            size=None if opt("size") is None else int(doc["size"]),
            stats=opt("stats"),
        )


@dataclass(frozen=True)
class TaskReport:
    """One task's part of a batch: what it staged and what it saw. Picklable.

    ``bound_us`` is the highest bound record the task saw; ``skipped`` says the batch was
    already committed when the task ran (a replay), so it staged nothing.

    Stream targets also report what the task assumed of the target partition it wrote for
    (``partition``, its clock ``base_clock_us`` and the arrival time ``arrival_us`` it stamped)
    and whether its files are ``ordered``: each in rowtime order and each starting at or after
    the previous one's last rowtime, so that in turn they continue the partition; ``synced``
    says whether they are durable (a task staging for the commit's merge leaves them to the
    page cache: ``sink.layout.FolderSinkState.stage_segment``, ``lazy``).
    """

    info: TaskInfo
    rows: int = 0
    bound_us: int | None = None
    min_rowtime_us: int | None = None
    max_rowtime_us: int | None = None
    files: tuple[StagedFile, ...] = ()
    skipped: bool = False
    partition: int | None = None
    base_clock_us: int | None = None
    arrival_us: int | None = None
    ordered: bool = True
    synced: bool = True

    def to_dict(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["info"] = self.info.to_dict()
        doc["files"] = [f.to_dict() for f in self.files]
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> TaskReport:
        def opt(name: str) -> int | None:
            value = doc.get(name)
            return None if value is None else int(value)

        return cls(
            info=TaskInfo.from_dict(doc["info"]),
            rows=int(doc.get("rows", 0)),
            bound_us=opt("bound_us"),
            min_rowtime_us=opt("min_rowtime_us"),
            max_rowtime_us=opt("max_rowtime_us"),
            files=tuple(StagedFile.from_dict(f) for f in doc.get("files", [])),
            skipped=bool(doc.get("skipped", False)),
            partition=opt("partition"),
            base_clock_us=opt("base_clock_us"),
            arrival_us=opt("arrival_us"),
            ordered=bool(doc.get("ordered", True)),
            synced=bool(doc.get("synced", True)),
        )


def reports_query_id(reports: Iterable[TaskReport | None]) -> str | None:
    """The Spark query id the tasks of a batch ran under, if they agree on one."""
    ids = {r.info.query_id for r in reports if r is not None and r.info.query_id}
    return ids.pop() if len(ids) == 1 else None


class RowSplitter:
    """Splits the record batches of one task into data rows and bounds, checking the rows.

    ``floor_us`` is the target's clock before this batch (None if it has none yet): a data row
    below it would break the promise the target already made, so it fails the task, naming the
    row, the clock and the likely cause.
    """

    def __init__(self, cfg: SinkConfig, info: TaskInfo, floor_us: int | None, where: str):
        self.cfg = cfg
        self.info = info
        self.floor_us = floor_us
        self.where = where
        self.rows = 0
        self.bound_us: int | None = None
        self.min_rowtime_us: int | None = None
        self.max_rowtime_us: int | None = None
        names = list(cfg.schema.names)
        self._keep = [names.index(n) for n in (*cfg.payload, SPARK_ROWTIME)]
        self._out_names = [*cfg.payload, SPARK_ROWTIME]
        self._is_bound = names.index(SPARK_IS_BOUND) if cfg.has_is_bound else None
        self._rowtime = names.index(SPARK_ROWTIME)

    def report(self) -> TaskReport:
        return TaskReport(
            info=self.info,
            rows=self.rows,
            bound_us=self.bound_us,
            min_rowtime_us=self.min_rowtime_us,
            max_rowtime_us=self.max_rowtime_us,
        )

    def split(self, batch: pa.RecordBatch) -> tuple[pa.RecordBatch, np.ndarray] | None:
        """The batch's data rows (payload columns, then ``rowtime`` as UTC microseconds) and
        their rowtimes as int64 microseconds; None when it holds no data row."""
        if batch.num_rows == 0:
            return None
        if self._is_bound is not None:
            flags = pc.fill_null(batch.column(self._is_bound), _FALSE)
            if pc.any(flags).as_py():
                self._bounds(batch.filter(flags))
                batch = batch.filter(pc.invert(flags))
                if batch.num_rows == 0:
                    return None
        rowtime = batch.column(self._rowtime)
        if rowtime.null_count:
            raise InvalidRowtimeError(
                f"{self.where}: a data row has a null rowtime (batch {self.info.batch_id}, task "
                f"{self.info.task}); every row the sink writes needs its event time in column "
                "rowtime: filter such rows out, or fill rowtime"
            )
        # as_numpy: pyarrow's to_numpy imports pandas, 9% of a fresh worker's write (py-spy)
        rt = as_numpy(rowtime.cast(pa.int64()))
        lo, hi = int(rt.min()), int(rt.max())
        if self.floor_us is not None and lo < self.floor_us:
            raise LateRowError(
                f"{self.where}: batch {self.info.batch_id} has a row with rowtime {iso(lo)} "
                f"({lo} us), below the target's clock {iso(self.floor_us)} ({self.floor_us} us), "
                "which promised that no later row is earlier. The query emits rows out of "
                "rowtime order: with clock=bounds the bound records must come from the query's "
                "input (format('rowtime')) and rowtime must not be changed; with "
                "clock=watermark every output rowtime must be at or above the watermark (for "
                "a window, use its end). Nothing of this batch was written"
            )
        self.rows += len(rt)
        self.min_rowtime_us = lo if self.min_rowtime_us is None else min(lo, self.min_rowtime_us)
        self.max_rowtime_us = hi if self.max_rowtime_us is None else max(hi, self.max_rowtime_us)
        columns = [batch.column(i) for i in self._keep]
        if columns[-1].type != UTC_US:
            columns[-1] = rowtime.cast(UTC_US)  # same instants; Spark sends the session zone
        return pa.RecordBatch.from_arrays(columns, names=self._out_names), rt

    def _bounds(self, bounds: pa.RecordBatch) -> None:
        values = bounds.column(self._rowtime).drop_null()
        if len(values):
            top = pc.max(values.cast(pa.int64())).as_py()
            if self.bound_us is None or top > self.bound_us:
                self.bound_us = top


def as_datetime(t_us: int) -> dt.datetime:
    return from_rowtime_us(t_us)

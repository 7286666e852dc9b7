"""The Spark face of the sink: ``writeStream.format("rowtime")``, kept thin.

Spark calls ``make_stream_writer`` (through ``RowtimeDataSource.streamWriter``) in short-lived
Python processes on the driver: when it plans each batch, and again for each commit. The writer
it returns is pickled to the executors, whose ``write()`` gets the batch's rows as Arrow record
batches; ``commit(messages, batchId)`` then runs on the driver in yet another process. So the
writer holds only the parsed, picklable ``SinkConfig``; all state lives in the target's
folder (``sink.layout``). The batch id reaches ``write()`` as the local property Spark sets
for every task of a micro-batch (``streaming.sql.batchId``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType

from ..bounds.errors import CommitError, OptionError
from ..streams.catalog import resolve_stream_option
from ..streams.spark_compat import (
    DataSourceStreamArrowWriter,
    arrow_schema_utc,
    require_supported_spark,
)
from .clock import batch_watermark_ms, bounds_clock_us, checkpoint_query_id, watermark_clock_us
from .options import SinkConfig, parse_sink_options
from .stream_target import StreamTarget
from .target import Target
from .task import TaskInfo, TaskReport, reports_query_id

__all__ = ["RowtimeCommitMessage", "RowtimeStreamWriter", "make_stream_writer"]

BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"


def make_target(cfg: SinkConfig) -> Target:
    """The target of ``cfg``. The Parquet, Delta and Iceberg targets' modules load here, only
    for a query that writes one: Spark starts a Python process for every write task and every
    micro-batch's commit, and a stream target's need not import ``pyarrow.parquet`` and the
    table targets (docs/benchmarks.md, "The test suite and CI")."""
    if cfg.target == "parquet":
        from .parquet_target import ParquetTarget

        return ParquetTarget(cfg)
    if cfg.target == "delta":
        from .delta_target import DeltaTarget

        return DeltaTarget(cfg)
    if cfg.target == "iceberg":
        from .iceberg_target import IcebergTarget

        return IcebergTarget(cfg)
    return StreamTarget(cfg)


class RowtimeCommitMessage(WriterCommitMessage):
    """What a write task sends to the driver: its ``TaskReport`` (picklable)."""

    def __init__(self, report: TaskReport) -> None:
        self.report = report

    def __repr__(self) -> str:
        return f"RowtimeCommitMessage({self.report!r})"


def task_info() -> TaskInfo:
    """The running Spark task's batch id, partition and attempt."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    batch = None if ctx is None else ctx.getLocalProperty(BATCH_ID_PROPERTY)
    if ctx is None or batch is None:
        raise OptionError(
            "the rowtime sink's write() runs in a Spark streaming micro-batch task and found "
            f"no batch id (local property {BATCH_ID_PROPERTY}); use writeStream, not write"
        )
    return TaskInfo(
        batch_id=int(batch),
        task=ctx.partitionId(),
        attempt=ctx.attemptNumber(),
        query_id=ctx.getLocalProperty(QUERY_ID_PROPERTY),
    )


class RowtimeStreamWriter(DataSourceStreamArrowWriter):
    """Stages on executors, publishes on the driver; see ``sink.stream_target`` and
    ``sink.parquet_target`` for each target's two-phase commit."""

    def __init__(self, cfg: SinkConfig) -> None:
        self.cfg = cfg

    def write(self, iterator: Iterator[pa.RecordBatch]) -> RowtimeCommitMessage:
        return RowtimeCommitMessage(make_target(self.cfg).write(task_info(), iterator))

    def _reports(self, messages: list[Any], batch_id: int) -> list[TaskReport]:
        reports = []
        for m in messages:
            if not isinstance(m, RowtimeCommitMessage):
                raise CommitError(
                    f"batch {batch_id}: a write task sent no commit message ({m!r}); Spark "
                    "commits only batches whose tasks all succeeded"
                )
            reports.append(m.report)
        return reports

    def candidate_clock_us(self, reports: list[TaskReport], batch_id: int) -> int | None:
        """The clock batch ``batch_id`` moves to, if higher than the target's (sink.clock)."""
        if self.cfg.clock == "bounds":
            return bounds_clock_us(r.bound_us for r in reports)
        assert self.cfg.checkpoint is not None
        return watermark_clock_us(batch_watermark_ms(self.cfg.checkpoint, batch_id))

    def commit(self, messages: list[Any], batchId: int) -> None:
        reports = self._reports(messages, batchId)
        target = make_target(self.cfg)
        query_id = reports_query_id(reports) or checkpoint_query_id(self.cfg.checkpoint)
        target.state.claim(query_id)
        target.commit(reports, batchId, self.candidate_clock_us(reports, batchId))

    def abort(self, messages: list[Any], batchId: int) -> None:
        reports = [m.report if isinstance(m, RowtimeCommitMessage) else None for m in messages]
        make_target(self.cfg).abort(reports, batchId)


def _check_not_lost(cfg: SinkConfig, target: Target) -> None:
    """Refuse to go on when the query's checkpoint has committed batches but the target has no
    sink state: it was deleted (or the query pointed elsewhere) since, and writing on would
    silently start a new target without the rows of the committed batches."""
    if cfg.checkpoint is None or target.state.read_target() is not None:
        return
    try:
        committed = [n for n in os.listdir(os.path.join(cfg.checkpoint, "commits")) if n.isdigit()]
    except OSError:
        return
    if committed:
        raise OptionError(
            f"{target.where} has no sink state (no target description), but the "
            f"query's checkpoint {cfg.checkpoint} has {len(committed)} committed batch(es): the "
            "target was deleted or moved while the query ran, and the rows of those batches "
            "are not in it. Restore the target folder, or start over with a new "
            "checkpointLocation (and a new or empty path)"
        )


def make_stream_writer(
    options: dict[str, Any], schema: StructType, overwrite: bool, conf_catalog: str | None = None
) -> RowtimeStreamWriter:
    """The writer for ``writeStream.format("rowtime")``: parses the options, checks the
    query's columns and creates (or checks) the target. Errors name the option or column.

    With ``option("stream", NAME)`` the catalog's entry gives the location (created from the
    entry on first use) and sink options below the query's own."""
    require_supported_spark("writer()")
    given, entry = resolve_stream_option(options, conf_catalog, who="writeStream.format('rowtime')")
    if entry is not None:
        options = {**entry.sink, **given}
    arrow = arrow_schema_utc(schema)
    cfg = parse_sink_options(options, arrow, overwrite)
    target = make_target(cfg)
    _check_not_lost(cfg, target)
    target.prepare()
    # Refuse at start a target another query owns (the checkpoint names this query).
    target.state.claim(checkpoint_query_id(cfg.checkpoint))
    return RowtimeStreamWriter(cfg)

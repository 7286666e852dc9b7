"""The Spark face of a table read (``option("table", "delta")``): thin classes over
``TableSource``, which does the work. Only picklable configuration lives on
them; the table's log is read inside the methods that need it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

from ..streams.spark_compat import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from .options import refuse_batch_only_options
from .table_source import TableRead, TableSource, TableTask, read_table_task

__all__ = ["TableBatchReader", "TablePartition", "TableStreamReader", "table_stream_reader"]

#: New records planned at once, and most per micro-batch, without ``maxRowsPerBatch``: the
#: stream reader's (``datasource.spark``), for the same reasons.
STEP_RECORDS = 1 << 24
MICRO_BATCH_RECORDS = 1 << 26


class TablePartition(InputPartition):
    """One task of a table read (its value is a ``TableTask``)."""

    def __init__(self, task: TableTask) -> None:
        super().__init__(task)
        self.task = task


def table_stream_reader(read: TableRead, schema: pa.Schema) -> TableStreamReader:
    """``readStream`` of a table, refusing what only a batch read takes."""
    refuse_batch_only_options(read.cfg, "the table's clock")
    return TableStreamReader(read, schema)


class TableStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of a table's versions in rowtime order, each with at most one bound
    record; as ``RowtimeStreamReader``, over the table's log."""

    step_records: int = STEP_RECORDS
    micro_batch_records: int = MICRO_BATCH_RECORDS

    def __init__(self, read: TableRead, schema: pa.Schema) -> None:
        self.table = read
        self.arrow_schema = schema
        self._source: TableSource | None = None
        self._initial: dict[str, Any] | None = None
        self._seen_end: dict[str, Any] | None = None

    @property
    def source(self) -> TableSource:
        if self._source is None:
            self._source = TableSource(self.table)
        return self._source

    def initialOffset(self) -> dict[str, Any]:
        if self._initial is None:
            self._initial = self.source.initial_offset()
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.table.cfg.max_rows_per_batch is not None:
            return ReadMaxRows(self.table.cfg.max_rows_per_batch)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.source.prepare_available_now()

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, Any]:
        """As ``latestOffset``: Spark 4.1 passes no start and
        takes the whole backlog in one micro-batch, 4.2 on caps it."""
        most: int | None = None
        if start is None:  # Spark 4.1
            start = self._seen_end if self._seen_end is not None else self.initialOffset()
            max_rows: int | None = None
        elif isinstance(limit, ReadMaxRows):
            max_rows = min(limit.max_rows, self.step_records)
        else:
            max_rows = self.step_records
            most = max(self.micro_batch_records, max_rows)
        return self.source.latest_offset(start, max_rows, most)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self.source.progress()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        self._seen_end = end
        source = self.source
        runs = source.runs_for(start, end)
        tasks = source.tasks(start, end, runs)
        return [TablePartition(t) for t in tasks]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TablePartition)
        return read_table_task(self.table, partition.task, self.arrow_schema)

    def commit(self, end: dict[str, Any]) -> None:
        self.source.commit(end)

    def stop(self) -> None:
        self._source = None


class TableBatchReader(DataSourceReader):
    """``spark.read`` of a table: its history as one step, under the same rules (see
    ``RowtimeBatchReader`` for ``endingOffsets`` and ``output``)."""

    def __init__(self, read: TableRead, schema: pa.Schema) -> None:
        self.table = read
        self.arrow_schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        return [TablePartition(t) for t in TableSource(self.table).batch_tasks()]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TablePartition)
        return read_table_task(self.table, partition.task, self.arrow_schema)

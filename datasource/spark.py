"""The Spark face of the reader: Python Data Source API classes, kept thin.

Spark finds ``format("rowtime")`` without registration because the top-level module
``pyspark_rowtime`` exposes ``DefaultSource`` (pyspark's ``lookup_data_sources`` scans
``pyspark_*`` modules). Only picklable configuration lives on these objects; the log is opened
inside each method that needs it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from ..bounds.errors import OffsetError, OptionError, SchemaError, StreamNotFoundError
from ..bounds.plan import StreamPosition
from ..streams.catalog import resolve_stream_option
from ..streams.spark_compat import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
    require_supported_spark,
)
from ..streams.storage import LocationKind, open_stream, what_is_at
from .executor import read_task
from .intervals import read_task_with_intervals, with_rowtime_end
from .options import ReaderConfig, parse_reader_options, refuse_batch_only_options
from .planner import Planner, batch_tasks, partition_tasks, progress_report
from .retention import (
    SkipCounter,
    replay_position,
    skip_removed,
    skipped_progress,
)
from .table_source import is_table_read, parse_table_options
from .table_spark import TableBatchReader, table_stream_reader
from .tasks import EmitRuns, ReadTask, output_arrow_schema


def _read(cfg: ReaderConfig, task: ReadTask, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    if cfg.has_rowtime_end and cfg.output == "rows":
        return read_task_with_intervals(cfg, task, schema)
    return read_task(cfg, task, schema)


class RowtimePartition(InputPartition):
    """One stream partition's share of a step (its value is a ``ReadTask``)."""

    def __init__(self, task: ReadTask) -> None:
        super().__init__(task)
        self.task = task


def _config(options: Any, conf_catalog: str | None = None) -> tuple[ReaderConfig, pa.Schema]:
    # option("stream", NAME): the catalog gives the location and reader defaults that sit
    # between the stream's own defaults and the query's options.
    opts, entry = resolve_stream_option(dict(options), conf_catalog)
    if "path" not in {k.lower() for k in opts}:
        parse_reader_options(opts)  # raises the error that names option path
    location = next(v for k, v in opts.items() if k.lower() == "path")
    try:
        meta = open_stream(location).meta
    except StreamNotFoundError:
        if what_is_at(location).kind is LocationKind.PENDING_STREAM_TARGET:
            raise StreamNotFoundError(
                f"{location!r} is the target stream of a query that has not committed its "
                "first batch, which creates the stream (with a partition per write task). "
                "Start this query once it has, or give that query option partitions: then "
                "its target stream is created when it starts"
            ) from None
        raise
    defaults = dict(meta.defaults)
    if entry is not None:
        defaults.update(entry.reader)
    cfg = parse_reader_options(opts, defaults)
    if cfg.rowtime_column is not None and cfg.rowtime_column not in meta.payload_schema.names:
        raise OptionError(
            f"option rowtime.column={cfg.rowtime_column!r} names no payload column of stream "
            f"{location!r}; its columns are: {', '.join(meta.payload_schema.names)}"
        )
    schema = output_arrow_schema(meta.payload_schema, cfg.output)
    if cfg.has_rowtime_end and cfg.output == "rows":
        schema = with_rowtime_end(schema)
    return cfg, schema


def chosen_columns(full: pa.Schema, payload: Sequence[str], schema: StructType) -> pa.Schema:
    """The reader's output schema for the schema Spark passes: the whole ``full`` schema, or
    the columns a user-given schema (``readStream.schema(...)``) keeps of it.

    A Python data source learns nothing of the columns a query uses (Spark pushes no
    projection into it), so every payload column crosses from the Python worker to the JVM
    even when the query reads one. A schema that leaves out payload columns stops that: the
    tasks never touch the columns left out. It must keep the stream's order, its types, and
    every column the reader adds (``rowtime``, ``is_bound``)."""
    names = [f.name for f in schema.fields]
    if names == full.names:
        return full
    known = {n.lower(): n for n in full.names}
    unknown = [n for n in names if n.lower() not in known]
    picked = [known[n.lower()] for n in names if n.lower() in known]
    added = [n for n in full.names if n not in payload]
    if unknown or [n for n in picked if n not in payload] != added:
        raise SchemaError(
            f"the schema given to format rowtime ({', '.join(names)}) must be columns of the "
            f"stream, in its order, followed by {', '.join(added)}: its columns are "
            f"{', '.join(full.names)}. Leave out payload columns only, or give no schema"
        )
    if picked != sorted(picked, key=full.names.index):
        raise SchemaError(
            f"the schema given to format rowtime lists {', '.join(names)}: keep the stream's "
            f"order ({', '.join(full.names)})"
        )
    chosen = pa.schema([full.field(n) for n in picked])
    expected = from_arrow_schema(chosen, prefer_timestamp_ntz=True)
    for want, got in zip(expected.fields, schema.fields, strict=True):
        if want.dataType != got.dataType:
            raise SchemaError(
                f"the schema given to format rowtime has column {got.name!r} as "
                f"{got.dataType.simpleString()}; the stream has {want.dataType.simpleString()}"
            )
    return chosen


class RowtimeReaderSource(DataSource):
    """``format("rowtime")`` for reading. The face's ``RowtimeDataSource`` (what Spark finds
    as ``pyspark_rowtime.DefaultSource``) adds the sink's ``streamWriter``; this package never
    imports the sink."""

    #: The catalog named by the Spark conf ``spark.rowtime.catalog``. A Python data source sees
    #: only its options (pyspark's planner workers get a hand-picked set of Spark confs and do
    #: not pass them on), so the face's ``use_catalog(spark)`` reads the conf on the driver and
    #: registers a subclass carrying it (pickled by value to every worker).
    conf_catalog: str | None = None

    @classmethod
    def name(cls) -> str:
        return "rowtime"

    def _reading(self) -> tuple[ReaderConfig, pa.Schema]:
        return _config(self.options, self.conf_catalog)

    def _reading_columns(self, schema: StructType) -> tuple[ReaderConfig, pa.Schema]:
        cfg, arrow = self._reading()
        payload = open_stream(cfg.location).meta.payload_schema.names
        return cfg, chosen_columns(arrow, payload, schema)

    def _table(self, schema: StructType | None = None) -> tuple[Any, pa.Schema] | None:
        """A table read (option ``table``: ``table_source``) and its output schema (the
        columns ``schema`` keeps), or None for a stream."""
        if not is_table_read(self.options):
            return None
        read = parse_table_options(self.options)
        if schema is None:
            return read, read.output
        return read, chosen_columns(read.output, read.columns.payload.names, schema)

    def schema(self) -> StructType:
        require_supported_spark("schema()")
        table = self._table()
        if table is not None:
            return from_arrow_schema(table[1], prefer_timestamp_ntz=True)
        _, arrow = self._reading()
        return from_arrow_schema(arrow, prefer_timestamp_ntz=True)

    def reader(self, schema: StructType) -> DataSourceReader:
        require_supported_spark("reader()")
        table = self._table(schema)
        if table is not None:
            return TableBatchReader(*table)
        cfg, arrow = self._reading_columns(schema)
        return RowtimeBatchReader(cfg, arrow)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        require_supported_spark("streamReader()")
        table = self._table(schema)
        if table is not None:
            return table_stream_reader(*table)
        cfg, arrow = self._reading_columns(schema)
        refuse_batch_only_options(cfg, "the stream clock")
        return RowtimeStreamReader(cfg, arrow)


#: Most new records the driver plans at once when the query sets no ``maxRowsPerBatch``: a
#: larger backlog (a query started late, ``availableNow`` over a day of data) is planned in
#: several steps (and read in micro-batches of ``MICRO_BATCH_RECORDS``). Planning a step
#: holds about 18 bytes a record on the driver (rowtimes, bound flags, which records are
#: emitted) and a task up to about 32 bytes a record of its partition when it restores rowtime
#: order, so without a cap both would grow with the backlog; with it they follow the cap and the
#: rows ``adjust`` holds (``./dev bench scaling --memory``). On Spark 4.1 no cap applies (see
#: ``RowtimeStreamReader.latestOffset``).
STEP_RECORDS = 1 << 24

#: Most new records one micro-batch admits when the query sets no ``maxRowsPerBatch``: four
#: steps of ``STEP_RECORDS``, planned one after the other and joined
#: (``planner.Planner.plan_joined``), so the driver's memory follows the step while a
#: further micro-batch, which would cost Spark's cycle and nothing else, is spared. Not more,
#: so that a micro-batch still ends within seconds and the query's progress (and the clock of
#: a sink after it) moves during a long backlog.
MICRO_BATCH_RECORDS = 1 << 26


class RowtimeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches in rowtime order, each with at most one bound record (SPEC 7), and at
    most ``maxRowsPerBatch`` (else ``micro_batch_records``, planned ``step_records``
    at a time) new records."""

    #: The cap on new records planned at once without ``maxRowsPerBatch`` (``STEP_RECORDS``).
    step_records: int = STEP_RECORDS
    #: The cap on new records per micro-batch without it (``MICRO_BATCH_RECORDS``).
    micro_batch_records: int = MICRO_BATCH_RECORDS

    def __init__(self, cfg: ReaderConfig, arrow_schema: pa.Schema) -> None:
        self.cfg = cfg
        self.arrow_schema = arrow_schema
        self._planner: Planner | None = None
        self._target: list[int] | None = None
        self._skips = SkipCounter(cfg.location)
        # The start position, computed once: on Spark 4.1 latestOffset() may plan from it before
        # Spark asks for initialOffset(), and both must be the same position.
        self._initial: dict | None = None
        # Spark 4.1 only: the end of the last range Spark planned (partitions()), i.e. the start
        # of the next micro-batch, which 4.1 does not pass to latestOffset().
        self._seen_end: dict | None = None

    @property
    def planner(self) -> Planner:
        if self._planner is None:
            self._planner = Planner(self.cfg)
        return self._planner

    def _offset(self, pos: StreamPosition) -> dict:
        """A position as Spark's offset, with the id of the stream it is a position in."""
        offset = pos.to_dict()
        stream_id = self.planner.stream.meta.stream_id
        if stream_id:
            offset["stream"] = stream_id
        return offset

    def _check_stream(self, *offsets: dict) -> None:
        """Refuse offsets of another stream: a checkpoint from before the stream at this
        location was deleted and created again would otherwise be read as positions in the
        new one (offsets from before stream ids carry none and are taken as they are)."""
        now = self.planner.stream.meta.stream_id
        for offset in offsets:
            was = offset.get("stream") if isinstance(offset, dict) else None
            if now and was and was != now:
                raise OffsetError(
                    f"the query's checkpoint holds positions in stream {was}, and the stream "
                    f"at {self.cfg.location} is stream {now}: it was deleted and created again "
                    "since the checkpoint was written, so those positions mean nothing in it. "
                    "Start the query with a new checkpointLocation (it reads the new stream from "
                    "startingOffsets), or restore the old stream"
                )

    def initialOffset(self) -> dict:
        if self._initial is None:
            self._initial = self._offset(self.planner.start_position())
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.cfg.max_rows_per_batch is not None:
            return ReadMaxRows(self.cfg.max_rows_per_batch)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.planner.available()

    def _available(self) -> list[int]:
        now = self.planner.available()
        if self._target is not None:
            return [min(a, t) for a, t in zip(now, self._target, strict=True)]
        return now

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        """The end of the next micro-batch from ``start``.

        Spark 4.2 and later pass ``start`` and ``limit`` (admission control): a micro-batch
        takes at most ``maxRowsPerBatch``, else ``micro_batch_records`` new records,
        planned ``step_records`` at a time, and under ``availableNow`` Spark keeps
        asking until ``prepareForTriggerAvailableNow``'s target is reached. Spark 4.1
        passes neither (pyspark decides by the number of parameters; these have defaults, so
        4.2 still sees two) and, under ``availableNow``, takes the first answer as the
        query's final target, without telling the source its trigger. So on 4.1 the
        micro-batch is the whole backlog, never capped: a cap would end an ``availableNow``
        query with records unread. The planner then holds up to 18 bytes a new record on the
        driver (docs/benchmarks.md, "Spark 4.1: a backlog in one micro-batch"). The start is
        the end of the range Spark last planned (it calls ``partitions(end, end)`` on
        restart, before any ``latestOffset()``), else the initial offset.
        """
        joined: int | None = None
        if start is None:  # Spark 4.1
            start = self._seen_end if self._seen_end is not None else self.initialOffset()
            max_rows: int | None = None
        elif isinstance(limit, ReadMaxRows):
            max_rows = min(limit.max_rows, self.step_records)
        else:
            max_rows = self.step_records
            joined = max(self.micro_batch_records, max_rows)
        self._check_stream(start)
        pos, moved = skip_removed(StreamPosition.from_dict(start), self.planner.stream, self.cfg)
        self._skips.count(moved)
        if joined is not None and max_rows is not None:
            new = self.planner.plan_joined(pos, self._available(), max_rows, joined)
        else:
            new = self.planner.plan(pos, self._available(), max_rows)
        if new is None:
            return start if not moved else self._offset(pos)
        return self._offset(new)

    def reportLatestOffset(self) -> dict | None:
        report = progress_report(self.planner)
        report.update(skipped_progress(self._skips.skipped))
        return report

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        self._check_stream(start, end)
        self._seen_end = end
        # A step replayed after a restart may need records a trim removed since it was planned.
        start, moved = replay_position(start, self.planner.stream, self.cfg)
        self._skips.count(moved)
        end, _ = replay_position(end, self.planner.stream, self.cfg)
        runs = self.planner.runs_for(start, end)
        if runs is None:
            runs = self._plan_again(start, end)
        late = self.planner.late_for(start, end)
        return [RowtimePartition(t) for t in partition_tasks(start, end, runs, late)]

    def _plan_again(self, start: dict, end: dict) -> list[EmitRuns | None] | None:
        """The runs of a step this planner did not plan (the query restarted between planning
        the micro-batch and running it), planned again ``step_records`` at a time: without
        runs each task replays its partition's step whole, and a micro-batch is up to
        ``micro_batch_records``, more than a task should hold at once. The same step, so
        the same end (else, which cannot be, None: the tasks' replay is right, only larger);
        None with ``idle.timeout`` and ``interval.count``, which are planned as they are."""
        if self.cfg.idle_timeout_us is not None or self.cfg.interval_count is not None:
            return None
        s, e = StreamPosition.from_dict(start), StreamPosition.from_dict(end)
        ends = [p.next for p in e.partitions]
        records = sum(b - a.next for a, b in zip(s.partitions, ends, strict=True))
        if records <= 0:
            return None
        again = self.planner.plan_joined(s, ends, self.step_records, records)
        if again is None or again.to_dict() != e.to_dict():
            return None
        return self.planner.runs_for(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RowtimePartition)
        return _read(self.cfg, partition.task, self.arrow_schema)

    def commit(self, end: dict) -> None:
        pass  # the log is immutable: nothing to release

    def stop(self) -> None:
        self._planner = None


class RowtimeBatchReader(DataSourceReader):
    """``spark.read.format("rowtime")``: the history as one step from the start of the log.

    By default (``endingOffsets=clock``) the rows are exactly what a streaming query would
    have emitted by now: released by the policy and at or below the stream clock, plus the
    final bound record. With ``endingOffsets=latest`` they are every row written so far: each
    partition under its policy as if it ended now (held rows released, nothing cut at the
    slowest partition's clock), and no bound record. With ``option("output", "discarded")`` it
    returns the quarantine instead: every row the policy discarded, with its partition, offset,
    arrival, reason and the clock at the time.
    """

    def __init__(self, cfg: ReaderConfig, arrow_schema: pa.Schema) -> None:
        self.cfg = cfg
        self.arrow_schema = arrow_schema

    def partitions(self) -> Sequence[InputPartition]:
        return [RowtimePartition(t) for t in batch_tasks(self.cfg)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RowtimePartition)
        return _read(self.cfg, partition.task, self.arrow_schema)

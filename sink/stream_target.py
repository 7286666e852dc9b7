"""A rowtime-stream target: a query's output appended to a stream, exactly once, with bounds.

The target is a stream of the embedded log (created if absent, with the query's payload
columns: its columns minus ``rowtime`` and ``is_bound``; one partition). Data rows are appended
with their ``rowtime`` as explicit rowtime, in rowtime order; the batch's clock (bound records
or watermark, :mod:`sink.clock`) becomes a bound record after them, so a query reading the
target sees the same progress (SQLstream pumps pass bounds on the same way).

**Two-phase commit.** ``write()`` (executors) stages the task's data rows as an Arrow IPC file
under ``<stream>/_rowtime_sink/staging/<batch>/``. ``commit()`` (driver, another process) takes
the partition's writer lock (one writer per partition: a flock that dies with its process) and:

1. looks for the batch's manifest entry, an *intent* that records where the batch starts in
   the partition (``start``) and how many records it appends (``records``). If the partition
   already holds ``start + records`` records, the batch was appended: a replay is a no-op. If
   it holds exactly ``start``, a crash came between intent and append: do it again;
2. otherwise reads the staged files, sorts the rows by rowtime (stable), writes the intent
   (atomic, fsync'd) and appends rows plus bound as **one segment**: the log makes a segment
   durable and visible whole or not at all, so a batch is never half in the target.

The target stream belongs to the query: another writer appending between a crash and the replay
would make the replay's check ambiguous, so adapters should write elsewhere.

The target's clock is the stream's clock (the log's: highest bound or row), read with
``get_rowtime_bound(path)`` like any stream's. A row below it fails the batch (the promise was
made), before anything is written.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..bounds.errors import CorruptLogError, LateRowError, OptionError, SchemaError
from ..streams.ddl import to_ddl
from ..streams.log import Stream, create_stream, open_stream
from ..streams.meta import payload_schema, read_meta
from ..streams.writer import Writer
from .layout import SINK_DIR, SinkState, batch_name, wait_for_lock
from .options import ROWTIME, SinkConfig
from .task import RowSplitter, StagedFile, TaskInfo, TaskReport, as_datetime, iso

__all__ = ["StreamTarget"]

#: The writer buffers the whole batch and flushes it once: one batch is one segment.
_NO_AUTO_FLUSH = 1 << 62
#: Rows per staged record batch. Spark hands write() batches of 10,000 rows; gathering rows
#: across thousands of tiny chunks makes the commit's sort several times slower.
STAGE_BATCH_ROWS = 1 << 20


def _compatible(stream_schema: pa.Schema, query_schema: pa.Schema) -> str | None:
    """Why the query's payload cannot be appended to the stream, or None if it can."""
    if stream_schema.names != query_schema.names:
        return (
            f"the stream has columns ({', '.join(stream_schema.names)}) and the query "
            f"({', '.join(query_schema.names)})"
        )
    for have, want in zip(stream_schema, query_schema, strict=True):
        if have.type != want.type:
            return f"column {have.name!r} is {have.type} in the stream and {want.type} in the query"
        if not have.nullable and want.nullable:
            return f"column {have.name!r} is NOT NULL in the stream and nullable in the query"
    return None


class StreamTarget:
    """The rowtime-stream target of one query. Holds only picklable configuration."""

    def __init__(self, cfg: SinkConfig) -> None:
        self.cfg = cfg
        self.state = SinkState(cfg.location)
        self.where = f"target stream {cfg.location}"

    def _stream(self) -> Stream:
        return open_stream(self.cfg.location)

    # -- driver, when the query starts --------------------------------------------------------

    def prepare(self) -> None:
        """Create the stream if absent; check an existing one can take the query's rows."""
        cfg = self.cfg
        try:
            wanted = payload_schema(cfg.payload_schema)
        except SchemaError as e:
            raise SchemaError(f"{self.where}: the query's payload cannot be a stream: {e}") from e
        if read_meta(cfg.location) is None:
            if os.path.isdir(os.path.join(cfg.location, SINK_DIR)):
                raise OptionError(
                    f"option path={cfg.location!r} holds a parquet target of this sink; "
                    "target=stream writes a rowtime stream: choose another path"
                )
            stream = create_stream(cfg.location, wanted, 1)
        else:
            stream = self._stream()
        why = _compatible(stream.meta.payload_schema, wanted)
        if why is not None:
            raise SchemaError(
                f"{self.where} cannot take this query's rows: {why}. Write to a new path, or "
                f"select columns matching the stream's ({to_ddl(stream.meta.payload_schema)})"
            )
        if stream.meta.partitions != 1:
            raise OptionError(
                f"{self.where} has {stream.meta.partitions} partitions; the sink writes a stream "
                "of one partition (its clock is the query's): write to a new path"
            )
        self.state.ensure()

    # -- executors ----------------------------------------------------------------------------

    def _applied(self, entry: dict[str, Any], end: int) -> bool:
        start, records = int(entry["start"]), int(entry["records"])
        if end >= start + records:
            return True
        if end != start:
            raise CorruptLogError(
                f"{self.where}: batch {entry['batch']} was to append records [{start}, "
                f"{start + records}) but the partition holds {end}: another writer appended "
                "to the target meanwhile; the target stream must be written by the query alone"
            )
        return False

    def write(self, info: TaskInfo, batches: Iterable[pa.RecordBatch]) -> TaskReport:
        """Stage this task's data rows as one Arrow IPC file (in arrival order, in record
        batches of up to :data:`STAGE_BATCH_ROWS` rows)."""
        stream = self._stream()
        entry = self.state.entry(info.batch_id)
        if entry is not None and self._applied(entry, stream.end_offset(0)):
            for _ in batches:  # a replay of a committed batch: nothing to stage
                pass
            return TaskReport(info=info, skipped=True)
        splitter = RowSplitter(self.cfg, info, stream.clock_us(0), self.where)
        rel = os.path.join(
            SINK_DIR,
            "staging",
            batch_name(info.batch_id),
            f"{info.task:05d}-{info.attempt}-{uuid.uuid4().hex[:12]}.arrow",
        )
        path = os.path.join(self.cfg.location, rel)
        writer = None
        pending: list[pa.RecordBatch] = []
        pending_rows = 0
        try:
            for batch in batches:
                split = splitter.split(batch)
                if split is None:
                    continue
                data, _ = split
                if writer is None:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    writer = pa.ipc.new_file(path, data.schema)
                pending.append(data)
                pending_rows += data.num_rows
                if pending_rows >= STAGE_BATCH_ROWS:
                    writer.write_table(pa.Table.from_batches(pending).combine_chunks())
                    pending, pending_rows = [], 0
            if writer is not None:
                if pending:
                    writer.write_table(pa.Table.from_batches(pending).combine_chunks())
                writer.close()
        except BaseException:
            if writer is not None:
                try:
                    writer.close()
                except Exception:
                    pass
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            raise
        report = splitter.report()
        if writer is not None:
            report.files = [StagedFile(staged=rel, rows=report.rows)]
        return report

    # -- driver, per batch --------------------------------------------------------------------

    def _rows(self, reports: Sequence[TaskReport]) -> pa.Table | None:
        tables = []
        for report in reports:
            for f in report.files:
                with pa.memory_map(os.path.join(self.cfg.location, f.staged), "r") as source:
                    tables.append(pa.ipc.open_file(source).read_all())
        tables = [t for t in tables if t.num_rows]
        if not tables:
            return None
        # Tasks that hold disjoint stretches of time (one source partition each, or windows
        # by key) concatenate in order, and the sort below finds nothing to do.
        tables.sort(key=lambda t: t.column(ROWTIME)[0].value)
        table = pa.concat_tables(tables, promote_options="none") if len(tables) > 1 else tables[0]
        if table.num_rows == 0:
            return None
        rt = table.column(ROWTIME).cast(pa.int64()).to_numpy()
        if len(rt) > 1 and not bool(np.all(rt[1:] >= rt[:-1])):
            table = table.take(pa.array(np.argsort(rt, kind="stable")))
        return table

    def commit(
        self, reports: Sequence[TaskReport], batch_id: int, candidate_us: int | None
    ) -> dict[str, Any] | None:
        """Append batch ``batch_id`` exactly once; returns its manifest entry (None when the
        batch appends nothing). ``candidate_us`` is the clock the batch would move to."""
        state = self.state
        stream = self._stream()
        # Holds the partition's lock from here on (waiting while a killed driver's commit runner
        # finishes). On any error the buffer is discarded (abort), never flushed: a batch is
        # appended whole or not at all.
        writer = wait_for_lock(
            lambda: Writer(stream, 0, flush_records=_NO_AUTO_FLUSH, flush_bytes=_NO_AUTO_FLUSH)
        )
        try:
            entry = self._append(writer, reports, batch_id, candidate_us)
        except BaseException:
            writer.abort()
            raise
        writer.close()
        if entry is None or entry.get("replayed"):
            state.clean_staging(batch_id)
            return entry
        state.prune()
        state.clean_staging(batch_id)
        return entry

    def _append(
        self,
        writer: Writer,
        reports: Sequence[TaskReport],
        batch_id: int,
        candidate_us: int | None,
    ) -> dict[str, Any] | None:
        state = self.state
        end = writer.end_offset
        done = state.entry(batch_id)
        if done is not None and self._applied(done, end):
            return {**done, "replayed": True}
        clock = writer.clock_us
        table = self._rows(reports)
        rows = 0 if table is None else table.num_rows
        after_rows = clock
        if table is not None:
            rt = table.column(ROWTIME).cast(pa.int64())
            lo, hi = int(rt[0].as_py()), int(rt[-1].as_py())
            if clock is not None and lo < clock:
                raise LateRowError(
                    f"{self.where}: batch {batch_id} has a row with rowtime {iso(lo)}, "
                    f"below the stream's clock {iso(clock)}; nothing of the batch was written"
                )
            after_rows = hi if clock is None else max(hi, clock)
        bound = candidate_us is not None and (after_rows is None or candidate_us > after_rows)
        records = rows + int(bound)
        if records == 0:
            return None
        new_clock = candidate_us if bound else after_rows
        entry = {
            "batch": batch_id,
            "query_id": _query_id(reports),
            "start": end,
            "records": records,
            "rows": rows,
            "clock_us": new_clock,
            "clock": iso(new_clock),
            "previous_clock_us": clock,
        }
        # The intent, durable before the append.
        state.replace_entry(batch_id, entry)
        if table is not None:
            writer.insert_arrow(table, rowtime_column=ROWTIME)
        if bound:
            assert candidate_us is not None
            writer.set_rowtime_bound(as_datetime(candidate_us))
        writer.flush()  # rows and bound: one segment, durable and visible as a whole
        return entry

    def abort(self, reports: Sequence[TaskReport | None], batch_id: int) -> None:
        """Remove what the batch staged, unless it was committed after all."""
        entry = self.state.entry(batch_id)
        if entry is None or not self._applied(entry, self._stream().end_offset(0)):
            shutil.rmtree(self.state.batch_staging(batch_id), ignore_errors=True)

    # -- reading ------------------------------------------------------------------------------

    def clock_us(self) -> int | None:
        return self._stream().stream_clock_us()


def _query_id(reports: Iterable[TaskReport]) -> str | None:
    ids = {r.info.query_id for r in reports if r.info.query_id}
    return ids.pop() if len(ids) == 1 else None

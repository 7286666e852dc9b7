"""What the Delta Lake and Iceberg targets share: data files written where they stay, one table
commit per batch, exactly once, and the clock moved in the same commit.

Both formats make a file part of the table only when a commit of the table's own log (Delta's
``_delta_log``, Iceberg's metadata through its catalog) adds it, so the sink needs no staging
folder and no manifest of its own, as Delta's and Iceberg's own streaming writers need none:

1. **executors** (``write()``): each task writes one Parquet file per time partition it has
   rows for, straight into the table's data folder, under a name no other task or attempt uses
   (batch, task, attempt, a random part), a row group at a time as its rows arrive (as the
   Parquet target does: ``PartitionFiles``), and reports each file with
   what the table's commit records of it (size, row count, statistics from the footer its
   writer wrote);
2. **driver** (``commit()``): load the table as of now; if the table already records this
   query's batch (Delta: the app transaction ``txn(queryId, version=batchId)``, as Delta's own
   ``DeltaSink`` skips a batch; Iceberg: the table properties ``rowtime.query-id`` and
   ``rowtime.batch``, set in the same metadata commit, as Flink's committer keys on
   ``flink.max-committed-checkpoint-id``), stop: a replayed batch is a no-op. Otherwise commit
   all files of the batch in **one** table transaction that also records the batch and moves
   the clock (``streams.tables.CLOCK_KEY``). A commit that loses a race with another
   writer (another application, a compaction, the same batch committed by a dying driver's
   commit runner) is not retried by the table library, which would rebase it without this
   check: the sink reloads the table and starts again at the check;
3. a batch that only moves the clock commits metadata without files; one that changes nothing
   commits nothing (its replay recomputes the same).

Files of a task that failed, or of a batch that never committed, are in the folder but in no
commit: invisible to every reader of the table, and removed by ``abort()`` when Spark calls it,
or by the table's own clean-up of unreferenced files (Delta's ``VACUUM``, Iceberg's
``remove_orphan_files``), as with the formats' own Spark writers.

The clock's rules are the sink's (``sink.clock``): a batch's clock is ``advance(previous,
candidate)``, never back, and never ahead of a row still to come.

This module imports no pyspark; the table libraries only where a target of theirs is used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import pyarrow as pa

from ..bounds.errors import CommitError
from ..streams.sink_state import TargetFiles
from .clock import advance, checkpoint_query_id
from .options import SinkConfig
from .parquet_target import PartitionFiles, WrittenFile, partition_name
from .target import stage_task
from .task import StagedFile, TaskInfo, TaskReport, iso, reports_query_id

__all__ = ["COMMIT_ATTEMPTS", "TableCommit", "TableFormat", "TableTarget"]

#: How often a commit that lost a race is tried again (each time after reloading the table
#: and checking the batch is still not in it).
COMMIT_ATTEMPTS = 20

#: The app id of a batch's commit when the query has no id (never under Spark, which always
#: sets one; kept for tests that drive a target by hand).
ANONYMOUS_QUERY = "pyspark-rowtime"


@dataclasses.dataclass(frozen=True)
class TableCommit:
    """What one batch committed to a table (what ``commit()`` returns; None when nothing)."""

    batch: int
    query_id: str
    clock_us: int | None
    clock: str
    previous_clock_us: int | None
    rows: int
    files: tuple[str, ...]


class TableFormat(Protocol):
    """One table format, as ``TableTarget`` drives it."""

    name: str

    def load(self) -> Any:
        """The table as of now (raises if it is gone)."""
        ...

    def committed_batch(self, table: Any, query_id: str) -> int | None:
        """The highest batch of ``query_id`` that ``table`` records, None if none."""
        ...

    def clock_us(self, table: Any) -> int | None:
        """The clock ``table`` records."""
        ...

    def file_schema(self, table: Any) -> pa.Schema | None:
        """Executor: the schema ``table``'s data files are written with (the rows are cast to
        it, a column the rows lack written as nulls); None: the rows' own."""
        ...

    def file_stats(self, table: Any, written: WrittenFile) -> Any:
        """Executor: what the commit records of a data file just written (one time
        partition), from the footer its writer wrote (no file is read back)."""
        ...

    def commit(
        self, table: Any, files: Sequence[StagedFile], entry: TableCommit, summary: dict[str, str]
    ) -> bool:
        """Commit ``files`` with ``entry``'s batch and clock in one table transaction; False
        when another commit won the race (the caller reloads and checks again)."""
        ...

    def data_files(self, table: Any) -> tuple[TargetFiles, str]:
        """Where the table's data files go: the files, and the folder below them."""
        ...


class _TableStager(PartitionFiles):
    """One task's data files, one per time partition it has rows for, written where they stay
    as the rows arrive (``PartitionFiles``)."""

    def __init__(self, target: TableTarget, info: TaskInfo, table: Any) -> None:
        files, self.folder = target.format.data_files(table)
        super().__init__(target.cfg, files, info)
        self.target = target
        self.table = table
        self.schema = target.format.file_schema(table)

    def path(self, key: int) -> str:
        name = self.file_name(key)
        return f"{self.folder}/{name}" if self.folder else name

    def conform(self, data: pa.Table) -> pa.Table:
        schema = self.schema
        if schema is None:
            return data
        columns = [
            data.column(f.name).cast(f.type)
            if f.name in data.column_names
            else pa.nulls(data.num_rows, f.type)
            for f in schema
        ]
        return pa.Table.from_arrays(columns, schema=schema)

    def close(self) -> list[StagedFile]:
        stats = self.target.format.file_stats
        return [
            StagedFile(f.rel, f.rows, key=f.key, size=f.size, stats=stats(self.table, f))
            for f in self.finish()
        ]

    def discard(self) -> None:
        self.abandon()
        try:
            self.files.remove(list(self.paths.values()))
        except Exception:
            pass  # unreferenced files are invisible; the table's own clean-up removes them


class TableTarget:
    """A table target of one query (Delta or Iceberg, by ``format``). Holds only picklable
    configuration; the format opens the table where it is used."""

    def __init__(self, cfg: SinkConfig, fmt: TableFormat, state: Any) -> None:
        self.cfg = cfg
        self.format = fmt
        self.state = state
        self.where = f"{fmt.name} target {cfg.location}"

    def prepare(self) -> None:
        """Driver, when the query starts: create the table or check it takes the rows."""
        raise NotImplementedError

    # -- executors ------------------------------------------------------------------------------

    def write(self, info: TaskInfo, batches: Iterable[pa.RecordBatch]) -> TaskReport:
        """Write this task's rows as data files of the table, one per time partition; nothing
        for a batch the table already records (a replay)."""
        table = self.format.load()
        query_id = info.query_id or ANONYMOUS_QUERY

        def committed() -> bool:
            done = self.format.committed_batch(table, query_id)
            return done is not None and done >= info.batch_id

        def begin() -> tuple[int | None, _TableStager]:
            return self.format.clock_us(table), _TableStager(self, info, table)

        report, _ = stage_task(self, info, batches, begin, committed)
        return report

    # -- driver ---------------------------------------------------------------------------------

    def commit(
        self, reports: Sequence[TaskReport], batch_id: int, candidate_us: int | None
    ) -> TableCommit | None:
        """Commit batch ``batch_id`` exactly once; returns what it committed (None when the
        batch was committed before, or changes nothing)."""
        files = [f for r in reports for f in r.files]
        query_id = self.query_id(reports)
        for _ in range(COMMIT_ATTEMPTS):
            table = self.format.load()
            done = self.format.committed_batch(table, query_id)
            if done is not None and done >= batch_id:
                return None  # a replay: the table has it
            previous = self.format.clock_us(table)
            clock = advance(previous, candidate_us)
            if not files and clock == previous:
                return None
            entry = TableCommit(
                batch=batch_id,
                query_id=query_id,
                clock_us=clock,
                clock=iso(clock),
                previous_clock_us=previous,
                rows=sum(f.rows for f in files),
                files=tuple(f.staged for f in files),
            )
            if self.format.commit(table, files, entry, self.summary(entry)):
                return entry
        raise CommitError(
            f"{self.where}: batch {batch_id} lost {COMMIT_ATTEMPTS} commit races in a row to "
            "other writers of the table; nothing of it is committed, and Spark will retry the "
            "batch. Is something rewriting the table in a tight loop?"
        )

    def query_id(self, reports: Sequence[TaskReport | None]) -> str:
        """The batch's query: its tasks' (Spark sets it on every task), else the checkpoint's."""
        return (
            reports_query_id(reports) or checkpoint_query_id(self.cfg.checkpoint) or ANONYMOUS_QUERY
        )

    def summary(self, entry: TableCommit) -> dict[str, str]:
        """What each sink commit carries in the table's history (all text, as both formats
        require): the clock, the batch and the query."""
        out = {
            "rowtime.batch": str(entry.batch),
            "rowtime.query-id": entry.query_id,
        }
        if entry.clock_us is not None:
            out["rowtime.clock"] = str(entry.clock_us)
        return out

    def abort(self, reports: Sequence[TaskReport | None], batch_id: int) -> None:
        """Remove the files of a batch that did not commit."""
        query_id = self.query_id(reports)
        table = self.format.load()
        done = self.format.committed_batch(table, query_id)
        if done is not None and done >= batch_id:
            return
        files, _ = self.format.data_files(table)
        files.remove([f.staged for r in reports if r is not None for f in r.files])

    def clock_us(self) -> int | None:
        return self.format.clock_us(self.format.load())


def partition_value(key: int, granularity: str) -> str:
    """The value of the time partition column for partition ``key`` (as in folder names)."""
    return partition_name(key, granularity).split("=", 1)[1]

"""The Spark reader: ``spark.readStream.format("rowtime")`` and ``spark.read.format("rowtime")``.

The driver plans time; executors move bytes (DESIGN). ``latestOffset`` reads only the rowtime
columns of new records, runs each partition's policy and the alignment across partitions
(``pyspark_rowtime.bounds.plan``) and writes everything it decided into the end offset: per
partition the policy state, and the stream clock. It also keeps, for the step it just planned,
which offsets each partition emits, as a few runs of consecutive offsets (``EmitRuns``);
``partitions()`` hands them to the tasks, so an executor only reads those records, sorts them by
rowtime when they are out of order, and emits them as Arrow record batches, without running
the policy again. When the driver has no runs for a step (it restarted, or the emitted offsets
break into too many runs), the executor replays the policy from the start offset's state
instead. Both give the same rows: the same offsets always give the same rows and the same
bound record.

The reader is three modules: the driver's planner (``planner``), the task types and the
step both sides share (``tasks``) and the executor (``executor``). This module is the
import path they had when they were one (0.1.0, 0.2.0): every public name stays importable
from here, and the pickled classes (``ReadTask``, ``EmitRuns``) are found by it.
"""

from __future__ import annotations

from .executor import (
    read_task,
)
from .ordered import clock_at_end, merge_clocks, sorted_step
from .planner import (
    Planner,
    batch_tasks,
    partition_tasks,
    progress_report,
    whole_step,
    written_tasks,
)
from .tasks import (
    BATCH_BYTES,
    BATCH_ROWS,
    MAX_EMIT_RUNS,
    MIN_BATCH_ROWS,
    PIECE_RECORDS,
    QUARANTINE_COLUMNS,
    RUN_CHUNK_RECORDS,
    SORT_CHUNK_RECORDS,
    TS_TYPE,
    EmitRuns,
    ReadTask,
    batch_rows,
    classify_pieces,
    late_mask,
    late_offsets,
    mask_of_offsets,
    output_arrow_schema,
    record_times,
    time_columns,
    where_of,
)

__all__ = [
    "BATCH_BYTES",
    "BATCH_ROWS",
    "MAX_EMIT_RUNS",
    "MIN_BATCH_ROWS",
    "PIECE_RECORDS",
    "QUARANTINE_COLUMNS",
    "RUN_CHUNK_RECORDS",
    "SORT_CHUNK_RECORDS",
    "TS_TYPE",
    "EmitRuns",
    "Planner",
    "ReadTask",
    "batch_rows",
    "batch_tasks",
    "classify_pieces",
    "clock_at_end",
    "late_mask",
    "late_offsets",
    "mask_of_offsets",
    "merge_clocks",
    "output_arrow_schema",
    "partition_tasks",
    "progress_report",
    "read_task",
    "record_times",
    "sorted_step",
    "time_columns",
    "where_of",
    "whole_step",
    "written_tasks",
]

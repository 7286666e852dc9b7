"""What the sink's protocol tests share: record batches as the reader emits them, a prepared
target, and one micro-batch driven the way Spark drives it (no Spark here)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pyarrow as pa

from pyspark_rowtime.sink.clock import bounds_clock_us
from pyspark_rowtime.sink.options import SinkConfig, parse_sink_options
from pyspark_rowtime.sink.parquet_target import ParquetTarget
from pyspark_rowtime.sink.stream_target import StreamTarget
from pyspark_rowtime.sink.task import TaskInfo, TaskReport

TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("id", pa.int64()), ("rowtime", TS), ("is_bound", pa.bool_())])
HOUR = 3_600_000_000
T0 = 1_700_000_000_000_000 - 1_700_000_000_000_000 % HOUR  # 2023-11-14T22:00:00Z


def config(root: Path, target: str, location: str | None = None, **options: str) -> SinkConfig:
    path = location or str(root / "target")
    return parse_sink_options({"path": path, "target": target, **options}, SCHEMA)


def make(
    root: Path, target: str, owner: str | None = "q1", location: str | None = None, **options: str
) -> StreamTarget | ParquetTarget:
    """The target, prepared as at query start, and owned by query ``owner``; at ``location``
    (a ``redis://`` URL, say) instead of a folder under ``root`` when given."""
    cfg = config(root, target, location, **options)
    t: StreamTarget | ParquetTarget = (
        ParquetTarget(cfg) if target == "parquet" else StreamTarget(cfg)
    )
    t.prepare()
    t.state.claim(owner)
    return t


def records(rows: list[tuple[int, int]], bound: int | None = None) -> pa.RecordBatch:
    """A record batch as the reader emits it: data rows, then maybe one bound record."""
    ids: list[int | None] = [i for i, _ in rows]
    times = [t for _, t in rows]
    flags = [False] * len(rows)
    if bound is not None:
        ids.append(None)
        times.append(bound)
        flags.append(True)
    return pa.RecordBatch.from_arrays(
        [pa.array(ids, pa.int64()), pa.array(times, pa.int64()).cast(TS), pa.array(flags)],
        schema=SCHEMA,
    )


def run(
    target: StreamTarget | ParquetTarget,
    batch_id: int,
    tasks: list[list[pa.RecordBatch]],
    query_id: str = "q1",
    attempt: int = 0,
) -> list[TaskReport]:
    """One micro-batch: every task's write(), the reports through pickle, then commit()."""
    reports = [
        target.write(TaskInfo(batch_id, i, attempt, query_id), iter(batches))
        for i, batches in enumerate(tasks)
    ]
    reports = pickle.loads(pickle.dumps(reports))  # they travel to the driver
    target.state.claim(query_id)
    target.commit(reports, batch_id, bounds_clock_us(r.bound_us for r in reports))
    return reports


def published_parquet(location: str) -> pa.Table | None:
    """Every published file of the Parquet target at ``location`` (a folder or an object
    store; never its staging area), read back as one table, or None when it has none."""
    import pyarrow.parquet as pq

    from pyspark_rowtime.sink.layout import SINK_DIR
    from pyspark_rowtime.sink.parquet_target import target_files_at

    files = target_files_at(location)
    tables = []
    for name in files.list(""):
        if name.endswith(".parquet") and not name.startswith(SINK_DIR):
            data = files.read_bytes(name)
            assert data is not None, f"{name} was listed and is gone"
            tables.append(pq.read_table(pa.py_buffer(data)))
    return pa.concat_tables(tables) if tables else None

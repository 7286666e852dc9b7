"""Benchmark: a Delta table read as a rowtime stream, beside a floor over the same files.

``./dev bench table-source [--rows N] [--versions V] [--rounds R] [--plan-versions P]``

Reading: a Delta table of ``--rows`` rows (default 10 M: id BIGINT, v DOUBLE, s STRING,
rowtime TIMESTAMP, in rowtime order) written by delta-rs in ``--versions`` commits, drained with
``trigger(availableNow=True)`` into ``noop`` by

* ``rowtime``: ``format("rowtime").option("table", "delta")``, order reject;
* ``floor``: the cheapest Python source over the same data files: one task (as the table
  reader's micro-batch is one task) that opens each file with pyarrow and yields its record
  batches as they are, ``is_bound`` added;
* ``parquet``: Spark's own Parquet file stream source over the same folder (the JVM's reader:
  no Python worker at all), printed beside.

Rounds are interleaved (:func:`benchutil.interleaved`); the ratio is rowtime / floor.

Planning: a table of ``--plan-versions`` commits (default 10,000, each a clock-only commit of
the sink's app transaction), read to its end once; then one more commit, and the time of the
micro-batch's planning (``latestOffset`` and ``partitions``, Spark-free) over it, median of 20.
The reader reads the new commit file only (the offset's anchor), so this does not grow with
the table's history.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from benchutil import drain, interleaved, spark_session
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

START_US = 1_700_000_000_000_000
STEP_US = 100
WORDS = np.array(["ORCL", "MSFT", "IBM", "SAP", "AAPL", "GOOG", "AMZN", "META"])
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("v", pa.float64()),
        pa.field("s", pa.string()),
        pa.field("rowtime", pa.timestamp("us", tz="UTC")),
    ]
)


def write_table(path: str, rows: int, versions: int) -> None:
    from deltalake import write_deltalake

    rng = np.random.default_rng(0)
    per = rows // versions
    for v in range(versions):
        first = v * per
        ids = np.arange(first, first + per, dtype=np.int64)
        data = pa.table(
            {
                "id": ids,
                "v": rng.random(per),
                "s": pa.array(WORDS[rng.integers(0, len(WORDS), per)].tolist(), pa.string()),
                "rowtime": pa.array(START_US + ids * STEP_US, pa.int64()).view(SCHEMA[3].type),
            },
            schema=SCHEMA,
        )
        write_deltalake(path, data, mode="append")


class TableFloorSource(DataSource):
    """The floor: every data file of the table, its batches as they are, in one task."""

    @classmethod
    def name(cls) -> str:
        return "table_floor"

    def schema(self) -> str:
        return "id BIGINT, v DOUBLE, s STRING, rowtime TIMESTAMP, is_bound BOOLEAN"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return TableFloorReader(self.options["path"])


class TableFloorReader(DataSourceStreamReader):
    def __init__(self, path: str) -> None:
        self.path = path

    def initialOffset(self) -> dict:
        return {"read": False}

    def latestOffset(self) -> dict:
        return {"read": True}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        from deltalake import DeltaTable

        return [InputPartition(sorted(DeltaTable(self.path).file_uris()))]

    def commit(self, end: dict) -> None:
        pass

    def read(self, partition: InputPartition) -> Any:
        for uri in partition.value:
            for b in pq.ParquetFile(uri).iter_batches(batch_size=1 << 20):
                false = pa.array(np.zeros(b.num_rows, dtype=bool))
                yield pa.RecordBatch.from_arrays([*b.columns, false], [*SCHEMA.names, "is_bound"])


def plan_bench(root: str, versions: int) -> list[float]:
    """Milliseconds to plan one micro-batch over one new commit of a table of ``versions``
    commits (Spark-free: the table source's latestOffset and partitions)."""
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    from pyspark_rowtime.datasource.table_source import TableSource, parse_table_options

    path = os.path.join(root, "plan")
    write_deltalake(path, pa.table({"id": pa.array([0], pa.int64()),
                                    "rowtime": pa.array([START_US], SCHEMA[3].type)}))  # fmt: skip
    table = DeltaTable(path)
    t0 = time.perf_counter()
    for v in range(versions):
        table.create_write_transaction(
            [],
            "append",
            table.schema(),
            commit_properties=CommitProperties(
                app_transactions=[Transaction("rowtime.clock", START_US + v + 1)]
            ),
        )
        table.update_incremental()  # this object commits next on its own last commit
    print(f"plan: {versions} commits written in {time.perf_counter() - t0:.0f} s", flush=True)
    read = parse_table_options({"path": path, "table": "delta"})
    source = TableSource(read)
    start = source.initial_offset()
    t0 = time.perf_counter()
    start = source.latest_offset(start, 1 << 24)
    print(f"plan: the whole history (first micro-batch) in {time.perf_counter() - t0:.2f} s")
    out = []
    for i in range(20):
        table.create_write_transaction(
            [],
            "append",
            table.schema(),
            commit_properties=CommitProperties(
                app_transactions=[Transaction("rowtime.clock", START_US + versions + i + 1)]
            ),
        )
        table.update_incremental()
        t0 = time.perf_counter()
        end = source.latest_offset(start, 1 << 24)
        source.tasks(start, end, source.runs_for(start, end))
        out.append((time.perf_counter() - t0) * 1000)
        source.commit(end)
        start = end
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--versions", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--plan-versions", type=int, default=10_000)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--skip-read", action="store_true", help="the planning part only")
    args = ap.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="rowtime-bench-tables-")
    try:
        ms = plan_bench(root, args.plan_versions)
        print(
            f"plan: one micro-batch over a new commit of a {args.plan_versions}-version table: "
            f"median {statistics.median(ms):.1f} ms (spread {min(ms):.1f}-{max(ms):.1f}, 20 runs)",
            flush=True,
        )
        if args.skip_read:
            return
        path = os.path.join(root, "table")
        t0 = time.perf_counter()
        write_table(path, args.rows, args.versions)
        print(f"read: {args.rows:,} rows in {args.versions} commits written in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
        spark = spark_session("bench-table-source")
        spark.dataSource.register(TableFloorSource)
        from pyspark.sql.types import StructType

        schema = StructType.fromDDL("id BIGINT, v DOUBLE, s STRING, rowtime TIMESTAMP")

        def ours() -> tuple[float, int]:
            df = spark.readStream.format("rowtime").option("table", "delta").load(path)
            return drain(df, root)

        def floor() -> tuple[float, int]:
            return drain(spark.readStream.format("table_floor").load(path), root)

        def parquet() -> tuple[float, int]:
            return drain(spark.readStream.schema(schema).parquet(path), root)

        cases = {"delta": {"rowtime": ours, "floor": floor, "parquet": parquet}}
        interleaved(cases, args.rounds, {"delta": args.rows}, base="floor", ours="rowtime")
        spark.stop()
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Benchmark: Delta and Iceberg tables read as rowtime streams, beside a floor over the same files.

``./dev bench table-source [--rows N] [--versions V] [--rounds R] [--plan-versions P]
[--formats delta,iceberg] [--json PATH]``

Reading: a table of ``--rows`` rows (default 10 M: id BIGINT, v DOUBLE, s STRING, rowtime
TIMESTAMP, in rowtime order) in ``--versions`` commits, by delta-rs (Delta) and by pyiceberg's
``append`` into a SQL catalog on SQLite (Iceberg), drained with ``trigger(availableNow=True)``
into ``noop`` by

* ``rowtime``: ``format("rowtime")`` of the table, order reject;
* ``column``: the same reader with its driver planning from the time column read (the files
  given to the planner without their footers: how it planned before it read the statistics),
  for the before/after in one run;
* ``floor``: the cheapest Python source over the same data files: one task (as the table
  reader's micro-batch is one task) that opens each file with pyarrow and yields its record
  batches as they are, ``is_bound`` added;
* ``parquet``: Spark's own Parquet file stream source over the same files (the JVM's reader:
  no Python worker at all), printed beside.

Rounds are interleaved (:func:`benchutil.interleaved`); the ratio is rowtime / floor (and
column / floor beside it). Before the rounds, the driver's planning of the first micro-batch,
Spark-free, from the statistics and from the column.

Planning: a Delta table of ``--plan-versions`` commits (default 10,000, each a clock-only commit
of the sink's app transaction), read to its end once; then one more commit, and the time of the
micro-batch's planning (``latestOffset`` and ``partitions``, Spark-free) over it, median of 20.
The reader reads the new commit file only (the offset's anchor), so this does not grow with
the table's history.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from benchutil import drain, interleaved, spark_session, write_json
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from pyspark_rowtime.datasource.table_spark import TableStreamReader

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


def commits(rows: int, versions: int) -> Any:
    """The tables' commits: ``versions`` tables of ``rows // versions`` rows, in rowtime order."""
    rng = np.random.default_rng(0)
    per = rows // versions
    for v in range(versions):
        first = v * per
        ids = np.arange(first, first + per, dtype=np.int64)
        yield pa.table(
            {
                "id": ids,
                "v": rng.random(per),
                "s": pa.array(WORDS[rng.integers(0, len(WORDS), per)].tolist(), pa.string()),
                "rowtime": pa.array(START_US + ids * STEP_US, pa.int64()).view(SCHEMA[3].type),
            },
            schema=SCHEMA,
        )


def write_table(path: str, rows: int, versions: int) -> None:
    from deltalake import write_deltalake

    for data in commits(rows, versions):
        write_deltalake(path, data, mode="append")


#: The Iceberg catalog the benchmark writes to (a SQL catalog on SQLite below its folder),
#: configured through pyiceberg's environment variables before Spark starts its workers.
CATALOG = "rtbench"


def iceberg_env(root: str) -> str:
    """Configure catalog :data:`CATALOG` below ``root``; the table's location."""
    warehouse = os.path.join(root, "warehouse")
    os.makedirs(warehouse, exist_ok=True)
    os.environ[f"PYICEBERG_CATALOG__{CATALOG.upper()}__URI"] = f"sqlite:///{root}/catalog.db"
    os.environ[f"PYICEBERG_CATALOG__{CATALOG.upper()}__WAREHOUSE"] = f"file://{warehouse}"
    return f"iceberg://{CATALOG}/bench.events"


def write_iceberg(location: str, rows: int, versions: int) -> str:
    """The Iceberg table of ``location`` in ``versions`` appends; its data folder."""
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog(CATALOG)
    catalog.create_namespace_if_not_exists("bench")
    table = catalog.create_table("bench.events", schema=SCHEMA)
    for data in commits(rows, versions):
        table.append(data)
    return str(table.location()).removeprefix("file://") + "/data"


def data_files(path: str) -> list[str]:
    """The data files of the table at ``path`` (a Delta folder or an iceberg:// location)."""
    if path.startswith("iceberg://"):
        from pyspark_rowtime.streams.tables import iceberg_table

        table = iceberg_table(path)
        assert table is not None
        return sorted(t.file.file_path for t in table.scan().plan_files())
    from deltalake import DeltaTable

    return sorted(DeltaTable(path).file_uris())


class ColumnPlanned:
    """A table's files without their footers: the driver's planner then reads the time column,
    as it did before it read the statistics (the executors read as always)."""

    def __init__(self, files: Any) -> None:
        self.files = files

    def read(self, file: Any, columns: Any, schema: Any) -> pa.Table:
        return self.files.read(file, columns, schema)


class ColumnPlannedReader(TableStreamReader):
    @property
    def source(self) -> Any:
        if self._source is None:
            source = super().source
            source.log.files = ColumnPlanned(source.log.files)
        return super().source


class ColumnPlannedSource(DataSource):
    """``format("rowtime")`` of a table, planned from the time column (:class:`ColumnPlanned`)."""

    @classmethod
    def name(cls) -> str:
        return "rowtime_column_planned"

    def schema(self) -> str:
        return "id BIGINT, v DOUBLE, s STRING, rowtime TIMESTAMP, is_bound BOOLEAN"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        from pyspark_rowtime.datasource.table_source import parse_table_options
        from pyspark_rowtime.datasource.table_spark import table_stream_reader

        read = parse_table_options(dict(self.options))
        plain = table_stream_reader(read, read.output)
        return ColumnPlannedReader(plain.table, plain.arrow_schema)


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

    def latestOffset(self, start: Any = None, limit: Any = None) -> dict:
        return {"read": True}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [InputPartition(data_files(self.path))]

    def commit(self, end: dict) -> None:
        pass

    def read(self, partition: InputPartition) -> Any:
        for uri in partition.value:
            for b in pq.ParquetFile(uri.removeprefix("file://")).iter_batches(batch_size=1 << 20):
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
    batches = 0
    while (end := source.latest_offset(start, 1 << 24)) != start:  # 1000 versions a batch
        source.tasks(start, end, source.runs_for(start, end))
        source.commit(end)
        start, batches = end, batches + 1
    print(f"plan: the whole history ({batches} micro-batches) in {time.perf_counter() - t0:.2f} s")
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


def first_plan(path: str) -> dict[str, float]:
    """Seconds the driver takes to plan the first micro-batch of the table at ``path`` (the
    whole table under availableNow, Spark-free), from the statistics and from the column."""
    from pyspark_rowtime.datasource.table_source import TableSource, parse_table_options
    from pyspark_rowtime.datasource.table_spark import MICRO_BATCH_RECORDS, STEP_RECORDS

    out = {}
    for name in ("statistics", "column"):
        options = (
            {"path": path} if path.startswith("iceberg://") else {"path": path, "table": "delta"}
        )
        t0 = time.perf_counter()
        source = TableSource(parse_table_options(options))
        if name == "column":
            source.log.files = ColumnPlanned(source.log.files)
        start = source.initial_offset()
        source.prepare_available_now()
        end = source.latest_offset(start, STEP_RECORDS, MICRO_BATCH_RECORDS)
        source.tasks(start, end, source.runs_for(start, end))
        out[name] = time.perf_counter() - t0
    return out


def timed(runs: list[dict[str, Any]], case: str, name: str, query: Any) -> Any:
    """``query``, each run's seconds and load kept in ``runs`` (for the JSON)."""

    def run() -> tuple[float, int]:
        seconds, out = query()
        runs.append({"case": case, "query": name, "seconds": seconds, "rows_out": out,
                     "load": os.getloadavg()[0]})  # fmt: skip
        return seconds, out

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--versions", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--plan-versions", type=int, default=10_000)
    ap.add_argument("--formats", default="delta,iceberg")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", default=None, help="write the figures to this file")
    ap.add_argument("--skip-read", action="store_true", help="the planning part only")
    ap.add_argument("--skip-plan", action="store_true", help="the reading part only")
    args = ap.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="rowtime-bench-tables-")
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    doc: dict[str, Any] = {"when": when, "args": vars(args), "uptime_start": os.getloadavg()}
    try:
        if not args.skip_plan:
            ms = plan_bench(root, args.plan_versions)
            print(
                f"plan: one micro-batch over a new commit of a {args.plan_versions}-version "
                f"table: median {statistics.median(ms):.1f} ms (spread {min(ms):.1f}-"
                f"{max(ms):.1f}, 20 runs)",
                flush=True,
            )
            doc["plan_ms"] = ms
        if args.skip_read:
            return
        formats = args.formats.split(",")
        paths = {}
        if "delta" in formats:
            paths["delta"] = os.path.join(root, "table")
            t0 = time.perf_counter()
            write_table(paths["delta"], args.rows, args.versions)
            print(f"read: Delta, {args.rows:,} rows in {args.versions} commits written in "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
        folders = dict(paths)
        if "iceberg" in formats:
            paths["iceberg"] = iceberg_env(os.path.join(root, "iceberg"))
            t0 = time.perf_counter()
            folders["iceberg"] = write_iceberg(paths["iceberg"], args.rows, args.versions)
            print(f"read: Iceberg, {args.rows:,} rows in {args.versions} appends written in "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
        doc["first_plan_s"] = {}
        for kind, path in paths.items():
            for _ in range(2):  # the first pays the imports
                took = first_plan(path)
            doc["first_plan_s"][kind] = took
            print(f"plan: the first micro-batch of the {kind} table ({args.rows:,} rows), driver "
                  f"only: {took['statistics']:.3f} s from the statistics, {took['column']:.3f} s "
                  "from the column", flush=True)  # fmt: skip
        spark = spark_session("bench-table-source")
        spark.dataSource.register(TableFloorSource)
        spark.dataSource.register(ColumnPlannedSource)
        from pyspark.sql.types import StructType

        schema = StructType.fromDDL("id BIGINT, v DOUBLE, s STRING, rowtime TIMESTAMP")
        runs: list[dict[str, Any]] = []
        cases = {}
        for kind, path in paths.items():
            options = {"table": "delta"} if kind == "delta" else {}

            def ours(path: str = path, options: dict = options) -> tuple[float, int]:
                return drain(spark.readStream.format("rowtime").options(**options).load(path), root)

            def column(path: str = path, options: dict = options) -> tuple[float, int]:
                df = spark.readStream.format("rowtime_column_planned").options(**options)
                return drain(df.load(path), root)

            def floor(path: str = path) -> tuple[float, int]:
                return drain(spark.readStream.format("table_floor").load(path), root)

            def parquet(folder: str = folders[kind]) -> tuple[float, int]:
                return drain(spark.readStream.schema(schema).parquet(folder), root)

            queries = {"rowtime": ours, "column": column, "floor": floor, "parquet": parquet}
            cases[kind] = {n: timed(runs, kind, n, q) for n, q in queries.items()}
        rows_in = {kind: args.rows for kind in paths}
        doc["ratio_rowtime_floor"] = interleaved(
            cases, args.rounds, rows_in, base="floor", ours="rowtime"
        )
        doc["runs"] = runs
        for kind in paths:
            per_round = _round_ratios(runs, kind, "column", args.rounds)
            print(f"ratio column/floor, {kind}: median {statistics.median(per_round):.2f} (spread "
                  f"{min(per_round):.2f}-{max(per_round):.2f}; rounds "
                  f"{', '.join(f'{x:.2f}' for x in per_round)})")  # fmt: skip
            doc.setdefault("ratio_column_floor", {})[kind] = statistics.median(per_round)
            ours_rounds = _round_ratios(runs, kind, "rowtime", args.rounds)
            each = ", ".join(f"{x:.2f}" for x in ours_rounds)
            print(f"ratio rowtime/floor, {kind}, each round: {each}")
        spark.stop()
        doc["uptime_end"] = os.getloadavg()
    finally:
        if args.json:
            print(
                "wrote",
                write_json(os.path.dirname(args.json) or ".", os.path.basename(args.json), doc),
            )
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


def _round_ratios(runs: list[dict[str, Any]], case: str, name: str, rounds: int) -> list[float]:
    """``name`` / floor per measured round (the warm-up left out)."""
    mine = [r["seconds"] for r in runs if r["case"] == case and r["query"] == name][1:]
    floor = [r["seconds"] for r in runs if r["case"] == case and r["query"] == "floor"][1:]
    return [f / m for m, f in zip(mine, floor, strict=True)][:rounds]


if __name__ == "__main__":
    main()

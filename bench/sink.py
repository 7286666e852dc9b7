"""Benchmark: this sink (both targets) beside Spark's own Parquet file sink, over the same rows.

One Spark session; one source for every case: a rowtime stream of 20 million rows (2
partitions; columns id BIGINT, v DOUBLE, s STRING of a few characters; bounds every million
rows and the end of stream), read with ``spark.readStream.format("rowtime")`` and drained with
``trigger(availableNow=True)`` into:

* ``parquet``: Spark's file sink, ``writeStream.format("parquet")`` (snappy, the reference);
* ``stream``: ``writeStream.format("rowtime")`` into a rowtime stream (a partition per source
  partition, each in rowtime order, bounds passed on; the executors write the segments and the
  commit links them);
* ``stream-1p``: the same with ``.option("partitions", "1")``: one ordered partition for the
  rows of every write task, which the commit merges on the driver into runs it links (what a
  stateful query's results get by default, as one stream of windows; ``sink.merge``);
  ``stream`` links each task's runs into a partition of its own, also with Spark's Parquet
  source, whose clock is the watermark;
* ``files``: ``writeStream.format("rowtime").option("target", "parquet")``: snappy Parquet
  files in hourly partitions, ``_COMPLETE`` markers and the clock;
* ``delta``: ``.option("target", "delta")``: a Delta table (delta-rs commits), hourly
  partitions, the clock an app transaction;
* ``iceberg``: ``.option("target", "iceberg")`` into ``iceberg://bench/...``: an Iceberg table
  of an embedded SQL catalog (SQLite) whose warehouse is a local folder, partitioned by
  ``hour(rowtime)``, the clock a table property.

Every case reads the same source, so the ratio is the price of the sink alone. For context
the bench also runs ``python-noop``, a Python data source sink whose ``write()`` only drains its
Arrow batches: what any Python sink pays for Spark handing rows to Python, before doing
anything with them. A small warm-up query runs first (JIT, Python workers); then the cases run
interleaved, ``--repeat`` rounds (so a busy moment on the machine hits every case alike); each
case's median counts, its fastest and slowest run beside it, and every ratio is of medians.
Targets: ``stream`` and ``files`` >= 0.6 of Spark's ``parquet``; ``delta`` and ``iceberg`` >=
0.8 of ``files``, the Parquet target (issue 31); ``stream``, ``stream-1p`` and ``files`` >= 0.9
of ``floor`` (issues 35 and 54), each printed with every round's ratio.

Run: ``./dev bench sink [--rows N] [--repeat R] [--dir PATH] [--cases a,b,...]
[--out FILE.json]``. The summed micro-batch durations (``addBatch`` = read + write() on
executors + commit() on the driver) are printed beside the rates.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import tempfile
import time
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
from benchutil import spark_session, write_json
from pyspark.sql import DataFrame
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

import pyspark_rowtime as pr

PARTITIONS = 2
CHUNK = 1_000_000
START_US = 1_700_000_000_000_000
STEP_US = 100  # ~10,000 rows per second of event time per partition
WORDS = np.array(["ORCL", "MSFT", "IBM", "SAP", "AAPL", "GOOG", "AMZN", "META"])
TARGET_RATIO = 0.6
#: The stream and Parquet targets, of the durable floor (issue 35's bar).
FLOOR_RATIO = 0.9
#: The table targets, of the Parquet target ("files"): issue 31's bar.
TABLE_RATIO = 0.8
#: The embedded Iceberg catalog the bench writes to, configured as pyiceberg users do.
ICEBERG_CATALOG = "bench"


class _Drained(WriterCommitMessage):
    pass


class _DrainWriter(DataSourceStreamArrowWriter):
    def write(self, iterator: Any) -> _Drained:
        for _ in iterator:
            pass
        return _Drained()

    def commit(self, messages: Any, batchId: int) -> None:
        pass


class _Files(WriterCommitMessage):
    def __init__(self, files: list[str]) -> None:
        self.files = files


class _DurableWriter(DataSourceStreamArrowWriter):
    """Each task writes its Arrow batches to one IPC file and fsyncs it; the commit lists the
    batch's files in a manifest, written aside, fsynced and renamed into place."""

    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, iterator: Any) -> _Files:
        os.makedirs(self.path, exist_ok=True)
        name = f"part-{uuid.uuid4().hex}.arrow"
        with open(os.path.join(self.path, name), "wb") as f:
            writer = None
            for batch in iterator:
                if writer is None:
                    writer = pa.ipc.new_file(f, batch.schema)
                writer.write_batch(batch)
            if writer is not None:
                writer.close()
            f.flush()
            os.fsync(f.fileno())
        return _Files([name])

    def commit(self, messages: Any, batchId: int) -> None:
        files = [f for m in messages if m is not None for f in m.files]
        manifest = os.path.join(self.path, f"_manifest-{batchId}")
        with open(manifest + ".tmp", "w") as f:
            f.write("\n".join(files))
            f.flush()
            os.fsync(f.fileno())
        os.rename(manifest + ".tmp", manifest)


class DurableFloor(DataSource):
    """The cheapest durable Python sink (issue 35's floor for this sink): what a Python sink
    that keeps its rows and commits a batch atomically cannot do without."""

    @classmethod
    def name(cls) -> str:
        return "durable-floor"

    def streamWriter(self, schema: Any, overwrite: bool) -> _DurableWriter:
        return _DurableWriter(self.options["path"])


class PythonNoop(DataSource):
    """A Python sink that only drains its input: the floor for any Python data source sink."""

    @classmethod
    def name(cls) -> str:
        return "python-noop"

    def streamWriter(self, schema: Any, overwrite: bool) -> _DrainWriter:
        return _DrainWriter()


def chunk(partition: int, first: int, n: int, rng: np.random.Generator) -> pa.Table:
    ids = np.arange(first, first + n, dtype=np.int64) * PARTITIONS + partition
    words = pa.DictionaryArray.from_arrays(
        pa.array(rng.integers(0, len(WORDS), n).astype(np.int32)), pa.array(WORDS)
    ).cast(pa.string())
    t = START_US + np.arange(first, first + n, dtype=np.int64) * STEP_US
    return pa.table(
        {
            "id": ids,
            "v": rng.random(n),
            "s": words,
            "rowtime": pa.array(t, type=pa.int64()).view(pa.timestamp("us", tz="UTC")),
        }
    )


def write_source(path: str, rows: int) -> None:
    pr.create_stream(path, "id BIGINT, v DOUBLE, s STRING", partitions=PARTITIONS)
    per_partition = rows // PARTITIONS
    for p in range(PARTITIONS):
        rng = np.random.default_rng(p)
        with pr.open_writer(path, p) as w:
            for first in range(0, per_partition, CHUNK):
                n = min(CHUNK, per_partition - first)
                table = chunk(p, first, n, rng)
                w.insert_arrow(table, rowtime_column="rowtime")
                w.set_rowtime_bound(table.column("rowtime")[-1].as_py())
            w.end_stream()


def write_parquet_source(path: str, rows: int) -> None:
    """The same rows as :func:`write_source`, as Parquet files for Spark's own file stream
    source (``--source parquet``): no Python source in front of the sinks."""
    import pyarrow.parquet as pq

    os.makedirs(path, exist_ok=True)
    per_partition = rows // PARTITIONS
    for p in range(PARTITIONS):
        rng = np.random.default_rng(p)
        for first in range(0, per_partition, CHUNK):
            n = min(CHUNK, per_partition - first)
            pq.write_table(chunk(p, first, n, rng), os.path.join(path, f"p{p}-{first}.parquet"))


def remove(path: str) -> None:
    """Remove a case's output: a folder, or an Iceberg table with its files."""
    if not path.startswith("iceberg://"):
        shutil.rmtree(path, ignore_errors=True)
        return
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog(ICEBERG_CATALOG)
    name = path.split("/", 3)[3]
    location = catalog.load_table(name).location()
    catalog.drop_table(name)
    shutil.rmtree(location.removeprefix("file://"), ignore_errors=True)


def tree_cpu_s() -> float:
    """CPU seconds (user + system) of this process and all below it: Spark's JVM, its Python
    daemons and workers (reused across queries), and children they reaped. Less moved by other
    jobs on the machine than wall time: what a case costs, where wall time is what it takes."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(name)] = int(fields[1])
        ticks[int(name)] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    mine = {os.getpid()}
    grew = True
    while grew:
        more = {pid for pid, pp in parent.items() if pp in mine} - mine
        grew = bool(more)
        mine |= more
    return sum(ticks[p] for p in mine if p in ticks) / os.sysconf("SC_CLK_TCK")


def drain(
    df: DataFrame, fmt: str, path: str, root: str, **options: str
) -> tuple[float, int, float]:
    """Seconds to drain ``df`` into the sink, the summed addBatch milliseconds, and the CPU
    seconds it took (:func:`tree_cpu_s`)."""
    checkpoint = os.path.join(root, "checkpoints", uuid.uuid4().hex)
    writer = df.writeStream.format(fmt).trigger(availableNow=True)
    for key, value in {"checkpointLocation": checkpoint, **options}.items():
        writer = writer.option(key, value)
    cpu0 = tree_cpu_s()
    t0 = time.perf_counter()
    query = writer.start(path)
    query.awaitTermination()
    seconds = time.perf_counter() - t0
    cpu = tree_cpu_s() - cpu0
    add_batch = sum(p["durationMs"].get("addBatch", 0) for p in query.recentProgress)
    shutil.rmtree(checkpoint, ignore_errors=True)
    return seconds, add_batch, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write the data (default: a temp dir)")
    ap.add_argument(
        "--cases",
        default="parquet,python-noop,stream,files,delta,iceberg",
        help="which cases, comma-separated (parquet and files are the references)",
    )
    ap.add_argument("--out", default=None, help="write the runs and medians to this JSON file")
    ap.add_argument(
        "--source",
        choices=("rowtime", "parquet"),
        default="rowtime",
        help="what feeds every sink: this reader, or Spark's Parquet file stream source (so "
        "that no Python source hides the sinks' costs; then the case floor is the bar)",
    )
    args = ap.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="bench-sink-")
    # The Iceberg catalog, set before Spark starts (its Python workers inherit it).
    os.makedirs(os.path.join(base, "warehouse"), exist_ok=True)
    os.environ[f"PYICEBERG_CATALOG__{ICEBERG_CATALOG.upper()}__URI"] = (
        f"sqlite:///{base}/catalog.db"
    )
    os.environ[f"PYICEBERG_CATALOG__{ICEBERG_CATALOG.upper()}__WAREHOUSE"] = (
        f"file://{base}/warehouse"
    )
    spark = spark_session("bench-sink")
    spark.dataSource.register(PythonNoop)
    spark.dataSource.register(DurableFloor)
    every: dict[str, tuple[str, dict[str, str]]] = {
        "parquet": ("parquet", {}),
        "python-noop": ("python-noop", {}),
        "floor": ("durable-floor", {}),
        "stream": ("rowtime", {}),
        "stream-1p": ("rowtime", {"partitions": "1"}),
        "files": ("rowtime", {"target": "parquet"}),
        "delta": ("rowtime", {"target": "delta"}),
        "iceberg": ("rowtime", {"target": "iceberg"}),
    }
    cases = {name: every[name] for name in args.cases.split(",")}

    def out_of(name: str, run: str) -> str:
        if name == "iceberg":
            return f"iceberg://{ICEBERG_CATALOG}/bench.t_{run.replace('-', '_')}"
        return os.path.join(base, f"out-{name}-{run}")

    try:
        t0 = time.perf_counter()
        source = os.path.join(base, "source")
        warm = os.path.join(base, "warm")
        write = write_parquet_source if args.source == "parquet" else write_source
        write(source, args.rows)
        write(warm, 200_000)
        print(
            f"rows: {args.rows:,} in {PARTITIONS} partitions (source written in "
            f"{time.perf_counter() - t0:.0f} s), read by the {args.source} source; "
            f"Spark {spark.version}, local[2]"
        )

        def read(path: str) -> Any:
            if args.source == "parquet":
                schema = "id BIGINT, v DOUBLE, s STRING, rowtime TIMESTAMP"
                return spark.readStream.schema(schema).parquet(path)
            return spark.readStream.format("rowtime").load(path)

        for name, (fmt, options) in cases.items():  # warm up every sink once, small
            out = out_of(name, "warm")
            drain(read(warm), fmt, out, base, **options)
            remove(out)

        load = [os.getloadavg()[0]]
        runs: dict[str, list[tuple[float, int, float]]] = {name: [] for name in cases}
        for i in range(args.repeat):
            for name, (fmt, options) in cases.items():
                out = out_of(name, str(i))
                runs[name].append(drain(read(source), fmt, out, base, **options))
                remove(out)
                load.append(os.getloadavg()[0])
        median = {n: statistics.median(s for s, _, _ in r) for n, r in runs.items()}
        cpu = {n: statistics.median(c for _, _, c in r) for n, r in runs.items()}
        print(
            f"{'sink':<12}{'median s':>9}{'min-max s':>13}{'M rows/s':>10}{'of parquet':>11}"
            f"{'of files':>9}  target  addBatch ms (median)  CPU s (median, of files)"
        )
        summary = {}
        for name, results in runs.items():
            seconds = median[name]
            times = [s for s, _, _ in results]
            of_spark = median["parquet"] / seconds if "parquet" in median else None
            of_files = median["files"] / seconds if "files" in median else None
            verdict = ""
            of_floor = median["floor"] / seconds if "floor" in median else None
            if name in ("stream", "files") and of_spark is not None:
                verdict = f">={TARGET_RATIO} of parquet " + (
                    "ok" if of_spark >= TARGET_RATIO else "MISS"
                )
            paired = None
            if name in ("stream", "stream-1p", "files") and of_floor is not None:
                # Each round's ratio, the floor's run beside this case's: a slow spell of the
                # machine that lasts a round moves both (docs/benchmarks.md, "How to read a
                # figure").
                paired = [
                    f / s for (f, _, _), (s, _, _) in zip(runs["floor"], results, strict=True)
                ]
                rounds = ", ".join(f"{r:.2f}" for r in paired)
                verdict += (
                    f"{'; ' if verdict else ''}of floor {of_floor:.2f} (rounds {rounds}), "
                    f"target >= {FLOOR_RATIO}: " + ("ok" if of_floor >= FLOOR_RATIO else "MISS")
                )
            if name in ("delta", "iceberg") and of_files is not None:
                verdict = f">={TABLE_RATIO} of files " + (
                    "ok" if of_files >= TABLE_RATIO else "MISS"
                )
            add_batch = statistics.median(a for _, a, _ in results)
            cpu_of_files = cpu["files"] / cpu[name] if "files" in cpu else None
            print(
                f"{name:<12}{seconds:9.2f}{min(times):6.2f}-{max(times):<6.2f}"
                f"{args.rows / seconds / 1e6:10.2f}"
                f"{'' if of_spark is None else f'{of_spark:.2f}':>11}"
                f"{'' if of_files is None else f'{of_files:.2f}':>9}  {verdict}  {add_batch:.0f}"
                f"  {cpu[name]:.1f}{'' if cpu_of_files is None else f' ({cpu_of_files:.2f})'}"
            )
            summary[name] = {
                "seconds": {"median": seconds, "min": min(times), "max": max(times)},
                "runs_s": times,
                "add_batch_ms": [a for _, a, _ in results],
                "cpu_s": [c for _, _, c in results],
                "cpu_of_files": cpu_of_files,
                "of_parquet": of_spark,
                "of_files": of_files,
                "of_floor": of_floor,
                "of_floor_rounds": paired,
            }
        if args.out:
            doc = {
                "meta": {
                    "rows": args.rows,
                    "partitions": PARTITIONS,
                    "rounds": args.repeat,
                    "master": "local[2]",
                    "source": args.source,
                    "cpus": os.cpu_count(),
                    "load_min": min(load),
                    "load_max": max(load),
                    "spark": spark.version,
                    "when": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                },
                "summary": summary,
            }
            path = write_json(
                os.path.dirname(os.path.abspath(args.out)), os.path.basename(args.out), doc
            )
            print(f"written: {path}")
    finally:
        spark.stop()
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Benchmark: the embedded log's writer and reader, beside pyarrow doing the same I/O itself.

* ``insert()``: single rows (dicts) through the adapter API, flushed at the end;
* ``insert_arrow()``: one big table, flushed (fsync'd), beside pyarrow writing the same table
  as an Arrow IPC file (with and without fsync: the log must fsync, so that is the fair limit);
* read-back: ``Stream.read`` of every column and of only the system columns (what the Spark
  driver reads), beside pyarrow reading the same segment files through a memory map.

* Redis Streams (the same rows): ``insert_arrow()`` into a ``redis://`` stream and read-back
  beside the embedded log, and the two payload encodings the backend could use (one Arrow IPC
  stream per entry of up to 64K rows, or one entry per row with a field per column): rows/s
  written and read, and bytes in Redis (``MEMORY USAGE``). A local ``redis-server`` is started
  on a free loopback port unless ``--redis URL`` names one.

Run: ./dev bench log [--rows N] [--insert-rows N] [--redis-rows N] [--redis URL] [--dir PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from benchutil import best_of

from pyspark_rowtime.api import create_stream, open_writer
from pyspark_rowtime.streams.columns import LOG_ARRIVAL_US, LOG_IS_BOUND, LOG_ROWTIME_US
from pyspark_rowtime.streams.local.log import open_stream
from pyspark_rowtime.streams.segments import SEGMENT_RE

SCHEMA = "id BIGINT, price DOUBLE, qty INT, name STRING"


def make_table(n: int) -> pa.Table:
    rng = np.random.default_rng(7)
    names = np.array([f"name-{i:03d}" for i in range(1000)], dtype=object)
    return pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "price": rng.random(n) * 100,
            "qty": rng.integers(0, 1000, n, dtype=np.int32),
            "name": pa.array(names[rng.integers(0, 1000, n)], pa.string()),
        }
    )


def pyarrow_write(table: pa.Table, path: str, fsync: bool) -> None:
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    if fsync:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def rate(rows: int, seconds: float) -> str:
    return f"{rows / seconds / 1e6:8.2f} M rows/s  ({seconds * 1e3:8.1f} ms)"


def bench_insert(folder: str, n: int) -> None:
    loc = os.path.join(folder, "insert")
    create_stream(loc, SCHEMA)
    rows = [
        {"id": i, "price": i * 0.5, "qty": i % 1000, "name": f"name-{i % 1000:03d}"}
        for i in range(n)
    ]
    with open_writer(loc) as w:
        w.insert(rows[0])  # first use: pyarrow loads its pandas shim, once per process
        w.flush()
        insert = w.insert
        t0 = time.perf_counter()
        for row in rows:
            insert(row)
        w.flush()
        seconds = time.perf_counter() - t0
    print(f"insert(), {n:,} single rows of 4 columns, flushed:  {n / seconds / 1e3:8.0f} k rows/s"
          f"  ({seconds:.2f} s)")  # fmt: skip


def bench_arrow(folder: str, table: pa.Table, repeat: int) -> str:
    n = table.num_rows
    plain = os.path.join(folder, "plain.arrow")
    pa_s = best_of(lambda: pyarrow_write(table, plain, fsync=False), repeat)
    pa_sync_s = best_of(lambda: pyarrow_write(table, plain, fsync=True), repeat)
    plain_mb = os.path.getsize(plain) / 1e6
    os.unlink(plain)

    def ours() -> float:
        """Seconds for insert_arrow() + flush() alone (creating the stream is not timed)."""
        loc = os.path.join(folder, "arrow")
        shutil.rmtree(loc, ignore_errors=True)
        create_stream(loc, SCHEMA)
        with open_writer(loc) as w:
            t0 = time.perf_counter()
            w.insert_arrow(table)
            w.flush()
            return time.perf_counter() - t0

    ours_s = min(ours() for _ in range(repeat))
    part = os.path.join(folder, "arrow", "partition-0000")
    ours_mb = sum(os.path.getsize(os.path.join(part, f)) for f in os.listdir(part)) / 1e6
    mb = table.nbytes / 1e6
    print(f"\ninsert_arrow(), {n:,} rows, {mb:.0f} MB of payload, one flush (fsync'd):")
    print(f"  pyarrow IPC file write            {rate(n, pa_s)}")
    print(f"  pyarrow IPC file write + fsync    {rate(n, pa_sync_s)}")
    print(f"  insert_arrow() + flush()          {rate(n, ours_s)}")
    print(f"  ratio vs pyarrow + fsync          {pa_sync_s / ours_s:8.2f}")
    print(f"  ratio vs pyarrow without fsync    {pa_s / ours_s:8.2f}")
    print(f"  bytes written: pyarrow {plain_mb:.0f} MB, the log {ours_mb:.0f} MB (payload is "
          f"{plain_mb / ours_mb:.2f} of it, the rest the system columns)")  # fmt: skip
    return os.path.join(folder, "arrow")


def many_segments(folder: str, table: pa.Table, segments: int) -> str:
    """The same rows as ``segments`` flushes: reads then cross many files."""
    loc = os.path.join(folder, "many")
    create_stream(loc, SCHEMA)
    step = -(-table.num_rows // segments)
    with open_writer(loc, flush_records=table.num_rows + 1) as w:
        for start in range(0, table.num_rows, step):
            w.insert_arrow(table.slice(start, step))
            w.flush()
    return loc


def bench_read(loc: str, repeat: int) -> None:
    stream = open_stream(loc)
    n = stream.end_offset(0)
    part = stream.partition_dir(0)
    files = sorted(os.path.join(part, f) for f in os.listdir(part) if SEGMENT_RE.match(f))
    system = [LOG_ARRIVAL_US, LOG_ROWTIME_US, LOG_IS_BOUND]

    def pyarrow_read(columns: list[str] | None) -> pa.Table:
        tables = []
        for path in files:
            with pa.memory_map(path) as source:
                t = pa.ipc.open_file(source).read_all()
            tables.append(t if columns is None else t.select(columns))
        return pa.concat_tables(tables)

    def ours(columns: list[str] | None) -> pa.Table:
        fresh = open_stream(loc)  # a new reader: metadata, listing, memory maps, all of it
        return fresh.read(0, 0, fresh.end_offset(0), columns)

    def ours_again(columns: list[str] | None) -> pa.Table:
        return stream.read(0, 0, stream.end_offset(0), columns)  # a reader that stays open

    def touch(table: pa.Table) -> int:
        # Sum every fixed-width column so the bytes are really read from the mapped pages.
        total = 0
        for col in table.columns:
            if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
                total += int(np.nansum(col.to_numpy()))
        return total

    print(f"\nread-back of {n:,} records in {len(files)} segment(s):")
    for label, columns in (("all columns", None), ("system columns only", system)):
        assert ours(columns).num_rows == pyarrow_read(columns).num_rows == n
        pa_s = best_of(lambda c=columns: pyarrow_read(c), repeat * 3)
        ours_s = best_of(lambda c=columns: ours(c), repeat * 3)
        again_s = best_of(lambda c=columns: ours_again(c), repeat * 3)
        print(f"  {label}:")
        print(f"    pyarrow memory-mapped read      {rate(n, pa_s)}")
        print(f"    open_stream + Stream.read       {rate(n, ours_s)}")
        print(f"    ratio                           {pa_s / ours_s:8.2f}")
        print(f"    Stream.read, stream kept open   {rate(n, again_s)}")
        print(f"    ratio                           {pa_s / again_s:8.2f}")
        pa_s = best_of(lambda c=columns: touch(pyarrow_read(c)), repeat)
        ours_s = best_of(lambda c=columns: touch(ours(c)), repeat)
        print(f"    pyarrow read + sum numbers      {rate(n, pa_s)}")
        print(f"    Stream.read + sum numbers       {rate(n, ours_s)}")
        print(f"    ratio                           {pa_s / ours_s:8.2f}")


def bench_redis(folder: str, table: pa.Table, repeat: int, url: str | None) -> None:
    import sys

    server = None
    if url is None:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
        from redis_server import RedisServer

        server = RedisServer(Path(folder) / "redis").start()
        url = server.url("bench")
    try:
        _bench_redis(folder, table, repeat, url)
    finally:
        if server is not None:
            server.close()


def _bench_redis(folder: str, table: pa.Table, repeat: int, base: str) -> None:
    from pyspark_rowtime.streams.redis import open_redis_stream
    from pyspark_rowtime.streams.redis.connection import connection
    from pyspark_rowtime.streams.redis.location import parse_location

    n = table.num_rows
    client = connection(parse_location(base + "x")).client

    def fresh(name: str) -> str:
        for key in client.scan_iter(f"{{rowtime:{name}}}:*"):
            client.delete(key)
        return base[: base.rindex("/") + 1] + name

    def insert(loc: str) -> float:
        create_stream(loc, SCHEMA)
        with open_writer(loc) as w:
            t0 = time.perf_counter()
            w.insert_arrow(table)
            w.flush()
            return time.perf_counter() - t0

    log_loc = os.path.join(folder, "redis-ref")
    shutil.rmtree(log_loc, ignore_errors=True)
    log_s = insert(log_loc)
    redis_s = min(insert(fresh(f"arrow{i}")) for i in range(repeat))
    loc = base[: base.rindex("/") + 1] + f"arrow{repeat - 1}"
    used = sum(
        client.memory_usage(k, samples=0) or 0
        for k in client.scan_iter(f"{{rowtime:arrow{repeat - 1}}}:*")
    )
    print(f"\nRedis Streams, {n:,} rows of 4 columns ({table.nbytes / 1e6:.0f} MB of payload):")
    print(f"  insert_arrow() + flush(), embedded log   {rate(n, log_s)}")
    print(f"  insert_arrow() + flush(), Redis          {rate(n, redis_s)}")
    print(f"  bytes in Redis: {used / 1e6:.0f} MB ({used / n:.1f} per row)")

    def read_log() -> pa.Table:
        s = open_stream(log_loc)
        return s.read(0, 0, s.end_offset(0))

    def read_redis() -> pa.Table:
        s = open_redis_stream(loc)
        return s.read(0, 0, s.end_offset(0))

    assert read_redis().num_rows == read_log().num_rows == n
    assert read_redis().column("id").equals(read_log().column("id"))
    log_r = best_of(read_log, repeat)
    redis_r = best_of(read_redis, repeat)
    print(f"  read-back, fresh reader, embedded log    {rate(n, log_r)}")
    print(f"  read-back, fresh reader, Redis           {rate(n, redis_r)}")
    print(f"  ratio Redis / embedded log               {log_r / redis_r:8.2f}")
    shutil.rmtree(log_loc, ignore_errors=True)

    # The other encoding: one entry per row, a field per column (what XADD clients write).
    m = min(n, 200_000)
    rows = table.slice(0, m).to_pylist()
    key = "bench-fields-per-row"
    client.delete(key)
    t0 = time.perf_counter()
    for lo in range(0, m, 10_000):
        pipe = client.pipeline(transaction=True)
        for row in rows[lo : lo + 10_000]:
            pipe.xadd(key, {k: str(v) for k, v in row.items()})
        pipe.execute()
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    got: list[dict[bytes, bytes]] = []
    last = "-"
    while True:
        batch = client.xrange(key, last if last == "-" else f"({last}", "+", count=10_000)
        if not batch:
            break
        got += [f for _, f in batch]
        last = batch[-1][0].decode()
    decoded = pa.table(
        {
            "id": pa.array([int(f[b"id"]) for f in got], pa.int64()),
            "price": pa.array([float(f[b"price"]) for f in got]),
            "qty": pa.array([int(f[b"qty"]) for f in got], pa.int32()),
            "name": pa.array([f[b"name"].decode() for f in got]),
        }
    )
    read_s = time.perf_counter() - t0
    assert decoded.num_rows == m
    per_row = (client.memory_usage(key, samples=0) or 0) / m
    client.delete(key)
    print(f"  fields per row ({m:,} rows): write     {rate(m, write_s)}")
    print(f"  fields per row ({m:,} rows): read      {rate(m, read_s)}")
    print(f"  fields per row: {per_row:.1f} bytes per row in Redis")
    for name in [f"arrow{i}" for i in range(repeat)]:
        for k in client.scan_iter(f"{{rowtime:{name}}}:*"):
            client.delete(k)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000, help="rows for the Arrow paths")
    ap.add_argument("--insert-rows", type=int, default=2_000_000, help="rows for insert()")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--segments", type=int, default=100, help="segments for the second read")
    ap.add_argument("--dir", help="where to write (default: a temporary folder)")
    ap.add_argument("--redis-rows", type=int, default=2_000_000, help="rows for Redis (0: skip)")
    ap.add_argument("--redis", help="a redis:// location to use (default: start redis-server)")
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="rowtime-bench-", dir=args.dir)
    try:
        print(f"pyarrow {pa.__version__}, numpy {np.__version__}, {os.cpu_count()} CPUs")
        print(f"writing in {folder}")
        bench_insert(folder, args.insert_rows)
        table = make_table(args.rows)
        loc = bench_arrow(folder, table, args.repeat)
        bench_read(loc, args.repeat)
        shutil.rmtree(loc)
        bench_read(many_segments(folder, table, args.segments), args.repeat)
        if args.redis_rows:
            bench_redis(folder, make_table(args.redis_rows), args.repeat, args.redis)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()

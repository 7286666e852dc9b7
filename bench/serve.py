"""Benchmark: rows over Arrow Flight into ``rowtime serve`` beside the in-process writer.

The same rows (``--rows``, default 10 M, in messages of ``--message-rows``, default 64 Ki) go
into a fresh embedded-log stream each run, three ways, in interleaved rounds
(:func:`benchutil.interleaved`):

* ``inproc``: ``open_writer`` in this process, ``insert_arrow(batch)`` then ``flush()`` per
  message (one durable commit a message: what the server does for each);
* ``flight``: pyarrow's Flight client over loopback to a ``rowtime serve`` process, one DoPut,
  each message a batch with ``{"writer", "seq"}``, at most ``--window`` unacknowledged;
* ``adbc``: ADBC's Flight SQL driver (Arrow's Go build), one ``adbc_ingest`` per message with
  the ``x-rowtime-*`` headers (skipped if the driver is not installed).

The ratio printed is flight / inproc (issue 52 asks for >= 0.7).

Run: ./dev bench serve [--rows N] [--message-rows N] [--rounds N] [--window N] [--dir PATH]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
from benchutil import interleaved

from pyspark_rowtime.api import create_stream, open_writer

SCHEMA = "id BIGINT, price DOUBLE, qty INT, name STRING"
T0 = 1_700_000_000_000_000


def make_batches(rows: int, per_message: int) -> list[pa.RecordBatch]:
    rng = np.random.default_rng(7)
    names = np.array([f"name-{i:03d}" for i in range(1000)], dtype=object)
    table = pa.table(
        {
            "id": np.arange(rows, dtype=np.int64),
            "price": rng.random(rows) * 100,
            "qty": rng.integers(0, 1000, rows, dtype=np.int32),
            "name": pa.array(names[rng.integers(0, 1000, rows)], pa.string()),
            "rowtime": pa.array(T0 + np.arange(rows, dtype=np.int64), pa.timestamp("us", "UTC")),
        }
    )
    return [b for b in table.combine_chunks().to_batches(max_chunksize=per_message)]


class Server:
    """``rowtime serve --root ROOT`` on a free loopback port, for the whole benchmark."""

    def __init__(self, root: str) -> None:
        cmd = [sys.executable, "-m", "pyspark_rowtime.cli", "serve", "--root", root]
        self.proc = subprocess.Popen([*cmd, "--port", "0"], stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()
        if "listening on" not in line:
            raise SystemExit(f"rowtime serve did not start: {line}{self.proc.stderr.read()}")
        self.url = line.split("listening on ", 1)[1].split()[0]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--message-rows", type=int, default=1 << 16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=int, default=8, help="unacknowledged messages at most")
    ap.add_argument("--dir", help="where the streams go (default: a temporary folder)")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="rowtime-bench-serve-", dir=args.dir)
    batches = make_batches(args.rows, args.message_rows)
    names = itertools.count()
    print(
        f"{args.rows:,} rows in {len(batches)} messages of {args.message_rows:,} rows "
        f"({sum(b.nbytes for b in batches) / 1e6:.0f} MB), window {args.window}; {root}"
    )

    def fresh() -> tuple[str, str]:
        name = f"s{next(names)}"
        path = os.path.join(root, name)
        create_stream(path, SCHEMA, 1)
        return name, path

    def done(path: str, seconds: float) -> tuple[float, int]:
        shutil.rmtree(path)  # the disk is the same for every run: no stream piles up
        return seconds, -1

    def inproc() -> tuple[float, int]:
        _, path = fresh()
        t0 = time.perf_counter()
        with open_writer(path, 0) as w:
            for b in batches:
                w.insert_arrow(b, rowtime_column="rowtime")
                w.flush()
        return done(path, time.perf_counter() - t0)

    server = Server(root)

    def flight() -> tuple[float, int]:
        name, path = fresh()
        t0 = time.perf_counter()
        client = fl.connect(server.url)
        w, r = client.do_put(fl.FlightDescriptor.for_path(name), batches[0].schema)
        acked = 0
        for seq, b in enumerate(batches):
            w.write_with_metadata(b, json.dumps({"writer": "bench", "seq": seq}).encode())
            if seq + 1 - acked >= args.window:
                r.read()
                acked += 1
        while acked < len(batches):
            r.read()
            acked += 1
        w.close()
        client.close()
        return done(path, time.perf_counter() - t0)

    queries: dict[str, Callable[[], tuple[float, int]]] = {"inproc": inproc, "flight": flight}
    try:
        from adbc_driver_flightsql import dbapi
    except ImportError:
        print("adbc: adbc-driver-flightsql is not installed; its column is left out")
    else:
        tables = [pa.Table.from_batches([b]) for b in batches]
        header = "adbc.flight.sql.rpc.call_header.x-rowtime-"

        def adbc() -> tuple[float, int]:
            name, path = fresh()
            t0 = time.perf_counter()
            with dbapi.connect(server.url) as conn:
                for seq, t in enumerate(tables):
                    with conn.cursor() as cur:
                        cur.adbc_statement.set_options(
                            **{header + "writer": "bench", header + "seq": str(seq)}
                        )
                        cur.adbc_ingest(name, t, mode="append")
            return done(path, time.perf_counter() - t0)

        queries["adbc"] = adbc
    try:
        interleaved(
            {f"{args.rows / 1e6:g}M": queries},
            args.rounds,
            {f"{args.rows / 1e6:g}M": args.rows},
            base="inproc",
            ours="flight",
        )
    finally:
        server.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore", message="Cannot disable autocommit")
    main()

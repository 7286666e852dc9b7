"""A writer killed with SIGKILL at random points loses only what it had not flushed.

The child writes as fast as it can (single rows, Arrow batches of random sizes, bounds, flushes;
small flushes so merges of small segments run too) and reports, after every ``flush()`` that
returned, the committed record count through a pipe. The parent kills it at a random moment,
many times over. After each kill:

* every record a returned ``flush()`` covered is there, in order, exactly once (each data
  record carries its own offset in column ``k``);
* nothing is torn: every segment file in the folder, leftovers included, reads back whole;
* the next writer continues the same partition and cleans the dead writer's temporary files.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import time
from multiprocessing.connection import Connection

import numpy as np
import pyarrow as pa

from pyspark_rowtime.api import create_stream, open_writer
from pyspark_rowtime.bounds.time import from_rowtime_us
from pyspark_rowtime.streams.columns import LOG_ARRIVAL_US, LOG_IS_BOUND
from pyspark_rowtime.streams.local.log import open_stream
from pyspark_rowtime.streams.segments import SEGMENT_RE

KILLS = 20


def write_until_killed(location: str, seed: int, conn: Connection) -> None:
    rng = random.Random(seed)
    with open_writer(location, 0) as w:
        conn.send(("start", w.end_offset))
        while True:
            offset = w.end_offset + w.pending  # the offset the next record gets
            kind = rng.random()
            if kind < 0.3:
                for _ in range(rng.randint(1, 50)):
                    w.insert({"k": offset, "s": "x" * rng.randint(0, 20)})
                    offset += 1
            elif kind < 0.9:
                n = rng.choice([1, 10, 100, 1000, 20_000])
                k = np.arange(offset, offset + n, dtype=np.int64)
                w.insert_arrow(pa.table({"k": k, "s": pa.array(["y"] * n)}))
            else:
                clock = w.clock_us
                if clock is not None:
                    w.set_rowtime_bound(from_rowtime_us(clock), strict=True)
            if rng.random() < 0.7:
                conn.send(("flushed", w.flush()))


def check_partition(location: str, flushed: int) -> int:
    part = os.path.join(location, "partition-0000")
    for name in os.listdir(part):
        if SEGMENT_RE.match(name):  # every committed file, merged-away leftovers included
            with pa.memory_map(os.path.join(part, name)) as source:
                table = pa.ipc.open_file(source).read_all()
            count = int(name[: -len(".arrow")].split("-")[1])
            assert table.num_rows == count, f"{name} is torn"
    stream = open_stream(location)
    end = stream.end_offset(0)
    assert end >= flushed, f"flush() returned {flushed}, but only {end} records are there"
    t = stream.read(0, 0, end, ["k", LOG_IS_BOUND, LOG_ARRIVAL_US])
    k = t.column("k").to_numpy(zero_copy_only=False)
    is_bound = t.column(LOG_IS_BOUND).to_numpy(zero_copy_only=False)
    offsets = np.arange(end)
    assert (k[~is_bound] == offsets[~is_bound]).all(), "a record is missing, doubled or moved"
    arrival = t.column(LOG_ARRIVAL_US).to_numpy()
    assert (np.diff(arrival) >= 0).all()
    return end


def test_sigkill_at_random_points_loses_nothing_flushed_and_tears_nothing(tmp_path):
    loc = str(tmp_path / "s")
    create_stream(loc, "k BIGINT, s STRING")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["pandas", "pyspark_rowtime.streams.writer"])
    rng = random.Random(1234)
    flushed = 0
    for round_ in range(KILLS):
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=write_until_killed, args=(loc, round_, child))
        proc.start()
        child.close()
        try:
            assert parent.poll(30), "the writer did not start"
            tag, start = parent.recv()
            assert tag == "start" and start >= flushed
            time.sleep(rng.uniform(0.0, 0.15))
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(30)
        finally:
            if proc.is_alive():
                proc.kill()
                proc.join()
        while True:  # every count a returned flush() reported
            try:
                if not parent.poll(0):
                    break
                tag, value = parent.recv()
            except (EOFError, OSError, ValueError):
                break  # killed halfway through a report: the count before it stands
            flushed = max(flushed, value)
        parent.close()
        end = check_partition(loc, flushed)
        flushed = end  # what is committed now is what the next writer must keep
    with open_writer(loc, 0) as w:  # a new writer continues the same partition
        assert w.end_offset == flushed
        w.insert({"k": flushed, "s": "after"})
    part = os.path.join(loc, "partition-0000")
    assert not [n for n in os.listdir(part) if n.startswith(".tmp.")]
    assert check_partition(loc, flushed + 1) == flushed + 1
    assert flushed > 0

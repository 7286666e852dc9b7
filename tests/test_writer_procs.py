"""Writers and readers in different processes: one writer per partition, whole batches only."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from multiprocessing.connection import Connection

import pyarrow as pa
import pytest

from pyspark_rowtime.api import create_stream, open_writer
from pyspark_rowtime.bounds.errors import WriterLockedError
from pyspark_rowtime.streams.columns import LOG_ARRIVAL_US, LOG_IS_BOUND
from pyspark_rowtime.streams.local.log import open_stream

BATCH = 7


def _context() -> mp.context.BaseContext:
    # A forkserver forks children from a clean process with the log already imported: fast to
    # start, and no pyarrow threads of the test process are forked.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["pandas", "pyspark_rowtime.streams.writer"])
    return ctx


def hold_partition(location: str, conn: Connection) -> None:
    """Child: open a writer, report, then wait (forever) for the parent's word."""
    with open_writer(location, 0) as w:
        w.insert({"a": -1})
        conn.send(os.getpid())
        conn.recv()


def write_batches(location: str, batches: int, conn: Connection) -> None:
    """Child: write ``batches`` flushes of BATCH records each; record ``a`` = batch number,
    ``b`` = position in the batch. Half the batches go through insert(), half insert_arrow()."""
    with open_writer(location, 0) as w:
        conn.send("started")
        for n in range(batches):
            if n % 2:
                w.insert_arrow(pa.table({"a": [n] * BATCH, "b": list(range(BATCH))}))
            else:
                for i in range(BATCH):
                    w.insert({"a": n, "b": i})
            w.flush()
    conn.send("done")


def test_a_second_writer_process_is_refused_while_the_first_lives_and_takes_over_after(tmp_path):
    loc = str(tmp_path / "s")
    create_stream(loc, "a INT")
    ctx = _context()
    parent, child = ctx.Pipe()
    holder = ctx.Process(target=hold_partition, args=(loc, child))
    holder.start()
    try:
        assert parent.poll(30), "the writer process did not start"
        pid = parent.recv()
        with pytest.raises(WriterLockedError) as info:
            open_writer(loc, 0)
        assert f"process {pid}" in str(info.value) and "partition 0" in str(info.value)
        os.kill(pid, signal.SIGKILL)  # dies holding the lock: no stale lock may remain
        holder.join(30)
        with open_writer(loc, 0) as w:
            w.insert({"a": 1})
    finally:
        if holder.is_alive():
            holder.kill()
            holder.join()
    # The killed writer never flushed its row; the successor's row is the only one.
    stream = open_stream(loc)
    assert stream.read(0, 0, stream.end_offset(0)).column("a").to_pylist() == [1]


def test_readers_in_other_processes_see_only_whole_batches(tmp_path):
    loc = str(tmp_path / "s")
    create_stream(loc, "a INT, b INT")
    batches = 150
    ctx = _context()
    parent, child = ctx.Pipe()
    writer = ctx.Process(target=write_batches, args=(loc, batches, child))
    writer.start()
    try:
        assert parent.poll(30) and parent.recv() == "started"
        stream = open_stream(loc)
        seen_ends = set()
        done = False
        deadline = time.monotonic() + 60
        while not done and time.monotonic() < deadline:
            done = parent.poll(0)
            end = stream.end_offset(0)
            seen_ends.add(end)
            assert end % BATCH == 0, f"a reader saw {end} records: part of a batch"
            t = stream.read(0, 0, end, ["a", "b", LOG_ARRIVAL_US, LOG_IS_BOUND])
            a, b = t.column("a").to_pylist(), t.column("b").to_pylist()
            assert a == [n for n in range(end // BATCH) for _ in range(BATCH)]
            assert b == list(range(BATCH)) * (end // BATCH)
            arrivals = t.column(LOG_ARRIVAL_US).to_pylist()
            assert arrivals == sorted(arrivals)
        assert done, "the writer did not finish"
        writer.join(30)
    finally:
        if writer.is_alive():
            writer.kill()
            writer.join()
    assert open_stream(loc).end_offset(0) == batches * BATCH
    assert len(seen_ends) > 2  # the reader really ran while the writer wrote

"""Races on object storage, against moto's S3 server and Azurite (tests/objstore_servers.py):
two writers of one partition, a lease that expires and the frozen writer fenced, two sink
commits of one batch, a writer SIGKILLed in the middle of an append.

moto's own conditional put is not atomic (a look-up, then a write): the test server runs its
object writes one at a time, as S3 decides them (see objstore_servers.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from objstore_servers import ObjectServer

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.errors import WriterLockedError
from pyspark_rowtime.streams.objstore.log import SEGMENTS, ObjectAppender, ObjectStream
from pyspark_rowtime.streams.objstore.sink import ObjectSinkState
from pyspark_rowtime.streams.storage import open_stream

MS = 1_700_000_000_000


def _stream(url: str) -> ObjectStream:
    s = open_stream(url)
    assert isinstance(s, ObjectStream)
    return s


def _ids(url: str, partition: int = 0) -> list[int]:
    s = open_stream(url)
    return (
        s.read(partition, s.start_offset(partition), s.end_offset(partition))
        .column("id")
        .to_pylist()
    )


def test_of_writers_racing_for_a_partition_exactly_one_wins(object_server: ObjectServer) -> None:
    for _ in range(3):
        url = object_server.url("race")
        pr.create_stream(url, "id BIGINT")
        barrier = threading.Barrier(4)
        won: list[ObjectAppender] = []
        refused: list[Exception] = []

        def take(url=url, barrier=barrier, won=won, refused=refused):
            stream = _stream(url)
            barrier.wait()
            try:
                won.append(stream.lock_partition(0, "partition 0"))
            except WriterLockedError as e:
                refused.append(e)

        threads = [threading.Thread(target=take) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1 and len(refused) == 3, (won, refused)
        assert "another writer" in str(refused[0]) or "keep taking" in str(refused[0])
        won[0].release()


def test_an_expired_lease_is_taken_over_and_the_old_writer_is_fenced(
    object_server: ObjectServer,
) -> None:
    url = object_server.url("fence")
    pr.create_stream(url, "id BIGINT")
    stream = _stream(url)
    old = stream.lock_partition(0, "partition 0", lease_s=1.0)
    from pyspark_rowtime.streams.segments import SegmentStats

    def run(first: int, ids: list[int], clock: int | None) -> tuple[SegmentStats, pa.Table]:
        import numpy as np

        n = len(ids)
        arrival = np.arange(first, first + n, dtype=np.int64) + MS * 1000
        stats = SegmentStats.compute(
            first, arrival, arrival, np.ones(n, bool), np.zeros(n, bool), clock
        )
        table = pa.table(
            {
                "__arrival_us": arrival,
                "__rowtime_us": arrival,
                "__is_bound": np.zeros(n, bool),
                "id": pa.array(ids, pa.int64()),
            },
            schema=stream.file_schema,
        )
        return stats, table

    st, t = run(0, [0, 1, 2], None)
    old.append_run(st, [t])
    # While it holds the lease, nobody else gets the partition.
    with pytest.raises(WriterLockedError, match="another writer"):
        stream.lock_partition(0, "partition 0", lease_s=1.0)
    # The old writer freezes (no renewal: a long GC pause, a stopped VM) ...
    old.lease.stop_renewing()
    deadline = time.monotonic() + 30
    while True:
        try:
            new = stream.lock_partition(0, "partition 0", lease_s=30.0)
            break
        except WriterLockedError:
            assert time.monotonic() < deadline, "the lease never expired"
            time.sleep(0.2)
    assert new.epoch == old.epoch + 1
    # ... and wakes up to append: its commit would need the number the takeover took.
    st2, t2 = run(3, [3, 4], st.clock_us)
    with pytest.raises(WriterLockedError, match="fenced"):
        old.append_run(st2, [t2])
    with pytest.raises(WriterLockedError):  # and stays refused
        old.append_run(st2, [t2])
    assert _ids(url) == [0, 1, 2]  # nothing the old writer wrote after the takeover
    st3, t3 = run(3, [30, 40], st.clock_us)
    new.append_run(st3, [t3])
    new.release()
    old.release()  # its release does not free the new holder's lease (already released)
    assert _ids(url) == [0, 1, 2, 30, 40]
    # The old writer's uploaded segment is no commit's: the next writer removes it.
    pr.open_writer(url, 0).close()
    import obstore

    keys = [
        m["path"]
        for chunk in obstore.list(stream.store, stream._key(0, SEGMENTS) + "/")
        for m in chunk
    ]
    assert len(keys) == 2, keys  # the two committed segments


def test_a_writer_that_lost_its_lease_cannot_free_the_new_holder(
    object_server: ObjectServer,
) -> None:
    url = object_server.url("lost")
    pr.create_stream(url, "id BIGINT")
    stream = _stream(url)
    old = stream.lock_partition(0, "partition 0", lease_s=0.6)
    old.lease.stop_renewing()
    time.sleep(1.0)
    new = stream.lock_partition(0, "partition 0", lease_s=30.0)
    old.release()  # compare-and-swap on a stale etag: changes nothing
    with pytest.raises(WriterLockedError, match="another writer"):
        stream.lock_partition(0, "partition 0")
    new.release()


def test_of_two_sink_commits_of_one_batch_exactly_one_wins(object_server: ObjectServer) -> None:
    url = object_server.url("sink")
    for batch_id in range(5):
        stores = [ObjectSinkState(url) for _ in range(4)]
        barrier = threading.Barrier(len(stores))
        results: list[bool] = []

        def commit(store, me, batch_id=batch_id, barrier=barrier, results=results):
            barrier.wait()
            results.append(store.put_entry_once(batch_id, {"batch": batch_id, "driver": me}))

        threads = [threading.Thread(target=commit, args=(s, i)) for i, s in enumerate(stores)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [False, False, False, True]
        entry = stores[0].entry(batch_id)
        assert entry is not None and entry["batch"] == batch_id
    assert ObjectSinkState(url).batches() == list(range(5))


_CHILD = textwrap.dedent(
    """
    import sys, pyarrow as pa
    import pyspark_rowtime as pr
    from pyspark_rowtime.streams.storage import open_stream

    url, mode = sys.argv[1], sys.argv[2]
    if mode == "loop":
        with pr.open_writer(url, 0) as w:
            i = 0
            while True:
                w.insert_arrow(pa.table({"id": list(range(i, i + 500))}))
                w.flush()
                i += 500
                print(i, flush=True)
    else:  # upload a run, then stop before its commit (killed there)
        import time
        from pyspark_rowtime.bounds.errors import WriterLockedError
        stream = open_stream(url)
        while True:  # the killed writer's lease (1 s) ends first
            try:
                a = stream.lock_partition(0, "partition 0")
                break
            except WriterLockedError:
                time.sleep(0.1)
        from pyspark_rowtime.streams.segments import SegmentStats
        import numpy as np
        tail = a.tail()
        n = 100
        arrival = np.full(n, (tail.last_arrival_us or 0) + 1, dtype=np.int64)
        stats = SegmentStats.compute(tail.end, arrival, arrival, np.zeros(n, bool),
                                     np.zeros(n, bool), tail.clock_us)
        table = pa.table({"__arrival_us": arrival, "__rowtime_us": pa.nulls(n, pa.int64()),
                          "__is_bound": np.zeros(n, bool), "id": pa.array(range(n), pa.int64())},
                         schema=stream.file_schema)
        sink = pa.BufferOutputStream()
        from pyspark_rowtime.streams.segments import write_segment_to
        write_segment_to(sink, stats, stream.file_schema, [table])
        a._upload(stats, sink.getvalue().to_pybytes())
        print("uploaded", flush=True)
        import time
        time.sleep(600)
    """
)


def test_a_writer_killed_mid_append_leaves_nothing_a_reader_takes(
    object_server: ObjectServer, tmp_path: Path
) -> None:
    url = object_server.url("kill")
    pr.create_stream(url, "id BIGINT")
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = {**os.environ, "ROWTIME_LEASE_S": "1"}
    # 1. killed at a random moment of a loop of appends
    child = subprocess.Popen(
        [sys.executable, str(script), url, "loop"], stdout=subprocess.PIPE, env=env, text=True
    )
    assert child.stdout is not None
    for _ in range(4):
        child.stdout.readline()
    child.send_signal(signal.SIGKILL)
    child.wait()
    ids = _ids(url)
    assert ids == list(range(len(ids))) and len(ids) % 500 == 0 and len(ids) >= 2000
    # 2. killed between the upload of a run and its commit
    child = subprocess.Popen(
        [sys.executable, str(script), url, "upload"], stdout=subprocess.PIPE, env=env, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "uploaded"
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert _ids(url) == ids  # the uploaded run is no commit's: nothing of it is visible
    # After the dead writer's lease (1 s), the next writer goes on from the committed end.
    deadline = time.monotonic() + 30
    while True:
        try:
            w = pr.open_writer(url, 0)
            break
        except WriterLockedError:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    with w:
        w.insert_arrow(pa.table({"id": [-1]}))
    assert _ids(url) == [*ids, -1]

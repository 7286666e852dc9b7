"""Writers and commits through a faulty network (issue 34): the fault proxy of
tests/fault_proxy.py in front of the real servers (moto's S3, Azurite, redis-server) resets
connections before the request reaches the server, loses replies of requests the server
applied, cuts replies halfway, stalls and delays them.

What must hold (the contract of ``Writer.flush``): a flush that returned committed its records
once; a flush that raised names the store, the operation and what to do, within the configured
timeouts; calling ``flush()`` again completes the same append or finds it committed, never
both; a create-if-absent or compare-and-swap whose reply was lost recognises its own write;
a writer whose lease renewals time out is fenced, and two writers never both append.

Each test prints its seed (``ROWTIME_FAULT_SEED`` replays one).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_proxy import FaultProxy, Faults
from fault_writes import (
    FAST_TIMEOUTS,
    breaking,
    environ,
    ids,
    seed,
    through_proxy,
    write_through_faults,
)
from objstore_servers import ObjectServer
from redis_server import RedisServer, redis_server

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.errors import WriterLockedError
from pyspark_rowtime.streams.storage import open_stream


def test_every_flush_through_a_faulty_network_lands_exactly_once_on_object_storage(
    object_server: ObjectServer,
) -> None:
    url = object_server.url("wire")
    pr.create_stream(url, "id BIGINT")
    flushes, per = (60, 100) if object_server.scheme == "s3" else (30, 100)
    with through_proxy(object_server) as proxy:
        stats = write_through_faults(url, proxy, "object store", flushes, per, rate=0.2, at_least=8)
        assert breaking(proxy) >= 8, proxy.summary()
    print(f"{object_server.scheme}: {stats}")
    assert ids(url) == list(range(stats["flushes"] * per)), proxy.summary()
    assert stats["raised"] > 0, proxy.summary()  # the retry path ran  # the retry path ran


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(Path(tmp_path_factory.mktemp("redis"))) as s:
        yield s


def test_every_flush_through_a_faulty_network_lands_exactly_once_on_redis(
    redis: RedisServer,
) -> None:
    url = redis.url("wire")
    pr.create_stream(url, "id BIGINT")
    with FaultProxy(redis.port, seed()) as proxy:
        # No retries in the client: every fault reaches the writer, whose retry is the test.
        via = f"redis://127.0.0.1:{proxy.port}/0/wire?socket_timeout=1s&retries=0"
        stats = write_through_faults(via, proxy, "Redis", 60, 100, rate=0.2, at_least=8)
        print(proxy.summary(), stats)
        assert breaking(proxy) >= 8, proxy.summary()
    assert ids(url) == list(range(stats["flushes"] * 100)), proxy.summary()
    assert stats["raised"] > 0, proxy.summary()


def test_a_commit_whose_reply_was_lost_is_retried_and_recognised_as_its_own(
    s3_server: ObjectServer,
) -> None:
    """Create-if-absent: the store applied the commit and its reply is lost; the client's
    retry hears "already exists", reads the commit back and finds it this writer's (its id):
    the flush returns, nothing written twice."""
    url = s3_server.url("lost-commit")
    pr.create_stream(url, "id BIGINT")
    with through_proxy(s3_server) as proxy:
        w = pr.open_writer(url)
        w.insert({"id": 0})
        proxy.target("drop", b"PUT ", b"/_commits/")
        assert w.flush() == 1
        w.insert({"id": 1})
        assert w.flush() == 2
        w.close()
        assert proxy.counts["drop"] == 1, proxy.summary()
    assert ids(url) == [0, 1]


def test_a_commit_whose_every_reply_was_lost_is_completed_by_the_next_flush(
    s3_server: ObjectServer,
) -> None:
    """Every attempt the client may make loses its reply (the first was applied): the flush
    raises saying to call it again, and the next flush reads the commit back and finds it
    this writer's: nothing written twice."""
    url = s3_server.url("lost-commits")
    pr.create_stream(url, "id BIGINT")
    with through_proxy(s3_server) as proxy:
        w = pr.open_writer(url)
        w.insert({"id": 0})
        tries = int(FAST_TIMEOUTS["ROWTIME_STORE_RETRIES"]) + 1
        proxy.target("drop", b"PUT ", b"/_commits/", times=tries)
        with pytest.raises(ConnectionError, match=r"flush\(\) again"):
            w.flush()
        assert w.end_offset == 0 and w.pending == 1
        assert w.flush() == 1  # the commit, read back, is this writer's
        w.insert({"id": 1})
        assert w.flush() == 2
        w.close()
        assert proxy.counts["drop"] == tries, proxy.summary()
    assert ids(url) == [0, 1]


def test_a_stream_created_while_the_reply_was_lost_is_recognised(s3_server: ObjectServer) -> None:
    url = s3_server.url("lost-create")
    with through_proxy(s3_server) as proxy:
        proxy.target("drop", b"PUT ", b"/_stream.json")
        for _ in range(3):
            try:
                pr.create_stream(url, "id BIGINT")
                break
            except ConnectionError:
                pass  # its retry finds the stream it made, with the same schema
        assert proxy.counts["drop"] == 1
    with pr.open_writer(url) as w:
        w.insert({"id": 7})
    assert ids(url) == [7]


def test_a_lease_renewal_whose_reply_was_lost_keeps_the_lease(s3_server: ObjectServer) -> None:
    """Compare-and-swap: the renewal was applied and its reply lost; the client's retry's
    precondition fails (the etag moved) and the lease, read back, is still this writer's."""
    from pyspark_rowtime.streams.objstore.log import ObjectStream

    url = s3_server.url("lost-renewal")
    pr.create_stream(url, "id BIGINT")
    with through_proxy(s3_server) as proxy:
        stream = open_stream(url)
        assert isinstance(stream, ObjectStream)
        appender = stream.lock_partition(0, "partition 0", lease_s=600)
        proxy.target("drop", b"PUT ", b"_lease.json")
        # applied, its reply lost; the retry's precondition fails, and the lease read back is
        # still this writer's epoch
        assert appender.lease.renew() and not appender.lease.lost
        assert appender.lease.renew() and not appender.lease.lost
        assert proxy.counts["drop"] == 1
        w_end = appender.tail().end
        assert w_end == 0
        appender.release()


_WRITER_B = textwrap.dedent(
    """
    import sys, pyspark_rowtime as pr
    with pr.open_writer(sys.argv[1]) as w:
        for i in range(100, 110):
            w.insert({"id": i})
    """
)


def test_a_writer_whose_lease_renewals_time_out_is_fenced(s3_server: ObjectServer) -> None:
    """Writer A's store stalls (every request through the proxy hangs), so its renewals time
    out and its lease runs out; writer B (another process, straight to the store) takes the
    partition over and appends. When A's network comes back, its flush is refused and none
    of its later records is visible: never two writers appending."""
    url = s3_server.url("fenced")
    pr.create_stream(url, "id BIGINT")
    with through_proxy(s3_server) as proxy, environ({"ROWTIME_LEASE_S": "1"}):
        a = pr.open_writer(url)
        for i in range(10):
            a.insert({"id": i})
        a.flush()
        proxy.faults = Faults(stall=1.0, stall_s=math.inf)
        proxy.reset_all()
        time.sleep(1.5)  # A's lease (1 s) runs out: its renewals hang
        env = {**os.environ, **s3_server.env}
        env.pop("ROWTIME_LEASE_S", None)
        subprocess.run([sys.executable, "-c", _WRITER_B, url], env=env, check=True, timeout=60)
        proxy.faults = Faults()
        proxy.reset_all()
        for i in range(10, 20):
            a.insert({"id": i})
        with pytest.raises(WriterLockedError, match=r"fenced|taken|lease") as caught:
            a.flush()
        assert "open a new writer" in str(caught.value)
        a.abort()
    assert ids(url) == [*range(10), *range(100, 110)]


def test_an_unreachable_store_fails_within_seconds_naming_the_settings(tmp_path: Path) -> None:
    """Nothing listens on the endpoint: the error comes after the client's few quick retries
    (about a second), not after minutes, and names the settings that change it."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing-secret",
        "AWS_REGION": "us-east-1",
    }
    with environ(env):
        t = time.monotonic()
        with pytest.raises(ConnectionError) as caught:
            pr.create_stream("s3://nowhere/stream", "id BIGINT")
        took = time.monotonic() - t
    assert took < 10, took
    text = str(caught.value)
    assert "object store" in text and "ROWTIME_STORE_TIMEOUT_S" in text, text


def test_a_redis_that_never_answers_fails_after_retries_plus_one_timeouts(
    redis: RedisServer,
) -> None:
    """A server that accepts connections and stalls every request: the error comes after
    ``retries + 1`` socket timeouts (plus backoff), not ``(retries + 1) ** 2`` (redis-py retries
    the handshake inside each retry of a command), and names the location and the retries.
    With the defaults (10 s, 3 retries) that is under a minute."""
    from pyspark_rowtime.streams.redis import open_redis_stream

    url = redis.url("stalled")
    pr.create_stream(url, "id BIGINT")
    with FaultProxy(redis.port, seed()) as proxy:
        proxy.faults = Faults(stall=1.0, stall_s=math.inf)
        via = f"redis://127.0.0.1:{proxy.port}/0/stalled?socket_timeout=1s&retries=2&backoff=10ms"
        t = time.monotonic()
        with pytest.raises(ConnectionError) as caught:
            open_redis_stream(via)
        took = time.monotonic() - t
    # 3 attempts of 1 s (each a connection whose handshake stalls); squared it was 9 s or more
    assert 2.5 < took < 6, took
    assert "did not answer" in str(caught.value) and "2 retries" in str(caught.value)

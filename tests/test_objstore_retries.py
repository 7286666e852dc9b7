"""A lost reply costs a retry, not the query (item 7 of issue 55): requests to an object store
are made of attempts, each bounded by a timeout that suits its object, and a failed attempt of
a request whose repetition is safe is tried again within the retry budget
(``streams/objstore/location.py``: ``call`` and ``_attempt_for``).

Through the fault proxy (``tests/fault_proxy.py``) in front of moto's S3 and Azurite, with the
backend's default settings: a GET of a small object whose reply never comes (``hang``: the
connection stays open and silent) is abandoned after its attempt's timeout (5 s) and sent
again, where before it waited 30 s and failed; a commit or a lease renewal whose reply never
comes is retried and recognised as this writer's; a large read whose reply never comes is cut
off by its read-idle timeout, not by the long time its size allows. The rules themselves
(which timeout, how many attempts, how long) are checked without a server.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from fault_proxy import FaultProxy
from fault_writes import environ, ids, port_of, seed
from hypothesis import given
from hypothesis import strategies as st
from objstore_servers import ObjectServer

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.errors import OptionError
from pyspark_rowtime.streams.objstore import location
from pyspark_rowtime.streams.objstore.location import (
    STORE_SETTINGS,
    UNKNOWN_SIZE,
    ObjectStoreUnavailableError,
    _attempt_for,
    call,
    parse_location,
    store_settings,
)
from pyspark_rowtime.streams.objstore.log import COMMITS, SEGMENTS, ObjectStream
from pyspark_rowtime.streams.retention import apply_retention
from pyspark_rowtime.streams.storage import open_stream

DEFAULTS = {name: default for name, (_, default, _) in STORE_SETTINGS.items()}
SMALL_S = DEFAULTS["timeout"]


@contextmanager
def defaults_through_proxy(server: ObjectServer, **env: str) -> Iterator[FaultProxy]:
    """This process's clients pointed at ``server`` through a fault proxy that injects only
    what a test aims at, with the backend's default timeouts (``env`` aside)."""
    port = port_of(server)
    with FaultProxy(port, seed()) as proxy:
        through = {k: v.replace(f":{port}", f":{proxy.port}") for k, v in server.env.items()}
        unset = {v for v, _, _ in STORE_SETTINGS.values()} - set(env)
        saved = {k: os.environ.pop(k) for k in unset if k in os.environ}
        try:
            with environ({**through, **env}):
                yield proxy
        finally:
            os.environ.update(saved)
        print(proxy.summary())


def test_a_hanging_get_of_a_small_object_is_retried_within_seconds(
    object_server: ObjectServer,
) -> None:
    """The issue's failure: the GET of a partition's trim object hangs (its reply never
    comes). It is abandoned after the small-object timeout and sent again, and the read
    returns in seconds; with 30 s per attempt and a 20 s retry window it failed after 30 s."""
    url = object_server.url("hang-get")
    pr.create_stream(url, "id BIGINT")
    with pr.open_writer(url) as w:
        w.insert({"id": 1})
    with defaults_through_proxy(object_server) as proxy:
        stream = open_stream(url)
        proxy.target("hang", b"GET ", b"_trim.json")
        t = time.monotonic()
        assert stream.end_offset(0) == 1
        took = time.monotonic() - t
        assert proxy.counts["hang"] == 1, proxy.summary()
    assert SMALL_S <= took < SMALL_S + 4, took  # one attempt's timeout, then a quick retry


def test_a_hanging_commit_is_retried_and_recognised_as_this_writers(
    object_server: ObjectServer,
) -> None:
    """A conditional create whose reply never comes (the store applied it): the retry hears
    "already exists", the commit read back carries this writer's id, and the flush returns:
    every record once."""
    url = object_server.url("hang-commit")
    pr.create_stream(url, "id BIGINT")
    with defaults_through_proxy(object_server) as proxy:
        w = pr.open_writer(url)
        w.insert({"id": 0})
        proxy.target("hang", b"PUT ", b"/_commits/")
        t = time.monotonic()
        assert w.flush() == 1
        took = time.monotonic() - t
        w.insert({"id": 1})
        assert w.flush() == 2
        w.close()
        assert proxy.counts["hang"] == 1, proxy.summary()
    assert SMALL_S <= took < SMALL_S + 4, took
    assert ids(url) == [0, 1]


def test_a_hanging_lease_renewal_is_retried_and_keeps_the_lease(s3_server: ObjectServer) -> None:
    """A compare-and-swap whose reply never comes (applied): the retry's precondition fails,
    and the lease read back is still this writer's epoch."""
    url = s3_server.url("hang-lease")
    pr.create_stream(url, "id BIGINT")
    with defaults_through_proxy(s3_server) as proxy:
        stream = open_stream(url)
        assert isinstance(stream, ObjectStream)
        appender = stream.lock_partition(0, "partition 0", lease_s=600)
        proxy.target("hang", b"PUT ", b"_lease.json")
        assert appender.lease.renew() and not appender.lease.lost
        assert appender.lease.renew() and not appender.lease.lost
        assert proxy.counts["hang"] == 1, proxy.summary()
        appender.release()


def _partition_objects(stream: ObjectStream) -> set[str]:
    """The keys of partition 0's segments and commits."""
    import obstore

    keys: set[str] = set()
    for folder in (SEGMENTS, COMMITS):
        for chunk in obstore.list(stream.store, stream._key(0, folder) + "/"):
            keys |= {meta["path"] for meta in chunk}
    return keys


def test_a_hanging_trim_is_retried_and_recognised_as_this_trims(
    object_server: ObjectServer,
) -> None:
    """The compare-and-swap of a trim whose reply never comes (the store applied it): the
    retry's precondition fails on this trim's own object, read back by its id, so the trim
    reports what it removed and deletes its segments and commits now (before, it returned as if
    another trim had won, and they stayed)."""
    url = object_server.url("hang-trim")
    pr.create_stream(url, "id BIGINT")
    with pr.open_writer(url) as w:
        for k in range(4):  # four units, rowtimes 0 s to 3 s
            w.insert({"id": k}, rowtime=k * 1000)
            w.flush()
    stream = open_stream(url)
    assert isinstance(stream, ObjectStream)
    [first] = apply_retention(stream, before_us=1_500_000)  # creates _trim.json: no fault
    assert (first.before.start, first.after.start) == (0, 2)
    before = _partition_objects(stream)
    with defaults_through_proxy(object_server, ROWTIME_STORE_TIMEOUT_S="1") as proxy:
        stream = open_stream(url)
        assert isinstance(stream, ObjectStream)
        proxy.target("hang", b"PUT ", b"_trim.json")
        [second] = apply_retention(stream, before_us=2_500_000)  # replaces it: a swap
        assert proxy.counts["hang"] == 1, proxy.summary()
        assert (second.before.start, second.after.start) == (2, 3) and second.units == 1
        gone = before - _partition_objects(stream)
    assert len(gone) == 2, gone  # the removed unit's segment and the commit that named it
    assert open_stream(url).start_offset(0) == 3 and ids(url) == [3]


def test_a_hanging_read_of_a_large_segment_ends_at_its_read_idle_timeout(
    s3_server: ObjectServer,
) -> None:
    """A segment of over 2 MB at a slowest rate of 10 kB/s is given minutes an attempt, but a reply
    that never comes is silent, and the read-idle timeout (the small-object timeout) ends
    that attempt: the retry reads the segment in seconds."""
    url = s3_server.url("hang-segment")
    pr.create_stream(url, "id BIGINT, pad STRING")
    with pr.open_writer(url) as w:
        for i in range(20):
            w.insert({"id": i, "pad": os.urandom(100_000).hex()})
    with defaults_through_proxy(s3_server, ROWTIME_STORE_MIN_MB_S="0.01") as proxy:
        stream = open_stream(url)
        assert isinstance(stream, ObjectStream)
        (piece,) = stream._refresh(0).pieces
        assert piece.size > 2_000_000
        proxy.target("hang", b"GET ", b"/segments/")
        t = time.monotonic()
        assert stream.read(0, 0, 20).column("id").to_pylist() == list(range(20))
        took = time.monotonic() - t
        assert proxy.counts["hang"] == 1, proxy.summary()
    assert SMALL_S <= took < SMALL_S + 6, took


# -- the rules, without a server --------------------------------------------------------------


@pytest.mark.parametrize(
    ("reads", "writes", "timeout_s", "read_idle_s"),
    [
        (None, None, 5, None),  # a small object: a commit, a trim, a lease, a listing's page
        (4_000_000, None, 5, 5),  # 4 s at 1 MB/s: within the small-object timeout
        (12_000_000, None, 20, 5),  # 12 s: 5 s doubled until it covers them
        (None, 12_000_000, 20, None),  # a write's answer comes after its body: no idle bound
        (150_000_000, None, 160, 5),
        (UNKNOWN_SIZE, None, 640, 5),  # a staged run read back: as long as it keeps coming
    ],
)
def test_an_attempt_is_given_time_for_its_object(
    reads: int | None, writes: int | None, timeout_s: float, read_idle_s: float | None
) -> None:
    attempt = _attempt_for(DEFAULTS, reads, writes)
    assert (attempt.timeout_s, attempt.read_idle_s) == (timeout_s, read_idle_s)
    assert not attempt.obstore_retries


@given(
    size=st.integers(0, 10**11),
    small=st.floats(0.1, 60),
    rate=st.floats(0.01, 1000),
    reading=st.booleans(),
)
def test_an_attempt_covers_its_bytes_at_the_slowest_rate_and_at_most_twice_that(
    size: int, small: float, rate: float, reading: bool
) -> None:
    got = {**DEFAULTS, "timeout": small, "min_rate": rate}
    attempt = _attempt_for(got, size if reading else None, None if reading else size)
    need = max(small, size / (rate * 1e6))
    assert need * (1 - 1e-9) <= attempt.timeout_s <= 2 * need * (1 + 1e-9)
    assert attempt.read_idle_s == (small if reading else None)


def _failing(counter: list[float]) -> None:
    counter.append(time.monotonic())
    raise ConnectionResetError("connection reset by peer")


def test_a_failed_request_is_tried_as_often_as_the_retries_allow_then_names_the_settings() -> None:
    loc = parse_location("s3://bucket/stream")
    attempts: list[float] = []
    with environ({"ROWTIME_STORE_RETRIES": "3"}):
        with pytest.raises(ObjectStoreUnavailableError) as caught:
            call(loc, "reading a commit", lambda: _failing(attempts))
    assert len(attempts) == 4
    assert attempts[-1] - attempts[0] < 3 * location._BACKOFF_CAP_S
    text = str(caught.value)
    assert "reading a commit at s3://bucket/stream" in text and "4 attempts" in text, text
    assert "ROWTIME_STORE_RETRIES" in text and "ROWTIME_STORE_TIMEOUT_S" in text, text


def test_a_request_that_must_not_be_repeated_is_tried_once() -> None:
    loc = parse_location("s3://bucket/stream")
    attempts: list[float] = []
    with pytest.raises(ObjectStoreUnavailableError, match="one attempt"):
        call(loc, "completing an upload", lambda: _failing(attempts), retry=False)
    assert len(attempts) == 1


def test_no_retry_starts_once_the_retry_timeout_has_passed() -> None:
    """Retries keep starting until the window after the first failure closes, then none."""
    loc = parse_location("s3://bucket/stream")
    starts: list[float] = []
    failures: list[float] = []

    def slow_failure() -> None:
        starts.append(time.monotonic())
        time.sleep(0.3)
        _failing(failures)

    with environ({"ROWTIME_STORE_RETRIES": "100", "ROWTIME_STORE_RETRY_TIMEOUT_S": "0.5"}):
        with pytest.raises(ObjectStoreUnavailableError):
            call(loc, "reading a commit", slow_failure)
    window_end = failures[0] + 0.5
    assert 2 <= len(starts) <= 3, starts  # each attempt takes 0.3 s, a backoff at most 0.2 s
    assert starts[-1] <= window_end + 0.05  # the last retry started within the window
    assert failures[-1] >= window_end - 0.01  # and it failed as the window closed: no other


@pytest.mark.parametrize(
    ("variable", "value"),
    [("ROWTIME_STORE_TIMEOUT_S", "0"), ("ROWTIME_STORE_MIN_MB_S", "fast"),
     ("ROWTIME_STORE_RETRIES", "-1"), ("ROWTIME_STORE_RETRY_TIMEOUT_S", "inf")],
)  # fmt: skip
def test_a_setting_that_is_not_a_positive_number_is_refused_naming_it(
    variable: str, value: str
) -> None:
    with environ({variable: value}):
        with pytest.raises(OptionError, match=variable):
            store_settings()

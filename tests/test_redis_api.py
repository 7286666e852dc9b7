"""The adapter API and the rowtime CLI on a redis:// location: the same calls as for a folder."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest
from redis_server import RedisServer, redis_server

from pyspark_rowtime.api import create_stream, get_rowtime_bound, open_writer, read_stream
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.bounds.errors import BoundError, LateRowError, WriterLockedError
from pyspark_rowtime.cli import main

SECRET = "Api-Secret-7"
JAN1 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
JAN1_US = 1_704_067_200_000_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis-api"), password=SECRET) as s:
        yield s


_n = iter(range(10**6))


@pytest.fixture
def url(server: RedisServer) -> str:
    return server.url(f"api{next(_n)}")


def test_writer_calls_on_redis(url: str) -> None:
    create_stream(url, "id BIGINT, name STRING", partitions=2, order="reject")
    assert get_rowtime_bound(url) is None
    with open_writer(url, 0) as w:
        w.insert({"id": 1, "name": "a"}, rowtime=JAN1)
        w.insert_arrow(
            pa.table(
                {
                    "id": [2, 3],
                    "name": ["b", "c"],
                    "t": pa.array([JAN1_US + 1, JAN1_US + 2], pa.timestamp("us", "UTC")),
                }
            ),
            rowtime_column="t",
        )
        w.set_rowtime_bound(JAN1 + dt.timedelta(seconds=5))
        with pytest.raises(BoundError):
            w.set_rowtime_bound(JAN1)
        with pytest.raises(LateRowError):
            w.insert({"id": 0, "name": "late"}, rowtime=JAN1)
        with pytest.raises(WriterLockedError):
            open_writer(url, 0)
        assert w.flush() == 4
    with open_writer(url, 1) as w:
        w.insert({"id": 9, "name": "z"}, rowtime=JAN1 + dt.timedelta(seconds=1))
        w.end_stream()
    # The stream clock is the slower partition's: partition 0's bound.
    assert get_rowtime_bound(url) == JAN1 + dt.timedelta(seconds=5)
    with open_writer(url, 0) as w:  # a new writer continues where the last one ended
        assert w.end_offset == 4
        w.end_stream()
    assert get_rowtime_bound(url).year == 9999
    records = read_stream(url).to_pylist()
    assert [(r["partition"], r["offset"], r["id"]) for r in records] == [
        (0, 0, 1),
        (0, 1, 2),
        (0, 2, 3),
        (0, 3, None),
        (0, 4, None),
        (1, 0, 9),
        (1, 1, None),
    ]


def test_heartbeats_reach_redis(url: str) -> None:
    create_stream(url, "id BIGINT")
    with open_writer(url, 0, heartbeat="20ms") as w:
        w.insert({"id": 1})
        w.flush()
        deadline = time.monotonic() + 10
        while w.end_offset < 2:  # a heartbeat bound is committed while the writer is idle
            assert time.monotonic() < deadline, "no heartbeat within 10 s"
            time.sleep(0.01)
    records = read_stream(url).to_pylist()
    assert records[0]["id"] == 1 and all(r["is_bound"] for r in records[1:])
    clock = get_rowtime_bound(url)
    assert clock is not None and clock.year < 9999


def test_cli_on_redis_never_shows_the_password(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(*args: str) -> tuple[int, str]:
        code = main(list(args))
        out, err = capsys.readouterr()
        assert SECRET not in out and SECRET not in err
        return code, out + err

    assert run("create", url, "--schema", "id INT, name STRING", "--partitions", "2")[0] == 0
    assert run("bound", url, "2024-01-01T00:00:00Z")[0] == 0
    code, out = run("describe", url)
    assert code == 0 and ":***@" in out and "2024-01-01T00:00:00Z" in out
    code, out = run("clock", url)
    assert code == 0 and out.strip() == "2024-01-01T00:00:00Z"
    code, out = run("tail", url)
    assert code == 0 and [json.loads(line)["is_bound"] for line in out.splitlines()] == [True, True]
    code, out = run("describe", url.replace(SECRET, "wrong"))
    assert code != 0 and "credentials" in out
    code, out = run("clock", url.replace("/api", "/missing"))
    assert code != 0 and "no rowtime stream" in out


def test_end_of_stream_is_the_maximum(url: str) -> None:
    create_stream(url, "id BIGINT")
    with open_writer(url, 0) as w:
        w.end_stream()
    rows = read_stream(url).to_pylist()
    assert len(rows) == 1 and rows[0]["is_bound"]
    from pyspark_rowtime.api import open_stream

    assert open_stream(url).stream_clock_us() == END_OF_STREAM_US


def test_a_writer_whose_server_goes_away_fails_clearly_and_loses_nothing_it_acknowledged(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from pyspark_rowtime.streams.redis.location import RedisUnavailableError

    with redis_server(
        tmp_path_factory.mktemp("redis-away"), password=SECRET, appendonly=True
    ) as srv:
        url = srv.url("away") + "?connect_timeout=200ms&socket_timeout=1s&retries=2&backoff=20ms"
        create_stream(url, "id BIGINT")
        with open_writer(url, 0, heartbeat=None) as w:
            for i in range(5):
                w.insert({"id": i}, rowtime=JAN1 + dt.timedelta(seconds=i))
            assert w.flush() == 5  # acknowledged
            srv.kill()  # a crash (appendfsync always)
            for i in range(5, 8):
                w.insert({"id": i}, rowtime=JAN1 + dt.timedelta(seconds=i))
            began = time.monotonic()
            with pytest.raises(RedisUnavailableError) as info:
                w.flush()
            text = str(info.value)
            assert "did not answer" in text and "2 retries" in text
            assert "redis://:***@127.0.0.1" in text and SECRET not in text
            assert time.monotonic() - began < 15  # the retries' backoff, not a hang
            srv.restart()
            assert w.flush() == 8  # the kept buffer, committed once the server is back
        ids = read_stream(url).column("id").to_pylist()
        assert ids == list(range(8))  # nothing acknowledged lost, nothing twice


def test_a_reader_opening_a_stream_while_it_is_created_sees_all_of_it_or_nothing(
    server: RedisServer,
) -> None:
    """The meta hash is written in one step: a reader polling while a stream is created finds
    no stream or the whole document, never ``meta`` without ``format`` (a CI failure: the
    SIGKILL test's clock read saw a half-created stream and called it corrupt)."""
    import threading

    from pyspark_rowtime.bounds.errors import StreamNotFoundError
    from pyspark_rowtime.streams.redis import open_redis_stream

    names = [server.url(f"race{next(_n)}") for _ in range(150)]
    seen: list[str] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            for name in names:
                try:
                    open_redis_stream(name)
                    seen.append("whole")
                except StreamNotFoundError:
                    pass
                except Exception as e:  # the failure this test is about
                    seen.append(f"{type(e).__name__}: {e}")

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        for name in names:
            create_stream(name, "id BIGINT")
    finally:
        done.set()
        reader.join()
    assert [s for s in seen if s != "whole"] == []
    assert "whole" in seen

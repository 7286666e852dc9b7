"""Retention (SPEC 12) on Redis streams, against a real redis-server (tests/redis_server.py):
whole runs go (``XTRIM MINID`` and their index, summaries and record times in one script),
offsets stay, and readers over the trimmed stream equal the untrimmed one on kept records."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis_server import RedisServer, redis_server
from test_retention import POLICIES, READS, batch, restricted, write_random

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.errors import OptionError
from pyspark_rowtime.streams.redis import (
    create_redis_stream,
    open_redis_stream,
    register_external,
)
from pyspark_rowtime.streams.retention import DataLossError, Retention, TrimState, apply_retention

S = 1_000_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as s:
        yield s


_names = iter(range(10**6))


@pytest.fixture
def url(server: RedisServer) -> str:
    return server.url(f"r{next(_names)}")


def write_seconds(url: str, seconds: range, per_flush: int) -> None:
    with pr.open_writer(url, 0) as w:
        for i, sec in enumerate(seconds):
            w.insert({"k": sec}, rowtime=sec * 1000)
            if (i + 1) % per_flush == 0:
                w.flush()


def test_a_trim_removes_whole_runs_and_their_entries_and_keeps_offsets(
    url: str, server: RedisServer
) -> None:
    create_redis_stream(url, "k INT")
    write_seconds(url, range(40), per_flush=10)
    stream = open_redis_stream(url)
    client = server.client()
    key = stream.loc.key("p", "0")
    assert client.xlen(key) == 4
    [result] = apply_retention(stream, before_us=25 * S)
    assert (result.before.start, result.after.start, result.units) == (0, 20, 2)
    assert client.xlen(key) == 2  # the entries themselves are gone
    assert client.zcard(stream.loc.key("i", "0")) == 2
    assert client.hlen(stream.loc.key("tm", "0")) == 2
    fresh = open_redis_stream(url)
    assert (fresh.start_offset(0), fresh.end_offset(0)) == (20, 40)
    assert fresh.read(0, 20, 40).column("k").to_pylist() == list(range(20, 40))
    assert [s.first for s in fresh.partition_stats(0)] == [20, 30]
    with pytest.raises(DataLossError, match="first kept offset is 20"):
        fresh.read(0, 10, 30)
    with pr.open_writer(url, 0) as w:  # the next record still gets the next offset
        w.insert({"k": 40}, rowtime=40_000)
    assert open_redis_stream(url).end_offset(0) == 41


def test_a_reader_that_indexed_the_removed_entries_gets_a_data_loss_error(url: str) -> None:
    create_redis_stream(url, "k INT")
    write_seconds(url, range(30), per_flush=10)
    reader = open_redis_stream(url)
    reader.read(0, 20, 30)  # indexes the partition, caches only the last entry
    apply_retention(open_redis_stream(url), before_us=15 * S)
    with pytest.raises(DataLossError) as e:
        reader.read(0, 0, 10)
    assert "partition 0" in str(e.value) and "first kept offset is 10" in str(e.value)


def test_a_trim_loses_to_one_that_came_first(url: str) -> None:
    create_redis_stream(url, "k INT")
    write_seconds(url, range(30), per_flush=10)
    stream = open_redis_stream(url)
    stale = TrimState()

    def late(units: Any, prev: TrimState) -> TrimState:
        assert prev == stale
        apply_retention(open_redis_stream(url), before_us=25 * S)  # another trim meanwhile
        return TrimState(start=10, row_max_us=9 * S)

    assert stream.trim_partition(0, late) is None
    assert open_redis_stream(url).start_offset(0) == 20


def test_the_writer_applies_the_retention_and_ops_change_it(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark_rowtime.streams import retention as retention_module

    monkeypatch.setattr(retention_module, "CHECK_EVERY_S", 0.0)
    create_redis_stream(url, "k INT", retention="10 s")
    write_seconds(url, range(60), per_flush=5)
    assert open_redis_stream(url).start_offset(0) == 45
    stream = open_redis_stream(url)
    stream.set_retention(Retention(3 * S))
    assert open_redis_stream(url).retention() == Retention(3 * S)
    write_seconds_from(url, 60, 70)
    assert open_redis_stream(url).start_offset(0) == 66  # runs of one row: all before 66 s


def write_seconds_from(url: str, a: int, b: int) -> None:
    with pr.open_writer(url, 0) as w:
        for sec in range(a, b):
            w.insert({"k": sec}, rowtime=sec * 1000)
            w.flush()


def test_what_redis_cannot_do_is_refused_before_it_is_stored(url: str, server: RedisServer) -> None:
    with pytest.raises(OptionError, match="retention_size is not supported on Redis"):
        create_redis_stream(url, "k INT", retention_size="1 GiB")
    stream = create_redis_stream(url, "k INT")
    with pytest.raises(OptionError, match="retention_size"):
        stream.set_retention(Retention(size_bytes=1 << 20))
    assert not stream.retention().active
    ext = server.url(f"x{next(_names)}")
    with pytest.raises(OptionError, match="others write"):
        register_external(ext, "k INT", ["src"], retention="1 day")


@pytest.mark.parametrize("defaults", POLICIES, ids=lambda d: "-".join(map(str, d.values())))
def test_reads_of_a_trimmed_redis_stream_equal_the_untrimmed_ones(
    server: RedisServer, tmp_path: Path, defaults: dict[str, Any]
) -> None:
    rng = random.Random(7 + len(str(defaults)))
    compared = trimmed = 0
    for case in range(4):
        name = next(_names)
        a, b = server.url(f"a{name}"), server.url(f"b{name}")
        partitions = rng.choice([1, 2])
        seed = rng.randrange(10**9)
        for location in (a, b):  # the same records twice: one is trimmed
            write_random(location, random.Random(seed), defaults, partitions, end=case == 0)
        stream = open_redis_stream(b)
        top = max(s.max_rowtime_us or 0 for s in stream.partition_stats(0))
        apply_retention(stream, before_us=rng.randrange(1_000_000_000, top + 2))
        kept = [stream.start_offset(p) for p in range(partitions)]
        trimmed += sum(kept)
        for read in READS:
            want, got = batch(a, read), batch(b, read)
            for p, start in enumerate(kept):
                # written twice: the arrival times differ, and nothing else
                mine = [{**r, "arrival": None} for r in got[p]]
                theirs = [{**r, "arrival": None} for r in restricted(want[p], start)]
                assert mine == theirs, (case, read, p, start)
                compared += len(got[p])
    assert trimmed > 50 and compared > 100

"""The Redis Streams connector against a real redis-server: entries other programs XADD reach a
rowtime stream (a folder or a redis:// stream) with mapped fields, rowtimes and bounds, bad
entries are kept naming key and entry ID, and a SIGKILL of `rowtime connect` loses and repeats
nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis_server import RedisServer, redis_server

from pyspark_rowtime.connectors.feed import committed_state
from pyspark_rowtime.connectors.run import build
from pyspark_rowtime.streams.catalog import load_catalog
from pyspark_rowtime.streams.storage import open_stream

SECRET = "Conn-Secret-9"
ENV = "ROWTIME_TEST_REDIS_PW"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis-connect"), password=SECRET) as s:
        yield s


@pytest.fixture
def secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, SECRET)


_n = iter(range(10**6))

CATALOG = """
[streams.orders]
location = "{location}"
schema = "ticker STRING, qty INT"
{password}

[connectors.in]
kind = "redis"
stream = "orders"
source = "redis://{host}:{port}/0/{key}"
password_env = "{env}"
fields = {{ qty = "quantity" }}
rowtime_field = "ts"
batch_rows = 50
poll = "20ms"
log_every = "100ms"
bounds = {{ strategy = {strategy} }}
{state}
"""


def _catalog(
    tmp_path: Path,
    server: RedisServer,
    key: str,
    *,
    strategy: str = '"source"',
    target: str | None = None,
) -> str:
    location = target or "data/orders"
    text = CATALOG.format(
        location=location.replace(f":{SECRET}@", "@"),
        password=f'password_env = "{ENV}"' if target else "",
        host=server.host,
        port=server.port,
        key=key,
        env=ENV,
        strategy=strategy,
        state='state = "state/in"' if target else "",
    )
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    return str(path)


def _drain(source) -> None:
    while source.step():
        pass


def _records(location: str) -> list[dict]:
    stream = open_stream(location)
    return stream.read(0, 0, stream.end_offset(0)).to_pylist()


def test_entries_reach_the_stream_with_mapped_fields_rowtimes_and_source_bounds(
    tmp_path: Path, server: RedisServer, secret: None
) -> None:
    key = f"orders:in:{next(_n)}"
    client = server.client()
    client.xadd(key, {"ticker": "A", "quantity": "1", "ts": "1000"})
    client.xadd(key, {"ticker": "B", "quantity": "2", "ts": "2000"})
    bad = client.xadd(key, {"ticker": "C", "quantity": "many", "ts": "2500"})
    client.xadd(key, {"rowtime_bound": "3000"})
    client.xadd(key, {"ticker": "D", "quantity": "4", "ts": "3500"})
    catalog = _catalog(tmp_path, server, key)
    feed, source = build(load_catalog(catalog), "in")
    _drain(source)
    feed.close(feed.position)
    records = _records(str(tmp_path / "data" / "orders"))
    got = [
        ("bound" if r["__is_bound"] else r["ticker"], r["qty"], r["__rowtime_us"] // 1000)
        for r in records
    ]
    assert got == [("A", 1, 1000), ("B", 2, 2000), ("bound", None, 3000), ("D", 4, 3500)]
    rejects = [json.loads(x) for x in Path(feed.dir, "rejected.jsonl").read_text().splitlines()]
    assert len(rejects) == 1 and rejects[0]["kind"] == "bad"
    assert bad.decode() in rejects[0]["source"] and key in rejects[0]["source"]
    assert rejects[0]["row"]["quantity"] == "many"
    assert SECRET not in Path(catalog).read_text() + json.dumps(rejects)
    assert feed.stats.discarded == 1 and feed.stats.rows == 3


def test_without_a_rowtime_field_the_entry_id_time_is_the_rowtime_into_a_redis_stream(
    tmp_path: Path, server: RedisServer, secret: None
) -> None:
    key = f"orders:in:{next(_n)}"
    client = server.client()
    ids = [client.xadd(key, {"ticker": f"T{i}", "quantity": str(i)}) for i in range(5)]
    target = server.url(f"target{next(_n)}")
    catalog = _catalog(tmp_path, server, key, target=target, strategy='"none"')
    Path(catalog).write_text(Path(catalog).read_text().replace('rowtime_field = "ts"\n', ""))
    feed, source = build(load_catalog(catalog), "in")
    _drain(source)
    feed.close(feed.position)
    rows = [r for r in _records(target) if not r["__is_bound"]]
    assert [r["qty"] for r in rows] == list(range(5))
    assert [r["__rowtime_us"] for r in rows] == [int(i.split(b"-")[0]) * 1000 for i in ids]
    # The position is the last entry ID: a restart reads nothing again.
    feed, source = build(load_catalog(catalog), "in")
    assert feed.position == {"id": ids[-1].decode()}
    assert source.step() is False
    feed.close(feed.position)
    assert len([r for r in _records(target) if not r["__is_bound"]]) == 5


def test_a_password_in_the_source_url_is_refused(tmp_path: Path, server: RedisServer) -> None:
    catalog = _catalog(tmp_path, server, "k")
    text = (
        Path(catalog)
        .read_text()
        .replace(f"redis://{server.host}", f"redis://:{SECRET}@{server.host}")
    )
    Path(catalog).write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "pyspark_rowtime.cli", "catalog", "check", catalog],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "connectors.in.source" in proc.stderr and SECRET not in proc.stderr


def test_sigkill_during_ingestion_then_restart_loses_and_repeats_nothing(
    tmp_path: Path, server: RedisServer
) -> None:
    key = f"orders:in:{next(_n)}"
    catalog = _catalog(tmp_path, server, key, strategy='"lateness", lateness = "50ms"')
    client = server.client()
    total = 1500
    stop = threading.Event()

    def produce() -> None:  # another program XADDs while the connector runs and dies
        for i in range(total):
            # a little disorder (within the lateness) so that rows sit in the holding buffer
            ts = 1_000_000 + i * 10 - (i % 3) * 7
            client.xadd(key, {"ticker": f"T{i}", "quantity": str(i), "ts": str(ts)})
            if i % 25 == 0:
                time.sleep(0.05)
            if stop.is_set():
                return

    env = {**os.environ, ENV: SECRET}
    producer = threading.Thread(target=produce)
    producer.start()
    kills = 0
    try:
        for delay in (0.3, 0.5, 0.2):
            proc = subprocess.Popen(
                [sys.executable, "-m", "pyspark_rowtime.cli", "connect", catalog, "in"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            assert "feeding" in proc.stderr.readline()
            proc.stderr.readline()  # its first interval line: it is ingesting
            time.sleep(delay)  # killed while entries come in (and rows are held)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            kills += 1
    finally:
        producer.join(60)
        stop.set()
    location = str(tmp_path / "data" / "orders")
    written_before_last_start = len(_records(location))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyspark_rowtime.cli", "connect", catalog, "in"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    first = proc.stderr.readline()
    assert "feeding" in first, first
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        progress = json.loads(
            (Path(location) / "_rowtime_connect" / "in" / "progress.json").read_text()
        )
        state = committed_state(progress, open_stream(location).end_offset(0))
        last = client.xrevrange(key, "+", "-", count=1)[0][0].decode()
        if (state["position"] or {}).get("id") == last:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, first + err
    assert "stopped" in err.splitlines()[-1]
    rows = [r["qty"] for r in _records(location) if not r["__is_bound"]]
    assert kills == 3 and written_before_last_start > 0
    assert sorted(rows) == list(range(total)), "entries lost or repeated"

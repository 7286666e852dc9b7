"""The fault proxy (tests/fault_proxy.py) does what the fault tests rely on, against a real
redis-server: a reset keeps the request from the server, a lost reply comes after the server
applied the request, a cut reply is a prefix of the answer, latency only delays, and a seed
replays the same faults."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_proxy import FaultProxy, Faults
from redis_server import RedisServer, redis_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(Path(tmp_path_factory.mktemp("redis"))) as s:
        yield s


def _incr(port: int, key: str) -> bytes:
    """INCR ``key`` on a new connection through ``port``; the raw answer (b"" if none)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"*2\r\n$4\r\nINCR\r\n${len(key)}\r\n{key}\r\n".encode())
        out = b""
        try:
            while not out.endswith(b"\r\n"):
                chunk = s.recv(64)
                if not chunk:
                    break
                out += chunk
        except ConnectionResetError:
            pass
        return out


def _value(server: RedisServer, key: str) -> int:
    return int(server.client().get(key) or 0)


def test_a_reset_never_reaches_the_server(server: RedisServer) -> None:
    with FaultProxy(server.port, seed=1, faults=Faults(reset=1.0)) as proxy:
        assert _incr(proxy.port, "reset") == b""
    assert _value(server, "reset") == 0
    assert proxy.counts["reset"] == 1


def test_a_dropped_reply_comes_after_the_server_applied_the_request(server: RedisServer) -> None:
    with FaultProxy(server.port, seed=1, faults=Faults(drop=1.0)) as proxy:
        assert _incr(proxy.port, "drop") == b""
    assert _value(server, "drop") == 1  # applied, its answer lost
    assert proxy.counts["drop"] == 1


def test_a_cut_reply_is_a_prefix_of_the_answer(server: RedisServer) -> None:
    server.client().set("cut", 41_999)
    with FaultProxy(server.port, seed=1, faults=Faults(cut=1.0)) as proxy:
        got = _incr(proxy.port, "cut")
    assert b":42000\r\n".startswith(got) and len(got) < len(b":42000\r\n")
    assert _value(server, "cut") == 42_000


def test_latency_and_stalls_only_delay(server: RedisServer) -> None:
    with FaultProxy(server.port, seed=1, faults=Faults(stall=1.0, stall_s=0.3)) as proxy:
        t = time.monotonic()
        assert _incr(proxy.port, "slow") == b":1\r\n"
        assert time.monotonic() - t >= 0.3
        proxy.faults = Faults()  # pass everything through
        assert _incr(proxy.port, "slow") == b":2\r\n"
    assert proxy.counts["stall"] == 1 and proxy.counts["turns"] == 2


def test_one_connection_meets_a_fault_per_request_not_per_connection(server: RedisServer) -> None:
    """Keep-alive: several requests on one connection are several turns."""
    with FaultProxy(server.port, seed=1, faults=Faults(latency=1.0, latency_s=0.01)) as proxy:
        client = server.client()
        client.connection_pool.connection_kwargs["port"] = proxy.port
        client.connection_pool.reset()
        for _ in range(5):
            client.incr("turns")
        client.close()
    # redis-py's own hello (CLIENT SETINFO) are turns too: one each
    assert proxy.counts["turns"] == proxy.counts["latency"] >= 5


def test_the_same_seed_replays_the_same_faults(server: RedisServer) -> None:
    def run(seed: int) -> list[bool]:
        with FaultProxy(server.port, seed=seed, faults=Faults.mix(0.5)) as proxy:
            return [_incr(proxy.port, "seeded").startswith(b":") for _ in range(40)]

    first = run(7)
    assert run(7) == first
    assert run(8) != first
    assert 5 < first.count(False) < 35

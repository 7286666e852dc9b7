"""Writers through the fault proxy: what ``tests/test_faults_wire.py`` checks in CI and
``integration/soak_faults.py`` (``./dev soak faults``) repeats for minutes at rising rates.

:func:`write_through_faults` appends numbered records through a :class:`FaultProxy`, retrying
each failed flush as the contract of ``Writer.flush`` tells an adapter to, and checks every
error on the way (bounded in time, naming the store and the step, saying to call ``flush()``
again); :func:`ids` reads the stream back for the exactly-once check.
"""

from __future__ import annotations

import itertools
import os
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fault_proxy import FaultProxy, Faults
from objstore_servers import ObjectServer, set_environ

import pyspark_rowtime as pr
from pyspark_rowtime.streams.objstore.location import forget_stores
from pyspark_rowtime.streams.storage import open_stream

#: Short client timeouts, so that a stalled request fails in about a second.
FAST_TIMEOUTS = {
    "ROWTIME_STORE_TIMEOUT_S": "1",
    "ROWTIME_STORE_CONNECT_TIMEOUT_S": "1",
    "ROWTIME_STORE_RETRIES": "1",
    "ROWTIME_STORE_RETRY_TIMEOUT_S": "2",
}
#: What one failed flush may take at most with FAST_TIMEOUTS (a few requests, each bounded).
FLUSH_BOUND_S = 15.0


def seed() -> int:
    raw = os.environ.get("ROWTIME_FAULT_SEED")
    seed = int(raw) if raw else random.randrange(1 << 30)
    print(f"fault proxy seed {seed} (ROWTIME_FAULT_SEED={seed} replays it)")
    return seed


def port_of(server: ObjectServer) -> int:
    url = server.env.get("AWS_ENDPOINT_URL") or server.env["AZURE_STORAGE_ENDPOINT"]
    return int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])


@contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` for a while, the object stores this process made before
    and during it forgotten, so that the next ones read the variables anew."""
    try:
        with set_environ(values):
            forget_stores()
            yield
    finally:
        forget_stores()


@contextmanager
def through_proxy(server: ObjectServer, at_seed: int | None = None) -> Iterator[FaultProxy]:
    """A proxy in front of ``server`` (its faults drawn from ``at_seed``, else :func:`seed`),
    the object store clients of this process pointed at it (with FAST_TIMEOUTS) while the
    block runs."""
    port = port_of(server)
    with FaultProxy(port, seed() if at_seed is None else at_seed) as proxy:
        env = {
            k: v.replace(f"127.0.0.1:{port}", f"127.0.0.1:{proxy.port}")
            for k, v in server.env.items()
        }
        with environ({**env, **FAST_TIMEOUTS}):
            yield proxy
        print(proxy.summary())


def ids(url: str) -> list[int]:
    s = open_stream(url)
    return s.read(0, s.start_offset(0), s.end_offset(0)).column("id").to_pylist()


def flush_until_done(w: Any, store: str, proxy: FaultProxy, stats: dict[str, Any]) -> None:
    """flush() until it returns, checking each error: bounded in time, naming the store and
    the operation, and saying to call flush() again."""
    for _ in range(40):
        t = time.monotonic()
        try:
            w.flush()
            return
        except (ConnectionError, OSError) as e:
            took = time.monotonic() - t
            stats["raised"] += 1
            stats["slowest_s"] = max(stats["slowest_s"], took)
            text = str(e)
            assert took < FLUSH_BOUND_S, f"{proxy.summary()}: a flush took {took:.1f} s"
            assert store in text, text
            assert "flush() again" in text, text
            assert any(op in text for op in ("committing", "uploading", "appending", "reading")), (
                text
            )
    raise AssertionError(f"{proxy.summary()}: flush() never completed")


#: The faults that fail a request: a stall (3 s) outlasts FAST_TIMEOUTS' 1 s; latency (at most
#: 20 ms) only delays one.
BREAKING = ("reset", "drop", "cut", "stall")


def breaking(proxy: FaultProxy) -> int:
    """Turns whose request was reset or timed out, or whose reply was lost or cut."""
    return sum(proxy.counts[f] for f in BREAKING)


def write_through_faults(
    url: str,
    proxy: FaultProxy,
    store: str,
    flushes: int,
    per: int,
    rate: float,
    at_least: int = 0,
) -> dict[str, Any]:
    """``flushes`` appends of ``per`` records each with faults on about ``rate`` of the
    requests. After a failed flush, flush() is retried at once, or (half the time, decided
    by the seed) only after the next records were inserted: the retry then completes the
    failed append and commits the new records after it.

    With ``at_least``, appends go on past ``flushes`` (up to four times as many) until that
    many requests broke and at least one flush raised: what a test means to prove then
    happened whatever the seed drew. ``stats["flushes"]`` says how many appends there were;
    the stream then holds ids ``0 .. flushes * per - 1``."""
    rng = random.Random(proxy.seed)
    stats: dict[str, Any] = {"raised": 0, "slowest_s": 0.0, "deferred": 0, "flushes": 0}
    w = pr.open_writer(url)
    proxy.faults = Faults.mix(rate, stall=rate / 10, stall_s=3.0, latency_s=0.02)

    def more(f: int) -> bool:
        if f < flushes:
            return True
        enough = breaking(proxy) >= at_least and (stats["raised"] > 0 or not at_least)
        return not enough and f < 4 * flushes

    try:
        for f in itertools.count():
            if not more(f):
                break
            stats["flushes"] = f + 1
            for i in range(per):
                w.insert({"id": f * per + i})
            t = time.monotonic()
            try:
                w.flush()
            except (ConnectionError, OSError):
                took = time.monotonic() - t
                assert took < FLUSH_BOUND_S, f"{proxy.summary()}: a flush took {took:.1f} s"
                stats["slowest_s"] = max(stats["slowest_s"], took)
                stats["raised"] += 1
                if rng.random() < 0.5 and f + 1 < flushes:
                    stats["deferred"] += 1
                    continue  # the next flush retries it, with more records behind
                flush_until_done(w, store, proxy, stats)
        flush_until_done(w, store, proxy, stats)
    finally:
        proxy.faults = Faults()
        w.close()
    return stats

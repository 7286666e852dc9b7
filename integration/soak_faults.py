"""Writers through a faulty network for minutes: ``./dev soak faults [SECONDS]`` (default 600).

The long form of ``tests/test_faults_wire.py`` (which CI runs: 60 flushes at a fault rate of
0.2 per store). Here the fault proxy (``tests/fault_proxy.py``) stands in front of each real
server this machine runs (moto's S3 server, Azurite, redis-server), and round after round, store
after store, a writer appends numbered records through it at a rising fault rate (0.05, 0.1,
0.2, 0.3, 0.4, then again): resets before the server, replies lost after it applied the
request, replies cut halfway, stalls past the client's timeout, latency. Each failed flush is
retried as ``Writer.flush``'s contract tells an adapter to (at once, or after more records were
inserted), and each error is checked on the way: it came within the configured timeouts, named
the store and the step, and said to call ``flush()`` again (``fault_writes.flush_until_done``).

After each round its stream is read back straight from the server: every record once, in
order. After each cycle of rates (unless ``--no-spark``), Spark's round on each object store:
``integration/test_faults_spark.py``'s reader and sink in a child Spark through the proxy at a
tenth of the cycle's last rate, restarted from its checkpoint until a run finishes; every row
once, the clock never back, each failure naming the store and the step. A line per round says
what was injected and what was checked; the last line is a JSON summary. Exits 1 at the
first round that loses or doubles a record, or whose error broke the contract, printing its
seed (``ROWTIME_FAULT_SEED=N`` replays the rounds from there).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

from fault_proxy import FaultProxy
from fault_writes import ids, through_proxy, write_through_faults
from objstore_servers import (
    azurite_server,
    moto_server,
    why_no_azurite,
    why_no_moto,
)
from redis_server import redis_server, why_no_server

import pyspark_rowtime as pr

#: The fault rates of the rounds, again and again until the time is up.
RATES = (0.05, 0.1, 0.2, 0.3, 0.4)
#: Appends per round and records per append.
FLUSHES, PER = 40, 100


def _round(store: str, server: Any, rate: float, seed: int, flushes: int) -> dict[str, Any]:
    """One round: a fresh stream, ``flushes`` appends through the proxy at ``rate``, read
    back straight from the server."""
    if store == "redis":
        url = server.url(f"soak-{uuid.uuid4().hex[:8]}")
        pr.create_stream(url, "id BIGINT")
        with FaultProxy(server.port, seed) as proxy:
            via = url.replace(f":{server.port}/", f":{proxy.port}/")
            stats = write_through_faults(
                f"{via}?socket_timeout=1s&retries=0", proxy, "Redis", flushes, PER, rate
            )
            summary = proxy.summary()
    else:
        url = server.url("soak")
        pr.create_stream(url, "id BIGINT")
        with through_proxy(server, seed) as proxy:
            stats = write_through_faults(url, proxy, "object store", flushes, PER, rate)
            summary = proxy.summary()
    got = ids(url)
    exact = got == list(range(stats["flushes"] * PER))
    return {
        "store": store,
        "rate": rate,
        "seed": seed,
        "proxy": summary,
        "flushes_raised": stats["raised"],
        "retried_after_more_inserts": stats["deferred"],
        "slowest_failed_flush_s": round(stats["slowest_s"], 2),
        "records": len(got),
        "distinct": len(set(got)),
        "exactly_once_in_order": exact,
    }


def _spark_round(server: Any, rate: float, seed: int, work: Path) -> str:
    """Spark's round (see the module's docstring): a line of what happened."""
    from test_faults_spark import spark_through_faults

    summary, failures = spark_through_faults(server, rate, seed, work)
    return f"{summary}  Spark: {len(failures)} failed runs restarted, every row once"


def main(
    seconds: float, rates: tuple[float, ...] = RATES, flushes: int = FLUSHES, spark: bool = True
) -> int:
    """Rounds at each of ``rates`` in turn on every store, at least one cycle, until
    ``seconds`` have passed; 0 when every round held, else 1."""
    start = time.monotonic()
    first_seed = int(os.environ.get("ROWTIME_FAULT_SEED", time.time_ns() % 10**6))
    work = Path(tempfile.mkdtemp(prefix="rowtime-soak-faults-"))
    totals: dict[str, Any] = {"rounds": 0, "records": 0, "flushes_raised": 0, "by_store": {}}
    with ExitStack() as stack:
        servers: dict[str, Any] = {}
        for store, why, start_server in (
            ("s3", why_no_moto(), lambda: moto_server()),
            ("az", why_no_azurite(), lambda: azurite_server(work / "azurite")),
            ("redis", why_no_server(), lambda: redis_server(work / "redis")),
        ):
            if why:
                print(f"soak faults: no {store}: {why}")
                continue
            server = stack.enter_context(start_server())
            if store != "redis":
                stack.enter_context(server.environ())
            servers[store] = server
        if not servers:
            print("soak faults: no server could start")
            return 1
        seeds = itertools.count(first_seed)
        for n, rate in enumerate(itertools.cycle(rates)):
            if spark and n and n % len(rates) == 0:  # a cycle ended: Spark's rounds
                for store, server in servers.items():
                    if store == "redis":
                        continue  # Redis's Spark case runs in the test's own session
                    seed = next(seeds)
                    try:
                        line = _spark_round(server, rates[-1] / 10, seed, work)
                    except AssertionError as e:
                        print(f"soak faults: FAILED (Spark on {store}): {str(e)[-3000:]}")
                        print(f"soak faults: replay with ROWTIME_FAULT_SEED={seed}")
                        return 1
                    totals["spark_rounds"] = totals.get("spark_rounds", 0) + 1
                    print(
                        f"{time.monotonic() - start:6.0f} s  {store:5s} Spark at "
                        f"{rates[-1] / 10:.3f}  {line}",
                        flush=True,
                    )
            if time.monotonic() - start >= seconds and n >= len(rates):
                break
            for store, server in servers.items():
                seed = next(seeds)
                try:
                    r = _round(store, server, rate, seed, flushes)
                except AssertionError as e:  # an error broke the contract (fault_writes)
                    print(f"soak faults: FAILED ({store}, rate {rate}): {e}")
                    print(f"soak faults: replay with ROWTIME_FAULT_SEED={seed}")
                    return 1
                totals["rounds"] += 1
                totals["records"] += r["records"]
                totals["flushes_raised"] += r["flushes_raised"]
                totals["by_store"][store] = totals["by_store"].get(store, 0) + 1
                print(
                    f"{time.monotonic() - start:6.0f} s  {store:5s} rate {rate:.2f}  "
                    f"{r['proxy']}  flushes raised {r['flushes_raised']:2d} (retried after more "
                    f"inserts {r['retried_after_more_inserts']}), slowest "
                    f"{r['slowest_failed_flush_s']} s  -> {r['records']} records, "
                    f"{'each once, in order' if r['exactly_once_in_order'] else 'WRONG'}",
                    flush=True,
                )
                if not r["exactly_once_in_order"]:
                    print(f"soak faults: FAILED, replay with ROWTIME_FAULT_SEED={seed}")
                    print(json.dumps(r))
                    return 1
    totals["seconds"] = round(time.monotonic() - start)
    print(json.dumps(totals))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("seconds", nargs="?", type=float, default=600.0)
    parser.add_argument("--rates", default=",".join(str(r) for r in RATES))
    parser.add_argument("--flushes", type=int, default=FLUSHES, help="appends per round")
    parser.add_argument(
        "--spark",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Spark's rounds on the object stores after each cycle of rates",
    )
    args = parser.parse_args()
    rates = tuple(float(r) for r in args.rates.split(","))
    sys.exit(main(args.seconds, rates, args.flushes, args.spark))

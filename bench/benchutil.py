"""What the benchmarks share: best-of timing, the Spark session they measure in, the rowtime
streams they read, draining a query, and interleaved rounds of ours beside Spark's.

``./dev bench NAME`` puts this folder on PYTHONPATH."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from pyspark_rowtime.windows.stateful import KeyLogic, KeyStep
from pyspark_rowtime.windows.step import StateFormat

#: The streams the window benchmarks write: 2 partitions, ~10,000 rows per second of event
#: time each, from this instant.
PARTITIONS = 2
CHUNK = 1_000_000
START_US = 1_700_000_000_000_000
STEP_US = 100
WORDS = ("ORCL", "MSFT", "IBM", "SAP", "AAPL", "GOOG", "AMZN", "META")


def write_json(folder: str, name: str, doc: object) -> str:
    """Write ``doc`` as ``folder/name`` (the folder made if absent); returns the path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    return path


def timed(runs: list[dict[str, Any]], case: str, name: str, query: Callable[[], Any]) -> Any:
    """``query``, each run's seconds, rows out and load kept in ``runs`` (for the JSON)."""

    def run() -> tuple[float, int]:
        before = os.getloadavg()[0]
        seconds, out = query()
        runs.append({"case": case, "query": name, "seconds": seconds, "rows_out": out,
                     "load_before": before, "load_after": os.getloadavg()[0]})  # fmt: skip
        return seconds, out

    return run


def round_ratios(runs: list[dict[str, Any]], case: str, ours: str = "rowtime") -> list[float]:
    """Spark's seconds over ``ours`` of each measured round of ``case`` (round 0, the warm-up,
    left out), from the runs :func:`timed` kept."""
    seconds = {q: [r["seconds"] for r in runs if r["case"] == case and r["query"] == q]
               for q in ("spark", ours)}  # fmt: skip
    return [s / o for s, o in zip(seconds["spark"][1:], seconds[ours][1:], strict=True)]


def verdict(label: str, ratios: list[float], target: float) -> tuple[float, bool]:
    """The median of ``ratios`` and whether it meets ``target``, printed as the benches print
    it: ``label: ratio 0.83 (rounds 0.81, 0.86, 0.79), target >= 0.8: ok``."""
    median = statistics.median(ratios)
    ok = median >= target
    rounds = ", ".join(f"{x:.2f}" for x in ratios)
    print(f"{label}: ratio {median:.2f} (rounds {rounds}), target >= {target}: "
          f"{'ok' if ok else 'MISS'}", flush=True)  # fmt: skip
    return median, ok


def run_meta(runs: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """A result file's ``meta``: ``fields``, then the machine's cores, the lowest and highest
    load the runs saw and the date (what ``tests/test_docs_pages.py`` reads)."""
    loads = [x for r in runs for x in (r["load_before"], r["load_after"])]
    return {**fields, "cpus": os.cpu_count(), "load_min": min(loads), "load_max": max(loads),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip


def best_of(fn: Callable[[], object], repeat: int = 3) -> float:
    """The fastest of ``repeat`` runs of ``fn``, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def spark_session(
    app: str, master: str = "local[2]", jfr: str | None = None, java_options: str = ""
) -> Any:
    """local[2] (or ``master``) with the settings every benchmark uses (UTC, 2 shuffle
    partitions, no UI). ``jfr``: record the JVM with Java Flight Recorder's ``profile``
    settings into that file (written when the session stops; read it with
    ``bench/jfr_summary.py``). In local mode the driver's JVM runs the tasks too.
    ``java_options``: more options for that JVM (``-Dname=value ...``)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    options = java_options
    if jfr is not None:
        options += f" -XX:StartFlightRecording=filename={jfr},settings=profile,dumponexit=true"
    if options.strip():
        builder = builder.config("spark.driver.extraJavaOptions", options.strip())
    spark = (
        builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "4g")
        # A Python worker has 15 s to connect back by default; with the machine's load above
        # 20 (other jobs) that failed queries mid-benchmark.
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def write_stream(path: str, rows: int, *, seed: int = 0, keys: int | None = None) -> None:
    """A rowtime stream of ``rows`` rows in :data:`PARTITIONS` partitions, ended: id BIGINT
    (distinct), v DOUBLE (uniform in [0, 1)), s STRING (one of :data:`WORDS`) and, with
    ``keys``, k BIGINT (uniform in [0, keys)); partition ``p``'s row ``i`` at ``START_US + i *
    STEP_US``, random values from seed ``seed * 10 + p``."""
    import numpy as np
    import pyarrow as pa

    import pyspark_rowtime as pr

    words = np.array(WORDS)
    schema = "id BIGINT, v DOUBLE, s STRING" + (", k BIGINT" if keys else "")
    pr.create_stream(path, schema, partitions=PARTITIONS)
    per_partition = rows // PARTITIONS
    for p in range(PARTITIONS):
        rng = np.random.default_rng(seed * 10 + p)
        with pr.open_writer(path, p) as w:
            for first in range(0, per_partition, CHUNK):
                n = min(CHUNK, per_partition - first)
                t = START_US + np.arange(first, first + n, dtype=np.int64) * STEP_US
                s = words[rng.integers(0, len(words), n)]
                columns = {
                    "id": np.arange(first, first + n, dtype=np.int64) * PARTITIONS + p,
                    "v": rng.random(n),
                    "s": pa.array(s.tolist(), pa.string()),
                }
                if keys:
                    columns["k"] = rng.integers(0, keys, n)
                columns["rowtime"] = pa.array(t, pa.int64()).view(pa.timestamp("us", tz="UTC"))
                w.insert_arrow(pa.table(columns), rowtime_column="rowtime")
            w.end_stream()


def drain(df: Any, root: str) -> tuple[float, int]:
    """Seconds to drain a streaming ``df`` into noop with ``availableNow`` (a checkpoint under
    ``root``, removed after), and the rows it wrote."""
    checkpoint = os.path.join(root, "checkpoints", uuid.uuid4().hex)
    t0 = time.perf_counter()
    q = (
        df.writeStream.format("noop")
        .outputMode("append")
        .trigger(availableNow=True)
        .option("checkpointLocation", checkpoint)
        .start()
    )
    q.awaitTermination()
    seconds = time.perf_counter() - t0
    out = sum(p["sink"].get("numOutputRows", 0) or 0 for p in q.recentProgress)
    shutil.rmtree(checkpoint, ignore_errors=True)
    return seconds, out


#: A query of a comparison: runs it once, returns (seconds, rows out; -1: not counted).
Query = Callable[[], tuple[float, int]]


def interleaved(
    cases: Mapping[str, Mapping[str, Query]],
    rounds: int,
    rows_in: Mapping[str, int],
    *,
    base: str = "spark",
    ours: str = "rowtime",
) -> dict[str, float]:
    """Run each case's queries ``rounds`` times after one warm-up round, interleaved: every
    round runs every case, and within a case the queries in alternating order (the first of a
    round is the last of the next), so a change in the machine's load meets both. Prints each
    round with the load average, then per query the median input rows/s over the measured
    rounds with their spread (min-max) and the rows out, and per case the ratio ``ours`` /
    ``base`` (per round, then its median, with its spread). Returns the median ratio per
    case. ``rows_in``: the input rows of one run of each case."""
    if rounds < 1:
        raise ValueError(f"rounds={rounds}: at least one measured round")
    rates: dict[tuple[str, str], list[float]] = {(c, n): [] for c in cases for n in cases[c]}
    ratios: dict[str, list[float]] = {c: [] for c in cases}
    outputs: dict[tuple[str, str], int] = {}
    for r in range(rounds + 1):  # round 0 warms up
        parts = []
        for case, queries in cases.items():
            order = list(queries) if r % 2 else list(reversed(queries))
            this: dict[str, float] = {}
            for name in order:
                seconds, out = queries[name]()
                this[name] = rows_in[case] / seconds
                outputs[(case, name)] = out
            if r:
                for name in queries:
                    rates[(case, name)].append(this[name])
                ratios[case].append(this[ours] / this[base])
            parts.append(
                f"{case}: "
                + ", ".join(f"{name} {this[name] / 1e6:.3f}" for name in queries)
                + f" M rows/s, ratio {this[ours] / this[base]:.2f}"
            )
        # The machine may be shared: the load beside every round tells how far to trust it.
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        warm = " (warm-up)" if not r else ""
        print(f"round {r}{warm}: " + "; ".join(parts) + f"; load average {load}", flush=True)
    width = max(len(c) for c in cases) + 2
    print(f"{'case':<{width}}{'query':<9}{'median M rows/s':>17}{'spread':>16}{'rows out':>12}")
    for (case, name), xs in rates.items():
        out = outputs[(case, name)]
        print(
            f"{case:<{width}}{name:<9}{statistics.median(xs) / 1e6:17.3f}"
            f"{f'{min(xs) / 1e6:.3f}-{max(xs) / 1e6:.3f}':>16}"
            f"{(f'{out:,}' if out >= 0 else 'batch'):>12}"
        )
    medians = {}
    for case, xs in ratios.items():
        medians[case] = statistics.median(xs)
        print(
            f"ratio {ours}/{base}, {case}: median {medians[case]:.2f} "
            f"(spread {min(xs):.2f}-{max(xs):.2f}, {len(xs)} rounds)"
        )
    return medians


class ConsumeOnly(KeyLogic[Any]):
    """The ``floor`` queries' step: takes every frame, emits nothing, keeps nothing."""

    def __init__(self, logic: KeyLogic[Any]) -> None:
        self.format = logic.format

    def step(self, key: Any, frames: Any, state: Any, watermark_ms: int) -> KeyStep[Any]:
        for _ in frames:
            pass
        return KeyStep([], None, None)


#: The state of a ``ConsumeThenWake`` key: the latest rowtime it took (ms).
WAKE_FORMAT: StateFormat[int] = StateFormat("a floor key", 1, int, {1: int})


class ConsumeThenWake(KeyLogic[int]):
    """The ``wake`` queries' step: takes every frame and emits nothing, as ``ConsumeOnly``,
    but keeps the latest rowtime a key took and asks to be woken once the watermark passes
    it, then keeps nothing: the two calls per key (its rows, then its timer) that an operator
    pays which emits something only once the watermark passes it (the left join's rows that
    met nothing)."""

    format = WAKE_FORMAT

    def __init__(self, logic: KeyLogic[Any]) -> None:
        pass

    def step(self, key: Any, frames: Any, state: Any, watermark_ms: int) -> KeyStep[int]:
        latest = None
        for frame in frames:
            if len(frame):
                top = int(frame["__t"].max()) // 1000
                latest = top if latest is None else max(latest, top)
        if latest is None:  # the timer: the key is done
            return KeyStep([], None, None)
        latest = max(latest, state or latest)
        return KeyStep([], latest, max(latest, watermark_ms + 1))


@contextmanager
def consume_only(
    module: Any, name: str, logic: type[KeyLogic[Any]] = ConsumeOnly
) -> Iterator[None]:
    """While an operator is defined, its logic class ``module.name`` makes ``logic`` steps
    (``ConsumeOnly``, or ``ConsumeThenWake``; the rest of its plan as it is)."""
    real = getattr(module, name)
    setattr(module, name, lambda config: logic(real(config)))
    try:
        yield
    finally:
        setattr(module, name, real)

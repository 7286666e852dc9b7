"""Keys by the bucket on Spark (``spark.rowtime.state.buckets``, ``windows/stateful.py``).

With the setting, the operators group their keys into buckets of Spark's state store: the left
overlap join gives the brute force's answer (null rows in a batch whose watermark reached their
end) across a restart from its checkpoint, ``interval_aggregate`` gives what it gives per key,
row for row, and a checkpoint started with one bucket count refuses to go on with another,
naming the setting it needs; a bad value is refused before anything starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers import Run, drain, plain, reader, start, write_rows
from pyspark.sql import functions as F
from test_intervals import check_left_join, iso_us, make_rounds, run_rounds

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.errors import OptionError
from pyspark_rowtime.bounds.intervals import INFINITY_US
from pyspark_rowtime.windows.stateful import BUCKETS_CONF

#: Spark's watermark (ms) once every input ended.
END_MS = INFINITY_US // 1000 - 1


@contextmanager
def buckets(spark: Any, value: object) -> Iterator[None]:
    """The session with ``spark.rowtime.state.buckets`` set while the query is defined."""
    spark.conf.set(BUCKETS_CONF, str(value))
    try:
        yield
    finally:
        spark.conf.unset(BUCKETS_CONF)


def left_join(spark: Any, a: Path, b: Path) -> Any:
    left = reader(spark, a, **{"interval.duration": "1 second"})
    right = reader(spark, b, **{"interval.count": "1"})
    return pr.overlap_join(left, right, "k", how="left")


def test_left_join_in_buckets_against_brute_force_with_a_restart(spark: Any, workdir: Path) -> None:
    """Five keys in three buckets, a restart from the checkpoint after round 3: every pair
    once, every left row that met none once, never before both clocks passed its end."""
    rounds = [make_rounds(41, 2, n_rounds=6, keys=5), make_rounds(42, 1, n_rounds=6, keys=5)]
    a, b = workdir / "a", workdir / "b"
    pr.create_stream(str(a), "p int, i long, k string", partitions=2)
    pr.create_stream(str(b), "p int, i long, k string", partitions=1)
    with buckets(spark, 3):
        df = left_join(spark, a, b)
    run = run_rounds(df, [a, b], rounds, workdir / "chk", stop_after=3)
    lrows = plain(spark.read.format("rowtime").option("interval.duration", "1").load(str(a)))
    rrows = plain(spark.read.format("rowtime").option("interval.count", "1").load(str(b)))
    check_left_join(
        run, [r for r in lrows if not r["is_bound"]], [r for r in rrows if not r["is_bound"]]
    )


def emitted_per_key_and_in_buckets(
    spark: Any, workdir: Path, counts: tuple[int, ...], rounds: Any, define: Any, end: str
) -> list[list[tuple[Any, ...]]]:
    """For each bucket count, ``define(stream)`` over a new stream of ``rounds`` (a restart
    after round 2): every row it emitted (a batch run again after the restart counted once),
    each checked to come in a batch whose watermark reached its ``end`` column, never before.
    Which batch that is depends on when Spark runs its batches with no rows (a restart may
    leave one out), so the runs are compared by their rows; ``tests/test_state_buckets.py``
    holds the two layouts to the same batches where the watermarks are given."""
    out = []
    for n in counts:
        loc = workdir / f"s{n}"
        pr.create_stream(str(loc), "p int, i long, k string", partitions=2)
        with buckets(spark, n):
            df = define(loc)
        run = run_rounds(df, loc, rounds, workdir / f"chk{n}", stop_after=2)
        watermark = {p["batchId"]: iso_us(p["eventTime"]["watermark"]) for p in run.progress}
        rows = []
        for b, batch in dict(run.batches).items():
            for r in batch:
                assert r[end] <= watermark[b] or watermark[b] // 1000 >= END_MS, (n, b, r)
                rows.append(tuple(sorted(r.items())))
        out.append(sorted(rows))
    return out


def test_interval_aggregate_in_buckets_gives_what_it_gives_per_key(
    spark: Any, workdir: Path
) -> None:
    def define(loc: Path) -> Any:
        return pr.interval_aggregate(
            reader(spark, loc, **{"interval.duration": "1500 milliseconds"}),
            {"n": "count(*)", "total": "sum(i)", "first": "min(i)"},
            partition_by="k",
        )

    per_key, bucketed = emitted_per_key_and_in_buckets(
        spark, workdir, (0, 4), make_rounds(7, 2, n_rounds=5, keys=6), define, "rowtime_end"
    )
    assert len(per_key) >= 10, "the scenario has stretches"
    assert bucketed == per_key


def run_only(df: Any, checkpoint: Path) -> None:
    """Start ``df`` from ``checkpoint`` and drain it, writing nothing."""
    run = Run()
    query = start(df, checkpoint, run)
    try:
        drain(query, run)
    finally:
        query.stop()


def test_a_checkpoint_goes_on_with_its_own_bucket_count_only(spark: Any, workdir: Path) -> None:
    """Started with 3 buckets: refused with 5, naming 3, and refused per key (Spark: the state
    store's key is not the same); started per key, as every checkpoint of 0.1.0 and 0.2.0:
    refused in buckets. Nothing is committed by a refused batch."""
    rounds = [make_rounds(51, 2, n_rounds=2, keys=5), make_rounds(52, 1, n_rounds=2, keys=5)]
    first, second = [[r[0]] for r in rounds], [[r[1]] for r in rounds]
    streams = []
    for name in ("bucketed", "per-key"):
        a, b = workdir / f"{name}_a", workdir / f"{name}_b"
        pr.create_stream(str(a), "p int, i long, k string", partitions=2)
        pr.create_stream(str(b), "p int, i long, k string", partitions=1)
        streams.append((a, b))
    (a, b), (c, d) = streams
    with buckets(spark, 3):
        run_rounds(left_join(spark, a, b), [a, b], first, workdir / "chk3")
    with buckets(spark, 5):
        df = left_join(spark, a, b)
    with pytest.raises(Exception, match=f"{BUCKETS_CONF}=3 to go on from it"):
        run_rounds(df, [a, b], second, workdir / "chk3")
    with pytest.raises(Exception, match="STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"):
        run_only(left_join(spark, a, b), workdir / "chk3")
    with buckets(spark, 3):
        run_only(left_join(spark, a, b), workdir / "chk3")  # its own count goes on

    run_rounds(left_join(spark, c, d), [c, d], first, workdir / "chk0")
    with buckets(spark, 3):
        df = left_join(spark, c, d)
    with pytest.raises(Exception, match="STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE"):
        run_rounds(df, [c, d], second, workdir / "chk0")
    run_only(left_join(spark, c, d), workdir / "chk0")


@pytest.mark.connect("the refusal is raised in the client, before a plan is sent")
@pytest.mark.parametrize("value", ["-1", "many", str(2**21)])
def test_a_bad_bucket_count_is_refused_before_starting(
    spark: Any, workdir: Path, value: str
) -> None:
    loc = workdir / "s"
    pr.create_stream(str(loc), "p int, i long, k string", partitions=1)
    with buckets(spark, value), pytest.raises(OptionError, match=BUCKETS_CONF):
        pr.overlap_join(
            reader(spark, loc, **{"interval.count": "1"}),
            reader(spark, loc, **{"interval.count": "1"}),
            "k",
        )


@pytest.mark.spark_subset
@pytest.mark.parametrize("n", [0, 2])
def test_a_large_call_gives_exact_stretches(spark: Any, workdir: Path, n: int) -> None:
    """3,000 rows 1 ms apart, each valid 2 ms, and an end of stream: one call emits all 3,001
    stretches (in pandas' masked integer types from 1,024 rows on, which every Spark the
    project supports turns into its longs), each with the rows valid in it, exactly; with
    buckets as without."""
    loc = workdir / "s"
    pr.create_stream(str(loc), "k string, i long", partitions=1)
    t0 = 1_700_000_000 * 1_000_000
    rows = [({"k": "x", "i": 2**40 + i}, t0 + i * 1000) for i in range(3000)]
    write_rows(loc, 0, rows, end=True)
    with buckets(spark, n):
        df = pr.interval_aggregate(
            reader(spark, loc, **{"interval.duration": "2 milliseconds"}),
            {"n": "count(*)", "total": "sum(i)"},
            partition_by="k",
        )
    run = Run()
    query = start(df, workdir / "chk", run)
    drain(query, run)
    query.stop()
    got = sorted((r["rowtime"], r["n"], r["total"]) for r in run.records)
    expected = []
    for j in range(3001):  # [t0 + j ms, t0 + (j + 1) ms): rows j - 1 and j
        valid = [2**40 + i for i in (j - 1, j) if 0 <= i < 3000]
        expected.append((t0 + j * 1000, len(valid), sum(valid)))
    assert got == expected


def test_panes_in_buckets_give_what_they_give_per_key(spark: Any, workdir: Path) -> None:
    """``time_interval_aggregate``, sliding panes over six keys: the same panes, with the same
    values, each once its end is reached, per key and in buckets."""

    def define(loc: Path) -> Any:
        return pr.time_interval_aggregate(
            reader(spark, loc),
            F.count("*").alias("n"),
            F.sum("i").alias("total"),
            interval_duration=2,
            creation_period=1,
            partition_by="k",
        )

    per_key, bucketed = emitted_per_key_and_in_buckets(
        spark, workdir, (0, 3), make_rounds(11, 2, n_rounds=5, keys=6), define, "interval_end"
    )
    assert len(per_key) >= 10, "the scenario has panes"
    assert bucketed == per_key

"""interval_aggregate on Spark (SPEC 10, seed 001) against the relational answer at every instant.

Streams are written in rounds (ties, several keys, nulls, a quiet ending: bounds only after the
last rows, then the end of stream); after each round the query runs to quiescence. The
reference reads the finished stream in one batch read and, per key, looks at every instant:
the rows valid there, aggregated as SQL does, adjacent instants merged only when their sets of
rows are equal. A run stopped and restarted from its checkpoint must give the same rows.
"""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path
from typing import Any

import pytest
from helpers import US, Run, drain, plain, reader, start, stop_points, write_rows

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.errors import OptionError

T0 = 1_700_000_000 * US
AGGS = {
    "n": "count(*)",
    "n_v": "count(v)",
    "total": "sum(i)",
    "mean": "avg(v)",
    "low": "min(v)",
    "high": "max(k)",
    "first": "min(rowtime)",
}


def rounds(seed: int, partitions: int = 2, n_rounds: int = 5) -> list[list[Any]]:
    rnd = random.Random(seed)
    clocks = [T0] * partitions
    serial = 0
    out = []
    for r in range(n_rounds + 2):
        writes = []
        for p in range(partitions):
            rows = []
            if r < n_rounds:
                for _ in range(rnd.randint(0, 5)):
                    clocks[p] += rnd.choice([0, 500_000, US, 2 * US])
                    serial += 1
                    v = None if serial % 4 == 0 else serial * 0.5
                    rows.append(({"i": serial, "k": f"k{rnd.randrange(2)}", "v": v}, clocks[p]))
            clocks[p] += rnd.choice([0, US, 3 * US])  # after n_rounds: bounds only
            writes.append((p, rows, clocks[p], r == n_rounds + 1))
        out.append(writes)
    return out


def relational(rows: list[dict[str, Any]], key: str | None) -> list[tuple[Any, ...]]:
    out = []
    for k in sorted({r[key] for r in rows} if key else {None}):
        mine = [r for r in rows if key is None or r[key] == k]
        live = [r for r in mine if r["rowtime"] < r["rowtime_end"]]
        points = sorted({p for r in live for p in (r["rowtime"], r["rowtime_end"])})
        stretches: list[list[Any]] = []
        for a, b in itertools.pairwise(points):
            valid = frozenset(r["i"] for r in live if r["rowtime"] <= a < r["rowtime_end"])
            if not valid:
                continue
            if stretches and stretches[-1][1] == a and stretches[-1][2] == valid:
                stretches[-1][1] = b
            else:
                stretches.append([a, b, valid])
        for a, b, valid in stretches:
            rs = [r for r in live if r["i"] in valid]
            vs = [r["v"] for r in rs if r["v"] is not None]
            out.append(
                (
                    k,
                    a,
                    b,
                    len(rs),
                    len(vs),
                    sum(r["i"] for r in rs),
                    sum(vs) / len(vs) if vs else None,
                    min(vs) if vs else None,
                    max(r["k"] for r in rs),
                    min(r["rowtime"] for r in rs),
                )
            )
    return sorted(out, key=repr)


def got_rows(run: Run, key: str | None) -> list[tuple[Any, ...]]:
    return sorted(
        (
            (r[key] if key else None),
            r["rowtime"],
            r["rowtime_end"],
            r["n"],
            r["n_v"],
            r["total"],
            r["mean"],
            r["low"],
            r["high"],
            r["first"],
        )
        for r in run.records
    )


def same(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(sorted(got, key=repr), want, strict=True):
        for x, y in zip(g, w, strict=True):
            assert (x == y) or (isinstance(x, float) and math.isclose(x, y)), (g, w)


@pytest.mark.parametrize(("option", "key"), [("interval.duration", "k"), ("interval.count", None)])
def test_interval_aggregate_is_the_relational_answer_and_restarts_reproduce_it(
    spark: Any, workdir: Path, option: str, key: str | None
) -> None:
    value = "2.5 seconds" if option == "interval.duration" else "2"
    results = []
    plan = rounds(31)
    for stop_after in stop_points(2):
        location = workdir / f"s{stop_after}"
        pr.create_stream(str(location), "i long, k string, v double", partitions=2)
        df = pr.interval_aggregate(
            reader(spark, location, **{option: value}), AGGS, partition_by=key or ()
        )
        assert df.columns == [*([key] if key else []), *AGGS, "rowtime", "rowtime_end"]
        run = Run()
        query = start(df, workdir / f"chk{stop_after}", run)
        for r, writes in enumerate(plan):
            for p, rows, bound, end in writes:
                write_rows(location, p, rows, bound_us=bound, end=end)
            drain(query, run)
            if r == stop_after:
                query.stop()
                query = start(df, workdir / f"chk{stop_after}", run)
        query.stop()
        every = plain(spark.read.format("rowtime").option(option, value).load(str(location)))
        want = relational([r for r in every if not r["is_bound"]], key)
        assert len(want) > 10, "the scenario has stretches"
        got = got_rows(run, key)
        same(got, want)
        # Each stretch once, only after the watermark reached its end.
        watermark = {p["batchId"]: p["eventTime"].get("watermark") for p in run.progress}
        assert all(watermark.get(b) for b, rows in run.batches if rows)
        # The observed metric counts each stretch emitted, and no late row.
        metrics = [p["observedMetrics"]["interval_aggregate"] for p in run.progress
                   if "interval_aggregate" in p.get("observedMetrics", {})]  # fmt: skip
        assert sum(m["stretches"] for m in metrics) == len(got)
        assert sum(m["discarded_rows"] for m in metrics) == 0
        results.append(got)
    assert all(r == results[0] for r in results)


def test_interval_aggregate_state_stays_flat_on_a_long_stream(spark: Any, workdir: Path) -> None:
    """One key, 8 rounds of 20 rows a second apart, each valid 3 s: the key keeps the rows
    valid across the watermark and the round's rows, never the 160."""
    location = workdir / "long"
    pr.create_stream(str(location), "i long, k string, v double", partitions=1)
    df = pr.interval_aggregate(
        reader(spark, location, **{"interval.duration": "3 seconds"}), {"n": "count(*)"}
    )
    run = Run()
    query = start(df, workdir / "chk", run)
    for r in range(8):
        rows = [({"i": r * 20 + j, "k": "x", "v": 1.0}, T0 + (r * 20 + j) * US) for j in range(20)]
        write_rows(location, 0, rows, bound_us=T0 + (r * 20 + 20) * US)
        drain(query, run)
    query.stop()
    kept = [
        p["observedMetrics"]["interval_aggregate"]["max_rows_per_key"]
        for p in run.progress
        if "interval_aggregate" in p.get("observedMetrics", {}) and p["numInputRows"]
    ]
    assert len(kept) >= 5 and max(kept) <= 20 + 4, kept
    assert {r["n"] for r in run.records} == {1, 2, 3}  # up to 3 rows valid at once


def test_a_key_that_keeps_a_large_state_goes_on_after_a_restart(spark: Any, workdir: Path) -> None:
    """4,000 rows of one key in one micro-batch, each valid 2.5 s: the key keeps them all until
    the watermark reaches them, a state of about 100 KB, which Spark's state store keeps as
    text (``stateful.to_store``); the query restarts from its checkpoint, reads it back and
    ends with the relational answer."""
    location = workdir / "large"
    pr.create_stream(str(location), "i long, k string, v double", partitions=1)
    df = pr.interval_aggregate(
        reader(spark, location, **{"interval.duration": "2.5 seconds"}),
        {"n": "count(*)", "n_v": "count(v)", "total": "sum(i)", "mean": "avg(v)",
         "low": "min(v)", "high": "max(k)", "first": "min(rowtime)"},
    )  # fmt: skip
    rnd = random.Random(5)
    first = [({"i": j, "k": "x", "v": rnd.random()}, T0 + j * 1000) for j in range(4000)]
    later = [({"i": 4000 + j, "k": "x", "v": None}, T0 + 5 * US + j * US) for j in range(3)]
    run = Run()
    query = start(df, workdir / "chk", run)
    write_rows(location, 0, first, bound_us=T0 + 4 * US)
    drain(query, run)
    query.stop()
    kept = [p["observedMetrics"]["interval_aggregate"]["max_rows_per_key"] for p in run.progress
            if "interval_aggregate" in p.get("observedMetrics", {})]  # fmt: skip
    assert max(kept) >= 3000, kept  # the state the restart reads back is large
    query = start(df, workdir / "chk", run)
    write_rows(location, 0, later, bound_us=T0 + 9 * US, end=True)
    drain(query, run)
    query.stop()
    every = plain(
        spark.read.format("rowtime").option("interval.duration", "2.5 seconds").load(str(location))
    )
    want = relational([r for r in every if not r["is_bound"]], None)
    assert len(want) > 4000
    same(got_rows(run, None), want)


def test_interval_aggregate_refuses_bad_arguments_before_starting(
    spark: Any, workdir: Path
) -> None:
    location = workdir / "bad"
    pr.create_stream(str(location), "i long, k string, v double", partitions=1)
    df = reader(spark, location, **{"interval.duration": "1"})
    for kwargs, message in [
        ({"aggs": {"x": "median(v)"}}, "is not one of count"),
        ({"aggs": {"x": "sum(k)"}}, "sum needs numbers"),
        ({"aggs": {"x": "sum(nope)"}}, "is not an expression Spark accepts"),
        ({"aggs": {"n": "count(*)"}, "partition_by": "nope"}, "partition_by='nope'"),
        ({"aggs": {"k": "count(*)"}, "partition_by": "k"}, "also partition_by"),
    ]:
        with pytest.raises(OptionError, match=message):
            pr.interval_aggregate(df, **kwargs)
    with pytest.raises(OptionError, match="lacks the column"):
        pr.interval_aggregate(reader(spark, location), {"n": "count(*)"})
    assert not spark.streams.active


def test_interval_aggregate_takes_spark_columns_as_the_dict_gives_them(
    spark: Any, workdir: Path
) -> None:
    """The same aggregates said as Spark columns (a list, and one after another, as
    ``groupBy().agg(...)`` takes them) and as the dict: the same rows, in the same columns."""
    from pyspark.sql import functions as F

    location = workdir / "forms"
    pr.create_stream(str(location), "i long, k string, v double", partitions=2)
    columns = [
        F.count("*").alias("n"),
        F.count("v").alias("n_v"),
        F.sum("i").alias("total"),
        F.avg("v").alias("mean"),
        F.min("v").alias("low"),
        F.max("k").alias("high"),
        F.min("rowtime").alias("first"),
    ]
    forms = {
        "dict": lambda df: pr.interval_aggregate(df, AGGS, partition_by="k"),
        "list": lambda df: pr.interval_aggregate(df, columns, partition_by="k"),
        "args": lambda df: pr.interval_aggregate(df, *columns, partition_by="k"),
    }
    for writes in rounds(7, n_rounds=3):  # the whole stream first: one query at a time
        for p, rows, bound, end in writes:
            write_rows(location, p, rows, bound_us=bound, end=end)
    runs = {}
    for name, form in forms.items():
        df = form(reader(spark, location, **{"interval.duration": "2.5 seconds"}))
        assert df.columns == ["k", *AGGS, "rowtime", "rowtime_end"], name
        runs[name] = Run()
        query = start(df, workdir / f"chk-{name}", runs[name])
        try:
            drain(query, runs[name])
            drain(query, runs[name])  # the batch the last watermark runs
        finally:
            query.stop()
    got = {name: got_rows(run, "k") for name, run in runs.items()}
    assert len(got["dict"]) > 5, "the scenario has stretches"
    assert got["list"] == got["dict"]
    assert got["args"] == got["dict"]
    schemas = {name: [r.keys() for r in run.records[:1]] for name, run in runs.items()}
    assert schemas["list"] == schemas["dict"]


def test_interval_aggregate_refuses_columns_it_cannot_keep(spark: Any, workdir: Path) -> None:
    from pyspark.sql import functions as F

    location = workdir / "badcols"
    pr.create_stream(str(location), "i long, k string, v double", partitions=1)
    df = reader(spark, location, **{"interval.duration": "1"})
    for aggs, message in [
        ([F.max_by("i", "v").alias("m")], "is not one of count, sum, avg, min, max"),
        ([F.countDistinct("v").alias("m")], "not an aggregate the window can keep"),
        ([F.min(F.array("i")).alias("m")], "min takes numbers"),
        ([F.count("*").alias("rowtime")], "give it another name"),
        ([], "aggs is empty"),
        (["count(*)"], "is not a Spark Column"),
    ]:
        with pytest.raises(OptionError, match=message):
            pr.interval_aggregate(df, aggs)
    with pytest.raises(OptionError, match="not both"):
        pr.interval_aggregate(df, {"n": "count(*)"}, F.count("*").alias("m"))
    assert not spark.streams.active

"""Validity intervals on Spark (SPEC 10, seed 001): the reader's ``rowtime_end`` and
``overlap_join``, micro-batch after micro-batch, against brute force, restarts included.

Streams are written in rounds; after each round the query runs to quiescence
(``processAllAvailable``). Brute force works on the rows themselves: ``rowtime_end`` is the
rowtime plus the duration, or the rowtime of the N-th later row the partition emitted (the end
of stream when none follows); the join pairs every left row with every right row of the same
key whose validities overlap, valid in the intersection.
"""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import (
    LONG,
    US,
    Run,
    check_batches,
    drain,
    input_rows,
    observed,
    plain,
    reader,
    start,
    stop_points,
    write_rows,
)

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.errors import OptionError
from pyspark_rowtime.bounds.intervals import INFINITY_US, element_window_ends

T0 = 1_700_000_000 * US
Rounds = list[list[tuple[int, list[tuple[dict[str, Any], int]], int | None, bool]]]


def make_rounds(seed: int, partitions: int, n_rounds: int = 6, keys: int = 3) -> Rounds:
    """Per round, per partition: rows (rowtimes 0 to 2 s apart, ties included, a key
    ``k`` among ``keys``), sometimes a bound; the last round ends every partition."""
    rnd = random.Random(seed)
    clocks = [T0] * partitions
    serial = 0
    rounds: Rounds = []
    for r in range(n_rounds):
        writes = []
        for p in range(partitions):
            rows = []
            for _ in range(rnd.randint(0, 5)):
                clocks[p] += rnd.choice([0, 500_000, US, 2 * US])
                serial += 1
                rows.append(({"p": p, "i": serial, "k": f"k{rnd.randrange(keys)}"}, clocks[p]))
            bound = None
            if rnd.random() < 0.4:
                clocks[p] += rnd.choice([0, US])
                bound = clocks[p]
            writes.append((p, rows, bound, r == n_rounds - 1))
        rounds.append(writes)
    return rounds


def write_round(location: Path, writes: Any) -> None:
    for p, rows, bound, end in writes:
        write_rows(location, p, rows, bound_us=bound, end=end)


def run_rounds(
    df: Any, location: Path | list[Path], rounds: list[Any], checkpoint: Path, stop_after: int = -1
) -> Run:
    """Write each round (to one stream, or round ``r`` of each stream), then drain the query;
    after round ``stop_after`` stop the query and start it again from its checkpoint."""
    run = Run()
    query = start(df, checkpoint, run)
    locations = location if isinstance(location, list) else [location]
    for r in range(len(rounds[0]) if isinstance(location, list) else len(rounds)):
        for i, loc in enumerate(locations):
            write_round(loc, rounds[i][r] if isinstance(location, list) else rounds[r])
        drain(query, run)
        if r == stop_after:
            query.stop()
            query = start(df, checkpoint, run)
    query.stop()
    return run


def brute_force_ends(rows: list[dict[str, Any]], n: int) -> dict[int, int]:
    ends: dict[int, int] = {}
    for p in sorted({r["p"] for r in rows}):
        mine = [r for r in rows if r["p"] == p]  # in emission order (batches, then rowtime)
        starts = np.array([r["rowtime"] for r in mine], dtype=np.int64)
        ends.update(
            {r["i"]: int(e) for r, e in zip(mine, element_window_ends(starts, n), strict=True)}
        )
    return ends


def emission_order(run: Run) -> list[dict[str, Any]]:
    """Rows batch after batch; in a batch, by rowtime, ties by serial (each partition writes
    its rows in serial order, and emits ties in offset order)."""
    out = []
    for _, records in run.batches:
        out += sorted(
            (r for r in records if not r["is_bound"]), key=lambda r: (r["rowtime"], r["i"])
        )
    return out


@pytest.mark.spark_subset
@pytest.mark.parametrize("n", [1, 3])
def test_interval_count_against_brute_force_with_a_restart(
    spark: Any, workdir: Path, n: int
) -> None:
    results = []
    for stop_after in stop_points(2):  # (uninterrupted,) stopped and restarted after round 2
        location = workdir / f"s{stop_after}"
        pr.create_stream(str(location), "p int, i long, k string", partitions=2)
        df = reader(spark, location, **{"interval.count": str(n)})
        assert df.columns == ["p", "i", "k", "rowtime", "rowtime_end", "is_bound"]
        run = run_rounds(df, location, make_rounds(11, 2), workdir / f"chk{stop_after}", stop_after)
        check_batches(run)
        rows = run.rows
        assert (
            len(rows)
            == len({r["i"] for r in rows})
            == sum(len(w[1]) for rnd in make_rounds(11, 2) for w in rnd)
        )  # every row once: the end of stream settled the last ones
        expected = brute_force_ends(emission_order(run), n)
        assert {r["i"]: r["rowtime_end"] for r in rows} == expected
        assert all(r["rowtime_end"] is None for r in run.records if r["is_bound"])
        results.append(sorted((r["i"], r["rowtime"], r["rowtime_end"]) for r in rows))
    assert all(r == results[0] for r in results)


def test_interval_count_holds_rows_and_the_clock_until_the_successor(
    spark: Any, workdir: Path
) -> None:
    location = workdir / "s"
    pr.create_stream(str(location), "p int, i long, k string", partitions=1)
    run = Run()
    query = start(reader(spark, location, **{"interval.count": "1"}), workdir / "chk", run)
    first = [({"p": 0, "i": 1, "k": "a"}, T0), ({"p": 0, "i": 2, "k": "a"}, T0 + US)]
    write_rows(location, 0, first, bound_us=T0 + 5 * US)
    drain(query, run)
    # Row 2 waits for its successor; the bound (5 s) may not overtake it: the clock stays at 1 s.
    assert [(r["i"], r["rowtime_end"]) for r in run.rows] == [(1, T0 + US)]
    assert max(run.bounds) <= T0 + US
    write_rows(location, 0, [({"p": 0, "i": 3, "k": "a"}, T0 + 7 * US)])
    drain(query, run)
    assert [(r["i"], r["rowtime_end"]) for r in run.rows] == [(1, T0 + US), (2, T0 + 7 * US)]
    assert max(run.bounds) == T0 + 5 * US
    write_rows(location, 0, [], end=True)  # the end of stream settles row 3
    drain(query, run)
    query.stop()
    assert run.rows[-1]["i"] == 3 and run.rows[-1]["rowtime_end"] == INFINITY_US
    check_batches(run)


def test_interval_duration_with_a_restart(spark: Any, workdir: Path) -> None:
    results = []
    for stop_after in stop_points(1):
        location = workdir / f"s{stop_after}"
        pr.create_stream(str(location), "p int, i long, k string", partitions=2)
        df = reader(spark, location, **{"interval.duration": "1.5 seconds"})
        run = run_rounds(df, location, make_rounds(5, 2), workdir / f"chk{stop_after}", stop_after)
        check_batches(run)
        assert run.rows and all(r["rowtime_end"] == r["rowtime"] + 1_500_000 for r in run.rows)
        results.append(sorted((r["i"], r["rowtime"], r["rowtime_end"]) for r in run.rows))
    assert all(r == results[0] for r in results)


def test_no_interval_option_no_rowtime_end(spark: Any, workdir: Path) -> None:
    location = workdir / "s"
    pr.create_stream(str(location), "p int, i long, k string", partitions=1)
    assert "rowtime_end" not in reader(spark, location).columns
    with pytest.raises(Exception, match=r"interval\.duration and interval\.count"):
        # .columns: a Spark Connect client meets the error at the first analysis, not at load()
        _ = reader(spark, location, **{"interval.duration": "1", "interval.count": "1"}).columns


# -- overlap_join ------------------------------------------------------------------------------


def brute_force_join(left: list[dict[str, Any]], right: list[dict[str, Any]]) -> list[tuple]:
    out = []
    for lrow in left:
        for rrow in right:
            start = max(lrow["rowtime"], rrow["rowtime"])
            end = min(lrow["rowtime_end"], rrow["rowtime_end"])
            if lrow["k"] == rrow["k"] and start < end:
                out.append((lrow["k"], lrow["i"], rrow["i"], start, end))
    return sorted(out)


def iso_us(text: str) -> int:
    t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (t - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(microseconds=1)


def joined(rows: list[dict[str, Any]]) -> list[tuple]:
    return sorted((r["k"], r["left_i"], r["right_i"], r["rowtime"], r["rowtime_end"]) for r in rows)


def check_left_join(run: Run, lrows: list[dict[str, Any]], rrows: list[dict[str, Any]]) -> list:
    """The left join ``run`` wrote is the brute force's over ``lrows`` and ``rrows`` (settled
    rows, ``rowtime_end`` set): every pair once, every left row that met none once with nulls,
    each such row in a batch whose watermark reached its end (both clocks passed it), never
    before. Returns what the run wrote, sorted."""
    pairs = brute_force_join(lrows, rrows)
    met = {i for _, i, _, _, _ in pairs}
    alone = [
        (r["k"], r["i"], None, r["rowtime"], r["rowtime_end"])
        for r in lrows
        if r["i"] not in met and r["rowtime"] < r["rowtime_end"]
    ]
    assert pairs and alone, "the scenario has both kinds of rows"
    got = sorted(joined(run.records), key=repr)
    assert got == sorted(pairs + alone, key=repr)
    watermark = {p["batchId"]: iso_us(p["eventTime"]["watermark"]) for p in run.progress}
    end_ms = INFINITY_US // 1000 - 1
    for batch_id, rows in run.batches:
        for r in rows:
            if r["right_i"] is None:  # never before both clocks passed the row's end
                w = watermark[batch_id]
                assert w // 1000 >= end_ms or w >= r["rowtime_end"], (batch_id, r)
    return got


def join_streams(spark: Any, workdir: Path, name: str) -> tuple[Path, Path, Any]:
    a, b = workdir / f"{name}_a", workdir / f"{name}_b"
    pr.create_stream(str(a), "p int, i long, k string", partitions=2)
    pr.create_stream(str(b), "p int, i long, k string", partitions=1)
    left = reader(spark, a, **{"interval.duration": "2 seconds"})
    right = reader(spark, b, **{"interval.count": "1"})
    return a, b, pr.overlap_join(left, right, "k")


def test_overlap_join_against_brute_force_with_a_restart(spark: Any, workdir: Path) -> None:
    rounds = [make_rounds(21, 2, n_rounds=6), make_rounds(22, 1, n_rounds=6)]
    results = []
    for stop_after in stop_points(2):
        a, b, df = join_streams(spark, workdir, f"j{stop_after}")
        assert df.columns == ["k", "left_p", "left_i", "right_p", "right_i", "rowtime",
                              "rowtime_end"]  # fmt: skip
        run = run_rounds(df, [a, b], rounds, workdir / f"chk{stop_after}", stop_after)
        left = plain(spark.read.format("rowtime").option("interval.duration", "2").load(str(a)))
        right = plain(spark.read.format("rowtime").option("interval.count", "1").load(str(b)))
        expected = brute_force_join(
            [r for r in left if not r["is_bound"]], [r for r in right if not r["is_bound"]]
        )
        got = joined([r for _, rows in run.batches for r in rows])
        assert expected, "the scenario has overlapping rows"
        assert got == expected
        # No result below the watermark of the batch it is written in: ready for the sink.
        watermark = {p["batchId"]: iso_us(p["eventTime"]["watermark"]) for p in run.progress}
        for batch_id, rows in run.batches:
            assert all(r["rowtime"] >= watermark[batch_id] for r in rows), batch_id
        results.append(got)
    assert all(r == results[0] for r in results)


def test_left_overlap_join_against_brute_force_with_a_restart(spark: Any, workdir: Path) -> None:
    """SPEC 10's left join: every overlapping pair once; every left row that overlaps no right
    row once with nulls and its own interval, in a batch whose watermark reached its end (both
    clocks passed it), never before; a restart from the checkpoint gives the same rows."""
    rounds = [make_rounds(41, 2, n_rounds=6), make_rounds(42, 1, n_rounds=6, keys=4)]
    results = []
    for stop_after in stop_points(3):
        a, b = workdir / f"l{stop_after}_a", workdir / f"l{stop_after}_b"
        pr.create_stream(str(a), "p int, i long, k string", partitions=2)
        pr.create_stream(str(b), "p int, i long, k string", partitions=1)
        left = reader(spark, a, **{"interval.duration": "1 second"})
        right = reader(spark, b, **{"interval.count": "1"})
        df = pr.overlap_join(left, right, "k", how="left")
        run = run_rounds(df, [a, b], rounds, workdir / f"chk_l{stop_after}", stop_after)
        lrows = plain(spark.read.format("rowtime").option("interval.duration", "1").load(str(a)))
        rrows = plain(spark.read.format("rowtime").option("interval.count", "1").load(str(b)))
        lrows = [r for r in lrows if not r["is_bound"]]
        results.append(check_left_join(run, lrows, [r for r in rrows if not r["is_bound"]]))
    assert all(r == results[0] for r in results)


#: Rounds of the bounded-state test: 6 in CI (120 rows, the state held to 30), 12 in ./dev long.
STATE_ROUNDS = 12 if LONG else 6


def test_overlap_join_state_stays_bounded_by_both_clocks(spark: Any, workdir: Path) -> None:
    """One key, STATE_ROUNDS rounds of 10 rows per side, each valid 2 s: the state keeps the
    few intervals that can still overlap (at most 30), not the 20 rows of every round."""
    a, b = workdir / "a", workdir / "b"
    for loc in (a, b):
        pr.create_stream(str(loc), "p int, i long, k string", partitions=1)
    left = reader(spark, a, **{"interval.duration": "2 seconds"})
    right = reader(spark, b, **{"interval.duration": "2 seconds"})
    run = Run()
    query = start(pr.overlap_join(left, right, "k"), workdir / "chk", run)
    kept = []
    for r in range(STATE_ROUNDS):
        for loc, shift in ((a, 0), (b, 300_000)):
            rows = [({"p": 0, "i": r * 10 + j, "k": "x"}, T0 + (r * 10 + j) * US + shift)
                    for j in range(10)]  # fmt: skip
            write_rows(loc, 0, rows, bound_us=T0 + (r * 10 + 10) * US)
        drain(query, run)
    query.stop()
    for p in run.progress:
        metric = observed(p, "overlap_join")
        if metric is not None and input_rows(p):
            kept.append(metric["max_intervals_per_key"])
    # every row overlaps its neighbours on the other side
    assert len(run.records) > 200 * STATE_ROUNDS // 12
    # A batch adds 20 intervals; what stays from earlier batches ends after both clocks.
    assert kept and max(kept) <= 30, kept


@pytest.mark.connect("the refusals are raised in the client, before a plan is sent")
def test_overlap_join_refuses_bad_arguments_before_starting(spark: Any, workdir: Path) -> None:
    a, b, _ = join_streams(spark, workdir, "bad")
    left = reader(spark, a, **{"interval.duration": "2"})
    right = reader(spark, b, **{"interval.count": "1"})
    plain_right = reader(spark, b)
    cases = [
        ({"how": "right"}, "how='right'"),
        ({"on": "nope"}, "on='nope'"),
        ({"on": []}, "on=\\[\\]"),
        ({"right": plain_right}, "right lacks the column"),
    ]
    for kwargs, message in cases:
        args = {"left": left, "right": right, "on": "k", **kwargs}
        with pytest.raises(OptionError, match=message):
            pr.overlap_join(**args)
    spark.conf.set("spark.sql.streaming.multipleWatermarkPolicy", "max")
    try:
        with pytest.raises(OptionError, match="multipleWatermarkPolicy=max"):
            pr.overlap_join(left, right, "k")
    finally:
        spark.conf.unset("spark.sql.streaming.multipleWatermarkPolicy")
    assert not spark.streams.active


# -- windows whose ends depend on later rows of a group (rows_window, while_window) ------------


def window_rounds(seed: int) -> list[tuple[list[tuple[dict[str, Any], int]], int, bool]]:
    """One partition, rowtimes strictly increasing (ties are the pure tests' business), two
    groups, values above and below 10 and null; bounds only at the end, then the end."""
    rnd = random.Random(seed)
    t, serial, out = T0, 0, []
    for r in range(7):
        rows = []
        for _ in range(rnd.randint(0, 5) if r < 5 else 0):
            t += rnd.choice([300_000, US, 2 * US])
            serial += 1
            v = rnd.choice([5.0, 15.0, 20.0, None])
            rows.append(({"i": serial, "k": f"k{rnd.randrange(2)}", "v": v}, t))
        t += rnd.choice([0, US])
        out.append((rows, t, r == 6))
    return out


def window_ends(
    rows: list[dict[str, Any]], kind: str, n: int, slide: int = 1
) -> list[dict[str, Any]]:
    out = []
    for k in sorted({r["k"] for r in rows}):
        mine = sorted((r for r in rows if r["k"] == k), key=lambda r: r["rowtime"])
        for j, r in enumerate(mine):
            if kind == "rows":  # row j of its group ends where row floor(j / slide) * slide + n
                at = j // slide * slide + n
                end = mine[at]["rowtime"] if at < len(mine) else INFINITY_US
            elif r["v"] is None or r["v"] <= 10:
                end = r["rowtime"]
            else:
                closing = next((x for x in mine[j + 1 :] if x["v"] is None or x["v"] <= 10), None)
                end = INFINITY_US if closing is None else closing["rowtime"]
            out.append({**r, "rowtime_end": end})
    return out


@pytest.mark.parametrize("kind", ["rows", "sliding", "while"])
def test_grouped_windows_aggregate_to_the_relational_answer_with_a_restart(
    spark: Any, workdir: Path, kind: str
) -> None:
    """rows_window(2), rows_window(3, slide=2) and while_window("v > 10") per k, aggregated
    per k by interval_aggregate: the relational answer at every instant over the brute-force
    ends; a restart reproduces it."""
    from test_interval_aggregate_spark import AGGS, got_rows, relational, same

    plan = window_rounds({"rows": 51, "sliding": 71, "while": 61}[kind])
    results = []
    for stop_after in stop_points(2):
        location = workdir / f"w{kind}{stop_after}"
        pr.create_stream(str(location), "i long, k string, v double", partitions=1)
        source = reader(spark, location)
        if kind == "rows":
            windowed = pr.rows_window(source, 2, partition_by="k")
        elif kind == "sliding":
            windowed = pr.rows_window(source, 3, slide=2, partition_by="k")
        else:
            windowed = pr.while_window(source, "v > 10", partition_by="k")
        df = pr.interval_aggregate(windowed, AGGS, partition_by="k")
        run = Run()
        query = start(df, workdir / f"chk_w{kind}{stop_after}", run)
        for r, (rows, bound, end) in enumerate(plan):
            write_rows(location, 0, rows, bound_us=bound, end=end)
            drain(query, run)
            if r == stop_after:
                query.stop()
                query = start(df, workdir / f"chk_w{kind}{stop_after}", run)
        query.stop()
        every = [
            r for r in plain(spark.read.format("rowtime").load(str(location))) if not r["is_bound"]
        ]
        if kind == "sliding":
            want = relational(window_ends(every, "rows", 3, slide=2), "k")
        else:
            want = relational(window_ends(every, kind, 2), "k")
        assert len(want) > 5, "the scenario has stretches"
        got = got_rows(run, "k")
        same(got, want)
        results.append(got)
    assert all(r == results[0] for r in results)


@pytest.mark.connect("the refusals are raised in the client, before a plan is sent")
def test_a_window_group_must_lie_within_one_aggregate_group(spark: Any, workdir: Path) -> None:
    location = workdir / "wbad"
    pr.create_stream(str(location), "i long, k string, v double", partitions=1)
    windowed = pr.rows_window(reader(spark, location), 3)  # one group: the whole stream
    with pytest.raises(OptionError, match="must lie within one aggregate group"):
        pr.interval_aggregate(windowed, {"n": "count(*)"}, partition_by="k")
    with pytest.raises(OptionError, match="slide=4 must be a whole number from 1 to n=3"):
        pr.rows_window(reader(spark, location), 3, slide=4)
    with pytest.raises(OptionError, match="already has rowtime_end"):
        pr.rows_window(reader(spark, location, **{"interval.duration": "1"}), 3)


@pytest.mark.parametrize("kind", ["rows", "while"])
def test_windows_into_the_left_overlap_join_against_brute_force_with_a_restart(
    spark: Any, workdir: Path, kind: str
) -> None:
    """rows_window(2, slide=2) or while_window("v > 10") per k on the left, the reader's
    interval.duration on the right, joined on k with how="left": every overlapping pair once
    over the brute-force window ends, every left row that meets none once with nulls (never
    before both clocks passed its end); a restart from the checkpoint gives the same rows."""
    plan = window_rounds(82 if kind == "rows" else 93)  # seeds with rows of both kinds
    right_rounds = make_rounds(82, 1, n_rounds=len(plan), keys=2)
    rounds = [[[(0, rows, bound, end)] for rows, bound, end in plan], right_rounds]
    results = []
    for stop_after in stop_points(3):
        a, b = workdir / f"wj{kind}{stop_after}_a", workdir / f"wj{kind}{stop_after}_b"
        pr.create_stream(str(a), "i long, k string, v double", partitions=1)
        pr.create_stream(str(b), "p int, i long, k string", partitions=1)
        source = reader(spark, a)
        if kind == "rows":
            left = pr.rows_window(source, 2, slide=2, partition_by="k")
        else:
            left = pr.while_window(source, "v > 10", partition_by="k")
        right = reader(spark, b, **{"interval.duration": "1.5 seconds"})
        df = pr.overlap_join(left, right, "k", how="left")
        assert df.columns == ["k", "left_i", "v", "p", "right_i", "rowtime", "rowtime_end"]
        run = run_rounds(df, [a, b], rounds, workdir / f"chk_wj{kind}{stop_after}", stop_after)
        every = [r for r in plain(spark.read.format("rowtime").load(str(a))) if not r["is_bound"]]
        if kind == "rows":
            lrows = window_ends(every, "rows", 2, slide=2)
        else:
            lrows = window_ends(every, "while", 0)
        rrows = plain(spark.read.format("rowtime").option("interval.duration", "1.5").load(str(b)))
        results.append(check_left_join(run, lrows, [r for r in rrows if not r["is_bound"]]))
    assert all(r == results[0] for r in results)


@pytest.mark.connect("the refusals are raised in the client, before a plan is sent")
def test_a_window_group_must_lie_within_one_join_key(spark: Any, workdir: Path) -> None:
    a, b = workdir / "wjbad_a", workdir / "wjbad_b"
    pr.create_stream(str(a), "i long, k string, v double", partitions=1)
    pr.create_stream(str(b), "p int, i long, k string", partitions=1)
    right = reader(spark, b, **{"interval.duration": "1"})
    whole = pr.rows_window(reader(spark, a), 3)  # one group: the whole stream, every key
    with pytest.raises(OptionError, match=r"Window by the join keys too \(partition_by=\['k'\]\)"):
        pr.overlap_join(whole, right, "k")
    with pytest.raises(OptionError, match="right is a while window"):
        pr.overlap_join(right, pr.while_window(reader(spark, a), "v > 1"), "k")

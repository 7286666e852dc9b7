"""The demo end to end, small: its numbers against brute force from the generated data.

The demo's claims are only worth showing if they are true, so each is recomputed here without
Spark or the reader: which readings the adjust policy discards (SPEC 6, one record at a time),
the maximum lane flow of every pane over the rest, and, for plain Spark, what it must have
emitted given the watermark each of its batches ran with.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from pyspark_rowtime.demo import SPARK_DELAY_S, plain_losses, run_queries
from pyspark_rowtime.demo_data import (
    FREEWAYS,
    INTERVAL_S,
    PERIOD_S,
    SECOND,
    DemoConfig,
    expected,
    generate,
    log_order,
    panes_of,
)


def _plain_prediction(data, trace) -> dict[tuple[str, int], int]:  # type: ignore[no-untyped-def]
    """Plain Spark's windows, from the data: a reading counts in a window whose end is above the
    watermark its batch ran with, and a window is emitted once the watermark reaches its end."""
    best: dict[tuple[str, int], int] = {}
    for k in range(len(data.ticks)):
        w = trace.b_batch_watermark[k]
        for p, s in enumerate(data.step_slices(k)):
            t = data.rowtime[p][s]
            if len(t) == 0:
                continue
            assert w is not None, f"step {k} landed readings but plain Spark ran no batch for it"
            for i, start in panes_of(t):
                if start + INTERVAL_S * SECOND <= w:
                    continue  # the window had closed: Spark drops the reading from it
                key = (FREEWAYS[int(data.freeway[p][s][i])], start)
                best[key] = max(best.get(key, -1), int(data.lane_flow[p][s][i]))
    final = trace.b_watermark[-1]
    return {key: v for key, v in best.items() if key[1] + INTERVAL_S * SECOND <= final}


def test_demo_numbers_match_brute_force(spark, workdir: Path) -> None:
    data = generate(DemoConfig(rows=6000, partitions=3, minutes=6, tick_s=120, seed=7))
    outcome = run_queries(spark, data, workdir)
    trace = outcome.trace
    discarded, truth = expected(data)

    # Every reading went in; the quarantine holds exactly the readings SPEC 6 discards, each a
    # reading generated far too late.
    assert outcome.counts["rows_in"] == data.rows
    quarantined = set()
    for d in outcome.discards:
        row = int(log_order(data, d["partition"])[2][d["offset"]])
        quarantined.add((d["partition"], row))
        assert data.too_late[d["partition"]][row], d
        assert d["reason"] in ("below_adjust_range", "below_rowtime_bound"), d
    assert quarantined == {(p, int(i)) for p in range(3) for i in np.flatnonzero(discarded[p])}
    assert quarantined, "the data set should have readings far too late"

    # (a) every window once, each equal to the brute-force maximum.
    got_a = [(fw, start, end, v) for fw, start, end, v, _step in trace.a_windows]
    assert len(got_a) == len({(fw, s) for fw, s, _e, _v in got_a}), "a window came twice"
    assert all(end - start == INTERVAL_S * SECOND for _fw, start, end, _v in got_a)
    assert {(fw, start): v for fw, start, _end, v in got_a} == truth
    assert all(start % (PERIOD_S * SECOND) == 0 for _fw, start, _e, _v in got_a)

    # (b) exactly what Spark's watermark rule predicts from the data, which is not the answer.
    got_b = {(fw, start): v for fw, start, _end, v, _step in trace.b_windows}
    assert got_b == _plain_prediction(data, trace)
    assert got_b != truth
    lost_all, lost_some = plain_losses(data, trace)
    assert 0 < lost_all <= lost_some
    assert trace.b_dropped_metric > 0  # Spark knows it dropped something, not what

    # The quiet gap: bounds move (a)'s clock and close windows; (b)'s watermark stands still.
    g0, g1 = data.gap_us
    gap = [k for k in range(1, len(data.ticks)) if data.ticks[k - 1] >= g0 and data.ticks[k] <= g1]
    assert gap, "the configuration should put a replay step inside the gap"
    before, last = gap[0] - 1, gap[-1]
    assert trace.stream_clock[last] > trace.stream_clock[before]
    assert any(w[4] in gap for w in trace.a_windows)
    assert trace.b_watermark[last] == trace.b_watermark[before]
    assert not any(w[4] in gap for w in trace.b_windows)
    # Plain Spark's watermark is the fastest district's; the stream clock the slowest one's.
    assert trace.b_watermark[before] > trace.stream_clock[before] + SPARK_DELAY_S * SECOND

    # The Parquet copy made by the rowtime sink holds the same windows.
    table = pq.read_table(workdir / "maxflow_parquet")
    rows = table.to_pylist()
    assert len(rows) == len(truth)
    assert {(r["freeway"], r["max_flow"]) for r in rows} == {
        (fw, v) for (fw, _start), v in truth.items()
    }

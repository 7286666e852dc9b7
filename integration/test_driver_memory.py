"""The driver's memory for a large backlog follows the step cap, not the backlog (issue 16).

A query started over a large backlog without ``maxRowsPerBatch`` plans it in steps of at most
``RowtimeStreamReader.step_records`` new records (``STEP_RECORDS``, 16,777,216), one after the
other (joined into micro-batches of up to ``micro_batch_records``), so the memory the driver's
side of the reader (``latestOffset`` + ``partitions``, which Spark runs in a Python process of
its own) needs to plan a step is bounded by the cap. Stated bound: a step's peak allocations
(numpy arrays, traced by ``tracemalloc``, and Arrow buffers, the default pool's peak) stay
under ``BYTES_PER_RECORD`` bytes per record of the cap plus ``FIXED_BYTES`` (the piecewise
classification's working arrays), whatever the backlog.

A step whose records are in order, or under ``adjust`` late only within the range (this
backlog), is planned from the times where the log holds them, a block at a time
(``Planner._plan_ordered``): it holds no window of the step at all, so even one step over the
whole backlog stays far under the bound. The general path (rows discarded, a promoted
``rowtime.column``) holds the step's times; the test measures it too, by turning the other off.

Writing the issue's 50 million rows takes minutes here, so the test uses 4 million rows and a
cap of 512Ki records (the same ratio of backlog to cap as 50 million rows to 16Mi, about 8);
``./dev bench scaling --memory`` measures the whole processes over 20 million rows. Each
measurement runs in a fresh Python process (Arrow's pool peak cannot be reset), calling the
reader's methods exactly as Spark's planner process calls them, in order, until the offset
stops moving (as ``availableNow`` does).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

import pyspark_rowtime as pr

ROWS = 4_000_000
PARTITIONS = 2
CAP = 1 << 19
BYTES_PER_RECORD = 18
FIXED_BYTES = 48 << 20
START_US = 1_700_000_000_000_000
OPTIONS = {"order": "adjust", "adjust.unit": "msec", "adjust.range": "999"}

PLAN = """
import json, sys, tracemalloc
import pyarrow as pa
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark_rowtime.datasource.spark import RowtimeStreamReader, _config

options, cap, general = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "general"
cfg, arrow = _config(options)
reader = RowtimeStreamReader(cfg, arrow)
reader.step_records = cap
if general:  # only the general path: the step's times joined into one window
    reader.planner._plan_ordered = lambda pos, ends: None
reader.prepareForTriggerAvailableNow()
start = reader.initialOffset()
tracemalloc.start()
steps, rows = 0, 0
while True:
    end = reader.latestOffset(start, ReadAllAvailable())
    if end == start:
        break
    rows += sum(p.task.runs.rows for p in reader.partitions(start, end))
    steps += 1
    start = end
_, numpy_peak = tracemalloc.get_traced_memory()
print(json.dumps({
    "steps": steps,
    "rows": rows,
    "next": [p["next"] for p in end["partitions"].values()],
    "peak": numpy_peak + pa.default_memory_pool().max_memory(),
}))
"""


def write_backlog(location: Path) -> None:
    """ROWS rows in PARTITIONS partitions, 10,000 a second of event time each, 1% of them up
    to 0.5 s early (within adjust's range), then the end of the stream."""
    pr.create_stream(location, "id BIGINT, v DOUBLE", partitions=PARTITIONS)
    rng = np.random.default_rng(16)
    per_partition = ROWS // PARTITIONS
    for p in range(PARTITIONS):
        with pr.open_writer(location, p) as w:
            for first in range(0, per_partition, 1_000_000):
                n = min(1_000_000, per_partition - first)
                t = START_US + np.arange(first, first + n, dtype=np.int64) * 100
                early = rng.random(n) < 0.01
                t[early] -= rng.integers(1, 500_000, int(early.sum()))
                table = pa.table(
                    {
                        "id": np.arange(first, first + n, dtype=np.int64),
                        "v": rng.random(n),
                        "rowtime": pa.array(t).view(pa.timestamp("us", tz="UTC")),
                    }
                )
                w.insert_arrow(table, rowtime_column="rowtime")
            w.end_stream()


def plan_backlog(location: Path, cap: int, path: str) -> dict:
    options = json.dumps({"path": str(location), **OPTIONS})
    out = subprocess.run(
        [sys.executable, "-c", PLAN, options, str(cap), path],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_planning_a_backlog_holds_memory_for_a_step_not_the_backlog(tmp_path: Path) -> None:
    location = tmp_path / "backlog"
    write_backlog(location)
    per_partition = ROWS // PARTITIONS + 1  # and its end-of-stream bound
    bound = BYTES_PER_RECORD * CAP + FIXED_BYTES

    for path in ("general", "where the times lie"):
        capped = plan_backlog(location, CAP, path)
        # every record planned, in steps of at most CAP records joined into one micro-batch
        # (the backlog is under MICRO_BATCH_RECORDS), every row emitted exactly once
        assert capped["next"] == [per_partition] * PARTITIONS
        assert capped["steps"] == 1
        assert capped["rows"] == ROWS
        assert capped["peak"] < bound, (
            f"planning a {ROWS:,}-row backlog in steps of {CAP:,} records ({path}) peaked at "
            f"{capped['peak'] / 2**20:.0f} MiB, over the stated {bound / 2**20:.0f} MiB"
        )

    # the bound is tight enough to tell: the same backlog in one step of the general path
    # passes it; planned where the times lie, one step holds no window and stays far under it
    whole = plan_backlog(location, 2 * ROWS, "general")
    assert whole["steps"] == 1 and whole["rows"] == ROWS
    assert whole["peak"] > bound, whole
    lying = plan_backlog(location, 2 * ROWS, "where the times lie")
    assert lying["steps"] == 1 and lying["rows"] == ROWS
    assert lying["peak"] < bound / 4, lying

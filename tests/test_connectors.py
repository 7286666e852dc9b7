"""Connectors run as `rowtime connect`: files ingested exactly once across SIGKILL, a clean
stop on SIGTERM, one line and status 2 on bad configuration, and the bound strategies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pyspark_rowtime.connectors.strategies import parse_strategy
from pyspark_rowtime.streams.storage import open_storage

CATALOG = """
[streams.orders]
location = "data/orders"
schema = "ticker STRING, qty INT"
reader = {{ order = "drop" }}

[connectors.files]
kind = "directory"
stream = "orders"
path = "incoming"
rowtime_field = "ts"
batch_rows = 7
poll = "20ms"
log_every = "50ms"
bounds = {{ strategy = {strategy}, lateness = "2s" }}

[connectors.gen]
kind = "generator"
stream = "orders"
partition = 0
rate = 1000
count = 300
disorder = "5ms"
bounds = {{ strategy = "source" }}
"""


def _setup(tmp_path, strategy='"lateness"'):
    (tmp_path / "incoming").mkdir()
    path = tmp_path / "catalog.toml"
    path.write_text(CATALOG.format(strategy=strategy))
    return str(path)


def _drop_files(tmp_path, files, per_file):
    expected = []
    for f in range(files):
        lines = []
        for i in range(per_file):
            n = f * per_file + i
            lines.append(json.dumps({"ticker": f"T{n}", "qty": n, "ts": 1_000_000 + n * 10}))
            expected.append(n)
        tmp = tmp_path / f".{f:03d}.jsonl"
        tmp.write_text("\n".join(lines) + "\n")
        os.rename(tmp, tmp_path / "incoming" / f"{f:03d}.jsonl")  # renamed in, complete
    return expected


def _connect(catalog, name):
    return subprocess.Popen(
        [sys.executable, "-m", "pyspark_rowtime.cli", "connect", catalog, name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _records(tmp_path):
    """Partition 0's records with the log's own columns (times in microseconds)."""
    stream = open_storage(str(tmp_path / "data" / "orders"))
    return stream.read(0, 0, stream.end_offset(0)).to_pylist()


def _rows(tmp_path):
    return [r["qty"] for r in _records(tmp_path) if not r["__is_bound"]]


def test_sigkill_at_any_point_loses_and_repeats_nothing(tmp_path):
    catalog = _setup(tmp_path)
    expected = _drop_files(tmp_path, files=12, per_file=40)
    done = tmp_path / "incoming" / "_done"
    kills = 0
    for delay in (0.9, 1.1, 1.3, 1.5, 1.7, 2.0):
        proc = _connect(catalog, "files")
        time.sleep(delay)  # a kill at whatever point it reached
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        kills += 1
        if done.exists() and len(os.listdir(done)) == 12:
            break
    proc = _connect(catalog, "files")
    # Its first line comes once its SIGTERM handler is in place; a SIGTERM while the
    # interpreter still starts would end it the default way (status -15), not cleanly.
    first = proc.stderr.readline()
    assert "feeding" in first, first
    deadline = time.monotonic() + 60
    while (not done.exists() or len(os.listdir(done)) < 12) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    err = first + err
    assert proc.returncode == 0, err
    # The last line always; per-interval lines only if this run still had files to take (the
    # SIGTERM test checks those).
    assert "stopped" in err.splitlines()[-1], err
    got = _rows(tmp_path)
    assert kills >= 1
    assert sorted(got) == expected, "rows lost or repeated"
    assert len(got) == len(set(got))


def test_the_lateness_strategy_never_writes_a_bound_below_the_rows_clock(tmp_path):
    # SPEC 5: a row at t already implies the bound t, so max(rowtime) - lateness is never above
    # the partition clock in this log: lateness writes no bound record (see strategies.py).
    catalog = _setup(tmp_path)
    _drop_files(tmp_path, files=1, per_file=5)
    proc = _connect(catalog, "files")
    deadline = time.monotonic() + 30
    done = tmp_path / "incoming" / "_done"
    while not (done.exists() and os.listdir(done)) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    records = _records(tmp_path)
    assert [r["qty"] for r in records if not r["__is_bound"]] == list(range(5))
    assert not [r for r in records if r["__is_bound"]]


def test_the_generator_emits_count_rows_with_its_exact_bound(tmp_path):
    catalog = _setup(tmp_path)
    proc = _connect(catalog, "gen")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if len(_rows(tmp_path)) >= 300:
                break
        except Exception:
            pass
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    records = _records(tmp_path)
    rows = [r for r in records if not r["__is_bound"]]
    assert [r["qty"] for r in rows] == list(range(300))
    # Each bound is a promise every later row keeps (the generator knows its own schedule).
    low = None
    for r in records:
        if r["__is_bound"]:
            low = r["__rowtime_us"]
        elif low is not None:
            assert r["__rowtime_us"] >= low


def test_bad_configuration_is_one_line_and_status_2(tmp_path):
    catalog = _setup(tmp_path, strategy='"sometimes"')
    proc = _connect(catalog, "files")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert "catalog.toml:15: connectors.files.bounds.strategy" in lines[0]


def _fail(key, why):
    return ValueError(f"{key}: {why}")


def test_heartbeat_moves_with_the_machine_clock_after_a_quiet_period():
    s = parse_strategy({"strategy": "heartbeat", "quiet": "1s", "delay": "200ms"}, _fail)
    s.saw_row(5_000_000, wall_us=10_000_000)
    assert s.bound_us(10_500_000, 0) is None  # not quiet long enough
    assert s.bound_us(11_000_000, 0) == 10_800_000


def test_a_combination_takes_the_highest_bound():
    s = parse_strategy({"strategy": ["lateness", "source"], "lateness": "1s"}, _fail)
    s.saw_row(10_000_000, wall_us=0)
    assert s.bound_us(0, 0) == 9_000_000
    s.saw_source_bound(9_500_000)
    assert s.bound_us(0, 0) == 9_500_000


@pytest.mark.parametrize(
    "table",
    [
        {"strategy": "lateness"},
        {"strategy": ["none", "source"]},
        {"strategy": "x"},
        {"strategy": "source", "lateness": "1s"},
    ],
)
def test_bad_strategies_are_refused(table):
    with pytest.raises(ValueError):
        parse_strategy(table, _fail)

"""Connectors run as `rowtime connect`: files ingested exactly once across SIGKILL, a clean
stop on SIGTERM, one line and status 2 on bad configuration, and the bound strategies."""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pyspark_rowtime.cli import main
from pyspark_rowtime.connectors.run import build, run
from pyspark_rowtime.connectors.strategies import parse_strategy
from pyspark_rowtime.streams.catalog import load_catalog
from pyspark_rowtime.streams.storage import open_stream

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
    stream = open_stream(str(tmp_path / "data" / "orders"))
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
    assert s.bound_us(10_500_000, 0) == (None, False)  # not quiet long enough
    assert s.bound_us(11_000_000, 0) == (10_800_000, True)


def test_a_combination_takes_the_highest_bound():
    s = parse_strategy({"strategy": ["lateness", "source"], "lateness": "1s"}, _fail)
    s.saw_row(10_000_000, wall_us=0)
    assert s.bound_us(0, 0) == (9_000_000, False)
    s.saw_source_bound(9_500_000)
    assert s.bound_us(0, 0) == (9_500_000, False)


# -- strategy lateness: a holding buffer, Flink's bounded out-of-orderness ---------------------

LATENESS = """
[streams.orders]
location = "data/orders"
schema = "ticker STRING, qty INT"
reader = {{ order = "{order}" }}

[connectors.files]
kind = "directory"
stream = "orders"
path = "incoming"
rowtime_field = "ts"
batch_rows = {batch}
poll = "20ms"
log_every = "50ms"
bounds = {{ strategy = "lateness", lateness = "{lateness}" }}
"""

# Rowtimes (ms) in arrival order; 12000 arrives after 15000 - 2000 = 13000 is written: late.
ARRIVING = [10_000, 13_000, 12_500, 15_000, 14_000, 17_000, 16_500, 12_000, 19_000]


def _lateness_setup(tmp_path, order="drop", batch=1, lateness="2s", rowtimes=ARRIVING):
    (tmp_path / "incoming").mkdir()
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(LATENESS.format(order=order, batch=batch, lateness=lateness))
    lines = [json.dumps({"ticker": f"T{i}", "qty": i, "ts": t}) for i, t in enumerate(rowtimes)]
    (tmp_path / ".in.jsonl").write_text("\n".join(lines) + "\n")
    os.rename(tmp_path / ".in.jsonl", tmp_path / "incoming" / "in.jsonl")
    return str(catalog)


def _drain(feed, source):
    while source.step():
        pass


@pytest.mark.parametrize("order", ["drop", "reject"])
def test_lateness_holds_rows_and_writes_them_in_rowtime_order_behind_the_bound(tmp_path, order):
    catalog = _lateness_setup(tmp_path, order=order)
    feed, source = build(load_catalog(catalog), "files")
    _drain(feed, source)
    clock = None  # the partition clock: the highest bound or data rowtime written so far
    written, late = [], []
    for r in _records(tmp_path):
        t_ms = r["__rowtime_us"] // 1000
        if r["__is_bound"]:
            # A bound is the highest rowtime read so far minus the lateness (2 s). (A row
            # written at exactly that time already implies it: then no bound record is needed.)
            assert t_ms == max(ARRIVING[: ARRIVING.index(t_ms + 2000) + 1]) - 2000
        elif clock is not None and t_ms < clock:
            late.append(t_ms)
        else:
            written.append(t_ms)
        clock = t_ms if clock is None else max(clock, t_ms)
    assert written == sorted(written), "held rows are written in rowtime order"
    assert clock == max(ARRIVING) - 2000
    on_time = [t for t in ARRIVING if t != 12_000]
    assert written == sorted(t for t in on_time if t <= clock)
    # The newest row (19000) is above the last bound (17000): still held, not lost.
    assert [t // 1000 for t, _, _ in feed.held] == [19_000]
    if order == "reject":
        assert late == []
        rejects = [
            json.loads(x) for x in (Path(feed.dir) / "rejected.jsonl").read_text().split("\n") if x
        ]
        assert [(x["kind"], x["row"]["qty"]) for x in rejects] == [("late", 7)]
        assert "in.jsonl:8" in rejects[0]["source"]
    else:  # written for the readers' policy to quarantine (drop) or move up (adjust)
        assert late == [12_000]
    assert feed.stats.late == 1
    feed.close(feed.position)  # a clean stop writes the held rows: nothing lost
    rows = [r for r in _records(tmp_path) if not r["__is_bound"]]
    expected = ARRIVING if order == "drop" else [t for t in ARRIVING if t != 12_000]
    assert sorted(r["__rowtime_us"] // 1000 for r in rows) == sorted(expected)


def test_lateness_rows_held_at_a_sigkill_are_written_after_the_restart(tmp_path):
    # Every row is read (all files moved to _done) and the newest ones are still held when
    # the connector is killed: they live in its state folder, committed with its position.
    rowtimes = [1_000_000 + (i * 37) % 500 + i * 10 for i in range(200)]
    catalog = _lateness_setup(tmp_path, batch=25, lateness="500ms", rowtimes=rowtimes)
    proc = _connect(catalog, "files")
    done = tmp_path / "incoming" / "_done"
    state = tmp_path / "data" / "orders" / "_rowtime_connect" / "files"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        progress = state / "progress.json"
        if done.exists() and os.listdir(done) and progress.exists():
            doc = json.loads(progress.read_text())
            if doc.get("position") is None and doc.get("held"):
                break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    before = _rows(tmp_path)
    assert 0 < len(before) < 200, "some rows written, the newest held at the kill"
    assert (state / doc["held"]).exists()
    proc = _connect(catalog, "files")
    first = proc.stderr.readline()
    assert "feeding" in first, first
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, first + err
    got = _rows(tmp_path)
    assert sorted(got) == list(range(200)), "rows lost or repeated"
    assert got[: len(before)] == before
    # Held rows came out in rowtime order on the clean stop.
    held_out = [rowtimes[q] for q in got[len(before) :]]
    assert held_out == sorted(held_out)


def test_heartbeats_are_at_most_one_per_interval(tmp_path):
    (tmp_path / "incoming").mkdir()
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(
        CATALOG.format(strategy='"lateness"').replace(
            'bounds = { strategy = "lateness", lateness = "2s" }',
            'bounds = { strategy = "heartbeat", quiet = "10ms", interval = "250ms" }',
        )
    )
    stop = threading.Event()
    started = time.monotonic()
    threading.Timer(1.6, stop.set).start()
    out = io.StringIO()
    assert run(load_catalog(str(catalog)), "files", out=out, stop=stop, install_signals=False) == 0
    elapsed = time.monotonic() - started
    bounds = [r for r in _records(tmp_path) if r["__is_bound"]]
    # poll is 20 ms: without the interval there would be ~80 bounds.
    assert 2 <= len(bounds) <= elapsed / 0.25 + 1, (len(bounds), elapsed)
    # each bound is sent at its time (its value), at least an interval after the one before
    sent = [r["__rowtime_us"] for r in bounds]
    assert all(b - a >= 250_000 for a, b in itertools.pairwise(sent))
    assert "bounds=" in out.getvalue()


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


def test_one_log_line_per_interval_with_rows_bounds_late_discarded_and_lag(tmp_path):
    catalog = _setup(tmp_path)
    text = Path(catalog).read_text().replace("count = 300", "count = 100000")
    text = text.replace('disorder = "5ms"', 'disorder = "0s"')  # no late rows in this test
    Path(catalog).write_text(
        text.replace("[connectors.gen]", '[connectors.gen]\nlog_every = "200ms"')
    )
    stop = threading.Event()
    threading.Timer(3, stop.set).start()
    out = io.StringIO()
    started = time.monotonic()
    assert run(load_catalog(catalog), "gen", out=out, stop=stop, install_signals=False) == 0
    elapsed = time.monotonic() - started
    lines = out.getvalue().splitlines()
    assert "feeding partition 0 of stream 'orders'" in lines[0]
    assert "stopped" in lines[-1]
    pattern = re.compile(
        r"^\S+ gen: rows=(\d+) bounds=(\d+) late=0 discarded=0 held=0 clock=\S+ lag=(-?[\d.]+)s$"
    )
    intervals = [pattern.match(line) for line in lines[1:-1]]
    assert all(intervals), lines
    assert 2 <= len(intervals) <= elapsed / 0.2 + 1
    assert sum(int(m.group(1)) for m in intervals) > 0
    # The generator's rows follow this machine's clock: the lag is small, in seconds.
    assert all(abs(float(m.group(3))) < 30 for m in intervals)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (("[connectors.files]", "[connectors.other]"), "no connector 'files'"),
        (('rowtime_field = "ts"', 'rowtime_fild = "ts"'), "connectors.files.rowtime_fild"),
        (('poll = "20ms"', 'poll = "often"'), "connectors.files.poll"),
        (('path = "incoming"', 'path = "nowhere"'), "connectors.files.path"),
    ],
)
def test_bad_configuration_is_one_clear_line_and_status_2(tmp_path, capsys, change, says):
    catalog = _setup(tmp_path)
    Path(catalog).write_text(Path(catalog).read_text().replace(*change))
    assert main(["connect", catalog, "files"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rowtime connect: error: ") and says in err[0], err


CSV_TYPES = """
[streams.orders]
location = "data/orders"
schema = "ticker STRING, qty INT, price DECIMAL(10,2), paid BOOLEAN, day DATE, placed TIMESTAMP"

[connectors.files]
kind = "directory"
stream = "orders"
path = "incoming"
format = "csv"
rowtime_field = "ts"
on_error = "skip"
"""


def test_csv_cells_are_converted_as_rowtime_insert_converts_them(tmp_path):
    """A CSV file means the same to the directory connector as to `rowtime insert`: decimals,
    booleans, dates and timestamps from their text; a cell that is not its column's type is a
    bad line, kept in rejected.jsonl naming file and line, and the others go on."""
    import datetime as dt
    from decimal import Decimal

    (tmp_path / "incoming").mkdir()
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(CSV_TYPES)
    (tmp_path / ".in.csv").write_text(
        "ticker,qty,price,paid,day,placed,ts\n"
        "ORCL,10,12.50,yes,2026-03-02,2026-03-02T07:00:01Z,1000\n"
        "IBM,,7.25,false,,,2000\n"
        "SAP,3,twelve,true,2026-03-02,2026-03-02T07:00:03Z,3000\n"
    )
    os.rename(tmp_path / ".in.csv", tmp_path / "incoming" / "in.csv")
    feed, source = build(load_catalog(str(catalog)), "files")
    while source.step():
        pass
    rows = [r for r in _records(tmp_path) if not r["__is_bound"]]
    utc = dt.timezone.utc
    placed = dt.datetime(2026, 3, 2, 7, 0, 1, tzinfo=utc)
    cols = ("ticker", "qty", "price", "paid", "day", "placed")
    assert [tuple(r[c] for c in cols) for r in rows] == [
        ("ORCL", 10, Decimal("12.50"), True, dt.date(2026, 3, 2), placed),
        ("IBM", None, Decimal("7.25"), False, None, None),
    ]
    assert [r["__rowtime_us"] for r in rows] == [1_000_000, 2_000_000]
    rejects = (Path(feed.dir) / "rejected.jsonl").read_text().splitlines()
    assert len(rejects) == 1 and "in.csv:4" in json.loads(rejects[0])["source"]
    feed.close(feed.position)

"""Operators' view of silent partitions and metrics: ``rowtime describe`` marks a partition
IDLE since the record that made it idle, ``rowtime metrics`` prints the Prometheus text format
(read back here with prometheus_client's own parser) whose values are those of the log and of
a batch read, and ``rowtime connect --metrics-port`` serves the same at /metrics."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.cli import main
from pyspark_rowtime.datasource.options import parse_reader_options
from pyspark_rowtime.datasource.reader import batch_tasks, output_arrow_schema, read_task
from pyspark_rowtime.streams.local.folder import partition_dirname
from pyspark_rowtime.streams.sink_state import SINK_DIR, SINK_TARGET_FILE
from pyspark_rowtime.streams.storage import open_stream

S = 1_000_000  # a second in microseconds


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def silent_stream(location: str, **defaults: Any) -> tuple[int, dict[str, int]]:
    """Two partitions: both write at creation + 1 s; partition 1 falls silent while
    partition 0 writes every second until + 21 s; partition 1 returns at + 30 s with one row
    below the stream clock (late after idleness) and rows after it. Rowtimes in ms."""
    pr.create_stream(location, "k INT", partitions=2, **defaults)
    c0 = open_stream(location).meta.created_us
    assert c0 is not None
    clocks = [Clock(c0), Clock(c0)]
    writers = [pr.open_writer(location, p, clock=clocks[p]) for p in range(2)]

    def put(p: int, at_s: int, k: int, rowtime_s: int) -> None:
        clocks[p].now = c0 + at_s * S
        writers[p].insert({"k": k}, rowtime=rowtime_s * 1000)
        writers[p].flush()

    put(0, 1, 1, 1000)
    put(1, 1, 2, 1000)
    for i in range(2, 22):
        put(0, i, 10 + i, 1000 + i)
    put(1, 30, 99, 1005)  # late: the stream clock passed it while partition 1 was idle
    for i in range(31, 34):
        put(1, i, 100 + i, 1000 + i)
    for w in writers:
        w.close()
    return c0, {"p0_last": c0 + 21 * S, "made_idle": c0 + 30 * S}


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_describe_marks_a_silent_partition_idle_since_the_record_that_made_it_idle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loc = str(tmp_path / "s")
    _, at = silent_stream(loc, order="drop")
    # partition 0 last wrote at +21 s; partition 1's first record after +21 s + 5 s is the
    # one at +30 s: that is when partition 0 became idle. Partition 1 is not idle.
    code, out, _ = run_cli(capsys, "describe", loc, "--json", "--idle-timeout", "5s")
    assert code == 0
    info = json.loads(out)
    assert info["idle_timeout_us"] == 5 * S
    parts = info["partition_info"]
    assert parts[0]["idle_since_us"] == at["made_idle"]
    assert parts[1]["idle_since_us"] is None
    # 10 s: partition 0 is idle from partition 1's first record after +31 s
    code, out, _ = run_cli(capsys, "describe", loc, "--json", "--idle-timeout", "10s")
    since = [p["idle_since_us"] for p in json.loads(out)["partition_info"]]
    assert since == [at["made_idle"] + 2 * S, None]
    # a timeout longer than the silence: nothing is idle
    code, out, _ = run_cli(capsys, "describe", loc, "--json", "--idle-timeout", "15s")
    assert [p["idle_since_us"] for p in json.loads(out)["partition_info"]] == [None, None]
    code, out, _ = run_cli(capsys, "describe", loc, "--idle-timeout", "5s")
    row0 = next(line for line in out.splitlines() if line.startswith("0 "))
    assert row0.rstrip().endswith(f"IDLE since {pr.bounds.time.format_rowtime(at['made_idle'])}")
    # without a timeout (no flag, no stream default) the column is not there
    code, out, _ = run_cli(capsys, "describe", loc)
    assert "IDLE" not in out and "idle" not in out.splitlines()[3]


def test_describe_takes_the_timeout_from_the_stream_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loc = str(tmp_path / "s")
    _, at = silent_stream(loc, order="drop", idle_timeout="5 seconds")
    _, out, _ = run_cli(capsys, "describe", loc, "--json")
    assert json.loads(out)["partition_info"][0]["idle_since_us"] == at["made_idle"]


def test_an_empty_partition_is_idle_from_its_streams_creation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loc = str(tmp_path / "s")
    pr.create_stream(loc, "k INT", partitions=2)
    c0 = open_stream(loc).meta.created_us
    assert c0 is not None
    with pr.open_writer(loc, 0, clock=Clock(c0 + 3 * S)) as w:
        w.insert({"k": 1})
    with pr.open_writer(loc, 0, clock=Clock(c0 + 9 * S)) as w:
        w.insert({"k": 2})
    _, out, _ = run_cli(capsys, "describe", loc, "--json", "--idle-timeout", "5s")
    parts = json.loads(out)["partition_info"]
    assert parts[1]["records"] == 0 and parts[1]["idle_since_us"] == c0 + 9 * S


def test_a_bad_idle_timeout_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    loc = str(tmp_path / "s")
    pr.create_stream(loc, "k INT")
    code, _, err = run_cli(capsys, "describe", loc, "--idle-timeout=-3s")
    assert code == 2 and "--idle-timeout" in err and len(err.strip().splitlines()) == 1


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus exposition by (name, sorted labels)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(got: dict, name: str, stream: str, partition: str | None = None) -> float | None:
    labels = {"stream": stream}
    if partition is not None:
        labels["partition"] = partition
    return got.get((name, tuple(sorted(labels.items()))))


def _quarantine(location: str, options: dict[str, str]) -> list[dict[str, Any]]:
    meta = open_stream(location).meta  # the stream's defaults, as format("rowtime") uses them
    cfg = parse_reader_options({"path": location, **options, "output": "discarded"}, meta.defaults)
    schema = output_arrow_schema(meta.payload_schema, "discarded")
    rows: list[dict[str, Any]] = []
    for task in batch_tasks(cfg):
        rows += pa.Table.from_batches(list(read_task(cfg, task, schema)), schema).to_pylist()
    return rows


def test_metrics_are_the_logs_and_the_quarantines_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loc = str(tmp_path / "s")
    _, at = silent_stream(loc, order="adjust", adjust_unit="sec", adjust_range=2, idle_timeout="5s")
    code, out, _ = run_cli(capsys, "metrics", loc)
    assert code == 0
    got = samples(out)
    stream = open_stream(loc)
    quarantine = _quarantine(loc, {})
    assert [(q["partition"], q["k"], q["reason"]) for q in quarantine] == [(1, 99, "idle")]
    for p in range(2):
        tail = stream.tail(p)
        assert value(got, "rowtime_records_total", loc, str(p)) == tail.end
        discarded = sum(1 for q in quarantine if q["partition"] == p)
        assert value(got, "rowtime_discarded_rows_total", loc, str(p)) == discarded
        folder = Path(loc) / partition_dirname(p)
        files = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
        assert value(got, "rowtime_bytes", loc, str(p)) == files
        assert value(got, "rowtime_first_kept_offset", loc, str(p)) == 0
    # adjust, range 2 s: each partition's clock is its highest rowtime - 2 s; partition 1
    # holds its rows of the last 2 s: 1031 (at the clock), 1032 and 1033
    assert value(got, "rowtime_partition_clock_seconds", loc, "0") == 1021 - 2
    assert value(got, "rowtime_partition_clock_seconds", loc, "1") == 1033 - 2
    assert value(got, "rowtime_held_rows", loc, "0") == 0
    assert value(got, "rowtime_held_rows", loc, "1") == 3
    # partition 0 is idle (silent since +21 s; partition 1 wrote until +33 s): the stream
    # clock is partition 1's
    assert value(got, "rowtime_partition_idle", loc, "0") == 1
    assert value(got, "rowtime_partition_idle", loc, "1") == 0
    assert value(got, "rowtime_stream_clock_seconds", loc) == 1031
    newest = stream.tail(1).last_arrival_us
    assert newest is not None
    assert value(got, "rowtime_clock_lag_seconds", loc, "") == pytest.approx(
        (newest - 1031 * S) / S
    )
    assert value(got, "rowtime_clock_lag_seconds", loc, "0") == pytest.approx(
        (at["p0_last"] - 1019 * S) / S
    )
    assert value(got, "rowtime_sink_clock_seconds", loc) is None  # not a sink target


def test_without_idle_timeout_no_partition_is_idle_and_the_slowest_holds_the_clock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loc = str(tmp_path / "s")
    silent_stream(loc, order="drop")
    got = samples(run_cli(capsys, "metrics", loc)[1])
    assert value(got, "rowtime_partition_idle", loc, "0") is None
    assert value(got, "rowtime_stream_clock_seconds", loc) == 1021  # partition 0's
    assert value(got, "rowtime_discarded_rows_total", loc, "1") == 0  # 1005 >= its clock


def test_a_sink_targets_clock_is_a_series(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stream the sink writes (its sink folder says so) has rowtime_sink_clock_seconds:
    the clock the sink's bounds give it; several locations in one exposition."""
    target = str(tmp_path / "t")
    pr.create_stream(target, "k INT")
    with pr.open_writer(target, 0) as w:
        w.insert({"k": 1}, rowtime=5_000)
        w.set_rowtime_bound(7_000)
    (Path(target) / SINK_DIR).mkdir()
    (Path(target) / SINK_DIR / SINK_TARGET_FILE).write_text(json.dumps({"kind": "stream"}))
    other = str(tmp_path / "o")
    pr.create_stream(other, "k INT")
    got = samples(run_cli(capsys, "metrics", target, other)[1])
    assert value(got, "rowtime_sink_clock_seconds", target) == 7.0
    assert value(got, "rowtime_stream_clock_seconds", target) == 7.0
    assert value(got, "rowtime_records_total", other, "0") == 0
    assert value(got, "rowtime_stream_clock_seconds", other) is None  # no clock yet
    assert value(got, "rowtime_sink_clock_seconds", other) is None


def test_the_end_of_stream_is_a_clock_like_any_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loc = str(tmp_path / "s")
    pr.create_stream(loc, "k INT")
    with pr.open_writer(loc, 0) as w:
        w.insert({"k": 1}, rowtime=5_000)
        w.end_stream()
    got = samples(run_cli(capsys, "metrics", loc)[1])
    assert value(got, "rowtime_stream_clock_seconds", loc) == END_OF_STREAM_US / S


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_connect_serves_the_same_metrics_at_slash_metrics(tmp_path: Path) -> None:
    from pyspark_rowtime.cli import connect
    from pyspark_rowtime.streams.catalog import load_catalog

    catalog = tmp_path / "catalog.toml"
    catalog.write_text(
        '[streams.orders]\nlocation = "data/orders"\nschema = "qty INT"\n\n'
        '[connectors.gen]\nkind = "generator"\nstream = "orders"\nrate = 1000\ncount = 50\n'
        'bounds = { strategy = "source" }\n'
    )
    port = _free_port()
    stop = threading.Event()
    out = io.StringIO()
    result: list[int] = []

    def feed() -> None:
        cat = load_catalog(str(catalog))
        result.append(
            connect(cat, "gen", out=out, stop=stop, install_signals=False, metrics_port=port)
        )

    thread = threading.Thread(target=feed)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while True:  # until the 50 rows are in: the generator writes them within a second
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    text = r.read().decode()
            except OSError:
                text = ""
            loc = str(tmp_path / "data" / "orders")
            got = samples(text) if text else {}
            if (value(got, "rowtime_records_total", loc, "0") or 0) >= 50:
                break
            assert time.monotonic() < deadline, out.getvalue()
            time.sleep(0.1)
    finally:
        stop.set()
        thread.join(60)
    assert result == [0]
    assert f"metrics at http://127.0.0.1:{port}/metrics" in out.getvalue()
    assert samples(text).keys() == samples(main_metrics(loc)).keys()


def main_metrics(loc: str) -> str:
    from pyspark_rowtime.metrics import exposition

    return exposition([loc])


def test_without_the_prometheus_client_the_command_says_what_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    loc = str(tmp_path / "s")
    pr.create_stream(loc, "k INT")
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    code, out, err = run_cli(capsys, "metrics", loc)
    assert code == 2 and out == ""
    assert "pip install 'pyspark-rowtime[metrics]'" in err and len(err.strip().splitlines()) == 1

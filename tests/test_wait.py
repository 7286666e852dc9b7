"""``rowtime wait`` and ``wait_for_rowtime_bound``: exit 0 as soon as the clock reaches TIME, 1
with one line on timeout, 2 for bad input; on streams, stream targets, Parquet, Delta and
Iceberg targets. The polling core runs on a clock the tests drive; two tests wait for real while
another thread or process moves a stream's clock."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading
import time

import pytest
from sink_helpers import make, records, run
from table_builders import (
    delta_commit,
    iceberg_catalog_env,
    iceberg_commit,
    make_delta_target,
    make_iceberg_target,
)

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.errors import (
    InvalidRowtimeError,
    OptionError,
    StreamNotFoundError,
    WaitTimeoutError,
)
from pyspark_rowtime.bounds.time import from_rowtime_us
from pyspark_rowtime.cli import main
from pyspark_rowtime.wait import parse_timeout_s, wait_for_clock

HOUR = 3_600_000_000
T0 = 1_714_557_600_000_000  # 2024-05-01T10:00:00Z
T0_TEXT = "2024-05-01T10:00:00Z"


class Driven:
    """Monotonic seconds the test drives: ``sleep`` advances them (and runs ``on_sleep``)."""

    def __init__(self, on_sleep=None) -> None:
        self.t = 1000.0
        self.pauses: list[float] = []
        self.on_sleep = on_sleep

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        assert s >= 0
        self.pauses.append(s)
        self.t += s
        if self.on_sleep is not None:
            self.on_sleep(len(self.pauses))


# -- the polling core ----------------------------------------------------------------------------


def test_a_clock_already_there_costs_one_read_and_no_pause():
    d = Driven()
    got = wait_for_clock(lambda: T0, T0, timeout_s=None, now=d.now, sleep=d.sleep)
    assert (got.clock_us, got.reads, got.waited_s) == (T0, 1, 0.0)
    assert d.pauses == []


def test_pauses_double_from_a_tenth_of_a_second_up_to_poll():
    d = Driven()
    clocks = iter([None, T0 - 5, T0 - 4, T0 - 3, T0 - 2, T0 - 1, T0 - 1, T0 + 7])
    got = wait_for_clock(
        lambda: next(clocks), T0, timeout_s=None, poll_s=1.0, now=d.now, sleep=d.sleep
    )
    assert d.pauses == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert got.clock_us == T0 + 7 and got.reads == 8
    assert got.waited_s == pytest.approx(4.5)


def test_a_poll_below_the_first_pause_is_the_pause():
    d = Driven()
    clocks = iter([None, None, T0])
    wait_for_clock(lambda: next(clocks), T0, timeout_s=None, poll_s=0.02, now=d.now, sleep=d.sleep)
    assert d.pauses == [0.02, 0.02]


def test_timeout_reads_once_more_at_the_deadline_and_says_where_things_stand():
    d = Driven()
    reads = []

    def read() -> int:
        reads.append(d.t)
        return T0 - HOUR

    with pytest.raises(WaitTimeoutError) as e:
        wait_for_clock(
            read,
            T0,
            timeout_s=1.0,
            poll_s=5.0,
            now=d.now,
            sleep=d.sleep,
            what="the clock of /data/x",
        )
    assert d.pauses == pytest.approx([0.1, 0.2, 0.4, 0.3])  # the last pause ends at the deadline
    assert reads[-1] == pytest.approx(1001.0)
    assert str(e.value) == (
        "timed out after 1.00 s: the clock of /data/x is 2024-05-01T09:00:00Z, waiting for "
        "2024-05-01T10:00:00Z"
    )
    assert (e.value.clock_us, e.value.until_us) == (T0 - HOUR, T0)
    assert e.value.waited_s == pytest.approx(1.0)
    assert isinstance(e.value, TimeoutError) and isinstance(e.value, pr.RowtimeError)


def test_timeout_zero_reads_once():
    d = Driven()
    with pytest.raises(WaitTimeoutError, match=r"is none \(nothing moved it yet\)"):
        wait_for_clock(lambda: None, T0, timeout_s=0.0, now=d.now, sleep=d.sleep)
    assert d.pauses == []


@pytest.mark.parametrize(
    ("given", "seconds"),
    [(0, 0.0), ("0", 0.0), ("0s", 0.0), (" 0.0 min ", 0.0), (dt.timedelta(0), 0.0),
     ("90s", 90.0), ("2 h", 7200.0), (1.5, 1.5), (dt.timedelta(minutes=1), 60.0)],
)  # fmt: skip
def test_timeouts_read_as_durations_and_zero(given, seconds):
    assert parse_timeout_s(given, what="--timeout") == seconds


@pytest.mark.parametrize("given", ["-1s", "0 parsecs", "soon", True, -2])
def test_bad_timeouts_are_refused(given):
    with pytest.raises(OptionError, match="--timeout"):
        parse_timeout_s(given, what="--timeout")


# -- the API on each kind of location --------------------------------------------------------------


def _stream(tmp_path, clock_us: int | None = None) -> str:
    path = str(tmp_path / "s")
    pr.create_stream(path, "a INT")
    if clock_us is not None:
        _bound(path, clock_us)
    return path


def _bound(path: str, clock_us: int) -> None:
    with pr.open_writer(path) as w:
        w.set_rowtime_bound(from_rowtime_us(clock_us))


def test_api_waits_on_a_stream_while_a_writer_moves_its_clock(tmp_path):
    path = _stream(tmp_path, T0 - HOUR)
    d = Driven(on_sleep=lambda n: n == 3 and _bound(path, T0 + 1))  # another writer, mid-wait
    got = pr.wait_for_rowtime_bound(path, T0_TEXT, timeout="1h", now=d.now, sleep=d.sleep)
    assert got == from_rowtime_us(T0 + 1)
    assert len(d.pauses) == 3


def test_api_times_out_with_the_clock_and_the_time_awaited(tmp_path):
    path = _stream(tmp_path, T0 - HOUR)
    d = Driven()
    until = dt.datetime(2024, 5, 1, 10, tzinfo=dt.timezone.utc)
    with pytest.raises(WaitTimeoutError) as e:
        pr.wait_for_rowtime_bound(path, until, timeout=30, poll="10s", now=d.now, sleep=d.sleep)
    assert str(e.value) == (
        f"timed out after 30 s: the clock of {path} is 2024-05-01T09:00:00Z, waiting for "
        "2024-05-01T10:00:00Z"
    )
    assert max(d.pauses) == 10.0 and sum(d.pauses) == pytest.approx(30.0)


def test_api_on_a_pending_stream_target_then_its_first_commit(tmp_path):
    target = make(tmp_path, "stream")  # the stream comes with the query's first commit
    path = target.cfg.location

    def commit(n: int) -> None:
        if n == 2:
            run(target, 0, [[records([(1, T0 - 5)], bound=T0)]])

    d = Driven(on_sleep=commit)
    assert pr.wait_for_rowtime_bound(path, T0_TEXT, now=d.now, sleep=d.sleep) == from_rowtime_us(T0)


def test_api_on_a_parquet_target(tmp_path):
    target = make(tmp_path, "parquet")
    run(target, 0, [[records([(1, T0 + 5)], bound=T0 + HOUR)]])
    d = Driven()
    got = pr.wait_for_rowtime_bound(
        target.cfg.location, (T0 + HOUR) // 1000, now=d.now, sleep=d.sleep
    )  # an int: epoch milliseconds
    assert got == from_rowtime_us(T0 + HOUR) and d.pauses == []


def test_api_on_a_delta_target_sees_commits_made_while_it_waits(tmp_path):
    path = make_delta_target(tmp_path / "t")
    delta_commit(path, [(1, T0 - 5)], clock_us=T0 - HOUR, batch=0)

    def commit(n: int) -> None:
        if n in (2, 4):
            delta_commit(path, [(n, T0 + n)], clock_us=T0 - HOUR + n * HOUR // 4, batch=n)

    d = Driven(on_sleep=commit)
    assert pr.wait_for_rowtime_bound(path, T0_TEXT, now=d.now, sleep=d.sleep) == from_rowtime_us(T0)
    assert len(d.pauses) == 4


def test_api_on_a_delta_target_created_while_it_waits(tmp_path):
    from deltalake import DeltaTable

    path = make_delta_target(tmp_path / "t", table=False)

    def first_commit(n: int) -> None:
        if n == 1:
            import pyarrow as pa

            DeltaTable.create(
                path,
                pa.schema([("k", pa.int64()), ("rowtime_hour", pa.string())]),
                partition_by=["rowtime_hour"],
            )
        if n == 2:
            delta_commit(path, [], clock_us=T0, batch=0)

    d = Driven(on_sleep=first_commit)
    assert pr.wait_for_rowtime_bound(path, T0_TEXT, now=d.now, sleep=d.sleep) == from_rowtime_us(T0)


def test_api_on_an_iceberg_target_sees_commits_made_while_it_waits(tmp_path, monkeypatch):
    iceberg_catalog_env(monkeypatch, tmp_path / "iceberg")
    table = "iceberg://local/db.events"
    make_iceberg_target(table)

    def commit(n: int) -> None:
        if n == 3:
            iceberg_commit(table, [(1, T0 - 5)], clock_us=T0 + 2, batch=0)

    d = Driven(on_sleep=commit)
    assert pr.wait_for_rowtime_bound(table, T0_TEXT, now=d.now, sleep=d.sleep) == from_rowtime_us(
        T0 + 2
    )
    with pytest.raises(WaitTimeoutError, match=r"the clock of iceberg://local/db\.events is "):
        pr.wait_for_rowtime_bound(table, (T0 + HOUR) // 1000, 0)


def test_api_refuses_what_it_cannot_wait_on(tmp_path, monkeypatch):
    with pytest.raises(StreamNotFoundError):
        pr.wait_for_rowtime_bound(tmp_path / "nothing", T0_TEXT, timeout=0)
    iceberg_catalog_env(monkeypatch, tmp_path / "iceberg")
    with pytest.raises(StreamNotFoundError, match=r"no Iceberg table iceberg://local/db\.missing"):
        pr.wait_for_rowtime_bound("iceberg://local/db.missing", T0_TEXT, timeout=0)
    path = _stream(tmp_path)
    with pytest.raises(InvalidRowtimeError):
        pr.wait_for_rowtime_bound(path, "yesterday-ish", timeout=0)
    with pytest.raises(OptionError, match="poll"):
        pr.wait_for_rowtime_bound(path, T0_TEXT, timeout=0, poll=0)


def test_api_waits_for_real_while_a_thread_writes(tmp_path):
    path = _stream(tmp_path, T0 - HOUR)
    writer = threading.Timer(0.3, _bound, (path, T0))
    started = time.monotonic()
    writer.start()
    try:
        got = pr.wait_for_rowtime_bound(path, T0_TEXT, timeout="30s", poll="0.2s")
    finally:
        writer.join()
    assert got == from_rowtime_us(T0)
    assert 0.3 <= time.monotonic() - started < 10


# -- the command ---------------------------------------------------------------------------------


def test_cli_exit_0_when_the_clock_is_there(tmp_path, capsys):
    path = _stream(tmp_path, T0)
    assert main(["wait", path, "--until", T0_TEXT]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"clock 2024-05-01T10:00:00Z of {path} reached 2024-05-01T10:00:00Z")
    assert main(["wait", path, "--until", str(T0 // 1000)]) == 0  # epoch ms, the stream's unit
    assert main(["wait", path, "--until", str(T0 // 1_000_000), "--unit", "s"]) == 0
    assert main(["wait", path, "--until", str(T0 + 1), "--unit", "us", "--timeout", "0"]) == 1


def test_cli_exit_1_on_timeout_with_one_line(tmp_path, capsys):
    path = _stream(tmp_path, T0 - HOUR)
    started = time.monotonic()
    assert main(["wait", path, "--until", T0_TEXT, "--timeout", "0.5s", "--poll", "0.1s"]) == 1
    assert 0.5 <= time.monotonic() - started < 5
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("rowtime wait: timed out after 0.5")
    assert f"the clock of {path} is 2024-05-01T09:00:00Z, waiting for 2024-05-01T10:00:00Z" in err


def test_cli_on_every_kind_of_target(tmp_path, monkeypatch, capsys):
    pending = make(tmp_path / "p", "stream").cfg.location
    assert main(["wait", pending, "--until", T0_TEXT, "--timeout", "0"]) == 1
    assert "is none (nothing moved it yet)" in capsys.readouterr().err

    parquet = make(tmp_path / "q", "parquet")
    run(parquet, 0, [[records([(1, T0 + 5)], bound=T0 + HOUR)]])
    delta = make_delta_target(tmp_path / "d")
    delta_commit(delta, [(1, T0 + 5)], clock_us=T0 + HOUR, batch=0)
    iceberg_catalog_env(monkeypatch, tmp_path / "iceberg")
    iceberg = "iceberg://local/db.events"
    make_iceberg_target(iceberg)
    iceberg_commit(iceberg, [(1, T0 + 5)], clock_us=T0 + HOUR, batch=0)
    for location in (parquet.cfg.location, delta, iceberg):
        assert main(["wait", location, "--until", "2024-05-01T11:00:00Z"]) == 0, location
        assert "reached 2024-05-01T11:00:00Z" in capsys.readouterr().out
        argv = ["wait", location, "--until", "2024-05-01T11:00:00.000001", "--timeout", "0"]
        assert main(argv) == 1, location
        assert "is 2024-05-01T11:00:00Z, waiting for 2024-05-01T11:00:00.000001Z" in (
            capsys.readouterr().err
        )


def test_cli_end_of_stream(tmp_path, capsys):
    path = _stream(tmp_path)
    with pr.open_writer(path) as w:
        w.end_stream()
    assert main(["wait", path, "--until", "end"]) == 0
    assert "reached end" in capsys.readouterr().out.lower()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--until", "noonish"], "noonish"),
        (["--until", T0_TEXT, "--timeout", "soon"], "--timeout"),
        (["--until", T0_TEXT, "--poll", "0"], "--poll"),
        (["--until", T0_TEXT, "--timeout=-5s"], "--timeout"),
    ],
)
def test_cli_exit_2_for_bad_input(tmp_path, capsys, argv, says):
    path = _stream(tmp_path, T0)
    assert main(["wait", path, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rowtime wait: error: ") and says in err and err.count("\n") == 1


def test_cli_exit_2_when_there_is_nothing_to_wait_on(tmp_path, monkeypatch, capsys):
    assert main(["wait", str(tmp_path / "nothing"), "--until", T0_TEXT]) == 2
    assert "rowtime wait: error: " in capsys.readouterr().err
    iceberg_catalog_env(monkeypatch, tmp_path / "iceberg")
    assert main(["wait", "iceberg://local/db.missing", "--until", T0_TEXT]) == 2
    assert "no Iceberg table iceberg://local/db.missing" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["wait", str(tmp_path)])  # no --until
    assert e.value.code == 2


def test_cli_help_names_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["wait", "--help"])
    text = capsys.readouterr().out
    for option in ("--until TIME", "--timeout DURATION", "--poll DURATION", "--unit"):
        assert option in text
    assert "exit 1" in text.lower() or "Exit 1" in text


def test_a_rowtime_wait_process_returns_when_another_process_writes_the_bound(tmp_path):
    path = _stream(tmp_path, T0 - HOUR)
    cmd = [
        sys.executable,
        "-m",
        "pyspark_rowtime.cli",
        "wait",
        path,
        "--until",
        T0_TEXT,
        "--timeout",
        "60s",
        "--poll",
        "0.2s",
    ]
    waiter = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)  # it started, read the clock, and waits
        assert waiter.poll() is None
        bound = subprocess.run(
            [sys.executable, "-m", "pyspark_rowtime.cli", "bound", path, T0_TEXT],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert bound.returncode == 0, bound.stderr
        out, err = waiter.communicate(timeout=30)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert waiter.returncode == 0, err
    assert "reached 2024-05-01T10:00:00Z" in out

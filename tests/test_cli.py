"""The ``rowtime`` command, run as the installed console script and through ``main(argv)``."""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

import pyspark_rowtime.cli as cli_module
from pyspark_rowtime.api import create_stream, open_writer, read_stream
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.cli import build_parser, commands, main
from pyspark_rowtime.streams.local.log import open_stream

JAN1 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
JAN1_US = 1_704_067_200_000_000
SCRIPT = shutil.which("rowtime", path=str(Path(sys.executable).parent)) or "rowtime"


def rowtime(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run the real console script."""
    return subprocess.run(
        [SCRIPT, *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


def run(capsys, *args: str) -> tuple[int, str, str]:
    """Run main(argv) in this process."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, *says: str) -> None:
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    for part in says:
        assert part in err, err


# -- through the console script ----------------------------------------------------------------


def test_the_console_script_creates_inserts_and_reports_the_clock(tmp_path):
    loc = str(tmp_path / "s")
    done = rowtime("create", loc, "--schema", "id INT, name STRING, ts TIMESTAMP")
    assert done.returncode == 0, done.stderr
    assert "id INT, name STRING, ts TIMESTAMP" in done.stdout
    lines = [
        {"id": 1, "name": "a", "ts": "2024-01-01T00:00:00Z"},
        {"id": 2, "name": "b", "ts": "2024-01-01T00:00:01Z"},
    ]
    done = rowtime(
        "insert", loc, "--rowtime-column", "ts", stdin="\n".join(map(json.dumps, lines)) + "\n"
    )
    assert done.returncode == 0, done.stderr
    assert "inserted 2 row(s)" in done.stdout
    done = rowtime("clock", loc)
    assert (done.returncode, done.stdout.strip()) == (0, "2024-01-01T00:00:01Z")
    recs = read_stream(loc).to_pylist()
    assert [r["rowtime"] for r in recs] == [JAN1, JAN1 + dt.timedelta(seconds=1)]
    assert recs[0]["ts"] == JAN1


def test_the_console_script_reports_user_mistakes_in_one_line_with_status_2(tmp_path):
    done = rowtime("create", str(tmp_path / "s"), "--schema", "a INTT")
    assert done.returncode == 2
    assert_one_line_error(done.stderr, "rowtime create: error:", "position 2", "INTT")
    done = rowtime("describe", str(tmp_path / "nope"))
    assert done.returncode == 2
    assert_one_line_error(done.stderr, "no rowtime stream", "rowtime create")
    done = rowtime("create", str(tmp_path / "s"))  # argparse: --schema is required
    assert done.returncode == 2 and "--schema" in done.stderr


def test_tail_follow_prints_new_records_as_they_are_committed(tmp_path):
    loc = str(tmp_path / "s")
    create_stream(loc, "a INT")
    with open_writer(loc) as w:
        w.insert({"a": 1})
    proc = subprocess.Popen(
        [SCRIPT, "tail", loc, "--follow", "--interval", "0.02"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert first["a"] == 1 and first["offset"] == 0
        with open_writer(loc) as w:
            w.insert({"a": 2})
        second = json.loads(proc.stdout.readline())  # blocks until tail prints it
        assert second["a"] == 2 and second["offset"] == 1
    finally:
        proc.terminate()
        proc.wait(30)


# -- create ------------------------------------------------------------------------------------


def test_create_takes_partitions_and_defaults_and_is_a_no_op_the_second_time(tmp_path, capsys):
    loc = str(tmp_path / "s")
    args = ("create", loc, "--schema", "a INT", "--partitions", "3")
    defaults = ("--default", "order=adjust", "--default", "adjust_range=999")
    code, out, _ = run(capsys, *args, *defaults)
    assert code == 0 and "3 partition(s)" in out
    meta = open_stream(loc).meta
    assert meta.partitions == 3
    assert meta.defaults == {"order": "adjust", "adjust_range": 999}
    assert run(capsys, *args)[0] == 0


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (("--default", "colour=red"), "unknown stream default 'colour'; known defaults: order"),
        (("--default", "order"), "is not key=value"),
        (("--default", "adjust_range=-3"), "adjust_range must be a whole number >= 0"),
        (("--partitions", "0"), "partitions=0 must be a whole number >= 1"),
    ],
)
def test_create_refuses_bad_options_in_one_line(tmp_path, capsys, extra, says):
    code, _, err = run(capsys, "create", str(tmp_path / "s"), "--schema", "a INT", *extra)
    assert code == 2
    assert_one_line_error(err, says)
    assert not (tmp_path / "s" / "_stream.json").exists()


# -- insert ------------------------------------------------------------------------------------


@pytest.fixture
def loc(tmp_path):
    path = str(tmp_path / "s")
    create_stream(path, "id INT, name STRING, price DECIMAL(6,2), day DATE, tags ARRAY<STRING>", 2)
    return path


def test_insert_reads_json_lines_from_a_file_into_a_partition(loc, tmp_path, capsys):
    src = tmp_path / "rows.jsonl"
    src.write_text(
        '{"id": 1, "name": "a", "price": "1.50", "day": "2024-01-01", "tags": ["x"], '
        '"event": "2024-01-01T00:00:00Z"}\n'
        "\n"
        '{"id": 2, "event": 1704067200000}\n'
    )
    code, out, _ = run(
        capsys, "insert", loc, str(src), "--partition", "1", "--rowtime-column", "event"
    )
    assert code == 0 and "inserted 2 row(s) into partition 1" in out
    recs = read_stream(loc).to_pylist()
    assert [r["partition"] for r in recs] == [1, 1]
    assert recs[0]["tags"] == ["x"] and str(recs[0]["price"]) == "1.50"
    assert recs[0]["day"] == dt.date(2024, 1, 1)
    assert recs[0]["rowtime"] == recs[1]["rowtime"] == JAN1  # epochs in ms by default
    assert "event" not in recs[1]


def test_insert_reads_csv_with_a_header_and_an_epoch_rowtime_unit(loc, tmp_path, capsys):
    src = tmp_path / "rows.csv"
    src.write_text('id,name,ts,tags\n1,a,1704067200,"[""p"",""q""]"\n2,,1704067201,\n')
    code, _, err = run(
        capsys, "insert", loc, str(src), "--format", "csv", "--rowtime-column", "ts",
        "--rowtime-unit", "s",
    )  # fmt: skip
    assert code == 0, err
    recs = read_stream(loc).to_pylist()
    assert [r["id"] for r in recs] == [1, 2]
    assert [r["name"] for r in recs] == ["a", None]  # an empty cell is null, as in Spark
    assert recs[0]["tags"] == ["p", "q"]
    assert [r["rowtime"] for r in recs] == [JAN1, JAN1 + dt.timedelta(seconds=1)]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"id": 1}\n{"id": "x"}\n', "line 2: column 'id'"),
        ('{"id": 1}\nnot json\n', "line 2: not valid JSON"),
        ('{"id": 1}\n[1, 2]\n', "line 2: a JSON object per line"),
        ('{"id": 1}\n{"nope": 1}\n', "line 2: row has unknown column 'nope'"),
        ('{"id": 1}\n{"day": "someday"}\n', "line 2: column 'day': cannot read 'someday'"),
    ],
)
def test_insert_of_a_file_with_a_bad_line_names_it_and_stores_none_of_the_file(
    loc, tmp_path, capsys, text, says
):
    src = tmp_path / "rows.jsonl"
    src.write_text(text)
    code, _, err = run(capsys, "insert", loc, str(src))
    assert code == 2
    assert_one_line_error(err, str(src), says, f"nothing of {src} was stored", "fix line 2")
    assert read_stream(loc).num_rows == 0


def test_insert_into_a_locked_partition_names_the_holder(loc, tmp_path, capsys):
    src = tmp_path / "rows.jsonl"
    src.write_text('{"id": 1}\n')
    with open_writer(loc, 0):
        code, _, err = run(capsys, "insert", loc, str(src))
    assert code == 2
    assert_one_line_error(err, "partition 0", "already has a writer", str(os.getpid()))


def test_insert_of_a_missing_file_is_one_line(loc, tmp_path, capsys):
    code, _, err = run(capsys, "insert", loc, str(tmp_path / "missing.jsonl"))
    assert code == 2
    assert_one_line_error(err, "missing.jsonl")


# -- bound -------------------------------------------------------------------------------------


def test_bound_goes_to_every_partition_or_one(loc, capsys):
    code, out, _ = run(capsys, "bound", loc, "2024-01-01T00:00:00Z")
    assert code == 0 and "every partition" in out
    assert open_stream(loc).stream_clock_us() == JAN1_US
    assert run(capsys, "bound", loc, "1704067200000", "--strict", "--partition", "1")[0] == 0
    stream = open_stream(loc)
    assert (stream.clock_us(0), stream.clock_us(1)) == (JAN1_US, JAN1_US + 1)
    assert run(capsys, "bound", loc, "end")[0] == 0
    assert open_stream(loc).stream_clock_us() == END_OF_STREAM_US


def test_a_bound_that_goes_back_on_any_partition_is_written_to_none(loc, capsys):
    with open_writer(loc, 1) as w:
        w.set_rowtime_bound(JAN1)
    before = [open_stream(loc).end_offset(p) for p in (0, 1)]
    code, _, err = run(capsys, "bound", loc, "2023-06-01T00:00:00Z")
    assert code == 2
    assert_one_line_error(err, "bounds never move backwards", "partition 1")
    assert [open_stream(loc).end_offset(p) for p in (0, 1)] == before


def test_a_bad_bound_time_says_what_is_accepted(loc, capsys):
    code, _, err = run(capsys, "bound", loc, "tomorrow-ish")
    assert code == 2
    assert_one_line_error(err, "tomorrow-ish", "ISO-8601")


# -- describe, clock, tail -------------------------------------------------------------------


def test_describe_shows_counts_clocks_arrival_and_skew(loc, capsys):
    with open_writer(loc, 0, clock=lambda: JAN1_US + 5_000_000) as w:
        w.insert({"id": 1}, rowtime=JAN1)
        w.insert({"id": 2}, rowtime=JAN1 + dt.timedelta(seconds=3))
        w.set_rowtime_bound(JAN1 + dt.timedelta(seconds=4))
    code, out, _ = run(capsys, "describe", loc, "--json")
    assert code == 0
    info = json.loads(out)
    p0, p1 = info["partition_info"]
    assert (p0["records"], p0["rows"], p0["bounds"]) == (3, 2, 1)
    assert p0["clock"] == "2024-01-01T00:00:04Z"
    assert p0["last_arrival"] == "2024-01-01T00:00:05Z"
    assert (p0["skew_latest_us"], p0["skew_max_us"]) == (2_000_000, 5_000_000)
    assert p1["records"] == 0 and p1["clock"] is None
    assert info["stream_clock"] is None and info["partitions"] == 2
    code, out, _ = run(capsys, "describe", loc)
    assert code == 0
    assert "2024-01-01T00:00:04Z" in out and "stream clock  none" in out
    assert "2.000000 s" in out and "5.000000 s" in out


def test_clock_prints_none_then_the_stream_clock(loc, capsys):
    assert run(capsys, "clock", loc)[1].strip() == "none"
    run(capsys, "bound", loc, "2024-01-01T00:00:00Z")
    assert run(capsys, "clock", loc)[1].strip() == "2024-01-01T00:00:00Z"
    assert run(capsys, "clock", loc, "--us")[1].strip() == str(JAN1_US)


def test_tail_prints_the_last_records_as_json_lines(loc, capsys):
    with open_writer(loc, 0) as w:
        for i in range(5):
            w.insert({"id": i, "tags": ["t"]})
        w.set_rowtime_bound(JAN1 + dt.timedelta(days=10_000))
    code, out, _ = run(capsys, "tail", loc, "-n", "3")
    assert code == 0
    recs = [json.loads(line) for line in out.splitlines()]
    assert [r["offset"] for r in recs] == [3, 4, 5]
    assert recs[0]["id"] == 3 and recs[0]["tags"] == ["t"] and recs[0]["is_bound"] is False
    assert recs[2]["is_bound"] is True and "id" not in recs[2]
    assert run(capsys, "tail", loc, "-n", "0")[1] == ""


def test_tail_follow_can_be_driven_in_process(loc, capsys, monkeypatch):
    calls = []

    def fake_sleep(seconds: float) -> None:
        calls.append(seconds)
        if len(calls) == 1:
            with open_writer(loc, 1) as w:
                w.insert({"id": 7})
        else:
            raise KeyboardInterrupt

    # the cli module's time only: time.sleep itself is every thread's (pytest-xdist's channel)
    fake_time = types.SimpleNamespace(sleep=fake_sleep, time_ns=time.time_ns)
    monkeypatch.setattr(cli_module, "time", fake_time)
    code, out, _ = run(capsys, "tail", loc, "--follow")
    assert code == 130
    assert json.loads(out.strip())["id"] == 7


def test_tail_orders_partitions_by_arrival_time(loc, capsys):
    with open_writer(loc, 1, clock=lambda: JAN1_US + 1) as w:
        w.insert({"id": 1})
    with open_writer(loc, 0, clock=lambda: JAN1_US) as w:  # whole second: ISO has no fraction
        w.insert({"id": 0})
    out = run(capsys, "tail", loc)[1]
    assert [json.loads(line)["id"] for line in out.splitlines()] == [0, 1]


def test_insert_of_input_that_is_not_text_is_one_line(loc, tmp_path, capsys):
    src = tmp_path / "rows.jsonl"
    src.write_bytes(b'{"id": 1}\n\xff\xfe\x00garbage\n')
    code, _, err = run(capsys, "insert", loc, str(src))
    assert code == 2
    assert_one_line_error(err, "line 2: not UTF-8: byte 0xff at column 1", "nothing of")
    assert read_stream(loc).num_rows == 0


# -- what a newcomer meets: the input format, a command's own usage, a help line per option ----


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("orders.csv", "id,name\n1,a\n2,b\n", "as CSV with a header (its extension .csv"),
        ("orders.CSV", "id,name\n1,a\n2,b\n", "as CSV with a header (its extension .csv"),
        ("orders.jsonl", '{"id": 1, "name": "a"}\n{"id": 2}\n', "as JSON lines (its extension"),
        ("orders.json", '{"id": 1, "name": "a"}\n{"id": 2}\n', "as JSON lines (its extension"),
        ("orders.ndjson", '{"id": 1, "name": "a"}\n{"id": 2}\n', "as JSON lines (its extension"),
        (
            "orders.txt",
            '{"id": 1, "name": "a"}\n{"id": 2}\n',
            "as JSON lines (extension .txt not known",
        ),
    ],
)
def test_insert_takes_the_format_from_the_extension_and_says_which(
    loc, tmp_path, capsys, name, text, says
):
    src = tmp_path / name
    src.write_text(text)
    code, out, err = run(capsys, "insert", loc, str(src))
    assert code == 0, err
    assert "inserted 2 row(s)" in out
    assert f"rowtime insert: read {src} {says}" in err, err
    assert [r["id"] for r in read_stream(loc).to_pylist()] == [1, 2]


def test_insert_format_given_wins_over_the_extension_and_a_wrong_guess_says_so(
    loc, tmp_path, capsys
):
    src = tmp_path / "rows.csv"
    src.write_text('{"id": 1}\n')
    code, _, err = run(capsys, "insert", loc, str(src), "--format", "jsonl")
    assert code == 0 and "as JSON lines (--format)" in err, err
    src = tmp_path / "really-json.csv"
    src.write_text('{"id": 1}\n{"id": 2}\n')
    code, _, err = run(capsys, "insert", loc, str(src))
    assert code == 2
    assert_one_line_error(err, "read as CSV with a header", "--format jsonl to read it otherwise")


def test_insert_from_standard_input_stays_json_lines(loc, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO('{"id": 5}\n'))
    code, _, err = run(capsys, "insert", loc)
    assert code == 0 and "standard input as JSON lines" in err, err
    assert [r["id"] for r in read_stream(loc).to_pylist()] == [5]


@pytest.mark.parametrize(
    "args",
    [
        ("insert", "PATH", "--bogus"),
        ("create", "PATH", "--schema", "a INT", "--nope", "1"),
        ("clock", "PATH", "extra"),
        ("bound", "PATH", "now", "--partitions", "1"),
    ],
)
def test_an_unknown_word_after_a_command_shows_that_commands_usage(capsys, args):
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: rowtime {args[0]} "), err
    assert f"rowtime {args[0]}: error: unrecognized arguments" in err


def test_an_unknown_word_before_the_command_shows_the_top_level_usage(capsys):
    with pytest.raises(SystemExit):
        main(["--bogus", "clock", "PATH"])
    err = capsys.readouterr().err
    assert err.startswith("usage: rowtime [-h]") and "unrecognized arguments: --bogus" in err


def test_every_option_of_every_command_has_a_help_line():
    parser = build_parser()
    missing = []
    for name, command in {"rowtime": parser, **commands(parser)}.items():
        for action in command._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            if not (action.help or "").strip():
                missing.append(f"{name} {action.option_strings or action.dest}")
    assert not missing, missing

"""``rowtime clock`` / ``rowtime describe`` and ``get_rowtime_bound`` on the sink's targets."""

from __future__ import annotations

import json

from sink_helpers import HOUR, T0, make, records, run

from pyspark_rowtime.api import get_rowtime_bound
from pyspark_rowtime.bounds.time import from_rowtime_us
from pyspark_rowtime.cli import main


def test_clock_and_describe_read_a_parquet_target(tmp_path, capsys):
    target = make(tmp_path, "parquet")
    path = target.cfg.location
    assert main(["clock", path]) == 0
    assert capsys.readouterr().out.strip() == "none"
    run(target, 0, [[records([(1, T0 + 5), (2, T0 + HOUR + 5)], bound=T0 + HOUR)]])
    assert get_rowtime_bound(path) == from_rowtime_us(T0 + HOUR)
    assert main(["clock", path, "--us"]) == 0
    assert capsys.readouterr().out.strip() == str(T0 + HOUR)
    assert main(["clock", path]) == 0
    assert capsys.readouterr().out.strip() == "2023-11-14T23:00:00Z"

    assert main(["describe", path]) == 0
    text = capsys.readouterr().out
    assert "parquet target" in text and "granularity     hour" in text
    assert "rowtime_hour=2023-11-14T22      1  yes" in text
    assert "rowtime_hour=2023-11-14T23      1  no" in text
    assert "clock  2023-11-14T23:00:00Z" in text

    assert main(["describe", path, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["clock_us"] == T0 + HOUR and info["last_batch"] == 0
    assert [p["complete"] for p in info["partitions"]] == [True, False]


def test_clock_and_describe_read_a_stream_target_as_a_stream(tmp_path, capsys):
    target = make(tmp_path, "stream")
    run(target, 0, [[records([(1, T0 + 5)], bound=T0 + HOUR)]])
    assert main(["clock", target.cfg.location]) == 0
    assert capsys.readouterr().out.strip() == "2023-11-14T23:00:00Z"
    assert main(["describe", target.cfg.location]) == 0
    assert "stream clock  2023-11-14T23:00:00Z" in capsys.readouterr().out


def test_a_stream_target_before_its_first_commit_has_no_clock_yet(tmp_path, capsys):
    target = make(tmp_path, "stream")  # the query started: the stream comes with its first commit
    path = target.cfg.location
    assert get_rowtime_bound(path) is None
    assert main(["clock", path]) == 0
    assert capsys.readouterr().out.strip() == "none"
    assert main(["describe", path]) == 0
    assert "not created yet" in capsys.readouterr().out
    assert main(["describe", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["created"] is False
    run(target, 0, [[records([(1, T0 + 5)])], [records([(2, T0 + 6)], bound=T0 + 9)]])
    assert get_rowtime_bound(path) == from_rowtime_us(T0 + 9)
    assert main(["describe", path]) == 0
    text = capsys.readouterr().out
    assert "stream clock  " in text and "not created" not in text

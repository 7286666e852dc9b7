"""``get_rowtime_bound``, ``rowtime clock``, ``rowtime describe`` and ``rowtime metrics`` on Delta
and Iceberg targets: real tables, written with delta-rs and pyiceberg as the sink lays them out
(``table_builders``), read back through the tables' own libraries."""

from __future__ import annotations

import json

import pytest
from table_builders import (
    delta_commit,
    iceberg_catalog_env,
    iceberg_commit,
    make_delta_target,
    make_iceberg_target,
)

from pyspark_rowtime import get_rowtime_bound
from pyspark_rowtime.bounds.errors import StreamNotFoundError
from pyspark_rowtime.bounds.time import from_rowtime_us
from pyspark_rowtime.cli import main
from pyspark_rowtime.metrics import exposition
from pyspark_rowtime.streams.storage import LocationKind, what_is_at

HOUR = 3_600_000_000
DAY = 24 * HOUR
T0 = 1_714_557_600_000_000  # 2024-05-01T10:00:00Z
TABLE = "iceberg://local/db.events"


@pytest.fixture
def iceberg(tmp_path, monkeypatch):
    iceberg_catalog_env(monkeypatch, tmp_path / "iceberg")
    return TABLE


# -- Delta ---------------------------------------------------------------------------------------


def test_delta_clock_is_the_app_transaction(tmp_path, capsys):
    path = make_delta_target(tmp_path / "t")
    assert what_is_at(path).kind is LocationKind.DELTA_TARGET
    assert get_rowtime_bound(path) is None
    assert main(["clock", path]) == 0
    assert capsys.readouterr().out.strip() == "none"

    delta_commit(path, [(1, T0 + 5), (2, T0 + HOUR + 5)], clock_us=T0 + HOUR, batch=0)
    assert get_rowtime_bound(path) == from_rowtime_us(T0 + HOUR)
    assert main(["clock", path, "--us"]) == 0
    assert capsys.readouterr().out.strip() == str(T0 + HOUR)
    delta_commit(path, [], clock_us=T0 + 2 * HOUR, batch=1)  # a batch that only moves the clock
    assert main(["clock", path]) == 0
    assert capsys.readouterr().out.strip() == "2024-05-01T12:00:00Z"


def test_delta_target_before_its_table_exists_has_no_clock(tmp_path, capsys):
    path = make_delta_target(tmp_path / "t", table=False)  # the query started, nothing committed
    assert what_is_at(path).kind is LocationKind.DELTA_TARGET
    assert get_rowtime_bound(path) is None
    assert main(["describe", path]) == 0
    assert "no table yet" in capsys.readouterr().out
    assert main(["describe", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["clock"] is None


def test_delta_describe_partitions_files_rows_and_completeness(tmp_path, capsys):
    path = make_delta_target(tmp_path / "t")
    delta_commit(path, [(1, T0 + 5), (2, T0 + HOUR + 5)], clock_us=T0 + HOUR, batch=0)
    delta_commit(path, [(3, T0 + HOUR + 9), (4, T0 + HOUR + 10)], clock_us=T0 + HOUR, batch=1)
    assert main(["describe", path, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "delta target" and info["granularity"] == "hour"
    assert info["schema"] == "k BIGINT, rowtime TIMESTAMP"
    assert (info["query_id"], info["last_batch"], info["clock_us"]) == ("q-1", 1, T0 + HOUR)
    assert info["version"] == 2 and info["partition_column"] == "rowtime_hour"
    parts = [(p["partition"], p["files"], p["rows"], p["complete"]) for p in info["partitions"]]
    assert parts == [
        ("rowtime_hour=2024-05-01T10", 1, 1, True),  # ends at 11:00, the clock: complete
        ("rowtime_hour=2024-05-01T11", 2, 3, False),
    ]
    assert info["partitions"][0]["end"] == "2024-05-01T11:00:00Z"

    assert main(["describe", path]) == 0
    text = capsys.readouterr().out
    assert "delta target  " + path in text
    assert "query q-1, last batch 1, table version 2" in text
    assert "rowtime_hour=2024-05-01T10      1     1  yes" in text
    assert "rowtime_hour=2024-05-01T11      2     3  no" in text
    assert "clock  2024-05-01T11:00:00Z" in text
    assert main(["describe", path, "--verify"]) == 2
    assert "without --verify" in capsys.readouterr().err


def test_delta_clock_and_last_batch_survive_compaction_and_checkpoint(tmp_path, capsys):
    from deltalake import DeltaTable

    path = make_delta_target(tmp_path / "t")
    for b in range(3):
        delta_commit(path, [(b, T0 + b * 60_000_000)], clock_us=T0 + b, batch=b)
    table = DeltaTable(path)
    table.optimize.compact()  # a commit with none of the sink's metadata on top
    table.create_checkpoint()
    assert get_rowtime_bound(path) == from_rowtime_us(T0 + 2)
    assert main(["describe", path, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["last_batch"] == 2 and info["clock_us"] == T0 + 2
    assert [(p["files"], p["rows"]) for p in info["partitions"]] == [(1, 3)]


def test_delta_day_partitions(tmp_path, capsys):
    path = make_delta_target(tmp_path / "t", granularity="day")
    delta_commit(path, [(1, T0), (2, T0 + DAY)], clock_us=T0 + DAY, batch=0, granularity="day")
    assert main(["describe", path, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [(p["partition"], p["complete"]) for p in info["partitions"]] == [
        ("rowtime_day=2024-05-01", True),  # ends 2024-05-02T00:00, the clock is 10:00 that day
        ("rowtime_day=2024-05-02", False),
    ]


# -- Iceberg -------------------------------------------------------------------------------------


def test_iceberg_clock_is_the_table_property(iceberg, capsys):
    make_iceberg_target(iceberg)
    assert what_is_at(iceberg).kind is LocationKind.ICEBERG_TARGET
    assert get_rowtime_bound(iceberg) is None
    assert main(["clock", iceberg]) == 0
    assert capsys.readouterr().out.strip() == "none"
    iceberg_commit(iceberg, [(1, T0 + 5), (2, T0 + HOUR + 5)], clock_us=T0 + HOUR, batch=0)
    assert get_rowtime_bound(iceberg) == from_rowtime_us(T0 + HOUR)
    iceberg_commit(iceberg, [], clock_us=T0 + 2 * HOUR, batch=1)
    assert main(["clock", iceberg, "--us"]) == 0
    assert capsys.readouterr().out.strip() == str(T0 + 2 * HOUR)


def test_iceberg_describe_partitions_files_rows_and_completeness(iceberg, capsys):
    make_iceberg_target(iceberg)
    iceberg_commit(iceberg, [(1, T0 + 5), (2, T0 + HOUR + 5)], clock_us=T0 + HOUR, batch=0)
    iceberg_commit(iceberg, [(3, T0 + HOUR + 9)], clock_us=T0 + HOUR + 10, batch=1)
    assert main(["describe", iceberg, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "iceberg target" and info["location"] == iceberg
    assert info["granularity"] == "hour" and info["schema"] == "k BIGINT, rowtime TIMESTAMP"
    assert (info["query_id"], info["last_batch"], info["clock_us"]) == ("q-1", 1, T0 + HOUR + 10)
    assert isinstance(info["snapshot_id"], int)
    parts = [(p["partition"], p["files"], p["rows"], p["complete"]) for p in info["partitions"]]
    assert parts == [
        ("rowtime_hour=2024-05-01T10", 1, 1, True),
        ("rowtime_hour=2024-05-01T11", 2, 2, False),
    ]
    assert main(["describe", iceberg]) == 0
    text = capsys.readouterr().out
    assert "iceberg target  iceberg://local/db.events" in text
    assert "query q-1, last batch 1, table snapshot " in text
    assert "rowtime_hour=2024-05-01T10      1     1  yes" in text
    assert "clock  2024-05-01T11:00:00.000010Z" in text


def test_iceberg_day_partitions_read_as_dates(iceberg, capsys):
    make_iceberg_target(iceberg, granularity="day")
    iceberg_commit(iceberg, [(1, T0), (2, T0 + DAY)], T0 + DAY, 0, granularity="day")
    assert main(["describe", iceberg, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [(p["partition"], p["complete"]) for p in info["partitions"]] == [
        ("rowtime_day=2024-05-01", True),
        ("rowtime_day=2024-05-02", False),
    ]


def test_iceberg_table_with_no_snapshot_yet(iceberg, capsys):
    make_iceberg_target(iceberg)
    assert main(["describe", iceberg, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["partitions"] == [] and info["clock"] is None and info["snapshot_id"] is None


def test_a_missing_iceberg_table_is_named(iceberg, capsys):
    with pytest.raises(StreamNotFoundError, match=r"no Iceberg table iceberg://local/db\.events"):
        get_rowtime_bound(iceberg)
    for command in (["clock", iceberg], ["describe", iceberg]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "no Iceberg table iceberg://local/db.events" in err and "\n" == err[-1:]


# -- metrics -------------------------------------------------------------------------------------


def _sink_clocks(text: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        s.labels["stream"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "rowtime_sink_clock_seconds"
    }


def test_metrics_give_the_clock_of_both_tables(tmp_path, iceberg):
    pytest.importorskip("prometheus_client")
    delta = make_delta_target(tmp_path / "d")
    make_iceberg_target(iceberg)
    assert _sink_clocks(exposition([delta, iceberg])) == {}  # no clock yet: no sample
    delta_commit(delta, [(1, T0)], clock_us=T0 + HOUR, batch=0)
    iceberg_commit(iceberg, [(1, T0)], clock_us=T0 + 2 * HOUR, batch=0)
    assert _sink_clocks(exposition([delta, iceberg])) == {
        delta: (T0 + HOUR) / 1e6,
        iceberg: (T0 + 2 * HOUR) / 1e6,
    }


def test_a_clock_property_that_is_not_a_number_is_named(iceberg, capsys):
    from pyspark_rowtime.streams.tables import iceberg_table

    make_iceberg_target(iceberg)
    table = iceberg_table(iceberg)
    with table.transaction() as tx:  # someone else's hand on the property
        tx.set_properties({"rowtime.clock": "eleven o'clock"})
    assert main(["clock", iceberg]) == 2
    err = capsys.readouterr().err
    assert 'rowtime.clock = "eleven o\'clock"' in err and "not a whole number" in err

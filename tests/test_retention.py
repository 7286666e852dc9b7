"""Retention (SPEC 12) on the embedded log: what a trim removes, what it never removes, and that
readers over a trimmed stream (batch reads, the quarantine, interval.count, a streaming query
resumed from its checkpoint) return what the untrimmed stream returns for the kept records.

The promises are Kafka's for its log (the log start offset only grows, offsets are never
renumbered, the active segment is never deleted) and Spark's Kafka source's for its readers
(``failOnDataLoss=false`` skips ahead, else the query fails naming the offsets)."""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from policy_strategies import POLICIES as POLICY_STRATEGY
from policy_strategies import streams, tolerant
from reference_policy import ReferencePolicy

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.bounds.errors import CorruptLogError, OptionError
from pyspark_rowtime.bounds.policies import PolicyRun, make_policy
from pyspark_rowtime.datasource.intervals import read_task_with_intervals, with_rowtime_end
from pyspark_rowtime.datasource.options import parse_reader_options
from pyspark_rowtime.datasource.reader import output_arrow_schema, read_task
from pyspark_rowtime.streams import retention as retention_module
from pyspark_rowtime.streams import storage
from pyspark_rowtime.streams.local.log import create_stream, open_stream
from pyspark_rowtime.streams.retention import (
    RETENTION_FILE,
    TRIM_FILE,
    DataLossError,
    Retention,
    TrimState,
    Unit,
    apply_retention,
    choose_trim,
    parse_retention,
    parse_size,
)

S = 1_000_000  # microseconds in a second


# -- parsing ---------------------------------------------------------------------------------


def test_retention_and_size_parse_as_durations_and_bytes() -> None:
    assert parse_retention("7 days") == 7 * 86_400 * S
    assert parse_retention("12h") == 12 * 3600 * S
    assert parse_retention(90) == 90 * S
    assert parse_retention("off") is None and parse_retention(None) is None
    assert parse_size("10 GiB") == 10 << 30
    assert parse_size("500MB") == 500_000_000
    assert parse_size(4096) == 4096
    assert parse_size("1.5k") == 1536
    assert parse_size("off") is None


@pytest.mark.parametrize(
    ("defaults", "named"),
    [
        ({"retention": "0 s"}, "retention"),
        ({"retention": "a week"}, "retention"),
        ({"retention_size": "lots"}, "retention_size"),
        ({"retention_size": 0}, "retention_size"),
        ({"retention_size": True}, "retention_size"),
        ({"interval_count": 0}, "interval_count"),
        ({"interval_count": 2, "order": "adjust"}, "interval_count"),
    ],
)
def test_a_bad_retention_at_create_stream_is_refused_naming_it(
    tmp_path: Path, defaults: dict[str, Any], named: str
) -> None:
    with pytest.raises(OptionError, match=named):
        create_stream(tmp_path / "s", "k INT", **defaults)
    assert not (tmp_path / "s" / "_stream.json").exists()


# -- the rule, alone -------------------------------------------------------------------------


def unit(first: int, count: int, row_max: int | None, bound: int | None = None) -> Unit:
    return Unit(first, count, count, 100, row_max, bound, max(row_max or 0, bound or 0))


REJECT = make_policy("reject")


def test_only_a_prefix_goes_and_never_the_last_unit() -> None:
    units = [unit(0, 10, 5 * S), unit(10, 10, 50 * S), unit(20, 10, 6 * S), unit(30, 5, 7 * S)]
    new = choose_trim(units, TrimState(), policy=REJECT, before_us=40 * S, newest_row_us=50 * S)
    assert (
        choose_trim(  # nothing at or above the stream clock goes: a query has not emitted it
            units,
            TrimState(),
            policy=REJECT,
            before_us=40 * S,
            newest_row_us=50 * S,
            clock_us=5 * S,
        )
        is None
    )
    assert new is not None and new.start == 10  # the second unit stays, so the third does too
    assert (new.row_max_us, new.removed_units) == (5 * S, 1)
    everything = choose_trim(
        units[:1] + units[2:], TrimState(), policy=REJECT, before_us=10**18, newest_row_us=None
    )
    assert everything is None or everything.start < 35  # the last unit is never removed


def test_a_row_adjust_still_holds_keeps_its_unit() -> None:
    """adjust with a 10 s range: a row at 95 s is held while the reference time is 100 s."""
    adjust = make_policy("adjust", unit="sec", range=10)
    units = [unit(0, 10, 80 * S), unit(10, 10, 95 * S), unit(20, 1, 99 * S), unit(21, 1, 100 * S)]
    new = choose_trim(units, TrimState(), policy=adjust, before_us=150 * S, newest_row_us=100 * S)
    # unit 1 (max 95 s) is released only once the reference passes 105 s: it stays, and with it
    # everything after it
    assert new is not None and new.start == 10
    assert new.row_max_us == 80 * S


def test_rows_inside_the_policy_window_behind_the_reference_stay() -> None:
    adjust = make_policy("adjust", unit="sec", range=10)
    units = [unit(0, 5, 80 * S, bound=200 * S), unit(5, 5, 195 * S), unit(10, 1, 200 * S)]
    # a bound released unit 0 and 1; the window [190 s, 200 s] keeps unit 1
    new = choose_trim(units, TrimState(), policy=adjust, before_us=10**15, newest_row_us=200 * S)
    assert new is not None and new.start == 5


def test_a_size_limit_removes_the_oldest_units_beyond_it() -> None:
    units = [unit(i * 10, 10, (i + 1) * S) for i in range(6)]  # 100 bytes each
    new = choose_trim(
        units, TrimState(), policy=REJECT, before_us=None, size_bytes=250, newest_row_us=6 * S
    )
    assert new is not None and new.start == 40 and new.removed_bytes == 400


# -- the embedded log ------------------------------------------------------------------------


def write_seconds(location: Any, seconds: range, partition: int = 0, per_flush: int = 1) -> None:
    with pr.open_writer(location, partition) as w:
        for i, sec in enumerate(seconds):
            w.insert({"k": sec}, rowtime=sec * 1000)
            if (i + 1) % per_flush == 0:
                w.flush()


def test_a_trim_removes_whole_head_segments_and_keeps_offsets(tmp_path: Path) -> None:
    location = tmp_path / "s"
    create_stream(location, "k INT")
    write_seconds(location, range(0, 40), per_flush=10)
    stream = open_stream(location)
    files = sorted(os.listdir(stream.partition_dir(0)))
    results = apply_retention(stream, before_us=25 * S)
    assert [(r.before.start, r.after.start, r.records, r.units) for r in results] == [
        (0, 20, 20, 2)
    ]
    assert stream.start_offset(0) == 20 and stream.end_offset(0) == 40
    left = sorted(os.listdir(stream.partition_dir(0)))
    assert [f for f in files if f not in left] == [
        "00000000000000000000-0000000010.arrow",
        "00000000000000000010-0000000010.arrow",
    ]
    assert stream.read(0, 20, 40).column("k").to_pylist() == list(range(20, 40))
    with pr.open_writer(location, 0) as w:  # the next record still gets the next offset
        w.insert({"k": 40}, rowtime=40_000)
    assert open_stream(location).end_offset(0) == 41
    state = open_stream(location).trim_state(0)
    assert (state.start, state.row_max_us, state.clock_us) == (20, 19 * S, 19 * S)


def test_reading_below_the_first_kept_offset_names_stream_partition_and_offsets(
    tmp_path: Path,
) -> None:
    location = tmp_path / "s"
    create_stream(location, "k INT")
    write_seconds(location, range(30), per_flush=10)
    apply_retention(open_stream(location), before_us=15 * S)
    with pytest.raises(DataLossError) as e:
        open_stream(location).read(0, 5, 20)
    assert "partition 0" in str(e.value) and "offset 5" in str(e.value)
    assert "first kept offset is 10" in str(e.value) and str(location) in str(e.value)


def test_a_reader_holding_a_removed_segment_keeps_reading_it(tmp_path: Path) -> None:
    """Linux frees an unlinked file when its last map goes: a reader that mapped a segment
    before the trim reads the same records after it."""
    location = tmp_path / "s"
    create_stream(location, "k INT")
    write_seconds(location, range(30), per_flush=10)
    reader = open_stream(location)
    before = reader.read(0, 0, 10)
    apply_retention(open_stream(location), before_us=15 * S)
    assert not os.path.exists(reader.segments(0, refresh=False)[0].path)
    assert reader.read(0, 0, 10).equals(before)
    assert before.column("k").to_pylist() == list(range(10))


def test_the_writer_applies_the_retention_as_it_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retention_module, "CHECK_EVERY_S", 0.0)
    location = tmp_path / "s"
    create_stream(location, "k INT", retention="10 s")
    write_seconds(location, range(0, 60), per_flush=5)
    stream = open_stream(location)
    kept = stream.start_offset(0)
    # the clock is 59 s: every unit wholly before 49 s went, none from 49 s on
    assert kept == 45
    assert stream.read(0, kept, 60).column("k").to_pylist() == list(range(45, 60))


def test_ops_change_the_retention_in_a_file_of_its_own(tmp_path: Path) -> None:
    location = tmp_path / "s"
    create_stream(location, "k INT", retention="7 days")
    meta = (location / "_stream.json").read_bytes()
    stream = open_stream(location)
    assert stream.retention() == Retention(7 * 86_400 * S)
    stream.set_retention(Retention(3600 * S, 10 << 30))
    assert open_stream(location).retention() == Retention(3600 * S, 10 << 30)
    assert json.loads((location / RETENTION_FILE).read_text())["retention_us"] == 3600 * S
    assert (location / "_stream.json").read_bytes() == meta  # written once, never again
    stream.set_retention(Retention())
    assert not open_stream(location).retention().active
    # the same create_stream call (the defaults it was made with) still opens it
    create_stream(location, "k INT", retention="7 days")


def test_an_ended_stream_keeps_its_last_retention_of_rowtime(tmp_path: Path) -> None:
    location = tmp_path / "s"
    create_stream(location, "k INT", retention="10 s")
    write_seconds(location, range(0, 50), per_flush=5)
    with pr.open_writer(location, 0) as w:
        w.end_stream()
    stream = open_stream(location)
    assert stream.stream_clock_us() == END_OF_STREAM_US
    apply_retention(stream)
    # measured from the newest rowtime (49 s), not from the end of stream
    assert stream.start_offset(0) == 35
    assert stream.read(0, 35, 51).num_rows == 16


def test_retention_waits_for_every_partition_clock(tmp_path: Path) -> None:
    location = tmp_path / "s"
    create_stream(location, "k INT", partitions=2, retention="5 s")
    write_seconds(location, range(0, 30), partition=0, per_flush=5)
    assert apply_retention(open_stream(location)) == []  # partition 1 empty: no stream clock
    write_seconds(location, range(0, 12), partition=1, per_flush=4)
    apply_retention(open_stream(location))
    stream = open_stream(location)
    # the stream clock is partition 1's 11 s: everything before 6 s may go
    assert (stream.start_offset(0), stream.start_offset(1)) == (5, 4)


def test_a_dead_writer_stops_retention_only_without_an_idle_timeout(tmp_path: Path) -> None:
    """A partition whose writer died holds the stream clock, so retention (measured back from
    it) would stop for every partition; with the stream default idle_timeout it stops holding
    the clock retention uses once the others' records arrive later than the timeout, as it
    does for a query with the stream's defaults (SPEC 12)."""
    from clocks import FakeClock

    for idle, want in ((None, 0), ("10 seconds", 20)):
        location = tmp_path / f"s{idle is not None}"
        extra = {} if idle is None else {"idle_timeout": idle}
        create_stream(location, "k INT", partitions=2, retention="5 s", **extra)
        clock = FakeClock(step=1_000_000)  # a second of arrival a record
        with pr.open_writer(location, 1, clock=clock) as dead:
            dead.insert({"k": 0}, rowtime=0)  # then it dies: no bound, no end of stream
        with pr.open_writer(location, 0, clock=clock) as w:
            for sec in range(0, 30):
                w.insert({"k": sec}, rowtime=sec * 1000)
                if sec % 5 == 4:
                    w.flush()
        stream = open_stream(location)
        apply_retention(stream)
        # with the timeout: partition 0 keeps its last 5 s of rowtime, whole 5-row segments
        assert (stream.start_offset(0), stream.start_offset(1)) == (want, 0), idle


def test_a_size_retention_keeps_the_newest_bytes(tmp_path: Path) -> None:
    location = tmp_path / "s"
    create_stream(location, "k INT")
    write_seconds(location, range(0, 40), per_flush=10)
    stream = open_stream(location)
    one = os.path.getsize(stream.segments(0)[0].path)
    stream.set_retention(Retention(size_bytes=2 * one + one // 2))
    apply_retention(stream)
    assert stream.start_offset(0) == 20


def test_a_merge_that_raced_a_trim_leaves_a_readable_partition(tmp_path: Path) -> None:
    """The writer merged [0, 20) into one segment while a trim removed [0, 10): the merged
    segment covers the first kept offset, and the listing starts there."""
    location = tmp_path / "s"
    create_stream(location, "k INT")
    write_seconds(location, range(0, 30), per_flush=10)
    stream = open_stream(location)
    part = Path(stream.partition_dir(0))
    a, b, _ = stream.segments(0)
    merged = pa.concat_tables([stream._table(a), stream._table(b)])
    stats = retention_module_stats(stream, [a, b])
    from pyspark_rowtime.streams.segments import write_segment_file

    write_segment_file(str(part / "00000000000000000000-0000000020.arrow"), stats,
                       stream.file_schema, [merged.replace_schema_metadata(None)])  # fmt: skip
    os.unlink(a.path)
    os.unlink(b.path)
    (part / TRIM_FILE).write_text(TrimState(start=10, row_max_us=9 * S).to_json())
    fresh = open_stream(location)
    assert fresh.start_offset(0) == 10 and fresh.end_offset(0) == 30
    assert fresh.read(0, 10, 30).column("k").to_pylist() == list(range(10, 30))


def retention_module_stats(stream: Any, segments: list[Any]) -> Any:
    from pyspark_rowtime.streams.segments import SegmentStats

    return SegmentStats.merge([stream.stats(s) for s in segments])


def test_a_trim_state_of_a_newer_format_is_refused(tmp_path: Path) -> None:
    location = tmp_path / "s"
    create_stream(location, "k INT")
    write_seconds(location, range(0, 3))
    part = Path(open_stream(location).partition_dir(0))
    (part / TRIM_FILE).write_text(json.dumps({"v": 99, "start": 1}))
    with pytest.raises(CorruptLogError, match="upgrade pyspark-rowtime"):
        open_stream(location).end_offset(0)


def test_trim_before_a_time_works_without_a_retention(tmp_path: Path) -> None:
    location = tmp_path / "s"
    create_stream(location, "k INT")
    write_seconds(location, range(0, 30), per_flush=10)
    stream = open_stream(location)
    assert apply_retention(stream) == []  # no retention: nothing
    assert apply_retention(stream, before_us=20 * S)[0].after.start == 20


# -- readers over a trimmed stream equal the untrimmed one on the kept records -------------------

POLICIES = [
    {"order": "reject"},
    {"order": "drop"},
    # readers default to interval.count: retention keeps the rows waiting for successors
    {"order": "reject", "interval_count": 2},
    {"order": "drop", "interval_count": 3},
    {"order": "adjust", "adjust_unit": "msec", "adjust_range": 5},
    {"order": "adjust", "adjust_unit": "sec", "adjust_range": 3},
]


def write_random(
    location: str, rng: random.Random, defaults: dict[str, Any], partitions: int, *, end: bool
) -> None:
    """Rows whose payload ``k`` is their own offset, flushed in random small runs (segments),
    with bounds, late rows (not under reject) and maybe an end of stream."""
    pr.create_stream(location, "k BIGINT", partitions=partitions, **defaults)
    late = 0.0 if defaults["order"] == "reject" else 0.2
    for p in range(partitions):
        with pr.open_writer(location, p) as w:
            cur = 1_000_000
            for _ in range(rng.randrange(60, 200)):
                cur += rng.randrange(0, 2_000)
                if rng.random() < 0.05:
                    w.set_rowtime_bound(cur)
                offset = w.end_offset + w.pending
                t = cur - rng.randrange(0, 8_000) if rng.random() < late else cur
                w.insert({"k": offset}, rowtime=t)
                if rng.random() < 0.15:
                    w.flush()
            if end:
                w.end_stream()


def batch(location: str, options: dict[str, str]) -> dict[int, list[dict[str, Any]]]:
    """A batch read's output per partition, as the Spark batch reader computes it."""
    from pyspark_rowtime.datasource.spark import batch_tasks

    meta = storage.open_stream(location).meta
    cfg = parse_reader_options({"path": location, **options}, meta.defaults)
    schema = output_arrow_schema(meta.payload_schema, cfg.output)
    run: Any = read_task
    if cfg.has_rowtime_end and cfg.output == "rows":
        schema, run = with_rowtime_end(schema), read_task_with_intervals
    out = {}
    for task in batch_tasks(cfg):
        batches = list(run(cfg, task, schema))
        out[task.partition] = pa.Table.from_batches(batches, schema).to_pylist()
    return out


def restricted(rows: list[dict[str, Any]], kept: int) -> list[dict[str, Any]]:
    """The rows of records at or after offset ``kept`` (data rows carry their offset as k;
    the step's bound record carries none and stays; quarantine rows carry ``offset``)."""
    out = []
    for r in rows:
        offset = r.get("offset", r.get("k"))
        if offset is None or offset >= kept:
            out.append(r)
    return out


READS: list[dict[str, str]] = [
    {},
    {"endingOffsets": "latest"},
    {"output": "discarded"},
    {"output": "discarded", "endingOffsets": "latest"},
]


@pytest.mark.parametrize("defaults", POLICIES, ids=lambda d: "-".join(map(str, d.values())))
def test_batch_reads_and_the_quarantine_of_a_trimmed_stream_equal_the_untrimmed_ones(
    tmp_path: Path, defaults: dict[str, Any]
) -> None:
    rng = random.Random(len(str(defaults)))
    compared = trimmed = 0
    for case in range(8):
        location = str(tmp_path / f"s{case}")
        write_random(location, rng, defaults, rng.choice([1, 2]), end=case % 3 == 0)
        copy = str(tmp_path / f"copy{case}")
        shutil.copytree(location, copy)
        stream = open_stream(location)
        top = max(s.max_rowtime_us or 0 for s in stream.partition_stats(0))
        apply_retention(stream, before_us=rng.randrange(1_000_000_000, top + 2))
        kept = [stream.start_offset(p) for p in range(stream.meta.partitions)]
        trimmed += sum(kept)
        for read in READS:
            want, got = batch(copy, read), batch(location, read)
            for p, start in enumerate(kept):
                assert got[p] == restricted(want[p], start), (case, read, p, start)
                compared += len(got[p])
    assert trimmed > 100 and compared > 1000  # the trims removed records, and rows compared


# -- a streaming query resumed after a trim (the Spark reader's driver side, without Spark) ---


def _stream_reader(location: str, **options: str) -> Any:
    from pyspark_rowtime.datasource.spark import RowtimeStreamReader

    cfg = parse_reader_options({"path": location, **options})
    schema = output_arrow_schema(storage.open_stream(location).meta.payload_schema)
    return RowtimeStreamReader(cfg, schema), cfg, schema


def _run_to_end(reader: Any, start: dict[str, Any], schema: pa.Schema) -> tuple[Any, list[int]]:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    rows: list[int] = []
    while True:
        end = reader.latestOffset(start, ReadAllAvailable())
        if end == start:
            return start, rows
        for part in reader.partitions(start, end):
            for b in reader.read(part):
                t = pa.Table.from_batches([b], schema)
                rows += [k for k, bound in zip(t["k"].to_pylist(), t["is_bound"].to_pylist(),
                                               strict=True) if not bound]  # fmt: skip
        start = end


def test_a_query_resumed_before_the_first_kept_record_fails_or_skips_and_counts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    location = str(tmp_path / "s")
    create_stream(location, "k BIGINT")
    with pr.open_writer(location, 0) as w:
        for i in range(10):
            w.insert({"k": i}, rowtime=i * 1000)
        w.flush()
    reader, _, schema = _stream_reader(location)
    committed, first = _run_to_end(reader, reader.initialOffset(), schema)
    assert first == list(range(10))
    with pr.open_writer(location, 0) as w:
        for i in range(10, 40):
            w.insert({"k": i}, rowtime=i * 1000)
            if i % 10 == 9:
                w.flush()
    apply_retention(open_stream(location), before_us=25 * S)
    assert open_stream(location).start_offset(0) == 20
    failing, _, _ = _stream_reader(location)
    with pytest.raises(DataLossError) as e:
        _run_to_end(failing, committed, schema)
    message = str(e.value)
    assert "partition 0" in message and "offset 10" in message and "first kept offset is 20"
    assert "failOnDataLoss=false" in message

    skipping, _, _ = _stream_reader(location, failOnDataLoss="false")
    with caplog.at_level(logging.WARNING, logger="pyspark_rowtime"):
        _, rows = _run_to_end(skipping, committed, schema)
    assert rows == list(range(20, 40))
    assert skipping.reportLatestOffset()["skipped"] == {"0": 10}
    warned = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(warned) == 1 and "offset 10" in warned[0] and "offset is 20" in warned[0]
    assert "skipped 10 records" in warned[0]
    # a query started afresh reads from the first kept record, with no error and no skip
    fresh, _, _ = _stream_reader(location)
    _, rows = _run_to_end(fresh, fresh.initialOffset(), schema)
    assert rows == list(range(20, 40)) and "skipped" not in fresh.reportLatestOffset()


# -- the catalog and the CLI -----------------------------------------------------------------


def test_the_catalog_sets_the_retention_of_the_streams_it_creates(tmp_path: Path) -> None:
    from pyspark_rowtime.streams.catalog import ensure_stream, load_catalog

    path = tmp_path / "rowtime.toml"
    path.write_text(
        '[streams.orders]\nlocation = "orders"\nschema = "k INT"\nretention = "2 days"\n'
        'retention_size = "1 GiB"\n'
    )
    stream: Any = ensure_stream(load_catalog(path).stream("orders"))
    assert stream.retention() == Retention(2 * 86_400 * S, 1 << 30)
    path.write_text('[streams.x]\nlocation = "x"\nschema = "k INT"\nretention = "soon"\n')
    with pytest.raises(OptionError, match="retention"):
        load_catalog(path)


def test_the_cli_sets_shows_and_applies_a_retention(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pyspark_rowtime.cli import main

    location = tmp_path / "s"
    create_stream(location, "k INT")
    write_seconds(location, range(0, 40), per_flush=10)
    assert main(["trim", str(location)]) == 0
    assert "nothing to trim" in capsys.readouterr().out
    assert main(["retention", str(location), "15s"]) == 0
    assert main(["retention", str(location)]) == 0
    assert "15 s of rowtime" in capsys.readouterr().out
    assert main(["trim", str(location)]) == 0
    out = capsys.readouterr().out
    assert "removed offsets [0, 20)" in out and "first kept offset 20" in out
    assert main(["trim", str(location), "--before", "1970-01-01T00:00:35Z"]) == 0
    assert "removed offsets [20, 30)" in capsys.readouterr().out
    assert main(["describe", str(location), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["retention"]["retention_us"] == 15 * S
    assert info["partition_info"][0]["first_kept_offset"] == 30
    assert info["partition_info"][0]["records"] == 40
    assert main(["describe", str(location)]) == 0
    assert "first kept" in capsys.readouterr().out
    assert main(["retention", str(location), "off", "--size", "ten"]) == 2
    assert "--size" in capsys.readouterr().err


# -- a sink target stream --------------------------------------------------------------------


def test_the_sinks_retention_option_makes_a_target_whose_commits_apply_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sink_helpers import T0, make, records, run

    from pyspark_rowtime.api import read_stream

    monkeypatch.setattr(retention_module, "CHECK_EVERY_S", 0.0)
    target: Any = make(tmp_path, "stream", partitions="1", retention="10 s")
    stream = storage.open_stream(target.cfg.location)
    assert stream.retention() == Retention(10 * S)  # type: ignore[attr-defined]
    for batch_id in range(6):  # a batch every 5 s of rowtime, each its own segment
        t = T0 + batch_id * 5 * S
        run(target, batch_id, [[records([(batch_id, t)], bound=t + 1)]])
    kept = storage.open_stream(target.cfg.location).start_offset(0)
    # the clock is 25 s (plus 1 us) after T0: batches wholly before 15 s went, at commit time
    assert kept == 6
    assert read_stream(target.cfg.location).column("id").to_pylist() == [3, None, 4, None, 5, None]


# -- the rule against the SPEC's naive transcription -----------------------------------------


@settings(max_examples=300, deadline=None)
@given(POLICY_STRATEGY, streams(), st.data())
def test_a_policy_resumed_from_the_trim_state_decides_every_kept_record_as_from_offset_0(
    policy: Any, records: Any, data: Any
) -> None:
    """Cut a random stream into units, trim it as retention would (a random cutoff, the
    policy's own window and clock), and run the policy from the stored state at the first kept
    record: it releases and discards exactly what SPEC 6's naive transcription, run over the
    whole stream, does at the kept offsets, in the same order."""
    policy = tolerant(policy)
    t, b = records
    n = len(t)
    if n < 2:
        return
    cuts = sorted(set(data.draw(st.lists(st.integers(1, n - 1), max_size=8))))
    bounds = [0, *cuts, n]
    units = []
    clock = None
    for lo, hi in itertools.pairwise(bounds):
        rows = [int(x) for x, is_b in zip(t[lo:hi], b[lo:hi], strict=True) if not is_b]
        marks = [int(x) for x, is_b in zip(t[lo:hi], b[lo:hi], strict=True) if is_b]
        top = max(rows + marks)
        clock = top if clock is None else max(clock, top)
        units.append(
            Unit(
                lo, hi - lo, len(rows), 1, max(rows, default=None), max(marks, default=None), clock
            )
        )
    reference = ReferencePolicy(policy)
    for x, is_b in zip(t, b, strict=True):
        reference.push(int(x), bool(is_b))
    data_rows = [int(x) for x, is_b in zip(t, b, strict=True) if not is_b]
    newest = max(data_rows, default=None)
    before = data.draw(st.integers(int(t.min()), int(max(x for x in t if x < END_OF_STREAM_US))))
    new = choose_trim(
        units,
        TrimState(),
        policy=policy,
        before_us=before,
        newest_row_us=newest,
        clock_us=reference.clock(),
    )
    if new is None:
        event("nothing removed")
        return
    kept = new.start
    event("records removed")
    run = PolicyRun(policy, new.policy_state(policy, None).to_dict())
    out = run.push(t[kept:], b[kept:], first_offset=kept)
    assert out.offsets.tolist() == [o for o, _ in reference.out if o >= kept]
    assert out.discarded_offsets.tolist() == [o for o, _, _ in reference.discarded if o >= kept]
    # and nothing removed was still held, nor inside the window behind the reference time
    assert all(o >= kept for _, o in reference.held)


def test_a_stream_whose_default_promotes_a_column_trims_by_that_column(tmp_path: Path) -> None:
    """The stream's default rowtime_column is what its policy orders by: the trim state keeps
    that column's largest value, and a reader promoting it over the trimmed stream equals the
    untrimmed one on the kept records."""
    defaults = {
        "order": "adjust",
        "adjust_unit": "msec",
        "adjust_range": 4,
        "rowtime_column": "ts",
        "rowtime_unit": "ms",
    }
    rng = random.Random(5)
    location, copy = str(tmp_path / "s"), str(tmp_path / "copy")
    pr.create_stream(location, "k BIGINT, ts BIGINT", **defaults)
    with pr.open_writer(location, 0) as w:
        cur = 1_000_000
        for _ in range(300):
            cur += rng.randrange(0, 3)
            w.insert({"k": w.end_offset + w.pending, "ts": cur - rng.randrange(0, 8)})
            if rng.random() < 0.1:
                w.flush()
    shutil.copytree(location, copy)
    stream = open_stream(location)
    [result] = apply_retention(stream, before_us=(cur - 100) * 1000)
    assert result.after.column == "ts" and result.after.column_max_us is not None
    kept = stream.start_offset(0)
    assert 0 < kept < 300
    for read in READS:
        assert batch(location, read)[0] == restricted(batch(copy, read)[0], kept), read


def test_a_batch_planned_before_a_trim_and_replayed_after_it_fails_or_skips(
    tmp_path: Path,
) -> None:
    """Spark replays the last planned batch from its offsets log after a restart: partitions()
    sees offsets planned before the trim."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    location = str(tmp_path / "s")
    create_stream(location, "k BIGINT")
    with pr.open_writer(location, 0) as w:
        for i in range(30):
            w.insert({"k": i}, rowtime=i * 1000)
            if i % 10 == 9:
                w.flush()
    planner, _, schema = _stream_reader(location)
    start = planner.initialOffset()
    end = planner.latestOffset(start, ReadAllAvailable())  # planned, not yet run
    apply_retention(open_stream(location), before_us=15 * S)
    failing, _, _ = _stream_reader(location)
    with pytest.raises(DataLossError, match="first kept offset is 10"):
        failing.partitions(start, end)
    skipping, _, _ = _stream_reader(location, failOnDataLoss="false")
    rows = []
    for part in skipping.partitions(start, end):
        for b in skipping.read(part):
            t = pa.Table.from_batches([b], schema)
            rows += [k for k in t["k"].to_pylist() if k is not None]
    assert rows == list(range(10, 30))  # every kept row, once
    assert skipping.reportLatestOffset()["skipped"] == {"0": 10}


# -- idle.timeout over a trimmed stream (SPEC 12: both rules at once) -------------------------


def write_interleaved(location: str, rng: random.Random, defaults: dict[str, Any]) -> int:
    """Two partitions written turn about on one test clock: first 200 records with no silence
    (each committed as it is inserted),
    then 300 with silences of either partition longer than the idle timeout below, so that rows
    come late after idleness. Returns the rowtime (ms) where the second part begins."""
    from clocks import FakeClock

    pr.create_stream(location, "k BIGINT", partitions=2, **defaults)
    clock = FakeClock(step=1_000)
    writers = [pr.open_writer(location, p, clock=clock) for p in range(2)]
    cur = [1_000_000, 1_000_000]
    second = 0
    try:
        for i in range(500):
            if i == 200:
                for w in writers:
                    w.flush()
                second = max(cur) + 1_000
                cur = [second, second]
            p = i % 2 if i < 200 else int(rng.random() < 0.5)
            if i >= 200 and rng.random() < 0.03:
                clock.now += 50_000  # a silence of both: whoever writes next, the other is idle
            w = writers[p]
            cur[p] += rng.randrange(0, 2_000)
            offset = w.end_offset + w.pending
            w.insert({"k": offset}, rowtime=cur[p] - rng.randrange(0, 30))  # ms
            # records arrive when they commit: before the cut every insert commits at once,
            # so neither partition is silent for longer than the timeout there
            if i < 200 or rng.random() < 0.2:
                w.flush()
    finally:
        for w in writers:
            w.close()
    return second


@pytest.mark.parametrize("order", ["drop", "adjust"])
def test_an_idle_read_of_a_stream_trimmed_at_a_quiet_cut_equals_the_untrimmed_one(
    tmp_path: Path, order: str
) -> None:
    """A reader with idle.timeout that starts at the first kept records takes the last arrival
    of each partition's removed records from its trim (it cannot read them), so where every
    removed record arrived before every kept one and no partition was idle before the cut, it
    finds the same partitions idle and discards the same rows as late as a reader of the whole
    log (docs/limits.md says what a trim at another cut changes)."""
    defaults: dict[str, Any] = {"order": order}
    if order == "adjust":
        defaults.update(adjust_unit="usec", adjust_range=5_000)
    rng = random.Random(7 if order == "drop" else 11)
    idle_late = trimmed = compared = 0
    for case in range(3):
        location, copy = str(tmp_path / f"s{case}"), str(tmp_path / f"c{case}")
        second_ms = write_interleaved(location, rng, defaults)
        shutil.copytree(location, copy)
        stream = open_stream(location)
        apply_retention(stream, before_us=second_ms * 1_000)
        kept = [stream.start_offset(p) for p in range(2)]
        trimmed += sum(kept)
        for read in READS:
            read = {**read, "idle.timeout": "0.02 seconds"}
            want, got = batch(copy, read), batch(location, read)
            for p, start in enumerate(kept):
                assert got[p] == restricted(want[p], start), (case, read, p, start)
                compared += len(got[p])
                idle_late += sum(1 for r in got[p] if r.get("reason") == "idle")
    assert trimmed > 50 and compared > 500 and idle_late > 0


def test_a_trim_that_meets_a_segment_merged_away_measures_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rowtime trim` beside a writer: the writer's merge may unlink a segment the trim listed
    a moment before (the month soak met it: the command exited 2 on FileNotFoundError)."""
    location = tmp_path / "s"
    create_stream(location, "k INT", retention="5 s")
    write_seconds(location, range(0, 30), per_flush=5)
    real = retention_module._newest_row
    raced = []

    def merged_meanwhile(storage: Any, p: int) -> Any:
        if not raced:
            raced.append(p)
            raise FileNotFoundError("segment merged away")
        return real(storage, p)

    monkeypatch.setattr(retention_module, "_newest_row", merged_meanwhile)
    apply_retention(open_stream(location))
    assert raced and open_stream(location).start_offset(0) == 20

"""Silent partitions (idle.timeout, SPEC 12): the vectorised planner against a row-at-a-time
reference (tests/reference_idle.py), by brute force over generated multi-partition streams
with arrival times.

A batch read, a streaming query planned in steps of any size, a task replaying a step without
the driver's runs (a restart) and the quarantine all give what the reference gives: the same
rows in the same order, the same discarded rows with the same reasons and clocks, the same
stream clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from policy_strategies import POLICIES
from reference_idle import IdleReference, Record

from pyspark_rowtime.bounds.errors import LateRowError
from pyspark_rowtime.bounds.plan import StreamPosition
from pyspark_rowtime.bounds.policies import DropPolicy, Policy, RejectPolicy
from pyspark_rowtime.datasource import executor as executor_module
from pyspark_rowtime.datasource import planner as planner_module
from pyspark_rowtime.datasource.options import ReaderConfig
from pyspark_rowtime.datasource.reader import (
    Planner,
    batch_tasks,
    output_arrow_schema,
    partition_tasks,
    read_task,
)
from pyspark_rowtime.streams.columns import LOG_ARRIVAL_US, LOG_IS_BOUND, LOG_ROWTIME_US
from pyspark_rowtime.streams.retention import TrimState
from pyspark_rowtime.streams.storage import PartitionTail

PAYLOAD = pa.schema([pa.field("k", pa.int64())])


@dataclasses.dataclass
class _Meta:
    partitions: int
    created_us: int | None
    payload_schema: pa.Schema = PAYLOAD
    stream_id: str = ""


class MemoryStream:
    """Just what the reader uses of a stream, in memory: records with stored arrivals."""

    def __init__(self, records: list[list[Record]], created_us: int | None) -> None:
        self.location = "memory"
        self.meta = _Meta(len(records), created_us)
        self.tables = []
        for recs in records:
            self.tables.append(
                pa.table(
                    {
                        LOG_ARRIVAL_US: pa.array([r.arrival for r in recs], pa.int64()),
                        LOG_ROWTIME_US: pa.array([r.t for r in recs], pa.int64()),
                        LOG_IS_BOUND: pa.array([r.is_bound for r in recs], pa.bool_()),
                        "k": pa.array([None if r.is_bound else r.offset for r in recs], pa.int64()),
                    }
                )
            )

    def end_offset(self, partition: int) -> int:
        return self.tables[partition].num_rows

    def start_offset(self, partition: int) -> int:
        return 0  # never trimmed

    def trim_state(self, partition: int) -> TrimState:
        return TrimState()

    def tail(self, partition: int) -> PartitionTail:
        end = self.end_offset(partition)
        arrivals = self.tables[partition].column(LOG_ARRIVAL_US)
        return PartitionTail(end, None, arrivals[end - 1].as_py() if end else None)

    def read(self, partition: int, start: int, end: int, columns: Any = None) -> pa.Table:
        table = self.tables[partition].slice(start, end - start)
        return table if columns is None else table.select(list(columns))


@contextmanager
def serving(stream: MemoryStream) -> Iterator[None]:
    with (
        mock.patch.object(planner_module, "open_stream", lambda _location: stream),
        mock.patch.object(executor_module, "open_stream", lambda _location: stream),
    ):
        yield


@st.composite
def silent_streams(draw: Any) -> tuple[list[list[Record]], int, int | None]:
    """Partitions whose writers go quiet for a while (or for good), arrivals that tie across
    partitions, rows late by up to a few steps, bounds now and then; a timeout and a creation
    time (None: a stream from before creation times were kept)."""
    parts = draw(st.integers(1, 3))
    timeout = draw(st.integers(0, 12))
    created = draw(st.one_of(st.none(), st.integers(0, 5)))
    out = []
    for p in range(parts):
        recs: list[Record] = []
        arrival = draw(st.integers(0, 10))
        now = draw(st.integers(0, 20))
        bound: int | None = None
        top: int | None = None
        for off in range(draw(st.integers(0, 25))):
            arrival += draw(st.sampled_from([0, 1, 1, 2, 3, 15]))  # 15: a silence
            now += draw(st.integers(0, 4))
            if draw(st.integers(0, 7)) == 0:
                b = max(now, top or now, bound or now)
                bound = b
                recs.append(Record(p, off, b, True, arrival))
            else:
                t = now - draw(st.sampled_from([0, 0, 0, 1, 3, 8, 20]))
                top = t if top is None else max(top, t)
                recs.append(Record(p, off, t, False, arrival))
        out.append(recs)
    return out, timeout, created


def _config(policy: Policy, timeout: int, output: str = "rows") -> ReaderConfig:
    return ReaderConfig(location="memory", policy=policy, output=output, idle_timeout_us=timeout)


def _reference(
    records: list[list[Record]], policy: Policy, timeout: int, created: int | None
) -> IdleReference:
    ref = IdleReference(policy, len(records), timeout, created)
    ref.run([r for recs in records for r in recs])
    return ref


def _rows(cfg: ReaderConfig, tasks: list[Any]) -> dict[int, list[tuple[int, int]]]:
    """Per partition, the (offset, rowtime) of the data rows the tasks emit, in order."""
    schema = output_arrow_schema(PAYLOAD)
    out: dict[int, list[tuple[int, int]]] = {}
    for task in tasks:
        rows = out.setdefault(task.partition, [])
        for batch in read_task(cfg, task, schema):
            for r in batch.to_pylist():
                if not r["is_bound"]:
                    rows.append((r["k"], _us(r["rowtime"])))
    return out


def _quarantine(cfg: ReaderConfig, tasks: list[Any]) -> list[tuple[int, int, int, str, int]]:
    discarded = dataclasses.replace(cfg, output="discarded")
    schema = output_arrow_schema(PAYLOAD, "discarded")
    out = []
    for task in tasks:
        for batch in read_task(discarded, task, schema):
            for r in batch.to_pylist():
                out.append(
                    (r["partition"], r["offset"], _us(r["rowtime"]), r["reason"], _us(r["clock"]))
                )
    return sorted(out)


def _us(value: Any) -> int:
    import datetime as dt

    delta = value - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


@given(case=silent_streams(), policy=POLICIES)
def test_a_batch_read_and_its_quarantine_are_the_reference(case: Any, policy: Policy) -> None:
    records, timeout, created = case
    stream = MemoryStream(records, created)
    cfg = _config(policy, timeout)
    try:
        ref = _reference(records, policy, timeout, created)
    except LateRowError:
        with serving(stream), pytest.raises(LateRowError):
            batch_tasks(cfg)
        return
    with serving(stream):
        planner = Planner(cfg)
        tasks = batch_tasks(cfg, planner)
        got = _rows(cfg, tasks)
        quarantine = _quarantine(cfg, tasks)
        end = planner.last_position
    want = ref.emitted()
    for p in range(len(records)):
        assert got.get(p, []) == want[p]
    assert quarantine == sorted(ref.discarded)
    event(f"idle discards: {min(3, sum(d[3] == 'idle' for d in ref.discarded))}")
    event(f"idle partitions at the end: {len(ref.idle())}")
    assert (end.clock_us if end is not None else None) == ref.clock


@given(case=silent_streams(), policy=POLICIES, sizes=st.lists(st.integers(1, 12), min_size=1))
def test_a_streaming_query_in_steps_of_any_size_is_the_reference(
    case: Any, policy: Policy, sizes: list[int]
) -> None:
    records, timeout, created = case
    stream = MemoryStream(records, created)
    cfg = _config(policy, timeout)
    try:
        ref = _reference(records, policy, timeout, created)
    except LateRowError:
        ref = None
    got: dict[int, list[tuple[int, int]]] = {p: [] for p in range(len(records))}
    quarantine = []
    with serving(stream):
        planner = Planner(cfg)
        pos = planner.start_position()
        step = 0
        try:
            while True:
                new = planner.plan(pos, planner.available(), sizes[step % len(sizes)])
                if new is None:
                    break
                step += 1
                start, end = pos.to_dict(), new.to_dict()
                if pos.clock_us is not None:
                    assert new.clock_us is not None and new.clock_us >= pos.clock_us
                runs = planner.runs_for(start, end)
                late = planner.late_for(start, end)
                by_runs = _rows(cfg, partition_tasks(start, end, runs, late))
                # a restarted driver: no runs, and the late rows recomputed from the log
                fresh = Planner(cfg)
                replayed_tasks = partition_tasks(start, end, None, fresh.late_for(start, end))
                assert _rows(cfg, replayed_tasks) == by_runs
                quarantine += _quarantine(cfg, replayed_tasks)
                for p, rows in by_runs.items():
                    for _, t in rows:  # SPEC 7: B(b-1) <= rowtime <= B(b)
                        assert pos.clock_us is None or t >= pos.clock_us
                        assert new.clock_us is not None and t <= new.clock_us
                    got[p] += rows
                pos = StreamPosition.from_dict(end)
        except LateRowError:
            assert ref is None, "the planner failed where the reference keeps going"
            assert isinstance(policy, RejectPolicy)
            return
    assert ref is not None, "the reference failed where the planner kept going"
    assert got == ref.emitted()
    event(f"steps: {min(step, 5)}")
    assert sorted(quarantine) == sorted(ref.discarded)
    assert pos.clock_us == ref.clock
    assert sum(p.discarded for p in pos.partitions) == len(ref.discarded)


def test_old_offsets_without_arrivals_still_parse_and_resume() -> None:
    """An offset written by 0.1.0 (no last arrival per partition) resumes with idle.timeout
    turned on: the last arrival is read back from the log (its record ``next - 1``)."""
    recs = [
        [Record(0, i, 100 + i, False, 10 + i) for i in range(5)],
        [Record(1, 0, 100, False, 10)],
    ]
    stream = MemoryStream(recs, 0)
    old = {
        "v": 1,
        "clock": 100,
        "partitions": {
            "0": {
                "next": 2,
                "scan": 2,
                "scan_ref": 101,
                "scan_bound": None,
                "ref": 101,
                "bound": None,
                "held": 0,
                "discarded": 0,
            },
            "1": {
                "next": 1,
                "scan": 1,
                "scan_ref": 100,
                "scan_bound": None,
                "ref": 100,
                "bound": None,
                "held": 0,
                "discarded": 0,
            },
        },
    }
    pos = StreamPosition.from_dict(old)
    assert [p.last_arrival_us for p in pos.partitions] == [None, None]
    with serving(stream):
        planner = Planner(_config(RejectPolicy(), 2))
        new = planner.plan(pos, planner.available(), None)
    assert new is not None
    # partition 1 last wrote at 10; partition 0's records at 13 and 14 find it idle
    assert new.clock_us == 104
    assert [p.last_arrival_us for p in new.partitions] == [14, 10]
    assert "arrival" not in StreamPosition.from_dict(old).to_dict()["partitions"]["0"]


def _two_partitions_one_silent() -> MemoryStream:
    """Partition 1 writes at 1, then falls silent until 20 with a row below the clock."""
    return MemoryStream(
        [
            [Record(0, i, 100 + i, False, 1 + i) for i in range(12)],
            [Record(1, 0, 100, False, 1), Record(1, 1, 104, False, 20)],
        ],
        0,
    )


def test_under_reject_a_row_late_after_idleness_fails_naming_what_and_where() -> None:
    with serving(_two_partitions_one_silent()), pytest.raises(LateRowError) as e:
        planner = Planner(_config(RejectPolicy(), 5))
        planner.plan(planner.start_position(), planner.available(), None)
    message = str(e.value)
    assert "stream 'memory' partition 1, offset 1" in message
    assert "idle.timeout" in message and "order=drop" in message
    assert "1970-01-01T00:00:00.000104Z" in message  # the row's rowtime
    assert "1970-01-01T00:00:00.000111Z" in message  # the stream clock it fell below


def test_the_progress_report_shows_the_stream_clock_and_the_idle_partitions() -> None:
    from pyspark_rowtime.bounds.policies import DropPolicy
    from pyspark_rowtime.datasource.reader import progress_report

    stream = MemoryStream(
        [[Record(0, i, 100 + i, False, 1 + i) for i in range(12)], [Record(1, 0, 100, False, 1)]],
        0,
    )
    with serving(stream):
        planner = Planner(_config(DropPolicy(), 5))
        assert progress_report(planner) == {"records": {"0": 12, "1": 1}}  # nothing planned
        planner.plan(planner.start_position(), planner.available(), None)
        report = progress_report(planner)
    assert report == {
        "records": {"0": 12, "1": 1},
        "clock": "1970-01-01T00:00:00.000111Z",
        "clock_us": 111,
        "idle": ["1"],
    }
    import json

    assert json.loads(json.dumps(report)) == report  # a plain dict of primitives


def test_a_new_stream_keeps_its_creation_time_and_an_old_one_reads_without_it(
    tmp_path: Any,
) -> None:
    import json
    import time

    import pyspark_rowtime as pr
    from pyspark_rowtime.streams.meta import meta_from_json

    before = time.time_ns() // 1000
    pr.create_stream(str(tmp_path / "s"), "k INT")
    doc = json.loads((tmp_path / "s" / "_stream.json").read_text())
    assert before <= doc["created_us"] <= time.time_ns() // 1000
    del doc["created_us"]  # as 0.1.0 wrote it
    assert meta_from_json(json.dumps(doc), str(tmp_path / "s")).created_us is None


# -- commits under way while a step is planned (idle.commitGrace) ------------------------------


class CommittingStream(MemoryStream):
    """A stream whose records become visible some time after they arrived: a writer stamps a
    commit's arrival as it begins it, and the commit ends up to ``grace`` later (commits of a
    partition end in order). ``clock`` is the wall clock the planner reads."""

    def __init__(
        self, records: list[list[Record]], created: int | None, delays: list[list[int]], clock: Any
    ) -> None:
        super().__init__(records, created)
        self.clock = clock
        self.visible = []
        for recs, ds in zip(records, delays, strict=True):
            at, top = [], None
            for r, d in zip(recs, ds, strict=True):
                top = r.arrival + d if top is None else max(top, r.arrival + d)
                at.append(top)
            self.visible.append(at)

    def end_offset(self, partition: int) -> int:
        return sum(1 for v in self.visible[partition] if v <= self.clock.now)


class _WallClock:
    """The planner's wall clock and its ``time`` module (it calls ``time.sleep`` only). Not
    ``time.sleep`` patched: that is the process's, and another thread's sleep (pytest-xdist's
    channel) would move this clock and make Hypothesis's replays draw differently."""

    def __init__(self) -> None:
        self.now = 0

    def sleep(self, seconds: float) -> None:
        self.now += max(1, round(seconds * 1e6))


@given(
    case=silent_streams(),
    policy=POLICIES,
    grace=st.integers(1, 6),
    data=st.data(),
)
def test_a_step_planned_while_commits_are_under_way_decides_as_the_finished_log(
    case: Any, policy: Policy, grace: int, data: Any
) -> None:
    """Records that arrived before records of other partitions may still be committing when a
    micro-batch is planned. Steps planned at any moment, while commits that take up to
    ``idle.commitGrace`` land, emit and discard exactly what the finished log decides (the
    reference): the planner waits for the arrivals of the last ``grace`` to settle."""
    records, timeout, created = case
    delays = [[data.draw(st.integers(0, grace)) for _ in recs] for recs in records]
    clock = _WallClock()
    stream = CommittingStream(records, created, delays, clock)
    cfg = dataclasses.replace(_config(policy, timeout), idle_commit_grace_us=grace)
    try:
        ref = _reference(records, policy, timeout, created)
    except LateRowError:
        ref = None
    last_visible = max((v[-1] for v in stream.visible if v), default=0)
    got: dict[int, list[tuple[int, int]]] = {p: [] for p in range(len(records))}
    with (
        serving(stream),
        mock.patch.object(planner_module, "wall_clock_us", lambda: clock.now),
        mock.patch.object(planner_module, "time", clock),
    ):
        planner = Planner(cfg)
        pos = planner.start_position()
        try:
            while True:
                new = planner.plan(pos, planner.available(), None)
                if new is None:
                    if clock.now > last_visible + grace:
                        break
                    clock.now += data.draw(st.integers(1, 8))
                    continue
                start, end = pos.to_dict(), new.to_dict()
                tasks = partition_tasks(start, end, planner.runs_for(start, end),
                                        planner.late_for(start, end))  # fmt: skip
                for p, rows in _rows(cfg, tasks).items():
                    got[p] += rows
                pos = StreamPosition.from_dict(end)
                clock.now += data.draw(st.integers(0, 8))
        except LateRowError:
            assert ref is None, "the planner failed where the finished log keeps going"
            return
    assert ref is not None, "the planner kept going where the finished log fails"
    assert got == ref.emitted()
    assert pos.clock_us == ref.clock
    assert sum(p.discarded for p in pos.partitions) == len(ref.discarded)


@given(case=silent_streams(), policy=POLICIES, lag=st.integers(-20, 20))
def test_a_batch_read_takes_every_record_written_whatever_the_arrivals_say_of_now(
    case: Any, policy: Policy, lag: int
) -> None:
    """A batch read (and its quarantine) is everything written when it runs, even when the
    newest records arrived within ``idle.commitGrace`` of now, or "after" now by the reader's
    clock (a writer whose clock runs ahead): it waits for them to settle rather than leave them
    out, and so is the reference (the streaming query leaves them to a later step instead)."""
    records, timeout, created = case
    newest = max((r.arrival for recs in records for r in recs), default=0)
    clock = _WallClock()
    clock.now = newest + lag  # the planner's clock: just after the newest arrival, or before it
    stream = MemoryStream(records, created)
    cfg = dataclasses.replace(_config(policy, timeout), idle_commit_grace_us=5)
    try:
        ref = _reference(records, policy, timeout, created)
    except LateRowError:
        ref = None
    with (
        serving(stream),
        mock.patch.object(planner_module, "wall_clock_us", lambda: clock.now),
        mock.patch.object(planner_module, "time", clock),
    ):
        if ref is None:
            with pytest.raises(LateRowError):
                batch_tasks(cfg)
            return
        planner = Planner(cfg)
        tasks = batch_tasks(cfg, planner)
        got = _rows(cfg, tasks)
        quarantine = _quarantine(cfg, tasks)
    want = ref.emitted()
    for p in range(len(records)):
        assert got.get(p, []) == want[p]
    assert quarantine == sorted(ref.discarded)


def test_a_batch_read_whose_planning_a_trim_overtakes_plans_again() -> None:
    """A writer's trim that removes records while a batch read plans from them (the planner's
    read raises DataLossError) makes the read plan again from the first kept records, rather
    than fail: the driver-side half of a batch read racing retention."""
    from pyspark_rowtime.streams.retention import data_loss

    stream = _two_partitions_one_silent()
    cfg = _config(DropPolicy(), 5)
    with serving(stream):
        want = _rows(cfg, batch_tasks(cfg))
    reads = {"n": 0}
    plain_read = stream.read

    def overtaken(partition: int, start: int, end: int, columns: Any = None) -> pa.Table:
        reads["n"] += 1
        if reads["n"] == 1:
            raise data_loss("memory", partition, start, start + 1)
        return plain_read(partition, start, end, columns)

    stream.read = overtaken  # type: ignore[method-assign]
    with serving(stream):
        got = _rows(cfg, batch_tasks(cfg))
    assert reads["n"] > 1 and got == want and any(got.values())


# -- a read that starts at trimmed partitions (docs/limits.md, "idle.timeout over a trimmed
# stream") --------------------------------------------------------------------------------------


class TrimmedStream(MemoryStream):
    """``MemoryStream`` whose partition ``p`` lost its first ``cuts[p]`` records to a trim: the
    trim state holds what a trim stores of them (the largest rowtime and bound, the partition
    clock after them and the last arrival), and nothing before the cut may be read."""

    def __init__(self, records: list[list[Record]], created: int | None, cuts: list[int]):
        super().__init__(records, created)
        self.cuts = cuts
        self.trims = []
        for recs, cut in zip(records, cuts, strict=True):
            gone = recs[:cut]
            rows = [r.t for r in gone if not r.is_bound]
            bounds = [r.t for r in gone if r.is_bound]
            row_max, bound_max = max(rows, default=None), max(bounds, default=None)
            self.trims.append(
                TrimState(
                    start=cut,
                    row_max_us=row_max,
                    bound_max_us=bound_max,
                    clock_us=max((x for x in (row_max, bound_max) if x is not None), default=None),
                    last_arrival_us=gone[-1].arrival if gone else None,
                )
                if cut
                else TrimState()
            )

    def start_offset(self, partition: int) -> int:
        return self.cuts[partition]

    def trim_state(self, partition: int) -> TrimState:
        return self.trims[partition]

    def read(self, partition: int, start: int, end: int, columns: Any = None) -> pa.Table:
        assert start >= self.cuts[partition], "read below the first kept record"
        return super().read(partition, start, end, columns)


def _trimmed_quarantine(
    records: list[list[Record]], timeout: int, created: int | None, cuts: list[int]
) -> set[tuple[int, int, str]]:
    """(partition, offset, reason) of what a batch read of the trimmed stream discards."""
    cfg = _config(DropPolicy(), timeout)
    with serving(TrimmedStream(records, created, cuts)):
        return {(p, o, why) for p, o, _t, why, _c in _quarantine(cfg, batch_tasks(cfg))}


def test_a_read_after_trims_may_discard_as_idle_a_row_the_whole_log_keeps() -> None:
    """What the limit is about, in the smallest case: partition 1's records (rowtimes 0, then
    100) are trimmed; the read takes it at its cut (clock 100, last arrival 20) also at arrival
    10, where the whole log had it at clock 0. The stream clock, which never goes back, is 60
    in the read from then on, 30 in the whole log at arrival 25: partition 2's row of rowtime
    40 is kept by the whole log and discarded as idle by the read, though it arrived after every
    removed record (docs/limits.md)."""
    timeout, created = 15, -100
    records = [
        [Record(0, 0, 60, False, 10)],
        [Record(1, 0, 0, False, 0), Record(1, 1, 100, False, 20)],
        [Record(2, 0, 30, False, 12), Record(2, 1, 40, False, 25)],
    ]
    whole = _reference(records, DropPolicy(), timeout, created)
    assert {(p, o) for p, o, *_ in whole.discarded} == set()
    got = _trimmed_quarantine(records, timeout, created, cuts=[0, 2, 0])
    assert got == {(2, 0, "idle"), (2, 1, "idle")}  # both below the clock stored at the cut


@given(case=silent_streams(), data=st.data())
def test_a_read_after_trims_discards_more_only_below_the_clocks_the_trims_stored(
    case: Any, data: Any
) -> None:
    """Whatever the cut of each partition, a read that starts at the first kept records
    discards a row as idle that the whole log keeps only if its rowtime is below the highest
    partition clock the trims stored (and no row at all differs without a trim): the soak's
    accounting (integration/soak.py) and docs/limits.md rely on it."""
    records, timeout, created = case
    cuts = [data.draw(st.integers(0, len(recs))) for recs in records]
    whole = _reference(records, DropPolicy(), timeout, created)
    kept_whole = {(p, o, why) for p, o, _t, why, _c in whole.discarded if o >= cuts[p]}
    got = _trimmed_quarantine(records, timeout, created, cuts)
    trims = TrimmedStream(records, created, cuts).trims
    clocks = [t.clock_us for t in trims if t.start and t.clock_us is not None]
    extra = got - kept_whole
    if not any(cuts):
        assert got == kept_whole
    rowtime = {(r.partition, r.offset): r.t for recs in records for r in recs}
    for p, o, why in extra:
        assert why == "idle" and clocks and rowtime[(p, o)] < max(clocks), (p, o, why, clocks)
    event(f"rows the read discards and the whole log keeps: {min(len(extra), 2)}")
    event(f"rows the whole log discards and the read keeps: {min(len(kept_whole - got), 2)}")

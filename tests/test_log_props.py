"""Property: any sequence of inserts, bounds, flushes and reopenings reads back as written.

A small model keeps what every call should have appended (the rowtime: explicit, or the time of
insert made non-decreasing from a clock that may step backwards; the bound; the payload) and,
for every record, the arrival of the commit that made it visible (the clock's time at the
flush, never below an earlier arrival); the log must read back exactly that, in order, with
non-decreasing arrival and the model's clock.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspark_rowtime.api import create_stream, open_writer
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.bounds.time import from_rowtime_us
from pyspark_rowtime.streams.columns import LOG_ARRIVAL_US, LOG_IS_BOUND, LOG_ROWTIME_US
from pyspark_rowtime.streams.local.log import open_stream

T0 = 1_700_000_000_000_000
NO_CLOCK = -(2**63)


class SteppingClock:
    """Returns the next scripted value on each call (the writer reads it once per record)."""

    def __init__(self) -> None:
        self.now = T0
        self.steps: list[int] = []

    def __call__(self) -> int:
        if self.steps:
            self.now += self.steps.pop(0)
        return self.now


@dataclass
class Model:
    records: list[tuple[int, int | None, bool, int | None, str | None]] = field(
        default_factory=list
    )
    arrival: int = NO_CLOCK
    clock: int = NO_CLOCK
    committed: int = 0

    stamps: list[int] = field(default_factory=list)

    def commit(self, end: int) -> None:
        """Records up to ``end`` are committed: those new arrive at the commit's time, the
        clock's at the flush (the latest time of insert: the scripted clock does not move
        between an insert and the flush it causes)."""
        self.stamps += [self.arrival] * (end - len(self.stamps))

    def arrive(self, now: int) -> int:
        self.arrival = max(self.arrival, now)
        return self.arrival


values = st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1))
texts = st.one_of(st.none(), st.text(max_size=5))
step = st.integers(-1_000, 1_000_000)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), values, texts, st.one_of(st.none(), step), step),
        st.tuples(
            st.just("arrow"), st.lists(st.tuples(values, texts), min_size=1, max_size=4), step
        ),
        st.tuples(st.just("bound"), st.integers(0, 5_000_000), st.booleans(), step),
        st.tuples(st.just("flush")),
        st.tuples(st.just("reopen")),
    ),
    max_size=25,
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(ops=operations, flush_records=st.integers(1, 8))
def test_any_sequence_of_writes_reads_back_identically_with_non_decreasing_arrival(
    ops, flush_records
):
    folder = tempfile.mkdtemp(prefix="rowtime-prop-")
    try:
        loc = f"{folder}/s"
        create_stream(loc, "a INT, b STRING")
        clock = SteppingClock()
        model = Model()
        w = open_writer(loc, clock=clock, flush_records=flush_records)
        for op in ops:
            kind = op[0]
            if kind == "insert":
                _, a, b, rowtime_step, clock_step = op
                clock.steps.append(clock_step)
                arrival = model.arrive(clock.now + clock_step)
                rowtime = None if rowtime_step is None else arrival + rowtime_step
                w.insert({"a": a, "b": b}, rowtime=None if rowtime is None else at(rowtime))
                model.records.append(
                    (arrival, arrival if rowtime is None else rowtime, False, a, b)
                )
                model.clock = max(model.clock, arrival if rowtime is None else rowtime)
            elif kind == "arrow":
                _, rows, clock_step = op
                clock.steps.append(clock_step)
                arrival = model.arrive(clock.now + clock_step)
                w.insert_arrow(
                    pa.table(
                        {"a": pa.array([r[0] for r in rows], pa.int32()), "b": [r[1] for r in rows]}
                    )
                )
                model.records += [(arrival, arrival, False, a, b) for a, b in rows]
                model.clock = max(model.clock, arrival)
            elif kind == "bound":
                _, ahead, strict, clock_step = op
                base = model.clock if model.clock != NO_CLOCK else T0
                bound = min(base + ahead, END_OF_STREAM_US - 1)
                clock.steps.append(clock_step)
                arrival = model.arrive(clock.now + clock_step)
                w.set_rowtime_bound(at(bound), strict=strict)
                bound += 1 if strict else 0
                model.records.append((arrival, bound, True, None, None))
                model.clock = bound
            elif kind == "flush":
                assert w.flush() == len(model.records)
            else:
                w.close()
                w = open_writer(loc, clock=clock, flush_records=flush_records)
            assert w.end_offset + w.pending == len(model.records)
            model.commit(w.end_offset)
        w.close()
        model.commit(len(model.records))

        stream = open_stream(loc)
        n = stream.end_offset(0)
        assert n == len(model.records)
        t = stream.read(0, 0, n)
        got = list(
            zip(
                t.column(LOG_ARRIVAL_US).to_pylist(),
                t.column(LOG_ROWTIME_US).to_pylist(),
                t.column(LOG_IS_BOUND).to_pylist(),
                t.column("a").to_pylist(),
                t.column("b").to_pylist(),
                strict=True,
            )
        )
        assert got == [(model.stamps[i], *r[1:]) for i, r in enumerate(model.records)]
        arrivals = [r[0] for r in got]
        assert arrivals == sorted(arrivals)
        assert stream.clock_us(0) == (None if model.clock == NO_CLOCK else model.clock)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def at(t_us: int):
    return from_rowtime_us(t_us)

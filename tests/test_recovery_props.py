"""Property: whatever damage a partition's files take between writer sessions, no record that
verified before a session is lost by it (issue 55, item 6).

Between sessions the files are damaged at random, as disks, operators and backups do:
truncated, copied beside the others under another segment's name (a stray, a half-restored
backup), renamed, a byte flipped. Then a writer session runs: it opens the partition (its
cleanup may refuse: that is allowed), appends rows (merges run), and trims. The property:
every record held, before the session, by a file whose checksums verify (under whatever
name) is held afterwards by such a file, unless a trim removed its offset on purpose. The
session may refuse; it may never delete what it cannot account for.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any
from unittest import mock

import pyarrow as pa
from clocks import FakeClock
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pyspark_rowtime.api import create_stream, open_writer
from pyspark_rowtime.bounds.errors import CorruptLogError, RowtimeError
from pyspark_rowtime.streams.columns import LOG_ARRIVAL_US, LOG_IS_BOUND, LOG_ROWTIME_US
from pyspark_rowtime.streams.local import folder as local_folder
from pyspark_rowtime.streams.local import log as local_log
from pyspark_rowtime.streams.local.log import open_stream
from pyspark_rowtime.streams.retention import apply_retention
from pyspark_rowtime.streams.segments import (
    SEGMENT_RE,
    open_segment_file,
    segment_name,
    segment_schema,
    verify_segment_file,
)

Record = tuple[int, int | None, bool, int | None]

damage = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.floats(0.0, 0.99)),
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.floats(0.0, 0.999)),
    # a copy or a rename under a name at or near another file's first offset
    st.tuples(
        st.sampled_from(["copy", "rename"]),
        st.integers(0, 10**6),
        st.integers(0, 10**6),
        st.integers(-1, 20),
    ),
)

session = st.fixed_dictionaries(
    {
        "rows": st.integers(0, 20),
        "trim": st.one_of(st.none(), st.integers(0, 60)),
        "damage": st.lists(damage, max_size=3),
    }
)


def segment_files(part: str) -> list[str]:
    return sorted(n for n in os.listdir(part) if SEGMENT_RE.match(n))


FILE_SCHEMA = segment_schema(pa.schema([pa.field("k", pa.int64())])).remove_metadata()


def verified_records(part: str, start: int) -> set[Record]:
    """Every record at an offset from ``start`` on (its ``k``) held by a segment-named file
    whose checksums verify and whose columns are the stream's (the schema has no checksum: a
    byte flipped there changes what the bytes mean), whatever the name says."""
    out: set[Record] = set()
    for name in segment_files(part):
        path = os.path.join(part, name)
        try:
            verify_segment_file(path)
            table = open_segment_file(path)
        except (CorruptLogError, OSError):
            continue
        if not table.schema.remove_metadata().equals(FILE_SCHEMA):
            continue
        columns = [LOG_ARRIVAL_US, LOG_ROWTIME_US, LOG_IS_BOUND, "k"]
        rows = zip(*(table.column(c).to_pylist() for c in columns), strict=True)
        out |= {r for r in rows if r[3] is not None and r[3] >= start}
    return out


def apply_damage(part: str, op: tuple[Any, ...]) -> None:
    names = segment_files(part)
    if not names:
        return
    path = os.path.join(part, names[op[1] % len(names)])
    kind = op[0]
    if kind in ("truncate", "flip"):
        os.chmod(path, 0o644)
        with open(path, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            if kind == "truncate":
                f.truncate(int(size * op[2]))
            elif size:
                at = int(size * op[2])
                f.seek(at)
                byte = f.read(1)
                f.seek(at)
                f.write(bytes([byte[0] ^ 0x10]))
        return
    target_of = names[op[2] % len(names)]
    m = SEGMENT_RE.match(target_of)
    assert m is not None
    first, count = int(m.group(1)), int(m.group(2))
    new = os.path.join(part, segment_name(first, max(1, count + op[3])))
    if os.path.exists(new):
        return
    if kind == "copy":
        shutil.copyfile(path, new)
    else:
        os.rename(path, new)


def writer_session(loc: str, spec: dict[str, Any], next_k: int, clock: FakeClock) -> int:
    """Append ``spec["rows"]`` rows, one flush each (merges run), then trim; returns the
    next ``k``. A refusal to open (or any error the log raises) ends the session."""
    try:
        with open_writer(loc, 0, clock=clock) as w:
            for _ in range(spec["rows"]):
                w.insert({"k": next_k})
                next_k += 1
                w.flush()
        if spec["trim"] is not None:
            stream = open_stream(loc)
            top = stream.clock_us(0)
            if top is not None:
                before = top - spec["trim"] * clock.step
                apply_retention(stream, before_us=before, use_retention=False)
    except RowtimeError as e:
        event(f"the session stopped: {type(e).__name__}")  # allowed, as long as nothing went
    else:
        event("the session ran")
    return next_k


#: Each example runs up to four writer sessions over a real partition folder (about 0.2 s): CI
#: draws 200 (94 s at its 500 under load, the slowest test of tests/), ./dev long's thorough
#: profile 2,000.
EXAMPLES = 2000 if os.environ.get("HYPOTHESIS_PROFILE") == "thorough" else 200


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(session, min_size=1, max_size=4))
def test_no_session_loses_a_record_that_verified_before_it(sessions):
    # tmpfs where there is one: the property needs many fsyncs, not a disk
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    root = tempfile.mkdtemp(prefix="rowtime-recovery-", dir=shm)
    # No other process changes the folder here: a gap is damage, not a race to wait out.
    patches = [mock.patch.object(m, "_LIST_RETRIES", 1) for m in (local_log, local_folder)]
    for p in patches:
        p.start()
    try:
        loc = os.path.join(root, "s")
        create_stream(loc, "k BIGINT")
        part = os.path.join(loc, "partition-0000")
        clock = FakeClock()
        next_k = writer_session(loc, {"rows": 18, "trim": None}, 0, clock)
        for spec in sessions:
            for op in spec["damage"]:
                apply_damage(part, op)
            held = verified_records(part, 0)
            present = set(segment_files(part))
            next_k = writer_session(loc, spec, next_k, clock)
            if present - set(segment_files(part)):
                event("the session removed files (cleanup, merge or trim)")
            try:
                start = open_stream(loc).start_offset(0)
            except CorruptLogError:
                start = 0  # the trim state itself is unreadable: nothing may have gone
            kept = {r for r in held if r[3] is not None and r[3] >= start}
            lost = kept - verified_records(part, start)
            assert not lost, f"records lost by the session: {sorted(lost)[:5]}"
    finally:
        for p in patches:
            p.stop()
        shutil.rmtree(root, ignore_errors=True)

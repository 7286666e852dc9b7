"""Recovery verifies before it removes: no file of a partition goes on the strength of its name.

Issue 55: a copy of a partition's first one-record segment, named
``00000000000000000000-0000000004.arrow`` (what a half-restored backup or an interrupted merge
leaves), made the next writer remove the four segments that name claims, and exit 0. Kafka's
recovery checks a segment before it acts on it (``LogLoader``: a segment that fails its
sanity check is recovered, never trusted for its name); PostgreSQL refuses to start rather
than delete. Here a listing takes a segment whose offsets other files also hold only once it
verifies, and a writer opening the partition removes a file outside the chain only once it
has verified the chain holds its records; otherwise it refuses, naming the files, and nothing
is removed.

The second half kills a writer (SIGKILL, in a child process) before each of the file-system
steps of a merge and of a trim: after every kill, every record is there exactly once, and the
next writer opens, cleans up, and appends.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from clocks import FakeClock

from pyspark_rowtime.api import create_stream, open_writer
from pyspark_rowtime.bounds.errors import CorruptLogError
from pyspark_rowtime.streams.columns import LOG_IS_BOUND
from pyspark_rowtime.streams.local import merge as local_merge
from pyspark_rowtime.streams.local.folder import COMPACT_FANIN, list_partition, write_segment
from pyspark_rowtime.streams.local.log import SegmentStats, open_stream
from pyspark_rowtime.streams.retention import TRIM_FILE, TrimState, apply_retention
from pyspark_rowtime.streams.segments import SEGMENT_RE, segment_name

SCRIPT = shutil.which("rowtime", path=str(Path(sys.executable).parent)) or "rowtime"
S = 1_000_000
#: A payload value whose eight bytes occur once in a segment file: where a test flips a byte.
MARK = 0x0123456789ABCDEF


def name(first: int, count: int) -> str:
    return segment_name(first, count)


def singles(location: Path, n: int, *, mark_at: int | None = None) -> Path:
    """A stream whose partition 0 holds ``n`` one-record segments, record ``i`` of them
    ``k = i`` (``k = MARK`` at ``mark_at``), rowtime ``i`` seconds; returns the partition
    folder."""
    create_stream(location, "k BIGINT")
    with open_writer(location, 0, clock=FakeClock()) as w:
        for i in range(n):
            w.insert({"k": MARK if i == mark_at else i}, rowtime=i * 1000)
            w.flush()
    return location / "partition-0000"


def files(part: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(part.iterdir()) if SEGMENT_RE.match(p.name)}


def keys(location: Path, end: int | None = None) -> list[int]:
    stream = open_stream(location)
    t = stream.read(0, stream.start_offset(0), stream.end_offset(0) if end is None else end)
    flags = t.column(LOG_IS_BOUND).to_pylist()
    return [k for k, b in zip(t.column("k").to_pylist(), flags, strict=True) if not b]


def merged(location: Path, first: int, end: int) -> str:
    """Write, beside them, the segment that merges records ``[first, end)`` (what a merge
    commits before it removes the parts); returns its path."""
    stream = open_stream(location)
    parts = [s for s in stream.segments(0) if first <= s.first and s.end <= end]
    stats = SegmentStats.merge([stream.stats(s) for s in parts])
    table = pa.concat_tables(stream._table(s).replace_schema_metadata(None) for s in parts)
    return write_segment(stream.partition_dir(0), stats, stream.file_schema, [table]).path


def flip_mark(path: str | Path) -> None:
    """Flip one bit of the value ``MARK`` in the file: a value changed on disk."""
    data = bytearray(Path(path).read_bytes())
    at = data.find(MARK.to_bytes(8, "little"))
    assert at >= 0 and data.find(MARK.to_bytes(8, "little"), at + 1) < 0
    data[at] ^= 0x01
    os.chmod(path, 0o644)
    Path(path).write_bytes(bytes(data))


# -- the example -----------------------------------------------------------------------


def test_a_copy_named_to_cover_later_segments_costs_no_record_and_insert_refuses(tmp_path):
    loc = tmp_path / "s"
    part = singles(loc, 5)
    shutil.copy(part / name(0, 1), part / name(0, 4))  # a half-restored backup's leftover
    before = files(part)
    assert keys(loc) == [0, 1, 2, 3, 4]  # readers take the verified chain, not the name
    assert open_stream(loc).end_offset(0) == 5

    done = subprocess.run(
        [SCRIPT, "insert", str(loc)], input='{"k": 5}\n', capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr
    message = done.stderr
    for n in [name(0, 4), name(0, 1), name(3, 1)]:
        assert n in message  # the stray and the files it claims to replace
    assert "footer says it holds records [0, 1)" in message
    assert "Nothing was removed" in message and "Move each file named here" in message
    assert files(part) == before  # every file is still there, byte for byte
    assert keys(loc) == [0, 1, 2, 3, 4]

    os.rename(part / name(0, 4), tmp_path / "stray.arrow")  # the operator moves it aside
    with open_writer(loc, 0) as w:
        w.insert({"k": 5}, rowtime=5000)
    assert keys(loc) == [0, 1, 2, 3, 4, 5]


def test_a_copy_that_claims_records_the_partition_never_had_does_not_extend_it(tmp_path):
    loc = tmp_path / "s"
    part = singles(loc, 5)
    shutil.copy(part / name(0, 1), part / name(0, 10))
    assert open_stream(loc).end_offset(0) == 5
    assert keys(loc) == [0, 1, 2, 3, 4]
    with pytest.raises(CorruptLogError, match=name(0, 10)):
        open_writer(loc, 0)
    assert len(files(part)) == 6


def test_a_stray_renamed_to_the_middle_of_the_chain_is_refused_not_removed(tmp_path):
    """A file named inside a merged segment's offsets whose records differ from the chain's
    (another partition's, say) is not the merge's leftover."""
    loc = tmp_path / "s"
    part = singles(loc, 4)
    merged(loc, 0, 4)
    for i in range(4):
        os.unlink(part / name(i, 1))  # the merge completed
    other = singles(tmp_path / "other", 3, mark_at=2)
    shutil.copy(other / name(2, 1), part / name(2, 1))  # record 2, but another stream's
    flip = bytearray((part / name(2, 1)).read_bytes())
    assert keys(loc) == [0, 1, 2, 3]
    with pytest.raises(CorruptLogError) as info:
        open_writer(loc, 0)
    assert name(2, 1) in str(info.value) and name(0, 4) in str(info.value)
    assert (part / name(2, 1)).read_bytes() == bytes(flip)


# -- interrupted merges ------------------------------------------------------------------------


def test_a_merge_killed_before_removing_its_parts_is_finished_by_the_next_writer(tmp_path):
    loc = tmp_path / "s"
    part = singles(loc, 5)
    big = merged(loc, 0, 4)
    os.unlink(part / name(1, 1))  # it had removed one part when it died
    assert keys(loc) == [0, 1, 2, 3, 4]
    with open_writer(loc, 0) as w:
        w.insert({"k": 5}, rowtime=5000)
    assert sorted(files(part)) == [os.path.basename(big), name(4, 1), name(5, 1)]
    assert keys(loc) == [0, 1, 2, 3, 4, 5]


def test_a_damaged_merged_segment_beside_its_parts_is_passed_over_and_named(tmp_path):
    loc = tmp_path / "s"
    part = singles(loc, 5, mark_at=2)
    big = merged(loc, 0, 4)
    flip_mark(big)  # the merged copy of record 2 changed on disk; the part still holds it
    before = files(part)
    assert keys(loc) == [0, 1, MARK, 3, 4]
    with pytest.raises(CorruptLogError) as info:
        open_writer(loc, 0)
    message = str(info.value)
    assert os.path.basename(big) in message and "checksums do not match" in message
    assert name(2, 1) in message
    assert files(part) == before


def test_offsets_only_a_damaged_merged_segment_claims_are_a_gap_that_names_it(tmp_path):
    loc = tmp_path / "s"
    part = singles(loc, 5, mark_at=2)
    big = merged(loc, 0, 4)
    flip_mark(big)
    os.unlink(part / name(2, 1))  # the merge had removed two parts when the disk changed it
    os.unlink(part / name(3, 1))
    with pytest.raises(CorruptLogError) as info:
        open_stream(loc).end_offset(0)
    message = str(info.value)
    assert "no segment for offsets [2, 4)" in message
    assert os.path.basename(big) in message and "checksums do not match" in message
    with pytest.raises(CorruptLogError):
        open_writer(loc, 0)
    assert sorted(files(part)) == sorted(
        [os.path.basename(big), name(0, 1), name(1, 1), name(4, 1)]
    )


def test_a_damaged_part_beside_its_merged_segment_is_kept_and_named(tmp_path):
    loc = tmp_path / "s"
    part = singles(loc, 5, mark_at=2)
    big = merged(loc, 0, 4)
    flip_mark(part / name(2, 1))
    before = files(part)
    assert keys(loc) == [0, 1, MARK, 3, 4]  # the merged segment verifies: it is read
    with pytest.raises(CorruptLogError) as info:
        open_writer(loc, 0)
    message = str(info.value)
    assert name(2, 1) in message and "checksums do not match" in message
    assert files(part) == before
    del big


def test_a_merge_whose_read_back_fails_is_undone_and_its_parts_kept(tmp_path, monkeypatch):
    """A disk that gives back other bytes than were written: the merged segment is removed
    (it is the writer's own, just made) and the parts stay."""
    loc = tmp_path / "s"
    part = singles(loc, COMPACT_FANIN - 1, mark_at=3)
    real = local_merge.write_segment

    def write_then_damage(*args: Any, **kwargs: Any) -> Any:
        segment = real(*args, **kwargs)
        if segment.count > 1:
            flip_mark(segment.path)
        return segment

    monkeypatch.setattr(local_merge, "write_segment", write_then_damage)
    with open_writer(loc, 0) as w:
        w.insert({"k": 99}, rowtime=99_000)
        w.flush()  # the sixteenth small segment: a merge runs
    assert sorted(files(part)) == [name(i, 1) for i in range(COMPACT_FANIN)]
    expected = [*range(COMPACT_FANIN - 1), 99]
    expected[3] = MARK
    assert keys(loc) == expected


# -- interrupted trims -------------------------------------------------------------------------


def test_a_trims_leftover_goes_only_if_its_footer_says_it_is_what_its_name_says(tmp_path):
    loc = tmp_path / "s"
    part = singles(loc, 5)
    (part / TRIM_FILE).write_text(TrimState(start=2, row_max_us=1 * S).to_json())
    shutil.copy(part / name(3, 1), part / "00000000000000000000-0000000002.arrow")
    with pytest.raises(CorruptLogError, match=r"not a segment a trim left"):
        open_writer(loc, 0)
    assert (part / name(0, 1)).exists() and (part / name(1, 1)).exists()
    os.unlink(part / "00000000000000000000-0000000002.arrow")
    with open_writer(loc, 0):
        pass  # the trim's own leftovers go
    assert sorted(files(part)) == [name(2, 1), name(3, 1), name(4, 1)]


def test_a_trim_state_newer_than_every_segment_removes_none_of_them(tmp_path):
    """A backup restored with a ``_trim.json`` from a later day than its segments: the trim
    state's first kept offset is past all of them."""
    loc = tmp_path / "s"
    part = singles(loc, 5)
    (part / TRIM_FILE).write_text(TrimState(start=9, row_max_us=8 * S).to_json())
    before = files(part)
    with pytest.raises(CorruptLogError, match=r"restored from a newer backup"):
        open_writer(loc, 0)
    assert files(part) == before


# -- a writer killed at each step --------------------------------------------------------------

#: The file-system calls a merge or a trim makes its changes with: a child dies before each.
STEPS = ("fsync", "link", "rename", "replace", "unlink")


def die_at_step(step: int, job: str, location: str, conn: Connection) -> None:
    """Run ``job`` on the stream, SIGKILLing this process just before its ``step``-th
    file-system call (counted over :data:`STEPS`); report the count if it finishes."""
    stream = open_stream(location)
    appender = open_writer(location, 0, clock=FakeClock(now=10**15)) if job == "merge" else None
    calls = [0]

    def counted(fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] == step:
                os.kill(os.getpid(), signal.SIGKILL)
            return fn(*args, **kwargs)

        return call

    for fn in STEPS:
        setattr(os, fn, counted(getattr(os, fn)))
    if appender is not None:
        appender.insert({"k": COMPACT_FANIN - 1}, rowtime=(COMPACT_FANIN - 1) * 1000)
        appender.flush()  # the sixteenth small segment: a merge runs
    elif job == "clean":
        open_writer(location, 0).close()  # its cleanup removes the merge's parts
    else:
        apply_retention(stream, before_us=3 * S, use_retention=False)
    conn.send(calls[0])


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A folder on tmpfs where there is one (else ``tmp_path``): the kill tests make a copy
    of a stream per step, and a process killed is what they simulate, not a power cut, so
    the disk's fsyncs would only cost time."""
    shm = "/dev/shm"
    if not (os.path.isdir(shm) and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="rowtime-kill-", dir=shm))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def kill_at_each_step(folder: Path, job: str, prepared: Path) -> list[Path]:
    """Copies of ``prepared``, each after a writer running ``job`` was killed at one step
    (the last copy: the job finished)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["pandas", "pyspark_rowtime.streams.writer"])
    out = []
    for step in range(1, 200):
        loc = folder / f"{job}-{step}"
        shutil.copytree(prepared, loc)
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=die_at_step, args=(step, job, str(loc), child))
        proc.start()
        child.close()
        proc.join(60)
        assert proc.exitcode in (0, -signal.SIGKILL), proc.exitcode
        out.append(loc)
        if proc.exitcode == 0:
            assert parent.recv() == step - 1  # it made fewer calls than this step: done
            parent.close()
            return out
        parent.close()
    raise AssertionError(f"the {job} never finished")


def test_a_merge_killed_at_each_step_loses_nothing(scratch):
    prepared = scratch / "prepared"
    singles(prepared, COMPACT_FANIN - 1)
    runs = kill_at_each_step(scratch, "merge", prepared)
    assert len(runs) > COMPACT_FANIN + 4  # the flush, the merge's commit, its sixteen removals
    merged_seen = 0
    for loc in runs:
        part = loc / "partition-0000"
        n = open_stream(loc).end_offset(0)
        assert n in (COMPACT_FANIN - 1, COMPACT_FANIN), loc  # the last record: flushed or not
        assert keys(loc) == list(range(n))
        merged_seen += (part / name(0, COMPACT_FANIN)).exists()
        with open_writer(loc, 0, clock=FakeClock(now=2 * 10**15)) as w:  # opens, cleans up
            w.insert({"k": n}, rowtime=n * 1000)
        assert keys(loc) == list(range(n + 1))
        listing = list_partition(str(part))
        assert not (listing.leftovers or listing.trimmed or listing.rejected or listing.temps)
    assert merged_seen >= COMPACT_FANIN  # the kills fell between the merge's commit and cleanup


def test_a_cleanup_killed_at_each_step_loses_nothing(scratch):
    prepared = scratch / "prepared"
    part = singles(prepared, 6)
    merged(prepared, 0, 5)  # a merge that died before removing any of its parts
    runs = kill_at_each_step(scratch, "clean", prepared)
    assert len(runs) >= 6  # five removals and the folder's sync
    for loc in runs:
        assert keys(loc) == list(range(6))
        with open_writer(loc, 0) as w:
            w.insert({"k": 6}, rowtime=6000)
        assert sorted(files(loc / part.name)) == [name(0, 5), name(5, 1), name(6, 1)]
        assert keys(loc) == list(range(7))


def test_a_trim_killed_at_each_step_loses_nothing_it_keeps(scratch):
    prepared = scratch / "prepared"
    singles(prepared, 6)
    runs = kill_at_each_step(scratch, "trim", prepared)
    assert len(runs) >= 6  # the trim state's write, rename, folder sync, three removals
    starts = set()
    for loc in runs:
        stream = open_stream(loc)
        start = stream.start_offset(0)
        starts.add(start)
        assert start in (0, 3) and stream.end_offset(0) == 6
        assert keys(loc) == list(range(start, 6))
        with open_writer(loc, 0) as w:
            w.insert({"k": 6}, rowtime=6000)
        assert keys(loc) == list(range(start, 7))
        part = loc / "partition-0000"
        assert sorted(files(part))[0] == name(start, 1)  # the trim's leftovers went
    assert starts == {0, 3}


# -- object storage ----------------------------------------------------------------------------


def object_keys(stream: Any, *parts: str) -> list[str]:
    import obstore

    prefix = stream._key(0, *parts) + "/"
    return sorted(m["path"] for chunk in obstore.list(stream.store, prefix) for m in chunk)


def test_a_missing_commit_object_stops_the_next_writer_before_it_hides_later_ones(object_server):
    """A commit lost from the middle of the sequence (a half-restored backup): a writer taking
    over would commit its epoch in the gap, making what the later commits name invisible for
    good, and then remove their segments as orphans. It refuses instead, naming the commit."""
    import obstore

    from pyspark_rowtime.streams.objstore.log import COMMITS, SEGMENTS, commit_name
    from pyspark_rowtime.streams.storage import open_stream

    url = object_server.url("gap")
    create_stream(url, "k BIGINT")
    with open_writer(url, 0) as w:  # commit 0: the writer's epoch; then one commit a flush
        for k in range(3):
            w.insert({"k": k}, rowtime=k * 1000)
            w.flush()
    stream: Any = open_stream(url)
    segments = object_keys(stream, SEGMENTS)
    assert len(segments) == 3
    obstore.delete(stream.store, stream._key(0, COMMITS, commit_name(2)))
    with pytest.raises(CorruptLogError) as info:
        open_writer(url, 0)
    message = str(info.value)
    assert commit_name(2) in message and commit_name(3) in message
    assert "Nothing was written or removed" in message
    assert object_keys(stream, SEGMENTS) == segments
    assert len(object_keys(stream, COMMITS)) == 3  # no epoch commit went into the gap
    fresh: Any = open_stream(url)
    assert fresh.read(0, 0, fresh.end_offset(0)).column("k").to_pylist() == [0]


def test_a_trim_object_newer_than_every_commit_removes_no_segment(object_server):
    import obstore

    from pyspark_rowtime.streams.objstore.log import COMMITS, SEGMENTS
    from pyspark_rowtime.streams.storage import open_stream

    url = object_server.url("newtrim")
    create_stream(url, "k BIGINT")
    with open_writer(url, 0) as w:
        for k in range(3):
            w.insert({"k": k}, rowtime=k * 1000)
            w.flush()
    stream: Any = open_stream(url)
    segments = object_keys(stream, SEGMENTS)
    doc = {"v": 1, "state": TrimState(start=7, row_max_us=6 * S).to_doc(), "from_seq": 9}
    obstore.put(stream.store, stream._key(0, TRIM_FILE), json.dumps(doc).encode())
    with pytest.raises(CorruptLogError, match=r"restored from a newer backup"):
        open_writer(url, 0)
    assert object_keys(stream, SEGMENTS) == segments
    assert len(object_keys(stream, COMMITS)) == 4


def test_small_segments_0_1_0_wrote_still_merge(tmp_path):
    """The merge recomputes the parts' footers from their records; a footer of an older
    version lacks fields added since, and that is no damage."""
    fixture = Path(__file__).parent.parent / "integration" / "fixtures" / "v0_1_0" / "src"
    loc = tmp_path / "src"
    shutil.copytree(fixture, loc)
    stream = open_stream(loc)
    old = stream.end_offset(0)
    before = stream.read(0, 0, old)
    part = loc / "partition-0000"
    assert len(files(part)) == 3
    row = {f.name: None for f in stream.meta.payload_schema}
    with open_writer(loc, 0) as w:
        for _ in range(COMPACT_FANIN - 3):
            w.insert(row)
            w.flush()
    assert sorted(files(part)) == [name(0, old + COMPACT_FANIN - 3)]
    assert open_stream(loc).read(0, 0, old).equals(before)

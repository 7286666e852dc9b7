"""Faults in storage, without Spark: damaged segment files, a full disk, read-only folders.

What must hold: a damaged segment is a :class:`CorruptLogError` naming the file and the records
it held, while other partitions and streams read on and ``rowtime describe`` points at it; a
write that fails for lack of space (a real, small tmpfs) publishes no partial file, keeps what
was committed, says what to do, and succeeds once space returns, with every row exactly once.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from sink_helpers import HOUR, T0, make, records, run

from pyspark_rowtime.api import create_stream, open_writer
from pyspark_rowtime.bounds.errors import CorruptLogError
from pyspark_rowtime.cli import main
from pyspark_rowtime.streams.local.log import open_stream

MS0 = 1_700_000_000_000


def fill(loc: str, partitions: int = 2) -> None:
    """Two segments per partition: ids 0-99 then 100-199, rowtimes MS0 + id (ms)."""
    create_stream(loc, "id INT, name STRING", partitions=partitions)
    for p in range(partitions):
        with open_writer(loc, p) as w:
            for i in range(100):
                w.insert({"id": i, "name": "x" * (i % 7)}, rowtime=MS0 + i)
            w.flush()
            for i in range(100, 200):
                w.insert({"id": i, "name": "y"}, rowtime=MS0 + i)


def segment_files(loc: str, partition: int) -> list[str]:
    d = os.path.join(loc, f"partition-{partition:04d}")
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".arrow"))


def ids(loc: str, partition: int) -> list[int]:
    stream = open_stream(loc)
    return stream.read(partition, 0, stream.end_offset(partition)).column("id").to_pylist()


def _truncate_half(f):  # a copy cut short
    f.truncate(os.fstat(f.fileno()).st_size // 2)


def _truncate_tail(f):  # the last bytes (the file's end magic) lost
    f.truncate(os.fstat(f.fileno()).st_size - 3)


def _empty(f):  # a crash of a filesystem without data journaling
    f.truncate(0)


def _footer(f):  # bytes flipped in the Arrow footer
    f.seek(os.fstat(f.fileno()).st_size - 40)
    f.write(b"\xff" * 16)


def _appended(f):  # junk after the end (two writers on one file over NFS, say)
    f.seek(0, os.SEEK_END)
    f.write(b"junk" * 10)


@pytest.mark.parametrize("damage", [_truncate_half, _truncate_tail, _empty, _footer, _appended])
@pytest.mark.parametrize("which", [0, 1], ids=["first segment", "last segment"])
def test_a_damaged_segment_is_named_with_its_records_and_nothing_else_is_affected(
    tmp_path, capsys, damage, which
):
    loc, other = str(tmp_path / "s"), str(tmp_path / "other")
    fill(loc)
    fill(other)
    bad = segment_files(loc, 0)[which]
    first, end = (0, 100) if which == 0 else (100, 200)
    with open(bad, "r+b") as f:
        damage(f)

    with pytest.raises(CorruptLogError) as e:
        ids(loc, 0)
    message = str(e.value)
    assert bad in message and f"records [{first}, {end})" in message, message
    assert ids(loc, 1) == list(range(200))  # the other partition
    assert ids(other, 0) == list(range(200))  # another stream

    # describe shows the healthy partition and names the damaged file.
    code = main(["describe", loc])
    out, err = capsys.readouterr()
    assert code == 1
    assert "DAMAGED" in out and bad in err and f"records [{first}, {end})" in err
    line = next(line for line in out.splitlines() if line.startswith("1 "))
    assert line.split()[1] == "200"
    code = main(["describe", loc, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    assert bad in doc["partition_info"][0]["damaged"]
    assert doc["partition_info"][1]["records"] == 200

    if which == 1:  # a writer that would append after it refuses, naming it
        with pytest.raises(CorruptLogError, match=bad):
            open_writer(loc, 0)


def _flip_in_names(path: str, which: int) -> None:
    """Flip one byte inside the value buffer of the ``name`` column (a run of x or y)."""
    data = Path(path).read_bytes()
    at = data.index(b"xxxxxx" if which == 0 else b"y" * 100) + 3
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes([data[at] ^ 0x20]))  # x -> X: still a valid string


@pytest.mark.parametrize("which", [0, 1], ids=["first segment", "last segment"])
def test_a_flipped_byte_in_a_value_is_named_by_describe_verify(tmp_path, capsys, which):
    loc, other = str(tmp_path / "s"), str(tmp_path / "other")
    fill(loc)
    fill(other)
    assert main(["describe", loc, "--verify"]) == 0
    assert "4 record batches match" in capsys.readouterr().out  # 2 segments x 2 partitions
    bad = segment_files(loc, 0)[which]
    first, end = (0, 100) if which == 0 else (100, 200)
    before = Path(bad).stat().st_size
    _flip_in_names(bad, which)
    assert Path(bad).stat().st_size == before

    # Arrow has no checksum of its own; the read checks the batch's, and returns nothing of it.
    stream = open_stream(loc)
    for check in (lambda: stream.read(0, first, end), lambda: stream.verify(0)):
        with pytest.raises(CorruptLogError) as e:
            check()
        message = str(e.value)
        assert bad in message and f"records [{first}, {end})" in message and "checksum" in message
    assert stream.verify(1) == (2, 0)  # the other partition
    assert ids(loc, 1) == list(range(200))

    code = main(["describe", loc, "--verify"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "DAMAGED" in out and bad in err and f"records [{first}, {end})" in err
    line = next(line for line in out.splitlines() if line.startswith("1 "))
    assert line.split()[1] == "200"
    code = main(["describe", loc, "--json", "--verify"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and bad in doc["partition_info"][0]["damaged"]
    assert doc["partition_info"][1]["batches_checked"] == 2
    assert main(["describe", other, "--verify"]) == 0  # another stream
    assert main(["describe", loc]) == 0  # without --verify, only footers are read
    capsys.readouterr()


def test_segments_written_before_checksums_read_and_verify_as_unchecked(tmp_path, capsys):
    loc = str(tmp_path / "s")
    fill(loc, partitions=1)
    old = segment_files(loc, 0)[0]
    table = pa.ipc.open_file(pa.memory_map(old)).read_all()
    os.unlink(old)  # rewritten as the format was written before checksums: no batch metadata
    with pa.OSFile(old, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    assert ids(loc, 0) == list(range(200))
    assert open_stream(loc).verify(0) == (1, 1)
    assert main(["describe", loc, "--verify"]) == 0
    out = capsys.readouterr().out
    assert "1 record batches match, 1 written before checksums not checked" in out


def test_a_damaged_small_segment_is_not_merged_under_a_fresh_checksum(tmp_path):
    loc = str(tmp_path / "s")
    create_stream(loc, "id INT, name STRING")
    with open_writer(loc) as w:
        w.insert({"id": 0, "name": "xxxxxxxx"}, rowtime=MS0)
        w.flush()
        _flip_in_names(segment_files(loc, 0)[0], 0)
        for i in range(1, 40):  # enough flushes of one record for merges of small segments
            w.insert({"id": i, "name": "y"}, rowtime=MS0 + i)
            w.flush()
    with pytest.raises(CorruptLogError, match=r"records \[0, 1\)"):
        open_stream(loc).verify(0)
    with pytest.raises(CorruptLogError, match=r"records \[0, 1\)"):
        ids(loc, 0)
    stream = open_stream(loc)  # the records after it read
    assert stream.read(0, 1, 40).column("id").to_pylist() == list(range(1, 40))


def test_a_missing_segment_is_a_gap_named_by_its_offsets(tmp_path):
    loc = str(tmp_path / "s")
    fill(loc)
    os.unlink(segment_files(loc, 0)[0])
    with pytest.raises(CorruptLogError, match=r"no segment for offsets \[0, 100\)"):
        ids(loc, 0)
    assert ids(loc, 1) == list(range(200))


# -- a full disk ---------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs, unmounted afterwards; skipped where mounting is not allowed."""
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()}): needs root")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill_disk(disk: Path) -> Path:
    """A file taking every free byte of the disk."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def leftovers(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.name.startswith(".tmp.")]


def test_a_writer_on_a_full_disk_commits_nothing_keeps_its_buffer_and_recovers(small_disk):
    loc = str(small_disk / "s")
    create_stream(loc, "id INT, name STRING")
    with open_writer(loc) as w:
        for i in range(10):
            w.insert({"id": i, "name": "a"}, rowtime=MS0 + i)
        w.flush()
        filler = fill_disk(small_disk)
        for i in range(10, 2000):
            w.insert({"id": i, "name": "b" * 50}, rowtime=MS0 + i)
        with pytest.raises(OSError) as e:
            w.flush()
        assert e.value.errno == errno.ENOSPC
        message = str(e.value)
        assert "partition 0" in message and loc in message and "flush() again" in message
        assert w.pending == 1990 and w.end_offset == 10
        assert leftovers(small_disk) == []  # the partial segment was removed
        assert ids(loc, 0) == list(range(10))  # committed records untouched
        filler.unlink()  # space returns
        assert w.flush() == 2000
    assert ids(loc, 0) == list(range(2000))


def test_an_automatic_flush_on_a_full_disk_says_the_row_was_kept(small_disk):
    """insert() flushes by itself past flush_records: when that write fails, the row is in the
    buffer (not lost, not to be inserted again), and the error says so."""
    loc = str(small_disk / "s")
    create_stream(loc, "id INT, name STRING")
    with open_writer(loc, flush_records=500) as w:
        filler = fill_disk(small_disk)
        with pytest.raises(OSError) as e:
            for i in range(500):
                w.insert({"id": i, "name": "c" * 50}, rowtime=MS0 + i)
        assert "kept in the buffer" in str(e.value)
        assert w.pending == 500 and i == 499
        filler.unlink()
    assert ids(loc, 0) == list(range(500))


@pytest.mark.parametrize("kind", ["stream", "parquet"])
def test_a_sink_task_on_a_full_disk_publishes_nothing_and_its_retry_writes_once(small_disk, kind):
    target = make(small_disk, kind)
    rows = [(i, T0 + i * 1000) for i in range(3000)]
    filler = fill_disk(small_disk)
    with pytest.raises(OSError) as e:
        run(target, 0, [[records(rows, bound=T0 + HOUR)]])
    assert e.value.errno == errno.ENOSPC
    published = [
        p
        for p in (small_disk / "target").rglob("*")
        if p.is_file() and "_rowtime_sink" not in p.parts
    ]
    assert [p for p in published if p.suffix in (".arrow", ".parquet")] == []
    filler.unlink()
    run(target, 0, [[records(rows, bound=T0 + HOUR)]], attempt=1)  # Spark's retry
    if kind == "stream":
        got = open_stream(str(small_disk / "target"))
        table = got.read(0, 0, got.end_offset(0))
        data = table.filter(pa.compute.invert(table.column("__is_bound")))
        assert sorted(data.column("id").to_pylist()) == list(range(3000))
    else:
        import pyarrow.parquet as pq

        files = sorted((small_disk / "target").rglob("*.parquet"))
        got_ids = sorted(i for f in files for i in pq.read_table(f).column("id").to_pylist())
        assert got_ids == list(range(3000))


# -- read-only folders ---------------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through read-only modes")
def test_a_writer_on_a_read_only_stream_fails_naming_it(tmp_path):
    loc = str(tmp_path / "s")
    fill(loc, partitions=1)
    os.chmod(os.path.join(loc, "partition-0000"), 0o555)
    try:
        with pytest.raises(OSError):
            with open_writer(loc) as w:
                w.insert({"id": 1})
        assert ids(loc, 0) == list(range(200))
    finally:
        os.chmod(os.path.join(loc, "partition-0000"), 0o755)


def test_a_read_only_filesystem_is_refused_with_nothing_changed(small_disk):
    loc = str(small_disk / "s")
    fill(loc, partitions=1)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    try:
        with pytest.raises(OSError) as e:
            with open_writer(loc) as w:
                w.insert({"id": 1})
        assert e.value.errno == errno.EROFS
        assert ids(loc, 0) == list(range(200))
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    shutil.rmtree(loc)


def test_describe_verify_of_a_parquet_target_says_it_checks_streams_only(tmp_path, capsys):
    target = make(tmp_path, "parquet")
    run(target, 0, [[records([(1, T0)], bound=T0 + 1)]])
    assert main(["describe", str(tmp_path / "target"), "--verify"]) == 2
    assert "Parquet target" in capsys.readouterr().err
    assert main(["describe", str(tmp_path / "target")]) == 0


def test_a_batch_is_checked_once_per_process_and_again_once_its_file_changed(tmp_path, monkeypatch):
    from pyspark_rowtime.streams import checksums

    loc = str(tmp_path / "s")
    fill(loc, partitions=1)
    sums: list[int] = []
    real = checksums.batch_checksum
    monkeypatch.setattr(checksums, "batch_checksum", lambda b: sums.append(b.num_rows) or real(b))
    assert ids(loc, 0) == list(range(200))
    assert sums == [100, 100]  # each segment's one batch
    assert ids(loc, 0) == list(range(200))  # another stream object, the same files
    assert open_stream(loc).read(0, 0, 200, ["id", "name"]).num_rows == 200
    assert sums == [100, 100]
    assert open_stream(loc).read(0, 0, 200, ["__rowtime_us"]).num_rows == 200  # the planner's
    assert sums == [100, 100]
    _flip_in_names(segment_files(loc, 0)[1], 1)  # a changed file is another file
    with pytest.raises(CorruptLogError, match=r"records \[100, 200\)"):
        ids(loc, 0)
    assert sums == [100, 100, 100]

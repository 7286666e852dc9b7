"""The object storage backend (s3://, az://) keeps the storage contract the embedded log keeps.

Every test here runs against the embedded log (a folder) and against real servers started by
the tests (tests/objstore_servers.py): moto's S3 server and Azurite, Microsoft's Azure Blob
emulator. The same calls, the same answers: that is the contract (streams/storage.py)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from objstore_servers import ObjectServer
from test_retention import POLICIES, READS, batch, restricted, write_random

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.bounds.errors import (
    BoundError,
    OptionError,
    SchemaError,
    StreamNotFoundError,
    WriterLockedError,
)
from pyspark_rowtime.streams.columns import LOG_IS_BOUND as IS_BOUND
from pyspark_rowtime.streams.objstore.location import parse_location
from pyspark_rowtime.streams.retention import DataLossError, apply_retention
from pyspark_rowtime.streams.segments import SegmentStats, write_segment_file
from pyspark_rowtime.streams.storage import (
    LocationKind,
    PartitionAppender,
    StreamStorage,
    create_storage,
    open_storage,
    what_is_at,
)

T0 = 1_700_000_000_000_000
MS = 1_700_000_000_000  # T0 in the writer's default unit
S = 1_000_000


@pytest.fixture(params=["log", "s3", "az"])
def at(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """``at(name)``: a fresh location of the test's backend."""
    if request.param == "log":
        return lambda name: str(tmp_path / name)
    server: ObjectServer = request.getfixturevalue(f"{request.param}_server")
    return server.url


def test_create_open_and_the_same_again(at: Callable[[str], str]) -> None:
    url = at("s")
    assert what_is_at(url).kind is LocationKind.NOTHING
    s = create_storage(url, "id BIGINT, name STRING", partitions=3, order="drop")
    assert what_is_at(url).kind is LocationKind.STREAM
    again = open_storage(url)
    assert isinstance(again, StreamStorage)
    assert again.meta.partitions == 3 and again.meta.defaults == {"order": "drop"}
    assert again.meta.payload_schema.equals(s.meta.payload_schema)
    assert create_storage(url, "id BIGINT, name STRING", partitions=3).meta.partitions == 3
    with pytest.raises(SchemaError, match="another schema"):
        create_storage(url, "id INT", partitions=3)
    with pytest.raises(OptionError, match="3 partitions"):
        create_storage(url, "id BIGINT, name STRING", partitions=2)
    assert [s.tail(p).end for p in range(3)] == [0, 0, 0]
    assert s.stream_clock_us() is None
    with pytest.raises(StreamNotFoundError, match="create_stream"):
        open_storage(at("nothing-here"))


def test_inserted_records_read_back_by_offset(at: Callable[[str], str]) -> None:
    url = at("s")
    pr.create_stream(url, "id BIGINT, name STRING", partitions=2)
    with pr.open_writer(url, 0) as w:
        for i in range(20):
            w.insert({"id": i, "name": f"n{i}"}, rowtime=MS + i)
        w.flush()
        w.insert_arrow(pa.table({"id": list(range(20, 30)), "name": ["x"] * 10}))
        w.end_stream()
    s = open_storage(url)  # a fresh reader, as another process would be
    tail = s.tail(0)
    assert tail.end == 31 and tail.clock_us == END_OF_STREAM_US
    whole = s.read(0, 0, 31)
    assert whole.column("id").to_pylist() == [*range(30), None]
    assert whole.column(IS_BOUND).to_pylist() == [False] * 30 + [True]
    assert whole.schema.equals(s.file_schema)
    for lo, hi in [(0, 1), (6, 8), (13, 29), (19, 21), (5, 5)]:
        assert s.read(0, lo, hi, columns=["id"]).column("id").to_pylist() == list(range(lo, hi))
    assert sum(st.count for st in s.partition_stats(0)) == 31
    assert s.partition_stats(0)[0].first == 0
    with pytest.raises(OptionError, match="only 31 records are committed"):
        s.read(0, 0, 32)
    with pytest.raises(SchemaError, match="no column"):
        s.read(0, 0, 1, columns=["nope"])
    with pytest.raises(OptionError, match="numbered 0 to 1"):
        s.read(2, 0, 1)
    assert s.stream_clock_us() is None  # partition 1 is empty
    with pr.open_writer(url, 1) as w:
        w.insert({"id": 1}, rowtime=MS + 5)
    assert open_storage(url).stream_clock_us() == T0 + 5000


def test_a_reader_sees_each_flush_as_it_is_committed(at: Callable[[str], str]) -> None:
    url = at("s")
    pr.create_stream(url, "id BIGINT")
    reader = open_storage(url)
    with pr.open_writer(url, 0) as w:
        for n in range(1, 4):
            w.insert({"id": n}, rowtime=MS + n)
            assert reader.end_offset(0) == n - 1  # buffered: not visible
            w.flush()
            assert reader.end_offset(0) == n
            assert reader.read(0, n - 1, n).column("id").to_pylist() == [n]


def test_one_writer_per_partition(at: Callable[[str], str]) -> None:
    url = at("s")
    s = create_storage(url, "id BIGINT", partitions=2)
    a = s.lock_partition(0, "partition 0")
    assert isinstance(a, PartitionAppender)
    with pytest.raises(WriterLockedError, match="another writer"):
        s.lock_partition(0, "partition 0")
    with pytest.raises(WriterLockedError):
        pr.open_writer(url, 0)
    other = s.lock_partition(1, "partition 1")  # other partitions are free
    other.release()
    a.release()
    a.release()  # idempotent
    with pr.open_writer(url, 0) as w:  # released: the next writer goes on
        w.insert({"id": 1}, rowtime=MS)
    assert open_storage(url).end_offset(0) == 1


def _run(s: StreamStorage, first: int, prev: int | None, ids: list[int], at_us: int):
    import numpy as np

    n = len(ids)
    arrival = np.arange(at_us, at_us + n, dtype=np.int64)
    stats = SegmentStats.compute(first, arrival, arrival, np.ones(n, bool), np.zeros(n, bool), prev)
    table = pa.table(
        {
            "__arrival_us": arrival,
            "__rowtime_us": arrival,
            "__is_bound": np.zeros(n, bool),
            "id": pa.array(ids, pa.int64()),
        },
        schema=s.file_schema,
    )
    return stats, table


def test_segment_files_are_appended_as_one_unit(at: Callable[[str], str], tmp_path: Path) -> None:
    s = create_storage(at("s"), "id BIGINT")
    st1, t1 = _run(s, 0, None, [0, 1, 2, 3], T0)
    st2, t2 = _run(s, 4, st1.clock_us, [4, 5, 6], T0 + 10)
    paths = [str(tmp_path / "a.arrow"), str(tmp_path / "b.arrow")]
    for path, st, t in zip(paths, (st1, st2), (t1, t2), strict=True):
        write_segment_file(path, st, s.file_schema, [t])
    # a file whose bound goes below the clock: nothing of the list is committed
    import numpy as np

    low = SegmentStats.compute(
        7, np.array([T0 + 20]), np.array([T0]), np.ones(1, bool), np.ones(1, bool), st2.clock_us
    )
    bad = pa.table(
        {
            "__arrival_us": [T0 + 20],
            "__rowtime_us": [T0],
            "__is_bound": [True],
            "id": pa.array([None], pa.int64()),
        },
        schema=s.file_schema,
    )
    write_segment_file(str(tmp_path / "c.arrow"), low, s.file_schema, [bad])
    a = s.lock_partition(0, "p0")
    try:
        with pytest.raises(BoundError):
            a.append_segment_files([*paths, str(tmp_path / "c.arrow")], reject=False, verify=True)
        assert s.end_offset(0) == 0
        a.append_segment_files(paths, reject=False, verify=True)
    finally:
        a.release()
    assert s.read(0, 0, 7).column("id").to_pylist() == list(range(7))
    assert [st.first for st in s.partition_stats(0)] == [0, 4]


def _write_seconds(url: str, seconds: range, per_flush: int) -> None:
    with pr.open_writer(url, 0) as w:
        for i, sec in enumerate(seconds):
            w.insert({"k": sec}, rowtime=sec * 1000)
            if (i + 1) % per_flush == 0:
                w.flush()


def test_a_trim_removes_whole_units_keeps_offsets_and_reports_data_loss(
    at: Callable[[str], str],
) -> None:
    url = at("s")
    pr.create_stream(url, "k INT")
    _write_seconds(url, range(40), per_flush=10)
    reader = open_storage(url)
    assert reader.read(0, 0, 5).column("k").to_pylist() == list(range(5))
    stream: Any = open_storage(url)
    [result] = apply_retention(stream, before_us=25 * S)
    assert (result.before.start, result.after.start) == (0, 20)
    fresh = open_storage(url)
    assert fresh.start_offset(0) == 20 and fresh.end_offset(0) == 40
    assert fresh.read(0, 20, 40).column("k").to_pylist() == list(range(20, 40))
    with pytest.raises(DataLossError, match="first kept offset is 20"):
        fresh.read(0, 0, 25)
    with pr.open_writer(url, 0) as w:  # offsets go on after the trim
        w.insert({"k": 40}, rowtime=40_000)
    assert open_storage(url).read(0, 40, 41).column("k").to_pylist() == [40]
    # a reader that looked before the trim sees what came after it
    assert reader.end_offset(0) == 41 and reader.start_offset(0) == 20
    assert reader.read(0, 39, 41).column("k").to_pylist() == [39, 40]
    assert fresh.trim_state(0).start == 20


@pytest.mark.parametrize("defaults", [POLICIES[1], POLICIES[4]], ids=["drop", "adjust"])
def test_reads_of_a_trimmed_stream_equal_the_untrimmed_ones(
    object_server: ObjectServer, defaults: dict[str, Any]
) -> None:
    rng = random.Random(11 + len(str(defaults)))
    compared = trimmed = 0
    for case in range(2):
        a, b = object_server.url("a"), object_server.url("b")
        partitions = rng.choice([1, 2])
        seed = rng.randrange(10**9)
        for location in (a, b):  # the same records twice: one is trimmed
            write_random(location, random.Random(seed), defaults, partitions, end=case == 0)
        stream: Any = open_storage(b)
        top = max(s.max_rowtime_us or 0 for s in stream.partition_stats(0))
        apply_retention(stream, before_us=rng.randrange(1_000_000_000, top + 2))
        kept = [stream.start_offset(p) for p in range(partitions)]
        trimmed += sum(kept)
        for read in READS[:3]:
            want, got = batch(a, read), batch(b, read)
            for p, start in enumerate(kept):
                mine = [{**r, "arrival": None} for r in got[p]]
                theirs = [{**r, "arrival": None} for r in restricted(want[p], start)]
                assert mine == theirs, (case, read, p, start)
                compared += len(got[p])
    assert trimmed > 10 and compared > 50


@pytest.mark.parametrize(
    ("location", "bucket", "prefix"),
    [
        ("s3://bkt/a/b", "bkt", "a/b"),
        ("s3a://bkt/a/", "bkt", "a"),
        ("az://cont/x", "cont", "x"),
        ("azure://cont/x/y", "cont", "x/y"),
        ("abfss://cont@acct.dfs.core.windows.net/x", "cont", "x"),
    ],
)
def test_locations_name_a_bucket_and_a_prefix(location: str, bucket: str, prefix: str) -> None:
    loc = parse_location(location)
    assert (loc.bucket, loc.prefix) == (bucket, prefix)
    assert parse_location(str(loc)) == loc


@pytest.mark.parametrize(
    ("location", "why"),
    [
        ("s3://bkt", "needs a bucket"),
        ("s3://key:secret@bkt/x", "carries credentials"),
        ("az://cont/x?sig=abc", "query"),
        ("s3://bkt/a/../b", "'..'"),
    ],
)
def test_bad_locations_are_refused_saying_why_without_secrets(location: str, why: str) -> None:
    with pytest.raises(OptionError, match=why) as e:
        what_is_at(location)
    assert "secret" not in str(e.value).replace("secret access", "")


def test_the_cli_describes_trims_and_sets_retention_on_object_storage(
    object_server: ObjectServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from pyspark_rowtime.cli import main

    url = object_server.url("cli")
    assert main(["create", url, "--schema", "k INT", "--partitions", "1"]) == 0
    _write_seconds(url, range(30), per_flush=10)
    capsys.readouterr()
    assert main(["describe", url]) == 0
    out = capsys.readouterr().out
    assert url in out and "30" in out
    assert main(["retention", url, "1 day"]) == 0
    assert open_storage(url).retention().active  # type: ignore[attr-defined]
    assert main(["trim", url, "--before", "15", "--unit", "s"]) == 0
    assert open_storage(url).start_offset(0) == 10
    assert main(["clock", url]) == 0
    # no secret of the environment appears in anything printed
    printed = "".join(capsys.readouterr())
    for name in ("AWS_SECRET_ACCESS_KEY", "AZURE_STORAGE_ACCOUNT_KEY"):
        secret = object_server.env.get(name)
        assert secret is None or secret not in printed


def test_refused_credentials_are_a_clear_error_without_the_secret(
    az_server: ObjectServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark_rowtime.streams.objstore import location

    url = az_server.url("creds")
    pr.create_stream(url, "k INT")
    wrong = "V3Jvbmcta2V5LW9mLTY0LWJ5dGVzLi4uLi4uLi4uLi4uLi4uLi4uLi4uLi4uLi4uLi4uLi4uLi4uLi4uLg=="
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", wrong)
    location.forget_stores()
    try:
        with pytest.raises(OptionError, match="refused") as e:
            open_storage(url)
        assert wrong not in str(e.value) and url in str(e.value)
    finally:
        monkeypatch.undo()
        location.forget_stores()
    assert open_storage(url).end_offset(0) == 0


def test_an_abfs_location_names_the_same_objects_as_az(az_server: ObjectServer) -> None:
    url = az_server.url("abfs")
    prefix = url.split("/", 3)[3]
    abfs = f"abfs://{az_server.bucket}@devstoreaccount1.dfs.core.windows.net/{prefix}"
    pr.create_stream(abfs, "k INT")
    with pr.open_writer(abfs, 0) as w:
        w.insert({"k": 7}, rowtime=MS)
    assert open_storage(url).read(0, 0, 1).column("k").to_pylist() == [7]
    assert what_is_at(abfs).resolved == abfs


@pytest.mark.parametrize("kind", ["s3", "az"])
def test_the_planners_read_of_time_columns_fetches_no_payload(
    request: pytest.FixtureRequest, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's planner reads only the system columns; on object storage that read takes
    the byte ranges of those columns (the IPC footer says where they are), not the payload, and
    gives what the whole object gives."""
    import obstore

    server: ObjectServer = request.getfixturevalue(f"{kind}_server")
    url = server.url("s")
    pr.create_stream(url, "id BIGINT, blob STRING")
    with pr.open_writer(url, 0) as w:
        w.insert_arrow(pa.table({"id": list(range(5000)), "blob": ["x" * 400] * 5000}))
    fetched = {"bytes": 0}
    plain_range, plain_get = obstore.get_range, obstore.get

    def counted_range(*args: Any, **kwargs: Any) -> Any:
        data = plain_range(*args, **kwargs)
        fetched["bytes"] += len(memoryview(data))
        return data

    def no_whole_get(store: Any, key: str, *args: Any, **kwargs: Any) -> Any:
        if key.endswith(".arrow"):
            raise AssertionError(f"the whole segment {key} was fetched")
        return plain_get(store, key, *args, **kwargs)

    system = ["__arrival_us", "__rowtime_us", "__is_bound"]
    whole = open_storage(url).read(0, 0, 5000).select(system)
    monkeypatch.setattr(obstore, "get_range", counted_range)
    monkeypatch.setattr(obstore, "get", no_whole_get)
    times = open_storage(url).read(0, 0, 5000, columns=system)
    assert times.equals(whole)
    assert 0 < fetched["bytes"] < 5000 * 400 / 10  # the times: ~17 bytes a record

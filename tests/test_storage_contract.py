"""The storage contract (streams/storage.py's module docstring), one suite for every backend.

Each test runs against the embedded log (``local``, a folder), Redis (``redis``, a real
redis-server: tests/redis_server.py), S3 (``s3``, moto's server) and Azure Blob (``azure``,
Azurite): tests/objstore_servers.py. The same calls give the same answers; what only one
backend does (its files, leases, credentials, locations) is tested in its own file
(test_log.py, test_redis_log.py, test_objstore_log.py).

Sections: creating and opening; appends; atomic visibility; one appender; clocks; retention
and trims; sink state; target files; errors; damaged values.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from clocks import T0, FakeClock
from damage import flip_staged, flip_stored
from objstore_servers import ObjectServer
from redis_server import RedisServer, redis_server, why_no_server

from pyspark_rowtime.api import create_stream, get_rowtime_bound, open_writer, read_stream
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.bounds.errors import (
    BoundError,
    CorruptLogError,
    OptionError,
    SchemaError,
    StreamNotFoundError,
    WriterLockedError,
)
from pyspark_rowtime.cli import main
from pyspark_rowtime.sink.layout import open_sink_state
from pyspark_rowtime.streams.columns import LOG_ARRIVAL_US, LOG_IS_BOUND, LOG_ROWTIME_US
from pyspark_rowtime.streams.retention import DataLossError, Retention, apply_retention
from pyspark_rowtime.streams.segments import SegmentStats, write_segment_file
from pyspark_rowtime.streams.sink_state import (
    SupportsSinkState,
    SupportsTargetFiles,
    owner_conflict,
    target_files,
)
from pyspark_rowtime.streams.storage import (
    Backend,
    LocationKind,
    PartitionAppender,
    StreamStorage,
    SupportsEntrySource,
    SupportsStoredBytes,
    SupportsTrim,
    SupportsVerify,
    SupportsWriterOf,
    backend_for,
    open_stream,
    what_is_at,
)

BACKENDS = ["local", "redis", "s3", "azure"]
#: What each backend can do beyond :class:`StreamStorage` and :class:`Backend`: its streams'
#: capabilities and its own. Each backend is held to exactly these (a capability it gains is
#: added here, and tested below over every backend that has it).
STREAM_CAPABILITIES: dict[str, set[type]] = {
    "local": {SupportsTrim, SupportsVerify, SupportsStoredBytes},
    "redis": {SupportsTrim},
    "s3": {SupportsTrim, SupportsWriterOf},
    "azure": {SupportsTrim, SupportsWriterOf},
}
BACKEND_CAPABILITIES: dict[str, set[type]] = {
    "local": set(),
    "redis": {SupportsSinkState, SupportsEntrySource},
    "s3": {SupportsSinkState, SupportsTargetFiles},
    "azure": {SupportsSinkState, SupportsTargetFiles},
}
EVERY_STREAM_CAPABILITY = set().union(*STREAM_CAPABILITIES.values())
EVERY_BACKEND_CAPABILITY = set().union(*BACKEND_CAPABILITIES.values())
MS = T0 // 1000  # T0 in the writer's default unit (ms)
S = 1_000_000
JAN1 = 1_704_067_200_000_000
JAN2 = 1_704_153_600_000_000


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    why = why_no_server()
    if why:
        pytest.skip(why)
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


_names = iter(range(10**6))


@pytest.fixture(params=BACKENDS)
def at(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """``at(name)``: a fresh location of the test's backend (a new one at every call)."""
    kind = request.param
    if kind == "local":
        return lambda name: str(tmp_path / f"{name}{next(_names)}")
    if kind == "redis":
        server: RedisServer = request.getfixturevalue("redis")
        return lambda name: server.url(f"{name}{next(_names)}")
    objects: ObjectServer = request.getfixturevalue("s3_server" if kind == "s3" else "az_server")
    return objects.url


def _run(
    s: StreamStorage, first: int, prev: int | None, ids: list[int | None], at_us: int,
    *, bound: bool = False, rowtime_us: int | None = None,
) -> tuple[SegmentStats, pa.Table]:  # fmt: skip
    """A run in the segment format: one record per id, arriving 1 us apart from ``at_us``,
    each at its arrival as rowtime (or ``rowtime_us``); bound records when ``bound``."""
    n = len(ids)
    arrival = np.arange(at_us, at_us + n, dtype=np.int64)
    rowtime = arrival if rowtime_us is None else np.full(n, rowtime_us, dtype=np.int64)
    is_bound = np.full(n, bound)
    stats = SegmentStats.compute(first, arrival, rowtime, np.ones(n, bool), is_bound, prev)
    table = pa.table(
        {
            LOG_ARRIVAL_US: arrival,
            LOG_ROWTIME_US: rowtime,
            LOG_IS_BOUND: is_bound,
            **{
                f.name: pa.array(ids if f.name == "id" else [None] * n, f.type)
                for f in s.meta.payload_schema
            },
        },
        schema=s.file_schema,
    )
    return stats, table


@pytest.fixture
def written(at: Callable[[str], str]) -> str:
    """A stream with two partitions: p0 has rows, a bound and an Arrow batch; p1 is empty."""
    loc = at("w")
    create_stream(loc, "a INT, b STRING", 2)
    clock = FakeClock()
    with open_writer(loc, 0, clock=clock) as w:
        w.insert({"a": 1, "b": "x"})  # inserted at T0, implicit: its rowtime
        w.insert({"a": 2}, rowtime=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc))
        w.flush()  # commits at T0 + 2
        w.set_rowtime_bound(dt.datetime(2024, 1, 2, tzinfo=dt.timezone.utc))
        w.insert_arrow(pa.table({"b": ["p", "q"], "a": pa.array([5, 6], pa.int64())}))
    return loc


# -- creating and opening ---------------------------------------------------------------------


def test_create_open_and_the_same_again(at: Callable[[str], str]) -> None:
    url = at("s")
    assert what_is_at(url).kind is LocationKind.NOTHING
    s = create_stream(url, "id BIGINT, name STRING", partitions=3, order="drop")
    assert what_is_at(url).kind is LocationKind.STREAM
    again = open_stream(url)
    assert isinstance(again, StreamStorage)
    assert again.meta.partitions == 3 and again.meta.defaults == {"order": "drop"}
    assert again.meta.payload_schema.equals(s.meta.payload_schema)
    # the same again (defaults not given, types spelt otherwise): a no-op
    assert create_stream(url, "id bigint, name string", partitions=3).meta.partitions == 3
    assert [s.tail(p).end for p in range(3)] == [0, 0, 0]
    assert s.stream_clock_us() is None
    assert open_stream(url).meta.defaults == {"order": "drop"}


@pytest.mark.parametrize(
    ("kwargs", "error", "says"),
    [
        ({"schema": "a BIGINT"}, SchemaError, "another schema: it has (a INT), not (a BIGINT)"),
        ({"partitions": 3}, OptionError, "with 2 partitions, not 3"),
        ({"order": "reject"}, OptionError, "defaults are fixed"),
    ],
)
def test_creating_a_different_stream_where_one_exists_is_an_error(
    at: Callable[[str], str], kwargs: dict[str, Any], error: type[Exception], says: str
) -> None:
    url = at("s")
    create_stream(url, "a INT", 2, order="drop")
    with open_writer(url, 1) as w:
        w.insert({"a": 1}, rowtime=MS)
    args = {"schema": "a INT", "partitions": 2, **kwargs}
    with pytest.raises(error) as info:
        create_stream(url, args.pop("schema"), args.pop("partitions"), **args)
    assert says in str(info.value)
    s = open_stream(url)  # nothing changed
    assert s.meta.partitions == 2 and s.meta.defaults == {"order": "drop"}
    assert str(s.meta.payload_schema.field("a").type) == "int32"
    assert s.read(1, 0, 1).column("a").to_pylist() == [1]


@pytest.mark.parametrize("name", ["rowtime", "is_bound", "__arrival_us", "__x", "ROWTIME"])
def test_payload_columns_that_clash_with_added_columns_are_refused(
    at: Callable[[str], str], name: str
) -> None:
    url = at("s")
    with pytest.raises(SchemaError) as info:
        create_stream(url, f"a INT, `{name}` INT")
    assert name in str(info.value) and "rename" in str(info.value)
    assert what_is_at(url).kind is LocationKind.NOTHING


@pytest.mark.parametrize("partitions", [0, -1, 1.5, True])
def test_partitions_must_be_a_positive_int(at: Callable[[str], str], partitions: Any) -> None:
    url = at("s")
    with pytest.raises(OptionError, match="partitions"):
        create_stream(url, "a INT", partitions)
    assert what_is_at(url).kind is LocationKind.NOTHING


def test_opening_a_missing_stream_names_the_location_and_how_to_create_one(
    at: Callable[[str], str],
) -> None:
    url = at("nothing-here")
    with pytest.raises(StreamNotFoundError) as info:
        open_stream(url)
    message = str(info.value)
    assert "create_stream(" in message and "rowtime create" in message
    assert url.split("://")[-1].split("?")[0].rsplit("/", 1)[-1] in message
    with pytest.raises(StreamNotFoundError, match="rowtime create"):
        get_rowtime_bound(url)


def test_a_backend_implements_the_storage_interface(at: Callable[[str], str]) -> None:
    url = at("s")
    create_stream(url, "id BIGINT, name STRING", partitions=2)
    stream = open_stream(url)
    assert isinstance(stream, StreamStorage)
    appender = stream.lock_partition(1, "partition 1")
    try:
        assert isinstance(appender, PartitionAppender)
        assert appender.partition == 1
        tail = appender.tail()
        assert (tail.end, tail.clock_us, tail.last_arrival_us) == (0, None, None)
    finally:
        appender.release()


def _kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.node.callspec.params["at"]
    return kind


def _capable(request: pytest.FixtureRequest, stream: Any, capability: type) -> None:
    """Skip the test where the backend lacks ``capability`` (as it declares)."""
    if capability not in STREAM_CAPABILITIES[_kind(request)] | BACKEND_CAPABILITIES[_kind(request)]:
        assert not isinstance(stream, capability)
        pytest.skip(f"{_kind(request)} has no {capability.__name__}")
    assert isinstance(stream, capability)


def test_a_backend_has_exactly_the_capabilities_it_declares(
    at: Callable[[str], str], request: pytest.FixtureRequest
) -> None:
    url = at("s")
    create_stream(url, "id BIGINT")
    stream, backend = open_stream(url), backend_for(url)
    assert isinstance(backend, Backend)
    kind = _kind(request)
    has = {c for c in EVERY_STREAM_CAPABILITY if isinstance(stream, c)}
    assert has == STREAM_CAPABILITIES[kind]
    has = {c for c in EVERY_BACKEND_CAPABILITY if isinstance(backend, c)}
    assert has == BACKEND_CAPABILITIES[kind]


def test_verify_checks_every_stored_batch_and_finds_a_flipped_byte(
    at: Callable[[str], str], request: pytest.FixtureRequest
) -> None:
    url = at("s")
    create_stream(url, "id BIGINT, name STRING")
    _capable(request, open_stream(url), SupportsVerify)
    with open_writer(url, 0) as w:
        w.insert_arrow(pa.table({"id": [1, 2], "name": ["a", "b"]}))
        w.flush()
        w.insert_arrow(pa.table({"id": [3], "name": ["xxxxxxxx"]}))
    stream = open_stream(url)
    assert isinstance(stream, SupportsVerify)
    checked, without = stream.verify(0)
    assert checked >= 2 and without == 0
    unit = flip_stored(url, b"xxxxxxxx")
    fresh = open_stream(url)  # nothing of it read yet (a stream caches what it read)
    assert isinstance(fresh, SupportsVerify)
    with pytest.raises(CorruptLogError, match="checksum") as e:
        fresh.verify(0)
    assert unit in str(e.value)


def test_stored_bytes_grow_with_the_records_a_partition_keeps(
    at: Callable[[str], str], request: pytest.FixtureRequest
) -> None:
    url = at("s")
    create_stream(url, "id BIGINT", 2)
    stream = open_stream(url)
    _capable(request, stream, SupportsStoredBytes)
    assert isinstance(stream, SupportsStoredBytes)
    empty = stream.stored_bytes(0) or 0
    with open_writer(url, 0) as w:
        w.insert_arrow(pa.table({"id": list(range(1000))}))
    first = stream.stored_bytes(0)
    assert first is not None and first > empty + 1000  # 1000 int64 values at the least
    with open_writer(url, 0) as w:
        w.insert_arrow(pa.table({"id": list(range(1000))}))
    again = stream.stored_bytes(0)
    assert again is not None and again > first
    assert (stream.stored_bytes(1) or 0) == empty  # the other partition holds nothing


def test_writer_of_names_the_holder_of_the_lock_without_taking_it(
    at: Callable[[str], str], request: pytest.FixtureRequest
) -> None:
    url = at("s")
    create_stream(url, "id BIGINT", 2)
    stream = open_stream(url)
    _capable(request, stream, SupportsWriterOf)
    assert isinstance(stream, SupportsWriterOf)
    assert stream.writer_of(0) is None
    with open_writer(url, 0) as w:
        holder = stream.writer_of(0)
        assert holder is not None and holder.endswith(f":{os.getpid()}"), holder
        assert stream.writer_of(1) is None
        w.insert({"id": 1})
    assert stream.writer_of(0) is None  # released with the writer
    with open_writer(url, 0) as w:  # looking took nothing: the lock is free to take
        w.insert({"id": 2})


def test_an_entry_source_reads_the_entries_others_append(
    at: Callable[[str], str], request: pytest.FixtureRequest
) -> None:
    url = at("src")
    backend = backend_for(url)
    _capable(request, backend, SupportsEntrySource)
    assert isinstance(backend, SupportsEntrySource)
    server: RedisServer = request.getfixturevalue("redis")
    key = url.rsplit("/", 1)[1]
    client = server.client()
    first = client.xadd(key, {"qty": "1", "ts": "1000"}).decode()
    client.xadd(key, {"qty": "2", "ts": "2000"})
    schema = pa.schema([pa.field("qty", pa.int64())])
    source = backend.entry_source(backend.resolve(url), schema, {}, "ts", {})
    entries = source.read("0-0", 10)
    assert [e[0].decode() for e in entries][:1] == [first] and len(entries) == 2
    assert source.read(first, 10)[0][1][b"qty"] == b"2"  # after a position
    table, bad = source.convert(entries)
    assert table.column("qty").to_pylist() == [1, 2] and bad == []
    assert table.column(LOG_ROWTIME_US).to_pylist() == [1000 * 1000, 2000 * 1000]


# -- appends ----------------------------------------------------------------------------------


def test_records_read_back_in_offset_order_with_system_columns(written: str) -> None:
    stream = open_stream(written)
    assert stream.end_offset(0) == 5
    assert stream.end_offset(1) == 0
    t = stream.read(0, 0, 5)
    assert t.column_names == [LOG_ARRIVAL_US, LOG_ROWTIME_US, LOG_IS_BOUND, "a", "b"]
    assert t.schema.equals(stream.file_schema)
    # arrival: each commit's time (T0 + 2, then T0 + 5 at close)
    assert t.column(LOG_ARRIVAL_US).to_pylist() == [T0 + 2, T0 + 2, T0 + 5, T0 + 5, T0 + 5]
    # implicit rowtimes are the times of insert (T0, then T0 + 4 for the Arrow batch)
    assert t.column(LOG_ROWTIME_US).to_pylist() == [T0, JAN1, JAN2, T0 + 4, T0 + 4]
    assert t.column(LOG_IS_BOUND).to_pylist() == [False, False, True, False, False]
    assert t.column("a").to_pylist() == [1, 2, None, 5, 6]
    assert t.column("b").to_pylist() == ["x", None, None, "p", "q"]


def test_reads_are_column_pruned_and_sliced_across_runs(written: str) -> None:
    stream = open_stream(written)
    t = stream.read(0, 1, 4, columns=[LOG_ROWTIME_US, "b"])
    assert t.column_names == [LOG_ROWTIME_US, "b"]
    assert t.column("b").to_pylist() == [None, None, "p"]
    assert stream.read(0, 3, 3).num_rows == 0
    assert stream.read(0, 2, 3, columns=[LOG_IS_BOUND]).column(0).to_pylist() == [True]
    assert stream.read(1, 0, 0).num_rows == 0


def test_inserted_records_read_back_by_offset(at: Callable[[str], str]) -> None:
    url = at("s")
    create_stream(url, "id BIGINT, name STRING", partitions=2)
    with open_writer(url, 0) as w:
        for i in range(20):
            w.insert({"id": i, "name": f"n{i}"}, rowtime=MS + i)
        w.flush()
        w.insert_arrow(pa.table({"id": list(range(20, 30)), "name": ["x"] * 10}))
        w.end_stream()
    s = open_stream(url)  # a fresh reader, as another process would be
    tail = s.tail(0)
    assert tail.end == 31 and tail.clock_us == END_OF_STREAM_US
    whole = s.read(0, 0, 31)
    assert whole.column("id").to_pylist() == [*range(30), None]
    assert whole.column(LOG_IS_BOUND).to_pylist() == [False] * 30 + [True]
    for lo, hi in [(0, 1), (6, 8), (13, 29), (19, 21), (5, 5)]:
        assert s.read(0, lo, hi, columns=["id"]).column("id").to_pylist() == list(range(lo, hi))
    assert sum(st.count for st in s.partition_stats(0)) == 31
    assert s.partition_stats(0)[0].first == 0


def test_runs_append_as_given_with_their_stats(at: Callable[[str], str]) -> None:
    s = create_stream(at("s"), "id BIGINT, name STRING")
    a = s.lock_partition(0, "p0")
    try:
        st1, t1 = _run(s, 0, None, list(range(20)), T0)
        a.append_run(st1, [t1])
        st2, t2 = _run(s, 20, st1.clock_us, list(range(20, 30)), T0 + 30)
        a.append_run(st2, [t2.slice(0, 4), t2.slice(4)])  # chunks make one run
        assert a.tail().end == 30
    finally:
        a.release()
    fresh = open_stream(s.location)
    tail = fresh.tail(0)
    assert (tail.end, tail.clock_us, tail.last_arrival_us) == (30, T0 + 39, T0 + 39)
    assert fresh.read(0, 0, 30).column("id").to_pylist() == list(range(30))
    assert [st.first for st in fresh.partition_stats(0)] == [0, 20]
    assert fresh.partition_stats(0)[1] == st2


def test_segment_files_are_appended_as_one_unit(at: Callable[[str], str], tmp_path: Path) -> None:
    s = create_stream(at("s"), "id BIGINT")
    st1, t1 = _run(s, 0, None, [0, 1, 2, 3], T0)
    st2, t2 = _run(s, 4, st1.clock_us, [4, 5, 6], T0 + 10)
    paths = [str(tmp_path / "a.arrow"), str(tmp_path / "b.arrow")]
    for path, st, t in zip(paths, (st1, st2), (t1, t2), strict=True):
        write_segment_file(path, st, s.file_schema, [t])
    # a file whose bound goes below the clock: nothing of the list is committed
    low, bad = _run(s, 7, st2.clock_us, [None], T0 + 20, bound=True, rowtime_us=T0)
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


def test_read_stream_returns_every_record_with_friendly_columns(written: str) -> None:
    t = read_stream(written)
    assert t.column_names == ["partition", "offset", "arrival", "rowtime", "is_bound", "a", "b"]
    assert t.schema.field("arrival").type == pa.timestamp("us", tz="UTC")
    assert t.column("offset").to_pylist() == [0, 1, 2, 3, 4]
    assert t.column("partition").to_pylist() == [0] * 5
    rows = t.to_pylist()
    assert rows[0]["rowtime"] == rows[0]["arrival"] - dt.timedelta(microseconds=2)
    assert rows[1]["rowtime"] == dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    assert rows[2]["is_bound"] and rows[2]["a"] is None


def test_read_stream_of_an_empty_stream_is_an_empty_table(at: Callable[[str], str]) -> None:
    url = at("s")
    create_stream(url, "a INT")
    t = read_stream(url)
    assert t.num_rows == 0 and "a" in t.column_names


# -- atomic visibility ------------------------------------------------------------------------


def test_a_reader_sees_each_flush_as_it_is_committed(at: Callable[[str], str]) -> None:
    url = at("s")
    create_stream(url, "id BIGINT")
    reader = open_stream(url)
    with open_writer(url, 0) as w:
        for n in range(1, 4):
            w.insert({"id": n}, rowtime=MS + n)
            assert reader.end_offset(0) == n - 1  # buffered: not visible
            w.flush()
            assert reader.end_offset(0) == n
            assert reader.read(0, n - 1, n).column("id").to_pylist() == [n]


def test_committed_records_never_change(at: Callable[[str], str]) -> None:
    url = at("s")
    create_stream(url, "id BIGINT")
    reader = open_stream(url)
    with open_writer(url, 0) as w:
        w.insert_arrow(pa.table({"id": list(range(10))}))
    first = reader.read(0, 0, 10)
    with open_writer(url, 0) as w:  # more appends, by another writer
        for i in range(10, 40):
            w.insert({"id": i})
            if i % 7 == 0:
                w.flush()
    assert reader.read(0, 0, 10).equals(first)
    assert open_stream(url).read(0, 0, 10).equals(first)
    assert reader.read(0, 0, 40).column("id").to_pylist() == list(range(40))


def test_a_refused_run_commits_nothing(at: Callable[[str], str]) -> None:
    s = create_stream(at("s"), "id BIGINT")
    a = s.lock_partition(0, "p0")
    try:
        st, t = _run(s, 0, None, [0, 1, 2], T0)
        a.append_run(st, [t])
        wrong, t2 = _run(s, 7, st.clock_us, [7, 8], T0 + 5)  # does not continue at 3
        with pytest.raises(CorruptLogError, match="ends at 3"):
            a.append_run(wrong, [t2])
        assert s.end_offset(0) == 3 and a.tail().end == 3
        ok, t3 = _run(s, 3, st.clock_us, [3, 4], T0 + 5)
        a.append_run(ok, [t3])
    finally:
        a.release()
    assert open_stream(s.location).read(0, 0, 5).column("id").to_pylist() == list(range(5))


# -- one appender -----------------------------------------------------------------------------


def test_one_writer_per_partition(at: Callable[[str], str]) -> None:
    url = at("s")
    s = create_stream(url, "id BIGINT", partitions=2)
    a = s.lock_partition(0, "partition 0")
    with pytest.raises(WriterLockedError, match="another writer"):
        s.lock_partition(0, "partition 0")
    with pytest.raises(WriterLockedError):
        open_writer(url, 0)
    other = s.lock_partition(1, "partition 1")  # other partitions are free
    other.release()
    a.release()
    a.release()  # idempotent
    with open_writer(url, 0) as w:  # released: the next writer goes on
        w.insert({"id": 1}, rowtime=MS)
    assert open_stream(url).end_offset(0) == 1


def test_concurrent_appenders_never_interleave(at: Callable[[str], str]) -> None:
    s = create_stream(at("s"), "id BIGINT, name STRING")
    results: list[str] = []

    def writer(k: int) -> None:
        try:
            a = s.lock_partition(0, "p0")
        except WriterLockedError:
            results.append("locked")
            return
        try:
            tail = a.tail()
            stats, t = _run(
                s, tail.end, tail.clock_us, list(range(k * 1000, k * 1000 + 100)), T0 + tail.end
            )
            a.append_run(stats, [t])
            results.append("wrote")
        finally:
            a.release()

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wrote = results.count("wrote")
    assert wrote >= 1 and len(results) == 4
    ids = s.read(0, 0, s.end_offset(0)).column("id").to_pylist()
    assert len(ids) == 100 * wrote
    for i in range(wrote):  # each run whole, in one piece
        block = ids[i * 100 : (i + 1) * 100]
        assert block == list(range(block[0], block[0] + 100))


def test_a_writer_goes_on_where_the_last_one_stopped(at: Callable[[str], str]) -> None:
    url = at("s")
    create_stream(url, "id BIGINT")
    for k in range(3):
        with open_writer(url, 0) as w:
            assert w.clock_us == (None if k == 0 else T0 + (k * 10 - 1) * 1000)
            ids = list(range(k * 10, k * 10 + 10))
            w.insert_arrow(pa.table({"id": ids, "t": [MS + i for i in ids]}), rowtime_column="t")
    s = open_stream(url)
    assert s.read(0, 0, 30).column("id").to_pylist() == list(range(30))
    assert s.clock_us(0) == T0 + 29_000


# -- clocks -----------------------------------------------------------------------------------


def test_partition_clock_is_highest_bound_or_rowtime_and_stream_clock_the_minimum(
    written: str,
) -> None:
    stream = open_stream(written)
    # Rows after the bound arrived at T0+3 (2023): below the bound, so the clock stays.
    assert stream.clock_us(0) == JAN2
    assert stream.clock_us(1) is None
    assert stream.stream_clock_us() is None  # an empty partition holds the stream at None
    assert get_rowtime_bound(written) is None
    with open_writer(written, 1, clock=FakeClock(T0 + 10)) as w:
        w.insert({"a": 9})
    assert stream.stream_clock_us() == T0 + 10
    bound = get_rowtime_bound(written)
    assert bound == dt.datetime(2023, 11, 14, 22, 13, 20, 10, tzinfo=dt.timezone.utc)
    assert bound.tzinfo is not None


def test_implicit_rows_move_the_clock_by_arrival_time(at: Callable[[str], str]) -> None:
    url = at("s")
    create_stream(url, "a INT")
    with open_writer(url, clock=FakeClock(T0, step=1000)) as w:
        w.insert({"a": 1})
        w.insert({"a": 2})
    assert open_stream(url).clock_us(0) == T0 + 1000


def test_end_of_stream_sets_the_clock_to_sparks_max_timestamp(at: Callable[[str], str]) -> None:
    url = at("s")
    create_stream(url, "a INT")
    with open_writer(url) as w:
        w.end_stream()
    assert open_stream(url).stream_clock_us() == END_OF_STREAM_US
    assert get_rowtime_bound(url) == dt.datetime(
        9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.timezone.utc
    )


def test_the_tail_is_end_clock_and_last_arrival_of_one_look(at: Callable[[str], str]) -> None:
    s = create_stream(at("s"), "id BIGINT, name STRING", partitions=2)
    for p, first_at in [(0, T0), (1, T0 + 100)]:
        a = s.lock_partition(p, f"p{p}")
        stats, t = _run(s, 0, None, [0, 1, 2], first_at)
        a.append_run(stats, [t])
        a.release()
    assert s.stream_clock_us() == T0 + 2
    a = s.lock_partition(0, "p0")
    stats, t = _run(s, 3, T0 + 2, [None], T0 + 3, bound=True, rowtime_us=END_OF_STREAM_US)
    a.append_run(stats, [t])
    a.release()
    tail = s.tail(0)
    assert (tail.end, tail.clock_us, tail.last_arrival_us) == (4, END_OF_STREAM_US, T0 + 3)
    assert s.clock_us(0) == END_OF_STREAM_US
    assert s.stream_clock_us() == T0 + 102


# -- retention and trims ----------------------------------------------------------------------


def _write_seconds(url: str, seconds: range, per_flush: int) -> None:
    with open_writer(url, 0) as w:
        for i, sec in enumerate(seconds):
            w.insert({"k": sec}, rowtime=sec * 1000)
            if (i + 1) % per_flush == 0:
                w.flush()


def _trimmable(url: str) -> SupportsTrim:
    """The stream at ``url``, which keeps a retention (every backend here does)."""
    stream = open_stream(url)
    assert isinstance(stream, SupportsTrim)
    return stream


def test_a_trim_removes_whole_units_keeps_offsets_and_reports_data_loss(
    at: Callable[[str], str],
) -> None:
    url = at("s")
    create_stream(url, "k INT")
    _write_seconds(url, range(40), per_flush=10)
    reader = open_stream(url)
    assert reader.read(0, 0, 5).column("k").to_pylist() == list(range(5))
    stream = _trimmable(url)
    [result] = apply_retention(stream, before_us=25 * S)
    assert (result.before.start, result.after.start) == (0, 20)
    fresh = open_stream(url)
    assert fresh.start_offset(0) == 20 and fresh.end_offset(0) == 40
    assert fresh.read(0, 20, 40).column("k").to_pylist() == list(range(20, 40))
    with pytest.raises(DataLossError, match="first kept offset is 20"):
        fresh.read(0, 0, 25)
    with open_writer(url, 0) as w:  # offsets go on after the trim
        w.insert({"k": 40}, rowtime=40_000)
    assert open_stream(url).read(0, 40, 41).column("k").to_pylist() == [40]
    # a reader that looked before the trim sees what came after it
    assert reader.end_offset(0) == 41 and reader.start_offset(0) == 20
    assert reader.read(0, 39, 41).column("k").to_pylist() == [39, 40]
    assert fresh.trim_state(0).start == 20


def test_a_trim_never_removes_the_last_unit(at: Callable[[str], str]) -> None:
    url = at("s")
    create_stream(url, "k INT")
    _write_seconds(url, range(30), per_flush=10)
    stream = _trimmable(url)
    apply_retention(stream, before_us=10**9 * S)  # everything is old
    fresh = open_stream(url)
    assert 0 < fresh.start_offset(0) < 30 and fresh.end_offset(0) == 30
    assert fresh.read(0, 29, 30).column("k").to_pylist() == [29]
    assert apply_retention(_trimmable(url), before_us=10**9 * S) == []  # nothing more to remove


def test_the_trim_state_holds_the_largest_rowtime_before_the_first_kept_offset(
    at: Callable[[str], str],
) -> None:
    url = at("s")
    create_stream(url, "k INT")
    assert open_stream(url).trim_state(0).start == 0
    _write_seconds(url, range(40), per_flush=10)
    stream = _trimmable(url)
    apply_retention(stream, before_us=25 * S)
    state = open_stream(url).trim_state(0)
    assert state.start == 20
    assert state.row_max_us == 19 * S and state.bound_max_us is None
    assert state.clock_us == 19 * S and state.removed_units == 2


def test_retention_is_set_and_read_back_and_applied(at: Callable[[str], str]) -> None:
    url = at("s")
    create_stream(url, "k INT", retention="15 seconds")
    stream = _trimmable(url)
    assert stream.retention() == Retention(duration_us=15 * S)
    _write_seconds(url, range(40), per_flush=10)
    stream = _trimmable(url)
    apply_retention(stream)  # clock 39 s: rowtime before 24 s may go, by whole units
    assert stream.start_offset(0) == 20
    stream.set_retention(Retention(duration_us=7 * 86_400 * S))
    assert _trimmable(url).retention() == Retention(7 * 86_400 * S)
    stream.set_retention(Retention())
    assert not _trimmable(url).retention().active


# -- sink state -------------------------------------------------------------------------------


def test_the_sink_state_records_the_target_once_and_its_owner(at: Callable[[str], str]) -> None:
    url = at("t")
    store = open_sink_state(url)
    assert store.read_target() is None
    first = store.define_target({"kind": "stream", "n": 1})
    assert first["kind"] == "stream" and first["n"] == 1
    again = open_sink_state(url).define_target({"kind": "stream", "n": 2})
    assert again["n"] == 1  # the first description stays; the caller compares
    assert open_sink_state(url).read_target()["n"] == 1  # type: ignore[index]
    store.claim(None)  # no query id: nothing to claim
    store.claim("q1")
    open_sink_state(url).claim("q1")  # the owner again
    with pytest.raises(OptionError, match="another streaming query") as info:
        open_sink_state(url).claim("q2")
    assert str(info.value) == str(owner_conflict(store.target, "q1", "q2"))


def test_the_manifest_publishes_each_batch_once(at: Callable[[str], str]) -> None:
    store = open_sink_state(at("t"))
    assert store.batches() == [] and store.latest() is None
    assert store.put_entry_once(0, {"batch": 0, "v": "a"})
    assert not store.put_entry_once(0, {"batch": 0, "v": "b"})  # won once
    assert store.entry(0) == {"batch": 0, "v": "a"}
    store.replace_entry(0, {"batch": 0, "v": "c"})
    assert store.entry(0) == {"batch": 0, "v": "c"}
    for b in range(1, 6):
        assert store.put_entry_once(b, {"batch": b})
    assert store.batches() == list(range(6))
    assert store.latest() == {"batch": 5}
    assert store.latest(before=3) == {"batch": 2}
    assert store.entry(9) is None
    store.prune(keep=2)
    assert store.batches() == [4, 5]
    assert store.latest(before=4) is None


def test_staged_runs_are_appended_discarded_and_cleaned(at: Callable[[str], str]) -> None:
    url = at("t")
    s = create_stream(url, "id BIGINT")
    store = open_sink_state(url)
    handles = []
    prev = None
    for i, name in enumerate(["a", "b"]):
        stats, t = _run(s, 3 * i, prev, [3 * i, 3 * i + 1, 3 * i + 2], T0 + 3 * i)
        handle, durable = store.stage_segment(0, name, stats, s.file_schema, [t])
        durable()
        handles.append(handle)
        prev = stats.clock_us
    orphan, _ = store.stage_segment(1, "c", *_staged_args(s))
    assert sorted(store.staged()) == sorted([*handles, orphan])
    assert store.missing_staged(handles) == []
    assert store.open_staged(handles[1]).column("id").to_pylist() == [3, 4, 5]
    with open_writer(url, 0) as w:
        store.append_staged(w, handles)
    assert open_stream(url).read(0, 0, 6).column("id").to_pylist() == list(range(6))
    store.discard_staged(handles[:1])
    assert store.missing_staged(handles) == handles[:1]
    store.discard_staged(handles[:1])  # a missing one is no error
    store.clean_staging(0)
    assert store.staged() == [orphan]
    store.drop_staging(1)
    assert store.staged() == []


def test_a_damaged_staged_run_is_refused_before_it_is_written_again(
    at: Callable[[str], str],
) -> None:
    url = at("t")
    s = create_stream(url, "id BIGINT")
    store = open_sink_state(url)
    marker = 0x5A5A5A5A5A5A5A5A
    stats, t = _run(s, 0, None, [1, marker, 3], T0)
    handle, durable = store.stage_segment(0, "a", stats, s.file_schema, [t])
    durable()
    flip_staged(store, handle, marker.to_bytes(8, "little"))
    # The sink's commit reads a run back to write it again (under fresh checksums) where the
    # run must be merged with others: the damaged one is refused, naming it and its records.
    with pytest.raises(CorruptLogError, match=r"records \[0, 3\).*checksum"):
        store.open_staged(handle)


def _staged_args(s: StreamStorage) -> tuple[SegmentStats, pa.Schema, list[pa.Table]]:
    stats, t = _run(s, 0, None, [9], T0)
    return stats, s.file_schema, [t]


# -- target files -----------------------------------------------------------------------------


def test_target_files_where_the_backend_keeps_files_itself(
    at: Callable[[str], str], request: pytest.FixtureRequest
) -> None:
    """Object storage keeps a Parquet target's files itself (:class:`TargetFiles`); a folder
    (and Redis, which holds no files) leave it to a local folder: no capability."""
    url = at("pq")
    files: Any = target_files(url)
    if request.node.callspec.params["at"] in ("local", "redis"):
        assert files is None
        return
    assert files.location
    out = files.open_output("part-0.parquet.tmp")
    out.write(b"PAR1 bytes")
    files.close_output(out, "part-0.parquet.tmp")
    assert files.exists("part-0.parquet.tmp")
    assert files.publish("part-0.parquet.tmp", "h=1/part-0.parquet")
    assert files.publish("part-0.parquet.tmp", "h=1/part-0.parquet")  # a replayed commit
    assert files.exists("h=1/part-0.parquet")
    assert not files.exists("h=2/part-0.parquet")


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error", "says"),
    [
        ((0, 0, 6), OptionError, "only 5 records are committed"),
        ((0, 3, 2), OptionError, "need 0 <= start <= end"),
        ((0, -1, 2), OptionError, "need 0 <= start <= end"),
        ((2, 0, 0), OptionError, "has 2 partitions, numbered 0 to 1"),
        ((0, 0, 1, ["nope"]), SchemaError, "no column 'nope'"),
        ((0, 0, 1, "a"), SchemaError, "a list of names"),
    ],
)
def test_bad_reads_say_what_is_wrong(
    written: str, args: tuple[Any, ...], error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says.replace("(", r"\(")):
        open_stream(written).read(*args)


def test_a_lock_on_a_partition_that_does_not_exist_is_refused(at: Callable[[str], str]) -> None:
    url = at("s")
    create_stream(url, "a INT", 2)
    with pytest.raises(OptionError, match="numbered 0 to 1"):
        open_writer(url, 2)


# -- damaged values -----------------------------------------------------------------------------


def test_a_flipped_byte_in_a_stored_value_fails_every_read_of_it_naming_the_unit_and_records(
    at: Callable[[str], str], capsys: pytest.CaptureFixture[str]
) -> None:
    url = at("s")
    create_stream(url, "id BIGINT, name STRING", 2)
    for p in range(2):
        with open_writer(url, p) as w:
            w.insert_arrow(pa.table({"id": list(range(3)), "name": ["a", "b", "c"]}))
            w.flush()
            w.insert_arrow(pa.table({"id": list(range(3, 6)), "name": ["xxxxxxxx", "e", "f"]}))
    unit = flip_stored(url, b"xxxxxxxx")

    s = open_stream(url)
    for read in (
        lambda: s.read(0, 0, 6),
        lambda: s.read(0, 4, 5, ["id"]),
        lambda: read_stream(url),
    ):
        with pytest.raises(CorruptLogError) as e:
            read()
        message = str(e.value)
        assert unit in message and "records [3, 6)" in message and "checksum" in message, message
    assert s.read(0, 0, 3).column("name").to_pylist() == ["a", "b", "c"]  # before the damage
    assert s.read(1, 0, 6).column("id").to_pylist() == list(range(6))  # the other partition
    # The planner's read of the times alone reads on: the tasks that read the records check them.
    assert s.read(0, 0, 6, [LOG_IS_BOUND]).num_rows == 6

    assert main(["tail", url, "-n", "6"]) == 2
    out, err = capsys.readouterr()
    assert unit in err and "records [3, 6)" in err and "checksum" in err, err
    assert "xxxxxxxx" not in out.lower()  # nothing of the damaged batch, not even a prefix

"""The Redis Streams storage against a real redis-server (tests/redis_server.py): what only
Redis does (runs over many entries, the lease lock, retries of an applied run, streams written by
others, authentication, TLS, outages, what the planner fetches).

The storage contract every backend keeps is test_storage_contract.py, which runs against
Redis too. A redis-server starts in milliseconds, so these run with the fast tests."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from redis_server import RedisServer, redis_server

from pyspark_rowtime.bounds.errors import (
    CorruptLogError,
    InvalidRowtimeError,
    OptionError,
    SchemaError,
    WriterLockedError,
)
from pyspark_rowtime.streams.columns import LOG_ARRIVAL_US as ARRIVAL
from pyspark_rowtime.streams.columns import LOG_IS_BOUND as IS_BOUND
from pyspark_rowtime.streams.columns import LOG_ROWTIME_US as ROWTIME
from pyspark_rowtime.streams.redis import appender as redis_appender
from pyspark_rowtime.streams.redis import (
    create_redis_stream,
    open_redis_stream,
    register_external,
)
from pyspark_rowtime.streams.redis.location import RedisUnavailableError
from pyspark_rowtime.streams.redis.stream import RedisStream
from pyspark_rowtime.streams.segments import SegmentStats

T0 = 1_700_000_000_000_000  # us
SECRET = "pw-Secret-42"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as s:
        yield s


_names = iter(range(10**6))


@pytest.fixture
def url(server: RedisServer) -> str:
    return server.url(f"s{next(_names)}")


def run(
    stream: RedisStream,
    first: int,
    prev_clock: int | None,
    records: list[tuple[int, int | None, bool, dict[str, Any]]],
) -> tuple[SegmentStats, pa.Table]:
    """A run in the segment format: (arrival, rowtime or None, is_bound, payload) per record."""
    arrival = np.array([r[0] for r in records], dtype=np.int64)
    has_rt = np.array([r[1] is not None for r in records])
    rt = np.array([r[1] or 0 for r in records], dtype=np.int64)
    bound = np.array([r[2] for r in records])
    stats = SegmentStats.compute(first, arrival, rt, has_rt, bound, prev_clock)
    cols = {
        ARRIVAL: pa.array(arrival),
        ROWTIME: pa.array([r[1] for r in records], type=pa.int64()),
        IS_BOUND: pa.array(bound),
    }
    for f in stream.meta.payload_schema:
        cols[f.name] = pa.array([r[3].get(f.name) for r in records], type=f.type)
    return stats, pa.Table.from_pydict(cols, schema=stream.file_schema)


def rows(
    n: int, start: int = 0, at: int = T0
) -> list[tuple[int, int | None, bool, dict[str, Any]]]:
    return [(at + i, at + i, False, {"id": start + i, "name": f"n{start + i}"}) for i in range(n)]


def test_runs_read_back_by_offset_across_entries(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_appender, "ENTRY_MAX_ROWS", 7)  # many entries per run
    s = create_redis_stream(url, "id BIGINT, name STRING")
    a = s.lock_partition(0, "p0")
    try:
        stats1, t1 = run(s, 0, None, rows(20))
        a.append_run(stats1, [t1])
        bound = (T0 + 30, T0 + 25, True, {})
        stats2, t2 = run(s, 20, stats1.clock_us, [*rows(10, 20, T0 + 30), bound])
        a.append_run(stats2, [t2.slice(0, 4), t2.slice(4)])  # chunks make one run
    finally:
        a.release()
    s2 = open_redis_stream(url)  # a fresh reader (another process would be the same)
    tail = s2.tail(0)
    assert (tail.end, tail.clock_us, tail.last_arrival_us) == (31, T0 + 39, T0 + 30)
    whole = s2.read(0, 0, 31)
    assert whole.column("id").to_pylist() == [*range(30), None]
    assert whole.column(IS_BOUND).to_pylist() == [False] * 30 + [True]
    assert whole.schema.equals(s2.file_schema)
    for lo, hi in [(0, 1), (6, 8), (13, 29), (30, 31), (5, 5)]:
        assert s2.read(0, lo, hi, columns=["id"]).column("id").to_pylist() == [
            *range(lo, min(hi, 30)),
            *([None] if hi == 31 and lo < 31 else []),
        ]
    assert [st.first for st in s2.partition_stats(0)] == [0, 20]
    assert s2.partition_stats(0)[1] == stats2
    with pytest.raises(OptionError, match="only 31 records are committed"):
        s2.read(0, 0, 32)
    with pytest.raises(SchemaError, match="no column"):
        s2.read(0, 0, 1, columns=["nope"])
    with pytest.raises(OptionError, match="numbered 0 to 0"):
        s2.read(1, 0, 1)


def test_lease_expires_when_the_holder_stops_renewing(url: str) -> None:
    s = create_redis_stream(url, "id BIGINT, name STRING")
    a = s.lock_partition(0, "p0", lease_s=0.2)
    a._stop.set()  # as if the holder's process had died: no more renewals
    time.sleep(0.05)
    with pytest.raises(WriterLockedError, match="lease ends within"):
        s.lock_partition(0, "p0")
    deadline = time.monotonic() + 5
    while True:
        try:
            b = s.lock_partition(0, "p0")
            break
        except WriterLockedError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    # The old holder is fenced off: its append is refused and nothing is written.
    stats, t = run(s, 0, None, rows(2))
    with pytest.raises(WriterLockedError, match="no longer holds"):
        a.append_run(stats, [t])
    assert s.end_offset(0) == 0
    b.append_run(stats, [t])
    assert s.end_offset(0) == 2
    b.release()


def test_a_held_lease_is_renewed(url: str) -> None:
    s = create_redis_stream(url, "id BIGINT, name STRING")
    # Renewed every lease/4: a lease long enough that a loaded machine still renews in time.
    a = s.lock_partition(0, "p0", lease_s=0.8)
    time.sleep(2.4)  # three leases: only renewal keeps it
    stats, t = run(s, 0, None, rows(1))
    a.append_run(stats, [t])
    with pytest.raises(WriterLockedError):
        s.lock_partition(0, "p0")
    a.release()


def test_retry_of_an_applied_run_appends_nothing_twice(url: str) -> None:
    s = create_redis_stream(url, "id BIGINT, name STRING")
    a = s.lock_partition(0, "p0")
    stats, t = run(s, 0, None, rows(5))
    a.append_run(stats, [t])
    a.append_run(stats, [t])  # as after a reply lost in a disconnect: the same run again
    assert s.end_offset(0) == 5
    assert s.read(0, 0, 5).column("id").to_pylist() == list(range(5))
    a.release()
    b = s.lock_partition(0, "p0")
    with pytest.raises(CorruptLogError, match="ends at 5"):
        b.append_run(stats, [t])  # another writer's stale offsets are refused, not appended
    b.release()


# -- streams written by others ----------------------------------------------------------------


def test_external_stream_maps_fields_and_takes_id_time(server: RedisServer) -> None:
    r = server.client()
    key = f"ext{next(_names)}"
    ids = [
        r.xadd(key, {"sym": "ORCL", "px": "10.5", "qty": "3", "ok": "true"}),
        r.xadd(key, {"sym": "MSFT", "px": "11", "ok": "0"}),  # qty missing: null
    ]
    s = register_external(
        server.url(f"x{next(_names)}"),
        "symbol STRING, px DOUBLE, qty INT, ok BOOLEAN",
        [key],
        fields={"symbol": "sym"},
    )
    assert s.end_offset(0) == 2
    t = s.read(0, 0, 2)
    assert t.column("symbol").to_pylist() == ["ORCL", "MSFT"]
    assert t.column("px").to_pylist() == [10.5, 11.0]
    assert t.column("qty").to_pylist() == [3, None]
    assert t.column("ok").to_pylist() == [True, False]
    id_us = [int(i.decode().split("-")[0]) * 1000 for i in ids]
    assert t.column(ARRIVAL).to_pylist() == id_us
    assert t.column(ROWTIME).null_count == 2  # implicit: the entry ID's time
    assert s.clock_us(0) == id_us[-1]
    r.xadd(key, {"sym": "IBM", "px": "1"})
    assert s.end_offset(0) == 3  # new entries are indexed when the end is asked for
    assert open_redis_stream(s.loc).read(0, 2, 3).column("symbol").to_pylist() == ["IBM"]


@pytest.mark.parametrize(
    "raw, defaults, expected",
    [
        ("2024-01-01T00:00:00Z", {}, 1_704_067_200_000_000),
        ("2024/01/01 00:00:00:5", {}, 1_704_067_200_500_000),
        ("1704067200000", {}, 1_704_067_200_000_000),
        ("1704067200", {"rowtime_unit": "s"}, 1_704_067_200_000_000),
        ("1704067200.25", {"rowtime_unit": "s"}, 1_704_067_200_250_000),
        ("01.01.2024 01:00", {"rowtime_format": "dd.MM.yyyy HH:mm", "rowtime_timezone": "+01:00"},
         1_704_067_200_000_000),
    ],
)  # fmt: skip
def test_external_rowtime_from_a_field(
    server: RedisServer, raw: str, defaults: dict[str, str], expected: int
) -> None:
    r = server.client()
    key = f"ext{next(_names)}"
    r.xadd(key, {"v": "1", "ts": raw})
    s = register_external(
        server.url(f"x{next(_names)}"), "v INT", [key], rowtime_field="ts", **defaults
    )
    t = s.read(0, 0, s.end_offset(0))
    assert t.column(ROWTIME).to_pylist() == [expected]
    assert s.clock_us(0) == expected


def test_external_bad_entries_are_named_counted_and_kept(server: RedisServer) -> None:
    r = server.client()
    key = f"ext{next(_names)}"
    good1 = r.xadd(key, {"v": "1", "ts": "2024-01-01T00:00:00Z"})
    bad1 = r.xadd(key, {"v": "x", "ts": "2024-01-01T00:00:01Z"}).decode()
    bad2 = r.xadd(key, {"v": "2", "ts": "yesterday"}).decode()
    r.xadd(key, {"v": "3", "ts": "2024-01-01T00:00:02Z"})
    s = register_external(server.url(f"x{next(_names)}"), "v INT", [key], rowtime_field="ts")
    assert s.end_offset(0) == 2
    assert s.read(0, 0, 2).column("v").to_pylist() == [1, 3]
    bad = s.bad_entries(0)
    assert [b.entry_id for b in bad] == [bad1, bad2]
    assert all(b.key == key for b in bad)
    assert "'x'" in bad[0].reason and "yesterday" in bad[1].reason
    assert key in str(bad[0]) and bad1 in str(bad[0])
    assert r.xlen(key) == 4 and r.xrange(key, good1, good1)  # the source is never changed


def test_external_bad_entry_fails_under_reject(server: RedisServer) -> None:
    r = server.client()
    key = f"ext{next(_names)}"
    r.xadd(key, {"v": "1"})
    eid = r.xadd(key, {"v": "one"}).decode()
    s = register_external(server.url(f"x{next(_names)}"), "v INT", [key], order="reject")
    with pytest.raises(InvalidRowtimeError) as info:
        s.end_offset(0)
    assert key in str(info.value) and eid in str(info.value)


def test_external_trimmed_source_is_an_error_not_a_gap(server: RedisServer) -> None:
    r = server.client()
    key = f"ext{next(_names)}"
    for i in range(5):
        r.xadd(key, {"v": str(i)})
    s = register_external(server.url(f"x{next(_names)}"), "v INT", [key])
    assert s.end_offset(0) == 5
    r.xtrim(key, maxlen=2, approximate=False)
    with pytest.raises(CorruptLogError, match="trimmed"):
        open_redis_stream(s.loc).read(0, 0, 5)


def test_external_rejects_non_stream_keys_and_unknown_fields(server: RedisServer) -> None:
    r = server.client()
    r.set("plain-string", "x")
    with pytest.raises(OptionError, match="not a stream"):
        register_external(server.url(f"x{next(_names)}"), "v INT", ["plain-string"])
    with pytest.raises(SchemaError, match="not columns"):
        register_external(server.url(f"x{next(_names)}"), "v INT", ["k"], fields={"w": "v"})
    with pytest.raises(OptionError, match=r"appends? to its source"):
        register_external(server.url(f"x{next(_names)}"), "v INT", ["k"]).lock_partition(0, "p")


# -- production settings ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(
        tmp_path_factory.mktemp("redis-auth"),
        password=SECRET,
        user="ingest",
        user_password=SECRET + "-u",
    ) as s:
        yield s


def test_password_and_acl_user_work(secured: RedisServer) -> None:
    name = f"a{next(_names)}"
    s = create_redis_stream(secured.url(name), "id BIGINT, name STRING")
    a = s.lock_partition(0, "p0")
    stats, t = run(s, 0, None, rows(2))
    a.append_run(stats, [t])
    a.release()
    by_user = open_redis_stream(secured.url(name, as_user=True))
    assert by_user.read(0, 0, 2).column("id").to_pylist() == [0, 1]
    for text in (repr(by_user), by_user.location, str(by_user.loc)):
        assert SECRET not in text


@pytest.mark.parametrize("as_user", [False, True])
def test_wrong_password_is_clear_and_secret_free(secured: RedisServer, as_user: bool) -> None:
    good = secured.url(f"a{next(_names)}", as_user=as_user)
    wrong = good.replace(SECRET, "Wrong-" + SECRET)
    with pytest.raises(OptionError) as info:
        open_redis_stream(wrong)
    assert "credentials" in str(info.value) or "refused" in str(info.value)
    assert SECRET not in str(info.value)
    with pytest.raises(OptionError) as info2:
        open_redis_stream(re.sub(r":[^:@/]*@", "@", good))  # no password at all
    assert SECRET not in str(info2.value)


def test_server_away_gives_a_clear_error_after_retries(tmp_path: Path) -> None:
    with redis_server(tmp_path) as srv:
        url = srv.url("gone") + "?connect_timeout=100ms&socket_timeout=200ms&retries=2&backoff=10ms"
        s = create_redis_stream(url, "id BIGINT, name STRING")
        a = s.lock_partition(0, "p0")
        stats, t = run(s, 0, None, rows(3))
        a.append_run(stats, [t])
        srv.kill()
        began = time.monotonic()
        stats2, t2 = run(s, 3, stats.clock_us, rows(3, 3, T0 + 10))
        with pytest.raises(RedisUnavailableError, match=r"did not answer.*2 retries"):
            a.append_run(stats2, [t2])
        assert time.monotonic() - began < 10
        with pytest.raises(RedisUnavailableError):
            s.end_offset(0)


def test_acknowledged_runs_survive_a_server_restart(tmp_path: Path) -> None:
    with redis_server(tmp_path, appendonly=True) as srv:
        url = srv.url("durable") + "?retries=20&backoff=20ms&backoff_cap=200ms"
        s = create_redis_stream(url, "id BIGINT, name STRING")
        a = s.lock_partition(0, "p0", lease_s=30)
        stats, t = run(s, 0, None, rows(50))
        a.append_run(stats, [t])
        srv.kill()  # a crash: appendfsync always kept every acknowledged run
        srv.restart()
        stats2, t2 = run(s, 50, stats.clock_us, rows(50, 50, T0 + 100))
        a.append_run(stats2, [t2])  # the same writer goes on after reconnecting
        a.release()
        ids = open_redis_stream(url).read(0, 0, 100).column("id")
        assert ids.to_pylist() == list(range(100))
        assert pc.min(ids).as_py() == 0


# -- the storage seam -------------------------------------------------------------------------


def test_tls_with_a_checked_certificate(tmp_path: Path) -> None:
    import shutil

    if shutil.which("openssl") is None or shutil.which("redis-server") is None:
        pytest.skip("TLS test needs openssl and redis-server (Debian packages)")
    with redis_server(tmp_path, tls=True, password=SECRET) as srv:
        url = srv.url("secure")
        assert url.startswith("rediss://")
        s = create_redis_stream(url, "id BIGINT, name STRING")
        a = s.lock_partition(0, "p0")
        stats, t = run(s, 0, None, rows(3))
        a.append_run(stats, [t])
        a.release()
        assert open_redis_stream(url).read(0, 0, 3).column("id").to_pylist() == [0, 1, 2]
        # Without the CA the server's certificate cannot be checked: refused, not ignored.
        unchecked = url.split("?")[0] + "?retries=0&connect_timeout=1s&socket_timeout=1s"
        with pytest.raises(RedisUnavailableError) as info:
            open_redis_stream(unchecked)
        assert "certificate" in str(info.value).lower() and SECRET not in str(info.value)
        # A plain redis:// client gets nowhere on a TLS-only port.
        plain = unchecked.replace("rediss://", "redis://")
        with pytest.raises(RedisUnavailableError):
            open_redis_stream(plain)


# -- the driver plans from record times, not payloads -----------------------------------------


def _bytes_sent(server: RedisServer) -> int:
    return int(server.client().info("stats")["total_net_output_bytes"])


def test_the_planner_reads_record_times_not_payloads(server: RedisServer) -> None:
    """What the reader's planner (the Spark driver) fetches from Redis to plan a step over wide
    rows: the ``tm`` hash (system columns, 17 bytes a record), not the entries' payload; the
    executors' read of the same records fetches the payload."""
    from pyspark_rowtime.api import open_writer
    from pyspark_rowtime.bounds.plan import StreamPosition
    from pyspark_rowtime.bounds.time import from_rowtime_us
    from pyspark_rowtime.datasource.options import parse_reader_options
    from pyspark_rowtime.datasource.reader import Planner

    url = server.url(f"wide{next(_names)}")
    create_redis_stream(url, "id BIGINT, note STRING")
    n = 20_000

    with open_writer(url) as w:
        w.insert_arrow(pa.table({"id": pa.array(range(n), pa.int64()), "note": ["x" * 200] * n}))
        w.flush()
        w.set_rowtime_bound(from_rowtime_us(w.clock_us))
    planner = Planner(parse_reader_options({"path": url}))
    before = _bytes_sent(server)
    pos = planner.plan(StreamPosition.start([0]), planner.available(), None)
    planned = _bytes_sent(server) - before
    assert pos is not None and pos.partitions[0].next == n + 1  # every record planned
    before = _bytes_sent(server)
    whole = open_redis_stream(url).read(0, 0, n + 1)  # what an executor reads
    executor = _bytes_sent(server) - before
    assert whole.num_rows == n + 1
    assert planned < 30 * (n + 1)  # about 17 bytes a record, plus the index and tails
    assert executor > 200 * n  # the payload


def _without_checksums(blob: bytes) -> bytes:
    """An entry's Arrow IPC stream as 0.2.0 wrote it: the same batches, no custom metadata."""
    table = pa.ipc.open_stream(pa.py_buffer(blob)).read_all()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_entries_written_before_checksums_read_as_before(url: str) -> None:
    s = create_redis_stream(url, "id BIGINT, name STRING")
    a = s.lock_partition(0, "p0")
    try:
        stats, table = run(s, 0, None, rows(5))
        a.append_run(stats, [table])
    finally:
        a.release()
    client, key = s.conn.client, s.source(0)
    entries = client.xrange(key)
    assert b"rowtime.checksum" in entries[0][1][b"a"]  # written with them now
    client.delete(key)
    for eid, fields in entries:
        client.xadd(key, {**fields, b"a": _without_checksums(fields[b"a"])}, id=eid)
    times = s.key("tm", 0)
    for field, blob in client.hgetall(times).items():
        client.hset(times, field, _without_checksums(blob))
    fresh = open_redis_stream(url)
    assert fresh.read(0, 0, 5).column("id").to_pylist() == list(range(5))
    assert fresh.read(0, 0, 5, [ARRIVAL]).num_rows == 5


def test_damaged_record_times_fail_the_planners_read_naming_the_entry(url: str) -> None:
    s = create_redis_stream(url, "id BIGINT, name STRING")
    a = s.lock_partition(0, "p0")
    try:
        stats, table = run(s, 0, None, rows(5))
        a.append_run(stats, [table])
    finally:
        a.release()
    client, times = s.conn.client, s.key("tm", 0)
    [(field, blob)] = client.hgetall(times).items()
    # a bit of the last record's arrival (T0 + 4, little-endian): another time, as valid
    at = blob.index((T0 + 4).to_bytes(8, "little"))
    client.hset(times, field, blob[:at] + bytes([blob[at] ^ 0x01]) + blob[at + 1 :])
    with pytest.raises(CorruptLogError, match=rf"entry {field.decode()} .*records \[0, 5\)"):
        open_redis_stream(url).read(0, 0, 5, [ARRIVAL])
    assert open_redis_stream(url).read(0, 0, 5).column("id").to_pylist() == list(range(5))

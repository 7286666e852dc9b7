"""Rowtime streams on Redis Streams.

Keys of the stream ``name`` (all share the hash tag ``{rowtime:name}``, so on Redis Cluster one
stream lives in one slot and one Lua script may touch all of its keys)::

    {rowtime:name}:meta          HASH  meta: the stream's metadata, the same JSON document as
                                       the embedded log's _stream.json; external: how a stream
                                       written by others maps to it (absent for own streams)
    {rowtime:name}:p:<n>         STREAM  partition n's records (own streams)
    {rowtime:name}:i:<n>         ZSET  partition n's offset index: score = first offset of an
                                       entry (or, for external streams, of a run of entries),
                                       member = "first:count:first-id:last-id"
    {rowtime:name}:s:<n>         ZSET  one summary per appended run (score = its first offset,
                                       member = the run's footer statistics as JSON)
    {rowtime:name}:t:<n>         HASH  the partition's tail: end (records), clock (us), arrival
                                       (us, of the last record), run (the last run's id), bad
    {rowtime:name}:tm:<n>        HASH  own streams: entry ID -> the entry's system columns alone
                                       (arrival, rowtime, is_bound) as Arrow IPC, written by the
                                       same script as the entry: what the reader's planner reads
    {rowtime:name}:lock:<n>      STRING the one writer's token, with a lease (SET NX PX)
    {rowtime:name}:trim:<n>      HASH  start: the first kept offset (retention removed the
                                       records before it); state: the policy state there
                                       (streams.retention.TrimState as JSON)
    {rowtime:name}:retention     STRING retention changed by ops (JSON; else the defaults')
    {rowtime:name}:bad:<n>       HASH  external streams: entry id -> why it is bad input

Records and offsets. A partition's records are numbered from 0 (its *offsets*, dense, as in the
embedded log: the reader's planner counts rows by subtracting them). An own stream's entry holds
a run of records as one Arrow IPC stream in field ``a`` (the segment format's columns:
``__arrival_us``, ``__rowtime_us``, ``__is_bound``, then the payload), with its first offset
``f`` and record count ``n``; the index maps an offset to the entry ID that holds it. Entry IDs
are assigned by the server (``XADD *``), so an entry's ID is the server's time when the run was
committed.

The reader's planner (on the Spark driver) needs each record's times, never its payload: a read
of system columns only takes them from ``tm`` (17 bytes a record) instead of the entries, so the
driver plans from entry IDs, offsets and clocks and the executors fetch the payloads themselves
(entries written before ``tm`` existed are read whole, as before). It costs about 17 more bytes
a record in the server's memory; planning 500,000 records of 200-byte rows (load 13) read 8 MB
in 0.09 s from ``tm``, against 114 MB in 2.8 s from the entries.

Why Arrow IPC per entry and not one entry per row with a field per column (``./dev bench log``,
this 2-core machine, 4 columns: id BIGINT, price DOUBLE, qty INT, name STRING): Arrow entries
take ``insert_arrow()`` at 1.8 M rows/s (the embedded log: 2.3 M) and read back at 2.6 M rows/s,
in 56 bytes per row in Redis (17 of them the system columns; 76 with their copy in ``tm``,
measured 2026-11); fields per row, pipelined in
MULTI blocks of 10,000, write 0.02 M rows/s and read (XRANGE + conversion to Arrow) 0.014 M
rows/s, in 50 bytes per row. A hundred times the speed for 12% more memory. Entries are not
compressed (Arrow's lz4/zstd were not measured here).

An external stream (:func:`register_external`) is a Redis stream filled by any client with
``XADD key * field value ...``: one entry is one data row. Its records are numbered as entries
are first indexed (by whoever asks for the partition's end: the reader's driver), in ID order;
an entry's arrival time and implicit rowtime are its ID's time (the server's clock when it was
added, which Redis keeps non-decreasing per key: SPEC 4's ``max(previous, now)``), in whole
milliseconds. An entry that cannot be read as a row of the declared schema is bad input: it takes
no offset, it is named (key and entry ID, and why) in ``{rowtime:name}:bad:<n>`` and counted in
the tail, and the stream's entries themselves are never changed (kept); under the stream's
``order=reject`` the first such entry fails the query instead.

Guarantees, and where Redis differs from the embedded log:

* an append (a run) is one Lua script: atomic (all entries or none) and fenced by the lock
  token, so a writer whose lease was lost cannot append; it is idempotent, so a retry after a
  lost reply does not append twice;
* *durable when the call returns* holds as far as the server's persistence promises it: with
  ``appendonly yes`` and ``appendfsync always`` an acknowledged run survives a server crash;
  with ``everysec`` (Redis' default) up to one second can be lost on a machine crash;
* one writer per partition holds a lease (default 10 s, renewed every ``lease / 4``): when the
  holder's process dies its lock expires after at most the lease, not at once as with flock;
* implicit rowtimes of own streams are the writer's clock (as for the embedded log, in
  microseconds); entry IDs carry the server's time at commit, in milliseconds.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..bounds.bounds import merge_clock
from ..bounds.errors import (
    CorruptLogError,
    InvalidRowtimeError,
    OptionError,
    RowtimeError,
    SchemaError,
    StreamNotFoundError,
    WriterLockedError,
)
from ..bounds.time import to_rowtime_us
from .columns import LOG_ARRIVAL_US as ARRIVAL
from .columns import LOG_ROWTIME_US as ROWTIME
from .columns import LOG_SYSTEM_COLUMNS as SYSTEM_COLUMNS
from .ddl import to_ddl
from .meta import StreamMeta, meta_from_json, meta_to_json, payload_schema, validate_defaults
from .redis_location import RedisLocation, RedisUnavailableError, parse_location, redact
from .retention import Retention, TrimResult, TrimState, Unit, data_loss
from .segments import SegmentStats, check_segment_files, open_segment_file, segment_schema
from .storage import SINK_KIND_STREAM, LocationKind, PartitionTail, check_read

__all__ = [
    "ENTRY_MAX_BYTES",
    "ENTRY_MAX_ROWS",
    "REDIS_BACKEND",
    "BadEntry",
    "RedisAppender",
    "RedisStream",
    "create_redis_stream",
    "open_redis_stream",
    "register_external",
]

#: Records per entry of an own stream, at most. Large entries cost one XRANGE reply each and
#: decode in one Arrow call; the bound keeps one entry well under Redis' 512 MiB bulk limit and
#: lets a reader of a short range skip most of a big run.
ENTRY_MAX_ROWS = 1 << 16
#: Arrow bytes per entry, at most (a run of wide rows is cut earlier than ENTRY_MAX_ROWS).
ENTRY_MAX_BYTES = 8 << 20
#: Entries read per round trip when indexing an external stream.
EXTERNAL_BATCH = 10_000
#: An index member of an external stream covers at most this many entries (a read skips at most
#: that many to reach its first offset).
EXTERNAL_RUN = 4096

DEFAULT_LEASE_S = 10.0

_FORMAT = "1"

_APPEND = """
if redis.call('GET', KEYS[5]) ~= ARGV[1] then
  return redis.error_reply('ROWTIME_LOCK the lock is not held by this writer')
end
local cur = tonumber(redis.call('HGET', KEYS[4], 'end') or '0')
if cur ~= tonumber(ARGV[2]) then
  if redis.call('HGET', KEYS[4], 'run') == ARGV[6] then return 'DUP' end
  return redis.error_reply('ROWTIME_OFFSET ' .. cur)
end
local runs = tonumber(ARGV[7])
for r = 0, runs - 1 do
  redis.call('ZADD', KEYS[3], ARGV[8 + 2 * r], ARGV[9 + 2 * r])
end
local i = 8 + 2 * runs
while i <= #ARGV do
  local id = redis.call('XADD', KEYS[1], '*', 'f', ARGV[i], 'n', ARGV[i + 1], 'a', ARGV[i + 2])
  redis.call('ZADD', KEYS[2], ARGV[i], ARGV[i] .. ':' .. ARGV[i + 1] .. ':' .. id .. ':' .. id)
  redis.call('HSET', KEYS[6], id, ARGV[i + 3])
  i = i + 4
end
redis.call('HSET', KEYS[4], 'end', ARGV[3], 'clock', ARGV[4], 'arrival', ARGV[5], 'run', ARGV[6])
return 'OK'
"""

# External streams: commit what one indexer read, if nobody indexed those entries meanwhile.
# ARGV: expected end, new end, clock, arrival, last id, bad count, n_members, members...,
# stats..., then pairs of (bad entry id, reason).
_INDEX = """
local cur = tonumber(redis.call('HGET', KEYS[3], 'end') or '0')
if cur ~= tonumber(ARGV[1]) then return 0 end
local n = tonumber(ARGV[7])
for i = 1, n do
  local member = ARGV[7 + i]
  local first = string.match(member, '^(%d+):')
  redis.call('ZADD', KEYS[1], first, member)
  redis.call('ZADD', KEYS[2], first, ARGV[7 + n + i])
end
local j = 8 + 2 * n
while j <= #ARGV do
  redis.call('HSET', KEYS[4], ARGV[j], ARGV[j + 1])
  j = j + 2
end
local fields = {'end', ARGV[2], 'last_id', ARGV[5], 'bad', ARGV[6]}
if ARGV[3] ~= '' then
  table.insert(fields, 'clock'); table.insert(fields, ARGV[3])
  table.insert(fields, 'arrival'); table.insert(fields, ARGV[4])
end
redis.call('HSET', KEYS[3], unpack(fields))
return 1
"""

# Retention: drop the index, summaries and times of records below the new first kept offset,
# and their entries (XTRIM MINID: every entry below the first kept one's ID), if no other trim
# moved the first kept offset meanwhile. KEYS: trim, i, s, tm, p. ARGV: expected start, new
# start, new state (JSON), first kept entry ID, then the removed entries' IDs.
_TRIM = """
local cur = redis.call('HGET', KEYS[1], 'start') or '0'
if cur ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'start', ARGV[2], 'state', ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. ARGV[2])
for i = 5, #ARGV do redis.call('HDEL', KEYS[4], ARGV[i]) end
redis.call('XTRIM', KEYS[5], 'MINID', ARGV[4])
return 1
"""

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class ExternalSpec:
    """How a Redis stream written by others maps to the declared schema.

    ``sources``: one Redis stream key per partition; ``fields``: column -> entry field (a column
    missing here reads the field of its own name); ``rowtime_field``: the field holding the
    explicit rowtime (read like ``rowtime=`` in the writer, with the stream's ``rowtime_unit``,
    ``rowtime_format`` and ``rowtime_timezone``; digits are an epoch in the unit), or None for
    the entry ID's time."""

    sources: tuple[str, ...]
    fields: dict[str, str] = field(default_factory=dict)
    rowtime_field: str | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "sources": list(self.sources),
                "fields": self.fields,
                "rowtime_field": self.rowtime_field,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> ExternalSpec:
        doc = json.loads(text)
        return cls(tuple(doc["sources"]), dict(doc.get("fields") or {}), doc.get("rowtime_field"))


@dataclass(frozen=True)
class BadEntry:
    """An entry of an external stream that is not a row of the declared schema."""

    key: str
    entry_id: str
    reason: str

    def __str__(self) -> str:
        return f"entry {self.entry_id} of Redis stream {self.key!r}: {self.reason}"


@dataclass(frozen=True)
class _Piece:
    """One index member: records [first, first + count) are entries first_id..last_id."""

    first: int
    count: int
    first_id: str
    last_id: str

    @property
    def end(self) -> int:
        return self.first + self.count

    @classmethod
    def parse(cls, member: bytes) -> _Piece:
        first, count, first_id, last_id = member.decode().split(":")
        return cls(int(first), int(count), first_id, last_id)


def _id_us(entry_id: str) -> int:
    return int(entry_id.split("-", 1)[0]) * 1000


def _stats_json(stats: SegmentStats) -> str:
    return json.dumps({k: v for k, v in stats.__dict__.items() if v is not None}, sort_keys=True)


def _stats_from_json(text: bytes | str) -> SegmentStats:
    return SegmentStats(**json.loads(text))


def ipc_bytes(table: pa.Table) -> bytes:
    """A table as one Arrow IPC stream (uncompressed)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _ipc_table(blob: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(blob)).read_all()


class _Redis:
    """One location's client and scripts, with redis-py's errors turned into ours (the
    location in messages is always redacted)."""

    def __init__(self, loc: RedisLocation) -> None:
        self.loc = loc
        self.client = loc.connect()
        self.append = self.client.register_script(_APPEND)
        self.index = self.client.register_script(_INDEX)
        self.renew = self.client.register_script(_RENEW)
        self.release = self.client.register_script(_RELEASE)
        self.trim = self.client.register_script(_TRIM)

    def call(self, what: str, fn: Callable[[], Any]) -> Any:
        import redis

        try:
            return fn()
        except redis.AuthenticationError as e:
            raise OptionError(
                f"Redis at {self.loc} refused the credentials while {what}: {redact(str(e))}; "
                "check the user and password of the location"
            ) from None
        except (redis.ConnectionError, redis.TimeoutError) as e:
            raise RedisUnavailableError(
                f"Redis at {self.loc} did not answer while {what}, after {self.loc.retries} "
                f"retries with backoff ({type(e).__name__}: {redact(str(e))}). Nothing of that "
                "step is assumed done; retry when the server is back"
            ) from None
        except redis.ResponseError as e:
            text = redact(str(e))
            if "NOPERM" in text or "NOAUTH" in text or "WRONGPASS" in text:
                raise OptionError(
                    f"Redis at {self.loc} refused {what}: {text}; the location's user needs "
                    "read and write rights on the keys {rowtime:<name>}:* (and on the source "
                    "keys of an external stream)"
                ) from None
            raise


_CLIENTS: dict[RedisLocation, _Redis] = {}
_CLIENTS_LOCK = threading.Lock()


def _connection(loc: RedisLocation) -> _Redis:
    """One client per location and process (redis-py's pool is thread-safe)."""
    with _CLIENTS_LOCK:
        conn = _CLIENTS.get(loc)
        if conn is None or conn.client.connection_pool.pid != os.getpid():
            conn = _CLIENTS[loc] = _Redis(loc)
        return conn


class RedisStream:
    """A stream on Redis opened for reading (and, through :meth:`lock_partition`, for
    appending). Safe to share between threads."""

    def __init__(
        self,
        loc: RedisLocation,
        meta: StreamMeta,
        external: ExternalSpec | None = None,
        *,
        cache_entries: int = 256,
    ) -> None:
        self.loc = loc
        self.location = str(loc)  # redacted: this string reaches errors and describe output
        self.meta = meta
        self.external = external
        self._file_schema = segment_schema(meta.payload_schema)
        self._conn = _connection(loc)
        self._pieces: dict[int, list[_Piece]] = {}
        self._firsts: dict[int, list[int]] = {}
        self._tables: OrderedDict[tuple[int, str], pa.Table] = OrderedDict()
        self._cache_entries = cache_entries
        self._mutex = threading.Lock()

    def __repr__(self) -> str:
        kind = "external " if self.external else ""
        return f"RedisStream({kind}{self.location!r}, partitions={self.meta.partitions})"

    @property
    def file_schema(self) -> pa.Schema:
        return self._file_schema

    # -- keys --

    def _key(self, kind: str, partition: int) -> str:
        return self.loc.key(kind, str(partition))

    def _source(self, partition: int) -> str:
        """The Redis stream key holding the partition's entries."""
        if self.external is not None:
            return self.external.sources[partition]
        return self._key("p", partition)

    def _check_partition(self, partition: int) -> None:
        n = self.meta.partitions
        if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < n:
            raise OptionError(
                f"partition {partition!r} does not exist in stream {self.location}: it has {n} "
                f"partition{'s' if n != 1 else ''}, numbered 0 to {n - 1}"
            )

    # -- tails and clocks --

    def tail(self, partition: int) -> PartitionTail:
        """End, clock and last arrival of ``partition`` from one read of its tail. For an
        external stream, entries added since the last look are indexed first."""
        self._check_partition(partition)
        if self.external is not None:
            self._index_external(partition)
        raw = self._conn.call(
            f"reading the tail of partition {partition} of {self.location}",
            lambda: self._conn.client.hgetall(self._key("t", partition)),
        )
        return _tail(raw)

    def end_offset(self, partition: int) -> int:
        return self.tail(partition).end

    def clock_us(self, partition: int) -> int | None:
        return self.tail(partition).clock_us

    def stream_clock_us(self) -> int | None:
        if self.external is not None:
            return merge_clock(self.clock_us(p) for p in range(self.meta.partitions))
        client = self._conn.client
        pipe = client.pipeline(transaction=False)
        for p in range(self.meta.partitions):
            pipe.hget(self._key("t", p), "clock")
        clocks = self._conn.call(f"reading the clock of {self.location}", pipe.execute)
        return merge_clock(None if c is None else int(c) for c in clocks)

    def partition_stats(self, partition: int) -> list[SegmentStats]:
        self._check_partition(partition)
        members = self._conn.call(
            f"reading the run summaries of partition {partition} of {self.location}",
            lambda: self._conn.client.zrange(self._key("s", partition), 0, -1),
        )
        return [_stats_from_json(m) for m in members]

    # -- retention (streams.retention) --

    def start_offset(self, partition: int) -> int:
        """The first kept offset of ``partition`` (0 until retention or a trim removed some)."""
        self._check_partition(partition)
        raw = self._conn.call(
            f"reading the first kept offset of partition {partition} of {self.location}",
            partial(self._conn.client.hget, self._key("trim", partition), "start"),
        )
        return 0 if raw is None else int(raw)

    def trim_state(self, partition: int) -> TrimState:
        """The partition's trim: its first kept offset and the policy state there."""
        self._check_partition(partition)
        raw = self._conn.call(
            f"reading the trim state of partition {partition} of {self.location}",
            partial(self._conn.client.hget, self._key("trim", partition), "state"),
        )
        if raw is None:
            return TrimState()
        return TrimState.from_json(raw, f"partition {partition} of {self.location}")

    def retention(self) -> Retention:
        """The stream's retention: ops' last change (``{...}:retention``), else the one it
        was created with."""
        raw = self._conn.call(
            f"reading the retention of {self.location}",
            partial(self._conn.client.get, self.loc.key("retention")),
        )
        if raw is None:
            return Retention.of_defaults(self.meta.defaults)
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise CorruptLogError(f"the retention of {self.location} cannot be read: {e}") from e
        return Retention.from_doc(doc, self.location)

    def set_retention(self, retention: Retention) -> None:
        """Change the stream's retention (ops); writers pick it up at their next check."""
        _check_retention(retention, self.location, self.external is not None)
        self._conn.call(
            f"setting the retention of {self.location}",
            partial(
                self._conn.client.set, self.loc.key("retention"), json.dumps(retention.to_doc())
            ),
        )

    def trim_partition(
        self, partition: int, decide: Callable[[list[Unit], TrimState], TrimState | None]
    ) -> TrimResult | None:
        """Remove the head runs ``decide`` lets go (:func:`.retention.choose_trim`): their
        index, summaries, record times and entries (``XTRIM MINID``), and store the new
        :class:`TrimState`, in one script that does nothing if another trim came first.
        A unit here is a run (what one append wrote: one or more entries)."""
        self._check_partition(partition)
        if self.external is not None:
            raise OptionError(
                f"{self.location} is registered over Redis streams that others write: their "
                "entries are theirs to trim, and a reader needs every entry it indexed. "
                "Retention applies to streams written by rowtime writers"
            )
        prev = self.trim_state(partition)
        units = [
            Unit(
                st.first,
                st.count,
                st.rows,
                0,
                st.max_rowtime_us,
                st.last_bound_us,
                st.clock_us,
                last_arrival_us=st.last_arrival_us,
            )
            for st in self.partition_stats(partition)
            if st.end > prev.start
        ]
        new = decide(units, prev)
        if new is None or new.start <= prev.start:
            return None
        client = self._conn.client
        ikey = self._key("i", partition)

        def index() -> tuple[list[bytes], list[bytes]]:
            pipe = client.pipeline(transaction=False)
            pipe.zrangebyscore(ikey, "-inf", f"({new.start}")
            pipe.zrangebyscore(ikey, new.start, "+inf", start=0, num=1)
            gone, kept = pipe.execute()
            return gone, kept

        gone, kept = self._conn.call(f"reading the index of {self.location}", index)
        if not kept:
            return None  # the last run is never removed: the index changed under us
        first_kept = _Piece.parse(kept[0])
        if first_kept.first != new.start:
            if self.start_offset(partition) != prev.start:
                return None  # another trim came first: the next check decides again
            raise CorruptLogError(
                f"partition {partition} of {self.location}: no entry starts at offset "
                f"{new.start}, where a run starts"
            )
        ids = [_Piece.parse(m).first_id for m in gone]
        keys = [self._key(k, partition) for k in ("trim", "i", "s", "tm", "p")]
        args = [str(prev.start), str(new.start), new.to_json(), first_kept.first_id, *ids]
        done = self._conn.call(
            f"trimming partition {partition} of {self.location}",
            partial(self._conn.trim, keys=keys, args=args),
        )
        if not done:
            return None  # another trim came first: the next check decides again
        return TrimResult(partition, prev, new)

    def bad_entries(self, partition: int) -> list[BadEntry]:
        """External streams: the entries of ``partition`` that were not rows (kept in Redis,
        taking no offset), oldest first."""
        self._check_partition(partition)
        if self.external is None:
            return []
        raw = self._conn.call(
            f"reading the bad entries of partition {partition} of {self.location}",
            partial(self._conn.client.hgetall, self._key("bad", partition)),
        )
        key = self._source(partition)
        items = sorted(raw.items(), key=lambda kv: tuple(map(int, kv[0].split(b"-"))))
        return [BadEntry(key, k.decode(), v.decode()) for k, v in items]

    # -- reading --

    def _index(self, partition: int, end: int) -> tuple[list[_Piece], list[int]]:
        """The partition's index, fetched from Redis as far as needed to cover ``end``
        (committed pieces never change: only new ones are fetched)."""
        with self._mutex:
            pieces = self._pieces.setdefault(partition, [])
            firsts = self._firsts.setdefault(partition, [])
            have = pieces[-1].end if pieces else 0
        if have >= end:
            return pieces, firsts
        members = self._conn.call(
            f"reading the index of partition {partition} of {self.location}",
            lambda: self._conn.client.zrangebyscore(self._key("i", partition), have, "+inf"),
        )
        with self._mutex:
            for m in members:
                piece = _Piece.parse(m)
                top = pieces[-1].end if pieces else piece.first  # from the first kept one
                if piece.first == top:
                    pieces.append(piece)
                    firsts.append(piece.first)
                elif piece.first > top:
                    raise CorruptLogError(
                        f"partition {partition} of {self.location} has no index entry for "
                        f"offsets [{top}, {piece.first}): the stream's keys were changed by hand?"
                    )
        return pieces, firsts

    def read(
        self, partition: int, start: int, end: int, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """Records ``[start, end)`` of ``partition`` in offset order (see the embedded log's
        :meth:`~streams.log.Stream.read`: same columns, same rules)."""
        self._check_partition(partition)
        names = check_read(self._file_schema, columns, start, end, self.location)
        if start == end:
            return pa.schema([self._file_schema.field(n) for n in names]).empty_table()
        pieces, firsts = self._index(partition, end)
        if not pieces or pieces[-1].end < end:
            raise OptionError(
                f"cannot read [{start}, {end}) of partition {partition} of {self.location}: only "
                f"{pieces[-1].end if pieces else 0} records are committed"
            )
        if start < pieces[0].first:
            raise data_loss(self.location, partition, start, pieces[0].first)
        i = bisect_right(firsts, start) - 1
        j = bisect_right(firsts, end - 1) - 1
        wanted = pieces[i : j + 1]
        try:
            if self.external is None and set(names) <= set(SYSTEM_COLUMNS):
                tables = self._piece_times(partition, wanted)
            else:
                tables = self._piece_tables(partition, wanted)
        except CorruptLogError:
            kept = self.start_offset(partition)
            if start < kept:  # trimmed since this reader indexed them
                raise data_loss(self.location, partition, start, kept) from None
            raise
        out = []
        for piece, table in zip(wanted, tables, strict=True):
            lo = max(start, piece.first) - piece.first
            hi = min(end, piece.end) - piece.first
            t = table.select(names)
            out.append(t if (lo, hi) == (0, piece.count) else t.slice(lo, hi - lo))
        return out[0] if len(out) == 1 else pa.concat_tables(out)

    def _piece_times(self, partition: int, pieces: list[_Piece]) -> list[pa.Table]:
        """The system columns of each piece: from the cache (of whole entries too), else one
        HMGET of the ``tm`` hash for all missing ones; entries without times there (written
        before it existed) are read whole."""
        found: dict[str, pa.Table] = {}
        with self._mutex:
            for piece in pieces:
                for key in ((partition, piece.first_id), (partition, "tm:" + piece.first_id)):
                    table = self._tables.get(key)
                    if table is not None:
                        self._tables.move_to_end(key)
                        found[piece.first_id] = table
                        break
        missing = [p for p in pieces if p.first_id not in found]
        if missing:
            blobs = self._conn.call(
                f"reading the record times of partition {partition} of {self.location}",
                partial(
                    self._conn.client.hmget,
                    self._key("tm", partition),
                    [p.first_id for p in missing],
                ),
            )
            whole = [p for p, blob in zip(missing, blobs, strict=True) if blob is None]
            tables = self._piece_tables(partition, whole)
            loaded = {p.first_id: t for p, t in zip(whole, tables, strict=True)}
            with self._mutex:
                for piece, blob in zip(missing, blobs, strict=True):
                    if blob is None:
                        found[piece.first_id] = loaded[piece.first_id]
                        continue
                    table = _ipc_table(blob)
                    if table.num_rows != piece.count:
                        raise CorruptLogError(
                            f"the record times of entry {piece.first_id} of partition "
                            f"{partition} of {self.location} hold {table.num_rows} records, its "
                            f"index says {piece.count}"
                        )
                    found[piece.first_id] = table
                    self._tables[(partition, "tm:" + piece.first_id)] = table
                while len(self._tables) > self._cache_entries:
                    self._tables.popitem(last=False)
        return [found[p.first_id] for p in pieces]

    def _piece_tables(self, partition: int, pieces: list[_Piece]) -> list[pa.Table]:
        """The records of each piece, from the cache or one XRANGE for all missing ones."""
        found: dict[str, pa.Table] = {}
        with self._mutex:
            for piece in pieces:
                table = self._tables.get((partition, piece.first_id))
                if table is not None:
                    self._tables.move_to_end((partition, piece.first_id))
                    found[piece.first_id] = table
        missing = [p for p in pieces if p.first_id not in found]
        if missing:
            key = self._source(partition)
            entries = self._conn.call(
                f"reading partition {partition} of {self.location}",
                lambda: self._conn.client.xrange(key, missing[0].first_id, missing[-1].last_id),
            )
            by_id = {eid.decode(): fields for eid, fields in entries}
            loaded = (
                self._external_tables(partition, missing, entries)
                if self.external is not None
                else [self._own_table(partition, p, by_id) for p in missing]
            )
            with self._mutex:
                for piece, table in zip(missing, loaded, strict=True):
                    found[piece.first_id] = table
                    self._tables[(partition, piece.first_id)] = table
                while len(self._tables) > self._cache_entries:
                    self._tables.popitem(last=False)
        return [found[p.first_id] for p in pieces]

    def _own_table(self, partition: int, piece: _Piece, by_id: dict[str, Any]) -> pa.Table:
        fields = by_id.get(piece.first_id)
        where = f"entry {piece.first_id} of partition {partition} of {self.location}"
        if fields is None:
            raise CorruptLogError(
                f"{where} is missing (offsets [{piece.first}, {piece.end})): was the key trimmed "
                "or deleted? The records cannot be read"
            )
        try:
            table = _ipc_table(fields[b"a"])
        except (KeyError, pa.ArrowException) as e:
            raise CorruptLogError(f"{where} cannot be read as Arrow: {e}") from e
        if table.num_rows != piece.count or not table.schema.equals(self._file_schema):
            raise CorruptLogError(
                f"{where} holds {table.num_rows} records of {table.schema}, its index says "
                f"{piece.count} of the stream's columns"
            )
        return table

    def _external_tables(
        self, partition: int, pieces: list[_Piece], entries: list[tuple[bytes, dict[bytes, bytes]]]
    ) -> list[pa.Table]:
        bad = set(
            self._conn.call(
                f"reading the bad entries of partition {partition} of {self.location}",
                partial(self._conn.client.hkeys, self._key("bad", partition)),
            )
        )
        good = [(eid, f) for eid, f in entries if eid not in bad]
        out = []
        pos = 0
        for piece in pieces:
            while pos < len(good) and good[pos][0].decode() != piece.first_id:
                pos += 1
            chunk = good[pos : pos + piece.count]
            if len(chunk) != piece.count or chunk[-1][0].decode() != piece.last_id:
                raise CorruptLogError(
                    f"entries {piece.first_id}..{piece.last_id} of Redis stream "
                    f"{self._source(partition)!r} (offsets [{piece.first}, {piece.end}) of "
                    f"{self.location}) are not all there any more: was the key trimmed "
                    "(XTRIM, MAXLEN)? Records that a reader indexed must be kept"
                )
            table, problems = self._convert(partition, chunk)
            if problems:  # the same entries converted at indexing: they cannot go bad now
                raise CorruptLogError(f"{problems[0]} (it was read as a row before)")
            out.append(table)
            pos += piece.count
        return out

    # -- external streams --

    def _convert(
        self, partition: int, entries: Sequence[tuple[bytes, dict[bytes, bytes]]]
    ) -> tuple[pa.Table, list[BadEntry]]:
        """Entries as records (arrival = ID time), and the entries that are not rows."""
        assert self.external is not None
        spec = self.external
        key = spec.sources[partition]
        defaults = self.meta.defaults
        unit = defaults.get("rowtime_unit", "ms")
        tz = defaults.get("rowtime_timezone", "UTC")
        fmt = defaults.get("rowtime_format")
        schema = self.meta.payload_schema
        columns: list[list[Any]] = [[] for _ in schema]
        arrivals: list[int] = []
        rowtimes: list[int | None] = []
        bad: list[BadEntry] = []
        fnames = [spec.fields.get(f.name, f.name).encode() for f in schema]
        rt_field = spec.rowtime_field.encode() if spec.rowtime_field else None
        for raw_id, fields in entries:
            eid = raw_id.decode()
            try:
                values = [
                    _field_value(fields.get(fname), f, fname)
                    for f, fname in zip(schema, fnames, strict=True)
                ]
                rowtime = None
                if rt_field is not None:
                    raw = fields.get(rt_field)
                    if raw is None:
                        raise InvalidRowtimeError(f"it has no rowtime field {spec.rowtime_field!r}")
                    rowtime = to_rowtime_us(_epoch_or_text(raw), unit=unit, tz=tz, fmt=fmt)
            except (RowtimeError, ValueError, TypeError, pa.ArrowException) as e:
                bad.append(BadEntry(key, eid, str(e)))
                continue
            arrivals.append(_id_us(eid))
            rowtimes.append(rowtime)
            for col, v in zip(columns, values, strict=True):
                col.append(v)
        n = len(arrivals)
        arrays = [
            pa.array(arrivals, type=pa.int64()),
            pa.array(rowtimes, type=pa.int64()),
            pa.array(np.zeros(n, dtype=np.bool_)),
            *(pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)),
        ]
        return pa.Table.from_arrays(arrays, schema=self._file_schema), bad

    def _index_external(self, partition: int) -> None:
        """Give offsets to the entries added to the partition's source since the last look.

        Any number of processes may do this at once: each reads the new entries, converts
        them, and commits the index only if nobody committed since it looked (the script
        compares the end); the loser looks again. Same entries, same result."""
        assert self.external is not None
        conn = self._conn
        key = self._source(partition)
        keys = [self._key(k, partition) for k in ("i", "s", "t", "bad")]
        while True:
            tail = conn.call(
                f"reading the tail of partition {partition} of {self.location}",
                partial(conn.client.hgetall, keys[2]),
            )
            last_id = tail.get(b"last_id", b"0-0").decode()
            entries = conn.call(
                f"reading Redis stream {key!r} of {self.location}",
                partial(conn.client.xrange, key, f"({last_id}", "+", count=EXTERNAL_BATCH),
            )
            if not entries:
                return
            args = self._index_args(partition, tail, entries)
            conn.call(
                f"indexing Redis stream {key!r} of {self.location}",
                partial(conn.index, keys=keys, args=args),
            )

    def _index_args(
        self, partition: int, tail: dict[bytes, bytes], entries: list[Any]
    ) -> list[Any]:
        """The index script's arguments for new ``entries`` after ``tail``: runs of at most
        :data:`EXTERNAL_RUN` consecutive good entries, their statistics, and the bad ones."""
        end = int(tail.get(b"end", 0))
        clock = int(tail[b"clock"]) if b"clock" in tail else None
        table, bad = self._convert(partition, entries)
        if bad and self.meta.defaults.get("order") == "reject":
            raise InvalidRowtimeError(
                f"bad input in {self.location}, partition {partition}: {bad[0]}. The stream's "
                "order is reject, so the query stops here; fix or remove that entry "
                "(or register the stream with another order: bad entries are then counted "
                "and listed, and skipped)"
            )
        bad_ids = {b.entry_id for b in bad}
        runs: list[list[str]] = [[]]
        for raw_id, _ in entries:
            eid = raw_id.decode()
            if eid in bad_ids or len(runs[-1]) == EXTERNAL_RUN:
                runs.append([])
            if eid not in bad_ids:
                runs[-1].append(eid)
        arrival = table.column(ARRIVAL).to_numpy()
        rowtime = table.column(ROWTIME)
        has_rt = rowtime.is_valid().to_numpy(zero_copy_only=False)
        rt = pc.fill_null(rowtime, 0).to_numpy()
        is_bound = np.zeros(len(arrival), dtype=np.bool_)
        members: list[str] = []
        stats: list[str] = []
        first = end
        last_arrival: int | None = None
        for ids in (r for r in runs if r):
            sl = slice(first - end, first - end + len(ids))
            s = SegmentStats.compute(first, arrival[sl], rt[sl], has_rt[sl], is_bound[sl], clock)
            members.append(f"{first}:{len(ids)}:{ids[0]}:{ids[-1]}")
            stats.append(_stats_json(s))
            clock, last_arrival = s.clock_us, s.last_arrival_us
            first += len(ids)
        args: list[Any] = [
            end,
            first,
            "" if clock is None or not members else clock,
            "" if last_arrival is None else last_arrival,
            entries[-1][0].decode(),
            int(tail.get(b"bad", 0)) + len(bad),
            len(members),
            *members,
            *stats,
        ]
        for b in bad:
            args += [b.entry_id, b.reason[:500]]
        return args

    # -- appending --

    def lock_partition(
        self, partition: int, where: str, *, lease_s: float = DEFAULT_LEASE_S
    ) -> RedisAppender:
        self._check_partition(partition)
        if self.external is not None:
            raise OptionError(
                f"{self.location} is a Redis stream written by others (registered with "
                "register_external): append to its source keys with XADD, not with a writer"
            )
        return RedisAppender(self, partition, where, lease_s)


def _one_table(chunks: Sequence[pa.Table | pa.RecordBatch]) -> pa.Table:
    tables = [pa.Table.from_batches([c]) if isinstance(c, pa.RecordBatch) else c for c in chunks]
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def _tail(raw: dict[bytes, bytes]) -> PartitionTail:
    clock = raw.get(b"clock")
    arrival = raw.get(b"arrival")
    return PartitionTail(
        end=int(raw.get(b"end", 0)),
        clock_us=None if clock is None else int(clock),
        last_arrival_us=None if arrival is None else int(arrival),
    )


_NUMBER = frozenset(b"0123456789.-+eE")


def _epoch_or_text(raw: bytes) -> int | Decimal | str:
    """A field's rowtime: digits are an epoch (int, or Decimal with a fraction), else text."""
    text = raw.decode()
    if raw and set(raw) <= _NUMBER and any(48 <= c <= 57 for c in raw):
        try:
            return int(text)
        except ValueError:
            try:
                return Decimal(text)
            except InvalidOperation:
                pass
    return text


_TRUE = {b"true", b"1", b"t", b"yes"}
_FALSE = {b"false", b"0", b"f", b"no"}


def _field_value(raw: bytes | None, f: pa.Field, fname: bytes) -> Any:
    """One entry field as a value of column ``f`` (None when absent); raises ValueError saying
    why not."""
    if raw is None:
        if not f.nullable:
            raise ValueError(f"it has no field {fname.decode()!r} for NOT NULL column {f.name!r}")
        return None
    t = f.type
    types = pa.types
    if types.is_binary(t) or types.is_large_binary(t):
        return raw
    text = raw.decode()
    if types.is_string(t) or types.is_large_string(t):
        return text
    if types.is_boolean(t):
        low = raw.lower()
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise ValueError(f"field {fname.decode()!r} = {text!r} is not a boolean for {f.name!r}")
    try:
        return pc.cast(pa.array([text]), t, safe=True)[0].as_py()
    except (pa.ArrowException, ValueError) as e:
        raise ValueError(
            f"field {fname.decode()!r} = {text[:80]!r} cannot be read as {to_ddl(pa.schema([f]))}"
            f": {e}"
        ) from None


class RedisAppender:
    """The one appender of a partition: holds its lease-based lock (renewed by a daemon thread)
    and appends runs atomically. Use :meth:`RedisStream.lock_partition`."""

    def __init__(self, stream: RedisStream, partition: int, where: str, lease_s: float) -> None:
        self.stream = stream
        self.partition = partition
        self._where = where
        self._conn = stream._conn
        self._lock_key = stream._key("lock", partition)
        self._lease_ms = max(int(lease_s * 1000), 100)
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
        client = self._conn.client
        got = self._conn.call(
            f"locking {where}",
            lambda: client.set(self._lock_key, self.token, nx=True, px=self._lease_ms),
        )
        if not got:
            holder = client.get(self._lock_key)
            who = holder.decode().rsplit(":", 1)[0] if holder else "a writer that just left"
            ttl = client.pttl(self._lock_key)
            raise WriterLockedError(
                f"{where} is being written by another writer (host:pid {who}); one writer per "
                f"partition. Close that writer, or wait: its lease ends within {max(ttl, 0)} ms "
                "if its process died"
            )
        self._lost = False
        self._tail: PartitionTail | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._renew_loop, name=f"rowtime-redis-lease-{partition}", daemon=True
        )
        self._thread.start()

    def _renew_loop(self) -> None:
        period = self._lease_ms / 4000
        while not self._stop.wait(period):
            try:
                if not self._conn.renew(keys=[self._lock_key], args=[self.token, self._lease_ms]):
                    self._lost = True
                    return
            except Exception:
                continue  # the server is away: the next append says so; try again

    def tail(self) -> PartitionTail:
        """The partition's end as this holder sees it (nobody else appends meanwhile)."""
        if self._tail is None:
            self._tail = self.stream.tail(self.partition)
        return self._tail

    def append_run(self, stats: SegmentStats, chunks: Sequence[pa.Table | pa.RecordBatch]) -> None:
        """Commit records ``[stats.first, stats.end)`` as one atomic script (entries of at most
        :data:`ENTRY_MAX_ROWS` rows). A retry of the same run after a lost reply is a no-op."""
        self._append([(stats, _one_table(chunks))])

    def append_segment_files(self, paths: Sequence[str], *, reject: bool, verify: bool) -> None:
        """Check the files (:func:`.segments.check_segment_files`), then commit all their
        records as one atomic script: Redis holds the records, the files stay the caller's."""
        checked = check_segment_files(
            paths,
            self.stream.file_schema,
            self.tail(),
            where=self._where,
            reject=reject,
            verify=verify,
        )
        if checked:
            self._append([(stats, open_segment_file(path)) for path, stats in checked])

    def _append(self, runs: list[tuple[SegmentStats, pa.Table]]) -> None:
        if self._lost:
            raise WriterLockedError(
                f"{self._where}: this writer's lease on the partition expired (was the process "
                "paused, or the server away, longer than the lease?) and another writer may "
                "have taken it; nothing more is written: open a new writer"
            )
        first, last = runs[0][0], runs[-1][0]
        args: list[Any] = [
            self.token,
            first.first,
            last.end,
            last.clock_us,
            last.last_arrival_us,
            f"{self.token}:{first.first}",  # the append's id: the same on every retry
            len(runs),
        ]
        entries: list[Any] = []
        for stats, table in runs:
            table = table.replace_schema_metadata(None)
            n = table.num_rows
            if n != stats.count:
                raise CorruptLogError(f"{self._where}: a run of {n} records with stats {stats}")
            args += [stats.first, _stats_json(stats)]
            per_row = max(table.nbytes // max(n, 1), 1)
            step = max(min(ENTRY_MAX_ROWS, ENTRY_MAX_BYTES // per_row), 1)
            for lo in range(0, n, step):
                piece = table.slice(lo, min(step, n - lo))
                times = ipc_bytes(piece.select(list(SYSTEM_COLUMNS)))
                entries += [stats.first + lo, piece.num_rows, ipc_bytes(piece), times]
        args += entries
        keys = [self.stream._key(k, self.partition) for k in ("p", "i", "s", "t", "lock", "tm")]
        import redis

        try:
            self._conn.call(
                f"appending records [{first.first}, {last.end}) to {self._where}",
                partial(self._conn.append, keys=keys, args=args),
            )
        except redis.ResponseError as e:
            text = str(e)
            if "ROWTIME_LOCK" in text:
                self._lost = True
                raise WriterLockedError(
                    f"{self._where}: this writer no longer holds the partition (its lease "
                    "expired and another writer may have taken it); nothing of this run was "
                    "written: open a new writer"
                ) from None
            if "ROWTIME_OFFSET" in text:
                raise CorruptLogError(
                    f"{self._where}: the partition ends at {text.split()[-1]}, and this writer "
                    f"appends at {first.first}: another process wrote it while this writer held "
                    "its lock; nothing of this run was written"
                ) from None
            raise
        self._tail = PartitionTail(last.end, last.clock_us, last.last_arrival_us)

    def release(self) -> None:
        """Give the partition up (idempotent). A dead process' lock expires after its lease."""
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            self._conn.release(keys=[self._lock_key], args=[self.token])
        except Exception:
            pass  # the lease expires on its own


# -- creating and opening --------------------------------------------------------------------


def _meta_key(loc: RedisLocation) -> str:
    return loc.key("meta")


def _not_found(loc: RedisLocation) -> StreamNotFoundError:
    return StreamNotFoundError(
        f"no rowtime stream at {loc} (no key {_meta_key(loc)} in database {loc.db}). Create one "
        f"with pyspark_rowtime.create_stream({str(loc)!r}, schema), or register a Redis stream "
        "written by others with pyspark_rowtime.streams.redis_log.register_external"
    )


def _as_location(location: str | RedisLocation) -> RedisLocation:
    return location if isinstance(location, RedisLocation) else parse_location(location)


def open_redis_stream(location: str | RedisLocation) -> RedisStream:
    """The stream at ``location`` (``redis://...``); :class:`StreamNotFoundError` if none."""
    loc = _as_location(location)
    conn = _connection(loc)
    raw = conn.call(f"opening {loc}", lambda: conn.client.hgetall(_meta_key(loc)))
    if not raw or b"meta" not in raw:
        raise _not_found(loc)
    if raw.get(b"format", b"") != _FORMAT.encode():
        raise CorruptLogError(
            f"{loc} has format {raw.get(b'format')!r}; this pyspark-rowtime reads format "
            f"{_FORMAT}: upgrade pyspark-rowtime"
        )
    meta = meta_from_json(raw[b"meta"].decode(), str(loc))
    external = ExternalSpec.from_json(raw[b"external"].decode()) if b"external" in raw else None
    return RedisStream(loc, meta, external)


def _create(loc: RedisLocation, meta: StreamMeta, external: ExternalSpec | None) -> RedisStream:
    conn = _connection(loc)
    doc = {"meta": meta_to_json(meta), "format": _FORMAT}
    if external is not None:
        doc["external"] = external.to_json()
    key = _meta_key(loc)

    def create() -> bool:
        # HSETNX on one field first: of two creators, exactly one writes the document.
        if not conn.client.hsetnx(key, "meta", doc["meta"]):
            return False
        conn.client.hset(key, mapping=doc)
        return True

    if conn.call(f"creating {loc}", create):
        return RedisStream(loc, meta, external)
    existing = open_redis_stream(loc)
    _check_same(existing, meta, external)
    return existing


def create_redis_stream(
    location: str | RedisLocation,
    schema: str | pa.Schema,
    partitions: int = 1,
    **defaults: Any,
) -> RedisStream:
    """Create a stream on Redis (or open the identical one); the rules of
    :func:`streams.log.create_stream`."""
    loc = _as_location(location)
    payload = payload_schema(schema)
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise OptionError(f"partitions={partitions!r} must be a whole number >= 1")
    meta = StreamMeta(str(loc), payload, partitions, validate_defaults(defaults, payload))
    _check_retention(Retention.of_defaults(meta.defaults), str(loc), external=False)
    stream = _create(loc, meta, None)
    if defaults and stream.meta.defaults != meta.defaults:
        raise OptionError(
            f"a stream already exists at {loc} with defaults {stream.meta.defaults}, not "
            f"{meta.defaults}; the defaults are fixed when a stream is created"
        )
    return stream


def register_external(
    location: str | RedisLocation,
    schema: str | pa.Schema,
    sources: Sequence[str],
    *,
    rowtime_field: str | None = None,
    fields: dict[str, str] | None = None,
    **defaults: Any,
) -> RedisStream:
    """Register Redis streams that other clients fill (``XADD key * field value ...``) as a
    rowtime stream at ``location``, one source key per partition (in the location's
    database). Nothing is copied: readers read the source keys.

    ``schema`` declares the columns; each reads the entry field of its name (or the one
    ``fields`` maps it to); values are text converted to the column's type. ``rowtime_field``
    names the field with the explicit rowtime (any form the writer's ``rowtime=`` accepts, read
    with the ``rowtime_unit``/``rowtime_format``/``rowtime_timezone`` defaults; digits are an
    epoch in the unit); without it a row's rowtime is its entry ID's time. The sources must not
    be trimmed below what readers have read.
    """
    loc = _as_location(location)
    payload = payload_schema(schema)
    if isinstance(sources, str) or not sources or not all(isinstance(s, str) for s in sources):
        raise OptionError(
            f"sources={sources!r} must be a list of Redis stream keys, one per partition"
        )
    mapping = dict(fields or {})
    unknown = sorted(set(mapping) - set(payload.names))
    if unknown:
        raise SchemaError(
            f"fields maps {', '.join(unknown)}, which are not columns of the declared schema "
            f"({', '.join(payload.names)})"
        )
    checked = validate_defaults(defaults, payload)
    _check_retention(Retention.of_defaults(checked), str(loc), external=True)
    meta = StreamMeta(str(loc), payload, len(sources), checked)
    spec = ExternalSpec(tuple(sources), mapping, rowtime_field)
    conn = _connection(loc)
    for key in sources:
        kind = conn.call(f"checking {key!r}", partial(conn.client.type, key)).decode()
        if kind not in ("stream", "none"):
            raise OptionError(
                f"source key {key!r} in {loc} holds a Redis {kind}, not a stream; name the keys "
                "that clients XADD to"
            )
    return _create(loc, meta, spec)


def _check_same(existing: RedisStream, meta: StreamMeta, external: ExternalSpec | None) -> None:
    where = existing.location
    if not existing.meta.payload_schema.equals(meta.payload_schema, check_metadata=True):
        raise SchemaError(
            f"a stream already exists at {where} with another schema: it has "
            f"({to_ddl(existing.meta.payload_schema)}), not ({to_ddl(meta.payload_schema)}); use "
            "the existing schema or another name"
        )
    if existing.meta.partitions != meta.partitions:
        raise OptionError(
            f"a stream already exists at {where} with {existing.meta.partitions} partitions, not "
            f"{meta.partitions}; use partitions={existing.meta.partitions} or another name"
        )
    if existing.external != external:
        raise OptionError(
            f"a stream already exists at {where}, "
            + (
                "registered over other source keys or fields"
                if existing.external and external
                else "of another kind (written by rowtime writers vs. registered from others)"
            )
            + "; use another name"
        )


def _check_retention(retention: Retention, where: str, external: bool) -> None:
    """What Redis streams refuse of a retention, said before it is stored."""
    if external and retention.active:
        raise OptionError(
            f"{where} is registered over Redis streams that others write: retention does not "
            "apply to it (their entries are theirs to trim)"
        )
    if retention.size_bytes is not None:
        raise OptionError(
            f"retention_size is not supported on Redis streams ({where}): Redis does not say "
            "how much memory one entry takes; give a retention in rowtime (such as '7 days'), "
            "and bound memory with the server's maxmemory"
        )


class _RedisBackend:
    """The :class:`~.storage.Backend` of ``redis://`` and ``rediss://`` locations. The
    resolved form is the location as given (it carries the credentials the executors need);
    everything this backend prints shows it redacted."""

    def resolve(self, location: str) -> str:
        parse_location(location)  # refuses what is not a Redis location, saying why
        return location

    def kind_at(self, resolved: str) -> LocationKind:
        loc = parse_location(resolved)
        conn = _connection(loc)

        def look() -> tuple[int, bytes | None]:
            pipe = conn.client.pipeline(transaction=False)
            pipe.exists(_meta_key(loc))
            pipe.get(loc.key("sink", "target"))  # the sink's description (.redis_sink)
            found, target = pipe.execute()
            return found, target

        found, target = conn.call(f"looking for {loc}", look)
        if found:
            return LocationKind.STREAM
        if target is not None and json.loads(target).get("kind") == SINK_KIND_STREAM:
            return LocationKind.PENDING_STREAM_TARGET
        return LocationKind.NOTHING

    def sink_store(self, resolved: str) -> Any:
        """The sink's state of a stream target here, kept with the stream (.redis_sink)."""
        from .redis_sink import RedisSinkState

        return RedisSinkState(resolved)

    def open(self, resolved: str, given: str) -> RedisStream:
        return open_redis_stream(resolved)

    def create(
        self, resolved: str, schema: str | pa.Schema, partitions: int, defaults: dict[str, Any]
    ) -> RedisStream:
        return create_redis_stream(resolved, schema, partitions, **defaults)


REDIS_BACKEND = _RedisBackend()

"""A rowtime stream on Redis, opened for reading: tails, clocks, the offset index and the
records (see the package's docstring for the keys). Appending is ``appender``'s, external
streams' indexing ``external``'s, trims ``trim``'s."""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import pyarrow as pa

from ...bounds.bounds import merge_clock
from ...bounds.errors import CorruptLogError, OptionError
from ..columns import LOG_SYSTEM_COLUMNS as SYSTEM_COLUMNS
from ..meta import StreamMeta
from ..retention import Retention, TrimResult, TrimState, Unit, data_loss
from ..segments import SegmentStats, segment_schema
from ..storage import PartitionTail, check_partition, check_read
from . import external, trim
from .appender import DEFAULT_LEASE_S, RedisAppender
from .connection import connection
from .external import BadEntry, ExternalSpec
from .location import RedisLocation
from .records import Piece, ipc_table, stats_from_json, tail_of

__all__ = ["RedisStream"]


class RedisStream:
    """A stream on Redis opened for reading (and, through ``lock_partition``, for
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
        self.conn = connection(loc)
        self._pieces: dict[int, list[Piece]] = {}
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

    def key(self, kind: str, partition: int) -> str:
        return self.loc.key(kind, str(partition))

    def source(self, partition: int) -> str:
        """The Redis stream key holding the partition's entries."""
        if self.external is not None:
            return self.external.sources[partition]
        return self.key("p", partition)

    def check_partition(self, partition: int) -> None:
        check_partition(self.location, self.meta.partitions, partition)

    # -- tails and clocks --

    def tail(self, partition: int) -> PartitionTail:
        """End, clock and last arrival of ``partition`` from one read of its tail. For an
        external stream, entries added since the last look are indexed first."""
        self.check_partition(partition)
        if self.external is not None:
            external.index_external(self, partition)
        raw = self.conn.call(
            f"reading the tail of partition {partition} of {self.location}",
            lambda: self.conn.client.hgetall(self.key("t", partition)),
        )
        return tail_of(raw)

    def end_offset(self, partition: int) -> int:
        return self.tail(partition).end

    def clock_us(self, partition: int) -> int | None:
        return self.tail(partition).clock_us

    def stream_clock_us(self) -> int | None:
        if self.external is not None:
            return merge_clock(self.clock_us(p) for p in range(self.meta.partitions))
        client = self.conn.client
        pipe = client.pipeline(transaction=False)
        for p in range(self.meta.partitions):
            pipe.hget(self.key("t", p), "clock")
        clocks = self.conn.call(f"reading the clock of {self.location}", pipe.execute)
        return merge_clock(None if c is None else int(c) for c in clocks)

    def partition_stats(self, partition: int) -> list[SegmentStats]:
        self.check_partition(partition)
        members = self.conn.call(
            f"reading the run summaries of partition {partition} of {self.location}",
            lambda: self.conn.client.zrange(self.key("s", partition), 0, -1),
        )
        return [stats_from_json(m) for m in members]

    # -- retention (streams.retention) --

    def start_offset(self, partition: int) -> int:
        """The first kept offset of ``partition`` (0 until retention or a trim removed some)."""
        self.check_partition(partition)
        raw = self.conn.call(
            f"reading the first kept offset of partition {partition} of {self.location}",
            partial(self.conn.client.hget, self.key("trim", partition), "start"),
        )
        return 0 if raw is None else int(raw)

    def trim_state(self, partition: int) -> TrimState:
        """The partition's trim: its first kept offset and the policy state there."""
        self.check_partition(partition)
        raw = self.conn.call(
            f"reading the trim state of partition {partition} of {self.location}",
            partial(self.conn.client.hget, self.key("trim", partition), "state"),
        )
        if raw is None:
            return TrimState()
        return TrimState.from_json(raw, f"partition {partition} of {self.location}")

    def retention(self) -> Retention:
        """The stream's retention: ops' last change (``{...}:retention``), else the one it
        was created with."""
        return trim.retention(self)

    def set_retention(self, retention: Retention) -> None:
        """Change the stream's retention (ops); writers pick it up at their next check."""
        trim.set_retention(self, retention)

    def trim_partition(
        self, partition: int, decide: Callable[[list[Unit], TrimState], TrimState | None]
    ) -> TrimResult | None:
        """Remove the head runs ``decide`` lets go (``trim.trim_partition``)."""
        return trim.trim_partition(self, partition, decide)

    def bad_entries(self, partition: int) -> list[BadEntry]:
        """External streams: the entries of ``partition`` that were not rows (kept in Redis,
        taking no offset), oldest first."""
        self.check_partition(partition)
        if self.external is None:
            return []
        raw = self.conn.call(
            f"reading the bad entries of partition {partition} of {self.location}",
            partial(self.conn.client.hgetall, self.key("bad", partition)),
        )
        key = self.source(partition)
        items = sorted(raw.items(), key=lambda kv: tuple(map(int, kv[0].split(b"-"))))
        return [BadEntry(key, k.decode(), v.decode()) for k, v in items]

    # -- reading --

    def _index(self, partition: int, end: int) -> tuple[list[Piece], list[int]]:
        """The partition's index, fetched from Redis as far as needed to cover ``end``
        (committed pieces never change: only new ones are fetched)."""
        with self._mutex:
            pieces = self._pieces.setdefault(partition, [])
            firsts = self._firsts.setdefault(partition, [])
            have = pieces[-1].end if pieces else 0
        if have >= end:
            return pieces, firsts
        members = self.conn.call(
            f"reading the index of partition {partition} of {self.location}",
            lambda: self.conn.client.zrangebyscore(self.key("i", partition), have, "+inf"),
        )
        with self._mutex:
            for m in members:
                piece = Piece.parse(m)
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
        ``read``: same columns, same rules)."""
        self.check_partition(partition)
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

    def _piece_times(self, partition: int, pieces: list[Piece]) -> list[pa.Table]:
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
            blobs = self.conn.call(
                f"reading the record times of partition {partition} of {self.location}",
                partial(
                    self.conn.client.hmget,
                    self.key("tm", partition),
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
                    where = (
                        f"the record times of entry {piece.first_id} of partition {partition} "
                        f"of {self.location}"
                    )
                    try:
                        table = ipc_table(blob, where, piece.first)
                    except pa.ArrowException as e:
                        raise CorruptLogError(f"{where} cannot be read as Arrow: {e}") from e
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

    def _piece_tables(self, partition: int, pieces: list[Piece]) -> list[pa.Table]:
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
            key = self.source(partition)
            entries = self.conn.call(
                f"reading partition {partition} of {self.location}",
                lambda: self.conn.client.xrange(key, missing[0].first_id, missing[-1].last_id),
            )
            by_id = {eid.decode(): fields for eid, fields in entries}
            loaded = (
                external.external_tables(self, partition, missing, entries)
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

    def _own_table(self, partition: int, piece: Piece, by_id: dict[str, Any]) -> pa.Table:
        fields = by_id.get(piece.first_id)
        where = f"entry {piece.first_id} of partition {partition} of {self.location}"
        if fields is None:
            raise CorruptLogError(
                f"{where} is missing (offsets [{piece.first}, {piece.end})): was the key trimmed "
                "or deleted? The records cannot be read"
            )
        try:
            table = ipc_table(fields[b"a"], where, piece.first)
        except (KeyError, pa.ArrowException) as e:
            raise CorruptLogError(f"{where} cannot be read as Arrow: {e}") from e
        if table.num_rows != piece.count or not table.schema.equals(self._file_schema):
            raise CorruptLogError(
                f"{where} holds {table.num_rows} records of {table.schema}, its index says "
                f"{piece.count} of the stream's columns"
            )
        return table

    # -- appending --

    def lock_partition(
        self, partition: int, where: str, *, lease_s: float = DEFAULT_LEASE_S
    ) -> RedisAppender:
        self.check_partition(partition)
        if self.external is not None:
            raise OptionError(
                f"{self.location} is a Redis stream written by others (registered with "
                "register_external): append to its source keys with XADD, not with a writer"
            )
        return RedisAppender(self, partition, where, lease_s)

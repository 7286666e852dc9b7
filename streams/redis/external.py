"""External streams: Redis streams that other clients fill (``XADD key * field value ...``),
read as rowtime streams (``create.register_external``), and the conversion of their
entries to records, which the Redis connector shares (``EntrySource``).

Records are numbered as entries are first indexed (by whoever asks for the partition's end: the
reader's driver), in ID order; an entry's arrival time and implicit rowtime are its ID's time,
in whole milliseconds. An entry that cannot be read as a row of the declared schema is bad
input: it takes no offset, it is named in ``{rowtime:name}:bad:<n>`` and counted in the tail,
and the source's entries themselves are never changed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...bounds.errors import CorruptLogError, InvalidRowtimeError, OptionError, RowtimeError
from ...bounds.time import to_rowtime_us
from ..columns import LOG_ARRIVAL_US as ARRIVAL
from ..columns import LOG_ROWTIME_US as ROWTIME
from ..ddl import to_ddl
from ..meta import StreamMeta
from ..segments import SegmentStats, segment_schema
from .location import parse_location, redact
from .records import Piece, id_us, stats_json

if TYPE_CHECKING:
    from .stream import RedisStream

__all__ = [
    "EXTERNAL_BATCH",
    "EXTERNAL_RUN",
    "BadEntry",
    "EntrySource",
    "ExternalSpec",
    "convert",
    "external_tables",
    "index_external",
]

#: Entries read per round trip when indexing an external stream.
EXTERNAL_BATCH = 10_000
#: An index member of an external stream covers at most this many entries (a read skips at most
#: that many to reach its first offset).
EXTERNAL_RUN = 4096


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


def convert(
    spec: ExternalSpec,
    meta: StreamMeta,
    partition: int,
    entries: Sequence[tuple[bytes, dict[bytes, bytes]]],
) -> tuple[pa.Table, list[BadEntry]]:
    """Entries of source ``partition`` of ``spec`` as records of a stream of ``meta`` (arrival =
    ID time), and the entries that are not rows."""
    key = spec.sources[partition]
    defaults = meta.defaults
    unit = defaults.get("rowtime_unit", "ms")
    tz = defaults.get("rowtime_timezone", "UTC")
    fmt = defaults.get("rowtime_format")
    schema = meta.payload_schema
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
        arrivals.append(id_us(eid))
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
    return pa.Table.from_arrays(arrays, schema=segment_schema(schema)), bad


def index_external(stream: RedisStream, partition: int) -> None:
    """Give offsets to the entries added to the partition's source since the last look.

    Any number of processes may do this at once: each reads the new entries, converts
    them, and commits the index only if nobody committed since it looked (the script
    compares the end); the loser looks again. Same entries, same result."""
    assert stream.external is not None
    conn = stream.conn
    key = stream.source(partition)
    keys = [stream.key(k, partition) for k in ("i", "s", "t", "bad")]
    while True:
        tail = conn.call(
            f"reading the tail of partition {partition} of {stream.location}",
            partial(conn.client.hgetall, keys[2]),
        )
        last_id = tail.get(b"last_id", b"0-0").decode()
        entries = conn.call(
            f"reading Redis stream {key!r} of {stream.location}",
            partial(conn.client.xrange, key, f"({last_id}", "+", count=EXTERNAL_BATCH),
        )
        if not entries:
            return
        args = _index_args(stream, partition, tail, entries)
        conn.call(
            f"indexing Redis stream {key!r} of {stream.location}",
            partial(conn.index, keys=keys, args=args),
        )


def _index_args(
    stream: RedisStream, partition: int, tail: dict[bytes, bytes], entries: list[Any]
) -> list[Any]:
    """The index script's arguments for new ``entries`` after ``tail``: runs of at most
    ``EXTERNAL_RUN`` consecutive good entries, their statistics, and the bad ones."""
    end = int(tail.get(b"end", 0))
    clock = int(tail[b"clock"]) if b"clock" in tail else None
    assert stream.external is not None
    table, bad = convert(stream.external, stream.meta, partition, entries)
    if bad and stream.meta.defaults.get("order") == "reject":
        raise InvalidRowtimeError(
            f"bad input in {stream.location}, partition {partition}: {bad[0]}. The stream's "
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
        stats.append(stats_json(s))
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


def external_tables(
    stream: RedisStream,
    partition: int,
    pieces: list[Piece],
    entries: list[tuple[bytes, dict[bytes, bytes]]],
) -> list[pa.Table]:
    """The records of ``pieces`` of an external stream from their ``entries`` (read by the
    caller), converted again as at indexing."""
    bad = set(
        stream.conn.call(
            f"reading the bad entries of partition {partition} of {stream.location}",
            partial(stream.conn.client.hkeys, stream.key("bad", partition)),
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
                f"{stream.source(partition)!r} (offsets [{piece.first}, {piece.end}) of "
                f"{stream.location}) are not all there any more: was the key trimmed "
                "(XTRIM, MAXLEN)? Records that a reader indexed must be kept"
            )
        assert stream.external is not None
        table, problems = convert(stream.external, stream.meta, partition, chunk)
        if problems:  # the same entries converted at indexing: they cannot go bad now
            raise CorruptLogError(f"{problems[0]} (it was read as a row before)")
        out.append(table)
        pos += piece.count
    return out


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


class EntrySource:
    """The entries that other programs ``XADD`` to one key, read in ID order after a position
    and converted to records exactly as an external stream's are (the Redis connector's source,
    through ``backend._RedisBackend.entry_source``). Only reads reach the server.

    ``unavailable`` says why the last ``read`` found nothing when the server did not answer
    (after the location's retries), else None."""

    def __init__(
        self,
        location: str,
        schema: pa.Schema,
        fields: dict[str, str],
        rowtime_field: str | None,
        defaults: dict[str, Any],
    ) -> None:

        self.loc = parse_location(location)
        self.key = self.loc.name
        # A view over this one key, in memory only (nothing is registered on the server).
        self.meta = StreamMeta(str(self.loc), schema, 1, defaults)
        self.spec = ExternalSpec((self.key,), dict(fields), rowtime_field)
        self.client = self.loc.connect()
        self.unavailable: str | None = None

    def where(self, entry_id: str) -> str:
        """An entry, as messages name it (the location redacted)."""
        return f"entry {entry_id} of Redis stream {self.key!r} ({self.loc})"

    def read(self, after: str, count: int) -> list[Any]:
        """Up to ``count`` entries after the entry ID ``after``, as ``(id, fields)`` pairs; for
        ``after == "new"``, one pair ``("new", the last entry's ID)`` (``"0-0"`` while empty).
        A server that does not answer gives ``[]`` and sets ``unavailable``."""
        import redis

        try:
            if after == "new":
                last = self.client.xrevrange(self.key, "+", "-", count=1)
                return [("new", last[0][0].decode() if last else "0-0")]
            entries = self.client.xrange(self.key, f"({after}", "+", count=count)
        except (redis.ConnectionError, redis.TimeoutError) as e:
            # The location's retries are spent: say so once, and try again at the next poll
            # (the position has not moved, so nothing is lost).
            self.unavailable = f"Redis at {self.loc} did not answer ({type(e).__name__}); retrying"
            return []
        except redis.ResponseError as e:
            raise OptionError(
                f"Redis at {self.loc} refused reading {self.key!r}: {redact(str(e))}; the key "
                "must be a Redis stream (XADD) that the location's user may read"
            ) from None
        self.unavailable = None
        return list(entries)

    def convert(
        self, entries: Sequence[tuple[bytes, dict[bytes, bytes]]]
    ) -> tuple[pa.Table, list[BadEntry]]:
        """Entries as records (``convert``), and those that are not rows."""
        return convert(self.spec, self.meta, 0, entries)

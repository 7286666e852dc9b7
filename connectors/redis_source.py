"""The Redis Streams connector: entries that other programs ``XADD`` to a key, fed continuously
into any rowtime stream (an embedded log or a redis:// stream).

::

    [connectors.orders-redis]
    kind = "redis"
    stream = "orders"
    source = "redis://cache.internal:6379/0/orders:in"   # server, database, then the key
    password_env = "REDIS_PASSWORD"                      # the password, by environment variable
    fields = { qty = "quantity" }                        # column -> entry field (default: same)
    rowtime_field = "ts"                                 # else the entry ID's time (ms)
    start = "first"                                      # first: every entry; new: from now on
    state = "state/orders-redis"                         # required when stream is redis://

An entry is read exactly as a Redis stream registered with
``pyspark_rowtime.streams.redis.register_external`` reads it (the same conversion: each
column from its field's text, ``rowtime_field`` in the stream's ``rowtime_unit``/``rowtime_format``/
``rowtime_timezone``, else the entry ID's time): the connector only moves those rows into
another stream, with bounds. An entry holding just the field ``rowtime_bound`` is a bound from
the source (strategy ``source``). An entry that is not a row of the stream is bad input: counted
as discarded and kept in the connector's ``rejected.jsonl``, naming the key and the entry ID.

Position: the ID of the last entry read, committed with the rows it brought (see ``feed``),
so a restart after a kill reads on from the entry after it, without loss or duplicates. Only
reads (``XRANGE``) reach the source server: the connector's user needs no write right there.
The source key must not be trimmed (``XTRIM``, ``MAXLEN``) below entries not yet read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..bounds.errors import OptionError, RowtimeError
from ..bounds.time import TimeFormat
from ..streams.columns import LOG_ARRIVAL_US, LOG_ROWTIME_US
from ..streams.meta import validate_defaults
from ..streams.storage import SupportsEntrySource, backend_for, redact_url
from .feed import Feed
from .sources import BOUND_FIELD

#: Entries read per step, at most (``batch_rows``).
DEFAULT_BATCH = 1000


class RedisSource:
    """Reads entries ``XADD``-ed to one key, in ID order, from the entry after the position."""

    def __init__(self, feed: Feed, settings: Mapping[str, Any], fail: Any) -> None:
        self.feed = feed
        source = settings.get("source")
        if not isinstance(source, str) or "://" not in source:
            raise fail(
                "source",
                "must be the key others XADD to, as redis://host:6379/DB/KEY (no password: "
                "name its environment variable with password_env)",
            )
        env = settings.get("password_env")
        if env is not None:
            if not isinstance(env, str) or not env.isidentifier():
                raise fail("password_env", "must be the name of an environment variable")
            source = f"{source}{'&' if '?' in source else '?'}password_env={env}"
        # The key is reached through the storage seam: the backend serving the URL's scheme
        # reads entries others append, if it can (Redis: a SupportsEntrySource).
        not_redis = (
            f"{redact_url(source)!r} is not a Redis location; use "
            "redis://[user:password@]host:port/db/name (or rediss:// for TLS)"
        )
        try:
            backend = backend_for(source)
        except OptionError:
            raise fail("source", not_redis) from None
        if not isinstance(backend, SupportsEntrySource):
            raise fail("source", not_redis)
        try:
            resolved = backend.resolve(source)
        except OptionError as e:
            raise fail("source", str(e)) from None
        fields = settings.get("fields", {})
        schema = feed.storage.meta.payload_schema
        if not isinstance(fields, Mapping) or not all(isinstance(v, str) for v in fields.values()):
            raise fail("fields", "must be a table of column = entry field name")
        unknown = sorted(set(fields) - set(schema.names))
        if unknown:
            raise fail(
                "fields",
                f"maps {', '.join(unknown)}, not columns of stream {feed.entry.name!r} "
                f"({', '.join(schema.names)})",
            )
        rowtime_field = settings.get("rowtime_field")
        if rowtime_field is not None and not isinstance(rowtime_field, str):
            raise fail("rowtime_field", "must be the name of the entry field holding the rowtime")
        defaults: dict[str, Any] = {}
        for key in ("rowtime_unit", "rowtime_format", "rowtime_timezone"):
            if key in settings:
                defaults[key] = settings[key]
        try:
            defaults = validate_defaults(defaults, schema)
        except OptionError as e:
            raise fail(next(iter(defaults)), str(e)) from None
        self.time = TimeFormat(
            defaults.get("rowtime_unit", "ms"),
            defaults.get("rowtime_timezone", "UTC"),
            defaults.get("rowtime_format"),
        )
        self.start = settings.get("start", "first")
        if self.start not in ("first", "new"):
            raise fail(
                "start",
                "must be first (every entry of the key) or new (entries added "
                "after the connector's first start)",
            )
        batch = settings.get("batch_rows", DEFAULT_BATCH)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise fail("batch_rows", "must be a whole number >= 1")
        self.batch = batch
        # The conversion of entries to rows is the one of streams registered from others
        # (register_external), over this one key, in memory only (nothing is registered on the
        # source server).
        self.entries = backend.entry_source(resolved, schema, dict(fields), rowtime_field, defaults)

    @property
    def unavailable(self) -> str | None:
        """Why the last read found nothing, when the server did not answer (else None)."""
        unavailable: str | None = self.entries.unavailable
        return unavailable

    def _where(self, entry_id: str) -> str:
        where: str = self.entries.where(entry_id)
        return where

    def _read(self, after: str) -> list[Any]:
        entries: list[Any] = self.entries.read(after, self.batch)
        return entries

    def step(self) -> bool:
        """Read up to ``batch_rows`` entries; True if there were any."""
        feed = self.feed
        pos = feed.position or {}
        after = pos.get("id")
        if after is None:
            after = "new" if self.start == "new" else "0-0"
        entries = self._read(after)
        if entries and entries[0][0] == "new":  # first start with start = "new"
            feed.commit({"id": entries[0][1]})
            return True
        if not entries:
            return False
        rows: list[tuple[bytes, dict[bytes, bytes]]] = []
        for raw_id, fields in entries:
            if set(fields) == {BOUND_FIELD.encode()}:
                # Rows before it in this batch go first: a bound covers what came before it.
                self._rows(rows)
                rows = []
                eid = raw_id.decode()
                try:
                    feed.source_bound(self.time.read(_number(fields[BOUND_FIELD.encode()])))
                    feed.bound()  # where the source put it: rows after it may not go below
                except (RowtimeError, ValueError, TypeError) as e:
                    feed.reject("bad", self._where(eid), str(e), _text(fields))
                continue
            rows.append((raw_id, fields))
        self._rows(rows)
        feed.bound()
        feed.commit({"id": entries[-1][0].decode()})
        return True

    def _rows(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        if not entries:
            return
        feed = self.feed
        table, bad = self.entries.convert(entries)
        bad_ids = {b.entry_id for b in bad}
        by_id = {raw.decode(): fields for raw, fields in entries}
        for b in bad:
            feed.reject("bad", self._where(b.entry_id), b.reason, _text(by_id[b.entry_id]))
        good = [raw.decode() for raw, _ in entries if raw.decode() not in bad_ids]
        names = feed.schema.names
        columns = table.to_pydict()
        for i, eid in enumerate(good):
            row = {n: columns[n][i] for n in names}
            rowtime = columns[LOG_ROWTIME_US][i]
            if rowtime is None:
                rowtime = columns[LOG_ARRIVAL_US][i]  # the entry ID's time, as readers see it
            try:
                feed.insert(row, rowtime, self._where(eid))
            except (RowtimeError, ValueError, TypeError) as e:
                feed.reject("bad", self._where(eid), str(e), _text(by_id[eid]))


def _text(fields: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in fields.items()}


def _number(raw: bytes) -> Any:
    text = raw.decode()
    return int(text) if text.strip().lstrip("-").isdigit() else text

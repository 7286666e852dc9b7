"""Creating and opening Redis streams: the ``{rowtime:name}:meta`` hash (the stream's metadata,
the same JSON document as the embedded log's ``_stream.json``; for an external stream, how
others' keys map to it), written once (``HSETNX``), and ``register_external``."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import pyarrow as pa

from ...bounds.errors import CorruptLogError, OptionError, SchemaError, StreamNotFoundError
from ..ddl import to_ddl
from ..meta import StreamMeta, meta_from_json, meta_to_json, payload_schema, validate_defaults
from ..retention import Retention
from ..storage import stream_not_found
from .connection import connection
from .external import ExternalSpec
from .location import RedisLocation, parse_location
from .stream import RedisStream
from .trim import check_retention

__all__ = ["FORMAT", "create_redis_stream", "meta_key", "open_redis_stream", "register_external"]

#: The format of a stream's keys (``format`` in its meta hash).
FORMAT = "1"


def meta_key(loc: RedisLocation) -> str:
    return loc.key("meta")


def _not_found(loc: RedisLocation) -> StreamNotFoundError:
    return stream_not_found(
        str(loc),
        str(loc),
        f"no key {meta_key(loc)} in database {loc.db}",
        "; or register a Redis stream written by others with "
        "pyspark_rowtime.streams.redis.register_external",
    )


def _as_location(location: str | RedisLocation) -> RedisLocation:
    return location if isinstance(location, RedisLocation) else parse_location(location)


def open_redis_stream(location: str | RedisLocation) -> RedisStream:
    """The stream at ``location`` (``redis://...``); ``StreamNotFoundError`` if none."""
    loc = _as_location(location)
    conn = connection(loc)
    raw = conn.call(f"opening {loc}", lambda: conn.client.hgetall(meta_key(loc)))
    if not raw or b"meta" not in raw:
        raise _not_found(loc)
    if raw.get(b"format", b"") != FORMAT.encode():
        raise CorruptLogError(
            f"{loc} has format {raw.get(b'format')!r}; this pyspark-rowtime reads format "
            f"{FORMAT}: upgrade pyspark-rowtime"
        )
    meta = meta_from_json(raw[b"meta"].decode(), str(loc))
    external = ExternalSpec.from_json(raw[b"external"].decode()) if b"external" in raw else None
    return RedisStream(loc, meta, external)


def _create(loc: RedisLocation, meta: StreamMeta, external: ExternalSpec | None) -> RedisStream:
    conn = connection(loc)
    doc = {"meta": meta_to_json(meta), "format": FORMAT}
    if external is not None:
        doc["external"] = external.to_json()
    key = meta_key(loc)

    def create() -> bool:
        # One script: of two creators exactly one writes the document, and no reader sees a
        # part of it (two commands let a reader in between find ``meta`` without ``format``).
        rest = [part for field, value in doc.items() if field != "meta" for part in (field, value)]
        return bool(conn.create(keys=[key], args=["meta", doc["meta"], *rest]))

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
    ``local.log.create_stream``."""
    loc = _as_location(location)
    payload = payload_schema(schema)
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise OptionError(f"partitions={partitions!r} must be a whole number >= 1")
    meta = StreamMeta(str(loc), payload, partitions, validate_defaults(defaults, payload))
    check_retention(Retention.of_defaults(meta.defaults), str(loc), external=False)
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
    check_retention(Retention.of_defaults(checked), str(loc), external=True)
    meta = StreamMeta(str(loc), payload, len(sources), checked)
    spec = ExternalSpec(tuple(sources), mapping, rowtime_field)
    conn = connection(loc)
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

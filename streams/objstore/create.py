"""Creating and opening streams on object storage, and the backend of ``s3://`` and ``az://``
locations (``OBJECT_STORE_BACKEND``). Of two creators, the first to create ``_stream.json``
(create-if-absent) wins; the other checks it asked for the same stream."""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa

from ...bounds.errors import OptionError
from ..meta import (
    META_FILE,
    StreamMeta,
    check_same_stream,
    meta_from_json,
    meta_to_json,
    payload_schema,
    validate_defaults,
)
from ..sink_state import SINK_KIND_DELTA, SINK_KIND_PARQUET, SINK_KIND_STREAM
from ..storage import LocationKind, stream_not_found
from .files import ObjectTargetFiles
from .location import ObjectLocation, call, parse_location, require_conditional_writes, store_for
from .log import ObjectStream, _now_us
from .sink import ObjectSinkState, read_target

__all__ = ["OBJECT_STORE_BACKEND", "create_object_stream", "open_object_stream"]


def _read_meta(loc: ObjectLocation) -> StreamMeta | None:
    import obstore

    try:
        raw = call(
            loc,
            "reading the stream's metadata",
            lambda: obstore.get(store_for(loc), loc.key(META_FILE)).bytes(),
        )
    except FileNotFoundError:  # obstore's not found
        return None
    return meta_from_json(bytes(raw).decode(), str(loc))


def open_object_stream(location: str | ObjectLocation, given: str | None = None) -> ObjectStream:
    loc = location if isinstance(location, ObjectLocation) else parse_location(location)
    meta = _read_meta(loc)
    if meta is None:
        raise stream_not_found(
            given or str(loc), str(loc), f"no object {loc.key(META_FILE)} in bucket {loc.bucket}"
        )
    return ObjectStream(loc, meta)


def create_object_stream(
    location: str | ObjectLocation,
    schema: str | pa.Schema,
    partitions: int = 1,
    **defaults: Any,
) -> ObjectStream:
    """Create a stream on object storage (or open the identical one); the rules of
    ``streams.log.create_stream``. Of two creators, the first to create ``_stream.json``
    (create-if-absent) wins; the other checks it asked for the same stream."""
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    loc = location if isinstance(location, ObjectLocation) else parse_location(location)
    payload = payload_schema(schema)
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise OptionError(f"partitions={partitions!r} must be a whole number >= 1")
    checked = validate_defaults(defaults, payload)
    meta = StreamMeta(
        str(loc), payload, partitions, checked, stream_id=uuid.uuid4().hex, created_us=_now_us()
    )
    existing = _read_meta(loc)
    if existing is None:
        require_conditional_writes(loc)
        strangers = _strangers(loc)
        if strangers:
            raise OptionError(
                f"cannot create a stream at {loc}: objects already lie below its prefix "
                f"({', '.join(strangers[:5])}); choose an empty or new prefix"
            )
        text = meta_to_json(meta).encode()
        try:
            call(
                loc,
                "creating the stream",
                lambda: obstore.put(store_for(loc), loc.key(META_FILE), text, mode="create"),
            )
            return ObjectStream(loc, meta)
        except (AlreadyExistsError, PreconditionError):
            existing = _read_meta(loc)  # another process created it just now (or our 409)
            assert existing is not None
            if existing.stream_id == meta.stream_id:
                return ObjectStream(loc, existing)
    check_same_stream(existing, meta, given_defaults=bool(defaults))
    return ObjectStream(loc, existing)


def _strangers(loc: ObjectLocation) -> list[str]:
    import obstore

    listing = call(
        loc,
        "looking below the prefix",
        lambda: obstore.list_with_delimiter(store_for(loc), loc.prefix + "/"),
    )
    names = [p.rstrip("/").rsplit("/", 1)[-1] for p in listing["common_prefixes"]]
    names += [o["path"].rsplit("/", 1)[-1] for o in listing["objects"]]
    return sorted(n for n in names if not n.startswith(("partition-", "_", ".")))


class _ObjectStoreBackend:
    """The ``Backend`` of ``s3://``, ``az://``, ``azure://`` and ``abfs[s]://``
    locations. The resolved form is the canonical URL (it never holds a secret)."""

    def resolve(self, location: str) -> str:
        return str(parse_location(location))

    def kind_at(self, resolved: str) -> LocationKind:
        loc = parse_location(resolved)
        if _read_meta(loc) is not None:
            return LocationKind.STREAM

        doc = read_target(loc)
        kind = doc.get("kind") if isinstance(doc, dict) else None
        if kind == SINK_KIND_STREAM:
            return LocationKind.PENDING_STREAM_TARGET
        if kind == SINK_KIND_PARQUET:
            return LocationKind.PARQUET_TARGET
        if kind == SINK_KIND_DELTA:
            return LocationKind.DELTA_TARGET
        return LocationKind.NOTHING

    def sink_state(self, resolved: str) -> Any:
        """The sink's state of a stream target here, kept below the location (.sink)."""
        return ObjectSinkState(resolved)

    def target_files(self, resolved: str) -> Any:
        """The objects below the location, for a Parquet target of the sink (.files)."""
        return ObjectTargetFiles(resolved)

    def open(self, resolved: str, given: str) -> ObjectStream:
        return open_object_stream(resolved, given)

    def create(
        self, resolved: str, schema: str | pa.Schema, partitions: int, defaults: dict[str, Any]
    ) -> ObjectStream:
        return create_object_stream(resolved, schema, partitions, **defaults)


OBJECT_STORE_BACKEND = _ObjectStoreBackend()

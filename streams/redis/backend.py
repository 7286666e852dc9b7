"""The Redis backend as ``storage`` sees it: ``redis://`` and ``rediss://`` locations."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from ..sink_state import SINK_KIND_STREAM
from ..storage import LocationKind
from .connection import connection
from .create import create_redis_stream, meta_key, open_redis_stream
from .external import EntrySource
from .location import SCHEMES, parse_location
from .sink import RedisSinkState
from .stream import RedisStream

__all__ = ["BACKEND", "SCHEMES"]


class _RedisBackend:
    """The ``Backend`` of ``redis://`` and ``rediss://`` locations. The
    resolved form is the location as given (it carries the credentials the executors need);
    everything this backend prints shows it redacted."""

    def resolve(self, location: str) -> str:
        parse_location(location)  # refuses what is not a Redis location, saying why
        return location

    def kind_at(self, resolved: str) -> LocationKind:
        loc = parse_location(resolved)
        conn = connection(loc)

        def look() -> tuple[int, bytes | None]:
            pipe = conn.client.pipeline(transaction=False)
            pipe.exists(meta_key(loc))
            pipe.get(loc.key("sink", "target"))  # the sink's description (.sink)
            found, target = pipe.execute()
            return found, target

        found, target = conn.call(f"looking for {loc}", look)
        if found:
            return LocationKind.STREAM
        if target is not None and json.loads(target).get("kind") == SINK_KIND_STREAM:
            return LocationKind.PENDING_STREAM_TARGET
        return LocationKind.NOTHING

    def sink_state(self, resolved: str) -> Any:
        """The sink's state of a stream target here, kept with the stream (``sink``)."""
        return RedisSinkState(resolved)

    def entry_source(
        self,
        resolved: str,
        schema: pa.Schema,
        fields: dict[str, str],
        rowtime_field: str | None,
        defaults: dict[str, Any],
    ) -> EntrySource:
        """Entries others append to the key at ``resolved``, read and converted as an external
        stream's (the capability a connector of kind ``redis`` reads through)."""
        return EntrySource(resolved, schema, fields, rowtime_field, defaults)

    def open(self, resolved: str, given: str) -> RedisStream:
        return open_redis_stream(resolved)

    def create(
        self, resolved: str, schema: str | pa.Schema, partitions: int, defaults: dict[str, Any]
    ) -> RedisStream:
        return create_redis_stream(resolved, schema, partitions, **defaults)


#: The Redis backend (entry points ``redis`` and ``rediss`` of ``pyspark_rowtime.backends``).
BACKEND = _RedisBackend()

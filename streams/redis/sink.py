"""The sink's state for a stream target on Redis, kept with the stream (no shared filesystem).

A query writing ``writeStream.format("rowtime").option("path", "redis://.../name")`` keeps what
``sink.layout`` keeps in a ``_rowtime_sink/`` folder beside a local target in keys of the
stream's own namespace (hash tag ``{rowtime:name}``, so on Redis Cluster they live in the
stream's slot)::

    {rowtime:name}:sink:target        STRING  what the target is (JSON; SET NX: written once)
    {rowtime:name}:sink:owner         STRING  the Spark query id that writes it (SET NX)
    {rowtime:name}:sink:manifest      HASH    batch id -> manifest entry (JSON): the intent
    {rowtime:name}:sink:staging:<b>   HASH    run name -> a staged run of batch b, in the
                                              segment format (Arrow IPC file, stats in footer)
    {rowtime:name}:sink:staged        ZSET    batch ids that have a staging hash (score = id)

The two-phase commit of ``sink.stream_target`` is unchanged: executors stage each run with one
``HSET`` (and ``ZADD``) in a ``MULTI`` block; the driver writes the batch's intent with ``HSET``
before it appends anything, and carries it out through the partition writers (lease locks,
idempotent atomic appends, ``appender``); a replay after a driver restart or a task retry
finds the intent and finishes it from the staged runs, which are deleted only once the batch is
wholly applied. Every step is one atomic command or transaction, durable as far as the server's
persistence is (``appendonly yes``, see ``appender``); Redis keeps the order of writes, so
the server never has an intent without the staged runs it names.

Where it differs from a folder: the driver's commit of a linked run reads the run back from
Redis and appends it as new entries (a folder target links the file, reading no record), so
each row crosses the network three times (stage, fetch, append) instead of once; staged runs
live in the server's memory until their batch commits (at most one batch, plus an aborted
attempt's until the next commit cleans it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ...bounds.errors import CorruptLogError
from ..segments import SegmentStats, StagedBlobs, write_segment_to
from ..sink_state import check_sink_version, claim_target, define_target_once, latest_entry
from .connection import connection
from .location import parse_location

__all__ = ["RedisSinkState"]

#: Manifest entries kept (the sink's folder keeps as many: Spark replays only the latest).
MANIFEST_KEEP = 100

if TYPE_CHECKING:
    from ..sink_state import RunChunks, Staged


def _done() -> None:
    """Nothing to wait for: a run is in Redis when its HSET returns."""


def _json(raw: bytes | None) -> Any | None:
    return None if raw is None else json.loads(raw)


class RedisSinkState(StagedBlobs):
    """The state of the stream target at a ``redis://`` location (see the module docstring);
    implements ``sink_state.SinkState``. Picklable: it connects on first use."""

    def __init__(self, resolved: str) -> None:
        self.loc = parse_location(resolved)
        self.target = str(self.loc)  # redacted: it reaches error messages

    #: append_staged: the Redis appender commits all the runs in one atomic script.
    _blob_prefix = "rowtime-redis-sink-"

    def __repr__(self) -> str:
        return f"RedisSinkState({self.target!r})"

    def _key(self, *parts: str) -> str:
        return self.loc.key("sink", *parts)

    def _call(self, what: str, fn: Callable[[Any], Any]) -> Any:
        conn = connection(self.loc)
        return conn.call(f"{what} of the sink target {self.target}", partial(fn, conn.client))

    # -- what the target is, who writes it --

    def read_target(self) -> dict[str, Any] | None:
        doc: dict[str, Any] | None = _json(
            self._call("reading the description", lambda c: c.get(self._key("target")))
        )
        return check_sink_version(doc, f"{self.target} (key {self._key('target')})")

    def define_target(self, doc: dict[str, Any]) -> dict[str, Any]:
        def create(full: dict[str, Any]) -> bool:
            text = json.dumps(full, sort_keys=True)
            return bool(
                self._call("describing", lambda c: c.set(self._key("target"), text, nx=True))
            )

        return define_target_once(doc, create, self.read_target)

    def claim(self, query_id: str | None) -> None:
        key = self._key("owner")

        def claim(doc: dict[str, Any]) -> Any:
            def set_then_get(c: Any) -> Any:
                c.set(key, json.dumps(doc), nx=True)  # the first query to claim it owns it
                return c.get(key)

            return _json(self._call("claiming", set_then_get))

        claim_target(self.target, query_id, claim)

    # -- the manifest --

    def batches(self) -> list[int]:
        ids = self._call("listing the manifest", lambda c: c.hkeys(self._key("manifest")))
        return sorted(int(b) for b in ids)

    def entry(self, batch_id: int) -> dict[str, Any] | None:
        doc: dict[str, Any] | None = _json(
            self._call(
                f"reading batch {batch_id}'s entry",
                lambda c: c.hget(self._key("manifest"), str(batch_id)),
            )
        )
        return doc

    def latest(self, before: int | None = None) -> dict[str, Any] | None:
        return latest_entry(self, before)

    def put_entry_once(self, batch_id: int, doc: dict[str, Any]) -> bool:
        text = json.dumps(doc, sort_keys=True)
        return bool(
            self._call(
                f"committing batch {batch_id}",
                lambda c: c.hsetnx(self._key("manifest"), str(batch_id), text),
            )
        )

    def replace_entry(self, batch_id: int, doc: dict[str, Any]) -> None:
        text = json.dumps(doc, sort_keys=True)
        self._call(
            f"writing batch {batch_id}'s intent",
            lambda c: c.hset(self._key("manifest"), str(batch_id), text),
        )

    def prune(self, keep: int = MANIFEST_KEEP) -> None:
        ids = self.batches()
        old = [str(b) for b in ids[: max(0, len(ids) - keep)]]
        if old:
            self._call("pruning the manifest", lambda c: c.hdel(self._key("manifest"), *old))

    # -- staging --

    def stage_segment(
        self, batch_id: int, name: str, stats: SegmentStats, schema: pa.Schema, chunks: RunChunks
    ) -> Staged:
        """Stage a run as one hash field (handle ``"<batch>/<name>"``), in one transaction
        with the batch's entry in the staging index."""
        sink = pa.BufferOutputStream()
        write_segment_to(sink, stats, schema, chunks)  # with checksums, checked when appended
        blob = sink.getvalue()

        def stage(c: Any) -> None:
            pipe = c.pipeline(transaction=True)
            pipe.zadd(self._key("staged"), {str(batch_id): batch_id})
            pipe.hset(self._key("staging", str(batch_id)), name, blob.to_pybytes())
            pipe.execute()

        self._call(f"staging a run of batch {batch_id}", stage)
        return f"{batch_id}/{name}", _done

    def _split(self, handle: str) -> tuple[str, str]:
        batch, name = handle.split("/", 1)
        return self._key("staging", batch), name

    def missing_staged(self, handles: Sequence[str]) -> list[str]:
        def check(c: Any) -> list[Any]:
            pipe = c.pipeline(transaction=False)
            for h in handles:
                pipe.hexists(*self._split(h))
            result: list[Any] = pipe.execute()
            return result

        found = self._call("checking staged runs", check)
        return [h for h, ok in zip(handles, found, strict=True) if not ok]

    def _blob(self, handle: str) -> bytes:
        blob: bytes | None = self._call(
            f"reading staged run {handle}", lambda c: c.hget(*self._split(handle))
        )
        if blob is None:
            raise CorruptLogError(f"staged run {handle} of {self.target} is gone")
        return blob

    def discard_staged(self, handles: Sequence[str]) -> None:
        def discard(c: Any) -> None:
            pipe = c.pipeline(transaction=False)
            for h in handles:
                pipe.hdel(*self._split(h))
            pipe.execute()

        if handles:
            self._call("removing staged runs", discard)

    def drop_staging(self, batch_id: int) -> None:
        def drop(c: Any) -> None:
            pipe = c.pipeline(transaction=True)
            pipe.delete(self._key("staging", str(batch_id)))
            pipe.zrem(self._key("staged"), str(batch_id))
            pipe.execute()

        self._call(f"removing what batch {batch_id} staged", drop)

    def clean_staging(self, up_to: int) -> None:
        ids = self._call(
            "listing staged batches",
            lambda c: c.zrangebyscore(self._key("staged"), "-inf", up_to),
        )
        for b in ids:
            self.drop_staging(int(b))

    def staged(self) -> list[str]:
        def collect(c: Any) -> list[str]:
            out = []
            for b in c.zrange(self._key("staged"), 0, -1):
                batch = b.decode()
                out += [f"{batch}/{n.decode()}" for n in c.hkeys(self._key("staging", batch))]
            return sorted(out)

        result: list[str] = self._call("listing staged runs", collect)
        return result

"""The sink's state for a stream target on object storage, kept below the target's prefix.

What ``sink.layout`` keeps in a ``_rowtime_sink/`` folder beside a local target lies in objects
below ``prefix/_rowtime_sink/`` (the executors that stage and the driver that commits need no
shared filesystem)::

    _rowtime_sink/target.json                   what the target is; created once
    _rowtime_sink/owner.json                    the Spark query that writes it; created once
    _rowtime_sink/manifest/<batch:020d>.json    one entry per batch (the intent, then done)
    _rowtime_sink/staging/<batch:020d>/<name>   a run a task staged (segment format), or a
                                                Parquet target's staged files below it
    _rowtime_sink/commit.lease                  Parquet targets: one commit at a time

Exclusivity comes from conditional creates, as the log's commits: the target's description, its
owner and a batch's entry are created with ``If-None-Match: *``, so of two drivers committing
one batch exactly one publishes its entry (``ObjectSinkState.put_entry_once``); a failed
create is read back before it is believed (S3's retryable 409 is reported as "already exists").
The appends the entry leads to go through the partition writers (lease, fenced commits).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ...bounds.errors import CorruptLogError
from ..lock import wait_for_lock
from ..segments import SegmentStats, StagedBlobs, write_segment_to
from ..sink_state import (
    SINK_DIR,
    SINK_TARGET_FILE,
    check_sink_version,
    claim_target,
    define_target_once,
    latest_entry,
)
from .lease import Lease, lease_seconds
from .location import (
    UNKNOWN_SIZE,
    ObjectLocation,
    call,
    create_if_absent,
    delete_objects,
    parse_location,
    store_for,
)

__all__ = ["ObjectSinkState", "read_target"]

#: Manifest entries kept (the sink's folder keeps as many: Spark replays only the latest).
MANIFEST_KEEP = 100

if TYPE_CHECKING:
    from ..sink_state import RunChunks, Staged


def _done() -> None:
    """Nothing to wait for: a staged run is durable when its PUT returns."""


def _get(loc: ObjectLocation, key: str, what: str) -> Any | None:
    import obstore

    try:
        raw = call(loc, what, lambda: obstore.get(store_for(loc), key).bytes())
    except FileNotFoundError:  # obstore's not found
        return None
    try:
        return json.loads(bytes(raw))
    except ValueError as e:
        raise CorruptLogError(f"sink object {key} of {loc} cannot be read ({e})") from e


def read_target(loc: ObjectLocation) -> dict[str, Any] | None:
    """The target's description below ``loc``, or None (refused if a newer sink wrote it)."""
    key = loc.key(SINK_DIR, SINK_TARGET_FILE)
    doc = _get(loc, key, "reading the sink target's description")
    return check_sink_version(doc, f"{loc} ({key})") if isinstance(doc, dict) else None


class ObjectSinkState(StagedBlobs):
    """The state of the stream target at an object storage location (module docstring);
    implements ``sink_state.SinkState``. Picklable: the client is made on first use."""

    def __init__(self, resolved: str) -> None:
        self.loc = parse_location(resolved)
        self.target = str(self.loc)

    #: append_staged: the partition's writer commits all the runs in one commit.
    _blob_prefix = "rowtime-objstore-sink-"

    def __repr__(self) -> str:
        return f"ObjectSinkState({self.target!r})"

    def _key(self, *parts: str) -> str:
        return self.loc.key(SINK_DIR, *parts)

    def _create(self, key: str, doc: Any, what: str) -> bool:
        """Create ``key`` holding ``doc`` unless it exists; True if this call did. False may
        also be our own create reported as a conflict: the callers read the object back."""
        text = json.dumps(doc, sort_keys=True).encode()
        return create_if_absent(self.loc, key, text, f"{what} of the sink target")

    # -- what the target is, who writes it --

    def read_target(self) -> dict[str, Any] | None:
        return read_target(self.loc)

    def define_target(self, doc: dict[str, Any]) -> dict[str, Any]:
        key = self._key(SINK_TARGET_FILE)
        return define_target_once(
            doc, lambda full: self._create(key, full, "describing"), self.read_target
        )

    def claim(self, query_id: str | None) -> None:
        key = self._key("owner.json")

        def claim(doc: dict[str, Any]) -> Any:
            owner = _get(self.loc, key, "reading the sink target's owner")
            if owner is None:
                self._create(key, doc, "claiming")
                owner = _get(self.loc, key, "reading the sink target's owner")
            return owner

        claim_target(self.target, query_id, claim)

    # -- the manifest --

    def _entry_key(self, batch_id: int) -> str:
        return self._key("manifest", f"{batch_id:020d}.json")

    def batches(self) -> list[int]:
        import obstore

        prefix = self._key("manifest") + "/"

        def listing() -> list[int]:
            out = []
            for chunk in obstore.list(store_for(self.loc), prefix):
                for meta in chunk:
                    name = meta["path"].rsplit("/", 1)[-1]
                    if name.endswith(".json") and name[:-5].isdigit():
                        out.append(int(name[:-5]))
            return sorted(out)

        return call(self.loc, "listing the sink's manifest", listing)

    def entry(self, batch_id: int) -> dict[str, Any] | None:
        doc: dict[str, Any] | None = _get(
            self.loc, self._entry_key(batch_id), f"reading batch {batch_id}'s entry"
        )
        if doc is not None:
            doc.pop("_put", None)  # put_entry_once's mark
        return doc

    def latest(self, before: int | None = None) -> dict[str, Any] | None:
        return latest_entry(self, before)

    def put_entry_once(self, batch_id: int, doc: dict[str, Any]) -> bool:
        """Create the entry of ``batch_id`` unless it exists: of two drivers committing one
        batch, exactly one creates it. A failed create is read back: ours only if it holds
        this very document (an identical one from another driver counts as theirs)."""
        key = self._entry_key(batch_id)
        marked = {**doc, "_put": os.urandom(8).hex()}
        if self._create(key, marked, f"committing batch {batch_id}"):
            return True
        there = _get(self.loc, key, f"reading batch {batch_id}'s entry")
        return there is not None and there.get("_put") == marked["_put"]

    def replace_entry(self, batch_id: int, doc: dict[str, Any]) -> None:
        import obstore

        text = json.dumps(doc, sort_keys=True).encode()
        call(
            self.loc,
            f"writing batch {batch_id}'s intent of the sink target",
            lambda: obstore.put(store_for(self.loc), self._entry_key(batch_id), text),
        )

    def prune(self, keep: int = MANIFEST_KEEP) -> None:
        ids = self.batches()
        self._delete([self._entry_key(b) for b in ids[: max(0, len(ids) - keep)]])

    def _delete(self, keys: Sequence[str]) -> None:
        delete_objects(self.loc, store_for(self.loc), keys, "removing sink objects")

    # -- staging --

    def _staged_key(self, handle: str) -> str:
        batch, name = handle.split("/", 1)
        return self._key("staging", f"{int(batch):020d}", name)

    def stage_segment(
        self, batch_id: int, name: str, stats: SegmentStats, schema: pa.Schema, chunks: RunChunks
    ) -> Staged:
        """Stage a run as one object (handle ``"<batch>/<name>"``), durable when this returns."""
        import obstore

        sink = pa.BufferOutputStream()
        write_segment_to(sink, stats, schema, chunks)
        data = sink.getvalue().to_pybytes()
        handle = f"{batch_id}/{name}"
        call(
            self.loc,
            f"staging a run of batch {batch_id} of the sink target",
            lambda: obstore.put(store_for(self.loc), self._staged_key(handle), data),
            writes=len(data),
        )
        return handle, _done

    def missing_staged(self, handles: Sequence[str]) -> list[str]:
        import obstore

        missing = []
        for h in handles:
            try:
                call(
                    self.loc,
                    "checking staged runs",
                    lambda h=h: obstore.head(store_for(self.loc), self._staged_key(h)),  # type: ignore[misc]
                )
            except FileNotFoundError:  # obstore's not found
                missing.append(h)
        return missing

    def _blob(self, handle: str) -> bytes:
        import obstore

        try:
            raw = call(
                self.loc,
                f"reading staged run {handle}",
                lambda: obstore.get(store_for(self.loc), self._staged_key(handle)).bytes(),
                reads=UNKNOWN_SIZE,
            )
        except FileNotFoundError:  # obstore's not found
            raise CorruptLogError(f"staged run {handle} of {self.target} is gone") from None
        return bytes(raw)

    def discard_staged(self, handles: Sequence[str]) -> None:
        self._delete([self._staged_key(h) for h in handles])

    def _staged_under(self, batch_id: int | None) -> list[tuple[str, str, str]]:
        """(key, batch folder, name below it) of every staged object: a stream target's runs
        lie directly in the batch's folder, a Parquet target's files deeper."""
        import obstore

        prefix = self._key("staging") + "/"
        if batch_id is not None:
            prefix += f"{batch_id:020d}/"
        base = len(self._key("staging")) + 1

        def listing() -> list[tuple[str, str, str]]:
            out = []
            for chunk in obstore.list(store_for(self.loc), prefix):
                for m in chunk:
                    batch, _, name = m["path"][base:].partition("/")
                    out.append((m["path"], batch, name))
            return out

        return call(self.loc, "listing staged runs", listing)

    def drop_staging(self, batch_id: int) -> None:
        self._delete([key for key, _, _ in self._staged_under(batch_id)])

    def clean_staging(self, up_to: int) -> None:
        self._delete(
            [
                key
                for key, batch, _ in self._staged_under(None)
                if batch.isdigit() and int(batch) <= up_to
            ]
        )

    def staged(self) -> list[str]:
        return sorted(
            f"{int(batch)}/{name}" for _, batch, name in self._staged_under(None) if batch.isdigit()
        )

    # -- one commit at a time (Parquet targets) --

    @contextmanager
    def commit_lock(self) -> Iterator[None]:
        """Hold the target's commit lease (``_rowtime_sink/commit.lease``, as a partition's
        writer lease: compare-and-swap, renewed while held, ended by its holder's death after
        ``ROWTIME_LEASE_S``), waiting while another commit holds it."""
        lease = Lease(
            store_for(self.loc),
            self.loc,
            self._key("commit.lease"),
            f"the sink target {self.target}",
            lease_seconds(),
        )
        wait_for_lock(lease.acquire)
        try:
            yield
        finally:
            lease.release()

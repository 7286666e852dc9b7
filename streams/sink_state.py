"""The sink's state and target files: what the sink keeps beside (or with) a target, as every
backend keeps it.

The sink (``sink/``) writes a target exactly once through two seams of its own, beside the
stream contract of ``storage``:

* ``SinkState``: what a target is, who owns it, one manifest entry per batch, and the runs
  write tasks staged for a batch. The embedded log keeps it in a folder beside the target
  (``sink.layout.FolderSinkState``); a backend whose locations are on other machines keeps it
  itself, with the stream (Redis) or below the target (object storage): such a backend is a
  ``SupportsSinkState``, and ``backend_sink_state`` asks it;
* ``TargetFiles``: the files below a location, for the sink's Parquet and Delta targets
  where the backend keeps files itself (object storage: a ``SupportsTargetFiles``,
  asked by ``target_files``); elsewhere the sink keeps a local folder.

Both are capabilities of a ``Backend``, declared by the methods the two
protocols name and checked with ``isinstance``; ``tests/test_storage_contract.py`` runs both
over every backend. Where the stores take the same step, one function here takes it for all:
the target's description (``define_target_once``, ``check_sink_version``), its owner
(``claim_target``, ``owner_conflict``) and the latest entry (``latest_entry``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pyarrow as pa

from ..bounds.errors import CorruptLogError, OptionError
from ..bounds.versions import newer_format
from .storage import Backend, backend_for

if TYPE_CHECKING:
    from .segments import SegmentStats

__all__ = [
    "SINK_DIR",
    "SINK_FORMAT",
    "SINK_FORMAT_VERSION",
    "SINK_KIND_DELTA",
    "SINK_KIND_PARQUET",
    "SINK_KIND_STREAM",
    "SINK_TARGET_FILE",
    "RunChunks",
    "SinkState",
    "Staged",
    "SupportsSinkState",
    "SupportsTargetFiles",
    "TargetFiles",
    "backend_sink_state",
    "check_sink_version",
    "claim_target",
    "define_target_once",
    "latest_entry",
    "owner_conflict",
    "target_files",
]

#: The folder the sink keeps beside a target (``sink.layout`` describes what is in it), and
#: the file in it that says what the target is. Defined here, below both the sink that writes
#: them and the backends that look for them (``Backend.kind_at``, which
#: ``storage.what_is_at`` asks).
SINK_DIR = "_rowtime_sink"
SINK_TARGET_FILE = "target.json"
#: ``kind`` in the sink's target file.
SINK_KIND_STREAM = "stream"
SINK_KIND_PARQUET = "parquet"
SINK_KIND_DELTA = "delta"


#: A run's records as the appenders and sink states take them: Arrow tables or batches, in order.
RunChunks = Iterable[pa.Table | pa.RecordBatch]
#: What ``SinkState.stage_segment`` returns: the run's handle, and a function that returns
#: once the run is durable.
Staged = tuple[str, Callable[[], None]]


@runtime_checkable
class SinkState(Protocol):
    """Where the sink keeps the state of one stream target: what the target is, who owns it,
    one manifest entry (intent) per batch, and the runs write tasks staged for a batch.

    The embedded log keeps it in a folder beside the target (``sink.layout.FolderSinkState``); a
    backend serving locations on other machines (Redis) keeps it with the stream, so that the
    executors, which stage, and the driver, which commits, need no shared filesystem. Every
    write is atomic (a reader sees the old value or the new one) and durable as far as the
    backend's appends are; ``put_entry_once`` and ``define_target`` are won by exactly
    one of two concurrent callers. Staged runs are named by *handles* (strings) that the task
    reports carry to the driver.
    """

    #: The target's location as shown in messages (without a password).
    target: str

    def read_target(self) -> dict[str, Any] | None:
        """What the target is (its ``kind``), or None before ``define_target``."""
        ...

    def define_target(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Record what the target is, once; returns the recorded description (maybe an earlier
        one: the caller compares)."""
        ...

    def claim(self, query_id: str | None) -> None:
        """Make the target belong to the Spark query ``query_id`` (the first to claim it);
        another query is refused with ``owner_conflict``."""
        ...

    def batches(self) -> list[int]:
        """Batch ids with a manifest entry, ascending."""
        ...

    def entry(self, batch_id: int) -> dict[str, Any] | None:
        """The manifest entry of ``batch_id``, or None."""
        ...

    def latest(self, before: int | None = None) -> dict[str, Any] | None:
        """The entry of the highest batch id (below ``before`` if given), or None."""
        ...

    def put_entry_once(self, batch_id: int, doc: dict[str, Any]) -> bool:
        """Publish the entry of ``batch_id`` unless it exists; True if this call did."""
        ...

    def replace_entry(self, batch_id: int, doc: dict[str, Any]) -> None:
        """Write (or overwrite) the entry of ``batch_id``, durable when this returns."""
        ...

    def prune(self, keep: int = ...) -> None:
        """Drop all but the last ``keep`` entries (Spark replays only the latest batches)."""
        ...

    def stage_segment(
        self, batch_id: int, name: str, stats: SegmentStats, schema: pa.Schema, chunks: RunChunks
    ) -> Staged:
        """Stage one run of batch ``batch_id`` in the segment format (``stats`` in its footer,
        as ``segments.write_segment_file``); returns its handle and a function that
        returns once the run is durable (it may be called from another thread)."""
        ...

    def missing_staged(self, handles: Sequence[str]) -> list[str]:
        """Those of ``handles`` that are not staged (any more)."""
        ...

    def open_staged(self, handle: str) -> pa.Table:
        """A staged run's records, in the segment format."""
        ...

    def append_staged(self, appender: Any, handles: Sequence[str]) -> None:
        """Commit staged runs as the next records of the partition that ``appender`` (a
        ``writer.Writer`` holding its lock) writes, in order, trusting their footers
        (``Writer.append_segment_files(verify=False)``): atomic per call as the backend's
        appends are."""
        ...

    def discard_staged(self, handles: Sequence[str]) -> None:
        """Remove staged runs (a failed task's); a missing one is no error."""
        ...

    def drop_staging(self, batch_id: int) -> None:
        """Remove everything staged for batch ``batch_id``."""
        ...

    def clean_staging(self, up_to: int) -> None:
        """Remove what was staged for batches ``<= up_to`` (published, aborted or orphaned)."""
        ...

    def staged(self) -> list[str]:
        """The handles of every run staged now (for checks and tests)."""
        ...


#: What a sink target's description says it is (``format``), and the newest version of the
#: sink's state this code reads (``format_version``): the same in every store.
SINK_FORMAT = "pyspark-rowtime-sink"
SINK_FORMAT_VERSION = 1


def check_sink_version(doc: Any, where: str) -> Any:
    """``doc``, a target's description as stored at ``where``, unless a newer version of the
    sink's format wrote it (refused: its state may not mean what this version reads)."""
    if isinstance(doc, dict):
        version = doc.get("format_version", 1)
        if isinstance(version, int) and version > SINK_FORMAT_VERSION:
            raise newer_format(
                f"sink target {where}", version, SINK_FORMAT_VERSION, CorruptLogError
            )
    return doc


def define_target_once(
    doc: dict[str, Any],
    create: Callable[[dict[str, Any]], bool],
    read: Callable[[], dict[str, Any] | None],
) -> dict[str, Any]:
    """``SinkState.define_target`` for every store: ``doc`` with the format's name and
    version, written by ``create`` (True when this call wrote it, False when one was there),
    else the one ``read`` finds (the caller compares)."""
    full = {"format": SINK_FORMAT, "format_version": SINK_FORMAT_VERSION, **doc}
    if create(full):
        return full
    existing = read()
    assert existing is not None
    return existing


def claim_target(target: str, query_id: str | None, claim: Callable[[dict[str, Any]], Any]) -> None:
    """``SinkState.claim`` for every store: ``claim(doc)`` records ``doc`` as the owner
    unless one is recorded, and returns the recorded owner (None if none could be read).

    The first query to commit to a target becomes its owner. Another query (a new checkpoint)
    would restart batch ids at 0 and could neither be told apart from a replay nor keep the
    clock's promise, so it is refused with an error that says what to do."""
    if query_id is None:
        return
    owner = claim({"query_id": query_id})
    theirs = owner.get("query_id") if isinstance(owner, dict) else None
    if theirs != query_id:
        raise owner_conflict(target, theirs, query_id)


def latest_entry(store: SinkState, before: int | None = None) -> dict[str, Any] | None:
    """The manifest entry of ``store``'s highest batch id (below ``before`` if given), or None:
    ``SinkState.latest`` for every backend."""
    ids = store.batches()
    if before is not None:
        ids = [b for b in ids if b < before]
    for batch_id in reversed(ids):
        doc = store.entry(batch_id)
        if doc is not None:  # pruned meanwhile: try the one before
            return doc
    return None


def owner_conflict(target: str, theirs: str | None, mine: str | None) -> OptionError:
    """The error of a query writing a sink target another query owns (every store's)."""
    return OptionError(
        f"sink target {target} is written by another streaming query (id {theirs}), "
        f"not by this one (id {mine}): a target belongs to one query, so that a "
        "replayed batch is recognised and its clock never goes back. Restart the query "
        "that owns it from its checkpoint, or write to a new path (to start over, delete "
        f"the target including its sink state, {SINK_DIR}/ beside a folder)"
    )


@runtime_checkable
class TargetFiles(Protocol):
    """Files below one location of a backend that keeps files itself (object storage): what the
    sink's Parquet target needs where it cannot use a local folder (``sink.parquet_target``
    keeps a local folder otherwise). Names are relative to the location, ``/``-separated.

    Every operation is safe without a lock server: an output appears whole when closed or not
    at all (a killed writer leaves nothing under its name), ``create_json`` is won by
    exactly one of two callers, ``advance_json`` is a compare-and-swap, and
    ``publish`` may be repeated (a commit replayed after a crash)."""

    #: The location as shown in messages (no secret).
    location: str

    def open_output(self, name: str) -> Any:
        """A writable binary file for ``name`` (pyarrow writes Parquet into it); the object
        exists, durable and whole, once ``close_output`` returns."""
        ...

    def close_output(self, out: Any, name: str) -> None:
        """Finish ``out`` (from ``open_output``); durable when this returns."""
        ...

    def publish(self, src: str, dst: str) -> bool:
        """Put ``src``'s bytes at ``dst`` unless ``dst`` holds them already (a repeat): True
        when ``dst`` holds them on return, False when ``src`` is gone and ``dst`` absent."""
        ...

    def exists(self, name: str) -> bool:
        """Whether ``name`` exists."""
        ...

    def create_json(self, name: str, doc: Any) -> bool:
        """Create ``name`` holding ``doc`` unless it exists; True if this call did."""
        ...

    def read_json(self, name: str) -> Any | None:
        """The document at ``name``, or None when there is none."""
        ...

    def read_text(self, name: str) -> str | None:
        """The text (UTF-8) at ``name``, or None when there is none (a Spark checkpoint's
        files, which the sink reads)."""
        ...

    def read_bytes(self, name: str) -> bytes | None:
        """The bytes at ``name`` (a published Parquet file, say), or None when there is none."""
        ...

    def advance_json(self, name: str, doc: Any, newer: Callable[[Any | None], bool]) -> None:
        """Replace ``name`` with ``doc`` while ``newer(current)`` holds for what is there,
        by compare-and-swap (a racing writer's newer document is never overwritten)."""
        ...

    def list(self, prefix: str) -> list[str]:
        """The names of every object below ``prefix`` (a folder name), sorted."""
        ...

    def remove(self, names: Sequence[str]) -> None:
        """Remove ``names``; a missing one is no error."""
        ...


@runtime_checkable
class SupportsSinkState(Backend, Protocol):
    """A backend that keeps the sink's state of a stream target itself (Redis: with the
    stream; object storage: below the target), so that the executors, which stage, and the
    driver, which commits, need no shared filesystem."""

    def sink_state(self, resolved: str) -> SinkState:
        """The sink's state of the stream target at the resolved location."""
        ...


@runtime_checkable
class SupportsTargetFiles(Backend, Protocol):
    """A backend that keeps files itself (object storage): the sink's Parquet and Delta
    targets write below its locations through ``TargetFiles``."""

    def target_files(self, resolved: str) -> TargetFiles:
        """The files below the resolved location."""
        ...


def backend_sink_state(location: str | os.PathLike[str]) -> SinkState | None:
    """The sink's state of a stream target at ``location`` when its backend keeps one itself
    (``SupportsSinkState``), or None: the sink then keeps a folder beside the target
    (``sink.layout.open_sink_state`` decides)."""
    backend = backend_for(location)
    if not isinstance(backend, SupportsSinkState):
        return None
    return backend.sink_state(backend.resolve(os.fspath(location)))


def target_files(location: str | os.PathLike[str]) -> TargetFiles | None:
    """The files below ``location`` when its backend keeps files itself
    (``SupportsTargetFiles``), or None: a local folder (the embedded log's backend), or
    a backend that keeps no files (Redis), which the caller tells apart with
    ``backend_sink_state``."""
    backend = backend_for(location)
    if not isinstance(backend, SupportsTargetFiles):
        return None
    return backend.target_files(backend.resolve(os.fspath(location)))

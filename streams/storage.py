"""The storage seam: what the rest of the project needs from a stream, and who serves a location.

Everything above ``streams/`` (the reader's planner and executors in ``datasource/``, the sink in
``sink/``, the CLI and the adapter API in the face package) reaches records only through the two
interfaces below, and never names a backend. A backend is a package (the embedded log
:mod:`.local`, Redis :mod:`.redis`): it implements :class:`StreamStorage` and
:class:`PartitionAppender`, wraps them in a :class:`Backend`, and names that object in an entry
point of the group :data:`ENTRY_POINT_GROUP` for each URL scheme it serves (``file`` also serves
plain paths). :func:`backend_for` loads a backend the first time a location of its scheme is
used, so a user of one backend never imports another's package or client library. This
package's own backends are also named in :data:`PACKAGED`, which finds them without reading
any distribution's metadata (and where it is missing). What only some backends can do is a
capability the caller looks for with ``getattr`` (``sink_store``, ``target_files`` and
``entry_source`` on a :class:`Backend`; ``retention``, ``set_retention``, ``trim_partition``,
``stored_bytes``, ``verify`` on a stream). Nothing in ``datasource/``, ``sink/``,
``connectors/`` or the face changes for a new backend.

Units and ends, for every backend:

* times are ``int`` microseconds since the Unix epoch, UTC; ``None`` means "no time yet";
* a partition is numbered ``0 .. partitions - 1``; a record's *offset* counts the records before
  it in its partition from 0; ranges of offsets are half-open ``[start, end)``; ``end_offset`` is
  the offset the next record gets (the number of committed records);
* a *record* is a data row or a bound record; both take an offset;
* records are read with the *system columns* of :mod:`.columns` first (``__arrival_us``,
  ``__rowtime_us``, ``__is_bound``), then the payload columns (nullable; null on bound records).

Guarantees every backend gives (the reader and the sink rely on them):

* **committed is immutable**: the records below ``end_offset`` never change, so a range read
  twice gives the same table, and a reader may cache what it read;
* **appends are atomic and durable**: an append (a run, or a list of segment files) is visible
  to readers wholly or not at all, and survives a crash once the call returns;
* **one appender per partition**: :meth:`StreamStorage.lock_partition` refuses a second holder
  with :class:`~pyspark_rowtime.bounds.errors.WriterLockedError`, and the lock dies with its
  holder's process (never a stale lock);
* **the clock** of a partition is the highest bound or data rowtime (explicit, or arrival for
  implicit rows) of its committed records; the stream clock is the minimum over partitions
  (None while any is empty);
* **retention removes a prefix, offsets stay** (SPEC 12, :mod:`.retention`): records may be
  removed only from the head of a partition, whole stored units at a time, and never the last
  unit; :meth:`StreamStorage.start_offset` is the first kept offset (0 until a trim) and
  :meth:`StreamStorage.trim_state` the policy state there, stored with the trim. A read that
  starts below the first kept offset raises :class:`~.retention.DataLossError` naming stream,
  partition and that offset (or, if the reader still holds the records, returns them as they
  were: committed records never change, they only go away). Committed records at or after the
  first kept offset are immutable as before.

What sits at a location (a stream, a pending sink target, a Parquet target, nothing) is decided
by :func:`what_is_at` alone: the reader, ``get_rowtime_bound`` and the CLI all ask it.

Where the backends take the same step, one function here takes it for all: the message of a
missing stream (:func:`stream_not_found`), the checks of a partition number, of a run's first
offset (:func:`check_continues`: a run that does not start at the partition's end commits
nothing) and of a read, and the sink state's target description and owner
(:func:`define_target_once`, :func:`claim_target`). ``tests/test_storage_contract.py`` runs one
suite of these guarantees against every backend.
"""

from __future__ import annotations

import enum
import importlib
import os
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pyarrow as pa

from ..bounds.errors import CorruptLogError, OptionError, SchemaError, StreamNotFoundError
from ..bounds.redaction import redact, split_userinfo
from ..bounds.versions import newer_format

if TYPE_CHECKING:
    from .meta import StreamMeta
    from .retention import TrimState
    from .segments import SegmentStats

__all__ = [
    "MAX_PARTITIONS",
    "SINK_DIR",
    "SINK_TARGET_FILE",
    "Backend",
    "Location",
    "LocationKind",
    "PartitionAppender",
    "PartitionTail",
    "SinkStore",
    "StreamStorage",
    "TargetFiles",
    "backend_for",
    "create_storage",
    "local_path",
    "open_storage",
    "owner_conflict",
    "register_backend",
    "resolve",
    "sink_store",
    "target_files",
    "what_is_at",
]

#: The folder the sink keeps beside a target (``sink.layout`` describes what is in it), and
#: the file in it that says what the target is. Defined here, below both the sink that writes
#: them and the readers that look for them, so that :func:`what_is_at` decides alone.
SINK_DIR = "_rowtime_sink"
SINK_TARGET_FILE = "target.json"
#: ``kind`` in the sink's target file.
SINK_KIND_STREAM = "stream"
SINK_KIND_PARQUET = "parquet"
SINK_KIND_DELTA = "delta"


#: A run's records as the appenders and sink stores take them: Arrow tables or batches, in order.
RunChunks = Iterable[pa.Table | pa.RecordBatch]
#: What :meth:`SinkStore.stage_segment` returns: the run's handle, and a function that returns
#: once the run is durable.
Staged = tuple[str, Callable[[], None]]


@dataclass(frozen=True)
class PartitionTail:
    """Where a partition ends now.

    ``end`` is the offset the next record gets; ``clock_us`` the partition clock (None while
    the partition is empty); ``last_arrival_us`` the arrival time of its last record (None
    while empty). Arrival times never go down within a partition, across writers too.
    """

    end: int = 0
    clock_us: int | None = None
    last_arrival_us: int | None = None


@runtime_checkable
class PartitionAppender(Protocol):
    """Exclusive append access to one partition, from :meth:`StreamStorage.lock_partition`
    until :meth:`release`. Not shared between threads without the caller's own lock."""

    partition: int

    def tail(self) -> PartitionTail:
        """The partition's committed end, clock and last arrival (as the holder sees them:
        nobody else appends while the lock is held)."""
        ...

    def append_run(self, stats: SegmentStats, chunks: Sequence[pa.Table | pa.RecordBatch]) -> None:
        """Commit records ``[stats.first, stats.end)``: ``chunks`` in the stream's record
        schema (:attr:`StreamStorage.file_schema`), summarised by ``stats``
        (:mod:`.segments`). ``stats.first`` is :meth:`tail`'s ``end``. Atomic and durable when
        it returns; on error nothing is committed."""
        ...

    def append_segment_files(self, paths: Sequence[str], *, reject: bool, verify: bool) -> None:
        """Commit files written in the segment format (:func:`.segments.write_segment_file`)
        as the partition's next records, in order. Every file is checked to continue the
        partition (:func:`.segments.check_segment_files`; ``reject``: the stream's order is
        ``reject``, so no data row may go below the clock; ``verify=False`` trusts the footers
        and reads no record) before any is committed; if a check fails nothing is."""
        ...

    def release(self) -> None:
        """Give the partition up (idempotent). Also happens when the process dies."""
        ...


@runtime_checkable
class StreamStorage(Protocol):
    """A stream's committed records, as one backend keeps them. Safe to share between threads
    for reading; cheap to open. See the module docstring for units, ends and guarantees."""

    #: Where the stream is: an absolute local path (embedded log) or the backend's URL.
    location: str
    #: Payload schema, partition count and ops' defaults (:class:`.meta.StreamMeta`).
    meta: StreamMeta

    @property
    def file_schema(self) -> pa.Schema:
        """The columns a read returns with ``columns=None``: system columns, then payload."""
        ...

    def end_offset(self, partition: int) -> int:
        """The number of committed records of ``partition``: reads may go up to it."""
        ...

    def tail(self, partition: int) -> PartitionTail:
        """End, clock and last arrival of ``partition`` from one consistent look."""
        ...

    def clock_us(self, partition: int) -> int | None:
        """The partition clock in microseconds; None while the partition is empty."""
        ...

    def stream_clock_us(self) -> int | None:
        """The minimum of the partition clocks; None while any partition is empty."""
        ...

    def partition_stats(self, partition: int) -> list[SegmentStats]:
        """Summaries of the committed records of ``partition`` in offset order, one per run
        as the backend keeps them (they tile ``[start_offset, end_offset)``; the first may
        begin before :meth:`start_offset` where a merge raced with a trim)."""
        ...

    def start_offset(self, partition: int) -> int:
        """The first kept offset of ``partition``: 0 until retention (or ``rowtime trim``)
        removed records before it. Offsets never change: the next record still gets
        :meth:`end_offset`."""
        ...

    def trim_state(self, partition: int) -> TrimState:
        """The partition's trim (:class:`~.retention.TrimState`): its first kept offset and the
        largest rowtime and bound before it, from which a reader's policy state there follows
        (:meth:`~.retention.TrimState.policy_state`)."""
        ...

    def read(
        self, partition: int, start: int, end: int, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """Records ``[start, end)`` of ``partition`` in offset order, as Arrow. ``columns``
        picks columns by name (system columns included), None means all. ``end`` may not
        pass :meth:`end_offset` (an :class:`OptionError` says so)."""
        ...

    def lock_partition(self, partition: int, where: str) -> PartitionAppender:
        """The partition's one appender (``where`` names it in errors); raises
        :class:`WriterLockedError` while another holder lives."""
        ...


def stream_not_found(given: str, location: str, why: str, also: str = "") -> StreamNotFoundError:
    """The error of every backend's open where no stream is: ``given`` as the caller wrote it,
    ``why`` (what is missing, in the backend's terms), how to create one at ``location`` (from
    Python and from the shell), and ``also`` (another way the backend offers)."""
    return StreamNotFoundError(
        f"no rowtime stream at {given!r} ({why}). Create one with "
        f"pyspark_rowtime.create_stream({location!r}, schema) or "
        f"`rowtime create {location} --schema 'a INT, b STRING'`{also}"
    )


def check_partition(location: str, partitions: int, partition: Any) -> None:
    """What every backend checks of a partition number, with one message: an int in
    ``0 .. partitions - 1`` of the stream at ``location``."""
    n = partitions
    if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < n:
        raise OptionError(
            f"partition {partition!r} does not exist in stream {location}: it has {n} "
            f"partition{'s' if n != 1 else ''}, numbered 0 to {n - 1}"
        )


def check_continues(where: str, first: int, end: int) -> None:
    """What every appender checks before a run commits: it starts where the partition ends
    (:meth:`PartitionAppender.append_run`), or nothing is written (a stale writer, a gap)."""
    if first != end:
        raise CorruptLogError(
            f"{where}: a run from offset {first}, and the partition ends at {end}"
        )


def check_read(
    schema: pa.Schema, columns: Sequence[str] | None, start: Any, end: Any, location: str
) -> list[str]:
    """What every backend's :meth:`StreamStorage.read` checks first, with one message each: the
    range ``[start, end)`` (ints, ``0 <= start <= end``) and the columns; returns the names the
    read returns (all of ``schema`` for None)."""
    if (
        isinstance(start, bool)
        or isinstance(end, bool)
        or not isinstance(start, int)
        or not isinstance(end, int)
        or not 0 <= start <= end
    ):
        raise OptionError(
            f"read range [{start!r}, {end!r}) is not valid: need 0 <= start <= end (ints)"
        )
    return pick_columns(schema, columns, location)


def pick_columns(schema: pa.Schema, columns: Sequence[str] | None, location: str) -> list[str]:
    """The names a read of ``columns`` returns (all of ``schema`` for None), checked: unknown
    names are refused with one message, naming the stream."""

    names = schema.names
    if columns is None:
        return names
    if isinstance(columns, str):
        raise SchemaError(f"columns must be a list of names, got the string {columns!r}")
    unknown = [c for c in columns if c not in names]
    if unknown:
        raise SchemaError(
            f"stream {location} has no column {', '.join(map(repr, unknown))}; its "
            f"columns are {', '.join(names)}"
        )
    return list(columns)


class SinkStore(Protocol):
    """Where the sink keeps the state of one stream target: what the target is, who owns it,
    one manifest entry (intent) per batch, and the runs write tasks staged for a batch.

    The embedded log keeps it in a folder beside the target (``sink.layout.SinkState``); a
    backend serving locations on other machines (Redis) keeps it with the stream, so that the
    executors, which stage, and the driver, which commits, need no shared filesystem. Every
    write is atomic (a reader sees the old value or the new one) and durable as far as the
    backend's appends are; :meth:`put_entry_once` and :meth:`define_target` are won by exactly
    one of two concurrent callers. Staged runs are named by *handles* (strings) that the task
    reports carry to the driver.
    """

    #: The target's location as shown in messages (without a password).
    target: str

    def read_target(self) -> dict[str, Any] | None:
        """What the target is (its ``kind``), or None before :meth:`define_target`."""
        ...

    def define_target(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Record what the target is, once; returns the recorded description (maybe an earlier
        one: the caller compares)."""
        ...

    def claim(self, query_id: str | None) -> None:
        """Make the target belong to the Spark query ``query_id`` (the first to claim it);
        another query is refused with :func:`owner_conflict`."""
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
        as :func:`.segments.write_segment_file`); returns its handle and a function that
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
        :class:`.writer.Writer` holding its lock) writes, in order, trusting their footers
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
    """:meth:`SinkStore.define_target` for every store: ``doc`` with the format's name and
    version, written by ``create`` (True when this call wrote it, False when one was there),
    else the one ``read`` finds (the caller compares)."""
    full = {"format": SINK_FORMAT, "format_version": SINK_FORMAT_VERSION, **doc}
    if create(full):
        return full
    existing = read()
    assert existing is not None
    return existing


def claim_target(target: str, query_id: str | None, claim: Callable[[dict[str, Any]], Any]) -> None:
    """:meth:`SinkStore.claim` for every store: ``claim(doc)`` records ``doc`` as the owner
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


def latest_entry(store: SinkStore, before: int | None = None) -> dict[str, Any] | None:
    """The manifest entry of ``store``'s highest batch id (below ``before`` if given), or None:
    :meth:`SinkStore.latest` for every backend."""
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


def sink_store(location: str | os.PathLike[str]) -> SinkStore | None:
    """The sink state store of a stream target at ``location`` when its backend keeps one
    itself (Redis: with the stream), or None: the sink then keeps a folder beside the target."""
    store: SinkStore | None = _capability(location, "sink_store")
    return store


def _capability(location: str | os.PathLike[str], name: str) -> Any:
    """What the backend of ``location`` makes with its capability ``name`` for the resolved
    location, or None when it has no such capability."""
    backend = backend_for(location)
    make = getattr(backend, name, None)
    return None if make is None else make(backend.resolve(os.fspath(location)))


class TargetFiles(Protocol):
    """Files below one location of a backend that keeps files itself (object storage): what the
    sink's Parquet target needs where it cannot use a local folder (``sink.parquet_target``
    keeps a local folder otherwise). Names are relative to the location, ``/``-separated.

    Every operation is safe without a lock server: an output appears whole when closed or not
    at all (a killed writer leaves nothing under its name), :meth:`create_json` is won by
    exactly one of two callers, :meth:`advance_json` is a compare-and-swap, and
    :meth:`publish` may be repeated (a commit replayed after a crash)."""

    #: The location as shown in messages (no secret).
    location: str

    def open_output(self, name: str) -> Any:
        """A writable binary file for ``name`` (pyarrow writes Parquet into it); the object
        exists, durable and whole, once :meth:`close_output` returns."""
        ...

    def close_output(self, out: Any, name: str) -> None:
        """Finish ``out`` (from :meth:`open_output`); durable when this returns."""
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


def target_files(location: str | os.PathLike[str]) -> TargetFiles | None:
    """The files below ``location`` when its backend keeps files itself (object storage), or
    None: a local folder (the embedded log's backend), or a backend that keeps no files
    (Redis), which the caller tells apart with :func:`sink_store`."""
    files: TargetFiles | None = _capability(location, "target_files")
    return files


class LocationKind(enum.Enum):
    """What sits at a location."""

    #: a rowtime stream (readable, writable)
    STREAM = "stream"
    #: a stream target of the sink whose query has not committed its first batch (which
    #: creates the stream): no stream yet, its clock reads as none
    PENDING_STREAM_TARGET = "pending stream target"
    #: a Parquet target of the sink (its clock is the sink's, ``sink.parquet_target``)
    PARQUET_TARGET = "parquet target"
    #: a Delta table the sink writes (its clock is an app transaction, ``streams.tables``)
    DELTA_TARGET = "delta target"
    #: an Iceberg table (``iceberg://``; its clock is a table property, ``streams.tables``)
    ICEBERG_TARGET = "iceberg target"
    #: nothing this project wrote
    NOTHING = "nothing"


@dataclass(frozen=True)
class Location:
    """The answer of :func:`what_is_at`: the location as given, resolved, and its kind."""

    given: str
    resolved: str
    kind: LocationKind


class Backend(Protocol):
    """One kind of storage, serving the locations of its URL scheme(s)."""

    def resolve(self, location: str) -> str:
        """The canonical form of ``location`` (an absolute path for local files). Raises
        :class:`OptionError` naming the location when it is not one of this backend's."""
        ...

    def kind_at(self, resolved: str) -> LocationKind:
        """What sits at the resolved location."""
        ...

    def open(self, resolved: str, given: str) -> StreamStorage:
        """The stream at the resolved location; :class:`StreamNotFoundError` naming ``given``
        and how to create one when there is none."""
        ...

    def create(
        self, resolved: str, schema: str | pa.Schema, partitions: int, defaults: dict[str, Any]
    ) -> StreamStorage:
        """Create the stream (or open the identical one that exists), see
        :func:`.local.log.create_stream` for the rules."""
        ...


#: The entry-point group storage backends are found in. An entry point's name is a URL scheme
#: (lower case; ``file`` also serves plain paths), its value the :class:`Backend` object, as in
#: pyproject.toml::
#:
#:     [project.entry-points."pyspark_rowtime.backends"]
#:     redis = "pyspark_rowtime.streams.redis:BACKEND"
ENTRY_POINT_GROUP = "pyspark_rowtime.backends"
#: The scheme whose backend serves plain paths (a location without ``://``).
PATH_SCHEME = "file"

_BACKENDS: dict[str, Backend] = {}


def register_backend(schemes: Iterable[str], backend: Backend) -> None:
    """Serve locations whose URL scheme is one of ``schemes`` (lower case; ``""`` is a plain
    path) with ``backend``. A later registration of a scheme replaces the earlier one, and a
    registration wins over the entry points (tests, or a backend outside any distribution)."""
    for scheme in schemes:
        _BACKENDS[scheme.lower()] = backend


#: The backends this package carries, by scheme: the module under ``streams/`` whose
#: ``BACKEND`` serves it. pyproject.toml declares the same as entry points (tests/test_storage.py
#: holds the two equal); these are found without reading the metadata of every installed
#: distribution, a cost paid again in each Spark Python process that opens a stream
#: (``importlib.metadata`` lists every entry on the path, and Spark puts its spark-core jar,
#: thousands of entries, on that path). Other schemes are looked up in the entry points.
PACKAGED: dict[str, str] = {
    "": "local",
    "file": "local",
    "redis": "redis",
    "rediss": "redis",
    **dict.fromkeys(("s3", "s3a", "az", "azure", "abfs", "abfss"), "objstore"),
    "iceberg": "tables",
}


def _entry_points() -> dict[str, Any]:
    """The group's entry points by scheme (from the installed distributions' metadata)."""
    return {ep.name.lower(): ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _import_backend(scheme: str, load: Callable[[], Backend], where: str) -> Backend:
    try:
        return load()
    except ImportError as e:
        raise OptionError(
            f"the storage backend of {scheme or PATH_SCHEME}:// locations ({where}) "
            f"cannot be imported ({e}): install what it needs (an extra of its package)"
        ) from None


def _load(scheme: str) -> Backend | None:
    """The backend of ``scheme``: registered, else this package's own (:data:`PACKAGED`, also
    where no metadata is installed: the package shipped to executors as a zip by
    ``--py-files``), else another distribution's entry point, each loaded now (only the one
    asked for: a location of one backend imports no other backend's package)."""
    backend = _BACKENDS.get(scheme)
    if backend is not None:
        return backend
    own = PACKAGED.get(scheme)
    if own is not None:
        module = f"{__name__.rpartition('.')[0]}.{own}"
        loaded = _import_backend(
            scheme, lambda: importlib.import_module(module).BACKEND, f"{module}:BACKEND"
        )
        return _BACKENDS.setdefault(scheme, loaded)
    ep = _entry_points().get(scheme or PATH_SCHEME)
    if ep is not None:
        return _BACKENDS.setdefault(scheme, _import_backend(scheme, ep.load, ep.value))
    return None


def _known_schemes() -> list[str]:
    """Every URL scheme some backend serves (registered, packaged, or an entry point)."""
    return sorted((set(_BACKENDS) | set(PACKAGED) | set(_entry_points())) - {""})


def _scheme(location: str | os.PathLike[str]) -> str:
    if isinstance(location, os.PathLike):
        return ""
    if not isinstance(location, str) or not location:
        raise OptionError(f"a stream location must be a path or a URL, got {location!r}")
    if "://" not in location:
        return ""
    # Not urllib: it reads the whole URL, and a password holding "[" fails it (Invalid IPv6).
    head = split_userinfo(location)[0]
    return head[: -len("://")].lower()


#: The most partitions a stream may be created with (the catalog, ``rowtime create``, the sink's
#: ``partitions`` and :func:`create_storage` all hold to it): each partition is a writer, a lock,
#: a clock and a folder or set of keys, and a planner reads every partition's tail each step.
MAX_PARTITIONS = 10_000


#: The project's one redaction (:mod:`..bounds.redaction`), under the name this module has
#: always exported it by.
redact_url = redact


def local_path(location: str | os.PathLike[str]) -> str:
    """An absolute local path for a path or ``file://`` URL (the embedded log's locations, a
    checkpoint): no backend is asked."""
    if isinstance(location, os.PathLike):
        location = os.fspath(location)
    if not isinstance(location, str) or not location:
        raise OptionError(f"a stream location must be a path or a file:// URL, got {location!r}")
    if "://" in location:
        head, user, _, _ = split_userinfo(location)
        scheme = head[: -len("://")].lower()
        if scheme != "file":
            raise OptionError(
                f"stream location {redact_url(location)!r}: only local paths and file:// URLs are "
                f"supported by the embedded log (not {scheme}://)"
            )
        try:
            url = urllib.parse.urlparse(location)
        except ValueError:  # an unclosed "[" of a host: urllib's text would quote it
            url = None
        if user is not None:  # not shown: it may hold a password, written unencoded
            raise OptionError(
                "a file:// stream location carries a user or a password (not shown): a file:// "
                "URL names a local path (file:///abs/path); credentials are not supported"
            )
        if url is None or url.netloc not in ("", "localhost"):
            raise OptionError(
                f"stream location {redact_url(location)!r}: a file:// URL names a local path "
                "(file:///abs/path); remote hosts are not supported"
            )
        location = urllib.parse.unquote(url.path)
    return os.path.abspath(os.path.expanduser(location))


def backend_for(location: str | os.PathLike[str]) -> Backend:
    """The backend serving ``location``, by its URL scheme (a plain path: the ``file`` one),
    found through :data:`ENTRY_POINT_GROUP` the first time a location of its scheme is used."""
    scheme = _scheme(location)
    backend = _load(scheme)
    if backend is None:
        known = ", ".join(f"{s}:// URLs" for s in _known_schemes())
        raise OptionError(
            f"stream location {redact_url(str(location))!r}: only local paths and {known} are "
            "supported "
            f"(not {scheme}://); no storage backend is registered for {scheme}://"
        )
    return backend


def resolve(location: str | os.PathLike[str]) -> str:
    """``location`` in its backend's canonical form (an absolute path for local files)."""
    return backend_for(location).resolve(os.fspath(location))


def what_is_at(location: str | os.PathLike[str]) -> Location:
    """What sits at ``location`` (a path or URL): the one place that decides it."""
    backend = backend_for(location)
    given = os.fspath(location)
    resolved = backend.resolve(given)
    return Location(given, resolved, backend.kind_at(resolved))


def open_storage(location: str | os.PathLike[str]) -> StreamStorage:
    """The stream at ``location``, from the backend serving its scheme."""
    backend = backend_for(location)
    given = os.fspath(location)
    return backend.open(backend.resolve(given), given)


def create_storage(
    location: str | os.PathLike[str],
    schema: str | pa.Schema,
    partitions: int = 1,
    **defaults: Any,
) -> StreamStorage:
    """Create the stream at ``location`` (or open the identical one) with its backend; at most
    :data:`MAX_PARTITIONS` partitions."""
    if (
        not isinstance(partitions, bool)
        and isinstance(partitions, int)
        and partitions > MAX_PARTITIONS
    ):
        raise OptionError(
            f"stream {redact(os.fspath(location))!r}: partitions={partitions} is more than "
            f"{MAX_PARTITIONS}, the most a stream may have (each partition is a writer, a lock "
            "and a clock that every query's planner reads); use fewer"
        )
    backend = backend_for(location)
    return backend.create(backend.resolve(os.fspath(location)), schema, partitions, defaults)

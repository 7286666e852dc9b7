"""The storage seam: what the rest of the project needs from a stream, and who serves a location.

Everything above ``streams/`` (the reader's planner and executors in ``datasource/``, the sink
in ``sink/``, the CLI and the adapter API in the face package) reaches records only through the
two interfaces below, and never names a backend. A backend is a package (the embedded log
``local``, Redis ``redis``, object storage ``objstore``): it implements
``StreamStorage`` and ``PartitionAppender``, wraps them in a ``Backend``, and
names that object in an entry point of the group ``ENTRY_POINT_GROUP`` for each URL scheme
it serves (``file`` also serves plain paths). ``backend_for`` loads a backend the first time
a location of its scheme is used, so a user of one backend never imports another's package or
client library. This package's own backends are also named in ``PACKAGED``, which finds them
without reading any distribution's metadata (and where it is missing). What every backend must
do is ``StreamStorage`` and ``Backend``, called directly; what only some can do is a
*capability*, a protocol of its own checked with ``isinstance`` (never probed by name):

* on a stream: ``SupportsTrim`` (a retention, and trims of a partition's head: every
  backend of this package), ``SupportsVerify`` (every record batch against its checksum),
  ``SupportsStoredBytes`` (the bytes a partition takes), ``SupportsWriterOf`` (who
  holds a partition's lock, without taking it);
* on a backend: ``SupportsEntrySource`` (entries others append, for a connector), and the
  sink's ``SupportsSinkState`` and ``SupportsTargetFiles``
  (``sink_state``, the sink's own seams: its state and its target files).

A backend declares a capability by having its methods; ``tests/test_layers.py`` fails on a
``getattr`` or ``hasattr`` naming a member of the contract. Nothing in ``datasource/``,
``sink/``, ``connectors/`` or the face changes for a new backend.

Units and ends, for every backend:

* times are ``int`` microseconds since the Unix epoch, UTC; ``None`` means "no time yet";
* a partition is numbered ``0 .. partitions - 1``; a record's *offset* counts the records before
  it in its partition from 0; ranges of offsets are half-open ``[start, end)``; ``end_offset`` is
  the offset the next record gets (the number of committed records);
* a *record* is a data row or a bound record; both take an offset;
* records are read with the *system columns* of ``columns`` first (``__arrival_us``,
  ``__rowtime_us``, ``__is_bound``), then the payload columns (nullable; null on bound records).

Guarantees every backend gives (the reader and the sink rely on them):

* **committed is immutable**: the records below ``end_offset`` never change, so a range read
  twice gives the same table, and a reader may cache what it read;
* **appends are atomic and durable**: an append (a run, or a list of segment files) is visible
  to readers wholly or not at all, and survives a crash once the call returns;
* **one appender per partition**: ``StreamStorage.lock_partition`` refuses a second holder
  with ``WriterLockedError``, and the lock dies with its
  holder's process (never a stale lock);
* **the clock** of a partition is the highest bound or data rowtime (explicit, or arrival for
  implicit rows) of its committed records; the stream clock is the minimum over partitions
  (None while any is empty);
* **retention removes a prefix, offsets stay** (SPEC 12, ``retention``): records may be
  removed only from the head of a partition, whole stored units at a time, and never the last
  unit; ``StreamStorage.start_offset`` is the first kept offset (0 until a trim) and
  ``StreamStorage.trim_state`` the policy state there, stored with the trim. A read that
  starts below the first kept offset raises ``DataLossError`` naming stream,
  partition and that offset (or, if the reader still holds the records, returns them as they
  were: committed records never change, they only go away). Committed records at or after the
  first kept offset are immutable as before.

What sits at a location (a stream, a pending sink target, a Parquet target, nothing) is decided
by ``what_is_at`` alone: the reader, ``get_rowtime_bound`` and the CLI all ask it.

Where the backends take the same step, one function here takes it for all: the message of a
missing stream (``stream_not_found``), the checks of a partition number, of a run's first
offset (``check_continues``: a run that does not start at the partition's end commits
nothing) and of a read. ``tests/test_storage_contract.py`` runs one suite of these guarantees
and every capability against every backend (each declares the capabilities it has, and the
suite holds it to them).
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

if TYPE_CHECKING:
    from .meta import StreamMeta
    from .retention import Retention, TrimResult, TrimState, Unit
    from .segments import SegmentStats

__all__ = [
    "MAX_PARTITIONS",
    "Backend",
    "Location",
    "LocationKind",
    "PartitionAppender",
    "PartitionTail",
    "StreamStorage",
    "SupportsEntrySource",
    "SupportsStoredBytes",
    "SupportsTrim",
    "SupportsVerify",
    "SupportsWriterOf",
    "backend_for",
    "create_stream",
    "local_path",
    "open_stream",
    "register_backend",
    "resolve",
    "what_is_at",
]


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
    """Exclusive append access to one partition, from ``StreamStorage.lock_partition``
    until ``release``. Not shared between threads without the caller's own lock."""

    partition: int

    def tail(self) -> PartitionTail:
        """The partition's committed end, clock and last arrival (as the holder sees them:
        nobody else appends while the lock is held)."""
        ...

    def append_run(self, stats: SegmentStats, chunks: Sequence[pa.Table | pa.RecordBatch]) -> None:
        """Commit records ``[stats.first, stats.end)``: ``chunks`` in the stream's record
        schema (``StreamStorage.file_schema``), summarised by ``stats``
        (``segments``). ``stats.first`` is ``tail``'s ``end``. Atomic and durable when
        it returns; on error nothing is committed."""
        ...

    def append_segment_files(self, paths: Sequence[str], *, reject: bool, verify: bool) -> None:
        """Commit files written in the segment format (``segments.write_segment_file``)
        as the partition's next records, in order. Every file is checked to continue the
        partition (``segments.check_segment_files``; ``reject``: the stream's order is
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
    #: Payload schema, partition count and ops' defaults (``meta.StreamMeta``).
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
        begin before ``start_offset`` where a merge raced with a trim)."""
        ...

    def start_offset(self, partition: int) -> int:
        """The first kept offset of ``partition``: 0 until retention (or ``rowtime trim``)
        removed records before it. Offsets never change: the next record still gets
        ``end_offset``."""
        ...

    def trim_state(self, partition: int) -> TrimState:
        """The partition's trim (``TrimState``): its first kept offset and the
        largest rowtime and bound before it, from which a reader's policy state there follows
        (``policy_state``)."""
        ...

    def read(
        self, partition: int, start: int, end: int, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """Records ``[start, end)`` of ``partition`` in offset order, as Arrow. ``columns``
        picks columns by name (system columns included), None means all. ``end`` may not
        pass ``end_offset`` (an ``OptionError`` says so)."""
        ...

    def lock_partition(self, partition: int, where: str) -> PartitionAppender:
        """The partition's one appender (``where`` names it in errors); raises
        ``WriterLockedError`` while another holder lives."""
        ...


# -- capabilities: what only some backends do (each checked with isinstance) -----------------


@runtime_checkable
class SupportsTrim(StreamStorage, Protocol):
    """A stream that keeps a retention and removes a partition's head (SPEC 12,
    ``retention``, which decides what may go: a backend only lists its stored units and
    commits a trim). Every backend of this package is one; a read-only stream (a table read
    as a stream) is not."""

    def retention(self) -> Retention:
        """The stream's retention: ops' last change, else the one it was created with."""
        ...

    def set_retention(self, retention: Retention) -> None:
        """Change the stream's retention (ops), atomically; writers pick it up at their next
        check."""
        ...

    def trim_partition(
        self, partition: int, decide: Callable[[list[Unit], TrimState], TrimState | None]
    ) -> TrimResult | None:
        """Remove the head units ``decide`` lets go (given the partition's units in offset
        order and its trim now; it returns the new trim or None), one trim of a partition at a
        time; None when nothing was removed. The new trim is stored before any unit goes, so
        a reader never sees a gap."""
        ...


@runtime_checkable
class SupportsVerify(StreamStorage, Protocol):
    """A stream whose stored record batches carry checksums a check can read again
    (``rowtime describe --verify``)."""

    def verify(self, partition: int) -> tuple[int, int]:
        """Check every record batch of ``partition`` against its checksum (reads every byte);
        returns how many batches were checked and how many had none (written before
        checksums). Raises ``CorruptLogError`` naming the unit and the records of the
        first damaged batch."""
        ...


@runtime_checkable
class SupportsStoredBytes(StreamStorage, Protocol):
    """A stream that can say what a partition takes in storage (``rowtime metrics``)."""

    def stored_bytes(self, partition: int) -> int | None:
        """Bytes the partition's stored units take, or None when it has none stored yet."""
        ...


@runtime_checkable
class SupportsWriterOf(StreamStorage, Protocol):
    """A stream that can name a partition's writer without taking its lock (object storage:
    taking the lease to look would commit an epoch)."""

    def writer_of(self, partition: int) -> str | None:
        """Who holds ``partition``'s lock now (``host:pid``), or None when nobody does."""
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
    (``PartitionAppender.append_run``), or nothing is written (a stale writer, a gap)."""
    if first != end:
        raise CorruptLogError(
            f"{where}: a run from offset {first}, and the partition ends at {end}"
        )


def check_read(
    schema: pa.Schema, columns: Sequence[str] | None, start: Any, end: Any, location: str
) -> list[str]:
    """What every backend's ``StreamStorage.read`` checks first, with one message each: the
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
    """The answer of ``what_is_at``: the location as given, resolved, and its kind."""

    given: str
    resolved: str
    kind: LocationKind


@runtime_checkable
class Backend(Protocol):
    """One kind of storage, serving the locations of its URL scheme(s)."""

    def resolve(self, location: str) -> str:
        """The canonical form of ``location`` (an absolute path for local files). Raises
        ``OptionError`` naming the location when it is not one of this backend's."""
        ...

    def kind_at(self, resolved: str) -> LocationKind:
        """What sits at the resolved location."""
        ...

    def open(self, resolved: str, given: str) -> StreamStorage:
        """The stream at the resolved location; ``StreamNotFoundError`` naming ``given``
        and how to create one when there is none."""
        ...

    def create(
        self, resolved: str, schema: str | pa.Schema, partitions: int, defaults: dict[str, Any]
    ) -> StreamStorage:
        """Create the stream (or open the identical one that exists), see
        ``local.log.create_stream`` for the rules."""
        ...


@runtime_checkable
class SupportsEntrySource(Backend, Protocol):
    """A backend whose locations also name entries other programs append (Redis: a key
    others ``XADD`` to), read and converted as the rows of a stream of ``schema``: what a
    connector of kind ``redis`` reads through (``connectors.redis_source``)."""

    def entry_source(
        self,
        resolved: str,
        schema: pa.Schema,
        fields: dict[str, str],
        rowtime_field: str | None,
        defaults: dict[str, Any],
    ) -> Any:
        """The entries at the resolved location: ``fields`` maps columns to entry fields,
        ``rowtime_field`` holds the rowtime (else the entry's own time), read with the
        rowtime ``defaults``."""
        ...


#: The entry-point group storage backends are found in. An entry point's name is a URL scheme
#: (lower case; ``file`` also serves plain paths), its value the ``Backend`` object, as in
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
    """The backend of ``scheme``: registered, else this package's own (``PACKAGED``, also
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
#: ``partitions`` and ``create_stream`` all hold to it): each partition is a writer, a lock,
#: a clock and a folder or set of keys, and a planner reads every partition's tail each step.
MAX_PARTITIONS = 10_000


#: The project's one redaction (``bounds.redaction``), under the name this module has
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
    found through ``ENTRY_POINT_GROUP`` the first time a location of its scheme is used."""
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


def open_stream(location: str | os.PathLike[str]) -> StreamStorage:
    """The stream at ``location``, from the backend serving its scheme."""
    backend = backend_for(location)
    given = os.fspath(location)
    return backend.open(backend.resolve(given), given)


def create_stream(
    location: str | os.PathLike[str],
    schema: str | pa.Schema,
    partitions: int = 1,
    **defaults: Any,
) -> StreamStorage:
    """Create the stream at ``location`` (or open the identical one) with its backend; at most
    ``MAX_PARTITIONS`` partitions."""
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

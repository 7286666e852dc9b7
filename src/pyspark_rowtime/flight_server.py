"""``rowtime serve``: an Arrow Flight endpoint that takes rows and bounds, exactly once.

Adapters in any language (Java, Go, C++, Rust, C#: every language Arrow Flight has a client
in) write to a stream over the network, as SQLstream's adapters did over JDBC with
``INSERT EXPEDITED`` and ``setRowtimeBound``. The protocol (docs/adapters/any-language.md):

* **DoPut**, descriptor path ``[STREAM, PARTITION]`` (``[STREAM]``: partition 0). Each message
  is a record batch (payload columns, optionally ``rowtime``) with ``app_metadata`` JSON
  ``{"writer": W, "seq": N, "bound": T?}``, or the metadata alone (a bound alone). Once a
  message's rows and bound are committed (durable), the server answers one ``PutResult`` with
  ``{"seq": N, "status": "committed"}`` (``"duplicate"`` for a message committed before).
* **Exactly once**, as Kafka's idempotent producer: a writer numbers its messages per
  partition 0, 1, 2, ...; the partition's record of every writer's last committed ``seq``
  (:attr:`.streams.segments.SegmentStats.producers`) is stored *in the same commit as the
  message's records*, so it can never say "committed" for records that are not, nor miss
  records that are, after a crash or a restart too. A ``seq`` at or below the last is a
  duplicate and stores nothing; one past the next is refused naming the one expected. A
  refused message stores nothing and takes no ``seq``. While a writer has a put open on a
  partition, another writer is refused naming it (the log has one appender per partition);
  the same writer on a new connection takes the partition over (its old connection is dead
  or dying: the client reconnected).
* **Acknowledgements**: an answer is sent only after the commit returned. A client that lost
  answers (a reset connection, a server killed) resends every message not acknowledged, with
  the same ``seq``: each is then committed once, or answered ``duplicate``.
* **Flight SQL bulk ingest** (ADBC's driver, :mod:`.flight_sql`): ``adbc_ingest(STREAM,
  table)`` with call headers ``x-rowtime-writer``, ``x-rowtime-seq``, ``x-rowtime-partition``
  and ``x-rowtime-bound``, the whole ingest one message, answered by one
  ``DoPutUpdateResult`` after the commit; ``execute_update("SET ROWTIME BOUND 'T' FOR
  STREAM")`` with the same headers sends a bound alone (prepared too: the handle is the text).
* **ListFlights / GetFlightInfo**: each stream's schema (payload, then ``rowtime``) and, in
  the info's ``app_metadata``, its partitions and clock; **DoAction** ``clock`` (body: the
  stream) returns ``{"clock_us": ...}`` (SQLstream's ``getRowtimeBound``) and ``writer``
  (body ``{"stream", "partition", "writer"}``) the next ``seq`` the server expects.

**Memory.** Python Flight handlers run under the GIL (apache/arrow 13745), so a handler only
reads, checks and commits: one message is read, committed and let go before the next is read,
and its answer is written after that (:class:`_Memory` counts what is held: one message a put
at the most). What a client sends ahead, one that does not wait for its answers or never reads
them, waits in gRPC's flow-control window and the sockets' buffers, which then hold the client
back: that window is gRPC's, sized from the bandwidth and round trip gRPC measures (a few MB on
a quiet loopback, more under load), and pyarrow's server can set none of gRPC's options to cap
it (docs/adapters/any-language.md, Limits). A client that reads no answers
also stops the server once the answers fill its own window (gRPC's ``Write`` waits for flow
control): the server is held back, and holds one answer. What gRPC frees of the messages it
received stays in the C allocator's arenas (glibc keeps freed memory for reuse, per thread);
the server hands it back to the system every :data:`RELEASE_EVERY_BYTES` read and when a put
ends (``malloc_trim``, and Arrow's pool's ``release_unused``), so that what it holds after a
put does not depend on how much the put sent. A message is measured against
``max_message_bytes`` once it has arrived whole, when gRPC holds it (and Flight a copy of it):
Flight lets gRPC take up to 2 GiB a message, and pyarrow's server has no gRPC option
(``SetMaxReceiveMessageSize``) nor any view of a message before its body to refuse it sooner.
"""

from __future__ import annotations

import ctypes
import hmac
import json
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from .bounds.errors import (
    CorruptLogError,
    OptionError,
    RowtimeError,
    StreamNotFoundError,
    WriterLockedError,
)
from .bounds.time import from_rowtime_us, to_rowtime_us
from .flight_sql import (
    CLOSE_PREPARED,
    CREATE_PREPARED,
    INGEST_TYPE,
    PREPARED_UPDATE_TYPE,
    UPDATE_TYPE,
    ProtobufError,
    encode_prepared_result,
    encode_update_result,
    parse_prepare_request,
)
from .flight_sql import parse_command as parse_sql_command
from .streams.catalog import ensure_stream, load_catalog
from .streams.storage import LocationKind, StreamStorage, open_storage, redact_url, what_is_at
from .streams.writer import Writer

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_PORT",
    "MAX_WRITERS_KEPT",
    "RowtimeFlightServer",
    "Streams",
    "load_producers",
]

#: How many writers a partition's record keeps (the most recent): one that wrote before the
#: last 64 others starts again at seq 0 (its next seq past 0 is refused as a gap, never
#: stored twice).
MAX_WRITERS_KEPT = 64
#: How long SIGTERM waits for the puts in flight before the process exits anyway: every
#: commit is atomic, so a put cut then is stored wholly or not at all.
STOP_DEADLINE_S = 8.0
#: The defaults of ``rowtime serve`` (:mod:`.serve_cli` has the same, so that its parser needs
#: no Flight; tests/test_serve.py holds them equal).
DEFAULT_PORT = 8815
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
#: How many bytes of messages the server reads between two hand-backs of the memory it freed
#: to the system (:meth:`_Memory.release`): one default-sized message; a hand-back walks the
#: allocator's arenas, milliseconds at the most.
RELEASE_EVERY_BYTES = 64 << 20
#: A writer's name: what a metric label and a message can show as it is.
_WRITER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}\Z")
#: Rows and bounds go into a commit only when the server says so (one a message): the
#: writer's own flush thresholds never split a message.
_NEVER = 1 << 62

_BOUND_SQL = re.compile(
    r"\s*SET\s+ROWTIME\s+BOUND\s+'(?P<bound>[^']*)'\s+FOR\s+(?P<q>\"?)(?P<stream>[^\"\s;]+)(?P=q)"
    r"\s*;?\s*\Z",
    re.IGNORECASE,
)


class Refused(Exception):
    """A message the server refuses: nothing of it is stored. ``reason`` is one word for
    metrics and clients (``gap``, ``held``, ``invalid``, ``limit``, ``auth``, ``stopping``)."""

    def __init__(self, reason: str, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.reason = reason
        self.detail = detail

    def flight_error(self) -> fl.FlightError:
        info = json.dumps({"status": "refused", "reason": self.reason, **self.detail}).encode()
        if self.reason in ("held", "stopping"):
            # UNAVAILABLE: the same message may be sent again later, as it is.
            return fl.FlightUnavailableError(str(self), info)
        return fl.FlightServerError(str(self), info)


# -- the streams served -------------------------------------------------------------------------


class Streams:
    """The streams a server serves, by name: a catalog's (its names; a stream not created yet
    is created from its entry when first served, as the catalog's streams are everywhere), and
    those under a root folder (their paths relative to it, ``/``-separated)."""

    def __init__(
        self,
        root: str | None = None,
        catalog: str | None = None,
        only: Sequence[str] | None = None,
    ) -> None:
        self.root = None if root is None else os.path.realpath(root)
        loaded = None if catalog is None else load_catalog(catalog)
        self.catalog = {} if loaded is None else {
            name: entry for name, entry in loaded.streams.items() if only is None or name in only
        }  # fmt: skip
        self._open: dict[str, StreamStorage] = {}
        self._lock = threading.Lock()

    def location(self, name: str) -> str:
        if name in self.catalog:
            return self.catalog[name].location
        if self.root is not None:
            parts = name.split("/")
            if name and all(p not in ("", ".", "..") for p in parts) and "\\" not in name:
                path = os.path.realpath(os.path.join(self.root, *parts))
                if path.startswith(self.root + os.sep):
                    return path
        raise StreamNotFoundError(f"no stream {name!r} is served here; {self._known()}")

    def _known(self) -> str:
        names = self.names()
        return (
            "the streams are: "
            + (", ".join(names[:20]) or "(none)")
            + (", ..." if len(names) > 20 else "")
        )

    def open(self, name: str) -> StreamStorage:
        """The stream named ``name`` (opened once, kept)."""
        with self._lock:
            stream = self._open.get(name)
        if stream is not None:
            return stream
        if name in self.catalog:
            stream = ensure_stream(self.catalog[name])
            with self._lock:
                return self._open.setdefault(name, stream)
        location = self.location(name)
        if what_is_at(location).kind is not LocationKind.STREAM:
            raise StreamNotFoundError(
                f"no stream {name!r} is served here (nothing at {redact_url(location)}; "
                f"create it with `rowtime create`); {self._known()}"
            )
        stream = open_storage(location)
        with self._lock:
            return self._open.setdefault(name, stream)

    def names(self) -> list[str]:
        """Every stream served: the catalog's, then the streams below the root (a stream's
        own folders are not searched)."""
        out = sorted(self.catalog)
        if self.root is not None:
            for folder, dirs, _ in os.walk(self.root):
                dirs.sort()
                if folder == self.root:
                    continue
                if what_is_at(folder).kind is LocationKind.STREAM:
                    dirs.clear()
                    out.append(os.path.relpath(folder, self.root).replace(os.sep, "/"))
                else:
                    dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
        return out


# -- a partition's state ----------------------------------------------------------------------


def load_producers(stream: StreamStorage, partition: int) -> dict[str, int]:
    """The partition's record of each writer's last committed ``seq``: the ``producers`` of
    its last segment that has one (a writer of this process's API writes none)."""
    for stats in reversed(stream.partition_stats(partition)):
        if stats.producers:
            try:
                doc = json.loads(stats.producers)
                return {str(k): int(v) for k, v in doc.items()}
            except (ValueError, TypeError, AttributeError) as e:
                raise CorruptLogError(
                    f"partition {partition} of {redact_url(stream.location)}: the writers' "
                    f"record {stats.producers!r} of records [{stats.first}, {stats.end}) cannot "
                    f"be read: {e}"
                ) from None
    return {}


@dataclass
class _Partition:
    """One partition's appender and record, shared by the puts on it (under ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    writer: Writer | None = None
    producers: dict[str, int] = field(default_factory=dict)
    holder: str | None = None  # the writer with a put open on it
    call: object | None = None  # that put


@dataclass
class _Counts:
    messages: int = 0
    rows: int = 0
    bounds: int = 0
    duplicates: int = 0
    refusals: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Message:
    """One message of a put, as the server reads it."""

    writer: str
    seq: int
    bound_us: int | None
    batch: pa.RecordBatch | pa.Table | None


def parse_app_metadata(raw: bytes | None) -> tuple[str, int, int | None]:
    """``(writer, seq, bound_us)`` of a message's ``app_metadata``."""
    if not raw:
        raise Refused(
            "invalid",
            'a message needs app_metadata: JSON {"writer": W, "seq": N} (and "bound" if any)',
        )
    try:
        doc = json.loads(bytes(raw))
    except (ValueError, UnicodeDecodeError) as e:
        raise Refused("invalid", f"app_metadata is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise Refused("invalid", 'app_metadata must be a JSON object {"writer": W, "seq": N}')
    unknown = sorted(set(doc) - {"writer", "seq", "bound"})
    if unknown:
        raise Refused("invalid", f"app_metadata has unknown keys {unknown}: writer, seq, bound")
    return check_writer(doc.get("writer")), check_seq(doc.get("seq")), read_bound(doc.get("bound"))


def check_writer(writer: Any) -> str:
    if not isinstance(writer, str) or not _WRITER_RE.match(writer):
        raise Refused(
            "invalid",
            f"writer {writer!r} must be a name of 1 to 128 letters, digits and ._:@/- "
            "(starting with a letter or digit), the same for every message of one writer",
        )
    return writer


def check_seq(seq: Any) -> int:
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < 2**63:
        raise Refused("invalid", f"seq {seq!r} must be a whole number >= 0 (the first is 0)")
    return seq


def read_bound(bound: Any) -> int | None:
    """A bound as JSON gives it: integer microseconds since the epoch, or ISO-8601 text."""
    if bound is None:
        return None
    if isinstance(bound, bool) or not isinstance(bound, (int, str)):
        raise Refused("invalid", f"bound {bound!r} must be integer microseconds or ISO-8601 text")
    try:
        return to_rowtime_us(bound, unit="us")
    except RowtimeError as e:
        raise Refused("invalid", f"bound {bound!r}: {e}") from None


def _rowtime_as_us(data: pa.RecordBatch | pa.Table) -> pa.RecordBatch | pa.Table:
    """An integer ``rowtime`` column means microseconds (as a bound does), whatever the
    stream's ``rowtime_unit``: the protocol does not depend on the stream's defaults."""
    names = data.schema.names
    if "rowtime" in names:
        i = names.index("rowtime")
        column = data.column(i)
        if pa.types.is_integer(column.type):
            ts = column.cast(pa.int64()).cast(pa.timestamp("us", tz="UTC"))
            data = data.set_column(i, pa.field("rowtime", ts.type), ts)
    return data


# -- memory -------------------------------------------------------------------------------------


def _find_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` among the process's own symbols (None elsewhere: musl and
    macOS have none). Called through ``ctypes.CDLL``, which lets the GIL go while it runs."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_malloc_trim = _find_malloc_trim()


class _Memory:
    """What the server holds of the messages it read: ``held`` bytes now (read, not yet
    committed or refused), ``peak`` the most at any moment since the start. A put holds one
    message at a time, so ``peak`` is at most the largest message times the puts at once.
    Every :data:`RELEASE_EVERY_BYTES` let go, and when a put ends, the memory freed is handed
    back to the system."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.held = 0
        self.peak = 0
        self._since_release = 0
        self.releases = 0

    def hold(self, size: int) -> None:
        with self._lock:
            self.held += size
            self.peak = max(self.peak, self.held)

    def let_go(self, size: int) -> None:
        with self._lock:
            self.held -= size
            self._since_release += size
            due = self._since_release >= RELEASE_EVERY_BYTES
        if due:
            self.release()

    def release(self) -> None:
        """Hand what was freed back to the system, if anything was read since the last time:
        Arrow's pool's unused memory, and the C allocator's (gRPC's buffers are malloc'd)."""
        with self._lock:
            if not self._since_release:
                return
            self._since_release = 0
            self.releases += 1
        pa.default_memory_pool().release_unused()
        if _malloc_trim is not None:
            _malloc_trim(0)


# -- the server ---------------------------------------------------------------------------------


class _CallHeaders(fl.ServerMiddleware):
    def __init__(self, headers: dict[str, list[str]]) -> None:
        self.headers = headers


class _Middleware(fl.ServerMiddlewareFactory):
    """Checks the bearer token of every call (with tokens) and keeps the ``x-rowtime-*``
    headers for the handler (Flight gives a handler its call's headers only this way)."""

    def __init__(self, tokens: Sequence[bytes], refused: Callable[[str], None]) -> None:
        super().__init__()
        self._tokens = [b"Bearer " + t for t in tokens]
        self._refused = refused

    def start_call(self, info: Any, headers: dict[str, list[Any]]) -> _CallHeaders:
        if self._tokens:
            given = [
                v if isinstance(v, bytes) else str(v).encode()
                for v in headers.get("authorization", [])
            ]
            # Compared in constant time: a timing difference would reveal a token's prefix.
            if not any(hmac.compare_digest(g, t) for g in given for t in self._tokens):
                self._refused("auth")
                raise fl.FlightUnauthenticatedError(
                    "this server needs `authorization: Bearer <token>` with a token of its "
                    "--token-file; nothing was stored"
                )
        kept = {
            k.lower(): [v.decode() if isinstance(v, bytes) else str(v) for v in vs]
            for k, vs in headers.items()
            if k.lower().startswith("x-rowtime-")
        }
        return _CallHeaders(kept)


class RowtimeFlightServer(fl.FlightServerBase):
    """The Flight server of ``rowtime serve`` (see the module docstring for the protocol)."""

    def __init__(
        self,
        streams: Streams,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        tokens: Sequence[bytes] = (),
        tls: tuple[bytes, bytes] | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.streams = streams
        self.max_message_bytes = max_message_bytes
        self.stopping = threading.Event()
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self._lock = threading.Lock()
        self.counts: dict[tuple[str, int, str], _Counts] = {}
        self.refusals_before_writer: dict[str, int] = {}
        self.memory = _Memory()
        # pyarrow imports pandas (if installed) the first time it converts Python values, as a
        # commit does: seconds on a loaded machine. Done before listening, so that neither the
        # first put nor a SIGTERM during its commit waits for it.
        pa.array([0], pa.int64())
        scheme = "grpc+tls" if tls else "grpc+tcp"
        shown_host = f"[{host}]" if ":" in host else host
        try:
            super().__init__(
                f"{scheme}://{shown_host}:{port}",
                tls_certificates=[tls] if tls else None,
                middleware={"rowtime": _Middleware(tokens, self._refused_early)},
            )
        except (fl.FlightError, pa.ArrowException, OSError) as e:
            raise OptionError(f"rowtime serve cannot listen on {host}:{port}: {e}") from None
        self.url = f"{'grpc+tls' if tls else 'grpc'}://{shown_host}:{self.port}"

    # -- bookkeeping

    def _refused_early(self, reason: str) -> None:
        with self._lock:
            self.refusals_before_writer[reason] = self.refusals_before_writer.get(reason, 0) + 1

    def _count(self, stream: str, partition: int, writer: str) -> _Counts:
        key = (stream, partition, writer)
        with self._lock:
            counts = self.counts.get(key)
            if counts is None:
                counts = self.counts[key] = _Counts()
            return counts

    def _refusal(self, stream: str, partition: int, writer: str | None, e: Refused) -> None:
        if writer is None:
            self._refused_early(e.reason)
            return
        c = self._count(stream, partition, writer)
        with self._lock:
            c.refusals[e.reason] = c.refusals.get(e.reason, 0) + 1

    def snapshot(self) -> tuple[dict[tuple[str, int, str], _Counts], dict[str, int]]:
        """The counters per (stream, partition, writer), and the refusals before any writer
        was named, by reason: copies, taken at one moment (the metrics read them)."""
        with self._lock:
            counts = {k: replace(c, refusals=dict(c.refusals)) for k, c in self.counts.items()}
            return counts, dict(self.refusals_before_writer)

    def _partition(self, location: str, partition: int) -> _Partition:
        with self._lock:
            return self._partitions.setdefault((location, partition), _Partition())

    # -- listing, schema, clock

    def _info(self, name: str) -> fl.FlightInfo:
        stream = self.streams.open(name)
        meta = stream.meta
        schema = pa.schema(
            [*meta.payload_schema, pa.field("rowtime", pa.timestamp("us", tz="UTC"))]
        )
        doc = {
            "stream": name,
            "partitions": meta.partitions,
            "clock_us": stream.stream_clock_us(),
            "partition_clocks_us": [stream.clock_us(p) for p in range(meta.partitions)],
        }
        records = sum(stream.end_offset(p) for p in range(meta.partitions))
        return fl.FlightInfo(
            schema,
            fl.FlightDescriptor.for_path(name),
            [],
            total_records=records,
            total_bytes=-1,
            app_metadata=json.dumps(doc).encode(),
        )

    def list_flights(self, context: Any, criteria: bytes) -> Iterator[fl.FlightInfo]:
        prefix = bytes(criteria or b"").decode("utf-8", "replace")
        for name in self.streams.names():
            if name.startswith(prefix):
                yield self._info(name)

    def get_flight_info(self, context: Any, descriptor: fl.FlightDescriptor) -> fl.FlightInfo:
        if descriptor.descriptor_type != fl.DescriptorType.PATH or not descriptor.path:
            raise fl.FlightServerError(
                "rowtime serve describes streams by path descriptors [STREAM]; Flight SQL "
                "queries are not served (only bulk ingest and SET ROWTIME BOUND)"
            )
        try:
            return self._info(_text(descriptor.path[0]))
        except (RowtimeError, Refused) as e:
            raise fl.FlightServerError(str(e)) from None

    def get_schema(self, context: Any, descriptor: fl.FlightDescriptor) -> fl.SchemaResult:
        return fl.SchemaResult(self.get_flight_info(context, descriptor).schema)

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [
            ("clock", "body: a stream's name; returns JSON {clock_us, clock, partitions_us}"),
            (
                "writer",
                'body: JSON {"stream", "partition", "writer"}; returns JSON {next_seq}: the seq '
                "the server expects next from that writer",
            ),
        ]

    def do_action(self, context: Any, action: fl.Action) -> Iterator[bytes]:
        body = action.body.to_pybytes() if action.body is not None else b""
        try:
            if action.type == "clock":
                stream = self.streams.open(body.decode())
                clock = stream.stream_clock_us()
                doc: dict[str, Any] = {
                    "clock_us": clock,
                    "clock": None if clock is None else from_rowtime_us(clock).isoformat(),
                    "partitions_us": [stream.clock_us(p) for p in range(stream.meta.partitions)],
                }
            elif action.type == CREATE_PREPARED:  # a Flight SQL driver's execute() prepares
                query = parse_prepare_request(body)
                if _BOUND_SQL.match(query) is None:
                    raise Refused(
                        "invalid",
                        f"statement {query!r}: the one statement served is SET ROWTIME BOUND "
                        "'TIME' FOR STREAM (TIME ISO-8601 or integer microseconds)",
                    )
                yield encode_prepared_result(query)
                return
            elif action.type == CLOSE_PREPARED:
                return  # the handle is the statement's text: nothing to release
            elif action.type == "writer":
                ask = json.loads(body)
                name, partition = ask["stream"], int(ask.get("partition", 0))
                writer = check_writer(ask["writer"])
                stream = self.streams.open(name)
                part = self._partition(stream.location, partition)
                with part.lock:
                    known = (
                        part.producers
                        if part.writer is not None
                        else load_producers(stream, partition)
                    )
                doc = {"next_seq": known.get(writer, -1) + 1}
            else:
                raise fl.FlightServerError(
                    f"unknown action {action.type!r}: this server has clock and writer"
                )
        except (RowtimeError, ValueError, KeyError, TypeError, Refused) as e:
            raise fl.FlightServerError(f"action {action.type}: {e}") from None
        yield json.dumps(doc).encode()

    # -- puts

    def do_put(
        self,
        context: Any,
        descriptor: fl.FlightDescriptor,
        reader: fl.MetadataRecordBatchReader,
        writer: fl.FlightMetadataWriter,
    ) -> None:
        if self.stopping.is_set():
            raise Refused(
                "stopping", "the server is stopping; send to its successor"
            ).flight_error()
        if descriptor.descriptor_type == fl.DescriptorType.CMD:
            self._sql_put(context, descriptor.command, reader, writer)
            return
        try:
            name, partition = self._target(descriptor.path or [])
            stream = self.streams.open(name)
        except (Refused, RowtimeError) as e:
            refusal = e if isinstance(e, Refused) else Refused("invalid", str(e))
            self._refused_early(refusal.reason)
            raise refusal.flight_error() from None
        put = _Put(self, name, stream, partition, context)
        try:
            while True:
                if self.stopping.is_set():
                    raise Refused(
                        "stopping",
                        "the server is stopping: messages not acknowledged were not stored; "
                        "resend them (same seq) to its successor",
                    )
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    return
                size = len(chunk.app_metadata or b"")
                if chunk.data is not None:
                    size += chunk.data.get_total_buffer_size()
                self.memory.hold(size)
                try:
                    if size > self.max_message_bytes:
                        raise Refused(
                            "limit",
                            f"a message of {size} bytes is over this server's "
                            f"--max-message-bytes {self.max_message_bytes}; send smaller "
                            "batches. Nothing of it was stored",
                            limit=self.max_message_bytes,
                        )
                    w, seq, bound = parse_app_metadata(chunk.app_metadata)
                    put.writer_id = w
                    status = put.commit(Message(w, seq, bound, chunk.data))
                finally:
                    # Let the message go before its answer is written (a client that reads no
                    # answers blocks that write) and before the next is read.
                    del chunk
                    self.memory.let_go(size)
                writer.write(pa.py_buffer(json.dumps({"seq": seq, "status": status}).encode()))
        except Refused as e:
            self._refusal(name, partition, put.writer_id, e)
            raise e.flight_error() from None
        finally:
            put.end()
            self.memory.release()

    def _target(self, path: Sequence[bytes | str]) -> tuple[str, int]:
        if len(path) not in (1, 2):
            raise Refused(
                "invalid",
                f"a put's descriptor path is [STREAM] or [STREAM, PARTITION], not {len(path)} "
                "elements",
            )
        name = _text(path[0])
        partition = 0
        if len(path) == 2:
            text = _text(path[1])
            if not text.isdigit():
                raise Refused("invalid", f"partition {text!r} must be decimal digits")
            partition = int(text)
        return name, partition

    def _sql_put(
        self,
        context: Any,
        command: bytes,
        reader: fl.MetadataRecordBatchReader,
        writer: fl.FlightMetadataWriter,
    ) -> None:
        """A Flight SQL DoPut: a bulk ingest (the whole ingest one message) or the update
        ``SET ROWTIME BOUND 'T' FOR STREAM``, under the same rules, answered by one
        ``DoPutUpdateResult`` after the commit."""
        middleware = context.get_middleware("rowtime")
        headers = middleware.headers if middleware is not None else {}

        def header(name: str) -> str | None:
            values = headers.get(f"x-rowtime-{name}")
            return values[-1] if values else None

        name, partition, w = "?", 0, None
        put = None
        held = 0
        try:
            try:
                sql = parse_sql_command(command)
            except ProtobufError as e:
                raise Refused("invalid", f"the descriptor's command cannot be read: {e}") from None
            bound_text = header("bound")
            if sql.type_url == INGEST_TYPE:
                if not sql.table:
                    raise Refused("invalid", "the bulk ingest names no table (the stream)")
                name = sql.table
            elif sql.type_url in (UPDATE_TYPE, PREPARED_UPDATE_TYPE):
                m = _BOUND_SQL.match(sql.query or "")
                if m is None:
                    raise Refused(
                        "invalid",
                        f"update {sql.query!r}: the one statement served is SET ROWTIME BOUND "
                        "'TIME' FOR STREAM (TIME ISO-8601 or integer microseconds)",
                    )
                name, bound_text = m["stream"], m["bound"]
            else:
                raise Refused(
                    "invalid",
                    f"Flight SQL command {sql.type_url.rsplit('.', 1)[-1]} is not served: only "
                    "bulk ingest (adbc_ingest) and SET ROWTIME BOUND (execute_update)",
                )
            raw_partition = header("partition") or "0"
            if not raw_partition.isdigit():
                raise Refused("invalid", f"x-rowtime-partition {raw_partition!r} must be digits")
            partition = int(raw_partition)
            w = check_writer(header("writer"))
            raw_seq = header("seq")
            if raw_seq is None or not raw_seq.isdigit():
                raise Refused("invalid", f"x-rowtime-seq {raw_seq!r} must be a whole number >= 0")
            seq = check_seq(int(raw_seq))
            bound = None
            if bound_text is not None:
                bound = read_bound(int(bound_text) if bound_text.isdigit() else bound_text)
            try:
                stream = self.streams.open(name)
            except RowtimeError as e:
                raise Refused("invalid", str(e)) from None
            batches: list[pa.RecordBatch] = []
            for chunk in _chunks(reader):
                if chunk.data is not None:
                    size = chunk.data.get_total_buffer_size()
                    self.memory.hold(size)
                    held += size
                    if held > self.max_message_bytes:
                        raise Refused(
                            "limit",
                            f"an ingest of more than {self.max_message_bytes} bytes is over "
                            "this server's --max-message-bytes; ingest smaller tables. Nothing "
                            "of it was stored",
                            limit=self.max_message_bytes,
                        )
                    batches.append(chunk.data)
            table = pa.Table.from_batches(batches, schema=reader.schema) if batches else None
            put = _Put(self, name, stream, partition, context)
            put.writer_id = w
            status = put.commit(Message(w, seq, bound, table))
            rows = 0 if table is None else table.num_rows
            del batches, table
            self.memory.let_go(held)
            held = 0
            context.add_trailer("x-rowtime-status", status)
            # One reply, as the driver reads one: the records of the message (a duplicate's
            # too: they are stored, once), or 1 for a bound alone.
            writer.write(pa.py_buffer(encode_update_result(rows if rows else 1)))
        except Refused as e:
            self._refusal(name, partition, w, e)
            raise e.flight_error() from None
        finally:
            if held:
                self.memory.let_go(held)
            if put is not None:
                put.end()
            self.memory.release()

    # -- stopping

    def stop(self, deadline_s: float = STOP_DEADLINE_S) -> bool:
        """Stop taking puts, let those in flight finish their message, and shut down; True if
        every call ended within ``deadline_s`` (else the caller exits: nothing is half stored,
        as every commit is atomic)."""
        self.stopping.set()
        done = threading.Event()

        def shut() -> None:
            self.shutdown()
            done.set()

        threading.Thread(target=shut, name="rowtime-serve-stop", daemon=True).start()
        ended = done.wait(deadline_s)
        with self._lock:
            parts = list(self._partitions.values())
        for part in parts:
            # A handler still running holds its partition's lock while it commits: wait for it
            # (its message is then answered or failed whole), then release the appender.
            if part.lock.acquire(timeout=max(0.5, deadline_s / 4)):
                try:
                    if part.writer is not None:
                        part.writer.abort()
                        part.writer = None
                finally:
                    part.lock.release()
        return ended


def _chunks(reader: fl.MetadataRecordBatchReader) -> Iterator[Any]:
    while True:
        try:
            yield reader.read_chunk()
        except StopIteration:
            return


def _text(value: bytes | str) -> str:
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError:
        raise Refused("invalid", f"descriptor path element {value!r} is not UTF-8") from None


class _Put:
    """One put (a DoPut call) on one partition: takes the partition for its writer and
    commits its messages, each with the writer's new ``seq`` in the same commit."""

    def __init__(
        self, server: RowtimeFlightServer, name: str, stream: StreamStorage, partition: int,
        context: Any,
    ) -> None:  # fmt: skip
        self.server = server
        self.name = name
        self.stream = stream
        self.partition = partition
        self.context = context
        self.writer_id: str | None = None
        self.superseded = False
        self.part = server._partition(stream.location, partition)
        self.where = f"partition {partition} of stream {name}"

    def commit(self, m: Message) -> str:
        part = self.part
        with part.lock:
            if part.holder is not None and part.holder != m.writer and part.call is not None:
                raise Refused(
                    "held",
                    f"{self.where} is held by writer {part.holder!r} (the log has one appender "
                    f"per partition); writer {m.writer!r} may write once that put ends",
                    holder=part.holder,
                )
            if self.superseded:
                raise Refused(
                    "held",
                    f"{self.where} is held by another put of writer {m.writer!r} (a newer "
                    "connection of the same client took it over)",
                    holder=m.writer,
                )
            if isinstance(part.call, _Put) and part.call is not self:
                # The same writer on a new put: its client reconnected, the old put is dead
                # or dying. The new one takes over; the old one is refused at its next message.
                part.call.superseded = True
            part.holder, part.call = m.writer, self
            self._open(part)
            assert part.writer is not None
            last = part.producers.get(m.writer, -1)
            counts = self.server._count(self.name, self.partition, m.writer)
            if m.seq <= last:
                counts.duplicates += 1
                return "duplicate"
            if m.seq > last + 1:
                raise Refused(
                    "gap",
                    f"seq {m.seq} from writer {m.writer!r} on {self.where}: the next one "
                    f"expected is {last + 1} "
                    + (f"(the last committed is {last})" if last >= 0 else "(none committed yet)")
                    + f"; resend from {last + 1}",
                    expected=last + 1,
                )
            rows = 0 if m.batch is None else m.batch.num_rows
            if not rows and m.bound_us is None:
                raise Refused(
                    "invalid",
                    f"seq {m.seq} from writer {m.writer!r} holds no row and no bound: a message "
                    "carries rows, a bound or both",
                )
            producers = dict(part.producers)
            producers.pop(m.writer, None)
            producers[m.writer] = m.seq  # the most recent last: the oldest go first
            while len(producers) > MAX_WRITERS_KEPT:
                del producers[next(iter(producers))]
            writer = part.writer
            try:
                if rows:
                    assert m.batch is not None
                    data = _rowtime_as_us(m.batch)
                    writer.insert_arrow(
                        data, rowtime_column="rowtime" if "rowtime" in data.schema.names else None
                    )
                if m.bound_us is not None:
                    writer.set_rowtime_bound(from_rowtime_us(m.bound_us))
            except (RowtimeError, pa.ArrowException, TypeError, ValueError) as e:
                self._drop(part)
                raise Refused(
                    "invalid", f"seq {m.seq} from writer {m.writer!r} on {self.where}: {e}"
                ) from None
            try:
                writer.flush(producers=json.dumps(producers, separators=(",", ":")))
            except WriterLockedError as e:
                self._drop(part)
                raise Refused("held", f"{self.where}: {e}") from None
            except BaseException as e:
                # The store did not say: committed or not, the log knows (the record is in
                # the same commit). The next put reopens the partition and reads it.
                self._drop(part)
                if isinstance(e, Exception):
                    raise fl.FlightUnavailableError(
                        f"seq {m.seq} from writer {m.writer!r} on {self.where} may or may not "
                        f"be committed ({type(e).__name__}: {e}); resend it with the same seq: "
                        "it is then committed once or answered duplicate"
                    ) from None
                raise
            part.producers = producers
            counts.messages += 1
            counts.rows += rows
            counts.bounds += m.bound_us is not None
            return "committed"

    def _open(self, part: _Partition) -> None:
        if part.writer is not None:
            return
        try:
            part.writer = Writer(
                self.stream, self.partition, flush_records=_NEVER, flush_bytes=_NEVER
            )
            part.producers = load_producers(self.stream, self.partition)
        except WriterLockedError as e:
            part.holder = part.call = None
            raise Refused("held", f"{self.where}: {e}") from None
        except RowtimeError as e:
            part.holder = part.call = None
            raise Refused("invalid", f"{self.where}: {e}") from None

    def _drop(self, part: _Partition) -> None:
        """Discard what the failed message buffered and let the partition go: it is reopened
        (and its record read again) by the next message."""
        if part.writer is not None:
            try:
                part.writer.abort()
            finally:
                part.writer = None

    def end(self) -> None:
        """The put ended: its partition is free for another writer (and for the API's)."""
        part = self.part
        with part.lock:
            if part.call is self:
                part.holder = part.call = None
                if part.writer is not None:
                    try:
                        part.writer.close()
                    finally:
                        part.writer = None

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
  partition 0, 1, 2, ...; a ``seq`` at or below the last committed is a duplicate and stores
  nothing, one past the next is refused naming the one expected, and while a writer has a put
  open on a partition another writer is refused naming it. Why that holds across crashes and
  restarts (the writers' record is stored in the same commit as the records) is
  ``flight_ingest``'s, where each message is checked and committed.
* **Acknowledgements**: an answer is sent only after the commit returned. A client that lost
  answers (a reset connection, a server killed) resends every message not acknowledged, with
  the same ``seq``: each is then committed once, or answered ``duplicate``.
* **Flight SQL bulk ingest** (ADBC's driver, ``flight_sql``): ``adbc_ingest(STREAM,
  table)`` with call headers ``x-rowtime-writer``, ``x-rowtime-seq``, ``x-rowtime-partition``
  and ``x-rowtime-bound``, the whole ingest one message, answered by one
  ``DoPutUpdateResult`` after the commit; ``execute_update("SET ROWTIME BOUND 'T' FOR
  STREAM")`` with the same headers sends a bound alone (prepared too: the handle is the text).
* **ListFlights / GetFlightInfo**: each stream's schema (payload, then ``rowtime``) and, in
  the info's ``app_metadata``, its partitions and clock; **DoAction** ``clock`` (body: the
  stream) returns ``{"clock_us": ...}`` (SQLstream's ``getRowtimeBound``) and ``writer``
  (body ``{"stream", "partition", "writer"}``) the next ``seq`` the server expects.

**Memory.** A handler reads one message, has it committed and lets it go before it reads the
next, and writes its answer after that: a put holds one message at the most, counted by the
server's ``flight_ingest.Memory``, which also hands freed memory back to the system. What a
client sends ahead waits in gRPC's flow-control window, which pyarrow's server cannot cap
(``flight_ingest`` says why, and what ``max_message_bytes`` can and cannot refuse).
"""

from __future__ import annotations

import hmac
import json
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from .bounds.errors import OptionError, RowtimeError, StreamNotFoundError
from .bounds.time import from_rowtime_us
from .flight_ingest import (
    MAX_WRITERS_KEPT,
    Counts,
    Memory,
    Message,
    Partition,
    Put,
    Refused,
    check_seq,
    check_writer,
    load_producers,
    parse_app_metadata,
    read_bound,
)
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
from .streams.storage import LocationKind, StreamStorage, open_stream, redact_url, what_is_at

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_PORT",
    # Defined in .flight_ingest; named here too, where the protocol's other names are.
    "MAX_WRITERS_KEPT",
    "RowtimeFlightServer",
    "Streams",
    "load_producers",
]

#: How long SIGTERM waits for the puts in flight before the process exits anyway: every
#: commit is atomic, so a put cut then is stored wholly or not at all.
STOP_DEADLINE_S = 8.0
#: The defaults of ``rowtime serve`` (``serve_cli`` has the same, so that its parser needs
#: no Flight; tests/test_serve.py holds them equal).
DEFAULT_PORT = 8815
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20

_BOUND_SQL = re.compile(
    r"\s*SET\s+ROWTIME\s+BOUND\s+'(?P<bound>[^']*)'\s+FOR\s+(?P<q>\"?)(?P<stream>[^\"\s;]+)(?P=q)"
    r"\s*;?\s*\Z",
    re.IGNORECASE,
)


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
        stream = open_stream(location)
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
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._lock = threading.Lock()
        self.counts: dict[tuple[str, int, str], Counts] = {}
        self.refusals_before_writer: dict[str, int] = {}
        self.memory = Memory()
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

    def _count(self, stream: str, partition: int, writer: str) -> Counts:
        key = (stream, partition, writer)
        with self._lock:
            counts = self.counts.get(key)
            if counts is None:
                counts = self.counts[key] = Counts()
            return counts

    def _refusal(self, stream: str, partition: int, writer: str | None, e: Refused) -> None:
        if writer is None:
            self._refused_early(e.reason)
            return
        c = self._count(stream, partition, writer)
        with self._lock:
            c.refusals[e.reason] = c.refusals.get(e.reason, 0) + 1

    def snapshot(self) -> tuple[dict[tuple[str, int, str], Counts], dict[str, int]]:
        """The counters per (stream, partition, writer), and the refusals before any writer
        was named, by reason: copies, taken at one moment (the metrics read them)."""
        with self._lock:
            counts = {k: replace(c, refusals=dict(c.refusals)) for k, c in self.counts.items()}
            return counts, dict(self.refusals_before_writer)

    def _partition(self, location: str, partition: int) -> Partition:
        with self._lock:
            return self._partitions.setdefault((location, partition), Partition())

    def _put(self, name: str, stream: StreamStorage, partition: int) -> Put:
        """A put on ``stream``'s ``partition``: its ``flight_ingest.Partition`` is the
        one every put there shares, its counters this server's."""
        return Put(
            self._partition(stream.location, partition), self._count, name, stream, partition
        )

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
        put = self._put(name, stream, partition)
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
            put = self._put(name, stream, partition)
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

"""The ingest behind ``rowtime serve``'s puts: a message's checks, its exactly-once commit on
a partition, and the memory the server holds of the messages it read.

``flight_server`` is the Flight service (listening, TLS, tokens, the calls); it reads each
message and hands it here. Nothing here listens or knows a call's transport beyond the Flight
errors it answers with.

**Exactly once**, as Kafka's idempotent producer: a writer numbers its messages per
partition 0, 1, 2, ...; the partition's record of every writer's last committed ``seq``
(``streams.segments.SegmentStats.producers``) is stored *in the same commit as the
message's records*, so it can never say "committed" for records that are not, nor miss
records that are, after a crash or a restart too. A ``seq`` at or below the last is a
duplicate and stores nothing; one past the next is refused naming the one expected. A
refused message stores nothing and takes no ``seq``. While a writer has a put open on a
partition, another writer is refused naming it (the log has one appender per partition);
the same writer on a new connection takes the partition over (its old connection is dead
or dying: the client reconnected). A commit whose outcome the store did not report drops
the partition's appender: the next message reopens it and reads the record again, so a
resend with the same ``seq`` is committed once or answered ``duplicate``.

**Memory.** Python Flight handlers run under the GIL (apache/arrow 13745), so a handler only
reads, checks and commits: one message is read, committed and let go before the next is read,
and its answer is written after that (``Memory`` counts what is held: one message a put
at the most). What a client sends ahead, one that does not wait for its answers or never reads
them, waits in gRPC's flow-control window and the sockets' buffers, which then hold the client
back: that window is gRPC's, sized from the bandwidth and round trip gRPC measures (a few MB on
a quiet loopback, more under load), and pyarrow's server can set none of gRPC's options to cap
it (docs/adapters/any-language.md, Limits). A client that reads no answers
also stops the server once the answers fill its own window (gRPC's ``Write`` waits for flow
control): the server is held back, and holds one answer. What gRPC frees of the messages it
received stays in the C allocator's arenas (glibc keeps freed memory for reuse, per thread);
the server hands it back to the system every ``RELEASE_EVERY_BYTES`` read and when a put
ends (``malloc_trim``, and Arrow's pool's ``release_unused``), so that what it holds after a
put does not depend on how much the put sent. A message is measured against
``max_message_bytes`` once it has arrived whole, when gRPC holds it (and Flight a copy of it):
Flight lets gRPC take up to 2 GiB a message, and pyarrow's server has no gRPC option
(``SetMaxReceiveMessageSize``) nor any view of a message before its body to refuse it sooner.
"""

from __future__ import annotations

import ctypes
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from .bounds.errors import CorruptLogError, RowtimeError, WriterLockedError
from .bounds.time import from_rowtime_us, to_rowtime_us
from .streams.storage import StreamStorage, redact_url
from .streams.writer import Writer

__all__ = [
    "MAX_WRITERS_KEPT",
    "RELEASE_EVERY_BYTES",
    "Counts",
    "Memory",
    "Message",
    "Partition",
    "Put",
    "Refused",
    "check_seq",
    "check_writer",
    "load_producers",
    "parse_app_metadata",
    "read_bound",
]

#: How many writers a partition's record keeps (the most recent): one that wrote before the
#: last 64 others starts again at seq 0 (its next seq past 0 is refused as a gap, never
#: stored twice).
MAX_WRITERS_KEPT = 64
#: How many bytes of messages the server reads between two hand-backs of the memory it freed
#: to the system (``Memory.release``): one default-sized message; a hand-back walks the
#: allocator's arenas, milliseconds at the most.
RELEASE_EVERY_BYTES = 64 << 20
#: A writer's name: what a metric label and a message can show as it is.
_WRITER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}\Z")
#: Rows and bounds go into a commit only when the server says so (one a message): the
#: writer's own flush thresholds never split a message.
_NEVER = 1 << 62


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


# -- a message ----------------------------------------------------------------------------------


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


# -- a partition's state ------------------------------------------------------------------------


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
class Partition:
    """One partition's appender and record, shared by the puts on it (under ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    writer: Writer | None = None
    producers: dict[str, int] = field(default_factory=dict)
    holder: str | None = None  # the writer with a put open on it
    call: object | None = None  # that put


@dataclass
class Counts:
    """What one writer did on one partition since the server started (the metrics show it):
    messages committed, their rows and bounds, duplicates answered, refusals by reason."""

    messages: int = 0
    rows: int = 0
    bounds: int = 0
    duplicates: int = 0
    refusals: dict[str, int] = field(default_factory=dict)


class Put:
    """One put (a DoPut call) on one partition: takes the partition for its writer and
    commits its messages, each with the writer's new ``seq`` in the same commit.

    ``part`` is the server's ``Partition`` for ``stream``'s ``partition`` (one per
    partition, shared by every put on it); ``count(name, partition, writer)`` the server's
    ``Counts`` of that writer there."""

    def __init__(
        self, part: Partition, count: Callable[[str, int, str], Counts], name: str,
        stream: StreamStorage, partition: int,
    ) -> None:  # fmt: skip
        self.part = part
        self.count = count
        self.name = name
        self.stream = stream
        self.partition = partition
        self.writer_id: str | None = None
        self.superseded = False
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
            if isinstance(part.call, Put) and part.call is not self:
                # The same writer on a new put: its client reconnected, the old put is dead
                # or dying. The new one takes over; the old one is refused at its next message.
                part.call.superseded = True
            part.holder, part.call = m.writer, self
            self._open(part)
            assert part.writer is not None
            last = part.producers.get(m.writer, -1)
            counts = self.count(self.name, self.partition, m.writer)
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

    def _open(self, part: Partition) -> None:
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

    def _drop(self, part: Partition) -> None:
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


class Memory:
    """What the server holds of the messages it read: ``held`` bytes now (read, not yet
    committed or refused), ``peak`` the most at any moment since the start. A put holds one
    message at a time, so ``peak`` is at most the largest message times the puts at once.
    Every ``RELEASE_EVERY_BYTES`` let go, and when a put ends, the memory freed is handed
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

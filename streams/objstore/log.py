"""Rowtime streams on object storage (S3, Azure Blob): a log of numbered commit objects.

Objects of the stream at ``s3://bucket/prefix`` (or ``az://container/prefix``)::

    prefix/_stream.json                                 metadata (streams.meta), created once
    prefix/_retention.json                              retention changed by ops
    prefix/partition-0000/_lease.json                   the one writer's lease (.lease)
    prefix/partition-0000/_trim.json                    the trim: first kept offset, state there,
                                                        the first commit still needed, its id
    prefix/partition-0000/_commits/00000000000000000007.json   commit 7
    prefix/partition-0000/segments/<first>-<count>.e<epoch>.<id>.arrow   a run of records

The protocol is Delta Lake's: a change becomes visible by *creating* the next numbered commit
object with a conditional put (``If-None-Match: *``); of two writers creating one number exactly
one succeeds. Records are first uploaded as segment objects (the embedded log's segment format,
``segments``, under unique names no reader looks for), then named by a commit
``{"epoch", "owner", "id", "first", "segments": [{"key", "size", "stats"}]}``. The partition's
committed records are those of the longest run of consecutive commits from the first one the
trim keeps: an object store has no rename, no append and no lock, and this needs none.

* **Atomic**: one commit names all segments of an append (``append_segment_files`` commits any
  number of runs at once). A writer killed before its commit leaves segment objects that no
  commit names: nothing a reader takes (the next writer of the partition removes them).
* **Durable**: a commit is acknowledged once the store has it (S3 and Azure Blob are durable
  when a PUT returns).
* **One writer per partition**: the lease (``lease``) refuses a second live writer. After a
  holder's lease expires, a new writer takes over with the next epoch and *first commits its
  epoch* (a commit with no segment). The old writer's next commit needs the number it knows,
  now taken, and fails when it reads that commit back: the old writer is fenced, and nothing
  it writes after the takeover is ever visible. (Readers also ignore a commit whose epoch is
  below one seen earlier in the sequence.)
* **"Already exists" is confirmed**: obstore reports S3's retryable 409 ConditionalRequest
  Conflict as "already exists", so a failed create is read back: a commit carrying this
  writer's commit id is its own.
* **An unknown outcome is resolved, never guessed**: when a commit's create gets no answer (a
  timeout, a reset, a reply lost after the store applied it), the appender keeps the commit
  document as pending and commits nothing else; the writer's next flush retries the same
  append, which reads commit ``seq`` back: this commit's id means it was made (nothing is
  written again), absence means it was not, and the same document is created again (a late
  copy of the first request and the retry carry one id, so only one can count), another
  writer's commit means this writer was fenced. ``tests/test_faults_wire.py`` proves it
  through a fault proxy.
* **Recovery removes only what no commit can name**: a writer taking over removes segment
  objects of earlier epochs that no kept commit names, and first refuses (removing nothing)
  a partition whose commits the protocol cannot have left, a number missing before later
  ones or a trim naming a commit that is gone (``ObjectAppender._refuse_damage``).
* **Retention** removes whole segments from the head: ``_trim.json`` is replaced by
  compare-and-swap (one trim wins), then the segments before the first kept offset and the
  commits before the first one still needed are deleted. A failed swap is read back, as a
  failed commit is: a trim whose request was applied but whose reply was lost hears the
  precondition fail on its retry, and finds its own id there (it won: it deletes and reports).

Where it differs from the embedded log: small appends are not merged (each append is one
segment object and one commit object, so a reader's first look lists every commit after the
trim: keep flushes large, or set a retention); a writer that died holds the partition until its
lease ends (default 30 s, ``$ROWTIME_LEASE_S``), not until its process is gone; reads fetch
whole segment objects (cached, as they never change).
"""

from __future__ import annotations

import io
import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ...bounds.bounds import merge_clock
from ...bounds.errors import (
    CorruptLogError,
    OptionError,
    WriterLockedError,
)
from ...bounds.versions import newer_format
from ..columns import LOG_SYSTEM_COLUMNS
from ..meta import (
    StreamMeta,
)
from ..retention import RETENTION_FILE, TRIM_FILE, Retention, TrimResult, TrimState, Unit, data_loss
from ..segments import (
    SegmentStats,
    check_appended_files,
    read_ipc_checked,
    segment_schema,
    write_segment_to,
)
from ..storage import (
    PartitionTail,
    check_continues,
    check_partition,
    check_read,
)
from .lease import Lease, lease_seconds
from .location import (
    ObjectLocation,
    call,
    delete_objects,
    get_whole,
    store_for,
)

__all__ = ["ObjectAppender", "ObjectStream"]

COMMITS = "_commits"
SEGMENTS = "segments"
LEASE_FILE = "_lease.json"
_FORMAT = 1


def partition_dirname(partition: int) -> str:
    return f"partition-{partition:04d}"


def commit_name(seq: int) -> str:
    return f"{seq:020d}.json"


def _stats_doc(stats: SegmentStats) -> dict[str, int]:
    return {k: v for k, v in stats.__dict__.items() if v is not None}


@dataclass(frozen=True)
class _Piece:
    """One committed segment: records ``[first, first + count)`` in object ``key``."""

    seq: int
    key: str
    size: int
    stats: SegmentStats

    @property
    def first(self) -> int:
        return self.stats.first

    @property
    def end(self) -> int:
        return self.stats.end


@dataclass
class _Chain:
    """What a reader knows of a partition: the committed segments from the trim's first
    needed commit, the next commit number, the end offset and the highest epoch seen."""

    trim: TrimState
    from_seq: int
    next_seq: int
    end: int | None = None  # None until the first commit is read
    epoch: int = 0
    pieces: list[_Piece] = field(default_factory=list)
    #: the first commit listed past a missing one (the visible run ends before it): never
    #: made by the protocol, which creates each number only after the one before
    beyond: int | None = None


def _now_us() -> int:
    return time.time_ns() // 1000


class _RangeFile(io.RawIOBase):
    """A segment object as a read-only, seekable file whose reads are range requests: what
    Arrow's IPC reader needs to read some columns of a file without fetching the rest."""

    def __init__(self, loc: ObjectLocation, store: Any, piece: _Piece, what: str) -> None:
        self._loc, self._store, self._key, self._what = loc, store, piece.key, what
        self._size, self._pos = piece.size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        import obstore

        n = min(len(buffer), self._size - self._pos)
        if n <= 0:
            return 0
        start = self._pos
        data = call(
            self._loc,
            self._what,
            lambda: obstore.get_range(store_for(self._loc), self._key, start=start, length=n),
            reads=n,
        )
        memoryview(buffer)[:n] = memoryview(data)[:n]
        self._pos += n
        return n


class ObjectStream:
    """A stream on object storage opened for reading (and, through ``lock_partition``,
    appending). Safe to share between threads; picklable (the client is made on first use)."""

    def __init__(self, loc: ObjectLocation, meta: StreamMeta, *, cache_segments: int = 64):
        self.loc = loc
        self.location = str(loc)
        self.meta = meta
        self._file_schema = segment_schema(meta.payload_schema)
        self._cache_segments = cache_segments
        self._init_caches()

    def _init_caches(self) -> None:
        self._chains: dict[int, _Chain] = {}
        self._tables: OrderedDict[str, pa.Table] = OrderedDict()
        self._mutex = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"loc": self.loc, "meta": self.meta, "cache": self._cache_segments}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.loc = state["loc"]
        self.location = str(self.loc)
        self.meta = state["meta"]
        self._file_schema = segment_schema(self.meta.payload_schema)
        self._cache_segments = state["cache"]
        self._init_caches()

    def __repr__(self) -> str:
        return f"ObjectStream({self.location!r}, partitions={self.meta.partitions})"

    @property
    def store(self) -> Any:
        return store_for(self.loc)

    @property
    def file_schema(self) -> pa.Schema:
        return self._file_schema

    def _check_partition(self, partition: int) -> None:
        check_partition(self.location, self.meta.partitions, partition)

    def _key(self, partition: int, *parts: str) -> str:
        return self.loc.key(partition_dirname(partition), *parts)

    # -- reading the commit sequence --

    def _get_json(self, key: str, what: str) -> tuple[Any, str] | None:
        try:
            raw, meta = call(self.loc, what, lambda: get_whole(self.store, key))
        except FileNotFoundError:  # obstore's not found
            return None
        try:
            return json.loads(raw), str(meta["e_tag"])
        except ValueError as e:
            raise CorruptLogError(f"object {key} of {self.location} cannot be read: {e}") from e

    def _read_trim(self, partition: int) -> tuple[TrimState, int, str | None]:
        """The trim state, the first commit still needed, and the object's etag."""
        got = self._get_json(
            self._key(partition, TRIM_FILE), f"reading the trim of partition {partition}"
        )
        if got is None:
            return TrimState(), 0, None
        doc, etag = got
        where = f"partition {partition} of {self.location}"
        return TrimState.from_json(json.dumps(doc["state"]), where), int(doc["from_seq"]), etag

    def _trim_is(self, partition: int, trim_id: str) -> bool:
        """Whether the partition's trim now is the one written with ``trim_id``."""
        got = self._get_json(
            self._key(partition, TRIM_FILE), f"reading the trim of partition {partition}"
        )
        return got is not None and isinstance(got[0], dict) and got[0].get("id") == trim_id

    def _list_commits(self, partition: int, after_seq: int) -> list[int]:
        """Numbers of the commit objects after ``after_seq`` (all with -1), ascending."""
        import obstore

        prefix = self._key(partition, COMMITS) + "/"
        offset = prefix + commit_name(after_seq) if after_seq >= 0 else None

        def listing() -> list[int]:
            out = []
            stream = (
                obstore.list(self.store, prefix, offset=offset)
                if offset
                else obstore.list(self.store, prefix)
            )
            for chunk in stream:
                for meta in chunk:
                    name = meta["path"].rsplit("/", 1)[-1]
                    # filtered here too: Azurite's answer to a listing after a key (a marker)
                    # was seen to start from the beginning
                    if (
                        name.endswith(".json")
                        and name[:-5].isdigit()
                        and int(name[:-5]) > after_seq
                    ):
                        out.append(int(name[:-5]))
            return sorted(out)

        return call(self.loc, f"listing the commits of partition {partition}", listing)

    def _read_commit(self, partition: int, seq: int) -> dict[str, Any] | None:
        got = self._get_json(
            self._key(partition, COMMITS, commit_name(seq)),
            f"reading commit {seq} of partition {partition}",
        )
        return None if got is None else got[0]

    def _refresh(self, partition: int) -> _Chain:
        """The partition's chain with every commit made since the last look applied."""
        self._check_partition(partition)
        for _ in range(8):
            with self._mutex:
                chain = self._chains.get(partition)
            if chain is None:
                trim, from_seq, _ = self._read_trim(partition)
                chain = _Chain(trim, from_seq, from_seq)
            seqs = self._list_commits(partition, chain.next_seq - 1)
            if seqs and seqs[0] > chain.next_seq:
                # A trim removed the commits we were about to read (we looked before it, or
                # our cache is older than it): start again from its state.
                if self._read_trim(partition)[1] > chain.next_seq:
                    with self._mutex:
                        self._chains.pop(partition, None)
                    continue
            new = _Chain(
                chain.trim, chain.from_seq, chain.next_seq, chain.end, chain.epoch,
                list(chain.pieces),
            )  # fmt: skip
            for seq in seqs:
                if seq != new.next_seq:
                    new.beyond = seq
                    break  # the visible end: the longest run of consecutive commits
                doc = self._read_commit(partition, seq)
                if doc is None:
                    break  # trimmed meanwhile (below) or never there
                self._apply(partition, new, seq, doc)
            with self._mutex:
                current = self._chains.get(partition)
                if current is None or current.next_seq <= new.next_seq:
                    self._chains[partition] = new
                    return new
                return current
        raise CorruptLogError(
            f"the commits of partition {partition} of {self.location} keep changing under a "
            "trim while read"
        )

    def _apply(self, partition: int, chain: _Chain, seq: int, doc: dict[str, Any]) -> None:
        where = f"commit {seq} of partition {partition} of {self.location}"
        version = doc.get("v", 1)
        if not isinstance(version, int) or version > _FORMAT:
            raise newer_format(where, version, _FORMAT, CorruptLogError)
        chain.next_seq = seq + 1
        epoch = int(doc.get("epoch", 0))
        if epoch < chain.epoch:
            return  # a fenced writer's: never visible
        chain.epoch = epoch
        first = int(doc["first"])
        if chain.end is None:
            chain.end = first
        if first != chain.end:
            raise CorruptLogError(
                f"{where} starts at offset {first}, and the partition ends at {chain.end}: "
                "the commit objects were changed by hand?"
            )
        for seg in doc.get("segments", []):
            stats = SegmentStats(**seg["stats"])
            if stats.first != chain.end:
                raise CorruptLogError(
                    f"{where} names {seg['key']} at {stats.first}, not {chain.end}"
                )
            chain.end = stats.end
            if stats.end > chain.trim.start:
                chain.pieces.append(_Piece(seq, seg["key"], int(seg.get("size", 0)), stats))

    # -- tails and clocks --

    def tail(self, partition: int) -> PartitionTail:
        chain = self._refresh(partition)
        if not chain.pieces:
            return PartitionTail(chain.end or 0)
        last = chain.pieces[-1].stats
        return PartitionTail(last.end, last.clock_us, last.last_arrival_us)

    def end_offset(self, partition: int) -> int:
        return self.tail(partition).end

    def clock_us(self, partition: int) -> int | None:
        return self.tail(partition).clock_us

    def stream_clock_us(self) -> int | None:
        return merge_clock(self.clock_us(p) for p in range(self.meta.partitions))

    def partition_stats(self, partition: int) -> list[SegmentStats]:
        return [p.stats for p in self._refresh(partition).pieces]

    # -- retention (streams.retention) --

    def start_offset(self, partition: int) -> int:
        return self.trim_state(partition).start

    def trim_state(self, partition: int) -> TrimState:
        self._check_partition(partition)
        return self._read_trim(partition)[0]

    def retention(self) -> Retention:
        got = self._get_json(self.loc.key(RETENTION_FILE), "reading the retention")
        if got is None:
            return Retention.of_defaults(self.meta.defaults)
        return Retention.from_doc(got[0], self.loc.key(RETENTION_FILE))

    def set_retention(self, retention: Retention) -> None:
        import obstore

        text = json.dumps(retention.to_doc()).encode()
        call(
            self.loc,
            "setting the retention",
            lambda: obstore.put(self.store, self.loc.key(RETENTION_FILE), text),
        )

    def trim_partition(
        self, partition: int, decide: Callable[[list[Unit], TrimState], TrimState | None]
    ) -> TrimResult | None:
        """Remove the head segments ``decide`` lets go: ``_trim.json`` is replaced by
        compare-and-swap (of two trims one wins; the other returns None), then the removed
        segments and the commits before the first one still needed are deleted. A swap that
        fails is confirmed by reading the object back (its ``id``): a retried attempt whose
        first reply was lost, after the store applied it, fails its precondition on our own
        write, and is the winner (else its deletes would wait for a later trim, and its
        removal go unreported)."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        self._check_partition(partition)
        prev, prev_from, etag = self._read_trim(partition)
        chain = self._refresh(partition)
        units = [
            Unit(
                p.first,
                p.stats.count,
                p.stats.rows,
                p.size,
                p.stats.max_rowtime_us,
                p.stats.last_bound_us,
                p.stats.clock_us,
                last_arrival_us=p.stats.last_arrival_us,
            )
            for p in chain.pieces
            if p.end > prev.start
        ]
        new = decide(units, prev)
        if new is None or new.start <= prev.start:
            return None
        kept = [p for p in chain.pieces if p.end > new.start]
        if not kept or kept[0].first != new.start:
            return None  # not a segment boundary of what we listed: the next check decides
        from_seq = kept[0].seq
        trim_id = uuid.uuid4().hex
        doc = {"v": 1, "state": new.to_doc(), "from_seq": from_seq, "id": trim_id}
        mode: Any = "create" if etag is None else {"e_tag": etag}
        try:
            call(
                self.loc,
                f"trimming partition {partition}",
                lambda: obstore.put(
                    self.store, self._key(partition, TRIM_FILE), json.dumps(doc).encode(), mode=mode
                ),
            )
        except (AlreadyExistsError, PreconditionError):
            if not self._trim_is(partition, trim_id):
                return None  # another trim came first: the next check decides again
        gone = [p.key for p in chain.pieces if p.end <= new.start]
        gone += [self._key(partition, COMMITS, commit_name(s)) for s in range(prev_from, from_seq)]
        self._delete(gone)
        with self._mutex:
            self._chains.pop(partition, None)
            gone_keys = set(gone)
            for key in [k for k in self._tables if k.split("#", 1)[0] in gone_keys]:
                del self._tables[key]
        return TrimResult(partition, prev, new)

    def _delete(self, keys: Sequence[str]) -> None:
        delete_objects(self.loc, self.store, keys, "removing objects")

    # -- reading --

    def _table(self, partition: int, piece: _Piece, names: Sequence[str]) -> pa.Table:
        """The segment's records in columns ``names``. A read of system columns alone (the
        planner's, on the driver) fetches only their byte ranges of the object (the IPC
        file's footer says where they are), never the payload, and checks no checksum (it
        covers a whole batch); other reads fetch the whole object and check every record batch
        against its checksum (``read_ipc_checked``), then keep it in a small
        cache (committed segments never change)."""
        import obstore

        projected = (
            set(names) <= set(LOG_SYSTEM_COLUMNS)
            and len(self._file_schema) > len(LOG_SYSTEM_COLUMNS)
            and piece.size > 0
        )
        cache_key = f"{piece.key}#{','.join(names)}" if projected else piece.key
        with self._mutex:
            table = self._tables.get(cache_key)
            if table is not None:
                self._tables.move_to_end(cache_key)
                return table if projected else table.select(names)
        what = f"reading partition {partition}"
        try:
            if projected:
                fields = [self._file_schema.get_field_index(n) for n in names]
                source = pa.PythonFile(_RangeFile(self.loc, self.store, piece, what), mode="r")
                reader = pa.ipc.open_file(
                    source, options=pa.ipc.IpcReadOptions(included_fields=fields)
                )
                table = reader.read_all()
            else:
                raw = call(
                    self.loc,
                    what,
                    lambda: obstore.get(self.store, piece.key).bytes(),
                    reads=piece.size or None,
                )
                # Every batch checked against its checksum before any of it is kept or returned.
                where = f"segment {piece.key} of {self.location}"
                table = read_ipc_checked(bytes(raw), where, piece.first)
        except FileNotFoundError:  # obstore's not found
            kept = self.start_offset(partition)
            if piece.first < kept:
                raise data_loss(self.location, partition, piece.first, kept) from None
            raise CorruptLogError(
                f"segment {piece.key} of {self.location} (records [{piece.first}, {piece.end})) "
                "is missing: the partition cannot be read from there on"
            ) from None
        except pa.ArrowInvalid as e:
            raise CorruptLogError(f"segment {piece.key} of {self.location} is damaged: {e}") from e
        stats = SegmentStats.from_metadata(table.schema.metadata, piece.key)
        if table.num_rows != piece.stats.count or (stats.first, stats.count) != (
            piece.first,
            piece.stats.count,
        ):
            raise CorruptLogError(
                f"segment {piece.key} of {self.location} holds {table.num_rows} records from "
                f"{stats.first}; its commit says [{piece.first}, {piece.end})"
            )
        table = table.replace_schema_metadata(None)
        with self._mutex:
            self._tables[cache_key] = table
            while len(self._tables) > self._cache_segments:
                self._tables.popitem(last=False)
        return table if projected else table.select(names)

    def read(
        self, partition: int, start: int, end: int, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """Records ``[start, end)`` of ``partition`` in offset order (the embedded log's
        rules: system columns first, ``end`` at most ``end_offset``)."""
        self._check_partition(partition)
        names = check_read(self._file_schema, columns, start, end, self.location)
        if start == end:
            return pa.schema([self._file_schema.field(n) for n in names]).empty_table()
        with self._mutex:
            chain = self._chains.get(partition)
        if chain is None or (chain.end or 0) < end:
            chain = self._refresh(partition)
        if (chain.end or 0) < end:
            raise OptionError(
                f"cannot read [{start}, {end}) of partition {partition} of {self.location}: only "
                f"{chain.end or 0} records are committed"
            )
        pieces = chain.pieces
        if not pieces or start < pieces[0].first:
            kept = pieces[0].first if pieces else chain.trim.start
            raise data_loss(self.location, partition, start, kept)
        out = []
        for piece in pieces:
            if piece.end <= start or piece.first >= end:
                continue
            t = self._table(partition, piece, names)
            lo, hi = max(start, piece.first) - piece.first, min(end, piece.end) - piece.first
            out.append(t if (lo, hi) == (0, piece.stats.count) else t.slice(lo, hi - lo))
        return out[0] if len(out) == 1 else pa.concat_tables(out)

    # -- appending --

    def writer_of(self, partition: int) -> str | None:
        """The ``host:pid`` of the writer whose lease on ``partition`` lives now, or None: a
        look that writes nothing (taking the lock to see would commit an epoch)."""
        self._check_partition(partition)
        lease = Lease(self.store, self.loc, self._key(partition, LEASE_FILE), "", 1.0)
        doc, _ = lease._read()
        if doc is None or not doc.get("owner") or int(doc.get("expires_us", 0)) <= _now_us():
            return None
        return str(doc.get("holder") or "?")

    def lock_partition(
        self, partition: int, where: str, *, lease_s: float | None = None
    ) -> ObjectAppender:
        """The partition's one appender (its lease taken, its epoch committed); raises
        ``WriterLockedError`` while another writer's lease lives."""
        self._check_partition(partition)
        return ObjectAppender(self, partition, where, lease_seconds(lease_s))


class ObjectAppender:
    """The one appender of a partition: holds its lease and commits runs as numbered commit
    objects. Use ``ObjectStream.lock_partition``."""

    def __init__(self, stream: ObjectStream, partition: int, where: str, lease_s: float):
        self.stream = stream
        self.partition = partition
        self.where = where
        self.lease = Lease(
            stream.store, stream.loc, stream._key(partition, LEASE_FILE), where, lease_s
        )
        self.epoch = self.lease.acquire()
        self._broken: str | None = None
        # A commit whose outcome is unknown: (its number, its document).
        self._pending: tuple[int, dict[str, Any]] | None = None
        try:
            self._take_over()
        except BaseException:
            self.lease.release()
            raise

    def _take_over(self) -> None:
        """Commit this writer's epoch as the next commit: from now on a writer of an earlier
        epoch cannot commit (the number it needs is taken). Then remove segments that earlier
        writers uploaded and never committed."""
        for _ in range(16):
            chain = self.stream._refresh(self.partition)
            self._refuse_damage(chain)
            self._next_seq = chain.next_seq
            end = chain.trim.start if chain.end is None else chain.end
            if self._create_commit({"first": end, "segments": []}, fenced_ok=True):
                break
        else:
            raise WriterLockedError(f"{self.where}: cannot commit this writer's epoch; try again")
        tail = self.stream.tail(self.partition)
        self._tail = tail
        try:
            self._remove_orphans()
        except Exception:
            pass  # housekeeping: the next writer tries again

    def _refuse_damage(self, chain: _Chain) -> None:
        """Refuse to take over a partition whose commits the protocol cannot have left: this
        writer's epoch commit would go where one is missing, making what the later commits
        name invisible for good, and ``_remove_orphans`` would then delete their
        segments (recovery never deletes on the strength of a name or a number)."""
        stream = self.stream
        commits = stream._key(self.partition, COMMITS)
        if chain.beyond is not None:
            missing = commit_name(chain.next_seq)
            raise CorruptLogError(
                f"{self.where}: commit object {commits}/{missing} is missing, and commits from "
                f"{commit_name(chain.beyond)} on exist after it: what they name is not "
                "visible, and a writer taking the partition over would commit in the gap and "
                "make it invisible for good. Nothing was written or removed. Restore the "
                f"missing commit from a backup, or, to give up what the later commits name, "
                "move them aside (readers read the records up to the gap)"
            )
        if chain.end is None and chain.from_seq > 0:
            raise CorruptLogError(
                f"{self.where}: {TRIM_FILE} says the partition is kept from commit "
                f"{commit_name(chain.from_seq)} on, and {commits}/ holds no such commit (a trim "
                "never removes the last one: was the trim object restored from a newer backup "
                "than the commits?). Nothing was written or removed; restore the trim object "
                "of the same backup as the commits"
            )

    def _remove_orphans(self) -> None:
        import obstore

        stream = self.stream
        prefix = stream._key(self.partition, SEGMENTS) + "/"
        chain = stream._refresh(self.partition)
        named = {p.key for p in chain.pieces}
        orphans = []
        for chunk in obstore.list(stream.store, prefix):
            for meta in chunk:
                key = meta["path"]
                name = key.rsplit("/", 1)[-1]
                try:
                    epoch = int(name.split(".e", 1)[1].split(".", 1)[0])
                except (ValueError, IndexError):
                    continue
                # An earlier epoch's segment that no kept commit names was never committed (or
                # is a trim's leftover): no commit can name it any more, since a commit of an
                # earlier epoch after ours is ignored.
                if epoch < self.epoch and key not in named:
                    orphans.append(key)
        stream._delete(orphans)

    def _create_commit(self, body: dict[str, Any], *, fenced_ok: bool = False) -> bool:
        """Create commit ``_next_seq``; True if this writer made it. Another writer's commit
        there means this one was fenced (raise), or, while taking over (``fenced_ok``), that
        a writer of an earlier epoch committed before our epoch did (False: look again)."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        stream = self.stream
        commit_id = uuid.uuid4().hex
        doc = {
            "v": _FORMAT,
            "epoch": self.epoch,
            "owner": self.lease.token,
            "id": commit_id,
            "time_us": _now_us(),
            **body,
        }
        seq = self._next_seq
        key = stream._key(self.partition, COMMITS, commit_name(seq))
        try:
            call(
                stream.loc,
                f"committing to {self.where}",
                lambda: obstore.put(stream.store, key, json.dumps(doc).encode(), mode="create"),
            )
        except (AlreadyExistsError, PreconditionError):
            try:  # confirm: maybe ours (S3's 409, or a retried attempt whose answer was lost)
                theirs = stream._read_commit(self.partition, seq)
            except BaseException:
                if not fenced_ok:
                    self._pending = (seq, doc)  # still unknown: as below
                raise
            if theirs is None or theirs.get("id") != commit_id:
                if fenced_ok and theirs is not None and int(theirs.get("epoch", 0)) < self.epoch:
                    return False
                self._broken = (
                    f"{self.where}: this writer (epoch {self.epoch}) was fenced: another writer "
                    f"took the partition over (commit {seq} is epoch "
                    f"{None if theirs is None else theirs.get('epoch')}'s), after this writer's "
                    "lease expired (was the process paused, or the store away, longer than "
                    "the lease?). Nothing of this append is visible; open a new writer"
                )
                raise WriterLockedError(self._broken) from None
        except BaseException:
            if fenced_ok:
                raise  # taking over: the constructor fails, the next writer looks again
            # Unknown outcome (the store did not answer, or its reply was lost): commit `seq`
            # may be ours. Nothing else may be committed before we know: the next append must
            # be this one again, and ``_finish_pending`` finds out (the commit's id).
            self._pending = (seq, doc)
            raise
        self._next_seq = seq + 1
        return True

    def _finish_pending(self, first: int, end: int) -> None:
        """Complete the commit whose outcome is unknown, or recognise it as made: read commit
        ``seq`` back; ours (its id) means it was made and its reply lost; absent means it was
        not (yet): create the same document again (the same id, so a late copy of the first
        request and this one cannot both count); another writer's means this one was fenced.
        ``[first, end)`` is what the caller retries: it must be the pending append."""
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        assert self._pending is not None
        seq, doc = self._pending
        segs = doc["segments"]
        pending_end = SegmentStats(**segs[-1]["stats"]).end if segs else int(doc["first"])
        if (first, end) != (int(doc["first"]), pending_end):
            raise OptionError(
                f"{self.where}: the append of records [{doc['first']}, {pending_end}) failed "
                f"with an unknown outcome, and records [{first}, {end}) are appended next: "
                "retry the same append first (Writer.flush() does), or open a new writer"
            )
        import obstore

        stream = self.stream
        key = stream._key(self.partition, COMMITS, commit_name(seq))
        theirs = stream._read_commit(self.partition, seq)
        if theirs is None:
            try:
                call(
                    stream.loc,
                    f"committing to {self.where} (again: the first attempt's outcome was unknown)",
                    lambda: obstore.put(stream.store, key, json.dumps(doc).encode(), mode="create"),
                )
                theirs = doc
            except (AlreadyExistsError, PreconditionError):
                theirs = stream._read_commit(self.partition, seq)
        if theirs is None or theirs.get("id") != doc["id"]:
            self._pending = None
            self._broken = (
                f"{self.where}: this writer (epoch {self.epoch}) was fenced: another writer "
                f"took the partition over (commit {seq} is epoch "
                f"{None if theirs is None else theirs.get('epoch')}'s) while this writer's "
                f"append of records [{first}, {end}) had an unknown outcome; that append is not "
                "visible. Open a new writer (its end_offset says what is committed)"
            )
            raise WriterLockedError(self._broken)
        self._pending = None
        self._next_seq = seq + 1

    def tail(self) -> PartitionTail:
        return self._tail

    def _check(self) -> None:
        if self._broken is not None:
            raise WriterLockedError(self._broken)
        if self.lease.lost:
            self._broken = (
                f"{self.where}: this writer's lease on the partition was taken by another "
                "writer (its own expired: was the process paused, or the store away, longer "
                "than the lease?); nothing more is written: open a new writer"
            )
            raise WriterLockedError(self._broken)

    def _upload(self, stats: SegmentStats, data: Any) -> dict[str, Any]:
        import obstore

        stream = self.stream
        name = f"{stats.first:020d}-{stats.count:010d}.e{self.epoch}.{uuid.uuid4().hex[:12]}.arrow"
        key = stream._key(self.partition, SEGMENTS, name)
        call(
            stream.loc,
            f"uploading records [{stats.first}, {stats.end}) of {self.where}",
            lambda: obstore.put(stream.store, key, data),
            writes=len(data),
        )
        return {"key": key, "size": len(data), "stats": _stats_doc(stats)}

    def _commit_runs(self, segments: list[dict[str, Any]], last: SegmentStats) -> None:
        self._check()
        self._create_commit({"first": self._tail.end, "segments": segments})
        self._tail = PartitionTail(last.end, last.clock_us, last.last_arrival_us)

    def _retried(self, first: int, last: SegmentStats) -> bool:
        """True if this append is the one whose commit had an unknown outcome, now made."""
        if self._pending is None:
            return False
        self._finish_pending(first, last.end)
        self._tail = PartitionTail(last.end, last.clock_us, last.last_arrival_us)
        return True

    def append_run(self, stats: SegmentStats, chunks: Sequence[pa.Table | pa.RecordBatch]) -> None:
        """Upload the run as one segment object, then commit it (one conditional create).

        After an error the outcome may be unknown (the commit's reply lost): the same call
        again completes that commit or finds it made, never both (``_finish_pending``).
        """
        self._check()
        if self._retried(stats.first, stats):
            return
        check_continues(self.where, stats.first, self._tail.end)
        sink = pa.BufferOutputStream()
        write_segment_to(sink, stats, self.stream.file_schema, chunks)
        seg = self._upload(stats, sink.getvalue().to_pybytes())
        self._commit_runs([seg], stats)

    def append_segment_files(self, paths: Sequence[str], *, reject: bool, verify: bool) -> None:
        """Check the files, upload each as a segment object, and commit them all at once."""
        self._check()
        checked = check_appended_files(self, paths, reject=reject, verify=verify)
        if not checked:
            return
        if self._retried(checked[0][1].first, checked[-1][1]):
            return
        segments = []
        for path, stats in checked:
            with open(path, "rb") as f:
                segments.append(self._upload(stats, f.read()))
        self._commit_runs(segments, checked[-1][1])

    def release(self) -> None:
        self.lease.release()

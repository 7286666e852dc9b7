"""The embedded log: a stream is a directory of immutable Arrow IPC segment files.

Layout (format version 1)::

    <stream>/_stream.json                      metadata (streams.meta): schema, partitions, defaults
    <stream>/_retention.json                   retention changed by ops (streams.retention)
    <stream>/partition-0000/_trim.json         first kept offset and the state there
    <stream>/partition-0000/_writer.lock       flock'd by the one live writer (streams.lock)
    <stream>/partition-0000/00000000000000000000-0000001000.arrow   offsets [0, 1000)
    <stream>/partition-0000/00000000000000001000-0000000001.arrow   offset 1000
    <stream>/partition-0000/.tmp.<pid>.<uuid>.arrow                 being written; ignored

A segment is an Arrow IPC *file* (random access, memory-mappable) named by its first offset and
record count. It is written under a temporary name, fsync'd, linked to its final name (which
fails rather than overwrite), and the directory fsync'd: a reader never sees half a segment and
a committed segment survives a crash. Its columns are the system columns

* ``__arrival_us`` int64, not null: the writer's clock when it appended the record, made
  non-decreasing per partition (``max(previous, now)``);
* ``__rowtime_us`` int64: the explicit rowtime a writer gave, the bound of a bound record, or
  null (implicit rowtime: the arrival time is the rowtime);
* ``__is_bound`` bool, not null;

then the payload columns (all nullable in the file: a bound record's payload is null). A
record's offset is the segment's first offset plus its index in the file.

Each segment's schema metadata (``rowtime.*`` keys, see ``segments.SegmentStats``, where
the file format is defined and checked) summarises it:
the partition clock after it, min/max data rowtime, last bound, last arrival, skew. The clock of
a partition is read from its last segment's footer alone.

Small segments (a writer that flushes every row, heartbeats) are merged by the writer, sixteen
of a size class at a time (``merge.compact_tail``). The merged segment
covers exactly the offsets of the ones it replaces and is committed, and read back, before they
are removed, so at every moment the directory holds a complete chain from offset 0. A listing
that races with a change may see a gap: it is retried.

**No file goes on the strength of its name.** Where a listing (``folder``) finds files
whose offsets overlap (a merged segment beside its parts; equally a stray copy or a
half-restored backup), the larger is taken into the chain only if it verifies
(``folder.claim_problem``: its footer and record count are its name's, its checksums
match); otherwise the chain goes on through the others. The writer that opens a partition next
(``merge.clean_partition``) removes a file outside the chain only after verifying that the
chain holds its records, value for value, or (an interrupted trim's) that it lies before the
first kept offset and is what its name says; anything else stays, every file with it, and the
writer refuses with ``CorruptLogError`` naming the files and what to do, as PostgreSQL
refuses to start rather than delete. A writer killed at any step of a merge or a trim loses
nothing (``tests/test_recovery.py``).

Retention (``retention``) removes whole segments from the head of a partition: the chain
then starts at the first kept offset that ``_trim.json`` records, and offsets never change.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from ...bounds.bounds import merge_clock
from ...bounds.errors import (
    CorruptLogError,
    OptionError,
)
from ..checksums import SegmentChecks, reads_payload
from ..lock import LOCK_FILE, PartitionLock
from ..meta import (
    META_FILE,
    StreamMeta,
    check_same_stream,
    fsync_dir,
    narrow_mode,
    payload_schema,
    read_meta,
    validate_defaults,
    write_meta_once,
)
from ..retention import (
    RETENTION_FILE,
    TRIM_FILE,
    Retention,
    TrimResult,
    TrimState,
    Unit,
    data_loss,
)
from ..segments import (
    SegmentStats,
    check_appended_files,
    open_checked_segment,
    segment_schema,
    verify_segment_file,
)
from ..storage import (
    PartitionAppender,
    PartitionTail,
    check_continues,
    check_partition,
    check_read,
    local_path,
    stream_not_found,
)
from .folder import (
    _LIST_RETRIES,
    TRIM_LOCK_FILE,
    Segment,
    _flock,
    link_segment,
    list_segments,
    partition_dirname,
    read_trim_state,
    write_segment,
)
from .merge import clean_partition, compact_tail

__all__ = [
    "Stream",
    "create_stream",
    "open_stream",
    "resolve_location",
]

#: A path or ``file://`` URL as an absolute local path (kept under its old name).
resolve_location = local_path

# -- streams ---------------------------------------------------------------------------------


class Stream:
    """A stream opened for reading. Cheap to create; safe to use from several threads.

    Listings are refreshed on every ``end_offset``; segment files are memory-mapped once
    and cached (they never change), up to ``cache_segments`` of them. A read checks the record
    batches it returns against their checksums (``SegmentChecks``).
    """

    def __init__(self, meta: StreamMeta, *, cache_segments: int = 256) -> None:
        self.meta = meta
        self.location = meta.location
        self.file_schema = segment_schema(meta.payload_schema)
        self._chains: dict[int, list[Segment]] = {}
        self._tables: OrderedDict[str, tuple[pa.Table, SegmentChecks]] = OrderedDict()
        self._stats: dict[str, SegmentStats] = {}
        self._cache_segments = cache_segments
        self._mutex = threading.Lock()

    def __repr__(self) -> str:
        return f"Stream({self.location!r}, partitions={self.meta.partitions})"

    # -- layout --

    def partition_dir(self, partition: int) -> str:
        self._check_partition(partition)
        return os.path.join(self.location, partition_dirname(partition))

    def _check_partition(self, partition: int) -> None:
        check_partition(self.location, self.meta.partitions, partition)

    def segments(self, partition: int, refresh: bool = True) -> list[Segment]:
        """The committed segments of a partition, in offset order from the one holding its
        first kept offset (offset 0 until a trim)."""
        if refresh or partition not in self._chains:
            chain, _, _ = list_segments(self.partition_dir(partition))
            with self._mutex:
                self._chains[partition] = chain
            return chain
        return self._chains[partition]

    # -- offsets and clocks --

    def end_offset(self, partition: int) -> int:
        """The number of committed records of ``partition`` (the offset the next one gets)."""
        chain = self.segments(partition)
        return chain[-1].end if chain else 0

    def stats(self, segment: Segment) -> SegmentStats:
        """A segment's footer statistics (cached: segments never change)."""
        cached = self._stats.get(segment.path)
        if cached is not None:
            return cached
        self._table(segment)  # reads and checks the footer
        return self._stats[segment.path]

    def partition_stats(self, partition: int) -> list[SegmentStats]:
        return [self.stats(s) for s in self._stable(partition, lambda c: c)]

    def stored_bytes(self, partition: int) -> int | None:
        """Bytes of the partition's files (None without its folder): what it takes on disk."""
        folder = self.partition_dir(partition)
        if not os.path.isdir(folder):
            return None
        total = 0
        for entry in os.scandir(folder):
            try:
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                pass  # removed since the listing (a trim, a merge): it takes no space now
        return total

    def verify(self, partition: int) -> tuple[int, int]:
        """Check every record batch of a partition against its checksum (reads every byte of
        its segments); returns how many batches were checked and how many had none (segments
        written before checksums). Raises ``CorruptLogError`` naming the file and the
        records of the first damaged batch."""

        def run(chain: list[Segment]) -> tuple[int, int]:
            checked = unchecked = 0
            for segment in chain:
                c, u = verify_segment_file(segment.path)
                checked, unchecked = checked + c, unchecked + u
            return checked, unchecked

        return self._stable(partition, run)

    def clock_us(self, partition: int) -> int | None:
        """The partition clock (SPEC 5): its highest bound or data rowtime (explicit, or the
        arrival time of implicit rows), in microseconds; None while the partition is empty."""

        def last_clock(chain: list[Segment]) -> int | None:
            return self.stats(chain[-1]).clock_us if chain else None

        return self._stable(partition, last_clock)

    def stream_clock_us(self) -> int | None:
        """The stream clock: the minimum of the partition clocks, None if any is empty."""
        return merge_clock(self.clock_us(p) for p in range(self.meta.partitions))

    def tail(self, partition: int) -> PartitionTail:
        """End offset, clock and last arrival of ``partition``, from its last footer."""

        def last(chain: list[Segment]) -> PartitionTail:
            if not chain:
                return PartitionTail()
            stats = self.stats(chain[-1])
            return PartitionTail(stats.end, stats.clock_us, stats.last_arrival_us)

        return self._stable(partition, last)

    # -- retention (streams.retention) --

    def start_offset(self, partition: int) -> int:
        """The first kept offset of ``partition`` (0 until retention or a trim removed some)."""
        return self.trim_state(partition).start

    def trim_state(self, partition: int) -> TrimState:
        """The partition's trim: its first kept offset and the policy state there."""
        return read_trim_state(self.partition_dir(partition))

    def retention(self) -> Retention:
        """The stream's retention: ops' last change (``_retention.json``), else the one it
        was created with."""
        path = os.path.join(self.location, RETENTION_FILE)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return Retention.of_defaults(self.meta.defaults)
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise CorruptLogError(f"{path} cannot be read ({e}): it was damaged") from e
        return Retention.from_doc(doc, path)

    def set_retention(self, retention: Retention) -> None:
        """Change the stream's retention (ops): written atomically beside ``_stream.json``,
        which is never rewritten. Writers pick it up at their next check."""
        _write_atomic(self.location, RETENTION_FILE, json.dumps(retention.to_doc()) + "\n")

    def trim_partition(
        self, partition: int, decide: Callable[[list[Unit], TrimState], TrimState | None]
    ) -> TrimResult | None:
        """Remove the head segments ``decide`` lets go (``retention.choose_trim``).

        Under the partition's trim lock (a flock on ``_trim.lock``: one trim at a time; the
        writer's appends and merges go on). The new ``TrimState`` is written (atomically,
        fsync'd) before any segment is removed, so readers never see a gap: a listing starts at
        the first kept offset. A reader that holds a removed segment memory-mapped keeps its
        records (Linux frees the file when the last map goes); one that opens it after the
        trim gets ``DataLossError``. A trim killed between the two leaves
        segments before the first kept offset, which the next writer removes once their
        footers say they are what their names say (``merge.clean_partition``)."""
        part_dir = self.partition_dir(partition)
        with _flock(os.path.join(part_dir, TRIM_LOCK_FILE)):
            prev = read_trim_state(part_dir)
            chain, _, _ = list_segments(part_dir)
            units = []
            try:
                for seg in chain:
                    st = self.stats(seg)
                    units.append(
                        Unit(
                            seg.first,
                            seg.count,
                            st.rows,
                            os.path.getsize(seg.path),
                            st.max_rowtime_us,
                            st.last_bound_us,
                            st.clock_us,
                            last_arrival_us=st.last_arrival_us,
                        )
                    )
            except FileNotFoundError:
                return None  # merged meanwhile: the next check trims
            new = decide(units, prev)
            if new is None or new.start <= prev.start:
                return None
            _write_atomic(part_dir, TRIM_FILE, new.to_json() + "\n")
            for seg in chain:
                if seg.end <= new.start:
                    try:
                        os.unlink(seg.path)
                    except FileNotFoundError:
                        pass
            fsync_dir(part_dir)
            with self._mutex:
                self._chains.pop(partition, None)
            return TrimResult(partition, prev, new)

    # -- appending --

    def lock_partition(self, partition: int, where: str) -> PartitionAppender:
        """The partition's one appender: its ``flock`` (``streams.lock``) taken, leftovers of
        a writer that died removed."""
        return _LogAppender(self, partition, where)

    # -- reading --

    def _table(self, segment: Segment) -> pa.Table:
        return self._mapped(segment)[0]

    def _mapped(self, segment: Segment) -> tuple[pa.Table, SegmentChecks]:
        """The segment's records (memory-mapped) and its batches' checksums, checked as reads
        touch them; the footer is checked when the file is first mapped."""
        with self._mutex:
            cached = self._tables.get(segment.path)
            if cached is not None:
                self._tables.move_to_end(segment.path)
                return cached
        try:
            table, checks = open_checked_segment(segment.path)
        except FileNotFoundError:
            raise
        except (OSError, pa.ArrowException) as e:  # a damaged file: any of Arrow's errors
            raise _damaged(segment, f"cannot be read ({e})") from e
        if table.num_rows != segment.count:
            raise _damaged(
                segment, f"holds {table.num_rows} records, its name says {segment.count}"
            )
        # The footer is read with the records: a segment of a newer format is refused before
        # any of its records is used.
        stats = SegmentStats.from_metadata(table.schema.metadata, segment.path)
        if (stats.first, stats.count) != (segment.first, segment.count):
            raise _damaged(segment, f"says it holds [{stats.first}, {stats.end}) in its footer")
        checks.first = stats.first
        self._stats[segment.path] = stats
        with self._mutex:
            self._tables[segment.path] = (table, checks)
            while len(self._tables) > self._cache_segments:
                self._tables.popitem(last=False)
        return table, checks

    def _stable(self, partition: int, fn: Any, fresh: bool = True) -> Any:
        """Run ``fn(chain)``; if a segment vanished meanwhile (merged by the writer), re-list
        and run again. Merging never changes content, so the retry sees the same records.
        ``fresh=False`` tries the cached listing first."""
        for attempt in range(_LIST_RETRIES):
            chain = self.segments(partition, refresh=fresh or attempt > 0)
            try:
                return fn(chain)
            except FileNotFoundError:
                continue
        raise CorruptLogError(
            f"segments of partition {partition} of {self.location} keep disappearing while read"
        )

    def read(
        self,
        partition: int,
        start: int,
        end: int,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """Records ``[start, end)`` of ``partition`` in offset order.

        ``columns`` selects columns by name (system columns included); None means all, system
        columns first. The table's buffers point into memory-mapped segment files: nothing is
        copied and unselected columns are never touched. ``end`` may not pass
        ``end_offset``. A read with any payload column checks each record batch it returns
        from against its checksum first, once per process (``SegmentChecks``):
        a damaged one raises ``CorruptLogError`` naming the file and its records.
        """
        names = check_read(self.file_schema, columns, start, end, self.location)
        verify = reads_payload(names)
        if start == end:
            self._check_partition(partition)
            return pa.schema([self.file_schema.field(n) for n in names]).empty_table()

        def slice_chain(chain: list[Segment]) -> pa.Table:
            if not chain or chain[-1].end < end:
                raise _Refresh()
            if chain[0].first > start:
                raise data_loss(self.location, partition, start, chain[0].first)
            pieces = []
            i = _find(chain, start)
            while i < len(chain) and chain[i].first < end:
                seg = chain[i]
                table, checks = self._mapped(seg)
                table = table.select(names)
                lo = max(start, seg.first) - seg.first
                hi = min(end, seg.end) - seg.first
                if verify:
                    checks.check(lo, hi)
                pieces.append(table if (lo, hi) == (0, seg.count) else table.slice(lo, hi - lo))
                i += 1
            if len(pieces) == 1:
                return pieces[0].replace_schema_metadata(None)
            return pa.concat_tables(pieces).replace_schema_metadata(None)

        try:
            return self._stable(partition, slice_chain, fresh=False)
        except _Refresh:
            pass  # the cached listing was behind: list once more
        try:
            return self._stable(partition, slice_chain)
        except _Refresh:
            raise OptionError(
                f"cannot read [{start}, {end}) of partition {partition} of {self.location}: only "
                f"{self.end_offset(partition)} records are committed"
            ) from None


def _damaged(segment: Segment, why: str) -> CorruptLogError:
    """The error for a segment file that is not as written: the file, its records, what to do."""
    try:
        size = f"{os.path.getsize(segment.path)} bytes"
    except OSError:
        size = "size unknown"
    return CorruptLogError(
        f"segment {segment.path} ({size}), records [{segment.first}, {segment.end}) of its "
        f"partition, {why}: the log is damaged. The partition cannot be read from offset "
        f"{segment.first} on; restore the file from a backup (other partitions are unaffected)"
    )


class _LogAppender:
    """The embedded log's ``PartitionAppender``: holds the partition's flock;
    appends segment files (write, fsync, link, fsync the folder) and merges small ones."""

    def __init__(self, stream: Stream, partition: int, where: str) -> None:
        self.stream = stream
        self.partition = partition
        self.where = where
        self._dir = stream.partition_dir(partition)  # validates the partition
        self._lock = PartitionLock(os.path.join(self._dir, LOCK_FILE))
        self._lock.acquire(where)
        try:
            clean_partition(stream, partition)
            self._tail = stream.tail(partition)
        except BaseException:
            self._lock.release()
            raise

    def tail(self) -> PartitionTail:
        return self._tail

    def append_run(self, stats: SegmentStats, chunks: Sequence[pa.Table | pa.RecordBatch]) -> None:
        check_continues(self.where, stats.first, self._tail.end)
        write_segment(self._dir, stats, self.stream.file_schema, chunks)
        self._tail = PartitionTail(stats.end, stats.clock_us, stats.last_arrival_us)
        try:
            compact_tail(self.stream, self.partition)
        except OSError:
            pass  # merging is housekeeping: the next append tries again

    def append_segment_files(self, paths: Sequence[str], *, reject: bool, verify: bool) -> None:
        checked = check_appended_files(self, paths, reject=reject, verify=verify)
        for path, stats in checked:
            link_segment(self._dir, path, stats)
            self._tail = PartitionTail(stats.end, stats.clock_us, stats.last_arrival_us)
        if checked:
            fsync_dir(self._dir)

    def release(self) -> None:
        self._lock.release()


class _Refresh(Exception):
    pass


def _write_atomic(folder: str, name: str, text: str) -> None:
    """Replace ``folder/name`` with ``text`` atomically and durably (temporary file, fsync,
    rename, folder fsync): a reader sees the old file or the new one, whole."""
    # Not TMP_PREFIX: a writer starting meanwhile removes those (its own crash's leftovers).
    tmp = os.path.join(folder, f".new.{name}.{os.getpid()}.{uuid.uuid4().hex}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        narrow_mode(tmp, folder)
        os.replace(tmp, os.path.join(folder, name))
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    fsync_dir(folder)


def _find(chain: list[Segment], offset: int) -> int:
    """Index of the segment holding ``offset`` (binary search over first offsets)."""
    lo, hi = 0, len(chain)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if chain[mid].first <= offset:
            lo = mid
        else:
            hi = mid
    return lo


# -- creating and opening --------------------------------------------------------------------


def open_stream(location: str | os.PathLike[str]) -> Stream:
    """The stream at ``location`` (a path or ``file://`` URL).

    Raises ``StreamNotFoundError`` (naming the location and how to create a stream) when
    there is none.
    """
    return _open(resolve_location(location), str(location))


def _open(path: str, given: str) -> Stream:
    if not os.path.isdir(path):
        why = "not a directory" if os.path.exists(path) else "no such directory"
        raise stream_not_found(given, path, why)
    meta = read_meta(path)
    if meta is None:
        raise stream_not_found(given, path, f"the directory has no {META_FILE}")
    return Stream(meta)


def _now_us() -> int:
    """The creation time a new stream records (the wall clock, as writers' arrivals)."""
    return time.time_ns() // 1000


def create_stream(
    location: str | os.PathLike[str],
    schema: str | pa.Schema,
    partitions: int = 1,
    **defaults: Any,
) -> Stream:
    """Create a stream (or open the identical one that exists) and return it.

    ``schema`` is a Spark DDL string or a pyarrow schema; ``defaults`` are the ops' defaults for
    readers (``streams.meta.KNOWN_DEFAULTS``; Spark spellings such as ``adjust.unit`` work
    too). A stream that exists with another schema or partition count, or other defaults when
    defaults are given, is an error; with the same ones this is a no-op.
    """
    path = resolve_location(location)
    payload = payload_schema(schema)
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise OptionError(f"partitions={partitions!r} must be a whole number >= 1")
    checked = validate_defaults(defaults, payload)
    meta = StreamMeta(
        path, payload, partitions, checked, stream_id=uuid.uuid4().hex, created_us=_now_us()
    )

    existing = read_meta(path)
    if existing is None:
        if os.path.exists(path) and not os.path.isdir(path):
            raise OptionError(f"cannot create a stream at {path}: a file is in the way")
        if os.path.isdir(path):
            # Names starting with _ or . belong to tools (a sink's _rowtime_sink/, say).
            strangers = [n for n in os.listdir(path) if not n.startswith(("partition-", "_", "."))]
            if strangers:
                raise OptionError(
                    f"cannot create a stream at {path}: the folder already holds other files "
                    f"({', '.join(sorted(strangers)[:5])}); choose an empty or new folder"
                )
        os.makedirs(path, exist_ok=True)
        for p in range(partitions):
            os.makedirs(os.path.join(path, partition_dirname(p)), exist_ok=True)
            narrow_mode(os.path.join(path, partition_dirname(p)), path)
        fsync_dir(path)
        if write_meta_once(meta):
            return Stream(meta)
        existing = read_meta(path)  # another process created it just now
        assert existing is not None
    check_same_stream(existing, meta, given_defaults=bool(defaults))
    return Stream(existing)

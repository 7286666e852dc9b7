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

Each segment's schema metadata (``rowtime.*`` keys, see :class:`.segments.SegmentStats`, where
the file format is defined and checked) summarises it:
the partition clock after it, min/max data rowtime, last bound, last arrival, skew. The clock of
a partition is read from its last segment's footer alone.

Small segments (a writer that flushes every row, heartbeats) are merged by the writer, sixteen
of a size class at a time (:func:`compact_tail`). The merged segment
covers exactly the offsets of the ones it replaces and is committed, and read back, before they
are removed, so at every moment the directory holds a complete chain from offset 0. A listing
that races with a change may see a gap: it is retried.

**No file goes on the strength of its name** (issue 55). Where a listing finds files whose
offsets overlap (a merged segment beside its parts; equally a stray copy or a half-restored
backup), the larger is taken into the chain only if it verifies (:func:`claim_problem`: its
footer and record count are its name's, its checksums match); otherwise the chain goes on
through the others. The writer that opens a partition next (:func:`clean_partition`) removes a
file outside the chain only after verifying that the chain holds its records, value for value,
or (an interrupted trim's) that it lies before the first kept offset and is what its name says;
anything else stays, every file with it, and the writer refuses with :class:`CorruptLogError`
naming the files and what to do, as PostgreSQL refuses to start rather than delete. A writer
killed at any step of a merge or a trim loses nothing (``tests/test_recovery.py``).

Retention (:mod:`.retention`) removes whole segments from the head of a partition: the chain
then starts at the first kept offset that ``_trim.json`` records, and offsets never change.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import itertools
import json
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ...bounds.arrays import as_numpy, to_arrow
from ...bounds.bounds import merge_clock
from ...bounds.errors import (
    CorruptLogError,
    OptionError,
)
from ..checksums import SegmentChecks, reads_payload
from ..columns import LOG_ARRIVAL_US, LOG_IS_BOUND, LOG_ROWTIME_US
from ..lock import LOCK_FILE, PartitionLock
from ..meta import (
    META_FILE,
    StreamMeta,
    check_same_stream,
    fsync_dir,
    narrow_mode,
    payload_schema,
    publish,
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
    SEGMENT_RE,
    SegmentStats,
    check_appended_files,
    open_checked_segment,
    open_segment_file,
    segment_name,
    segment_schema,
    verify_segment_file,
    write_segment_file,
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

__all__ = [
    "Stream",
    "create_stream",
    "open_stream",
    "resolve_location",
]

#: A path or ``file://`` URL as an absolute local path (kept under its old name).
resolve_location = local_path

TMP_PREFIX = ".tmp."

#: Segments smaller than this many records take part in merging (size classes of 16x).
COMPACT_BELOW_RECORDS = 1 << 16
COMPACT_FANIN = 16

_LIST_RETRIES = 9


def partition_dirname(partition: int) -> str:
    return f"partition-{partition:04d}"


@dataclass(frozen=True)
class Segment:
    first: int
    count: int
    path: str

    @property
    def end(self) -> int:
        return self.first + self.count


@dataclass(frozen=True)
class Listing:
    """What a partition folder holds: the chain readers read, and the files outside it.

    ``chain``: the segments from the one holding the first kept offset ``start``, each one
    continuing the last. ``leftovers``: segment files whose offsets lie inside the chain's
    and that are not part of it (what an interrupted merge leaves). ``trimmed``: segment files
    wholly before ``start`` (what an interrupted trim leaves). ``rejected``: segment files that
    claim offsets other files hold and failed verification (:func:`claim_problem`), each with
    the reason: a stray copy, a half-restored backup, a damaged merge. ``temps``: temporary
    files. Of the files outside the chain, only :func:`clean_partition` removes any, and only
    what it has verified."""

    chain: list[Segment]
    start: int
    leftovers: list[Segment]
    trimmed: list[Segment]
    rejected: list[tuple[Segment, str]]
    temps: list[str]


def read_trim_state(part_dir: str) -> TrimState:
    """The partition's trim (:mod:`.retention`), or the empty one (nothing removed)."""
    path = os.path.join(part_dir, TRIM_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return TrimState()
    return TrimState.from_json(text, path)


#: Verdicts of :func:`claim_problem` by file identity (path, inode, size, mtime): a committed
#: segment never changes, so a listing that meets the same overlap again does not read the
#: file again. Bounded; cleared when full.
_VERDICTS: dict[tuple[str, int, int, int], str | None] = {}
_VERDICTS_MAX = 1024


def _footer_problem(segment: Segment) -> tuple[pa.Table | None, str | None]:
    """The segment file's records, and why its footer or record count is not what its name
    says (None when they are). Raises :class:`FileNotFoundError` if the file is gone."""
    try:
        table = open_segment_file(segment.path)
        stats = SegmentStats.from_metadata(table.schema.metadata, segment.path)
    except FileNotFoundError:
        raise
    except CorruptLogError as e:
        return None, f"its footer cannot be read ({e})"
    except (OSError, pa.ArrowException) as e:
        return None, f"it cannot be read as a segment ({e})"
    if (stats.first, stats.count) != (segment.first, segment.count):
        return table, f"its footer says it holds records [{stats.first}, {stats.end})"
    if table.num_rows != segment.count:
        return table, f"it holds {table.num_rows} records"
    if stats.rows + stats.bounds != stats.count:
        return table, f"its footer counts {stats.rows} rows and {stats.bounds} bounds"
    return table, None


def claim_problem(segment: Segment) -> str | None:
    """Why the segment file is not what its name claims, or None when it is.

    Verified: its footer's first offset and record count equal its name's, it holds that many
    records (rows and bounds), and every record batch matches its checksum
    (:func:`.segments.verify_segment_file`; a segment written before checksums has none to
    match). Reads every byte of the file, so it runs only where a decision rests on the file:
    a segment whose offsets other files also hold, before it enters a chain, and before the
    files it would replace are removed. Raises :class:`FileNotFoundError` if the file is gone.
    """
    st = os.stat(segment.path)
    key = (segment.path, st.st_ino, st.st_size, st.st_mtime_ns)
    if key in _VERDICTS:
        return _VERDICTS[key]
    _, why = _footer_problem(segment)
    if why is None:
        try:
            verify_segment_file(segment.path)
        except CorruptLogError as e:
            why = f"its checksums do not match ({e})"
    if len(_VERDICTS) >= _VERDICTS_MAX:
        _VERDICTS.clear()
    _VERDICTS[key] = why
    return why


def list_segments(part_dir: str) -> tuple[list[Segment], list[str], list[str]]:
    """The chain of segments from the partition's first kept offset in ``part_dir``, plus
    leftovers: ``(chain, others, temps)``, ``others`` the paths of every segment file outside
    the chain (:class:`Listing`'s leftovers, trimmed and rejected files), ``temps`` the
    temporary files. See :func:`list_partition`."""
    listing = list_partition(part_dir)
    others = [s.path for s in (*listing.leftovers, *listing.trimmed)]
    others += [s.path for s, _ in listing.rejected]
    return listing.chain, others, listing.temps


def list_partition(part_dir: str) -> Listing:
    """The partition folder ``part_dir`` as a :class:`Listing`.

    The chain starts at the segment holding the first kept offset (:data:`.retention.TRIM_FILE`
    says which it is; 0 without one): the one starting there, or, where a merge raced with a
    trim, the merged segment that covers it. Where several files start at one offset, or a
    file's offsets overlap others' (an interrupted merge leaves the merged segment beside the
    ones it replaces; a stray copy or a half-restored backup leaves anything), the larger
    segment is taken only if it verifies (:func:`claim_problem`); otherwise it is rejected and
    the chain goes on through the others, so a file's name alone never hides records that
    verify. Raises :class:`CorruptLogError` if the chain has a gap that a fresh listing does
    not close (a concurrent rename or trim can make one listing miss a file, so it is
    retried).
    """
    for attempt in range(_LIST_RETRIES):
        by_first: dict[int, list[Segment]] = {}
        trimmed: list[Segment] = []
        temps: list[str] = []
        try:
            entries = list(os.scandir(part_dir))
        except FileNotFoundError:
            raise CorruptLogError(
                f"partition folder {part_dir} is missing: the stream is damaged"
            ) from None
        start = 0
        if any(e.name == TRIM_FILE for e in entries):
            start = read_trim_state(part_dir).start
        for entry in entries:
            name = entry.name
            m = SEGMENT_RE.match(name)
            if m is None:
                if name.startswith(TMP_PREFIX):
                    temps.append(entry.path)
                continue
            if entry.is_symlink():
                # The log never makes links: one planted here could show another file's records
                # (or another stream's) as this partition's.
                raise CorruptLogError(
                    f"segment {entry.path} is a symbolic link (to {os.readlink(entry.path)!r}): "
                    "the log never makes links, so someone put it there; remove it"
                )
            seg = Segment(int(m.group(1)), int(m.group(2)), entry.path)
            if seg.end <= start and seg.count > 0:
                trimmed.append(seg)  # a trim that stopped before removing it
                continue
            by_first.setdefault(seg.first, []).append(seg)
        gap: _Gap | None = None
        try:
            listing = _walk(by_first, start, trimmed, temps)
        except FileNotFoundError:
            pass  # a file being verified was removed meanwhile (merged, trimmed): look again
        else:
            if isinstance(listing, Listing):
                return listing
            gap = listing
        if attempt < _LIST_RETRIES - 1:
            time.sleep(0.0005 * 2**attempt)  # a racing rename settles in microseconds
    if gap is None:
        raise CorruptLogError(f"segments of partition folder {part_dir} keep disappearing")
    pos, gap_end = gap.pos, gap.end
    claims = "".join(
        f"; segment {s.path} claims offsets there, but {why}"
        for s, why in gap.rejected
        if s.first < gap_end and s.end > pos
    )
    raise CorruptLogError(
        f"partition folder {part_dir} has no segment for offsets [{pos}, {gap_end}): records are "
        f"missing (a segment file was removed?){claims}; the records from offset "
        f"{pos} on cannot be read in order"
    )


@dataclass(frozen=True)
class _Gap:
    pos: int
    end: int
    rejected: list[tuple[Segment, str]]


def _walk(
    by_first: dict[int, list[Segment]], start: int, trimmed: list[Segment], temps: list[str]
) -> Listing | _Gap:
    """One listing's chain from ``start`` (see :func:`list_partition`)."""
    total = sum(len(c) for c in by_first.values())
    if total == len(by_first) and start in by_first:
        # The usual folder: one file per first offset. If they make one chain, none overlaps.
        chain: list[Segment] = []
        pos = start
        while pos in by_first:
            one = by_first[pos][0]
            if one.count <= 0:
                raise CorruptLogError(f"segment {one.path} claims {one.count} records")
            chain.append(one)
            pos = one.end
        if len(chain) == total:
            return Listing(chain, start, [], sorted(trimmed, key=lambda s: s.first), [], temps)
    for same_first in by_first.values():
        if len(same_first) > 1:
            same_first.sort(key=lambda s: -s.count)  # the larger first: it replaces the others
    firsts = sorted(by_first)
    # the next first offset after each: where it is below a segment's end, files overlap
    next_first = dict(itertools.pairwise(firsts))
    rejected: dict[str, tuple[Segment, str]] = {}

    def overlaps(seg: Segment) -> bool:
        """Whether another file (not rejected) starts inside ``seg``'s offsets."""
        i = bisect.bisect_left(firsts, seg.first)
        while i < len(firsts) and firsts[i] < seg.end:
            if any(s is not seg and s.path not in rejected for s in by_first[firsts[i]]):
                return True
            i += 1
        return False

    def pick(candidates: list[Segment]) -> Segment | None:
        for seg in candidates:
            if seg.path in rejected:
                continue
            alone = len(candidates) == 1 and next_first.get(seg.first, seg.end) >= seg.end
            if seg.count > 0 and not alone and overlaps(seg):
                why = claim_problem(seg)
                if why is not None:
                    rejected[seg.path] = (seg, why)
                    continue
            return seg
        return None

    chain = []
    seg = pick(by_first.get(start, []))
    if seg is None and start:
        # a merge that raced with the trim made one segment across the first kept offset
        covering = [s for c in by_first.values() for s in c if s.first < start < s.end]
        seg = pick(sorted(covering, key=lambda s: -s.end))
    while seg is not None:
        if seg.count <= 0:
            raise CorruptLogError(f"segment {seg.path} claims {seg.count} records")
        chain.append(seg)
        seg = pick(by_first.get(seg.end, []))
    pos = chain[-1].end if chain else start
    leftovers: list[Segment] = []
    if total > len(chain):
        in_chain = {s.path for s in chain}
        leftovers = [
            s
            for c in by_first.values()
            for s in c
            if s.path not in in_chain and s.path not in rejected
        ]
    ahead = [s for s in leftovers if s.first >= pos]
    if ahead:
        return _Gap(pos, min(s.first for s in ahead), list(rejected.values()))
    return Listing(
        chain,
        start,
        sorted(leftovers, key=lambda s: (s.first, s.count)),
        sorted(trimmed, key=lambda s: s.first),
        sorted(rejected.values(), key=lambda r: (r[0].first, r[0].count)),
        temps,
    )


def write_segment(
    part_dir: str,
    stats: SegmentStats,
    schema: pa.Schema,
    chunks: Sequence[pa.Table | pa.RecordBatch],
) -> Segment:
    """Write records ``[stats.first, stats.end)`` as one committed segment file.

    Temporary file, fsync, link to the final name (fails if it exists: never overwrite a
    committed segment), directory fsync. On failure the temporary file is removed and nothing
    is committed.
    """
    tmp = os.path.join(part_dir, f"{TMP_PREFIX}{os.getpid()}.{uuid.uuid4().hex}.arrow")
    try:
        write_segment_file(tmp, stats, schema, chunks)
        narrow_mode(tmp, part_dir)
        segment = link_segment(part_dir, tmp, stats)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    fsync_dir(part_dir)
    return segment


def link_segment(part_dir: str, path: str, stats: SegmentStats) -> Segment:
    """Give the complete, fsync'd segment file ``path`` (same filesystem) its name in
    ``part_dir``: a hard link, so ``path`` keeps its own name too. The caller holds the
    partition's lock and fsyncs ``part_dir`` afterwards."""
    final = os.path.join(part_dir, segment_name(stats.first, stats.count))
    try:
        publish(path, final)
    except FileExistsError:
        raise CorruptLogError(
            f"segment {final} already exists: another process wrote this partition while "
            "this writer held its lock (is the folder shared over a network filesystem?)"
        ) from None
    return Segment(stats.first, stats.count, final)


# -- streams ---------------------------------------------------------------------------------


class Stream:
    """A stream opened for reading. Cheap to create; safe to use from several threads.

    Listings are refreshed on every :meth:`end_offset`; segment files are memory-mapped once
    and cached (they never change), up to ``cache_segments`` of them. A read checks the record
    batches it returns against their checksums (:class:`~.segments.SegmentChecks`).
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
        written before checksums). Raises :class:`CorruptLogError` naming the file and the
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
        """Remove the head segments ``decide`` lets go (:func:`.retention.choose_trim`).

        Under the partition's trim lock (a flock on ``_trim.lock``: one trim at a time; the
        writer's appends and merges go on). The new :class:`TrimState` is written (atomically,
        fsync'd) before any segment is removed, so readers never see a gap: a listing starts at
        the first kept offset. A reader that holds a removed segment memory-mapped keeps its
        records (Linux frees the file when the last map goes); one that opens it after the
        trim gets :class:`~.retention.DataLossError`. A trim killed between the two leaves
        segments before the first kept offset, which the next writer removes once their
        footers say they are what their names say (:func:`clean_partition`)."""
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
        :meth:`end_offset`. A read with any payload column checks each record batch it returns
        from against its checksum first, once per process (:class:`~.segments.SegmentChecks`):
        a damaged one raises :class:`CorruptLogError` naming the file and its records.
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
    """The embedded log's :class:`~.storage.PartitionAppender`: holds the partition's flock;
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


#: The flock'd file that makes trims of one partition take turns (:meth:`Stream.trim_partition`).
TRIM_LOCK_FILE = "_trim.lock"


@contextlib.contextmanager
def _flock(path: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (waits for the holder; trims are short)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


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


# -- merging small segments ------------------------------------------------------------------


def _size_class(count: int) -> int:
    return (count.bit_length() - 1) // 4  # 1-15: 0, 16-255: 1, 256-4095: 2, 4096-65535: 3


def _merge_start(chain: list[Segment]) -> int | None:
    """Where the tail to merge starts, or None if no merge is due.

    Among the small segments at the tail (below :data:`COMPACT_BELOW_RECORDS` records), for the
    smallest size class ``c`` for which the trailing run of segments of class ``<= c`` holds
    :data:`COMPACT_FANIN` segments of class exactly ``c``, that run is merged. The result has
    at least ``COMPACT_FANIN`` times the records of a class-``c`` segment, so it lands in a
    higher class: a record is rewritten at most once per class (four times), however the flush
    sizes mix.
    """
    start = len(chain)
    while start > 0 and chain[start - 1].count < COMPACT_BELOW_RECORDS:
        start -= 1
    classes = [_size_class(s.count) for s in chain[start:]]
    if len(classes) < COMPACT_FANIN:
        return None
    for c in range(max(classes) + 1):
        i = len(classes)
        while i > 0 and classes[i - 1] <= c:
            i -= 1
        if classes[i:].count(c) >= COMPACT_FANIN:
            return start + i
    return None


def compact_tail(stream: Stream, partition: int) -> int:
    """Merge runs of small segments at the end of a partition; returns how many merges ran.

    Only the partition's writer (the lock holder) may call this (see :func:`_merge_start` for
    which segments). The parts are verified (checksums) before they are merged, and the merged
    segment is committed, then read back and compared with the records written before the
    parts are removed: a writer killed at any step leaves either the parts alone or the merged
    segment beside some of them, which a listing takes once it verifies and the next writer's
    :func:`clean_partition` removes once their records equal its. Readers holding the old
    ones keep their memory maps.
    """
    part_dir = stream.partition_dir(partition)
    merges = 0
    while True:
        chain = stream.segments(partition)
        start = _merge_start(chain)
        if start is None:
            return merges
        tail = chain[start:]
        try:
            prepared = _merge_of(stream, chain, start)
        except CorruptLogError:
            # A damaged segment must not get a fresh checksum inside a merged one: it stays as
            # it is, for `rowtime describe --verify` to name (the append itself is committed).
            return merges
        stats, merged = prepared
        segment = write_segment(part_dir, stats, stream.file_schema, [merged])
        # Read back before the parts go: a merged segment that is not what was written (the
        # disk gave back other bytes) is this writer's own, just made; the parts still hold
        # every record. Compared with the records in memory, value by value: recomputing its
        # checksums would copy every batch again (the parts' were checked above).
        written, why = _footer_problem(segment)
        if why is None and written is not None and not written.equals(merged):
            why = "its records are not those written"
        del written
        if why is not None:
            os.unlink(segment.path)
            fsync_dir(part_dir)
            logging.getLogger("pyspark_rowtime").warning(
                "merging segments of %s was undone: the merged segment %s, read back: %s", part_dir,
                os.path.basename(segment.path), why,
            )  # fmt: skip
            return merges
        for s in tail:
            try:
                os.unlink(s.path)
            except FileNotFoundError:
                pass
        merges += 1


#: 0 as an int64 scalar made without ``pa.scalar``, which imports pandas (bounds/arrays.py).
_ZERO = to_arrow([0], pa.int64())[0]


def _merge_of(stream: Stream, chain: list[Segment], start: int) -> tuple[SegmentStats, pa.Table]:
    """The footer and records of the merge of ``chain[start:]``, each part verified first:
    its checksums, its columns the stream's, and its footer what its records give (footers
    carry no checksum: a damaged one must not be carried into a merged segment that would
    then verify). Raises :class:`CorruptLogError` when a part does not verify."""
    tail = chain[start:]
    for s in tail:
        verify_segment_file(s.path)
    tables = [stream._table(s) for s in tail]
    for s, table in zip(tail, tables, strict=True):
        if not table.schema.remove_metadata().equals(stream.file_schema.remove_metadata()):
            raise CorruptLogError(f"segment {s.path} has columns {table.schema.remove_metadata()}")
    stats = SegmentStats.merge([stream.stats(s) for s in tail])
    merged = pa.concat_tables(t.replace_schema_metadata(None) for t in tables).combine_chunks()
    before: int | None
    if start:
        before = stream.stats(chain[start - 1]).clock_us
    else:
        before = read_trim_state(os.path.dirname(tail[0].path)).clock_us
    rowtime = merged.column(LOG_ROWTIME_US)
    actual = SegmentStats.compute(
        stats.first,
        as_numpy(merged.column(LOG_ARRIVAL_US)),
        as_numpy(pc.fill_null(rowtime, _ZERO)),
        as_numpy(rowtime.is_valid()),
        as_numpy(merged.column(LOG_IS_BOUND)),
        before,
    )
    # The writers' record is what a writer says, not a property of the records; a field the
    # parts' footers lack was added to the format after they were written.
    actual = replace(actual, producers=stats.producers)
    if any(v is not None and getattr(actual, k) != v for k, v in stats.__dict__.items()):
        raise CorruptLogError(
            f"the footers of segments {_names(tail)} say {stats}, their records give {actual}"
        )
    return stats, merged


def clean_partition(stream: Stream, partition: int) -> list[str]:
    """Remove what an earlier writer of the partition left behind; only for its writer (at
    open). Returns the paths removed.

    Temporary files go. A segment file outside the chain goes only once verified to hold
    nothing the chain lacks (:func:`_why_kept`): an interrupted merge's parts, whose records
    the merged segment holds, checked record by record against it after both verify; an
    interrupted trim's segments, before the first kept offset, once their footer says they
    are what their name says. Anything else (a stray file, a rejected claimant, a part that
    differs from the merged segment) is left in place with every other file, and this raises
    :class:`CorruptLogError` naming each file, why, and what to do: PostgreSQL refuses to
    start rather than delete, and so does this writer.
    """
    part_dir = stream.partition_dir(partition)
    listing = list_partition(part_dir)
    if listing.leftovers or listing.trimmed or listing.rejected:
        # Decided under the trim lock: no trim removes a file while files are compared.
        with _flock(os.path.join(part_dir, TRIM_LOCK_FILE)):
            listing = list_partition(part_dir)
            verdicts = _why_kept(listing)
            problems = [(s.path, why) for s, why in verdicts if why is not None]
            if problems:
                raise _unaccounted(part_dir, listing, problems)
            removed = _remove([*listing.temps, *(s.path for s, _ in verdicts)])
    else:
        removed = _remove(listing.temps)
    if removed:
        fsync_dir(part_dir)
    return removed


def _remove(paths: Sequence[str]) -> list[str]:
    removed = []
    for path in paths:
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


def _why_kept(listing: Listing) -> list[tuple[Segment, str | None]]:
    """Each segment file outside the chain, with why it may not be removed (None: it may)."""
    chain = listing.chain
    out: list[tuple[Segment, str | None]] = []
    for seg, why in listing.rejected:
        holders = _holders(chain, seg.first, seg.end)
        held = f", which {_names(holders)} hold," if holders else ""
        out.append((seg, f"it claims records [{seg.first}, {seg.end}){held} but {why}"))
    for seg in listing.trimmed:
        if not chain:
            out.append((seg, (
                f"it holds records [{seg.first}, {seg.end}), before the first kept offset "
                f"{listing.start} that {TRIM_FILE} records, and no segment holds that offset "
                f"(was {TRIM_FILE} restored from a newer backup than the segments? restore "
                f"the {TRIM_FILE} of the same backup instead)"
            )))  # fmt: skip
            continue
        _, problem = _footer_problem(seg)
        if problem is not None:
            problem = (
                f"it is named as records [{seg.first}, {seg.end}), before the first kept "
                f"offset {listing.start}, but {problem}: it is not a segment a trim left"
            )
        out.append((seg, problem))
    for seg in listing.leftovers:
        out.append((seg, _not_held(seg, listing)))
    return out


def _not_held(seg: Segment, listing: Listing) -> str | None:
    """Why the chain of ``listing`` may not hold every kept record of ``seg``, or None when
    it is verified to: the chain's segments there and ``seg`` verify, and their records are
    equal, value by value."""
    chain = listing.chain
    lo = max(seg.first, listing.start)
    if seg.count <= 0:
        return f"it claims {seg.count} records"
    if not chain or lo < chain[0].first or seg.end > chain[-1].end:
        first, end = (chain[0].first, chain[-1].end) if chain else (listing.start,) * 2
        return (
            f"its records [{lo}, {seg.end}) are not all in the partition's chain [{first}, {end})"
        )
    why = claim_problem(seg)
    if why is not None:
        return f"it claims records [{seg.first}, {seg.end}) but {why}"
    holders = _holders(chain, lo, seg.end)
    for holder in holders:
        problem = claim_problem(holder)
        if problem is not None:
            return f"the chain's segment {_names([holder])}, which holds them too: {problem}"
    pieces = []
    for holder in holders:
        table = open_segment_file(holder.path).replace_schema_metadata(None)
        a, b = max(lo, holder.first) - holder.first, min(seg.end, holder.end) - holder.first
        pieces.append(table.slice(a, b - a))
    theirs = pa.concat_tables(pieces)
    mine = open_segment_file(seg.path).replace_schema_metadata(None).slice(lo - seg.first)
    if not mine.equals(theirs):
        return (
            f"its records [{lo}, {seg.end}) differ from those {_names(holders)} hold in the "
            "chain (both verify)"
        )
    return None


def _holders(chain: list[Segment], first: int, end: int) -> list[Segment]:
    """The chain's segments holding any of the offsets ``[first, end)``."""
    return [s for s in chain if s.first < end and s.end > first]


def _names(segments: Sequence[Segment]) -> str:
    return ", ".join(os.path.basename(s.path) for s in segments)


def _unaccounted(
    part_dir: str, listing: Listing, problems: Sequence[tuple[str, str]]
) -> CorruptLogError:
    """The writer's refusal to open a partition holding files it cannot account for."""
    files = "; ".join(f"{os.path.basename(path)}: {why}" for path, why in problems)
    chain = listing.chain
    reads = (
        f"readers read the verified chain, records [{chain[0].first}, {chain[-1].end})"
        if chain
        else "readers find no records"
    )
    return CorruptLogError(
        f"partition folder {part_dir} holds segment files the log cannot account for, and "
        f"no writer opens it until they are dealt with ({files}). Nothing was removed; "
        f"{reads}. Move each file named here out of the partition folder (keep it: it may "
        "hold records a backup lacks), then open the writer again"
    )


# -- creating and opening --------------------------------------------------------------------


def open_stream(location: str | os.PathLike[str]) -> Stream:
    """The stream at ``location`` (a path or ``file://`` URL).

    Raises :class:`StreamNotFoundError` (naming the location and how to create a stream) when
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
    readers (:data:`streams.meta.KNOWN_DEFAULTS`; Spark spellings such as ``adjust.unit`` work
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

"""A partition's folder in the embedded log (``log``): its segment files, how they are
listed into the chain of records from the first kept offset, and how a segment is written and
linked into it.

A listing decides which files hold the partition's records; it never removes one. Where files'
offsets overlap (a merged segment beside the parts it replaces, after a crash; equally a stray
copy or a half-restored backup), the larger is taken into the chain only if it verifies
(``claim_problem``: its footer and record count are its name's, its checksums match);
otherwise the chain goes on through the others, and only the writer's clean-up
(``merge.clean_partition``) may remove a file, after checking it record by record.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import itertools
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from ...bounds.errors import CorruptLogError
from ..meta import fsync_dir, narrow_mode, publish
from ..retention import TRIM_FILE, TrimState
from ..segments import (
    SEGMENT_RE,
    SegmentStats,
    open_segment_file,
    segment_name,
    verify_segment_file,
    write_segment_file,
)

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
    claim offsets other files hold and failed verification (``claim_problem``), each with
    the reason: a stray copy, a half-restored backup, a damaged merge. ``temps``: temporary
    files. Of the files outside the chain, only ``merge.clean_partition`` removes any, and only
    what it has verified."""

    chain: list[Segment]
    start: int
    leftovers: list[Segment]
    trimmed: list[Segment]
    rejected: list[tuple[Segment, str]]
    temps: list[str]


def read_trim_state(part_dir: str) -> TrimState:
    """The partition's trim (``retention``), or the empty one (nothing removed)."""
    path = os.path.join(part_dir, TRIM_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return TrimState()
    return TrimState.from_json(text, path)


#: Verdicts of ``claim_problem`` by file identity (path, inode, size, mtime): a committed
#: segment never changes, so a listing that meets the same overlap again does not read the
#: file again. Bounded; cleared when full.
_VERDICTS: dict[tuple[str, int, int, int], str | None] = {}
_VERDICTS_MAX = 1024


def _footer_problem(segment: Segment) -> tuple[pa.Table | None, str | None]:
    """The segment file's records, and why its footer or record count is not what its name
    says (None when they are). Raises ``FileNotFoundError`` if the file is gone."""
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
    (``segments.verify_segment_file``; a segment written before checksums has none to
    match). Reads every byte of the file, so it runs only where a decision rests on the file:
    a segment whose offsets other files also hold, before it enters a chain, and before the
    files it would replace are removed. Raises ``FileNotFoundError`` if the file is gone.
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
    the chain (``Listing``'s leftovers, trimmed and rejected files), ``temps`` the
    temporary files. See ``list_partition``."""
    listing = list_partition(part_dir)
    others = [s.path for s in (*listing.leftovers, *listing.trimmed)]
    others += [s.path for s, _ in listing.rejected]
    return listing.chain, others, listing.temps


def list_partition(part_dir: str) -> Listing:
    """The partition folder ``part_dir`` as a ``Listing``.

    The chain starts at the segment holding the first kept offset (``retention.TRIM_FILE``
    says which it is; 0 without one): the one starting there, or, where a merge raced with a
    trim, the merged segment that covers it. Where several files start at one offset, or a
    file's offsets overlap others' (an interrupted merge leaves the merged segment beside the
    ones it replaces; a stray copy or a half-restored backup leaves anything), the larger
    segment is taken only if it verifies (``claim_problem``); otherwise it is rejected and
    the chain goes on through the others, so a file's name alone never hides records that
    verify. Raises ``CorruptLogError`` if the chain has a gap that a fresh listing does
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
    """One listing's chain from ``start`` (see ``list_partition``)."""
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


#: The flock'd file that makes trims of one partition take turns (``Stream.trim_partition``).
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

"""Merging a partition's small segments, and the clean-up of what a crash left: the two steps
of the embedded log (``log``) that remove segment files, both only for the partition's
writer (the lock holder).

Neither removes a file on the strength of its name or length. A merge verifies its parts
(checksums, footers recomputed from their records, columns against the stream's) before it
writes the merged segment, and reads that back, comparing it with the records written, before
the parts go. ``clean_partition`` removes a file outside the chain only once the chain
verifiably holds the same records, value for value (or, for what an interrupted trim left, once
its footer matches its name and it lies before the first kept offset); anything else stays and
the writer refuses to open, naming the files. So a writer killed at any step of either, or a
stray copy or half-restored backup beside the segments, loses no record
(``tests/test_recovery.py``, ``tests/test_recovery_props.py``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from ...bounds.arrays import as_numpy, to_arrow
from ...bounds.errors import CorruptLogError
from ..columns import LOG_ARRIVAL_US, LOG_IS_BOUND, LOG_ROWTIME_US
from ..meta import fsync_dir
from ..retention import TRIM_FILE
from ..segments import SegmentStats, open_segment_file, verify_segment_file
from .folder import (
    COMPACT_BELOW_RECORDS,
    COMPACT_FANIN,
    TRIM_LOCK_FILE,
    Listing,
    Segment,
    _flock,
    _footer_problem,
    claim_problem,
    list_partition,
    read_trim_state,
    write_segment,
)

if TYPE_CHECKING:
    from .log import Stream


def _size_class(count: int) -> int:
    return (count.bit_length() - 1) // 4  # 1-15: 0, 16-255: 1, 256-4095: 2, 4096-65535: 3


def _merge_start(chain: list[Segment]) -> int | None:
    """Where the tail to merge starts, or None if no merge is due.

    Among the small segments at the tail (below ``COMPACT_BELOW_RECORDS`` records), for the
    smallest size class ``c`` for which the trailing run of segments of class ``<= c`` holds
    ``COMPACT_FANIN`` segments of class exactly ``c``, that run is merged. The result has
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

    Only the partition's writer (the lock holder) may call this (see ``_merge_start`` for
    which segments). The parts are verified (checksums) before they are merged, and the merged
    segment is committed, then read back and compared with the records written before the
    parts are removed: a writer killed at any step leaves either the parts alone or the merged
    segment beside some of them, which a listing takes once it verifies and the next writer's
    ``clean_partition`` removes once their records equal its. Readers holding the old
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
    then verify). Raises ``CorruptLogError`` when a part does not verify."""
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
    nothing the chain lacks (``_why_kept``): an interrupted merge's parts, whose records
    the merged segment holds, checked record by record against it after both verify; an
    interrupted trim's segments, before the first kept offset, once their footer says they
    are what their name says. Anything else (a stray file, a rejected claimant, a part that
    differs from the merged segment) is left in place with every other file, and this raises
    ``CorruptLogError`` naming each file, why, and what to do: PostgreSQL refuses to
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

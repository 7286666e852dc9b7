"""The reader over a trimmed stream (SPEC 12: retention, ``failOnDataLoss``).

A fresh query, a batch read and the quarantine start each partition at its first kept record,
from the state the trim stored there (``policy_state``): the
reference time and bound every removed record left. Since no removed row was still held there
under the stream's policy, what they return for kept records is what an untrimmed log returns.

A query whose offset still needs records that were removed (its first alive record, ``scan``,
lies before the first kept offset) fails with ``DataLossError``
naming stream, partition, its offset and the first kept one; with ``failOnDataLoss=false``
(Spark's Kafka source option) it skips to the first kept record and counts the records skipped,
``first kept - scan`` per partition: a warning in the driver's log, and ``skipped`` in the
source's progress (``skipped_progress``).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ..bounds.plan import StreamPosition
from ..bounds.policies import PartitionState
from ..streams.retention import data_loss
from ..streams.storage import StreamStorage
from .options import ReaderConfig

log = logging.getLogger("pyspark_rowtime")


def earliest_states(stream: StreamStorage, cfg: ReaderConfig) -> list[PartitionState]:
    """Each partition's state at its first kept record, for ``cfg``'s policy and column."""
    return [
        stream.trim_state(p).policy_state(cfg.policy, cfg.rowtime_column)
        for p in range(stream.meta.partitions)
    ]


def earliest_position(stream: StreamStorage, cfg: ReaderConfig) -> StreamPosition:
    """Where a read from the beginning starts: every partition at its first kept record."""
    return StreamPosition(None, earliest_states(stream, cfg))


def skip_removed(
    pos: StreamPosition, stream: StreamStorage, cfg: ReaderConfig
) -> tuple[StreamPosition, dict[int, tuple[int, int]]]:
    """``pos`` with each partition that needs removed records moved to its first kept record;
    and, per such partition, (the offset it needed, the first kept offset). Raises
    ``DataLossError`` instead when ``cfg`` fails on data loss (the default)."""
    states = list(pos.partitions)
    moved: dict[int, tuple[int, int]] = {}
    for p, st in enumerate(pos.partitions):
        kept = stream.start_offset(p)
        if st.scan >= kept:
            continue
        if cfg.fail_on_data_loss:
            raise data_loss(cfg.location, p, st.scan, kept)
        at = stream.trim_state(p).policy_state(cfg.policy, cfg.rowtime_column)
        kept = at.next  # the trim state read just now (a later trim may have moved on)
        if st.next <= kept:
            states[p] = dataclasses.replace(at, discarded=st.discarded)
        else:  # the query read past the first kept record: only its alive records are gone
            states[p] = dataclasses.replace(
                st, scan=kept, scan_ref_us=at.scan_ref_us, scan_bound_us=at.scan_bound_us
            )
        moved[p] = (st.scan, kept)
    if not moved:
        return pos, moved
    return StreamPosition(pos.clock_us, states), moved


class SkipCounter:
    """Records skipped by ``failOnDataLoss=false`` since the query (this reader) started, per
    partition; each skip is warned about once in the driver's log."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.skipped: dict[int, int] = {}
        self._seen: set[tuple[int, int, int]] = set()

    def count(self, moved: dict[int, tuple[int, int]]) -> None:
        for p, (needed, kept) in moved.items():
            if (p, needed, kept) in self._seen:
                continue  # the same skip seen again (a batch planned, then read)
            self._seen.add((p, needed, kept))
            n = kept - needed
            self.skipped[p] = self.skipped.get(p, 0) + n
            log.warning(
                "stream %r partition %d: the query needed records from offset %d, and the first "
                "kept offset is %d (retention removed the records before it); "
                "failOnDataLoss=false: skipped %d records (rows and bounds)",
                self.location,
                p,
                needed,
                kept,
                n,
            )


def skipped_progress(skipped: dict[int, int]) -> dict[str, Any]:
    """The source progress' share of retention (merged into ``reportLatestOffset``'s dict):
    ``{"skipped": {partition: records}}`` once a partition skipped records, else nothing."""
    if not skipped:
        return {}
    return {"skipped": {str(p): n for p, n in sorted(skipped.items())}}


def replay_position(
    d: dict[str, Any], stream: StreamStorage, cfg: ReaderConfig
) -> tuple[dict[str, Any], dict[int, tuple[int, int]]]:
    """An offset dict moved past removed records like ``skip_removed`` (for the start and
    end of a step Spark replays after a restart), and what moved; the stream id it carries is
    kept."""
    pos = StreamPosition.from_dict(d)
    new, moved = skip_removed(pos, stream, cfg)
    if not moved:
        return d, moved
    out = new.to_dict()
    for key, value in d.items():
        if key not in out:
            out[key] = value
    return out, moved

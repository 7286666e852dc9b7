"""Retention on Redis streams (``retention``): the stream's policy, kept in
``{rowtime:name}:retention`` once ops change it, and trims of a partition's head runs, each one
script (``scripts.TRIM``) that does nothing if another trim came first."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from ...bounds.errors import CorruptLogError, OptionError
from ..retention import Retention, TrimResult, TrimState, Unit
from .records import Piece

if TYPE_CHECKING:
    from .stream import RedisStream

__all__ = ["check_retention", "retention", "set_retention", "trim_partition"]


def retention(stream: RedisStream) -> Retention:
    """The stream's retention: ops' last change (``{...}:retention``), else the one it
    was created with."""
    raw = stream.conn.call(
        f"reading the retention of {stream.location}",
        partial(stream.conn.client.get, stream.loc.key("retention")),
    )
    if raw is None:
        return Retention.of_defaults(stream.meta.defaults)
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise CorruptLogError(f"the retention of {stream.location} cannot be read: {e}") from e
    return Retention.from_doc(doc, stream.location)


def set_retention(stream: RedisStream, retention: Retention) -> None:
    """Change the stream's retention (ops); writers pick it up at their next check."""
    check_retention(retention, stream.location, stream.external is not None)
    stream.conn.call(
        f"setting the retention of {stream.location}",
        partial(
            stream.conn.client.set, stream.loc.key("retention"), json.dumps(retention.to_doc())
        ),
    )


def trim_partition(
    stream: RedisStream,
    partition: int,
    decide: Callable[[list[Unit], TrimState], TrimState | None],
) -> TrimResult | None:
    """Remove the head runs ``decide`` lets go (``retention.choose_trim``): their
    index, summaries, record times and entries (``XTRIM MINID``), and store the new
    ``TrimState``, in one script that does nothing if another trim came first.
    A unit here is a run (what one append wrote: one or more entries)."""
    stream.check_partition(partition)
    if stream.external is not None:
        raise OptionError(
            f"{stream.location} is registered over Redis streams that others write: their "
            "entries are theirs to trim, and a reader needs every entry it indexed. "
            "Retention applies to streams written by rowtime writers"
        )
    prev = stream.trim_state(partition)
    units = [
        Unit(
            st.first,
            st.count,
            st.rows,
            0,
            st.max_rowtime_us,
            st.last_bound_us,
            st.clock_us,
            last_arrival_us=st.last_arrival_us,
        )
        for st in stream.partition_stats(partition)
        if st.end > prev.start
    ]
    new = decide(units, prev)
    if new is None or new.start <= prev.start:
        return None
    client = stream.conn.client
    ikey = stream.key("i", partition)

    def index() -> tuple[list[bytes], list[bytes]]:
        pipe = client.pipeline(transaction=False)
        pipe.zrangebyscore(ikey, "-inf", f"({new.start}")
        pipe.zrangebyscore(ikey, new.start, "+inf", start=0, num=1)
        gone, kept = pipe.execute()
        return gone, kept

    gone, kept = stream.conn.call(f"reading the index of {stream.location}", index)
    if not kept:
        return None  # the last run is never removed: the index changed under us
    first_kept = Piece.parse(kept[0])
    if first_kept.first != new.start:
        if stream.start_offset(partition) != prev.start:
            return None  # another trim came first: the next check decides again
        raise CorruptLogError(
            f"partition {partition} of {stream.location}: no entry starts at offset "
            f"{new.start}, where a run starts"
        )
    ids = [Piece.parse(m).first_id for m in gone]
    keys = [stream.key(k, partition) for k in ("trim", "i", "s", "tm", "p")]
    args = [str(prev.start), str(new.start), new.to_json(), first_kept.first_id, *ids]
    done = stream.conn.call(
        f"trimming partition {partition} of {stream.location}",
        partial(stream.conn.trim, keys=keys, args=args),
    )
    if not done:
        return None  # another trim came first: the next check decides again
    return TrimResult(partition, prev, new)


def check_retention(retention: Retention, where: str, external: bool) -> None:
    """What Redis streams refuse of a retention, said before it is stored."""
    if external and retention.active:
        raise OptionError(
            f"{where} is registered over Redis streams that others write: retention does not "
            "apply to it (their entries are theirs to trim)"
        )
    if retention.size_bytes is not None:
        raise OptionError(
            f"retention_size is not supported on Redis streams ({where}): Redis does not say "
            "how much memory one entry takes; give a retention in rowtime (such as '7 days'), "
            "and bound memory with the server's maxmemory"
        )

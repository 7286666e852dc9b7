"""The target's clock: how far the sink promises the target is complete.

After batch ``b`` commits, the target's clock ``T(b)`` never decreases, and every row the sink
writes later has ``rowtime >= T(b)`` (SPEC 8). Where ``T(b)`` comes from (option ``clock``):

``bounds`` (the default when the query keeps the ``is_bound`` column: pass-through queries)
    The highest bound record that reached the sink in batch ``b``. The reader promises that no
    later row is below it, and a filter or projection keeps that promise, so the clock follows
    the source's bounds in the very batch that carries them: nothing waits for a later batch.

``watermark`` (the default without ``is_bound``: stateful queries after ``with_watermark``)
    The watermark batch ``b`` ran with, ``batchWatermarkMs`` in ``<checkpoint>/offsets/<b>``.
    Spark applies a watermark one batch after it learns it: a bound read in batch ``b`` moves
    the watermark of batch ``b + 1``, and only then are the windows it closes evicted and
    written (Spark runs that extra batch even when no new data comes). In append mode batch
    ``b`` writes exactly the windows with ``end <= W(b)`` not written before, and every later
    window ends after ``W(b)``, so ``T(b) = W(b)`` covers every window written and is never
    ahead of one still to come. (The bound records themselves never reach the sink here:
    ``with_watermark`` removes them, and they could not be trusted anyway, since they run one
    batch ahead of the windows.)

Spark's watermarks are milliseconds, so ``T(b) = W(b) * 1000`` microseconds; a watermark of 0
is Spark's "none yet" and moves nothing. A watermark cannot carry the end-of-stream bound
(9999-12-31T23:59:59.999999Z) exactly: Spark truncates it to milliseconds and subtracts the
delay. So a watermark in Spark's last year, at or after 9999-01-01T00:00:00Z, which only the
end of stream can produce, is taken as the end of stream (a delay longer than a year would hide
it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

from ..bounds.bounds import END_OF_STREAM_US
from ..bounds.errors import CorruptLogError, OptionError
from ..streams.sink_state import target_files

__all__ = [
    "advance",
    "batch_watermark_ms",
    "bounds_clock_us",
    "checkpoint_keeps_state",
    "checkpoint_query_id",
    "watermark_clock_us",
]


def advance(previous_us: int | None, candidate_us: int | None) -> int | None:
    """The clock after a batch: the candidate if it moves forward, else the previous one."""
    if candidate_us is None:
        return previous_us
    if previous_us is None or candidate_us > previous_us:
        return candidate_us
    return previous_us


def bounds_clock_us(bounds_us: Iterable[int | None]) -> int | None:
    """The highest bound among the tasks' reports (None if no task saw a bound)."""
    present = [b for b in bounds_us if b is not None]
    return max(present) if present else None


#: 9999-01-01T00:00:00Z: a watermark from here on is the end of stream seen through Spark.
END_OF_STREAM_WATERMARK_US = 253_370_764_800_000_000


def watermark_clock_us(watermark_ms: int | None) -> int | None:
    """A Spark watermark (ms) as a clock (us); None for Spark's "no watermark yet" (0)."""
    if watermark_ms is None or watermark_ms <= 0:
        return None
    us = watermark_ms * 1000
    if us >= END_OF_STREAM_WATERMARK_US:
        return END_OF_STREAM_US
    return us


def _offsets_file(checkpoint: str, batch_id: int) -> str:
    if "://" in checkpoint:
        return f"{checkpoint.rstrip('/')}/offsets/{batch_id}"
    return os.path.join(checkpoint, "offsets", str(batch_id))


def read_checkpoint_file(checkpoint: str, name: str) -> str | None:
    """The text of ``name`` (``/``-separated) in a Spark checkpoint, or None when it has none:
    a local folder, or an object storage URL read through its backend's files."""
    if "://" in checkpoint:
        files = target_files(checkpoint)
        if files is None:
            raise OptionError(f"checkpoint {checkpoint!r}: its storage keeps no files")
        return files.read_text(name)
    try:
        with open(os.path.join(checkpoint, *name.split("/")), encoding="utf-8") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None


def batch_watermark_ms(checkpoint: str, batch_id: int) -> int:
    """``batchWatermarkMs`` of ``<checkpoint>/offsets/<batch_id>``: the watermark batch
    ``batch_id`` ran with (Spark writes the file before it runs the batch).

    The file is Spark's offset log entry: a version line (``v1``), a JSON line of batch
    metadata, then one line per source.
    """
    path = _offsets_file(checkpoint, batch_id)
    text = read_checkpoint_file(checkpoint, f"offsets/{batch_id}")
    if text is None:
        raise OptionError(
            f"clock=watermark reads the watermark of batch {batch_id} from {path}, which does "
            "not exist: is option checkpointLocation the query's checkpoint folder?"
        )
    lines = text.splitlines()
    for line in lines[1:]:
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "batchWatermarkMs" in doc:
            return int(doc["batchWatermarkMs"])
    raise CorruptLogError(
        f"Spark's offset log {path} has no batchWatermarkMs (version line {lines[:1]}); this "
        "Spark version writes another format"
    )


def checkpoint_query_id(checkpoint: str | None) -> str | None:
    """The id of the query that owns ``checkpoint`` (its ``metadata`` file), if readable."""
    if checkpoint is None:
        return None
    try:
        text = read_checkpoint_file(checkpoint, "metadata")
        doc = json.loads((text or "").split("\n", 1)[0])
    except (OSError, ValueError):
        return None
    value = doc.get("id") if isinstance(doc, dict) else None
    return str(value) if value else None


#: Files Spark writes for a query with stateful operators (windows, deduplication, joins) when
#: it plans the query's first batch, before any task runs: operator 0's metadata and its state
#: schema. A stateless query's checkpoint has no ``state`` folder.
STATE_FILES = ("state/0/_metadata/metadata", "state/0/0/_metadata/schema")


def checkpoint_keeps_state(checkpoint: str | None) -> bool:
    """Whether the query of ``checkpoint`` keeps state: its output comes from Spark's shuffle
    (windows, deduplication, joins) rather than straight from its source's partitions."""
    if checkpoint is None:
        return False
    if "://" not in checkpoint:
        return os.path.isdir(os.path.join(checkpoint, "state"))
    return any(read_checkpoint_file(checkpoint, name) is not None for name in STATE_FILES)

"""The one appender of a partition of a Redis stream: a lease-based lock (``SET NX PX``, renewed
by a daemon thread) and atomic, idempotent appends of runs (``scripts.APPEND``)."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ...bounds.errors import CorruptLogError, WriterLockedError
from ..columns import LOG_SYSTEM_COLUMNS as SYSTEM_COLUMNS
from ..segments import SegmentStats, check_appended_files, open_verified_segment
from ..storage import PartitionTail
from .records import ipc_bytes, one_table, stats_json

if TYPE_CHECKING:
    from .stream import RedisStream

__all__ = ["DEFAULT_LEASE_S", "ENTRY_MAX_BYTES", "ENTRY_MAX_ROWS", "RedisAppender"]

#: Records per entry of an own stream, at most. Large entries cost one XRANGE reply each and
#: decode in one Arrow call; the bound keeps one entry well under Redis' 512 MiB bulk limit and
#: lets a reader of a short range skip most of a big run.
ENTRY_MAX_ROWS = 1 << 16
#: Arrow bytes per entry, at most (a run of wide rows is cut earlier than ENTRY_MAX_ROWS).
ENTRY_MAX_BYTES = 8 << 20

DEFAULT_LEASE_S = 10.0


class RedisAppender:
    """The one appender of a partition: holds its lease-based lock (renewed by a daemon thread)
    and appends runs atomically. Use ``RedisStream.lock_partition``."""

    def __init__(self, stream: RedisStream, partition: int, where: str, lease_s: float) -> None:
        self.stream = stream
        self.partition = partition
        self._where = where
        self._conn = stream.conn
        self._lock_key = stream.key("lock", partition)
        self._lease_ms = max(int(lease_s * 1000), 100)
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
        client = self._conn.client
        got = self._conn.call(
            f"locking {where}",
            lambda: client.set(self._lock_key, self.token, nx=True, px=self._lease_ms),
        )
        if not got:
            holder = client.get(self._lock_key)
            who = holder.decode().rsplit(":", 1)[0] if holder else "a writer that just left"
            ttl = client.pttl(self._lock_key)
            raise WriterLockedError(
                f"{where} is being written by another writer (host:pid {who}); one writer per "
                f"partition. Close that writer, or wait: its lease ends within {max(ttl, 0)} ms "
                "if its process died"
            )
        self._lost = False
        self._tail: PartitionTail | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._renew_loop, name=f"rowtime-redis-lease-{partition}", daemon=True
        )
        self._thread.start()

    def _renew_loop(self) -> None:
        period = self._lease_ms / 4000
        while not self._stop.wait(period):
            try:
                if not self._conn.renew(keys=[self._lock_key], args=[self.token, self._lease_ms]):
                    self._lost = True
                    return
            except Exception:
                continue  # the server is away: the next append says so; try again

    def tail(self) -> PartitionTail:
        """The partition's end as this holder sees it (nobody else appends meanwhile)."""
        if self._tail is None:
            self._tail = self.stream.tail(self.partition)
        return self._tail

    def append_run(self, stats: SegmentStats, chunks: Sequence[pa.Table | pa.RecordBatch]) -> None:
        """Commit records ``[stats.first, stats.end)`` as one atomic script (entries of at most
        ``ENTRY_MAX_ROWS`` rows). A retry of the same run after a lost reply is a no-op."""
        self._append([(stats, one_table(chunks))])

    @property
    def where(self) -> str:
        """The partition as errors name it."""
        return self._where

    def append_segment_files(self, paths: Sequence[str], *, reject: bool, verify: bool) -> None:
        """Check the files (``segments.check_segment_files``), then commit all their
        records as one atomic script: Redis holds the records, the files stay the caller's."""
        checked = check_appended_files(self, paths, reject=reject, verify=verify)
        if checked:
            # Checked first: Redis gets the records under fresh checksums.
            self._append([(stats, open_verified_segment(path)) for path, stats in checked])

    def _append(self, runs: list[tuple[SegmentStats, pa.Table]]) -> None:
        if self._lost:
            raise WriterLockedError(
                f"{self._where}: this writer's lease on the partition expired (was the process "
                "paused, or the server away, longer than the lease?) and another writer may "
                "have taken it; nothing more is written: open a new writer"
            )
        first, last = runs[0][0], runs[-1][0]
        args: list[Any] = [
            self.token,
            first.first,
            last.end,
            last.clock_us,
            last.last_arrival_us,
            f"{self.token}:{first.first}",  # the append's id: the same on every retry
            len(runs),
        ]
        entries: list[Any] = []
        for stats, table in runs:
            table = table.replace_schema_metadata(None)
            n = table.num_rows
            if n != stats.count:
                raise CorruptLogError(f"{self._where}: a run of {n} records with stats {stats}")
            args += [stats.first, stats_json(stats)]
            per_row = max(table.nbytes // max(n, 1), 1)
            step = max(min(ENTRY_MAX_ROWS, ENTRY_MAX_BYTES // per_row), 1)
            for lo in range(0, n, step):
                piece = table.slice(lo, min(step, n - lo))
                times = ipc_bytes(piece.select(list(SYSTEM_COLUMNS)))
                entries += [stats.first + lo, piece.num_rows, ipc_bytes(piece), times]
        args += entries
        keys = [self.stream.key(k, self.partition) for k in ("p", "i", "s", "t", "lock", "tm")]
        import redis

        try:
            self._conn.call(
                f"appending records [{first.first}, {last.end}) to {self._where}",
                partial(self._conn.append, keys=keys, args=args),
            )
        except redis.ResponseError as e:
            text = str(e)
            if "ROWTIME_LOCK" in text:
                self._lost = True
                raise WriterLockedError(
                    f"{self._where}: this writer no longer holds the partition (its lease "
                    "expired and another writer may have taken it); records "
                    f"[{first.first}, {last.end}) were not written now (an earlier attempt "
                    "whose reply was lost may have written them): open a new writer, whose "
                    "end_offset says what is committed"
                ) from None
            if "ROWTIME_OFFSET" in text:
                raise CorruptLogError(
                    f"{self._where}: the partition ends at {text.split()[-1]}, and this writer "
                    f"appends at {first.first}: another process wrote it while this writer held "
                    "its lock; nothing of this run was written"
                ) from None
            raise
        self._tail = PartitionTail(last.end, last.clock_us, last.last_arrival_us)

    def release(self) -> None:
        """Give the partition up (idempotent). A dead process' lock expires after its lease."""
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            self._conn.release(keys=[self._lock_key], args=[self.token])
        except Exception:
            pass  # the lease expires on its own

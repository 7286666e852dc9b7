"""Checksums of record batches, and checking them as reads return records.

Arrow IPC carries no checksum of its own, so every record batch the project stores (a segment
file's, an object's, a Redis entry's) carries one in its custom metadata (``CHECKSUM_KEY``),
``batch_checksum`` of its IPC message. ``SegmentChecks`` checks a segment's batches as
reads first touch them, once per process for a file that stays mapped (``file_identity``);
``check_batch`` names the damaged batch and its records. What the format is and who checks
what: ``segments``.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..bounds.errors import CorruptLogError
from .columns import LOG_SYSTEM_COLUMNS

__all__ = [
    "CHECKSUM_ALGORITHM",
    "CHECKSUM_KEY",
    "VERIFIED_BATCHES",
    "SegmentChecks",
    "batch_checksum",
    "check_batch",
    "checksum_of",
    "file_identity",
    "read_checked",
    "reads_payload",
]

#: The key of a record batch's custom metadata that holds its checksum (``batch_checksum``).
CHECKSUM_KEY = b"rowtime.checksum"
#: The checksum's algorithm, the prefix of its value (another prefix: a newer format).
CHECKSUM_ALGORITHM = b"blocksum64:"
_BLOCK_WORDS = 512  # 4 KiB, a page or a disk block


def batch_checksum(batch: pa.RecordBatch) -> bytes:
    """The checksum of ``batch``'s IPC message (its field lengths, null counts, buffer layout
    and every byte of its buffers); a batch read back from a segment gives the one it was
    written with unless the file was damaged.

    ``blocksum64``: the message as little-endian 64-bit words in blocks of 4 KiB (the last word
    padded with zero bytes); ``A`` the sum of all words and ``B`` the sum of each block's sum
    times its position (1, 2, ...), both modulo 2**64 (Fletcher's construction over blocks).
    Any damage within one word changes ``A``; blocks swapped or written in the wrong place
    change ``B`` unless their sums are equal; other damage goes unseen with a chance of about
    2**-64. Chosen over CRC-32 for its cost: numpy sums far faster than zlib's CRC
    (docs/benchmarks.md, "Segment checksums").

    The message is summed as Arrow's IPC writer hands it out, its buffers where they are (a
    memory map, say), not copied into one (``batch.serialize()``, the same bytes:
    ``_message_pieces``); a batch with dictionaries is serialized, as its stream would
    carry them too.
    """
    pieces = _message_pieces(batch)
    if pieces is None:
        pieces = [batch.serialize()]  # the bytes the IPC writer writes, whatever the slicing
    sums = _BlockSums()
    for piece in pieces:
        sums.add(piece)
    a, b = sums.result()
    return CHECKSUM_ALGORITHM + b"%016x%016x" % (a, b)


class _PieceSink:
    """A file-like sink for ``pa.PythonFile`` that keeps what it is given: Arrow passes the
    body's buffers as ``pa.Buffer`` views (no copy), the rest as small ``bytes``."""

    def __init__(self) -> None:
        self.pieces: list[Any] = []
        self.closed = False

    def write(self, data: Any) -> int:
        self.pieces.append(data)
        return data.size if isinstance(data, pa.Buffer) else len(data)

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


def _has_dictionary(t: pa.DataType) -> bool:
    return pa.types.is_dictionary(t) or any(
        _has_dictionary(t.field(i).type) for i in range(t.num_fields)
    )


def _message_pieces(batch: pa.RecordBatch) -> list[Any] | None:
    """``batch.serialize()``'s bytes as pieces, buffers not copied: what an IPC stream writer
    writes for the batch after the schema's message. None for a batch with dictionaries (its
    stream carries their messages too), or when the pieces do not add up to the message's size
    (never seen; then the caller serializes)."""
    if any(_has_dictionary(f.type) for f in batch.schema):
        return None
    sink = _PieceSink()
    with pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), batch.schema) as writer:
        writer.write_batch(batch)
        pieces = sink.pieces[:]  # before the end-of-stream marker that closing writes
    skip = batch.schema.serialize().size  # the schema's message, written before the batch
    out: list[Any] = []
    for piece in pieces:
        size = piece.size if isinstance(piece, pa.Buffer) else len(piece)
        if skip >= size:
            skip -= size
            continue
        out.append(memoryview(piece)[skip:] if skip else piece)
        skip = 0
    total = sum(len(memoryview(p)) for p in out)
    return out if total == pa.ipc.get_record_batch_size(batch) else None


class _BlockSums:
    """``blocksum64``'s two sums over bytes given in pieces of any length: word ``j`` (from 0)
    adds to ``A`` and, times ``j // 512 + 1`` (its block's position), to ``B``."""

    def __init__(self) -> None:
        self._a = self._b = 0
        self._words = 0  # words summed so far
        self._carry = b""  # bytes of a word split between pieces

    def add(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        if self._carry:
            need = 8 - len(self._carry)
            self._carry += bytes(view[:need])
            view = view[need:]
            if len(self._carry) < 8:
                return
            self._add_words(np.frombuffer(self._carry, dtype="<u8"))
            self._carry = b""
        n = len(view) // 8
        if n:
            self._add_words(np.frombuffer(view, dtype="<u8", count=n))
        self._carry = bytes(view[n * 8 :])

    def _add_words(self, words: np.ndarray) -> None:
        # Array sums wrap silently (numpy warns on scalar overflow, never on a reduction).
        start, n = self._words, len(words)
        head = min(n, -start % _BLOCK_WORDS)  # the rest of the block under way
        full = (n - head) // _BLOCK_WORDS
        parts = [
            (words[:head], start // _BLOCK_WORDS + 1),
            (words[head + full * _BLOCK_WORDS :], (start + head) // _BLOCK_WORDS + full + 1),
        ]
        for part, position in parts:
            if len(part):
                total = int(part.sum(dtype=np.uint64))
                self._a += total
                self._b += total * position
        if full:
            blocks = words[head : head + full * _BLOCK_WORDS].reshape(full, _BLOCK_WORDS)
            sums = blocks.sum(axis=1, dtype=np.uint64)
            first = (start + head) // _BLOCK_WORDS + 1
            self._a += int(sums.sum(dtype=np.uint64))
            weights = np.arange(first, first + full, dtype=np.uint64)
            self._b += int((sums * weights).sum(dtype=np.uint64))
        self._words = start + n
        self._a %= 1 << 64
        self._b %= 1 << 64

    def result(self) -> tuple[int, int]:
        if self._carry:
            self._add_words(np.frombuffer(self._carry.ljust(8, b"\0"), dtype="<u8"))
            self._carry = b""
        return self._a, self._b


def _serialized_checksum(batch: pa.RecordBatch) -> bytes:
    """``batch_checksum`` over ``batch.serialize()``, as the first version computed it
    (kept for tests that prove the two agree)."""
    message = batch.serialize()
    n = message.size // 8
    words = np.frombuffer(message, dtype="<u8", count=n)
    full = n // _BLOCK_WORDS
    sums = words[: full * _BLOCK_WORDS].reshape(full, _BLOCK_WORDS).sum(axis=1, dtype=np.uint64)
    tail = np.frombuffer(bytes(message[n * 8 :]).ljust(8, b"\0"), dtype="<u8")
    last = np.concatenate([words[full * _BLOCK_WORDS :], tail]).sum(dtype=np.uint64)
    sums = np.append(sums, last)
    a = int(sums.sum(dtype=np.uint64))
    b = int((sums * np.arange(1, len(sums) + 1, dtype=np.uint64)).sum(dtype=np.uint64))
    return CHECKSUM_ALGORITHM + b"%016x%016x" % (a, b)


def reads_payload(names: Iterable[str]) -> bool:
    """Whether a read of these columns returns payload, and so checks what it returns: a read
    of system columns alone (the reader's planner, on the driver) does not, as a check sums
    every column of a batch; the tasks that read the same records whole check them."""
    return not set(names) <= set(LOG_SYSTEM_COLUMNS)


def checksum_of(metadata: Any) -> bytes | None:
    """The checksum in a record batch's custom metadata, None for a batch written without."""
    return None if metadata is None else metadata.get(CHECKSUM_KEY)


def check_batch(
    batch: pa.RecordBatch, want: bytes | None, where: str, index: int, first: int
) -> bool:
    """Check record batch ``index`` of ``where`` (a file, object or key, named in errors), whose
    first record is at partition offset ``first``, against its checksum ``want``; False when it
    has none (written before checksums), True when it matches.

    Raises ``CorruptLogError`` naming ``where``, the batch and its records when it does not
    match, or when its checksum is of a kind this version does not know.
    """
    if want is None:
        return False
    if not want.startswith(CHECKSUM_ALGORITHM):
        raise CorruptLogError(
            f"{where}: record batch {index} has a checksum of another kind ({want[:20]!r}): it "
            "was written by a newer version of pyspark-rowtime; upgrade to read it"
        )
    if batch_checksum(batch) != want:
        end = first + batch.num_rows
        raise CorruptLogError(
            f"{where}: record batch {index}, records [{first}, {end}) of its partition, does not "
            f"match its checksum: its bytes were changed after they were written. The "
            f"partition cannot be trusted from offset {first} on; restore it from a backup "
            "(other partitions are unaffected)"
        )
    return True


#: How many record batches of segment files this process remembers as verified
#: (``SegmentChecks``): each is checked once per process, not once per read.
VERIFIED_BATCHES = 1 << 16
_verified: OrderedDict[tuple[Any, ...], None] = OrderedDict()
_verified_mutex = threading.Lock()


def file_identity(path: str) -> tuple[int, ...]:
    """What tells one segment file from another with the same path (a stream removed and made
    again): device, inode, size and modification time."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class SegmentChecks:
    """The checksums of one segment's record batches, checked as reads first touch them.

    ``where`` names the segment in errors, ``first`` is its first offset; ``identity``
    (``file_identity``, for a file that stays mapped) makes a batch checked once per process
    (``VERIFIED_BATCHES``), whichever stream object reads it; without one (bytes fetched
    from a store) a batch is checked once per object. A check sums every byte of the batch, so a
    read pays it once for the batches it returns and never for the others.
    """

    def __init__(
        self,
        where: str,
        first: int,
        batches: Sequence[pa.RecordBatch],
        wants: Sequence[bytes | None],
        identity: tuple[Any, ...] | None = None,
    ) -> None:
        self.where = where
        self.first = first
        self._batches = list(batches)
        self._wants = list(wants)
        self._identity = identity
        self._ends = np.cumsum([b.num_rows for b in self._batches], dtype=np.int64)
        self._left = {i for i, want in enumerate(self._wants) if want is not None}
        if identity is not None and self._left:
            with _verified_mutex:
                self._left = {i for i in self._left if (*identity, i) not in _verified}

    def check(self, lo: int = 0, hi: int | None = None) -> None:
        """Check the batches holding the segment's records ``[lo, hi)`` (indexes in the
        segment; all of them by default) that were not checked yet."""
        if not self._left:
            return
        hi = int(self._ends[-1]) if hi is None else hi
        a = int(np.searchsorted(self._ends, lo, side="right"))
        b = int(np.searchsorted(self._ends, hi - 1, side="right")) if hi > lo else a - 1
        for i in range(a, min(b, len(self._batches) - 1) + 1):
            if i not in self._left:
                continue
            start = self.first + (int(self._ends[i - 1]) if i else 0)
            check_batch(self._batches[i], self._wants[i], self.where, i, start)
            self._left.discard(i)
            if self._identity is not None:
                with _verified_mutex:
                    _verified[(*self._identity, i)] = None
                    while len(_verified) > VERIFIED_BATCHES:
                        _verified.popitem(last=False)


def read_checked(reader: Any) -> tuple[pa.Table, list[pa.RecordBatch], list[Any]]:
    """All record batches of an open IPC file ``reader`` with their checksums: the table
    (schema metadata kept: the footer), the batches, and each one's checksum or None."""
    batches, wants = [], []
    for i in range(reader.num_record_batches):
        batch, metadata = reader.get_batch_with_custom_metadata(i)
        batches.append(batch)
        wants.append(checksum_of(metadata))
    return pa.Table.from_batches(batches, schema=reader.schema), batches, wants

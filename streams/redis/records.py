"""How the Redis backend keeps records: index members (``Piece``), run summaries as JSON,
Arrow IPC blobs, the partition's tail hash."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from ..checksums import CHECKSUM_KEY, batch_checksum
from ..segments import SegmentStats, read_ipc_checked
from ..storage import PartitionTail

__all__ = [
    "Piece",
    "id_us",
    "ipc_bytes",
    "ipc_table",
    "one_table",
    "stats_from_json",
    "stats_json",
    "tail_of",
]


@dataclass(frozen=True)
class Piece:
    """One index member: records [first, first + count) are entries first_id..last_id."""

    first: int
    count: int
    first_id: str
    last_id: str

    @property
    def end(self) -> int:
        return self.first + self.count

    @classmethod
    def parse(cls, member: bytes) -> Piece:
        first, count, first_id, last_id = member.decode().split(":")
        return cls(int(first), int(count), first_id, last_id)


def id_us(entry_id: str) -> int:
    return int(entry_id.split("-", 1)[0]) * 1000


def stats_json(stats: SegmentStats) -> str:
    return json.dumps({k: v for k, v in stats.__dict__.items() if v is not None}, sort_keys=True)


def stats_from_json(text: bytes | str) -> SegmentStats:
    return SegmentStats(**json.loads(text))


def ipc_bytes(table: pa.Table) -> bytes:
    """A table as one Arrow IPC stream (uncompressed), each record batch with its checksum in
    its custom metadata, as in a segment file (``checksums.batch_checksum``)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches():
            writer.write_batch(batch, custom_metadata={CHECKSUM_KEY: batch_checksum(batch)})
    return sink.getvalue().to_pybytes()


def ipc_table(blob: bytes, where: str, first: int) -> pa.Table:
    """An entry's blob as a table, every record batch checked against its checksum first
    (entries written before checksums have none and read as before). Redis keeps no checksum
    of a value, in memory or in its append-only file; ``where`` names the value in errors,
    ``first`` is the partition offset of its first record."""
    return read_ipc_checked(blob, where, first, stream=True)


def one_table(chunks: Sequence[pa.Table | pa.RecordBatch]) -> pa.Table:
    tables = [pa.Table.from_batches([c]) if isinstance(c, pa.RecordBatch) else c for c in chunks]
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def tail_of(raw: dict[bytes, bytes]) -> PartitionTail:
    clock = raw.get(b"clock")
    arrival = raw.get(b"arrival")
    return PartitionTail(
        end=int(raw.get(b"end", 0)),
        clock_us=None if clock is None else int(clock),
        last_arrival_us=None if arrival is None else int(arrival),
    )

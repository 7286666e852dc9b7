"""The manifest entries of both targets, as typed, frozen records.

An entry is written once per batch as JSON under ``<target>/_rowtime_sink/manifest/``
(``sink.layout.FolderSinkState``); ``to_dict`` gives exactly the JSON earlier versions
wrote (staged files as short lists), and ``from_dict`` reads it back, so checkpoints and
targets written before these classes existed replay unchanged. Times are microseconds since the
epoch; ``clock`` is the same clock for people (ISO-8601 UTC).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..bounds.errors import CorruptLogError

__all__ = ["ParquetEntry", "ParquetFile", "StreamEntry", "StreamPart"]


def _bad_entry(kind: str, doc: Any, e: Exception) -> CorruptLogError:
    return CorruptLogError(
        f"a {kind} manifest entry cannot be read ({type(e).__name__}: {e}): {str(doc)[:200]}"
    )


def _inside(value: Any) -> str:
    """A file path from an entry, checked to stay inside the target: relative, without ``..``
    (an entry edited by hand, or by anyone, must not move or link files elsewhere)."""
    text = str(value)
    if not text or os.path.isabs(text) or ".." in text.replace(os.sep, "/").split("/"):
        raise ValueError(f"file {text!r} is not a path inside the target")
    return text


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


# -- stream targets --------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamPart:
    """What a batch appends to one partition of a stream target: ``rows`` data rows from
    offset ``start``, then a bound record at ``bound_us`` if not None. ``mode`` ``link``: the
    staged ``files`` become segments as they are; ``merge``: their rows are merged into rowtime
    order and staged anew as ``merged`` (``sink.merge``), which become segments as linked
    files do (empty until the merge is durable: a replay merges again). ``files`` and
    ``merged`` are ``(path relative to the target, rows)`` in order. An entry without
    ``merged`` is one of an earlier version, which merges when it applies the entry; an
    earlier version replays an entry that has it by merging ``files`` again while nothing of
    the part is appended, and refuses it (another writer, it says) after."""

    partition: int
    start: int
    rows: int
    bound_us: int | None
    mode: str
    files: tuple[tuple[str, int], ...]
    merged: tuple[tuple[str, int], ...] = ()

    @property
    def records(self) -> int:
        """The records the part appends: its rows and its bound."""
        return self.rows + (self.bound_us is not None)

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "partition": self.partition,
            "start": self.start,
            "rows": self.rows,
            "bound_us": self.bound_us,
            "mode": self.mode,
            "files": [[rel, rows] for rel, rows in self.files],
        }
        if self.merged:  # absent otherwise: the JSON earlier versions wrote
            doc["merged"] = [[rel, rows] for rel, rows in self.merged]
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> StreamPart:
        return cls(
            partition=int(doc["partition"]),
            start=int(doc["start"]),
            rows=int(doc["rows"]),
            bound_us=_int_or_none(doc["bound_us"]),
            mode=str(doc["mode"]),
            files=tuple((_inside(rel), int(rows)) for rel, rows in doc["files"]),
            merged=tuple((_inside(rel), int(rows)) for rel, rows in doc.get("merged", [])),
        )


@dataclass(frozen=True)
class StreamEntry:
    """The intent of one batch of a stream target (see ``sink.stream_target``)."""

    #: The version of this entry's layout; a replay refuses another one.
    FORMAT = 2

    batch: int
    query_id: str | None
    rows: int
    clock_us: int | None
    clock: str
    previous_clock_us: int | None
    parts: tuple[StreamPart, ...]
    format: int = FORMAT
    #: Set on the value ``commit()`` returns for a replay that found the batch done (never
    #: written to the manifest).
    replayed: bool = False

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "format": self.format,
            "batch": self.batch,
            "query_id": self.query_id,
            "rows": self.rows,
            "clock_us": self.clock_us,
            "clock": self.clock,
            "previous_clock_us": self.previous_clock_us,
            "parts": [p.to_dict() for p in self.parts],
        }
        if self.replayed:
            doc["replayed"] = True
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> StreamEntry:
        """An entry as stored; entries of another ``format`` are read as far as they go (the
        caller checks ``format`` before it replays one)."""
        try:
            return cls(
                batch=int(doc["batch"]),
                query_id=doc.get("query_id"),
                rows=int(doc.get("rows", 0)),
                clock_us=_int_or_none(doc.get("clock_us")),
                clock=str(doc.get("clock", "")),
                previous_clock_us=_int_or_none(doc.get("previous_clock_us")),
                parts=tuple(StreamPart.from_dict(p) for p in doc.get("parts", [])),
                format=int(doc.get("format", 1)),
                replayed=bool(doc.get("replayed", False)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise _bad_entry("stream target", doc, e) from e

    def as_replayed(self) -> StreamEntry:
        return replace(self, replayed=True)


# -- parquet targets -------------------------------------------------------------------------


@dataclass(frozen=True)
class ParquetFile:
    """A staged Parquet file and where it is published (both relative to the target), its
    time partition ``key`` (``rowtime // granularity``) and its rows."""

    staged: str
    final: str
    key: int
    rows: int


@dataclass(frozen=True)
class ParquetEntry:
    """One committed batch of a Parquet target (see ``sink.parquet_target``): its files, the
    clock it moved to, the time partitions it completed and those still open."""

    batch: int
    query_id: str | None
    clock_us: int | None
    clock: str
    previous_clock_us: int | None
    rows: int
    files: tuple[ParquetFile, ...]
    complete: tuple[int, ...]
    open: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "query_id": self.query_id,
            "clock_us": self.clock_us,
            "clock": self.clock,
            "previous_clock_us": self.previous_clock_us,
            "rows": self.rows,
            "files": [[f.staged, f.final, f.key, f.rows] for f in self.files],
            "complete": list(self.complete),
            "open": list(self.open),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ParquetEntry:
        try:
            return cls(
                batch=int(doc["batch"]),
                query_id=doc.get("query_id"),
                clock_us=_int_or_none(doc.get("clock_us")),
                clock=str(doc.get("clock", "")),
                previous_clock_us=_int_or_none(doc.get("previous_clock_us")),
                rows=int(doc.get("rows", 0)),
                files=tuple(
                    ParquetFile(_inside(s), _inside(f), int(k), int(r))
                    for s, f, k, r in doc["files"]
                ),
                complete=tuple(int(k) for k in doc.get("complete", [])),
                open=tuple(int(k) for k in doc.get("open", [])),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise _bad_entry("parquet target", doc, e) from e

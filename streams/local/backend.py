"""The embedded log as a ``Backend``: plain paths and ``file://`` URLs."""

from __future__ import annotations

import json
import os
from typing import Any

import pyarrow as pa

from ...bounds.errors import CorruptLogError
from ..meta import META_FILE, read_meta
from ..sink_state import (
    SINK_DIR,
    SINK_KIND_DELTA,
    SINK_KIND_PARQUET,
    SINK_KIND_STREAM,
    SINK_TARGET_FILE,
)
from ..storage import LocationKind, local_path
from .log import Stream, _open, create_stream

__all__ = ["BACKEND", "SCHEMES"]

#: The URL schemes this backend serves (``""``: a plain path).
SCHEMES = ("", "file")


def _sink_target_kind(path: str) -> str | None:
    """``kind`` in the sink's target file at ``path``, or None without one."""
    file = os.path.join(path, SINK_DIR, SINK_TARGET_FILE)
    try:
        with open(file, encoding="utf-8") as f:
            text = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise CorruptLogError(f"sink file {file} cannot be read ({e}): it was damaged") from e
    kind = doc.get("kind") if isinstance(doc, dict) else None
    return kind if isinstance(kind, str) else None


class _EmbeddedLogBackend:
    """The embedded log as a ``Backend``: local paths and ``file://`` URLs."""

    def resolve(self, location: str) -> str:
        return local_path(location)

    def kind_at(self, resolved: str) -> LocationKind:
        if os.path.isfile(os.path.join(resolved, META_FILE)):
            return LocationKind.STREAM
        kind = _sink_target_kind(resolved)
        if kind == SINK_KIND_PARQUET:
            return LocationKind.PARQUET_TARGET
        if kind == SINK_KIND_DELTA:
            return LocationKind.DELTA_TARGET
        if kind == SINK_KIND_STREAM and read_meta(resolved) is None:
            return LocationKind.PENDING_STREAM_TARGET
        return LocationKind.NOTHING

    def open(self, resolved: str, given: str) -> Stream:
        return _open(resolved, given)

    def create(
        self, resolved: str, schema: str | pa.Schema, partitions: int, defaults: dict[str, Any]
    ) -> Stream:
        return create_stream(resolved, schema, partitions, **defaults)


#: The embedded log's backend (entry point ``local`` of ``pyspark_rowtime.backends``).
BACKEND = _EmbeddedLogBackend()

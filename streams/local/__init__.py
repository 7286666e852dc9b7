"""The embedded log, the first storage backend: a stream is a folder of immutable Arrow IPC
segment files per partition, on a local (or locally mounted) filesystem.

* ``log`` -- the log: ``Stream`` (read, clocks, trims, one appender per partition),
  ``open_stream``, ``create_stream``;
* ``folder`` -- a partition's folder: its segment files and the chain of records they make;
* ``merge`` -- merging small segments, and cleaning up what a crash left;
* ``backend`` -- ``BACKEND``, what ``storage`` serves plain paths and ``file://``
  URLs with (found through the ``pyspark_rowtime.backends`` entry point ``local``).

The sink keeps the state of a target here in a folder beside it (``sink.layout``).
"""

from __future__ import annotations

from .backend import BACKEND, SCHEMES

__all__ = ["BACKEND", "SCHEMES"]

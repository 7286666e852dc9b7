"""One exception hierarchy for the whole project, rooted in :class:`RowtimeError`.

Each leaf also derives from the builtin it resembles, so callers may catch either
(``except ValueError`` keeps working). Messages name what was wrong, the value, and what to do.
Every message is redacted when the error is made (:func:`.redaction.redact`): an error built
from a location with a password, or from a library's text that echoes one, never holds it.

Every error a user can meet is exported from ``pyspark_rowtime`` under a name ending in
``Error`` (tests/test_public_errors.py). A few leaves live beside the code that raises them, in
the same hierarchy: ``DataLossError`` (streams/retention.py), ``CatalogError``
(streams/catalog.py), ``TableChangeError`` (datasource/table_delta.py),
``RedisUnavailableError`` and ``ObjectStoreUnavailableError`` (the backends' location modules),
``SparkVersionError`` and ``SparkVersionOptionError`` (streams/spark_compat.py),
``BadLineError`` (streams/text_lines.py) and ``BadInputError`` (connectors/sources.py; its name
before 0.3, ``BadInput``, still works).
"""

from __future__ import annotations

from typing import Any

from .redaction import redact

_MAX_SHOWN = 80


def shown(value: object) -> str:
    """The repr of a value for an error message, truncated if long."""
    text = repr(value)
    if len(text) > _MAX_SHOWN:
        text = text[: _MAX_SHOWN - 3] + "..."
    return text


class RowtimeError(Exception):
    """Root of every error this project raises on purpose. Its text arguments are redacted."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class InvalidRowtimeError(RowtimeError, ValueError):
    """A rowtime value that cannot be parsed or is out of range."""


class OptionError(RowtimeError, ValueError):
    """An option (reader, sink, writer, window) with an unknown name, a wrong type or range."""


class BoundError(RowtimeError, ValueError):
    """A rowtime bound that would move a partition's clock backwards."""


class LateRowError(RowtimeError, ValueError):
    """A row whose rowtime is below its partition's clock under the ``reject`` policy."""


class HeldRowsOverflowError(RowtimeError, RuntimeError):
    """``adjust`` would have to hold more rows than ``adjust.maxHeld`` allows."""


class SchemaError(RowtimeError, ValueError):
    """A schema that clashes with a stream's schema or with the columns the project adds."""


class StreamNotFoundError(RowtimeError, FileNotFoundError):
    """No stream exists at the given location."""


class WriterLockedError(RowtimeError, RuntimeError):
    """Another live writer holds the partition."""


class CorruptLogError(RowtimeError, RuntimeError):
    """A log file that cannot be read back as written."""


class WriterClosedError(RowtimeError, ValueError):
    """A writer used after ``close()`` (like I/O on a closed file, a ValueError)."""


class UnflushedRecordsError(RowtimeError, RuntimeError):
    """An operation that needs a writer's buffer empty, called while records are buffered:
    call ``flush()`` first."""


class OffsetError(RowtimeError, ValueError):
    """A stream position (a Spark offset from a checkpoint) that cannot be read."""


class CommitError(RowtimeError, RuntimeError):
    """A sink commit that Spark called without what it needs (a task's commit message)."""


class SinkBusyError(RowtimeError, RuntimeError):
    """Another commit to the same sink target still holds it after the wait."""


class QueryShapeError(RowtimeError, ValueError):
    """A query shape that would stop bound records from reaching Spark's watermark (a filter
    or a union below ``with_watermark``), refused before the query starts."""


class WaitTimeoutError(RowtimeError, TimeoutError):
    """A wait for a clock (``wait_for_rowtime_bound``, ``rowtime wait``) that ran out of time
    before the clock reached the time awaited. ``clock_us`` is the clock last read (None: none
    yet), ``until_us`` the time awaited and ``waited_s`` the seconds waited."""

    def __init__(self, message: str, clock_us: int | None, until_us: int, waited_s: float) -> None:
        super().__init__(message)
        self.clock_us, self.until_us, self.waited_s = clock_us, until_us, waited_s

    def __reduce__(self) -> tuple[type, tuple[str, int | None, int, float]]:
        return type(self), (str(self), self.clock_us, self.until_us, self.waited_s)

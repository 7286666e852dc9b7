"""One exception hierarchy for the whole project, rooted in ``RowtimeError``.

Each leaf also derives from the builtin it resembles, so callers may catch either
(``except ValueError`` keeps working). Messages name what was wrong, the value, and what to do.
Every message is redacted when the error is made (``redaction.redact``): an error built
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
    """Root of every error this project raises on purpose. Its text arguments are redacted.

    Examples:
        Catch every error the project raises on purpose:

        >>> import pyspark_rowtime as rt
        >>> try:
        ...     rt.to_rowtime_us("yesterday")
        ... except rt.RowtimeError as e:
        ...     print(type(e).__name__)
        InvalidRowtimeError
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class InvalidRowtimeError(RowtimeError, ValueError):
    """A rowtime value that cannot be parsed or is out of range.

    Examples:
        >>> import pyspark_rowtime as rt
        >>> rt.to_rowtime_us("yesterday")
        Traceback (most recent call last):
        ...
        pyspark_rowtime.bounds.errors.InvalidRowtimeError: ...
    """


class OptionError(RowtimeError, ValueError):
    """An option (reader, sink, writer, window) with an unknown name, a wrong type or range.

    Examples:
        >>> import pyspark_rowtime as rt
        >>> rt.AdjustPolicy(unit="min")
        Traceback (most recent call last):
        ...
        pyspark_rowtime.bounds.errors.OptionError: ...
    """


class BoundError(RowtimeError, ValueError):
    """A rowtime bound that would move a partition's clock backwards.

    Examples:
        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> path = tempfile.mkdtemp() + "/speeds"
        >>> _ = rt.create_stream(path, "sensor STRING, speed DOUBLE")
        >>> with rt.open_writer(path) as w:
        ...     w.set_rowtime_bound("2026-12-02T10:00:05Z")
        ...     w.set_rowtime_bound("2026-12-02T10:00:00Z", strict=True)
        Traceback (most recent call last):
        ...
        pyspark_rowtime.bounds.errors.BoundError: ...
    """


class LateRowError(RowtimeError, ValueError):
    """A row whose rowtime is below its partition's clock under the ``reject`` policy.

    Examples:
        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> path = tempfile.mkdtemp() + "/speeds"
        >>> _ = rt.create_stream(path, "sensor STRING, speed DOUBLE")
        >>> with rt.open_writer(path) as w:
        ...     _ = w.end_stream()
        ...     w.insert({"sensor": "a", "speed": 61.5}, rowtime="2026-12-02T10:00:00Z")
        Traceback (most recent call last):
        ...
        pyspark_rowtime.bounds.errors.LateRowError: ...
    """


class HeldRowsOverflowError(RowtimeError, RuntimeError):
    """``adjust`` would have to hold more rows than ``adjust.maxHeld`` allows.

    Examples:
        A reader fails with it inside Spark's query; it is also a ``RuntimeError``:

        >>> import pyspark_rowtime as rt
        >>> issubclass(rt.HeldRowsOverflowError, RuntimeError)
        True
    """


class SchemaError(RowtimeError, ValueError):
    """A schema that clashes with a stream's schema or with the columns the project adds.

    Examples:
        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> rt.create_stream(tempfile.mkdtemp() + "/s", "rowtime TIMESTAMP, speed DOUBLE")
        Traceback (most recent call last):
        ...
        pyspark_rowtime.bounds.errors.SchemaError: ...
    """


class StreamNotFoundError(RowtimeError, FileNotFoundError):
    """No stream exists at the given location.

    Examples:
        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> rt.open_stream(tempfile.mkdtemp() + "/nothing-here")
        Traceback (most recent call last):
        ...
        pyspark_rowtime.bounds.errors.StreamNotFoundError: ...
    """


class WriterLockedError(RowtimeError, RuntimeError):
    """Another live writer holds the partition.

    Examples:
        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> path = tempfile.mkdtemp() + "/speeds"
        >>> _ = rt.create_stream(path, "sensor STRING, speed DOUBLE")
        >>> with rt.open_writer(path) as w:
        ...     rt.open_writer(path)
        Traceback (most recent call last):
        ...
        pyspark_rowtime.bounds.errors.WriterLockedError: ...
    """


class CorruptLogError(RowtimeError, RuntimeError):
    """A log file that cannot be read back as written.

    Examples:
        Raised by a read of a damaged file; it is also a ``RuntimeError``:

        >>> import pyspark_rowtime as rt
        >>> issubclass(rt.CorruptLogError, RuntimeError)
        True
    """


class WriterClosedError(RowtimeError, ValueError):
    """A writer used after ``close()`` (like I/O on a closed file, a ValueError).

    Examples:
        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> path = tempfile.mkdtemp() + "/speeds"
        >>> _ = rt.create_stream(path, "sensor STRING, speed DOUBLE")
        >>> w = rt.open_writer(path)
        >>> w.close()
        >>> w.insert({"sensor": "a", "speed": 61.5})
        Traceback (most recent call last):
        ...
        pyspark_rowtime.bounds.errors.WriterClosedError: ...
    """


class UnflushedRecordsError(RowtimeError, RuntimeError):
    """An operation that needs a writer's buffer empty, called while records are buffered:
    call ``flush()`` first.

    Examples:
        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> path = tempfile.mkdtemp() + "/speeds"
        >>> _ = rt.create_stream(path, "sensor STRING, speed DOUBLE")
        >>> with rt.open_writer(path) as w:
        ...     w.insert({"sensor": "a", "speed": 61.5})
        ...     w.append_segment_files([])
        Traceback (most recent call last):
        ...
        pyspark_rowtime.bounds.errors.UnflushedRecordsError: ...
    """


class OffsetError(RowtimeError, ValueError):
    """A stream position (a Spark offset from a checkpoint) that cannot be read.

    Examples:
        Raised when a query restarts from a checkpoint it cannot read; also a ``ValueError``:

        >>> import pyspark_rowtime as rt
        >>> issubclass(rt.OffsetError, ValueError)
        True
    """


class CommitError(RowtimeError, RuntimeError):
    """A sink commit that Spark called without what it needs (a task's commit message).

    Examples:
        >>> import pyspark_rowtime as rt
        >>> issubclass(rt.CommitError, RuntimeError)
        True
    """


class SinkBusyError(RowtimeError, RuntimeError):
    """Another commit to the same sink target still holds it after the wait.

    Examples:
        Raised in a sink's commit; a ``RuntimeError``, so a retry loop may catch either:

        >>> import pyspark_rowtime as rt
        >>> issubclass(rt.SinkBusyError, RuntimeError)
        True
    """


class QueryShapeError(RowtimeError, ValueError):
    """A query shape that would stop bound records from reaching Spark's watermark (a filter
    or a union below ``with_watermark``), refused before the query starts.

    Examples:
        Raised by ``with_watermark`` before a query starts; also a ``ValueError``:

        >>> import pyspark_rowtime as rt
        >>> issubclass(rt.QueryShapeError, ValueError)
        True
    """


class WaitTimeoutError(RowtimeError, TimeoutError):
    """A wait for a clock (``wait_for_rowtime_bound``, ``rowtime wait``) that ran out of time
    before the clock reached the time awaited. ``clock_us`` is the clock last read (None: none
    yet), ``until_us`` the time awaited and ``waited_s`` the seconds waited.

    Examples:
        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> path = tempfile.mkdtemp() + "/speeds"
        >>> _ = rt.create_stream(path, "sensor STRING, speed DOUBLE")
        >>> try:
        ...     rt.wait_for_rowtime_bound(path, "2026-12-02T10:00:00Z", timeout=0)
        ... except TimeoutError as e:
        ...     print(e.clock_us, e.until_us)
        None 1796205600000000
    """

    def __init__(self, message: str, clock_us: int | None, until_us: int, waited_s: float) -> None:
        super().__init__(message)
        self.clock_us, self.until_us, self.waited_s = clock_us, until_us, waited_s

    def __reduce__(self) -> tuple[type, tuple[str, int | None, int, float]]:
        return type(self), (str(self), self.clock_us, self.until_us, self.waited_s)

"""What differs between the Spark versions ``format("rowtime")`` runs on, detected once.

The supported range is ``pyspark>=4.1,<5`` (pyproject.toml; ``./dev matrix`` runs a Spark subset
on each older minor). What each minor has that the reader and sink use:

* **4.3, 4.2**: everything. A Python stream reader may take part in admission control
  (``latestOffset(start, limit)``, ``getDefaultReadLimit``, ``ReadMaxRows``) and implement
  ``SupportsTriggerAvailableNow`` (``pyspark.sql.streaming.datasource``, new in 4.2).
* **4.1**: no ``pyspark.sql.streaming.datasource``. Spark calls ``latestOffset()`` with no
  arguments and applies no read limit. Under ``trigger(availableNow=True)`` it runs a source
  without ``SupportsTriggerAvailableNow`` as ``Trigger.Once`` (one micro-batch, no no-data
  batch: what the last bound closes is withheld), unless
  ``spark.sql.streaming.triggerAvailableNowWrapper.enabled`` is on; ``with_watermark`` turns it
  on (``pyspark_rowtime.watermark.available_now_runs_no_data_batches``). Either way the
  first ``latestOffset()`` is the run's final target (the wrapper asks for it before the
  checkpoint is read, so it is planned from the initial offset). A capped micro-batch would end
  the query there and leave the rest of the backlog unread, so on 4.1 the reader never caps a
  micro-batch (each one takes the whole backlog) and refuses ``maxRowsPerBatch`` by name
  (``refuse_before_admission_control``).
  ``to_arrow_schema`` takes ``timestamp_utc=True`` where 4.2 takes ``timezone="UTC"``.
* **4.0** and older: refused. The sink's base class ``DataSourceStreamArrowWriter`` is new in
  4.1. The modules Spark imports to find ``rowtime`` still import cleanly there (the names
  below fall back to stand-ins), and ``schema()``, ``reader()``, ``streamReader()`` and
  ``streamWriter()`` raise ``SparkVersionError`` naming both versions
  (``require_supported_spark``), so the user sees that error and not Spark's bare
  ``DATA_SOURCE_NOT_FOUND`` (which is what an import error during Spark's lookup becomes).

This module imports pyspark; only the Spark faces (``datasource/spark.py``, ``sink/spark.py``,
the package's ``source.py``) import it.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import pyspark
from pyspark.sql.datasource import DataSourceStreamWriter
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from ..bounds.errors import OptionError, RowtimeError

__all__ = [
    "HAS_ADMISSION_CONTROL",
    "SPARK_VERSION",
    "DataSourceStreamArrowWriter",
    "ReadAllAvailable",
    "ReadLimit",
    "ReadMaxRows",
    "SparkVersionError",
    "SupportsTriggerAvailableNow",
    "arrow_schema_utc",
    "refuse_before_admission_control",
    "require_supported_spark",
]


def _parse(version: str) -> tuple[int, int, int]:
    """``"4.1.4"`` (or ``"4.2.0.dev1"``, ``"4.1.0rc2"``) as (4, 1, 4)."""
    major, minor, patch = [*(int(m) for m in re.findall(r"\d+", version)[:3]), 0, 0, 0][:3]
    return major, minor, patch


#: The running pyspark's version, as (major, minor, patch); read once at import.
SPARK_VERSION: tuple[int, int, int] = _parse(pyspark.__version__)
SPARK_VERSION_TEXT: str = pyspark.__version__

#: The oldest Spark the reader and sink run on.
OLDEST_SUPPORTED = (4, 1)
#: The first Spark whose Python stream readers take part in admission control.
ADMISSION_CONTROL_SINCE = (4, 2)


class SparkVersionError(RowtimeError, RuntimeError):
    """The running Spark lacks what ``format("rowtime")`` (or one of its options) needs; the
    message names the Spark in use and the version needed.

    Examples:
        >>> import pyspark_rowtime as rt
        >>> issubclass(rt.SparkVersionError, RuntimeError)
        True
    """


class SparkVersionOptionError(SparkVersionError, OptionError):
    """An option whose meaning the running Spark cannot honour (also an ``OptionError``,
    so code that catches bad options catches it).

    Examples:
        >>> import pyspark_rowtime as rt
        >>> issubclass(rt.SparkVersionOptionError, rt.OptionError)
        True
    """


# pyspark.sql.streaming.datasource: new in Spark 4.2 (admission control and availableNow for
# Python stream readers). Before 4.2, stand-ins: the reader may subclass and test against them,
# and Spark never calls them.
try:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    HAS_ADMISSION_CONTROL = True
except ImportError:  # Spark 4.1 and older
    HAS_ADMISSION_CONTROL = False

    class ReadLimit:  # type: ignore[no-redef]
        """Stand-in for Spark 4.2's ``ReadLimit`` (never passed by Spark before 4.2)."""

    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef]
        """Stand-in for Spark 4.2's ``ReadAllAvailable``."""

    class ReadMaxRows(ReadLimit):  # type: ignore[no-redef]
        """Stand-in for Spark 4.2's ``ReadMaxRows``."""

        def __init__(self, max_rows: int) -> None:
            self.max_rows = max_rows

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in for Spark 4.2's mixin: Spark 4.1 does not look for it."""

        def prepareForTriggerAvailableNow(self) -> None:
            pass


# DataSourceStreamArrowWriter (write() receives Arrow record batches): new in Spark 4.1. On 4.0
# the name stands for the row-based writer so that sink/spark.py imports; writer() is refused
# there before any of it runs (require_supported_spark).
try:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
except ImportError:  # Spark 4.0
    DataSourceStreamArrowWriter = DataSourceStreamWriter  # type: ignore[misc,assignment]


# pyspark.sql.pandas.types.to_arrow_schema is pyspark's own helper (no stable API) and its
# signature changed: Spark 4.1 has ``timestamp_utc: bool = True``; 4.2 replaced it with the
# keyword-only ``timezone: str | None``. Detected once, here.
_TO_ARROW_PARAMS = inspect.signature(to_arrow_schema).parameters
_TO_ARROW_TZ: dict[str, Any] = (
    {"timezone": "UTC"} if "timezone" in _TO_ARROW_PARAMS else {"timestamp_utc": True}
)


def arrow_schema_utc(schema: StructType) -> Any:
    """Spark's schema as Arrow's, timestamps in UTC and no large types, on every 4.x."""
    return to_arrow_schema(schema, prefers_large_types=False, **_TO_ARROW_TZ)


def require_supported_spark(where: str) -> None:
    """Raise ``SparkVersionError`` when the running Spark is older than the oldest one
    supported. Called first thing where Spark calls the source (``schema()``, ``reader()``,
    ``streamReader()``, ``streamWriter()``), so the error reaches the user."""
    if SPARK_VERSION[:2] < OLDEST_SUPPORTED:
        raise SparkVersionError(
            f"format('rowtime') {where} needs Spark {OLDEST_SUPPORTED[0]}.{OLDEST_SUPPORTED[1]} "
            f"or later; this is Spark {SPARK_VERSION_TEXT} (pyspark {SPARK_VERSION_TEXT}), whose "
            "Python data source API lacks the Arrow stream writer and the stream reader calls "
            "the reader and sink use. Install pyspark>=4.1,<5 (4.2 or later for read limits)"
        )


def refuse_before_admission_control(option: str, value: object, what: str) -> None:
    """Refuse an option that needs admission control on a Spark without it (4.1)."""
    if not HAS_ADMISSION_CONTROL:
        need = f"{ADMISSION_CONTROL_SINCE[0]}.{ADMISSION_CONTROL_SINCE[1]}"
        raise SparkVersionOptionError(
            f"option {option}={value} needs Spark {need} or later: {what}. This is Spark "
            f"{SPARK_VERSION_TEXT}, which applies no read limit to a Python stream source (under "
            "trigger(availableNow=True) a capped micro-batch would end the query with the rest "
            f"of the backlog unread). Remove the option (each micro-batch then reads the whole "
            f"backlog), or run on Spark {need} or later"
        )

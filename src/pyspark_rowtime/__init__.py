"""pyspark-rowtime: event time at the edges of Spark.

``spark.readStream.format("rowtime")`` reads a rowtime stream in rowtime order with bound
records that move Spark's watermark; ``writeStream.format("rowtime")`` writes exactly once and
keeps a clock downstream jobs can wait on; the adapter API feeds streams from Python.

Attributes are imported lazily (PEP 562), so ``import pyspark_rowtime.bounds`` stays free of
pyspark and the log, while Spark's lookup of ``pyspark_rowtime.DefaultSource`` still works.

The code cites the project's rules as ``SPEC n``: section ``n`` of docs/design/rules.md in the
repository (tests/test_spec_references.py keeps every citation resolvable).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.2.0"

_EXPORTS = {
    "DefaultSource": "pyspark_rowtime.source:RowtimeDataSource",
    "RowtimeDataSource": "pyspark_rowtime.source:RowtimeDataSource",
    "use_catalog": "pyspark_rowtime.source:use_catalog",
    "with_watermark": "pyspark_rowtime.watermark:with_watermark",
    "check_query": "pyspark_rowtime.watermark:check_query",
    "check_dataframe": "pyspark_rowtime.watermark:check_dataframe",
    "watch_queries": "pyspark_rowtime.watermark:watch_queries",
    "QueryShapeError": "pyspark_rowtime.bounds.errors:QueryShapeError",
    "create_stream": "pyspark_rowtime.api:create_stream",
    "open_writer": "pyspark_rowtime.api:open_writer",
    "get_rowtime_bound": "pyspark_rowtime.api:get_rowtime_bound",
    "wait_for_rowtime_bound": "pyspark_rowtime.api:wait_for_rowtime_bound",
    "read_stream": "pyspark_rowtime.api:read_stream",
    "BoundError": "pyspark_rowtime.bounds.errors:BoundError",
    "CommitError": "pyspark_rowtime.bounds.errors:CommitError",
    "CorruptLogError": "pyspark_rowtime.bounds.errors:CorruptLogError",
    "HeldRowsOverflowError": "pyspark_rowtime.bounds.errors:HeldRowsOverflowError",
    "InvalidRowtimeError": "pyspark_rowtime.bounds.errors:InvalidRowtimeError",
    "LateRowError": "pyspark_rowtime.bounds.errors:LateRowError",
    "OffsetError": "pyspark_rowtime.bounds.errors:OffsetError",
    "OptionError": "pyspark_rowtime.bounds.errors:OptionError",
    "RowtimeError": "pyspark_rowtime.bounds.errors:RowtimeError",
    "SchemaError": "pyspark_rowtime.bounds.errors:SchemaError",
    "SinkBusyError": "pyspark_rowtime.bounds.errors:SinkBusyError",
    "StreamNotFoundError": "pyspark_rowtime.bounds.errors:StreamNotFoundError",
    "UnflushedRecordsError": "pyspark_rowtime.bounds.errors:UnflushedRecordsError",
    "WriterClosedError": "pyspark_rowtime.bounds.errors:WriterClosedError",
    "WriterLockedError": "pyspark_rowtime.bounds.errors:WriterLockedError",
    "WaitTimeoutError": "pyspark_rowtime.bounds.errors:WaitTimeoutError",
    # Errors defined beside the code that raises them, in the same hierarchy (RowtimeError):
    "BadInputError": "pyspark_rowtime.connectors.sources:BadInputError",
    "BadInput": "pyspark_rowtime.connectors.sources:BadInputError",  # the name before 0.3
    "BadLineError": "pyspark_rowtime.streams.text_lines:BadLineError",
    "CatalogError": "pyspark_rowtime.streams.catalog:CatalogError",
    "DataLossError": "pyspark_rowtime.streams.retention:DataLossError",
    "ObjectStoreUnavailableError": (
        "pyspark_rowtime.streams.objstore.location:ObjectStoreUnavailableError"
    ),
    "RedisUnavailableError": "pyspark_rowtime.streams.redis.location:RedisUnavailableError",
    "SparkVersionError": "pyspark_rowtime.streams.spark_compat:SparkVersionError",
    "SparkVersionOptionError": "pyspark_rowtime.streams.spark_compat:SparkVersionOptionError",
    "TableChangeError": "pyspark_rowtime.datasource.table_delta:TableChangeError",
    "AdjustPolicy": "pyspark_rowtime.bounds.policies:AdjustPolicy",
    "DropPolicy": "pyspark_rowtime.bounds.policies:DropPolicy",
    "RejectPolicy": "pyspark_rowtime.bounds.policies:RejectPolicy",
    "TimeIntervalSpec": "pyspark_rowtime.bounds.panes:TimeIntervalSpec",
    "TimeIntervalWindow": "pyspark_rowtime.bounds.panes:TimeIntervalWindow",
    "assign_panes": "pyspark_rowtime.bounds.panes:assign_panes",
    "to_rowtime_us": "pyspark_rowtime.bounds.time:to_rowtime_us",
    "from_rowtime_us": "pyspark_rowtime.bounds.time:from_rowtime_us",
    "open_stream": "pyspark_rowtime.api:open_stream",
    "ValidityInterval": "pyspark_rowtime.bounds.intervals:ValidityInterval",
    "time_interval_aggregate": "pyspark_rowtime.windows.aggregate:time_interval_aggregate",
    "overlap_join": "pyspark_rowtime.windows.join:overlap_join",
    "interval_aggregate": "pyspark_rowtime.windows.validity:interval_aggregate",
    "rows_window": "pyspark_rowtime.windows.define:rows_window",
    "while_window": "pyspark_rowtime.windows.define:while_window",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'pyspark_rowtime' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    value = getattr(import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)

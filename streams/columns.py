"""Column names, each defined once.

Two vocabularies, kept apart on purpose:

* the log's **system columns**, stored in every segment before the payload (the ``__`` prefix
  keeps them clear of payload names, which may not start with ``__``):
  ``LOG_ARRIVAL_US``, ``LOG_ROWTIME_US``, ``LOG_IS_BOUND``;
* the **Spark-facing columns** the reader adds to every row and the sink reads from a query:
  ``SPARK_ROWTIME`` (TIMESTAMP) and ``SPARK_IS_BOUND`` (BOOLEAN).

Both ``datasource/`` and ``sink/`` import them from here (neither imports the other).
"""

from __future__ import annotations

#: int64, not null: the writer's clock when it appended the record (microseconds, UTC),
#: non-decreasing per partition.
LOG_ARRIVAL_US = "__arrival_us"
#: int64, nullable: the explicit rowtime, the bound of a bound record, or null (implicit
#: rowtime: the arrival time is the rowtime). Microseconds, UTC.
LOG_ROWTIME_US = "__rowtime_us"
#: bool, not null: true on bound records.
LOG_IS_BOUND = "__is_bound"
#: The system columns in the order segments store them.
LOG_SYSTEM_COLUMNS = (LOG_ARRIVAL_US, LOG_ROWTIME_US, LOG_IS_BOUND)

#: The event time of a row as Spark sees it (TIMESTAMP).
SPARK_ROWTIME = "rowtime"
#: True on bound records as Spark sees them (BOOLEAN).
SPARK_IS_BOUND = "is_bound"
#: The columns the reader adds; payload columns may not use these names.
SPARK_COLUMNS = (SPARK_ROWTIME, SPARK_IS_BOUND)

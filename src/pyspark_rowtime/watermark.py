"""``with_watermark``: Spark's watermark on ``rowtime``, fed by the reader's bound records."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .bounds.time import parse_duration_us

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: The smallest delay Spark does not truncate to zero: it keeps watermarks in milliseconds.
_MIN_DELAY_US = 1000


def with_watermark(df: DataFrame, delay: Any = None) -> DataFrame:
    """Apply ``withWatermark("rowtime", ...)`` and remove the bound records after it.

    ``delay`` (a duration: seconds, a timedelta or a string such as ``"5s"``) is raised to at
    least one millisecond: Spark drops rows *below or at* the watermark it derives from a batch,
    so with a delay of zero a later row exactly at the last bound would count as late. One
    microsecond is not enough: Spark keeps the watermark and the delay in whole milliseconds
    (``EventTimeWatermark.getDelayMs`` truncates), so a delay under 1 ms is a delay of zero.
    The price: a window ending exactly at a bound closes once a bound at least 1 ms past its
    end arrives.

    The bound records must pass the watermark node to move it, and only then be removed. Spark's
    optimizer pushes a filter below ``EventTimeWatermark`` unless the predicate references the
    event-time column, so the predicate is written over ``rowtime`` as well as ``is_bound``: a
    plain ``where(~is_bound)`` would be pushed below the watermark and bounds would never reach
    it. The ``is_bound`` column is dropped from the result.
    """
    from pyspark.sql import functions as F

    if "rowtime" not in df.columns or "is_bound" not in df.columns:
        raise ValueError(
            "with_watermark needs the columns rowtime and is_bound of a format('rowtime') stream;"
            f" got columns {df.columns}"
        )
    delay_us = _MIN_DELAY_US if delay is None else parse_duration_us(delay, what="delay")
    delay_us = max(_MIN_DELAY_US, delay_us)
    watermarked = df.withWatermark("rowtime", f"{delay_us} microseconds")
    data_rows = F.when(F.col("rowtime").isNotNull(), ~F.col("is_bound")).otherwise(F.lit(False))
    return watermarked.where(data_rows).drop("is_bound")

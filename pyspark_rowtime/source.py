"""``format("rowtime")`` as Spark sees it: the reader's data source plus the sink.

Spark asks one :class:`~pyspark.sql.datasource.DataSource` class for both directions. The reader
(``datasource/``) and the sink (``sink/``) never import each other, so the class that joins them
lives here, in the package's face: it is the reader's data source with ``streamWriter``
added. ``pyspark_rowtime.DefaultSource`` is this class.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSourceStreamWriter
from pyspark.sql.types import StructType

from .datasource.spark import RowtimeReaderSource

__all__ = ["RowtimeDataSource"]


class RowtimeDataSource(RowtimeReaderSource):
    """``format("rowtime")``: rowtime streams for Spark, read and written."""

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink.spark import make_stream_writer  # lazily: readers never load the sink

        return make_stream_writer(dict(self.options), schema, overwrite)

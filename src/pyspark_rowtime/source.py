"""``format("rowtime")`` as Spark sees it: the reader's data source plus the sink.

Spark asks one ``pyspark.sql.datasource.DataSource`` class for both directions. The reader
(``datasource/``) and the sink (``sink/``) never import each other, so the class that joins them
lives here, in the package's face: it is the reader's data source with ``streamWriter``
added. ``pyspark_rowtime.DefaultSource`` is this class.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter
from pyspark.sql.types import StructType

from .datasource.spark import RowtimeReaderSource
from .streams.catalog import CATALOG_CONF, find_catalog

__all__ = ["RowtimeDataSource", "use_catalog"]


class RowtimeDataSource(RowtimeReaderSource):
    """``format("rowtime")``: rowtime streams for Spark, read and written.

    Spark finds it by itself as ``pyspark_rowtime.DefaultSource`` (this class): nothing to
    register. ``spark.readStream.format("rowtime")`` reads a stream in rowtime order, with the
    payload columns, ``rowtime`` and ``is_bound`` (docs/users/reader.md);
    ``writeStream.format("rowtime")`` writes a stream, a Parquet folder, a Delta or an Iceberg
    table exactly once, with a clock (docs/users/sink.md).

    Examples:
        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> path = tempfile.mkdtemp() + "/speeds"
        >>> _ = rt.create_stream(path, "sensor STRING, speed DOUBLE")
        >>> rt.RowtimeDataSource.name()
        'rowtime'
        >>> spark.readStream.format("rowtime").load(path).columns
        ['sensor', 'speed', 'rowtime', 'is_bound']
    """

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .streams.spark_compat import require_supported_spark

        require_supported_spark("streamWriter()")
        from .sink.spark import make_stream_writer  # lazily: readers never load the sink

        return make_stream_writer(dict(self.options), schema, overwrite, self.conf_catalog)


def use_catalog(spark: Any, path: str | None = None) -> str:
    r"""Make ``format("rowtime")`` of this session resolve ``option("stream", NAME)`` by a catalog.

    Why a call is needed: a Python data source sees only its options. pyspark's planner
    workers receive a hand-picked set of Spark confs that the data source cannot read, and the
    class Spark finds by itself (``pyspark_rowtime.DefaultSource``) is created without the
    session. This reads the conf on the driver and registers a subclass of
    [`RowtimeDataSource`][pyspark_rowtime.source.RowtimeDataSource] that carries the path; the
    class is made here at run time, so it
    is pickled by value and the path reaches every planner and executor process. Without the
    call, the environment variable ``ROWTIME_CATALOG`` (inherited by Spark's Python workers when
    set before the session starts) or ``option("catalog", ...)`` still work.

    Args:
        spark: the session.
        path: the catalog file (docs/operators/catalog.md); None (default): the Spark conf
            ``spark.rowtime.catalog``.

    Returns:
        The path of the catalog used.

    Raises:
        CatalogError: no catalog given, or one that cannot be read (file, line and key named).

    Examples:
        >>> import pathlib, tempfile
        >>> import pyspark_rowtime as rt
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> _ = rt.create_stream(folder / "speeds", "sensor STRING, speed DOUBLE")
        >>> catalog = folder / "catalog.toml"
        >>> _ = catalog.write_text(
        ...     '[streams.speeds]\nlocation = "speeds"\nschema = "sensor STRING, speed DOUBLE"')
        >>> _ = rt.use_catalog(spark, str(catalog))
        >>> spark.readStream.format("rowtime").option("stream", "speeds").load().columns
        ['sensor', 'speed', 'rowtime', 'is_bound']
    """
    conf = spark.conf.get(CATALOG_CONF, None) if path is None else path
    resolved = find_catalog(None, conf, needed_for="use_catalog")
    source = type("RowtimeCatalogSource", (RowtimeDataSource,), {"conf_catalog": resolved})
    source.__module__ = "__main__"  # not importable by name: cloudpickle sends it by value
    spark.dataSource.register(source)
    return resolved

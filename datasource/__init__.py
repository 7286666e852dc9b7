"""The Spark reader: ``spark.readStream.format("rowtime")`` and ``spark.read.format("rowtime")``.

* ``options`` -- the reader's options, parsed once into a ``ReaderConfig``;
* ``spark`` -- the Python Data Source API classes, kept thin;
* ``planner`` -- the driver: from a start offset and the log to an end offset and tasks,
  with ``ordered`` (the fast paths for records in order and late rows within the range)
  and ``tasks`` (the task types and the step driver and executors share);
* ``executor`` -- the executors: one task as Arrow record batches;
* ``intervals`` -- validity intervals, the ``rowtime_end`` column;
* ``retention`` -- the reader over a trimmed stream (``failOnDataLoss``);
* ``reader`` -- the import path of 0.1.0 and 0.2.0, which re-exports the above;
* tables read as streams (``option("table", ...)``): ``table_spark`` (the Spark face),
  ``table_source`` (the work, without Spark), ``table_log`` (a table's history as a log
  of one partition), ``table_delta`` and ``table_iceberg`` (each format's versions).

Reaches records only through ``pyspark_rowtime.streams.storage``; never imports the sink
(``tests/test_layers.py`` checks it). The class Spark finds, with the sink's ``streamWriter``
added, is ``pyspark_rowtime.source.RowtimeDataSource``.
"""

"""The Spark reader: ``spark.readStream.format("rowtime")`` and ``spark.read.format("rowtime")``.

* :mod:`.options` -- the reader's options, parsed once into a ``ReaderConfig``;
* :mod:`.spark` -- the Python Data Source API classes, kept thin;
* :mod:`.planner` -- the driver: from a start offset and the log to an end offset and tasks,
  with :mod:`.ordered` (the fast paths for records in order and late rows within the range)
  and :mod:`.tasks` (the task types and the step driver and executors share);
* :mod:`.executor` -- the executors: one task as Arrow record batches;
* :mod:`.intervals` -- validity intervals, the ``rowtime_end`` column;
* :mod:`.retention` -- the reader over a trimmed stream (``failOnDataLoss``);
* :mod:`.reader` -- the import path of 0.1.0 and 0.2.0, which re-exports the above;
* tables read as streams (``option("table", ...)``): :mod:`.table_spark` (the Spark face),
  :mod:`.table_source` (the work, without Spark), :mod:`.table_log` (a table's history as a log
  of one partition), :mod:`.table_delta` and :mod:`.table_iceberg` (each format's versions).

Reaches records only through :mod:`pyspark_rowtime.streams.storage`; never imports the sink
(``tests/test_layers.py`` checks it). The class Spark finds, with the sink's ``streamWriter``
added, is :class:`pyspark_rowtime.source.RowtimeDataSource`.
"""

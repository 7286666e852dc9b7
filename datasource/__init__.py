"""The Spark reader: ``spark.readStream.format("rowtime")`` and ``spark.read.format("rowtime")``.

* :mod:`.options` -- the reader's options, parsed once into a ``ReaderConfig``;
* :mod:`.reader` -- the planner (micro-batch ends, policies, bounds) and the executors' reads;
* :mod:`.spark` -- the Python Data Source API classes, kept thin.

Reaches records only through :mod:`pyspark_rowtime.streams.storage`; never imports the sink
(``tests/test_layers.py`` checks it). The class Spark finds, with the sink's ``streamWriter``
added, is :class:`pyspark_rowtime.source.RowtimeDataSource`.
"""

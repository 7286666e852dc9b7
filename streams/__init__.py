"""Where records live: the storage seam, the embedded log and the adapter-facing writer.

* :mod:`.storage` -- the interface everything above ``streams/`` uses: ``StreamStorage`` (read,
  clocks, ends), ``PartitionAppender`` (append, one holder per partition), the ``Backend``
  registry by URL scheme, and ``what_is_at`` (stream, pending sink target, Parquet target);
* :mod:`.local` -- the embedded log, the first backend (a package): a stream is a folder of
  immutable Arrow IPC segment files per partition; ``open_stream``, ``create_stream``;
* :mod:`.segments` -- the segment format: footers (``SegmentStats``), writing segment files,
  and the checks that decide whether files written elsewhere continue a partition;
* :mod:`.writer` -- ``open_writer``: insert rows and bounds into one partition, durably;
* :mod:`.columns` -- column names, once: the log's system columns and the Spark-facing ones;
* :mod:`.options` -- the option tables the reader and the sink read Spark's options with;
* :mod:`.meta` -- ``_stream.json``: payload schema, partition count, ops' defaults;
* :mod:`.lock` -- one writer per partition (``flock``, released when the holder dies);
* :mod:`.ddl` -- Spark DDL strings to the pyarrow schemas Spark uses, without a JVM.
"""

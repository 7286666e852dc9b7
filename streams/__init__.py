"""Where records live: the storage seam, its backends and the adapter-facing writer.

* ``storage`` -- the interface everything above ``streams/`` uses: ``StreamStorage`` (read,
  clocks, ends, first kept offsets), ``PartitionAppender`` (append, one holder per
  partition), the capabilities only some backends have (``SupportsTrim``, ``SupportsVerify``,
  ...), the ``Backend`` registry by URL scheme, and ``what_is_at`` (stream, pending sink
  target, Parquet target);
* ``sink_state`` -- the sink's seams: ``SinkState`` (a target's description, owner,
  manifest and staged runs) and ``TargetFiles`` (files below a location of a backend that keeps
  files itself), as capabilities of a backend;
* the backends, a package each, found by URL scheme: ``local`` (the embedded log: a stream
  is a folder of immutable Arrow IPC segment files per partition), ``redis`` (Redis
  Streams; ``redis_log`` keeps 0.1.0's import path), ``objstore`` (S3, Azure Blob);
* ``segments`` -- the segment format: footers (``SegmentStats``), writing segment files,
  and the checks that decide whether files written elsewhere continue a partition;
  ``checksums`` -- the record batches' checksums, checked as reads return records;
* ``writer`` -- ``open_writer``: insert rows and bounds into one partition, durably, with
  ``row_checks`` (what it checks of a row before buffering it);
* ``retention`` -- which records may be removed, and the state readers start from then;
* ``tables`` -- Delta Lake and Iceberg tables as sink targets, and the clock in their
  metadata;
* ``catalog`` -- the TOML catalog of streams and connectors;
* ``text_lines``, ``text_values`` -- rows from JSON lines and CSV, read strictly, and
  their values converted to the columns' types (``rowtime insert`` and the directory
  connector);
* ``columns`` -- column names, once: the log's system columns and the Spark-facing ones;
* ``options`` -- the option tables the reader and the sink read Spark's options with;
* ``meta`` -- ``_stream.json``: payload schema, partition count, ops' defaults;
* ``lock`` -- one writer per partition (``flock``, released when the holder dies);
* ``ddl`` -- Spark DDL strings to the pyarrow schemas Spark uses, without a JVM;
* ``spark_compat`` -- what differs between the Spark versions, detected once.
"""

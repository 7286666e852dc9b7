"""Where records live: the storage seam, its backends and the adapter-facing writer.

* :mod:`.storage` -- the interface everything above ``streams/`` uses: ``StreamStorage`` (read,
  clocks, ends, first kept offsets), ``PartitionAppender`` (append, one holder per
  partition), the capabilities only some backends have (``SupportsTrim``, ``SupportsVerify``,
  ...), the ``Backend`` registry by URL scheme, and ``what_is_at`` (stream, pending sink
  target, Parquet target);
* :mod:`.sink_state` -- the sink's seams: ``SinkState`` (a target's description, owner,
  manifest and staged runs) and ``TargetFiles`` (files below a location of a backend that keeps
  files itself), as capabilities of a backend;
* the backends, a package each, found by URL scheme: :mod:`.local` (the embedded log: a stream
  is a folder of immutable Arrow IPC segment files per partition), :mod:`.redis` (Redis
  Streams; :mod:`.redis_log` keeps 0.1.0's import path), :mod:`.objstore` (S3, Azure Blob);
* :mod:`.segments` -- the segment format: footers (``SegmentStats``), writing segment files,
  and the checks that decide whether files written elsewhere continue a partition;
  :mod:`.checksums` -- the record batches' checksums, checked as reads return records;
* :mod:`.writer` -- ``open_writer``: insert rows and bounds into one partition, durably, with
  :mod:`.row_checks` (what it checks of a row before buffering it);
* :mod:`.retention` -- which records may be removed, and the state readers start from then;
* :mod:`.tables` -- Delta Lake and Iceberg tables as sink targets, and the clock in their
  metadata;
* :mod:`.catalog` -- the TOML catalog of streams and connectors;
* :mod:`.text_lines`, :mod:`.text_values` -- rows from JSON lines and CSV, read strictly, and
  their values converted to the columns' types (``rowtime insert`` and the directory
  connector);
* :mod:`.columns` -- column names, once: the log's system columns and the Spark-facing ones;
* :mod:`.options` -- the option tables the reader and the sink read Spark's options with;
* :mod:`.meta` -- ``_stream.json``: payload schema, partition count, ops' defaults;
* :mod:`.lock` -- one writer per partition (``flock``, released when the holder dies);
* :mod:`.ddl` -- Spark DDL strings to the pyarrow schemas Spark uses, without a JVM;
* :mod:`.spark_compat` -- what differs between the Spark versions, detected once.
"""

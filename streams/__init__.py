"""Where records live: the embedded log and the adapter-facing writer.

* :mod:`.log` -- a stream is a folder of immutable Arrow IPC segment files per partition;
  ``open_stream``, ``create_stream``, ``Stream.read`` / ``end_offset`` / ``clock_us``;
* :mod:`.writer` -- ``open_writer``: insert rows and bounds into one partition, durably;
* :mod:`.meta` -- ``_stream.json``: payload schema, partition count, ops' defaults;
* :mod:`.lock` -- one writer per partition (``flock``, released when the holder dies);
* :mod:`.ddl` -- Spark DDL strings to the pyarrow schemas Spark uses, without a JVM.
"""

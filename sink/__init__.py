"""The Spark sink: ``df.writeStream.format("rowtime")``, exactly once, with a clock.

Input: any streaming DataFrame with a ``rowtime`` TIMESTAMP column; ``is_bound`` (BOOLEAN, true
on the bound records of a ``format("rowtime")`` source) is optional. The other columns are the
payload. A query without ``rowtime`` fails when it starts, naming the column.

Options (``options``; an unknown one is an error naming it):

* ``path``: the target; ``target``: ``stream`` (default, a rowtime stream, created with the
  payload columns by the first commit if absent, with ``partitions``: by default one per write
  task of that batch, one for a query that keeps state with ``clock=watermark``;
  ``stream_target``)
  or ``parquet`` (files in time partitions; ``parquet_target``) with ``granularity``
  minute|hour|day (default hour) and ``compression`` (default snappy), or ``delta`` or
  ``iceberg`` (a table, its clock in the table's own commits);
* ``clock``: ``bounds`` (the default when the query has ``is_bound``: pass-through queries) or
  ``watermark`` (the default without it: stateful queries after ``with_watermark``), see
  ``clock``; ``checkpointLocation`` is read for the watermark and the query's id.

Exactly once: ``write()`` stages files named by batch, task and attempt; ``commit()`` publishes
a batch once (a manifest entry or an intent per batch id, in ``<target>/_rowtime_sink/``), so a
batch replayed after a crash leaves the target as if written once. A target belongs to the
query that first commits to it. ``get_rowtime_bound(path)``, ``rowtime clock`` and
``rowtime describe`` read either kind of target.

Modules: ``spark`` (Spark's writer, thin), ``options``, ``target`` (the ``Target`` protocol and
the write-task skeleton every target shares), ``stream_target`` (with ``contiguous``, a run's
rows in one chunk per column, ``spill``, sorted runs kept aside and merged, and ``merge``, the
commit of one ordered partition merging the tasks' runs by rowtime ranges into staged runs it
links), ``parquet_target``, the table targets (``table_target``, what they share;
``delta_target``, ``iceberg_target``; ``table_describe``, what ``rowtime describe`` says of
them), ``task`` (row splitting, task reports), ``manifest`` (typed manifest entries),
``clock``, ``layout`` (the sink's files beside a target). The sink reaches streams only through
``pyspark_rowtime.streams.storage`` and never imports the reader (``tests/test_layers.py``).
"""

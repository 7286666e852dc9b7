"""Windows on Spark driven by the rowtime bounds (SPEC section 10): ``time_interval_aggregate``.

Layered like ``datasource`` and ``sink``: it uses ``bounds`` (the pure core) and pyspark, never
the reader, the sink or the log.
"""

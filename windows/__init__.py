"""Windows on Spark driven by the rowtime bounds (SPEC section 10): ``time_interval_aggregate``.

* ``aggregate`` -- ``time_interval_aggregate``, IBM Streams ``timeInterval`` panes, with
  ``step`` (its per-key step: panes, trigger, re-trigger, ``discardAge``);
* ``validity`` -- ``interval_aggregate``, the Odysseus aggregate over validity intervals;
* ``join`` -- ``overlap_join``, the Odysseus join of two streams of validity intervals;
* ``define`` -- windows as validity, grouped (element based and predicate based).
* ``stateful`` -- the skeleton the three stateful operators share: each is a config, a logic
  with a pure step and a versioned state (``step.StateFormat``), run on Spark's state
  store by the one shared piece, ``run_on_state_store``.

Layered like ``datasource`` and ``sink``: it uses ``bounds`` (the pure core), ``with_watermark``'s
plan reading and pyspark, never the reader, the sink or the log.
"""

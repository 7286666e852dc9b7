"""pyspark-rowtime: event time at the edges of Spark."""

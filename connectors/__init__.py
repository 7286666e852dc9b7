"""Connectors: processes that feed a rowtime stream from outside, with bounds you can reason about.

Declared in the catalog (``[connectors.NAME]``, ``streams.catalog``) and run by
``rowtime connect CATALOG NAME`` (``run``). Each connector writes one partition of its
stream and keeps its position (which file and byte, which generated row, which Redis entry ID)
in a progress file beside the stream, committed with the rows it brought, the rows it holds and
the rows it rejected, so that a restart after a kill continues without loss or duplicates
(``feed`` says how the crash window is closed). Sources: ``sources`` (directory,
generator), ``redis_source``. Bounds come from a strategy (``strategies``). Connectors
import ``bounds`` and ``streams`` only.
"""

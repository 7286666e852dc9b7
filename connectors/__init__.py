"""Connectors: processes that feed a rowtime stream from outside, with bounds you can reason about.

Declared in the catalog (``[connectors.NAME]``, :mod:`..streams.catalog`) and run by
``rowtime connect CATALOG NAME``. Each connector writes one partition of its stream and keeps its
position (which file and byte, which generated row, which Redis entry) in a progress file beside
the stream, so that a restart after a kill continues without loss or duplicates
(:mod:`.progress` says how the crash window is closed). Bounds come from a strategy
(:mod:`.strategies`). Connectors import ``bounds`` and ``streams`` only.
"""

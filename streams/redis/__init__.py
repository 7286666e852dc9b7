"""The Redis backend: rowtime streams on Redis Streams.

Keys of the stream ``name`` (all share the hash tag ``{rowtime:name}``, so on Redis Cluster one
stream lives in one slot and one Lua script may touch all of its keys)::

    {rowtime:name}:meta          HASH  meta: the stream's metadata, the same JSON document as
                                       the embedded log's _stream.json; external: how a stream
                                       written by others maps to it (absent for own streams)
    {rowtime:name}:p:<n>         STREAM  partition n's records (own streams)
    {rowtime:name}:i:<n>         ZSET  partition n's offset index: score = first offset of an
                                       entry (or, for external streams, of a run of entries),
                                       member = "first:count:first-id:last-id"
    {rowtime:name}:s:<n>         ZSET  one summary per appended run (score = its first offset,
                                       member = the run's footer statistics as JSON)
    {rowtime:name}:t:<n>         HASH  the partition's tail: end (records), clock (us), arrival
                                       (us, of the last record), run (the last run's id), bad
    {rowtime:name}:tm:<n>        HASH  own streams: entry ID -> the entry's system columns alone
                                       (arrival, rowtime, is_bound) as Arrow IPC, written by the
                                       same script as the entry: what the reader's planner reads
    {rowtime:name}:lock:<n>      STRING the one writer's token, with a lease (SET NX PX)
    {rowtime:name}:trim:<n>      HASH  start: the first kept offset (retention removed the
                                       records before it); state: the policy state there
                                       (streams.retention.TrimState as JSON)
    {rowtime:name}:retention     STRING retention changed by ops (JSON; else the defaults')
    {rowtime:name}:bad:<n>       HASH  external streams: entry id -> why it is bad input

Records and offsets. A partition's records are numbered from 0 (its *offsets*, dense, as in the
embedded log: the reader's planner counts rows by subtracting them). An own stream's entry holds
a run of records as one Arrow IPC stream in field ``a`` (the segment format's columns:
``__arrival_us``, ``__rowtime_us``, ``__is_bound``, then the payload), with its first offset
``f`` and record count ``n``; the index maps an offset to the entry ID that holds it. Entry IDs
are assigned by the server (``XADD *``), so an entry's ID is the server's time when the run was
committed.

The reader's planner (on the Spark driver) needs each record's times, never its payload: a read
of system columns only takes them from ``tm`` (17 bytes a record) instead of the entries, so the
driver plans from entry IDs, offsets and clocks and the executors fetch the payloads themselves
(entries written before ``tm`` existed are read whole, as before). It costs about 17 more bytes
a record in the server's memory, and the planner reads a small fraction of the bytes it would
read from the entries (docs/benchmarks.md, "Redis Streams").

Why Arrow IPC per entry and not one entry per row with a field per column: a run is decoded and
encoded by one Arrow call, where fields per row cost a Python conversion per value, so Arrow
entries write and read far faster for a little more memory per row
(``./dev bench log``; the figures are in docs/benchmarks.md, "Redis Streams"). Entries are not
compressed.

An external stream (``create.register_external``) is a Redis stream filled by any client with
``XADD key * field value ...``: one entry is one data row. Its records are numbered as entries
are first indexed (by whoever asks for the partition's end: the reader's driver), in ID order;
an entry's arrival time and implicit rowtime are its ID's time (the server's clock when it was
added, which Redis keeps non-decreasing per key: SPEC 4's ``max(previous, now)``), in whole
milliseconds. An entry that cannot be read as a row of the declared schema is bad input: it takes
no offset, it is named (key and entry ID, and why) in ``{rowtime:name}:bad:<n>`` and counted in
the tail, and the stream's entries themselves are never changed (kept); under the stream's
``order=reject`` the first such entry fails the query instead.

Guarantees, and where Redis differs from the embedded log:

* an append (a run) is one Lua script: atomic (all entries or none) and fenced by the lock
  token, so a writer whose lease was lost cannot append; it is idempotent, so a retry after a
  lost reply does not append twice;
* *durable when the call returns* holds as far as the server's persistence promises it: with
  ``appendonly yes`` and ``appendfsync always`` an acknowledged run survives a server crash;
  with ``everysec`` (Redis' default) up to one second can be lost on a machine crash;
* one writer per partition holds a lease (default 10 s, renewed every ``lease / 4``): when the
  holder's process dies its lock expires after at most the lease, not at once as with flock;
* implicit rowtimes of own streams are the writer's clock (as for the embedded log, in
  microseconds); entry IDs carry the server's time at commit, in milliseconds.

Modules: ``location`` (URLs, settings, redaction), ``connection`` (one client per
location and process), ``scripts`` (the Lua scripts), ``records`` (index members,
summaries, Arrow blobs), ``stream`` (reading), ``appender`` (the lease and appends),
``external`` (streams others write), ``trim`` (retention), ``create`` (creating
and opening), ``sink`` (the sink's state of a target here), ``backend`` (``BACKEND``,
found through the ``pyspark_rowtime.backends`` entry points ``redis`` and ``rediss``).
Importing this package does not import the Redis client: that happens at the first connection.
"""

from __future__ import annotations

from .backend import BACKEND, SCHEMES
from .create import create_redis_stream, open_redis_stream, register_external

__all__ = ["BACKEND", "SCHEMES", "create_redis_stream", "open_redis_stream", "register_external"]

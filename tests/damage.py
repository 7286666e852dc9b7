"""Damage as a disk, a store or a server's memory might do it: one byte of a stored value
changed, on every backend (the embedded log's files, S3 and Azure objects, Redis entries), for
the tests that prove reads refuse it (tests/test_storage_contract.py, integration/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark_rowtime.streams.storage import open_stream

__all__ = ["flip_stored"]


def flip_stored(url: str, needle: bytes) -> str:
    """Flip one bit of a byte inside the first stored unit of partition 0 that holds ``needle``
    (a payload value), as a disk, a store or a server's memory might: ``x`` becomes ``X``, still
    a valid string. Returns the unit as errors name it (a path, an object key, an entry ID)."""
    s: Any = open_stream(url)

    def flipped(data: bytes) -> bytes:
        at = data.index(needle) + 1
        return data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1 :]

    if url.startswith("redis"):
        # Stream entries cannot be changed in place: the key is written again, every entry
        # under its own ID, one of them damaged.
        client, key = s.conn.client, s.source(0)
        entries = client.xrange(key)
        hit = next(eid for eid, fields in entries if needle in fields[b"a"])
        client.delete(key)
        for eid, fields in entries:
            client.xadd(
                key, {**fields, b"a": flipped(fields[b"a"])} if eid == hit else fields, id=eid
            )
        return hit.decode()
    if url.startswith(("s3", "az")):
        import obstore

        listed = obstore.list(s.store, prefix=s.loc.key("partition-0000", "segments"))
        for meta in [m for chunk in listed for m in chunk]:
            data = bytes(obstore.get(s.store, meta["path"]).bytes())
            if needle in data:
                obstore.put(s.store, meta["path"], flipped(data))
                return str(meta["path"])
        raise AssertionError(f"no segment object holds {needle!r}")
    folder = Path(url) / "partition-0000"
    for path in sorted(folder.glob("*.arrow")):
        data = path.read_bytes()
        if needle in data:
            path.write_bytes(flipped(data))
            return str(path)
    raise AssertionError(f"no segment file holds {needle!r}")


def flip_staged(store: Any, handle: str, needle: bytes) -> None:
    """Flip one bit inside the sink's staged run ``handle`` of ``store`` (a sink state of any
    backend: a file, an object, a Redis hash field) where ``needle`` occurs."""

    def flipped(data: bytes) -> bytes:
        at = data.index(needle) + 1
        return data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1 :]

    if hasattr(store, "_path"):  # a folder
        path = Path(store._path(handle))
        path.write_bytes(flipped(path.read_bytes()))
        return
    data = flipped(store._blob(handle))
    if hasattr(store, "_staged_key"):  # object storage
        import obstore

        from pyspark_rowtime.streams.objstore.location import store_for

        obstore.put(store_for(store.loc), store._staged_key(handle), data)
        return
    store._call("damaging a staged run", lambda c: c.hset(*store._split(handle), data))

"""Files below an object storage location, for the sink's Parquet target
(``sink_state.TargetFiles``).

A Parquet target on object storage keeps the local layout (``rowtime_hour=.../part-*.parquet``,
``_COMPLETE`` markers, ``_rowtime_sink/``), with the object store's own operations where a
folder has rename, link and flock:

* a staged file is written by a multipart upload (obstore's buffered writer), which the store
  makes visible only when it completes: a task killed mid-write leaves no object, only an
  incomplete upload that the bucket's lifecycle rule for incomplete uploads removes;
* publishing a staged file is a server-side copy to its final name (no byte passes through the
  driver), checked by size afterwards (Azure may finish a copy asynchronously); the staged
  object is removed once its batch is wholly applied;
* write-once documents (``_COMPLETE``) are created with ``If-None-Match: *``, and the clock
  document moves by compare-and-swap on its etag, so a late writer never moves it back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from ...bounds.errors import CorruptLogError
from .location import (
    WRITER_PART_BYTES,
    ObjectLocation,
    call,
    create_if_absent,
    delete_objects,
    get_whole,
    parse_location,
    require_conditional_writes,
    store_for,
    writer_store_for,
)

__all__ = ["ObjectTargetFiles"]

#: How long a published copy may take to show its full size (Azure copies asynchronously when
#: it chooses to) before the commit gives up and says so.
COPY_WAIT_S = 120.0
#: Parts of a staged file's multipart upload (S3's minimum part is 5 MiB).
PART_BYTES = WRITER_PART_BYTES
_CAS_ATTEMPTS = 16


class _Output:
    """A write-only binary file over obstore's buffered writer, as pyarrow's ``PythonFile``
    wants it. ``flush`` does nothing: a part is uploaded when the buffer fills (an early flush
    would upload a part below S3's minimum size); ``finish`` completes the upload."""

    def __init__(self, writer: Any) -> None:
        self._w = writer
        self._pos = 0
        self.closed = False

    def write(self, data: Any) -> int:
        n = self._w.write(data)
        self._pos += n
        return int(n)

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        """pyarrow closes the file it was given when its writer closes: that is no commit of
        the object yet (``finish`` is)."""

    def finish(self) -> None:
        if not self.closed:
            self.closed = True
            self._w.close()


class ObjectTargetFiles:
    """The objects below one location (module docstring). Picklable: the client is made on
    first use in each process."""

    def __init__(self, resolved: str) -> None:
        self.loc: ObjectLocation = parse_location(resolved)
        self.location = str(self.loc)

    def __repr__(self) -> str:
        return f"ObjectTargetFiles({self.location!r})"

    def _key(self, name: str) -> str:
        return self.loc.key(*name.strip("/").split("/"))

    # -- staged files --

    def open_output(self, name: str) -> _Output:
        import obstore

        key = self._key(name)
        writer = call(
            self.loc,
            f"starting the upload of {name}",
            lambda: obstore.open_writer(writer_store_for(self.loc), key, buffer_size=PART_BYTES),
        )
        return _Output(writer)

    def close_output(self, out: Any, name: str) -> None:
        # not repeated: the writer completes its upload once (its parts are obstore's to retry)
        call(self.loc, f"completing the upload of {name}", out.finish, retry=False)

    def publish(self, src: str, dst: str) -> bool:
        import obstore

        store = store_for(self.loc)
        src_key, dst_key = self._key(src), self._key(dst)
        try:
            size = call(self.loc, f"reading {src}", lambda: obstore.head(store, src_key))["size"]
        except FileNotFoundError:  # applied and cleaned before, or lost
            return self.exists(dst)
        if self._size(dst_key) == size:
            return True  # a repeat (a replayed commit)
        try:
            call(
                self.loc,
                f"publishing {src} as {dst}",
                lambda: obstore.copy(store_for(self.loc), src_key, dst_key),
                writes=size,
            )
        except FileNotFoundError:  # cleaned by a racing commit that published it
            return self.exists(dst)
        deadline = time.monotonic() + COPY_WAIT_S
        delay = 0.05
        while self._size(dst_key) != size:
            if time.monotonic() > deadline:
                raise CorruptLogError(
                    f"{self.location}: the copy of {src} to {dst} did not complete within "
                    f"{COPY_WAIT_S:g} s; the commit is retried when the query restarts"
                )
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
        return True

    def _size(self, key: str) -> int | None:
        import obstore

        try:
            meta = call(
                self.loc, "reading an object's size", lambda: obstore.head(store_for(self.loc), key)
            )
        except FileNotFoundError:
            return None
        return int(meta["size"])

    def exists(self, name: str) -> bool:
        return self._size(self._key(name)) is not None

    # -- small documents --

    def create_json(self, name: str, doc: Any) -> bool:
        text = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
        return create_if_absent(self.loc, self._key(name), text, f"creating {name}")

    def _fetch(self, name: str) -> tuple[bytes, str | None] | None:
        """The bytes at ``name`` and their etag, or None."""
        try:
            raw, meta = call(
                self.loc,
                f"reading {name}",
                lambda: get_whole(store_for(self.loc), self._key(name)),
            )
        except FileNotFoundError:
            return None
        return raw, meta.get("e_tag")

    def _get(self, name: str) -> tuple[Any | None, str | None]:
        got = self._fetch(name)
        if got is None:
            return None, None
        try:
            return json.loads(got[0]), got[1]
        except ValueError as e:
            raise CorruptLogError(f"{self.location}/{name} cannot be read ({e})") from e

    def read_json(self, name: str) -> Any | None:
        return self._get(name)[0]

    def read_text(self, name: str) -> str | None:
        got = self._fetch(name)
        return None if got is None else got[0].decode("utf-8", "replace")

    def read_bytes(self, name: str) -> bytes | None:
        got = self._fetch(name)
        return None if got is None else got[0]

    def advance_json(self, name: str, doc: Any, newer: Callable[[Any | None], bool]) -> None:
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        require_conditional_writes(self.loc)
        text = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
        key = self._key(name)
        for _ in range(_CAS_ATTEMPTS):
            current, etag = self._get(name)
            if not newer(current):
                return
            mode: Any = "create" if etag is None else {"e_tag": etag}
            try:
                call(
                    self.loc,
                    f"writing {name}",
                    lambda mode=mode: obstore.put(store_for(self.loc), key, text, mode=mode),  # type: ignore[misc]
                )
                return
            except (AlreadyExistsError, PreconditionError):
                continue  # changed meanwhile (or our own put, reported as a conflict): look again
        raise CorruptLogError(
            f"{self.location}/{name}: other writers keep changing it; is a second query "
            "committing to this target?"
        )

    # -- listing and removing --

    def list(self, prefix: str) -> list[str]:
        import obstore

        base = self.loc.prefix + "/"
        where = self._key(prefix) + "/" if prefix.strip("/") else base
        return call(
            self.loc,
            f"listing {prefix or 'the target'}",
            lambda: sorted(
                m["path"][len(base) :]
                for chunk in obstore.list(store_for(self.loc), where)
                for m in chunk
            ),
        )

    def remove(self, names: Sequence[str]) -> None:
        keys = [self._key(n) for n in names]
        delete_objects(self.loc, store_for(self.loc), keys, "removing objects")

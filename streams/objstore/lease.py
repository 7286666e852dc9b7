"""The one writer of a partition on object storage: a lease object updated by compare-and-swap.

``partition-NNNN/_lease.json`` holds ``{"owner", "holder", "epoch", "expires_us"}``: the holding
writer's random token, its ``host:pid`` (for people), an epoch that grows by one at every
acquisition, and when the lease ends (the holder's wall clock, microseconds). Every change is a
conditional put: create-if-absent for the first writer ever, else compare-and-swap on the etag
read (``If-Match``), so of two writers racing for a partition exactly one changes it.

* A lease whose owner is set and whose expiry lies ahead is held: a second writer is refused
  with ``WriterLockedError`` naming the holder and when the lease ends.
* The holder renews it every ``lease_s / 4`` (a daemon thread, compare-and-swap on its own
  etag). A holder whose renewal finds another owner knows it lost the partition.
* A released lease keeps its epoch with no owner; an expired one is taken over by the next
  writer, which bumps the epoch.

The lease decides who *may* write; it does not make a frozen writer's late commit harmless: the
commit sequence does (``.log``): a new holder's first act is a commit of its epoch, which takes
the sequence number a fenced writer would need next.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from typing import Any

from ...bounds.errors import OptionError, WriterLockedError
from .location import ObjectLocation, call, get_whole, require_conditional_writes

__all__ = ["DEFAULT_LEASE_S", "LEASE_ENV", "Lease", "lease_seconds"]

#: How long a writer's lease lasts without renewal (renewed every quarter of it).
DEFAULT_LEASE_S = 30.0
#: The environment variable that changes it for a process (seconds; writers read it at lock).
LEASE_ENV = "ROWTIME_LEASE_S"
_ATTEMPTS = 8


def lease_seconds(given: float | None = None) -> float:
    """The lease length: ``given``, else ``$ROWTIME_LEASE_S``, else ``DEFAULT_LEASE_S``."""
    if given is not None:
        return max(float(given), 0.2)
    raw = os.environ.get(LEASE_ENV)
    if raw:
        try:
            return max(float(raw), 0.2)
        except ValueError:
            raise OptionError(
                f"{LEASE_ENV}={raw!r} is not a number of seconds (such as 30)"
            ) from None
    return DEFAULT_LEASE_S


def _now_us() -> int:
    return time.time_ns() // 1000


class Lease:
    """A partition's lease as one writer holds it (``acquire`` first)."""

    def __init__(self, store: Any, loc: ObjectLocation, key: str, where: str, lease_s: float):
        self.store = store
        self.loc = loc
        self.key = key
        self.where = where
        self.lease_s = lease_s
        self.token = uuid.uuid4().hex
        self.holder = f"{socket.gethostname()}:{os.getpid()}"
        self.epoch = 0
        self.lost = False
        self._etag: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()

    def _read(self) -> tuple[dict[str, Any] | None, str | None]:
        try:
            raw, meta = call(
                self.loc,
                f"reading the lease of {self.where}",
                lambda: get_whole(self.store, self.key),
            )
        except FileNotFoundError:  # obstore's not found
            return None, None
        doc = json.loads(raw)
        return doc, meta["e_tag"]

    def _put(self, doc: dict[str, Any], etag: str | None) -> str:
        import obstore

        mode: Any = "create" if etag is None else {"e_tag": etag}
        result = call(
            self.loc,
            f"writing the lease of {self.where}",
            lambda: obstore.put(self.store, self.key, json.dumps(doc).encode(), mode=mode),
        )
        return str(result["e_tag"])

    def _doc(self, epoch: int, owned: bool = True) -> dict[str, Any]:
        return {
            "v": 1,
            "owner": self.token if owned else None,
            "holder": self.holder if owned else None,
            "epoch": epoch,
            "expires_us": _now_us() + int(self.lease_s * 1e6) if owned else 0,
        }

    def acquire(self) -> int:
        """Take the lease (a new epoch) or raise ``WriterLockedError``; returns the
        epoch. Starts the renewing thread."""
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        require_conditional_writes(self.loc)
        for _ in range(_ATTEMPTS):
            doc, etag = self._read()
            if doc is not None and doc.get("owner") and int(doc.get("expires_us", 0)) > _now_us():
                left = (int(doc["expires_us"]) - _now_us()) / 1e6
                raise WriterLockedError(
                    f"{self.where} is being written by another writer (host:pid "
                    f"{doc.get('holder')}); one writer per partition. Close that writer, or "
                    f"wait: its lease ends within {max(left, 0):.1f} s if its process died"
                )
            epoch = int(doc.get("epoch", 0)) + 1 if doc is not None else 1
            try:
                self._etag = self._put(self._doc(epoch), etag)
            except (AlreadyExistsError, PreconditionError):
                # Lost a race, or (S3's retryable 409 read as "exists") won it: look again.
                again, again_etag = self._read()
                if again is not None and again.get("owner") == self.token:
                    self._etag = again_etag
                else:
                    continue
            self.epoch = epoch
            self._thread = threading.Thread(
                target=self._renew_loop, name=f"rowtime-lease-{self.key}", daemon=True
            )
            self._thread.start()
            return epoch
        raise WriterLockedError(
            f"{self.where}: other writers keep taking the partition's lease; try again"
        )

    def renew(self) -> bool:
        """Extend the lease; False (and ``lost``) when another writer holds it now."""
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        with self._mutex:
            if self.lost or self._stop.is_set():
                return not self.lost
            try:
                self._etag = self._put(self._doc(self.epoch), self._etag)
                return True
            except (PreconditionError, AlreadyExistsError, FileNotFoundError):
                doc, etag = self._read()
                if doc is not None and doc.get("owner") == self.token:
                    if doc.get("epoch") == self.epoch:
                        self._etag = etag  # our write went through; its answer was lost
                        return True
                self.lost = True
                return False

    def _renew_loop(self) -> None:
        period = self.lease_s / 4
        while not self._stop.wait(period):
            try:
                if not self.renew():
                    return
            except Exception:
                continue  # the store is away: the next commit says so; try again

    def stop_renewing(self) -> None:
        """Stop the renewing thread (tests freeze a writer with it; the lease then expires)."""
        self._stop.set()

    def release(self) -> None:
        """Give the lease up, keeping its epoch (idempotent). A dead holder's lease expires."""
        if self._stop.is_set() and self._etag is None:
            return
        self._stop.set()
        with self._mutex:
            etag, self._etag = self._etag, None
            if etag is None or self.lost:
                return
            try:
                self._put(self._doc(self.epoch, owned=False), etag)
            except Exception:
                pass  # taken over meanwhile, or the store is away: it expires on its own

"""One writer per partition: an ``fcntl.flock`` on a lock file in the partition's folder.

``flock`` belongs to the open file, so the kernel releases it when the holder dies however it
dies (SIGKILL included): there is never a stale lock to clean up, and the next writer takes over
at once. Two writers in one process are refused as well (each opens the file anew). The file
holds the holder's pid, for the error message only.

Caveats: a child forked while a writer is open inherits the lock until it exits or closes the
descriptor; ``flock`` is not reliable on network filesystems (NFS), where the log is not safe for
several writers anyway.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Callable
from typing import TypeVar

from ..bounds.errors import CorruptLogError, SinkBusyError, WriterLockedError

LOCK_FILE = "_writer.lock"


class PartitionLock:
    """An exclusive, non-blocking lock on a partition; freed by ``release`` or on exit."""

    __slots__ = ("_fd", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, what: str) -> None:
        """Take the lock or raise ``WriterLockedError`` naming ``what`` and the holder."""
        try:
            # O_NOFOLLOW: a link planted in the folder must not make us truncate its target.
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            # Readable no wider than its folder (see streams.meta.narrow_mode).
            mode = 0o644 & os.stat(os.path.dirname(self.path) or ".").st_mode
            fd = os.open(self.path, flags, mode)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise CorruptLogError(
                f"{self.path} is a symbolic link: this project never makes one, so someone put "
                f"it there; remove it (the lock of {what} is a plain file)"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"process {holder}" if holder else "another writer (pid not yet recorded)"
            if holder == os.getpid():
                who = f"another writer in this process ({holder})"
            raise WriterLockedError(
                f"{what} already has a writer: {who} holds {self.path}. One writer per partition "
                "at a time: close the other writer, wait for it to exit, or write to another "
                "partition"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __del__(self) -> None:
        self.release()

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            # The pid is left in the file: harmless, the next holder overwrites it.
            os.close(fd)  # closing the last descriptor releases the flock


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


#: How long a commit waits for another process's commit on the same target to finish. After a
#: driver is killed, the Python worker running its commit lives on for a moment (PySpark's
#: daemon stops its workers only when it notices the JVM is gone), so the restarted driver's
#: replay of that batch waits for it instead of racing it.
COMMIT_WAIT_S = 300.0

T = TypeVar("T")


def wait_for_lock(acquire: Callable[[], T], timeout_s: float = COMMIT_WAIT_S) -> T:
    """Call ``acquire`` until it stops raising ``WriterLockedError``; when ``timeout_s``
    runs out first, raise ``SinkBusyError`` (another commit still holds the target)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while True:
        try:
            return acquire()
        except WriterLockedError as e:
            if time.monotonic() >= deadline:
                raise SinkBusyError(
                    f"another commit to this sink target is still running after "
                    f"{timeout_s:g} s ({e}); if its query was stopped, wait for its process to "
                    "exit and restart this query"
                ) from e
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

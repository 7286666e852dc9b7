"""Where the sink keeps its own state beside a target, and how it writes it safely.

Both kinds of target (a rowtime stream, a Parquet folder) get a folder ``_rowtime_sink/``::

    <target>/_rowtime_sink/target.json     what the target is (kind, schema, granularity); once
    <target>/_rowtime_sink/owner.json      the Spark query (its id) that writes here; once
    <target>/_rowtime_sink/manifest/00000000000000000042.json   one entry per committed batch
    <target>/_rowtime_sink/staging/00000000000000000042/...     files write() staged for batch 42
    <target>/_rowtime_sink/clock.json      Parquet targets: the clock of the last applied entry
    <target>/_rowtime_sink/commit.lock     Parquet targets: one commit at a time (a flock)

The leading underscore keeps Spark, pyarrow datasets and Hive from reading any of it as data.
Every file is written to a temporary name, fsync'd and then linked (write-once files: of two
writers exactly one wins) or renamed (files that are replaced) into place, and the folder is
fsync'd: a reader sees the old file or the new one, never half of one, and after a crash
(SIGKILL or power loss) what was acknowledged is still there.

A backend that keeps streams away from this machine keeps a stream target's state itself
(``open_sink_state`` asks ``streams.sink_state.backend_sink_state``; Redis keeps it
in keys of the stream's namespace), with the same operations
(``streams.sink_state.SinkState``).

Only the latest batches can be replayed by Spark (a restart re-runs the last batch whose commit
Spark had not logged), so the manifest keeps the last ``MANIFEST_KEEP`` entries.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import pyarrow as pa

from ..bounds.errors import CorruptLogError
from ..streams.lock import (  # wait_for_lock: used here, and by stream_target
    PartitionLock,
    wait_for_lock,
)
from ..streams.meta import fsync_dir, fsync_file, make_dirs, narrow_mode
from ..streams.segments import (
    SegmentStats,
    open_verified_segment,
    write_segment_file,
    write_segment_to,
)
from ..streams.sink_state import SINK_DIR as STORAGE_SINK_DIR
from ..streams.sink_state import (
    SINK_FORMAT,
    SINK_FORMAT_VERSION,
    SINK_TARGET_FILE,
    RunChunks,
    SinkState,
    Staged,
    backend_sink_state,
    check_sink_version,
    claim_target,
    define_target_once,
    latest_entry,
)

# The folder and the file that say what a target is are defined below the sink, in
# streams.storage, whose what_is_at() reads them for the reader and the CLI too.
SINK_DIR = STORAGE_SINK_DIR
TARGET_FILE = SINK_TARGET_FILE
OWNER_FILE = "owner.json"
CLOCK_FILE = "clock.json"
MANIFEST_DIR = "manifest"
STAGING_DIR = "staging"
FORMAT = SINK_FORMAT
FORMAT_VERSION = SINK_FORMAT_VERSION

#: Manifest entries kept; older ones can never be replayed by Spark.
MANIFEST_KEEP = 100

_ENTRY_RE = re.compile(r"(\d{20})\.json\Z")
_TMP = ".tmp."


def batch_name(batch_id: int) -> str:
    """The zero-padded form of a batch id used in file and folder names (sorts by number)."""
    return f"{batch_id:020d}"


def _tmp_path(folder: str, name: str) -> str:
    return os.path.join(folder, f"{_TMP}{name}.{os.getpid()}.{uuid.uuid4().hex}")


def _write_tmp(folder: str, name: str, doc: Any) -> str:
    tmp = _tmp_path(folder, name)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    narrow_mode(tmp, folder)  # no more readable than its folder, whatever the umask
    return tmp


def write_json_once(path: str, doc: Any) -> bool:
    """Create ``path`` holding ``doc`` unless it exists; True if this call created it.

    The file appears whole or not at all, and ``link`` fails if the name exists, so of two
    concurrent writers exactly one wins and a committed file is never overwritten.
    """
    folder, name = os.path.split(path)
    tmp = _write_tmp(folder, name, doc)
    try:
        os.link(tmp, path)
        created = True
    except FileExistsError:
        created = False
    finally:
        os.unlink(tmp)
    if created:
        fsync_dir(folder)
    return created


def replace_json(path: str, doc: Any) -> None:
    """Atomically replace (or create) ``path`` with ``doc``."""
    folder, name = os.path.split(path)
    tmp = _write_tmp(folder, name, doc)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    fsync_dir(folder)


check_target_version = check_sink_version  # the name parquet targets and 0.2.0 used


def read_json(path: str) -> Any | None:
    """The document at ``path``, or None if there is no such file."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return json.loads(text)
    except ValueError as e:
        raise CorruptLogError(f"sink file {path} cannot be read ({e}): it was damaged") from e


class FolderSinkState:
    """The ``_rowtime_sink`` folder of one target."""

    def __init__(self, target_location: str) -> None:
        self.target = target_location
        self.root = os.path.join(target_location, SINK_DIR)
        self.manifest_dir = os.path.join(self.root, MANIFEST_DIR)
        self.staging_dir = os.path.join(self.root, STAGING_DIR)

    def __repr__(self) -> str:
        return f"FolderSinkState({self.target!r})"

    def ensure(self) -> None:
        """Create the folders (idempotent)."""
        for d in (self.root, self.manifest_dir, self.staging_dir):
            make_dirs(d)  # each no wider than the folder holding it (the target's at the top)

    @contextmanager
    def commit_lock(self) -> Iterator[None]:
        """Hold the target's commit lock (a flock: it dies with its process)."""
        self.ensure()
        lock = PartitionLock(os.path.join(self.root, "commit.lock"))
        wait_for_lock(lambda: lock.acquire(f"the sink target {self.target}"))
        try:
            yield
        finally:
            lock.release()

    # -- what the target is --

    @property
    def target_file(self) -> str:
        return os.path.join(self.root, TARGET_FILE)

    def read_target(self) -> dict[str, Any] | None:
        return check_target_version(read_json(self.target_file), self.target_file)

    def define_target(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Record what the target is, once; returns the recorded description (which may be an
        earlier one: the caller compares)."""
        self.ensure()
        return define_target_once(doc, partial(write_json_once, self.target_file), self.read_target)

    # -- who writes it --

    def claim(self, query_id: str | None) -> None:
        """Make sure this target belongs to the Spark query ``query_id``
        (``claim_target``)."""
        path = os.path.join(self.root, OWNER_FILE)

        def claim(doc: dict[str, Any]) -> Any:
            owner = read_json(path)
            if owner is None:
                self.ensure()
                write_json_once(path, doc)
                owner = read_json(path)
            return owner

        claim_target(self.target, query_id, claim)

    # -- the manifest --

    def entry_path(self, batch_id: int) -> str:
        return os.path.join(self.manifest_dir, batch_name(batch_id) + ".json")

    def batches(self) -> list[int]:
        """Batch ids with a manifest entry, ascending."""
        try:
            names = os.listdir(self.manifest_dir)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            m = _ENTRY_RE.match(name)
            if m:
                out.append(int(m.group(1)))
        out.sort()
        return out

    def entry(self, batch_id: int) -> dict[str, Any] | None:
        return read_json(self.entry_path(batch_id))

    def latest(self, before: int | None = None) -> dict[str, Any] | None:
        """The entry of the highest batch id (below ``before`` if given), or None."""
        return latest_entry(self, before)

    def put_entry_once(self, batch_id: int, doc: dict[str, Any]) -> bool:
        """Publish the entry of ``batch_id`` (the commit point); False if it already exists."""
        self.ensure()
        return write_json_once(self.entry_path(batch_id), doc)

    def replace_entry(self, batch_id: int, doc: dict[str, Any]) -> None:
        self.ensure()
        replace_json(self.entry_path(batch_id), doc)

    def prune(self, keep: int = MANIFEST_KEEP) -> None:
        """Remove all but the last ``keep`` entries (no replay can reach them)."""
        ids = self.batches()
        for batch_id in ids[: max(0, len(ids) - keep)]:
            try:
                os.unlink(self.entry_path(batch_id))
            except FileNotFoundError:
                pass

    # -- staging --

    def batch_staging(self, batch_id: int) -> str:
        return os.path.join(self.staging_dir, batch_name(batch_id))

    def stage_segment(
        self,
        batch_id: int,
        name: str,
        stats: SegmentStats,
        schema: pa.Schema,
        chunks: RunChunks,
        *,
        lazy: bool = False,
    ) -> Staged:
        """Stage a run as a segment file (handle: its path relative to the target); the file
        is written unsynced and the returned function fsyncs it, so that the disk catches up
        while the task goes on receiving rows.

        ``lazy``: the run is for the commit's merge, which writes its rows again (a partition
        that several tasks share, ``sink.merge``): it is written without asking the disk to
        start writing it back, so that it need never reach the disk at all, and a commit that
        links it instead makes it durable first (``sync_staged``)."""
        rel = os.path.join(SINK_DIR, STAGING_DIR, batch_name(batch_id), name)
        path = os.path.join(self.target, rel)
        make_dirs(os.path.dirname(path))
        try:
            if lazy:
                with pa.OSFile(path, "wb") as sink:
                    write_segment_to(sink, stats, schema, chunks)
            else:
                write_segment_file(path, stats, schema, chunks, sync=False)
            # Linked into the partition as it is (same inode): narrowed once, here.
            narrow_mode(path, os.path.dirname(path))
        except BaseException:
            self.discard_staged([rel])  # no half-written file is left behind
            raise
        return rel, partial(fsync_file, path)

    def sync_staged(self, handles: Sequence[str]) -> None:
        """Make staged runs that were staged ``lazy`` durable (their folders too)."""
        for h in handles:
            fsync_file(self._path(h))
        for folder in sorted({os.path.dirname(self._path(h)) for h in handles}):
            fsync_dir(folder)

    def _path(self, handle: str) -> str:
        return os.path.join(self.target, handle)

    def missing_staged(self, handles: Sequence[str]) -> list[str]:
        return [h for h in handles if not os.path.exists(self._path(h))]

    def open_staged(self, handle: str) -> pa.Table:
        # Checked first: its records are written again, under fresh checksums.
        return open_verified_segment(self._path(handle))

    def append_staged(self, appender: Any, handles: Sequence[str]) -> None:
        """Link the staged files into the partition (no record is copied or read)."""
        appender.append_segment_files([self._path(h) for h in handles], verify=False)

    def discard_staged(self, handles: Sequence[str]) -> None:
        for h in handles:
            try:
                os.unlink(self._path(h))
            except FileNotFoundError:
                pass

    def drop_staging(self, batch_id: int) -> None:
        shutil.rmtree(self.batch_staging(batch_id), ignore_errors=True)

    def staged(self) -> list[str]:
        out = []
        for folder, _dirs, files in os.walk(self.staging_dir):
            out += [os.path.relpath(os.path.join(folder, f), self.target) for f in files]
        return sorted(out)

    def clean_staging(self, up_to: int) -> None:
        """Remove what was staged for batches ``<= up_to`` (published, aborted or orphaned by a
        failed task attempt), and temporary files of this folder."""
        try:
            names = os.listdir(self.staging_dir)
        except FileNotFoundError:
            return
        for name in names:
            if name.isdigit() and int(name) <= up_to:
                shutil.rmtree(os.path.join(self.staging_dir, name), ignore_errors=True)
        for folder in (self.root, self.manifest_dir):
            try:
                leftovers = [n for n in os.listdir(folder) if n.startswith(_TMP)]
            except FileNotFoundError:
                continue
            for name in leftovers:
                try:
                    os.unlink(os.path.join(folder, name))
                except FileNotFoundError:
                    pass


def open_sink_state(location: str) -> SinkState:
    """The state store of the stream target at ``location``: its backend's own when it keeps
    one (Redis keeps it with the stream), else the ``_rowtime_sink`` folder beside the target."""
    return backend_sink_state(location) or FolderSinkState(location)

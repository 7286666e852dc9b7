"""A Parquet target: files partitioned by rowtime, published exactly once, with a clock.

Layout (``granularity`` hour here)::

    <path>/rowtime_hour=2024-05-01T10/part-00000000000000000007-00001-0-1a2b3c4d5e6f.parquet
    <path>/rowtime_hour=2024-05-01T10/_COMPLETE     the hour is complete (written once, JSON)
    <path>/_rowtime_sink/...                        manifest, staging, clock (sink.layout)

Partition folders are Hive-style, so ``spark.read.parquet(path)`` gets a ``rowtime_hour``
column (``rowtime_day=YYYY-MM-DD``, ``rowtime_hour=YYYY-MM-DDTHH``, ``rowtime_minute=
YYYY-MM-DDTHHMM``, all UTC); files keep the payload columns and ``rowtime``. Names that start
with ``_`` are not data to Spark or pyarrow.

**Two-phase commit.** ``write()`` (executors) stages Parquet files under
``_rowtime_sink/staging/<batch>/<task>-<attempt>-<uuid>/``, fsync'd, and reports them.
``commit()`` (driver, another process) publishes them, holding the target's commit lock (after
a driver is killed its commit runner may live on for a moment; the replay waits for it):

1. finish the latest manifest entry if a crash interrupted it (roll forward);
2. if the batch already has an entry, stop: a replayed batch is a no-op;
3. compute the new clock ``T(b)`` (``sink.clock``) and the partitions it completes;
4. write the manifest entry ``<batch>.json`` (files, clock, completed partitions): **the commit
   point**, atomic and write-once;
5. apply it: rename the staged files to their final names, write the ``_COMPLETE`` markers,
   then ``clock.json``; each step is idempotent, so step 1 can redo it after a crash.

A time partition ``[start, end)`` is complete once ``end <= T(b)``: no row can come for it any
more. Partitions holding data get a ``_COMPLETE`` marker; for empty ones (no folder) the clock
says the same. ``get_rowtime_bound(path)`` reads ``clock.json``, which is written only after
everything it covers is in place.

**Where the files are.** A local folder (``LocalFiles``: rename, hard links, ``flock``,
``fsync``), or a location of a backend that keeps files itself, object storage
(``streams.sink_state.target_files``): there a staged file is a multipart upload, visible only
once complete; publishing is a server-side copy; ``_COMPLETE`` is created with
``If-None-Match: *``; ``clock.json`` moves by compare-and-swap; and the commit lock is a lease
(``_rowtime_sink/commit.lease``). The steps and their order are the same.

This module imports no pyspark.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..bounds.arrays import to_arrow
from ..bounds.errors import CorruptLogError, OptionError, SchemaError
from ..bounds.time import from_rowtime_us
from ..streams.columns import SPARK_ROWTIME
from ..streams.ddl import to_ddl
from ..streams.meta import fsync_dir, fsync_file, make_dirs, narrow_mode
from ..streams.sink_state import SINK_KIND_PARQUET, SinkState, TargetFiles, target_files
from ..streams.storage import LocationKind, what_is_at
from .clock import advance
from .layout import (
    CLOCK_FILE,
    OWNER_FILE,
    SINK_DIR,
    TARGET_FILE,
    batch_name,
    open_sink_state,
    read_json,
    replace_json,
    write_json_once,
)
from .manifest import ParquetEntry, ParquetFile
from .options import GRANULARITY_US, SinkConfig
from .target import stage_task
from .task import StagedFile, TaskInfo, TaskReport, iso, reports_query_id

__all__ = [
    "COMPLETE_MARKER",
    "ParquetTarget",
    "PartitionFiles",
    "is_parquet_target",
    "parquet_clock_us",
    "partition_name",
]

COMPLETE_MARKER = "_COMPLETE"
KIND = SINK_KIND_PARQUET
#: Rows gathered per time partition before a row group is written.
ROW_GROUP_ROWS = 1 << 20
#: A column chunk's dictionary is given up beyond this size. Columns of few distinct values
#: (names, codes: up to ~32K distinct 8-byte values a row group) keep dictionary encoding;
#: unique ids and measurements fall back to plain encoding four times sooner than with
#: Parquet's 1 MiB default, which spends encoding time building dictionaries that are then
#: thrown away (docs/benchmarks.md, "The sink").
DICTIONARY_PAGE_BYTES = 256 << 10


def partition_name(key: int, granularity: str) -> str:
    """The folder of time partition ``key`` (``rowtime // granularity``), Hive-style."""
    t = from_rowtime_us(key * GRANULARITY_US[granularity])
    day = f"{t.year:04d}-{t.month:02d}-{t.day:02d}"
    if granularity == "day":
        value = day
    elif granularity == "hour":
        value = f"{day}T{t.hour:02d}"
    else:
        value = f"{day}T{t.hour:02d}{t.minute:02d}"
    return f"rowtime_{granularity}={value}"


#: The clock document, relative to the target.
CLOCK_NAME = f"{SINK_DIR}/{CLOCK_FILE}"


class LocalFiles:
    """A Parquet target's files in a local folder (``streams.sink_state.TargetFiles``):
    written, ``fsync``'d, renamed and linked into place, so that a crash or power loss keeps
    what a commit acknowledged."""

    def __init__(self, location: str) -> None:
        self.location = location

    def __repr__(self) -> str:
        return f"LocalFiles({self.location!r})"

    def path(self, name: str) -> str:
        return os.path.join(self.location, name)

    def open_output(self, name: str) -> pa.NativeFile:
        path = self.path(name)
        make_dirs(os.path.dirname(path))
        return pa.OSFile(path, "wb")

    def close_output(self, out: Any, name: str) -> None:
        out.close()
        path = self.path(name)
        folder = os.path.dirname(path)
        # Published by a rename, which keeps the mode: no wider than the folder it is in.
        narrow_mode(path, folder)
        fsync_file(path)
        fsync_dir(folder)
        fsync_dir(os.path.dirname(folder))

    def publish(self, src: str, dst: str) -> bool:
        src_path, dst_path = self.path(src), self.path(dst)
        if os.path.exists(dst_path):
            return True
        folder = os.path.dirname(dst_path)
        make_dirs(folder)
        try:
            os.rename(src_path, dst_path)
        except FileNotFoundError:
            return os.path.exists(dst_path)
        fsync_dir(folder)
        return True

    def exists(self, name: str) -> bool:
        return os.path.exists(self.path(name))

    def create_json(self, name: str, doc: Any) -> bool:
        path = self.path(name)
        make_dirs(os.path.dirname(path))
        return write_json_once(path, doc)

    def read_json(self, name: str) -> Any | None:
        return read_json(self.path(name))

    def read_bytes(self, name: str) -> bytes | None:
        try:
            with open(self.path(name), "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def read_text(self, name: str) -> str | None:
        data = self.read_bytes(name)
        return None if data is None else data.decode("utf-8", "replace")

    def advance_json(self, name: str, doc: Any, newer: Callable[[Any | None], bool]) -> None:
        # Only the holder of the target's commit lock (a flock) writes here.
        if newer(self.read_json(name)):
            replace_json(self.path(name), doc)

    def list(self, prefix: str) -> list[str]:
        top = self.path(prefix) if prefix else self.location
        out = []
        for folder, _dirs, files in os.walk(top):
            out += [os.path.relpath(os.path.join(folder, f), self.location) for f in files]
        return sorted(out)

    def remove(self, names: Sequence[str]) -> None:
        for name in names:
            try:
                os.unlink(self.path(name))
            except FileNotFoundError:
                pass

    def remove_folder(self, name: str) -> None:
        shutil.rmtree(self.path(name), ignore_errors=True)


def target_files_at(path: str) -> TargetFiles:
    """The files of a Parquet target at ``path`` (resolved): its backend's (object storage), or
    a local folder."""
    return target_files(path) or LocalFiles(path)


class _ParquetState(SinkState, Protocol):
    """The sink state a Parquet target needs: a stream target's, and one commit at a time."""

    def commit_lock(self) -> AbstractContextManager[None]: ...


def is_parquet_target(path: str) -> bool:
    """Whether ``path`` is a Parquet target of this sink."""
    return what_is_at(path).kind is LocationKind.PARQUET_TARGET


def parquet_clock_us(path: str) -> int | None:
    """The clock of the Parquet target at ``path`` (resolved): None until a batch moves it."""
    doc = target_files_at(path).read_json(CLOCK_NAME)
    if not doc:
        return None
    clock = doc.get("clock_us")
    return None if clock is None else int(clock)


@dataclasses.dataclass(frozen=True)
class WrittenFile:
    """A Parquet file ``PartitionFiles`` wrote and closed: durable, with the footer its
    writer wrote (the statistics a table's commit records come from here, not from reading the
    file back)."""

    key: int
    rel: str
    rows: int
    size: int
    footer: pq.FileMetaData


class PartitionFiles:
    """One task's open Parquet files, one per time partition it has rows for, written as the
    rows arrive: each partition gathers rows until a row group is full (``ROW_GROUP_ROWS``)
    and writes it to its open ``pq.ParquetWriter``, so a task holds at most one row group per
    partition in memory, and encoding overlaps with Spark handing over the next rows.

    Each target says where a partition's file goes (``path``, asked when the partition's
    first row group is written; ``file_name`` names it) and what it does with the closed
    files; a table target may also give the rows another schema before they are written
    (``conform``)."""

    def __init__(self, cfg: SinkConfig, files: TargetFiles, info: TaskInfo) -> None:
        self.cfg = cfg
        self.files = files
        self.info = info
        self.writers: dict[int, pq.ParquetWriter] = {}
        self.outputs: dict[int, Any] = {}
        self.paths: dict[int, str] = {}
        self.pending: dict[int, list[pa.RecordBatch]] = {}
        self.pending_rows: dict[int, int] = {}
        self.rows: dict[int, int] = {}

    def path(self, key: int) -> str:
        """Where time partition ``key``'s file goes, relative to ``files``."""
        raise NotImplementedError

    def file_name(self, key: int) -> str:
        """``<partition folder>/<file>`` for partition ``key``: a name no other task, attempt
        or query uses (batch, task, attempt, a random part)."""
        i = self.info
        return (
            f"{partition_name(key, self.cfg.granularity)}/part-{batch_name(i.batch_id)}-"
            f"{i.task:05d}-{i.attempt}-{uuid.uuid4().hex[:12]}.parquet"
        )

    def conform(self, data: pa.Table) -> pa.Table:
        """The rows as the file stores them (by default as they are)."""
        return data

    def add(self, batch: pa.RecordBatch, rowtime_us: np.ndarray) -> None:
        keys = rowtime_us // self.cfg.granularity_us
        first, last = int(keys[0]), int(keys[-1])
        if first == last and int(keys.min()) == int(keys.max()):
            self._add(first, batch)
            return
        for key in np.unique(keys):
            self._add(int(key), batch.filter(to_arrow(keys == key)))

    def _add(self, key: int, batch: pa.RecordBatch) -> None:
        self.pending.setdefault(key, []).append(batch)
        n = self.pending_rows.get(key, 0) + batch.num_rows
        self.pending_rows[key] = n
        if n >= ROW_GROUP_ROWS:
            self._flush(key)

    def _flush(self, key: int) -> None:
        batches = self.pending.pop(key, [])
        self.pending_rows.pop(key, None)
        if not batches:
            return
        table = self.conform(pa.Table.from_batches(batches))
        writer = self.writers.get(key)
        if writer is None:
            rel = self.path(key)
            codec = None if self.cfg.compression == "none" else self.cfg.compression
            out = self.files.open_output(rel)
            self.outputs[key] = out
            self.paths[key] = rel
            writer = pq.ParquetWriter(
                out,
                table.schema,
                compression=codec,
                dictionary_pagesize_limit=DICTIONARY_PAGE_BYTES,
            )
            self.writers[key] = writer
        writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        self.rows[key] = self.rows.get(key, 0) + table.num_rows

    def finish(self) -> list[WrittenFile]:
        """Write what is left and close every file; each is durable when this returns."""
        for key in list(self.pending):
            self._flush(key)
        done = []
        for key in sorted(self.writers):
            writer, out, rel = self.writers[key], self.outputs[key], self.paths[key]
            writer.close()
            size = int(out.tell())
            self.files.close_output(out, rel)  # durable from here
            footer = writer.writer.metadata  # as written: no one reads the file back
            done.append(WrittenFile(key, rel, self.rows[key], size, footer))
        return done

    def abandon(self) -> None:
        """Close every file without finishing it (the task failed): on object storage an
        unfinished upload never becomes an object; local files stay for the caller to
        remove (``paths``)."""
        for writer in self.writers.values():
            try:
                writer.close()
            except Exception:
                pass
        for out in self.outputs.values():
            try:
                out.close()  # an object store's output finishes only in close_output
            except Exception:
                pass


class _Stager(PartitionFiles):
    """One task's staged Parquet files, one per time partition it has rows for."""

    def __init__(self, target: ParquetTarget, info: TaskInfo) -> None:
        super().__init__(target.cfg, target.files, info)
        self.folder_rel = "/".join(
            (
                SINK_DIR,
                "staging",
                batch_name(info.batch_id),
                f"{info.task:05d}-{info.attempt}-{uuid.uuid4().hex[:12]}",
            )
        )
        self.finals: dict[int, str] = {}

    def path(self, key: int) -> str:
        self.finals[key] = self.file_name(key)
        return f"{self.folder_rel}/{self.finals[key]}"

    def close(self) -> list[StagedFile]:
        return [
            StagedFile(staged=f.rel, rows=f.rows, final=self.finals[f.key], key=f.key)
            for f in self.finish()
        ]

    def discard(self) -> None:
        self.abandon()
        files = self.files
        if isinstance(files, LocalFiles):
            files.remove_folder(self.folder_rel)
            return
        # An object store's unfinished upload never becomes an object; finished ones are
        # removed here, or with the batch's staging when a later batch commits.
        try:
            files.remove(files.list(self.folder_rel))
        except Exception:
            pass


class ParquetTarget:
    """The Parquet target of one query. Holds only picklable configuration."""

    def __init__(self, cfg: SinkConfig) -> None:
        self.cfg = cfg
        self.files = target_files_at(cfg.location)
        state: Any = open_sink_state(cfg.location)
        self.state: _ParquetState = state
        self.where = f"parquet target {cfg.location}"

    # -- driver, when the query starts --------------------------------------------------------

    def prepare(self) -> None:
        """Create the target (or check the existing one matches this query)."""
        cfg = self.cfg
        local = isinstance(self.files, LocalFiles)
        if local and os.path.exists(cfg.location) and not os.path.isdir(cfg.location):
            raise OptionError(f"option path={cfg.location!r}: a file is in the way of a folder")
        kind = what_is_at(cfg.location).kind
        if kind in (LocationKind.STREAM, LocationKind.PENDING_STREAM_TARGET):
            raise OptionError(
                f"option path={cfg.location!r} is a rowtime stream; target=parquet writes a "
                "folder of Parquet files: choose another path, or write to the stream with "
                "target=stream"
            )

        schema = pa.schema([*self.cfg.payload_schema, self.cfg.schema.field(SPARK_ROWTIME)])
        want = {"kind": KIND, "granularity": cfg.granularity, "schema": to_ddl(_utc(schema))}
        have = self.state.define_target(want)
        for key in ("kind", "granularity", "schema"):
            if have.get(key) != want[key]:
                raise (SchemaError if key == "schema" else OptionError)(
                    f"{self.where} was created with {key} {have.get(key)!r}, and this query "
                    f"has {want[key]!r}; a target keeps its {key}: write to another path"
                )

    # -- executors ----------------------------------------------------------------------------

    def write(self, info: TaskInfo, batches: Iterable[pa.RecordBatch]) -> TaskReport:
        """Stage this task's rows as Parquet files, one per time partition it has rows for;
        nothing for a batch already committed (a replay)."""

        def begin() -> tuple[int | None, _Stager]:
            latest = self.state.latest(before=info.batch_id)
            floor = None if latest is None else latest.get("clock_us")
            return floor, _Stager(self, info)

        report, _ = stage_task(self, info, batches, begin)
        return report

    # -- driver, per batch --------------------------------------------------------------------

    def commit(
        self, reports: Sequence[TaskReport], batch_id: int, candidate_us: int | None
    ) -> ParquetEntry | None:
        """Publish batch ``batch_id`` exactly once; returns its manifest entry (None when the
        batch changed nothing). ``candidate_us`` is the clock the batch would move to."""
        with self.state.commit_lock():  # one commit at a time, even a dying driver's
            return self._commit(reports, batch_id, candidate_us)

    def _commit(
        self, reports: Sequence[TaskReport], batch_id: int, candidate_us: int | None
    ) -> ParquetEntry | None:
        state = self.state
        self.roll_forward()
        done = state.entry(batch_id)
        if done is not None:
            state.clean_staging(batch_id)
            return ParquetEntry.from_dict(done)
        latest = state.latest(before=batch_id)
        previous = None if latest is None else ParquetEntry.from_dict(latest)
        prev_clock = None if previous is None else previous.clock_us
        clock = advance(prev_clock, candidate_us)
        files = [f for r in reports for f in r.files]
        open_keys = set(previous.open) if previous else set()
        open_keys |= {f.key for f in files if f.key is not None}
        gran = self.cfg.granularity_us
        complete = sorted(k for k in open_keys if clock is not None and (k + 1) * gran <= clock)
        still_open = sorted(open_keys.difference(complete))
        if not files and clock == prev_clock:
            state.clean_staging(batch_id)  # nothing to record: a replay recomputes the same
            return None
        entry = ParquetEntry(
            batch=batch_id,
            query_id=reports_query_id(reports),
            clock_us=clock,
            clock=iso(clock),
            previous_clock_us=prev_clock,
            rows=sum(f.rows for f in files),
            files=tuple(_published(f) for f in files),
            complete=tuple(complete),
            open=tuple(still_open),
        )
        if not state.put_entry_once(batch_id, entry.to_dict()):
            existing = state.entry(batch_id)  # committed concurrently: finish theirs
            assert existing is not None
            entry = ParquetEntry.from_dict(existing)
        self.apply(entry)
        state.prune()
        state.clean_staging(batch_id)
        return entry

    def abort(self, reports: Sequence[TaskReport | None], batch_id: int) -> None:
        """Remove what the batch staged, unless it was committed after all."""
        with self.state.commit_lock():
            if self.state.entry(batch_id) is None:
                self.files.remove([f.staged for r in reports if r is not None for f in r.files])
                self.state.drop_staging(batch_id)

    # -- applying entries (idempotent) --------------------------------------------------------

    def roll_forward(self) -> None:
        """Finish applying the latest manifest entry if a crash interrupted it."""
        latest = self.state.latest()
        if latest is None:
            return
        applied = self.files.read_json(CLOCK_NAME) or {}
        if int(applied.get("batch", -1)) < int(latest["batch"]):
            self.apply(ParquetEntry.from_dict(latest))

    def apply(self, entry: ParquetEntry) -> None:
        """Rename the entry's staged files into place, mark completed partitions, then publish
        the clock. Each step checks what is done, so running it twice changes nothing."""
        files = self.files
        for f in entry.files:
            if not files.publish(f.staged, f.final):
                raise CorruptLogError(
                    f"{self.where}: batch {entry.batch} is committed but its staged file "
                    f"{f.staged} is gone before it was published to {f.final}; was the staging "
                    "folder removed by hand? The rows of that file are lost"
                )
        if entry.files and isinstance(files, LocalFiles):
            fsync_dir(self.cfg.location)  # the partition folders the renames made
        for key in entry.complete:
            self._mark_complete(key, entry)

        def newer(current: Any | None) -> bool:
            return int((current or {}).get("batch", -1)) < entry.batch

        current = files.read_json(CLOCK_NAME) or {}
        if newer(current):
            clock = entry.clock_us
            old = current.get("clock_us")
            if old is not None and (clock is None or clock < old):
                clock = old  # never back (cannot happen: entries only move forward)
            doc = {"batch": entry.batch, "clock_us": clock, "clock": iso(clock)}
            files.advance_json(CLOCK_NAME, doc, newer)

    def _mark_complete(self, key: int, entry: ParquetEntry) -> None:
        cfg = self.cfg
        gran = cfg.granularity_us
        self.files.create_json(
            f"{partition_name(key, cfg.granularity)}/{COMPLETE_MARKER}",
            {
                "partition": partition_name(key, cfg.granularity),
                "start": iso(key * gran),
                "end": iso((key + 1) * gran),
                "batch": entry.batch,
                "clock": iso(entry.clock_us),
            },
        )

    # -- reading ------------------------------------------------------------------------------

    def clock_us(self) -> int | None:
        return parquet_clock_us(self.cfg.location)


def _utc(schema: pa.Schema) -> pa.Schema:
    fields = []
    for f in schema:
        if pa.types.is_timestamp(f.type) and f.type.tz is not None:
            f = f.with_type(pa.timestamp("us", tz="UTC"))
        fields.append(f)
    return pa.schema(fields)


def _published(f: StagedFile) -> ParquetFile:
    assert f.final is not None and f.key is not None  # set by _Stager for every file
    return ParquetFile(staged=f.staged, final=f.final, key=f.key, rows=f.rows)


# -- for people (the rowtime CLI) ----------------------------------------------------------------


def describe_parquet_target(path: str) -> dict[str, Any]:
    """What ``rowtime describe`` says about the Parquet target at ``path`` (resolved)."""
    files = target_files_at(path)
    target = files.read_json(f"{SINK_DIR}/{TARGET_FILE}") or {}
    owner = files.read_json(f"{SINK_DIR}/{OWNER_FILE}") or {}
    applied = files.read_json(CLOCK_NAME) or {}
    clock = applied.get("clock_us")
    prefix = f"rowtime_{target.get('granularity')}="
    found: dict[str, dict[str, Any]] = {}
    for name in files.list(""):
        folder, _, rest = name.partition("/")
        if not folder.startswith(prefix) or "/" in rest or not rest:
            continue
        p = found.setdefault(folder, {"partition": folder, "files": 0, "complete": False})
        if rest.endswith(".parquet"):
            p["files"] += 1
        elif rest == COMPLETE_MARKER:
            p["complete"] = True
    return {
        "location": path,
        "kind": "parquet target",
        "schema": target.get("schema"),
        "granularity": target.get("granularity"),
        "query_id": owner.get("query_id"),
        "last_batch": applied.get("batch"),
        "clock_us": clock,
        "clock": None if clock is None else iso(clock),
        "partitions": [found[k] for k in sorted(found)],
    }


def describe_text(info: dict[str, Any]) -> str:
    """``describe_parquet_target`` as the lines ``rowtime describe`` prints."""
    lines = [
        f"parquet target  {info['location']}",
        f"schema          {info['schema']}",
        f"granularity     {info['granularity']} (folders rowtime_{info['granularity']}=...)",
        f"written by      query {info['query_id'] or '-'}, last batch {info['last_batch']}",
    ]
    width = max([len("partition"), *(len(p["partition"]) for p in info["partitions"])])
    lines.append(f"{'partition'.ljust(width)}  files  complete")
    for p in info["partitions"]:
        mark = "yes" if p["complete"] else "no"
        lines.append(f"{p['partition'].ljust(width)}  {str(p['files']).rjust(5)}  {mark}")
    lines.append(f"clock  {info['clock'] or 'none (no batch moved it yet)'}")
    return "\n".join(lines)

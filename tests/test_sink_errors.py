"""The sink's errors say what happened: a busy target and a batch without its reports."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from pyspark_rowtime.bounds.errors import CommitError, SinkBusyError, WriterLockedError
from pyspark_rowtime.sink.layout import FolderSinkState
from pyspark_rowtime.sink.options import parse_sink_options
from pyspark_rowtime.streams.lock import PartitionLock

TS = pa.timestamp("us", tz="UTC")


def test_a_commit_lock_held_past_the_wait_is_a_busy_target_not_a_locked_writer(tmp_path):
    state = FolderSinkState(str(tmp_path / "out"))
    state.ensure()
    other = PartitionLock(os.path.join(state.root, "commit.lock"))
    other.acquire("another commit")  # as a commit of another process would hold it
    try:
        from pyspark_rowtime.sink import layout

        with pytest.raises(SinkBusyError, match="another commit to this sink target") as info:
            layout.wait_for_lock(
                lambda: PartitionLock(os.path.join(state.root, "commit.lock")).acquire("mine"),
                timeout_s=0.05,
            )
        assert not isinstance(info.value, WriterLockedError)
        assert isinstance(info.value.__cause__, WriterLockedError)  # the holder, for the log
    finally:
        other.release()


def test_a_batch_whose_task_sent_no_report_is_a_commit_error(tmp_path):
    from pyspark_rowtime.sink.spark import RowtimeStreamWriter

    schema = pa.schema([("id", pa.int64()), ("rowtime", TS), ("is_bound", pa.bool_())])
    cfg = parse_sink_options({"path": str(tmp_path / "out")}, schema)
    with pytest.raises(CommitError, match="batch 3: a write task sent no commit message"):
        RowtimeStreamWriter(cfg).commit([None], 3)

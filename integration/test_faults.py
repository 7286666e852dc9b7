"""Faults a running or restarted query meets, in real Spark: a source stream deleted and
created again under a checkpoint, a target folder deleted under a running query.

Both must stop the query with an error that says what happened and what to do, instead of
reading positions of the old stream in the new one, or silently starting a new target without
the rows already committed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException

from pyspark_rowtime.api import create_stream, open_writer, read_stream

T0_MS = 1_700_000_000_000


def write(loc: Path, ids: range) -> None:
    with open_writer(str(loc)) as w:
        for i in ids:
            w.insert({"id": i}, rowtime=T0_MS + i)
        w.set_rowtime_bound(T0_MS + ids[-1])


def start_query(spark, src: Path, out: Path, checkpoint: Path, target: str = "stream"):  # type: ignore[no-untyped-def]
    df = spark.readStream.format("rowtime").load(str(src))
    return (
        df.writeStream.format("rowtime")
        .option("target", target)
        .option("checkpointLocation", str(checkpoint))
        .start(str(out))
    )


def data_ids(out: Path) -> list[int]:
    t = read_stream(out)
    return sorted(
        i for i, b in zip(t["id"].to_pylist(), t["is_bound"].to_pylist(), strict=True) if not b
    )


def test_a_checkpoint_from_before_the_stream_was_created_again_is_refused(spark, workdir):
    src, out, ck = workdir / "src", workdir / "out", workdir / "ck"
    create_stream(str(src), "id BIGINT")
    write(src, range(0, 5))
    q = start_query(spark, src, out, ck)
    q.processAllAvailable()
    q.stop()
    assert data_ids(out) == [0, 1, 2, 3, 4]

    shutil.rmtree(src)  # the same place, the same schema, other records: another stream
    create_stream(str(src), "id BIGINT")
    write(src, range(100, 120))
    q = start_query(spark, src, out, ck)
    try:
        with pytest.raises(StreamingQueryException) as e:
            q.processAllAvailable()
    finally:
        q.stop()
    message = str(e.value)
    assert "deleted and created again" in message and "new checkpointLocation" in message
    assert data_ids(out) == [0, 1, 2, 3, 4]  # nothing of the new stream read as the old


@pytest.mark.parametrize("target", ["stream", "parquet"])
def test_a_target_deleted_under_a_running_query_stops_it_saying_so(spark, workdir, target):
    src, out, ck = workdir / "src", workdir / "out", workdir / "ck"
    create_stream(str(src), "id BIGINT")
    write(src, range(0, 5))
    q = start_query(spark, src, out, ck, target)
    try:
        q.processAllAvailable()
        if target == "stream":
            assert data_ids(out) == [0, 1, 2, 3, 4]
        shutil.rmtree(out)
        write(src, range(5, 10))
        with pytest.raises(StreamingQueryException) as e:
            q.processAllAvailable()
    finally:
        q.stop()
    message = str(e.value)
    assert "was deleted or moved while the query ran" in message and str(out) in message

"""Streams on object storage through real Spark: a stream on S3 (moto's server) or Azure Blob
(Azurite) read by the rowtime source, and written by the rowtime sink to a stream on the same
store, with its exactly-once state there too (no shared folder is involved but the checkpoint,
which is Spark's). Servers: tests/objstore_servers.py. Queries run to quiescence with
``availableNow``; nothing sleeps."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from helpers import at, batch_reader, plain
from objstore_servers import ObjectServer
from sink_helpers import published_parquet

from pyspark_rowtime.api import create_stream, get_rowtime_bound, open_writer, read_stream
from pyspark_rowtime.bounds.bounds import END_OF_STREAM_US
from pyspark_rowtime.streams.storage import LocationKind, open_stream, what_is_at

pytestmark = pytest.mark.classic_only("the store does not depend on the mode; classic runs it")

T0 = 1_700_000_000_000_000
S = 1_000_000


def _write(src: str, ids: range) -> list[tuple[int, int, str]]:
    """Rows ``ids`` over two partitions (p = id % 2), a second apart, then a bound per
    partition at the last rowtime; returns (rowtime_us, id, tag) of each row."""
    rows = []
    for p in range(2):
        with open_writer(src, partition=p) as w:
            for i in ids:
                if i % 2 == p:
                    w.insert({"id": i, "tag": f"p{p}"}, rowtime=at(T0 + i * S))
                    rows.append((T0 + i * S, i, f"p{p}"))
            w.set_rowtime_bound(at(T0 + (ids.stop - 1) * S))
    return rows


def _copy(spark, src: str, out: str, checkpoint: Path, **options: object) -> None:  # type: ignore[no-untyped-def]
    """One run of a query from ``src`` into ``out`` to quiescence (``availableNow``); the
    reader takes ``maxRowsPerBatch``, the sink the other options."""
    reader = spark.readStream.format("rowtime")
    if "maxRowsPerBatch" in options:
        reader = reader.option("maxRowsPerBatch", options.pop("maxRowsPerBatch"))
    writer = reader.load(src).writeStream.format("rowtime")
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.option("checkpointLocation", str(checkpoint))
    query.trigger(availableNow=True).start(out).awaitTermination()


def test_a_stream_on_object_storage_is_read_and_written_by_spark(
    spark, workdir: Path, object_server: ObjectServer
) -> None:
    src, out = object_server.url("src"), object_server.url("out")
    create_stream(src, "id BIGINT, tag STRING", partitions=2)
    expected = _write(src, range(0, 40))

    # the batch reader sees every row, with its rowtime
    got = plain(batch_reader(spark, src).where("NOT is_bound").select("rowtime", "id", "tag"))
    assert sorted((r["rowtime"], r["id"], r["tag"]) for r in got) == sorted(expected)

    def run() -> None:
        _copy(spark, src, out, workdir / "ck", maxRowsPerBatch=15)

    run()
    assert what_is_at(out).kind is LocationKind.STREAM
    t = read_stream(out)
    data = t.filter(pa.compute.invert(t.column("is_bound")))
    got_out = sorted(
        zip(
            data.column("rowtime").cast(pa.int64()).to_pylist(),
            data.column("id").to_pylist(),
            data.column("tag").to_pylist(),
            strict=True,
        )
    )
    assert got_out == sorted(expected)
    assert open_stream(out).stream_clock_us() == open_stream(src).stream_clock_us()

    # more rows and the end of the stream: the restarted query appends each row once
    expected += _write(src, range(40, 60))
    for p in range(2):
        with open_writer(src, partition=p) as w:
            w.end_stream()
    run()
    t = read_stream(out)
    data = t.filter(pa.compute.invert(t.column("is_bound")))
    assert sorted(data.column("id").to_pylist()) == sorted(i for _, i, _ in expected)
    assert open_stream(out).stream_clock_us() == END_OF_STREAM_US
    assert get_rowtime_bound(out) is not None
    # the sink's exactly-once state lies below the target's prefix, on the store
    from pyspark_rowtime.streams.sink_state import backend_sink_state

    state = backend_sink_state(out)
    assert state is not None and state.batches()


def test_a_parquet_target_on_object_storage_is_written_by_spark(
    spark, workdir: Path, object_server: ObjectServer
) -> None:
    """The sink's Parquet target on the store: Hive-style minute folders of Parquet objects,
    ``_COMPLETE`` once a minute is closed, the clock for ``get_rowtime_bound``, each row once
    across a restart; nothing left in the staging area."""
    from pyspark_rowtime.sink.parquet_target import COMPLETE_MARKER, target_files_at

    src, out = object_server.url("src"), object_server.url("pq")
    create_stream(src, "id BIGINT, tag STRING", partitions=2)
    expected = _write(src, range(0, 150))  # 2.5 minutes

    def run() -> None:
        _copy(
            spark,
            src,
            out,
            workdir / "ck-pq",
            maxRowsPerBatch=40,
            target="parquet",
            granularity="minute",
        )

    run()
    assert what_is_at(out).kind is LocationKind.PARQUET_TARGET
    first_clock = get_rowtime_bound(out)
    assert first_clock is not None
    expected += _write(src, range(150, 200))
    for p in range(2):
        with open_writer(src, partition=p) as w:
            w.end_stream()
    run()

    t = published_parquet(out)
    assert t is not None
    names = target_files_at(out).list("")
    got = sorted(
        zip(
            t.column("rowtime").cast(pa.int64()).to_pylist(),
            t.column("id").to_pylist(),
            t.column("tag").to_pylist(),
            strict=True,
        )
    )
    assert got == sorted(expected)  # each row once, across the restart
    minutes = {n.split("/")[0] for n in names if n.startswith("rowtime_minute=")}
    assert len(minutes) == len({r // (60 * S) for r, _, _ in expected})
    assert all(f"{m}/{COMPLETE_MARKER}" in names for m in minutes)  # the end closed them all
    assert not any("/staging/" in n for n in names)
    assert get_rowtime_bound(out) is not None and get_rowtime_bound(out) >= first_clock

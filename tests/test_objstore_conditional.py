"""A store that ignores conditional writes is refused before anything relies on them.

The object storage backend is correct only because a create of an existing object and a put
with a stale etag both fail. s3rver (an S3-compatible server from npm, started here on a
loopback port) accepts the headers and ignores them, as some S3-compatible servers do: on it,
two writers could both win a commit. Every write path that relies on those answers checks the
store once first, and refuses it with an error that says why and what to use instead; nothing
of the stream is left behind. On moto and Azurite (the stores the other tests use) the same
check passes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import obstore
import pytest
from objstore_servers import ObjectServer, s3rver_server, why_no_s3rver

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.errors import OptionError
from pyspark_rowtime.streams.objstore.location import (
    forget_stores,
    parse_location,
    require_conditional_writes,
    store_for,
)


@pytest.fixture(scope="module")
def s3rver_running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectServer]:
    why = why_no_s3rver()
    if why:
        pytest.skip(why)
    with s3rver_server(tmp_path_factory.mktemp("s3rver")) as server:
        yield server


@pytest.fixture
def s3rver(s3rver_running: ObjectServer) -> Iterator[ObjectServer]:
    """s3rver, its variables in ``os.environ`` for one test (the clients made anew)."""
    with s3rver_running.environ():
        forget_stores()
        yield s3rver_running
    forget_stores()


def _objects(url: str) -> list[str]:
    loc = parse_location(url)
    return [m["path"] for chunk in obstore.list(store_for(loc), loc.prefix + "/") for m in chunk]


def test_s3rver_really_ignores_conditional_puts(s3rver: ObjectServer) -> None:
    """The premise: what the probe looks for is what s3rver does."""
    loc = parse_location(s3rver.url("premise"))
    store = store_for(loc)
    obstore.put(store, loc.key("k"), b"a", mode="create")
    obstore.put(store, loc.key("k"), b"b", mode="create")  # no AlreadyExistsError
    assert bytes(obstore.get(store, loc.key("k")).bytes()) == b"b"


def test_creating_a_stream_on_it_is_refused_and_leaves_nothing(s3rver: ObjectServer) -> None:
    url = s3rver.url("orders")
    with pytest.raises(OptionError, match=r"does not honour conditional writes.*If-None-Match"):
        pr.create_stream(url, "id BIGINT")
    assert _objects(url) == []  # the probe removed itself; no _stream.json


def test_a_parquet_target_on_it_is_refused_before_its_first_commit(
    s3rver: ObjectServer, tmp_path: Path
) -> None:
    from sink_helpers import make

    with pytest.raises(OptionError, match="does not honour conditional writes"):
        make(tmp_path, "parquet", location=s3rver.url("pq"))


def test_a_missing_bucket_is_named_with_what_to_do(s3_server: ObjectServer) -> None:
    with pytest.raises(OptionError, match=r"'no-such-bucket' does not exist.*create it first"):
        pr.create_stream("s3://no-such-bucket/orders", "id BIGINT")


def test_the_check_passes_on_the_stores_the_backend_is_tested_on(
    object_server: ObjectServer,
) -> None:
    loc = parse_location(object_server.url("probe"))
    forget_stores()
    require_conditional_writes(loc)  # raises on a store that ignores them
    assert _objects(str(loc)) == []

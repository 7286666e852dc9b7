"""The object storage backend (s3://, az://): what only it does (locations, credentials,
abfs names, ranged reads, trims compared with the untrimmed reads, the CLI on a bucket).

The storage contract every backend keeps is test_storage_contract.py, which runs against
moto's S3 server and Azurite too (tests/objstore_servers.py)."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest
from objstore_servers import ObjectServer
from test_retention import POLICIES, READS, batch, restricted, write_random

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.errors import (
    OptionError,
)
from pyspark_rowtime.streams.objstore.location import parse_location
from pyspark_rowtime.streams.retention import apply_retention
from pyspark_rowtime.streams.storage import (
    open_stream,
    what_is_at,
)

T0 = 1_700_000_000_000_000
MS = 1_700_000_000_000  # T0 in the writer's default unit
S = 1_000_000


def _write_seconds(url: str, seconds: range, per_flush: int) -> None:
    with pr.open_writer(url, 0) as w:
        for i, sec in enumerate(seconds):
            w.insert({"k": sec}, rowtime=sec * 1000)
            if (i + 1) % per_flush == 0:
                w.flush()


@pytest.mark.parametrize("defaults", [POLICIES[1], POLICIES[4]], ids=["drop", "adjust"])
def test_reads_of_a_trimmed_stream_equal_the_untrimmed_ones(
    object_server: ObjectServer, defaults: dict[str, Any]
) -> None:
    rng = random.Random(11 + len(str(defaults)))
    compared = trimmed = 0
    for case in range(2):
        a, b = object_server.url("a"), object_server.url("b")
        partitions = rng.choice([1, 2])
        seed = rng.randrange(10**9)
        for location in (a, b):  # the same records twice: one is trimmed
            write_random(location, random.Random(seed), defaults, partitions, end=case == 0)
        stream: Any = open_stream(b)
        top = max(s.max_rowtime_us or 0 for s in stream.partition_stats(0))
        apply_retention(stream, before_us=rng.randrange(1_000_000_000, top + 2))
        kept = [stream.start_offset(p) for p in range(partitions)]
        trimmed += sum(kept)
        for read in READS[:3]:
            want, got = batch(a, read), batch(b, read)
            for p, start in enumerate(kept):
                mine = [{**r, "arrival": None} for r in got[p]]
                theirs = [{**r, "arrival": None} for r in restricted(want[p], start)]
                assert mine == theirs, (case, read, p, start)
                compared += len(got[p])
    assert trimmed > 10 and compared > 50


@pytest.mark.parametrize(
    ("location", "bucket", "prefix"),
    [
        ("s3://bkt/a/b", "bkt", "a/b"),
        ("s3a://bkt/a/", "bkt", "a"),
        ("az://cont/x", "cont", "x"),
        ("azure://cont/x/y", "cont", "x/y"),
        ("abfss://cont@acct.dfs.core.windows.net/x", "cont", "x"),
    ],
)
def test_locations_name_a_bucket_and_a_prefix(location: str, bucket: str, prefix: str) -> None:
    loc = parse_location(location)
    assert (loc.bucket, loc.prefix) == (bucket, prefix)
    assert parse_location(str(loc)) == loc


@pytest.mark.parametrize(
    ("location", "why"),
    [
        ("s3://bkt", "needs a bucket"),
        ("s3://key:secret@bkt/x", "carries credentials"),
        ("az://cont/x?sig=abc", "query"),
        ("s3://bkt/a/../b", "'..'"),
    ],
)
def test_bad_locations_are_refused_saying_why_without_secrets(location: str, why: str) -> None:
    with pytest.raises(OptionError, match=why) as e:
        what_is_at(location)
    assert "secret" not in str(e.value).replace("secret access", "")


def test_the_cli_describes_trims_and_sets_retention_on_object_storage(
    object_server: ObjectServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from pyspark_rowtime.cli import main

    url = object_server.url("cli")
    assert main(["create", url, "--schema", "k INT", "--partitions", "1"]) == 0
    _write_seconds(url, range(30), per_flush=10)
    capsys.readouterr()
    assert main(["describe", url]) == 0
    out = capsys.readouterr().out
    assert url in out and "30" in out
    assert main(["retention", url, "1 day"]) == 0
    assert open_stream(url).retention().active  # type: ignore[attr-defined]
    assert main(["trim", url, "--before", "15", "--unit", "s"]) == 0
    assert open_stream(url).start_offset(0) == 10
    assert main(["clock", url]) == 0
    # no secret of the environment appears in anything printed
    printed = "".join(capsys.readouterr())
    for name in ("AWS_SECRET_ACCESS_KEY", "AZURE_STORAGE_ACCOUNT_KEY"):
        secret = object_server.env.get(name)
        assert secret is None or secret not in printed


def test_refused_credentials_are_a_clear_error_without_the_secret(
    az_server: ObjectServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark_rowtime.streams.objstore import location

    url = az_server.url("creds")
    pr.create_stream(url, "k INT")
    wrong = "V3Jvbmcta2V5LW9mLTY0LWJ5dGVzLi4uLi4uLi4uLi4uLi4uLi4uLi4uLi4uLi4uLi4uLi4uLi4uLi4uLg=="
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", wrong)
    location.forget_stores()
    try:
        with pytest.raises(OptionError, match="refused") as e:
            open_stream(url)
        assert wrong not in str(e.value) and url in str(e.value)
    finally:
        monkeypatch.undo()
        location.forget_stores()
    assert open_stream(url).end_offset(0) == 0


def test_an_abfs_location_names_the_same_objects_as_az(az_server: ObjectServer) -> None:
    url = az_server.url("abfs")
    prefix = url.split("/", 3)[3]
    abfs = f"abfs://{az_server.bucket}@devstoreaccount1.dfs.core.windows.net/{prefix}"
    pr.create_stream(abfs, "k INT")
    with pr.open_writer(abfs, 0) as w:
        w.insert({"k": 7}, rowtime=MS)
    assert open_stream(url).read(0, 0, 1).column("k").to_pylist() == [7]
    assert what_is_at(abfs).resolved == abfs


@pytest.mark.parametrize("kind", ["s3", "az"])
def test_the_planners_read_of_time_columns_fetches_no_payload(
    request: pytest.FixtureRequest, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's planner reads only the system columns; on object storage that read takes
    the byte ranges of those columns (the IPC footer says where they are), not the payload, and
    gives what the whole object gives."""
    import obstore

    server: ObjectServer = request.getfixturevalue(f"{kind}_server")
    url = server.url("s")
    pr.create_stream(url, "id BIGINT, blob STRING")
    with pr.open_writer(url, 0) as w:
        w.insert_arrow(pa.table({"id": list(range(5000)), "blob": ["x" * 400] * 5000}))
    fetched = {"bytes": 0}
    plain_range, plain_get = obstore.get_range, obstore.get

    def counted_range(*args: Any, **kwargs: Any) -> Any:
        data = plain_range(*args, **kwargs)
        fetched["bytes"] += len(memoryview(data))
        return data

    def no_whole_get(store: Any, key: str, *args: Any, **kwargs: Any) -> Any:
        if key.endswith(".arrow"):
            raise AssertionError(f"the whole segment {key} was fetched")
        return plain_get(store, key, *args, **kwargs)

    system = ["__arrival_us", "__rowtime_us", "__is_bound"]
    whole = open_stream(url).read(0, 0, 5000).select(system)
    monkeypatch.setattr(obstore, "get_range", counted_range)
    monkeypatch.setattr(obstore, "get", no_whole_get)
    times = open_stream(url).read(0, 0, 5000, columns=system)
    assert times.equals(whole)
    assert 0 < fetched["bytes"] < 5000 * 400 / 10  # the times: ~17 bytes a record

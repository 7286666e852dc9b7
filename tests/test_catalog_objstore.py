"""The catalog, the CLI and the connectors over object storage (s3://, az://), against the servers
of tests/objstore_servers.py (moto's S3, Azurite): an entry is created on first use as it says,
a differing one is refused showing both, URLs are kept as written and never carry a secret, the
CLI works by catalog name and by location and prints no secret of the environment, and a
connector feeding such a stream keeps its progress in a local ``state`` folder and loses and
repeats nothing across SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from objstore_servers import ObjectServer

from pyspark_rowtime.cli import main
from pyspark_rowtime.connectors.feed import committed_state
from pyspark_rowtime.connectors.run import build
from pyspark_rowtime.streams.catalog import (
    CatalogError,
    ensure_stream,
    load_catalog,
    resolve_stream_option,
)
from pyspark_rowtime.streams.storage import LocationKind, open_stream, what_is_at

#: The environment variables holding the servers' secrets: their values are never printed.
SECRET_VARS = ("AWS_SECRET_ACCESS_KEY", "AZURE_STORAGE_ACCOUNT_KEY")
DAY_US = 86_400_000_000

ENTRY = """
[streams.orders]
location = "{location}"
schema = "ticker STRING, qty INT, ts TIMESTAMP"
partitions = 2
reader = {{ order = "adjust", "adjust.unit" = "msec", "adjust.range" = 999 }}
retention = "7 days"
"""


def _write(tmp_path: Path, text: str, name: str = "catalog.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _secrets() -> list[str]:
    return [os.environ[v] for v in SECRET_VARS if os.environ.get(v)]


def _no_secret(text: str) -> None:
    for secret in _secrets():
        assert secret not in text, "a secret of the environment was printed"


# -- the entry ---------------------------------------------------------------------------------


def test_an_entry_on_object_storage_is_created_on_first_use_as_it_says(
    object_server: ObjectServer, tmp_path: Path
) -> None:
    url = object_server.url("orders")
    path = _write(tmp_path, ENTRY.format(location=url))
    entry = load_catalog(path).stream("orders")
    assert entry.location == url  # not made relative to the catalog's folder
    assert what_is_at(url).kind is LocationKind.NOTHING
    opts, got = resolve_stream_option({"stream": "orders", "catalog": path, "order": "drop"})
    assert opts == {"order": "drop", "path": url} and got == entry
    stream = open_stream(url)
    meta = stream.meta
    assert meta.partitions == 2
    assert meta.ddl == "ticker STRING, qty INT, ts TIMESTAMP"
    assert meta.defaults["order"] == "adjust"
    assert meta.defaults["adjust_unit"] == "msec" and meta.defaults["adjust_range"] == 999
    assert stream.retention().duration_us == 7 * DAY_US  # type: ignore[attr-defined]
    # A second use of the same entry opens the stream it made.
    assert ensure_stream(entry).meta.partitions == 2


def test_an_existing_stream_on_object_storage_that_differs_shows_both(
    object_server: ObjectServer, tmp_path: Path
) -> None:
    url = object_server.url("orders")
    path = _write(tmp_path, ENTRY.format(location=url))
    ensure_stream(load_catalog(path).stream("orders"))
    changed = ENTRY.format(location=url).replace("partitions = 2", "partitions = 3")
    changed = changed.replace("qty INT", "qty BIGINT")
    with pytest.raises(CatalogError) as e:
        ensure_stream(load_catalog(_write(tmp_path, changed)).stream("orders"))
    msg = str(e.value)
    assert "the stream has 2, the catalog says 3" in msg
    assert "qty INT" in msg and "qty BIGINT" in msg and url in msg
    # Refused, not changed: the stream is as it was.
    assert open_stream(url).meta.partitions == 2


@pytest.mark.parametrize(
    "url",
    [
        "s3://bucket/a/orders",
        "s3a://bucket/orders",
        "az://container/a/orders",
        "azure://container/orders",
        "abfss://container@account.dfs.core.windows.net/a/orders",
    ],
)
def test_relative_path_resolution_keeps_urls_as_written(tmp_path: Path, url: str) -> None:
    entry = load_catalog(_write(tmp_path, ENTRY.format(location=url))).stream("orders")
    assert entry.location == url


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("s3://AKIAEXAMPLE:hunter2-secret@bucket/orders", "AWS_SECRET_ACCESS_KEY"),
        ("az://account:hunter2-secret@container/orders", "AZURE_STORAGE_ACCOUNT_KEY"),
        ("abfss://container:hunter2-secret@acct.dfs.core.windows.net/x", "AZURE_STORAGE_"),
    ],
)
def test_a_location_with_credentials_is_refused_without_showing_them(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], url: str, names: str
) -> None:
    path = _write(tmp_path, ENTRY.format(location=url))
    with pytest.raises(CatalogError) as e:
        load_catalog(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}:3: streams.orders.location")
    assert "hunter2" not in msg and names in msg
    assert "password_env" not in msg  # that is Redis's: it would not work here
    assert main(["catalog", "check", path]) == 2
    out, err = capfd.readouterr()
    assert "hunter2" not in out + err and "streams.orders.location" in err


@pytest.mark.parametrize(
    ("location", "says"),
    [
        ("s3://bucket", "needs a bucket (or container) and a prefix"),
        ("az://container/a/../b", "'..'"),
        ("s3://AKIAEXAMPLE@bucket/orders", "carries credentials"),
    ],
)
def test_a_malformed_url_is_refused_when_the_catalog_is_read(
    tmp_path: Path, location: str, says: str
) -> None:
    path = _write(tmp_path, ENTRY.format(location=location))
    with pytest.raises(CatalogError) as e:
        load_catalog(path)
    assert str(e.value).startswith(f"{path}:3: streams.orders.location") and says in str(e.value)


@pytest.mark.parametrize("scheme", ["s3", "az"])
def test_password_env_on_object_storage_is_refused_saying_where_credentials_go(
    tmp_path: Path, scheme: str
) -> None:
    text = ENTRY.format(location=f"{scheme}://bucket/orders")
    path = _write(tmp_path, text.replace("partitions = 2", 'partitions = 2\npassword_env = "PW"'))
    with pytest.raises(CatalogError) as e:
        load_catalog(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}:6: streams.orders.password_env")
    assert "remove password_env" in msg
    assert ("AWS_SECRET_ACCESS_KEY" if scheme == "s3" else "AZURE_STORAGE_ACCOUNT_KEY") in msg


# -- the CLI -----------------------------------------------------------------------------------


def test_the_cli_works_by_catalog_name_and_location_and_prints_no_secret(
    object_server: ObjectServer, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert _secrets(), "the server's secrets are in the environment"
    url = object_server.url("orders")
    catalog = _write(tmp_path, ENTRY.format(location=url))
    seen = []

    def run(*argv: str, status: int = 0) -> str:
        code = main(list(argv))
        out, err = capfd.readouterr()
        seen.append(out + err)
        assert code == status, (argv, out, err)
        return out if status == 0 else err

    assert "ok, 1 stream(s)" in run("catalog", "check", catalog)
    assert "not created" in run("streams", catalog)
    assert f"stream orders at {url}: 2 partition(s)" in run(
        "create", "--stream", "orders", "--catalog", catalog
    )
    old = tmp_path / "old.jsonl"
    new = tmp_path / "new.jsonl"
    old.write_text(
        "".join(json.dumps({"ticker": "A", "qty": i, "ts": 1000 + i}) + "\n" for i in (1, 2))
    )
    new.write_text(json.dumps({"ticker": "B", "qty": 3, "ts": 10_000_000}) + "\n")
    assert "inserted 2 row(s)" in run("insert", url, str(old), "--rowtime-column", "ts")
    assert "inserted 1 row(s)" in run("insert", url, str(new), "--rowtime-column", "ts")
    assert "written to every partition" in run("bound", url, "20000000")
    out = run("streams", catalog)
    assert url in out and "1970-01-01T05:33:20Z" in out and "5 records" in out
    assert run("clock", url, "--us").strip() == "20000000000"
    info = json.loads(run("describe", "--json", url))
    assert info["location"] == url and info["partitions"] == 2
    assert info["retention"]["retention_us"] == 7 * DAY_US
    assert [p["records"] for p in info["partition_info"]] == [4, 1]
    assert "retention 7 days of rowtime" in run("describe", url)
    assert "retention 7 days of rowtime" in run("retention", url)
    tail = [json.loads(line) for line in run("tail", url, "-n", "3").splitlines()]
    assert [r.get("qty") for r in tail if r["partition"] == 0] == [3, None]
    assert "partition 0: removed offsets [0, 2)" in run("trim", url, "--before", "5000")
    assert json.loads(run("describe", "--json", url))["partition_info"][0]["first_kept_offset"] == 2
    metrics = run("metrics", url)
    assert f'rowtime_records_total{{partition="0",stream="{url}"}} 4.0' in metrics
    err = run("describe", url + "-missing", status=2)
    assert "no rowtime stream at" in err and "rowtime create" in err
    _no_secret("\n".join(seen))


def test_an_unreachable_store_is_one_line_without_the_secret(
    object_server: ObjectServer,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyspark_rowtime.streams.objstore.location import forget_stores

    url = object_server.url("orders")
    catalog = _write(tmp_path, ENTRY.format(location=url))
    assert main(["create", "--stream", "orders", "--catalog", catalog]) == 0
    if object_server.scheme == "s3":  # moto takes any key: point the client at a closed port
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    else:  # Azurite checks the key: give it a wrong one
        monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", "V3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXk=")
    forget_stores()
    try:
        assert main(["streams", catalog]) == 2
        out, err = capfd.readouterr()
        assert len(err.strip().splitlines()) == 1 and url in err, err
        _no_secret(out + err)
    finally:
        monkeypatch.undo()
        forget_stores()


# -- connectors --------------------------------------------------------------------------------

CONNECTORS = """
[streams.orders]
location = "{location}"
schema = "ticker STRING, qty INT"
partitions = 2
reader = {{ order = "drop" }}

[connectors.files]
kind = "directory"
stream = "orders"
partition = 0
path = "incoming"
rowtime_field = "ts"
batch_rows = 7
poll = "20ms"
log_every = "50ms"
bounds = {{ strategy = "lateness", lateness = "50ms" }}
state = "state/files"

[connectors.gen]
kind = "generator"
stream = "orders"
partition = 1
rate = {rate}
count = {count}
disorder = "5ms"
bounds = {{ strategy = "source" }}
state = "state/gen"
"""


def _connectors(
    tmp_path: Path, server: ObjectServer, *, rate: int = 100_000, count: int = 300
) -> tuple[str, str]:
    (tmp_path / "incoming").mkdir(exist_ok=True)
    url = server.url("orders")
    text = CONNECTORS.format(location=url, rate=rate, count=count)
    return _write(tmp_path, text), url


def _records(url: str, partition: int) -> list[dict[str, Any]]:
    stream = open_stream(url)
    return stream.read(partition, 0, stream.end_offset(partition)).to_pylist()


def _rows(url: str, partition: int) -> list[int]:
    return [r["qty"] for r in _records(url, partition) if not r["__is_bound"]]


def _drop_files(tmp_path: Path, files: int, per_file: int) -> list[int]:
    expected = []
    for f in range(files):
        lines = []
        for i in range(per_file):
            n = f * per_file + i
            # a little disorder, within the lateness, so that rows are held
            ts = 1_000_000 + n * 10 - (n % 3) * 7
            lines.append(json.dumps({"ticker": f"T{n}", "qty": n, "ts": ts}))
            expected.append(n)
        tmp = tmp_path / f".{f:03d}.jsonl"
        tmp.write_text("\n".join(lines) + "\n")
        os.rename(tmp, tmp_path / "incoming" / f"{f:03d}.jsonl")  # renamed in, complete
    return expected


def _bounds_hold(records: list[dict[str, Any]]) -> None:
    """Each bound is a promise every later row of the partition keeps."""
    low = None
    for r in records:
        if r["__is_bound"]:
            assert low is None or r["__rowtime_us"] >= low
            low = r["__rowtime_us"]
        elif low is not None:
            assert r["__rowtime_us"] >= low, "a row below an earlier bound"


@pytest.mark.parametrize("kind", ["files", "gen"])
def test_a_connector_on_object_storage_without_state_says_what_to_set(
    object_server: ObjectServer, tmp_path: Path, capfd: pytest.CaptureFixture[str], kind: str
) -> None:
    catalog, url = _connectors(tmp_path, object_server)
    text = Path(catalog).read_text()
    Path(catalog).write_text(text.replace(f'state = "state/{kind}"\n', ""))
    line = text.splitlines().index(f"[connectors.{kind}]") + 1
    for argv in (["catalog", "check", catalog], ["connect", catalog, kind]):
        assert main(argv) == 2
        err = capfd.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert f"catalog.toml:{line}: connectors.{kind}.state: key state is missing" in err[0]
        assert f'set state = "/var/lib/rowtime/{kind}"' in err[0]
    # Refused before anything was written: the stream was not created.
    assert what_is_at(url).kind is LocationKind.NOTHING
    Path(catalog).write_text(text.replace(f'"state/{kind}"', f'"{url}-state"'))
    assert main(["connect", catalog, kind]) == 2
    err = capfd.readouterr().err
    assert f"connectors.{kind}.state" in err and "must be a local folder" in err


def test_the_generator_feeds_a_stream_on_object_storage(
    object_server: ObjectServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 10 ms apart and at most 5 ms early: the source's bound passes the rows between them. The
    # generator's clock moves 50 ms a step (5 rows), whatever the machine's load: with the wall
    # clock a slow step took more rows at once, and fewer bounds came between them.
    from pyspark_rowtime.connectors import sources

    now = [1_800_000_000_000_000]
    monkeypatch.setattr(sources, "wall_us", lambda: now[0])
    catalog, url = _connectors(tmp_path, object_server, rate=100, count=40)
    feed, source = build(load_catalog(catalog), "gen")
    steps = 0
    while feed.position is None or feed.position["next"] < 40:
        now[0] += 50_000
        assert source.step()
        steps += 1
    assert steps == 9  # row 0 at the first step's clock, then 5 rows a step
    feed.close(feed.position)
    assert Path(feed.dir) == tmp_path / "state" / "gen"
    assert (Path(feed.dir) / "progress.json").exists()
    records = _records(url, 1)
    assert [r["qty"] for r in records if not r["__is_bound"]] == list(range(40))
    assert sum(r["__is_bound"] for r in records) >= steps  # a bound after each step's rows
    _bounds_hold(records)
    assert _records(url, 0) == []  # its partition only
    # Started again it has nothing more to make: no row twice.
    feed, source = build(load_catalog(catalog), "gen")
    assert feed.position["next"] == 40
    assert source.step() is False
    feed.close(feed.position)
    assert _rows(url, 1) == list(range(40))


def _connect(catalog: str, name: str) -> subprocess.Popen[str]:
    # A short lease: a killed connector's partition is free again soon (default 30 s).
    env = {**os.environ, "ROWTIME_LEASE_S": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "pyspark_rowtime.cli", "connect", catalog, name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _start(catalog: str, name: str) -> tuple[subprocess.Popen[str], str]:
    """The connector, started once the killed one's lease has ended; its first line."""
    deadline = time.monotonic() + 30
    while True:
        proc = _connect(catalog, name)
        first = proc.stderr.readline()  # type: ignore[union-attr]
        if "feeding" in first:
            return proc, first
        _, err = proc.communicate(timeout=30)
        # Until then: one line, status 2, naming the lease (the partition stays locked).
        assert proc.returncode == 2 and "lease ends within" in first, first + err
        assert time.monotonic() < deadline, first
        time.sleep(0.2)


def _wait_rows(url: str, partition: int, above: int, timeout: float = 30.0) -> int:
    """Rows of ``partition`` once there are more than ``above`` (or when ``timeout`` ends: the
    test's assertions then say what went wrong)."""
    deadline = time.monotonic() + timeout
    while True:
        n = len(_rows(url, partition)) if what_is_at(url).kind is LocationKind.STREAM else 0
        if n > above or time.monotonic() > deadline:
            return n
        time.sleep(0.02)


def _stop(proc: subprocess.Popen[str], first: str) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"no clean stop 30 s after SIGTERM:\n{first}{err}") from None
    assert proc.returncode == 0, first + err
    assert "stopped" in err.splitlines()[-1], err
    return first + err


def test_sigkill_of_a_directory_connector_on_object_storage_loses_and_repeats_nothing(
    object_server: ObjectServer, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    catalog, url = _connectors(tmp_path, object_server)
    expected = _drop_files(tmp_path, files=8, per_file=30)
    done = tmp_path / "incoming" / "_done"
    at_kills = []  # rows written when each kill came
    for delay in (0.0, 0.3, 0.6):
        proc, _first = _start(catalog, "files")
        # a kill once it has written (a loaded machine starts it slowly), then at whatever
        # point it reached
        _wait_rows(url, 0, above=at_kills[-1] if at_kills else 0)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        at_kills.append(len(_rows(url, 0)) if what_is_at(url).kind is LocationKind.STREAM else 0)
        if done.exists() and len(os.listdir(done)) == 8:
            break
    assert any(0 < n < len(expected) for n in at_kills), f"no kill while ingesting: {at_kills}"
    before = _rows(url, 0) if at_kills[-1] else []
    proc, first = _start(catalog, "files")
    deadline = time.monotonic() + 60
    while (not done.exists() or len(os.listdir(done)) < 8) and time.monotonic() < deadline:
        time.sleep(0.05)
    log = _stop(proc, first)
    _no_secret(log)
    got = _rows(url, 0)
    assert len(got) == len(set(got)), "rows repeated"
    assert sorted(got) == expected, "rows lost"
    assert got[: len(before)] == before  # what was written before the restart stayed
    _bounds_hold(_records(url, 0))
    assert (tmp_path / "state" / "files" / "progress.json").exists()
    # Nothing of the stream is local: only the catalog, the input and the connector's state.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["catalog.toml", "incoming", "state"]
    commits = _commit_objects(url)
    assert main(["streams", catalog]) == 0
    assert "files (directory: stopped)" in capfd.readouterr().out
    assert _commit_objects(url) == commits  # looking wrote nothing to the stream


def _commit_objects(url: str) -> list[str]:
    import obstore

    from pyspark_rowtime.streams.objstore.location import parse_location, store_for

    loc = parse_location(url)
    return sorted(
        m["path"]
        for chunk in obstore.list(store_for(loc), loc.key("partition-0000", "_commits") + "/")
        for m in chunk
    )


def test_sigkill_of_the_generator_on_object_storage_loses_and_repeats_nothing(
    object_server: ObjectServer, tmp_path: Path
) -> None:
    # No count: it generates until stopped; its committed position says how many rows it made.
    catalog, url = _connectors(tmp_path, object_server, rate=500)
    Path(catalog).write_text(Path(catalog).read_text().replace("count = 300\n", ""))
    written = 0
    for delay in (0.1, 0.3):
        proc, _first = _start(catalog, "gen")
        written = _wait_rows(url, 1, above=written)  # it generates (a loaded machine is slow)
        time.sleep(delay)  # killed while generating
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    before = _rows(url, 1)
    assert before, "rows were written before the kills"
    proc, first = _start(catalog, "gen")
    deadline = time.monotonic() + 30
    while len(_rows(url, 1)) < len(before) + 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    _stop(proc, first)
    doc = json.loads((tmp_path / "state" / "gen" / "progress.json").read_text())
    made = committed_state(doc, open_stream(url).end_offset(1))["position"]["next"]
    records = _records(url, 1)
    assert [r["qty"] for r in records if not r["__is_bound"]] == list(range(made))
    assert made >= len(before) + 200
    _bounds_hold(records)

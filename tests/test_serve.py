"""``rowtime serve`` (src/pyspark_rowtime/flight_server.py) with pyarrow's Flight client.

Servers run for real: in this process (``RowtimeFlightServer`` on a loopback port) where a
test needs no process boundary, and as ``rowtime serve`` processes where it stops, kills or
restarts one (SIGTERM, SIGKILL), or reads its arguments. Every message a test sends is checked
in the stream afterwards (``read_stream``): stored once, or not at all.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from fault_proxy import FaultProxy, Faults
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serve_fixtures import (  # noqa: F401 (fixtures)
    SCHEMA,
    T0,
    Served,
    ack,
    batch,
    ids_of,
    meta,
    root_fixture,
    server_fixture,
)

from pyspark_rowtime.api import create_stream, open_writer, read_stream
from pyspark_rowtime.cli import main
from pyspark_rowtime.flight_server import RowtimeFlightServer, Streams, load_producers
from pyspark_rowtime.streams.storage import open_stream

# -- the protocol, in process -------------------------------------------------------------------


def test_each_message_is_acknowledged_once_its_rows_and_bound_are_committed(
    server: RowtimeFlightServer, root: Path
) -> None:
    client = fl.connect(server.url)
    w, r = client.do_put(fl.FlightDescriptor.for_path("orders", "1"), SCHEMA)
    w.write_with_metadata(batch(0, 3), meta("gw-1", 0))
    assert ack(r) == {"seq": 0, "status": "committed"}
    # acknowledged means readable (and durable): a reader sees the rows before the next write
    assert ids_of(root, 1) == [0, 1, 2]
    w.write_with_metadata(batch(3, 2), meta("gw-1", 1, bound=T0 + 10))
    assert ack(r) == {"seq": 1, "status": "committed"}
    w.write_metadata(meta("gw-1", 2, bound="2023-11-14T22:13:21Z"))  # a bound alone
    assert ack(r) == {"seq": 2, "status": "committed"}
    w.close()
    t = read_stream(str(root / "orders"))
    assert t.column("is_bound").to_pylist() == [False] * 5 + [True, True]
    rowtimes = t.column("rowtime").cast(pa.int64()).to_pylist()
    assert rowtimes == [T0, T0 + 1, T0 + 2, T0 + 3, T0 + 4, T0 + 10, T0 + 1_000_000]
    clock = json.loads(
        next(iter(client.do_action(fl.Action("clock", b"orders")))).body.to_pybytes()
    )
    assert clock["partitions_us"] == [None, T0 + 1_000_000]
    assert clock["clock_us"] is None  # partition 0 is empty: the stream has no clock yet


def test_rows_without_a_rowtime_column_get_the_arrival_time(
    server: RowtimeFlightServer, root: Path
) -> None:
    schema = pa.schema([("id", pa.int64())])
    w, r = fl.connect(server.url).do_put(fl.FlightDescriptor.for_path("orders"), schema)
    before = time.time_ns() // 1000
    w.write_with_metadata(pa.record_batch([pa.array([7], pa.int64())], schema=schema), meta("a", 0))
    assert ack(r)["status"] == "committed"
    w.close()
    t = read_stream(str(root / "orders"))
    assert t.column("id").to_pylist() == [7]
    assert t.column("rowtime").cast(pa.int64())[0].as_py() >= before


def test_an_integer_rowtime_column_is_microseconds(server: RowtimeFlightServer, root: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("rowtime", pa.int64())])
    w, r = fl.connect(server.url).do_put(fl.FlightDescriptor.for_path("orders"), schema)
    data = pa.record_batch(
        [pa.array([1], pa.int64()), pa.array([T0 + 5], pa.int64())], schema=schema
    )
    w.write_with_metadata(data, meta("a", 0))
    assert ack(r)["status"] == "committed"
    w.close()
    assert read_stream(str(root / "orders")).column("rowtime").cast(pa.int64())[0].as_py() == T0 + 5


def test_a_resent_message_is_a_duplicate_and_stores_nothing_after_a_restart_too(
    root: Path,
) -> None:
    first = RowtimeFlightServer(Streams(str(root)), port=0)
    w, r = fl.connect(first.url).do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
    for seq in range(3):
        w.write_with_metadata(batch(seq), meta("gw", seq))
        assert ack(r)["status"] == "committed"
    w.write_with_metadata(batch(1), meta("gw", 1))  # a resend in the same put
    assert ack(r) == {"seq": 1, "status": "duplicate"}
    w.close()
    first.stop(5)
    # A new server knows the writer's last seq from the log alone (stored with the rows).
    second = RowtimeFlightServer(Streams(str(root)), port=0)
    try:
        w, r = fl.connect(second.url).do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
        w.write_with_metadata(batch(2), meta("gw", 2))
        assert ack(r) == {"seq": 2, "status": "duplicate"}
        w.write_with_metadata(batch(3), meta("gw", 3))
        assert ack(r) == {"seq": 3, "status": "committed"}
        w.close()
    finally:
        second.stop(5)
    assert ids_of(root) == [0, 1, 2, 3]


def refusal(e: fl.FlightError) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(e.extra_info)
    return doc


def test_a_seq_past_the_next_one_is_refused_naming_the_one_expected(
    server: RowtimeFlightServer, root: Path
) -> None:
    w, r = fl.connect(server.url).do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
    w.write_with_metadata(batch(0), meta("gw", 0))
    assert ack(r)["status"] == "committed"
    w.write_with_metadata(batch(5), meta("gw", 5))
    with pytest.raises(fl.FlightServerError, match="the next one expected is 1") as e:
        r.read()
        w.close()
    assert refusal(e.value) == {"status": "refused", "reason": "gap", "expected": 1}
    assert ids_of(root) == [0]


def test_a_first_message_must_be_seq_0(server: RowtimeFlightServer, root: Path) -> None:
    w, r = fl.connect(server.url).do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
    w.write_with_metadata(batch(0), meta("new", 1))
    with pytest.raises(fl.FlightServerError, match="the next one expected is 0"):
        r.read()
        w.close()
    assert ids_of(root) == []


def test_a_second_writer_on_a_held_partition_is_refused_naming_the_holder(
    server: RowtimeFlightServer, root: Path
) -> None:
    client = fl.connect(server.url)
    w1, r1 = client.do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
    w1.write_with_metadata(batch(0), meta("gw-a", 0))
    assert ack(r1)["status"] == "committed"
    w2, r2 = client.do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
    w2.write_with_metadata(batch(100), meta("gw-b", 0))
    with pytest.raises(fl.FlightUnavailableError, match="held by writer 'gw-a'") as e:
        r2.read()
        w2.close()
    assert refusal(e.value)["holder"] == "gw-a"
    # the other partition is free, and the partition is free again once gw-a's put ends
    w3, r3 = client.do_put(fl.FlightDescriptor.for_path("orders", "1"), SCHEMA)
    w3.write_with_metadata(batch(200), meta("gw-b", 0))
    assert ack(r3)["status"] == "committed"
    w3.close()
    w1.close()
    w4, r4 = client.do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
    w4.write_with_metadata(batch(101), meta("gw-b", 0))
    assert ack(r4)["status"] == "committed"
    w4.close()
    assert sorted(ids_of(root)) == [0, 101, 200]


def test_the_same_writer_reconnecting_takes_its_partition_over(
    server: RowtimeFlightServer, root: Path
) -> None:
    client = fl.connect(server.url)
    old_w, old_r = client.do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
    old_w.write_with_metadata(batch(0), meta("gw", 0))
    assert ack(old_r)["status"] == "committed"
    new_w, new_r = client.do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)  # old not closed
    new_w.write_with_metadata(batch(1), meta("gw", 1))
    assert ack(new_r)["status"] == "committed"
    old_w.write_with_metadata(batch(2), meta("gw", 2))
    with pytest.raises(fl.FlightUnavailableError, match="held by another put"):
        old_r.read()
        old_w.close()
    new_w.close()
    assert ids_of(root) == [0, 1]


def test_a_refused_message_stores_nothing_and_takes_no_seq(
    server: RowtimeFlightServer, root: Path
) -> None:
    client = fl.connect(server.url)
    w, r = client.do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
    w.write_with_metadata(batch(0), meta("gw", 0, bound=T0 + 50))
    assert ack(r)["status"] == "committed"
    # rows and a bound below the clock: refused whole, rows included
    w.write_with_metadata(batch(1), meta("gw", 1, bound=T0 + 10))
    with pytest.raises(fl.FlightServerError, match="below the clock") as e:
        r.read()
        w.close()
    assert refusal(e.value)["reason"] == "invalid"
    w, r = client.do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
    w.write_with_metadata(batch(60), meta("gw", 1))  # seq 1 again, a message that can be stored
    assert ack(r) == {"seq": 1, "status": "committed"}
    w.close()
    assert ids_of(root) == [0, 60]


@pytest.mark.parametrize(
    ("app_metadata", "why"),
    [
        (None, "needs app_metadata"),
        (b"not json", "not JSON"),
        (b'{"writer": "gw"}', "seq None"),
        (b'{"writer": "", "seq": 0}', "writer ''"),
        (b'{"writer": "gw", "seq": -1}', "seq -1"),
        (b'{"writer": "gw", "seq": 0, "bound": true}', "bound True"),
        (b'{"writer": "gw", "seq": 0, "extra": 1}', "unknown keys"),
    ],
)
def test_a_message_without_valid_metadata_is_refused(
    server: RowtimeFlightServer, root: Path, app_metadata: bytes | None, why: str
) -> None:
    w, r = fl.connect(server.url).do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
    if app_metadata is None:
        w.write_batch(batch(0))
    else:
        w.write_with_metadata(batch(0), app_metadata)
    with pytest.raises(fl.FlightServerError, match=why):
        r.read()
        w.close()
    assert ids_of(root) == []


def test_unknown_streams_partitions_and_columns_are_refused(
    server: RowtimeFlightServer, root: Path
) -> None:
    client = fl.connect(server.url)
    for path, why in (
        (["nope"], r"no stream 'nope' is served here .*; the streams are: orders"),
        (["../orders"], "no stream '../orders'"),
        (["orders", "2"], "partition 2 does not exist"),
        (["orders", "x"], "must be decimal digits"),
    ):
        with pytest.raises(fl.FlightError, match=why):
            w, r = client.do_put(fl.FlightDescriptor.for_path(*path), SCHEMA)
            w.write_with_metadata(batch(0), meta("gw", 0))
            r.read()
            w.close()
    schema = pa.schema([("id", pa.int64()), ("price", pa.float64())])
    w, r = client.do_put(fl.FlightDescriptor.for_path("orders"), schema)
    data = pa.record_batch([pa.array([1], pa.int64()), pa.array([1.5])], schema=schema)
    w.write_with_metadata(data, meta("gw", 0))
    with pytest.raises(fl.FlightServerError, match=r"'price' that .* does not have"):
        r.read()
        w.close()
    assert ids_of(root) == []


def test_list_flights_and_flight_info_give_schema_partitions_and_clock(
    server: RowtimeFlightServer, root: Path
) -> None:
    create_stream(str(root / "team" / "clicks"), "url STRING", 1)
    client = fl.connect(server.url)
    names = [i.descriptor.path[0].decode() for i in client.list_flights()]
    assert names == ["orders", "team/clicks"]
    info = client.get_flight_info(fl.FlightDescriptor.for_path("orders"))
    assert info.schema == pa.schema(
        [("id", pa.int64()), ("name", pa.string()), ("rowtime", pa.timestamp("us", tz="UTC"))]
    )
    assert json.loads(info.app_metadata)["partitions"] == 2
    with pytest.raises(fl.FlightServerError, match="no stream 'missing'"):
        client.get_flight_info(fl.FlightDescriptor.for_path("missing"))


def test_the_writer_action_says_the_next_seq(server: RowtimeFlightServer) -> None:
    client = fl.connect(server.url)

    def next_seq() -> int:
        body = json.dumps({"stream": "orders", "partition": 0, "writer": "gw"}).encode()
        return int(
            json.loads(next(iter(client.do_action(fl.Action("writer", body)))).body.to_pybytes())[
                "next_seq"
            ]
        )

    assert next_seq() == 0
    w, r = client.do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
    for seq in range(2):
        w.write_with_metadata(batch(seq), meta("gw", seq))
        ack(r)
    w.close()
    assert next_seq() == 2


def test_a_message_over_the_limit_is_refused_naming_it(root: Path) -> None:
    server = RowtimeFlightServer(Streams(str(root)), port=0, max_message_bytes=4096)
    try:
        w, r = fl.connect(server.url).do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
        w.write_with_metadata(batch(0, 10), meta("gw", 0))
        assert ack(r)["status"] == "committed"
        w.write_with_metadata(batch(10, 1000), meta("gw", 1))
        with pytest.raises(
            fl.FlightServerError, match="over this server's --max-message-bytes 4096"
        ) as e:
            r.read()
            w.close()
        assert refusal(e.value)["limit"] == 4096
    finally:
        server.stop(5)
    assert ids_of(root) == list(range(10))


def test_the_api_writes_between_puts_and_the_record_is_kept(
    server: RowtimeFlightServer, root: Path
) -> None:
    """An in-process writer's segments carry no record: the server finds the last one before
    them, and the partition's lock is free between puts."""
    client = fl.connect(server.url)
    w, r = client.do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
    w.write_with_metadata(batch(0), meta("gw", 0))
    ack(r)
    w.close()
    with open_writer(str(root / "orders"), 0) as local:
        local.insert({"id": 99}, rowtime=(T0 + 1) // 1000)
    w, r = client.do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
    w.write_with_metadata(batch(0), meta("gw", 0))
    assert ack(r)["status"] == "duplicate"
    w.close()
    assert ids_of(root) == [0, 99]


# -- the record on every backend ------------------------------------------------------------------


BACKENDS = ["local", "redis", "s3", "azure"]


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from redis_server import redis_server, why_no_server

    why = why_no_server()
    if why:
        pytest.skip(why)
    with redis_server(tmp_path_factory.mktemp("redis")) as s:
        yield s


_names = iter(range(10**6))


@pytest.fixture(params=BACKENDS)
def at(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    kind = request.param
    if kind == "local":
        return lambda name: str(tmp_path / f"{name}{next(_names)}")
    if kind == "redis":
        server = request.getfixturevalue("redis")
        return lambda name: str(server.url(f"{name}{next(_names)}"))
    objects = request.getfixturevalue("s3_server" if kind == "s3" else "az_server")
    return lambda name: str(objects.url(name))


def test_the_writers_record_is_stored_with_the_rows_on_every_backend(
    at: Callable[[str], str], tmp_path: Path
) -> None:
    loc = at("rec")
    create_stream(loc, "id BIGINT", 1)
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(f'[streams.s]\nlocation = "{loc}"\nschema = "id BIGINT"\n')
    server = RowtimeFlightServer(Streams(catalog=str(catalog)), port=0)
    try:
        client = fl.connect(server.url)
        for i, writer in enumerate(["w0", "w1", "w0"]):  # three puts, one after another
            w, r = client.do_put(fl.FlightDescriptor.for_path("s"), pa.schema([("id", pa.int64())]))
            data = pa.record_batch([pa.array([i], pa.int64())], names=["id"])
            w.write_with_metadata(data, meta(writer, i // 2))
            assert ack(r)["status"] == "committed"
            w.close()
    finally:
        server.stop(5)
    assert load_producers(open_stream(loc), 0) == {"w1": 0, "w0": 1}


# -- real server processes ----------------------------------------------------------------------


def send_all(
    url: str, writer: str, messages: list[pa.RecordBatch], *, window: int = 8,
    deadline_s: float = 60, on_sent: Callable[[int, int], None] | None = None,
) -> dict[str, int]:  # fmt: skip
    """Send ``messages`` (seq = index) as a careful client does: at most ``window``
    unacknowledged, and after any error a new put that resends everything not acknowledged,
    until every message is acknowledged. Returns how many answers of each status came."""
    statuses: dict[str, int] = {}
    acked = 0
    deadline = time.monotonic() + deadline_s
    opts = fl.FlightCallOptions(timeout=5)
    while acked < len(messages):
        assert time.monotonic() < deadline, f"{acked} of {len(messages)} acknowledged"
        try:
            client = fl.connect(url)
            w, r = client.do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA, opts)
            sent = acked
            while acked < len(messages):
                while sent < len(messages) and sent - acked < window:
                    w.write_with_metadata(messages[sent], meta(writer, sent))
                    sent += 1
                    if on_sent is not None:
                        on_sent(sent, acked)
                doc = ack(r)
                assert doc["seq"] == acked, doc
                statuses[doc["status"]] = statuses.get(doc["status"], 0) + 1
                acked += 1
            w.close()
        except (fl.FlightError, OSError, AssertionError) as e:
            if isinstance(e, AssertionError) and "without an answer" not in str(e):
                raise
            time.sleep(0.05)
    return statuses


def test_sigkill_during_puts_then_resending_what_was_not_acknowledged_stores_each_once(
    root: Path,
) -> None:
    n, rows = 120, 64
    messages = [batch(i * rows, rows) for i in range(n)]
    served = Served("--root", str(root))
    killed = threading.Event()
    stream = open_stream(str(root / "orders"))

    def on_sent(sent: int, acked: int) -> None:
        if sent == 48 and not killed.is_set():
            # Every message sent is committed, some not acknowledged yet: kill the server now.
            deadline = time.monotonic() + 20
            while stream.end_offset(0) < sent * rows:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            killed.set()
            served.kill()
            threading.Timer(0.3, served.start).start()

    with served:
        statuses = send_all(served.url, "gw", messages, on_sent=on_sent)
    assert killed.is_set()
    ids = ids_of(root)
    assert sorted(ids) == list(range(n * rows)), "every row once, none lost"
    assert statuses["committed"] + statuses["duplicate"] == n
    assert statuses["duplicate"] >= 1  # committed before the kill, resent, stored once


def test_through_a_faulty_network_every_message_is_stored_once(root: Path) -> None:
    n, rows = 150, 16
    messages = [batch(i * rows, rows) for i in range(n)]
    faults = Faults(reset=0.02, drop=0.02, cut=0.02, latency=0.05, latency_s=0.01)
    with Served("--root", str(root)) as served, FaultProxy(served.port, 52, faults) as proxy:
        statuses = send_all(f"grpc://127.0.0.1:{proxy.port}", "gw", messages, window=4)
    assert proxy.injected > 0, proxy.summary()
    assert sorted(ids_of(root)) == list(range(n * rows)), proxy.summary()
    assert statuses["committed"] + statuses.get("duplicate", 0) == n


def test_sigterm_stops_within_10_s_with_a_put_open(root: Path) -> None:
    with Served("--root", str(root)) as served:
        w, r = fl.connect(served.url).do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
        w.write_with_metadata(batch(0), meta("gw", 0))
        assert ack(r)["status"] == "committed"
        # the client now stays silent with its put open
        took = served.stop()
    assert took < 10
    assert served.proc is not None and served.proc.returncode == 0
    assert ids_of(root) == [0]


def test_with_a_token_file_a_call_without_the_token_is_unauthenticated(
    root: Path, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("s3cret-one\ns3cret-two\n")
    tokens.chmod(0o600)
    with Served("--root", str(root), "--token-file", str(tokens)) as served:
        client = fl.connect(served.url)
        with pytest.raises(fl.FlightUnauthenticatedError):
            list(client.list_flights())
        bad = fl.FlightCallOptions(headers=[(b"authorization", b"Bearer nope")])
        with pytest.raises(fl.FlightUnauthenticatedError):  # at the call or its first write
            w, r = client.do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA, bad)
            w.write_with_metadata(batch(0), meta("gw", 0))
            r.read()
            w.close()
        good = fl.FlightCallOptions(headers=[(b"authorization", b"Bearer s3cret-two")])
        w, r = client.do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA, good)
        w.write_with_metadata(batch(1), meta("gw", 0))
        assert ack(r)["status"] == "committed"
        w.close()
    assert ids_of(root) == [1]
    assert all("s3cret" not in line for line in served.lines)


def test_a_token_file_others_may_read_is_refused(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("s3cret\n")
    tokens.chmod(0o644)
    assert main(["serve", "--root", str(root), "--token-file", str(tokens), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "may be read or written by others (mode 0644)" in err and "chmod 600" in err
    assert "s3cret" not in err


def test_a_non_loopback_address_needs_a_token_or_tls(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--root", str(root), "--host", "0.0.0.0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "--host 0.0.0.0 is not a loopback address" in err and "--token-file" in err


def test_the_commands_defaults_are_the_servers() -> None:
    from pyspark_rowtime import flight_server, serve_cli

    assert serve_cli.DEFAULT_PORT == flight_server.DEFAULT_PORT == 8815
    assert serve_cli.DEFAULT_MAX_MESSAGE_BYTES == flight_server.DEFAULT_MAX_MESSAGE_BYTES


def test_serve_help_says_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    for option in (
        "--root", "--catalog", "--host", "--port", "--token-file", "--tls-cert", "--tls-key",
        "--max-message-bytes", "--metrics-port",
    ):  # fmt: skip
        assert option in out


def test_tls_serves_a_client_that_trusts_the_certificate(root: Path, tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    made = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        capture_output=True, check=False,
    )  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"openssl cannot make a certificate here: {made.stderr[-200:]!r}")
    os.chmod(key, 0o600)
    with Served("--root", str(root), "--tls-cert", str(cert), "--tls-key", str(key)) as served:
        client = fl.connect(f"grpc+tls://127.0.0.1:{served.port}", tls_root_certs=cert.read_bytes())
        w, r = client.do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
        w.write_with_metadata(batch(0), meta("gw", 0))
        assert ack(r)["status"] == "committed"
        w.close()
    assert ids_of(root) == [0]


def test_the_record_survives_the_embedded_logs_merges(
    server: RowtimeFlightServer, root: Path
) -> None:
    """40 one-row messages make 40 small segments, which the log merges sixteen at a time
    (streams/local/log.py compact_tail): the merged footer keeps the last record."""
    w, r = fl.connect(server.url).do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
    for seq in range(40):
        w.write_with_metadata(batch(seq), meta("gw", seq))
        assert ack(r)["status"] == "committed"
    w.close()
    stream = open_stream(str(root / "orders"))
    assert len(stream.partition_stats(0)) < 40  # merged
    assert load_producers(stream, 0) == {"gw": 39}
    w, r = fl.connect(server.url).do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
    w.write_with_metadata(batch(39), meta("gw", 39))
    assert ack(r)["status"] == "duplicate"
    w.close()
    assert ids_of(root) == list(range(40))


def test_sigterm_while_a_client_streams_stores_whole_messages_and_each_acknowledged_one(
    root: Path,
) -> None:
    rows = 512
    messages = [batch(i * rows, rows) for i in range(400)]
    acked: list[int] = []
    with Served("--root", str(root)) as served:
        w, r = fl.connect(served.url).do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)

        def read_acks() -> None:
            try:
                while (doc := r.read()) is not None:
                    acked.append(json.loads(doc.to_pybytes())["seq"])
            except fl.FlightError:
                pass

        reader = threading.Thread(target=read_acks, daemon=True)
        reader.start()
        try:
            for seq, m in enumerate(messages):
                w.write_with_metadata(m, meta("gw", seq))
                if seq == 20:
                    threading.Timer(0.05, served.proc.send_signal, (signal.SIGTERM,)).start()  # type: ignore[union-attr]
        except (fl.FlightError, OSError):
            pass  # the server went away mid-stream
        assert served.proc is not None
        served.proc.wait(10)  # SIGTERM stops it within 10 s
        reader.join(10)
    ids = ids_of(root)
    assert len(ids) % rows == 0, "whole messages only"
    stored = len(ids) // rows
    assert ids == list(range(stored * rows))
    assert acked == list(range(len(acked))) and len(acked) <= stored
    assert stored < len(messages)  # it did stop in the middle


# -- the rule, for any order of sends ---------------------------------------------------------


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.one_of(st.integers(0, 6), st.just("restart")), min_size=1, max_size=14))
def test_any_order_of_sends_and_restarts_stores_each_seq_once_in_order(
    tmp_path_factory: pytest.TempPathFactory, sends: list[int | str]
) -> None:
    """Whatever a client sends (resends, gaps, seqs out of order) and whenever the server
    restarts, the answers follow the rule (at or below the last committed: duplicate; the
    next: committed; past it: refused naming it) and the stream holds seqs 0..last once each,
    in order. Message k carries row k."""
    root = tmp_path_factory.mktemp("any")
    create_stream(str(root / "orders"), "id BIGINT, name STRING", 2)
    server = RowtimeFlightServer(Streams(str(root)), port=0)
    put: tuple[Any, Any] | None = None
    last = -1
    try:
        for send in sends:
            if send == "restart":
                if put is not None:
                    put[0].close()
                    put = None
                server.stop(5)
                server = RowtimeFlightServer(Streams(str(root)), port=0)
                continue
            assert isinstance(send, int)
            if put is None:
                put = fl.connect(server.url).do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
            w, r = put
            w.write_with_metadata(batch(send), meta("gw", send))
            if send > last + 1:
                with pytest.raises(fl.FlightServerError, match=f"expected is {last + 1} "):
                    r.read()
                    w.close()
                put = None
                continue
            want = "duplicate" if send <= last else "committed"
            assert ack(r) == {"seq": send, "status": want}
            last = max(last, send)
        if put is not None:
            put[0].close()
    finally:
        server.stop(5)
    assert ids_of(root) == list(range(last + 1))

"""``rowtime serve`` for operators: a catalog's ``[servers.NAME]``, Prometheus metrics per
writer, and the memory a client that stops reading its acknowledgements can make it hold."""

from __future__ import annotations

import os
import threading
import urllib.request
from pathlib import Path

import pyarrow.flight as fl
import pytest
from test_serve import SCHEMA, Served, ack, batch, free_port, ids_of, meta

from pyspark_rowtime.api import create_stream, read_stream
from pyspark_rowtime.flight_server import RowtimeFlightServer, Streams
from pyspark_rowtime.serve_cli import metrics_registry
from pyspark_rowtime.streams.catalog import CatalogError, load_catalog

prometheus = pytest.importorskip("prometheus_client")


def write_catalog(folder: Path, server: str) -> Path:
    path = folder / "rowtime.toml"
    path.write_text(
        '[streams.orders]\nlocation = "data/orders"\nschema = "id BIGINT, name STRING"\n\n'
        '[streams.other]\nlocation = "data/other"\nschema = "id BIGINT"\n\n' + server
    )
    return path


def test_rowtime_serve_name_takes_its_options_from_the_catalog(tmp_path: Path) -> None:
    port, metrics_port = free_port(), free_port()
    tokens = tmp_path / "tokens"
    tokens.write_text("tok-catalog\n")
    tokens.chmod(0o600)
    catalog = write_catalog(
        tmp_path,
        f'[servers.ingest]\nstreams = ["orders"]\nport = {port}\ntoken_file = "tokens"\n'
        f"metrics_port = {metrics_port}\n",
    )
    # not created: the server creates a catalog's stream from its entry when first served
    auth = fl.FlightCallOptions(headers=[(b"authorization", b"Bearer tok-catalog")])
    with Served("ingest", "--catalog", str(catalog), port=port) as served:
        client = fl.connect(served.url)
        with pytest.raises(fl.FlightUnauthenticatedError):
            list(client.list_flights())
        names = [i.descriptor.path[0].decode() for i in client.list_flights(options=auth)]
        assert names == ["orders"]  # the server's streams only
        w, r = client.do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA, auth)
        w.write_with_metadata(batch(0, 4), meta("gw-7", 0))
        assert ack(r)["status"] == "committed"
        w.write_with_metadata(batch(0, 4), meta("gw-7", 0))
        assert ack(r)["status"] == "duplicate"
        w.close()
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read()
    text = scraped.decode()
    labels = 'partition="0",stream="orders",writer="gw-7"'
    assert f"rowtime_serve_rows_total{{{labels}}} 4.0" in text
    assert f"rowtime_serve_duplicates_total{{{labels}}} 1.0" in text
    assert (
        'rowtime_serve_refusals_total{partition="",reason="auth",stream="",writer=""} 1.0' in text
    )
    assert "tok-catalog" not in text
    assert read_stream(str(tmp_path / "data" / "orders")).num_rows == 4


@pytest.mark.parametrize(
    ("server", "why"),
    [
        ("[servers.s]\nprot = 1\n", r"servers\.s\.prot = 1: unknown key; a server accepts: root"),
        ('[servers.s]\nstreams = ["nope"]\n', "no stream 'nope' in this catalog; it has: orders"),
        ("[servers.s]\nport = 70000\n", "must be the port, 0 to 65535"),
        ('[servers.s]\ntoken = "x"\n', "secrets are never written in a catalog"),
    ],
)
def test_a_catalogs_server_entry_is_checked_at_its_line(
    tmp_path: Path, server: str, why: str
) -> None:
    with pytest.raises(CatalogError, match=why):
        load_catalog(write_catalog(tmp_path, server))


def test_a_catalog_server_keeps_paths_relative_to_the_catalog(tmp_path: Path) -> None:
    catalog = load_catalog(write_catalog(tmp_path, '[servers.s]\nroot = "streams"\n'))
    assert catalog.servers == {"s": {"root": str(tmp_path / "streams")}}


def test_metrics_count_messages_rows_duplicates_and_refusals_per_writer(tmp_path: Path) -> None:
    create_stream(str(tmp_path / "orders"), "id BIGINT, name STRING", 1)
    server = RowtimeFlightServer(Streams(str(tmp_path)), port=0)
    try:
        client = fl.connect(server.url)
        w, r = client.do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
        w.write_with_metadata(batch(0, 2), meta("a", 0))
        w.write_with_metadata(batch(0, 2), meta("a", 0))
        w.write_metadata(meta("a", 1, bound="2030-01-01T00:00:00Z"))
        w.write_with_metadata(batch(2), meta("a", 9))
        assert [ack(r)["status"] for _ in range(3)] == ["committed", "duplicate", "committed"]
        with pytest.raises(fl.FlightServerError, match="the next one expected is 2"):
            r.read()
            w.close()
        text = prometheus.generate_latest(metrics_registry(server)).decode()
    finally:
        server.stop(5)
    labels = 'partition="0",stream="orders",writer="a"'
    for line in (
        f"rowtime_serve_messages_total{{{labels}}} 2.0",
        f"rowtime_serve_rows_total{{{labels}}} 2.0",
        f"rowtime_serve_bounds_total{{{labels}}} 1.0",
        f"rowtime_serve_duplicates_total{{{labels}}} 1.0",
        'rowtime_serve_refusals_total{partition="0",reason="gap",stream="orders",writer="a"} 1.0',
    ):
        assert line in text, text


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon")


@pytest.mark.skipif(
    os.environ.get("ROWTIME_LONG") != "1",
    reason="a memory measurement: ./dev long runs it (ROWTIME_LONG=1); under CI's load the "
    "server held 107 MB of 182 MB sent, see docs/adapters/any-language.md",
)
def test_a_client_that_stops_reading_acknowledgements_is_held_back_not_buffered(
    tmp_path: Path,
) -> None:
    """The server reads, commits and answers one message at a time, and keeps nothing of a
    message once answered: what a client that never reads its answers sends ahead is held by
    gRPC's flow-control window (then the client is held back), not by the server. Its
    anonymous memory levels off whatever the client sends (measured: about 20 to 40 MB above
    the start for 35 MB to 180 MB sent, with spells of up to 70 MB at 90 MB sent: what the
    allocator keeps of the messages it read, not what waits in the server). So the client sends
    180 MB, and the server may hold half of it at the most: a server that buffered what the
    client sends ahead would hold all of it."""
    create_stream(str(tmp_path / "orders"), "id BIGINT, name STRING", 1)
    rows, n = 8192, 800  # 0.23 MB a message, 180 MB in all
    messages = [batch(i * rows, rows) for i in range(n)]
    with Served("--root", str(tmp_path)) as served:
        assert served.proc is not None
        client = fl.connect(served.url)
        w, r = client.do_put(fl.FlightDescriptor.for_path("orders"), SCHEMA)
        w.write_with_metadata(messages[0], meta("gw", 0))
        assert ack(r)["status"] == "committed"
        before = rss_bytes(served.proc.pid)
        peak = before
        done = threading.Event()

        def send() -> None:
            for seq in range(1, n):
                w.write_with_metadata(messages[seq], meta("gw", seq))
            done.set()

        threading.Thread(target=send, daemon=True).start()
        while not done.wait(0.05):
            peak = max(peak, rss_bytes(served.proc.pid))
        peak = max(peak, rss_bytes(served.proc.pid))
        answers = [ack(r) for _ in range(1, n)]
        w.close()
    assert [a["seq"] for a in answers] == list(range(1, n))
    total = sum(m.get_total_buffer_size() for m in messages)
    assert peak - before < total / 2, (peak - before, total)
    assert ids_of(tmp_path) == list(range(n * rows))


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["nope"], "no server 'nope' in catalog"),
        (["--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
        (["--max-message-bytes", "0"], "--max-message-bytes 0 must be at least 1"),
        (["--port", "70000"], "--port 70000 must be a port"),
    ],
)
def test_serve_refuses_what_cannot_work_before_it_listens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], why: str
) -> None:
    from pyspark_rowtime.cli import main

    catalog = write_catalog(tmp_path, '[servers.ingest]\nstreams = ["orders"]\n')
    assert main(["serve", *args, "--catalog", str(catalog)]) == 2
    assert why in capsys.readouterr().err

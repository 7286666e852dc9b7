"""``rowtime serve``'s command: its arguments, its options (checked before anything listens),
the catalog's ``[servers.NAME]``, signals. The server itself is ``flight_server``, imported
only when a server starts: Arrow Flight's library (gRPC) is loaded by no other command.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import stat
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .bounds.errors import OptionError
from .streams.catalog import find_catalog, load_catalog

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_PORT",
    "ServeOptions",
    "add_serve_parser",
    "check_options",
    "cmd_serve",
    "metrics_registry",
    "read_tokens",
]

#: The same as ``flight_server.DEFAULT_PORT`` and ``DEFAULT_MAX_MESSAGE_BYTES`` (a test
#: holds them equal), here so that the parser needs no Flight.
DEFAULT_PORT = 8815
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20


# -- options -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServeOptions:
    """What ``rowtime serve`` was told (checked by ``check_options``)."""

    root: str | None = None
    catalog: str | None = None
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    token_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    metrics_port: int | None = None
    #: The catalog's streams served (None: all of them).
    streams: tuple[str, ...] | None = None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_options(o: ServeOptions) -> None:
    """Refuse what would serve streams to anyone, or cannot work, saying why."""
    if o.root is None and o.catalog is None:
        raise OptionError(
            "rowtime serve needs --root DIR or --catalog FILE (the streams it serves)"
        )
    if o.root is not None and not os.path.isdir(o.root):
        raise OptionError(f"--root {o.root} is not a folder")
    if (o.tls_cert is None) != (o.tls_key is None):
        raise OptionError("--tls-cert and --tls-key go together: give both, or neither")
    if not 0 <= o.port < 65536:
        raise OptionError(f"--port {o.port} must be a port, 0 (any free one) to 65535")
    if o.max_message_bytes < 1:
        raise OptionError(f"--max-message-bytes {o.max_message_bytes} must be at least 1")
    if not is_loopback(o.host) and o.token_file is None and o.tls_cert is None:
        raise OptionError(
            f"--host {o.host} is not a loopback address, and without --token-file or TLS "
            "(--tls-cert, --tls-key) anyone who can reach it could write to the streams: give "
            "--token-file (with TLS, so the token never crosses the network in clear), or "
            "listen on 127.0.0.1"
        )


def read_tokens(path: str) -> list[bytes]:
    """The bearer tokens in ``path``, one a line (blank lines skipped). A file that others
    than its owner may read or write is refused, as ssh refuses such a key."""
    try:
        mode = os.stat(path).st_mode
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise OptionError(f"--token-file {path} cannot be read: {e.strerror or e}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise OptionError(
            f"--token-file {path} may be read or written by others (mode "
            f"{stat.S_IMODE(mode):04o}): the tokens in it would not be secret. Run "
            f"`chmod 600 {path}`"
        )
    tokens = [line.strip() for line in text.splitlines() if line.strip()]
    if not tokens:
        raise OptionError(f"--token-file {path} holds no token (one a line)")
    return tokens


def add_serve_parser(sub: Any) -> None:
    """``rowtime serve``'s arguments (the server itself: ``flight_server``)."""
    p = sub.add_parser(
        "serve",
        help="an Arrow Flight endpoint: adapters in any language write rows and bounds",
        description="Serve streams over Arrow Flight (DoPut of rows and bounds, exactly once "
        "by writer and seq; Flight SQL bulk ingest for ADBC; the clock and schemas). "
        "Listens on 127.0.0.1 unless --host says otherwise; a non-loopback address needs "
        "--token-file or TLS. SIGTERM stops it within 10 s. See docs/adapters/any-language.md.",
    )
    p.add_argument(
        "server", nargs="?", metavar="NAME", help="a server of the catalog ([servers.NAME])"
    )
    p.add_argument("--root", metavar="DIR", help="serve the streams below DIR, by relative path")
    p.add_argument(
        "--catalog", metavar="FILE", help="serve the catalog's streams, by name (and its servers)"
    )
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8815; 0: any free one, printed)")
    p.add_argument(
        "--token-file",
        metavar="F",
        help="bearer tokens, one a line (mode 600): every call needs `authorization: Bearer T`",
    )
    p.add_argument("--tls-cert", metavar="PEM", help="TLS certificate chain (with --tls-key)")
    p.add_argument("--tls-key", metavar="PEM", help="TLS private key (with --tls-cert)")
    p.add_argument(
        "--max-message-bytes",
        type=int,
        metavar="N",
        help="largest message (batch) taken, in bytes (default 67108864 = 64 MiB)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="N",
        help="serve Prometheus metrics per writer at http://HOST:N/metrics (needs "
        "pyspark-rowtime[metrics])",
    )
    p.set_defaults(func=cmd_serve)


# -- the command ------------------------------------------------------------------------------


def options_from(args: argparse.Namespace) -> ServeOptions:
    """The options of ``rowtime serve``: the command line over the catalog's ``[servers.NAME]``."""
    base: dict[str, Any] = {}
    if args.server is not None:
        path = find_catalog(args.catalog, None, needed_for="rowtime serve NAME")
        base = server_entry(path, args.server)
        if "root" in base and "streams" not in base:
            base["streams"] = ()  # a root alone: not the catalog's streams too
        if "streams" in base:
            base["streams"] = tuple(base["streams"])
        base["catalog"] = path
    elif args.catalog is not None:
        base["catalog"] = args.catalog
    for key in ServeOptions.__dataclass_fields__:
        value = getattr(args, key, None)
        if value is not None:
            base[key] = value
    return ServeOptions(**base)


def server_entry(catalog_path: str, name: str) -> dict[str, Any]:
    """``[servers.NAME]`` of a catalog, as ``ServeOptions`` fields (paths relative to the
    catalog's folder)."""
    catalog = load_catalog(catalog_path)
    if name not in catalog.servers:
        known = ", ".join(sorted(catalog.servers)) or "(none)"
        raise OptionError(
            f"no server {name!r} in catalog {catalog.path} ([servers.{name}]); its servers "
            f"are: {known}"
        )
    return dict(catalog.servers[name])


def cmd_serve(args: argparse.Namespace, out: Any = None) -> int:
    """Run ``rowtime serve`` until SIGTERM or SIGINT: options checked first (nothing listens
    before they hold), then the server, its first line on ``out`` (stderr) saying where it
    listens; on the signal, ``flight_server.RowtimeFlightServer.stop``."""
    out = out or sys.stderr
    o = options_from(args)
    check_options(o)
    tokens = read_tokens(o.token_file) if o.token_file else []
    tls = None
    if o.tls_cert and o.tls_key:
        try:
            with open(o.tls_cert, "rb") as c, open(o.tls_key, "rb") as k:
                tls = (c.read(), k.read())
        except OSError as e:
            raise OptionError(f"TLS certificate or key cannot be read: {e}") from None
    from .flight_server import RowtimeFlightServer, Streams

    streams = Streams(o.root, o.catalog, o.streams)
    metrics = None
    if o.metrics_port is not None:
        try:
            from prometheus_client import start_http_server
        except ImportError:
            raise OptionError(
                "--metrics-port needs the Prometheus client: pip install 'pyspark-rowtime[metrics]'"
            ) from None
    server = RowtimeFlightServer(
        streams,
        host=o.host,
        port=o.port,
        tokens=tokens,
        tls=tls,
        max_message_bytes=o.max_message_bytes,
    )
    if o.metrics_port is not None:
        metrics = start_http_server(o.metrics_port, o.host, registry=metrics_registry(server))
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    what = ", ".join(x for x in (o.root and f"streams below {o.root}", o.catalog) if x)
    print(f"rowtime serve: listening on {server.url} ({what})", file=out, flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        started = time.monotonic()
        ended = server.stop()
        if isinstance(metrics, tuple):  # (server, thread) from prometheus-client 0.20 on
            metrics[0].shutdown()
        print(
            f"rowtime serve: stopped in {time.monotonic() - started:.1f} s"
            + ("" if ended else " (puts still open were cut; nothing is half stored)"),
            file=out,
            flush=True,
        )
        if not ended:
            out.flush()
            os._exit(0)  # a handler blocked on a silent client: its commits are atomic
    return 0


# -- metrics ------------------------------------------------------------------------------------


def metrics_registry(server: Any) -> Any:
    """A Prometheus registry with the counters of a ``flight_server.RowtimeFlightServer``
    per stream, partition and writer (a writer's name is what its client chose; no token or
    header value is a label), and the bytes of messages it holds now."""
    from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily

    class Collector:
        def collect(self) -> Iterator[Any]:
            labels = ["stream", "partition", "writer"]
            fams = {
                "messages": CounterMetricFamily(
                    "rowtime_serve_messages", "Messages committed", labels=labels
                ),
                "rows": CounterMetricFamily("rowtime_serve_rows", "Rows committed", labels=labels),
                "bounds": CounterMetricFamily(
                    "rowtime_serve_bounds", "Bounds committed", labels=labels
                ),
                "duplicates": CounterMetricFamily(
                    "rowtime_serve_duplicates", "Messages answered duplicate", labels=labels
                ),
            }
            refused = CounterMetricFamily(
                "rowtime_serve_refusals", "Messages refused", labels=[*labels, "reason"]
            )
            counts, early = server.snapshot()
            for (stream, partition, writer), c in counts.items():
                values = [stream, str(partition), writer]
                for key, fam in fams.items():
                    fam.add_metric(values, getattr(c, key))
                for reason, n in c.refusals.items():
                    refused.add_metric([*values, reason], n)
            for reason, n in early.items():
                refused.add_metric(["", "", "", reason], n)
            yield from fams.values()
            yield refused
            yield GaugeMetricFamily(
                "rowtime_serve_held_bytes",
                "Bytes of messages read and not yet committed or refused (one message a put at "
                "the most; gRPC's own buffers not included)",
                value=server.memory.held,
            )

    registry = CollectorRegistry()
    registry.register(Collector())
    return registry

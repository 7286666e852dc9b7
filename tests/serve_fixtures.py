"""What the tests of ``rowtime serve`` share (tests/test_serve*.py): a stream and a server in
this process (the ``root`` and ``server`` fixtures), the protocol's messages and answers, and
``rowtime serve`` as a process (:class:`Served`). A test module takes the fixtures by importing
``root_fixture`` and ``server_fixture``: pytest finds a fixture in the module's namespace, by
its ``name``."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest

from pyspark_rowtime.api import create_stream, read_stream
from pyspark_rowtime.flight_server import RowtimeFlightServer, Streams

T0 = 1_700_000_000_000_000  # 2023-11-14T22:13:20Z in microseconds
SCHEMA = pa.schema(
    [("id", pa.int64()), ("name", pa.string()), ("rowtime", pa.timestamp("us", tz="UTC"))]
)


def batch(first: int, n: int = 1) -> pa.RecordBatch:
    """Rows with ids ``first .. first + n - 1``, each named ``n<id>`` at rowtime T0 + id
    (built by Arrow's kernels: a 64 Ki-row message in milliseconds)."""
    ids = pa.array(range(first, first + n), pa.int64())
    names = pc.binary_join_element_wise("n", pc.cast(ids, pa.string()), "")
    rowtimes = pc.add(ids, T0).cast(pa.timestamp("us", tz="UTC"))
    return pa.record_batch([ids, names, rowtimes], schema=SCHEMA)


def meta(writer: str, seq: int, **more: Any) -> bytes:
    return json.dumps({"writer": writer, "seq": seq, **more}).encode()


def ack(reader: fl.FlightMetadataReader) -> dict[str, Any]:
    buf = reader.read()
    assert buf is not None, "the server ended the put without an answer"
    doc: dict[str, Any] = json.loads(buf.to_pybytes())
    return doc


@pytest.fixture(name="root")
def root_fixture(tmp_path: Path) -> Path:
    """A folder with one stream, ``orders`` (id, name; two partitions)."""
    create_stream(str(tmp_path / "orders"), "id BIGINT, name STRING", 2)
    return tmp_path


@pytest.fixture(name="server")
def server_fixture(root: Path) -> Iterator[RowtimeFlightServer]:
    """A server in this process for the streams below ``root``, on a free loopback port."""
    s = RowtimeFlightServer(Streams(str(root)), port=0)
    try:
        yield s
    finally:
        s.stop(5)


def ids_of(root: Path, partition: int | None = None) -> list[int]:
    t = read_stream(str(root / "orders"))
    rows = [
        (p, i)
        for p, i, b in zip(
            t.column("partition").to_pylist(),
            t.column("id").to_pylist(),
            t.column("is_bound").to_pylist(),
            strict=True,
        )
        if not b and (partition is None or p == partition)
    ]
    return [i for _, i in rows]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """``rowtime serve`` as a process (started by :meth:`start`, on a fixed port so that a
    restarted one is where the client was)."""

    def __init__(self, *args: str, port: int | None = None) -> None:
        self.args = args
        self.port = free_port() if port is None else port
        self.port_given = port is not None
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    def start(self) -> Served:
        cmd = [sys.executable, "-m", "pyspark_rowtime.cli", "serve", *self.args]
        port = [] if self.port_given else ["--port", str(self.port)]
        self.proc = subprocess.Popen([*cmd, *port], stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        while True:  # the first line that says where it listens (a warning may come first)
            line = self.proc.stderr.readline()
            self.lines.append(line)
            if not line or "listening on" in line:
                break
        assert "listening on" in line, "".join(self.lines) + self.proc.stderr.read()
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> float:
        """SIGTERM, and how long the process took to exit."""
        assert self.proc is not None
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(20)
        return time.monotonic() - started

    def __enter__(self) -> Served:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()

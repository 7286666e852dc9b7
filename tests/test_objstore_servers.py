"""The object storage servers the tests start (tests/objstore_servers.py): the ports reserved
for them stay out of the way of every other process, and a server that cannot start says why."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from objstore_servers import (
    _ephemeral_range,
    _reserved_port,
    azurite_server,
    moto_server,
    why_no_azurite,
    why_no_moto,
)


def test_reserved_ports_are_free_outside_the_kernels_range_and_in_the_workers_slice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A port chosen at the session's start is bound minutes later: from the kernel's ephemeral
    range any process's next connection could take it first (CI, 2026-11-28). Each xdist
    worker draws from its own slice, so two workers of one run never draw the same port."""
    lo, hi = _ephemeral_range()
    seen: dict[str, set[int]] = {}
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        ports = seen.setdefault(worker, set())
        for _ in range(20):
            port = _reserved_port(ports)
            assert port not in ports and not lo <= port <= hi, (worker, port)
            ports.add(port)
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))  # free
    assert not seen["gw0"] & seen["gw1"], "two workers drew the same port"


def _hold(port: int) -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


@pytest.mark.parametrize("kind", ["az", "s3"])
def test_a_server_whose_port_another_process_holds_fails_at_once_saying_why(
    kind: str, tmp_path: Path
) -> None:
    """Another process listens on the server's port: the start fails with the server's own
    words (the port in use), not a wait that connects to the other socket and times out later."""
    why = why_no_azurite() if kind == "az" else why_no_moto()
    if why:
        pytest.skip(why)
    port = _reserved_port()
    with _hold(port), pytest.raises(RuntimeError) as raised:
        start = azurite_server(tmp_path / "az", port) if kind == "az" else moto_server(port)
        with start:
            pass
    message = str(raised.value)
    assert f"127.0.0.1:{port}" in message and "exited" in message, message
    assert "EADDRINUSE" in message or "Address already in use" in message, message

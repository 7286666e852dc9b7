"""A real Redis server for tests: testcontainers' Redis container when a Docker engine answers,
else Debian's ``redis-server`` on a free loopback port with a temporary directory.

Both start in well under a second here (a bare ``redis-server`` in a few milliseconds), so the
fast tests use it too: the Redis backend's storage rules are checked against the server users
run, not a fake. Tests skip, saying why, only when neither a Docker engine nor ``redis-server``
is there (``.ci/run`` installs ``redis-server`` when missing, so CI never skips).

Every server listens on 127.0.0.1 only; nothing here talks to any other address.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

#: How long a server may take to answer PING after it starts (seconds).
_START_TIMEOUT_S = 10.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _docker_answers() -> bool:
    try:
        import docker  # testcontainers' dependency

        client = docker.from_env(timeout=2)
        client.ping()
        client.close()
        return True
    except Exception:
        return False


def why_no_server() -> str | None:
    """None when a server can be started here, else the reason a test is skipped."""
    if shutil.which("redis-server") or _docker_answers():
        return None
    return (
        "no Redis server can be started: redis-server is not installed (apt-get install "
        "redis-server) and no Docker engine answers for testcontainers"
    )


class RedisServer:
    """One running server. ``password`` is the default user's (``requirepass``); ``user`` and
    ``user_password`` an extra ACL user with every right, when asked for."""

    def __init__(
        self,
        workdir: Path,
        *,
        appendonly: bool = False,
        password: str | None = None,
        user: str | None = None,
        user_password: str | None = None,
        tls: bool = False,
    ) -> None:
        self.workdir = workdir
        self.tls = tls
        self.appendonly = appendonly
        self.password = password
        self.user = user
        self.user_password = user_password
        self.host = "127.0.0.1"
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._container: Any = None

    # -- locations --

    def url(self, name: str, db: int = 0, *, as_user: bool = False, scheme: str = "redis") -> str:
        """A stream location on this server: ``redis://[user:password@]host:port/db/name``."""
        if self.tls:
            scheme = "rediss"
        auth = ""
        if as_user and self.user:
            auth = f"{self.user}:{self.user_password}@"
        elif self.password:
            auth = f":{self.password}@"
        query = f"?ssl_ca_certs={self.workdir / 'cert.pem'}" if self.tls else ""
        return f"{scheme}://{auth}{self.host}:{self.port}/{db}/{name}{query}"

    def client(self, db: int = 0) -> Any:
        import redis

        return redis.Redis(host=self.host, port=self.port, db=db, password=self.password)

    # -- life --

    def start(self) -> RedisServer:
        if shutil.which("redis-server"):
            self._start_process()
        else:
            self._start_container()
        return self

    def _args(self, port: int) -> list[str]:
        args = [
            "redis-server",
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--dir", str(self.workdir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always" if self.appendonly else "everysec",
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--logfile", str(self.workdir / "redis.log"),
        ]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password]
        if self.tls:  # TLS only: the plain port is closed
            cert, key = self.workdir / "cert.pem", self.workdir / "key.pem"
            args[args.index("--port") + 1] = "0"
            args += ["--tls-port", str(port), "--tls-cert-file", str(cert)]
            args += ["--tls-key-file", str(key), "--tls-ca-cert-file", str(cert)]
            args += ["--tls-auth-clients", "no"]
        if self.user:
            args += ["--user", self.user, "on", f">{self.user_password}", "~*", "&*", "+@all"]
        return args

    def _make_cert(self) -> None:
        """A self-signed certificate for 127.0.0.1 (openssl), once per server."""
        if (self.workdir / "cert.pem").exists():
            return
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-keyout", str(self.workdir / "key.pem"), "-out", str(self.workdir / "cert.pem"),
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True, capture_output=True,
        )  # fmt: skip

    def _start_process(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.tls:
            self._make_cert()
        last = ""
        for _ in range(5):  # the free port may be taken between the probe and the bind
            port = self.port or _free_port()
            proc = subprocess.Popen(
                self._args(port), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            if self._wait_ready(port, proc):
                self._proc, self.port = proc, port
                return
            proc.kill()
            proc.wait()
            log = self.workdir / "redis.log"
            last = log.read_text(errors="replace")[-500:] if log.exists() else ""
            if self.port:  # a restart must get its old port back: no other one will do
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on 127.0.0.1; its log ends: {last}")

    def _wait_ready(self, port: int, proc: subprocess.Popen[bytes] | None) -> bool:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as raw:
                    s = raw
                    if self.tls:
                        ctx = ssl.create_default_context(cafile=str(self.workdir / "cert.pem"))
                        s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
                    s.sendall(b"PING\r\n")
                    reply = s.recv(64)
                    if reply.startswith((b"+PONG", b"-NOAUTH")):
                        return True
                    if reply.startswith(b"-LOADING"):
                        pass  # replaying its append-only file: ask again
            except OSError:
                pass
            time.sleep(0.005)
        return False

    def _start_container(self) -> None:
        from testcontainers.redis import RedisContainer  # type: ignore[import-untyped]

        container = RedisContainer(password=self.password)
        command = self._args(6379)[1:]
        # Inside the container the server listens on its own interface; Docker maps the port.
        command[command.index("--bind") + 1] = "0.0.0.0"
        command[command.index("--dir") + 1] = "/data"
        command[command.index("--logfile") + 1] = ""
        container.with_command(" ".join(repr(a) if a == "" else a for a in command))
        container.start()
        self._container = container
        self.host = container.get_container_host_ip()
        self.port = int(container.get_exposed_port(6379))

    def stop(self) -> None:
        """Stop the server (an orderly SHUTDOWN: with appendonly, nothing acknowledged is lost)."""
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._container is not None:
            self._container.get_wrapped_container().stop()

    def kill(self) -> None:
        """Kill the server at once (SIGKILL), as a crash would."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None
        elif self._container is not None:
            self._container.get_wrapped_container().kill()

    def restart(self) -> None:
        """Start the stopped server again on the same port and directory (its data comes back
        from the append-only file when ``appendonly`` is on)."""
        if self._container is not None:
            wrapped = self._container.get_wrapped_container()
            wrapped.start()
            self.port = int(self._container.get_exposed_port(6379))
            if not self._wait_ready(self.port, None):
                raise RuntimeError("the Redis container did not come back")
            return
        self._start_process()

    def close(self) -> None:
        self.stop()
        if self._container is not None:
            self._container.stop()
            self._container = None


@contextmanager
def redis_server(workdir: Path, **kwargs: Any) -> Iterator[RedisServer]:
    """A started :class:`RedisServer` (skips the test when none can be started), stopped on
    exit."""
    why = why_no_server()
    if why is not None:
        pytest.skip(why)
    server = RedisServer(workdir, **kwargs).start()
    try:
        yield server
    finally:
        server.close()

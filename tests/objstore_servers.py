"""Object storage servers for tests: moto's S3 server and Azurite (Azure Blob), on loopback ports.

Both start in about a second:

* **moto** (its werkzeug application, served as ``moto.server.ThreadedMotoServer`` serves it)
  runs in a Python process of its own (:func:`serve_moto`). Its conditional put looks the key up
  and then writes, with no lock between, so two racing creates of one key can both win: the
  server serialises moto's object writes behind one lock, so that the race tests test the
  backend and not moto. Real S3 (and Azurite) decide a conditional put atomically. In the test's
  own process it shared the GIL with the test and was traced by coverage: Spark's sink on S3
  (``integration/test_sink.py``, the chain of streams), two interleaved runs each under
  coverage, took 81 and 84 s (100 and 104 CPU-s of the machine) with moto in process, 67 and 72
  s (85 and 92 CPU-s) with it apart.
* **Azurite** is Microsoft's emulator from the npm registry: installed into
  ``~/.cache/pyspark-rowtime/azurite-npm`` (``ROWTIME_AZURITE_DIR`` overrides) when missing,
  started with ``--disableTelemetry`` (without it Azurite sends telemetry off the machine).

Clients are pointed at them through the standard variables (``AWS_ENDPOINT_URL``,
``AZURE_STORAGE_ENDPOINT``, ...), as users point the backend at their clouds; :meth:`env` gives
them. Tests skip, saying why, only when node/npm are absent (Azurite) or moto is not installed.
Every server listens on 127.0.0.1 only. A server's start waits until that process itself
listens (a connection could reach another process's socket on the port), and its failure
carries the server's output.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: The Azurite the tests run (.ci/run installs the same). On 3.35, which npm's unpinned install
#: gave until then, every delta-rs 1.6.6 commit after a table's second failed with "Invalid table
#: version: 1", write_deltalake alone too (delta-io/delta-rs issue 3716); on 3.37.0 the same
#: writes commit versions 2, 3, ... (measured here, 2026-11-27).
AZURITE_VERSION = "3.37.0"
#: Azurite's published development account and key (the same in every emulator).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
_START_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out for ``bind(0)`` and outgoing connections (inclusive)."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


#: Where reserved ports are drawn from: above the well-known and registered ports tools use
#: (Spark Connect's 15002, Spark's UI 4040 and up), below the kernel's ephemeral range.
_RESERVED_FROM = 20000
_RESERVED_SLICE = 1000  # ports per xdist worker: gw0 draws from the first slice, gw1 the next


def _reserved_port(taken: Collection[int] = ()) -> int:
    """A free loopback port that stays free until a server binds it, maybe minutes later.

    A port from ``bind(0)`` is in the kernel's ephemeral range: once it is closed again, any
    process's next ``bind(0)`` or outgoing connection may take it (Spark's JVMs and workers
    make thousands). That happened in a CI run (2026-11-28): Azurite, started 10 minutes after
    its port was chosen, found it taken and exited, while the wait for it connected to the
    other process's socket and the container's creation timed out. So the port comes from
    outside that range, from the xdist worker's own slice (workers of one run never draw the
    same port), and is checked free now."""
    lo, hi = _ephemeral_range()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) if worker.isdigit() else 0
    start = _RESERVED_FROM + (index % 8) * _RESERVED_SLICE
    candidates = [
        p for p in range(start, start + _RESERVED_SLICE) if not lo <= p <= hi and p not in taken
    ]
    random.Random().shuffle(candidates)  # not the global state, which Hypothesis watches
    for port in candidates[:200]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return _free_port()  # an unusual port range: the ephemeral way, as before


def _log_tail(log: Path | None, limit: int = 4000) -> str:
    if log is None:
        return ""
    try:
        text = log.read_text(errors="replace").strip()
    except OSError:
        return ""
    return f"; its output ({log}):\n{text[-limit:]}" if text else f"; it printed nothing ({log})"


def _listens(port: int, proc: subprocess.Popen[bytes] | None) -> bool:
    """Whether ``proc`` (any process, when None) listens on 127.0.0.1:``port``. Linux tells
    which process holds the listening socket: a connection alone would also succeed on another
    process's socket on that port, and the wait would end on a server that is not ours."""
    if proc is not None and Path("/proc/net/tcp").exists():
        try:
            listening = set()
            for table in ("/proc/net/tcp", "/proc/net/tcp6"):
                if not Path(table).exists():  # no IPv6 here
                    continue
                for line in Path(table).read_text().splitlines()[1:]:
                    fields = line.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        listening.add(f"socket:[{fields[9]}]")
            fds = Path(f"/proc/{proc.pid}/fd")
            return any(os.readlink(fd) in listening for fd in fds.iterdir())
        except OSError:
            return False  # the process is gone: the caller sees it exit
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait_port(port: int, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"the server exited with {proc.returncode} before it listened on 127.0.0.1:{port}"
            )
        if _listens(port, proc):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {_START_TIMEOUT_S:g} s")


@contextmanager
def _explained(what: str, log: Path | None) -> Iterator[None]:
    """Errors while a server is set up carry its output."""
    try:
        yield
    except Exception as e:
        raise RuntimeError(f"{what} did not start: {e}{_log_tail(log)}") from e


class ObjectServer:
    """A running server: its scheme (``s3`` or ``az``), its bucket or container, and the
    environment variables that point clients at it."""

    def __init__(self, scheme: str, bucket: str, env: dict[str, str]) -> None:
        self.scheme = scheme
        self.bucket = bucket
        self.env = env

    def url(self, name: str) -> str:
        """A fresh location under the server's bucket (``name`` plus a unique suffix)."""
        return f"{self.scheme}://{self.bucket}/{name}-{uuid.uuid4().hex[:10]}"

    @contextmanager
    def environ(self) -> Iterator[None]:
        """Set :attr:`env` in ``os.environ`` for a while."""
        with set_environ(self.env):
            yield


@contextmanager
def set_environ(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for a while; then each variable as it was (or unset)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def why_no_moto() -> str | None:
    try:
        import moto.server  # noqa: F401
    except ImportError:
        return "moto is not installed (pip install 'moto[server]'; it is in the dev extra)"
    return None


_moto_lock = threading.RLock()  # put_object runs inside _key_response_put
_moto_patched = False


def _quiet_moto() -> None:
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)


def _serialise_moto_writes() -> None:
    """moto's conditional put is a look-up then a write: run its key writes one at a time so
    that create-if-absent and compare-and-swap are atomic, as on S3."""
    global _moto_patched
    if _moto_patched:
        return
    from moto.s3.responses import S3Response

    for name in ("put_object", "_key_response_put", "_key_response_post"):
        original = getattr(S3Response, name, None)
        if original is None:
            continue

        def locked(self, *args, __original=original, **kwargs):
            with _moto_lock:
                return __original(self, *args, **kwargs)

        setattr(S3Response, name, locked)
    _moto_patched = True


#: Ports the session's servers take when set (integration/conftest.py sets them, and the
#: variables pointing at them, before Spark starts: Spark's Python workers inherit the JVM's
#: environment as it was when the JVM started).
S3_PORT_ENV = "ROWTIME_TEST_S3_PORT"
AZURITE_PORT_ENV = "ROWTIME_TEST_AZURITE_PORT"


def s3_env(port: int) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing-secret",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def azurite_env(port: int) -> dict[str, str]:
    return {
        "AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT,
        "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY,
        "AZURE_STORAGE_ENDPOINT": f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}",
        "AZURE_ALLOW_HTTP": "true",
    }


def reserve_ports() -> None:
    """Choose the session's server ports now and point the standard variables at them in
    ``os.environ`` (the servers start later, when a test asks for them)."""
    s3 = _reserved_port()
    az = _reserved_port({s3})
    os.environ[S3_PORT_ENV], os.environ[AZURITE_PORT_ENV] = str(s3), str(az)
    os.environ.update(s3_env(s3))
    os.environ.update(azurite_env(az))


def _port(env: str) -> int:
    raw = os.environ.get(env)
    return int(raw) if raw else _free_port()


@contextmanager
def moto_server(port: int | None = None) -> Iterator[ObjectServer]:
    """moto's S3 server on a loopback port (a free one by default), with one bucket, in a
    Python process of its own (:func:`serve_moto`)."""
    port = port or _free_port()
    fd, name = tempfile.mkstemp(prefix=f"rowtime-moto-{port}-", suffix=".log")
    log = Path(name)
    with open(fd, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, __file__, "moto", str(port)],
            stdin=subprocess.PIPE,  # closed when this process ends, however it ends
            stdout=out,
            stderr=out,
        )
    try:
        with _explained(f"moto's S3 server on 127.0.0.1:{port}", log):
            _wait_port(port, proc)
            env = s3_env(port)
            bucket = "rowtime-tests"
            import boto3

            boto3.client(
                "s3",
                endpoint_url=env["AWS_ENDPOINT_URL"],
                aws_access_key_id="testing",
                aws_secret_access_key="testing-secret",
                region_name="us-east-1",
            ).create_bucket(Bucket=bucket)
        yield ObjectServer("s3", bucket, env)
    finally:
        _stop(proc)
        log.unlink(missing_ok=True)


def serve_moto(port: int) -> None:
    """The moto server process: serves until its parent closes our stdin (or dies)."""
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    _serialise_moto_writes()
    _quiet_moto()
    # What moto's ThreadedMotoServer does, but binding here: its thread binds, and when the port
    # is taken the thread dies and start() waits forever. make_server exits, saying why.
    app = DomainDispatcherApplication(create_backend_app)
    server = make_server("127.0.0.1", port, app, True, request_handler=MotoRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()
    server.shutdown()


def azurite_dir() -> Path:
    default = Path.home() / ".cache" / "pyspark-rowtime" / "azurite-npm"
    return Path(os.environ.get("ROWTIME_AZURITE_DIR", default))


def why_no_azurite() -> str | None:
    return _why_no_npm(azurite_dir(), "azurite-blob", "Azurite (the Azure Blob emulator)")


def install_azurite() -> Path:
    """Azurite's ``azurite-blob`` command, installed from npm when missing or of another
    version. (npm silently installs nothing into a folder named ``azurite``: the folder is
    ``azurite-npm``.)"""
    return _npm_command(azurite_dir(), "azurite", "azurite-blob", AZURITE_VERSION)


def npm_version(folder: Path, package: str) -> str | None:
    """The version of npm ``package`` installed into ``folder``, or None."""
    try:
        meta = json.loads((folder / "node_modules" / package / "package.json").read_text())
    except (OSError, ValueError):
        return None
    return str(meta.get("version"))


def _npm_command(folder: Path, package: str, command: str, version: str | None = None) -> Path:
    """``command`` of npm ``package`` (of ``version`` when given), installed into ``folder``
    when missing or of another version."""
    exe = folder / "node_modules" / ".bin" / command
    if not exe.exists() or (version is not None and npm_version(folder, package) != version):
        folder.mkdir(parents=True, exist_ok=True)
        spec = package if version is None else f"{package}@{version}"
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(folder), spec],
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=600,
        )
    return exe


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def azurite_server(workdir: Path, port: int | None = None) -> Iterator[ObjectServer]:
    """Azurite's blob service on a loopback port (a free one by default), with one container."""
    exe = install_azurite()
    port = port or _free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "azurite.log"  # --silent keeps requests out of it; errors stay
    out = log.open("wb")
    proc = subprocess.Popen(
        [
            str(exe),
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(port),
            "--location",
            str(workdir),
            "--disableTelemetry",
            "--skipApiVersionCheck",
            "--silent",
        ],
        stdout=out,
        stderr=out,
    )
    out.close()
    try:
        with _explained(f"Azurite on 127.0.0.1:{port}", log):
            _wait_port(port, proc)
            env = azurite_env(port)
            endpoint = env["AZURE_STORAGE_ENDPOINT"]
            container = "rowtime-tests"
            from azure.storage.blob import BlobServiceClient

            conn = (
                f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
                f"AccountKey={AZURITE_KEY};BlobEndpoint={endpoint};"
            )
            BlobServiceClient.from_connection_string(
                conn, connection_timeout=10, read_timeout=30
            ).create_container(container)
        yield ObjectServer("az", container, env)
    finally:
        _stop(proc)


# -- pytest fixtures (tests/conftest.py and integration/conftest.py import these) --------------

import pytest  # noqa: E402

#: The servers running in this process, by kind. tests/conftest.py and integration/conftest.py
#: each register the session fixtures below, so a run of both folders (``./dev test``) asks
#: twice: the second gets the first's server, as a second server on the session's reserved
#: port could not bind (moto's start would wait for it forever).
_RUNNING: dict[str, ObjectServer] = {}


@contextmanager
def _shared(kind: str, start: Callable[[], Any]) -> Iterator[ObjectServer]:
    running = _RUNNING.get(kind)
    if running is not None:
        with running.environ():
            yield running
        return
    with start() as server, server.environ():
        _RUNNING[kind] = server
        try:
            yield server
        finally:
            _RUNNING.pop(kind, None)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[ObjectServer]:
    """moto's S3 server for the session, its variables set in ``os.environ`` (so Spark's
    Python workers, started from this process, see them too)."""
    why = why_no_moto()
    if why:
        pytest.skip(why)
    with _shared("s3", lambda: moto_server(_port(S3_PORT_ENV))) as server:
        yield server


@pytest.fixture(scope="session")
def az_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectServer]:
    """Azurite for the session, its variables set in ``os.environ``."""
    why = why_no_azurite()
    if why:
        pytest.skip(why)

    def start() -> Any:
        return azurite_server(tmp_path_factory.mktemp("azurite"), _port(AZURITE_PORT_ENV))

    with _shared("az", start) as server:
        yield server


@pytest.fixture(params=["s3", "az"])
def object_server(request: pytest.FixtureRequest) -> ObjectServer:
    """Each object store in turn (moto's S3, Azurite)."""
    server: ObjectServer = request.getfixturevalue(f"{request.param}_server")
    return server


# -- s3rver: an S3-compatible server that ignores conditional writes ---------------------------


def s3rver_dir() -> Path:
    default = Path.home() / ".cache" / "pyspark-rowtime" / "s3rver-npm"
    return Path(os.environ.get("ROWTIME_S3RVER_DIR", default))


def why_no_s3rver() -> str | None:
    return _why_no_npm(s3rver_dir(), "s3rver", "s3rver")


def _why_no_npm(folder: Path, command: str, what: str) -> str | None:
    """Why ``what`` (npm's ``command``, installed into ``folder``) cannot run here, or None."""
    if (folder / "node_modules" / ".bin" / command).exists():
        return None if shutil.which("node") else f"node is not installed ({what} runs on node)"
    if not shutil.which("npm") or not shutil.which("node"):
        return (
            f"{what} cannot be installed: node and npm are not installed "
            "(apt-get install nodejs npm)"
        )
    return None


@contextmanager
def s3rver_server(workdir: Path) -> Iterator[ObjectServer]:
    """s3rver (npm), a small S3-compatible server, on a free loopback port with one bucket. It
    accepts ``If-None-Match``/``If-Match`` and ignores them: the backend must refuse it."""
    exe = _npm_command(s3rver_dir(), "s3rver@3", "s3rver")
    port = _free_port()
    bucket = "rowtime-s3rver"
    proc = subprocess.Popen(
        [
            str(exe),
            "-d",
            str(workdir),
            "-a",
            "127.0.0.1",
            "-p",
            str(port),
            "--silent",
            "--configure-bucket",
            bucket,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_port(port, proc)
        env = {
            "AWS_ACCESS_KEY_ID": "S3RVER",
            "AWS_SECRET_ACCESS_KEY": "S3RVER",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ALLOW_HTTP": "true",
        }
        yield ObjectServer("s3", bucket, env)
    finally:
        _stop(proc)


if __name__ == "__main__":  # moto_server's child
    if len(sys.argv) != 3 or sys.argv[1] != "moto" or not sys.argv[2].isdigit():
        sys.exit(f"usage: python {sys.argv[0]} moto PORT (the S3 server of the tests)")
    serve_moto(int(sys.argv[2]))

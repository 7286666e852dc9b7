"""A TCP proxy for tests that injects network faults between a client and a real server.

:class:`FaultProxy` listens on a free loopback port and forwards to a server on loopback
(moto's S3 server, Azurite, redis-server: the fixtures of tests/objstore_servers.py and
tests/redis_server.py start those). On its way it can

* ``latency``: hold a request for a short while (:attr:`Faults.latency_s`) before forwarding it;
* ``stall``: hold it for long (:attr:`Faults.stall_s`, ``math.inf`` for ever), so that the
  client's timeout fires first;
* ``reset``: reset the connection (TCP RST) *before* the request reaches the server;
* ``drop``: forward the request, wait until the server answers (it has handled the request),
  then reset the client's connection without passing the answer on: the lost reply of a write
  that was applied;
* ``cut``: pass on the first half of the answer's first chunk, then reset: a reply cut halfway;
* ``hang``: forward the request, swallow the server's answer, and keep the client's connection
  open and silent until the client gives up: a reply lost on the way with no reset (a
  middlebox that drops packets), so the client waits for its own timeout. The server has
  handled the request.

**The unit is a turn**: the bytes a client sends since the server's last answer on that
connection (one HTTP/1.1 request on a keep-alive connection, body included; one Redis command,
or one pipeline), together with the server's answer to them. Neither client here pipelines
HTTP requests, and a Redis pipeline is one write then one read, so a turn is one request (or
one pipeline). The proxy parses nothing: a turn starts when client bytes arrive on a
connection whose previous turn got its answer (or on a new connection), and its fault is
decided then (by :meth:`FaultProxy.target` when a test aims at a request, else) by one
``random.Random(seed)`` that every connection draws from in the order turns
start. A sequential client therefore meets the same faults on a replay with the same seed;
concurrent clients (a lease renewing thread) draw in whatever order the OS runs them.

Counters (:attr:`FaultProxy.counts`) say how many turns there were and what was injected into
them. Pure standard library, one thread per connection; only loopback addresses.
"""

from __future__ import annotations

import math
import random
import selectors
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass

__all__ = ["FAULTS", "FaultProxy", "Faults"]

#: The faults, in the order their rates are drawn.
#: ``hang`` came last: a seed's draws for the other faults stay what they were.
FAULTS = ("reset", "drop", "cut", "stall", "latency", "hang")


@dataclass
class Faults:
    """How often each fault hits a turn (probabilities; their sum at most 1), and how long
    ``latency`` and ``stall`` hold a request (seconds; ``latency_s`` is drawn uniformly up to
    its value)."""

    reset: float = 0.0
    drop: float = 0.0
    cut: float = 0.0
    stall: float = 0.0
    latency: float = 0.0
    hang: float = 0.0
    latency_s: float = 0.05
    stall_s: float = 2.0

    def __post_init__(self) -> None:
        total = sum(getattr(self, f) for f in FAULTS)
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault rates add up to {total}, more than 1")

    @classmethod
    def mix(cls, rate: float, **kw: float) -> Faults:
        """``rate`` split evenly between resets, lost replies, cut replies and latency (the
        mix a flaky network gives), plus ``kw``."""
        share = rate / 4
        return cls(reset=share, drop=share, cut=share, latency=share, **kw)

    def choose(self, rng: random.Random) -> str | None:
        x = rng.random()
        for name in FAULTS:
            p = getattr(self, name)
            if x < p:
                return name
            x -= p
        return None


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP RST (SO_LINGER 0), as a load balancer that drops it does."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class FaultProxy:
    """A proxy on ``127.0.0.1:port`` in front of ``127.0.0.1:upstream_port``.

    Use as a context manager. :attr:`faults` may be replaced at any time (``Faults()`` passes
    everything through); :attr:`seed` is what a failing test prints, to replay it.
    """

    def __init__(self, upstream_port: int, seed: int, faults: Faults | None = None) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.seed = seed
        self.faults = faults or Faults()
        self.counts: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._targets: list[tuple[tuple[bytes, ...], str, list[int]]] = []
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    # -- life --

    def __enter__(self) -> FaultProxy:
        t = threading.Thread(target=self._accept_loop, name="fault-proxy-accept", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting and reset every open connection."""
        self._stop.set()
        try:
            self._listener.close()
        except OSError:
            pass
        with self._conns_lock:
            conns, self._conns = list(self._conns), set()
        for s in conns:
            _reset(s)
        for t in self._threads:
            t.join(timeout=5)

    def reset_all(self) -> None:
        """Reset every open connection now (clients reconnect through the proxy)."""
        with self._conns_lock:
            conns, self._conns = list(self._conns), set()
        for s in conns:
            _reset(s)

    def target(self, fault: str, *needles: bytes, times: int = 1) -> None:
        """Inject ``fault`` into the next ``times`` turns whose first bytes contain every one
        of ``needles`` (``b"PUT "``, ``b"/_commits/"``: a request line), whatever the rates
        say: a test aims at one request this way."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        with self._rng_lock:
            self._targets.append((needles, fault, [times]))

    @property
    def injected(self) -> int:
        """Turns that met a fault."""
        return sum(self.counts[f] for f in FAULTS)

    def summary(self) -> str:
        shown = ", ".join(f"{f} {self.counts[f]}" for f in FAULTS if self.counts[f])
        return f"seed {self.seed}: {self.counts['turns']} turns, {shown or 'no fault'}"

    # -- forwarding --

    def _accept_loop(self) -> None:
        self._listener.settimeout(0.1)  # closing a listener does not wake accept()
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            t = threading.Thread(
                target=self._serve, args=(client,), name="fault-proxy-conn", daemon=True
            )
            t.start()
            self._threads = [x for x in self._threads if x.is_alive()]
            self._threads.append(t)

    def _track(self, *socks: socket.socket) -> None:
        with self._conns_lock:
            self._conns.update(socks)

    def _forget(self, *socks: socket.socket) -> None:
        with self._conns_lock:
            self._conns.difference_update(socks)

    def _decide(self, first: bytes) -> tuple[str | None, float]:
        with self._rng_lock:
            faults = self.faults
            fault = faults.choose(self._rng)
            for needles, aimed, left in self._targets:
                if left[0] > 0 and all(n in first for n in needles):
                    left[0] -= 1
                    fault = aimed
                    break
            hold = faults.latency_s * self._rng.random() if fault == "latency" else faults.stall_s
            self.counts["turns"] += 1
            if fault:
                self.counts[fault] += 1
        return fault, hold

    def _hold(self, seconds: float) -> None:
        end = time.monotonic() + seconds if math.isfinite(seconds) else math.inf
        while not self._stop.is_set() and time.monotonic() < end:
            self._stop.wait(min(0.05, max(end - time.monotonic(), 0.0)))

    def _swallow(self, sel: selectors.BaseSelector) -> None:
        """Read and discard what either side sends until the client closes (or the proxy
        does): the rest of the server's answer never reaches the client, which hears nothing
        at all, not even the server's closing the connection (moto closes some)."""
        while not self._stop.is_set():
            for key, _ in sel.select(timeout=0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if not sock.recv(1 << 16):
                    if key.data == "client":
                        return
                    sel.unregister(sock)

    def _serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            _reset(client)
            return
        server.settimeout(None)
        self._track(client, server)
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ, "client")
        sel.register(server, selectors.EVENT_READ, "server")
        fault: str | None = None
        in_turn = False  # client bytes forwarded, the answer not yet begun
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=0.2):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    data = sock.recv(1 << 16)
                    if not data:  # one side closed: close the other
                        return
                    if key.data == "client":
                        if not in_turn:
                            in_turn = True
                            fault, hold = self._decide(data)
                            if fault == "reset":
                                return  # neither side gets the request
                            if fault in ("latency", "stall"):
                                self._hold(hold)
                                if self._stop.is_set():
                                    return
                        server.sendall(data)
                    else:
                        in_turn = False
                        if fault == "drop":
                            return  # the server has handled the request; its answer is lost
                        if fault == "cut":
                            client.sendall(data[: len(data) // 2])
                            return
                        if fault == "hang":
                            self._swallow(sel)
                            return
                        fault = None
                        client.sendall(data)
        except OSError:
            pass
        finally:
            sel.close()
            self._forget(client, server)
            _reset(client)
            _reset(server)

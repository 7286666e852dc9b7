"""Redis stream locations: parsing, redaction and connections.

A location is ``redis://[user:password@]host:port/db/name`` (``rediss://`` for TLS), with
optional query settings::

    redis://reader:s3cret@cache.internal:6379/0/orders?connect_timeout=2s&retries=5

========================  =====================================================================
``connect_timeout``       how long one connection attempt may take (duration; default 5 s)
``socket_timeout``        how long one command may wait for its reply (duration; default 10 s)
``retries``               attempts after the first on a connection error or timeout (default 3)
``backoff``               the first wait between attempts, doubled each time up to ``backoff_cap``
                          (durations; defaults 100 ms and 5 s), with jitter
``password_env``          read the password from this environment variable instead of the URL
                          (every executor must have it set), so it never sits in a query's
                          options at all
``ssl_ca_certs``          ``rediss://`` only: a CA bundle file to verify the server with
``ssl_cert_reqs``         ``rediss://`` only: ``required`` (default), ``optional`` or ``none``
========================  =====================================================================

The password never appears in what this module prints: ``redact`` (the project's one
redaction, ``bounds.redaction``) replaces it by ``***`` in any text holding a location,
``RedisLocation``'s ``str``/``repr`` leave it out, and the parser remembers it
(``remember_secret``) before anything can fail, so no error shows a piece of it either. A
password may be percent-encoded (``%2F`` for ``/``) or written as it is: it runs from the
``:`` after the user to the last ``@`` (``split_userinfo``).
"""

from __future__ import annotations

import os
import random
import re
import threading
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from ...bounds.errors import OptionError, RowtimeError
from ...bounds.redaction import redact, remember_secret, split_userinfo
from ...bounds.time import parse_duration_us

__all__ = [
    "SCHEMES",
    "RedisLocation",
    "RedisUnavailableError",
    "is_redis_location",
    "parse_location",
    "redact",
]

SCHEMES = ("redis", "rediss")

#: A stream name: what follows ``/db/``. Key-safe (no braces: those pick a Cluster hash slot).
_NAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,200}\Z")

_SETTINGS = {
    "connect_timeout",
    "socket_timeout",
    "retries",
    "backoff",
    "backoff_cap",
    "password_env",
    "ssl_ca_certs",
    "ssl_cert_reqs",
}


class RedisUnavailableError(RowtimeError, ConnectionError):
    """The Redis server did not answer within the location's timeouts and retries.

    Examples:
        Also a ``ConnectionError``, so a retry loop may catch either:

        >>> import pyspark_rowtime as rt
        >>> issubclass(rt.RedisUnavailableError, ConnectionError)
        True
    """


def is_redis_location(location: object) -> bool:
    return isinstance(location, str) and location.split("://", 1)[0].lower() in SCHEMES


#: How deep this thread is in redis-py retry loops (``RedisLocation.connect``'s ``_Retry``).
_NESTED = threading.local()


@dataclass(frozen=True)
class RedisLocation:
    """A parsed location. ``password`` is kept out of ``repr`` and ``str``."""

    scheme: str
    host: str
    port: int
    db: int
    name: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    connect_timeout_s: float = 5.0
    socket_timeout_s: float = 10.0
    retries: int = 3
    backoff_s: float = 0.1
    backoff_cap_s: float = 5.0
    password_env: str | None = None
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: str = "required"

    @property
    def tls(self) -> bool:
        return self.scheme == "rediss"

    def __str__(self) -> str:
        """The location as a URL without its password (safe to log or show)."""
        auth = ""
        if self.username or self.password or self.password_env:
            secret = ":***" if (self.password or self.password_env) else ""
            auth = f"{urllib.parse.quote(self.username or '', safe='')}{secret}@"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{auth}{host}:{self.port}/{self.db}/{self.name}"

    def __repr__(self) -> str:
        return f"RedisLocation({str(self)!r})"

    def key(self, *parts: str) -> str:
        """A key of this stream. All keys share the hash tag ``{rowtime:name}`` so that, on Redis
        Cluster, one stream lives in one slot and its Lua scripts may touch all of its keys."""
        return ":".join((f"{{rowtime:{self.name}}}", *parts))

    def resolved_password(self) -> str | None:
        if self.password_env is None:
            return self.password
        value = os.environ.get(self.password_env)
        remember_secret(value)
        if value is None:
            raise OptionError(
                f"{self}: password_env={self.password_env} names an environment variable that "
                "is not set in this process; set it (on the driver and on every executor)"
            )
        return value

    def connect(self) -> Any:
        """A redis-py client with this location's timeouts, TLS and retries (exponential
        backoff with jitter, on connection errors and timeouts only). Connects lazily."""
        try:
            import redis
            from redis.backoff import AbstractBackoff
            from redis.retry import Retry
        except ImportError:  # pragma: no cover - the extra is part of dev
            raise OptionError(
                f"{self} is a Redis location, and the Redis client is not installed: "
                "pip install 'pyspark-rowtime[redis]'"
            ) from None

        class _Retry(Retry):
            """Retries connection errors and timeouts, but not refused credentials (redis-py
            makes AuthenticationError a ConnectionError): a wrong password stays wrong.

            redis-py retries a command with this object and, inside each attempt, the
            connection's handshake with it again: a server that accepts connections and never
            answers cost ``(retries + 1) ** 2`` socket timeouts. Inside another retry loop of
            this thread, one attempt only: the outer loop retries, so it costs ``retries + 1``
            (``_NESTED``)."""

            def call_with_retry(  # type: ignore[override]
                self, do: Any, fail: Any, is_retryable: Any = None, **kw: Any
            ) -> Any:
                def retryable(error: Exception) -> bool:
                    if isinstance(error, redis.AuthenticationError):
                        return False
                    return is_retryable(error) if is_retryable else True

                depth = getattr(_NESTED, "depth", 0)
                if depth:
                    try:
                        return do()
                    except (redis.ConnectionError, redis.TimeoutError) as error:
                        if retryable(error):
                            fail(error, 1) if kw.get("with_failure_count") else fail(error)
                        raise
                _NESTED.depth = depth + 1
                try:
                    return super().call_with_retry(do, fail, retryable, **kw)
                finally:
                    _NESTED.depth = depth

        cap, base = self.backoff_cap_s, self.backoff_s

        class _EqualJitter(AbstractBackoff):
            """redis-py's ``EqualJitterBackoff`` (half the exponential wait, then up to as much
            again at random) drawing from a generator of its own. redis-py's draws from the
            process's ``random`` module: every retry, a writer's lease renewal in its thread
            included, moved the state of an application that had seeded ``random`` for a
            sequence of its own."""

            def __init__(self) -> None:
                self._random = random.Random()

            def compute(self, failures: int) -> float:
                half = min(cap, base * 2**failures) / 2
                return half + self._random.uniform(0, half)

        retry = _Retry(
            _EqualJitter(),
            self.retries,
            supported_errors=(redis.ConnectionError, redis.TimeoutError),
        )
        kwargs: dict[str, Any] = dict(
            host=self.host,
            port=self.port,
            db=self.db,
            username=self.username,
            password=self.resolved_password(),
            socket_connect_timeout=self.connect_timeout_s,
            socket_timeout=self.socket_timeout_s,
            retry=retry,
            retry_on_error=[redis.ConnectionError, redis.TimeoutError],
            health_check_interval=30,
        )
        if self.tls:
            kwargs.update(ssl=True, ssl_cert_reqs=self.ssl_cert_reqs)
            if self.ssl_ca_certs:
                kwargs["ssl_ca_certs"] = self.ssl_ca_certs
        return redis.Redis(**kwargs)


def _seconds(value: str, what: str) -> float:
    return parse_duration_us(value, what=what) / 1e6


def parse_location(location: str) -> RedisLocation:
    """Parse ``redis://[user:password@]host:port/db/name[?settings]``.

    Raises ``OptionError`` naming the (redacted) location and what is accepted.
    """
    head, user, secret, rest = split_userinfo(location)
    remember_secret(secret)
    if secret is not None:
        remember_secret(urllib.parse.unquote(secret))
    shown = redact(location)
    form = "redis://[user:password@]host:port/db/name (or rediss:// for TLS)"
    try:
        # The credentials are split off first: urllib reads the authority up to the first "/",
        # so a password holding one would be read as a port, and urllib's error quotes it.
        url = urllib.parse.urlsplit(head + rest)
        port = url.port
    except ValueError as e:
        raise OptionError(
            f"Redis location {shown!r} cannot be read ({redact(str(e))}); use {form}"
        ) from None
    scheme = url.scheme.lower()
    if scheme not in SCHEMES:
        raise OptionError(f"{shown!r} is not a Redis location; use {form}")
    if not url.hostname:
        raise OptionError(f"Redis location {shown!r} names no host; use {form}")
    parts = url.path.split("/")
    if len(parts) != 3 or parts[0] != "":
        raise OptionError(
            f"Redis location {shown!r} must name a database number and a stream after the "
            f"host:port, as in {scheme}://host:6379/0/orders; use {form}"
        )
    db_text, name = parts[1], urllib.parse.unquote(parts[2])
    if not db_text.isdigit():
        raise OptionError(
            f"Redis location {shown!r}: the database {db_text!r} must be a number (0 to 15 on a "
            "default server; Redis Cluster has only 0)"
        )
    if not _NAME_RE.match(name):
        raise OptionError(
            f"Redis location {shown!r}: the stream name {name!r} may hold only letters, digits "
            "and _ . : - (1 to 200 of them)"
        )
    query = urllib.parse.parse_qs(url.query, keep_blank_values=True, strict_parsing=False)
    unknown = sorted(set(query) - _SETTINGS)
    if unknown:
        raise OptionError(
            f"Redis location {shown!r} has unknown setting(s) {', '.join(unknown)}; known: "
            f"{', '.join(sorted(_SETTINGS))}"
        )
    settings = {k: v[-1] for k, v in query.items()}
    kw: dict[str, Any] = {}
    for key in ("connect_timeout", "socket_timeout", "backoff", "backoff_cap"):
        if key in settings:
            kw[f"{key}_s"] = _seconds(settings[key], f"{key} of {shown}")
    if "retries" in settings:
        raw = settings["retries"]
        if not raw.isdigit():
            raise OptionError(
                f"Redis location {shown!r}: retries={raw!r} must be a whole number >= 0"
            )
        kw["retries"] = int(raw)
    if "ssl_cert_reqs" in settings:
        reqs = settings["ssl_cert_reqs"].lower()
        if reqs not in ("required", "optional", "none"):
            raise OptionError(
                f"Redis location {shown!r}: ssl_cert_reqs={reqs!r} must be required, optional "
                "or none"
            )
        kw["ssl_cert_reqs"] = reqs
    if scheme == "redis" and ({"ssl_ca_certs", "ssl_cert_reqs"} & set(settings)):
        raise OptionError(
            f"Redis location {shown!r} sets TLS settings on a plain redis:// location; use "
            "rediss:// for TLS"
        )
    if "ssl_ca_certs" in settings:
        kw["ssl_ca_certs"] = settings["ssl_ca_certs"]
    password = urllib.parse.unquote(secret) if secret is not None else None
    if "password_env" in settings:
        if password:
            raise OptionError(
                f"Redis location {shown!r} gives a password and password_env; give one of them"
            )
        kw["password_env"] = settings["password_env"]
    return RedisLocation(
        scheme=scheme,
        host=url.hostname,
        port=port if port is not None else 6379,
        db=int(db_text),
        name=name,
        username=urllib.parse.unquote(user) if user else None,
        password=password or None,
        **kw,
    )

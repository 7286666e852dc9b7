"""One Redis client per location and process, with the backend's scripts and redis-py's errors
turned into this project's (the location in messages always redacted). The stream, its
appender and the sink state all reach the server through ``connection``."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from ...bounds.errors import OptionError
from . import scripts
from .location import RedisLocation, RedisUnavailableError, redact

__all__ = ["RedisConnection", "connection"]


class RedisConnection:
    """One location's client and scripts, with redis-py's errors turned into ours (the
    location in messages is always redacted)."""

    def __init__(self, loc: RedisLocation) -> None:
        self.loc = loc
        self.client = loc.connect()
        self.append = self.client.register_script(scripts.APPEND)
        self.create = self.client.register_script(scripts.CREATE)
        self.index = self.client.register_script(scripts.INDEX)
        self.renew = self.client.register_script(scripts.RENEW)
        self.release = self.client.register_script(scripts.RELEASE)
        self.trim = self.client.register_script(scripts.TRIM)

    def call(self, what: str, fn: Callable[[], Any]) -> Any:
        import redis

        try:
            return fn()
        except redis.AuthenticationError as e:
            raise OptionError(
                f"Redis at {self.loc} refused the credentials while {what}: {redact(str(e))}; "
                "check the user and password of the location"
            ) from None
        except (redis.ConnectionError, redis.TimeoutError) as e:
            raise RedisUnavailableError(
                f"Redis at {self.loc} did not answer while {what}, after {self.loc.retries} "
                f"retries with backoff ({type(e).__name__}: {redact(str(e))}). Nothing of that "
                "step is assumed done; retry when the server is back"
            ) from None
        except redis.ResponseError as e:
            text = redact(str(e))
            if "NOPERM" in text or "NOAUTH" in text or "WRONGPASS" in text:
                raise OptionError(
                    f"Redis at {self.loc} refused {what}: {text}; the location's user needs "
                    "read and write rights on the keys {rowtime:<name>}:* (and on the source "
                    "keys of an external stream)"
                ) from None
            raise


_CLIENTS: dict[RedisLocation, RedisConnection] = {}
_CLIENTS_LOCK = threading.Lock()


def connection(loc: RedisLocation) -> RedisConnection:
    """One client per location and process (redis-py's pool is thread-safe)."""
    with _CLIENTS_LOCK:
        conn = _CLIENTS.get(loc)
        if conn is None or conn.client.connection_pool.pid != os.getpid():
            conn = _CLIENTS[loc] = RedisConnection(loc)
        return conn

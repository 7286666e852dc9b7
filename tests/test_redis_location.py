"""Redis locations: parsing, a password that never shows (errors, repr, str), and retries that
leave the process's `random` alone."""

from __future__ import annotations

import pytest

from pyspark_rowtime.bounds.errors import OptionError, RowtimeError
from pyspark_rowtime.streams.redis.location import (
    RedisUnavailableError,
    is_redis_location,
    parse_location,
    redact,
)

SECRET = "s3cr3t-Pa55"


def test_full_location_is_parsed() -> None:
    loc = parse_location(
        f"rediss://ops:{SECRET}@cache.internal:6380/3/orders.eu"
        "?connect_timeout=250ms&socket_timeout=2s&retries=7&backoff=50ms&backoff_cap=1s"
        "&ssl_cert_reqs=none"
    )
    assert (loc.scheme, loc.host, loc.port, loc.db, loc.name) == (
        "rediss",
        "cache.internal",
        6380,
        3,
        "orders.eu",
    )
    assert (loc.username, loc.password) == ("ops", SECRET)
    assert (loc.connect_timeout_s, loc.socket_timeout_s) == (0.25, 2.0)
    assert (loc.retries, loc.backoff_s, loc.backoff_cap_s) == (7, 0.05, 1.0)
    assert loc.tls and loc.ssl_cert_reqs == "none"


def test_defaults_and_percent_encoded_password() -> None:
    loc = parse_location("redis://:p%40ss%3Aw@127.0.0.1/0/s")
    assert loc.port == 6379 and loc.username is None and loc.password == "p@ss:w"
    assert (loc.connect_timeout_s, loc.retries) == (5.0, 3)
    assert not loc.tls
    assert is_redis_location("REDIS://h/0/s") and not is_redis_location("/data/s")


@pytest.mark.parametrize(
    "location, says",
    [
        ("redis://h:1/orders", "database number and a stream"),
        ("redis://h:1/x/orders", "must be a number"),
        ("redis://h:1/0/or{ders}", "may hold only"),
        ("redis://h:1/0/s?timeout=1s", "unknown setting"),
        ("redis://h:1/0/s?retries=-1", "retries"),
        ("redis://h:1/0/s?connect_timeout=0", "connect_timeout"),
        ("redis://h:1/0/s?ssl_ca_certs=/ca.pem", "rediss://"),
        ("redis://u:pw@h:1/0/s?password_env=X", "password_env"),
        ("redis://:pw@h:port/0/s", "cannot be read"),
        ("kafka://h:1/0/s", "not a Redis location"),
    ],
)
def test_bad_locations_name_the_problem_without_the_password(location: str, says: str) -> None:
    with pytest.raises(OptionError) as info:
        parse_location(location.replace("pw", SECRET))
    assert says in str(info.value)
    assert SECRET not in str(info.value)


def test_password_never_in_str_repr_or_redacted_text() -> None:
    loc = parse_location(f"redis://ops:{SECRET}@h:1/0/s")
    for text in (str(loc), repr(loc), f"{loc}", f"{loc!r}"):
        assert SECRET not in text
        assert "ops:***@h:1/0/s" in text
    assert redact(f"failed at redis://ops:{SECRET}@h:1/0/s: boom") == (
        "failed at redis://ops:***@h:1/0/s: boom"
    )
    assert redact(f"rediss://:{SECRET}@h/0/s?retries=1") == "rediss://:***@h/0/s?retries=1"
    assert redact("redis://h:1/0/s and /data/x") == "redis://h:1/0/s and /data/x"


def test_password_env_is_read_at_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    loc = parse_location("redis://ops@h:1/0/s?password_env=ROWTIME_TEST_PW")
    assert "***" in str(loc)
    with pytest.raises(OptionError, match="ROWTIME_TEST_PW"):
        loc.resolved_password()
    monkeypatch.setenv("ROWTIME_TEST_PW", SECRET)
    assert loc.resolved_password() == SECRET


def test_unavailable_is_one_of_ours_and_a_connection_error() -> None:
    assert issubclass(RedisUnavailableError, RowtimeError)
    assert issubclass(RedisUnavailableError, ConnectionError)


def test_retries_leave_the_applications_random_state_alone() -> None:
    """A command retried against a port where nothing listens draws its backoff's jitter from
    a generator of the backend's own: an application that seeded ``random`` (a writer's lease
    renewal retries in a thread of its process) finds its state as it left it."""
    import random
    import socket

    import redis

    with socket.socket() as s:  # a port of 127.0.0.1 that refuses connections
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    loc = parse_location(f"redis://127.0.0.1:{port}/0/s?retries=3&backoff=1ms&backoff_cap=2ms")
    random.seed(20_261_128)
    before = random.getstate()
    with pytest.raises(redis.ConnectionError):
        loc.connect().ping()
    assert random.getstate() == before

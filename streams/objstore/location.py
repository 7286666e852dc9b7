"""Object storage locations: parsing ``s3://``, ``az://``, ``azure://`` and ``abfs[s]://`` URLs,
the one client per bucket, and obstore's errors turned into the project's.

A location is ``s3://bucket/prefix`` (S3, or any S3-compatible server), ``az://container/prefix``
or ``azure://container/prefix`` (Azure Blob), or ``abfs[s]://container@account.dfs.core.windows
.net/prefix`` (Azure's Hadoop form, as Spark users write it). The prefix is the stream's "folder":
every object of the stream lies below ``prefix/``.

Credentials and endpoints come from each cloud's standard environment variables, read by
obstore (Rust's ``object_store``): ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP``, the instance's
or the container's role; ``AZURE_STORAGE_ACCOUNT_NAME``, ``AZURE_STORAGE_ACCOUNT_KEY``,
``AZURE_STORAGE_SAS_TOKEN``, ``AZURE_STORAGE_ENDPOINT``, ``AZURE_CLIENT_ID`` and friends. A
location never carries a secret (one with ``user:password@``, or with a query such as a SAS
token's ``?sv=...&sig=...``, is refused without showing it), so a location can be shown in
every error, plan and ``describe``. obstore's messages are cut to their first line and redacted
(``bounds.redaction.redact``: a signature or a key from the environment is masked).
"""

from __future__ import annotations

import math
import os
import random
import re
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any, TypeVar

from ...bounds.errors import OptionError, RowtimeError
from ...bounds.redaction import redact, split_userinfo

__all__ = [
    "SCHEMES",
    "UNKNOWN_SIZE",
    "ObjectLocation",
    "ObjectStoreUnavailableError",
    "call",
    "create_if_absent",
    "get_whole",
    "parse_location",
    "require_conditional_writes",
    "store_for",
    "writer_store_for",
]

#: The URL schemes this backend serves.
SCHEMES = ("s3", "s3a", "az", "azure", "abfs", "abfss")
_AZURE = ("az", "azure", "abfs", "abfss")

T = TypeVar("T")


class ObjectStoreUnavailableError(RowtimeError, ConnectionError):
    """The object store did not answer (after the backend's retries: ``call``).

    Examples:
        Also a ``ConnectionError``, so a retry loop may catch either:

        >>> import pyspark_rowtime as rt
        >>> issubclass(rt.ObjectStoreUnavailableError, ConnectionError)
        True
    """


@dataclass(frozen=True)
class ObjectLocation:
    """A parsed location: the cloud (``s3`` or ``az``), the bucket or container, the account
    (``abfs`` URLs name it; else the environment does), the key prefix (no slashes around)."""

    cloud: str
    bucket: str
    prefix: str
    account: str | None = None
    given_scheme: str = ""

    def __str__(self) -> str:
        if self.given_scheme in ("abfs", "abfss") and self.account:
            host = f"{self.bucket}@{self.account}.dfs.core.windows.net"
            return f"{self.given_scheme}://{host}/{self.prefix}"
        scheme = self.given_scheme or self.cloud
        return f"{scheme}://{self.bucket}/{self.prefix}"

    def key(self, *parts: str) -> str:
        """The object key of ``parts`` below the location's prefix."""
        return "/".join((self.prefix, *parts))


def parse_location(location: str) -> ObjectLocation:
    """``location`` parsed; ``OptionError`` saying what is wrong and what a location
    looks like when it is not one."""
    shown = redact(location)
    head, user, password, rest = split_userinfo(location)
    # Parsed without a password: urllib's errors would quote a piece of one.
    try:
        url = urllib.parse.urlparse(head + (f"{user}@" if user is not None else "") + rest)
    except ValueError as e:  # an unclosed "[" of an IPv6 host
        raise OptionError(
            f"object storage location {shown!r} cannot be read ({e}): a location is "
            "scheme://bucket/prefix"
        ) from None
    scheme = url.scheme.lower()
    if scheme not in SCHEMES:
        raise OptionError(f"{shown!r} is not an object storage location (s3://, az://, abfs://)")
    if password is not None or (user is not None and scheme not in ("abfs", "abfss")):
        # Not shown at all: where credentials end in a URL written unencoded is a guess (a
        # user alone may be a key or a token), and no guess may show a piece of them.
        raise OptionError(
            f"an object storage location ({scheme}://...) carries credentials (not shown): give "
            "them through the cloud's environment variables (AWS_ACCESS_KEY_ID/"
            "AWS_SECRET_ACCESS_KEY, AZURE_STORAGE_ACCOUNT_KEY, ...) or the machine's role, never "
            "in the location"
        )
    if url.query or url.fragment or url.params:
        # Not shown: a query may be a SAS token or a presigned URL's signature.
        where = re.split(r"[?#;]", rest, maxsplit=1)[0]
        bare = redact(head + (f"{user}@" if user is not None else "") + where)
        raise OptionError(
            f"object storage location {bare!r} has a query or fragment (not shown: it may hold "
            "a token or a signature): a location is "
            "scheme://bucket/prefix; endpoints and credentials come from environment variables"
        )
    account = None
    bucket = url.hostname or ""
    if scheme in ("abfs", "abfss"):
        if url.username:  # container@account.dfs.core.windows.net
            bucket = url.username
            account = (url.hostname or "").split(".", 1)[0] or None
    elif url.netloc != url.netloc.lower() and scheme in ("s3", "s3a"):
        bucket = url.netloc  # bucket names are lower case; keep what was given for the error
    prefix = urllib.parse.unquote(url.path).strip("/")
    if not bucket or not prefix:
        raise OptionError(
            f"object storage location {shown!r} needs a bucket (or container) and a prefix: "
            "s3://bucket/path/to/stream or az://container/path/to/stream; a stream keeps all "
            "its objects below the prefix"
        )
    if any(part in ("", ".", "..") for part in prefix.split("/")):
        raise OptionError(
            f"object storage location {shown!r}: the prefix may not hold empty, '.' or '..' parts"
        )
    cloud = "az" if scheme in _AZURE else "s3"
    given = "s3" if scheme == "s3a" else scheme
    return ObjectLocation(cloud, bucket, prefix, account, given)


_STORES: dict[tuple[str, str, str | None, _Attempt], Any] = {}
_STORES_LOCK = threading.Lock()
#: The attempt the request ``call`` is making on this thread (None outside one).
_CURRENT = threading.local()


def store_for(loc: ObjectLocation) -> Any:
    """obstore's client for the location's bucket, configured for the request ``call``
    is making on this thread (its per-attempt timeouts suit the object: ``reads`` or
    ``writes``), else for a request on a small object. One client per bucket and kind of
    attempt in a process, configured from the environment when first made (the timeouts are
    in its configuration, and obstore has no per-request timeout)."""
    attempt = getattr(_CURRENT, "attempt", None) or _attempt_for(_settings(), None, None)
    return _store(loc, attempt)


def writer_store_for(loc: ObjectLocation) -> Any:
    """The client for obstore's multipart writer (``obstore.open_writer``): the writer
    uploads parts of ``WRITER_PART_BYTES`` inside its own calls, out of ``call``'s
    reach, so that client keeps obstore's own retries (``ROWTIME_STORE_RETRIES`` within
    ``ROWTIME_STORE_RETRY_TIMEOUT_S``; a part upload is idempotent, its completion decided by
    obstore)."""
    got = _settings()
    plain = _attempt_for(got, None, WRITER_PART_BYTES)
    return _store(loc, _Attempt(plain.timeout_s, None, obstore_retries=True))


def _store(loc: ObjectLocation, attempt: _Attempt) -> Any:
    key = (loc.cloud, loc.bucket, loc.account, attempt)
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            store = _STORES[key] = _make_store(loc, attempt)
        return store


def forget_stores() -> None:
    """Drop the cached clients and settings (tests that change the environment call this)."""
    global _SETTINGS
    with _STORES_LOCK:
        _STORES.clear()
        _CONDITIONAL_OK.clear()
        _SETTINGS = None


_CONDITIONAL_OK: set[tuple[str, str, str | None]] = set()


def create_if_absent(loc: ObjectLocation, key: str, data: bytes, what: str) -> bool:
    """Create ``key`` holding ``data`` unless it exists (``If-None-Match: *``, on a store
    checked by ``require_conditional_writes``); True if this call did. False may also be
    this call's own create reported as a conflict (S3's retried 409, or the retry of an
    attempt whose answer was lost finding that attempt's object): callers that must know read
    the object back, ``data`` carrying an id of theirs."""
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    require_conditional_writes(loc)
    try:
        call(loc, what, lambda: obstore.put(store_for(loc), key, data, mode="create"))
        return True
    except (AlreadyExistsError, PreconditionError):
        return False


def _first_put(loc: ObjectLocation, store: Any, key: str) -> None:
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    try:
        call(
            loc, "checking conditional writes", lambda: obstore.put(store, key, b"1", mode="create")
        )
    except (AlreadyExistsError, PreconditionError):
        pass  # the probe's name is new: this is the retry of our own first attempt
    except FileNotFoundError:  # obstore's not found: the bucket or container
        raise OptionError(
            f"{loc}: the bucket (or container) {loc.bucket!r} does not exist, or these "
            "credentials cannot see it; create it first (aws s3 mb s3://BUCKET, az storage "
            "container create --name CONTAINER), or check AWS_ENDPOINT_URL / "
            "AZURE_STORAGE_ENDPOINT"
        ) from None


def require_conditional_writes(loc: ObjectLocation) -> None:
    """Refuse a store that does not honour conditional writes, before the first write that
    relies on them (once per bucket and process).

    Every guarantee of this backend rests on two answers of the store: a create of an existing
    key fails (``If-None-Match: *``) and a put with a stale etag fails (``If-Match``). A server
    that ignores those headers (some S3-compatible servers do: s3rver, older releases of
    others) would let two writers both "win" a commit and silently lose records. So a probe
    object below the location's prefix is created twice and replaced with a wrong etag; both
    must be refused, and it is removed."""
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    key = (loc.cloud, loc.bucket, loc.account)
    if key in _CONDITIONAL_OK:
        return
    store = store_for(loc)
    probe = loc.key(f"_rowtime_probe-{uuid.uuid4().hex}")
    ignored = []
    try:
        _first_put(loc, store, probe)
        try:
            call(
                loc,
                "checking conditional writes",
                lambda: obstore.put(store, probe, b"2", mode="create"),
            )
            ignored.append("a create of an existing object (If-None-Match: *) succeeded")
        except (AlreadyExistsError, PreconditionError):
            pass
        stale: Any = {"e_tag": '"00000000000000000000000000000000"'}
        try:
            call(
                loc,
                "checking conditional writes",
                lambda: obstore.put(store, probe, b"3", mode=stale),
            )
            ignored.append("a put with a stale etag (If-Match) succeeded")
        except (AlreadyExistsError, PreconditionError):
            pass
    finally:
        try:
            call(loc, "removing the probe object", lambda: obstore.delete(store, probe))
        except Exception:
            pass
    if ignored:
        raise OptionError(
            f"the object store serving {loc} does not honour conditional writes: "
            f"{'; '.join(ignored)}. Streams and sink targets there would let two writers "
            "overwrite each other's commits, so they are refused. Use a store that decides "
            "conditional puts (Amazon S3, Azure Blob Storage, or an S3-compatible server that "
            "supports If-None-Match and If-Match on PUT)"
        )
    _CONDITIONAL_OK.add(key)


#: The client's timeouts and retries: (environment variable, default, what it is). A request
#: is made of attempts, each bounded by a timeout that suits its object (``_attempt_for``),
#: and ``call`` retries a failed attempt (backoff with jitter) while ``RETRIES`` allow and
#: ``RETRY_TIMEOUT`` has not passed since the first failure, as the AWS SDKs do: a lost reply
#: then costs one attempt's timeout, never the query. ``TIMEOUT`` is short (5 s) because the
#: objects the protocol waits on are small (commits, trims, leases, manifest entries, a page of
#: a listing): their answers take milliseconds, and a request that hangs is better abandoned
#: and sent again. It must stay well below ``RETRY_TIMEOUT``: an attempt allowed as long as the
#: retry window would let one hung GET outlast the window and never be retried.
STORE_SETTINGS: dict[str, tuple[str, float, str]] = {
    "timeout": (
        "ROWTIME_STORE_TIMEOUT_S",
        5.0,
        "seconds one attempt of a request on a small object may take, body included",
    ),
    "min_rate": (
        "ROWTIME_STORE_MIN_MB_S",
        1.0,
        "the slowest transfer, in MB per second, an attempt on a large object is given time for",
    ),
    "connect_timeout": ("ROWTIME_STORE_CONNECT_TIMEOUT_S", 2.0, "seconds to connect"),
    "max_retries": ("ROWTIME_STORE_RETRIES", 3, "retries of a failed request"),
    "retry_timeout": (
        "ROWTIME_STORE_RETRY_TIMEOUT_S",
        20.0,
        "seconds after a request's first failed attempt during which it may be retried",
    ),
}
#: ``reads=UNKNOWN_SIZE``: a read whose size is not known before its answer (a staged run).
UNKNOWN_SIZE = -1
#: The parts obstore's multipart writer uploads (S3's minimum part is 5 MiB).
WRITER_PART_BYTES = 16 << 20
#: Backoff before retry n (0, 1, ...): uniform in [0, min(cap, first * 2**n)] ("full
#: jitter", as the AWS SDKs: retries of many clients spread out instead of coming in waves).
_BACKOFF_FIRST_S = 0.1
_BACKOFF_CAP_S = 5.0
#: An attempt at a read of unknown size may last this many small-object timeouts, as long as
#: its answer keeps coming (the read-idle timeout catches one that stops).
_UNKNOWN_READ_FACTOR = 128

_SETTINGS: dict[str, float] | None = None


def store_settings() -> dict[str, float]:
    """The client settings of ``STORE_SETTINGS``, each from its environment variable when
    set (a number >= 0; ``OptionError`` otherwise), else its default."""
    out: dict[str, float] = {}
    for name, (env, default, what) in STORE_SETTINGS.items():
        raw = os.environ.get(env)
        if raw is None or raw == "":
            out[name] = default
            continue
        try:
            value = float(raw) if name != "max_retries" else int(raw)
        except ValueError:
            value = -1
        if value < 0 or (name != "max_retries" and value == 0) or not math.isfinite(value):
            kind = "a whole number >= 0" if name == "max_retries" else "a number > 0"
            raise OptionError(f"{env}={raw!r} ({what}) must be {kind}")
        out[name] = value
    return out


def _settings() -> dict[str, float]:
    """``store_settings``, read once per process (until ``forget_stores``), as the
    clients made from them are."""
    global _SETTINGS
    got = _SETTINGS
    if got is None:
        got = _SETTINGS = store_settings()
    return got


@dataclass(frozen=True)
class _Attempt:
    """How one attempt of a request is bounded: its whole time (``timeout_s``, connecting to
    the answer's last byte), the longest silence while it waits for or reads its answer
    (``read_idle_s``; None: only the whole time), and whether obstore retries inside it (only
    the multipart writer's client: every other retry is ``call``'s)."""

    timeout_s: float
    read_idle_s: float | None
    obstore_retries: bool = False


def _attempt_for(got: dict[str, float], reads: int | None, writes: int | None) -> _Attempt:
    """The attempt that suits a request reading ``reads`` or writing ``writes`` bytes (None:
    a small object, or none).

    A small object's attempt takes at most ``timeout``. A larger one is given the time its
    bytes take at ``min_rate``, rounded up to ``timeout`` times a power of two (few distinct
    clients per bucket). A read also ends when its answer is silent for ``timeout``: the
    server answers a GET at once and sends its body steadily, so silence means it was lost,
    whatever the size (a write's answer comes only after its whole body was sent, so a write
    has no such bound)."""
    small = got["timeout"]
    size = reads if reads is not None else writes
    if size is None:
        return _Attempt(small, None)
    if size == UNKNOWN_SIZE:
        return _Attempt(small * _UNKNOWN_READ_FACTOR, small)
    need = size / (got["min_rate"] * 1e6)
    steps = 0 if need <= small else math.ceil(math.log2(need / small) - 1e-9)
    return _Attempt(small * 2**steps, small if reads is not None else None)


#: obstore's HTTP client settings that it also reads from ``AWS_<KEY>`` / ``AZURE_<KEY>``
#: variables: handing it client options replaces what it read from the environment, so the
#: backend passes these on itself (``AWS_ALLOW_HTTP`` above all).
_ENV_CLIENT_KEYS = {
    "allow_http": bool,
    "allow_invalid_certificates": bool,
    "default_content_type": str,
    "http1_only": bool,
    "http2_only": bool,
    "pool_idle_timeout": str,
    "pool_max_idle_per_host": str,
    "proxy_url": str,
    "proxy_ca_certificate": str,
    "proxy_excludes": str,
    "user_agent": str,
    "read_timeout": str,
}


def _env_client_options(cloud: str) -> dict[str, Any]:
    prefix = "AWS_" if cloud == "s3" else "AZURE_"
    out: dict[str, Any] = {}
    for key, kind in _ENV_CLIENT_KEYS.items():
        raw = os.environ.get(prefix + key.upper())
        if raw is None:
            continue
        out[key] = raw.strip().lower() in ("1", "true", "yes", "on") if kind is bool else raw
    return out


def _client_options(cloud: str, attempt: _Attempt) -> dict[str, Any]:
    got = _settings()
    client: dict[str, Any] = {
        **_env_client_options(cloud),
        "timeout": timedelta(seconds=attempt.timeout_s),
        "connect_timeout": timedelta(seconds=min(got["connect_timeout"], attempt.timeout_s)),
    }
    if attempt.read_idle_s is not None:
        client["read_timeout"] = timedelta(seconds=attempt.read_idle_s)
    retries = int(got["max_retries"]) if attempt.obstore_retries else 0
    # obstore counts its window from the first attempt's start, call() from its failure
    window = attempt.timeout_s + got["retry_timeout"]
    return {
        "client_options": client,
        "retry_config": {
            "max_retries": retries,
            "retry_timeout": timedelta(seconds=window),
            "backoff": {
                "init_backoff": timedelta(seconds=_BACKOFF_FIRST_S),
                "max_backoff": timedelta(seconds=_BACKOFF_CAP_S),
                "base": 2,
            },
        },
    }


def _make_store(loc: ObjectLocation, attempt: _Attempt) -> Any:
    try:
        from obstore.store import AzureStore, S3Store
    except ImportError:
        raise OptionError(
            f"{loc} is an object storage location, and obstore is not installed: "
            "pip install 'pyspark-rowtime[cloud]'"
        ) from None
    options = _client_options(loc.cloud, attempt)
    try:
        if loc.cloud == "s3":
            return S3Store(loc.bucket, **options)
        if loc.account:
            return AzureStore(loc.bucket, account_name=loc.account, **options)
        return AzureStore(loc.bucket, **options)
    except Exception as e:  # obstore's configuration errors name keys, never their values
        raise OptionError(f"cannot configure a client for {loc}: {_short(e)}") from None


def _short(e: BaseException) -> str:
    """The first line of an obstore error (its debug dump follows), secrets redacted."""
    return redact(str(e).split("\n", 1)[0])[:500]


def call(
    loc: ObjectLocation,
    what: str,
    fn: Callable[[], T],
    *,
    reads: int | None = None,
    writes: int | None = None,
    retry: bool = True,
) -> T:
    """``fn()``, a request to the store at ``loc`` (``what`` is being done: for messages),
    retried when an attempt fails to reach the store or to hear its answer, with obstore's
    errors other than the expected ones (not found, already exists, precondition failed: the
    caller handles those) turned into the project's.

    ``fn`` gets its client from ``store_for`` (inside ``fn``): the client's timeouts suit
    the object, ``reads`` or ``writes`` bytes of it (None: a small object). An attempt that
    fails on the way (a timeout, a reset, a 5xx) is tried again after a backoff with jitter,
    while ``ROWTIME_STORE_RETRIES`` allow and ``ROWTIME_STORE_RETRY_TIMEOUT_S`` has not passed
    since the first failure; then ``ObjectStoreUnavailableError``.

    Repeating must be safe: every read is; a plain put or delete of a key only this writer
    writes ends as the first would; a conditional put carries an id of its caller's (a commit
    id, a lease token, a random mark), so when the retry of an attempt that was applied and
    whose answer was lost hears "already exists" or "precondition failed", the caller reads
    the object back and recognises its own write, as it does for S3's retried 409. A request
    that must not be repeated passes ``retry=False``."""
    got = _settings()
    attempt = _attempt_for(got, reads, writes)
    retries = 0
    first_failure: float | None = None
    while True:
        outer = getattr(_CURRENT, "attempt", None)
        _CURRENT.attempt = attempt
        try:
            return _attempt_once(loc, what, fn)
        except _Unreached as e:
            cause = e.cause
        finally:
            _CURRENT.attempt = outer
        now = time.monotonic()
        if first_failure is None:
            first_failure = now
        left = first_failure + got["retry_timeout"] - now
        if not retry or retries >= got["max_retries"] or left <= 0:
            tried = "one attempt" if retries == 0 else f"{retries + 1} attempts"
            raise ObjectStoreUnavailableError(
                f"the object store did not complete {what} at {loc} ({tried}; {cause}). "
                "Nothing of that step is assumed done; retry when the store answers (timeouts "
                "and retries: ROWTIME_STORE_TIMEOUT_S, ROWTIME_STORE_RETRIES, "
                "ROWTIME_STORE_RETRY_TIMEOUT_S)"
            ) from None
        time.sleep(min(random.uniform(0, min(_BACKOFF_CAP_S, _BACKOFF_FIRST_S * 2**retries)), left))
        retries += 1


class _Unreached(Exception):
    """An attempt that did not reach the store, or whose answer did not come back."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


def _attempt_once(loc: ObjectLocation, what: str, fn: Callable[[], T]) -> T:
    from obstore.exceptions import (
        AlreadyExistsError,
        PermissionDeniedError,
        PreconditionError,
        UnauthenticatedError,
    )

    try:
        return fn()
    except (FileNotFoundError, AlreadyExistsError, PreconditionError):  # obstore: not found is
        # Python's FileNotFoundError
        raise
    except (PermissionDeniedError, UnauthenticatedError) as e:
        raise OptionError(
            f"the object store refused {what} at {loc}: {_short(e)}; check the credentials in "
            "the environment (AWS_* or AZURE_STORAGE_* variables, or the machine's role) and "
            "their rights on the bucket"
        ) from None
    except RowtimeError:
        raise
    except Exception as e:
        if type(e).__module__.startswith("obstore") or isinstance(e, (OSError, TimeoutError)):
            raise _Unreached(_short(e)) from None
        raise


def get_whole(store: Any, key: str) -> tuple[bytes, dict[str, Any]]:
    """The object at ``key`` and its metadata (``e_tag``, ...), its body read to the end: for a
    ``fn`` of ``call``, so that an answer cut in its body is a failed attempt, retried
    like one cut before it (obstore's ``get`` returns when the headers have come)."""
    import obstore

    result = obstore.get(store, key)
    return bytes(result.bytes()), dict(result.meta)


def delete_objects(loc: ObjectLocation, store: Any, keys: Sequence[str], what: str) -> None:
    """Remove ``keys`` from ``store`` (at ``loc``, for messages: ``what`` was being done): a key
    already gone is no error, as on S3. Azure Blob fails a bulk delete that names a missing
    blob: the keys are then removed one by one, each missing one skipped."""
    import obstore

    keys = list(keys)
    if not keys:
        return
    try:
        call(loc, what, lambda: obstore.delete(store, keys))
    except FileNotFoundError:
        for key in keys:
            try:
                call(loc, what, partial(obstore.delete, store, key))
            except FileNotFoundError:
                pass

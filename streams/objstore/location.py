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
(:func:`...bounds.redaction.redact`: a signature or a key from the environment is masked).
"""

from __future__ import annotations

import os
import re
import threading
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
    "ObjectLocation",
    "ObjectStoreUnavailableError",
    "call",
    "create_if_absent",
    "parse_location",
    "require_conditional_writes",
    "store_for",
]

#: The URL schemes this backend serves.
SCHEMES = ("s3", "s3a", "az", "azure", "abfs", "abfss")
_AZURE = ("az", "azure", "abfs", "abfss")

T = TypeVar("T")


class ObjectStoreUnavailableError(RowtimeError, ConnectionError):
    """The object store did not answer (after obstore's retries), or refused the credentials."""


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
    """``location`` parsed; :class:`OptionError` saying what is wrong and what a location
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


_STORES: dict[tuple[str, str, str | None], Any] = {}
_STORES_LOCK = threading.Lock()


def store_for(loc: ObjectLocation) -> Any:
    """obstore's client for the location's bucket (one per bucket and process; configured from
    the environment when first made)."""
    key = (loc.cloud, loc.bucket, loc.account)
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            store = _STORES[key] = _make_store(loc)
        return store


def forget_stores() -> None:
    """Drop the cached clients (tests that change the environment call this)."""
    with _STORES_LOCK:
        _STORES.clear()
        _CONDITIONAL_OK.clear()


_CONDITIONAL_OK: set[tuple[str, str, str | None]] = set()


def create_if_absent(loc: ObjectLocation, key: str, data: bytes, what: str) -> bool:
    """Create ``key`` holding ``data`` unless it exists (``If-None-Match: *``, on a store
    checked by :func:`require_conditional_writes`); True if this call did. False may also be
    this call's own create reported as a conflict (S3's retried 409): callers that must know
    read the object back."""
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

    try:
        call(
            loc, "checking conditional writes", lambda: obstore.put(store, key, b"1", mode="create")
        )
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


#: The client's timeouts and retries: (environment variable, default, what it is). The
#: defaults bound how long one request to a store that does not answer may take: a refused
#: connection fails in about a second (``RETRIES`` quick attempts), a store that accepts the
#: connection and never answers in ``TIMEOUT`` (a request that timed out is retried only while
#: ``RETRY_TIMEOUT`` has not passed). obstore's own defaults (10 retries within 3 minutes)
#: made an unreachable endpoint fail after minutes.
STORE_SETTINGS: dict[str, tuple[str, float, str]] = {
    "timeout": ("ROWTIME_STORE_TIMEOUT_S", 30.0, "seconds one request may take, body included"),
    "connect_timeout": ("ROWTIME_STORE_CONNECT_TIMEOUT_S", 5.0, "seconds to connect"),
    "max_retries": ("ROWTIME_STORE_RETRIES", 3, "retries of a failed request"),
    "retry_timeout": (
        "ROWTIME_STORE_RETRY_TIMEOUT_S",
        20.0,
        "seconds after a request's first attempt during which it may be retried",
    ),
}


def store_settings() -> dict[str, float]:
    """The client settings of :data:`STORE_SETTINGS`, each from its environment variable when
    set (a number >= 0; :class:`OptionError` otherwise), else its default."""
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
        if value < 0 or (name != "max_retries" and value == 0):
            kind = "a whole number >= 0" if name == "max_retries" else "a number of seconds > 0"
            raise OptionError(f"{env}={raw!r} ({what}) must be {kind}")
        out[name] = value
    return out


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


def _client_options(cloud: str) -> dict[str, Any]:
    got = store_settings()
    return {
        "client_options": {
            **_env_client_options(cloud),
            "timeout": timedelta(seconds=got["timeout"]),
            "connect_timeout": timedelta(seconds=got["connect_timeout"]),
        },
        "retry_config": {
            "max_retries": int(got["max_retries"]),
            "retry_timeout": timedelta(seconds=got["retry_timeout"]),
            "backoff": {
                "init_backoff": timedelta(milliseconds=100),
                "max_backoff": timedelta(seconds=5),
                "base": 2,
            },
        },
    }


def _make_store(loc: ObjectLocation) -> Any:
    try:
        from obstore.store import AzureStore, S3Store
    except ImportError:
        raise OptionError(
            f"{loc} is an object storage location, and obstore is not installed: "
            "pip install 'pyspark-rowtime[cloud]'"
        ) from None
    options = _client_options(loc.cloud)
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


def call(loc: ObjectLocation, what: str, fn: Callable[[], T]) -> T:
    """``fn()``, with obstore's errors other than the expected ones (not found, already exists,
    precondition failed: the caller handles those) turned into the project's, naming
    ``what`` was being done at ``loc``."""
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
            raise ObjectStoreUnavailableError(
                f"the object store did not complete {what} at {loc} ({_short(e)}). Nothing of "
                "that step is assumed done; retry when the store answers (timeouts and retries: "
                "ROWTIME_STORE_TIMEOUT_S, ROWTIME_STORE_RETRIES, ROWTIME_STORE_RETRY_TIMEOUT_S)"
            ) from None
        raise


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

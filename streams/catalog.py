"""The catalog: a TOML file that names streams (and the connectors that feed them).

Operators set streams up once; Spark users then read and write them by name
(``option("stream", "orders")``). The shape::

    [streams.orders]
    location = "/data/orders"          # or redis://host:6379/0/orders, s3://bucket/orders,
                                        # az://container/orders; a path: relative to this file
    schema = "ticker STRING, qty INT, ts TIMESTAMP"
    partitions = 2                      # default 1
    reader = { order = "adjust", "adjust.unit" = "msec", "adjust.range" = 999 }
    retention = "7 days"                # records older are removed (streams.retention)
    sink = { clock = "bounds" }         # the sink's options, below a query's own
    password_env = "REDIS_PASSWORD"     # Redis only: the password, by environment variable

    [connectors.orders-files]
    kind = "directory"                  # checked in full by pyspark_rowtime.connectors
    stream = "orders"

    [servers.ingest]                    # `rowtime serve ingest`: an Arrow Flight endpoint
    streams = ["orders"]                # the catalog's streams it serves (or root = "DIR")
    port = 8815
    token_file = "/etc/rowtime/tokens"  # the tokens live in that file (mode 600), never here

Rules this module enforces (the connectors' own keys are checked by ``connectors/``):

* a secret is never inline: a location with a password (``redis://u:pw@...``,
  ``s3://key:secret@...``) or a signature (``?sig=...``), or a key that names a secret
  (``bounds.redaction.names_a_secret``: ``password``, ``token``,
  ``aws_secret_access_key``, ``aws_session_token``, ``account_key``, ``sas_token``,
  ``connection_string``, ``client_secret``, ...), is an error that says where the secret goes
  instead (Redis: ``password_env`` naming an environment variable; object storage: the cloud's
  own variables or credential files) and never shows its value;
* a stream's or a connector's name is a plain name (``NAME_RE``): letters, digits and
  ``_ . -``, not starting with ``.``; a connector's progress folder is named after it, so a
  name cannot reach outside its folder (``..``, ``/``, an absolute path);
* a URL location is checked by its backend when the catalog is read (no I/O): a malformed one
  is an error at its line, not at first use;
* every error is a ``CatalogError`` naming the file, the line and the key
  (``/etc/rowtime.toml:7: streams.orders.partitions = 0: ...``); a TOML syntax error keeps
  tomllib's line and column;
* an unknown stream name is an error listing the known ones.

Where the catalog is: ``find_catalog`` (an explicit path, then the Spark conf
``spark.rowtime.catalog`` where the caller can see it, then ``ROWTIME_CATALOG``). A Python data
source cannot read Spark confs (it runs in Spark's Python workers and sees only its options):
``pyspark_rowtime.use_catalog(spark)`` reads the conf on the driver and hands it to
``format("rowtime")``; ``ROWTIME_CATALOG`` reaches the workers when set before the session
starts (integration/test_catalog_spark.py tests all three).
A stream is created from its entry on first use (``ensure_stream``); an existing stream whose
schema or partitions differ from its entry is an error that shows both.
"""

from __future__ import annotations

import os
import re
import sys
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..bounds.errors import OptionError, RowtimeError, StreamNotFoundError
from ..bounds.redaction import holds_secret, names_a_secret, redact, split_userinfo
from .ddl import to_ddl
from .meta import payload_schema, validate_defaults
from .storage import MAX_PARTITIONS, create_stream, open_stream, resolve

if TYPE_CHECKING:
    from .storage import StreamStorage

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 installs tomli (pyproject.toml)
    import tomli as tomllib

__all__ = [
    "CATALOG_CONF",
    "CATALOG_ENV",
    "Catalog",
    "CatalogError",
    "ConnectorEntry",
    "StreamEntry",
    "ensure_stream",
    "find_catalog",
    "load_catalog",
    "redact",
]

CATALOG_ENV = "ROWTIME_CATALOG"
CATALOG_CONF = "spark.rowtime.catalog"

#: Keys of a ``[streams.NAME]`` table, with what each accepts.
STREAM_KEYS: dict[str, str] = {
    "location": "a path (relative to the catalog file), a redis:// URL or an object storage URL "
    "(s3://bucket/prefix, az://container/prefix)",
    "schema": "the payload schema as Spark DDL, e.g. 'ticker STRING, qty INT'",
    "partitions": f"a whole number from 1 to {MAX_PARTITIONS} (default 1)",
    "reader": "a table of reader defaults (order, adjust.unit, adjust.range, rowtime.column, ...)",
    "sink": "a table of sink options (clock, target, granularity, compression)",
    "password_env": "the name of an environment variable holding the Redis password",
    "retention": "a duration of rowtime such as '7 days' (records older are removed; default off)",
    "retention_size": "a size per partition such as '10 GiB' (embedded log; default off)",
    "description": "free text for people",
}
#: Sink options a catalog may set for writers of a stream (the query's own options win).
SINK_KEYS = ("clock", "target", "granularity", "compression")
#: A stream's or a connector's name: it names folders (a connector's progress), so it cannot
#: hold a path separator or start with a dot ("." and ".." included).
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
NAME_RULE = "letters, digits and _ . - (1 to 128 of them, not starting with '.')"


def _credentials_from(scheme: str) -> str:
    """Where the credentials of a ``scheme://`` location come from (never the catalog)."""
    if scheme in ("s3", "s3a"):
        where = (
            "the environment variables AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
            "AWS_PROFILE, ...) or the machine's role"
        )
    elif scheme in ("az", "azure", "abfs", "abfss"):
        where = (
            "the environment variables AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY "
            "(or AZURE_STORAGE_SAS_TOKEN, AZURE_CLIENT_ID, ...) or the machine's managed identity"
        )
    else:
        where = "the environment of the processes that use the stream"
    return f"{scheme}:// credentials come from {where}"


class CatalogError(OptionError):
    """A catalog that cannot be used: the message names the file, line and key.

    Examples:
        Also an ``OptionError``, so code that catches bad options catches it:

        >>> import pyspark_rowtime as rt
        >>> issubclass(rt.CatalogError, rt.OptionError)
        True
    """


# -- where keys are --------------------------------------------------------------------------

_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
_KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_.-]+)\s*=""")


def _split_key(text: str) -> list[str]:
    """A dotted TOML key as its parts (quoted parts kept whole)."""
    parts = re.findall(r'"([^"]*)"|\'([^\']*)\'|([A-Za-z0-9_-]+)', text)
    return [a or b or c for a, b, c in parts]


def _line_of(text: str, path: tuple[str, ...]) -> int | None:
    """The 1-based line where the key ``path`` (table parts, then key) is defined, or where its
    table starts; None if neither is found. tomllib gives no positions for values, so the file
    is scanned: table headers and ``key =`` lines (enough for what catalogs look like)."""
    table: list[str] = []
    best: int | None = None
    for i, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if header and not line.lstrip().startswith("[["):
            table = _split_key(header.group(1))
            if tuple(table) == path[: len(table)] and len(table) <= len(path):
                if best is None or len(table) == len(path):
                    best = i
            continue
        key = _KEY.match(line)
        if key:
            full = (*table, *_split_key(key.group(1)))
            if full == path[: len(full)] and len(full) >= len(table) + 1:
                return i
    return best


# -- entries ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamEntry:
    """One ``[streams.NAME]`` table, checked. ``location`` is absolute (or a URL, secret-free
    but for the environment variable it names); ``reader`` holds canonical stream defaults
    (``meta.KNOWN_DEFAULTS``); ``sink`` the sink options it sets."""

    name: str
    location: str
    schema: pa.Schema
    partitions: int
    reader: dict[str, Any] = field(default_factory=dict)
    sink: dict[str, str] = field(default_factory=dict)
    catalog: str = ""
    #: ``retention`` / ``retention_size`` of the stream (canonical: microseconds, bytes), set
    #: when the stream is created from this entry.
    retention: dict[str, Any] = field(default_factory=dict)

    @property
    def ddl(self) -> str:
        return to_ddl(self.schema)


@dataclass(frozen=True)
class ConnectorEntry:
    """One ``[connectors.NAME]`` table: ``kind`` and ``stream`` checked here, the rest
    (``settings``, every key but those two) by ``pyspark_rowtime.connectors``."""

    name: str
    kind: str
    stream: str
    settings: dict[str, Any]
    catalog: str = ""


CONNECTOR_KINDS = ("directory", "generator", "redis")


#: The keys of a ``[servers.NAME]`` table (``rowtime serve NAME``) and what each holds.
SERVER_KEYS = {
    "root": "a folder whose streams are served by relative path (relative to the catalog)",
    "streams": "a list of this catalog's stream names to serve (default: all, unless root)",
    "host": "the address to listen on (default 127.0.0.1)",
    "port": "the port, 0 to 65535 (default 8815)",
    "token_file": "a file of bearer tokens, one a line, mode 600 (relative to the catalog)",
    "tls_cert": "a PEM certificate chain (relative to the catalog), with tls_key",
    "tls_key": "a PEM private key (relative to the catalog), with tls_cert",
    "max_message_bytes": "the largest message taken, in bytes (an int >= 1)",
    "metrics_port": "a port for Prometheus metrics",
}


@dataclass(frozen=True)
class Catalog:
    """A loaded, checked catalog file."""

    path: str
    text: str
    streams: dict[str, StreamEntry]
    connectors: dict[str, ConnectorEntry]
    #: ``[servers.NAME]``: the options of ``rowtime serve NAME`` (paths made absolute).
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)

    def error(self, keys: tuple[str, ...], value: Any, why: str) -> CatalogError:
        """The error for the key ``keys`` (table parts, then key) holding ``value``."""
        return _error(self.path, self.text, keys, value, why)

    def missing(self, keys: tuple[str, ...], why: str) -> CatalogError:
        """The error for the key ``keys`` that is not there (the line of its table)."""
        return _error(self.path, self.text, keys, _MISSING, why)

    def stream(self, name: str) -> StreamEntry:
        """The entry named ``name``; an error listing the known names if there is none."""
        entry: StreamEntry = self._named(self.streams, "stream", name)
        return entry

    def connector(self, name: str) -> ConnectorEntry:
        """The connector named ``name``; an error listing the known names if there is none."""
        entry: ConnectorEntry = self._named(self.connectors, "connector", name)
        return entry

    def _named(self, entries: dict[str, Any], kind: str, name: str) -> Any:
        entry = entries.get(name)
        if entry is None:
            known = ", ".join(sorted(entries)) or "(none)"
            raise CatalogError(
                f"no {kind} {name!r} in catalog {self.path}; its {kind}s are: {known}"
            )
        return entry


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return "{...}"
    return redact(repr(value))


def _error(path: str, text: str, keys: tuple[str, ...], value: Any, why: str) -> CatalogError:
    line = _line_of(text, keys)
    where = f"{path}:{line}" if line else path
    dotted = ".".join(k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else f'"{k}"' for k in keys)
    shown = "" if value is _MISSING else f" = {_shown(value)}"
    return CatalogError(f"{where}: {dotted}{shown}: {why}")


_MISSING = object()


def load_catalog(path: str | os.PathLike[str]) -> Catalog:
    """Read and check the catalog at ``path``. Raises ``CatalogError`` (file, line, key)."""
    path = os.path.abspath(os.fspath(path))
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise CatalogError(f"catalog {path} cannot be read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
        doc = tomllib.loads(text)
    except UnicodeDecodeError as e:
        raise CatalogError(f"catalog {path} is not UTF-8 text: {e}") from None
    except tomllib.TOMLDecodeError as e:
        # tomllib's message ends with "(at line L, column C)".
        raise CatalogError(f"{path}: not valid TOML: {e}") from None
    _no_inline_secrets(path, text, doc, ())
    unknown = [k for k in doc if k not in ("streams", "connectors", "servers")]
    if unknown:
        raise _error(
            path,
            text,
            (unknown[0],),
            _MISSING,
            "unknown table; a catalog has streams, connectors, servers",
        )
    streams: dict[str, StreamEntry] = {}
    for name, table in _tables(path, text, doc, "streams").items():
        streams[name] = _stream_entry(path, text, name, table)
    connectors: dict[str, ConnectorEntry] = {}
    for name, table in _tables(path, text, doc, "connectors").items():
        connectors[name] = _connector_entry(path, text, name, table, streams)
    servers = {
        name: _server_entry(path, text, name, table, streams)
        for name, table in _tables(path, text, doc, "servers").items()
    }
    return Catalog(path, text, streams, connectors, servers)


def _server_entry(
    path: str, text: str, name: str, table: dict[str, Any], streams: Mapping[str, StreamEntry]
) -> dict[str, Any]:
    """One ``[servers.NAME]`` table, checked: the options of ``rowtime serve NAME``."""

    def fail(key: str, why: str) -> CatalogError:
        return _error(path, text, ("servers", name, key), table.get(key, _MISSING), why)

    out: dict[str, Any] = {}
    for key, value in table.items():
        if key not in SERVER_KEYS:
            raise fail(key, f"unknown key; a server accepts: {', '.join(SERVER_KEYS)}")
        if key in ("port", "metrics_port", "max_message_bytes"):
            low = 1 if key == "max_message_bytes" else 0
            high = 2**62 if key == "max_message_bytes" else 65535
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise fail(key, f"must be {SERVER_KEYS[key]}")
            out[key] = value
        elif key == "streams":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise fail(key, f"must be {SERVER_KEYS[key]}")
            missing = [v for v in value if v not in streams]
            if missing:
                known = ", ".join(sorted(streams)) or "(none)"
                raise fail(key, f"no stream {missing[0]!r} in this catalog; it has: {known}")
            out[key] = list(value)
        else:
            if not isinstance(value, str) or not value.strip():
                raise fail(key, f"must be {SERVER_KEYS[key]}")
            if key == "host":
                out[key] = value.strip()
            else:
                expanded = os.path.expanduser(value.strip())
                out[key] = os.path.normpath(os.path.join(os.path.dirname(path), expanded))
    return out


def _where_secret_goes(key: str) -> str:
    """Where the secret a catalog key ``key`` would hold belongs (never the catalog)."""
    words = set(re.split(r"[^a-z0-9]+", re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).lower()))
    if words & {"aws", "s3", "session"} or key.lower().startswith("aws"):
        return (
            "AWS credentials come from the environment variables AWS_ACCESS_KEY_ID, "
            "AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, a profile of ~/.aws/credentials "
            "(AWS_PROFILE), or the machine's role"
        )
    azure = {"azure", "account", "sas", "connection", "shared", "client", "tenant", "abfs"}
    if words & azure:
        return (
            "Azure credentials come from the environment variables AZURE_STORAGE_ACCOUNT_KEY, "
            "AZURE_STORAGE_SAS_TOKEN or AZURE_CLIENT_ID/AZURE_CLIENT_SECRET/AZURE_TENANT_ID, "
            "or the machine's managed identity"
        )
    return (
        "a Redis password goes in an environment variable named by "
        'password_env = "VARIABLE"; object storage credentials come from the cloud\'s '
        "environment variables (AWS_*, AZURE_STORAGE_*) or the machine's role"
    )


def _no_inline_secrets(path: str, text: str, node: Any, keys: tuple[str, ...]) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            here = (*keys, k)
            if names_a_secret(k) and not isinstance(v, dict):
                raise _error(
                    path,
                    text,
                    here,
                    _MISSING,
                    "names a secret, and secrets are never written in a catalog (its value is "
                    f"not shown): remove it; {_where_secret_goes(k)}",
                )
            _no_inline_secrets(path, text, v, here)
    elif isinstance(node, str) and holds_secret(node):
        _, _, password, _ = split_userinfo(node.strip())
        scheme = node.strip().split("://", 1)[0].lower() if "://" in node else ""
        why = "the URL holds a password (not shown)"
        if password is None:
            why = "the value holds a token or a signature (not shown)"
            where = _credentials_from(scheme) if scheme else _where_secret_goes("")
            instead = f"remove it: {where}"
        elif scheme in ("redis", "rediss"):
            instead = (
                'remove it and set password_env = "VARIABLE" naming an environment variable '
                "that holds it"
            )
        else:
            instead = f"remove it: {_credentials_from(scheme)}"
        raise _error(
            path,
            text,
            keys,
            _MISSING,
            f"{why}: secrets are never written in a catalog; {instead}",
        )
    elif isinstance(node, list):
        for v in node:
            _no_inline_secrets(path, text, v, keys)


def _check_names(path: str, text: str, top: str, node: dict[str, Any]) -> None:
    for name in node:
        if not NAME_RE.match(name):
            raise _error(
                path,
                text,
                (top, name),
                _MISSING,
                f"a {top[:-1]} name may hold only {NAME_RULE}: a name becomes part of folder "
                "names, and this one could reach outside them; rename it",
            )


def _tables(path: str, text: str, doc: dict[str, Any], top: str) -> dict[str, dict[str, Any]]:
    node = doc.get(top, {})
    if not isinstance(node, dict):
        raise _error(path, text, (top,), node, f"must be tables [{top}.NAME]")
    for name, table in node.items():
        if not isinstance(table, dict):
            raise _error(path, text, (top, name), table, f"must be a table [{top}.{name}]")
    _check_names(path, text, top, node)
    return node


def _stream_entry(path: str, text: str, name: str, table: dict[str, Any]) -> StreamEntry:
    def fail(key: str, why: str, value: Any = _MISSING) -> CatalogError:
        return _error(path, text, ("streams", name, key), table.get(key, value), why)

    for key in table:
        if key not in STREAM_KEYS:
            raise _error(
                path,
                text,
                ("streams", name, key),
                table[key],
                f"unknown key; a stream accepts: {', '.join(STREAM_KEYS)}",
            )
    for key in ("location", "schema"):
        if key not in table:
            raise _error(
                path, text, ("streams", name), _MISSING, f"key {key} is missing: {STREAM_KEYS[key]}"
            )
    location = table["location"]
    if not isinstance(location, str) or not location.strip():
        raise fail("location", f"must be {STREAM_KEYS['location']}")
    location = _location(path, location.strip(), table.get("password_env"), fail)
    schema_text = table["schema"]
    if not isinstance(schema_text, str):
        raise fail("schema", f"must be {STREAM_KEYS['schema']}")
    try:
        schema = payload_schema(schema_text)
    except RowtimeError as e:
        raise fail("schema", str(e)) from None
    partitions = table.get("partitions", 1)
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise fail("partitions", f"must be {STREAM_KEYS['partitions']}")
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise fail("partitions", f"must be {STREAM_KEYS['partitions']}")
    reader_raw = table.get("reader", {})
    if not isinstance(reader_raw, dict):
        raise fail("reader", f"must be {STREAM_KEYS['reader']}")
    reader: dict[str, Any] = {}
    for key, value in reader_raw.items():
        try:
            reader.update(validate_defaults({key: value}, schema))
        except RowtimeError as e:
            raise _error(path, text, ("streams", name, "reader", key), value, str(e)) from None
    sink_raw = table.get("sink", {})
    if not isinstance(sink_raw, dict):
        raise fail("sink", f"must be {STREAM_KEYS['sink']}")
    sink: dict[str, str] = {}
    for key, value in sink_raw.items():
        if key.lower() not in SINK_KEYS:
            raise _error(
                path,
                text,
                ("streams", name, "sink", key),
                value,
                f"unknown sink option; a catalog may set: {', '.join(SINK_KEYS)} (partitions "
                "and the location come from the stream itself)",
            )
        sink[key.lower()] = str(value)
    retention: dict[str, Any] = {}
    for key in ("retention", "retention_size"):
        if key in table:
            try:
                retention.update(validate_defaults({key: table[key]}, schema))
            except RowtimeError as e:
                raise fail(key, str(e)) from None
    return StreamEntry(name, location, schema, partitions, reader, sink, path, retention)


def _location(catalog: str, location: str, password_env: Any, fail: Any) -> str:
    """The entry's location: a path made absolute (relative to the catalog file), a URL kept as
    written (its backend checks it now, without I/O: a malformed one fails at its line)."""
    if "://" in location:
        scheme = location.split("://", 1)[0].lower()
        if scheme == "file":
            try:
                return urllib.parse.urlparse(location).path
            except ValueError:  # an unclosed "[": urllib's text would quote the location
                raise fail(
                    "location", "cannot be read as a file:// URL (file:///abs/path)"
                ) from None
        if password_env is not None:
            if not isinstance(password_env, str) or not re.fullmatch(r"[A-Za-z_]\w*", password_env):
                raise fail("password_env", "must be the name of an environment variable")
            if scheme not in ("redis", "rediss"):
                raise fail("password_env", _password_env_elsewhere(scheme))
            sep = "&" if "?" in location else "?"
            location = f"{location}{sep}password_env={password_env}"

        try:
            resolve(location)
        except OptionError as e:
            raise fail("location", str(e)) from None
        return location
    if password_env is not None:
        raise fail("password_env", _password_env_elsewhere(None))
    expanded = os.path.expanduser(location)
    return os.path.normpath(os.path.join(os.path.dirname(catalog), expanded))


def _password_env_elsewhere(scheme: str | None) -> str:
    why = "applies to redis:// and rediss:// locations only"
    if scheme is None:
        return f"{why}; a local stream needs no password: remove password_env"
    return f"{why}; {_credentials_from(scheme)}: remove password_env"


def _connector_entry(
    path: str, text: str, name: str, table: dict[str, Any], streams: Mapping[str, StreamEntry]
) -> ConnectorEntry:
    keys = ("connectors", name)
    kind = table.get("kind")
    if kind is None:
        raise _error(path, text, keys, _MISSING, f"key kind is missing: one of {CONNECTOR_KINDS}")
    if kind not in CONNECTOR_KINDS:
        raise _error(
            path, text, (*keys, "kind"), kind, f"must be one of {', '.join(CONNECTOR_KINDS)}"
        )
    stream = table.get("stream")
    if stream is None:
        raise _error(path, text, keys, _MISSING, "key stream is missing: a stream of this catalog")
    if stream not in streams:
        known = ", ".join(sorted(streams)) or "(none)"
        raise _error(
            path, text, (*keys, "stream"), stream, f"no such stream; this catalog has: {known}"
        )
    settings = {k: v for k, v in table.items() if k not in ("kind", "stream")}
    return ConnectorEntry(name, kind, stream, settings, path)


# -- finding it ------------------------------------------------------------------------------


def find_catalog(
    option: str | None = None,
    conf: str | None = None,
    env: Mapping[str, str] | None = None,
    *,
    needed_for: str = "option stream",
) -> str:
    """The catalog's path: ``option`` (``option("catalog", ...)``), else ``conf`` (the Spark
    conf ``spark.rowtime.catalog``, where the caller can read it), else the environment
    variable ``ROWTIME_CATALOG``. ``CatalogError`` says how to give one when none is."""
    env = os.environ if env is None else env
    for value in (option, conf, env.get(CATALOG_ENV)):
        if value is not None and str(value).strip():
            return os.path.abspath(os.path.expanduser(str(value).strip()))
    raise CatalogError(
        f"{needed_for} names a stream of a catalog, and no catalog is given: set "
        f'option("catalog", "/path/catalog.toml"); or the Spark conf {CATALOG_CONF} and call '
        "pyspark_rowtime.use_catalog(spark) once in the session (a Python data source cannot "
        f"read Spark confs); or the environment variable {CATALOG_ENV} before the session starts"
    )


# -- first use -------------------------------------------------------------------------------


def ensure_stream(entry: StreamEntry) -> StreamStorage:
    """The entry's stream, created from the entry if it does not exist yet.

    An existing stream whose schema or partition count differ from the entry is a
    ``CatalogError`` that shows both (the stream's reader defaults are the ones it was
    created with; the catalog's ``reader`` table still applies to readers by name).
    """
    try:
        storage = open_stream(entry.location)
    except StreamNotFoundError:
        storage = None
    if storage is None:
        try:
            return create_stream(
                entry.location,
                entry.schema,
                entry.partitions,
                **{**entry.reader, **entry.retention},
            )
        except RowtimeError as e:
            raise CatalogError(
                f"stream {entry.name!r} of catalog {entry.catalog} cannot be created at "
                f"{redact(entry.location)}: {e}"
            ) from None
    check_matches(entry, storage.meta.payload_schema, storage.meta.partitions)
    return storage


def check_matches(entry: StreamEntry, schema: pa.Schema, partitions: int) -> None:
    """``CatalogError`` showing both when the stream differs from its entry."""
    diffs = []
    if not schema.equals(entry.schema):
        diffs.append(f"schema: the stream has ({to_ddl(schema)}), the catalog says ({entry.ddl})")
    if partitions != entry.partitions:
        diffs.append(
            f"partitions: the stream has {partitions}, the catalog says {entry.partitions}"
        )
    if diffs:
        raise CatalogError(
            f"stream {entry.name!r} at {redact(entry.location)} differs from its entry in catalog "
            f"{entry.catalog}: {'; '.join(diffs)}. Change the catalog to match the stream, or "
            "point the entry at another location"
        )


# -- option("stream", NAME) ------------------------------------------------------------------


def resolve_stream_option(
    options: Mapping[str, Any], conf_catalog: str | None = None, *, who: str = "format('rowtime')"
) -> tuple[dict[str, Any], StreamEntry | None]:
    """Spark's options with ``stream``/``catalog`` replaced by the entry's ``path``.

    Without option ``stream`` the options come back unchanged (``catalog`` alone is refused:
    it would be silently ignored). With it, the catalog is found by ``find_catalog``
    (``option("catalog")``, then ``conf_catalog``, then ``ROWTIME_CATALOG``), the entry looked
    up (an unknown name lists the known ones) and its stream created on first use
    (``ensure_stream``). Giving ``path`` too is an error: one location, not two.
    """
    lowered = {str(k).lower(): (k, v) for k, v in options.items()}
    if "stream" not in lowered:
        if "catalog" in lowered:
            raise OptionError(
                f"option catalog is only used with option stream (a stream's name in the "
                f"catalog) for {who}; add option stream or remove option catalog"
            )
        return dict(options), None
    name = str(lowered["stream"][1]).strip()
    if "path" in lowered and str(lowered["path"][1]).strip():
        raise OptionError(
            f"options stream={name!r} and path={lowered['path'][1]!r} both name a location for "
            f"{who}; give one: stream (a name in the catalog) or path"
        )
    catalog_opt = lowered.get("catalog", (None, None))[1]
    path = find_catalog(catalog_opt, conf_catalog, needed_for=f"option stream={name!r}")
    entry = load_catalog(path).stream(name)
    ensure_stream(entry)
    out = {k: v for k, v in options.items() if str(k).lower() not in ("stream", "catalog", "path")}
    out["path"] = entry.location
    return out, entry

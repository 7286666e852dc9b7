"""A stream's metadata: payload schema, partition count and the ops' defaults for readers.

Kept in ``<stream>/_stream.json``, written once when the stream is created (to a temporary
name, fsync'd, then linked into place so two concurrent creators cannot both win)::

    {
      "format": "pyspark-rowtime-stream",
      "format_version": 1,
      "partitions": 2,
      "schema": {"arrow_ipc_base64": "...", "ddl": "a INT, b STRING"},
      "defaults": {"order": "adjust", "adjust_unit": "msec", "adjust_range": 999}
    }

``arrow_ipc_base64`` (an Arrow IPC-serialized schema) is the truth; ``ddl`` is for people.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from ..bounds.bounds import END_OF_STREAM_US, MIN_ROWTIME_US
from ..bounds.durations import parse_duration_us
from ..bounds.errors import CorruptLogError, OptionError, SchemaError
from ..bounds.time import TimeFormat
from ..bounds.units import ADJUST_UNITS_US, EPOCH_UNITS_US
from ..bounds.versions import newer_format
from .columns import SPARK_COLUMNS
from .ddl import normalize_schema, parse_ddl, to_ddl
from .retention import format_duration, parse_retention, parse_size

FORMAT = "pyspark-rowtime-stream"
FORMAT_VERSION = 1
META_FILE = "_stream.json"

#: Column names the log (``__*``) and the reader (``rowtime``, ``is_bound``) add to each record.
RESERVED_COLUMNS = SPARK_COLUMNS

ORDERS = ("reject", "drop", "adjust")
ADJUST_UNITS = tuple(ADJUST_UNITS_US)
ROWTIME_UNITS = tuple(EPOCH_UNITS_US)

#: The defaults a stream may carry, with what each accepts (shown in errors).
KNOWN_DEFAULTS: dict[str, str] = {
    "order": "one of reject, drop, adjust",
    "adjust_unit": "one of sec, msec, usec",
    "adjust_range": "a whole number >= 0 (of adjust_unit)",
    "adjust_max_held": "a whole number > 0",
    "rowtime_column": "the name of a payload column whose values are the rowtime",
    "rowtime_unit": "one of s, ms, us, ns (for integer rowtimes)",
    "rowtime_format": "a datetime pattern for string rowtimes",
    "rowtime_timezone": "a time zone name such as UTC or Europe/Paris, or an offset like +02:00",
    "interval_count": "a whole number >= 1 (readers' default interval.count; order reject or drop)",
    "retention": "a positive duration of rowtime such as '7 days' or '12h', or 'off'",
    "retention_size": "a size in bytes per partition such as '10 GiB' or 500000000, or 'off'",
    "idle_timeout": "a positive duration such as '5 minutes' or a number of seconds",
}

#: Spark option spellings (``option("adjust.maxHeld", ...)``) accepted for the same defaults.
_ALIASES = {
    "adjust.unit": "adjust_unit",
    "adjust.range": "adjust_range",
    "adjust.maxheld": "adjust_max_held",
    "adjust.max_held": "adjust_max_held",
    "rowtime.column": "rowtime_column",
    "rowtime.unit": "rowtime_unit",
    "rowtime.format": "rowtime_format",
    "rowtime.timezone": "rowtime_timezone",
    "interval.count": "interval_count",
    "retention.size": "retention_size",
    "idle.timeout": "idle_timeout",
}


@dataclass(frozen=True)
class StreamMeta:
    """What ``_stream.json`` says about a stream. ``location`` is an absolute local path."""

    location: str
    payload_schema: pa.Schema
    partitions: int
    defaults: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    #: A random id given when the stream is created ("" for streams made before ids): a stream
    #: deleted and created again at the same place is another stream to a query's checkpoint.
    stream_id: str = ""
    #: When the stream was created (microseconds, the creator's wall clock; None for streams
    #: made before it was kept): a partition with no record yet counts it as its last arrival
    #: when readers decide idleness (SPEC 12).
    created_us: int | None = None

    @property
    def ddl(self) -> str:
        return to_ddl(self.payload_schema)


# -- schema ----------------------------------------------------------------------------------


def payload_schema(schema: str | pa.Schema) -> pa.Schema:
    """A user's schema (DDL string or pyarrow schema) in Spark's Arrow form, checked for names
    the project reserves."""
    result = parse_ddl(schema) if isinstance(schema, str) else normalize_schema(schema)
    for f in result:
        if f.name.lower() in RESERVED_COLUMNS or f.name.startswith("__"):
            raise SchemaError(
                f"payload column {f.name!r} clashes with a column the project adds: the reader "
                "adds `rowtime` and `is_bound`, and names starting with `__` belong to the log; "
                "rename the column"
            )
    return result


def schema_to_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def schema_from_b64(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


# -- defaults --------------------------------------------------------------------------------


def _bad(name: str, value: Any, what: str | None = None) -> OptionError:
    return OptionError(
        f"stream default {name}={value!r} is not valid: "
        f"{name} must be {what or KNOWN_DEFAULTS[name]}"
    )


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise _bad(name, value)
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value.strip())
    raise _bad(name, value)


#: How a ``TimeFormat`` built from the defaults names them in errors.
_TIME_DEFAULT_NAMES = (
    "stream default rowtime_unit",
    "stream default rowtime_timezone",
    "stream default rowtime_format",
)


def _check_with_time(name: str, value: Any, **kwargs: Any) -> str:
    """Validate a time zone or pattern the way writers and readers will use it."""
    if not isinstance(value, str) or not value.strip():
        raise _bad(name, value)
    TimeFormat(**kwargs, names=_TIME_DEFAULT_NAMES)
    return value


def validate_defaults(defaults: Mapping[str, Any], schema: pa.Schema) -> dict[str, Any]:
    """The defaults with canonical names and typed values; ``OptionError`` on the first
    unknown name or bad value (naming it and what it accepts)."""
    out: dict[str, Any] = {}
    for raw_name, value in defaults.items():
        name = _ALIASES.get(str(raw_name).lower(), str(raw_name))
        if name not in KNOWN_DEFAULTS:
            known = ", ".join(KNOWN_DEFAULTS)
            raise OptionError(f"unknown stream default {raw_name!r}; known defaults: {known}")
        if name in out:
            raise OptionError(f"stream default {name} is given twice (as {raw_name!r} too)")
        if name == "order":
            if not isinstance(value, str) or value.lower() not in ORDERS:
                raise _bad(name, value)
            out[name] = value.lower()
        elif name == "adjust_unit":
            if not isinstance(value, str) or value.lower() not in ADJUST_UNITS:
                raise _bad(name, value)
            out[name] = value.lower()
        elif name == "rowtime_unit":
            if not isinstance(value, str) or value.lower() not in ROWTIME_UNITS:
                raise _bad(name, value)
            out[name] = value.lower()
        elif name == "adjust_range":
            n = _as_int(name, value)
            if n < 0:
                raise _bad(name, value)
            out[name] = n
        elif name == "adjust_max_held":
            n = _as_int(name, value)
            if n <= 0:
                raise _bad(name, value)
            out[name] = n
        elif name == "rowtime_column":
            names = schema.names
            if not isinstance(value, str) or value not in names:
                raise _bad(name, value, f"a payload column, one of {', '.join(names) or '(none)'}")
            dtype = schema.field(value).type
            t = pa.types
            if not (t.is_timestamp(dtype) or t.is_integer(dtype) or t.is_string(dtype)):
                raise _bad(
                    name, value, f"a TIMESTAMP, integer or STRING column; {value} is {dtype}"
                )
            out[name] = value
        elif name == "interval_count":
            n = _as_int(name, value)
            if n < 1:
                raise _bad(name, value)
            out[name] = n
        elif name in ("retention", "retention_size"):
            if name == "retention":
                # stored as text that reads back the same ("7 days"): validating it again (the
                # catalog, then create_stream) must not change it
                us = parse_retention(value, what=f"stream default {name}")
                if us is not None:  # "off": no entry
                    out[name] = format_duration(us)
            else:
                size = parse_size(value, what=f"stream default {name}")
                if size is not None:
                    out[name] = size
        elif name == "idle_timeout":
            try:
                parse_duration_us(value, what=f"stream default {name}")
            except OptionError as e:
                raise _bad(name, value) from e
            out[name] = value
        elif name == "rowtime_format":
            out[name] = _check_with_time(name, value, fmt=value)
        else:  # rowtime_timezone
            out[name] = _check_with_time(name, value, tz=value)
    if "interval_count" in out and out.get("order") == "adjust":
        raise _bad(
            "interval_count",
            out["interval_count"],
            "given with order reject or drop: under adjust no row's N-th successor is final",
        )
    if "adjust_range" in out:
        # Past Spark's whole timestamp span a range means nothing, and readers would overflow.
        unit = out.get("adjust_unit", "usec")
        span = (END_OF_STREAM_US - MIN_ROWTIME_US) // ADJUST_UNITS_US[unit]
        if out["adjust_range"] > span:
            raise _bad("adjust_range", out["adjust_range"], f"at most {span} {unit}")
    return out


# -- the file --------------------------------------------------------------------------------


def meta_to_json(meta: StreamMeta) -> str:
    doc = {
        "format": FORMAT,
        "format_version": meta.format_version,
        "partitions": meta.partitions,
        "schema": {
            "arrow_ipc_base64": schema_to_b64(meta.payload_schema),
            "ddl": to_ddl(meta.payload_schema),
        },
        "defaults": meta.defaults,
    }
    if meta.stream_id:
        doc["id"] = meta.stream_id
    if meta.created_us is not None:
        doc["created_us"] = meta.created_us
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def meta_from_json(text: str, location: str) -> StreamMeta:
    path = os.path.join(location, META_FILE)
    try:
        doc = json.loads(text)
        if doc.get("format") != FORMAT:
            raise ValueError(f"format is {doc.get('format')!r}, not {FORMAT!r}")
        version = int(doc["format_version"])
        if version > FORMAT_VERSION:
            raise newer_format(f"stream metadata {path}", version, FORMAT_VERSION, CorruptLogError)
        schema = schema_from_b64(doc["schema"]["arrow_ipc_base64"])
        partitions = int(doc["partitions"])
        defaults = dict(doc.get("defaults") or {})
        stream_id = str(doc.get("id") or "")
        created = doc.get("created_us")
        created_us = None if created is None else int(created)
    except CorruptLogError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, pa.ArrowException) as e:
        raise CorruptLogError(f"stream metadata {path} cannot be read: {e}") from e
    return StreamMeta(location, schema, partitions, defaults, version, stream_id, created_us)


#: Parsed metadata by path, with the file's identity: ``_stream.json`` is written once and never
#: changed, so one ``stat`` tells whether the cached copy is still the file there (a stream
#: deleted and created again at the same path is another inode).
_META_CACHE: dict[str, tuple[tuple[int, int, int, int], StreamMeta]] = {}


def read_meta(location: str) -> StreamMeta | None:
    """The metadata at ``location`` (an absolute path), or None if there is no stream."""
    path = os.path.join(location, META_FILE)
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    cached = _META_CACHE.get(location)
    if cached is not None and cached[0] == key:
        return replace(cached[1], defaults=dict(cached[1].defaults))  # callers may mutate theirs
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    meta = meta_from_json(text, location)
    if len(_META_CACHE) > 1024:
        _META_CACHE.clear()
    _META_CACHE[location] = (key, replace(meta, defaults=dict(meta.defaults)))
    return meta


def narrow_mode(path: str, folder: str) -> None:
    """Take from ``path`` any permission bit its ``folder`` lacks: files and folders the log
    creates are never readable by more people than the folder that holds them (a stream put
    in a private folder stays private whatever the umask)."""
    allowed = os.stat(folder).st_mode & 0o777
    bits = os.stat(path).st_mode & 0o777
    if bits & ~allowed:
        os.chmod(path, bits & allowed)


def make_dirs(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)``, each folder it creates no wider than the one that
    holds it (``narrow_mode``), so a tree made under a private folder stays private."""
    missing = []
    here = os.path.abspath(path)
    while not os.path.isdir(here):
        missing.append(here)
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder)
        except FileExistsError:
            if not os.path.isdir(folder):
                raise
            continue  # another process made it just now, and narrows it itself
        narrow_mode(folder, os.path.dirname(folder))


def _fsync(path: str, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """Make a rename or a new entry in directory ``path`` durable."""
    _fsync(path, os.O_RDONLY | os.O_DIRECTORY)


def fsync_file(path: str) -> None:
    """Make the contents of the file at ``path`` durable."""
    _fsync(path, os.O_RDONLY)


_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS}


def publish(tmp: str, final: str) -> None:
    """Give the complete file ``tmp`` the name ``final``, atomically, never replacing one.

    ``link`` fails if ``final`` exists (``FileExistsError``); the caller removes ``tmp``.
    On filesystems without hard links, a check and a ``rename`` do (the callers hold a lock or
    compare contents afterwards, so the gap between the two does no harm).
    """
    try:
        os.link(tmp, final)
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno not in _NO_HARD_LINKS:
            raise
        if os.path.exists(final):
            raise FileExistsError(errno.EEXIST, "file exists", final) from None
        os.rename(tmp, final)


def write_meta_once(meta: StreamMeta) -> bool:
    """Write ``_stream.json`` unless it exists; True if this call created it.

    The file appears whole or not at all (temporary file, fsync, then ``link``, which fails if
    the name exists: of two concurrent creators exactly one wins).
    """
    final = os.path.join(meta.location, META_FILE)
    tmp = os.path.join(meta.location, f".tmp.{META_FILE}.{os.getpid()}.{uuid.uuid4().hex}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(meta_to_json(meta))
        f.flush()
        os.fsync(f.fileno())
    narrow_mode(tmp, meta.location)
    try:
        publish(tmp, final)
        created = True
    except FileExistsError:
        created = False
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    if created:
        fsync_dir(meta.location)
    return created


def check_same_stream(existing: StreamMeta, wanted: StreamMeta, given_defaults: bool) -> None:
    """Creating a stream where one exists is a no-op only if it is the same stream: the same
    schema, partitions and (when the call gave any) defaults; else the error says what
    differs and what to do. Every backend's ``create`` asks this."""
    where = existing.location
    if not existing.payload_schema.equals(wanted.payload_schema, check_metadata=True):
        raise SchemaError(
            f"a stream already exists at {where} with another schema: it has "
            f"({to_ddl(existing.payload_schema)}), not ({to_ddl(wanted.payload_schema)}); use "
            "the existing schema or another location"
        )
    if existing.partitions != wanted.partitions:
        raise OptionError(
            f"a stream already exists at {where} with {existing.partitions} partitions, not "
            f"{wanted.partitions}; use partitions={existing.partitions} or another location"
        )
    if given_defaults and existing.defaults != wanted.defaults:
        raise OptionError(
            f"a stream already exists at {where} with defaults {existing.defaults}, not "
            f"{wanted.defaults}; the defaults are fixed when a stream is created"
        )

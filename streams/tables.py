"""Delta Lake and Apache Iceberg tables as sink targets: where they are, how their own libraries
reach them, and the sink's clock as it lies in each table's own metadata.

A Delta table is a folder (a local path, ``s3://``, ``az://``, ``abfs[s]://``) read and written
through ``deltalake`` (delta-rs); an Iceberg table is named ``iceberg://CATALOG/NAMESPACE.TABLE``
and reached through ``pyiceberg``, its catalog resolved as pyiceberg resolves it
(``.pyiceberg.yaml``, ``PYICEBERG_CATALOG__<NAME>__*`` environment variables), with the sink's
``iceberg.<property>`` options on top. Both libraries are optional (extras ``delta`` and
``iceberg``): a missing one is an error naming the extra.

**The clock in the table**, readable with the table's library alone, in one read, after
compaction and expired history too (``sink.table_target`` writes it in the same commit as the
batch's files):

* Delta: the app transaction ``rowtime.clock`` (``DeltaTable(path).transaction_version(
  "rowtime.clock")``), its version the clock in microseconds since the epoch. App transactions
  live in the log's state, so a checkpoint or an ``optimize`` commit keeps them.
* Iceberg: the table property ``rowtime.clock`` (microseconds, as text). Properties live in the
  table metadata, so expiring snapshots and rewriting files keep them.

This module imports neither library at the top (they are optional) and no pyspark.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..bounds.errors import OptionError, StreamNotFoundError
from .storage import LocationKind, local_path, redact_url

__all__ = [
    "BACKEND",
    "CLOCK_KEY",
    "SCHEMES",
    "IcebergLocation",
    "delta_clock_us",
    "delta_table",
    "delta_uri",
    "iceberg_clock_us",
    "iceberg_table",
    "is_iceberg_location",
    "parse_iceberg_location",
    "require_deltalake",
    "require_pyiceberg",
]

#: The key of the clock: Delta's app transaction id, Iceberg's table property and snapshot
#: summary key, and the key in each Delta sink commit's commitInfo.
CLOCK_KEY = "rowtime.clock"
SCHEMES = ("iceberg",)


def require_deltalake() -> Any:
    """The ``deltalake`` module, or an error that names the extra to install."""
    try:
        import deltalake
    except ImportError as e:
        raise OptionError(
            "target=delta writes through the deltalake library, which is not installed: "
            "pip install 'pyspark-rowtime[delta]'"
        ) from e
    return deltalake


def require_pyiceberg() -> Any:
    """The ``pyiceberg`` module, or an error that names the extra to install."""
    try:
        import pyiceberg.catalog
    except ImportError as e:
        raise OptionError(
            "target=iceberg writes through the pyiceberg library, which is not installed: "
            "pip install 'pyspark-rowtime[iceberg]'"
        ) from e
    return pyiceberg


# -- Delta ---------------------------------------------------------------------------------------


def delta_uri(location: str) -> str:
    """``location`` as delta-rs takes it: a local path, or a URL of a scheme it knows (``s3a``
    becomes ``s3``). Credentials and endpoints come from the cloud's environment variables, as
    for streams on object storage (``streams.objstore.location``)."""
    scheme = urllib.parse.urlparse(location).scheme.lower()
    if scheme in ("", "file"):
        return local_path(location)
    if scheme == "s3a":
        return "s3" + location[3:]
    return location


def delta_table(location: str) -> Any | None:
    """The Delta table at ``location`` as of now, or None when there is none."""
    deltalake = require_deltalake()
    uri = delta_uri(location)
    try:
        return deltalake.DeltaTable(uri)
    except deltalake.exceptions.TableNotFoundError:
        return None


def delta_clock_us(location: str) -> int | None:
    """The sink's clock of the Delta table at ``location``: its ``rowtime.clock`` app
    transaction (None before a batch moved it, or when there is no table)."""
    table = delta_table(location)
    if table is None:
        return None
    version = table.transaction_version(CLOCK_KEY)
    return None if version is None else int(version)


# -- Iceberg -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IcebergLocation:
    """``iceberg://CATALOG/NAMESPACE.TABLE``: the catalog's name (as pyiceberg's configuration
    names it), the namespace (dots separate its levels) and the table."""

    catalog: str
    namespace: str
    table: str

    def __str__(self) -> str:
        return f"iceberg://{self.catalog}/{self.identifier}"

    @property
    def identifier(self) -> str:
        return f"{self.namespace}.{self.table}"


def is_iceberg_location(location: str | os.PathLike[str]) -> bool:
    return urllib.parse.urlparse(os.fspath(location)).scheme.lower() in SCHEMES


def parse_iceberg_location(location: str) -> IcebergLocation:
    """``location`` parsed; :class:`OptionError` showing the form when it is not one."""
    url = urllib.parse.urlparse(location)
    shown = redact_url(location)
    name = urllib.parse.unquote(url.path).strip("/")
    if (
        url.scheme.lower() not in SCHEMES
        or not url.netloc
        or url.query
        or url.fragment
        or "@" in url.netloc
        or "/" in name
        or "." not in name
    ):
        raise OptionError(
            f"Iceberg location {shown!r}: write iceberg://CATALOG/NAMESPACE.TABLE, where CATALOG "
            "is a catalog of pyiceberg's configuration (.pyiceberg.yaml or "
            "PYICEBERG_CATALOG__<NAME>__URI), e.g. iceberg://local/db.events"
        )
    namespace, _, table = name.rpartition(".")
    if not namespace or not table or "" in namespace.split("."):
        raise OptionError(f"Iceberg location {shown!r}: NAMESPACE and TABLE may not be empty")
    return IcebergLocation(url.netloc, namespace, table)


def iceberg_catalog(loc: IcebergLocation, overrides: Mapping[str, str] | None = None) -> Any:
    """The catalog named by ``loc``, configured as pyiceberg configures it, ``overrides`` (the
    sink's ``iceberg.<property>`` options) on top. A catalog with no configuration at all is
    named in the error, with the variables that configure it."""
    require_pyiceberg()
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NotInstalledError

    # pyiceberg reads its environment once, when first imported; read it again here, so that
    # a process that set PYICEBERG_CATALOG__* later (a notebook, a test) is heard too.
    from pyiceberg.utils.config import Config

    props: dict[str, Any] = {
        **(Config().get_catalog_config(loc.catalog) or {}),
        **(overrides or {}),
    }
    try:
        return load_catalog(loc.catalog, **props)
    except NotInstalledError as e:
        raise OptionError(f"Iceberg catalog {loc.catalog!r} needs a library: {e}") from e
    except ValueError as e:  # pyiceberg: "URI missing, please provide using --uri, ..."
        var = f"PYICEBERG_CATALOG__{loc.catalog.upper()}__URI"
        raise OptionError(
            f"Iceberg catalog {loc.catalog!r} of {loc} is not configured ({e}): give it in "
            f".pyiceberg.yaml, as {var} (and __WAREHOUSE), or as sink options iceberg.uri and "
            "iceberg.warehouse; an embedded catalog is type sql on a SQLite file, e.g. "
            f"{var}=sqlite:////data/iceberg/catalog.db"
        ) from e


def iceberg_table(location: str, overrides: Mapping[str, str] | None = None) -> Any | None:
    """The Iceberg table at ``location`` as of now, or None when there is none."""
    loc = parse_iceberg_location(location)
    catalog = iceberg_catalog(loc, overrides)
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        return catalog.load_table(loc.identifier)
    except (NoSuchTableError, NoSuchNamespaceError):
        return None


def iceberg_clock_us(location: str, overrides: Mapping[str, str] | None = None) -> int | None:
    """The sink's clock of the Iceberg table at ``location``: its ``rowtime.clock`` property
    (None before a batch moved it, or when there is no table)."""
    table = iceberg_table(location, overrides)
    if table is None:
        return None
    value = table.properties.get(CLOCK_KEY)
    return None if value is None else int(value)


class _IcebergBackend:
    """``iceberg://`` locations in :func:`streams.storage.what_is_at`: an Iceberg table is a
    sink target, never a stream, so opening or creating a stream there is refused."""

    def resolve(self, location: str) -> str:
        return str(parse_iceberg_location(location))

    def kind_at(self, resolved: str) -> LocationKind:
        return (
            LocationKind.NOTHING if iceberg_table(resolved) is None else LocationKind.ICEBERG_TARGET
        )

    def open(self, resolved: str, given: str) -> Any:
        raise StreamNotFoundError(
            f"{given} is an Iceberg table, not a rowtime stream: read it with pyiceberg "
            "(load_catalog(...).load_table(...).scan()) or Spark's Iceberg source; its clock is "
            "get_rowtime_bound(location) or `rowtime clock LOCATION`"
        )

    def create(self, resolved: str, schema: Any, partitions: int, defaults: dict[str, Any]) -> Any:
        raise OptionError(
            f"{resolved}: an Iceberg table is a sink target (writeStream.format('rowtime')"
            ".option('target', 'iceberg')), not a place for a rowtime stream"
        )


#: ``iceberg://`` (entry point ``iceberg`` of ``pyspark_rowtime.backends``).
BACKEND = _IcebergBackend()

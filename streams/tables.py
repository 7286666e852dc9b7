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
from ..bounds.redaction import split_userinfo
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
    scheme = split_userinfo(location)[0][:-3].lower()
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
    return split_userinfo(os.fspath(location))[0][:-3].lower() in SCHEMES


def parse_iceberg_location(location: str) -> IcebergLocation:
    """``location`` parsed; ``OptionError`` showing the form when it is not one."""
    shown = redact_url(location)
    try:
        url = urllib.parse.urlparse(location)
    except ValueError:  # an unclosed "[" (urllib's message would quote the location)
        raise OptionError(
            f"{shown!r} cannot be read as iceberg://CATALOG/NAMESPACE.TABLE"
        ) from None
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
    props = {**_cloud_defaults(props), **props}
    _check_warehouse(loc, props)
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


def _cloud_defaults(props: Mapping[str, Any]) -> dict[str, str]:
    """FileIO properties from the clouds' standard environment variables, which delta-rs, the
    object store streams and Spark's workers read, and pyiceberg's PyArrowFileIO does not
    (configured properties win over these):

    * ``AWS_ENDPOINT_URL`` (an S3-compatible server, moto's in the tests) becomes
      ``s3.endpoint``, and then ``AWS_REGION`` ``s3.region`` (without it pyiceberg asks AWS
      for the bucket's region, which a server elsewhere cannot answer);
    * ``AZURE_STORAGE_ACCOUNT_NAME``/``_KEY`` become ``adls.account-name``/``-key``, and
      ``AZURE_STORAGE_ENDPOINT`` (``http://HOST:PORT/ACCOUNT``, Azurite) the blob and dfs
      authorities and schemes of pyarrow's ``AzureFileSystem``;
    * an ``abfs[s]://`` warehouse is reached through pyiceberg's PyArrowFileIO (pyarrow's own
      Azure filesystem) unless ``py-io-impl`` is given or ``adlfs`` is installed: pyiceberg's
      default for it, FsspecFileIO, needs ``adlfs``, a dependency this project does not add.
    """
    env = os.environ
    out: dict[str, str] = {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint and "s3.endpoint" not in props:
        out["s3.endpoint"] = endpoint
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        if region and "s3.region" not in props:
            out["s3.region"] = region
    for var, key in (
        ("AZURE_STORAGE_ACCOUNT_NAME", "adls.account-name"),
        ("AZURE_STORAGE_ACCOUNT_KEY", "adls.account-key"),
    ):
        if env.get(var) and key not in props:
            out[key] = env[var]
    azure = env.get("AZURE_STORAGE_ENDPOINT")
    if azure and "adls.blob-storage-authority" not in props:
        url = urllib.parse.urlparse(azure)
        for kind in ("blob", "dfs"):
            out[f"adls.{kind}-storage-authority"] = url.netloc
            out[f"adls.{kind}-storage-scheme"] = url.scheme or "https"
    warehouse = str(props.get("warehouse", ""))
    scheme = urllib.parse.urlparse(warehouse).scheme.lower()
    if scheme in ("abfs", "abfss", "wasb", "wasbs") and "py-io-impl" not in props:
        try:
            import adlfs  # noqa: F401
        except ImportError:
            out["py-io-impl"] = "pyiceberg.io.pyarrow.PyArrowFileIO"
    return out


def _check_warehouse(loc: IcebergLocation, props: Mapping[str, Any]) -> None:
    """Refuse, naming the form that works, an Azure warehouse pyiceberg cannot reach here."""
    warehouse = str(props.get("warehouse", ""))
    url = urllib.parse.urlparse(warehouse)
    scheme = url.scheme.lower()
    pyarrow_io = props.get("py-io-impl") == "pyiceberg.io.pyarrow.PyArrowFileIO"
    if scheme in ("az", "azure") and (pyarrow_io or "py-io-impl" not in props):
        raise OptionError(
            f"Iceberg catalog {loc.catalog!r}: warehouse {redact_url(warehouse)!r}: pyiceberg's "
            f"PyArrowFileIO has no {scheme}:// scheme; write the warehouse as "
            "abfs://CONTAINER/PATH (the account from AZURE_STORAGE_ACCOUNT_NAME or "
            "adls.account-name)"
        )
    if scheme in ("abfs", "abfss") and "@" in url.netloc and pyarrow_io:
        container = url.netloc.split("@", 1)[0]
        raise OptionError(
            f"Iceberg catalog {loc.catalog!r}: warehouse {redact_url(warehouse)!r}: pyiceberg "
            "0.12's PyArrowFileIO takes CONTAINER@ACCOUNT... for the container's name; write "
            f"abfs://{container}{url.path} (the account from AZURE_STORAGE_ACCOUNT_NAME or "
            "adls.account-name), or install adlfs for pyiceberg's FsspecFileIO"
        )


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
    """``iceberg://`` locations in ``streams.storage.what_is_at``: an Iceberg table is a
    sink target, never a stream, so opening or creating a stream there is refused."""

    def resolve(self, location: str) -> str:
        return str(parse_iceberg_location(location))

    def kind_at(self, resolved: str) -> LocationKind:
        return (
            LocationKind.NOTHING if iceberg_table(resolved) is None else LocationKind.ICEBERG_TARGET
        )

    def open(self, resolved: str, given: str) -> Any:
        raise StreamNotFoundError(
            f"{given} is an Iceberg table, not a rowtime stream: read it as one with "
            "spark.readStream.format('rowtime').load(location) (the table reader), or with "
            "pyiceberg; its clock is get_rowtime_bound(location) or `rowtime clock LOCATION`"
        )

    def create(self, resolved: str, schema: Any, partitions: int, defaults: dict[str, Any]) -> Any:
        raise OptionError(
            f"{resolved}: an Iceberg table is a sink target (writeStream.format('rowtime')"
            ".option('target', 'iceberg')), not a place for a rowtime stream"
        )


#: ``iceberg://`` (entry point ``iceberg`` of ``pyspark_rowtime.backends``).
BACKEND = _IcebergBackend()

"""Delta and Iceberg tables as a test sees them: through their own libraries only (delta-rs,
pyiceberg), which no one here wrote. The sink's crash tests use these to read rows and clocks
back, and to play another application that appends to the same table and compacts it.

A table is named as the sink names it: a Delta table by its path (a folder, ``s3://``,
``az://``), an Iceberg table by ``iceberg://CATALOG/NAMESPACE.TABLE``; an Iceberg catalog is
configured here explicitly (:func:`iceberg_props`), as a user configures pyiceberg.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

import pyarrow as pa

CLOCK_KEY = "rowtime.clock"


def iceberg_props(uri: str, warehouse: str) -> dict[str, str]:
    """A SQL catalog's properties, with the object store's endpoint as pyiceberg users give
    it (pyiceberg reads no AWS_ENDPOINT_URL / AZURE_STORAGE_* variables of its own)."""
    props = {"uri": uri, "warehouse": warehouse}
    env = os.environ
    if warehouse.startswith("s3://"):
        props["s3.endpoint"] = env["AWS_ENDPOINT_URL"]
        props["s3.region"] = env.get("AWS_REGION", "us-east-1")
    if warehouse.startswith("abfs://"):
        host = env["AZURE_STORAGE_ENDPOINT"].split("//", 1)[1].split("/", 1)[0]
        props.update(
            {
                "py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO",
                "adls.account-name": env["AZURE_STORAGE_ACCOUNT_NAME"],
                "adls.account-key": env["AZURE_STORAGE_ACCOUNT_KEY"],
                "adls.blob-storage-authority": host,
                "adls.dfs-storage-authority": host,
                "adls.blob-storage-scheme": "http",
                "adls.dfs-storage-scheme": "http",
            }
        )
    return props


def iceberg_catalog_env(name: str, props: dict[str, str]) -> dict[str, str]:
    """``props`` as pyiceberg's environment variables for catalog ``name`` (for a child)."""
    return {
        f"PYICEBERG_CATALOG__{name.upper()}__{k.upper().replace('.', '__').replace('-', '_')}": v
        for k, v in props.items()
    }


def _iceberg(location: str, props: dict[str, str]) -> Any:
    from pyiceberg.catalog import load_catalog

    catalog, _, name = location.removeprefix("iceberg://").partition("/")
    return load_catalog(catalog, **props).load_table(name)


def read_table(kind: str, location: str, props: dict[str, str] | None = None) -> pa.Table:
    """Every row of the table, read by its library."""
    if kind == "delta":
        from deltalake import DeltaTable

        return DeltaTable(location).to_pyarrow_table()
    return _iceberg(location, props or {}).scan().to_arrow()


def table_clock(kind: str, location: str, props: dict[str, str] | None = None) -> int | None:
    """The clock as a scheduler reads it: the table's library alone, one read (None before
    the sink moved it, or before there is a table)."""
    if kind == "delta":
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            version = DeltaTable(location).transaction_version(CLOCK_KEY)
        except TableNotFoundError:
            return None
        return None if version is None else int(version)
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        value = _iceberg(location, props or {}).properties.get(CLOCK_KEY)
    except (NoSuchTableError, NoSuchNamespaceError):
        return None
    return None if value is None else int(value)


def _hour(us: int) -> str:
    t = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=us)
    return t.strftime("%Y-%m-%dT%H")


def other_rows(ids: list[int], rowtimes_us: list[int], kind: str) -> pa.Table:
    """Rows another application writes (columns id, name, rowtime; Delta's partition column
    rowtime_hour as the sink names its values)."""
    columns = {
        "id": pa.array(ids, pa.int64()),
        "name": pa.array([f"other{i}" for i in ids], pa.string()),
        "rowtime": pa.array(rowtimes_us, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
    }
    if kind == "delta":
        columns["rowtime_hour"] = pa.array([_hour(t) for t in rowtimes_us], pa.string())
    return pa.table(columns)


def other_writer_appends(
    kind: str, location: str, rows: pa.Table, props: dict[str, str] | None = None
) -> None:
    """Another application appends ``rows`` to the table, creating it (partitioned by hour of
    rowtime, as the sink with granularity hour would) when there is none."""
    if kind == "delta":
        from deltalake import write_deltalake

        write_deltalake(location, rows, mode="append", partition_by=["rowtime_hour"])
        return
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchTableError
    from pyiceberg.transforms import HourTransform

    catalog_name, _, name = location.removeprefix("iceberg://").partition("/")
    catalog = load_catalog(catalog_name, **(props or {}))
    try:
        table = catalog.load_table(name)
    except NoSuchTableError:
        catalog.create_namespace_if_not_exists(name.rpartition(".")[0])
        table = catalog.create_table(name, schema=rows.schema)
        with table.update_spec() as spec:
            spec.add_field("rowtime", HourTransform(), "rowtime_hour")
        table = catalog.load_table(name)
    # table.append() into a table partitioned by hour(rowtime) needs pyiceberg-core (Rust), not
    # installed here: write one Parquet file per hour as another application would, and add
    # the files with pyiceberg's add_files (one commit).
    import uuid

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    hours = pc.floor_temporal(rows.column("rowtime"), unit="hour")
    paths = []
    for hour in pc.unique(hours):
        part = rows.filter(pc.equal(hours, hour))
        path = f"{table.location().rstrip('/')}/data/other-{uuid.uuid4().hex}.parquet"
        with table.io.new_output(path).create() as out:
            pq.write_table(part, out)
        paths.append(path)
    table.add_files(paths)


def compact(kind: str, location: str, props: dict[str, str] | None = None) -> str:
    """Compaction as each library offers it; returns what ran. Delta: ``optimize.compact()``
    and a checkpoint of the log. Iceberg: pyiceberg 0.12 has no file compaction (no
    ``rewrite_data_files``); the closest maintenance it has is expiring every snapshot but the
    current one, which drops the history the sink's commits made."""
    if kind == "delta":
        from deltalake import DeltaTable

        table = DeltaTable(location)
        metrics = table.optimize.compact()
        table.create_checkpoint()
        return (
            f"optimize.compact ({metrics.get('numFilesRemoved')} files into "
            f"{metrics.get('numFilesAdded')}) + checkpoint"
        )
    table = _iceberg(location, props or {})
    before = len(table.metadata.snapshots)
    now = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1)
    table.maintenance.expire_snapshots().older_than(now).commit()
    after = len(_iceberg(location, props or {}).metadata.snapshots)
    return f"expire_snapshots ({before} snapshots -> {after})"


def rows_of(t: pa.Table) -> list[tuple[int, int, str]]:
    """``(rowtime_us, id, name)`` of every row, sorted."""
    return sorted(
        zip(
            t.column("rowtime").cast(pa.int64()).to_pylist(),
            t.column("id").to_pylist(),
            t.column("name").to_pylist(),
            strict=True,
        )
    )

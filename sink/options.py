"""The sink's options, parsed once into a frozen, validated ``SinkConfig``.

Spark hands ``writeStream.format("rowtime")`` its options as strings with lower-case names.
Every option the sink knows is in ``SINK_OPTIONS`` with what it accepts; anything else is an
error that names it. The query's columns are checked here too: a ``rowtime`` TIMESTAMP column is
required, ``is_bound`` (BOOLEAN) is optional, everything else is payload.

This module imports no pyspark: the Spark adapter converts the query's schema to Arrow first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from ..bounds.errors import OptionError, SchemaError
from ..streams.columns import SPARK_COLUMNS, SPARK_IS_BOUND, SPARK_ROWTIME
from ..streams.options import OptionTable
from ..streams.retention import format_duration, parse_retention, parse_size
from ..streams.sink_state import backend_sink_state, target_files
from ..streams.storage import MAX_PARTITIONS, local_path, redact_url, resolve
from ..streams.tables import is_iceberg_location

GRANULARITY_US = {
    "minute": 60_000_000,
    "hour": 3_600_000_000,
    "day": 86_400_000_000,
}

COMPRESSIONS = ("snappy", "zstd", "gzip", "lz4", "none")
TARGETS = ("stream", "parquet", "delta", "iceberg")

#: Every option the sink accepts (lower case, as Spark passes them), with what it accepts.
SINK_OPTIONS: dict[str, str] = {
    "path": "the target's location: a directory path, a file:// URL, or (target=stream) a "
    "redis:// or rediss:// stream location",
    "stream": "a stream's name in the catalog (instead of path)",
    "catalog": "the catalog file for option stream (else spark.rowtime.catalog, ROWTIME_CATALOG)",
    "target": (
        "stream (default: a rowtime stream), parquet (files partitioned by rowtime), delta (a "
        "Delta Lake table at path) or iceberg (an Iceberg table, path iceberg://CATALOG/NS.TABLE)"
    ),
    "granularity": (
        "minute, hour (default) or day: the time partitions of a parquet, delta or iceberg target "
        "(iceberg: hour or day)"
    ),
    "clock": (
        "bounds (the bound records of an is_bound column; the default when the query has one) "
        "or watermark (the watermark each batch ran with; the default without is_bound)"
    ),
    "compression": (
        "snappy (default), zstd, gzip, lz4 or none: the codec of the files of a parquet, delta or "
        "iceberg target"
    ),
    "iceberg.<property>": (
        "target=iceberg: a property of the Iceberg catalog (uri, warehouse, s3.endpoint, ...) "
        "over pyiceberg's own configuration (.pyiceberg.yaml, PYICEBERG_CATALOG__<NAME>__*)"
    ),
    "partitions": (
        "a whole number from 1 to 10000: the partitions of a new stream target (default: one per "
        "write task of the first batch; 1 for a query that keeps state with clock=watermark)"
    ),
    "retention": (
        "a duration of rowtime such as '7 days' (target=stream): the retention of a new target "
        "stream, applied as the sink appends (an existing stream keeps its own: `rowtime "
        "retention` changes it)"
    ),
    "retention.size": (
        "a size per partition such as '10 GiB' (target=stream, embedded log): the size "
        "retention of a new target stream"
    ),
    "checkpointlocation": "the query's checkpoint folder (Spark's own option)",
}

OPTIONS = OptionTable(
    SINK_OPTIONS,
    "writeStream.format('rowtime')",
    "the sink",
    {"checkpointlocation": "checkpointLocation"},
)
_bad = OPTIONS.bad


@dataclass(frozen=True)
class SinkConfig:
    """Everything the sink needs, validated; picklable, so executors get it as is.

    ``schema`` is the query's Arrow schema (payload, ``rowtime``, maybe ``is_bound``);
    ``payload`` the payload columns in query order.
    """

    location: str
    target: str
    clock: str
    schema: pa.Schema
    payload: tuple[str, ...]
    has_is_bound: bool
    granularity: str = "hour"
    compression: str = "snappy"
    checkpoint: str | None = None
    partitions: int | None = None
    #: The retention of a new target stream (its defaults ``retention``/``retention_size``).
    retention: dict[str, Any] = field(default_factory=dict)
    #: target=iceberg: catalog properties given as options ``iceberg.<property>``.
    table_options: dict[str, str] = field(default_factory=dict)

    @property
    def granularity_us(self) -> int:
        return GRANULARITY_US[self.granularity]

    @property
    def payload_schema(self) -> pa.Schema:
        return pa.schema([self.schema.field(n) for n in self.payload])


def check_columns(schema: pa.Schema) -> tuple[tuple[str, ...], bool]:
    """The payload columns and whether ``is_bound`` is present; ``SchemaError`` when the
    query has no usable ``rowtime`` column or a bad ``is_bound``."""
    names = schema.names
    if SPARK_ROWTIME not in names:
        near = [n for n in names if n.lower() == SPARK_ROWTIME]
        hint = (
            f" (there is {near[0]!r}: the name must be exactly rowtime)"
            if near
            else "; for a windowed aggregation select window.end AS rowtime"
        )
        raise SchemaError(
            "writeStream.format('rowtime') needs a column named rowtime (TIMESTAMP) holding each "
            f"row's event time; the query's columns are {', '.join(names) or '(none)'}{hint}"
        )
    if names.count(SPARK_ROWTIME) > 1 or names.count(SPARK_IS_BOUND) > 1:
        raise SchemaError(f"the query has duplicate columns: {', '.join(names)}")
    rowtime_type = schema.field(SPARK_ROWTIME).type
    if not pa.types.is_timestamp(rowtime_type) or rowtime_type.tz is None:
        raise SchemaError(
            f"column rowtime must be a TIMESTAMP (with time zone), not {rowtime_type}; "
            "cast it with F.col('rowtime').cast('timestamp')"
        )
    has_is_bound = SPARK_IS_BOUND in names
    if has_is_bound and not pa.types.is_boolean(schema.field(SPARK_IS_BOUND).type):
        raise SchemaError(
            f"column is_bound must be BOOLEAN (true on bound records), not "
            f"{schema.field(SPARK_IS_BOUND).type}; rename the column or drop it"
        )
    payload = tuple(n for n in names if n not in SPARK_COLUMNS)
    reserved = [n for n in payload if n.startswith("__") or n.lower() in SPARK_COLUMNS]
    if reserved:
        raise SchemaError(
            f"payload column {reserved[0]!r} clashes with the columns the project adds "
            "(rowtime, is_bound, and names starting with __); rename it"
        )
    return payload, has_is_bound


def _checkpoint(checkpoint: str) -> str:
    """The query's checkpoint as the sink reads it (its id, and the watermark of each batch):
    a local path, or an object storage URL (``s3a://``, ``abfss://``: a cluster's checkpoints
    on the same store as its streams)."""
    try:
        return local_path(checkpoint)
    except OptionError:
        pass
    try:
        if target_files(checkpoint) is not None:
            return resolve(checkpoint)
    except OptionError:
        pass
    raise OptionError(
        f"option checkpointLocation={redact_url(checkpoint)!r}: the sink reads the checkpoint, "
        "and only local paths, file:// URLs and object storage (s3://, s3a://, az://, abfs[s]://, "
        "with pyspark-rowtime[cloud] installed) are supported"
    )


def parse_sink_options(
    options: Mapping[str, Any], schema: pa.Schema, overwrite: bool = False
) -> SinkConfig:
    """Turn Spark's string options and the query's Arrow schema into a ``SinkConfig``."""
    prefix = "iceberg."
    table_options = {
        str(k)[len(prefix) :]: str(v)
        for k, v in options.items()
        if str(k).lower().startswith(prefix) and len(str(k)) > len(prefix)
    }
    given = OPTIONS.lower(
        {k: v for k, v in options.items() if not str(k).lower().startswith(prefix)}
    )
    if overwrite:
        raise OptionError(
            "writeStream.format('rowtime') appends: outputMode('complete') would rewrite the "
            "target every batch; use outputMode('append')"
        )
    path = given.get("path", "").strip()
    if not path:
        raise OptionError(
            "option path is required: the target's location, e.g. "
            'df.writeStream.format("rowtime").option("checkpointLocation", ...).start("/data/out")'
        )
    payload, has_is_bound = check_columns(schema)

    target = given.get("target", "stream").strip().lower()
    if target not in TARGETS:
        raise _bad("target", given["target"])
    if table_options and target != "iceberg":
        raise OptionError(
            f"option iceberg.{next(iter(table_options))} applies to target=iceberg only; set "
            "option target=iceberg or remove it"
        )
    granularity = given.get("granularity", "hour").strip().lower()
    if granularity not in GRANULARITY_US:
        raise _bad("granularity", given["granularity"])
    compression = given.get("compression", "snappy").strip().lower()
    if compression not in COMPRESSIONS:
        raise _bad("compression", given["compression"])
    if target == "stream":
        extra = [k for k in ("granularity", "compression") if k in given]
        if extra:
            raise OptionError(
                f"option {extra[0]} applies to target=parquet, delta or iceberg only; a rowtime "
                "stream target keeps records in the log. Set option target or remove it"
            )
    elif "partitions" in given:
        raise OptionError(
            f"option partitions applies to target=stream only; a {target} target is partitioned "
            "by time (option granularity). Remove it"
        )
    partitions = None
    if "partitions" in given:
        try:
            partitions = int(given["partitions"].strip())
        except ValueError:
            raise _bad("partitions", given["partitions"]) from None
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise _bad("partitions", given["partitions"])

    retention: dict[str, Any] = {}
    for key, default in (("retention", "retention"), ("retention.size", "retention_size")):
        if key in given:
            if target != "stream":
                raise OptionError(
                    f"option {key} applies to target=stream only (a {target} target's files are "
                    "kept as written); remove it"
                )

            if key == "retention":
                us = parse_retention(given[key].strip(), what=f"option {key}")
                if us is not None:  # as the stream's defaults keep it
                    retention[default] = format_duration(us)
            else:
                size = parse_size(given[key].strip(), what=f"option {key}")
                if size is not None:
                    retention[default] = size

    default_clock = "bounds" if has_is_bound else "watermark"
    clock = given.get("clock", default_clock).strip().lower()
    if clock not in ("bounds", "watermark"):
        raise _bad("clock", given["clock"])
    if clock == "bounds" and not has_is_bound:
        raise OptionError(
            "option clock=bounds needs the query's is_bound column (the bound records of a "
            "format('rowtime') source), and the query has none: keep is_bound in the output, or "
            "use clock=watermark for a query whose watermark (with_watermark) moves its clock"
        )
    checkpoint = given.get("checkpointlocation", "").strip() or None
    if checkpoint is not None:
        checkpoint = _checkpoint(checkpoint)
    if clock == "watermark" and checkpoint is None:
        raise OptionError(
            "option checkpointLocation is required with clock=watermark: the sink reads the "
            "watermark each batch ran with from the checkpoint's offsets log"
        )
    try:
        location = resolve(path)
    except OptionError as e:
        raise OptionError(f"option path: {e}") from None
    if (
        target == "parquet"
        and backend_sink_state(location) is not None
        and target_files(location) is None
    ):
        # Parquet files go to a folder or an object store, their state (intents, staged files)
        # beside them; a backend that keeps no files (Redis) holds streams only.
        raise OptionError(
            f"option path={redact_url(path)!r}: target=parquet writes files, to a local folder "
            "(a path or file:// URL) or to object storage (s3://, az://, abfss://); this "
            "location's backend keeps streams only: use target=stream, or a path for the files"
        )
    _check_table_location(target, path, location, granularity)
    return SinkConfig(
        location=location,
        target=target,
        clock=clock,
        schema=schema,
        payload=payload,
        has_is_bound=has_is_bound,
        granularity=granularity,
        compression=compression,
        checkpoint=checkpoint,
        partitions=partitions,
        retention=retention,
        table_options=table_options,
    )


def _check_table_location(target: str, path: str, location: str, granularity: str) -> None:
    """A table target's path is of its kind: an Iceberg table is named in its catalog, a Delta
    table is a folder."""
    iceberg = is_iceberg_location(location)
    if target == "iceberg":
        if not iceberg:
            raise OptionError(
                f"option path={redact_url(path)!r}: target=iceberg writes a table of an Iceberg "
                "catalog, named iceberg://CATALOG/NAMESPACE.TABLE (e.g. iceberg://local/db.events)"
            )
        if granularity == "minute":
            raise OptionError(
                "option granularity=minute: Iceberg partitions time by hour or day (there is no "
                "minute transform); use granularity hour or day with target=iceberg"
            )
    elif iceberg:
        raise OptionError(
            f"option path={redact_url(path)!r} names an Iceberg table: set option "
            "target=iceberg to write it"
        )
    elif (
        target == "delta"
        and backend_sink_state(location) is not None
        and target_files(location) is None
    ):
        raise OptionError(
            f"option path={redact_url(path)!r}: target=delta writes a Delta table to a local "
            "folder or object storage (s3://, az://, abfss://); this location's backend keeps "
            "streams only"
        )

"""What ``rowtime describe`` says about a Delta or Iceberg target, read through each table's own
library (delta-rs, pyiceberg) as any reader of the table would read it.

Both answers have the keys of ``sink.parquet_target.describe_parquet_target`` (location,
kind, schema, granularity, query id, last batch, clock, partitions), so a tool reads any target
the same way. A time partition is complete once its end is at or below the clock: no row can
come for it any more (the Parquet target's ``_COMPLETE`` marker says the same in a file).

* Delta: granularity and schema from ``_rowtime_sink/target.json``, the clock from the app
  transaction ``rowtime.clock``, the last batch and query id from the newest sink commit's
  commitInfo (``rowtime.batch``, ``rowtime.query-id``; a compaction after it carries none, so the
  history is walked back to it), files and rows per partition from the add actions.
* Iceberg: clock, batch, query id and granularity from the table properties, files and rows per
  partition from ``table.inspect.partitions()`` (the current snapshot's manifests).

This module imports neither library at the top (``streams.tables`` does, when called) and no
pyspark.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from ..bounds.time import format_rowtime
from ..streams.ddl import to_ddl
from ..streams.sink_state import SINK_DIR, SINK_TARGET_FILE
from ..streams.tables import CLOCK_KEY, delta_table, iceberg_table, parse_iceberg_location
from .options import GRANULARITY_US
from .parquet_target import partition_name, target_files_at

__all__ = [
    "BATCH_KEY",
    "GRANULARITY_KEY",
    "QUERY_ID_KEY",
    "describe_delta_target",
    "describe_iceberg_target",
    "describe_table_text",
    "partition_start_us",
]

#: Keys of the sink's other metadata beside ``rowtime.clock`` (Delta commitInfo, Iceberg table
#: properties and snapshot summaries).
BATCH_KEY = "rowtime.batch"
QUERY_ID_KEY = "rowtime.query-id"
GRANULARITY_KEY = "rowtime.granularity"

#: Delta commits looked at first for the last sink commit; then the whole history.
_RECENT_COMMITS = 20

_PARTITION_FORMATS = {"day": "%Y-%m-%d", "hour": "%Y-%m-%dT%H", "minute": "%Y-%m-%dT%H%M"}


def partition_start_us(value: str, granularity: str) -> int | None:
    """The start of the time partition whose column value is ``value`` (``2024-05-01T10`` for
    an hour, as the Parquet target's folders spell it), or None when it is not one."""
    fmt = _PARTITION_FORMATS.get(granularity)
    if fmt is None or not isinstance(value, str):
        return None
    try:
        t = dt.datetime.strptime(value, fmt).replace(tzinfo=dt.timezone.utc)
    except ValueError:
        return None
    return (t - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(microseconds=1)


def _partition(
    name: str,
    start_us: int | None,
    width_us: int | None,
    files: int,
    rows: int | None,
    clock_us: int | None,
) -> dict[str, Any]:
    end_us = None if start_us is None or width_us is None else start_us + width_us
    return {
        "partition": name,
        "files": files,
        "rows": rows,
        "start": None if start_us is None else format_rowtime(start_us),
        "end": None if end_us is None else format_rowtime(end_us),
        "complete": end_us is not None and clock_us is not None and end_us <= clock_us,
    }


def _info(
    location: str,
    kind: str,
    *,
    schema: str | None,
    granularity: str | None,
    query_id: str | None,
    last_batch: int | None,
    clock_us: int | None,
    partitions: Iterable[dict[str, Any]],
    **more: Any,
) -> dict[str, Any]:
    return {
        "location": location,
        "kind": kind,
        "schema": schema,
        "granularity": granularity,
        "query_id": query_id,
        "last_batch": last_batch,
        "clock_us": clock_us,
        "clock": None if clock_us is None else format_rowtime(clock_us),
        **more,
        "partitions": sorted(partitions, key=lambda p: (p["start"] is None, p["partition"])),
    }


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


# -- Delta ---------------------------------------------------------------------------------------


def _last_sink_commit(table: Any) -> dict[str, Any]:
    """The commitInfo of the newest commit the sink made (it carries ``rowtime.batch``): among
    the recent commits, else anywhere in the history the log still keeps ({} when none)."""
    for limit in (_RECENT_COMMITS, None):
        history = table.history(limit)
        for commit in history:  # newest first
            if BATCH_KEY in commit:
                return dict(commit)
        if limit is None or len(history) < limit:
            break
    return {}


def describe_delta_target(path: str) -> dict[str, Any]:
    """What ``rowtime describe`` says about the Delta target at ``path`` (resolved)."""
    target = target_files_at(path).read_json(f"{SINK_DIR}/{SINK_TARGET_FILE}") or {}
    granularity = target.get("granularity")
    table = delta_table(path)
    if table is None:  # the query started; its first commit creates the table
        return _info(
            path,
            "delta target",
            schema=target.get("schema"),
            granularity=granularity,
            query_id=None,
            last_batch=None,
            clock_us=None,
            partitions=[],
            version=None,
        )
    clock_us = _int(table.transaction_version(CLOCK_KEY))
    commit = _last_sink_commit(table)
    columns = list(table.metadata().partition_columns)
    column = f"rowtime_{granularity}" if f"rowtime_{granularity}" in columns else None
    if column is None and columns:
        column = columns[0]
    actions = pa.table(table.get_add_actions(flatten=True))
    found: dict[str, list[int]] = {}
    key = f"partition.{column}"
    values = (
        actions.column(key).to_pylist() if key in actions.column_names else [None] * len(actions)
    )
    counts = actions.column("num_records").to_pylist()
    for value, rows in zip(values, counts, strict=True):
        entry = found.setdefault(value, [0, 0])
        entry[0] += 1
        entry[1] += rows or 0  # add actions written without stats have none
    width = GRANULARITY_US.get(granularity or "")
    partitions = [
        _partition(
            f"{column}={value}",
            None if granularity is None else partition_start_us(value, granularity),
            width,
            files,
            rows,
            clock_us,
        )
        for value, (files, rows) in found.items()
    ]
    return _info(
        path,
        "delta target",
        schema=target.get("schema") or _ddl(table.schema().to_arrow()),
        granularity=granularity,
        query_id=commit.get(QUERY_ID_KEY),
        last_batch=_int(commit.get(BATCH_KEY)),
        clock_us=clock_us,
        partitions=partitions,
        version=table.version(),
        partition_column=column,
    )


def _ddl(schema: Any) -> str | None:
    try:
        return to_ddl(pa.schema(schema))
    except Exception:  # a type Spark DDL cannot spell: the schema is still the table's
        return str(schema)


# -- Iceberg -------------------------------------------------------------------------------------


def _time_field(spec: Any, schema: Any) -> tuple[str, str] | None:
    """(partition field name, granularity) of the spec's time partition: an ``hour`` or ``day``
    transform of a timestamp column, or a string column ``rowtime_<granularity>``."""
    for f in spec.fields:
        transform = type(f.transform).__name__
        if transform == "HourTransform":
            return f.name, "hour"
        if transform == "DayTransform":
            return f.name, "day"
        if transform == "IdentityTransform":
            source = schema.find_field(f.source_id).name
            for g in _PARTITION_FORMATS:
                if source == f"rowtime_{g}":
                    return f.name, g
    return None


def _iceberg_start_us(value: Any, granularity: str) -> int | None:
    """The start of an Iceberg partition value: hours or days since the epoch (ints), a date,
    or a string as the Parquet target spells it."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return (value - dt.date(1970, 1, 1)).days * GRANULARITY_US["day"]
    if isinstance(value, int):
        return value * GRANULARITY_US[granularity]
    if isinstance(value, str):
        return partition_start_us(value, granularity)
    return None


def describe_iceberg_target(location: str) -> dict[str, Any]:
    """What ``rowtime describe`` says about the Iceberg table at ``location``."""
    shown = str(parse_iceberg_location(location))
    table = iceberg_table(location)
    if table is None:
        return _info(
            shown,
            "iceberg target",
            schema=None,
            granularity=None,
            query_id=None,
            last_batch=None,
            clock_us=None,
            partitions=[],
            snapshot_id=None,
            created=False,
        )
    props = table.properties
    clock_us = _int(props.get(CLOCK_KEY))
    schema = table.schema()
    specs = table.specs()
    time_fields = {spec_id: _time_field(spec, schema) for spec_id, spec in specs.items()}
    granularity = props.get(GRANULARITY_KEY)
    if granularity is None:
        current = time_fields.get(table.spec().spec_id)
        granularity = None if current is None else current[1]
    partitions = []
    snapshot = table.current_snapshot()
    if snapshot is not None:
        for row in table.inspect.partitions().to_pylist():
            found = time_fields.get(row["spec_id"])
            values = row.get("partition") or {}
            if found is None or found[0] not in values:
                name = ", ".join(f"{k}={v}" for k, v in values.items()) or "(unpartitioned)"
                partitions.append(
                    _partition(name, None, None, row["file_count"], row["record_count"], None)
                )
                continue
            field, g = found
            start = _iceberg_start_us(values[field], g)
            text = (
                values[field]
                if start is None
                else partition_name(start // GRANULARITY_US[g], g).partition("=")[2]
            )
            partitions.append(
                _partition(
                    f"{field}={text}",
                    start,
                    GRANULARITY_US[g],
                    row["file_count"],
                    row["record_count"],
                    clock_us,
                )
            )
    return _info(
        shown,
        "iceberg target",
        schema=_ddl(schema.as_arrow()),
        granularity=granularity,
        query_id=props.get(QUERY_ID_KEY),
        last_batch=_int(props.get(BATCH_KEY)),
        clock_us=clock_us,
        partitions=partitions,
        snapshot_id=None if snapshot is None else snapshot.snapshot_id,
    )


# -- for people ----------------------------------------------------------------------------------


def describe_table_text(info: dict[str, Any]) -> str:
    """``describe_delta_target`` or ``describe_iceberg_target`` as the lines ``rowtime
    describe`` prints."""
    kind = info["kind"]
    if info.get("created") is False or (kind == "delta target" and info.get("version") is None):
        return "\n".join(
            [
                f"{kind}  {info['location']}: no table yet (its query's first commit creates it)",
                "clock  none",
            ]
        )
    version = (
        f"version {info['version']}"
        if kind == "delta target"
        else f"snapshot {info.get('snapshot_id') or '-'}"
    )
    width = len(kind)
    lines = [
        f"{kind}  {info['location']}",
        f"{'schema'.ljust(width)}  {info['schema']}",
        f"{'granularity'.ljust(width)}  {info['granularity'] or '-'}",
        f"{'written by'.ljust(width)}  query {info['query_id'] or '-'}, last batch "
        f"{'-' if info['last_batch'] is None else info['last_batch']}, table {version}",
    ]
    parts = info["partitions"]
    name_w = max([len("partition"), *(len(p["partition"]) for p in parts)])
    rows_w = max([len("rows"), *(len(str(p["rows"])) for p in parts)])
    lines.append(f"{'partition'.ljust(name_w)}  files  {'rows'.rjust(rows_w)}  complete")
    for p in parts:
        mark = "yes" if p["complete"] else ("no" if p["start"] is not None else "-")
        lines.append(
            f"{p['partition'].ljust(name_w)}  {str(p['files']).rjust(5)}  "
            f"{str(p['rows']).rjust(rows_w)}  {mark}"
        )
    lines.append(f"clock  {info['clock'] or 'none (no batch moved it yet)'}")
    return "\n".join(lines)

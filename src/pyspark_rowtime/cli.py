"""``rowtime``: create, feed and inspect rowtime streams from a shell.

    rowtime create PATH --schema DDL [--partitions N] [--default key=value ...]
    rowtime create --stream NAME [--catalog FILE]
    rowtime catalog check [CATALOG]
    rowtime streams [CATALOG]
    rowtime connect CATALOG NAME [--metrics-port N] [--metrics-host HOST]
    rowtime insert PATH [--partition N] [--format jsonl|csv] [--rowtime-column COL]
                        [--rowtime-unit s|ms|us|ns] [FILE|-]
    rowtime bound PATH TIME [--strict] [--partition N] [--unit U]
    rowtime describe PATH [--json] [--verify] [--idle-timeout DURATION]
    rowtime trim PATH [--before TIME] [--unit U]
    rowtime retention PATH [DURATION|off] [--size SIZE|off]
    rowtime metrics PATH...
    rowtime clock PATH [--us]
    rowtime wait PATH --until TIME [--timeout DURATION] [--poll DURATION] [--unit U]
    rowtime serve [NAME] [--root DIR] [--catalog FILE] [--host H] [--port P] ...
    rowtime tail PATH [-n N] [--follow]
    rowtime demo [--rows N] [--partitions N] [--minutes M] [--tick S] [--out DIR]

``catalog``, ``streams``, ``connect`` and ``create --stream`` work from the catalog
(``streams.catalog``; ``$ROWTIME_CATALOG`` when no file is given); ``serve`` is
``serve_cli``, ``wait`` and the description of table targets ``cli_tables``, ``insert``
``cli_input``, ``demo`` ``demo``. docs/operators/cli.md has every command.

PATH is a stream or a sink target (a Parquet folder, a Delta table, an Iceberg table named
iceberg://CATALOG/NAMESPACE.TABLE) for clock, wait, describe and metrics.

User mistakes (a bad schema, an unknown option, a late row, a locked partition, a missing file)
print one line on standard error and exit with status 2, never a traceback. ``rowtime wait``
exits 0 once the clock is at or past TIME, and 1 with one line on standard error when its
timeout passes first (the clock, the time awaited, how long it waited): what a scheduler runs
before a job that needs everything up to TIME.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import os
import sys
import time
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from . import demo
from .api import create_stream, missing_table_error, open_writer, rowtime_bound_us
from .bounds.bounds import END_OF_STREAM_US, merge_clock
from .bounds.durations import parse_duration_us
from .bounds.errors import (
    CorruptLogError,
    OptionError,
    RowtimeError,
    WriterLockedError,
)
from .bounds.time import (
    END_OF_STREAM_TEXT,
    format_rowtime,
    from_rowtime_us,
    to_rowtime_us,
)
from .cli_input import cmd_insert
from .cli_tables import CLI_PROG, add_wait_parser, describe_table
from .connectors.feed import PROGRESS_FILE, state_dir
from .connectors.run import check_settings, run
from .metrics import exposition, idle_since, serve
from .serve_cli import add_serve_parser
from .sink.parquet_target import describe_parquet_target, describe_text
from .streams.catalog import ensure_stream, find_catalog, load_catalog, redact
from .streams.columns import LOG_ARRIVAL_US, LOG_IS_BOUND, LOG_ROWTIME_US
from .streams.retention import (
    Retention,
    apply_retention,
    format_size,
    parse_retention,
    parse_size,
)
from .streams.storage import (
    MAX_PARTITIONS,
    LocationKind,
    StreamStorage,
    SupportsTrim,
    SupportsVerify,
    SupportsWriterOf,
    open_stream,
    what_is_at,
)
from .streams.writer import Writer

__all__ = ["main"]

PROG = CLI_PROG


# -- formatting --------------------------------------------------------------------------------


def _json_time(t_us: int | None) -> str | None:
    """A rowtime for ``--json`` output: no clock yet is JSON's null, not the word "none"."""
    return None if t_us is None else format_rowtime(t_us)


def _duration(us: int | None) -> str:
    if us is None:
        return "-"
    sign = "-" if us < 0 else ""
    us = abs(us)
    if us >= 86_400_000_000:
        return f"{sign}{us / 86_400_000_000:.2f} d"
    if us >= 3_600_000_000:
        return f"{sign}{us / 3_600_000_000:.2f} h"
    return f"{sign}{us / 1_000_000:.6f} s"


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc)
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return str(value)


# -- commands ------------------------------------------------------------------------------------


def _parse_defaults(pairs: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise OptionError(
                f"--default {pair!r} is not key=value; e.g. --default order=adjust "
                "--default adjust_unit=msec"
            )
        out[key.strip()] = value.strip()
    return out


def cmd_create(args: argparse.Namespace) -> int:
    if args.stream is not None:
        if args.path is not None or args.schema is not None:
            raise OptionError("give a PATH with --schema, or --stream NAME (from the catalog)")
        entry = _catalog(args).stream(args.stream)
        meta = ensure_stream(entry).meta
        print(
            f"stream {args.stream} at {redact(meta.location)}: {meta.partitions} partition(s), "
            f"schema {meta.ddl}"
        )
        return 0
    if args.path is None or args.schema is None:
        raise OptionError("rowtime create needs PATH and --schema, or --stream NAME")
    stream = create_stream(
        args.path, args.schema, args.partitions, **_parse_defaults(args.default or [])
    )
    meta = stream.meta
    print(f"stream {redact(meta.location)}: {meta.partitions} partition(s), schema {meta.ddl}")
    return 0


def _bound_us(text: str, unit: str, stream: StreamStorage) -> int:
    word = text.strip().lower()
    if word in ("end", "eos", END_OF_STREAM_TEXT):
        return END_OF_STREAM_US
    if word == "now":
        return time.time_ns() // 1000
    value: Any = text
    if word.lstrip("-").isdigit():
        value = int(word)
    defaults = stream.meta.defaults
    return to_rowtime_us(value, unit=unit, tz=defaults.get("rowtime_timezone", "UTC"), fmt=None)


def cmd_bound(args: argparse.Namespace) -> int:
    stream = open_stream(args.path)
    unit = args.unit or stream.meta.defaults.get("rowtime_unit", "ms")
    bound_us = _bound_us(args.time, unit, stream)
    parts = range(stream.meta.partitions) if args.partition is None else [args.partition]
    writers: list[Writer] = []
    try:
        # Lock and check every partition before writing any: all or nothing.
        for p in parts:
            writers.append(open_writer(stream, p))
        for w in writers:
            w.set_rowtime_bound(from_rowtime_us(bound_us), strict=args.strict)
        for w in writers:
            w.flush()
    finally:
        for w in writers:
            w.abort() if w.pending else w.close()
    shown = format_rowtime(bound_us + (1 if args.strict and bound_us < END_OF_STREAM_US else 0))
    where = f"partition {args.partition}" if args.partition is not None else "every partition"
    print(f"bound {shown} written to {where} of {stream.location}")
    return 0


def describe(
    stream: StreamStorage, verify: bool = False, idle_timeout: Any = None
) -> dict[str, Any]:
    """What ``rowtime describe --json`` prints. A damaged partition (a segment file that cannot
    be read) is listed with ``damaged``, the error naming the file, and the others as usual.

    ``verify``: also check every record batch against its checksum (reads every byte; streams
    in a folder only); a partition then has ``batches_checked`` and
    ``batches_without_checksum`` (written before checksums), or ``damaged`` naming the file and
    the records of the first batch that does not match.

    ``idle_timeout`` (a duration; else the stream's default ``idle_timeout``): each partition
    idle now under it has ``idle_since`` (SPEC 12: the arrival of the record of another
    partition that made it idle); the answer then has ``idle_timeout_us``."""
    check = stream.verify if verify and isinstance(stream, SupportsVerify) else None
    if verify and check is None:
        raise OptionError(
            "describe --verify checks the checksums of segment files, and this stream's backend "
            "keeps none: describe it without --verify"
        )
    partitions: list[dict[str, Any]] = []
    clocks: list[int | None] = []
    for p in range(stream.meta.partitions):
        try:
            stats = stream.partition_stats(p)
            checked = check(p) if check is not None else None
        except CorruptLogError as e:
            partitions.append({"partition": p, "damaged": " ".join(str(e).split())})
            clocks.append(None)
            continue
        rows = sum(s.rows for s in stats)
        with_rows = [s for s in stats if s.rows]
        skews = [s.max_skew_us for s in stats if s.max_skew_us is not None]
        last = with_rows[-1] if with_rows else None
        latest_skew = (
            None
            if last is None or last.last_row_arrival_us is None or last.last_row_rowtime_us is None
            else last.last_row_arrival_us - last.last_row_rowtime_us
        )
        clock = stats[-1].clock_us if stats else None
        last_arrival = stats[-1].last_arrival_us if stats else None
        clocks.append(clock)
        partitions.append(
            {
                "partition": p,
                "records": stats[-1].end if stats else 0,
                "first_kept_offset": stream.start_offset(p),
                "rows": rows,
                "bounds": sum(s.bounds for s in stats),
                "segments": len(stats),
                "clock_us": clock,
                "clock": _json_time(clock),
                "last_arrival_us": last_arrival,
                "last_arrival": _json_time(last_arrival),
                "skew_latest_us": latest_skew,
                "skew_max_us": max(skews) if skews else None,
            }
        )
        if checked is not None:
            partitions[-1]["batches_checked"], partitions[-1]["batches_without_checksum"] = checked
    stream_clock = merge_clock(clocks)  # from the same listing as the partitions shown
    timeout_us = _idle_timeout_us(stream, idle_timeout)
    if timeout_us is not None:
        created = stream.meta.created_us
        lasts = [
            None if "damaged" in i else (i["last_arrival_us"] if i["records"] else created)
            for i in partitions
        ]
        since = idle_since(stream, timeout_us, lasts)
        for i in partitions:
            if "damaged" not in i:
                i["idle_since_us"] = since.get(i["partition"])
                i["idle_since"] = _json_time(i["idle_since_us"])
    info: dict[str, Any] = {
        "location": stream.location,
        "schema": stream.meta.ddl,
        "partitions": stream.meta.partitions,
        "defaults": stream.meta.defaults,
        "retention": _retention_info(stream),
        "stream_clock_us": stream_clock,
        "stream_clock": _json_time(stream_clock),
        "partition_info": partitions,
    }
    if timeout_us is not None:
        info["idle_timeout_us"] = timeout_us
    return info


def _idle_timeout_us(stream: StreamStorage, given: Any) -> int | None:
    """``--idle-timeout`` in microseconds, else the stream's default idle_timeout, else None."""
    if given is not None:
        return parse_duration_us(given, what="--idle-timeout")
    default = stream.meta.defaults.get("idle_timeout")
    if default is None:
        return None
    return parse_duration_us(default, what="stream default idle_timeout")


def cmd_describe(args: argparse.Namespace) -> int:
    where = what_is_at(args.path)
    path = redact(where.resolved)  # shown: a backend may resolve to the location as given
    if where.kind is LocationKind.PARQUET_TARGET:
        if args.verify:
            raise OptionError(
                f"describe --verify checks the segment files of a rowtime stream, and {path} is "
                "a Parquet target of the sink: describe it without --verify"
            )

        # a Parquet target of writeStream.format("rowtime")
        target = describe_parquet_target(where.resolved)
        print(json.dumps(target, indent=2) if args.json else describe_text(target))
        return 0
    if where.kind in (LocationKind.DELTA_TARGET, LocationKind.ICEBERG_TARGET):
        return describe_table(where, verify=args.verify, as_json=args.json)
    if where.kind is LocationKind.NOTHING:
        missing = missing_table_error(args.path)
        if missing is not None:
            raise missing
    if where.kind is LocationKind.PENDING_STREAM_TARGET:
        if args.json:
            print(json.dumps({"location": path, "kind": "stream target", "created": False}))
        else:
            print(f"stream target {path}: not created yet (its query's first commit creates it)")
            print("stream clock  none")
        return 0
    info = describe(open_stream(args.path), verify=args.verify, idle_timeout=args.idle_timeout)
    info["location"] = redact(info["location"])
    if args.json:
        print(json.dumps(info, indent=2))
        return 1 if any("damaged" in p for p in info["partition_info"]) else 0
    defaults = " ".join(f"{k}={v}" for k, v in info["defaults"].items()) or "(none)"
    print(f"stream    {info['location']}")
    print(f"schema    {info['schema']}")
    print(f"defaults  {defaults}")
    print(f"retention {info['retention']['text']}")
    header: tuple[str, ...] = ("partition", "records", "first kept", "rows", "bounds", "clock",
                               "last arrival", "skew latest", "skew max")  # fmt: skip
    idle_shown = "idle_timeout_us" in info
    if idle_shown:
        header += ("idle",)
    table = [header]
    damaged = [p for p in info["partition_info"] if "damaged" in p]
    for p in info["partition_info"]:
        if "damaged" in p:
            table.append((str(p["partition"]), "DAMAGED") + ("-",) * (len(header) - 2))
            continue
        row: tuple[str, ...] = (
            str(p["partition"]),
            str(p["records"]),
            str(p["first_kept_offset"]),
            str(p["rows"]),
            str(p["bounds"]),
            p["clock"] or "-",
            p["last_arrival"] or "-",
            _duration(p["skew_latest_us"]),
            _duration(p["skew_max_us"]),
        )
        if idle_shown:
            row += (f"IDLE since {p['idle_since']}" if p["idle_since"] else "-",)
        table.append(row)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    why = "a partition is damaged" if damaged else "a partition is empty"
    print(f"stream clock  {info['stream_clock'] or f'none ({why})'}")
    if idle_shown:
        print(
            f"idle timeout  {_duration(info['idle_timeout_us'])} (the stream clock above holds "
            "every partition; a query with this idle.timeout leaves idle ones out)"
        )
    if args.verify:
        sound = [p for p in info["partition_info"] if "batches_checked" in p]
        old = sum(p["batches_without_checksum"] for p in sound)
        print(
            f"checksums     {sum(p['batches_checked'] for p in sound)} record batches match"
            + (f", {old} written before checksums not checked" if old else "")
            + (f"; {len(damaged)} partition(s) damaged" if damaged else "")
        )
    for p in damaged:
        print(f"partition {p['partition']}: {p['damaged']}", file=sys.stderr)
    return 1 if damaged else 0


def _retention_info(stream: StreamStorage) -> dict[str, Any]:
    """The stream's retention for ``describe``: microseconds, bytes and a line for people."""
    retention = stream.retention() if isinstance(stream, SupportsTrim) else Retention()
    return {
        "retention_us": retention.duration_us,
        "retention_size": retention.size_bytes,
        "text": retention.describe(),
    }


def _trimmable(stream: StreamStorage, command: str) -> SupportsTrim:
    """``stream`` as one that keeps a retention, else the error of ``rowtime COMMAND``."""
    if not isinstance(stream, SupportsTrim):
        raise OptionError(
            f"rowtime {command}: {stream.location} keeps no retention (its backend removes no "
            "records): there is nothing to trim or to set"
        )
    return stream


def cmd_trim(args: argparse.Namespace) -> int:
    """``rowtime trim PATH [--before TIME]``: apply the retention now (and/or remove what lies
    wholly before TIME), under the never-remove rules of SPEC 12."""
    stream = open_stream(args.path)
    before_us = None
    if args.before is not None:
        unit = args.unit or stream.meta.defaults.get("rowtime_unit", "ms")
        before_us = _bound_us(args.before, unit, stream)
        if before_us == END_OF_STREAM_US:
            raise OptionError("--before end: give a time (ISO-8601, an epoch number or 'now')")
    if before_us is None and _retention_info(stream)["retention_us"] is None:
        if _retention_info(stream)["retention_size"] is None:
            print(
                f"{stream.location} has no retention (see `rowtime retention`) and no --before "
                "was given: nothing to trim"
            )
            return 0
    results = apply_retention(_trimmable(stream, "trim"), before_us=before_us)
    removed = {r.partition: r for r in results}
    for p in range(stream.meta.partitions):
        r = removed.get(p)
        kept = stream.start_offset(p)
        if r is None:
            print(f"partition {p}: nothing removed (first kept offset {kept})")
        else:
            print(
                f"partition {p}: removed offsets [{r.before.start}, {r.after.start}) "
                f"({r.records} records, {r.units} units"
                + (f", {format_size(r.bytes)}" if r.bytes else "")
                + f"); first kept offset {kept}"
            )
    return 0


def cmd_retention(args: argparse.Namespace) -> int:
    """``rowtime retention PATH [DURATION|off] [--size SIZE|off]``: show or change it."""
    stream = open_stream(args.path)
    if args.duration is None and args.size is None:
        print(f"retention {_retention_info(stream)['text']}")
        return 0
    trimmable = _trimmable(stream, "retention")
    now = trimmable.retention()
    duration = now.duration_us
    size = now.size_bytes
    if args.duration is not None:
        duration = parse_retention(args.duration, what="retention")
    if args.size is not None:
        size = parse_size(args.size, what="--size")
    trimmable.set_retention(Retention(duration, size))
    print(
        f"retention of {stream.location}: {Retention(duration, size).describe()} (writers apply "
        "it as they append; `rowtime trim` applies it now)"
    )
    return 0


def cmd_metrics(args: argparse.Namespace) -> int:

    sys.stdout.write(exposition(args.paths))
    return 0


def cmd_clock(args: argparse.Namespace) -> int:
    clock = rowtime_bound_us(args.path)  # a stream, or a sink target (Parquet, Delta, Iceberg)
    if clock is None:
        print("none")
    elif args.us:
        print(clock)
    else:
        print(format_rowtime(clock))
    return 0


def _record_dicts(stream: StreamStorage, p: int, start: int, end: int) -> list[dict[str, Any]]:
    table = stream.read(p, start, end)
    out = []
    payload = stream.meta.payload_schema.names
    for i, rec in enumerate(table.to_pylist()):
        d: dict[str, Any] = {
            "partition": p,
            "offset": start + i,
            "arrival": _json_time(rec[LOG_ARRIVAL_US]),
            "rowtime": _json_time(rec[LOG_ROWTIME_US]),
            "is_bound": rec[LOG_IS_BOUND],
        }
        if not rec[LOG_IS_BOUND]:
            d.update((name, rec[name]) for name in payload)
        out.append(d)
    return out


def _emit(records: list[dict[str, Any]]) -> None:
    for rec in records:
        sys.stdout.write(json.dumps(rec, default=_json_default) + "\n")
    sys.stdout.flush()


def cmd_tail(args: argparse.Namespace) -> int:
    stream = open_stream(args.path)
    if args.n < 0:
        raise OptionError(f"-n {args.n}: the number of records must be >= 0")
    ends = [stream.end_offset(p) for p in range(stream.meta.partitions)]
    recent: list[dict[str, Any]] = []
    arrival_us: list[int] = []
    for p, end in enumerate(ends):
        start = max(stream.start_offset(p), end - args.n)
        recent += _record_dicts(stream, p, start, end)
        arrival_us += stream.read(p, start, end, [LOG_ARRIVAL_US]).column(0).to_pylist()
    # Across partitions by arrival (the numbers: ISO strings drop zero microseconds).
    order = sorted(range(len(recent)), key=lambda i: (arrival_us[i], recent[i]["partition"]))
    recent = [recent[i] for i in order]
    _emit(recent[len(recent) - args.n :] if args.n else [])
    while args.follow:
        time.sleep(args.interval)
        for p in range(stream.meta.partitions):
            end = stream.end_offset(p)
            if end > ends[p]:
                _emit(_record_dicts(stream, p, ends[p], end))
                ends[p] = end
    return 0


# -- entry point ---------------------------------------------------------------------------------


def _catalog(args: argparse.Namespace) -> Any:

    return load_catalog(find_catalog(args.catalog, None, needed_for=f"rowtime {args.command}"))


def cmd_catalog_check(args: argparse.Namespace) -> int:

    catalog = _catalog(args)
    for entry in catalog.connectors.values():
        check_settings(catalog, entry)
    print(
        f"catalog {catalog.path}: ok, {len(catalog.streams)} stream(s), "
        f"{len(catalog.connectors)} connector(s)"
    )
    return 0


def cmd_streams(args: argparse.Namespace) -> int:

    catalog = _catalog(args)
    feeding: dict[str, list[Any]] = {}
    for c in catalog.connectors.values():
        feeding.setdefault(c.stream, []).append(c)
    rows = [("STREAM", "LOCATION", "CLOCK", "BACKLOG", "CONNECTORS")]
    for name, entry in sorted(catalog.streams.items()):
        clock, backlog = "not created", "-"
        if what_is_at(entry.location).kind is LocationKind.STREAM:
            stream = open_stream(entry.location)
            t = stream.stream_clock_us()
            clock = "none" if t is None else _json_time(t) or "none"
            ends = [stream.end_offset(p) for p in range(stream.meta.partitions)]
            backlog = f"{sum(ends)} records"
        states = []
        for c in feeding.get(name, []):
            states.append(f"{c.name} ({c.kind}: {_connector_state(entry, c)})")
        rows.append((name, redact(entry.location), clock, backlog, ", ".join(states) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r[:4], widths, strict=True)) + "  " + r[4])
    return 0


def _connector_state(entry: Any, connector: Any) -> str:
    """running (it holds the partition's lock), stopped (it has progress), or never run."""
    try:
        folder = state_dir(entry, connector.name, connector.settings.get("state"))
    except RowtimeError:
        return "unknown"
    if not os.path.exists(os.path.join(folder, PROGRESS_FILE)):
        return "never run"
    partition = int(connector.settings.get("partition", 0))
    try:
        stream = open_stream(entry.location)
        if isinstance(stream, SupportsWriterOf):  # a backend that can tell without writing
            return "stopped" if stream.writer_of(partition) is None else "running"
        lock = stream.lock_partition(partition, "rowtime streams")
    except WriterLockedError:
        return "running"
    except RowtimeError:
        return "unknown"
    lock.release()
    return "stopped"


def cmd_connect(args: argparse.Namespace) -> int:

    return connect(
        load_catalog(args.catalog_file),
        args.name,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
    )


def connect(
    catalog: Any,
    name: str,
    *,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    **run_options: Any,
) -> int:
    """Run connector ``name`` (``connectors.run.run``, which takes ``run_options``);
    with ``metrics_port``, serve its stream's Prometheus metrics (``rowtime metrics``) at
    ``http://metrics_host:metrics_port/metrics`` while it runs. The server starts first (a
    missing library or a port in use is one clear error before anything is written); until
    the connector creates the stream, a scrape has no series for it."""
    if metrics_port is None:
        return run(catalog, name, **run_options)

    if not 0 < metrics_port < 65536:
        raise OptionError(f"--metrics-port {metrics_port} must be a port, 1 to 65535")
    location = catalog.stream(catalog.connector(name).stream).location
    server = serve([location], metrics_port, metrics_host)
    out = run_options.get("out", sys.stderr)
    print(
        f"rowtime connect {name}: metrics at http://{metrics_host}:{metrics_port}/metrics",
        file=out,
        flush=True,
    )
    try:
        return run(catalog, name, **run_options)
    finally:
        server.shutdown()
        server.server_close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Create, feed and inspect rowtime streams."
    )
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        help="one of these; `rowtime COMMAND --help` says what it takes",
    )

    p = sub.add_parser("create", help="create a stream (a no-op if the same one exists)")
    p.add_argument("path", nargs="?", help="the stream's folder (path or file:// URL)")
    p.add_argument("--schema", help="payload columns as Spark DDL: 'a INT, b STRING'")
    p.add_argument("--stream", help="create the catalog's stream NAME from its entry instead")
    p.add_argument("--catalog", help="the catalog file (default: $ROWTIME_CATALOG)")
    p.add_argument(
        "--partitions",
        type=int,
        default=1,
        help=f"number of partitions, 1 to {MAX_PARTITIONS} (default 1)",
    )
    p.add_argument(
        "--default",
        action="append",
        metavar="KEY=VALUE",
        help="a default for readers, e.g. order=adjust, adjust_unit=msec, adjust_range=999, "
        "rowtime_column=ts (repeatable)",
    )
    p.set_defaults(func=cmd_create)

    p = sub.add_parser("catalog", help="catalog commands: check")
    p.add_argument("action", choices=["check"], help="check: read and validate the catalog")
    p.add_argument("catalog", nargs="?", help="the catalog file (default: $ROWTIME_CATALOG)")
    p.set_defaults(func=cmd_catalog_check)

    p = sub.add_parser("streams", help="the catalog's streams: clock, backlog, connectors")
    p.add_argument("catalog", nargs="?", help="the catalog file (default: $ROWTIME_CATALOG)")
    p.set_defaults(func=cmd_streams)

    p = sub.add_parser("connect", help="run a connector of the catalog in the foreground")
    p.add_argument("catalog_file", metavar="CATALOG", help="the catalog file")
    p.add_argument("name", metavar="NAME", help="the connector's name in the catalog")
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="N",
        help="serve the stream's Prometheus metrics at http://HOST:N/metrics (needs "
        "pyspark-rowtime[metrics])",
    )
    p.add_argument(
        "--metrics-host", default="127.0.0.1", help="address to serve metrics on (127.0.0.1)"
    )
    p.set_defaults(func=cmd_connect)

    p = sub.add_parser(
        "insert",
        help="insert rows from JSON lines or CSV",
        description="Insert rows from JSON lines or CSV into one partition of a stream. The "
        "format is --format, else the file's extension (.csv; .jsonl, .json, .ndjson), else "
        "JSON lines (standard input too); stderr says which was used. Lines are read "
        "strictly; a file is stored whole or not at all, a pipe as it comes up to its first bad "
        "line (the error says how many rows were stored).",
    )
    p.add_argument("path", help="the stream (a folder, file:// URL, redis://, s3:// or az:// URL)")
    p.add_argument(
        "file",
        nargs="?",
        default="-",
        help="input file, or - for standard input (the default)",
    )
    p.add_argument("--partition", type=int, default=0, help="the partition to write to (default 0)")
    p.add_argument(
        "--format",
        choices=("jsonl", "csv"),
        default=None,
        help="jsonl (a JSON object a line) or csv (a header, then a row a line); default: "
        "from FILE's extension, JSON lines for standard input or another extension",
    )
    p.add_argument("--rowtime-column", help="field whose value is the row's explicit rowtime")
    p.add_argument(
        "--rowtime-unit", choices=("s", "ms", "us", "ns"), help="unit of integer rowtimes"
    )
    p.set_defaults(func=cmd_insert)

    p = sub.add_parser("bound", help="write a rowtime bound (all partitions unless --partition)")
    p.add_argument("path", help="the stream (a folder or a URL)")
    p.add_argument("time", help="ISO-8601 time, an epoch number (see --unit), 'now' or 'end'")
    p.add_argument("--strict", action="store_true", help="later rows are > TIME, not >=")
    p.add_argument(
        "--partition", type=int, help="the one partition to bound (default: every partition)"
    )
    p.add_argument("--unit", choices=("s", "ms", "us", "ns"), help="unit of an epoch number")
    p.set_defaults(func=cmd_bound)

    p = sub.add_parser("describe", help="partitions, counts, clocks, arrival and skew")
    p.add_argument("path", help="the stream (a folder or a URL) or a sink's Parquet target")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--verify",
        action="store_true",
        help="also check every record batch against its checksum (reads every byte)",
    )
    p.add_argument(
        "--idle-timeout",
        metavar="DURATION",
        help="mark partitions IDLE under this timeout (default: the stream's idle_timeout)",
    )
    p.set_defaults(func=cmd_describe)

    p = sub.add_parser(
        "trim", help="remove old records now: the retention, and/or what lies before --before"
    )
    p.add_argument("path", help="the stream (a folder or a URL)")
    p.add_argument("--before", help="ISO-8601 time, an epoch number (see --unit), or 'now'")
    p.add_argument("--unit", choices=("s", "ms", "us", "ns"), help="unit of an epoch number")
    p.set_defaults(func=cmd_trim)

    p = sub.add_parser("retention", help="show or change a stream's retention")
    p.add_argument("path", help="the stream (a folder or a URL)")
    p.add_argument(
        "duration", nargs="?", help="rowtime to keep behind the clock ('7 days', '12h') or 'off'"
    )
    p.add_argument("--size", help="bytes to keep per partition ('10 GiB') or 'off'")
    p.set_defaults(func=cmd_retention)

    p = sub.add_parser("metrics", help="print the Prometheus metrics of streams and sink targets")
    p.add_argument(
        "paths", nargs="+", metavar="PATH", help="streams (folders or URLs) and sink targets"
    )
    p.set_defaults(func=cmd_metrics)

    p = sub.add_parser("clock", help="print the clock of a stream or sink target (or 'none')")
    p.add_argument("path", help="a stream, or a sink target: Parquet, Delta or iceberg://...")
    p.add_argument("--us", action="store_true", help="microseconds since the epoch")
    p.set_defaults(func=cmd_clock)

    add_wait_parser(sub)
    add_serve_parser(sub)

    p = sub.add_parser("tail", help="print the last records as JSON lines")
    p.add_argument("path", help="the stream (a folder or a URL)")
    p.add_argument("-n", type=int, default=10, help="how many records (default 10)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new records")
    p.add_argument("--interval", type=float, default=0.2, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_tail)

    p = sub.add_parser(
        "demo",
        help="the main job: freeway sensors through format('rowtime') and plain Spark, compared",
        description=(demo.__doc__ or "").split("\n")[0],
    )
    demo.add_arguments(p)
    p.set_defaults(func=demo.run)
    return parser


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser of each command, by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, except that words a command does not know are refused by
    that command's parser, with its usage (argparse's own refusal shows the top-level usage,
    which does not say what the command takes)."""
    words = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(words)
    if extra:
        command = commands(parser).get(getattr(args, "command", None) or "")
        at = words.index(args.command) if args.command in words else len(words)
        if command is not None and all(w in words[at + 1 :] for w in extra):
            command.error(f"unrecognized arguments: {' '.join(extra)}")
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``rowtime`` command; returns the exit status."""
    args = parse(build_parser(), argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # `rowtime tail ... | head`: the reader left; not an error.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0
    except (RowtimeError, OSError) as e:
        message = " ".join(redact(str(e)).split())  # one line (an OSError is not redacted yet)
        print(f"{PROG} {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

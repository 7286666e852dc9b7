"""The ``rowtime`` commands that look at what a sink wrote: ``wait`` (what a scheduler runs
before an hourly job) and ``describe`` of a Delta or Iceberg target. Kept apart from
``cli`` so that neither module grows past what one reader takes in."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from .api import ClockReader
from .bounds.bounds import END_OF_STREAM_US
from .bounds.durations import parse_duration_us
from .bounds.errors import OptionError, WaitTimeoutError
from .bounds.time import END_OF_STREAM_TEXT, format_rowtime, to_rowtime_us
from .sink.table_describe import describe_delta_target, describe_iceberg_target, describe_table_text
from .streams.storage import Location, LocationKind, open_stream, redact_url, what_is_at
from .wait import format_seconds, parse_timeout_s, wait_for_clock

__all__ = ["CLI_PROG", "add_wait_parser", "cmd_wait", "describe_table"]

#: The command's name, in its messages.
CLI_PROG = "rowtime"


def describe_table(where: Location, verify: bool, as_json: bool) -> int:
    """``rowtime describe`` of a Delta or Iceberg target."""
    path = where.resolved
    if verify:
        raise OptionError(
            f"describe --verify checks the segment files of a rowtime stream, and {path} is "
            f"a {where.kind.value}: describe it without --verify"
        )
    if where.kind is LocationKind.DELTA_TARGET:
        target = describe_delta_target(path)
    else:
        target = describe_iceberg_target(path)
    print(json.dumps(target, indent=2) if as_json else describe_table_text(target))
    return 0


def _until_us(text: str, unit: str | None, location: str) -> int:
    """``--until`` as ``rowtime bound`` reads its TIME: ISO-8601, an epoch number in ``--unit``
    (else a stream's ``rowtime_unit``, else ms), ``now`` or ``end``; naive times in a stream's
    ``rowtime_timezone``, else UTC."""
    word = text.strip().lower()
    if word in ("end", "eos", END_OF_STREAM_TEXT):
        return END_OF_STREAM_US
    if word == "now":
        return time.time_ns() // 1000
    defaults: dict[str, Any] = {}
    if what_is_at(location).kind is LocationKind.STREAM:
        defaults = open_stream(location).meta.defaults
    value: Any = int(word) if word.lstrip("-").isdigit() else text
    return to_rowtime_us(
        value,
        unit=unit or defaults.get("rowtime_unit", "ms"),
        tz=defaults.get("rowtime_timezone", "UTC"),
        fmt=None,
    )


def cmd_wait(args: argparse.Namespace) -> int:
    timeout_s = None if args.timeout is None else parse_timeout_s(args.timeout, what="--timeout")
    poll_s = parse_duration_us(args.poll, what="--poll") / 1e6
    until_us = _until_us(args.until, args.unit, args.path)
    try:
        waited = wait_for_clock(
            ClockReader(args.path),  # nothing there, or a bad catalog: its error, exit 2
            until_us,
            timeout_s=timeout_s,
            poll_s=poll_s,
            now=time.monotonic,
            sleep=time.sleep,
            what=f"the clock of {redact_url(args.path)}",
        )
    except WaitTimeoutError as e:
        print(f"{CLI_PROG} wait: {e}", file=sys.stderr)
        return 1
    print(
        f"clock {format_rowtime(waited.clock_us)} of {redact_url(args.path)} reached "
        f"{format_rowtime(until_us)} (waited {format_seconds(waited.waited_s)})",
        flush=True,
    )
    return 0


def add_wait_parser(sub: Any) -> None:
    """``rowtime wait``'s arguments, on the subparsers of ``rowtime``."""
    p = sub.add_parser(
        "wait",
        help="wait until the clock of a stream or sink target reaches a time (exit 0), or a "
        "timeout passes (exit 1)",
        description="Exit 0 as soon as the clock of PATH is at or past TIME: every row with a "
        "rowtime below TIME is written. Exit 1 with one line on standard error when --timeout "
        "passes first; 2 for bad input. For schedulers (cron, Airflow's command sensors), "
        "before a job that needs everything up to TIME.",
    )
    p.add_argument(
        "path",
        help="a stream, a stream target, or a Parquet, Delta or Iceberg (iceberg://CATALOG/"
        "NAMESPACE.TABLE) target of the sink",
    )
    p.add_argument(
        "--until",
        metavar="TIME",
        required=True,
        help="the time to wait for: ISO-8601 (2024-05-01T11:00:00Z; naive is UTC, or a stream's "
        "rowtime_timezone), an epoch number (see --unit), 'now' or 'end'",
    )
    p.add_argument(
        "--timeout",
        metavar="DURATION",
        help="give up after this long, exit 1 ('90s', '2h', '1 day'; 0: read the clock once); "
        "default: wait as long as it takes",
    )
    p.add_argument(
        "--poll",
        metavar="DURATION",
        default="5s",
        help="the longest pause between reads of the clock (default 5s); pauses start at "
        "0.1 s and double up to it",
    )
    p.add_argument(
        "--unit",
        choices=("s", "ms", "us", "ns"),
        help="unit of an epoch number TIME (default: a stream's rowtime_unit, else ms)",
    )
    p.set_defaults(func=cmd_wait)

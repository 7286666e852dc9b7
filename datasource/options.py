"""The reader's options, parsed once into a frozen, validated ``ReaderConfig``.

Spark hands a data source its options as strings in a case-insensitive map. Every option this
reader knows is listed in ``READER_OPTIONS`` with what it accepts; anything else is an error
that names the option, so a typo never silently falls back to a default. Where an option is not
given, the stream's own defaults (set by ops at ``create_stream``) apply, then the built-ins.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..bounds.durations import parse_duration_us
from ..bounds.errors import OptionError
from ..bounds.policies import DEFAULT_MAX_HELD, Policy, make_policy
from ..bounds.time import TimeFormat
from ..bounds.units import ADJUST_UNITS_US, EPOCH_UNITS_US
from ..streams.options import OptionTable
from ..streams.spark_compat import refuse_before_admission_control

#: Every option the reader accepts (lower case, as Spark passes them), with what it accepts.
READER_OPTIONS: dict[str, str] = {
    "path": "the stream's location: a directory path or a file:// URL",
    "stream": "a stream's name in the catalog (instead of path)",
    "catalog": "the catalog file for option stream (else spark.rowtime.catalog, ROWTIME_CATALOG)",
    "rowtime.column": "a payload column to promote to rowtime (SQLstream `SELECT c AS ROWTIME`)",
    "rowtime.unit": "s, ms, us or ns: the unit of an integer rowtime column (default ms)",
    "rowtime.format": "a datetime pattern such as yyyy-MM-dd HH:mm:ss.SSS for string rowtimes",
    "rowtime.timezone": "the time zone of naive rowtimes, e.g. UTC or Europe/Paris (default UTC)",
    "order": "reject, drop or adjust (default: the stream's, else reject)",
    "adjust.unit": "sec, msec or usec (default usec)",
    "adjust.range": "a whole number >= 0 of adjust.unit (default 0)",
    "adjust.maxheld": f"a whole number of rows > 0 (default {DEFAULT_MAX_HELD})",
    "maxrowsperbatch": "a whole number of records > 0 admitted per micro-batch (default: all)",
    "startingoffsets": "earliest (default) or latest",
    "failondataloss": (
        "true (default) or false: whether a query whose checkpoint points at records that"
        " retention removed fails (true) or skips to the first kept record and counts what it"
        " skipped (false)"
    ),
    "output": "rows (default) or discarded: the quarantine of rows the policy discarded",
    "endingoffsets": (
        "clock (default) or latest, for batch reads: rows up to the stream clock, as a streaming"
        " query would have emitted them by now, or every row written so far"
    ),
    "interval.duration": (
        "a positive duration (seconds, or a string such as '25 seconds'): adds rowtime_end ="
        " rowtime + duration, each row's validity [rowtime, rowtime_end)"
    ),
    "idle.timeout": (
        "a positive duration (seconds, or a string such as '5 minutes'): a partition whose last"
        " record arrived that long before another partition's stops holding the stream clock"
        " until its next record; its rows then below the stream clock are late (default: the"
        " stream's idle_timeout, else never)"
    ),
    "idle.commitgrace": (
        "a positive duration (default 1 second), with idle.timeout: how long a writer's commit"
        " may take after the arrival time it stamps, plus the clock difference between writer"
        " hosts and the driver; a micro-batch plans only records that arrived at least that"
        " long ago,"
        " so every record of an earlier arrival is already visible"
    ),
    "interval.count": (
        "a whole number N >= 1 (order reject or drop): adds rowtime_end = the rowtime of the"
        " N-th later row of the same partition (the end of stream if none); a row waits for it"
    ),
    "interval.slide": (
        "with interval.duration, a positive duration up to it: the window moves in steps of it,"
        " rowtime_end = floor(rowtime / slide) * slide + duration (Odysseus' advance)"
    ),
}

#: Option names as users spell them in errors and docs.
_SPELLING = {
    "adjust.maxheld": "adjust.maxHeld",
    "maxrowsperbatch": "maxRowsPerBatch",
    "startingoffsets": "startingOffsets",
    "endingoffsets": "endingOffsets",
    "failondataloss": "failOnDataLoss",
}

#: Options that give each row a validity end (SPEC 10, seed 001); at most one of them.
INTERVAL_OPTIONS = ("interval.duration", "interval.count")

#: Stream defaults (as ``create_stream`` stores them) and the option each stands for.
_DEFAULT_TO_OPTION = {
    "order": "order",
    "adjust_unit": "adjust.unit",
    "adjust_range": "adjust.range",
    "adjust_max_held": "adjust.maxheld",
    "rowtime_column": "rowtime.column",
    "rowtime_unit": "rowtime.unit",
    "rowtime_format": "rowtime.format",
    "rowtime_timezone": "rowtime.timezone",
    "interval_count": "interval.count",
    "idle_timeout": "idle.timeout",
}

OPTIONS = OptionTable(READER_OPTIONS, "format('rowtime')", "the reader", _SPELLING)
spelled = OPTIONS.spelled
_bad = OPTIONS.bad


def _int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool):
        raise _bad(name, value)
    try:
        n = int(str(value).strip())
    except ValueError:
        raise _bad(name, value) from None
    if n < minimum:
        raise _bad(name, value)
    return n


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    v = str(value).strip().lower()
    if v not in choices:
        raise _bad(name, value)
    return v


@dataclass(frozen=True)
class ReaderConfig:
    """Everything the reader needs, validated; picklable so executors get it as is."""

    location: str
    policy: Policy
    rowtime_column: str | None = None
    #: How the promoted column's values are read (rowtime.unit, rowtime.timezone, rowtime.format).
    time_format: TimeFormat = field(default_factory=TimeFormat)
    max_rows_per_batch: int | None = None
    starting: str = "earliest"
    output: str = "rows"
    #: Batch reads only: "clock" (what a streaming query would have emitted by now) or
    #: "latest" (every row written so far, each partition as if it ended now).
    ending: str = "clock"
    #: interval.duration: each row's ``rowtime_end`` is its rowtime plus this (microseconds).
    interval_duration_us: int | None = None
    #: interval.count: each row's ``rowtime_end`` is the rowtime of the N-th later row of its
    #: partition (see ``intervals``).
    interval_count: int | None = None
    #: failOnDataLoss: a checkpoint before the first kept record fails the query (True) or
    #: skips to it (False), counting the skipped records.
    fail_on_data_loss: bool = True
    #: idle.timeout: a partition silent this long (in arrival time) stops holding the stream
    #: clock (SPEC 12); None: partitions always hold it.
    idle_timeout_us: int | None = None
    #: idle.commitGrace: with idle.timeout, plan only records that arrived at least this long
    #: before the planner looked (microseconds).
    idle_commit_grace_us: int = 1_000_000
    #: interval.slide: with interval.duration, ``rowtime_end = floor(rowtime / slide) * slide +
    #: duration`` (microseconds; None: a slide of 1 us, ``rowtime + duration``).
    interval_slide_us: int | None = None

    @property
    def has_rowtime_end(self) -> bool:
        """Whether rows carry a ``rowtime_end`` column (one of the interval options is set)."""
        return self.interval_duration_us is not None or self.interval_count is not None


def refuse_batch_only_options(cfg: ReaderConfig, until: str) -> None:
    """Refuse what only a batch read (``spark.read``) takes, for a ``readStream`` whose
    micro-batches each run up to ``until`` (the stream clock, the table's clock)."""
    if cfg.max_rows_per_batch is not None:
        refuse_before_admission_control(
            "maxRowsPerBatch",
            cfg.max_rows_per_batch,
            "a read limit caps each micro-batch through Spark's admission control",
        )
    if cfg.output != "rows":
        raise OptionError(
            "option output=discarded is for batch reads (spark.read), which return the "
            "quarantine of discarded rows; streaming reads always emit rows"
        )
    if cfg.ending != "clock":
        raise OptionError(
            f"option endingOffsets={cfg.ending} is for batch reads (spark.read); a streaming "
            f"read runs on, each micro-batch up to {until}: remove the option"
        )


def parse_reader_options(
    options: Mapping[str, Any], stream_defaults: Mapping[str, Any] | None = None
) -> ReaderConfig:
    """Turn Spark's string options (plus the stream's defaults) into a ``ReaderConfig``."""
    given = OPTIONS.lower(options)
    if "path" not in given or not given["path"].strip():
        raise OptionError(
            "option path is required: the stream's location, e.g. "
            'spark.readStream.format("rowtime").load("/data/orders") or .option("path", ...)'
        )
    merged: dict[str, Any] = {}
    for key, value in (stream_defaults or {}).items():
        if key in _DEFAULT_TO_OPTION:
            merged[_DEFAULT_TO_OPTION[key]] = value
    merged.update(given)

    order = _choice("order", merged.get("order", "reject"), ("reject", "drop", "adjust"))
    adjust_keys = [k for k in ("adjust.unit", "adjust.range", "adjust.maxheld") if k in given]
    if order != "adjust" and adjust_keys:
        raise OptionError(
            f"option {spelled(adjust_keys[0])} only applies with order=adjust, but order={order}; "
            "set option order=adjust or remove it"
        )
    unit = _choice("adjust.unit", merged.get("adjust.unit", "usec"), tuple(ADJUST_UNITS_US))
    range_ = _int("adjust.range", merged.get("adjust.range", 0), 0)
    max_held = _int("adjust.maxheld", merged.get("adjust.maxheld", DEFAULT_MAX_HELD), 1)
    try:
        policy = make_policy(order, unit=unit, range=range_, max_held=max_held)
    except OptionError as e:  # the policy's own checks: adjust.range past the timestamp span
        raise OptionError(f"option {e}") from None

    max_rows = None
    if "maxrowsperbatch" in merged:
        max_rows = _int("maxrowsperbatch", merged["maxrowsperbatch"], 1)
    column = merged.get("rowtime.column")
    column = str(column).strip() if column is not None and str(column).strip() else None
    unit_e = _choice("rowtime.unit", merged.get("rowtime.unit", "ms"), tuple(EPOCH_UNITS_US))
    fmt = merged.get("rowtime.format")
    tz = str(merged.get("rowtime.timezone", "UTC"))
    if column is None:
        for k in ("rowtime.unit", "rowtime.format", "rowtime.timezone"):
            if k in given:
                raise OptionError(
                    f"option {k} describes a promoted rowtime column, but rowtime.column is not "
                    "set; set option rowtime.column to the payload column that holds event time"
                )
        time_format = TimeFormat()  # unused: no column to read
    else:
        time_format = _time_format(unit_e, fmt, tz)
    duration_us, count = _interval(given, order, merged)
    idle_us = None
    if "idle.timeout" in merged:
        source = "option" if "idle.timeout" in given else "stream default idle_timeout, as option"
        idle_us = parse_duration_us(
            str(merged["idle.timeout"]).strip(), what=f"{source} idle.timeout"
        )
        if count is not None:
            raise OptionError(
                "option interval.count waits for each row's N-th successor in its own partition, "
                "which a silent partition may never write, and idle.timeout decides in arrival "
                "order across partitions: the two cannot be combined; use interval.duration, or "
                "no idle.timeout"
            )
    grace_us = 1_000_000
    if "idle.commitgrace" in given:
        if idle_us is None:
            raise OptionError(
                "option idle.commitGrace only applies with idle.timeout (an option, or the "
                "stream's idle_timeout); set idle.timeout too, or drop idle.commitGrace"
            )
        grace_us = parse_duration_us(
            str(given["idle.commitgrace"]).strip(), what="option idle.commitGrace"
        )
    slide_us = _slide(given, duration_us)
    return ReaderConfig(
        location=given["path"].strip(),
        policy=policy,
        rowtime_column=column,
        time_format=time_format,
        max_rows_per_batch=max_rows,
        starting=_choice(
            "startingoffsets", merged.get("startingoffsets", "earliest"), ("earliest", "latest")
        ),
        output=_choice("output", merged.get("output", "rows"), ("rows", "discarded")),
        ending=_choice("endingoffsets", merged.get("endingoffsets", "clock"), ("clock", "latest")),
        interval_duration_us=duration_us,
        interval_count=count,
        fail_on_data_loss=_choice(
            "failondataloss", merged.get("failondataloss", "true"), ("true", "false")
        )
        == "true",
        idle_timeout_us=idle_us,
        idle_commit_grace_us=grace_us,
        interval_slide_us=slide_us,
    )


def _slide(given: Mapping[str, str], duration_us: int | None) -> int | None:
    """interval.slide in microseconds: only with interval.duration, and at most it."""
    if "interval.slide" not in given:
        return None
    if "interval.count" in given:
        raise OptionError(
            f"option interval.slide={given['interval.slide']!r} moves a time window, not "
            "interval.count's element window (a row's place among its partition's rows is not "
            "known to a reader that starts after a trim): for an element window that moves, "
            "read without interval.* options and use pyspark_rowtime.rows_window(df, n, "
            "slide=rows, partition_by=...)"
        )
    slide = parse_duration_us(given["interval.slide"].strip(), what="option interval.slide")
    if duration_us is None:
        raise OptionError(
            "option interval.slide moves a time window: set option interval.duration too (the "
            "window's size), or remove interval.slide"
        )
    if slide > duration_us:
        raise OptionError(
            f"option interval.slide={given['interval.slide']!r} is longer than "
            f"interval.duration: rows in the gap between two windows would be valid at no "
            "instant; give a slide at most the duration (equal: tumbling windows)"
        )
    return slide


def _interval(
    given: Mapping[str, str], order: str, merged: Mapping[str, Any] | None = None
) -> tuple[int | None, int | None]:
    """The validity options: (interval.duration in microseconds, interval.count), at most one.
    The stream's default ``interval_count`` applies when the query sets neither (and its order
    is reject or drop: a query choosing ``adjust`` reads without it)."""
    if merged is not None and not any(k in given for k in INTERVAL_OPTIONS):
        if "interval.count" in merged and order != "adjust":
            given = {**given, "interval.count": str(merged["interval.count"])}
    if all(k in given for k in INTERVAL_OPTIONS):
        raise OptionError(
            "options interval.duration and interval.count both set rowtime_end (a time based "
            "and an element based validity); set only one of them"
        )
    duration = None
    if "interval.duration" in given:
        value = given["interval.duration"].strip()
        duration = parse_duration_us(value, what="option interval.duration")
    count = None
    if "interval.count" in given:
        count = _int("interval.count", given["interval.count"], 1)
        if order == "adjust":
            raise OptionError(
                "option interval.count needs order=reject or order=drop: under order=adjust a "
                "row arriving later may still be placed between a row and its N-th successor, "
                "so no row's rowtime_end would be final when it is emitted; use "
                "interval.duration, or another order"
            )
    return duration, count


def _time_format(unit: str, fmt: Any, tz: str) -> TimeFormat:
    """The promoted column's format, checked at load(), not on the first value read."""
    if fmt is not None and not str(fmt).strip():
        raise _bad("rowtime.format", fmt)
    return TimeFormat(
        unit,
        tz,
        None if fmt is None else str(fmt),
        names=("option rowtime.unit", "option rowtime.timezone", "option rowtime.format"),
    )

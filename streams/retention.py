"""Retention: which records of a stream may be removed, and the state readers start from then.

SPEC 12 is the rule; this module decides it for every backend, and the backends
(the packages ``local``, ``redis``) only list their stored units and commit a trim.

**What retention is.** A stream may carry a *retention*: a duration of rowtime (and optionally
a size in bytes per partition, embedded log only). Retention removes whole stored *units* (a
segment file of the embedded log; a run of entries of a Redis stream, i.e. what one append
wrote) from the head of each partition, oldest first, and never a unit with a kept unit before
it. It is measured back from the stream clock, or from the newest data rowtime of the stream when
the clock is beyond it (after the end of stream, or heartbeats ahead of the data), so an ended
stream keeps its last ``retention`` of rowtime. ``rowtime trim PATH --before TIME`` removes what
lies wholly before ``TIME`` under the same rules, with or without a retention.

**What is never removed** (``choose_trim``):

* the last unit of a partition (its footer is the partition's end and clock);
* a unit holding a data row the stream's own policy (its defaults at ``create_stream``) still
  holds at the trim point, or a row inside its window: rowtime at or above the reference time
  minus ``adjust.range`` (for ``reject``/``drop`` the range is 0). A writer cannot know a
  query's options, so a reader with a wider ``adjust.range`` than the stream's, or another
  ``rowtime.column``, may find rows it would have reordered gone: set the stream's defaults to
  the widest policy its readers use;
* with the stream default ``interval_count = N``, the units holding the last ``N`` rows not
  known to be discarded (their ``N``-th successor is not written yet, so a query with
  ``interval.count`` waits at them). ``interval.count`` given by a query alone cannot be known
  to the writer; such a query that falls behind the retention fails (or skips, with
  ``failOnDataLoss=false``) like any other.

**Offsets never change**: a trim removes a prefix, and the first kept offset
(``TrimState.start``, ``start_offset(partition)`` of every backend) grows.

**The state at the first kept record** (``TrimState``) is stored with the trim: the largest
data rowtime and the largest bound before it (raw, before any policy's truncation: truncation
is monotone, so every policy's reference time and bound there are these truncated), the
partition clock there, and the same largest rowtime over the stream's default
``rowtime_column`` when it has one. A reader that starts at the first kept record from that
state decides for every kept record what it would have decided reading from offset 0: the
policies need nothing else (``pyspark_rowtime.bounds.policies``: "a state at the first alive
record is enough"), and no removed row was still alive there.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow.compute as pc

from ..bounds.arrays import as_numpy, to_arrow
from ..bounds.bounds import END_OF_STREAM_US, NO_TIME
from ..bounds.durations import parse_duration_us
from ..bounds.errors import CorruptLogError, OptionError, RowtimeError, shown
from ..bounds.policies import PartitionState, Policy, make_policy
from ..bounds.time import TimeFormat
from ..bounds.versions import newer_format
from .columns import LOG_ARRIVAL_US, LOG_IS_BOUND, LOG_ROWTIME_US, LOG_SYSTEM_COLUMNS
from .storage import StreamStorage, SupportsTrim

__all__ = [
    "RETENTION_FILE",
    "TRIM_FILE",
    "DataLossError",
    "Retention",
    "TrimResult",
    "TrimState",
    "Unit",
    "apply_retention",
    "choose_trim",
    "format_size",
    "parse_retention",
    "parse_size",
]

#: The embedded log's file (at the stream's root) holding a retention ops changed after
#: ``create_stream``; it wins over the stream's defaults. Redis keeps it in ``{...}:retention``.
RETENTION_FILE = "_retention.json"
#: The embedded log's file (in each partition folder) holding that partition's ``TrimState``.
TRIM_FILE = "_trim.json"
TRIM_FORMAT_VERSION = 1

#: A writer applies the retention after an append at most this often (seconds): a check lists
#: the partition's head and every partition's clock, too much for every small flush.
CHECK_EVERY_S = 5.0


class DataLossError(RowtimeError, LookupError):
    """Records a reader needs were removed by retention (or ``rowtime trim``).

    Examples:
        A query fails with it (its checkpoint needs trimmed records) unless
        ``failOnDataLoss=false``; it is also a ``LookupError``:

        >>> import pyspark_rowtime as rt
        >>> issubclass(rt.DataLossError, LookupError)
        True
    """


# -- parsing ---------------------------------------------------------------------------------

_OFF = ("off", "none", "")

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "k": 1 << 10,
    "m": 1 << 20,
    "g": 1 << 30,
    "t": 1 << 40,
}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*")


def parse_retention(value: Any, *, what: str = "retention") -> int | None:
    """A retention as whole microseconds of rowtime, or None for ``None``/``"off"``.

    Accepts what durations accept elsewhere (``parse_duration_us``): ``"7 days"``,
    ``"12h"``, a number of seconds, a ``timedelta``."""
    if value is None or (isinstance(value, str) and value.strip().lower() in _OFF):
        return None
    return parse_duration_us(value, what=what)


def parse_size(value: Any, *, what: str = "retention_size") -> int | None:
    """A size in bytes, or None for ``None``/``"off"``: an int, or a string such as
    ``"10 GiB"``, ``"500MB"``, ``"1.5g"`` (``k``/``m``/``g``/``t`` alone are binary)."""
    accepted = (
        "give a whole number of bytes > 0 or a string such as '10 GiB', '500 MB', '1.5 g' "
        "(units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), or 'off'"
    )
    if value is None or (isinstance(value, str) and value.strip().lower() in _OFF):
        return None
    if isinstance(value, bool):
        raise OptionError(f"{what}={shown(value)} is a bool, not a size: {accepted}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = _SIZE.fullmatch(value)
        unit = m.group(2).lower() if m else ""
        if m is None or unit not in _SIZE_UNITS:
            raise OptionError(f"{what}={shown(value)} is not a size: {accepted}")
        n = math.floor(float(m.group(1)) * _SIZE_UNITS[unit])
    else:
        raise OptionError(f"{what}={shown(value)} of type {type(value).__name__}: {accepted}")
    if n <= 0:
        raise OptionError(f"{what}={shown(value)} must be positive: {accepted}")
    return n


def format_size(n: int) -> str:
    """``n`` bytes for people: ``10 GiB``, ``1.5 MiB``, ``12 B``."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.2f} {unit}"
    return f"{n} B"


def format_duration(us: int) -> str:
    """A duration for people, in the largest unit that divides it: ``7 days``, ``90 s``;
    ``parse_retention`` reads it back to the same value."""
    for unit, size in (("days", 86_400_000_000), ("h", 3_600_000_000), ("min", 60_000_000)):
        if us % size == 0:
            return f"{us // size} {unit}"
    if us % 1_000_000 == 0:
        return f"{us // 1_000_000} s"
    return f"{us} us"


@dataclass(frozen=True)
class Retention:
    """A stream's retention: rowtime kept behind the stream clock (microseconds), and bytes
    kept per partition; None: no limit."""

    duration_us: int | None = None
    size_bytes: int | None = None

    @property
    def active(self) -> bool:
        return self.duration_us is not None or self.size_bytes is not None

    def to_doc(self) -> dict[str, Any]:
        return {"retention_us": self.duration_us, "retention_size": self.size_bytes}

    @classmethod
    def from_doc(cls, doc: Any, where: str) -> Retention:
        try:
            d, s = doc.get("retention_us"), doc.get("retention_size")
            if d is not None and (isinstance(d, bool) or int(d) <= 0):
                raise ValueError(f"retention_us={d!r}")
            if s is not None and (isinstance(s, bool) or int(s) <= 0):
                raise ValueError(f"retention_size={s!r}")
            return cls(None if d is None else int(d), None if s is None else int(s))
        except (AttributeError, TypeError, ValueError) as e:
            raise CorruptLogError(f"the retention of {where} cannot be read: {e}") from e

    @classmethod
    def of_defaults(cls, defaults: Mapping[str, Any]) -> Retention:
        """The retention the stream was created with (its defaults ``retention`` and
        ``retention_size``, as ``meta.validate_defaults`` stores them)."""
        duration = defaults.get("retention")
        return cls(
            None if duration is None else parse_retention(duration),
            defaults.get("retention_size"),
        )

    def describe(self) -> str:
        if not self.active:
            return "off (every record is kept)"
        parts = []
        if self.duration_us is not None:
            parts.append(f"{format_duration(self.duration_us)} of rowtime")
        if self.size_bytes is not None:
            parts.append(f"{format_size(self.size_bytes)} per partition")
        return ", ".join(parts)


# -- the state at the first kept record ------------------------------------------------------


@dataclass(frozen=True)
class TrimState:
    """A partition's trim: ``start`` is its first kept offset (0: nothing removed).

    ``row_max_us``: the largest data rowtime (explicit, or arrival for implicit rows) of the
    removed records; ``bound_max_us``: their largest bound; ``clock_us``: the partition clock
    after them (SPEC 5); ``column`` and ``column_max_us``: the stream's default
    ``rowtime_column`` and the largest rowtime it held among the removed rows. None: no such
    record. ``removed_units`` / ``removed_bytes``: totals, for people."""

    start: int = 0
    row_max_us: int | None = None
    bound_max_us: int | None = None
    clock_us: int | None = None
    column: str | None = None
    column_max_us: int | None = None
    removed_units: int = 0
    removed_bytes: int = 0
    #: the arrival of the last removed record (idle.timeout's last arrival of a reader that
    #: starts at ``start``); None: trimmed before it was kept (0.2.0 development) or unknown
    last_arrival_us: int | None = None

    def to_doc(self) -> dict[str, Any]:
        return {"v": TRIM_FORMAT_VERSION, **self.__dict__}

    def to_json(self) -> str:
        return json.dumps(self.to_doc(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> TrimState:
        try:
            doc = json.loads(text)
            version = doc.get("v")
            if isinstance(version, int) and version > TRIM_FORMAT_VERSION:
                where_ = f"the trim state of {where}"
                raise newer_format(where_, version, TRIM_FORMAT_VERSION, CorruptLogError)
            if not isinstance(version, int):
                raise ValueError(f"format version {version!r}")
            fields = {k: doc.get(k) for k in cls.__dataclass_fields__ if k in doc}
            state = cls(**fields)
            if not isinstance(state.start, int) or state.start < 0:
                raise ValueError(f"start={state.start!r}")
            return state
        except CorruptLogError:
            raise
        except (AttributeError, TypeError, ValueError) as e:
            raise CorruptLogError(f"the trim state of {where} cannot be read: {e}") from e

    def policy_state(self, policy: Policy, rowtime_column: str | None) -> PartitionState:
        """Where a reader under ``policy`` (promoting ``rowtime_column``, or None) starts: at
        ``start``, with the reference time and the bound every record before it left.

        A reader promoting another column than the one the trim measured starts with no
        reference time (as ``startingOffsets=latest`` does): the removed rows' values in its
        column are gone."""
        if self.start == 0:
            return PartitionState()
        unit = policy.unit_us
        row = self.column_max_us if rowtime_column is not None else self.row_max_us
        if rowtime_column is not None and rowtime_column != self.column:
            row = None
        ref = None if row is None else row - row % unit
        bound = self.bound_max_us
        if bound is not None and bound != END_OF_STREAM_US:
            bound -= bound % unit
        return PartitionState(
            next=self.start,
            scan=self.start,
            scan_ref_us=ref,
            scan_bound_us=bound,
            ref_us=ref,
            bound_us=bound,
        )


@dataclass(frozen=True)
class Unit:
    """One stored unit at a partition's head: records ``[first, first + count)``, ``bytes``
    stored, the largest data rowtime (None without rows), the largest bound (None without
    bounds) and the partition clock after it; ``column_max_us``: the largest value of the
    stream's default ``rowtime_column`` (filled by ``apply_retention`` when it has one)."""

    first: int
    count: int
    rows: int
    bytes: int
    row_max_us: int | None
    bound_max_us: int | None
    clock_us: int | None
    column_max_us: int | None = None
    last_arrival_us: int | None = None

    @property
    def end(self) -> int:
        return self.first + self.count


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def stream_policy(defaults: Mapping[str, Any]) -> Policy:
    """The stream's own policy (its defaults at ``create_stream``; ``reject`` without)."""
    return make_policy(
        defaults.get("order", "reject"),
        unit=defaults.get("adjust_unit", "usec"),
        range=int(defaults.get("adjust_range", 0)),
    )


def choose_trim(
    units: Sequence[Unit],
    prev: TrimState,
    *,
    policy: Policy,
    before_us: int | None,
    size_bytes: int | None = None,
    newest_row_us: int | None,
    clock_us: int | None = None,
    keep_from: int | None = None,
    column: str | None = None,
) -> TrimState | None:
    """The new trim of a partition whose kept units are ``units`` (in offset order, the first
    at ``prev.start``), or None when nothing may go.

    A unit goes when everything in it lies before ``before_us``, or (``size_bytes``) while the
    partition holds more than that, and none of SPEC 12's never-remove rules keeps it (module
    docstring): it is not the last unit, nor at or after ``keep_from``; everything in it lies
    below the stream clock ``clock_us`` (so a streaming query at the tail has emitted its
    rows: alignment holds a released row back until the stream clock reaches it); and its data
    rows lie below the window ``reference - range`` of the partition's ``newest_row_us`` (its
    largest rowtime), so the stream's policy holds none of them any more: a row below that
    line is released, and no row can fall between it and a kept one. Only a prefix goes: the
    first unit that must stay keeps every later one.
    """
    row_max, bound_max, col_max = prev.row_max_us, prev.bound_max_us, prev.column_max_us
    total = sum(u.bytes for u in units)
    removed = 0
    best: TrimState | None = None
    units_gone = 0
    window: int | None = None
    if newest_row_us is not None:
        window = newest_row_us - newest_row_us % policy.unit_us - policy.range_us
    for u in units[:-1]:
        if keep_from is not None and u.end > keep_from:
            break
        high = _max(u.row_max_us, u.bound_max_us)
        by_time = before_us is not None and high is not None and high < before_us
        by_size = size_bytes is not None and total - removed > size_bytes
        if not (by_time or by_size):
            break
        if clock_us is not None and high is not None and high >= clock_us:
            break  # not yet emitted by a query at the tail (alignment)
        row = u.column_max_us if column is not None else u.row_max_us
        if row is not None and window is not None and row - row % policy.unit_us >= window:
            break  # inside the policy window behind the reference time: maybe still held
        row_max, bound_max = _max(row_max, u.row_max_us), _max(bound_max, u.bound_max_us)
        col_max = _max(col_max, u.column_max_us)
        removed += u.bytes
        units_gone += 1
        best = TrimState(
            start=u.end,
            row_max_us=row_max,
            bound_max_us=bound_max,
            clock_us=u.clock_us,
            column=column,
            column_max_us=col_max,
            removed_units=prev.removed_units + units_gone,
            removed_bytes=prev.removed_bytes + removed,
            last_arrival_us=u.last_arrival_us,
        )
    return best


# -- applying it -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TrimResult:
    """What one trim of one partition did: offsets ``[before.start, after.start)`` removed."""

    partition: int
    before: TrimState
    after: TrimState

    @property
    def records(self) -> int:
        return self.after.start - self.before.start

    @property
    def units(self) -> int:
        return self.after.removed_units - self.before.removed_units

    @property
    def bytes(self) -> int:
        return self.after.removed_bytes - self.before.removed_bytes


def _time_format(defaults: Mapping[str, Any]) -> TimeFormat:
    return TimeFormat(
        defaults.get("rowtime_unit", "ms"),
        defaults.get("rowtime_timezone", "UTC"),
        defaults.get("rowtime_format"),
        names=("rowtime_unit", "rowtime_timezone", "rowtime_format"),
    )


def unit_times(
    storage: StreamStorage, partition: int, first: int, end: int, column: str | None
) -> tuple[np.ndarray, np.ndarray]:
    """Each record's time in ``[first, end)`` (a data row's rowtime, promoted from the stream's
    default ``column`` when given; a bound's bound) and which records are bounds."""
    cols = list(LOG_SYSTEM_COLUMNS) + ([column] if column is not None else [])
    table = storage.read(partition, first, end, columns=cols)
    is_bound = as_numpy(table.column(LOG_IS_BOUND))
    t = as_numpy(pc.coalesce(table.column(LOG_ROWTIME_US), table.column(LOG_ARRIVAL_US)))
    if column is not None and len(t):
        data = np.flatnonzero(~is_bound)
        if len(data):
            values = table.column(column).take(to_arrow(data))
            t = t.copy()
            t[data] = _time_format(storage.meta.defaults).read_array(
                values, what=f"rowtime_column {column!r} of {storage.location}"
            )
    return np.asarray(t, dtype=np.int64), np.asarray(is_bound, dtype=bool)


def _with_column_max(
    storage: StreamStorage, partition: int, units: list[Unit], column: str, upto: int
) -> list[Unit]:
    """``units`` with ``Unit.column_max_us`` read for the first ``upto`` of them."""
    out = []
    for i, u in enumerate(units):
        if i < upto:
            t, b = unit_times(storage, partition, u.first, u.end, column)
            rows = t[~b]
            u = replace(u, column_max_us=int(rows.max()) if len(rows) else None)
        out.append(u)
    return out


def _keep_from(
    storage: StreamStorage,
    partition: int,
    units: Sequence[Unit],
    prev: TrimState,
    n: int,
    column: str | None,
) -> int | None:
    """The first offset of the last ``n`` kept rows under ``reject``/``drop`` (SPEC 10: their
    ``n``-th successor is not written yet, so a query with ``interval.count = n`` waits at
    them), or None when the partition ended (an end of stream settles every row). Reads the
    times of the trailing units only, until ``n`` kept rows are found."""
    count = 0
    for i in range(len(units) - 1, -1, -1):
        u = units[i]
        if u.bound_max_us == END_OF_STREAM_US:
            return None
        clock = units[i - 1].clock_us if i else prev.clock_us
        t, b = unit_times(storage, partition, u.first, u.end, column)
        before = np.empty(len(t), dtype=np.int64)
        if len(t):
            before[0] = NO_TIME if clock is None else clock
            np.maximum.accumulate(t[:-1], out=before[1:])
            np.maximum(before, before[0], out=before)
        kept = np.flatnonzero(~b & (t >= before))
        if count + len(kept) >= n:
            return u.first + int(kept[len(kept) - (n - count)])
        count += len(kept)
    return units[0].first if units else None


def _newest_row(storage: StreamStorage, partition: int) -> int | None:
    newest = None
    for s in storage.partition_stats(partition):
        newest = _max(newest, s.max_rowtime_us)
    return newest


def live_partitions(storage: StreamStorage) -> list[int]:
    """The partitions that hold the stream clock for a query with the stream's own defaults:
    all of them, or with the stream default ``idle_timeout`` those not idle (SPEC 12) as of
    the newest arrival in the stream, decided from the partitions' last arrivals (a partition
    with no record counts the stream's creation, when it is known). Without this, a writer
    that died without an end of stream would hold the clock retention measures from, and
    nothing would ever be trimmed again."""
    every = list(range(storage.meta.partitions))
    timeout = storage.meta.defaults.get("idle_timeout")
    if timeout is None:
        return every
    timeout_us = parse_duration_us(str(timeout), what="stream default idle_timeout")
    created = storage.meta.created_us
    lasts: list[int | None] = []
    for p in every:
        last = storage.tail(p).last_arrival_us
        lasts.append(created if last is None else last)
    live = []
    for p in every:
        others = [a for q, a in enumerate(lasts) if q != p and a is not None]
        last = lasts[p]
        if last is None or not others or max(others) <= last + timeout_us:
            live.append(p)
    return live


def live_clock(storage: StreamStorage) -> int | None:
    """The stream clock over ``live_partitions`` (SPEC 5's minimum, without the idle)."""
    clocks = [storage.clock_us(p) for p in live_partitions(storage)]
    if not clocks or any(c is None for c in clocks):
        return None
    return min(c for c in clocks if c is not None)


def emitted_clock(storage: StreamStorage, policy: Policy, column: str | None) -> int | None:
    """The stream clock a query under the stream's ``policy`` has reached: the minimum over
    partitions of ``max(reference - range, bound)`` (SPEC 6.5), below the storage's stream
    clock by up to ``adjust.range``. Rows above it are released but not yet emitted (they wait
    for the slowest partition), so they must stay. None while a partition is empty. With a
    promoted ``column`` the policy's times are not the stored ones: the storage's clock minus
    the range bounds it from below."""
    clock = live_clock(storage)
    if clock is None:
        return None
    if column is not None or not policy.holds:
        return clock if not policy.holds else clock - policy.range_us
    unit = policy.unit_us
    lines = []
    for p in live_partitions(storage):
        stats = storage.partition_stats(p)
        trimmed = storage.trim_state(p)  # what went before the kept units counts too
        ref = _max(_newest_row(storage, p), trimmed.row_max_us)
        bound = max((s.last_bound_us for s in stats if s.last_bound_us is not None), default=None)
        bound = _max(bound, trimmed.bound_max_us)
        line = None if ref is None else ref - ref % unit - policy.range_us
        if bound is not None and bound != END_OF_STREAM_US:
            bound -= bound % unit
        top = _max(line, bound)
        if top is None:
            return None
        lines.append(top)
    return min(lines)


def plan_cutoff(storage: StreamStorage, retention: Retention, before_us: int | None) -> int | None:
    """The rowtime before which units may go: ``before_us``, or the retention measured back
    from the stream clock (from the newest data rowtime of the stream when the clock is beyond
    it), whichever removes more; None when neither applies (no retention, or a partition
    without records: no stream clock)."""
    cutoff = before_us
    if retention.duration_us is not None:
        clock = live_clock(storage)
        if clock is not None:
            newest = None
            for p in range(storage.meta.partitions):
                newest = _max(newest, _newest_row(storage, p))
            top = clock if newest is None else min(clock, newest)
            by_retention = top - retention.duration_us
            cutoff = by_retention if cutoff is None else max(cutoff, by_retention)
    return cutoff


def apply_retention(
    storage: SupportsTrim,
    *,
    before_us: int | None = None,
    partitions: Sequence[int] | None = None,
    use_retention: bool = True,
) -> list[TrimResult]:
    """Trim each partition (or ``partitions``) as far as the stream's retention (with
    ``use_retention``) and ``before_us`` allow, under SPEC 12's never-remove rules; returns
    what was removed (partitions that lost nothing are left out).

    A writer's merge may replace the segments being read while this measures them (the
    segment a listing named is gone): the whole measure is taken again, a few times."""
    for attempt in range(4):
        try:
            return _apply_retention(storage, before_us, partitions, use_retention)
        except FileNotFoundError:
            if attempt == 3:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def _apply_retention(
    storage: SupportsTrim,
    before_us: int | None,
    partitions: Sequence[int] | None,
    use_retention: bool,
) -> list[TrimResult]:
    retention = storage.retention() if use_retention else Retention()
    if before_us is None and not retention.active:
        return []
    defaults = storage.meta.defaults
    policy = stream_policy(defaults)
    column = defaults.get("rowtime_column")
    keep_n = defaults.get("interval_count")
    cutoff = plan_cutoff(storage, retention, before_us)
    if cutoff is None and retention.size_bytes is None:
        return []
    # Only what a query at the tail has emitted may go: nothing while a partition is empty.
    clock = emitted_clock(storage, policy, column)
    if clock is None:
        return []
    results = []
    for p in partitions if partitions is not None else range(storage.meta.partitions):
        newest = _newest_row(storage, p)

        def decide(
            units: list[Unit], prev: TrimState, p: int = p, newest: int | None = newest
        ) -> TrimState | None:
            keep_from = None
            if keep_n:
                keep_from = _keep_from(storage, p, units, prev, int(keep_n), column)
            newest_row = newest
            if column is not None:
                # Only the units that may go are read (their values are needed for the state).
                candidates = 0
                for u in units[:-1]:
                    high = _max(u.row_max_us, u.bound_max_us)
                    size_ok = retention.size_bytes is not None
                    if not size_ok and (cutoff is None or high is None or high >= cutoff):
                        break
                    candidates += 1
                units = _with_column_max(storage, p, units, column, candidates)
                t, b = unit_times(storage, p, units[-1].first, units[-1].end, column)
                rows = t[~b]
                newest_row = int(rows.max()) if len(rows) else None
                for u in units:
                    newest_row = _max(newest_row, u.column_max_us)
            return choose_trim(
                units,
                prev,
                policy=policy,
                before_us=cutoff,
                size_bytes=retention.size_bytes,
                newest_row_us=newest_row,
                clock_us=clock,
                keep_from=keep_from,
                column=column,
            )

        result = storage.trim_partition(p, decide)
        if result is not None:
            results.append(result)
    return results


#: When each partition (by location) was last checked in this process: a writer opened per
#: sink commit would otherwise check at its first append every time.
_LAST_CHECK: dict[tuple[str, int], float] = {}
_LAST_CHECK_LOCK = threading.Lock()


class RetentionCheck:
    """A writer's retention, applied after appends at most every ``CHECK_EVERY_S``
    seconds per partition and process (the first append of a process checks at once).
    Housekeeping: a failure is logged, never raised into the append that committed."""

    def __init__(self, storage: StreamStorage, partition: int) -> None:
        #: None for a stream that keeps no retention (not a ``SupportsTrim``)
        self.storage = storage if isinstance(storage, SupportsTrim) else None
        self.partition = partition
        self._key = (storage.location, partition)

    def after_append(self) -> list[TrimResult]:
        if self.storage is None:
            return []
        now = time.monotonic()
        with _LAST_CHECK_LOCK:
            last = _LAST_CHECK.get(self._key)
            if last is not None and now - last < CHECK_EVERY_S:
                return []
            _LAST_CHECK[self._key] = now
            if len(_LAST_CHECK) > 4096:
                _LAST_CHECK.clear()
        try:
            if not self.storage.retention().active:
                return []
            return apply_retention(self.storage, partitions=[self.partition])
        except (OSError, RowtimeError) as e:
            logging.getLogger("pyspark_rowtime").warning(
                "retention of partition %s of %s not applied this time: %s",
                self.partition,
                self.storage.location,
                e,
            )
            return []


def data_loss(location: str, partition: int, offset: int, first_kept: int) -> DataLossError:
    """The error of a read that needs records a trim removed."""
    return DataLossError(
        f"stream {location!r} partition {partition}: records from offset {offset} are needed, "
        f"and the first kept offset is {first_kept} (records before it were removed by the "
        "stream's retention or `rowtime trim`). A streaming query: set option "
        "failOnDataLoss=false to skip to it (the skipped records are counted), or start the "
        "query with a new checkpointLocation. A batch read that a trim overtook while it ran: "
        "run it again (it starts from the first kept record, exact for what is kept)"
    )

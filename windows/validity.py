"""``interval_aggregate``: the Odysseus aggregate over validity intervals (SPEC 10, seed 001).

Seed 001: "The Aggregate (and Group) operator [...] has to assure that only events with
overlapping time intervals are aggregated. The result of the aggregation is a new event with a
time interval that is the intersection of all involved events." SPEC 10 makes it exact:
snapshot reducibility, one output row per group and per maximal stretch ``[a, b)`` in which
the set of valid rows does not change, nothing where no row is valid.

How it is built, and why:

* **The stretches are the pure core's** (``pyspark_rowtime.bounds.intervals.stretches``):
  the change points are the starts and ends of the non-empty intervals; the set of valid rows
  changes at each of them, so consecutive points bound exactly the maximal stretches (two
  adjacent stretches never have the same set). Each aggregate is one
  ``range_reduce`` over the rows' ranges of stretches:
  ``O((rows + stretches) log stretches)`` per key and micro-batch, whatever the overlap.
* **When a stretch is final.** Spark's watermark ``W`` (ms) is the stream clock minus 1 ms (at
  least; ``pyspark_rowtime.with_watermark``), and every row still to come starts at or after
  the clock, above ``W``. A stretch ``[a, b)`` with ``b <= W`` can no longer change: it is
  emitted in that batch, once. The last change point at or below ``W`` (``from``) is kept; rows
  that end at or before it have given all their stretches and leave the state, so the state of
  a key is the rows valid across ``W`` plus the rows not yet started below it: bounded by the
  bounds, whatever the stream's length. A stretch that ends at infinity (rows valid until the
  end of stream) is emitted when the stream ends (``W`` at Spark's largest timestamp), never
  before.
* **Spark's own stateful operator.** Rows of a key live in Spark's state store through
  ``applyInPandasWithState`` with an event-time timeout (the next stretch end), as
  ``overlap_join`` and ``time_interval_aggregate`` do, so a restart from the checkpoint goes on
  with exactly the state and the output of an uninterrupted run; no Py4J (Spark Connect). An
  ``IntervalConfig``, its ``IntervalLogic`` and the versioned ``IntervalState``,
  run by the operators' shared piece (``stateful.run_on_state_store``).
* **Aggregates** are named SQL-like strings, ``{"total": "sum(v)"}``: ``count(*)``,
  ``count(x)``, ``sum(x)``, ``avg(x)`` (or ``mean``), ``min(x)``, ``max(x)``, where ``x`` is any
  Spark SQL expression over the columns. Spark computes ``x`` and whether it is null before the
  step; nulls are skipped as Spark skips them (``sum`` of only nulls is null, ``count(x)``
  counts the non-null). ``sum`` of integers stays exact (64-bit), of floating numbers is a
  double; ``avg`` is a double; ``min``/``max`` keep the type (numbers, strings, timestamps).
* **Late rows**: a row that starts before ``from`` (impossible from one aligned rowtime reader)
  would change a stretch already emitted; it is counted in the observed metric, never silently
  used or lost from view.
* **The observed metric** ``metric_name``: ``max_rows_per_key`` (the most rows a key keeps after
  the batch, among the keys it touched), ``stretches`` (rows emitted) and ``discarded_rows``.

Results come once their stretch has ended: their ``rowtime`` is below the stream clock of the
batch that writes them, so write them to a table or files, not to a rowtime sink (which refuses
rows below its clock).
"""

from __future__ import annotations

import array
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa

from ..bounds.errors import OptionError
from ..bounds.intervals import INFINITY_US, range_reduce, stretches
from ..watermark import watermark_rowtime
from .aggregate import agg_calls, agg_columns, present_flag
from .define import WindowDef, assign_ends, window_of
from .stateful import (
    KeyLogic,
    KeyStep,
    StatefulPlan,
    key_column,
    never_late,
    run_on_state_store,
)
from .step import StateFormat

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "INTERVAL_FORMAT",
    "IntervalAgg",
    "IntervalConfig",
    "IntervalLogic",
    "IntervalState",
    "IntervalStep",
    "interval_aggregate",
    "interval_step",
    "parse_aggs",
]

#: Spark's watermark (ms) once every input reached the end of stream.
_END_MS = INFINITY_US // 1000 - 1
_KINDS = {"count": "count", "sum": "sum", "avg": "avg", "mean": "avg", "min": "min", "max": "max"}
_CALL = re.compile(r"^\s*([A-Za-z_]+)\s*\((.*)\)\s*$", re.S)
_RESERVED = ("rowtime", "rowtime_end", "is_bound")


@dataclass(frozen=True)
class IntervalAgg:
    """One aggregate: its output ``name``, ``kind`` (count, sum, avg, min, max), the input
    column of the step's frame (None for ``count(*)``), whether that input is of an integral
    type (exact sums) and the presence column (1 where the input is not null)."""

    name: str
    kind: str
    column: str | None
    present: str | None
    integral: bool = False


def parse_aggs(aggs: Mapping[str, str]) -> list[tuple[str, str, str | None]]:
    """``{name: "fn(expr)"}`` as ``(name, kind, expr)`` (``expr`` None for ``count(*)``).

    Raises:
        OptionError: not a mapping, an empty one, a function not supported, a bad name.
    """
    if not isinstance(aggs, Mapping) or not aggs:
        raise OptionError(
            f"interval_aggregate: aggs={aggs!r} must be Spark aggregate columns, e.g. "
            "F.count('*').alias('n'), F.max('temp').alias('hottest') (as groupBy().agg(...) "
            "takes them), or a non-empty dict of output name to aggregate, e.g. "
            "{'n': 'count(*)', 'total': 'sum(v)', 'hottest': 'max(temp)'}"
        )
    out: list[tuple[str, str, str | None]] = []
    for name, text in aggs.items():
        if not isinstance(name, str) or not name or name in _RESERVED:
            raise OptionError(
                f"interval_aggregate: aggs key {name!r} must be a column name other than "
                f"{list(_RESERVED)}"
            )
        call = _CALL.match(text) if isinstance(text, str) else None
        kind = _KINDS.get(call.group(1).lower()) if call else None
        if call is None or kind is None:
            raise OptionError(
                f"interval_aggregate: aggs[{name!r}]={text!r} is not one of count(*), "
                "count(x), sum(x), avg(x), min(x), max(x) (x: a Spark SQL expression over the "
                "columns): the aggregate over each stretch of constant validity is computed "
                "from the rows valid in it, by these functions only"
            )
        arg = call.group(2).strip()
        if not arg:
            raise OptionError(f"interval_aggregate: aggs[{name!r}]={text!r} has no argument")
        star = arg in ("*", "1")
        if star and kind != "count":
            raise OptionError(f"interval_aggregate: aggs[{name!r}]={text!r}: only count takes *")
        out.append((name, kind, None if star else arg))
    return out


@dataclass(frozen=True)
class IntervalStep:
    """What one call for one key decided: the stretches emitted, in ascending start, as columns
    (``starts``/``ends`` in us, and per aggregate its values and where they are not null); the
    frame of rows to keep (None: nothing), the change point the emitted stretches reached
    (``from``), the event-time timeout (ms), and the late rows discarded."""

    starts: np.ndarray
    ends: np.ndarray
    values: list[tuple[np.ndarray, np.ndarray]]
    rows: pd.DataFrame | None
    from_us: int | None
    timeout_ms: int | None
    discarded: int

    @property
    def stretches(self) -> list[tuple[int, int, list[Any]]]:
        """The stretches as ``(start_us, end_us, [value or None per aggregate])``."""
        cols = [
            [v if ok else None for v, ok in zip(a.tolist(), m.tolist(), strict=True)]
            for a, m in self.values
        ]
        return [
            (s, e, [c[i] for c in cols])
            for i, (s, e) in enumerate(zip(self.starts.tolist(), self.ends.tolist(), strict=True))
        ]


def _values(
    agg: IntervalAgg,
    frame: pd.DataFrame,
    lo: np.ndarray,
    hi: np.ndarray,
    m: int,
    count: np.ndarray,
    shared: dict[tuple[str, str], Any],
) -> tuple[np.ndarray, np.ndarray]:
    """One aggregate's value in each of ``m`` stretches, and where it is not null. ``shared``
    holds what aggregates over one input have in common (``sum(v)`` and ``avg(v)`` one sum, and
    both the count of ``v``'s non-null values), computed once a call."""
    if agg.kind == "count" and agg.column is None:
        return count, np.ones(m, dtype=bool)
    assert agg.present is not None
    if ("present", agg.present) not in shared:
        present = frame[agg.present].to_numpy(dtype=bool)
        everywhere = bool(present.all())
        shared["present", agg.present] = None if everywhere else present
        ones = np.ones(int(present.sum()), np.int64)
        n = count if everywhere else range_reduce("add", lo[present], hi[present], ones, m)
        shared["count", agg.present] = n
    present = shared["present", agg.present]
    n = shared["count", agg.present]
    if agg.kind == "count":
        return n, np.ones(m, dtype=bool)
    assert agg.column is not None
    column = frame[agg.column]
    lo_p, hi_p = (lo, hi) if present is None else (lo[present], hi[present])
    if agg.kind in ("sum", "avg"):
        if ("sum", agg.column) not in shared:
            v = column.to_numpy() if present is None else column.to_numpy()[present]
            v = v.astype(np.int64 if agg.integral else np.float64, copy=False)
            shared["sum", agg.column] = range_reduce("add", lo_p, hi_p, v, m)
        total = shared["sum", agg.column]
        if agg.kind == "avg":
            return total / np.maximum(n, 1), n > 0
        return total, n > 0
    # min / max by rank: any ordered type (numbers, strings, timestamps as microseconds).
    codes, uniques = pd.factorize(column if present is None else column[present], sort=True)
    ranks = np.asarray(codes, dtype=np.int64)
    values = np.asarray(uniques, dtype=object)
    if (ranks < 0).any():  # NaN (not null: Spark's NaN is a value, above every number)
        ranks[ranks < 0] = len(values)
        values = np.append(values, float("nan"))
    best = range_reduce(agg.kind, lo_p, hi_p, ranks, m)
    return values[np.where(n > 0, best, 0)] if len(values) else np.full(m, None), n > 0


def interval_step(
    aggs: list[IntervalAgg],
    old: pd.DataFrame | None,
    from_us: int | None,
    new: pd.DataFrame | None,
    watermark_ms: int,
    *,
    window: WindowDef | None = None,
) -> IntervalStep:
    """One key, one micro-batch: take the new rows (columns ``__t``/``__e``: validity in us,
    and the aggregates' inputs), emit the stretches that ended at or before the watermark and
    say what to keep (see the module).

    With a ``window`` (``define``), the rows also have ``__g``, ``__on`` and ``__open``
    (new rows: None) and their ends are set here first (``define.assign_ends``); a row
    whose end is not known yet counts as valid until infinity, which changes no stretch up to
    the watermark (the row that will end it starts above it)."""
    discarded = 0
    parts = [f for f in (old, new) if f is not None and len(f)]
    if new is not None and len(new) and from_us is not None:
        late = new["__t"].to_numpy(dtype=np.int64) < from_us
        discarded = int(late.sum())
        parts = [f for f in (old, new[~late]) if f is not None and len(f)]
    none = np.empty(0, dtype=np.int64)
    nothing = [(none, none.astype(bool)) for _ in aggs]
    if not parts:
        return IntervalStep(none, none, nothing, None, None, None, discarded)
    frame = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    if window is not None:
        frame = assign_ends(window, frame)
    t = frame["__t"].to_numpy(dtype=np.int64)
    e = frame["__e"].to_numpy(dtype=np.int64)
    w_us = INFINITY_US if watermark_ms >= _END_MS else watermark_ms * 1000
    # Rows that start after the watermark change no stretch up to it: kept, not swept (a key
    # holds the rows of the batch the watermark has not reached yet, as many as the rest).
    near = t <= w_us
    swept = frame if near.all() else frame[near].reset_index(drop=True)
    points, lo, hi = stretches(t[near], e[near], from_us, w_us)
    m = len(points) - 1
    starts, ends, values = none, none, nothing
    if m > 0:
        count = range_reduce("add", lo, hi, np.ones(len(lo), dtype=np.int64), m)
        some = np.flatnonzero(count > 0)  # instants with no valid row give no output
        starts, ends = points[:-1][some], points[1:][some]
        shared: dict[tuple[str, str], Any] = {}
        values = [
            (v[some], ok[some])
            for v, ok in (_values(a, swept, lo, hi, m, count, shared) for a in aggs)
        ]
    reached = int(points[-1]) if len(points) else from_us
    keep = e > t
    if reached is not None:
        keep &= e > reached
    if not keep.any():
        return IntervalStep(starts, ends, values, None, None, None, discarded)
    rows = frame[keep].reset_index(drop=True)
    kt, ke = t[keep], e[keep]
    after = kt if reached is None else np.where(kt > reached, kt, ke)
    # Spark fires an event-time timeout T once the watermark is above T: the next stretch
    # ending at ``b`` (us) is due once W * 1000 >= b, i.e. W > ceil(b / 1000) - 1.
    due = min(-(-int(after.min()) // 1000) - 1, _END_MS - 1)
    return IntervalStep(starts, ends, values, rows, reached, max(watermark_ms, due), discarded)


@dataclass(frozen=True)
class IntervalState:
    """The state of one key (format version 3, ``INTERVAL_FORMAT``): the rows kept (the
    step's columns) and the change point the emitted stretches reached (``from``)."""

    rows: pd.DataFrame
    from_us: int | None


#: The codec of version 3's numeric columns (pyarrow's; without it they are stored raw).
_CODEC = "zstd"
_PLAIN, _AFTER_T = "zstd", "zstd, minus __t"


def _write_interval(state: IntervalState) -> dict[str, Any]:
    # Plain values, not pandas or numpy objects: read back admitting value types only. A
    # numeric or boolean column is (its numpy dtype string, its codec, its size, its bytes
    # compressed), ``__e`` as its distance from ``__t`` (a fixed duration compresses to
    # nothing): a key holds every row of a micro-batch until Spark's watermark, one batch
    # behind, reaches them, and Spark's JVM hands the stored value back to Python a byte at a
    # time (its pickler builds a string of them), which cost more than the step at millions of
    # rows. Other columns (strings, a window's open flags) stay lists. A dict, so always in the
    # envelope: bare, a reader could not tell it from a newer envelope.
    rows = state.rows
    compress = pa.Codec.is_available(_CODEC)
    starts = rows["__t"].to_numpy() if "__t" in rows.columns else None
    columns: dict[str, Any] = {}
    for c in rows.columns:
        values = rows[c].to_numpy()
        if values.dtype.kind not in "biuf":
            columns[c] = values.tolist()
            continue
        if not compress:
            columns[c] = (values.dtype.str, values.tobytes())  # as version 2
            continue
        codec = _PLAIN
        if c == "__e" and starts is not None and values.dtype == starts.dtype == np.int64:
            values, codec = values - starts, _AFTER_T  # wraps and unwraps exactly
        raw = values.tobytes()
        packed = pa.compress(raw, codec=_CODEC, asbytes=True)
        columns[c] = (values.dtype.str, codec, len(raw), packed)
    return {"from": state.from_us, "columns": columns}


def _numbers(c: str, stored: tuple[Any, ...], columns: dict[str, Any]) -> np.ndarray:
    """A numeric column as version 2 ``(dtype, bytes)`` or 3 ``(dtype, codec, size, bytes)``
    stored it (``__e`` of version 3 after ``__t``, which ``columns`` then holds)."""
    codec = None
    if len(stored) == 2:
        dtype, raw = stored
    else:
        dtype, codec, size, packed = stored
        if codec not in (_PLAIN, _AFTER_T):
            raise ValueError(f"column {c} stored with codec {codec!r}")
        try:
            raw = pa.decompress(packed, decompressed_size=size, codec=_CODEC, asbytes=True)
        except (OSError, pa.ArrowException) as e:
            raise ValueError(f"column {c} does not decompress ({e})") from e
    values = np.frombuffer(raw, dtype=np.dtype(dtype))
    if values.dtype.kind not in "biuf":
        raise ValueError(f"column {c} stored as {dtype}, not numbers")
    if codec == _AFTER_T:
        starts = columns.get("__t")
        if not isinstance(starts, np.ndarray) or len(starts) != len(values):
            raise ValueError(f"column {c} stored after __t, which is not beside it")
        return values + starts
    return values.copy()


def _read_interval(plain: dict[str, Any]) -> IntervalState:
    # In the envelope, or bare: the first interval_aggregate stored the dict without "v".
    # Version 1 stored every column as a list; version 2 numeric ones as (dtype, bytes);
    # version 3 compressed, with their size (``_write_interval``).
    columns: dict[str, Any] = {}
    stored_columns = plain["columns"]
    order = sorted(stored_columns, key=lambda c: c != "__t")  # __t first: __e may need it
    for c in order:
        stored = stored_columns[c]
        columns[c] = _numbers(c, stored, columns) if isinstance(stored, tuple) else stored
    rows = pd.DataFrame({c: columns[c] for c in stored_columns})
    for c in ("__t", "__e"):
        rows[c] = rows[c].astype(np.int64)
    if "__open" in rows.columns:  # a window's rows (rows_window, while_window)
        rows["__open"] = rows["__open"].astype(bool)
    return IntervalState(rows, plain["from"])


#: How ``interval_aggregate`` stores a key (``step.StateFormat``): version 3 since its
#: numeric columns are compressed; versions 1 (lists) and 2 (raw bytes) are still read.
INTERVAL_FORMAT = StateFormat(
    "an interval_aggregate key",
    3,
    _write_interval,
    {1: _read_interval, 2: _read_interval, 3: _read_interval},
)


def _save(rows: pd.DataFrame, from_us: int | None) -> bytes:
    return INTERVAL_FORMAT.dumps(IntervalState(rows, from_us))


def _load(blob: bytes) -> tuple[pd.DataFrame, int | None]:
    state = INTERVAL_FORMAT.loads(blob)
    return state.rows, state.from_us


def _column_aggs(
    df: DataFrame, aggs: object, more: tuple[object, ...], keys: list[str]
) -> list[tuple[str, str, Column | None, str]]:
    """Spark aggregate columns as ``(name, kind, argument column, text)`` (the argument None
    for ``count(*)``): Spark's analyzer names and checks them, as for
    ``time_interval_aggregate`` (``windows.aggregate.agg_calls``)."""
    from pyspark.sql import functions as F

    who = "interval_aggregate"
    calls = agg_calls(df, agg_columns(aggs, more, who), keys, who=who, reserved=_RESERVED)
    out: list[tuple[str, str, Column | None, str]] = []
    for i, call in enumerate(calls):
        if call.kind not in _KINDS.values():
            raise OptionError(
                f"{who}: aggs[{i}]={call.text} is not one of count, sum, avg, min, max: the "
                "aggregate over each stretch of constant validity is computed from the rows "
                "valid in it, by these functions only"
            )
        if call.kind == "count":
            flag = present_flag(call)
            value = None if flag is None else F.when(flag == 1, F.lit(1))
        else:
            value = call.args[0]
        out.append((call.name, call.kind, value, call.text))
    return out


@dataclass(frozen=True)
class IntervalConfig:
    """``interval_aggregate``'s checked parameters: the aggregates over the step's input
    columns, the window whose ends the step sets (None: the rows come with their ends), the
    key columns and the columns the step takes (timestamps among them as microseconds, which
    the query turns back after the step)."""

    aggs: tuple[IntervalAgg, ...]
    window: WindowDef | None
    keys: tuple[str, ...]
    step_columns: tuple[str, ...]


#: Stretches per output row: a step emits each aggregate's values (and the stretches' times) as
#: arrays of up to this many, which Spark unpacks after the operator (``inline``). A row per
#: stretch cost more in Spark's worker than the step itself: it pads each batch of output rows
#: with as many empty state rows, and checks and converts them one by one. A bound, not one array
#: per call, so that a batch of Spark's output rows stays bounded too.
PACK = 256


#: The ``array`` type codes of the numpy kinds ``_pieces`` hands Spark as ``array.array``.
_ARRAY_CODES = {"f": "d", "i": "q"}


def _pieces(values: np.ndarray, rows: int) -> np.ndarray:
    """``values`` as ``rows`` consecutive pieces of ``PACK``: an object column whose every
    value is one output row's array. Spark's worker copies each array into a list before
    Arrow takes it (``list(value)``): from a numpy array that makes a numpy scalar object per
    element, which Arrow then converts slowly; from an ``array.array`` (the doubles and 64-bit
    integers, copied once as they are) it makes Python floats and ints, which it converts
    faster: the conversion about a quarter cheaper, and still one chunk of Spark's output at
    a time. Other values (objects: strings, None) go as views."""
    code = _ARRAY_CODES.get(values.dtype.kind) if values.dtype.itemsize == 8 else None
    source: Any = values
    if code is not None:
        source = array.array(code)
        source.frombytes(values.tobytes())
    column = np.empty(rows, dtype=object)
    for i in range(rows):
        column[i] = source[i * PACK : (i + 1) * PACK]
    return column


def _with_nulls(values: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """One aggregate's values with None (Spark's null) where ``ok`` is false: floats as NaN
    (which Spark's worker turns into null), other types as objects."""
    if ok.all():
        return values
    if values.dtype.kind == "f":
        return np.where(ok, values, np.nan)
    out = values.astype(object)  # a copy: ``values`` may be the step's own
    out[~ok] = None
    return out


def _step_rows(parts: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame | None:
    """A key's chunks of rows (Spark hands them up to ``maxRecordsPerBatch`` rows at a time)
    as one frame of the step's ``columns``: numpy columns joined column by column, each copied
    once (selecting the columns of each chunk, then joining the chunks, copied both); pandas'
    own types (none here) as before, through ``pd.concat``."""
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0][columns]
    if all(isinstance(f[c].dtype, np.dtype) for f in parts for c in columns):
        return pd.DataFrame({c: np.concatenate([f[c].to_numpy() for f in parts]) for c in columns})
    return pd.concat([f[columns] for f in parts], ignore_index=True)


class IntervalLogic(KeyLogic[IntervalState]):
    """One key's stretches: ``interval_step`` over its kept and new rows, then the stretches it
    emits, packed: rows of up to ``PACK`` stretches, each aggregate and the stretches' times
    (``__ts``, ``__te``, microseconds) as arrays; at least one row per call, which carries the
    metrics (``__kept``: the rows kept, on every row; ``__discarded`` on the first)."""

    format = INTERVAL_FORMAT

    def __init__(self, config: IntervalConfig) -> None:
        self.config = config
        self._aggs = list(config.aggs)
        self._columns = list(config.step_columns)

    def step(
        self,
        key: tuple,
        frames: Iterator[pd.DataFrame],
        state: IntervalState | None,
        watermark_ms: int,
    ) -> KeyStep[IntervalState]:
        c = self.config
        old, from_us = (None, None) if state is None else (state.rows, state.from_us)
        new = _step_rows([f for f in frames if len(f)], self._columns)
        if new is not None and c.window is not None:
            new = new.assign(__open=pd.Series([None] * len(new), dtype="object"))
        result = interval_step(self._aggs, old, from_us, new, watermark_ms, window=c.window)
        kept = None if result.rows is None else IntervalState(result.rows, result.from_us)
        rows = max(1, -(-len(result.starts) // PACK))
        out: dict[str, Any] = {
            name: key_column(value, rows) for name, value in zip(c.keys, key, strict=True)
        }
        for p, (values, ok) in zip(self._aggs, result.values, strict=True):
            out[p.name] = _pieces(_with_nulls(values, ok), rows)
        out["__ts"] = _pieces(result.starts, rows)
        out["__te"] = _pieces(result.ends, rows)
        out["__kept"] = np.full(rows, 0 if result.rows is None else len(result.rows), np.int64)
        discarded = np.zeros(rows, dtype=np.int64)
        discarded[0] = result.discarded
        out["__discarded"] = discarded
        return KeyStep([out], kept, result.timeout_ms)


def interval_aggregate(
    df: DataFrame,
    aggs: Column | Sequence[Column] | Mapping[str, str],
    *more_aggs: Column,
    partition_by: str | list[str] | tuple[str, ...] = (),
    metric_name: str = "interval_aggregate",
) -> DataFrame:
    """Aggregate a stream of validity intervals at every instant (SPEC 10, seed 001).

    Args:
        df: a streaming DataFrame from ``spark.readStream.format("rowtime")`` read with option
            ``interval.duration`` or ``interval.count`` (columns ``rowtime``, ``rowtime_end``,
            ``is_bound``; bound records included: this applies
            [`with_watermark`][pyspark_rowtime.watermark.with_watermark]).
        aggs: Spark aggregate columns, as ``groupBy().agg(...)`` takes them (one, a list, or
            one after another with ``*more_aggs``): ``F.count("*").alias("n")``,
            ``F.sum("v").alias("total")``, ``F.min("temp").alias("coldest")``; or a dict of
            output name to aggregate text, ``{"n": "count(*)", "total": "sum(v)",
            "coldest": "min(temp)"}``. Either way ``count``, ``sum``, ``avg``/``mean``,
            ``min``, ``max`` over any Spark expression of ``df``'s columns.
        *more_aggs: more aggregate columns, after the first.
        partition_by: column name(s): each value has its own stretches (``GROUP BY``).
            Without it the whole stream is one group.
        metric_name: the observed metric's name (see the module).

    Returns:
        A streaming DataFrame (output mode ``append``): the ``partition_by`` columns, the
        aggregates, then ``rowtime`` and ``rowtime_end`` (TIMESTAMP): one row per group and per
        maximal stretch ``[rowtime, rowtime_end)`` in which the set of valid rows of the group
        does not change and is not empty, with the aggregates over exactly those rows. Each
        is emitted once, in the first batch whose watermark reaches its end.

    Raises:
        OptionError: a bad argument (named, with what to do). Nothing has started.

    Examples:
        How many readings are valid, for each sensor, at every instant (each valid 5 s):

        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> path = tempfile.mkdtemp() + "/temps"
        >>> _ = rt.create_stream(path, "sensor STRING, temp DOUBLE")
        >>> temps = (spark.readStream.format("rowtime")
        ...     .option("interval.duration", "5 seconds").load(path))
        >>> valid = rt.interval_aggregate(temps, {"readings": "count(*)"}, partition_by="sensor")
        >>> valid.columns
        ['sensor', 'readings', 'rowtime', 'rowtime_end']
    """
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame as SparkDataFrame
    from pyspark.sql import functions as F
    from pyspark.sql.types import (
        ArrayType,
        BooleanType,
        ByteType,
        DoubleType,
        FloatType,
        IntegerType,
        LongType,
        ShortType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    if not isinstance(df, SparkDataFrame):
        raise OptionError(f"interval_aggregate: df={df!r} is not a Spark DataFrame")
    window = window_of(df)
    missing = [c for c in _RESERVED if c not in df.columns]
    if missing:
        raise OptionError(
            f"interval_aggregate: df lacks the column(s) {missing}: give a "
            "spark.readStream.format('rowtime') DataFrame read with option interval.duration "
            "or interval.count (which add rowtime_end), bound records included"
        )
    keys = [partition_by] if isinstance(partition_by, str) else list(partition_by)
    payload = [c for c in df.columns if c not in (*_RESERVED, "__win_g", "__win_on")]
    for k in keys:
        if not isinstance(k, str) or k not in payload:
            raise OptionError(
                f"interval_aggregate: partition_by={partition_by!r}: {k!r} is not a payload "
                f"column of df; give names among {payload}"
            )
    if window is not None and not set(keys) <= set(window.partition_by):
        raise OptionError(
            f"interval_aggregate: partition_by={keys} groups rows that the {window.kind} "
            f"window (partition_by={list(window.partition_by)}) puts in one group: a window's "
            "group must lie within one aggregate group; aggregate by the window's columns (or "
            "fewer), or window by these too"
        )
    parsed: list[tuple[str, str, Column | None, str]]
    if isinstance(aggs, Mapping) or (not more_aggs and not isinstance(aggs, (list, tuple))
                                     and not isinstance(aggs, SparkColumn)):  # fmt: skip
        if more_aggs:
            raise OptionError(
                "interval_aggregate: give the aggregates as columns or as one dict, not both"
            )
        parsed = [
            (name, kind, None if expr is None else F.expr(expr), repr(expr))
            for name, kind, expr in parse_aggs(aggs)  # type: ignore[arg-type]
        ]
    else:
        parsed = _column_aggs(df, aggs, more_aggs, keys)
    clash = [name for name, _, _, _ in parsed if name in keys]
    if clash:
        raise OptionError(
            f"interval_aggregate: aggs name(s) {clash} are also partition_by columns; rename"
        )
    integral = (ByteType, ShortType, IntegerType, LongType)
    numeric = (*integral, FloatType, DoubleType)
    # The arguments' types, from Spark's analyzer over an empty batch frame (no JVM access).
    empty = df.sparkSession.createDataFrame([], df.schema)
    plans: list[IntervalAgg] = []
    inputs = []
    columns_of: dict[tuple[str, str], tuple[str, str]] = {}
    stamp: set[str] = set()
    fields = []
    for i, (name, kind, arg, expr) in enumerate(parsed):
        if arg is None:
            plans.append(IntervalAgg(name, kind, None, None))
            fields.append(StructField(name, LongType(), False))
            continue
        try:
            dtype = empty.select(arg.alias("x")).schema["x"].dataType
        except Exception as e:
            raise OptionError(
                f"interval_aggregate: aggs[{name!r}]: {expr} is not an expression Spark "
                f"accepts over the columns {df.columns} ({str(e).splitlines()[0]})"
            ) from e
        value = arg
        if kind in ("sum", "avg") and not isinstance(dtype, numeric):
            raise OptionError(
                f"interval_aggregate: aggs[{name!r}]: {kind} needs numbers, but {expr} is "
                f"{dtype.simpleString()}; cast it to long or double"
            )
        if kind in ("min", "max") and not isinstance(
            dtype, (*numeric, StringType, TimestampType, BooleanType)
        ):
            raise OptionError(
                f"interval_aggregate: aggs[{name!r}]: {kind} takes numbers, strings, booleans "
                f"or timestamps, but {expr} is {dtype.simpleString()}; cast it"
            )
        if isinstance(dtype, TimestampType):
            value = F.unix_micros(value)
            if kind in ("min", "max"):
                stamp.add(name)  # a timestamp out: microseconds in the step's arrays
        # Aggregates of one expression take one input column (sum(v) and avg(v): one sum in
        # the step, one count of the non-null values).
        numeric_form = kind in ("count", "sum", "avg")
        same = ("num" if numeric_form else "ord", repr(value))
        if same in columns_of:
            col, present = columns_of[same]
        else:
            col, present = columns_of.setdefault(same, (f"__in{i}", f"__nn{i}"))
            if numeric_form:
                # Nulls as 0 plus a flag: pandas would turn integers with nulls to floats.
                inputs.append(F.coalesce(value, F.lit(0)).alias(col))
            else:
                inputs.append(value.alias(col))
            inputs.append(arg.isNotNull().alias(present))
        plans.append(IntervalAgg(name, kind, col, present, isinstance(dtype, integral)))
        if kind == "count":
            out_type: Any = LongType()
        elif kind == "sum":
            out_type = LongType() if isinstance(dtype, integral) else DoubleType()
        elif kind == "avg":
            out_type = DoubleType()
        else:
            out_type = dtype
        fields.append(StructField(name, out_type))

    group_cols = keys or ["__key"]
    rows = watermark_rowtime(df).select(
        *([F.col(k) for k in keys] or [F.lit(0).alias("__key")]),
        F.unix_micros("rowtime").alias("__t"),
        (F.lit(INFINITY_US) if window else F.unix_micros("rowtime_end")).alias("__e"),
        *inputs,
        *(
            [
                F.lit(None).cast("boolean").alias("__open"),
                F.col("__win_g").alias("__g"),
                F.col("__win_on").alias("__on", metadata={}),
            ]
            if window
            else []
        ),
        never_late(),  # every row reaches the step, which decides what is late
    )
    key_fields = [df.schema[k] for k in keys] or [StructField("__key", IntegerType(), False)]
    step_cols = [
        "__t",
        "__e",
        *dict.fromkeys(c for p in plans for c in (p.column, p.present) if c),
        *(["__open", "__g", "__on"] if window else []),
    ]
    # The step's rows are packed (``IntervalLogic``): an array per aggregate and per time, the
    # timestamps as microseconds, and the two metric columns.
    packed = [
        StructField(f.name, ArrayType(LongType() if f.name in stamp else f.dataType))
        for f in fields
    ]
    out_schema = StructType(
        [
            *key_fields,
            *packed,
            StructField("__ts", ArrayType(LongType())),
            StructField("__te", ArrayType(LongType())),
            StructField("__kept", LongType()),
            StructField("__discarded", LongType()),
        ]
    )

    config = IntervalConfig(
        tuple(plans),
        window,
        tuple(f.name for f in key_fields),
        tuple(step_cols),
    )
    plan = StatefulPlan(
        group_by=group_cols,
        output=out_schema,
        state_field="rows",
        metric_name=metric_name,
        metrics=[
            F.coalesce(F.max("__kept"), F.lit(0)).alias("max_rows_per_key"),
            F.coalesce(F.sum(F.size("__ts")), F.lit(0)).alias("stretches"),
            F.coalesce(F.sum("__discarded"), F.lit(0)).alias("discarded_rows"),
        ],
        results=F.size("__ts") > 0,
    )
    packed_names = [*(f.name for f in packed), "__ts", "__te"]
    stretches_out = run_on_state_store(rows, IntervalLogic(config), plan).select(
        *keys, F.inline(F.arrays_zip(*[F.col(n) for n in packed_names]))
    )

    def result(p: IntervalAgg) -> Column:
        if p.name in stamp:
            return F.timestamp_micros(p.name).alias(p.name)
        if p.kind == "count":  # never null, as Spark's own count
            return F.coalesce(F.col(p.name), F.lit(0)).alias(p.name)
        return F.col(p.name)

    return stretches_out.select(
        *keys,
        *[result(p) for p in plans],
        F.timestamp_micros("__ts").alias("rowtime"),
        F.timestamp_micros("__te").alias("rowtime_end"),
    )

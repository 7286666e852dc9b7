"""``overlap_join``: the Odysseus join of two streams of validity intervals (SPEC 10, seed 001).

Two rows join when their keys are equal and their validities overlap: ``[l.rowtime,
l.rowtime_end)`` and ``[r.rowtime, r.rowtime_end)`` share an instant. The result is valid in
the intersection ``[max(starts), min(ends))`` (:func:`pyspark_rowtime.bounds.intervals.combine`).
Both inputs come from the rowtime reader with option ``interval.duration`` or ``interval.count``
(the ``rowtime_end`` column).

How it is built, and why:

* **Spark's own stateful operator.** Each side is watermarked on its own
  (:func:`pyspark_rowtime.with_watermark`), the two are tagged and unioned, grouped by the join
  keys and handed to ``applyInPandasWithState``: each key keeps the intervals of both sides in
  Spark's state store, so a restart from the checkpoint goes on with exactly the state and the
  output of an uninterrupted run. Each side's payload travels as one struct column, which
  reaches pandas as exact Python values (a wide union with nulls would turn long columns into
  floats).
* **State bounded by both clocks.** Spark's watermark over the union is the minimum of the two
  sides' watermarks, ``W = min(clock_left, clock_right) - 1 ms``. Every later row of either
  side starts at or after its side's clock, above ``W``; so an interval with ``rowtime_end <=
  W`` can overlap nothing to come, and is dropped (at the key's next rows, or by an event-time
  timeout when the key goes quiet). Intervals valid until the end of stream stay until it
  comes. Spark counts only inputs that have sent something (a row or a bound record): start
  the join once both streams have.
* **Results in rowtime order.** A result is emitted as soon as its second row arrives; its
  ``rowtime`` (the later start) is that row's rowtime, at or above that side's clock, so no
  result comes below the watermark of the batch it is written in: the output suits the rowtime
  sink (its ``clock=watermark``).
* **The observed metric** ``metric_name`` (``query.lastProgress["observedMetrics"]``) has
  ``max_intervals_per_key``: the most intervals one key keeps after the batch (among the keys
  the batch touched), and ``results``: the rows emitted.

``how="left"`` (SPEC 10, left overlap join): a left row that overlaps no right row comes out
once, with nulls for the right side and its own whole interval, when it leaves the state: in
the first batch whose watermark reaches its end (both streams' clocks passed it, so every right
row to come starts after it, and half-open intervals that merely touch do not meet), never
before. A left row that met at least one right row gives no null-padded row. Which left rows
met a right row is kept beside the intervals (an optional fourth field of the stored side: the
state of an inner join, and of 0.1.0, reads as before). Such a row's ``rowtime`` is below the
clock of the batch that emits it: write a left join to a table or files, not to a rowtime sink.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..bounds.errors import OptionError
from ..bounds.intervals import INFINITY_US
from .step import load_operator_state

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["JoinStep", "Side", "join_step", "overlap_join", "overlap_pairs"]

_WATERMARK_KEY = "spark.watermarkDelayMs"
_NEVER_LATE = 2**63 - 1
_SYSTEM = ("rowtime", "rowtime_end", "is_bound")
#: Spark's names of the joins offered, and whether the join is a left outer one.
_HOW = {"inner": False, "left": True, "leftouter": True, "left_outer": True}
#: Spark's watermark (ms) once both inputs reached the end of stream (its clock minus 1 ms).
_END_MS = INFINITY_US // 1000 - 1


def overlap_pairs(
    left_start: np.ndarray, left_end: np.ndarray, right_start: np.ndarray, right_end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Indexes ``(i, j)`` of every overlapping pair: ``ls[i] < re[j] and rs[j] < le[i]``
    (half-open intervals; touching ends and empty intervals overlap nothing)."""
    ls = np.asarray(left_start, dtype=np.int64)[:, None]
    le = np.asarray(left_end, dtype=np.int64)[:, None]
    rs = np.asarray(right_start, dtype=np.int64)[None, :]
    re = np.asarray(right_end, dtype=np.int64)[None, :]
    # An empty interval (end == start: a row superseded at once) overlaps nothing, though an
    # interval around it would pass the two comparisons.
    i, j = np.nonzero((ls < re) & (rs < le) & (ls < le) & (rs < re))
    return i.astype(np.int64), j.astype(np.int64)


@dataclass
class Side:
    """One side's intervals for one key: starts and ends (us, half open), the rows, and
    whether each row has met a row of the other side (kept for the left side of a left join;
    None: no row has)."""

    start: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    end: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    rows: list[Any] = field(default_factory=list)
    matched: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def met(self) -> np.ndarray:
        if self.matched is None:
            return np.zeros(len(self.rows), dtype=bool)
        return np.asarray(self.matched, dtype=bool)

    def plus(self, other: Side) -> Side:
        return Side(
            np.concatenate([self.start, other.start]),
            np.concatenate([self.end, other.end]),
            self.rows + other.rows,
            np.concatenate([self.met(), other.met()]),
        )

    def keep(self, mask: np.ndarray) -> Side:
        idx = np.flatnonzero(mask)
        return Side(self.start[idx], self.end[idx], [self.rows[i] for i in idx], self.met()[idx])


@dataclass
class JoinStep:
    """What one call for one key decided: results ``(left row, right row, start, end)`` in
    ascending start, the sides to keep (None: nothing) and the next event-time timeout (ms)."""

    results: list[tuple[Any, Any, int, int]]
    state: tuple[Side, Side] | None
    timeout_ms: int | None

    @property
    def kept(self) -> int:
        return 0 if self.state is None else len(self.state[0]) + len(self.state[1])


def join_step(
    old: tuple[Side, Side], new: tuple[Side, Side], watermark_ms: int, *, left_outer: bool = False
) -> JoinStep:
    """Join the new intervals of a key with the kept ones and with each other, then drop what
    ended at or before the watermark ``W`` (``end <= W``: no later row can overlap it, see the
    module) and empty intervals (they overlap nothing).

    With ``left_outer``, a left row that met no right row comes out, with ``None`` for the right
    row and its own whole interval, when it is dropped: once ``W`` reaches its end, when both
    streams' clocks have passed it and every right row to come starts after it. A row whose
    interval is empty is valid at no instant and comes out in no form."""
    left, right = old[0].plus(new[0]), old[1].plus(new[1])
    i, j = overlap_pairs(left.start, left.end, right.start, right.end)
    fresh = (i >= len(old[0])) | (j >= len(old[1]))  # old x old pairs were emitted already
    i, j = i[fresh], j[fresh]
    start = np.maximum(left.start[i], right.start[j])
    end = np.minimum(left.end[i], right.end[j])
    met = left.met()
    met[i] = True
    left.matched = met
    w_us = watermark_ms * 1000
    if watermark_ms >= _END_MS:  # both streams ended: nothing is to come, not even forever
        w_us = INFINITY_US
    rows_l = [left.rows[int(a)] for a in i]
    rows_r: list[Any] = [right.rows[int(b)] for b in j]
    if left_outer:
        alone = np.flatnonzero((left.end <= w_us) & (left.start < left.end) & ~met)
        rows_l += [left.rows[int(a)] for a in alone]
        rows_r += [None] * len(alone)
        start = np.concatenate([start, left.start[alone]])
        end = np.concatenate([end, left.end[alone]])
    order = np.argsort(start, kind="stable")
    results = [(rows_l[int(k)], rows_r[int(k)], int(start[k]), int(end[k])) for k in order]
    left = left.keep((left.end > w_us) & (left.start < left.end))
    right = right.keep((right.end > w_us) & (right.start < right.end))
    if not len(left) and not len(right):
        return JoinStep(results, None, None)
    # Spark fires an event-time timeout T once the watermark is above T; an interval may go
    # once W * 1000 >= end, i.e. W > ceil(end / 1000) - 1.
    # Intervals valid until the end of stream go once both streams end (W = _END_MS).
    first_end = int(min(np.min(s.end) for s in (left, right) if len(s)))
    due = min(-(-first_end // 1000) - 1, _END_MS - 1)
    return JoinStep(results, (left, right), max(watermark_ms, due))


def _save(state: tuple[Side, Side], left_outer: bool = False) -> bytes:
    # Plain lists, not numpy arrays: the state is read back admitting value types only.
    plain: list[tuple[Any, ...]] = [(s.start.tolist(), s.end.tolist(), s.rows) for s in state]
    if left_outer:  # which left rows met a right row: a fourth, optional field
        plain[0] = (*plain[0], state[0].met().tolist())
    return pickle.dumps(plain, protocol=pickle.HIGHEST_PROTOCOL)


def _load(blob: bytes) -> tuple[Side, Side]:
    # A side is (starts, ends, rows) and, for a left join's left side, the matched flags; the
    # state of an inner join (and of 0.1.0) has three fields.
    sides = load_operator_state(blob, "an overlap_join key")

    def side(fields: tuple[Any, ...]) -> Side:
        starts, ends, rows = fields[:3]
        met = np.asarray(fields[3], dtype=bool) if len(fields) > 3 else None
        return Side(np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64), rows, met)

    return side(sides[0]), side(sides[1])


def _names(left: list[str], right: list[str], keys: list[str]) -> tuple[list[str], list[str]]:
    """Output names of each side's non-key columns: a name only one side has stays; a name
    both have becomes ``left_<name>`` and ``right_<name>``."""
    both = set(left) & set(right)
    out_l = [f"left_{c}" if c in both else c for c in left]
    out_r = [f"right_{c}" if c in both else c for c in right]
    taken = [*keys, *out_l, *out_r, "rowtime", "rowtime_end"]
    dup = sorted({c for c in taken if taken.count(c) > 1})
    if dup:
        raise OptionError(
            f"overlap_join: the result would have the column(s) {dup} twice (a column both "
            "sides have becomes left_<name> and right_<name>); rename columns before the join"
        )
    return out_l, out_r


def overlap_join(
    left: DataFrame,
    right: DataFrame,
    on: str | Sequence[str],
    how: str = "inner",
    *,
    metric_name: str = "overlap_join",
) -> DataFrame:
    """Join two rowtime streams where their keys are equal and their validities overlap.

    Args:
        left, right: streaming DataFrames from ``spark.readStream.format("rowtime")`` with
            option ``interval.duration`` or ``interval.count`` (columns ``rowtime``,
            ``rowtime_end``, ``is_bound``; bound records included: this applies
            :func:`pyspark_rowtime.with_watermark` to each).
        on: the key column name(s), present in both with the same type. Rows with a null key
            join nothing (as in SQL).
        how: ``"inner"`` or ``"left"`` (``"left_outer"``, ``"leftouter"``): see the module.
        metric_name: the name of the observed metric (see the module).

    Returns:
        A streaming DataFrame (output mode ``append``): the keys once, then ``left``'s other
        payload columns, then ``right``'s (a name both sides have becomes ``left_<name>`` and
        ``right_<name>``), then ``rowtime`` and ``rowtime_end``: the half-open intersection
        ``[max(l.rowtime, r.rowtime), min(l.rowtime_end, r.rowtime_end))`` of the two rows'
        validities, never empty. Each overlapping pair is emitted once, in the batch where its
        second row arrives. With ``how="left"``, each left row that overlaps no right row is
        emitted once more with nulls for ``right``'s columns and its own interval, in the first
        batch whose watermark reaches its end.

    Raises:
        OptionError: a bad argument (named, with what to do). Nothing has started.
    """
    import pandas as pd
    from pyspark.sql import DataFrame as SparkDataFrame
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout
    from pyspark.sql.types import (
        BinaryType,
        BooleanType,
        LongType,
        StructField,
        StructType,
        TimestampType,
    )

    from ..watermark import watermark_rowtime

    if not isinstance(how, str) or how.lower() not in _HOW:
        raise OptionError(
            f"overlap_join: how={how!r} is not supported: give 'inner' or 'left' (also "
            "'left_outer', 'leftouter', as Spark spells it); a right or full outer join is "
            "the left join with the sides swapped, or not offered"
        )
    left_outer = _HOW[how.lower()]
    for name, df in (("left", left), ("right", right)):
        if not isinstance(df, SparkDataFrame):
            raise OptionError(f"overlap_join: {name}={df!r} is not a Spark DataFrame")
        missing = [c for c in _SYSTEM if c not in df.columns]
        if missing:
            raise OptionError(
                f"overlap_join: {name} lacks the column(s) {missing}: give a "
                "spark.readStream.format('rowtime') DataFrame read with option "
                "interval.duration or interval.count (which add rowtime_end), bound records "
                "included"
            )
    policy = left.sparkSession.conf.get("spark.sql.streaming.multipleWatermarkPolicy", "min")
    if str(policy).lower() != "min":
        raise OptionError(
            f"overlap_join: spark.sql.streaming.multipleWatermarkPolicy={policy}: the join "
            "drops intervals that ended before Spark's watermark, which must then be the lower "
            "of the two streams' (policy min, Spark's default); with max it would drop intervals "
            "the slower stream can still overlap. Set it to min"
        )
    keys = [on] if isinstance(on, str) else list(on)
    if not keys or len(set(keys)) != len(keys):
        raise OptionError(f"overlap_join: on={on!r} must name one or more distinct key columns")
    for k in keys:
        for name, df in (("left", left), ("right", right)):
            if not isinstance(k, str) or k not in df.columns or k in _SYSTEM:
                raise OptionError(
                    f"overlap_join: on={on!r}: {k!r} is not a payload column of {name}; give "
                    f"names among {[c for c in df.columns if c not in _SYSTEM]}"
                )
        if left.schema[k].dataType != right.schema[k].dataType:
            raise OptionError(
                f"overlap_join: on={on!r}: key {k!r} is {left.schema[k].dataType.simpleString()}"
                f" in left but {right.schema[k].dataType.simpleString()} in right; cast one "
                "side's column before the join"
            )
    lcols = [c for c in left.columns if c not in _SYSTEM and c not in keys]
    rcols = [c for c in right.columns if c not in _SYSTEM and c not in keys]
    out_l, out_r = _names(lcols, rcols, keys)
    # A side with only key columns still needs a struct (Spark has no empty one) whose
    # presence tells its rows apart: one placeholder field, never shown.
    lfields = [left.schema[c] for c in lcols] or [StructField("__row", BooleanType())]
    rfields = [right.schema[c] for c in rcols] or [StructField("__row", BooleanType())]
    ltype, rtype = StructType(lfields), StructType(rfields)

    def tagged(df: DataFrame, side: int) -> DataFrame:
        cols = lcols if side == 0 else rcols
        own = F.struct(*[F.col(c) for c in cols]) if cols else F.struct(F.lit(True).alias("__row"))
        other = F.lit(None).cast(rtype if side == 0 else ltype)
        return watermark_rowtime(df).select(
            *[F.col(k) for k in keys],
            F.lit(side).alias("__side"),
            F.unix_micros("rowtime").alias("__t"),
            F.unix_micros("rowtime_end").alias("__e"),
            (own if side == 0 else other).alias("__l"),
            (other if side == 0 else own).alias("__r"),
            # Spark wants a watermarked input column for an event-time timeout, and drops rows
            # whose marked column is at or below the watermark: this one never is.
            F.lit(_NEVER_LATE).cast("long").alias("__never_late", metadata={_WATERMARK_KEY: 1}),
        )

    rows = tagged(left, 0).unionByName(tagged(right, 1))
    out_schema = StructType(
        [
            *[left.schema[k] for k in keys],
            StructField("__l", ltype),
            StructField("__r", rtype),
            StructField("rowtime", TimestampType()),
            StructField("rowtime_end", TimestampType()),
            StructField("__kept", LongType()),
        ]
    )
    state_schema = StructType([StructField("sides", BinaryType())])

    def side_of(frame: pd.DataFrame, side: int) -> Side:
        part = frame[frame["__side"] == side]
        column = "__l" if side == 0 else "__r"
        return Side(
            part["__t"].to_numpy(dtype=np.int64),
            part["__e"].to_numpy(dtype=np.int64),
            list(part[column]),
        )

    def step(key: tuple, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        old = _load(state.get[0]) if state.exists else (Side(), Side())
        parts = [f for f in frames if len(f)]
        new = (Side(), Side())
        if parts:
            frame = pd.concat(parts, ignore_index=True)
            if not any(v is None for v in key):
                new = (side_of(frame, 0), side_of(frame, 1))
            elif left_outer:  # a null key joins nothing: its left rows come out alone
                new = (side_of(frame, 0), Side())
        result = join_step(old, new, state.getCurrentWatermarkMs(), left_outer=left_outer)
        if result.state is None:
            if state.exists:
                state.remove()
        else:
            state.update((_save(result.state, left_outer),))
            assert result.timeout_ms is not None
            state.setTimeoutTimestamp(result.timeout_ms)
        n = len(result.results)
        out: dict[str, Any] = {}
        for name, value in zip(keys, key, strict=True):
            out[name] = [value] * (n + 1)
        # One extra row carries the metric (dropped after the observation).
        out["__l"] = [r[0] for r in result.results] + [None]
        out["__r"] = [r[1] for r in result.results] + [None]
        starts = pd.Series([r[2] for r in result.results] + [None], dtype="Int64")
        ends = pd.Series([r[3] for r in result.results] + [None], dtype="Int64")
        out["rowtime"] = pd.to_datetime(starts, unit="us", utc=True, cache=False)
        out["rowtime_end"] = pd.to_datetime(ends, unit="us", utc=True, cache=False)
        out["__kept"] = pd.Series([None] * n + [result.kept], dtype="Int64")
        yield pd.DataFrame(out)

    stateful = rows.groupBy(*keys).applyInPandasWithState(
        step,
        outputStructType=out_schema,
        stateStructType=state_schema,
        outputMode="append",
        timeoutConf=GroupStateTimeout.EventTimeTimeout,
    )
    observed = stateful.observe(
        metric_name,
        F.coalesce(F.max("__kept"), F.lit(0)).alias("max_intervals_per_key"),
        F.count("rowtime").alias("results"),
    )
    return observed.where(F.col("__kept").isNull()).select(
        *[F.col(k) for k in keys],
        *[F.col("__l").getField(c).alias(o) for c, o in zip(lcols, out_l, strict=True)],
        *[F.col("__r").getField(c).alias(o) for c, o in zip(rcols, out_r, strict=True)],
        "rowtime",
        "rowtime_end",
    )

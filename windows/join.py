"""``overlap_join``: the Odysseus join of two streams of validity intervals (SPEC 10, seed 001).

Two rows join when their keys are equal and their validities overlap: ``[l.rowtime,
l.rowtime_end)`` and ``[r.rowtime, r.rowtime_end)`` share an instant. The result is valid in
the intersection ``[max(starts), min(ends))`` (``pyspark_rowtime.bounds.intervals.combine``).
Both inputs come from the rowtime reader with option ``interval.duration`` or ``interval.count``
(the ``rowtime_end`` column).

How it is built, and why:

* **Spark's own stateful operator.** Each side is watermarked on its own
  (``pyspark_rowtime.with_watermark``), the two are tagged and unioned, grouped by the join
  keys and handed to ``applyInPandasWithState``: each key keeps the intervals of both sides in
  Spark's state store, so a restart from the checkpoint goes on with exactly the state and the
  output of an uninterrupted run (a ``JoinConfig``, its ``JoinLogic`` and the
  versioned ``JoinState``, run by the operators' shared piece,
  ``stateful.run_on_state_store``). Each side's payload travels as one struct column, which
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
met a right row is kept beside the intervals (a fourth field of the left side in a left join's
stored state, ``JoinState``; an inner join, and 0.1.0, store three). Such a row's
``rowtime`` is below the clock of the batch that emits it: write a left join to a table or
files, not to a rowtime sink.

**Windows whose ends depend on later rows** (``pyspark_rowtime.rows_window``,
``pyspark_rowtime.while_window``) on either side: their rows come with no end yet. A row
waits in the key's state (``Pending``) until its end is known (``settle``: the row
that ends it arrived, or the end of stream), and only then joins, as a new row of its side.
Each window group must lie within one join key (the window's ``partition_by`` holds every
join key), so the rows that end a row come to the same key. A waiting row starts below the
watermark and may overlap anything of the other side that ends after its start: the other
side keeps those intervals (and a left join holds back their null-padded rows) until it is
settled, so results are the relational join over the settled ends. Results then come once
both rows' ends are known, maybe below the clock: write such a join to a table or files. Ties
in a group's rowtimes go by the rows' values (as text), which a replay repeats. So a window
group that goes quiet with a row open holds, for its key, the other side's intervals that end
after that row's start, until its next row or the end of stream (``max_intervals_per_key``
counts them, and the waiting rows).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..bounds.errors import OptionError
from ..bounds.intervals import INFINITY_US
from ..watermark import watermark_rowtime
from .define import WindowDef, assign_ends, window_of
from .stateful import (
    KeyLogic,
    KeyStep,
    StatefulPlan,
    key_column,
    never_late,
    rows_column,
    run_on_state_store,
)
from .step import StateFormat

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "JoinConfig",
    "JoinLogic",
    "JoinState",
    "JoinStep",
    "Pending",
    "Side",
    "join_format",
    "join_step",
    "overlap_join",
    "overlap_pairs",
    "settle",
    "window_join_step",
]

_SYSTEM = ("rowtime", "rowtime_end", "is_bound")
#: The columns rows_window and while_window add besides rowtime_end (never payload).
_WINDOW = ("__win_g", "__win_on")
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
        if mask.all():
            return Side(self.start, self.end, self.rows, self.met())
        idx = np.flatnonzero(mask)
        rows = [self.rows[i] for i in idx.tolist()]
        return Side(self.start[idx], self.end[idx], rows, self.met()[idx])


@dataclass
class JoinStep:
    """What one call for one key decided: the results in ascending start, as columns (each
    result's left row, right row (None: a left row alone), start and end in us), the sides to
    keep (None: nothing) and the next event-time timeout (ms)."""

    left_rows: list[Any]
    right_rows: list[Any]
    starts: np.ndarray
    ends: np.ndarray
    state: tuple[Side, Side] | None
    timeout_ms: int | None

    @property
    def results(self) -> list[tuple[Any, Any, int, int]]:
        """The results as ``(left row, right row, start_us, end_us)``."""
        return list(
            zip(
                self.left_rows,
                self.right_rows,
                self.starts.tolist(),
                self.ends.tolist(),
                strict=True,
            )
        )

    @property
    def kept(self) -> int:
        return 0 if self.state is None else len(self.state[0]) + len(self.state[1])


def join_step(
    old: tuple[Side, Side],
    new: tuple[Side, Side],
    watermark_ms: int,
    *,
    left_outer: bool = False,
    holds: tuple[int, int] = (INFINITY_US, INFINITY_US),
) -> JoinStep:
    """Join the new intervals of a key with the kept ones and with each other, then drop what
    ended at or before the watermark ``W`` (``end <= W``: no later row can overlap it, see the
    module) and empty intervals (they overlap nothing).

    With ``left_outer``, a left row that met no right row comes out, with ``None`` for the right
    row and its own whole interval, when it is dropped: once ``W`` reaches its end, when both
    streams' clocks have passed it and every right row to come starts after it. A row whose
    interval is empty is valid at no instant and comes out in no form.

    ``holds`` (us): per side, the earliest start of its rows still waiting for their end
    (``Pending``; infinity: none). The other side keeps every interval that ends after it
    (such a row may still meet them), whatever the watermark."""
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
    rows_l = [left.rows[a] for a in i.tolist()]
    rows_r: list[Any] = [right.rows[b] for b in j.tolist()]
    # What the other side's waiting rows may still meet stays, whatever the watermark.
    below_l, below_r = min(w_us, holds[1]), min(w_us, holds[0])
    if left_outer:
        alone = np.flatnonzero((left.end <= below_l) & (left.start < left.end) & ~met)
        rows_l += [left.rows[a] for a in alone.tolist()]
        rows_r += [None] * len(alone)
        start = np.concatenate([start, left.start[alone]])
        end = np.concatenate([end, left.end[alone]])
    order = np.argsort(start, kind="stable")
    out_l, out_r = [rows_l[k] for k in order.tolist()], [rows_r[k] for k in order.tolist()]
    done = partial(JoinStep, out_l, out_r, start[order], end[order])
    left = left.keep((left.end > below_l) & (left.start < left.end))
    right = right.keep((right.end > below_r) & (right.start < right.end))
    waiting = min(holds) < INFINITY_US
    if not len(left) and not len(right):
        return done(None, max(watermark_ms, _END_MS - 1) if waiting else None)
    # Spark fires an event-time timeout T once the watermark is above T; an interval may go
    # once W * 1000 >= end, i.e. W > ceil(end / 1000) - 1.
    # Intervals valid until the end of stream go once both streams end (W = _END_MS); so do
    # waiting rows without the row that ends them. An interval that a waiting row of the other
    # side may meet goes no earlier than that row is settled, at a call for the key's rows.
    ends = [s.end[s.end <= h] for s, h in ((left, holds[1]), (right, holds[0]))]
    due = _END_MS - 1
    if any(len(e) for e in ends):
        first_end = int(min(np.min(e) for e in ends if len(e)))
        due = min(-(-first_end // 1000) - 1, due)
    return done((left, right), max(watermark_ms, due))


@dataclass
class Pending:
    """One side's rows of a window (``define``) whose end is not known yet, in the order
    the window takes them: starts (us), window groups, whether the condition held, rows."""

    start: list[int] = field(default_factory=list)
    group: list[Any] = field(default_factory=list)
    on: list[bool] = field(default_factory=list)
    rows: list[Any] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)

    def hold(self) -> int:
        """The earliest start of the waiting rows (infinity: none wait)."""
        return min(self.start) if self.start else INFINITY_US


def settle(window: WindowDef, old: Pending, new: Pending, ended: bool) -> tuple[Side, Pending]:
    """Set the ends of ``old``'s and ``new``'s rows that are now known (``ended``: the streams
    ended, every end is known, infinity for a row nothing ended): returns those rows as a
    ``Side`` of new intervals, and the rows still waiting."""
    if not len(old) and not len(new):
        return Side(), Pending()
    rows = old.rows + new.rows
    frame = pd.DataFrame(
        {
            "__t": np.asarray(old.start + new.start, dtype=np.int64),
            "__e": np.full(len(rows), INFINITY_US, dtype=np.int64),
            "__open": pd.Series([True] * len(old) + [None] * len(new), dtype="object"),
            "__g": old.group + new.group,
            "__on": np.asarray(old.on + new.on, dtype=bool),
            # Ties in a group's rowtimes: by the row's values, then as they came.
            "__v": [repr(r) for r in rows],
            "__x": np.arange(len(rows), dtype=np.int64),
        }
    )
    out = assign_ends(window, frame)
    waits = out["__open"].to_numpy(dtype=bool) & (not ended)
    x = out["__x"].to_numpy(dtype=np.int64)
    done, still = out[~waits], out[waits]
    side = Side(
        done["__t"].to_numpy(dtype=np.int64),
        done["__e"].to_numpy(dtype=np.int64),
        [rows[int(i)] for i in x[~waits]],
    )
    return side, Pending(
        still["__t"].tolist(),
        still["__g"].tolist(),
        still["__on"].tolist(),
        [rows[int(i)] for i in x[waits]],
    )


def window_join_step(
    old: tuple[Side, Side, Pending, Pending],
    new: tuple[Side | Pending, Side | Pending],
    watermark_ms: int,
    *,
    windows: tuple[WindowDef | None, WindowDef | None] = (None, None),
    left_outer: bool = False,
) -> tuple[JoinStep, tuple[Pending, Pending]]:
    """``join_step`` for sides that may be windows whose ends depend on later rows: such a
    side's new rows come as ``Pending``; those whose end is now known join (see the
    module). Returns the step and the rows still waiting (the step's state, when not None,
    is what to keep beside them; a step with rows waiting always has a timeout)."""
    ended = watermark_ms >= _END_MS
    sides: list[Side] = []
    waiting: list[Pending] = []
    before = (old[2], old[3])
    for i, window in enumerate(windows):
        fresh = new[i]
        if window is None:
            assert isinstance(fresh, Side)
            sides.append(fresh)
            waiting.append(Pending())
            continue
        assert isinstance(fresh, Pending)
        done, still = settle(window, before[i], fresh, ended)
        sides.append(done)
        waiting.append(still)
    holds = (waiting[0].hold(), waiting[1].hold())
    step = join_step(
        (old[0], old[1]), (sides[0], sides[1]), watermark_ms, left_outer=left_outer, holds=holds
    )
    return step, (waiting[0], waiting[1])


@dataclass(frozen=True)
class JoinState:
    """The state of one key (format version 1, ``join_format``): each side's intervals
    and, for a window side, its rows still waiting for their end."""

    left: Side = field(default_factory=Side)
    right: Side = field(default_factory=Side)
    waiting: tuple[Pending, Pending] = field(default_factory=lambda: (Pending(), Pending()))


def _write_join(state: JoinState, left_outer: bool) -> list[Any]:
    # Plain lists, not numpy arrays: the state is read back admitting value types only. A side
    # is (starts, ends, rows), as 0.1.0 stored it.
    plain: list[Any] = [
        (s.start.tolist(), s.end.tolist(), s.rows) for s in (state.left, state.right)
    ]
    if left_outer:  # which left rows met a right row: a fourth field of the left side
        plain[0] = (*plain[0], state.left.met().tolist())
    if len(state.waiting[0]) or len(state.waiting[1]):
        # Rows of a window still waiting for their end: a third element.
        plain.append([(p.start, p.group, p.on, p.rows) for p in state.waiting])
    return plain


def _read_join_v1(sides: list[Any]) -> JoinState:
    # A side is (starts, ends, rows) and, for a left join's left side, the matched flags; the
    # state of an inner join (and of 0.1.0) has three fields. A third element, when there,
    # holds each side's rows waiting for their end. 0.1.0 and 0.2.0 stored this list bare.
    def side(fields: tuple[Any, ...]) -> Side:
        starts, ends, rows = fields[:3]
        met = np.asarray(fields[3], dtype=bool) if len(fields) > 3 else None
        return Side(np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64), rows, met)

    waiting = [Pending(*map(list, p)) for p in sides[2]] if len(sides) > 2 else [Pending()] * 2
    return JoinState(side(sides[0]), side(sides[1]), (waiting[0], waiting[1]))


_FORMATS = {
    outer: StateFormat(
        "an overlap_join key", 1, partial(_write_join, left_outer=outer), {1: _read_join_v1}
    )
    for outer in (False, True)
}


def join_format(left_outer: bool) -> StateFormat[JoinState]:
    """How ``overlap_join`` stores a key (``step.StateFormat``): a left join keeps which
    left rows met a right row, an inner join has no need to."""
    return _FORMATS[bool(left_outer)]


def _save(
    state: tuple[Side, Side] | None,
    left_outer: bool = False,
    pending: tuple[Pending, Pending] | None = None,
) -> bytes:
    left, right = state or (Side(), Side())
    return join_format(left_outer).dumps(JoinState(left, right, pending or (Pending(), Pending())))


def _load_state(blob: bytes) -> tuple[Side, Side, Pending, Pending]:
    state = join_format(False).loads(blob)  # one reader for both: the stored fields tell
    return state.left, state.right, state.waiting[0], state.waiting[1]


def _load(blob: bytes) -> tuple[Side, Side]:
    left, right, _, _ = _load_state(blob)
    return left, right


@dataclass(frozen=True)
class JoinConfig:
    """``overlap_join``'s checked parameters: the key columns, whether the join is a left outer
    one, and each side's window whose ends depend on later rows (None: the rows come with
    their ends)."""

    keys: tuple[str, ...]
    left_outer: bool
    windows: tuple[WindowDef | None, WindowDef | None]


class JoinLogic(KeyLogic[JoinState]):
    """One key's join: ``window_join_step`` over the key's kept and new rows of both sides,
    then the results as rows, and one more row carrying the metric (``__kept`` not null)."""

    def __init__(self, config: JoinConfig) -> None:
        self.config = config
        self.format = join_format(config.left_outer)

    def _nothing(self, side: int) -> Side | Pending:
        return Side() if self.config.windows[side] is None else Pending()

    def _side_of(self, frame: pd.DataFrame, payload: np.ndarray, side: int) -> Side | Pending:
        # A row's side is which struct it carries: its own is never null, the other always.
        mine = np.flatnonzero(pd.isna(payload) == (side == 1))
        column = "__l" if side == 0 else "__r"
        values = frame[column].to_numpy(dtype=object)
        rows = [values[i] for i in mine.tolist()] if len(mine) < len(values) else list(values)
        starts = frame["__t"].to_numpy(dtype=np.int64)[mine]
        if self.config.windows[side] is not None:
            groups = frame["__g"].to_numpy()[mine].tolist()
            on = frame["__on"].to_numpy()[mine].tolist()
            return Pending(starts.tolist(), groups, on, rows)
        return Side(starts, frame["__e"].to_numpy(dtype=np.int64)[mine], rows)

    def step(
        self, key: tuple, frames: Iterator[pd.DataFrame], state: JoinState | None, watermark_ms: int
    ) -> KeyStep[JoinState]:
        c = self.config
        old = (Side(), Side(), Pending(), Pending())
        if state is not None:
            old = (state.left, state.right, state.waiting[0], state.waiting[1])
        parts = [f for f in frames if len(f)]
        new = (self._nothing(0), self._nothing(1))
        if parts:
            frame = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
            lefts = frame["__l"].to_numpy(dtype=object)
            if not any(v is None for v in key):
                new = (self._side_of(frame, lefts, 0), self._side_of(frame, lefts, 1))
            elif c.left_outer:  # a null key joins nothing: its left rows come out alone
                new = (self._side_of(frame, lefts, 0), self._nothing(1))
        result, waiting = window_join_step(
            old, new, watermark_ms, windows=c.windows, left_outer=c.left_outer
        )
        kept = None
        if result.state is not None or len(waiting[0]) or len(waiting[1]):
            left, right = result.state or (Side(), Side())
            kept = JoinState(left, right, waiting)
            assert result.timeout_ms is not None
        n = len(result.starts)
        # Plain columns (the times as microseconds, which Spark turns into timestamps): what
        # Spark's worker converts fastest, per key and per call. One extra row carries the
        # metric (``__kept`` >= 0; a result row has -1) and is dropped after the observation.
        count = result.kept + len(waiting[0]) + len(waiting[1])
        kept_col = np.full(n + 1, -1, dtype=np.int64)
        kept_col[n] = count
        out: dict[str, Any] = {
            name: key_column(value, n + 1) for name, value in zip(c.keys, key, strict=True)
        }
        out["__l"] = rows_column(result.left_rows, n + 1)
        out["__r"] = rows_column(result.right_rows, n + 1)
        out["__ts"] = np.append(result.starts, 0)
        out["__te"] = np.append(result.ends, 0)
        out["__kept"] = kept_col
        return KeyStep([out], kept, result.timeout_ms)


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
        left: a streaming DataFrame from ``spark.readStream.format("rowtime")`` with option
            ``interval.duration`` or ``interval.count`` (columns ``rowtime``, ``rowtime_end``,
            ``is_bound``; bound records included: this applies
            [`with_watermark`][pyspark_rowtime.watermark.with_watermark] to each), or
            such a stream (without ``interval.*`` options) through
            [`rows_window`][pyspark_rowtime.windows.define.rows_window] or
            [`while_window`][pyspark_rowtime.windows.define.while_window] whose
            ``partition_by`` holds every key of ``on``.
        right: the other side, as ``left``.
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
        batch whose watermark reaches its end. With a window side, a pair comes in the batch
        where the later of the two rows' ends becomes known.

    Raises:
        OptionError: a bad argument (named, with what to do). Nothing has started.

    Examples:
        Each speed with the speed limit in force while it was valid (each valid until the
        next of its stream):

        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> path = tempfile.mkdtemp()
        >>> _ = rt.create_stream(path + "/speeds", "sensor STRING, speed DOUBLE")
        >>> _ = rt.create_stream(path + "/limits", "sensor STRING, speed_limit DOUBLE")
        >>> reader = spark.readStream.format("rowtime").option("interval.count", 1)
        >>> both = rt.overlap_join(
        ...     reader.load(path + "/speeds"), reader.load(path + "/limits"), on="sensor")
        >>> both.columns
        ['sensor', 'speed', 'speed_limit', 'rowtime', 'rowtime_end']
    """
    from pyspark.sql import DataFrame as SparkDataFrame
    from pyspark.sql import functions as F
    from pyspark.sql.types import (
        BooleanType,
        LongType,
        StructField,
        StructType,
    )

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
    windows = (window_of(left), window_of(right))
    for name, window in zip(("left", "right"), windows, strict=True):
        if window is not None and not set(keys) <= set(window.partition_by):
            raise OptionError(
                f"overlap_join: {name} is a {window.kind} window with partition_by="
                f"{list(window.partition_by)}, whose groups span several keys of on={keys}: "
                "a row's end comes from later rows of its window group, which the join meets "
                "only within one key. Window by the join keys too (partition_by="
                f"{sorted(set(window.partition_by) | set(keys))}), or join on the window's "
                "columns"
            )
    for k in keys:
        for name, df in (("left", left), ("right", right)):
            if not isinstance(k, str) or k not in df.columns or k in (*_SYSTEM, *_WINDOW):
                raise OptionError(
                    f"overlap_join: on={on!r}: {k!r} is not a payload column of {name}; give "
                    f"names among {[c for c in df.columns if c not in (*_SYSTEM, *_WINDOW)]}"
                )
        if left.schema[k].dataType != right.schema[k].dataType:
            raise OptionError(
                f"overlap_join: on={on!r}: key {k!r} is {left.schema[k].dataType.simpleString()}"
                f" in left but {right.schema[k].dataType.simpleString()} in right; cast one "
                "side's column before the join"
            )
    lcols = [c for c in left.columns if c not in (*_SYSTEM, *_WINDOW, *keys)]
    rcols = [c for c in right.columns if c not in (*_SYSTEM, *_WINDOW, *keys)]
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
        windowed = windows[side] is not None
        # Spark's worker converts each column of each key's rows on its own, so the step gets
        # only what it reads: a row's side is which struct it carries (its own is never null),
        # and a window's columns come only when a side is a window.
        window_cols = []
        if any(w is not None for w in windows):
            window_cols = [
                (F.col("__win_g") if windowed else F.lit(None).cast("string")).alias("__g"),
                (F.col("__win_on") if windowed else F.lit(None).cast("boolean")).alias(
                    "__on", metadata={}
                ),
            ]
        return watermark_rowtime(df).select(
            *[F.col(k) for k in keys],
            F.unix_micros("rowtime").alias("__t"),
            # A window's row has no end yet (settle sets it): infinity until then.
            (F.lit(INFINITY_US) if windowed else F.unix_micros("rowtime_end")).alias("__e"),
            (own if side == 0 else other).alias("__l"),
            (other if side == 0 else own).alias("__r"),
            *window_cols,
            never_late(),  # every row reaches the step, which decides what is late
        )

    rows = tagged(left, 0).unionByName(tagged(right, 1))
    out_schema = StructType(
        [
            *[left.schema[k] for k in keys],
            StructField("__l", ltype),
            StructField("__r", rtype),
            StructField("__ts", LongType()),
            StructField("__te", LongType()),
            StructField("__kept", LongType()),
        ]
    )
    plan = StatefulPlan(
        group_by=keys,
        output=out_schema,
        state_field="sides",
        metric_name=metric_name,
        metrics=[
            F.coalesce(F.max("__kept"), F.lit(0)).alias("max_intervals_per_key"),
            F.count(F.when(F.col("__kept") < 0, 1)).alias("results"),
        ],
        results=F.col("__kept") < 0,
    )
    logic = JoinLogic(JoinConfig(tuple(keys), left_outer, windows))
    return run_on_state_store(rows, logic, plan).select(
        *[F.col(k) for k in keys],
        *[F.col("__l").getField(c).alias(o) for c, o in zip(lcols, out_l, strict=True)],
        *[F.col("__r").getField(c).alias(o) for c, o in zip(rcols, out_r, strict=True)],
        F.timestamp_micros("__ts").alias("rowtime"),
        F.timestamp_micros("__te").alias("rowtime_end"),
    )

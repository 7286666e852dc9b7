"""The per-key step of ``time_interval_aggregate``: panes, trigger, re-trigger and discardAge.

Pure Python (numpy and pandas, no Spark), so it is tested without Spark. It runs in two halves:
``preaggregate`` turns raw rows (any keys, any pieces: Spark calls it per partition, before
the shuffle) into one partial per (key, pane); ``merge_panes`` is called once per key and
micro-batch (the operator's logic on ``stateful.run_on_state_store``) with the key's new
partials, its state (``PanesState``, stored by ``PANES_FORMAT``) and the batch's
watermark, and answers with the panes to emit, the new state and the timer to set.
``merge_step`` is the same over the stored bytes; ``run_step`` is both halves over one
key's raw rows.

Panes are assigned by ``bounds.panes.assign_panes_array``; the trigger rules are those of
``bounds.panes.TimeIntervalWindow`` (SPEC section 10), restated for Spark's batches:

* Spark's watermark ``W`` is whole milliseconds. A pane ``[start, end)`` (microseconds)
  triggers in the first batch whose ``W * 1000 >= end``.
* A row for a pane that has already triggered (or whose end the watermark had already reached
  when the row came) is late: the pane triggers again, corrected, in the first later batch whose
  watermark is higher than the one the row came with ("at the next watermark update").
* A pane is closed, and its state dropped, once ``W * 1000 > end + discardAge``; a row for a
  closed pane (and a row in no pane: a gap) is discarded and counted, once per closed pane.

The state of a pane is a list of mergeable partial aggregates (``AggPlan``), never its rows:
a pane costs the same few values however many rows it holds.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import pandas as pd

from ..bounds.errors import CorruptLogError
from ..bounds.panes import TimeIntervalSpec, assign_panes_array
from ..bounds.versions import newer_format

__all__ = [
    "MERGEABLE",
    "PANES_FORMAT",
    "PARTIAL_COLUMNS",
    "AggPlan",
    "PaneState",
    "PanesState",
    "PanesStep",
    "StateFormat",
    "StepResult",
    "load_operator_state",
    "load_state",
    "load_values",
    "merge_panes",
    "merge_step",
    "pane_partials",
    "preaggregate",
    "run_step",
]

#: Spark's aggregate functions (Catalyst class names) whose partial results merge exactly, and
#: so can be kept per pane across micro-batches, mapped to the step's name for them.
MERGEABLE = {
    "Count": "count",
    "Sum": "sum",
    "Min": "min",
    "Max": "max",
    "Average": "avg",
    "MaxBy": "max_by",
    "MinBy": "min_by",
}


@dataclass(frozen=True)
class AggPlan:
    """One aggregate: ``kind`` (a value of ``MERGEABLE``) over the input columns ``inputs``
    of the step's frame (for ``count``: one 0/1 column, 1 where Spark's ``count`` counts the
    row, or none for ``count(*)``; for ``max_by``/``min_by``: the value, then the ordering)."""

    kind: str
    inputs: tuple[str, ...]


@dataclass
class PaneState:
    """A pane held for one key: its end (us), whether it triggered, the watermark (ms) a late
    row came with (it triggers again once the watermark is higher), and one partial per
    aggregate."""

    end_us: int
    triggered: bool
    pending_ms: int | None
    partials: list[Any]


@dataclass(frozen=True)
class StepResult:
    """What one call emits: ``panes`` as ``(start_us, end_us, [final value per aggregate])`` in
    ascending ``(end, start)``; ``discarded`` rows (counted once per closed pane); the new
    ``state`` (None: nothing held, remove it); ``timeout_ms``: wake up once the watermark is
    higher than this (None: no timer needed)."""

    panes: list[tuple[int, int, list[Any]]]
    discarded: int
    state: bytes | None
    timeout_ms: int | None


@dataclass(frozen=True)
class PanesStep:
    """``StepResult`` with the state as a ``PanesState`` (None: nothing held)."""

    panes: list[tuple[int, int, list[Any]]]
    discarded: int
    state: PanesState | None
    timeout_ms: int | None


# -- the operators' stored state -----------------------------------------------------------------
# Each stateful operator (time_interval_aggregate here, interval_aggregate, overlap_join) has a
# frozen state class and a StateFormat: the format version it writes and a reader for every
# version a release wrote. What is stored is the envelope {"v": version, "state": plain}
# pickled, plain values only, never this package's classes: renaming or moving code breaks no
# checkpoint, and the bytes, which live in the checkpoint folder, are read as data, never as
# code. Every operator writes version 1; 0.1.0 and 0.2.0 stored time_interval_aggregate's and
# overlap_join's version 1 bare (no envelope), and the first interval_aggregate its dict bare
# (without "v"): a bare value reads as version 1. A higher version is refused by name.

S = TypeVar("S")

#: The only globals a pane's state may name: the value types partial aggregates hold. Spark's
#: state store lives in the checkpoint folder, so its bytes are read as data, never as code.
_STATE_GLOBALS = frozenset(
    {
        ("datetime", "datetime"),
        ("datetime", "date"),
        ("datetime", "timedelta"),
        ("datetime", "timezone"),
        ("decimal", "Decimal"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("pandas._libs.tslibs.timestamps", "_unpickle_timestamp"),
        ("pandas._libs.tslibs.timedeltas", "_timedelta_unpickle"),
    }
)


class _StateUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, what: str = "a time_interval_aggregate pane") -> None:
        super().__init__(file)
        self._what = what

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _STATE_GLOBALS:
            raise pickle.UnpicklingError(
                f"the state of {self._what} names {module}.{name}, which its state never "
                "holds: the checkpoint's state store was altered; refusing to load it"
            )
        return super().find_class(module, name)


def load_values(blob: bytes, what: str) -> Any:
    """Unpickle ``blob``, admitting plain values only (numbers, strings, tuples, lists, dicts
    and the value types of ``_STATE_GLOBALS``): the state of ``what``, read from Spark's
    state store as data, never as code."""
    return _StateUnpickler(io.BytesIO(blob), what).load()


@dataclass(frozen=True)
class StateFormat(Generic[S]):
    """How one operator stores a key's state: ``what`` it is (named in errors: ``"an
    overlap_join key"``), the format ``version`` written, ``write`` (the state as plain values)
    and ``read``: for each version a release wrote, the state from its plain values."""

    what: str
    version: int
    write: Callable[[S], Any]
    read: Mapping[int, Callable[[Any], S]] = field(default_factory=dict)

    def dumps(self, state: S) -> bytes:
        """``state`` as the bytes kept in Spark's state store: the versioned envelope."""
        envelope = {"v": self.version, "state": self.write(state)}
        return pickle.dumps(envelope, protocol=pickle.HIGHEST_PROTOCOL)

    def loads(self, blob: bytes) -> S:
        """The state in ``blob``, of any version a reader is kept for (a bare value: 1)."""
        version, plain = _unwrap(load_values(blob, self.what))
        reader = self.read.get(version) if isinstance(version, int) else None
        if reader is None:
            raise _refused(self.what, version, self.version)
        try:
            return reader(plain)
        except (TypeError, ValueError, KeyError, IndexError) as e:
            raise CorruptLogError(
                f"the state of {self.what} in this query's checkpoint is not what format "
                f"version {version} holds ({type(e).__name__}: {e}): the checkpoint's state "
                "store was altered; restore the checkpoint from a backup"
            ) from e


def _unwrap(value: Any) -> tuple[object, Any]:
    """(version, plain state) of a stored value: the envelope, or a bare version 1."""
    if isinstance(value, dict) and "v" in value:
        return value["v"], value.get("state")
    return 1, value


def _refused(what: str, found: object, highest: int) -> CorruptLogError:
    where = f"the state of {what} in this query's checkpoint"
    if isinstance(found, int) and 0 < found <= highest:  # a gap: no release wrote it
        return CorruptLogError(
            f"{where} is in format version {found}, which no release of pyspark-rowtime wrote: "
            "the checkpoint's state store was altered; restore the checkpoint from a backup"
        )
    return newer_format(where, found, highest, CorruptLogError)


#: The highest version any operator writes (each operator's own is its StateFormat's):
#: interval_aggregate's 3.
HIGHEST_VERSION = 3


def load_operator_state(blob: bytes, what: str) -> Any:
    """The plain state of ``what`` (a key of any of the operators), unwrapped from its
    envelope; a version above ``HIGHEST_VERSION`` is refused."""
    version, plain = _unwrap(load_values(blob, what))
    if not isinstance(version, int) or not 0 < version <= HIGHEST_VERSION:
        raise _refused(what, version, HIGHEST_VERSION)
    return plain


@dataclass(frozen=True)
class PanesState:
    """The state of one key (format version 1, ``PANES_FORMAT``): its panes as stored,
    ``(start_us, end_us, triggered, pending_ms, partials)`` each, in the order they opened."""

    panes: tuple[tuple[int, int, bool, int | None, list[Any]], ...]

    def by_start(self) -> dict[int, PaneState]:
        """The panes as fresh ``PaneState`` s by start (a step changes those, never this)."""
        return {s: PaneState(e, t, p, list(v)) for s, e, t, p, v in self.panes}


def _write_panes(state: PanesState) -> list[tuple[int, int, bool, int | None, list[Any]]]:
    return list(state.panes)


def _read_panes_v1(plain: Any) -> PanesState:
    # 0.1.0 and 0.2.0 stored this list bare; since the skeleton it sits in the envelope.
    if not isinstance(plain, list):
        raise TypeError(f"a list of panes, not {type(plain).__name__}")
    return PanesState(tuple(plain))


#: How ``time_interval_aggregate`` stores a key.
PANES_FORMAT = StateFormat("a time_interval_aggregate key", 1, _write_panes, {1: _read_panes_v1})


def load_state(blob: bytes | None) -> dict[int, PaneState]:
    """The panes of a key, by start (us), from the bytes kept in Spark's state store (any
    version ``PANES_FORMAT`` reads)."""
    if blob is None:
        return {}
    return PANES_FORMAT.loads(blob).by_start()


#: Columns of a partials frame (``preaggregate``) besides the key columns.
PARTIAL_COLUMNS = ("__start", "__end", "__n", "__p")


def _numbers(values: pd.Series, at: np.ndarray) -> np.ndarray | None:
    """``values`` at rows ``at`` as a plain numpy array when they are plain numbers (float,
    with NaN for null, or int, never null); None for anything else (objects, decimals,
    strings, timestamps, pandas' nullable types), which takes pandas' general path."""
    if isinstance(values.dtype, np.dtype) and values.dtype.kind in "fiu":
        return values.to_numpy()[at]
    return None


def _by_segment(
    kind: str,
    values: pd.Series,
    at: np.ndarray,
    seg: np.ndarray,
    firsts: np.ndarray,
    v: np.ndarray | None = None,
) -> tuple[list[Any], np.ndarray]:
    """``kind`` (``sum``, ``min`` or ``max``) of the non-null ``values`` (rows ``at``) of each
    segment, and the number of non-null values per segment (a segment of nulls only: count 0,
    value meaningless). Numbers reduce in numpy, in row order; anything else in pandas. ``v``:
    ``_numbers(values, at)`` when the caller has it already."""
    if v is None:
        v = _numbers(values, at)
    if v is None:
        # Nulls out first: pandas' general reductions would compare None with the values.
        taken = values.take(at).reset_index(drop=True)
        keep = taken.notna().to_numpy()
        reduced = getattr(taken[keep].groupby(seg[keep], sort=True), kind)()
        column: list[Any] = [None] * firsts.size
        for s, x in zip(reduced.index.tolist(), reduced.tolist(), strict=True):
            column[s] = x
        return column, np.bincount(seg[keep], minlength=firsts.size)
    if v.dtype.kind == "f":
        present = ~np.isnan(v)
        counts = np.add.reduceat(present.astype(np.int64), firsts)
    else:
        counts = np.diff(np.append(firsts, v.size))
    if kind == "sum":
        # In 64 bits, as pandas' and Spark's sums of narrower numbers are.
        wide = v.astype(np.float64 if v.dtype.kind == "f" else np.int64, copy=False)
        reduced = np.add.reduceat(np.where(present, wide, 0.0) if v.dtype.kind == "f" else wide,
                                  firsts)  # fmt: skip
    else:  # fmin/fmax skip NaN
        reduced = (np.fmin if kind == "min" else np.fmax).reduceat(v, firsts)
    return reduced.tolist(), counts


def _best(
    kind: str,
    order: pd.Series,
    at: np.ndarray,
    seg: np.ndarray,
    firsts: np.ndarray,
    o: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, list[Any]]:
    """For ``max_by`` (``min_by``): per segment, the position in ``at`` of the row with the
    highest (lowest) non-null ordering, the first such row on ties, and its ordering; as
    ``(segments, positions, orderings)`` for the segments that have one. ``o``:
    ``_numbers(order, at)`` when the caller has it already."""
    if o is None:
        o = _numbers(order, at)
    if o is None:
        taken = order.take(at).reset_index(drop=True)
        keep = taken.notna().to_numpy()
        rank = pd.DataFrame(
            {"seg": seg[keep], "o": taken[keep].to_numpy(), "i": np.flatnonzero(keep)}
        )
        best = rank.sort_values(
            ["seg", "o", "i"], ascending=[True, kind == "min_by", True], kind="stable"
        ).drop_duplicates("seg")
        return best["seg"].to_numpy(), best["i"].to_numpy(), best["o"].tolist()
    # No sort: each segment's extreme (NaN skipped), then the first row that has it.
    if o.dtype.kind == "f":
        extreme = (np.fmax if kind == "max_by" else np.fmin).reduceat(o, firsts)
    else:
        extreme = (np.maximum if kind == "max_by" else np.minimum).reduceat(o, firsts)
    i = np.flatnonzero(o == extreme[seg])  # NaN equals nothing: null orderings drop out
    s = seg[i]
    first = np.append(True, s[1:] != s[:-1]) if i.size else np.zeros(0, dtype=bool)
    return s[first], i[first], o[i[first]].tolist()


def _partials(
    aggs: list[AggPlan],
    df: Mapping[str, pd.Series],
    at: np.ndarray,
    seg: np.ndarray,
    firsts: np.ndarray,
    sizes: np.ndarray,
) -> list[list[Any]]:
    """The partial aggregates of each segment: ``at`` are the rows of ``df`` (one per pair, in
    segment order, arrival order within a segment), ``seg`` their segment ``0..k-1`` (ascending),
    ``firsts`` where each segment begins and ``sizes`` its rows. One vectorised reduction per
    aggregate, whatever ``k`` is; the values are exactly what one pane's rows give (nulls
    skipped, as in Spark)."""
    k = sizes.size
    out: list[list[Any]] = [[] for _ in range(k)]
    taken: dict[str, np.ndarray | None] = {}

    def numbers(name: str) -> np.ndarray | None:
        # Each input gathered once, however many aggregates read it (sum, max, max_by of v).
        if name not in taken:
            taken[name] = _numbers(df[name], at)
        return taken[name]

    for a in aggs:
        if a.kind == "count":
            if a.inputs:  # the 0/1 column (never null) of the rows Spark's count counts
                ones = df[a.inputs[0]].to_numpy(dtype=np.int64)[at]
                column: list[Any] = np.add.reduceat(ones, firsts).tolist()
            else:
                column = sizes.tolist()
        elif a.kind in ("sum", "avg", "min", "max"):
            kind = "sum" if a.kind == "avg" else a.kind
            vs, present = _by_segment(kind, df[a.inputs[0]], at, seg, firsts,
                                      numbers(a.inputs[0]))  # fmt: skip
            if a.kind in ("sum", "avg"):
                column = [[v if c else None, int(c)] for v, c in zip(vs, present, strict=True)]
            else:
                column = [v if c else None for v, c in zip(vs, present, strict=True)]
        else:
            # max_by / min_by: the value at the highest (lowest) ordering; rows with a null
            # ordering do not take part, as in Spark. Ties keep the row that came first.
            segs, positions, orders = _best(a.kind, df[a.inputs[1]], at, seg, firsts,
                                            numbers(a.inputs[1]))  # fmt: skip
            values = df[a.inputs[0]].take(at[positions]).tolist()
            column = [None] * k
            for s, v, o in zip(segs.tolist(), values, orders, strict=True):
                column[s] = [v, o]
        for row, v in zip(out, column, strict=True):
            row.append(v)
    return out


def preaggregate(
    spec: TimeIntervalSpec, aggs: list[AggPlan], df: pd.DataFrame, keys: list[str]
) -> pd.DataFrame:
    """The partial aggregates of raw rows per key and pane, to be merged by ``merge_step``.

    ``df`` has the ``keys`` columns, the rowtime in ``__t`` (microseconds) and the aggregates'
    inputs. The result has the ``keys``, then ``PARTIAL_COLUMNS``: one row per (key, pane)
    with the pane's ``__start``/``__end`` (us), ``__n`` the rows it got and ``__p`` the pickled
    list of partials (one per aggregate), in ascending (key, start); and one row per key that
    had rows in no pane (a gap) with ``__n`` those rows and ``__p`` None. Any split of a key's
    rows into frames, each pre-aggregated and then merged in arrival order, gives what the rows
    give in one frame: partials merge exactly, and ties keep the earlier frame's row."""
    columns = [*keys, *PARTIAL_COLUMNS]
    t = df["__t"].to_numpy(dtype=np.int64)
    if not t.size:
        return pd.DataFrame({c: [] for c in columns})
    codes = (
        df.groupby(keys, sort=False, dropna=False).ngroup().to_numpy(dtype=np.int64)
        if keys
        else np.zeros(t.size, dtype=np.int64)
    )
    key_rows, out = pane_partials(spec, aggs, df, t, codes)
    for k in keys:  # as Series: the key keeps its dtype (timestamps, decimals...)
        out[k] = df[k].take(key_rows).reset_index(drop=True)
    return pd.DataFrame(out, columns=columns)


def pane_partials(
    spec: TimeIntervalSpec,
    aggs: list[AggPlan],
    columns: Mapping[str, pd.Series],
    t: np.ndarray,
    codes: np.ndarray,
) -> tuple[list[int], dict[str, list[Any]]]:
    """``preaggregate`` once the keys are numbered: ``t`` the rowtimes (us), ``codes`` each
    row's key as ``0..k-1`` (any numbering that gives equal keys equal codes) and ``columns``
    the aggregates' inputs by name. Returns, for each partial row, the row whose key it
    carries, and the ``PARTIAL_COLUMNS`` as lists; the caller adds the key values (so a caller
    holding Arrow columns takes them without pandas)."""
    pair_rows, starts, ends = assign_panes_array(t, spec)
    # Segments: by key, then pane, then arrival. Their ranks are dense and ascend in that
    # order, so their sizes are a count and the pairs' ranks in order a repeat: of the pairs,
    # only their rows are gathered (the starts and ends at each segment's first pair).
    order, seg_of = _segment_order(codes[pair_rows], starts, spec.creation_period_us)
    sizes = np.bincount(seg_of) if seg_of.size else np.zeros(0, dtype=np.int64)
    firsts = np.cumsum(sizes) - sizes
    rows = pair_rows[order]
    seg = np.repeat(np.arange(sizes.size, dtype=np.int64), sizes)
    parts = _partials(aggs, columns, rows, seg, firsts, sizes) if rows.size else []
    out: dict[str, list[Any]] = {}
    key_rows = rows[firsts].tolist()
    heads = order[firsts]
    out["__start"] = starts[heads].tolist()
    out["__end"] = ends[heads].tolist()
    out["__n"] = sizes.tolist()
    out["__p"] = [pickle.dumps(p, protocol=pickle.HIGHEST_PROTOCOL) for p in parts]
    if spec.creation_period_us > spec.interval_duration_us:
        in_none = np.bincount(rows, minlength=t.size) == 0
        gap_keys, gap_counts = np.unique(codes[in_none], return_counts=True)
        first_row = _first_rows(codes)
        for code, n in zip(gap_keys.tolist(), gap_counts.tolist(), strict=True):
            key_rows.append(int(first_row[code]))
            out["__start"].append(0)
            out["__end"].append(0)
            out["__n"].append(n)
            out["__p"].append(None)
    return key_rows, out


def _segment_order(
    pair_codes: np.ndarray, starts: np.ndarray, period_us: int
) -> tuple[np.ndarray, np.ndarray]:
    """The stable order of (key, pane) pairs given in arrival order, by key then pane start,
    and each pair's segment: its (key, start) ranked from 0. The same order as
    ``np.lexsort((rows, starts, pair_codes))``; with few keys and panes (every micro-batch a
    key pane holds many rows) the ranks fit 16 bits and numpy sorts them by radix, in linear
    time."""
    if not starts.size:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    # Pane starts are whole periods apart (plus the offset): number them from the first.
    pane = (starts - starts.min()) // period_us
    panes = int(pane.max()) + 1
    cells = (int(pair_codes.max()) + 1) * panes
    if cells > 4 * starts.size + (1 << 16):  # sparse: ranking by table would cost more
        order = np.lexsort((np.arange(starts.size), starts, pair_codes))
        ordered = np.empty(starts.size, dtype=np.int64)
        sc, ss = pair_codes[order], starts[order]
        new = np.concatenate(([True], (sc[1:] != sc[:-1]) | (ss[1:] != ss[:-1])))
        ordered[order] = np.cumsum(new) - 1
        return order, ordered
    cell = pair_codes * panes + pane
    rank = np.cumsum(np.bincount(cell, minlength=cells) > 0) - 1
    seg_of = rank[cell]
    narrow = seg_of.astype(np.uint16) if int(rank[-1]) < (1 << 16) else seg_of
    return np.argsort(narrow, kind="stable"), seg_of


def _first_rows(codes: np.ndarray) -> np.ndarray:
    """For each code ``c`` in ``0..max``, the first row that has it (-1: none)."""
    first = np.full(int(codes.max()) + 1 if codes.size else 0, -1, dtype=np.int64)
    uniq, at = np.unique(codes, return_index=True)
    first[uniq] = at
    return first


def _merge(kind: str, old: Any, new: Any) -> Any:
    if old is None:
        return new
    if new is None:
        return old
    if kind == "count":
        return old + new
    if kind in ("sum", "avg"):
        if new[1] == 0:
            return old
        if old[1] == 0:
            return new
        return [old[0] + new[0], old[1] + new[1]]
    if kind == "min":
        return new if new < old else old
    if kind == "max":
        return new if new > old else old
    if kind == "max_by":
        return new if new[1] > old[1] else old
    return new if new[1] < old[1] else old  # min_by


def _final(kind: str, partial: Any) -> Any:
    if kind == "count":
        return partial
    if partial is None:
        return None
    if kind == "sum":
        return partial[0] if partial[1] else None
    if kind == "avg":
        return partial[0] / partial[1] if partial[1] else None
    if kind in ("max_by", "min_by"):
        return partial[0]
    return partial


def run_step(
    spec: TimeIntervalSpec,
    aggs: list[AggPlan],
    frames: Iterable[pd.DataFrame],
    blob: bytes | None,
    watermark_ms: int,
) -> StepResult:
    """One key, one micro-batch, from raw rows (``frames``: the rowtime in column ``__t`` as
    microseconds and the aggregates' inputs): ``preaggregate``, then ``merge_step``."""
    parts = [f for f in frames if len(f)]
    partials = []
    if parts:
        df = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        partials.append(preaggregate(spec, aggs, df, []))
    return merge_step(spec, aggs, partials, blob, watermark_ms)


def merge_step(
    spec: TimeIntervalSpec,
    aggs: list[AggPlan],
    partials: Iterable[pd.DataFrame],
    blob: bytes | None,
    watermark_ms: int,
) -> StepResult:
    """``merge_panes`` over the bytes kept in Spark's state store (None: nothing kept)."""
    state = None if blob is None else PANES_FORMAT.loads(blob)
    step = merge_panes(spec, aggs, partials, state, watermark_ms)
    kept = None if step.state is None else PANES_FORMAT.dumps(step.state)
    return StepResult(step.panes, step.discarded, kept, step.timeout_ms)


def merge_panes(
    spec: TimeIntervalSpec,
    aggs: list[AggPlan],
    partials: Iterable[pd.DataFrame],
    state: PanesState | None,
    watermark_ms: int,
) -> PanesStep:
    """One key, one micro-batch: take the key's new partials (frames of ``preaggregate``,
    in arrival order), emit what the watermark (``W``, ms) triggers, and say what to keep and
    when to wake up.

    Panes due at ``W`` that were held before these rows trigger first, then the rows are
    taken in: a row for a pane whose end ``W`` already reached waits for the next update of
    the watermark, as IBM's late tuples do.
    """
    panes = {} if state is None else state.by_start()
    w_us = watermark_ms * 1000
    emitted: list[tuple[int, int, list[Any]]] = []

    def emit_due() -> None:
        due = [
            (p.end_us, start)
            for start, p in panes.items()
            if (p.pending_ms is None and not p.triggered and p.end_us <= w_us)
            or (p.pending_ms is not None and watermark_ms > p.pending_ms)
        ]
        for end, start in sorted(due):
            p = panes[start]
            emitted.append(
                (start, end, [_final(a.kind, v) for a, v in zip(aggs, p.partials, strict=True)])
            )
            p.triggered, p.pending_ms = True, None

    emit_due()
    discarded = 0
    for frame in partials:
        for start, end, n, blob_p in zip(
            frame["__start"].tolist(), frame["__end"].tolist(), frame["__n"].tolist(),
            frame["__p"].tolist(), strict=True,
        ):  # fmt: skip
            if blob_p is None or w_us > end + spec.discard_age_us:
                # Rows in no pane (a gap), or for a closed pane: discarded, once per pane.
                discarded += int(n)
                continue
            start, end = int(start), int(end)
            new = _StateUnpickler(io.BytesIO(blob_p)).load()  # value types only, as state
            p = panes.get(start)
            if p is None:
                p = panes[start] = PaneState(end, False, None, [None] * len(aggs))
            p.partials = [_merge(a.kind, o, v) for a, o, v in zip(aggs, p.partials, new,
                                                                  strict=True)]  # fmt: skip
            if p.triggered or end <= w_us:
                p.pending_ms = watermark_ms
    # Closing: after any last trigger, a pane whose end + discardAge the watermark passed goes.
    for start in [s for s, p in panes.items() if w_us > p.end_us + spec.discard_age_us]:
        del panes[start]
    kept = None
    if panes:
        kept = PanesState(
            tuple((s, p.end_us, p.triggered, p.pending_ms, p.partials) for s, p in panes.items())
        )
    return PanesStep(emitted, discarded, kept, _next_timeout(spec, panes, watermark_ms))


def _next_timeout(spec: TimeIntervalSpec, panes: dict[int, PaneState], w_ms: int) -> int | None:
    """The lowest watermark (ms) above which something is due. Spark fires an event-time
    timeout ``T`` once the watermark is higher than ``T``, so a pane ending at ``end`` (us)
    needs ``T = ceil(end / 1000) - 1`` and one closing at ``end + discardAge`` needs
    ``T = floor((end + discardAge) / 1000)``."""
    due: list[int] = []
    for p in panes.values():
        if p.pending_ms is not None:
            due.append(p.pending_ms)
        elif not p.triggered:
            due.append(-(-p.end_us // 1000) - 1)
        due.append((p.end_us + spec.discard_age_us) // 1000)
    return max(w_ms, min(due)) if due else None

"""The per-key step of ``time_interval_aggregate``: panes, trigger, re-trigger and discardAge.

Pure Python (numpy and pandas, no Spark), so it is tested without Spark. Spark calls
:func:`run_step` once per key and micro-batch (``applyInPandasWithState``) with the key's new
rows, its saved state and the batch's watermark; the step answers with the panes to emit, the
new state and the timer to set.

Panes are assigned by :func:`bounds.panes.assign_panes_array`; the trigger rules are those of
:class:`bounds.panes.TimeIntervalWindow` (SPEC section 10), restated for Spark's batches:

* Spark's watermark ``W`` is whole milliseconds. A pane ``[start, end)`` (microseconds)
  triggers in the first batch whose ``W * 1000 >= end``.
* A row for a pane that has already triggered (or whose end the watermark had already reached
  when the row came) is late: the pane triggers again, corrected, in the first later batch whose
  watermark is higher than the one the row came with ("at the next watermark update").
* A pane is closed, and its state dropped, once ``W * 1000 > end + discardAge``; a row for a
  closed pane (and a row in no pane: a gap) is discarded and counted, once per closed pane.

The state of a pane is a list of mergeable partial aggregates (:class:`AggPlan`), never its rows:
a pane costs the same few values however many rows it holds.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..bounds.panes import TimeIntervalSpec, assign_panes_array

__all__ = ["MERGEABLE", "AggPlan", "PaneState", "StepResult", "load_state", "run_step"]

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
    """One aggregate: ``kind`` (a value of :data:`MERGEABLE`) over the input columns ``inputs``
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


def load_state(blob: bytes | None) -> dict[int, PaneState]:
    """The panes of a key, by start (us), from the bytes kept in Spark's state store.

    The bytes pickle plain tuples ``(start, end, triggered, pending_ms, partials)``, never this
    module's classes, so renaming or moving code does not break existing checkpoints."""
    if blob is None:
        return {}
    state = _StateUnpickler(io.BytesIO(blob)).load()
    return {s: PaneState(e, t, p, list(v)) for s, e, t, p, v in state}


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
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _STATE_GLOBALS:
            raise pickle.UnpicklingError(
                f"the state of a time_interval_aggregate pane names {module}.{name}, which its "
                "state never holds: the checkpoint's state store was altered; refusing to load it"
            )
        return super().find_class(module, name)


def _present(values: pd.Series) -> pd.Series:
    return values[values.notna()]


def _partial(kind: str, cols: list[pd.Series], n: int) -> Any:
    """The partial aggregate of one pane's ``n`` new rows (``cols``: the aggregate's inputs)."""
    if kind == "count":
        return int(cols[0].sum()) if cols else n
    if kind in ("sum", "avg"):
        v = _present(cols[0])
        return [v.sum() if len(v) else None, len(v)]
    if kind in ("min", "max"):
        v = _present(cols[0])
        if not len(v):
            return None
        return v.min() if kind == "min" else v.max()
    # max_by / min_by: the value at the highest (lowest) ordering; rows with a null ordering do
    # not take part, as in Spark. Ties keep the row that came first.
    order = cols[1]
    keep = order.notna().to_numpy()
    if not keep.any():
        return None
    o = order[keep]
    at = o.to_numpy().argmax() if kind == "max_by" else o.to_numpy().argmin()
    return [cols[0][keep].iloc[at], o.iloc[at]]


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
    """One key, one micro-batch: take the new rows (``frames``, with the rowtime in column
    ``__t`` as microseconds and the aggregates' inputs), emit what the watermark (``W``, ms)
    triggers, and say what to keep and when to wake up.

    Panes due at ``W`` that were held before these rows trigger first, then the rows are
    taken in: a row for a pane whose end ``W`` already reached waits for the next update of
    the watermark, as IBM's late tuples do.
    """
    panes = load_state(blob)
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
    parts = [f for f in frames if len(f)]
    if parts:
        df = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        t = df["__t"].to_numpy(dtype=np.int64)
        rows, starts, ends = assign_panes_array(t, spec)
        if spec.creation_period_us > spec.interval_duration_us:
            # A row in no pane (a gap) is discarded once, like a row for a closed pane.
            discarded += int(np.count_nonzero(np.bincount(rows, minlength=t.size) == 0))
        closed = w_us > ends + spec.discard_age_us
        discarded += int(closed.sum())
        rows, starts, ends = rows[~closed], starts[~closed], ends[~closed]
        if rows.size:
            # By pane, then in arrival order (pairs come in row order). Rows that came in
            # rowtime order are sorted by pane already.
            if np.any(starts[1:] < starts[:-1]):
                order = np.argsort(starts, kind="stable")
                rows, starts, ends = rows[order], starts[order], ends[order]
            cuts = np.flatnonzero(np.diff(starts)) + 1
            inputs = {c: df[c] for a in aggs for c in a.inputs}
            for seg_rows, seg_starts, seg_ends in zip(
                np.split(rows, cuts), np.split(starts, cuts), np.split(ends, cuts), strict=True
            ):
                start, end = int(seg_starts[0]), int(seg_ends[0])
                new = [
                    _partial(a.kind, [inputs[c].iloc[seg_rows].reset_index(drop=True)
                                      for c in a.inputs], seg_rows.size)
                    for a in aggs
                ]  # fmt: skip
                p = panes.get(start)
                if p is None:
                    p = panes[start] = PaneState(end, False, None, [None] * len(aggs))
                p.partials = [_merge(a.kind, o, n) for a, o, n in zip(aggs, p.partials, new,
                                                                      strict=True)]  # fmt: skip
                if p.triggered or end <= w_us:
                    p.pending_ms = watermark_ms
    # Closing: after any last trigger, a pane whose end + discardAge the watermark passed goes.
    for start in [s for s, p in panes.items() if w_us > p.end_us + spec.discard_age_us]:
        del panes[start]
    return StepResult(emitted, discarded, _save(panes), _next_timeout(spec, panes, watermark_ms))


def _save(panes: dict[int, PaneState]) -> bytes | None:
    if not panes:
        return None
    plain = [(s, p.end_us, p.triggered, p.pending_ms, p.partials) for s, p in panes.items()]
    return pickle.dumps(plain, protocol=pickle.HIGHEST_PROTOCOL)


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

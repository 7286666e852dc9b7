"""The skeleton of the stateful operators: a config, a logic with a pure step, a versioned state.

``time_interval_aggregate``, ``interval_aggregate`` and ``overlap_join`` are built alike, the way
Bytewax builds its windowing operators on one core:

* **a config**: a frozen dataclass of the operator's checked parameters (``PanesConfig``,
  ``IntervalConfig``, ``JoinConfig``), built on the driver before the query starts;
* **a logic** (``KeyLogic``) made from it, whose ``KeyLogic.step`` is one key and one
  micro-batch: its stored state, its new rows and Spark's watermark in, the rows to emit (the
  metric rows included), the state to keep and the next event-time timeout out. The rules are
  the pure steps (``step.merge_panes``, ``validity.interval_step``,
  ``join.window_join_step``): Python and numpy, tested without Spark;
* **a versioned state**: a frozen state class and its ``step.StateFormat`` (the format
  version written in what is stored, and a reader for every version a release wrote, so a
  checkpoint of an older release goes on, SPEC 12): ``step.PANES_FORMAT``,
  ``validity.INTERVAL_FORMAT``, ``join.join_format``;

and **one shared piece**, ``run_on_state_store``, that runs a logic on Spark's state store:
``applyInPandasWithState`` grouped by the keys, the state kept as one binary column, the
event-time timeout each step asks for, and the observed metrics, whose rows are then dropped.
It is the one place that knows how Spark keeps the state: a faster way to run the steps goes
here, and all three operators take it.

Why ``applyInPandasWithState`` (and not ``transformWithStateInPandas``): it runs on any state
store provider (the other needs RocksDB and protobuf), and one event-time timer per key is all
the operators' rules need. Spark wants one watermarked input column before it allows an
event-time timeout, and drops the rows whose marked column is at or below the watermark: each
operator's input carries ``never_late``, which holds the mark and a value no watermark
reaches, so every row reaches the step and the step decides what is late.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import pandas as pd

from .step import StateFormat

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

__all__ = [
    "KeyLogic",
    "KeyStep",
    "StatefulPlan",
    "never_late",
    "run_on_state_store",
]

S = TypeVar("S")

#: Spark's mark of the watermarked column (``EventTimeWatermark.delayKey``).
WATERMARK_KEY = "spark.watermarkDelayMs"
#: The highest long: no watermark (in microseconds) reaches it.
NEVER_LATE = 2**63 - 1


@dataclass(frozen=True)
class KeyStep(Generic[S]):
    """What one step decided for one key: the ``frames`` to emit (result rows and metric rows,
    in the operator's output schema), the ``state`` to keep (None: nothing, the key's state is
    removed) and ``timeout_ms``: wake the key once Spark's watermark is above it, even with no
    rows (None: no timer; a kept state of the join and of ``interval_aggregate`` always has
    one)."""

    frames: list[pd.DataFrame]
    state: S | None
    timeout_ms: int | None


class KeyLogic(ABC, Generic[S]):
    """One operator's logic for one key, made from its config on the driver and shipped to the
    executors with the query (so it holds plain values only)."""

    #: How this logic's state is stored.
    format: StateFormat[S]

    @abstractmethod
    def step(
        self,
        key: tuple[Any, ...],
        frames: Iterator[pd.DataFrame],
        state: S | None,
        watermark_ms: int,
    ) -> KeyStep[S]:
        """One micro-batch of ``key``: its new rows (``frames``, in arrival order), its state
        (None: none kept) and Spark's watermark (ms)."""


@dataclass(frozen=True)
class StatefulPlan:
    """What Spark needs to run a logic: the grouping columns, the ``output`` schema of the
    frames a step emits, the name of the state's one binary field (each operator's name is
    kept: checkpoints of earlier releases hold it), the observed metric ``metric_name`` with
    its ``metrics`` (aggregates over the output) and ``results``: the condition that tells a
    result row from a metric row."""

    group_by: Sequence[str]
    output: StructType
    state_field: str
    metric_name: str
    metrics: Sequence[Column]
    results: Column


def never_late() -> Column:
    """The column every operator's input carries so that Spark allows an event-time timeout
    and drops no row before the step (see the module)."""
    from pyspark.sql import functions as F

    return F.lit(NEVER_LATE).cast("long").alias("__never_late", metadata={WATERMARK_KEY: 1})


def run_on_state_store(rows: DataFrame, logic: KeyLogic[Any], plan: StatefulPlan) -> DataFrame:
    """Run ``logic`` per key and micro-batch over ``rows`` on Spark's state store, observe the
    plan's metrics and keep the result rows (output mode ``append``)."""
    from pyspark.sql.streaming.state import GroupStateTimeout
    from pyspark.sql.types import BinaryType, StructField, StructType

    state_format = logic.format

    def call(key: tuple, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        old = state_format.loads(state.get[0]) if state.exists else None
        decided = logic.step(key, frames, old, state.getCurrentWatermarkMs())
        if decided.state is None:
            if state.exists:
                state.remove()
        else:
            state.update((state_format.dumps(decided.state),))
            if decided.timeout_ms is not None:
                state.setTimeoutTimestamp(decided.timeout_ms)
        yield from decided.frames

    stateful = rows.groupBy(*plan.group_by).applyInPandasWithState(
        call,
        outputStructType=plan.output,
        stateStructType=StructType([StructField(plan.state_field, BinaryType())]),
        outputMode="append",
        timeoutConf=GroupStateTimeout.EventTimeTimeout,
    )
    return stateful.observe(plan.metric_name, *plan.metrics).where(plan.results)

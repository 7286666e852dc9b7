"""``time_interval_aggregate``: IBM Streams ``timeInterval`` aggregation on Spark (SPEC 10).

How it is built, and why:

* **Spark's own stateful operator.** The panes of each key live in Spark's state store through
  ``applyInPandasWithState`` with an event-time timeout, so a restart from the checkpoint goes
  on with exactly the state (and the output) of an uninterrupted run, on any state store
  provider (``transformWithStateInPandas`` would need RocksDB and protobuf; the event-time
  timeout of one timer per key is all the trigger rules need). The rules themselves are the
  pure core's (``step``, using ``bounds.panes.assign_panes_array``): a
  ``PanesConfig``, its ``PanesLogic`` and the versioned ``step.PanesState``,
  run by the operators' shared piece (``stateful.run_on_state_store``).
* **Late rows reach the step.** Spark drops rows at or below the watermark before a stateful
  operator whose input carries the watermarked column. The step needs those rows (a late row
  re-triggers its pane until ``end + discardAge``), so the rowtime goes in as microseconds
  (``__t``) and the watermarked column does not: Spark passes every row on, the step decides.
  Spark still wants one input column marked as watermarked before it allows an event-time
  timeout; ``__never_late`` carries the mark and the highest long, which no watermark reaches.
* **Aggregates are evaluated by Spark, merged by the step.** ``aggs`` are Spark aggregate
  columns. Their arguments (``flow``, ``struct(a, b)``, ``x * 2``...) are computed by Spark before
  the step, so any expression works; the aggregate functions themselves must merge exactly
  across micro-batches, because a pane keeps one partial per aggregate, never its rows
  (``count``, ``sum``, ``avg``, ``min``, ``max``, ``max_by``, ``min_by``; not ``DISTINCT``,
  ``FILTER``, ``collect_list``, percentiles...). Keeping the rows of every open pane instead
  would let any aggregate through, but the state (and the work of each re-trigger) would grow
  with the rows, and a pane would then still need a second, stateless pass of Spark to
  aggregate, which a streaming query cannot express after a stateful operator.
* **Speed: partials before the shuffle.** Spark's own window aggregates each partition partially
  before its shuffle; a stateful Python operator alone would shuffle, sort and convert every
  row instead. So a stateless ``mapInPandas`` first
  reduces each partition's rows of a micro-batch to one partial per (key, pane)
  (``step.preaggregate``: numpy pane assignment, one vectorised reduction per aggregate,
  in numpy for numbers and pandas for other types, over chunks of up to ``_CHUNK_ROWS``
  rows), and only those few rows are shuffled to the
  stateful operator, which merges them (``step.merge_step``) by the same rules as rows:
  a partial holds its pane's row count, so discarded rows are still counted one by one. A
  native Spark aggregation cannot do the first part: in a streaming query it is itself
  stateful and, in append mode, emits only once the watermark passes. When every input of
  the aggregates is a plain number (and the keys are of a type Arrow numbers), the
  partition's rows come as Arrow batches (``mapInArrow``) straight into numpy, the keys are
  numbered by Arrow's hash tables and the (key, pane) segments are ordered by a radix sort:
  no pandas frame and no Python object per row (``_arrow_partials``, the same partials as
  ``step.preaggregate`` bit for bit); any other input (timestamps, decimals, strings...) takes
  ``mapInPandas`` and Spark's own conversion of its values; tumbling panes are one pane a row,
  never expanded. What is left is Spark's: handing each row to the Python worker, and per
  micro-batch its stateful Python operator. ``./dev bench windows`` compares it with Spark's
  own ``groupBy(window(...))``, and ``--floors`` with this plan under a step that keeps
  nothing (docs/benchmarks.md).
* **Spark's ``window()`` is not used** to assign panes: it refuses gaps
  (``creationPeriod > intervalDuration``) and offsets of ``creationPeriod`` or more, which IBM
  allows; ``assign_panes_array`` covers every case exactly, in microseconds.
* **Discarded rows are counted, never silently lost**: each micro-batch's count is the
  observed metric ``metric_name`` (``query.lastProgress["observedMetrics"][metric_name]
  ["discarded_rows"]``): rows for a pane the watermark passed by more than ``discardAge`` (once
  per such pane) and rows that fall in no pane (a gap).

Timing, with ``with_watermark``'s 1 ms delay: a bound at clock ``C`` moves Spark's watermark to
``W = C - 1 ms`` one batch later (Spark runs that batch even when no row follows), and a pane
``[start, end)`` is emitted in the first batch with ``W >= end``. Each pane is emitted once,
with ``rowtime = interval_end``; in append mode every pane emitted in batch ``b`` ends at or
before ``W(b)`` and every later first emission ends after it, which is what the rowtime sink's
``clock=watermark`` (its default without ``is_bound``) relies on. A re-triggered pane (late
rows: unions, ``order=drop``) is emitted again with its old end, below a clock that already
passed it: the rowtime sink refuses such rows (they would break its promise that no row comes
below its clock), so write re-triggering results elsewhere (``foreachBatch`` upserts keyed by
``interval_start``/``interval_end``). A single rowtime reader never has late rows (its
alignment), so its windows always suit the sink.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa

from ..bounds.errors import OptionError
from ..bounds.panes import TimeIntervalSpec
from ..bounds.time import parse_duration_us
from ..watermark import analyzed_plan_text, parse_plan, watermark_rowtime
from .stateful import KeyLogic, KeyStep, StatefulPlan, never_late, run_on_state_store
from .step import (
    MERGEABLE,
    PANES_FORMAT,
    PARTIAL_COLUMNS,
    AggPlan,
    PanesState,
    merge_panes,
    pane_partials,
    preaggregate,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["PanesConfig", "PanesLogic", "time_interval_aggregate"]

_IBM = {
    "intervalDuration": "interval_duration",
    "creationPeriod": "creation_period",
    "discardAge": "discard_age",
    "intervalOffset": "interval_offset",
}
_INPUT_MARK = {"pyspark_rowtime": "window input"}
_RESERVED = ("interval_start", "interval_end", "rowtime", "is_bound")
#: Rows a partition pre-aggregates at once: Spark hands ``mapInPandas`` Arrow batches of
#: ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows (10,000 by default, a session setting
#: this function leaves alone); gathering them amortises the per-call pandas work, and the
#: bound keeps a worker's memory independent of the micro-batch size.
_CHUNK_ROWS = 1 << 18


def _seconds(name: str, value: object) -> object:
    """Numbers pass on to ``TimeIntervalSpec`` (which checks them); strings such as
    ``"25 seconds"`` become exact Decimal seconds."""
    if not isinstance(value, str):
        return value
    number = re.match(r"\s*([+-]?[0-9]*\.?[0-9]+)", value)
    if number and Decimal(number.group(1)) == 0:
        return Decimal(0)  # "0 seconds": parse_duration_us accepts only positive durations
    return Decimal(parse_duration_us(value, what=name)) / 1_000_000


def make_spec(
    interval_duration: object,
    creation_period: object = None,
    discard_age: object = 0.0,
    interval_offset: object = 0.0,
) -> TimeIntervalSpec:
    """The pane parameters as a ``TimeIntervalSpec``; an ``OptionError`` names the
    parameter (as this function and IBM spell it), the value and the rule."""
    values = {
        "interval_duration": interval_duration,
        "creation_period": creation_period,
        "discard_age": discard_age,
        "interval_offset": interval_offset,
    }
    seconds = {k: None if v is None else _seconds(k, v) for k, v in values.items()}
    try:
        return TimeIntervalSpec(
            seconds["interval_duration"],  # type: ignore[arg-type]
            seconds["creation_period"],  # type: ignore[arg-type]
            seconds["discard_age"],  # type: ignore[arg-type]
            seconds["interval_offset"],  # type: ignore[arg-type]
        )
    except OptionError as e:
        ibm = next((k for k in _IBM if str(e).startswith(k)), None)
        if ibm is None:
            raise
        py = _IBM[ibm]
        raise OptionError(f"time_interval_aggregate: {py}={values[py]!r}: {e}") from e


def _non_null_literal(expr: Any) -> bool:
    return bool(expr.getClass().getSimpleName() == "Literal" and expr.value() is not None)


@dataclass(frozen=True)
class AggCall:
    """One Spark aggregate column as Spark's analyzer sees it: its output ``name`` and
    ``field``, its function ``kind`` (a ``MERGEABLE`` value), its arguments as Spark columns
    (computed before a step) and, for each, whether it is a non-null literal (``count(*)``,
    ``count(1)``: no input at all)."""

    name: str
    kind: str
    args: tuple[Column, ...]
    literal: tuple[bool, ...]
    field: Any
    text: str


def agg_columns(aggs: object, more: tuple[object, ...], who: str) -> list[Column]:
    """``aggs`` and ``*more`` as one list of columns, as ``groupBy().agg(...)`` takes them:
    one column, a list/tuple of columns, or columns one after another."""
    from pyspark.sql import Column

    first = [aggs] if isinstance(aggs, Column) else aggs
    if not isinstance(first, (list, tuple)):
        raise OptionError(
            f"{who}: aggs={aggs!r} is not a Spark Column: give aggregate columns such as "
            "F.max('flow').alias('max_flow') (one, a list, or one after another)"
        )
    columns = [*first, *more]
    if not columns:
        raise OptionError(f"{who}: aggs is empty: give at least one aggregate")
    for i, agg in enumerate(columns):
        if not isinstance(agg, Column):
            raise OptionError(
                f"{who}: aggs[{i}]={agg!r} is not a Spark Column: give aggregate columns such "
                "as F.max('flow').alias('max_flow')"
            )
    return columns


def agg_calls(
    df: DataFrame,
    aggs: Sequence[Column],
    partition_by: list[str],
    *,
    who: str,
    reserved: Sequence[str],
) -> list[AggCall]:
    """Check each aggregate in Spark's analyzer (over an empty batch frame of ``df``'s schema)
    and take it apart: one ``AggCall`` each. An aggregate that is not one plain
    ``MERGEABLE`` function (DISTINCT, FILTER, anything around it) is refused, as is a
    name among ``partition_by`` and ``reserved``.

    Classic Spark reads the analyzed aggregate expression through Py4J; a Spark Connect client
    (no JVM) reads the same analysis as Spark's plan text, and the arguments from its own
    column expression."""
    connect = type(df).__module__.startswith("pyspark.sql.connect.")
    calls = []
    for i, agg in enumerate(aggs):
        split = _split_connect if connect else _split_jvm
        call = split(df, agg, i, partition_by, who)
        if call.name in partition_by or call.name in reserved:
            raise OptionError(
                f"{who}: aggs[{i}] is named {call.name!r}, which the result already has "
                f"(partition_by {partition_by} and {list(reserved)}): give it another name "
                "with .alias(...)"
            )
        calls.append(call)
    return calls


def _analysis_error(who: str, i: int, agg: Column, df: DataFrame, e: Exception) -> OptionError:
    return OptionError(
        f"{who}: aggs[{i}]={agg} is not an aggregate Spark accepts here "
        f"({str(e).splitlines()[0]}); give an aggregate function over the columns "
        f"{df.columns}, e.g. F.max('flow')"
    )


def _not_mergeable(who: str, i: int, agg: Column) -> OptionError:
    supported = ", ".join(sorted(v for v in MERGEABLE.values()))
    return OptionError(
        f"{who}: aggs[{i}]={agg} is not an aggregate the window can keep: it must be one "
        f"plain aggregate function, one of {supported}, with no DISTINCT or FILTER and "
        "nothing around it (a pane keeps one partial result per aggregate and merges it batch "
        "by batch). Compute anything else from these after the window"
    )


def _split_jvm(df: DataFrame, agg: Column, i: int, partition_by: list[str], who: str) -> AggCall:
    """``agg_calls`` for one aggregate in classic Spark (Py4J)."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    empty = df.sparkSession.createDataFrame([], df.schema)
    try:
        one = empty.groupBy(*partition_by).agg(agg)
        analyzed = one._jdf.queryExecution().analyzed()
    except AnalysisException as e:
        raise _analysis_error(who, i, agg, df, e) from e
    exprs = analyzed.aggregateExpressions()
    alias = exprs.apply(exprs.size() - 1)
    node = alias.child()
    kind = None
    if node.getClass().getSimpleName() == "AggregateExpression":
        fn = node.aggregateFunction()
        kind = MERGEABLE.get(fn.getClass().getSimpleName())
        if node.isDistinct() or node.filter().isDefined():
            kind = None
    if kind is None:
        raise _not_mergeable(who, i, agg)
    children = [fn.children().apply(j) for j in range(fn.children().size())]
    return AggCall(
        alias.name(),
        kind,
        tuple(F.expr(c.sql()) for c in children),
        tuple(_non_null_literal(c) for c in children),
        one.schema.fields[-1],
        str(agg),
    )


#: Spark's names of the ``MERGEABLE`` functions in plan text (``prettyName``).
_PRETTY = {
    "count": "count",
    "sum": "sum",
    "min": "min",
    "max": "max",
    "avg": "avg",
    "mean": "avg",
    "max_by": "max_by",
    "min_by": "min_by",
}


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets and parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def _one_call(expr: str) -> tuple[str, list[str]] | None:
    """``("max", ["v#1"])`` for ``max(v#1)`` when the whole expression is one function call."""
    m = re.match(r"([a-z_]+)\(", expr)
    if m is None or not expr.endswith(")"):
        return None
    depth = 0
    for i in range(m.end() - 1, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[i], 0)
        if depth == 0 and i != len(expr) - 1:
            return None  # the call closes before the end: something follows it
    return m.group(1), _split_top(expr[m.end() : -1])


def _split_connect(
    df: DataFrame, agg: Column, i: int, partition_by: list[str], who: str
) -> AggCall:
    """``agg_calls`` for one aggregate under Spark Connect (plan text, no JVM)."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F
    from pyspark.sql.connect.column import Column as ConnectColumn
    from pyspark.sql.connect.expressions import (
        ColumnAlias,
        LiteralExpression,
        UnresolvedFunction,
        UnresolvedStar,
    )

    empty = df.sparkSession.createDataFrame([], df.schema)
    try:
        one = empty.groupBy(*partition_by).agg(agg)
        field = one.schema.fields[-1]
        root = parse_plan(analyzed_plan_text(one))
    except AnalysisException as e:
        raise _analysis_error(who, i, agg, df, e) from e
    # Aggregate [keys], [keys..., max(v#1) AS max_v#7] (no keys: the outputs only): the last
    # output is this aggregate.
    kind = None
    call = None
    if root is not None and root.name == "Aggregate":
        outputs = _split_top(root.args)[-1]
        if outputs.startswith("[") and outputs.endswith("]"):
            last = _split_top(outputs[1:-1])[-1]
            call = _one_call(last.rsplit(" AS ", 1)[0])
    if call is not None and not any(a.startswith("distinct ") for a in call[1]):
        kind = _PRETTY.get(call[0])
    if kind is None or call is None:
        raise _not_mergeable(who, i, agg)
    # The arguments, as the client wrote them (F.max(expr)): Spark computes them before the
    # step. An aggregate given as SQL text (F.expr("max(v)")) has no client-side arguments:
    # plain columns are taken by name, anything else must be written as a function column.
    expr: Any = getattr(agg, "_expr")  # noqa: B009 (the client's expression tree)
    while isinstance(expr, ColumnAlias):
        expr = expr._child
    args: tuple[Column, ...]
    if isinstance(expr, UnresolvedFunction) and len(expr._args) == len(call[1]):
        args = tuple(ConnectColumn(a) for a in expr._args)
        # count(*) and count(1) count rows: their argument is no input.
        literal = tuple((isinstance(a, LiteralExpression) and a._value is not None)
                        or isinstance(a, UnresolvedStar) for a in expr._args)  # fmt: skip
    elif all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*#\d+L?|1", a) for a in call[1]):
        args = tuple(F.col(a.split("#")[0]) if "#" in a else F.lit(1) for a in call[1])
        literal = tuple("#" not in a for a in call[1])
    else:
        raise OptionError(
            f"{who}: aggs[{i}]={agg}: under Spark Connect, give the aggregate as a function "
            "column over any expressions (F.max(F.col('a') * 2)), not as SQL text around "
            "expressions: the client cannot take SQL text apart"
        )
    return AggCall(field.name, kind, args, literal, field, str(agg))


def present_flag(call: AggCall) -> Column | None:
    """For ``count`` over arguments: 1 where all its non-literal arguments are not null, else
    0; None for ``count(*)``/``count(1)`` (the step counts the rows)."""
    from pyspark.sql import functions as F

    needed = [a for a, lit in zip(call.args, call.literal, strict=True) if not lit]
    if not needed:
        return None
    present = needed[0].isNotNull()
    for a in needed[1:]:
        present = present & a.isNotNull()
    return F.when(present, 1).otherwise(0)


def _plan_aggs(
    df: DataFrame, aggs: Sequence[Column], partition_by: list[str]
) -> tuple[list[AggPlan], list[Column], Any]:
    """The aggregates (``agg_calls``) as mergeable ``AggPlan`` s over the argument
    columns (computed by Spark before the step). Returns the plans, the argument columns and
    the output fields."""
    calls = agg_calls(df, aggs, partition_by, who="time_interval_aggregate", reserved=_RESERVED)
    plans: list[AggPlan] = []
    inputs: list[Column] = []
    by_key: dict[str, str] = {}
    for call in calls:
        if call.kind == "count":
            flag = present_flag(call)
            cols = [] if flag is None else [flag]
        else:
            cols = list(call.args)
        names = []
        for col in cols:  # one input column per distinct expression (max(v), max_by(id, v))
            key = repr(col)
            if key not in by_key:
                by_key[key] = f"__in{len(by_key)}"
                # Explicit metadata: an argument that is the rowtime itself must not carry the
                # watermark's mark, or Spark would drop late rows before the step (the module).
                inputs.append(col.alias(by_key[key], metadata=_INPUT_MARK))
            names.append(by_key[key])
        plans.append(AggPlan(call.kind, tuple(names)))
    return plans, inputs, [c.field for c in calls]


#: Spark types of the inputs that ``_arrow_partials`` reads as plain numpy numbers.
_ARROW_INPUTS = ("ByteType", "ShortType", "IntegerType", "LongType", "FloatType", "DoubleType")
#: Spark types of the keys it numbers in Arrow (``dictionary_encode``) and passes on as they are.
_ARROW_KEYS = (
    *_ARROW_INPUTS,
    "StringType",
    "BinaryType",
    "BooleanType",
    "DateType",
    "TimestampType",
    "TimestampNTZType",
    "DecimalType",
)


def _arrow_ready(schema: Any, keys: Sequence[str]) -> bool:
    """Whether the rows of ``schema`` (the keys, ``__t`` and the aggregates' inputs) can be
    pre-aggregated in Arrow: every input a plain number, every key of a type Arrow numbers."""
    for f in schema.fields:
        kinds = _ARROW_KEYS if f.name in keys else _ARROW_INPUTS
        if type(f.dataType).__name__ not in kinds:
            return False
    return True


def _chunks(batches: Iterator[Any]) -> Iterator[Any]:
    """The Arrow batches of a partition gathered into tables of about ``_CHUNK_ROWS`` rows."""
    held: list[Any] = []
    n = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        held.append(batch)
        n += batch.num_rows
        if n >= _CHUNK_ROWS:
            yield pa.Table.from_batches(held).combine_chunks()
            held, n = [], 0
    if held:
        yield pa.Table.from_batches(held).combine_chunks()


def _key_codes(table: Any, keys: Sequence[str]) -> np.ndarray:
    """Each row's key as a number (equal keys, equal numbers; null is a key of its own), in
    Arrow's hash tables: no Python object per row."""
    codes = np.zeros(table.num_rows, dtype=np.int64)
    for k in keys:
        column = table.column(k).combine_chunks().dictionary_encode(null_encoding="encode")
        these = np.asarray(column.indices, dtype=np.int64)
        codes = codes * len(column.dictionary) + these
        if len(keys) > 1:  # keep the numbers dense, so that the product cannot overflow
            codes = np.unique(codes, return_inverse=True)[1].astype(np.int64)
    return codes


def _arrow_partials(
    spec: TimeIntervalSpec, plans: list[AggPlan], table: Any, keys: Sequence[str]
) -> Any:
    """``step.preaggregate`` over an Arrow table of plain numbers (``_arrow_ready``), as an
    Arrow batch: the inputs go to numpy as they are (a null number as NaN, which the
    reductions skip, as the pandas rows of ``preaggregate`` hold it), the keys are numbered
    by Arrow and taken from the table, so they keep their Arrow type."""
    t = np.asarray(table.column("__t").combine_chunks().to_numpy(zero_copy_only=False),
                   dtype=np.int64)  # fmt: skip
    columns = {
        name: pd.Series(table.column(name).combine_chunks().to_numpy(zero_copy_only=False))
        for name in {i for p in plans for i in p.inputs}
    }
    key_rows, out = pane_partials(spec, plans, columns, t, _key_codes(table, keys))
    at = pa.array(key_rows, pa.int64())
    arrays = [table.column(k).take(at).combine_chunks() for k in keys]
    arrays += [pa.array(out[c], pa.int64()) for c in ("__start", "__end", "__n")]
    arrays.append(pa.array(out["__p"], pa.binary()))
    return pa.RecordBatch.from_arrays(arrays, names=[*keys, *PARTIAL_COLUMNS])


@dataclass(frozen=True)
class PanesConfig:
    """``time_interval_aggregate``'s checked parameters: the panes (``spec``), the mergeable
    aggregates over the step's input columns, the key columns and the aggregates' names."""

    spec: TimeIntervalSpec
    aggs: tuple[AggPlan, ...]
    keys: tuple[str, ...]
    agg_names: tuple[str, ...]


class PanesLogic(KeyLogic[PanesState]):
    """One key's panes: ``step.merge_panes`` over the key's partials, then the panes it
    emits as rows, and one more row (``__discarded`` > 0) carrying the rows discarded."""

    format = PANES_FORMAT

    def __init__(self, config: PanesConfig) -> None:
        self.config = config
        self._aggs = list(config.aggs)

    def step(
        self,
        key: tuple,
        frames: Iterator[pd.DataFrame],
        state: PanesState | None,
        watermark_ms: int,
    ) -> KeyStep[PanesState]:
        c = self.config
        result = merge_panes(c.spec, self._aggs, frames, state, watermark_ms)
        n = len(result.panes) + (1 if result.discarded else 0)
        if not n:
            return KeyStep([], result.state, result.timeout_ms)
        out: dict[str, Any] = {}
        for name, value in zip(c.keys, key, strict=False):
            out[name] = [value] * n
        starts = [p[0] for p in result.panes] + ([None] if result.discarded else [])
        ends = [p[1] for p in result.panes] + ([None] if result.discarded else [])
        out["interval_start"] = pd.to_datetime(pd.Series(starts, dtype="Int64"), unit="us",
                                               utc=True)  # fmt: skip
        out["interval_end"] = pd.to_datetime(pd.Series(ends, dtype="Int64"), unit="us", utc=True)
        for j, name in enumerate(c.agg_names):
            out[name] = [p[2][j] for p in result.panes] + ([None] if result.discarded else [])
        out["rowtime"] = out["interval_end"]
        out["__discarded"] = [0] * len(result.panes) + ([result.discarded] if result.discarded
                                                        else [])  # fmt: skip
        return KeyStep([pd.DataFrame(out)], result.state, result.timeout_ms)


def time_interval_aggregate(
    df: DataFrame,
    aggs: Column | Sequence[Column],
    *more_aggs: Column,
    interval_duration: object,
    creation_period: object = None,
    discard_age: object = 0.0,
    interval_offset: object = 0.0,
    partition_by: str | Sequence[str] = (),
    metric_name: str = "time_interval_aggregate",
) -> DataFrame:
    """Aggregate a ``format("rowtime")`` stream over IBM Streams ``timeInterval`` panes.

    Args:
        df: a streaming DataFrame from the rowtime reader, bound records included (this applies
            [`with_watermark`][pyspark_rowtime.watermark.with_watermark] itself).
        aggs: Spark aggregate columns (``count``, ``sum``, ``avg``, ``min``, ``max``, ``max_by``,
            ``min_by`` over any expressions of ``df``'s columns): one, a list, or one after
            another (``*more_aggs``), as ``groupBy().agg(...)`` takes them.
        *more_aggs: more aggregate columns, after the first.
        interval_duration: pane length, seconds (a number or a string such as ``"50 seconds"``);
            ``> 0``.
        creation_period: distance between pane starts, ``> 0``; default ``interval_duration``
            (tumbling panes).
        discard_age: how long after a pane's end late rows still re-trigger it; ``>= 0``.
        interval_offset: a pane start, in ``[0, interval_duration)``. Pane ``N`` is
            ``[N * creation_period + interval_offset, ... + interval_duration)`` (half open,
            0 at the Unix epoch).
        partition_by: column names; each key has its own panes.
        metric_name: the name of the observed metric ``discarded_rows`` (rows per micro-batch
            that came too late for every pane they belong to, or fell in no pane); it must be
            unique among the query's observations.

    Returns:
        A streaming DataFrame (for output mode ``append``) with the ``partition_by`` columns,
        ``interval_start``, ``interval_end`` (TIMESTAMP, the pane's half-open ``[start, end)``),
        the aggregates and ``rowtime = interval_end``. A pane is emitted once, when the
        watermark reaches its end, and again, corrected, after late rows (see the module).

    Raises:
        OptionError: a parameter breaks its rule (named, with the value), a partition column
            is missing, or an aggregate is not one the window can keep. Nothing has started.

    Examples:
        The highest speed of each sensor in panes of 10 seconds:

        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> from pyspark.sql import functions as F
        >>> path = tempfile.mkdtemp()
        >>> _ = rt.create_stream(path + "/speeds", "sensor STRING, speed DOUBLE")
        >>> with rt.open_writer(path + "/speeds") as w:
        ...     w.insert({"sensor": "a", "speed": 61.5}, rowtime="2026-12-02T10:00:01Z")
        ...     w.insert({"sensor": "a", "speed": 70.0}, rowtime="2026-12-02T10:00:04Z")
        ...     w.insert({"sensor": "a", "speed": 52.0}, rowtime="2026-12-02T10:00:12Z")
        ...     w.set_rowtime_bound("2026-12-02T10:00:30Z")
        >>> speeds = spark.readStream.format("rowtime").load(path + "/speeds")
        >>> fastest = rt.time_interval_aggregate(
        ...     speeds, F.max("speed").alias("top"), interval_duration="10 seconds",
        ...     partition_by="sensor")
        >>> query = (fastest.writeStream.format("memory").queryName("fastest")
        ...     .option("checkpointLocation", path + "/chk").trigger(availableNow=True).start())
        >>> query.awaitTermination()
        >>> for r in spark.table("fastest").orderBy("interval_start").collect():
        ...     print(r.sensor, r.interval_start.time(), r.interval_end.time(), r.top)
        a 10:00:00 10:00:10 70.0
        a 10:00:10 10:00:20 52.0
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        StructField,
        StructType,
        TimestampType,
    )

    spec = make_spec(interval_duration, creation_period, discard_age, interval_offset)
    keys = [partition_by] if isinstance(partition_by, str) else list(partition_by)
    payload = [c for c in df.columns if c not in _RESERVED]
    for k in keys:
        if not isinstance(k, str) or k not in payload:
            raise OptionError(
                f"time_interval_aggregate: partition_by={partition_by!r}: {k!r} is not a "
                f"payload column of df; give names among {payload}"
            )
    agg_list = agg_columns(aggs, more_aggs, "time_interval_aggregate")
    if "rowtime" not in df.columns or "is_bound" not in df.columns:
        raise OptionError(
            "time_interval_aggregate: df must be a format('rowtime') stream with its columns "
            f"rowtime and is_bound (bound records included); got columns {df.columns}"
        )
    plans, inputs, agg_fields = _plan_aggs(df, agg_list, keys)

    key_fields = [df.schema[k] for k in keys]
    group_cols = keys or ["__key"]
    # A union of rowtime streams is allowed below this watermark: late rows re-trigger their
    # pane or are counted as discarded here, never dropped by Spark.
    rows = watermark_rowtime(df, late_rows_handled=True).select(
        *([F.col(k) for k in keys] or [F.lit(0).alias("__key")]),
        F.unix_micros("rowtime").alias("__t"),
        *inputs,
    )
    partial_schema = StructType(
        [
            *(key_fields or [StructField("__key", IntegerType(), False)]),
            StructField("__start", LongType(), False),
            StructField("__end", LongType(), False),
            StructField("__n", LongType(), False),
            StructField("__p", BinaryType()),
        ]
    )

    arrow = _arrow_ready(rows.schema, group_cols)
    if arrow:
        # Plain numbers only (the common case): Arrow batches straight to numpy, no pandas
        # rows (see _arrow_partials).
        def preaggregate_batches(batches: Iterator[Any]) -> Iterator[Any]:
            for table in _chunks(batches):
                yield _arrow_partials(spec, plans, table, group_cols)

        partials = rows.mapInArrow(preaggregate_batches, schema=partial_schema)
    else:

        def preaggregate_partition(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            held: list[pd.DataFrame] = []
            n = 0
            for frame in frames:
                if not len(frame):
                    continue
                held.append(frame)
                n += len(frame)
                if n >= _CHUNK_ROWS:
                    yield preaggregate(spec, plans, pd.concat(held, ignore_index=True),
                                       group_cols)  # fmt: skip
                    held, n = [], 0
            if held:
                yield preaggregate(spec, plans, pd.concat(held, ignore_index=True), group_cols)

        partials = rows.mapInPandas(preaggregate_partition, schema=partial_schema)
    partials = partials.select(
        "*",
        never_late(),  # every partial reaches the step, which decides what is late
    )
    out_schema = StructType(
        [
            *key_fields,
            StructField("interval_start", TimestampType()),
            StructField("interval_end", TimestampType()),
            *agg_fields,
            StructField("rowtime", TimestampType()),
            StructField("__discarded", LongType(), False),
        ]
    )
    config = PanesConfig(spec, tuple(plans), tuple(keys), tuple(f.name for f in agg_fields))
    plan = StatefulPlan(
        group_by=group_cols,
        output=out_schema,
        state_field="panes",
        metric_name=metric_name,
        metrics=[F.coalesce(F.sum("__discarded"), F.lit(0)).alias("discarded_rows")],
        results=F.col("__discarded") == 0,
    )
    return run_on_state_store(partials, PanesLogic(config), plan).drop("__discarded")

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

**Keys by the bucket** (``spark.rowtime.state.buckets`` = ``B`` > 0, a session setting read when
the query is defined; default 0, a group per key). Spark's worker pays for every group it calls:
the key's rows sliced from Arrow into pandas, its state read and written, its output frame
turned back into Arrow; with thousands of keys and a few rows each per micro-batch that cost,
not the steps, decides the speed (the floors on docs/benchmarks.md). With ``B`` buckets the rows
are grouped by ``pmod(xxhash64(keys), B)`` instead: one call per bucket and micro-batch runs the
step of each of its keys that has rows, then of each it keeps whose timeout the watermark passed
(as Spark would have called them), and stores them all in one value: each key's state in its
operator's own format, with its timeout (``BUCKET_FORMAT``); the bucket's timeout is the
earliest of its keys'. What comes out is what a group per key gives, row for row. The state
store's key is then the bucket, so the layout is fixed for a checkpoint's life: a query started
per key (every checkpoint of 0.1.0 and 0.2.0) goes on with 0, one started with ``B`` goes on
with ``B``. A bucket read with another ``B`` stops the query with an error naming the ``B`` the
checkpoint needs; between a group per key and buckets, Spark refuses the checkpoint as the query
starts (its state store's key is another), or, where the keys have the bucket's type, the first
state read says which setting the checkpoint needs. The bucket of a key is Spark's ``xxhash64``
of the key columns (seed 42), the same in every release.

Why ``applyInPandasWithState`` (and not ``transformWithStateInPandas``): it runs on any state
store provider (the other needs RocksDB and protobuf), and one event-time timer per key is all
the operators' rules need. Spark wants one watermarked input column before it allows an
event-time timeout, and drops the rows whose marked column is at or below the watermark: each
operator's input carries ``never_late``, which holds the mark and a value no watermark reaches,
so every row reaches the step and the step decides what is late.
"""

from __future__ import annotations

import base64
import binascii
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np
import pandas as pd

from ..bounds.errors import CorruptLogError, OptionError
from .step import StateFormat, load_values

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

__all__ = [
    "BUCKETS_CONF",
    "BUCKET_FORMAT",
    "BucketState",
    "KeyLogic",
    "KeyStep",
    "StatefulPlan",
    "as_frames",
    "key_column",
    "never_late",
    "rows_column",
    "run_on_state_store",
    "state_buckets",
    "step_bucket",
]

S = TypeVar("S")

#: Spark's mark of the watermarked column (``EventTimeWatermark.delayKey``).
WATERMARK_KEY = "spark.watermarkDelayMs"
#: The highest long: no watermark (in microseconds) reaches it.
NEVER_LATE = 2**63 - 1


@dataclass(frozen=True)
class KeyStep(Generic[S]):
    """What one step decided for one key: the ``frames`` to emit (result rows and metric rows,
    in the operator's output schema; each a DataFrame or its columns, a dict of name to array
    as ``pd.DataFrame`` takes it, which a bucket of keys joins into one frame: ``as_frames``),
    the ``state`` to keep (None: nothing, the key's state is removed) and ``timeout_ms``: wake
    the key once Spark's watermark is above it, even with no rows (None: no timer; a kept state
    of the join and of ``interval_aggregate`` always has one)."""

    frames: list[pd.DataFrame | dict[str, Any]]
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


#: From this many rows on, ``as_frames`` gives a frame's integer and boolean columns pandas'
#: masked types (see there); below it the conversion costs more than it saves.
MASKED_FROM_ROWS = 1024


def _masked(frame: dict[str, Any], rows: int) -> dict[str, Any]:
    # Spark's worker joins a call's frames with an empty frame of None columns before turning
    # them into Arrow, which makes every int64 or bool numpy column an object column, then
    # converted value by value (docs/benchmarks.md, validity intervals). pandas' masked arrays
    # keep their type there; made with an all-false mask, they share the values.
    if rows < MASKED_FROM_ROWS:
        return frame
    out = {}
    for name, column in frame.items():
        if isinstance(column, np.ndarray) and column.dtype == np.int64:
            column = pd.arrays.IntegerArray(column, np.zeros(len(column), dtype=bool))
        elif isinstance(column, np.ndarray) and column.dtype == np.bool_:
            column = pd.arrays.BooleanArray(column, np.zeros(len(column), dtype=bool))
        out[name] = column
    return out


def as_frames(items: Sequence[pd.DataFrame | dict[str, Any]]) -> list[pd.DataFrame]:
    """What steps emitted, as the DataFrames Spark takes: the frames as they are, the column
    dicts joined into one frame (each column's parts end to end, in the steps' order: one
    frame per call, where a frame per key cost more than a key's step), its integer and
    boolean columns masked from ``MASKED_FROM_ROWS`` rows on (``_masked``)."""
    frames = [f for f in items if isinstance(f, pd.DataFrame)]
    dicts = [f for f in items if not isinstance(f, pd.DataFrame)]
    if not dicts:
        return frames
    merged: dict[str, Any] = dicts[0]
    if len(dicts) > 1:
        merged = {}
        for name in dicts[0]:
            parts = [d[name] for d in dicts]
            if all(isinstance(p, np.ndarray) for p in parts):
                merged[name] = np.concatenate(parts)
            else:
                # A list or a pandas array among them (a key pandas infers, a step's lone
                # null): one object column, each value as it is, as Spark's own join of the
                # frames would make it (a list would let pandas turn ints beside None into
                # floats).
                merged[name] = pd.concat(
                    [pd.Series(p, dtype=object) for p in parts], ignore_index=True
                ).to_numpy()
    rows = len(next(iter(merged.values()))) if merged else 0
    frames.append(pd.DataFrame(_masked(merged, rows)))
    return frames


def key_column(value: Any, size: int) -> Any:
    """A key's value repeated ``size`` times, as a column of the frame a step emits: a numpy
    array of the value's own type for a bool, a 64-bit integer, a float or a string (what
    pandas would infer from a list, without inferring it per row, which cost more than the
    step for a key of a few rows), else a list as before (pandas infers timestamps, decimals
    and the rest)."""
    if isinstance(value, (bool, np.bool_)):
        return np.full(size, bool(value))
    if isinstance(value, (int, np.integer)) and -(2**63) <= value < 2**63:
        return np.full(size, value, dtype=np.int64)
    if isinstance(value, (float, np.floating)):
        return np.full(size, value, dtype=np.float64)
    if isinstance(value, str):
        column = np.empty(size, dtype=object)
        column.fill(value)
        return column
    return [value] * size


def rows_column(values: Sequence[Any], size: int) -> np.ndarray:
    """``values`` (a struct column's rows: dicts, tuples or None) then None up to ``size``, as
    one object array: pandas takes it as it is, where a list of dicts is inspected row by row.
    ``np.fromiter`` keeps a tuple one element (an array built from a list would split it)."""
    column = np.empty(size, dtype=object)  # None throughout
    column[: len(values)] = np.fromiter(values, dtype=object, count=len(values))
    return column


def never_late() -> Column:
    """The column every operator's input carries so that Spark allows an event-time timeout
    and drops no row before the step (see the module)."""
    from pyspark.sql import functions as F

    return F.lit(NEVER_LATE).cast("long").alias("__never_late", metadata={WATERMARK_KEY: 1})


#: The session setting that groups keys into buckets (see the module); 0: a group per key.
BUCKETS_CONF = "spark.rowtime.state.buckets"
#: The most buckets: more would be groups of about one key, as without them.
MAX_BUCKETS = 1 << 20


@dataclass(frozen=True)
class BucketState:
    """The stored state of one bucket (``BUCKET_FORMAT``): how many ``buckets`` the query was
    started with, and for each key kept (the key's values, as Spark gives them to a step) its
    state in its operator's own format and its timeout (ms; None: none)."""

    buckets: int
    keys: dict[tuple[Any, ...], tuple[bytes, int | None]]


def _write_bucket(state: BucketState) -> dict[str, Any]:
    return {"buckets": state.buckets, "keys": list(state.keys.items())}


def _read_bucket(plain: Any) -> BucketState:
    if not isinstance(plain, dict) or "buckets" not in plain:
        raise _layout_error(per_key_found=True)
    keys: dict[tuple[Any, ...], tuple[bytes, int | None]] = {}
    for key, (blob, timeout) in plain["keys"]:
        keys[tuple(key)] = (bytes(blob), None if timeout is None else int(timeout))
    return BucketState(int(plain["buckets"]), keys)


#: How a bucket of keys is stored (``step.StateFormat``).
BUCKET_FORMAT = StateFormat("a bucket of keys", 1, _write_bucket, {1: _read_bucket})


def _layout_error(*, per_key_found: bool, buckets: int = 0, found: int = 0) -> CorruptLogError:
    if per_key_found:
        return CorruptLogError(
            f"this query's checkpoint keeps one state per key ({BUCKETS_CONF}=0, the default, "
            f"and every checkpoint of 0.1.0 and 0.2.0), but the query was defined with "
            f"{BUCKETS_CONF} set: the layout is fixed for a checkpoint's life; define the "
            f"query with {BUCKETS_CONF}=0 to go on from it (or start a new checkpoint)"
        )
    if buckets == 0:
        return CorruptLogError(
            f"this query's checkpoint keeps its keys in {found} buckets ({BUCKETS_CONF}="
            f"{found} when it started), but the query was defined with {BUCKETS_CONF}=0: the "
            f"layout is fixed for a checkpoint's life; define the query with {BUCKETS_CONF}="
            f"{found} to go on from it"
        )
    return CorruptLogError(
        f"this query's checkpoint keeps its keys in {found} buckets ({BUCKETS_CONF}={found} "
        f"when it started), but the query was defined with {BUCKETS_CONF}={buckets}: a key "
        f"would be looked for in another bucket than its state; define the query with "
        f"{BUCKETS_CONF}={found} to go on from it"
    )


#: From this many bytes on, a stored value is kept as base64 text (see ``to_store``).
ARMOR_FROM_BYTES = 16 * 1024


def to_store(blob: bytes) -> bytes:
    """A state's bytes as kept in Spark's state store: from ``ARMOR_FROM_BYTES`` on, as base64
    text. Spark's JVM hands the stored value back to Python with every chunk of a group's
    rows (up to ``spark.sql.execution.arrow.maxRecordsPerBatch`` each), through a pickler that
    builds a string of its bytes and encodes it as UTF-8 byte by byte unless every byte is
    ASCII: for a key that keeps a micro-batch of rows, that cost more than the step. Text
    takes the pickler's fast path at a third more bytes; what an operator's format wrote
    (a pickle, whose first byte is 0x80, never a base64 character) is read either way."""
    return base64.b64encode(blob) if len(blob) >= ARMOR_FROM_BYTES else blob


def from_store(value: bytes, what: str) -> bytes:
    """The bytes ``to_store`` kept (a pickle as every release stored it, or base64 text).

    Raises:
        CorruptLogError: text that is not base64 (an altered state store), naming ``what``.
    """
    if value[:1] == b"\x80":
        return value
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise CorruptLogError(
            f"the state of {what} in this query's checkpoint is neither a pickle nor base64 "
            f"text ({e}): the checkpoint's state store was altered; restore the checkpoint "
            "from a backup"
        ) from e


def _is_bucket(blob: bytes) -> int | None:
    """The ``buckets`` of a stored bucket (None: ``blob`` is no bucket)."""
    try:
        value = load_values(blob, "a bucket of keys")
    except Exception:
        return None
    plain = value.get("state") if isinstance(value, dict) else None
    if isinstance(plain, dict) and "buckets" in plain and "keys" in plain:
        return int(plain["buckets"])
    return None


def state_buckets(spark: Any) -> int:
    """``spark.rowtime.state.buckets`` of the session (0 when unset).

    Raises:
        OptionError: not a whole number in ``[0, MAX_BUCKETS]``.
    """
    raw = spark.conf.get(BUCKETS_CONF, "0")
    text = "0" if raw is None else str(raw).strip()
    try:
        buckets = int(text)
    except ValueError:
        buckets = -1
    if not 0 <= buckets <= MAX_BUCKETS:
        raise OptionError(
            f"{BUCKETS_CONF}={raw!r} must be a whole number from 0 (a state per key, the "
            f"default) to {MAX_BUCKETS}, e.g. 256 for thousands of keys; it is fixed for a "
            "checkpoint's life"
        )
    return buckets


def _lookup(key: tuple[Any, ...]) -> tuple[Any, ...]:
    # A key as a dict key: NaN (a null of a number column in pandas) equals itself here.
    return tuple(None if isinstance(v, float) and v != v else v for v in key)


def step_bucket(
    logic: KeyLogic[Any],
    keys: Sequence[str],
    buckets: int,
    frames: Iterator[pd.DataFrame],
    stored: BucketState | None,
    watermark_ms: int,
) -> tuple[list[pd.DataFrame], BucketState | None, int | None]:
    """One call for one bucket: the step of each of its keys with rows (in the order their
    first rows came; each key's rows in arrival order), then of each key kept whose timeout the
    watermark passed (Spark fires a timeout ``T`` once the watermark is above ``T``). Returns
    the frames to emit, the bucket's state (None: no key kept) and its timeout (the earliest
    of its keys'; None: none)."""
    kept = dict(stored.keys) if stored is not None else {}
    out: list[pd.DataFrame | dict[str, Any]] = []
    fmt = logic.format

    def run(key: tuple[Any, ...], rows: Iterator[pd.DataFrame], lookup: tuple[Any, ...]) -> None:
        blob, _ = kept.pop(lookup, (None, None))
        old = None if blob is None else fmt.loads(blob)
        decided = logic.step(key, rows, old, watermark_ms)
        out.extend(decided.frames)
        if decided.state is not None:
            kept[lookup] = (fmt.dumps(decided.state), decided.timeout_ms)

    parts = [f for f in frames if len(f)]
    stepped: set[tuple[Any, ...]] = set()
    if parts:
        frame = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        for _, rows in frame.groupby(list(keys), sort=False, dropna=False):
            # The key as Spark gives it to a step: each key column's first value.
            key = tuple(rows[c].iloc[0] for c in keys)
            lookup = _lookup(key)
            stepped.add(lookup)
            rows.index = pd.RangeIndex(len(rows))  # a frame of its own: as Spark hands a key's
            run(key, iter([rows]), lookup)
    for lookup, (_, timeout) in list(kept.items()):
        if lookup not in stepped and timeout is not None and watermark_ms > timeout:
            run(lookup, iter([]), lookup)
    if not kept:
        return as_frames(out), None, None
    timeouts = [t for _, t in kept.values() if t is not None]
    return as_frames(out), BucketState(buckets, kept), min(timeouts) if timeouts else None


def run_on_state_store(rows: DataFrame, logic: KeyLogic[Any], plan: StatefulPlan) -> DataFrame:
    """Run ``logic`` per key and micro-batch over ``rows`` on Spark's state store, observe the
    plan's metrics and keep the result rows (output mode ``append``); with
    ``spark.rowtime.state.buckets`` set, per bucket of keys (see the module).

    Raises:
        OptionError: ``spark.rowtime.state.buckets`` is not a whole number in range.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout
    from pyspark.sql.types import ArrayType, BinaryType, MapType, StructField, StructType

    state_format = logic.format
    buckets = state_buckets(rows.sparkSession)
    keys = list(plan.group_by)

    def call(key: tuple, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        old = None
        if state.exists:
            blob = from_store(state.get[0], state_format.what)
            try:
                old = state_format.loads(blob)
            except Exception:
                found = _is_bucket(blob)
                if found is not None:
                    raise _layout_error(per_key_found=False, found=found) from None
                raise
        decided = logic.step(key, frames, old, state.getCurrentWatermarkMs())
        if decided.state is None:
            if state.exists:
                state.remove()
        else:
            state.update((to_store(state_format.dumps(decided.state)),))
            if decided.timeout_ms is not None:
                state.setTimeoutTimestamp(decided.timeout_ms)
        yield from as_frames(decided.frames)

    def call_bucket(
        bucket: tuple, frames: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        stored = None
        if state.exists:
            stored = BUCKET_FORMAT.loads(from_store(state.get[0], BUCKET_FORMAT.what))
        if stored is not None and stored.buckets != buckets:
            raise _layout_error(per_key_found=False, buckets=buckets, found=stored.buckets)
        watermark = state.getCurrentWatermarkMs()
        out, kept, timeout = step_bucket(logic, keys, buckets, frames, stored, watermark)
        if kept is None:
            if state.exists:
                state.remove()
        else:
            state.update((to_store(BUCKET_FORMAT.dumps(kept)),))
            if timeout is not None:
                state.setTimeoutTimestamp(timeout)
        yield from out

    state_type = StructType([StructField(plan.state_field, BinaryType())])
    nested = [
        k for k in keys if isinstance(rows.schema[k].dataType, (ArrayType, MapType, StructType))
    ]
    if buckets and nested:
        raise OptionError(
            f"{BUCKETS_CONF}={buckets}: the key column(s) {nested} hold arrays, maps or structs, "
            "which a bucket cannot tell apart by value; unset it (a state per key) or key by "
            "plain columns"
        )
    if buckets:
        bucket = F.pmod(F.xxhash64(*[F.col(k) for k in keys]), F.lit(buckets)).cast("int")
        grouped = rows.withColumn("__bucket", bucket).groupBy("__bucket")
        func: Any = call_bucket
    else:
        grouped = rows.groupBy(*keys)
        func = call
    stateful = grouped.applyInPandasWithState(
        func,
        outputStructType=plan.output,
        stateStructType=state_type,
        outputMode="append",
        timeoutConf=GroupStateTimeout.EventTimeTimeout,
    )
    return stateful.observe(plan.metric_name, *plan.metrics).where(plan.results)

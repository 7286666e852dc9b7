"""``with_watermark``: Spark's watermark on ``rowtime``, fed by the reader's bound records.

The promise (SPEC 7): a bound record alone moves Spark's watermark and closes whatever it
should, whatever the user writes after ``with_watermark``. Two things stand in its way, both in
Spark's optimizer, and this module answers each.

**Predicates are pushed below the watermark.** ``PushPredicateThroughNonJoin`` moves any
*deterministic* predicate that does not reference the event-time column through
``EventTimeWatermark`` (SPARK-21587), and it moves filters through deterministic projections
on the way. A bound record has a null payload, so the user's ``where("k = 'a'")``, a
``na.drop()``, a UDF filter, or the ``isnotnull(key)`` that ``InferFiltersFromConstraints``
adds on each side of a join would all remove the bound records before the watermark sees them:
the watermark then follows data only, and the last windows of a quiet stream never close.

The fix is a barrier the optimizer respects. ``with_watermark`` removes the bound records with a
filter directly above the watermark node whose condition is *non-deterministic*
(``spark_partition_id() >= 0``, always true, one integer compare per row):

- ``CombineFilters`` merges a filter into the one below only if the lower one is deterministic,
  so a later filter is not merged into ours;
- ``PushPredicateThroughNonJoin`` pushes a filter only through the operators it lists
  (``canPushThrough``: projections, sorts, repartitions, ...); a filter is not among them, so
  nothing written later moves past ours, and ours is not pushed below the watermark because it
  is not deterministic (nor would its conjunct on ``rowtime`` be).

So every predicate the user writes, or Spark infers, stops above the barrier, where the bound
records are already gone and the watermark has seen them. A test shows the optimized plan of
each query shape (filters, projections, ``na.drop``, UDF filters, joins on keys,
``dropDuplicatesWithinWatermark``, unions) with no filter between a ``rowtime`` source and its
watermark.

**What cannot be protected is refused or named.** Nothing placed *before* ``with_watermark`` can
be protected: a filter there removes bound records before the watermark node exists, and one
watermark over the union of two rowtime streams follows the faster one (Spark's watermark is the
maximum event time it saw) and drops the slower one's rows as late. ``with_watermark`` refuses
both when it is called (``QueryShapeError``, naming the operator and what to write
instead). A query that calls Spark's own ``withWatermark("rowtime", ...)`` without the helper
lets bound records through as rows (counted, joined, deduplicated) and lets filters freeze its
watermark; ``watch_queries`` (installed by the first ``with_watermark`` call of a session)
checks every query that session starts and logs a warning naming the fix. ``check_query``
runs the same check on demand (say, in a test of your own job).

Every check reads Spark's *analyzed* plan as text (``analyzed_plan_text``), the same way in
classic Spark and under Spark Connect, whose client has no JVM: one reading, so the two modes
cannot give different findings.
"""

from __future__ import annotations

import atexit
import logging
import re
import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .bounds.errors import QueryShapeError
from .bounds.time import parse_duration_us

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("pyspark_rowtime")

#: The smallest delay Spark does not truncate to zero: it keeps watermarks in milliseconds.
_MIN_DELAY_US = 1000

#: How the barrier reads in Spark's plan text (lower case); ``check_plan`` looks for it.
_BARRIER_SQL = "spark_partition_id() >= 0"

#: Operators that may stand between the reader and its watermark: they do not remove rows
#: (column selection and renaming, names for the plan). A union is judged by how many rowtime
#: streams it mixes (one watermark over two of them runs ahead of the slower one).
_TRANSPARENT = {"Project", "SubqueryAlias", "View", "ResolvedHint", "Union"}

#: What to write instead, shared by the error and the warning.
_RULE = (
    "call pyspark_rowtime.with_watermark(df) directly on each spark.readStream.format('rowtime')"
    " DataFrame, then write filters, joins, unions and aggregations after it"
)


def with_watermark(df: DataFrame, delay: Any = None) -> DataFrame:
    """Spark's watermark on ``rowtime``, moved by the reader's bound records (SPEC 7).

    Applies ``withWatermark("rowtime", ...)`` and removes the bound records after it, behind a
    barrier that keeps everything written later above the watermark, so that a filter, a join
    or Spark's inferred ``isnotnull`` cannot remove the bound records before the watermark sees
    them. Union streams after calling this on each: Spark then takes the minimum of their
    watermarks, as the stream clock would.

    Args:
        df: the reader's output (columns ``rowtime`` and ``is_bound``), at most with columns
            selected or renamed.
        delay: how late a row may come (seconds, a ``timedelta`` or a string such as
            ``"5s"``), raised to at least one millisecond: Spark drops rows *below or at* the
            watermark it derives from a batch and keeps it in whole milliseconds, so with a
            delay under 1 ms a later row exactly at the last bound would count as late. The
            price: a window ending exactly at a bound closes once a bound at least 1 ms past
            its end arrives.

    Returns:
        ``df`` with its watermark, without the bound records and the ``is_bound`` column.

    Raises:
        QueryShapeError: a filter, a join, an aggregation or a union of two rowtime streams
            below the watermark, which would let the watermark run past rows still to come or
            stop it; the message names the operator and what to write instead.

    Examples:
        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> path = tempfile.mkdtemp() + "/speeds"
        >>> _ = rt.create_stream(path, "sensor STRING, speed DOUBLE")
        >>> df = spark.readStream.format("rowtime").load(path)
        >>> rt.with_watermark(df, "5s").columns
        ['sensor', 'speed', 'rowtime']
        >>> rt.with_watermark(df.where("speed > 50"))
        Traceback (most recent call last):
        ...
        pyspark_rowtime.bounds.errors.QueryShapeError: ...
    """
    return watermark_rowtime(df, delay)


def watermark_rowtime(
    df: DataFrame, delay: Any = None, *, late_rows_handled: bool = False
) -> DataFrame:
    """``with_watermark`` for operators of this project that handle late rows themselves.

    ``late_rows_handled=True`` lets one watermark stand over a union of rowtime streams: an
    operator such as ``time_interval_aggregate`` never lets Spark drop a row as late (it
    re-triggers the row's pane, or counts it as discarded past ``discard_age``), so a watermark
    that follows the faster stream costs corrections, not rows. Filters below the watermark
    are refused either way.
    """
    from pyspark.sql import functions as F

    if "rowtime" not in df.columns or "is_bound" not in df.columns:
        raise QueryShapeError(
            "with_watermark needs the columns rowtime and is_bound of a format('rowtime') stream;"
            f" got columns {df.columns}"
        )
    _refuse_unprotectable(df, late_rows_handled)
    delay_us = _MIN_DELAY_US if delay is None else parse_duration_us(delay, what="delay")
    delay_us = max(_MIN_DELAY_US, delay_us)
    watermarked = df.withWatermark("rowtime", f"{delay_us} microseconds")
    # The predicate references rowtime, so it would not be pushed below the watermark anyway;
    # the non-deterministic conjunct is what keeps every *later* predicate above this one.
    data_rows = F.when(F.col("rowtime").isNotNull(), ~F.col("is_bound")).otherwise(F.lit(False))
    barrier = F.spark_partition_id() >= 0
    result = watermarked.where(data_rows & barrier).drop("is_bound")
    spark = df.sparkSession
    available_now_runs_no_data_batches(spark)
    try:
        watch_queries(spark)
    except Exception as e:  # the check is a help, never a reason to fail the user's query
        log.debug("pyspark_rowtime: could not watch queries: %s", e)
    return result


#: Spark's setting that gives ``trigger(availableNow=True)`` its meaning for a source that does
#: not implement ``SupportsTriggerAvailableNow`` itself (default false).
AVAILABLE_NOW_WRAPPER = "spark.sql.streaming.triggerAvailableNowWrapper.enabled"


def available_now_runs_no_data_batches(spark: SparkSession) -> None:
    """On Spark 4.1, turn on ``AVAILABLE_NOW_WRAPPER`` in ``spark`` (unless set already).

    Every Python stream source on 4.1 lacks ``SupportsTriggerAvailableNow`` (new in 4.2), and
    with the setting off (its default) Spark runs an ``availableNow`` query over one as
    ``Trigger.Once``: a single micro-batch and never the no-data batch that applies its
    watermark. A window, a ``time_interval_aggregate`` pane or an interval join's row that the
    run's last bound closes is then withheld until the next run, run after run, without an
    error. With the setting on, Spark wraps the source (``AvailableNowDataStreamWrapper``): the
    run reads the backlog in one micro-batch (Spark 4.1 sets no read limit) and then runs the
    no-data batches, as 4.2 and later do. Spark reads the setting when a query starts, so
    setting it here, before ``start()``, covers every query built on this DataFrame. A session
    where the user set it to false keeps it, with a warning naming the cost.
    """
    try:
        version = str(spark.version)
        if not version.startswith("4.1."):
            return
        current = spark.conf.get(AVAILABLE_NOW_WRAPPER, None)
        if current is None:
            spark.conf.set(AVAILABLE_NOW_WRAPPER, "true")
            log.info(
                "pyspark_rowtime: Spark %s: set %s=true, so that availableNow queries run the "
                "no-data batch that emits what their last bound closes",
                version,
                AVAILABLE_NOW_WRAPPER,
            )
        elif str(current).strip().lower() != "true":
            log.warning(
                "pyspark_rowtime: Spark %s with %s=%s runs a trigger(availableNow=True) query "
                "over format('rowtime') as Trigger.Once: one micro-batch and no no-data batch, "
                "so windows and panes its last bound closes are withheld until the next run. "
                "Unset it (pyspark_rowtime sets it to true), use a processingTime trigger, or "
                "run Spark 4.2 or later",
                version,
                AVAILABLE_NOW_WRAPPER,
                current,
            )
    except Exception as e:  # a help for 4.1; never a reason to fail the user's query
        log.debug("pyspark_rowtime: could not check %s: %s", AVAILABLE_NOW_WRAPPER, e)


# -- reading Spark's analyzed plans, as text (classic Spark and Spark Connect alike) -----------
#
# One reading serves both modes, so their findings cannot drift: the "== Analyzed Logical Plan =="
# section of Spark's extended explain text. A Spark Connect client gets it from the server's
# analyze RPC (no JVM in the client); classic Spark from the same server-side function through
# Py4J. The analyzed plan shows what the user wrote, in the user's order (the optimized one shows
# what Spark already pushed below the watermark). The text is Spark's tree string: a node per
# line, three columns per level, ``+- `` or ``:- `` before a child, ``~`` before a streaming
# node; attributes carry ``#ids`` and watermarked ones ``-T<delay>ms``; string literals lose
# their quotes (a filter reads ``(k = a)``).

_ANALYZED = "== Analyzed Logical Plan =="
_LEVEL = re.compile(r"^((?:   |:  )*)([+:]- )?")
_NAME = re.compile(r"[~'!]*([A-Za-z][A-Za-z0-9_]*)(?= |\[|$)")


@dataclass
class PlanNode:
    """One operator of a plan read from Spark's text: its name (``Filter``), the rest of its
    line (``(k#0 = a)``) and its children."""

    name: str
    args: str
    children: list[PlanNode] = field(default_factory=list)


def parse_plan(tree: str) -> PlanNode | None:
    """The tree of Spark's plan text (one section of ``explain(extended=True)``, or a
    ``treeString``), or None if it has no node. Lines that are not operators (the output
    schema, an expression's subquery plan) are skipped."""
    root: PlanNode | None = None
    path: list[PlanNode] = []
    for line in tree.splitlines():
        level = _LEVEL.match(line)
        assert level is not None  # the pattern matches every string
        depth = len(level.group(1)) // 3 + (1 if level.group(2) else 0)
        rest = line[level.end() :]
        name = _NAME.match(rest)
        if name is None or (depth == 0) != (not level.group(0)):
            continue
        node = PlanNode(name.group(1), rest[name.end() :].strip())
        if depth == 0:
            if root is not None:
                break  # a second root: the next section
            root = node
        elif len(path) >= depth:
            path[depth - 1].children.append(node)
        else:
            continue  # an expression's inner plan (printed two levels deeper): not an operator
        path = [*path[:depth], node]
    return root


def analyzed_plan_text(df: DataFrame) -> str:
    """Spark's analyzed logical plan of ``df``, as the text ``explain(extended=True)`` prints,
    without the JVM in a Spark Connect client."""
    frame: Any = df  # the private attributes of either mode's DataFrame
    if _is_connect(df):
        text = str(frame._explain_string(mode="extended"))
    else:
        jvm = frame.sparkSession._jvm
        text = str(jvm.PythonSQLUtils.explainString(frame._jdf.queryExecution(), "extended"))
    return _section(text, _ANALYZED)


def _section(text: str, header: str) -> str:
    if header not in text:
        return ""
    body = text.split(header, 1)[1].split("\n== ", 1)[0]
    # The section starts with the plan's output schema (``k: string, ...``), then the tree.
    return body.strip("\n").split("\n", 1)[1] if "\n" in body.strip("\n") else ""


def _is_connect(obj: Any) -> bool:
    """Whether ``obj`` (a DataFrame, session or query) belongs to a Spark Connect client."""
    return type(obj).__module__.startswith("pyspark.sql.connect.")


def _clean(expr: str) -> str:
    """An expression of the plan text without attribute ids and watermark marks."""
    return re.sub(r"-T\d+ms", "", re.sub(r"#\d+L?", "", expr))


def _is_rowtime_source(node: PlanNode) -> bool:
    if node.name == "StreamingRelationV2":  # <source>, <name>, <table>, [options], [output], ...
        parts = node.args.split(", ", 2)
        return len(parts) > 1 and parts[1] == "rowtime"
    if node.name in ("StreamingDataSourceV2Relation", "StreamingDataSourceV2ScanRelation"):
        return node.args.rstrip().endswith(" rowtime")
    return False


def _describe(node: PlanNode) -> str:
    if node.name == "Filter":
        return f"a filter {_clean(node.args)}"
    return f"a {node.name} operator"


def _below_watermark_problem(node: PlanNode, unions_allowed: bool = False) -> str | None:
    """What stands between a watermark (or the helper) and the rowtime sources below ``node``
    that would break the promise, or None."""
    sources = 0
    blockers: list[str] = []

    def walk(n: PlanNode, blocked: str | None) -> None:
        nonlocal sources
        if _is_rowtime_source(n):
            sources += 1
            if blocked is not None:
                blockers.append(blocked)
            return
        here = blocked
        if here is None and n.name not in _TRANSPARENT:
            here = _describe(n)
        if n.name == "EventTimeWatermark":
            here = "a watermark (withWatermark) already"
        for c in n.children:
            walk(c, here)

    walk(node, None)
    if blockers:
        return (
            f"{blockers[0]} stands between spark.readStream.format('rowtime') and the watermark"
            " on rowtime: it removes or mixes bound records before the watermark sees them, so"
            " the watermark stops following the stream clock"
        )
    if sources > 1 and not unions_allowed:
        return (
            f"one watermark over {sources} rowtime streams follows the fastest of them and drops"
            " the others' rows as late; call with_watermark on each stream and union the results"
            " (Spark then takes the minimum of their watermarks)"
        )
    return None


def _refuse_unprotectable(df: DataFrame, late_rows_handled: bool = False) -> None:
    plan = parse_plan(analyzed_plan_text(df))
    if plan is None:
        return
    problem = _below_watermark_problem(plan, unions_allowed=late_rows_handled)
    if problem is not None:
        raise QueryShapeError(f"with_watermark: {problem}; {_RULE}")


def check_plan(plan: str | PlanNode | None) -> list[str]:
    """The shapes in an analyzed logical plan (Spark's text, or ``parse_plan``'s tree) that
    break the rowtime promise, as messages (empty when none). Looks at every watermark on a
    column of a ``format("rowtime")`` source."""
    root = parse_plan(plan) if isinstance(plan, str) else plan
    problems: list[str] = []

    def walk(n: PlanNode, parent: PlanNode | None) -> None:
        if n.name == "EventTimeWatermark" and _reads_rowtime(n):
            protected = (
                parent is not None
                and parent.name == "Filter"
                and _BARRIER_SQL in parent.args.lower()
            )
            # with_watermark checked what is below it when it was called (and an operator
            # that handles late rows may have let a union through on purpose).
            below = None if protected or not n.children else _below_watermark_problem(n.children[0])
            if below is not None:
                problems.append(below)
            if not protected:
                problems.append(
                    f"withWatermark({_event_time(n)!r}) on a format('rowtime') stream"
                    " without pyspark_rowtime.with_watermark: bound records (is_bound = true,"
                    " null payload) reach the rest of the query as rows, and filters after it"
                    " are pushed below the watermark and stop it"
                )
        for c in n.children:
            walk(c, n)

    if root is not None:
        walk(root, None)
    return problems


def check_dataframe(df: DataFrame) -> list[str]:
    """The shapes of a streaming DataFrame that break the rowtime promise, before it starts.

    A watermark on a ``format("rowtime")`` stream set without
    [`with_watermark`][pyspark_rowtime.watermark.with_watermark] lets bound records through as
    rows and lets filters freeze the watermark; each such shape is a finding.

    Args:
        df: a streaming DataFrame.

    Returns:
        One message per finding, naming the fix; empty when the promise holds.

    Examples:
        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> path = tempfile.mkdtemp() + "/speeds"
        >>> _ = rt.create_stream(path, "sensor STRING, speed DOUBLE")
        >>> df = spark.readStream.format("rowtime").load(path)
        >>> rt.check_dataframe(rt.with_watermark(df))
        []
        >>> rt.check_dataframe(df.withWatermark("rowtime", "1 second"))
        ["withWatermark('rowtime') on a format('rowtime') stream without ..."]
    """
    return check_plan(analyzed_plan_text(df))


def _event_time(watermark: PlanNode) -> str:
    """The column of ``EventTimeWatermark <id>, rowtime#2: timestamp, 1 seconds``."""
    m = re.match(r"\S+, (.+?)#\d+: ", watermark.args)
    return m.group(1) if m else "?"


def _reads_rowtime(watermark: PlanNode) -> bool:
    def has_source(n: PlanNode) -> bool:
        return _is_rowtime_source(n) or any(has_source(c) for c in n.children)

    return has_source(watermark)


#: Spark Connect: each started query's findings, by query id, checked at its start (a started
#: query's own plan is out of a client's reach: its ``explain`` shows only the last micro-batch).
_started: dict[str, list[str]] = {}


def check_query(query: StreamingQuery) -> list[str]:
    """The shapes of a started query that break the rowtime promise (say, in a test of a job).

    Classic Spark: the plan the query runs. Spark Connect: the findings of the check that
    [`watch_queries`][pyspark_rowtime.watermark.watch_queries] ran on the query's DataFrame
    when it started (installed by the first ``with_watermark`` call of the session, or call it
    before starting the query). Either way,
    [`check_dataframe`][pyspark_rowtime.watermark.check_dataframe] checks a DataFrame before it
    is started.

    Args:
        query: a started streaming query.

    Returns:
        One message per finding, naming the fix; empty when the promise holds.

    Raises:
        QueryShapeError: under Spark Connect, a query started without the check, since a
            client cannot read a started query's plan.

    Examples:
        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> path = tempfile.mkdtemp() + "/speeds"
        >>> _ = rt.create_stream(path, "sensor STRING, speed DOUBLE")
        >>> df = rt.with_watermark(spark.readStream.format("rowtime").load(path))
        >>> query = df.writeStream.format("noop").trigger(availableNow=True).start()
        >>> query.awaitTermination()
        >>> rt.check_query(query)
        []
    """
    if _is_connect(query):
        found = _started.get(str(query.id))
        if found is None:
            raise QueryShapeError(
                f"check_query: query {query.id} was started without pyspark_rowtime's check in"
                " this Spark Connect session, and a Spark Connect client cannot read a started"
                " query's plan: call pyspark_rowtime.watch_queries(spark) (with_watermark does)"
                " before starting it, or check the DataFrame before start() with"
                " pyspark_rowtime.check_dataframe(df)"
            )
        return list(found)
    jsq: Any = getattr(query, "_jsq")  # noqa: B009 (classic Spark's handle on the JVM query)
    return check_plan(str(jsq.streamingQuery().analyzedPlan().treeString()))


_watched: set[object] = set()
_watch_lock = threading.Lock()


def watch_queries(spark: SparkSession) -> None:
    """Check every query ``spark`` starts from now on, and log a warning for each finding.

    The check is [`check_query`][pyspark_rowtime.watermark.check_query]'s; the warnings go to
    the logger ``pyspark_rowtime``, one for each shape that breaks the rowtime promise.
    Installed by the first ``with_watermark`` call of a session; idempotent. Classic Spark tells
    listeners about a started query just after ``start()`` returns, on its listener thread, and
    the check reads the query's plan. A Spark Connect client tells them inside ``start()``,
    before the query has a plan of its own: the check reads the plan of the DataFrame being
    started (Spark's analyzed plan, from the server) and keeps the findings for
    ``check_query``.

    Args:
        spark: the session whose queries are checked.

    Examples:
        >>> import pyspark_rowtime as rt
        >>> rt.watch_queries(spark)
        >>> rt.watch_queries(spark)  # once per session: a second call changes nothing
    """
    from pyspark.sql.streaming import StreamingQueryListener

    connect = _is_connect(spark)
    key: object
    if connect:
        key = ("connect", str(spark.session_id))  # type: ignore[attr-defined]
    else:
        jsession = getattr(spark, "_jsparkSession", None)
        if jsession is None:
            return
        key = int(jsession.hashCode())
    with _watch_lock:
        if key in _watched:
            return
        _watched.add(key)

    class _ShapeWatch(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            try:
                if connect:
                    df = _starting_dataframe()
                    if df is None:
                        return
                    problems = check_dataframe(df)
                    _started[str(event.id)] = problems
                else:
                    query = spark.streams.get(str(event.id))
                    problems = check_query(query) if query is not None else []
            except Exception as e:  # the query may already be gone
                log.debug("pyspark_rowtime: could not check query %s: %s", event.id, e)
                return
            for problem in problems:
                log.warning(
                    "pyspark_rowtime: query %s: %s; %s",
                    event.name or event.id,
                    problem,
                    _RULE,
                )

        def onQueryProgress(self, event: Any) -> None:
            pass

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

        if not connect:

            @property
            def _jlistener(self) -> Any:
                # classic Spark hands the JVM this object (addListener, removeListener)
                if not hasattr(self, "_jlistenerobj"):
                    self._jlistenerobj = _started_only(self)
                return self._jlistenerobj

    listener = _ShapeWatch()
    spark.streams.addListener(listener)
    # Spark would otherwise call into this interpreter while it shuts down (a Py4J stack trace).
    atexit.register(_unwatch, spark, listener)


def _started_only(listener: Any) -> Any:
    """The JVM's handle on ``listener`` (classic Spark), which converts only the events of a
    query's start and drops the others in the callback, before PySpark reads them.

    PySpark's own handle turns each event into Python first. For a progress event that reads
    the whole progress through Py4J and, for each observed metric (the windows and joins of
    this package observe theirs), looks ``PythonSQLUtils`` up by name, which Py4J resolves by
    trying each imported package in turn, every miss a search of every jar on the classpath.
    On a query that observes metrics, that search takes a large share of the driver JVM's CPU,
    on Spark's listener thread, for a watch that has nothing to do with progress
    (docs/benchmarks.md, "The test suite and CI").
    """
    from pyspark import SparkContext
    from pyspark.sql.streaming.listener import JStreamingQueryListener

    class StartedOnly(JStreamingQueryListener):
        def onQueryProgress(self, jevent: Any) -> None:
            pass

        def onQueryIdle(self, jevent: Any) -> None:
            pass

        def onQueryTerminated(self, jevent: Any) -> None:
            pass

    jvm: Any = SparkContext._jvm
    return jvm.PythonStreamingQueryListenerWrapper(StartedOnly(listener))


def _starting_dataframe() -> DataFrame | None:
    """The DataFrame a Spark Connect client is starting, seen from a listener's
    ``onQueryStarted`` (which the client calls inside ``DataStreamWriter.start()``/``toTable()``,
    in ``_start_internal``, after the server started the query). None if not found there."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        writer: Any = frame.f_locals.get("self")
        if frame.f_code.co_name == "_start_internal" and type(writer).__module__ == (
            "pyspark.sql.connect.streaming.readwriter"
        ):
            from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame

            plan = writer._write_stream._child
            started: Any = ConnectDataFrame(plan, writer._session)
            return started
        frame = frame.f_back
    return None


def _unwatch(spark: SparkSession, listener: Any) -> None:
    if getattr(spark, "is_stopped", False):
        # A stopped Spark Connect session: its server let the listeners go with it. PySpark's
        # SparkSession.__del__ still asks the server to remove each listener on the client's
        # list (SPARK-48147), fails, and warns "Failed to remove the listener ... please
        # remove it again" at the user's exit: take this one off that list.
        bus = getattr(getattr(getattr(spark, "_sqm", None), "_sqlb", None), "_listener_bus", None)
        if isinstance(bus, list) and listener in bus:
            bus.remove(listener)
        return
    try:
        spark.streams.removeListener(listener)
        if not _is_connect(spark):
            # An event Spark was already delivering when the listener went still calls back
            # into this interpreter; let it finish while the callback server is alive.
            spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(2000)
    except Exception:  # the session or the JVM is already gone: nothing left to call us
        pass

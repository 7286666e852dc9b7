"""Windows as validity, grouped: element based per group and predicate based (seed 001).

Seed 001: "We allow time based (e.g., the last 30 minutes), element based (e.g., the last 100
events), and predicate based (e.g., only when the temperature is above 10 degree centigrade)
windows. For all window types further options like the movement or a grouping are possible.
Each window definition is mapped to a modification of the end time stamp."

The time based window and the element window per partition are reader options
(``interval.duration``, ``interval.slide``, ``interval.count``): a row's end is known when the
reader emits it. Here are the two whose end depends on later rows of a *group*, which may come
from any partition, much later:

* ``rows_window`` (element based, grouped): a row is valid until the ``n``-th later row of
  its group starts, or until the end of stream; with ``slide`` (the seed's "movement", the
  element form of ``interval.slide``) the window moves ``slide`` rows at a time: the rows of
  a group go in blocks of ``slide`` (the group's 1st to ``slide``-th row, and so on), and every
  row of a block is valid until the row ``n`` rows after the block's first starts (row ``i``,
  counted from 0 in its group, ends at row ``floor(i / slide) * slide + n``, as the time
  window's ``floor(rowtime / slide) * slide + duration``); ``slide = n``: tumbling;
* ``while_window`` (predicate based, grouped): a row for which the condition holds is
  valid until the first later row of its group for which it does not (that row closes the
  window and is itself valid at no instant), or until the end of stream; rows for which it does
  not hold are valid at no instant.

A row waiting for the row that ends it cannot be held back in the reader (a quiet group would
hold every other group's rows and the stream clock). So these functions only *describe* the
window: they add ``rowtime_end`` (null: not known yet) and two columns the interval operator
reads (``__win_g``, the group; ``__win_on``, the condition), with the window's definition in
``__win_on``'s metadata, which Spark keeps through projections and over Spark Connect.
``pyspark_rowtime.interval_aggregate`` then sets the ends inside its own state
(``assign_ends``): a row whose end is not known yet is valid at least up to the stream clock
(the row that will end it starts at or after the clock), so every stretch up to the watermark is
final whatever the open rows' ends turn out to be, and only the open rows wait.

Ties: rows of a group with equal rowtimes are taken in arrival order (micro-batch, then the
values of their columns), which a replay from the checkpoint repeats exactly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..bounds.errors import OptionError
from ..bounds.intervals import INFINITY_US

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["WindowDef", "assign_ends", "rows_window", "while_window", "window_of"]

#: Column metadata key of a window definition.
META_KEY = "pyspark_rowtime.window"
_RESERVED = ("rowtime", "rowtime_end", "is_bound", "__win_g", "__win_on")


@dataclass(frozen=True)
class WindowDef:
    """A grouped window whose ends depend on later rows: ``kind`` ``rows`` (``n`` rows) or
    ``while`` (the condition), and the group's columns."""

    kind: str
    n: int
    partition_by: tuple[str, ...]
    #: rows windows: the window moves this many rows at a time (1: at every row).
    slide: int = 1

    def to_json(self) -> str:
        d: dict[str, Any] = {"kind": self.kind, "n": self.n, "partition_by": self.partition_by}
        if self.slide != 1:
            d["slide"] = self.slide
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> WindowDef:
        d = json.loads(text)
        return cls(str(d["kind"]), int(d["n"]), tuple(d["partition_by"]), int(d.get("slide", 1)))


def assign_ends(window: WindowDef, frame: pd.DataFrame) -> pd.DataFrame:
    """Set ``__e`` for the rows of ``frame`` whose end is now known, by the window's rule.

    ``frame``: the rows kept so far (first, in their order) then the new rows, with ``__t``,
    ``__e``, ``__open`` (True while the end is not known; ``__e`` is then infinity), ``__g``
    (the group) and ``__on`` (the condition). New rows come with ``__open`` None. Returns the
    frame with new rows settled: the ends their arrival makes known set, the rest open.

    A rows window with a ``slide`` needs no more than the open rows: row ``i`` of a group
    waits for row ``floor(i / slide) * slide + n``, the same for every row of its block, so the
    open rows of a group are its last ones from the first row of a block on (and its last row
    is always open, as ``n >= slide``): the ``j``-th open row waits for the open row at
    ``floor(j / slide) * slide + n``.
    """
    frame = frame.reset_index(drop=True)
    is_new = frame["__open"].isna().to_numpy()
    if not is_new.any():
        return frame
    new = frame[is_new]
    # New rows in rowtime order, ties by their values (a replay sees the same batch).
    by = ["__t", *[c for c in new.columns if c not in ("__t", "__e", "__open")]]
    try:
        new = new.sort_values(by, kind="stable", na_position="first")
    except TypeError:  # values that do not compare (mixed types): rowtime, then arrival
        new = new.sort_values("__t", kind="stable")
    old = frame[~is_new]
    frame = pd.concat([old, new], ignore_index=True)
    t = frame["__t"].to_numpy(dtype=np.int64)
    e = frame["__e"].to_numpy(dtype=np.int64).copy()
    open_ = np.concatenate([old["__open"].to_numpy(dtype=bool), np.ones(len(new), dtype=bool)])
    on = frame["__on"].to_numpy(dtype=bool)
    groups: dict[Any, list[int]] = {}
    for i, g in enumerate(frame["__g"].tolist()):
        if open_[i]:
            groups.setdefault(g, []).append(i)
    for members in groups.values():
        if window.kind == "rows":
            # The open rows of a group are its last rows, from a block's first on (see above):
            # member j ends where member floor(j / slide) * slide + n starts.
            for j, i in enumerate(members):
                at = j // window.slide * window.slide + window.n
                if at < len(members):
                    e[i] = t[members[at]]
                    open_[i] = False
                else:
                    e[i] = INFINITY_US
        else:
            pending: list[int] = []
            for i in members:
                if on[i]:
                    pending.append(i)
                    e[i] = INFINITY_US
                    continue
                for p in pending:  # the window closes: every row in it ends here
                    e[p] = t[i]
                    open_[p] = False
                pending = []
                e[i] = t[i]  # the closing row is valid at no instant
                open_[i] = False
    frame["__e"] = e
    frame["__open"] = open_
    return frame


def window_of(df: DataFrame) -> WindowDef | None:
    """The window ``rows_window`` or ``while_window`` put on ``df``, if any."""
    if "__win_on" not in df.columns:
        return None
    meta = df.schema["__win_on"].metadata.get(META_KEY)
    if not meta:
        raise OptionError(
            "the column __win_on carries no window definition: it is reserved for "
            "rows_window and while_window; rename it"
        )
    return WindowDef.from_json(meta)


def _define(df: DataFrame, window: WindowDef, condition: Any) -> DataFrame:
    from pyspark.sql import DataFrame as SparkDataFrame
    from pyspark.sql import functions as F

    if not isinstance(df, SparkDataFrame):
        raise OptionError(f"{window.kind}_window: df={df!r} is not a Spark DataFrame")
    missing = [c for c in ("rowtime", "is_bound") if c not in df.columns]
    if missing:
        raise OptionError(
            f"{window.kind}_window: df lacks the column(s) {missing}: give a "
            "spark.readStream.format('rowtime') DataFrame, bound records included"
        )
    if "rowtime_end" in df.columns:
        raise OptionError(
            f"{window.kind}_window: df already has rowtime_end (a reader option "
            "interval.duration or interval.count set it): read the stream without them"
        )
    payload = [c for c in df.columns if c not in _RESERVED]
    for k in window.partition_by:
        if k not in payload:
            raise OptionError(
                f"{window.kind}_window: partition_by: {k!r} is not a payload column of df; "
                f"give names among {payload}"
            )
    group = (
        F.to_json(F.struct(*[F.col(k) for k in window.partition_by]))
        if window.partition_by
        else F.lit("")
    )
    cols = [c for c in df.columns if c not in ("rowtime", "is_bound")]
    return df.select(
        *cols,
        "rowtime",
        F.lit(None).cast("timestamp").alias("rowtime_end"),
        "is_bound",
        group.alias("__win_g"),
        F.coalesce(condition, F.lit(False)).alias(
            "__win_on", metadata={META_KEY: window.to_json()}
        ),
    )


def _keys(partition_by: str | Sequence[str]) -> tuple[str, ...]:
    return (partition_by,) if isinstance(partition_by, str) else tuple(partition_by)


def rows_window(
    df: DataFrame, n: int, *, slide: int = 1, partition_by: str | Sequence[str] = ()
) -> DataFrame:
    """The last ``n`` rows of each group (element based window, grouped).

    Seed 001's "the last 100 events": a row is valid from its rowtime until the ``n``-th later
    row of its group starts, or until the end of stream.

    With ``slide`` (seed 001's "movement"; the element form of option ``interval.slide``) the
    window moves ``slide`` rows at a time: a group's rows go in blocks of ``slide``, and every
    row of a block is valid until the row ``n`` rows after the block's first row starts (row
    ``i`` of its group, from 0, until row ``floor(i / slide) * slide + n``). ``slide = n``:
    tumbling windows of ``n`` rows.

    Args:
        df: a ``format("rowtime")`` stream without ``interval.*`` options, bound records
            included.
        n: a whole number >= 1.
        slide: a whole number from 1 (the default: the window moves at every row) to ``n``.
        partition_by: the group's column(s); without it, the whole stream is one group.

    Returns:
        ``df`` with ``rowtime_end`` (null until an interval operator sets it) and the window's
        description, for [`interval_aggregate`][pyspark_rowtime.windows.validity.interval_aggregate]
        and [`overlap_join`][pyspark_rowtime.windows.join.overlap_join].

    Examples:
        The average of each sensor's last 3 readings, at every instant:

        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> path = tempfile.mkdtemp() + "/temps"
        >>> _ = rt.create_stream(path, "sensor STRING, temp DOUBLE")
        >>> temps = spark.readStream.format("rowtime").load(path)
        >>> last3 = rt.rows_window(temps, 3, partition_by="sensor")
        >>> rt.interval_aggregate(last3, {"avg_temp": "avg(temp)"}, partition_by="sensor").columns
        ['sensor', 'avg_temp', 'rowtime', 'rowtime_end']
    """
    from pyspark.sql import functions as F

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise OptionError(f"rows_window: n={n!r} must be a whole number >= 1")
    if isinstance(slide, bool) or not isinstance(slide, int) or not 1 <= slide <= n:
        raise OptionError(
            f"rows_window: slide={slide!r} must be a whole number from 1 to n={n}: the window "
            "moves that many rows at a time; a larger slide would leave rows between two "
            "windows valid at no instant"
        )
    return _define(df, WindowDef("rows", n, _keys(partition_by), slide), F.lit(True))


def while_window(
    df: DataFrame, condition: Any, *, partition_by: str | Sequence[str] = ()
) -> DataFrame:
    """Rows while a condition holds (predicate based window, grouped).

    Seed 001's "only when the temperature is above 10 degree centigrade": a row for which
    ``condition`` holds is valid from its rowtime until the first later row of its group for
    which it does not (that row closes the window), or until the end of stream; other rows are
    valid at no instant.

    Args:
        df: a ``format("rowtime")`` stream without ``interval.*`` options, bound records
            included.
        condition: a Spark SQL expression string (``"temp > 10"``) or a boolean Column; null
            counts as false.
        partition_by: the group's column(s) (``"sensor"``: each sensor's own window).

    Returns:
        As [`rows_window`][pyspark_rowtime.windows.define.rows_window].

    Examples:
        The warmest reading of each sensor while it stays above 10 degrees:

        >>> import tempfile
        >>> import pyspark_rowtime as rt
        >>> path = tempfile.mkdtemp() + "/temps"
        >>> _ = rt.create_stream(path, "sensor STRING, temp DOUBLE")
        >>> temps = spark.readStream.format("rowtime").load(path)
        >>> warm = rt.while_window(temps, "temp > 10", partition_by="sensor")
        >>> rt.interval_aggregate(warm, {"warmest": "max(temp)"}, partition_by="sensor").columns
        ['sensor', 'warmest', 'rowtime', 'rowtime_end']
    """
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    if isinstance(condition, str):
        condition = F.expr(condition)
    if not isinstance(condition, Column):
        raise OptionError(
            f"while_window: condition={condition!r} must be a SQL expression string such as "
            "'temp > 10' or a boolean Column"
        )
    return _define(df, WindowDef("while", 0, _keys(partition_by)), condition)

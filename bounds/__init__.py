"""The pure temporal core: time, bounds, ordering policies, alignment, panes and intervals.

Never imports pyspark or the log (``tests/test_plan.py`` proves it), so it can be used and
tested anywhere. It also holds the one exception hierarchy (``errors``) and the redaction
every error applies to its message (``redaction``), so that no layer above can raise a
secret. Rowtimes are ``int`` microseconds since the Unix epoch, UTC; intervals are
half-open ``[start, end)``.

* time: ``units`` (the units, once), ``time`` (event times into microseconds, one value
  or an Arrow column), ``patterns`` (the string forms), ``zones`` (naive wall-clock
  times), ``durations`` (durations of options), ``arrays`` (Arrow and numpy without
  pyarrow's pandas path);
* ``bounds`` -- rowtime bounds and the end of stream; ``policies`` -- ``reject``,
  ``drop`` and ``adjust`` per partition; ``plan`` -- a step over a whole stream, alignment
  across partitions;
* ``panes`` -- IBM Streams ``timeInterval`` panes; ``intervals`` -- Odysseus validity
  intervals;
* ``versions`` -- the stored formats across releases.
"""

from .bounds import END_OF_STREAM_US, MIN_ROWTIME_US, merge_clock, normalize_bound
from .durations import parse_duration_us
from .errors import (
    BoundError,
    HeldRowsOverflowError,
    InvalidRowtimeError,
    LateRowError,
    OptionError,
    RowtimeError,
)
from .intervals import INFINITY_US, ValidityInterval, combine, intersection, overlaps
from .panes import TimeIntervalSpec, TimeIntervalWindow, assign_panes
from .plan import StreamPosition
from .policies import AdjustPolicy, DropPolicy, PolicyRun, RejectPolicy, make_policy
from .time import TimeFormat, format_rowtime, from_rowtime_us, to_rowtime_us, truncate_us

__all__ = [
    "END_OF_STREAM_US",
    "INFINITY_US",
    "MIN_ROWTIME_US",
    "AdjustPolicy",
    "BoundError",
    "DropPolicy",
    "HeldRowsOverflowError",
    "InvalidRowtimeError",
    "LateRowError",
    "OptionError",
    "PolicyRun",
    "RejectPolicy",
    "RowtimeError",
    "StreamPosition",
    "TimeFormat",
    "TimeIntervalSpec",
    "TimeIntervalWindow",
    "ValidityInterval",
    "assign_panes",
    "combine",
    "format_rowtime",
    "from_rowtime_us",
    "intersection",
    "make_policy",
    "merge_clock",
    "normalize_bound",
    "overlaps",
    "parse_duration_us",
    "to_rowtime_us",
    "truncate_us",
]

"""The units of time the core counts in, each defined once.

Rowtimes are ``int`` microseconds since the Unix epoch (UTC); these tables turn the units users
name in options and arguments into microseconds.
"""

from __future__ import annotations

from collections.abc import Mapping

US_PER_S = 1_000_000
US_PER_HOUR = 3_600 * US_PER_S
US_PER_DAY = 24 * US_PER_HOUR

#: Units of an integer epoch (and of Arrow timestamps) as ``(multiplier, divisor)``:
#: ``rowtime_us = value * mul // div``. The floor division truncates nanoseconds toward the past
#: (``-1 ns`` is ``-1 us``).
EPOCH_UNITS_US: Mapping[str, tuple[int, int]] = {
    "s": (US_PER_S, 1),
    "ms": (1_000, 1),
    "us": (1, 1),
    "ns": (1, 1_000),
}

#: SDP's ``adjust`` units (seed 000) in microseconds: the policy, the reader's options and the
#: stream defaults all read this table.
ADJUST_UNITS_US: Mapping[str, int] = {"sec": US_PER_S, "msec": 1_000, "usec": 1}

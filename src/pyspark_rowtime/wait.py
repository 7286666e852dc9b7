"""Waiting for a clock: what a scheduler runs before a job that needs everything up to a time.

``wait_for_clock`` polls a clock until it reaches a time, or a timeout passes. It reads no
wall clock of its own: the caller gives ``now`` (monotonic seconds) and ``sleep``, which the
public ``pyspark_rowtime.api.wait_for_rowtime_bound`` sets to ``time.monotonic`` and
``time.sleep``, and tests drive by hand.

Polls back off: the first pause is ``FIRST_PAUSE_S`` (or ``poll`` when shorter), each next
one twice the last, up to ``poll``; the last pause ends at the deadline, where the clock is read
once more. A clock that is already there costs one read and no pause.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .bounds.durations import parse_duration_us
from .bounds.errors import OptionError, WaitTimeoutError
from .bounds.time import format_rowtime

__all__ = [
    "DEFAULT_POLL_S",
    "FIRST_PAUSE_S",
    "Waited",
    "format_seconds",
    "parse_timeout_s",
    "wait_for_clock",
]

#: The longest pause between two reads, by default (``--poll``).
DEFAULT_POLL_S = 5.0
#: The first pause: a clock about to move is seen soon, a clock far behind costs few reads.
FIRST_PAUSE_S = 0.1

_ZERO = re.compile(r"\s*\+?(?:0+(?:\.0*)?|\.0+)\s*([A-Za-zµ]*)\s*", re.ASCII)


@dataclass(frozen=True)
class Waited:
    """A wait that ended with the clock at or past the time awaited."""

    clock_us: int
    until_us: int
    waited_s: float
    reads: int


def parse_timeout_s(value: Any, *, what: str) -> float:
    """A timeout in seconds, from what ``parse_duration_us`` reads, and zero too (check
    once, do not wait: a sensor's single poke)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
        return 0.0
    if isinstance(value, dt.timedelta) and value == dt.timedelta(0):
        return 0.0
    if isinstance(value, str):
        m = _ZERO.fullmatch(value)
        if m is not None:
            if m.group(1):
                parse_duration_us(f"1{m.group(1)}", what=what)  # the unit must be one
            return 0.0
    return parse_duration_us(value, what=what) / 1e6


def format_seconds(s: float) -> str:
    """A duration for one line of output: ``0.25 s``, ``95 s``, ``2 min 5 s``, ``1 h 30 min``."""
    if s < 10:
        return f"{s:.2f} s"
    total = round(s)
    if total < 120:
        return f"{total} s"
    h, rest = divmod(total, 3600)
    m, sec = divmod(rest, 60)
    if h:
        return f"{h} h {m} min"
    return f"{m} min {sec} s"


def wait_for_clock(
    read: Callable[[], int | None],
    until_us: int,
    *,
    timeout_s: float | None,
    poll_s: float = DEFAULT_POLL_S,
    now: Callable[[], float],
    sleep: Callable[[float], Any],
    what: str = "the clock",
) -> Waited:
    """Read the clock with ``read`` until it is at or past ``until_us``, polling with a backoff.

    Args:
        read: reads the clock, in microseconds (None while there is none).
        until_us: the time awaited, in microseconds.
        timeout_s: seconds to wait at most (None: as long as it takes; 0: read once).
        poll_s: the longest pause between reads; pauses start short and double up to it.
        now: monotonic seconds (the caller's: no wall clock is read here).
        sleep: pauses for seconds (the caller's).
        what: how the timeout's message names the clock (``"the clock of /data/counts"``).

    Raises:
        WaitTimeoutError: the timeout passed first; its one-line message says what the clock
            is, what was awaited and how long it waited.
        OptionError: ``poll_s`` is not positive or ``timeout_s`` is negative.
        Whatever ``read`` raises (a location with nothing to wait on, a damaged log).
    """
    if not poll_s > 0:
        raise OptionError(f"poll={poll_s!r}: the pause between reads must be positive")
    if timeout_s is not None and not timeout_s >= 0:
        raise OptionError(f"timeout={timeout_s!r}: a timeout is zero or more seconds")
    start = now()
    pause = min(FIRST_PAUSE_S, poll_s)
    reads = 0
    while True:
        clock = read()
        reads += 1
        waited = now() - start
        if clock is not None and clock >= until_us:
            return Waited(clock, until_us, waited, reads)
        if timeout_s is not None and waited >= timeout_s:
            shown = "none (nothing moved it yet)" if clock is None else format_rowtime(clock)
            raise WaitTimeoutError(
                f"timed out after {format_seconds(waited)}: {what} is {shown}, "
                f"waiting for {format_rowtime(until_us)}",
                clock,
                until_us,
                waited,
            )
        sleep(pause if timeout_s is None else max(0.0, min(pause, timeout_s - waited)))
        pause = min(pause * 2, poll_s)

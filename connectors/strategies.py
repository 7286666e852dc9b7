"""Bound strategies: how a connector decides the rowtime bounds it writes.

``bounds = { strategy = ..., ... }`` in a connector's catalog entry. A bound ``t`` is a promise
that every later row of the partition has rowtime ``>= t`` (SPEC 5); a row that breaks it is
late (discarded by the connector under ``order=reject``, by the reader's policy otherwise).

``none`` (the default)
    no bound records: the clock moves with the rows only (a row at ``t`` implies the bound ``t``).
    Promises nothing beyond the rows; a quiet source holds every downstream window open.
``source``
    the source sends bounds (a directory's JSON line ``{"rowtime_bound": T}``, the generator's
    own schedule, a Redis entry with the field ``rowtime_bound``). Exactly as right as the
    source; wrong when the source lies or its clock runs ahead of its data.
``lateness`` (``lateness = "5 seconds"``)
    Flink's bounded out-of-orderness. The connector holds rows back: each row waits in a
    holding buffer (sorted by rowtime) until its rowtime is ``<=`` the highest rowtime seen
    minus ``lateness``; rows are then written in rowtime order, followed by that bound. So the
    stream receives its rows sorted (within the lateness) and a bound that trails the newest row
    by ``lateness``. A row that arrives with a rowtime below the bound already written (the
    partition clock) is *late*: counted, and kept, never silently lost: under the stream's
    ``order=reject`` in the connector's rejects file (``rejected.jsonl`` in its state folder),
    otherwise written to the stream, where the reader's policy treats it (``drop`` puts it in
    the reader's quarantine, ``output=discarded``; ``adjust`` moves it up). Held rows survive a
    SIGKILL (they are kept in the connector's state folder, committed with its position: see
    ``feed``) and are written on SIGTERM. Needs explicit rowtimes (a directory connector's
    ``rowtime_field``). Right while no row arrives more than ``lateness`` behind the newest row
    seen; wrong for a source whose disorder exceeds it (those rows become late), and it never
    moves on a quiet source (the newest rows stay held: combine it with ``heartbeat``). Rows are
    delayed by ``lateness`` of *rowtime*, not of wall time: a source that sends old data slowly
    holds rows longer. Stopping (SIGTERM) writes the held rows, which moves the partition clock
    to the highest rowtime seen: rows that arrive after a restart within ``lateness`` of it are
    late.
``heartbeat`` (``quiet = "10 seconds"``, ``delay = "0s"``, ``interval = "1s"``)
    once no row has come for ``quiet``, bound = this machine's clock minus ``delay``, moving on
    while the source stays quiet, at most one such bound per ``interval`` (each bound is a
    record of the stream). Exact for implicit (arrival) rowtimes; for explicit rowtimes it
    assumes the source's event times follow this machine's clock within ``delay``: wrong for a
    source whose clock lags, or that delivers old data after a pause (a backfill).
combinations (``strategy = ["lateness", "heartbeat"]``)
    the highest bound any of them gives: what each promises must hold for the combination to
    hold, so it is wrong whenever one of them is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..bounds.errors import OptionError
from ..bounds.time import parse_duration_us

STRATEGIES = ("none", "source", "lateness", "heartbeat")
KEYS = ("strategy", "lateness", "quiet", "delay", "interval")


@dataclass
class BoundStrategy:
    """The chosen strategies and what they have seen. Times are int microseconds (UTC)."""

    kinds: frozenset[str]
    lateness_us: int = 0
    quiet_us: int = 10_000_000
    delay_us: int = 0
    interval_us: int = 1_000_000
    max_rowtime_us: int | None = None
    source_bound_us: int | None = None
    last_row_wall_us: int | None = None
    last_heartbeat_wall_us: int | None = None

    @property
    def holds(self) -> bool:
        """True when rows wait in the connector's holding buffer (strategy lateness)."""
        return "lateness" in self.kinds

    def state(self) -> dict[str, int | None]:
        """What must survive a restart (kept with the connector's position)."""
        return {"max_rowtime_us": self.max_rowtime_us, "source_bound_us": self.source_bound_us}

    def restore(self, state: dict[str, Any] | None) -> None:
        if state:
            self.max_rowtime_us = state.get("max_rowtime_us")
            self.source_bound_us = state.get("source_bound_us")

    def saw_row(self, rowtime_us: int, wall_us: int) -> None:
        if self.max_rowtime_us is None or rowtime_us > self.max_rowtime_us:
            self.max_rowtime_us = rowtime_us
        self.last_row_wall_us = wall_us

    def saw_source_bound(self, bound_us: int) -> None:
        if self.source_bound_us is None or bound_us > self.source_bound_us:
            self.source_bound_us = bound_us

    def bound_us(self, wall_us: int, started_wall_us: int) -> tuple[int | None, bool]:
        """The bound to write now (None: none), and whether it is a heartbeat's (a bound only
        the heartbeat gives, which the caller writes at most once per ``interval``: see
        ``wrote_heartbeat``). The caller writes it if it moves the clock."""
        found: list[int] = []
        if "source" in self.kinds and self.source_bound_us is not None:
            found.append(self.source_bound_us)
        if "lateness" in self.kinds and self.max_rowtime_us is not None:
            found.append(self.max_rowtime_us - self.lateness_us)
        other = max(found) if found else None
        if "heartbeat" in self.kinds:
            last = self.last_row_wall_us if self.last_row_wall_us is not None else started_wall_us
            beat_due = (
                self.last_heartbeat_wall_us is None
                or wall_us - self.last_heartbeat_wall_us >= self.interval_us
            )
            beat = wall_us - self.delay_us
            if wall_us - last >= self.quiet_us and beat_due and (other is None or beat > other):
                return beat, True
        return other, False

    def wrote_heartbeat(self, wall_us: int) -> None:
        self.last_heartbeat_wall_us = wall_us


def parse_strategy(table: Any, fail: Any) -> BoundStrategy:
    """The ``bounds`` table of a connector; ``fail(key, why)`` builds the error."""
    if table is None:
        return BoundStrategy(frozenset({"none"}))
    if not isinstance(table, Mapping):
        raise fail("bounds", 'must be a table such as { strategy = "lateness", lateness = "5s" }')
    for key in table:
        if key not in KEYS:
            raise fail(f"bounds.{key}", f"unknown key; bounds accepts: {', '.join(KEYS)}")
    raw = table.get("strategy", "none")
    kinds = [raw] if isinstance(raw, str) else raw
    if not isinstance(kinds, list) or not kinds or not all(isinstance(k, str) for k in kinds):
        raise fail("bounds.strategy", f"must be one of {', '.join(STRATEGIES)} or a list of them")
    for k in kinds:
        if k not in STRATEGIES:
            raise fail(
                "bounds.strategy", f"{k!r} is not a strategy: one of {', '.join(STRATEGIES)}"
            )
    if "none" in kinds and len(kinds) > 1:
        raise fail("bounds.strategy", "none cannot be combined with another strategy")
    out = BoundStrategy(frozenset(kinds))

    def duration(key: str, needed: bool) -> int | None:
        if key not in table:
            if needed:
                raise fail("bounds", f'strategy lateness needs {key} (a duration, e.g. "5s")')
            return None
        try:
            return parse_duration_us(table[key], what=key)
        except OptionError as e:
            raise fail(f"bounds.{key}", str(e)) from None

    lateness = duration("lateness", "lateness" in kinds)
    if lateness is not None:
        out.lateness_us = lateness
    quiet = duration("quiet", False)
    if quiet is not None:
        out.quiet_us = quiet
    interval = duration("interval", False)
    if interval is not None:
        out.interval_us = interval
    if "delay" in table:
        if table["delay"] in (0, "0", "0s"):
            out.delay_us = 0
        else:
            delay = duration("delay", False)
            out.delay_us = delay or 0
    for key, kind in (
        ("lateness", "lateness"),
        ("quiet", "heartbeat"),
        ("delay", "heartbeat"),
        ("interval", "heartbeat"),
    ):
        if key in table and kind not in kinds:
            raise fail(f"bounds.{key}", f"applies to strategy {kind} only")
    return out

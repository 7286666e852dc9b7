"""``rowtime connect``: build a connector from its catalog entry and run it in the foreground.

One log line per interval (rows, bounds, discarded since the last line, the partition clock and
its lag behind this machine's clock); on a terminal, a progress line between them. SIGTERM (and
Ctrl-C) stop it cleanly: the batch in hand is committed with its position, the writer released,
exit status 0. A bad configuration is one line and exit status 2 (the CLI prints it).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, TextIO

from ..bounds.errors import OptionError
from ..bounds.redaction import redact
from ..bounds.time import format_rowtime, parse_duration_us
from ..streams.catalog import Catalog, CatalogError, ConnectorEntry
from .feed import Feed, state_problem, wall_us
from .redis_source import RedisSource
from .sources import DirectorySource, GeneratorSource
from .strategies import parse_strategy

#: Keys every connector accepts, besides kind and stream (and its kind's own).
COMMON_KEYS = ("partition", "bounds", "state", "poll", "log_every", "description")
KIND_KEYS = {
    "directory": (
        "path",
        "format",
        "rowtime_field",
        "rowtime_unit",
        "rowtime_format",
        "rowtime_timezone",
        "batch_rows",
        "on_error",
    ),
    "generator": ("rate", "skew", "disorder", "gap_every", "gap_for", "count", "seed"),
    "redis": (
        "source",
        "password_env",
        "fields",
        "rowtime_field",
        "rowtime_unit",
        "rowtime_format",
        "rowtime_timezone",
        "batch_rows",
        "start",
    ),
}


def _fail(catalog: Catalog, entry: ConnectorEntry) -> Any:
    def fail(key: str, why: str) -> CatalogError:
        keys = ("connectors", entry.name, *key.split("."))
        value: Any = entry.settings
        for k in key.split("."):
            value = value.get(k, "?") if isinstance(value, Mapping) else "?"
        return catalog.error(keys, value, why)

    return fail


def check_settings(catalog: Catalog, entry: ConnectorEntry) -> None:
    """Refuse unknown keys and bad bounds without touching any stream (``catalog check``)."""
    fail = _fail(catalog, entry)
    allowed = (*COMMON_KEYS, *KIND_KEYS[entry.kind])
    for key in entry.settings:
        if key not in allowed:
            raise fail(
                key, f"unknown key for a {entry.kind} connector; it accepts: {', '.join(allowed)}"
            )
    parse_strategy(entry.settings.get("bounds"), fail)
    state = entry.settings.get("state")
    problem = state_problem(catalog.stream(entry.stream), entry.name, state)
    if problem is not None:
        if state is None:
            raise catalog.missing(("connectors", entry.name, "state"), f"key state {problem}")
        raise fail("state", problem)
    partition = entry.settings.get("partition", 0)
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise fail("partition", "must be a whole number >= 0 (a partition of the stream)")


def build(catalog: Catalog, name: str) -> tuple[Feed, Any]:
    """The feed and source of connector ``name`` (the stream is created on first use)."""
    entry = catalog.connector(name)
    check_settings(catalog, entry)
    fail = _fail(catalog, entry)
    settings = entry.settings
    strategy = parse_strategy(settings.get("bounds"), fail)
    feed = Feed(
        catalog.stream(entry.stream),
        name,
        settings.get("partition", 0),
        strategy,
        settings.get("state"),
    )
    try:
        source: Any
        if entry.kind == "directory":
            source = DirectorySource(feed, settings, fail)
        elif entry.kind == "redis":
            source = RedisSource(feed, settings, fail)
        else:
            source = GeneratorSource(feed, settings, fail)
    except BaseException:
        feed.writer.abort()
        raise
    return feed, source


def _lag(clock_us: int | None) -> str:
    if clock_us is None:
        return "none"
    return f"{(wall_us() - clock_us) / 1e6:.1f}s"


def run(
    catalog: Catalog,
    name: str,
    *,
    out: TextIO = sys.stderr,
    stop: threading.Event | None = None,
    install_signals: bool = True,
) -> int:
    """Run connector ``name`` until SIGTERM/SIGINT (or ``stop``); returns the exit status."""
    stop = stop or threading.Event()
    if install_signals:  # before anything is opened: a stop during start-up is clean too
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    settings = catalog.connector(name).settings
    fail = _fail(catalog, catalog.connector(name))
    durations = {}
    for key, default in (("poll", "200ms"), ("log_every", "10s")):
        try:
            durations[key] = parse_duration_us(settings.get(key, default), what=key) / 1e6
        except OptionError as e:
            raise fail(key, str(e)) from None
    poll_s, every_s = durations["poll"], durations["log_every"]
    feed, source = build(catalog, name)
    tty = out.isatty()
    print(f"rowtime connect {name}: feeding {feed.describe()}", file=out, flush=True)
    last = time.monotonic()
    shown = (0, 0, 0, 0)
    clean = False
    reported: str | None = None
    try:
        while not stop.is_set():
            busy = source.step()
            trouble = getattr(source, "unavailable", None)
            if trouble != reported:
                if trouble:
                    said = redact(trouble)  # a client library's text, which may echo a URL
                    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {name}: {said}", file=out)
                reported = trouble
            if not busy:
                feed.bound()
                feed.commit(feed.position)
                stop.wait(poll_s)
            s = feed.stats
            if time.monotonic() - last >= every_s:
                clock = feed.clock_us()
                line = (
                    f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {name}: rows={s.rows - shown[0]} "
                    f"bounds={s.bounds - shown[1]} late={s.late - shown[3]} "
                    f"discarded={s.discarded - shown[2]} held={len(feed.held)} "
                    f"clock={'none' if clock is None else format_rowtime(clock)} lag={_lag(clock)}"
                )
                if s.notes:  # one line per interval: the first example only (all are kept)
                    line += f" first: {s.notes[0]}"
                print(("\r\033[K" if tty else "") + line, file=out, flush=True)
                s.notes.clear()
                shown = (s.rows, s.bounds, s.discarded, s.late)
                last = time.monotonic()
            elif tty:
                print(
                    f"\r\033[K{name}: {s.rows} rows, clock lag {_lag(feed.clock_us())}",
                    end="",
                    file=out,
                    flush=True,
                )
        clean = True
    finally:
        if clean:
            feed.close(feed.position)
        else:  # a half-read batch is dropped: the restart reads it again from the position
            feed.writer.abort()
    s = feed.stats
    print(
        f"{'' if not tty else chr(13)}rowtime connect {name}: stopped, {s.rows} rows, {s.bounds} "
        f"bounds, {s.late} late, {s.discarded} discarded, committed up to offset "
        f"{feed.writer.end_offset}",
        file=out,
        flush=True,
    )
    return 0

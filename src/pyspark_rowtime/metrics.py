"""What operators look at: silent partitions and the Prometheus metrics of streams and targets.

``rowtime metrics PATH...`` prints ``exposition``; ``rowtime connect --metrics-port N``
serves the same at ``/metrics`` (``serve``). Every series is named ``rowtime_*`` and
labelled ``stream`` (the location as given, any password or token in it shown as ``***``:
``stream_label``) and, per partition, ``partition``:

=================================  ======================================================
``rowtime_partition_clock_seconds`` the partition clock under the stream's default policy
``rowtime_stream_clock_seconds``    the stream clock, as a query with the stream's defaults
                                    (policy, ``idle_timeout``) has it after every record
``rowtime_clock_lag_seconds``       the arrival time of the newest record minus the clock
                                    (per partition, and for the stream with the newest of
                                    all): read from the log, so it does not grow while
                                    nothing arrives; ``time() - clock`` in a query gives the
                                    lag behind the wall clock
``rowtime_records_total``           records (rows and bounds) written
``rowtime_bytes``                   bytes the partition's files take (embedded log only)
``rowtime_held_rows``               rows ``adjust`` holds now
``rowtime_discarded_rows_total``    rows discarded so far, the quarantine's count (idle too)
``rowtime_partition_idle``          1 while the partition is idle (the stream's
                                    ``idle_timeout``; absent without one)
``rowtime_first_kept_offset``       the first offset retention kept (0 when never trimmed)
``rowtime_sink_clock_seconds``      a sink target's clock (streams, Parquet folders, Delta
                                    and Iceberg tables the sink writes)
=================================  ======================================================

Times are seconds since the epoch (Prometheus' unit); a clock not known yet has no sample.
The held and discarded counts, the clocks and idleness come from one planning pass over the
log with the stream's default options (the batch-read path: the same code a query runs), so a
scrape costs what planning a batch read of the stream costs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .api import rowtime_bound_us
from .bounds.bounds import END_OF_STREAM_US
from .bounds.errors import OptionError
from .bounds.plan import idle_partitions
from .bounds.redaction import redact
from .datasource.options import parse_reader_options
from .datasource.planner import whole_step
from .streams.columns import LOG_ARRIVAL_US
from .streams.sink_state import SINK_DIR, SINK_TARGET_FILE
from .streams.storage import (
    LocationKind,
    StreamStorage,
    SupportsStoredBytes,
    open_stream,
    what_is_at,
)

INSTALL = (
    "the Prometheus client library is not installed; install it with "
    "pip install 'pyspark-rowtime[metrics]' (or pip install prometheus-client)"
)


def idle_since(
    stream: StreamStorage, timeout_us: int, lasts: Sequence[int | None] | None = None
) -> dict[int, int]:
    """The partitions idle now under ``timeout_us``, each with the arrival time of the record
    that made it idle: the first record of another partition that arrived more than the
    timeout after its own last record (its stream's creation before any). A partition at the
    end of stream is left out: it holds nothing back."""
    n = stream.meta.partitions
    created = stream.meta.created_us
    if lasts is None:
        lasts = []
        for p in range(n):
            tail = stream.tail(p)
            lasts.append(tail.last_arrival_us if tail.end else created)
    known = [x for x in lasts if x is not None]
    if not known:
        return {}
    latest = max(known)
    out = {}

    for p, last in enumerate(lasts):
        if last is None or latest <= last + timeout_us:
            continue
        if stream.clock_us(p) == END_OF_STREAM_US:
            continue
        after = [_first_arrival_after(stream, q, last + timeout_us) for q in range(n) if q != p]
        found = [a for a in after if a is not None]
        if found:
            out[p] = min(found)
    return out


def _first_arrival_after(stream: StreamStorage, partition: int, t_us: int) -> int | None:
    """The arrival of the first record of ``partition`` that arrived after ``t_us``: one
    segment read, found by its footer's last arrival."""
    for seg in stream.partition_stats(partition):
        if seg.count and seg.last_arrival_us > t_us:
            table = stream.read(partition, seg.first, seg.end, columns=[LOG_ARRIVAL_US])
            arrivals = table.column(0).to_numpy()
            i = int(np.searchsorted(arrivals, t_us, side="right"))
            return int(arrivals[i]) if i < len(arrivals) else None
    return None


def stream_label(location: str) -> str:
    """The ``stream`` label of a location's series: the location as given, redacted (a scrape
    is read by whoever can reach the port, and kept by Prometheus)."""
    return redact(location)


def _seconds(t_us: int | None) -> float | None:
    return None if t_us is None else t_us / 1e6


def _bytes(stream: StreamStorage, partition: int) -> int | None:
    """Bytes the partition takes where its backend says (the embedded log: its files), else
    None (a capability of the stream: ``SupportsStoredBytes``)."""
    return stream.stored_bytes(partition) if isinstance(stream, SupportsStoredBytes) else None


#: Targets of the sink that are not streams: only their clock is a series.
_TABLE_TARGETS = (
    LocationKind.PARQUET_TARGET,
    LocationKind.DELTA_TARGET,
    LocationKind.ICEBERG_TARGET,
)


def _is_sink_target(resolved: str) -> bool:
    return os.path.isfile(os.path.join(resolved, SINK_DIR, SINK_TARGET_FILE))


class RowtimeCollector:
    """A Prometheus collector (``prometheus_client``'s custom collector protocol) over the
    streams and sink targets at ``locations``, read afresh on every scrape."""

    def __init__(self, locations: Sequence[str]) -> None:
        self.locations = list(locations)

    def describe(self) -> list[Any]:
        return []  # no scrape at registration: a stream may not exist yet

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        by_part = ["stream", "partition"]
        g = {
            "partition_clock": GaugeMetricFamily(
                "rowtime_partition_clock_seconds",
                "Partition clock under the stream's default policy (seconds since the epoch)",
                labels=by_part,
            ),
            "stream_clock": GaugeMetricFamily(
                "rowtime_stream_clock_seconds",
                "Stream clock with the stream's defaults, idle_timeout included (seconds)",
                labels=["stream"],
            ),
            "lag": GaugeMetricFamily(
                "rowtime_clock_lag_seconds",
                "Arrival time of the newest record minus the clock (partition, or stream when "
                "the partition label is empty)",
                labels=by_part,
            ),
            "bytes": GaugeMetricFamily(
                "rowtime_bytes", "Bytes the partition's files take", labels=by_part
            ),
            "held": GaugeMetricFamily(
                "rowtime_held_rows", "Rows held by adjust now", labels=by_part
            ),
            "idle": GaugeMetricFamily(
                "rowtime_partition_idle",
                "1 while the partition is idle under the stream's idle_timeout",
                labels=by_part,
            ),
            "first_kept": GaugeMetricFamily(
                "rowtime_first_kept_offset",
                "First offset retention kept (0 when never trimmed)",
                labels=by_part,
            ),
            "sink_clock": GaugeMetricFamily(
                "rowtime_sink_clock_seconds",
                "Clock of a sink target (seconds since the epoch)",
                labels=["stream"],
            ),
        }
        c = {
            "records": CounterMetricFamily(
                "rowtime_records", "Records (rows and bounds) written", labels=by_part
            ),
            "discarded": CounterMetricFamily(
                "rowtime_discarded_rows",
                "Rows discarded under the stream's default policy (the quarantine)",
                labels=by_part,
            ),
        }
        for location in self.locations:
            self._collect_one(location, g, c)
        yield from g.values()
        yield from c.values()

    def _collect_one(self, location: str, g: dict[str, Any], c: dict[str, Any]) -> None:

        where = what_is_at(location)
        if where.kind in _TABLE_TARGETS or (
            where.kind is LocationKind.STREAM and _is_sink_target(where.resolved)
        ):
            clock = rowtime_bound_us(location)
            if clock is not None:
                g["sink_clock"].add_metric([stream_label(location)], clock / 1e6)
        if where.kind is not LocationKind.STREAM:
            return
        stream_metrics(location, g, c)


def stream_metrics(location: str, g: dict[str, Any], c: dict[str, Any]) -> None:
    """Add one stream's samples to the metric families ``g`` (gauges) and ``c`` (counters)."""
    stream = open_stream(location)
    meta = stream.meta
    cfg = parse_reader_options({"path": location}, meta.defaults)
    end = whole_step(cfg)[3]  # planned again if a writer's trim overtakes it
    tails = [stream.tail(p) for p in range(meta.partitions)]
    newest = max((t.last_arrival_us for t in tails if t.last_arrival_us is not None), default=None)
    idle: list[int] | None = None
    if cfg.idle_timeout_us is not None:
        lasts = [t.last_arrival_us if t.end else meta.created_us for t in tails]
        idle = idle_partitions(lasts, cfg.idle_timeout_us)
    label = stream_label(location)
    for p, (state, tail) in enumerate(zip(end.partitions, tails, strict=True)):
        labels = [label, str(p)]
        clock = state.clock_us(cfg.policy)
        if clock is not None:
            g["partition_clock"].add_metric(labels, clock / 1e6)
            if tail.last_arrival_us is not None:
                g["lag"].add_metric(labels, (tail.last_arrival_us - clock) / 1e6)
        c["records"].add_metric(labels, tail.end)
        size = _bytes(stream, p)
        if size is not None:
            g["bytes"].add_metric(labels, size)
        g["held"].add_metric(labels, state.held)
        c["discarded"].add_metric(labels, state.discarded)
        if idle is not None:
            g["idle"].add_metric(labels, 1 if p in idle else 0)
        g["first_kept"].add_metric(labels, stream.start_offset(p))
    if end.clock_us is not None:
        g["stream_clock"].add_metric([label], end.clock_us / 1e6)
        if newest is not None:
            g["lag"].add_metric([label, ""], (newest - end.clock_us) / 1e6)


def registry(locations: Sequence[str]) -> Any:
    """A ``prometheus_client`` registry holding only the rowtime collector of ``locations``."""
    try:
        from prometheus_client import CollectorRegistry
    except ImportError:
        raise OptionError(INSTALL) from None
    reg = CollectorRegistry(auto_describe=False)
    reg.register(RowtimeCollector(locations))
    return reg


def exposition(locations: Sequence[str]) -> str:
    """The Prometheus text format of the metrics of ``locations``."""
    reg = registry(locations)
    from prometheus_client import generate_latest

    return generate_latest(reg).decode("utf-8")


def serve(locations: Sequence[str], port: int, host: str = "127.0.0.1") -> Any:
    """Serve the metrics of ``locations`` at ``http://host:port/metrics`` from a daemon thread;
    returns the server (``shutdown()`` stops it)."""
    reg = registry(locations)  # first: it says what to install when the library is missing
    from prometheus_client import start_http_server

    result = start_http_server(port, addr=host, registry=reg)
    return result[0] if isinstance(result, tuple) else result

"""The demo's data set: freeway loop-detector readings, generated deterministically.

Modelled on the IBM Streams traffic example (seed 002: the maximum lane flow per freeway over
50-second intervals that slide every 25 seconds). Nothing here imports pyspark: the generator,
the replay schedule and the brute-force answers are plain numpy, so the fast tests and the
integration test can check the demo's numbers against them.

What makes it realistic, and what each property shows:

* **Partitions skewed by minutes.** Each partition is one district's adapter; district ``p``
  delivers its readings ``lag[p]`` after they were measured (from seconds to four minutes), so
  at any arrival time the partitions' rowtimes differ by minutes. The rowtime reader aligns them
  (the stream clock is the slowest partition's); Spark's own watermark is the fastest one's.
* **Rows out of order within a few seconds** (``JITTER_S``): each reading arrives up to three
  seconds after its district's lag, so arrival order is not rowtime order.
* **A few rows far too late**: about one row in 20,000 arrives minutes after its lag (a sensor
  that buffered during a radio outage). They break the adapter's promise (its bound) and are
  discarded by the policy, kept in the quarantine.
* **A quiet gap**: for ``GAP_S`` seconds of arrival time no reading arrives at all (the feed
  paused); the adapters keep sending bounds, so the stream clock keeps moving.

Times are whole microseconds since the epoch (the log's unit) unless a name says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: The first reading's rowtime: a Monday's morning rush, 07:00:00 UTC.
T0_US = 1_772_434_800_000_000  # 2026-03-02T07:00:00Z
SECOND = 1_000_000
FREEWAYS = ("I-5", "I-405", "US-101", "SR-99")
#: Out-of-order spread within a partition: a reading arrives up to this long after its lag.
JITTER_S = 3
#: The adjust policy keeps rows this many seconds behind the partition's highest rowtime.
ADJUST_RANGE_S = 5
#: IBM's example: 50-second intervals, one every 25 seconds.
INTERVAL_S = 50
PERIOD_S = 25
#: How long no reading arrives (arrival time); it starts halfway through the span, on a whole
#: number of minutes divisible by 3, so that replay steps of 60, 90, 120 or 180 s (which end on
#: multiples of themselves) have at least one step wholly inside it.
GAP_S = 180


@dataclass(frozen=True)
class DemoConfig:
    """The data set's size and the replay's pace.

    ``rows``: readings generated (before the quiet gap removes those that would arrive in it);
    ``partitions``: districts (adapters), >= 2; ``minutes``: event time covered;
    ``tick_s``: arrival seconds per replay step (each step writes what arrived, sends bounds and
    runs both Spark queries once: fewer, longer steps run faster); ``seed``: the generator's.
    """

    rows: int = 300_000
    partitions: int = 4
    minutes: float = 12.0
    tick_s: int = 180
    seed: int = 2009

    def __post_init__(self) -> None:
        if self.rows < 1000:
            raise ValueError(f"rows={self.rows}: give at least 1000 readings")
        if self.partitions < 2:
            raise ValueError(f"partitions={self.partitions}: give at least 2 (alignment needs 2)")
        if not 2 <= self.minutes <= 240:
            raise ValueError(f"minutes={self.minutes}: give 2 to 240 minutes of event time")
        if not 5 <= self.tick_s <= 600:
            raise ValueError(f"tick_s={self.tick_s}: give 5 to 600 seconds per replay step")


def partition_lags_s(partitions: int) -> np.ndarray:
    """Seconds between measuring and delivering, per partition: 5 s for the first district up
    to 240 s (four minutes) for the last, skewed towards the slow end."""
    shape = (np.arange(partitions) / (partitions - 1)) ** 1.5
    return np.round(5 + 235 * shape).astype(np.int64)


@dataclass
class DemoData:
    """Readings in arrival order per partition, and the replay schedule.

    Per partition ``p`` (arrays of equal length, in arrival order): ``rowtime[p]``,
    ``arrival[p]`` (simulated, microseconds), ``freeway[p]`` (index into ``FREEWAYS``),
    ``sensor[p]``, ``lane_flow[p]`` (vehicles per hour per lane), ``too_late[p]`` (generated far
    too late). ``ticks``: the arrival times ending each replay step (ascending);
    ``bounds[k][p]``: the bound partition ``p`` sends at the end of step ``k``, or -1 for none (its
    promise: every later reading has a rowtime at or above it, broken only by the far-too-late
    ones); after the last step every partition ends its stream.
    """

    config: DemoConfig
    lags_s: np.ndarray
    rowtime: list[np.ndarray]
    arrival: list[np.ndarray]
    freeway: list[np.ndarray]
    sensor: list[np.ndarray]
    lane_flow: list[np.ndarray]
    too_late: list[np.ndarray]
    ticks: np.ndarray
    bounds: np.ndarray
    gap_us: tuple[int, int] = field(default=(0, 0))

    @property
    def rows(self) -> int:
        return sum(len(r) for r in self.rowtime)

    def step_slices(self, k: int) -> list[slice]:
        """Per partition, the rows that arrive in step ``k``: ``(ticks[k-1], ticks[k]]``."""
        lo = -(2**62) if k == 0 else int(self.ticks[k - 1])
        hi = int(self.ticks[k])
        return [
            slice(
                int(np.searchsorted(a, lo, side="right")), int(np.searchsorted(a, hi, side="right"))
            )
            for a in self.arrival
        ]


def generate(config: DemoConfig | None = None) -> DemoData:
    """The data set for ``config`` (the same arrays for the same config, on any machine)."""
    c = config or DemoConfig()
    rng = np.random.default_rng(c.seed)
    span_us = int(c.minutes * 60 * SECOND)
    lags_s = partition_lags_s(c.partitions)
    sensors_per_partition = 24
    per_partition = np.full(c.partitions, c.rows // c.partitions)
    per_partition[: c.rows % c.partitions] += 1
    first_arrival = T0_US + int(lags_s.min()) * SECOND
    gap_start = T0_US + max(3, 3 * round(c.minutes / 6)) * 60 * SECOND
    gap = (gap_start, gap_start + GAP_S * SECOND)

    rowtimes, arrivals, freeways, sensors, flows, lates = [], [], [], [], [], []
    for p in range(c.partitions):
        n = int(per_partition[p])
        t = T0_US + np.sort(rng.integers(0, span_us, n))
        # Sensors of this district, each on one freeway: every district covers every freeway, so
        # each freeway's maximum needs all partitions (a dropped partition changes the answer).
        sensor_ids = p * 100 + np.arange(sensors_per_partition)
        sensor_fw = np.arange(sensors_per_partition) % len(FREEWAYS)
        which = rng.integers(0, sensors_per_partition, n)
        minute = (t - T0_US) / (60 * SECOND)
        # Rush hour builds over the span; each sensor has its own level; noise on top.
        level = 900 + 60 * (which % 7) + 25 * minute + 250 * np.sin(minute / 3 + p)
        flow = np.clip(level + rng.normal(0, 120, n), 0, None).astype(np.int32)
        a = t + lags_s[p] * SECOND + rng.integers(0, JITTER_S * SECOND, n)
        late = rng.random(n) < 1 / 20_000
        late[rng.integers(0, n)] = True  # at least one per partition, whatever the size
        a[late] += rng.integers(90 * SECOND, 300 * SECOND, int(late.sum()))
        # A far-too-late reading due in the gap is delivered once the feed resumes; punctual ones
        # due in it are lost with the feed (nothing arrives in the gap).
        held_up = late & (a >= gap[0]) & (a < gap[1])
        a[held_up] += gap[1] - gap[0]
        keep = (a < gap[0]) | (a >= gap[1])
        order = np.argsort(a[keep], kind="stable")
        rowtimes.append(t[keep][order])
        arrivals.append(a[keep][order])
        freeways.append(sensor_fw[which][keep][order].astype(np.int8))
        sensors.append(sensor_ids[which][keep][order].astype(np.int32))
        flows.append(flow[keep][order])
        lates.append(late[keep][order])

    last = max(int(a[-1]) for a in arrivals)
    tick_us = c.tick_s * SECOND
    start = first_arrival - first_arrival % tick_us + tick_us
    ticks = np.arange(start, last + 2 * tick_us, tick_us, dtype=np.int64)
    # The adapter's promise at arrival time a: later readings were measured after
    # a - lag - jitter (a reading arriving after a has rowtime > a - lag - JITTER_S). It sends
    # it only when it says more than its data did: a row implies a bound at its rowtime, and the
    # log refuses a bound below that; while readings flow, the adjust policy's range moves the
    # clock instead. So bounds go out in the quiet gap, a heartbeat of promises.
    bounds = np.full((len(ticks), c.partitions), -1, dtype=np.int64)
    for p in range(c.partitions):
        promise = ticks - (int(lags_s[p]) + JITTER_S) * SECOND
        arrived = np.searchsorted(arrivals[p], ticks, side="right")
        top = np.maximum.accumulate(rowtimes[p])
        highest = np.where(arrived > 0, top[np.maximum(arrived - 1, 0)], -1)
        bounds[:, p] = np.where(promise > highest, promise, -1)
    return DemoData(
        c, lags_s, rowtimes, arrivals, freeways, sensors, flows, lates, ticks, bounds, gap
    )


# -- the answers, brute force ---------------------------------------------------------------------


def adjust_discards(rowtime: np.ndarray, is_bound: np.ndarray) -> np.ndarray:
    """Which data records SPEC 6's ``adjust`` (unit sec, range ``ADJUST_RANGE_S``) discards,
    one record at a time, for one partition's records in log order (rows and bounds). Returns a
    boolean per record (False for bounds)."""
    ref: int | None = None
    bound: int | None = None
    out = np.zeros(len(rowtime), dtype=bool)
    for i, (t, b) in enumerate(zip(rowtime.tolist(), is_bound.tolist(), strict=True)):
        t = t - t % SECOND  # truncated to the unit, rows and bounds alike
        if b:
            bound = t if bound is None else max(bound, t)
            continue
        clock = None if ref is None else ref - ADJUST_RANGE_S * SECOND
        if bound is not None:
            clock = bound if clock is None else max(clock, bound)
        if clock is not None and t < clock:
            out[i] = True
            continue
        ref = t if ref is None else max(ref, t)
    return out


def panes_of(rowtime_us: np.ndarray) -> list[tuple[int, int]]:
    """The IBM panes ``[N*25 s, N*25 s + 50 s)`` each rowtime falls in, as (row, pane start)."""
    pairs = []
    for i, t in enumerate(rowtime_us.tolist()):
        n_last = t // (PERIOD_S * SECOND)
        for n in range(n_last, -1, -1):
            start = n * PERIOD_S * SECOND
            if start + INTERVAL_S * SECOND <= t:
                break
            pairs.append((i, start))
    return pairs


def max_flow(
    rowtime: np.ndarray, freeway: np.ndarray, lane_flow: np.ndarray
) -> dict[tuple[str, int], int]:
    """The maximum lane flow per (freeway, pane start in microseconds), by brute force."""
    best: dict[tuple[str, int], int] = {}
    for i, start in panes_of(rowtime):
        key = (FREEWAYS[int(freeway[i])], start)
        best[key] = max(best.get(key, -1), int(lane_flow[i]))
    return best


def log_order(data: DemoData, p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Partition ``p``'s records in the order the replay writes them (each step's readings in
    arrival order, then that step's bound, if any): ``(rowtime, is_bound, row)`` where ``row``
    indexes the partition's arrays (-1 for a bound). The end-of-stream bound is not included."""
    times, flags, rows = [], [], []
    for k in range(len(data.ticks)):
        s = data.step_slices(k)[p]
        times.append(data.rowtime[p][s])
        flags.append(np.zeros(s.stop - s.start, dtype=bool))
        rows.append(np.arange(s.start, s.stop))
        if data.bounds[k, p] >= 0:
            times.append(data.bounds[k, p : p + 1])
            flags.append(np.ones(1, dtype=bool))
            rows.append(np.full(1, -1))
    return np.concatenate(times), np.concatenate(flags), np.concatenate(rows)


def expected(data: DemoData) -> tuple[list[np.ndarray], dict[tuple[str, int], int]]:
    """The brute-force answers: per partition, which readings the adjust policy discards (a
    boolean per reading), and the maximum lane flow per (freeway, pane start) over the rest."""
    discarded = []
    times, freeways, flows = [], [], []
    for p in range(data.config.partitions):
        t, b, row = log_order(data, p)
        gone = np.zeros(len(data.rowtime[p]), dtype=bool)
        gone[row[~b]] = adjust_discards(t, b)[~b]
        discarded.append(gone)
        # Kept rows enter the windows with the rowtime truncated to the policy's unit (sec).
        kept_t = data.rowtime[p][~gone]
        times.append(kept_t - kept_t % SECOND)
        freeways.append(data.freeway[p][~gone])
        flows.append(data.lane_flow[p][~gone])
    best = max_flow(np.concatenate(times), np.concatenate(freeways), np.concatenate(flows))
    return discarded, best

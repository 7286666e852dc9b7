"""The demo's figure: time as each query saw it (needs matplotlib: the ``demo`` extra).

Two panels share the axes: x is arrival time (simulated, when a reading reached Spark), y is
rowtime (when it was measured), both as minutes after the first reading. Each dot is a reading
(a sample), coloured by district; a district running minutes late sits to the right of the
diagonal. The top panel is this project: the partition clocks and the stream clock (the bound
staircase), the watermark of its query, discarded readings, and each window at (when it was
emitted, its end). The bottom panel is plain Spark on the same readings: its watermark, the
readings it lost, and its windows.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .demo_data import SECOND, T0_US, DemoData, log_order

if TYPE_CHECKING:
    from .demo import Trace

_END = 253402300799_000000


def _minutes(us: Any) -> Any:
    return (np.asarray(us, dtype=np.float64) - T0_US) / (60 * SECOND)


def _steps(x: list[int], y: list[int | None]) -> tuple[np.ndarray, np.ndarray]:
    """A staircase through the known points (None: not yet known; end of stream: off the top)."""
    pts = [(a, b) for a, b in zip(x, y, strict=True) if b is not None and 0 < b < _END]
    if not pts:
        return np.array([]), np.array([])
    xs, ys = zip(*pts, strict=True)
    return _minutes(xs), _minutes(ys)


def draw(
    data: DemoData,
    trace: Trace,
    discards: list[dict[str, Any]],
    path: Path,
    *,
    spark_delay_s: int,
    lost_all: int,
) -> None:
    """Write the figure to ``path`` (PNG): plain Spark ran with a watermark delay of
    ``spark_delay_s`` and lost ``lost_all`` readings from every window they belong to (the demo
    computes both; the figure draws them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(11, 10), sharex=True, sharey=True, dpi=90)
    colors = plt.get_cmap("viridis")(np.linspace(0, 0.85, data.config.partitions))
    rng = np.random.default_rng(0)
    arrival_steps = trace.step_arrival
    for ax in axes:
        for p in range(data.config.partitions):
            n = len(data.rowtime[p])
            pick = rng.choice(n, size=min(n, 1500), replace=False)
            ax.scatter(
                _minutes(data.arrival[p][pick]),
                _minutes(data.rowtime[p][pick]),
                s=2,
                color=colors[p],
                alpha=0.35,
                linewidths=0,
                label=f"district {p} (delivers {int(data.lags_s[p])} s late)",
            )
        g0, g1 = _minutes(data.gap_us)
        ax.axvspan(g0, g1, color="0.85", zorder=0, label="quiet gap: no reading arrives")
        ax.grid(alpha=0.3)

    # -- top: this project
    ax = axes[0]
    for p in range(data.config.partitions):
        x, y = _steps(arrival_steps, [c[p] for c in trace.partition_clock])
        ax.step(
            x,
            y,
            where="post",
            color=colors[p],
            lw=0.8,
            alpha=0.8,
            label="district clocks (thin: highest rowtime or bound)" if p == 0 else None,
        )
    x, y = _steps(arrival_steps, trace.stream_clock)
    ax.step(x, y, where="post", color="black", lw=2.2, label="stream clock (slowest district)")
    x, y = _steps(arrival_steps, trace.a_watermark)
    ax.step(
        x,
        y,
        where="post",
        color="tab:orange",
        lw=1.4,
        ls="--",
        label="Spark watermark of query (a)",
    )
    by_offset = {p: log_order(data, p)[2] for p in range(data.config.partitions)}
    xs, ys = [], []
    for d in discards:
        row = int(by_offset[d["partition"]][d["offset"]])
        xs.append(data.arrival[d["partition"]][row])
        ys.append(data.rowtime[d["partition"]][row])
    if xs:
        ax.scatter(
            _minutes(xs),
            _minutes(ys),
            marker="x",
            s=30,
            color="red",
            lw=1.8,
            zorder=5,
            label=f"discarded by order=adjust ({len(xs)}, in the quarantine)",
        )
    _windows(ax, trace.a_windows, arrival_steps, "tab:blue")
    ax.set_title(
        "(a) format('rowtime'): order=adjust, aligned districts, bounds in the gap; "
        "time_interval_aggregate",
        fontsize=10,
    )

    # -- bottom: plain Spark
    ax = axes[1]
    x, y = _steps(arrival_steps[: len(trace.b_watermark)], trace.b_watermark)
    ax.step(
        x,
        y,
        where="post",
        color="tab:red",
        lw=2.2,
        label=f"Spark watermark (max rowtime - {spark_delay_s} s)",
    )
    ax.fill_between(
        x,
        0 if len(y) == 0 else min(0.0, float(np.min(y))),
        y,
        step="post",
        color="tab:red",
        alpha=0.07,
        label=f"below it: dropped as late, no trace ({lost_all:,} readings lost)",
    )
    _windows(ax, trace.b_windows, arrival_steps, "tab:purple")
    if len(x):
        ax.annotate(
            "no new data, no batch: the watermark is stuck\nand the last windows never close",
            xy=(float(x[-1]) - 4, float(y[-1])),
            xytext=(float(x[-1]) - 9, float(y[-1]) - 3.5),
            fontsize=9,
            arrowprops={"arrowstyle": "->", "color": "0.3"},
        )
    g0, g1 = _minutes(data.gap_us)
    # Point at the stream clock where the gap ends; the text sits above the diagonal, where no
    # reading can be (none arrives before it was measured).
    in_gap = [k for k, a in enumerate(arrival_steps) if a <= data.gap_us[1]]
    clock_end = trace.stream_clock[in_gap[-1]] if in_gap else None
    if clock_end is not None and clock_end < _END:
        axes[0].annotate(
            "in the quiet gap the adapters' bounds\nmove the clock, and windows close",
            xy=(float(g1), float(_minutes(clock_end))),
            xytext=(0.3, data.config.minutes * 0.75),
            fontsize=9,
            arrowprops={"arrowstyle": "->", "color": "0.3"},
        )
    ax.set_title(
        f"(b) plain Spark: Parquet files, withWatermark('rowtime', "
        f"'{spark_delay_s} seconds'), groupBy(window(...))",
        fontsize=10,
    )

    for ax in axes:
        ax.set_ylabel("rowtime (minutes after 07:00:00)")
        ax.legend(loc="lower right", fontsize=8, markerscale=1.5, framealpha=0.9)
    axes[1].set_xlabel("arrival time (minutes after 07:00:00, simulated)")
    lo = float(_minutes(min(int(a.min()) for a in data.arrival))) - 0.5
    axes[1].set_xlim(lo, float(_minutes(arrival_steps[-1])) + 0.5)
    axes[1].set_ylim(-0.5, data.config.minutes + 0.5)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _windows(
    ax: Any, windows: list[tuple[str, int, int, int, int]], arrival: list[int], color: str
) -> None:
    """Each emitted window as a tick at (step it was emitted, window end)."""
    if not windows:
        return
    ends = sorted({(w[4], w[2]) for w in windows})
    x = _minutes([arrival[step] for step, _ in ends])
    y = _minutes([end for _, end in ends])
    ax.scatter(
        x,
        y,
        marker="_",
        s=120,
        color=color,
        lw=2,
        zorder=4,
        label=f"window emitted (at its end; {len(windows)} rows)",
    )

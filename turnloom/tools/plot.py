"""A picture of one load test: ``turnloom loadtest --plot FILE``.

The only module that imports matplotlib (the ``plot`` extra), and only when a
plot is drawn.
"""

from __future__ import annotations

__all__ = ("PLOT_FORMATS", "bucket_seconds", "check_plot_path", "plot_loadtest", "windows")

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from turnloom.errors import MissingDependencyError
from turnloom.tools._stats import percentile
from turnloom.tools.loadtest import LoadtestReport, LoadtestSamples

PLOT_FORMATS = (".png", ".svg")
_WINDOWS = 60  # time windows across the run, whatever its length


def check_plot_path(path: Path) -> str | None:
    """Why ``path`` cannot name a plot (a full sentence), or None when it can.

    Checks the suffix and that matplotlib can be imported; writability is the
    caller's check, as for every output.
    """
    if str(path) == "-":
        return "--plot cannot write standard output ('-'): give FILE.png or FILE.svg."
    if path.suffix.lower() not in PLOT_FORMATS:
        return f"--plot {path} must end in .png or .svg."
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "--plot needs matplotlib: pip install 'turnloom[plot]'."
    return None


def bucket_seconds(seconds: float) -> float:
    """The width of one time window, in seconds: the run cut into about 60, at least 10 ms."""
    return max(seconds / _WINDOWS, 0.01)


def windows(
    at: Sequence[float], values: Sequence[float], width: float, count: int
) -> list[list[float]]:
    """``values`` grouped by the window of width ``width`` their time ``at`` falls in.

    Returns:
        ``count`` lists, window 0 first; a time past the last window goes in it.
    """
    grouped: list[list[float]] = [[] for _ in range(count)]
    for when, value in zip(at, values, strict=True):
        grouped[min(int(when / width), count - 1)].append(value)
    return grouped


def plot_loadtest(samples: LoadtestSamples, report: LoadtestReport, path: Path) -> None:
    """Draw the run's prepare latency, loop lag, GC pauses and throughput over time.

    Four panels sharing the time axis (seconds since the sessions started):
    prepare latency p50/p95/p99 per window (ms), the event-loop lag's
    worst wake-up per window (ms), every garbage-collection pause (ms, full
    collections marked), and prepares per second per window. The format
    follows the suffix (``.png`` or ``.svg``).

    Raises:
        MissingDependencyError: matplotlib is not installed (the ``plot`` extra).
        OSError: ``path`` cannot be written.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a window
        from matplotlib import pyplot
    except ImportError as exc:
        raise MissingDependencyError(
            "turnloom loadtest --plot needs matplotlib: pip install 'turnloom[plot]'.",
            package="matplotlib",
            extra="plot",
        ) from exc
    width = bucket_seconds(samples.seconds)
    count = max(1, math.ceil(samples.seconds / width))
    mids = [(i + 0.5) * width for i in range(count)]
    latency = windows(samples.prepare_at, samples.prepare_latency, width, count)
    lag = windows(samples.lag_at, samples.lag, width, count)

    figure, axes = pyplot.subplots(4, 1, sharex=True, figsize=(9, 10), layout="constrained")
    try:
        figure.suptitle(
            f"turnloom loadtest: {report.sessions} sessions, {report.prepares} prepares "
            f"in {report.seconds:.2f} s"
        )
        _latency_panel(axes[0], mids, latency)
        axes[1].plot(mids, [max(w, default=0.0) * 1000 for w in lag], color="tab:red")
        axes[1].set_ylabel("loop lag, max (ms)")
        _gc_panel(axes[2], samples)
        axes[3].bar(mids, [len(w) / width for w in latency], width=width * 0.9, color="tab:green")
        axes[3].set_ylabel("prepares/s")
        axes[3].set_xlabel("seconds since the sessions started")
        for ax in axes:
            ax.grid(True, alpha=0.3)
        figure.savefig(path, format=path.suffix.lower().removeprefix("."))
    finally:
        pyplot.close(figure)


def _latency_panel(ax: Any, mids: list[float], latency: list[list[float]]) -> None:
    for rank, style in ((50, "-"), (95, "--"), (99, ":")):
        points = [(m, percentile(w, rank) * 1000) for m, w in zip(mids, latency, strict=True) if w]
        ax.plot([m for m, _ in points], [v for _, v in points], style, label=f"p{rank}")
    ax.set_ylabel("prepare latency (ms)")
    ax.legend(loc="upper right")


def _gc_panel(ax: Any, samples: LoadtestSamples) -> None:
    for full, colour, label in ((False, "tab:gray", "gen 0/1"), (True, "tab:purple", "full")):
        picked = [
            (at, pause * 1000)
            for at, pause, generation in zip(
                samples.gc_at, samples.gc_pause, samples.gc_generation, strict=True
            )
            if (generation == 2) is full
        ]
        if picked:
            ax.vlines([a for a, _ in picked], 0, [p for _, p in picked], color=colour, label=label)
    ax.set_ylabel("GC pause (ms)")
    if samples.gc_at:
        ax.legend(loc="upper right")

"""``turnloom loadtest --processes N``: one workload spread over N processes.

Each process is a ``turnloom loadtest`` of its share of the sessions
(process ``k`` runs a contiguous range of session numbers, all under one run
id), usually sharing one store (``--store redis://...``). The parent starts
them together, waits for all, and adds their reports up.
"""

from __future__ import annotations

__all__ = ("FleetReport", "run_fleet")

import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from turnloom.errors import InputError
from turnloom.tools.loadtest import LoadtestReport, RunFigures


class FleetReport(RunFigures, frozen=True, kw_only=True):
    """The aggregate of one multi-process load test: :class:`RunFigures` added up.

    How each figure adds up (:data:`_SUMMED`, :data:`_WORST`): ``sessions``,
    ``sessions_failed``, ``turns``, ``model_calls``, ``prepares``,
    ``rejections``, ``evicted_turns``, ``takeovers``,
    ``gc_full_collections``, ``gc_full_steady``, ``collector_steps``,
    ``collector_thorough_steps``, ``render_seconds`` and ``cpu_seconds`` are
    summed (``cpu_seconds / prepares`` is the fleet's CPU per prepare);
    ``seconds`` is the longest process's wall time and
    ``prepares_per_second`` ``prepares / seconds``, the aggregate throughput;
    the latencies, lags, ``gc_pause_max_ms``, ``gc_full_cpu_max_ms`` and
    ``collector_step_cpu_max_ms`` are the worst process's
    (percentiles and pauses of different processes do not add up);
    ``think_time`` and ``store`` are the same in every process; ``errors``
    are the first few of all processes.

    Attributes:
        processes: processes run.
        peak_rss_bytes: each process's peak resident set size, in bytes.
    """

    processes: int
    peak_rss_bytes: tuple[int, ...]


_SUMMED = (
    "sessions",
    "sessions_failed",
    "turns",
    "model_calls",
    "gc_full_collections",
    "gc_full_steady",
    "collector_steps",
    "collector_thorough_steps",
    "rejections",
    "evicted_turns",
    "takeovers",
    "render_seconds",
    "cpu_seconds",
)
"""The figures a fleet sums over its processes."""
_WORST = (
    "prepare_p50_ms",
    "prepare_p95_ms",
    "prepare_p99_ms",
    "loop_lag_p99_ms",
    "loop_lag_max_ms",
    "gc_pause_max_ms",
    "gc_full_cpu_max_ms",
    "collector_step_cpu_max_ms",
)
"""The figures a fleet takes from its worst process (the largest)."""
_LOWEST = ("prefix_reuse", "prefix_reuse_tokens")
"""The figures a fleet takes from its lowest process: a process's prompt cache share is
its own contexts', and the shares of different processes are not weighted here."""


def aggregate(reports: Sequence[LoadtestReport]) -> FleetReport:
    """Add the reports of the processes of one run up (see :class:`FleetReport`)."""
    seconds = max(r.seconds for r in reports)
    prepares = sum(r.prepares for r in reports)
    figures: dict[str, Any] = {n: sum(getattr(r, n) for r in reports) for n in _SUMMED}
    figures.update({n: max(getattr(r, n) for r in reports) for n in _WORST})
    figures.update({n: min(getattr(r, n) for r in reports) for n in _LOWEST})
    return FleetReport(
        processes=len(reports),
        prepares=prepares,
        seconds=seconds,
        prepares_per_second=prepares / seconds if seconds else 0.0,
        peak_rss_bytes=tuple(r.peak_rss_bytes for r in reports),
        think_time=reports[0].think_time,
        store=reports[0].store,
        errors=tuple(e for r in reports for e in r.errors)[:10],
        **figures,
    )


def run_fleet(common: Sequence[str], *, processes: int, sessions: int, run_id: str) -> FleetReport:
    """Run ``sessions`` over ``processes`` ``turnloom loadtest`` processes; add them up.

    Args:
        common: the loadtest options every process gets (``--turns``,
            ``--source``, ``--gateway``, ``--backend``, ``--think-time``,
            ``--config``, ``--store``).
        processes: how many processes (at most ``sessions``).
        sessions: sessions in all, split as evenly as possible.
        run_id: the context-id prefix the processes share.

    Raises:
        InputError: more processes than sessions, or a process failed
            without a report (its stderr is quoted).
    """
    if processes > sessions:
        raise InputError(f"{processes} processes cannot share {sessions} sessions.")
    with tempfile.TemporaryDirectory(prefix="turnloom-fleet-") as folder:
        children: list[tuple[subprocess.Popen[bytes], Path]] = []
        first = 0
        for k in range(processes):
            share = sessions // processes + (1 if k < sessions % processes else 0)
            report = Path(folder) / f"process-{k}.json"
            argv = [
                sys.executable,
                "-m",
                "turnloom",
                "loadtest",
                *common,
                "--sessions",
                str(share),
                "--first-session",
                str(first),
                "--run-id",
                run_id,
                "--json",
                str(report),
                "--no-progress",
            ]
            children.append(
                (subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), report)
            )
            first += share
        reports: list[LoadtestReport] = []
        failures: list[str] = []
        for child, path in children:
            _, stderr = child.communicate()
            if path.exists():
                reports.append(msgspec.json.decode(path.read_bytes(), type=LoadtestReport))
            else:
                failures.append(stderr.decode(errors="replace").strip()[-300:])
        if failures:
            raise InputError(f"A loadtest process failed: {failures[0]!r}")
    return aggregate(reports)

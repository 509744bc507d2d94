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

import msgspec

from turnloom.errors import InputError
from turnloom.tools.loadtest import LoadtestReport


class FleetReport(msgspec.Struct, frozen=True, kw_only=True):
    """The aggregate of one multi-process load test.

    Attributes:
        processes: processes run.
        sessions, sessions_failed, turns, model_calls, prepares, rejections,
            evicted_turns, takeovers: sums over the processes.
        seconds: the longest process's wall time, in seconds.
        prepares_per_second: ``prepares / seconds``: the aggregate throughput.
        prepare_p50_ms, prepare_p95_ms, prepare_p99_ms, loop_lag_p99_ms,
            loop_lag_max_ms, gc_pause_max_ms: the worst process's value, in
            milliseconds (percentiles and pauses of different processes do not
            add up).
        gc_full_collections, gc_full_steady, collector_steps,
            collector_thorough_steps: summed.
        gc_full_cpu_max_ms, collector_step_cpu_max_ms: the worst process's
            longest full collection and collector step (CPU, milliseconds).
        peak_rss_bytes: each process's peak resident set size, in bytes.
        think_time: the sessions' pause between turns, in seconds (the same in
            every process).
        render_seconds, cpu_seconds: worker render time and whole-process CPU
            time, in seconds, summed (``cpu_seconds / prepares`` is the CPU per
            prepare of the fleet).
        store: the store URL (``""``: memory only).
        errors: the first few error messages of all processes.
    """

    processes: int
    sessions: int
    sessions_failed: int
    turns: int
    model_calls: int
    prepares: int
    seconds: float
    prepares_per_second: float
    prepare_p50_ms: float
    prepare_p95_ms: float
    prepare_p99_ms: float
    loop_lag_p99_ms: float
    loop_lag_max_ms: float
    gc_full_collections: int
    gc_pause_max_ms: float
    peak_rss_bytes: tuple[int, ...]
    rejections: int
    evicted_turns: int
    takeovers: int
    think_time: float
    render_seconds: float
    cpu_seconds: float
    store: str
    errors: tuple[str, ...]
    gc_full_cpu_max_ms: float = 0.0
    gc_full_steady: int = 0
    collector_steps: int = 0
    collector_thorough_steps: int = 0
    collector_step_cpu_max_ms: float = 0.0


def aggregate(reports: Sequence[LoadtestReport]) -> FleetReport:
    """Add the reports of the processes of one run up (see :class:`FleetReport`)."""
    seconds = max(r.seconds for r in reports)
    prepares = sum(r.prepares for r in reports)
    return FleetReport(
        processes=len(reports),
        sessions=sum(r.sessions for r in reports),
        sessions_failed=sum(r.sessions_failed for r in reports),
        turns=sum(r.turns for r in reports),
        model_calls=sum(r.model_calls for r in reports),
        prepares=prepares,
        seconds=seconds,
        prepares_per_second=prepares / seconds if seconds else 0.0,
        prepare_p50_ms=max(r.prepare_p50_ms for r in reports),
        prepare_p95_ms=max(r.prepare_p95_ms for r in reports),
        prepare_p99_ms=max(r.prepare_p99_ms for r in reports),
        loop_lag_p99_ms=max(r.loop_lag_p99_ms for r in reports),
        loop_lag_max_ms=max(r.loop_lag_max_ms for r in reports),
        gc_full_collections=sum(r.gc_full_collections for r in reports),
        gc_pause_max_ms=max(r.gc_pause_max_ms for r in reports),
        peak_rss_bytes=tuple(r.peak_rss_bytes for r in reports),
        rejections=sum(r.rejections for r in reports),
        evicted_turns=sum(r.evicted_turns for r in reports),
        takeovers=sum(r.takeovers for r in reports),
        think_time=reports[0].think_time,
        render_seconds=sum(r.render_seconds for r in reports),
        cpu_seconds=sum(r.cpu_seconds for r in reports),
        store=reports[0].store,
        errors=tuple(e for r in reports for e in r.errors)[:10],
        gc_full_cpu_max_ms=max(r.gc_full_cpu_max_ms for r in reports),
        gc_full_steady=sum(r.gc_full_steady for r in reports),
        collector_steps=sum(r.collector_steps for r in reports),
        collector_thorough_steps=sum(r.collector_thorough_steps for r in reports),
        collector_step_cpu_max_ms=max(r.collector_step_cpu_max_ms for r in reports),
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

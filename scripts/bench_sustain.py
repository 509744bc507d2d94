"""Sessions one process sustains, this tree against a baseline tree, beside a control ticker.

Issue 32's last goal: the sessions one process sustains at a prepare p99
under 50 ms with a 2 s think time, at least 1.5x the baseline's (the tree at
``--against``, by default a worktree of 7159b43, the last commit before issue
32's work).

For each backend (asyncio, trio) and each of ``--rounds`` rounds, one
sustained search per tree, both searches stepping together, one run of each
in turn (the first tree alternating between rounds), so both see the same
machine. The search is this tree's plan
(:class:`turnloom.tools.loadtest._SustainedSearch`, the one ``turnloom
loadtest --sustained`` follows), the same for both trees: doubling from
``--start`` sessions while runs hold, halving while they miss, then bisecting
until the count that missed is at most ``--precision`` times the count that
held. A run holds when its prepare p99 is under 50 ms and no session failed.

Each run is a fresh process of its tree, ``python -m turnloom loadtest
--sessions N --turns M --think-time 2 --backend B --json FILE``, started with
that tree as its working directory and ``PYTHONPATH`` (each tree's
``turnloom.__file__`` is printed first): the built-in workload, ``--turns``
turns per session, histories at their default limits. Beside each run the
bare control ticker (``scripts/_control.py``, its own process, waking every
5 ms) measures the lag the machine alone causes; its p99 and max are printed
beside the run's own loop lag, for the run to be read against the machine's
noise, with the machine's load average (1 minute) after the run.

Per backend it prints each round's sustained count of each tree with its
bracket (held, missed), their ratio with the bracket's ratio range, the
median ratio beside the goal (``>=1.5x``, met or MISSED), and the spread
across rounds (the noise): each tree's counts, min to max, and the control
ticker's lag over the rounds' runs.

Usage: python scripts/bench_sustain.py [--against /work/wt-base] [--rounds R] [--turns M]
       [--start N] [--precision P] [--backend asyncio trio]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import _goals
from _control import control_ticker, lag_summary

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _HERE)  # this tree's search plan, whatever the editable install points at

from turnloom.tools.loadtest import _SustainedSearch  # noqa: E402

_GOAL = 1.5  # issue 32: at least 1.5x the baseline's sustained sessions
_P99_LIMIT_MS = 50.0
_THINK_TIME = 2.0


def _env(tree: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": tree}


def _origin(tree: str) -> str:
    """The ``turnloom.__file__`` a run of ``tree`` imports; it must lie in ``tree``."""
    found = subprocess.run(
        [sys.executable, "-c", "import turnloom; print(turnloom.__file__)"],
        cwd=tree,
        env=_env(tree),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not found.startswith(os.path.join(tree, "")):
        raise SystemExit(f"{tree} imports turnloom from {found}, not from itself.")
    return found


def _run(
    tree: str, backend: str, sessions: int, turns: int
) -> tuple[dict[str, Any], dict[str, float]]:
    """One load test of ``tree`` in its own process: its JSON report, the control ticker's lags."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "report.json")
        command = [
            sys.executable,
            "-m",
            "turnloom",
            "loadtest",
            "--sessions",
            str(sessions),
            "--turns",
            str(turns),
            "--think-time",
            str(_THINK_TIME),
            "--backend",
            backend,
            "--no-progress",
            "--json",
            path,
        ]
        with control_ticker() as ticks:
            done = subprocess.run(
                command,
                cwd=tree,
                env=_env(tree),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        if done.returncode not in (0, 1) or not os.path.exists(path):  # 1: a session failed
            raise SystemExit(f"{' '.join(command)} in {tree} failed:\n{done.stderr}")
        with open(path) as file:
            report: dict[str, Any] = json.load(file)
    return report, lag_summary(ticks)


class _Side:
    """One tree's search in one round: its plan and its runs' control lags."""

    def __init__(self, name: str, tree: str, start: int, precision: float) -> None:
        self.name = name
        self.tree = tree
        self.search = _SustainedSearch(start=start, precision=precision, max_sessions=100_000)
        self.runs = 0
        self.control: list[dict[str, float]] = []


def _ratio(top: float, bottom: float) -> float:
    return top / bottom if bottom else float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="/work/wt-base", help="the baseline tree (its path)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--turns", type=int, default=8, help="turns per session (default: 8)")
    parser.add_argument("--start", type=int, default=1000, help="the first session count")
    parser.add_argument("--precision", type=float, default=1.1)
    parser.add_argument("--backend", nargs="+", default=["asyncio", "trio"])
    args = parser.parse_args()
    trees = {"baseline": os.path.abspath(args.against), "current": _HERE}
    for name, tree in trees.items():
        print(f"{name:<9}{tree}  imports {_origin(tree)}")
    print(
        f"search: start {args.start} sessions, {args.turns} turns each, think time "
        f"{_THINK_TIME:g} s, p99 < {_P99_LIMIT_MS:g} ms, precision {args.precision:g}; "
        f"began {time.strftime('%H:%M:%S', time.gmtime())} UTC, load average "
        f"{os.getloadavg()[0]:.2f}",
        flush=True,
    )
    print(
        f"{'round':<6}{'backend':<8}{'tree':<9}{'sessions':>9}{'p99 ms':>9}{'failed':>7}"
        f"{'held':>6}{'lag p99':>8}{'lag max':>8}{'ctl p99':>8}{'ctl max':>8}{'wall s':>7}"
        f"{'load':>6}"
    )
    results: dict[str, list[tuple[_Side, _Side]]] = {backend: [] for backend in args.backend}
    for round_ in range(args.rounds):
        for backend in args.backend:
            sides = [_Side(name, tree, args.start, args.precision) for name, tree in trees.items()]
            order = sides if round_ % 2 == 0 else sides[::-1]
            while any(side.search.next is not None for side in order):
                for side in order:
                    sessions = side.search.next
                    if sessions is None:
                        continue
                    report, control = _run(side.tree, backend, sessions, args.turns)
                    held = not report["sessions_failed"] and (
                        report["prepare_p99_ms"] < _P99_LIMIT_MS
                    )
                    side.search.record(held)
                    side.runs += 1
                    side.control.append(control)
                    print(
                        f"{round_ + 1:<6}{backend:<8}{side.name:<9}{sessions:>9}"
                        f"{report['prepare_p99_ms']:>9.1f}{report['sessions_failed']:>7}"
                        f"{'yes' if held else 'no':>6}{report['loop_lag_p99_ms']:>8.1f}"
                        f"{report['loop_lag_max_ms']:>8.1f}{control['p99_ms']:>8.1f}"
                        f"{control['max_ms']:>8.1f}{report['seconds']:>7.1f}{os.getloadavg()[0]:>6.1f}",
                        flush=True,
                    )
            results[backend].append((sides[0], sides[1]))
    print(
        f"ended {time.strftime('%H:%M:%S', time.gmtime())} UTC, load average "
        f"{os.getloadavg()[0]:.2f}"
    )
    _summary(results)


def _summary(results: dict[str, list[tuple[_Side, _Side]]]) -> None:
    """Per backend: each round's counts and ratio, the median ratio beside the goal, the spread."""
    print()
    print("Sustained sessions (held / missed; ratio: current held over baseline held, and the")
    print("range the brackets allow: current held / baseline missed .. current missed /")
    print("baseline held)")
    print(
        f"{'backend':<8}{'round':>6}{'baseline':>14}{'current':>14}{'ratio':>8}{'range':>14}"
        f"{'ctl p99':>8}{'ctl max':>8}{'runs':>6}"
    )
    for backend, rounds in results.items():
        ratios = []
        for number, (base, ours) in enumerate(rounds, 1):
            b, c = base.search, ours.search
            ratio = _ratio(c.good, b.good)
            ratios.append(ratio)
            low, high = _ratio(c.good, b.bad), _ratio(c.bad, b.good)
            control = base.control + ours.control
            print(
                f"{backend:<8}{number:>6}{f'{b.good} / {b.bad}':>14}{f'{c.good} / {c.bad}':>14}"
                f"{ratio:>7.2f}x{f'{low:.2f}-{high:.2f}x':>14}"
                f"{max(lag['p99_ms'] for lag in control):>8.1f}"
                f"{max(lag['max_ms'] for lag in control):>8.1f}"
                f"{base.runs + ours.runs:>6}"
            )
        median = statistics.median(ratios)
        base_counts = [base.search.good for base, _ in rounds]
        our_counts = [ours.search.good for _, ours in rounds]
        control = [lag for base, ours in rounds for lag in base.control + ours.control]
        p99s = [lag["p99_ms"] for lag in control]
        print(
            f"{backend:<8}median ratio {median:.2f}x, goal "
            f"{_goals.beside(median, _GOAL, at_least=True)}"
        )
        print(
            f"{'':<8}spread over {len(rounds)} rounds: baseline {min(base_counts)}-"
            f"{max(base_counts)}, current {min(our_counts)}-{max(our_counts)}, ratio "
            f"{min(ratios):.2f}-{max(ratios):.2f}x; control ticker lag p99 "
            f"{min(p99s):.1f}-{max(p99s):.1f} ms, max {max(lag['max_ms'] for lag in control):.1f}"
            " ms"
        )


if __name__ == "__main__":
    main()

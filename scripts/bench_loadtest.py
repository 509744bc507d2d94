"""``turnloom loadtest`` at 100 and 1,000 concurrent sessions, in one run.

Each session replays a 40-turn built-in trajectory (so every history passes
the 32-turn limit and evicts) with no model latency: this measures the
runtime saturated on its own CPU work. Prints both reports and the ratios
1,000/100 of throughput and p99 prepare latency.

Usage: python scripts/bench_loadtest.py [--turns M]
"""

from __future__ import annotations

import argparse

import anyio

from turnloom.tools.loadtest import LoadtestReport, loadtest
from turnloom.tools.trajectories import Trajectory, builtin_trajectories


def _line(report: LoadtestReport) -> str:
    return (
        f"{report.sessions:>5} sessions: {report.prepares_per_second:7.0f} prepares/s  "
        f"p50 {report.prepare_p50_ms:8.2f} ms  p99 {report.prepare_p99_ms:8.2f} ms  "
        f"loop lag p99 {report.loop_lag_p99_ms:6.2f} ms max {report.loop_lag_max_ms:7.2f} ms  "
        f"GC max {report.gc_pause_max_ms:7.2f} ms  "
        f"peak RSS {report.peak_rss_bytes / 2**20:6.1f} MiB  "
        f"rejections {report.rejections}  evictions {report.evicted_turns}"
    )


async def _one(trajectories: list[Trajectory], sessions: int, turns: int) -> LoadtestReport:
    return await loadtest(trajectories, sessions=sessions, turns=turns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=40)
    args = parser.parse_args()
    trajectories = builtin_trajectories(64, turns=(args.turns, args.turns))
    reports = {}
    for sessions in (100, 1000):
        reports[sessions] = anyio.run(_one, trajectories, sessions, args.turns)
        print(_line(reports[sessions]), flush=True)
    small, large = reports[100], reports[1000]
    print(
        f"ratio 1,000/100: throughput {large.prepares_per_second / small.prepares_per_second:.2f}x"
        f"   p99 latency {large.prepare_p99_ms / small.prepare_p99_ms:.2f}x"
    )


if __name__ == "__main__":
    main()

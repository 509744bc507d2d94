"""Stress: renders that fail part-way never corrupt a context (issue: failure-safe render).

Eight concurrent conversations per run commit turns (user text, or the results
of the calls left open by the newest turn, as an approval flow), record
outputs (text, calls, results, late outputs to older turns) and prepare, under
history limits that evict all the time, while the gateway raises at random
points of worker-thread renders (5% of render calls). Every prepared input is
compared with a cold render of the retained history (the oracle: the history
paired as one input with ``complete_pairs`` and rendered message by message,
no cache) and checked with the gateway's ``validate()``.

Runs on asyncio and trio, under both open-call policies, and prints each run's
counts and the total. Exit status 1 when any prepared input was wrong.

Usage: PYTHONPATH=$PWD python scripts/stress_render_failures.py [--prepares N] [--seed S]
(N per run, default 25,000: 100,000 prepares over the four runs.)
"""

from __future__ import annotations

import argparse
import sys
import time

import anyio

from tests.runtime.stress import StressReport, run_stress
from turnloom.context.pairing import OpenCallPolicy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepares", type=int, default=25_000, help="prepares per run")
    parser.add_argument("--seed", type=int, default=10)
    args = parser.parse_args()
    totals = {"prepares": 0, "failed": 0, "wrong": 0, "invalid": 0, "injected": 0}
    policies: tuple[OpenCallPolicy, ...] = ("exclude", "cancel")
    for backend in ("asyncio", "trio"):
        for policy in policies:
            began = time.perf_counter()

            async def one(policy: OpenCallPolicy = policy) -> StressReport:
                return await run_stress(prepares=args.prepares, seed=args.seed, policy=policy)

            report = anyio.run(one, backend=backend)
            print(
                f"{backend:7} {policy:7} prepares={report.prepares} failed={report.failed} "
                f"injected={report.injected} approvals={report.approvals} "
                f"evicted_turns={report.evicted_turns} wrong={report.wrong} "
                f"invalid={report.invalid} ({time.perf_counter() - began:.1f} s)"
            )
            for key in totals:
                totals[key] += getattr(report, key)
    print("total   " + " ".join(f"{k}={v}" for k, v in totals.items()))
    return 1 if totals["wrong"] or totals["invalid"] else 0


if __name__ == "__main__":
    sys.exit(main())

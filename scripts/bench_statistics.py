"""The cost of one ``statistics()`` scrape against the number of contexts held.

``ContextManager.statistics()`` reads running totals, so a scrape should cost
the same with 1,000 and with 100,000 contexts. This fills one Foundation with
N one-turn contexts (``accept_turn``), then times ``statistics()`` (best of
200 calls) and prints the time per scrape and its ratio to the smallest N,
measured in this run.

Usage: python scripts/bench_statistics.py [--sizes 1000,10000,100000]
"""

from __future__ import annotations

import argparse
import time

import anyio

from turnloom.context import Message, Role
from turnloom.runtime import Foundation, TurnSnapshot


async def _scrape_seconds(size: int) -> float:
    message = Message(role=Role.user, content="Where is my bag?")
    async with Foundation() as foundation:
        manager = foundation.manager
        for number in range(size):
            manager.accept_turn(
                TurnSnapshot(context_id=f"c{number}", turn_id="t1", input=(message,))
            )
        best = float("inf")
        for _ in range(200):
            begin = time.perf_counter()
            manager.statistics()
            best = min(best, time.perf_counter() - begin)
        assert manager.statistics().contexts == size
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="comma-separated counts")
    sizes = [int(s) for s in parser.parse_args().sizes.split(",")]
    print(f"{'contexts':>9} {'scrape us':>10} {'ratio':>6}")
    base = 0.0
    for size in sizes:
        seconds = anyio.run(_scrape_seconds, size)
        base = base or seconds
        print(f"{size:>9,} {seconds * 1e6:>10.1f} {seconds / base:>6.2f}")


if __name__ == "__main__":
    main()

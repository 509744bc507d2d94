"""The bare control ticker the load-test benches run beside turnloom, one program for all.

It is an asyncio program in its own process that sleeps 5 ms at a time and
notes, at each wake-up, the time (``time.perf_counter``, seconds) and how
late it woke (seconds, at least 0): the lag the machine alone causes, for
a load test's own loop lag to be read against.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

_PROGRAM = r"""
import asyncio, json, sys, time
TICK = 0.005
async def main():
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_reader(sys.stdin.fileno(), stop.set)
    ticks = []
    while not stop.is_set():
        expected = time.perf_counter() + TICK
        await asyncio.sleep(TICK)
        now = time.perf_counter()
        ticks.append((now, max(0.0, now - expected)))
    print(json.dumps(ticks))
asyncio.run(main())
"""


@contextmanager
def control_ticker() -> Iterator[list[tuple[float, float]]]:
    """Run the ticker for the block; the list it yields holds its (time, lag) ticks after it."""
    process = subprocess.Popen(
        [sys.executable, "-c", _PROGRAM], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    ticks: list[tuple[float, float]] = []
    try:
        yield ticks
    finally:
        out, _ = process.communicate("", timeout=30)
        ticks.extend((at, lag) for at, lag in json.loads(out))


def lag_summary(ticks: list[tuple[float, float]]) -> dict[str, float]:
    """The ticks' lag p99 and max, in milliseconds (``p99_ms``, ``max_ms``; 0 with no tick)."""
    lags = sorted(lag for _, lag in ticks)
    if not lags:
        return {"p99_ms": 0.0, "max_ms": 0.0}
    return {
        "p99_ms": lags[min(len(lags) - 1, int(len(lags) * 0.99))] * 1000,
        "max_ms": lags[-1] * 1000,
    }

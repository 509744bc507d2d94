"""Time to bytes at 100, 1,000 and 10,000 history items: encoding the body whole vs cached.

For each gateway and size, one Foundation holds one context of N items (the
turns of ``scripts/bench_prepare.py``: a user message, a tool call, its result
and an answer; the history stays at N items by eviction, one new turn per
step like a real agent). Each step commits a turn, prepares it, turns the
prefix into the request body's bytes both ways, and records the outputs:

* old: ``msgspec.json.encode(gateway.request_body(prefix.items))``, the
  whole body walked and encoded each call;
* new: ``manager.request_bytes(prefix)``, the closed turns' body items kept
  encoded (and merged, for Anthropic and Gemini) by the history.

Each path runs on a context of its own (the same turns), so the old path's
reads of ``PreparedContext.items``, which make turnloom copy the next
prefixes ahead in the worker, do not land in the new path's prepares; the
two bodies are checked equal every round. Printed: median microseconds of
prepare + body + encode per path, and each path's 10,000/100 ratio (the
goal for the new path is at most 2x). The sizes, gateways and both paths
take turns in one run, so load from elsewhere affects them alike.

Usage: python scripts/bench_bytes.py [--rounds R] [--backend asyncio|trio]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from contextlib import AsyncExitStack

import anyio
import msgspec
from bench_prepare import SIZES, _turn_outputs, bench_foundation, bench_turn

from turnloom.context import GatewayType
from turnloom.runtime import ContextPrepareRequest, Foundation

_encode = msgspec.json.Encoder().encode


class _Bench:
    """One context of ``size`` items for one gateway, turned into bytes one way; one turn per step.

    Each path has a context of its own: a host that reads ``PreparedContext.items``
    has its later prefixes copied ahead in the worker (sticky per context), which
    the ``request_bytes`` path must not pay for.
    """

    def __init__(self, foundation: Foundation, path: str) -> None:
        self.manager = foundation.manager
        self.path = path
        self.turn = 0
        self.times: list[float] = []
        self.body = b""  # the newest timed step's bytes

    async def step(self, *, timed: bool = True) -> None:
        manager = self.manager
        turn_id = f"t{self.turn}"
        manager.accept_turn(bench_turn(self.turn))
        if timed:
            begin = time.perf_counter()
            prefix = await manager.prepare(
                ContextPrepareRequest(context_id="bench", turn_id=turn_id)
            )
            if self.path == "old":
                self.body = _encode(manager.gateway.request_body(prefix.items))
            else:
                self.body = manager.request_bytes(prefix)
            self.times.append(time.perf_counter() - begin)
            del prefix  # freed here, not in the next step's timed prepare
        manager.record("bench", turn_id, _turn_outputs(self.turn))
        self.turn += 1


async def measure(rounds: int) -> dict[tuple[GatewayType, int], tuple[float, float]]:
    """Median seconds (old, new) of prepare + body + encode per (gateway, size)."""
    async with AsyncExitStack() as stack:
        benches: dict[tuple[GatewayType, int, str], _Bench] = {}
        for gateway in GatewayType:
            for size in SIZES:
                for path in ("old", "new"):
                    foundation = await bench_foundation(stack, size, gateway)
                    bench = _Bench(foundation, path)
                    while bench.manager.statistics().history.items < size:
                        await bench.step(timed=False)
                    for _ in range(10):  # warm up at the full size
                        await bench.step()
                    bench.times.clear()
                    benches[gateway, size, path] = bench
        # The held histories go to the permanent generation (see bench_peers.py).
        gc.collect()
        gc.freeze()
        order = random.Random(0)
        keys = list(benches)
        for _ in range(rounds):
            order.shuffle(keys)
            for key in keys:
                await benches[key].step()
            for gateway, size, path in keys:
                if path == "old" and benches[gateway, size, "new"].body != (
                    benches[gateway, size, "old"].body
                ):
                    raise AssertionError(f"{gateway}: the cached body differs from the encoded one")
        return {
            (gateway, size): (
                statistics.median(benches[gateway, size, "old"].times),
                statistics.median(benches[gateway, size, "new"].times),
            )
            for gateway in GatewayType
            for size in SIZES
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args()
    medians = anyio.run(measure, args.rounds, backend=args.backend)
    print("prepare + request body + encode to bytes (median microseconds)")
    header = f"{'gateway':<17}" + "".join(f"{f'{s} old':>11}{f'{s} new':>11}" for s in SIZES)
    print(header + f"{'old 10k/100':>13}{'new 10k/100':>13}")
    base, top = SIZES[0], SIZES[-1]
    for gateway in GatewayType:
        row = f"{gateway.value:<17}"
        for size in SIZES:
            old, new = medians[gateway, size]
            row += f"{old * 1e6:11.1f}{new * 1e6:11.1f}"
        old_ratio = medians[gateway, top][0] / medians[gateway, base][0]
        new_ratio = medians[gateway, top][1] / medians[gateway, base][1]
        print(row + f"{old_ratio:12.2f}x{new_ratio:12.2f}x")


if __name__ == "__main__":
    main()

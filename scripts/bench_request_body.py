"""What a request body in new containers costs: ``request_body`` at 100, 1,000 and 10,000 items.

``gateway.request_body(prefix.items)`` hands out a body shared with nothing
turnloom keeps (see ``turnloom/context/_fresh.py``): ``prefix.items`` is a
new copy of the prefix's kept items and the body is a new copy of what the
gateway's body writer folds them into. For each gateway and size, one
Foundation holds one context of N items (the turns of
``scripts/bench_prepare.py``, the history kept at N items by eviction, one new
turn per step) and each step times, on the same prefix, in alternating order:

* old: the zero-copy path the body used to be, the writer's fold over the
  prefix's kept items (``turnloom.context.body._written`` of
  ``prefix.native_items._shared()``), whose dicts are the caches themselves;
* new: ``gateway.request_body(prefix.items)``, what a host calls;
* bytes: ``manager.request_bytes(prefix)``, which copies nothing (it joins the
  closed turns' cached bytes).

The kept items are decoded before the timings (both paths read them; the
prepare decodes them in its worker once a host reads its prefixes' items).
Both bodies are checked equal every step. Printed: median microseconds per
path and size, and new/old at each size. The sizes, gateways and paths take
turns in one run, so load from elsewhere affects them alike. Also printed:
the copy mechanisms measured for the choice, on the 10,000-item body of each
gateway: copying the containers (``fresh_json``, the one used), decoding
the body's JSON bytes, and a msgspec encode/decode round trip.

Usage: python scripts/bench_request_body.py [--rounds R] [--backend asyncio|trio]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import anyio
import msgspec
from bench_prepare import SIZES, _turn_outputs, bench_foundation, bench_turn

from turnloom.context import GatewayType
from turnloom.context._fresh import fresh_json
from turnloom.context.body import _written
from turnloom.runtime import ContextPrepareRequest, Foundation, PreparedContext

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
PATHS = ("old", "new", "bytes")


class _Bench:
    """One context of ``size`` items for one gateway; one turn per step."""

    def __init__(self, foundation: Foundation) -> None:
        self.manager = foundation.manager
        self.turn = 0
        self.times: dict[str, list[float]] = {path: [] for path in PATHS}
        self.prefix: PreparedContext | None = None

    async def step(self, *, timed: bool = True, order: int = 0) -> None:
        manager = self.manager
        gateway = manager.gateway
        turn_id = f"t{self.turn}"
        manager.accept_turn(bench_turn(self.turn))
        prefix = await manager.prepare(ContextPrepareRequest(context_id="bench", turn_id=turn_id))
        kept = prefix.native_items._shared()
        bodies = {}
        paths = PATHS[order % 3 :] + PATHS[: order % 3]
        for path in paths:
            begin = time.perf_counter()
            if path == "old":
                bodies[path] = _written(gateway.body_writer(), kept)  # type: ignore[attr-defined]
            elif path == "new":
                bodies[path] = gateway.request_body(prefix.items)
            else:
                manager.request_bytes(prefix)
            elapsed = time.perf_counter() - begin
            if timed:
                self.times[path].append(elapsed)
        if bodies["old"] != bodies["new"]:
            raise AssertionError(f"{gateway.type}: the new body differs from the old one")
        manager.record("bench", turn_id, _turn_outputs(self.turn))
        self.turn += 1
        self.prefix = prefix


async def measure(rounds: int) -> dict[tuple[GatewayType, int], _Bench]:
    """The benches, each measured ``rounds`` steps, sizes and gateways interleaved."""
    stack = AsyncExitStack()
    async with stack:
        benches: dict[tuple[GatewayType, int], _Bench] = {}
        for gateway in GatewayType:
            for size in SIZES:
                foundation = await bench_foundation(stack, size, gateway)
                bench = _Bench(foundation)
                while bench.manager.statistics().history.items < size - 4:
                    await bench.step(timed=False)
                for _ in range(5):  # warm up at the full size
                    await bench.step(timed=False)
                benches[gateway, size] = bench
        gc.collect()
        gc.freeze()  # the held histories go to the permanent generation (see bench_peers.py)
        order = random.Random(0)
        keys = list(benches)
        for round_ in range(rounds):
            order.shuffle(keys)
            for key in keys:
                await benches[key].step(order=round_)
        mechanisms(benches)
        return benches


def mechanisms(benches: dict[tuple[GatewayType, int], _Bench]) -> None:
    """Print the copy mechanisms' costs on each gateway's 10,000-item body (best of 5)."""
    print("copy mechanisms on the 10,000-item body (best of 5, microseconds)")
    print(f"{'gateway':<17}{'fresh_json':>12}{'decode':>12}{'round trip':>12}")
    for gateway in GatewayType:
        bench = benches[gateway, SIZES[-1]]
        assert bench.prefix is not None
        body = bench.manager.gateway.request_body(bench.prefix.items)
        encoded = _encode(body)
        row = f"{gateway.value:<17}"
        for copy, value in (
            (fresh_json, body),
            (_decode, encoded),
            (lambda b: _decode(_encode(b)), body),
        ):
            best = min(_timed(copy, value) for _ in range(5))
            row += f"{best * 1e6:12.1f}"
        print(row)
    print()


def _timed(call: Callable[[Any], object], value: object) -> float:
    begin = time.perf_counter()
    call(value)
    return time.perf_counter() - begin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args()
    benches = anyio.run(measure, args.rounds, backend=args.backend)
    print("request body (median microseconds): old = zero-copy fold of the kept items,")
    print("new = gateway.request_body(prefix.items), bytes = manager.request_bytes(prefix)")
    header = f"{'gateway':<17}{'items':>7}" + "".join(f"{p:>10}" for p in PATHS)
    print(header + f"{'new/old':>10}")
    for gateway in GatewayType:
        for size in SIZES:
            medians = {p: statistics.median(benches[gateway, size].times[p]) for p in PATHS}
            row = f"{gateway.value:<17}{size:>7}"
            row += "".join(f"{medians[p] * 1e6:10.1f}" for p in PATHS)
            print(row + f"{medians['new'] / medians['old']:9.2f}x")


if __name__ == "__main__":
    main()

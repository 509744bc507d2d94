"""Garbage-collector cost of held history: tracked objects per item and the full-collection pause.

A full ``gc.collect()`` visits every object the cyclic collector tracks, so
under load its pause grows with the history a process holds and stalls the
event loop (``turnloom loadtest`` reports it as the longest GC pause). This
benchmark fills histories through the real path (a Foundation's
ContextManager: ``accept_turn``, ``prepare``, ``record``) with the built-in
workload (``turnloom.tools.trajectories.builtin_trajectories``, OpenAI Chat by
default) until N items are held, then prints:

* tracked objects per held item (``len(gc.get_objects())`` after a full
  collection, minus the count before the histories were built);
* the full ``gc.collect()`` pause with the histories held (best of 3);
* both as a ratio to a baseline measured in the same run: the same items as
  the workload's plain native message dicts (freshly decoded) in one list.

Contexts hold 30 turns each, within the default history limits, so nothing is
evicted and every item counts.

Usage: python scripts/bench_gc.py [--sizes 10000,100000] [--gateway NAME]
       python scripts/bench_gc.py --sizes 10000,100000,1000000
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

import anyio
import msgspec

from turnloom.context import Message
from turnloom.context.gateway import GatewayType, get_gateway
from turnloom.runtime import ContextPrepareRequest, Foundation
from turnloom.tools.trajectories import builtin_trajectories
from turnloom.tools.transcript import Turn, snapshot, walk

_TURNS = 30
_SCRIPTS = 64


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


def _pause() -> float:
    """The best of three full collections, in seconds."""
    best = float("inf")
    for _ in range(3):
        begin = time.perf_counter()
        gc.collect()
        best = min(best, time.perf_counter() - begin)
    return best


async def _fill(size: int, gateway: str, scripts: list[list[Message]]) -> tuple[int, int, float]:
    """Hold ``size`` items in one Foundation; return (items, tracked objects, pause)."""
    before = _tracked()
    async with Foundation(gateway=gateway) as foundation:
        manager = foundation.manager
        held = 0
        number = 0
        while held < size:
            script = scripts[number % len(scripts)]
            context_id = f"c{number}"
            number += 1
            for step in walk(script):
                if isinstance(step, Turn):
                    manager.accept_turn(snapshot(context_id, step))
                    await manager.prepare(
                        ContextPrepareRequest(context_id=context_id, turn_id=step.turn_id)
                    )
                else:
                    manager.record(context_id, step.turn_id, [step.message])
            stats = manager.history(context_id)
            held += len(stats.pinned) + sum(len(stats.turn_messages(t)) for t in stats.turn_ids)
        tracked = _tracked() - before
        pause = _pause()
    return held, tracked, pause


def _plain(size: int, natives: list[bytes]) -> tuple[int, float]:
    """The baseline: ``size`` plain native message dicts in one list."""
    before = _tracked()
    decoder = msgspec.json.Decoder()
    held: list[Any] = [decoder.decode(natives[i % len(natives)]) for i in range(size)]
    tracked = _tracked() - before
    pause = _pause()
    del held
    return tracked, pause


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000", help="comma-separated item counts")
    parser.add_argument("--gateway", default="openai_chat", choices=[g.value for g in GatewayType])
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    trajectories = builtin_trajectories(_SCRIPTS, turns=(_TURNS, _TURNS))
    chat = get_gateway(GatewayType.openai_chat)
    scripts = [[chat.parse(m) for m in t.messages] for t in trajectories]
    natives = [msgspec.json.encode(m) for t in trajectories for m in t.messages]

    print(f"gateway {args.gateway}; workload: builtin, {_TURNS} turns per context")
    print(
        f"{'items':>9} {'tracked/item':>12} {'plain/item':>10} {'ratio':>6} "
        f"{'pause ms':>9} {'plain ms':>9} {'ratio':>6} {'ns/item':>8}"
    )
    for size in sizes:
        held, tracked, pause = anyio.run(_fill, size, args.gateway, scripts)
        gc.collect()
        plain_tracked, plain_pause = _plain(held, natives)
        gc.collect()
        print(
            f"{held:>9,} {tracked / held:>12.2f} {plain_tracked / held:>10.2f} "
            f"{tracked / plain_tracked:>6.2f} {pause * 1000:>9.1f} {plain_pause * 1000:>9.1f} "
            f"{pause / plain_pause:>6.2f} {pause / held * 1e9:>8.0f}"
        )


if __name__ == "__main__":
    main()

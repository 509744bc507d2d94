"""What the area pass adds to a prepare (seed 000 areas inside seed 004 preparations).

Three contexts, each in its own Foundation, hold the same history (1,000
items by default). Every round commits a turn to each, then prepares it:

* ``none``: no area section (the prepare path without areas);
* ``churn``: before each prepare a OneShotNotice is attached and one model
  output is routed, so every pass collects the previous round's notice and
  output and renders a new notice (steady section of 2 items);
* ``pinned``: ten PinnedNotices attached once (a steady section of 10 items
  that nothing collects).

It prints the median worker-thread render time and end-to-end prepare
latency per mode and their ratios to ``none``, measured round-robin in one run.

Usage: python scripts/bench_areas.py [--rounds R] [--items N] [--backend asyncio|trio]
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import AsyncExitStack

import anyio

from turnloom.areas import OneShotNotice, PinnedNotice
from turnloom.context import Message, Role
from turnloom.context.history import HistoryLimits
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot

MODES = ("none", "churn", "pinned")


async def _run(rounds: int, items: int) -> dict[str, tuple[list[float], list[float]]]:
    results: dict[str, tuple[list[float], list[float]]] = {m: ([], []) for m in MODES}
    async with AsyncExitStack() as stack:
        managers = {}
        for mode in MODES:
            foundation = await stack.enter_async_context(
                Foundation(history_limits=HistoryLimits(max_items=items, max_turns=items))
            )
            manager = managers[mode] = foundation.manager
            for n in range(items // 2):  # a user message and an answer per turn
                manager.accept_turn(
                    TurnSnapshot(
                        context_id="c",
                        turn_id=f"w{n}",
                        input=(Message(role=Role.user, content=f"question {n}"),),
                    )
                )
                manager.record("c", f"w{n}", [Message(role=Role.assistant, content=f"answer {n}")])
            if mode == "pinned":
                for k in range(10):
                    manager.areas.attach("c", PinnedNotice(f"pinned fact {k}"))
        for r in range(rounds):
            for mode in MODES:
                manager = managers[mode]
                turn_id = f"r{r}"
                manager.accept_turn(
                    TurnSnapshot(
                        context_id="c",
                        turn_id=turn_id,
                        input=(Message(role=Role.user, content=f"round {r}"),),
                    )
                )
                if mode == "churn":
                    manager.areas.attach("c", OneShotNotice(f"notice {r}"))
                    manager.areas.route("c", {"role": "assistant", "content": f"routed {r}"})
                begin = time.perf_counter()
                prepared = await manager.prepare(
                    ContextPrepareRequest(context_id="c", turn_id=turn_id)
                )
                results[mode][0].append(time.perf_counter() - begin)
                results[mode][1].append(prepared.render_seconds)
                manager.record("c", turn_id, [Message(role=Role.assistant, content="ok")])
        churn = managers["churn"].statistics()
        assert churn.areas.items_reclaimed_total == 2 * (rounds - 1)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--items", type=int, default=1_000)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args()
    results = anyio.run(_run, args.rounds, args.items, backend=args.backend)
    base_latency = statistics.median(results["none"][0])
    base_render = statistics.median(results["none"][1])
    print(f"history items: {args.items}  rounds: {args.rounds}  backend: {args.backend}")
    for mode in MODES:
        latency = statistics.median(results[mode][0])
        render = statistics.median(results[mode][1])
        print(
            f"{mode:>7}: render p50 {render * 1e6:8.1f} us ({render / base_render:5.2f}x)  "
            f"prepare p50 {latency * 1e6:8.1f} us ({latency / base_latency:5.2f}x)"
        )


if __name__ == "__main__":
    main()

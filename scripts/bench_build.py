"""``build`` on the event loop at 100, 1,000 and 10,000 history items.

For each size N one context (in its own Foundation) is filled with N items
under a history limit of N items, so every measured turn evicts and N stays
fixed. Each turn is a host's: commit the turn, ``prepare`` it, then two
tool rounds, each a model output with a tool call and its result recorded,
followed by a ``build`` of the next model input (the first build of a
prefix reads its items for the first time), then a final answer. Timed: each
build on the loop (thread CPU time: the worker is idle then), and the
process CPU time of the whole turn (prepare, render in the worker, records
and builds). Beside each build, in the same turn: the host dropping the
items it was handed (freeing them runs on the loop too: O(items), the
host's side of a build), and ``request_bytes`` of the same input (bytes:
nothing to free). The first build takes the copy the worker made ahead;
the second comes right after it with no await between (no model call), so
it copies on the loop. The sizes take turns, round-robin.

With ``--reuse K`` the call ids cycle through K values, so every eviction
drops the first use of a reused id and the kept history is renamed anew
(a new encoded run each turn).

Usage: python scripts/bench_build.py [--rounds R] [--reuse K] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import AsyncExitStack

import anyio
from bench_prepare import bench_foundation, bench_turn

from turnloom.context import Message, Role, TextPart, ToolCallPart, ToolResultPart
from turnloom.runtime import ContextPrepareRequest, Foundation

SIZES = (100, 1_000, 10_000)
_GOAL_US = 10.0  # issue 32: ``build`` at most this on the loop on the common path


def _round(n: int, k: int, reuse: int) -> tuple[Message, Message]:
    number = 2 * n + k
    call_id = f"call_{number % reuse if reuse else number}"
    call = Message(
        role=Role.assistant,
        content=(
            ToolCallPart(
                call_id=call_id, name="get_reservation", arguments=f'{{"id": "R{number:05d}"}}'
            ),
        ),
    )
    result = Message(
        role=Role.tool,
        content=(
            ToolResultPart(
                call_id=call_id,
                content=(TextPart(text=f'{{"reservation": "R{number:05d}", "status": "ok"}}'),),
            ),
        ),
    )
    return call, result


class _Bench:
    """One Foundation holding one context of ``size`` items."""

    def __init__(self, size: int, foundation: Foundation, reuse: int) -> None:
        self.size = size
        self.reuse = reuse
        self.manager = foundation.manager
        self.turn = 0
        self.samples: list[tuple[float, ...]] = []

    async def one_turn(self) -> tuple[float, ...]:
        manager = self.manager
        turn_id = f"t{self.turn}"
        cpu = time.process_time()
        manager.accept_turn(bench_turn(self.turn))
        prefix = await manager.prepare(ContextPrepareRequest(context_id="bench", turn_id=turn_id))
        continuation: list[Message] = []
        builds: list[float] = []
        frees: list[float] = []
        encodes: list[float] = []
        for k in range(2):
            call, result = _round(self.turn, k, self.reuse)
            manager.record("bench", turn_id, [call, result])
            continuation += (call, result)
            begin = time.thread_time()
            items = manager.build(prefix, continuation)
            built = time.thread_time()
            del items  # the host drops what it was handed: freed on the loop too
            builds.append(built - begin)
            frees.append(time.thread_time() - built)
            begin = time.thread_time()
            manager.request_bytes(prefix, continuation)  # the bytes dropped: O(1) to free
            encodes.append(time.thread_time() - begin)
        answer = Message(role=Role.assistant, content=f"Reservation {self.turn} is confirmed.")
        manager.record("bench", turn_id, [answer])
        self.turn += 1
        return (*builds, *frees, *encodes, time.process_time() - cpu)


async def measure(rounds: int, reuse: int) -> dict[int, tuple[float, ...]]:
    """Per size, the medians of :meth:`_Bench.one_turn`'s seven values, in seconds."""
    async with AsyncExitStack() as stack:
        benches = []
        for size in SIZES:
            foundation = await bench_foundation(stack, size)
            bench = _Bench(size, foundation, reuse)
            while not bench.manager.statistics().history.evicted_turns_total:
                await bench.one_turn()
            for _ in range(10):  # warm up at the full size
                await bench.one_turn()
            benches.append(bench)
        for _ in range(rounds):
            for bench in benches:
                bench.samples.append(await bench.one_turn())
    return {
        bench.size: tuple(statistics.median(s[i] for s in bench.samples) for i in range(7))
        for bench in benches
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--reuse", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    results = anyio.run(measure, args.rounds, args.reuse)
    if args.json:
        print(json.dumps({size: [v * 1e6 for v in r] for size, r in results.items()}))
        return
    print(
        "items   build  build b2b  host frees  frees b2b   bytes  bytes b2b   CPU/turn   "
        f"goal: build <= {_GOAL_US:g} us (copy ready)"
    )
    for size, (first, second, free1, free2, bytes1, bytes2, cpu) in results.items():
        cells = (first, second, free1, free2, bytes1, bytes2)
        print(
            f"{size:>6} " + " ".join(f"{v * 1e6:9.1f}" for v in cells) + f" {cpu * 1e6:10.1f}   "
            f"{'met' if first * 1e6 <= _GOAL_US else 'MISSED'}"
        )
    print(
        "(us, thread CPU on the loop; b2b: the second build of the turn, right after the "
        "first with no await between, so the worker had no time to make its copy ahead)"
    )


if __name__ == "__main__":
    main()

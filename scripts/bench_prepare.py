"""Prepare latency at 100, 1,000 and 10,000 history items (seed 004 performance model).

Rendering is incremental: every message is rendered once per gateway and the
closed turns are kept as one flat tuple, so a prepare should cost O(new items)
and the 10,000/100 ratio should be close to 1.

For each size N one context (in its own Foundation) is filled with N items
(turns of a user message, a tool call, its result and an answer) under a
history limit of N items, so every measured turn also evicts the oldest turn
and N stays fixed. Each round commits a turn, prepares it (timed end to end,
and the worker-thread render time reported by the PreparedContext), and
records the turn's outputs. The sizes take turns, round-robin.

With ``--reuse K`` the call ids cycle through K values, so every turn reuses
an id of an earlier one and every eviction drops the first use of a reused
id: the worst case of call-id renaming. Renamed ids are decided when a
turn's outputs are recorded and kept through evictions (see
turnloom.context.history, "Call ids"), so this too should cost O(new items).

The last line prints the prepare ratio 10,000/100 beside its goal
(<= 1.3x plain, <= 2x with ``--reuse``).

Usage: python scripts/bench_prepare.py [--rounds R] [--backend asyncio|trio] [--reuse K]
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import AsyncExitStack

import _goals
import anyio

from turnloom.context import GatewayType, Message, Role, TextPart, ToolCallPart, ToolResultPart
from turnloom.context.history import HistoryLimits
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot

SIZES = (100, 1_000, 10_000)
GOAL_PLAIN = 1.3  # prepare 10,000/100 with new call ids (issue 32)
GOAL_REUSE = 2.0  # the same with --reuse: ids reused, evictions dropping first uses


async def bench_foundation(
    stack: AsyncExitStack, size: int, gateway: GatewayType = GatewayType.openai_chat
) -> Foundation:
    """A Foundation entered on ``stack`` (one worker thread) whose history holds
    ``size`` items and turns at most (bytes unbounded): filled, each turn evicts."""
    limits = HistoryLimits(max_turns=size, max_items=size, max_bytes=1 << 40)
    return await stack.enter_async_context(
        Foundation(gateway=gateway, history_limits=limits, worker_threads=1)
    )


def bench_turn(
    turn: int,
    *,
    context_id: str = "bench",
    ask: str = "Check reservation",
    system: str = "You are an airline agent.",
) -> TurnSnapshot:
    """Turn ``turn`` of a bench's context: the user's ``"{ask} {turn}."``, and on
    turn 0 the system instructions ``system`` (later turns keep them)."""
    return TurnSnapshot(
        context_id=context_id,
        turn_id=f"t{turn}",
        input=(Message(role=Role.user, content=f"{ask} {turn}."),),
        instructions=(Message(role=Role.system, content=system),) if turn == 0 else None,
    )


def _turn_outputs(n: int, reuse: int = 0) -> list[Message]:
    # With ``reuse`` k > 0, call ids cycle through k values: every turn reuses
    # an id of an earlier turn (the rename path of turnloom.context.callids).
    call_id = f"call_{n % reuse if reuse else n}"
    return [
        Message(
            role=Role.assistant,
            content=(
                ToolCallPart(
                    call_id=call_id, name="get_reservation", arguments=f'{{"id": "R{n:05d}"}}'
                ),
            ),
        ),
        Message(
            role=Role.tool,
            content=(
                ToolResultPart(
                    call_id=call_id,
                    content=(TextPart(text=f'{{"reservation": "R{n:05d}", "status": "ok"}}'),),
                ),
            ),
        ),
        Message(role=Role.assistant, content=f"Reservation R{n:05d} is confirmed."),
    ]


class _Bench:
    """One Foundation holding one context of ``size`` items."""

    def __init__(self, size: int, foundation: Foundation, reuse: int) -> None:
        self.size = size
        self.reuse = reuse
        self.manager = foundation.manager
        self.turn = 0
        self.samples: list[tuple[float, float]] = []

    async def one_turn(self) -> tuple[float, float]:
        manager = self.manager
        turn_id = f"t{self.turn}"
        manager.accept_turn(bench_turn(self.turn))
        begin = time.perf_counter()
        prefix = await manager.prepare(ContextPrepareRequest(context_id="bench", turn_id=turn_id))
        latency = time.perf_counter() - begin
        manager.record("bench", turn_id, _turn_outputs(self.turn, self.reuse))
        self.turn += 1
        return latency, prefix.render_seconds


async def measure(rounds: int, reuse: int = 0) -> dict[int, tuple[float, float]]:
    """Median prepare latency and render time per size, in seconds.

    The sizes are measured round-robin, one turn each in turn, so load from
    elsewhere on the machine affects them alike.
    """
    async with AsyncExitStack() as stack:
        benches = []
        for size in SIZES:
            foundation = await bench_foundation(stack, size)
            bench = _Bench(size, foundation, reuse)
            while bench.manager.statistics().history.items < size:
                await bench.one_turn()
            for _ in range(20):  # warm up at the full size
                await bench.one_turn()
            benches.append(bench)
        for _ in range(rounds):
            for bench in benches:
                bench.samples.append(await bench.one_turn())
        for bench in benches:
            assert abs(bench.manager.statistics().history.items - bench.size) <= 4
    return {
        bench.size: (
            statistics.median(s[0] for s in bench.samples),
            statistics.median(s[1] for s in bench.samples),
        )
        for bench in benches
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument(
        "--reuse",
        type=int,
        default=0,
        help="cycle call ids through this many values (0: every call id is new)",
    )
    args = parser.parse_args()
    results = anyio.run(measure, args.rounds, args.reuse, backend=args.backend)
    for size, (latency, render) in results.items():
        print(
            f"{size:>6} items: prepare p50 {latency * 1e6:8.1f} us   "
            f"render p50 {render * 1e6:8.1f} us"
        )
    base, top = results[SIZES[0]], results[SIZES[-1]]
    # Issue 32's goals for time to bytes at 10,000 items against 100.
    goal = GOAL_REUSE if args.reuse else GOAL_PLAIN
    ratio = top[0] / base[0]
    print(
        f"ratio 10,000/100: prepare {ratio:.2f}x (goal {_goals.beside(ratio, goal)})   "
        f"render {top[1] / base[1]:.2f}x   "
        f"[{args.backend}{f', --reuse {args.reuse}' if args.reuse else ''}]"
    )


if __name__ == "__main__":
    main()

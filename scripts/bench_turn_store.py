"""``accept_turn`` + ``record`` at 10,000 vs 100 history items, this tree against another.

Issue 32: nothing proportional to history on the event loop. A commit, a
record and an eviction each change the history's turns; held as one tuple,
each change copied every turn. For each size N (100 and 10,000 items) one
context, in its own Foundation, holds N items and N turns at most (bytes
unbounded; :func:`bench_prepare.bench_foundation`), filled with turns of a
user message, a tool call, its result and an answer, so every measured turn
also evicts the oldest. Each measured turn commits (``accept_turn``, timed),
prepares (untimed: the render's view holds the turns meanwhile, as in
service) and records its three outputs (``manager.record``, timed), with
``time.thread_time_ns`` (CPU time, so other processes count less).

Both trees are imported in this one process (``scripts/_trees.py``) and
every round runs one turn of each (tree, size), the order shuffled per
round, so both see the same machine. Printed: each tree's median
microseconds per turn (accept_turn + record) at each size, the spread
(min..max of the round medians), the 10,000/100 ratio, and this tree's
per-turn cost at 10,000 against the other tree's.

Usage: python scripts/bench_turn_store.py [--against /work/wt-prev] [--rounds R] [--turns T]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import random
import statistics
import sys
import time
from typing import Any

import anyio
from _trees import import_tree

SIZES = (100, 10_000)
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Tree:
    """One tree's turnloom: the names the bench uses."""

    def __init__(self, path: str) -> None:
        self.path = path
        (self.runtime, self.context, self.history), self.modules = import_tree(
            path, ["turnloom.runtime", "turnloom.context", "turnloom.context.history"]
        )
        where = str(self.runtime.__file__)
        if not where.startswith(os.path.join(path, "turnloom")):
            raise SystemExit(f"turnloom of {path} was not imported (got {where})")

    def activate(self) -> None:
        sys.modules.update(self.modules)

    def turn(self, n: int) -> Any:
        c = self.context
        return self.runtime.TurnSnapshot(
            context_id="bench",
            turn_id=f"t{n}",
            input=(c.Message(role=c.Role.user, content=f"Check reservation {n}."),),
            instructions=(c.Message(role=c.Role.system, content="You are an airline agent."),)
            if n == 0
            else None,
        )

    def outputs(self, n: int) -> list[Any]:
        c = self.context
        call = f"call_{n}"
        return [
            c.Message(
                role=c.Role.assistant,
                content=(c.ToolCallPart(call_id=call, name="get", arguments=f'{{"id": {n}}}'),),
            ),
            c.Message(
                role=c.Role.tool,
                content=(c.ToolResultPart(call_id=call, content=(c.TextPart(text=f"ok {n}"),)),),
            ),
            c.Message(role=c.Role.assistant, content=f"Reservation {n} is confirmed."),
        ]


class _Context:
    """One tree's context of ``size`` items; its per-turn CPU nanoseconds."""

    def __init__(self, tree: _Tree, size: int, foundation: Any) -> None:
        self.tree, self.size, self.manager = tree, size, foundation.manager
        self.turn = 0
        self.spent: list[int] = []

    async def one_turn(self, timed: bool) -> None:
        tree, manager, n = self.tree, self.manager, self.turn
        tree.activate()
        turn, outputs = tree.turn(n), tree.outputs(n)
        clock = time.thread_time_ns
        begin = clock()
        manager.accept_turn(turn)
        accepted = clock() - begin
        if timed:
            request = tree.runtime.ContextPrepareRequest(context_id="bench", turn_id=f"t{n}")
            await manager.prepare(request)
        begin = clock()
        manager.record("bench", f"t{n}", outputs)
        if timed:
            self.spent.append(accepted + clock() - begin)
        self.turn += 1


async def _run(trees: list[_Tree], rounds: int, turns: int) -> dict[tuple[int, int], list[float]]:
    """Per (tree, size), the median microseconds per turn of each round."""
    out: dict[tuple[int, int], list[float]] = {}
    async with contextlib.AsyncExitStack() as stack:
        contexts: dict[tuple[int, int], _Context] = {}
        for index, tree in enumerate(trees):
            tree.activate()
            for size in SIZES:
                limits = tree.history.HistoryLimits(
                    max_turns=size, max_items=size, max_bytes=1 << 40
                )
                foundation = await stack.enter_async_context(
                    tree.runtime.Foundation(history_limits=limits, worker_threads=1)
                )
                context = _Context(tree, size, foundation)
                while context.manager.statistics().history.items < size:
                    await context.one_turn(timed=False)
                for _ in range(5):
                    await context.one_turn(timed=True)  # warm, at the full size
                context.spent.clear()
                contexts[index, size] = context
        gc.collect()
        gc.freeze()
        order = random.Random(0)
        keys = list(contexts)
        for _ in range(rounds):
            order.shuffle(keys)
            for key in keys:
                for _ in range(turns):
                    await contexts[key].one_turn(timed=True)
                out.setdefault(key, []).append(statistics.median(contexts[key].spent) / 1000)
                contexts[key].spent.clear()
        gc.unfreeze()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="/work/wt-prev")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--turns", type=int, default=40, help="timed turns per round and context")
    args = parser.parse_args()
    trees = [_Tree(_HERE), _Tree(os.path.abspath(args.against))]
    medians = anyio.run(_run, trees, args.rounds, args.turns)
    names = ("this tree", args.against)
    at: dict[tuple[int, int], float] = {}
    for index, name in enumerate(names):
        cells = []
        for size in SIZES:
            rounds = medians[index, size]
            at[index, size] = statistics.median(rounds)
            cells.append(
                f"{size:>6}: {at[index, size]:7.1f} us ({min(rounds):.1f}..{max(rounds):.1f})"
            )
        ratio = at[index, SIZES[-1]] / at[index, SIZES[0]]
        print(
            f"{name:>14}  accept_turn+record per turn  {'  '.join(cells)}  10,000/100 {ratio:.2f}x"
        )
    print(
        f"this tree / {args.against} at 10,000 items: {at[0, SIZES[-1]] / at[1, SIZES[-1]]:.2f}x,"
        f" at 100 items: {at[0, SIZES[0]] / at[1, SIZES[0]]:.2f}x"
    )


if __name__ == "__main__":
    main()

"""Token budgets and scoped prepares at 10,000 history items, through the runtime.

The history is real GPT-4o traffic: the tau-bench airline trajectories
(``../shared/data/tau-bench/airline-150.json``) walked into turns (user
message opens a turn; assistant replies and tool results are its outputs)
and committed to one context until it holds ``--items`` messages.

Part 1, counting at the door: the same history is loaded into a Foundation
whose token counter is ``ApproxTokenCounter`` and into one whose counter is
``OpenAITokenCounter("o200k_base")`` (each message is counted once, when it
is committed or recorded). Printed: load time, the history's token total, and
the ratio of the exact to the approximate load.

Part 2, prepares at that size (approximate counter): the median time of an
unscoped prepare of the latest turn (warm: the history run is cached), of a
scoped prepare with ``LastNTurns(4)`` (a realtime voice model's view) and with
``RoleFilter("user", "assistant")``, and of ``working_context(scope=
LastNTurns(4))``; each with its item and token counts, and the ratio to the
unscoped prepare. A scoped prepare renders privately, so it costs one pass
over the history's message references plus rendering what it keeps.

Numbers are measured in one run; nothing is asserted.

Usage: python scripts/bench_budget.py [--items N] [--repeat R] [--backend asyncio|trio]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from turnloom.context import (
    ApproxTokenCounter,
    ContextScope,
    LastNTurns,
    Message,
    OpenAITokenCounter,
    RoleFilter,
    TokenCounter,
    get_gateway,
)
from turnloom.context.history import HistoryLimits
from turnloom.runtime import ContextManager, ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.tools.transcript import Output, Reply, Turn, snapshot, walk

_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tau-bench"
_LIMITS = HistoryLimits(max_turns=1_000_000, max_items=1_000_000, max_bytes=1 << 40)


def _transcripts(path: Path) -> list[list[Message]]:
    chat = get_gateway("openai_chat")
    data = json.loads(path.read_text(encoding="utf-8"))
    return [[chat.parse(m) for m in t["traj"]] for t in data]


def _load(manager: ContextManager, transcripts: list[list[Message]], items: int) -> str:
    """Commit turns round the transcripts until ``items`` messages are held."""
    held = 0
    ids = (f"t{n}" for n in itertools.count())
    latest = ""
    pinned_done = False
    while True:
        for messages in transcripts:
            for step in walk(messages, ids=ids):
                if isinstance(step, Turn):
                    if held >= items:
                        return latest
                    turn = snapshot("c", step)
                    if pinned_done:
                        turn = TurnSnapshot(context_id="c", turn_id=turn.turn_id, input=turn.input)
                    pinned_done = True
                    manager.accept_turn(turn)
                    latest = step.turn_id
                    held += 1
                elif isinstance(step, Reply | Output) and held < items:
                    manager.record("c", step.turn_id, (step.message,))
                    held += 1


async def _median(fn: Callable[[], Awaitable[Any]], repeat: int) -> tuple[float, Any]:
    times: list[float] = []
    value: Any = None
    for _ in range(repeat):
        start = time.perf_counter()
        value = await fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), value


async def _run(args: argparse.Namespace) -> None:
    transcripts = _transcripts(args.data)
    counters: dict[str, TokenCounter] = {
        "approx": ApproxTokenCounter(),
        "o200k_base": OpenAITokenCounter("o200k_base"),
    }
    loads: dict[str, float] = {}
    for name, counter in counters.items():
        async with Foundation(history_limits=_LIMITS, token_counter=counter) as foundation:
            start = time.perf_counter()
            _load(foundation.manager, transcripts, args.items)
            loads[name] = time.perf_counter() - start
            stats = foundation.manager.statistics().history
            print(
                f"load {name:10} {stats.items:>6,} items  {loads[name] * 1e3:8.1f} ms "
                f"({loads[name] / stats.items * 1e6:5.1f} us/message, counting included)  "
                f"history tokens {stats.tokens:,}"
            )
    print(f"exact / approx load time: x{loads['o200k_base'] / loads['approx']:.2f}")

    async with Foundation(history_limits=_LIMITS) as foundation:
        manager = foundation.manager
        latest = _load(manager, transcripts, args.items)
        view = manager.history("c")
        print(f"history: {len(view.turn_ids):,} turns, prepared turn {latest!r}")

        def prepare(scope: ContextScope | None) -> Callable[[], Awaitable[Any]]:
            request = ContextPrepareRequest(context_id="c", turn_id=latest, scope=scope)
            return lambda: manager.prepare(request)

        start = time.perf_counter()
        await prepare(None)()
        print(f"first (cold) unscoped prepare: {(time.perf_counter() - start) * 1e3:.2f} ms")
        base, whole = await _median(prepare(None), args.repeat)
        print(
            f"unscoped prepare (warm)          {base * 1e3:8.3f} ms  "
            f"{whole.item_count:>6,} items {whole.tokens:>9,} tokens"
        )
        cases: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("scoped LastNTurns(4)", prepare(LastNTurns(4))),
            ("scoped RoleFilter(user,assistant)", prepare(RoleFilter("user", "assistant"))),
        ]
        for label, fn in cases:
            seconds, prepared = await _median(fn, args.repeat)
            print(
                f"{label:32} {seconds * 1e3:8.3f} ms  {prepared.item_count:>6,} items "
                f"{prepared.tokens:>9,} tokens  x{seconds / base:.2f} of unscoped"
            )
        seconds, ctx = await _median(
            lambda: manager.bridge.working_context("c", scope=LastNTurns(4)), args.repeat
        )
        print(
            f"{'working_context(LastNTurns(4))':32} {seconds * 1e3:8.3f} ms  "
            f"{len(ctx.messages):>6,} msgs  {ctx.tokens():>9,} tokens  x{seconds / base:.2f}"
        )
        again, after = await _median(prepare(None), args.repeat)
        print(
            f"unscoped prepare after scoped    {again * 1e3:8.3f} ms  reused_bytes "
            f"{after.reused_bytes:,} of {after.bytes:,} (items identical: "
            f"{after.items == whole.items})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--data", type=Path, default=_DATA / "airline-150.json")
    args = parser.parse_args()
    anyio.run(_run, args, backend=args.backend)


if __name__ == "__main__":
    main()

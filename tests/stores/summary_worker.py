"""A host process summarizing as it goes, for the kill-mid-compaction test (run with ``python -m``).

``python -m tests.stores.summary_worker URL BACKEND``: owns context ``s`` and
runs rounds forever; round ``r`` commits turn ``t<r>``, records a tool call,
its result and an answer, then flushes and prints ``ACK r``. Its summarizer
(:func:`summarize`) takes a few milliseconds and each round waits for it, so
the test's SIGKILL lands before, during and after summaries are applied and
logged, and no turn is ever evicted.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence

import anyio

from tests.runtime.helpers import SYSTEM, assistant, call, result, user
from tests.stores.helpers import hosting
from turnloom.context import CompactionPolicy, Message, PrunePolicy, TextPart
from turnloom.context.history import HistoryLimits
from turnloom.runtime import ContextManager, TurnSnapshot

LIMITS = HistoryLimits(max_turns=8)
POLICY = CompactionPolicy(trigger_turns=5, keep_turns=3, timeout=10.0)
PRUNE = PrunePolicy(keep_turns=2, note="[pruned]")
LEASE_TTL = 30.0


async def summarize(messages: tuple[Message, ...]) -> Sequence[Message]:
    """Keep every question number the messages mention (a previous summary's included)."""
    await anyio.sleep(0.003)
    text = " ".join(p.text for m in messages for p in m.parts if isinstance(p, TextPart))
    numbers = sorted({int(n) for n in re.findall(r"question (\d+)", text)})
    return [user("Earlier: " + ", ".join(f"question {n}" for n in numbers))]


def configure(manager: ContextManager) -> None:
    manager.summaries.summarizer = summarize
    manager.summaries.policy = POLICY
    manager.summaries.prune = PRUNE


def outputs(index: int) -> tuple[Message, ...]:
    call_id = f"k{index}"
    return (
        call(call_id),
        result(call_id, f"found {index} " + "x" * 50),
        assistant(f"answer {index}"),
    )


async def run(url: str) -> None:
    async with hosting(url, history_limits=LIMITS, lease_ttl=LEASE_TTL) as foundation:
        manager = foundation.manager
        configure(manager)
        await manager.leases.claim("s")
        index = 0
        while True:
            manager.accept_turn(
                TurnSnapshot(
                    context_id="s",
                    turn_id=f"t{index}",
                    input=(user(f"question {index}"),),
                    instructions=(SYSTEM,) if index == 0 else None,
                )
            )
            async with manager.invocation("s", f"t{index}") as invocation:
                invocation.record(outputs(index))
            await manager.leases.flush("s")
            while manager.summaries.running("s"):  # no eviction: the summary keeps up
                await anyio.sleep(0.001)
            await manager.leases.flush("s")
            print(f"ACK {index}", flush=True)
            index += 1


if __name__ == "__main__":
    anyio.run(run, sys.argv[1], backend=sys.argv[2])

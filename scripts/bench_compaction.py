"""Long conversations keep their meaning: summary compaction against eviction alone.

A 200-turn conversation is built from the tau-bench airline transcripts (their
turns one after another, as one caller's long day), and five facts are planted
in its first turns (a name, a booking code, a member number, a seat, an
allergy). Three hosts take the same turns at the same limits (32 turns, 8,000
tokens), each preparing every turn's input and recording its answers and tool
results:

* **eviction**: turnloom as without a summarizer (oldest turns dropped);
* **summary**: a deterministic fake summarizer (it keeps the planted facts it
  finds in what it is given, the previous summary included) with a
  ``CompactionPolicy`` below the limits;
* **summary+prune**: the same, and old tool output pruned (``PrunePolicy``).

Printed per host: input tokens per turn (mean and max, the Foundation's
counter), the limit, how many of the five facts are still in the prepared
input's text at turn 200, summaries applied, turns evicted, and the wall time
of the whole run. The fake summarizer stands for a model; the point is that
turnloom hands it the right turns and keeps what it returns.

Usage: python scripts/bench_compaction.py [--turns 200] [--data PATH] [--backend asyncio|trio]
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import anyio

from turnloom.context import CompactionPolicy, Message, PrunePolicy, Role, TextPart
from turnloom.context.history import HistoryLimits
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.tools.trajectories import check_trajectory, load_trajectories
from turnloom.tools.transcript import Reply, Turn, turn_ids, walk

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tau-bench" / "airline-150.json"
LIMITS = HistoryLimits(max_turns=32, max_tokens=8_000)
POLICY = CompactionPolicy(
    trigger_turns=24, trigger_tokens=6_000, keep_turns=12, keep_tokens=3_000, timeout=10.0
)
PRUNE = PrunePolicy(keep_turns=4)
FACTS = (
    ("my name is Ada Quint", re.compile(r"my name is Ada Quint")),
    ("my booking code is ZX4Q9P", re.compile(r"booking code is ZX4Q9P")),
    ("my member number is FF-88231", re.compile(r"member number is FF-88231")),
    ("I always sit in seat 14C", re.compile(r"seat 14C")),
    ("I am allergic to peanuts", re.compile(r"allergic to peanuts")),
)


def conversation(path: Path, turns: int) -> list[Turn | Reply | object]:
    """The steps of ``turns`` turns: the transcripts one after another, facts planted."""
    trajectories, _ = load_trajectories(path)
    ids = turn_ids()
    steps: list[Turn | Reply | object] = []
    count = 0
    for trajectory in trajectories:
        messages = check_trajectory(trajectory)
        if not isinstance(messages, list):
            continue
        for step in walk(messages, ids=ids, max_turns=turns - count):
            if isinstance(step, Turn):
                if count:
                    step = Turn(
                        index=step.index,
                        number=count,
                        turn_id=step.turn_id,
                        input=step.input,
                        instructions=None,  # one caller: the first instructions stay
                    )
                if count < len(FACTS):
                    text = f"{_text(step.input)} (For the record: {FACTS[count][0]}.)"
                    step = Turn(
                        index=step.index,
                        number=step.number,
                        turn_id=step.turn_id,
                        input=Message(role=Role.user, content=text),
                        instructions=step.instructions,
                    )
                count += 1
            steps.append(step)
        if count >= turns:
            break
    return steps


def _text(message: Message) -> str:
    return " ".join(p.text for p in message.parts if isinstance(p, TextPart))


async def keep_facts(messages: tuple[Message, ...]) -> Sequence[Message]:
    """The fake summarizer: the planted facts found in ``messages``, as one user message."""
    text = " ".join(_text(m) for m in messages)
    kept = [fact for fact, pattern in FACTS if pattern.search(text)]
    body = "; ".join(kept) if kept else "nothing to keep"
    return [Message(role=Role.user, content=f"Summary of the earlier conversation: {body}.")]


async def run(steps: list[Turn | Reply | object], mode: str) -> dict[str, float]:
    async with Foundation(history_limits=LIMITS) as foundation:
        manager = foundation.manager
        if mode != "eviction":
            manager.summaries.summarizer = keep_facts
            manager.summaries.policy = POLICY
        if mode == "summary+prune":
            manager.summaries.prune = PRUNE
        tokens: list[int] = []
        last = b""
        started = time.perf_counter()
        pending: list[Message] = []
        current = ""

        def flush() -> None:
            if pending:
                manager.record("caller", current, list(pending))
                pending.clear()

        for step in steps:
            if isinstance(step, Turn):
                flush()
                for _ in range(100):  # the fake answers at once: let its summary land
                    if not manager.summaries.running("caller"):
                        break
                    await anyio.sleep(0)
                manager.accept_turn(
                    TurnSnapshot(
                        context_id="caller",
                        turn_id=step.turn_id,
                        input=(step.input,),
                        instructions=step.instructions,
                    )
                )
                current = step.turn_id
                prepared = await manager.prepare(
                    ContextPrepareRequest(context_id="caller", turn_id=current)
                )
                tokens.append(prepared.tokens)
                last = manager.request_bytes(prepared)
            else:
                pending.append(step.message)  # type: ignore[attr-defined]
        flush()
        seconds = time.perf_counter() - started
        text = last.decode()
        stats = manager.statistics()
        return {
            "mean": statistics.fmean(tokens),
            "max": max(tokens),
            "facts": sum(1 for _, pattern in FACTS if pattern.search(text)),
            "summaries": stats.summaries.finished_total,
            "evicted": stats.history.evicted_turns_total,
            "pruned": stats.summaries.turns_pruned_total,
            "seconds": seconds,
        }


async def main(turns: int, data: Path) -> None:
    steps = conversation(data, turns)
    count = sum(1 for s in steps if isinstance(s, Turn))
    print(
        f"{count} turns from {data.name}; limits {LIMITS.max_turns} turns / "
        f"{LIMITS.max_tokens} tokens; policy: trigger {POLICY.trigger_turns} turns or "
        f"{POLICY.trigger_tokens} tokens, keep {POLICY.keep_turns} turns / "
        f"{POLICY.keep_tokens} tokens; prune keeps "
        f"{PRUNE.keep_turns} turns"
    )
    header = (
        f"{'host':<14} {'tokens/input mean':>17} {'max':>6} {'facts at last turn':>18} "
        f"{'summaries':>9} {'evicted':>7} {'pruned':>6} {'seconds':>7}"
    )
    print(header)
    print("-" * len(header))
    for mode in ("eviction", "summary", "summary+prune"):
        r = await run(steps, mode)
        print(
            f"{mode:<14} {r['mean']:>17.0f} {r['max']:>6.0f} {int(r['facts']):>16}/5 "
            f"{int(r['summaries']):>9} {int(r['evicted']):>7} {int(r['pruned']):>6} "
            f"{r['seconds']:>7.2f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args()
    anyio.run(main, args.turns, args.data, backend=args.backend)

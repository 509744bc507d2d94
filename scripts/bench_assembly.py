"""Prefix reuse across a 20-turn stratified session, beside the seed's layout, in one run.

The session is real GPT-4o traffic: consecutive tau-bench airline trajectories
(``../shared/data/tau-bench/airline-150.json``) walked into one context until
it has ``--turns`` user turns. The airline policy (the trajectories' system
message) is the strategy's L0, so the assembled system prompt is as long as
a production one.
Every turn is prepared, then its recorded replies and tool results are
recorded. Memory is an in-memory :class:`~turnloom.stores.SQLiteMemory` of
one tenant holding the assistant replies of other trajectories, so each turn
recalls different entries.

Two layouts run over the same session, memory and top-k:

* ``stratified`` -- turnloom's strategy: L0+L1 pinned first, the turn's
  memory after the durable history in the runtime-state pair;
* ``seed layout`` -- the seed's source project: the same memory rendered into
  the system prompt (a strategy in this script that moves it there).

For each turn after the first it takes the share of the previous prepared
input that the new one reuses byte for byte
(``PreparedContext.reused_bytes / previous bytes``), and prints the mean and
the minimum per layout, the total reused bytes, the same total over the
previous inputs without their runtime-state pair (the per-turn part that is
never meant to be reused), and the ratio between the layouts. Measured in
one run; nothing is asserted.

Usage: python scripts/bench_assembly.py [--turns N] [--gateway G] [--top-k K] [--data PATH]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

import anyio
import msgspec

from turnloom.context import GatewayType, Message, Role, TenantScope, get_gateway
from turnloom.context.memory import memory_payload
from turnloom.runtime import (
    AssembledContext,
    ContextPrepareRequest,
    Foundation,
    PreparedContext,
    StrategyOptions,
    StratifiedStrategy,
)
from turnloom.stores import SQLiteMemory
from turnloom.tools.transcript import Output, Reply, Turn, snapshot, turn_ids, walk

_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tau-bench"
_SCOPE = TenantScope(tenant_id="airline")


class SeedLayoutStrategy:
    """The seed's layout: the turn's memory rendered inside the system prompt."""

    name = "seed_layout"

    def __init__(self, inner: StratifiedStrategy, max_chars: int) -> None:
        self._inner = inner
        self._max_chars = max_chars

    def tool_definitions(self, gateway: Any) -> list[dict[str, Any]]:
        return []

    async def assemble(
        self,
        *,
        query: str,
        scope: TenantScope | None,
        intent_verdict: Any | None,
        auto_hydrate: bool = True,
    ) -> AssembledContext:
        layered = await self._inner.assemble(
            query=query, scope=scope, intent_verdict=intent_verdict, auto_hydrate=auto_hydrate
        )
        memory = layered.memory_context
        entries = memory_payload(memory.entries, self._max_chars)[0] if memory else []
        prompt = f"{layered.system_prompt}\n\nRelevant memory:\n{json.dumps(entries)}"
        return msgspec.structs.replace(layered, system_prompt=prompt, memory_context=None)


def _session(trajectories: list[Any], turns: int) -> list[Message]:
    chat = get_gateway(GatewayType.openai_chat)
    messages: list[Message] = []
    count = 0
    for trajectory in trajectories:
        for native in trajectory["traj"]:
            message = chat.parse(native)
            if message.role is Role.system:
                continue  # the policy is the strategy's L0
            if message.role is Role.user:
                if count == turns:
                    return messages
                count += 1
            messages.append(message)
    return messages


def _memory_texts(trajectories: list[Any]) -> list[str]:
    texts = []
    for trajectory in trajectories:
        for native in trajectory["traj"]:
            content = native.get("content")
            if native.get("role") == "assistant" and isinstance(content, str) and content.strip():
                texts.append(content)
    return texts


async def _run(
    session: list[Message],
    memory: SQLiteMemory,
    gateway: str,
    strategy: Any,
    options: StrategyOptions,
) -> list[PreparedContext]:
    kwargs: dict[str, Any] = (
        {"strategy": "stratified", "memory": memory, "strategy_options": options}
        if strategy is None
        else {"strategy": strategy}
    )
    prefixes: list[PreparedContext] = []
    async with Foundation(gateway=gateway, **kwargs) as foundation:
        manager = foundation.manager
        turn_id = ""
        for step in walk(session, ids=turn_ids()):
            if isinstance(step, Turn):
                turn_id = step.turn_id
                manager.accept_turn(snapshot("session", step))
                prefixes.append(
                    await manager.prepare(
                        ContextPrepareRequest(context_id="session", turn_id=turn_id, tenant=_SCOPE)
                    )
                )
            elif isinstance(step, Reply | Output):
                manager.record("session", turn_id, [step.message])
    return prefixes


def _durable(prefix: PreparedContext) -> int:
    """Bytes of ``prefix`` without its per-turn runtime-state pair (its volatile part)."""
    if prefix.state_call_id is None:
        return prefix.bytes
    pair = prefix.items[prefix.area_start - 2 : prefix.area_start]
    return prefix.bytes - sum(len(msgspec.json.encode(item)) for item in pair)


def _shares(prefixes: list[PreparedContext]) -> list[float]:
    return [
        current.reused_bytes / previous.bytes for previous, current in itertools.pairwise(prefixes)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--gateway", choices=[g.value for g in GatewayType], default="anthropic")
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--data", type=Path, default=_DATA / "airline-150.json")
    args = parser.parse_args()

    trajectories = json.loads(args.data.read_text(encoding="utf-8"))
    policy = trajectories[0]["traj"][0]["content"]
    session = _session(trajectories[:50], args.turns)
    gateway = get_gateway(args.gateway)
    options = StrategyOptions(instructions=policy, top_k=args.top_k)
    with SQLiteMemory() as memory:
        memory.add_many(_memory_texts(trajectories[50:]), scope=_SCOPE, source="tau-bench")
        stratified = anyio.run(_run, session, memory, args.gateway, None, options)
        seed_inner = StratifiedStrategy(gateway=gateway, memory=memory, options=options)
        seed = anyio.run(
            _run,
            session,
            memory,
            args.gateway,
            SeedLayoutStrategy(seed_inner, options.max_memory_chars),
            options,
        )
    first = stratified[0].assembled
    assert first is not None and first.system_prompt is not None
    print(
        f"session: {len(stratified)} turns, {len(session)} messages, gateway {args.gateway}, "
        f"top-k {args.top_k}, memory entries recalled: "
        f"{sum(p.assembled.metadata.entries_count for p in stratified if p.assembled)}; "
        f"L0+L1 {len(first.system_prompt):,} characters, cache breakpoint: "
        f"{first.cache_breakpoint}"
    )
    rows = []
    for name, prefixes in (("stratified", stratified), ("seed layout", seed)):
        shares = _shares(prefixes)
        reused = sum(p.reused_bytes for p in prefixes[1:])
        compared = sum(p.bytes for p in prefixes[:-1])
        rows.append(reused / compared)
        durable = sum(_durable(p) for p in prefixes[:-1])
        print(
            f"{name:12s} reuse of the previous input: mean {statistics.mean(shares):6.1%}  "
            f"min {min(shares):6.1%}  total {reused:,} of {compared:,} bytes "
            f"({reused / compared:.1%})  last input {prefixes[-1].bytes:,} bytes"
        )
        print(f"{'':12s} of the previous inputs without their state pair: {reused / durable:.1%}")
    if rows[1]:
        print(f"stratified / seed layout, total reused bytes: {rows[0] / rows[1]:.1f}x")
    else:
        print("seed layout reused nothing: every turn's new system prompt breaks the prefix")


if __name__ == "__main__":
    main()

"""turnloom beside LiveKit Agents and LangChain at 100, 1,000 and 10,000 history items.

Tables measured in one run, the sizes and the programs taking turns
round-robin so load from elsewhere on the machine affects them alike:

1. **prepare**: turnloom's incremental prepare (commit a turn, ``prepare`` it
   end to end on the event loop, record its outputs; the history stays at N
   items by eviction) beside LiveKit Agents' ``ChatContext.to_provider_format
   ("openai")`` and LangChain's ``convert_to_openai_messages`` converting the
   same N-item history (they keep no render cache, so each call converts it
   all). Ratios are peer time / turnloom time (above 1: turnloom is faster).
   Those samples are cold: each follows other programs' work, which leaves
   the CPU caches holding their data and code, as a host's other work does.
   A second table times the same programs warm, after the rounds: each
   one's calls back to back (the first few left out), with what finding the
   caches cold adds to a call (cold median minus warm median). A prepare
   runs about 180 distinct functions of turnloom's, a conversion a
   few: cold, turnloom pays more for fetching its own code and state than
   for the history it renders.
2. **time to bytes**, per gateway: prepare and the request body's JSON bytes
   (turnloom: ``manager.request_bytes``, which keeps the closed turns' body
   encoded; peers: a msgspec encode of the whole body), beside LiveKit's
   conversion to the same provider plus the same encode. The last column is
   turnloom's 10,000/100 ratio.
3. **the floor of time to bytes**: whatever turnloom caches, ``request_bytes``
   returns a new ``bytes`` of the whole body, so at least one copy of the
   body's size into new memory grows with the history. A bare program makes
   that copy (a slice of a body it kept from the warm-up, one ``memcpy``) in
   the same run, after each turnloom sample; "floor 10k/100" is turnloom's 100-item
   time plus the growth of that copy alone (copy at 10,000 minus copy at 100),
   over turnloom's 100-item time: the ratio if nothing but the copy grew.
   Beside it, the same copy made as a join of pieces: that body cut into
   one piece per turn (these pieces lie one after another in memory, the
   best layout) and joined with ``bytes.join``, and cut into one piece per
   64 turns and joined, as turnloom joins it: its history keeps the closed
   turns in blocks of 64, shared with the encoded body (the join's cost
   per piece, not its bytes, is what a join pays above the copy at 10,000
   items).

Goals (issue 32), printed beside each measured ratio: prepare at 100 items at
least 1.0x LiveKit's conversion while keeping at least 100x at 10,000 items;
time to bytes 10,000/100 at most 1.3x on every gateway.

The turns are those of ``scripts/bench_prepare.py`` (a user message, a tool
call, its result and an answer). LiveKit and LangChain are the ``bench``
extra: ``pip install -e '.[bench]'``.

Usage: python scripts/bench_peers.py [--rounds R] [--backend asyncio|trio]
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

import _goals
import anyio
import msgspec
from bench_prepare import SIZES, _turn_outputs, bench_foundation, bench_turn
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_openai_messages,
)
from livekit.agents import llm

from turnloom.context.gateway import GatewayType
from turnloom.runtime import ContextPrepareRequest, Foundation

_encode = msgspec.json.Encoder().encode
# Issue 32: LiveKit/turnloom at each size (None: no goal), and time to bytes 10k/100.
_PEER_GOALS: dict[int, float] = {100: 1.0, 10_000: 100.0}
_BYTES_GOAL = 1.3
_WARM_SKIPPED = 5  # the first calls of a warm run, which find the caches cold
_BLOCK_TURNS = 64  # turns per piece of the floor's "blocks" join
_LIVEKIT_FORMAT = {
    GatewayType.openai_chat: "openai",
    GatewayType.openai_responses: "openai.responses",
    GatewayType.anthropic: "anthropic",
    GatewayType.gemini: "google",
}


class _Turnloom:
    """One Foundation holding one context of ``size`` items for ``gateway``."""

    def __init__(self, size: int, foundation: Foundation) -> None:
        self.size = size
        self.manager = foundation.manager
        self.turn = 0
        self.prepare: list[float] = []
        self.to_bytes: list[float] = []
        # Its first timed body, at the full size: the floor's bare program copies
        # it each round, so its bytes are as cold as the history's kept chunks.
        self.body = b""
        self.pieces: list[bytes] = []  # that body cut into one piece per turn
        self.blocks: list[bytes] = []  # and into one piece per _BLOCK_TURNS turns

    async def one_turn(self, *, timed: bool = True) -> None:
        manager = self.manager
        turn_id = f"t{self.turn}"
        manager.accept_turn(bench_turn(self.turn))
        if timed:
            begin = time.perf_counter()
            request = ContextPrepareRequest(context_id="bench", turn_id=turn_id)
            prefix = await manager.prepare(request)
            prepared = time.perf_counter()
            body = manager.request_bytes(prefix)  # the closed turns' body cached, encoded
            done = time.perf_counter()
            assert body
            self.prepare.append(prepared - begin)
            self.to_bytes.append(done - begin)
            if not self.body:
                self.body = body
                turns = manager.statistics().history.turns
                step = -(-len(body) // turns)
                self.pieces = [body[at : at + step] for at in range(0, len(body), step)]
                step *= _BLOCK_TURNS
                # After an empty piece: a join of one bytes returns it, uncopied.
                self.blocks = [b"", *(body[at : at + step] for at in range(0, len(body), step))]
        manager.record("bench", turn_id, _turn_outputs(self.turn))
        self.turn += 1


def _livekit_history(size: int) -> llm.ChatContext:
    ctx = llm.ChatContext()
    ctx.add_message(role="system", content="You are an airline agent.")
    n = 0
    while len(ctx.items) < size:
        ctx.add_message(role="user", content=f"Check reservation {n}.")
        ctx.items.append(
            llm.FunctionCall(
                call_id=f"call_{n}", name="get_reservation", arguments=f'{{"id": "R{n:05d}"}}'
            )
        )
        ctx.items.append(
            llm.FunctionCallOutput(
                call_id=f"call_{n}",
                name="get_reservation",
                output=f'{{"reservation": "R{n:05d}", "status": "ok"}}',
                is_error=False,
            )
        )
        ctx.add_message(role="assistant", content=f"Reservation R{n:05d} is confirmed.")
        n += 1
    return ctx


def _langchain_history(size: int) -> list[BaseMessage]:
    messages: list[BaseMessage] = [SystemMessage("You are an airline agent.")]
    n = 0
    while len(messages) < size:
        messages.append(HumanMessage(f"Check reservation {n}."))
        messages.append(
            AIMessage(
                "",
                tool_calls=[
                    {"id": f"call_{n}", "name": "get_reservation", "args": {"id": f"R{n:05d}"}}
                ],
            )
        )
        messages.append(
            ToolMessage(f'{{"reservation": "R{n:05d}", "status": "ok"}}', tool_call_id=f"call_{n}")
        )
        messages.append(AIMessage(f"Reservation R{n:05d} is confirmed."))
        n += 1
    return messages


def _livekit_bytes(ctx: llm.ChatContext, provider: str) -> bytes:
    items, extra = ctx.to_provider_format(provider)
    body: dict[str, Any] = {"messages": items}
    if extra is not None:
        body["system"] = extra.system_messages
    return _encode(body)


def _timed(work: Callable[..., object], *args: object) -> float:
    begin = time.perf_counter()
    work(*args)
    return time.perf_counter() - begin


def _timed_copy(body: bytes) -> float:
    """Seconds to copy ``body`` into a new ``bytes`` (one memcpy), freed after the clock stops."""
    begin = time.perf_counter()
    copy = body[1:]
    elapsed = time.perf_counter() - begin
    del copy
    return elapsed


def _timed_join(pieces: list[bytes]) -> float:
    """Seconds to join ``pieces`` into a new ``bytes``, freed after the clock stops."""
    begin = time.perf_counter()
    joined = b"".join(pieces)
    elapsed = time.perf_counter() - begin
    del joined
    return elapsed


async def measure(
    rounds: int,
) -> tuple[dict[tuple[str, int], float], dict[int, int], dict[tuple[GatewayType, int], int]]:
    """Median seconds per (program, size); turnloom's history sizes; its body sizes in bytes."""
    samples: dict[tuple[str, int], list[float]] = {}
    items: dict[int, int] = {}
    async with AsyncExitStack() as stack:
        benches: dict[tuple[GatewayType, int], _Turnloom] = {}
        for gateway in GatewayType:
            for size in SIZES:
                foundation = await bench_foundation(stack, size, gateway)
                bench = _Turnloom(size, foundation)
                while bench.manager.statistics().history.items < size:
                    await bench.one_turn(timed=False)  # fill: commit and record only
                for _ in range(20):  # warm up at the full size
                    await bench.one_turn()
                bench.prepare.clear()
                bench.to_bytes.clear()
                benches[gateway, size] = bench
        livekit = {size: _livekit_history(size) for size in SIZES}
        langchain = {size: _langchain_history(size) for size in SIZES}
        # The retained histories (twelve turnloom ones, six peer ones) go to
        # the permanent generation: a full collection walking them would land
        # in whichever sample triggers it. Pauses are measured by
        # scripts/bench_gc.py and ``turnloom loadtest``.
        gc.collect()
        gc.freeze()
        order = random.Random(0)
        steps: list[tuple[int, GatewayType | str]] = [
            (size, program) for size in SIZES for program in (*GatewayType, "peers")
        ]
        for _ in range(rounds):
            # A random order each round: a sample that follows a heavy one
            # (a 10,000-item conversion) lands in every column alike.
            order.shuffle(steps)
            for size, program in steps:
                if isinstance(program, GatewayType):
                    bench = benches[program, size]
                    await bench.one_turn()
                    samples.setdefault((f"copy {program}", size), []).append(
                        _timed_copy(bench.body)
                    )
                    samples.setdefault((f"join {program}", size), []).append(
                        _timed_join(bench.pieces)
                    )
                    samples.setdefault((f"blocks {program}", size), []).append(
                        _timed_join(bench.blocks)
                    )
                    provider = _LIVEKIT_FORMAT[program]
                    samples.setdefault((f"livekit bytes {program}", size), []).append(
                        _timed(_livekit_bytes, livekit[size], provider)
                    )
                else:
                    samples.setdefault(("livekit", size), []).append(
                        _timed(livekit[size].to_provider_format, "openai")
                    )
                    samples.setdefault(("langchain", size), []).append(
                        _timed(convert_to_openai_messages, langchain[size])
                    )
        for (gateway, size), bench in benches.items():
            if gateway is GatewayType.openai_chat:
                samples["turnloom", size] = bench.prepare
                items[size] = bench.manager.statistics().history.items
            samples[f"turnloom prepare {gateway}", size] = bench.prepare
            samples[f"turnloom bytes {gateway}", size] = bench.to_bytes
        # The same programs warm, after: each one's calls back to back, so a
        # call finds the caches as the program's previous call left them.
        for size in SIZES:
            bench = benches[GatewayType.openai_chat, size]
            bench.prepare, bench.to_bytes = [], []  # the lists above keep the cold samples
            for _ in range(_WARM_SKIPPED + rounds):
                await bench.one_turn()
            samples["warm turnloom", size] = bench.prepare[_WARM_SKIPPED:]
            for name, convert, history in (
                ("livekit", livekit[size].to_provider_format, "openai"),
                ("langchain", convert_to_openai_messages, langchain[size]),
            ):
                timed = [_timed(convert, history) for _ in range(_WARM_SKIPPED + rounds)]
                samples[f"warm {name}", size] = timed[_WARM_SKIPPED:]
        lengths = {key: len(bench.body) for key, bench in benches.items()}
    return {key: statistics.median(values) for key, values in samples.items()}, items, lengths


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:10.1f}"


def _prepare_row(medians: dict[tuple[str, int], float], size: int, kind: str) -> str:
    """A prepare table's row: ``size``, the ``kind`` ("" or "warm ") medians of turnloom,
    LiveKit and LangChain in microseconds, the peers' ratios and LiveKit's goal."""
    ours, lk, lc = (medians[f"{kind}{name}", size] for name in ("turnloom", "livekit", "langchain"))
    goal = _PEER_GOALS.get(size)
    judged = _goals.beside(lk / ours, goal, at_least=True) if goal is not None else ""
    return (
        f"{size:>7} {_us(ours)} {_us(lk)} {lk / ours:6.2f}x {judged:>12} "
        f"{_us(lc)} {lc / ours:6.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args()
    medians, items, lengths = anyio.run(measure, args.rounds, backend=args.backend)
    print("prepare (median microseconds; ratio = peer / turnloom)")
    print(
        f"{'items':>7} {'turnloom':>10} {'livekit':>10} {'ratio':>7} {'goal':>12} "
        f"{'langchain':>10} {'ratio':>7}"
    )
    for size in SIZES:
        print(_prepare_row(medians, size, "") + f"   (turnloom history: {items[size]} items)")
    top, base = SIZES[-1], SIZES[0]
    print(
        f"turnloom prepare 10,000/100: {medians['turnloom', top] / medians['turnloom', base]:.2f}x"
    )
    print()
    print(
        "prepare warm: each program's calls back to back (median microseconds; "
        "cold - warm: what a call pays for finding the caches cold)"
    )
    print(
        f"{'items':>7} {'turnloom':>10} {'livekit':>10} {'ratio':>7} {'goal':>12} "
        f"{'langchain':>10} {'ratio':>7} {'cold-warm: turnloom':>21} {'livekit':>8}"
    )
    for size in SIZES:
        cold = (
            medians["turnloom", size] - medians["warm turnloom", size],
            medians["livekit", size] - medians["warm livekit", size],
        )
        print(_prepare_row(medians, size, "warm ") + f" {_us(cold[0]):>21} {_us(cold[1]):>8}")
    print()
    print("time to bytes: prepare + request_body + JSON encode (median microseconds)")
    print(
        f"{'gateway':<17}"
        + "".join(f"{f'{s} ours':>12}{f'{s} lk':>11}" for s in SIZES)
        + f"  ours 10k/100  goal {_goals.goal(_BYTES_GOAL)}"
        + "  floor 10k/100"
    )
    for gateway in GatewayType:
        row = f"{gateway.value:<17}"
        for size in SIZES:
            row += f"{_us(medians[f'turnloom bytes {gateway}', size]):>12}"
            row += f"{_us(medians[f'livekit bytes {gateway}', size]):>11}"
        ratio = (
            medians[f"turnloom bytes {gateway}", top] / medians[f"turnloom bytes {gateway}", base]
        )
        base_time = medians[f"turnloom bytes {gateway}", base]
        growth = medians[f"copy {gateway}", top] - medians[f"copy {gateway}", base]
        floor = (base_time + growth) / base_time
        print(row + f"  {ratio:11.2f}x  {_goals.verdict(ratio, _BYTES_GOAL):>11}  {floor:12.2f}x")
    print()
    print(
        "floor: a bare copy of the body's bytes, a join of it cut per turn and one of it "
        f"cut per {_BLOCK_TURNS} turns, beside turnloom's prepare alone (median microseconds; "
        "body size in bytes)"
    )
    print(
        f"{'gateway':<17}"
        + "".join(
            f"{f'{s} copy':>12}{f'{s} join':>11}{f'{s} blocks':>13}{f'{s} prepare':>14}"
            f"{f'{s} bytes':>12}"
            for s in SIZES
        )
    )
    for gateway in GatewayType:
        row = f"{gateway.value:<17}"
        for size in SIZES:
            row += f"{_us(medians[f'copy {gateway}', size]):>12}"
            row += f"{_us(medians[f'join {gateway}', size]):>11}"
            row += f"{_us(medians[f'blocks {gateway}', size]):>13}"
            row += f"{_us(medians[f'turnloom prepare {gateway}', size]):>14}"
            row += f"{lengths[gateway, size]:>12}"
        print(row)


if __name__ == "__main__":
    main()

"""Prompt-cache reuse across model inputs on the tau-bench transcripts.

Providers cache a request by exact prefix. For every model input of a
session (each turn's prepared prefix, then one build per later model call of
the turn, as ``turnloom replay`` makes them), this measures the part at the
start of the previous input that the next one repeats item for item, over
the previous input, in JSON bytes of the items (msgspec) and in tokens (each
item parsed back to a message and counted by the default
``ApproxTokenCounter``), split into inputs within a turn and the first input
of a turn (across turns). Each prepare carries one volatile contribution (the
turn's number), so every turn has a runtime-state pair, as a host with
per-turn state sends.

Two runs (``--section``, both by default):

* ``earlier-state``: each transcript one session, the history kept whole (no
  eviction), ``earlier_state="keep"`` (each earlier turn's pair stays in
  later inputs as it was sent) against ``"drop"`` (not sent again). Columns:
  ``input tok`` the tokens of all model inputs; ``kept tok`` the part that is
  earlier turns' kept pairs, as a share of ``input tok``; ``uncached tok``
  the tokens of all inputs that do not repeat the previous input's prefix.
* ``eviction``: long sessions, the transcripts chained to 200 turns per
  context (:func:`chain`), at ``max_turns`` 16 and 32 and at a token limit
  (``--token-limit``, 8,000 by default), on every gateway, for each eviction
  policy in :data:`POLICIES`: ``per-turn`` (today's, the baseline) and
  ``low-water`` (cache-aware eviction, which runs once the history has it:
  see :func:`policy_limits`). Columns: the reuse shares, ``turns`` the turns
  held at each prepare on average, ``input tok`` and ``uncached tok`` as
  above, and ``cost`` the inputs' price with a prompt cache over their price
  without one (:data:`CACHE_READ`, :data:`CACHE_WRITE`).

Usage: python scripts/bench_cache_reuse.py [--data PATH] [--limit N]
       [--section all|eviction|earlier-state] [--token-limit N] [--low-water F]
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import anyio
import msgspec

from turnloom.context.gateway import Gateway, GatewayType, NativeContent
from turnloom.context.history import HistoryLimits
from turnloom.context.message import Message, Role, ToolCallPart, ToolResultPart
from turnloom.context.tokens import ApproxTokenCounter
from turnloom.runtime import (
    ContextContribution,
    ContextPrepareRequest,
    EarlierStatePolicy,
    Foundation,
)
from turnloom.tools.trajectories import check_trajectory, load_trajectories
from turnloom.tools.transcript import Reply, Turn, snapshot, walk

_DATA = Path("/work/shared/data/tau-bench/airline-150.json")
_encode = msgspec.json.Encoder().encode
_STATE_ID = re.compile(r"tlrs_[0-9a-f]{24}")
_KINDS = ("within", "across")
_UNBOUNDED = HistoryLimits(max_turns=10_000, max_items=1_000_000, max_bytes=1 << 40)
_CHAIN_TURNS = 200


class _Sizer:
    """Bytes and tokens of native items, memoized by their JSON bytes."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self._counter = ApproxTokenCounter()
        self._known: dict[bytes, tuple[int, int, str | None]] = {}

    def size(self, item: NativeContent) -> tuple[int, int, str | None]:
        """(bytes, tokens, the state call id it carries or None)."""
        data = _encode(item)
        known = self._known.get(data)
        if known is None:
            message: Message = self._gateway.parse(item)
            state = None
            for part in message.parts:
                if isinstance(part, ToolCallPart | ToolResultPart) and _STATE_ID.fullmatch(
                    part.call_id
                ):
                    state = part.call_id
            known = self._known[data] = (len(data), self._counter.count([message]), state)
        return known


def _common(previous: tuple[object, ...], current: tuple[object, ...]) -> int:
    same = 0
    for old, new in zip(previous, current, strict=False):
        if old != new:
            break
        same += 1
    return same


async def measure(
    scripts: list[list[Message]],
    gateway: GatewayType,
    policy: EarlierStatePolicy,
    limits: HistoryLimits = _UNBOUNDED,
) -> dict[str, list[int]]:
    """Totals: per kind [reused bytes, bytes, reused tokens, tokens]; costs in tokens.

    ``totals["retained"]`` is [turns held at each prepare, summed; prepares].
    """
    totals = {kind: [0, 0, 0, 0] for kind in _KINDS}
    totals["cost"] = [0, 0, 0]  # input tokens, kept-pair tokens, uncached tokens
    totals["retained"] = [0, 0]
    async with Foundation(
        gateway=gateway, history_limits=limits, earlier_state=policy
    ) as foundation:
        manager = foundation.manager
        sizer = _Sizer(manager.gateway)
        for number, script in enumerate(scripts):
            context_id = f"s{number}"
            previous: list[tuple[int, int, str | None]] = []
            previous_items: tuple[object, ...] | None = None
            prefix = None
            continuation: list[Message] = []
            turn_id = ""
            for step in walk(script, max_turns=_CHAIN_TURNS):
                if isinstance(step, Turn):
                    turn_id = step.turn_id
                    manager.accept_turn(snapshot(context_id, step))
                    request = ContextPrepareRequest(
                        context_id=context_id,
                        turn_id=turn_id,
                        contributions=(
                            ContextContribution(name="turn", content=f"turn {step.number}"),
                        ),
                    )
                    prefix = await manager.prepare(request)
                    totals["retained"][0] += len(manager.history(context_id).turn_ids)
                    totals["retained"][1] += 1
                    current: tuple[object, ...] = prefix.items
                    kind = "across"
                    continuation = []
                elif prefix is None:
                    continue
                elif isinstance(step, Reply):
                    current = manager.build(prefix, continuation) if continuation else prefix.items
                    kind = "within"
                    manager.record(context_id, turn_id, [step.message])
                    continuation.append(step.message)
                else:
                    manager.record(context_id, turn_id, [step.message])
                    continuation.append(step.message)
                    continue
                if current is previous_items:
                    continue
                sizes = [sizer.size(item) for item in current]  # type: ignore[arg-type]
                cost = totals["cost"]
                cost[0] += sum(s[1] for s in sizes)
                cost[1] += sum(s[1] for s in sizes if s[2] not in (None, prefix.state_call_id))
                same = 0
                if previous_items is not None:
                    same = _common(previous_items, current)
                    row = totals[kind]
                    row[0] += sum(s[0] for s in previous[:same])
                    row[1] += sum(s[0] for s in previous)
                    row[2] += sum(s[1] for s in previous[:same])
                    row[3] += sum(s[1] for s in previous)
                cost[2] += sum(s[1] for s in sizes[same:])
                previous, previous_items = sizes, current
    return totals


def _share(part: int, whole: int) -> str:
    return f"{part / max(whole, 1):.1%}"


def chain(scripts: list[list[Message]], turns: int = _CHAIN_TURNS) -> list[list[Message]]:
    """Long sessions: transcripts appended to one another until each holds ``turns`` turns.

    A session's first transcript gives its system prompt (the pinned
    instructions); the next ones give only their turns, so a session reads as
    one long call. The transcript that fills a session is cut after its last
    turn that fits; the next session starts with the next transcript. A
    session that would fall short is dropped.
    """
    sessions: list[list[Message]] = []
    current: list[Message] = []
    count = 0
    for script in scripts:
        for message in script:
            if message.role in (Role.system, Role.developer):
                if not current:
                    current.append(message)
                continue
            if message.role is Role.user:
                if count == turns:
                    break
                count += 1
            current.append(message)
        if count == turns:
            sessions.append(current)
            current, count = [], 0
    return sessions


# Prices relative to an uncached input token (1.0), for every gateway: a
# cached read costs 0.1x and writing the rest to the cache 1.25x (a 5-minute
# write). Source: Anthropic prompt caching guide, pricing ("Cache reads cost
# 0.1x the base input price", "5-minute cache writes cost 1.25x"). OpenAI
# and Gemini bill cached reads at their own discounts and no write premium;
# one ratio keeps the rows comparable.
CACHE_READ = 0.1
CACHE_WRITE = 1.25

POLICIES = ("per-turn", "low-water")
"""The eviction policies compared: ``per-turn`` (today's, the baseline: one
turn evicted as each new one arrives) and ``low-water`` (issue 30's
cache-aware eviction: evict down to a fraction of the limit at once)."""


def policy_limits(limits: HistoryLimits, policy: str, low_water: float) -> HistoryLimits | None:
    """The history limits that run ``policy``; None when this build has no such policy.

    The one seam for the low-water row: cache-aware eviction lives in the
    history (``turnloom/context/history.py``) and is not in this build yet.
    Once ``HistoryLimits`` has its field (named ``low_water`` here: rename it
    to match), this returns the limits with it and the row runs; until then
    the row is printed as not available, never approximated.
    """
    if policy == "per-turn":
        return limits
    if "low_water" not in HistoryLimits.__struct_fields__:
        return None
    return msgspec.structs.replace(limits, low_water=low_water)


def eviction_table(scripts: list[list[Message]], token_limit: int, low_water: float) -> None:
    """The eviction run: long sessions at max_turns 16 and 32 and at a token limit."""
    sessions = chain(scripts)
    turns = sum(1 for s in sessions for m in s if m.role is Role.user)
    print(
        f"\neviction: {len(sessions)} sessions of {_CHAIN_TURNS} turns ({turns} turns) chained "
        f"from the transcripts; low-water fraction {low_water}"
    )
    print(
        f"cost: input tokens priced at {CACHE_READ}x for the part that repeats the previous "
        f"input (a cache read) and {CACHE_WRITE}x for the rest (a cache write), against 1.0x "
        "uncached (Anthropic's documented multipliers)"
    )
    bounds = {
        "max_turns=16": HistoryLimits(max_turns=16),
        "max_turns=32": HistoryLimits(max_turns=32),
        f"max_tokens={token_limit}": HistoryLimits(max_turns=10_000, max_tokens=token_limit),
    }
    header = (
        f"{'gateway':<17}{'limit':<18}{'policy':<10}{'within B':>9}{'across B':>9}"
        f"{'within T':>9}{'across T':>9}{'turns':>7}{'input tok':>12}{'uncached tok':>14}"
        f"{'cost':>7}"
    )
    print(header)
    for gateway in GatewayType:
        for name, limits in bounds.items():
            for policy in POLICIES:
                chosen = policy_limits(limits, policy, low_water)
                if chosen is None:
                    print(f"{gateway.value:<17}{name:<18}{policy:<10}  not in this build")
                    continue
                totals = anyio.run(measure, sessions, gateway, "keep", chosen)
                within, across, cost = totals["within"], totals["across"], totals["cost"]
                held, prepares = totals["retained"]
                priced = CACHE_READ * (cost[0] - cost[2]) + CACHE_WRITE * cost[2]
                print(
                    f"{gateway.value:<17}{name:<18}{policy:<10}"
                    f"{_share(within[0], within[1]):>9}{_share(across[0], across[1]):>9}"
                    f"{_share(within[2], within[3]):>9}{_share(across[2], across[3]):>9}"
                    f"{held / max(prepares, 1):>7.1f}{cost[0]:>12,}{cost[2]:>14,}"
                    f"{priced / max(cost[0], 1):>7.2f}",
                    flush=True,
                )


def earlier_state_table(scripts: list[list[Message]]) -> None:
    """The growing-history run: every transcript alone, no eviction, keep vs drop."""
    print("\nno eviction: each transcript one session, earlier_state keep vs drop")
    header = (
        f"{'gateway':<17}{'policy':<7}{'within B':>9}{'across B':>9}{'within T':>9}"
        f"{'across T':>9}{'input tok':>11}{'kept tok':>16}{'uncached tok':>14}"
    )
    print(header)
    for gateway in GatewayType:
        uncached: dict[str, int] = {}
        for policy in ("keep", "drop"):
            totals = anyio.run(measure, scripts, gateway, policy)
            within, across, cost = totals["within"], totals["across"], totals["cost"]
            uncached[policy] = cost[2]
            print(
                f"{gateway.value:<17}{policy:<7}{_share(within[0], within[1]):>9}"
                f"{_share(across[0], across[1]):>9}{_share(within[2], within[3]):>9}"
                f"{_share(across[2], across[3]):>9}{cost[0]:>11,}"
                f"{cost[1]:>9,} {_share(cost[1], cost[0]):>6}{cost[2]:>14,}",
                flush=True,
            )
        print(
            f"{'':<17}uncached tokens keep/drop: {uncached['keep'] / max(uncached['drop'], 1):.2f}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=_DATA)
    parser.add_argument("--limit", type=int, default=150)
    parser.add_argument("--section", choices=("all", "eviction", "earlier-state"), default="all")
    parser.add_argument("--token-limit", type=int, default=8_000)
    parser.add_argument("--low-water", type=float, default=0.5)
    args = parser.parse_args()
    trajectories, errors = load_trajectories(args.data)
    scripts = []
    for trajectory in trajectories[: args.limit]:
        checked = check_trajectory(trajectory)
        if isinstance(checked, list):
            scripts.append(checked)
    print(f"{len(scripts)} transcripts ({len(errors)} unreadable) from {args.data}")
    print("reuse: share of the previous input's bytes / tokens the next input repeats")
    if args.section in ("all", "earlier-state"):
        earlier_state_table(scripts)
    if args.section in ("all", "eviction"):
        eviction_table(scripts, args.token_limit, args.low_water)


if __name__ == "__main__":
    main()

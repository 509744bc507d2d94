"""Prompt-cache reuse across model inputs on the tau-bench transcripts, both policies.

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

Both policies run in the same process, per gateway, with the history kept
whole (no eviction: limits far above the transcripts):

* ``keep`` (the default, ``earlier_state="keep"``): each earlier turn's pair
  stays in later inputs exactly as it was sent;
* ``drop`` (``earlier_state="drop"``): an earlier turn's pair is not sent
  again.

The cost columns: ``input tok`` is the tokens of all model inputs together;
``kept tok`` the part of them that is earlier turns' kept pairs (0 under
``drop``), as a share of ``input tok``; ``uncached tok`` the tokens of all
inputs that do not repeat the previous input's prefix (what a prompt cache
cannot serve), the figure the kept pairs are paid to lower.

Usage: python scripts/bench_cache_reuse.py [--data PATH] [--limit N]
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import anyio
import msgspec

from turnloom.context.gateway import Gateway, GatewayType, NativeContent
from turnloom.context.history import HistoryLimits
from turnloom.context.message import Message, ToolCallPart, ToolResultPart
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
    scripts: list[list[Message]], gateway: GatewayType, policy: EarlierStatePolicy
) -> dict[str, list[int]]:
    """Totals: per kind [reused bytes, bytes, reused tokens, tokens]; costs in tokens."""
    totals = {kind: [0, 0, 0, 0] for kind in _KINDS}
    totals["cost"] = [0, 0, 0]  # input tokens, kept-pair tokens, uncached tokens
    limits = HistoryLimits(max_turns=10_000, max_items=1_000_000, max_bytes=1 << 40)
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
            for step in walk(script):
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=_DATA)
    parser.add_argument("--limit", type=int, default=150)
    args = parser.parse_args()
    trajectories, errors = load_trajectories(args.data)
    scripts = []
    for trajectory in trajectories[: args.limit]:
        checked = check_trajectory(trajectory)
        if isinstance(checked, list):
            scripts.append(checked)
    print(f"{len(scripts)} transcripts ({len(errors)} unreadable) from {args.data}")
    print("reuse: share of the previous input's bytes / tokens the next input repeats")
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


if __name__ == "__main__":
    main()

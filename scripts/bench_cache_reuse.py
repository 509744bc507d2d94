"""Prompt-cache reuse across model inputs on the tau-bench transcripts.

Providers cache a request by exact prefix. For every model input of a
session (each turn's prepared prefix, then one build per later model call of
the turn, as ``turnloom replay`` makes them), this measures the bytes at the
start of the previous input that the next one repeats item for item (JSON
bytes of the items, msgspec), over the previous input's bytes, split into
inputs within a turn and the first input of a turn (across turns). Each
prepare carries one volatile contribution (the turn's number), so every turn
has a runtime-state pair, as a host with per-turn state sends.

The reuse is reported for the history kept whole (no eviction: limits far
above the transcripts) and per gateway, with today's policy (an earlier
turn's runtime-state pair is not sent again). The last column is the cost of
the other policy, keeping each earlier turn's pair exactly as it was sent,
under which the previous input is by construction a prefix of the next one
(100% across turns without eviction): the bytes those kept pairs would add
to all model inputs, over the inputs' bytes today.

Usage: python scripts/bench_cache_reuse.py [--data PATH] [--limit N]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import anyio
import msgspec

from turnloom.context.gateway import GatewayType
from turnloom.context.history import HistoryLimits
from turnloom.context.message import Message
from turnloom.runtime import ContextContribution, ContextPrepareRequest, Foundation
from turnloom.tools.trajectories import check_trajectory, load_trajectories
from turnloom.tools.transcript import Reply, Turn, snapshot, walk

_DATA = Path("/work/shared/data/tau-bench/airline-150.json")
_encode = msgspec.json.Encoder().encode


def _reused(previous: tuple[object, ...], current: tuple[object, ...]) -> tuple[int, int]:
    """(bytes of ``previous`` that ``current`` repeats as a prefix, bytes of ``previous``)."""
    sizes = [len(_encode(item)) for item in previous]
    same = 0
    for old, new in zip(previous, current, strict=False):
        if old != new:
            break
        same += 1
    return sum(sizes[:same]), sum(sizes)


async def measure(scripts: list[list[Message]], gateway: GatewayType) -> dict[str, list[int]]:
    """Reused and total bytes, within turns and across turns."""
    totals = {"within": [0, 0], "across": [0, 0], "pairs": [0, 0]}
    limits = HistoryLimits(max_turns=10_000, max_items=1_000_000, max_bytes=1 << 40)
    async with Foundation(gateway=gateway, history_limits=limits) as foundation:
        manager = foundation.manager
        for number, script in enumerate(scripts):
            context_id = f"s{number}"
            previous: tuple[object, ...] | None = None
            prefix = None
            continuation: list[Message] = []
            turn_id = ""
            kept = 0  # bytes of the earlier turns' state pairs, were they kept
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
                    end = len(current) - prefix.area_items
                    pair = sum(len(_encode(item)) for item in current[end - 2 : end])
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
                totals["pairs"][0] += kept
                totals["pairs"][1] += sum(len(_encode(item)) for item in current)
                if kind == "across":
                    kept += pair  # from the next turn on, this turn's pair would stay
                if previous is not None and current is not previous:
                    reused, total = _reused(previous, current)
                    totals[kind][0] += reused
                    totals[kind][1] += total
                previous = current
    return totals


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
    print(
        f"{'gateway':<18}{'within a turn':>15}{'across turns':>15}{'kept pairs: bytes added':>26}"
    )
    for gateway in GatewayType:
        totals = anyio.run(measure, scripts, gateway)
        within, across = totals["within"], totals["across"]
        print(
            f"{gateway.value:<18}{within[0] / max(within[1], 1):>14.1%}"
            f"{across[0] / max(across[1], 1):>15.1%}"
            f"{totals['pairs'][0] / max(totals['pairs'][1], 1):>26.1%}",
            flush=True,
        )


if __name__ == "__main__":
    main()

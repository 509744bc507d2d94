"""Memory held by a 100,000-item history, render cache included, against its JSON bytes.

For each gateway: tau-bench airline trajectories (the shared 150, or the 5
shipped with turnloom) are committed and recorded turn by turn into one
:class:`~turnloom.context.TurnHistory` until it holds N items (100,000 by
default, nothing evicted), then its newest turn is rendered as a prepare
does (filling the render cache and the encoded body of the closed turns)
and the body's bytes are produced once. Memory is measured with
tracemalloc: what is allocated and still held after the render, from a
baseline taken with the trajectories already loaded. Printed per gateway:
the history's JSON bytes (``statistics().bytes``), the memory held before
the render (messages and bookkeeping) and after it, and the ratio held /
JSON bytes (the goal is at most 2x).

Usage: python scripts/bench_memory.py [--items N] [PATH]
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc
from pathlib import Path

from turnloom.context import GatewayType, get_gateway
from turnloom.context.history import HistoryLimits, TurnHistory
from turnloom.tools.trajectories import load_trajectories
from turnloom.tools.transcript import Turn, turn_ids, walk

_SHARED = Path(__file__).resolve().parents[2] / "shared/data/tau-bench/airline-150.json"
_SAMPLE = Path(__file__).resolve().parents[1] / "turnloom/tools/data/tau-bench-airline-5.json"


def _fill(history: TurnHistory, trajectories: list[list[object]], items: int) -> str:
    """Commit and record trajectories, round-robin, until ``items``; the newest turn id."""
    chat = get_gateway(GatewayType.openai_chat)
    ids = turn_ids()
    newest = ""
    while True:
        for natives in trajectories:
            messages = [chat.parse(native) for native in natives]  # type: ignore[arg-type]
            for step in walk(messages, ids=ids):
                if isinstance(step, Turn):
                    if history.statistics().items >= items:
                        history.commit(step.turn_id, [step.input])
                        return step.turn_id
                    history.commit(
                        step.turn_id,
                        [step.input],
                        instructions=step.instructions if not newest else None,
                    )
                    newest = step.turn_id
                else:
                    history.record(step.turn_id, [step.message])


def measure(kind: GatewayType, trajectories: list[list[object]], items: int) -> tuple[int, ...]:
    """(JSON bytes, held before render, held after render) for one gateway, in bytes."""
    gateway = get_gateway(kind)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    history = TurnHistory(
        HistoryLimits(max_turns=1_000_000, max_items=10 * items, max_bytes=1 << 40)
    )
    newest = _fill(history, trajectories, items)
    gc.collect()
    before = tracemalloc.get_traced_memory()[0] - base
    rendered = history.view().render(gateway, newest)
    assert rendered.body is not None
    rendered.body.encode()  # what a prepare's request_bytes does once
    del rendered  # the render cache stays in the history
    gc.collect()
    after = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    json_bytes = history.statistics().bytes + history.statistics().pinned_bytes
    del history
    return json_bytes, before, after


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("path", nargs="?", type=Path)
    args = parser.parse_args()
    path = args.path or (_SHARED if _SHARED.exists() else _SAMPLE)
    loaded, errors = load_trajectories(path)
    assert not errors, errors
    trajectories = [list(t.messages) for t in loaded]
    print(f"{args.items} history items from {path.name} (tracemalloc, bytes held)")
    print(f"{'gateway':<17}{'JSON MB':>9}{'held MB':>9}{'ratio':>7}{'+cache MB':>11}{'ratio':>7}")
    for kind in GatewayType:
        json_bytes, before, after = measure(kind, trajectories, args.items)
        mb = 1 << 20
        print(
            f"{kind.value:<17}{json_bytes / mb:9.1f}{before / mb:9.1f}{before / json_bytes:6.2f}x"
            f"{after / mb:11.1f}{after / json_bytes:6.2f}x"
        )


if __name__ == "__main__":
    main()

"""Where a closed turn's memory goes, and whether its renamed ids are its own to free.

Fills a :class:`~turnloom.context.TurnHistory` as ``bench_memory.py`` does
(tau-bench airline trajectories, round-robin, nothing evicted) to N items,
renders its newest turn for openai_chat (which closes the older turns), and
prints, as a ratio to the history's JSON bytes and per closed turn, the
``sys.getsizeof`` of: the ``_Turn`` structs, their ``_Closed`` tuples, the
int objects of ``bytes``, ``tokens`` and ``serial`` above CPython's
small-int cache (256), the per-message token ints above it, and the
``_Closed`` slots spent on sent ids. Then the renamed ids the closed turns
hold: how many, and how many other references each has (``sys.getrefcount``
less this script's own): an id held elsewhere too (the renaming states, the
run's call logs) is not freed by holding it more compactly in ``_Closed``.

Usage: python scripts/probe_closed_turns.py [--items N]
"""

from __future__ import annotations

import argparse
import collections
import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_memory import _SAMPLE, _SHARED, _fill

from turnloom.context import GatewayType, get_gateway
from turnloom.context.history import HistoryLimits, TurnHistory
from turnloom.context.history._cells import own_ids
from turnloom.tools.trajectories import load_trajectories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20_000)
    args = parser.parse_args()
    loaded, errors = load_trajectories(_SHARED if _SHARED.exists() else _SAMPLE)
    assert not errors, errors
    trajectories = [list(t.messages) for t in loaded]
    history = TurnHistory(
        HistoryLimits(max_turns=1_000_000, max_items=10 * args.items, max_bytes=1 << 40)
    )
    newest = _fill(history, trajectories, args.items)
    rendered = history.view().render(get_gateway(GatewayType.openai_chat), newest)
    assert rendered.body is not None
    rendered.body.encode()
    del rendered
    gc.collect()
    closed = [t for t in history._turns if t.closed]
    sizes: collections.Counter[str] = collections.Counter()
    renamed: list[str] = []
    for turn in closed:
        cells = turn.cells
        sizes["_Turn"] += sys.getsizeof(turn)
        sizes["_Closed"] += sys.getsizeof(cells)
        sizes["turn ints"] += sum(
            sys.getsizeof(v) for v in (turn.bytes, turn.tokens, turn.serial) if v > 256
        )
        n = cells.size  # type: ignore[union-attr]
        sizes["message token ints"] += sum(
            sys.getsizeof(cells[1 + n + k]) for k in range(n) if cells[1 + n + k] > 256
        )
        sent = cells.sent_ids()  # type: ignore[union-attr]
        if sent is None:
            continue
        sizes["sent slots"] += 8 * n
        own = {id(o) for m in cells.messages for o in own_ids(m)}  # type: ignore[union-attr]
        for ids in sent:
            for call_id in () if ids is None else (ids,) if type(ids) is str else ids:
                if id(call_id) not in own:
                    renamed.append(call_id)
    json_bytes = history.statistics().bytes + history.statistics().pinned_bytes
    print(f"{args.items} items, {len(closed)} closed turns, {json_bytes} JSON bytes")
    print(f"{'part':<20}{'x JSON':>9}{'B/turn':>9}")
    for name, total in sizes.items():
        print(f"{name:<20}{total / json_bytes:8.4f}x{total / len(closed):9.1f}")
    # getrefcount's own argument, ``renamed`` and the loop variable.
    others = collections.Counter(sys.getrefcount(i) - 3 - 1 for i in renamed)  # less _Closed
    print(f"renamed ids held by closed turns: {len(renamed)}")
    print(f"their references besides _Closed (count: ids): {dict(sorted(others.items()))}")


if __name__ == "__main__":
    main()

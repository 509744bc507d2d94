"""Host copies made ahead for long histories: seeded from the copy the last prefix left, or not.

``build`` and ``PreparedContext.items`` hand the host a copy of the prefix
shared with nothing turnloom keeps; for a prefix of at least
``COPY_AHEAD_ITEMS`` (512) items the render worker makes the copies ahead.
The copy made after a turn's last ``build`` (for a build that does not come)
is never taken. Since issue 32's seeding it seeds the next prefix's copy (its
items of the run both prefixes hold move into it; only the rest is decoded);
before, it was freed and the next copy decoded the whole history again.

Each round runs :func:`turnloom.tools.loadtest.loadtest` on the built-in
workload with long histories (``--sessions`` sessions of ``--turns`` turns,
every turn kept: ``--max-turns`` 1,000; or evicting: ``--max-turns`` 120), in
one process, once with seeding (this tree) and once with it off
(``NativeItems._seeded`` answering None: every copy decoded whole), the order
alternating between rounds. Printed per run: process CPU per prepare (every
thread, microseconds), the host copies decoded whole (``fresh``), copies
taken made ahead (``ahead``) and made where read (``here``: the loop's,
O(history) there), copies made ahead that no host took: taken by the next
prefix's render as a seed (``spares``; ``seeded``: used as one, the rest
freed), or dropped at the next delivery (``dropped``), and the median ratio
of CPU per prepare, seeded over not.

Usage: python scripts/bench_copies.py [--sessions N] [--turns M] [--max-turns T ...]
       [--rounds R] [--backend asyncio|trio]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from typing import Any

import anyio
from _workload import builtin_workload

from turnloom.context.history import HistoryLimits
from turnloom.context.items import NativeItems
from turnloom.tools.loadtest import loadtest


class _Counts:
    """Counts of host copies, by wrapping NativeItems' methods (any thread)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.seeding = True
        self._fresh = NativeItems.fresh
        self._take = NativeItems.take_copy
        self._drop = NativeItems.drop_copies
        self._seeded = NativeItems._seeded

    def install(self) -> None:
        counts = self.counts
        fresh, take, drop, seeded = self._fresh, self._take, self._drop, self._seeded

        def counted_fresh(items: NativeItems) -> Any:
            counts["fresh"] += 1
            return fresh(items)

        def counted_take(items: NativeItems, taker: int) -> Any:
            copy = take(items, taker)
            if taker:  # a host's read (0: the render taking a spare to seed from)
                counts["ahead" if copy is not None else "here"] += 1
            elif copy is not None:
                counts["spares"] += 1
            return copy

        def counted_drop(items: NativeItems) -> Any:
            copies = drop(items)
            counts["dropped"] += len(copies) if copies else 0
            return copies

        def maybe_seeded(items: NativeItems, seed: NativeItems, spare: Any) -> Any:
            copy = seeded(items, seed, spare) if self.seeding else None
            counts["seeded"] += copy is not None
            return copy

        NativeItems.fresh = counted_fresh  # type: ignore[method-assign]
        NativeItems.take_copy = counted_take  # type: ignore[method-assign]
        NativeItems.drop_copies = counted_drop  # type: ignore[method-assign]
        NativeItems._seeded = maybe_seeded  # type: ignore[method-assign]


async def _run(trajectories: Any, sessions: int, turns: int, max_turns: int) -> tuple[float, int]:
    limits = HistoryLimits(max_turns=max_turns, max_items=1_000_000, max_bytes=1 << 34)
    begin = time.process_time()
    report = await loadtest(trajectories, sessions=sessions, turns=turns, history_limits=limits)
    assert report.sessions_failed == 0, report
    return (time.process_time() - begin) / report.prepares, report.prepares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--max-turns", type=int, nargs="+", default=[1000, 120])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="asyncio")
    args = parser.parse_args()
    trajectories, _ = builtin_workload(args.turns)
    counter = _Counts()
    counter.install()
    print(
        f"{args.sessions} sessions x {args.turns} turns, {args.backend}; "
        "copies per run, CPU per prepare in us (process, every thread)"
    )
    print(
        f"{'max_turns':>9} {'round':>5} {'seeding':>8} {'cpu/prep':>9} {'fresh':>7} "
        f"{'ahead':>7} {'here':>7} {'spares':>7} {'seeded':>7} {'dropped':>8}"
    )
    for max_turns in args.max_turns:
        cpu: dict[bool, list[float]] = {True: [], False: []}
        for round_ in range(args.rounds):
            order = (True, False) if round_ % 2 == 0 else (False, True)
            for seeding in order:
                counter.seeding = seeding
                counter.counts.clear()
                per_prepare, _ = anyio.run(
                    _run,
                    trajectories,
                    args.sessions,
                    args.turns,
                    max_turns,
                    backend=args.backend,
                )
                cpu[seeding].append(per_prepare)
                c = counter.counts
                print(
                    f"{max_turns:>9} {round_:>5} {'on' if seeding else 'off':>8} "
                    f"{per_prepare * 1e6:>9.0f} {c['fresh']:>7} {c['ahead']:>7} "
                    f"{c['here']:>7} {c['spares']:>7} {c['seeded']:>7} {c['dropped']:>8}"
                )
        ratios = [on / off for on, off in zip(cpu[True], cpu[False], strict=True)]
        print(
            f"max_turns {max_turns}: CPU per prepare seeded / not, median of "
            f"{args.rounds} rounds: {statistics.median(ratios):.2f}x "
            f"(each round: {', '.join(f'{r:.2f}' for r in ratios)})"
        )


if __name__ == "__main__":
    main()

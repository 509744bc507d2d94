"""Loop CPU of a result record after a model step of K calls, against another tree.

A history (no Foundation: ``TurnHistory`` with the door's check, as
``ContextManager.record`` runs them) commits three turns; each turn records
one assistant message calling K tools, then their K results one record each.
Each result record is timed alone (``time.thread_time_ns``: the door's
``check_outputs`` and ``TurnHistory.record``) and reported in microseconds
per record. With ``--reuse`` every turn calls the same K ids (later turns'
calls are sent renamed, so the door pairs each result with its call);
without it, each turn's ids are its own.

Before the history kept the pairing state after its newest step
(``TurnHistory._steps``), each result record walked the step twice (the
door's sent ids, the step check), so a record cost grew with K.

With ``--against PATH`` the package is imported twice in this one process
(this tree and the tree at ``PATH``, each with its own modules), and the
trees alternate round by round, rotating which goes first; the median per
record of each, and the ratio.

Usage: python scripts/bench_steps.py [--calls K] [--rounds R] [--reuse] [--against /work/main]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

from _trees import import_tree

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Tree:
    """One tree's turnloom: its modules and the names the replay uses."""

    def __init__(self, path: str) -> None:
        (self.history, self.message, self.door, self.gateway), self.modules = import_tree(
            path,
            [
                "turnloom.context.history",
                "turnloom.context.message",
                "turnloom.runtime._door",
                "turnloom.context.gateway",
            ],
        )

    def activate(self) -> None:
        sys.modules.update(self.modules)


def _round(tree: _Tree, calls: int, reuse: bool, histories: int) -> float:
    """Microseconds per result record over ``histories`` histories of three turns."""
    tree.activate()
    m = tree.message
    gateway = tree.gateway.get_gateway("openai_chat")
    check_outputs = tree.door.check_outputs
    spent = records = 0
    for _ in range(histories):
        history: Any = tree.history.TurnHistory()
        for turn in range(3):
            turn_id = f"t{turn}"
            ids = [f"c{k}" if reuse else f"t{turn}c{k}" for k in range(calls)]
            batch: list[Any] = [m.Message(role=m.Role.user, content="go on")]
            history.check_batch(batch, "input", gateway=gateway)
            history.commit(turn_id, batch)
            step = m.Message(
                role=m.Role.assistant,
                content=tuple(m.ToolCallPart(call_id=i, name="f", arguments="{}") for i in ids),
            )
            check_outputs(gateway, turn_id, [step], history)
            history.record(turn_id, [step])
            for call_id in ids:
                part = m.ToolResultPart(call_id=call_id, content=(m.TextPart(text="ok"),))
                batch = [m.Message(role=m.Role.tool, content=(part,))]
                begin = time.thread_time_ns()
                check_outputs(gateway, turn_id, batch, history)
                history.record(turn_id, batch)
                spent += time.thread_time_ns() - begin
                records += 1
    return spent / records / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--histories", type=int, default=200)
    parser.add_argument("--reuse", action="store_true", help="every turn calls the same ids")
    parser.add_argument("--against", help="another tree to compare with (its path)")
    args = parser.parse_args()
    trees = [_Tree(_HERE)]
    names = ["this"]
    if args.against is not None:
        trees.insert(0, _Tree(os.path.abspath(args.against)))
        names.insert(0, "against")
    results: list[list[float]] = [[] for _ in trees]
    for number in range(args.rounds):
        order = range(len(trees)) if number % 2 == 0 else reversed(range(len(trees)))
        for index in order:
            results[index].append(_round(trees[index], args.calls, args.reuse, args.histories))
    medians = [statistics.median(r) for r in results]
    cells = ", ".join(f"{name} {value:.1f} us" for name, value in zip(names, medians, strict=True))
    ids = "reused" if args.reuse else "unique"
    line = f"result record after a step of {args.calls} calls ({ids} ids), median: {cells}"
    if len(trees) == 2:
        line += f"; ratio {medians[1] / medians[0]:.2f}x"
    print(line)


if __name__ == "__main__":
    main()

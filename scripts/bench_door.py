"""Loop CPU of the door: ``accept_turn`` and ``record`` per call, against another tree.

Replays the built-in trajectories (40 turns each by default, past the
32-turn history limit, so histories evict) through one open Foundation's
ContextManager, one session after another, with no prepare: the calls a
session makes on the event loop besides preparing. Each call is timed alone
(``time.thread_time_ns``: CPU time, so other processes on the machine count
less) and reported in microseconds per call: ``accept_turn``, ``record``
(``manager.record``, the tool results), ``Invocation.record`` (the
model's replies) and the whole ``async with manager.invocation(...)`` block
around it (entering, the record, leaving: nothing awaits inside).

After the rounds, this tree's median per call of each kind is printed beside
issue 32's goal (at most 10 us; each record here is of one message, so per
call is per message, and ``accept_turn`` is also given per input message),
marked met or MISSED.

With ``--against PATH`` the package is imported twice in this one process,
from this tree and from the tree at ``PATH`` (each with its own modules,
swapped into ``sys.modules`` while it runs), and every session is replayed
by both, alternating, so both see the same machine; each round prints both
trees and the ratio, then the median ratio over ``--rounds`` rounds.

With ``--loadtest SESSIONS`` each round runs instead one whole
:func:`turnloom.tools.loadtest.loadtest` of that many sessions (asyncio) per
tree, one tree after the other: prepares per second and process CPU per
prepare (the event loop and the workers), and their ratios.

With ``--build`` each turn is also prepared (untimed, as the load test
does) and every later model call of the turn times ``manager.build(prefix,
continuation)`` (the turn's replies and tool results so far), reported as
``build``; the other kinds then follow prepares, as in the load test.

With ``--floor`` it also times the bare per-message work (``check_message``,
the render and its encoding) over the same messages: the floor the door's
per-message goal is read against (for each tree, with ``--against``).

With ``--calls`` the same replay (one round, ``--build`` as given) counts
instead of timing: the profiler events (``sys.setprofile``, the event loop's
thread only) of each call, as Python calls and C calls per call of each
kind, for each tree. Deterministic but for ``build``, whose copy is either
taken ready-made (made ahead in the worker) or made on the loop.

Usage: python scripts/bench_door.py [--sessions N] [--turns M] [--rounds R]
       [--against /work/main] [--loadtest SESSIONS] [--build] [--floor] [--calls]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import math
import os
import statistics
import sys
import time
from typing import Any

import _goals
import anyio
from _trees import import_tree

_KINDS = ("accept_turn", "record", "inv.record", "inv.block", "build")
# Issue 32's goals, microseconds per call (each record here is of one message):
# build and accept_turn at most 10 us, the door's and record's checks at most 10 us
# per message. The block around Invocation.record has none of its own.
_GOAL_US = 10.0
_GOALS = {
    kind: _goals.goal(_GOAL_US, " us") for kind in ("accept_turn", "record", "inv.record", "build")
}
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Tree:
    """One tree's turnloom: its modules, and the names the replay uses."""

    def __init__(self, path: str) -> None:
        self.path = path
        (
            (self.manager, self.foundation, self.trajectories, self.transcript, self.schemas),
            (self.modules),
        ) = import_tree(
            path,
            [
                "turnloom.runtime.manager",
                "turnloom.runtime.foundation",
                "turnloom.tools.trajectories",
                "turnloom.tools.transcript",
                "turnloom.runtime.schemas",
            ],
        )
        where = str(self.manager.__file__)
        if os.path.dirname(os.path.dirname(where)) != os.path.join(path, "turnloom"):
            raise SystemExit(f"turnloom of {path} was not imported (got {where})")

    def activate(self) -> None:
        """Make this tree's modules the ones a function-level import finds."""
        sys.modules.update(self.modules)

    def scripts(self, sessions: int, turns: int) -> list[list[Any]]:
        self.activate()
        scripts = []
        for trajectory in self.trajectories.builtin_trajectories(sessions, turns=(turns, turns)):
            checked = self.trajectories.check_trajectory(trajectory)
            assert isinstance(checked, list)
            scripts.append(checked)
        return scripts


async def _session(
    tree: _Tree,
    manager: Any,
    context_id: str,
    script: list[Any],
    turns: int,
    spent: list[int],
    build: bool,
    clock: Any = time.thread_time_ns,
) -> None:
    """Replay one session; add each kind's nanoseconds and calls to ``spent``.

    With ``build``, each turn is prepared and each later model call builds.
    """
    tree.activate()
    request_type = tree.schemas.ContextPrepareRequest
    prefix: Any = None
    continuation: list[Any] = []
    walk, snapshot = tree.transcript.walk, tree.transcript.snapshot
    turn_type, reply_type = tree.transcript.Turn, tree.transcript.Reply
    turn_id = ""
    for step in walk(script, max_turns=turns):
        if isinstance(step, turn_type):
            turn_id = step.turn_id
            turn = snapshot(context_id, step)
            begin = clock()
            manager.accept_turn(turn)
            spent[0] += clock() - begin
            spent[1] += 1
            spent[-1] += len(turn.input)  # messages accepted (the per-message figure)
            if build:
                prefix = await manager.prepare(request_type(context_id=context_id, turn_id=turn_id))
                continuation = []
        elif isinstance(step, reply_type):
            if prefix is not None and continuation:
                begin = clock()
                manager.build(prefix, continuation)
                spent[8] += clock() - begin
                spent[9] += 1
            batch = [step.message]
            block = clock()
            async with manager.invocation(context_id, turn_id) as invocation:
                begin = clock()
                invocation.record(batch)
                spent[4] += clock() - begin
                spent[5] += 1
            spent[6] += clock() - block
            spent[7] += 1
            continuation.append(step.message)
        else:
            batch = [step.message]
            begin = clock()
            manager.record(context_id, turn_id, batch)
            spent[2] += clock() - begin
            spent[3] += 1
            continuation.append(step.message)


# --calls: the profiler events seen so far on the loop's thread, Python calls
# in the low 32 bits, C calls above them (a delta of this "clock" is both).
_EVENTS = [0]
_SHIFT = 32


def _on_event(frame: Any, event: str, arg: Any) -> None:
    if event == "call":
        _EVENTS[0] += 1
    elif event == "c_call":
        _EVENTS[0] += 1 << _SHIFT


def _events() -> int:
    return _EVENTS[0]  # its own call counts once per reading: one Python call per delta


async def _replay(
    trees: list[_Tree], sessions: int, turns: int, build: bool = False, calls: bool = False
) -> list[dict[str, float]]:
    """Microseconds per call of each kind, per tree, every session replayed by each in turn.

    With ``calls``: per call of each kind, Python calls (``kind``) and C calls
    (``kind + " C"``) instead.
    """
    scripts = [tree.scripts(sessions, turns) for tree in trees]
    spent = [[0] * (2 * len(_KINDS) + 1) for _ in trees]
    managers = [tree.manager.ContextManager() for tree in trees]
    async with contextlib.AsyncExitStack() as stack:
        for tree, manager in zip(trees, managers, strict=True):
            await stack.enter_async_context(tree.foundation.Foundation(manager))
        gc.collect()
        if calls:
            sys.setprofile(_on_event)
        try:
            for number in range(sessions):
                for index, tree in enumerate(trees):
                    await _session(
                        tree,
                        managers[index],
                        f"s{number}",
                        scripts[index][number],
                        turns,
                        spent[index],
                        build,
                        _events if calls else time.thread_time_ns,
                    )
        finally:
            sys.setprofile(None)
    if calls:
        return [_counts(times) for times in spent]
    return [
        {
            **{
                kind: times[2 * k] / times[2 * k + 1] / 1000 if times[2 * k + 1] else math.nan
                for k, kind in enumerate(_KINDS)
            },
            "accept_turn/msg": times[0] / times[-1] / 1000 if times[-1] else math.nan,
        }
        for times in spent
    ]


def _counts(times: list[int]) -> dict[str, float]:
    """Python and C calls per call of each kind, from summed event deltas (see ``_events``)."""
    mask = (1 << _SHIFT) - 1
    out: dict[str, float] = {}
    for k, kind in enumerate(_KINDS):
        total, count = times[2 * k], times[2 * k + 1]
        python = (total & mask) - count  # less the reading's own call, once per delta
        out[kind] = python / count if count else math.nan
        out[kind + " C"] = (total >> _SHIFT) / count if count else math.nan
    return out


def _calls(trees: list[_Tree], names: list[str], args: argparse.Namespace) -> None:
    """One replay counting calls: Python and C calls per call of each kind, per tree."""
    results = anyio.run(_replay, trees, args.sessions, args.turns, args.build, True)
    print(f"{'calls':<7}{'tree':<9}" + "".join(f"{kind + ' py/C':>18}" for kind in _KINDS))
    for name, result in zip(names, results, strict=True):
        cells = "".join(f"{result[k]:>11.1f}/{result[k + ' C']:<6.1f}" for k in _KINDS)
        print(f"{'':<7}{name:<9}{cells}")


def _loadtest(tree: _Tree, sessions: int, turns: int) -> tuple[float, float]:
    """One ``turnloom loadtest`` run (asyncio) with this tree: prepares/s, CPU us per prepare."""
    tree.activate()
    loadtest = importlib.import_module("turnloom.tools.loadtest").loadtest
    trajectories = tree.trajectories.builtin_trajectories(64, turns=(turns, turns))
    report = anyio.run(lambda: loadtest(trajectories, sessions=sessions, turns=turns))
    return report.prepares_per_second, report.cpu_seconds / report.prepares * 1e6


def _loadtests(trees: list[_Tree], names: list[str], args: argparse.Namespace) -> None:
    print(f"{'round':<7}{'tree':<9}{'prepares/s':>12}{'cpu/prep us':>13}")
    ratios: list[tuple[float, float]] = []
    for number in range(args.rounds):
        results = [_loadtest(tree, args.loadtest, args.turns) for tree in trees]
        for name, (rate, cpu) in zip(names, results, strict=True):
            print(f"{number:<7}{name:<9}{rate:>12.0f}{cpu:>13.0f}")
        if len(results) == 2:
            ratios.append((results[1][0] / results[0][0], results[1][1] / results[0][1]))
            print(f"{number:<7}{'ratio':<9}{ratios[-1][0]:>11.2f}x{ratios[-1][1]:>12.2f}x")
    if ratios:
        rate = statistics.median(r[0] for r in ratios)
        cpu = statistics.median(r[1] for r in ratios)
        print(f"{'median':<7}{'ratio':<9}{rate:>11.2f}x{cpu:>12.2f}x")


def _floor(tree: _Tree, label: str, sessions: int, turns: int, rounds: int) -> None:
    """The bare per-message work of the door, without turnloom's bookkeeping: the floor.

    For every message of the replayed sessions, in one tight loop each:
    ``check_message`` alone, ``gateway.render`` then the JSON encoding of its
    items, and both; the CPU per message (``time.thread_time_ns`` around the
    whole loop), min over ``rounds``. What ``record`` costs beyond the sum
    is its bookkeeping (limits, ids, steps, tokens, the render cache).
    """
    tree.activate()
    message_module = importlib.import_module("turnloom.context.message")
    gateway_module = importlib.import_module("turnloom.context.gateway")
    import msgspec

    check = message_module.check_message
    gateway = gateway_module.get_gateway("openai_chat")
    encode = msgspec.json.Encoder().encode
    messages = [
        step.message
        for script in tree.scripts(sessions, turns)
        for step in tree.transcript.walk(script, max_turns=turns)
        if hasattr(step, "message")
    ]

    def render_encode() -> None:
        for message in messages:
            for item in gateway.render(message):
                encode(item)

    def both() -> None:
        for message in messages:
            check(message)
            for item in gateway.render(message):
                encode(item)

    def check_all() -> None:
        for message in messages:
            check(message)

    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, work in (("check", check_all), ("render", render_encode), ("both", both)):
            begin = time.thread_time_ns()
            work()
            spent = (time.thread_time_ns() - begin) / len(messages) / 1000
            best[name] = min(best.get(name, math.inf), spent)
    print(
        f"{label}: floor per message ({len(messages)} messages, min of {rounds}): "
        f"check_message {best['check']:.1f} us, render+encode {best['render']:.1f} us, "
        f"both {best['both']:.1f} us (goal for the door's checks: <= 10)"
    )


def _verdicts(rounds: list[dict[str, float]]) -> None:
    """This tree's median per call (and per message) of each kind beside its goal, met or not.

    Every record here is of one message, so its figure per call is per message;
    ``accept_turn`` is also given per input message.
    """
    cells = []
    for kind in ("accept_turn", "accept_turn/msg", "record", "inv.record", "build"):
        values = [r[kind] for r in rounds if not math.isnan(r[kind])]
        if not values:
            continue
        value = statistics.median(values)
        unit = "us/message" if kind == "accept_turn/msg" else "us"
        cells.append(f"{kind} {value:.1f} {unit} ({_goals.beside(value, _GOAL_US, ' us')})")
    print("this tree, median of rounds: " + "; ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", help="another tree to compare with (its path)")
    parser.add_argument(
        "--build", action="store_true", help="also prepare each turn and time build per model call"
    )
    parser.add_argument(
        "--loadtest",
        type=int,
        metavar="SESSIONS",
        help="instead: whole load tests of SESSIONS sessions, the trees alternating",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also the bare per-message check and render of the same messages (the floor)",
    )
    parser.add_argument(
        "--calls",
        action="store_true",
        help="instead: Python and C calls per call of each kind (one replay, profiled)",
    )
    args = parser.parse_args()
    trees = [_Tree(_HERE)]
    if args.against is not None:
        trees.insert(0, _Tree(os.path.abspath(args.against)))
    names = ["against", "this"] if len(trees) == 2 else ["this"]
    if args.loadtest is not None:
        _loadtests(trees, names, args)
        return
    if args.calls:
        _calls(trees, names, args)
        return
    print(f"{'round':<7}{'tree':<9}" + "".join(f"{kind + ' us':>16}" for kind in _KINDS))
    print(f"{'goal':<16}" + "".join(f"{_GOALS.get(kind, ''):>16}" for kind in _KINDS))
    ratios: dict[str, list[float]] = {kind: [] for kind in _KINDS}
    mine: list[dict[str, float]] = []
    for number in range(args.rounds):
        results = anyio.run(_replay, trees, args.sessions, args.turns, args.build)
        mine.append(results[-1])
        for name, result in zip(names, results, strict=True):
            print(f"{number:<7}{name:<9}" + "".join(f"{result[k]:>16.1f}" for k in _KINDS))
        if len(results) == 2:
            for kind in _KINDS:
                ratios[kind].append(results[1][kind] / results[0][kind])
            print(f"{number:<7}{'ratio':<9}" + "".join(f"{ratios[k][-1]:>15.2f}x" for k in _KINDS))
    _verdicts(mine)
    if args.floor:
        for tree, name in zip(trees, names, strict=True):
            _floor(tree, name, args.sessions, args.turns, args.rounds)
    if len(trees) == 2:
        print(
            f"{'median':<7}{'ratio':<9}"
            + "".join(f"{statistics.median(ratios[k]):>15.2f}x" for k in _KINDS)
        )


if __name__ == "__main__":
    main()

"""Soak the Foundation's collector policy with a host that makes cyclic garbage every turn.

``--sessions`` sessions share ``--turns`` turns (default 100 x 1,000 =
100,000). Every turn the host commits a user message, prepares, and records
a reply, and on the way makes three kinds of cyclic garbage: a closure that
refers to itself, an exception kept with its traceback (its frame refers back
to the exception), and a self-referencing dict. Each session also keeps a
cyclic state object (with ``--state-objects`` tracked dicts that refer back
to it) that it replaces every ``--session-every`` turns: objects that live
across collector steps, are frozen while alive, and become cyclic garbage
later (the case ``gc.freeze`` never reclaims by itself; the policy's
thorough steps do, once the frozen set regrew).

Each object of the host's carries a ``Junk`` instance; ``Junk`` counts its
live instances exactly (``__init__``/``__del__``), so "live junk" is what the
host's garbage still holds: bounded means it stays flat as turns go by.

Policies, one after the other in one process: ``off`` (``collector=None``),
``default`` (``CollectorPolicy()``, stepped every ``--interval`` seconds) and
``never-thorough`` (``regrowth=math.inf``: no thorough step, what
``gc.freeze()`` alone would leave). Printed per 10% of the turns: live junk, the frozen set's
size, RSS, full collections so far and their longest pause (CPU of the
collecting thread), the policy's steps and thorough steps.

Usage: python scripts/soak_collector.py [--turns 100000] [--sessions 100]
       [--session-every 10] [--state-objects 50] [--interval 0.2]
       [--backend asyncio|trio]
"""

from __future__ import annotations

import argparse
import gc
import math
import resource
import time
from typing import Any

import anyio

from turnloom.context import Message, Role
from turnloom.runtime import CollectorPolicy, ContextPrepareRequest, Foundation, TurnSnapshot


class Junk:
    """A payload whose live instances are counted exactly."""

    live = 0

    def __init__(self) -> None:
        Junk.live += 1
        self.payload = bytearray(256)

    def __del__(self) -> None:
        Junk.live -= 1


def cyclic_garbage() -> None:
    """Three kinds of cyclic garbage, dropped at return."""

    def closure() -> Any:
        return closure, junk  # the closure's cell refers to the closure

    junk = Junk()
    kept: dict[str, Any] = {"junk": Junk()}
    kept["self"] = kept
    try:
        raise ValueError(junk)
    except ValueError as exc:
        kept["error"] = exc  # its traceback's frame holds ``kept``
    closure()


class SessionState:
    """A host's per-session state, cyclic, replaced every few turns.

    It holds ``size`` small tracked dicts besides its ``Junk``, so a dropped
    state is that many objects of frozen cyclic garbage.
    """

    size = 50

    def __init__(self) -> None:
        self.junk = Junk()
        self.me = self
        self.notes = [{"turn": n, "owner": self} for n in range(SessionState.size)]


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


async def soak(args: argparse.Namespace, policy: CollectorPolicy | None) -> list[str]:
    full = [0, 0.0]  # full collections, their longest CPU seconds
    began = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            began[0] = time.thread_time()
        else:
            full[0] += 1
            full[1] = max(full[1], time.thread_time() - began[0])

    lines: list[str] = []
    done = [0]
    report_every = max(1, args.turns // 10)
    per_session = args.turns // args.sessions
    gc.callbacks.append(on_gc)
    try:
        async with Foundation(collector=policy) as foundation:
            manager = foundation.manager

            async def session(number: int) -> None:
                context_id = f"s{number}"
                state = SessionState()
                for turn in range(per_session):
                    if turn % args.session_every == 0:
                        state = SessionState()  # the last one becomes cyclic garbage
                    turn_id = f"t{turn}"
                    text = f"question {turn} of {context_id}"
                    manager.accept_turn(
                        TurnSnapshot(
                            context_id=context_id,
                            turn_id=turn_id,
                            input=(Message(role=Role.user, content=text),),
                        )
                    )
                    await manager.prepare(
                        ContextPrepareRequest(context_id=context_id, turn_id=turn_id)
                    )
                    cyclic_garbage()
                    async with manager.invocation(context_id, turn_id) as invocation:
                        await anyio.lowlevel.checkpoint()
                        invocation.record([Message(role=Role.assistant, content=f"answer {turn}")])
                    done[0] += 1
                    if done[0] % report_every == 0:
                        collector = foundation.collector
                        stats = collector.statistics() if collector is not None else None
                        lines.append(
                            f"{done[0]:>8} {Junk.live:>10} {gc.get_freeze_count():>9} "
                            f"{rss_mb():>8.1f} {full[0]:>6} {full[1] * 1000:>10.2f} "
                            f"{stats.steps if stats else 0:>6} "
                            f"{stats.thorough_steps if stats else 0:>9}"
                        )
                del state

            async with anyio.create_task_group() as group:
                for number in range(args.sessions):
                    group.start_soon(session, number)
    finally:
        gc.callbacks.remove(on_gc)
    gc.collect()
    lines.append(f"after close and a full collection: live junk {Junk.live}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100_000)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--session-every", type=int, default=10)
    parser.add_argument("--state-objects", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args()
    SessionState.size = args.state_objects
    policies: dict[str, CollectorPolicy | None] = {
        "off": None,
        "default": CollectorPolicy(interval=args.interval),
        "never-thorough": CollectorPolicy(interval=args.interval, regrowth=math.inf),
    }
    for name, policy in policies.items():
        gc.collect()
        print(f"policy {name} ({args.backend}): {policy}")
        print(
            f"{'turns':>8} {'live junk':>10} {'frozen':>9} {'rss MB':>8} {'full':>6} "
            f"{'full max ms':>10} {'steps':>6} {'thorough':>9}"
        )
        started = time.perf_counter()
        for line in anyio.run(soak, args, policy, backend=args.backend):
            print(line, flush=True)
        print(f"({time.perf_counter() - started:.0f} s)\n", flush=True)


if __name__ == "__main__":
    main()

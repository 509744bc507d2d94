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

With ``--threads K`` the sessions are split over K threads, each running its
own event loop and its own Foundation (as LiveKit's thread executor runs one
per job): K policies step the one process-wide collector, and a thorough step
of one unfreezes what the others froze.

Policies, one after the other in one process: ``off`` (``collector=None``),
``default`` (``CollectorPolicy()``, stepped every ``--interval`` seconds) and
``never-thorough`` (``regrowth=math.inf``: no thorough step, what
``gc.freeze()`` alone would leave). Printed per 10% of the turns: live junk, the frozen set's
size, RSS, full collections so far and their longest pause (CPU of the
collecting thread), the policy's steps and thorough steps.

Usage: python scripts/soak_collector.py [--turns 100000] [--sessions 100]
       [--session-every 10] [--state-objects 50] [--interval 0.2]
       [--backend asyncio|trio] [--threads K]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import math
import resource
import threading
import time
from typing import Any

import anyio

from turnloom.context import Message, Role
from turnloom.runtime import CollectorPolicy, ContextPrepareRequest, Foundation, TurnSnapshot


class Junk:
    """A payload whose live instances are counted exactly, from any thread.

    Two counters advanced with ``next`` (one C call each, atomic under the
    GIL): made and freed; a ``+= 1`` could lose a count between threads.
    """

    made = itertools.count()
    freed = itertools.count()

    def __init__(self) -> None:
        next(Junk.made)
        self.payload = bytearray(256)

    def __del__(self) -> None:
        next(Junk.freed)

    @staticmethod
    def live() -> int:
        # The repr of a count is its next value; reading it advances nothing.
        return _value(Junk.made) - _value(Junk.freed)


def _value(counter: itertools.count[int]) -> int:
    return int(repr(counter)[6:-1])


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


class Run:
    """What the threads of one policy's run share: progress, full collections, lines."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.full = 0  # full collections
        self.full_max = 0.0  # their longest CPU seconds
        self.began = 0.0
        self.done = 0
        self.lock = threading.Lock()  # for ``done`` (no __del__ runs under it)
        self.report_every = max(1, args.turns // 10)
        self.lines: list[str] = []

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        # One collection runs at a time in a process, in the thread that started it.
        if info["generation"] != 2:
            return
        if phase == "start":
            self.began = time.thread_time()
        else:
            self.full += 1
            self.full_max = max(self.full_max, time.thread_time() - self.began)


async def soak(run: Run, policy: CollectorPolicy | None, part: int) -> None:
    """Run this thread's share of the sessions (every ``--threads``-th) in one Foundation."""
    args = run.args
    per_session = args.turns // args.sessions
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
                await manager.prepare(ContextPrepareRequest(context_id=context_id, turn_id=turn_id))
                cyclic_garbage()
                async with manager.invocation(context_id, turn_id) as invocation:
                    await anyio.lowlevel.checkpoint()
                    invocation.record([Message(role=Role.assistant, content=f"answer {turn}")])
                with run.lock:
                    run.done += 1
                    done = run.done
                if done % run.report_every == 0:
                    collector = foundation.collector
                    stats = collector.statistics() if collector is not None else None
                    run.lines.append(
                        f"{done:>8} {Junk.live():>10} {gc.get_freeze_count():>9} "
                        f"{rss_mb():>8.1f} {run.full:>6} {run.full_max * 1000:>10.2f} "
                        f"{stats.steps if stats else 0:>6} "
                        f"{stats.thorough_steps if stats else 0:>9}"
                    )
            del state

        async with anyio.create_task_group() as group:
            for number in range(part, args.sessions, args.threads):
                group.start_soon(session, number)


def soak_all(args: argparse.Namespace, policy: CollectorPolicy | None) -> list[str]:
    """One policy's run: the sessions over ``--threads`` threads, each its own loop."""
    run = Run(args)
    failures: list[BaseException] = []

    def thread(part: int) -> None:
        try:
            anyio.run(soak, run, policy, part, backend=args.backend)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    gc.callbacks.append(run.on_gc)
    try:
        if args.threads == 1:
            thread(0)
        else:
            threads = [threading.Thread(target=thread, args=(k,)) for k in range(args.threads)]
            for each in threads:
                each.start()
            for each in threads:
                each.join()
    finally:
        gc.callbacks.remove(run.on_gc)
    if failures:
        raise failures[0]
    gc.collect()
    run.lines.append(f"after close and a full collection: live junk {Junk.live()}")
    return run.lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100_000)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--session-every", type=int, default=10)
    parser.add_argument("--state-objects", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    SessionState.size = args.state_objects
    policies: dict[str, CollectorPolicy | None] = {
        "off": None,
        "default": CollectorPolicy(interval=args.interval),
        "never-thorough": CollectorPolicy(interval=args.interval, regrowth=math.inf),
    }
    for name, policy in policies.items():
        gc.collect()
        print(f"policy {name} ({args.backend}, {args.threads} thread(s)): {policy}")
        print(
            f"{'turns':>8} {'live junk':>10} {'frozen':>9} {'rss MB':>8} {'full':>6} "
            f"{'full max ms':>10} {'steps':>6} {'thorough':>9}"
        )
        started = time.perf_counter()
        for line in soak_all(args, policy):
            print(line, flush=True)
        print(f"({time.perf_counter() - started:.0f} s)\n", flush=True)


if __name__ == "__main__":
    main()

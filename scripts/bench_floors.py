"""Floors under the load test's throughput and pause goals, beside turnloom in one run.

Two costs measured against the work they carry:

1. **Thread handoff**: a prepare renders off the event loop, so it pays one
   handoff to a thread and back. Measured here: ``--tasks`` tasks each run
   ``--jobs`` jobs of pure-Python work of a fixed size, on the event loop
   (inline), through ``anyio.to_thread.run_sync`` with a limiter of 4 tokens
   (the Foundation's default ``worker_threads``; what turnloom did before its
   render worker), through turnloom's render worker as a prepare uses it
   (:class:`~turnloom.runtime._worker.RenderWorker`: one persistent thread,
   one wake-up of the loop per batch, the requester waiting on one bare
   :class:`~turnloom.runtime._wakeup.Signal`), and through a bare thread
   (the floor: a deque, a condition, the loop's thread-safe call-soon, one
   bare signal per job, no bookkeeping); each job follows a checkpoint, as a
   host's step between prepares does. CPU seconds per job of the process
   (every thread), and each handoff's extra CPU per job (minus inline), min
   of three rounds in rotating order. The work sizes bracket the load test's
   render per prepare. Goal: the worker's extra CPU at most 2x the bare
   thread's (the ratio is printed beside it).
2. **Garbage-collector floor**: a full ``gc.collect()`` visits every tracked
   object, so with N sessions live its pause has a floor set by what any
   program holding N concurrent sessions keeps. Measured here, at each session
   count: a bare anyio program whose N tasks are parked the way the load
   test's sessions are when a collection runs (a coroutine chain as deep as a
   host's ``await manager.prepare(...)``, inside a cancel scope, waiting on an
   event; each with a small dict of state), beside turnloom's load test
   (``turnloom.tools.loadtest.loadtest``, the built-in trajectories) stopped
   at its 30th turn per session on average. Both give tracked objects per
   session and the pause of one full collection (milliseconds), taken before
   anything else walks the objects.

Neither is a floor any more (issue 32): the render worker's handoff costs a
fraction of ``to_thread``'s, and the load test runs with the Foundation's
collector policy (its default), so its full collection at the 30th turn
walks only what changed since the policy's last step, against the bare
program's cold walk of everything.

Usage: python scripts/bench_floors.py [--sessions 1000 5000] [--backend asyncio|trio]
       [--tasks 200] [--jobs 50] [--work-us 0 100 250]
"""

from __future__ import annotations

import argparse
import gc
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import _goals
import anyio
import anyio.lowlevel
import anyio.to_thread

from turnloom.runtime._wakeup import Signal, loop_hooks
from turnloom.runtime._worker import RenderWorker
from turnloom.tools.loadtest import loadtest
from turnloom.tools.trajectories import builtin_trajectories

_LIMIT = 4  # Foundation(worker_threads=4), the default
_HOST_DEPTH = 7  # coroutines parked per load-test session in a prepare
_HANDOFF_GOAL = 2.0  # the worker's extra CPU per job at most this times the bare thread's
_PAUSE_GOAL_MS = 20.0  # issue 32: longest collection at 5,000 sessions


class _BareThread:
    """The floor of a batched handoff: a thread fed by a deque, woken when it
    sleeps, handing each batch back with one call-soon of the loop."""

    def __init__(self) -> None:
        self.hooks = loop_hooks()
        self.jobs: deque[tuple[Callable[[], object], Signal]] = deque()
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.sleeping = False
        self.stop = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def submit(self, work: Callable[[], object], signal: Signal) -> None:
        with self.lock:
            self.jobs.append((work, signal))
            if self.sleeping:
                self.sleeping = False
                self.wake.notify()

    def serve(self) -> None:
        while True:
            with self.lock:
                while not self.jobs and not self.stop:
                    self.sleeping = True
                    self.wake.wait()
                if not self.jobs:
                    return
                batch = list(self.jobs)
                self.jobs.clear()
            for work, _ in batch:
                work()
            self.hooks.call_soon(_wake_all, batch)

    def close(self) -> None:
        with self.lock:
            self.stop = True
            self.wake.notify()
        self.thread.join()


def _wake_all(batch: list[tuple[Any, Signal]]) -> None:
    for _, signal in batch:
        signal.set()


def _spin(loops: int) -> int:
    total = 0
    for number in range(loops):
        total += number
    return total


def _loops_for(microseconds: float) -> int:
    """Loops of ``_spin`` that take about ``microseconds`` on this machine."""
    if microseconds <= 0:
        return 0
    loops = 100_000
    begin = time.perf_counter()
    _spin(loops)
    per_loop = (time.perf_counter() - begin) / loops
    return max(1, round(microseconds * 1e-6 / per_loop))


async def _handoff(loops: int, tasks: int, jobs: int, way: str) -> float:
    """CPU seconds per job, all threads of the process.

    ``way``: "inline" (on the loop), "to_thread" (``anyio.to_thread.run_sync``
    under a limiter of 4 tokens), "worker" (turnloom's
    :class:`~turnloom.runtime._worker.RenderWorker` and one
    :class:`~turnloom.runtime._wakeup.Signal` per job, as a prepare uses
    them), or "bare" (:class:`_BareThread`, the floor).
    """
    limiter = anyio.CapacityLimiter(_LIMIT)
    worker = RenderWorker()
    signal = worker.hooks().signal
    bare = _BareThread() if way == "bare" else None

    def returned(done: Signal, _: object) -> None:
        done.set()

    def work() -> None:
        _spin(loops)

    async def session() -> None:
        for _ in range(jobs):
            await anyio.lowlevel.checkpoint()  # the host's step between prepares
            if way == "to_thread":
                await anyio.to_thread.run_sync(_spin, loops, limiter=limiter)
            elif way == "worker":
                done = signal()
                worker.submit(lambda _: _spin(loops), returned, done)
                await done.wait()
            elif bare is not None:
                done = signal()
                bare.submit(work, done)
                await done.wait()
            else:
                _spin(loops)

    begin = time.process_time()
    async with anyio.create_task_group() as group:
        for _ in range(tasks):
            group.start_soon(session)
    spent = time.process_time() - begin
    await worker.aclose()
    if bare is not None:
        bare.close()
    return spent / (tasks * jobs)


def _full_collection_ms() -> float:
    """The pause of one full collection, milliseconds.

    Taken first, before anything else walks the objects: a collection during
    a run finds them cold in the CPU's caches, as this one does.
    """
    begin = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - begin) * 1000


async def _bare(sessions: int) -> tuple[float, float]:
    """Tracked objects per session and the full-collection pause of the bare program."""
    gc.collect()
    gc.freeze()  # as the load test does: what the process held before is not walked
    release = anyio.Event()
    parked = [0]
    all_parked = anyio.Event()

    async def chain(depth: int, state: dict[str, object]) -> None:
        if depth:
            await chain(depth - 1, state)
            return
        with anyio.CancelScope():
            parked[0] += 1
            if parked[0] == sessions:
                all_parked.set()
            await release.wait()

    async def session(number: int) -> None:
        await chain(_HOST_DEPTH - 1, {"session": number, "turn": 0, "history": []})

    result = (0.0, 0.0)
    async with anyio.create_task_group() as group:
        for number in range(sessions):
            group.start_soon(session, number)
        await all_parked.wait()
        pause = _full_collection_ms()
        result = (len(gc.get_objects()) / sessions, pause)
        release.set()
    gc.unfreeze()
    return result


async def _turnloom(sessions: int) -> tuple[float, float]:
    """The same for turnloom's load test, stopped at its 30th turn per session."""
    measured: list[tuple[float, float]] = []
    calls = [0]

    def on_model_call() -> None:
        calls[0] += 1
        if calls[0] == sessions * 30:
            pause = _full_collection_ms()
            # The load test froze what the process held before it: not counted.
            measured.append((len(gc.get_objects()) / sessions, pause))

    await loadtest(
        builtin_trajectories(64, turns=(40, 40)),
        sessions=sessions,
        turns=40,
        on_model_call=on_model_call,
    )
    return measured[0]


async def _main(args: argparse.Namespace) -> None:
    print(
        f"thread handoff ({args.backend}; {args.tasks} tasks x {args.jobs} jobs, limiter {_LIMIT})"
    )
    print(
        "extra CPU per job over inline, us (min of 3 rounds, rotating order); "
        f"goal: worker/bare {_goals.goal(_HANDOFF_GOAL)}"
    )
    print("work us  inline cpu/job  to_thread extra  worker extra  bare extra  worker/bare  goal")
    ways = ["inline", "to_thread", "worker", "bare"]
    for work in args.work_us:
        loops = _loops_for(work)
        spent: dict[str, list[float]] = {way: [] for way in ways}
        for turn in range(3):  # rotating order, min of three
            for way in ways[turn:] + ways[:turn]:
                spent[way].append(await _handoff(loops, args.tasks, args.jobs, way))
        inline, threaded, batched, floor = (min(spent[way]) for way in ways)
        extra, bare_extra = batched - inline, floor - inline
        ratio = extra / bare_extra if bare_extra > 0 else float("inf")
        print(
            f"{work:7.0f} {inline * 1e6:15.1f} {(threaded - inline) * 1e6:16.1f} "
            f"{extra * 1e6:13.1f} {bare_extra * 1e6:11.1f} {ratio:11.2f}x  "
            f"{_goals.verdict(ratio, _HANDOFF_GOAL)}"
        )
    print()
    print(f"full garbage collection with N live sessions ({args.backend})")
    print(
        "sessions  bare objs/session  bare pause ms  ours objs/session  ours pause ms  ratio"
        f"  goal: ours {_goals.goal(_PAUSE_GOAL_MS, ' ms')}"
    )
    for sessions in args.sessions:
        bare_objects, bare_pause = await _bare(sessions)
        ours_objects, ours_pause = await _turnloom(sessions)
        print(
            f"{sessions:8d} {bare_objects:18.1f} {bare_pause:14.1f} {ours_objects:18.1f} "
            f"{ours_pause:14.1f} {ours_pause / bare_pause:5.2f}x"
            + (
                f"  {_goals.verdict(ours_pause, _PAUSE_GOAL_MS)}"
                if sessions >= 5000
                else "  (goal at 5,000)"
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--work-us", type=float, nargs="+", default=[0.0, 100.0, 250.0])
    args = parser.parse_args()
    anyio.run(_main, args, backend=args.backend)


if __name__ == "__main__":
    main()

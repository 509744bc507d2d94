"""Deterministic counts of the loop side of a prepare, per prepare, on asyncio and trio.

Runs ``--sessions`` sessions concurrently (started one per loop iteration, as
``turnloom loadtest`` starts them), each walking ``--turns`` turns of a
built-in trajectory through the load test's flow (``accept_turn``,
``prepare``, one invocation per model call with a checkpoint and
``Invocation.record``, ``record`` for tool results, ``build``), and counts on
the event loop's thread, per prepare:

- ``calls``: Python function calls (``sys.setprofile`` "call" events: frames
  entered, coroutine resumptions included), and ``distinct``: the distinct
  Python functions called over the run;
- ``c calls``: calls of C functions from Python;
- ``coros``: coroutine objects started (first entry of a coroutine's frame);
- ``call_soon`` (asyncio: ``loop.call_soon`` calls, the task steps scheduled)
  or ``steps`` (trio: task steps, from an instrument);
- the Python calls per module group (``--by-module``), the prepare path's own
  modules, the host flow's calls, anyio and the loop.

``--path inline`` forces every render inline (the inline share and
window lifted), ``--path worker`` forces every render to the render thread
(no inline render), ``--path natural`` leaves the shipped rule. With one
session (``--sessions 1``) and a forced path the counts are exact and equal
from run to run; with several sessions the worker path's batches follow the
thread's timing.

Usage: python scripts/profile_prepare.py [--sessions N] [--turns M]
       [--backend asyncio trio] [--path inline worker natural] [--by-module]
       [--top K]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import inspect
import sys
from typing import Any

import anyio
import anyio.lowlevel
import sniffio
from _workload import builtin_workload

import turnloom.runtime._preparing as preparing
from turnloom.context.gateway import GatewayType
from turnloom.context.message import Message
from turnloom.errors import QueueFullError
from turnloom.runtime.foundation import Foundation
from turnloom.runtime.manager import ContextManager
from turnloom.runtime.schemas import ContextPrepareRequest, PreparedContext
from turnloom.tools.transcript import Reply, Turn, snapshot, walk

_CO_COROUTINE = inspect.CO_COROUTINE


def _group(filename: str) -> str:
    """The module group a code object's file belongs to."""
    for marker, name in (
        ("/turnloom/runtime/", "runtime/"),
        ("/turnloom/context/", "context/"),
        ("/turnloom/tools/", "tools/"),
        ("/anyio/", "anyio"),
        ("/asyncio/", "asyncio"),
        ("/trio/", "trio"),
        ("/outcome/", "outcome"),
        ("/sniffio/", "sniffio"),
    ):
        at = filename.find(marker)
        if at >= 0:
            if name.endswith("/"):
                rest = filename[at + len(marker) :]
                return name + rest.removesuffix(".py")
            return name
    return "other:" + filename.rsplit("/", 1)[-1]


class _Counts:
    def __init__(self) -> None:
        self.calls = 0
        self.c_calls = 0
        self.coros = 0
        self.by_code: collections.Counter[Any] = collections.Counter()
        self.c_by_name: collections.Counter[str] = collections.Counter()
        self._frames: list[Any] = []  # coroutine frames seen (kept alive: ids stay unique)
        self._seen: set[int] = set()

    def profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            self.calls += 1
            code = frame.f_code
            self.by_code[code] += 1
            if code.co_flags & _CO_COROUTINE and id(frame) not in self._seen:
                self._seen.add(id(frame))
                self._frames.append(frame)
                self.coros += 1
        elif event == "c_call":
            self.c_calls += 1
            self.c_by_name[getattr(arg, "__qualname__", repr(arg))] += 1


async def _sessions(
    scripts: list[list[Message]], sessions: int, turns: int, path: str, counts: _Counts
) -> tuple[int, int]:
    manager = ContextManager(gateway=GatewayType.openai_chat)
    prepares = [0]
    scheduled = [0]
    async with Foundation(manager):
        preparer = manager._life.preparer
        assert preparer is not None
        if path == "worker":
            preparer._inline = False
        library = sniffio.current_async_library()
        uninstall = _count_steps(library, scheduled)

        async def session(number: int) -> None:
            script = scripts[number % len(scripts)]
            context_id = f"session-{number}"
            prefix: PreparedContext | None = None
            continuation: list[Message] = []
            turn_id = ""
            for step in walk(script, max_turns=turns):
                if isinstance(step, Turn):
                    turn_id = step.turn_id
                    manager.accept_turn(snapshot(context_id, step))
                    request = ContextPrepareRequest(context_id=context_id, turn_id=turn_id)
                    try:
                        prefix = await manager.prepare_nowait(request)
                    except QueueFullError:
                        prefix = None
                    if prefix is None:
                        prefix = await manager.prepare(request)
                    prepares[0] += 1
                    continuation = []
                elif prefix is None:
                    continue
                elif isinstance(step, Reply):
                    if continuation:
                        manager.build(prefix, continuation)
                    async with manager.invocation(context_id, turn_id) as invocation:
                        await anyio.lowlevel.checkpoint()
                        invocation.record([step.message])
                    continuation.append(step.message)
                else:
                    manager.record(context_id, turn_id, [step.message])
                    continuation.append(step.message)

        sys.setprofile(counts.profile)
        try:
            async with anyio.create_task_group() as group:
                for number in range(sessions):
                    group.start_soon(session, number)
                    await anyio.lowlevel.checkpoint()
        finally:
            sys.setprofile(None)
            uninstall()
    return prepares[0], scheduled[0]


def _count_steps(library: str, scheduled: list[int]) -> Any:
    """Count task steps: asyncio's ``loop.call_soon`` calls, trio's task steps."""
    if library == "asyncio":
        loop = asyncio.get_running_loop()
        call_soon = loop.call_soon

        def counted(*args: Any, **kwargs: Any) -> Any:
            scheduled[0] += 1
            return call_soon(*args, **kwargs)

        loop.call_soon = counted  # type: ignore[method-assign,assignment]

        def uninstall() -> None:
            del loop.call_soon

        return uninstall
    import trio

    class Steps(trio.abc.Instrument):
        def before_task_step(self, task: Any) -> None:
            scheduled[0] += 1

    instrument = Steps()
    trio.lowlevel.add_instrument(instrument)
    return lambda: trio.lowlevel.remove_instrument(instrument)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--backend", nargs="+", default=["asyncio", "trio"])
    parser.add_argument("--path", nargs="+", default=["inline", "worker"])
    parser.add_argument("--by-module", action="store_true")
    parser.add_argument("--top", type=int, default=0, help="the K functions called most")
    parser.add_argument("--only", nargs="*", help="with --top: only these module groups")
    args = parser.parse_args()
    _, scripts = builtin_workload(args.turns)
    preparing.INLINE_SHARE = 1.0
    print(
        f"{'backend':<8}{'path':<8}{'sessions':>9}{'prepares':>9}{'calls':>8}{'c calls':>8}"
        f"{'coros':>7}{'steps':>7}{'distinct':>9}   (per prepare; steps: call_soon or task steps)"
    )
    for backend in args.backend:
        for path in args.path:
            if path == "natural":
                preparing.INLINE_SHARE = 0.25
            else:
                preparing.INLINE_SHARE = 1.0
            counts = _Counts()
            prepares, steps = anyio.run(
                _sessions, scripts, args.sessions, args.turns, path, counts, backend=backend
            )
            print(
                f"{backend:<8}{path:<8}{args.sessions:>9}{prepares:>9}"
                f"{counts.calls / prepares:>8.2f}{counts.c_calls / prepares:>8.2f}"
                f"{counts.coros / prepares:>7.2f}{steps / prepares:>7.2f}{len(counts.by_code):>9}"
            )
            if args.by_module:
                groups: collections.Counter[str] = collections.Counter()
                for code, n in counts.by_code.items():
                    groups[_group(code.co_filename)] += n
                for name, n in groups.most_common():
                    print(f"    {name:<40}{n / prepares:>8.2f}")
            if args.top:
                for code, n in counts.by_code.most_common(args.top):
                    where = _group(code.co_filename)
                    if args.only and not where.startswith(tuple(args.only)):
                        continue
                    print(f"    {where:<28}{code.co_qualname:<48}{n / prepares:>8.2f}")
                for name, n in counts.c_by_name.most_common(args.top):
                    print(f"    {'C':<28}{name:<48}{n / prepares:>8.2f}")


if __name__ == "__main__":
    main()

"""``turnloom loadtest`` against its render, a naive program and a bare control ticker, in one run.

For each backend (asyncio, trio), each session count (1,000 by default) and
each collector policy (the Foundation's default, and off), in one process,
rotating the order over ``--rounds`` rounds:

- **turnloom**: :func:`turnloom.tools.loadtest.loadtest`, every session
  replaying a 40-turn built-in trajectory (past the 32-turn limit, so
  histories evict) with no model latency: the runtime saturated on its own
  CPU work. CPU per prepare is the process's CPU (every thread,
  ``time.process_time``); the render's CPU is measured around each render
  (``time.thread_time`` of the thread that ran it, worker or loop), in the
  same run.
- **naive**: the program one would write without turnloom: each session keeps
  its messages (the last 32 turns), and for each turn renders its whole
  history through the same gateway in ``anyio.to_thread.run_sync`` (bounded
  to 16 threads), later model calls of a turn rendering their new messages on
  the loop. Its throughput and its CPU per turn.
- **control ticker**: a bare asyncio program in its own process ticking every
  5 ms beside the load test (as the load test's own ticker does): its lag is
  the machine's noise, which the load test's lag is read against.

Goals (issue 32): CPU per prepare at most 2x its render's CPU (today
2.6-3.6x); throughput at least 1.4x the naive program's (today 0.91-1.11x);
at 1,000 sessions no full collection after the ramp-up (today 6-14), lag max
at most 25 ms (today 86-106 ms) and lag p99 within 5 ms of the control
ticker's. The "collector off" rows are the in-run baseline for the last three.
Then the loop side of each run (:class:`_LoopClock`): ``accept_turn``, the
records and ``build`` at most 10 us per call (one message each here), and the
rest of the loop's CPU per prepare at most 25 us.

Last, the floor under the first goal, from the same runs: what any program
doing the load test's work under the same contract spends per prepare, at
least: the render (as measured), the host copies ``build`` hands out (every
container new: the prefix's copy and the continuation's, timed around
:meth:`NativeItems.fresh` and the continuation's copy in those runs, on
whichever thread made them), the host flow's own awaits on the event loop (a
bare run of the same sessions, scripts and awaits with every turnloom call
taken out, in the same process), and ``check_message`` once per message
handed in (the door's check alone, min of 3 rounds over the scripts'
messages; no render, no bookkeeping). That sum over the render is the floor of
the CPU-per-prepare ratio; what turnloom spends beyond it is its own
bookkeeping (limits, ids, steps, slots, delivery).

Usage: python scripts/bench_loadtest.py [--turns M] [--sessions N ...] [--rounds R]
       [--backend asyncio trio] [--collector default off]
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import _goals
import anyio
import anyio.lowlevel
import anyio.to_thread
from _control import control_ticker, lag_summary
from _workload import builtin_workload

import turnloom.runtime._preparing as preparing
from turnloom.context.gateway import GatewayType, get_gateway
from turnloom.context.message import Message, check_message
from turnloom.runtime import CollectorPolicy
from turnloom.tools.loadtest import LoadtestReport, loadtest
from turnloom.tools.trajectories import Trajectory
from turnloom.tools.transcript import Reply, Turn, walk

_KEEP_TURNS = 32  # turnloom's default history limit
_CPU_GOAL = 2.0  # issue 32: CPU per prepare at most this times its render's CPU


class _RenderClock:
    """CPU seconds spent inside ``render_preparation``, on whichever thread ran it.

    ``inline`` holds the part spent on the main thread (the event loop's).
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.inline = 0.0
        self._lock = threading.Lock()
        # The preparer calls the name in its module: replace it there.
        self._render = vars(preparing)["render_preparation"]

    def install(self) -> None:
        render = self._render

        def timed(*args: Any, **kwargs: Any) -> Any:
            begin = time.thread_time()
            try:
                return render(*args, **kwargs)
            finally:
                spent = time.thread_time() - begin
                with self._lock:
                    self.seconds += spent
                    if threading.current_thread() is threading.main_thread():
                        self.inline += spent

        vars(preparing)["render_preparation"] = timed

    def take(self) -> float:
        with self._lock:
            seconds, self.seconds = self.seconds, 0.0
        return seconds

    def take_inline(self) -> float:
        with self._lock:
            seconds, self.inline = self.inline, 0.0
        return seconds


class _CopyClock:
    """CPU seconds spent making the host copies ``build`` hands out, on any thread.

    The prefix's copy (:meth:`NativeItems.fresh`, on the loop or made ahead
    in the render worker) and the continuation's (``fresh_items`` as
    ``_continuation`` calls it).
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self._lock = threading.Lock()

    def install(self) -> None:
        import turnloom.runtime._continuation as continuation
        from turnloom.context.items import NativeItems

        NativeItems.fresh = self._timed(NativeItems.fresh)  # type: ignore[method-assign]
        vars(continuation)["fresh_items"] = self._timed(vars(continuation)["fresh_items"])

    def _timed(self, copy: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            begin = time.thread_time()
            try:
                return copy(*args, **kwargs)
            finally:
                spent = time.thread_time() - begin
                with self._lock:
                    self.seconds += spent

        return timed

    def take(self) -> float:
        with self._lock:
            seconds, self.seconds = self.seconds, 0.0
        return seconds


class _LoopClock:
    """CPU of the loop side, per kind of call: the host's calls timed on the loop thread.

    ``accept_turn``, ``record`` (``manager.record``), ``inv.record``
    (``Invocation.record``) and ``build``, each timed alone with
    ``time.thread_time_ns`` (this thread's CPU), the clock's own cost
    (calibrated) taken off; and the loop thread's whole CPU over a run, of
    which the rest, after these calls and the renders run inline, is the
    prepares' loop side (checks, slot, handoff, delivery), the event loop
    and anyio, and the load test's own session code.
    """

    _KINDS = ("accept_turn", "record", "inv.record", "build")

    def __init__(self) -> None:
        self.spent = dict.fromkeys(self._KINDS, 0)
        self.calls = dict.fromkeys(self._KINDS, 0)
        clock = time.thread_time_ns
        self.overhead = min(-clock() + clock() for _ in range(1000))

    def install(self) -> None:
        from turnloom.runtime._invocation import Invocation
        from turnloom.runtime.manager import ContextManager

        for owner, name, kind in (
            (ContextManager, "accept_turn", "accept_turn"),
            (ContextManager, "record", "record"),
            (Invocation, "record", "inv.record"),
            (ContextManager, "build", "build"),
        ):
            setattr(owner, name, self._timed(getattr(owner, name), kind))

    def _timed(self, method: Any, kind: str) -> Any:
        clock = time.thread_time_ns
        spent, calls = self.spent, self.calls

        def timed(*args: Any, **kwargs: Any) -> Any:
            begin = clock()
            try:
                return method(*args, **kwargs)
            finally:
                spent[kind] += clock() - begin
                calls[kind] += 1

        return timed

    def take(self) -> tuple[dict[str, float], int, float]:
        """Per kind: microseconds per call; calls in all; CPU seconds of them all."""
        per_call = {
            kind: max(0, self.spent[kind] - self.overhead * self.calls[kind])
            / self.calls[kind]
            / 1000
            if self.calls[kind]
            else float("nan")
            for kind in self._KINDS
        }
        calls = sum(self.calls.values())
        seconds = sum(self.spent.values()) / 1e9 - self.overhead * calls / 1e9
        for kind in self._KINDS:  # in place: the timed methods hold these dicts
            self.spent[kind] = self.calls[kind] = 0
        return per_call, calls, seconds


async def _naive(
    scripts: list[list[Message]], sessions: int, turns: int
) -> tuple[int, float, float]:
    """Run the naive program; return its turn renders, wall seconds and CPU seconds."""
    gateway = get_gateway(GatewayType.openai_chat)
    limiter = anyio.CapacityLimiter(16)
    done = [0]

    def render_all(history: list[list[Message]]) -> list[object]:
        return [item for turn in history for message in turn for item in gateway.render(message)]

    async def session(number: int) -> None:
        history: list[list[Message]] = []
        items: list[object] = []
        for step in walk(scripts[number % len(scripts)], max_turns=turns):
            if isinstance(step, Turn):
                history.append([*(step.instructions or ()), step.input])
                del history[:-_KEEP_TURNS]
                items = await anyio.to_thread.run_sync(render_all, history, limiter=limiter)
                done[0] += 1
            elif isinstance(step, Reply):
                await anyio.lowlevel.checkpoint()  # the model answers
                history[-1].append(step.message)
                items.extend(gateway.render(step.message))
            else:
                history[-1].append(step.message)
                items.extend(gateway.render(step.message))

    begin, cpu = time.perf_counter(), time.process_time()
    async with anyio.create_task_group() as group:
        for number in range(sessions):
            group.start_soon(session, number)
    return done[0], time.perf_counter() - begin, time.process_time() - cpu


async def _scaffold(scripts: list[list[Message]], sessions: int, turns: int) -> tuple[int, float]:
    """The load test's host flow with every turnloom call taken out: its turns and CPU seconds.

    The same sessions walking the same scripts, arriving one per loop
    iteration, with the awaits the load test's session makes (its prepare,
    the model's answer in each invocation): what the event loop and the
    session code cost on their own.
    """
    done = [0]

    async def session(number: int) -> None:
        for step in walk(scripts[number % len(scripts)], max_turns=turns):
            if isinstance(step, Turn):
                await anyio.lowlevel.checkpoint()  # the prepare
                done[0] += 1
            elif isinstance(step, Reply):
                await anyio.lowlevel.checkpoint()  # the model answers

    cpu = time.process_time()
    async with anyio.create_task_group() as group:
        for number in range(sessions):
            group.start_soon(session, number)
            await anyio.lowlevel.checkpoint()
    return done[0], time.process_time() - cpu


def _door_floor(scripts: list[list[Message]], turns: int) -> tuple[float, float]:
    """``check_message``'s CPU seconds per message, min of 3 rounds; messages handed in per turn.

    Over every message the scripts hand in (instructions, inputs, model
    outputs and tool results), each checked once in a tight loop.
    """
    messages: list[Message] = []
    prepares = 0
    for script in scripts:
        for step in walk(script, max_turns=turns):
            if isinstance(step, Turn):
                prepares += 1
                messages.extend(step.instructions or ())
                messages.append(step.input)
            else:
                messages.append(step.message)
    best = float("inf")
    for _ in range(3):
        begin = time.thread_time()
        for message in messages:
            check_message(message)
        best = min(best, (time.thread_time() - begin) / len(messages))
    return best, len(messages) / prepares


async def _ours(
    trajectories: list[Trajectory], sessions: int, turns: int, collector: CollectorPolicy | None
) -> tuple[LoadtestReport, dict[str, float], float]:
    """The load test, the control ticker's lags, and the loop thread's CPU seconds."""
    with control_ticker() as ticks:
        begin = time.thread_time()
        report = await loadtest(trajectories, sessions=sessions, turns=turns, collector=collector)
        loop_cpu = time.thread_time() - begin
    return report, lag_summary(ticks), loop_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1000])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--backend", nargs="+", default=["asyncio", "trio"])
    parser.add_argument(
        "--collector",
        nargs="+",
        choices=["default", "off"],
        default=["default", "off"],
        help="the collector policies to run (default: both)",
    )
    args = parser.parse_args()
    trajectories, scripts = builtin_workload(args.turns)
    clock = _RenderClock()
    clock.install()
    copies = _CopyClock()
    copies.install()
    door, messages_per_prepare = _door_floor(scripts, args.turns)
    loop_clock = _LoopClock()
    loop_clock.install()
    print(
        f"{'backend':<8}{'sessions':>9}{'collector':>10}{'ours/s':>8}{'naive/s':>8}{'ratio':>7}"
        f"{'cpu/prep':>9}{'render':>8}{'ratio':>7}{'goal':>9}{'naive cpu':>10}"
        f"{'lag p99':>8}{'ctl p99':>8}"
        f"{'lag max':>8}{'ctl max':>8}{'full':>5}{'steady':>7}{'full cpu':>9}{'steps':>8}"
        f"{'step cpu':>9}"
    )
    print(
        f"{'':<8}{'':>9}{'':>10}{'':>8}{'':>8}{'>=1.4':>7}{'us':>9}{'cpu us':>8}{'':>7}"
        f"{_goals.goal(_CPU_GOAL):>9}"
        f"{'us/turn':>10}{'ms':>8}{'ms':>8}{'<=25':>8}{'ms':>8}{'':>5}{'=0':>7}{'ms':>9}"
        f"{'thor.':>8}{'ms':>9}"
    )
    loop_rows: list[tuple[Any, ...]] = []
    floor_rows: list[tuple[Any, ...]] = []
    for round_ in range(args.rounds):
        for backend in args.backend:
            for sessions in args.sessions:
                policies: list[tuple[str, CollectorPolicy | None]] = [
                    (name, policy)
                    for name, policy in (("default", CollectorPolicy()), ("off", None))
                    if name in args.collector
                ]
                if round_ % 2:
                    policies.reverse()  # rotate the order between rounds
                naive = anyio.run(_naive, scripts, sessions, args.turns, backend=backend)
                renders, naive_seconds, naive_cpu = naive
                bare_turns, bare_cpu = anyio.run(
                    _scaffold, scripts, sessions, args.turns, backend=backend
                )
                for name, policy in policies:
                    clock.take()
                    clock.take_inline()
                    copies.take()
                    loop_clock.take()
                    report, control, loop_cpu = anyio.run(
                        _ours, trajectories, sessions, args.turns, policy, backend=backend
                    )
                    render = clock.take() / report.prepares
                    inline = clock.take_inline()
                    floor_rows.append(
                        (
                            backend,
                            sessions,
                            name,
                            report.cpu_seconds / report.prepares,
                            render,
                            copies.take() / report.prepares,
                            bare_cpu / bare_turns,
                            door * messages_per_prepare,
                        )
                    )
                    loop_rows.append(
                        (backend, sessions, name, report, loop_cpu, inline, *loop_clock.take())
                    )
                    cpu = report.cpu_seconds / report.prepares
                    ours = report.prepares_per_second
                    naive_rate = renders / naive_seconds
                    print(
                        f"{backend:<8}{sessions:>9}{name:>10}{ours:>8.0f}{naive_rate:>8.0f}"
                        f"{ours / naive_rate:>6.2f}x{cpu * 1e6:>9.0f}{render * 1e6:>8.0f}"
                        f"{cpu / render:>6.2f}x"
                        f"{_goals.verdict(cpu / render, _CPU_GOAL):>9}"
                        f"{naive_cpu / renders * 1e6:>10.0f}"
                        f"{report.loop_lag_p99_ms:>8.1f}{control['p99_ms']:>8.1f}"
                        f"{report.loop_lag_max_ms:>8.1f}{control['max_ms']:>8.1f}"
                        f"{report.gc_full_collections:>5}{report.gc_full_steady:>7}"
                        f"{report.gc_full_cpu_max_ms:>9.1f}"
                        f"{report.collector_steps:>5}/{report.collector_thorough_steps:<2}"
                        f"{report.collector_step_cpu_max_ms:>9.1f}",
                        flush=True,
                    )

    _print_loop_side(loop_rows)
    _print_floor(floor_rows, messages_per_prepare)


def _print_floor(rows: list[tuple[Any, ...]], messages: float) -> None:
    """The floor of the CPU-per-prepare ratio beside turnloom's, for each run above."""
    print()
    print(
        f"Floor of CPU per prepare (us per prepare; {messages:.2f} messages handed in per prepare):"
    )
    print(
        f"{'backend':<8}{'sessions':>9}{'collector':>10}{'render':>8}{'copies':>8}{'awaits':>8}"
        f"{'checks':>8}{'floor':>8}{'ratio':>8}{'ours':>8}{'ratio':>8}{'goal':>9}{'beyond':>8}"
    )
    for backend, sessions, name, cpu, render, copies, awaits, checks in rows:
        floor = render + copies + awaits + checks
        print(
            f"{backend:<8}{sessions:>9}{name:>10}{render * 1e6:>8.0f}{copies * 1e6:>8.0f}"
            f"{awaits * 1e6:>8.0f}{checks * 1e6:>8.0f}{floor * 1e6:>8.0f}{floor / render:>7.2f}x"
            f"{cpu * 1e6:>8.0f}{cpu / render:>7.2f}x{_goals.goal(_CPU_GOAL):>9}"
            f"{(cpu - floor) * 1e6:>8.0f}"
        )
    print(
        "floor: render + the host copies build hands out + the host flow's awaits (a bare run)\n"
        "+ check_message once per message; ratio: over the render (the goal's measure); beyond:\n"
        "turnloom's CPU per prepare past the floor (its bookkeeping)."
    )


def _print_loop_side(rows: list[tuple[Any, ...]]) -> None:
    """The loop side's breakdown of each run above, each value beside its goal (issue 32)."""
    print()
    print("Loop side (CPU of the event loop's thread; us per call, and per prepare):")
    print(
        f"{'backend':<8}{'sessions':>9}{'collector':>10}{'accept_turn':>12}{'record':>8}"
        f"{'inv.rec':>8}{'build':>8}{'loop/prep':>10}{'inline':>8}{'calls':>8}{'rest':>8}"
    )
    print(
        f"{'goal':<27}{'<=10':>12}{'<=10':>8}{'<=10':>8}{'<=10':>8}{'':>10}{'':>8}{'':>8}"
        f"{'<=25':>8}"
    )
    for backend, sessions, name, report, loop_cpu, inline, per_call, _, calls_cpu in rows:
        prepares = report.prepares
        rest = (loop_cpu - inline - calls_cpu) / prepares
        print(
            f"{backend:<8}{sessions:>9}{name:>10}{per_call['accept_turn']:>12.1f}"
            f"{per_call['record']:>8.1f}{per_call['inv.record']:>8.1f}{per_call['build']:>8.1f}"
            f"{loop_cpu / prepares * 1e6:>10.0f}{inline / prepares * 1e6:>8.0f}"
            f"{calls_cpu / prepares * 1e6:>8.0f}{rest * 1e6:>8.0f}"
        )
    print(
        "rest: the loop's CPU per prepare after the calls timed and the inline renders: the\n"
        "prepare's loop side (checks, slot, handoff, delivery), invocation blocks, the event\n"
        "loop and anyio, and the load test's own session code."
    )


if __name__ == "__main__":
    main()

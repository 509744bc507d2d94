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

import turnloom.runtime._preparing as preparing
from turnloom.context.gateway import GatewayType, get_gateway
from turnloom.context.message import Message
from turnloom.runtime import CollectorPolicy
from turnloom.tools.loadtest import LoadtestReport, loadtest
from turnloom.tools.trajectories import Trajectory, builtin_trajectories, check_trajectory
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
    trajectories = builtin_trajectories(64, turns=(args.turns, args.turns))
    scripts = []
    for trajectory in trajectories:
        checked = check_trajectory(trajectory)
        assert isinstance(checked, list)
        scripts.append(checked)
    clock = _RenderClock()
    clock.install()
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
                for name, policy in policies:
                    clock.take()
                    clock.take_inline()
                    loop_clock.take()
                    report, control, loop_cpu = anyio.run(
                        _ours, trajectories, sessions, args.turns, policy, backend=backend
                    )
                    render = clock.take() / report.prepares
                    inline = clock.take_inline()
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

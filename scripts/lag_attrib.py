"""What the long event-loop pauses of ``turnloom loadtest`` are, by cause (issue 32).

Runs one load test (one backend, one session count) with a bare control
ticker beside it in its own process, and records, each with its wall-clock
span: every late wake-up of the load test's ticker; the collector policy's
pauses (a step's collection, and the separate read of the frozen set's size
where the tree has one); every garbage collection (``gc.callbacks``, on the
loop's thread or the render thread); every render (inline on the loop or in
the render thread, with its thread CPU); every batch the render thread hands
back (its size); the host calls ``build``, ``accept_turn``, ``record`` and
``Invocation.record`` longer than 2 ms (with their CPU: a long wall time at
a small CPU time is a wait for the GIL or the CPU); on asyncio every loop
iteration and callback longer than 3 / 2 ms, on trio every task step longer
than 2 ms.

Then it prints the lag's distribution beside the control ticker's, how many
late wake-ups overlap a collector pause, and for the ``--top`` latest
wake-ups what ran during their wait. Run it with ``PYTHONPATH`` set to each
tree to compare two (``git archive main turnloom | tar -x -C /tmp/base``).

Usage: python scripts/lag_attrib.py [--sessions N] [--backend asyncio|trio]
       [--turns M] [--top K] [--json FILE]
"""

from __future__ import annotations

import argparse
import bisect
import gc
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
from _control import control_ticker

import turnloom.runtime._collector as collector_module
import turnloom.runtime._preparing as preparing
import turnloom.runtime._worker as worker_module
from turnloom.runtime._invocation import Invocation
from turnloom.runtime.manager import ContextManager
from turnloom.tools.loadtest import LoadtestReport, LoadtestSamples, loadtest
from turnloom.tools.trajectories import builtin_trajectories

Event = tuple[str, float, float, Any]  # (kind, start, end, detail), perf_counter seconds
_events: list[Event] = []
_lock = threading.Lock()
_clock = time.perf_counter


def _timed(method: Callable[..., Any], kind: str, floor: float = 0.0) -> Callable[..., Any]:
    """``method`` recording its span and thread CPU when longer than ``floor`` seconds."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        begin, cpu = _clock(), time.thread_time()
        try:
            return method(*args, **kwargs)
        finally:
            end = _clock()
            if end - begin > floor:
                with _lock:
                    _events.append((kind, begin, end, time.thread_time() - cpu))

    return timed


def _install(backend: str) -> None:
    frozen = collector_module.FrozenCollector
    frozen.step = _timed(frozen.step, "policy step")  # type: ignore[method-assign]
    render = vars(preparing)["render_preparation"]
    inline = _timed(render, "render inline")
    threaded = _timed(render, "render thread")

    def rendering(*args: Any, **kwargs: Any) -> Any:
        on_loop = threading.current_thread() is threading.main_thread()
        return (inline if on_loop else threaded)(*args, **kwargs)

    vars(preparing)["render_preparation"] = rendering
    hand_back = worker_module.RenderWorker._hand_back

    def handing_back(self: Any, results: list[Any]) -> None:
        begin = _clock()
        hand_back(self, results)
        _events.append(("hand-back", begin, _clock(), len(results)))

    worker_module.RenderWorker._hand_back = handing_back  # type: ignore[method-assign]
    for owner, name in (
        (ContextManager, "build"),
        (ContextManager, "accept_turn"),
        (ContextManager, "record"),
        (Invocation, "record"),
    ):
        setattr(owner, name, _timed(getattr(owner, name), f"{owner.__name__}.{name}", 0.002))
    started = [0.0, False]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = [_clock(), threading.current_thread() is threading.main_thread()]
        else:
            where = "" if started[1] else " (thread)"
            _events.append((f"gc{info['generation']}{where}", started[0], _clock(), 0))

    gc.callbacks.append(on_gc)
    if backend == "asyncio":
        import asyncio.base_events
        import asyncio.events

        loop_class: Any = asyncio.base_events.BaseEventLoop
        loop_class._run_once = _timed(loop_class._run_once, "loop iteration", 0.003)
        handle: Any = asyncio.events.Handle
        handle._run = _timed(handle._run, "callback", 0.002)


class _TaskSteps:
    """A trio instrument recording task steps longer than 2 ms."""

    def __init__(self) -> None:
        self.began = 0.0
        self.cpu = 0.0

    def before_task_step(self, task: Any) -> None:
        self.began, self.cpu = _clock(), time.thread_time()

    def after_task_step(self, task: Any) -> None:
        end = _clock()
        if self.began and end - self.began > 0.002:  # (added mid-step: the first has none)
            _events.append(("task step", self.began, end, time.thread_time() - self.cpu))


async def _run(args: argparse.Namespace, wakeups: list[float]) -> tuple[LoadtestReport, Any]:
    if args.backend == "trio":
        import trio

        trio.lowlevel.add_instrument(_TaskSteps())  # type: ignore[arg-type]

    class Stamped(list[float]):  # the absolute time of each ticker wake-up
        def append(self, value: float) -> None:
            wakeups.append(_clock())
            super().append(value)

    samples = LoadtestSamples()
    samples.lag_at = Stamped()
    trajectories = builtin_trajectories(64, turns=(args.turns, args.turns))
    with control_ticker() as control:
        report = await loadtest(
            trajectories, sessions=args.sessions, turns=args.turns, samples=samples
        )
    ticks = list(zip(wakeups, samples.lag, strict=True))
    return report, {"ticks": ticks, "control": control}


def _quantiles(values: list[float]) -> str:
    ordered = sorted(values)
    if not ordered:
        return "none"

    def at(share: float) -> float:
        return ordered[min(len(ordered) - 1, int(len(ordered) * share))] * 1000

    return (
        f"p50 {at(0.5):.1f}  p90 {at(0.9):.1f}  p99 {at(0.99):.1f}  max {ordered[-1] * 1000:.1f} ms"
    )


def _report(report: LoadtestReport, run: dict[str, Any], top: int) -> None:
    ticks: list[tuple[float, float]] = run["ticks"]
    control: list[tuple[float, float]] = run["control"]
    events = sorted(_events, key=lambda event: event[1])
    starts = [event[1] for event in events]
    print(
        f"{report.sessions} sessions, {report.prepares} prepares in {report.seconds:.1f} s; "
        f"policy: {report.collector_steps} steps, longest pause "
        f"{report.collector_step_cpu_max_ms:.1f} ms CPU"
    )
    print(f"lag     {_quantiles([lag for _, lag in ticks])}")
    print(f"control {_quantiles([lag for _, lag in control])}")
    print(f"{'kind':<26}{'count':>7}{'mean ms':>9}{'max ms':>9}{'max cpu ms':>11}")
    for kind in sorted({event[0] for event in events}):
        spans = [(end - begin, detail) for k, begin, end, detail in events if k == kind]
        cpus = [detail for _, detail in spans if isinstance(detail, float)]
        print(
            f"{kind:<26}{len(spans):>7}{sum(s for s, _ in spans) / len(spans) * 1000:>9.2f}"
            f"{max(s for s, _ in spans) * 1000:>9.1f}"
            + (
                f"{max(cpus) * 1000:>11.1f}"
                if cpus
                else f"{'size ' + str(max(d for _, d in spans)):>11}"
            )
        )
    policy = [(begin, end) for kind, begin, end, _ in events if kind.startswith("policy")]

    def during(wake: float, lag: float) -> list[Event]:
        low, high = wake - lag - 0.001, wake
        first = bisect.bisect_left(starts, low - 1.0)
        return [event for event in events[first:] if event[1] < high and event[2] > low]

    for floor in (0.025, 0.05, 0.1):
        late = [(wake, lag) for wake, lag in ticks if lag > floor]
        overlapping = sum(
            any(begin < wake and end > wake - lag - 0.001 for begin, end in policy)
            for wake, lag in late
        )
        print(
            f"wake-ups later than {floor * 1000:.0f} ms: {len(late)}, "
            f"during a policy pause: {overlapping}"
        )
    origin = ticks[0][0] if ticks else 0.0
    for wake, lag in sorted(sorted(ticks, key=lambda tick: -tick[1])[:top]):
        seen = [lag for at, lag in control if wake - lag <= at <= wake + 0.01]
        print(
            f"t={wake - origin:7.2f} s  lag {lag * 1000:6.1f} ms  "
            f"(control's worst meanwhile {max(seen, default=0.0) * 1000:.1f} ms)"
        )
        spans: dict[str, list[float]] = {}
        for kind, begin, end, _ in during(wake, lag):
            spans.setdefault(kind, []).append(end - begin)
        for kind, durations in sorted(spans.items(), key=lambda item: -max(item[1])):
            print(f"    {kind:<26} x{len(durations):<4} longest {max(durations) * 1000:6.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--json", help="write the ticks, control ticks and events here")
    args = parser.parse_args()
    _install(args.backend)
    wakeups: list[float] = []
    report, run = anyio.run(_run, args, wakeups, backend=args.backend)
    _report(report, run, args.top)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({**run, "events": _events}, out)


if __name__ == "__main__":
    main()

"""``turnloom loadtest`` against the render-only limit and a naive program, in one run.

For each backend (asyncio, trio) and each session count (100 and 1,000 by
default), in one process:

- **turnloom**: :func:`turnloom.tools.loadtest.loadtest`, every session
  replaying a 40-turn built-in trajectory (past the 32-turn limit, so
  histories evict) with no model latency: the runtime saturated on its own
  CPU work. Its prepares/s, CPU per prepare and worker render per prepare.
- **render-only limit**: the render work alone in one thread: each
  trajectory replayed by one session at a time (no contention for the GIL),
  ``prepares / sum(render_seconds)``: the prepares per second one core
  would sustain doing nothing but the worker's render.
- **naive**: the program one would write without turnloom: each session keeps
  its messages (the last 32 turns), and for each turn renders its whole
  history through the same gateway in ``to_thread`` (anyio's, bounded to 16
  threads by a capacity limiter; ``asyncio.to_thread`` on asyncio), later
  model calls of a turn rendering their new messages on the loop.

Ratios: turnloom / render-only limit (goal >= 0.5) and turnloom / naive
(goal >= 1.5), and CPU per prepare / render per prepare alone (goal <= 3).

Usage: python scripts/bench_loadtest.py [--turns M] [--sessions N ...]
"""

from __future__ import annotations

import argparse
import time

import anyio
import anyio.to_thread

from turnloom.context.gateway import GatewayType, get_gateway
from turnloom.context.message import Message
from turnloom.tools.loadtest import LoadtestReport, loadtest
from turnloom.tools.trajectories import Trajectory, builtin_trajectories, check_trajectory
from turnloom.tools.transcript import Reply, Turn, walk

_KEEP_TURNS = 32  # turnloom's default history limit


async def _naive(scripts: list[list[Message]], sessions: int, turns: int) -> tuple[int, float]:
    """Run the naive program; return its turn renders and wall seconds."""
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

    begin = time.perf_counter()
    async with anyio.create_task_group() as group:
        for number in range(sessions):
            group.start_soon(session, number)
    return done[0], time.perf_counter() - begin


async def _render_only(trajectories: list[Trajectory], turns: int) -> float:
    """Prepares per second of render work alone (one session at a time)."""
    prepares, seconds = 0, 0.0
    for trajectory in trajectories:
        report = await loadtest([trajectory], sessions=1, turns=turns)
        prepares += report.prepares
        seconds += report.render_seconds
    return prepares / seconds


async def _both(
    trajectories: list[Trajectory], sessions: int, turns: int
) -> tuple[LoadtestReport, float, float]:
    limit = await _render_only(trajectories, turns)
    report = await loadtest(trajectories, sessions=sessions, turns=turns)
    scripts = []
    for trajectory in trajectories:
        checked = check_trajectory(trajectory)
        assert isinstance(checked, list)
        scripts.append(checked)
    renders, seconds = await _naive(scripts, sessions, turns)
    return report, limit, renders / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--sessions", type=int, nargs="+", default=[100, 1000])
    args = parser.parse_args()
    trajectories = builtin_trajectories(64, turns=(args.turns, args.turns))
    print(
        f"{'backend':<8}{'sessions':>9}{'turnloom/s':>12}{'render-only/s':>15}{'ratio':>7}"
        f"{'naive/s':>10}{'ratio':>7}{'cpu/prep us':>13}{'render/prep us':>16}{'ratio':>7}"
        f"{'p99 ms':>8}{'lag p99':>9}{'lag max':>9}"
    )
    for backend in ("asyncio", "trio"):
        for sessions in args.sessions:
            report, limit, naive = anyio.run(
                _both, trajectories, sessions, args.turns, backend=backend
            )
            cpu = report.cpu_seconds / report.prepares
            render = 1 / limit
            ours = report.prepares_per_second
            print(
                f"{backend:<8}{sessions:>9}{ours:>12.0f}{limit:>15.0f}{ours / limit:>6.2f}x"
                f"{naive:>10.0f}{ours / naive:>6.2f}x{cpu * 1e6:>13.0f}{render * 1e6:>16.0f}"
                f"{cpu / render:>6.1f}x{report.prepare_p99_ms:>8.1f}"
                f"{report.loop_lag_p99_ms:>9.1f}{report.loop_lag_max_ms:>9.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()

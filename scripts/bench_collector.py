"""Render and collection cost of a CoopContext at 10, 100, 1,000 and 10,000 areas.

Prints, for each scenario, the best time of one ``render()`` and two ratios
measured in this run: the time relative to the 10-area case, and the time per
area relative to the 10-area case (about 1.0 means linear in the number of
areas; a quadratic cost would grow tenfold per row).

Scenarios (OpenAI Chat gateway, one short user message per area render):

* ``pass``: every area is retained and yielded and renders once per pass,
  so one render() observes and renders n areas (steady state, third pass).
* ``safe point``: an exclusive area holds the cursor; render() pays only the
  safe-point work over n areas (read every life_state, plan collection).
* ``collect n comps``: n retired areas with disjoint ranges (n components);
  one render() promotes, gc's, detaches and removes them all.
* ``collect 1 comp``: n retired areas whose ranges chain into one component.

Usage: ``python scripts/bench_collector.py [--sizes 10,100,1000,10000]``
"""

from __future__ import annotations

import argparse
import functools
import gc
import time
from collections.abc import Callable, Sequence

from turnloom.context import (
    AreaFlowState,
    AreaLifeState,
    Context,
    CoopContext,
    GatewayType,
    Message,
    NativeContent,
    Role,
)


class BenchArea:
    """Renders one message per render until told to stop; retires on request."""

    __slots__ = ("flow_state", "life_state", "message", "renders_left")

    def __init__(self, index: int, renders: int, flow: AreaFlowState) -> None:
        self.life_state = AreaLifeState.retain
        self.flow_state = flow
        self.message = Message(role=Role.user, content=f"area {index} note")
        self.renders_left = renders

    def observe(self, context: Sequence[NativeContent]) -> None:
        del context

    def render(self) -> list[Message]:
        if self.renders_left <= 0:
            return []
        self.renders_left -= 1
        return [self.message]

    def promote(self) -> tuple[Message, ...]:
        return ()

    def gc_prologue(self) -> None:
        pass


def build(n: int, renders: int, passes: int) -> tuple[CoopContext, list[BenchArea]]:
    coop = CoopContext(Context(GatewayType.openai_chat))
    areas = [BenchArea(i, renders, AreaFlowState.yielded) for i in range(n)]
    for area in areas:
        coop.register(area)
    for _ in range(passes):
        coop.render()
    return coop, areas


def timed(setup: Callable[[], CoopContext], repeats: int) -> float:
    """Best wall time of one render() over ``repeats`` fresh setups, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        coop = setup()
        gc.collect()  # start each measurement with no pending cyclic-GC debt from setup
        start = time.perf_counter()
        coop.render()
        best = min(best, time.perf_counter() - start)
    return best


def scenario_pass(n: int) -> CoopContext:
    coop, _ = build(n, renders=10**9, passes=2)
    return coop


def scenario_safe_point(n: int) -> CoopContext:
    coop, _ = build(n, renders=1, passes=1)
    holder = BenchArea(-1, 10**9, AreaFlowState.exclusive)
    coop.register(holder)
    coop.render()  # the pass reaches the holder, which keeps the cursor
    return coop


def scenario_collect_components(n: int) -> CoopContext:
    coop, areas = build(n, renders=1, passes=1)
    for area in areas:
        area.life_state = AreaLifeState.retired
    return coop


def scenario_collect_chain(n: int) -> CoopContext:
    coop, areas = build(n, renders=2, passes=2)  # ranges [i, n + i]: one component
    for area in areas:
        area.life_state = AreaLifeState.retired
    return coop


SCENARIOS: dict[str, Callable[[int], CoopContext]] = {
    "pass": scenario_pass,
    "safe point": scenario_safe_point,
    "collect n comps": scenario_collect_components,
    "collect 1 comp": scenario_collect_chain,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000,10000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{'scenario':<16} {'areas':>6} {'best ms':>10} {'x time':>9} {'x per area':>11}")
    for name, make in SCENARIOS.items():
        base: float | None = None
        base_n = sizes[0]
        for n in sizes:
            repeats = max(3, min(50, 20_000 // n))
            seconds = timed(functools.partial(make, n), repeats)
            if base is None:
                base = seconds
            ratio = seconds / base
            per_area = ratio / (n / base_n)
            print(f"{name:<16} {n:>6} {seconds * 1e3:>10.3f} {ratio:>9.1f} {per_area:>11.2f}")
        # sanity: the collection scenarios really reclaimed everything
        if name.startswith("collect"):
            coop = make(sizes[0])
            coop.render()
            assert len(coop) == 0 and len(coop.context) == 0


if __name__ == "__main__":
    main()

"""The Foundation's collector policy keeps memory bounded with a host that makes cyclic garbage.

Invariants (DESIGN, performance model: the Foundation owns a collector policy
whose safety a soak test shows; ``scripts/soak_collector.py`` is the long
version): the open freezes what the process holds without collecting it, so
the first step walks only what was allocated since; a step collects
everything not frozen before it freezes, so garbage a host makes between
steps is never frozen; cyclic garbage of objects that were frozen (alive, or
already garbage at the open) stays exactly until the next thorough step, which
allocated blocks grown past ``regrowth`` times what the live state explains
trigger; growth the Foundation's live state explains (its contexts and history
items, each at the fewest blocks per unit seen since the last thorough step)
triggers none; a costly step brings
the next look nearer; closing the Foundation unfreezes, so nothing it froze
outlives it. Counts are exact: every host object carries a ``Junk`` whose
live instances are counted.
"""

from __future__ import annotations

import gc
import math
import sys
import threading
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.runtime.helpers import assistant, user
from turnloom.errors import InputError
from turnloom.runtime import (
    CollectorPolicy,
    ContextPrepareRequest,
    Foundation,
    TurnSnapshot,
    _collector,
)
from turnloom.runtime._collector import FrozenCollector

pytestmark = pytest.mark.anyio

_SESSIONS = 3
_ROUNDS = 12
_NEVER = 3600.0  # an interval no test reaches: the test takes the steps itself
# Objects each SessionState holds (lists, one allocated block each): the
# growth of the allocated blocks per round (3 states of 20,000) dwarfs what the
# rest of the process allocates or frees between two steps, and what the
# round's 6 new history items explain, so the policy's regrowth check sees the
# test's own growth, not the noise of a full run.
_TRACKED_PER_STATE = 20_000


class Junk:
    live = 0

    def __init__(self) -> None:
        Junk.live += 1

    def __del__(self) -> None:
        Junk.live -= 1


class SessionState:
    """A host's per-session state: cyclic, replaced every round, holding
    ``_TRACKED_PER_STATE`` tracked objects."""

    def __init__(self) -> None:
        self.junk = Junk()
        self.tracked: list[list[int]] = [[] for _ in range(_TRACKED_PER_STATE)]
        self.me = self


def _cyclic_garbage() -> None:
    def closure() -> Any:
        return closure, junk

    junk = Junk()
    kept: dict[str, Any] = {"junk": Junk()}
    kept["self"] = kept
    try:
        raise ValueError(junk)
    except ValueError as exc:
        kept["error"] = exc
    closure()


@pytest.fixture(autouse=True)
def _no_junk_left() -> Any:
    gc.collect()
    Junk.live = 0
    yield
    gc.collect()
    assert Junk.live == 0
    assert gc.get_freeze_count() == 0


async def _soak(policy: CollectorPolicy, rounds: int = _ROUNDS) -> list[tuple[bool, int, int]]:
    """``rounds`` rounds of one turn per session; a step after each. Returns, per step:
    (thorough, live junk after it, states the host dropped since the last thorough step)."""
    seen: list[tuple[bool, int, int]] = []
    async with Foundation(collector=policy) as foundation:
        manager = foundation.manager
        collector = foundation.collector
        assert collector is not None
        states = [SessionState() for _ in range(_SESSIONS)]
        dropped = 0
        collector.step()  # after warm-up: the first step, a plain one
        seen.append((False, Junk.live, 0))
        for round_ in range(rounds):
            for number in range(_SESSIONS):
                states[number] = SessionState()  # the old one was frozen alive
                dropped += 1
                context_id, turn_id = f"s{number}", f"t{round_}"
                manager.accept_turn(
                    TurnSnapshot(context_id=context_id, turn_id=turn_id, input=(user("hi"),))
                )
                request = ContextPrepareRequest(context_id=context_id, turn_id=turn_id)
                await manager.prepare(request)
                _cyclic_garbage()
                async with manager.invocation(context_id, turn_id) as invocation:
                    invocation.record([assistant(f"answer {round_}")])
            before = collector.statistics().thorough_steps
            collector.step()
            thorough = collector.statistics().thorough_steps > before
            if thorough:
                dropped = 0
            seen.append((thorough, Junk.live, dropped))
        assert gc.get_freeze_count() > 0
        del states
    assert gc.get_freeze_count() == 0  # the close unfroze everything
    return seen


async def test_garbage_made_between_steps_is_never_frozen() -> None:
    """Without thorough steps (regrowth=inf), every step leaves exactly the live
    states plus the states dropped after being frozen: no per-turn garbage."""
    seen = await _soak(CollectorPolicy(interval=_NEVER, regrowth=math.inf))
    assert [thorough for thorough, _, _ in seen] == [False] * (_ROUNDS + 1)
    # What the host gives up: each dropped state stays until the close.
    assert [live for _, live, _ in seen] == [
        _SESSIONS + _SESSIONS * round_ for round_ in range(_ROUNDS + 1)
    ]


async def test_a_regrown_frozen_set_makes_the_next_step_thorough_and_reclaims_it() -> None:
    """With any growth past regrowth, a thorough step follows each plain one and
    reclaims the frozen cyclic garbage.

    The sequence is exact because each round's growth of the allocated blocks
    (the dropped states' ``_TRACKED_PER_STATE`` objects, frozen alive) dwarfs
    incidental changes and what the round's new history items explain; the
    first step (before any context: nothing explains growth) and a thorough
    one take the base, so the step after either is plain. (Mutant tried:
    counting a step's own blocks per unit before its decision makes round 1 plain.)
    """
    # 6 rounds, not 12: in a full run each thorough step collects the whole process.
    seen = await _soak(CollectorPolicy(interval=_NEVER, regrowth=1e-9), 6)
    assert [thorough for thorough, _, _ in seen] == [False, False] + [True, False] * 2 + [True]
    for _, live, dropped in seen:
        assert live == _SESSIONS + dropped  # exactly the live states and the frozen dropped ones
    # A thorough step reclaims everything dropped: only the live states stay.
    assert [live for thorough, live, _ in seen if thorough] == [_SESSIONS] * 3
    assert max(live for _, live, _ in seen) == 2 * _SESSIONS


async def test_the_foundation_steps_on_its_own_once_the_process_allocated() -> None:
    """The policy's task looks every interval and steps when young collections happened."""
    policy = CollectorPolicy(interval=0.01, young_collections=1)
    async with Foundation(collector=policy) as foundation:
        collector = foundation.collector
        assert collector is not None
        with anyio.fail_after(30):
            while collector.statistics().steps == 0:
                _cyclic_garbage()
                junk = [[Junk()] for _ in range(1000)]  # tracked allocations
                del junk
                await anyio.sleep(0.01)
        stats = collector.statistics()
        assert stats.thorough_steps == 0 and gc.get_freeze_count() > 0
        assert stats.blocks > 0 and stats.allowed_blocks >= stats.blocks and stats.live == (0, 0)
    assert gc.get_freeze_count() == 0


async def test_no_policy_freezes_nothing() -> None:
    async with Foundation(collector=None) as foundation:
        assert foundation.collector is None
        foundation.manager.accept_turn(
            TurnSnapshot(context_id="c", turn_id="t", input=(user("hi"),))
        )
        await foundation.manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t"))
        assert gc.get_freeze_count() == 0


@pytest.mark.parametrize(
    "policy",
    [
        "on",
        1.0,
        CollectorPolicy,
    ],
)
def test_a_collector_that_is_not_a_policy_is_refused(policy: object) -> None:
    with pytest.raises(InputError, match="collector must be a CollectorPolicy or None"):
        Foundation(collector=policy)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("interval", 0),
        ("interval", -1.0),
        ("interval", math.inf),
        ("interval", math.nan),
        ("interval", "1"),
        ("young_collections", 0),
        ("young_collections", True),
        ("young_collections", 1.5),
        ("step_cpu", 0),
        ("step_cpu", math.inf),
        ("step_cpu", True),
        ("regrowth", 0),
        ("regrowth", math.nan),
        ("regrowth", -0.5),
    ],
)
def test_a_policy_out_of_range_is_refused_by_field(field: str, value: object) -> None:
    with pytest.raises(InputError, match=f"CollectorPolicy.{field} must be"):
        CollectorPolicy(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_foundations_on_two_threads_share_the_collector_and_a_close_frees_the_others_garbage(
    backend: str,
) -> None:
    """Two Foundations, each on its own thread and loop (LiveKit's thread executor):
    one's step freezes the other's objects too (the collector is process-wide);
    when one closes it unfreezes everything, so the other's next step reclaims
    cyclic garbage the first froze, and freezes what lives again. Nothing frozen
    outlives the last close."""
    policy = CollectorPolicy(interval=_NEVER, regrowth=math.inf)  # no thorough step
    a_opened, a_froze, b_dropped, a_closed = (threading.Event() for _ in range(4))
    seen: dict[str, object] = {}

    async def wait(event: threading.Event) -> None:
        await anyio.to_thread.run_sync(event.wait, 30)
        assert event.is_set()

    async def first() -> None:
        async with Foundation(collector=policy) as foundation:
            collector = foundation.collector
            assert collector is not None
            a_opened.set()
            await wait(b_dropped)  # B made its state and dropped it
            collector.step()  # collects B's dropped state: never frozen
            seen["after A's step"] = Junk.live
            a_froze.set()
            await wait(b_dropped_again)
        a_closed.set()

    b_dropped_again = threading.Event()

    async def second() -> None:
        async with Foundation(collector=policy) as foundation:
            collector = foundation.collector
            assert collector is not None
            # After A's open, which would freeze B's garbage made before it.
            await wait(a_opened)
            state: SessionState | None = SessionState()
            state = SessionState()  # the first is cyclic garbage before any step
            b_dropped.set()
            await wait(a_froze)
            # A's step froze this state while it was alive: dropped, it stays.
            state = None
            gc.collect()
            seen["frozen garbage kept"] = Junk.live  # the state A froze alive
            b_dropped_again.set()
            await wait(a_closed)  # A's close unfroze the process
            seen["frozen after A's close"] = gc.get_freeze_count()
            collector.step()
            seen["after B's step"] = Junk.live
            seen["B froze again"] = gc.get_freeze_count() > 0
            del state
        seen["frozen after both closed"] = gc.get_freeze_count()

    failures: list[BaseException] = []

    def run(program: Any) -> None:
        try:
            anyio.run(program, backend=backend)
        except BaseException as exc:  # raised below, in the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures
    assert seen == {
        "after A's step": 1,  # B's live state; its first, dropped, was collected
        "frozen garbage kept": 1,
        "frozen after A's close": 0,
        "after B's step": 0,
        "B froze again": True,
        "frozen after both closed": 0,
    }


class _Process:
    """The process as the policy sees it: allocated blocks, young collections, a
    CPU clock and the collector's calls, each scripted by the test."""

    def __init__(self) -> None:
        self.blocks = 1_000
        self.young = 0
        self.cpu = 0.0  # CPU seconds the next step takes
        self.clock = 0.0
        self.now = 0.0  # the monotonic clock
        self.calls: list[str] = []

    # gc
    def collect(self) -> None:
        self.calls.append("collect")
        self.clock += self.cpu

    def freeze(self) -> None:
        self.calls.append("freeze")

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")

    def get_stats(self) -> list[dict[str, int]]:
        return [{"collections": self.young}]

    # time
    def thread_time(self) -> float:
        return self.clock

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def process(monkeypatch: pytest.MonkeyPatch) -> _Process:
    scripted = _Process()
    monkeypatch.setattr(_collector, "gc", scripted)
    monkeypatch.setattr(_collector, "time", scripted)
    monkeypatch.setattr(_collector, "_allocated", lambda: scripted.blocks)
    return scripted


def _step(
    collector: FrozenCollector,
    process: _Process,
    live: list[tuple[int, int]],
    blocks: int,
    contexts: int,
    items: int,
) -> tuple[bool, int]:
    """One step at ``blocks`` allocated and the live state: (was it thorough, allowed blocks)."""
    process.blocks = blocks
    live[0] = (contexts, items)
    process.calls.clear()
    collector.step()
    assert process.calls[-2:] == ["collect", "freeze"]
    return process.calls[0] == "unfreeze", collector.statistics().allowed_blocks


def _collector_of(policy: CollectorPolicy) -> tuple[FrozenCollector, list[tuple[int, int]]]:
    live = [(0, 0)]
    return FrozenCollector(policy, lambda: live[0]), live


def test_growth_the_live_state_explains_makes_no_thorough_step(process: _Process) -> None:
    """Allowed blocks: origin + (1 + regrowth) x the largest of the base's growth, the
    fewest blocks per context seen since the last thorough step x the contexts now, and
    the same per history item; a step past it makes the next thorough, which takes a new
    base (exact values, origin 1,000). Mutants tried: ignoring the live state (the old
    rule) fails at the second step; keeping the blocks per unit across a thorough step
    fails at the last."""
    collector, live = _collector_of(CollectorPolicy(interval=_NEVER))
    # The first step takes the base: 1,000 blocks of growth, 100 per context, 10 per item.
    assert _step(collector, process, live, 2_000, 10, 100) == (False, 1_000 + 2 * 1_000)
    # Sessions arrive: 4x the contexts and items, 4x the growth: explained, plain.
    assert _step(collector, process, live, 5_000, 40, 400) == (False, 1_000 + 2 * 4_000)
    # Then growth without live state: past 2 x 4,000, so the next step is thorough.
    assert _step(collector, process, live, 9_500, 40, 400) == (False, 9_000)
    assert not collector.statistics().thorough_steps
    # The thorough step's base: 3,000 of growth, 300 per context, 30 per item.
    assert _step(collector, process, live, 4_000, 10, 100) == (True, 1_000 + 2 * 3_000)
    # 4x the live state at the new base's cost: explained (not at the old 100 and 10).
    assert _step(collector, process, live, 13_000, 40, 400) == (False, 1_000 + 2 * 12_000)
    stats = collector.statistics()
    assert (stats.steps, stats.thorough_steps, stats.blocks, stats.live) == (
        5,
        1,
        13_000,
        (40, 400),
    )


def test_contexts_then_items_each_explain_their_growth(process: _Process) -> None:
    """Sessions arriving (contexts) then histories growing (items), at 100 blocks per
    context and 5 per item: each kind's fewest blocks per unit explains its own growth
    (mutants tried: one rate for contexts plus items, and the base's rates kept
    instead of the fewest seen, each fail)."""
    collector, live = _collector_of(CollectorPolicy(interval=_NEVER))
    assert _step(collector, process, live, 1_000 + 1_050, 10, 10) == (False, 1_000 + 2 * 1_050)
    assert _step(collector, process, live, 1_000 + 10_500, 100, 100) == (False, 22_000)
    assert _step(collector, process, live, 1_000 + 25_000, 100, 3_000) == (False, 631_000)
    # 25,000 blocks for 3,000 items: 25/3 per item explains the next 3,000.
    assert _step(collector, process, live, 1_000 + 40_000, 100, 6_000) == (False, 101_000)
    # Now 20/3 per item: 2 x 40,000 allowed, and growth past it is garbage.
    assert _step(collector, process, live, 1_000 + 90_000, 100, 6_000) == (False, 81_000)
    assert _step(collector, process, live, 1_000 + 40_000, 100, 6_000)[0]


@settings(max_examples=200, deadline=None)
@given(
    per_context=st.integers(0, 1_000),
    per_item=st.integers(0, 100),
    first=st.tuples(st.integers(1, 10_000), st.integers(1, 1_000_000)),
    states=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 1_000_000)), max_size=30),
)
def test_a_cost_linear_in_contexts_and_items_never_makes_a_thorough_step(
    per_context: int, per_item: int, first: tuple[int, int], states: list[tuple[int, int]]
) -> None:
    """With regrowth 1 (the default), memory that is any fixed cost per context plus one
    per item, over any sequence of live states (growing or shrinking) after a first step
    that saw both, never looks like garbage: 2 x max(blocks per context x contexts,
    blocks per item x items) is at least their sum, each rate being at least its kind's
    cost. (Before a kind was ever seen, its growth is unexplained: see the soak test.)"""
    process = _Process()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_collector, "gc", process)
        patch.setattr(_collector, "time", process)
        patch.setattr(_collector, "_allocated", lambda: process.blocks)
        collector, live = _collector_of(CollectorPolicy(interval=_NEVER))
        for contexts, items in [first, *states]:
            blocks = 1_000 + per_context * contexts + per_item * items
            assert _step(collector, process, live, blocks, contexts, items)[1] >= blocks
        assert collector.statistics().thorough_steps == 0


def test_fewer_units_never_lower_the_allowance_below_the_base(process: _Process) -> None:
    """A live state that shrinks (evicted items, removed contexts) leaves the allowance
    at the base's (1 + regrowth) x growth; later growth is explained at the fewest
    blocks per unit seen, not the latest (mutant tried: the latest rates fail the third
    step)."""
    collector, live = _collector_of(CollectorPolicy(interval=_NEVER))
    assert _step(collector, process, live, 3_000, 100, 100) == (False, 1_000 + 2 * 2_000)
    assert _step(collector, process, live, 2_500, 10, 10) == (False, 1_000 + 2 * 2_000)
    # 10 contexts held 1,500 blocks of growth: 150 each, more than the 20 seen first.
    assert _step(collector, process, live, 5_000, 200, 200) == (False, 1_000 + 2 * 20 * 200)
    assert _step(collector, process, live, 9_100, 200, 200) == (False, 9_000)
    assert _step(collector, process, live, 4_000, 200, 200)[0]


def test_without_a_live_state_the_base_alone_decides(process: _Process) -> None:
    """A collector without a live measure (or before any context) allows (1 + regrowth)
    times the base's growth; regrowth=inf allows anything."""
    collector = FrozenCollector(CollectorPolicy(interval=_NEVER, regrowth=0.5))
    live = [(0, 0)]
    assert _step(collector, process, live, 3_000, 0, 0) == (False, 1_000 + 3_000)
    assert _step(collector, process, live, 4_001, 0, 0) == (False, 4_000)
    assert _step(collector, process, live, 3_000, 0, 0)[0]
    never = FrozenCollector(CollectorPolicy(interval=_NEVER, regrowth=math.inf))
    assert _step(never, process, live, 3_000, 0, 0) == (False, sys.maxsize)
    assert _step(never, process, live, 10**12, 0, 0) == (False, sys.maxsize)


def test_a_costly_step_brings_the_next_look_nearer(process: _Process) -> None:
    """The next wait is the time since the last step's start times ``step_cpu`` over the
    step's CPU, between a 16th of the interval and the interval and at most twice the
    wait before; a look nearer than the interval steps without
    young collections; a thorough step's cost leaves the pace alone (mutants tried: a
    constant wait, pacing on thorough steps, the wait scaled from the interval instead
    of the time since the last step, and no cap on the growth of the wait, each fail)."""
    # Powers of two: the seconds and their ratios are exact.
    policy = CollectorPolicy(interval=1.0, young_collections=10, step_cpu=1 / 256)
    collector = FrozenCollector(policy)
    live = [(0, 0)]
    assert collector.wait == 1 / 16  # the first look
    process.now, process.cpu = 1 / 8, 1 / 512  # 2x the wait's worth: at most twice the wait
    _step(collector, process, live, 2_000, 0, 0)
    assert collector.wait == 1 / 8
    process.now, process.cpu = 1.125, 1 / 64  # a second since the last step: 4x step_cpu
    _step(collector, process, live, 2_000, 0, 0)
    assert collector.wait == 0.25
    assert collector.due()  # a nearer look needs no young collection
    process.now, process.cpu = 1.375, 1 / 128  # a quarter second: 2x step_cpu
    _step(collector, process, live, 2_000, 0, 0)
    assert collector.wait == 0.125
    process.now, process.cpu = 1.5, 1 / 2048  # an 8th of step_cpu: at most twice the wait
    _step(collector, process, live, 2_000, 0, 0)
    assert collector.wait == 0.25
    process.now, process.cpu = 1.75, 1.0
    _step(collector, process, live, 10**9, 0, 0)  # growth: the next step is thorough
    assert collector.wait == 1 / 16
    process.now, process.cpu = 2.125, 1 / 1024
    assert _step(collector, process, live, 2_000, 0, 0)[0]
    assert collector.wait == 1 / 16  # the thorough step's cost did not pace
    for now, wait in ((2.625, 1 / 8), (3.625, 1 / 4), (4.625, 1 / 2), (5.625, 1.0)):
        process.now = now
        _step(collector, process, live, 2_000, 0, 0)
        assert collector.wait == wait  # cheap steps: back to the interval, doubling
    process.young += 9
    assert not collector.due()  # and to young collections
    process.young += 1
    assert collector.due()
    stats = collector.statistics()
    assert (stats.step_cpu_max_seconds, stats.thorough_cpu_max_seconds) == (1.0, 1 / 1024)


def test_a_busy_process_steps_at_the_interval_without_young_collections(
    process: _Process,
) -> None:
    """A look at the interval steps without ``young_collections`` young collections when,
    at the last plain step's CPU per second since the step before, a step now would cost
    at least half of ``step_cpu``: young collections count net allocations (frees of
    frozen objects offset them), so waiting for them lets a busy process's step walk
    several intervals' allocations. An idle process still waits for them; a thorough
    step's cost says nothing of the pace (mutants tried: no busy rule fails the second
    ``due``; the pace taken from a thorough step fails the last)."""
    policy = CollectorPolicy(interval=1.0, young_collections=10, step_cpu=1 / 256)
    collector = FrozenCollector(policy)
    live = [(0, 0)]
    process.cpu = 1 / 8192  # cheap steps: the wait doubles from the first look's
    for now, wait in ((1 / 8, 1 / 8), (1 / 4, 1 / 4), (1 / 2, 1 / 2), (1.0, 1.0)):
        process.now = now
        _step(collector, process, live, 2_000, 0, 0)
        assert collector.wait == wait
    process.now, process.cpu = 2.0, 1 / 256  # one step_cpu in a second: the interval
    _step(collector, process, live, 2_000, 0, 0)
    assert collector.wait == 1.0
    process.now = 2.25  # a step now would cost a quarter of step_cpu
    assert not collector.due()
    process.now = 2.5  # half of it: due, with no young collection
    assert collector.due()
    process.cpu = 1 / 8192  # an idle second: 1/32 of step_cpu
    process.now = 3.5
    _step(collector, process, live, 2_000, 0, 0)
    process.now = 4.5
    assert not collector.due()  # idle: young collections decide
    process.young += 10
    assert collector.due()
    process.now = 5.5
    _step(collector, process, live, 10**9, 0, 0)  # growth: the next step is thorough
    process.now, process.cpu = 6.5, 1.0
    assert _step(collector, process, live, 2_000, 0, 0)[0]  # thorough, and costly
    process.now = 7.5
    assert not collector.due()  # the busy rule kept the last plain step's pace


def test_the_first_step_comes_early_once_a_context_and_an_item_are_held(
    process: _Process,
) -> None:
    """The first look comes a 16th of the interval after the open, and every 16th of it
    until the live state holds a context and an item: then it steps (no young
    collection needed), so a ramp-up is walked in small steps and the first step's base
    and rates explain both kinds of growth. Without a live context and item by the
    interval, the looks go back to the interval and young collections decide, as after
    an idle step (mutants tried: a first look at the interval, an early step without a
    live state, a context alone, a wait left at a 16th, each fail)."""
    policy = CollectorPolicy(interval=1.0, young_collections=10, step_cpu=1 / 256)
    collector, live = _collector_of(policy)
    assert collector.wait == 1 / 16
    for now, state in ((1 / 16, (0, 0)), (1 / 8, (1, 0)), (3 / 16, (0, 1))):
        process.now, live[0] = now, state
        assert not collector.look()
        assert collector.wait == 1 / 16 and not collector.statistics().steps
    process.now, live[0] = 1 / 4, (1, 1)
    assert collector.look()  # no young collection: the live state decides
    assert collector.statistics().live == (1, 1)
    late, _ = _collector_of(policy)  # opened at 1/4, no live state by its interval
    process.now = 1.25  # a second since its open
    process.young += 9
    assert not late.look() and late.wait == 1.0
    process.young += 1
    assert late.look() and late.statistics().steps == 1


def test_a_ramp_up_after_an_early_first_step_makes_no_thorough_step(process: _Process) -> None:
    """Sessions that arrive over many steps at a fixed cost per context (100 blocks) and
    per item (20), on top of the Foundation's own 1,000 blocks, make no thorough step
    when the first step waits for a live context and item (mutant tried: an early first
    step with nothing live takes a base the ramp-up outgrows before any step saw a
    context: thorough)."""
    collector, live = _collector_of(CollectorPolicy(interval=1.0))
    process.now, process.cpu, live[0] = 1 / 16, 1.0, (0, 0)  # costly steps: looks a 16th apart
    assert not collector.look()
    for step, contexts in enumerate((10, 100, 1_000, 5_000, 5_000)):
        process.now += 1 / 16
        items = 3 * contexts
        process.blocks = 1_000 + 1_000 + 100 * contexts + 20 * items
        live[0] = (contexts, items)
        assert collector.look()
        assert collector.statistics().steps == step + 1
    assert collector.statistics().thorough_steps == 0
    # 801,000 blocks of growth at 5,000 contexts: the fewest per context and item seen.
    assert collector.statistics().allowed_blocks == 1_000 + 2 * 801_000


async def test_the_foundations_live_units_are_its_contexts_and_their_items() -> None:
    """The Foundation gives its policy contexts held plus their history items (mutant
    tried: contexts alone fails)."""
    async with Foundation(collector=CollectorPolicy(interval=_NEVER)) as foundation:
        manager = foundation.manager
        collector = foundation.collector
        assert collector is not None
        for number in range(2):
            manager.accept_turn(
                TurnSnapshot(context_id=f"c{number}", turn_id="t", input=(user("hi"),))
            )
            manager.record(f"c{number}", "t", [assistant("a"), assistant("b")])
        collector.step()
        stats = manager.statistics()
        assert (stats.contexts, stats.history.items) == (2, 6)
        assert collector.statistics().live == (2, 6)


async def test_a_closed_collector_never_freezes_again() -> None:
    """Nothing frozen outlives the close: a look or a step after it freezes nothing.

    The Foundation cancels the collector's task, then closes it; on asyncio
    anyio delivers that cancellation at the task's next await when its sleep
    had already ended, so the task's look runs once more after the close.
    """
    collector = FrozenCollector(CollectorPolicy(interval=0.001, young_collections=1))
    try:
        collector.step()
        assert gc.get_freeze_count() > 0
        collector.close()
        assert gc.get_freeze_count() == 0
        collector.step()
        assert gc.get_freeze_count() == 0 and collector.statistics().steps == 1
        with anyio.fail_after(10):
            await collector.run()  # its first look after the close returns
        assert gc.get_freeze_count() == 0 and collector.statistics().steps == 1
    finally:
        gc.unfreeze()


class Marker:
    """A tracked object whose instances a test finds in the collector's generations."""


def _in_generations() -> int:
    """Markers a full collection would visit now (every generation, not the frozen one)."""
    return sum(1 for found in gc.get_objects() if type(found) is Marker)


def test_the_open_freezes_what_the_process_holds_without_collecting(process: _Process) -> None:
    """Constructing the collector (the Foundation's open) calls ``gc.freeze()`` and
    nothing else: no collection walks the heap at the open (mutant tried: a collection
    before the freeze fails)."""
    _collector_of(CollectorPolicy(interval=_NEVER))
    assert process.calls == ["freeze"]


def test_the_first_step_walks_only_what_was_allocated_since_the_open() -> None:
    """Objects alive at the open are frozen by it: a full collection (the first step's)
    visits none of them, only what was allocated since; the step then freezes those too
    (mutant tried: no freeze at the open leaves the 1,000 markers in the generations)."""
    before = [Marker() for _ in range(1_000)]
    assert _in_generations() == 1_000
    frozen = gc.get_freeze_count()
    collector = FrozenCollector(CollectorPolicy(interval=_NEVER))
    try:
        assert gc.get_freeze_count() >= frozen + 1_000
        assert _in_generations() == 0
        after = [Marker() for _ in range(100)]
        assert _in_generations() == 100  # what the first step's collection walks
        collector.step()
        assert _in_generations() == 0
        assert collector.statistics().steps == 1
    finally:
        collector.close()
    assert gc.get_freeze_count() == 0
    assert _in_generations() == 1_100
    del before, after


def test_a_collector_closed_before_any_step_unfreezes_what_the_open_froze() -> None:
    """The open's freeze counts as the collector's own: a close with no step unfreezes
    it (mutant tried: the open not marking what it froze leaves it frozen)."""
    collector = FrozenCollector(CollectorPolicy(interval=_NEVER))
    try:
        assert gc.get_freeze_count() > 0
        collector.close()
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()


async def test_garbage_made_before_the_open_stays_until_a_thorough_step() -> None:
    """Cyclic garbage the process made before the Foundation opened is frozen by the
    open, uncollected: no plain step and no ``gc.collect()`` reclaims it, the first
    thorough step does (mutant tried: a thorough step without an unfreeze keeps it).
    Its blocks are in the origin, so it makes no step thorough by itself: the thorough
    step here comes from the host's growth past regrowth=1e-9."""
    _cyclic_garbage()  # two Junk in cycles, unreachable
    assert Junk.live == 2
    async with Foundation(collector=CollectorPolicy(interval=_NEVER, regrowth=1e-9)) as foundation:
        collector = foundation.collector
        assert collector is not None
        gc.collect()
        assert Junk.live == 2  # frozen at the open
        collector.step()  # the first: takes the base
        assert (Junk.live, collector.statistics().thorough_steps) == (2, 0)
        state = SessionState()  # 20,000 blocks alive: growth past the base
        collector.step()
        assert (Junk.live, collector.statistics().thorough_steps) == (3, 0)
        collector.step()  # thorough: unfreezes and collects everything
        assert (Junk.live, collector.statistics().thorough_steps) == (1, 1)
        del state


async def test_garbage_made_before_the_open_is_collectable_after_the_close() -> None:
    """Without a thorough step (regrowth=inf), cyclic garbage from before the open stays
    frozen while the Foundation is open and is collectable once it closed."""
    _cyclic_garbage()
    async with Foundation(
        collector=CollectorPolicy(interval=_NEVER, regrowth=math.inf)
    ) as foundation:
        collector = foundation.collector
        assert collector is not None
        for _ in range(3):
            collector.step()
            gc.collect()
            assert Junk.live == 2
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert Junk.live == 0

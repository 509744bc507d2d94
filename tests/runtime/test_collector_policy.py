"""The Foundation's collector policy keeps memory bounded with a host that makes cyclic garbage.

Invariants (DESIGN, performance model: the Foundation owns a collector policy
whose safety a soak test shows; ``scripts/soak_collector.py`` is the long
version): a step collects everything not frozen before it freezes, so garbage
a host makes between steps is never frozen; cyclic garbage of objects that
were frozen while alive stays exactly until the next thorough step, which a
frozen set grown past ``regrowth`` triggers; closing the Foundation unfreezes,
so nothing it froze outlives it. Counts are exact: every host object carries
a ``Junk`` whose live instances are counted.
"""

from __future__ import annotations

import gc
import math
import re
import threading
from typing import Any

import anyio
import anyio.lowlevel
import pytest

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
# Tracked objects each SessionState holds (lists, each one gc-tracked): the
# frozen set's growth per round (3 states of ~2,000 objects) dwarfs what the
# rest of the process changes in it between two steps (frozen objects freed by
# reference counting shrink it), so the policy's regrowth check sees the
# test's own growth, not the noise of a full run.
_TRACKED_PER_STATE = 2_000


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
    """With every frozen-set read (check_every=1) and any growth past regrowth, a
    thorough step follows each plain one and reclaims the frozen cyclic garbage.

    The sequence is exact because each round's growth of the frozen set (the
    states' ``_TRACKED_PER_STATE`` objects) dwarfs incidental changes; the
    first step and a thorough one reset the base, so the step after either is plain.
    """
    # 6 rounds, not 12: in a full run each thorough step collects the whole process.
    seen = await _soak(CollectorPolicy(interval=_NEVER, check_every=1, regrowth=1e-9), 6)
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
            # Until a step's collection and its read of the frozen set (a later turn) ran.
            while collector.statistics().steps == 0 or collector.check_due:
                _cyclic_garbage()
                junk = [[Junk()] for _ in range(1000)]  # tracked allocations
                del junk
                await anyio.sleep(0.01)
        stats = collector.statistics()
        assert stats.thorough_steps == 0 and stats.frozen > 0
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
        ("check_every", 0),
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
    a_froze, b_dropped, a_closed = (threading.Event() for _ in range(3))
    seen: dict[str, object] = {}

    async def wait(event: threading.Event) -> None:
        await anyio.to_thread.run_sync(event.wait, 30)
        assert event.is_set()

    async def first() -> None:
        async with Foundation(collector=policy) as foundation:
            collector = foundation.collector
            assert collector is not None
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


async def test_the_frozen_set_is_read_at_the_next_look_not_in_the_steps_pause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step's two pauses (collection, then the O(frozen) read of the frozen set's size)
    never run in one, nor back to back: the read is made at the next look, an interval
    later (mutants tried: ``run`` calling ``step()``, both in one pause, fails with
    sleep, collect, read; reading after a checkpoint instead of a look fails too)."""
    events: list[str] = []
    collect = FrozenCollector.collect
    sleep = anyio.sleep

    def collecting(self: FrozenCollector) -> None:
        collect(self)
        events.append("collect")

    def reading() -> int:
        events.append("read")
        return gc.get_freeze_count()

    async def sleeping(delay: float) -> None:
        events.append("sleep")
        await sleep(delay)

    monkeypatch.setattr(FrozenCollector, "collect", collecting)
    monkeypatch.setattr(_collector, "_frozen_count", reading)
    monkeypatch.setattr(anyio, "sleep", sleeping)
    collector = FrozenCollector(CollectorPolicy(interval=0.001, young_collections=1, check_every=1))

    async def allocate(scope: anyio.CancelScope) -> None:
        while events.count("read") < 3:
            junk = [[Junk()] for _ in range(1000)]  # tracked allocations: steps become due
            del junk
            await anyio.lowlevel.checkpoint()
        scope.cancel()

    try:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(collector.run)
                group.start_soon(allocate, group.cancel_scope)
    finally:
        collector.close()
    letters = "".join({"sleep": "s", "collect": "c", "read": "r"}[event] for event in events)
    # Looks without a due step (nothing allocated yet) only sleep again: one "s" each.
    assert re.sub("s+", "s", letters).strip("s") == "csrscsrscsr"
    assert collector.statistics().steps == 3


def test_a_read_left_due_stays_due_after_the_next_collection() -> None:
    """A step's read not made (its task cancelled between the two pauses) is made after
    the next collection, even one that would not make it due (mutant tried: each
    collection deciding afresh whether a read is due fails it)."""
    collector = FrozenCollector(CollectorPolicy(interval=_NEVER, check_every=2))
    try:
        collector.collect()  # the first step: reads the base
        assert collector.check_due
        collector.check()
        assert not collector.check_due
        collector.collect()  # the 2nd: a check_every-th step
        assert collector.check_due
        collector.collect()  # the 3rd would not make one due; the 2nd's is left
        assert collector.check_due
        collector.check()
        assert not collector.check_due
        collector.collect()  # the 4th: due again
        assert collector.check_due
        assert collector.statistics().steps == 4
    finally:
        collector.close()

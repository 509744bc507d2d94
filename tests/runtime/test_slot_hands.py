"""Rule 4 of the preparation slots: at most ``hand_limit`` slots are being handed at once.

A slot granted to a waiting request is *being handed* until that request
resumes (the loop's next iteration); the queue hands at most a quarter of its
capacity at once, so a saturated loop resumes a few requests per iteration
instead of ``capacity`` of them.
"""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from tests.runtime.helpers import user
from turnloom.errors import QueueFullError
from turnloom.runtime import ContextManager, ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.runtime._slots import FairSlots

pytestmark = pytest.mark.anyio


async def _until(condition: object) -> None:
    """Let the other tasks run until ``condition()`` holds (a hang guard, not a timing)."""
    with anyio.fail_after(30):
        while not condition():  # type: ignore[operator]
            await anyio.sleep(0.001)


async def test_at_most_hand_limit_slots_are_handed_and_a_resumed_waiter_hands_the_next() -> None:
    """Four slots freed at once with a hand limit of 2: two waiters are granted, the
    other slots wait (a new request does not take them while eligible requests wait);
    each waiter that resumes hands the next slot (mutants tried: no limit in ``_grant``
    fails the first assert; no hand-on after resuming hangs; ``try_acquire`` ignoring
    the limit fails the overtaking assert)."""
    slots = FairSlots(4, 4, hand_limit=2)
    for _ in range(4):
        assert slots.try_acquire(None)
    got: list[int] = []

    async def wait(number: int) -> None:
        await slots.acquire(None)
        got.append(number)

    async with anyio.create_task_group() as group:
        for number in range(4):
            group.start_soon(wait, number)
            await _until(lambda n=number: slots.waiting == n + 1)  # type: ignore[misc]
        for _ in range(4):
            slots.release(None)
        assert (slots.free, slots.waiting, got) == (2, 2, [])  # two being handed
        assert not slots.try_acquire(None)  # no overtaking of the two that wait
        await _until(lambda: len(got) == 4)
    assert sorted(got) == [0, 1, 2, 3]  # (the order they resume in is the backend's)
    assert (slots.free, slots.waiting, slots.held(None)) == (0, 0, 4)
    assert slots.try_acquire(None) is False
    for _ in range(4):
        slots.release(None)
    assert slots.try_acquire(None)  # nobody waits: a free slot is taken at once


async def test_a_waiter_cancelled_while_its_slot_is_handed_hands_it_on() -> None:
    """Granted (being handed), then cancelled before it resumed: the hand is free again
    and the slot goes to the next waiter, with a hand limit of 1."""
    slots = FairSlots(1, 1, hand_limit=1)
    assert slots.try_acquire(None)
    got: list[str] = []
    first = anyio.CancelScope()

    async def take(name: str, scope: anyio.CancelScope) -> None:
        with scope:
            await slots.acquire(None)
            got.append(name)

    async with anyio.create_task_group() as group:
        group.start_soon(take, "first", first)
        await _until(lambda: slots.waiting == 1)
        group.start_soon(take, "second", anyio.CancelScope())
        await _until(lambda: slots.waiting == 2)
        slots.release(None)
        first.cancel()  # before it resumes
        await _until(lambda: bool(got))
        if got == ["first"]:  # trio delivers the grant before the cancellation
            slots.release(None)
        await _until(lambda: "second" in got)
    assert (slots.free, slots.waiting, slots.held(None)) == (0, 0, 1)


def test_an_asyncio_task_cancelled_after_its_grant_gives_back_its_hand() -> None:
    """asyncio's own ``Task.cancel`` (a host's ``asyncio.timeout`` or TaskGroup) after
    the grant, in the same iteration, reaches the granted waiter as CancelledError
    (anyio's cancel scopes do not: they skip a task whose wait is done). The slot and
    its hand both come back and go to the next waiter, with a hand limit of 1
    (mutant tried: not giving the hand back leaves the next waiter parked forever)."""
    import asyncio

    async def main() -> tuple[int, int, int, int]:
        slots = FairSlots(
            1, 1, checkpoint=lambda: asyncio.sleep(0), signal=asyncio.Event, hand_limit=1
        )
        assert slots.try_acquire(None)
        first = asyncio.create_task(slots.acquire(None))
        second = asyncio.create_task(slots.acquire(None))
        while slots.waiting < 2:
            await asyncio.sleep(0)
        slots.release(None)  # granted to the first: one hand in use
        assert (slots.free, slots.waiting, slots._handing) == (0, 1, 1)
        first.cancel()  # before it resumes
        with pytest.raises(asyncio.CancelledError):
            await first
        assert await asyncio.wait_for(second, 30) is True
        return slots.free, slots.waiting, slots.held(None), slots._handing

    assert asyncio.run(main()) == (0, 0, 1, 0)


async def test_prepare_nowait_refused_while_free_slots_are_handed_names_the_waiters() -> None:
    """A queue of 4 hands one slot at a time: with three waiters and slots freed, a
    ``prepare_nowait`` is refused with the count of requests that wait (exact message),
    counted as a rejection; every request is then prepared."""
    manager = ContextManager(max_pending_preparations=4)
    async with Foundation(manager):
        slots = manager._life.check_open().queue._slots
        for _ in range(4):
            assert slots.try_acquire(None)  # the slots a host's other prepares hold
        for number in range(4):
            manager.accept_turn(
                TurnSnapshot(context_id=f"c{number}", turn_id="t", input=(user("hi"),))
            )
        done: list[str] = []

        async def prepare(context_id: str) -> None:
            await manager.prepare(ContextPrepareRequest(context_id=context_id, turn_id="t"))
            done.append(context_id)

        async with anyio.create_task_group() as group:
            for number in range(3):
                group.start_soon(prepare, f"c{number}")
                await _until(lambda n=number: slots.waiting == n + 1)  # type: ignore[misc]
            for _ in range(4):
                slots.release(None)  # one is handed, three free slots wait for the next hands
            assert (slots.free, slots.waiting) == (3, 2)
            with pytest.raises(QueueFullError) as refused:
                await manager.prepare_nowait(ContextPrepareRequest(context_id="c3", turn_id="t"))
            assert str(refused.value) == (
                "2 requests wait for the 4 preparation slots; preparation of turn 't' of "
                "context 'c3' was refused."
            )
            assert refused.value.capacity == 4
        assert sorted(done) == ["c0", "c1", "c2"]
        assert manager.statistics().preparations.rejected_total == 1

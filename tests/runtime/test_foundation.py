"""Foundation lifecycle: open once, close in order, idempotent, cancellation-safe."""

from __future__ import annotations

import math

import anyio
import pytest

from tests.runtime.helpers import BlockingGateway, user
from turnloom.errors import InputError, StateError
from turnloom.runtime import ContextPrepareRequest, Foundation, FoundationClosedError, TurnSnapshot

pytestmark = pytest.mark.anyio


def turn(turn_id: str = "t1") -> TurnSnapshot:
    return TurnSnapshot(context_id="c", turn_id=turn_id, input=(user("hi"),))


def req(turn_id: str = "t1") -> ContextPrepareRequest:
    return ContextPrepareRequest(context_id="c", turn_id=turn_id)


def _with_state() -> ContextPrepareRequest:
    """A request whose runtime-state pair the worker renders (the door rendered the input)."""
    return ContextPrepareRequest(context_id="c", turn_id="t1", behavior_rules="Be brief.")


async def test_calls_after_close_raise_the_closed_error_and_close_is_idempotent() -> None:
    foundation = Foundation()
    async with foundation:
        manager = foundation.manager
        manager.accept_turn(turn())
        prefix = await manager.prepare(req())
        await foundation.aclose()
        await foundation.aclose()
        assert foundation.closed and manager.closed
        for attempt in (
            lambda: manager.accept_turn(turn("t2")),
            lambda: manager.record("c", "t1", []),
            lambda: manager.build(prefix, []),
        ):
            with pytest.raises(FoundationClosedError):
                attempt()
        with pytest.raises(anyio.ClosedResourceError):
            await manager.prepare(req())
        with pytest.raises(FoundationClosedError):
            async with manager.invocation("c", "t1"):
                pass
    assert manager.statistics().contexts == 0  # histories released
    assert foundation.limiter.borrowed_tokens == 0


async def test_a_preparation_waiting_for_its_turn_fails_with_closed_at_close() -> None:
    """A prepare waiting for its turn's commit (holding no slot, not admitted) gets
    FoundationClosedError at the close; it is counted nowhere (not failed)."""
    errors: list[BaseException] = []
    async with Foundation() as foundation:
        manager = foundation.manager

        async def waiter() -> None:
            try:
                await manager.prepare(req("never"))
            except FoundationClosedError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            stats = manager.statistics()
            assert (stats.preparations.pending, stats.preparations.waiting_for_turn) == (0, 1)
            await foundation.aclose()
    assert [type(e) for e in errors] == [FoundationClosedError]
    stats = manager.statistics()
    assert (
        stats.preparations.pending,
        stats.preparations.waiting_for_turn,
        stats.preparations.failed_total,
        stats.preparations.discarded_total,
    ) == (0, 0, 0, 0)


async def test_a_rendering_preparation_settles_within_the_grace_period() -> None:
    gateway = BlockingGateway()
    got = []
    async with Foundation(gateway=gateway, close_grace_period=math.inf) as foundation:
        manager = foundation.manager
        manager.accept_turn(turn())
        gateway.hold = True

        async def requester() -> None:
            # The input was rendered at the door: the worker renders the state pair.
            got.append(await manager.prepare(_with_state()))

        async with anyio.create_task_group() as tg:
            tg.start_soon(requester)
            await anyio.to_thread.run_sync(gateway.entered.wait, 10)
            tg.start_soon(foundation.aclose)
            await anyio.wait_all_tasks_blocked()
            assert manager.closed and manager.statistics().preparations.pending == 1
            gateway.release.set()
    assert [p.items[0] for p in got] == [{"role": "user", "content": "hi"}]
    assert [len(p.items) for p in got] == [3]  # the input, then the state pair
    assert manager.statistics().preparations.prepared_total == 1


async def test_after_the_grace_period_a_render_is_cancelled_but_not_abandoned() -> None:
    gateway = BlockingGateway()
    errors: list[BaseException] = []
    async with Foundation(gateway=gateway, close_grace_period=0) as foundation:
        manager = foundation.manager
        manager.accept_turn(turn())
        gateway.hold = True

        async def requester() -> None:
            try:
                await manager.prepare(_with_state())
            except FoundationClosedError as exc:
                errors.append(exc)

        async def release_later() -> None:
            # Once aclose waits (its zero grace period over, the render cancelled), not
            # after a guessed delay that a loaded machine could outlast.
            await anyio.wait_all_tasks_blocked()
            gateway.release.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(requester)
            await anyio.to_thread.run_sync(gateway.entered.wait, 10)
            tg.start_soon(release_later)
            await foundation.aclose()
            # aclose returned only after the thread finished.
            assert gateway.release.is_set()
            assert manager.statistics().preparations.pending == 0
    assert len(errors) == 1
    assert foundation.limiter.borrowed_tokens == 0


async def test_a_cancelled_aclose_still_completes_its_cleanup() -> None:
    async with Foundation() as foundation:
        manager = foundation.manager

        async def waiter() -> None:
            with pytest.raises(FoundationClosedError):
                await manager.prepare(req("never"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            with anyio.CancelScope() as scope:
                scope.cancel()
                await foundation.aclose()
            assert scope.cancelled_caught
            assert manager.closed and manager.statistics().preparations.pending == 0


async def test_a_foundation_opens_once_and_validates_options() -> None:
    foundation = Foundation()
    with pytest.raises(StateError):
        _ = foundation.manager
    await foundation.aclose()  # never opened: nothing to do
    async with foundation:
        pass
    with pytest.raises(StateError):
        async with foundation:
            pass
    with pytest.raises(InputError):
        Foundation(worker_threads=0)
    with pytest.raises(InputError):
        Foundation(close_grace_period=-1)
    with pytest.raises(InputError):
        async with Foundation(max_pending_preparations=0):
            pass
    with pytest.raises(InputError):
        async with Foundation(gateway="nope"):
            pass

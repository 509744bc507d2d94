"""A prepare that finds a free slot takes it without yielding, and stays cancellation-safe.

Source: DESIGN rule 5 (a cancelled requester's preparation still settles and
frees its slot; a cancelled call that owns nothing is not counted) and the
``Cancellation`` paragraph of ``ContextManager.prepare``. ``prepare`` checks
for a cancellation before it takes a free slot (no yield there); its one
yield is then the render's wait in the render thread, or, rendered inline,
the checkpoint after the render, which it passes holding the slot. A prepare
that parked for its slot already yielded there: rendered inline, it is
delivered without another checkpoint.
"""

from __future__ import annotations

from datetime import UTC, datetime

import anyio
import anyio.lowlevel
import pytest

from tests.runtime.helpers import BlockingGateway, user
from turnloom.runtime import ContextPrepareRequest, Foundation, Perception, TurnSnapshot

pytestmark = pytest.mark.anyio


async def test_a_cancelled_prepare_for_the_thread_takes_no_slot_and_queues_nothing() -> None:
    """A requester already cancelled when it calls prepare, whose render would go to
    the render thread (a gateway that is not built in never renders inline), is
    cancelled before it takes the free slot: nothing is admitted, counted or handed
    to the thread (the thread never started), and the slot is free."""
    async with Foundation(gateway=BlockingGateway(), max_pending_preparations=1) as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),)))
        preparer = manager._life.check_bound()
        with anyio.CancelScope() as scope:
            scope.cancel()
            await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        assert scope.cancelled_caught
        stats = manager.statistics().preparations
        assert (stats.prepared_total, stats.discarded_total, stats.failed_total) == (0, 0, 0)
        assert (stats.pending, preparer.queue._slots.free, preparer._rendering) == (0, 1, 0)
        assert (preparer.worker.alive, preparer.worker.jobs) == (False, 0)
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        assert prepared.items == ({"role": "user", "content": "hi"},)
        assert manager.statistics().preparations.prepared_total == 1


async def test_a_prepare_on_a_free_slot_cancelled_at_its_checkpoint_after_an_inline_render() -> (
    None
):
    """A prepare that took a free slot and rendered inline passes one checkpoint,
    holding the slot, before it is delivered: a requester cancelled by then (here by
    the Foundation's clock, read for a perception without a time while the
    preparation ran) gets nothing delivered (the context's last prefix is unchanged,
    so the next prefix reuses nothing), the preparation counts as discarded and its
    slot is free."""
    scopes: list[anyio.CancelScope] = []

    def clock() -> datetime:
        if scopes:
            scopes.pop().cancel()
        return datetime(2026, 1, 1, tzinfo=UTC)

    async with Foundation(clock=clock, max_pending_preparations=1) as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),)))
        request = ContextPrepareRequest(
            context_id="c", turn_id="t1", perception=Perception(modality="voice")
        )
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            await manager.prepare(request)
        assert scope.cancelled_caught
        preparer = manager._life.check_bound()
        stats = manager.statistics().preparations
        assert (stats.prepared_total, stats.discarded_total, stats.failed_total) == (0, 1, 0)
        assert (stats.pending, stats.waiting_for_slot, preparer.queue._slots.free) == (0, 0, 1)
        assert preparer.worker.jobs == 0  # it rendered inline
        prepared = await manager.prepare(request)
        assert prepared.reused_bytes == 0  # the discarded prefix was never delivered
        assert manager.statistics().preparations.prepared_total == 1


async def test_a_cancelled_prepare_with_every_slot_taken_does_not_park() -> None:
    """A requester already cancelled when it calls prepare while every slot is taken
    is cancelled before it parks for one (it parks without a checkpoint first): it
    never joins the slots' waiters (their order counter is where it was), nothing
    is counted, and the holder is delivered."""
    gateway = BlockingGateway()
    async with Foundation(gateway=gateway, max_pending_preparations=1) as foundation:
        manager = foundation.manager
        for context_id in ("c", "h"):
            manager.accept_turn(
                TurnSnapshot(context_id=context_id, turn_id="t1", input=(user("hi"),))
            )
        preparer = manager._life.check_bound()
        delivered: list[object] = []
        gateway.hold = True
        async with anyio.create_task_group() as tg:

            async def holder() -> None:
                request = ContextPrepareRequest(context_id="h", turn_id="t1", loop_budget=1)
                delivered.append(await manager.prepare(request))

            tg.start_soon(holder)
            await anyio.to_thread.run_sync(gateway.entered.wait, 10)
            gateway.hold = False
            assert preparer.queue._slots.free == 0
            order = repr(preparer.queue._slots._order)  # the next waiter's number
            with anyio.CancelScope() as scope:
                scope.cancel()
                await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
            assert scope.cancelled_caught
            assert repr(preparer.queue._slots._order) == order
            stats = manager.statistics().preparations
            assert (stats.pending, stats.waiting_for_slot, preparer.queue._slots._queues) == (
                1,
                0,
                {},
            )
            gateway.release.set()
        stats = manager.statistics().preparations
        assert (stats.prepared_total, stats.discarded_total, stats.failed_total) == (1, 0, 0)
        assert (len(delivered), stats.pending, preparer.queue._slots.free) == (1, 0, 1)


async def test_a_parked_prepare_rendered_inline_is_delivered_without_another_checkpoint() -> None:
    """A requester that parked for its slot (its wait was its yield) and then renders
    inline is delivered at once: a cancellation that comes during its render (here
    from the Foundation's clock, read for a perception without a time) does not
    discard the result; it lands at the requester's next checkpoint. The slot is
    freed and the preparation counted as delivered, nothing as discarded."""
    scopes: list[anyio.CancelScope] = []

    def clock() -> datetime:
        if scopes:
            scopes.pop().cancel()
        return datetime(2026, 1, 1, tzinfo=UTC)

    gateway = BlockingGateway()
    async with Foundation(gateway=gateway, clock=clock, max_pending_preparations=1) as foundation:
        manager = foundation.manager
        for context_id in ("c", "h"):
            manager.accept_turn(
                TurnSnapshot(context_id=context_id, turn_id="t1", input=(user("hi"),))
            )
        preparer = manager._life.check_bound()
        delivered: list[object] = []
        reached: list[str] = []
        caught: list[bool] = []
        gateway.hold = True
        async with anyio.create_task_group() as tg:

            async def holder() -> None:
                # A loop budget: its state pair is rendered by the prepare (held).
                request = ContextPrepareRequest(context_id="h", turn_id="t1", loop_budget=1)
                delivered.append(await manager.prepare(request))

            async def parked() -> None:
                request = ContextPrepareRequest(
                    context_id="c", turn_id="t1", perception=Perception(modality="voice")
                )
                with anyio.CancelScope() as scope:
                    scopes.append(scope)
                    delivered.append(await manager.prepare(request))
                    reached.append("delivered")
                    await anyio.lowlevel.checkpoint()
                    reached.append("past its next checkpoint")
                caught.append(scope.cancelled_caught)

            tg.start_soon(holder)  # holds the one slot, rendering in the thread
            await anyio.to_thread.run_sync(gateway.entered.wait, 10)
            gateway.hold = False
            # The next render may run inline (this gateway is not a built-in one).
            preparer._inline = True
            tg.start_soon(parked)
            with anyio.fail_after(30):  # a hang guard, not a timing
                while manager.statistics().preparations.waiting_for_slot == 0:
                    await anyio.lowlevel.checkpoint()
            gateway.release.set()
        assert (len(delivered), reached, caught) == (2, ["delivered"], [True])
        assert preparer.worker.jobs == 1  # the holder's render; the parked one's was inline
        stats = manager.statistics().preparations
        assert (stats.prepared_total, stats.discarded_total, stats.failed_total) == (2, 0, 0)
        assert (stats.pending, stats.waiting_for_slot, preparer.queue._slots.free) == (0, 0, 1)


async def test_a_prepare_that_waited_for_its_commit_rendered_inline_is_delivered_at_once() -> None:
    """A requester that waited for its turn's commit (its wait was its yield), then
    took a free slot and rendered inline, is delivered at once: a cancellation that
    comes during its render (from the Foundation's clock) lands at its next
    checkpoint, and the preparation counts as delivered."""
    scopes: list[anyio.CancelScope] = []

    def clock() -> datetime:
        if scopes:
            scopes.pop().cancel()
        return datetime(2026, 1, 1, tzinfo=UTC)

    async with Foundation(clock=clock, max_pending_preparations=1) as foundation:
        manager = foundation.manager
        delivered: list[object] = []
        reached: list[str] = []
        caught: list[bool] = []
        async with anyio.create_task_group() as tg:

            async def requester() -> None:
                request = ContextPrepareRequest(
                    context_id="c", turn_id="t1", perception=Perception(modality="voice")
                )
                with anyio.CancelScope() as scope:
                    scopes.append(scope)
                    delivered.append(await manager.prepare(request))
                    reached.append("delivered")
                    await anyio.lowlevel.checkpoint()
                    reached.append("past its next checkpoint")
                caught.append(scope.cancelled_caught)

            tg.start_soon(requester)
            with anyio.fail_after(30):  # a hang guard, not a timing
                while manager.statistics().preparations.waiting_for_turn == 0:
                    await anyio.lowlevel.checkpoint()
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),)))
        assert (len(delivered), reached, caught) == (1, ["delivered"], [True])
        assert manager._life.check_bound().worker.jobs == 0  # it rendered inline
        stats = manager.statistics().preparations
        assert (stats.prepared_total, stats.discarded_total, stats.failed_total) == (1, 0, 0)

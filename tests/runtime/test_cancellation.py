"""Cancellation at every await point of ``prepare`` leaves slots and history as they were.

Source: DESIGN rule 5 and seed 004: a preparation stays owned until settled,
even when its requester is cancelled; no slot leaks; a worker thread is never
abandoned mid-render.
"""

from __future__ import annotations

import anyio
import pytest

from tests.runtime.helpers import SYSTEM, BlockingGateway, assistant, user
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio

PHASES = ("slot", "commit", "queued", "render")


async def _wait_until(predicate: object) -> None:
    with anyio.fail_after(10):
        while not predicate():  # type: ignore[operator]
            await anyio.sleep(0.005)


@pytest.mark.parametrize("phase", PHASES)
async def test_cancelling_prepare_at_each_await_point_frees_its_slot(phase: str) -> None:
    """Cancelled at {slot wait, commit wait, queued in the render thread behind another
    render, render}: nothing leaks. (queued and render wait on the render's Signal.)
    Waiting for its turn's commit (before any slot) or for a slot, the call owns
    nothing: it is not counted as discarded."""
    gateway = BlockingGateway()
    async with Foundation(
        gateway=gateway, max_pending_preparations=1 if phase != "queued" else 2, worker_threads=1
    ) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),), instructions=(SYSTEM,))
        )
        manager.record("c", "t1", [assistant("hello")])
        before = (manager.history("c").turn_ids, manager.history("c").turn_messages("t1"))
        target = "t2" if phase == "commit" else "t1"
        blocker_done: list[object] = []

        async with anyio.create_task_group() as tg:
            if phase == "slot":
                # Another context's preparation takes the only slot, its render held.
                manager.accept_turn(TurnSnapshot(context_id="h", turn_id="t1", input=(user("x"),)))
                gateway.hold = True

                async def blocker() -> None:
                    blocker_done.append(
                        await manager.prepare(
                            ContextPrepareRequest(context_id="h", turn_id="t1", loop_budget=1)
                        )
                    )

                tg.start_soon(blocker)
                await anyio.to_thread.run_sync(gateway.entered.wait, 10)
                gateway.hold = False
            elif phase == "queued":
                # Another context's render holds the thread; this one queues behind it.
                manager.accept_turn(TurnSnapshot(context_id="h", turn_id="t1", input=(user("x"),)))
                gateway.hold = True
                tg.start_soon(
                    manager.prepare,
                    ContextPrepareRequest(context_id="h", turn_id="t1", loop_budget=1),
                )
                await anyio.to_thread.run_sync(gateway.entered.wait, 10)
                gateway.hold = False
            elif phase == "render":
                gateway.hold = True

            with anyio.CancelScope() as scope:

                async def cancel_when_parked() -> None:
                    if phase == "render":
                        await anyio.to_thread.run_sync(gateway.entered.wait, 10)
                    else:
                        await anyio.wait_all_tasks_blocked()
                    scope.cancel()

                tg.start_soon(cancel_when_parked)
                await manager.prepare(
                    ContextPrepareRequest(context_id="c", turn_id=target, loop_budget=1)
                )
            assert scope.cancelled_caught

            stats = manager.statistics()
            if phase == "queued":
                # Settled at once (the thread skips it); the held render is still owned.
                assert (stats.preparations.pending, stats.preparations.discarded_total) == (1, 1)
                gateway.release.set()
                await _wait_until(lambda: manager.statistics().preparations.pending == 0)
                # Only the holder's preparation was delivered.
                assert manager.statistics().preparations.prepared_total == 1
            elif phase == "render":
                # Still owned by the manager: the thread finishes first.
                assert stats.preparations.pending == 1
                gateway.hold = False
                gateway.release.set()
                await _wait_until(lambda: manager.statistics().preparations.pending == 0)
            elif phase == "slot":
                assert (stats.preparations.pending, stats.preparations.waiting_for_slot) == (1, 0)
                gateway.release.set()
                await _wait_until(lambda: manager.statistics().preparations.pending == 0)
                assert len(blocker_done) == 1  # the holder was delivered
            else:
                # Waiting for the commit it held no slot: nothing admitted, no waiter left.
                await anyio.wait_all_tasks_blocked()
                stats = manager.statistics()
                assert (stats.preparations.pending, stats.preparations.waiting_for_turn) == (0, 0)

        stats = manager.statistics()
        assert (stats.preparations.pending, stats.preparations.waiting_for_slot) == (0, 0)
        assert stats.preparations.discarded_total == (0 if phase in ("slot", "commit") else 1)
        assert stats.preparations.failed_total == 0
        assert manager._life.check_bound().queue._waiters == {}
        # The skipped job's batch may come back after the holder's preparation was
        # delivered: the render count goes then, bounded.
        await _wait_until(lambda: manager._life.check_bound()._rendering == 0)
        history = manager.history("c")
        assert (history.turn_ids[:1], history.turn_messages("t1")) == (before[0], before[1])
        # The slot is free again: an immediate preparation is admitted.
        prepared = await manager.prepare_nowait(ContextPrepareRequest(context_id="c", turn_id="t1"))
        assert prepared.items[1] == {"role": "user", "content": "hi"}


async def test_a_prepare_cancelled_at_its_first_checkpoint_takes_no_slot() -> None:
    """The free-slot path checks for a cancellation before it takes the slot: a
    requester already cancelled when it calls prepare is cancelled there, holding
    nothing; nothing is counted or rendered."""
    async with Foundation(max_pending_preparations=1) as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),)))
        with anyio.CancelScope() as scope:
            scope.cancel()
            await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        assert scope.cancelled_caught
        stats = manager.statistics().preparations
        assert (stats.pending, stats.waiting_for_slot) == (0, 0)
        assert (stats.prepared_total, stats.discarded_total, stats.failed_total) == (0, 0, 0)
        queue = manager._life.check_bound().queue
        assert queue._slots.free == 1
        # The slot is free: an immediate preparation is admitted.
        prepared = await manager.prepare_nowait(ContextPrepareRequest(context_id="c", turn_id="t1"))
        assert prepared.items == ({"role": "user", "content": "hi"},)


async def test_a_preparation_cancelled_before_it_waits_renders_nothing() -> None:
    """A preparation owns a cancel scope only while it waits (for its turn, its
    assembly): one already cancelled when admitted (the scope the Foundation was
    opened in was cancelled: ``queue._cancelled``) and whose turn is held never waits,
    yet renders nothing. The requester gets FoundationClosedError; the slot is freed
    and the preparation counted as failed (its requester got the error)."""
    from turnloom.runtime.errors import FoundationClosedError

    gateway = BlockingGateway()  # not a built-in gateway: never rendered inline
    async with Foundation(gateway=gateway, max_pending_preparations=1) as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),)))
        queue = manager._life.check_bound().queue
        queue._cancelled = True  # as the watcher sets it
        renders = gateway.renders
        with pytest.raises(FoundationClosedError):
            await manager.prepare_nowait(ContextPrepareRequest(context_id="c", turn_id="t1"))
        stats = manager.statistics().preparations
        assert (gateway.renders - renders, stats.pending, queue._slots.free) == (0, 0, 1)
        assert (stats.prepared_total, stats.discarded_total, stats.failed_total) == (0, 0, 1)
        queue._cancelled = False
        prepared = await manager.prepare_nowait(ContextPrepareRequest(context_id="c", turn_id="t1"))
        assert prepared.items == ({"role": "user", "content": "hi"},)
        assert manager.statistics().preparations.prepared_total == 1

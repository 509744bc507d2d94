"""A prepare waiting for its turn's commit holds no slot of the pending queue.

Invariant (the starvation fix): ``prepare``/``prepare_nowait`` wait for the
commit BEFORE taking a slot, so any number of calls waiting for turns that
never come (mistyped ids, a voice host preparing ahead of ``accept_turn``)
never stop another context's preparation. While they wait they are counted in
``waiting_for_turn`` only (not ``pending``, not ``waiting_for_slot``); the
close wakes each with FoundationClosedError, and, never admitted, they are
counted neither failed nor discarded.
"""

from __future__ import annotations

import anyio
import pytest

from tests.runtime.helpers import GatedStrategy, user
from turnloom.errors import QueueFullError
from turnloom.runtime import (
    ContextPrepareRequest,
    Foundation,
    FoundationClosedError,
    TurnSnapshot,
)

pytestmark = pytest.mark.anyio

CAPACITY = 2
WAITERS = 3 * CAPACITY


async def test_waiters_for_uncommitted_turns_never_starve_another_context() -> None:
    """Three times the capacity of prepares on mistyped ids wait (pending 0,
    waiting_for_turn 6); another context's prepare and prepare_nowait are served
    at once; closing makes every waiter raise FoundationClosedError."""
    outcomes: list[str] = []
    async with Foundation(max_pending_preparations=CAPACITY) as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="real", turn_id="t1", input=(user("hi"),)))

        async def mistyped(n: int) -> None:
            # Half name a context never created, half a turn of "real" never committed.
            request = (
                ContextPrepareRequest(context_id=f"typo-{n}", turn_id="t1")
                if n % 2
                else ContextPrepareRequest(context_id="real", turn_id=f"t-{n}")
            )
            # Every third by prepare_nowait: it waits for the commit too.
            call = manager.prepare_nowait if n % 3 == 0 else manager.prepare
            try:
                await call(request)
                outcomes.append("prepared")
            except FoundationClosedError:
                outcomes.append("closed")

        async with anyio.create_task_group() as group:
            for n in range(WAITERS):
                group.start_soon(mistyped, n)
            await anyio.wait_all_tasks_blocked()
            stats = manager.statistics().preparations
            assert (stats.pending, stats.waiting_for_slot, stats.waiting_for_turn) == (
                0,
                0,
                WAITERS,
            )
            with anyio.fail_after(10):  # a hang guard: with slots held this never returns
                prefix = await manager.prepare(
                    ContextPrepareRequest(context_id="real", turn_id="t1")
                )
                again = await manager.prepare_nowait(
                    ContextPrepareRequest(context_id="real", turn_id="t1")
                )
            assert list(prefix.items) == list(again.items) == [{"role": "user", "content": "hi"}]
            stats = manager.statistics().preparations
            assert (
                stats.pending,
                stats.waiting_for_turn,
                stats.prepared_total,
                stats.rejected_total,
            ) == (0, WAITERS, 2, 0)
            await foundation.aclose()
        assert outcomes == ["closed"] * WAITERS
        stats = manager.statistics().preparations
        assert (
            stats.pending,
            stats.waiting_for_slot,
            stats.waiting_for_turn,
            stats.failed_total,
            stats.discarded_total,
            stats.prepared_total,
        ) == (0, 0, 0, 0, 0, 2)


async def test_prepare_nowait_takes_its_slot_only_after_the_commit() -> None:
    """prepare_nowait on an uncommitted turn waits for the commit even while the
    queue is full (no QueueFullError at the call); once the turn is committed it
    takes a slot at once or, the queue still full, raises QueueFullError then."""
    strategy = GatedStrategy()
    async with Foundation(max_pending_preparations=1, strategy=strategy) as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="h", turn_id="t1", input=(user("held"),)))
        raised: list[QueueFullError] = []

        async def ahead() -> None:
            try:
                await manager.prepare_nowait(ContextPrepareRequest(context_id="c", turn_id="t1"))
            except QueueFullError as exc:
                raised.append(exc)

        async with anyio.create_task_group() as group:
            # Admitted, its assembly waiting at a closed gate: it holds the only slot.
            group.start_soon(manager.prepare, ContextPrepareRequest(context_id="h", turn_id="t1"))
            await anyio.wait_all_tasks_blocked()
            group.start_soon(ahead)
            await anyio.wait_all_tasks_blocked()
            stats = manager.statistics().preparations
            assert (stats.pending, stats.waiting_for_turn, stats.rejected_total) == (1, 1, 0)
            assert raised == []
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("go"),)))
            await anyio.wait_all_tasks_blocked()
            assert [exc.capacity for exc in raised] == [1]
            stats = manager.statistics().preparations
            assert (stats.pending, stats.waiting_for_turn, stats.rejected_total) == (1, 0, 1)
            strategy.open("held")
        stats = manager.statistics().preparations
        assert (stats.pending, stats.prepared_total, stats.failed_total) == (0, 1, 0)
        assert strategy.entered == ["held"]  # the refused call never reached its assembly

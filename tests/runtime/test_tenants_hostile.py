"""Hostile multi-tenant use of the preparation slots: floods, bulk cancels, odd ids."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from tests.runtime.helpers import GatedStrategy, user
from turnloom.context import TenantScope
from turnloom.errors import InvalidMessageError, QueueFullError
from turnloom.runtime import ContextManager, ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.runtime._counters import Counters
from turnloom.runtime._queue import PreparationQueue
from turnloom.runtime._slots import FairSlots

pytestmark = pytest.mark.anyio

FLOOD = 200


def _commit(manager: ContextManager, context_id: str, turn_id: str) -> None:
    manager.accept_turn(
        TurnSnapshot(
            context_id=context_id, turn_id=turn_id, input=(user(f"{context_id}{turn_id}"),)
        )
    )


def _stats(manager: ContextManager) -> tuple[int, int]:
    s = manager.statistics().preparations
    return s.pending, s.waiting_for_slot


async def _settle() -> None:
    for _ in range(3):
        await anyio.wait_all_tasks_blocked()


def _req(context_id: str, turn_id: str, tenant: str | None) -> ContextPrepareRequest:
    scope = TenantScope(tenant_id=tenant) if tenant is not None else None
    return ContextPrepareRequest(context_id=context_id, turn_id=turn_id, tenant=scope)


@pytest.mark.parametrize("flooder", ["flooder", None])
async def test_a_single_prepare_of_another_tenant_is_next_after_one_settles(
    flooder: str | None,
) -> None:
    """Contract (_slots): "a tenant that arrives while another floods waits for at
    most one preparation to settle, not behind the whole flood"."""
    strategy = GatedStrategy()
    with anyio.fail_after(30):
        async with Foundation(
            max_pending_preparations=8, max_tenant_preparations=8, strategy=strategy
        ) as foundation:
            manager = foundation.manager
            _commit(manager, "b", "t1")
            strategy.open("bt1")
            for n in range(FLOOD):
                _commit(manager, f"a{n}", "t")
            async with anyio.create_task_group() as group:
                for n in range(FLOOD):
                    group.start_soon(manager.prepare, _req(f"a{n}", "t", flooder))
                await _settle()
                assert _stats(manager) == (8, FLOOD - 8)
                done = anyio.Event()

                async def quiet() -> None:
                    await manager.prepare(_req("b", "t1", "quiet"))
                    done.set()

                group.start_soon(quiet)
                await _settle()
                assert _stats(manager) == (8, FLOOD - 7)
                # One preparation that holds a slot settles (trio starts the flood's
                # tasks in another order than asyncio: the first admitted, not a0).
                strategy.open(strategy.entered[0])
                await done.wait()
                assert strategy.entered[8] == "bt1"
                for n in range(FLOOD):
                    strategy.open(f"a{n}t")
            assert _stats(manager) == (0, 0)
            assert manager.statistics().preparations.prepared_total == FLOOD + 1


async def test_bulk_cancelled_waiters_leak_no_slot() -> None:
    """Contract (acquire/park): "A cancelled call holds no slot: one granted to it in
    the meantime is handed to the next waiter"; statistics return to 0."""
    strategy = GatedStrategy()
    with anyio.fail_after(30):
        async with Foundation(max_pending_preparations=4, strategy=strategy) as foundation:
            manager = foundation.manager
            assert manager.tenant_limit == 2
            for n in range(FLOOD):
                _commit(manager, f"a{n}", "t")
                _commit(manager, f"c{n}", "t")
            async with anyio.create_task_group() as group:
                for n in range(FLOOD):
                    group.start_soon(manager.prepare, _req(f"a{n}", "t", "A"))
                    group.start_soon(manager.prepare, _req(f"c{n}", "t", "C"))
                await _settle()
                assert _stats(manager) == (4, 2 * FLOOD - 4)
                # Free slots and cancel everyone in the same step.
                strategy.open("a0t")
                strategy.open("a1t")
                group.cancel_scope.cancel()
            await _settle()
            assert _stats(manager) == (0, 0)
            # Every slot is free again: capacity prepare_nowait calls of two tenants succeed.
            for n in range(4):
                _commit(manager, "z", f"u{n}")
                strategy.open(f"zu{n}")
            for n in range(4):
                await manager.prepare_nowait(_req("z", f"u{n}", f"T{n % 2}"))
            assert _stats(manager) == (0, 0)


@pytest.mark.parametrize("hand_limit", [1, 2, 8])
async def test_fairslots_bulk_cancel_after_grants_restores_every_slot(hand_limit: int) -> None:
    """Contract (leave): "A queued waiter's wait raised: it holds no slot (one granted
    to it is handed on)"."""
    slots = FairSlots(8, 8, hand_limit=hand_limit)
    for _ in range(8):
        assert slots.try_acquire("a")
    scopes: list[anyio.CancelScope] = []
    got: list[str] = []

    async def wait(tenant: str) -> None:
        scope = anyio.CancelScope()
        scopes.append(scope)
        with scope:
            await slots.acquire(tenant)
            got.append(tenant)
            await anyio.sleep_forever()

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for n in range(FLOOD):
                group.start_soon(wait, "a" if n % 3 else "B")
            await _settle()
            assert slots.waiting == FLOOD
            for _ in range(8):
                slots.release("a")  # grants up to hand_limit, the rest wait for a hand
            for scope in scopes:
                scope.cancel()
        # Tasks that resumed holding a slot never release it here: give those back.
        for tenant in got:
            slots.release(tenant)
    assert (slots.free, slots.waiting, slots._handing, slots._queues, slots._held) == (
        8,
        0,
        0,
        {},
        {},
    )


async def test_prepare_nowait_refusal_reasons() -> None:
    """Contract (acquire_nowait): refused when "every slot is taken, the request's
    tenant holds its limit, or the free slots are being handed to requests that
    wait for them"; each refusal is counted."""
    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            counters = Counters()
            queue = PreparationQueue(4, group, counters, tenant_limit=4)  # hand_limit 1
            slots = queue._slots
            for _ in range(4):
                assert slots.try_acquire("A")
            r = _req("x", "t", "B")
            with pytest.raises(QueueFullError, match="All 4 preparation slots are taken"):
                queue.acquire_nowait(r)
            results: list[str] = []

            async def wait() -> None:
                await slots.acquire("A")
                results.append("A")

            group.start_soon(wait)
            group.start_soon(wait)
            await _settle()
            slots.release("A")  # handed to a waiter (hand limit 1 now reached)
            slots.release("A")  # free, owed to the other eligible waiter
            with pytest.raises(QueueFullError, match="1 requests wait for the 4"):
                queue.acquire_nowait(r)
            await _settle()
            assert results == ["A", "A"]
            assert slots.free == 0
            slots.release("A")
            queue.acquire_nowait(_req("x", "t", "B"))
            with pytest.raises(QueueFullError, match="All 4"):
                queue.acquire_nowait(r)
            assert counters.rejected == 3
            group.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("tenant", "TENANT"),
        ("straße", "STRASSE"),
        ("é", "e\u0301"),  # NFC vs NFD: different strings, different tenants
        ("x" * 128, "x" * 127 + "y"),
        ("租户", "租戶"),
    ],
)
async def test_tenant_ids_are_compared_exactly(first: str, second: str) -> None:
    """Contract (schemas): "a tenant (its ``tenant_id``) holds at most the manager's
    ``tenant_limit`` at once": ids that differ only by case or normalisation are
    different tenants, each with its own limit."""
    strategy = GatedStrategy()
    with anyio.fail_after(30):
        async with Foundation(
            max_pending_preparations=4, max_tenant_preparations=1, strategy=strategy
        ) as foundation:
            manager = foundation.manager
            for n in range(3):
                _commit(manager, "p", f"t{n}")
                _commit(manager, "q", f"t{n}")
            async with anyio.create_task_group() as group:
                group.start_soon(manager.prepare, _req("p", "t0", first))
                group.start_soon(manager.prepare, _req("q", "t0", second))
                await _settle()
                assert _stats(manager) == (2, 0)
                with pytest.raises(QueueFullError, match="holds its limit of 1") as info:
                    await manager.prepare_nowait(_req("p", "t1", first))
                assert len(str(info.value)) < 400  # the id is cut to 64 characters
                strategy.open("pt0")
                strategy.open("qt0")
            assert _stats(manager) == (0, 0)


@pytest.mark.parametrize("tenant_id", ["", "x" * 129, "a\nb", "\x00"])
async def test_bad_tenant_ids_are_refused_and_hold_nothing(tenant_id: str) -> None:
    """Contract (check_tenant_scope): an id that is empty, longer than 128 or not
    printable is refused with InvalidMessageError; nothing is admitted."""
    async with Foundation(max_pending_preparations=2) as foundation:
        manager = foundation.manager
        _commit(manager, "p", "t0")
        for call in (manager.prepare, manager.prepare_nowait):
            with pytest.raises(InvalidMessageError):
                await call(_req("p", "t0", tenant_id))
        assert _stats(manager) == (0, 0)
        await manager.prepare_nowait(_req("p", "t0", "ok"))


@pytest.mark.parametrize(("given", "limit"), [(1, 1), (3, 3), (4, 4), (5, 4), (10**9, 4)])
async def test_tenant_limit_is_clamped_to_capacity_and_enforced(given: int, limit: int) -> None:
    """Contract (_options): "the most preparation slots one tenant holds at once";
    (_slots) a flooding tenant "always leaves capacity - tenant_limit slots to the others"."""
    strategy = GatedStrategy()
    with anyio.fail_after(30):
        async with Foundation(
            max_pending_preparations=4, max_tenant_preparations=given, strategy=strategy
        ) as foundation:
            manager = foundation.manager
            assert manager.tenant_limit == limit
            for n in range(10):
                _commit(manager, f"a{n}", "t")
            for n in range(4):
                _commit(manager, "b", f"t{n}")
            async with anyio.create_task_group() as group:
                for n in range(10):
                    group.start_soon(manager.prepare, _req(f"a{n}", "t", "A"))
                await _settle()
                assert _stats(manager) == (limit, 10 - limit)
                for n in range(4 - limit):
                    group.start_soon(manager.prepare, _req("b", f"t{n}", "B"))
                await _settle()
                b_held = min(limit, 4 - limit)
                assert _stats(manager) == (limit + b_held, 10 - limit + 4 - limit - b_held)
                for n in range(10):
                    strategy.open(f"a{n}t")
                for n in range(4):
                    strategy.open(f"bt{n}")
            assert _stats(manager) == (0, 0)

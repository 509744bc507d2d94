"""Per-tenant fairness of preparation slots: the cap, fewest-held first, no overtaking."""

from __future__ import annotations

import anyio
import pytest

from tests.runtime.helpers import GatedStrategy, user
from turnloom.context import TenantScope
from turnloom.errors import InputError, QueueFullError
from turnloom.runtime import ContextManager, ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.runtime._slots import FairSlots

pytestmark = pytest.mark.anyio

A = TenantScope(tenant_id="flooder")
B = TenantScope(tenant_id="quiet")


def _commit(manager: ContextManager, context_id: str, turn_id: str) -> None:
    """Commit the turn, its input text ``context_id + turn_id`` (its GatedStrategy gate)."""
    manager.accept_turn(
        TurnSnapshot(
            context_id=context_id, turn_id=turn_id, input=(user(f"{context_id}{turn_id}"),)
        )
    )


def _admitted_or_waiting(manager: ContextManager) -> int:
    stats = manager.statistics().preparations
    return stats.pending + stats.waiting_for_slot


async def _until(condition: object) -> None:
    """Let the other tasks run until ``condition()`` holds (a hang guard, not a timing)."""
    with anyio.fail_after(30):
        while not condition():  # type: ignore[operator]
            await anyio.sleep(0.001)


async def test_a_tenant_at_its_limit_waits_while_another_tenant_takes_a_slot_at_once() -> None:
    slots = FairSlots(4, 2)
    assert slots.try_acquire("a") and slots.try_acquire("a")
    assert not slots.try_acquire("a")
    assert slots.try_acquire("b")
    assert (slots.free, slots.held("a"), slots.held("b")) == (1, 2, 1)
    assert slots.try_acquire(None) and slots.free == 0


async def test_a_freed_slot_goes_to_the_tenant_holding_fewest_not_the_earliest_waiter() -> None:
    slots = FairSlots(2, 2)
    assert slots.try_acquire("a") and slots.try_acquire("a")
    order: list[str] = []

    async def wait(tenant: str) -> None:
        await slots.acquire(tenant)
        order.append(tenant)

    async with anyio.create_task_group() as group:
        group.start_soon(wait, "a")
        await _until(lambda: slots.waiting == 1)
        group.start_soon(wait, "b")
        await _until(lambda: slots.waiting == 2)
        slots.release("a")  # a holds 1, b holds 0: b first, though a waited longer
        await _until(lambda: order == ["b"])
        slots.release("a")
    assert order == ["b", "a"]
    assert (slots.held("a"), slots.held("b"), slots.waiting, slots.free) == (1, 1, 0, 0)


async def test_a_waiter_cancelled_after_its_grant_hands_the_slot_on() -> None:
    """Granted, then cancelled before it resumed: the slot goes to the next waiter."""
    slots = FairSlots(1, 1)
    assert slots.try_acquire("a")
    got: list[str] = []
    b_scope = anyio.CancelScope()

    async def take_b() -> None:
        with b_scope:
            await slots.acquire("b")
            got.append("b")

    async def take_c() -> None:
        await slots.acquire("c")
        got.append("c")

    async with anyio.create_task_group() as group:
        group.start_soon(take_b)
        await _until(lambda: slots.waiting == 1)
        group.start_soon(take_c)
        await _until(lambda: slots.waiting == 2)
        slots.release("a")  # granted to b (the earlier of two tenants holding none)
        b_scope.cancel()  # before b resumes
        await _until(lambda: bool(got))
        if got == ["b"]:  # trio delivers the grant before the cancellation: b got it
            slots.release("b")
        await _until(lambda: "c" in got)
    assert (slots.held("b"), slots.held("c"), slots.waiting, slots.free) == (0, 1, 0, 0)


async def test_one_tenant_flooding_cannot_take_every_slot_from_another() -> None:
    """Tenant A floods prepares that hold slots (committed turns whose assembly
    waits at a closed gate); tenant B's prepare is admitted and delivered while A
    still floods."""
    strategy = GatedStrategy()
    async with Foundation(max_pending_preparations=4, strategy=strategy) as foundation:
        manager = foundation.manager
        assert manager.tenant_limit == 2
        _commit(manager, "b", "t1")
        strategy.open("bt1")
        for n in range(8):
            _commit(manager, "a", f"t{n}")
        delivered: list[str] = []

        async def flood(n: int) -> None:
            await manager.prepare(ContextPrepareRequest(context_id="a", turn_id=f"t{n}", tenant=A))
            delivered.append(f"a{n}")

        async with anyio.create_task_group() as group:
            for n in range(8):
                group.start_soon(flood, n)
            await _until(lambda: _admitted_or_waiting(manager) == 8)
            assert manager.statistics().preparations.pending == 2  # A holds its limit
            prefix = await manager.prepare(
                ContextPrepareRequest(context_id="b", turn_id="t1", tenant=B)
            )
            delivered.append("b")
            assert prefix.turn_id == "t1"
            for n in range(8):
                strategy.open(f"at{n}")
        stats = manager.statistics().preparations
    assert delivered[0] == "b"
    assert sorted(delivered[1:]) == sorted(f"a{n}" for n in range(8))
    assert (stats.prepared_total, stats.pending, stats.waiting_for_slot) == (9, 0, 0)


async def test_a_waiting_tenant_gets_the_next_freed_slot_before_the_flooders_queue() -> None:
    """A's preparations hold both slots (assemblies waiting at closed gates); the
    slot A's t0 frees goes to B, waiting with none, before A's queued t2 and t3."""
    strategy = GatedStrategy()
    async with Foundation(
        max_pending_preparations=2, max_tenant_preparations=2, strategy=strategy
    ) as foundation:
        manager = foundation.manager
        _commit(manager, "b", "t1")
        strategy.open("bt1")
        for n in range(4):
            _commit(manager, "a", f"t{n}")
        order: list[str] = []

        async def prepare(context_id: str, turn_id: str, scope: TenantScope) -> None:
            await manager.prepare(
                ContextPrepareRequest(context_id=context_id, turn_id=turn_id, tenant=scope)
            )
            order.append(f"{context_id}{turn_id}")

        async with anyio.create_task_group() as group:
            for n in range(4):
                group.start_soon(prepare, "a", f"t{n}", A)
                await _until(lambda n=n: _admitted_or_waiting(manager) == n + 1)
            group.start_soon(prepare, "b", "t1", B)
            await _until(lambda: _admitted_or_waiting(manager) == 5)
            strategy.open("at0")  # its slot frees: B holds fewer than A, B goes next
            await _until(lambda: order == ["at0", "bt1"])
            # Then A's t2 takes B's slot (A's t1 and t2 held; t3 waits).
            await _until(lambda: _admitted_or_waiting(manager) == 3)
            stats = manager.statistics().preparations
            assert (stats.pending, stats.waiting_for_slot) == (2, 1)
            assert strategy.entered == ["at0", "at1", "bt1", "at2"]
            for n in range(1, 4):
                strategy.open(f"at{n}")
    assert order[:2] == ["at0", "bt1"]


async def test_prepare_nowait_refuses_a_tenant_at_its_limit_but_serves_another() -> None:
    """A holds its limit (two assemblies waiting at closed gates): A's
    prepare_nowait of a committed turn is refused, B's is served at once."""
    strategy = GatedStrategy()
    async with Foundation(max_pending_preparations=4, strategy=strategy) as foundation:
        manager = foundation.manager
        _commit(manager, "b", "t1")
        strategy.open("bt1")
        for turn_id in ("t0", "t1", "t9"):
            _commit(manager, "a", turn_id)
        async with anyio.create_task_group() as group:
            for n in range(2):
                group.start_soon(
                    manager.prepare,
                    ContextPrepareRequest(context_id="a", turn_id=f"t{n}", tenant=A),
                )
            await _until(lambda: manager.statistics().preparations.pending == 2)
            with pytest.raises(QueueFullError, match="'flooder' holds its limit of 2"):
                await manager.prepare_nowait(
                    ContextPrepareRequest(context_id="a", turn_id="t9", tenant=A)
                )
            prefix = await manager.prepare_nowait(
                ContextPrepareRequest(context_id="b", turn_id="t1", tenant=B)
            )
            assert prefix.turn_id == "t1"
            for n in range(2):
                strategy.open(f"at{n}")
        assert manager.statistics().preparations.rejected_total == 1
        # The refused t9 never assembled (tasks started together run in any order).
        assert sorted(strategy.entered[:2]) == ["at0", "at1"] and strategy.entered[2:] == ["bt1"]


async def test_requests_without_a_scope_are_bounded_by_the_capacity_only() -> None:
    """Without a tenant, one requester's preparations take every slot (no tenant
    limit): the assemblies of three committed turns hold all three."""
    strategy = GatedStrategy()
    async with Foundation(max_pending_preparations=3, strategy=strategy) as foundation:
        manager = foundation.manager
        for n in range(3):
            _commit(manager, "s", f"t{n}")
        async with anyio.create_task_group() as group:
            for n in range(3):
                group.start_soon(
                    manager.prepare, ContextPrepareRequest(context_id="s", turn_id=f"t{n}")
                )
            await _until(lambda: manager.statistics().preparations.pending == 3)
            assert manager.statistics().preparations.waiting_for_slot == 0
            for n in range(3):
                strategy.open(f"st{n}")
        assert manager.statistics().preparations.prepared_total == 3


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_a_bad_tenant_limit_is_rejected(value: object) -> None:
    with pytest.raises(InputError, match="max_tenant_preparations"):
        Foundation(max_tenant_preparations=value)  # type: ignore[arg-type]

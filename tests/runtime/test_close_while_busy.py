"""Closing a busy Foundation, and cancelling preparations from every direction.

Invariants (seed 004 lifecycle, DESIGN rule 5): ``aclose`` is idempotent and
cancellation-safe; every preparation settles (no slot leaks, no worker thread
abandoned mid-render, its result discarded); requesters get the typed closed
error, never a bare assertion; after close every call raises it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from tests.runtime.helpers import SYSTEM, BlockingGateway, GatedStrategy, assistant, user
from turnloom.areas import OneShotNotice
from turnloom.runtime import (
    ContextPrepareRequest,
    Foundation,
    FoundationClosedError,
    PreparedContext,
    TurnSnapshot,
)

pytestmark = pytest.mark.anyio


def _turn(turn_id: str = "t1", text: str = "hi") -> TurnSnapshot:
    return TurnSnapshot(
        context_id="c", turn_id=turn_id, input=(user(text),), instructions=(SYSTEM,)
    )


def _req(turn_id: str = "t1") -> ContextPrepareRequest:
    return ContextPrepareRequest(context_id="c", turn_id=turn_id, loop_budget=2)


def _req_for(context_id: str) -> ContextPrepareRequest:
    # The runtime-state pair of a loop budget is rendered in the worker thread.
    return ContextPrepareRequest(context_id=context_id, turn_id="t1", loop_budget=2)


async def _prepare_outside_as_the_host_scope_is_cancelled(
    request: ContextPrepareRequest,
    setup: Callable[[Foundation], Awaitable[None]] | None = None,
    **options: Any,
) -> tuple[Foundation, list[BaseException]]:
    """Open a Foundation(**options) in a host task (``setup`` runs in it), prepare
    ``request`` from outside the host's scope, and cancel that scope once every
    task is blocked; return the Foundation and what the prepare raised."""
    box: dict[str, Any] = {}
    opened = anyio.Event()
    errors: list[BaseException] = []

    async def host() -> None:
        with anyio.CancelScope() as scope:
            box["scope"] = scope
            async with Foundation(**options) as foundation:
                box["foundation"] = foundation
                if setup is not None:
                    await setup(foundation)
                opened.set()
                await anyio.sleep_forever()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(host)
            await opened.wait()
            foundation: Foundation = box["foundation"]

            async def cancel_host() -> None:
                await anyio.wait_all_tasks_blocked()
                box["scope"].cancel()

            tg.start_soon(cancel_host)
            try:
                await foundation.manager.prepare(request)
            except BaseException as exc:  # the exact type is the assertion
                errors.append(exc)
    return foundation, errors


async def test_a_requester_outside_the_foundations_scope_gets_the_closed_error() -> None:
    """The host scope of the Foundation is cancelled: a requester living elsewhere
    gets FoundationClosedError (not an AssertionError) and nothing leaks. It waited
    for its turn's commit, holding no slot: never admitted, so counted nowhere."""
    foundation, errors = await _prepare_outside_as_the_host_scope_is_cancelled(_req("never"))
    assert [type(e) for e in errors] == [FoundationClosedError]
    stats = foundation.manager.statistics()
    assert (
        stats.preparations.pending,
        stats.preparations.waiting_for_slot,
        stats.preparations.waiting_for_turn,
        stats.preparations.prepared_total,
    ) == (0, 0, 0, 0)
    assert (stats.preparations.failed_total, stats.preparations.discarded_total) == (0, 0)
    assert foundation.limiter.borrowed_tokens == 0


async def test_close_while_one_waits_for_its_turn_and_one_for_a_slot() -> None:
    """Every requester gets the closed error: the one waiting for its turn's commit
    (holding no slot, never admitted), the one waiting for the slot (never
    admitted) and the admitted one holding the slot (its assembly waiting at a
    closed gate, the only one counted as failed)."""
    outcomes: dict[str, str] = {}
    strategy = GatedStrategy()
    async with Foundation(max_pending_preparations=1, strategy=strategy) as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn("t1", "held"))
        manager.accept_turn(_turn("t2", "queued"))

        async def requester(name: str, turn_id: str) -> None:
            try:
                await manager.prepare(_req(turn_id))
                outcomes[name] = "prepared"
            except FoundationClosedError:
                outcomes[name] = "closed"

        async with anyio.create_task_group() as tg:
            tg.start_soon(requester, "turn", "never")
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(requester, "held", "t1")
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(requester, "slot", "t2")
            await anyio.wait_all_tasks_blocked()
            stats = manager.statistics()
            assert (
                stats.preparations.pending,
                stats.preparations.waiting_for_slot,
                stats.preparations.waiting_for_turn,
            ) == (1, 1, 1)
            assert strategy.entered == ["held"]
            await foundation.aclose()
        stats = manager.statistics()
        assert outcomes == {"turn": "closed", "held": "closed", "slot": "closed"}
        assert (
            stats.preparations.pending,
            stats.preparations.waiting_for_slot,
            stats.preparations.waiting_for_turn,
            stats.preparations.failed_total,
        ) == (0, 0, 0, 1)
        assert stats.preparations.discarded_total == 0


async def test_close_while_an_invocation_is_in_flight_releases_it_cleanly() -> None:
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn())
        async with manager.invocation("c", "t1") as invocation:
            assert invocation.record([assistant("partial")]) == 1
            await foundation.aclose()
            with pytest.raises(FoundationClosedError):
                invocation.record([assistant("more")])
            assert manager.statistics().invocations == 1
        stats = manager.statistics()
        assert (stats.invocations, stats.contexts, stats.closed) == (0, 0, True)


async def test_two_concurrent_acloses_both_return_after_the_render_finished() -> None:
    """The second aclose waits for the first: neither returns while a thread renders."""
    gateway = BlockingGateway()
    returned: list[int] = []
    async with Foundation(gateway=gateway, close_grace_period=0) as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn())
        gateway.hold = True

        async def requester() -> None:
            with pytest.raises(FoundationClosedError):
                await manager.prepare(_req())

        async def closer() -> None:
            await foundation.aclose()
            returned.append(gateway.returned)

        async with anyio.create_task_group() as tg:
            tg.start_soon(requester)
            await anyio.to_thread.run_sync(gateway.entered.wait, 10)
            tg.start_soon(closer)
            tg.start_soon(closer)
            await anyio.wait_all_tasks_blocked()
            assert returned == []
            rendered = gateway.returned
            gateway.release.set()
        # Both returned only after the held render (and the rest of its prepare) ran.
        assert returned == [gateway.returned, gateway.returned] and returned[0] > rendered
        stats = manager.statistics()
        assert (
            stats.preparations.pending,
            stats.preparations.failed_total,
            stats.preparations.prepared_total,
        ) == (0, 1, 0)
        assert foundation.limiter.borrowed_tokens == 0


async def test_a_cancelled_second_aclose_delivers_its_cancellation_after_cleanup() -> None:
    """Cancellation paragraph: a cancelled aclose completes, then is cancelled (both calls)."""
    gateway = BlockingGateway()
    async with Foundation(gateway=gateway, close_grace_period=0) as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn())
        gateway.hold = True
        caught: list[bool] = []

        async def requester() -> None:
            with pytest.raises(FoundationClosedError):
                await manager.prepare(_req())

        async def cancelled_closer() -> None:
            with anyio.CancelScope() as scope:
                scope.cancel()
                await foundation.aclose()
            caught.append(scope.cancelled_caught)

        async with anyio.create_task_group() as tg:
            tg.start_soon(requester)
            await anyio.to_thread.run_sync(gateway.entered.wait, 10)
            tg.start_soon(foundation.aclose)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(cancelled_closer)
            await anyio.wait_all_tasks_blocked()
            assert caught == []  # still waiting for the first close
            gateway.release.set()
        assert caught == [True]
        assert manager.statistics().preparations.pending == 0


async def test_every_call_after_exit_raises_the_closed_error() -> None:
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn())
        prefix = await manager.prepare(_req())
    assert foundation.closed and manager.statistics().closed
    sync: tuple[Callable[[], object], ...] = (
        lambda: manager.accept_turn(_turn("t2")),
        lambda: manager.record("c", "t1", [assistant("a")]),
        lambda: manager.build(prefix, []),
        lambda: manager.remove_context("c"),
        lambda: manager.areas.attach("c", OneShotNotice("n")),
        lambda: manager.areas.route("c", {"role": "assistant", "content": "x"}),
    )
    for attempt in sync:
        with pytest.raises(FoundationClosedError):
            attempt()
    # The history stays readable: the final view, taken at the close.
    assert manager.history("c").turn_ids == ("t1",)
    async_calls: tuple[Callable[[], Awaitable[PreparedContext]], ...] = (
        lambda: manager.prepare(_req()),
        lambda: manager.prepare_nowait(_req()),
    )
    for call in async_calls:
        with pytest.raises(FoundationClosedError):
            await call()
    with pytest.raises(FoundationClosedError):
        async with manager.invocation("c", "t1"):
            pass
    await foundation.aclose()  # idempotent after exit
    stats = manager.statistics()
    assert (stats.preparations.pending, stats.contexts, stats.preparations.prepared_total) == (
        0,
        0,
        1,
    )


CANCELLERS = ("scope", "fail_after", "task_group")
POINTS = ("commit", "queued", "render")


@pytest.mark.parametrize("nowait", [False, True], ids=["prepare", "prepare_nowait"])
@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("canceller", CANCELLERS)
async def test_cancelling_a_preparation_from_outside_settles_it_exactly(
    canceller: str, point: str, nowait: bool
) -> None:
    """Every await point x every way to cancel: exact slot counts, history unchanged,
    the render thread finishes (not abandoned), the result is discarded, and the
    next prepare of the turn works. ("queued": waiting in the render thread's queue
    behind another context's held render.)"""
    gateway = BlockingGateway()
    async with (
        Foundation(gateway=gateway, max_pending_preparations=3, worker_threads=1) as foundation,
        anyio.create_task_group() as holders,
    ):
        manager = foundation.manager
        manager.accept_turn(_turn())
        manager.record("c", "t1", [assistant("hello")])
        before = manager.history("c").turn_messages("t1")
        target = "t2" if point == "commit" else "t1"
        if point == "queued":
            manager.accept_turn(
                TurnSnapshot(
                    context_id="h", turn_id="t1", input=(user("x"),), instructions=(SYSTEM,)
                )
            )
            gateway.hold = True
            holders.start_soon(manager.prepare, _req_for("h"))
            await anyio.to_thread.run_sync(gateway.entered.wait, 10)
            gateway.hold = False
        elif point == "render":
            gateway.hold = True
        start = manager.prepare_nowait if nowait else manager.prepare
        rendered = gateway.returned
        outcome: list[str] = []

        async def parked() -> None:
            if point == "render":
                await anyio.to_thread.run_sync(gateway.entered.wait, 10)
            else:
                await anyio.wait_all_tasks_blocked()

        if canceller == "scope":
            with anyio.CancelScope() as scope:

                async def cancel() -> None:
                    await parked()
                    scope.cancel()

                async with anyio.create_task_group() as helper:
                    helper.start_soon(cancel)
                    await start(_req(target))
                    outcome.append("returned")
            assert scope.cancelled_caught
        elif canceller == "fail_after":
            # The deadline passes while the preparation is parked: it is moved to now once
            # the preparation parked (a short deadline could pass before, on a slow machine).
            deadlines: list[anyio.CancelScope] = []
            async with anyio.create_task_group() as helper:

                async def wait_out() -> None:
                    with pytest.raises(TimeoutError):
                        with anyio.fail_after(60) as deadline:
                            deadlines.append(deadline)
                            await start(_req(target))
                    outcome.append("timed out")

                helper.start_soon(wait_out)
                await parked()
                deadlines[0].deadline = anyio.current_time()
        else:
            async with anyio.create_task_group() as tg:

                async def requester() -> None:
                    await start(_req(target))
                    outcome.append("returned")

                tg.start_soon(requester)
                await parked()
                tg.cancel_scope.cancel()
        assert outcome == ([] if canceller != "fail_after" else ["timed out"])
        stats = manager.statistics()
        if point == "render":
            # Still owned: the thread has not finished; the slot is still taken.
            assert (stats.preparations.pending, stats.preparations.discarded_total) == (1, 0)
            gateway.hold = False
            gateway.release.set()
        elif point == "queued":
            # Settled at once (the thread skips it); the holder's render is still owned.
            assert (stats.preparations.pending, stats.preparations.discarded_total) == (1, 1)
            gateway.release.set()
        # The skipped job's batch may come back after the holder's preparation
        # settled: the render count goes then, bounded.
        with anyio.fail_after(10):
            while (
                manager.statistics().preparations.pending or manager._life.check_bound()._rendering
            ):
                await anyio.sleep(0.005)
        stats = manager.statistics()
        assert (stats.preparations.pending, stats.preparations.waiting_for_slot) == (0, 0)
        # Cancelled while waiting for its turn's commit, the call held no slot and
        # owned nothing: no preparation to discard.
        assert (
            stats.preparations.discarded_total,
            stats.preparations.prepared_total,
            stats.preparations.failed_total,
            stats.preparations.waiting_for_turn,
        ) == (0 if point == "commit" else 1, 1 if point == "queued" else 0, 0, 0)
        assert manager._life.check_bound().queue._waiters == {}
        if point == "render":
            assert gateway.returned > rendered  # the render thread ran to its end
        assert manager.history("c").turn_ids == ("t1",)
        assert manager.history("c").turn_messages("t1") == before
        prepared = await manager.prepare_nowait(_req("t1"))
        # Up to the turn's input, then the runtime-state pair (outputs are the continuation).
        assert [i["role"] for i in prepared.items] == ["system", "user", "assistant", "tool"]
        assert manager.statistics().preparations.prepared_total == (2 if point == "queued" else 1)


async def test_cancelling_the_host_of_a_rendering_foundation_waits_for_the_thread() -> None:
    """The scope around ``async with Foundation()`` is cancelled mid-render: the exit
    waits for the worker thread (never abandoned), then the scope absorbs the
    cancellation; nothing leaks."""
    gateway = BlockingGateway()
    box: dict[str, Any] = {}
    host_done = anyio.Event()

    async def host() -> None:
        with anyio.CancelScope() as scope:
            box["scope"] = scope
            async with Foundation(gateway=gateway) as foundation:
                box["foundation"] = foundation
                foundation.manager.accept_turn(_turn())
                gateway.hold = True
                await foundation.manager.prepare(_req())
        box["caught"] = scope.cancelled_caught
        host_done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(host)
        await anyio.to_thread.run_sync(gateway.entered.wait, 10)
        rendered = gateway.returned
        box["scope"].cancel()
        await anyio.wait_all_tasks_blocked()
        assert not host_done.is_set()  # the exit waits for the thread
        assert box["foundation"].manager.statistics().preparations.pending == 1
        gateway.release.set()
        with anyio.fail_after(10):
            await host_done.wait()
    foundation: Foundation = box["foundation"]
    stats = foundation.manager.statistics()
    assert box["caught"] is True
    assert gateway.returned > rendered
    assert (
        stats.preparations.pending,
        stats.preparations.discarded_total,
        stats.preparations.prepared_total,
        stats.closed,
    ) == (
        0,
        1,
        0,
        True,
    )
    assert foundation.limiter.borrowed_tokens == 0

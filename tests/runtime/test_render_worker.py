"""The Foundation's render worker: one persistent thread, fed in batches.

Invariants (DESIGN, performance model; seed 004 lifecycle): renders run off
the event loop in one thread per Foundation, which takes every render queued
while it worked as one batch and hands the batch back with one wake-up of the
loop; a render that raises fails its own preparation with the error it raised
and the thread keeps serving; a requester that leaves before its render began
renders nothing and frees its slot; the thread never outlives ``aclose``.
"""

from __future__ import annotations

import threading

import anyio
import pytest

from tests.runtime.helpers import BlockingGateway, user
from turnloom.context import LastNTurns, Message, NativeContent, ToolCallPart
from turnloom.errors import ProviderRuleError
from turnloom.runtime import ContextPrepareRequest, Foundation, PreparedContext, TurnSnapshot
from turnloom.runtime._preparing import Preparer
from turnloom.runtime.state import state_call_id

pytestmark = pytest.mark.anyio

_THREAD = "turnloom-render"


def _render_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == _THREAD]


def _preparer(foundation: Foundation) -> Preparer:
    return foundation.manager._life.check_bound()


def _turn(context_id: str, turn_id: str = "t1") -> TurnSnapshot:
    return TurnSnapshot(context_id=context_id, turn_id=turn_id, input=(user(f"hi {context_id}"),))


def _request(context_id: str, turn_id: str = "t1") -> ContextPrepareRequest:
    # A loop budget gives the turn a runtime-state pair, which the worker
    # renders itself (the door's render cached the history's messages).
    return ContextPrepareRequest(context_id=context_id, turn_id=turn_id, loop_budget=1)


class _WorkerSideGateway(BlockingGateway):
    """Records the state-pair call ids the worker thread rendered; may refuse some."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = threading.get_ident()
        self.worker_calls: list[str] = []
        self.refuse: set[str] = set()  # state-pair call ids whose worker render raises

    def render(self, message: Message) -> list[NativeContent]:
        if threading.get_ident() != self.loop:
            for part in message.content:
                if isinstance(part, ToolCallPart):
                    self.worker_calls.append(part.call_id)
                    if part.call_id in self.refuse:
                        raise ProviderRuleError(f"Refused {part.call_id} in the worker.")
        return super().render(message)


def _pair_id(context_id: str) -> str:
    return state_call_id(context_id, "t1")


async def test_one_thread_per_foundation_and_none_after_aclose() -> None:
    """Many prepares use one thread; two Foundations use two; aclose joins each.

    (A gateway of the host's own renders every prepare in the worker, never inline.)
    """
    assert _render_threads() == []
    async with (
        Foundation(gateway=BlockingGateway()) as first,
        Foundation(gateway=BlockingGateway()) as second,
    ):
        for foundation in (first, second):
            manager = foundation.manager
            async with anyio.create_task_group() as group:
                for number in range(12):
                    manager.accept_turn(_turn(f"c{number}"))
                    group.start_soon(manager.prepare, _request(f"c{number}"))
        threads = _render_threads()
        assert len(threads) == 2
        assert (_preparer(first).worker.jobs, _preparer(second).worker.jobs) == (12, 12)
        await first.aclose()
        assert _render_threads() == [t for t in threads if t.is_alive()]
        assert len(_render_threads()) == 1
    assert _render_threads() == []
    assert not _preparer(first).worker.alive and not _preparer(second).worker.alive


async def test_no_thread_starts_before_the_first_render() -> None:
    """Opening and closing a Foundation that never rendered starts no thread."""
    async with Foundation() as foundation:
        foundation.manager.accept_turn(_turn("c"))
        assert _render_threads() == []
    assert _render_threads() == []


async def test_renders_queued_while_the_thread_works_come_back_as_one_batch() -> None:
    """Exact batches: a held render is one batch; three queued behind it are the next."""
    gateway = _WorkerSideGateway()
    received: dict[str, PreparedContext] = {}
    async with Foundation(gateway=gateway, max_pending_preparations=8) as foundation:
        manager = foundation.manager
        worker = _preparer(foundation).worker

        async def prepare(context_id: str) -> None:
            received[context_id] = await manager.prepare(_request(context_id))

        for context_id in ("a", "b", "c", "d"):
            manager.accept_turn(_turn(context_id))
        gateway.hold = True
        async with anyio.create_task_group() as group:
            group.start_soon(prepare, "a")
            await anyio.to_thread.run_sync(gateway.entered.wait, 10)
            gateway.hold = False
            for context_id in ("b", "c", "d"):
                group.start_soon(prepare, context_id)
            await anyio.wait_all_tasks_blocked()
            assert (worker.batches, worker.jobs) == (0, 0)
            gateway.release.set()
        assert (worker.batches, worker.jobs) == (2, 4)
        assert sorted(received) == ["a", "b", "c", "d"]
        assert manager.statistics().preparations.prepared_total == 4


async def test_a_render_that_raises_fails_its_preparation_and_the_thread_keeps_serving() -> None:
    """The requester gets the render's typed error; the batch's other renders and every
    later one are delivered by the same thread; the slot is freed and no render is
    left counted in the thread."""
    gateway = _WorkerSideGateway()
    gateway.refuse = {_pair_id("bad")}
    outcomes: dict[str, object] = {}
    async with Foundation(gateway=gateway) as foundation:
        manager = foundation.manager
        worker = _preparer(foundation).worker

        async def prepare(context_id: str) -> None:
            try:
                outcomes[context_id] = await manager.prepare(_request(context_id))
            except ProviderRuleError as exc:
                outcomes[context_id] = exc

        for context_id in ("bad", "ok1", "ok2"):
            manager.accept_turn(_turn(context_id))
        async with anyio.create_task_group() as group:
            for context_id in ("bad", "ok1", "ok2"):
                group.start_soon(prepare, context_id)
        thread = _render_threads()
        assert len(thread) == 1
        assert isinstance(outcomes["bad"], ProviderRuleError)
        assert isinstance(outcomes["ok1"], PreparedContext)
        assert isinstance(outcomes["ok2"], PreparedContext)
        manager.accept_turn(_turn("ok3"))
        with anyio.fail_after(10):  # a thread that stopped serving would never answer
            later = await manager.prepare(_request("ok3"))
        assert later.items[0] == {"role": "user", "content": "hi ok3"}
        assert _render_threads() == thread  # the same thread served it
        stats = manager.statistics()
        assert (stats.preparations.failed_total, stats.preparations.prepared_total) == (1, 3)
        assert (stats.preparations.pending, _preparer(foundation)._rendering) == (0, 0)
        assert worker.jobs == 4


async def test_a_requester_that_leaves_while_queued_behind_a_render_renders_nothing() -> None:
    """Cancelled while its render waits in the worker's queue: it settles at once
    (discarded, slot freed) and the thread skips it."""
    gateway = _WorkerSideGateway()
    async with Foundation(gateway=gateway, max_pending_preparations=4) as foundation:
        manager = foundation.manager
        for context_id in ("held", "queued"):
            manager.accept_turn(_turn(context_id))
        gateway.hold = True
        async with anyio.create_task_group() as group:
            group.start_soon(manager.prepare, _request("held"))
            await anyio.to_thread.run_sync(gateway.entered.wait, 10)
            gateway.hold = False
            with anyio.CancelScope() as scope:

                async def cancel_when_parked() -> None:
                    await anyio.wait_all_tasks_blocked()
                    stats = manager.statistics().preparations
                    assert (stats.pending, _preparer(foundation)._rendering) == (2, 2)
                    scope.cancel()

                group.start_soon(cancel_when_parked)
                await manager.prepare(_request("queued"))
            assert scope.cancelled_caught
            stats = manager.statistics().preparations
            assert (stats.pending, stats.discarded_total) == (1, 1)
            # Its job stays in the thread's queue (skipped there) until its batch is back.
            assert _preparer(foundation)._rendering == 2
            gateway.release.set()
        worker = _preparer(foundation).worker
        stats = manager.statistics().preparations
        assert (stats.pending, stats.prepared_total, stats.discarded_total) == (0, 1, 1)
        # The skipped job's batch may come back after the held render's requester
        # resumed: its count goes then, bounded.
        with anyio.fail_after(10):
            while _preparer(foundation)._rendering:
                await anyio.sleep(0.001)
    # Joined by the close: every batch came back (the skipped job's, empty, may
    # come back after the held render's requester resumed).
    assert (worker.batches, worker.jobs) == (2, 2)
    assert gateway.worker_calls == [_pair_id("held")]


async def test_close_lets_the_worker_finish_its_batch_then_joins_it() -> None:
    """Closing while one render is held and one is queued behind it: both come
    back (their requesters get the closed error), then the thread is joined."""
    gateway = _WorkerSideGateway()
    errors: list[str] = []
    async with Foundation(gateway=gateway, close_grace_period=0) as foundation:
        manager = foundation.manager
        for context_id in ("held", "queued"):
            manager.accept_turn(_turn(context_id))

        async def prepare(context_id: str) -> None:
            try:
                await manager.prepare(_request(context_id))
            except Exception as exc:
                errors.append(type(exc).__name__)

        gateway.hold = True
        async with anyio.create_task_group() as group:
            group.start_soon(prepare, "held")
            await anyio.to_thread.run_sync(gateway.entered.wait, 10)
            gateway.hold = False
            group.start_soon(prepare, "queued")
            await anyio.wait_all_tasks_blocked()

            async def release_soon() -> None:
                await anyio.wait_all_tasks_blocked()
                gateway.release.set()

            group.start_soon(release_soon)
            await foundation.aclose()
            assert _render_threads() == []
        worker = _preparer(foundation).worker
        assert (worker.batches, worker.jobs) == (2, 2)
        assert errors == ["FoundationClosedError", "FoundationClosedError"]
        assert gateway.worker_calls == [_pair_id("held"), _pair_id("queued")]
        stats = manager.statistics().preparations
        assert (stats.pending, stats.failed_total) == (0, 2)
        assert _preparer(foundation)._rendering == 0


class _HoldInThread:
    """A token counter that, while ``hold`` is set, blocks the render thread (never the loop)."""

    def __init__(self) -> None:
        self.loop = threading.get_ident()
        self.hold = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def count(self, messages: object) -> int:
        if self.hold and threading.get_ident() != self.loop:
            self.entered.set()
            self.release.wait(10)
        return 1


@pytest.mark.parametrize("worker_threads", [1, 2])
async def test_the_inline_gate_counts_the_renders_in_the_thread(worker_threads: int) -> None:
    """A small prepare of a built-in gateway renders inline only while fewer than
    ``worker_threads`` renders are in the render thread (else it queues there);
    the count of renders in the thread is exact at each step and 0 after."""
    counter = _HoldInThread()
    async with Foundation(
        token_counter=counter, worker_threads=worker_threads, max_pending_preparations=4
    ) as foundation:
        manager = foundation.manager
        preparer = _preparer(foundation)
        worker = preparer.worker
        for context_id in ("a", "b", "c"):
            manager.accept_turn(_turn(context_id))
        # Fill the thread: a scoped prepare never renders inline.
        counter.hold = True
        async with anyio.create_task_group() as group:
            group.start_soon(
                manager.prepare,
                ContextPrepareRequest(
                    context_id="a", turn_id="t1", loop_budget=1, scope=LastNTurns(1)
                ),
            )
            await anyio.to_thread.run_sync(counter.entered.wait, 10)
            assert preparer._rendering == 1
            # One more small prepare: inline when 1 < worker_threads, else queued.
            group.start_soon(manager.prepare, _request("b"))
            await anyio.wait_all_tasks_blocked()
            if worker_threads == 1:
                assert preparer._rendering == 2  # "b" waits in the thread's queue
            else:
                assert preparer._rendering == 1  # "b" rendered inline, on the loop
                assert manager.statistics().preparations.prepared_total == 1
            counter.hold = False
            counter.release.set()
        assert preparer._rendering == 0
        assert worker.jobs == (2 if worker_threads == 1 else 1)
        assert manager.statistics().preparations.prepared_total == 2

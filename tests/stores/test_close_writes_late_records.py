"""The close's last write: a record accepted while it writes is stored too (no silent loss).

``record`` is still accepted while the Foundation closes, until the manager
closes (step 5 of the closing order); the durable writer writes what is
queued at step 4. A record the manager accepted during that write must be in
the store after the close, and one offered once the leases are released must
raise, never vanish. Real SQLite file (asyncio and trio) and real Redis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import anyio
import pytest

from tests.runtime.helpers import assistant
from tests.stores.test_durable_contexts import CountingStore, snapshot
from turnloom.errors import FoundationClosedError, StoreError
from turnloom.runtime import Foundation
from turnloom.runtime.store import ContextStore, LogWrite
from turnloom.stores import open_context_store

pytestmark = pytest.mark.anyio


class GatedStore(CountingStore):
    """A real store whose next call of the armed method waits at a gate (``"append"``: the
    close's write in flight; ``"release"``: the close releasing the leases)."""

    def __init__(self, store: ContextStore) -> None:
        super().__init__(store)
        self.armed: str | None = None
        self.entered = anyio.Event()
        self.gate = anyio.Event()
        self.appended: list[int] = []  # records per append call
        self.released: list[str] = []

    async def _pass(self, method: str) -> None:
        if self.armed == method:
            self.armed = None
            self.entered.set()
            await self.gate.wait()

    async def release(self, leases: Mapping[str, int]) -> None:
        await self._pass("release")
        self.released.extend(leases)
        await super().release(leases)

    async def append(self, writes: Sequence[LogWrite]) -> Mapping[str, int | StoreError]:
        self.appended.append(sum(len(records) for *_, records in writes))
        await self._pass("append")
        return await super().append(writes)


def texts(foundation: Foundation, context_id: str) -> list[str]:
    view = foundation.manager.history(context_id)
    return [
        part.text  # type: ignore[union-attr]
        for turn in view.turn_ids
        for message in view.turn_messages(turn)
        for part in message.content
    ]


async def stored_texts(store: ContextStore, context_id: str) -> list[str]:
    """The texts of a context as another Foundation restores them from ``store``."""
    async with Foundation(store=store, lease_ttl=30) as other:
        assert await other.manager.leases.claim(context_id) is True
        return texts(other, context_id)


async def test_a_record_accepted_while_the_close_writes_is_stored(store_url: str) -> None:
    """Invariant: nothing the manager accepted is lost by the close that follows."""
    store = GatedStore(open_context_store(store_url))
    try:
        async with Foundation(store=store, lease_ttl=30) as foundation:
            manager = foundation.manager
            await manager.leases.claim("c")
            manager.accept_turn(snapshot("c", "t0", "where is my bag?"))
            await manager.leases.flush()  # the writer is idle

            async def record_and_close() -> None:
                # Queued, not written: the close's own write (no cycle of the
                # writer's began before the close asked for one) takes it.
                manager.record("c", "t0", [assistant("gate 4")])
                await foundation.aclose()

            store.armed = "append"
            async with anyio.create_task_group() as group:
                group.start_soon(record_and_close)
                await store.entered.wait()  # the close's write of the queue is in flight
                manager.record("c", "t0", [assistant("and desk 9")])  # accepted: no raise
                store.gate.set()
            assert store.released == ["c"]
        assert await stored_texts(store, "c") == ["where is my bag?", "gate 4", "and desk 9"]
        assert store.appended == [1, 1, 1]  # the question; "gate 4"; "and desk 9" after it
    finally:
        await store.aclose()


async def test_a_record_offered_once_the_leases_are_released_raises(store_url: str) -> None:
    """Invariant: a record the close can no longer write raises FoundationClosedError and
    changes nothing; what was accepted before it is stored."""
    store = GatedStore(open_context_store(store_url))
    try:
        async with Foundation(store=store, lease_ttl=30) as foundation:
            manager = foundation.manager
            await manager.leases.claim("c")
            manager.accept_turn(snapshot("c", "t0", "where is my bag?"))
            manager.record("c", "t0", [assistant("gate 4")])
            store.armed = "release"
            async with anyio.create_task_group() as group:
                group.start_soon(foundation.aclose)
                await store.entered.wait()  # written; the leases are being released
                with pytest.raises(FoundationClosedError, match="closing"):
                    manager.record("c", "t0", [assistant("and desk 9")])
                assert texts(foundation, "c") == ["where is my bag?", "gate 4"]
                store.gate.set()
        assert await stored_texts(store, "c") == ["where is my bag?", "gate 4"]
    finally:
        await store.aclose()


async def test_an_invocations_record_once_the_leases_are_released_raises(store_url: str) -> None:
    """Invariant: an open invocation's record the close can no longer write raises
    FoundationClosedError and changes nothing (it is never accepted unstored)."""
    store = GatedStore(open_context_store(store_url))
    try:
        async with Foundation(store=store, lease_ttl=30) as foundation:
            manager = foundation.manager
            await manager.leases.claim("c")
            manager.accept_turn(snapshot("c", "t0", "where is my bag?"))
            async with manager.invocation("c", "t0") as invocation:
                invocation.record([assistant("gate 4")])
                store.armed = "release"
                async with anyio.create_task_group() as group:
                    group.start_soon(foundation.aclose)
                    await store.entered.wait()  # written; the leases are being released
                    with pytest.raises(FoundationClosedError, match="closing"):
                        invocation.record([assistant("and desk 9")])
                    assert texts(foundation, "c") == ["where is my bag?", "gate 4"]
                    store.gate.set()
        assert await stored_texts(store, "c") == ["where is my bag?", "gate 4"]
    finally:
        await store.aclose()


class FailingStore(GatedStore):
    """A real store whose appends and releases raise a StoreError while ``failing`` is set."""

    failing = False

    async def append(self, writes: Sequence[LogWrite]) -> Mapping[str, int | StoreError]:
        if self.failing:
            self.appended.append(-1)
            raise StoreError("the server went away")
        return await super().append(writes)

    async def release(self, leases: Mapping[str, int]) -> None:
        if self.failing:
            self.released.extend(leases)
            raise StoreError("the server is still away")
        await super().release(leases)


async def test_a_store_failure_during_the_close_is_reported_and_the_close_completes(
    store_url: str,
) -> None:
    """Invariant: the close's failed write and failed release are each handed once to
    ``leases.on_error`` (not raised; the write is not retried until the grace period ends);
    what was written before is stored, and the record it could not write is all that is
    missing."""
    store = FailingStore(open_context_store(store_url))
    reported: list[StoreError] = []
    try:
        async with Foundation(store=store, lease_ttl=0.5, close_grace_period=30) as foundation:
            manager = foundation.manager
            manager.leases.on_error = reported.append
            await manager.leases.claim("c")
            manager.accept_turn(snapshot("c", "t0", "where is my bag?"))
            await manager.leases.flush()
            manager.record("c", "t0", [assistant("gate 4")])
            store.failing = True
            with anyio.fail_after(10):  # the failure ends the close's writes at once
                await foundation.aclose()
            assert [str(error) for error in reported] == [
                "the server went away",
                "the server is still away",
            ]
            assert store.released == ["c"]
            with pytest.raises(FoundationClosedError):
                manager.record("c", "t0", [assistant("and desk 9")])
        assert store.appended == [1, -1]
        store.failing = False
        await anyio.sleep(0.6)  # the lease the close could not release expires by itself
        assert await stored_texts(store, "c") == ["where is my bag?"]
    finally:
        await store.aclose()


async def test_a_record_is_stored_when_the_foundations_scope_is_cancelled(store_url: str) -> None:
    """Invariant: cancelling the scope the Foundation was opened in (which cancels the
    durable writer with the Foundation's task group) loses no accepted record: the close
    writes the queue itself, at once. (It waited for the writer that was gone, until the
    grace period ended, forever with an unbounded one, then released the lease: the
    record unwritten, nothing reported.)"""
    store = CountingStore(open_context_store(store_url))
    reported: list[StoreError] = []
    try:
        with anyio.CancelScope() as scope:
            async with Foundation(store=store, lease_ttl=30, close_grace_period=2) as foundation:
                manager = foundation.manager
                manager.leases.on_error = reported.append
                await manager.leases.claim("c")
                manager.accept_turn(snapshot("c", "t0", "where is my bag?"))
                await manager.leases.flush()  # the writer is idle
                manager.record("c", "t0", [assistant("gate 4")])  # queued
                scope.cancel()
                await anyio.sleep(1)  # cancelled here, with the writer
        assert scope.cancelled_caught
        assert reported == []
        assert await stored_texts(store, "c") == ["where is my bag?", "gate 4"]
    finally:
        await store.aclose()

"""Hostile hosts against the durable side: silent losses, hangs and fencing violations.

Each test names the invariant it checks. Real SQLite file (asyncio and trio)
and real Redis (asyncio) through the ``store_url`` fixture. The first six
failed before their fixes (each docstring says what happened then).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import anyio
import pytest

from tests.runtime.helpers import assistant
from tests.stores.helpers import cancel_when_entered, expire_lease
from tests.stores.test_close_writes_late_records import stored_texts, texts
from tests.stores.test_durable_contexts import CountingStore, snapshot
from turnloom.errors import (
    FoundationClosedError,
    StaleLeaseError,
    StoreError,
)
from turnloom.runtime import Foundation
from turnloom.runtime.store import ContextStore, LogWrite
from turnloom.stores import open_context_store

pytestmark = pytest.mark.anyio


class GateStore(CountingStore):
    """A real store; the next call of each armed method waits at its own gate."""

    def __init__(self, store: ContextStore) -> None:
        super().__init__(store)
        self.gates: dict[str, tuple[anyio.Event, anyio.Event]] = {}
        self.calls: list[str] = []

    def arm(self, method: str) -> tuple[anyio.Event, anyio.Event]:
        """Arm ``method``: returns (entered, gate)."""
        pair = self.gates[method] = (anyio.Event(), anyio.Event())
        return pair

    async def _pass(self, method: str) -> None:
        self.calls.append(method)
        pair = self.gates.pop(method, None)
        if pair is not None:
            pair[0].set()
            await pair[1].wait()

    async def acquire(self, context_id: str, owner: str, ttl: float) -> int:
        await self._pass("acquire")
        return await super().acquire(context_id, owner, ttl)

    async def renew(self, leases: Mapping[str, int], ttl: float) -> frozenset[str]:
        await self._pass("renew")
        return await super().renew(leases, ttl)

    async def release(self, leases: Mapping[str, int]) -> None:
        await self._pass("release")
        await super().release(leases)

    async def append(self, writes: Sequence[LogWrite]) -> Mapping[str, int | StoreError]:
        await self._pass("append")
        return await super().append(writes)

    async def replace(
        self, context_id: str, token: int, length: int, records: tuple[bytes, ...]
    ) -> bool:
        await self._pass("replace")
        return await super().replace(context_id, token, length, records)

    async def load(self, context_id: str) -> tuple[bytes, ...]:
        await self._pass("load")
        return await super().load(context_id)

    async def forget(self, context_id: str, token: int) -> bool:
        await self._pass("forget")
        return await super().forget(context_id, token)


async def seed(store: ContextStore, context_id: str, *texts_: str) -> None:
    """Store a context with one turn t0 and the given answers, then close."""
    async with Foundation(store=store, lease_ttl=30) as foundation:
        manager = foundation.manager
        await manager.leases.claim(context_id)
        manager.accept_turn(snapshot(context_id, "t0", "where is my bag?"))
        if texts_:
            manager.record(context_id, "t0", [assistant(t) for t in texts_])
        await manager.leases.flush()


# -- findings ---------------------------------------------------------------------


async def test_flush_after_a_background_write_was_refused_raises(store_url: str) -> None:
    """Invariant: ``flush()`` returns only when every change made before it is in the store.
    A record the writer's background cycle had refused (another owner took the lease)
    is not in the store: the refusal goes to ``leases.on_error`` and the next flush
    raises StaleLeaseError, once (it returned None, acknowledging it, nothing reported)."""
    store = CountingStore(open_context_store(store_url))
    reported: list[StoreError] = []
    try:
        async with Foundation(store=store, lease_ttl=30, owner="host-a") as host_a:
            a = host_a.manager
            a.leases.on_error = reported.append
            await a.leases.claim("c")
            a.accept_turn(snapshot("c", "t0", "where is my bag?"))
            await a.leases.flush()
            expire_lease(store_url, "c")  # host A stalled past its lease
            async with Foundation(store=store, lease_ttl=30, owner="host-b") as host_b:
                assert await host_b.manager.leases.claim("c") is True
                a.record("c", "t0", [assistant("gate 4")])  # accepted: no raise
                with anyio.fail_after(5):  # the writer's own cycle sends it; the store refuses
                    while not reported:
                        await anyio.sleep(0.01)
                assert a.context_ids() == ()  # refused: "c" left A's memory
                assert [(type(e), e.context_id) for e in reported] == [(StaleLeaseError, "c")]
                with anyio.fail_after(5), pytest.raises(StaleLeaseError, match="refused"):
                    await a.leases.flush()
                with anyio.fail_after(5):
                    await a.leases.flush()  # raised once: nothing else is owed
                assert texts(host_b, "c") == ["where is my bag?"]
    finally:
        await store.aclose()


async def test_a_renewal_that_finds_the_lease_lost_does_not_let_flush_acknowledge(
    store_url: str,
) -> None:
    """Invariant: records accepted before the maintenance loop found the lease lost (a
    failed renewal) and dropped from the queue are reported once to ``leases.on_error``
    and the next ``flush()`` raises StaleLeaseError; it never returns as if they were
    stored (it returned None, nothing reported)."""
    store = GateStore(open_context_store(store_url))
    reported: list[StoreError] = []
    try:
        async with Foundation(store=store, lease_ttl=0.6, owner="host-a") as host_a:
            a = host_a.manager
            a.leases.on_error = reported.append
            await a.leases.claim("c")
            a.accept_turn(snapshot("c", "t0", "where is my bag?"))
            await a.leases.flush()
            entered, gate = store.arm("append")
            a.record("c", "t0", [assistant("gate 4")])  # queued; its append waits at the gate
            with anyio.fail_after(5):
                await entered.wait()
            expire_lease(store_url, "c")
            with anyio.fail_after(5):
                while "c" in a.leases._durable.claimed():  # type: ignore[union-attr]
                    await anyio.sleep(0.05)  # the renewal finds the lease lost
            gate.set()
            await anyio.sleep(0.1)
            # One loss, one report: the append refused after it adds none.
            assert [(type(e), e.context_id) for e in reported] == [(StaleLeaseError, "c")]
            assert "renewed" in str(reported[0])
            with anyio.fail_after(5), pytest.raises(StaleLeaseError):
                await a.leases.flush()
        assert await stored_texts(store, "c") == ["where is my bag?"]
    finally:
        await store.aclose()


async def test_a_context_removed_is_not_restored_by_a_claim_during_the_removal(
    store_url: str,
) -> None:
    """Invariant: after ``remove_context`` a claim of the same id (here, while the writer
    deletes the removed log) restores nothing: the context is new, and after the close the
    store holds no trace of the removed turns. (The claim restored them, and the removal,
    refused for the claim's new token, never deleted them.)"""
    store = GateStore(open_context_store(store_url))
    try:
        async with Foundation(store=store, lease_ttl=30) as foundation:
            manager = foundation.manager
            await manager.leases.claim("c")
            manager.accept_turn(snapshot("c", "t0", "my card number is 1234"))
            manager.record("c", "t0", [assistant("noted")])
            await manager.leases.flush()
            entered, gate = store.arm("forget")
            manager.remove_context("c")
            with anyio.fail_after(5):
                await entered.wait()  # the writer deletes the removed log
            async with anyio.create_task_group() as group:

                async def reclaim() -> None:
                    with anyio.fail_after(5):
                        await manager.leases.claim("c")

                group.start_soon(reclaim)
                await anyio.sleep(0.2)
                gate.set()
            restored = manager.context_ids()
            await manager.leases.flush()
        assert restored == ()
        async with Foundation(store=store, lease_ttl=30) as other:
            assert await other.manager.leases.claim("c") is True
            assert other.manager.context_ids() == ()  # nothing stored
    finally:
        await store.aclose()


async def test_a_claim_that_completes_while_the_close_releases_takes_no_record(
    store_url: str,
) -> None:
    """Invariant: a claim in flight when the Foundation closes never leaves a context
    writable after the close released the leases: a record offered then raises
    FoundationClosedError (never accepted and left unwritten), and no lease outlives
    the close."""
    store = GateStore(open_context_store(store_url))
    try:
        await seed(store, "d")
        outcome: list[str] = []
        async with Foundation(store=store, lease_ttl=30, owner="host-a") as foundation:
            manager = foundation.manager
            await manager.leases.claim("c")
            manager.accept_turn(snapshot("c", "t0", "hi"))
            await manager.leases.flush()
            load_in, load_gate = store.arm("load")
            release_in, release_gate = store.arm("release")

            async def claim_then_record() -> None:
                try:
                    await manager.leases.claim("d")
                except Exception as exc:
                    outcome.append(type(exc).__name__)
                    return
                outcome.append("claimed")
                try:
                    manager.record("d", "t0", [assistant("gate 4")])
                    outcome.append("recorded")
                except FoundationClosedError:
                    outcome.append("FoundationClosedError")

            async with anyio.create_task_group() as group:
                group.start_soon(claim_then_record)
                with anyio.fail_after(5):
                    await load_in.wait()  # the claim loads d's log
                group.start_soon(foundation.aclose)
                with anyio.fail_after(5):
                    await release_in.wait()  # the close wrote the queue; releases the leases
                load_gate.set()
                with anyio.fail_after(5):
                    while not outcome or outcome[-1] == "claimed":
                        await anyio.sleep(0.01)
                release_gate.set()
        # It was ["claimed", "recorded"]: "gate 4" in the manager's final history, never
        # written, nothing reported; and d's lease outlived the close (30 s).
        assert outcome in (["FoundationClosedError"], ["claimed", "FoundationClosedError"])
        with anyio.fail_after(5):
            assert await stored_texts(store, "d") == ["where is my bag?"]  # LeaseHeldError
    finally:
        await store.aclose()


async def test_a_write_refused_at_the_close_is_reported(store_url: str) -> None:
    """Invariant: a record the close could not write (the store refused it: another owner
    took the lease) is reported to ``leases.on_error`` (the host calls no flush after the
    close); the close does not swallow it."""
    store = CountingStore(open_context_store(store_url))
    reported: list[BaseException] = []
    try:
        async with Foundation(store=store, lease_ttl=30, owner="host-b") as host_b:
            async with Foundation(store=store, lease_ttl=30, owner="host-a") as host_a:
                a = host_a.manager
                a.leases.on_error = reported.append
                await a.leases.claim("c")
                a.accept_turn(snapshot("c", "t0", "where is my bag?"))
                await a.leases.flush()
                expire_lease(store_url, "c")
                assert await host_b.manager.leases.claim("c") is True
                a.record("c", "t0", [assistant("gate 4")])  # accepted; the close writes it
            assert texts(host_b, "c") == ["where is my bag?"]
        # It was [] -- the close's flush raised StaleLeaseError and the close swallowed it.
        assert [(type(e), e.context_id) for e in reported] == [(StaleLeaseError, "c")]
    finally:
        await store.aclose()


async def test_a_claim_cancelled_during_its_compaction_releases_the_lease(store_url: str) -> None:
    """Invariant (``Leases.claim``, Cancellation): a cancelled claim releases the lease it
    took and leaves the context as it was (not held). Here the cancellation arrives while
    the claim compacts the long log it restored."""
    store = GateStore(open_context_store(store_url))
    try:
        # The first host never compacts (its replace always fails): the log stays long.
        async with Foundation(store=NoReplace(store.inner), lease_ttl=30) as first:
            manager = first.manager
            await manager.leases.claim("d")
            manager.accept_turn(snapshot("d", "t0", "where is my bag?"))
            for i in range(80):
                manager.record("d", "t0", [assistant(f"a{i}")])
            await manager.leases.flush()
            await manager.leases.release("d")
        async with Foundation(store=store, lease_ttl=30, owner="host-a") as foundation:
            manager = foundation.manager
            entered, gate = store.arm("replace")
            # Cancelled once restored, while it compacts the 82-record log.
            await cancel_when_entered(lambda: manager.leases.claim("d"), entered, gate.set)
            held = manager.context_ids()
            # It was ("d",): the claim was cancelled yet the context held, its lease kept.
            assert held == ()
    finally:
        await store.aclose()


class NoReplace(CountingStore):
    """A real store whose ``replace`` always fails: logs are never compacted."""

    async def replace(
        self, context_id: str, token: int, length: int, records: tuple[bytes, ...]
    ) -> bool:
        raise StoreError("no compaction here")


# -- attacks that passed ------------------------------------------------------------


async def test_idle_unloading_waits_for_an_open_invocation(store_url: str) -> None:
    """Invariant: ``idle_after`` never unloads a context while a model call is in flight;
    what the call records is stored."""
    store = CountingStore(open_context_store(store_url))
    try:
        # A lease far longer than the wait: a loaded machine's late renewal must not
        # lose it (that is another test's subject); only idle_after is tested here.
        async with Foundation(store=store, lease_ttl=10, idle_after=0.2) as foundation:
            manager = foundation.manager
            await manager.leases.claim("c")
            manager.accept_turn(snapshot("c", "t0", "where is my bag?"))
            async with manager.invocation("c", "t0") as invocation:
                await anyio.sleep(0.8)  # idle far past idle_after (checked every 0.1 s)
                assert manager.context_ids() == ("c",)
                invocation.record([assistant("gate 4")])
            await manager.leases.flush()
        assert await stored_texts(store, "c") == ["where is my bag?", "gate 4"]
    finally:
        await store.aclose()


class FailOnNth(CountingStore):
    """A real store whose ``method`` raises a StoreError on its ``nth`` call (1-based)."""

    def __init__(self, store: ContextStore, method: str, nth: int) -> None:
        super().__init__(store)
        self.method, self.nth, self.count = method, nth, 0

    def _tick(self, method: str) -> None:
        if method == self.method:
            self.count += 1
            if self.count == self.nth:
                raise StoreError(f"{method} failed once")

    async def load(self, context_id: str) -> tuple[bytes, ...]:
        self._tick("load")
        return await super().load(context_id)

    async def append(self, writes: Sequence[LogWrite]) -> Mapping[str, int | StoreError]:
        self._tick("append")
        return await super().append(writes)

    async def release(self, leases: Mapping[str, int]) -> None:
        self._tick("release")
        await super().release(leases)

    async def replace(
        self, context_id: str, token: int, length: int, records: tuple[bytes, ...]
    ) -> bool:
        self._tick("replace")
        return await super().replace(context_id, token, length, records)


async def test_a_failed_load_during_a_claim_releases_the_lease(store_url: str) -> None:
    """Invariant: a claim whose load fails raises StoreError and releases the lease it took:
    another owner claims the context at once."""
    store = FailOnNth(open_context_store(store_url), "load", 1)
    try:
        await seed(store.inner, "d", "gate 4")
        async with Foundation(store=store, lease_ttl=30, owner="host-a") as foundation:
            with pytest.raises(StoreError, match="load failed once"):
                await foundation.manager.leases.claim("d")
            assert foundation.manager.context_ids() == ()
            async with Foundation(store=store, lease_ttl=30, owner="host-b") as other:
                assert await other.manager.leases.claim("d") is True
                assert texts(other, "d") == ["where is my bag?", "gate 4"]
    finally:
        await store.aclose()


async def test_a_failed_append_is_retried_and_nothing_is_lost(store_url: str) -> None:
    """Invariant: an append that fails is reported once to ``on_error``; the records stay
    queued and the next flush writes them."""
    store = FailOnNth(open_context_store(store_url), "append", 2)
    reported: list[StoreError] = []
    try:
        async with Foundation(store=store, lease_ttl=30) as foundation:
            manager = foundation.manager
            manager.leases.on_error = reported.append
            await manager.leases.claim("c")
            manager.accept_turn(snapshot("c", "t0", "where is my bag?"))
            await manager.leases.flush()
            manager.record("c", "t0", [assistant("gate 4")])
            with pytest.raises(StoreError, match="append failed once"):
                await manager.leases.flush()
            await manager.leases.flush()
        assert [str(e) for e in reported] == ["append failed once"]
        assert await stored_texts(store, "c") == ["where is my bag?", "gate 4"]
    finally:
        await store.aclose()


async def test_a_failed_compaction_loses_nothing(store_url: str) -> None:
    """Invariant: a compaction whose replace fails leaves a valid log: everything
    acknowledged is restored."""
    store = FailOnNth(open_context_store(store_url), "replace", 1)
    reported: list[StoreError] = []
    try:
        async with Foundation(store=store, lease_ttl=30) as foundation:
            manager = foundation.manager
            manager.leases.on_error = reported.append
            await manager.leases.claim("c")
            manager.accept_turn(snapshot("c", "t0", "where is my bag?"))
            for i in range(70):
                manager.record("c", "t0", [assistant(f"a{i}")])
            await manager.leases.flush()
            manager.record("c", "t0", [assistant("last")])
            await manager.leases.flush()
        assert len(reported) == 1
        stored = await stored_texts(store, "c")
        assert stored == ["where is my bag?", *(f"a{i}" for i in range(70)), "last"]
    finally:
        await store.aclose()


async def test_release_racing_a_record_keeps_the_record(store_url: str) -> None:
    """Invariant: a record made while ``leases.release`` writes the queue is either stored
    (release returns False, the context kept) or refused with a typed error."""
    store = GateStore(open_context_store(store_url))
    try:
        async with Foundation(store=store, lease_ttl=30) as foundation:
            manager = foundation.manager
            await manager.leases.claim("c")
            manager.accept_turn(snapshot("c", "t0", "where is my bag?"))
            entered, gate = store.arm("append")
            results: list[bool] = []
            async with anyio.create_task_group() as group:

                async def release() -> None:
                    results.append(await manager.leases.release("c"))

                group.start_soon(release)
                with anyio.fail_after(5):
                    await entered.wait()
                manager.record("c", "t0", [assistant("gate 4")])
                gate.set()
            assert results in ([True], [False])  # True: "gate 4" was written first
            await manager.leases.flush()
        assert await stored_texts(store, "c") == ["where is my bag?", "gate 4"]
    finally:
        await store.aclose()


async def test_the_close_while_a_claim_acquires_does_not_hang(store_url: str) -> None:
    """Invariant: a close while a claim waits for the store returns within the grace
    period; the claim then raises FoundationClosedError and its lease is released."""
    store = GateStore(open_context_store(store_url))
    try:
        async with Foundation(store=store, lease_ttl=30, close_grace_period=1) as foundation:
            manager = foundation.manager
            entered, gate = store.arm("acquire")
            async with anyio.create_task_group() as group:

                async def claim() -> None:
                    with anyio.fail_after(5), pytest.raises(FoundationClosedError):
                        await manager.leases.claim("c")

                group.start_soon(claim)
                with anyio.fail_after(5):
                    await entered.wait()
                with anyio.fail_after(5):
                    await foundation.aclose()
                gate.set()
        async with Foundation(store=store, lease_ttl=30, owner="host-b") as other:
            assert await other.manager.leases.claim("c") is True  # released: not held
    finally:
        await store.aclose()


async def test_a_removal_whose_write_is_cancelled_with_the_writer_is_written_by_the_close(
    store_url: str,
) -> None:
    """Invariant: a ``remove_context`` whose deletion was in flight when the Foundation's
    scope was cancelled (the writer cancelled mid-cycle) is still written by the close:
    no later claim restores the removed turns. (The cancelled cycle dropped its list of
    removals: the log stayed in the store.)"""
    store = GateStore(open_context_store(store_url))
    try:
        with anyio.CancelScope() as scope:
            async with Foundation(store=store, lease_ttl=30, close_grace_period=5) as foundation:
                manager = foundation.manager
                await manager.leases.claim("c")
                manager.accept_turn(snapshot("c", "t0", "my card number is 1234"))
                await manager.leases.flush()
                entered, _ = store.arm("forget")  # never opened: the cancellation ends it
                manager.remove_context("c")
                with anyio.fail_after(5):
                    await entered.wait()  # the writer deletes the removed log
                scope.cancel()
                await anyio.sleep(1)  # cancelled here, with the writer
        assert scope.cancelled_caught
        assert store.calls.count("forget") == 2  # the cancelled one, then the close's
        async with Foundation(store=store, lease_ttl=30) as other:
            assert await other.manager.leases.claim("c") is True
            assert other.manager.context_ids() == ()  # nothing stored
    finally:
        await store.aclose()

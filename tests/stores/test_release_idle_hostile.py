"""Hostile hosts against ``leases.release``, idle unloading and ``leases.flush``: store
failures and host cancellation at each of their awaits.

Real SQLite file (asyncio and trio) and real Redis (asyncio) through ``store_url``; a
store call is held at a gate (``GateStore``) to put the host's cancellation, or a
failure, exactly at one await. Each test names the contract it checks. The tests under
"findings" fail on the code they were written against; those under "attacks that held"
pass and cover awaits no other test covers.
"""

from __future__ import annotations

import anyio
import pytest

from tests.runtime.helpers import assistant
from tests.stores.helpers import cancel_when_entered, expire_lease
from tests.stores.test_close_writes_late_records import stored_texts, texts
from tests.stores.test_durable_contexts import snapshot
from tests.stores.test_durable_hostile import FailOnNth, GateStore
from turnloom.errors import LeaseHeldError, StaleLeaseError, StoreError
from turnloom.runtime import ContextPrepareRequest, Foundation
from turnloom.stores import open_context_store

pytestmark = pytest.mark.anyio


async def _until(predicate: object, timeout: float = 10) -> None:
    with anyio.fail_after(timeout):
        while not predicate():  # type: ignore[operator]
            await anyio.sleep(0.01)


async def _claim_elsewhere(store: object, context_id: str) -> str:
    """Another host's claim of ``context_id``: "claimed" or the error's type name."""
    async with Foundation(store=store, lease_ttl=30, owner="host-b") as other:  # type: ignore[arg-type]
        try:
            with anyio.fail_after(5):
                await other.manager.leases.claim(context_id)
        except LeaseHeldError:
            return "LeaseHeldError"
        return "claimed"


# -- findings ---------------------------------------------------------------------------


async def test_a_release_cancelled_while_it_gives_up_the_lease_is_done_or_undone(
    store_url: str,
) -> None:
    """Contract (DESIGN.md, rule 5, and docs/guarantees.md): "Cancellation never corrupts
    state. Every operation either completes or leaves the state as it was."; and
    ``leases.release``: once the context left memory, "the store's lease release runs
    shielded and finishes even when the caller is cancelled".

    ``leases.release`` dropped the context from memory and then awaited the store's
    ``release`` unshielded: cancelled there, the context had left this host's memory while
    its lease was still held in the store, so no other host could claim it until the
    lease expired. Observed then: ``context_ids() == ()`` and host B got
    ``LeaseHeldError``. Now the cancelled release finishes once the store answers (the
    gate opens after the cancel): the context is gone here and host B claims it."""
    store = GateStore(open_context_store(store_url))
    try:
        async with Foundation(store=store, lease_ttl=30, owner="host-a") as foundation:
            manager = foundation.manager
            await manager.leases.claim("c")
            manager.accept_turn(snapshot("c", "t0", "where is my bag?"))
            await manager.leases.flush()
            entered, gate = store.arm("release")
            # Cancelled as it awaits the store's release; the store answers after that.
            await cancel_when_entered(lambda: manager.leases.release("c"), entered, gate.set)
            held = manager.context_ids()
            elsewhere = await _claim_elsewhere(store, "c")
        assert (held, elsewhere) == ((), "claimed")
    finally:
        await store.aclose()


async def test_a_cancelled_release_whose_store_never_answers_ends_at_the_lease_ttl(
    store_url: str,
) -> None:
    """Contract (``leases.release``): the shielded lease release "waits at most
    ``lease_ttl`` seconds (the lease has expired by then)"; the store's silence goes to
    ``on_error``. A store that never answers cannot hold a cancelled host forever, and
    once the release gave up, the lease has expired: host B claims the context."""
    store = GateStore(open_context_store(store_url))
    reported: list[BaseException] = []
    try:
        async with Foundation(store=store, lease_ttl=1, owner="host-a") as foundation:
            manager = foundation.manager
            manager.leases.on_error = reported.append
            await manager.leases.claim("c")
            manager.accept_turn(snapshot("c", "t0", "where is my bag?"))
            await manager.leases.flush()
            entered, _gate = store.arm("release")  # never opened
            with anyio.fail_after(10):
                await cancel_when_entered(lambda: manager.leases.release("c"), entered)
            held = manager.context_ids()
            elsewhere = await _claim_elsewhere(store, "c")
        assert (held, elsewhere) == ((), "claimed")
        assert [type(e).__name__ for e in reported] == ["StoreUnavailableError"]
        assert "within the lease's time to live (1.0 s)" in str(reported[0])
    finally:
        await store.aclose()


async def test_a_failed_release_during_idle_unloading_is_reported(store_url: str) -> None:
    """Contract (docs/durable.md, "Failures are typed and the writer keeps going"): store
    failures "reach the host at ``flush``, ``claim`` or ``aclose``, and through
    ``manager.leases.on_error = hook``, which gets every failure the background writer
    meets"; and "A store failure during the close's writes (or its release) goes to
    ``on_error``". ``leases.release`` reports a failed lease release (``_release_lease``).

    The idle unloading of the maintenance task swallows a failed ``store.release``
    (``except StoreError: pass``): nothing reaches the host, while the lease it failed to
    give up keeps every other host's claim out with ``LeaseHeldError`` until it expires.
    Observed: ``reported == []``; expected: the one StoreError ("release failed once")."""
    store = FailOnNth(open_context_store(store_url), "release", 1)
    reported: list[BaseException] = []
    try:
        async with Foundation(store=store, lease_ttl=30, idle_after=0.2) as foundation:
            manager = foundation.manager
            manager.leases.on_error = reported.append
            await manager.leases.claim("c")
            manager.accept_turn(snapshot("c", "t0", "where is my bag?"))
            await manager.leases.flush()
            await _until(lambda: store.count >= 1)  # idle: unloaded, its release failed
            assert manager.context_ids() == ()
            assert manager.leases.store is store
            stats = foundation.manager.statistics().store
            assert stats is not None and stats.idle_unloads_total == 1 and stats.claimed == 0
            assert [str(e) for e in reported] == ["release failed once"]
    finally:
        await store.aclose()


async def test_a_flush_cancelled_as_its_write_is_refused_leaves_the_loss_to_the_next_flush(
    store_url: str,
) -> None:
    """Contract (``Leases.on_error``): a lease lost with changes not yet written: "those
    changes are discarded and the context left memory; the next ``flush`` raises it too,
    unless a waiting one did." (docs/durable.md: "the next ``flush`` raises it, so no
    flush acknowledges them"); ``Leases.flush``, Cancellation: "The queued changes stay
    queued".

    A flush waits while the writer's append of a record is refused (another owner took
    the context); the host cancels that flush when its ``on_error`` hook hears of the loss
    (a supervisor tearing the session down). The writer hands the loss to the cancelled
    waiter and forgets it (``_dropped``), but that waiter never raises it; the next
    ``flush()`` returns normally, acknowledging a record that is not in the store.
    Observed: the second ``flush()`` returns None; expected: ``StaleLeaseError``."""
    store = GateStore(open_context_store(store_url))
    reported: list[BaseException] = []
    try:
        async with Foundation(store=store, lease_ttl=30, owner="host-b") as host_b:
            async with Foundation(store=store, lease_ttl=30, owner="host-a") as host_a:
                a = host_a.manager
                await a.leases.claim("c")
                a.accept_turn(snapshot("c", "t0", "where is my bag?"))
                await a.leases.flush()
                entered, gate = store.arm("append")
                a.record("c", "t0", [assistant("gate 4")])  # accepted; its append waits
                with anyio.fail_after(5):
                    await entered.wait()
                expire_lease(store_url, "c")  # host A stalled past its lease
                assert await host_b.manager.leases.claim("c") is True
                with anyio.CancelScope() as scope:

                    def hook(error: BaseException) -> None:
                        reported.append(error)
                        scope.cancel()  # the host gives up on the flush it waits for

                    a.leases.on_error = hook
                    async with anyio.create_task_group() as group:

                        async def flush() -> None:
                            await a.leases.flush()

                        group.start_soon(flush)
                        durable = a.leases._durable  # type: ignore[attr-defined]
                        await _until(lambda: durable._waiters)  # the flush waits
                        gate.set()  # the append goes on; the store refuses it
                        with anyio.fail_after(5):
                            await anyio.sleep_forever()
                assert scope.cancelled_caught
                assert [(type(e), e.context_id) for e in reported] == [(StaleLeaseError, "c")]
                outcome = "returned"
                try:
                    with anyio.fail_after(5):
                        await a.leases.flush()
                except StaleLeaseError:
                    outcome = "StaleLeaseError"
                assert outcome == "StaleLeaseError"
            assert texts(host_b, "c") == ["where is my bag?"]  # "gate 4" is not stored
    finally:
        await store.aclose()


# -- attacks that held ------------------------------------------------------------------


async def test_a_release_whose_write_fails_raises_and_keeps_the_lease(store_url: str) -> None:
    """Contract (``Leases.release``, Raises): "StaleLeaseError, StoreUnavailableError,
    StoreError: the context's queued changes could not be written (as :meth:`flush`); the
    lease is kept." The record stays queued and counted, the context held; the next
    release writes it, and a claim elsewhere restores exactly what was acknowledged."""
    store = FailOnNth(open_context_store(store_url), "append", 2)
    try:
        async with Foundation(store=store, lease_ttl=30, owner="host-a") as foundation:
            manager = foundation.manager
            await manager.leases.claim("c")
            manager.accept_turn(snapshot("c", "t0", "where is my bag?"))
            await manager.leases.flush()
            manager.record("c", "t0", [assistant("gate 4")])
            with anyio.fail_after(5), pytest.raises(StoreError, match="append failed once"):
                await manager.leases.release("c")
            assert manager.context_ids() == ("c",)
            stats = manager.statistics().store
            assert stats is not None and (stats.claimed, stats.pending_records) == (1, 1)
            assert await _claim_elsewhere(store, "c") == "LeaseHeldError"  # kept
            with anyio.fail_after(5):
                assert await manager.leases.release("c") is True
            stats = manager.statistics().store
            assert stats is not None and (stats.claimed, stats.pending_records) == (0, 0)
            assert manager.context_ids() == ()
        assert await stored_texts(store, "c") == ["where is my bag?", "gate 4"]
    finally:
        await store.aclose()


async def test_a_release_whose_lease_release_fails_reports_it_and_loses_nothing(
    store_url: str,
) -> None:
    """Contract (docs/durable.md): a store failure reaches the host (here ``on_error``,
    once); the context's changes were written first, so this host's next claim restores
    exactly them."""
    store = FailOnNth(open_context_store(store_url), "release", 1)
    reported: list[BaseException] = []
    try:
        async with Foundation(store=store, lease_ttl=30) as foundation:
            manager = foundation.manager
            manager.leases.on_error = reported.append
            await manager.leases.claim("c")
            manager.accept_turn(snapshot("c", "t0", "where is my bag?"))
            manager.record("c", "t0", [assistant("gate 4")])
            with anyio.fail_after(5):
                assert await manager.leases.release("c") is True
            assert [str(e) for e in reported] == ["release failed once"]
            stats = manager.statistics().store
            assert stats is not None and (stats.claimed, stats.pending_records) == (0, 0)
            with anyio.fail_after(5):
                assert await manager.leases.claim("c") is True  # the same owner takes it again
            assert texts(foundation, "c") == ["where is my bag?", "gate 4"]
    finally:
        await store.aclose()


@pytest.mark.parametrize("stage", ["append", "replace"])
async def test_a_flush_cancelled_at_each_writer_stage_loses_nothing(
    store_url: str, stage: str
) -> None:
    """Contract (``Leases.flush``, Cancellation): "The queued changes stay queued; the
    writer still writes them." The flush is cancelled while the cycle it waits for is
    in its append, or in its compaction (``replace``, a flush waits for it too); other
    contexts are served meanwhile (a prepare needs no store) and the next flush, and a
    restore, find every record."""
    store = GateStore(open_context_store(store_url))
    try:
        async with Foundation(store=store, lease_ttl=30) as foundation:
            manager = foundation.manager
            await manager.leases.claim("c")
            await manager.leases.claim("d")
            manager.accept_turn(snapshot("c", "t0", "where is my bag?"))
            manager.accept_turn(snapshot("d", "t0", "hello"))
            await manager.leases.flush()
            many = 70 if stage == "replace" else 1  # past 64 records: the cycle compacts
            entered, gate = store.arm(stage)
            for i in range(many):
                manager.record("c", "t0", [assistant(f"a{i}")])
            assert await cancel_when_entered(manager.leases.flush, entered)
            with anyio.fail_after(5):  # another context is served while the store waits
                prefix = await manager.prepare(ContextPrepareRequest(context_id="d", turn_id="t0"))
            assert prefix.items
            gate.set()
            with anyio.fail_after(5):
                await manager.leases.flush()
            stats = manager.statistics().store
            assert stats is not None and stats.pending_records == 0
        expected = ["where is my bag?", *(f"a{i}" for i in range(many))]
        assert await stored_texts(store, "c") == expected
    finally:
        await store.aclose()


async def test_a_release_cancelled_during_its_write_keeps_the_context(store_url: str) -> None:
    """Contract (DESIGN.md rule 5; ``Leases.flush``, Cancellation): a release cancelled
    while it writes the context's queue leaves the context held, its lease kept and its
    record queued; the writer still writes it, and a later release hands it over whole."""
    store = GateStore(open_context_store(store_url))
    try:
        async with Foundation(store=store, lease_ttl=30, owner="host-a") as foundation:
            manager = foundation.manager
            await manager.leases.claim("c")
            manager.accept_turn(snapshot("c", "t0", "where is my bag?"))
            await manager.leases.flush()
            entered, gate = store.arm("append")
            manager.record("c", "t0", [assistant("gate 4")])
            await cancel_when_entered(lambda: manager.leases.release("c"), entered)
            assert manager.context_ids() == ("c",)
            stats = manager.statistics().store
            assert stats is not None and stats.claimed == 1
            gate.set()
            with anyio.fail_after(5):
                await manager.leases.flush()
            with anyio.fail_after(5):
                assert await manager.leases.release("c") is True
        assert await stored_texts(store, "c") == ["where is my bag?", "gate 4"]
    finally:
        await store.aclose()


async def test_the_close_during_a_hung_release_terminates(store_url: str) -> None:
    """Contract (docs/durable.md, "The close writes what is queued ... within
    ``close_grace_period``, then releases the leases"): a close while a host's
    ``release`` waits for a store that does not answer returns, and what was queued for
    the other contexts is written."""
    store = GateStore(open_context_store(store_url))
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                async with Foundation(
                    store=store, lease_ttl=30, close_grace_period=1
                ) as foundation:
                    manager = foundation.manager
                    await manager.leases.claim("c")
                    await manager.leases.claim("d")
                    manager.accept_turn(snapshot("c", "t0", "where is my bag?"))
                    manager.accept_turn(snapshot("d", "t0", "hello"))
                    await manager.leases.flush()
                    entered, gate = store.arm("release")

                    async def release() -> None:
                        await manager.leases.release("c")

                    group.start_soon(release)
                    await entered.wait()
                    manager.record("d", "t0", [assistant("hi")])
                # closed while the release hangs
                gate.set()
        assert await stored_texts(store, "d") == ["hello", "hi"]
    finally:
        await store.aclose()


async def test_idle_unloading_during_the_contexts_compaction_loses_nothing(store_url: str) -> None:
    """Contract (docs/durable.md): "Contexts unused for ``idle_after`` seconds leave memory
    and come back on the next ``claim``"; nothing acknowledged is lost. Here the context
    goes idle while the writer's compaction (``replace``) of its log waits: it leaves
    memory and its lease is released under the compaction; the held-history totals drop
    to zero, and the next claim restores exactly what was acknowledged, with the same
    totals as before."""
    store = GateStore(open_context_store(store_url))
    try:
        async with Foundation(store=store, lease_ttl=30, idle_after=0.2) as foundation:
            manager = foundation.manager
            await manager.leases.claim("c")
            manager.accept_turn(snapshot("c", "t0", "where is my bag?"))
            await manager.leases.flush()
            entered, gate = store.arm("replace")
            for i in range(70):  # past 64 records: the cycle compacts the log
                manager.record("c", "t0", [assistant(f"a{i}")])
            before = manager.statistics().history
            async with anyio.create_task_group() as group:

                async def flush() -> None:
                    with anyio.fail_after(10):
                        await manager.leases.flush()

                group.start_soon(flush)
                with anyio.fail_after(5):
                    await entered.wait()  # the appends are written; the compaction waits
                await _until(lambda: manager.context_ids() == ())  # idle: unloaded
                gate.set()
            stats = manager.statistics()
            assert stats.store is not None
            assert (stats.store.claimed, stats.store.pending_records) == (0, 0)
            assert (stats.history.turns, stats.history.items, stats.history.bytes) == (0, 0, 0)
            with anyio.fail_after(5):
                assert await manager.leases.claim("c") is True
            after = manager.statistics().history
            assert (after.turns, after.items, after.bytes) == (
                before.turns,
                before.items,
                before.bytes,
            )
            assert texts(foundation, "c") == ["where is my bag?", *(f"a{i}" for i in range(70))]
        assert await stored_texts(store, "c") == [
            "where is my bag?",
            *(f"a{i}" for i in range(70)),
        ]
    finally:
        await store.aclose()

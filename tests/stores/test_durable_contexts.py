"""A ContextManager with a durable store: claims, flush, restore, fencing, idle unloading.

Every test runs on a real SQLite file (asyncio and trio) and on the real
Redis server (asyncio).
"""

from __future__ import annotations

import math
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry

from tests.runtime.helpers import CHAT, SYSTEM, assistant, call, result, user
from tests.stores.helpers import expire_lease, hosting
from turnloom.context import ApproxTokenCounter, Message
from turnloom.context.history import HistoryLimits
from turnloom.errors import (
    ContextRemovedError,
    HostCallbackError,
    InputError,
    LeaseHeldError,
    NotClaimedError,
    StaleLeaseError,
    StoreError,
    StoreRecordError,
    StoreUnavailableError,
)
from turnloom.runtime import (
    ContextContribution,
    ContextManager,
    ContextPrepareRequest,
    Foundation,
    ManagerSettings,
    PreparedContext,
    StoreStatistics,
    TurnSnapshot,
    _durable,
)
from turnloom.runtime._contexts import ContextTable
from turnloom.runtime._counters import Counters
from turnloom.runtime._options import ManagerKwargs
from turnloom.runtime._records import encode_record
from turnloom.runtime.metrics import ManagerCollector
from turnloom.runtime.store import ContextStore, LogWrite
from turnloom.stores import SQLiteContextStore, open_context_store, sqlite_contexts

pytestmark = pytest.mark.anyio

LIMITS = HistoryLimits(low_water=1.0, max_turns=3)
MEMORY = SQLiteContextStore(":memory:")  # never opened: no I/O until a call


def snapshot(context_id: str, turn_id: str, text: str, **extra: object) -> TurnSnapshot:
    return TurnSnapshot(context_id=context_id, turn_id=turn_id, input=(user(text),), **extra)  # type: ignore[arg-type]


def request(context_id: str, turn_id: str) -> ContextPrepareRequest:
    return ContextPrepareRequest(
        context_id=context_id,
        turn_id=turn_id,
        contributions=(ContextContribution(name="memory", content="likes aisles"),),
    )


async def converse(manager: ContextManager, context_id: str, turns: range) -> None:
    """Turns with a tool call, its result and an answer each; the first sets instructions."""
    for i in turns:
        manager.accept_turn(
            snapshot(
                context_id, f"t{i}", f"question {i}", instructions=(SYSTEM,) if i == 0 else None
            )
        )
        async with manager.invocation(context_id, f"t{i}") as invocation:
            invocation.record([call(f"k{i}"), result(f"k{i}", f"found {i}")])
        manager.record(context_id, f"t{i}", [assistant(f"answer {i}")])


async def test_a_context_must_be_claimed_before_it_changes(store_url: str) -> None:
    async with hosting(store_url) as foundation:
        manager = foundation.manager
        with pytest.raises(NotClaimedError, match=r"await manager\.leases\.claim") as caught:
            manager.accept_turn(snapshot("c", "t1", "hi"))
        assert caught.value.context_id == "c"
        assert manager.context_ids() == ()
        with pytest.raises(InputError):
            await manager.leases.flush("")
        assert await manager.leases.claim("c") is True
        assert await manager.leases.claim("c") is False  # held: no I/O
        manager.accept_turn(snapshot("c", "t1", "hi"))
        with pytest.raises(NotClaimedError):
            manager.record("other", "t1", [assistant("x")])
    async with Foundation() as plain:  # without a store claim only checks the id
        assert await plain.manager.leases.claim("c") is False
        with pytest.raises(InputError):
            await plain.manager.leases.claim("")


async def test_another_host_restores_and_prepares_exactly_what_the_first_would(
    store_url: str,
) -> None:
    """Same acknowledged history -> the same prepared input (evictions included)."""
    async with hosting(store_url, history_limits=LIMITS) as first:
        manager = first.manager
        await manager.leases.claim("c")
        await converse(manager, "c", range(5))
        manager.accept_turn(snapshot("c", "t5", "last question"))
        await manager.leases.flush()
        expected = await manager.prepare(request("c", "t5"))
        held = manager.history("c")
    assert held.turn_ids == ("t3", "t4", "t5")  # t0..t2 were evicted and logged so
    async with hosting(store_url, history_limits=LIMITS) as second:
        manager = second.manager
        assert await manager.leases.claim("c") is True
        restored = manager.history("c")
        assert restored.turn_ids == held.turn_ids
        assert restored.pinned == held.pinned == (SYSTEM,)
        for turn_id in held.turn_ids:
            assert restored.turn_messages(turn_id) == held.turn_messages(turn_id)
        prepared = await manager.prepare(request("c", "t5"))
        assert prepared.items == expected.items
        assert manager.statistics().history.turns == 3
        restored_stats = manager.statistics().store
        assert restored_stats is not None
        assert (restored_stats.claims_total, restored_stats.takeovers_total) == (1, 1)
        with pytest.raises(InputError):  # evicted ids are remembered after a restore
            manager.accept_turn(snapshot("c", "t1", "again"))


async def test_a_stale_owner_is_refused_by_the_store_and_told_with_a_typed_error(
    store_url: str,
) -> None:
    async with (
        hosting(store_url, owner="host-a", lease_ttl=30) as host_a,
        hosting(store_url, owner="host-b", lease_ttl=30) as host_b,
    ):
        a, b = host_a.manager, host_b.manager
        await a.leases.claim("c")
        await converse(a, "c", range(2))
        await a.leases.flush()
        with pytest.raises(LeaseHeldError, match="host-a"):
            await b.leases.claim("c")
        expire_lease(store_url, "c")  # host A stalls past its lease
        assert await b.leases.claim("c") is True
        await converse(b, "c", range(2, 3))
        await b.leases.flush()
        # Host A does not know yet: its commit is local, the store refuses the write.
        a.accept_turn(snapshot("c", "t9", "from a stale host"))
        with pytest.raises(StaleLeaseError, match="refused a write of context 'c'") as caught:
            await a.leases.flush("c")
        assert caught.value.context_id == "c"
        assert a.context_ids() == ()  # it left host A's memory
        lost = a.statistics().store
        assert lost is not None
        assert (lost.leases_lost_total, lost.claimed, lost.pending_records) == (1, 0, 0)
        with pytest.raises(StaleLeaseError):
            a.accept_turn(snapshot("c", "t10", "again"))
        await a.leases.flush()  # nothing queued any more
        with pytest.raises(StaleLeaseError):
            await a.leases.flush("c")
        assert b.history("c").turn_ids == ("t0", "t1", "t2")
    async with hosting(store_url) as third:
        await third.manager.leases.claim("c")
        assert third.manager.history("c").turn_ids == ("t0", "t1", "t2")


async def test_the_lost_map_stays_bounded_across_claim_lose_release_cycles(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: a manager remembers at most ``_LOST_REMEMBERED`` lost contexts.

    Each cycle claims a new context, loses it (the store refuses its write)
    and never takes it back: the newest losses stay refused as stale, older
    ones read as not claimed, a reclaim forgets the loss and the close empties
    the map.
    """
    monkeypatch.setattr(_durable, "_LOST_REMEMBERED", 2)
    async with hosting(store_url, owner="host-a", lease_ttl=30) as host:
        manager = host.manager
        durable = manager.leases._durable
        assert durable is not None
        sizes = []
        for i in range(5):
            await manager.leases.claim(f"c{i}")
            manager.accept_turn(snapshot(f"c{i}", "t1", "hi"))
            await manager.leases.flush()
            expire_lease(store_url, f"c{i}")
            async with hosting(store_url, owner="host-b", lease_ttl=30) as other:
                await other.manager.leases.claim(f"c{i}")
            manager.accept_turn(snapshot(f"c{i}", "t2", "from a stale host"))
            with pytest.raises(StaleLeaseError):
                await manager.leases.flush(f"c{i}")
            sizes.append(len(durable._lost))
        assert sizes == [1, 2, 2, 2, 2]
        assert list(durable._lost) == ["c3", "c4"]
        with pytest.raises(StaleLeaseError):
            manager.accept_turn(snapshot("c4", "t3", "again"))
        with pytest.raises(NotClaimedError):
            manager.accept_turn(snapshot("c0", "t3", "again"))
        expire_lease(store_url, "c4")
        assert await manager.leases.claim("c4") is True  # released by host B's close
        assert list(durable._lost) == ["c3"]
    assert len(durable._lost) == 0


async def test_closing_writes_what_is_queued_and_releases_the_leases(store_url: str) -> None:
    async with hosting(store_url, lease_ttl=30) as first:
        await first.manager.leases.claim("c")
        await converse(first.manager, "c", range(3))  # no flush
    async with hosting(store_url, lease_ttl=30) as second:
        assert await second.manager.leases.claim("c") is True  # released: no wait for expiry
        assert second.manager.history("c").turn_ids == ("t0", "t1", "t2")


async def test_idle_contexts_leave_memory_and_come_back_on_next_use(store_url: str) -> None:
    # idle_after: a loaded machine may stall the setup's awaits; 2 s keeps both contexts
    # in memory until it is done (the test waits for the unloading, not for a guess).
    async with hosting(store_url, idle_after=2.0, lease_ttl=30) as foundation:
        manager = foundation.manager
        for context_id in ("a", "b"):
            await manager.leases.claim(context_id)
            await converse(manager, context_id, range(2))
        await manager.leases.flush()
        before = manager.history("a")
        with anyio.fail_after(10):
            while manager.context_ids():
                await anyio.sleep(0.05)
        assert manager.statistics().contexts == 0
        assert manager.statistics().history.turns == 0
        unloaded = manager.statistics().store
        assert unloaded is not None
        assert (unloaded.idle_unloads_total, unloaded.claimed) == (2, 0)
        with pytest.raises(NotClaimedError):
            manager.accept_turn(snapshot("a", "t2", "hi"))
        assert manager.leases.store is not None
        assert set(await manager.leases.store.idle(0.0)) == {"a", "b"}  # leases released
        assert await manager.leases.claim("a") is True
        assert manager.history("a").turn_messages("t1") == before.turn_messages("t1")
        assert manager.statistics().history.turns == 2
        manager.accept_turn(snapshot("a", "t2", "back"))


async def test_a_context_in_a_model_call_never_leaves_memory_idle(store_url: str) -> None:
    store = RenewalWatcher(open_context_store(store_url), None, 0.0)
    try:
        async with Foundation(store=store, idle_after=0.1, lease_ttl=30) as foundation:
            manager = foundation.manager
            await manager.leases.claim("c")
            manager.accept_turn(snapshot("c", "t1", "hi"))  # no await until the call is open
            async with manager.invocation("c", "t1") as invocation:
                opened = anyio.current_time()
                await manager.leases.flush()
                with anyio.fail_after(60):  # the bound only ends a hang
                    # Each maintenance round renews, then unloads what is idle: wait for
                    # two whole rounds after c had been unused for longer than idle_after.
                    rounds = 0
                    while manager.context_ids() and rounds < 3:
                        rounds = sum(at > opened + 0.1 for at, _ in store.renewals)
                        await anyio.sleep(0.01)
                assert manager.context_ids() == ("c",)
                invocation.record([assistant("still here")])
            await manager.leases.flush()
    finally:
        await store.inner.aclose()


async def test_a_context_a_preparation_waits_on_never_leaves_memory_idle(store_url: str) -> None:
    """Invariant: a prepare waiting for a context's next turn (a voice host prepares before
    the caller speaks) is a use: the context stays held, so the commit needs no new claim
    and the waiter gets its prefix (it neither waits on an unloaded context nor fails)."""
    async with hosting(store_url, idle_after=0.2, lease_ttl=30) as foundation:
        manager = foundation.manager
        await manager.leases.claim("c")
        manager.accept_turn(snapshot("c", "t1", "hi"))
        prepared: list[PreparedContext] = []
        async with anyio.create_task_group() as group:

            async def next_turn() -> None:
                prepared.append(await manager.prepare(request("c", "t2")))

            group.start_soon(next_turn)
            await anyio.wait_all_tasks_blocked()
            # A witness used after c: once it left memory idle, so would have c.
            await manager.leases.claim("w")
            manager.accept_turn(snapshot("w", "t1", "witness"))
            with anyio.fail_after(10):
                while "w" in manager.context_ids():
                    await anyio.sleep(0.05)
            assert manager.context_ids() == ("c",)
            manager.accept_turn(snapshot("c", "t2", "there"))
        [prefix] = prepared
        assert [item["content"] for item in prefix.items[: prefix.turn_start + 1]] == [
            "hi",
            "there",
        ]
        await manager.leases.flush()


async def test_a_preparation_waiting_on_a_context_whose_lease_is_lost_settles_at_once(
    store_url: str,
) -> None:
    """Invariant: no prepare hangs on a context that left this manager (another host took
    its lease): the waiter settles with ContextRemovedError and frees its slot, as when
    the context is removed."""
    async with (
        hosting(store_url, owner="host-a", lease_ttl=30) as host_a,
        hosting(store_url, owner="host-b", lease_ttl=30) as host_b,
    ):
        a, b = host_a.manager, host_b.manager
        await a.leases.claim("c")
        a.accept_turn(snapshot("c", "t1", "hi"))
        await a.leases.flush()
        outcome: list[BaseException] = []
        async with anyio.create_task_group() as group:

            async def next_turn() -> None:
                try:
                    await a.prepare(request("c", "t2"))
                except ContextRemovedError as exc:
                    outcome.append(exc)

            group.start_soon(next_turn)
            await anyio.wait_all_tasks_blocked()
            expire_lease(store_url, "c")  # host A stalls past its lease
            assert await b.leases.claim("c") is True
            a.accept_turn(snapshot("c", "t9", "from a stale host"))
            with pytest.raises(StaleLeaseError):
                await a.leases.flush("c")
            with anyio.fail_after(10):  # settles at once; the bound only ends a hang
                while not outcome:
                    await anyio.sleep(0.01)
        [error] = outcome
        assert (error.context_id, error.turn_id) == ("c", "t2")  # type: ignore[attr-defined]
        assert a.statistics().preparations.pending == 0


async def test_remove_context_deletes_its_log(store_url: str) -> None:
    async with hosting(store_url) as foundation:
        manager = foundation.manager
        await manager.leases.claim("c")
        await converse(manager, "c", range(2))
        await manager.leases.flush()
        manager.remove_context("c")
        await manager.leases.flush()
        assert manager.leases.store is not None
        assert await manager.leases.store.load("c") == ()
        assert await manager.leases.claim("c") is True  # a new, empty context
        assert manager.context_ids() == ()


async def test_an_undecodable_record_fails_the_claim_naming_the_context(store_url: str) -> None:
    store = open_context_store(store_url)
    try:
        token = await store.acquire("c", "writer", 30)
        await store.append([("c", token, 0, (b"\xc1garbage",))])
        await store.release({"c": token})
        async with Foundation(store=store, owner="reader") as foundation:
            with pytest.raises(StoreRecordError, match="context 'c'") as caught:
                await foundation.manager.leases.claim("c")
            assert (caught.value.context_id, caught.value.index) == ("c", 0)
            assert foundation.manager.context_ids() == ()
        # The failed claim released its lease.
        assert await store.acquire("c", "someone-else", 30) > token
    finally:
        await store.aclose()


class ReplayCounter:
    """Counts like the default counter until ``bad`` is set; then answers it, or
    raises it when it is an exception."""

    def __init__(self) -> None:
        self.bad: object = None

    def count(self, messages: Sequence[Message]) -> Any:
        if self.bad is None:
            return ApproxTokenCounter().count(messages)
        if isinstance(self.bad, BaseException):
            raise self.bad
        return self.bad


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            OSError("tokenizer gone"),
            "The token counter ReplayCounter raised OSError: 'tokenizer gone'.",
        ),
        (
            -1,
            "The token counter ReplayCounter returned -1 tokens; a count is an int from 0 to "
            "9223372036854775807.",
        ),
    ],
    ids=["raises", "negative"],
)
async def test_a_restore_whose_token_counter_fails_releases_the_lease(
    store_url: str, bad: object, message: str
) -> None:
    """Invariant: a counter failing while a claim replays the log is the host's
    HostCallbackError (cause kept), not a StoreRecordError; nothing is installed,
    the lease is released at once, and with the counter mended the same log restores."""
    async with hosting(store_url, owner="writer") as first:
        await first.manager.leases.claim("c")
        await converse(first.manager, "c", range(2))
    counter = ReplayCounter()
    store = open_context_store(store_url)
    try:
        async with Foundation(store=store, owner="reader", token_counter=counter) as foundation:
            manager = foundation.manager
            counter.bad = bad
            with pytest.raises(HostCallbackError) as caught:
                await manager.leases.claim("c")
            assert (str(caught.value), caught.value.callback) == (message, "token_counter")
            assert caught.value.__cause__ is (bad if isinstance(bad, OSError) else None)
            assert manager.context_ids() == ()
            stats = manager.statistics().store
            assert stats is not None
            assert (stats.claims_total, stats.takeovers_total) == (0, 0)
            with pytest.raises(NotClaimedError):
                manager.accept_turn(snapshot("c", "t9", "hi"))
            # The lease was released: another owner takes it at once.
            other = await store.acquire("c", "someone-else", 30)
            await store.release({"c": other})
            counter.bad = None
            assert await manager.leases.claim("c") is True
            assert manager.history("c").turn_ids == ("t0", "t1")
    finally:
        await store.aclose()


class CountingStore:
    """A real store that counts the batches the writer sends."""

    def __init__(self, store: ContextStore) -> None:
        self.inner = store
        self.batches: list[int] = []

    async def acquire(self, context_id: str, owner: str, ttl: float) -> int:
        return await self.inner.acquire(context_id, owner, ttl)

    async def renew(self, leases: Mapping[str, int], ttl: float) -> frozenset[str]:
        return await self.inner.renew(leases, ttl)

    async def release(self, leases: Mapping[str, int]) -> None:
        await self.inner.release(leases)

    async def append(self, writes: Sequence[LogWrite]) -> Mapping[str, int | StoreError]:
        self.batches.append(len(writes))
        return await self.inner.append(writes)

    async def replace(
        self, context_id: str, token: int, length: int, records: tuple[bytes, ...]
    ) -> bool:
        return await self.inner.replace(context_id, token, length, records)

    async def load(self, context_id: str) -> tuple[bytes, ...]:
        return await self.inner.load(context_id)

    async def forget(self, context_id: str, token: int) -> bool:
        return await self.inner.forget(context_id, token)

    async def idle(self, seconds: float) -> tuple[str, ...]:
        return await self.inner.idle(seconds)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_changes_of_many_contexts_go_to_the_store_in_one_batch(store_url: str) -> None:
    store = CountingStore(open_context_store(store_url))
    try:
        async with Foundation(store=store) as foundation:
            manager = foundation.manager
            for i in range(100):
                await manager.leases.claim(f"c{i}")
            for i in range(100):
                manager.accept_turn(snapshot(f"c{i}", "t1", "hi"))
                manager.record(f"c{i}", "t1", [assistant("a"), assistant("b")])
            assert manager.statistics().store == StoreStatistics(
                claimed=100,
                pending_records=200,
                batches_total=0,
                records_written_total=0,
                write_failures_total=0,
                claims_total=100,
                takeovers_total=0,
                leases_lost_total=0,
                idle_unloads_total=0,
                compactions_total=0,
            )
            await manager.leases.flush()
            assert store.batches == [100]  # 200 changes, one round trip
            assert await store.load("c7") != ()
            stats = manager.statistics().store
            assert stats is not None
            assert (stats.pending_records, stats.batches_total) == (0, 1)
            assert stats.records_written_total == 200
            registry = CollectorRegistry(auto_describe=False)
            registry.register(ManagerCollector(manager.statistics))
            assert registry.get_sample_value("turnloom_store_records_written_total") == 200
            assert registry.get_sample_value("turnloom_store_contexts_claimed") == 100
    finally:
        await store.aclose()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"store": 42}, "^store must be a ContextStore, not an object of type int\\.$"),
        ({"store": "sqlite:x.db"}, "open it with"),
        ({"store": MEMORY, "lease_ttl": 0}, "lease_ttl"),
        ({"store": MEMORY, "lease_ttl": math.inf}, "lease_ttl"),
        ({"store": MEMORY, "idle_after": math.nan}, "idle_after"),
        ({"store": MEMORY, "owner": "two words"}, "owner"),
    ],
)
def test_store_options_are_checked_at_the_door(options: dict[str, object], match: str) -> None:
    with pytest.raises(InputError, match=match):
        Foundation(**options)  # type: ignore[arg-type]


def test_the_store_annotation_says_what_the_door_takes() -> None:
    """A URL string is refused (the runtime never opens stores): the type says so too.

    Both constructors take the options of the one table as typed keywords.
    """
    for table in (ManagerSettings, ManagerKwargs):
        assert typing.get_type_hints(table)["store"] == ContextStore | None
    for owner in (Foundation.__init__, ContextManager.__init__):
        assert typing.get_type_hints(owner)["options"] == typing.Unpack[ManagerKwargs]


class SlowLoadStore(CountingStore):
    """A real store whose ``load`` waits until the test lets it go on."""

    def __init__(self, store: ContextStore) -> None:
        super().__init__(store)
        self.loading = anyio.Event()
        self.go_on = anyio.Event()

    async def load(self, context_id: str) -> tuple[bytes, ...]:
        self.loading.set()
        await self.go_on.wait()
        return await self.inner.load(context_id)


class SlowForgetStore(CountingStore):
    """A real store whose ``forget`` waits until the test lets it go on."""

    def __init__(self, store: ContextStore) -> None:
        super().__init__(store)
        self.forgetting = anyio.Event()
        self.go_on = anyio.Event()

    async def forget(self, context_id: str, token: int) -> bool:
        self.forgetting.set()
        await self.go_on.wait()
        return await self.inner.forget(context_id, token)


async def test_a_flush_waits_for_a_removal_the_writer_is_deleting(store_url: str) -> None:
    """Invariant: once ``flush`` returns, every removal before it is done in the store,
    also when the write cycle had already taken the deletion and was running it (the
    flush found nothing queued: before the fix it returned at once, the log still there)."""
    store = SlowForgetStore(open_context_store(store_url))
    try:
        async with Foundation(store=store) as foundation:
            manager = foundation.manager
            await manager.leases.claim("c")
            manager.accept_turn(snapshot("c", "t1", "hi"))
            await manager.leases.flush()
            manager.remove_context("c")
            flushed: list[bool] = []

            async def flush() -> None:
                await manager.leases.flush()
                flushed.append(await store.load("c") == ())

            async with anyio.create_task_group() as group:
                group.start_soon(manager.leases.flush)  # wakes the writer
                await store.forgetting.wait()  # the cycle is deleting the log
                group.start_soon(flush)
                await anyio.wait_all_tasks_blocked()
                assert flushed == []  # still waiting for the deletion
                store.go_on.set()
            assert flushed == [True]
    finally:
        await store.aclose()


async def test_a_claim_cancelled_while_restoring_releases_its_lease(store_url: str) -> None:
    async with hosting(store_url, owner="writer") as first:
        await first.manager.leases.claim("c")
        await converse(first.manager, "c", range(2))
    store = SlowLoadStore(open_context_store(store_url))
    try:
        async with Foundation(store=store, owner="reader") as foundation:
            manager = foundation.manager
            async with anyio.create_task_group() as group:
                group.start_soon(manager.leases.claim, "c")
                await store.loading.wait()
                group.cancel_scope.cancel()
            assert manager.context_ids() == ()
            with pytest.raises(NotClaimedError):
                manager.accept_turn(snapshot("c", "t9", "hi"))
            # The lease was released: another owner takes it at once.
            other = await store.inner.acquire("c", "someone-else", 30)
            await store.inner.release({"c": other})
            store.go_on.set()
            assert await manager.leases.claim("c") is True
            assert manager.history("c").turn_ids == ("t0", "t1")
    finally:
        await store.aclose()


async def test_a_cancelled_flush_leaves_the_changes_queued_and_written(store_url: str) -> None:
    async with hosting(store_url) as foundation:
        manager = foundation.manager
        await manager.leases.claim("c")
        await converse(manager, "c", range(2))
        with anyio.CancelScope() as scope:
            scope.cancel()
            await manager.leases.flush()
        await manager.leases.flush()
        assert manager.leases.store is not None
        assert len(await manager.leases.store.load("c")) == 6  # 2 commits, 4 records


async def test_a_long_log_is_compacted_and_restores_the_same_history(store_url: str) -> None:
    """Compaction keeps the log about as long as the history, and changes nothing restored."""
    async with hosting(store_url, history_limits=LIMITS) as first:
        manager = first.manager
        await manager.leases.claim("c")
        for block in range(6):  # 60 turns of 4 records each, 3 turns held
            await converse(manager, "c", range(block * 10, block * 10 + 10))
            await manager.leases.flush()
        manager.accept_turn(snapshot("c", "t60", "late", sequence=60))
        await manager.leases.flush()
        stats = manager.statistics().store
        assert stats is not None and stats.compactions_total >= 1
        assert manager.leases.store is not None
        log = await manager.leases.store.load("c")
        assert len(log) <= 64 + 4  # not the 240 records the context wrote
        held = manager.history("c")
        expected = await manager.prepare(request("c", "t60"))
        with pytest.raises(InputError):  # evicted ids stay remembered
            manager.accept_turn(snapshot("c", "t5", "reused id"))
    async with hosting(store_url, history_limits=LIMITS) as second:
        manager = second.manager
        await manager.leases.claim("c")
        restored = manager.history("c")
        assert restored.turn_ids == held.turn_ids == ("t58", "t59", "t60")
        assert restored.pinned == held.pinned == (SYSTEM,)
        for turn_id in held.turn_ids:
            assert restored.turn_messages(turn_id) == held.turn_messages(turn_id)
        assert (await manager.prepare(request("c", "t60"))).items == expected.items
        with pytest.raises(InputError):  # the remembered evicted ids came back
            manager.accept_turn(snapshot("c", "t5", "reused id"))
        with pytest.raises(InputError):  # and so did the sequence
            manager.accept_turn(snapshot("c", "t61", "old", sequence=60))
        assert manager.record("c", "t10", [assistant("late output")]) == 0  # dropped


async def test_a_claim_compacts_a_long_log_it_restores(store_url: str) -> None:
    """A log written by a host that never compacted (an older turnloom) is compacted."""
    table = ContextTable(LIMITS, CHAT, Counters())
    log: list[bytes] = []
    table.log = lambda context_id, record: log.append(encode_record(record))
    for i in range(30):
        table.commit("c", snapshot("c", f"t{i}", f"question {i}"))
        table.record(table.get("c"), f"t{i}", [assistant(f"answer {i}")])
    assert len(log) == 30 * 2 + 27  # commits, records, evictions
    store = open_context_store(store_url)
    try:
        token = await store.acquire("c", "old-host", 30)
        await store.append([("c", token, 0, tuple(log))])
        await store.release({"c": token})
    finally:
        await store.aclose()
    async with hosting(store_url, history_limits=LIMITS) as foundation:
        manager = foundation.manager
        await manager.leases.claim("c")
        assert manager.history("c").turn_ids == ("t27", "t28", "t29")
        assert manager.leases.store is not None
        assert len(await manager.leases.store.load("c")) == 1  # one checkpoint
        manager.accept_turn(snapshot("c", "t30", "next"))
        await manager.leases.flush()
        assert len(await manager.leases.store.load("c")) == 3  # then a commit and an eviction
    async with hosting(store_url, history_limits=LIMITS) as again:
        await again.manager.leases.claim("c")
        assert again.manager.history("c").turn_ids == ("t28", "t29", "t30")


class LostReplyStore(CountingStore):
    """A real store whose ``replace`` reply is lost: applied or not, the caller cannot tell."""

    def __init__(self, store: ContextStore, *, applied: bool) -> None:
        super().__init__(store)
        self.applied = applied
        self.replaces = 0

    async def replace(
        self, context_id: str, token: int, length: int, records: tuple[bytes, ...]
    ) -> bool:
        self.replaces += 1
        if self.applied:
            await self.inner.replace(context_id, token, length, records)
        raise StoreUnavailableError("The reply was lost.")


@pytest.mark.parametrize("applied", [True, False])
async def test_a_compaction_whose_reply_is_lost_never_misplaces_a_record(
    store_url: str, applied: bool
) -> None:
    store = LostReplyStore(open_context_store(store_url), applied=applied)
    try:
        async with Foundation(store=store, history_limits=LIMITS) as first:
            manager = first.manager
            await manager.leases.claim("c")
            await converse(manager, "c", range(20))  # 80 records + evictions: compacts
            await manager.leases.flush()
            assert store.replaces == 1
            await converse(manager, "c", range(20, 24))
            await manager.leases.flush()  # written after rereading the log's length
            held = manager.history("c")
        async with Foundation(store=store.inner, history_limits=LIMITS) as second:
            await second.manager.leases.claim("c")
            restored = second.manager.history("c")
            assert restored.turn_ids == held.turn_ids == ("t21", "t22", "t23")
            for turn_id in held.turn_ids:
                assert restored.turn_messages(turn_id) == held.turn_messages(turn_id)
    finally:
        await store.aclose()


class StoreClock:
    """The SQLite store's wall clock (``time.time``), moved only by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def time(self) -> float:
        return self.now


class RenewalWatcher(CountingStore):
    """A real store that notes each renewal, after moving the store's clock by ``step``."""

    def __init__(self, store: ContextStore, clock: StoreClock | None, step: float) -> None:
        super().__init__(store)
        self.clock, self.step = clock, step
        self.renewals: list[tuple[float, frozenset[str]]] = []  # (store time, lost)

    def now(self) -> float:
        return self.clock.now if self.clock is not None else anyio.current_time()

    async def renew(self, leases: Mapping[str, int], ttl: float) -> frozenset[str]:
        if self.clock is not None:
            self.clock.now += self.step  # time passes between renewals, never during one
        at = self.now()
        lost = await self.inner.renew(leases, ttl)
        self.renewals.append((at, lost))
        return lost


async def test_a_held_lease_is_renewed_and_a_lost_one_is_noticed(
    store_url: str, kind: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Renewal keeps a lease past its time-to-live; a renewal that fails ends the ownership.

    SQLite: the store's clock moves only by 0.2 s just before each renewal (less
    than the 0.3 s lease), so a loaded machine cannot expire the lease between
    two renewals. Redis expires by the server's real clock: a 3 s lease,
    renewed every second, survives a 2 s stall.
    """
    clock = StoreClock() if kind[0] == "sqlite" else None
    if clock is not None:
        monkeypatch.setattr(sqlite_contexts, "time", clock)
    ttl, span = (0.3, 1.0) if clock is not None else (3.0, 3.0)
    store = RenewalWatcher(open_context_store(store_url), clock, 0.2)
    try:
        async with Foundation(store=store, owner="host-a", lease_ttl=ttl) as host:
            manager = host.manager
            await manager.leases.claim("c")
            claimed = store.now()
            manager.accept_turn(snapshot("c", "t1", "hi"))
            await manager.leases.flush()
            with anyio.fail_after(60):  # the bound only ends a hang
                # Until a renewal made more than ``span`` after the claim returned
                # (SQLite: more than three times the lease's time-to-live).
                while not any(at - claimed > span or lost for at, lost in store.renewals):
                    await anyio.sleep(0.01)
            assert all(lost == frozenset() for _, lost in store.renewals)
            with pytest.raises(LeaseHeldError, match="host-a"):
                await store.acquire("c", "host-b", 30)
            expire_lease(store_url, "c")
            token = await store.acquire("c", "host-b", 30)
            with anyio.fail_after(60):
                while manager.context_ids():  # the next renewal finds the lease gone
                    await anyio.sleep(0.01)
            assert store.renewals[-1][1] == {"c"}
            with pytest.raises(StaleLeaseError, match="expired before it was renewed"):
                manager.accept_turn(snapshot("c", "t2", "again"))
            stats = manager.statistics().store
            assert stats is not None and stats.leases_lost_total == 1
            await store.release({"c": token})
    finally:
        await store.inner.aclose()


async def test_a_host_built_manager_carries_its_store(store_url: str) -> None:
    async with open_context_store(store_url) as store:
        manager = ContextManager(store=store, history_limits=LIMITS)
        with pytest.raises(InputError, match="store"):
            Foundation(manager, store=store)
        async with Foundation(manager) as foundation:
            assert foundation.manager is manager
            await manager.leases.claim("c")
            await converse(manager, "c", range(2))
        assert await store.load("c") != ()  # the Foundation left the store open
    async with hosting(store_url, history_limits=LIMITS) as again:
        await again.manager.leases.claim("c")
        assert again.manager.history("c").turn_ids == ("t0", "t1")


async def test_a_restored_context_sends_the_kept_state_pairs_again(store_url: str) -> None:
    """Invariant: the kept runtime-state pairs are stored with their turns, so the host
    that restores a context prepares byte for byte what the writing host would have."""
    prefixes: list[PreparedContext] = []
    for last in ("t2", "t2-again"):  # a retracted id is never committed again
        async with hosting(store_url, lease_ttl=30) as host:
            manager = host.manager
            await manager.leases.claim("c")
            if not prefixes:
                for i in range(2):
                    manager.accept_turn(
                        snapshot("c", f"t{i}", f"q{i}", instructions=(SYSTEM,) if i == 0 else None)
                    )
                    await manager.prepare(request("c", f"t{i}"))
                    manager.record("c", f"t{i}", [assistant(f"answer {i}")])
                await manager.leases.flush()
            assert len(manager.history("c").turn_state("t0")) == 2
            manager.accept_turn(snapshot("c", last, "q2"))
            prefixes.append(await manager.prepare(request("c", last)))
            manager.voice.retract_turn("c", last)
            await manager.leases.flush()
    earlier = prefixes[0].turn_start
    assert prefixes[1].turn_start == earlier
    assert prefixes[1].items[:earlier] == prefixes[0].items[:earlier]
    assert sum("tlrs_" in str(item) for item in prefixes[0].items[:earlier]) == 4  # t0, t1


async def test_a_drop_host_restoring_kept_pairs_sends_no_earlier_pair(store_url: str) -> None:
    """Invariant (drop): no earlier turn's pair is sent, even by a host configured with
    ``earlier_state="drop"`` that restores a context a ``"keep"`` host stored; the pairs
    it no longer keeps leave the history in the log too, so the next host restores the
    same history and the same evictions."""
    limits = HistoryLimits(low_water=1.0, max_items=9)
    async with hosting(store_url, history_limits=limits) as keeping:
        manager = keeping.manager
        await manager.leases.claim("c")
        for i in range(2):
            manager.accept_turn(
                snapshot("c", f"t{i}", f"q{i}", instructions=(SYSTEM,) if i == 0 else None)
            )
            await manager.prepare(request("c", f"t{i}"))
            manager.record("c", f"t{i}", [assistant(f"answer {i}")])
        await manager.leases.flush()
        assert manager.statistics().history.items == 8  # two turns of 2 messages and 2 pairs
    async with hosting(store_url, history_limits=limits, earlier_state="drop") as dropping:
        manager = dropping.manager
        await manager.leases.claim("c")
        view = manager.history("c")
        assert (view.turn_state("t0"), view.turn_state("t1")) == ((), ())
        assert manager.statistics().history.items == 4
        manager.accept_turn(snapshot("c", "t2", "q2"))
        prefix = await manager.prepare(request("c", "t2"))
        assert [item for item in prefix.items if "tlrs_" in str(item)] == list(
            prefix.items[prefix.area_start - 2 : prefix.area_start]
        )  # the current turn's pair only
        manager.record("c", "t2", [assistant("answer 2")])
        manager.accept_turn(snapshot("c", "t3", "q3"))  # 8 messages: nothing evicted
        await manager.leases.flush()
        held = manager.history("c")
    async with hosting(store_url, history_limits=limits) as keeping_again:
        manager = keeping_again.manager
        await manager.leases.claim("c")
        restored = manager.history("c")
        assert restored.turn_ids == held.turn_ids == ("t0", "t1", "t2", "t3")
        assert [restored.turn_state(t) for t in restored.turn_ids] == [()] * 4


async def test_release_writes_a_context_then_frees_its_lease_for_another_host(
    store_url: str,
) -> None:
    """Released: in the store, out of memory, claimable at once by another owner."""
    async with hosting(store_url, history_limits=LIMITS, lease_ttl=60) as first:
        manager = first.manager
        assert await manager.leases.release("c") is False  # not held
        with pytest.raises(InputError):
            await manager.leases.release("")
        await manager.leases.claim("c")
        await converse(manager, "c", range(2))
        assert await manager.leases.release("c") is True  # flushed first
        assert manager.context_ids() == ()
        with pytest.raises(NotClaimedError):
            manager.accept_turn(snapshot("c", "t9", "hi"))
        async with hosting(store_url, history_limits=LIMITS) as second:
            assert await second.manager.leases.claim("c") is True  # no wait for an expiry
            assert second.manager.history("c").turn_ids == ("t0", "t1")
    async with Foundation() as plain:
        assert await plain.manager.leases.release("c") is False


class BrokenStore(CountingStore):
    """A store whose appends raise what no turnloom store raises (a third-party bug)."""

    def __init__(self, store: ContextStore) -> None:
        super().__init__(store)
        self.broken = True

    async def append(self, writes: Sequence[LogWrite]) -> Mapping[str, int | StoreError]:
        if self.broken:
            raise RuntimeError("the client library broke")
        return await self.inner.append(writes)


async def test_an_untyped_failure_of_a_store_is_a_store_error_and_the_foundation_stays_up(
    store_url: str,
) -> None:
    """The writer never takes the Foundation down: the error is typed, queued, reported."""
    store = BrokenStore(open_context_store(store_url))
    reported: list[StoreError] = []
    try:
        async with Foundation(store=store, history_limits=LIMITS) as foundation:
            manager = foundation.manager
            manager.leases.on_error = reported.append
            await manager.leases.claim("c")
            await converse(manager, "c", range(1))
            for _ in range(2):
                with pytest.raises(StoreError, match="raised RuntimeError: the client library"):
                    await manager.leases.flush()
            assert [type(e) for e in reported] == [StoreError, StoreError]
            assert isinstance(reported[0].__cause__, RuntimeError)
            stats = manager.statistics().store
            assert stats is not None
            assert (stats.pending_records, stats.write_failures_total) == (3, 2)  # one turn
            store.broken = False
            await manager.leases.flush()  # queued all along: written now
            manager.leases.on_error = 42  # type: ignore[assignment]
    except InputError as exc:
        assert "on_error must be callable or None" in str(exc)
    else:
        raise AssertionError("a non-callable hook was accepted")
    finally:
        await store.aclose()
    async with hosting(store_url, history_limits=LIMITS) as again:
        await again.manager.leases.claim("c")
        assert again.manager.history("c").turn_ids == ("t0",)


async def test_an_invocation_open_when_its_lease_is_lost_records_nothing_and_says_so(
    store_url: str,
) -> None:
    """Invariant: an invocation's record of a context whose lease this manager lost raises
    StaleLeaseError (as ``manager.record``), never returning as if it were kept."""
    async with (
        hosting(store_url, owner="host-a", lease_ttl=30) as host_a,
        hosting(store_url, owner="host-b", lease_ttl=30) as host_b,
    ):
        a, b = host_a.manager, host_b.manager
        await a.leases.claim("c")
        a.accept_turn(snapshot("c", "t0", "where is my bag?"))
        await a.leases.flush()
        async with a.invocation("c", "t0") as invocation:
            expire_lease(store_url, "c")  # host A stalls past its lease mid-call
            assert await b.leases.claim("c") is True
            invocation.record([assistant("gate 4")])  # local: the store refuses it
            with pytest.raises(StaleLeaseError, match="refused a write of context 'c'"):
                await a.leases.flush("c")
            with pytest.raises(StaleLeaseError, match="context 'c'"):
                invocation.record([assistant("and desk 9")])
        assert b.history("c").turn_ids == ("t0",)
        assert [m.role.value for m in b.history("c").turn_messages("t0")] == ["user"]

"""The Redis store under the faults a fleet meets, on real servers the tests start.

Each test starts its own ``redis-server`` (``redis_servers``: its own port,
persistence off, stopped by PID) and does to it what operations do: fill it
to ``maxmemory`` with ``noeviction`` (``OOM``), demote it to a replica
(``READONLY``), write garbage into its keys. The invariants: every failure
reaches the host as a typed :class:`~turnloom.errors.StoreError` at
``flush``/``claim`` (and through ``manager.leases.on_error``), the Foundation
stays up and closes cleanly, the changes stay queued, one context's failure
leaves the others' flushes alone, and once the store recovers the context is
written with nothing acknowledged lost. Redis runs on asyncio only (the
redis client is asyncio-based).
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable

import anyio
import pytest
import redis

from tests.runtime.helpers import assistant, call, result, user
from tests.stores.faults import FaultProxy
from tests.stores.servers import RedisServer
from turnloom.context.history import HistoryLimits
from turnloom.errors import (
    LeaseHeldError,
    StaleLeaseError,
    StoreError,
    StoreKeyError,
    StoreRefusedError,
    StoreUnavailableError,
)
from turnloom.runtime import ContextManager, Foundation, TurnSnapshot
from turnloom.stores import RedisContextStore, redis_contexts

pytestmark = pytest.mark.anyio

LIMITS = HistoryLimits(low_water=1.0, max_turns=1000)
PREFIX = "t:"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def converse(manager: ContextManager, context_id: str, turns: range) -> None:
    """One question and one answer per turn: two records each."""
    for i in turns:
        manager.accept_turn(
            TurnSnapshot(context_id=context_id, turn_id=f"t{i}", input=(user(f"question {i}"),))
        )
        manager.record(context_id, f"t{i}", [assistant(f"answer {i}")])


async def stored(store: RedisContextStore, context_id: str) -> tuple[str, ...]:
    """The turn ids another host restores, each checked message by message."""
    async with Foundation(store=store, history_limits=LIMITS) as check:
        await check.manager.leases.claim(context_id)
        view = check.manager.history(context_id)
        for turn_id in view.turn_ids:
            i = int(turn_id[1:])
            assert view.turn_messages(turn_id) == (user(f"question {i}"), assistant(f"answer {i}"))
        return view.turn_ids


def fill(server: RedisServer) -> list[str]:
    """Fill the server past ``maxmemory`` by 200 kB, whatever its buffers do; the junk keys.

    400 kB of junk, then ``maxmemory`` set to 200 kB under what the server
    uses: every write is refused (OOM) until the junk is deleted.
    """
    junk = [f"junk:{i}" for i in range(100)]
    with server.client() as client:
        for key in junk:
            client.set(key, b"x" * 4096)
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", used - 200_000)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("probe", b"x")
    return junk


def ids(count: int) -> tuple[str, ...]:
    return tuple(f"t{i}" for i in range(count))


async def test_a_full_redis_is_a_typed_refusal_and_the_context_writes_once_it_has_room(
    redis_servers: Callable[..., RedisServer],
) -> None:
    """OOM (maxmemory + noeviction) never takes the Foundation down; nothing is lost."""
    server = redis_servers("--maxmemory", "4mb", "--maxmemory-policy", "noeviction")
    reported: list[StoreError] = []
    async with RedisContextStore(server.url, prefix=PREFIX) as store:
        async with Foundation(store=store, history_limits=LIMITS) as foundation:
            manager = foundation.manager
            manager.leases.on_error = reported.append
            await manager.leases.claim("c")
            converse(manager, "c", range(2))
            await manager.leases.flush()  # acknowledged: t0, t1
            junk = fill(server)
            converse(manager, "c", range(2, 4))
            for _ in range(2):  # still full, still queued
                with pytest.raises(StoreRefusedError) as caught:
                    await manager.leases.flush()
                assert caught.value.reason == "OOM"
            assert [type(e) for e in reported] == [StoreRefusedError, StoreRefusedError]
            with pytest.raises(StoreRefusedError, match="OOM"):
                await manager.leases.claim("d")  # a new lease is a write too
            down = manager.statistics().store
            assert down is not None
            assert (down.pending_records, down.write_failures_total) == (4, 2)
            with server.client() as client:
                client.delete(*junk)
            await manager.leases.flush()  # room again: the queued changes are written
            converse(manager, "c", range(4, 5))
            await manager.leases.flush()
            up = manager.statistics().store
            assert up is not None
            assert (up.pending_records, up.records_written_total) == (0, 10)
        assert await stored(store, "c") == ids(5)


async def test_a_server_demoted_to_a_replica_is_a_typed_refusal_until_it_is_promoted_again(
    redis_servers: Callable[..., RedisServer],
) -> None:
    """READONLY after a failover: typed, queued, and written once the server takes writes."""
    first = redis_servers()
    second = redis_servers()
    async with RedisContextStore(first.url, prefix=PREFIX) as store:
        async with Foundation(store=store, history_limits=LIMITS) as foundation:
            manager = foundation.manager
            await manager.leases.claim("c")
            converse(manager, "c", range(2))
            await manager.leases.flush()
            with first.client() as a, second.client() as b:
                b.replicaof("127.0.0.1", first.port)
                deadline = time.monotonic() + 10  # the bound only ends a hang
                while b.info("replication")["master_link_status"] != "up":
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
                b.replicaof("NO", "ONE")  # the failover: the replica is promoted,
                a.replicaof("127.0.0.1", second.port)  # the old primary demoted
                converse(manager, "c", range(2, 3))
                with pytest.raises(StoreRefusedError) as caught:
                    await manager.leases.flush()
                assert caught.value.reason == "READONLY"
                a.replicaof("NO", "ONE")
            await manager.leases.flush()
        assert await stored(store, "c") == ids(3)


async def test_garbage_in_a_key_is_a_typed_error_naming_the_key_and_context(
    redis_servers: Callable[..., RedisServer],
) -> None:
    server = redis_servers()
    with server.client() as client:
        client.set(f"{PREFIX}ctx:a:lease", "garbage")  # no separator
        client.set(f"{PREFIX}ctx:b:fence", "not-a-number")
        client.hset(f"{PREFIX}ctx:c:log", "x", "y")  # a hash, not a list
        client.rpush(f"{PREFIX}ctx:e:lease", "x")  # a list, not a string
    async with (
        RedisContextStore(server.url, prefix=PREFIX) as store,
        Foundation(store=store) as foundation,
    ):
        manager = foundation.manager
        for context_id, key in (("a", "lease"), ("b", "fence"), ("c", "log"), ("e", "lease")):
            with pytest.raises(StoreKeyError) as caught:
                await manager.leases.claim(context_id)
            assert (caught.value.context_id, caught.value.key) == (
                context_id,
                f"{PREFIX}ctx:{context_id}:{key}",
            )
            assert repr(caught.value.key) in str(caught.value)
        # The failed claim of "c" released its lease: another owner takes it.
        assert await store.acquire("c", "someone-else", 30) >= 1
        with server.client() as client:
            client.set(f"{PREFIX}epoch", "not hex")
        with pytest.raises(StoreKeyError) as caught:
            await manager.leases.claim("f")
        assert caught.value.key == f"{PREFIX}epoch"


async def test_one_context_with_a_damaged_key_never_blocks_the_others_flushes(
    redis_servers: Callable[..., RedisServer],
) -> None:
    server = redis_servers()
    reported: list[StoreError] = []
    async with RedisContextStore(server.url, prefix=PREFIX) as store:
        async with Foundation(store=store, history_limits=LIMITS) as foundation:
            manager = foundation.manager
            manager.leases.on_error = reported.append
            for context_id in ("bad", "good"):
                await manager.leases.claim(context_id)
                converse(manager, context_id, range(1))
            await manager.leases.flush()
            with server.client() as client:
                client.delete(f"{PREFIX}ctx:bad:log")
                client.set(f"{PREFIX}ctx:bad:log", "garbage")
            for context_id in ("bad", "good"):
                converse(manager, context_id, range(1, 2))
            await manager.leases.flush("good")  # written: "bad" failed alone
            with pytest.raises(StoreKeyError) as caught:
                await manager.leases.flush("bad")
            assert (caught.value.context_id, caught.value.key) == ("bad", f"{PREFIX}ctx:bad:log")
            with pytest.raises(StoreKeyError):
                await manager.leases.flush()  # without an id: "bad" is not written
            converse(manager, "good", range(2, 3))
            await manager.leases.flush("good")
            assert {type(e) for e in reported} == {StoreKeyError}
            with server.client() as client:
                client.delete(f"{PREFIX}ctx:bad:log")  # an operator deletes the damaged key
            # Its log is not what this manager wrote any more: the context
            # leaves memory rather than write a history with a hole.
            with pytest.raises(StoreError, match="changed by someone else"):
                await manager.leases.flush("bad")
            with pytest.raises(StaleLeaseError):
                converse(manager, "bad", range(2, 3))
        assert await stored(store, "good") == ids(3)


async def test_a_claim_held_by_another_owner_is_still_lease_held(
    redis_servers: Callable[..., RedisServer],
) -> None:
    """The lease format with the store epoch: another owner's lease is held, not garbage."""
    server = redis_servers()
    async with RedisContextStore(server.url, prefix=PREFIX) as store:
        await store.acquire("c", "other-host", 30)
        async with Foundation(store=store) as foundation:
            with pytest.raises(LeaseHeldError, match="other-host"):
                await foundation.manager.leases.claim("c")
        with server.client() as client:  # a lease an older turnloom wrote: "<token> <owner>"
            client.set(f"{PREFIX}ctx:d:lease", "7 old-host", px=30_000)
        async with Foundation(store=store) as foundation:
            with pytest.raises(LeaseHeldError, match="old-host"):
                await foundation.manager.leases.claim("d")


def sha(script: str) -> bytes:
    """What EVALSHA sends for one of the store's scripts."""
    return hashlib.sha1((redis_contexts._PRELUDE + script).encode()).hexdigest().encode()


def converse_with_tools(manager: ContextManager, context_id: str, turns: range) -> None:
    """A question, a tool call, its result and an answer per turn: enough records to compact."""
    for i in turns:
        manager.accept_turn(
            TurnSnapshot(context_id=context_id, turn_id=f"t{i}", input=(user(f"question {i}"),))
        )
        manager.record(
            context_id,
            f"t{i}",
            [call(f"k{i}"), result(f"k{i}", f"found {i}"), assistant(f"answer {i}")],
        )


@pytest.mark.parametrize("script", ["append", "replace"])
async def test_a_write_whose_reply_is_lost_is_retried_and_recognised_as_applied(
    redis_servers: Callable[..., RedisServer], script: str
) -> None:
    """The client retries after the cut; the retry answers "applied", not a gap.

    The reply of the batch (``append``) or of the compaction (``replace``) is
    thrown away after the server ran it. Then every later write of the
    context goes through, and another host restores exactly the history.
    """
    server = redis_servers()
    proxy = FaultProxy(server.port)
    limits = HistoryLimits(low_water=1.0, max_turns=3)
    async with anyio.create_task_group() as group:
        await group.start(proxy.run)
        async with RedisContextStore(proxy.url, prefix=PREFIX) as store:
            async with Foundation(store=store, history_limits=limits) as foundation:
                manager = foundation.manager
                reported: list[StoreError] = []
                manager.leases.on_error = reported.append
                await manager.leases.claim("c")
                converse_with_tools(manager, "c", range(10))
                await manager.leases.flush()
                source = redis_contexts._REPLACE if script == "replace" else redis_contexts._APPEND
                with server.client() as client:  # loaded: the reply thrown away is the script's
                    client.script_load(redis_contexts._PRELUDE + source)
                proxy.drop_reply(b"EVALSHA", sha(source))
                converse_with_tools(manager, "c", range(10, 25))  # past 64 records: compacts
                await manager.leases.flush()
                assert (proxy.dropped, proxy.cuts) == (1, 1)
                stats = manager.statistics().store
                assert stats is not None
                assert stats.compactions_total == 1
                assert reported == []  # the client's retry hid the fault
                converse_with_tools(manager, "c", range(25, 28))
                await manager.leases.flush()
                held = manager.history("c")
            async with Foundation(store=store, history_limits=limits) as second:
                await second.manager.leases.claim("c")
                restored = second.manager.history("c")
                assert restored.turn_ids == held.turn_ids == ("t25", "t26", "t27")
                for turn_id in held.turn_ids:
                    assert restored.turn_messages(turn_id) == held.turn_messages(turn_id)
            with server.client() as client:
                assert client.llen(f"{PREFIX}ctx:c:log") < 64  # compacted, then appended
        await proxy.stop()


async def test_a_paused_server_is_a_typed_error_within_the_time_bound_and_nothing_is_lost(
    redis_servers: Callable[..., RedisServer],
) -> None:
    """SIGSTOP for longer than the bound: flush and claim raise StoreUnavailableError.

    The guards (``anyio.fail_after``) only turn a hang into a failure: the
    bound is the store's ``timeout``, a flush waits at most about twice it
    (a write cycle in flight, then its own). After SIGCONT, whatever the
    paused server ran late is recognised, and nothing acknowledged is lost.
    """
    server = redis_servers()
    bound = 0.5
    store = RedisContextStore(server.url, prefix=PREFIX, timeout=bound, socket_timeout=0.2)
    async with store:
        async with Foundation(store=store, history_limits=LIMITS) as foundation:
            manager = foundation.manager
            await manager.leases.claim("c")
            converse(manager, "c", range(2))
            await manager.leases.flush()
            server.pause()
            try:
                converse(manager, "c", range(2, 4))
                for _ in range(2):
                    with anyio.fail_after(2 * bound + 2), pytest.raises(StoreUnavailableError):
                        await manager.leases.flush()
                with anyio.fail_after(3 * bound + 2), pytest.raises(StoreUnavailableError):
                    await manager.leases.claim("d")
                with anyio.fail_after(bound + 2), pytest.raises(StoreUnavailableError):
                    await store.load("c")
                # A flush that arrives while a write cycle is in flight.
                failures: list[BaseException] = []

                async def flush() -> None:
                    try:
                        await manager.leases.flush()
                    except StoreUnavailableError as exc:
                        failures.append(exc)

                with anyio.fail_after(2 * bound + 2):
                    async with anyio.create_task_group() as group:
                        group.start_soon(flush)
                        await anyio.sleep(bound / 4)  # the first cycle waits on the server
                        converse(manager, "c", range(4, 5))
                        group.start_soon(flush)
                assert len(failures) == 2
            finally:
                server.resume()
            await manager.leases.flush()
            converse(manager, "c", range(5, 6))
            await manager.leases.flush()
            stats = manager.statistics().store
            assert stats is not None
            assert (stats.pending_records, stats.records_written_total) == (0, 12)
        assert await stored(store, "c") == ids(6)


@pytest.mark.parametrize("same_owner", [False, True], ids=["another-owner", "same-owner-name"])
async def test_fencing_holds_across_a_restart_that_lost_every_key(
    redis_servers: Callable[..., RedisServer], same_owner: bool
) -> None:
    """A stale owner's write after the store lost its data is refused, never acknowledged.

    Host A holds token 1; the server restarts without persistence (every key,
    fencing counters included, is gone); host B claims the context and gets
    token 1 again. A's next flush must raise StaleLeaseError: the lease
    carries the owner (another name) and the store's epoch (a restarted
    host with A's own name, after the restart) that A's write does not.
    """
    server = redis_servers()
    owner_b = "host-a" if same_owner else "host-b"
    async with (
        RedisContextStore(server.url, prefix=PREFIX) as store_a,
        RedisContextStore(server.url, prefix=PREFIX) as store_b,
    ):
        async with Foundation(
            store=store_a, history_limits=LIMITS, owner="host-a", lease_ttl=60
        ) as host_a:
            await host_a.manager.leases.claim("c")
            converse(host_a.manager, "c", range(2))
            await host_a.manager.leases.flush()
            server.restart()
            async with Foundation(
                store=store_b, history_limits=LIMITS, owner=owner_b, lease_ttl=60
            ) as host_b:
                assert await host_b.manager.leases.claim("c") is True  # an empty store
                converse(host_b.manager, "c", range(10, 11))
                await host_b.manager.leases.flush()
                with server.client() as client:
                    assert client.get(f"{PREFIX}ctx:c:fence") == b"1"  # the same token again
                converse(host_a.manager, "c", range(2, 3))
                with pytest.raises(StaleLeaseError, match="context 'c'"):
                    await host_a.manager.leases.flush()
                assert host_a.manager.context_ids() == ()
        assert await stored(store_b, "c") == ("t10",)  # only B's turn: nothing of A's landed


async def test_a_restart_with_an_append_only_file_keeps_every_acknowledged_turn_and_the_lease(
    redis_servers: Callable[..., RedisServer],
) -> None:
    """``appendonly yes`` + ``appendfsync always``: the owner writes on across the restart."""
    server = redis_servers(appendonly=True)
    async with RedisContextStore(server.url, prefix=PREFIX) as store:
        async with Foundation(store=store, history_limits=LIMITS, lease_ttl=60) as foundation:
            manager = foundation.manager
            await manager.leases.claim("c")
            converse(manager, "c", range(3))
            await manager.leases.flush()
            server.restart()  # killed: only what the append-only file holds comes back
            converse(manager, "c", range(3, 5))
            await manager.leases.flush()  # the same lease, epoch and log: written
        assert await stored(store, "c") == ids(5)


async def test_connections_cut_in_a_loop_lose_nothing_acknowledged(
    redis_servers: Callable[..., RedisServer],
) -> None:
    """Every connection cut every 10-60 ms while three contexts write, evict and compact.

    Whatever a flush raises is typed; every turn a flush acknowledged and the
    history still holds is restored by another host exactly.
    """
    server = redis_servers()
    proxy = FaultProxy(server.port)
    limits = HistoryLimits(low_water=1.0, max_turns=3)
    ids_ = ("a", "b", "c")
    acknowledged: dict[str, list[str]] = {c: [] for c in ids_}
    held: dict[str, tuple[str, ...]] = {}
    async with anyio.create_task_group() as group:
        await group.start(proxy.run)
        cutting = anyio.CancelScope()

        async def cutter() -> None:
            rng = random.Random(27)
            with cutting:
                while True:
                    await anyio.sleep(rng.uniform(0.01, 0.06))
                    await proxy.cut()

        async with RedisContextStore(proxy.url, prefix=PREFIX) as store:
            async with Foundation(store=store, history_limits=limits) as foundation:
                manager = foundation.manager
                for c in ids_:
                    await manager.leases.claim(c)
                group.start_soon(cutter)

                async def writer(context_id: str) -> None:
                    for i in range(40):  # 40 turns: past 64 records, compacted
                        converse(manager, context_id, range(i, i + 1))
                        for _attempt in range(50):
                            try:
                                await manager.leases.flush(context_id)
                                break
                            except StoreError:
                                pass  # typed; the changes stay queued
                        else:
                            raise AssertionError("never written")
                        acknowledged[context_id].append(f"t{i}")

                async with anyio.create_task_group() as writers:
                    for c in ids_:
                        writers.start_soon(writer, c)
                cutting.cancel()
                held = {c: manager.history(c).turn_ids for c in ids_}
                stats = manager.statistics().store
                assert stats is not None
                assert stats.compactions_total >= 3
        await proxy.stop()
    assert proxy.cuts > 0
    async with RedisContextStore(server.url, prefix=PREFIX) as store:
        async with Foundation(store=store, history_limits=limits) as check:
            for c in ids_:
                assert held[c] == tuple(acknowledged[c][-3:]) == ("t37", "t38", "t39")
                await check.manager.leases.claim(c)
                view = check.manager.history(c)
                assert view.turn_ids == held[c]
                for turn_id in view.turn_ids:
                    i = int(turn_id[1:])
                    assert view.turn_messages(turn_id) == (
                        user(f"question {i}"),
                        assistant(f"answer {i}"),
                    )


async def test_an_emptied_script_cache_is_reloaded_and_every_call_goes_on(
    redis_servers: Callable[..., RedisServer],
) -> None:
    """NOSCRIPT (a restart, a ``SCRIPT FLUSH``, a failover): the client loads the script again."""
    server = redis_servers()
    async with RedisContextStore(server.url, prefix=PREFIX) as store:
        async with Foundation(store=store, history_limits=LIMITS) as foundation:
            manager = foundation.manager
            await manager.leases.claim("c")
            converse(manager, "c", range(1))
            await manager.leases.flush()
            with server.client() as client:
                client.script_flush()
            converse(manager, "c", range(1, 2))
            await manager.leases.flush()  # pipelined scripts
            await manager.leases.claim("d")  # one script alone
            with server.client() as client:
                client.script_flush()
            assert await manager.leases.release("d") is True
        assert await stored(store, "c") == ids(2)


async def test_a_rewrite_whose_replace_reply_is_lost_is_recognised_as_applied(
    redis_servers: Callable[..., RedisServer],
) -> None:
    """A rebuilt history (``manager.leases.rewriting``) reaches Redis as one replace;
    the proxy throws that replace's reply away after the server ran it and cuts
    the connection. The client's retry answers "applied": no error reaches the
    host, the log is the rewrite's checkpoint (never the old log with the rebuilt
    turns appended, never empty), and another host restores the rebuilt history.
    """
    server = redis_servers()
    proxy = FaultProxy(server.port)
    async with anyio.create_task_group() as group:
        await group.start(proxy.run)
        async with RedisContextStore(proxy.url, prefix=PREFIX) as store:
            async with Foundation(store=store, history_limits=LIMITS) as foundation:
                manager = foundation.manager
                reported: list[StoreError] = []
                manager.leases.on_error = reported.append
                await manager.leases.claim("c")
                converse(manager, "c", range(6))
                await manager.leases.flush()
                with server.client() as client:
                    client.script_load(redis_contexts._PRELUDE + redis_contexts._REPLACE)
                proxy.drop_reply(b"EVALSHA", sha(redis_contexts._REPLACE))
                with manager.leases.rewriting("c"):
                    manager.remove_context("c")
                    converse(manager, "c", range(4))
                await manager.leases.flush("c")
                assert (proxy.dropped, proxy.cuts) == (1, 1)
                assert reported == []
                with server.client() as client:
                    assert client.llen(f"{PREFIX}ctx:c:log") == 1  # one checkpoint
            assert await stored(store, "c") == ids(4)
        await proxy.stop()

"""The ContextStore contract, checked on the real SQLite and Redis stores.

Fencing is the store's job: a write with a token that is not the live lease's
is refused by the store itself (a transaction / a server-side script), not by
the client. Appends are idempotent by log position, so a retried batch never
duplicates a record.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import anyio
import pytest

from tests.stores.helpers import expire_lease, open_new_files_together
from turnloom.errors import InputError, LeaseHeldError, StoreError
from turnloom.runtime.store import ContextStore
from turnloom.stores import RedisContextStore, SQLiteContextStore, open_context_store

pytestmark = pytest.mark.anyio


async def test_both_stores_satisfy_the_protocol(store_url: str) -> None:
    store = open_context_store(store_url)
    try:
        assert isinstance(store, ContextStore)
    finally:
        await store.aclose()


async def test_a_lease_is_exclusive_and_tokens_only_grow(store_url: str) -> None:
    store = open_context_store(store_url)
    try:
        first = await store.acquire("c", "host-a", 30.0)
        with pytest.raises(LeaseHeldError) as caught:
            await store.acquire("c", "host-b", 30.0)
        assert caught.value.context_id == "c"
        assert "host-a" in str(caught.value)
        again = await store.acquire("c", "host-a", 30.0)  # the holder may take it again
        await store.release({"c": again})
        taken = await store.acquire("c", "host-b", 30.0)
        assert first < again < taken
        assert await store.acquire("other", "host-a", 30.0) >= 1  # leases are per context
    finally:
        await store.aclose()


async def test_the_store_refuses_a_write_with_a_stale_token(store_url: str) -> None:
    """Host A's lease expires, host B takes it; A's write is refused by the store.

    A's first write happens under a long lease (a slow machine cannot expire it
    first); A's last renewal then asks for a short one, which runs out by the
    store's own clock while B retries.
    """
    store = open_context_store(store_url)
    try:
        stale = await store.acquire("c", "host-a", 30.0)
        assert await store.append([("c", stale, 0, (b"a0",))]) == {"c": 1}
        assert await store.renew({"c": stale}, 0.05) == frozenset()
        with anyio.fail_after(10):  # the bound only ends a hang
            while True:
                try:
                    live = await store.acquire("c", "host-b", 30.0)
                    break
                except LeaseHeldError:
                    await anyio.sleep(0.02)
        refused = await store.append([("c", stale, 1, (b"a1",)), ("d", 99, 0, (b"x",))])
        assert refused == {"c": -1, "d": -1}  # "d" was never leased at all
        assert await store.append([("c", live, 1, (b"b1",))]) == {"c": 2}
        assert await store.load("c") == (b"a0", b"b1")
        assert await store.load("d") == ()
        assert not await store.forget("c", stale)
        assert await store.renew({"c": stale}, 30.0) == {"c"}
        assert await store.renew({"c": live}, 30.0) == frozenset()
        await store.release({"c": stale})  # a stale release leaves the live lease alone
        assert await store.append([("c", live, 2, (b"b2",))]) == {"c": 3}
        assert await store.load("c") == (b"a0", b"b1", b"b2")
    finally:
        await store.aclose()


async def test_a_retried_append_never_duplicates(store_url: str) -> None:
    store = open_context_store(store_url)
    try:
        token = await store.acquire("c", "host-a", 30.0)
        batch = [("c", token, 0, (b"r0", b"r1"))]
        assert await store.append(batch) == {"c": 2}
        assert await store.append(batch) == {"c": 2}  # the same batch again: already applied
        assert await store.append([("c", token, 1, (b"r1", b"r2"))]) == {"c": 3}  # overlap
        assert await store.load("c") == (b"r0", b"r1", b"r2")
        gap = await store.append([("c", token, 5, (b"gap",))])
        assert isinstance(gap["c"], StoreError)
        assert "starts at record 5" in str(gap["c"])
        differs = await store.append([("c", token, 2, (b"other", b"r3"))])
        assert isinstance(differs["c"], StoreError)
        assert "differs from the records" in str(differs["c"])
        assert await store.load("c") == (b"r0", b"r1", b"r2")
    finally:
        await store.aclose()


async def test_one_batch_writes_many_contexts_and_forget_deletes_one_log(store_url: str) -> None:
    store = open_context_store(store_url)
    try:
        tokens = {c: await store.acquire(c, "host-a", 30.0) for c in ("a", "b", "c")}
        writes = [(c, t, 0, (c.encode() * 3, b"\x00\xff")) for c, t in tokens.items()]
        assert await store.append(writes) == {"a": 2, "b": 2, "c": 2}
        assert await store.forget("b", tokens["b"])
        assert await store.load("a") == (b"aaa", b"\x00\xff")
        assert await store.load("b") == ()
        assert await store.load("c") == (b"ccc", b"\x00\xff")
        # The token counter survives forget: a new lease still fences the old one.
        await store.release({"b": tokens["b"]})
        assert await store.acquire("b", "host-b", 30.0) > tokens["b"]
    finally:
        await store.aclose()


async def test_idle_lists_stored_contexts_that_nobody_leases(store_url: str) -> None:
    store = open_context_store(store_url)
    try:
        tokens = {c: await store.acquire(c, "host-a", 30.0) for c in ("old", "held", "empty")}
        await store.append([(c, tokens[c], 0, (b"r",)) for c in ("old", "held")])
        await store.release({"old": tokens["old"], "empty": tokens["empty"]})
        assert await store.idle(0.0) == ("old",)  # "held" is leased, "empty" has no log
        assert await store.idle(3600.0) == ()  # written just now
    finally:
        await store.aclose()


async def test_a_closed_store_refuses_calls(store_url: str) -> None:
    store = open_context_store(store_url)
    await store.acquire("c", "host-a", 30.0)
    await store.aclose()
    await store.aclose()
    with pytest.raises(StoreError, match="closed"):
        await store.load("c")


def test_store_urls_and_options_are_checked_at_the_door() -> None:
    for url in (
        "postgres://x",
        "sqlite:",
        "",
        "redis:/x",
        "sqlite:x.db?mode=ro",
        "sqlite:x?synchronous=OFF",
    ):
        with pytest.raises(InputError):
            open_context_store(url)
    with pytest.raises(InputError):
        open_context_store(42)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="synchronous"):
        SQLiteContextStore(":memory:", synchronous="OFF")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="prefix"):
        RedisContextStore("redis://127.0.0.1:6379/0", prefix="")
    assert isinstance(open_context_store("sqlite::memory:"), SQLiteContextStore)
    assert (
        repr(open_context_store("sqlite:x.db?synchronous=normal")) == "SQLiteContextStore('x.db')"
    )
    bounded = open_context_store("redis://127.0.0.1:6379/0?timeout=1.5&socket_timeout=0.3")
    assert isinstance(bounded, RedisContextStore)
    assert bounded.timeout == 1.5
    short = open_context_store("redis://127.0.0.1:6379/0?timeout=0.2")  # sockets wait 0.2 s
    assert isinstance(short, RedisContextStore)
    assert short.timeout == 0.2
    for bad in ("timeout=soon", "timeout=0", "socket_timeout=3"):  # 3 > the 2 s default bound
        with pytest.raises(InputError):
            open_context_store(f"redis://127.0.0.1:6379/0?{bad}")
    redis_store = open_context_store("redis://127.0.0.1:6379/0?prefix=app1:")
    assert isinstance(redis_store, RedisContextStore)
    assert repr(redis_store) == "RedisContextStore('redis://127.0.0.1:6379/0', prefix='app1:')"


@pytest.mark.parametrize("kind", [pytest.param(("redis", "trio"), id="redis-trio")])
async def test_the_redis_store_says_it_needs_asyncio(store_url: str) -> None:
    store = open_context_store(store_url)
    with pytest.raises(StoreError, match="asyncio only"):
        await store.load("c")
    await store.aclose()


async def test_replace_swaps_a_whole_log_only_for_the_holder_at_the_expected_length(
    store_url: str,
) -> None:
    store = open_context_store(store_url)
    try:
        token = await store.acquire("c", "host-a", 30.0)
        await store.append([("c", token, 0, (b"r0", b"r1", b"r2"))])
        assert not await store.replace("c", token, 2, (b"ckpt",))  # the log moved on
        assert not await store.replace("c", token + 1, 3, (b"ckpt",))  # not the lease
        assert await store.load("c") == (b"r0", b"r1", b"r2")
        assert await store.replace("c", token, 3, (b"ckpt",))
        assert await store.load("c") == (b"ckpt",)
        assert await store.replace("c", token, 3, (b"ckpt",))  # a retry of an applied replace
        assert await store.append([("c", token, 1, (b"r3",))]) == {"c": 2}
        assert await store.load("c") == (b"ckpt", b"r3")
    finally:
        await store.aclose()


async def test_prune_deletes_contexts_unused_for_long_and_never_a_leased_one(
    store_url: str,
) -> None:
    """What remove_context and hung-up calls leave behind can be cleaned; leases are kept."""
    store = open_context_store(store_url)
    other = open_context_store(store_url)
    try:
        tokens = {c: await store.acquire(c, "host-a", 30.0) for c in ("old", "held", "gone")}
        await store.append([(c, t, 0, (b"r",)) for c, t in tokens.items()])
        assert await store.forget("gone", tokens["gone"])
        await store.release({"gone": tokens["gone"]})
        expire_lease(store_url, "old")  # host-a stalled: its lease ran out
        with pytest.raises(InputError):
            await store.prune(-1)
        assert await store.prune(3600.0) == 0  # written just now
        pruned = await store.prune(0.0)
        assert pruned == (2 if store_url.startswith("sqlite:") else 1)  # Redis: "gone" expires
        assert await store.load("old") == ()
        assert await store.load("held") == (b"r",)
        # The pruned context's token is issued again, to another owner; the
        # stalled owner's write with the same token is still refused.
        again = await other.acquire("old", "host-b", 30.0)
        assert again == tokens["old"]
        assert await store.append([("old", again, 0, (b"stale",))]) == {"old": -1}
        assert await other.append([("old", again, 0, (b"new",))]) == {"old": 1}
        assert await other.load("old") == (b"new",)
    finally:
        await store.aclose()
        await other.aclose()


@pytest.mark.parametrize("kind", ["contexts", "memory"])
def test_processes_opening_a_new_sqlite_file_together_all_get_in(kind: str, tmp_path: Path) -> None:
    """Invariant: opening a shared file never fails while another process sets it up.

    SQLite refuses a concurrent switch to WAL mode at once, without waiting
    for the busy timeout; the old stores failed about one opening in fifteen
    here, so 4 processes x 30 new files fail it with near certainty.
    """
    spawn = multiprocessing.get_context("spawn")
    paths = [str(tmp_path / f"new-{n}.db") for n in range(30)]
    owners = [f"process-{k}" for k in range(4)]
    barrier = spawn.Barrier(len(owners))
    outcomes = spawn.Queue()
    workers = [
        spawn.Process(target=open_new_files_together, args=(kind, paths, owner, barrier, outcomes))
        for owner in owners
    ]
    for worker in workers:
        worker.start()
    seen = [outcomes.get(timeout=120) for _ in range(len(paths) * len(owners))]
    for worker in workers:
        worker.join(timeout=60)
    assert [worker.exitcode for worker in workers] == [0, 0, 0, 0]
    assert sorted(seen) == sorted((p, o, "ok") for p in paths for o in owners)

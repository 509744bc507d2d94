"""``manager.leases.rewriting``: a history rebuilt in memory reaches the store in one atomic write.

A host that takes a context apart and builds it again (``remove_context``,
then ``accept_turn`` and ``record`` of what it keeps: the OpenAI Agents
session's ``pop_item``) must never leave the store with an empty or half-built
log: a process killed between two writes would restore that. Inside the block
nothing is appended; the writer replaces the whole log by one checkpoint
(``ContextStore.replace``) once the records logged before the block are
written. Every test here runs on real stores (SQLite on asyncio and trio, the
Redis server on asyncio) and checks each state the stored log passes through.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from tests.runtime.helpers import SYSTEM, assistant, call, result, user
from tests.stores.helpers import expire_lease
from tests.stores.recording import Recording
from turnloom.context import Message
from turnloom.context.history import HistoryLimits
from turnloom.errors import (
    InvalidMessageError,
    NotClaimedError,
    StateError,
    StoreUnavailableError,
)
from turnloom.runtime import ContextManager, ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.runtime._records import replay
from turnloom.stores import open_context_store

pytestmark = pytest.mark.anyio

LIMITS = HistoryLimits()


def _turn(index: int) -> TurnSnapshot:
    return TurnSnapshot(
        context_id="c",
        turn_id=f"t{index}",
        input=(user(f"question {index}"),),
        instructions=(SYSTEM,) if index == 0 else None,
    )


def _outputs(index: int) -> list[Message]:
    return [call(f"k{index}"), result(f"k{index}", f"found {index}"), assistant(f"answer {index}")]


def _build(manager: ContextManager, turns: range) -> None:
    for index in turns:
        manager.accept_turn(_turn(index))
        manager.record("c", f"t{index}", _outputs(index))


def _messages(log: Sequence[bytes]) -> list[tuple[str, list[Message]]]:
    """The history a log restores: each turn's id and messages."""
    if not log:
        return []
    view = replay("c", log, LIMITS).view()
    return [(turn_id, list(view.turn_messages(turn_id))) for turn_id in view.turn_ids]


async def _body(manager: ContextManager) -> bytes:
    """The request body prepared for the context's newest turn."""
    newest = manager.history("c").turn_ids[-1]
    prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id=newest))
    return manager.request_bytes(prepared)


def _held(manager: ContextManager) -> list[tuple[str, list[Message]]]:
    view = manager.history("c")
    return [(turn_id, list(view.turn_messages(turn_id))) for turn_id in view.turn_ids]


@asynccontextmanager
async def _holding(
    store_url: str, turns: int = 0, *, claim: bool = True
) -> AsyncIterator[tuple[ContextManager, Recording]]:
    """A manager holding context "c" in the store at ``store_url``, and that store, recorded.

    Opens the store, then a Foundation writing through a Recording of it; claims
    "c" (the claim must succeed: the store is new, or its lease expired), builds
    turns t0 .. t{turns - 1} and flushes them. The recording starts empty after
    this. ``claim=False``: nothing is claimed, built or flushed. The Foundation
    closes (writing what is queued), then the store.
    """
    async with open_context_store(store_url) as inner:
        store = Recording(inner, "c")
        async with Foundation(store=store, lease_ttl=30.0) as foundation:
            manager = foundation.manager
            if claim:
                assert await manager.leases.claim("c") is True
                _build(manager, range(turns))
                await manager.leases.flush("c")
            store.states.clear()
            store.calls.clear()
            yield manager, store


async def _rebuild_without_newest_turn(
    store_url: str, prepare: Callable[[Recording], Awaitable[None]] | None = None
) -> tuple[list[Any], list[Any], Recording]:
    """Build 4 turns, flush, rewrite to the first 3; return (before, after, store)."""
    async with _holding(store_url, 4) as (manager, store):
        before = _held(manager)
        if prepare is not None:
            await prepare(store)
        with manager.leases.rewriting("c"):
            manager.remove_context("c")
            _build(manager, range(3))
        after = _held(manager)
        with anyio.fail_after(10):
            while True:
                try:
                    await manager.leases.flush("c")
                    break
                except StoreUnavailableError:
                    await anyio.sleep(0.01)  # the fault's cycle; the next one retries
        assert _messages(await store.load("c")) == after
        stats = manager.statistics().store
        assert stats is not None and stats.pending_records == 0
    return before, after, store


async def test_a_rewrite_replaces_the_log_in_one_write(store_url: str) -> None:
    """Invariant: after a rewrite and a flush the stored log is one checkpoint that
    restores exactly the rebuilt history, and it got there in one write: the
    only state the log passed through is the new history (never empty, never the
    old log with the rebuilt turns appended).

    Mutant tried: the rewrite block removed (remove_context deletes the log, the
    turns are appended again): the states are [], then partial histories: fails."""
    before, after, store = await _rebuild_without_newest_turn(store_url)
    assert len(before) == 4 and after == before[:3]
    assert store.calls == ["replace"]
    assert [_messages(state) for state in store.states] == [after]
    assert len(store.states[0]) == 1  # one checkpoint record


@pytest.mark.parametrize("fault", ["before", "after"])
async def test_a_replace_that_fails_is_resolved_and_the_log_is_whole(
    store_url: str, fault: str
) -> None:
    """Invariant: a replace that raised before reaching the store is retried, and
    one applied whose reply was lost is recognised on reread (not taken for
    someone else's change: the context stays held, and the checkpoint is not
    written twice); either way every state the
    log passes through restores the old history or the new one, and the final
    log restores the new one.

    Mutant tried: _resync not recognising a rewrite's checkpoint: the "after"
    case replaces the log a second time: fails."""

    async def arm(store: Recording) -> None:
        store.replace_fault = fault

    before, after, store = await _rebuild_without_newest_turn(store_url, arm)
    assert store.calls == ["replace"]  # applied once: the lost reply is not written again
    for state in store.states:
        assert _messages(state) in (before, after)
    assert _messages(store.states[-1]) == after


async def test_records_logged_before_the_rewrite_are_written_first(store_url: str) -> None:
    """Invariant: a turn accepted before the block and not yet flushed is appended
    before the log is replaced (the store never skips from an older log to the
    rewrite's checkpoint through a log missing it), and the rebuilt history wins.
    """
    async with _holding(store_url, 2) as (manager, store):
        _build(manager, range(2, 3))  # logged, not flushed
        unflushed = _held(manager)
        with manager.leases.rewriting("c"):
            manager.remove_context("c")
            _build(manager, range(1))
        after = _held(manager)
        await manager.leases.flush("c")
        assert store.calls == ["append", "replace"]
        assert [_messages(s) for s in store.states] == [unflushed, after]
        _build(manager, range(1, 2))  # appended after the checkpoint
        await manager.leases.flush("c")
        assert _messages(await store.load("c")) == _held(manager)


async def test_a_rewrite_during_a_replace_in_flight_is_written_after_it(store_url: str) -> None:
    """Invariant: a second rewrite made while the first one's replace awaits the
    store is not lost when that replace succeeds: the writer replaces the log once
    more, and the stored history is the newest.

    Mutant tried: _supersede clearing the rewrite flag unconditionally: the store
    keeps the first rewrite's history: fails."""
    async with _holding(store_url, 4) as (manager, store):
        store.replace_gate = anyio.Event()
        with manager.leases.rewriting("c"):
            manager.remove_context("c")
            _build(manager, range(3))
        async with anyio.create_task_group() as group:
            group.start_soon(manager.leases.flush, "c")
            await store.replacing.wait()
            with manager.leases.rewriting("c"):
                manager.remove_context("c")
                _build(manager, range(2))
            store.replace_gate.set()
        await manager.leases.flush("c")
        assert store.calls == ["replace", "replace"]
        assert _messages(await store.load("c")) == _held(manager)
        assert len(_held(manager)) == 2
        stats = manager.statistics().store
        assert stats is not None and stats.pending_records == 0


async def test_a_rewrite_that_leaves_no_context_deletes_the_log(store_url: str) -> None:
    """Invariant: a block that removes the context and builds nothing deletes its
    log, as remove_context does (no empty checkpoint is written)."""
    async with _holding(store_url, 2) as (manager, store):
        with manager.leases.rewriting("c"):
            manager.remove_context("c")
        await manager.leases.flush()
        assert await store.load("c") == ()
        assert "c" not in manager.context_ids()


async def test_a_restored_rewrite_equals_the_live_history(store_url: str) -> None:
    """Invariant: another host claiming the context after a rewrite restores the
    rebuilt history exactly, and prepares the same input the first host would."""
    async with _holding(store_url, 3) as (manager, _):
        with manager.leases.rewriting("c"):
            manager.remove_context("c")
            _build(manager, range(2))
        await manager.leases.flush("c")
        held = _held(manager)
        body = await _body(manager)
    expire_lease(store_url, "c")
    async with _holding(store_url) as (manager, _):
        assert _held(manager) == held
        assert await _body(manager) == body


async def test_rewriting_refuses_an_unheld_context_and_a_nested_rewrite(store_url: str) -> None:
    """Invariant: rewriting checks at the door: a context not claimed raises
    NotClaimedError, a malformed id InvalidMessageError, a rewrite inside a
    rewrite of the same context StateError; none changes anything."""
    async with _holding(store_url, claim=False) as (manager, _):
        with pytest.raises(NotClaimedError):
            with manager.leases.rewriting("c"):
                pass
        with pytest.raises(InvalidMessageError):
            with manager.leases.rewriting(""):
                pass
        await manager.leases.claim("c")
        _build(manager, range(1))
        held = _held(manager)
        with manager.leases.rewriting("c"):
            with pytest.raises(StateError):
                with manager.leases.rewriting("c"):
                    pass
        await manager.leases.flush("c")
        assert _held(manager) == held
        assert manager.leases.store is not None
        assert _messages(await manager.leases.store.load("c")) == held


async def test_rewriting_without_a_store_only_checks_the_id(anyio_backend: str) -> None:
    """Invariant: without a store the block changes nothing by itself and a
    malformed id is refused."""
    async with Foundation() as foundation:
        manager = foundation.manager
        _build(manager, range(2))
        with manager.leases.rewriting("c"):
            manager.remove_context("c")
            _build(manager, range(1))
        assert len(_held(manager)) == 1
        with pytest.raises(InvalidMessageError):
            with manager.leases.rewriting(""):
                pass


async def test_a_rewrite_not_flushed_is_written_by_the_close_and_by_a_release(
    store_url: str,
) -> None:
    """Invariant: a rewrite the host never flushed is written when the Foundation
    closes (its grace period writes what is queued), and ``leases.release`` of a
    rewritten context writes it before releasing: the next claim, elsewhere,
    restores the rebuilt history both times."""
    async with _holding(store_url, 3) as (manager, _):
        with manager.leases.rewriting("c"):
            manager.remove_context("c")
            _build(manager, range(2))
        held = _held(manager)
    async with _holding(store_url) as (manager, _):
        assert _held(manager) == held
        with manager.leases.rewriting("c"):
            manager.remove_context("c")
            _build(manager, range(1))
        held = _held(manager)
        assert await manager.leases.release("c") is True
        assert "c" not in manager.context_ids()
        assert await manager.leases.claim("c") is True
        assert _held(manager) == held

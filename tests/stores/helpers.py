"""Opening a Foundation on a store named by URL, and ending a lease as a stalled host sees it."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import redis

from tests.stores.conftest import REDIS_URL
from turnloom.runtime import Foundation
from turnloom.stores import open_context_store


@asynccontextmanager
async def hosting(url: str, **options: Any) -> AsyncIterator[Foundation]:
    """A Foundation whose manager keeps contexts in the store at ``url``.

    The store is opened first and closed after the Foundation, as a host does.
    """
    async with open_context_store(url) as store, Foundation(store=store, **options) as foundation:
        yield foundation


def expire_lease(store_url: str, context_id: str) -> None:
    """What a stalled host sees: its lease ran out (the store's own record of it)."""
    if store_url.startswith("sqlite:"):
        with sqlite3.connect(store_url.removeprefix("sqlite:")) as db:
            db.execute(
                "UPDATE turnloom_contexts SET expires_at = 0 WHERE context_id = ?", (context_id,)
            )
    else:
        prefix = store_url.split("prefix=")[1]
        client = redis.Redis.from_url(REDIS_URL)
        client.delete(f"{prefix}ctx:{context_id}:lease")
        client.close()


def open_new_files_together(
    kind: str, paths: list[str], owner: str, barrier: Any, outcomes: Any
) -> None:
    """A process that opens each new SQLite file at once with its peers (a spawned worker).

    For each path: wait at ``barrier``, open the file as ``kind`` (``"contexts"``:
    a context store taking a lease on a context of its own; ``"memory"``: a
    memory store adding an entry), and put ``(path, owner, outcome)`` on
    ``outcomes``, the outcome being ``"ok"`` or the error's type and text.
    """
    import anyio
    import anyio.to_thread

    from turnloom.context.memory import TenantScope
    from turnloom.stores import SQLiteContextStore, SQLiteMemory

    async def each() -> None:
        for path in paths:
            await anyio.to_thread.run_sync(barrier.wait)
            try:
                if kind == "contexts":
                    async with SQLiteContextStore(path) as store:
                        await store.acquire(owner, owner, 30.0)
                else:
                    with SQLiteMemory(path) as memory:
                        memory.add(owner, scope=TenantScope(tenant_id="t"))
                outcome = "ok"
            except Exception as exc:  # reported to the test, which names it
                outcome = f"{type(exc).__name__}: {exc}"
            outcomes.put((path, owner, outcome))

    anyio.run(each)


async def cancel_when_entered(
    call: Callable[[], Awaitable[object]],
    entered: anyio.Event,
    then: Callable[[], object] | None = None,
) -> bool:
    """Run ``call()`` in a task, cancel it once ``entered`` is set (within 5 s), then run
    ``then`` (before the task has seen its cancellation); True when it was cancelled."""
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(call)
            with anyio.fail_after(5):
                await entered.wait()
            scope.cancel()
            if then is not None:
                then()
    return scope.cancelled_caught

"""Opening a Foundation on a store named by URL, and ending a lease as a stalled host sees it."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

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

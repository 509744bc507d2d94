"""Opening a Foundation on a store named by URL, for the store tests and the crash worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from turnloom.runtime import Foundation
from turnloom.stores import open_context_store


@asynccontextmanager
async def hosting(url: str, **options: Any) -> AsyncIterator[Foundation]:
    """A Foundation whose manager keeps contexts in the store at ``url``.

    The store is opened first and closed after the Foundation, as a host does.
    """
    async with open_context_store(url) as store, Foundation(store=store, **options) as foundation:
        yield foundation

"""Durable stores: I/O adapters behind protocols the runtime defines.

Context stores keep each context's log and lease
(:class:`~turnloom.runtime.store.ContextStore`):
:class:`SQLiteContextStore` (embedded, standard library) and
:class:`RedisContextStore` (shared by a fleet of hosts).
"""

from __future__ import annotations

__all__ = ("RedisContextStore", "SQLiteContextStore", "open_context_store")

from turnloom.stores.context_urls import open_context_store
from turnloom.stores.redis_contexts import RedisContextStore
from turnloom.stores.sqlite_contexts import SQLiteContextStore

"""Stores: I/O adapters behind the protocols of ``turnloom.context`` and ``turnloom.runtime``.

:class:`SQLiteMemory` is the embedded memory source (SQLite FTS5, BM25
ranking, tenant isolation in the query); the runtime knows it only through
:class:`~turnloom.context.memory.MemorySource`. Context stores keep each
context's log and lease (:class:`~turnloom.runtime.store.ContextStore`):
:class:`SQLiteContextStore` (embedded, standard library) and
:class:`RedisContextStore` (shared by a fleet of hosts). Stores never import
the runtime.
"""

from __future__ import annotations

__all__ = (
    "RedisContextStore",
    "SQLiteContextStore",
    "SQLiteMemory",
    "check_context_store",
    "fts_text_query",
    "open_context_store",
)

from turnloom.stores.context_urls import check_context_store, open_context_store
from turnloom.stores.redis_contexts import RedisContextStore
from turnloom.stores.sqlite_contexts import SQLiteContextStore
from turnloom.stores.sqlite_memory import SQLiteMemory, fts_text_query

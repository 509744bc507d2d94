"""Stores: I/O adapters behind the protocols of ``turnloom.context``.

:class:`SQLiteMemory` is the embedded memory source (SQLite FTS5, BM25
ranking, tenant isolation in the query). Stores import only
``turnloom.context`` and ``turnloom.errors``; the runtime knows them only
through :class:`~turnloom.context.memory.MemorySource`.
"""

from __future__ import annotations

__all__ = ("SQLiteMemory", "fts_text_query")

from turnloom.stores.sqlite_memory import SQLiteMemory, fts_text_query

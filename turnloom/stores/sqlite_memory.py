"""The embedded memory source: SQLite FTS5 with BM25 ranking, isolated by tenant scope.

Layout (one database file, or ``":memory:"``):

* ``memory_entries`` -- one row per entry: ``tenant_id``, ``sub_tenant_id``
  and ``namespace`` (``''`` for None), the entry id (unique within its
  scope), its text and source.
* ``memory_fts`` -- an FTS5 index over the text (``porter unicode61`` tokenizer: English stems),
  external content of ``memory_entries``.

Isolation is part of the query itself: every search joins the full-text
match with ``memory_entries`` and filters on the exact scope triple in the
same ``SELECT`` before ranking and ``LIMIT``, so another tenant's rows never
leave SQLite (they are not fetched and filtered afterwards).

Ranking: FTS5's ``bm25()``, lower is better; :attr:`MemoryEntry.score
<turnloom.context.memory.MemoryEntry.score>` is its negation, so higher is
better.

Threads: the connection is shared and guarded by a :class:`threading.Lock`;
every method may be called from any thread. :meth:`SQLiteMemory.search` (the
async :class:`~turnloom.context.memory.MemorySource` method) runs the query
in a worker thread through ``anyio.to_thread.run_sync`` with the limiter it
was given.

Source: SQLite FTS5 documentation (external content tables, ``bm25()``,
query syntax).
"""

from __future__ import annotations

__all__ = ("SQLiteMemory", "fts_text_query")

import hashlib
import os
import re
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

import anyio
import anyio.to_thread

from turnloom.context.memory import MemoryEntry, TenantScope, check_tenant_scope
from turnloom.errors import (
    InvalidArgumentError,
    MemoryQueryError,
    MemoryStoreError,
    excerpt,
    what_type,
)
from turnloom.stores._wal import enter_wal

# Seconds a connection waits for another process's lock (sqlite3's default).
_BUSY_TIMEOUT = 5.0

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS memory_entries (
        id INTEGER PRIMARY KEY,
        tenant_id TEXT NOT NULL,
        sub_tenant_id TEXT NOT NULL,
        namespace TEXT NOT NULL,
        entry_id TEXT NOT NULL,
        text TEXT NOT NULL,
        source TEXT NOT NULL,
        UNIQUE (tenant_id, sub_tenant_id, namespace, entry_id)
    )""",
    """CREATE VIRTUAL TABLE IF NOT EXISTS memory_fts USING fts5(
        text, content='memory_entries', content_rowid='id', tokenize='porter unicode61'
    )""",
)

# Isolation in the query: the scope filter sits in the same SELECT as the match.
_SEARCH = """
SELECT e.entry_id, e.text, e.source, bm25(memory_fts) AS rank
FROM memory_fts JOIN memory_entries AS e ON e.id = memory_fts.rowid
WHERE memory_fts MATCH ?
  AND e.tenant_id = ? AND e.sub_tenant_id = ? AND e.namespace = ?
ORDER BY rank, e.id
LIMIT ?
"""

_WORD = re.compile(r"\w+")
_MAX_TERMS = 16
# Function words carry almost no BM25 weight but each one costs a posting-list
# scan: dropping them makes a long question's search about 3x cheaper.
_STOP_WORDS = frozenset(
    """a about after all also am an and any are as at be been but by can could did do does
    for from had has have he her him his how i if in into is it its just me my no not of on
    or our please she should so than that the their them then there these they this to too
    us very was we were what when where which who why will with would you your""".split()
)


def fts_text_query(text: str) -> str:
    """An FTS5 query matching any word of free ``text``; ``""`` when it has none.

    Words are runs of Unicode letters, digits or ``_``, lowercased; English
    function words and one-character words are left out unless nothing else
    is left; the first 16 distinct ones become quoted strings joined with
    ``OR``, so punctuation and FTS5 operators in the text are never syntax.
    """
    words = _WORD.findall(text.lower())
    kept = [w for w in words if len(w) > 1 and w not in _STOP_WORDS] or words
    seen = dict.fromkeys(kept)
    return " OR ".join(f'"{word}"' for word in list(seen)[:_MAX_TERMS])


def _key(scope: TenantScope) -> tuple[str, str, str]:
    return (scope.tenant_id, scope.sub_tenant_id or "", scope.namespace or "")


def _scope(scope: object) -> TenantScope:
    checked = check_tenant_scope(scope)
    if checked is None:
        raise InvalidArgumentError(
            "scope is required: every memory entry belongs to one tenant scope.", field="scope"
        )
    return checked


def _top_k(top_k: object) -> int:
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise InvalidArgumentError(
            f"top_k must be a positive integer, not {excerpt(top_k)}.", field="top_k"
        )
    return top_k


def _text(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentError(
            f"{field} must be a string, not {what_type(value)}.", field=field
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"{field} is not valid UTF-8.", field=field) from None
    return value


class SQLiteMemory:
    """A :class:`~turnloom.context.memory.MemorySource` on SQLite FTS5.

    Args:
        path: the database file, or ``":memory:"`` (the default) for a
            private in-memory database.
        create: create the file and its tables when missing (default True).
            With False a missing file is an error, never an empty database.
        limiter: the limiter :meth:`search` runs its worker thread through
            (for example ``foundation.limiter``); anyio's default when None.

    Raises:
        MemoryStoreError: ``create`` is False and there is no file at
            ``path``, or the file is not a readable SQLite database.

    The store is borrowed by whatever searches it: close it yourself
    (:meth:`close`, or ``with SQLiteMemory(...) as memory``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] = ":memory:",
        *,
        create: bool = True,
        limiter: anyio.CapacityLimiter | None = None,
    ) -> None:
        self.path = str(path)
        self._limiter = limiter
        self._lock = threading.Lock()
        if self.path != ":memory:" and not create and not Path(self.path).is_file():
            raise MemoryStoreError(f"No memory database at {self.path!r}.")
        try:
            self._connection: sqlite3.Connection | None = sqlite3.connect(
                self.path, timeout=_BUSY_TIMEOUT, check_same_thread=False, isolation_level=None
            )
            if self.path != ":memory:":
                # Readers (a daemon's searches) never block the writer (the CLI's add).
                enter_wal(self._connection, _BUSY_TIMEOUT)
            for statement in _SCHEMA:
                self._connection.execute(statement)
        except sqlite3.Error as exc:
            raise MemoryStoreError(
                f"{self.path!r} is not a usable memory database: {exc}."
            ) from exc

    # -- lifecycle ---------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._connection is None

    def close(self) -> None:
        """Close the connection (idempotent); waits for a running query to finish."""
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def __enter__(self) -> SQLiteMemory:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _open(self) -> sqlite3.Connection:
        if self._connection is None:
            raise MemoryStoreError(f"The memory database {self.path!r} is closed.")
        return self._connection

    # -- writing -----------------------------------------------------------------

    def add(
        self, text: str, *, scope: TenantScope, entry_id: str | None = None, source: str = ""
    ) -> str:
        """Store one entry in ``scope``, replacing an entry of the same id there.

        Args:
            text: the entry's text (non-blank).
            scope: the scope it belongs to.
            entry_id: its id within the scope; by default a digest of the text,
                so adding the same text twice keeps one entry.
            source: where it came from.

        Returns:
            the entry id.

        Raises:
            InvalidArgumentError: a blank text, a bad scope, or text that is not
                valid UTF-8.
            MemoryStoreError: the store is closed or SQLite failed.
        """
        return self.add_many([text], scope=scope, source=source, entry_ids=[entry_id])[0]

    def add_many(
        self,
        texts: Iterable[str],
        *,
        scope: TenantScope,
        source: str = "",
        entry_ids: Iterable[str | None] | None = None,
    ) -> list[str]:
        """Store several entries in one transaction (all or none); return their ids.

        Raises:
            as :meth:`add`; nothing is stored when any entry is rejected.
        """
        key = _key(_scope(scope))
        source = _text(source, "source")
        texts = list(texts)
        ids = list(entry_ids) if entry_ids is not None else [None] * len(texts)
        if len(ids) != len(texts):
            raise InvalidArgumentError(
                f"entry_ids has {len(ids)} ids for {len(texts)} texts.", field="entry_ids"
            )
        rows: list[tuple[str, str]] = []
        for i, (text, entry_id) in enumerate(zip(texts, ids, strict=True)):
            text = _text(text, f"texts[{i}]")
            if not text.strip():
                raise InvalidArgumentError(f"texts[{i}] is blank.", field=f"texts[{i}]")
            if entry_id is None:
                entry_id = hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
            elif not isinstance(entry_id, str) or not entry_id:
                raise InvalidArgumentError(
                    f"entry_ids[{i}] must be a non-empty string.", field=f"entry_ids[{i}]"
                )
            rows.append((entry_id, text))
        with self._lock:
            connection = self._open()
            try:
                connection.execute("BEGIN IMMEDIATE")
                try:
                    for entry_id, text in rows:
                        self._upsert(connection, key, entry_id, text, source)
                except BaseException:
                    connection.execute("ROLLBACK")
                    raise
                connection.execute("COMMIT")
            except sqlite3.Error as exc:
                raise MemoryStoreError(f"Storing into {self.path!r} failed: {exc}.") from exc
        return [entry_id for entry_id, _ in rows]

    @staticmethod
    def _upsert(
        connection: sqlite3.Connection,
        key: tuple[str, str, str],
        entry_id: str,
        text: str,
        source: str,
    ) -> None:
        old = connection.execute(
            "SELECT id, text FROM memory_entries WHERE tenant_id = ? AND sub_tenant_id = ? "
            "AND namespace = ? AND entry_id = ?",
            (*key, entry_id),
        ).fetchone()
        if old is not None:
            # External content: the index is told what the old row held.
            connection.execute(
                "INSERT INTO memory_fts(memory_fts, rowid, text) VALUES ('delete', ?, ?)", old
            )
            connection.execute("DELETE FROM memory_entries WHERE id = ?", (old[0],))
        cursor = connection.execute(
            "INSERT INTO memory_entries (tenant_id, sub_tenant_id, namespace, entry_id, text, "
            "source) VALUES (?, ?, ?, ?, ?, ?)",
            (*key, entry_id, text, source),
        )
        connection.execute(
            "INSERT INTO memory_fts(rowid, text) VALUES (?, ?)", (cursor.lastrowid, text)
        )

    # -- reading -----------------------------------------------------------------

    def count(self, scope: TenantScope) -> int:
        """How many entries ``scope`` holds.

        Raises:
            InvalidArgumentError: a bad scope.
            MemoryStoreError: the store is closed or SQLite failed.
        """
        key = _key(_scope(scope))
        with self._lock:
            try:
                row = (
                    self._open()
                    .execute(
                        "SELECT count(*) FROM memory_entries WHERE tenant_id = ? AND "
                        "sub_tenant_id = ? AND namespace = ?",
                        key,
                    )
                    .fetchone()
                )
            except sqlite3.Error as exc:
                raise MemoryStoreError(f"Reading {self.path!r} failed: {exc}.") from exc
        return int(row[0])

    def search_fts(self, expression: str, *, scope: TenantScope, top_k: int) -> list[MemoryEntry]:
        """Run an FTS5 query expression within ``scope``; best ``top_k`` entries first.

        Args:
            expression: FTS5 query syntax (``"flight AND refund"``,
                ``"bag*"``, ``"\\"exact phrase\\""``).

        Raises:
            MemoryQueryError: the expression is not valid FTS5 syntax.
            InvalidArgumentError: a bad scope or ``top_k``.
            MemoryStoreError: the store is closed or SQLite failed.
        """
        key = _key(_scope(scope))
        top_k = _top_k(top_k)
        expression = _text(expression, "query")
        if not expression.strip():
            raise MemoryQueryError("The FTS5 query is empty.", query=expression)
        with self._lock:
            connection = self._open()
            try:
                rows = connection.execute(_SEARCH, (expression, *key, top_k)).fetchall()
            except sqlite3.OperationalError as exc:
                if "fts5" in str(exc) or "syntax error" in str(exc) or "no such column" in str(exc):
                    raise MemoryQueryError(
                        f"The FTS5 query {excerpt(expression[:64])} is malformed: {exc}.",
                        query=expression[:64],
                    ) from exc
                raise MemoryStoreError(f"Searching {self.path!r} failed: {exc}.") from exc
            except sqlite3.Error as exc:
                raise MemoryStoreError(f"Searching {self.path!r} failed: {exc}.") from exc
        return [
            MemoryEntry(id=entry_id, text=text, source=source, score=-float(rank))
            for entry_id, text, source, rank in rows
        ]

    def search_text(self, query: str, *, scope: TenantScope, top_k: int) -> list[MemoryEntry]:
        """Search free ``query`` text within ``scope``: any of its words (:func:`fts_text_query`).

        Raises:
            InvalidArgumentError: a bad scope, ``top_k`` or query type.
            MemoryStoreError: the store is closed or SQLite failed.
        """
        expression = fts_text_query(_text(query, "query"))
        if not expression:
            _scope(scope)
            _top_k(top_k)
            return []
        return self.search_fts(expression, scope=scope, top_k=top_k)

    async def search(self, query: str, *, scope: TenantScope, top_k: int) -> list[MemoryEntry]:
        """The ``MemorySource`` search: :meth:`search_text` in a worker thread.

        Raises:
            as :meth:`search_text`.

        Cancellation:
            The worker thread is never abandoned: a cancelled search returns
            when the running query finishes (one indexed query, bounded by
            ``top_k``), then the cancellation propagates. Nothing is changed.
        """
        return await anyio.to_thread.run_sync(
            lambda: self.search_text(query, scope=scope, top_k=top_k), limiter=self._limiter
        )

"""The embedded context store: one SQLite file (standard library), WAL mode.

Every call runs in a worker thread (one at a time per store, on one
connection), so the event loop never waits on the disk. Each write is one
``BEGIN IMMEDIATE`` transaction: the lease check and the append are atomic,
and several processes may share one file (SQLite's file locks order them; a
busy file is waited for up to ``busy_timeout`` seconds).

Durability: with ``synchronous="FULL"`` (the default) an append that returned
survives a crash of the process and of the machine (the WAL is fsynced at
every commit); with ``"NORMAL"`` it survives a crash of the process, and a
power loss may lose the last commits. A crash between two appends loses
nothing that an append returned for. ``":memory:"`` keeps nothing (tests).

Leases use the machine's wall clock (``time.time()``), so every process
sharing a file must run on one host; use the Redis store across hosts. A
write checks the lease's owner as well as its token, so a context deleted
by :meth:`~SQLiteContextStore.prune` and claimed again (its token counter
restarted) never takes a stale owner's write.

Records: each row holds a framed record (its position and a CRC-32, see
``_frames``) and the context's row counts them (``length``); a load checks
both, so a flipped byte, a row deleted or a count that does not match is a
:class:`~turnloom.errors.StoreRecordError` naming the context and the index.
The schema is unchanged from before frames; unframed rows an older turnloom
wrote still load.

The time bound: a call waits up to ``busy_timeout`` for another process's
transaction (then :class:`~turnloom.errors.StoreUnavailableError`); a disk
that hangs holds the worker thread, which cannot be abandoned mid-write.

What stays: one row per context id (its lease and token counter) after
``remove_context`` deleted its log, and the whole log of a context nobody
claims again; :meth:`~SQLiteContextStore.prune` deletes both.
"""

from __future__ import annotations

__all__ = ("SQLiteContextStore",)

import os
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, Self, TypeAlias, TypeVar, cast

import anyio
import anyio.to_thread

from turnloom.errors import (
    InputError,
    LeaseHeldError,
    StoreError,
    StoreRecordError,
    StoreUnavailableError,
    excerpt,
)
from turnloom.stores._frames import frames, unframe_log
from turnloom.stores._holds import Holds
from turnloom.stores._prune import check_older_than
from turnloom.stores._wal import enter_wal

# (context_id, token, start, records): see turnloom.runtime.store.LogWrite.
_LogWrite: TypeAlias = tuple[str, int, int, tuple[bytes, ...]]

_T = TypeVar("_T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS turnloom_contexts (
    context_id TEXT PRIMARY KEY,
    token INTEGER NOT NULL,
    owner TEXT,
    expires_at REAL NOT NULL,
    used_at REAL NOT NULL,
    length INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS turnloom_records (
    context_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (context_id, position)
) WITHOUT ROWID;
"""


def _leased_length(
    db: sqlite3.Connection, context_id: str, token: int, owner: str, now: float
) -> int | None:
    """The length of the context's log when its live lease is ``token`` held by ``owner``.

    The one lease check of every write (append, replace, forget), run inside
    the write's transaction. None when the lease is not so held (or the
    context has no row).
    """
    row = db.execute(
        "SELECT token, owner, expires_at, length FROM turnloom_contexts WHERE context_id = ?",
        (context_id,),
    ).fetchone()
    if (
        row is not None
        and row[0] == token
        and row[1] is not None
        and row[1] == owner
        and isinstance(row[2], float | int)
        and row[2] > now
    ):
        return cast(int, row[3])
    return None


class SQLiteContextStore:
    """A :class:`~turnloom.runtime.store.ContextStore` in one SQLite file.

    Args:
        path: the database file (created when missing), or ``":memory:"``.
        synchronous: ``"FULL"`` (default) or ``"NORMAL"``; see the module
            docstring for what each survives.
        busy_timeout: seconds a write waits for another process's
            transaction on the same file before failing (default 5.0).

    Raises:
        InputError: an unknown ``synchronous`` mode or a negative timeout.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        busy_timeout: float = 5.0,
    ) -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise InputError(f"synchronous must be 'FULL' or 'NORMAL', not {synchronous!r}.")
        if not isinstance(busy_timeout, int | float) or busy_timeout < 0:
            raise InputError(f"busy_timeout must be a non-negative number, not {busy_timeout!r}.")
        self._path = os.fspath(path)
        self._synchronous = synchronous
        self._busy_timeout = float(busy_timeout)
        self._connection: sqlite3.Connection | None = None
        self._limiter = anyio.CapacityLimiter(1)
        self._holds = Holds()
        self._closed = False

    def __repr__(self) -> str:
        return f"SQLiteContextStore({self._path!r})"

    # -- plumbing (worker thread) ---------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        connection = self._connection
        if connection is None:
            connection = sqlite3.connect(
                self._path,
                timeout=self._busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
            try:
                enter_wal(connection, self._busy_timeout)
                connection.execute(f"PRAGMA synchronous={self._synchronous}")
                connection.executescript(_SCHEMA)
            except BaseException:
                connection.close()
                raise
            self._connection = connection
        return connection

    def _transaction(self, work: Callable[[sqlite3.Connection, float], _T]) -> _T:
        connection = self._connect()
        connection.execute("BEGIN IMMEDIATE")
        try:
            result = work(connection, time.time())
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")
        return result

    async def _run(self, work: Callable[[sqlite3.Connection, float], _T]) -> _T:
        if self._closed:
            raise StoreError(f"{self!r} is closed.")
        try:
            # Not abandoned on cancellation: the transaction finishes (or rolls
            # back) before the cancellation is delivered.
            return await anyio.to_thread.run_sync(self._transaction, work, limiter=self._limiter)
        except sqlite3.OperationalError as exc:
            raise StoreUnavailableError(f"{self!r} could not complete a write: {exc}.") from exc
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self!r} failed: {exc}.") from exc

    # -- the protocol -------------------------------------------------------------

    async def acquire(self, context_id: str, owner: str, ttl: float) -> int:
        """See :meth:`ContextStore.acquire`. The token counter survives release and forget."""

        def work(db: sqlite3.Connection, now: float) -> int:
            row = db.execute(
                "SELECT token, owner, expires_at FROM turnloom_contexts WHERE context_id = ?",
                (context_id,),
            ).fetchone()
            if row is not None and row[1] is not None and row[2] > now and row[1] != owner:
                raise LeaseHeldError(
                    f"Context {context_id!r} is leased by {row[1]!r} for another "
                    f"{row[2] - now:.3f} seconds.",
                    context_id=context_id,
                )
            token = (row[0] if row is not None else 0) + 1
            db.execute(
                "INSERT INTO turnloom_contexts VALUES (?, ?, ?, ?, ?, 0) "
                "ON CONFLICT (context_id) DO UPDATE SET token = excluded.token, "
                "owner = excluded.owner, expires_at = excluded.expires_at",
                (context_id, token, owner, now + ttl, now),
            )
            return token

        token = await self._run(work)
        self._holds.issued(context_id, token, owner)
        return token

    async def renew(self, leases: Mapping[str, int], ttl: float) -> frozenset[str]:
        """See :meth:`ContextStore.renew`."""
        items = tuple((c, t, self._holds.owner(c, t)) for c, t in leases.items())

        def work(db: sqlite3.Connection, now: float) -> frozenset[str]:
            lost: set[str] = set()
            for context_id, token, owner in items:
                cursor = db.execute(
                    "UPDATE turnloom_contexts SET expires_at = ? WHERE context_id = ? AND "
                    "token = ? AND owner = ? AND expires_at > ?",
                    (now + ttl, context_id, token, owner, now),
                )
                if cursor.rowcount == 0:
                    lost.add(context_id)
            return frozenset(lost)

        lost = await self._run(work)
        for context_id in lost:
            self._holds.drop(context_id, leases[context_id])
        return lost

    async def release(self, leases: Mapping[str, int]) -> None:
        """See :meth:`ContextStore.release`."""
        items = tuple((c, t, self._holds.owner(c, t)) for c, t in leases.items())

        def work(db: sqlite3.Connection, now: float) -> None:
            db.executemany(
                "UPDATE turnloom_contexts SET owner = NULL, expires_at = 0 "
                "WHERE context_id = ? AND token = ? AND owner = ?",
                items,
            )

        await self._run(work)
        for context_id, token in leases.items():
            self._holds.drop(context_id, token)

    async def append(self, writes: Sequence[_LogWrite]) -> dict[str, int | StoreError]:
        """See :meth:`ContextStore.append`: one transaction for the whole batch.

        A context whose write starts after the end of its log (a gap), or
        whose records at already written positions differ from the ones
        sent, gets a :class:`~turnloom.errors.StoreError` of its own; the
        rest of the batch is written.
        """
        batch = tuple((c, t, s, frames(s, records)) for c, t, s, records in writes)
        owners = {c: self._holds.owner(c, t) for c, t, _, _ in writes}

        def work(db: sqlite3.Connection, now: float) -> dict[str, int | StoreError]:
            outcome: dict[str, int | StoreError] = {}
            for context_id, token, start, records in batch:
                length = _leased_length(db, context_id, token, owners[context_id], now)
                if length is None:
                    outcome[context_id] = -1
                    continue
                if start > length:
                    outcome[context_id] = StoreError(
                        f"A write to context {context_id!r} starts at record {start}, but "
                        f"its log holds {length}."
                    )
                    continue
                overlap = records[: length - start]
                if overlap:
                    held = db.execute(
                        "SELECT data FROM turnloom_records WHERE context_id = ? AND "
                        "position >= ? AND position < ? ORDER BY position",
                        (context_id, start, start + len(overlap)),
                    ).fetchall()
                    if [bytes(r[0]) for r in held] != overlap:
                        outcome[context_id] = StoreError(
                            f"A write to context {context_id!r} from record {start} differs "
                            "from the records its log holds there."
                        )
                        continue
                fresh = records[length - start :]
                db.executemany(
                    "INSERT INTO turnloom_records VALUES (?, ?, ?)",
                    ((context_id, length + i, data) for i, data in enumerate(fresh)),
                )
                db.execute(
                    "UPDATE turnloom_contexts SET length = ?, used_at = ? WHERE context_id = ?",
                    (length + len(fresh), now, context_id),
                )
                outcome[context_id] = length + len(fresh)
            return outcome

        return await self._run(work)

    async def replace(
        self, context_id: str, token: int, length: int, records: tuple[bytes, ...]
    ) -> bool:
        """See :meth:`ContextStore.replace`: one transaction."""
        framed = frames(0, records)
        owner = self._holds.owner(context_id, token)

        def work(db: sqlite3.Connection, now: float) -> bool:
            held_length = _leased_length(db, context_id, token, owner, now)
            if held_length is None:
                return False
            if held_length != length:
                if held_length != len(framed):
                    return False
                held = db.execute(
                    "SELECT data FROM turnloom_records WHERE context_id = ? ORDER BY position",
                    (context_id,),
                ).fetchall()
                return [bytes(r[0]) for r in held] == framed  # applied by an earlier try
            db.execute("DELETE FROM turnloom_records WHERE context_id = ?", (context_id,))
            db.executemany(
                "INSERT INTO turnloom_records VALUES (?, ?, ?)",
                ((context_id, i, data) for i, data in enumerate(framed)),
            )
            db.execute(
                "UPDATE turnloom_contexts SET length = ?, used_at = ? WHERE context_id = ?",
                (len(framed), now, context_id),
            )
            return True

        return await self._run(work)

    async def load(self, context_id: str) -> tuple[bytes, ...]:
        """See :meth:`ContextStore.load`; every record's frame is checked.

        Raises:
            StoreRecordError: a record is damaged, missing (its log holds fewer
                records than it has written) or out of place.
        """

        def work(db: sqlite3.Connection, now: float) -> tuple[list[bytes], int]:
            rows = db.execute(
                "SELECT data FROM turnloom_records WHERE context_id = ? ORDER BY position",
                (context_id,),
            ).fetchall()
            row = db.execute(
                "SELECT length FROM turnloom_contexts WHERE context_id = ?", (context_id,)
            ).fetchone()
            return [bytes(r[0]) for r in rows], (row[0] if row is not None else len(rows))

        stored, length = await self._run(work)
        records = unframe_log(context_id, stored)
        if len(records) != length:
            index = min(len(records), length)
            raise StoreRecordError(
                f"Record {index} of context {excerpt(context_id)} is missing: its log holds "
                f"{len(records)} records of the {length} written.",
                context_id=context_id,
                index=index,
            )
        return records

    async def forget(self, context_id: str, token: int) -> bool:
        """See :meth:`ContextStore.forget`: deletes the log; the context's row stays (see prune)."""
        owner = self._holds.owner(context_id, token)

        def work(db: sqlite3.Connection, now: float) -> bool:
            if _leased_length(db, context_id, token, owner, now) is None:
                return False
            db.execute("DELETE FROM turnloom_records WHERE context_id = ?", (context_id,))
            db.execute(
                "UPDATE turnloom_contexts SET length = 0 WHERE context_id = ?", (context_id,)
            )
            return True

        return await self._run(work)

    async def prune(self, older_than: float) -> int:
        """Delete what is left of contexts forgotten or unused for ``older_than`` seconds.

        A context whose log was deleted (``remove_context``) keeps one row (its
        lease and token counter) so that a stale owner stays fenced; a context
        nobody claimed for a long time keeps its whole log. ``prune`` deletes
        both kinds once unused for ``older_than`` seconds and not leased:
        run it from a maintenance job with ``older_than`` far longer than any
        lease (a day, say). A pruned context claimed again starts empty. A
        stale owner of a pruned context is still refused: writes check the
        lease's owner as well as its token.

        Returns:
            the number of contexts deleted.

        Raises:
            InputError: ``older_than`` is not a non-negative number.
        """
        check_older_than(older_than)

        def work(db: sqlite3.Connection, now: float) -> int:
            ids = [
                row[0]
                for row in db.execute(
                    "SELECT context_id FROM turnloom_contexts WHERE used_at <= ? AND "
                    "(owner IS NULL OR expires_at <= ?)",
                    (now - older_than, now),
                ).fetchall()
            ]
            for context_id in ids:
                db.execute("DELETE FROM turnloom_records WHERE context_id = ?", (context_id,))
                db.execute("DELETE FROM turnloom_contexts WHERE context_id = ?", (context_id,))
            return len(ids)

        return await self._run(work)

    async def idle(self, seconds: float) -> tuple[str, ...]:
        """See :meth:`ContextStore.idle`."""

        def work(db: sqlite3.Connection, now: float) -> tuple[str, ...]:
            rows = db.execute(
                "SELECT context_id FROM turnloom_contexts WHERE length > 0 AND used_at <= ? "
                "AND (owner IS NULL OR expires_at <= ?) ORDER BY used_at, context_id",
                (now - seconds, now),
            ).fetchall()
            return tuple(row[0] for row in rows)

        return await self._run(work)

    async def __aenter__(self) -> Self:
        """The store itself; :meth:`aclose` runs when the block exits."""
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Close the store (see :meth:`aclose`)."""
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection (after any running call); idempotent."""
        if self._closed:
            return
        self._closed = True
        connection = self._connection
        self._connection = None
        if connection is not None:
            with anyio.CancelScope(shield=True):
                async with self._limiter:
                    connection.close()

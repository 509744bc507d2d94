"""The ``ContextStore`` protocol: where a ContextManager keeps its contexts durably.

A store keeps, per context id, an append-only *log* of opaque records (bytes;
the runtime encodes and decodes them, see the module ``_records``) and one
*lease*: the right to write that log, held by one owner at a time, with an
expiry and a fencing token. Implementations live in :mod:`turnloom.stores`:
:class:`~turnloom.stores.SQLiteContextStore` (embedded, the default) and
:class:`~turnloom.stores.RedisContextStore` (fleets); the runtime never
imports them, and never opens or closes a store: the host opens one
(``turnloom.stores.open_context_store(url)``), hands it to the manager, and
closes it after the Foundation.

Contract every implementation keeps:

* **Fencing.** :meth:`ContextStore.acquire` returns a token greater than every
  token issued before for that context. Every write carries its token, and
  the store itself refuses a write whose token is not the one of the live
  lease (expired, released, or superseded): the check and the write are one
  atomic step inside the store (a transaction, a server-side script).
* **Idempotent appends.** A write names the log position of its first record;
  records the log already holds at those positions are skipped (when they
  are the same bytes). A retried write (after a dropped connection whose
  reply was lost) never duplicates, and answers with the length it left.
* **One context's failure is its own.** A batched append reports each
  context's outcome: its log's length after the write, a refusal, or the
  typed error of that context alone (a gap, a damaged key); the other
  contexts of the batch are written.
* **Atomic, recognisable compaction.** :meth:`ContextStore.replace` swaps a
  whole log for a shorter one in one step, under the same lease check, and
  only when the log still has the length the caller saw; a retry of a
  replace that was applied (its reply lost) answers that it was applied.
* **A time bound.** Every call returns or raises
  :class:`~turnloom.errors.StoreUnavailableError` within the bound its class
  documents, however the server or the network hangs.
* **Typed failures only.** Every failure is a
  :class:`~turnloom.errors.StoreError` (or a
  :class:`~turnloom.errors.LeaseError`), never a client library's own
  exception.
* **Durability.** When :meth:`ContextStore.append` returns, its records are as
  durable as the store promises (its class docstring says how durable); when
  it raises, any part of the write may have been applied, and a retry of the
  same write completes it without duplicates.
"""

from __future__ import annotations

__all__ = ("ContextStore", "LogWrite")

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeAlias, runtime_checkable

from turnloom.errors import StoreError

LogWrite: TypeAlias = tuple[str, int, int, tuple[bytes, ...]]
"""One context's part of a batched append: ``(context_id, token, start, records)``.

``start`` is the log position (0 is the oldest record) of ``records[0]``.
"""


@runtime_checkable
class ContextStore(Protocol):
    """Durable per-context logs with leases; see the module docstring for the contract.

    Every method may raise :class:`~turnloom.errors.StoreUnavailableError` when
    the store cannot be reached or does not answer within its time bound, and
    :class:`~turnloom.errors.StoreKeyError` when a key of the context holds
    what no store wrote. :meth:`load` raises
    :class:`~turnloom.errors.StoreRecordError` for a damaged record.
    """

    async def acquire(self, context_id: str, owner: str, ttl: float) -> int:
        """Take the context's lease for ``ttl`` seconds; return its fencing token.

        An owner may take a lease it already holds again (with a new token).

        Raises:
            LeaseHeldError: another owner holds a lease that has not expired.
        """
        ...

    async def renew(self, leases: Mapping[str, int], ttl: float) -> frozenset[str]:
        """Extend each held lease (context id -> token) to ``ttl`` seconds from now.

        Returns:
            the ids whose lease is no longer held with that token (not extended).
        """
        ...

    async def release(self, leases: Mapping[str, int]) -> None:
        """Give up each lease still held with its token; others are left alone."""
        ...

    async def append(self, writes: Sequence[LogWrite]) -> Mapping[str, int | StoreError]:
        """Append records to the logs of several contexts, in one batch.

        Returns:
            for each context of the batch: the length of its log after the
            write (``start + len(records)`` when the write applied as the
            caller expects; any other length says the caller's idea of the
            log is wrong: reread it), ``-1`` when the write was refused because
            its token is not the live lease's (nothing of it was written),
            or the :class:`~turnloom.errors.StoreError` that kept that
            context's write from applying (a gap: ``start`` is after the end
            of its log; a damaged key). Other contexts are not affected.

        Cancellation:
            Each context's write is applied whole or not at all, and a
            cancelled call may have applied any of them: the caller cannot
            tell which, so it treats every context of the batch as unknown
            (reread the log, or retry: a retry of an applied write returns
            a length other than ``start + len(records)``). The SQLite store
            finishes the batch's one transaction in its worker thread before
            the cancellation is delivered (all of the batch or none of it);
            the Redis store's pipelined scripts may be applied for some
            contexts of the batch and not others.
        """
        ...

    async def replace(
        self, context_id: str, token: int, length: int, records: tuple[bytes, ...]
    ) -> bool:
        """Replace the whole log by ``records`` (compaction), atomically.

        Returns:
            True when the log is ``records`` now (replaced, or found replaced
            by an earlier try of the same call); False when refused, nothing
            changed: ``token`` is not the live lease's, or the log does not
            hold exactly ``length`` records.

        Cancellation:
            The log is the old one or ``records``, never a mix, and a
            cancelled call may have replaced it (the SQLite store finishes
            its transaction before the cancellation is delivered; the Redis
            store's one script runs whole on the server once sent). Retrying
            the same call tells which: it returns True when the log is
            ``records``.
        """
        ...

    async def load(self, context_id: str) -> tuple[bytes, ...]:
        """The context's log, oldest record first; empty for an unknown context."""
        ...

    async def forget(self, context_id: str, token: int) -> bool:
        """Delete the context's log; the lease (and its token counter) stays.

        Returns:
            False when refused: ``token`` is not the live lease's.
        """
        ...

    async def idle(self, seconds: float) -> tuple[str, ...]:
        """Ids of stored contexts unwritten for at least ``seconds``, not leased, oldest first."""
        ...

    async def aclose(self) -> None:
        """Release the store's connections; idempotent."""
        ...

"""What a claim and a compaction do to one context's stored log, for ``Durability``.

:func:`restore` takes a context's lease and rebuilds its history from the
log; :func:`write_checkpoint` replaces a log by one checkpoint of the history
it rebuilds; :func:`unheld_error` is the refusal of a change to a context
whose lease this manager does not hold. Each is one job of
:class:`~turnloom.runtime._durable.Durability` (which decides when: a claim,
a compaction due, a change), moved out so that class keeps the writer, the
leases held and the maintenance loop.
"""

from __future__ import annotations

__all__ = ("Claim", "StoreCall", "restore", "unheld_error", "write_checkpoint")

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import anyio
import anyio.to_thread

from turnloom.context.history import TurnHistory
from turnloom.errors import LeaseError, NotClaimedError, StaleLeaseError, StoreError, excerpt
from turnloom.runtime._door import DurableOptions
from turnloom.runtime._records import checkpoint, compacted, encode_record, replay
from turnloom.runtime.store import ContextStore

_T = TypeVar("_T")


class StoreCall(Protocol):
    """``Durability._store_call``: await a store method, a foreign exception a StoreError."""

    def __call__(self, call: Callable[..., Awaitable[_T]], *args: Any) -> Awaitable[_T]: ...


class Claim:
    """A context this manager holds the lease of."""

    __slots__ = (
        "again",
        "attempt",
        "before",
        "pending",
        "resync",
        "rewrite",
        "superseded",
        "token",
        "used",
        "written",
    )

    def __init__(self, token: int, written: int, used: float) -> None:
        self.token = token
        self.written = written  # records of the context's log in the store
        self.resync = False  # unsure of the log (a compaction failed midway): reread it
        # the log a compaction whose outcome is unknown would have left, or None
        self.attempt: tuple[bytes, ...] | None = None
        self.pending: list[bytes] = []  # logged, not yet appended
        # The log must be replaced by a checkpoint of the history (a rewrite):
        # only the first ``before`` pending records (logged before the rewrite
        # began) are appended; the checkpoint holds the history the rest made.
        self.rewrite = False
        self.before = 0
        # Pending records the checkpoint of the rewrite in flight holds; -1: none in flight.
        self.superseded = -1
        self.again = False  # rewritten again after that checkpoint was taken
        self.used = used  # loop time of the last use


async def restore(
    store_call: StoreCall,
    store: ContextStore,
    options: DurableOptions,
    limiter: anyio.CapacityLimiter,
    context_id: str,
) -> tuple[int, tuple[bytes, ...], TurnHistory | None]:
    """Take the context's lease, load its log and replay it in a worker thread.

    Returns:
        the lease's fencing token, the log (oldest record first) and the
        history it rebuilds (None when the log is empty: a new context).

    Raises:
        LeaseHeldError: another owner holds the lease.
        StoreRecordError: a stored record does not decode or apply.
        HostCallbackError: the token counter failed while the log was replayed.
        StoreUnavailableError: the store cannot be reached.

    Cancellation:
        once the lease is taken, any failure or cancellation releases it
        (shielded; a release that fails leaves the lease to expire).
    """
    token = await store_call(store.acquire, context_id, options.owner, options.lease_ttl)
    try:
        log = await store_call(store.load, context_id)
        history = None
        if log:
            history = await anyio.to_thread.run_sync(
                replay,
                context_id,
                log,
                options.history_limits,
                options.token_counter,
                limiter=limiter,
            )
    except BaseException:
        with anyio.CancelScope(shield=True):
            try:
                await store_call(store.release, {context_id: token})
            except StoreError:
                pass  # the lease expires by itself
        raise
    return token, log, history


async def write_checkpoint(
    store_call: StoreCall,
    store: ContextStore,
    limiter: anyio.CapacityLimiter,
    context_id: str,
    claim: Claim,
    history: TurnHistory,
) -> bool:
    """Replace the context's log by a checkpoint of ``history`` (``ContextStore.replace``).

    Called only when everything logged is written (the store's log is then
    exactly ``history``); a failure leaves either log, both valid, and marks
    the claim to reread the length before the next write of the context.

    Returns:
        True when the store applied the checkpoint while the claim still
        expected that log (``claim.written`` is then the checkpoint's length).

    Raises:
        StoreUnavailableError, StoreError: the store failed (``claim.resync``
            is set).
    """
    # Turns held aside for a retraction of the newest turn stay restorable
    # after a replay (see compacted).
    view, evicted, tail = compacted(history)
    records = tuple(encode_record(record) for record in tail)
    length = claim.written
    blob = await anyio.to_thread.run_sync(
        checkpoint, view, evicted, history.sequence, limiter=limiter
    )
    claim.attempt = (blob, *records)
    try:
        replaced = await store_call(store.replace, context_id, claim.token, length, claim.attempt)
    except StoreError:
        claim.resync = True
        raise
    if replaced and claim.written == length:
        claim.written = 1 + len(records)
        claim.attempt = None
        return True
    if not replaced:
        claim.resync = True  # refused: reread the log before the next write
    return False


def unheld_error(context_id: str, why: str | None) -> LeaseError:
    """The error of a change to a context whose lease this manager does not hold.

    Args:
        context_id: a well-formed context id.
        why: why its lease was lost, when the loss is remembered; else None.

    Returns:
        a :class:`~turnloom.errors.StaleLeaseError` (lost, not claimed since)
        or a :class:`~turnloom.errors.NotClaimedError` (never claimed, left
        memory idle, or lost too long ago to be remembered), to be raised.
    """
    if why is not None:
        return StaleLeaseError(
            f"This manager no longer owns context {excerpt(context_id)} ({why}); claim it "
            "again to restore it from the store.",
            context_id=context_id,
        )
    return NotClaimedError(
        f"Context {excerpt(context_id)} is not claimed by this manager; await "
        "manager.leases.claim(context_id) before changing it.",
        context_id=context_id,
    )

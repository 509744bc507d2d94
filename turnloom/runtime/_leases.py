"""``Leases``: a manager's durable ownership of contexts, reached as ``manager.leases``.

The host-facing side of ``_durable``: with a store, a context is owned through
a lease (:meth:`Leases.claim`), every history change is also queued for the
store, and :meth:`Leases.flush` acknowledges them. The writer, renewal, idle
unloading and restore live in :class:`~turnloom.runtime._durable.Durability`,
made when the Foundation opens.
"""

from __future__ import annotations

__all__ = ("Leases",)

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anyio
import anyio.abc

from turnloom.context.history import check_id
from turnloom.errors import InputError, StaleLeaseError, StoreError, what_type
from turnloom.runtime import _tracing as tracing
from turnloom.runtime._contexts import ContextTable
from turnloom.runtime._door import DurableOptions
from turnloom.runtime._durable import Durability
from turnloom.runtime._lifecycle import Lifecycle
from turnloom.runtime._queue import PreparationQueue
from turnloom.runtime.store import ContextStore


class Leases:
    """Which contexts this manager owns in the durable store, and the store's acknowledgements.

    Reach it as ``manager.leases``; it exists for every manager. With a store
    (``Foundation(store=...)``), a context must be claimed before
    ``accept_turn``, ``record``, ``retract_turn`` or ``remove_context``
    change it (they raise :class:`~turnloom.errors.NotClaimedError` or
    :class:`~turnloom.errors.StaleLeaseError` otherwise), and each of those
    changes is durable once a later :meth:`flush` returned. Without a store,
    :meth:`claim` only checks the id, :meth:`flush` returns at once and
    :attr:`store` is None. Every method must be called from the Foundation's
    event loop.

    The durable options are the manager's (``ContextManager(...)`` or
    ``Foundation(...)`` keyword arguments):

    * ``store``: where contexts are kept durably, a
      :class:`~turnloom.runtime.store.ContextStore` (for example
      ``turnloom.stores.open_context_store("sqlite:PATH")``), or None
      (default: in memory only). Borrowed: never closed by the manager or its
      Foundation.
    * ``lease_ttl``: seconds a lease lasts unless renewed (default 10.0;
      renewed every third of that while held).
    * ``idle_after``: seconds after its last use at which a held context is
      unloaded and its lease released (default 300.0; ``math.inf``: never);
      never while a model call or a preparation waiting for its next turn is
      in progress.
    * ``owner``: this manager's name in leases (default: a random unique one).
    """

    __slots__ = ("_durable", "_life", "_on_error")

    def __init__(self, life: Lifecycle) -> None:
        self._life = life
        self._durable: Durability | None = None  # made when the Foundation opens
        self._on_error: Callable[[StoreError | StaleLeaseError], object] | None = None

    @property
    def on_error(self) -> Callable[[StoreError | StaleLeaseError], object] | None:
        """The host's hook for the store's failures the background writer meets, or None.

        Called on the event loop with each :class:`~turnloom.errors.StoreError`
        a write cycle, a compaction or a lease renewal met (the store
        unreachable or refusing writes for now, a damaged key or record of a
        context). The writer never stops for a failure: the changes stay
        queued, the next flush (or the writer itself, at the next lease
        renewal) retries them, and the context is writable again once the
        store recovers. And with each :class:`~turnloom.errors.StaleLeaseError`
        of a lease lost with changes not yet written (the store refused a
        write: another owner holds the lease; or the lease expired before it
        was renewed): those changes are discarded and the context left
        memory; the next ``flush`` raises it too, unless a waiting one did.
        What the hook returns is ignored; an exception it raises is
        swallowed. Settable at any time; None (default) turns it off.

        Raises:
            InputError: (on assignment) not callable and not None.
        """
        return self._on_error

    @on_error.setter
    def on_error(self, hook: Callable[[StoreError | StaleLeaseError], object] | None) -> None:
        if hook is not None and not callable(hook):
            raise InputError(f"on_error must be callable or None, not {what_type(hook)}.")
        self._on_error = hook

    def _bind(
        self,
        options: DurableOptions | None,
        task_group: anyio.abc.TaskGroup,
        limiter: anyio.CapacityLimiter,
        table: ContextTable,
        queue: PreparationQueue,
    ) -> Durability | None:
        """Start the durable side (with a store) in the opening Foundation's task group."""
        if options is None:
            return None

        def unloadable(context_id: str) -> bool:
            # In use: a model call in flight, or a preparation waiting for its next turn.
            state = table.contexts.get(context_id)
            return (state is None or state.in_flight is None) and not queue.waits_on(context_id)

        def unload(context_id: str) -> None:
            table.unload(context_id)
            queue.wake(context_id)  # its waiters settle: the context left this manager

        durable = Durability(
            options,
            limiter,
            table.install,
            unload,
            unloadable,
            table.held_history,
            lambda: self._on_error,
        )
        table.log = durable.log
        task_group.start_soon(durable.run)
        self._durable = durable
        return durable

    def _check_writable(self, context_id: str) -> None:
        """With a store, raise unless this manager holds the context's lease.

        Raises:
            InvalidMessageError, StaleLeaseError, NotClaimedError: as
                ``Durability.check_writable``.
        """
        if self._durable is not None:
            self._durable.check_writable(context_id)

    def _forget(self, context_id: str) -> None:
        """With a store, queue the deletion of a removed context's log and its lease's release."""
        if self._durable is not None:
            self._durable.forget(context_id)

    @contextmanager
    def rewriting(self, context_id: str) -> Iterator[None]:
        """Rebuild a held context in the block; the store gets the result in one atomic write.

        Use it as ``with manager.leases.rewriting(context_id):`` around
        synchronous changes that take a history apart and build it again
        (``remove_context``, then ``accept_turn`` and ``record`` of the turns
        to keep): what the block changes is not appended to the context's
        stored log; after the block, the writer replaces that log by one
        checkpoint of the history then held (``ContextStore.replace``, under
        the context's lease), or deletes it when the block left no context.
        A process killed at any point leaves the stored log as it was before
        the block or as the block left it, never empty or half rebuilt; the
        change is acknowledged by the next :meth:`flush`. The block must not
        await (the changes are applied on the event loop as they are made).
        Without a store it only checks the id.

        An exception raised in the block propagates after the block is
        closed as above: the store gets whatever history the block left.

        Raises:
            StateError: the manager is not bound to an open Foundation yet,
                or a rewrite of the context is already in progress.
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: a malformed context id.
            NotClaimedError, StaleLeaseError: with a store, the context is
                not held (as ``accept_turn``).
        """
        self._life.check_open()
        durable = self._durable
        if durable is None:
            check_id(context_id, "context id")
            yield
            return
        durable.begin_rewrite(context_id)
        try:
            yield
        finally:
            durable.end_rewrite(context_id)

    @property
    def store(self) -> ContextStore | None:
        """The durable context store, or None when the Foundation has none."""
        return self._durable.store if self._durable is not None else None

    @property
    def takeovers(self) -> int:
        """Claims that restored a context from the store (0 without a store)."""
        return self._durable.takeovers if self._durable is not None else 0

    async def claim(self, context_id: str) -> bool:
        """Own a context on this host: take its lease and restore it from the store.

        Claiming a context this manager already holds costs no I/O and marks
        it used. When the lease is taken, the context's stored log is
        replayed (in a worker thread) into its history, which then equals the
        history of the host that wrote it, so the next prepared input equals
        what that host would have prepared (the area section and the last
        delivered prefix are not stored). The lease is renewed while the
        manager holds the context; a context unused for ``idle_after``
        seconds leaves memory and its lease is released; claim it again to
        bring it back. Without a store this only checks the id and returns
        False.

        Returns:
            True when the lease was taken by this call, False when it was held.

        Raises:
            StateError: the manager is not bound to an open Foundation yet.
            FoundationClosedError: the Foundation is closing or closed (also
                when it closed while the lease was taken: it was released).
            InvalidMessageError: a malformed context id.
            LeaseHeldError: another owner holds the lease and it has not
                expired; retry after it expires (``lease_ttl``).
            StoreRecordError: a stored record of the context does not decode
                or does not apply; ``index`` names it. The lease was released.
            HostCallbackError: the token counter failed while the log was
                replayed; the lease was released.
            StoreUnavailableError: the store cannot be reached.

        Cancellation:
            A cancelled claim releases the lease it took and leaves the
            context as it was, also when cancelled while it compacts the
            restored log. A claim of a context being removed waits until its
            removal is written, then restores nothing.
        """
        self._life.check_open()
        durable = self._durable
        if durable is None:
            check_id(context_id, "context id")
            return False
        with tracing.store_span("turnloom.store.claim", durable.store, context_id) as traced:
            acquired = await durable.claim(context_id)
            traced.set("turnloom.store.acquired", acquired)
        return acquired

    async def release(self, context_id: str) -> bool:
        """Give up a held context: write what is queued for it, release its lease.

        The context leaves this manager's memory and stays in the store: the
        next :meth:`claim`, here or on another host, restores it (without
        waiting for a lease to expire). Without a store this only checks the
        id and returns False.

        Returns:
            True when the lease was released; False when the context was not
            held, or is in use (a model call in flight, a preparation waiting
            for its next turn) or changed while its changes were written.

        Raises:
            StateError: the manager is not bound to an open Foundation yet.
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: a malformed context id.
            StaleLeaseError, StoreUnavailableError, StoreError: the context's
                queued changes could not be written (as :meth:`flush`); the
                lease is kept.

        Cancellation: cancelled while the changes are written, the context
        stays held here (release it again later). Once it left memory, the
        store's lease release runs shielded and finishes even when the caller
        is cancelled; a failure of that release goes to ``on_error`` (the
        lease then expires by itself), never to the caller.
        """
        self._life.check_open()
        if self._durable is None:
            check_id(context_id, "context id")
            return False
        return await self._durable.release(context_id)

    async def flush(self, context_id: str | None = None) -> None:
        """Wait until every change made before the call is in the store.

        Changes (``accept_turn``, ``record``, evictions, ``remove_context``)
        are sent to the store in batches by one writer task: one round trip
        (Redis) or transaction (SQLite) for every change queued since the
        previous batch, whatever the number of contexts. A change is
        *acknowledged* once a flush made after it returned: a crash of this
        process after that never loses it (how durable the store itself is,
        is the store's own contract: see
        :class:`~turnloom.stores.SQLiteContextStore`,
        :class:`~turnloom.stores.RedisContextStore`). A crash before that may
        lose a tail of each context's unacknowledged changes, never a change
        in the middle. Without a store it returns at once.

        Args:
            context_id: raise only this context's refused writes; None raises
                any context's.

        Raises:
            InvalidMessageError: a malformed ``context_id``.
            StaleLeaseError: the store refused a write: another owner holds the
                context's lease. Its unwritten changes are discarded and it left
                this manager's memory.
            StoreUnavailableError: the store was unreachable, or did not answer
                within its time bound (``RedisContextStore(timeout=...)``, 2 s by
                default; a flush waits at most about twice that); or
                :class:`~turnloom.errors.StoreRefusedError`: it answered but
                refuses writes for now (``OOM``, ``READONLY``). The changes
                stay queued and the next flush retries them.
            StoreKeyError: a key of the context (or, without ``context_id``, of
                some context) holds what turnloom did not write; that
                context's changes stay queued, the others are written.
            StoreRecordError: the stored log of the context is damaged (its
                length had to be reread and a record failed its check).
            StoreError: another failure of one context's write (its log is not
                what this manager wrote, even after rereading it).

        Cancellation:
            The queued changes stay queued; the writer still writes them.
        """
        durable = self._durable
        if durable is not None:
            with tracing.store_span("turnloom.store.flush", durable.store, context_id):
                await durable.flush(context_id)

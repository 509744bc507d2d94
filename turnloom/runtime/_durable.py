"""Durable contexts: leases, the batched writer, renewal, idle unloading, restore.

The manager's synchronous calls change a history and *log* the change here
(:meth:`Durability.log`, encoding the record at once); a writer task sends
everything logged so far to the store in one batched
:meth:`~turnloom.runtime.store.ContextStore.append`, while later changes queue
for the next batch. :meth:`Durability.flush` returns once everything logged
before it is in the store. A maintenance task renews the leases of the
contexts held (every third of the lease time) and unloads contexts idle
longer than ``idle_after`` (they stay in the store; the next
:meth:`Durability.claim` restores them).

Compaction: once a context's log holds more than ``8`` records per turn
held (and at least 64), the writer replaces it by one checkpoint of the
history (``ContextStore.replace``, atomic), so a restore replays about what
the history holds, not everything the context ever did. A claim compacts the
log it restored the same way. While the history holds turns aside for a
retraction of its newest turn (``TurnHistory.restorable_ids``), the
checkpoint holds them too, followed by the record of their eviction (and of
the newest turn's kept state when it changed since; see
``_records.compacted``), so a restored history retracts that turn as the live
one does.

Failures: the writer never raises. Each failure of the store is a typed
:class:`~turnloom.errors.StoreError` handed to the flushes waiting for that
write cycle and to the host's hook (``manager.leases.on_error``); the
changes stay queued and are retried by the next cycle (a flush, a change, or
the maintenance loop). A context whose write failed alone (a damaged key, a
gap) leaves the others' writes alone; a log whose length is not what this
manager expects is reread: still as written, or as the compaction whose
reply was lost left it, and otherwise changed by someone else (the context
leaves memory; its next claim restores what the store holds).

Rewrites: between :meth:`Durability.begin_rewrite` and
:meth:`Durability.end_rewrite` (synchronous, so no write cycle runs between
them) a held context's history may be removed and built again; what that
logs is not appended: the next cycle replaces the context's log by one
checkpoint of the history then held (``ContextStore.replace``, atomic), once
the records logged before the rewrite are written. A crash leaves the old
log or the new one, never a mix and never an empty log.

What a crash loses: changes logged after the last completed flush may be
lost (all of them, or a tail of them: a context's records are appended in
order, so what survives is always a prefix of what was logged). Nothing a
flush returned for is lost, within the store's own durability.
"""

from __future__ import annotations

__all__ = ("Durability",)

import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.to_thread

from turnloom.context.history import TurnHistory, check_id
from turnloom.errors import (
    FoundationClosedError,
    LeaseError,
    StaleLeaseError,
    StateError,
    StoreError,
    StoreUnavailableError,
    excerpt,
)
from turnloom.runtime import _tracing as tracing
from turnloom.runtime._door import DurableOptions
from turnloom.runtime._durable_log import Claim, restore, unheld_error, write_checkpoint
from turnloom.runtime._records import (
    Record,
    encode_record,
)
from turnloom.runtime.schemas import StoreStatistics
from turnloom.runtime.store import ContextStore, LogWrite

_T = TypeVar("_T")
_COMPACT_MIN = 64  # records: shorter logs are never compacted
_COMPACT_PER_TURN = 8  # records per turn held above which a log is compacted
# Lost contexts remembered, newest first, so a change of one says why it is
# refused (StaleLeaseError); an older loss reads as never claimed.
_LOST_REMEMBERED = 1024


class _Waiter:
    """A flush waiting for a write cycle."""

    __slots__ = ("context_id", "error", "event", "target")

    def __init__(self, target: int, context_id: str | None) -> None:
        self.target = target
        self.context_id = context_id
        self.event = anyio.Event()
        self.error: BaseException | None = None


_Hook = Callable[[StoreError | StaleLeaseError], object]


class _WriterStopped(StoreError):
    """The writer's task ended (its task group was cancelled or failed) before the write."""


def _loss_error(context_id: str, why: str) -> StaleLeaseError:
    return StaleLeaseError(
        f"This manager lost context {excerpt(context_id)} ({why}) with changes not yet "
        "written; they were discarded.",
        context_id=context_id,
    )


def _writer_stopped() -> _WriterStopped:
    return _WriterStopped(
        "The store writer stopped (the Foundation's task group was cancelled or failed) "
        "before the write; the changes stay queued and the Foundation's close writes them."
    )


class Durability:
    """The durable side of one ContextManager.

    Args:
        options: the checked store options.
        limits: the history limits (replay rebuilds with them).
        limiter: the Foundation's worker-thread limiter (replay runs there).
        install: puts a restored history (or None: nothing stored) in place of
            the context's in-memory state.
        unload: drops a context's in-memory state.
        can_unload: False while a context must stay in memory (a model call
            is in flight, or a preparation waits for its next turn).
        history: the in-memory history of a context, or None.
        on_error: the host's error hook now (``manager.leases.on_error``), or
            None; it is handed every failure of the store the writer meets.
    """

    def __init__(
        self,
        options: DurableOptions,
        limiter: anyio.CapacityLimiter,
        install: Callable[[str, TurnHistory | None], None],
        unload: Callable[[str], None],
        can_unload: Callable[[str], bool],
        history: Callable[[str], TurnHistory | None],
        on_error: Callable[[], _Hook | None] = lambda: None,
    ) -> None:
        store = options.store
        assert isinstance(store, ContextStore)
        self._store: ContextStore = store
        self._options = options
        self._limiter = limiter
        self._install = install
        self._unload = unload
        self._can_unload = can_unload
        self._history = history
        self._on_error = on_error
        self._claims: dict[str, Claim] = {}
        self._claiming: dict[str, anyio.Event] = {}
        # context id -> why, oldest loss first; at most _LOST_REMEMBERED, emptied by aclose
        self._lost: OrderedDict[str, str] = OrderedDict()
        self._forgets: list[tuple[str, int]] = []
        self._rewriting: dict[str, int] = {}  # context id -> pending records when it began
        # Deletions the running write cycle took out of _forgets and has not finished.
        self._removing: list[tuple[str, int]] = []  # the removals the cycle in flight makes
        # Contexts lost with changes queued (dropped), not yet raised by a flush, oldest
        # first: why, and whether the loss went to the host's hook.
        self._dropped: OrderedDict[str, tuple[str, bool]] = OrderedDict()
        self._waiters: list[_Waiter] = []
        self._wake = anyio.Event()
        self._started = 0  # write cycles started
        self._completed = 0  # write cycles completed
        self._closed = False
        self._scope = anyio.CancelScope()
        self._ended = False  # the writer's task (run) ended: nothing answers a flush
        self._pending = 0  # records logged and not written, over every claim
        self._batches = 0
        self._written = 0
        self._failures = 0
        self._claims_total = 0
        self.takeovers = 0  # claims that restored a stored context
        self._lost_total = 0
        self._idle_unloads = 0
        self._compactions = 0

    @property
    def store(self) -> ContextStore:
        """The store."""
        return self._store

    def claimed(self) -> tuple[str, ...]:
        """The ids of the contexts whose lease this manager holds."""
        return tuple(self._claims)

    # -- synchronous hooks (event loop) -------------------------------------------

    def check_writable(self, context_id: str) -> None:
        """Raise unless this manager holds the context's lease.

        Raises:
            InvalidMessageError: a malformed context id.
            StaleLeaseError: the lease was lost (refused write, failed renewal)
                and not claimed since; the newest 1024 losses are remembered.
            NotClaimedError: the context was never claimed, left memory idle,
                or was lost before the newest 1024 losses.
            FoundationClosedError: the close wrote what was queued and
                released the leases (a ``record`` after that point of the
                closing order).
        """
        claim = self._claims.get(context_id) if isinstance(context_id, str) else None
        if claim is not None:
            claim.used = anyio.current_time()
            return
        check_id(context_id, "context id")
        if self._closed:
            raise FoundationClosedError(
                f"The Foundation is closing: its queued changes were written and its leases "
                f"released, so context {excerpt(context_id)} takes no more changes."
            )
        raise unheld_error(context_id, self._lost.get(context_id))

    def touch(self, context_id: str) -> None:
        """Mark a held context as used now (it is not idle)."""
        claim = self._claims.get(context_id)
        if claim is not None:
            claim.used = anyio.current_time()

    def log(self, context_id: str, record: Record) -> None:
        """Queue one change of a held context for the next batch; ignored when not held."""
        claim = self._claims.get(context_id)
        if claim is None:
            return  # the state of a context this manager lost; the store has the truth
        claim.pending.append(encode_record(record))
        self._pending += 1
        self._wake.set()

    def forget(self, context_id: str) -> None:
        """Queue the deletion of a held context's log and the release of its lease.

        Inside a rewrite of the context (:meth:`begin_rewrite`) nothing is
        queued: :meth:`end_rewrite` decides what the store gets.
        """
        if context_id in self._rewriting:
            return
        claim = self._claims.pop(context_id, None)
        if claim is not None:
            self._pending -= len(claim.pending)
            self._forgets.append((context_id, claim.token))
            self._wake.set()

    def begin_rewrite(self, context_id: str) -> None:
        """Start rebuilding a held context: its changes until :meth:`end_rewrite` are not logged.

        Raises:
            InvalidMessageError, StaleLeaseError, NotClaimedError: as
                :meth:`check_writable`.
            StateError: a rewrite of the context has begun and not ended.
        """
        self.check_writable(context_id)
        if context_id in self._rewriting:
            raise StateError(f"A rewrite of context {excerpt(context_id)} is already in progress.")
        self._rewriting[context_id] = len(self._claims[context_id].pending)

    def end_rewrite(self, context_id: str) -> None:
        """End a rewrite: the store gets the history held now, in one atomic write.

        The records logged since :meth:`begin_rewrite` are dropped; the next
        write cycle replaces the context's log by a checkpoint of its history
        (once the records logged before the rewrite are appended). When the
        context is no longer held in memory, its log is deleted instead.
        Does nothing for a context whose rewrite did not begin.
        """
        mark = self._rewriting.pop(context_id, None)
        if mark is None:
            return
        claim = self._claims.get(context_id)
        if claim is None:
            return  # lost meanwhile: the store has the truth
        self._pending -= len(claim.pending) - mark
        del claim.pending[mark:]
        history = self._history(context_id)
        if history is None or not history.turn_ids:
            self.forget(context_id)
            return
        if claim.superseded >= 0:
            claim.again = True  # the checkpoint in flight predates this rewrite
        if not claim.rewrite:
            claim.rewrite = True
            claim.before = mark
        self._wake.set()

    # -- claims -------------------------------------------------------------------

    async def claim(self, context_id: str) -> bool:
        """Hold the context's lease; restore it from the store when not in memory.

        Returns:
            True when the lease was acquired now (the context was restored from
            the store, or is new); False when it was already held.

        Raises:
            LeaseHeldError: another owner holds the lease.
            StoreRecordError: a stored record does not decode or apply.
            HostCallbackError: the token counter failed while the log was replayed.
            StoreUnavailableError: the store cannot be reached.
        """
        check_id(context_id, "context id")
        while True:
            claim = self._claims.get(context_id)
            if claim is not None:
                claim.used = anyio.current_time()
                return False
            busy = self._claiming.get(context_id)
            if busy is None:
                break
            await busy.wait()
        done = self._claiming[context_id] = anyio.Event()
        try:
            if any(c == context_id for c, _ in (*self._forgets, *self._removing)):
                await self.flush()  # its removal is written first (else it would restore)
            token, log, history = await restore(
                self._store_call, self._store, self._options, self._limiter, context_id
            )
            if self._closed:  # the close released the leases while this one was taken
                await self._give_back(context_id, token)
                raise FoundationClosedError(
                    f"The Foundation closed while context {excerpt(context_id)} was claimed; "
                    "its lease is released."
                )
            self._lost.pop(context_id, None)
            self._dropped.pop(context_id, None)
            claim = self._claims[context_id] = Claim(token, len(log), anyio.current_time())
            self._claims_total += 1
            if log:
                self.takeovers += 1
            self._install(context_id, history)
            if history is not None:
                try:
                    await self._compact(context_id, claim, history)
                except StoreUnavailableError as exc:
                    self._report(exc)  # claimed; the log is compacted by a later write
                except BaseException:
                    # Cancelled (or failed) before the claim returned: as a claim
                    # cancelled during its restore, the context is left as it was.
                    if self._claims.get(context_id) is claim:
                        del self._claims[context_id]
                        self._unload(context_id)
                    await self._give_back(context_id, token)
                    raise
            return True
        finally:
            del self._claiming[context_id]
            done.set()

    async def _give_back(self, context_id: str, token: int) -> None:
        """Release the lease of a context that left memory, shielded: also when cancelled.

        Waits at most ``lease_ttl`` seconds (the lease has expired by then); a
        store that does not answer by then is reported to the host's hook.
        """
        with anyio.CancelScope(shield=True) as scope:
            scope.deadline = anyio.current_time() + self._options.lease_ttl
            await self._release_lease(context_id, token)
        if scope.cancelled_caught:
            self._report(
                StoreUnavailableError(
                    f"The context store {self._store!r} did not release the lease of context "
                    f"{excerpt(context_id)} within the lease's time to live "
                    f"({self._options.lease_ttl} s); it expires by itself."
                )
            )

    async def _release_lease(self, context_id: str, token: int) -> None:
        """Give up one lease in the store; a failure goes to the host's hook."""
        try:
            await self._store_call(self._store.release, {context_id: token})
        except StoreError as exc:
            self._report(exc)  # the lease expires by itself

    async def release(self, context_id: str) -> bool:
        """Write what is queued for a held context, then give up its lease; it leaves memory.

        Returns:
            True when the lease was held and is released now; False when the
            context was not held (nothing to do).

        Raises:
            StaleLeaseError, StoreUnavailableError, StoreError: as :meth:`flush`
                for the context; the lease is then still held (or lost).

        Cancelled while the changes are written, the context stays held; once
        it left memory, the lease is given up shielded (a failure goes to the
        host's hook), so it is never left out of memory but leased here.
        """
        check_id(context_id, "context id")
        if context_id not in self._claims:
            return False
        await self.flush(context_id)
        claim = self._claims.get(context_id)
        if claim is None or claim.pending or claim.rewrite or not self._can_unload(context_id):
            return False  # lost meanwhile, changed again, or in use
        del self._claims[context_id]
        self._unload(context_id)
        # Shielded: the context left memory, so its lease goes too, even when cancelled.
        await self._give_back(context_id, claim.token)
        return True

    def _lose(self, context_id: str, token: int, why: str) -> bool:
        """The lease of a held context was lost: it leaves memory; its queued changes go.

        Returns True when changes were queued (dropped): the next flush raises
        :class:`StaleLeaseError` for them unless a waiting flush did.
        """
        claim = self._claims.get(context_id)
        if claim is None or claim.token != token:
            return False
        del self._claims[context_id]
        self._pending -= len(claim.pending)
        self._lost_total += 1
        self._lost[context_id] = why
        self._lost.move_to_end(context_id)
        while len(self._lost) > _LOST_REMEMBERED:
            self._lost.popitem(last=False)
        dropped = bool(claim.pending or claim.rewrite)
        if dropped:
            self._dropped[context_id] = (why, False)
            self._dropped.move_to_end(context_id)
            while len(self._dropped) > _LOST_REMEMBERED:
                self._dropped.popitem(last=False)
        self._unload(context_id)
        return dropped

    # -- the writer ------------------------------------------------------------------

    async def flush(self, context_id: str | None = None) -> None:
        """Wait until every change logged before the call is in the store.

        Args:
            context_id: when given, only this context's failures are raised
                (the wait still covers every context: one batch).

        Raises:
            StaleLeaseError: the store refused a write of the context (or of
                any context, without ``context_id``): another owner holds its
                lease. Its unwritten changes are discarded and it left memory.
            StoreUnavailableError: the store was unreachable or refused writes
                for now (:class:`~turnloom.errors.StoreRefusedError`), found by
                the write cycle the flush waited for or by one in flight (a
                flush waits at most about two store time bounds); the changes
                stay queued (a later flush retries them) and nothing
                acknowledged was lost.
            StoreKeyError, StoreRecordError, StoreError: the context's write
                (without ``context_id``: some context's) failed alone: a
                damaged key or log, a log that is not what this manager wrote;
                the other contexts were written.
            StoreError: the writer's task ended before the write (the
                Foundation's task group was cancelled, or a task in it
                failed); the changes stay queued and the Foundation's close
                writes them.

        Cancellation:
            Cancelling the wait leaves the queued changes queued; the writer
            still writes them.
        """
        if context_id is not None:
            check_id(context_id, "context id")
            why = self._lost.get(context_id)
            if why is not None:
                self._dropped.pop(context_id, None)
                raise StaleLeaseError(
                    f"This manager no longer owns context {excerpt(context_id)} ({why}).",
                    context_id=context_id,
                )
        elif self._dropped:
            # Changes made before this flush were dropped with a lost lease: not stored.
            lost, (why, _) = self._dropped.popitem(last=False)
            raise _loss_error(lost, why)
        if not self._queued():
            return
        if self._ended:
            raise _writer_stopped()
        waiter = _Waiter(self._started + 1, context_id)
        self._waiters.append(waiter)
        self._wake.set()
        try:
            await waiter.event.wait()
        except BaseException:
            self._keep_unraised(waiter.error)  # given one, but the caller is cancelled
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        if waiter.error is not None:
            raise waiter.error

    def _keep_unraised(self, error: BaseException | None) -> None:
        """A loss the writer gave a flush that was cancelled before raising it: the next
        flush raises it instead (else no flush would, and one would acknowledge it)."""
        if type(error) is StaleLeaseError and error.context_id not in self._dropped:
            cid = error.context_id
            why = self._lost.get(cid, "another owner took its lease")
            self._dropped[cid] = (why, True)  # reported to the hook already

    def _queued(self) -> bool:
        """Whether a change waits for the store: a record, a rewrite or a removal."""
        return bool(
            self._forgets
            or self._removing
            or any(c.pending or c.rewrite for c in self._claims.values())
        )

    def _progress(self) -> tuple[int, int, int, int]:
        """What a write cycle changes when it does anything: records written and queued,
        removals and rewrites waiting."""
        rewrites = sum(1 for c in self._claims.values() if c.rewrite)
        return self._written, self._pending, len(self._forgets) + len(self._removing), rewrites

    async def run(self) -> None:
        """The writer and the maintenance loop; runs until :meth:`aclose` stops it.

        Never raises a store's failure: each is handed to the waiting
        flushes and to the host's error hook (``manager.leases.on_error``).
        """
        try:
            with self._scope:
                async with anyio.create_task_group() as group:
                    group.start_soon(self._maintain)
                    while True:
                        await self._wake.wait()
                        self._wake = anyio.Event()
                        await self._traced_cycle()
        finally:
            # Cancelled with the Foundation's task group (or stopped by aclose): a
            # flush it will not answer raises now; the close writes the queue itself.
            self._ended = True
            for waiter in self._waiters:
                if not waiter.event.is_set():
                    waiter.error = _writer_stopped()
                    waiter.event.set()

    async def _traced_cycle(self) -> None:
        with tracing.store_span("turnloom.store.write", self._store, root=True) as span:
            written = self._written
            await self._cycle()
            span.set("turnloom.store.records", self._written - written)

    def _report_loss(self, context_id: str, error: StaleLeaseError) -> None:
        """Hand the loss of a context's queued changes to the host's hook, once per loss."""
        entry = self._dropped.get(context_id)
        if entry is not None and not entry[1]:
            self._dropped[context_id] = (entry[0], True)
            self._report(error)

    def _report(self, error: StoreError | StaleLeaseError) -> None:
        report = self._on_error()
        if report is not None:
            try:
                report(error)
            except Exception:
                pass  # a failing hook must not stop the writer

    async def _store_call(self, call: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        """Await ``call(*args)`` of the store; an exception not turnloom's becomes a StoreError."""
        try:
            return await call(*args)
        except (StoreError, LeaseError):
            raise
        except Exception as exc:
            raise StoreError(
                f"The context store {self._store!r} raised {type(exc).__name__}: {exc}"
            ) from exc

    async def _write(
        self,
        writes: list[LogWrite],
        stale: dict[str, StaleLeaseError],
        failed: dict[str, StoreError],
    ) -> list[str]:
        """Append one batch; return the ids whose log must be reread (their idea of it was off)."""
        outcome = await self._store_call(self._store.append, writes)
        reread: list[str] = []
        for cid, token, start, records in writes:
            claim = self._claims.get(cid)
            result = outcome.get(cid)
            if result is None:
                failed[cid] = StoreError(
                    f"The context store {self._store!r} answered nothing for context "
                    f"{excerpt(cid)}."
                )
            elif isinstance(result, StoreError):
                failed[cid] = result
                if type(result) is StoreError and claim is not None and claim.token == token:
                    claim.resync = True  # a gap or a conflict: the log is not what we think
                    reread.append(cid)
            elif result == -1:
                stale[cid] = StaleLeaseError(
                    f"The store refused a write of context {excerpt(cid)}: its lease (token "
                    f"{token}) is no longer this manager's; another owner holds it.",
                    context_id=cid,
                )
                self._lose(cid, token, "the store refused a write")
            elif claim is None or claim.token != token:
                continue  # lost or forgotten meanwhile
            elif result == start + len(records):
                failed.pop(cid, None)
                del claim.pending[: len(records)]
                if claim.rewrite:
                    claim.before -= len(records)
                claim.written += len(records)
                self._pending -= len(records)
                self._written += len(records)
            else:
                failed[cid] = StoreError(
                    f"The log of context {excerpt(cid)} holds {result} records after a write "
                    f"that should have left {start + len(records)}; rereading it."
                )
                claim.resync = True
                reread.append(cid)
        return reread

    async def _cycle(self) -> None:
        """One writer cycle, as steps: write the pending records, forget the removed
        contexts, compact what was written, then answer the flushes it settles."""
        self._started += 1
        cycle = self._started
        self._batches += 1
        error: StoreError | None = None  # the store failed as a whole
        stale: dict[str, StaleLeaseError] = {}
        failed: dict[str, StoreError] = {}
        forgets, self._forgets = self._forgets, []
        self._removing = forgets  # a flush meanwhile waits for them, a claim too
        written: list[LogWrite] = []
        try:
            written, error = await self._write_pending(stale, failed)
            if error is None:
                await self._write_rewrites(failed)
            await self._forget_removed(forgets)
        except StoreError as exc:
            error = exc
        finally:  # also when cancelled: a removal not done is retried by the next cycle
            self._forgets[:0] = forgets
            self._removing = []
        # The store failing once this cycle's appends were acknowledged:
        late = await self._compact_written(written) if error is None else None
        self._settle_cycle(cycle, error, late, stale, failed)

    def _pending_writes(self) -> list[LogWrite]:
        """The plan of a cycle's writes: each claim's pending records, but unsure logs'."""
        return [
            (cid, c.token, c.written, _appendable(c))
            for cid, c in self._claims.items()
            if c.pending and not c.resync and (c.before or not c.rewrite)
        ]

    async def _write_pending(
        self, stale: dict[str, StaleLeaseError], failed: dict[str, StoreError]
    ) -> tuple[list[LogWrite], StoreError | None]:
        """Reread the unsure logs, then write every claim's pending records.

        Returns:
            the writes made, and the error of a store that refused every one
            of them (None otherwise); a context's own failure goes in
            ``failed`` or ``stale``.

        Raises:
            StoreError: the store failed as a whole.
        """
        for cid, unsure in tuple(self._claims.items()):
            if unsure.resync:
                await self._resync(cid, unsure, failed)
        writes = self._pending_writes()
        if not writes:
            return writes, None
        written = writes
        reread = await self._write(writes, stale, failed)
        # A log whose length was off (a compaction applied whose reply
        # was lost, a retried write): reread it and write once more.
        again: list[LogWrite] = []
        for cid in reread:
            claim = self._claims.get(cid)
            if claim is not None:
                await self._resync(cid, claim, failed)
                records = _appendable(claim)
                if not claim.resync and records:
                    again.append((cid, claim.token, claim.written, records))
        if again:
            await self._write(again, stale, failed)
            written = writes + again
        if failed and all(isinstance(failed.get(cid), StoreUnavailableError) for cid, *_ in writes):
            return written, next(iter(failed.values()))  # the store refuses every write
        return written, None

    async def _write_rewrites(self, failed: dict[str, StoreError]) -> None:
        """Replace the log of each context rewritten, once its earlier records are written.

        A context's failure goes in ``failed``; the rewrite is retried by the
        next cycle (after rereading the log when its outcome is unknown).

        Raises:
            StoreUnavailableError: the store cannot be reached.
        """
        for cid, claim in tuple(self._claims.items()):
            if not claim.rewrite or claim.before or claim.resync:
                continue
            history = self._history(cid)
            if history is None:
                continue  # not unloaded while rewritten (see can_unload's callers)
            claim.superseded = len(claim.pending)
            try:
                done = await write_checkpoint(
                    self._store_call, self._store, self._limiter, cid, claim, history
                )
            except StoreUnavailableError:
                raise
            except StoreError as exc:
                failed[cid] = exc
                continue
            if done:
                self._supersede(claim)
            elif self._claims.get(cid) is claim:
                claim.superseded = -1
                claim.again = False
                failed[cid] = StoreError(
                    f"The store refused to replace the log of context {excerpt(cid)} (its "
                    "length or its lease is not what this manager holds); rereading it."
                )

    def _supersede(self, claim: Claim) -> None:
        """A rewrite's checkpoint is stored: drop the pending records it holds."""
        del claim.pending[: claim.superseded]
        self._pending -= claim.superseded
        claim.superseded = -1
        claim.rewrite = claim.again  # rewritten meanwhile: once more
        claim.again = False

    async def _forget_removed(self, forgets: list[tuple[str, int]]) -> None:
        """Delete the removed contexts' logs and release their leases, oldest first.

        Each one done leaves ``forgets``; what is left is retried next cycle.

        Raises:
            StoreError: the store failed (the rest stay in ``forgets``).
        """
        while forgets:
            context_id, token = forgets[0]
            if await self._store_call(self._store.forget, context_id, token):
                await self._store_call(self._store.release, {context_id: token})
            forgets.pop(0)

    async def _compact_written(self, written: list[LogWrite]) -> StoreUnavailableError | None:
        """Compact the logs this cycle wrote to, when they are due; the store's
        unavailability once the appends were acknowledged, else None."""
        try:
            for cid, token, _, _ in written:
                claim = self._claims.get(cid)
                history = self._history(cid)
                if claim is not None and claim.token == token and history is not None:
                    await self._compact(cid, claim, history)
        except StoreUnavailableError as exc:
            return exc
        return None

    def _settle_cycle(
        self,
        cycle: int,
        error: StoreError | None,
        late: StoreError | None,
        stale: dict[str, StaleLeaseError],
        failed: dict[str, StoreError],
    ) -> None:
        """Count and report the cycle's problems, then answer the flushes it settles."""
        if error is not None or failed:
            self._failures += 1
        problems = {id(p): p for p in (error, late, *failed.values()) if p is not None}
        for problem in problems.values():
            self._report(problem)
        for cid, refused in stale.items():
            self._report_loss(cid, refused)
        # The flushes it answers raise the losses of queued changes, this cycle's
        # refusals and earlier ones (a renewal's) no flush raised yet; those raised go.
        # (A loss this cycle's failure of the context explains is raised as that.)
        lost = dict(stale)
        for cid, (why, _) in self._dropped.items():
            if cid not in failed:
                lost.setdefault(cid, _loss_error(cid, why))
        self._completed = cycle
        for cid in _answer_waiters(self._waiters, cycle, error, late, lost, failed):
            self._dropped.pop(cid, None)

    async def _resync(self, context_id: str, claim: Claim, failed: dict[str, StoreError]) -> None:
        """Reread a log this manager is unsure of: is it as written, or as compacted?

        The log must hold what this manager wrote (``claim.written`` records)
        or be the checkpoint of the compaction whose reply was lost; anything
        else was changed by someone else, and the context leaves memory (the
        next claim restores what the store holds).

        Raises:
            StoreUnavailableError: the store cannot be reached (the whole cycle fails).
        """
        try:
            log = await self._store_call(self._store.load, context_id)
        except StoreUnavailableError:
            raise
        except StoreError as exc:
            failed[context_id] = exc  # damaged: its writes wait, the others go on
            return
        if self._claims.get(context_id) is not claim:
            return
        if claim.attempt is not None and log == claim.attempt:
            if claim.superseded >= 0:
                self._supersede(claim)  # a rewrite, applied; its reply was lost
            else:
                self._compactions += 1  # applied; its reply was lost
        elif len(log) != claim.written:
            failed[context_id] = StoreError(
                f"The stored log of context {excerpt(context_id)} holds {len(log)} records, not "
                f"the {claim.written} this manager wrote: it was changed by someone else. The "
                "context left memory; claim it again to restore what the store holds."
            )
            self._lose(context_id, claim.token, "its stored log was changed by someone else")
            return
        claim.written = len(log)
        claim.attempt = None
        claim.superseded = -1  # a rewrite not applied is retried with a new checkpoint
        claim.again = False
        claim.resync = False

    async def _compact(self, context_id: str, claim: Claim, history: TurnHistory) -> None:
        """Replace a long log by a checkpoint of the history it rebuilds.

        Only when everything logged is written (the store's log is then
        exactly ``history``); a failure leaves either log, both valid, and
        the length is reread before the next write of the context.

        Raises:
            StoreUnavailableError: the store cannot be reached (the length is
                reread before the next write).
        """
        held = len(history.turn_ids)
        bound = max(_COMPACT_MIN, _COMPACT_PER_TURN * held)
        if not held or claim.written <= bound or claim.pending or claim.resync or claim.rewrite:
            return  # a checkpoint needs a turn to carry the instructions and sequence
        try:
            done = await write_checkpoint(
                self._store_call, self._store, self._limiter, context_id, claim, history
            )
        except StoreUnavailableError:
            raise
        except StoreError as exc:
            self._report(exc)
            return
        if done:
            self._compactions += 1

    # -- maintenance ----------------------------------------------------------------

    async def _maintain(self) -> None:
        options = self._options
        interval = min(options.lease_ttl / 3, options.idle_after / 2)
        while True:
            await anyio.sleep(interval)
            await self._renew()
            await self._unload_idle()
            if self._pending or self._forgets or any(c.rewrite for c in self._claims.values()):
                self._wake.set()  # changes a failed cycle left queued: try them again

    async def _renew(self) -> None:
        leases = {cid: claim.token for cid, claim in self._claims.items()}
        if not leases:
            return
        try:
            lost = await self._store_call(self._store.renew, leases, self._options.lease_ttl)
        except StoreError as exc:
            self._report(exc)
            return  # retried at the next interval; a lease that expires meanwhile is fenced
        for cid in lost:
            why = "its lease expired before it was renewed"
            if self._lose(cid, leases[cid], why):
                self._report_loss(cid, _loss_error(cid, why))

    async def _unload_idle(self) -> None:
        if math.isinf(self._options.idle_after):
            return
        bound = anyio.current_time() - self._options.idle_after
        idle = {
            cid: claim.token
            for cid, claim in self._claims.items()
            if claim.used <= bound
            and not claim.pending
            and not claim.rewrite
            and self._can_unload(cid)
        }
        for cid in idle:
            del self._claims[cid]
            self._unload(cid)
        self._idle_unloads += len(idle)
        if idle:
            try:
                await self._store_call(self._store.release, idle)
            except StoreError as exc:
                self._report(exc)  # the leases expire by themselves

    def statistics(self) -> StoreStatistics:
        """A frozen snapshot of the counters, O(1)."""
        return StoreStatistics(
            claimed=len(self._claims),
            pending_records=self._pending,
            batches_total=self._batches,
            records_written_total=self._written,
            write_failures_total=self._failures,
            claims_total=self._claims_total,
            takeovers_total=self.takeovers,
            leases_lost_total=self._lost_total,
            idle_unloads_total=self._idle_unloads,
            compactions_total=self._compactions,
        )

    # -- closing ---------------------------------------------------------------------

    async def aclose(self, grace_period: float) -> None:
        """Write what is queued (within ``grace_period`` seconds), release every lease.

        A change accepted while the last write is in flight is written by
        another one: the close writes until nothing is queued (or the store
        fails, or the grace period ends), then takes no more changes
        (:meth:`check_writable` raises :class:`FoundationClosedError`).
        A :class:`StoreError` from one of these writes ends them: it is handed
        once to the host's hook (``manager.leases.on_error``), as every failed
        write is, and is not raised (nor is a failed release: the leases
        then expire by themselves);
        what stayed unwritten is what a crash at that moment would lose.
        Not shielded: the manager's close runs shielded. The store stays
        open: its opener closes it.
        """
        try:
            with anyio.move_on_after(grace_period):
                # A record accepted while a write is in flight waits for the next
                # one: write until nothing is queued, then close at once (no await
                # between the last check and ``_closed``). A flush that changed
                # nothing would change nothing again: the close stops there.
                while self._queued():
                    before = self._progress()
                    try:
                        if self._ended:
                            # The writer's task is gone (the Foundation's task group was
                            # cancelled or failed): the close writes the queue itself.
                            await self._traced_cycle()
                        else:
                            await self.flush()
                    except _WriterStopped:
                        continue  # it stopped before this write: the close writes it
                    except StoreError:
                        break  # the cycle reported it; the unwritten is what a crash loses
                    except LeaseError:
                        pass  # refused: another owner holds the context; it left the claims
                    if self._progress() == before:
                        break
            self._closed = True
            self._scope.cancel()
            leases = {cid: claim.token for cid, claim in self._claims.items()}
            self._claims.clear()
            self._lost.clear()
            if leases:
                with anyio.move_on_after(grace_period):
                    try:
                        await self._store.release(leases)
                    except StoreError as exc:
                        self._report(exc)  # the leases expire by themselves
        finally:
            self._scope.cancel()
            for waiter in self._waiters:
                waiter.error = StoreError("The Foundation closed before the write completed.")
                waiter.event.set()
            self._waiters.clear()


def _appendable(claim: Claim) -> tuple[bytes, ...]:
    """The pending records a write cycle appends: those logged before a rewrite, if any."""
    if claim.rewrite:
        return tuple(claim.pending[: claim.before])
    return tuple(claim.pending)


def _answer_waiters(
    waiters: list[_Waiter],
    cycle: int,
    error: StoreError | None,
    late: StoreError | None,
    stale: dict[str, StaleLeaseError],
    failed: dict[str, StoreError],
) -> set[str]:
    """Answer the flushes writer cycle ``cycle`` settles, each with its error or None;
    return the contexts whose loss (``stale``) or failure a flush was given.

    A lost lease is recorded at once on every waiter of its context (and on
    waiters of all contexts). A flush waiting for this cycle or an earlier
    one is answered: with that, else its context's failure, else the store's
    ``error`` (None when there is none); one waiting for a later cycle is
    answered now only when the store was found unreachable (``error`` or
    ``late``). Answered waiters leave ``waiters``.
    """
    # A store found unreachable answers every waiting flush now, not a
    # cycle later: a flush is bounded by the store's own time bound.
    down = error if isinstance(error, StoreUnavailableError) else late
    given: set[str] = set()
    for waiter in tuple(waiters):
        mine = waiter.target <= cycle
        if waiter.error is None:
            cid = waiter.context_id
            if cid is None:
                cid = next(iter(stale), None) or (next(iter(failed), None) if mine else None)
            if cid in stale:
                waiter.error = stale[cid]
                given.add(cid)
            elif mine and cid in failed:
                waiter.error = failed[cid]
                given.add(cid)
        if not mine:
            if down is None:
                continue
            if waiter.error is None:
                waiter.error = down
        elif waiter.error is None:
            waiter.error = error
        waiters.remove(waiter)
        waiter.event.set()
    return given

"""The bounded pending queue of a ContextManager: slots, owned preparations, turn waiters.

The async part of the manager's shell. A preparation is owned by the queue,
not by its requester: :meth:`PreparationQueue.admit` starts it as a task in
the Foundation's task group and it holds its slot until it is *settled*
(delivered, failed or discarded), in ``finally``. A requester cancelled while
its preparation runs marks it unwanted and cancels its scope; a worker thread
that is rendering is never abandoned (anyio's ``run_sync`` does not return
before the thread does). A result counts as delivered only when its requester
resumes with it: a requester cancelled after its preparation settled (a
deadline between the two) discards it, and what it would have delivered
(an area section) goes to the next preparation.
"""

from __future__ import annotations

__all__ = ("Preparation", "PreparationQueue")

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import anyio.lowlevel

from turnloom.errors import QueueFullError, excerpt
from turnloom.runtime._counters import Counters
from turnloom.runtime._slots import FairSlots, Tenant
from turnloom.runtime.errors import FoundationClosedError
from turnloom.runtime.schemas import ContextPrepareRequest, PreparedContext

if TYPE_CHECKING:
    from turnloom.runtime._contexts import ContextState


class Preparation:
    """One admitted preparation and how it settled."""

    __slots__ = (
        "deliver",
        "done",
        "error",
        "origin",
        "request",
        "requested_at",
        "result",
        "scope",
        "tenant",
        "wanted",
    )

    def __init__(
        self, request: ContextPrepareRequest, requested_at: float, origin: ContextState | None
    ) -> None:
        self.request = request
        self.tenant = tenant_of(request)
        self.requested_at = requested_at  # anyio.current_time() of the call
        # The context the request was made for (None: not created yet); a
        # context created again with the same id after a removal never serves it.
        self.origin = origin
        self.done = anyio.Event()
        self.scope: anyio.CancelScope | None = None
        self.wanted = True
        self.result: PreparedContext | None = None
        # Set with ``result``: what delivering it changes, run when the requester gets it.
        self.deliver: Callable[[], None] | None = None
        self.error: BaseException | None = None


def tenant_of(request: ContextPrepareRequest) -> Tenant:
    """The tenant whose share of the slots a request uses (None without one)."""
    return request.tenant.tenant_id if request.tenant is not None else None


class _Waiters:
    __slots__ = ("count", "event")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.count = 0


Work = Callable[[Preparation, anyio.CancelScope], Awaitable[None]]
"""What a preparation does once admitted; it sets ``result`` unless cancelled."""

InlineWork = Callable[
    [ContextPrepareRequest, float, "ContextState | None"],
    "tuple[PreparedContext, Callable[[], None]] | None",
]
"""The whole of a small preparation, synchronously: its result and what delivering
it changes, or None when it must run as a task (nothing was done)."""


class PreparationQueue:
    """At most ``capacity`` preparations admitted and not yet settled.

    Slots are shared between tenants by the rule of :mod:`turnloom.runtime._slots`.
    """

    def __init__(
        self,
        capacity: int,
        task_group: anyio.abc.TaskGroup,
        counters: Counters,
        tenant_limit: int | None = None,
    ) -> None:
        self.capacity = capacity
        self._task_group = task_group
        self._counters = counters
        self._slots = FairSlots(capacity, tenant_limit if tenant_limit is not None else capacity)
        self._preparations: set[Preparation] = set()
        self._settled = anyio.Event()
        self._settled.set()
        self._waiters: dict[str, _Waiters] = {}
        self._waiting_for_turn = 0
        self.closed = False

    @property
    def pending(self) -> int:
        """Preparations admitted and not yet settled."""
        return len(self._preparations)

    @property
    def waiting_for_slot(self) -> int:
        """Calls waiting in :meth:`acquire`."""
        return self._slots.waiting

    @property
    def tenant_limit(self) -> int:
        """The most slots one tenant holds at once."""
        return self._slots.tenant_limit

    @property
    def waiting_for_turn(self) -> int:
        """Admitted preparations waiting in :meth:`next_commit`."""
        return self._waiting_for_turn

    async def acquire(self, request: ContextPrepareRequest) -> bool:
        """Wait for a slot for the request's tenant (cancellable; nothing is admitted yet).

        Returns whether the call had to wait for it (False: it was free).
        """
        return await self._slots.acquire(tenant_of(request))

    def acquire_nowait(self, request: ContextPrepareRequest) -> None:
        """Take a slot at once.

        Raises:
            QueueFullError: every slot is taken, or the request's tenant holds
                its limit (counted as a rejection).
        """
        tenant = tenant_of(request)
        if not self._slots.try_acquire(tenant):
            self._counters.rejected += 1
            if self._slots.free and tenant is not None:
                raise QueueFullError(
                    f"Tenant {excerpt(tenant[:64])} holds its limit of {self._slots.tenant_limit} "
                    f"preparation slots; preparation of turn {excerpt(request.turn_id)} of context "
                    f"{excerpt(request.context_id)} was refused.",
                    capacity=self.capacity,
                )
            raise QueueFullError(
                f"All {self.capacity} preparation slots are taken; preparation of turn "
                f"{excerpt(request.turn_id)} of context {excerpt(request.context_id)} was refused.",
                capacity=self.capacity,
            )

    async def admit(
        self,
        request: ContextPrepareRequest,
        requested_at: float,
        origin: ContextState | None,
        work: Work,
        inline: InlineWork | None = None,
        *,
        checkpointed: bool = True,
    ) -> PreparedContext:
        """Run ``work`` as an owned preparation in the slot the caller holds; await it.

        ``inline`` is tried first: when it does the whole preparation on the
        spot, no task is started and the slot is freed at once; the result is
        delivered as a task's would be. Unless the caller already passed a
        checkpoint (``checkpointed``, as :meth:`acquire` does), the caller
        then passes one, holding the slot, and a caller cancelled there
        discards the result.

        Raises:
            FoundationClosedError: the queue closed while the caller waited for
                its slot, or the preparation was cancelled by the close.
            whatever ``work`` raised.
        """
        if inline is not None and not self.closed:
            tenant = tenant_of(request)
            try:
                done = inline(request, requested_at, origin)
            except BaseException as exc:
                self._slots.release(tenant)
                if isinstance(exc, Exception):
                    self._counters.failed += 1
                raise
            if done is not None:
                if not checkpointed:
                    # The slot is held until the requester resumes with the result.
                    try:
                        await anyio.lowlevel.checkpoint()
                    except BaseException:
                        self._counters.discarded += 1  # settled, but the requester is gone
                        raise
                    finally:
                        self._slots.release(tenant)
                else:
                    self._slots.release(tenant)
                prepared, deliver = done
                deliver()
                self._counters.prepared += 1
                return prepared
        preparation = Preparation(request, requested_at, origin)
        try:
            if self.closed:
                raise FoundationClosedError(
                    "The Foundation closed while the preparation waited for a slot."
                )
            self._preparations.add(preparation)
            self._settled = anyio.Event() if self._settled.is_set() else self._settled
            self._task_group.start_soon(self._own, preparation, work)
        except BaseException:
            self._preparations.discard(preparation)
            self._slots.release(preparation.tenant)
            if not self._preparations:
                self._settled.set()
            raise
        try:
            await preparation.done.wait()
        except BaseException:
            # The requester is gone: the preparation is discarded, never abandoned.
            preparation.wanted = False
            if preparation.result is not None:
                # It settled, but the requester was cancelled before it resumed:
                # nothing was delivered.
                self._counters.discarded += 1
            elif preparation.scope is not None:
                preparation.scope.cancel()
            raise
        if preparation.error is not None:
            raise preparation.error
        assert preparation.result is not None
        if preparation.deliver is not None:
            preparation.deliver()
        self._counters.prepared += 1
        return preparation.result

    async def _own(self, preparation: Preparation, work: Work) -> None:
        try:
            with anyio.CancelScope() as scope:
                preparation.scope = scope
                if not preparation.wanted:
                    scope.cancel()
                await work(preparation, scope)
        except Exception as exc:
            preparation.error = exc
        finally:
            if preparation.result is None and preparation.error is None:
                # Cancelled by aclose, or by a cancellation of the scope the
                # Foundation was opened in: a requester elsewhere still gets
                # the typed error.
                request = preparation.request
                preparation.error = FoundationClosedError(
                    f"The preparation of turn {excerpt(request.turn_id)} of context "
                    f"{excerpt(request.context_id)} was cancelled while the Foundation closed."
                )
            # A result is counted by its requester (admit); the rest here.
            if preparation.result is None:
                if preparation.wanted:
                    self._counters.failed += 1
                else:
                    self._counters.discarded += 1
            self._preparations.discard(preparation)
            self._slots.release(preparation.tenant)
            if not self._preparations:
                self._settled.set()
            preparation.done.set()

    def wake(self, context_id: str) -> None:
        """Wake the preparations waiting for a commit to (or the removal of) ``context_id``."""
        waiters = self._waiters.pop(context_id, None)
        if waiters is not None:
            waiters.event.set()

    def waits_on(self, context_id: str) -> bool:
        """True while a preparation waits for a commit to (or the removal of) ``context_id``."""
        return context_id in self._waiters

    async def next_commit(self, context_id: str) -> None:
        """Wait until :meth:`wake` is called for ``context_id`` or the queue closes."""
        waiters = self._waiters.get(context_id)
        if waiters is None:
            waiters = self._waiters[context_id] = _Waiters()
        waiters.count += 1
        self._waiting_for_turn += 1
        try:
            await waiters.event.wait()
        finally:
            self._waiting_for_turn -= 1
            waiters.count -= 1
            if waiters.count == 0 and self._waiters.get(context_id) is waiters:
                del self._waiters[context_id]

    async def aclose(self, grace_period: float) -> None:
        """Stop intake, let preparations settle for ``grace_period`` seconds, cancel the rest.

        Returns once every preparation settled. Not shielded: the caller
        shields it.
        """
        self.closed = True
        for waiters in self._waiters.values():
            waiters.event.set()
        self._waiters.clear()
        with anyio.move_on_after(grace_period):
            await self._wait_settled()
        for preparation in tuple(self._preparations):
            if preparation.scope is not None:
                preparation.scope.cancel()
        await self._wait_settled()

    async def _wait_settled(self) -> None:
        while self._preparations:
            await self._settled.wait()

"""The bounded pending queue of a ContextManager: slots, owned preparations, turn waiters.

The async part of the manager's shell. A requester whose turn is not
committed yet waits for the commit in :meth:`PreparationQueue.next_commit`
before it takes a slot: it holds none and is not admitted, so calls waiting
for turns that never come (mistyped ids, a host preparing ahead of
``accept_turn``) never starve the other contexts. A preparation is owned by the queue
from :meth:`PreparationQueue.admit` until it is *settled* (delivered, failed
or discarded), and holds its slot until then. It runs in its requester's
task; the close cancels it: the wait it is in (for its turn, its assembly)
runs in a cancel scope made for that wait, and one cancelled between waits
renders nothing. No task, event or handoff per preparation, and no cancel
scope for one that never waits. A requester cancelled while its preparation waits
(for its turn, its assembly, its render queued in the render thread, which
then skips it) settles it as discarded on the spot. One cancelled while its
render runs in the render thread returns at once, but the preparation stays
owned, its slot held, until the thread returns and settles it on the event loop (see
:meth:`PreparationQueue.settle`): a thread that is rendering is never
abandoned. A result counts as delivered only when its requester resumes with
it: a requester cancelled after the render finished but before it resumed (a
deadline between the two) discards it, and what it would have delivered (an
area section) goes to the next preparation.
"""

from __future__ import annotations

__all__ = ("Preparation", "PreparationQueue")

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import anyio
import anyio.abc

from turnloom.errors import ContextRemovedError, QueueFullError, UnknownTurnError, excerpt
from turnloom.runtime._counters import Counters
from turnloom.runtime._slots import FairSlots, Tenant
from turnloom.runtime._wakeup import CancelScope, loop_hooks
from turnloom.runtime.errors import FoundationClosedError
from turnloom.runtime.schemas import ContextPrepareRequest, PreparedContext

if TYPE_CHECKING:
    from turnloom.runtime._area_section import AreaSection
    from turnloom.runtime._contexts import ContextState


T = TypeVar("T")


class Preparation:
    """One admitted preparation and how it settled."""

    __slots__ = (
        "abandoned",
        "areas",
        "cancelled",
        "closed",
        "deliver",
        "origin",
        "outcome",
        "removed",
        "rendering",
        "request",
        "requested_at",
        "result",
        "retracted",
        "scope",
        "tenant",
        "thread",
        "wanted",
    )

    def __init__(
        self,
        request: ContextPrepareRequest,
        requested_at: float,
        origin: ContextState | None,
    ) -> None:
        self.request = request
        self.tenant = tenant_of(request)
        self.requested_at = requested_at  # anyio.current_time() of the call
        # The context the request was made for (None: not created yet); a
        # context created again with the same id after a removal never serves it.
        self.origin = origin
        # Cancelled (by the close, a removal, the watcher): it renders nothing.
        # ``scope`` is the cancel scope of the wait it is in (for its turn, its
        # assembly), None between waits: a preparation that never waits makes
        # none (see :meth:`wait_in_scope`).
        self.cancelled = False
        self.scope: CancelScope | None = None
        self.wanted = True  # False once the requester is gone
        self.result: PreparedContext | None = None
        # Set with ``result``: what delivering it changes, run when the requester gets it.
        self.deliver: Callable[[], None] | None = None
        # The requester awaits the worker thread's render: the close marks it
        # ``closed`` (its result is discarded once the thread returns) instead
        # of cancelling it.
        self.rendering = False
        self.closed = False
        # Its context was removed: cancelled, or its render's result discarded.
        self.removed = False
        # Its turn was retracted (a false start): the same, its requester gets UnknownTurnError.
        self.retracted = False
        # The requester left while the thread rendered: the worker settles it.
        self.abandoned = False
        # The render's handoff between the loop and the worker thread (see
        # ``Preparer``): its state, what it returned or raised, and the area
        # section it ran with.
        self.thread = 0
        self.outcome: object = None
        self.areas: AreaSection | None = None

    def cancel(self) -> None:
        """Cancel the preparation: the wait it is in ends, and it renders nothing."""
        self.cancelled = True
        if self.scope is not None:
            self.scope.cancel()

    async def wait(self, scope: CancelScope, waiting: Awaitable[T]) -> T | None:
        """Await ``waiting`` in ``scope``, a new cancel scope that :meth:`cancel` cancels.

        Returns what it returned, or None when the preparation was cancelled
        (then or before: ``waiting`` is then cancelled at its first wait).
        Errors propagate; so does a cancellation from outside the scope.
        """
        self.scope = scope
        if self.cancelled:
            scope.cancel()
        try:
            with scope:
                return await waiting
        finally:
            self.scope = None
        return None  # the scope caught its own cancellation


def tenant_of(request: ContextPrepareRequest) -> Tenant:
    """The tenant whose share of the slots a request uses (None without one)."""
    return request.tenant.tenant_id if request.tenant is not None else None


class _Waiters:
    __slots__ = ("count", "event")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.count = 0


Work = Callable[[Preparation], Awaitable[None]]
"""What a preparation does once admitted, in its requester's task, each of its
waits through :meth:`Preparation.wait`; it sets ``result`` unless cancelled
(:attr:`Preparation.cancelled`: it then renders nothing) or closed."""

InlineWork = Callable[
    [ContextPrepareRequest, float, "ContextState | None"],
    "tuple[PreparedContext, Callable[[], None]] | None",
]
"""The whole of a small preparation, synchronously: its result and what delivering
it changes, or None when it must run as owned work (nothing was done)."""


class PreparationQueue:
    """At most ``capacity`` preparations admitted and not yet settled.

    Slots are shared between tenants by the rule of :mod:`turnloom.runtime._slots`.
    A watcher task in ``task_group`` cancels the preparations that wait when
    the task group's scope is cancelled (the scope the Foundation was opened
    in), as the close would.
    """

    def __init__(
        self,
        capacity: int,
        task_group: anyio.abc.TaskGroup,
        counters: Counters,
        tenant_limit: int | None = None,
    ) -> None:
        self.capacity = capacity
        self._counters = counters
        self.hooks = loop_hooks()  # the loop's clock, checkpoint and cancel scopes
        self._slots = FairSlots(
            capacity,
            tenant_limit if tenant_limit is not None else capacity,
            self.hooks.checkpoint,
            self.hooks.signal,
            # A quarter of the slots handed at once: the requests resuming per
            # loop iteration when every slot is contended (see _slots, rule 4).
            max(1, capacity // 4),
        )
        # The slot calls of a prepare that waits (``ContextManager.prepare``),
        # by tenant (:func:`tenant_of`), bound once: ``try_acquire(tenant)``
        # takes a slot if the rule allows it now (never waits, never overtakes
        # an eligible waiter); else the requester ``enqueue(tenant)``s a
        # waiter and awaits its ``signal.wait()`` in its own frame (no frame
        # of the queue or the slots), then calls ``resumed()``, or
        # ``leave(waiter)`` if the wait raised (see :meth:`FairSlots.park`):
        # a cancelled wait holds no slot, one granted to it meanwhile is
        # handed to the next waiter. Nothing is admitted yet.
        self.try_acquire = self._slots.try_acquire
        self.enqueue = self._slots.enqueue
        self.leave = self._slots.leave
        self.resumed = self._slots.resumed
        self._preparations: set[Preparation] = set()
        self._settled = anyio.Event()
        self._settled.set()
        self._waiters: dict[str, _Waiters] = {}
        self._waiting_for_turn = 0
        self.closed = False
        # The task group's scope was cancelled: owned work starts cancelled.
        self._cancelled = False
        self._watching = anyio.CancelScope()
        task_group.start_soon(self._watch)

    @property
    def pending(self) -> int:
        """Preparations admitted and not yet settled."""
        return len(self._preparations)

    @property
    def waiting_for_slot(self) -> int:
        """Calls waiting for a slot (queued by :attr:`enqueue`)."""
        return self._slots.waiting

    @property
    def tenant_limit(self) -> int:
        """The most slots one tenant holds at once."""
        return self._slots.tenant_limit

    @property
    def waiting_for_turn(self) -> int:
        """Calls waiting in :meth:`next_commit`.

        Requesters waiting for their turn's commit before taking a slot
        (holding none, not counted in :attr:`pending`).
        """
        return self._waiting_for_turn

    def acquire_nowait(self, request: ContextPrepareRequest) -> None:
        """Take a slot at once.

        Raises:
            QueueFullError: every slot is taken, the request's tenant holds
                its limit, or the free slots are being handed to requests
                that wait for them (counted as a rejection).
        """
        tenant = tenant_of(request)
        slots = self._slots
        if not slots.try_acquire(tenant):
            self._counters.rejected += 1
            if slots.free and tenant is not None and slots.held(tenant) >= slots.tenant_limit:
                raise QueueFullError(
                    f"Tenant {excerpt(tenant[:64])} holds its limit of {self._slots.tenant_limit} "
                    f"preparation slots; preparation of turn {excerpt(request.turn_id)} of context "
                    f"{excerpt(request.context_id)} was refused.",
                    capacity=self.capacity,
                )
            if slots.free:  # being handed to the requests that wait for them (rule 4)
                raise QueueFullError(
                    f"{slots.waiting} requests wait for the {self.capacity} preparation slots; "
                    f"preparation of turn {excerpt(request.turn_id)} of context "
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
        yielded: bool = False,
    ) -> PreparedContext:
        """Own a preparation in the slot the caller holds; run it in the caller's task.

        ``inline`` is tried first: when it does the whole preparation on the
        spot, the slot is freed at once and the result is delivered as
        ``work``'s would be: at once when the caller already yielded since
        its call (``yielded``: it waited for its slot or its turn's commit),
        else after it passes a checkpoint holding the slot (a caller
        cancelled there discards the result), the call's one yield. Otherwise
        ``work`` runs, its waits in cancel scopes the close cancels
        (:meth:`Preparation.wait`); see the module docstring for a caller
        cancelled meanwhile.

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
                if not yielded:
                    # The call's one yield, holding the slot until the
                    # requester resumes with the result.
                    try:
                        await self.hooks.checkpoint()
                    except BaseException:
                        self._counters.discarded += 1  # settled, but the requester is gone
                        self._slots.release(tenant)
                        raise
                self._slots.release(tenant)
                prepared, deliver = done
                deliver()
                self._counters.prepared += 1
                return prepared
        preparation = Preparation(request, requested_at, origin)
        if self.closed:
            self._slots.release(preparation.tenant)
            raise FoundationClosedError(
                "The Foundation closed while the preparation waited for a slot."
            )
        self._preparations.add(preparation)
        if self._settled.is_set():
            self._settled = anyio.Event()
        if self._cancelled:
            preparation.cancelled = True
        try:
            await work(preparation)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                preparation.wanted = False  # the requester is gone
            if not preparation.abandoned:
                self.settle(preparation)
            raise
        self.settle(preparation)
        if preparation.removed:
            raise ContextRemovedError(
                f"Context {excerpt(request.context_id)} was removed while the preparation of "
                f"turn {excerpt(request.turn_id)} was in flight; its result was discarded.",
                context_id=request.context_id,
                turn_id=request.turn_id,
            )
        if preparation.retracted:
            raise UnknownTurnError(
                f"Turn {excerpt(request.turn_id)} of context {excerpt(request.context_id)} was "
                "retracted while its preparation was in flight; its result was discarded."
            )
        if preparation.result is None:
            # Cancelled by the close (or by a cancellation of the scope the
            # Foundation was opened in), or closed while its thread rendered.
            raise FoundationClosedError(
                f"The preparation of turn {excerpt(request.turn_id)} of context "
                f"{excerpt(request.context_id)} was cancelled while the Foundation closed."
            )
        if preparation.deliver is not None:
            preparation.deliver()
        self._counters.prepared += 1
        return preparation.result

    def settle(self, preparation: Preparation) -> None:
        """Settle an owned preparation: count how it ended and free its slot.

        A result is counted by its requester (:meth:`admit`), once it resumes
        with it; a preparation without one failed (its requester gets the
        error) or was discarded (its requester is gone). The preparer settles
        a preparation whose requester left while its thread rendered, when
        the thread returns; :meth:`admit` settles every other one.
        """
        if preparation.removed or preparation.retracted:
            preparation.result = None
            self._counters.discarded += 1
        elif preparation.result is None:
            if preparation.wanted:
                self._counters.failed += 1
            else:
                self._counters.discarded += 1
        self._preparations.discard(preparation)
        self._slots.release(preparation.tenant)
        if not self._preparations:
            self._settled.set()

    def _close(self, preparation: Preparation) -> None:
        """Cancel a preparation for the close: one that is rendering is marked closed."""
        if preparation.rendering:
            preparation.closed = True
        else:
            preparation.cancel()

    async def _watch(self) -> None:
        with self._watching:
            try:
                await anyio.sleep_forever()
            finally:
                if not self._watching.cancel_called:
                    # The task group's scope was cancelled (an error in the host's
                    # body, or a cancellation of the scope the Foundation was opened
                    # in): what waits is cancelled, a render finishes and is delivered.
                    self._cancelled = True
                    for preparation in tuple(self._preparations):
                        if not preparation.rendering:
                            preparation.cancel()

    def remove(self, context_id: str, state: ContextState) -> None:
        """Discard the preparations of a removed context (``state``, or not yet created).

        One that waits (for its turn, its assembly or a thread) is cancelled;
        one whose thread renders is left to finish and its result discarded.
        Each settles as discarded and its requester gets ContextRemovedError.
        """
        self._discard(context_id, state, None)
        self.wake(context_id)

    def retract(self, context_id: str, turn_id: str, state: ContextState) -> None:
        """Discard the preparations of a retracted turn of ``state`` (as :meth:`remove`):
        each settles as discarded and its requester gets UnknownTurnError."""
        self._discard(context_id, state, turn_id)

    def _discard(self, context_id: str, state: ContextState, turn_id: str | None) -> None:
        """Mark the preparations of ``context_id`` made for ``state`` (or before it
        existed), of ``turn_id`` only when given: removed, else retracted. One
        that waits is cancelled; one whose thread renders finishes first."""
        for preparation in tuple(self._preparations):
            request = preparation.request
            if request.context_id != context_id or preparation.origin not in (None, state):
                continue
            if turn_id is None:
                preparation.removed = True
            elif request.turn_id == turn_id:
                preparation.retracted = True
            else:
                continue
            if not preparation.rendering:
                preparation.cancel()

    def wake(self, context_id: str) -> None:
        """Wake the calls waiting for a commit to (or the removal of) ``context_id``."""
        waiters = self._waiters.pop(context_id, None)
        if waiters is not None:
            waiters.event.set()

    def waits_on(self, context_id: str) -> bool:
        """True while a call waits for a commit to (or the removal of) ``context_id``."""
        return context_id in self._waiters

    async def next_commit(self, context_id: str) -> None:
        """Wait until :meth:`wake` is called for ``context_id`` or the queue closes.

        Holds no slot: a requester waits here for its turn's commit before
        it takes or waits for a slot (:attr:`try_acquire`, :attr:`enqueue`;
        counted in :attr:`waiting_for_turn`, not in :attr:`pending`). The
        caller checks the turn again on waking.
        """
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

        A preparation whose thread is rendering is not cancelled: its result
        is discarded when the thread returns. Returns once every preparation
        settled, and stops the watcher. Not shielded: the caller shields it.
        """
        self.closed = True
        for waiters in self._waiters.values():
            waiters.event.set()
        self._waiters.clear()
        try:
            with anyio.move_on_after(grace_period):
                await self._wait_settled()
            for preparation in tuple(self._preparations):
                self._close(preparation)
            await self._wait_settled()
        finally:
            self._watching.cancel()

    async def _wait_settled(self) -> None:
        while self._preparations:
            await self._settled.wait()

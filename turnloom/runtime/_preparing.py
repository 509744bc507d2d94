"""The work of one owned preparation: wait for the turn, capture, assemble, render, deliver.

The async part the :class:`~turnloom.runtime._queue.PreparationQueue` runs for
each admitted preparation, in its requester's task (see
``ContextManager.prepare`` for its contract). The history and the request's
state are captured once, when the turn is committed; an assembly strategy
runs on the event loop, once per turn, in the preparation's cancel scope; the
render runs in the Foundation's render thread (:mod:`turnloom.runtime._worker`,
one per Foundation, fed in batches; the bounded pending queue bounds what it
holds), its requester waiting on one bare :class:`~turnloom.runtime._wakeup.
Signal`, and is never abandoned mid-render: a requester that leaves meanwhile
leaves the preparation to the thread, which settles it when its batch comes
back to the loop. What delivering a result changes is deferred to
``Preparation.deliver``, which the queue runs only when the requester resumes
with it.
"""

from __future__ import annotations

__all__ = ("Preparer",)

import contextlib
import threading
import time
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any

import anyio
import msgspec

from turnloom.context.gateways import (
    AnthropicGateway,
    GeminiGateway,
    OpenAIChatGateway,
    OpenAIResponsesGateway,
)
from turnloom.context.history import HistoryView
from turnloom.context.items import COPY_AHEAD_ITEMS, NativeItems
from turnloom.errors import AreaCallbackError, QueueFullError, StateError, excerpt, what_type
from turnloom.runtime import _tracing as tracing
from turnloom.runtime._area_section import AreaSection, SectionResult
from turnloom.runtime._contexts import ContextState, ContextTable, TurnAssembly
from turnloom.runtime._continuation import IssuedPrefixes
from turnloom.runtime._counters import Counters
from turnloom.runtime._door import ManagerOptions, check_request
from turnloom.runtime._durable import Durability
from turnloom.runtime._queue import Preparation, PreparationQueue, tenant_of
from turnloom.runtime._render import DeliveredPrefix, Rendered, render_preparation
from turnloom.runtime._wakeup import Signal
from turnloom.runtime._worker import RenderWorker
from turnloom.runtime.assembly import AssembledContext, AssemblyStrategy, assembly_query
from turnloom.runtime.errors import FoundationClosedError
from turnloom.runtime.schemas import ContextPrepareRequest, PreparedContext
from turnloom.runtime.state import read_clock

INLINE_MAX_ITEMS = 512
"""The most items' worth of work a prepare may do to render inline.

Counted by :meth:`~turnloom.context.history.HistoryView.render_bounded`:
the items it renders, decodes or re-encodes, and every item held when the
history's cached run must be built, rebuilt or compacted. A render on the
event loop is then a small, bounded step whatever the history's size (its
cached items are handed out without a copy); one over it renders in a
worker thread.
"""

INLINE_SHARE = 0.25
"""The most of the event loop's time inline renders take, over windows of
:data:`INLINE_WINDOW` seconds; past it a preparation renders in a worker thread.

Inline renders save the thread handoff, but a loop busy with them is late for
everything else it runs; a worker's render leaves the loop free for a switch
interval at a time."""

INLINE_WINDOW = 0.02
"""The window, in seconds, over which :data:`INLINE_SHARE` is kept."""

_INLINE_GATEWAYS = frozenset(
    {AnthropicGateway, GeminiGateway, OpenAIChatGateway, OpenAIResponsesGateway}
)

_RenderArgs = tuple[
    ManagerOptions,
    HistoryView,
    ContextPrepareRequest,
    str | None,
    DeliveredPrefix | None,
    float,
    AreaSection | None,
    bool,
    AssembledContext | None,
]
"""The arguments of :func:`render_preparation` for a worker thread's render."""

_RenderJob = tuple["Preparation", _RenderArgs, Signal, "tracing.PrepareTrace | None"]
"""A render handed to the worker: the preparation, its arguments, the signal its
requester awaits, and the prepare's span."""

# ``Preparation.thread``: where its render stands between the loop and the
# worker thread. _QUEUED -> _RUNNING (thread) and _QUEUED -> _GONE (loop) are
# changed under ``Preparer._handoff``; every later move happens on the loop.
_QUEUED = 0  # handed to the worker; the thread has not begun
_RUNNING = 1  # the thread renders, or its batch has not come back yet
_DONE = 2  # the batch came back (``outcome`` is set)
_GONE = 3  # the requester left before the thread began: it renders nothing
_ABANDONED = 4  # the requester left while the thread rendered: the batch settles it


def _make_copy(items: NativeItems) -> None:
    """In the worker: one host copy of ``items`` made ahead (see :meth:`Preparer.refill`)."""
    items.make_copies(1)


def _clear(copies: list[tuple[Any, ...]]) -> None:
    """In the worker: free the host copies ``copies`` holds (see :meth:`Preparer._release`)."""
    copies.clear()


class Preparer:
    """Runs admitted preparations for one bound manager.

    ``queue`` is the manager's bounded pending queue (which bounds the renders
    handed to the render thread) and ``limiter`` the Foundation's
    worker-thread limiter (for work other than renders; ``worker_threads``).

    ``closing`` is set by the manager when its Foundation begins closing: a
    call still waiting for its turn's commit (holding no slot) then fails
    with :class:`FoundationClosedError`.
    """

    __slots__ = (
        "_cancel_scope",
        "_checkpoint_if_cancelled",
        "_clock",
        "_counters",
        "_durable",
        "_gateway_type",
        "_handoff",
        "_inline",
        "_inline_spent",
        "_inline_window",
        "_issued",
        "_now",
        "_options",
        "_refused",
        "_render_bound",
        "_rendering",
        "_signal",
        "_strategy_name",
        "_table",
        "closing",
        "limiter",
        "queue",
        "worker",
    )

    def __init__(
        self,
        options: ManagerOptions,
        table: ContextTable,
        counters: Counters,
        issued: IssuedPrefixes,
        queue: PreparationQueue,
        limiter: anyio.CapacityLimiter,
        clock: Callable[[], datetime],
        durable: Durability | None,
    ) -> None:
        self._options = options
        self._table = table
        self._counters = counters
        self._issued = issued
        self.queue = queue
        self.limiter = limiter
        self._clock = clock
        self._durable = durable
        self.closing = False
        self._inline_window = 0.0  # when the current window began (time.perf_counter())
        self._inline_spent = 0.0  # seconds spent rendering inline in it
        # The last request prepare_nowait checked and then refused for a full
        # queue, when nothing in it can change (see prepare); None once used.
        self._refused: ContextPrepareRequest | None = None
        # Renders handed to the worker whose batch has not come back (at most
        # the queue's capacity: each holds its preparation's slot).
        self._rendering = 0
        # ``worker_threads``: with this many renders in the thread, one more renders there too.
        self._render_bound = limiter.total_tokens
        self._now = queue.hooks.now  # the loop's clock, as anyio.current_time reads it
        self._cancel_scope = queue.hooks.cancel_scope
        self._signal = queue.hooks.signal  # the worker's hooks are the queue's
        self._checkpoint_if_cancelled = queue.hooks.checkpoint_if_cancelled
        # Read once: the options are frozen, a gateway's type is constant.
        self._gateway_type = options.gateway.type
        self._strategy_name = options.strategy.name if options.strategy is not None else None
        # No strategy and a built-in gateway: a render may run inline (run_inline).
        self._inline = options.strategy is None and type(options.gateway) in _INLINE_GATEWAYS
        self.worker = RenderWorker(hooks=queue.hooks)
        self._handoff = threading.Lock()  # guards each Preparation.thread leaving _QUEUED

    def refill(self, items: NativeItems) -> None:
        """Have the worker make a prefix's next host copy ahead, after ``build`` took one.

        Nothing for a prefix of fewer than
        :data:`~turnloom.context.items.COPY_AHEAD_ITEMS` items (``build``
        copies it), when one is ready, the Foundation is closing or the worker
        thread has not started (nothing rendered in it yet); else one job
        for the worker, not handed back (O(1) here: a lock and an append).
        A build that comes before the copy is made copies on its own thread.
        """
        if (
            len(items) < COPY_AHEAD_ITEMS
            or items.copies_ready
            or self.closing
            or not self.worker.alive
        ):
            return
        self.worker.submit(_make_copy, None, items)

    def _release(self, copies: list[tuple[Any, ...]] | None) -> None:
        """Free host copies no one will take in the worker (O(1) here), else here."""
        if copies and not self.closing and self.worker.alive:
            self.worker.submit(_clear, None, copies)

    def prepare(
        self, request: ContextPrepareRequest, *, wait: bool
    ) -> Coroutine[Any, Any, PreparedContext]:
        """Check a request, wait for its turn's commit, take a slot, own the preparation.

        Returns the coroutine to await for its result (nothing is done until
        it is awaited). The flow of ``ContextManager.prepare``
        (``wait``) and ``prepare_nowait`` (``wait=False``: once the turn is
        committed, take a slot at once or raise
        :class:`~turnloom.errors.QueueFullError`); see there for the errors
        and cancellation. The request is checked, and the commit waited for
        holding no slot, before a slot is taken.
        """
        traced = tracing.prepare_span(self._gateway_type, request, self._strategy_name)
        if type(traced) is tracing.PrepareTrace:
            return self._traced(traced, request, wait)
        # Nothing records: the admission's own coroutine, no span frame around it.
        return self._admit(request, wait=wait)

    async def _traced(
        self, traced: tracing.PrepareTrace, request: ContextPrepareRequest, wait: bool
    ) -> PreparedContext:
        """:meth:`_admit` inside the prepare's span (entered in the requester's task)."""
        with traced:
            prepared = await self._admit(request, wait=wait)
            traced.delivered(prepared)
            return prepared

    async def _admit(self, request: ContextPrepareRequest, *, wait: bool) -> PreparedContext:
        queue = self.queue
        given = request
        refused, self._refused = self._refused, None
        if refused is None or request is not refused:
            request = check_request(request, self._options.history_limits.max_item_bytes)
        requested_at = self._now()
        origin = self._table.contexts.get(request.context_id)
        yielded = False  # the call waited (for the commit or a slot): it yielded
        if self._table.holding(request.context_id, request.turn_id, origin) is None:
            origin = await self._wait_for_commit(request, origin)  # holding no slot
            yielded = True
        if wait:
            # A cancelled requester takes no slot. One not cancelled takes a
            # free slot without yielding here, or parks at once for one (its
            # wait is its yield): no checkpoint before, so each wait of the
            # requester is one it needs. Then its render's wait, or, rendered
            # inline by a requester that has not yielded yet, a checkpoint
            # after the render (slot held); one that parked (or waited for
            # the commit) is delivered an inline result without another yield.
            await self._checkpoint_if_cancelled()
            tenant = tenant_of(request)
            if not queue.try_acquire(tenant):
                # The slot's wait in this frame: no coroutine of the queue's.
                waiter = queue.enqueue(tenant)
                try:
                    await waiter.signal.wait()
                except BaseException:
                    queue.leave(waiter)  # holds no slot; a granted one is handed on
                    raise
                queue.resumed()
                yielded = True
        else:
            try:
                queue.acquire_nowait(request)
            except QueueFullError:
                if request is given and given.scope is None:
                    # Checked as given (nothing copied: frozen, its
                    # contributions a tuple, no perception) and no host
                    # object in it: the check passes again for this very
                    # object, so the usual fallback (prepare with it) skips it.
                    self._refused = given
                raise
        return await queue.admit(request, requested_at, origin, self.run, self.run_inline, yielded)

    async def _wait_for_commit(
        self, request: ContextPrepareRequest, origin: ContextState | None
    ) -> ContextState | None:
        """Wait, before taking a slot, until the request's turn is held; the context then.

        A turn not committed yet (a prepare made ahead of ``accept_turn``, or
        a mistyped id) holds no slot while it waits, so waiting requesters
        never starve the other contexts' preparations. Returns the context the
        request is for (``origin``, or the one created since the call).

        Raises:
            FoundationClosedError: the Foundation began closing.
            ContextRemovedError: the context was removed (or its lease lost).
            UnknownTurnError: the turn was evicted or retracted.
        """
        context_id, turn_id = request.context_id, request.turn_id
        while True:
            if self.closing:
                raise FoundationClosedError(
                    f"The Foundation closed while waiting for turn {excerpt(turn_id)} of context "
                    f"{excerpt(context_id)}."
                )
            await self.queue.next_commit(context_id)
            if self.closing:
                continue
            if self._table.holding(context_id, turn_id, origin) is not None:
                return self._table.contexts.get(context_id)
            if origin is None:
                # Created since the call: the request is now for this context.
                origin = self._table.contexts.get(context_id)

    async def _wait_for_turn(self, preparation: Preparation) -> ContextState:
        """Wait until the preparation's turn is held (its context then), holding its slot.

        Raises:
            FoundationClosedError: the Foundation began closing.
        """
        context_id = preparation.request.context_id
        turn_id = preparation.request.turn_id
        while True:
            if self.closing:
                raise FoundationClosedError(
                    f"The Foundation closed while waiting for turn {excerpt(turn_id)} of context "
                    f"{excerpt(context_id)}."
                )
            state = self._table.holding(context_id, turn_id, preparation.origin)
            if state is not None:
                return state
            if preparation.origin is None:
                # Created since the call: the request is now for this context.
                preparation.origin = self._table.contexts.get(context_id)
            await self.queue.next_commit(context_id)

    async def run(self, preparation: Preparation) -> None:
        """The work of one owned preparation: wait, capture, assemble, render, deliver."""
        options = self._options
        request = preparation.request
        # The turn was held when the call checked it; a requester that waited
        # for its slot since, or a close that began, takes the waiting path.
        state = (
            None
            if self.closing
            else self._table.holding(request.context_id, request.turn_id, preparation.origin)
        )
        if state is None:
            state = await preparation.wait(self._cancel_scope(), self._wait_for_turn(preparation))
            if state is None:
                return  # cancelled (by the close, a removal)
        if request.perception is not None or self._durable is not None:
            request = self._capture(request, state)
        traced = tracing.current_prepare()
        if traced is not None:
            tracing.queued()
        view = state.history.view()
        serial = state.history.turn_serial(request.turn_id)
        assembled = None
        if options.strategy is not None:
            # Memory I/O on the loop, in this preparation's cancel scope.
            assembled = await preparation.wait(
                self._cancel_scope(), self._assemble(options.strategy, state, view, request)
            )
            if assembled is None:
                return  # cancelled (by the close, a removal)
        if preparation.cancelled:
            return  # cancelled before it waited at all (the task group's scope)
        last = state.last
        areas = state.areas
        # No collection while a model call of the context is in flight.
        run_pass = state.in_flight is None
        queued = self._now() - preparation.requested_at
        preparation.areas = areas
        rules = request.behavior_rules
        await self._render(
            preparation,
            (
                options,
                view,
                request,
                rules if rules is not None else options.behavior_rules,
                last,
                queued,
                areas,
                run_pass,
                assembled,
            ),
        )
        prepared, delivered, section = self._rendered(preparation)
        if preparation.closed:
            return  # the close came while the thread ran: the result is discarded
        preparation.deliver = self._deliverer(
            request,
            state,
            serial,
            areas,
            prepared,
            delivered,
            section,
            last,
            preparation.requested_at,
        )
        preparation.result = prepared

    async def _render(self, preparation: Preparation, args: _RenderArgs) -> None:
        """Render in the Foundation's worker; ``preparation.outcome`` is what it returned or raised.

        The requester awaits the thread, but a cancelled requester does not
        wait for it: the preparation is then left to the thread (abandoned),
        which settles it when its batch comes back; or, if the thread had not
        begun, it renders nothing; or, if it had come back, its area section
        is counted here. The cancellation propagates in each case.
        """
        preparation.rendering = True
        worker = self.worker
        finished = self._signal()
        try:
            worker.submit(
                self._render_in_thread,
                self._render_returned,
                (preparation, args, finished, tracing.current_prepare()),
            )
            self._rendering += 1
            await finished.wait()
        except BaseException:
            with self._handoff:
                began = preparation.thread
                if began == _RUNNING:
                    preparation.thread = _ABANDONED
                elif began == _QUEUED:
                    preparation.thread = _GONE
            if began == _RUNNING:
                preparation.abandoned = True
            elif began == _DONE:
                # It came back, but the requester was cancelled before it
                # resumed: the area section is counted, the result discarded.
                with contextlib.suppress(Exception):
                    self._rendered(preparation)
            raise
        finally:
            if not preparation.abandoned:
                preparation.rendering = False

    def _render_in_thread(self, job: _RenderJob) -> Rendered | None:
        """The worker thread's part of :meth:`_render` (None: its requester left before).

        The job carries the prepare's span (``traced``), the render's parent.
        """
        preparation, args, _, traced = job
        with self._handoff:
            if preparation.thread == _GONE:
                return None
            preparation.thread = _RUNNING
        with tracing.render_span(traced, inline=False, gateway=self._gateway_type):
            return render_preparation(*args)

    def _render_returned(self, job: _RenderJob, outcome: Rendered | BaseException | None) -> None:
        """On the loop, with the worker's batch: wake the requester, or settle an abandoned one."""
        preparation, _, finished, _ = job
        self._rendering -= 1
        if preparation.thread == _GONE:
            return  # rendered nothing; its requester settled it when it left
        # Only the loop moves a preparation on from _RUNNING: no lock needed here.
        abandoned = preparation.thread == _ABANDONED
        preparation.thread = _DONE
        preparation.outcome = outcome
        if abandoned:
            self._settle_abandoned(preparation)
        else:
            finished.set()

    def _settle_abandoned(self, preparation: Preparation) -> None:
        """On the loop, once the thread of an abandoned preparation returned: settle it."""
        try:
            with contextlib.suppress(Exception):  # its requester is gone
                self._rendered(preparation)
        finally:
            self.queue.settle(preparation)

    def _rendered(self, preparation: Preparation) -> Rendered:
        """Take the thread's outcome: count its area section and return it, or raise its error.

        The area section changed whether or not the result is wanted.
        """
        outcome, preparation.outcome = preparation.outcome, None
        areas = preparation.areas
        if isinstance(outcome, BaseException):
            if areas is not None:
                if isinstance(outcome, AreaCallbackError) and outcome.phase == "register":
                    self._table.detach(areas, (outcome.area,))  # the worker dropped it
                self._table.count_section(areas, None)  # a pass that ran: its collection
            try:
                raise outcome
            finally:
                del outcome  # the raised error's traceback holds this frame
        assert isinstance(outcome, tuple)  # returned: a BaseException propagated past it
        rendered: Rendered = outcome
        section = rendered[2]
        if areas is not None and section is not None:
            self._table.count_section(areas, section)
        return rendered

    def run_inline(
        self, request: ContextPrepareRequest, requested_at: float, origin: ContextState | None
    ) -> tuple[PreparedContext, Callable[[], None]] | None:
        """The whole preparation on the event loop, when its work is small and bounded.

        Runs only when nothing in it can wait or grows with the history: the
        turn is committed, there is no assembly strategy, scope or area
        section, the gateway is a built-in one (its render is pure and
        cheap), fewer than ``worker_threads`` (the limiter's tokens when bound)
        renders are in the render thread (else it renders there, behind
        them), inline renders took less than :data:`INLINE_SHARE` of the
        loop's time in the current window, and the render's work is at most
        :data:`INLINE_MAX_ITEMS` items' worth (checked by the render before
        it does more). It then does what :meth:`run` does, with the render
        inline: the same capture, the same result. Returns the result and
        what delivering it changes, or None (nothing was done but exact
        cache upkeep: run it as owned work, its render in a worker thread).

        Raises:
            as :meth:`run`'s render.
        """
        options = self._options
        if (
            self.closing
            or not self._inline
            or request.scope is not None
            or self._rendering >= self._render_bound
        ):
            return None
        began = time.perf_counter()
        if began - self._inline_window >= INLINE_WINDOW:
            self._inline_window, self._inline_spent = began, 0.0
        elif self._inline_spent >= INLINE_SHARE * INLINE_WINDOW:
            return None
        state = self._table.contexts.get(request.context_id)
        if (
            state is None
            or (origin is not None and state is not origin)
            or state.areas is not None
            or not state.history.has_turn(request.turn_id)
        ):
            return None  # the task raises what waiting for the turn raises
        history = state.history
        if request.perception is not None or self._durable is not None:
            request = self._capture(request, state)
        serial = history.turn_serial(request.turn_id)
        last = state.last
        rules = request.behavior_rules
        args = (
            options,
            history.view(),
            request,
            rules if rules is not None else options.behavior_rules,
            last,
            self._now() - requested_at,
            None,
            state.in_flight is None,
            None,
            INLINE_MAX_ITEMS,
        )
        prepare = tracing.current_prepare()
        if prepare is None:
            result = render_preparation(*args)  # nothing records: no spans
        else:
            tracing.queued()
            with tracing.render_span(prepare, inline=True, gateway=self._gateway_type) as traced:
                result = render_preparation(*args)
                if result is None:
                    traced.set("turnloom.handed_off", True)  # a worker thread renders it
        self._inline_spent += time.perf_counter() - began
        if result is None:
            return None  # too much work for the loop: a worker renders it
        prepared, delivered, _ = result
        return prepared, self._deliverer(
            request, state, serial, None, prepared, delivered, None, last, requested_at
        )

    def _capture(
        self, request: ContextPrepareRequest, state: ContextState
    ) -> ContextPrepareRequest:
        """Capture once, when the turn is held: the request's state, its time included."""
        perception = request.perception
        if perception is not None and perception.time is None:
            # Read before anything is touched: a failing clock changes nothing.
            now = read_clock(self._clock)
            request = msgspec.structs.replace(
                request, perception=msgspec.structs.replace(perception, time=now)
            )
        if self._durable is not None:
            self._durable.touch(request.context_id)
        return request

    def _deliverer(
        self,
        request: ContextPrepareRequest,
        state: ContextState,
        serial: int,
        areas: AreaSection | None,
        prepared: PreparedContext,
        delivered: DeliveredPrefix,
        section: SectionResult | None,
        last: DeliveredPrefix | None,
        requested_at: float,
    ) -> Callable[[], None]:
        keep = self._options.earlier_state == "keep"
        unscoped = request.scope is None

        def deliver() -> None:
            # Run by the queue when the requester receives the result, never
            # for a result its requester did not get. A scoped prepare leaves
            # what unscoped ones compare with and reuse.
            counters = self._counters
            if unscoped:
                if areas is not None and section is not None:
                    areas.delivered = max(areas.delivered, section.generation)
                if last is not None and state.last is last:
                    # Its turn is over: the host copies made ahead for it go,
                    # freed in the worker (O(items)), not here.
                    copies = last.items.drop_copies()
                    if copies:
                        self._release(copies)
                state.last = delivered
                if keep:
                    self._table.keep_state(state, request.turn_id, delivered.state, serial)
            counters.delivered(
                last.bytes if last is not None and unscoped else 0,
                prepared,
                self._now() - requested_at,
                last.tokens if last is not None and unscoped else 0,
            )
            if delivered.skipped_breakpoint:
                counters.breakpoints_skipped += 1
            self._issued.add(prepared, delivered.call_ids, delivered.body, state)

        return deliver

    async def _assemble(
        self,
        strategy: AssemblyStrategy,
        state: ContextState,
        view: HistoryView,
        request: ContextPrepareRequest,
    ) -> AssembledContext:
        """The turn's assembly: run the strategy once per turn, share its result.

        A preparation of a turn whose assembly is running waits for it; one
        whose assembly failed or was cancelled assembles again. The result is
        shared only with prepares of the same turn, tenant and
        ``auto_hydrate``: another tenant's prepare of the turn assembles anew.
        """
        turn_id = request.turn_id
        key = (turn_id, request.tenant, request.auto_hydrate)
        while True:
            record = state.assembly
            if record is None or record.key != key:
                break
            if record.result is not None:
                self._counters.assembly_reused += 1
                return record.result
            await record.done.wait()
        record = state.assembly = TurnAssembly(key)
        started = time.perf_counter()
        try:
            with tracing.span("turnloom.assembly", {"turnloom.strategy": strategy.name}) as traced:
                result = await strategy.assemble(
                    query=assembly_query(view.turn_input(turn_id)),
                    scope=request.tenant,
                    intent_verdict=request.intent_verdict,
                    auto_hydrate=request.auto_hydrate,
                )
                if isinstance(result, AssembledContext) and result.memory_context is not None:
                    traced.set("turnloom.assembly.entries", len(result.memory_context.entries))
            if not isinstance(result, AssembledContext):
                raise StateError(
                    f"The assembly strategy {excerpt(strategy.name)} returned "
                    f"{what_type(result)}, not an AssembledContext."
                )
        except BaseException as exc:
            if state.assembly is record:
                state.assembly = None
            if isinstance(exc, Exception):
                self._counters.assembly_failed += 1
            raise
        finally:
            record.done.set()
        memory = result.memory_context
        self._counters.assembled(
            len(memory.entries) if memory is not None else None, time.perf_counter() - started
        )
        record.result = result
        return result

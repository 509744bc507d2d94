"""The ``ContextManager``: committed turns in, provider-native model inputs out.

The manager is an actor living on one event loop (asyncio or trio, through
anyio), an async shell around synchronous rooms: door checks (``_door``), the
contexts and their histories (``_contexts``), the worker render
(``_render``), the area section (``_area_section``) and running counters
(``_counters``); the bounded queue that owns preparations is ``_queue``. Its
synchronous methods (:meth:`ContextManager.accept_turn`,
:meth:`~ContextManager.record`, :meth:`~ContextManager.build`) check their
input completely and then change state in one step, so they are atomic with
respect to other tasks. :meth:`~ContextManager.prepare` is the only long
operation: it waits for a slot in the bounded pending queue, waits for the
named turn's commit, captures the history and the request's state once, and
renders in a worker thread through the Foundation's
:class:`anyio.CapacityLimiter`.

A preparation is owned by the manager, not by its requester: it runs as a task
in the Foundation's task group and holds its slot until it is *settled*
(delivered, failed or discarded). When the requester is cancelled while the
preparation waits, the preparation is cancelled with it; when it is already
rendering, the worker thread is never abandoned mid-render: it finishes, its
result is discarded, and only then is the slot freed.

The area section's safe points, threads and reuse are documented on
:data:`~turnloom.runtime.AreaPass`.
"""

from __future__ import annotations

__all__ = ("ContextManager", "Invocation")

import weakref
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio
import anyio.abc

from turnloom.context.area import ContextAreaImplementation
from turnloom.context.callids import CallIdRenamer, rename_call_ids
from turnloom.context.gateway import Gateway, NativeContent
from turnloom.context.history import HistoryLimits, HistoryView, check_id
from turnloom.context.message import Message
from turnloom.context.pairing import complete_pairs
from turnloom.context.scope import ContextScope, check_scope
from turnloom.context.working import FrozenContext, WorkingContext
from turnloom.errors import AreaCallbackError, excerpt
from turnloom.runtime._area_section import check_area
from turnloom.runtime._bridge import folded_message, working_context
from turnloom.runtime._contexts import ContextState, ContextTable
from turnloom.runtime._counters import Counters
from turnloom.runtime._door import (
    ManagerOptions,
    check_continuation,
    check_outputs,
    check_request,
    check_routed_item,
    check_snapshot,
)
from turnloom.runtime._queue import Preparation, PreparationQueue
from turnloom.runtime._render import render_preparation
from turnloom.runtime.errors import FoundationClosedError
from turnloom.runtime.schemas import (
    ContextPrepareRequest,
    ManagerStatistics,
    PreparedContext,
    TurnSnapshot,
)


class Invocation:
    """One model call in flight for a turn; see :meth:`ContextManager.invocation`.

    Attributes:
        context_id: the conversation.
        turn_id: the turn the model call answers.
    """

    __slots__ = ("_manager", "context_id", "turn_id")

    def __init__(self, manager: ContextManager, context_id: str, turn_id: str) -> None:
        self._manager = manager
        self.context_id = context_id
        self.turn_id = turn_id

    def record(self, outputs: Sequence[Message]) -> int:
        """Record outputs of this turn; see :meth:`ContextManager.record`."""
        return self._manager.record(self.context_id, self.turn_id, outputs)


class ContextManager:
    """Keeps each context's history and prepares provider-native model inputs.

    Created and owned by a :class:`~turnloom.runtime.Foundation`; reach it as
    ``foundation.manager``. All methods must be called from the Foundation's
    event loop.

    A prepared prefix is, in order: pinned instructions, earlier turns, the
    turn's input, the runtime-state pair (when there is state), then the
    context's *area section*. Send ``manager.gateway.request_body(prefix.items)``
    (see :attr:`PreparedContext.items`).

    Context Areas: each context lazily owns one
    :class:`~turnloom.context.CoopContext` over its own
    :class:`~turnloom.context.Context`, created by its first
    :meth:`attach_area` or :meth:`route`: the area section. It is volatile
    per-turn content, so it goes after the durable history; it never enters
    history and is never evicted with it. Every preparation that renders is
    a safe point for it; see :data:`~turnloom.runtime.AreaPass` for the safe
    points, threads, model calls in flight and undelivered sections.

    Args:
        task_group: the Foundation's task group; preparations run in it.
        limiter: the Foundation's worker-thread limiter.
        options: the checked options (gateway, the bound on pending
            preparations, history limits, default behaviour rules, the
            ``open_calls`` policy); see :class:`~turnloom.runtime.Foundation`.
    """

    def __init__(
        self,
        *,
        task_group: anyio.abc.TaskGroup,
        limiter: anyio.CapacityLimiter,
        options: ManagerOptions,
    ) -> None:
        self._options = options
        self._gateway = options.gateway
        self._limiter = limiter
        self._limits = options.history_limits
        self._behavior_rules = options.behavior_rules
        self._open_calls = options.open_calls
        self._counters = Counters()
        self._queue = PreparationQueue(options.max_pending_preparations, task_group, self._counters)
        self._table = ContextTable(
            self._limits, self._gateway, self._counters, options.token_counter
        )
        # id -> prefix, for every prefix prepare returned that is still alive:
        # build continues only these (O(1), no hashing of the items).
        self._issued: weakref.WeakValueDictionary[int, PreparedContext] = (
            weakref.WeakValueDictionary()
        )
        # id -> the call-id renaming state after that prefix's items (build
        # continues it); an entry goes when its prefix is collected.
        self._call_ids: dict[int, CallIdRenamer] = {}
        self._closed = False

    # -- properties --------------------------------------------------------

    @property
    def gateway(self) -> Gateway:
        """The gateway prepared inputs are rendered with."""
        return self._gateway

    @property
    def capacity(self) -> int:
        """The bound on pending preparations."""
        return self._queue.capacity

    @property
    def history_limits(self) -> HistoryLimits:
        """The bounds of each context's history."""
        return self._limits

    @property
    def closed(self) -> bool:
        """True once the Foundation began closing.

        From then on every call that reads or changes contexts (``accept_turn``,
        ``record``, ``prepare``, ``build``, ``history``, ...) raises
        :class:`FoundationClosedError`; :meth:`statistics`, :meth:`context_ids`
        and the properties still answer.
        """
        return self._closed

    def context_ids(self) -> tuple[str, ...]:
        """The ids of the contexts held, in creation order."""
        return tuple(self._table.contexts)

    def history(self, context_id: str) -> HistoryView:
        """An immutable view of one context's history (O(1)).

        Raises:
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: ``context_id`` is not a non-empty str of at
                most 256 characters.
            UnknownContextError: no turn was ever committed to ``context_id``.
        """
        self._check_open()
        return self._table.get(context_id).history.view()

    def _check_open(self) -> None:
        if self._closed:
            raise FoundationClosedError(
                "The Foundation is closed; the ContextManager accepts no calls."
            )

    # -- turns -------------------------------------------------------------

    def accept_turn(self, snapshot: TurnSnapshot) -> None:
        """Commit a turn: its input, and new pinned instructions when given.

        The first turn of a context creates it. Every message is validated
        before anything changes. After the commit the context's history is
        evicted down to its limits (whole turns, oldest first) unless a model
        call is in flight for the context, in which case eviction waits for
        the invocation to end. Preparations waiting for this turn wake up.

        Raises:
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: a malformed id or message, an input message
                with a system/developer role or carrying a runtime-state call or
                result, an instruction with another role, or an input that
                renders to nothing (empty, or blank text only).
            InvalidTextError: text that is not valid UTF-8.
            ItemTooLargeError: a message is over the per-item byte cap.
            TurnTooLargeError: the turn would hold more than ``max_items``
                messages or ``max_bytes`` bytes (checked on the batch first).
            DuplicateIdError: the turn id was already committed to the context.
            ProviderRuleError: the gateway cannot render a message (for example
                tool call arguments that are not a JSON object, for Anthropic
                and Gemini); nothing was committed.
            OutOfOrderTurnError: the snapshot's sequence is not newer than the
                context's previous one.
        """
        self._check_open()
        context_id = check_snapshot(snapshot, self._gateway, self._table.history_of)
        self._table.commit(context_id, snapshot)
        self._queue.wake(context_id)

    def record(self, context_id: str, turn_id: str, outputs: Sequence[Message]) -> int:
        """Record model outputs and tool results of a turn, in order.

        Empty or whitespace-only messages (for example the partial output of a
        cancelled model call) are not recorded. Outputs for a turn that was
        evicted are dropped and counted; they never bring the turn back. The
        runtime-state pair never enters history: messages carrying it are
        rejected.

        Returns:
            how many messages were recorded.

        Raises:
            FoundationClosedError: the Foundation is closing or closed.
            UnknownContextError: no turn was committed to ``context_id``.
            UnknownTurnError: ``turn_id`` was never committed to the context.
            InvalidMessageError, InvalidTextError, DuplicateIdError: a malformed
                id or message, or a message carrying a runtime-state call or
                result (of any turn).
            ItemTooLargeError: a message is over the per-item byte cap.
            TurnTooLargeError: the turn would hold more than ``max_items``
                messages or ``max_bytes`` bytes (checked on the batch first).
            ProviderRuleError: the gateway cannot render a message (for example
                tool call arguments that are not a JSON object, for Anthropic
                and Gemini); nothing was recorded.
        """
        self._check_open()
        state = self._table.get(context_id)
        check_outputs(self._gateway, context_id, turn_id, outputs, state.history)
        return self._table.record(state, turn_id, outputs)

    def remove_context(self, context_id: str) -> None:
        """Forget a context and its whole history (its counters are kept).

        Raises:
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: a malformed context id.
            UnknownContextError: no such context.
            StateError: a model call is in flight for the context.
        """
        self._check_open()
        self._table.remove(context_id)

    # -- areas -------------------------------------------------------------------

    def attach_area(self, context_id: str, area: ContextAreaImplementation) -> None:
        """Attach a Context Area to a context's area section.

        The area is checked here, as ``CoopContext.register`` checks it, and
        takes part from the next area pass on (the next :meth:`prepare` of the
        context that runs one). Areas take part in attachment order. An area
        stays attached until the Collector removes it; the same instance may
        be attached again after that preparation settled.

        Raises:
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: a malformed context id.
            UnknownContextError: no turn was committed to ``context_id``.
            InvalidAreaError: ``area`` lacks protocol members (``missing``
                names them), holds a state value that is not an
                AreaLifeState / AreaFlowState, or is unhashable.
            DuplicateAreaError: this very instance is attached to the context
                and has not been collected.

            Nothing changed when any of these is raised.
        """
        self._check_open()
        state = self._table.get(context_id)
        check_area(self._gateway, area)
        self._table.attach(state, area, context_id)

    def route(self, context_id: str, item: NativeContent) -> None:
        """Append one native item (model output an area must see) to the area section.

        Use it for the model outputs that belong to an area rather than to
        the durable history, for example the intermediate work of a
        :class:`~turnloom.areas.SubtaskArea`: they are reclaimed with the
        area's tail when it is collected, while outputs recorded with
        :meth:`record` stay in history. Do not route and record the same
        output. An area that reads outputs outside its EffectRange still gets
        them through its own API (``SubtaskArea.route(message)``).

        The item is copied and appended at the start of the next area pass,
        before collection (the safe point), so it lands after everything the
        areas rendered so far and before what they render next. It belongs
        to the area section's tail: when the Collector reclaims a tail that
        starts at or before it, the item goes with it (model
        outputs inside or after a collected range are detached too). A tool call
        must be routed before anything else is, and directly followed by
        its results (Source: OpenAI Chat ``tool`` messages follow their
        ``tool_calls`` message; Anthropic ``tool_result`` blocks open the next
        user turn; Gemini's function-response turn follows the call turn).
        While a routed call has no result yet, a prepare that runs an area
        pass fails with :class:`~turnloom.errors.OpenToolCallError`.

        Raises:
            FoundationClosedError: the Foundation is closing or closed.
            UnknownContextError: no turn was committed to ``context_id``.
            InvalidMessageError: a malformed context id, ``item`` is not a
                JSON object of the manager's gateway, it carries a runtime-state
                call or result, a result answers no open routed call, or
                another item is routed while a routed call has no result.
            InvalidTextError: its text is not valid UTF-8.
            ItemTooLargeError: its JSON encoding is over the history's
                per-item byte cap (``max_item_bytes``).

            Nothing changed when any of these is raised.
        """
        self._check_open()
        state = self._table.get(context_id)
        copy, message = check_routed_item(
            self._gateway, self._limits.max_item_bytes, context_id, item
        )
        self._table.route(state, copy, message, context_id)

    # -- invocations ---------------------------------------------------------

    @asynccontextmanager
    async def invocation(self, context_id: str, turn_id: str) -> AsyncIterator[Invocation]:
        """Mark one model call of a turn as in flight for the duration of the block.

        While it is in flight the context's history is not evicted and the
        context cannot be removed; eviction that became due runs when the
        block exits. One invocation per context at a time.

        Yields:
            an :class:`Invocation` whose ``record`` records the call's outputs.

        Raises:
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: a malformed context or turn id.
            UnknownContextError: no turn was committed to ``context_id``.
            UnknownTurnError: the turn is not held (never committed, or evicted).
            StateError: another invocation is in flight for the context.

        Cancellation:
            Entering and leaving do not wait. When the block is cancelled, what
            was recorded stays recorded (empty or whitespace-only partial
            outputs are never recorded), calls left without a result are
            handled by the ``open_calls`` policy at the next prepare, and the
            context is released.
        """
        self._check_open()
        state = self._table.begin_call(context_id, turn_id)
        try:
            yield Invocation(self, context_id, turn_id)
        finally:
            self._table.end_call(state, evict=not self._closed)

    # -- preparation -----------------------------------------------------------

    async def prepare(self, request: ContextPrepareRequest) -> PreparedContext:
        """Prepare the model input of a committed turn.

        Waits, in order, for a free slot in the pending queue (backpressure: a
        full queue makes ``prepare`` wait; use :meth:`prepare_nowait` to fail
        instead), for the turn's commit (``prepare`` may be called before
        ``accept_turn``), and for a worker thread. The request is validated and
        its contributions copied at the call (changing a list afterwards has no
        effect); the history and the request's state are captured once, when
        the turn is committed; rendering runs in the worker. Bound the whole
        wait with ``anyio.fail_after``.

        Returns:
            the prefix: pinned instructions, earlier turns, the turn's input,
            the runtime-state pair when the request or manager carries state,
            and the area section. Send ``manager.gateway.request_body(items)``.
            With ``request.scope`` the earlier turns are the sliced view (see
            :class:`~turnloom.runtime.ContextPrepareRequest`).

        Raises:
            FoundationClosedError: the Foundation is closing or closed, or closed
                while the preparation waited.
            InvalidMessageError, InvalidTextError, DuplicateIdError: a malformed
                request (ids, contributions that are not a tuple or list,
                contribution names or text, loop budget); no slot was taken.
            InvalidArgumentError: the request's ``scope`` is not a scope; no
                slot was taken.
            PositionalScopeError: a scope without ``indices`` asked a
                positional scope's ``matches`` (raised by the preparation).
            ItemTooLargeError: the runtime-state result would exceed the
                per-item byte cap: raised at the call when the carried texts
                alone exceed it (no slot taken), else by the preparation.
            UnknownTurnError: the turn was evicted before it could be captured.
            ProviderRuleError: the gateway rejected a message while rendering.
            AreaCallbackError: an attached area raised (or returned a wrong
                value) in the area pass; ``area`` and ``phase`` name it. The
                area section is as it was before the pass.
            OpenToolCallError: the area section would end with a routed tool
                call whose result has not been routed; nothing changed.

        Cancellation:
            Cancelled while waiting for a slot: nothing was admitted. Cancelled
            later: the preparation is cancelled if it still waits for its turn
            or a thread, or, if it is rendering, the thread finishes and the
            result is discarded; the slot is freed when it settles. History is
            never changed by a preparation. An area pass that ran for a
            discarded result is reused by the next preparation of the context.
        """
        self._check_open()
        request = check_request(request, self._limits.max_item_bytes)
        requested_at = anyio.current_time()
        await self._queue.acquire()
        return await self._queue.admit(request, requested_at, self._prepare)

    async def prepare_nowait(self, request: ContextPrepareRequest) -> PreparedContext:
        """Like :meth:`prepare`, but refuse at once when every slot is taken.

        Unlike trio's and anyio's ``*_nowait`` methods this is a coroutine:
        only the admission never waits (a full queue raises
        :class:`~turnloom.errors.QueueFullError` at once); once admitted it
        awaits the turn's commit and the render exactly as :meth:`prepare`
        does. Await it.

        Raises:
            QueueFullError: all ``capacity`` slots are taken; nothing was admitted.
            FoundationClosedError, InvalidMessageError, InvalidTextError,
            DuplicateIdError, InvalidArgumentError, PositionalScopeError,
            ItemTooLargeError, UnknownTurnError, ProviderRuleError,
            AreaCallbackError, OpenToolCallError: as :meth:`prepare`.

        Cancellation:
            As :meth:`prepare` after admission.
        """
        self._check_open()
        request = check_request(request, self._limits.max_item_bytes)
        requested_at = anyio.current_time()
        self._queue.acquire_nowait(request)
        return await self._queue.admit(request, requested_at, self._prepare)

    async def _wait_for_turn(self, context_id: str, turn_id: str) -> ContextState:
        while True:
            if self._closed:
                raise FoundationClosedError(
                    f"The Foundation closed while waiting for turn {excerpt(turn_id)} of context "
                    f"{excerpt(context_id)}."
                )
            state = self._table.holding(context_id, turn_id)
            if state is not None:
                return state
            await self._queue.next_commit(context_id)

    async def _prepare(self, preparation: Preparation, scope: anyio.CancelScope) -> None:
        """The work of one owned preparation: wait, capture, render, deliver, count."""
        request = preparation.request
        state = await self._wait_for_turn(request.context_id, request.turn_id)
        # Capture once: an immutable view and the request's state.
        view = state.history.view()
        behavior_rules = (
            request.behavior_rules if request.behavior_rules is not None else self._behavior_rules
        )
        last = state.last
        areas = state.areas
        # No collection while a model call of the context is in flight.
        run_pass = state.in_flight is None
        queued = anyio.current_time() - preparation.requested_at
        try:
            prepared, delivered, section = await anyio.to_thread.run_sync(
                render_preparation,
                self._options,
                view,
                request,
                behavior_rules,
                last,
                queued,
                areas,
                run_pass,
                limiter=self._limiter,
            )
        except AreaCallbackError as exc:
            if exc.phase == "register" and areas is not None:
                self._table.detach(areas, (exc.area,))  # the worker dropped it
            raise
        if areas is not None and section is not None:
            # The area section changed whether or not the result is wanted.
            self._table.count_section(areas, section)
        # Cancelled while the thread ran (the thread was not abandoned): the
        # result is discarded.
        if scope.cancel_called:
            return
        if preparation.wanted:
            # A scoped prepare leaves what unscoped ones compare with and reuse.
            unscoped = request.scope is None
            if unscoped and areas is not None and section is not None:
                areas.delivered = max(areas.delivered, section.generation)
            if unscoped:
                state.last = delivered
            self._counters.delivered(
                last.bytes if last is not None and unscoped else 0,
                prepared,
                anyio.current_time() - preparation.requested_at,
            )
        self._issued[id(prepared)] = prepared
        self._call_ids[id(prepared)] = delivered.call_ids
        weakref.finalize(prepared, self._call_ids.pop, id(prepared), None)
        preparation.result = prepared

    # -- continuation ------------------------------------------------------------

    def build(
        self, prefix: PreparedContext, continuation: Sequence[Message] = ()
    ) -> tuple[NativeContent, ...]:
        """The input of the next model call of a turn: the prefix, then the continuation.

        Send ``manager.gateway.request_body(items)``, not the items: for
        Anthropic and Gemini the body moves the instructions to their
        top-level field and merges adjacent turns, and only the body is
        guaranteed to pass the gateway's ``validate()``.

        The continuation (the turn's model outputs and tool results so far,
        oldest first) is rendered and appended; the prefix, including its
        runtime-state pair, is reused as is and never refreshed. Calls without
        a result are handled by the ``open_calls`` policy. A continuation call
        reusing a call id of the prefix or of an earlier continuation call is
        renamed, with its results, by the rule of
        :mod:`turnloom.context.callids`, continued from the prefix, so the
        items hold each call id once. Cost: O(continuation), plus a C-speed
        copy of the prefix's set of call ids.

        Returns:
            tuple of NativeContent, oldest first.

        Raises:
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: ``prefix`` was not returned by this manager's
                :meth:`prepare` (built by hand, changed with
                ``msgspec.structs.replace``, or from another Foundation), or
                ``continuation`` is not a sequence of Messages.
            InvalidMessageError, InvalidTextError: a malformed continuation
                message, or one carrying a runtime-state call or result.
            DuplicateIdError: a continuation message repeats an id of the
                prefix's turn (its input message ids or the state call id) or
                of an earlier continuation message.
            ProviderRuleError: the gateway rejected a message.
            TurnTooLargeError: the continuation holds more than ``max_items``
                messages.
        """
        self._check_open()
        check_continuation(prefix, continuation, self._issued, self._limits)
        gateway = self._gateway
        items: list[NativeContent] = list(prefix.items)
        call_ids = self._call_ids[id(prefix)].copy()
        for message in complete_pairs(continuation, open_calls=self._open_calls):
            items.extend(rename_call_ids(gateway.type, gateway.render(message), call_ids))
        return tuple(items)

    # -- sub-agents ----------------------------------------------------------------

    async def working_context(
        self, context_id: str, *, scope: ContextScope | None = None
    ) -> WorkingContext:
        """The retained history of a context as a WorkingContext, for a sub-agent briefing.

        The prefix's grounding is the pinned instructions; the messages are
        every kept turn's input and outputs, oldest first, sliced by ``scope``
        (indices are positions in that list) and with every call/result pair
        complete under the ``open_calls`` policy. The token counter is the
        Foundation's, so ``tokens()`` is the number the history and
        ``PreparedContext.tokens`` report for the same messages. The result
        is independent of the manager: changing it changes no history. Built
        from a view captured at the call, in a worker thread.

        Raises:
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: a malformed context id.
            UnknownContextError: no turn was committed to ``context_id``.
            InvalidArgumentError: ``scope`` is not a scope.
            PositionalScopeError: a scope without ``indices`` asked a
                positional scope's ``matches``.

        Cancellation:
            Nothing changes either way; a cancelled call waits for its worker
            thread (never abandoned) and the result is dropped.
        """
        self._check_open()
        view = self._table.get(context_id).history.view()
        if scope is not None:
            check_scope(scope)
        options = self._options
        return await anyio.to_thread.run_sync(
            working_context,
            view,
            scope,
            options.open_calls,
            options.token_counter,
            limiter=self._limiter,
        )

    async def briefing(
        self, context_id: str, *, scope: ContextScope | None = None
    ) -> FrozenContext:
        """:meth:`working_context`, frozen: an immutable snapshot to hand a sub-agent.

        Raises:
            As :meth:`working_context`.

        Cancellation:
            As :meth:`working_context`.
        """
        return (await self.working_context(context_id, scope=scope)).freeze()

    def fold(
        self,
        context_id: str,
        turn_id: str,
        result: WorkingContext | FrozenContext | str,
        *,
        call_id: str | None = None,
        agent: str | None = None,
    ) -> int:
        """Fold a sub-agent's result into a turn, through :meth:`record`.

        The result's text (``result`` itself, or the text of the last
        assistant message of its messages that has text) is recorded as one
        message of ``turn_id``: with ``call_id``, the tool result answering
        that call of the turn (the call that delegated to the sub-agent, its
        tool name taken from the call); without it, an assistant message
        named ``agent``.

        Returns:
            how many messages were recorded (1, or 0 when the turn was
            evicted and the output dropped).

        Raises:
            FoundationClosedError, UnknownContextError, UnknownTurnError,
            InvalidMessageError, InvalidTextError, ItemTooLargeError,
            ProviderRuleError: as :meth:`record`; with ``call_id``,
            UnknownTurnError also when the turn is no longer held.
            InvalidArgumentError: ``result`` is not a WorkingContext,
                FrozenContext or string, or has no assistant text;
                ``call_id`` names no call of the turn still without a
                result; ``agent`` is malformed or given with ``call_id``.
                Nothing was recorded.
        """
        self._check_open()
        view = self._table.get(context_id).history.view()
        check_id(turn_id, "turn id")
        message = folded_message(result, view, turn_id, call_id=call_id, agent=agent)
        return self.record(context_id, turn_id, (message,))

    # -- lifecycle (driven by the Foundation) ---------------------------------------

    async def _aclose(self, grace_period: float) -> None:
        """Close in order: stop intake, let preparations settle, cancel, release.

        Not shielded: the Foundation calls it in a shielded scope. The
        histories are released even when a step fails.
        """
        try:
            self._closed = True
            await self._queue.aclose(grace_period)
        finally:
            self._table.release()

    # -- statistics --------------------------------------------------------------------

    def statistics(self) -> ManagerStatistics:
        """A frozen snapshot of the manager's counters, O(1) in the number of contexts.

        Every total is kept up to date as it changes, so a scrape never walks
        the contexts. Safe to call from another thread (a metrics scrape): it
        only reads counters, each read atomically; the snapshot may mix
        values from two adjacent moments.
        """
        queue = self._queue
        return self._counters.snapshot(
            closed=self._closed,
            contexts=len(self._table.contexts),
            capacity=queue.capacity,
            pending=queue.pending,
            waiting_for_slot=queue.waiting_for_slot,
        )

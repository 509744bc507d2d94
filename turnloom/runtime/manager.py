"""The ``ContextManager``: committed turns in, provider-native model inputs out.

The manager is an actor living on one event loop (asyncio or trio, through
anyio): an async shell around synchronous rooms (door checks, contexts,
continuation, render, counters: the ``_*`` modules, each named in
``docs/layout.md``) and the bounded queue that owns preparations. Its synchronous methods
(:meth:`ContextManager.accept_turn`, :meth:`~ContextManager.record`,
:meth:`~ContextManager.build`) check their input completely and then change
state in one step, so they are atomic with respect to other tasks;
:meth:`~ContextManager.prepare` is the only long operation. The host features
beside the core (``manager.leases``, ``areas``, ``bridge``, ``outputs``,
``voice``, ``assembly``) are small objects, each documented on its own class;
they share the manager's lifecycle (``_lifecycle``), so each raises the same
typed errors before the Foundation opens and after it closed.
"""

from __future__ import annotations

__all__ = ("ContextManager", "Invocation")

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, Unpack

import anyio
import anyio.abc

from turnloom.context.gateway import Gateway, NativeContent
from turnloom.context.history import HistoryLimits, HistoryView
from turnloom.context.message import Message
from turnloom.context.pairing import OpenCallPolicy
from turnloom.runtime import _tracing as tracing
from turnloom.runtime._areas import Areas
from turnloom.runtime._assembly import Assembly
from turnloom.runtime._bridge import Bridge
from turnloom.runtime._door import (
    ManagerOptions,
    check_manager_options,
    check_outputs,
    check_snapshot,
)
from turnloom.runtime._invocation import Invocation, InvocationBlock
from turnloom.runtime._leases import Leases
from turnloom.runtime._lifecycle import Lifecycle
from turnloom.runtime._options import ManagerKwargs, ManagerSettings
from turnloom.runtime._outputs import OutputStreams
from turnloom.runtime._summaries import Summaries
from turnloom.runtime._voice import Voice
from turnloom.runtime.schemas import (
    ContextPrepareRequest,
    ManagerStatistics,
    PreparedContext,
    TurnSnapshot,
)
from turnloom.runtime.state import EarlierStatePolicy

_Clock = Callable[[], datetime] | None


class ContextManager:
    """Not a Python context manager: keeps each context's history and prepares model inputs.

    "Context" here is an agent's conversation context; there is no ``with
    ContextManager()``. The :class:`~turnloom.runtime.Foundation` it is bound
    to is the async context manager that opens and closes it.

    Built by the host, then bound to the :class:`~turnloom.runtime.Foundation`
    that owns it from then on (both ways to make and bind one: see there);
    reach it as ``foundation.manager``. Every method must be called from the
    Foundation's event loop; until the Foundation is open they raise
    :class:`StateError`.

    Attributes:
        leases: durable ownership of contexts (:class:`~turnloom.runtime.Leases`).
        areas: Context Areas and routed items (:class:`~turnloom.runtime.Areas`).
        bridge: sub-agent briefings and results (:class:`~turnloom.runtime.Bridge`).
        outputs: consumed output streams (:class:`~turnloom.runtime.OutputStreams`).
        voice: barge-ins and false starts (:class:`~turnloom.runtime.Voice`).
        assembly: the strategy and its tools (:class:`~turnloom.runtime.Assembly`).
        summaries: summary compaction and pruning (:class:`~turnloom.runtime.Summaries`).

    Args:
        **options: the manager's options, each a keyword argument with its
            default, documented once on :class:`~turnloom.runtime.ManagerSettings`.

    Raises:
        InputError: an option outside what :class:`~turnloom.runtime.ManagerSettings`
            allows for it (a bound not positive, an unknown gateway or policy,
            a store that is not a ContextStore, a malformed ``owner``, ...).
        UnknownStrategyError: ``strategy`` names no known strategy (``known``
            lists them).
        InvalidArgumentError: ``token_counter`` has no ``count`` method.
    """

    def __init__(self, **options: Unpack[ManagerKwargs]) -> None:
        checked = self._options = check_manager_options(ManagerSettings(**options))
        life = self._life = Lifecycle(checked)
        table = self._table = life.table
        self._issued = life.issued
        self.leases = Leases(life)
        self.areas = Areas(life, table, checked.gateway, checked.history_limits.max_item_bytes)
        self.bridge = Bridge(life, table, checked.open_calls, checked.token_counter, self.record)
        self.outputs = OutputStreams(life, self.record)
        self.voice = Voice(life, table, self.leases, self.record)
        counters = life.counters
        self.assembly = Assembly(life, checked.strategy, checked.gateway, self._issued, counters)
        self.summaries = Summaries(table, counters)

    def _bind(
        self, *, task_group: anyio.abc.TaskGroup, limiter: anyio.CapacityLimiter, clock: _Clock
    ) -> None:
        """Bind to the opening Foundation, once (see :meth:`Lifecycle.bind`; raises StateError)."""
        self._life.bind(self.outputs, self.leases, task_group, limiter, clock)
        self.summaries._bind(task_group)

    async def _aclose(self, grace_period: float) -> None:
        """Close in order (see :meth:`Lifecycle.aclose`); the Foundation shields it."""
        self.summaries._close()
        await self._life.aclose(grace_period, self.outputs)

    # -- properties and queries --------------------------------------------------------

    @property
    def options(self) -> ManagerOptions:
        """The checked options the manager was built with."""
        return self._options

    @property
    def gateway(self) -> Gateway:
        """The gateway prepared inputs are rendered with."""
        return self._options.gateway

    @property
    def capacity(self) -> int:
        """The bound on pending preparations."""
        return self._options.max_pending_preparations

    @property
    def open_calls(self) -> OpenCallPolicy:
        """What a prepared input does with a tool call left without a result."""
        return self._options.open_calls

    @property
    def earlier_state(self) -> EarlierStatePolicy:
        """Whether later inputs keep earlier turns' runtime-state pairs (``"keep"``) or not."""
        return self._options.earlier_state

    @property
    def tenant_limit(self) -> int:
        """The most preparation slots one tenant holds at once (``max_tenant_preparations``)."""
        return self._options.tenant_limit

    @property
    def history_limits(self) -> HistoryLimits:
        """The bounds of each context's history."""
        return self._options.history_limits

    @property
    def closed(self) -> bool:
        """True once the Foundation began closing.

        What raises :class:`FoundationClosedError` from then on, and what
        still answers: the closing order in :mod:`turnloom.runtime.foundation`.
        """
        return self._life.closing

    def context_ids(self) -> tuple[str, ...]:
        """The ids of the contexts held, in creation order (after the close: at the close)."""
        return self._life.context_ids()

    def history(self, context_id: str) -> HistoryView:
        """An immutable view of one context's history (O(1)).

        What the view returns (messages, renders' items) is never shared
        with what the history keeps: a message holding a dict (``extras``,
        ``layout``, an opaque part's ``item``) comes as a copy with new
        dicts, and a render's ``items`` are new containers each read, so a
        host's edit of them reaches no later input (see
        :class:`~turnloom.context.history.HistoryView`).

        After the close it answers with each context's final history (step 5
        of the closing order in :mod:`turnloom.runtime.foundation`), so a host
        can persist the last utterance of a session that shut down (the
        manager keeps those views until it is dropped).

        Raises:
            StateError: the manager is not bound to an open Foundation yet.
            InvalidMessageError: a malformed context id (see :func:`~turnloom.context.check_id`).
            UnknownContextError: no turn was ever committed to ``context_id``
                (or, after the close, it was not held at the close).
        """
        return self._life.history(context_id)

    def statistics(self) -> ManagerStatistics:
        """A frozen snapshot of the manager's counters, O(1) in the number of contexts.

        Safe to call from another thread (a metrics scrape): it only reads
        running totals, each read atomically; the snapshot may mix values from
        two adjacent moments.
        """
        return self._life.statistics(self.outputs.statistics())

    # -- turns and their model calls --------------------------------------------

    def accept_turn(self, snapshot: TurnSnapshot) -> None:
        """Commit a turn: its input, and new pinned instructions when given.

        The first turn of a context creates it. Every message is validated
        before anything changes. Then a history over a limit is evicted
        (``HistoryLimits.low_water``; during a model call, when it ends:
        see :meth:`invocation`). Preparations waiting for this turn wake up.

        Raises:
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: a malformed id or message, an input message
                with a system/developer role or carrying a runtime-state call or
                result, an instruction with another role, or an input that
                renders to nothing (empty, blank text only, or only tool results
                answering no call the context's kept turns leave open).
            UnpairedResultError: an input tool result answers no call the
                context's kept turns (then the input before it) leave open
                (never made, already answered, closed by a later message, or
                made in an evicted turn; see
                :meth:`~turnloom.context.TurnHistory.open_calls`), and it
                follows text or a model step of the input, or the context
                has no turn yet; no provider accepts it, so it would vanish
                from every model input. A result leading the input is kept
                instead (a call recorded late to an earlier turn can still
                answer it; it is left out until then), except a second one
                with the same call id; an input of such results only is an
                ``InvalidMessageError`` (it renders to nothing). An
                ``InvalidMessageError``: ``field`` names the message,
                ``call_id`` the result's; nothing was committed.
            InvalidTextError: text that is not valid UTF-8.
            ItemTooLargeError: a message is over the per-item byte cap.
            TurnTooLargeError: the turn would hold more than ``max_items``
                messages or ``max_bytes`` bytes (checked on the batch first).
            PairedTurnsTooLargeError: the input answers tool calls of the
                context's newest turn (an approval), and eviction, which
                keeps a turn with the turns whose calls its input answers,
                could not fit them together in ``max_turns``, ``max_items``,
                ``max_bytes`` or ``max_tokens`` (``unit`` names it); nothing
                was committed.
            DuplicateIdError: the turn id was already committed to the context.
            AmbiguousStepError: the input splits a model step in a shape that
                cannot be paired without guessing, or starts with an
                assistant message that would continue the step the previous
                turn ends with (see :class:`~turnloom.context.CallTracker`);
                nothing was committed.
            ProviderRuleError: the gateway cannot render a message (for example
                tool call arguments that are not a JSON object, for Anthropic
                and Gemini); nothing was committed.
            OutOfOrderTurnError: the snapshot's sequence is not newer than the
                context's previous one.
            NotClaimedError, StaleLeaseError: with a store, the context is not
                claimed, or this manager lost its lease (see ``manager.leases``:
                a change is durable once a later ``flush`` returned).
            HostCallbackError: the token counter raised (the ``__cause__``)
                or returned a count that is not an int in ``[0,
                MAX_TOKEN_COUNT]``; nothing was committed.
        """
        queue = self._life.check_open().queue
        context_id = check_snapshot(snapshot, self._options.gateway, self._table.history_of)
        self.leases._check_writable(context_id)
        self._table.commit(context_id, snapshot)
        queue.wake(context_id)

    def record(self, context_id: str, turn_id: str, outputs: Sequence[Message]) -> int:
        """Record model outputs and tool results of a turn, in order.

        By the rules of :meth:`~turnloom.context.TurnHistory.record`, blank
        messages (a cancelled call's partial output), a reply recorded twice
        and outputs for a turn no longer held (evicted or retracted) are not
        stored, and counted; record through the :class:`Invocation` to bind
        outputs to the very turn even when its id is reused. The runtime-state
        pair never enters history: messages carrying it are rejected. Outputs
        for a context :meth:`remove_context` removed (a reply that finished
        playing after the caller hung up) are checked as a batch of Messages,
        then dropped and counted in ``dropped_late_outputs_total``.

        Outputs are accepted while the Foundation closes, until its output
        streams are drained and its preparations settled (see :meth:`history`).

        Returns:
            how many messages were recorded.

        Raises:
            StateError: the manager is not bound to an open Foundation yet.
            FoundationClosedError: the Foundation finished closing (with a
                store: its close wrote what was queued and released the
                leases).
            UnknownContextError: no turn was committed to ``context_id``.
            UnknownTurnError: ``turn_id`` was certainly never committed to the
                context.
            DuplicateIdError: a message has the id of a held message with
                other content (or of another turn's message), or a malformed
                batch repeats one; nothing was recorded.
            InvalidMessageError, InvalidTextError: a malformed id or message,
                or a message carrying a runtime-state call or result (of any
                turn).
            InstructionMessageError: a ``system`` or ``developer`` message: pinned
                instructions change only through a turn's snapshot.
            AmbiguousStepError: an output continues a model step (the
                turn's trailing assistant messages, then the outputs) with a
                call id the step holds already (``field`` names the output,
                ``call_id`` the call), or a late record would let the next
                turn start by continuing its step; nothing was recorded. A
                step split one message per call is paired by call id: see
                :class:`~turnloom.context.CallTracker`.
            UnpairedResultError: a tool result answers no call open at its
                place (the turn's calls still unanswered; for a turn holding
                only results answering an earlier turn's calls, those calls),
                and no call recorded late can answer it: the turn, or the
                outputs before it, hold text or a model step, or it is the
                context's only kept turn (see
                :meth:`~turnloom.context.TurnHistory.record`); nothing was
                recorded.
            ItemTooLargeError, TurnTooLargeError, ProviderRuleError,
            NotClaimedError, StaleLeaseError, HostCallbackError: as
                :meth:`accept_turn`; nothing was recorded. A turn tied to
                others by an approval counts with the tied turns, newest or
                not (``PairedTurnsTooLargeError``).
            StrandedResultsError: a late record (to a turn before the newest)
                would leave results a later turn holds answering no call (see
                :meth:`~turnloom.context.TurnHistory.record`); nothing was
                recorded. A ``StateError``: ``turn_id``, ``stranded_turn_id``
                and ``call_ids`` say which turn, which later turn and which
                of its results.
        """
        self._life.check_recording()
        table = self._table
        if table.was_removed(context_id):
            return table.drop_late(turn_id, outputs)
        self.leases._check_writable(context_id)
        state = table.get(context_id)
        check_outputs(self._options.gateway, turn_id, outputs, state.history)
        return table.record(state, turn_id, outputs)

    def remove_context(self, context_id: str) -> None:
        """Forget a context and its whole history (its counters are kept); idempotent.

        Call it when the conversation ends (a voice host: the caller hung
        up). Removing a context this manager already removed does nothing
        (the last 65,536 removed ids are remembered; an id created again is
        held again).

        Work in flight for the context is cancelled, and nothing it produces
        reaches another context:

        * its preparations settle at once, counted as discarded
          (``statistics().preparations.discarded``), and free their slots:
          one waiting for its turn, its assembly or a thread is cancelled; one
          whose worker thread renders is left to finish and its result
          discarded; each requester gets
          :class:`~turnloom.errors.ContextRemovedError`. A context created
          again with the same id never serves them.
        * the body of its :meth:`invocation` block in flight is cancelled (the
          model call it streams is interrupted at its next checkpoint); the
          block swallows that cancellation and exits normally, so the host's
          code after the block runs.
        * outputs recorded for it later, through an :class:`Invocation` or
          by :meth:`record` (and ``voice.record_interrupted``) with its id,
          are dropped and counted in ``dropped_late_outputs_total``.

        Turns its newest turn's acceptance evicted, held aside for a
        retraction (``voice.retract_turn``), count in ``evicted_turns_total``
        now.

        Raises:
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: a malformed context id.
            UnknownContextError: no turn was ever committed to ``context_id``
                (and it is not a remembered removed id).
            NotClaimedError, StaleLeaseError: as :meth:`accept_turn`.

        With a store, the context's log is deleted from the store and its lease
        released by the store's next batch (``manager.leases.flush`` waits for it).
        """
        queue = self._life.check_open().queue
        table = self._table
        if table.was_removed(context_id):
            return
        self.leases._check_writable(context_id)
        state = table.get(context_id)
        table.remove(context_id)
        queue.remove(context_id, state)
        self.leases._forget(context_id)

    def invocation(self, context_id: str, turn_id: str) -> AbstractAsyncContextManager[Invocation]:
        """Mark one model call of a turn as in flight for the duration of the block.

        While it is in flight the context's history is not evicted and the
        context cannot be removed; eviction that became due runs when the
        block exits. One invocation per context at a time.

        Use it as ``async with manager.invocation(context_id, turn_id) as invocation``.

        Returns:
            the block (an async context manager): entering it raises the
            errors below, or gives an :class:`Invocation` whose ``record``
            records the call's outputs.

        Raises:
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: a malformed context or turn id.
            UnknownContextError: no turn was committed to ``context_id``.
            UnknownTurnError: the turn is not held (never committed, or evicted).
            StateError: another invocation is in flight for the context.

        Cancellation:
            Entering and leaving do not wait. The body runs in a cancel scope
            that :meth:`remove_context` of the context cancels: the block then
            exits without an error (its later records are dropped and
            counted). When the block is cancelled from outside, what
            was recorded stays recorded (a blank partial output never is),
            calls left without a result are handled by the ``open_calls``
            policy at the next prepare, and the context is released.
        """
        return InvocationBlock(self._life, self._table, self._options.gateway, context_id, turn_id)

    # -- prefixes: preparation and continuation ---------------------------------

    async def prepare(self, request: ContextPrepareRequest) -> PreparedContext:
        """Prepare the model input of a committed turn.

        Waits, in order, for the turn's commit (it may be called before
        ``accept_turn``; a requester waiting for the commit holds no slot and
        is not admitted, so it never starves other contexts' preparations),
        for a free slot in the pending queue (a full queue makes it wait:
        backpressure; :meth:`prepare_nowait` fails instead; slots are shared
        fairly, see ``ContextPrepareRequest.tenant``), for the turn's assembly
        (with a strategy, the turn's first prepare per tenant and
        ``auto_hydrate`` awaits it on the event loop, memory I/O included, in
        this preparation's cancel scope; the others reuse its result), and
        for its render in the Foundation's render thread. A preparation whose turn is
        committed, without a strategy, scope or area section, for a built-in
        gateway and a context holding at most 512 messages, renders inline on
        the event loop instead while fewer than ``worker_threads`` renders are
        in the render thread and inline renders use under a quarter of the loop (a bounded step
        costing less than the thread handoff; same result, same counters); it
        holds its slot until its requester resumes. The request is validated
        and its contributions copied at the call; the history and the
        request's state (the perception's time included) are captured once, at
        the commit. A turn never committed (a mistyped id) is waited for until
        the caller's deadline, holding no slot (counted in
        ``statistics().preparations.waiting_for_turn``, not in ``pending``):
        bound the wait with ``anyio.fail_after(seconds, reason=...)`` naming
        the context and turn.

        Returns:
            the prefix (what it holds and what to send: see
            :attr:`PreparedContext.items`). Delivered to its requester, an
            unscoped prefix's pair becomes the turn's kept pair. With
            ``request.scope`` the earlier turns are the sliced view of recorded
            messages, without kept pairs, and nothing is kept (see
            :class:`~turnloom.runtime.ContextPrepareRequest`).

        Raises:
            FoundationClosedError: the Foundation is closing or closed, or closed
                while the call waited (for the turn's commit, a slot, or as an
                admitted preparation).
            InvalidMessageError, InvalidTextError, DuplicateIdError: a malformed
                request (ids, contributions that are not a tuple or list,
                contribution names or text, loop budget, perception); no slot
                was taken. Also when the Foundation's clock returns a naive
                datetime for a perception without a time.
            InvalidArgumentError: the request's ``scope`` is not a scope; no
                slot was taken.
            PositionalScopeError: a scope without ``indices`` asked a
                positional scope's ``matches`` (raised by the preparation).
            ItemTooLargeError: the runtime-state result would exceed the
                per-item byte cap: raised at the call when the carried texts
                alone exceed it (no slot taken), else by the preparation.
            UnknownTurnError: the turn was evicted (or retracted) before it could
                be captured. Found while waiting for the commit, it is raised
                at once, before a slot is taken, and not counted as a failed
                preparation.
            ContextRemovedError: the context was removed, or its lease was lost
                to another host, while the call waited. Found while waiting
                for the commit, it is raised at once, before a slot is taken,
                and not counted as a failed preparation.
            ProviderRuleError: the gateway rejected a message while rendering.
            AreaCallbackError: an attached area raised (or returned a wrong
                value) in the area pass; ``area`` and ``phase`` name it. The
                area section is as it was before the pass.
            OpenToolCallError: the area section would end with a routed tool
                call whose result has not been routed; nothing changed.
            MemoryStoreError: the strategy's memory source failed or returned
                malformed entries; the next prepare of the turn assembles again.
            StateError: a custom strategy returned something that is not an
                AssembledContext.
            HostCallbackError: the token counter (counting what the render
                adds: the state pair, the area section, a prompt) or the
                Foundation's clock (read for a perception without a time)
                raised (the ``__cause__``), or the counter returned a count
                that is not an int in ``[0, MAX_TOKEN_COUNT]``. The slot is
                freed and nothing is delivered or kept.

        Cancellation:
            Cancelled while waiting for the turn's commit or for a slot, or
            already cancelled when a free slot is found: nothing was admitted
            and no slot is held (nothing is counted). A free slot is taken
            without yielding; the call's yield is then the render's wait, or,
            after an inline render, one checkpoint holding the slot. A call
            that waited for its slot (or its turn's commit) already yielded:
            an inline render is then delivered at once, and a cancellation
            that came during it lands at the caller's next checkpoint.
            Cancelled later: the preparation is cancelled if it still waits
            for its assembly (the strategy's memory I/O; the next prepare of
            the turn assembles again) or is queued in the render thread behind other
            renders (it then renders nothing), or, if it is rendering, the
            call returns at once, the thread finishes and the result is
            discarded; the slot is freed when it settles (an inline render
            never waits, so it cannot be cancelled midway). Cancelled after
            the render finished but before the requester resumed: the
            cancellation propagates and the result is discarded, never
            counted as delivered. A preparation
            changes no recorded message; only a result delivered to its
            requester sets its turn's kept pair. An area pass that ran for a
            discarded result is reused by the next preparation of the context,
            so it is delivered exactly once.
        """
        return await self._life.check_open().prepare(request, wait=True)

    async def prepare_nowait(self, request: ContextPrepareRequest) -> PreparedContext:
        """Like :meth:`prepare`, but refuse at once when every slot is taken.

        Unlike trio's and anyio's ``*_nowait`` methods this is a coroutine:
        only taking the slot never waits. Like :meth:`prepare` it first awaits
        the turn's commit, holding no slot; then it takes a slot at once or
        raises :class:`~turnloom.errors.QueueFullError` (the queue is checked
        after the commit, not at the call); once admitted it awaits the
        render exactly as :meth:`prepare` does. Await it.

        Raises:
            QueueFullError: once the turn is committed, all ``capacity`` slots
                are taken, or the request's tenant holds its
                ``tenant_limit``, or requests that waited first are owed the
                free slots (a freed slot is handed to waiting requests a few
                at a time, and a new request never overtakes an eligible
                waiting one; the message says how many wait); nothing was
                admitted.
            Every error of :meth:`prepare`, for the same reasons.

        Cancellation:
            As :meth:`prepare`: cancelled while waiting for the turn's commit,
            nothing was admitted and no slot is held.
        """
        return await self._life.check_open().prepare(request, wait=False)

    def build(
        self,
        prefix: PreparedContext,
        continuation: Sequence[Message] = (),
        *,
        recorded: bool = False,
    ) -> tuple[NativeContent, ...]:
        """The input of the next model call of a turn: the prefix, then the continuation.

        Send ``manager.gateway.request_body(items)``, not the items (see
        :attr:`PreparedContext.items`).

        With ``recorded=True`` the host need not hand back what turnloom
        already holds: the outputs recorded for the prefix's turn so far (by
        :meth:`record`, an :class:`Invocation`, ``voice.record_interrupted``;
        the very messages the history holds, so they are neither checked nor
        rendered again) come first, then ``continuation`` (what the host has
        not recorded). ``build(prefix, recorded=True)`` after recording every
        output equals ``build(prefix, outputs)`` with those very outputs (an
        equal copy of a recorded result answering a call the prefix closed is
        refused, ``UnpairedResultError``, where the recorded one is left out).
        When the
        turn is no longer held (evicted, retracted, its context removed),
        there are no recorded outputs to add.

        The continuation (the turn's model outputs and tool results so far,
        oldest first) is rendered and appended; the prefix, including its
        runtime-state pair, is reused as is and never refreshed. Calls without
        a result are handled by the ``open_calls`` policy; a continuation
        result whose call is not before it in the continuation (the turn's own
        calls are there, not in the prefix) is refused, never sent alone. A
        recorded output answering a call the prefix closed (recorded to a turn
        whose input answered some of an earlier turn's calls) is left out:
        it pairs from the next turn on. A continuation call
        reusing a call id of the prefix or of an earlier continuation call is
        renamed, with its results, by the rule of
        :mod:`turnloom.context.callids`, continued from the prefix, so the
        items hold each call id once. Cost on the calling thread:
        O(continuation) plus a C-speed copy of the result's references. The
        prefix's part of the result is a copy of its items made ahead in the
        render worker, handed over (once the host built on the context's
        previous prefix; then, after each build, the worker makes the next
        one, from 512 items on);
        without one ready (a shorter prefix, the context's first prefix, or
        a build right after another), it is made here, O(items): the closed
        turns decoded from their kept JSON bytes in one C-speed call, the
        items after them copied (see :class:`PreparedContext`).

        Returns:
            a new tuple of NativeContent, oldest first, every dict and list in
            it new (made for this call, shared with nothing turnloom keeps: the
            prefix's items, the cached renders of the continuation messages
            the turn recorded): change them freely, no later input sees it.

        Raises:
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: ``prefix`` was not returned by this manager's
                :meth:`prepare` (built by hand, changed with
                ``msgspec.structs.replace``, or from another Foundation), or
                ``continuation`` is not a sequence of Messages.
            InvalidMessageError, InvalidTextError, InstructionMessageError: a
                continuation message rejected as :meth:`record` rejects an output.
            DuplicateIdError: a continuation message repeats an id of the
                prefix's turn (its input message ids or the state call id) or
                of an earlier continuation message.
            AmbiguousStepError: the continuation splits a model step in a
                shape :meth:`record` refuses.
            UnpairedResultError: a continuation tool result answers no call
                of the continuation open at its place (the prefix's calls are
                closed or answered in it).
            ProviderRuleError: the gateway rejected a message.
            TurnTooLargeError: the continuation holds more than ``max_items``
                messages.
            InvalidArgumentError: ``recorded`` is not a bool.
        """
        self._life.check_open()
        continuation = self._issued.with_recorded(prefix, continuation, recorded, "build")
        traced = tracing.build_span("turnloom.build", self.gateway, continuation)
        if traced is tracing.NO_SPAN:  # nothing records: no span to enter, set and leave
            return self._issued.build(prefix, continuation)
        with traced:
            items = self._issued.build(prefix, continuation)
            traced.set("turnloom.items", len(items))
        return items

    def request_bytes(
        self,
        prefix: PreparedContext,
        continuation: Sequence[Message] = (),
        *,
        fields: Mapping[str, Any] | None = None,
        recorded: bool = False,
    ) -> bytes:
        """The whole request body of ``build(prefix, continuation)``, as UTF-8 JSON bytes.

        Equal, byte for byte, to ``msgspec.json.encode({**fields,
        **manager.gateway.request_body(manager.build(prefix, continuation))})``,
        at the cost of the open turn and the continuation (checked and
        rendered as :meth:`build` does) plus one C-speed join: the history's
        render cache keeps the other body items encoded (see
        :mod:`turnloom.context.body`; a prefix whose assembly put a system
        prompt before the history is encoded whole). With a ``prompt_cache``
        it is :meth:`request_body` encoded: the OpenAI cache key goes after
        ``fields``; Anthropic breakpoints change blocks the cache holds
        encoded, so that body is built and encoded whole (O(input) at C
        speed plus one copy of every container).

        Args:
            fields: the request's own top-level fields, for example
                ``{"model": "gpt-4o", "tools": [...]}``, written first.
            recorded: the turn's recorded outputs come before
                ``continuation``, as in :meth:`build`.

        Returns:
            the body's JSON bytes (``{"model": ..., "messages": [...]}`` and the like).

        Raises:
            InvalidArgumentError: ``fields`` is not a str-keyed mapping of JSON
                data (a NaN or infinite float at any depth included: JSON has
                none, and it would be sent as ``null``), or sets a field the
                body writes (the gateway's ``items_field``, or its
                instructions field: ``system``, ``systemInstruction`` or
                ``system_instruction``, ``instructions``); or ``recorded`` is
                not a bool.
            FoundationClosedError, InvalidMessageError, InvalidTextError,
            InstructionMessageError, DuplicateIdError, ProviderRuleError,
            TurnTooLargeError, AmbiguousStepError, UnpairedResultError: as
                :meth:`build`, for the same reasons.
        """
        self._life.check_open()
        continuation = self._issued.with_recorded(prefix, continuation, recorded, "request_bytes")
        with tracing.build_span("turnloom.request_bytes", self.gateway, continuation) as traced:
            body = self._issued.request_bytes(prefix, continuation, fields)
            traced.set("turnloom.bytes", len(body))
        return body

    def request_body(
        self,
        prefix: PreparedContext,
        continuation: Sequence[Message] = (),
        *,
        fields: Mapping[str, Any] | None = None,
        recorded: bool = False,
    ) -> dict[str, Any]:
        """The whole request body of ``build(prefix, continuation)``, prompt-cache fields added.

        ``{**fields, **manager.gateway.request_body(manager.build(prefix,
        continuation))}``, plus what the manager's ``prompt_cache``
        (:class:`~turnloom.context.cache.PromptCache`) adds: on OpenAI Chat
        and Responses ``"prompt_cache_key"`` (``prefix.prompt_cache_key``,
        unless ``fields`` set one); on Anthropic ``cache_control``
        breakpoints (:func:`~turnloom.context.cache.place_breakpoints`) within
        the budget of 4, counting the host's own marks (message ``extras``,
        ``fields``' ``tools`` and top-level ``cache_control``), so the body
        passes ``gateway.validate_request`` whenever the host's marks do.

        The body is new on every call (the values of ``fields`` are the
        host's, not copied): the marks live only in it and reach no later
        input, prefix or ``prefix.items``. :meth:`request_bytes` is this body
        encoded, byte for byte. ``recorded`` is as in :meth:`build`.

        Raises:
            InvalidArgumentError: as :meth:`request_bytes`, for ``fields``;
                ``recorded`` is not a bool.
            FoundationClosedError, InvalidMessageError, InvalidTextError,
            InstructionMessageError, DuplicateIdError, ProviderRuleError,
            TurnTooLargeError, AmbiguousStepError, UnpairedResultError: as
                :meth:`build`, for the same reasons.
        """
        self._life.check_open()
        continuation = self._issued.with_recorded(prefix, continuation, recorded, "request_body")
        with tracing.build_span("turnloom.request_body", self.gateway, continuation):
            return self._issued.request_body(prefix, continuation, fields)

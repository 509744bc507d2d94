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

With a durable store (``Foundation(store=...)``), a context is owned through
a lease (:meth:`ContextManager.claim`), every history change is also queued
for the store, and :meth:`ContextManager.flush` acknowledges them; the
module ``_durable`` holds that side.
"""

from __future__ import annotations

__all__ = ("ContextManager", "Invocation")

from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.abc
import msgspec

from turnloom.context.area import ContextAreaImplementation
from turnloom.context.gateway import Gateway, GatewayType, NativeContent
from turnloom.context.history import HistoryLimits, HistoryView, TurnHistory, check_id
from turnloom.context.interruption import played_prefix
from turnloom.context.memory import MemorySource
from turnloom.context.message import Message, ToolCallPart
from turnloom.context.pairing import OpenCallPolicy
from turnloom.context.scope import ContextScope, check_scope
from turnloom.context.tokens import TokenCounter
from turnloom.context.working import FrozenContext, WorkingContext
from turnloom.errors import (
    InputError,
    InvalidMessageError,
    StateError,
    TurnloomError,
    UnknownContextError,
    excerpt,
)
from turnloom.runtime._area_section import check_area
from turnloom.runtime._bridge import folded_message, working_context
from turnloom.runtime._contexts import ContextState, ContextTable
from turnloom.runtime._continuation import IssuedPrefixes
from turnloom.runtime._counters import Counters
from turnloom.runtime._door import (
    DEFAULT_IDLE_AFTER,
    DEFAULT_LEASE_TTL,
    DEFAULT_MAX_PENDING_PREPARATIONS,
    ManagerOptions,
    check_durable_options,
    check_manager_options,
    check_outputs,
    check_request,
    check_routed_item,
    check_snapshot,
)
from turnloom.runtime._durable import Durability
from turnloom.runtime._outputs import OutputStreams
from turnloom.runtime._preparing import Preparer
from turnloom.runtime._queue import PreparationQueue
from turnloom.runtime.assembly import (
    AssemblyStrategy,
    HydratingStrategy,
    StrategyOptions,
)
from turnloom.runtime.errors import FoundationClosedError
from turnloom.runtime.schemas import (
    ContextPrepareRequest,
    ManagerStatistics,
    OutputRecord,
    OutputStatistics,
    PreparedContext,
    TurnSnapshot,
)
from turnloom.runtime.store import ContextStore


def _utc_now() -> datetime:
    return datetime.now(UTC)


class Invocation:
    """One model call in flight for a turn; see :meth:`ContextManager.invocation`.

    Attributes:
        context_id: the conversation.
        turn_id: the turn the model call answers.
    """

    __slots__ = ("_manager", "_serial", "_state", "context_id", "turn_id")

    def __init__(
        self, manager: ContextManager, state: ContextState, context_id: str, turn_id: str
    ) -> None:
        self._manager = manager
        self._state = state
        self._serial = state.history.turn_serial(turn_id)
        self.context_id = context_id
        self.turn_id = turn_id

    def record(self, outputs: Sequence[Message]) -> int:
        """Record outputs of this turn; see :meth:`ContextManager.record`.

        Bound to the turn the invocation was opened for: outputs recorded
        after that turn is gone (evicted, retracted, its context removed,
        even when its id was since reused) are dropped and counted as late.
        """
        manager = self._manager
        manager._check_recording()
        check_outputs(manager.gateway, self.context_id, self.turn_id, outputs, self._state.history)
        return manager._table.record(
            self._state, self.turn_id, outputs, self._serial, self.context_id
        )

    def record_interrupted(self, output: Message, *, played: int) -> int:
        """Record this call's interrupted output; see :meth:`ContextManager.record_interrupted`."""
        return self.record([played_prefix(output, played)])


class ContextManager:
    """Keeps each context's history and prepares provider-native model inputs.

    A host builds it first (directly, or from a configuration with
    :func:`~turnloom.runtime.build_context_manager`), then binds it to a
    :class:`~turnloom.runtime.Foundation` (``Foundation(manager)``), which owns
    it from then on: building needs no Foundation service. ``Foundation(...)``
    with the same keyword arguments builds one itself. Reach it as
    ``foundation.manager``. Every method must be called from the Foundation's
    event loop; until the Foundation is open they raise :class:`StateError`.

    A prepared prefix is, in order: the assembled system prompt (with an
    assembly strategy, see :mod:`turnloom.runtime.assembly`), pinned
    instructions, earlier turns, the turn's input, the runtime-state pair
    (when there is state or recalled memory), then the context's *area
    section*. Send ``manager.gateway.request_body(prefix.items)``
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
        gateway: the provider prepared inputs are rendered for (a
            :class:`GatewayType`, its name, or a Gateway instance).
        max_pending_preparations: the bound on pending preparations (default 16).
        history_limits: the bounds of each context's history (default
            ``HistoryLimits()``).
        behavior_rules: default application behaviour rules, carried as data
            in each turn's runtime-state pair (see :mod:`turnloom.runtime.state`).
        open_calls: ``"exclude"`` (default) or ``"cancel"`` calls without a
            result in prepared inputs.
        token_counter: the one estimator of tokens (default
            :class:`~turnloom.context.ApproxTokenCounter`); see
            :class:`~turnloom.runtime.Foundation`.
        strategy: the per-turn assembly strategy: ``"jit"``, ``"stratified"``
            (see :mod:`turnloom.runtime.assembly`), an
            :class:`~turnloom.runtime.assembly.AssemblyStrategy` object, or
            None (default: no assembled prompt, no memory).
        memory: the memory source a named strategy searches. Borrowed: neither
            the manager nor its Foundation ever closes it; it stays open and
            usable after the Foundation closed.
        strategy_options: the named strategy's static layer and bounds.
        max_tenant_preparations: the most preparation slots one tenant (the
            ``tenant_id`` of a request's ``tenant``) holds at once; default
            half the capacity, rounded up.
        store: where contexts are kept durably: None (default: in memory
            only) or a :class:`~turnloom.runtime.store.ContextStore`, for
            example ``turnloom.stores.open_context_store("sqlite:PATH")`` or
            ``("redis://127.0.0.1:6379/0")``. Borrowed: the opener closes it,
            after the Foundation. With a store, contexts are claimed
            (:meth:`claim`) and changes are acknowledged by :meth:`flush`.
        lease_ttl: seconds a context's lease lasts unless renewed (default
            10.0); it is renewed every third of that while held. After a crash
            another host can claim the context once it expired.
        idle_after: seconds after its last use at which a held context leaves
            memory and its lease is released (default 300.0; ``math.inf``
            keeps it).
        owner: this manager's name in leases (default: a random unique one).

    Fairness of preparation slots: a tenant holds at most
    ``max_tenant_preparations`` slots, so a tenant flooding the queue leaves
    the rest to the others; a freed slot goes to the waiting request whose
    tenant holds the fewest slots (longest waiting first among equals), and
    a new request never overtakes an eligible waiting one. Requests without a
    tenant share one bucket bounded only by the capacity.

    Raises:
        InputError: a bound is not positive, ``history_limits`` is not a
            :class:`HistoryLimits`, an unknown gateway or policy, behaviour
            rules that are not valid text, ``memory`` or ``strategy_options``
            without a named strategy, bad strategy options, a store that is
            not a ContextStore, a non-positive ``lease_ttl`` / ``idle_after``,
            or a malformed ``owner``.
        UnknownStrategyError: ``strategy`` names no known strategy (``known``
            lists them).
        InvalidArgumentError: ``token_counter`` has no ``count`` method.
    """

    def __init__(
        self,
        *,
        gateway: GatewayType | str | Gateway = GatewayType.openai_chat,
        max_pending_preparations: int = DEFAULT_MAX_PENDING_PREPARATIONS,
        history_limits: HistoryLimits | None = None,
        behavior_rules: str | None = None,
        open_calls: OpenCallPolicy = "exclude",
        token_counter: TokenCounter | None = None,
        strategy: str | AssemblyStrategy | None = None,
        memory: MemorySource | None = None,
        strategy_options: StrategyOptions | None = None,
        max_tenant_preparations: int | None = None,
        store: str | ContextStore | None = None,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        idle_after: float = DEFAULT_IDLE_AFTER,
        owner: str | None = None,
    ) -> None:
        options = check_manager_options(
            gateway=gateway,
            max_pending_preparations=max_pending_preparations,
            history_limits=history_limits,
            behavior_rules=behavior_rules,
            open_calls=open_calls,
            token_counter=token_counter,
            strategy=strategy,
            memory=memory,
            strategy_options=strategy_options,
            max_tenant_preparations=max_tenant_preparations,
        )
        durable = check_durable_options(
            store=store,
            lease_ttl=lease_ttl,
            idle_after=idle_after,
            owner=owner,
            history_limits=options.history_limits,
            token_counter=options.token_counter,
        )
        if durable is not None:
            options = msgspec.structs.replace(options, durable=durable)
        self._options = options
        self._strategy = options.strategy
        self._gateway = options.gateway
        self._limits = options.history_limits
        self._behavior_rules = options.behavior_rules
        self._open_calls = options.open_calls
        self._counters = Counters()
        self._counters.strategy = self._strategy.name if self._strategy is not None else None
        self._table = ContextTable(
            self._limits, self._gateway, self._counters, options.token_counter
        )
        self._durable: Durability | None = None  # set by _bind when there is a store
        self._issued = IssuedPrefixes(self._gateway, self._limits, self._open_calls)
        # Set by _bind, when the owning Foundation opens.
        self._outputs: OutputStreams | None = None
        self._preparer: Preparer | None = None
        self._bound = False
        self._closing = False  # intake stopped (the Foundation began closing)
        self._closed = False  # outputs drained, preparations settled, histories released
        # Each context's final history, kept when the manager closes.
        self._final: dict[str, HistoryView] = {}

    def _bind(
        self,
        *,
        task_group: anyio.abc.TaskGroup,
        limiter: anyio.CapacityLimiter,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        """Bind to the opening Foundation's task group, limiter and clock (once).

        Raises:
            StateError: the manager was already bound to a Foundation.
        """
        self._check_unbound()
        self._bound = True
        queue = PreparationQueue(
            self._options.max_pending_preparations,
            task_group,
            self._counters,
            self._options.tenant_limit,
        )
        self._outputs = OutputStreams(task_group, self._record_output)
        if self._options.durable is not None:
            self._durable = Durability(
                self._options.durable,
                limiter,
                self._table.install,
                self._table.unload,
                self._unloadable,
                self._held_history,
            )
            self._table.log = self._durable.log
            task_group.start_soon(self._durable.run)
        self._preparer = Preparer(
            self._options,
            self._table,
            self._counters,
            self._issued,
            queue,
            limiter,
            clock,
            self._durable,
        )

    def _check_unbound(self) -> None:
        if self._bound:
            raise StateError(
                "This ContextManager was already bound to a Foundation; build a new one."
            )

    @property
    def options(self) -> ManagerOptions:
        """The checked options the manager was built with."""
        return self._options

    # -- properties --------------------------------------------------------

    @property
    def gateway(self) -> Gateway:
        """The gateway prepared inputs are rendered with."""
        return self._gateway

    @property
    def capacity(self) -> int:
        """The bound on pending preparations."""
        return self._options.max_pending_preparations

    @property
    def open_calls(self) -> OpenCallPolicy:
        """What a prepared input does with a tool call left without a result."""
        return self._open_calls

    @property
    def tenant_limit(self) -> int:
        """The most preparation slots one tenant holds at once (see :class:`Foundation`)."""
        return self._options.tenant_limit

    @property
    def strategy(self) -> AssemblyStrategy | None:
        """The assembly strategy, or None."""
        return self._strategy

    def tool_definitions(self) -> list[dict[str, Any]]:
        """The tools the assembly strategy needs declared, in the gateway's ``tools`` shape.

        ``[hydrate_context]`` for JIT, ``[]`` for stratified or without a
        strategy. Declare them beside the agent's own tools.
        """
        if self._strategy is None:
            return []
        return self._strategy.tool_definitions(self._gateway)

    @property
    def history_limits(self) -> HistoryLimits:
        """The bounds of each context's history."""
        return self._limits

    @property
    def closed(self) -> bool:
        """True once the Foundation began closing.

        From then on every call that starts work (``accept_turn``, ``prepare``,
        ``build``, ``invocation``, areas, new output streams) raises
        :class:`FoundationClosedError`. :meth:`record` is accepted until the
        output streams are drained and preparations settled, then raises it
        too; :meth:`history`, :meth:`context_ids`, :meth:`statistics` and the
        properties still answer after the close.
        """
        return self._closing

    def context_ids(self) -> tuple[str, ...]:
        """The ids of the contexts held, in creation order (after the close: at the close)."""
        if self._closed:
            return tuple(self._final)
        return tuple(self._table.contexts)

    def history(self, context_id: str) -> HistoryView:
        """An immutable view of one context's history (O(1)).

        After the close it answers with each context's final history: what it
        held once the output streams were drained and preparations settled, so
        a host can persist the last utterance of a session that shut down
        (the manager keeps those views until it is dropped).

        Raises:
            StateError: the manager is not bound to an open Foundation yet.
            InvalidMessageError: ``context_id`` is not a non-empty str of at
                most 256 characters.
            UnknownContextError: no turn was ever committed to ``context_id``
                (or, after the close, it was not held at the close).
        """
        if self._closed:
            final = self._final.get(context_id) if isinstance(context_id, str) else None
            if final is None:
                check_id(context_id, "context id")
                raise UnknownContextError(
                    f"Context {excerpt(context_id)} was not held when the Foundation closed."
                )
            return final
        self._check_bound()
        return self._table.get(context_id).history.view()

    def _check_bound(self) -> Preparer:
        preparer = self._preparer
        if preparer is None:
            raise StateError(
                "This ContextManager is not bound to an open Foundation yet; open "
                "'async with Foundation(manager)' first."
            )
        return preparer

    def _check_recording(self) -> None:
        """Outputs are recorded until the close drained the streams and settled preparations."""
        self._check_bound()
        if self._closed:
            raise FoundationClosedError(
                "The Foundation is closed; its output streams were drained and no more "
                "outputs are recorded."
            )

    def _check_open(self) -> Preparer:
        preparer = self._check_bound()
        if self._closing:
            raise FoundationClosedError(
                "The Foundation is closed; the ContextManager accepts no calls."
            )
        return preparer

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
            NotClaimedError: with a store, the context is not claimed (see
                :meth:`claim`).
            StaleLeaseError: with a store, this manager lost the context's lease.

        Durability: with a store the commit is queued for the store's next
        batch and is durable once :meth:`flush` returns.
        """
        queue = self._check_open().queue
        context_id = check_snapshot(snapshot, self._gateway, self._table.history_of)
        if self._durable is not None:
            self._durable.check_writable(context_id)
        self._table.commit(context_id, snapshot)
        queue.wake(context_id)

    def record(self, context_id: str, turn_id: str, outputs: Sequence[Message]) -> int:
        """Record model outputs and tool results of a turn, in order.

        Empty or whitespace-only messages (for example the partial output of a
        cancelled model call) are not recorded. A message whose id and
        content the turn already holds (a reply committed twice) is not
        stored again, and counted. Outputs for a turn no longer held (evicted,
        however long ago, or retracted) are dropped and counted; they never
        bring the turn back (see :meth:`~turnloom.context.TurnHistory.record`;
        record through the :class:`Invocation` to bind outputs to the very
        turn even when its id is reused). The runtime-state pair never enters
        history: messages carrying it are rejected.

        Outputs are accepted while the Foundation closes, until its output
        streams are drained and its preparations settled (the last utterance
        of a session that shuts down is kept); see :meth:`history` after close.

        Returns:
            how many messages were recorded.

        Raises:
            StateError: the manager is not bound to an open Foundation yet.
            FoundationClosedError: the Foundation finished closing.
            UnknownContextError: no turn was committed to ``context_id``.
            UnknownTurnError: ``turn_id`` was certainly never committed to the
                context.
            DuplicateIdError: a message has the id of a held message with
                other content (or of another turn's message); nothing was
                recorded.
            InvalidMessageError, InvalidTextError, DuplicateIdError: a malformed
                id or message, or a message carrying a runtime-state call or
                result (of any turn).
            InstructionMessageError: a ``system`` or ``developer`` message: pinned
                instructions change only through a turn's snapshot.
            ItemTooLargeError: a message is over the per-item byte cap.
            TurnTooLargeError: the turn would hold more than ``max_items``
                messages or ``max_bytes`` bytes (checked on the batch first).
            ProviderRuleError: the gateway cannot render a message (for example
                tool call arguments that are not a JSON object, for Anthropic
                and Gemini); nothing was recorded.
            NotClaimedError, StaleLeaseError: as :meth:`accept_turn`.

        Durability: as :meth:`accept_turn`.
        """
        self._check_recording()
        if self._durable is not None:
            self._durable.check_writable(context_id)
        state = self._table.get(context_id)
        check_outputs(self._gateway, context_id, turn_id, outputs, state.history)
        return self._table.record(state, turn_id, outputs)

    def record_interrupted(
        self, context_id: str, turn_id: str, output: Message, *, played: int
    ) -> int:
        """Record a model output interrupted while it was played (a voice barge-in).

        Only what the user heard is recorded: the output's text up to
        ``played`` characters (see :func:`~turnloom.context.played_prefix`);
        its tool calls stay, and as they have no result the ``open_calls``
        policy excludes or cancels them in the next input unless their
        results are recorded. An output cut before any text was played and
        without other parts is blank and not recorded.

        Args:
            context_id: the conversation.
            turn_id: the turn the output answered.
            output: the whole assistant message the model produced.
            played: how many characters of its text were played, counted
                over its text parts in order.

        Returns:
            how many messages were recorded (0 or 1).

        Raises:
            InvalidMessageError: ``output`` is not an assistant Message, or
                ``played`` is not a non-negative int; and as :meth:`record`.
            FoundationClosedError, UnknownContextError, UnknownTurnError,
            InvalidTextError, DuplicateIdError, ItemTooLargeError,
            ProviderRuleError: as :meth:`record`.
        """
        self._check_recording()
        self._table.get(context_id)
        return self.record(context_id, turn_id, [played_prefix(output, played)])

    def retract_turn(self, context_id: str, turn_id: str) -> None:
        """Take back the newest turn of a context that produced no answer (a false start).

        A voice host commits the user's speech as a turn; when it turns out
        to be a false start (noise, a cough, words cut off), retracting it
        keeps it out of every later input. Its id stays used (see
        :meth:`~turnloom.context.TurnHistory.retract`): outputs recorded for
        it later are dropped and counted, and a later prepare of it raises
        :class:`~turnloom.errors.UnknownTurnError`. Prefixes already
        delivered for it are unchanged.

        Raises:
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: a malformed id.
            UnknownContextError: no such context.
            UnknownTurnError: the turn is not held.
            StateError: the turn is not the newest, outputs were recorded for
                it, or a model call of the context is in flight.
            NotClaimedError, StaleLeaseError: as :meth:`accept_turn`.

            Nothing changed when any of these is raised.
        """
        self._check_open()
        if self._durable is not None:
            self._durable.check_writable(context_id)
        self._table.retract(self._table.get(context_id), context_id, turn_id)

    def consume_outputs(
        self,
        stream: AsyncIterable[OutputRecord],
        *,
        on_error: Callable[[object, TurnloomError], None] | None = None,
    ) -> None:
        """Consume an output stream in the manager's own task, recording each record.

        The stream form of :meth:`record`: an anyio memory object stream
        (``anyio.create_memory_object_stream[OutputRecord]``; pass its receive
        side) or any async iterable of :class:`OutputRecord`. Each record is
        recorded exactly as ``record(context_id, turn_id, outputs)`` would,
        through the same checks, in the order the stream yields them; push
        calls to :meth:`record` may be mixed in. Several streams may be
        consumed at once.

        A record refused with a typed error (not an OutputRecord, unknown
        context or turn, a malformed or instruction message ...) records
        nothing, is counted in ``statistics().outputs.rejected_total`` and is
        passed to ``on_error(record, error)`` when given; the consumer goes
        on. An exception the stream itself raises (or ``on_error`` raises)
        ends the consumer and propagates out of the Foundation's task group;
        raised while the close drains, it leaves after every other stream was
        drained and every stream closed.

        Close order (the Foundation's ``aclose``): intake stops first; a
        memory object stream is then drained at once -- what it still holds,
        senders blocked on it included, is recorded in order -- and its
        receive side closed (a producer still sending gets
        :class:`anyio.BrokenResourceError`); any other stream is given up to
        the grace period to end (its producer stops and ends it), then its
        consumer is cancelled and its ``aclose()``, if any, awaited. Only then
        do preparations settle and the manager close: everything sent before
        the close is in :meth:`history` afterwards.

        Raises:
            StateError: the manager is not bound to an open Foundation yet.
            FoundationClosedError: the Foundation is closing or closed.
            InputError: ``stream`` is not an async iterable, or ``on_error`` is
                not callable.

        Cancellation:
            The consumer belongs to the Foundation's task group: cancelling
            the scope the Foundation was opened in cancels it without losing a
            record of a memory object stream (the close drains it).
        """
        self._check_open()
        if not isinstance(stream, AsyncIterable):
            raise InputError(
                f"consume_outputs takes an async iterable of OutputRecord (for example an "
                f"anyio memory object receive stream), not a {type(stream).__name__}."
            )
        if on_error is not None and not callable(on_error):
            raise InputError(f"on_error must be callable, not a {type(on_error).__name__}.")
        assert self._outputs is not None  # bound with the queue
        self._outputs.start(stream, on_error)

    def _record_output(self, record: object) -> int:
        if not isinstance(record, OutputRecord):
            raise InvalidMessageError(
                f"An output stream yielded a {type(record).__name__}, not an OutputRecord."
            )
        return self.record(record.context_id, record.turn_id, record.outputs)

    def remove_context(self, context_id: str) -> None:
        """Forget a context and its whole history (its counters are kept).

        Preparations waiting for a turn of the context settle at once with
        :class:`~turnloom.errors.ContextRemovedError` and free their slots; a
        context created again with the same id never serves them. Outputs an
        :class:`Invocation` of it records later are dropped and counted.

        Raises:
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: a malformed context id.
            UnknownContextError: no such context.
            StateError: a model call is in flight for the context.
            NotClaimedError, StaleLeaseError: as :meth:`accept_turn`.

        With a store, the context's log is deleted from the store and its lease
        released by the store's next batch (:meth:`flush` waits for it).
        """
        queue = self._check_open().queue
        if self._durable is not None:
            self._durable.check_writable(context_id)
        self._table.remove(context_id)
        queue.wake(context_id)
        if self._durable is not None:
            self._durable.forget(context_id)

    # -- durability -----------------------------------------------------------------

    @property
    def store(self) -> ContextStore | None:
        """The durable context store, or None when the Foundation has none."""
        return self._durable.store if self._durable is not None else None

    async def claim(self, context_id: str) -> bool:
        """Own a context on this host: take its lease and restore it from the store.

        With a store, a context must be claimed before :meth:`accept_turn`,
        :meth:`record` or :meth:`remove_context` change it; claiming one this
        manager already holds costs no I/O and marks it used. When the lease
        is taken, the context's stored log is replayed (in a worker thread)
        into its history, which then equals the history of the host that
        wrote it, so the next prepared input equals what that host would have
        prepared (the area section and the last delivered prefix are not
        stored). The lease is renewed while the manager holds the context; a
        context unused for ``idle_after`` seconds leaves memory and its lease
        is released; claim it again to bring it back. Without a store this
        only checks the id and returns False.

        Returns:
            True when the lease was taken by this call, False when it was held.

        Raises:
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: a malformed context id.
            LeaseHeldError: another owner holds the lease and it has not
                expired; retry after it expires (``lease_ttl``).
            StoreRecordError: a stored record of the context does not decode
                or does not apply; ``index`` names it. The lease was released.
            StoreUnavailableError: the store cannot be reached.

        Cancellation:
            A cancelled claim releases the lease it took and leaves the
            context as it was.
        """
        self._check_open()
        if self._durable is None:
            check_id(context_id, "context id")
            return False
        return await self._durable.claim(context_id)

    async def flush(self, context_id: str | None = None) -> None:
        """Wait until every change made before the call is in the store.

        Changes (:meth:`accept_turn`, :meth:`record`, evictions,
        :meth:`remove_context`) are sent to the store in batches by one writer
        task: one round trip (Redis) or transaction (SQLite) for every change
        queued since the previous batch, whatever the number of contexts. A
        change is *acknowledged* once a flush made after it returned: a crash
        of this process after that never loses it (how durable the store
        itself is, is the store's own contract: see
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
            StoreUnavailableError: the store stayed unreachable through the
                writer's bounded retry (about a second); the changes stay queued
                and the next flush retries them.

        Cancellation:
            The queued changes stay queued; the writer still writes them.
        """
        if self._durable is not None:
            await self._durable.flush(context_id)

    @property
    def takeovers(self) -> int:
        """Claims that restored a context from the store (0 without a store)."""
        return self._durable.takeovers if self._durable is not None else 0

    def _held_history(self, context_id: str) -> TurnHistory | None:
        state = self._table.contexts.get(context_id)
        return state.history if state is not None else None

    def _unloadable(self, context_id: str) -> bool:
        state = self._table.contexts.get(context_id)
        return state is None or state.in_flight is None

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
            yield Invocation(self, state, context_id, turn_id)
        finally:
            self._table.end_call(state, evict=not self._closing)

    # -- preparation -----------------------------------------------------------

    async def prepare(self, request: ContextPrepareRequest) -> PreparedContext:
        """Prepare the model input of a committed turn.

        Waits, in order, for a free slot in the pending queue (backpressure: a
        full queue makes ``prepare`` wait; use :meth:`prepare_nowait` to fail
        instead), for the turn's commit (``prepare`` may be called before
        ``accept_turn``), and for a worker thread. The request is validated and
        its contributions copied at the call (changing a list afterwards has no
        effect); the history and the request's state are captured once, when
        the turn is committed, together with the perception's time (the
        Foundation's clock, when the request gives none). With an assembly
        strategy, the turn's first prepare (per tenant and ``auto_hydrate``)
        then awaits the strategy on the event loop, memory I/O included, in
        this preparation's cancel scope; the other prepares of the turn wait
        for it and reuse its result. Rendering runs in the worker. Slots are
        shared fairly between tenants (see :class:`ContextManager`). A turn that is
        never committed (a mistyped id) is waited for until the caller's
        deadline; such waits are counted in
        ``statistics().preparations.waiting_for_turn``. Bound the whole wait
        with ``anyio.fail_after(seconds, reason=...)``, the reason naming the
        context and turn ids, so the ``TimeoutError`` says what never came.

        Returns:
            the prefix: the assembled system prompt (with a strategy), pinned
            instructions, earlier turns, the turn's input,
            the runtime-state pair when the request or manager carries state,
            and the area section. Send ``manager.gateway.request_body(items)``.
            With ``request.scope`` the earlier turns are the sliced view (see
            :class:`~turnloom.runtime.ContextPrepareRequest`).

        Raises:
            FoundationClosedError: the Foundation is closing or closed, or closed
                while the preparation waited.
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
                be captured.
            ContextRemovedError: the context was removed while the preparation
                waited (a context created again with the same id never serves it).
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

        Cancellation:
            Cancelled while waiting for a slot: nothing was admitted. Cancelled
            later: the preparation is cancelled if it still waits for its turn,
            its assembly (the strategy's memory I/O; the next prepare of the
            turn assembles again) or a thread, or, if it is rendering, the thread finishes and the
            result is discarded; the slot is freed when it settles. Cancelled
            after the preparation settled but before the requester resumed: the
            cancellation propagates and the result is discarded, never counted
            as delivered. History is never changed by a preparation. An area
            pass that ran for a discarded result is reused by the next
            preparation of the context, so it is delivered exactly once.
        """
        preparer = self._check_open()
        queue = preparer.queue
        request = check_request(request, self._limits.max_item_bytes)
        requested_at = anyio.current_time()
        origin = self._table.contexts.get(request.context_id)
        waited = await queue.acquire(request)
        # One that waited for its slot passes a checkpoint after an inline
        # render, so requesters granted before it resume first.
        return await queue.admit(
            request,
            requested_at,
            origin,
            preparer.run,
            preparer.run_inline,
            checkpointed=not waited,
        )

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
            ItemTooLargeError, UnknownTurnError, ContextRemovedError,
            ProviderRuleError, AreaCallbackError, OpenToolCallError: as
            :meth:`prepare`.

        Cancellation:
            As :meth:`prepare` after admission.
        """
        preparer = self._check_open()
        queue = preparer.queue
        request = check_request(request, self._limits.max_item_bytes)
        requested_at = anyio.current_time()
        queue.acquire_nowait(request)
        origin = self._table.contexts.get(request.context_id)
        return await queue.admit(
            request, requested_at, origin, preparer.run, preparer.run_inline, checkpointed=False
        )

    async def hydrate_context(self, prefix: PreparedContext, call: ToolCallPart) -> Message:
        """Answer the model's ``hydrate_context`` call of a JIT turn with a tool result.

        The search runs within the scope of the request that prepared
        ``prefix`` (never a process-wide one), with the strategy's top-k and
        output-size cap. Record the call and this result as the turn's
        outputs (or pass them as the continuation of :meth:`build`).

        Returns:
            a ``tool`` message answering ``call`` (``is_error`` with a reason
            when the model's arguments were wrong or the turn has no scope).

        Raises:
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: ``prefix`` was not returned by this manager's
                :meth:`prepare`, or ``call`` is not a ToolCallPart naming
                ``hydrate_context``.
            StateError: the Foundation's strategy has no ``hydrate_context``
                tool (it is not JIT).
            MemoryStoreError: the memory source failed.

        Cancellation:
            As the memory source's search; nothing in the manager changes.
        """
        self._check_open()
        self._issued.check(prefix)
        strategy = self._strategy
        if not isinstance(strategy, HydratingStrategy):
            name = strategy.name if strategy is not None else None
            raise StateError(
                f"The assembly strategy {excerpt(name)} has no hydrate_context tool; only a JIT "
                "strategy's model recalls memory by calling it."
            )
        scope = prefix.assembled.tenant if prefix.assembled is not None else None
        answer = await strategy.hydrate(call, scope=scope)
        self._counters.hydrate_calls += 1
        self._counters.assembly_entries += answer.entries_count
        return answer.message

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
            tuple of NativeContent, oldest first; shared with caches (the
            prefix's items, and the cached renders of continuation messages
            the turn recorded): treat as read-only.

        Raises:
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: ``prefix`` was not returned by this manager's
                :meth:`prepare` (built by hand, changed with
                ``msgspec.structs.replace``, or from another Foundation), or
                ``continuation`` is not a sequence of Messages.
            InvalidMessageError, InvalidTextError: a malformed continuation
                message, or one carrying a runtime-state call or result.
            InstructionMessageError: a ``system`` or ``developer`` continuation
                message: pinned instructions change only through a turn's snapshot.
            DuplicateIdError: a continuation message repeats an id of the
                prefix's turn (its input message ids or the state call id) or
                of an earlier continuation message.
            ProviderRuleError: the gateway rejected a message.
            TurnTooLargeError: the continuation holds more than ``max_items``
                messages.
        """
        self._check_open()
        state = (
            self._table.contexts.get(prefix.context_id)
            if isinstance(prefix, PreparedContext)
            else None
        )
        return self._issued.build(
            prefix, continuation, state.history if state is not None else None
        )

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
            limiter=self._check_bound().limiter,
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
        """Close in order: stop intake, drain output streams, let preparations settle, release.

        ``grace_period`` bounds the first two waits together. Not shielded:
        the Foundation calls it in a shielded scope. Preparations settle and
        the histories are released (their final views kept for
        :meth:`history`) even when a step fails.
        """
        preparer = self._check_bound()
        queue = preparer.queue
        outputs = self._outputs
        deadline = anyio.current_time() + grace_period
        try:
            self._closing = True
            preparer.closing = True
            try:
                if outputs is not None:
                    await outputs.aclose(grace_period)
            finally:
                try:
                    await queue.aclose(max(0.0, deadline - anyio.current_time()))
                finally:
                    if self._durable is not None:
                        await self._durable.aclose(grace_period)
        finally:
            self._closed = True
            self._final = {cid: state.history.view() for cid, state in self._table.contexts.items()}
            self._table.release()

    # -- statistics --------------------------------------------------------------------

    def statistics(self) -> ManagerStatistics:
        """A frozen snapshot of the manager's counters, O(1) in the number of contexts.

        Every total is kept up to date as it changes, so a scrape never walks
        the contexts. Safe to call from another thread (a metrics scrape): it
        only reads counters, each read atomically; the snapshot may mix
        values from two adjacent moments.
        """
        queue = self._preparer.queue if self._preparer is not None else None
        snapshot = self._counters.snapshot(
            closed=self._closing,
            contexts=len(self._table.contexts),
            capacity=self._options.max_pending_preparations,
            pending=queue.pending if queue is not None else 0,
            waiting_for_slot=queue.waiting_for_slot if queue is not None else 0,
            waiting_for_turn=queue.waiting_for_turn if queue is not None else 0,
            outputs=self._outputs.statistics() if self._outputs is not None else OutputStatistics(),
        )
        if self._durable is not None:
            snapshot = msgspec.structs.replace(snapshot, store=self._durable.statistics())
        return snapshot

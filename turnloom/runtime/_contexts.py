"""The manager's contexts: each one's history, area section and last prefix, counted.

Synchronous (a turn's assembly holds one anyio event): every change to a
history (commit, record, kept state, eviction, removal, a summary applied, tool
output pruned) goes through
:class:`ContextTable`, which keeps the running totals of
:class:`~turnloom.runtime._counters.Counters` in step with it, and hands each
change to its ``log`` hook (the durable store's writer, see ``_durable``) as
a record, in the order the changes happened. Checking the input is the
caller's job (``_door``); the table enforces only what the history and the
in-flight model call decide.
"""

from __future__ import annotations

__all__ = ("REMEMBERED_REMOVALS", "ContextState", "ContextTable", "TurnAssembly")

from collections.abc import Callable, Sequence

import anyio

from turnloom.context.area import ContextAreaImplementation
from turnloom.context.gateway import Gateway, NativeContent
from turnloom.context.history import (
    HistoryLimits,
    SummaryApplied,
    TurnHistory,
    apply_summary,
    check_id,
    prune_turns,
)
from turnloom.context.memory import TenantScope
from turnloom.context.message import Message
from turnloom.context.pairing import CallTracker
from turnloom.context.tokens import TokenCounter
from turnloom.errors import (
    ContextRemovedError,
    DuplicateAreaError,
    InvalidMessageError,
    ItemTooLargeError,
    StateError,
    UnknownContextError,
    UnknownTurnError,
    excerpt,
    what_type,
)
from turnloom.runtime._area_section import AreaSection, SectionResult, answer_routed_calls
from turnloom.runtime._counters import Counters
from turnloom.runtime._records import (
    OutputsRecorded,
    Record,
    StateKept,
    TurnCommitted,
    TurnRetracted,
    TurnsEvicted,
    TurnsPruned,
    TurnsSummarized,
)
from turnloom.runtime._render import DeliveredPrefix
from turnloom.runtime._wakeup import CancelScope
from turnloom.runtime.assembly import AssembledContext
from turnloom.runtime.schemas import TurnSnapshot
from turnloom.runtime.state import EarlierStatePolicy


class TurnAssembly:
    """The assembly of one turn for one tenant and hydration choice.

    Running while ``done`` is unset; finished with ``result``. ``key`` is
    ``(turn id, tenant, auto_hydrate)``: a prepare of the same turn for
    another tenant never reuses it.
    """

    __slots__ = ("done", "key", "result")

    def __init__(self, key: tuple[str, TenantScope | None, bool]) -> None:
        self.key = key
        self.done = anyio.Event()
        self.result: AssembledContext | None = None


REMEMBERED_REMOVALS = 65_536
"""How many removed context ids a manager remembers (about 100 bytes each):
``remove_context`` of one of them is a no-op, and ``record`` to it is dropped
and counted; an id pushed out is unknown again (``UnknownContextError``)."""


class ContextState:
    """One context: its history, the model call in flight, its last prefix, its areas."""

    __slots__ = (
        "__weakref__",  # a delivered prefix refers to the context it came from weakly
        "areas",
        "assembly",
        "call_scope",
        "context_id",
        "history",
        "in_flight",
        "last",
    )

    def __init__(self, context_id: str, history: TurnHistory) -> None:
        self.context_id = context_id
        self.history = history
        self.in_flight: str | None = None  # the turn id of the model call in flight
        # The cancel scope of that call's invocation block: a removal cancels it.
        self.call_scope: CancelScope | None = None
        self.last: DeliveredPrefix | None = None  # the last delivered prefix
        self.areas: AreaSection | None = None  # created by the first areas.attach or areas.route
        self.assembly: TurnAssembly | None = None  # the latest turn's assembly


class ContextTable:
    """The contexts of one manager, by id, in creation order."""

    __slots__ = (
        "_counters",
        "_drop_state",
        "_empty",
        "_fresh",
        "_gateway",
        "_limits",
        "_token_counter",
        "contexts",
        "left",
        "log",
        "removed",
        "safe_point",
    )

    def __init__(
        self,
        limits: HistoryLimits,
        gateway: Gateway,
        counters: Counters,
        token_counter: TokenCounter | None = None,
        earlier_state: EarlierStatePolicy = "keep",
    ) -> None:
        self._limits = limits
        # Under "drop" no history keeps state: a restored one lets go of its pairs.
        self._drop_state = earlier_state == "drop"
        self._token_counter = token_counter
        self._gateway = gateway
        self._counters = counters
        self._empty = TurnHistory(limits).counts()
        # The history history_of gave for a context not held yet: the door
        # checked (and rendered) the first turn on it, so commit uses it.
        self._fresh: tuple[str, TurnHistory] | None = None
        self.contexts: dict[str, ContextState] = {}
        # Ids of contexts removed and not created again, oldest first, at most
        # REMEMBERED_REMOVALS (a long-running host removes without end).
        self.removed: dict[str, None] = {}
        # Called with every change of a history, in order (a durable store's writer).
        self.log: Callable[[str, Record], None] | None = None
        # Called with the context after each change made with no model call in
        # flight (``manager.summaries``: a safe point).
        self.safe_point: Callable[[ContextState], None] | None = None
        # Called with a context that leaves this table (removed, unloaded, released).
        self.left: Callable[[ContextState], None] | None = None

    def get(self, context_id: str) -> ContextState:
        """The context ``context_id``.

        Raises:
            InvalidMessageError: a malformed context id.
            UnknownContextError: no turn was committed to it.
        """
        state = self.contexts.get(context_id) if isinstance(context_id, str) else None
        if state is None:
            check_id(context_id, "context id")
            raise UnknownContextError(f"No turn was committed to context {excerpt(context_id)}.")
        return state

    def holding(
        self, context_id: str, turn_id: str, origin: ContextState | None
    ) -> ContextState | None:
        """The context when it holds ``turn_id``; None while the turn is not committed.

        Args:
            context_id: the context.
            turn_id: the turn.
            origin: the context the request was made for, or None when it did
                not exist yet.

        Raises:
            ContextRemovedError: ``origin`` was removed (the id may name a new context).
            UnknownTurnError: the turn was evicted or retracted.
        """
        state = self.contexts.get(context_id)
        if origin is not None and state is not origin:
            raise ContextRemovedError(
                f"Context {excerpt(context_id)} was removed (or its lease lost) while the "
                f"preparation of turn {excerpt(turn_id)} waited.",
                context_id=context_id,
                turn_id=turn_id,
            )
        if state is None or state.history.has_turn(turn_id):
            return state
        if state.history.was_evicted(turn_id):
            raise UnknownTurnError(
                f"Turn {excerpt(turn_id)} of context {excerpt(context_id)} was evicted or "
                f"retracted "
                "before it could be prepared."
            )
        return None

    def held_history(self, context_id: str) -> TurnHistory | None:
        """The history of ``context_id`` while it is held, else None."""
        state = self.contexts.get(context_id)
        return state.history if state is not None else None

    def history_of(self, context_id: str) -> TurnHistory:
        """The history of ``context_id``, or an empty one with the limits for a new context.

        A new context's empty history is the one :meth:`commit` then creates
        the context with (when no other new context was asked for since), so
        the door's checks and renders of its first turn are kept.
        """
        state = self.contexts.get(context_id)
        if state is not None:
            return state.history
        history = TurnHistory(self._limits, token_counter=self._token_counter)
        self._fresh = (context_id, history)
        return history

    def commit(self, context_id: str, snapshot: TurnSnapshot) -> None:
        """Commit a checked turn, creating the context on its first turn, then evict.

        Raises:
            as ``TurnHistory.commit``; nothing changed when it raises.
        """
        state = self.contexts.get(context_id)
        fresh, self._fresh = self._fresh, None
        if state is not None:
            history = state.history
        elif fresh is not None and fresh[0] == context_id and not fresh[1].turn_ids:
            history = fresh[1]
        else:
            history = TurnHistory(self._limits, token_counter=self._token_counter)
        before = history.counts()
        left_out = history.left_out(snapshot.input) if snapshot.input else 0
        history.commit(
            snapshot.turn_id,
            snapshot.input,
            instructions=snapshot.instructions,
            sequence=snapshot.sequence,
        )
        if state is None:
            state = self.contexts[context_id] = ContextState(context_id, history)
            self.removed.pop(context_id, None)
        if self.log is not None:
            self.log(
                context_id,
                TurnCommitted(
                    turn_id=snapshot.turn_id,
                    input=tuple(snapshot.input),
                    instructions=(
                        tuple(snapshot.instructions) if snapshot.instructions is not None else None
                    ),
                    sequence=snapshot.sequence,
                ),
            )
        self._evict(state)
        self._counters.history_changed(before, history.counts())
        self._counters.left_out += left_out
        self._safe_point(state)

    def record(
        self,
        state: ContextState,
        turn_id: str,
        outputs: Sequence[Message],
        serial: int | None = None,
        context_id: str | None = None,
    ) -> int:
        """Record checked outputs of a turn, then evict; return how many were recorded.

        With ``serial`` (an invocation's turn), outputs for another turn than
        that one, or for a context no longer held as ``context_id``, are late:
        dropped and counted.

        Raises:
            as ``TurnHistory.record``; nothing changed when it raises.
        """
        if context_id is not None and self.contexts.get(context_id) is not state:
            self._counters.late += len(outputs)
            return 0
        history = state.history
        before = history.counts()
        left_out = history.left_out_at(outputs)
        try:
            recorded = history.record(turn_id, outputs, serial=serial)
        except UnknownTurnError:
            raise UnknownTurnError(
                f"Turn {excerpt(turn_id)} was never committed to context "
                f"{excerpt(state.context_id)}; commit it with accept_turn before recording "
                "its outputs."
            ) from None
        if recorded and self.log is not None:
            self.log(state.context_id, OutputsRecorded(turn_id=turn_id, outputs=tuple(outputs)))
        # _evict and _safe_point inlined (a record is the loop's most frequent change).
        idle = state.in_flight is None
        if idle and history.over_limits():
            self._evict(state)
        self._counters.history_changed(before, history.counts())
        if recorded and left_out:
            kept = history.kept_at  # a duplicate dropped is not counted again
            self._counters.left_out += sum(1 for at in left_out if kept is None or at in kept)
        if idle and self.safe_point is not None:
            self.safe_point(state)
        return recorded

    def keep_state(
        self, state: ContextState, turn_id: str, pair: tuple[Message, ...], serial: int
    ) -> None:
        """Keep a delivered prefix's runtime-state pair (or none) as its turn's.

        Nothing happens when the context is no longer held as ``state`` or the
        turn (``serial``) is gone: a kept pair leaves with its turn. A pair
        the render sent within the per-item byte cap can be over it as a
        history message (its encoding is longer than the native item's): the
        turn then keeps none. This never raises. It does not evict: the
        prefix just delivered stays a render of the history, and the next
        commit, record or end of a model call evicts as usual.
        """
        if self.contexts.get(state.context_id) is not state:
            return
        history = state.history
        if not history.has_turn(turn_id) or history.view().turn_state(turn_id) == pair:
            return  # gone, or delivered again unchanged: nothing to log
        before = history.counts()
        try:
            kept = history.keep_state(turn_id, pair, serial=serial)
        except ItemTooLargeError:
            pair = ()
            if history.view().turn_state(turn_id) == pair:
                return
            kept = history.keep_state(turn_id, pair, serial=serial)
        if not kept:
            return
        if self.log is not None:
            self.log(state.context_id, StateKept(turn_id=turn_id, state=pair))
        self._counters.history_changed(before, history.counts())

    def evict(self, state: ContextState) -> None:
        """Evict down to the limits, if no model call is in flight (a safe point)."""
        history = state.history
        if state.in_flight is None and history.over_limits():
            before = history.counts()
            self._evict(state)
            self._counters.history_changed(before, history.counts())

    def _safe_point(self, state: ContextState) -> None:
        hook = self.safe_point
        if hook is not None and state.in_flight is None:
            hook(state)

    def summarize(
        self,
        state: ContextState,
        turn_ids: tuple[str, ...],
        summary_id: str,
        summary: tuple[Message, ...],
        max_messages: int,
        snapshot: tuple[object, ...] | None = None,
    ) -> SummaryApplied:
        """Replace the held turns of ``turn_ids`` by a summary turn, log it, then evict.

        The caller checked that no model call is in flight (a safe point).

        Raises:
            as ``_summary_ops.apply_summary``; nothing changed when it raises.
        """
        history = state.history
        before = history.counts()
        applied = apply_summary(history, turn_ids, summary_id, summary, max_messages, snapshot)
        if self.log is not None:
            self.log(
                state.context_id,
                TurnsSummarized(
                    turn_ids=turn_ids,
                    summary_id=summary_id,
                    summary=summary,
                    replaced=applied.replaced,
                ),
            )
        self._evict(state)
        self._counters.history_changed(before, history.counts())
        return applied

    def prune(
        self, state: ContextState, keep: int, note: str, checked: dict[int, object] | None = None
    ) -> tuple[str, ...]:
        """Prune the tool output of the turns before the newest ``keep``; log it; their ids.

        Then evicts as a commit does when the history is over its limits (a
        note longer than the output it replaces makes a turn larger).

        Raises:
            as ``_summary_ops.prune_turns``; nothing changed when it raises.
        """
        history = state.history
        before = history.counts()
        pruned = prune_turns(history, keep, note, checked)
        if pruned:
            if self.log is not None:
                self.log(state.context_id, TurnsPruned(turn_ids=pruned, keep=keep, note=note))
            # A note longer than the output it replaces grows the turn: the limits hold.
            self._evict(state)
            self._counters.history_changed(before, history.counts())
            self._counters.turns_pruned += len(pruned)
        return pruned

    def _evict(self, state: ContextState) -> None:
        # Safe point only: never while a model call is in flight.
        if state.in_flight is None and state.history.over_limits():
            evicted = state.history.evict()
            if evicted and self.log is not None:
                self.log(state.context_id, TurnsEvicted(turn_ids=evicted))

    def begin_call(self, context_id: str, turn_id: str) -> ContextState:
        """Mark a model call of ``turn_id`` as in flight; return the context.

        Raises:
            InvalidMessageError: a malformed context or turn id.
            UnknownContextError: no turn was committed to ``context_id``.
            UnknownTurnError: the turn is not held (never committed, or evicted).
            StateError: another model call is in flight for the context.
        """
        state = self.get(context_id)
        check_id(turn_id, "turn id")
        if not state.history.has_turn(turn_id):
            raise UnknownTurnError(
                f"Turn {excerpt(turn_id)} is not held by context {excerpt(context_id)} "
                f"(never committed "
                "or evicted)."
            )
        if state.in_flight is not None:
            raise StateError(
                f"Context {excerpt(context_id)} already has a model call in flight for turn "
                f"{excerpt(state.in_flight)}."
            )
        state.in_flight = turn_id
        self._counters.invocations += 1
        return state

    def end_call(self, state: ContextState, *, evict: bool) -> None:
        """The model call in flight ended; run the eviction it held back when ``evict``.

        A context removed while the call was in flight is not evicted: it is gone.
        """
        state.in_flight = None
        state.call_scope = None
        self._counters.invocations -= 1
        if evict and self.contexts.get(state.context_id) is state:
            self.evict(state)
            self._safe_point(state)

    def retract(self, state: ContextState, context_id: str, turn_id: str) -> None:
        """Take back the newest turn, which produced no answer.

        Raises:
            StateError: a model call is in flight for the context, or as
                ``TurnHistory.retract``; nothing changed when it raises.
            UnknownTurnError, InvalidMessageError: as ``TurnHistory.retract``.
        """
        if state.in_flight is not None:
            raise StateError(
                f"Context {excerpt(context_id)} has a model call in flight (turn "
                f"{excerpt(state.in_flight)}); retract after the invocation ends."
            )
        before = state.history.counts()
        state.history.retract(turn_id)
        if self.log is not None:
            self.log(context_id, TurnRetracted(turn_id=turn_id))
        self._counters.history_changed(before, state.history.counts())
        self._safe_point(state)

    def remove(self, context_id: str) -> None:
        """Forget a context (its counters are kept); cancel the model call in flight, if any.

        The id is remembered as removed (see :meth:`was_removed`) until it is
        created again or :data:`REMEMBERED_REMOVALS` later removals push it out.

        Raises:
            InvalidMessageError, UnknownContextError: as :meth:`get`.
        """
        state = self.get(context_id)
        if state.call_scope is not None:
            # The invocation block swallows this cancellation when it exits.
            state.call_scope.cancel()
        # Turns held aside for a retraction can no longer be restored: evicted for good.
        before = state.history.counts()
        state.history.settle_evictions()
        self._counters.history_changed(before, state.history.counts())
        self._forget(state)
        del self.contexts[context_id]
        removed = self.removed
        removed[context_id] = None
        if len(removed) > REMEMBERED_REMOVALS:
            del removed[next(iter(removed))]

    def drop_late(self, turn_id: str, outputs: Sequence[Message]) -> int:
        """Drop and count outputs recorded for a removed context; return 0.

        Raises:
            InvalidMessageError: a malformed turn id, or ``outputs`` is not a
                sequence of Messages (nothing is counted).
        """
        check_id(turn_id, "turn id")
        if isinstance(outputs, (str, bytes, Message)) or not isinstance(outputs, Sequence):
            raise InvalidMessageError("record takes a sequence of Messages, oldest first.")
        for index, message in enumerate(outputs):
            if not isinstance(message, Message):
                raise InvalidMessageError(
                    f"outputs[{index}] is {what_type(message)}, not a Message.",
                    field=f"outputs[{index}]",
                )
        self._counters.late += len(outputs)
        return 0

    def was_removed(self, context_id: object) -> bool:
        """True when ``context_id`` names a context this table removed and is not held."""
        return isinstance(context_id, str) and context_id in self.removed

    def install(self, context_id: str, history: TurnHistory | None) -> None:
        """Replace a context's in-memory state by a restored history (None: no state).

        Under ``earlier_state="drop"`` the restored turns' kept pairs (stored
        by a ``"keep"`` host) are let go, and that is logged, so no earlier
        pair is sent and the stored log rebuilds this history.
        """
        self.unload(context_id)
        if history is not None:
            state = self.contexts[context_id] = ContextState(context_id, history)
            self.removed.pop(context_id, None)
            # Held now; what the history counted before it was stored was
            # counted by the manager that counted it.
            turns, items, size, tokens, _, _, _, _, duplicates, retracted = history.counts()
            held = (turns, items, size, tokens, 0, 0, 0, 0, duplicates, retracted)
            self._counters.history_changed(self._empty, held)
            if self._drop_state:
                view = history.view()
                for turn_id in view.turn_ids:
                    if view.turn_state(turn_id):
                        self.keep_state(state, turn_id, (), history.turn_serial(turn_id))

    def unload(self, context_id: str) -> None:
        """Drop a context's in-memory state, if any (it stays in the durable store)."""
        state = self.contexts.pop(context_id, None)
        if state is not None:
            self._forget(state)

    def release(self) -> None:
        """Forget every context (closing)."""
        for state in self.contexts.values():
            self._forget(state)
        self.contexts.clear()

    def _forget(self, state: ContextState) -> None:
        self._counters.history_removed(state.history.counts())
        if self.left is not None:
            self.left(state)
        if state.areas is not None:
            self._counters.areas_attached -= len(state.areas.attached)
            state.areas.attached.clear()  # a pass still in a worker detaches none again

    def _areas(self, state: ContextState) -> AreaSection:
        areas = state.areas
        if areas is None:
            areas = state.areas = AreaSection(self._gateway, self._limits.max_item_bytes)
        return areas

    def attach(self, state: ContextState, area: ContextAreaImplementation, context_id: str) -> None:
        """Queue a checked area for the context's next area pass.

        Raises:
            DuplicateAreaError: this very instance is attached and not collected.
        """
        areas = state.areas
        if areas is not None and areas.attached.get(id(area)) is area:
            raise DuplicateAreaError(
                f"This {type(area).__qualname__} area is already attached to context "
                f"{excerpt(context_id)}."
            )
        areas = self._areas(state)
        areas.attached[id(area)] = area
        areas.pending_areas.append(area)
        self._counters.areas_registered += 1
        self._counters.areas_attached += 1

    def route(
        self, state: ContextState, copy: NativeContent, message: Message, context_id: str
    ) -> None:
        """Queue a checked routed item (``copy``, parsed as ``message``) for the next pass.

        Raises:
            InvalidMessageError: it breaks the pairing of routed calls and results.
        """
        areas = state.areas
        calls = answer_routed_calls(
            areas.calls if areas is not None else CallTracker(), message, context_id
        )
        areas = self._areas(state)
        areas.calls = calls
        areas.pending_items.append(copy)

    def detach(self, areas: AreaSection, gone: tuple[object, ...]) -> None:
        """Forget areas that left the section (collected, or dropped by a worker)."""
        for area in gone:
            if areas.attached.get(id(area)) is area:
                del areas.attached[id(area)]
                self._counters.areas_attached -= 1

    def count_section(self, areas: AreaSection, section: SectionResult | None) -> None:
        """Count what a preparation's area step did (``section``: None when its render
        failed); count every pass run and not yet counted, forgetting what it collected."""
        counters = self._counters
        if section is not None and section.outcome != "rendered":
            counters.area_reused += 1
        unsettled = areas.unsettled
        while unsettled:
            done = unsettled.popleft()
            counters.area_renders += 1
            counters.areas_collected += done.collected
            counters.area_items_reclaimed += done.reclaimed
            counters.area_items_promoted += done.promoted
            self.detach(areas, done.removed)

"""The ``ContextManager``: committed turns in, provider-native model inputs out.

Source: seed 004. The manager is an actor living on one event loop (asyncio or
trio, through anyio). Its synchronous methods (:meth:`ContextManager.accept_turn`,
:meth:`~ContextManager.record`, :meth:`~ContextManager.build`) validate first
and then change state in one step, so they are atomic with respect to other
tasks. :meth:`~ContextManager.prepare` is the only long operation: it waits for
a slot in the bounded pending queue, waits for the named turn's commit,
captures the history and the request's state once, and renders in a worker
thread through the Foundation's :class:`anyio.CapacityLimiter`.

A preparation is owned by the manager, not by its requester: it runs as a task
in the Foundation's task group and holds its slot until it is *settled*
(delivered, failed or discarded). When the requester is cancelled while the
preparation waits, the preparation is cancelled with it; when it is already
rendering, the worker thread is never abandoned mid-render: it finishes, its
result is discarded, and only then is the slot freed.

Context Areas (seed 000) are connected through
:meth:`ContextManager.attach_area` and :meth:`ContextManager.route`; see the
class docstring for the area section and its safe points.
"""

from __future__ import annotations

__all__ = ("ContextManager", "Invocation")

import math
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import msgspec

from turnloom.context.area import ContextAreaImplementation
from turnloom.context.coop import CoopContext
from turnloom.context.gateway import Gateway, GatewayType, NativeContent, get_gateway
from turnloom.context.history import (
    HistoryLimits,
    HistoryView,
    RenderedHistory,
    TurnHistory,
    check_batch_length,
    check_id,
)
from turnloom.context.message import Message, check_message
from turnloom.context.native import Context
from turnloom.context.pairing import OpenCallPolicy, complete_pairs
from turnloom.errors import (
    AreaCallbackError,
    DuplicateAreaError,
    DuplicateIdError,
    InputError,
    InvalidMessageError,
    InvalidTextError,
    ItemTooLargeError,
    OpenToolCallError,
    ProviderRuleError,
    QueueFullError,
    StateError,
    UnknownContextError,
    UnknownTurnError,
    excerpt,
)
from turnloom.runtime.errors import FoundationClosedError
from turnloom.runtime.schemas import (
    AreaPass,
    ContextPrepareRequest,
    ManagerStatistics,
    PreparedContext,
    TurnSnapshot,
)
from turnloom.runtime.state import (
    STATE_TOOL_NAME,
    check_contributions,
    is_state_message,
    state_call_id,
    state_messages,
)

LATENCY_BOUNDS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Upper bounds, in seconds, of the prepare-latency and render-time histograms."""

_encoder = msgspec.json.Encoder()


class _Histogram:
    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BOUNDS) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        index = len(LATENCY_BOUNDS)
        for i, bound in enumerate(LATENCY_BOUNDS):
            if seconds <= bound:
                index = i
                break
        self.counts[index] += 1
        self.sum += seconds

    def cumulative(self) -> tuple[int, ...]:
        total = 0
        out: list[int] = []
        for count in self.counts:
            total += count
            out.append(total)
        return tuple(out)


class _ContextState:
    __slots__ = ("areas", "history", "invocation", "last")

    def __init__(self, history: TurnHistory) -> None:
        self.history = history
        self.invocation: Invocation | None = None
        self.last: _Layout | None = None  # the last delivered prefix
        self.areas: _Areas | None = None  # created by the first attach_area or route


class _Areas:
    """One context's area section: a CoopContext over its own Context.

    Thread ownership: ``coop`` (and its Context) is touched only by a worker
    thread holding ``lock``. The event loop never touches it; it hands new
    areas and routed items over through the two deques (``append`` on the
    loop, ``popleft``/``appendleft`` in a worker: both atomic). ``attached``
    and ``open_calls`` are owned by the loop; ``rendered`` is written only
    by workers (under ``lock``) and ``delivered`` only by the loop; both
    only grow.
    """

    __slots__ = (
        "attached",
        "coop",
        "delivered",
        "lock",
        "open_calls",
        "pending_areas",
        "pending_items",
        "rendered",
    )

    def __init__(self, gateway: Gateway) -> None:
        self.coop = CoopContext(Context(gateway))
        self.lock = threading.Lock()
        self.pending_areas: deque[ContextAreaImplementation] = deque()
        self.pending_items: deque[NativeContent] = deque()
        # id -> area: attached and not yet known to be collected.
        self.attached: dict[int, ContextAreaImplementation] = {}
        self.open_calls: tuple[str, ...] = ()  # calls of routed items still unanswered
        self.rendered = 0  # area passes run
        self.delivered = 0  # the newest pass whose section reached a requester


class _AreaSection:
    """What the area step of one preparation produced (returned by the worker)."""

    __slots__ = ("collected", "generation", "items", "outcome", "promoted", "reclaimed", "removed")

    def __init__(
        self,
        items: tuple[NativeContent, ...],
        outcome: AreaPass,
        generation: int,
        removed: tuple[object, ...] = (),
        reclaimed: int = 0,
        promoted: int = 0,
    ) -> None:
        self.items = items
        self.outcome: AreaPass = outcome
        self.generation = generation
        self.removed = removed
        self.collected = len(removed)
        self.reclaimed = reclaimed
        self.promoted = promoted


def _area_section(areas: _Areas, run_pass: bool) -> _AreaSection:
    """The area step of a preparation, in a worker thread (see ContextManager)."""
    with areas.lock:
        coop = areas.coop
        context = coop.context
        if not run_pass or areas.delivered < areas.rendered:
            outcome: AreaPass = "reused_invocation" if not run_pass else "reused_undelivered"
            return _AreaSection(tuple(context.snapshot()), outcome, areas.rendered)
        while areas.pending_areas:
            area = areas.pending_areas.popleft()
            try:
                coop.register(area)
            except InputError as exc:
                # Checked at attach_area; only an area whose state members
                # changed since then gets here. It is dropped.
                raise AreaCallbackError(
                    f"Context Area {type(area).__qualname__} could not be registered: {exc}",
                    area=area,
                    phase="register",
                ) from exc
        taken: list[NativeContent] = []
        while areas.pending_items:
            taken.append(areas.pending_items.popleft())
        start = len(context)
        for item in taken:
            context.push_back(item)
        try:
            coop.render()
        except BaseException:
            # coop.render() restored the Context to ``start + taken``; hand
            # the routed items back, in order, ahead of any routed since.
            context.detach_tail(start)
            areas.pending_items.extendleft(reversed(taken))
            raise
        areas.rendered += 1
        report = coop.last_collection
        assert report is not None
        return _AreaSection(
            tuple(context.snapshot()),
            "rendered",
            areas.rendered,
            removed=report.removed,
            reclaimed=len(report.detached),
            promoted=len(report.promoted_items),
        )


class _Layout:
    """A delivered prefix and how to count the bytes of any leading part of it."""

    __slots__ = ("bytes", "extra_sizes", "items", "rendered")

    def __init__(
        self,
        items: tuple[NativeContent, ...],
        total: int,
        rendered: RenderedHistory,
        extra_sizes: tuple[int, ...],
    ) -> None:
        self.items = items
        self.bytes = total
        self.rendered = rendered
        self.extra_sizes = extra_sizes  # state pair + area section, after the history

    def bytes_before(self, count: int) -> int:
        """Serialized size of ``items[:count]``, in bytes."""
        history = len(self.rendered.items)
        if count <= history:
            return self.rendered.bytes_before(count)
        return self.rendered.bytes + sum(self.extra_sizes[: count - history])


class _Waiters:
    __slots__ = ("count", "event")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.count = 0


class _Preparation:
    __slots__ = ("done", "error", "request", "requested_at", "result", "scope", "wanted")

    def __init__(self, request: ContextPrepareRequest, requested_at: float) -> None:
        self.request = request
        self.requested_at = requested_at
        self.done = anyio.Event()
        self.scope: anyio.CancelScope | None = None
        self.wanted = True
        self.result: PreparedContext | None = None
        self.error: BaseException | None = None


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


def check_options(
    gateway: GatewayType | str | Gateway,
    max_pending_preparations: int,
    behavior_rules: str | None,
    open_calls: str,
    history_limits: HistoryLimits | None = None,
) -> Gateway:
    """Validate the manager's options; return the gateway instance.

    Raises:
        InputError: a bound is not a positive integer, ``history_limits`` is
            not a :class:`HistoryLimits`, an unknown gateway or ``open_calls``
            policy, or behaviour rules that are not valid text.
    """
    if history_limits is not None and not isinstance(history_limits, HistoryLimits):
        raise InputError(
            f"history_limits must be a HistoryLimits, not a {type(history_limits).__name__}."
        )
    if (
        not isinstance(max_pending_preparations, int)
        or isinstance(max_pending_preparations, bool)
        or max_pending_preparations < 1
    ):
        raise InputError(
            "max_pending_preparations must be a positive integer, not "
            f"{excerpt(max_pending_preparations)}."
        )
    if open_calls not in ("exclude", "cancel"):
        raise InputError(f"open_calls must be 'exclude' or 'cancel', not {excerpt(open_calls)}.")
    check_contributions((), behavior_rules, None)
    return gateway if isinstance(gateway, Gateway) else get_gateway(gateway)


def _common_prefix(new: tuple[Any, ...], old: tuple[Any, ...]) -> int:
    """Length of the longest common prefix; tuple comparison checks identity first.

    The common case (the old prefix is kept whole) is one C-speed comparison.
    Otherwise it gallops (1, 2, 4, ... items) before bisecting, so the cost
    follows the common prefix, not the whole input, when they part early
    (after an eviction).
    """
    limit = min(len(new), len(old))
    if new[:limit] == (old if limit == len(old) else old[:limit]):
        return limit
    lo, step = 0, 1
    while lo + step < limit and new[lo : lo + step] == old[lo : lo + step]:
        lo += step
        step *= 2
    hi = min(limit, lo + step) - 1
    while lo < hi:  # new[:lo] == old[:lo] holds throughout
        mid = (lo + hi + 1) // 2
        if new[lo:mid] == old[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class ContextManager:
    """Keeps each context's history and prepares provider-native model inputs.

    Created and owned by a :class:`~turnloom.runtime.Foundation`; reach it as
    ``foundation.manager``. All methods must be called from the Foundation's
    event loop.

    A prepared prefix is, in order: pinned instructions, earlier turns, the
    turn's input, the runtime-state pair (when there is state), then the
    context's *area section*.
    Send ``manager.gateway.request_body(prefix.items)`` (see
    :attr:`PreparedContext.items`).

    Context Areas (seed 000). Each context lazily owns one
    :class:`~turnloom.context.CoopContext` over its own
    :class:`~turnloom.context.Context`, created by its first
    :meth:`attach_area` or :meth:`route`: the area section. It is volatile
    per-turn content, so it goes after the durable history (DESIGN rule 3);
    it never enters history and is never evicted with it.

    * **Safe points.** Every preparation that renders is a safe point for its
      context's areas: in the worker thread, after the history is rendered,
      the manager appends the items routed since the last pass, runs
      ``coop.render()`` (collection, then one unfold pass) and appends the
      whole area section after the turn's input and its runtime-state pair. An area that fails
      (:class:`~turnloom.errors.AreaCallbackError`) or a routed tool call
      still waiting for its result (:class:`~turnloom.errors.OpenToolCallError`)
      fails the preparation; the CoopContext and its Context are as they were
      (routed items wait for the next pass), its slot is freed and history is
      unchanged. A failing area fails every pass until it recovers; remove
      the context to drop it.
    * **Threads.** A CoopContext is used by one thread at a time: each
      context's is guarded by a :class:`threading.Lock` taken only in worker
      threads, so two preparations of one context render their area passes
      one after the other (the second holds its worker token while it
      waits). The event loop never touches a CoopContext: ``attach_area``
      checks the area with the same checks as ``CoopContext.register`` and
      queues it, ``route`` checks and queues the item; the next pass enrols
      both.
    * **Model calls in flight.** No collection happens while an invocation of
      the context is in flight (seed 004). A preparation that captures its
      state while one is in flight does not wait for it (a host may prepare
      the next turn while the model still answers, or from inside its
      invocation block): it skips the pass and reuses the previous area
      section as it is (``area_pass == "reused_invocation"``); queued areas
      and routed items wait for the next pass.
    * **Undelivered sections.** A pass changes the areas (a
      :class:`~turnloom.areas.OneShotNotice` retires when it renders), so a
      section no requester received would be lost: when a preparation is
      cancelled or discarded after its pass ran, the next preparation reuses
      that section instead of running a pass (``"reused_undelivered"``), and
      the pass after that collects.
    * **Cost.** A pass costs what ``CoopContext.render()`` costs plus one
      copy and one JSON size count of the area section, which collection
      keeps short; the history part stays incremental.

    Args:
        task_group: the Foundation's task group; preparations run in it.
        limiter: the Foundation's worker-thread limiter.
        gateway: the provider to render for.
        max_pending_preparations: the bound on preparations admitted and not
            yet settled (waiting for their turn or rendering). Default 16.
        history_limits: the bounds of each context's history.
        behavior_rules: application behaviour rules carried in every turn's
            runtime-state pair when a request gives none. Data, never an
            instruction.
        open_calls: what a prepared input does with a tool call left without
            a result: ``"exclude"`` it (default, seed 004) or ``"cancel"`` it with
            an explicit error result.

    Raises:
        InputError: a bound is not a positive integer, ``history_limits`` is
            not a :class:`HistoryLimits`, an unknown gateway, or an unknown
            ``open_calls`` policy.
    """

    def __init__(
        self,
        *,
        task_group: anyio.abc.TaskGroup,
        limiter: anyio.CapacityLimiter,
        gateway: GatewayType | str | Gateway = GatewayType.openai_chat,
        max_pending_preparations: int = 16,
        history_limits: HistoryLimits | None = None,
        behavior_rules: str | None = None,
        open_calls: OpenCallPolicy = "exclude",
    ) -> None:
        self._gateway = check_options(
            gateway, max_pending_preparations, behavior_rules, open_calls, history_limits
        )
        self._task_group = task_group
        self._limiter = limiter
        self._capacity = max_pending_preparations
        self._slots = anyio.Semaphore(max_pending_preparations)
        self._limits = history_limits if history_limits is not None else HistoryLimits()
        self._behavior_rules = behavior_rules
        self._open_calls: OpenCallPolicy = open_calls
        self._contexts: dict[str, _ContextState] = {}
        self._waiters: dict[str, _Waiters] = {}
        self._preparations: set[_Preparation] = set()
        # id -> prefix, for every prefix prepare returned that is still alive:
        # build continues only these (O(1), no hashing of the items).
        self._issued: weakref.WeakValueDictionary[int, PreparedContext] = (
            weakref.WeakValueDictionary()
        )
        self._settled = anyio.Event()
        self._settled.set()
        self._closed = False
        self._invocations = 0
        # Counters kept across contexts (histories that were removed included).
        self._prepared = 0
        self._failed = 0
        self._discarded = 0
        self._rejected = 0
        self._removed_evicted_turns = 0
        self._removed_evicted_items = 0
        self._removed_late = 0
        self._removed_blank = 0
        self._prefix_bytes = 0
        self._prefix_reused = 0
        self._latency = _Histogram()
        self._render = _Histogram()
        self._areas_registered = 0
        self._area_renders = 0
        self._area_reused = 0
        self._areas_collected = 0
        self._area_items_reclaimed = 0
        self._area_items_promoted = 0

    # -- properties --------------------------------------------------------

    @property
    def gateway(self) -> Gateway:
        """The gateway prepared inputs are rendered with."""
        return self._gateway

    @property
    def capacity(self) -> int:
        """The bound on pending preparations."""
        return self._capacity

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
        return tuple(self._contexts)

    def history(self, context_id: str) -> HistoryView:
        """An immutable view of one context's history (O(1)).

        Raises:
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: ``context_id`` is not a non-empty str of at
                most 256 characters.
            UnknownContextError: no turn was ever committed to ``context_id``.
        """
        self._check_open()
        return self._context(context_id).history.view()

    def _context(self, context_id: str) -> _ContextState:
        state = self._contexts.get(context_id) if isinstance(context_id, str) else None
        if state is None:
            check_id(context_id, "context id")
            raise UnknownContextError(f"No turn was committed to context {excerpt(context_id)}.")
        return state

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
            DuplicateIdError: the turn id was already committed to the context.
            ProviderRuleError: the gateway cannot render a message (for example
                tool call arguments that are not a JSON object, for Anthropic
                and Gemini); nothing was committed.
            OutOfOrderTurnError: the snapshot's sequence is not newer than the
                context's previous one.
        """
        self._check_open()
        if not isinstance(snapshot, TurnSnapshot):
            raise InvalidMessageError(
                f"accept_turn takes a TurnSnapshot, not a {type(snapshot).__name__}."
            )
        context_id = check_id(snapshot.context_id, "context id")
        state = self._contexts.get(context_id)
        history = state.history if state is not None else TurnHistory(self._limits)
        for what, value in (("input", snapshot.input), ("instructions", snapshot.instructions)):
            if value is not None and not isinstance(value, tuple | list):
                raise InvalidMessageError(
                    f"Turn {excerpt(snapshot.turn_id)} {what} must be a tuple of Messages.",
                    field=what,
                )
        check_id(snapshot.turn_id, "turn id")
        rendered = self._check_renderable(
            history, snapshot.input, f"Turn {excerpt(snapshot.turn_id)} input"
        )
        if snapshot.input is not None:
            self._reject_state(
                snapshot.input,
                context_id,
                snapshot.turn_id,
                f"Turn {excerpt(snapshot.turn_id)} input",
            )
        if not rendered:
            raise InvalidMessageError(
                f"Turn {excerpt(snapshot.turn_id)} of context {excerpt(context_id)} has no "
                f"input that "
                "renders to content (empty, or only blank text); every provider rejects "
                "a model input without it.",
                field="input",
            )
        self._check_renderable(
            history,
            snapshot.instructions,
            f"Turn {excerpt(snapshot.turn_id)} instructions",
            pinned=True,
        )
        history.commit(
            snapshot.turn_id,
            snapshot.input,
            instructions=snapshot.instructions,
            sequence=snapshot.sequence,
        )
        if state is None:
            state = self._contexts[context_id] = _ContextState(history)
        self._evict(state)
        waiters = self._waiters.pop(context_id, None)
        if waiters is not None:
            waiters.event.set()

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
            ProviderRuleError: the gateway cannot render a message (for example
                tool call arguments that are not a JSON object, for Anthropic
                and Gemini); nothing was recorded.
        """
        self._check_open()
        state = self._context(context_id)
        check_id(turn_id, "turn id")
        if isinstance(outputs, Message) or not isinstance(outputs, Sequence):
            raise InvalidMessageError("record takes a sequence of Messages, oldest first.")
        self._check_renderable(
            state.history, outputs, f"Output of turn {excerpt(turn_id)}", turn_id=turn_id
        )
        self._reject_state(outputs, context_id, turn_id, f"Output of turn {excerpt(turn_id)}")
        recorded = state.history.record(turn_id, outputs)
        self._evict(state)
        return recorded

    def _reject_state(
        self, messages: Sequence[Message], context_id: str, turn_id: str, where: str
    ) -> None:
        """Runtime state never enters history: reject messages carrying any turn's state pair."""
        call_id = state_call_id(context_id, turn_id)
        for i, message in enumerate(messages):
            if isinstance(message, Message) and is_state_message(message, call_id):
                raise InvalidMessageError(
                    f"{where}[{i}] carries a runtime-state call or result (tool "
                    f"{excerpt(STATE_TOOL_NAME)}, or a reserved 'tlrs_' call id); runtime state "
                    "never enters history."
                )

    def _check_renderable(
        self,
        history: TurnHistory,
        messages: Sequence[Message] | None,
        where: str,
        *,
        turn_id: str | None = None,
        pinned: bool = False,
    ) -> int:
        """Check the batch (its limits first), then render each message once at the door.

        Provider rules fail here, not at prepare.

        A message the gateway cannot carry (for example tool call arguments
        that are not a JSON object, for Anthropic and Gemini) would otherwise
        be committed and then fail every later prepare of its context.

        Returns:
            how many native items the messages render to.
        """
        if not messages:
            return 0
        history.check_batch(messages, where, turn_id=turn_id, pinned=pinned)
        gateway = self._gateway
        rendered = 0
        for i, message in enumerate(messages):
            label = f"{where}[{i}]"
            try:
                rendered += len(gateway.render(message))
            except ProviderRuleError as exc:
                raise ProviderRuleError(f"{label}: {exc}", exc.violations) from exc
        return rendered

    def remove_context(self, context_id: str) -> None:
        """Forget a context and its whole history (its counters are kept).

        Raises:
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: a malformed context id.
            UnknownContextError: no such context.
            StateError: a model call is in flight for the context.
        """
        self._check_open()
        state = self._context(context_id)
        if state.invocation is not None:
            raise StateError(
                f"Context {excerpt(context_id)} has a model call in flight; remove it after "
                "the invocation ends."
            )
        self._fold(state)
        del self._contexts[context_id]

    def _fold(self, state: _ContextState) -> None:
        stats = state.history.statistics()
        self._removed_evicted_turns += stats.evicted_turns
        self._removed_evicted_items += stats.evicted_items
        self._removed_late += stats.dropped_late_outputs
        self._removed_blank += stats.dropped_blank_outputs

    def _evict(self, state: _ContextState) -> None:
        # Safe point only: never while a model call is in flight (seed 000/004).
        if state.invocation is None and state.history.over_limits():
            state.history.evict()

    # -- areas -------------------------------------------------------------------

    def _areas(self, state: _ContextState) -> _Areas:
        areas = state.areas
        if areas is None:
            areas = state.areas = _Areas(self._gateway)
        return areas

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
        state = self._context(context_id)
        # A throwaway CoopContext runs the exact checks of ``register`` without
        # touching the context's own, which a worker may be rendering.
        CoopContext(Context(self._gateway)).register(area)
        areas = state.areas
        if areas is not None and areas.attached.get(id(area)) is area:
            raise DuplicateAreaError(
                f"This {type(area).__qualname__} area is already attached to context "
                f"{excerpt(context_id)}."
            )
        areas = self._areas(state)
        areas.attached[id(area)] = area
        areas.pending_areas.append(area)
        self._areas_registered += 1

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
        starts at or before it, the item goes with it (seed 000: model
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
        state = self._context(context_id)
        if not isinstance(item, dict):
            raise InvalidMessageError(
                f"An item routed to context {excerpt(context_id)} must be a native item (dict), "
                f"not a {type(item).__name__}."
            )
        try:
            encoded = _encoder.encode(item)
        except UnicodeEncodeError as exc:
            raise InvalidTextError(
                f"The item routed to context {excerpt(context_id)} holds text that is not valid "
                f"UTF-8 (a lone surrogate): {exc}."
            ) from exc
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise InvalidMessageError(
                f"The item routed to context {excerpt(context_id)} is not JSON data: "
                f"{excerpt(str(exc))}."
            ) from None
        cap = self._limits.max_item_bytes
        if len(encoded) > cap:
            raise ItemTooLargeError(
                f"The item routed to context {excerpt(context_id)} is {len(encoded)} bytes, "
                f"over the "
                f"per-item cap of {cap} bytes.",
                size=len(encoded),
                limit=cap,
            )
        copy: NativeContent = msgspec.json.decode(encoded)
        message = self._gateway.parse(copy)
        check_message(message, where=f"item routed to context {excerpt(context_id)}")
        if is_state_message(message):
            raise InvalidMessageError(
                f"The item routed to context {excerpt(context_id)} carries a runtime-state call or "
                f"result (tool {excerpt(STATE_TOOL_NAME)}, or a reserved 'tlrs_' call id); the "
                "runtime supplies that pair itself."
            )
        areas = state.areas
        open_calls = areas.open_calls if areas is not None else ()
        results = message.tool_results
        if open_calls:
            if not results or message.tool_calls:
                raise InvalidMessageError(
                    f"Tool call(s) {', '.join(map(repr, open_calls))} routed to context "
                    f"{excerpt(context_id)} have no result yet; route their results before any "
                    "other item."
                )
            answered = {r.call_id for r in results}
            unmatched = sum(1 for r in results if r.call_id not in open_calls)
            open_calls = tuple(c for c in open_calls if c not in answered)[unmatched:]
        elif results:
            raise InvalidMessageError(
                f"The item routed to context {excerpt(context_id)} holds tool result(s) "
                f"{', '.join(repr(r.call_id) for r in results)} that answer no routed call."
            )
        if message.tool_calls:
            open_calls = tuple(c.call_id for c in message.tool_calls)
        areas = self._areas(state)
        areas.open_calls = open_calls
        areas.pending_items.append(copy)

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
        state = self._context(context_id)
        check_id(turn_id, "turn id")
        if not state.history.has_turn(turn_id):
            raise UnknownTurnError(
                f"Turn {excerpt(turn_id)} is not held by context {excerpt(context_id)} "
                f"(never committed "
                "or evicted)."
            )
        if state.invocation is not None:
            raise StateError(
                f"Context {excerpt(context_id)} already has a model call in flight for turn "
                f"{excerpt(state.invocation.turn_id)}."
            )
        invocation = state.invocation = Invocation(self, context_id, turn_id)
        self._invocations += 1
        try:
            yield invocation
        finally:
            state.invocation = None
            self._invocations -= 1
            if not self._closed:
                self._evict(state)

    # -- preparation -----------------------------------------------------------

    def _check_request(self, request: ContextPrepareRequest) -> ContextPrepareRequest:
        """Validate a request; return it with its contributions frozen in a tuple.

        The copy is what the preparation captures, so a list the caller
        changes after the call can neither bypass validation nor change state.
        """
        if not isinstance(request, ContextPrepareRequest):
            raise InvalidMessageError(
                f"prepare takes a ContextPrepareRequest, not a {type(request).__name__}."
            )
        check_id(request.context_id, "context id")
        check_id(request.turn_id, "turn id")
        contributions = request.contributions
        if type(contributions) is not tuple and isinstance(contributions, list):
            contributions = tuple(contributions)
        check_contributions(contributions, request.behavior_rules, request.loop_budget)
        # The state result is one item under the per-item cap. Its text is at
        # least as long as the texts it carries (UTF-8 bytes >= characters), so
        # this bound fails early without encoding on the event loop; the exact
        # size is checked in the worker.
        cap = self._limits.max_item_bytes
        carried = sum(len(c.name) + len(c.content) for c in contributions)
        carried += len(request.behavior_rules or "")
        if carried > cap:
            raise ItemTooLargeError(
                f"The runtime state of turn {excerpt(request.turn_id)} carries at least {carried} "
                f"bytes, over the per-item cap of {cap} bytes.",
                size=carried,
                limit=cap,
            )
        if contributions is request.contributions:
            return request
        return msgspec.structs.replace(request, contributions=contributions)

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

        Raises:
            FoundationClosedError: the Foundation is closing or closed, or closed
                while the preparation waited.
            InvalidMessageError, InvalidTextError, DuplicateIdError: a malformed
                request (ids, contributions that are not a tuple or list,
                contribution names or text, loop budget); no slot was taken.
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
        request = self._check_request(request)
        requested_at = anyio.current_time()
        await self._slots.acquire()
        return await self._admit(request, requested_at)

    async def prepare_nowait(self, request: ContextPrepareRequest) -> PreparedContext:
        """Like :meth:`prepare`, but refuse at once when every slot is taken.

        Raises:
            QueueFullError: all ``capacity`` slots are taken; nothing was admitted.
            FoundationClosedError, InvalidMessageError, InvalidTextError,
            DuplicateIdError, ItemTooLargeError, UnknownTurnError, ProviderRuleError,
            AreaCallbackError, OpenToolCallError: as :meth:`prepare`.

        Cancellation:
            As :meth:`prepare` after admission.
        """
        self._check_open()
        request = self._check_request(request)
        requested_at = anyio.current_time()
        try:
            self._slots.acquire_nowait()
        except anyio.WouldBlock:
            self._rejected += 1
            raise QueueFullError(
                f"All {self._capacity} preparation slots are taken; preparation of turn "
                f"{excerpt(request.turn_id)} of context {excerpt(request.context_id)} was refused.",
                capacity=self._capacity,
            ) from None
        return await self._admit(request, requested_at)

    async def _admit(self, request: ContextPrepareRequest, requested_at: float) -> PreparedContext:
        preparation = _Preparation(request, requested_at)
        try:
            if self._closed:
                raise FoundationClosedError(
                    "The Foundation closed while the preparation waited for a slot."
                )
            self._preparations.add(preparation)
            self._settled = anyio.Event() if self._settled.is_set() else self._settled
            self._task_group.start_soon(self._run, preparation)
        except BaseException:
            self._preparations.discard(preparation)
            self._slots.release()
            if not self._preparations:
                self._settled.set()
            raise
        try:
            await preparation.done.wait()
        except BaseException:
            # The requester is gone: the preparation is discarded, never abandoned.
            preparation.wanted = False
            if preparation.scope is not None:
                preparation.scope.cancel()
            raise
        if preparation.error is not None:
            raise preparation.error
        assert preparation.result is not None
        return preparation.result

    async def _wait_for_turn(self, context_id: str, turn_id: str) -> _ContextState:
        while True:
            if self._closed:
                raise FoundationClosedError(
                    f"The Foundation closed while waiting for turn {excerpt(turn_id)} of context "
                    f"{excerpt(context_id)}."
                )
            state = self._contexts.get(context_id)
            if state is not None:
                if state.history.has_turn(turn_id):
                    return state
                if state.history.was_evicted(turn_id):
                    raise UnknownTurnError(
                        f"Turn {excerpt(turn_id)} of context {excerpt(context_id)} was "
                        f"evicted before it "
                        "could be prepared."
                    )
            waiters = self._waiters.get(context_id)
            if waiters is None:
                waiters = self._waiters[context_id] = _Waiters()
            waiters.count += 1
            try:
                await waiters.event.wait()
            finally:
                waiters.count -= 1
                if waiters.count == 0 and self._waiters.get(context_id) is waiters:
                    del self._waiters[context_id]

    async def _run(self, preparation: _Preparation) -> None:
        request = preparation.request
        areas: _Areas | None = None
        try:
            with anyio.CancelScope() as scope:
                preparation.scope = scope
                if not preparation.wanted:
                    scope.cancel()
                state = await self._wait_for_turn(request.context_id, request.turn_id)
                # Capture once: an immutable view and the request's state.
                view = state.history.view()
                behavior_rules = (
                    request.behavior_rules
                    if request.behavior_rules is not None
                    else self._behavior_rules
                )
                last = state.last
                areas = state.areas
                # No collection while a model call of the context is in flight.
                run_pass = state.invocation is None
                started = anyio.current_time()
                prepared, layout, section = await anyio.to_thread.run_sync(
                    self._render_in_thread,
                    view,
                    request,
                    behavior_rules,
                    last,
                    started - preparation.requested_at,
                    areas,
                    run_pass,
                    limiter=self._limiter,
                )
                if areas is not None and section is not None:
                    # The area section changed whether or not the result is wanted.
                    self._count_section(areas, section)
                # Cancelled while the thread ran (the thread was not
                # abandoned): the result is discarded.
                if not scope.cancel_called:
                    if preparation.wanted:
                        if areas is not None and section is not None:
                            areas.delivered = max(areas.delivered, section.generation)
                        self._prefix_bytes += last.bytes if last is not None else 0
                        state.last = layout
                        self._prefix_reused += prepared.reused_bytes
                        self._latency.observe(anyio.current_time() - preparation.requested_at)
                        self._render.observe(prepared.render_seconds)
                    self._issued[id(prepared)] = prepared
                    preparation.result = prepared
        except Exception as exc:
            if isinstance(exc, AreaCallbackError) and exc.phase == "register" and areas is not None:
                areas.attached.pop(id(exc.area), None)  # the worker dropped it
            preparation.error = exc
        finally:
            if preparation.result is None and preparation.error is None:
                # Cancelled by aclose, or by a cancellation of the scope the
                # Foundation was opened in: a requester elsewhere still gets
                # the typed error.
                preparation.error = FoundationClosedError(
                    f"The preparation of turn {excerpt(request.turn_id)} of context "
                    f"{excerpt(request.context_id)} was cancelled while the Foundation closed."
                )
            if not preparation.wanted:
                self._discarded += 1
            elif preparation.result is not None:
                self._prepared += 1
            else:
                self._failed += 1
            self._preparations.discard(preparation)
            self._slots.release()
            if not self._preparations:
                self._settled.set()
            preparation.done.set()

    def _count_section(self, areas: _Areas, section: _AreaSection) -> None:
        if section.outcome != "rendered":
            self._area_reused += 1
            return
        self._area_renders += 1
        self._areas_collected += section.collected
        self._area_items_reclaimed += section.reclaimed
        self._area_items_promoted += section.promoted
        for area in section.removed:
            if areas.attached.get(id(area)) is area:
                del areas.attached[id(area)]

    def _render_in_thread(
        self,
        view: HistoryView,
        request: ContextPrepareRequest,
        behavior_rules: str | None,
        last: _Layout | None,
        queued: float,
        areas: _Areas | None,
        run_pass: bool,
    ) -> tuple[PreparedContext, _Layout, _AreaSection | None]:
        begin = time.perf_counter()
        gateway = self._gateway
        # The request was frozen at the door; its JSON encoding is CPU work.
        pair = state_messages(
            request.context_id,
            request.turn_id,
            contributions=request.contributions,
            behavior_rules=behavior_rules,
            loop_budget=request.loop_budget,
        )
        rendered = view.render(gateway, request.turn_id, open_calls=self._open_calls)
        items = rendered.items
        total = rendered.bytes
        call_id: str | None = None
        reserved: list[str] = []
        extra: tuple[NativeContent, ...] = ()
        section: _AreaSection | None = None
        outcome: AreaPass = "none"
        if pair is not None:
            # Issue 5: the pair sits directly after the turn's input; the area
            # section follows it.
            call_id = state_call_id(request.context_id, request.turn_id)
            reserved.append(call_id)
            extra = tuple(gateway.render(pair[0])) + tuple(gateway.render(pair[1]))
            cap = self._limits.max_item_bytes
            size = len(_encoder.encode(extra[-1]))
            if size > cap:
                raise ItemTooLargeError(
                    f"The runtime-state result of turn {excerpt(request.turn_id)} of context "
                    f"{excerpt(request.context_id)} is {size} bytes, over the per-item cap of "
                    f"{cap} bytes.",
                    size=size,
                    limit=cap,
                )
        pair_items = len(extra)
        if areas is not None:
            try:
                section = _area_section(areas, run_pass)
            except OpenToolCallError as exc:
                raise OpenToolCallError(
                    f"The area section of context {excerpt(request.context_id)} ends with routed "
                    f"tool call(s) {', '.join(map(repr, exc.call_ids))} whose result has not "
                    f"been routed; turn {excerpt(request.turn_id)} cannot be prepared until it is.",
                    call_ids=exc.call_ids,
                ) from exc
            extra += section.items
            outcome = section.outcome
        extra_sizes = tuple(len(_encoder.encode(item)) for item in extra)
        if extra:
            items += extra
            total += sum(extra_sizes)
        reserved.extend(m.id for m in view.turn_input(request.turn_id) if m.id is not None)
        reused = 0
        if last is not None:
            reused = last.bytes_before(_common_prefix(items, last.items))
        prepared = PreparedContext(
            context_id=request.context_id,
            turn_id=request.turn_id,
            gateway=gateway.type,
            items=items,
            item_count=len(items),
            bytes=total,
            tokens=math.ceil(total / 4),
            turn_start=rendered.turn_start,
            area_start=len(rendered.items) + pair_items,
            area_items=len(section.items) if section is not None else 0,
            area_pass=outcome,
            state_call_id=call_id,
            reserved_ids=tuple(reserved),
            reused_bytes=reused,
            queued_seconds=queued,
            render_seconds=time.perf_counter() - begin,
        )
        return prepared, _Layout(items, total, rendered, extra_sizes), section

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
        a result are handled by the ``open_calls`` policy. Cost: O(continuation).

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
        """
        self._check_open()
        if not isinstance(prefix, PreparedContext):
            raise InvalidMessageError(
                f"build takes a PreparedContext prefix, not a {type(prefix).__name__}."
            )
        if self._issued.get(id(prefix)) is not prefix:
            raise InvalidMessageError(
                f"The prefix of turn {excerpt(prefix.turn_id)} of context "
                f"{excerpt(prefix.context_id)} was "
                "not prepared by this manager (built by hand, copied or changed, or "
                "prepared by another Foundation); build only continues prefixes that this "
                "manager's prepare returned."
            )
        if isinstance(continuation, Message) or not isinstance(continuation, Sequence):
            raise InvalidMessageError(
                "build takes a sequence of continuation Messages, oldest first."
            )
        check_batch_length(len(continuation), self._limits, "The continuation")
        reserved = set(prefix.reserved_ids)
        for i, message in enumerate(continuation):
            check_message(message, where=f"continuation[{i}]")
            if is_state_message(message, prefix.state_call_id):
                raise InvalidMessageError(
                    f"continuation[{i}] carries a runtime-state call or result; the turn's "
                    "pair is already in the prefix and is never repeated."
                )
            if message.id is not None:
                if message.id in reserved:
                    raise DuplicateIdError(
                        f"continuation[{i}] repeats id {excerpt(message.id)} of the "
                        f"prefix's turn or "
                        "of an earlier continuation message."
                    )
                reserved.add(message.id)
        gateway = self._gateway
        items: list[NativeContent] = list(prefix.items)
        for message in complete_pairs(continuation, open_calls=self._open_calls):
            items.extend(gateway.render(message))
        return tuple(items)

    # -- lifecycle (driven by the Foundation) ---------------------------------------

    def _stop_intake(self) -> None:
        self._closed = True
        for waiters in self._waiters.values():
            waiters.event.set()
        self._waiters.clear()

    async def _wait_settled(self) -> None:
        while self._preparations:
            await self._settled.wait()

    def _cancel_pending(self) -> None:
        for preparation in tuple(self._preparations):
            if preparation.scope is not None:
                preparation.scope.cancel()

    def _release(self) -> None:
        self._closed = True
        for state in self._contexts.values():
            self._fold(state)
        self._contexts.clear()

    # -- statistics --------------------------------------------------------------------

    def statistics(self) -> ManagerStatistics:
        """A frozen snapshot of the manager's counters (O(contexts)).

        Safe to call from another thread (a metrics scrape): it only reads
        counters, each read atomically; the snapshot may mix values from two
        adjacent moments.
        """
        turns = items = total = 0
        evicted_turns = self._removed_evicted_turns
        evicted_items = self._removed_evicted_items
        late = self._removed_late
        blank = self._removed_blank
        # tuple() copies at C speed under the GIL, so a scrape from another
        # thread never sees the dict change size mid-iteration.
        attached = 0
        for state in tuple(self._contexts.values()):
            if state.areas is not None:
                attached += len(state.areas.attached)
            stats = state.history.statistics()
            turns += stats.turns
            items += stats.items
            total += stats.bytes
            evicted_turns += stats.evicted_turns
            evicted_items += stats.evicted_items
            late += stats.dropped_late_outputs
            blank += stats.dropped_blank_outputs
        slot_stats = self._slots.statistics()
        return ManagerStatistics(
            closed=self._closed,
            contexts=len(self._contexts),
            capacity=self._capacity,
            pending=len(self._preparations),
            waiting_for_slot=slot_stats.tasks_waiting,
            invocations=self._invocations,
            history_turns=turns,
            history_items=items,
            history_bytes=total,
            prepared_total=self._prepared,
            failed_total=self._failed,
            discarded_total=self._discarded,
            rejected_total=self._rejected,
            evicted_turns_total=evicted_turns,
            evicted_items_total=evicted_items,
            dropped_late_outputs_total=late,
            dropped_blank_outputs_total=blank,
            prefix_bytes_total=self._prefix_bytes,
            prefix_reused_bytes_total=self._prefix_reused,
            latency_bounds=LATENCY_BOUNDS,
            prepare_latency_counts=self._latency.cumulative(),
            prepare_latency_sum=self._latency.sum,
            render_counts=self._render.cumulative(),
            render_sum=self._render.sum,
            areas_attached=attached,
            areas_registered_total=self._areas_registered,
            area_renders_total=self._area_renders,
            area_passes_reused_total=self._area_reused,
            areas_collected_total=self._areas_collected,
            area_items_reclaimed_total=self._area_items_reclaimed,
            area_items_promoted_total=self._area_items_promoted,
        )

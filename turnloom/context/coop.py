"""``CoopContext``: cooperating Context Areas over one Context, and the Collector.

A :class:`CoopContext` wraps one :class:`~turnloom.context.Context`. Areas are
registered in order; a *cursor* points at one of them. Each
:meth:`CoopContext.render` call is a safe point between model invocations and
does two things, in this order:

1. **Collection.** Every area's ``life_state`` is read. The Collector
   (:func:`plan_collection`) groups the EffectRanges of the areas that have
   rendered into connected components of overlapping closed intervals,
   starts from the component reaching furthest toward the Context tail, and
   selects the longest run of tail components in which *every* area is
   retired. A retained area anywhere in a component blocks it and every
   component before it (the Context prefix stays append-only). Retired areas
   that never rendered are selected too. Every selected area's ``promote()``
   runs, then every ``gc_prologue()``; then the tail from the run's
   ``earliest`` index is detached (model outputs inside and after it too), the
   promoted messages are appended through the gateway, the areas are removed
   and the cursor is repaired.
2. **One unfold pass** from the cursor, over the registration order and
   wrapping around, visiting each area at most once. A retired area is
   skipped. A retained area that has an EffectRange first ``observe()``\\s a
   read-only snapshot of exactly that range; if it retires there, its
   ``render()`` is skipped. Otherwise its ``render()`` messages are appended
   with :meth:`Context.emplace_message`; a non-empty render creates the
   EffectRange (fixing ``earliest``) or moves its ``latest``. Then the area's
   ``flow_state`` decides: ``exclusive`` keeps the cursor on it and ends the
   pass, ``yielded`` moves the cursor on.

Decisions beyond the area contract:

* **Register validation.** :meth:`CoopContext.register` rejects an object
  lacking protocol members (:class:`~turnloom.errors.InvalidAreaError` with
  ``missing``), an unhashable object (same class), and a second registration
  of the same instance (:class:`~turnloom.errors.DuplicateAreaError`), before
  anything changes. Areas are told apart by identity.
* **Atomicity.** If any area member raises (or returns a value of the wrong
  type), the CoopContext and the Context are restored to exactly their state
  before that ``render()`` call and :class:`~turnloom.errors.AreaCallbackError`
  is raised naming the area and the phase, with the original exception as its
  ``__cause__``. What areas did to their own state, and ``gc_prologue()``
  notifications already delivered, cannot be undone by turnloom; instead the
  CoopContext remembers them, and the retry (which selects those areas again)
  reuses their promoted messages without calling ``promote()`` again and
  skips their ``gc_prologue()``.
* **Open tool calls.** Nothing may be placed between a model's tool call and
  its result (Source: OpenAI Chat ``tool`` messages follow their
  ``tool_calls`` message; Anthropic ``tool_result`` blocks open the next user
  turn; Gemini's function-response turn follows the call turn). When the
  Context ends with a call whose result has not been pushed yet,
  ``render()`` raises :class:`~turnloom.errors.OpenToolCallError` and changes
  nothing: the caller pushes the result and renders again, so an area's
  output always lands after the whole call group. An area (or a promotion)
  whose own messages leave a call open, or hold a tool result that does not
  answer a call of the nearest preceding call group among them, fails as an
  :class:`AreaCallbackError`.
* **Empty renders.** A render counts as non-empty when it appended at least
  one native item; messages that render to nothing (whitespace-only text)
  create no EffectRange, so a range always points at existing items.
* **Retirement is sticky.** Once a CoopContext has read ``retired``, it treats
  the area as retired even if the property later says otherwise. An area
  whose ``promote()`` result was kept by a collection that a later failure
  rolled back counts as retired too, whatever it says now.
* **Removal callbacks.** Every area removed from a CoopContext, including a
  retired area that never rendered, has ``promote()`` and then
  ``gc_prologue()`` succeed exactly once (a call that raised, or whose
  promotion was rejected, is made again at the next collection). Every
  promotion is validated, rendered through the gateway and checked for open
  tool calls and for results without their call before the first
  ``gc_prologue()``, so a rejected promotion delivers no final notification.
  Promoted messages are appended in the order of the areas' ``earliest``
  index; areas without a range follow in registration order.

Ownership: a CoopContext and its Context are used by one thread at a time
(any thread, for example a worker thread of the runtime, but never two at
once). Nothing here locks. A call made from inside an area callback (a
re-entrant ``render()`` or ``register()``) raises
:class:`~turnloom.errors.StateError`. Only the Collector removes Context
items: ``render()`` raises :class:`~turnloom.errors.StateError` when the
Context holds fewer items than after the previous successful render (one
CoopContext per Context).

Cost: a ``render()`` reads every area's ``life_state`` and plans collection in
O(n) for n registered areas (the ranges are kept sorted by ``earliest``), plus
the work of the areas it visits; collecting k areas costs O(n + k + detached
items). See ``scripts/bench_collector.py``.
"""

from __future__ import annotations

__all__ = (
    "CollectionPlan",
    "CollectionReport",
    "CoopContext",
    "CoopStatistics",
    "plan_collection",
)

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, overload

import msgspec

from turnloom.context.area import (
    AreaFlowState,
    AreaLifeState,
    ContextAreaImplementation,
    EffectRange,
)
from turnloom.context.gateway import Gateway, NativeContent
from turnloom.context.message import Message, Role, admit_message
from turnloom.context.native import Context
from turnloom.context.pairing import CallTracker
from turnloom.errors import (
    AreaCallbackError,
    DuplicateAreaError,
    InputError,
    InvalidAreaError,
    InvalidMessageError,
    ItemTooLargeError,
    OpenToolCallError,
    StateError,
    TurnloomError,
    UnknownAreaError,
    excerpt,
    not_a_message,
    type_name,
    what_type,
)

_T = TypeVar("_T")

_encoder = msgspec.json.Encoder()

_STATE_MEMBERS = ("life_state", "flow_state")
_METHOD_MEMBERS = ("observe", "render", "promote", "gc_prologue")


# -- the Collector (pure) --------------------------------------------------


class CollectionPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What one collection reclaims, as planned by :func:`plan_collection`.

    Attributes:
        start: the Context index from which the tail is detached (the
            ``earliest`` of the run's first component), or ``None`` when no
            component is reclaimable.
        collected: indices into the planned ranges of every reclaimed area,
            ordered by ``earliest`` (ties by input index).
        components: how many connected components the run spans.
    """

    start: int | None
    collected: tuple[int, ...]
    components: int


_NOTHING = CollectionPlan(start=None, collected=(), components=0)


def plan_collection(ranges: Sequence[EffectRange], retired: Sequence[bool]) -> CollectionPlan:
    """Plan which areas one collection reclaims.

    The ranges are closed intervals; two ranges that share an index (touching
    ends included) overlap, and overlap links areas into connected
    components. The component reaching furthest toward the tail comes first;
    the run extends backward component by component while every area of the
    component is retired, and stops at the first component holding a retained
    area.

    Args:
        ranges: the EffectRange of each area that has rendered, in any order.
            Already sorted by ``earliest`` costs O(n); otherwise O(n log n).
        retired: for each range, whether its area is retired.

    Returns:
        the plan; ``start`` is ``None`` when nothing is reclaimable.

    Raises:
        InputError: an argument is not a sequence, the two sequences differ
            in length, an entry is not an EffectRange, or a range's ends are
            not integers with ``0 <= earliest <= latest``.
    """
    if not isinstance(ranges, Sequence) or not isinstance(retired, Sequence):
        raise InputError(
            "plan_collection takes sequences of EffectRange and of bool, not "
            f"{what_type(ranges)} and {what_type(retired)}."
        )
    n = len(ranges)
    if len(retired) != n:
        raise InputError(
            f"plan_collection got {n} ranges but {len(retired)} retired flags; "
            "they must pair one to one."
        )
    if n == 0:
        return _NOTHING
    for i, r in enumerate(ranges):
        if not isinstance(r, EffectRange):
            raise InputError(f"Range {i} is {what_type(r)}, not an EffectRange.")
        if (
            type(r.earliest) is not int
            or type(r.latest) is not int
            or r.earliest < 0
            or r.latest < r.earliest
        ):
            raise InputError(
                f"EffectRange {i} is [{excerpt(r.earliest)}, {excerpt(r.latest)}]; a range needs "
                "integers 0 <= earliest <= latest."
            )
    earliest = [r.earliest for r in ranges]
    order = sorted(range(n), key=earliest.__getitem__)
    # Merge in ascending ``earliest``: a range starts a new component when it
    # begins after every index the current component covers.
    starts: list[int] = []  # position in ``order`` where each component begins
    reclaimable: list[bool] = []
    hi = -1
    for pos, i in enumerate(order):
        r = ranges[i]
        if not starts or r.earliest > hi:
            starts.append(pos)
            reclaimable.append(True)
            hi = r.latest
        elif r.latest > hi:
            hi = r.latest
        if not retired[i]:
            reclaimable[-1] = False
    first = len(starts)
    while first > 0 and reclaimable[first - 1]:
        first -= 1
    if first == len(starts):
        return _NOTHING
    pos = starts[first]
    return CollectionPlan(
        start=ranges[order[pos]].earliest,
        collected=tuple(order[pos:]),
        components=len(starts) - first,
    )


# -- reports and statistics ------------------------------------------------


class CollectionReport(msgspec.Struct, frozen=True, kw_only=True):
    """What the collection of the most recent successful ``render()`` did.

    Attributes:
        start: the index the tail was detached from, or ``None`` when no tail
            was detached (nothing reclaimable, or only areas that never rendered).
        detached: the detached native items, oldest first (now garbage).
        promoted: the promoted messages, in the order they were appended.
        promoted_items: the native items appended for them, oldest first.
        removed: the areas removed, in promotion order.
        components: how many range components were reclaimed.
    """

    start: int | None
    detached: tuple[NativeContent, ...]
    promoted: tuple[Message, ...]
    promoted_items: tuple[NativeContent, ...]
    removed: tuple[Any, ...]
    components: int


_EMPTY_REPORT = CollectionReport(
    start=None, detached=(), promoted=(), promoted_items=(), removed=(), components=0
)


class CoopStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of a CoopContext's counters (all counts, no units).

    Attributes:
        areas: areas registered now.
        materialized: registered areas that own an EffectRange.
        retired: registered areas known to be retired, waiting for collection.
        renders: successful ``render()`` calls.
        collections: successful renders whose collection removed an area.
        areas_collected: areas removed by collection in total.
        items_detached: native items detached by collection in total.
        items_promoted: native items appended for promoted messages in total.
    """

    areas: int
    materialized: int
    retired: int
    renders: int
    collections: int
    areas_collected: int
    items_detached: int
    items_promoted: int


# -- the CoopContext --------------------------------------------------------


class _Registration:
    """One registered area and what the CoopContext knows about it.

    ``promoted`` and ``prologued`` record what the area was told by a
    collection; a rollback keeps them, so a retry neither asks for the
    promotion again nor repeats ``gc_prologue()``.
    """

    __slots__ = ("area", "prologued", "promoted", "range", "retired", "seq")

    def __init__(self, area: ContextAreaImplementation, seq: int, retired: bool) -> None:
        self.area = area
        self.seq = seq
        self.range: EffectRange | None = None
        self.retired = retired
        self.promoted: tuple[Message, ...] | None = None
        self.prologued = False

    def describe(self) -> str:
        return f"area #{self.seq} ({type(self.area).__qualname__})"


class _Undo:
    """What a failed ``render()`` needs to put back (see ``CoopContext._rollback``)."""

    __slots__ = (
        "by_id_removed",
        "changes",
        "context_len",
        "counters",
        "cursor",
        "detached",
        "materialized",
        "materialized_len",
        "order",
    )

    def __init__(self, coop: CoopContext) -> None:
        self.order = coop._order
        self.materialized = coop._materialized
        self.materialized_len = len(coop._materialized)
        self.cursor = coop._cursor
        self.context_len = len(coop._context)
        self.counters = coop._counters
        self.detached: tuple[int, list[NativeContent]] | None = None
        self.changes: list[tuple[_Registration, EffectRange | None, bool]] = []
        self.by_id_removed: list[_Registration] = []


class CoopContext:
    """Cooperating Context Areas over one :class:`Context`, with the Collector.

    See the module docstring for the render algorithm and the decisions this
    class makes beyond the area contract.

    A CoopContext is used by one thread at a time; it does no locking, and
    the wrapped Context must not be changed by another thread while a call
    runs. Re-entrant calls from inside area callbacks raise
    :class:`~turnloom.errors.StateError`.

    Args:
        context: the Context the areas render into. Model output is appended
            to it directly with :meth:`Context.push_back`.
        max_item_bytes: when given, the most bytes one native item an area
            renders (or promotes) may take, JSON-encoded: an area adding a
            larger one fails its phase with :class:`AreaCallbackError` (caused
            by :class:`~turnloom.errors.ItemTooLargeError`), as any failure.
            The runtime passes the history's per-item cap, the one routed
            items and recorded messages are held to.

    Raises:
        InputError: ``context`` is not a :class:`Context`, or
            ``max_item_bytes`` is not a positive int.
    """

    __slots__ = (
        "_busy",
        "_by_id",
        "_context",
        "_counters",
        "_cursor",
        "_floor",
        "_gateway",
        "_last",
        "_materialized",
        "_max_item_bytes",
        "_order",
        "_seq",
    )

    def __init__(self, context: Context, *, max_item_bytes: int | None = None) -> None:
        if not isinstance(context, Context):
            raise InputError(f"A CoopContext wraps a turnloom Context, not {what_type(context)}.")
        if max_item_bytes is not None and (type(max_item_bytes) is not int or max_item_bytes <= 0):
            raise InputError(
                f"max_item_bytes must be a positive int or None, not {excerpt(max_item_bytes)}."
            )
        self._context = context
        self._max_item_bytes = max_item_bytes
        self._gateway: Gateway = context.gateway
        self._order: list[_Registration] = []  # registration order; the cursor indexes it
        self._by_id: dict[int, _Registration] = {}
        self._materialized: list[_Registration] = []  # areas with a range, ascending earliest
        self._cursor = 0
        self._floor = 0  # len(context) after the last successful render()
        self._busy = False
        self._seq = 0
        self._last: CollectionReport | None = None
        # renders, collections, areas_collected, items_detached, items_promoted
        self._counters: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)

    # -- inspection -------------------------------------------------------

    @property
    def context(self) -> Context:
        """The wrapped Context."""
        return self._context

    @property
    def areas(self) -> tuple[ContextAreaImplementation, ...]:
        """The registered areas, in registration order."""
        return tuple(e.area for e in self._order)

    @property
    def cursor(self) -> ContextAreaImplementation | None:
        """The area the next unfold pass starts at, or ``None`` with no areas."""
        return self._order[self._cursor].area if self._order else None

    @property
    def last_collection(self) -> CollectionReport | None:
        """The collection done by the latest successful ``render()`` (``None`` before one)."""
        return self._last

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, area: object) -> bool:
        entry = self._by_id.get(id(area))
        return entry is not None and entry.area is area

    def effect_range(self, area: ContextAreaImplementation) -> EffectRange | None:
        """The EffectRange of a registered area, or ``None`` before its first non-empty render.

        Raises:
            UnknownAreaError: ``area`` is not registered here (never was, or
                was collected).
        """
        return self._entry(area).range

    def is_retired(self, area: ContextAreaImplementation) -> bool:
        """Whether this CoopContext has seen ``area`` retire (sticky).

        Raises:
            UnknownAreaError: ``area`` is not registered here.
        """
        return self._entry(area).retired

    def statistics(self) -> CoopStatistics:
        """A frozen snapshot of the counters; O(n) for n registered areas."""
        renders, collections, collected, detached, promoted = self._counters
        return CoopStatistics(
            areas=len(self._order),
            materialized=len(self._materialized),
            retired=sum(1 for e in self._order if e.retired),
            renders=renders,
            collections=collections,
            areas_collected=collected,
            items_detached=detached,
            items_promoted=promoted,
        )

    def _entry(self, area: object) -> _Registration:
        entry = self._by_id.get(id(area))
        if entry is None or entry.area is not area:
            raise UnknownAreaError(
                f"The {type(area).__qualname__} area is not registered with this CoopContext."
            )
        return entry

    # -- registration -----------------------------------------------------

    def register(self, area: ContextAreaImplementation) -> None:
        """Register ``area`` at the end of the registration order.

        The area takes part in the next unfold pass that reaches it. Its
        ``life_state`` and ``flow_state`` are read once here to check them.

        Raises:
            InvalidAreaError: ``area`` lacks protocol members (``missing``
                names them), reading a member raised, a state member holds a
                value that is not an AreaLifeState / AreaFlowState, or
                ``area`` is unhashable (``hash()`` raised).
            DuplicateAreaError: this very instance is already registered.
            StateError: called from inside an area callback.
        """
        if self._busy:
            raise StateError("CoopContext.register() was called from inside an area callback.")
        name = type(area).__qualname__
        missing: list[str] = []
        states: dict[str, object] = {}
        for member in _METHOD_MEMBERS + _STATE_MEMBERS:
            try:
                states[member] = getattr(area, member)
            except AttributeError:
                missing.append(member)
            except Exception as exc:
                raise InvalidAreaError(
                    f"Reading {member} of the {name} area raised {type_name(exc)}: "
                    f"{_exception_text(exc)}.",
                    missing=(member,),
                ) from exc
            else:
                if member in _METHOD_MEMBERS and not callable(states[member]):
                    missing.append(member)
        if missing:
            listed = ", ".join(sorted(missing))
            raise InvalidAreaError(
                f"The {name} object is not a Context Area: it lacks {listed}.",
                missing=sorted(missing),
            )
        try:
            hash(area)
        except Exception as exc:
            raise InvalidAreaError(
                f"The {name} area is unhashable; an area must be hashable "
                "(use @dataclass(eq=False) for dataclasses)."
            ) from exc
        if id(area) in self._by_id:
            raise DuplicateAreaError(
                f"This {name} area instance "
                f"({self._by_id[id(area)].describe()}) is already registered."
            )
        life = _as_life(states["life_state"])
        if life is None:
            raise InvalidAreaError(
                f"The {name} area's life_state is {excerpt(states['life_state'])}, not an "
                f"AreaLifeState.",
                missing=("life_state",),
            )
        if _as_flow(states["flow_state"]) is None:
            raise InvalidAreaError(
                f"The {name} area's flow_state is {excerpt(states['flow_state'])}, not an "
                f"AreaFlowState.",
                missing=("flow_state",),
            )
        self._seq += 1
        entry = _Registration(area, self._seq, life is AreaLifeState.retired)
        self._order.append(entry)
        self._by_id[id(area)] = entry

    # -- render -----------------------------------------------------------

    def render(self) -> Context:
        """Collect at the safe point, then run one unfold pass; return the Context.

        Call it between model invocations, never while one is in flight. It
        does not call a model: the returned Context (the wrapped object) is
        the provider-native input to send.

        Returns:
            the wrapped Context.

        Raises:
            OpenToolCallError: the Context ends with a tool call whose result
                has not been pushed; nothing was changed.
            AreaCallbackError: an area member raised or returned a wrong
                value; ``area`` and ``phase`` name it, ``__cause__`` is the
                original error. The CoopContext and the Context are as they
                were before this call.
            StateError: called from inside an area callback, or the Context
                holds fewer items than after the last successful render
                (something other than the Collector removed items); nothing
                was changed.
        """
        if self._busy:
            raise StateError("CoopContext.render() was called from inside an area callback.")
        if len(self._context) < self._floor:
            raise StateError(
                f"The Context holds {len(self._context)} items but held {self._floor} after "
                "the last render(); only this CoopContext's Collector may remove items "
                "(detach_tail), so the EffectRanges no longer match the Context."
            )
        open_ids = _open_call_ids(self._gateway, len(self._context), self._context)
        if open_ids:
            listed = ", ".join(repr(c) for c in open_ids)
            raise OpenToolCallError(
                f"The Context ends with tool call(s) {listed} whose result has not been "
                "pushed; push the results before rendering the areas.",
                call_ids=open_ids,
            )
        self._busy = True
        undo = _Undo(self)
        try:
            report = self._collect(undo)
            self._unfold(undo)
        except BaseException:
            self._rollback(undo)
            raise
        finally:
            self._busy = False
        renders, collections, collected, detached, promoted = self._counters
        self._counters = (
            renders + 1,
            collections + (1 if report.removed else 0),
            collected + len(report.removed),
            detached + len(report.detached),
            promoted + len(report.promoted_items),
        )
        self._last = report
        self._floor = len(self._context)
        return self._context

    # -- phases -----------------------------------------------------------

    def _retire(self, entry: _Registration, undo: _Undo) -> None:
        undo.changes.append((entry, entry.range, entry.retired))
        entry.retired = True

    def _read_life(self, entry: _Registration) -> AreaLifeState:
        value = _call(entry, "life_state", getattr, entry.area, "life_state")
        life = _as_life(value)
        if life is None:
            raise AreaCallbackError(
                f"Context Area {entry.describe()} has life_state {excerpt(value)}, "
                "which is not an AreaLifeState.",
                area=entry.area,
                phase="life_state",
            )
        return life

    def _collect(self, undo: _Undo) -> CollectionReport:
        unrendered: list[_Registration] = []
        for entry in self._order:
            if entry.retired:
                pass
            elif entry.promoted is not None:
                # Selected by a collection that was rolled back: its state
                # changes in promote()/gc_prologue() cannot cancel collection.
                self._retire(entry, undo)
            elif self._read_life(entry) is AreaLifeState.retired:
                self._retire(entry, undo)
            if entry.retired and entry.range is None:
                unrendered.append(entry)
        materialized = self._materialized
        plan = plan_collection(
            [e.range for e in materialized if e.range is not None],
            [e.retired for e in materialized],
        )
        chosen = [materialized[i] for i in plan.collected] + unrendered
        if not chosen:
            return _EMPTY_REPORT
        context = self._context
        # Each promotion is checked, rendered through the gateway and checked
        # for open calls before it is kept, and all of them before the first
        # gc_prologue(): that call is the area's final notification, so nothing
        # may fail after it for a reason the promotions carry. A kept promotion
        # is reused if this render fails later, so promote() succeeds once.
        cut = len(context) if plan.start is None else plan.start
        promotions: list[tuple[_Registration, tuple[Message, ...]]] = []
        rendered: list[NativeContent] = []
        for entry in chosen:
            messages = entry.promoted
            if messages is None:
                result = _call(entry, "promote", entry.area.promote)
                messages = _checked_messages(entry, "promote", result)
                _check_results(entry, "promote", messages)
            first = len(rendered)
            for message in messages:
                rendered.extend(_call(entry, "promote", self._gateway.render, message))
            if self._max_item_bytes is not None:
                added = rendered[first:]
                _call(entry, "promote", _check_item_sizes, added, self._max_item_bytes)
            if messages:
                open_ids = _open_call_ids(self._gateway, cut, context, rendered)
                if open_ids:
                    raise AreaCallbackError(
                        f"Context Area {entry.describe()} promote() left tool call(s) "
                        f"{', '.join(repr(c) for c in open_ids)} without a result; an area "
                        "must promote each call together with its result.",
                        area=entry.area,
                        phase="promote",
                    )
            entry.promoted = messages
            promotions.append((entry, messages))
        for entry in chosen:
            if not entry.prologued:
                _call(entry, "gc_prologue", entry.area.gc_prologue)
                entry.prologued = True
        detached: list[NativeContent] = []
        if plan.start is not None:
            detached = context.detach_tail(plan.start)
            undo.detached = (plan.start, detached)
        first_promoted = len(context)
        for item in rendered:
            context.push_back(item)
        promoted_items = tuple(context.snapshot(first_promoted))
        removed = {id(e) for e in chosen}
        order: list[_Registration] = []
        cursor = 0
        for index, entry in enumerate(self._order):
            if id(entry) in removed:
                continue
            if index < self._cursor:
                cursor += 1
            order.append(entry)
        self._order = order
        self._cursor = cursor if cursor < len(order) else 0
        self._materialized = [e for e in materialized if id(e) not in removed]
        undo.by_id_removed = chosen
        for entry in chosen:
            del self._by_id[id(entry.area)]
        return CollectionReport(
            start=plan.start,
            detached=tuple(detached),
            promoted=tuple(m for _, messages in promotions for m in messages),
            promoted_items=promoted_items,
            removed=tuple(e.area for e in chosen),
            components=plan.components,
        )

    def _unfold(self, undo: _Undo) -> None:
        order = self._order
        n = len(order)
        if n == 0:
            return
        context = self._context
        cursor = self._cursor
        # One shallow copy of the part of the Context that ranges can cover,
        # taken lazily; each observe() gets an O(1) view of its own range. Every
        # range visited in this pass was last extended before the pass began,
        # so its items are all in the copy.
        window: Sequence[NativeContent] | None = None
        window_start = 0
        for _ in range(n):
            entry = order[cursor]
            if not entry.retired and self._read_life(entry) is AreaLifeState.retired:
                self._retire(entry, undo)
            if not entry.retired and entry.range is not None:
                if window is None:
                    first = self._materialized[0].range
                    window_start = first.earliest if first is not None else 0
                    window = context.snapshot(window_start)
                view = _RangeView(
                    window, entry.range.earliest - window_start, entry.range.latest - window_start
                )
                _call(entry, "observe", entry.area.observe, view)
                if self._read_life(entry) is AreaLifeState.retired:
                    self._retire(entry, undo)
            if not entry.retired:
                result = _call(entry, "render", entry.area.render)
                if not isinstance(result, list | tuple):
                    raise AreaCallbackError(
                        f"Context Area {entry.describe()} render() returned "
                        f"{what_type(result)}, not a list of Message.",
                        area=entry.area,
                        phase="render",
                    )
                start = len(context)
                self._append(entry, "render", result)
                end = len(context)
                if end > start:
                    undo.changes.append((entry, entry.range, entry.retired))
                    if entry.range is None:
                        entry.range = EffectRange(start, end - 1)
                        self._materialized.append(entry)
                    else:
                        entry.range = EffectRange(entry.range.earliest, end - 1)
                flow = _call(entry, "flow_state", getattr, entry.area, "flow_state")
                kind = _as_flow(flow)
                if kind is None:
                    raise AreaCallbackError(
                        f"Context Area {entry.describe()} has flow_state {excerpt(flow)}, "
                        "which is not an AreaFlowState.",
                        area=entry.area,
                        phase="flow_state",
                    )
                if kind is AreaFlowState.exclusive:
                    self._cursor = cursor
                    return
            cursor = cursor + 1 if cursor + 1 < n else 0
        self._cursor = cursor

    def _append(self, entry: _Registration, phase: str, messages: Sequence[Message]) -> None:
        """Emplace ``messages`` for ``entry``; they must not leave a tool call open."""
        if not messages:
            return
        context = self._context
        start = len(context)
        for index, message in enumerate(messages):
            _call(entry, phase, _emplace, context, message, f"{phase}()[{index}]")
        if self._max_item_bytes is not None:
            added = context.snapshot(start)
            _call(entry, phase, _check_item_sizes, added, self._max_item_bytes)
        _check_results(entry, phase, messages)
        open_ids = _open_call_ids(self._gateway, len(context), context)
        if open_ids:
            raise AreaCallbackError(
                f"Context Area {entry.describe()} {phase}() left tool call(s) "
                f"{', '.join(repr(c) for c in open_ids)} without a result; an area "
                "must render each call together with its result.",
                area=entry.area,
                phase=phase,
            )

    def _rollback(self, undo: _Undo) -> None:
        context = self._context
        if undo.detached is not None:
            start, tail = undo.detached
            context.detach_tail(start)
            # Only the items that were there before this render: a callback
            # may have appended to the Context before the detach.
            for item in tail[: undo.context_len - start]:
                context.push_back(item)
        else:
            context.detach_tail(undo.context_len)
        for entry, old_range, old_retired in reversed(undo.changes):
            entry.range = old_range
            entry.retired = old_retired
        self._order = undo.order
        self._materialized = undo.materialized
        del undo.materialized[undo.materialized_len :]
        for entry in undo.by_id_removed:
            self._by_id[id(entry.area)] = entry
        self._cursor = undo.cursor
        self._counters = undo.counters


# -- helpers ---------------------------------------------------------------


class _RangeView(Sequence[NativeContent]):
    """A read-only, fixed-length view of ``window[first : last + 1]`` (shallow; O(1) to make)."""

    __slots__ = ("_first", "_len", "_window")

    def __init__(self, window: Sequence[NativeContent], first: int, last: int) -> None:
        self._window = window
        self._first = first
        self._len = last - first + 1

    @overload
    def __getitem__(self, index: int) -> NativeContent: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[NativeContent]: ...
    def __getitem__(self, index: int | slice) -> NativeContent | Sequence[NativeContent]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            return tuple(self._window[self._first + i] for i in range(start, stop, step))
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError(f"index {index} is outside an EffectRange of {self._len} items")
        return self._window[self._first + index]

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[NativeContent]:
        window, first = self._window, self._first
        return (window[first + i] for i in range(self._len))

    def __repr__(self) -> str:
        return f"<EffectRange view of {self._len} items>"


def _exception_text(exc: BaseException) -> str:
    """An area's exception, for an error message: a turnloom error's own sentence
    (its values are excerpts already), any other exception's text as an excerpt."""
    return str(exc) if isinstance(exc, TurnloomError) else excerpt(str(exc))


def _call(entry: _Registration, phase: str, fn: Callable[..., _T], *args: object) -> _T:
    try:
        return fn(*args)
    except Exception as exc:
        raise AreaCallbackError(
            f"Context Area {entry.describe()} raised {type_name(exc)} in {phase}: "
            f"{_exception_text(exc)}",
            area=entry.area,
            phase=phase,
        ) from exc


def _as_life(value: object) -> AreaLifeState | None:
    if value is AreaLifeState.retain or value is AreaLifeState.retired:
        return value
    if not isinstance(value, str):
        return None
    try:
        return AreaLifeState(value)
    except ValueError:
        return None


def _as_flow(value: object) -> AreaFlowState | None:
    if value is AreaFlowState.yielded or value is AreaFlowState.exclusive:
        return value
    if not isinstance(value, str):
        return None
    try:
        return AreaFlowState(value)
    except ValueError:
        return None


def _checked_messages(entry: _Registration, phase: str, result: object) -> tuple[Message, ...]:
    if not isinstance(result, tuple | list):
        raise AreaCallbackError(
            f"Context Area {entry.describe()} {phase}() returned "
            f"{what_type(result)}, not a tuple or list of Message.",
            area=entry.area,
            phase=phase,
        )
    return tuple(
        [
            _call(entry, phase, _admit_one, message, f"{phase}()[{index}]")
            for index, message in enumerate(result)
        ]
    )


def _check_results(entry: _Registration, phase: str, messages: Sequence[Message]) -> None:
    """Raise unless each tool result answers a call of the nearest preceding call group.

    ``messages`` are what one area appends in one go. A render never starts
    with a call open (and a promotion follows a detached tail), so a result
    can only answer a call among them. Pairing is :class:`CallTracker`'s,
    with a model turn (consecutive assistant messages) as one call group.
    """
    tracker = CallTracker(model_turns=True)
    orphans: list[str] = []
    for message in messages:
        orphans.extend(r.call_id for r in tracker.feed(message).orphans)
    if orphans:
        raise AreaCallbackError(
            f"Context Area {entry.describe()} {phase}() returned tool result(s) "
            f"{', '.join(repr(c) for c in orphans)} without their call; an area must "
            "render each result right after the call it answers.",
            area=entry.area,
            phase=phase,
        )


def _emplace(context: Context, message: object, where: str) -> None:
    """``context.emplace_message(message)``; a non-Message is named by ``where``."""
    if not isinstance(message, Message):
        raise InvalidMessageError(not_a_message(where, message))
    context.emplace_message(message)


def _check_item_sizes(added: Sequence[NativeContent], cap: int) -> None:
    """Raise :class:`ItemTooLargeError` for the first of ``added`` whose JSON encoding is
    over ``cap`` bytes."""
    for offset, item in enumerate(added):
        size = len(_encoder.encode(item))
        if size > cap:
            raise ItemTooLargeError(
                f"item {offset} it added is {size} bytes, over the per-item cap of {cap} bytes",
                size=size,
                limit=cap,
            )


def _admit_one(message: object, where: str) -> Message:
    return admit_message(message, where=where)[0]


def _open_call_ids(
    gateway: Gateway, cut: int, context: Context, extra: Sequence[NativeContent] = ()
) -> tuple[str, ...]:
    """Ids of the tool calls that have no result yet at the tail, in call order.

    The items scanned are the Context's first ``cut`` items followed by
    ``extra`` (the native items a collection is about to append).

    Scans back from the tail over results (tool messages, or user turns
    carrying tool results) to the model turn before them (consecutive
    assistant items: OpenAI Responses emits one item per call), then pairs
    them with :class:`CallTracker`. A user, system or developer message
    without results ends the scan, and so does an item the gateway cannot
    parse.
    """
    index = cut + len(extra) - 1
    tail: list[Message] = []  # the trailing model turn and the results after it, newest first
    in_model_turn = False
    while index >= 0:
        item = extra[index - cut] if index >= cut else context.snapshot(index, index + 1)[0]
        index -= 1
        try:
            message = gateway.parse(item)
        except InvalidMessageError:
            break
        if message.role is Role.assistant:
            in_model_turn = True
        elif in_model_turn or not message.tool_results:
            break
        tail.append(message)
    if not in_model_turn:
        return ()
    tracker = CallTracker(model_turns=True)
    for message in reversed(tail):
        tracker.feed(message)
    return tracker.open_ids

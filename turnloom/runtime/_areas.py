"""``Areas``: attaching Context Areas and routing items to a context's area section.

Reached as ``manager.areas``. Both calls are synchronous: they check their
input completely on the event loop, then hand the area or the item to the
context's :class:`~turnloom.runtime._area_section.AreaSection`, whose next
area pass (in a preparation's worker thread) takes them in.
"""

from __future__ import annotations

__all__ = ("Areas",)

from turnloom.context.area import ContextAreaImplementation
from turnloom.context.gateway import Gateway, NativeContent
from turnloom.runtime._area_section import check_area
from turnloom.runtime._contexts import ContextTable
from turnloom.runtime._door import check_routed_item
from turnloom.runtime._lifecycle import Lifecycle


class Areas:
    """The Context Areas of a manager's contexts. Reach it as ``manager.areas``.

    Each context lazily owns one :class:`~turnloom.context.CoopContext` over
    its own :class:`~turnloom.context.Context`, created by its first
    :meth:`attach` or :meth:`route`: the *area section*. It is volatile
    per-turn content, so a prepared prefix carries it last, after the durable
    history; it never enters history and is never evicted with it. Every
    preparation that renders is a safe point for it; see
    :data:`~turnloom.runtime.AreaPass` for the safe points, threads, model
    calls in flight and undelivered sections. Every method must be called
    from the Foundation's event loop.
    """

    __slots__ = ("_gateway", "_life", "_max_item_bytes", "_table")

    def __init__(
        self, life: Lifecycle, table: ContextTable, gateway: Gateway, max_item_bytes: int
    ) -> None:
        self._life = life
        self._table = table
        self._gateway = gateway
        self._max_item_bytes = max_item_bytes

    def attach(self, context_id: str, area: ContextAreaImplementation) -> None:
        """Attach a Context Area to a context's area section.

        The area is checked here, as ``CoopContext.register`` checks it, and
        takes part from the next area pass on (the next ``prepare`` of the
        context that runs one). Areas take part in attachment order. An area
        stays attached until the Collector removes it; the same instance may
        be attached again after that preparation settled.

        Raises:
            StateError: the manager is not bound to an open Foundation yet.
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
        self._life.check_open()
        state = self._table.get(context_id)
        check_area(self._gateway, area)
        self._table.attach(state, area, context_id)

    def route(self, context_id: str, item: NativeContent) -> None:
        """Append one native item (model output an area must see) to the area section.

        Use it for the model outputs that belong to an area rather than to
        the durable history, for example the intermediate work of a
        :class:`~turnloom.areas.SubtaskArea`: they are reclaimed with the
        area's tail when it is collected, while outputs recorded with
        ``manager.record`` stay in history. Do not route and record the same
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
            StateError: the manager is not bound to an open Foundation yet.
            FoundationClosedError: the Foundation is closing or closed.
            UnknownContextError: no turn was committed to ``context_id``.
            InvalidMessageError: a malformed context id, ``item`` is not a
                JSON object of the manager's gateway, it carries a runtime-state
                call or result, or another item is routed while a routed
                call has no result.
            UnpairedResultError: a result answers no open routed call (an
                ``InvalidMessageError``; ``field`` is ``"item"``, ``call_id``
                the result's).
            InvalidTextError: its text is not valid UTF-8.
            ItemTooLargeError: its JSON encoding is over the history's
                per-item byte cap (``max_item_bytes``).

            Nothing changed when any of these is raised.
        """
        self._life.check_open()
        state = self._table.get(context_id)
        copy, message = check_routed_item(self._gateway, self._max_item_bytes, context_id, item)
        self._table.route(state, copy, message, context_id)

"""One context's area section: its CoopContext, the hand-over queues, the area step.

Synchronous and loop-free. The event loop checks and queues (:func:`check_area`,
:func:`answer_routed_calls`); a worker thread runs the area step of a
preparation (:func:`run_area_step`) under the section's lock.

The safe points, threads and reuse of an area section are documented on
:data:`turnloom.runtime.AreaPass`.
"""

from __future__ import annotations

__all__ = (
    "AreaSection",
    "SectionResult",
    "answer_routed_calls",
    "check_area",
    "current_section",
    "run_area_step",
)

import threading
from collections import deque

from turnloom.context.area import ContextAreaImplementation
from turnloom.context.coop import CoopContext
from turnloom.context.gateway import Gateway, NativeContent
from turnloom.context.message import Message
from turnloom.context.native import Context
from turnloom.context.pairing import CallTracker
from turnloom.errors import (
    AreaCallbackError,
    InputError,
    InvalidMessageError,
    UnpairedResultError,
    excerpt,
)
from turnloom.runtime.schemas import AreaPass


class AreaSection:
    """One context's area section: a CoopContext over its own Context.

    Thread ownership: ``coop`` (and its Context) is touched only by a worker
    thread holding ``lock``. The event loop never touches it; it hands new
    areas and routed items over through the two deques (``append`` on the
    loop, ``popleft``/``appendleft`` in a worker: both atomic). ``attached``
    and ``calls`` (the pairing state of the routed items) are owned by the
    loop; ``rendered`` is written only by workers (under ``lock``) and
    ``delivered`` only by the loop; both only grow.
    """

    __slots__ = (
        "attached",
        "calls",
        "coop",
        "delivered",
        "lock",
        "pending_areas",
        "pending_items",
        "rendered",
        "unsettled",
    )

    def __init__(self, gateway: Gateway, max_item_bytes: int) -> None:
        self.coop = CoopContext(Context(gateway), max_item_bytes=max_item_bytes)
        self.lock = threading.Lock()
        self.pending_areas: deque[ContextAreaImplementation] = deque()
        self.pending_items: deque[NativeContent] = deque()
        # id -> area: attached and not yet known to be collected.
        self.attached: dict[int, ContextAreaImplementation] = {}
        self.calls = CallTracker()  # routed calls still unanswered
        self.rendered = 0  # area passes run
        self.delivered = 0  # the newest pass whose section reached a requester
        # Passes run (appended by the worker) the loop has not counted yet: counted
        # and their collected areas forgotten whether or not the render that ran
        # them succeeded (a failure after the pass leaves its collection done).
        self.unsettled: deque[SectionResult] = deque()


class SectionResult:
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


def check_area(gateway: Gateway, area: ContextAreaImplementation) -> None:
    """Run the exact checks of ``CoopContext.register`` on ``area``, touching no section.

    Raises:
        InvalidAreaError: as ``CoopContext.register``.
    """
    # A throwaway CoopContext: the context's own may be rendering in a worker.
    CoopContext(Context(gateway)).register(area)


def answer_routed_calls(calls: CallTracker, message: Message, context_id: str) -> CallTracker:
    """The pairing state of the routed items once ``message`` is routed after them.

    A routed tool call must be directly followed by its results before
    anything else is routed. Pairing is :class:`~turnloom.context.CallTracker`'s.
    ``calls`` is not changed.

    Raises:
        InvalidMessageError: ``message`` is not a result while calls are
            unanswered (or ends their group).
        UnpairedResultError: ``message`` holds results that answer no open
            routed call (``field`` is ``"item"``, ``call_id`` the first such
            result's).
    """
    tracker = calls.copy()
    unanswered = tracker.open_ids
    step = tracker.feed(message)
    # Anything but results, even an assistant message that would continue the
    # calls' step, waits until they are answered.
    if unanswered and (step.closed or not step.results):
        raise InvalidMessageError(
            f"Tool call(s) {', '.join(map(repr, unanswered))} routed to context "
            f"{excerpt(context_id)} have no result yet; route their results before any "
            "other item."
        )
    if step.orphans:
        raise UnpairedResultError(
            f"The item routed to context {excerpt(context_id)} holds tool result(s) "
            f"{', '.join(repr(r.call_id) for r in step.orphans)} that answer no open "
            "routed call.",
            field="item",
            call_id=step.orphans[0].call_id,
        )
    return tracker


def current_section(areas: AreaSection) -> SectionResult:
    """The area section as it stands, for a scoped preparation, in a worker thread.

    Runs no pass: queued areas and routed items wait for the next one.
    """
    with areas.lock:
        return SectionResult(tuple(areas.coop.context.snapshot()), "reused_scoped", areas.rendered)


def run_area_step(areas: AreaSection, run_pass: bool) -> SectionResult:
    """The area step of a preparation, in a worker thread.

    Reuses the previous section when ``run_pass`` is false (a model call is in
    flight) or when the last pass never reached a requester; otherwise enrols
    the queued areas, appends the routed items and runs ``coop.render()``.

    Raises:
        AreaCallbackError: an area failed to register or render; routed items
            wait for the next pass.
        OpenToolCallError: the section would end with an unanswered routed call.
    """
    with areas.lock:
        coop = areas.coop
        context = coop.context
        if not run_pass or areas.delivered < areas.rendered:
            outcome: AreaPass = "reused_invocation" if not run_pass else "reused_undelivered"
            return SectionResult(tuple(context.snapshot()), outcome, areas.rendered)
        while areas.pending_areas:
            area = areas.pending_areas.popleft()
            try:
                coop.register(area)
            except InputError as exc:
                # Checked at areas.attach; only an area whose state members
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
        result = SectionResult(
            tuple(context.snapshot()),
            "rendered",
            areas.rendered,
            removed=report.removed,
            reclaimed=len(report.detached),
            promoted=len(report.promoted_items),
        )
        areas.unsettled.append(result)
        return result

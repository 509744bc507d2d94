"""The binding and closing state one ContextManager shares with its feature objects.

A manager is built unbound; it is bound once, when its
Foundation opens (``preparer`` is set then); it is *closing* once the
Foundation began closing (intake stops) and *closed* once its output streams
were drained and its preparations settled. Every public call of the manager
and of the objects reached from it (``leases``, ``areas``, ``bridge``,
``outputs``, ``assembly``) passes one of the gates below first, so each
raises the same typed error in the same state.
"""

from __future__ import annotations

__all__ = ("Lifecycle",)

from collections.abc import Mapping
from typing import TYPE_CHECKING

import anyio

from turnloom.context.history import HistoryView, check_id
from turnloom.errors import StateError, UnknownContextError, excerpt
from turnloom.runtime.errors import FoundationClosedError

if TYPE_CHECKING:
    from turnloom.runtime._contexts import ContextState
    from turnloom.runtime._durable import Durability
    from turnloom.runtime._outputs import OutputStreams
    from turnloom.runtime._preparing import Preparer


class Lifecycle:
    """Where one manager is in its life: unbound, open, closing, closed."""

    __slots__ = ("bound", "closed", "closing", "final", "preparer")

    def __init__(self) -> None:
        self.bound = False  # a Foundation began binding the manager
        self.preparer: Preparer | None = None  # set once the binding completed
        self.closing = False  # intake stopped (the Foundation began closing)
        self.closed = False  # outputs drained, preparations settled, histories released
        self.final: dict[str, HistoryView] = {}  # each context's history at the close

    def check_unbound(self) -> None:
        """Raise unless no Foundation was ever bound.

        Raises:
            StateError: the manager was already bound to a Foundation.
        """
        if self.bound:
            raise StateError(
                "This ContextManager was already bound to a Foundation; build a new one."
            )

    def check_bound(self) -> Preparer:
        """The bound manager's preparer.

        Raises:
            StateError: the manager is not bound to an open Foundation yet.
        """
        preparer = self.preparer
        if preparer is None:
            raise StateError(
                "This ContextManager is not bound to an open Foundation yet; open "
                "'async with Foundation(manager)' first."
            )
        return preparer

    def check_open(self) -> Preparer:
        """The preparer, while calls that start work are accepted.

        Raises:
            StateError: the manager is not bound to an open Foundation yet.
            FoundationClosedError: the Foundation is closing or closed.
        """
        preparer = self.check_bound()
        if self.closing:
            raise FoundationClosedError(
                "The Foundation is closed; the ContextManager accepts no calls."
            )
        return preparer

    def check_recording(self) -> None:
        """Pass until the close drained the output streams and settled the preparations.

        Raises:
            StateError: the manager is not bound to an open Foundation yet.
            FoundationClosedError: the Foundation finished closing.
        """
        self.check_bound()
        if self.closed:
            raise FoundationClosedError(
                "The Foundation is closed; its output streams were drained and no more "
                "outputs are recorded."
            )

    async def aclose(
        self,
        grace_period: float,
        outputs: OutputStreams,
        durable: Durability | None,
        contexts: Mapping[str, ContextState],
    ) -> None:
        """Close in order: stop intake, drain output streams, let preparations settle.

        ``grace_period`` (seconds) bounds the first two waits together; the
        durable writer gets its own. Not shielded: the Foundation calls it in
        a shielded scope. The manager is marked closed, each context's final
        history kept for ``history``, even when a step fails.

        Raises:
            StateError: the manager was never bound.
        """
        preparer = self.check_bound()
        deadline = anyio.current_time() + grace_period
        try:
            self.closing = True
            preparer.closing = True
            try:
                await outputs._aclose(grace_period)
            finally:
                try:
                    await preparer.queue.aclose(max(0.0, deadline - anyio.current_time()))
                finally:
                    if durable is not None:
                        await durable.aclose(grace_period)
        finally:
            self.closed = True
            self.final = {cid: state.history.view() for cid, state in contexts.items()}

    def final_view(self, context_id: str) -> HistoryView:
        """A context's history as it was at the close.

        Raises:
            InvalidMessageError: a malformed context id.
            UnknownContextError: the context was not held at the close.
        """
        final = self.final.get(context_id) if isinstance(context_id, str) else None
        if final is None:
            check_id(context_id, "context id")
            raise UnknownContextError(
                f"Context {excerpt(context_id)} was not held when the Foundation closed."
            )
        return final

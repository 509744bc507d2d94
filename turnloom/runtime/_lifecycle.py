"""The state one ContextManager shares with its feature objects, and its life.

The shared state is made from the manager's checked options: its contexts
(``table``), running counters (``counters``) and the prefixes it delivered
(``issued``). A manager is built unbound; it is bound once, when its Foundation opens
(:meth:`Lifecycle.bind` makes the ``preparer`` and, with a store, the
``durable`` side then); it is *closing* once the Foundation began closing
(intake stops) and *closed* once its output streams were drained and its
preparations settled (:meth:`Lifecycle.aclose`). Every public call of the
manager and of the objects reached from it (``leases``, ``areas``,
``bridge``, ``outputs``, ``assembly``) passes one of the gates below first,
so each raises the same typed error in the same state. What the manager
answers in each state (a history, the context ids, the statistics) is read
here too: after the close, from what the close kept.
"""

from __future__ import annotations

__all__ = ("Lifecycle",)

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

import anyio
import anyio.abc

from turnloom.context.history import HistoryView, check_id
from turnloom.errors import StateError, UnknownContextError, excerpt
from turnloom.runtime._contexts import ContextTable
from turnloom.runtime._continuation import IssuedPrefixes
from turnloom.runtime._counters import Counters
from turnloom.runtime._door import DurableOptions, ManagerOptions
from turnloom.runtime._preparing import Preparer
from turnloom.runtime._queue import PreparationQueue
from turnloom.runtime.errors import FoundationClosedError

if TYPE_CHECKING:
    from turnloom.runtime._durable import Durability
    from turnloom.runtime.schemas import ManagerStatistics, OutputStatistics


def _utc_now() -> datetime:
    return datetime.now(UTC)


class OutputBinding(Protocol):
    """What the lifecycle does with the manager's output streams (``_outputs``'s)."""

    def _bind(self, task_group: anyio.abc.TaskGroup) -> None: ...
    async def _aclose(self, grace_period: float) -> None: ...


class DurableBinding(Protocol):
    """What the lifecycle does with the manager's leases (``_leases``'s): start the durable
    side with a store."""

    def _bind(
        self,
        options: DurableOptions | None,
        task_group: anyio.abc.TaskGroup,
        limiter: anyio.CapacityLimiter,
        table: ContextTable,
        queue: PreparationQueue,
    ) -> Durability | None: ...


class Lifecycle:
    """One manager's shared state, and where it is in its life: unbound, open, closing, closed.

    ``table``, ``counters`` and ``issued`` are made here from the checked
    options; binding builds on them and closing keeps the final histories.
    """

    __slots__ = (
        "bound",
        "closed",
        "closing",
        "counters",
        "durable",
        "final",
        "issued",
        "options",
        "preparer",
        "table",
    )

    def __init__(self, options: ManagerOptions) -> None:
        self.options = options
        strategy = options.strategy.name if options.strategy is not None else None
        counters = self.counters = Counters(strategy, options.gateway.type.value)
        table = self.table = ContextTable(
            options.history_limits,
            options.gateway,
            counters,
            options.token_counter,
            options.earlier_state,
        )
        self.issued = IssuedPrefixes(
            options.gateway,
            options.history_limits,
            options.open_calls,
            table.held_history,
            options.prompt_cache,
        )
        self.bound = False  # a Foundation began binding the manager
        self.preparer: Preparer | None = None  # set once the binding completed
        self.durable: Durability | None = None  # set by the binding when there is a store
        self.closing = False  # intake stopped (the Foundation began closing)
        self.closed = False  # outputs drained, preparations settled, histories released
        self.final: dict[str, HistoryView] = {}  # each context's history at the close

    def bind(
        self,
        outputs: OutputBinding,
        leases: DurableBinding,
        task_group: anyio.abc.TaskGroup,
        limiter: anyio.CapacityLimiter,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        """Bind once to an opening Foundation's task group, worker limiter and clock.

        Makes the bounded pending queue, starts the output streams and, with
        a store, the durable side in ``task_group``, then makes the preparer.
        ``clock`` returns the current time (None: ``datetime.now(UTC)``).

        Raises:
            StateError: the manager was already bound to a Foundation.
        """
        self.check_unbound()
        self.bound = True
        options, table, counters = self.options, self.table, self.counters
        queue = PreparationQueue(
            options.max_pending_preparations, task_group, counters, options.tenant_limit
        )
        outputs._bind(task_group)
        durable = self.durable = leases._bind(options.durable, task_group, limiter, table, queue)
        self.preparer = Preparer(
            options, table, counters, self.issued, queue, limiter, clock or _utc_now, durable
        )
        self.issued.refill = self.preparer.refill  # build's next host copy, made in the worker

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
        preparer = self.preparer
        if preparer is None or self.closing:
            self.check_bound()  # raises StateError when not bound
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
        if self.preparer is None:
            self.check_bound()  # raises StateError
        if self.closed:
            raise FoundationClosedError(
                "The Foundation is closed; its output streams were drained and no more "
                "outputs are recorded."
            )

    async def aclose(self, grace_period: float, outputs: OutputBinding) -> None:
        """Close in order: stop intake, drain outputs, settle preparations, join the render worker.

        ``grace_period`` (seconds) bounds the first two waits together; the
        durable writer gets its own. Not shielded: the Foundation calls it in
        a shielded scope. The manager is marked closed, each context's final
        history kept for :meth:`history`, even when a step fails; when none
        failed, the held histories are released.

        Raises:
            StateError: the manager was never bound.
        """
        preparer = self.check_bound()
        durable = self.durable
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
                    try:
                        # Every render handed to it came back with its batch
                        # (the queue settled): the thread ends and is joined.
                        await preparer.worker.aclose()
                    finally:
                        if durable is not None:
                            await durable.aclose(grace_period)
        finally:
            self.closed = True
            self.final = {cid: state.history.view() for cid, state in self.table.contexts.items()}
        self.table.release()

    def history(self, context_id: str) -> HistoryView:
        """A context's history now; after the close, as it was at the close.

        Raises:
            StateError: the manager is not bound to an open Foundation yet.
            InvalidMessageError: a malformed context id.
            UnknownContextError: no turn was committed to the context (after
                the close: it was not held at the close).
        """
        if not self.closed:
            self.check_bound()
            return self.table.get(context_id).history.view()
        final = self.final.get(context_id) if isinstance(context_id, str) else None
        if final is None:
            check_id(context_id, "context id")
            raise UnknownContextError(
                f"Context {excerpt(context_id)} was not held when the Foundation closed."
            )
        return final

    def context_ids(self) -> tuple[str, ...]:
        """The ids of the contexts held, in creation order (after the close: at the close)."""
        return tuple(self.final if self.closed else self.table.contexts)

    def statistics(self, outputs: OutputStatistics) -> ManagerStatistics:
        """The manager's statistics now (see ``ContextManager.statistics``), O(1)."""
        preparer, durable = self.preparer, self.durable
        return self.counters.snapshot(
            closed=self.closing,
            contexts=len(self.table.contexts),
            capacity=self.options.max_pending_preparations,
            queue=preparer.queue if preparer is not None else None,
            outputs=outputs,
            store=durable.statistics() if durable is not None else None,
        )

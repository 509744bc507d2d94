"""``Invocation``: one model call in flight, as ``ContextManager.invocation`` yields it."""

from __future__ import annotations

__all__ = ("Invocation", "InvocationBlock")

from collections.abc import Sequence
from types import TracebackType

from turnloom.context.gateway import Gateway
from turnloom.context.interruption import played_prefix
from turnloom.context.message import Message
from turnloom.runtime._contexts import ContextState, ContextTable
from turnloom.runtime._door import check_outputs
from turnloom.runtime._lifecycle import Lifecycle


class Invocation:
    """One model call in flight for a turn; see :meth:`ContextManager.invocation`.

    Attributes:
        context_id: the conversation (read-only).
        turn_id: the turn the model call answers (read-only: checked once,
            when the invocation began, and what :meth:`record` records to).
    """

    __slots__ = ("_context_id", "_gateway", "_life", "_serial", "_state", "_table", "_turn_id")

    def __init__(
        self,
        life: Lifecycle,
        table: ContextTable,
        gateway: Gateway,
        state: ContextState,
        context_id: str,
        turn_id: str,
    ) -> None:
        self._life = life
        self._table = table
        self._gateway = gateway
        self._state = state
        self._serial = state.history.turn_serial(turn_id)
        self._context_id = context_id
        self._turn_id = turn_id

    @property
    def context_id(self) -> str:
        """The context this invocation records into (read-only: checked when it began)."""
        return self._context_id

    @property
    def turn_id(self) -> str:
        """The held turn this invocation records into (read-only: checked when it began)."""
        return self._turn_id

    def record(self, outputs: Sequence[Message]) -> int:
        """Record outputs of this turn; see :meth:`ContextManager.record`.

        Bound to the turn the invocation was opened for: outputs recorded
        after that turn is gone (evicted, retracted, its context removed,
        even when its id was since reused) are dropped and counted as late.
        """
        self._life.check_recording()
        turn_id, state = self._turn_id, self._state
        check_outputs(self._gateway, turn_id, outputs, state.history, id_checked=True)
        return self._table.record(state, turn_id, outputs, self._serial, self._context_id)

    def record_interrupted(self, output: Message, *, played: int) -> int:
        """Record this call's interrupted output (see ``manager.voice.record_interrupted``)."""
        return self.record([played_prefix(output, played)])


class InvocationBlock:
    """The ``async with`` block of one model call; see :meth:`ContextManager.invocation`.

    Entering checks that the Foundation is open and marks the call in flight
    (raising as ``invocation`` documents); leaving, however the block ends,
    ends the call and runs the eviction it held back unless the Foundation
    is closing. Neither waits. (A class, not a generator-based context
    manager: it is entered once per model call on the event loop.)
    """

    __slots__ = ("_context_id", "_gateway", "_life", "_state", "_table", "_turn_id")

    def __init__(
        self, life: Lifecycle, table: ContextTable, gateway: Gateway, context_id: str, turn_id: str
    ) -> None:
        self._life = life
        self._table = table
        self._gateway = gateway
        self._context_id = context_id
        self._turn_id = turn_id
        self._state: ContextState | None = None

    async def __aenter__(self) -> Invocation:
        self._life.check_open()
        state = self._table.begin_call(self._context_id, self._turn_id)
        self._state = state
        return Invocation(
            self._life, self._table, self._gateway, state, self._context_id, self._turn_id
        )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        state, self._state = self._state, None
        if state is not None:
            self._table.end_call(state, evict=not self._life.closing)

"""``Invocation``: one model call in flight, as ``ContextManager.invocation`` yields it."""

from __future__ import annotations

__all__ = ("Invocation", "InvocationBlock")

from collections.abc import Sequence
from types import TracebackType

from turnloom.context.gateway import Gateway
from turnloom.context.interruption import interrupted_output
from turnloom.context.message import Message
from turnloom.runtime._contexts import ContextState, ContextTable
from turnloom.runtime._door import check_outputs
from turnloom.runtime._lifecycle import Lifecycle
from turnloom.runtime._wakeup import CancelScope


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
        With a store, raises as ``ContextManager.record`` does when this
        manager does not hold the context's lease (``NotClaimedError``,
        ``StaleLeaseError``), and ``FoundationClosedError`` once the close
        released the leases; nothing is recorded then.
        """
        self._life.check_recording()
        durable = self._life.durable
        if durable is not None:
            durable.check_writable(self._context_id)
        turn_id, state = self._turn_id, self._state
        check_outputs(self._gateway, turn_id, outputs, state.history, id_checked=True)
        return self._table.record(state, turn_id, outputs, self._serial, self._context_id)

    def record_interrupted(
        self, output: Message, *, played: int | None = None, played_text: str | None = None
    ) -> int:
        """Record this call's interrupted output (see ``manager.voice.record_interrupted``).

        Exactly one of ``played`` (code points) and ``played_text`` (the
        played words, matched by :func:`~turnloom.context.played_count`).
        """
        return self.record([interrupted_output(output, played, played_text)])


class InvocationBlock:
    """The ``async with`` block of one model call; see :meth:`ContextManager.invocation`.

    Entering checks that the Foundation is open and marks the call in flight
    (raising as ``invocation`` documents); leaving, however the block ends,
    ends the call and runs the eviction it held back unless the Foundation
    is closing. Neither waits. (A class, not a generator-based context
    manager: it is entered once per model call on the event loop.) The body
    runs in a cancel scope that ``remove_context`` cancels; leaving the block
    swallows that cancellation only (see ``ContextManager.invocation``).
    """

    __slots__ = ("_context_id", "_gateway", "_life", "_scope", "_state", "_table", "_turn_id")

    def __init__(
        self, life: Lifecycle, table: ContextTable, gateway: Gateway, context_id: str, turn_id: str
    ) -> None:
        self._life = life
        self._table = table
        self._gateway = gateway
        self._context_id = context_id
        self._turn_id = turn_id
        self._state: ContextState | None = None
        self._scope: CancelScope | None = None

    async def __aenter__(self) -> Invocation:
        cancel_scope = self._life.check_open().queue.hooks.cancel_scope
        state = self._state = self._table.begin_call(self._context_id, self._turn_id)
        # Entered here, exited in __aexit__: the block's body runs inside it (LIFO holds).
        scope = self._scope = state.call_scope = cancel_scope()
        scope.__enter__()
        return Invocation(
            self._life, self._table, self._gateway, state, self._context_id, self._turn_id
        )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        state, self._state = self._state, None
        scope, self._scope = self._scope, None
        if state is not None:
            self._table.end_call(state, evict=not self._life.closing)
        if scope is None:
            return False
        # True only when the scope absorbed its own cancellation (a removal).
        return bool(scope.__exit__(exc_type, exc, traceback))

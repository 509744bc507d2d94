"""``Invocation``: one model call in flight, as ``ContextManager.invocation`` yields it."""

from __future__ import annotations

__all__ = ("Invocation",)

from collections.abc import Sequence

from turnloom.context.gateway import Gateway
from turnloom.context.interruption import played_prefix
from turnloom.context.message import Message
from turnloom.runtime._contexts import ContextState, ContextTable
from turnloom.runtime._door import check_outputs
from turnloom.runtime._lifecycle import Lifecycle


class Invocation:
    """One model call in flight for a turn; see :meth:`ContextManager.invocation`.

    Attributes:
        context_id: the conversation.
        turn_id: the turn the model call answers.
    """

    __slots__ = ("_gateway", "_life", "_serial", "_state", "_table", "context_id", "turn_id")

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
        self.context_id = context_id
        self.turn_id = turn_id

    def record(self, outputs: Sequence[Message]) -> int:
        """Record outputs of this turn; see :meth:`ContextManager.record`.

        Bound to the turn the invocation was opened for: outputs recorded
        after that turn is gone (evicted, retracted, its context removed,
        even when its id was since reused) are dropped and counted as late.
        """
        self._life.check_recording()
        check_outputs(self._gateway, self.turn_id, outputs, self._state.history)
        return self._table.record(self._state, self.turn_id, outputs, self._serial, self.context_id)

    def record_interrupted(self, output: Message, *, played: int) -> int:
        """Record this call's interrupted output (see ``manager.voice.record_interrupted``)."""
        return self.record([played_prefix(output, played)])

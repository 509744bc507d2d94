"""The bridge between a context's history and a sub-agent's WorkingContext.

:class:`Bridge` is the host's side, reached as ``manager.bridge``. Its work
is done by two synchronous, loop-free functions. Out: :func:`working_context`
turns the retained history of a context (an immutable view) into a
:class:`~turnloom.context.WorkingContext` for a sub-agent briefing, sliced by a
scope and with every call/result pair complete (run in a worker thread). Back:
:func:`folded_message` turns a sub-agent's result into one message of the
parent's turn (a tool result answering the call that delegated, or an
assistant message), which the manager records through its ordinary door.
"""

from __future__ import annotations

__all__ = ("Bridge", "folded_message", "working_context")

from collections.abc import Callable, Sequence

import anyio
import anyio.to_thread

from turnloom.context.history import HistoryView, check_id
from turnloom.context.message import Message, Role, TextPart, ToolResultPart
from turnloom.context.pairing import OpenCallPolicy, complete_pairs
from turnloom.context.scope import ContextScope, check_scope, scope_indices
from turnloom.context.tokens import TokenCounter
from turnloom.context.working import FrozenContext, PrefixContext, WorkingContext
from turnloom.errors import InvalidArgumentError, excerpt, what_type
from turnloom.runtime._contexts import ContextTable
from turnloom.runtime._lifecycle import Lifecycle

Record = Callable[[str, str, Sequence[Message]], int]
"""``ContextManager.record``: (context id, turn id, outputs) -> messages recorded."""


class Bridge:
    """Sub-agents of a manager's contexts: briefings out, results folded back in.

    Reach it as ``manager.bridge``. :meth:`working_context` (or its frozen
    form :meth:`briefing`) hands a sub-agent the retained history of a
    context; :meth:`fold` records the sub-agent's result as one message of
    the parent's turn, through ``manager.record``. Every method must be
    called from the Foundation's event loop.
    """

    __slots__ = ("_life", "_open_calls", "_record", "_table", "_token_counter")

    def __init__(
        self,
        life: Lifecycle,
        table: ContextTable,
        open_calls: OpenCallPolicy,
        token_counter: TokenCounter,
        record: Record,
    ) -> None:
        self._life = life
        self._table = table
        self._open_calls = open_calls
        self._token_counter = token_counter
        self._record = record

    async def working_context(
        self, context_id: str, *, scope: ContextScope | None = None
    ) -> WorkingContext:
        """The retained history of a context as a WorkingContext, for a sub-agent briefing.

        The prefix's grounding is the pinned instructions; the messages are
        every kept turn's input and outputs, oldest first, sliced by ``scope``
        (indices are positions in that list) and with every call/result pair
        complete under the ``open_calls`` policy. The token counter is the
        Foundation's, so ``tokens()`` is the number the history and
        ``PreparedContext.tokens`` report for the same messages. The result
        is independent of the manager: changing it changes no history. Built
        from a view captured at the call, in a worker thread.

        Raises:
            StateError: the manager is not bound to an open Foundation yet.
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: a malformed context id.
            UnknownContextError: no turn was committed to ``context_id``.
            InvalidArgumentError: ``scope`` is not a scope.
            PositionalScopeError: a scope without ``indices`` asked a
                positional scope's ``matches``.

        Cancellation:
            Nothing changes either way; a cancelled call waits for its worker
            thread (never abandoned) and the result is dropped.
        """
        preparer = self._life.check_open()
        view = self._table.get(context_id).history.view()
        if scope is not None:
            check_scope(scope)
        return await anyio.to_thread.run_sync(
            working_context,
            view,
            scope,
            self._open_calls,
            self._token_counter,
            limiter=preparer.limiter,
        )

    async def briefing(
        self, context_id: str, *, scope: ContextScope | None = None
    ) -> FrozenContext:
        """:meth:`working_context`, frozen: an immutable snapshot to hand a sub-agent.

        Raises:
            As :meth:`working_context`.

        Cancellation:
            As :meth:`working_context`.
        """
        return (await self.working_context(context_id, scope=scope)).freeze()

    def fold(
        self,
        context_id: str,
        turn_id: str,
        result: WorkingContext | FrozenContext | str,
        *,
        call_id: str | None = None,
        agent: str | None = None,
    ) -> int:
        """Fold a sub-agent's result into a turn, through ``manager.record``.

        The result's text (``result`` itself, or the text of the last
        assistant message of its messages that has text) is recorded as one
        message of ``turn_id``: with ``call_id``, the tool result answering
        that call of the turn (the call that delegated to the sub-agent, its
        tool name taken from the call); without it, an assistant message
        named ``agent``.

        Returns:
            how many messages were recorded (1, or 0 when the turn was
            evicted and the output dropped).

        Raises:
            StateError, FoundationClosedError, UnknownContextError,
            UnknownTurnError, InvalidMessageError, InvalidTextError,
            ItemTooLargeError, ProviderRuleError, NotClaimedError,
            StaleLeaseError, HostCallbackError: as ``manager.record``; with ``call_id``,
            UnknownTurnError also when the turn is no longer held.
            InvalidArgumentError: ``result`` is not a WorkingContext,
                FrozenContext or string, or has no assistant text;
                ``call_id`` names no call of the turn still without a
                result; ``agent`` is malformed or given with ``call_id``.
                Nothing was recorded.
        """
        self._life.check_open()
        view = self._table.get(context_id).history.view()
        check_id(turn_id, "turn id")
        message = folded_message(result, view, turn_id, call_id=call_id, agent=agent)
        return self._record(context_id, turn_id, (message,))


def working_context(
    view: HistoryView,
    scope: ContextScope | None,
    open_calls: OpenCallPolicy,
    token_counter: TokenCounter,
) -> WorkingContext:
    """The retained history of ``view`` as a WorkingContext, in a worker thread.

    The prefix holds the pinned instructions as its grounding (so
    ``prefix.as_messages()`` is exactly them); the messages are every kept
    turn's input and outputs, oldest first, selected by ``scope`` (indices
    are positions in that list, as in ``WorkingContext.slice``) and then
    completed with :func:`~turnloom.context.complete_pairs` under
    ``open_calls``: the briefing never holds a call without its result or a
    result without its call. The scratchpad and journal are empty.

    Raises:
        PositionalScopeError: a scope without ``indices`` asked a positional
            scope's ``matches``.
    """
    messages = list(view.messages())
    if scope is not None:
        keep = scope_indices(scope, messages)
        messages = [m for i, m in enumerate(messages) if i in keep]
    prefix = PrefixContext(grounding=view.pinned)
    completed = complete_pairs(messages, open_calls=open_calls)
    return WorkingContext._from_checked(prefix, completed, token_counter)


def folded_message(
    result: WorkingContext | FrozenContext | str,
    view: HistoryView,
    turn_id: str,
    *,
    call_id: str | None,
    agent: str | None,
) -> Message:
    """The message that folds a sub-agent's ``result`` into turn ``turn_id``.

    The result's text is ``result`` itself when it is a string, otherwise the
    text of the last assistant message of its messages that has text. With
    ``call_id`` the message is a tool result answering that call of the turn
    (its tool name taken from the call); without it, an assistant message
    whose ``name`` is ``agent`` (so ``Tagged(agent)`` selects it). A tool
    result has no participant name (OpenAI Chat's ``name`` of a ``tool``
    message is the function's), so ``agent`` goes with the assistant form only.

    Raises:
        InvalidArgumentError: ``result`` is of another type, or has no
            assistant text (``field="result"``); ``call_id`` names no call
            of the turn that is still without a result (``field="call_id"``);
            ``agent`` is not a non-empty string, or is given with ``call_id``
            (``field="agent"``).
        UnknownTurnError: the view holds no turn ``turn_id``.
    """
    if isinstance(result, str):
        text = result
    elif isinstance(result, WorkingContext | FrozenContext):
        text = next(
            (m.text for m in reversed(result.messages) if m.role is Role.assistant and m.text),
            "",
        )
    else:
        raise InvalidArgumentError(
            "result must be a WorkingContext, a FrozenContext or a string, not "
            f"{what_type(result)}.",
            field="result",
        )
    if not text.strip():
        raise InvalidArgumentError(
            "The sub-agent's result has no assistant text to fold into the turn.", field="result"
        )
    if agent is not None and (not isinstance(agent, str) or not agent):
        raise InvalidArgumentError("agent must be a non-empty string or None.", field="agent")
    if agent is not None and call_id is not None:
        raise InvalidArgumentError(
            "agent names an assistant message; a tool result (call_id) carries no "
            "participant name.",
            field="agent",
        )
    if call_id is None:
        return Message(role=Role.assistant, content=text, name=agent)
    messages = view.turn_messages(turn_id)
    answered = {r.call_id for m in messages for r in m.tool_results}
    calls = [c for m in messages for c in m.tool_calls if c.call_id == call_id]
    if not calls or call_id in answered:
        raise InvalidArgumentError(
            f"Turn {excerpt(turn_id)} holds no tool call {excerpt(call_id)} still without a "
            "result.",
            field="call_id",
        )
    part = ToolResultPart(call_id=call_id, name=calls[-1].name, content=(TextPart(text=text),))
    return Message(role=Role.tool, content=(part,))

"""An OpenAI Agents SDK ``Session`` whose history is a turnloom context.

``Runner.run(agent, input, session=TurnloomSession(...))`` reads the
conversation with :meth:`TurnloomSession.get_items` before the run and hands
each new item to :meth:`TurnloomSession.add_items`; turnloom is the one
source of truth. Mapping (the items are OpenAI Responses input items, parsed
and rendered by turnloom's ``openai_responses`` gateway, exactly round-trip):

* a run of ``user`` input messages starts a turn (``accept_turn``);
* every other item (``function_call``, ``function_call_output``, assistant
  messages, reasoning) is recorded to the newest turn (``manager.record``).

So the history is bounded as every turnloom context is, by the manager's
:class:`~turnloom.runtime.HistoryLimits` (turns, items, bytes, tokens),
evicting whole turns: a tool call never loses its result. With a store
(``Foundation(store=...)``) every write is acknowledged by the store before
:meth:`~TurnloomSession.add_items` returns, so a restarted process (or another
host, after the lease) resumes the session where it was.

Windows: unlike the SDK's ``SQLiteSession``, whose ``get_items(limit=N)`` is
the newest N rows and may start with a ``function_call_output`` whose call
was cut off (an input the Responses API rejects), :meth:`get_items` never
returns a tool result without its call, nor a call without its result (a
call left open, for example by a cancelled run).

Concurrency: the SDK runs on asyncio only (``Runner`` uses asyncio tasks), so
a session used by ``Runner.run`` runs on asyncio. The session itself awaits
only through anyio and turnloom, so its methods also run on trio when called
directly. Every method must be called from the Foundation's event loop.

Source: OpenAI Agents SDK ``agents.memory.session.Session`` protocol and
``agents.memory.sqlite_session.SQLiteSession`` (openai-agents 0.24).
"""

from __future__ import annotations

__all__ = ("TurnloomSession", "complete_window")

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from agents.memory import SessionSettings

from turnloom.context import GatewayType, Message, Role, ToolResultPart
from turnloom.errors import (
    InvalidArgumentError,
    InvalidMessageError,
    TurnloomError,
    UnknownContextError,
)
from turnloom.integrations._ids import new_turn_id
from turnloom.runtime import ContextManager, TurnSnapshot

if TYPE_CHECKING:
    from agents.items import TResponseInputItem


def complete_window(items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items without a tool result whose call is not before it, or a call never answered.

    Pure and O(len(items)); the order of what is kept is unchanged.

    Args:
        items: OpenAI Responses input items, oldest first.

    Returns:
        a new list holding the same item objects, minus every
        ``function_call_output`` whose ``call_id`` no earlier ``function_call``
        of ``items`` carries, and every ``function_call`` no later output answers.
    """
    called: set[object] = set()
    answered: set[object] = set()
    for item in items:
        kind = item.get("type")
        if kind == "function_call":
            called.add(item.get("call_id"))
        elif kind == "function_call_output" and item.get("call_id") in called:
            answered.add(item.get("call_id"))
    kept: list[dict[str, Any]] = []
    seen: set[object] = set()
    for item in items:
        kind = item.get("type")
        call_id = item.get("call_id")
        if kind == "function_call":
            if call_id not in answered:
                continue
            seen.add(call_id)
        elif kind == "function_call_output" and call_id not in seen:
            continue
        kept.append(item)
    return kept


def _starts_turn(message: Message) -> bool:
    return message.role is Role.user and not any(
        isinstance(part, ToolResultPart) for part in message.content
    )


class TurnloomSession:
    """An OpenAI Agents SDK ``Session`` backed by one turnloom context.

    Implements the SDK's ``Session`` protocol (``session_id``,
    ``session_settings``, ``get_items``, ``add_items``, ``pop_item``,
    ``clear_session``). The context id is ``session_id``; many sessions share
    one manager (and its store).

    Args:
        session_id: the session, also the turnloom context id (see
            :func:`~turnloom.context.check_id`).
        manager: a manager bound to an open Foundation whose gateway is
            ``openai_responses``.
        session_settings: the SDK's settings; its ``limit`` bounds what the
            runner reads (on top of the manager's history limits).

    Raises:
        InvalidArgumentError: the manager's gateway is not ``openai_responses``.
    """

    def __init__(
        self,
        session_id: str,
        manager: ContextManager,
        *,
        session_settings: SessionSettings | None = None,
    ) -> None:
        if manager.gateway.type is not GatewayType.openai_responses:
            raise InvalidArgumentError(
                f"TurnloomSession {session_id!r} needs a manager with the openai_responses "
                f"gateway (the SDK's items are Responses items), not {manager.gateway.type.value}.",
                field="manager",
            )
        self.session_id = session_id
        self.session_settings = session_settings
        self._manager = manager

    async def _claim(self) -> bool:
        """Claim the context (no I/O once held); True when it holds a turn."""
        await self._manager.leases.claim(self.session_id)
        return self.session_id in self._manager.context_ids()

    def _all_items(self) -> list[dict[str, Any]]:
        """Every held message rendered, oldest first (turnloom's own order)."""
        manager = self._manager
        if self.session_id not in manager.context_ids():
            return []
        view = manager.history(self.session_id)
        render = manager.gateway.render
        items: list[dict[str, Any]] = []
        for turn_id in view.turn_ids:
            for message in view.turn_messages(turn_id):
                items.extend(render(message))
        return items

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The held conversation, oldest first: at most ``limit`` of the newest items.

        ``limit`` None takes ``session_settings.limit`` (None: everything held).
        The window is then made complete (:func:`complete_window`): it never
        begins with a tool result cut from its call, so it may hold fewer than
        ``limit`` items. The items are fresh dicts: editing them changes nothing.

        Raises:
            InvalidArgumentError: ``limit`` is negative.
            LeaseHeldError, StoreUnavailableError, StoreRecordError: with a
                store, claiming the context failed (see ``manager.leases.claim``).

        Cancellation:
            Only the claim awaits; a cancelled call changes nothing.
        """
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        if limit is not None and limit < 0:
            raise InvalidArgumentError(
                f"get_items of session {self.session_id!r}: limit must be >= 0, not {limit}.",
                field="limit",
            )
        await self._claim()
        items = self._all_items()
        if limit is not None:
            items = items[len(items) - limit :] if limit else []
        return cast("list[TResponseInputItem]", complete_window(items))

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Add the SDK's new items: user input starts a turn, the rest is recorded to it.

        The items are parsed by the ``openai_responses`` gateway and their
        roles checked before anything changes; with a store, the call returns
        once the store has acknowledged them. Each turn of the batch (a user input and the
        items after it, or the items before the batch's first user input,
        which join the newest turn) goes in whole or not at all: when the door
        refuses its items, its input is taken back
        (``manager.voice.retract_turn``: turns its commit evicted come back),
        and the turns of the batch before it stay.

        Raises:
            InvalidMessageError: an item the gateway cannot parse, a
                ``system``/``developer`` item (instructions are the agent's,
                not the session's), or outputs before any user input.
            Every error of ``manager.accept_turn`` and ``manager.record``
                (for example ``UnpairedResultError``: a function call output
                answering no call of its turn).

        Cancellation:
            The changes are made before the only await (the store's flush):
            a call cancelled there leaves them in memory, queued for the
            store's next batch.
        """
        if not items:
            return
        manager = self._manager
        messages = manager.gateway.parse_items(cast("list[dict[str, Any]]", list(items)))
        held = await self._claim()
        for message in messages:
            if message.role in (Role.system, Role.developer):
                raise InvalidMessageError(
                    f"Session {self.session_id!r} was given a {message.role.value} item: "
                    "instructions belong to the agent, not to the session's history.",
                    field="role",
                )
        if not held and not _starts_turn(messages[0]):
            raise InvalidMessageError(
                f"Session {self.session_id!r} holds no turn, and its first item is not user "
                "input: a turnloom turn starts with the user's input.",
                field="items",
            )
        turn_input: list[Message] = []
        outputs: list[Message] = []

        def flush() -> None:
            committed = None
            if turn_input:
                committed = new_turn_id()
                manager.accept_turn(
                    TurnSnapshot(
                        context_id=self.session_id, turn_id=committed, input=tuple(turn_input)
                    )
                )
                turn_input.clear()
            if outputs:
                newest = committed or manager.history(self.session_id).turn_ids[-1]
                try:
                    manager.record(self.session_id, newest, outputs)
                except TurnloomError:
                    if committed is not None:  # the turn goes in whole or not at all
                        manager.voice.retract_turn(self.session_id, committed)
                    raise
                outputs.clear()

        for message in messages:
            if _starts_turn(message):
                if outputs:
                    flush()
                turn_input.append(message)
            else:
                outputs.append(message)
        flush()
        await manager.leases.flush(self.session_id)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item, or None when the session is empty.

        turnloom records a turn's outputs append-only, so this rebuilds the
        context without its newest item: O(history held), for the SDK's rare
        rewinds (a retried or corrected run).

        Raises:
            as :meth:`clear_session` and :meth:`add_items`.
        """
        await self._claim()
        items = self._all_items()
        if not items:
            return None
        await self.clear_session()
        await self.add_items(cast("list[TResponseInputItem]", items[:-1]))
        return cast("TResponseInputItem", items[-1])

    async def clear_session(self) -> None:
        """Forget the session's history (``manager.remove_context``); idempotent.

        With a store the context's log is deleted before the call returns.

        Raises:
            StateError: a model call of the context is in flight.
            LeaseHeldError, StoreUnavailableError: with a store, as ``manager.leases``.
        """
        if not await self._claim():
            return
        try:
            self._manager.remove_context(self.session_id)
        except UnknownContextError:
            return
        await self._manager.leases.flush(self.session_id)

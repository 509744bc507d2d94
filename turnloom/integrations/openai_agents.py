"""An OpenAI Agents SDK ``Session`` whose history is a turnloom context.

``Runner.run(agent, input, session=TurnloomSession(...))`` reads the
conversation with :meth:`TurnloomSession.get_items` before the run and hands
each new item to :meth:`TurnloomSession.add_items`; turnloom is the one
source of truth. Mapping (the items are OpenAI Responses input items, parsed
and rendered by turnloom's ``openai_responses`` gateway, exactly round-trip):

* a run of ``user`` input messages starts a turn (``accept_turn``);
* every other item (``function_call``, ``function_call_output``, assistant
  messages, reasoning, hosted and local tool items such as
  ``web_search_call``, ``computer_call`` / ``computer_call_output``,
  ``mcp_approval_request`` / ``mcp_approval_response``, ``item_reference``)
  is recorded to the newest turn (``manager.record``); the gateway keeps the
  items it has no neutral form for verbatim.

Not held, by ``manager.record``'s rules: an assistant message with only
blank text (counted in ``dropped_blank_outputs_total``). Refused with
``InvalidMessageError``, the session unchanged: a user input that is empty
or blank (every provider rejects a turn without input).

A ``reasoning`` item added in a batch of its own (a host storing one item per
call) is handed back in front of the output item added after it, as the
model input needs it; one that no output item follows yet is not handed out.

So the history is bounded as every turnloom context is, by the manager's
:class:`~turnloom.runtime.HistoryLimits` (turns, items, bytes, tokens),
evicting whole turns: a tool call never loses its result. With a store
(``Foundation(store=...)``) every write is acknowledged by the store before
:meth:`~TurnloomSession.add_items` returns, so a restarted process (or another
host, after the lease) resumes the session where it was.
:meth:`~TurnloomSession.pop_item` rebuilds the history without its newest
item and writes it as one atomic replace (``manager.leases.rewriting``): a
process killed mid-pop restores the session whole, with or without the item
(``scripts/fault_pops.py`` kills one 50 times per store).

Placeholder ids: the SDK gives every output item of a model without
Responses item ids (Chat Completions, LiteLLM, any-llm, a run error handler's
final output) the id ``FAKE_RESPONSES_ID`` (``"__fake_id__"``), which it
treats as no id and strips before a Responses request. turnloom refuses two
messages with one id (``DuplicateIdError``), so an assistant message carrying
it is held under a unique id (``"__fake_id__#"`` and 32 hex digits) and handed
back with the placeholder: :meth:`get_items` returns it as it was added.
Other items carrying it (``function_call``, ``reasoning``) are held verbatim.

Windows: unlike the SDK's ``SQLiteSession``, whose ``get_items(limit=N)`` is
the newest N rows and may start with a ``function_call_output`` whose call
was cut off (an input the Responses API rejects), :meth:`get_items` never
returns a tool output without its call, nor a call without its output (a
call left open, for example by a cancelled run), for every call kind the SDK
runs itself (function, custom tool, computer, shell, apply patch, tool
search, program, MCP approval; the table the Responses gateway's
``validate`` pairs them with), nor a reasoning item whose call was left out
(:func:`complete_window`), nor a call or output message of a model response
whose reasoning item the window cut off (the API refuses one "provided
without its required 'reasoning' item"). These items stay held; :meth:`pop_item` may
return one.

Concurrency: the SDK runs on asyncio only (``Runner`` uses asyncio tasks), so
a session used by ``Runner.run`` runs on asyncio. The session itself awaits
only through anyio and turnloom, so its methods also run on trio when called
directly. Every method must be called from the Foundation's event loop.

Source: OpenAI Agents SDK ``agents.memory.session.Session`` protocol and
``agents.memory.sqlite_session.SQLiteSession`` (openai-agents 0.24).
"""

from __future__ import annotations

__all__ = ("TurnloomSession", "complete_window")

import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import anyio
import msgspec
from agents.memory import SessionSettings
from agents.models.fake_id import FAKE_RESPONSES_ID

from turnloom.context import (
    GatewayType,
    Message,
    OpaquePart,
    ReasoningPart,
    Role,
    ToolCallPart,
    ToolResultPart,
    join_steps,
)
from turnloom.context._call_kinds import call_key, output_key
from turnloom.context.gateway import Gateway, step_join
from turnloom.context.gateways._responses_rules import follows_reasoning
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
    """The items without a tool output whose call is not before it, or a call never answered.

    Pure and O(len(items)); the order of what is kept is unchanged. Calls and
    outputs pair as the Responses gateway's ``validate`` pairs them (its
    ``CALL_KINDS`` table: ``function_call`` / ``function_call_output``,
    ``custom_tool_call``, ``computer_call``, ``local_shell_call``,
    ``shell_call``, ``apply_patch_call``, ``program`` with their
    ``*_output``, ``tool_search_call`` / ``tool_search_output``): an output
    answers the newest earlier call of its kind with its call id, once; a
    ``local_shell_call_output`` without ``call_id`` names it in ``id``.
    Calls and outputs without a string call id are kept. An
    ``mcp_approval_response`` is kept only after the ``mcp_approval_request``
    it answers (its ``approval_request_id``); a request not answered yet is
    kept (the server holds it open). A ``reasoning`` item directly before an
    item left out goes too (the API rejects a reasoning item not followed by
    the item it belongs to), as do the reasoning items directly before it.

    Args:
        items: OpenAI Responses input items, oldest first.

    Returns:
        a new list holding the same item objects, minus the items above.
    """
    dropped = [False] * len(items)
    newest: dict[tuple[str, str], int] = {}  # output key -> index of the newest such call
    unanswered: set[int] = set()
    requests: set[object] = set()
    for index, item in enumerate(items):
        key = call_key(item)
        if key is not None:
            newest[key] = index
            unanswered.add(index)
            continue
        key = output_key(item)
        kind = item.get("type")
        if key is not None:
            call = newest.get(key)
            if call is None or call not in unanswered:
                dropped[index] = True
            else:
                unanswered.discard(call)
        elif kind == "mcp_approval_request":
            requests.add(item.get("id"))
        elif kind == "mcp_approval_response" and item.get("approval_request_id") not in requests:
            dropped[index] = True
    for index in unanswered:
        dropped[index] = True
    for index in range(len(items) - 2, -1, -1):
        if items[index].get("type") == "reasoning" and dropped[index + 1]:
            dropped[index] = True
    return [item for item, gone in zip(items, dropped, strict=True) if not gone]


def _of_response(item: dict[str, Any]) -> bool:
    """An output item of a model response (a call, an output message, a server item)."""
    return follows_reasoning(item) and output_key(item) is None


def _window_start(items: Sequence[dict[str, Any]], start: int) -> int:
    """``start``, moved past the output items of a response whose reasoning item is before
    ``start`` (the API refuses them without it: "provided without its required
    'reasoning' item"). O(length of that response)."""
    before = start - 1
    while before >= 0 and _of_response(items[before]):
        before -= 1
    if before < 0 or items[before].get("type") != "reasoning":
        return start
    while start < len(items) and _of_response(items[start]):
        start += 1
    return start


def _is_message(item: object) -> bool:
    return isinstance(item, dict) and "role" in item and item.get("type") in (None, "message")


def _hold_placeholder(item: dict[str, Any]) -> dict[str, Any]:
    """``item``, or a copy whose placeholder id is made unique while held (see the module doc)."""
    if _is_message(item) and item.get("id") == FAKE_RESPONSES_ID:
        return {**item, "id": f"{_HELD_PREFIX}{secrets.token_hex(16)}"}
    return item


def _give_placeholder(item: dict[str, Any]) -> dict[str, Any]:
    """Put the SDK's placeholder id back where :func:`_hold_placeholder` made one unique."""
    item_id = item.get("id")
    if (
        isinstance(item_id, str)
        and item_id.startswith(_HELD_PREFIX)
        and len(item_id) == _HELD_LENGTH
        and _is_message(item)
    ):
        item["id"] = FAKE_RESPONSES_ID
    return item


_HELD_PREFIX = f"{FAKE_RESPONSES_ID}#"
_HELD_LENGTH = len(_HELD_PREFIX) + 32


def _reasoning_tail(message: Message) -> int:
    """How many reasoning parts end ``message``."""
    count = 0
    for part in reversed(message.parts):
        if type(part) is ReasoningPart or (
            type(part) is OpaquePart and part.item.get("type") == "reasoning"
        ):
            count += 1
        else:
            break
    return count


def _split_reasoning(messages: list[Message]) -> list[Message]:
    """``messages`` with the reasoning parts that end the last one held apart, as a
    reasoning item added on its own is held: an output item added next is then joined
    after them (:func:`~turnloom.context.join_steps`), as it would have been before a
    pop took the item they came before."""
    last = messages[-1] if messages else None
    if last is None or last.role is not Role.assistant:
        return messages
    count = _reasoning_tail(last)
    if not count or count == len(last.parts):
        return messages
    head = msgspec.structs.replace(last, content=last.parts[:-count])
    tail = Message(role=Role.assistant, content=last.parts[-count:])
    return [*messages[:-1], head, tail]


_SENTINEL = ToolCallPart(call_id="turnloom_sentinel", name="turnloom_sentinel")


def _unfollowed_reasoning(gateway: Gateway, message: Message) -> list[dict[str, Any]]:
    """The reasoning items that end ``message`` with no output item after them, rendered
    (the gateway's ``render`` leaves them out: the API needs their output item)."""
    count = _reasoning_tail(message) if message.role is Role.assistant else 0
    if not count:
        return []
    # Rendered in front of a call they may precede, which is then dropped.
    lead = Message(role=Role.assistant, content=(*message.parts[-count:], _SENTINEL))
    return gateway.render(lead)[:-1]


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

    def _all_items(self, *, unfollowed: bool = False) -> list[dict[str, Any]]:
        """Every held message rendered, oldest first (turnloom's own order).

        Each turn's messages go through the gateway's step join first
        (:func:`~turnloom.context.join_steps`): a ``reasoning`` item added in a
        batch of its own renders in front of the output item added after it,
        as it does in a prepared input, instead of being left out alone.

        ``unfollowed`` True also renders the reasoning items no output item
        follows yet (the gateway leaves them out of an input), where they are
        held: :meth:`pop_item` takes the newest held item and rebuilds the rest.
        """
        return [item for _, turn in self._turn_items(unfollowed=unfollowed) for item in turn]

    def _turn_items(self, *, unfollowed: bool = False) -> list[tuple[str, list[dict[str, Any]]]]:
        """:meth:`_all_items`, one list per held turn with its id, oldest first."""
        manager = self._manager
        if self.session_id not in manager.context_ids():
            return []
        view = manager.history(self.session_id)
        gateway = manager.gateway
        join = step_join(gateway)
        turns: list[tuple[str, list[dict[str, Any]]]] = []
        for turn_id in view.turn_ids:
            items: list[dict[str, Any]] = []
            for message in join_steps(view.turn_messages(turn_id), join):
                rendered = gateway.render(message)
                if unfollowed:
                    rendered += _unfollowed_reasoning(gateway, message)
                items.extend(_give_placeholder(item) for item in rendered)
            turns.append((turn_id, items))
        return turns

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The held conversation, oldest first: at most ``limit`` of the newest items.

        ``limit`` None takes ``session_settings.limit`` (None: everything held).
        The window never begins with an item of a model response whose
        ``reasoning`` item it cut off (the API refuses a ``function_call`` or
        output message "provided without its required 'reasoning' item"), and
        is then made complete (:func:`complete_window`): it never begins with
        a tool result cut from its call, so it may hold fewer than ``limit``
        items. The items are fresh dicts: editing them changes nothing.

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
            items = items[_window_start(items, max(0, len(items) - limit)) :] if limit else []
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
        messages = self._parse(cast("list[dict[str, Any]]", items))
        held = await self._claim()
        self._check(messages, held)
        self._apply(messages)
        await self._manager.leases.flush(self.session_id)

    def _parse(self, items: list[dict[str, Any]]) -> list[Message]:
        """The items as messages (InvalidMessageError: one the gateway cannot parse)."""
        return self._manager.gateway.parse_items([_hold_placeholder(item) for item in items])

    def _check(self, messages: list[Message], held: bool) -> None:
        """Refuse instructions, and outputs that no turn can take (InvalidMessageError)."""
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

    def _apply(self, messages: list[Message], turn_id: str | None = None) -> None:
        """Commit the messages as turns, each whole or not at all (synchronous); the first
        turn committed takes ``turn_id`` when given (a held turn rebuilt by a pop)."""
        manager = self._manager
        turn_input: list[Message] = []
        outputs: list[Message] = []
        ids = [turn_id] if turn_id is not None else []

        def flush() -> None:
            committed = None
            if turn_input:
                committed = ids.pop() if ids else new_turn_id()
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

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item, or None when the session is empty.

        turnloom records a turn's outputs append-only, so this rebuilds the
        context without its newest item: O(history held), for the SDK's rare
        rewinds (a retried or corrected run). The newest item is the newest
        held one, which may be one :meth:`get_items` leaves out (a call left
        open by a cancelled run, a reasoning item whose output item was not
        added yet). Each held turn is rebuilt as a turn of its own, under its
        own id (a turn holding only its input stays one; a summary turn stays
        the summary turn), so the history limits evict the same turns
        afterwards. The rebuild is synchronous (no other task
        sees a half-built history); when it fails, the context is rebuilt as
        it was (every held item added back) and the error raised.

        Raises:
            Every error of :meth:`add_items` raised by the rebuild (the
                history is then as it was), and of ``manager.leases.flush``
                (the pop is made in memory and stays queued for the store).

        Cancellation:
            A call cancelled while claiming the context changes nothing. Once
            the item is taken out, the wait for the store is shielded: the
            call returns the item (the cancellation reaches the caller at its
            next checkpoint).

        Durability:
            With a store, the history without the item replaces the stored
            one in one atomic write (``manager.leases.rewriting``): a process
            killed at any point leaves the stored history whole, with or
            without the item (with it unless the call returned).
        """
        await self._claim()
        manager = self._manager
        turns = [(i, t) for i, t in self._turn_items(unfollowed=True) if t]  # reasoning too
        if not turns:
            return None
        last_id, last = turns[-1]
        newest = last[-1]
        # Each turn rebuilt on its own, under its own id: a turn whose outputs are gone
        # (its input only) stays a turn, not merged into the input of the turn after
        # it, and a summary turn stays the summary turn (evicted last, never pruned).
        kept = [
            (turn_id, _split_reasoning(self._parse(items)))
            for turn_id, items in [*turns[:-1], (last_id, last[:-1])]
            if items
        ]
        with manager.leases.rewriting(self.session_id):
            manager.remove_context(self.session_id)
            try:
                for turn_id, messages in kept:
                    self._apply(messages, turn_id)
            except BaseException:
                if self.session_id in manager.context_ids():
                    manager.remove_context(self.session_id)
                for turn_id, items in turns:
                    self._apply(self._parse(items), turn_id)
                raise
        with anyio.CancelScope(shield=True):
            await manager.leases.flush(self.session_id)
        return cast("TResponseInputItem", newest)

    async def clear_session(self) -> None:
        """Forget the session's history (``manager.remove_context``); idempotent.

        With a store the context's log is deleted before the call returns. A
        model call of the context in flight (``manager.invocation``) is
        cancelled, as ``manager.remove_context`` does.

        Raises:
            LeaseHeldError, StoreUnavailableError: with a store, as
                ``manager.leases.claim`` and ``manager.leases.flush``.

        Cancellation:
            A call cancelled while claiming changes nothing; one cancelled at
            the flush has forgotten the history in memory, and the store's
            next batch deletes the log.
        """
        if not await self._claim():
            return
        try:
            self._manager.remove_context(self.session_id)
        except UnknownContextError:
            return
        await self._manager.leases.flush(self.session_id)

"""A LiveKit Agents ``Agent`` whose model input comes from a turnloom context.

LiveKit's way to own the model's context is to override ``Agent.llm_node``
and hand ``Agent.default.llm_node`` the context to send; that is what
:class:`TurnloomAgent` does, so turnloom is the one source of truth:

* the user's turn is committed (``manager.accept_turn``) on
  ``on_user_turn_completed`` (speech), or, for text input
  (``session.run(user_input=...)``, ``generate_reply``), when the first
  model call of the turn starts; a ``false_start`` hook returning True for
  the turn's text retracts it (``manager.voice.retract_turn``) and answers
  nothing (LiveKit's ``StopResponse``). A turn a model call committed stays
  unconfirmed until LiveKit keeps its user message (its
  ``conversation_item_added``): a preemptive generation (LiveKit's default:
  a model call on an interim transcript before the end of the turn) commits
  such a guess, and the next user message committed while it is unconfirmed
  and nothing is recorded to it retracts it first, so only the final
  transcript stays a turn; when LiveKit uses that generation, its guess's
  message answers to the final turn (its tool steps and reply go there);
* a user message's images (LiveKit's ``ImageContent``: a URL, a data URL, or a
  ``VideoFrame``, encoded to JPEG as LiveKit encodes it) are kept with its text,
  in LiveKit's order, and reach every model call; its audio frames are not (their
  transcript is the text);
* every model call sends turnloom's prepared input (``manager.prepare``, then
  ``manager.build(prefix, recorded=True)``: the turn's recorded outputs),
  rendered for OpenAI Chat and converted to a LiveKit ``ChatContext``;
* function tools: the calls and results LiveKit executed are recorded to the
  turn whose model call emitted them, from the session's
  ``function_tools_executed`` event (LiveKit emits it once per executed
  batch, on a barge-in too) and from the items after the turn's user
  message in each model call's context, once each, calls before their
  results (see :class:`TurnloomAgent`, "Tool calls and barge-ins");
  an async tool (``AsyncToolset``, ``ctx.update``) is recorded as LiveKit
  keeps it: its first update is the call's output, and its deferred result
  is the new pair LiveKit adds (``<call id>_final``, with its output),
  recorded to the turn that is current when LiveKit runs the model call
  answering it: the call's own turn, or the caller's next one when that
  turn came first (LiveKit places the pair after that turn's reply too);
* the reply is recorded from the session's ``conversation_item_added``
  event, which LiveKit emits once it knows what was played: an interrupted
  reply carries only the text spoken before the barge-in
  (``ChatMessage.interrupted``). History gets the model's own streamed text
  cut where that played text ends (``manager.voice.record_interrupted(...,
  played_text=...)``: a TTS-aligned transcript that spells "25" out as
  "twenty-five" does not move the cut), or the played text itself when it
  is not this reply's words; what the agent said before the caller's first
  turn (a greeting: ``session.generate_reply`` or ``say`` before anyone
  spoke) opens the first turn's input (the next one's, when that turn is
  retracted as a false start);
* :meth:`TurnloomAgent.aclose_context` (call it on the session's ``close``
  event: the caller hung up) removes the context. The host may close the
  Foundation before the session ends: no hook raises into LiveKit then (see
  :class:`TurnloomAgent`, "Teardown in either order").

What a host changes in LiveKit's context:

* Host notes. turnloom keeps no ``system``/``developer`` message in
  history, so a text message the host adds to a model call's LiveKit
  context for the turn, whatever its role (but a reply's own system
  messages, below), reaches the model as data: a ``ContextContribution`` (named
  ``<role>_message_<n>``, ``n`` counting from 1 in the turn; its content the
  message's text) of the turn's runtime-state pair, in every later model
  call of that turn, once each, in LiveKit's order. That covers the RAG
  pattern (``turn_ctx.add_message(...)`` in an ``on_user_turn_completed``
  override, before or after calling this class's hook) and messages added
  with ``agent.update_chat_ctx`` (they go to the next model call's turn; a
  user message that call answers as the caller's turn is that turn's input
  instead). A note is text: its images (an image-only message too) do not
  reach the model; they are counted in
  :attr:`TurnloomAgent.note_images_dropped`, the first with a warning (an
  image for the model goes in the caller's ``new_message``, above). Later
  turns keep the pair in its place under turnloom's default
  earlier-state policy (``"keep"``), as turnloom keeps any turn's state;
  ``history()`` does not list it. LiveKit's instructions message (id
  ``lk.agent_task.instructions``) is not a note: turnloom pins them.
* A reply's own system messages. LiveKit adds two to one reply's copy of
  its context only (``voice/agent_activity.py``
  ``_pipeline_reply_task_impl``): the ``instructions`` of
  ``session.generate_reply`` (LiveKit's own too: its async tools answer a
  deferred result that way), a ``system`` message that neither the agent's
  ``ChatContext`` nor the speech turn's ``turn_ctx`` holds; and, when the
  TTS has a markup dialect and ``expressive`` is on, its markup guide
  (``lk.expressive.instructions``: without it the model never writes the
  markup the TTS expects). The adapter sends them as LiveKit does, as
  ``system`` messages in that reply's model calls only (its tool
  follow-ups included), after turnloom's input, in LiveKit's order; they
  are neither notes nor history. Before the caller's first turn LiveKit's
  context goes as is, with them.
* ``new_message`` edits: an edit made before calling this class's
  ``on_user_turn_completed`` is the turn's input. One made after it comes
  too late (the turn is committed): turnloom keeps and sends the committed
  text and images, logs a warning (lengths and image counts, not the
  caller's words) and counts it in :attr:`TurnloomAgent.late_edits`; so
  does an image appended after it (LiveKit's vision pattern run after
  calling this hook).
* ``agent.update_instructions(...)``: turnloom pins the new instructions
  from the caller's next turn on; the model calls of a turn already
  committed keep its instructions.
* ``session.say(..., add_to_chat_ctx=True)`` is recorded like a reply, to
  the current turn; with none (before the first turn, or after a false
  start was retracted), the next turn's input opens with it, as a greeting
  (above);
  ``session.generate_reply(user_input=...)`` is a turn of its own.

LiveKit's own ``ChatContext`` (``agent.chat_ctx``) is cut to the newest
``framework_items`` items at each turn, so it stays bounded beside turnloom's.

Process model: LiveKit's default process executor runs each job (a call)
in its own process: open one Foundation in the job's entrypoint, on the
job's event loop, and close it when the job ends (``async with
Foundation(store=...)``: about 0.4 ms to open; the process pays turnloom's
import, about 20 MiB resident, which LiveKit's pre-warmed idle processes
hide). Its thread executor runs jobs as threads of one worker process, each
with its own event loop: one Foundation per job thread, since a Foundation
serves one event loop (about 0.5 MiB more per job). Either way the jobs of
one machine share one SQLite store (``sqlite:PATH``) and a fleet shares one
Redis store (``redis://``); each job claims its call's context
(``manager.leases.claim``), and when its process dies the lease expires and
another worker claims and restores the call. Measured by
``scripts/bench_process_model.py``; see the README's "Voice hosts: process
model".

Concurrency: LiveKit Agents runs on asyncio only; so does this adapter. The
Foundation must run on the session's event loop.

Source: livekit-agents 1.8 ``voice/agent.py`` (``llm_node``,
``on_user_turn_completed``, ``update_chat_ctx``), ``llm/chat_context.py``.
"""

from __future__ import annotations

__all__ = ("TurnloomAgent",)

import base64
import logging
from collections import deque
from collections.abc import AsyncIterable, Callable, Sequence
from typing import Any

from livekit.agents import Agent, llm
from livekit.agents.llm import StopResponse
from livekit.agents.llm.utils import serialize_image
from livekit.agents.voice import ModelSettings
from livekit.agents.voice.events import ConversationItemAddedEvent, FunctionToolsExecutedEvent
from livekit.agents.voice.generation import EXPRESSIVE_INSTRUCTIONS_MESSAGE_ID

from turnloom.context import (
    GatewayType,
    ImagePart,
    Message,
    Part,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)
from turnloom.errors import (
    InputError,
    InvalidArgumentError,
    PlayedTextMismatchError,
    StateError,
    UnknownContextError,
)
from turnloom.integrations._ids import new_turn_id
from turnloom.runtime import (
    ContextContribution,
    ContextManager,
    ContextPrepareRequest,
    FoundationClosedError,
    TurnSnapshot,
)

_log = logging.getLogger(__name__)

# LiveKit's flag on the in-progress pair it injects for a tool still running from an
# earlier turn (voice/generation.py ``_RUNNING_PLACEHOLDER_KEY``): not an executed call.
_RUNNING_PLACEHOLDER_KEY = "__lk_running_placeholder__"


class _TurnItems:
    """One remembered turn: its id, LiveKit's id of its user message, the LiveKit item
    ids recorded to it, and the call ids its model calls emitted."""

    __slots__ = ("calls", "recorded", "turn_id", "user_item")

    def __init__(self, turn_id: str, user_item: str) -> None:
        self.turn_id = turn_id
        self.user_item = user_item
        self.recorded: set[str] = set()
        self.calls: set[str] = set()


def _to_chat_ctx(items: tuple[dict[str, Any], ...]) -> llm.ChatContext:
    """OpenAI Chat messages (turnloom's prepared input) as a LiveKit ChatContext."""
    ctx = llm.ChatContext.empty()
    for item in items:
        role = item["role"]
        if role == "tool":
            ctx.insert(
                llm.FunctionCallOutput(
                    call_id=item["tool_call_id"], output=str(item["content"]), is_error=False
                )
            )
            continue
        content = item.get("content")
        if isinstance(content, list):  # text and images (a user's picture), in order
            content = [_chat_content(part) for part in content]
            content = [part for part in content if part is not None]
        if content:
            ctx.add_message(role=role, content=content)
        for call in item.get("tool_calls") or ():
            function = call["function"]
            ctx.insert(
                llm.FunctionCall(
                    call_id=call["id"], name=function["name"], arguments=function["arguments"]
                )
            )
    return ctx


def _chat_content(block: dict[str, Any]) -> str | llm.ImageContent | None:
    """One OpenAI Chat content block as LiveKit content: text, or an image by its URL."""
    if block.get("type") == "image_url":
        image = block["image_url"]
        return llm.ImageContent(image=image["url"], inference_detail=image.get("detail", "auto"))
    text = block.get("text")
    return text if isinstance(text, str) else None


def _user_content(message: llm.ChatMessage) -> str | tuple[Part, ...]:
    """A LiveKit user message's content as turnloom's: its text (LiveKit's
    ``text_content``) when it holds no image; else its texts and images in LiveKit's
    order, an image as its URL, or its JPEG bytes for a ``VideoFrame`` (LiveKit's own
    ``serialize_image``). Audio frames are not kept (their transcript is the text)."""
    if not any(isinstance(c, llm.ImageContent) for c in message.content):
        return message.text_content or ""
    parts: list[Part] = []
    texts: list[str] = []
    for content in message.content:
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, llm.ImageContent):
            if "".join(texts).strip():
                parts.append(TextPart(text="\n".join(texts)))
            texts = []
            parts.append(_image_part(content))
    if "".join(texts).strip():
        parts.append(TextPart(text="\n".join(texts)))
    return tuple(parts)


def _image_part(image: llm.ImageContent) -> ImagePart:
    serialized = serialize_image(image)
    detail = image.inference_detail
    if serialized.external_url is not None:
        return ImagePart(url=serialized.external_url, detail=detail)
    data = base64.b64encode(serialized.data_bytes or b"").decode("ascii")
    return ImagePart(data=data, media_type=serialized.mime_type or "image/jpeg", detail=detail)


class TurnloomAgent(Agent):
    """A LiveKit ``Agent`` whose every model call is prepared by turnloom.

    Args:
        manager: a manager bound to an open Foundation on the session's event
            loop, with the ``openai_chat`` gateway.
        context_id: the call's turnloom context id.
        instructions: the agent's instructions (pinned in turnloom; LiveKit
            gets them too).
        false_start: called with a committed user turn's text; True retracts
            the turn and answers nothing. Default: never.
        framework_items: how many items LiveKit's own ChatContext keeps.
        **kwargs: passed to ``livekit.agents.Agent`` (``tools``, ``llm``, ...).

    Tool calls and barge-ins:
        A function call is recorded to the turn whose model call streamed it
        (the adapter notes its call id from the stream), with its output, when
        the session emits ``function_tools_executed``. On a barge-in LiveKit
        still waits for a running tool, then adds its calls and outputs to its
        ChatContext by creation time: the call before the next user message,
        the output before or after it (``voice/agent_activity.py``: "commit
        results of tools that finished despite the interruption"). They belong
        to an earlier turn than the newest, so they are recorded late to it
        (``manager.record`` to that turn; turnloom drops and counts them when
        it was evicted). Function items after the current turn's user message
        in a model call's context that no event brought are recorded as they
        come, to their call's turn or else the current one. Each LiveKit item
        is recorded once, in LiveKit's order, calls before their results; the
        in-progress placeholder LiveKit injects for a tool still running is
        never recorded. Memory per call is bounded: the current and the
        previous turn only (user message id, recorded item ids, call ids); a
        call streamed two turns ago and executed only later goes to the
        current turn, where turnloom may refuse it (below).

    Refused records:
        When turnloom refuses a record of LiveKit's items (a tool batch or a
        played reply: an ``InputError`` or ``StateError``, e.g.
        ``UnpairedResultError`` for an output whose call LiveKit never added,
        ``TurnTooLargeError``; or ``FoundationClosedError`` after the
        Foundation closed), nothing of that batch is recorded, a warning names
        the error and the turn, and :attr:`record_errors` grows by one; the
        call goes on. Raising instead
        would end the reply inside LiveKit's speech task (or escape its event
        dispatch) over history bookkeeping, and a voice call must not drop for
        that; the warning and the counter leave a trace the host can alert on.

    Teardown in either order:
        A host may close the Foundation before LiveKit's session ends (its
        ``async with Foundation`` exits first). No hook raises into LiveKit
        then: a played reply or executed tool batch is a refused record
        (above); ``on_user_turn_completed`` commits nothing and answers nothing
        (``StopResponse``) and ``llm_node`` streams nothing (no model call;
        also when the Foundation closes while the call's input is prepared),
        each with a warning; :meth:`aclose_context` leaves the context as the
        Foundation left it (in its store, when it has one) with an INFO
        record. :meth:`retract_turn`, the host's own call, raises
        ``FoundationClosedError``.

    Attributes:
        record_errors: how many record batches turnloom refused (see above).
        note_images_dropped: how many images host notes held (a note reaches
            the model as text; see the module docstring, "Host notes").
        late_edits: how many turns' user messages the host edited after this
            class's ``on_user_turn_completed`` committed them (see the module
            docstring: the committed text is kept and sent).

    Raises:
        InvalidArgumentError: the manager's gateway is not ``openai_chat``, or
            ``framework_items`` is not positive.
    """

    def __init__(
        self,
        *,
        manager: ContextManager,
        context_id: str,
        instructions: str,
        false_start: Callable[[str], bool] | None = None,
        framework_items: int = 8,
        **kwargs: Any,
    ) -> None:
        if manager.gateway.type is not GatewayType.openai_chat:
            raise InvalidArgumentError(
                f"TurnloomAgent {context_id!r} needs a manager with the openai_chat gateway, "
                f"not {manager.gateway.type.value}.",
                field="manager",
            )
        if framework_items < 1:
            raise InvalidArgumentError(
                f"TurnloomAgent {context_id!r}: framework_items must be >= 1, "
                f"not {framework_items}.",
                field="framework_items",
            )
        super().__init__(instructions=instructions, **kwargs)
        self.manager = manager
        self.context_id = context_id
        self._system = Message(role=Role.system, content=instructions)
        self._false_start = false_start
        self._framework_items = framework_items
        self._turn: str | None = None  # the newest committed turn (None: retracted)
        self._user_item: str | None = None  # LiveKit's id of that turn's user message
        self._confirmed = True  # LiveKit kept that message (False: a model call's guess)
        self._superseded: set[str] = set()  # user messages of retracted unconfirmed turns
        self._turns: deque[_TurnItems] = deque(maxlen=2)  # the previous and newest turn
        self._streamed: list[str] = []  # the text of the newest model call, as streamed
        self.record_errors = 0
        self.late_edits = 0
        self.note_images_dropped = 0
        self._user_text = ""  # the committed text of the newest turn's user message
        self._user_images = 0  # how many images it had
        self._opening: list[Message] = []  # said with no current turn: the next input opens with it
        self._opened: tuple[str, tuple[Message, ...]] | None = None  # the turn that took it
        self._notes: list[ContextContribution] = []  # the current turn's host notes
        self._noted: set[str] = set()  # LiveKit ids of the messages in _notes
        self._pending: list[llm.ChatMessage] = []  # added by update_chat_ctx, not sent yet
        self._turn_ctx: llm.ChatContext | None = None  # the speech turn's ``turn_ctx``
        self._dropped: set[str] = set()  # ids the adapter's last truncation removed

    # -- LiveKit hooks -------------------------------------------------------------

    async def on_enter(self) -> None:
        """Subscribe to the session's ``conversation_item_added`` (the played replies) and
        ``function_tools_executed`` (the executed tool batches)."""
        self.session.on("conversation_item_added", self._on_item)
        self.session.on("function_tools_executed", self._on_tools)

    async def on_exit(self) -> None:
        """Stop recording for this agent (a handoff or the session's end)."""
        self.session.off("conversation_item_added", self._on_item)
        self.session.off("function_tools_executed", self._on_tools)

    async def on_user_turn_completed(
        self, turn_ctx: llm.ChatContext, new_message: llm.ChatMessage
    ) -> None:
        """Commit the user's finished speech as a turn (and cut LiveKit's own ChatContext to
        ``framework_items``); retract it when it was a false start.

        After the Foundation closed it answers nothing (LiveKit's ``StopResponse``)
        and logs a warning (see the class docstring, "Teardown in either order").
        """
        if self.manager.closed:
            self._warn_closed("the caller's turn is not committed and gets no reply")
            raise StopResponse()
        self._commit(new_message, confirmed=True)
        self._turn_ctx = turn_ctx  # the host's edits of it, made before or after this hook
        if self._false_start is not None and self._false_start(new_message.text_content or ""):
            self.retract_turn()
            raise StopResponse()
        await self._bound()

    async def llm_node(
        self,
        chat_ctx: llm.ChatContext,
        tools: list[llm.Tool],
        model_settings: ModelSettings,
    ) -> AsyncIterable[Any]:
        """Send turnloom's prepared input for the turn instead of LiveKit's own context.

        After the Foundation closed it streams nothing (no model call) and logs a
        warning (see the class docstring, "Teardown in either order").
        """
        if self.manager.closed:
            self._warn_closed("no model call runs")
            return
        user = next((i for i in reversed(chat_ctx.items) if _is_user(i)), None)
        if user is not None and user.id != self._user_item and user.id not in self._superseded:
            assert isinstance(user, llm.ChatMessage)
            self._commit(user, confirmed=False)
            await self._bound()
        elif isinstance(user, llm.ChatMessage) and (
            (user.text_content or "") != self._user_text or _images(user) != self._user_images
        ):
            self._late_edit(user)  # the turn's message, edited after its commit
        turn = self._turn
        if turn is None:  # a greeting before any user turn: LiveKit's context as is
            async for chunk in Agent.default.llm_node(self, chat_ctx, tools, model_settings):
                yield chunk
            return
        current = self._turns[-1]
        self._record_tools(chat_ctx, current)
        own = self._take_notes(chat_ctx)
        try:
            prefix = await self.manager.prepare(
                ContextPrepareRequest(
                    context_id=self.context_id, turn_id=turn, contributions=tuple(self._notes)
                )
            )
        except FoundationClosedError:  # it began closing while the input was prepared
            self._warn_closed("no model call runs")
            return
        items = self.manager.build(prefix, recorded=True)  # the turn's outputs so far
        ctx = _to_chat_ctx(items)
        ctx.items.extend(own)  # this call's own system messages, last, as LiveKit sends them
        self._streamed = []
        async for chunk in Agent.default.llm_node(self, ctx, tools, model_settings):
            text = chunk if isinstance(chunk, str) else None
            if isinstance(chunk, llm.ChatChunk) and chunk.delta is not None:
                text = chunk.delta.content
                current.calls.update(call.call_id for call in chunk.delta.tool_calls or ())
            if text:
                self._streamed.append(text)
            yield chunk

    async def update_chat_ctx(
        self, chat_ctx: llm.ChatContext, *, exclude_invalid_function_calls: bool = True
    ) -> None:
        """LiveKit's ``update_chat_ctx``; the messages it adds become host notes.

        A text message (any role) that ``chat_ctx`` holds and the agent's
        ``ChatContext`` did not reaches the model as a contribution of the next
        model call's turn (see the module docstring, "Host notes"); a user
        message that the next model call answers as the caller's turn is that
        turn's input instead. Removed items are LiveKit's business only.
        """
        old = {item.id for item in self.chat_ctx.items}
        new = {item.id for item in chat_ctx.items}
        self._dropped |= old - new
        self._pending.extend(
            item
            for item in chat_ctx.items
            if isinstance(item, llm.ChatMessage) and item.id not in old and _is_note(item)
        )
        await super().update_chat_ctx(
            chat_ctx, exclude_invalid_function_calls=exclude_invalid_function_calls
        )

    async def update_instructions(self, instructions: str) -> None:
        """LiveKit's ``update_instructions``; turnloom pins the new instructions from the
        caller's next turn on (``TurnSnapshot.instructions``): the model calls of a turn
        already committed keep the instructions it was committed with."""
        await super().update_instructions(instructions)
        self._system = Message(role=Role.system, content=instructions)

    # -- turnloom edits ------------------------------------------------------------

    def retract_turn(self) -> None:
        """Take back the newest user turn (a false start: ``manager.voice.retract_turn``).

        Raises:
            StateError: outputs were recorded for it: as ``manager.voice.retract_turn``.
            FoundationClosedError: the Foundation is closing or closed.
        """
        if self._turn is not None:
            self.manager.voice.retract_turn(self.context_id, self._turn)
            if self._opened is not None and self._opened[0] == self._turn:
                self._opening = list(self._opened[1])  # the next turn opens with it
                self._opened = None
            self._turn = None

    def aclose_context(self) -> None:
        """The call ended: remove its context (``manager.remove_context``); idempotent.

        After the Foundation closed it raises nothing: the context stays as the
        Foundation left it (in its store, when it has one), and an INFO record
        says so.
        """
        try:
            self.manager.remove_context(self.context_id)
        except UnknownContextError:
            pass
        except FoundationClosedError:
            _log.info(
                "TurnloomAgent %r: the call's context was not removed: the Foundation closed "
                "first; it stays as the Foundation left it (in its store, if it has one).",
                self.context_id,
            )
        self._turn = None

    # -- helpers -------------------------------------------------------------------

    def _commit(self, message: llm.ChatMessage, *, confirmed: bool) -> None:
        """Commit ``message`` as the newest turn; an unconfirmed newest turn (committed by
        a model call, its message not yet kept by LiveKit, nothing recorded to it: a
        preemptive generation's guess) is retracted first, and its message answers to the
        new turn."""
        if message.id == self._user_item:
            return
        if self._turn is not None and not self._confirmed and not self._turns[-1].recorded:
            self._superseded.add(self._user_item or "")
            self.retract_turn()
            self._turns.pop()  # its streamed calls go to the new turn (the current one)
        elif self._turn is not None:
            self._superseded.clear()
        turn_id = new_turn_id()
        self.manager.accept_turn(
            TurnSnapshot(
                context_id=self.context_id,
                turn_id=turn_id,
                instructions=(self._system,),
                input=(
                    *self._opening,
                    Message(role=Role.user, content=_user_content(message)),
                ),
            )
        )
        self._notes, self._noted, self._dropped = [], set(), set()
        self._turn_ctx = None
        if self._opening:  # the turn that took the greeting gives it back when retracted
            self._opened = (turn_id, tuple(self._opening))
            self._opening.clear()
        self._turn, self._user_item, self._confirmed = turn_id, message.id, confirmed
        self._user_text = message.text_content or ""
        self._user_images = _images(message)
        self._turns.append(_TurnItems(turn_id, message.id))

    async def _bound(self) -> None:
        """Cut LiveKit's own ChatContext to the newest ``framework_items`` items."""
        await self.update_chat_ctx(self.chat_ctx.copy().truncate(max_items=self._framework_items))

    def _late_edit(self, user: llm.ChatMessage) -> None:
        """The committed user message was edited after its commit: warn and count, once."""
        self.late_edits += 1
        _log.warning(  # lengths, not the caller's words
            "TurnloomAgent %r: LiveKit's user message %r was edited after turn %r was "
            "committed; turnloom keeps the committed text (%d characters), not the edit "
            "(%d characters)%s: edit new_message before calling "
            "TurnloomAgent.on_user_turn_completed",
            self.context_id,
            user.id,
            self._turn,
            len(self._user_text),
            len(user.text_content or ""),
            (
                f" (images: {self._user_images} committed, {_images(user)} in the edit)"
                if _images(user) != self._user_images
                else ""
            ),
        )
        self._user_text = user.text_content or ""
        self._user_images = _images(user)

    def _warn_closed(self, outcome: str) -> None:
        """A LiveKit hook ran after the Foundation closed: say what it did instead."""
        _log.warning(
            "TurnloomAgent %r: the Foundation closed before LiveKit's session ended; %s.",
            self.context_id,
            outcome,
        )

    def _take_notes(self, chat_ctx: llm.ChatContext) -> list[llm.ChatMessage]:
        """Add to the current turn's notes the host's messages in this model call's
        context (``turn_ctx`` edits) and those ``update_chat_ctx`` added, once each, in
        LiveKit's order.

        Returns this model call's own system messages, in LiveKit's order: its reply's
        instructions (``generate_reply(instructions=...)``: a ``system`` message that
        neither the agent's ``ChatContext`` nor the speech turn's ``turn_ctx`` holds)
        and LiveKit's expressive TTS guide (``lk.expressive.instructions``). LiveKit
        puts them in this reply's model calls only, so they are never notes.
        """
        known = {item.id for item in self.chat_ctx.items} | self._dropped
        turn_ctx = {i.id for i in self._turn_ctx.items} if self._turn_ctx is not None else set()
        found: list[llm.ChatMessage] = []
        own: list[llm.ChatMessage] = []
        for item in chat_ctx.items:
            if not isinstance(item, llm.ChatMessage):
                continue
            if item.id == EXPRESSIVE_INSTRUCTIONS_MESSAGE_ID:
                own.append(item)
            elif item.id not in known and _is_note(item):
                mine = item.role == "system" and item.id not in turn_ctx
                (own if mine else found).append(item)
        pending, self._pending = self._pending, []
        for item in (*found, *pending):
            if item.id in self._noted or item.id == self._user_item:
                continue  # the caller's turn is the turn's input, not a note
            self._noted.add(item.id)
            if _images(item):
                self._drop_note_images(item)
            if (item.text_content or "").strip():
                name = f"{item.role}_message_{len(self._notes) + 1}"
                self._notes.append(ContextContribution(name=name, content=item.text_content or ""))
        return own

    def _drop_note_images(self, item: llm.ChatMessage) -> None:
        """A host note's images cannot reach the model (a note is text): count them; warn
        the first time in the call."""
        self.note_images_dropped += _images(item)
        if self.note_images_dropped == _images(item):
            _log.warning(
                "TurnloomAgent %r: a host note (LiveKit message %r) holds %d image(s), which "
                "turnloom does not send (a note is text); add an image to the caller's "
                "new_message before calling TurnloomAgent.on_user_turn_completed instead. "
                "Counted in note_images_dropped.",
                self.context_id,
                item.id,
                _images(item),
            )

    def _record_tools(self, chat_ctx: llm.ChatContext, current: _TurnItems) -> None:
        """Record the function items after the current turn's user message, once each."""
        items = chat_ctx.items
        ids = {current.user_item} | self._superseded  # a used preemptive guess's message too
        start = next((n for n in range(len(items) - 1, -1, -1) if items[n].id in ids), -1)
        self._record_items(items[start + 1 :])

    def _on_tools(self, event: FunctionToolsExecutedEvent) -> None:
        """Record an executed batch (a barge-in's too) to the turns that streamed its calls."""
        self._record_items([*event.function_calls, *event.function_call_outputs])

    def _record_items(self, items: Sequence[llm.ChatItem]) -> None:
        """Record the function calls and outputs among ``items`` not recorded yet, each to
        its call's remembered turn (else the current one), the older turn first."""
        batches: dict[int, list[llm.FunctionCall | llm.FunctionCallOutput]] = {}
        turns = list(self._turns)
        running = {  # LiveKit injects a placeholder pair only for a call missing from items
            i.call_id
            for i in items
            if isinstance(i, llm.FunctionCall) and i.extra.get(_RUNNING_PLACEHOLDER_KEY)
        }
        for item in items:
            if not isinstance(item, llm.FunctionCall | llm.FunctionCallOutput):
                continue
            if item.call_id in running or any(item.id in turn.recorded for turn in turns):
                continue
            # The newest turn that streamed the id: models that number calls per
            # response reuse ids, and a call belongs to the model call that made it last.
            owner = next(
                (n for n in range(len(turns) - 1, -1, -1) if item.call_id in turns[n].calls), None
            )
            if owner is None:
                if self._turn is None:
                    continue  # a greeting's tools, or a retracted turn's: no turn to own them
                owner = len(turns) - 1
            batches.setdefault(owner, []).append(item)
        for n in sorted(batches):
            self._record_batch(turns[n], batches[n])

    def _record_batch(
        self, turn: _TurnItems, items: list[llm.FunctionCall | llm.FunctionCallOutput]
    ) -> None:
        calls = [i for i in items if isinstance(i, llm.FunctionCall)]
        outputs = [i for i in items if isinstance(i, llm.FunctionCallOutput)]
        messages: list[Message] = []
        for call in calls:
            part: Any = ToolCallPart(call_id=call.call_id, name=call.name, arguments=call.arguments)
            messages.append(Message(role=Role.assistant, content=(part,)))
        for out in outputs:
            part = ToolResultPart(
                call_id=out.call_id, content=(TextPart(text=out.output),), is_error=out.is_error
            )
            messages.append(Message(role=Role.tool, content=(part,)))
        if self._record(turn.turn_id, messages, [i.id for i in items]):
            turn.recorded.update(i.id for i in items)

    def _record(self, turn_id: str, messages: list[Message], ids: list[str]) -> bool:
        """Record ``messages`` (LiveKit's items ``ids``) to ``turn_id``; False when turnloom
        refused them: counted and logged (see the class docstring, "Refused records")."""
        try:
            self.manager.record(self.context_id, turn_id, messages)
        except (InputError, StateError, FoundationClosedError) as exc:
            # Keep the voice call alive; leave a trace (see the class docstring).
            self.record_errors += 1
            _log.warning(
                "TurnloomAgent %r: turnloom refused LiveKit's items %s for turn %r: %r",
                self.context_id,
                ids,
                turn_id,
                exc,
            )
            return False
        return True

    def _on_item(self, event: ConversationItemAddedEvent) -> None:
        item = event.item
        if isinstance(item, llm.ChatMessage) and item.role == "user":
            if item.id == self._user_item:
                self._confirmed = True  # LiveKit kept the turn's message: it stands
            return
        if not isinstance(item, llm.ChatMessage) or item.role != "assistant":
            return
        if self._turn is None:
            if (item.text_content or "").strip():
                # What the agent said with no turn to answer (a greeting before the
                # caller's first turn, a line after a false start was retracted): the
                # next turn's input opens with it.
                text = item.text_content or ""
                self._opening.append(Message(role=Role.assistant, content=(TextPart(text=text),)))
            return
        if item.id in self._turns[-1].recorded:
            return
        self._turns[-1].recorded.add(item.id)
        text = item.text_content or ""  # interrupted: only what was played
        streamed = "".join(self._streamed)
        if item.interrupted and streamed.strip():
            # The model's own words, cut where the played transcript ends (LiveKit's
            # TTS-aligned transcript may spell numbers or titles out).
            output = Message(role=Role.assistant, content=(TextPart(text=streamed),))
            try:
                self.manager.voice.record_interrupted(
                    self.context_id, self._turn, output, played_text=text
                )
                return
            except (PlayedTextMismatchError, FoundationClosedError):
                # Not this reply's words: record what LiveKit says was played (or the
                # Foundation closed: that record is refused and counted, below).
                pass
        if text.strip():
            reply = Message(role=Role.assistant, content=(TextPart(text=text),))
            self._record(self._turn, [reply], [item.id])


def _is_note(item: llm.ChatMessage) -> bool:
    """A message with text or images that LiveKit itself did not inject (its ids start
    ``lk.``: its instructions, which turnloom pins, and its expressive TTS guide, which
    :meth:`TurnloomAgent._take_notes` hands back to its model call)."""
    return not item.id.startswith("lk.") and (
        bool((item.text_content or "").strip()) or bool(_images(item))
    )


def _images(message: llm.ChatMessage) -> int:
    return sum(isinstance(c, llm.ImageContent) for c in message.content)


def _is_user(item: llm.ChatItem) -> bool:
    return isinstance(item, llm.ChatMessage) and item.role == "user"

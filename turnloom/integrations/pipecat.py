"""A Pipecat context aggregator pair whose LLM context is turnloom's prepared input.

Pipecat's way to hold a conversation is an ``LLMContext`` shared by a
context aggregator pair: the user aggregator (after STT) writes the user's
finished turn and pushes an ``LLMContextFrame`` to the LLM service; the
assistant aggregator (after the output transport) writes what the TTS spoke
(its ``TTSTextFrame``\\ s, as the transport plays them), the function calls
and their results, and pushes the context back upstream when a result needs
another inference. :class:`TurnloomContextAggregatorPair` is that pair, built
on Pipecat's own aggregators (turn detection, interruptions, function-call
bookkeeping unchanged), with turnloom as the one source of truth:

* whenever either aggregator pushes its context to the LLM, what Pipecat's
  aggregators wrote since the last push is taken into turnloom: a user
  message commits a turn (``manager.accept_turn``); assistant text, function
  calls and their (final) results are recorded to it (``manager.record``).
  What the bot said before the first user turn (the host's greeting, run
  with an ``LLMRunFrame`` before the caller speaks) stays in Pipecat's
  context and opens the first turn's input, so the model always reads it.
  Then the ``LLMContext`` is *replaced* by turnloom's input for the turn
  (``manager.prepare`` once per turn, then ``manager.build(prefix,
  recorded=True)``), in OpenAI Chat shape, Pipecat's standard message shape:
  every LLM service's adapter converts it (Anthropic's included). So the LLM
  never reads anything turnloom did not prepare, and Pipecat's own context
  stays bounded by turnloom's history limits.
* the instructions go where Pipecat 1.9+ wants them: on the LLM service,
  never in the context. The leading run of ``system`` items of turnloom's
  input (its pinned instructions; before the first turn, the pair's
  ``instructions``) is left out of the ``LLMContext`` and handed to the LLM
  service as its ``system_instruction``, by an ``LLMUpdateSettingsFrame``
  pushed just before the ``LLMContextFrame`` (same direction, both frames
  in order, so the inference it starts reads it). Pipecat then composes its
  own additions after it (``append_system_instruction``, turn-completion and
  async-tool guidance) and each provider's adapter places it (OpenAI: a
  leading ``system`` message; Anthropic, Gemini: their top-level field).
  A ``system`` message in the context is deprecated since Pipecat 1.9
  (``_warn_context_system_message``), and a provider with a separate system
  field drops it when the service has a ``system_instruction``
  (``_resolve_system_instruction``). The frame is sent on the call's first
  inference and whenever turnloom's instructions change; it replaces the
  service's *base* instruction, so a ``system_instruction`` the host gave the
  service is overridden: the pair's ``instructions`` are the prompt. The
  frame sets ``reach_inactive_services`` so that every service of a
  ``ServiceSwitcher`` (an ``LLMSwitcher``) holds the instructions.
* the reply is what the user heard: the assistant aggregator collects
  ``TTSTextFrame``\\ s as the output transport plays them, and on Pipecat's
  ``InterruptionFrame`` (a barge-in) it writes only what was played so far;
  that is what turnloom records.
* a false start: the ``false_start`` hook sees each finished user turn's
  text; True keeps the turn out of turnloom (it is never committed), takes it
  out of Pipecat's context and runs no inference. A blank transcript is
  never committed either. A user message is taken as turnloom's OpenAI Chat
  gateway parses it: its text and its images (Pipecat's vision frames).
* the pipeline's end (``EndFrame``, or ``CancelFrame``: the caller hung up,
  even while the model streams) removes the context
  (``manager.remove_context``: idempotent, and it cancels a preparation in
  flight for it).
* teardown in either order: when the host closes the Foundation first (its
  ``async with Foundation`` exits before the pipeline's end), the pair's
  cleanup raises nothing into Pipecat's teardown: the context is left as
  the Foundation left it (in its store, when it has one; an INFO record
  says so), and a push after the close (the caller's words Pipecat's user
  aggregator flushes on ``EndFrame``, a function's result) is not taken
  and runs no inference (a warning says so).

A result Pipecat still shows as ``IN_PROGRESS`` is not recorded until it is
final, nor is its call (the assistant message holding it) nor what its turn
wrote after it: they stay in Pipecat's context after turnloom's input, as
Pipecat holds them, so an inference run meanwhile (the caller's next turn,
while a slow call of a parallel batch runs) reads the call before its
placeholder. A user message behind them does not wait (after the first
turn): its turn is committed at once, so the reply to it, and whatever
follows, is recorded to it as it comes; the waiting call, its result and the
rest of its turn's outputs are recorded together to the turn that made the
call once the result is final (before that reply is recorded or after).
Until then each inference reads Pipecat's own messages from the waiting call
on (the call, its placeholder, the question, in Pipecat's order), and the
new turn's prepared input (areas, runtime state) is first sent once the call
settles. Before the first turn a user message waits with the call, as the
greeting's calls open the first turn's input.
An asynchronous function call (registered with ``cancel_on_interruption=False``)
is recorded as the model saw it: Pipecat's "started" placeholder is the
call's result, and its later results (Pipecat's developer messages: each
intermediate result, then the final one or the notice of its cancellation)
are recorded, in order, to the turn current when they arrive, each as a
``user`` message of the developer message's text, as Pipecat's Anthropic,
Bedrock and realtime adapters convert a developer message (turnloom keeps
instructions out of the middle of a conversation). A result Pipecat writes
over a placeholder turnloom already took (the call finished before the
conversation moved on, after an inference that sent the placeholder) is
recorded the same way, as Pipecat's final-result message.

Refused messages: a message of Pipecat's context that turnloom refuses (a
user turn or an output over the history's limits, ``ItemTooLargeError``; any
``InputError`` or ``StateError`` of its commit or record) is left out of the
call's context, a warning names the error, and
:attr:`TurnloomContextAggregatorPair.record_errors` grows by one; the rest of
the push is taken, and the call goes on. (Raised instead, it would end
the push inside Pipecat's aggregator, and the message, still pending, would
be refused again at every later push.) A refused user message commits no
turn, so its push runs no inference unless something else owes one.

A service's own message (an ``LLMSpecificMessage``: Gemini's thought
signatures, a thought a service appends to the context) has no
provider-neutral form: it is left out of the call's context, counted in
:attr:`TurnloomContextAggregatorPair.specific_messages_dropped`, and the
first one of a call logs a warning (Pipecat's Gemini adapter signs the calls
it finds unsigned with its placeholder signature).

A note the host appends (``LLMMessagesAppendFrame``: a ``system`` or
``developer`` message, as Pipecat's idle handling and greetings do; so are
Pipecat's own empty-turn prompt and tool-change notes) is recorded to the
current turn as a ``user`` message of its text, the same conversion (one
appended from another task while turnloom prepares the turn's input stays in
Pipecat's context, after that input, and the next push records it); before
the first user turn it opens that turn's input, and Pipecat's context holds
it in that shape already, so every inference reads it alike. Every push
runs the inference Pipecat runs for it (a host's ``LLMRunFrame`` or
``run_llm=True`` mid-call included) but a false start's; a false start's
push that brings a function's result (held back while the caller spoke:
an asynchronous call's result, before the first user turn too) still runs
it, so the model is told the result. The context is
turnloom's: ``LLMMessagesUpdateFrame`` and ``LLMMessagesTransformFrame``,
which would rewrite what turnloom holds, are refused, changing nothing, with
an InvalidArgumentError that Pipecat pushes as an ``ErrorFrame`` (the
worker's ``on_pipeline_error``); change the conversation through the
manager. Realtime (speech-to-speech) services are
not supported: the pair forces ``realtime_service_mode=False``.

Process model: a Foundation per process, shared by every pipeline the
process runs (one manager, one worker-thread limiter, one store connection);
each call is a context (``context_id``). Across processes or machines, the
calls share one store: SQLite on one machine, Redis for a fleet, with leases
(``manager.leases``) handing a call over when its process dies. See the
README's "Voice hosts: process model" section and
``scripts/bench_process_model.py``.

Concurrency: Pipecat runs on asyncio only; so does this adapter. The
Foundation must run on the pipeline's event loop.

Source: pipecat-ai 1.14 ``processors/aggregators/llm_response_universal.py``
(``LLMUserAggregator``, ``LLMAssistantAggregator``,
``LLMContextAggregatorPair``, ``push_context_frame``),
``processors/aggregators/llm_context.py`` (``LLMContext``),
``services/llm_service.py`` (``_compose_system_instruction``,
``_update_settings``), ``frames/frames.py`` (``ServiceUpdateSettingsFrame``:
a ``ControlFrame``, not interruptible), ``adapters/llm/base_llm_adapter.py``
(``_warn_context_system_message``, ``_resolve_system_instruction``).
"""

from __future__ import annotations

__all__ = ("TurnloomAssistantAggregator", "TurnloomContextAggregatorPair", "TurnloomUserAggregator")

import logging
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, cast

import anyio
from pipecat.frames.frames import (
    LLMMessagesTransformFrame,
    LLMMessagesUpdateFrame,
    LLMUpdateSettingsFrame,
)
from pipecat.processors.aggregators import async_tool_messages
from pipecat.processors.aggregators.llm_context import LLMContext, LLMSpecificMessage
from pipecat.processors.aggregators.llm_response_universal import (
    LLMAssistantAggregator,
    LLMAssistantAggregatorParams,
    LLMUserAggregator,
    LLMUserAggregatorParams,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.settings import LLMSettings

from turnloom.context import GatewayType, Message, Role, TextPart, ToolCallPart, ToolResultPart
from turnloom.context.message import is_blank_part
from turnloom.errors import (
    ContextRemovedError,
    InputError,
    InvalidArgumentError,
    StateError,
    TurnloomError,
    UnknownTurnError,
)
from turnloom.integrations._ids import new_turn_id
from turnloom.runtime import (
    ContextManager,
    ContextPrepareRequest,
    FoundationClosedError,
    PreparedContext,
    TurnSnapshot,
)

_log = logging.getLogger(__name__)

# Pipecat's placeholder content of a function call whose result has not arrived.
_IN_PROGRESS = "IN_PROGRESS"


def _text(content: Any) -> str:
    """The text of an OpenAI-shaped message content (a str or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def _outputs(message: dict[str, Any]) -> list[Message]:
    """A message Pipecat holds, as turnloom messages (none when blank).

    A user message is its text. A system or developer message (a host's
    note appended with ``LLMMessagesAppendFrame``, an asynchronous call's
    later result, Pipecat's empty-turn prompt) is a ``user`` message of its
    text, as Pipecat's Anthropic, Bedrock and realtime adapters convert one
    after the conversation's start.
    """
    role = message["role"]
    if role == "system" or role == "developer" or role == "user":
        text = _text(message.get("content"))
        return [Message(role=Role.user, content=text)] if text.strip() else []
    if role == "tool":
        part = ToolResultPart(
            call_id=message["tool_call_id"], content=(TextPart(text=_text(message["content"])),)
        )
        return [Message(role=Role.tool, content=(part,))]
    parts: list[Any] = []
    text = _text(message.get("content"))
    if text.strip():
        parts.append(TextPart(text=text))
    for call in message.get("tool_calls") or ():
        function = call["function"]
        parts.append(
            ToolCallPart(
                call_id=call["id"], name=function["name"], arguments=function["arguments"] or "{}"
            )
        )
    return [Message(role=Role.assistant, content=tuple(parts))] if parts else []


def _take_async(message: Any, running: dict[str, str]) -> bool:
    """Note an asynchronous call's placeholder in ``running`` (call id -> its text), or
    forget a finished call; True when ``message`` is a function's result that Pipecat
    runs an inference for.

    Such a result is a ``tool`` message with a result (not an asynchronous call's
    "started" placeholder, nor the ``CANCELLED`` of a call an interruption cancelled),
    or an asynchronous call's later result (intermediate, final, or the notice of its
    cancellation).
    """
    payload = async_tool_messages.parse_message(message)
    if payload is None:
        return bool(message.get("role") == "tool" and message.get("content") != "CANCELLED")
    if payload.kind == "started":
        running[payload.tool_call_id] = _text(message.get("content"))
        return False
    if payload.kind == "final":
        running.pop(payload.tool_call_id, None)
    return True


def _settled_in_place(messages: list[Any], running: dict[str, str]) -> Iterator[tuple[str, str]]:
    """``(call id, result)`` of each call of ``running`` whose tool message in ``messages``
    Pipecat wrote its result over (its text is no longer the placeholder's); each is
    forgotten from ``running`` as it is yielded."""
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != "tool":
            continue
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or call_id not in running:
            continue
        result = _text(message.get("content"))
        if result != running[call_id]:
            del running[call_id]
            yield call_id, result


def _in_progress_start(messages: list[Any]) -> int:
    """The index of the first message to leave in Pipecat's context for now: the
    assistant message holding the call of the first tool message whose result is still
    ``IN_PROGRESS`` (the tool message itself when no earlier message holds the call);
    ``len(messages)`` when no result is in progress."""
    for index, message in enumerate(messages):
        if not (
            isinstance(message, dict)
            and message.get("role") == "tool"
            and message.get("content") == _IN_PROGRESS
        ):
            continue
        call_id = message.get("tool_call_id")
        for start in range(index - 1, -1, -1):
            held = messages[start]
            if isinstance(held, dict) and held.get("role") == "assistant":
                if any(c.get("id") == call_id for c in held.get("tool_calls") or ()):
                    return start
        return index
    return len(messages)


def _is_user(message: Any) -> bool:
    return isinstance(message, dict) and message.get("role") == "user"


def _held(messages: list[Any]) -> list[bool]:
    """For each of ``messages`` (what Pipecat wrote since the last sync), whether it waits
    in Pipecat's context for a call still ``IN_PROGRESS``.

    Each run of messages between user messages (a turn's outputs) waits from the message
    holding its first call still in progress (:func:`_in_progress_start`) to its end; a
    user message never waits, so a turn said while a call of the previous one runs is
    taken at once, and so is what answers it.
    """
    held = [False] * len(messages)
    start = 0
    for end in [*(i for i, m in enumerate(messages) if _is_user(m)), len(messages)]:
        run = messages[start:end]
        for index in range(start + _in_progress_start(run), end):
            held[index] = True
        start = end + 1
    return held


def _user_dict(message: Message) -> dict[str, Any]:
    """A ``user`` Message of text, in Pipecat's (OpenAI Chat) message shape."""
    return {"role": "user", "content": message.text}


def _split_instructions(items: tuple[Any, ...]) -> tuple[str | None, list[Any]]:
    """The leading ``system`` items' text (joined by a blank line, as Pipecat composes)
    and the items after them; None when there is no leading system item.

    The same leading run turnloom's Anthropic and Gemini bodies move to their
    system field.
    """
    lead = 0
    while lead < len(items) and items[lead].get("role") == "system":
        lead += 1
    if not lead:
        return None, list(items)
    return "\n\n".join(_text(item.get("content")) for item in items[:lead]), list(items[lead:])


class _Took(NamedTuple):
    """What :meth:`_Conversation._take` took: how many user messages (and of them, turns
    committed), whether a function's result came (an inference is owed), the messages
    staying in Pipecat's context already taken (with the turn each user message of them
    committed), the false starts and blank user messages to remove from it, and the turn
    the first waiting message belongs to."""

    users: int
    new_turn: int
    owed: bool
    taken: list[tuple[Any, str | None]]
    dropped: list[Any]
    region: str | None


class _Conversation:
    """One call's state shared by the pair: its context id, turn, prefix and Pipecat context."""

    def __init__(
        self,
        manager: ContextManager,
        context_id: str,
        instructions: str,
        false_start: Callable[[str], bool] | None,
        context: LLMContext,
    ) -> None:
        self.manager = manager
        self.context_id = context_id
        self.system = Message(role=Role.system, content=instructions)
        # The LLM service's system instruction: turnloom's leading system items
        # at the last sync (the pair's instructions before the first turn), and
        # what this pair last handed the service (None: nothing yet).
        self.instruction: str | None = instructions
        self.sent: tuple[str | None] | None = None
        self.false_start = false_start
        self.context = context
        self.turn: str | None = None  # the newest committed turn
        # What the bot said before the first user turn (a greeting, its tool
        # calls and results), as Pipecat wrote it: the first turn's input starts
        # with it, taken when that turn is committed (until then Pipecat may
        # settle a call's result in place).
        self.opening_raw: list[Any] = []
        self.reply_turn: str | None = None  # the turn the reply being spoken answers
        self.prefix: PreparedContext | None = None
        # The first ``synced`` messages of Pipecat's context are turnloom's input;
        # what Pipecat's aggregators append after them is not in turnloom yet.
        self.synced = 0
        # Messages after ``synced`` already taken into turnloom while an earlier one
        # waits for a call in progress (a user turn said meanwhile, and what answers
        # it), each with the turn it committed (a user message; None: a false start
        # or another message); ``behind``: the turn the waiting messages before the
        # first of them belong to (None when nothing after ``synced`` was taken).
        self.taken: list[tuple[Any, str | None]] = []
        self.behind: str | None = None
        # Asynchronous calls (``cancel_on_interruption=False``) whose recorded
        # result is Pipecat's "started" placeholder: call id -> its text.
        self.running: dict[str, str] = {}
        # The same, for the placeholders of calls made before the first user
        # turn (still Pipecat's own messages in ``opening_raw``).
        self.opening_running: dict[str, str] = {}
        self.closed = False
        self.dropped_specific = 0  # LLMSpecificMessages left out (see _drop_specific)
        self.record_errors = 0  # messages turnloom refused (see _take_one)
        self.created = False  # a turn was committed: the context exists
        self.lock = anyio.Lock()

    async def sync(self) -> bool:
        """Take what Pipecat wrote into turnloom, then make Pipecat's context turnloom's input.

        One sync at a time (the two aggregators run in their own tasks).
        Returns False when no inference must run: the call ended, or every
        user message taken was a false start (or blank) and no function
        result came with them (a result Pipecat held back while the caller
        spoke: a tool message's result, settled in place over an asynchronous
        call's placeholder included, or an asynchronous call's later result).
        Any other push runs one, as Pipecat's does: a finished user turn, a
        function result, and a host's ``LLMRunFrame`` or
        ``LLMMessagesAppendFrame(run_llm=True)``.
        """
        async with self.lock:
            if self.closed:
                return False
            if not self.manager.closed:
                try:
                    return await self._sync()
                except FoundationClosedError:
                    pass  # it began closing meanwhile
            # The host closed the Foundation before the pipeline ended (its
            # ``async with Foundation`` exited first): the call is over here.
            _log.warning(
                "Context %r: the Foundation closed before the Pipecat pipeline ended; what "
                "the pipeline wrote since the last inference is not taken into turnloom, "
                "and no inference runs.",
                self.context_id,
            )
            self.close()
            return False

    async def _sync(self) -> bool:
        """:meth:`sync`'s work, under its lock.

        Raises:
            FoundationClosedError: the Foundation began closing while it ran.
        """
        held = self.context.get_messages()
        pending = list(held[self.synced :])
        # A function's result taken now: Pipecat owes it an inference, which
        # a false start in the same push does not cancel.
        owed = bool(self.running) and self._take_settled(held[: self.synced])
        owed = self._opening_settled() or owed
        # A call whose result is still IN_PROGRESS waits with the rest of its turn's
        # outputs, from the message holding the call: recorded alone, the call would be
        # left out of turnloom's input (an open call) and its placeholder stay behind it.
        # A user message behind it does not wait (after the first turn): its turn is
        # committed now, so the reply to it is recorded to it; the waiting outputs are
        # recorded to their own turn once the call settles.
        if self.turn is None:
            hold = _in_progress_start(pending)
            waits = [index >= hold for index in range(len(pending))]
        else:
            waits = _held(pending)
        stay = waits.index(True) if True in waits else len(pending)
        took = self._take(pending, waits, stay)
        users, new_turn, taken, dropped = took.users, took.new_turn, took.taken, took.dropped
        owed = took.owed or owed
        if dropped:
            self.context.set_messages(
                [m for m in self.context.get_messages() if all(m is not d for d in dropped)]
            )
        if taken:
            # A turn said while a call of an earlier one runs waits with that call in
            # Pipecat's context, taken: the inference reads Pipecat's own messages there,
            # in Pipecat's order (the call, its placeholder, the question).
            self.synced += stay
            self.taken, self.behind = taken, took.region
            return not (users and not new_turn and not owed)
        self.taken, self.behind = [], None
        pending = [m for m in pending[stay:] if all(m is not d for d in dropped)]
        if users and not new_turn and not owed:
            self.context.set_messages([*self.context.get_messages()[: self.synced], *pending])
            return False
        if self.turn is None:  # before the first user turn: Pipecat's own messages
            self.context.set_messages([*self.opening_raw, *pending])
            self.synced = len(self.opening_raw)
            return True
        read: set[int] = set()  # the messages Pipecat held before the await below
        if self.prefix is None:
            read = {id(m) for m in self.context.get_messages()}
            try:
                self.prefix = await self.manager.prepare(
                    ContextPrepareRequest(context_id=self.context_id, turn_id=self.turn)
                )
            except (ContextRemovedError, UnknownTurnError):
                return False  # the call ended (or the turn was retracted) meanwhile
        items = self.manager.build(self.prefix, recorded=True)
        self.instruction, messages = _split_instructions(cast(tuple[Any, ...], items))
        # What Pipecat appended while the input was prepared (from another task:
        # its empty-turn recovery after a stop strategy's timer ended the turn)
        # stays, after ``pending``: the next push takes it.
        late = [m for m in self.context.get_messages() if id(m) not in read] if read else []
        self.context.set_messages([*messages, *pending, *late])
        self.synced = len(messages)
        return True

    def _take(self, pending: list[Any], waits: list[bool], stay: int) -> _Took:
        """Take into turnloom what Pipecat wrote since the last sync (``pending``), in order,
        but the messages that wait (``waits``) and those taken before: commit each user
        message's turn, record the outputs to their turn. ``stay``: the index of the first
        message that stays in Pipecat's context (the first that waits).

        Raises:
            FoundationClosedError: the Foundation began closing meanwhile.
        """
        users = new_turn = 0
        owed = False
        was_taken = {id(message): turn for message, turn in self.taken}
        # The last user message taken before: what follows it is new (its outputs are
        # recorded as any reply's); what waited before a later one is its turn's.
        last = max(
            (i for i, m in enumerate(pending) if was_taken.get(id(m)) is not None), default=-1
        )
        taken: list[tuple[Any, str | None]] = []  # taken now or before, staying in Pipecat's
        dropped: list[Any] = []  # a false start or blank user message staying there: removed
        owner = self.behind  # the turn to record to; None: the reply's (see _record)
        region = self.behind
        for index, message in enumerate(pending):
            if index == stay:
                region = owner or self.reply_turn or self.turn
            stays = index >= stay
            if id(message) in was_taken:
                turn = was_taken[id(message)]
                if turn is not None:
                    owner = turn if index < last else None
                if stays:
                    taken.append((message, turn))
                continue
            if waits[index]:
                continue
            if isinstance(message, LLMSpecificMessage) or not isinstance(message, dict):
                self._drop_specific(message)  # another service's own message: not turnloom's
                if stays:
                    taken.append((message, None))
                continue
            role = message.get("role")
            if role == "user":
                users += 1
                said = self._user_message(cast(dict[str, Any], message))
                if said is None or (self.false_start is not None and self.false_start(said.text)):
                    if stays:
                        dropped.append(message)
                    continue  # never committed: a false start leaves no turn
                if not self._take_one(message, self._commit, said):
                    if stays:
                        dropped.append(message)
                    continue  # refused: counted and logged, and it leaves the context
                new_turn += 1
                owner = None
                if stays:
                    taken.append((message, self.turn))
            elif role in ("assistant", "tool", "system", "developer"):
                outputs = _outputs(cast(dict[str, Any], message))
                if stays:
                    taken.append((message, None))
                if not outputs:
                    continue  # blank
                if self.turn is None:
                    # Before the first user turn (the host's greeting): it opens
                    # the first turn's input, and stays in Pipecat's context (a
                    # note as the user message turnloom will hold).
                    note = role == "system" or role == "developer"
                    self.opening_raw.append(_user_dict(outputs[0]) if note else message)
                    owed = _take_async(message, self.opening_running) or owed
                    continue
                if self._take_one(message, self._record, outputs, owner):
                    owed = _take_async(message, self.running) or owed
                elif stays:
                    taken.pop()
                    dropped.append(message)
        return _Took(users, new_turn, owed, taken, dropped, region)

    def _take_one(self, message: Any, take: Callable[..., None], *args: Any) -> bool:
        """``take(*args)``: commit or record Pipecat's ``message``; False when turnloom
        refused it (an ``InputError`` or ``StateError``): counted in ``record_errors``
        and logged, the call goes on (see the module docstring, "Refused messages")."""
        try:
            take(*args)
        except (InputError, StateError) as exc:
            self.record_errors += 1
            _log.warning(
                "Context %r: turnloom refused a %s message of Pipecat's context; it is left "
                "out of the call's context: %r",
                self.context_id,
                message.get("role") if isinstance(message, dict) else type(message).__name__,
                exc,
            )
            return False
        return True

    def _drop_specific(self, message: Any) -> None:
        """Count a message turnloom cannot hold (a service's own ``LLMSpecificMessage``);
        warn the first time in the call."""
        self.dropped_specific += 1
        if self.dropped_specific == 1:
            llm = getattr(message, "llm", None)
            kind = getattr(message, "message", None)
            kind = kind.get("type") if isinstance(kind, dict) else type(kind).__name__
            _log.warning(
                "Context %r: left out a message of Pipecat's context that turnloom cannot "
                "hold (an LLMSpecificMessage for %r, type %r); the pair counts them in "
                "specific_messages_dropped.",
                self.context_id,
                llm,
                kind,
            )

    def _record(self, outputs: list[Message], turn: str | None = None) -> None:
        """Record ``outputs`` to ``turn`` (None: the turn the reply being spoken answers,
        else the newest)."""
        answered = turn or self.reply_turn or self.turn
        assert answered is not None
        self.manager.record(self.context_id, answered, outputs)
        if answered != self.turn:
            # A reply cut by the barge-in that started the newest turn,
            # taken after that turn's commit: the newest input changes.
            self.prefix = None

    def _take_settled(self, synced: list[Any]) -> bool:
        """Record the results Pipecat wrote over a placeholder turnloom already holds.

        Returns True when it recorded one.

        An asynchronous call whose result comes before the conversation moved
        on is settled in place: Pipecat overwrites the content of the call's
        tool message in its context, which is turnloom's input by then, so
        the next sync would replace it unseen. Its result is recorded instead
        as the final-result notice Pipecat writes for a deferred one.
        """
        if self.turn is None:
            return False  # no turn to record to (the only one was retracted): kept for the next
        taken = False
        for call_id, result in _settled_in_place(synced, self.running):
            notice = async_tool_messages.build_final_result_message(call_id, result)
            self._record(_outputs(cast(dict[str, Any], notice)))
            taken = True
        return taken

    def _opening_settled(self) -> bool:
        """Whether Pipecat wrote a result over a placeholder of ``opening_raw`` since the last
        sync (the call settled in place before the first user turn); forgets those calls."""
        return bool(list(_settled_in_place(self.opening_raw, self.opening_running)))

    async def send_instruction(self, aggregator: FrameProcessor, direction: FrameDirection) -> None:
        """Hand the LLM service turnloom's instructions, when they changed since last sent.

        Pushed by ``aggregator`` in ``direction``, just before its
        ``LLMContextFrame``: both are ordered frames on the same path, so the
        service applies the settings before it runs that inference. Marked
        sent only once pushed: a push cancelled before it left sends it again
        with the next context.
        """
        instruction = self.instruction
        if self.sent == (instruction,):
            return
        await aggregator.push_frame(
            LLMUpdateSettingsFrame(
                delta=LLMSettings(system_instruction=instruction), reach_inactive_services=True
            ),
            direction,
        )
        self.sent = (instruction,)

    async def reply_started(self, aggregator: Any) -> None:
        """Pipecat's ``on_assistant_turn_started``: the reply starting answers the newest turn."""
        self.reply_turn = self.turn

    def _user_message(self, native: dict[str, Any]) -> Message | None:
        """A user message Pipecat wrote, as turnloom's gateway parses it (None when blank).

        Its text and images (Pipecat's vision frames, a host's appended
        ``image_url`` parts) are kept. A message the gateway refuses is taken
        as its text alone, with a logged warning.
        """
        try:
            message = self.manager.gateway.parse(cast(Any, native))
        except TurnloomError as exc:
            _log.warning(
                "Took only the text of a user message of context %r that turnloom's OpenAI "
                "Chat gateway refused: %s",
                self.context_id,
                exc,
            )
            text = _text(native.get("content"))
            return Message(role=Role.user, content=text) if text.strip() else None
        if message.role is not Role.user or all(map(is_blank_part, message.parts)):
            return None
        return message

    def _commit(self, said: Message) -> None:
        first = self.turn is None
        opening = [m for raw in self.opening_raw for m in _outputs(raw)] if first else []
        turn_id = new_turn_id()
        self.manager.accept_turn(
            TurnSnapshot(
                context_id=self.context_id,
                turn_id=turn_id,
                instructions=(self.system,) if first else None,
                # The first turn (none held) opens with what the bot said before it.
                input=(*opening, said),
            )
        )
        self.turn, self.prefix, self.created = turn_id, None, True
        if first:
            self.opening_running.clear()
            for raw in self.opening_raw:
                _take_async(raw, self.running)

    def retract_turn(self) -> None:
        """Take back the newest user turn (``manager.voice.retract_turn``) and its context."""
        if self.turn is not None and not self.closed:
            self.manager.voice.retract_turn(self.context_id, self.turn)
            held = self.manager.history(self.context_id).turn_ids
            self.turn = held[-1] if held else None
            self.reply_turn = self.prefix = None
            if self.turn is None:
                self._reopen()

    def _reopen(self) -> None:
        """The only turn was retracted: Pipecat's context is the opening again.

        Its asynchronous calls still running are the opening's again, and
        Pipecat's context holds the opening's own messages (then what Pipecat
        wrote since the last sync), so a later result settles over the
        opening's placeholder, as the model sees it. (A result cannot have
        settled over the retracted turn's input: its user message follows the
        placeholder, so Pipecat defers it.)
        """
        messages = self.context.get_messages()
        self.opening_running.update(self.running)
        self.running.clear()
        self.context.set_messages([*self.opening_raw, *messages[self.synced :]])
        self.synced = len(self.opening_raw)

    def close(self) -> None:
        """Remove the call's context (idempotent); after the Foundation closed, only log it.

        The Foundation closed first (the host's ``async with Foundation``
        exited before the pipeline's end): the context is left as the
        Foundation left it (in its store, when it has one) and an INFO record
        says so; nothing is raised into Pipecat's teardown.
        """
        if self.closed:
            return
        self.closed = True
        self.turn = self.reply_turn = self.prefix = None
        if not self.created:
            return
        try:
            self.manager.remove_context(self.context_id)
        except FoundationClosedError:
            _log.info(
                "Context %r was not removed at the pipeline's end: the Foundation closed "
                "first; it stays as the Foundation left it (in its store, if it has one).",
                self.context_id,
            )


def _rewrite_refused(
    frame: LLMMessagesUpdateFrame | LLMMessagesTransformFrame,
) -> InvalidArgumentError:
    """The error for a frame that would rewrite the context turnloom holds."""
    name = type(frame).__name__
    return InvalidArgumentError(
        f"{name} rewrites the LLM context, which a TurnloomContextAggregatorPair keeps as "
        "turnloom's input: append with LLMMessagesAppendFrame, or change the conversation "
        "through the manager (retract_turn, compaction, the history limits). Nothing changed.",
        field="frame",
    )


class TurnloomUserAggregator(LLMUserAggregator):
    """Pipecat's user aggregator whose pushed context is turnloom's input for the new turn."""

    def __init__(self, context: LLMContext, *, conversation: _Conversation, **kwargs: Any) -> None:
        super().__init__(context, **kwargs)
        self._conversation = conversation

    async def push_context_frame(
        self, direction: FrameDirection = FrameDirection.DOWNSTREAM
    ) -> None:
        """Commit the finished user turn to turnloom and push its prepared input (or nothing).

        Pushes an ``LLMUpdateSettingsFrame`` with turnloom's instructions first
        when they changed since last sent (the first push of the call does).

        Cancellation: cancelled while the turn's input is prepared, the turn
        stays committed and nothing is pushed; the next push prepares it.
        """
        if await self._conversation.sync():
            await self._conversation.send_instruction(self, direction)
            await super().push_context_frame(direction)

    async def _handle_llm_messages_update(self, frame: LLMMessagesUpdateFrame) -> None:
        """Refuse it: raises InvalidArgumentError (Pipecat pushes it as an ErrorFrame)."""
        raise _rewrite_refused(frame)

    async def _handle_llm_messages_transform(self, frame: LLMMessagesTransformFrame) -> None:
        """Refuse it: raises InvalidArgumentError (Pipecat pushes it as an ErrorFrame)."""
        raise _rewrite_refused(frame)


class TurnloomAssistantAggregator(LLMAssistantAggregator):
    """Pipecat's assistant aggregator recording what was played, calls and results to turnloom."""

    def __init__(self, context: LLMContext, *, conversation: _Conversation, **kwargs: Any) -> None:
        super().__init__(context, **kwargs)
        self._conversation = conversation

    async def push_context_frame(
        self, direction: FrameDirection = FrameDirection.DOWNSTREAM
    ) -> None:
        """Record what it wrote (the played reply, calls, results); push turnloom's input.

        Pushes an ``LLMUpdateSettingsFrame`` with turnloom's instructions first
        when they changed since last sent.
        """
        if await self._conversation.sync():
            await self._conversation.send_instruction(self, direction)
            await super().push_context_frame(direction)

    async def _handle_llm_messages_update(self, frame: LLMMessagesUpdateFrame) -> None:
        """Refuse it: raises InvalidArgumentError (Pipecat pushes it as an ErrorFrame)."""
        raise _rewrite_refused(frame)

    async def _handle_llm_messages_transform(self, frame: LLMMessagesTransformFrame) -> None:
        """Refuse it: raises InvalidArgumentError (Pipecat pushes it as an ErrorFrame)."""
        raise _rewrite_refused(frame)

    async def cleanup(self) -> None:
        """The pipeline ended (``EndFrame`` or ``CancelFrame``): remove the call's context (after
        the Foundation closed: leave it, raising nothing; see the module docstring)."""
        await super().cleanup()  # type: ignore[no-untyped-call]
        self._conversation.close()


class TurnloomContextAggregatorPair:
    """The user and assistant aggregators of one call, with turnloom as the one source of truth.

    Use it as Pipecat's ``LLMContextAggregatorPair``: ``pair.user()`` after
    the STT, ``pair.assistant()`` after the output transport. Give the LLM
    service no ``system_instruction`` of its own (``None``): the pair sets the
    service's base instruction to turnloom's pinned instructions, with an
    ``LLMUpdateSettingsFrame`` before the call's first inference (and again
    whenever they change), and any other would be replaced.

    Args:
        manager: a manager bound to an open Foundation on the pipeline's event
            loop, with the ``openai_chat`` gateway (Pipecat's standard message
            shape; each LLM service's adapter converts it).
        context_id: the call's turnloom context id.
        instructions: the system prompt (pinned in turnloom), handed to the
            LLM service as its ``system_instruction``; never a message of
            Pipecat's context.
        false_start: called with each finished user turn's text; True keeps
            the turn out of turnloom and runs no inference. Default: never.
        tools: the tools the LLM may call (a Pipecat ``ToolsSchema``), kept on
            Pipecat's context as usual.
        user_params, assistant_params: Pipecat's aggregator parameters (turn
            strategies, VAD, ...).

    Raises:
        InvalidArgumentError: the manager's gateway is not ``openai_chat``.

    Attributes:
        context: Pipecat's ``LLMContext``: always turnloom's latest input for
            the turn without its leading ``system`` items (those are the LLM
            service's ``system_instruction``), plus what Pipecat wrote since
            (bounded).
    """

    def __init__(
        self,
        *,
        manager: ContextManager,
        context_id: str,
        instructions: str,
        false_start: Callable[[str], bool] | None = None,
        tools: Any = None,
        user_params: LLMUserAggregatorParams | None = None,
        assistant_params: LLMAssistantAggregatorParams | None = None,
    ) -> None:
        if manager.gateway.type is not GatewayType.openai_chat:
            raise InvalidArgumentError(
                f"TurnloomContextAggregatorPair {context_id!r} needs a manager with the "
                f"openai_chat gateway, not {manager.gateway.type.value}.",
                field="manager",
            )
        self.context = LLMContext(tools=tools) if tools is not None else LLMContext()
        self._conversation = _Conversation(
            manager, context_id, instructions, false_start, self.context
        )
        self._user = TurnloomUserAggregator(
            self.context,
            conversation=self._conversation,
            params=user_params or LLMUserAggregatorParams(),
            _realtime_service_mode=False,
        )
        self._assistant = TurnloomAssistantAggregator(
            self.context,
            conversation=self._conversation,
            params=assistant_params or LLMAssistantAggregatorParams(),
            _realtime_service_mode=False,
            _paired_user_aggregator=self._user,
        )
        self._assistant.add_event_handler(
            "on_assistant_turn_started", self._conversation.reply_started
        )

    @property
    def context_id(self) -> str:
        """The call's turnloom context id."""
        return self._conversation.context_id

    @property
    def specific_messages_dropped(self) -> int:
        """How many of Pipecat's ``LLMSpecificMessage``\\ s (a service's own message, such
        as Gemini's thought signatures) the pair left out of the call's context: turnloom
        holds provider-neutral messages only. The first one in a call logs a warning."""
        return self._conversation.dropped_specific

    @property
    def record_errors(self) -> int:
        """How many messages of Pipecat's context turnloom refused (a user turn or an
        output over the history's limits, an ``InputError`` or ``StateError``): each is
        left out of the call's context, logged as a warning; the call goes on."""
        return self._conversation.record_errors

    @property
    def turn_id(self) -> str | None:
        """The newest committed turn of the call (None before the first, or after the end)."""
        return self._conversation.turn

    def user(self) -> TurnloomUserAggregator:
        """The user aggregator (place it after the STT)."""
        return self._user

    def assistant(self) -> TurnloomAssistantAggregator:
        """The assistant aggregator (place it after the output transport)."""
        return self._assistant

    def __iter__(self) -> Iterator[TurnloomUserAggregator | TurnloomAssistantAggregator]:
        """``user, assistant = pair``, as Pipecat's pair unpacks."""
        return iter((self._user, self._assistant))

    def retract_turn(self) -> None:
        """Take back the newest user turn (a false start found after the hook ran).

        Raises:
            StateError: outputs were recorded for it, or a newer turn exists:
                as ``manager.voice.retract_turn``.
            FoundationClosedError: the Foundation is closing or closed (and the
                pair has not seen it yet: after its close, nothing happens).
        """
        self._conversation.retract_turn()

    def close(self) -> None:
        """Remove the call's context now (the pipeline's end does it too); idempotent.

        After the Foundation closed it raises nothing: the context stays as
        the Foundation left it (see the module docstring, "teardown in either
        order").
        """
        self._conversation.close()

"""Tool call / tool result pairing over neutral messages.

Every provider rejects an input with a tool result whose call is missing, and
every provider but OpenAI Chat rejects a call left without its result. An
input can reach that state when a turn is interrupted (the model called a
tool, the invocation was cancelled before the result) or when a history is
cut. :func:`complete_pairs` makes a message list safe to render.

Pairing is by call id within a model *step*: what the model emitted in one
response (text, reasoning, every parallel tool call), however the host split
it into messages, and the results that answer its calls. A step is one
assistant message, or a run of consecutive assistant messages whose later
members continue it (see :class:`CallTracker`; hosts such as LiteLLM, Vercel
AI and the OpenAI Agents SDK store parallel calls one message per call). A
result answers a call of the current step, and only until the step ends (the
next user, system or developer message, or an assistant message that starts
another step). A call id may therefore be reused in a later step (recorded
OpenAI traffic does this); each result pairs with its own call.
:class:`CallTracker` is the one statement of that rule; everything else here,
the history, the area section and the replay parser apply it through it.

Besides tool call and tool result parts, the OpenAI Responses call kinds the
gateway keeps as opaque items pair by this rule (``computer_call`` with
``computer_call_output`` and the rest of
``CALL_KINDS``, ``mcp_approval_request``
with ``mcp_approval_response``): the tracker stands each such call in as a
:class:`ToolCallPart` whose ``call_id`` is its pairing key
(``pairing_key``, such as
``"computer_call_output call_1"``) and whose ``name`` is its item type, and
each output as a :class:`ToolResultPart` with that key. A call whose output
cannot say "cancelled" (a ``computer_call_output`` must hold a screenshot) is
left out under either policy; an ``mcp_approval_request`` is never left out
nor answered (the API accepts a request left unanswered).
"""

from __future__ import annotations

__all__ = (
    "CANCELLED_RESULT_TEXT",
    "STEP_SIGNATURE_KEYS",
    "CallTracker",
    "OpenCallPolicy",
    "PairingStep",
    "StepConflict",
    "StepJoin",
    "check_steps",
    "complete_pairs",
    "hold_until_answered",
    "holds_results",
    "is_cancelled_part",
    "is_pairing_part",
    "join_steps",
    "open_call_ids",
    "steps_may_conflict",
)

from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import Literal, NamedTuple, TypeAlias

import msgspec

from turnloom.context._call_kinds import (
    APPROVAL_REQUEST,
    CALL_KINDS,
    cancelled_output,
    pairing_key,
)
from turnloom.context.message import (
    Message,
    OpaquePart,
    Part,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    is_blank_part,
)
from turnloom.errors import AmbiguousStepError, UnpairedResultError, excerpt

OpenCallPolicy: TypeAlias = Literal["exclude", "cancel"]
"""What :func:`complete_pairs` does with a call that has no result.

* ``"exclude"`` -- leave the call out (and its assistant message, when nothing
  else remains in it).
* ``"cancel"`` -- close it with an explicit error result whose text is
  :data:`CANCELLED_RESULT_TEXT`, placed after the results that did arrive.
"""

StepJoin: TypeAlias = Literal["none", "calls", "reasoning"]
"""How a gateway needs a step that spans several messages joined (see :func:`join_steps`).

* ``"none"`` -- render each message as it is (the gateway's request body
  merges adjacent turns itself: Anthropic, Gemini).
* ``"calls"`` -- the step's assistant messages become one (OpenAI Chat: the
  ``tool`` messages must follow the one message holding every ``tool_calls``
  entry).
* ``"reasoning"`` -- an assistant message holding only reasoning joins the
  assistant message after it (OpenAI Responses: a ``reasoning`` item must be
  sent in front of the item it precedes, and renders only with it).
"""

CANCELLED_RESULT_TEXT = "The tool call was cancelled before it returned a result."
_CANCELLED_CONTENT = (TextPart(text=CANCELLED_RESULT_TEXT),)

STEP_SIGNATURE_KEYS = ("thoughtSignature", "thought_signature")
"""Extras keys of a tool call that sign the model step, not the call.

Gemini signs a parallel step once, on its first ``functionCall`` part
(``thoughtSignature``; ``thought_signature`` in snake_case traffic), and
rejects a current-turn step sent without it. When
:func:`complete_pairs` leaves out a step's first call, the signature moves to
the step's first kept call.
"""


def _clean_parts(parts: tuple[Part, ...]) -> tuple[Part, ...]:
    """``parts`` without blank text parts (that carry no extras); ``parts`` itself when none is."""
    for part in parts:
        if is_blank_part(part):
            return tuple(p for p in parts if not is_blank_part(p))
    return parts


_RESPONSES = "openai_responses"
# Item types of the opaque calls pairing sees -> the prefix of their keys.
_STAND_IN_PREFIX = {
    **{kind: f"{output} " for kind, output in CALL_KINDS.items() if kind != "function_call"},
    APPROVAL_REQUEST: "mcp_approval_response ",
}


def _opaque_key(part: OpaquePart) -> tuple[bool, str] | None:
    """``(is_call, key)`` of an opaque Responses call or output pairing sees, else None."""
    return pairing_key(part.item) if part.gateway == _RESPONSES else None


def _stand_in_call(part: Part) -> ToolCallPart | None:
    """The call pairing tracks for ``part``: itself, a stand-in for an opaque call, or None."""
    if type(part) is ToolCallPart:
        return part
    if type(part) is OpaquePart:
        key = _opaque_key(part)
        if key is not None and key[0]:
            return ToolCallPart(call_id=key[1], name=part.item["type"])
    return None


def _result_key(part: Part) -> str | None:
    """The call id (pairing key) a result part answers: a tool result's, an opaque output's."""
    if type(part) is ToolResultPart:
        return part.call_id
    if type(part) is OpaquePart:
        key = _opaque_key(part)
        if key is not None and not key[0]:
            return key[1]
    return None


def _is_stand_in(call: ToolCallPart) -> bool:
    prefix = _STAND_IN_PREFIX.get(call.name)
    return prefix is not None and call.arguments == "{}" and call.call_id.startswith(prefix)


def is_pairing_part(part: Part) -> bool:
    """True for a part pairing reads: a tool call or result, an opaque Responses call or output."""
    kind = type(part)
    return (
        kind is ToolCallPart
        or kind is ToolResultPart
        or (kind is OpaquePart and _opaque_key(part) is not None)  # type: ignore[arg-type]
    )


def holds_results(message: Message) -> bool:
    """True when ``message`` holds a tool result or an opaque Responses output."""
    return any(_result_key(p) is not None for p in message.parts)


def is_cancelled_part(part: Part) -> bool:
    """True for a result :func:`complete_pairs` adds to close a call as cancelled."""
    if type(part) is ToolResultPart:
        return part.is_error and part.content == _CANCELLED_CONTENT
    key = _result_key(part)
    return key is not None and part.item == cancelled_output(key, CANCELLED_RESULT_TEXT)  # type: ignore[union-attr]


def _cancelled(calls: Iterable[ToolCallPart]) -> tuple[tuple[Part, ...], list[ToolCallPart]]:
    """Cancelled results for ``calls``, and the calls that must be left out instead.

    An opaque call (a stand-in, see the module docstring) gets the output
    ``cancelled_output`` writes, or, when
    its kind has none, is left out; an ``mcp_approval_request`` neither.
    """
    results: list[Part] = []
    left_out: list[ToolCallPart] = []
    for call in calls:
        if not _is_stand_in(call):
            results.append(
                ToolResultPart(
                    call_id=call.call_id,
                    name=call.name,
                    is_error=True,
                    content=_CANCELLED_CONTENT,
                )
            )
            continue
        if call.name == APPROVAL_REQUEST:
            continue
        item = cancelled_output(call.call_id, CANCELLED_RESULT_TEXT)
        if item is None:
            left_out.append(call)
        else:
            results.append(OpaquePart(gateway=_RESPONSES, item=item))
    return tuple(results), left_out


class PairingStep(NamedTuple):
    """What one message did to the pairing state (see :meth:`CallTracker.feed`).

    Attributes:
        paired: the message's tool results that answer an open call, in order.
        orphans: its tool results that answer no open call, in order.
        closed: the calls its arrival left without a result by ending their
            group, in call order (empty when the group was fully answered).
        results: True when the message carries tool results (a ``tool``
            message, or a ``user`` message with tool results).
    """

    paired: tuple[ToolResultPart, ...]
    orphans: tuple[ToolResultPart, ...]
    closed: tuple[ToolCallPart, ...]
    results: bool


class StepConflict(NamedTuple):
    """Why an assistant message cannot join the step before it (see :meth:`CallTracker.conflict`).

    Attributes:
        reason: ``"duplicate_call_id"``: the message repeats a call id of the
            step, so a result with that id would answer two calls.
        call_id: the message's call at fault.
    """

    reason: Literal["duplicate_call_id"]
    call_id: str


_NO_STEP = PairingStep((), (), (), False)
# Bound once: an attribute of an Enum class is looked up through its
# metaclass's ``__getattr__`` hook (about 0.1 us per use on CPython 3.11).
_ASSISTANT, _TOOL, _USER = Role.assistant, Role.tool, Role.user


def _ends_group(part: Part) -> bool:
    """True for a part that, beside tool results in a user message, starts a new user turn."""
    return (
        type(part) is not ToolResultPart and not is_blank_part(part) and _result_key(part) is None
    )


class CallTracker:
    """The pairing rule, applied one message at a time, oldest first.

    This is the only statement of the rule; history rendering, the area
    section, routed items and the replay parser all use it. A *call group*
    is the tool calls of one model step. A step starts at an assistant
    message; the assistant messages directly after it *continue* it while it
    has calls (whatever they carry: calls, text or reasoning, before or after
    calls), since no model response can follow a call before its result. So
    ``[call a], [call b], [result a], [result b]`` is one step, as
    ``[call a, call b], [result a], [result b]`` is; so is ``[call a],
    [text], [call b]`` (one response split around its text, or a call
    abandoned without a result: either way ``a`` is answered, or closed at
    the step's end as any open call is). With ``model_turns=True`` every
    assistant message directly after another continues its step (native
    OpenAI Responses items, one per output item).

    One shape cannot be paired without guessing: a message repeating a call
    id of the step it would continue (a result with that id would answer
    two calls). Such a message starts a new group instead (as if the step
    ended before it); the door refuses it (:func:`check_steps`,
    :meth:`conflict`).

    A tool result answers a call of the current group with its id and only
    until the group ends; a result with any other id is an orphan. The group
    ends at the next assistant message that starts a step, at a ``user``,
    ``system`` or ``developer`` message, and at a ``user`` message that
    carries non-blank content besides its tool results (after those
    results). A step never spans turns: :meth:`new_turn` marks the boundary.
    Calls still open when their group ends are *closed* without a result. A
    call id may be reused by a later group; each result pairs with its own
    group's call.

    Source: OpenAI Chat ``tool`` messages follow their ``tool_calls``
    message; Anthropic ``tool_result`` blocks open the next user turn; Gemini's
    function-response turn follows the call turn.

    Args:
        carried: calls of a group that began before the first message fed
            (a span continuing an earlier one), still without a result.
        model_turns: let every assistant message directly after another
            continue its step.

    Attributes:
        open: the current group's calls without a result yet, by call id, in
            call order. Read-only for callers. While a step is being fed (no
            result yet), these are all of its calls.
        group: a serial number, increased each time a group ends or starts.
    """

    __slots__ = ("_in_model_turn", "_model_turns", "group", "open")

    def __init__(self, carried: Iterable[ToolCallPart] = (), *, model_turns: bool = False) -> None:
        # No comprehension for the usual empty ``carried`` (a frame per tracker).
        self.open: dict[str, ToolCallPart] = (
            {} if type(carried) is tuple and not carried else {c.call_id: c for c in carried}
        )
        self.group = 0
        self._model_turns = model_turns
        self._in_model_turn = False  # the last message fed was an assistant message

    @property
    def open_ids(self) -> tuple[str, ...]:
        """Ids of :attr:`open`, in call order."""
        return tuple(self.open)

    def copy(self) -> CallTracker:
        """An independent tracker in the same state."""
        twin = CallTracker(model_turns=self._model_turns)
        twin.open = dict(self.open)  # keyed by each call's own id, as the constructor keys them
        twin.group = self.group
        twin._in_model_turn = self._in_model_turn
        return twin

    def new_turn(self) -> None:
        """A turn boundary: the next assistant message starts a step; open calls stay open."""
        self._in_model_turn = False

    def continues(self, message: Message) -> bool:
        """True when ``message`` would continue the current step (it starts no group)."""
        if message.role is not _ASSISTANT or not self._in_model_turn:
            return False
        if self._model_turns:
            return True
        return bool(self.open) and self._joins(message.parts)

    def conflict(self, message: Message) -> StepConflict | None:
        """Why ``message`` cannot continue the step it follows, or None when nothing is wrong.

        Only an assistant message with calls, directly after an assistant
        message of a step that has open calls, can conflict (see the class
        docstring). Changes nothing.
        """
        if (
            message.role is not _ASSISTANT
            or not self._in_model_turn
            or self._model_turns
            or not self.open
        ):
            return None
        for part in message.parts:
            call = _stand_in_call(part)
            if call is not None and call.call_id in self.open:
                return StepConflict("duplicate_call_id", call.call_id)
        return None

    def _joins(self, parts: tuple[Part, ...]) -> bool:
        """True when a message of ``parts`` can continue the current step (which has calls)."""
        open_calls = self.open
        for part in parts:
            if type(part) is ToolCallPart:
                if part.call_id in open_calls:
                    return False
            elif type(part) is OpaquePart:
                call = _stand_in_call(part)
                if call is not None and call.call_id in open_calls:
                    return False
        return True

    def _end(self) -> tuple[ToolCallPart, ...]:
        closed = tuple(self.open.values())
        self.open = {}
        self.group += 1
        return closed

    def feed(self, message: Message) -> PairingStep:
        """Apply one message; return what it paired, orphaned and closed."""
        role = message.role
        parts = message.parts
        if role is _ASSISTANT:
            if self._in_model_turn:
                if self._model_turns:
                    _add_calls(self.open, parts)
                    return _NO_STEP
                open_calls = self.open
                if open_calls and self._joins(parts):
                    _add_calls(open_calls, parts)
                    return _NO_STEP
            self._in_model_turn = True
            left = self.open
            # The group ends (see _end); this message's calls open the next one.
            self.group += 1
            self.open = {}
            _add_calls(self.open, parts)
            return PairingStep((), (), tuple(left.values()), False) if left else _NO_STEP
        self._in_model_turn = False
        if role is _TOOL or role is _USER:
            open_calls = self.open
            paired: list[ToolResultPart] = []
            orphans: list[ToolResultPart] = []
            for part in parts:
                if type(part) is ToolResultPart:
                    if open_calls.pop(part.call_id, None) is not None:
                        paired.append(part)
                    else:
                        orphans.append(part)
                elif type(part) is OpaquePart:
                    key = _result_key(part)
                    if key is not None:
                        stand_in = ToolResultPart(call_id=key)
                        if open_calls.pop(key, None) is not None:
                            paired.append(stand_in)
                        else:
                            orphans.append(stand_in)
            if paired or orphans or role is _TOOL:
                ended: tuple[ToolCallPart, ...] = ()
                if role is _USER and any(_ends_group(p) for p in parts):
                    ended = self._end()
                return PairingStep(tuple(paired), tuple(orphans), ended, True)
        closed = self._end()
        return PairingStep((), (), closed, False) if closed else _NO_STEP


def _add_calls(open_calls: dict[str, ToolCallPart], parts: tuple[Part, ...]) -> None:
    """Open the calls of an assistant message's ``parts`` (tool calls, stand-ins), in order.

    An opaque output in an assistant message answers the open call of its key:
    histories recorded before outputs parsed to tool messages hold a
    ``computer_call_output`` beside its call in one assistant message (or in
    the next one). One answering nothing stays, as it did.
    """
    for part in parts:
        if type(part) is ToolCallPart:
            open_calls[part.call_id] = part
        elif type(part) is OpaquePart:
            key = _opaque_key(part)
            if key is None:
                continue
            if key[0]:
                open_calls[key[1]] = ToolCallPart(call_id=key[1], name=part.item["type"])
            else:
                open_calls.pop(key[1], None)


def check_steps(
    messages: Sequence[object],
    where: str,
    *,
    before: Sequence[Message] = (),
    indices: Sequence[int] | None = None,
    late: bool = False,
    unpaired: bool = False,
) -> None:
    """Refuse a batch holding a step that cannot be paired, or a result pairing would drop.

    ``messages`` follow ``before`` directly in one turn (the turn's messages
    so far: only its last step matters, its last run of assistant messages
    and what follows). Each assistant message is checked with :meth:`CallTracker.conflict`
    against the step it follows, and each tool result must answer an open
    call. Entries that are not Messages are skipped (the caller's message
    check names them). Pure: changes nothing. O(``messages`` and the last
    step of ``before``).

    Args:
        messages: the batch, oldest first.
        where: how error messages name it (``"Output of turn 't1'"``).
        before: the messages of the turn before the batch, oldest first.
        indices: the index in what ``where`` names of each of ``messages``
            (default: its position), when the caller left some out.
        late: earlier turns are kept, whose calls (left open, or recorded
            late: see :meth:`TurnHistory.record
            <turnloom.context.TurnHistory.record>`) may precede ``before``:
            let a result answering no call of the batch pass while no message
            before it (``before`` included) started or ended a group; pairing
            leaves it out until such a call answers it.
        unpaired: let results answering no call pass (pairing leaves them
            out), except those answering a call whose model step a later
            model message ended (``closed_call``); for rebuilding a history
            from records written before such results were refused.

    Raises:
        AmbiguousStepError: ``messages[i]`` would continue the step before
            it and repeats a call id of that step (``reason``
            ``"duplicate_call_id"``), or a tool result of ``messages[i]``
            answers a call whose step a later model message ended without
            its result (``"closed_call"``: the call and the result would be
            left out).
            Its ``field`` names the message, ``call_id`` the call.
        UnpairedResultError: a tool result of ``messages[i]`` answers no
            other call open at its place (never made, answered already,
            closed by a ``user`` message, or closed before ``before``), and
            no call recorded late can answer it (see ``late``; nor a second
            result with the id of one fed before it while ``late`` let
            results pass: a late call answers one of them); ``field`` names
            the message, ``call_id`` the result's.
    """
    if not messages:
        return  # nothing to refuse: ``before`` alone is never checked
    tracker = CallTracker()
    # Ids of calls a model step ended without their result: a result after it
    # is a call recorded after a result of its step (closed_call). A group a
    # user message ends leaves its calls to UnpairedResultError.
    closed: set[str] = set()
    if before:
        # The last step of ``before``: its last run of assistant messages and what
        # follows (all of it when it holds no assistant message).
        tail = len(before)
        while tail and not _is_assistant(before[tail - 1]):
            tail -= 1
        while tail and _is_assistant(before[tail - 1]):
            tail -= 1
    # Result ids fed before any group bound (the window ``late`` lets pass): a
    # call recorded late joins one group, which cannot hold one id twice, so a
    # second result with such an id can never pair.
    window: set[str] = set()
    if before:
        for earlier in before[tail:]:
            ended = tracker.feed(earlier).closed
            if ended and earlier.role is _ASSISTANT:  # (most steps close nothing)
                closed.update(c.call_id for c in ended)
            if late and not tracker.group:
                window.update(p.call_id for p in earlier.parts if type(p) is ToolResultPart)
    _check_fed(messages, where, tracker, closed, window, indices, late, unpaired)


def _check_fed(
    messages: Sequence[object],
    where: str,
    tracker: CallTracker,
    closed: set[str],
    window: set[str],
    indices: Sequence[int] | None,
    late: bool,
    unpaired: bool,
) -> None:
    """:func:`check_steps` of ``messages`` after ``before`` was fed: ``tracker``, ``closed``
    and ``window`` are the state it left (each used up). A history keeps that state for
    its newest step (``history._steps``) rather than feeding the step again per record.

    Raises:
        as :func:`check_steps`.
    """
    for i, message in enumerate(messages):
        if not isinstance(message, Message):
            tracker = CallTracker()
            closed.clear()
            continue
        index = i if indices is None else indices[i]
        conflict = tracker.conflict(message)
        if conflict is not None:
            why = (
                f"repeats call id {excerpt(conflict.call_id)} of the model step it "
                "continues, so a result with that id would answer two calls"
            )
            raise AmbiguousStepError(
                f"{where}[{index}] {why}; give each call of a model step its own id, and "
                "record the result of a call before repeating it.",
                field=f"{where}[{index}]",
                call_id=conflict.call_id,
                reason=conflict.reason,
            )
        group = tracker.group
        step = tracker.feed(message)
        orphans = step.orphans
        stale = None
        if orphans and closed:
            stale = next((r for r in orphans if r.call_id in closed), None)
        if stale is not None:
            raise AmbiguousStepError(
                f"{where}[{index}] answers call {excerpt(stale.call_id)}, whose model step "
                "ended before it (an assistant message after a result of that step starts "
                "another), so the call and its result would be left out; record every call "
                "of a model step before its results.",
                field=f"{where}[{index}]",
                call_id=stale.call_id,
                reason="closed_call",
            )
        unanswerable = None
        if orphans and not unpaired and (group or not late):
            unanswerable = orphans[0]
        elif late and not group and step.results:
            for part in message.parts:
                if type(part) is ToolResultPart:
                    if part.call_id in window and unanswerable is None and not unpaired:
                        unanswerable = part
                    window.add(part.call_id)
        if unanswerable is not None:
            raise UnpairedResultError(
                f"{where}[{index}] holds a tool result for call {excerpt(unanswerable.call_id)}, "
                "which no call open at its place has (the call was never recorded, was "
                "answered already, was closed by a later message, or left with an evicted "
                "turn); no provider accepts a result without its call, so it would be left "
                "out of every model input. Record the call first, in the same turn or the "
                "turn before the one whose input answers it (in a build's continuation: "
                "pass the call too, or build with recorded=True).",
                field=f"{where}[{index}]",
                call_id=unanswerable.call_id,
            )
        if step.closed and message.role is _ASSISTANT:
            closed.update(c.call_id for c in step.closed)


def steps_may_conflict(messages: Sequence[object], previous: object | None) -> bool:
    """False when :func:`check_steps` cannot raise for ``messages``: a cheap sufficient test.

    ``previous`` is the last message of ``before`` (None when it is empty).
    :func:`check_steps` raises only for a tool result (one answering no open
    call) or for a tool call in an assistant message fed directly after
    an assistant message (:meth:`CallTracker.conflict` needs the step's model
    turn); a batch with neither, or whose calls each follow a message of
    another role, passes it whatever ``before`` holds, so a record or a commit
    need not walk back for the turn's last step. True for anything that is not
    a Message (the full check names it). O(the parts of ``messages``).
    """
    after_assistant = isinstance(previous, Message) and previous.role is _ASSISTANT
    for message in messages:
        if not isinstance(message, Message):
            return True
        for part in message.parts:
            kind = type(part)
            if kind is ToolResultPart or (kind is ToolCallPart and after_assistant):
                return True
            if kind is OpaquePart:
                key = _opaque_key(part)  # type: ignore[arg-type]
                if key is not None and (after_assistant or not key[0]):
                    return True
        after_assistant = message.role is _ASSISTANT
    return False


def _is_assistant(message: object) -> bool:
    """True for a Message of the assistant role (entries that are not Messages: False)."""
    return isinstance(message, Message) and message.role is _ASSISTANT


def open_call_ids(messages: Sequence[Message]) -> tuple[str, ...]:
    """Ids of the calls of the last call group that have no result yet, in call order."""
    tracker = CallTracker()
    for message in messages:
        tracker.feed(message)
    return tracker.open_ids


def hold_until_answered(messages: Sequence[Message]) -> list[Message]:
    """Move messages that arrived while calls were open to after those calls' results.

    A notice (a ``system``/``developer`` message) or user text appended while
    the calls of the latest assistant message are still open would otherwise
    sit between a call and its result, which no provider accepts and which
    :func:`complete_pairs` would resolve by giving up the call. Such messages
    are held and re-inserted, in their order, right after the result that
    answers the group's last open call; if the group is never answered, they
    are released before the next assistant message (or at the end), where
    :func:`complete_pairs` then excludes or cancels the open calls.

    Messages that need no move are returned as the same objects.

    Args:
        messages: neutral messages, oldest first.

    Returns:
        a new list with the same messages, oldest first.
    """
    out: list[Message] = []
    held: list[Message] = []
    tracker = CallTracker()
    for message in messages:
        role = message.role
        if role is Role.tool or (role is Role.user and message.tool_results):
            out.append(message)
            tracker.feed(message)
            if not tracker.open:
                out.extend(held)
                held.clear()
        elif role is Role.assistant:
            out.extend(held)
            held.clear()
            out.append(message)
            tracker.feed(message)
        elif tracker.open:
            held.append(message)
        else:
            out.append(message)
            tracker.feed(message)
    out.extend(held)
    return out


def complete_pairs(
    messages: Sequence[Message],
    *,
    open_calls: OpenCallPolicy = "exclude",
    carried: Sequence[ToolCallPart] = (),
    answered_later: AbstractSet[str] | None = None,
    join: StepJoin = "none",
) -> list[Message]:
    """Return ``messages`` with every call answered and every result answering a call.

    Pairing follows :class:`CallTracker`: by call id within a step, so a
    step split into one assistant message per call keeps every call and
    result. Also drops empty and whitespace-only text parts (unless they
    carry extras, such as a Gemini thought signature), and messages left
    with no content. A call left out under ``"exclude"`` that signs its
    model step (:data:`STEP_SIGNATURE_KEYS`) passes its signature to the
    step's first kept call (in whichever of the step's messages), so the
    step is not sent unsigned; likewise a signature on a later call of a
    step whose first call has none moves to the first call. Messages that
    need no change are returned as the same objects, so callers can cache
    their rendering by identity.
    With ``join`` other than ``"none"``, the completed messages then go
    through :func:`join_steps`.

    By default ``messages`` are a whole input: no call is open before the
    first message and every call still open after the last is closed. A
    history renders its turns one span at a time with ``carried`` and
    ``answered_later``, so that the concatenation of the spans equals the
    whole input completed at once:

    * ``carried``: the open calls of a group that began in an earlier span;
      results at the start of this span answer them. Under ``"cancel"`` the
      ones left without a result get their cancelled results here; under
      ``"exclude"`` the earlier span already left them out.
    * ``answered_later``: when not None, the span does not end the input:
      calls open at its end stay open (nothing is cancelled here), and under
      ``"exclude"`` those whose id is not in ``answered_later`` are left out
      of their message (under ``"cancel"``, those of them that cannot be
      cancelled: an opaque call whose output cannot say so).

    Args:
        messages: neutral messages, oldest first.
        open_calls: the policy for calls without a result (see
            :data:`OpenCallPolicy`). Default ``"exclude"``, which follows seed
            004: incomplete pairs are left out of the next model input.
        carried: calls open before the first message, in call order.
        answered_later: ids of the calls open at the end that a later span
            answers, or None when the input ends here.
        join: how the gateway the messages are rendered for needs a step of
            several messages joined (see :data:`StepJoin`).

    Returns:
        a new list of messages, oldest first.
    """
    out: list[Message] = []
    tracker = CallTracker(carried)
    owners: list[int] = []  # indices in ``out`` of the current step's messages with calls
    for message in messages:
        parts = message.parts
        cleaned = _clean_parts(parts)
        group = tracker.group
        step = tracker.feed(message)
        if step.results:
            kept_parts: list[Part] = []
            paired = step.paired
            matched = 0
            for part in cleaned:
                if type(part) is ToolResultPart:
                    # ``paired`` holds the answering results in part order.
                    if matched < len(paired) and part is paired[matched]:
                        matched += 1
                        kept_parts.append(part)
                    continue
                key = _result_key(part) if type(part) is OpaquePart else None
                if key is not None:
                    # An opaque output pairs through its stand-in, which has its key.
                    if (
                        matched < len(paired)
                        and paired[matched].call_id == key
                        and not paired[matched].content
                    ):
                        matched += 1
                        kept_parts.append(part)
                elif message.role is _USER:
                    kept_parts.append(part)
            if not kept_parts:
                continue
            if step.closed:
                if open_calls == "cancel":
                    # The cancelled results go after the results that arrived and
                    # before the text, which starts a new user turn.
                    at = max(
                        (i + 1 for i, p in enumerate(kept_parts) if _result_key(p) is not None),
                        default=0,
                    )
                    cancelled, left_out = _cancelled(step.closed)
                    kept_parts[at:at] = cancelled
                    _drop_calls(out, owners, left_out)
                else:
                    _drop_calls(out, owners, step.closed)
                owners = []
            if len(kept_parts) != len(parts) or (step.closed and open_calls == "cancel"):
                message = msgspec.structs.replace(message, content=tuple(kept_parts))
            out.append(message)
            continue
        # An assistant message continuing the step leaves the group as it was.
        continued = message.role is _ASSISTANT and tracker.group == group
        if not continued:
            _close(out, owners, step.closed, open_calls)
            owners = []
        if not cleaned:
            continue
        if len(cleaned) != len(parts):
            message = msgspec.structs.replace(message, content=cleaned)
        out.append(message)
        if message.role is _ASSISTANT and tracker.open:
            if not continued:
                owners = [len(out) - 1]  # it made the group's calls (the tracker holds them)
                _lift_signature(out, owners)
            elif any(_stand_in_call(p) is not None for p in cleaned):
                owners.append(len(out) - 1)
                _lift_signature(out, owners)
    if answered_later is None:
        _close(out, owners, tuple(tracker.open.values()), open_calls)
    else:
        # Under "cancel" a later span cancels the calls left open; those it cannot
        # (see _cancelled) are left out here, where their message is.
        _drop_calls(
            out,
            owners,
            [
                c
                for c in tracker.open.values()
                if c.call_id not in answered_later
                and (open_calls == "exclude" or _cancelled((c,))[1])
            ],
        )
    return out if join == "none" else join_steps(out, join)


def join_steps(messages: Sequence[Message], join: StepJoin) -> list[Message]:
    """``messages`` with each step of several messages joined as ``join`` says.

    * ``"calls"``: an assistant message continuing a step (see
      :class:`CallTracker`) is appended to the one before it: the joined
      message has both messages' parts in order, and the first one's id,
      name, extras and layout (the later one's where the first has none).
    * ``"reasoning"``: a run of assistant messages holding only reasoning
      (reasoning parts, or opaque ``reasoning`` items, and no id, name,
      extras or layout) is put in front of the parts of the assistant message
      right after it; a run followed by anything else is left as it is.
    * ``"none"``: no change.

    Messages not joined are returned as the same objects.

    Args:
        messages: completed messages (see :func:`complete_pairs`), oldest first.
        join: the gateway's :data:`StepJoin`.

    Returns:
        a new list of messages, oldest first.
    """
    if join == "calls":
        # Only an assistant message directly after another can continue a
        # step, and the first of a run of assistant messages starts a group
        # whatever came before it (CallTracker.feed resets the open calls):
        # so each run is paired on its own, by a tracker fed the run alone,
        # and messages outside runs are fed to none.
        out: list[Message] = []
        tracker: CallTracker | None = None
        for message in messages:
            if message.role is not _ASSISTANT:
                tracker = None
                out.append(message)
                continue
            if tracker is None:
                tracker = CallTracker()
                tracker.feed(message)
                out.append(message)
                continue
            group = tracker.group
            tracker.feed(message)
            if tracker.group == group:
                out[-1] = _joined(out[-1], message)
            else:
                out.append(message)
        return out
    if join == "reasoning":
        out = []
        pending: list[Message] = []
        for message in messages:
            if _reasoning_only(message):
                pending.append(message)
                continue
            if pending:
                if message.role is _ASSISTANT:
                    lead = tuple(p for m in pending for p in m.parts)
                    message = msgspec.structs.replace(message, content=lead + message.parts)
                else:
                    out.extend(pending)
                pending = []
            out.append(message)
        out.extend(pending)
        return out
    return list(messages)


def _reasoning_only(message: Message) -> bool:
    """True for an assistant message of reasoning alone, with nothing else to carry."""
    return (
        message.role is _ASSISTANT
        and message.id is None
        and message.name is None
        and message.extras is None
        and message.layout is None
        and bool(message.parts)
        and all(
            type(p) is ReasoningPart
            or (type(p) is OpaquePart and p.item.get("type") == "reasoning")
            for p in message.parts
        )
    )


def _joined(first: Message, second: Message) -> Message:
    """``first`` with ``second``'s parts after its own (see :func:`join_steps`)."""
    return Message(
        role=first.role,
        content=first.parts + second.parts,
        id=first.id if first.id is not None else second.id,
        name=first.name if first.name is not None else second.name,
        extras=first.extras if first.extras is not None else second.extras,
        layout=first.layout if first.layout is not None else second.layout,
    )


def _drop_calls(out: list[Message], owners: Sequence[int], left: Iterable[ToolCallPart]) -> None:
    """Leave the calls ``left`` out of ``out[k]`` for ``k`` in ``owners``, their step's messages.

    Nothing happens when ``owners`` or ``left`` is empty. A message losing
    calls is replaced by a copy without them, or deleted when nothing else
    remains in it (no later call of the caller's group refers to it: the
    caller forgets ``owners`` after this). When the step's first call is
    left out and signs the step (:data:`STEP_SIGNATURE_KEYS`), the first
    kept call of the step gets its signature unless it has one.
    """
    # An mcp_approval_request stays: the API accepts one left unanswered.
    ids = {c.call_id: c for c in left if not (c.name == APPROVAL_REQUEST and _is_stand_in(c))}
    if not owners or not ids:
        return
    first = next((p for p in out[owners[0]].parts if type(p) is ToolCallPart), None)
    signature: dict[str, object] | None = None
    if first is not None and first.call_id in ids and first.extras:
        signature = {k: v for k, v in first.extras.items() if k in STEP_SIGNATURE_KEYS} or None
    emptied: list[int] = []
    for k in owners:
        message = out[k]
        kept = tuple(p for p in message.parts if not _call_in(p, ids))
        changed = len(kept) != len(message.parts)
        if signature is not None:
            signed = _signed(kept, signature)
            if signed is not None:
                changed = changed or signed is not kept
                kept, signature = signed, None
        if not kept:
            emptied.append(k)
        elif changed:
            out[k] = msgspec.structs.replace(message, content=kept)
    for k in reversed(emptied):
        del out[k]


def _call_in(part: Part, ids: dict[str, ToolCallPart]) -> bool:
    """True when ``part`` is a call (or an opaque call) whose id (pairing key) is in ``ids``."""
    if type(part) is ToolCallPart:
        return part.call_id in ids
    if type(part) is OpaquePart:
        call = _stand_in_call(part)
        return call is not None and call.call_id in ids
    return False


def _has_signature(part: ToolCallPart) -> bool:
    return bool(part.extras) and any(k in part.extras for k in STEP_SIGNATURE_KEYS)  # type: ignore[operator]


def _lift_signature(out: list[Message], owners: Sequence[int]) -> None:
    """Move a step's signature to its first call when a later call carries it.

    The step's calls are those of ``out[k]`` for ``k`` in ``owners``. Nothing
    happens when the first call is signed or no call is. A host that splits
    a step and records its calls in another order than the model's can put
    the signed call after an unsigned one; Gemini reads the signature on the
    step's first call only.
    """
    head = out[owners[0]]
    first = next((p for p in head.parts if type(p) is ToolCallPart), None)
    if first is None or _has_signature(first):
        return
    for k in owners:
        for i, part in enumerate(out[k].parts):
            if type(part) is ToolCallPart and part is not first and _has_signature(part):
                extras = part.extras or {}
                signature = {key: v for key, v in extras.items() if key in STEP_SIGNATURE_KEYS}
                rest = {key: v for key, v in extras.items() if key not in STEP_SIGNATURE_KEYS}
                parts = out[k].parts
                unsigned = msgspec.structs.replace(part, extras=rest or None)
                out[k] = msgspec.structs.replace(
                    out[k], content=(*parts[:i], unsigned, *parts[i + 1 :])
                )
                head = out[owners[0]]
                signed = _signed(head.parts, signature)
                if signed is not None:
                    out[owners[0]] = msgspec.structs.replace(head, content=signed)
                return


def _signed(kept: tuple[Part, ...], signature: dict[str, object]) -> tuple[Part, ...] | None:
    """``kept`` with ``signature`` on its first call, or None when it has no call.

    ``kept`` itself when that call is signed already.
    """
    for i, part in enumerate(kept):
        if type(part) is ToolCallPart:
            if part.extras and any(k in part.extras for k in STEP_SIGNATURE_KEYS):
                return kept
            signed = msgspec.structs.replace(part, extras={**(part.extras or {}), **signature})
            return (*kept[:i], signed, *kept[i + 1 :])
    return None


def _close(
    out: list[Message],
    owners: Sequence[int],
    left: tuple[ToolCallPart, ...],
    open_calls: OpenCallPolicy,
) -> None:
    """Close the calls ``left`` without a result: a cancelled result appended, or left out."""
    if left:
        if open_calls == "cancel":
            cancelled, left_out = _cancelled(left)
            _drop_calls(out, owners, left_out)
            if cancelled:
                out.append(Message(role=Role.tool, content=cancelled))
        else:
            _drop_calls(out, owners, left)

"""Tool call / tool result pairing over neutral messages.

Every provider rejects an input with a tool result whose call is missing, and
every provider but OpenAI Chat rejects a call left without its result. An
input can reach that state when a turn is interrupted (the model called a
tool, the invocation was cancelled before the result) or when a history is
cut. :func:`complete_pairs` makes a message list safe to render.

Pairing is positional, as the providers pair: a result answers a call of the
nearest preceding assistant message with tool calls, and only until the next
user, system, developer or assistant message. A call id may therefore be
reused in a later turn (recorded OpenAI traffic does this); each result pairs
with its own call. :class:`CallTracker` is the one statement of that rule;
everything else here, the history, the area section and the replay parser
apply it through it.
"""

from __future__ import annotations

__all__ = (
    "CANCELLED_RESULT_TEXT",
    "STEP_SIGNATURE_KEYS",
    "CallTracker",
    "OpenCallPolicy",
    "PairingStep",
    "complete_pairs",
    "hold_until_answered",
    "open_call_ids",
)

from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import Literal, NamedTuple, TypeAlias

import msgspec

from turnloom.context.message import (
    Message,
    Part,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    is_blank_text,
)

OpenCallPolicy: TypeAlias = Literal["exclude", "cancel"]
"""What :func:`complete_pairs` does with a call that has no result.

* ``"exclude"`` -- leave the call out (and its assistant message, when nothing
  else remains in it).
* ``"cancel"`` -- close it with an explicit error result whose text is
  :data:`CANCELLED_RESULT_TEXT`, placed after the results that did arrive.
"""

CANCELLED_RESULT_TEXT = "The tool call was cancelled before it returned a result."

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
        if type(part) is TextPart and is_blank_text(part.text) and not part.extras:
            return tuple(
                p
                for p in parts
                if not (type(p) is TextPart and is_blank_text(p.text) and not p.extras)
            )
    return parts


def _cancelled(calls: Iterable[ToolCallPart]) -> tuple[ToolResultPart, ...]:
    return tuple(
        ToolResultPart(
            call_id=call.call_id,
            name=call.name,
            is_error=True,
            content=(TextPart(text=CANCELLED_RESULT_TEXT),),
        )
        for call in calls
    )


def _keep_step_signature(
    parts: tuple[Part, ...], kept: tuple[Part, ...], excluded: dict[str, ToolCallPart]
) -> tuple[Part, ...]:
    """``kept`` with the step signature of an excluded first call on the first kept call."""
    first = next((p for p in parts if type(p) is ToolCallPart), None)
    if first is None or first.call_id not in excluded or not first.extras:
        return kept
    signature = {k: v for k, v in first.extras.items() if k in STEP_SIGNATURE_KEYS}
    if not signature:
        return kept
    for i, part in enumerate(kept):
        if type(part) is ToolCallPart:
            if part.extras and any(k in part.extras for k in STEP_SIGNATURE_KEYS):
                return kept
            signed = msgspec.structs.replace(part, extras={**(part.extras or {}), **signature})
            return (*kept[:i], signed, *kept[i + 1 :])
    return kept


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


_NO_STEP = PairingStep((), (), (), False)
# Bound once: an attribute of an Enum class is looked up through its
# metaclass's ``__getattr__`` hook (about 0.1 us per use on CPython 3.11).
_ASSISTANT, _TOOL, _USER = Role.assistant, Role.tool, Role.user


def _ends_group(part: Part) -> bool:
    """True for a part that, beside tool results in a user message, starts a new user turn."""
    return type(part) is not ToolResultPart and not (
        type(part) is TextPart and is_blank_text(part.text) and not part.extras
    )


class CallTracker:
    """The pairing rule, applied one message at a time, oldest first.

    This is the only statement of the rule; history rendering, the area
    section, routed items and the replay parser all use it. A *call group*
    is the tool calls of one assistant message (with ``model_turns=True``:
    of consecutive assistant messages, as OpenAI Responses emits one item per
    call). A tool result answers a call of the current group with its id and
    only until the group ends; a result with any other id is an orphan. The
    group ends at the next assistant message (which starts the next group),
    at a ``user``, ``system`` or ``developer`` message, and at a ``user``
    message that carries non-blank content besides its tool results (after
    those results). Calls still open when their group ends are *closed*
    without a result. A call id may be reused by a later group; each result
    pairs with its own group's call.

    Source: OpenAI Chat ``tool`` messages follow their ``tool_calls``
    message; Anthropic ``tool_result`` blocks open the next user turn; Gemini's
    function-response turn follows the call turn.

    Args:
        carried: calls of a group that began before the first message fed
            (a span continuing an earlier one), still without a result.
        model_turns: let consecutive assistant messages form one group.

    Attributes:
        open: the current group's calls without a result yet, by call id, in
            call order. Read-only for callers.
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
        self._in_model_turn = False

    @property
    def open_ids(self) -> tuple[str, ...]:
        """Ids of :attr:`open`, in call order."""
        return tuple(self.open)

    def copy(self) -> CallTracker:
        """An independent tracker in the same state."""
        twin = CallTracker(self.open.values(), model_turns=self._model_turns)
        twin.group = self.group
        twin._in_model_turn = self._in_model_turn
        return twin

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
            if self._model_turns and self._in_model_turn:
                for part in parts:
                    if type(part) is ToolCallPart:
                        self.open[part.call_id] = part
                return _NO_STEP
            self._in_model_turn = True
            left = self.open
            # The group ends (see _end); this message's calls open the next one.
            self.group += 1
            self.open = {p.call_id: p for p in parts if type(p) is ToolCallPart}
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
            if paired or orphans or role is _TOOL:
                ended: tuple[ToolCallPart, ...] = ()
                if role is _USER and any(_ends_group(p) for p in parts):
                    ended = self._end()
                return PairingStep(tuple(paired), tuple(orphans), ended, True)
        closed = self._end()
        return PairingStep((), (), closed, False) if closed else _NO_STEP


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
) -> list[Message]:
    """Return ``messages`` with every call answered and every result answering a call.

    Pairing follows :class:`CallTracker`. Also drops empty and
    whitespace-only text parts (unless they carry extras, such as a Gemini
    thought signature), and messages left with no content. A call left out
    under ``"exclude"`` that signs its model step (:data:`STEP_SIGNATURE_KEYS`)
    passes its signature to the step's first kept call, so the step is not
    sent unsigned. Messages that need no change are returned as the same
    objects, so callers can cache their rendering by identity.

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
      of their message.

    Args:
        messages: neutral messages, oldest first.
        open_calls: the policy for calls without a result (see
            :data:`OpenCallPolicy`). Default ``"exclude"``, which follows seed
            004: incomplete pairs are left out of the next model input.
        carried: calls open before the first message, in call order.
        answered_later: ids of the calls open at the end that a later span
            answers, or None when the input ends here.

    Returns:
        a new list of messages, oldest first.
    """
    out: list[Message] = []
    tracker = CallTracker(carried)
    owner = -1  # index in ``out`` of the current group's assistant message
    for message in messages:
        parts = message.parts
        cleaned = _clean_parts(parts)
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
                elif message.role is _USER:
                    kept_parts.append(part)
            if not kept_parts:
                continue
            if step.closed:
                if open_calls == "cancel":
                    # The cancelled results go after the results that arrived and
                    # before the text, which starts a new user turn.
                    at = max(
                        (i + 1 for i, p in enumerate(kept_parts) if type(p) is ToolResultPart),
                        default=0,
                    )
                    kept_parts[at:at] = _cancelled(step.closed)
                else:
                    _drop_calls(out, owner, step.closed)
                owner = -1
            if len(kept_parts) != len(parts) or (step.closed and open_calls == "cancel"):
                message = msgspec.structs.replace(message, content=tuple(kept_parts))
            out.append(message)
            continue
        _close(out, owner, step.closed, open_calls)
        owner = -1
        if not cleaned:
            continue
        if len(cleaned) != len(parts):
            message = msgspec.structs.replace(message, content=cleaned)
        out.append(message)
        if message.role is _ASSISTANT and tracker.open:
            owner = len(out) - 1  # it made the group's calls (the tracker holds them)
    if answered_later is None:
        _close(out, owner, tuple(tracker.open.values()), open_calls)
    elif open_calls == "exclude":
        _drop_calls(
            out, owner, [c for c in tracker.open.values() if c.call_id not in answered_later]
        )
    return out


def _drop_calls(out: list[Message], owner: int, left: Iterable[ToolCallPart]) -> None:
    """Leave the calls ``left`` out of ``out[owner]``, their group's assistant message.

    Nothing happens when ``owner`` is negative (no such message) or ``left``
    is empty. The message is replaced by a copy without those calls (a step
    signature moved, see :func:`_keep_step_signature`), or deleted when
    nothing else remains in it (no later call of the caller's group refers
    to it: the caller forgets ``owner`` after this).
    """
    ids = {c.call_id: c for c in left}
    if owner < 0 or not ids:
        return
    message = out[owner]
    kept = tuple(p for p in message.parts if not (type(p) is ToolCallPart and p.call_id in ids))
    kept = _keep_step_signature(message.parts, kept, ids)
    if kept:
        out[owner] = msgspec.structs.replace(message, content=kept)
    else:
        del out[owner]


def _close(
    out: list[Message], owner: int, left: tuple[ToolCallPart, ...], open_calls: OpenCallPolicy
) -> None:
    """Close the calls ``left`` without a result: a cancelled result appended, or left out."""
    if left:
        if open_calls == "cancel":
            out.append(Message(role=Role.tool, content=_cancelled(left)))
        else:
            _drop_calls(out, owner, left)

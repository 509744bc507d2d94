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
with its own call.
"""

from __future__ import annotations

__all__ = (
    "CANCELLED_RESULT_TEXT",
    "STEP_SIGNATURE_KEYS",
    "OpenCallPolicy",
    "complete_pairs",
    "hold_until_answered",
    "open_call_ids",
    "unanswered_calls",
)

from collections.abc import Iterable, Sequence
from typing import Literal, TypeAlias

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


def _clean_parts(parts: Iterable[Part]) -> tuple[Part, ...]:
    return tuple(
        p for p in parts if not (type(p) is TextPart and is_blank_text(p.text) and not p.extras)
    )


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


def open_call_ids(messages: Sequence[Message]) -> tuple[str, ...]:
    """Ids of the calls of the last call group that have no result yet, in call order."""
    pending: dict[str, None] = {}
    for message in messages:
        if message.role is Role.assistant:
            calls = message.tool_calls
            if calls or message.text.strip():
                pending = {c.call_id: None for c in calls}
        elif message.role is Role.tool or (message.role is Role.user and message.tool_results):
            for result in message.tool_results:
                pending.pop(result.call_id, None)
        elif message.role is Role.user:
            pending = {}
    return tuple(pending)


def unanswered_calls(call_ids: Sequence[str], result_ids: Sequence[str]) -> tuple[str, ...]:
    """The calls of one model turn that its results leave unanswered, in call order.

    A result answers the call with its id; results whose id matches no call
    answer the remaining calls in order (a Gemini function response may carry
    no id). Source: OpenAI Chat ``tool`` messages, Anthropic ``tool_result``
    blocks and Gemini function-response turns all follow their call turn.

    Args:
        call_ids: the call ids of the model turn, in call order.
        result_ids: the call ids the results that followed it carry.
    """
    called = set(call_ids)
    answered = set(result_ids)
    unmatched = sum(1 for r in result_ids if r not in called)
    return tuple(c for c in call_ids if c not in answered)[unmatched:]


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
        a new list with the same messages, oldest first. A notice injected
        while a call is open goes after its result.
    """
    out: list[Message] = []
    held: list[Message] = []
    pending: set[str] = set()
    for message in messages:
        role = message.role
        if role is Role.tool or (role is Role.user and message.tool_results):
            out.append(message)
            pending.difference_update(r.call_id for r in message.tool_results)
            if not pending:
                out.extend(held)
                held.clear()
        elif role is Role.assistant:
            out.extend(held)
            held.clear()
            out.append(message)
            pending = {c.call_id for c in message.tool_calls}
        elif pending:
            held.append(message)
        else:
            out.append(message)
    out.extend(held)
    return out


def complete_pairs(
    messages: Sequence[Message], *, open_calls: OpenCallPolicy = "exclude"
) -> list[Message]:
    """Return ``messages`` with every call answered and every result answering a call.

    Also drops empty and whitespace-only text parts (unless they carry
    extras, such as a Gemini thought signature), and messages left with no
    content. A call left out under ``"exclude"`` that signs its model step
    (:data:`STEP_SIGNATURE_KEYS`) passes its signature to the step's first
    kept call, so the step is not sent unsigned. Messages that need no
    change are returned as the same objects, so callers can cache their
    rendering by identity.

    Args:
        messages: neutral messages, oldest first.
        open_calls: the policy for calls without a result (see
            :data:`OpenCallPolicy`). Default ``"exclude"``, which follows seed
            004: incomplete pairs are left out of the next model input.

    Returns:
        a new list of messages, oldest first.
    """
    out: list[Message] = []
    # State of the current call group: index in ``out`` of its assistant
    # message, the calls still open, and where to insert cancelled results.
    group_at = -1
    pending: dict[str, ToolCallPart] = {}

    def close_group() -> None:
        nonlocal group_at
        if pending and group_at >= 0:
            if open_calls == "cancel":
                out.append(Message(role=Role.tool, content=_cancelled(pending.values())))
            else:
                owner = out[group_at]
                kept = tuple(
                    p for p in owner.parts if not (type(p) is ToolCallPart and p.call_id in pending)
                )
                kept = _keep_step_signature(owner.parts, kept, pending)
                if kept:
                    out[group_at] = msgspec.structs.replace(owner, content=kept)
                else:
                    del out[group_at]
        pending.clear()
        group_at = -1

    for message in messages:
        role = message.role
        parts = message.parts
        cleaned = _clean_parts(parts)
        is_results = role is Role.tool or (role is Role.user and bool(message.tool_results))
        if is_results:
            kept_parts: list[Part] = []
            for part in cleaned:
                if type(part) is ToolResultPart:
                    if part.call_id in pending:
                        del pending[part.call_id]
                        kept_parts.append(part)
                elif role is Role.user:
                    kept_parts.append(part)
            if not kept_parts:
                continue
            ends_group = role is Role.user and any(
                type(p) is not ToolResultPart for p in kept_parts
            )
            if ends_group and open_calls == "cancel" and pending:
                # The cancelled results go after the results that arrived and
                # before the text, which starts a new user turn.
                at = max(
                    (i + 1 for i, p in enumerate(kept_parts) if type(p) is ToolResultPart),
                    default=0,
                )
                kept_parts[at:at] = _cancelled(pending.values())
                pending.clear()
            if len(kept_parts) != len(parts):
                message = msgspec.structs.replace(message, content=tuple(kept_parts))
            if ends_group:
                # Text after the results starts a new user turn: the group ends.
                close_group()
            out.append(message)
            continue
        close_group()
        if not cleaned:
            continue
        if len(cleaned) != len(parts):
            message = msgspec.structs.replace(message, content=cleaned)
        out.append(message)
        if role is Role.assistant:
            calls = message.tool_calls
            if calls:
                group_at = len(out) - 1
                pending = {c.call_id: c for c in calls}
    close_group()
    return out

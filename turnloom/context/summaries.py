"""Summary compaction and pruning of old tool output: the policies, checks and transforms.

*Summary compaction* replaces a context's oldest closed turns by a summary the
host's summarizer wrote (turnloom never calls a model itself). The summary is
held as one turn of its own, the *summary turn*, first in the history: after
the pinned instructions and before the retained turns, made of ``user``
messages (then, optionally, ``assistant`` messages) with text only. It is
data the model reads, never instructions: a summary of client text is never
promoted into ``system`` or ``developer`` messages (DESIGN rule 3). Its id
starts with :data:`SUMMARY_TURN_PREFIX`; the next summary compaction hands it
to the summarizer first, with the turns after it (a summary of a summary, so
nothing the model was told is dropped unsaid). Eviction keeps it first and
drops it last (``TurnHistory.evict``). The runtime decides when
(:class:`CompactionPolicy`) and applies a summary atomically at a safe point
(``turnloom.runtime`` ``manager.summaries``).

*Pruning* keeps every turn but replaces the bodies of tool results older than
the newest ``keep_turns`` turns by a short note (the call, its id, its
result's id and error flag stay: pairs are kept) and drops their reasoning
parts (:class:`PrunePolicy`, :func:`prune_messages`). A pruned message prunes
to itself, so a pruned turn is byte-stable from then on.

Neither is the stores' *log compaction* (a context's long log replaced by one
checkpoint record, ``turnloom.runtime._durable``) nor the cached run's *slot
compaction* (the history's rendered run moved into new containers once a
sixteenth of it was dropped, ``turnloom.context.history``). This module is
synchronous and pure.
"""

from __future__ import annotations

__all__ = (
    "DEFAULT_PRUNE_NOTE",
    "SUMMARY_TURN_PREFIX",
    "CompactionPolicy",
    "PrunePolicy",
    "check_summary",
    "is_summary_turn",
    "prune_messages",
    "summary_due",
)

import math
from collections.abc import Sequence
from typing import Annotated

import msgspec

from turnloom.context.message import (
    Message,
    OpaquePart,
    Part,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    admit_message,
)
from turnloom.errors import InputError, InvalidMessageError, excerpt, what_type

SUMMARY_TURN_PREFIX = "turnloom.summary."
"""How the id of a summary turn starts; a host's own turn ids should not."""

DEFAULT_PRUNE_NOTE = "[tool output pruned: it is older than the turns kept in full]"
"""The text a pruned tool result carries in place of its content."""

_MAX_NOTE_CHARS = 1024


class CompactionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """When a context's oldest turns are summarized, and down to what.

    A summarization starts (in the runtime's own task, never inside a
    prepare) at a safe point where the history holds more than
    ``trigger_turns`` turns or more than ``trigger_tokens`` tokens (either
    that is set; keep them below the history limits so the summary usually
    lands before eviction has to drop anything). It is given the oldest turns
    (the previous summary turn first, if any) so that at most ``keep_turns``
    turns, and with ``keep_tokens`` at most that many tokens, stay after it
    (the newest turn always stays), cut where eviction would cut (tool calls
    and the results that answer them stay together).

    Args:
        trigger_turns: start above this many held turns (the summary turn
            counts), or None.
        trigger_tokens: start above this many held tokens (the history's
            token counter), or None.
        keep_turns: the low-water mark: turns kept after the summary, at
            least 1.
        keep_tokens: a low-water mark in tokens (the history's counter) for
            the turns kept after the summary, or None.
        timeout: seconds a summarizer may take; past it the summarization is
            cancelled and counted as failed (reason ``"timeout"``).
        max_summary_messages: the most messages a summary may hold.

    Raises:
        InputError: no trigger set, a bound not positive, a timeout that is
            not a positive finite number.
    """

    trigger_turns: int | None = None
    trigger_tokens: int | None = None
    keep_turns: int = 8
    keep_tokens: int | None = None
    timeout: float = 30.0
    max_summary_messages: int = 8

    def __post_init__(self) -> None:
        if self.trigger_turns is None and self.trigger_tokens is None:
            raise InputError("A CompactionPolicy needs trigger_turns or trigger_tokens.")
        for name in (
            "trigger_turns",
            "trigger_tokens",
            "keep_turns",
            "keep_tokens",
            "max_summary_messages",
        ):
            value = getattr(self, name)
            if value is None and name in ("trigger_turns", "trigger_tokens", "keep_tokens"):
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(
                    f"CompactionPolicy.{name} must be a positive int, not {excerpt(value)}."
                )
        if self.trigger_turns is not None and self.trigger_turns <= self.keep_turns:
            raise InputError(
                f"CompactionPolicy.trigger_turns ({self.trigger_turns}) must be greater than "
                f"keep_turns ({self.keep_turns}): a summary must leave fewer turns than started it."
            )
        timeout = self.timeout
        if (
            not isinstance(timeout, (int, float))
            or isinstance(timeout, bool)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise InputError(
                f"CompactionPolicy.timeout must be a positive number of seconds, not "
                f"{excerpt(timeout)}."
            )


class PrunePolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Which turns have their tool output pruned, and what a pruned result says.

    At each safe point, the turns before the newest ``keep_turns`` (the
    summary turn aside: it has no tool output) are pruned
    (:func:`prune_messages`). Pruning changes an earlier turn, so the cached
    prefix is rendered anew from the first turn pruned; each turn is pruned
    once.

    Args:
        keep_turns: the newest turns kept in full, at least 1.
        note: the text a pruned tool result holds (non-empty, at most 1,024
            characters).

    Raises:
        InputError: ``keep_turns`` is not a positive int, or ``note`` is not
            such a text.
    """

    keep_turns: Annotated[int, msgspec.Meta(ge=1)] = 4
    note: str = DEFAULT_PRUNE_NOTE

    def __post_init__(self) -> None:
        keep = self.keep_turns
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise InputError(f"PrunePolicy.keep_turns must be a positive int, not {excerpt(keep)}.")
        note = self.note
        if not isinstance(note, str) or not note.strip() or len(note) > _MAX_NOTE_CHARS:
            raise InputError(
                "PrunePolicy.note must be non-blank text of at most "
                f"{_MAX_NOTE_CHARS} characters, not {excerpt(note)}."
            )
        try:
            note.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(f"PrunePolicy.note {excerpt(note)} is not valid UTF-8.") from None


def is_summary_turn(turn_id: str) -> bool:
    """Whether ``turn_id`` names a summary turn (it starts with :data:`SUMMARY_TURN_PREFIX`)."""
    return turn_id.startswith(SUMMARY_TURN_PREFIX)


def summary_due(policy: CompactionPolicy, turns: int, tokens: int) -> bool:
    """Whether a history holding ``turns`` turns and ``tokens`` tokens should be summarized."""
    return (policy.trigger_turns is not None and turns > policy.trigger_turns) or (
        policy.trigger_tokens is not None and tokens > policy.trigger_tokens
    )


def check_summary(
    summary: object, max_messages: int
) -> tuple[tuple[Message, ...], tuple[Message, ...]]:
    """Check what a summarizer returned; split it into the summary turn's input and outputs.

    A summary is a non-empty sequence of at most ``max_messages``
    :class:`Message`: one or more ``user`` messages, then zero or more
    ``assistant`` messages, each holding only non-blank text parts (no tool
    calls, results, reasoning or images: a summary never splits a pair and
    carries no provider signature). Each message passes the door's check
    (:func:`~turnloom.context.message.admit_message`: every field of its
    type) first; sizes and ids are checked when the history takes it.

    Returns:
        (the leading ``user`` messages, the ``assistant`` messages after them),
        as the door holds them (see ``admit_message``).

    Raises:
        InvalidMessageError: anything else (``field`` names what is wrong),
            also a sequence that raises when read.
        InvalidTextError: a text that is not valid UTF-8.
        DuplicateIdError: a message holds two tool calls with one call id.
    """
    if isinstance(summary, (str, bytes, Message)) or not isinstance(summary, Sequence):
        raise InvalidMessageError(
            f"A summary is a sequence of Message, not {what_type(summary)}.", field="summary"
        )
    try:
        messages = tuple(summary)
    except Exception as exc:  # a host's Sequence: whatever its __iter__ raises
        raise InvalidMessageError(
            f"A summary could not be read: {type(exc).__name__}: {excerpt(str(exc))}.",
            field="summary",
        ) from exc
    if not messages or len(messages) > max_messages:
        raise InvalidMessageError(
            f"A summary holds 1 to {max_messages} messages, not {len(messages)}.",
            field="summary",
        )
    split = 0
    held: list[Message] = []
    for i, given in enumerate(messages):
        if not isinstance(given, Message):
            raise InvalidMessageError(
                f"summary[{i}] is {what_type(given)}, not a Message.", field=f"summary[{i}]"
            )
        message = admit_message(given, where=f"summary[{i}]")[0]
        held.append(message)
        if message.role is Role.user and split == i:
            split += 1
        elif message.role is not Role.assistant or i == 0:
            raise InvalidMessageError(
                f"summary[{i}] has role {excerpt(str(message.role))}; a summary is user "
                "messages, then assistant messages (data, never instructions).",
                field=f"summary[{i}].role",
            )
        parts = message.parts
        if not parts:
            raise InvalidMessageError(f"summary[{i}] is empty.", field=f"summary[{i}].content")
        for j, part in enumerate(parts):
            if not isinstance(part, TextPart) or not part.text.strip():
                raise InvalidMessageError(
                    f"summary[{i}].content[{j}] is a {type(part).__name__}"
                    f"{' (blank)' if isinstance(part, TextPart) else ''}; a summary holds "
                    "non-blank text only.",
                    field=f"summary[{i}].content[{j}]",
                )
    return tuple(held[:split]), tuple(held[split:])


_RESPONSES = "openai_responses"
_ITEM_ID = "id"
_UNREASONED = "unreasoned"  # the Responses layout hint: rendered in input form, no id


def prune_messages(messages: Sequence[Message], note: str) -> tuple[Message, ...] | None:
    """``messages`` with tool-result bodies replaced by ``note`` and reasoning parts dropped.

    Each tool result keeps its ``call_id``, ``name``, ``is_error`` and
    ``extras`` and holds one text part, ``note``; every call stays as it is
    (its id, arguments and provider signature), so each pair stays whole,
    but for the OpenAI Responses item id (``extras["id"]``, ``fc_...``) of a
    call after a dropped Responses reasoning part in the same response (that
    message and the assistant messages right after it): the API refuses such
    an id sent without its reasoning item. By the same rule such a message
    with a Responses ``Message.id`` (its output message, ``msg_...``) gets
    the ``"unreasoned"`` layout hint, which renders it in input form without
    the id (a refusal part, which only the output form carries, is then left
    out); ``Message.id`` itself is kept. A message left with no part
    (reasoning alone) is dropped. Pruning is idempotent: pruned messages
    prune to themselves.

    Returns:
        the pruned messages, oldest first, or None when nothing changes.
    """
    each = prune_each(messages, note)
    return None if each is None else tuple([m for m in each if m is not None])


def prune_each(messages: Sequence[Message], note: str) -> tuple[Message | None, ...] | None:
    """:func:`prune_messages`, one answer per message: the message itself when
    pruning leaves it as it is, its pruned form, or None when it is dropped
    (reasoning alone); None when nothing changes. For a caller that keeps
    something per message (the history's entries). O(parts).
    """
    body = (TextPart(text=note),)
    out: list[Message | None] = []
    changed = False
    unreasoned = False  # inside a Responses response whose reasoning was dropped
    for message in messages:
        parts = message.parts
        kept: list[Part] = []
        touched = False
        if message.role is not Role.assistant:
            unreasoned = False
        for part in parts:
            if isinstance(part, ReasoningPart):
                touched = True
                unreasoned = unreasoned or part.gateway == _RESPONSES
            elif isinstance(part, ToolResultPart) and part.content != body:
                kept.append(msgspec.structs.replace(part, content=body))
                touched = True
            elif unreasoned and isinstance(part, ToolCallPart) and _ITEM_ID in (part.extras or {}):
                # OpenAI Responses refuses a call item id (fc_...) whose response's
                # reasoning item is not sent ("provided without its required 'reasoning'
                # item"); the call pairs its output by call_id, which stays.
                extras = {k: v for k, v in (part.extras or {}).items() if k != _ITEM_ID}
                kept.append(msgspec.structs.replace(part, extras=extras or None))
                touched = True
            else:
                kept.append(part)
        layout = message.layout
        if (
            unreasoned
            and message.id is not None
            and layout is not None
            and layout.get("gateway") == _RESPONSES
            and not layout.get(_UNREASONED)
            and any(
                isinstance(part, TextPart)
                or (isinstance(part, OpaquePart) and part.item.get("type") == "refusal")
                for part in kept
            )
        ):
            # The same rule for the response's output message (msg_..., its
            # Message.id): it is rendered in input form, without the id. The
            # Message.id stays, the key of the history's id index.
            layout = {**layout, _UNREASONED: True}
            touched = True
        if not touched:
            out.append(message)
            continue
        changed = True
        out.append(
            msgspec.structs.replace(message, content=tuple(kept), layout=layout) if kept else None
        )
    return tuple(out) if changed else None

"""The runtime-state pair: per-turn state as one synthetic tool call and its result.

Volatile per-turn state (behaviour rules, the static loop budget, what the
host perceived -- time, modality, source -- and named contributions such as
memory) must not rewrite the durable,
cache-stable history, and client-supplied text must never become a system or
developer instruction. turnloom therefore carries it as data: an assistant
message calling the tool :data:`STATE_TOOL_NAME`, followed by its result,
placed directly after the current turn's input.

* The call id is derived from the context id and the turn id
  (:func:`state_call_id`), so it is the same in every model call of the turn.
* The result text is a JSON document (:func:`state_messages`): every string is
  JSON-escaped, so contribution text cannot close the document or pose as a
  message of its own.
* The pair is never recorded into history: ``accept_turn``, ``record`` and
  ``build`` reject messages that carry it. Every call id of the form
  ``tlrs_`` + 24 lowercase hex digits is reserved for it, and so is every id
  a provider sends in that form (``tlrs.`` + 24 hex digits: Anthropic turns
  the ``.`` into ``_``), so no message can place the state call or result of
  another turn ahead of time.
* With no behaviour rules, no loop budget, no perception and no
  contributions, there is no pair: the prepared input is exactly the history.

Earlier turns' pairs (:data:`EarlierStatePolicy`). Providers cache a request
by exact prefix. By default (``"keep"``) each turn keeps the pair of its last
delivered unscoped preparation, byte for byte (same call id, same text), in
its place after the turn's input and before its outputs, in every later
input: the previous model input is then a prefix of the next while the
history does not evict, and the kept pair counts against the history's limits
(items, bytes, tokens) and leaves with its turn. A pair that carries
recalled memory (an assembly strategy's per-turn layer) is never kept: the
memory was recalled for that request's tenant, and a later turn of the
context may be prepared for another one; such a turn's later inputs hold no
pair, as under ``"drop"``. Neither is a pair whose result, sent within the
per-item byte cap, is over it as a history message (its encoding is
longer). ``"drop"`` sends only the current turn's pair: each new turn's
input differs from the previous input right after the previous turn's
input, so what follows it is billed again.

Everything here is pure and synchronous.
"""

from __future__ import annotations

__all__ = (
    "STATE_TOOL_NAME",
    "EarlierStatePolicy",
    "check_contributions",
    "check_perception",
    "check_time",
    "is_state_message",
    "read_clock",
    "state_call_id",
    "state_messages",
    "state_tool_definition",
)

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, TypeAlias

import msgspec

from turnloom.context.gateway import Gateway, GatewayType, get_gateway
from turnloom.context.message import Message, Role, TextPart, ToolCallPart, ToolResultPart
from turnloom.errors import (
    DuplicateIdError,
    HostCallbackError,
    InvalidMessageError,
    InvalidTextError,
    TurnloomError,
    excerpt,
    type_name,
    what_type,
)
from turnloom.runtime.schemas import ContextContribution, Perception

STATE_TOOL_NAME = "turnloom_runtime_context"
"""The tool name of the synthetic runtime-state call."""

EarlierStatePolicy: TypeAlias = Literal["keep", "drop"]
"""What later inputs hold of an earlier turn's runtime-state pair.

``"keep"`` (default): the pair of the turn's last delivered unscoped
preparation, exactly as it was sent, after the turn's input (none when that
pair carried recalled memory). ``"drop"``: nothing; only the current turn
carries its pair.
"""

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,63}")
# The reserved form, and every id a provider's id rule sends as it: Anthropic's
# turns each character outside [a-zA-Z0-9_-] into "_" (gateways/anthropic.py).
_STATE_ID = re.compile(r"tlrs[^a-zA-Z0-9-][0-9a-f]{24}")
_encoder = msgspec.json.Encoder()


def state_call_id(context_id: str, turn_id: str) -> str:
    """The call id of the runtime-state pair of one turn: ``"tlrs_"`` + 24 hex digits.

    Deterministic: a BLAKE2b digest of the length-prefixed context id and the
    turn id, so ``("a", "bc")`` and ``("ab", "c")`` differ.
    """
    key = f"{len(context_id)}:{context_id}:{turn_id}".encode()
    return "tlrs_" + hashlib.blake2b(key, digest_size=12).hexdigest()


def _check_text(value: str, what: str) -> None:
    if not isinstance(value, str):
        raise InvalidMessageError(f"{what} must be a string, not {what_type(value)}.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidTextError(f"{what} is not valid UTF-8 ({exc.reason}).") from None


def check_contributions(
    contributions: Sequence[ContextContribution],
    behavior_rules: str | None,
    loop_budget: int | None,
) -> None:
    """Validate the state of one preparation request at the door.

    Raises:
        InvalidMessageError: ``contributions`` is not a tuple or list, a
            contribution is not a :class:`ContextContribution` or has a
            malformed name, or ``loop_budget`` is not a positive integer.
        InvalidTextError: text that is not valid UTF-8 (a lone surrogate).
        DuplicateIdError: two contributions share a name.
    """
    if not isinstance(contributions, tuple | list):
        raise InvalidMessageError(
            "contributions must be a tuple of ContextContribution, not "
            f"{what_type(contributions)}.",
            field="contributions",
        )
    seen: set[str] = set()
    for i, contribution in enumerate(contributions):
        if not isinstance(contribution, ContextContribution):
            raise InvalidMessageError(
                f"contributions[{i}] is {what_type(contribution)}, not a ContextContribution."
            )
        name = contribution.name
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidMessageError(
                f"contributions[{i}] name {excerpt(name)} is not an identifier: a letter, then "
                "at most 63 letters, digits, '_', '-' or '.'.",
                field=f"contributions[{i}].name",
            )
        if name in seen:
            raise DuplicateIdError(f"Two contributions are named {excerpt(name)}.")
        seen.add(name)
        _check_text(contribution.content, f"contributions[{i}] ({name}) content")
    if behavior_rules is not None:
        _check_text(behavior_rules, "behavior_rules")
    if loop_budget is not None and (
        not isinstance(loop_budget, int) or isinstance(loop_budget, bool) or loop_budget < 1
    ):
        raise InvalidMessageError(
            f"loop_budget must be a positive integer, not {excerpt(loop_budget)}."
        )


def check_time(value: object, what: str) -> datetime:
    """A timezone-aware datetime, converted to UTC.

    Raises:
        InvalidMessageError: ``value`` is not a datetime, or it is naive (no
            timezone: its instant is unknown).
    """
    if not isinstance(value, datetime):
        raise InvalidMessageError(f"{what} must be a datetime, not {what_type(value)}.", field=what)
    if value.utcoffset() is None:
        raise InvalidMessageError(
            f"{what} must be timezone-aware (for example datetime.now(UTC)); a naive "
            "datetime names no instant.",
            field=what,
        )
    return value.astimezone(UTC)


def read_clock(clock: Callable[[], datetime]) -> datetime:
    """The current time from the host's ``clock``, checked (:func:`check_time`), in UTC.

    Raises:
        HostCallbackError: ``clock`` raised an exception that is not a
            :class:`~turnloom.errors.TurnloomError` (it is the ``__cause__``;
            ``callback`` is ``"clock"``).
        InvalidMessageError: it returned something that is not a datetime,
            or a naive one.
    """
    try:
        now = clock()
    except TurnloomError:
        raise
    except Exception as exc:
        raise HostCallbackError(
            f"The Foundation's clock raised {type_name(exc)}: {excerpt(str(exc))}.",
            callback="clock",
        ) from exc
    return check_time(now, "The Foundation's clock value")


def check_perception(perception: object) -> Perception:
    """Validate a request's perception at the door; return a private, normalized copy.

    The copy has its time in UTC and its source properties in a new dict
    sorted by key, so a dict the caller changes afterwards changes nothing.

    Raises:
        InvalidMessageError: not a :class:`Perception`, a naive or non-datetime
            time, a modality or source key that is not an identifier (a
            letter, then at most 63 letters, digits, ``_``, ``-`` or ``.``), or
            a source value that is not a string; ``field`` names it.
        InvalidTextError: a source value that is not valid UTF-8.
    """
    if not isinstance(perception, Perception):
        raise InvalidMessageError(
            f"perception must be a Perception, not {what_type(perception)}.",
            field="perception",
        )
    time = perception.time
    if time is not None:
        time = check_time(time, "perception.time")
    modality = perception.modality
    if modality is not None and not (isinstance(modality, str) and _NAME.fullmatch(modality)):
        raise InvalidMessageError(
            f"perception.modality {excerpt(str(modality)[:64])} is not an identifier such as "
            "'text', 'voice' or 'video'.",
            field="perception.modality",
        )
    source = perception.source
    if not isinstance(source, Mapping):
        raise InvalidMessageError(
            f"perception.source must be a mapping of str to str, not {what_type(source)}.",
            field="perception.source",
        )
    for key, value in source.items():
        if not (isinstance(key, str) and _NAME.fullmatch(key)):
            raise InvalidMessageError(
                f"perception.source key {excerpt(str(key)[:64])} is not an identifier: a letter, "
                "then at most 63 letters, digits, '_', '-' or '.'.",
                field="perception.source",
            )
        _check_text(value, f"perception.source[{excerpt(key)}]")
    return Perception(time=time, modality=modality, source=dict(sorted(source.items())))


def state_messages(
    context_id: str,
    turn_id: str,
    *,
    contributions: Sequence[ContextContribution] = (),
    behavior_rules: str | None = None,
    loop_budget: int | None = None,
    perception: Perception | None = None,
    memory: dict[str, Any] | None = None,
) -> tuple[Message, Message] | None:
    """The runtime-state call and result messages of one turn, or None when empty.

    The result's text is the JSON object ``{"context_id", "turn_id",
    "behavior_rules"?, "loop_budget"?, "perception"?: {"time"?, "modality"?,
    "source"}, "memory"?, "sections": [{"name", "content"}, ...]}`` with keys
    in that order; ``time`` is RFC 3339 in UTC (``"2026-11-30T17:00:00Z"``);
    ``memory`` is the turn's recalled memory (the per-turn layer of an
    assembly strategy), as JSON data. Equal inputs give byte-identical output.

    Returns:
        ``(assistant call message, tool result message)``, or None when there
        is no behaviour rule, no loop budget, no perception, no memory and no
        contribution.
    """
    if (
        not contributions
        and behavior_rules is None
        and loop_budget is None
        and perception is None
        and memory is None
    ):
        return None
    document: dict[str, object] = {"context_id": context_id, "turn_id": turn_id}
    if behavior_rules is not None:
        document["behavior_rules"] = behavior_rules
    if loop_budget is not None:
        document["loop_budget"] = loop_budget
    if perception is not None:
        seen: dict[str, object] = {}
        if perception.time is not None:
            seen["time"] = perception.time
        if perception.modality is not None:
            seen["modality"] = perception.modality
        seen["source"] = perception.source
        document["perception"] = seen
    if memory is not None:
        document["memory"] = memory
    document["sections"] = [{"name": c.name, "content": c.content} for c in contributions]
    text = _encoder.encode(document).decode()
    call_id = state_call_id(context_id, turn_id)
    call = Message(
        role=Role.assistant,
        content=(ToolCallPart(call_id=call_id, name=STATE_TOOL_NAME, arguments="{}"),),
        # The model did not produce this call: Gemini sends it with Google's
        # placeholder thought signature (other gateways ignore the hint).
        layout={"gateway": GatewayType.gemini.value, "injected": True},
    )
    result = Message(
        role=Role.tool,
        content=(
            ToolResultPart(call_id=call_id, name=STATE_TOOL_NAME, content=(TextPart(text=text),)),
        ),
    )
    return call, result


_STATE_TOOL_DESCRIPTION = (
    "Returns the runtime context of the current turn (behaviour rules, loop budget and "
    "named sections) as JSON data. The runtime supplies it; there is no need to call it."
)


def state_tool_definition(gateway: GatewayType | str | Gateway) -> dict[str, Any]:
    """The declaration of the runtime-state tool, as one entry of the request's ``tools``.

    A prepared input that carries the runtime-state pair holds a call of
    :data:`STATE_TOOL_NAME`; declare the tool beside the agent's own so that
    the call names a known tool (some endpoints, Amazon Bedrock's Anthropic
    models among them, reject tool blocks when no tools are declared). The
    tool takes no arguments. The shape is the gateway's
    (:meth:`~turnloom.context.Gateway.tool_definition`); for Gemini it is one
    ``Tool`` whose declaration may be merged into the agent's own ``Tool``.

    Returns:
        a new dict each call (the caller may change it).

    Raises:
        InputError: ``gateway`` names no known or available gateway.
    """
    if not isinstance(gateway, Gateway):
        gateway = get_gateway(gateway)
    return gateway.tool_definition(
        STATE_TOOL_NAME, _STATE_TOOL_DESCRIPTION, {"type": "object", "properties": {}}
    )


def is_state_message(message: Message, call_id: str | None = None) -> bool:
    """True when ``message`` carries a runtime-state call or result.

    A call or result is recognised by the tool name :data:`STATE_TOOL_NAME`,
    by ``call_id``, or by a call id in the reserved form of
    :func:`state_call_id` (any turn's), also once a provider's id rule
    rewrote it (``"tlrs"``, one character outside ``[a-zA-Z0-9-]``, then 24
    lowercase hex digits).
    """
    for part in message.parts:
        if type(part) is ToolCallPart or type(part) is ToolResultPart:
            found = part.call_id
            if part.name == STATE_TOOL_NAME or found == call_id:
                return True
            # Every id the pattern matches starts with "tlrs" (a cheaper test first).
            if isinstance(found, str) and found.startswith("tlrs") and _STATE_ID.fullmatch(found):
                return True
    return False

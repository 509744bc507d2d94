"""The OpenAI Chat Completions gateway (``messages`` of ``POST /chat/completions``).

Rendering (Message -> native):

* ``system`` / ``developer`` / ``user``: ``{"role", "content"}``; the content
  is a string when the message is one text part, else a list of content parts
  (``text``, ``image_url``; ``openai_chat`` opaque parts verbatim).
* ``assistant``: ``{"role": "assistant", "content": str | None}`` plus
  ``tool_calls`` (``{"id", "type": "function", "function": {"name",
  "arguments"}}``) when it calls tools. ``content`` is ``None`` when the
  message has tool calls and no text (the API's documented form).
* Tool results become one ``{"role": "tool", "tool_call_id", "content"}``
  message each, in part order; other parts of a ``user`` message carrying
  results follow as one ``user`` message.
* An assistant message with neither text nor tool calls (an interrupted
  reply, or reasoning only) renders to nothing.
* A model step the host split over several assistant messages (one per
  parallel call) is joined into one message before rendering
  (``step_join = "calls"``): its texts in order as the content, every
  ``tool_calls`` entry in call order, then one ``tool`` message per result.

Layout kept for exact re-emission (``Message.layout``): a single text sent as
a one-element list (``"content": "list"``), an assistant message sent
without a ``content`` key (``"content": "absent"``), a ``"name": null``
(``"null_name"``). System and developer messages stay in ``messages`` where
they are.

Lossy mappings, documented: reasoning parts are dropped (Chat Completions has
no field to replay them); images of system and developer messages are dropped
with a logged warning (their content is text only); opaque parts of other
gateways are dropped with a logged warning; an image inside a tool result is
dropped with a warning (the ``tool`` role takes text only); empty or
whitespace-only text parts are never emitted. Native fields the neutral model
does not name (``refusal``, ``audio``, LiteLLM's ``reasoning_content``,
``thinking_blocks`` and ``provider_specific_fields``, which LiteLLM reads
back to replay Anthropic thinking and Gemini thought signatures, ...) are
kept in ``Message.extras`` and re-emitted verbatim, except what says
nothing, left out at the door: a null field (but a message's null
``name``, a layout hint above), so that a LiteLLM or OpenAI SDK message
parses alike as the object and as its ``model_dump()``; an empty
``annotations`` list and a tool call's stream ``index``, which a response
carries and no request message takes. The participant ``name`` of a
system, developer, user or assistant message is ``Message.name``; a
``tool`` message's ``name``
(the function's) is the tool result's ``name`` and stays in its extras.

Call ids: Chat pairs a ``tool`` message with the directly preceding
assistant message and accepts an id reused in a later turn, so renaming is
not needed by this provider. turnloom still sends each call id once per
request (:meth:`OpenAIChatGateway.request_body` and every prepared input
apply the rule of :mod:`turnloom.context.callids`), so one history renders
to a valid input on every provider and ``validate`` checks one rule for all:
a reused id becomes ``<id>_r<n>`` in its call and its ``tool`` messages.

Source: OpenAI Chat Completions API reference, ``messages`` parameter; tool
messages must answer a preceding assistant message's ``tool_calls``.
"""

from __future__ import annotations

__all__ = ("OpenAIChatGateway",)

import logging
from collections.abc import Callable, Sequence
from typing import Any

from turnloom.context._untrack import untrack_atoms
from turnloom.context.body import BodyWriter, write_body, written_body
from turnloom.context.callids import CallIdRenamer, register_rewriter, rename_call_ids
from turnloom.context.gateway import (
    Gateway,
    GatewayType,
    NativeContent,
    Violation,
    register_gateway,
)
from turnloom.context.gateways._common import (
    check_render_depth,
    drop_foreign,
    empty_input,
    layout_of,
    parse_sdk,
    require_object,
    split_image_url,
    standard_base64,
)
from turnloom.context.message import (
    ImagePart,
    Message,
    NativeKeys,
    OpaquePart,
    Part,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    admit_message,
    is_blank_text,
)
from turnloom.context.pairing import StepJoin
from turnloom.errors import InvalidMessageError, excerpt, what_type

_log = logging.getLogger("turnloom.gateway.openai_chat")

_GATEWAY = GatewayType.openai_chat.value
# A tuple: membership compares, never hashes (a malformed role may be a list).
_ROLES = tuple(r.value for r in Role)
# Each role's value, a plain str, by member: one dict read (``role.value`` is
# an enum property, two Python calls, on every render of a message).
_ROLE_VALUES = {r: r.value for r in Role}
# The assistant message fields that say something without ``content`` or
# ``tool_calls``, in the order their parts follow the content parts (see
# :func:`_field_parts`); the ``fields`` layout hint names those a message has.
_FIELDS = ("audio", "refusal")


def _field_parts(item: dict[str, Any]) -> tuple[list[Part], list[str]]:
    """The parts an assistant message's ``audio`` and ``refusal`` become, and their names.

    * ``audio`` (an object with a non-empty ``id``; a response's also holds
      ``data``, ``expires_at`` and ``transcript``) is kept verbatim: as the
      extras of a text part holding its transcript when it has a non-blank
      one (so every gateway carries what was said), else as an
      ``openai_chat`` opaque part ``{"type": "audio", "audio": ...}`` (other
      gateways leave it out with a logged warning, as every foreign opaque part).
    * ``refusal`` (a string) becomes a text part holding it, when not blank; a
      blank one stays in the message's extras (it says nothing).

    Raises:
        InvalidMessageError: ``audio`` is not an object with a non-empty
            ``id``, or ``refusal`` is not a string (``field`` names it).
    """
    parts: list[Part] = []
    names: list[str] = []
    audio = item.get("audio")
    if audio is not None:
        if not isinstance(audio, dict):
            raise InvalidMessageError(
                f"An OpenAI Chat assistant message's audio must be an object, not "
                f"{what_type(audio)}.",
                field="audio",
            )
        audio_id = audio.get("id")
        if not isinstance(audio_id, str) or not audio_id:
            raise InvalidMessageError(
                "An OpenAI Chat assistant message's audio has no id (the reference a later "
                "request sends back).",
                field="audio.id",
            )
        transcript = audio.get("transcript")
        if isinstance(transcript, str) and not is_blank_text(transcript):
            parts.append(TextPart(text=transcript, extras={"audio": audio}))
        else:
            parts.append(OpaquePart(gateway=_GATEWAY, item={"type": "audio", "audio": audio}))
        names.append("audio")
    refusal = item.get("refusal")
    if refusal is not None:
        if not isinstance(refusal, str):
            raise InvalidMessageError(
                f"An OpenAI Chat assistant message's refusal must be a string, not "
                f"{what_type(refusal)}.",
                field="refusal",
            )
        if not is_blank_text(refusal):
            parts.append(TextPart(text=refusal))
            names.append("refusal")
    return parts, names


def _field_of(name: str, part: Part) -> Any:
    """The native value of field ``name`` that ``part`` holds, or None when it holds none."""
    if name == "refusal":
        return part.text if type(part) is TextPart and part.extras is None else None
    audio: Any = None
    if type(part) is TextPart and part.extras is not None:
        audio = part.extras.get("audio")
    elif type(part) is OpaquePart and part.gateway == _GATEWAY and part.item.get("type") == "audio":
        audio = part.item.get("audio")
    return audio if isinstance(audio, dict) else None


def _peel_fields(
    parts: tuple[Part, ...], names: Sequence[str]
) -> tuple[tuple[Part, ...], dict[str, Any]] | None:
    """``parts`` without the trailing parts the ``fields`` hint ``names``, and their fields.

    The named parts are the last ``len(names)`` parts that are not tool
    calls, in ``names`` order. None when they do not hold what the names say.
    """
    at = [i for i, p in enumerate(parts) if type(p) is not ToolCallPart][-len(names) :]
    if len(at) != len(names):
        return None
    fields: dict[str, Any] = {}
    for name, i in zip(names, at, strict=True):
        value = _field_of(name, parts[i])
        if value is None or name in fields:
            return None
        fields[name] = value
    taken = set(at)
    return tuple(p for i, p in enumerate(parts) if i not in taken), fields


def _check_fields(message: Message, where: str) -> None:
    """The ``fields`` hint names fields of an assistant message that its trailing parts hold.

    Raises:
        InvalidMessageError: a name is not ``audio`` or ``refusal`` or repeats,
            the message is not an assistant one, or its parts do not hold the
            named fields in order (``field`` is ``"layout.fields"``).
    """
    names = (message.layout or {}).get("fields")
    if names is None:
        return
    if (
        message.role is not Role.assistant
        or not names
        or any(n not in _FIELDS for n in names)
        or _peel_fields(message.parts, names) is None
    ):
        raise InvalidMessageError(
            f"{where} layout.fields {excerpt(names)} does not name fields (audio, then "
            "refusal) that the trailing parts of an assistant message hold.",
            field="layout.fields",
        )


def _refuse_legacy_call(item: dict[str, Any]) -> None:
    """Refuse the deprecated ``function_call`` of an assistant message, holding a value.

    Raises:
        InvalidMessageError: ``field`` is ``"function_call"``; the message names
            the ``tool_calls`` form that replaces it.
    """
    if item.get("function_call") is not None:
        raise InvalidMessageError(
            "An OpenAI Chat assistant message has the deprecated function_call, which is not "
            'accepted: send the call as a tool_calls entry {"id", "type": "function", '
            '"function": {"name", "arguments"}} and its result as a tool message with that '
            "tool_call_id.",
            field="function_call",
        )


# The keys this gateway writes itself: extras never replace them (checked at the door).
_WRITES = NativeKeys(
    message=frozenset({"role", "content", "tool_calls", "tool_call_id", "name"}),
    text=frozenset({"type", "text"}),
    image=frozenset({"type", "image_url"}),
    tool_call=frozenset({"id", "type", "function"}),
    tool_result=frozenset({"role", "tool_call_id", "content"}),
    hints={"content": ("list", "absent"), "null_name": "flag", "fields": "ids"},
    check_layout=_check_fields,
)
# ``name`` is parsed on its own: Message.name, or a tool result's extra.
_MESSAGE_KEYS = _WRITES.message - {"name"}


@written_body
class OpenAIChatGateway(Gateway):
    """Renders and parses OpenAI Chat Completions messages. Stateless, thread-safe."""

    __slots__ = ()

    @property
    def type(self) -> GatewayType:
        return GatewayType.openai_chat

    items_field = "messages"
    """The field of :meth:`request_body` that holds the item list."""

    step_join: StepJoin = "calls"
    """A step the host split over several assistant messages is joined into one.

    The ``tool`` messages must follow the one assistant message that holds
    every ``tool_calls`` entry they answer (see :func:`~turnloom.context.join_steps`).
    """

    def tool_definition(
        self, name: str, description: str, parameters: dict[str, Any]
    ) -> dict[str, Any]:
        """One function tool's ``tools`` entry.

        Shape: ``{"type": "function", "function": {"name", "description", "parameters"}}``.
        """
        return {
            "type": "function",
            "function": {"name": name, "description": description, "parameters": parameters},
        }

    # -- rendering -------------------------------------------------------

    def render(self, message: Message) -> list[NativeContent]:
        """Render ``message`` into Chat messages (one, or one per tool result).

        A ``user`` message carrying tool results renders its results as
        ``tool`` messages first, then its other parts as one ``user`` message.
        """
        check_render_depth(message)
        layout = layout_of(message, _GATEWAY)
        own = message.layout is None or bool(layout)
        role = message.role
        if role is Role.tool or (role is Role.user and message.tool_results):
            items = self._render_results(message, layout, own)
            rest = [p for p in message.parts if type(p) is not ToolResultPart]
            if role is Role.user and rest:
                content = self._render_content(rest, role, layout, own)
                if content is not None:
                    rest_item: NativeContent = {"role": "user", "content": content}
                    _write_name(rest_item, message, layout)
                    items.append(rest_item)
            return items
        if role is Role.assistant:
            return self._render_assistant(message, layout, own)
        content = self._render_content(message.parts, role, layout, own)
        if content is None:
            return []
        value = _ROLE_VALUES[role] if type(role) is Role else role.value
        item: NativeContent = {"role": value, "content": content}
        _write_name(item, message, layout)
        if own and message.extras:
            item.update(message.extras)
        return [item]

    def _render_content(
        self, parts: Sequence[Part], role: Role, layout: dict[str, Any], own: bool
    ) -> str | list[Any] | None:
        if (
            len(parts) == 1
            and type(parts[0]) is TextPart
            and not (own and parts[0].extras)
            and layout.get("content") != "list"
        ):
            return None if is_blank_text(parts[0].text) else parts[0].text
        out: list[Any] = []
        for part in parts:
            if type(part) is TextPart:
                if not is_blank_text(part.text):
                    block: dict[str, Any] = {"type": "text", "text": part.text}
                    if own and part.extras:
                        block.update(part.extras)
                    out.append(block)
            elif type(part) is ImagePart and role in (Role.system, Role.developer):
                _log.warning(
                    "Dropped an image from a %s message: OpenAI Chat %s content is text only.",
                    role.value,
                    role.value,
                )
            elif type(part) is ImagePart:
                url = (
                    part.url
                    if part.url is not None
                    else f"data:{part.media_type};base64,{standard_base64(part.data)}"  # type: ignore[arg-type]
                )
                image: dict[str, Any] = {"url": url}
                if part.detail is not None:
                    image["detail"] = part.detail
                block = {"type": "image_url", "image_url": image}
                if own and part.extras:
                    block.update(part.extras)
                out.append(block)
            elif type(part) is OpaquePart:
                if part.gateway == _GATEWAY:
                    out.append(part.item)
                else:
                    drop_foreign(part, _GATEWAY, _log)
            elif type(part) is ReasoningPart:
                if part.gateway != _GATEWAY:
                    drop_foreign(part, _GATEWAY, _log)
        return out or None

    def _render_assistant(
        self, message: Message, layout: dict[str, Any], own: bool
    ) -> list[NativeContent]:
        blocks: list[Any] = []
        parts = message.parts
        fields: dict[str, Any] = {}
        names = layout.get("fields")
        if names:
            # Checked at the door; a step joined after it may have moved the parts.
            peeled = _peel_fields(parts, names)
            if peeled is not None:
                parts, fields = peeled
        for part in parts:
            if type(part) is TextPart:
                if not is_blank_text(part.text):
                    blocks.append(
                        {"type": "text", "text": part.text, **((own and part.extras) or {})}
                    )
            elif type(part) is OpaquePart and part.gateway == _GATEWAY:
                blocks.append(part.item)
            elif type(part) is OpaquePart or type(part) is ReasoningPart:
                drop_foreign(part, _GATEWAY, _log)
            elif type(part) is ImagePart:
                _log.warning(
                    "Dropped an image from an assistant message: OpenAI Chat assistant "
                    "messages carry text only."
                )
        calls = message.tool_calls
        if not blocks and not calls and not fields:
            # Nothing to say (an interrupted or reasoning-only reply): no item,
            # since an assistant message needs content, tool calls, an audio
            # reference or a refusal (extras such as ``name`` alone do not make one).
            return []
        content: str | list[Any] | None = blocks or None
        if (
            len(blocks) == 1
            and blocks[0].keys() == {"type", "text"}
            and blocks[0]["type"] == "text"
            and layout.get("content") != "list"
        ):
            content = blocks[0]["text"]
        item: NativeContent = {"role": "assistant"}
        if not (content is None and layout.get("content") == "absent"):
            item["content"] = content
        if calls:
            item["tool_calls"] = [
                {
                    "id": c.call_id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                    **((own and c.extras) or {}),
                }
                for c in calls
            ]
        item.update(fields)
        _write_name(item, message, layout)
        if own and message.extras:
            item.update(message.extras)
        return [item]

    def _render_results(
        self, message: Message, layout: dict[str, Any], own: bool
    ) -> list[NativeContent]:
        items: list[NativeContent] = []
        for result in message.tool_results:
            texts: list[TextPart] = []
            for inner in result.content:
                if type(inner) is TextPart:
                    texts.append(inner)
                else:
                    _log.warning(
                        "Dropped a non-text part from the result of call %s: OpenAI Chat "
                        "tool messages carry text only.",
                        excerpt(result.call_id),
                    )
            content: str | list[Any]
            if (
                len(texts) == 1
                and not (own and texts[0].extras)
                and layout.get("content") != "list"
            ):
                content = texts[0].text
            elif not texts:
                content = ""
            else:
                content = [
                    {"type": "text", "text": p.text, **((own and p.extras) or {})} for p in texts
                ]
            item: NativeContent = {
                "role": "tool",
                "tool_call_id": result.call_id,
                "content": content,
            }
            if own and result.extras:
                item.update(result.extras)
            items.append(item)
        return items

    # -- parsing ---------------------------------------------------------

    def parse(self, item: NativeContent) -> Message:
        """Parse one Chat message (request item or a choice's ``message``).

        A provider SDK's object (a pydantic model, or a dict or list holding
        them, as its SDK returned them) is taken as its JSON data
        (``model_dump(mode="json", exclude_none=True)``).

        The message returned is the one :func:`~turnloom.context.admit_message`
        holds for the parsed one (normalised), so it can be committed as it
        is; ``item`` is left as it is and shares nothing with it.

        Null fields, an empty ``annotations`` list and each tool call's
        ``index`` (the stream position) are left out: they say nothing a
        request needs, and no request message takes the last two.

        Raises:
            InvalidMessageError: not a JSON object, an unknown role, a content or
                ``tool_calls`` of the wrong shape; ``tool_calls`` on a message
                other than an assistant one, or ``tool_call_id`` on one other
                than a tool message, holding a value (``field`` names it).
            InvalidTextError: a string holds a lone surrogate (not valid UTF-8).
            DuplicateIdError: two tool calls of the item share a call id.
        """
        return parse_sdk(self._parse_checked, item)

    def _parse_checked(self, item: NativeContent) -> Message:
        return admit_message(self._parse_item(item), where="An OpenAI Chat message")[0]

    def _parse_item(self, item: NativeContent) -> Message:
        if not isinstance(item, dict):
            raise InvalidMessageError(
                f"An OpenAI Chat message must be an object, not {what_type(item)}."
            )
        role_name = item.get("role")
        if role_name == "function":
            raise InvalidMessageError(
                "OpenAI Chat role 'function' (the deprecated answer to a function_call) is "
                'not accepted: send the result as {"role": "tool", "tool_call_id", '
                '"content"} answering a tool_calls entry.',
                field="role",
            )
        if role_name not in _ROLES:
            raise InvalidMessageError(
                f"OpenAI Chat message has unknown role {excerpt(role_name)}.", field="role"
            )
        role = Role(role_name)
        _refuse_foreign_keys(item, role)
        extras = _kept(item, _MESSAGE_KEYS)
        content = item.get("content")
        if role is Role.tool:
            call_id = item.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise InvalidMessageError(
                    "OpenAI Chat tool message has no tool_call_id.", field="tool_call_id"
                )
            name = extras.get("name") if extras else None
            inner = self._parse_content(content, "content")
            result = ToolResultPart(
                call_id=call_id,
                content=inner,  # type: ignore[arg-type]
                name=name if isinstance(name, str) else None,
                extras=extras,
            )
            return Message(
                role=Role.tool,
                content=(result,),
                layout=_layout(content, inner, bool(extras) or _any_extras(inner)),
            )
        # A null name is a layout hint, so that the item re-emits exactly.
        null_name = "name" in item and item["name"] is None
        name = extras.pop("name") if extras and "name" in extras else None
        if name is not None and (not isinstance(name, str) or not name):
            raise InvalidMessageError(
                f"OpenAI Chat {role.value} message name must be a non-empty string.",
                field="name",
            )
        extras = extras or None
        parts: list[Part] = list(self._parse_content(content, "content"))
        hints_layout = _layout(content, parts, False)
        if role is Role.assistant and "content" not in item:
            hints_layout = {"gateway": _GATEWAY, "content": "absent"}
        if role is Role.assistant:
            _refuse_legacy_call(item)
            fields, names = _field_parts(item)
            if names:
                parts.extend(fields)
                hints_layout = {**(hints_layout or {"gateway": _GATEWAY}), "fields": names}
                if extras is not None:
                    extras = {k: v for k, v in extras.items() if k not in names} or None
            calls = item.get("tool_calls")
            if calls is not None:
                if not isinstance(calls, list):
                    raise InvalidMessageError(
                        "OpenAI Chat tool_calls must be a list.", field="tool_calls"
                    )
                for i, call in enumerate(calls):
                    parts.append(self._parse_call(call, i))
        if hints_layout is None and (extras or _any_extras(parts)):
            hints_layout = {"gateway": _GATEWAY}
        if null_name:
            hints_layout = {**(hints_layout or {"gateway": _GATEWAY}), "null_name": True}
        return Message(
            role=role, content=tuple(parts), extras=extras, layout=hints_layout, name=name
        )

    def parse_request(self, body: dict[str, Any]) -> list[Message]:
        """Parse a Chat Completions request body's ``messages``, in order.

        System and developer messages live in ``messages`` for this API, so
        they stay where they are.

        Raises:
            InvalidMessageError: ``messages`` is missing or an item is malformed.
        """
        body = require_object(body, "OpenAI Chat", "request body")
        items = body.get("messages")
        if not isinstance(items, list):
            raise InvalidMessageError(
                "OpenAI Chat request body has no messages list.", field="messages"
            )
        return [self.parse(item) for item in items]

    def _parse_call(self, call: Any, index: int) -> ToolCallPart:
        field = f"tool_calls[{index}]"
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise InvalidMessageError(
                f"OpenAI Chat {field} must be an object with a function.", field=field
            )
        fn = call["function"]
        call_id, name, arguments = call.get("id"), fn.get("name"), fn.get("arguments", "{}")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidMessageError(f"OpenAI Chat {field} has no id.", field=f"{field}.id")
        if not isinstance(name, str) or not name:
            raise InvalidMessageError(
                f"OpenAI Chat {field} has no function name.", field=f"{field}.function.name"
            )
        if not isinstance(arguments, str):
            raise InvalidMessageError(
                f"OpenAI Chat {field} arguments must be a JSON string.",
                field=f"{field}.function.arguments",
            )
        extras = _kept(call, _WRITES.tool_call)
        return ToolCallPart(call_id=call_id, name=name, arguments=arguments, extras=extras)

    def _parse_content(self, content: Any, field: str) -> tuple[Part, ...]:
        if content is None:
            return ()
        if isinstance(content, str):
            return (TextPart(text=content),)
        if not isinstance(content, list):
            raise InvalidMessageError(
                f"OpenAI Chat {field} must be a string, a list of parts or null.", field=field
            )
        parts: list[Part] = []
        for i, block in enumerate(content):
            if not isinstance(block, dict):
                raise InvalidMessageError(
                    f"OpenAI Chat {field}[{i}] must be an object.", field=f"{field}[{i}]"
                )
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                extras = {k: v for k, v in block.items() if k not in ("type", "text")} or None
                parts.append(TextPart(text=block["text"], extras=extras))
            elif kind == "image_url" and isinstance(block.get("image_url"), dict):
                parts.append(_parse_image(block))
            else:
                parts.append(OpaquePart(gateway=_GATEWAY, item=block))
        return tuple(parts)

    # -- rules -----------------------------------------------------------

    def validate(
        self, items: Sequence[NativeContent], *, continues_response: bool = False
    ) -> list[Violation]:
        """Check Chat's structural rules over a whole ``messages`` list.

        Rules (Source: OpenAI Chat Completions API, ``tool`` messages):
        ``tool`` messages follow directly the assistant message whose
        ``tool_calls`` they answer (only other ``tool`` messages between);
        every call is answered before the next non-tool message; no result
        without its call before it; call ids unique in the whole input. Chat
        itself pairs a result with the open call of the directly preceding
        assistant message and accepts an id reused in a later turn (the
        recorded tau-bench GPT-4o traffic does this in 37 of 150 sessions),
        but turnloom sends every request with unique call ids
        (:meth:`request_body`), so one input converts to every provider. No empty or
        whitespace-only text content (an assistant message may have ``null``
        content only when it has tool calls); system and developer content is
        text only.
        """
        violations: list[Violation] = empty_input(items, "messages")
        open_calls: dict[str, int] = {}  # call id -> index of its assistant message
        all_calls: dict[str, int] = {}  # every call id so far -> its assistant message
        for index, item in enumerate(items):
            role = item.get("role") if isinstance(item, dict) else None
            if role not in _ROLES:
                violations.append(
                    Violation(
                        index=index,
                        rule="unknown_role",
                        message=f"Item {index} has unknown role {excerpt(role)}.",
                    )
                )
                continue
            if role == "tool":
                call_id = item.get("tool_call_id")
                if isinstance(call_id, str) and call_id in open_calls:
                    del open_calls[call_id]
                else:
                    violations.append(
                        Violation(
                            index=index,
                            rule="tool_result_without_call",
                            message=f"Tool message {index} answers call {excerpt(call_id)}, "
                            f"which is "
                            "not an open call of the directly preceding assistant message.",
                        )
                    )
                continue
            for call_id, at in open_calls.items():
                violations.append(
                    Violation(
                        index=at,
                        rule="tool_call_without_result",
                        message=f"Call {excerpt(call_id)} of assistant message {at} has no tool "
                        f"message before item {index}.",
                    )
                )
            open_calls.clear()
            content = item.get("content")
            calls = item.get("tool_calls") if role == "assistant" else None
            if _empty_content(content) and not (
                role == "assistant" and (calls or _says_without_content(item))
            ):
                violations.append(
                    Violation(
                        index=index,
                        rule="empty_text",
                        message=f"{role.capitalize()} message {index} has empty or "
                        "whitespace-only content.",
                    )
                )
            elif isinstance(content, list):
                for j, block in enumerate(content):
                    kind = block.get("type") if isinstance(block, dict) else None
                    if role in ("system", "developer") and kind != "text":
                        violations.append(
                            Violation(
                                index=index,
                                rule="non_text_instruction",
                                message=f"{role.capitalize()} message {index} content[{j}] is "
                                f"a {excerpt(kind)} part; {role} content is text only.",
                            )
                        )
                    if (
                        isinstance(block, dict)
                        and block.get("type") == "text"
                        and is_blank_text(str(block.get("text", "")))
                    ):
                        violations.append(
                            Violation(
                                index=index,
                                rule="empty_text",
                                message=f"Message {index} content[{j}] is an empty or "
                                "whitespace-only text part.",
                            )
                        )
            if calls is not None and not isinstance(calls, list):
                violations.append(
                    Violation(
                        index=index,
                        rule="malformed_tool_calls",
                        message=f"Assistant message {index} has tool_calls that are not a list.",
                    )
                )
                calls = None
            for call in calls or ():
                call_id = call.get("id") if isinstance(call, dict) else None
                if not isinstance(call_id, str) or not call_id:
                    violations.append(
                        Violation(
                            index=index,
                            rule="missing_call_id",
                            message=f"Assistant message {index} has a tool call without an id.",
                        )
                    )
                    continue
                if call_id in open_calls:
                    violations.append(
                        Violation(
                            index=index,
                            rule="duplicate_call_id",
                            message=f"Assistant message {index} has two calls with id "
                            f"{excerpt(call_id)}.",
                        )
                    )
                elif call_id in all_calls:
                    violations.append(
                        Violation(
                            index=index,
                            rule="duplicate_call_id",
                            message=f"Assistant message {index} reuses call id "
                            f"{excerpt(call_id)} of "
                            f"assistant message {all_calls[call_id]}; call ids must be unique "
                            "in a request.",
                        )
                    )
                open_calls[call_id] = index
                all_calls.setdefault(call_id, index)
        for call_id, at in open_calls.items():
            violations.append(
                Violation(
                    index=at,
                    rule="tool_call_without_result",
                    message=f"Call {excerpt(call_id)} of assistant message {at} has no tool "
                    f"message.",
                )
            )
        return sorted(violations, key=lambda v: v.index)

    def request_body(self, items: Sequence[NativeContent]) -> dict[str, Any]:
        """``{"messages": [...]}``: the items, call ids made unique in the request.

        A call id used by an earlier call is renamed in its call and in the
        ``tool`` messages answering it (:mod:`turnloom.context.callids`);
        otherwise the items are unchanged. Input items are not modified, and
        the body shares no container with them (see
        :meth:`~turnloom.context.Gateway.request_body`).
        """
        return write_body(self.body_writer(), items)

    def body_writer(self) -> BodyWriter:
        """A new :class:`~turnloom.context.body.BodyWriter` of :meth:`request_body`."""
        return _ChatBody()


# Fields of a Chat Completions response message that no request message takes,
# dropped at the door when they say nothing: an empty ``annotations`` list (web
# search citations; the response carries ``[]`` when there are none) and a tool
# call's ``index`` (its place in the stream, which the call's place in
# ``tool_calls`` already gives). Source: OpenAI API reference, the response's
# ``ChatCompletionMessage`` against the request's assistant message, whose
# tool calls are ``{"id", "type", "function"}`` and which has no ``annotations``.
_SAYS_NOTHING: dict[str, Callable[[Any], bool]] = {
    "annotations": lambda value: type(value) is list and not value,
    "index": lambda value: type(value) is int,
}
# The keys of a message only one role takes: a host's value elsewhere is refused.
_ROLE_KEYS = (("tool_calls", Role.assistant), ("tool_call_id", Role.tool))


def _kept(item: dict[str, Any], written: frozenset[str]) -> dict[str, Any] | None:
    """The native fields of a message or tool call kept as its extras (None when none).

    Every field this gateway does not write, except those that say nothing:
    a null (what an SDK object's ``model_dump(exclude_none=True)`` leaves out,
    so a LiteLLM or OpenAI message parses alike as the object and as its
    ``model_dump()``, ``.json()`` or ``dict(...)``: ``function_call``,
    ``refusal``, ``audio``, ``provider_specific_fields`` of None), and a
    response-only field of :data:`_SAYS_NOTHING`.
    """
    kept = {
        key: value
        for key, value in item.items()
        if key not in written
        and value is not None
        and not (key in _SAYS_NOTHING and _SAYS_NOTHING[key](value))
    }
    return kept or None


def _refuse_foreign_keys(item: dict[str, Any], role: Role) -> None:
    """Refuse ``tool_calls`` or ``tool_call_id`` holding a value on a role that does not take it.

    Null (or an empty ``tool_calls`` list) says nothing and passes: a LiteLLM
    ``Message(role="user").model_dump()`` carries ``"tool_calls": None``.

    Raises:
        InvalidMessageError: the field would otherwise be lost; ``field`` names it.
    """
    for key, owner in _ROLE_KEYS:
        value = item.get(key)
        if role is not owner and value is not None and not (type(value) is list and not value):
            raise InvalidMessageError(
                f"An OpenAI Chat {role.value} message has {key}; only {owner.value} "
                "messages carry it.",
                field=key,
            )


def _layout(content: Any, parts: Sequence[Part], has_extras: bool) -> dict[str, Any] | None:
    """Layout hint: a single text part that arrived as a one-element list."""
    if isinstance(content, list) and len(parts) == 1 and type(parts[0]) is TextPart:
        return {"gateway": _GATEWAY, "content": "list"}
    if has_extras:
        return {"gateway": _GATEWAY}
    return None


def _write_name(item: NativeContent, message: Message, layout: dict[str, Any]) -> None:
    """The participant name: ``Message.name``, or the null one a recorded item carried."""
    if message.name is not None:
        item["name"] = message.name
    elif layout.get("null_name"):
        item["name"] = None


def _any_extras(parts: Sequence[Any]) -> bool:
    return any(getattr(p, "extras", None) for p in parts)


def _says_without_content(item: dict[str, Any]) -> bool:
    """True for an assistant message whose audio reference or refusal says something.

    Source: OpenAI Chat Completions API, assistant message ``audio`` ("data
    about a previous audio response": ``{"id"}``, sent with no content) and
    ``refusal``; a reply holding only one of them is what the API returned.
    """
    audio, refusal = item.get("audio"), item.get("refusal")
    return (isinstance(audio, dict) and bool(audio.get("id"))) or (
        isinstance(refusal, str) and not is_blank_text(refusal)
    )


def _empty_content(content: Any) -> bool:
    if content is None:
        return True
    if isinstance(content, str):
        return is_blank_text(content)
    return isinstance(content, list) and not content


def _parse_image(block: dict[str, Any]) -> ImagePart:
    image = block["image_url"]
    url = image.get("url", "")
    detail = image.get("detail")
    extras = {k: v for k, v in block.items() if k not in ("type", "image_url")} or None
    split = split_image_url(url)
    if split is not None:
        return ImagePart(data=split[1], media_type=split[0], detail=detail, extras=extras)
    return ImagePart(url=url, detail=detail, extras=extras)


class _ChatBody(BodyWriter):
    """:meth:`OpenAIChatGateway.request_body`, item by item: each item final at once."""

    __slots__ = ()

    field = "messages"

    def __init__(self, *, rename: bool = True) -> None:
        super().__init__(rename=rename)
        if type(self) is _ChatBody:
            # Its slots only ever hold a CallIdRenamer (made by turnloom, out
            # of the collector itself) or None, and None or a list of int
            # pairs (``marks``): nothing it refers to can lead back to it, so
            # it can be in no cycle (a history's body cache holds one).
            untrack_atoms(self)

    def feed(self, items: Sequence[NativeContent], out: list[NativeContent], tag: int = 0) -> None:
        renamer = self.renamer
        if renamer is not None:
            items = rename_call_ids(GatewayType.openai_chat, items, renamer)
        for item in items:
            self._hand_out(out, item, tag, tag)

    def finish(self, out: list[NativeContent]) -> dict[str, Any]:
        return {}

    def copy(self) -> _ChatBody:
        other = _ChatBody(rename=False)
        other.renamer = self._copied_renamer()
        return other

    def held_origin(self) -> int | None:
        return None

    def passes_through(self) -> bool:
        return self.renamer is None  # it renames nothing, and hands each item out at once

    def forget(self, first_kept: int, dropped: CallIdRenamer) -> bool:
        return self._forget_ids(dropped)


register_gateway(GatewayType.openai_chat, OpenAIChatGateway, _WRITES)


def _rewrite_call_ids(item: NativeContent, renamer: CallIdRenamer) -> NativeContent:
    """Report one message's calls and results to ``renamer``; the item with its ids."""
    if not isinstance(item, dict):
        return item
    role = item.get("role")
    if role == "tool":
        call_id = item.get("tool_call_id")
        if isinstance(call_id, str):
            new_id = renamer.result(call_id)
            if new_id != call_id:
                return {**item, "tool_call_id": new_id}
        return item
    # Every other message ends the call group; an assistant message with
    # tool_calls opens the next one.
    renamer.end_group()
    calls = item.get("tool_calls") if role == "assistant" else None
    if not isinstance(calls, list) or not calls:
        return item
    new_calls: list[Any] | None = None
    for j, call in enumerate(calls):
        call_id = call.get("id") if isinstance(call, dict) else None
        if not isinstance(call_id, str):
            continue
        new_id = renamer.call(call_id)
        if new_id != call_id:
            if new_calls is None:
                new_calls = list(calls)
            new_calls[j] = {**call, "id": new_id}
    return item if new_calls is None else {**item, "tool_calls": new_calls}


register_rewriter(GatewayType.openai_chat, _rewrite_call_ids)

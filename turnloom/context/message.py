"""The provider-neutral message model.

A :class:`Message` is an immutable msgspec Struct with a :class:`Role` and a
tuple of parts. Parts form a tagged union on the ``"type"`` field:

============================  ===============================================
part                          carries
============================  ===============================================
:class:`TextPart`             text
:class:`ImagePart`            an image by URL, or base64 ``data`` + media type
:class:`ToolCallPart`         a tool call: ``call_id``, ``name``, ``arguments``
:class:`ToolResultPart`       a tool result: ``call_id``, content, ``is_error``
:class:`ReasoningPart`        model reasoning, with the provider's signature or
                              encrypted content kept verbatim
:class:`OpaquePart`           one provider-native item the neutral model does
                              not represent, tagged with the gateway it came from
============================  ===============================================

Constructing a Struct does not validate it (msgspec validates on decode
only). :func:`decode_message` and :func:`check_message` are the doors: they
raise :class:`~turnloom.errors.InvalidMessageError` (or a subclass) naming the
offending field. The runtime checks every message it accepts with
:func:`check_message`, so bad input fails at commit, never at render time.
"""

from __future__ import annotations

__all__ = (
    "ImagePart",
    "Message",
    "OpaquePart",
    "Part",
    "ReasoningPart",
    "Role",
    "TextPart",
    "ToolCallPart",
    "ToolResultPart",
    "check_message",
    "decode_message",
    "encode_message",
    "is_blank_text",
    "message_size",
)

import enum
from typing import Any, TypeAlias, cast

import msgspec

from turnloom.errors import DuplicateIdError, InvalidMessageError, InvalidTextError


class Role(enum.StrEnum):
    """Who speaks. ``system`` and ``developer`` are pinned instructions."""

    system = "system"
    developer = "developer"
    user = "user"
    assistant = "assistant"
    tool = "tool"


class _Part(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag_field="type"):
    """Base of the part union; not a public type."""


class TextPart(_Part, frozen=True, tag="text"):
    """Plain text.

    Attributes:
        text: the text; may be empty here. Gateways never emit an empty or
            whitespace-only block, except to re-emit recorded traffic exactly
            (the ``keep_blank`` layout of Gemini and OpenAI Responses).
        extras: provider-native fields of this part that the neutral model does
            not name (``cache_control``, Gemini ``thoughtSignature``), re-emitted
            verbatim by the gateway that produced them and ignored by others.
    """

    text: str
    extras: dict[str, Any] | None = None


class ImagePart(_Part, frozen=True, tag="image"):
    """An image, by ``url`` or by base64 ``data`` with its ``media_type``.

    Exactly one of ``url`` and ``data`` is set. ``detail`` is OpenAI's
    ``low``/``high``/``auto`` hint, ignored by providers without one.
    """

    url: str | None = None
    data: str | None = None
    media_type: str | None = None
    detail: str | None = None
    extras: dict[str, Any] | None = None


class ToolCallPart(_Part, frozen=True, tag="tool_call"):
    """A tool call made by the model.

    Attributes:
        call_id: the provider's id for this call; unique within its message. A
            later turn may reuse it (pairing is positional, see
            :mod:`turnloom.context.pairing`).
        name: the tool (function) name.
        arguments: the arguments as JSON text, exactly as the model produced
            them (OpenAI carries a string; Anthropic and Gemini carry an object,
            which their gateways encode to and decode from this text).
    """

    call_id: str
    name: str
    arguments: str = "{}"
    extras: dict[str, Any] | None = None


ResultContent: TypeAlias = "TextPart | ImagePart | OpaquePart"


class ToolResultPart(_Part, frozen=True, tag="tool_result"):
    """The result of one tool call.

    Attributes:
        call_id: the id of the call this answers.
        content: the result, as text and image parts, oldest first.
        is_error: the tool failed; the content describes the failure.
        name: the tool name, when known. Gemini's ``functionResponse`` requires
            it; other gateways fill it from the matching call when rendering.
    """

    call_id: str
    content: tuple[TextPart | ImagePart | OpaquePart, ...] = ()
    is_error: bool = False
    name: str | None = None
    extras: dict[str, Any] | None = None


class ReasoningPart(_Part, frozen=True, tag="reasoning"):
    """Model reasoning, replayed verbatim to the provider that produced it.

    Attributes:
        text: the readable reasoning (or summary); may be empty.
        signature: Anthropic ``thinking`` signature or Gemini thought signature.
        encrypted_content: OpenAI Responses ``encrypted_content``, or the data
            of an Anthropic ``redacted_thinking`` block.
        redacted: the block was redacted by the provider.
        id: the provider's item id (OpenAI Responses ``rs_...``).
        gateway: the gateway whose provider produced this reasoning; other
            providers cannot verify it and their gateways drop it.
    """

    text: str = ""
    signature: str | None = None
    encrypted_content: str | None = None
    redacted: bool = False
    id: str | None = None
    gateway: str | None = None
    extras: dict[str, Any] | None = None


class OpaquePart(_Part, frozen=True, tag="opaque"):
    """One provider-native item or block the neutral model does not represent.

    Server-side tool blocks, documents, audio, MCP or compaction items are
    kept here verbatim. The gateway named by ``gateway`` re-emits ``item``
    unchanged; every other gateway documents whether it drops (with a logged
    warning) or rejects it.
    """

    gateway: str
    item: dict[str, Any]


Part: TypeAlias = TextPart | ImagePart | ToolCallPart | ToolResultPart | ReasoningPart | OpaquePart


class Message(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One provider-neutral message.

    ``content`` may be given as a plain string, which becomes a single
    :class:`TextPart`; after construction it is always a tuple of parts, and
    :attr:`parts` gives it with that type.

    Messages and parts are not tracked by Python's cyclic garbage collector
    (msgspec ``gc=False``), so held messages themselves add no objects for a
    full collection to visit (their rendered native dicts are another matter).
    Their fields hold JSON data only, which cannot form a reference cycle
    through them; ``extras`` must not refer back to the message.

    Attributes:
        role: who speaks.
        content: the parts, in order.
        id: the provider's message or item id, when it has one.
        name: the participant who wrote the message (an agent of a team, a
            user), when known; the :class:`~turnloom.context.Tagged` scope
            selects by it. Only OpenAI Chat has a field for it (``name`` of a
            system, developer, user or assistant message); the other gateways
            drop it when rendering. ``None`` or a non-empty string.
        extras: provider-native message fields the neutral model does not name,
            re-emitted verbatim by the gateway that produced them. A gateway
            emits the message's and its parts' extras only when ``layout`` is
            None (a message built by hand) or names that gateway (a gateway
            that parses a message with extras always records itself there).
        layout: how the producing gateway laid the message out natively, when
            that differs from the gateway's canonical form: a JSON object with
            ``"gateway"`` (its name) and gateway-specific hints (``"content":
            "string"`` for content sent as a string instead of a list, ...).
            Only the named gateway reads it, to re-emit exactly the recorded
            form; it is never emitted as a native field. It is ``None`` for a
            message built by hand, and for a parsed message with no extras in
            its gateway's canonical form.
    """

    role: Role
    content: tuple[Part, ...] | str = ()
    id: str | None = None
    extras: dict[str, Any] | None = None
    layout: dict[str, Any] | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.content, str):
            msgspec.structs.force_setattr(self, "content", (TextPart(text=self.content),))
        elif isinstance(self.content, list):
            msgspec.structs.force_setattr(self, "content", tuple(self.content))

    @property
    def parts(self) -> tuple[Part, ...]:
        """The content as a tuple of parts (never a string)."""
        return cast("tuple[Part, ...]", self.content)

    @property
    def text(self) -> str:
        """The text parts joined, without separators."""
        return "".join(p.text for p in self.parts if type(p) is TextPart)

    @property
    def tool_calls(self) -> tuple[ToolCallPart, ...]:
        """The tool calls of this message, in order."""
        return tuple(p for p in self.parts if type(p) is ToolCallPart)

    @property
    def tool_results(self) -> tuple[ToolResultPart, ...]:
        """The tool results of this message, in order."""
        return tuple(p for p in self.parts if type(p) is ToolResultPart)


def is_blank_text(text: str) -> bool:
    """True for empty and whitespace-only text.

    No gateway emits such a text block (providers reject them), and a model
    output holding nothing else is not recorded.
    """
    return not text or text.isspace()


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Message)


def encode_message(message: Message) -> bytes:
    """Serialize ``message`` to JSON bytes.

    Raises:
        InvalidTextError: a string holds a lone surrogate (not valid UTF-8).
    """
    try:
        return _encoder.encode(message)
    except UnicodeEncodeError as exc:
        raise InvalidTextError(
            f"Message (role {message.role!s}) holds text that is not valid UTF-8: {exc.reason}.",
            field="content",
        ) from exc


def message_size(message: Message) -> int:
    """The serialized size of ``message``, in bytes (its JSON encoding)."""
    return len(encode_message(message))


def check_message(message: object, *, where: str = "message") -> int:
    """Validate one message at the door; return its serialized size in bytes.

    Checks: ``message`` is a :class:`Message` whose fields have their declared
    types, with a known role and parts of the part union; every string is valid
    UTF-8 (no lone surrogates); call ids, tool names and set ids are non-empty;
    an opaque part's item is an object; tool calls are in an assistant message
    and tool results in a tool or user message; call ids are unique within the
    message; an image has exactly one of ``url`` and ``data`` (non- empty), and
    string fields (a base64 image has its ``media_type``, which is
    ``image/...``).

    Args:
        message: the value to check.
        where: how error messages name the value (``"turn t1 input[0]"``).

    Returns:
        The size of the message's JSON encoding, in bytes.

    Raises:
        InvalidMessageError: a field is malformed; ``field`` names it.
        InvalidTextError: a string is not valid UTF-8.
        DuplicateIdError: two tool calls of the message share a call id.
    """
    if not isinstance(message, Message):
        raise InvalidMessageError(f"{where} is a {type(message).__name__}, not a turnloom Message.")
    try:
        role = Role(message.role)
    except ValueError:
        raise InvalidMessageError(
            f"{where} has unknown role {message.role!r}.", field="role"
        ) from None
    if role is not message.role:
        msgspec.structs.force_setattr(message, "role", role)
    if message.id is not None and (not isinstance(message.id, str) or not message.id):
        raise InvalidMessageError(f"{where} has an empty id.", field="id")
    if message.name is not None:
        _require_id(message.name, where, "name")
    layout = message.layout
    if layout is not None and (
        not isinstance(layout, dict)
        or not isinstance(layout.get("gateway"), str)
        or not layout["gateway"]
    ):
        raise InvalidMessageError(
            f"{where} layout must be an object naming its gateway.", field="layout"
        )
    if not isinstance(message.content, tuple):
        raise InvalidMessageError(f"{where} content must be a tuple of parts.", field="content")
    seen: set[str] = set()
    for i, part in enumerate(message.parts):
        field = f"content[{i}]"
        if isinstance(part, ToolCallPart | ToolResultPart):
            _check_placement(part, role, where, field)
        if isinstance(part, ToolCallPart):
            _require_id(part.call_id, where, f"{field}.call_id")
            _require_id(part.name, where, f"{field}.name")
            if not isinstance(part.arguments, str):
                raise InvalidMessageError(
                    f"{where} {field}.arguments must be JSON text (str).",
                    field=f"{field}.arguments",
                )
            if part.call_id in seen:
                raise DuplicateIdError(f"{where} has two tool calls with call id {part.call_id!r}.")
            seen.add(part.call_id)
        elif isinstance(part, ToolResultPart):
            _require_id(part.call_id, where, f"{field}.call_id")
            if not isinstance(part.content, tuple):
                raise InvalidMessageError(
                    f"{where} {field}.content must be a tuple of parts.",
                    field=f"{field}.content",
                )
            for j, inner in enumerate(part.content):
                if not isinstance(inner, TextPart | ImagePart | OpaquePart):
                    raise InvalidMessageError(
                        f"{where} {field}.content[{j}] is a {type(inner).__name__}; "
                        "a tool result holds text, image or opaque parts.",
                        field=f"{field}.content[{j}]",
                    )
                if isinstance(inner, ImagePart):
                    _check_image(inner, where, f"{field}.content[{j}]")
                elif isinstance(inner, OpaquePart):
                    _check_opaque(inner, where, f"{field}.content[{j}]")
        elif isinstance(part, ImagePart):
            _check_image(part, where, field)
        elif isinstance(part, OpaquePart):
            _check_opaque(part, where, field)
        elif not isinstance(part, TextPart | ReasoningPart):
            raise InvalidMessageError(
                f"{where} {field} is a {type(part).__name__}, not a message part.",
                field=field,
            )
    try:
        data = _encoder.encode(message)
    except UnicodeEncodeError as exc:
        raise InvalidTextError(
            f"{where} holds text that is not valid UTF-8 ({exc.reason}).", field="content"
        ) from exc
    except TypeError as exc:
        raise InvalidMessageError(f"{where} holds a value that is not JSON: {exc}.") from exc
    try:
        # Struct construction does not check field types; decoding the encoding
        # does (a text that is not a str would otherwise fail at render time).
        _decoder.decode(data)
    except msgspec.ValidationError as exc:
        text = str(exc)
        field = text.rpartition("at `$.")[2].rstrip("`") if "at `$." in text else ""
        raise InvalidMessageError(
            f"{where} has a field of the wrong type: {text}.", field=field
        ) from exc
    return len(data)


def _check_placement(
    part: ToolCallPart | ToolResultPart, role: Role, where: str, field: str
) -> None:
    # Pairing and every gateway read calls from assistant messages and results
    # from tool and user messages; elsewhere a part would be lost or orphaned.
    if isinstance(part, ToolCallPart) and role is not Role.assistant:
        raise InvalidMessageError(
            f"{where} {field} is a tool call in a {role.value} message; only assistant "
            "messages carry tool calls.",
            field=field,
        )
    if isinstance(part, ToolResultPart) and role not in (Role.tool, Role.user):
        raise InvalidMessageError(
            f"{where} {field} is a tool result in a {role.value} message; only tool and "
            "user messages carry tool results.",
            field=field,
        )


def _require_id(value: object, where: str, field: str) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidMessageError(f"{where} {field} must be a non-empty string.", field=field)


def _check_opaque(part: OpaquePart, where: str, field: str) -> None:
    _require_id(part.gateway, where, f"{field}.gateway")
    if not isinstance(part.item, dict):
        raise InvalidMessageError(
            f"{where} {field}.item must be a JSON object.", field=f"{field}.item"
        )


def _check_image(part: ImagePart, where: str, field: str) -> None:
    for name in ("url", "data", "media_type", "detail"):
        if not isinstance(getattr(part, name), str | None):
            raise InvalidMessageError(
                f"{where} {field}.{name} must be a string.", field=f"{field}.{name}"
            )
    for name in ("url", "data"):
        if getattr(part, name) == "":
            raise InvalidMessageError(f"{where} {field}.{name} is empty.", field=f"{field}.{name}")
    if (part.url is None) == (part.data is None):
        raise InvalidMessageError(
            f"{where} {field} must set exactly one of url and data.", field=field
        )
    if part.data is not None and not part.media_type:
        raise InvalidMessageError(
            f"{where} {field} gives base64 data without its media_type.",
            field=f"{field}.media_type",
        )
    if part.media_type is not None and not part.media_type.startswith("image/"):
        raise InvalidMessageError(
            f"{where} {field}.media_type {part.media_type!r} is not an image type.",
            field=f"{field}.media_type",
        )


def decode_message(data: bytes | str | dict[str, Any], *, where: str = "message") -> Message:
    """Decode and validate one message from JSON bytes/str or a plain dict.

    The dict form is turnloom's own (``{"role": ..., "content": [{"type":
    "text", "text": ...}]}``), not a provider's; gateways parse native items.

    Raises:
        InvalidTextError: the bytes are not valid UTF-8, or text holds a lone
            surrogate.
        InvalidMessageError: malformed JSON, an unknown role or part type, or a
            field of the wrong type; ``field`` names it where msgspec does.
        DuplicateIdError: two tool calls of the message share a call id.
    """
    try:
        if isinstance(data, dict):
            message = msgspec.convert(data, Message)
        else:
            message = _decoder.decode(data)
    except UnicodeDecodeError as exc:
        raise InvalidTextError(f"{where} is not valid UTF-8: {exc.reason}.") from exc
    except msgspec.ValidationError as exc:
        text = str(exc)
        field = text.rpartition("at `$.")[2].rstrip("`") if "at `$." in text else ""
        if "invalid utf-8" in text.lower() or "surrogate" in text.lower():
            raise InvalidTextError(f"{where}: {text}.", field=field) from exc
        raise InvalidMessageError(f"{where}: {text}.", field=field) from exc
    except msgspec.DecodeError as exc:
        text = str(exc)
        if "utf-8" in text.lower():
            raise InvalidTextError(f"{where} is not valid UTF-8: {text}.") from exc
        raise InvalidMessageError(f"{where} is not valid JSON: {text}.") from exc
    check_message(message, where=where)
    return message

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
only). :func:`decode_message`, :func:`admit_message` and :func:`check_message`
are the doors: they raise :class:`~turnloom.errors.InvalidMessageError` (or a
subclass) naming the offending field, and never set anything on the object
they are handed. The runtime admits every message it accepts with
:func:`admit_message` and keeps the copy it returns, so bad input fails at
commit, never at render time, and a caller's later edit reaches nothing held.
"""

from __future__ import annotations

__all__ = (
    "DEFAULT_MAX_MESSAGE_BYTES",
    "MAX_JSON_DEPTH",
    "ImagePart",
    "Message",
    "NativeKeys",
    "OpaquePart",
    "Part",
    "ReasoningPart",
    "Role",
    "TextPart",
    "ToolCallPart",
    "ToolResultPart",
    "admit_message",
    "check_id",
    "check_message",
    "declare_native_keys",
    "declared_native_keys",
    "decode_json_text",
    "decode_message",
    "encode_message",
    "is_blank_part",
    "is_blank_text",
    "message_size",
    "reject_instructions",
    "strict_json",
)

import enum
import json
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeAlias, cast

import msgspec

from turnloom.context._call_kinds import pairing_key
from turnloom.context._media import (
    base64_problem,
    image_media_type_problem,
    is_data_url,
    split_data_url,
)
from turnloom.errors import (
    DuplicateIdError,
    InstructionMessageError,
    InvalidMessageError,
    InvalidTextError,
    ItemTooLargeError,
    excerpt,
    not_a_message,
    what_type,
)

MAX_JSON_DEPTH = 64
"""The deepest nesting of JSON the door accepts, in levels of arrays and objects.

It applies to every JSON value a message carries besides its own fields:
tool call ``arguments`` (as decoded), ``extras``, ``layout`` and opaque
items. A scalar is depth 0, ``{}`` depth 1, ``{"a": [1]}`` depth 2; the
field holding an ``extras`` object counts as that object's first level.
Real tool arguments and provider items nest far less (the recorded traffic
in ``provider-recordings`` stays under 12); the cap keeps every later
encoder and decoder (json, msgspec, the providers' own) far from its
recursion limit.
"""

DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024
"""The default per-item cap, in bytes of a message's JSON encoding (1 MiB)."""


class Role(enum.StrEnum):
    """Who speaks. ``system`` and ``developer`` are pinned instructions."""

    system = "system"
    developer = "developer"
    user = "user"
    assistant = "assistant"
    tool = "tool"


# Bound once: an attribute of an Enum class is looked up through its
# metaclass's ``__getattr__`` hook (about 0.1 us per use on CPython 3.11).
_ASSISTANT, _TOOL, _USER = Role.assistant, Role.tool, Role.user


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
            re-emitted verbatim by the gateway that produced them; strict JSON,
            never a key that gateway writes itself (see :class:`NativeKeys`). A gateway
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
        return self.content  # type: ignore[return-value]  # a str becomes a tuple at construction

    @property
    def text(self) -> str:
        """The text parts joined, without separators."""
        return "".join(p.text for p in self.parts if type(p) is TextPart)

    @property
    def tool_calls(self) -> tuple[ToolCallPart, ...]:
        """The tool calls of this message, in order."""
        return tuple([p for p in self.content if type(p) is ToolCallPart])

    @property
    def tool_results(self) -> tuple[ToolResultPart, ...]:
        """The tool results of this message, in order."""
        return tuple([p for p in self.content if type(p) is ToolResultPart])


# ``parts`` read as ``content`` is, at the cost of a field read: its property's
# value is always the field's (a str becomes a tuple at construction, and the
# door refuses content that is not a tuple), and every walk over a message's
# parts reads it (a property call costs five times as much). Read-only still:
# the struct is frozen.
type.__setattr__(Message, "parts", Message.__dict__["content"])


def is_blank_text(text: str) -> bool:
    """True for empty and whitespace-only text.

    No gateway emits such a text block (providers reject them), and a model
    output holding nothing else is not recorded.
    """
    return not text or text.isspace()


def is_blank_part(part: Part) -> bool:
    """True for a text part with empty or whitespace-only text and no ``extras``.

    Extras are content: a blank text part may carry a provider's field that
    must go back to it (a Gemini thought signature on empty text, which the
    SDK keeps as ``{"text": "", "thoughtSignature": ...}``), so such a part is
    not blank. The one blank-part test: a history does not record an output
    made only of blank parts, the pairing rule leaves them out of a render and
    does not let them start a user turn beside tool results, and an area
    refuses content holding nothing else.
    """
    return type(part) is TextPart and is_blank_text(part.text) and not part.extras


Hint: TypeAlias = "Literal['flag', 'text', 'ids'] | tuple[str, ...]"
"""The type of one layout hint: ``"flag"`` a bool, ``"text"`` a string, ``"ids"``
a list of strings (call ids), a tuple of strings: one of those values."""


class NativeKeys(msgspec.Struct, frozen=True, kw_only=True):
    """The native keys one gateway writes itself, per element, and its layout hints.

    Each gateway declares this once, when it registers
    (:func:`~turnloom.context.gateway.register_gateway`). The door
    (:func:`check_message`) refuses ``extras`` holding one of these keys, so
    extras can never replace what the gateway writes (a user message whose
    extras say ``"role": "system"``, an assistant message whose extras carry
    ``tool_calls`` past pairing), and it type-checks a layout that names the
    gateway against ``hints``.

    Attributes:
        message: keys of the native item a message renders to (its message,
            content or turn object).
        text, image, tool_call, tool_result, reasoning: keys of the native
            object each part kind renders to, where that part's ``extras`` are
            merged (for a tool result: the object its extras are merged into,
            which is the ``tool`` message itself on OpenAI Chat).
        hints: the layout hints the gateway reads, by name, with their type.
        check_layout: a further check of a message whose layout names the
            gateway, for hints that depend on content; raises
            :class:`~turnloom.errors.InvalidMessageError` (or a subclass).
    """

    message: frozenset[str] = frozenset()
    text: frozenset[str] = frozenset()
    image: frozenset[str] = frozenset()
    tool_call: frozenset[str] = frozenset()
    tool_result: frozenset[str] = frozenset()
    reasoning: frozenset[str] = frozenset()
    hints: Mapping[str, Hint] = msgspec.field(default_factory=dict)
    check_layout: Callable[[Message, str], None] | None = None


_DECLARED: dict[str, NativeKeys] = {}
_ANY: dict[str, frozenset[str]] = {}
_ELEMENTS = ("message", "text", "image", "tool_call", "tool_result", "reasoning")


def declare_native_keys(gateway: str, keys: NativeKeys) -> None:
    """Declare the native keys ``gateway`` writes (called by ``register_gateway``)."""
    _DECLARED[gateway] = keys
    for element in _ELEMENTS:
        _ANY[element] = frozenset().union(*(getattr(k, element) for k in _DECLARED.values()))


def declared_native_keys() -> dict[str, NativeKeys]:
    """The native keys each registered gateway declared, by gateway name (a copy)."""
    return dict(_DECLARED)


def _reserved(element: str, gateway: str | None) -> frozenset[str]:
    """Keys extras of ``element`` may not hold: one gateway's, or every gateway's."""
    if gateway is None:
        return _ANY.get(element, frozenset())
    keys = _DECLARED.get(gateway)
    return getattr(keys, element) if keys is not None else frozenset()


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Message)
_any_decoder = msgspec.json.Decoder()


def _json_error(where: str, field: str, problem: str, text: bool = False) -> InvalidMessageError:
    kind = InvalidTextError if text else InvalidMessageError
    label = f"{where} {field}" if field else where
    return kind(f"{label} {problem}", field=field)


_CONTAINERS = (dict, list, tuple)


def _strict_copy(value: Any, where: str, field: str, depth: int = 0) -> Any:
    """A deep copy of the JSON ``value``, checked strictly; iterative (no recursion).

    Strict JSON: objects with string keys, arrays (lists or tuples, copied
    to lists), strings without lone surrogates, finite numbers, booleans and
    null, nested at most :data:`MAX_JSON_DEPTH` levels (``depth`` levels
    already enclose ``value``).

    Raises:
        InvalidMessageError: a value JSON cannot carry, NaN or an infinity, or
            nesting deeper than the cap; ``field`` names the path.
        InvalidTextError: a string or key holds a lone surrogate.
    """
    # The common shapes first, copied as the loop below copies them: an ASCII
    # string, and an object of ASCII strings (extras such as ``{"name": ...}``).
    kind = type(value)
    if kind is str and value.isascii():
        return value
    if kind is dict and depth < MAX_JSON_DEPTH:
        for k, v in value.items():
            if type(k) is not str or type(v) is not str or not (k.isascii() and v.isascii()):
                break
        else:
            return dict(value)
    root: list[Any] = [None]
    # (value, container, key, depth of value, path of value)
    stack: list[tuple[Any, Any, Any, int, tuple[Any, ...]]] = [(value, root, 0, depth, ())]
    while stack:
        item, into, key, level, path = stack.pop()
        if isinstance(item, str):
            # Base-class calls throughout: a subclass's overrides (isascii,
            # encode, __int__, items, __iter__, __len__, __hash__) never run.
            item = item if type(item) is str else str.__str__(item)
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    raise _json_error(
                        where,
                        _path(field, path),
                        f"holds a lone surrogate (not valid UTF-8): {excerpt(item)}.",
                        text=True,
                    ) from None
            into[key] = item
        elif item is None or item is True or item is False:
            into[key] = item
        elif isinstance(item, int):
            into[key] = int.__int__(item)
        elif isinstance(item, float):
            if not math.isfinite(float.__float__(item)):
                raise _json_error(
                    where, _path(field, path), f"holds {excerpt(item)}, which is not JSON (strict)."
                )
            into[key] = float.__float__(item)
        elif isinstance(item, _CONTAINERS):
            if level + 1 > MAX_JSON_DEPTH:
                raise _json_error(
                    where,
                    _path(field, path),
                    f"nests JSON deeper than {MAX_JSON_DEPTH} levels.",
                )
            if isinstance(item, dict):
                copy: dict[str, Any] = {}
                for k, v in dict.items(item):
                    if not isinstance(k, str):
                        raise _json_error(
                            where,
                            _path(field, path),
                            f"has a key {excerpt(k)} that is not a string.",
                        )
                    k = k if type(k) is str else str.__str__(k)
                    if not k.isascii():
                        try:
                            k.encode("utf-8")
                        except UnicodeEncodeError:
                            raise _json_error(
                                where,
                                _path(field, path),
                                f"has a key with a lone surrogate: {excerpt(k)}.",
                                text=True,
                            ) from None
                    if type(v) is str and v.isascii():
                        copy[k] = v  # an ASCII string: copied here as the branch above would
                    else:
                        copy[k] = None
                        stack.append((v, copy, k, level + 1, (*path, k)))
                into[key] = copy
            else:
                items = (
                    list.copy(item)
                    if isinstance(item, list)
                    else tuple.__getitem__(item, slice(None))
                )
                array: list[Any] = [None] * len(items)
                for i, v in enumerate(items):
                    if type(v) is str and v.isascii():
                        array[i] = v
                    else:
                        stack.append((v, array, i, level + 1, (*path, i)))
                into[key] = array
        else:
            raise _json_error(
                where,
                _path(field, path),
                f"holds {what_type(item)}, which is not JSON data.",
            )
    return root[0]


def strict_json(value: Any, *, where: str = "value", field: str = "") -> Any:
    """A private deep copy of the JSON ``value``, checked strictly.

    Strict JSON: objects with string keys, arrays (lists or tuples, copied to
    lists), strings without lone surrogates, finite numbers, booleans and null,
    nested at most :data:`MAX_JSON_DEPTH` levels. Iterative: no depth raises
    ``RecursionError``.

    Raises:
        InvalidMessageError: a value JSON cannot carry, NaN or an infinity, or
            nesting deeper than the cap; ``field`` names the path.
        InvalidTextError: a string or key holds a lone surrogate.
    """
    return _strict_copy(value, where, field)


def _path(field: str, path: tuple[Any, ...]) -> str:
    out = field
    for step in path[:8]:
        out += f"[{step}]" if isinstance(step, int) else f".{excerpt(step)[1:-1]}"
    return out + (".…" if len(path) > 8 else "")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (strict)")


def decode_json_text(text: str, *, where: str = "value", field: str = "") -> Any:
    """Decode JSON text strictly: the value, or a typed error.

    Strict JSON (RFC 8259): no ``NaN`` or ``Infinity``, no number out of the
    float range, no lone surrogate, also not an escaped one (``"\\ud83c"``),
    nesting at most :data:`MAX_JSON_DEPTH` levels. Every later encoding of the
    value (``json.dumps(..., allow_nan=False)``, msgspec) succeeds.

    Args:
        text: the JSON text.
        where, field: how error messages name the text.

    Raises:
        InvalidTextError: the text holds a lone surrogate, raw or escaped.
        InvalidMessageError: the text is not strict JSON, or nests too deeply.
    """
    if type(text) is not str and isinstance(text, str):
        text = str.__str__(text)  # msgspec decodes an exact str only (a subclass: TypeError)
    try:
        value = _any_decoder.decode(text)
    except (msgspec.DecodeError, RecursionError, UnicodeEncodeError) as exc:
        # Classify the failure with the standard parser (slow path only).
        try:
            json.loads(text, parse_constant=_reject_constant)
        except RecursionError:
            raise _json_error(
                where, field, f"nests JSON deeper than {MAX_JSON_DEPTH} levels."
            ) from None
        except UnicodeEncodeError:
            raise _json_error(where, field, "holds a lone surrogate.", text=True) from None
        except ValueError as inner:
            raise _json_error(
                where, field, f"is not strict JSON ({excerpt(str(inner))})."
            ) from None
        if isinstance(exc, RecursionError):
            raise _json_error(
                where, field, f"nests JSON deeper than {MAX_JSON_DEPTH} levels."
            ) from None
        # The standard parser took it: a lone surrogate (escaped) or a huge number.
        value = None
        try:
            value = json.loads(text, parse_constant=_reject_constant)
        except RecursionError:
            pass
        _strict_copy(value, where, field)
        raise _json_error(where, field, f"is not strict JSON ({excerpt(str(exc))}).") from None
    if _provably_strict(text):
        return value
    return _strict_copy(value, where, field)


def _provably_strict(text: str) -> bool:
    """True when ``text``, decoded by msgspec, is certain to pass :func:`_strict_copy` unchanged.

    msgspec decodes JSON text into fresh dicts, lists, strs, ints, finite
    floats (it refuses numbers out of the float range and ``NaN``), bools and
    None, so only two checks can fail: a lone surrogate, which ASCII text can
    hold only as a ``\\u`` escape, and nesting deeper than
    :data:`MAX_JSON_DEPTH`, which needs more opening brackets than that. Text
    with neither holds a value the copy would only copy.
    """
    return (
        text.isascii() and "\\u" not in text and text.count("{") + text.count("[") <= MAX_JSON_DEPTH
    )


def encode_message(message: Message) -> bytes:
    """Serialize ``message`` to JSON bytes.

    Raises:
        InvalidTextError: a string holds a lone surrogate (not valid UTF-8).
    """
    try:
        return _encoder.encode(message)
    except UnicodeEncodeError as exc:
        raise InvalidTextError(
            f"Message (role {excerpt(str(message.role))}) holds text that is not valid UTF-8: "
            f"{exc.reason}.",
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
    message; an image has exactly one of ``url`` and ``data`` (non-empty)
    and a base64 image has its ``media_type``; a media type is an image type
    by the grammar of RFC 6838 (``image/png``: no parameters, no spaces or
    control characters); ``data`` is base64 (standard or URL-safe alphabet,
    padded); a ``data:`` URL is ``data:<image type>[;name=value]...;base64,<data>``
    in the standard alphabet, and a ``media_type`` beside it matches its type.

    The JSON a message carries is checked strictly (see
    :func:`decode_json_text` and :data:`MAX_JSON_DEPTH`): tool call
    ``arguments`` are blank (meaning ``{}``) or the text of a JSON object;
    ``extras``, ``layout`` and opaque items are JSON data. ``extras`` never
    hold a key a gateway writes itself (:class:`NativeKeys`: the keys of the
    gateway ``layout`` names, else of every gateway; a reasoning part's, of
    the gateway that produced it). A ``layout`` names a gateway that declared
    its keys and holds only that gateway's hints, each of its type.

    Nothing is set on ``message``, its parts or the values they hold:
    turnloom never mutates an object it is handed. The checks and the size
    are those of the message :func:`admit_message` would hold (private deep
    copies of ``extras``, ``layout`` and opaque items; JSON data and ids of
    subclasses of str, int, float, dict, list and tuple read through the base
    types' methods and held as exact base values, so a subclass's overrides
    never run; tool call ``arguments`` of a str subclass are refused by the
    encoder), and that message is dropped. A caller that keeps the message
    past the call, or wants it normalised, uses :func:`admit_message` and
    keeps what it returns.

    Args:
        message: the value to check.
        where: how error messages name the value (``"turn t1 input[0]"``).

    Returns:
        The size of the message's JSON encoding, in bytes.

    Raises:
        InvalidMessageError: a field is malformed; ``field`` names it.
        InvalidTextError: a string is not valid UTF-8 (also one escaped in
            JSON text).
        DuplicateIdError: two tool calls of the message share a call id.
    """
    return _check(message, where)[1]


def admit_message(message: object, *, where: str = "message") -> tuple[Message, int]:
    """Validate one message at the door; return the message to hold and its size in bytes.

    The checks, errors and size of :func:`check_message`. Like it, this sets
    nothing on ``message`` or anything it holds (turnloom never mutates an
    object it is handed); the normalised message is returned instead. It is
    ``message`` itself when it holds nothing mutable and nothing to convert:
    no ``extras``, ``layout`` or opaque item (on the message, its parts or a
    tool result's parts), a :class:`Role`, exact str ids and names and exact
    tuples of exact part classes. Otherwise it is a new message of the same
    class, with new parts wherever a part (or a part of a tool result) holds
    such a value, holding private deep copies of those dicts and lists and
    exact base values (a role as :class:`Role`, ids and names as str, part
    tuples as tuple): whatever the caller later does to the objects it
    handed in (a dict of ``extras`` appended to, a key deleted) reaches
    nothing held, and nothing held is shared with what the caller has.

    Args:
        message: the value to check.
        where: how error messages name the value (``"turn t1 input[0]"``).

    Returns:
        ``(held, size)``: the message to hold, and the size of its JSON
        encoding in bytes.

    Raises:
        InvalidMessageError: a field is malformed; ``field`` names it.
        InvalidTextError: a string is not valid UTF-8 (also one escaped in
            JSON text).
        DuplicateIdError: two tool calls of the message share a call id.
    """
    return _check(message, where)


def _check(message: object, where: str) -> tuple[Message, int]:
    """The work of :func:`check_message` and :func:`admit_message`.

    The checks below note each value the held message must carry instead of
    the caller's (a private copy, an exact base value) in ``edits``, as
    ``(owner, field, value)``; :func:`_held_copy` builds new objects holding
    them. Nothing is ever set on the caller's objects.
    """
    if not isinstance(message, Message):
        raise InvalidMessageError(not_a_message(where, message))
    edits: list[tuple[Any, str, Any]] = []
    role = message.role
    if type(role) is not Role:
        try:
            role = Role(role)
        except (ValueError, TypeError):
            raise InvalidMessageError(
                f"{where} has unknown role {excerpt(message.role)}.", field="role"
            ) from None
        edits.append((message, "role", role))
    if message.id is not None and (type(message.id) is not str or not message.id):
        _exact_id(message, "id", where, "id", edits)  # raises for an empty or non-str id
    if message.name is not None:
        _exact_id(message, "name", where, "name", edits)
    gateway = None if message.layout is None else _check_layout(message, where, edits)
    parts = message.content
    if not isinstance(parts, tuple):
        raise InvalidMessageError(f"{where} content must be a tuple of parts.", field="content")
    if type(parts) is not tuple:  # a subclass's __iter__/__len__ never runs
        parts = tuple.__getitem__(parts, slice(None))
        edits.append((message, "content", parts))
    if message.extras is not None:
        _copy_extras(message, "message", gateway, where, "extras", edits)
    seen: set[str] = set()
    # Whether the checks below type every field (see ``_typed_leaf``).
    typed = type(message) is Message
    # The common case of each kind is tested inline and a field's label is built
    # only for a helper that is about to raise (or to check a rarer shape): the
    # helpers hold the rules and their messages; these tests only skip them when
    # they would pass (tests/context/test_door_fast_paths.py compares the two).
    for i, part in enumerate(parts):
        kind: type | None = type(part)
        if kind not in _EXACT_PART_TYPES:
            kind = _part_type(part)
            typed = False
        if kind is ToolCallPart:
            call: ToolCallPart = part  # type: ignore[assignment]
            call_id, name = call.call_id, call.name
            if role is not _ASSISTANT:
                _check_placement(call, role, where, f"content[{i}]")
            if type(call_id) is not str or not call_id:
                call_id = _exact_id(call, "call_id", where, f"content[{i}].call_id", edits)
            if type(name) is not str or not name:
                _exact_id(call, "name", where, f"content[{i}].name", edits)
            arguments = call.arguments
            if type(arguments) is not str and isinstance(arguments, str):
                # Checked as its base value (a subclass's methods never run);
                # the encoder then refuses the subclass, typed.
                arguments = str.__str__(arguments)
            _check_arguments(arguments, where, i)
            if call_id in seen:
                raise DuplicateIdError(
                    f"{where} has two tool calls with call id {excerpt(call_id)}."
                )
            seen.add(call_id)
            if call.extras is not None:
                _copy_extras(call, "tool_call", gateway, where, f"content[{i}]", edits)
        elif kind is ToolResultPart:
            result: ToolResultPart = part  # type: ignore[assignment]
            field = f"content[{i}]"
            if role is not _TOOL and role is not _USER:
                _check_placement(result, role, where, field)
            call_id = result.call_id
            if type(call_id) is not str or not call_id:
                _exact_id(result, "call_id", where, f"{field}.call_id", edits)
            if result.name is not None and type(result.name) is not str:
                _optional_strings(result, ("name",), where, field)
            content = result.content
            if not isinstance(content, tuple):
                raise InvalidMessageError(
                    f"{where} {field}.content must be a tuple of parts, not "
                    f"{what_type(content)}; for text, (TextPart(text=...),).",
                    field=f"{field}.content",
                )
            if type(content) is not tuple:  # a subclass's __iter__/__len__ never runs
                content = tuple.__getitem__(content, slice(None))
                edits.append((result, "content", content))
            if result.extras is not None:
                _copy_extras(result, "tool_result", gateway, where, field, edits)
            if typed and type(result.is_error) is not bool:
                typed = False
            for j, inner in enumerate(content):
                if type(inner) is TextPart:  # the common case, as _check_leaf tests it
                    if inner.extras is not None:
                        _copy_extras(inner, "text", gateway, where, f"{field}.content[{j}]", edits)
                    if typed and not isinstance(inner.text, str):
                        typed = False
                    continue
                inner_field = f"{field}.content[{j}]"
                if _part_type(inner) not in _LEAF_PART_TYPES:
                    raise InvalidMessageError(
                        f"{where} {inner_field} is {what_type(inner)}; "
                        "a tool result holds text, image or opaque parts.",
                        field=inner_field,
                    )
                _check_leaf(inner, gateway, where, inner_field, edits)
                if typed and not _typed_leaf(inner):
                    typed = False
        elif kind is TextPart:  # the common case of a leaf, as _check_leaf tests it
            leaf_text: TextPart = part  # type: ignore[assignment]
            if leaf_text.extras is not None:
                _copy_extras(leaf_text, "text", gateway, where, f"content[{i}]", edits)
            if typed and not isinstance(leaf_text.text, str):
                typed = False
        elif kind in _LEAF_PART_TYPES:
            field = f"content[{i}]"
            leaf = cast("TextPart | ImagePart | OpaquePart", part)
            item = _check_leaf(leaf, gateway, where, field, edits)
            if typed and not _typed_leaf(leaf):
                typed = False
            if kind is OpaquePart:
                _check_opaque_call(leaf.gateway, item, seen, where)  # type: ignore[union-attr]
        elif kind is ReasoningPart:
            field = f"content[{i}]"
            typed = False  # its text and redacted flag are typed by the decode below
            reasoning = cast("ReasoningPart", part)
            _optional_strings(
                reasoning, ("signature", "encrypted_content", "id", "gateway"), where, field
            )
            # Only the gateway that produced reasoning renders it (and its extras).
            producer = reasoning.gateway if isinstance(reasoning.gateway, str) else None
            if reasoning.extras is not None:
                _copy_extras(reasoning, "reasoning", producer, where, field, edits, only=True)
        else:
            raise InvalidMessageError(
                f"{where} content[{i}] is {what_type(part)}, not a message part.",
                field=f"content[{i}]",
            )
    held = message if not edits else _held_copy(message, parts, edits)
    try:
        data = _encoder.encode(held)
    except UnicodeEncodeError as exc:
        raise InvalidTextError(
            f"{where} holds text that is not valid UTF-8 ({exc.reason}).", field="content"
        ) from exc
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise InvalidMessageError(
            f"{where} holds a value that is not JSON: {excerpt(str(exc))}."
        ) from None
    try:
        # Struct construction does not check field types; decoding the encoding
        # does (a text that is not a str would otherwise fail at render time).
        # Skipped when the checks above typed every field: it would pass.
        if not typed:
            _decoder.decode(data)
    except msgspec.ValidationError as exc:
        text = str(exc)
        field = text.rpartition("at `$.")[2].rstrip("`") if "at `$." in text else ""
        raise InvalidMessageError(
            f"{where} has a field of the wrong type: {excerpt(text)}.", field=field
        ) from None
    if not typed:
        _check_texts(held.parts, where)
    if gateway is not None:
        # Last: a gateway's check reads content whose every field is typed now.
        declared = _DECLARED[gateway]
        if declared.check_layout is not None:
            declared.check_layout(held, where)
    return held, len(data)


def _held_copy(
    message: Message, parts: tuple[Part, ...], edits: list[tuple[Any, str, Any]]
) -> Message:
    """A new message like ``message`` (its parts ``parts``) holding ``edits``.

    Each ``(owner, field, value)`` of ``edits`` names the message, one of its
    parts or a part of one of its tool results; that object is replaced by a
    shallow copy (``__copy__``: no ``__post_init__``) with ``value`` in
    ``field``, and whatever holds it by a copy holding the replacement. The
    caller's objects are left as they are.
    """
    copies: dict[int, Any] = {}  # id() of a caller's object -> the copy held instead
    for owner, attr, value in edits:
        copy = copies.get(id(owner))
        if copy is None:
            copy = copies[id(owner)] = owner.__copy__()
        msgspec.structs.force_setattr(copy, attr, value)
    held = copies.pop(id(message), None)
    if held is None:
        held = message.__copy__()  # type: ignore[attr-defined]
    if copies:  # a part, or a part of a tool result, holds one
        held_parts: list[Part] = []
        for part in parts:
            copy = copies.get(id(part), part)
            if isinstance(part, ToolResultPart):
                inner = copy.content
                leaves = tuple([copies.get(id(leaf), leaf) for leaf in inner])
                if any(map(operator.is_not, leaves, inner)):
                    if copy is part:
                        copy = part.__copy__()
                    msgspec.structs.force_setattr(copy, "content", leaves)
            held_parts.append(copy)
        msgspec.structs.force_setattr(held, "content", tuple(held_parts))
    return held  # type: ignore[no-any-return]


def _check_texts(parts: tuple[Part, ...], where: str) -> None:
    """Each text of a text part and of a reasoning part in ``parts`` is a str.

    The decode in :func:`check_message` reads the encoding, where bytes (as
    base64), UUIDs, dates and Decimals are JSON strings too, so it passes them
    as text; this refuses them. Raises :class:`InvalidMessageError` naming the
    first such field.
    """
    for i, part in enumerate(parts):
        kind = _part_type(part)
        if kind is ToolResultPart:
            for j, leaf in enumerate(part.content):  # type: ignore[union-attr]
                if _part_type(leaf) is TextPart and not isinstance(leaf.text, str):
                    _refuse_text(leaf.text, where, f"content[{i}].content[{j}]")
        elif (kind is TextPart or kind is ReasoningPart) and not isinstance(part.text, str):  # type: ignore[union-attr]
            _refuse_text(part.text, where, f"content[{i}]")  # type: ignore[union-attr]


def _refuse_text(text: object, where: str, field: str) -> None:
    raise InvalidMessageError(
        f"{where} {field}.text must be a string, not {what_type(text)}.", field=f"{field}.text"
    )


def layout_with_ids(layout: dict[str, Any], renamed: Mapping[str, str]) -> dict[str, Any]:
    """A copy of an admitted message's ``layout`` whose ``"ids"`` hints (the call ids its
    gateway declared them to name) name ``renamed[id]`` for each id renamed.

    ``layout`` names a gateway that declared its hints (the door checked it).
    """
    hints = _DECLARED[layout["gateway"]].hints
    return {
        key: [renamed.get(i, i) for i in value] if hints.get(key) == "ids" else value
        for key, value in layout.items()
    }


def _check_layout(message: Message, where: str, edits: list[tuple[Any, str, Any]]) -> str:
    """Type-check ``message.layout`` (not None); return the gateway it names.

    Its private copy goes in ``edits`` (see :func:`_check`).
    """
    layout: Any = message.layout
    gateway = layout.get("gateway") if isinstance(layout, dict) else None
    if not isinstance(gateway, str) or not gateway:
        raise InvalidMessageError(
            f"{where} layout must be an object naming its gateway.", field="layout"
        )
    declared = _DECLARED.get(gateway)
    if declared is None:
        raise InvalidMessageError(
            f"{where} layout names {excerpt(gateway)}, which is no gateway that declared "
            "its native keys.",
            field="layout.gateway",
        )
    copy: dict[str, Any] = {"gateway": gateway}
    for key, value in layout.items():
        if key == "gateway":
            continue
        field = f"layout.{excerpt(key)[1:-1] if isinstance(key, str) else excerpt(key)}"
        hint = declared.hints.get(key) if isinstance(key, str) else None
        if hint is None:
            raise InvalidMessageError(
                f"{where} {field} is not a layout hint of the {gateway} gateway "
                f"(it reads {', '.join(sorted(declared.hints)) or 'none'}).",
                field=field,
            )
        if hint == "flag":
            ok = type(value) is bool
            want = "a bool"
        elif hint == "text":
            ok = isinstance(value, str)
            want = "a string"
        elif hint == "ids":
            ok = isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
            want = "a list of strings"
        else:
            ok = isinstance(value, str) and value in hint
            want = "one of " + ", ".join(map(repr, hint))
        if not ok:
            raise InvalidMessageError(
                f"{where} {field} must be {want}, not {excerpt(value)}.", field=field
            )
        copy[key] = _strict_copy(value, where, field, depth=1)
    edits.append((message, "layout", copy))
    return gateway


def _copy_extras(
    owner: Message | Part,
    element: str,
    gateway: str | None,
    where: str,
    field: str,
    edits: list[tuple[Any, str, Any]],
    *,
    only: bool = False,
) -> None:
    """Check ``owner.extras`` against the reserved keys; its private copy goes in ``edits``.

    ``gateway`` None means every declared gateway may emit the extras, unless
    ``only``: then none does (reasoning no gateway produced is never rendered).
    """
    extras = owner.extras  # type: ignore[union-attr]
    if extras is None:
        return
    label = field if field == "extras" else f"{field}.extras"
    if not isinstance(extras, dict):
        raise InvalidMessageError(f"{where} {label} must be a JSON object.", field=label)
    reserved = frozenset() if only and gateway is None else _reserved(element, gateway)
    # dict.__iter__ and str.__str__: a subclass's __iter__, __hash__ or __eq__ never runs here.
    clash = (
        [k for k in dict.__iter__(extras) if isinstance(k, str) and str.__str__(k) in reserved]
        if reserved
        else []
    )
    if clash:
        raise InvalidMessageError(
            f"{where} {label} holds {excerpt(clash[0])}, a key the "
            f"{gateway or 'a'} gateway writes itself; extras never replace it.",
            field=f"{label}.{excerpt(clash[0])[1:-1]}",
        )
    edits.append((owner, "extras", _strict_copy(extras, where, label, depth=0)))


def _optional_strings(part: _Part, names: tuple[str, ...], where: str, field: str) -> None:
    """Each of ``names`` is None or a str.

    The encode-decode check below cannot see this for an optional field: the
    JSON encoder writes a NaN or infinite float as ``null``.
    """
    for name in names:
        value = getattr(part, name)
        if value is not None and not isinstance(value, str):
            raise InvalidMessageError(
                f"{where} {field}.{name} must be a string or None, not {what_type(value)}.",
                field=f"{field}.{name}",
            )


_PART_TYPES = (ToolCallPart, ToolResultPart, TextPart, ImagePart, OpaquePart, ReasoningPart)
_EXACT_PART_TYPES = frozenset(_PART_TYPES)
_LEAF_PART_TYPES = (TextPart, ImagePart, OpaquePart)


def _part_type(part: object) -> type | None:
    """The part class ``part`` is an instance of, or None for no part.

    Its own type in the common case (a cheap test: ``isinstance`` is slow on
    a part class it is not an instance of); else the first part class it
    derives from (struct layouts conflict, so a class derives from one at most).
    """
    kind = type(part)
    if kind in _EXACT_PART_TYPES:
        return kind
    for base in _PART_TYPES:
        if isinstance(part, base):
            return base
    return None


def _typed_leaf(part: TextPart | ImagePart | OpaquePart) -> bool:
    """True when the checked leaf ``part`` needs no decode to type its fields.

    ``check_message`` types each field of a message and of its parts on its
    own (ids, names and optional strings are str or None, ``extras``, a
    ``layout`` and an opaque ``item`` are replaced by strict JSON copies,
    content is a tuple of parts, the role a Role) except a text's ``text``, a
    result's ``is_error`` and a reasoning part's ``text`` and ``redacted``. A
    message of the exact class whose parts are of the exact classes, with
    those fields of their types, decodes from its encoding with every field
    typed (``tests/context/test_message.py`` pins the fields this relies
    on), so the decode that types any other message is skipped for it.
    """
    kind = type(part)
    if kind is TextPart:
        return isinstance(part.text, str)  # type: ignore[union-attr]
    return kind is ImagePart or kind is OpaquePart


def _check_leaf(
    part: TextPart | ImagePart | OpaquePart,
    gateway: str | None,
    where: str,
    field: str,
    edits: list[tuple[Any, str, Any]],
) -> Any:
    """Check one leaf part; its private copies go in ``edits`` (see :func:`_check`).

    Returns an opaque part's copy of its item (None for another part).
    """
    if type(part) is TextPart:  # the common case, before the slower tests
        _copy_extras(part, "text", gateway, where, field, edits)
    elif isinstance(part, ImagePart):
        _optional_strings(part, ("url", "data", "media_type", "detail"), where, field)
        _check_image(part, where, field)
        _copy_extras(part, "image", gateway, where, field, edits)
    elif isinstance(part, OpaquePart):
        _check_opaque(part, where, field)
        item = _strict_copy(part.item, where, f"{field}.item")
        edits.append((part, "item", item))
        return item
    else:
        _copy_extras(part, "text", gateway, where, field, edits)
    return None


def _check_arguments(arguments: object, where: str, index: int) -> None:
    """Tool call arguments: blank (no arguments) or the strict JSON text of an object.

    ``index``: the call's part in ``content`` (errors name ``content[index].arguments``).
    """
    if type(arguments) is str and not is_blank_text(arguments):
        # The common case without the label: provably strict text of an object.
        try:
            value = _any_decoder.decode(arguments)
        except (msgspec.DecodeError, RecursionError, UnicodeEncodeError):
            value = None  # the checks below name the problem
        if type(value) is dict and _provably_strict(arguments):
            return
    field = f"content[{index}].arguments"
    if not isinstance(arguments, str):
        raise InvalidMessageError(
            f"{where} {field} must be JSON text (str), not {what_type(arguments)};"
            " for a dict, json.dumps(arguments).",
            field=field,
        )
    if is_blank_text(arguments):
        return
    value = decode_json_text(arguments, where=where, field=field)
    if not isinstance(value, dict):
        raise InvalidMessageError(
            f"{where} {field} must be the JSON text of an object; it decodes to "
            f"{what_type(value)}: {excerpt(arguments)}; every provider carries tool "
            "call arguments as an object.",
            field=field,
        )


def _check_placement(
    part: ToolCallPart | ToolResultPart, role: Role, where: str, field: str
) -> None:
    # Pairing and every gateway read calls from assistant messages and results
    # from tool and user messages; elsewhere a part would be lost or orphaned.
    if role is not _ASSISTANT and isinstance(part, ToolCallPart):
        raise InvalidMessageError(
            f"{where} {field} is a tool call in a message of role {role.value!r}; only assistant "
            "messages carry tool calls.",
            field=field,
        )
    if role is not _TOOL and role is not _USER and isinstance(part, ToolResultPart):
        raise InvalidMessageError(
            f"{where} {field} is a tool result in a message of role {role.value!r}; only tool and "
            "user messages carry tool results.",
            field=field,
        )


def _exact_id(
    owner: Any, attr: str, where: str, field: str, edits: list[tuple[Any, str, Any]]
) -> str:
    """``owner.attr`` as an exact non-empty str, noted in ``edits`` when it is a str
    subclass's value (its ``__len__``, ``__hash__`` or ``__eq__`` never runs at the
    door or after it)."""
    value = getattr(owner, attr)
    if isinstance(value, str) and type(value) is not str:
        value = str.__str__(value)
        edits.append((owner, attr, value))
    _require_id(value, where, field)
    return value  # type: ignore[no-any-return]


def _require_id(value: object, where: str, field: str) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidMessageError(f"{where} {field} must be a non-empty string.", field=field)


def _check_opaque_call(gateway: str, item: dict[str, Any], seen: set[str], where: str) -> None:
    """Refuse an opaque Responses call whose pairing key an earlier call of the message has.

    ``item`` is the part's checked copy. Pairing tracks such a call by its key
    (see :mod:`turnloom.context.pairing`), so two in one message would be one
    call to answer.
    """
    if gateway != "openai_responses":
        return
    key = pairing_key(item)
    if key is not None and key[0]:
        if key[1] in seen:
            raise DuplicateIdError(
                f"{where} has two {item['type']} items with the pairing key {excerpt(key[1])}."
            )
        seen.add(key[1])


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
    if part.media_type is not None:
        problem = image_media_type_problem(part.media_type)
        if problem is not None:
            raise InvalidMessageError(
                f"{where} {field}.media_type {excerpt(part.media_type)} {problem}.",
                field=f"{field}.media_type",
            )
    if part.data is not None:
        # Either alphabet: Gemini's inlineData (protobuf bytes) takes both, and
        # the other gateways render the data in the standard one.
        problem = base64_problem(part.data, url_safe=True)
        if problem is not None:
            raise InvalidMessageError(f"{where} {field}.data {problem}.", field=f"{field}.data")
    elif is_data_url(part.url):  # type: ignore[arg-type]  # exactly one of url and data
        try:
            media, _ = split_data_url(part.url)  # type: ignore[arg-type]
        except ValueError as exc:
            raise InvalidMessageError(
                f"{where} {field}.url is a data URL that {exc}.", field=f"{field}.url"
            ) from None
        if part.media_type is not None and part.media_type != media:
            raise InvalidMessageError(
                f"{where} {field}.media_type {excerpt(part.media_type)} does not match "
                f"the media type of its data URL, {excerpt(media)}.",
                field=f"{field}.media_type",
            )


def decode_message(
    data: bytes | str | dict[str, Any],
    *,
    where: str = "message",
    max_bytes: int | None = DEFAULT_MAX_MESSAGE_BYTES,
) -> Message:
    """Decode and validate one message from JSON bytes/str or a plain dict.

    The dict form is turnloom's own (``{"role": ..., "content": [{"type":
    "text", "text": ...}]}``), not a provider's; gateways parse native items.
    The message returned is the one :func:`admit_message` holds for the
    decoded one (normalised, holding nothing of ``data``: a dict passed in is
    left as it is and shares nothing with the message).

    Args:
        data: the message.
        where: how error messages name it.
        max_bytes: the per-item cap, in bytes of JSON (None: no cap). Bytes or
            text longer than the cap are refused before anything is decoded;
            a dict, once checked, by its encoded size.

    Raises:
        ItemTooLargeError: the data or the message's encoding is over ``max_bytes``.
        InvalidTextError: the bytes are not valid UTF-8, or text holds a lone
            surrogate.
        InvalidMessageError: malformed JSON, JSON nested deeper than
            :data:`MAX_JSON_DEPTH`, an unknown role or part type, or a field of
            the wrong type; ``field`` names it where msgspec does.
        DuplicateIdError: two tool calls of the message share a call id.
    """
    if max_bytes is not None and isinstance(data, bytes | str) and len(data) > max_bytes:
        # A str of n characters encodes to at least n bytes.
        raise ItemTooLargeError(
            f"{where} is at least {len(data)} bytes, over the per-item cap of {max_bytes} bytes.",
            size=len(data),
            limit=max_bytes,
        )
    try:
        if isinstance(data, dict):
            message = msgspec.convert(data, Message)
        elif isinstance(data, bytes | str):
            message = _decoder.decode(data)
        else:
            raise InvalidMessageError(
                f"{where} must be JSON bytes, text or a dict, not {what_type(data)}."
            )
    except UnicodeDecodeError as exc:
        raise InvalidTextError(f"{where} is not valid UTF-8: {exc.reason}.") from None
    except UnicodeEncodeError as exc:
        raise InvalidTextError(f"{where} holds a lone surrogate: {exc.reason}.") from None
    except RecursionError:
        raise InvalidMessageError(
            f"{where} nests JSON deeper than {MAX_JSON_DEPTH} levels."
        ) from None
    except msgspec.ValidationError as exc:
        text = str(exc)
        field = text.rpartition("at `$.")[2].rstrip("`") if "at `$." in text else ""
        if "invalid utf-8" in text.lower() or "surrogate" in text.lower() or _unencodable(text):
            raise InvalidTextError(f"{where}: {excerpt(text)}.", field=field) from None
        raise InvalidMessageError(f"{where}: {excerpt(text)}.", field=field) from None
    except msgspec.DecodeError as exc:
        text = str(exc)
        if "utf-8" in text.lower() or "surrogate" in text.lower():
            raise InvalidTextError(f"{where} is not valid UTF-8: {excerpt(text)}.") from None
        raise InvalidMessageError(f"{where} is not valid JSON: {excerpt(text)}.") from None
    message, size = admit_message(message, where=where)
    if max_bytes is not None and size > max_bytes:
        raise ItemTooLargeError(
            f"{where} is {size} bytes, over the per-item cap of {max_bytes} bytes.",
            size=size,
            limit=max_bytes,
        )
    return message


def _unencodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


_PINNED_ROLES = (Role.system, Role.developer)
_MAX_ID_LENGTH = 256


def reject_instructions(messages: Sequence[object], field: str, where: str, start: int = 0) -> None:
    """No mid-conversation instructions: refuse ``system`` and ``developer`` messages.

    Pinned instructions change only through a committed turn's
    ``instructions``; a turn's input, a model output, a tool result or a
    continuation never carries one, so none lands mid-history. Items that are
    not Messages are left to the message checks. ``messages[:start]`` passed
    this check already and are skipped.

    Raises:
        InstructionMessageError: ``messages[i]`` has role ``system`` or
            ``developer``; ``field`` is ``f"{field}[{i}]"``.
    """
    i = _first_instruction(messages, start)
    if i >= 0:
        role = cast("Message", messages[i]).role
        raise InstructionMessageError(
            f"{where}[{i}] is a {role!s} message; pinned instructions change "
            "only through a turn snapshot's instructions, never mid-conversation.",
            field=f"{field}[{i}]",
            role=str(role),
        )


def _first_instruction(messages: Sequence[object], start: int = 0) -> int:
    """The index of the first ``system`` or ``developer`` Message from ``start``, else -1.

    The rule :func:`reject_instructions` enforces; a caller that builds the
    error's label only when it is needed tests with this first.
    """
    for i in range(start, len(messages)):
        message = messages[i]
        if isinstance(message, Message) and message.role in _PINNED_ROLES:
            return i
    return -1


def check_id(value: object, what: str) -> str:
    """Validate a context or turn id: a non-empty str of at most 256 characters.

    The one id rule of turnloom: :class:`TurnHistory` applies it to turn ids,
    the runtime's ContextManager to context and turn ids at its door.

    Args:
        value: the id to check.
        what: how the error names it (``"context id"``, ``"turn id"``).

    Returns:
        ``value``, checked.

    Raises:
        InvalidMessageError: the id is not such a string (its excerpt is cut
            to 32 characters), or is not valid UTF-8.
    """
    if type(value) is str and value.isascii() and 0 < len(value) <= _MAX_ID_LENGTH:
        return value  # the common case: ASCII is valid UTF-8, no encode needed
    if not isinstance(value, str) or not value:
        raise InvalidMessageError(f"The {what} must be a non-empty string, not {excerpt(value)}.")
    if len(value) > _MAX_ID_LENGTH:
        raise InvalidMessageError(
            f"The {what} {excerpt(value[:32])}... is {len(value)} characters; at most "
            f"{_MAX_ID_LENGTH} are allowed."
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidMessageError(f"The {what} {excerpt(value)} is not valid UTF-8.") from None
    return value

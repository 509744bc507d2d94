"""Helpers shared by the built-in gateways (private)."""

from __future__ import annotations

__all__ = (
    "args_object",
    "args_text",
    "blank",
    "blank_texts",
    "check_render_depth",
    "drop_foreign",
    "empty_input",
    "json_text",
    "layout_of",
    "make_layout",
    "parse_sdk",
    "render_inline",
    "require_object",
    "sdk_json",
    "split_image_url",
    "standard_base64",
    "violation",
)

import json
import logging
from collections.abc import Callable
from typing import Any

from turnloom.context._media import (
    canonical_media_type,
    inline_image,
    is_image_media_type,
    standard_base64,
)
from turnloom.context.gateway import Violation
from turnloom.context.message import (
    MAX_JSON_DEPTH,
    ImagePart,
    Message,
    OpaquePart,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    decode_json_text,
    strict_json,
)
from turnloom.context.message import is_blank_text as blank
from turnloom.errors import InvalidMessageError, ProviderRuleError, excerpt, what_type


def layout_of(message: Message, gateway: str) -> dict[str, Any]:
    """The layout hints of ``message`` recorded by ``gateway`` (empty when none)."""
    layout = message.layout
    if layout and layout.get("gateway") == gateway:
        return layout
    return {}


def make_layout(gateway: str, hints: dict[str, Any]) -> dict[str, Any] | None:
    """A ``Message.layout`` for ``hints``, or None when there is no hint (canonical form)."""
    kept = {k: v for k, v in hints.items() if v}
    if not kept:
        return None
    return {"gateway": gateway, **kept}


_NESTS = (dict, list, tuple)


def _too_deep(value: Any) -> bool:
    """True when the JSON ``value`` nests more than :data:`MAX_JSON_DEPTH` levels.

    Counted as the door counts (``{}`` is one level); iterative, and a
    container that holds itself is too deep (its levels never end).
    """
    if not isinstance(value, _NESTS):
        return False
    if type(value) is dict:  # the common shape: an object of scalars
        for child in value.values():
            if isinstance(child, _NESTS):
                break
        else:
            return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if level > MAX_JSON_DEPTH:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, _NESTS):
                stack.append((child, level + 1))
    return False


def _flat(extras: Any) -> bool:
    """True for None and an object of scalars (the usual extras: ``{"name": ...}``)."""
    if extras is None:
        return True
    if type(extras) is not dict:
        return False
    for value in extras.values():
        if isinstance(value, _NESTS):
            return False
    return True


def _refuse_deep(value: Any, field: str) -> None:
    if _too_deep(value):
        strict_json(value, where="message", field=field)  # raises the door's error
        raise InvalidMessageError(
            f"message {field} nests JSON deeper than {MAX_JSON_DEPTH} levels.", field=field
        )


def check_render_depth(message: Message) -> None:
    """The door's depth rule, for a message rendered without passing the door.

    The JSON a render copies or decodes -- ``extras`` of the message and its
    parts, opaque items, tool call arguments -- nests at most
    :data:`~turnloom.context.message.MAX_JSON_DEPTH` levels, so no render,
    and no encoding of what it returns, runs into Python's recursion limit.
    A message :func:`~turnloom.context.check_message` accepted always passes;
    the cost for it is a type test per part (and a bracket count per call's
    arguments).

    Raises:
        InvalidMessageError: a value nests deeper; ``field`` names it.
    """
    if message.extras is None:
        # A quick pass over the common shapes; anything else takes the full walk.
        for part in message.content:
            kind = type(part)
            if kind is TextPart:
                if part.extras is None:  # type: ignore[union-attr]
                    continue
            elif kind is ToolCallPart:
                arguments = part.arguments  # type: ignore[union-attr]
                if (
                    part.extras is None  # type: ignore[union-attr]
                    and type(arguments) is str
                    and arguments.count("{") + arguments.count("[") <= MAX_JSON_DEPTH
                ):
                    continue
            elif kind is ToolResultPart and _flat(part.extras):  # type: ignore[union-attr]
                for inner in part.content:  # type: ignore[union-attr]
                    if type(inner) is not TextPart or inner.extras is not None:
                        break
                else:
                    continue
            break
        else:
            return
    _check_depth(message)


def _check_depth(message: Message) -> None:
    if message.extras is not None:
        _refuse_deep(message.extras, "extras")
    for i, part in enumerate(message.content):
        kind = type(part)
        if kind is TextPart:  # the common case, first
            if part.extras is not None:  # type: ignore[union-attr]
                _refuse_deep(part.extras, f"content[{i}].extras")  # type: ignore[union-attr]
        elif kind is ToolCallPart:
            call: ToolCallPart = part  # type: ignore[assignment]
            if call.extras is not None:
                _refuse_deep(call.extras, f"content[{i}].extras")
            arguments = call.arguments
            # More brackets than levels allowed is the only way to nest deeper.
            if (
                type(arguments) is str
                and arguments.count("{") + arguments.count("[") > MAX_JSON_DEPTH
            ):
                decode_json_text(arguments, where="message", field=f"content[{i}].arguments")
        elif kind is OpaquePart:
            _refuse_deep(part.item, f"content[{i}].item")  # type: ignore[union-attr]
        else:
            extras = getattr(part, "extras", None)
            if extras is not None:
                _refuse_deep(extras, f"content[{i}].extras")
            if kind is ToolResultPart and isinstance(part.content, tuple):  # type: ignore[union-attr]
                for j, inner in enumerate(part.content):  # type: ignore[union-attr]
                    if type(inner) is OpaquePart:
                        _refuse_deep(inner.item, f"content[{i}].content[{j}].item")
                    elif getattr(inner, "extras", None) is not None:
                        _refuse_deep(inner.extras, f"content[{i}].content[{j}].extras")


def args_object(arguments: str, call_id: str, provider: str) -> dict[str, Any]:
    """Decode tool call ``arguments`` (JSON text) into the object a provider carries.

    Raises:
        ProviderRuleError: the text is not a JSON object; ``provider`` carries
            arguments as an object only.
    """
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ProviderRuleError(
            f"The arguments of tool call {excerpt(call_id)} are not a JSON object; {provider} "
            "carries tool call arguments as an object only."
        )
    return value


def args_text(value: Any, provider: str, field: str) -> str:
    """Encode a provider's argument object as compact JSON text (key order kept).

    Raises:
        InvalidMessageError: ``value`` is not a JSON object; ``field`` names it.
    """
    if not isinstance(value, dict):
        raise InvalidMessageError(
            f"{provider} {field} must be a JSON object, not {what_type(value)}.", field=field
        )
    return json_text(value, provider, field, separators=(",", ":"))


def json_text(
    value: Any, provider: str, field: str, separators: tuple[str, str] | None = None
) -> str:
    """Encode a native JSON value as text (non-ASCII kept), strictly.

    Raises:
        InvalidMessageError: ``value`` holds something JSON cannot carry (a set,
            bytes, a non-string key, NaN, nesting deeper than
            :data:`~turnloom.context.message.MAX_JSON_DEPTH`); ``field`` names it.
        InvalidTextError: a string holds a lone surrogate.
    """
    value = strict_json(value, where=provider, field=field)
    try:
        return json.dumps(value, ensure_ascii=False, separators=separators, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(
            f"{provider} {field} holds a value that is not JSON: {excerpt(str(exc))}.",
            field=field,
        ) from exc


def render_inline(part: ImagePart) -> tuple[str, str] | None:
    """The ``(media type, base64 data)`` ``part`` carries inline; None for a plain URL.

    Base64 ``data`` with its ``media_type``, or the type and data of a
    ``data:`` URL (the door checked it, see :func:`~turnloom.context.check_message`);
    the type in its canonical form (``image/jpg`` as ``image/jpeg``, see
    :func:`~turnloom.context._media.canonical_media_type`).

    Raises:
        InvalidMessageError: ``part.url`` is a malformed data URL (a message
            rendered without passing the door).
    """
    try:
        inline = inline_image(part.url, part.data, part.media_type)
    except ValueError as exc:
        raise InvalidMessageError(
            f"An image's url is a data URL that {exc}.", field="url"
        ) from None
    if inline is None:
        return None
    return canonical_media_type(inline[0]), inline[1]


def split_image_url(url: object) -> tuple[str, str] | None:
    """The ``(media type, data)`` of an OpenAI image URL ``data:<type>;base64,<data>``.

    None for any other URL (kept as a URL; the door checks a data URL with
    parameters, or a malformed one): for the split form, rendering
    ``f"data:{type};base64,{data}"`` gives back ``url`` exactly.
    """
    if not isinstance(url, str) or not url.startswith("data:"):
        return None
    head, sep, data = url.partition(";base64,")
    media = head[5:]
    if not sep or not is_image_media_type(media):
        return None
    return media, data


_SDK_DEPTH = 64  # deeper than any provider SDK's model nests: left for the parse to refuse


def _is_model(value: Any) -> bool:
    """True for a provider SDK object: a pydantic model (it has ``model_dump``)."""
    kind = type(value)
    if kind is dict or kind is list or kind is str or kind is tuple:
        return False
    return callable(getattr(value, "model_dump", None))


def sdk_json(item: Any) -> Any:
    """``item`` with each provider SDK object in it as its JSON data.

    The providers' Python SDKs (openai, anthropic, google-genai) return
    pydantic models; hosts hand them back as they are (Anthropic's
    ``{"role": "assistant", "content": response.content}``, Gemini's
    ``response.candidates[0].content``). Each object with a ``model_dump``
    method, at any depth of dicts, lists and tuples, is replaced by
    ``model_dump(mode="json", exclude_none=True)``: the JSON the SDK would
    send (bytes as base64, as the REST APIs take ``thoughtSignature``),
    without the fields left unset. ``item`` itself (no copy) when it holds
    no such object. O(item).
    """
    if _is_model(item):
        return item.model_dump(mode="json", exclude_none=True)
    if not _holds_model(item):
        return item
    return _dumped(item, 0)


def parse_sdk(parse: Callable[[Any], Message], item: Any) -> Message:
    """``parse(item)``; when it refuses an item holding SDK objects, ``parse(sdk_json(item))``.

    Plain JSON data costs nothing more (the walk runs only after a refusal).

    Raises:
        InvalidMessageError: as ``parse``: the first refusal when ``item``
            holds no SDK object, else the second parse's.
    """
    try:
        return parse(item)
    except InvalidMessageError:
        plain = sdk_json(item)
        if plain is item:
            raise
    return parse(plain)


def _holds_model(item: Any) -> bool:
    stack = [item]
    seen: set[int] = set()  # containers walked: a host's cyclic data ends the walk
    while stack:
        value = stack.pop()
        kind = type(value)
        if kind is dict or kind is list or kind is tuple:
            if id(value) in seen:
                continue
            seen.add(id(value))
            stack.extend(value.values() if kind is dict else value)
        elif kind is not str and _is_model(value):
            return True
    return False


def _dumped(value: Any, depth: int) -> Any:
    if depth > _SDK_DEPTH:
        return value
    kind = type(value)
    if kind is dict:
        return {key: _dumped(child, depth + 1) for key, child in value.items()}
    if kind is list or kind is tuple:
        return [_dumped(child, depth + 1) for child in value]
    if _is_model(value):
        return value.model_dump(mode="json", exclude_none=True)
    return value


def require_object(item: Any, provider: str, what: str = "item") -> dict[str, Any]:
    """Return ``item`` when it is a JSON object.

    Raises:
        InvalidMessageError: ``item`` is not a dict.
    """
    if not isinstance(item, dict):
        raise InvalidMessageError(
            f"A {provider} {what} must be a JSON object, not {what_type(item)}."
        )
    return item


def _name(value: object) -> str:
    """A gateway name for a log line: a plain identifier as it is, anything else an excerpt."""
    if type(value) is str and len(value) <= 40 and value.isidentifier():
        return value
    return excerpt(value)


def drop_foreign(part: OpaquePart | ReasoningPart, gateway: str, log: logging.Logger) -> None:
    """Log that a part produced by another gateway is left out of ``gateway``'s input.

    Opaque parts are logged at WARNING (content is lost for this provider);
    reasoning of another provider at DEBUG (no provider can verify another's
    reasoning, so dropping it is the documented, expected behaviour).
    """
    if type(part) is OpaquePart:
        log.warning(
            "Dropped a %s-native %s part: the %s gateway cannot carry it.",
            _name(part.gateway),
            excerpt(part.item.get("type", "?") if isinstance(part.item, dict) else "?"),
            gateway,
        )
    else:
        log.debug("Dropped reasoning produced by %s from a %s input.", _name(part.gateway), gateway)


def violation(index: int, rule: str, message: str) -> Violation:
    """Build one :class:`Violation`."""
    return Violation(index=index, rule=rule, message=message)


def empty_input(items: object, field: str) -> list[Violation]:
    """The violation of an input without items, which every provider rejects (else none).

    Source: each API refuses an empty item list (Chat and Anthropic ``messages``,
    Gemini ``contents``, Responses ``input`` of a request that continues nothing).
    """
    if items:
        return []
    return [violation(0, "empty_input", f"The input has no items: {field} is empty.")]


def blank_texts(blocks: object, text_type: str) -> list[int]:
    """The indices of ``blocks`` that are text blocks of type ``text_type`` with
    empty or whitespace-only ``text`` (``[]`` when ``blocks`` is not a list).

    One rule for the nested text checks of the Anthropic and Responses checkers;
    never raises on malformed blocks (a non-dict block is skipped).
    """
    if not isinstance(blocks, list):
        return []
    return [
        k
        for k, block in enumerate(blocks)
        if isinstance(block, dict)
        and block.get("type") == text_type
        and blank(str(block.get("text", "")))
    ]

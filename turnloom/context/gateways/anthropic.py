"""The Anthropic Messages gateway (``system`` and ``messages`` of ``POST /v1/messages``).

Rendering (Message -> native, one ``{"role", "content": [blocks]}`` item per
message):

* ``user``: ``text`` and ``image`` blocks (``source`` of type ``url`` or
  ``base64`` with its ``media_type``; an image given as a ``data:`` URL goes
  as ``base64``, the API takes no data URL source, and URL-safe base64 is sent
  in the standard alphabet); ``anthropic`` opaque parts verbatim.
* ``tool`` (or ``user`` carrying tool results): one ``user`` item whose
  ``tool_result`` blocks come first, in part order, then any other blocks.
  A result's content is a list of ``text``/``image`` blocks and ``is_error``
  is always sent; an error result without content (or with blank text only)
  is sent with the text "The tool failed without output." (the API rejects
  an empty error result).
* ``assistant``: blocks in part order: ``thinking`` (text + ``signature``) and
  ``redacted_thinking`` (``data``) for reasoning produced by Anthropic (one
  without its signature or data cannot be verified and is left out),
  ``text``, ``tool_use`` (``id``, ``name``, ``input``: the arguments decoded
  to an object), ``anthropic`` opaque blocks (server tool use, web search
  results, MCP blocks, compaction) verbatim. Parallel calls are one item.
* ``system`` and ``developer``: a ``{"role": "system"}`` item in the Context,
  at its position. :meth:`AnthropicGateway.request_body` lifts the leading
  run of system items to the top-level ``system`` field (a string when it is
  one string-form item, else a list of text blocks); a system item later in
  the conversation stays inline, which the API accepts (recorded traffic).

Where system messages live in a Context: as ``{"role": "system"}`` items
where they were appended; only the request body moves them.

Lossy mappings, documented: ``developer`` becomes ``system`` (Anthropic has no
developer role); images of system and developer messages are dropped with a
logged warning (system content carries no images); reasoning of other providers
is dropped (Anthropic cannot verify it); opaque parts of other gateways are
dropped with a logged warning; an image's ``detail`` hint is not carried; a
base64 image of a type other than JPEG, PNG, GIF or WebP is dropped with a
logged warning; tool call arguments travel as an object, so their text is re-
encoded as compact JSON (same value, possibly different whitespace) and
arguments that are not a JSON object are rejected with
:class:`~turnloom.errors.ProviderRuleError`; a tool result's ``name`` is not
carried (:meth:`AnthropicGateway.parse_request` fills it from the call); empty
and whitespace-only text blocks are never emitted.

Layout kept for an exact re-emission (``Message.layout``): content sent as a
string (``"content": "string"``), tool results whose content was a string
(``"string_results"``: call ids) or that had no ``is_error``
(``"no_is_error"``: call ids).

Call ids: the API rejects a ``tool_use`` id used twice in one request. A
reused id is renamed ``<id>_r<n>`` in its ``tool_use`` and the
``tool_result`` blocks answering it, by the rule of
:mod:`turnloom.context.callids`, in every prepared input and in
:meth:`AnthropicGateway.request_body`. The API also checks each ``tool_use``
id against ``^[a-zA-Z0-9_-]+$`` (another provider's id such as
``functions.get_weather:0`` is rejected): the same rule renames such an id,
each refused character replaced by ``_`` (``functions_get_weather_0``, then
``_r<n>`` if that id is present already), in the call and its results.

Source: Anthropic Messages API reference (``messages``, ``system``, content
blocks; tool use: ``tool_result`` blocks go in the next user message, before
any other content; consecutive same-role turns are combined).
"""

from __future__ import annotations

__all__ = ("AnthropicGateway",)

import logging
import re
from collections.abc import Sequence
from typing import Any

from turnloom.context._untrack import untrack_atoms
from turnloom.context.body import BodyWriter, write_body, written_body
from turnloom.context.cache import anthropic_breakpoints, breakpoint_violations
from turnloom.context.callids import CallIdRenamer, register_rewriter
from turnloom.context.gateway import (
    Gateway,
    GatewayType,
    NativeContent,
    Violation,
    register_gateway,
)
from turnloom.context.gateways._anthropic_rules import (
    MEDIA_TYPES,
    ROLES,
    empty_result,
    validate_messages,
)
from turnloom.context.gateways._common import (
    args_object,
    args_text,
    blank,
    check_render_depth,
    drop_foreign,
    layout_of,
    make_layout,
    parse_sdk,
    render_inline,
    require_object,
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
)
from turnloom.errors import InvalidMessageError, excerpt

_log = logging.getLogger("turnloom.gateway.anthropic")

_GATEWAY = GatewayType.anthropic.value
# The keys this gateway writes itself: extras never replace them (checked at the door).
_WRITES = NativeKeys(
    message=frozenset({"role", "content"}),
    text=frozenset({"type", "text"}),
    image=frozenset({"type", "source"}),
    tool_call=frozenset({"type", "id", "name", "input"}),
    tool_result=frozenset({"type", "tool_use_id", "content", "is_error"}),
    reasoning=frozenset({"type", "thinking", "signature", "data"}),
    hints={"content": ("string",), "string_results": "ids", "no_is_error": "ids"},
)
# Sent for an error result that has no content (the API rejects it empty).
_EMPTY_ERROR_TEXT = "The tool failed without output."
# The rules validate_request counts over the whole body, not the messages alone.
_CACHE_RULES = ("too_many_cache_breakpoints", "cache_ttl_order")


@written_body
class AnthropicGateway(Gateway):
    """Renders and parses Anthropic Messages items. Stateless, thread-safe.

    Args:
        merge_turns: :meth:`request_body` merges adjacent items of the same
            role into one (default True; the API would combine them itself).
            Set False only to reproduce recorded traffic item for item.
    """

    __slots__ = ("_merge_turns",)

    def __init__(self, *, merge_turns: bool = True) -> None:
        self._merge_turns = merge_turns

    @property
    def type(self) -> GatewayType:
        return GatewayType.anthropic

    items_field = "messages"
    """The field of :meth:`request_body` that holds the item list."""

    def tool_definition(
        self, name: str, description: str, parameters: dict[str, Any]
    ) -> dict[str, Any]:
        """One function tool's ``tools`` entry.

        Shape: ``{"name", "description", "input_schema"}``.
        """
        return {"name": name, "description": description, "input_schema": parameters}

    # -- rendering -------------------------------------------------------

    def render(self, message: Message) -> list[NativeContent]:
        """Render ``message`` into zero or one Anthropic item.

        Raises:
            ProviderRuleError: a tool call's arguments are not a JSON object, or
                a call id (of a call or a result) is not letters, digits, ``_``
                and ``-`` only (the API's pattern for ``tool_use`` ids).
        """
        check_render_depth(message)
        layout = layout_of(message, _GATEWAY)
        own = message.layout is None or bool(layout)
        role = message.role
        blocks: list[Any] = []
        if role is Role.assistant:
            for part in message.parts:
                block = self._assistant_block(part, own)
                if block is not None:
                    blocks.append(block)
            native_role = "assistant"
        else:
            results = [p for p in message.parts if type(p) is ToolResultPart]
            for result in results:
                blocks.append(self._result_block(result, layout, own))
            instructions = role in (Role.system, Role.developer)
            for part in message.parts:
                if type(part) is ToolResultPart:
                    continue
                if instructions and type(part) is ImagePart:
                    _log.warning(
                        "Dropped an image from a %s message: Anthropic system content "
                        "carries no images.",
                        role.value,
                    )
                    continue
                block = self._content_block(part, own)
                if block is not None:
                    blocks.append(block)
            native_role = "system" if instructions else "user"
        if not blocks:
            return []
        content: str | list[Any] = blocks
        if (
            layout.get("content") == "string"
            and len(blocks) == 1
            and blocks[0].keys() == {"type", "text"}
            and blocks[0]["type"] == "text"
        ):
            content = blocks[0]["text"]
        item: NativeContent = {"role": native_role, "content": content}
        if own and message.extras:
            item.update(message.extras)
        return [item]

    def _content_block(self, part: Part, own: bool) -> dict[str, Any] | None:
        if type(part) is TextPart:
            if blank(part.text):
                return None
            block: dict[str, Any] = {"type": "text", "text": part.text}
            if own and part.extras:
                block.update(part.extras)
            return block
        if type(part) is ImagePart:
            inline = render_inline(part)
            if inline is None:
                source: dict[str, Any] = {"type": "url", "url": part.url}
            elif inline[0] not in MEDIA_TYPES:
                _log.warning(
                    "Dropped a %s image: Anthropic takes base64 images of types %s only.",
                    excerpt(inline[0]),
                    ", ".join(MEDIA_TYPES),
                )
                return None
            else:
                # A data URL goes as base64 too: the API takes no data URL source.
                media, data = inline
                source = {"type": "base64", "media_type": media, "data": standard_base64(data)}
            block = {"type": "image", "source": source}
            if own and part.extras:
                block.update(part.extras)
            return block
        if type(part) is OpaquePart:
            if part.gateway == _GATEWAY:
                return part.item
            drop_foreign(part, _GATEWAY, _log)
            return None
        if type(part) is ReasoningPart:
            # Reasoning belongs to assistant turns; elsewhere it has no block.
            return None
        if type(part) is ToolCallPart:
            _log.warning(
                "Dropped tool call %s from a non-assistant message: only assistant turns "
                "carry tool_use blocks.",
                excerpt(part.call_id),
            )
        return None

    def _assistant_block(self, part: Part, own: bool) -> dict[str, Any] | None:
        if type(part) is ToolCallPart:
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": part.call_id,
                "name": part.name,
                "input": args_object(part.arguments, part.call_id, "Anthropic"),
            }
            if own and part.extras:
                block.update(part.extras)
            return block
        if type(part) is ReasoningPart:
            if part.gateway != _GATEWAY:
                drop_foreign(part, _GATEWAY, _log)
                return None
            if not (part.encrypted_content if part.redacted else part.signature):
                # The API verifies each thinking block by its signature (redacted:
                # its data); one without cannot be replayed.
                _log.debug("Dropped Anthropic reasoning without its signature or data.")
                return None
            if part.redacted:
                block = {"type": "redacted_thinking", "data": part.encrypted_content or ""}
            else:
                block = {"type": "thinking", "thinking": part.text, "signature": part.signature}
            if part.extras:
                block.update(part.extras)
            return block
        if type(part) is ToolResultPart:
            _log.warning(
                "Dropped the result of call %s from an assistant message: tool results "
                "belong to the user turn after the call.",
                excerpt(part.call_id),
            )
            return None
        return self._content_block(part, own)

    def _result_block(
        self, result: ToolResultPart, layout: dict[str, Any], own: bool
    ) -> dict[str, Any]:
        inner = [b for p in result.content if (b := self._content_block(p, own)) is not None]
        content: str | list[Any] = inner
        if result.call_id in layout.get("string_results", ()) and all(
            type(p) is TextPart for p in result.content
        ):
            content = "".join(p.text for p in result.content if type(p) is TextPart)
        if result.is_error and empty_result(content):
            # The API rejects an error result without content.
            content = (
                _EMPTY_ERROR_TEXT
                if isinstance(content, str)
                else [{"type": "text", "text": _EMPTY_ERROR_TEXT}]
            )
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": result.call_id,
            "content": content,
        }
        if result.is_error or result.call_id not in layout.get("no_is_error", ()):
            block["is_error"] = result.is_error
        if own and result.extras:
            block.update(result.extras)
        return block

    # -- parsing ---------------------------------------------------------

    def parse(self, item: NativeContent) -> Message:
        """Parse one Anthropic item (a request message, or a response with ``content``).

        A response body (``{"type": "message", "role": "assistant", "content":
        [...]}``) parses like a request message; its ``id`` becomes
        ``Message.id`` and its other fields (``model``, ``stop_reason``,
        ``usage``) are not kept. A user item holding only ``tool_result`` blocks parses
        to a ``tool`` message.

        A provider SDK's object (a pydantic model, or a dict or list holding
        them, as its SDK returned them) is taken as its JSON data
        (``model_dump(mode="json", exclude_none=True)``).

        The message returned is the one :func:`~turnloom.context.admit_message`
        holds for the parsed one (normalised), so it can be committed as it
        is; ``item`` is left as it is and shares nothing with it.

        Raises:
            InvalidMessageError: not an object, an unknown role, content of the
                wrong shape, a ``tool_use``/``tool_result`` without its id.
            InvalidTextError: a string holds a lone surrogate (not valid UTF-8).
            DuplicateIdError: two tool calls of the item share a call id.
        """
        return parse_sdk(self._parse_checked, item)

    def _parse_checked(self, item: NativeContent) -> Message:
        return admit_message(self._parse_item(item), where="An Anthropic message")[0]

    def _parse_item(self, item: NativeContent) -> Message:
        item = require_object(item, "Anthropic", "message")
        role_name = item.get("role")
        if role_name not in ROLES:
            raise InvalidMessageError(
                f"Anthropic message has unknown role {excerpt(role_name)}.", field="role"
            )
        extras: dict[str, Any] = {}
        message_id = None
        is_response = item.get("type") == "message"
        for key, value in item.items():
            if key in ("role", "content"):
                continue
            if key == "id" and role_name == "assistant" and isinstance(value, str):
                message_id = value
            elif not is_response:
                # A response body's own fields (model, stop_reason, usage) are
                # not message fields; only a request item's extras are kept.
                extras[key] = value
        content = item.get("content")
        hints: dict[str, Any] = {}
        if isinstance(content, str):
            hints["content"] = "string"
            blocks: list[Any] = [{"type": "text", "text": content}]
        elif isinstance(content, list):
            blocks = content
        else:
            raise InvalidMessageError(
                "Anthropic message content must be a string or a list of blocks.",
                field="content",
            )
        parts: list[Part] = []
        string_results: list[str] = []
        no_is_error: list[str] = []
        has_extras = bool(extras)
        for i, block in enumerate(blocks):
            part = self._parse_block(block, f"content[{i}]", string_results, no_is_error)
            inner = part.content if type(part) is ToolResultPart else ()
            has_extras = (
                has_extras
                or bool(getattr(part, "extras", None))
                or any(getattr(q, "extras", None) for q in inner)
            )
            parts.append(part)
        hints["string_results"] = string_results
        hints["no_is_error"] = no_is_error
        if role_name == "assistant":
            role = Role.assistant
        elif role_name == "system":
            role = Role.system
        elif parts and all(type(p) is ToolResultPart for p in parts):
            role = Role.tool
        else:
            role = Role.user
        layout = make_layout(_GATEWAY, hints)
        if layout is None and has_extras:
            layout = {"gateway": _GATEWAY}
        return Message(
            role=role, content=tuple(parts), id=message_id, extras=extras or None, layout=layout
        )

    def _parse_block(
        self, block: Any, field: str, string_results: list[str], no_is_error: list[str]
    ) -> Part:
        if not isinstance(block, dict):
            raise InvalidMessageError(f"Anthropic {field} must be an object.", field=field)
        kind = block.get("type")
        rest = {k: v for k, v in block.items() if k != "type"}
        if kind == "text" and isinstance(block.get("text"), str):
            rest.pop("text")
            return TextPart(text=block["text"], extras=rest or None)
        if kind == "image":
            image = _parse_image(block)
            if image is not None:
                return image
        elif kind == "tool_use":
            call_id, name = block.get("id"), block.get("name")
            if not isinstance(call_id, str) or not call_id:
                raise InvalidMessageError(f"Anthropic {field} has no id.", field=f"{field}.id")
            if not isinstance(name, str) or not name:
                raise InvalidMessageError(f"Anthropic {field} has no name.", field=f"{field}.name")
            extras = {k: v for k, v in rest.items() if k not in ("id", "name", "input")}
            return ToolCallPart(
                call_id=call_id,
                name=name,
                arguments=args_text(block.get("input", {}), "Anthropic", f"{field}.input"),
                extras=extras or None,
            )
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                raise InvalidMessageError(
                    f"Anthropic {field} has no tool_use_id.", field=f"{field}.tool_use_id"
                )
            inner = block.get("content", [])
            if isinstance(inner, str):
                string_results.append(call_id)
                inner_parts: list[Any] = [TextPart(text=inner)]
            elif isinstance(inner, list):
                inner_parts = [
                    self._parse_result_block(b, f"{field}.content[{j}]")
                    for j, b in enumerate(inner)
                ]
            else:
                raise InvalidMessageError(
                    f"Anthropic {field}.content must be a string or a list.",
                    field=f"{field}.content",
                )
            if "is_error" not in block:
                no_is_error.append(call_id)
            extras = {
                k: v for k, v in rest.items() if k not in ("tool_use_id", "content", "is_error")
            }
            return ToolResultPart(
                call_id=call_id,
                content=tuple(inner_parts),
                is_error=bool(block.get("is_error", False)),
                extras=extras or None,
            )
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            extras = {k: v for k, v in rest.items() if k not in ("thinking", "signature")}
            return ReasoningPart(
                text=block["thinking"],
                signature=block.get("signature"),
                gateway=_GATEWAY,
                extras=extras or None,
            )
        elif kind == "redacted_thinking" and isinstance(block.get("data"), str):
            extras = {k: v for k, v in rest.items() if k != "data"}
            return ReasoningPart(
                encrypted_content=block["data"],
                redacted=True,
                gateway=_GATEWAY,
                extras=extras or None,
            )
        return OpaquePart(gateway=_GATEWAY, item=block)

    def _parse_result_block(self, block: Any, field: str) -> TextPart | ImagePart | OpaquePart:
        if not isinstance(block, dict):
            raise InvalidMessageError(f"Anthropic {field} must be an object.", field=field)
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            extras = {k: v for k, v in block.items() if k not in ("type", "text")}
            return TextPart(text=block["text"], extras=extras or None)
        if block.get("type") == "image":
            image = _parse_image(block)
            if image is not None:
                return image
        return OpaquePart(gateway=_GATEWAY, item=block)

    def parse_request(self, body: dict[str, Any]) -> list[Message]:
        """Parse a Messages request body: top-level ``system``, then ``messages``.

        The ``system`` field becomes one ``system`` message first (a string
        is recorded as string layout). Tool results get the ``name`` of the
        call they answer (the nearest preceding ``tool_use`` turn).

        Raises:
            InvalidMessageError: ``messages`` is missing or an item is malformed.
        """
        body = require_object(body, "Anthropic", "request body")
        out: list[Message] = []
        system = body.get("system")
        if system is not None:
            wrapped: dict[str, Any] = {"role": "system", "content": system}
            out.append(self.parse(wrapped))
        items = body.get("messages")
        if not isinstance(items, list):
            raise InvalidMessageError(
                "Anthropic request body has no messages list.", field="messages"
            )
        names: dict[str, str] = {}
        for item in items:
            message = self.parse(item)
            if message.role is Role.assistant and message.tool_calls:
                names = {c.call_id: c.name for c in message.tool_calls}
            if message.tool_results:
                message = _with_result_names(message, names)
            out.append(message)
        return out

    # -- rules -----------------------------------------------------------

    def validate(
        self, items: Sequence[NativeContent], *, continues_response: bool = False
    ) -> list[Violation]:
        """Check the Messages API's structural rules over a ``messages`` list.

        Rules (Source: Anthropic Messages API, tool use): every ``tool_use`` of an
        assistant item is answered by a ``tool_result`` in the directly following user
        item, and that item holds its results before any other block; no
        ``tool_result`` without a ``tool_use`` in the directly preceding assistant
        item; ``tool_use`` ids unique in the whole input (the API rejects a reused id)
        and made of letters, digits, ``_`` and ``-`` (the API's id pattern);
        no empty content and no empty or whitespace-only text block; an error
        ``tool_result`` has content; a ``thinking`` block has its ``signature``
        (``redacted_thinking``: its ``data``); a base64 image is JPEG, PNG, GIF or
        WebP; ``system`` items hold no image (text, and beta blocks such as
        ``tool_addition`` seen in recorded traffic). Adjacent same-role items are not a
        violation: the API combines them (recorded traffic shows it accepts them), and
        :meth:`request_body` merges them. ``system`` items are accepted anywhere (top
        level or inline). A leading ``assistant`` item is not flagged: the API rejected
        it in 2024 ("first message must use the user role") but accepts it now (it is
        how a reply is prefilled).

        Prompt caching (Source: Anthropic prompt caching guide): at most 4
        ``cache_control`` breakpoints (``too_many_cache_breakpoints``), and no
        ``"ttl": "1h"`` breakpoint after a shorter-lived one
        (``cache_ttl_order``). Only the marks of ``items`` are seen here; the
        request's ``tools`` and top-level ``system`` hold marks too, so check
        a whole body with :meth:`validate_request`.

        Returns:
            every violation, in item order; empty when the input is valid.
        """
        return validate_messages(items)

    def validate_request(self, body: dict[str, Any]) -> list[Violation]:
        """Check a whole Messages request body: :meth:`validate` of its
        ``messages``, with the prompt-cache rules counted over the whole body.

        Anthropic counts ``cache_control`` breakpoints across ``tools``,
        ``system`` and the message blocks, and a top-level ``cache_control``
        (automatic caching) takes one of the 4 slots as well; TTLs are
        ordered in that reading order (``tools``, ``system``, ``messages``).
        A cache violation in ``tools``, ``system`` or the top-level field
        has ``index`` -1.

        Source: Anthropic prompt caching guide ("Cache breakpoints",
        "Mixing different TTLs", automatic caching).

        Returns:
            every violation, in index order; empty when the body is valid.

        Raises:
            InvalidMessageError: ``body`` is not a dict.
        """
        body = require_object(body, "Anthropic", "request body")
        messages = body.get("messages")
        out = [
            v
            for v in self.validate(messages if isinstance(messages, list) else [])
            if v.rule not in _CACHE_RULES
        ]
        out.extend(breakpoint_violations(anthropic_breakpoints(body)))
        return sorted(out, key=lambda v: v.index)

    def request_body(self, items: Sequence[NativeContent]) -> dict[str, Any]:
        """``{"system": ..., "messages": [...]}`` for ``items``.

        The leading run of ``system`` items becomes the top-level ``system``
        (omitted when there is none): the content string when it is a single
        string-form item, else every block of the run in order. Adjacent items of
        the same role are merged into one (tool results first, so a merged
        user turn still opens with its results), unless the gateway was built
        with ``merge_turns=False``. A ``tool_use`` id already used earlier in
        the request is renamed in its call and in the results that answer it
        (the rule of :mod:`turnloom.context.callids`), because the API rejects
        reused ids while turnloom pairs positionally. Input items are not
        modified, and the body shares no container with them (see
        :meth:`~turnloom.context.Gateway.request_body`).

        Source: Anthropic Messages API, ``system`` parameter and tool use.
        """
        return write_body(self.body_writer(), items)

    def body_writer(self) -> BodyWriter:
        """A new :class:`~turnloom.context.body.BodyWriter` of :meth:`request_body`."""
        return _AnthropicBody(self._merge_turns)


class _AnthropicBody(BodyWriter):
    """:meth:`AnthropicGateway.request_body`, item by item.

    The last message is held back: the next item may merge into it.
    """

    __slots__ = (
        "_blocks",
        "_held",
        "_held_at",
        "_held_to",
        "_lead_end",
        "_leading",
        "_merge_turns",
        "_strings",
        "_system",
        "_system_to",
    )

    field = "messages"
    header = ("system",)

    def __init__(self, merge_turns: bool, *, rename: bool = True) -> None:
        super().__init__(rename=rename)
        self._merge_turns = merge_turns
        self._leading = True  # still in the leading run of system items
        self._system = 0  # how many items the leading run has
        self._system_to = 0  # the last tag the leading run took an item from
        self._lead_end = 0  # the tag of the item that ended the leading run
        self._blocks: list[Any] = []
        self._strings: list[str] = []
        self._held: NativeContent | None = None
        self._held_at = 0  # the tags of its first and last items
        self._held_to = 0
        if type(self) is _AnthropicBody and type(merge_turns) is bool:
            # Its slots only ever hold, besides the renamer and ``marks`` of
            # every writer (a CallIdRenamer made by turnloom, out of the
            # collector itself, or None; None or a list of int pairs), a
            # bool, ints, a list of str and the native items it was fed (a
            # history's, JSON-encoded, which can refer to nothing outside
            # themselves), in a list and merged into new dicts. Nothing it
            # refers to can lead back to it, so it can be in no cycle (a
            # history's body cache holds one).
            untrack_atoms(self)

    def feed(self, items: Sequence[NativeContent], out: list[NativeContent], tag: int = 0) -> None:
        for item in items:
            if self._leading:
                if item.get("role") == "system":
                    content = item.get("content")
                    if isinstance(content, str):
                        self._strings.append(content)
                        self._blocks.append({"type": "text", "text": content})
                    else:
                        self._blocks.extend(content or ())
                    self._system += 1
                    self._system_to = tag
                    continue
                self._leading = False
                self._lead_end = tag
            # Call ids are renamed after the leading run, before merging.
            if self.renamer is not None:
                item = _rewrite_call_ids(item, self.renamer)
            held = self._held
            if (
                self._merge_turns
                and held is not None
                and held.get("role") == item.get("role")
                and item.get("role") in ("user", "assistant")
            ):
                self._held = _merge(held, item)
                self._held_to = tag
                continue
            if held is not None:
                self._hand_out(out, held, self._held_at, self._held_to)
            self._held = item
            self._held_at = self._held_to = tag

    def finish(self, out: list[NativeContent]) -> dict[str, Any]:
        if self._held is not None:
            self._hand_out(out, self._held, self._held_at, self._held_to)
            self._held = None
        if not self._system:
            return {}
        if self._system == 1 and len(self._strings) == 1:
            return {"system": self._strings[0]}
        return {"system": list(self._blocks)}

    def copy(self) -> _AnthropicBody:
        other = _AnthropicBody(self._merge_turns, rename=False)
        other.renamer = self._copied_renamer()
        other._leading = self._leading
        other._system = self._system
        other._system_to = self._system_to
        other._lead_end = self._lead_end
        other._blocks = list(self._blocks)
        other._strings = list(self._strings)
        other._held = self._held
        other._held_at = self._held_at
        other._held_to = self._held_to
        return other

    def held_origin(self) -> int | None:
        return self._held_at if self._held is not None else None

    def forget(self, first_kept: int, dropped: CallIdRenamer) -> bool:
        # The leading run must end in the pinned items' segment's successor:
        # then the kept items follow the system field directly, as before.
        if self._leading or self._system_to != 0 or self._lead_end == 0:
            return False
        return self._forget_ids(dropped)

    def can_open(self, body_item: NativeContent) -> bool:
        # A system item right after the pinned ones would join the leading run.
        return body_item.get("role") != "system"


_NOT_ID = re.compile(r"[^a-zA-Z0-9_-]")


def _fix_call_id(call_id: str) -> str:
    """``call_id`` with each character the API's tool_use id pattern refuses as ``_``."""
    return _NOT_ID.sub("_", call_id) or "_"


def _blocks(item: NativeContent) -> list[Any]:
    content = item.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content or ())


def _merge(first: NativeContent, second: NativeContent) -> NativeContent:
    blocks = _blocks(first) + _blocks(second)
    results = [b for b in blocks if b.get("type") == "tool_result"]
    others = [b for b in blocks if b.get("type") != "tool_result"]
    merged = dict(first)
    merged.update({k: v for k, v in second.items() if k not in ("role", "content")})
    merged["content"] = results + others
    return merged


def _rewrite_call_ids(item: NativeContent, renamer: CallIdRenamer) -> NativeContent:
    """Report one item's tool_use and tool_result ids to ``renamer``; the item with its ids."""
    content = item.get("content") if isinstance(item, dict) else None
    role = item.get("role") if isinstance(item, dict) else None
    if not isinstance(content, list):
        if role == "user":
            renamer.end_group()
        return item
    new_blocks: list[Any] | None = None
    other = False
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if role == "assistant" and kind == "tool_use":
            key, call_id = "id", block.get("id")
            new_id = renamer.call(call_id, _fix_call_id) if isinstance(call_id, str) else call_id
        elif role == "user" and kind == "tool_result":
            key, call_id = "tool_use_id", block.get("tool_use_id")
            new_id = renamer.result(call_id) if isinstance(call_id, str) else call_id
        else:
            other = True
            continue
        if new_id != call_id:
            if new_blocks is None:
                new_blocks = list(content)
            new_blocks[j] = {**block, key: new_id}
    if role == "user" and other:
        # User content after the results starts the next turn: the group ends.
        renamer.end_group()
    return item if new_blocks is None else {**item, "content": new_blocks}


def _with_result_names(message: Message, names: dict[str, str]) -> Message:
    parts: list[Part] = []
    changed = False
    for part in message.parts:
        if type(part) is ToolResultPart and part.name is None and part.call_id in names:
            parts.append(
                ToolResultPart(
                    call_id=part.call_id,
                    content=part.content,
                    is_error=part.is_error,
                    name=names[part.call_id],
                    extras=part.extras,
                )
            )
            changed = True
        else:
            parts.append(part)
    if not changed:
        return message
    return Message(
        role=message.role,
        content=tuple(parts),
        id=message.id,
        extras=message.extras,
        layout=message.layout,
    )


def _parse_image(block: dict[str, Any]) -> ImagePart | None:
    source = block.get("source")
    if not isinstance(source, dict):
        return None
    extras = {k: v for k, v in block.items() if k not in ("type", "source")} or None
    if source.keys() == {"type", "url"} and source["type"] == "url":
        return ImagePart(url=source["url"], extras=extras)
    if source.keys() == {"type", "media_type", "data"} and source["type"] == "base64":
        return ImagePart(data=source["data"], media_type=source["media_type"], extras=extras)
    return None


register_gateway(GatewayType.anthropic, AnthropicGateway, _WRITES)
register_rewriter(GatewayType.anthropic, _rewrite_call_ids)

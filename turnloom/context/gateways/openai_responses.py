"""The OpenAI Responses gateway (``instructions`` and ``input`` of ``POST /responses``).

Rendering (Message -> native items, in part order):

* ``user`` / ``system`` / ``developer``: one input message ``{"role",
  "content"}``; the content is a string for one text part, else a list of
  ``input_text`` / ``input_image`` parts (``openai_responses`` opaque parts,
  such as ``input_file``, verbatim).
* ``assistant``: reasoning produced by this provider becomes a ``reasoning``
  item (``id``, ``summary``, ``encrypted_content`` verbatim); tool calls
  become ``function_call`` items (``call_id``, ``name``, ``arguments``);
  a run of text parts becomes one message: the output form (``{"type":
  "message", "id", "status", "content": [output_text]}``) for a message this
  gateway parsed with its id, else the input form ``{"role": "assistant",
  "content": text}`` (one per text part); ``openai_responses`` opaque items
  (web search, code interpreter, image generation, MCP, compaction) verbatim.
  Parallel calls are one neutral message and consecutive items here. A
  reasoning-only message (a ``reasoning`` item parsed alone) is joined in
  front of the assistant message after it before rendering
  (``step_join = "reasoning"``), so items parsed one at a time render as
  :meth:`OpenAIResponsesGateway.parse_items` of them does.
* ``tool`` (or ``user`` carrying results): one ``function_call_output`` per
  result (``output`` a string for one text part, else a list of input parts),
  and the opaque outputs it holds verbatim, in part order.
* A ``system`` message parsed from the top-level ``instructions`` field is
  kept in the Context as a turnloom item ``{"type": "instructions", "text"}``
  which :meth:`OpenAIResponsesGateway.request_body` always moves to
  ``instructions``; every other system or developer message is an input
  message in place (the API's documented alternative).

The other call kinds (``custom_tool_call``, ``computer_call``,
``local_shell_call``, ``shell_call``, ``apply_patch_call``,
``tool_search_call``, ``program``: the ``CALL_KINDS`` table of
``turnloom.context._call_kinds``) and ``mcp_approval_request`` stay opaque
items of an assistant message; their outputs (and ``mcp_approval_response``)
parse to a ``tool`` message holding the item opaque. Pairing
(:mod:`turnloom.context.pairing`) pairs them by their call ids, so an unanswered
one is closed by the ``open_calls`` policy and an output answering no call is
refused at the door, as for ``function_call``.

Where system messages live in a Context: in ``input`` order, as input
messages, except instructions items, which only the request body lifts.

Lossy mappings, documented: a ``reasoning`` item must be followed by the
output item it belongs to, so reasoning with nothing that can follow it in
the same message (no tool call, no output-form message, no server item) is
left out; reasoning of other providers is dropped; ``is_error`` and a tool
result's ``name`` are not carried (the output text says it); images in
assistant messages are dropped with a warning (only input messages carry
images); an image's ``detail`` defaults to ``"auto"`` (the API requires one);
several text parts of an assistant message without a Responses id become
several assistant messages; opaque parts of other gateways are dropped with a
logged warning; empty and whitespace-only text is never emitted, except an
empty assistant message this gateway parsed from accepted traffic.

Call ids: the API rejects a ``call_id`` used by two ``function_call`` items
of one input ("Duplicate function_call_output for call_id ..."), while
turnloom pairs calls and results by position and a history may reuse an id
in a later turn. A reused id is renamed ``<id>_r<n>`` in its call and the
outputs answering it, by the rule of :mod:`turnloom.context.callids`, in
every prepared input and in :meth:`OpenAIResponsesGateway.request_body`.
Ids of the other call kinds are not renamed: the API is not known to reject
one reused in a later turn (no recording shows it), pairing pairs each output
with the call of its own step, and ``validate`` with the newest call of its
id; renaming would also have to follow a ``local_shell_call_output`` that
names its call in ``id``.

Recorded message fields this gateway writes itself are layout and fields,
never extras: an item's ``id`` is ``Message.id``, its ``"type": "message"``
and ``status`` are the ``"typed"`` and ``"status"`` hints. The
``"unreasoned"`` hint (set by pruning, :func:`turnloom.context.summaries.prune_messages`,
when it drops the reasoning item of the message's response) renders an
assistant message in input form without its ``id``, ``type`` or ``status``
(and without blank text, which only the recorded output form re-emits):
the API refuses a response's output message id sent without its reasoning
item; ``Message.id`` itself stays, as the history's key. A reasoning item
whose ``summary`` is not summary texts is kept whole as an opaque part.

Source: OpenAI Responses API reference (``input`` item types,
``instructions``, reasoning items with ``encrypted_content``; "Item of type
'reasoning' was provided without its required following item").
"""

from __future__ import annotations

__all__ = ("OpenAIResponsesGateway",)

import logging
from collections.abc import Sequence
from typing import Any

import msgspec

from turnloom.context._call_kinds import pairing_key
from turnloom.context._untrack import untrack_atoms
from turnloom.context.body import BodyWriter, write_body, written_body
from turnloom.context.callids import CallIdRenamer, register_rewriter
from turnloom.context.gateway import (
    Gateway,
    GatewayType,
    NativeContent,
    Violation,
    register_gateway,
)
from turnloom.context.gateways._common import (
    blank,
    check_render_depth,
    drop_foreign,
    layout_of,
    make_layout,
    parse_sdk,
    require_object,
    split_image_url,
    standard_base64,
)
from turnloom.context.gateways._responses_rules import (
    INSTRUCTIONS,
    ROLES,
    follows_reasoning,
    validate_input,
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
from turnloom.context.pairing import StepJoin
from turnloom.errors import DuplicateIdError, InvalidMessageError, excerpt, type_name

_log = logging.getLogger("turnloom.gateway.openai_responses")

_GATEWAY = GatewayType.openai_responses.value
# The keys this gateway writes itself: extras never replace them (checked at the door).
_WRITES = NativeKeys(
    message=frozenset({"type", "role", "id", "status", "content"}),
    text=frozenset({"type", "text"}),
    image=frozenset({"type", "image_url", "detail"}),
    # "role" too: an input item with a role is a message, whatever its type.
    tool_call=frozenset({"type", "call_id", "name", "arguments", "role"}),
    tool_result=frozenset({"type", "call_id", "output", "role"}),
    reasoning=frozenset({"type", "id", "summary", "encrypted_content", "role"}),
    hints={
        "content": ("list",),
        "keep_blank": "flag",
        "instructions": "flag",
        "list_outputs": "ids",
        "typed": "flag",
        "status": "text",
        "unreasoned": "flag",
    },
)


@written_body
class OpenAIResponsesGateway(Gateway):
    """Renders and parses OpenAI Responses input items. Stateless, thread-safe."""

    __slots__ = ()

    @property
    def type(self) -> GatewayType:
        return GatewayType.openai_responses

    items_field = "input"
    """The field of :meth:`request_body` that holds the item list."""

    step_join: StepJoin = "reasoning"
    """A reasoning-only message joins the assistant message after it.

    A ``reasoning`` item renders only in front of the item it precedes in
    the same message, as :meth:`parse_items` groups them; a host that parses
    a response one item at a time gets the same input (see
    :func:`~turnloom.context.join_steps`).
    """

    def tool_definition(
        self, name: str, description: str, parameters: dict[str, Any]
    ) -> dict[str, Any]:
        """One function tool's ``tools`` entry.

        Shape: ``{"type": "function", "name", "description", "parameters", "strict": false}``.
        """
        return {
            "type": "function",
            "name": name,
            "description": description,
            "parameters": parameters,
            "strict": False,
        }

    # -- rendering -------------------------------------------------------

    def render(self, message: Message) -> list[NativeContent]:
        """Render ``message`` into zero or more Responses input items, in order."""
        check_render_depth(message)
        layout = layout_of(message, _GATEWAY)
        own = message.layout is None or bool(layout)
        role = message.role
        if role is Role.assistant:
            return self._render_assistant(message, layout, own)
        items: list[NativeContent] = []
        rest: list[Part] = []
        for part in message.parts:
            if type(part) is ToolResultPart:
                items.append(self._render_result(part, layout, own))
            elif type(part) is OpaquePart and _is_output(part):
                items.append(part.item)
            else:
                rest.append(part)
        if role is Role.tool:
            for part in rest:
                _log.warning("Dropped a %s part of a tool message.", type_name(part))
            return items
        if role is Role.system and layout.get("instructions"):
            return [{"type": INSTRUCTIONS, "text": "".join(_texts(rest))}]
        content = self._input_content(rest, layout, own)
        if content is not None:
            item: NativeContent = {"role": role.value, "content": content}
            if layout:
                _write_recorded(item, message, layout)
            if own and message.extras:
                item.update(message.extras)
            items.append(item)
        return items

    def _input_content(
        self, parts: Sequence[Part], layout: dict[str, Any], own: bool
    ) -> str | list[Any] | None:
        if (
            len(parts) == 1
            and type(parts[0]) is TextPart
            and not (own and parts[0].extras)
            and layout.get("content") != "list"
        ):
            text = parts[0].text
            return None if blank(text) and not layout.get("keep_blank") else text
        out: list[Any] = []
        for part in parts:
            block = self._input_block(part, own)
            if block is not None:
                out.append(block)
        return out or None

    def _input_block(self, part: Part, own: bool) -> dict[str, Any] | None:
        if type(part) is TextPart:
            if blank(part.text):
                return None
            block: dict[str, Any] = {"type": "input_text", "text": part.text}
        elif type(part) is ImagePart:
            url = part.url
            if url is None:
                url = f"data:{part.media_type};base64,{standard_base64(part.data)}"  # type: ignore[arg-type]
            block = {"type": "input_image", "image_url": url, "detail": part.detail or "auto"}
        elif type(part) is OpaquePart:
            if part.gateway == _GATEWAY:
                return part.item
            drop_foreign(part, _GATEWAY, _log)
            return None
        else:
            if type(part) is ReasoningPart:
                drop_foreign(part, _GATEWAY, _log)
            return None
        if own and part.extras:
            block.update(part.extras)
        return block

    def _render_result(
        self, result: ToolResultPart, layout: dict[str, Any], own: bool
    ) -> NativeContent:
        output: str | list[Any]
        texts = [p for p in result.content if type(p) is TextPart]
        if (
            len(result.content) <= 1
            and len(texts) == len(result.content)
            and not (texts and own and texts[0].extras)
            and result.call_id not in layout.get("list_outputs", ())
        ):
            output = texts[0].text if texts else ""
        else:
            output = [b for p in result.content if (b := self._input_block(p, own)) is not None]
        item: NativeContent = {
            "type": "function_call_output",
            "call_id": result.call_id,
            "output": output,
        }
        if own and result.extras:
            item.update(result.extras)
        return item

    def _render_assistant(
        self, message: Message, layout: dict[str, Any], own: bool
    ) -> list[NativeContent]:
        items: list[NativeContent] = []
        run: list[Part] = []

        def flush() -> None:
            if run:
                items.extend(self._assistant_messages(message, run, layout, own))
                run.clear()

        for part in message.parts:
            if type(part) is TextPart or (
                type(part) is OpaquePart
                and part.gateway == _GATEWAY
                and part.item.get("type") == "refusal"
            ):
                run.append(part)
                continue
            flush()
            if type(part) is ToolCallPart:
                call: NativeContent = {
                    "type": "function_call",
                    "call_id": part.call_id,
                    "name": part.name,
                    "arguments": part.arguments,
                }
                if own and part.extras:
                    call.update(part.extras)
                items.append(call)
            elif type(part) is ReasoningPart:
                # Without its id only with its encrypted content (a stateless request's:
                # the Agents SDK's reasoning_item_id_policy="omit"): else nothing to send.
                if part.gateway == _GATEWAY and (part.id or part.encrypted_content is not None):
                    reasoning: NativeContent = {"type": "reasoning"}
                    if part.id:
                        reasoning["id"] = part.id
                    reasoning["summary"] = (
                        [{"type": "summary_text", "text": part.text}] if part.text else []
                    )
                    if part.encrypted_content is not None:
                        reasoning["encrypted_content"] = part.encrypted_content
                    if part.extras:
                        reasoning.update(part.extras)
                    items.append(reasoning)
                else:
                    drop_foreign(part, _GATEWAY, _log)
            elif type(part) is OpaquePart:
                if part.gateway == _GATEWAY:
                    items.append(part.item)
                else:
                    drop_foreign(part, _GATEWAY, _log)
            elif type(part) is ImagePart:
                _log.warning(
                    "Dropped an image from an assistant message: Responses assistant "
                    "messages carry text only."
                )
            elif type(part) is ToolResultPart:
                _log.warning(
                    "Dropped the result of call %s from an assistant message.",
                    excerpt(part.call_id),
                )
        flush()
        # A reasoning item needs the output item that follows it in its response.
        kept: list[NativeContent] = []
        for item in reversed(items):
            if item.get("type") == "reasoning" and not (kept and follows_reasoning(kept[-1])):
                _log.debug(
                    "Left out reasoning item %s: no output item follows it.",
                    excerpt(item.get("id")),
                )
                continue
            kept.append(item)
        kept.reverse()
        return kept

    def _assistant_messages(
        self, message: Message, run: list[Part], layout: dict[str, Any], own: bool
    ) -> list[NativeContent]:
        # An unreasoned message is no longer the recorded traffic re-emitted: blank
        # text is left out, as for any message not parsed from accepted traffic.
        unreasoned = bool(layout.get("unreasoned"))
        keep_blank = bool(layout.get("keep_blank")) and not unreasoned
        parts = [p for p in run if not (type(p) is TextPart and blank(p.text) and not keep_blank)]
        if not parts:
            return []
        output_form = own and message.id is not None and bool(layout) and not unreasoned
        if output_form:
            content: list[Any] = []
            for part in parts:
                if type(part) is TextPart:
                    block: dict[str, Any] = {"type": "output_text", "text": part.text}
                    if part.extras:
                        block.update(part.extras)
                    block.setdefault("annotations", [])
                    content.append(block)
                elif type(part) is OpaquePart:
                    content.append(part.item)
            item: NativeContent = {
                "type": "message",
                "role": "assistant",
                "id": message.id,
                "status": layout.get("status", "completed"),
                "content": content,
            }
            if message.extras:
                item.update(message.extras)
            return [item]
        out: list[NativeContent] = []
        for part in parts:
            if type(part) is not TextPart:
                _log.warning("Dropped a refusal part: only output-form messages carry it.")
                continue
            text_content: str | list[Any] = part.text
            if layout.get("content") == "list" or (own and part.extras):
                text_content = [
                    {"type": "output_text", "text": part.text, **((own and part.extras) or {})}
                ]
            item = {"role": "assistant", "content": text_content}
            if layout and not unreasoned:
                _write_recorded(item, message, layout)
            if own and message.extras:
                item.update(message.extras)
            out.append(item)
        return out

    # -- parsing ---------------------------------------------------------

    def parse(self, item: NativeContent) -> Message:
        """Parse one Responses item (an ``input`` item or an ``output`` item).

        Input messages parse to their role; ``function_call``, ``reasoning``,
        output messages and every other typed output item to ``assistant``;
        ``function_call_output``, the outputs of the other call kinds and
        ``mcp_approval_response`` to ``tool`` (the latter kept opaque).
        :meth:`parse_items` groups one response's consecutive items into one
        assistant message; recording the items parsed one at a time instead
        (``[parse(item) for item in response.output]``, together or one
        record each) gives the same next
        input: consecutive assistant messages are one model step (see
        :class:`~turnloom.context.CallTracker`) and a reasoning-only message
        renders in front of the assistant message after it
        (:func:`~turnloom.context.join_steps`).

        A provider SDK's object (a pydantic model, or a dict or list holding
        them, as its SDK returned them) is taken as its JSON data
        (``model_dump(mode="json", exclude_none=True)``).

        The message returned is the one :func:`~turnloom.context.admit_message`
        holds for the parsed one (normalised), so it can be committed as it
        is; ``item`` is left as it is and shares nothing with it.

        Raises:
            InvalidMessageError: not an object, an unknown role or item shape.
            InvalidTextError: a string holds a lone surrogate (not valid UTF-8).
            DuplicateIdError: two tool calls of the item share a call id.
        """
        return parse_sdk(self._parse_checked, item)

    def _parse_checked(self, item: NativeContent) -> Message:
        return admit_message(self._parse_item(item), where="An OpenAI Responses item")[0]

    def _parse_item(self, item: NativeContent) -> Message:
        item = require_object(item, "OpenAI Responses", "item")
        kind = item.get("type")
        if "role" in item and kind in (None, "message"):
            return self._parse_message(item)
        if kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            if not isinstance(call_id, str) or not call_id:
                raise InvalidMessageError(
                    "OpenAI Responses function_call has no call_id.", field="call_id"
                )
            if not isinstance(name, str) or not name:
                raise InvalidMessageError(
                    "OpenAI Responses function_call has no name.", field="name"
                )
            arguments = item.get("arguments", "{}")
            if not isinstance(arguments, str):
                raise InvalidMessageError(
                    "OpenAI Responses function_call arguments must be a JSON string.",
                    field="arguments",
                )
            extras = {
                k: v for k, v in item.items() if k not in ("type", "call_id", "name", "arguments")
            }
            call = ToolCallPart(
                call_id=call_id, name=name, arguments=arguments, extras=extras or None
            )
            return Message(
                role=Role.assistant,
                content=(call,),
                layout={"gateway": _GATEWAY} if extras else None,
            )
        if kind == "function_call_output":
            return self._parse_output(item)
        if _is_output_item(item):
            # The host's answer to an opaque call (computer_call_output, ...,
            # mcp_approval_response): a result, which pairing pairs by its key.
            return Message(role=Role.tool, content=(OpaquePart(gateway=_GATEWAY, item=item),))
        if kind == "reasoning":
            return Message(role=Role.assistant, content=(_parse_reasoning(item),))
        if kind == INSTRUCTIONS and isinstance(item.get("text"), str):
            return Message(
                role=Role.system,
                content=item["text"],
                layout={"gateway": _GATEWAY, "instructions": True},
            )
        if isinstance(kind, str):
            return Message(role=Role.assistant, content=(OpaquePart(gateway=_GATEWAY, item=item),))
        raise InvalidMessageError(
            "OpenAI Responses item has neither a role nor a known type.", field="type"
        )

    def _parse_message(self, item: NativeContent) -> Message:
        role_name = item.get("role")
        if role_name not in ROLES:
            raise InvalidMessageError(
                f"OpenAI Responses message has unknown role {excerpt(role_name)}.", field="role"
            )
        role = Role(role_name)
        message_id = item.get("id")
        if message_id is not None and (not isinstance(message_id, str) or not message_id):
            raise InvalidMessageError(
                "OpenAI Responses message id must be a non-empty string.", field="id"
            )
        extras = {k: v for k, v in item.items() if k not in _WRITES.message}
        content = item.get("content")
        hints: dict[str, Any] = {}
        if "type" in item:
            if item["type"] != "message":
                raise InvalidMessageError(
                    "OpenAI Responses message type must be 'message'.", field="type"
                )
            hints["typed"] = True
        if "status" in item:
            if not isinstance(item["status"], str):
                raise InvalidMessageError(
                    "OpenAI Responses message status must be a string.", field="status"
                )
            hints["status"] = item["status"]
        parts: list[Part] = []
        if isinstance(content, str):
            parts.append(TextPart(text=content))
            if blank(content):
                hints["keep_blank"] = True
        elif isinstance(content, list):
            for j, block in enumerate(content):
                parts.append(_parse_content_block(block, f"content[{j}]"))
            if len(parts) == 1 and type(parts[0]) is TextPart and message_id is None:
                hints["content"] = "list"
            if any(type(p) is TextPart and blank(p.text) for p in parts):
                hints["keep_blank"] = True
        else:
            raise InvalidMessageError(
                "OpenAI Responses message content must be a string or a list.", field="content"
            )
        layout = make_layout(_GATEWAY, hints)
        if layout is None and (
            extras or message_id is not None or any(getattr(p, "extras", None) for p in parts)
        ):
            layout = {"gateway": _GATEWAY}
        return Message(
            role=role, content=tuple(parts), id=message_id, extras=extras or None, layout=layout
        )

    def _parse_output(self, item: NativeContent) -> Message:
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidMessageError(
                "OpenAI Responses function_call_output has no call_id.", field="call_id"
            )
        output = item.get("output")
        hints: dict[str, Any] = {}
        inner: list[TextPart | ImagePart | OpaquePart] = []
        if isinstance(output, str):
            inner.append(TextPart(text=output))
        elif isinstance(output, list):
            for j, block in enumerate(output):
                inner.append(_parse_content_block(block, f"output[{j}]"))
            if len(inner) <= 1 and all(type(p) is TextPart for p in inner):
                hints["list_outputs"] = [call_id]
        else:
            raise InvalidMessageError(
                "OpenAI Responses function_call_output output must be a string or a list.",
                field="output",
            )
        extras = {k: v for k, v in item.items() if k not in ("type", "call_id", "output")}
        result = ToolResultPart(call_id=call_id, content=tuple(inner), extras=extras or None)
        layout = make_layout(_GATEWAY, hints)
        if layout is None and (extras or any(getattr(p, "extras", None) for p in inner)):
            layout = {"gateway": _GATEWAY}
        return Message(role=Role.tool, content=(result,), layout=layout)

    def parse_items(self, items: Sequence[NativeContent]) -> list[Message]:
        """Parse a sequence of items (a request ``input`` or a response ``output``).

        Consecutive model-output items (reasoning, tool calls, server items,
        one assistant message) become one assistant message, so parallel calls
        are one turn; a second assistant message starts a new one, and takes
        the reasoning items directly before it (they belong to it: the API
        requires a reasoning item to be followed by its output item). Consecutive
        ``function_call_output`` items become one ``tool`` message. Tool
        results get the ``name`` of their call. The same items parsed one at
        a time with :meth:`parse` and recorded give the same next input
        (see :meth:`parse`).

        Raises:
            InvalidMessageError: an item is malformed.
            InvalidTextError: a string holds a lone surrogate.
            DuplicateIdError: one model turn has two calls of one kind with the
                same call id (two ``mcp_approval_request`` items with one id).
        """
        out: list[Message] = []
        names: dict[str, str] = {}
        for item in items:
            message = self.parse(item)
            prev = out[-1] if out else None
            if message.role is Role.assistant:
                for call in message.tool_calls:
                    names[call.call_id] = call.name
                if (
                    prev is not None
                    and prev.role is Role.assistant
                    and not (_has_message_item(message) and _has_message_item(prev))
                ):
                    out[-1] = _join(prev, message)
                    continue
                lead = _trailing_reasoning(prev) if prev is not None else 0
                if lead and prev is not None and prev.role is Role.assistant:
                    # Reasoning right before this message item belongs to it (the API
                    # requires a reasoning item to be followed by its output item):
                    # left at the end of the message before, it would not render.
                    parts = prev.parts
                    out[-1] = msgspec.structs.replace(prev, content=parts[:-lead])
                    message = msgspec.structs.replace(
                        message, content=parts[-lead:] + message.parts
                    )
                out.append(message)
                continue
            if message.role is Role.tool:
                result = message.parts[0]
                if (
                    type(result) is ToolResultPart
                    and result.call_id in names
                    and result.name is None
                ):
                    result = msgspec.structs.replace(result, name=names[result.call_id])
                    message = msgspec.structs.replace(message, content=(result,))
                if prev is not None and prev.role is Role.tool:
                    out[-1] = _join(prev, message)
                    continue
            out.append(message)
        return out

    def parse_request(self, body: dict[str, Any]) -> list[Message]:
        """Parse a Responses request body: ``instructions``, then ``input``.

        ``instructions`` (a string) becomes a ``system`` message with the
        instructions layout, so it is re-emitted as ``instructions``; an
        ``input`` string becomes one user message.

        Raises:
            InvalidMessageError: ``input`` is missing, ``instructions`` is not a
                string, or an item is malformed.
            InvalidTextError: a string holds a lone surrogate.
            DuplicateIdError: one model turn has two calls with the same call id.
        """
        body = require_object(body, "OpenAI Responses", "request body")
        out: list[Message] = []
        instructions = body.get("instructions")
        if isinstance(instructions, str):
            out.append(self.parse({"type": INSTRUCTIONS, "text": instructions}))
        elif instructions is not None:
            raise InvalidMessageError(
                "OpenAI Responses request body instructions must be a string.",
                field="instructions",
            )
        items = body.get("input")
        if isinstance(items, str):
            message = Message(role=Role.user, content=items)
            out.append(admit_message(message, where="The OpenAI Responses input string")[0])
            return out
        if not isinstance(items, list):
            raise InvalidMessageError(
                "OpenAI Responses request body has no input list.", field="input"
            )
        out.extend(self.parse_items(items))
        return out

    # -- rules -----------------------------------------------------------

    def validate(
        self, items: Sequence[NativeContent], *, continues_response: bool = False
    ) -> list[Violation]:
        """Check the Responses API's structural rules over an ``input`` list.

        Rules (Source: OpenAI Responses API, conversation state and function
        calling): a ``reasoning`` item is directly followed by the output item
        it belongs to (a ``function_call``, an output message with its id, or
        a server tool item) -- the API rejects it otherwise; every
        ``function_call_output`` answers an open ``function_call`` of the
        current model turn (the calls since the last input message or
        results); every call is answered before the next input message or
        model turn; call ids unique in the whole input (the API rejects a
        ``call_id`` used by two ``function_call`` items); every call of the
        other kinds of ``CALL_KINDS`` (``custom_tool_call``, ``computer_call``,
        ``local_shell_call``, ``shell_call``, ``apply_patch_call``,
        ``tool_search_call``, ``program``; kept as opaque items) has its
        output later in the input, and each such output answers the newest
        earlier call of its kind with its call id, once (a
        ``local_shell_call_output`` may name it in ``id``); an
        ``mcp_approval_response`` names an earlier ``mcp_approval_request``
        (a request not answered yet is valid: the server holds it); item ids (``id``)
        unique over the input ("Duplicate item found with id ...", a 400 seen
        in public reports when a history is replayed twice); no empty or
        whitespace-only ``input_text`` part and no empty content list in user,
        system or developer messages. Content given as an empty string is not
        flagged: the API accepted it (recorded traffic, user and assistant).
        ``instructions`` items are turnloom's and are lifted by
        :meth:`request_body`.

        Args:
            items: the ``input`` items, oldest first.
            continues_response: the request continues a stored response or
                conversation (``previous_response_id`` / ``conversation``):
                leading outputs (``function_call_output`` and the other
                kinds' outputs) may answer calls held by the server, so they
                are not flagged.

        Returns:
            every violation, in item order; empty when the input is valid.
        """
        return validate_input(items, continues_response=continues_response)

    def request_body(self, items: Sequence[NativeContent]) -> dict[str, Any]:
        """``{"instructions": ..., "input": [...]}`` for ``items``.

        ``instructions`` items are removed from ``input`` and their texts
        joined with a blank line (``instructions`` is omitted when there is
        none); every other item stays in order. The Responses API accepts
        adjacent items of the same role, so nothing is merged. An item equal
        to an earlier item with the same ``id`` (the same output replayed
        twice) is left out, with a reasoning item directly before it, since
        the API rejects two items with one id; a different item reusing an id
        is kept, and :meth:`validate` flags it. Then a ``call_id`` used by an
        earlier ``function_call`` is renamed in its call and in the outputs
        answering it (the rule of :mod:`turnloom.context.callids`): the API
        rejects two ``function_call`` items with one ``call_id``. Input items
        are not modified, and the body shares no container with them (see
        :meth:`~turnloom.context.Gateway.request_body`).

        Source: OpenAI Responses API, ``instructions`` and ``input``.
        """
        return write_body(self.body_writer(), items)

    def body_writer(self) -> BodyWriter:
        """A new :class:`~turnloom.context.body.BodyWriter` of :meth:`request_body`."""
        return _ResponsesBody()


def _is_output_item(item: NativeContent) -> bool:
    """True for an output of an opaque call kind, or an ``mcp_approval_response``, with its link."""
    key = pairing_key(item)
    return key is not None and not key[0]


def _opaque_call_keys(message: Message) -> set[str]:
    """Pairing keys of the opaque calls of ``message`` (see ``pairing_key``)."""
    keys: set[str] = set()
    for part in message.parts:
        if type(part) is OpaquePart and part.gateway == _GATEWAY:
            key = pairing_key(part.item)
            if key is not None and key[0]:
                keys.add(key[1])
    return keys


def _is_output(part: OpaquePart) -> bool:
    return part.gateway == _GATEWAY and _is_output_item(part.item)


def _texts(parts: Sequence[Part]) -> list[str]:
    return [p.text for p in parts if type(p) is TextPart]


def _trailing_reasoning(message: Message) -> int:
    """How many reasoning parts end ``message`` (0 when it is reasoning alone: that one
    joins the message after it whole)."""
    count = 0
    for part in reversed(message.parts):
        if type(part) is ReasoningPart or (
            type(part) is OpaquePart and part.item.get("type") == "reasoning"
        ):
            count += 1
        else:
            break
    return count if count < len(message.parts) else 0


def _has_message_item(message: Message) -> bool:
    return any(type(p) is TextPart for p in message.parts)


def _join(first: Message, second: Message) -> Message:
    ids = {c.call_id for c in first.tool_calls}
    for call in second.tool_calls:
        if call.call_id in ids:
            raise DuplicateIdError(
                f"OpenAI Responses model turn has two function_call items with call_id "
                f"{excerpt(call.call_id)}."
            )
    keys = _opaque_call_keys(first)
    for key in _opaque_call_keys(second):
        if key in keys:
            raise DuplicateIdError(
                f"OpenAI Responses model turn has two calls with the pairing key "
                f"{excerpt(key)} (output type and call id)."
            )
    layout: dict[str, Any] | None = None
    if first.layout or second.layout:
        layout = {"gateway": _GATEWAY}
        for source in (first.layout or {}, second.layout or {}):
            for key, value in source.items():
                if key == "list_outputs":
                    layout[key] = [*layout.get(key, []), *value]
                elif key != "gateway":
                    layout[key] = value
    return Message(
        role=first.role,
        content=first.parts + second.parts,
        id=first.id if first.id is not None else second.id,
        extras=first.extras if first.extras is not None else second.extras,
        layout=layout,
    )


def _parse_content_block(block: Any, field: str) -> TextPart | ImagePart | OpaquePart:
    if not isinstance(block, dict):
        raise InvalidMessageError(f"OpenAI Responses {field} must be an object.", field=field)
    kind = block.get("type")
    if kind in ("input_text", "output_text") and isinstance(block.get("text"), str):
        extras = {k: v for k, v in block.items() if k not in ("type", "text")}
        if kind == "output_text" and extras.get("annotations") == []:
            del extras["annotations"]
        return TextPart(text=block["text"], extras=extras or None)
    if kind == "input_image" and isinstance(block.get("image_url"), str):
        url = block["image_url"]
        detail = block.get("detail")
        extras = {k: v for k, v in block.items() if k not in ("type", "image_url", "detail")}
        split = split_image_url(url)
        if split is not None:
            return ImagePart(
                data=split[1], media_type=split[0], detail=detail, extras=extras or None
            )
        return ImagePart(url=url, detail=detail, extras=extras or None)
    return OpaquePart(gateway=_GATEWAY, item=block)


def _write_recorded(item: NativeContent, message: Message, layout: dict[str, Any]) -> None:
    """Write the recorded ``type``, ``id`` and ``status`` of an input-form message."""
    if layout.get("typed"):
        item["type"] = "message"
    if message.id is not None:
        item["id"] = message.id
    if "status" in layout:
        item["status"] = layout["status"]


def _parse_reasoning(item: NativeContent) -> ReasoningPart | OpaquePart:
    summary = item.get("summary", [])
    extras = {
        k: v for k, v in item.items() if k not in ("type", "id", "summary", "encrypted_content")
    }
    text = ""
    for i, entry in enumerate(summary if isinstance(summary, list) else ()):
        if not isinstance(entry, dict):
            raise InvalidMessageError(
                f"OpenAI Responses reasoning summary[{i}] must be an object.",
                field=f"summary[{i}]",
            )
    if isinstance(summary, list) and all(
        isinstance(s, dict) and s.get("type") == "summary_text" and isinstance(s.get("text"), str)
        for s in summary
    ):
        text = "\n\n".join(s["text"] for s in summary)
    if not (
        summary == []
        or (
            isinstance(summary, list)
            and len(summary) == 1
            and summary[0].keys() == {"type", "text"}
            and text
        )
    ):
        # A summary the neutral text cannot carry: the item stays native, verbatim.
        return OpaquePart(gateway=_GATEWAY, item=item)
    encrypted = item.get("encrypted_content")
    return ReasoningPart(
        text=text,
        encrypted_content=encrypted if isinstance(encrypted, str) else None,
        id=item.get("id") if isinstance(item.get("id"), str) else None,
        gateway=_GATEWAY,
        extras=extras or None,
    )


register_gateway(GatewayType.openai_responses, OpenAIResponsesGateway, _WRITES)


def _rewrite_call_ids(item: NativeContent, renamer: CallIdRenamer) -> NativeContent:
    """Report one item's ``call_id`` to ``renamer``; the item with the id it is sent with."""
    if not isinstance(item, dict):
        return item
    kind = item.get("type")
    if kind in ("function_call", "function_call_output"):
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            return item
        new_id = renamer.call(call_id) if kind == "function_call" else renamer.result(call_id)
        return item if new_id == call_id else {**item, "call_id": new_id}
    if "role" in item and kind in (None, "message") and item.get("role") != "assistant":
        # An input message ends the model turn's call group.
        renamer.end_group()
    return item


register_rewriter(GatewayType.openai_responses, _rewrite_call_ids)


class _ResponsesBody(BodyWriter):
    """:meth:`OpenAIResponsesGateway.request_body`, item by item.

    Trailing reasoning items are held back: a replayed output that follows
    takes the reasoning directly before it out with it. Call ids are renamed
    as items are handed out, so only kept items are renamed, in order.
    """

    __slots__ = ("_dups", "_held", "_order", "_seen", "_seen_at", "_texts")

    field = "input"
    header = ("instructions",)

    def __init__(self, *, rename: bool = True) -> None:
        super().__init__(rename=rename)
        # An instructions item without text (turnloom never renders one)
        # carries no instructions; validate() flags it.
        self._texts: list[tuple[int, str]] = []
        # Item id -> the first item with it, and its tag (two maps: no
        # tuple per id for the cyclic collector to track).
        self._seen: dict[str, NativeContent] = {}
        self._seen_at: dict[str, int] = {}
        self._order: list[tuple[int, str]] = []  # (tag, id) of _seen entries with tag > 0
        self._held: list[tuple[NativeContent, int]] = []  # trailing kept reasoning items
        # (tag, tag it depended on): an item left out as a replay, or a
        # reasoning item taken out with it, in a later segment than its cause.
        self._dups: list[tuple[int, int]] = []
        if type(self) is _ResponsesBody:
            # Its slots only ever hold, besides the renamer and ``marks`` of
            # every writer (a CallIdRenamer made by turnloom, out of the
            # collector itself, or None; None or a list of int pairs), lists
            # and dicts of str, int, tuples of them and the native items it
            # was fed: a history's, JSON-encoded, which can refer to nothing
            # outside themselves. Nothing it refers to can lead back to it, so
            # it can be in no cycle (a history's body cache holds one).
            untrack_atoms(self)

    def feed(self, items: Sequence[NativeContent], out: list[NativeContent], tag: int = 0) -> None:
        seen, held = self._seen, self._held
        for item in items:
            kind = item.get("type")
            if kind == INSTRUCTIONS:
                text = item.get("text")
                if isinstance(text, str):
                    self._texts.append((tag, text))
                continue
            item_id = item.get("id")
            if isinstance(item_id, str) and item_id:
                first = seen.get(item_id)
                if first is None:
                    seen[item_id] = item
                    self._seen_at[item_id] = tag
                    if tag:
                        self._order.append((tag, item_id))
                elif first == item:
                    # A reasoning item directly before the replayed output
                    # belongs to that replay: it goes too, or it would be
                    # left without the item it must be followed by.
                    cause = self._seen_at[item_id]
                    if cause != tag:
                        self._dups.append((tag, cause))
                    if held:
                        origin = held.pop()[1]
                        if origin != tag:
                            self._dups.append((tag, origin))
                    continue
            if kind == "reasoning":
                held.append((item, tag))
                continue
            self._flush(out)
            self._hand_out(out, self._renamed(item), tag, tag)

    def _flush(self, out: list[NativeContent]) -> None:
        held = self._held
        if held:
            for item, origin in held:
                self._hand_out(out, self._renamed(item), origin, origin)
            held.clear()

    def _renamed(self, item: NativeContent) -> NativeContent:
        renamer = self.renamer
        return item if renamer is None else _rewrite_call_ids(item, renamer)

    def finish(self, out: list[NativeContent]) -> dict[str, Any]:
        self._flush(out)
        if self._texts:
            return {"instructions": "\n\n".join(text for _, text in self._texts)}
        return {}

    def copy(self) -> _ResponsesBody:
        other = _ResponsesBody(rename=False)
        other.renamer = self._copied_renamer()
        other._texts = list(self._texts)
        other._seen = dict(self._seen)
        other._seen_at = dict(self._seen_at)
        other._order = list(self._order)
        other._held = list(self._held)
        other._dups = list(self._dups)
        return other

    def held_origin(self) -> int | None:
        return self._held[0][1] if self._held else None

    def forget(self, first_kept: int, dropped: CallIdRenamer) -> bool:
        if any(0 < tag < first_kept for tag, _ in self._texts):
            return False
        # A kept item left out because of a dropped one, or a dropped item
        # left out because of a pinned one (its call id would be forgotten).
        if any(
            (cause < first_kept <= tag) or (cause == 0 < tag < first_kept)
            for tag, cause in self._dups
        ):
            return False
        self._dups = [d for d in self._dups if d[0] >= first_kept]
        order = self._order
        cut = 0
        while cut < len(order) and order[cut][0] < first_kept:
            del self._seen[order[cut][1]]
            del self._seen_at[order[cut][1]]
            cut += 1
        del order[:cut]
        return self._forget_ids(dropped)

"""The Anthropic Messages API's structural rules over a ``messages`` list.

:meth:`~turnloom.context.gateways.anthropic.AnthropicGateway.validate`
documents the rules and their sources; this module holds the checker and the
roles, media types and id pattern the gateway's render and parse sides share
with it.
"""

from __future__ import annotations

__all__ = (
    "CALL_ID",
    "MEDIA_TYPES",
    "ROLES",
    "check_result_texts",
    "empty_result",
    "validate_messages",
)

import re
from collections.abc import Sequence
from typing import Any

from turnloom.context.cache import breakpoint_violations, message_breakpoints
from turnloom.context.gateway import NativeContent, Violation
from turnloom.context.gateways._common import blank, blank_texts, empty_input, violation
from turnloom.errors import excerpt

# A tuple: membership compares, never hashes (a malformed role may be a list).
ROLES = ("user", "assistant", "system")
# The media types of a base64 image source (Source: Anthropic Messages API, vision).
MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
# The API checks every tool_use id (and tool_use_id) against this pattern.
CALL_ID = re.compile(r"[a-zA-Z0-9_-]+")


def validate_messages(items: Sequence[NativeContent]) -> list[Violation]:
    """Every violation of a ``messages`` list, in item order.

    The rules and their sources: ``AnthropicGateway.validate``.
    """
    out: list[Violation] = empty_input(items, "messages")
    if isinstance(items, list | tuple):
        out.extend(breakpoint_violations(message_breakpoints(items)))
    seen_ids: dict[str, int] = {}
    open_calls: dict[str, int] = {}
    for index, item in enumerate(items):
        role = item.get("role") if isinstance(item, dict) else None
        if role not in ROLES:
            out.append(
                violation(index, "unknown_role", f"Item {index} has unknown role {excerpt(role)}.")
            )
            continue
        content = item.get("content")
        blocks: list[Any]
        if isinstance(content, str):
            if blank(content):
                out.append(
                    violation(
                        index,
                        "empty_text",
                        f"Item {index} has empty or whitespace-only content.",
                    )
                )
            blocks = []
        elif isinstance(content, list) and content:
            blocks = content
        else:
            out.append(violation(index, "empty_message", f"Item {index} has no content blocks."))
            blocks = []
        answered: set[str] = set()
        other_seen = False
        for j, block in enumerate(blocks):
            kind = block.get("type") if isinstance(block, dict) else None
            source = block.get("source") if kind == "image" else None
            if (
                isinstance(source, dict)
                and source.get("type") == "base64"
                and source.get("media_type") not in MEDIA_TYPES
            ):
                out.append(
                    violation(
                        index,
                        "unsupported_media_type",
                        f"Item {index} content[{j}] is a base64 image of type "
                        f"{excerpt(source.get('media_type'))}; the API takes "
                        f"{', '.join(MEDIA_TYPES)}.",
                    )
                )
            if role == "system" and kind == "image":
                out.append(
                    violation(
                        index,
                        "image_in_instruction",
                        f"Item {index} content[{j}] is an image block; system content "
                        "carries no images.",
                    )
                )
            if kind == "text" and blank(str(block.get("text", ""))):
                out.append(
                    violation(
                        index,
                        "empty_text",
                        f"Item {index} content[{j}] is an empty or whitespace-only text block.",
                    )
                )
            if kind in ("thinking", "redacted_thinking"):
                key = "signature" if kind == "thinking" else "data"
                value = block.get(key)
                if not isinstance(value, str) or not value:
                    out.append(
                        violation(
                            index,
                            "reasoning_without_signature",
                            f"Item {index} content[{j}] is a {kind} block without its {key}.",
                        )
                    )
            if kind == "tool_result":
                call_id = block.get("tool_use_id")
                if role != "user" or not isinstance(call_id, str) or call_id not in open_calls:
                    out.append(
                        violation(
                            index,
                            "tool_result_without_call",
                            f"Item {index} content[{j}] answers tool_use "
                            f"{excerpt(call_id)}, which "
                            "is not a call of the directly preceding assistant item.",
                        )
                    )
                elif other_seen:
                    out.append(
                        violation(
                            index,
                            "tool_result_not_first",
                            f"Item {index} content[{j}] (result of {excerpt(call_id)}) "
                            f"comes after "
                            "other content; tool_result blocks must come first.",
                        )
                    )
                if isinstance(call_id, str):
                    answered.add(call_id)
                if kind == "tool_result":
                    check_result_texts(block, index, j, out)
            else:
                other_seen = True
        for call_id, at in open_calls.items():
            if call_id not in answered:
                out.append(
                    violation(
                        at,
                        "tool_call_without_result",
                        f"tool_use {excerpt(call_id)} of item {at} has no tool_result in item "
                        f"{at + 1}.",
                    )
                )
        open_calls = {}
        if role == "assistant":
            for block in blocks:
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    call_id = block.get("id")
                    if not isinstance(call_id, str) or not call_id:
                        out.append(
                            violation(
                                index,
                                "missing_call_id",
                                f"Item {index} has a tool_use without an id.",
                            )
                        )
                        continue
                    if not CALL_ID.fullmatch(call_id):
                        out.append(
                            violation(
                                index,
                                "invalid_call_id",
                                f"Item {index} has tool_use id {call_id[:64]!r}; the API "
                                "takes letters, digits, '_' and '-' only.",
                            )
                        )
                    if call_id in seen_ids:
                        out.append(
                            violation(
                                index,
                                "duplicate_call_id",
                                f"Item {index} reuses tool_use id {excerpt(call_id)} of item "
                                f"{seen_ids[call_id]}; tool_use ids must be unique.",
                            )
                        )
                    seen_ids[call_id] = index
                    open_calls[call_id] = index
    for call_id, at in open_calls.items():
        out.append(
            violation(
                at,
                "tool_call_without_result",
                f"tool_use {excerpt(call_id)} of item {at} has no tool_result (the input ends).",
            )
        )
    return sorted(out, key=lambda v: v.index)


def empty_result(content: Any) -> bool:
    """Whether a ``tool_result``'s ``content`` is empty: absent, blank text, or ``[]``."""
    return content is None or (isinstance(content, str) and blank(content)) or content == []


def check_result_texts(block: dict[str, Any], index: int, j: int, out: list[Violation]) -> None:
    """Append to ``out`` the text violations of ``tool_result`` block ``j`` of message ``index``.

    ``empty_error_result`` when it is an error without content; ``empty_text``
    for each blank text block in its content list. Never raises.
    """
    inner = block.get("content")
    if block.get("is_error") is True and empty_result(inner):
        out.append(
            violation(
                index,
                "empty_error_result",
                f"Item {index} content[{j}] is an error result without content; the API "
                "needs content when is_error is true.",
            )
        )
    for k in blank_texts(inner, "text"):
        out.append(
            violation(
                index,
                "empty_text",
                f"Item {index} content[{j}].content[{k}] is an empty or "
                "whitespace-only text block.",
            )
        )

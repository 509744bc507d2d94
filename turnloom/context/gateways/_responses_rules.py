"""The OpenAI Responses API's structural rules over an ``input`` list.

:meth:`~turnloom.context.gateways.openai_responses.OpenAIResponsesGateway.validate`
documents the rules and their sources; this module holds the checker and the
item kinds the gateway's render and parse sides share with it.
"""

from __future__ import annotations

__all__ = (
    "INSTRUCTIONS",
    "NOT_OUTPUT",
    "ROLES",
    "check_texts",
    "follows_reasoning",
    "is_output_message",
    "validate_input",
)

from collections.abc import Sequence
from typing import Any

from turnloom.context._call_kinds import CALL_KINDS, OUTPUT_KINDS, call_key, output_key
from turnloom.context.gateway import NativeContent, Violation
from turnloom.context.gateways._common import blank_texts, empty_input, violation
from turnloom.errors import excerpt

# A tuple: membership compares, never hashes (a malformed role may be a list).
ROLES = ("user", "assistant", "system", "developer")
INSTRUCTIONS = "instructions"
# Item types that are input, not model output; everything else typed is output.
NOT_OUTPUT = frozenset(
    {"message", "function_call_output", "reasoning", INSTRUCTIONS, "mcp_approval_response"}
    | OUTPUT_KINDS
)


def is_output_message(item: NativeContent) -> bool:
    return item.get("type") == "message" and item.get("role") == "assistant" and "id" in item


def follows_reasoning(item: NativeContent) -> bool:
    """The item may directly follow a reasoning item of the same response."""
    if is_output_message(item):
        return True
    kind = item.get("type")
    return isinstance(kind, str) and "role" not in item and kind not in NOT_OUTPUT


def validate_input(items: Sequence[NativeContent], *, continues_response: bool) -> list[Violation]:
    """Every violation of an ``input`` list, in item order.

    The rules and their sources: ``OpenAIResponsesGateway.validate``.
    """
    out: list[Violation] = [] if continues_response else empty_input(items, "input")
    open_calls: dict[str, int] = {}
    answered: set[str] = set()
    in_results = False
    leading = continues_response

    def close(before: int) -> None:
        for call_id, at in open_calls.items():
            if call_id not in answered:
                out.append(
                    violation(
                        at,
                        "tool_call_without_result",
                        f"function_call {excerpt(call_id)} (item {at}) has no "
                        f"function_call_output before item {before}.",
                    )
                )
        open_calls.clear()
        answered.clear()

    item_ids: dict[str, int] = {}
    all_calls: dict[str, int] = {}  # every call id so far -> its item
    # Calls of the other CALL_KINDS (opaque items): output key -> (call item, answered)
    kind_calls: dict[tuple[str, str], list[int]] = {}
    calls: list[list[int]] = []  # every entry of kind_calls, in item order
    approvals: set[object] = set()  # ids of mcp_approval_request items so far
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            out.append(violation(index, "not_an_object", f"Item {index} is not an object."))
            continue
        item_id = item.get("id")
        if isinstance(item_id, str) and item_id:
            first = item_ids.setdefault(item_id, index)
            if first != index:
                out.append(
                    violation(
                        index,
                        "duplicate_item_id",
                        f"Item {index} repeats the id {excerpt(item_id)} of item "
                        f"{first}; the API "
                        "rejects an input holding two items with one id.",
                    )
                )
        kind = item.get("type")
        if leading and (kind == "function_call_output" or output_key(item) is not None):
            in_results = True
            continue
        leading = False
        if kind != "function_call" and kind != "function_call_output":
            _pair_kinds(item, index, kind, kind_calls, calls, approvals, out)
        if kind == "reasoning":
            nxt = items[index + 1] if index + 1 < len(items) else None
            if not (isinstance(nxt, dict) and follows_reasoning(nxt)):
                out.append(
                    violation(
                        index,
                        "reasoning_without_following_item",
                        f"Reasoning item {index} ({excerpt(item.get('id'))}) is not directly "
                        "followed by the output item it belongs to.",
                    )
                )
        if "role" in item and kind in (None, "message"):
            role = item.get("role")
            if role not in ROLES:
                out.append(
                    violation(
                        index, "unknown_role", f"Item {index} has unknown role {excerpt(role)}."
                    )
                )
                continue
            if role == "assistant":
                if in_results:
                    close(index)
                    in_results = False
            else:
                close(index)
                in_results = False
                check_texts(item.get("content"), index, out)
            continue
        if kind == "function_call_output":
            call_id = item.get("call_id")
            if isinstance(call_id, str) and call_id in open_calls and call_id not in answered:
                answered.add(call_id)
            else:
                out.append(
                    violation(
                        index,
                        "tool_result_without_call",
                        f"function_call_output {index} answers {excerpt(call_id)}, "
                        f"which is not "
                        "an open function_call of the current model turn.",
                    )
                )
            in_results = True
            continue
        if kind == INSTRUCTIONS:
            if not isinstance(item.get("text"), str):
                out.append(
                    violation(
                        index,
                        "malformed_instructions",
                        f"Instructions item {index} has no text string.",
                    )
                )
            continue
        if in_results:
            close(index)
            in_results = False
        if kind == "function_call":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                out.append(
                    violation(index, "missing_call_id", f"function_call {index} has no call_id.")
                )
            elif call_id in all_calls:
                out.append(
                    violation(
                        index,
                        "duplicate_call_id",
                        f"function_call {index} reuses call id {excerpt(call_id)} of item "
                        f"{all_calls[call_id]}; call ids must be unique in a request.",
                    )
                )
                # Still open: its output is not flagged a second time.
                open_calls[call_id] = index
            else:
                open_calls[call_id] = index
                all_calls[call_id] = index
    close(len(items))
    for at, answered_times in calls:
        if not answered_times:
            call = items[at]  # a dict: call_key found a call in it
            out.append(
                violation(
                    at,
                    "tool_call_without_result",
                    f"{call.get('type')} {excerpt(call.get('call_id'))} (item {at}) has no "
                    f"{CALL_KINDS[call['type']]} in the input.",
                )
            )
    return sorted(out, key=lambda v: v.index)


def _pair_kinds(
    item: NativeContent,
    index: int,
    kind: object,
    kind_calls: dict[tuple[str, str], list[int]],
    calls: list[list[int]],
    approvals: set[object],
    out: list[Violation],
) -> None:
    """Pair the calls and outputs of the opaque :data:`CALL_KINDS` and MCP approvals.

    A call's output may come anywhere after it in the input (the API pairs
    these by id, not by model turn); a call without one, an output answering
    no earlier call or answering one twice, and an ``mcp_approval_response``
    whose ``approval_request_id`` names no earlier ``mcp_approval_request``
    are violations. An ``mcp_approval_request`` left unanswered is not: the
    server holds it open until the next request answers it.
    """
    key = call_key(item)
    if key is not None:
        made = kind_calls[key] = [index, 0]  # a reused id: the newest call is answered
        calls.append(made)
        return
    answer = output_key(item)
    if answer is not None:
        entry = kind_calls.get(answer)
        if entry is None or entry[1]:
            what = "no earlier call" if entry is None else "a call already answered"
            out.append(
                violation(
                    index,
                    "tool_result_without_call",
                    f"{kind} {index} answers {excerpt(answer[1])}: {what} of its kind in the "
                    "input.",
                )
            )
        else:
            entry[1] += 1
        return
    if kind == "mcp_approval_request":
        approvals.add(item.get("id"))
    elif kind == "mcp_approval_response" and item.get("approval_request_id") not in approvals:
        out.append(
            violation(
                index,
                "tool_result_without_call",
                f"mcp_approval_response {index} answers "
                f"{excerpt(item.get('approval_request_id'))}, which no earlier "
                "mcp_approval_request of the input has.",
            )
        )


def check_texts(content: Any, index: int, out: list[Violation]) -> None:
    """Append to ``out`` the text violations of message ``index``'s ``content`` list.

    ``empty_message`` for an empty list; ``empty_text`` for each blank
    ``input_text`` block. A non-list content adds nothing. Never raises.
    """
    if isinstance(content, list):
        if not content:
            out.append(violation(index, "empty_message", f"Message {index} has no content."))
        for j in blank_texts(content, "input_text"):
            out.append(
                violation(
                    index,
                    "empty_text",
                    f"Message {index} content[{j}] is empty or whitespace-only text.",
                )
            )

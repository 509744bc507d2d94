"""The OpenAI Responses item types that call a tool the host runs, and their outputs.

A leaf module (no turnloom imports), shared by the Responses gateway's
``validate`` and parse, the pairing of :mod:`turnloom.context.pairing` (which
sees these items, kept opaque, through ``pairing_key``) and the OpenAI
Agents session's ``complete_window``.
"""

from __future__ import annotations

__all__ = (
    "APPROVAL_REQUEST",
    "APPROVAL_RESPONSE",
    "CALL_KINDS",
    "OUTPUT_KINDS",
    "call_key",
    "cancelled_output",
    "output_key",
    "pairing_key",
)

from collections.abc import Mapping
from typing import Any

# Each item type that calls a tool the host runs, and the item type answering
# it, paired by ``call_id`` (the OpenAI Agents SDK's own map,
# ``_TOOL_CALL_TO_OUTPUT_TYPE``). The API rejects an output whose call is not
# in the input ("No tool call found for ...") and a call without its output.
# ``function_call`` is parsed into tool call parts; the others are kept as
# opaque items.
CALL_KINDS: dict[str, str] = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "computer_call": "computer_call_output",
    "local_shell_call": "local_shell_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "tool_search_call": "tool_search_output",
    "program": "program_output",
}
OUTPUT_KINDS = frozenset(CALL_KINDS.values())
_OUTPUT_KINDS = OUTPUT_KINDS
APPROVAL_REQUEST = "mcp_approval_request"
APPROVAL_RESPONSE = "mcp_approval_response"


def output_key(item: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(output type, call id)`` of an output item of :data:`CALL_KINDS`, else None.

    A ``local_shell_call_output`` without ``call_id`` names its call's
    ``call_id`` in ``id`` (the API's own input type; the OpenAI Agents SDK
    writes ``call_id``).
    """
    kind = item.get("type")
    if not isinstance(kind, str) or kind not in _OUTPUT_KINDS:
        return None
    call_id = item.get("call_id")
    if call_id is None and kind == "local_shell_call_output":
        call_id = item.get("id")
    return (kind, call_id) if isinstance(call_id, str) and call_id else None


def call_key(item: Mapping[str, Any]) -> tuple[str, str] | None:
    """The :func:`output_key` of the output answering this call item; None: not such a call."""
    kind = item.get("type")
    output = CALL_KINDS.get(kind) if isinstance(kind, str) else None
    call_id = item.get("call_id")
    if output is None or not isinstance(call_id, str) or not call_id:
        return None
    return (output, call_id)


def pairing_key(item: Mapping[str, Any]) -> tuple[bool, str] | None:
    """How pairing sees an opaque Responses item: ``(is_call, key)``, or None.

    For a call of :data:`CALL_KINDS` other than ``function_call`` (which the
    gateway parses into tool call parts) and an ``mcp_approval_request``
    (``is_call`` True), and for the output answering one (False). A call and
    the output answering it have one ``key``: the output item type, a space and
    the call id (``"computer_call_output call_1"``;
    ``"mcp_approval_response mcpr_1"`` for an approval, linked by the request's
    ``id`` and the response's ``approval_request_id``), so ids of different
    kinds never meet, and a key cannot equal a function call id unless that
    id is itself of this form.
    """
    kind = item.get("type")
    if not isinstance(kind, str) or kind == "function_call" or kind == "function_call_output":
        return None
    if kind == APPROVAL_REQUEST or kind == APPROVAL_RESPONSE:
        ref = item.get("id" if kind == APPROVAL_REQUEST else "approval_request_id")
        if isinstance(ref, str) and ref:
            return (kind == APPROVAL_REQUEST, f"{APPROVAL_RESPONSE} {ref}")
        return None
    made = call_key(item)
    if made is not None:
        return (True, f"{made[0]} {made[1]}")
    answer = output_key(item)
    return None if answer is None else (False, f"{answer[0]} {answer[1]}")


def cancelled_output(key: str, text: str) -> dict[str, Any] | None:
    """The output item closing the call of pairing ``key`` as cancelled, or None.

    None where the output's type cannot say "cancelled" truthfully: a
    ``computer_call_output`` must hold a screenshot, a ``tool_search_output``
    the tools found, a ``program_output`` the program's result; such a call is
    left out of the input instead, whatever the policy. An
    ``mcp_approval_request`` gets no answer either: the API accepts a request
    left unanswered (it is the model asking, not a call the host runs).

    Shapes follow the API's input item types: ``custom_tool_call_output``
    ``output`` a string; ``local_shell_call_output`` names its call in
    ``id``; ``shell_call_output`` one chunk with ``text`` on stderr and exit
    code 1; ``apply_patch_call_output`` status ``failed`` with ``text``.
    """
    output, _, call_id = key.partition(" ")
    if output == "custom_tool_call_output":
        return {"type": output, "call_id": call_id, "output": text}
    if output == "local_shell_call_output":
        return {"type": output, "id": call_id, "output": text}
    if output == "shell_call_output":
        chunk = {"stdout": "", "stderr": text, "outcome": {"type": "exit", "exit_code": 1}}
        return {"type": output, "call_id": call_id, "output": [chunk]}
    if output == "apply_patch_call_output":
        return {"type": output, "call_id": call_id, "status": "failed", "output": text}
    return None

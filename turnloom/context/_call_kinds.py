"""The OpenAI Responses item types that call a tool the host runs, and their outputs.

A leaf module (no turnloom imports), shared by the Responses gateway's
``validate`` and the OpenAI Agents session's ``complete_window``.
"""

from __future__ import annotations

__all__ = ("CALL_KINDS", "call_key", "output_key")

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
_OUTPUT_KINDS = frozenset(CALL_KINDS.values())


def output_key(item: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(output type, call id)`` of an output item of :data:`CALL_KINDS`, else None.

    A ``local_shell_call_output`` without ``call_id`` names its call's
    ``call_id`` in ``id`` (the API's own input type; the OpenAI Agents SDK
    writes ``call_id``).
    """
    kind = item.get("type")
    if kind not in _OUTPUT_KINDS:
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

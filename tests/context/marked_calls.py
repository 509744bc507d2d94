"""A tool call and its result that carry a token, so renders of reused call ids tell them apart.

The call-id properties (renames, door ids, closed turns) reuse a few call
ids across turns; the token in each call's arguments and each result's
text is what shows which call a rendered id belongs to.
"""

from __future__ import annotations

from turnloom.context import Message, Role, TextPart, ToolCallPart, ToolResultPart


def marked_call(call_id: str, token: str) -> Message:
    """An assistant message with one call of ``f``, its arguments ``{"t": token}``."""
    return Message(
        role=Role.assistant,
        content=(ToolCallPart(call_id=call_id, name="f", arguments=f'{{"t": "{token}"}}'),),
    )


def marked_result(call_id: str, token: str) -> Message:
    """A tool message answering ``call_id`` with the text ``token``."""
    return Message(
        role=Role.tool,
        content=(ToolResultPart(call_id=call_id, content=(TextPart(text=token),)),),
    )

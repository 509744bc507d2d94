"""Every turn's runtime-state call id is in the reserved form the door refuses."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from turnloom.context import Message, Role, TextPart, ToolCallPart, ToolResultPart
from turnloom.runtime.state import is_state_message, state_call_id


@given(st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=40))
def test_every_turns_state_call_id_is_in_the_reserved_form(context_id: str, turn_id: str) -> None:
    """Invariant: the door refuses state pairs by the reserved form alone (no turn's id
    is computed there), so every turn's state call id is in that form: a call or a
    result with it is a state message without being told the id."""
    call_id = state_call_id(context_id, turn_id)
    call = ToolCallPart(call_id=call_id, name="lookup", arguments="{}")
    result = ToolResultPart(call_id=call_id, content=(TextPart(text="ok"),))
    assert is_state_message(Message(role=Role.assistant, content=(call,)))
    assert is_state_message(Message(role=Role.tool, content=(result,)))

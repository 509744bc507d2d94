"""``Message.name``: the participant name the Tagged scope selects by, carried by OpenAI Chat."""

from __future__ import annotations

import pytest

from turnloom.context import Message, Role, TextPart, check_message, get_gateway
from turnloom.errors import InvalidMessageError


def test_openai_chat_parses_a_participant_name_into_message_name() -> None:
    """Invariant: a user/assistant ``name`` is Message.name, not an extra, and renders back."""
    gateway = get_gateway("openai_chat")
    for item in (
        {"role": "user", "content": "hi", "name": "alice"},
        {"role": "assistant", "content": "hello", "name": "planner"},
        {"role": "system", "content": "be brief", "name": "ops"},
    ):
        message = gateway.parse(item)
        assert message.name == item["name"]
        assert message.extras is None
        assert message.layout is None
        assert gateway.render(message) == [item]


def test_openai_chat_tool_message_name_stays_the_function_name() -> None:
    """Invariant: a tool message's ``name`` is the tool result's, not the participant's."""
    gateway = get_gateway("openai_chat")
    item = {"role": "tool", "tool_call_id": "c1", "name": "find_bag", "content": "Gate 4"}
    message = gateway.parse(item)
    assert message.name is None
    assert message.tool_results[0].name == "find_bag"
    assert gateway.render(message) == [item]


def test_a_hand_built_name_renders_in_openai_chat_and_is_dropped_elsewhere() -> None:
    """Invariant: only OpenAI Chat has a participant-name field; others drop it."""
    message = Message(role=Role.user, content=(TextPart(text="hi"),), name="alice")
    assert get_gateway("openai_chat").render(message) == [
        {"role": "user", "content": "hi", "name": "alice"}
    ]
    assert "alice" not in repr(get_gateway("anthropic").render(message))
    assert "alice" not in repr(get_gateway("gemini").render(message))
    assert "alice" not in repr(get_gateway("openai_responses").render(message))


@pytest.mark.parametrize("bad", ["", 7, ["a"]])
def test_openai_chat_rejects_a_name_that_is_not_a_non_empty_string(bad: object) -> None:
    """Invariant: a malformed participant name fails at parse, naming the field."""
    with pytest.raises(InvalidMessageError) as info:
        get_gateway("openai_chat").parse({"role": "user", "content": "hi", "name": bad})
    assert info.value.field == "name"


def test_openai_chat_keeps_a_null_name_verbatim() -> None:
    """Invariant: ``"name": null`` is not a participant; it round-trips as an extra."""
    gateway = get_gateway("openai_chat")
    item = {"role": "user", "content": "hi", "name": None}
    message = gateway.parse(item)
    assert message.name is None
    assert gateway.render(message) == [item]


def test_check_message_rejects_an_empty_name() -> None:
    """Invariant: Message.name is None or a non-empty string at the door."""
    with pytest.raises(InvalidMessageError) as info:
        check_message(Message(role=Role.user, content="hi", name=""))
    assert info.value.field == "name"

"""The OpenAI Chat gateway: recorded layouts, extras ownership, and what it drops."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.context.gateways._support import PROVIDERS
from turnloom.context import (
    Message,
    OpaquePart,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    get_gateway,
)
from turnloom.errors import InvalidMessageError

gw = get_gateway("openai_chat")


@pytest.mark.parametrize(
    "item",
    [
        {"role": "user", "content": "plain"},
        {"role": "user", "content": [{"type": "text", "text": "one-element list"}]},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "r"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r", "name": "f"},
    ],
)
def test_recorded_layouts_are_re_emitted_exactly(item: dict[str, Any]) -> None:
    """Invariant: render(parse(m)) == [m] for each content layout seen in recorded traffic."""
    assert gw.render(gw.parse(item)) == [item]


def test_canonical_form_for_messages_from_elsewhere() -> None:
    """A neutral message gets the canonical form: string content, null content with calls."""
    assert gw.render(Message(role=Role.user, content="hi")) == [{"role": "user", "content": "hi"}]
    message = Message(role=Role.assistant, content=(ToolCallPart(call_id="c", name="f"),))
    assert gw.render(message) == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        }
    ]


def test_user_message_with_results_renders_tool_messages_then_text() -> None:
    """Results of a user message become tool messages, followed by its text."""
    message = Message(
        role=Role.user,
        content=(
            ToolResultPart(call_id="c", content=(TextPart(text="r"),)),
            TextPart(text="next"),
        ),
    )
    assert gw.render(message) == [
        {"role": "tool", "tool_call_id": "c", "content": "r"},
        {"role": "user", "content": "next"},
    ]


def test_reasoning_only_reply_renders_to_nothing() -> None:
    """An assistant message left with reasoning only has no Chat form: no item."""
    message = Message(
        role=Role.assistant, content=(ReasoningPart(text="x", signature="s", gateway="anthropic"),)
    )
    assert gw.render(message) == []


@pytest.mark.parametrize("provider", PROVIDERS)
def test_extras_of_another_gateway_are_not_emitted(provider: str) -> None:
    """Extras recorded by one gateway are re-emitted by it and ignored by the others."""
    source = {
        "role": "user",
        "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
    }
    message = get_gateway("anthropic").parse(source)
    assert message.layout == {"gateway": "anthropic"}
    text_blocks = str(get_gateway(provider).render(message))
    assert ("cache_control" in text_blocks) is (provider == "anthropic")


@pytest.mark.parametrize(
    ("provider", "opaque_gateway"),
    [(p, "anthropic" if p != "anthropic" else "gemini") for p in PROVIDERS],
)
def test_foreign_opaque_parts_are_dropped_with_a_warning(
    provider: str, opaque_gateway: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every gateway drops another gateway's opaque part and logs it at WARNING."""
    message = Message(
        role=Role.user,
        content=(TextPart(text="hi"), OpaquePart(gateway=opaque_gateway, item={"type": "doc"})),
    )
    with caplog.at_level(logging.WARNING, logger=f"turnloom.gateway.{provider}"):
        items = get_gateway(provider).render(message)
    assert len(items) == 1
    assert "doc" not in str(items)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert caplog.records[0].getMessage() == (
        f"Dropped a {opaque_gateway}-native 'doc' part: the {provider} gateway cannot carry it."
    )


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"role": "robot", "content": "x"}, "role"),
        ({"role": "tool", "content": "x"}, "tool_call_id"),
        ({"role": "user", "content": 5}, "content"),
        ({"role": "assistant", "tool_calls": {}}, "tool_calls"),
    ],
)
def test_malformed_messages_raise_invalid_message_error(item: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidMessageError) as info:
        gw.parse(item)
    assert info.value.field == field


def test_parse_request_reads_messages_in_order() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
    }
    assert gw.parse_request(body) == [
        Message(role=Role.system, content="s"),
        Message(role=Role.user, content="u"),
    ]
    with pytest.raises(InvalidMessageError, match="no messages list"):
        gw.parse_request({"model": "m"})

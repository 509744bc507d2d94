"""``Context`` with every gateway: appended messages give the gateway's request body."""

from __future__ import annotations

from typing import Any

import pytest

from tests.context.gateways._support import ITEM_FIELD, PROVIDERS
from tests.context.gateways.test_sdk import rich_conversation
from turnloom.context import Context, get_gateway


@pytest.mark.parametrize("provider", PROVIDERS)
def test_context_request_body_places_instructions_and_validates(provider: str) -> None:
    """Invariant: a Context's request body is the gateway's body of its items, and valid."""
    context = Context(provider)
    messages = rich_conversation(provider)
    appended = sum(context.emplace_message(m) for m in messages)
    gateway = get_gateway(provider)
    assert appended == len(context)
    body: Any = context.request_body()
    assert body == gateway.request_body(list(context.snapshot()))
    assert gateway.validate(body[ITEM_FIELD[provider]]) == []
    text = "You are a travel agent."
    expected: dict[str, dict[str, Any]] = {
        "openai_chat": {"messages": {"role": "system", "content": text}},
        "openai_responses": {"input": {"role": "system", "content": text}},
        "anthropic": {"system": [{"type": "text", "text": text}]},
        "gemini": {"systemInstruction": {"role": "user", "parts": [{"text": text}]}},
    }
    ((field, value),) = expected[provider].items()
    if field == ITEM_FIELD[provider] and provider.startswith("openai"):
        assert body[field][0] == value
    else:
        assert body[field] == value
        assert all(i.get("role") != "system" for i in body[ITEM_FIELD[provider]])

"""The runtime-state tool declaration: valid for each provider's SDK types, and named as called."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types import ToolParam as AnthropicToolParam
from google.genai import types as genai_types
from openai.types.chat import ChatCompletionFunctionToolParam
from openai.types.responses import FunctionToolParam

from tests.context.gateways._sdk_types import type_errors
from turnloom.context import GatewayType, Message, Role, get_gateway
from turnloom.errors import InputError
from turnloom.runtime import (
    STATE_TOOL_NAME,
    ContextPrepareRequest,
    Foundation,
    TurnSnapshot,
    state_tool_definition,
)

pytestmark = pytest.mark.anyio

_SDK_TYPE: dict[GatewayType, Any] = {
    GatewayType.openai_chat: ChatCompletionFunctionToolParam,
    GatewayType.openai_responses: FunctionToolParam,
    GatewayType.anthropic: AnthropicToolParam,
}


@pytest.mark.parametrize("kind", list(GatewayType))
def test_state_tool_definition_matches_the_sdk_tool_type(kind: GatewayType) -> None:
    definition = state_tool_definition(kind)
    if kind is GatewayType.gemini:
        tool = genai_types.Tool.model_validate(definition)
        assert tool.function_declarations is not None
        assert [d.name for d in tool.function_declarations] == [STATE_TOOL_NAME]
    else:
        assert type_errors(definition, _SDK_TYPE[kind]) == []
    assert state_tool_definition(kind) == definition
    assert state_tool_definition(kind) is not definition


def test_state_tool_definition_rejects_an_unknown_gateway() -> None:
    with pytest.raises(InputError, match="Unknown gateway 'bedrock'"):
        state_tool_definition("bedrock")


def _called_tool_names(kind: GatewayType, body: dict[str, Any]) -> list[str]:
    names: list[str] = []
    if kind is GatewayType.openai_chat:
        for item in body["messages"]:
            names += [c["function"]["name"] for c in item.get("tool_calls") or ()]
    elif kind is GatewayType.openai_responses:
        names += [i["name"] for i in body["input"] if i.get("type") == "function_call"]
    elif kind is GatewayType.anthropic:
        for item in body["messages"]:
            content = item["content"]
            if isinstance(content, list):
                names += [b["name"] for b in content if b.get("type") == "tool_use"]
    else:
        for item in body["contents"]:
            names += [p["functionCall"]["name"] for p in item["parts"] if "functionCall" in p]
    return names


@pytest.mark.parametrize("kind", list(GatewayType))
async def test_a_state_carrying_prefix_calls_only_the_declared_state_tool(
    kind: GatewayType,
) -> None:
    """Invariant: the one tool a state-only prefix calls is the one the declaration names."""
    async with Foundation(gateway=kind, behavior_rules="Answer briefly.") as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(
                context_id="c",
                turn_id="t1",
                input=(Message(role=Role.user, content="Hello"),),
            )
        )
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        gateway = get_gateway(kind)
        body = gateway.request_body(prefix.items)
        assert _called_tool_names(kind, body) == [STATE_TOOL_NAME]

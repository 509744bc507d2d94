"""A scripted OpenAI Agents SDK model: the way the SDK's own tests drive ``Runner.run``."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

from agents import ModelResponse, Usage
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputItem,
    ResponseOutputMessage,
    ResponseOutputText,
)

__all__ = ("ScriptedModel", "call", "say")


def say(text: str, item_id: str) -> ResponseOutputMessage:
    """An assistant message output item."""
    part = ResponseOutputText(type="output_text", text=text, annotations=[])
    return ResponseOutputMessage(
        id=item_id, type="message", role="assistant", status="completed", content=[part]
    )


def call(call_id: str, name: str, arguments: str) -> ResponseFunctionToolCall:
    """A function call output item."""
    return ResponseFunctionToolCall(
        id=f"fc_{call_id}",
        type="function_call",
        call_id=call_id,
        name=name,
        arguments=arguments,
        status="completed",
    )


class ScriptedModel(Model):
    """Answers each model call with the next scripted output; keeps every input it got."""

    def __init__(self, outputs: list[list[ResponseOutputItem]]) -> None:
        self.outputs = list(outputs)
        self.inputs: list[list[Any]] = []

    async def get_response(
        self, system_instructions: str | None, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        self.inputs.append(copy.deepcopy(input if isinstance(input, list) else [input]))
        return ModelResponse(output=self.outputs.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the tests run Runner.run, which calls get_response")

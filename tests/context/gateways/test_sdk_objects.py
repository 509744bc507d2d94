"""Provider SDK response objects handed to a gateway's ``parse`` as they are.

Hosts keep what the providers' Python SDKs return and hand it back:
Anthropic's ``{"role": "assistant", "content": response.content}``, Gemini's
``response.candidates[0].content``, OpenAI's ``completion.choices[0].message``
and a Responses ``response.output``. Each is a pydantic model (or a list or
dict holding them). Invariants: parsing the object gives exactly the message
its JSON data (``model_dump(mode="json", exclude_none=True)``) gives; the next
input rendered from it is valid for the provider's request types; bytes the
SDK keeps (Gemini's thought signature) go out as the REST API's base64; a
host's cyclic data holding an SDK object is refused with a typed error.
"""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types import Message as AnthropicMessage
from google.genai import types as genai_types
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from tests.context.gateways.test_sdk import _item_errors
from turnloom.context import (
    Message,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    complete_pairs,
    get_gateway,
)
from turnloom.errors import InvalidMessageError

_CHAT = ChatCompletion.model_validate(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-test",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "refusal": None,
                    "annotations": [],
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_bag", "arguments": '{"tag":"X1"}'},
                        }
                    ],
                },
            }
        ],
    }
)
_RESPONSE = Response.model_validate(
    {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": "gpt-test",
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "output": [
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "Look it up."}],
                "encrypted_content": "gAAAA",
            },
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "get_bag",
                "arguments": '{"tag":"X1"}',
                "status": "completed",
            },
        ],
    }
)
_ANTHROPIC = AnthropicMessage.model_validate(
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
        "content": [
            {"type": "thinking", "thinking": "Look it up.", "signature": "sig-1"},
            {"type": "text", "text": "Let me check.", "citations": None},
            {"type": "tool_use", "id": "call_1", "name": "get_bag", "input": {"tag": "X1"}},
        ],
    }
)
_GEMINI = genai_types.GenerateContentResponse(
    candidates=[
        genai_types.Candidate(
            content=genai_types.Content(
                role="model",
                parts=[
                    genai_types.Part(text="Let me check.", thought_signature=b"\x01\x02sig"),
                    genai_types.Part(
                        function_call=genai_types.FunctionCall(
                            id="call_1", name="get_bag", args={"tag": "X1"}
                        )
                    ),
                ],
            )
        )
    ]
)


def _as_json(value: Any) -> Any:
    if isinstance(value, list):
        return [_as_json(item) for item in value]
    if isinstance(value, dict):
        return {key: _as_json(item) for key, item in value.items()}
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_none=True)
    return value


# What each provider's host hands back, as its SDK returned it.
_OUTPUTS: dict[str, Any] = {
    "openai_chat": _CHAT.choices[0].message,
    "openai_responses": _RESPONSE.output,
    "anthropic": {"role": "assistant", "content": _ANTHROPIC.content},
    "gemini": _GEMINI.candidates[0].content if _GEMINI.candidates else None,
}
_RESULTS: dict[str, Any] = {
    "openai_chat": {"role": "tool", "tool_call_id": "call_1", "content": "Gate 4"},
    "openai_responses": {"type": "function_call_output", "call_id": "call_1", "output": "Gate 4"},
    "anthropic": {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "Gate 4"}],
    },
    "gemini": {
        "role": "user",
        "parts": [
            {"functionResponse": {"id": "call_1", "name": "get_bag", "response": {"r": "Gate 4"}}}
        ],
    },
}


def _parse(provider: str, output: Any) -> list[Message]:
    gateway = get_gateway(provider)
    if provider == "openai_responses":
        return gateway.parse_items(output)
    return [gateway.parse(output)]


@pytest.mark.parametrize("provider", list(_OUTPUTS))
def test_an_sdk_object_parses_as_its_json_data(provider: str) -> None:
    """The SDK's object and its JSON data give the very same messages."""
    output = _OUTPUTS[provider]
    assert _parse(provider, output) == _parse(provider, _as_json(output))


@pytest.mark.parametrize("provider", list(_OUTPUTS))
def test_the_next_input_from_an_sdk_object_is_valid_for_the_provider(provider: str) -> None:
    """The call the object holds, then its result, render to items the provider's request
    types accept, the call once, with its id and arguments (OpenAI Chat's assistant
    item exactly: the response's null fields and empty ``annotations`` left out)."""
    gateway = get_gateway(provider)
    messages = [
        Message(role=Role.user, content="Where is my bag?"),
        *_parse(provider, _OUTPUTS[provider]),
        gateway.parse(_RESULTS[provider]),
    ]
    [call] = [part for message in messages for part in message.parts if type(part) is ToolCallPart]
    assert (call.call_id, call.name, call.arguments) == ("call_1", "get_bag", '{"tag":"X1"}')
    items = [item for message in complete_pairs(messages) for item in gateway.render(message)]
    if provider == "openai_chat":
        assert items[1] == {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_bag", "arguments": '{"tag":"X1"}'},
                }
            ],
        }
    errors = {index: _item_errors(provider, item) for index, item in enumerate(items)}
    assert errors == {index: [] for index in range(len(items))}


def test_anthropics_content_blocks_parse_to_their_parts() -> None:
    """``{"role": "assistant", "content": response.content}`` (Anthropic's tool-use
    loop): the thinking block with its signature, the text and the tool use, in order."""
    [message] = _parse("anthropic", _OUTPUTS["anthropic"])
    assert message.role is Role.assistant
    assert message.parts == (
        ReasoningPart(text="Look it up.", signature="sig-1", gateway="anthropic"),
        TextPart(text="Let me check."),
        ToolCallPart(call_id="call_1", name="get_bag", arguments='{"tag":"X1"}'),
    )


def test_geminis_thought_signature_bytes_go_out_as_base64() -> None:
    """google-genai keeps a thought signature as bytes; parsed from the SDK's Content
    it renders as the REST API's base64 string, on the part that carried it."""
    gateway = get_gateway("gemini")
    [message] = _parse("gemini", _OUTPUTS["gemini"])
    [item] = gateway.render(message)
    assert item["parts"][0] == {"text": "Let me check.", "thought_signature": "AQJzaWc="}


def test_cyclic_host_data_holding_an_sdk_object_is_refused_with_a_typed_error() -> None:
    """A host's dict that contains itself and an SDK object ends in InvalidMessageError
    (its nesting is refused), never a hang or a RecursionError."""
    message: dict[str, Any] = {"role": "assistant", "content": list(_ANTHROPIC.content)}
    message["content"].append(message)
    with pytest.raises(InvalidMessageError):
        get_gateway("anthropic").parse(message)

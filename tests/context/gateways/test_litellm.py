"""A LiteLLM host's messages through the OpenAI Chat gateway, on the real litellm package.

A LiteLLM host keeps ``response.choices[0].message`` (a litellm ``Message``,
or its ``model_dump()``, ``.json()``, ``dict(...)``) and ``{"role": "tool",
...}`` results, and sends the list back through ``litellm.completion``, which
turns it into each provider's body. The replies here come from LiteLLM's own
offline code: ``ModelResponse`` over an OpenAI response's JSON,
``stream_chunk_builder`` over hand-made chunks, and its Anthropic and Gemini
transformations of a provider's reply (extended thinking and a tool call; thought
signatures and a tool call).
Invariants:

* every form of one reply renders to the same request item, with the reply's
  null fields, its empty ``annotations`` and its calls' stream ``index`` left
  out (no request message takes them), valid for the OpenAI SDK's request types;
* what LiteLLM needs back is kept: Anthropic's ``thinking_blocks`` (with their
  signatures, which Anthropic requires before a ``tool_use`` when thinking is
  on), ``reasoning_content``, ``provider_specific_fields``; LiteLLM's own
  Anthropic transformation of turnloom's next input puts the thinking blocks
  first in the assistant turn, its Gemini one signs the text and the call;
* a key only another role takes (``tool_calls``, ``tool_call_id``) holding a
  value is refused with a typed error, not lost;
* what turnloom hands back (bodies, ``build`` items, a history render) shares
  no container with what it keeps: LiteLLM's shapes nest lists and objects.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import litellm
import pytest
from litellm.llms.anthropic.chat.transformation import AnthropicConfig
from litellm.llms.vertex_ai.gemini.transformation import _gemini_convert_messages_with_history
from litellm.llms.vertex_ai.gemini.vertex_and_google_ai_studio_gemini import VertexGeminiConfig
from litellm.types.utils import (
    ChatCompletionMessageToolCall,
    Delta,
    Function,
    ModelResponse,
    ModelResponseStream,
    StreamingChoices,
)
from litellm.types.utils import Message as LiteLLMMessage
from openai.types.chat import ChatCompletionMessageParam

from tests.context.gateways._sdk_types import type_errors
from tests.runtime.test_returned_values import _vandalize
from turnloom.context import Message, Role, TextPart, ToolCallPart, get_gateway
from turnloom.errors import InvalidMessageError
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot

# litellm's types mark a TypedDict item ReadOnly; pydantic warns once when it first
# builds their schema (litellm's code, not ours).
pytestmark = pytest.mark.filterwarnings(
    "ignore:Item .* on TypedDict class .* is using the `ReadOnly` qualifier:UserWarning"
)

CHAT = get_gateway("openai_chat")

_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_bag", "arguments": '{"tag":"X1"}'},
}
_RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "Gate 4"}
_QUESTION = {"role": "user", "content": "Where is bag X1?"}


def _openai_reply() -> LiteLLMMessage:
    """What LiteLLM returns for an OpenAI Chat response (its JSON as the API sends it)."""
    response = ModelResponse(
        id="chatcmpl-1",
        object="chat.completion",
        created=1,
        model="gpt-4o",
        choices=[
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "refusal": None,
                    "annotations": [],
                    "audio": None,
                    "tool_calls": [_CALL],
                },
            }
        ],
        usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    )
    return response.choices[0].message  # type: ignore[no-any-return,union-attr]


def _anthropic_reply() -> LiteLLMMessage:
    """LiteLLM's own transformation of an Anthropic reply: thinking, redacted thinking,
    text and a tool call (LiteLLM gives the call ``index`` 3, its content block's)."""
    body = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
        "content": [
            {"type": "thinking", "thinking": "Look it up.", "signature": "sig-1"},
            {"type": "redacted_thinking", "data": "REDACTED"},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "call_1", "name": "get_bag", "input": {"tag": "X1"}},
        ],
    }
    return _reply(
        AnthropicConfig(), "claude-sonnet-4-5", "https://api.anthropic.com/v1/messages", body
    )


class _Log:
    """The little of LiteLLM's logging object its response transformations touch."""

    model_call_details: dict[str, Any] = {}  # noqa: RUF012
    optional_params: dict[str, Any] = {}  # noqa: RUF012
    litellm_params: dict[str, Any] = {}  # noqa: RUF012

    def post_call(self, *args: Any, **kwargs: Any) -> None:
        pass


def _gemini_reply() -> LiteLLMMessage:
    """LiteLLM's own transformation of a Gemini 3 reply: a signed text and a signed call
    (LiteLLM keeps the signatures in ``provider_specific_fields``)."""
    body = {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {"text": "Let me check.", "thoughtSignature": "c2lnLXRleHQ="},
                        {
                            "functionCall": {"name": "get_bag", "args": {"tag": "X1"}},
                            "thoughtSignature": "c2lnLWNhbGw=",
                        },
                    ],
                },
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 5, "totalTokenCount": 10},
        "modelVersion": "gemini-3-pro-preview",
    }
    url = "https://generativelanguage.googleapis.com/v1beta/models/gemini-3-pro-preview"
    return _reply(VertexGeminiConfig(), "gemini-3-pro-preview", url, body)


def _reply(config: Any, model: str, url: str, body: dict[str, Any]) -> LiteLLMMessage:
    """The message of LiteLLM's ``config.transform_response`` of the provider's ``body``."""
    response = config.transform_response(
        model=model,
        raw_response=httpx.Response(200, json=body, request=httpx.Request("POST", url)),
        model_response=ModelResponse(),
        logging_obj=_Log(),
        request_data={},
        messages=[_QUESTION],
        optional_params={},
        litellm_params={},
        encoding=None,
        api_key="key",
        json_mode=False,
    )
    return response.choices[0].message  # type: ignore[no-any-return]


_THINKING = [
    {"type": "thinking", "thinking": "Look it up.", "signature": "sig-1"},
    {"type": "redacted_thinking", "data": "REDACTED"},
]


def _forms(message: LiteLLMMessage) -> dict[str, Any]:
    """Every form a LiteLLM host keeps a reply in (``dict(...)`` holds pydantic tool calls)."""
    return {
        "object": message,
        "model_dump": message.model_dump(),
        "json": message.json(),
        "dict": dict(message),
        "to_dict": message.to_dict(),
    }


def test_litellm_builds_the_replies_these_tests_take() -> None:
    """The shapes under test, as this litellm version builds them."""
    assert _openai_reply().model_dump() == {
        "content": None,
        "role": "assistant",
        "refusal": None,
        "tool_calls": [
            {"function": {"arguments": '{"tag":"X1"}', "name": "get_bag"}, "id": "call_1"}
            | {"type": "function"}
        ],
        "function_call": None,
        "provider_specific_fields": None,
        "annotations": [],
    }
    reply = _anthropic_reply().model_dump()
    assert reply["tool_calls"][0]["index"] == 3
    assert (reply["thinking_blocks"], reply["reasoning_content"]) == (_THINKING, "Look it up.")


@pytest.mark.parametrize("form", ["object", "model_dump", "json", "dict", "to_dict"])
def test_every_form_of_an_openai_reply_renders_the_request_item(form: str) -> None:
    """Invariant: a reply's null fields and empty ``annotations`` never reach the request;
    the item is valid for the OpenAI SDK's request types (the object leaves ``content``
    out as its ``model_dump(exclude_none=True)`` does; the dumps keep it null)."""
    message = CHAT.parse(_forms(_openai_reply())[form])
    assert message.extras is None
    [item] = CHAT.render(message)
    expected: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [_CALL]}
    if form == "object":
        del expected["content"]
    assert item == expected
    assert type_errors(item, ChatCompletionMessageParam) == []


def test_a_streamed_reply_built_by_litellm_renders_its_calls_in_order() -> None:
    """Invariant: ``stream_chunk_builder`` over a two-call stream gives both calls,
    in stream order, each as the request's ``{"id", "type", "function"}``."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> ModelResponseStream:
        choice = StreamingChoices(index=0, delta=Delta(**delta), finish_reason=finish)
        return ModelResponseStream(id="chatcmpl-1", created=1, model="gpt-4o", choices=[choice])

    first = {"index": 0, "id": "call_1", "type": "function"}
    chunks = [
        chunk({"role": "assistant", "content": None}),
        chunk({"tool_calls": [first | {"function": {"name": "get_bag", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"tag":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"X1"}'}}]}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get_gate", "arguments": "{}"},
                    }
                ]
            }
        ),
        chunk({}, finish="tool_calls"),
    ]
    built = litellm.stream_chunk_builder(chunks, messages=[_QUESTION])
    reply = built.choices[0].message  # type: ignore[union-attr]
    second = {
        "id": "call_2",
        "type": "function",
        "function": {"name": "get_gate", "arguments": "{}"},
    }
    assert CHAT.render(CHAT.parse(reply)) == [{"role": "assistant", "tool_calls": [_CALL, second]}]
    assert CHAT.render(CHAT.parse(reply.model_dump())) == [
        {"role": "assistant", "content": None, "tool_calls": [_CALL, second]}
    ]


def test_an_anthropic_reply_through_litellm_keeps_what_litellm_needs_back() -> None:
    """Invariant: the call's stream ``index`` is left out; ``reasoning_content``,
    ``thinking_blocks`` and ``provider_specific_fields`` are kept as LiteLLM gave them,
    in every form of the reply."""
    expected = {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_bag", "arguments": '{"tag": "X1"}'},
            }
        ],
        "reasoning_content": "Look it up.",
        "thinking_blocks": _THINKING,
        "provider_specific_fields": {"citations": None, "thinking_blocks": _THINKING},
    }
    for form, value in _forms(_anthropic_reply()).items():
        [item] = CHAT.render(CHAT.parse(value))
        if form == "to_dict":  # litellm's to_dict leaves provider_specific_fields out
            item["provider_specific_fields"] = expected["provider_specific_fields"]
        assert (form, item) == (form, expected)


def test_litellms_anthropic_transformation_of_the_next_input_replays_the_thinking() -> None:
    """Invariant: turnloom's next input, turned into an Anthropic body by LiteLLM itself,
    holds the thinking blocks (signed) before the text and ``tool_use``, then the result:
    the turn Anthropic requires when thinking is on, valid for turnloom's Anthropic rules."""
    messages = [CHAT.parse(_QUESTION), CHAT.parse(_anthropic_reply()), CHAT.parse(_RESULT)]
    items = CHAT.request_body([i for m in messages for i in CHAT.render(m)])["messages"]
    body = AnthropicConfig().transform_request(
        model="claude-sonnet-4-5",
        messages=items,
        optional_params={"thinking": {"type": "enabled", "budget_tokens": 1024}},
        litellm_params={},
        headers={},
    )
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Where is bag X1?"}]},
        {
            "role": "assistant",
            "content": [
                *_THINKING,
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "call_1", "name": "get_bag", "input": {"tag": "X1"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "Gate 4"}],
        },
    ]
    assert get_gateway("anthropic").validate(body["messages"]) == []


def test_litellms_gemini_transformation_of_the_next_input_replays_the_signatures() -> None:
    """Invariant: the thought signatures LiteLLM keeps in ``provider_specific_fields`` (the
    reply's, and the call's own) come back, so LiteLLM's Gemini conversion of turnloom's
    next input signs the text and the call as Gemini sent them."""
    reply = _gemini_reply()
    call_id = reply.tool_calls[0].id  # type: ignore[index]
    result = {"role": "tool", "tool_call_id": call_id, "content": "Gate 4"}
    messages = [CHAT.parse(_QUESTION), CHAT.parse(reply), CHAT.parse(result)]
    items = CHAT.request_body([i for m in messages for i in CHAT.render(m)])["messages"]
    assert items[1]["provider_specific_fields"] == {
        "thought_signatures": ["c2lnLXRleHQ=", "c2lnLWNhbGw="]
    }
    assert _gemini_convert_messages_with_history(messages=items) == [
        {"role": "user", "parts": [{"text": "Where is bag X1?"}]},
        {
            "role": "model",
            "parts": [
                {"text": "Let me check.", "thoughtSignature": "c2lnLXRleHQ="},
                {
                    "function_call": {"name": "get_bag", "args": {"tag": "X1"}},
                    "thoughtSignature": "c2lnLWNhbGw=",
                },
            ],
        },
        {
            "role": "user",
            "parts": [
                {"function_response": {"name": "get_bag", "response": {"content": "Gate 4"}}}
            ],
        },
    ]


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"role": "user", "content": "Hi", "tool_calls": [_CALL]}, "tool_calls"),
        (
            {"role": "tool", "tool_call_id": "call_1", "content": "x", "tool_calls": [_CALL]},
            "tool_calls",
        ),
        ({"role": "system", "content": "Be brief.", "tool_call_id": "call_1"}, "tool_call_id"),
        ({"role": "assistant", "content": "Hi", "tool_call_id": "call_1"}, "tool_call_id"),
    ],
)
def test_a_key_only_another_role_takes_is_refused_not_lost(
    item: dict[str, Any], field: str
) -> None:
    """Invariant: ``tool_calls`` off an assistant message or ``tool_call_id`` off a tool
    message, holding a value, is an InvalidMessageError naming it (it was dropped)."""
    before = json.dumps(item)
    with pytest.raises(InvalidMessageError) as info:
        CHAT.parse(item)
    assert (type(info.value), info.value.field) == (InvalidMessageError, field)
    assert json.dumps(item) == before


def test_a_litellm_user_message_with_null_tool_fields_parses() -> None:
    """Invariant: null (or an empty list) says nothing, so LiteLLM's user ``Message`` dump
    parses to the plain user message."""
    dumped = LiteLLMMessage(role="user", content="Hi").model_dump()
    assert dumped["tool_calls"] is None
    assert CHAT.parse(dumped) == Message(role=Role.user, content=(TextPart(text="Hi"),))
    empty = {"role": "user", "content": "Hi", "tool_calls": [], "tool_call_id": None}
    assert CHAT.parse(empty) == Message(role=Role.user, content=(TextPart(text="Hi"),))


def test_a_non_integer_index_is_kept() -> None:
    """Invariant: only a stream position (an int) is what ``index`` is dropped as; any
    other value is a host's own field and goes back verbatim."""
    call = ChatCompletionMessageToolCall(id="call_1", function=Function(name="f", arguments="{}"))
    item = {"role": "assistant", "tool_calls": [call.model_dump() | {"index": "first"}]}
    [part] = CHAT.parse(item).parts
    assert type(part) is ToolCallPart
    assert part.extras == {"index": "first"}


@pytest.mark.anyio
async def test_a_litellm_hosts_loop_through_a_foundation_keeps_and_hands_out_copies() -> None:
    """Invariant: a LiteLLM reply recorded as the object and its result as a dict give
    the next body exactly (thinking kept, ``index`` left out); editing every container
    of that body, of ``build``'s items and of a history render changes no later body."""
    async with Foundation(gateway="openai_chat") as foundation:
        manager = foundation.manager
        question = CHAT.parse(_QUESTION)
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(question,)))
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        outputs = [CHAT.parse(_anthropic_reply()), CHAT.parse(_RESULT)]
        async with manager.invocation("c", "t1") as invocation:
            invocation.record(outputs[:1])
        manager.record("c", "t1", outputs[1:])
        body = manager.request_body(prefix, recorded=True)
        assert body["messages"][1]["thinking_blocks"] == _THINKING
        assert body["messages"][1]["tool_calls"][0] == {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_bag", "arguments": '{"tag": "X1"}'},
        }
        expected = json.dumps(body)
        for item in (*body["messages"], *manager.build(prefix, outputs), *prefix.items):
            _vandalize(item)
        manager.accept_turn(
            TurnSnapshot(
                context_id="c",
                turn_id="t2",
                input=(CHAT.parse({"role": "user", "content": "Thanks"}),),
            )
        )
        for item in manager.history("c").render(CHAT, "t2").items:
            _vandalize(item)
        assert json.dumps(manager.request_body(prefix, recorded=True)) == expected
        later = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        assert (
            json.loads(json.dumps(manager.request_body(later)))["messages"][:3]
            == (json.loads(expected)["messages"])
        )

"""The six small inputs of issue 4 that broke other libraries, each with its right value.

Inputs 1, 3 and 5 are about history; they are checked at the neutral level
with ``hold_until_answered`` / ``complete_pairs`` and then rendered and
validated for every gateway (the runtime's TurnHistory calls the same
helpers before rendering).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.context.gateways._support import ITEM_FIELD, PROVIDERS, rendered
from turnloom.context import (
    Context,
    GatewayType,
    Message,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    check_message,
    complete_pairs,
    get_gateway,
    hold_until_answered,
)
from turnloom.errors import InvalidTextError


def _call(call_id: str, name: str = "lookup", args: str = '{"q":1}') -> Message:
    return Message(
        role=Role.assistant, content=(ToolCallPart(call_id=call_id, name=name, arguments=args),)
    )


def _result(call_id: str, text: str, name: str = "lookup") -> Message:
    return Message(
        role=Role.tool,
        content=(ToolResultPart(call_id=call_id, name=name, content=(TextPart(text=text),)),),
    )


def _body(provider: str, messages: list[Message]) -> list[dict[str, Any]]:
    gateway = get_gateway(provider)
    body = gateway.request_body(rendered(gateway, messages))
    items = body[ITEM_FIELD[provider]]
    assert gateway.validate(items) == []
    return list(items)


# 1 -------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_cut_history_does_not_start_with_an_orphan_result(provider: str) -> None:
    """[user, assistant+c1, result c1, assistant] cut to its last 2 starts with the assistant."""
    answer = Message(role=Role.assistant, content="Your flight is booked.")
    history = [
        Message(role=Role.user, content="Book it."),
        _call("c1"),
        _result("c1", "ok"),
        answer,
    ]
    completed = complete_pairs(history[-2:])
    assert completed == [answer]
    first = _body(provider, completed)[0]
    expected = {
        "openai_chat": {"role": "assistant", "content": "Your flight is booked."},
        "openai_responses": {"role": "assistant", "content": "Your flight is booked."},
        "anthropic": {
            "role": "assistant",
            "content": [{"type": "text", "text": "Your flight is booked."}],
        },
        "gemini": {"role": "model", "parts": [{"text": "Your flight is booked."}]},
    }
    assert first == expected[provider]


# 2 -------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_interrupted_blank_reply_renders_to_nothing(provider: str) -> None:
    """An assistant reply cut after "\\n\\n" yields no item, hence no empty text block."""
    gateway = get_gateway(provider)
    assert gateway.render(Message(role=Role.assistant, content="\n\n")) == []
    assert gateway.render(Message(role=Role.assistant, content=(TextPart(text="\n\n"),))) == []


def test_interrupted_blank_reply_leaves_no_adjacent_user_turns_for_anthropic() -> None:
    """[user, assistant "\\n\\n", user] becomes one user turn with both texts for Anthropic."""
    history = [
        Message(role=Role.user, content="Hi"),
        Message(role=Role.assistant, content="\n\n"),
        Message(role=Role.user, content="Are you there?"),
    ]
    completed = complete_pairs(history)
    assert [m.role for m in completed] == [Role.user, Role.user]
    assert _body("anthropic", completed) == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "Are you there?"}],
        }
    ]


def test_interrupted_reply_with_only_foreign_reasoning_merges_for_anthropic() -> None:
    """A reply that kept only another provider's reasoning also leaves one user turn."""
    history = [
        Message(role=Role.user, content="Hi"),
        Message(
            role=Role.assistant,
            content=(ReasoningPart(text="hm", id="rs_1", gateway="openai_responses"),),
        ),
        Message(role=Role.user, content="Hello?"),
    ]
    items = _body("anthropic", complete_pairs(history))
    assert [i["role"] for i in items] == ["user"]


# 3 -------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_notice_injected_while_call_open_goes_after_the_result(provider: str) -> None:
    """[user, call c1, notice, result c1] renders as call, result, then the notice."""
    user = Message(role=Role.user, content="Status?")
    call = _call("c1")
    notice = Message(role=Role.user, content="[notice] The user's session expires in 5 minutes.")
    result = _result("c1", "on time")
    arranged = complete_pairs(hold_until_answered([user, call, notice, result]))
    assert arranged == [user, call, result, notice]
    items = _body(provider, arranged)
    kinds = {
        "openai_chat": ["user", "assistant", "tool", "user"],
        "openai_responses": ["user", "function_call", "function_call_output", "user"],
        "anthropic": ["user", "assistant", "user"],
        "gemini": ["user", "model", "user", "user"],
    }[provider]
    assert [i.get("type", i.get("role")) for i in items] == kinds
    if provider == "anthropic":
        # The notice joins the result turn, after the tool_result block.
        assert [b["type"] for b in items[2]["content"]] == ["tool_result", "text"]


def test_notice_held_for_an_unanswered_call_follows_the_cancelled_result() -> None:
    """When c1 never returns, the notice still never sits between c1 and a result."""
    user = Message(role=Role.user, content="Status?")
    notice = Message(role=Role.system, content="Notice.")
    arranged = complete_pairs(hold_until_answered([user, _call("c1"), notice]), open_calls="cancel")
    assert [m.role for m in arranged] == [Role.user, Role.assistant, Role.tool, Role.system]
    assert arranged[2].tool_results[0].call_id == "c1"
    assert arranged[2].tool_results[0].is_error is True


# 4 -------------------------------------------------------------------------


def test_reverse_order_results_render_in_call_order_for_gemini() -> None:
    """Two parallel calls answered c2 then c1 render as one response turn: c1, c2."""
    calls = Message(
        role=Role.assistant,
        content=(
            ToolCallPart(call_id="c1", name="weather", arguments='{"city":"Paris"}'),
            ToolCallPart(call_id="c2", name="weather", arguments='{"city":"Rome"}'),
        ),
    )
    history = [
        Message(role=Role.user, content="Weather in Paris and Rome?"),
        calls,
        _result("c2", "sunny", name="weather"),
        _result("c1", "rain", name="weather"),
    ]
    items = _body("gemini", complete_pairs(history))
    assert items == [
        {"role": "user", "parts": [{"text": "Weather in Paris and Rome?"}]},
        {
            "role": "model",
            "parts": [
                {"functionCall": {"id": "c1", "name": "weather", "args": {"city": "Paris"}}},
                {"functionCall": {"id": "c2", "name": "weather", "args": {"city": "Rome"}}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "id": "c1",
                        "name": "weather",
                        "response": {"output": "rain"},
                    }
                },
                {
                    "functionResponse": {
                        "id": "c2",
                        "name": "weather",
                        "response": {"output": "sunny"},
                    }
                },
            ],
        },
    ]


# 5 -------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_reused_call_id_renders_each_result_next_to_its_own_call(provider: str) -> None:
    """c1 used in two turns: each result follows its own call (Anthropic renames the second)."""
    history = [
        Message(role=Role.user, content="Find my trip."),
        _call("c1", "lookup"),
        _result("c1", "trip A", "lookup"),
        Message(role=Role.user, content="Cancel it."),
        _call("c1", "cancel"),
        _result("c1", "cancelled", "cancel"),
    ]
    completed = complete_pairs(history)
    assert completed == history
    items = _body(provider, completed)
    if provider == "openai_chat":
        pairs = [
            (i["tool_calls"][0]["function"]["name"], items[n + 1]["content"])
            for n, i in enumerate(items)
            if i.get("tool_calls")
        ]
    elif provider == "openai_responses":
        pairs = [
            (i["name"], items[n + 1]["output"])
            for n, i in enumerate(items)
            if i.get("type") == "function_call"
        ]
    elif provider == "anthropic":
        pairs = []
        for n, i in enumerate(items):
            for block in i["content"]:
                if block["type"] == "tool_use":
                    answer = items[n + 1]["content"][0]
                    assert answer["tool_use_id"] == block["id"]
                    pairs.append((block["name"], answer["content"][0]["text"]))
        ids = [b["id"] for i in items for b in i["content"] if b["type"] == "tool_use"]
        assert ids == ["c1", "c1_r2"]
    else:
        pairs = []
        for n, i in enumerate(items):
            for part in i["parts"]:
                if "functionCall" in part:
                    answer = items[n + 1]["parts"][0]["functionResponse"]
                    pairs.append((part["functionCall"]["name"], answer["response"]["output"]))
    assert pairs == [("lookup", "trip A"), ("cancel", "cancelled")]


# 6 -------------------------------------------------------------------------

_SURROGATE = "bad \ud800 text"


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (Message(role=Role.user, content=_SURROGATE), "content"),
        (
            Message(
                role=Role.assistant,
                content=(ToolCallPart(call_id="c1", name="f", arguments='{"a":"\ud800"}'),),
            ),
            "content[0].arguments.a",
        ),
        (
            Message(
                role=Role.tool,
                content=(ToolResultPart(call_id="c1", content=(TextPart(text=_SURROGATE),)),),
            ),
            "content",
        ),
        (
            Message(
                role=Role.assistant, content=(ReasoningPart(text=_SURROGATE, gateway="anthropic"),)
            ),
            "content",
        ),
        (
            Message(role=Role.user, content="fine", extras={"refusal": _SURROGATE}),
            "extras.refusal",
        ),
    ],
)
def test_lone_surrogate_is_rejected_at_commit(message: Message, field: str) -> None:
    """A lone surrogate anywhere fails check_message (the commit door) with InvalidTextError."""
    with pytest.raises(InvalidTextError) as info:
        check_message(message, where="turn t1 input[0]")
    assert info.value.field == field
    assert str(info.value).startswith("turn t1 input[0]")
    assert "not valid UTF-8" in str(info.value)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_lone_surrogate_never_reaches_a_context(provider: str) -> None:
    """Context.emplace_message checks at the door: the error comes before any item is added."""
    context = Context(provider)
    context.emplace_message(Message(role=Role.user, content="first"))
    with pytest.raises(InvalidTextError):
        context.emplace_message(Message(role=Role.user, content=_SURROGATE))
    assert len(context) == 1


@pytest.mark.parametrize("kind", list(GatewayType))
def test_an_input_without_items_is_a_violation_on_every_gateway(kind: GatewayType) -> None:
    """Invariant: validate() accepts no request a provider rejects; every API refuses an
    empty item list (Anthropic and Gemini too when the instructions were lifted out)."""
    gateway = get_gateway(kind)
    [violation] = gateway.validate([])
    assert (violation.index, violation.rule) == (0, "empty_input")
    system = gateway.render(Message(role=Role.system, content="Be brief."))
    body = gateway.request_body(system)
    lifted = kind in (GatewayType.anthropic, GatewayType.gemini)
    assert [v.rule for v in gateway.validate(body[gateway.items_field])] == (
        ["empty_input"] if lifted else []
    )
    assert gateway.validate([], continues_response=True) == (
        [] if kind is GatewayType.openai_responses else [violation]
    )

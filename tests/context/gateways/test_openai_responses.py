"""The OpenAI Responses gateway: rendering, grouping of items, instructions and rules."""

from __future__ import annotations

from typing import Any

import pytest

from turnloom.context import (
    ImagePart,
    Message,
    OpaquePart,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    check_message,
    get_gateway,
)
from turnloom.errors import InvalidMessageError

gw = get_gateway("openai_responses")

_REASONING = ReasoningPart(
    text="plan", id="rs_1", encrypted_content="gAAAA-secret", gateway="openai_responses"
)


def test_reasoning_and_parallel_calls_render_as_consecutive_items() -> None:
    """Reasoning (encrypted_content verbatim) precedes its calls; calls keep their order."""
    message = Message(
        role=Role.assistant,
        content=(
            _REASONING,
            ToolCallPart(call_id="c1", name="f", arguments='{"a":1}'),
            ToolCallPart(call_id="c2", name="g", arguments="{}"),
        ),
    )
    assert gw.render(message) == [
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "plan"}],
            "encrypted_content": "gAAAA-secret",
        },
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a":1}'},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
    ]


def test_reasoning_without_an_item_that_may_follow_it_is_left_out() -> None:
    """Reasoning followed only by input-form text would be rejected, so it is not sent."""
    message = Message(role=Role.assistant, content=(_REASONING, TextPart(text="42")))
    assert gw.render(message) == [{"role": "assistant", "content": "42"}]


def test_output_message_keeps_its_reasoning() -> None:
    """An output message parsed with its id is re-emitted in output form after its reasoning."""
    items: list[dict[str, Any]] = [
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "encrypted_content": "gAAAA",
        },
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "42", "annotations": []}],
        },
    ]
    messages = gw.parse_items(items)
    assert len(messages) == 1
    assert messages[0].id == "msg_1"
    assert gw.render(messages[0]) == items
    assert gw.validate(items) == []


def test_parse_items_groups_calls_and_outputs() -> None:
    """Consecutive calls form one assistant message; consecutive outputs one tool message."""
    items = [
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c2", "output": "sun"},
        {"type": "function_call_output", "call_id": "c1", "output": "rain"},
    ]
    messages = gw.parse_items(items)
    assert messages == [
        Message(role=Role.user, content="weather?"),
        Message(
            role=Role.assistant,
            content=(
                ToolCallPart(call_id="c1", name="w", arguments="{}"),
                ToolCallPart(call_id="c2", name="w", arguments="{}"),
            ),
        ),
        Message(
            role=Role.tool,
            content=(
                ToolResultPart(call_id="c2", name="w", content=(TextPart(text="sun"),)),
                ToolResultPart(call_id="c1", name="w", content=(TextPart(text="rain"),)),
            ),
        ),
    ]
    assert [i for m in messages for i in gw.render(m)] == items


def test_instructions_round_trip_and_inline_system_stays_inline() -> None:
    """``instructions`` comes back as ``instructions``; a system message stays in input."""
    body = {"instructions": "Be brief.", "input": [{"role": "user", "content": "Hi"}]}
    messages = gw.parse_request(body)
    assert messages[0].role is Role.system
    items = [i for m in messages for i in gw.render(m)]
    assert items[0] == {"type": "instructions", "text": "Be brief."}
    assert gw.request_body(items) == body
    system = gw.render(Message(role=Role.system, content="Be brief."))
    assert gw.request_body(system) == {"input": [{"role": "system", "content": "Be brief."}]}


def test_results_render_as_function_call_outputs() -> None:
    """A result is ``output`` text, or a list of input parts when it holds an image."""
    message = Message(
        role=Role.tool,
        content=(
            ToolResultPart(call_id="c1", content=(TextPart(text="ok"),), is_error=True),
            ToolResultPart(
                call_id="c2",
                content=(TextPart(text="see"), ImagePart(data="AAAA", media_type="image/png")),
            ),
            ToolResultPart(call_id="c3"),
        ),
    )
    assert gw.render(message) == [
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [
                {"type": "input_text", "text": "see"},
                {
                    "type": "input_image",
                    "image_url": "data:image/png;base64,AAAA",
                    "detail": "auto",
                },
            ],
        },
        {"type": "function_call_output", "call_id": "c3", "output": ""},
    ]


def test_own_opaque_items_are_verbatim_and_follow_reasoning() -> None:
    """A server tool item is re-emitted verbatim and may follow reasoning."""
    search = {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {}}
    message = Message(
        role=Role.assistant,
        content=(_REASONING, OpaquePart(gateway="openai_responses", item=search)),
    )
    items = gw.render(message)
    assert [i["type"] for i in items] == ["reasoning", "web_search_call"]
    assert items[1] is search


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"role": "tool", "content": "x"}, "role"),
        ({"role": "user", "content": 1}, "content"),
        ({"type": "function_call", "name": "f"}, "call_id"),
        ({"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}, "arguments"),
        ({"type": "function_call_output", "call_id": "c", "output": 1}, "output"),
        ({"content": "x"}, "type"),
    ],
)
def test_malformed_items_raise_invalid_message_error(item: dict[str, Any], field: str) -> None:
    """Parsing a malformed item raises InvalidMessageError naming the field."""
    with pytest.raises(InvalidMessageError) as info:
        gw.parse(item)
    assert info.value.field == field


_USER = {"role": "user", "content": "q"}
_RS = {"type": "reasoning", "id": "rs_1", "summary": []}


def _call(call_id: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "f", "arguments": "{}"}


def _out(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "ok"}


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        ([_USER, _RS, _call("a"), _out("a")], []),
        ([_USER, _RS], [(1, "reasoning_without_following_item")]),
        (
            [_USER, _RS, {"role": "assistant", "content": "x"}],
            [(1, "reasoning_without_following_item")],
        ),
        ([_USER, _call("a"), _USER], [(1, "tool_call_without_result")]),
        ([_USER, _call("a")], [(1, "tool_call_without_result")]),
        ([_USER, _out("a")], [(1, "tool_result_without_call")]),
        ([_USER, _call("a"), _call("a"), _out("a")], [(2, "duplicate_call_id")]),
        (
            [_USER, _call("a"), _out("a"), _call("b"), _out("a")],
            [(3, "tool_call_without_result"), (4, "tool_result_without_call")],
        ),
        ([{"role": "user", "content": [{"type": "input_text", "text": " "}]}], [(0, "empty_text")]),
        ([{"role": "user", "content": []}], [(0, "empty_message")]),
        ([{"role": "bot", "content": "x"}], [(0, "unknown_role")]),
        (
            [_call("a"), _call("a"), _out("a"), _out("a")],
            [(1, "duplicate_call_id"), (3, "tool_result_without_call")],
        ),
    ],
)
def test_validate_reports_each_rule(
    items: list[dict[str, Any]], expected: list[tuple[int, str]]
) -> None:
    """Each structural rule is reported with the index of the offending item."""
    assert [(v.index, v.rule) for v in gw.validate(items)] == expected


def test_continued_response_may_start_with_outputs() -> None:
    """With previous_response_id/conversation, leading outputs answer server-held calls."""
    items = [_out("a"), _USER]
    assert [v.rule for v in gw.validate(items)] == ["tool_result_without_call"]
    assert gw.validate(items, continues_response=True) == []


def test_reasoning_of_other_providers_is_dropped() -> None:
    """Anthropic or Gemini reasoning cannot be verified by OpenAI and is left out."""
    message = Message(
        role=Role.assistant,
        content=(
            ReasoningPart(text="t", signature="s", gateway="anthropic"),
            ToolCallPart(call_id="c1", name="f"),
        ),
    )
    assert gw.render(message) == [
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    ]


def test_validate_flags_two_items_with_one_id() -> None:
    """Responses rejects an input holding two items with one id ("Duplicate item found")."""
    reply: dict[str, Any] = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Gate 4.", "annotations": []}],
    }
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "Where is my bag?"},
        reply,
        {"role": "user", "content": "Again?"},
        dict(reply),
    ]
    [violation] = gw.validate(items)
    assert (violation.index, violation.rule) == (3, "duplicate_item_id")
    assert "'msg_1'" in violation.message and "item 1" in violation.message


def test_request_body_leaves_out_an_item_replayed_with_its_reasoning() -> None:
    """An output replayed twice is sent once: the API rejects two items with one id."""
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"}
    reply = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Gate 4.", "annotations": []}],
    }
    question = {"role": "user", "content": "Where is my bag?"}
    body = gw.request_body([question, reasoning, reply, dict(reasoning), dict(reply)])
    assert body == {"input": [question, reasoning, reply]}
    assert gw.validate(body["input"]) == []


def test_request_body_of_an_instructions_item_without_text() -> None:
    """Was a KeyError: an instructions item without a text string carries nothing."""
    user = {"role": "user", "content": "hi"}
    items: list[dict[str, Any]] = [
        {"type": "instructions"},
        {"type": "instructions", "text": "Be brief."},
        user,
    ]
    assert gw.request_body(items) == {"instructions": "Be brief.", "input": [user]}
    assert [(v.index, v.rule) for v in gw.validate(items)] == [(0, "malformed_instructions")]


def test_the_unreasoned_hint_renders_an_output_message_in_input_form_without_its_id() -> None:
    """Invariant: an output message with the ``"unreasoned"`` hint (pruning dropped its
    response's reasoning) renders in input form, no id, type, status or blank text, while
    its Message.id stays; the door refuses a hint that is not a bool."""
    reply = {
        "type": "message",
        "role": "assistant",
        "id": "msg_1",
        "status": "completed",
        "content": [
            {"type": "output_text", "text": "", "annotations": []},
            {"type": "output_text", "text": "Answer.", "annotations": []},
        ],
    }
    message = gw.parse(reply)
    assert gw.render(message) == [reply]
    hinted = Message(
        role=Role.assistant,
        content=message.content,
        id="msg_1",
        layout={**(message.layout or {}), "unreasoned": True},
    )
    check_message(hinted)
    assert gw.render(hinted) == [{"role": "assistant", "content": "Answer."}]
    assert hinted.id == "msg_1"
    wrong = Message(
        role=Role.assistant,
        content=message.content,
        layout={"gateway": "openai_responses", "unreasoned": "yes"},
    )
    with pytest.raises(InvalidMessageError, match=r"layout\.unreasoned must be a bool"):
        check_message(wrong)

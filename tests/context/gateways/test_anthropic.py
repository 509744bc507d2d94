"""The Anthropic Messages gateway: rendering, parsing, request body and rules."""

from __future__ import annotations

import logging
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
    get_gateway,
)
from turnloom.context.gateways import AnthropicGateway
from turnloom.errors import InvalidMessageError, ProviderRuleError

gw = get_gateway("anthropic")


def _rules(items: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(v.index, v.rule) for v in gw.validate(items)]


def test_user_text_and_images_render_as_blocks() -> None:
    """User content is a list of text and image blocks (URL and base64 sources)."""
    message = Message(
        role=Role.user,
        content=(
            TextPart(text="Look"),
            ImagePart(url="https://x/a.png", detail="high"),
            ImagePart(data="AAAA", media_type="image/png"),
        ),
    )
    assert gw.render(message) == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look"},
                {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                },
            ],
        }
    ]


def test_assistant_keeps_thinking_signatures_and_parallel_calls_in_one_turn() -> None:
    """Thinking + redacted thinking keep signature/data; parallel calls share one item."""
    message = Message(
        role=Role.assistant,
        content=(
            ReasoningPart(text="plan", signature="sig1", gateway="anthropic"),
            ReasoningPart(encrypted_content="opaque", redacted=True, gateway="anthropic"),
            ReasoningPart(text="other", id="rs_1", gateway="openai_responses"),
            TextPart(text="Checking both."),
            ToolCallPart(call_id="t1", name="f", arguments='{"a": 1}'),
            ToolCallPart(call_id="t2", name="f", arguments=""),
        ),
    )
    assert gw.render(message) == [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "plan", "signature": "sig1"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Checking both."},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
                {"type": "tool_use", "id": "t2", "name": "f", "input": {}},
            ],
        }
    ]


def test_results_render_as_one_user_turn_results_first() -> None:
    """All results of a message form one user item, before any other block."""
    message = Message(
        role=Role.user,
        content=(
            TextPart(text="and also"),
            ToolResultPart(call_id="t1", content=(TextPart(text="ok"),)),
            ToolResultPart(
                call_id="t2",
                is_error=True,
                content=(TextPart(text="boom"), ImagePart(url="https://x/e.png")),
            ),
        ),
    )
    assert gw.render(message) == [
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "ok"}],
                    "is_error": False,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "t2",
                    "content": [
                        {"type": "text", "text": "boom"},
                        {"type": "image", "source": {"type": "url", "url": "https://x/e.png"}},
                    ],
                    "is_error": True,
                },
                {"type": "text", "text": "and also"},
            ],
        }
    ]


def test_system_lifted_to_top_level_and_later_system_stays_inline() -> None:
    """Leading system/developer items become ``system``; a later one stays in place."""
    items = [
        *gw.render(Message(role=Role.system, content="Be brief.")),
        *gw.render(Message(role=Role.developer, content="Use tools.")),
        *gw.render(Message(role=Role.user, content="Hi")),
        *gw.render(Message(role=Role.system, content="Notice.")),
    ]
    assert gw.request_body(items) == {
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "system", "content": [{"type": "text", "text": "Notice."}]},
        ],
    }


def test_string_system_round_trips_as_string() -> None:
    """A ``system`` string parses with string layout and comes back as a string."""
    body = {"system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]}
    messages = gw.parse_request(body)
    assert messages[0] == Message(
        role=Role.system, content="Be brief.", layout={"gateway": "anthropic", "content": "string"}
    )
    items = [i for m in messages for i in gw.render(m)]
    assert gw.request_body(items) == body


def test_request_body_merges_turns_and_renames_reused_ids() -> None:
    """Split result turns merge; a tool_use id reused later is renamed with its result."""
    items: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "go"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": []}]},
        {"role": "user", "content": [{"type": "text", "text": "again"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": []}]},
    ]
    body = gw.request_body(items)
    assert body["messages"] == [
        items[0],
        items[1],
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "a", "content": []},
                {"type": "text", "text": "again"},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "a_r2", "name": "f", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "a_r2", "content": []}],
        },
    ]
    assert gw.validate(body["messages"]) == []
    assert items[4]["content"][0]["id"] == "a"  # the input items are not modified


def test_no_merge_option_keeps_turns_apart() -> None:
    """merge_turns=False leaves adjacent same-role items as they are."""
    items = [
        {"role": "user", "content": [{"type": "text", "text": "a"}]},
        {"role": "user", "content": [{"type": "text", "text": "b"}]},
    ]
    assert AnthropicGateway(merge_turns=False).request_body(items) == {"messages": items}


def test_parse_response_body_keeps_reasoning_and_drops_response_fields() -> None:
    """A Messages response parses to an assistant message with its id and reasoning."""
    response = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 3, "output_tokens": 5},
        "content": [
            {"type": "thinking", "thinking": "hm", "signature": "s"},
            {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": [1, 2]}},
            {"type": "web_search_tool_result", "tool_use_id": "s1", "content": []},
        ],
    }
    assert gw.parse(response) == Message(
        role=Role.assistant,
        id="msg_1",
        content=(
            ReasoningPart(text="hm", signature="s", gateway="anthropic"),
            ToolCallPart(call_id="t1", name="f", arguments='{"x":[1,2]}'),
            OpaquePart(
                gateway="anthropic",
                item={"type": "web_search_tool_result", "tool_use_id": "s1", "content": []},
            ),
        ),
    )


def test_foreign_opaque_part_is_dropped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Another gateway's opaque part is left out and logged at WARNING."""
    message = Message(
        role=Role.user,
        content=(TextPart(text="hi"), OpaquePart(gateway="gemini", item={"type": "x"})),
    )
    with caplog.at_level(logging.WARNING, logger="turnloom.gateway.anthropic"):
        items = gw.render(message)
    assert items == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert [r.getMessage() for r in caplog.records] == [
        "Dropped a gemini-native 'x' part: the anthropic gateway cannot carry it."
    ]


def test_arguments_that_are_not_an_object_are_rejected() -> None:
    """Anthropic carries arguments as an object: other JSON is a ProviderRuleError."""
    message = Message(
        role=Role.assistant, content=(ToolCallPart(call_id="t1", name="f", arguments="[1]"),)
    )
    with pytest.raises(ProviderRuleError, match="'t1' are not a JSON object"):
        gw.render(message)


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"role": "tool", "content": "x"}, "role"),
        ({"role": "user", "content": 3}, "content"),
        ({"role": "assistant", "content": [{"type": "tool_use", "name": "f"}]}, "content[0].id"),
        (
            {"role": "user", "content": [{"type": "tool_result", "content": "x"}]},
            "content[0].tool_use_id",
        ),
        ({"role": "user", "content": ["text"]}, "content[0]"),
    ],
)
def test_malformed_items_raise_invalid_message_error(item: dict[str, Any], field: str) -> None:
    """Parsing a malformed item raises InvalidMessageError naming the field."""
    with pytest.raises(InvalidMessageError) as info:
        gw.parse(item)
    assert info.value.field == field


def test_parse_rejects_a_non_object() -> None:
    with pytest.raises(
        InvalidMessageError, match="must be a JSON object, not an object of type list"
    ):
        gw.parse([])  # type: ignore[arg-type]


def _use(*ids: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": i, "name": "f", "input": {}} for i in ids],
    }


def _res(*ids: str, text_first: bool = False) -> dict[str, Any]:
    blocks: list[Any] = [{"type": "tool_result", "tool_use_id": i, "content": "ok"} for i in ids]
    if text_first:
        blocks.insert(0, {"type": "text", "text": "hi"})
    return {"role": "user", "content": blocks}


_USER = {"role": "user", "content": [{"type": "text", "text": "q"}]}


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        ([_USER, _use("a", "b"), _res("a", "b")], []),
        ([_USER, _use("a", "b"), _res("a")], [(1, "tool_call_without_result")]),
        ([_USER, _use("a"), _USER], [(1, "tool_call_without_result")]),
        ([_USER, _use("a")], [(1, "tool_call_without_result")]),
        ([_USER, _res("a")], [(1, "tool_result_without_call")]),
        ([_USER, _use("a"), _res("a", text_first=True)], [(2, "tool_result_not_first")]),
        (
            [_USER, _use("a"), _res("a"), _use("a"), _res("a")],
            [(3, "duplicate_call_id")],
        ),
        ([{"role": "user", "content": "  "}], [(0, "empty_text")]),
        ([{"role": "user", "content": [{"type": "text", "text": ""}]}], [(0, "empty_text")]),
        ([{"role": "user", "content": []}], [(0, "empty_message")]),
        ([{"role": "bot", "content": "x"}], [(0, "unknown_role")]),
        (
            [{"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]}],
            [(0, "missing_call_id")],
        ),
        ([_USER, _USER], []),
    ],
)
def test_validate_reports_each_rule(
    items: list[dict[str, Any]], expected: list[tuple[int, str]]
) -> None:
    """Each structural rule is reported with the index of the offending item."""
    assert _rules(items) == expected


@pytest.mark.parametrize(
    ("call_id", "sent"),
    [
        ("functions.get_weather:0", "functions_get_weather_0"),
        ("call 1", "call_1"),
        ("Bash:12", "Bash_12"),
        ("é", "_"),
        ("a|b", "a_b"),
    ],
)
def test_a_call_id_outside_the_api_pattern_is_renamed_in_call_and_result(
    call_id: str, sent: str
) -> None:
    """Invariant: every tool_use id sent matches the API's ``^[a-zA-Z0-9_-]+$``.

    Another provider's id (``functions.get_weather:0``) is renamed by the one
    call-id rule, each refused character replaced by ``_``, in the call and the
    result that answers it; the request validates.
    """
    call = Message(
        role=Role.assistant,
        content=(ToolCallPart(call_id=call_id, name="f", arguments="{}"),),
    )
    result = Message(
        role=Role.tool, content=(ToolResultPart(call_id=call_id, content=(TextPart(text="r"),)),)
    )
    user = Message(role=Role.user, content="hi")
    items = [item for m in (user, call, result) for item in gw.render(m)]
    body = gw.request_body(items)
    assert body["messages"][1]["content"][0]["id"] == sent
    assert body["messages"][2]["content"][0]["tool_use_id"] == sent
    assert gw.validate(body["messages"]) == []
    for good in ("toolu_01A-b_9", "call_r2", "tlrs_0af3"):
        assert (
            gw.render(
                Message(role=Role.assistant, content=(ToolCallPart(call_id=good, name="f"),))
            )[0]["content"][0]["id"]
            == good
        )


def test_a_fixed_call_id_never_equals_an_id_already_sent() -> None:
    """``a.b`` becomes ``a_b``; a later call really named ``a_b`` is a reuse: ``a_b_r2``."""
    messages = []
    for call_id in ("a.b", "a_b"):
        messages.append(Message(role=Role.user, content="go"))
        messages.append(
            Message(role=Role.assistant, content=(ToolCallPart(call_id=call_id, name="f"),))
        )
        messages.append(
            Message(
                role=Role.tool,
                content=(ToolResultPart(call_id=call_id, content=(TextPart(text="ok"),)),),
            )
        )
    items = [item for m in messages for item in gw.render(m)]
    body = gw.request_body(items)
    ids = [
        block.get("id") or block.get("tool_use_id")
        for item in body["messages"]
        for block in (item["content"] if isinstance(item["content"], list) else [])
        if block.get("type") in ("tool_use", "tool_result")
    ]
    assert ids == ["a_b", "a_b", "a_b_r2", "a_b_r2"]
    assert gw.validate(body["messages"]) == []


def test_validate_flags_a_tool_use_id_outside_the_api_pattern() -> None:
    """validate() reports the id the API would reject, naming the item."""
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "fn.a:0", "name": "f", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "fn.a:0", "content": "r"}],
        },
    ]
    assert _rules(items) == [(1, "invalid_call_id")]

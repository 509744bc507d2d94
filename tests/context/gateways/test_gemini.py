"""The Gemini gateway: rendering, parsing, systemInstruction, response turns and rules."""

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
    complete_pairs,
    get_gateway,
)
from turnloom.context.gateways import GeminiGateway
from turnloom.errors import InvalidMessageError, ProviderRuleError

gw = get_gateway("gemini")


def test_model_turn_keeps_thoughts_and_signatures() -> None:
    """Thought parts keep their signature; a call's thoughtSignature survives parse/render."""
    native = {
        "role": "model",
        "parts": [
            {"text": "plan", "thought": True, "thoughtSignature": "c2ln"},
            {"functionCall": {"id": "c1", "name": "f", "args": {"a": 1}}, "thoughtSignature": "AA"},
            {"functionCall": {"id": "c2", "name": "f", "args": {}}},
        ],
    }
    message = gw.parse(native)
    assert message.parts == (
        ReasoningPart(text="plan", signature="c2ln", gateway="gemini"),
        ToolCallPart(
            call_id="c1", name="f", arguments='{"a":1}', extras={"thoughtSignature": "AA"}
        ),
        ToolCallPart(call_id="c2", name="f", arguments="{}"),
    )
    assert gw.render(message) == [native]


def test_other_providers_reasoning_is_dropped() -> None:
    """Reasoning produced by another provider never reaches Gemini."""
    message = Message(
        role=Role.assistant,
        content=(ReasoningPart(text="x", signature="s", gateway="anthropic"), TextPart(text="hi")),
    )
    assert gw.render(message) == [{"role": "model", "parts": [{"text": "hi"}]}]


def test_results_render_output_and_error_and_images() -> None:
    """Text results are ``{"output": ...}``, errors ``{"error": ...}``; images go in parts."""
    message = Message(
        role=Role.tool,
        content=(
            ToolResultPart(call_id="c1", name="f", content=(TextPart(text="ok"),)),
            ToolResultPart(call_id="c2", name="f", is_error=True, content=(TextPart(text="no"),)),
            ToolResultPart(
                call_id="c3",
                name="g",
                content=(ImagePart(data="AAAA", media_type="image/png"),),
            ),
        ),
    )
    assert gw.render(message) == [
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"id": "c1", "name": "f", "response": {"output": "ok"}}},
                {"functionResponse": {"id": "c2", "name": "f", "response": {"error": "no"}}},
                {
                    "functionResponse": {
                        "id": "c3",
                        "name": "g",
                        "response": {"output": ""},
                        "parts": [{"inlineData": {"mimeType": "image/png", "data": "AAAA"}}],
                    }
                },
            ],
        }
    ]


def test_structured_response_round_trips_as_json_text() -> None:
    """A response object other than output/error travels as its JSON text and comes back."""
    native = {
        "role": "user",
        "parts": [
            {"functionResponse": {"id": "c1", "name": "f", "response": {"return_value": [1, 2]}}}
        ],
    }
    message = gw.parse(native)
    assert message.tool_results[0].content == (TextPart(text='{"return_value": [1, 2]}'),)
    assert gw.render(message) == [native]


def test_all_system_messages_move_to_system_instruction() -> None:
    """System and developer messages, wherever they are, become systemInstruction parts."""
    items = [
        *gw.render(Message(role=Role.system, content="Be brief.")),
        *gw.render(Message(role=Role.user, content="Hi")),
        *gw.render(Message(role=Role.developer, content="Notice.")),
    ]
    assert gw.request_body(items) == {
        "systemInstruction": {
            "role": "user",
            "parts": [{"text": "Be brief."}, {"text": "Notice."}],
        },
        "contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
    }


def test_split_response_turns_merge_in_call_order_with_names_filled() -> None:
    """Separate result messages become one response turn, ordered as the calls, named."""
    calls = Message(
        role=Role.assistant,
        content=(
            ToolCallPart(call_id="a", name="first"),
            ToolCallPart(call_id="b", name="second"),
        ),
    )
    items = [
        *gw.render(Message(role=Role.user, content="go")),
        *gw.render(calls),
        *gw.render(Message(role=Role.tool, content=(ToolResultPart(call_id="b"),))),
        *gw.render(Message(role=Role.tool, content=(ToolResultPart(call_id="a"),))),
    ]
    contents = gw.request_body(items)["contents"]
    assert len(contents) == 3
    assert contents[2] == {
        "role": "user",
        "parts": [
            {"functionResponse": {"id": "a", "name": "first", "response": {"output": ""}}},
            {"functionResponse": {"id": "b", "name": "second", "response": {"output": ""}}},
        ],
    }
    assert gw.validate(contents) == []


def test_adjacent_model_turns_merge_so_calls_follow_the_user_turn() -> None:
    """A text reply then a call reply (two messages) become one model turn."""
    items = [
        *gw.render(Message(role=Role.user, content="go")),
        *gw.render(Message(role=Role.assistant, content="Let me check.")),
        *gw.render(Message(role=Role.assistant, content=(ToolCallPart(call_id="a", name="f"),))),
        *gw.render(Message(role=Role.tool, content=(ToolResultPart(call_id="a", name="f"),))),
    ]
    contents = gw.request_body(items)["contents"]
    assert contents[1] == {
        "role": "model",
        "parts": [
            {"text": "Let me check."},
            {"functionCall": {"id": "a", "name": "f", "args": {}}},
        ],
    }
    assert gw.validate(contents) == []


def test_model_output_without_ids_round_trips() -> None:
    """Calls without an id get ``name#position`` ids and are re-emitted without one."""
    native = {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}]}
    message = gw.parse(native)
    assert message.tool_calls[0].call_id == "f#0"
    assert gw.render(message) == [native]


def test_snake_case_contents_round_trip() -> None:
    """Vertex-style snake_case parts are re-emitted in snake_case."""
    native = {
        "role": "model",
        "parts": [
            {"function_call": {"id": "c1", "name": "f", "args": {}}, "thought_signature": "AA"}
        ],
    }
    assert gw.render(gw.parse(native)) == [native]


def test_arguments_that_are_not_an_object_are_rejected() -> None:
    message = Message(
        role=Role.assistant, content=(ToolCallPart(call_id="c", name="f", arguments="1"),)
    )
    with pytest.raises(ProviderRuleError, match="'c' are not a JSON object; Gemini"):
        gw.render(message)


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"role": "assistant", "parts": []}, "role"),
        ({"role": "user"}, "parts"),
        ({"role": "model", "parts": [{"functionCall": {"args": {}}}]}, "parts[0].name"),
        ({"role": "user", "parts": ["x"]}, "parts[0]"),
    ],
)
def test_malformed_contents_raise_invalid_message_error(item: dict[str, Any], field: str) -> None:
    """Parsing a malformed content raises InvalidMessageError naming the field."""
    with pytest.raises(InvalidMessageError) as info:
        gw.parse(item)
    assert info.value.field == field


def _model(*ids: str) -> dict[str, Any]:
    return {
        "role": "model",
        "parts": [{"functionCall": {"id": i, "name": "f", "args": {}}} for i in ids],
    }


def _resp(*ids: str, name: str = "f") -> dict[str, Any]:
    return {
        "role": "user",
        "parts": [{"functionResponse": {"id": i, "name": name, "response": {}}} for i in ids],
    }


_USER = {"role": "user", "parts": [{"text": "q"}]}


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        ([_USER, _model("a", "b"), _resp("a", "b")], []),
        ([_USER, _model("a", "b"), _resp("b", "a")], [(2, "function_response_order")]),
        ([_USER, _model("a", "b"), _resp("a")], [(1, "tool_call_without_result")]),
        ([_USER, _model("a"), _resp("a"), _resp("a")], [(3, "tool_result_without_call")]),
        ([_USER, _model("a"), _resp("a", "z")], [(2, "tool_result_without_call")]),
        ([_USER, _model("a")], [(1, "tool_call_without_result")]),
        ([_USER, _model("a"), _USER], [(1, "tool_call_without_result")]),
        ([_USER, _model("a", "a"), _resp("a", "a")], [(1, "duplicate_call_id")]),
        ([_USER, _model("a"), _resp("a", name="")], [(2, "missing_name")]),
        ([{"role": "user", "parts": [{"text": " "}]}], [(0, "empty_text")]),
        ([{"role": "user", "parts": [{"text": "a"}, {"text": ""}]}], [(0, "empty_text")]),
        ([{"role": "user", "parts": [{"text": ""}]}], []),
        ([{"role": "user", "parts": []}], [(0, "empty_message")]),
        ([{"role": "assistant", "parts": [{"text": "x"}]}], [(0, "unknown_role")]),
        ([_USER, _USER], []),
        ([_model("a"), _resp("a")], [(0, "function_call_turn_position")]),
        (
            [_USER, {"role": "model", "parts": [{"text": "x"}]}, _model("a"), _resp("a")],
            [(2, "function_call_turn_position")],
        ),
    ],
)
def test_validate_reports_each_rule(
    items: list[dict[str, Any]], expected: list[tuple[int, str]]
) -> None:
    """Each structural rule is reported with the index of the offending content."""
    assert [(v.index, v.rule) for v in gw.validate(items)] == expected


def test_leading_call_turn_is_left_out_with_one_warning_per_gateway(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A call turn with no user turn before it (rejected by Gemini) is left out of every body.

    Logged as a warning the first time a gateway instance leaves one out, then
    at DEBUG: the same history leaves the same turn out on every model call.
    """
    audio = OpaquePart(gateway="openai_chat", item={"type": "input_audio"})
    gateway = GeminiGateway()
    items = [
        *gateway.render(Message(role=Role.user, content=(audio,))),
        *gateway.render(
            Message(role=Role.assistant, content=(ToolCallPart(call_id="a", name="f"),))
        ),
        *gateway.render(Message(role=Role.tool, content=(ToolResultPart(call_id="a", name="f"),))),
        *gateway.render(Message(role=Role.user, content="next")),
    ]
    expected = {"contents": [{"role": "user", "parts": [{"text": "next"}]}]}
    with caplog.at_level(logging.DEBUG, logger="turnloom.gateway.gemini"):
        bodies = [gateway.request_body(items) for _ in range(3)]
        other = GeminiGateway().request_body(items)
    assert bodies == [expected] * 3 and other == expected
    left_out = [r for r in caplog.records if r.getMessage().startswith("Left out a leading")]
    assert [r.levelname for r in left_out] == ["WARNING", "DEBUG", "DEBUG", "WARNING"]
    assert left_out[0].getMessage() == (
        "Left out a leading model turn with function calls (and its responses): Gemini needs "
        "a user turn before it. Later ones are logged at DEBUG."
    )


def test_two_responses_with_one_id_one_json_one_plain_re_render_exactly() -> None:
    """Was a JSONDecodeError: the json_results hint names the id both responses share."""
    native = {
        "role": "user",
        "parts": [
            {"functionResponse": {"id": "x", "name": "f", "response": {"a": 1}}},
            {"functionResponse": {"id": "x", "name": "f", "response": {"output": "plain"}}},
        ],
    }
    assert gw.render(gw.parse(native)) == [native]


def test_request_body_passes_a_non_object_function_response_and_validate_flags_it() -> None:
    """Was an AttributeError: a functionResponse that is not an object is not ordered."""
    items: list[dict[str, Any]] = [
        _USER,
        {"role": "model", "parts": [{"functionCall": {"id": "x", "name": "f", "args": {}}}]},
        {"role": "user", "parts": [{"functionResponse": "plain"}]},
    ]
    assert gw.parse(items[2]).parts == (
        OpaquePart(gateway="gemini", item={"functionResponse": "plain"}),
    )
    body = gw.request_body(items)
    assert body == {"contents": items}
    assert [(v.index, v.rule) for v in gw.validate(body["contents"])] == [
        (1, "tool_call_without_result"),
        (2, "malformed_function_response"),
    ]


# -- thought signatures -------------------------------------------------------------

_SIGNED_STEP = {
    "role": "model",
    "parts": [
        {"functionCall": {"id": "a", "name": "f", "args": {}}, "thoughtSignature": "U0lHX0E="},
        {"functionCall": {"id": "b", "name": "f", "args": {}}},
    ],
}


def _response(*ids: str) -> dict[str, Any]:
    return {
        "role": "user",
        "parts": [
            {"functionResponse": {"id": i, "name": "f", "response": {"output": i}}} for i in ids
        ],
    }


def test_an_excluded_signed_first_call_passes_its_signature_to_the_first_kept_call() -> None:
    """Invariant: a step never goes out unsigned because its first call had no result."""
    step = gw.parse(_SIGNED_STEP)
    completed = complete_pairs(
        [Message(role=Role.user, content="go"), step, gw.parse(_response("b"))]
    )
    items = [i for m in completed for i in gw.render(m)]
    assert items[1] == {
        "role": "model",
        "parts": [
            {"functionCall": {"id": "b", "name": "f", "args": {}}, "thoughtSignature": "U0lHX0E="}
        ],
    }
    assert gw.validate(gw.request_body(items)["contents"]) == []


def test_a_signature_on_an_empty_text_part_is_kept_and_not_flagged() -> None:
    """The SDK's {"text": "", "thoughtSignature": ...} output re-renders exactly, validly."""
    native = {
        "role": "model",
        "parts": [
            {"functionCall": {"id": "a", "name": "f", "args": {}}, "thoughtSignature": "U0lHX0E="},
            {"text": "", "thoughtSignature": "U0lHX0I="},
        ],
    }
    only = {"role": "model", "parts": [{"text": "", "thoughtSignature": "U0lHX0I="}]}
    assert gw.render(gw.parse(native)) == [native]
    assert gw.render(gw.parse(only)) == [only]
    items: list[dict[str, Any]] = [_USER, native, _response("a"), only]
    assert gw.validate(items) == []


def test_a_recorded_model_content_of_one_empty_text_re_renders_exactly() -> None:
    """The API accepts [{"text": ""}] from the model; keep_blank re-emits it."""
    native = {"role": "model", "parts": [{"text": ""}]}
    message = gw.parse(native)
    assert message.layout == {"gateway": "gemini", "keep_blank": True}
    assert gw.render(message) == [native]


def test_an_injected_call_gets_the_documented_placeholder_signature() -> None:
    """Google's placeholder for calls the model did not produce, base64 as JSON bytes."""
    injected = Message(
        role=Role.assistant,
        content=(ToolCallPart(call_id="s1", name="state"),),
        layout={"gateway": "gemini", "injected": True},
    )
    assert gw.render(injected) == [
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {"id": "s1", "name": "state", "args": {}},
                    "thoughtSignature": "c2tpcF90aG91Z2h0X3NpZ25hdHVyZV92YWxpZGF0b3I=",
                }
            ],
        }
    ]
    # The official SDK reads the JSON value as the documented dummy's bytes.
    from google.genai import types

    content = types.Content.model_validate(gw.render(injected)[0])
    assert content.parts is not None
    assert content.parts[0].thought_signature == b"skip_thought_signature_validator"
    # Other gateways ignore the Gemini hint.
    assert get_gateway("openai_chat").render(injected)[0]["tool_calls"][0] == {
        "id": "s1",
        "type": "function",
        "function": {"name": "state", "arguments": "{}"},
    }


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        # A signed call earlier; the current turn's step is unsigned.
        (
            [
                _USER,
                _SIGNED_STEP,
                _response("a", "b"),
                {
                    "role": "model",
                    "parts": [{"functionCall": {"id": "c", "name": "f", "args": {}}}],
                },
                _response("c"),
            ],
            [(3, "missing_thought_signature")],
        ),
        # The unsigned step is in an earlier turn: not flagged.
        (
            [
                _USER,
                {
                    "role": "model",
                    "parts": [{"functionCall": {"id": "c", "name": "f", "args": {}}}],
                },
                _response("c"),
                _USER,
                _SIGNED_STEP,
                _response("a", "b"),
            ],
            [],
        ),
        # Only thought text is signed (Gemini 2.5): calls are not validated.
        (
            [
                _USER,
                {
                    "role": "model",
                    "parts": [
                        {"text": "t", "thought": True, "thoughtSignature": "U0lH"},
                        {"functionCall": {"id": "c", "name": "f", "args": {}}},
                    ],
                },
                _response("c"),
            ],
            [],
        ),
    ],
)
def test_validate_flags_an_unsigned_current_turn_step(
    items: list[dict[str, Any]], expected: list[tuple[int, str]]
) -> None:
    assert [(v.index, v.rule) for v in gw.validate(items)] == expected

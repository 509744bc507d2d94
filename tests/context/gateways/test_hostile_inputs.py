"""Hostile inputs: malformed native items, and neutral messages at the edges of the rules.

Invariants protected here:

* ``parse()`` / ``parse_request()`` on a malformed native item raise a typed
  turnloom error naming the field, never ``KeyError``/``TypeError``/
  ``AttributeError``, and what they return passes ``check_message`` (the door).
* ``validate()`` on malformed native input reports violations and never raises.
* a gateway never emits an input that its own ``validate()`` rejects, also for
  model output parsed by the gateway and answered by the host.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.context.gateways._support import ITEM_FIELD, rendered
from turnloom.context import (
    ImagePart,
    Message,
    ReasoningPart,
    Role,
    TextPart,
    ToolResultPart,
    check_message,
    complete_pairs,
    get_gateway,
)
from turnloom.errors import DuplicateIdError, InvalidMessageError, InvalidTextError

# -- parse: malformed native items --------------------------------------------


@pytest.mark.parametrize(
    ("provider", "item", "field"),
    [
        ("openai_chat", {"role": ["user"], "content": "x"}, "role"),
        ("openai_responses", {"role": {"r": 1}, "content": "x"}, "role"),
        ("anthropic", {"role": ["user"], "content": "x"}, "role"),
        ("gemini", {"role": ["user"], "parts": [{"text": "x"}]}, "role"),
        (
            "openai_responses",
            {"type": "reasoning", "id": "rs_1", "summary": ["x"]},
            "summary[0]",
        ),
        (
            "anthropic",
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": [1]}],
            },
            "content[0].input",
        ),
        (
            "anthropic",
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"a": {1}}}],
            },
            "content[0].input.a",
        ),
        (
            "gemini",
            {"role": "model", "parts": [{"functionCall": {"name": "f", "args": "x"}}]},
            "parts[0].functionCall.args",
        ),
        (
            "gemini",
            {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {"a": {1}}}}]},
            "parts[0].functionCall.args.a",
        ),
        (
            "gemini",
            {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {1, 2}}}]},
            "parts[0].functionResponse.response",
        ),
        (
            "anthropic",
            {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": {}}}]},
            "content[0].url",
        ),
        (
            "openai_chat",
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": 5}}]},
            "content[0].url",
        ),
        (
            "openai_chat",
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": "data:;base64,AA"}}],
            },
            "content[0].url",  # a data URL without a media type stays a URL, refused
        ),
        (
            "openai_responses",
            {"role": "user", "content": [{"type": "input_image", "image_url": "data:;base64,AA"}]},
            "content[0].url",
        ),
        (
            "anthropic",
            {
                "role": "user",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
            },
            "content[0]",
        ),
        (
            "gemini",
            {"role": "model", "parts": [{"functionResponse": {"name": "f", "response": {}}}]},
            "content[0]",  # found by check_message, which names the neutral field
        ),
    ],
)
def test_malformed_native_item_raises_invalid_message_error_naming_the_field(
    provider: str, item: dict[str, Any], field: str
) -> None:
    """Invariant: parse() raises InvalidMessageError with ``field`` set, never a foreign error."""
    with pytest.raises(InvalidMessageError) as info:
        get_gateway(provider).parse(item)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("provider", "item"),
    [
        ("openai_chat", {"role": "user", "content": "bad \ud800"}),
        ("openai_responses", {"role": "user", "content": "bad \ud800"}),
        ("anthropic", {"role": "user", "content": [{"type": "text", "text": "bad \ud800"}]}),
        ("gemini", {"role": "user", "parts": [{"text": "bad \ud800"}]}),
    ],
)
def test_lone_surrogate_in_a_native_item_is_rejected_by_parse(
    provider: str, item: dict[str, Any]
) -> None:
    """Invariant: parse() never returns a message the commit door would reject."""
    with pytest.raises(InvalidTextError) as info:
        get_gateway(provider).parse(item)
    assert info.value.field == "content"


@pytest.mark.parametrize(
    ("provider", "body", "field"),
    [
        ("openai_chat", {"messages": [{"role": {}, "content": "x"}]}, "role"),
        ("anthropic", {"system": 5, "messages": []}, "content"),
        ("gemini", {"systemInstruction": {"parts": "x"}, "contents": []}, "parts"),
        ("openai_responses", {"input": [{"type": "reasoning", "summary": [1]}]}, "summary[0]"),
    ],
)
def test_malformed_request_body_raises_invalid_message_error(
    provider: str, body: dict[str, Any], field: str
) -> None:
    """Invariant: parse_request() raises InvalidMessageError naming the field."""
    with pytest.raises(InvalidMessageError) as info:
        get_gateway(provider).parse_request(body)
    assert info.value.field == field


# -- validate: malformed native input ------------------------------------------


@pytest.mark.parametrize(
    ("provider", "items", "expected"),
    [
        ("openai_chat", [{"role": ["user"], "content": "x"}], [(0, "unknown_role")]),
        ("openai_responses", [{"role": {}, "content": "x"}], [(0, "unknown_role")]),
        ("anthropic", [{"role": ["user"], "content": "x"}], [(0, "unknown_role")]),
        ("gemini", [{"role": ["user"], "parts": [{"text": "x"}]}], [(0, "unknown_role")]),
        (
            "openai_chat",
            [
                {"role": "user", "content": "q"},
                {"role": "tool", "tool_call_id": ["c"], "content": "r"},
            ],
            [(1, "tool_result_without_call")],
        ),
        (
            "openai_chat",
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "a", "tool_calls": 3},
            ],
            [(1, "malformed_tool_calls")],
        ),
        (
            "openai_chat",
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": ["c"]}]},
            ],
            [(1, "missing_call_id")],
        ),
        (
            "anthropic",
            [
                {"role": "user", "content": "q"},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": ["t"]}]},
            ],
            [(1, "tool_result_without_call")],
        ),
        (
            "openai_responses",
            [{"role": "user", "content": "q"}, {"type": "function_call_output", "call_id": ["c"]}],
            [(1, "tool_result_without_call")],
        ),
        (
            "openai_responses",
            [
                {"role": "user", "content": "q"},
                {"type": "function_call", "call_id": {}, "name": "f"},
            ],
            [(1, "missing_call_id")],
        ),
        ("gemini", [{"role": "user", "parts": [{"text": "q"}]}, "junk"], [(1, "unknown_role")]),
    ],
)
def test_validate_reports_malformed_input_without_raising(
    provider: str, items: list[Any], expected: list[tuple[int, str]]
) -> None:
    """Invariant: validate() turns malformed input into violations; it never raises."""
    assert [(v.index, v.rule) for v in get_gateway(provider).validate(items)] == expected


# -- model output parsed, answered by the host, rendered ------------------------


def _body_items(provider: str, messages: list[Message]) -> list[dict[str, Any]]:
    gateway = get_gateway(provider)
    return list(gateway.request_body(rendered(gateway, messages))[ITEM_FIELD[provider]])


def test_gemini_calls_without_ids_answered_by_the_host_validate() -> None:
    """Gemini output omits call ids; the host answers "<name>#<n>": responses carry no id.

    Parallel same-name calls answered in reverse order still render in call order.
    """
    gw = get_gateway("gemini")
    output = gw.parse(
        {
            "role": "model",
            "parts": [
                {"functionCall": {"name": "weather", "args": {"city": "Paris"}}},
                {"functionCall": {"name": "weather", "args": {"city": "Rome"}}},
            ],
        }
    )
    assert [c.call_id for c in output.tool_calls] == ["weather#0", "weather#1"]
    history = [
        Message(role=Role.user, content="Weather in Paris and Rome?"),
        output,
        Message(
            role=Role.tool,
            content=(
                ToolResultPart(
                    call_id="weather#1", name="weather", content=(TextPart(text="sun"),)
                ),
                ToolResultPart(
                    call_id="weather#0", name="weather", content=(TextPart(text="rain"),)
                ),
            ),
        ),
    ]
    items = _body_items("gemini", complete_pairs(history))
    assert items[2] == {
        "role": "user",
        "parts": [
            {"functionResponse": {"name": "weather", "response": {"output": "rain"}}},
            {"functionResponse": {"name": "weather", "response": {"output": "sun"}}},
        ],
    }
    assert gw.validate(items) == []


# -- Anthropic: an error result needs content ----------------------------------


@pytest.mark.parametrize("content", [(), (TextPart(text=" \n"),)])
def test_anthropic_error_result_without_content_is_sent_with_a_text(
    content: tuple[TextPart, ...],
) -> None:
    """The API rejects ``is_error`` with empty content: an error without output says so.

    Source: Anthropic Messages API error "tool_result: content cannot be empty if
    `is_error` is true".
    """
    gw = get_gateway("anthropic")
    message = Message(
        role=Role.tool, content=(ToolResultPart(call_id="t1", is_error=True, content=content),)
    )
    assert gw.render(message) == [
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "The tool failed without output."}],
                    "is_error": True,
                }
            ],
        }
    ]


@pytest.mark.parametrize("content", [[], "", "  ", None])
def test_anthropic_validate_flags_an_error_result_without_content(content: Any) -> None:
    """Invariant: validate() reports what the API rejects (empty error result content)."""
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": "t1", "is_error": True}
    if content is not None:
        block["content"] = content
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
        },
        {"role": "user", "content": [block]},
    ]
    assert [(v.index, v.rule) for v in get_gateway("anthropic").validate(items)] == [
        (2, "empty_error_result")
    ]


def test_anthropic_parse_records_its_layout_for_extras_inside_a_result() -> None:
    """Invariant: a parsed message with extras anywhere names its gateway in ``layout``,
    so other gateways do not emit Anthropic's ``cache_control`` (found by hypothesis)."""
    item = {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "t1",
                "content": [{"type": "text", "text": "ok", "cache_control": {"type": "ephemeral"}}],
                "is_error": False,
            }
        ],
    }
    message = get_gateway("anthropic").parse(item)
    assert message.layout == {"gateway": "anthropic"}
    assert get_gateway("openai_chat").render(message) == [
        {"role": "tool", "tool_call_id": "t1", "content": "ok"}
    ]


# -- instructions are text only (OpenAI Chat, Anthropic) ------------------------


@pytest.mark.parametrize("provider", ["openai_chat", "anthropic"])
@pytest.mark.parametrize("role", [Role.system, Role.developer])
def test_image_in_an_instruction_is_dropped_where_instructions_are_text_only(
    provider: str, role: Role, caplog: pytest.LogCaptureFixture
) -> None:
    """Chat system/developer content is text only; Anthropic system content has no image.

    Source: OpenAI Chat ``ChatCompletionSystemMessageParam`` / Anthropic
    ``SystemMessageParam`` and ``system`` (text blocks, no image).
    """
    gw = get_gateway(provider)
    message = Message(
        role=role, content=(TextPart(text="Be brief."), ImagePart(url="https://x/a.png"))
    )
    native_role = role.value if provider == "openai_chat" else "system"
    expected_content = [{"type": "text", "text": "Be brief."}]
    with caplog.at_level("WARNING"):
        assert gw.render(message) == [{"role": native_role, "content": expected_content}]
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    item = {
        "role": native_role,
        "content": [{"type": "text", "text": "Be brief."}, _NATIVE_IMAGE[provider]],
    }
    rule = "non_text_instruction" if provider == "openai_chat" else "image_in_instruction"
    assert [(v.index, v.rule) for v in gw.validate([{"role": "user", "content": "q"}, item])] == [
        (1, rule)
    ]


_NATIVE_IMAGE = {
    "openai_chat": {"type": "image_url", "image_url": {"url": "https://x/a.png"}},
    "anthropic": {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}},
}


# -- replies that render to nothing -----------------------------------------------


@pytest.mark.parametrize(
    "reasoning",
    [
        ReasoningPart(text="plan", gateway="anthropic"),
        ReasoningPart(redacted=True, gateway="anthropic"),
    ],
)
def test_anthropic_reasoning_without_signature_is_left_out(reasoning: ReasoningPart) -> None:
    """The API verifies thinking by its signature (redacted: data); without it, no block.

    validate() flags such a block (it is what the API rejects).
    """
    gw = get_gateway("anthropic")
    message = Message(role=Role.assistant, content=(reasoning, TextPart(text="Hi.")))
    assert gw.render(message) == [
        {"role": "assistant", "content": [{"type": "text", "text": "Hi."}]}
    ]
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "plan", "signature": None},
                {"type": "redacted_thinking", "data": ""},
                {"type": "text", "text": "Hi."},
            ],
        },
    ]
    assert [(v.index, v.rule) for v in gw.validate(items)] == [
        (1, "reasoning_without_signature"),
        (1, "reasoning_without_signature"),
    ]


def test_chat_reply_with_only_extras_renders_to_nothing() -> None:
    """An assistant message whose parts all drop (reasoning only) is no Chat item, even
    with message extras: ``{"role": "assistant", "content": null}`` fails validate()."""
    message = Message(
        role=Role.assistant,
        content=(ReasoningPart(text="t", signature="c2ln", gateway="anthropic"),),
        extras={"name": "bot"},
    )
    assert get_gateway("openai_chat").render(message) == []


def test_gemini_validate_reads_an_unset_role_as_user_like_parse() -> None:
    """Gemini ``Content.role`` may be unset (a user turn): parse() and validate() agree."""
    gw = get_gateway("gemini")
    content = {"parts": [{"text": "Hi"}]}
    assert gw.parse(content) == Message(role=Role.user, content="Hi")
    assert gw.validate([content]) == []


# -- image media types -------------------------------------------------------------


def test_image_media_type_must_be_an_image_type_at_the_door() -> None:
    """check_message rejects ``media_type`` that is not ``image/...`` (naming the field)."""
    message = Message(
        role=Role.user, content=(ImagePart(data="JVBERi0=", media_type="application/pdf"),)
    )
    with pytest.raises(InvalidMessageError) as info:
        check_message(message)
    assert info.value.field == "content[0].media_type"


def test_anthropic_drops_base64_images_of_types_it_does_not_take(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Anthropic takes base64 JPEG, PNG, GIF and WebP only; validate flags other types.

    Source: Anthropic Messages API, vision (supported image formats).
    """
    gw = get_gateway("anthropic")
    message = Message(
        role=Role.user,
        content=(TextPart(text="Look"), ImagePart(data="AAAA", media_type="image/heic")),
    )
    with caplog.at_level("WARNING"):
        assert gw.render(message) == [
            {"role": "user", "content": [{"type": "text", "text": "Look"}]}
        ]
    assert [r.getMessage() for r in caplog.records] == [
        "Dropped a 'image/heic' image: Anthropic takes base64 images of types "
        "image/jpeg, image/png, image/gif, image/webp only."
    ]
    item = {
        "role": "user",
        "content": [
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/heic", "data": "AAAA"},
            }
        ],
    }
    assert [(v.index, v.rule) for v in gw.validate([item])] == [(0, "unsupported_media_type")]


@pytest.mark.parametrize(
    ("provider", "body", "error", "field"),
    [
        (
            "openai_responses",
            {"instructions": [{"role": "system", "content": "x"}], "input": []},
            InvalidMessageError,
            "instructions",
        ),
        (
            "openai_chat",
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            InvalidMessageError,
            "content[0].url",
        ),
        (
            "openai_responses",
            {
                "input": [
                    {"role": "user", "content": "q"},
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                    {"type": "function_call", "call_id": "c", "name": "g", "arguments": "{}"},
                ]
            },
            DuplicateIdError,
            None,
        ),
    ],
)
def test_request_body_content_is_never_silently_lost_or_left_for_the_door(
    provider: str, body: dict[str, Any], error: type[Exception], field: str | None
) -> None:
    """Invariant: parse_request() raises instead of dropping a field (instructions given
    as a list) or returning a message check_message would reject (an empty image URL,
    one model turn calling the same id twice)."""
    with pytest.raises(error) as info:
        get_gateway(provider).parse_request(body)
    assert getattr(info.value, "field", None) == field

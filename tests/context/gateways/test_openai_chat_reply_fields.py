"""An OpenAI Chat assistant reply carrying only ``audio`` or ``refusal`` says something.

Such a reply has no ``content`` text and no ``tool_calls``. It parses into
parts (so the history records it and other gateways carry what it said) and
renders back on OpenAI Chat exactly as it came. The deprecated
``function_call`` and its ``role: "function"`` answer are refused at the door
with a typed error naming the ``tool_calls`` form.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnloom.context import (
    GatewayType,
    Message,
    OpaquePart,
    Role,
    TextPart,
    ToolCallPart,
    check_message,
    get_gateway,
)
from turnloom.errors import InvalidMessageError

_CHAT = get_gateway(GatewayType.openai_chat)

_REFUSAL = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
_AUDIO_ID = {"role": "assistant", "audio": {"id": "audio_abc123"}}
_AUDIO_RESPONSE = {
    "role": "assistant",
    "content": None,
    "audio": {
        "id": "audio_abc123",
        "data": "UklGRg==",
        "expires_at": 1729018505,
        "transcript": "Hello there.",
    },
}


def test_a_refusal_only_reply_parses_into_a_text_part_named_by_the_fields_hint() -> None:
    message = _CHAT.parse(_REFUSAL)
    assert message == Message(
        role=Role.assistant,
        content=(TextPart(text="I can't help with that."),),
        layout={"gateway": "openai_chat", "fields": ["refusal"]},
    )


def test_an_audio_reference_without_transcript_parses_into_an_openai_chat_opaque_part() -> None:
    message = _CHAT.parse(_AUDIO_ID)
    assert message == Message(
        role=Role.assistant,
        content=(
            OpaquePart(
                gateway="openai_chat", item={"type": "audio", "audio": {"id": "audio_abc123"}}
            ),
        ),
        layout={"gateway": "openai_chat", "content": "absent", "fields": ["audio"]},
    )


def test_an_audio_reply_with_a_transcript_parses_into_text_carrying_the_audio_verbatim() -> None:
    message = _CHAT.parse(_AUDIO_RESPONSE)
    assert message == Message(
        role=Role.assistant,
        content=(TextPart(text="Hello there.", extras={"audio": _AUDIO_RESPONSE["audio"]}),),
        layout={"gateway": "openai_chat", "fields": ["audio"]},
    )


@pytest.mark.parametrize(
    "item",
    [
        _REFUSAL,
        _AUDIO_ID,
        _AUDIO_RESPONSE,
        {"role": "assistant", "content": "Here.", "refusal": "Not that part."},
        {**_AUDIO_RESPONSE, "refusal": "No.", "name": "bot"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Calling."}],
            "audio": {"id": "audio_2"},
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        # A blank refusal says nothing: it stays an extra, re-emitted as it came.
        {"role": "assistant", "content": "Sure.", "refusal": ""},
    ],
)
def test_reply_fields_render_back_exactly_and_validate(item: dict[str, Any]) -> None:
    """Invariant: what OpenAI Chat handed in comes back exactly, and passes validate()."""
    message = _CHAT.parse(item)
    check_message(message)
    assert _CHAT.render(message) == [item]
    rendered = _CHAT.render(message)
    if "tool_calls" in item:
        rendered.append({"role": "tool", "tool_call_id": "c1", "content": "ok"})
    assert _CHAT.validate([{"role": "user", "content": "Hi"}, *rendered]) == []


@pytest.mark.parametrize(
    ("provider", "refusal", "transcript"),
    [
        (
            "anthropic",
            {"role": "assistant", "content": [{"type": "text", "text": "I can't help with that."}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello there."}]},
        ),
        (
            "gemini",
            {"role": "model", "parts": [{"text": "I can't help with that."}]},
            {"role": "model", "parts": [{"text": "Hello there."}]},
        ),
        (
            "openai_responses",
            {"role": "assistant", "content": "I can't help with that."},
            {"role": "assistant", "content": "Hello there."},
        ),
    ],
)
def test_other_gateways_carry_a_refusal_and_a_transcript_as_assistant_text(
    provider: str, refusal: dict[str, Any], transcript: dict[str, Any]
) -> None:
    """Invariant: what the model said reaches every provider (the audio itself stays Chat's)."""
    gateway = get_gateway(provider)
    assert gateway.render(_CHAT.parse(_REFUSAL)) == [refusal]
    assert gateway.render(_CHAT.parse(_AUDIO_RESPONSE)) == [transcript]


@pytest.mark.parametrize("provider", ["anthropic", "gemini", "openai_responses"])
def test_other_gateways_leave_out_an_audio_reference_without_transcript_with_a_warning(
    provider: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Never silently: the part is logged at WARNING (and counted by the runtime)."""
    with caplog.at_level(logging.WARNING, logger=f"turnloom.gateway.{provider}"):
        assert get_gateway(provider).render(_CHAT.parse(_AUDIO_ID)) == []
    assert [r.getMessage() for r in caplog.records] == [
        f"Dropped a openai_chat-native 'audio' part: the {provider} gateway cannot carry it."
    ]


_LEGACY_CALL = (
    "An OpenAI Chat assistant message has the deprecated function_call, which is not "
    'accepted: send the call as a tool_calls entry {"id", "type": "function", "function": '
    '{"name", "arguments"}} and its result as a tool message with that tool_call_id.'
)
_NO_AUDIO_ID = (
    "An OpenAI Chat assistant message's audio has no id (the reference a later request sends back)."
)


@pytest.mark.parametrize(
    ("item", "field", "says"),
    [
        (
            {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}},
            "function_call",
            _LEGACY_CALL,
        ),
        (
            {
                "role": "assistant",
                "content": "x",
                "function_call": {"name": "f", "arguments": "{}"},
            },
            "function_call",
            _LEGACY_CALL,
        ),
        (
            {"role": "function", "name": "f", "content": "42"},
            "role",
            "OpenAI Chat role 'function' (the deprecated answer to a function_call) is not "
            'accepted: send the result as {"role": "tool", "tool_call_id", "content"} '
            "answering a tool_calls entry.",
        ),
        (
            {"role": "assistant", "refusal": 7},
            "refusal",
            "An OpenAI Chat assistant message's refusal must be a string, not an object of "
            "type int.",
        ),
        (
            {"role": "assistant", "audio": "audio_1"},
            "audio",
            "An OpenAI Chat assistant message's audio must be an object, not an object of "
            "type str.",
        ),
        ({"role": "assistant", "audio": {"data": "UklGRg=="}}, "audio.id", _NO_AUDIO_ID),
        ({"role": "assistant", "audio": {"id": ""}}, "audio.id", _NO_AUDIO_ID),
    ],
)
def test_legacy_and_malformed_reply_fields_are_typed_errors(
    item: dict[str, Any], field: str, says: str
) -> None:
    """Invariant: nothing handed in vanishes; what the door cannot keep is a typed error."""
    with pytest.raises(InvalidMessageError) as info:
        _CHAT.parse(item)
    assert info.value.field == field
    assert str(info.value) == says


def test_a_null_function_call_says_nothing_and_passes() -> None:
    """A LiteLLM or SDK message's ``function_call: None`` is left out, as every null field."""
    item = {"role": "assistant", "content": "Hi", "function_call": None, "audio": None}
    assert _CHAT.render(_CHAT.parse(item)) == [{"role": "assistant", "content": "Hi"}]


@pytest.mark.parametrize(
    "message",
    [
        # The hint names a field the trailing parts do not hold.
        Message(
            role=Role.assistant,
            content=(TextPart(text="x", extras={"cache": 1}),),
            layout={"gateway": "openai_chat", "fields": ["refusal"]},
        ),
        Message(
            role=Role.assistant,
            content=(TextPart(text="x"),),
            layout={"gateway": "openai_chat", "fields": ["audio"]},
        ),
        Message(
            role=Role.assistant,
            content=(ToolCallPart(call_id="c", name="f"),),
            layout={"gateway": "openai_chat", "fields": ["refusal"]},
        ),
        Message(
            role=Role.assistant,
            content=(TextPart(text="a"), TextPart(text="b")),
            layout={"gateway": "openai_chat", "fields": ["refusal", "refusal"]},
        ),
        Message(
            role=Role.assistant,
            content=(TextPart(text="a"),),
            layout={"gateway": "openai_chat", "fields": ["name"]},
        ),
        Message(
            role=Role.user,
            content=(TextPart(text="a"),),
            layout={"gateway": "openai_chat", "fields": ["refusal"]},
        ),
        Message(
            role=Role.assistant,
            content=(TextPart(text="a"),),
            layout={"gateway": "openai_chat", "fields": []},
        ),
    ],
)
def test_a_fields_hint_its_parts_do_not_hold_is_refused_at_the_door(message: Message) -> None:
    """Invariant: the hint can never make a text part vanish from the render."""
    with pytest.raises(InvalidMessageError, match="does not name fields") as info:
        check_message(message)
    assert info.value.field == "layout.fields"


_refusals = st.text(min_size=1, max_size=20).filter(lambda t: not t.isspace())
_contents = st.one_of(
    st.none(), st.just("Sure."), st.just([{"type": "text", "text": "One."}]), st.just("")
)


@given(
    content=_contents,
    refusal=st.one_of(st.none(), _refusals),
    audio=st.one_of(
        st.none(),
        st.builds(lambda i: {"id": i}, st.sampled_from(["audio_1", "audio_x"])),
        st.builds(
            lambda t: {"id": "audio_2", "transcript": t, "expires_at": 1},
            st.sampled_from(["", " ", "Hi!", "é"]),
        ),
    ),
    absent=st.booleans(),
)
def test_property_any_reply_of_content_audio_and_refusal_renders_back_exactly(
    content: Any, refusal: str | None, audio: dict[str, Any] | None, absent: bool
) -> None:
    """Invariant: parse then render is the identity on Chat; nothing handed in vanishes."""
    item: dict[str, Any] = {"role": "assistant"}
    if not absent or content is not None:
        item["content"] = content
    if refusal is not None:
        item["refusal"] = refusal
    if audio is not None:
        item["audio"] = audio
    message = _CHAT.parse(item)
    check_message(message)
    # Blank content is never emitted (documented): it comes back as null.
    expected = {**item, "content": None} if item.get("content") == "" else item
    assert _CHAT.render(message) == ([expected] if _says(item) else [])
    texts = [p.text for p in message.parts if type(p) is TextPart]
    if refusal is not None:
        assert texts[-1] == refusal


def _says(item: dict[str, Any]) -> bool:
    content = item.get("content")
    return bool(
        item.get("refusal")
        or item.get("audio")
        or (isinstance(content, str) and content.strip())
        or isinstance(content, list)
    )

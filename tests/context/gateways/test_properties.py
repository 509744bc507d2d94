"""Property: a gateway never emits an input that its own validate() rejects.

Random neutral conversations -- text (some blank, as an interrupted reply
leaves it), images, reasoning and opaque parts of every provider, parallel
calls with ids reused across turns, results missing, out of call order,
split over several tool messages or orphaned -- are completed with
``complete_pairs`` (both open-call policies), rendered, turned into a
request body, and validated. The body's items must also be valid SDK
request items.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.context.gateways._sdk_types import type_errors
from tests.context.gateways._support import ITEM_FIELD, PROVIDERS, rendered
from tests.context.gateways.test_sdk import _TYPES
from turnloom.context import (
    ImagePart,
    Message,
    OpaquePart,
    Part,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    check_message,
    complete_pairs,
    get_gateway,
)
from turnloom.context.gateway import step_join

# One opaque item per gateway, valid where that gateway's own messages put it.
_OPAQUE: dict[str, tuple[Role, dict[str, Any]]] = {
    "openai_chat": (
        Role.user,
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
    ),
    "openai_responses": (
        Role.assistant,
        {
            "type": "web_search_call",
            "id": "ws_1",
            "status": "completed",
            "action": {"type": "search", "query": "weather"},
        },
    ),
    "anthropic": (
        Role.assistant,
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
    ),
    "gemini": (Role.assistant, {"executableCode": {"code": "print(1)", "language": "PYTHON"}}),
}

_texts = st.sampled_from(["Hello", "  ", "", "\n\n", "Paris?", "ok, done", "é ü 漢字"])
_ids = st.sampled_from(["call_a", "call_b", "call_c", "toolu_1", "x-9"])
_names = st.sampled_from(["lookup", "book", "cancel"])
_args = st.dictionaries(
    st.sampled_from(["city", "n", "flag"]),
    st.one_of(st.integers(-5, 5), st.booleans(), st.sampled_from(["a", "b c"])),
    max_size=3,
).map(lambda d: json.dumps(d))
_images = st.one_of(
    st.just(ImagePart(url="https://example.com/p.png", media_type="image/png")),
    st.just(ImagePart(data="iVBORw0KGgo=", media_type="image/png")),
)


@st.composite
def _reasoning(draw: st.DrawFn) -> ReasoningPart:
    gateway = draw(st.sampled_from(PROVIDERS))
    if gateway == "openai_responses":
        # A provider item id names one item: equal ids mean equal items (a
        # replay, which request_body drops); one id on two different items is
        # invalid input, flagged by validate() (test_openai_responses.py).
        text = draw(st.sampled_from(["", "think"]))
        return ReasoningPart(
            text=text,
            id="rs_" + ("1" if text else "2"),
            encrypted_content="gAAAA",
            gateway=gateway,
        )
    if gateway == "anthropic" and draw(st.booleans()):
        return ReasoningPart(encrypted_content="EuYB", redacted=True, gateway=gateway)
    return ReasoningPart(text="think", signature="c2ln", gateway=gateway)


def _opaque(gateway: str) -> OpaquePart:
    return OpaquePart(gateway=gateway, item=_OPAQUE[gateway][1])


@st.composite
def _user(draw: st.DrawFn) -> Message:
    parts: list[Part] = [TextPart(text=draw(_texts))]
    if draw(st.integers(0, 4)) == 0:
        parts.append(draw(_images))
    if draw(st.integers(0, 6)) == 0:
        parts.append(_opaque("openai_chat"))
    return Message(role=Role.user, content=tuple(parts))


@st.composite
def _assistant(draw: st.DrawFn) -> Message:
    parts: list[Part] = []
    if draw(st.booleans()):
        parts.append(draw(_reasoning()))
    if draw(st.booleans()):
        parts.append(TextPart(text=draw(_texts)))
    if draw(st.integers(0, 5)) == 0:
        gateway = draw(st.sampled_from(["openai_responses", "anthropic", "gemini"]))
        parts.append(_opaque(gateway))
    ids = draw(st.lists(_ids, max_size=3, unique=True))
    for call_id in ids:
        parts.append(ToolCallPart(call_id=call_id, name=draw(_names), arguments=draw(_args)))
    return Message(role=Role.assistant, content=tuple(parts))


@st.composite
def _results(draw: st.DrawFn, calls: tuple[ToolCallPart, ...]) -> list[Message]:
    """Results of ``calls``: a random subset, random order, split randomly, maybe an orphan."""
    answered = draw(st.lists(st.sampled_from(calls), unique=True)) if calls else []
    parts: list[ToolResultPart] = []
    for call in answered:
        content: tuple[TextPart | ImagePart | OpaquePart, ...] = (TextPart(text=draw(_texts)),)
        if draw(st.integers(0, 5)) == 0:
            content = (*content, draw(_images))
        parts.append(
            ToolResultPart(
                call_id=call.call_id,
                name=call.name if draw(st.booleans()) else None,
                is_error=draw(st.booleans()),
                content=content,
            )
        )
    if draw(st.integers(0, 8)) == 0:
        parts.append(ToolResultPart(call_id="orphan", content=(TextPart(text="late"),)))
    out: list[Message] = []
    while parts:
        size = draw(st.integers(1, len(parts)))
        out.append(Message(role=Role.tool, content=tuple(parts[:size])))
        parts = parts[size:]
    return out


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    """A neutral conversation of up to five turns."""
    messages: list[Message] = []
    if draw(st.booleans()):
        messages.append(Message(role=Role.system, content="Be brief."))
    if draw(st.integers(0, 3)) == 0:
        messages.append(Message(role=Role.developer, content="Use tools."))
    for _ in range(draw(st.integers(1, 5))):
        messages.append(draw(_user()))
        for _ in range(draw(st.integers(0, 3))):
            reply = draw(_assistant())
            messages.append(reply)
            messages.extend(draw(_results(reply.tool_calls)))
        if draw(st.integers(0, 6)) == 0:
            messages.append(Message(role=Role.system, content="Notice: keep going."))
    return messages


def _sdk_errors(provider: str, items: list[dict[str, Any]]) -> list[str]:
    if provider == "gemini":
        from google.genai import types

        errors: list[str] = []
        for item in items:
            try:
                types.Content.model_validate(item)
            except ValueError as exc:
                errors.append(str(exc))
        return errors
    return [e for item in items for e in type_errors(item, _TYPES[provider])]


# What validate() says of a completed body: nothing, or the empty input alone.
_VALID_UNLESS_EMPTY = {True: [], False: ["empty_input"]}


@pytest.mark.parametrize("provider", PROVIDERS)
@settings(
    max_examples=80,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(messages=conversations(), policy=st.sampled_from(["exclude", "cancel"]))
def test_rendered_input_passes_own_validate(
    provider: str, messages: list[Message], policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Invariant: validate(request_body(render(complete_pairs(m)))) is empty, and SDK-valid
    (an input left without items is the one violation: no provider accepts it)."""
    caplog.set_level(logging.ERROR)  # dropped foreign parts log warnings by design
    for message in messages:
        check_message(message)
    gateway = get_gateway(provider)
    completed = complete_pairs(messages, open_calls=policy, join=step_join(gateway))  # type: ignore[arg-type]
    body = gateway.request_body(rendered(gateway, completed))
    items = body[ITEM_FIELD[provider]]
    assert [v.rule for v in gateway.validate(items)] == _VALID_UNLESS_EMPTY[bool(items)]
    assert _sdk_errors(provider, items) == []


# -- nastier inputs ---------------------------------------------------------------

# One opaque item per gateway, valid inside that gateway's tool results.
_RESULT_OPAQUE: dict[str, dict[str, Any]] = {
    "openai_chat": {"type": "file", "file": {"file_id": "file-1"}},
    "openai_responses": {"type": "input_file", "file_id": "file-1"},
    "anthropic": {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": "notes"},
    },
    "gemini": {"inlineData": {"mimeType": "application/pdf", "data": "JVBERi0="}},
}
_nasty_texts = st.sampled_from(["Hello", " ", "", "\n\n", "\t \n", "ok", "\u3000", "漢字"])
_extras = st.sampled_from([None, {"cache_control": {"type": "ephemeral"}}])
# Parts with extras belong to a message whose layout names the gateway they are for.
_ANTHROPIC = {"gateway": "anthropic"}


def _layout(parts: Sequence[Part]) -> dict[str, Any] | None:
    def has_extras(p: Part) -> bool:
        inner = p.content if type(p) is ToolResultPart else ()
        return bool(getattr(p, "extras", None)) or any(getattr(q, "extras", None) for q in inner)

    return _ANTHROPIC if any(has_extras(p) for p in parts) else None


_nasty_images = st.one_of(
    _images, st.just(ImagePart(data="AAAAGGZ0eXBoZWlj", media_type="image/heic"))
)
_bare_reasoning = st.builds(
    ReasoningPart,
    text=_nasty_texts,
    redacted=st.booleans(),
    gateway=st.sampled_from(PROVIDERS),
)


@st.composite
def _nasty_result(draw: st.DrawFn, call: ToolCallPart) -> ToolResultPart:
    """A result that may be empty, blank, image-only, with extras, an error."""
    content: list[TextPart | ImagePart | OpaquePart] = []
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.integers(0, 5))
        if kind == 0:
            content.append(draw(_nasty_images))
        elif kind == 1:
            gateway = draw(st.sampled_from(PROVIDERS))
            content.append(OpaquePart(gateway=gateway, item=_RESULT_OPAQUE[gateway]))
        else:
            content.append(TextPart(text=draw(_nasty_texts), extras=draw(_extras)))
    return ToolResultPart(
        call_id=call.call_id,
        name=call.name if draw(st.booleans()) else None,
        is_error=draw(st.booleans()),
        content=tuple(content),
    )


@st.composite
def _instruction(draw: st.DrawFn) -> Message:
    role = draw(st.sampled_from([Role.system, Role.developer]))
    return Message(role=role, content=draw(_nasty_texts))


@st.composite
def nasty_conversations(draw: st.DrawFn) -> list[Message]:
    """Conversations with blank text everywhere, empty or image-only results, results
    first, instructions between a call and its results, reasoning-only replies, results
    riding on user messages with text, and text parts with extras."""
    messages: list[Message] = []
    if draw(st.booleans()):
        # A history cut in the middle of a call group: its results come first.
        messages.append(
            Message(role=Role.tool, content=(ToolResultPart(call_id="call_a", content=()),))
        )
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.integers(0, 3)) == 0:
            messages.append(draw(_instruction()))
        user_parts: list[Part] = [TextPart(text=draw(_nasty_texts), extras=draw(_extras))]
        if draw(st.integers(0, 4)) == 0:
            user_parts.append(draw(_nasty_images))
        messages.append(
            Message(role=Role.user, content=tuple(user_parts), layout=_layout(user_parts))
        )
        for _ in range(draw(st.integers(0, 3))):
            if draw(st.integers(0, 4)) == 0:
                # Reasoning only; some of it bare (no signature, id or data), and
                # the message may carry extras of its own.
                reasoning = draw(st.lists(_reasoning() | _bare_reasoning, min_size=1, max_size=2))
                extras = draw(st.sampled_from([None, {"refusal": "agent"}]))
                messages.append(
                    Message(
                        role=Role.assistant,
                        content=tuple(reasoning),
                        extras=extras,
                        layout={"gateway": "openai_chat"} if extras else None,
                    )
                )
                continue
            reply = draw(_assistant())
            messages.append(reply)
            calls = list(reply.tool_calls)
            order = draw(st.permutations(calls)) if calls else []
            answered = order[: draw(st.integers(0, len(order)))] if order else []
            results = [draw(_nasty_result(c)) for c in answered]
            if results and draw(st.integers(0, 3)) == 0:
                messages.append(draw(_instruction()))
            while results:
                size = draw(st.integers(1, len(results)))
                chunk: list[Part] = list(results[:size])
                results = results[size:]
                if draw(st.integers(0, 3)) == 0:
                    chunk.append(TextPart(text=draw(_nasty_texts)))
                    role = Role.user
                else:
                    role = Role.tool
                messages.append(Message(role=role, content=tuple(chunk), layout=_layout(chunk)))
    return messages


@pytest.mark.parametrize("provider", PROVIDERS)
@settings(
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    messages=nasty_conversations(),
    policy=st.sampled_from(["exclude", "cancel"]),
    source=st.sampled_from((None, *PROVIDERS)),
)
def test_nasty_input_passes_own_validate(
    provider: str,
    messages: list[Message],
    policy: str,
    source: str | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Invariant: a gateway's body of completed messages passes its own validate().

    With ``source`` set, the conversation first goes through that gateway and back
    (render, request body, parse_request), so it carries that gateway's layout and
    extras when the target gateway renders it.
    """
    caplog.set_level(logging.ERROR)
    for message in messages:
        check_message(message)
    completed = complete_pairs(messages, open_calls=policy)  # type: ignore[arg-type]
    if source is not None:
        origin = get_gateway(source)
        completed = complete_pairs(
            origin.parse_request(origin.request_body(rendered(origin, completed))),
            open_calls=policy,  # type: ignore[arg-type]
        )
    gateway = get_gateway(provider)
    body = gateway.request_body(rendered(gateway, completed))
    items = body[ITEM_FIELD[provider]]
    assert [v.rule for v in gateway.validate(items)] == _VALID_UNLESS_EMPTY[bool(items)]
    assert _sdk_errors(provider, items) == []

"""The door's last leaks: typed errors where a raw one escaped.

* ``check_message`` of a tool result whose text is not a str, under a
  Gemini layout with ``json_results``, raised a raw ``TypeError``;
* a gateway's own ``render`` of a message that never passed the door, with
  JSON 10,000 levels deep, raised ``RecursionError`` (or returned items that
  no encoder could write): it applies the door's depth rule now.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from turnloom.context import (
    GatewayType,
    Message,
    OpaquePart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    check_message,
    get_gateway,
)
from turnloom.context.message import MAX_JSON_DEPTH
from turnloom.errors import InvalidMessageError


class _Text(str):
    pass


@pytest.mark.parametrize("text", [5, 1.5, None, b"{}", ["{}"], {"a": 1}, True])
@pytest.mark.parametrize("inner", [True, False])
def test_a_result_text_that_is_no_str_under_json_results_is_the_typed_error(
    text: Any, inner: bool
) -> None:
    """InvalidMessageError naming the text field (as without the layout); nothing changes."""
    result = ToolResultPart(
        call_id="c1",
        name="f",
        content=(TextPart(text="{}"), TextPart(text=text)) if inner else (TextPart(text=text),),
    )
    message = Message(
        role=Role.tool, content=(result,), layout={"gateway": "gemini", "json_results": ["c1"]}
    )
    before = msgspec.structs.asdict(message)
    with pytest.raises(InvalidMessageError) as info:
        check_message(message)
    assert type(info.value) is InvalidMessageError
    assert info.value.field == f"content[0].content[{1 if inner else 0}].text"
    assert msgspec.structs.asdict(message) == before


def test_a_str_subclass_result_text_under_json_results_is_a_typed_refusal() -> None:
    """A host's str subclass as a result text: refused typed (msgspec cannot encode it)."""
    message = Message(
        role=Role.tool,
        content=(ToolResultPart(call_id="c1", name="f", content=(TextPart(text=_Text("{}")),)),),
        layout={"gateway": "gemini", "json_results": ["c1"]},
    )
    with pytest.raises(InvalidMessageError) as info:
        check_message(message)
    assert type(info.value) is InvalidMessageError


def _nest(levels: int) -> Any:
    value: Any = 1
    for i in range(levels):
        value = [value] if i % 2 else {"k": value}
    return value


def _deep_text(levels: int) -> str:
    return '{"a":' * levels + "1" + "}" * levels


def _messages(levels: int) -> dict[str, tuple[Message, str]]:
    """Messages whose one JSON value nests ``levels`` levels, with the field it is in."""
    return {
        "arguments": (
            Message(
                role=Role.assistant,
                content=(ToolCallPart(call_id="c1", name="f", arguments=_deep_text(levels)),),
            ),
            "content[0].arguments",
        ),
        "part extras": (
            Message(role=Role.user, content=(TextPart(text="x", extras={"d": _nest(levels - 1)}),)),
            "content[0].extras",
        ),
        "message extras": (
            Message(role=Role.user, content="x", extras={"d": _nest(levels - 1)}),
            "extras",
        ),
        "opaque item": (
            Message(
                role=Role.user,
                content=(
                    OpaquePart(gateway="anthropic", item={"type": "x", "d": _nest(levels - 1)}),
                ),
            ),
            "content[0].item",
        ),
        "result extras": (
            Message(
                role=Role.tool,
                content=(
                    ToolResultPart(
                        call_id="c1",
                        name="f",
                        content=(TextPart(text="ok", extras={"d": _nest(levels - 1)}),),
                    ),
                ),
            ),
            "content[0].content[0].extras",
        ),
    }


@pytest.mark.parametrize("kind", list(GatewayType))
@pytest.mark.parametrize("case", sorted(_messages(3)))
def test_a_direct_render_ten_thousand_levels_deep_is_the_typed_error(
    kind: GatewayType, case: str
) -> None:
    """InvalidMessageError (exactly) naming the field; the message is unchanged."""
    message, field = _messages(10_000)[case]
    parts, extras = message.parts, message.extras
    with pytest.raises(InvalidMessageError) as info:
        get_gateway(kind).render(message)
    assert type(info.value) is InvalidMessageError
    assert info.value.field.startswith(field)
    assert f"nests JSON deeper than {MAX_JSON_DEPTH} levels" in str(info.value)
    assert message.parts is parts and all(a is b for a, b in zip(message.parts, parts, strict=True))
    assert message.extras is extras


def test_a_gemini_json_result_too_deep_is_the_typed_error_on_a_direct_render() -> None:
    """The text Gemini decodes into ``response``: refused typed, as the door refuses it."""
    message = Message(
        role=Role.tool,
        content=(
            ToolResultPart(call_id="c1", name="f", content=(TextPart(text=_deep_text(10_000)),)),
        ),
        layout={"gateway": "gemini", "json_results": ["c1"]},
    )
    with pytest.raises(InvalidMessageError) as info:
        get_gateway("gemini").render(message)
    assert type(info.value) is InvalidMessageError
    assert (
        str(info.value)
        == f"The result of call 'c1' text nests JSON deeper than {MAX_JSON_DEPTH} levels."
    )
    with pytest.raises(InvalidMessageError):
        check_message(message)


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1])
@pytest.mark.parametrize("case", sorted(_messages(3)))
def test_a_direct_render_refuses_exactly_what_the_door_refuses(levels: int, case: str) -> None:
    """The same rule on both sides of the limit: the door accepts a depth iff a direct
    render of the unchecked message does, on every gateway."""
    door_message, _ = _messages(levels)[case]
    try:
        check_message(door_message)
    except InvalidMessageError:
        door = False
    else:
        door = True
    assert door is (levels <= MAX_JSON_DEPTH)
    for kind in GatewayType:
        message, _ = _messages(levels)[case]
        try:
            items = get_gateway(kind).render(message)
        except InvalidMessageError:
            direct = False
        else:
            direct = True
            msgspec.json.encode(get_gateway(kind).request_body(items) if items else {})
        assert direct is door, kind

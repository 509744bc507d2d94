"""The neutral message model: construction, the check_message door, encode/decode."""

from __future__ import annotations

import gc
import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnloom.areas._content import as_messages
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
    decode_message,
    encode_message,
    get_gateway,
    message_size,
)
from turnloom.context.history import TurnHistory
from turnloom.context.message import is_blank_part
from turnloom.errors import (
    DuplicateIdError,
    InputError,
    InvalidMessageError,
    InvalidTextError,
    excerpt,
)


def test_string_content_becomes_one_text_part() -> None:
    """``content="x"`` is normalised to ``(TextPart("x"),)``; a list to a tuple."""
    assert Message(role=Role.user, content="hi").parts == (TextPart(text="hi"),)
    listed = Message(role=Role.user, content=[TextPart(text="a")])  # type: ignore[arg-type]
    assert listed.parts == (TextPart(text="a"),)


def test_accessors_select_parts_in_order() -> None:
    """text joins text parts; tool_calls / tool_results keep part order."""
    message = Message(
        role=Role.assistant,
        content=(
            TextPart(text="a"),
            ToolCallPart(call_id="1", name="f"),
            ReasoningPart(text="r"),
            TextPart(text="b"),
            ToolCallPart(call_id="2", name="g"),
        ),
    )
    assert message.text == "ab"
    assert [c.call_id for c in message.tool_calls] == ["1", "2"]
    results = Message(role=Role.tool, content=(ToolResultPart(call_id="1"),))
    assert [r.call_id for r in results.tool_results] == ["1"]


def test_check_message_returns_the_encoded_size() -> None:
    """The size is the length in bytes of the JSON encoding (UTF-8)."""
    message = Message(role=Role.user, content="héllo")
    assert check_message(message) == len(encode_message(message)) == message_size(message)
    assert encode_message(message) == (
        b'{"role":"user","content":[{"type":"text","text":"h\xc3\xa9llo","extras":null}],'
        b'"id":null,"extras":null,"layout":null,"name":null}'
    )


@pytest.mark.parametrize(
    ("message", "error", "field"),
    [
        (Message(role="robot", content="x"), InvalidMessageError, "role"),  # type: ignore[arg-type]
        (Message(role=Role.user, content="x", id=""), InvalidMessageError, "id"),
        (
            Message(role=Role.assistant, content=(ToolCallPart(call_id="", name="f"),)),
            InvalidMessageError,
            "content[0].call_id",
        ),
        (
            Message(role=Role.assistant, content=(ToolCallPart(call_id="c", name=""),)),
            InvalidMessageError,
            "content[0].name",
        ),
        (
            Message(
                role=Role.assistant,
                content=(ToolCallPart(call_id="c", name="f", arguments={}),),  # type: ignore[arg-type]
            ),
            InvalidMessageError,
            "content[0].arguments",
        ),
        (
            Message(role=Role.tool, content=(ToolResultPart(call_id=""),)),
            InvalidMessageError,
            "content[0].call_id",
        ),
        (
            Message(role=Role.user, content=(ImagePart(),)),
            InvalidMessageError,
            "content[0]",
        ),
        (
            Message(role=Role.user, content=(ImagePart(url="u", data="d"),)),
            InvalidMessageError,
            "content[0]",
        ),
        (
            Message(
                role=Role.tool,
                content=(
                    ToolResultPart(call_id="c", content=(ToolCallPart(call_id="x", name="f"),)),  # type: ignore[arg-type]
                ),
            ),
            InvalidMessageError,
            "content[0].content[0]",
        ),
        (
            Message(role=Role.user, content=(ImagePart(data="AAAA"),)),
            InvalidMessageError,
            "content[0].media_type",
        ),
        (
            Message(role=Role.user, content=(OpaquePart(gateway="", item={}),)),
            InvalidMessageError,
            "content[0].gateway",
        ),
        (
            Message(role=Role.user, content="x", layout={"content": "list"}),
            InvalidMessageError,
            "layout",
        ),
        (
            Message(role=Role.user, content="\udcff"),
            InvalidTextError,
            "content",
        ),
        (
            Message(
                role=Role.user, content=(TextPart(text="x"), ToolCallPart(call_id="c", name="f"))
            ),
            InvalidMessageError,
            "content[1]",
        ),
        (
            Message(role=Role.system, content=(ToolResultPart(call_id="c"),)),
            InvalidMessageError,
            "content[0]",
        ),
        (
            Message(role=Role.assistant, content=(ToolResultPart(call_id="c"),)),
            InvalidMessageError,
            "content[0]",
        ),
        (
            Message(
                role=Role.assistant,
                content=(OpaquePart(gateway="openai_responses", item=["refusal"]),),  # type: ignore[arg-type]
            ),
            InvalidMessageError,
            "content[0].item",
        ),
        (
            Message(
                role=Role.tool,
                content=(ToolResultPart(call_id="c", content=(OpaquePart(gateway="x", item=1),)),),  # type: ignore[arg-type]
            ),
            InvalidMessageError,
            "content[0].content[0].item",
        ),
        (Message(role=Role.user, content=5), InvalidMessageError, "content"),  # type: ignore[arg-type]
        (
            Message(role=Role.user, content=(TextPart(text=5),)),  # type: ignore[arg-type]
            InvalidMessageError,
            "content[0].text",
        ),
        (
            Message(role=Role.user, content=(TextPart(text="x", extras=[1]),)),  # type: ignore[arg-type]
            InvalidMessageError,
            "content[0].extras",
        ),
        (
            Message(role=Role.tool, content=(ToolResultPart(call_id="c", is_error="yes"),)),  # type: ignore[arg-type]
            InvalidMessageError,
            "content[0].is_error",
        ),
        (
            Message(role=Role.tool, content=(ToolResultPart(call_id="c", content=5),)),  # type: ignore[arg-type]
            InvalidMessageError,
            "content[0].content",
        ),
        (
            Message(role=Role.user, content=(ImagePart(url=5),)),  # type: ignore[arg-type]
            InvalidMessageError,
            "content[0].url",
        ),
    ],
)
def test_check_message_rejects_each_malformed_field(
    message: Message, error: type[Exception], field: str
) -> None:
    """Each malformed field raises its typed error, naming the field."""
    with pytest.raises(error) as info:
        check_message(message, where="turn t1 input[2]")
    assert isinstance(info.value, InvalidMessageError)
    assert info.value.field == field
    assert str(info.value).startswith("turn t1 input[2]")


def test_duplicate_call_ids_in_one_message_are_rejected() -> None:
    message = Message(
        role=Role.assistant,
        content=(ToolCallPart(call_id="c", name="f"), ToolCallPart(call_id="c", name="g")),
    )
    with pytest.raises(DuplicateIdError, match="two tool calls with call id 'c'"):
        check_message(message)


def test_check_message_rejects_a_non_message() -> None:
    with pytest.raises(
        InvalidMessageError, match="message is an object of type dict, not a turnloom Message"
    ):
        check_message({"role": "user"})


def test_decode_message_reads_turnloom_json_and_dicts() -> None:
    """The dict and JSON forms decode to the same validated message, layout included."""
    data: dict[str, Any] = {
        "role": "assistant",
        "content": [{"type": "tool_call", "call_id": "c", "name": "f", "arguments": "{}"}],
        "layout": {"gateway": "openai_chat", "content": "absent"},
    }
    expected = Message(
        role=Role.assistant,
        content=(ToolCallPart(call_id="c", name="f"),),
        layout={"gateway": "openai_chat", "content": "absent"},
    )
    assert decode_message(data) == expected
    assert decode_message(msgspec.json.encode(data)) == expected


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"{not json", InvalidMessageError),
        (b'{"role": "robot", "content": []}', InvalidMessageError),
        (b'{"role": "user", "content": [{"type": "video"}]}', InvalidMessageError),
        (b'{"role": "user", "content": "\xff"}', InvalidTextError),
        (
            b'{"role":"assistant","content":[{"type":"tool_call","call_id":"a","name":"f"},'
            b'{"type":"tool_call","call_id":"a","name":"f"}]}',
            DuplicateIdError,
        ),
    ],
)
def test_decode_message_raises_typed_errors(data: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        decode_message(data)


_parts = st.one_of(
    st.builds(TextPart, text=st.text()),
    st.builds(ImagePart, url=st.text(min_size=1), media_type=st.none()),
    st.builds(
        ToolCallPart,
        call_id=st.uuids().map(str),
        name=st.text(min_size=1),
        arguments=st.dictionaries(st.text(), st.integers() | st.text()).map(json.dumps),
    ),
    st.builds(ReasoningPart, text=st.text(), signature=st.none() | st.text()),
)


@settings(max_examples=60)
@given(
    role=st.sampled_from(list(Role)),
    parts=st.lists(_parts, max_size=5),
    layout=st.none() | st.fixed_dictionaries({"gateway": st.sampled_from(["gemini", "anthropic"])}),
)
def test_encode_decode_round_trip(role: Role, parts: list[Any], layout: Any) -> None:
    """Invariant: decode(encode(m)) == m for every valid message (surrogate-free text)."""
    if any(type(p) is ToolCallPart for p in parts):
        role = Role.assistant  # only assistant messages carry tool calls
    message = Message(role=role, content=tuple(parts), layout=layout)
    try:
        check_message(message)
    except InvalidTextError:
        return  # hypothesis text may hold lone surrogates: rejected at the door by design
    assert decode_message(encode_message(message)) == message


def test_messages_and_parts_are_not_tracked_by_the_cyclic_gc() -> None:
    """Invariant: histories of messages add no work to Python's full collections."""
    message = Message(
        role=Role.assistant,
        content=(TextPart(text="a"), ToolCallPart(call_id="c1", name="f", arguments="{}")),
        extras={"refusal": None},
    )
    assert gc.is_tracked(message) is False
    assert [gc.is_tracked(p) for p in message.parts] == [False, False]


def test_the_fields_the_door_types_without_a_decode_are_pinned() -> None:
    """The skipped decode relies on these fields and types (see ``_typed_leaf``).

    ``check_message`` types every field below itself but a text's ``text``
    and a result's ``is_error``, which it tests by type; a changed field
    (another type, a new field) must be typed by ``check_message`` or make
    ``_typed_leaf`` refuse its class before this list is changed.
    """
    parts = "TextPart | ImagePart | ToolCallPart | ToolResultPart | ReasoningPart | OpaquePart"
    leaves = "TextPart | ImagePart | OpaquePart"
    expected: dict[type[msgspec.Struct], list[tuple[str, object]]] = {
        Message: [
            ("role", Role),
            ("content", f"tuple[{parts}, ...] | str"),
            ("id", "str | None"),
            ("extras", "dict[str, typing.Any] | None"),
            ("layout", "dict[str, typing.Any] | None"),
            ("name", "str | None"),
        ],
        TextPart: [("text", str), ("extras", "dict[str, typing.Any] | None")],
        ImagePart: [
            ("url", "str | None"),
            ("data", "str | None"),
            ("media_type", "str | None"),
            ("detail", "str | None"),
            ("extras", "dict[str, typing.Any] | None"),
        ],
        ToolCallPart: [
            ("call_id", str),
            ("name", str),
            ("arguments", str),
            ("extras", "dict[str, typing.Any] | None"),
        ],
        ToolResultPart: [
            ("call_id", str),
            ("content", f"tuple[{leaves}, ...]"),
            ("is_error", bool),
            ("name", "str | None"),
            ("extras", "dict[str, typing.Any] | None"),
        ],
        OpaquePart: [("gateway", str), ("item", "dict[str, typing.Any]")],
    }
    for cls, fields in expected.items():
        found = [
            (f.name, f.type if isinstance(f.type, type) else str(f.type).replace(_MODULE, ""))
            for f in msgspec.structs.fields(cls)
        ]
        assert found == fields, cls


_MODULE = "turnloom.context.message."
_DECODER = msgspec.json.Decoder(Message)
_anything = st.one_of(
    st.text(max_size=3), st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False)
)


class _TextSubclass(TextPart, frozen=True, tag="text"):
    pass


class _ResultSubclass(ToolResultPart, frozen=True, tag="tool_result"):
    pass


class _MessageSubclass(Message, frozen=True):
    pass


@st.composite
def _loosely_typed_messages(draw: st.DrawFn) -> Message:
    """Messages of every part class, exact or subclassed, its untyped fields of any type."""
    leaf = st.one_of(
        st.builds(TextPart, text=_anything),
        st.builds(_TextSubclass, text=_anything),
        st.builds(ImagePart, url=st.sampled_from(["https://x/a.png", 5])),
        st.builds(OpaquePart, gateway=st.just("g"), item=st.just({"k": 1})),
    )
    result = st.builds(
        draw(st.sampled_from([ToolResultPart, _ResultSubclass])),
        call_id=st.just("c1"),
        content=st.tuples(leaf),
        is_error=_anything,
        name=st.none() | st.just("f"),
    )
    call = st.builds(ToolCallPart, call_id=st.just("c1"), name=st.just("f"))
    reasoning = st.builds(ReasoningPart, text=_anything, redacted=_anything)
    role, part = draw(
        st.sampled_from(
            [(Role.user, leaf), (Role.tool, result), (Role.assistant, call | reasoning | leaf)]
        )
    )
    kind = draw(st.sampled_from([Message, Message, _MessageSubclass]))
    content = draw(st.lists(part, max_size=2, unique_by=type))
    return kind(role=role, content=tuple(content), id=draw(st.none() | st.just("m1")))


@settings(max_examples=400, deadline=None)
@given(message=_loosely_typed_messages())
def test_a_message_the_door_passes_decodes_with_every_field_typed(message: Message) -> None:
    """Invariant: skipping the typing decode never lets a wrongly typed message pass.

    Whatever ``check_message`` accepts (with or without its decode) decodes
    from its encoding as a Message, so it fails where the decode would.
    """
    try:
        size = check_message(message)
    except (InvalidMessageError, DuplicateIdError):
        return
    data = msgspec.json.encode(message)
    assert size == len(data)
    _DECODER.decode(data)


@pytest.mark.parametrize(
    "message",
    [
        Message(role=Role.user, content=(TextPart(text=None),)),  # type: ignore[arg-type]
        Message(role=Role.tool, content=(ToolResultPart(call_id="c", is_error=1),)),  # type: ignore[arg-type]
        Message(
            role=Role.tool,
            content=(ToolResultPart(call_id="c", content=(TextPart(text=2),)),),  # type: ignore[arg-type]
        ),
        Message(role=Role.assistant, content=(ReasoningPart(text="t", redacted="no"),)),  # type: ignore[arg-type]
    ],
)
def test_a_wrongly_typed_field_is_refused_as_the_decode_refuses_it(message: Message) -> None:
    """The same error as the typing decode gives: its text, with the field it names."""
    with pytest.raises(InvalidMessageError) as info:
        check_message(message, where="m")
    try:
        _DECODER.decode(msgspec.json.encode(message))
    except msgspec.ValidationError as exc:
        expected = str(exc)
    assert str(info.value) == f"m has a field of the wrong type: {excerpt(expected)}."


SIGNED_BLANK = TextPart(text="", extras={"thoughtSignature": "c2ln"})


def test_a_blank_text_part_is_blank_only_without_extras() -> None:
    """The one blank-part test: blank text without extras is blank; blank text
    carrying a provider field (a Gemini thought signature on empty text) is content,
    and so is any other part."""
    assert [
        is_blank_part(part)
        for part in (
            TextPart(text=""),
            TextPart(text=" \n\t"),
            SIGNED_BLANK,
            TextPart(text="x"),
            ReasoningPart(text=""),
            ToolCallPart(call_id="c1", name="f", arguments="{}"),
        )
    ] == [True, True, False, False, False, False]


def test_every_layer_keeps_a_signed_blank_text_part_as_content() -> None:
    """Invariant: the history, the pairing rule (the render) and an area's content
    check agree, through ``is_blank_part``, that a blank text part with extras is
    content: the history records it, the render sends it back to Gemini with its
    signature, and an area accepts a message holding only it (a plain blank one is
    dropped, left out and refused)."""
    signed = Message(role=Role.assistant, content=(SIGNED_BLANK,))
    plain = Message(role=Role.assistant, content=(TextPart(text="  "),))
    history = TurnHistory()
    history.commit("t1", [Message(role=Role.user, content="hi")])
    assert (history.record("t1", [plain]), history.record("t1", [signed])) == (0, 1)
    assert history.statistics().dropped_blank_outputs == 1
    history.commit("t2", [Message(role=Role.user, content="more")])
    assert list(history.view().render(get_gateway("gemini"), "t2").items) == [
        {"role": "user", "parts": [{"text": "hi"}]},
        {"role": "model", "parts": [{"text": "", "thoughtSignature": "c2ln"}]},
        {"role": "user", "parts": [{"text": "more"}]},
    ]
    assert as_messages(signed, role=Role.user, where="content") == (signed,)
    with pytest.raises(InputError, match=r"content\[0\] has no content"):
        as_messages(plain, role=Role.user, where="content")

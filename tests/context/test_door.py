"""The door checks once and completely: each kind of bad input gets its exact typed error.

Kinds: strict JSON (NaN, infinities, lone surrogates raw and escaped, the
depth cap), extras that would replace a key a gateway writes, layout hints of
the wrong type, values held by reference, surrogates in fields msgspec reads,
per-turn limits checked on the batch first, and error messages that quote at
most a short escaped excerpt.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnloom.context import (
    GatewayType,
    HistoryLimits,
    ImagePart,
    Message,
    OpaquePart,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    TurnHistory,
    admit_message,
    check_message,
    decode_message,
    get_gateway,
)
from turnloom.context.message import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_JSON_DEPTH,
    NativeKeys,
    _strict_copy,
    decode_json_text,
)
from turnloom.errors import (
    EXCERPT_LIMIT,
    DuplicateIdError,
    InvalidMessageError,
    InvalidTextError,
    ItemTooLargeError,
    TurnloomError,
    TurnTooLargeError,
    excerpt,
)


def call(arguments: str, **extras: Any) -> Message:
    part = ToolCallPart(call_id="c1", name="f", arguments=arguments, extras=extras or None)
    return Message(role=Role.assistant, content=(part,))


def nested_text(levels: int) -> str:
    """JSON text of ``levels`` nested objects: ``{"a":{"a":...1}}``."""
    return '{"a":' * levels + "1" + "}" * levels


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value


# -- strict JSON ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "error", "field", "says"),
    [
        ('{"q": "\\ud83c"}', InvalidTextError, "content[0].arguments.q", "lone surrogate"),
        ('{"q": "\\udc80x"}', InvalidTextError, "content[0].arguments.q", "lone surrogate"),
        ('{"q": "\ud800"}', InvalidTextError, "content[0].arguments.q", "lone surrogate"),
        ('{"q": NaN}', InvalidMessageError, "content[0].arguments", "is not strict JSON"),
        ('{"q": -Infinity}', InvalidMessageError, "content[0].arguments", "is not strict JSON"),
        ('{"q": 1e999}', InvalidMessageError, "content[0].arguments.q", "holds inf"),
        ("[1, 2]", InvalidMessageError, "content[0].arguments", "JSON text of an object"),
        ('"text"', InvalidMessageError, "content[0].arguments", "JSON text of an object"),
        ('{"a": 1', InvalidMessageError, "content[0].arguments", "is not strict JSON"),
    ],
)
def test_tool_call_arguments_are_strict_json_object_text(
    arguments: str, error: type[Exception], field: str, says: str
) -> None:
    """Invariant: arguments the door accepts decode to an object every encoder can write."""
    with pytest.raises(error) as info:
        check_message(call(arguments), where="turn 't1' output[0]")
    assert type(info.value) is error
    assert isinstance(info.value, InvalidMessageError)
    assert info.value.field == field
    assert str(info.value).startswith(f"turn 't1' output[0] {field}")
    assert says in str(info.value)


def test_blank_and_object_arguments_pass_and_a_pair_of_surrogates_is_text() -> None:
    for arguments in ("", "  ", "{}", '{"q": "\\ud83c\\udf89"}', nested_text(MAX_JSON_DEPTH)):
        check_message(call(arguments))


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH + 1, 1_000, 100_000])
def test_json_deeper_than_the_cap_is_a_typed_error_never_recursion(levels: int) -> None:
    """The depth cap is MAX_JSON_DEPTH levels, in arguments text and in extras alike."""
    with pytest.raises(InvalidMessageError) as info:
        check_message(call(nested_text(levels)))
    assert f"nests JSON deeper than {MAX_JSON_DEPTH} levels" in str(info.value)
    assert info.value.field.startswith("content[0].arguments")
    extras = Message(role=Role.user, content="hi", extras={"deep": nested(min(levels, 5_000))})
    with pytest.raises(InvalidMessageError) as info:
        check_message(extras)
    assert f"nests JSON deeper than {MAX_JSON_DEPTH} levels" in str(info.value)
    assert info.value.field.startswith("extras.deep.a.a")


def test_depth_counts_levels_of_arrays_and_objects_from_the_value() -> None:
    assert decode_json_text(nested_text(MAX_JSON_DEPTH)) == nested(MAX_JSON_DEPTH)
    assert decode_json_text("5") == 5
    check_message(Message(role=Role.user, content="hi", extras={"k": nested(MAX_JSON_DEPTH - 1)}))
    with pytest.raises(InvalidMessageError):
        check_message(Message(role=Role.user, content="hi", extras={"k": nested(MAX_JSON_DEPTH)}))


@pytest.mark.parametrize(
    ("extras", "error", "field"),
    [
        ({"a": float("nan")}, InvalidMessageError, "extras.a"),
        ({"a": [1, float("inf")]}, InvalidMessageError, "extras.a[1]"),
        ({"a": {"\ud800": 1}}, InvalidTextError, "extras.a"),
        ({"a": {1: 2}}, InvalidMessageError, "extras.a"),
        ({"a": {1, 2}}, InvalidMessageError, "extras.a"),
        ({"a": b"bytes"}, InvalidMessageError, "extras.a"),
    ],
)
def test_extras_are_strict_json(extras: dict[str, Any], error: type[Exception], field: str) -> None:
    with pytest.raises(error) as info:
        check_message(Message(role=Role.user, content="hi", extras=extras))
    assert type(info.value) is error
    assert info.value.field == field  # type: ignore[attr-defined]


def test_opaque_items_and_gemini_json_results_are_strict_json() -> None:
    opaque = Message(
        role=Role.user,
        content=(OpaquePart(gateway="anthropic", item={"type": "document", "n": float("nan")}),),
    )
    with pytest.raises(InvalidMessageError) as info:
        check_message(opaque)
    assert info.value.field == "content[0].item.n"
    # Gemini decodes a json_results text when it renders it: the door decodes it first.
    result = ToolResultPart(call_id="c1", name="f", content=(TextPart(text="NaN"),))
    message = Message(
        role=Role.tool,
        content=(result,),
        layout={"gateway": "gemini", "json_results": ["c1"]},
    )
    with pytest.raises(InvalidMessageError) as info:
        check_message(message)
    assert info.value.field == "content[0].content"


def test_native_bodies_with_nan_or_deep_values_are_refused_by_parse_request() -> None:
    """A body read with json.loads may hold NaN; parse_request refuses it, typed."""
    bodies: dict[GatewayType, dict[str, Any]] = {
        GatewayType.gemini: {
            "contents": [
                {
                    "role": "model",
                    "parts": [{"functionCall": {"name": "f", "args": {"x": float("nan")}}}],
                }
            ]
        },
        GatewayType.anthropic: {
            "messages": [
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "c", "name": "f", "input": nested(2_000)}
                    ],
                }
            ]
        },
        GatewayType.openai_chat: {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "t", "x": nested(2_000)}]}
            ]
        },
        GatewayType.openai_responses: {
            "input": [{"role": "user", "content": "t", "x": [float("inf")]}]
        },
    }
    for kind, body in bodies.items():
        with pytest.raises(InvalidMessageError):
            get_gateway(kind).parse_request(body)


# -- extras never replace a key a gateway writes ---------------------------------------


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (Message(role=Role.user, content="hi", extras={"role": "system"}), "extras.role"),
        (Message(role=Role.user, content="hi", name="bob", extras={"name": "eve"}), "extras.name"),
        (
            Message(
                role=Role.user,
                content="hi",
                extras={"role": "system"},
                layout={"gateway": "openai_chat"},
            ),
            "extras.role",
        ),
        (
            Message(
                role=Role.assistant,
                content="ok",
                extras={"tool_calls": [{"id": "x", "type": "function", "function": {"name": "f"}}]},
            ),
            "extras.tool_calls",
        ),
        (
            Message(role=Role.user, content=(TextPart(text="hi", extras={"functionCall": {}}),)),
            "content[0].extras.functionCall",
        ),
        (call("{}", function={"name": "g", "arguments": "{}"}), "content[0].extras.function"),
        (
            Message(
                role=Role.assistant,
                content=(
                    ReasoningPart(
                        text="t", signature="s", gateway="anthropic", extras={"signature": "x"}
                    ),
                ),
            ),
            "content[0].extras.signature",
        ),
        (
            Message(
                role=Role.tool,
                content=(ToolResultPart(call_id="c", extras={"tool_call_id": "other"}),),
            ),
            "content[0].extras.tool_call_id",
        ),
        (
            Message(
                role=Role.user,
                content=(ImagePart(url="https://x/a.png", extras={"source": {}}),),
            ),
            "content[0].extras.source",
        ),
    ],
)
def test_extras_never_replace_a_key_a_gateway_writes(message: Message, field: str) -> None:
    """A user message with extras {"role": "system"} rendered as a system message on Chat."""
    with pytest.raises(InvalidMessageError) as info:
        check_message(message)
    assert info.value.field == field
    assert "writes itself; extras never replace it" in str(info.value)


def test_extras_are_checked_against_the_gateway_the_layout_names_only() -> None:
    """Only the named gateway emits extras, so only its keys are reserved."""
    message = Message(
        role=Role.assistant,
        content="ok",
        extras={"tool_calls": "anthropic has no such key"},
        layout={"gateway": "anthropic"},
    )
    check_message(message)
    assert get_gateway(GatewayType.openai_chat).render(message) == [
        {"role": "assistant", "content": "ok"}
    ]


def test_every_declared_key_is_refused_and_render_writes_only_declared_keys() -> None:
    """The declaration is the check: each gateway's message-level keys, both ways."""
    declared = {kind: _declared(kind) for kind in GatewayType}
    for kind, keys in declared.items():
        for key in keys.message:
            with pytest.raises(InvalidMessageError):
                check_message(
                    Message(
                        role=Role.user,
                        content="hi",
                        extras={key: 1},
                        layout={"gateway": kind.value},
                    )
                )
        gateway = get_gateway(kind)
        messages = [
            Message(role=Role.user, content="hi"),
            Message(role=Role.system, content="be brief"),
            call('{"a": 1}'),
            Message(
                role=Role.tool,
                content=(ToolResultPart(call_id="c1", name="f", content=(TextPart(text="r"),)),),
            ),
        ]
        for message in messages:
            for item in gateway.render(message):
                if kind is GatewayType.openai_responses and "role" not in item:
                    continue  # a function_call item: the tool_call element
                assert set(item) <= keys.message | keys.tool_result, (kind, item)


def _declared(kind: GatewayType) -> NativeKeys:
    from turnloom.context import message as module

    return module._DECLARED[kind.value]


# -- layout hints ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "field", "says"),
    [
        (
            {"gateway": "anthropic", "no_is_error": 5},
            "layout.no_is_error",
            "must be a list of strings, not 5",
        ),
        (
            {"gateway": "anthropic", "no_is_error": [5]},
            "layout.no_is_error",
            "must be a list of strings",
        ),
        ({"gateway": "gemini", "snake": "yes"}, "layout.snake", "must be a bool, not 'yes'"),
        (
            {"gateway": "openai_chat", "content": "weird"},
            "layout.content",
            "one of 'list', 'absent'",
        ),
        ({"gateway": "openai_responses", "status": 3}, "layout.status", "must be a string, not 3"),
        (
            {"gateway": "anthropic", "bogus": True},
            "layout.bogus",
            "is not a layout hint of the anthropic",
        ),
        ({"gateway": "mystery"}, "layout.gateway", "no gateway that declared"),
        ({"content": "list"}, "layout", "naming its gateway"),
    ],
)
def test_layout_hints_are_type_checked_at_the_door(
    layout: dict[str, Any], field: str, says: str
) -> None:
    """{"gateway": "anthropic", "no_is_error": 5} crashed render with a TypeError."""
    message = Message(
        role=Role.tool,
        content=(ToolResultPart(call_id="c1", content=(TextPart(text="r"),)),),
        layout=layout,
    )
    with pytest.raises(InvalidMessageError) as info:
        check_message(message)
    assert info.value.field == field
    assert says in str(info.value)


# -- committed values are private copies ---------------------------------------------------


def test_an_admitted_message_holds_copies_of_what_the_caller_passed() -> None:
    """Invariant: check_message sets nothing on the caller's message; admit_message's
    message holds private copies, so the caller's later edits reach nothing held."""
    extras: dict[str, Any] = {"refusal": "alice", "meta": {"tags": ["a"]}}
    layout: dict[str, Any] = {"gateway": "openai_chat", "content": "list"}
    item: dict[str, Any] = {"type": "file", "file": {"id": "f1"}}
    message = Message(
        role=Role.user,
        content=(TextPart(text="hi"), OpaquePart(gateway="openai_chat", item=item)),
        extras=extras,
        layout=layout,
    )
    opaque = message.content[1]
    assert isinstance(opaque, OpaquePart)
    check_message(message)
    assert (message.extras, message.layout, opaque.item) == (extras, layout, item)
    assert message.extras is extras and message.layout is layout and opaque.item is item
    held, _ = admit_message(message)
    before = get_gateway(GatewayType.openai_chat).render(held)
    extras["role"] = "system"
    extras["meta"]["tags"].append("\ud800")
    layout["content"] = 5
    item["file"]["id"] = "\ud800"
    assert get_gateway(GatewayType.openai_chat).render(held) == before
    assert before == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi"}, {"type": "file", "file": {"id": "f1"}}],
            "refusal": "alice",
            "meta": {"tags": ["a"]},
        }
    ]


# -- surrogates in fields msgspec reads ------------------------------------------------------


def test_a_surrogate_role_is_a_typed_error_with_an_encodable_message() -> None:
    with pytest.raises(InvalidTextError) as info:
        decode_message({"role": "\ud800", "content": []})
    str(info.value).encode("utf-8")
    with pytest.raises(InvalidMessageError) as info2:
        check_message(Message(role="\ud800", content=()))  # type: ignore[arg-type]
    assert info2.value.field == "role"
    assert "'\\ud800'" in str(info2.value)
    str(info2.value).encode("utf-8")


def test_responses_input_string_is_checked() -> None:
    gateway = get_gateway(GatewayType.openai_responses)
    with pytest.raises(InvalidTextError):
        gateway.parse_request({"input": "\udc80"})
    assert gateway.parse_request({"input": "hi"}) == [Message(role=Role.user, content="hi")]


# -- limits on the batch, and before decoding -------------------------------------------------


def test_a_turn_over_max_items_is_refused_before_any_message_is_checked() -> None:
    """One turn of 1,000,000 messages with max_items=4096: refused by its length alone.

    The batch holds no Message at all, so any per-message work would raise
    InvalidMessageError instead.
    """
    history = TurnHistory(HistoryLimits(max_items=4096))
    batch = ["not a message"] * 1_000_000
    with pytest.raises(TurnTooLargeError) as info:
        history.commit("t1", batch)  # type: ignore[arg-type]
    assert (info.value.unit, info.value.size, info.value.limit) == ("items", 1_000_000, 4096)
    assert history.turn_ids == ()


def test_a_turn_over_max_bytes_is_refused_at_the_first_message_past_the_limit() -> None:
    one = check_message(Message(role=Role.user, content="x" * 100))
    history = TurnHistory(HistoryLimits(max_bytes=one * 2))
    batch: list[Any] = [Message(role=Role.user, content="x" * 100)] * 3 + ["never checked"]
    with pytest.raises(TurnTooLargeError) as info:
        history.commit("t1", batch)
    assert (info.value.unit, info.value.size, info.value.limit) == ("bytes", one * 3, one * 2)
    history.commit("t1", batch[:2])
    with pytest.raises(TurnTooLargeError) as info:
        history.record("t1", batch[:1])
    assert (info.value.unit, info.value.size) == ("bytes", one * 3)
    assert history.statistics().items == 2


def test_bytes_over_the_cap_are_refused_before_they_are_decoded() -> None:
    """Bytes that are not even JSON past the cap: the size refuses them, not the decoder."""
    data = b'{"role": "user", "content": "' + b"x" * DEFAULT_MAX_MESSAGE_BYTES
    with pytest.raises(ItemTooLargeError) as info:
        decode_message(data)
    assert (info.value.size, info.value.limit) == (len(data), DEFAULT_MAX_MESSAGE_BYTES)
    with pytest.raises(ItemTooLargeError):
        decode_message(data.decode())
    small = msgspec.json.encode({"role": "user", "content": "y" * 200})
    with pytest.raises(ItemTooLargeError) as info:
        decode_message(msgspec.json.decode(small), max_bytes=100)
    # A dict is measured by the message's own encoding, once checked.
    assert info.value.size == check_message(Message(role=Role.user, content="y" * 200))
    assert decode_message(small, max_bytes=None).text == "y" * 200


@pytest.mark.parametrize(
    "data",
    [
        b"[" * 100_000,
        b'{"role": "user", "content": ' + b"[" * 5_000,
        '{"role": "user", "extras": ' + nested_text(3_000) + "}",
    ],
)
def test_deep_json_bytes_are_a_typed_error_from_decode_message(data: bytes | str) -> None:
    with pytest.raises(InvalidMessageError):
        decode_message(data)


# -- error messages quote a short escaped excerpt ----------------------------------------------


def test_errors_quote_at_most_a_short_escaped_excerpt() -> None:
    """A 1 MiB bad id gave a 1 MiB message; a raw newline forged a log line."""
    huge = "i" * (1024 * 1024)
    message = Message(
        role=Role.assistant,
        content=(ToolCallPart(call_id=huge, name="f"), ToolCallPart(call_id=huge, name="g")),
    )
    with pytest.raises(DuplicateIdError) as info:
        check_message(message)
    assert len(str(info.value)) < 200
    forged = "x\nERROR forged line"
    with pytest.raises(InvalidMessageError) as info2:
        check_message(Message(role=forged, content=()))  # type: ignore[arg-type]
    assert "\n" not in str(info2.value)
    assert "'x\\nERROR forged line'" in str(info2.value)
    with pytest.raises(TurnloomError) as info3:
        TurnHistory().commit(huge, [Message(role=Role.user, content="hi")])
    assert len(str(info3.value)) < 200


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("a\nb", "'a\\nb'"),
        ("\ud800", "'\\ud800'"),
        ("\u202eevil", "'\\u202eevil'"),
        (b"\x00" * 3, "b'\\x00\\x00\\x00'"),
        (5, "5"),
    ],
)
def test_excerpt_escapes_like_repr(value: object, expected: str) -> None:
    assert excerpt(value) == expected


@pytest.mark.parametrize(
    "value",
    ["z" * 10**6, b"z" * 10**6, list(range(10**5)), nested(2_000), 10**5000],
    ids=["str", "bytes", "list", "nested", "int"],
)
def test_excerpt_is_short_for_any_value(value: object) -> None:
    text = excerpt(value)
    assert len(text) <= EXCERPT_LIMIT
    assert "..." in text


def test_json_text_round_trip_of_the_door_value() -> None:
    """A value the door accepted encodes with allow_nan=False and msgspec alike."""
    value = decode_json_text('{"a": [1, 2.5, "\\ud83c\\udf89", null, true]}')
    assert json.loads(json.dumps(value, allow_nan=False)) == msgspec.json.decode(
        msgspec.json.encode(value)
    )


@pytest.mark.parametrize(
    ("value", "kind"),
    [(float("nan"), "float"), (float("inf"), "float"), (5, "int"), (b"sig", "bytes")],
)
def test_an_optional_string_field_of_another_type_is_refused(value: object, kind: str) -> None:
    """Invariant: a non-string in an optional string field never passes the door.

    The JSON encoder writes NaN and infinity as ``null``, so the encode-decode
    type check alone accepted ``signature=nan`` (found by scripts/fuzz_door.py).
    """
    message = Message(
        role=Role.assistant,
        content=(ReasoningPart(text="t", signature=value, gateway="anthropic"),),  # type: ignore[arg-type]
    )
    with pytest.raises(InvalidMessageError) as caught:
        check_message(message, where="m")
    assert caught.value.field == "content[0].signature"
    assert str(caught.value) == (
        f"m content[0].signature must be a string or None, not an object of type {kind}."
    )


_json_texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=8)
_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _json_texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_json_texts, inner, max_size=3),
    max_leaves=12,
)


def _shape(value: Any) -> Any:
    """``value`` with each node's exact type beside it (``==`` alone equates 1 and True)."""
    if isinstance(value, dict):
        return (dict, [(k, _shape(v)) for k, v in value.items()])
    if isinstance(value, list):
        return (list, [_shape(v) for v in value])
    return (type(value), value)


@settings(max_examples=300, deadline=None)
@given(value=_json_values, ascii_only=st.booleans())
def test_json_text_the_door_skips_copying_decodes_to_what_the_strict_copy_gives(
    value: Any, ascii_only: bool
) -> None:
    """Invariant: ``decode_json_text`` equals the strict copy of msgspec's value, types included.

    Whether or not the copy is skipped (ASCII text without a ``\\u`` escape
    and with at most MAX_JSON_DEPTH brackets), the value is the same.
    """
    text = json.dumps(value, ensure_ascii=ascii_only)
    expected = _strict_copy(msgspec.json.decode(text), "value", "")
    assert _shape(decode_json_text(text)) == _shape(expected)


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        (
            '{"a": "\\ud800"}',
            InvalidTextError,
            "call arguments.a holds a lone surrogate (not valid UTF-8): '\\ud800'.",
        ),
        (
            '["\\udfff", 1]',
            InvalidTextError,
            "call arguments[0] holds a lone surrogate (not valid UTF-8): '\\udfff'.",
        ),
        (
            "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1),
            InvalidMessageError,
            "call arguments" + "[0]" * 8 + ".… nests JSON deeper than 64 levels.",
        ),
    ],
)
def test_json_text_the_copy_would_refuse_is_still_refused(
    text: str, error: type[Exception], message: str
) -> None:
    """Invariant: text that is not strict JSON raises the same typed error, naming the path."""
    with pytest.raises(error) as info:
        decode_json_text(text, where="call", field="arguments")
    assert type(info.value) is error
    assert str(info.value) == message


def test_brackets_inside_strings_only_take_the_copying_path() -> None:
    """Many brackets in strings (no real nesting) pass, with the value unchanged."""
    text = json.dumps({"s": "[" * 200, "t": ["{" * 70]})
    assert decode_json_text(text) == {"s": "[" * 200, "t": ["{" * 70]}


def test_flat_ascii_extras_are_held_as_a_private_copy() -> None:
    """Invariant: a host changing its flat extras dict after the door changes nothing held."""
    extras = {"cache": "ephemeral", "kind": "x"}
    part = ToolResultPart(call_id="c1", content=(TextPart(text="r"),), extras=extras)
    message = Message(role=Role.tool, content=(part,))
    check_message(message)
    assert message.tool_results[0].extras is extras
    admitted = admit_message(message)[0]
    held = admitted.tool_results[0].extras
    assert held == {"cache": "ephemeral", "kind": "x"}
    assert held is not extras
    extras["role"] = "system"
    extras["cache"] = "\ud800"
    assert admitted.tool_results[0].extras == {"cache": "ephemeral", "kind": "x"}


@settings(max_examples=300, deadline=None)
@given(value=_json_values, depth=st.sampled_from([0, 1, MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH]))
def test_strict_copy_is_an_equal_private_copy_or_the_depth_error(value: Any, depth: int) -> None:
    """Invariant: ``_strict_copy`` gives the value (tuples as lists) in new containers.

    Flat objects of ASCII strings and ASCII strings take a shortcut; a
    container at the depth cap is refused whatever its content.
    """
    if depth == MAX_JSON_DEPTH and isinstance(value, dict | list):
        with pytest.raises(InvalidMessageError, match="nests JSON deeper than 64 levels"):
            _strict_copy(value, "v", "f", depth)
        return
    try:
        copy = _strict_copy(value, "v", "f", depth)
    except InvalidMessageError as exc:
        assert "nests JSON deeper" in str(exc)
        return
    assert _shape(copy) == _shape(value)
    if isinstance(value, dict | list):
        assert copy is not value

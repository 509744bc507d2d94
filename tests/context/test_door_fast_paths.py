"""The door's fast paths decide exactly what its slow paths decide.

``check_message`` skips its typing decode for a message whose fields its own
checks typed (exact classes); ``_strict_copy`` copies ASCII strings and flat
objects of ASCII strings without its general walk; ``decode_json_text`` skips
the strict copy of provably strict text; ``IssuedPrefixes`` renames a
continuation's items in one pass. Each test below compares a fast path with
the slow path it replaces, on adversarial input, or pins a hole the decode
left open (text that is not a str but encodes as a JSON string).
"""

from __future__ import annotations

import datetime
import decimal
import enum
import json
import math
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnloom.context import (
    GatewayType,
    ImagePart,
    Message,
    OpaquePart,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    admit_message,
    check_message,
    get_gateway,
)
from turnloom.context.callids import CallIdRenamer, rename_call_ids
from turnloom.context.message import MAX_JSON_DEPTH, _strict_copy, decode_json_text
from turnloom.errors import InvalidMessageError, TurnloomError
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot

_DECODER = msgspec.json.Decoder(Message)


class _Str(str):
    pass


class _Dict(dict):  # type: ignore[type-arg]
    pass


class _Colour(enum.Enum):
    red = "red"


class _Retagged(ToolCallPart, frozen=True, tag="weird"):
    """A tool call class whose encoding carries another tag."""


class _SlowMessage(Message, frozen=True):
    """A Message the door checks with its typing decode (not its exact class)."""


def _fs(obj: Any, name: str, value: object) -> Any:
    msgspec.structs.force_setattr(obj, name, value)
    return obj


# Values msgspec encodes as a JSON string though they are no str.
_STRING_LIKE: tuple[tuple[object, str], ...] = (
    (b"x", "bytes"),
    (bytearray(b"x"), "bytearray"),
    (memoryview(b"x"), "memoryview"),
    (uuid.UUID(int=1), "UUID"),
    (datetime.date(2026, 1, 2), "date"),
    (decimal.Decimal("1.5"), "Decimal"),
    (_Colour.red, "_Colour"),
)


def _text_holders(value: object) -> list[tuple[Message, str]]:
    """Messages holding ``value`` as a text, with the field the door names."""
    return [
        (Message(role=Role.user, content=(_fs(TextPart(text="x"), "text", value),)), "content[0]"),
        (
            Message(
                role=Role.tool,
                content=(
                    ToolResultPart(call_id="c", content=(_fs(TextPart(text="x"), "text", value),)),
                ),
            ),
            "content[0].content[0]",
        ),
        (
            Message(
                role=Role.assistant,
                content=(TextPart(text="a"), _fs(ReasoningPart(text="t"), "text", value)),
            ),
            "content[1]",
        ),
        (
            _SlowMessage(role=Role.user, content=(_fs(TextPart(text="x"), "text", value),)),
            "content[0]",
        ),
    ]


@pytest.mark.parametrize(("value", "kind"), _STRING_LIKE, ids=[k for _, k in _STRING_LIKE])
def test_a_text_that_is_no_str_but_encodes_as_a_string_is_refused(value: object, kind: str) -> None:
    """Regression: bytes, UUID, date, Decimal or Enum text passed the door and reached renders.

    The typing decode reads the encoding, where these are JSON strings, so it
    passed them (both before and after the fast path); a render then carried
    bytes into the request, or raised TypeError (a Gemini tool result).
    """
    for message, field in _text_holders(value):
        with pytest.raises(InvalidMessageError) as info:
            check_message(message, where="m")
        assert type(info.value) is InvalidMessageError
        assert str(info.value) == f"m {field}.text must be a string, not an object of type {kind}."
        assert info.value.field == f"{field}.text"


def test_a_text_the_decode_refuses_keeps_the_decode_error() -> None:
    """An int text is refused by the typing decode first, with its message, as before."""
    message = Message(role=Role.user, content=(_fs(TextPart(text="x"), "text", 7),))
    with pytest.raises(InvalidMessageError) as info:
        check_message(message, where="m")
    assert str(info.value) == (
        "m has a field of the wrong type: 'Expected `str`, got `int` - at `$.content[0].text`'."
    )


def test_bytes_tool_result_text_is_refused_at_accept_turn_on_gemini() -> None:
    """Regression: it raised TypeError while rendering at accept_turn; now a typed refusal.

    Invariant: the refused turn changes nothing (turns and prepared items).
    """

    async def main() -> None:
        async with Foundation(gateway=GatewayType.gemini) as foundation:
            manager = foundation.manager
            first = Message(role=Role.user, content="hi")
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(first,)))
            before = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
            bad = Message(
                role=Role.tool,
                content=(
                    ToolResultPart(
                        call_id="c1", content=(_fs(TextPart(text="x"), "text", b"payload"),)
                    ),
                ),
            )
            with pytest.raises(InvalidMessageError) as info:
                manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(bad,)))
            assert str(info.value) == (
                "Turn 't2' input[0] content[0].content[0].text must be a string, "
                "not an object of type bytes."
            )
            history = manager.history("c")
            assert history.turn_ids == ("t1",)
            assert history.turn_messages("t1") == (first,)
            after = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
            assert after.items == before.items

    anyio.run(main)


def test_arguments_of_a_str_subclass_are_refused_typed() -> None:
    """Regression: msgspec raised TypeError on a str subclass (not a TurnloomError)."""
    for text, problem in (
        ("hi", "is not strict JSON ('Expecting value: line 1 column 1 (char 0)')."),
        ('{"a": 1}', None),
    ):
        message = Message(
            role=Role.assistant,
            content=(ToolCallPart(call_id="c", name="f", arguments=_Str(text)),),
        )
        with pytest.raises(InvalidMessageError) as info:
            check_message(message, where="m")
        if problem is not None:
            assert str(info.value) == f"m content[0].arguments {problem}"
        else:  # the arguments pass; the encoder refuses the subclass, as for blank ones
            assert str(info.value) == (
                "m holds a value that is not JSON: 'Encoding objects of type _Str is unsupported'."
            )
    value = decode_json_text(_Str('{"a": [1, "b"]}'))
    assert value == {"a": [1, "b"]}
    assert type(value) is dict


_ODD = st.sampled_from(
    [
        "t",
        "h\u00e9",
        "",
        "\ud800",
        _Str("s"),
        7,
        0,
        1,
        True,
        False,
        None,
        1.5,
        math.nan,
        math.inf,
        10**40,
        b"x",
        bytearray(b"x"),
        uuid.UUID(int=3),
        decimal.Decimal("2"),
        ["a"],
        ("a",),
        {"k": "v"},
        _Colour.red,
    ]
)
_EXTRAS = st.sampled_from(
    [
        None,
        {"x_a": "b"},
        {"x_a": "\u00e9"},
        {"x_a": "\udfff"},
        {"\ud800": "b"},
        {1: "b"},
        {_Str("k"): "v"},
        {"x_a": _Str("v")},
        {"x_a": math.nan},
        {"x_a": [1, {"b": (2, 3)}]},
        {"x_a": b"x"},
        {"role": "system"},
        "not a dict",
    ]
)


_Spec = tuple[type, dict[str, Any]]


def _make(spec: _Spec) -> Any:
    """A fresh part from ``spec``: its class's default, then each field set as given."""
    cls, fields = spec
    part = cls(**_REQUIRED[cls])
    for name, value in fields.items():
        if name == "content":
            value = tuple(_make(inner) for inner in value)
        elif isinstance(value, dict) and name == "item":
            value = _Dict(value)  # a dict subclass, copied each time
        _fs(part, name, value)
    return part


_REQUIRED: dict[type, dict[str, Any]] = {
    TextPart: {"text": ""},
    ImagePart: {"url": "u"},
    OpaquePart: {"gateway": "anthropic", "item": {}},
    ToolResultPart: {"call_id": "c1"},
    ToolCallPart: {"call_id": "c1", "name": "f"},
    ReasoningPart: {"gateway": "anthropic"},
}


@st.composite
def _leaves(draw: st.DrawFn) -> _Spec:
    kind = draw(st.sampled_from([TextPart, ImagePart, OpaquePart]))
    if kind is OpaquePart:
        item = draw(st.sampled_from([{"type": "x"}, {"type": "\u00e9"}, {"v": math.inf}, []]))
        return (kind, {"item": item})
    name = "text" if kind is TextPart else "url"
    return (kind, {name: draw(_ODD), "extras": draw(_EXTRAS)})


@st.composite
def _parts(draw: st.DrawFn) -> _Spec:
    shape = draw(st.sampled_from(["leaf", "result", "call", "reasoning"]))
    if shape == "leaf":
        return draw(_leaves())
    if shape == "result":
        return (
            ToolResultPart,
            {
                "content": draw(st.lists(_leaves(), max_size=2)),
                "is_error": draw(_ODD | st.booleans()),
                "extras": draw(_EXTRAS),
            },
        )
    if shape == "call":
        arguments = ['{"a": 1}', '{"a": "\\ud800"}', '{"a": NaN}', "[1]", "", _Str("{}")]
        return (ToolCallPart, {"arguments": draw(st.sampled_from(arguments))})
    return (ReasoningPart, {"text": draw(_ODD)})


@st.composite
def _message_specs(draw: st.DrawFn) -> tuple[Role, list[_Spec], Any]:
    """A message with odd field values, as specs (built fresh for each check)."""
    role = draw(st.sampled_from([Role.user, Role.tool, Role.assistant]))
    return (role, draw(st.lists(_parts(), max_size=3)), draw(_EXTRAS))


def _build(kind: type[Message], spec: tuple[Role, list[_Spec], Any]) -> Message:
    role, parts, extras = spec
    return kind(role=role, content=tuple(_make(p) for p in parts), extras=extras)


def _outcome(message: Message) -> tuple[Any, ...]:
    try:
        return ("ok", check_message(message, where="m"))
    except TurnloomError as exc:
        return (type(exc), str(exc), getattr(exc, "field", None))


@settings(max_examples=300, deadline=None)
@given(spec=_message_specs())
def test_the_skipped_decode_decides_as_the_decode_would(
    spec: tuple[Role, list[_Spec], Any],
) -> None:
    """Invariant: an exact message (decode skipped when typed) and the same message
    checked with the decode (a subclass) get the same answer; an accepted message
    round-trips its encoding to an equal message, every text a str.
    """
    fast, slow = _build(Message, spec), _build(_SlowMessage, spec)
    outcome = _outcome(fast)
    assert outcome == _outcome(slow)
    if outcome[0] == "ok":
        held = admit_message(fast, where="m")[0]
        decoded = _DECODER.decode(msgspec.json.encode(held))
        assert decoded == held
        assert msgspec.json.encode(decoded) == msgspec.json.encode(held)


_FLAT = st.one_of(
    st.text(max_size=4),
    st.sampled_from(["\ud800", "a\udfff", {"a": "\ud800"}, {"\udc80": "a"}, {"\u00e9": "b"}]),
    st.builds(_Str, st.text(max_size=3)),
    st.dictionaries(
        st.one_of(st.text(max_size=3), st.builds(_Str, st.text(max_size=2)), st.integers()),
        st.one_of(
            st.text(max_size=3),
            st.builds(_Str, st.text(max_size=2)),
            st.integers(),
            st.floats(),
            st.none(),
        ),
        max_size=3,
    ),
    st.builds(_Dict, st.dictionaries(st.text(max_size=2), st.text(max_size=2), max_size=2)),
)


@settings(max_examples=300, deadline=None)
@given(value=_FLAT, depth=st.sampled_from([1, 2, MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH]))
def test_the_strict_copy_shortcuts_equal_the_general_walk(value: Any, depth: int) -> None:
    """Invariant: ``_strict_copy`` of a value equals the walk's copy of it inside a list.

    The list wrapper sends ``value`` through the general walk one level
    deeper; the answer (types included) or the error (class and message,
    the ``[0]`` of the wrapper aside) is the same.
    """

    def run(thunk: Callable[[], Any]) -> Any:
        try:
            return ("ok", _typed(thunk()))
        except TurnloomError as exc:
            return (type(exc), str(exc).replace("f[0]", "f"))

    direct = run(lambda: _strict_copy(value, "v", "f", depth))
    walked = run(lambda: _strict_copy([value], "v", "f", depth - 1)[0])
    assert direct == walked


def _typed(value: Any) -> Any:
    if isinstance(value, dict):
        return (type(value), [(type(k), k, _typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return (list, [_typed(v) for v in value])
    if isinstance(value, float) and math.isnan(value):
        return (float, "nan")
    return (type(value), value)


def _nested(levels: int, leaf: str = "1") -> str:
    return '{"a": ' * levels + leaf + "}" * levels


@pytest.mark.parametrize(
    "text",
    [
        _nested(MAX_JSON_DEPTH - 1),
        _nested(MAX_JSON_DEPTH),
        _nested(MAX_JSON_DEPTH + 1),
        _nested(MAX_JSON_DEPTH, '"\\u0041"'),
        _nested(MAX_JSON_DEPTH + 1, '"\\u0041"'),
        _nested(MAX_JSON_DEPTH, '"\u00e9"'),
        _nested(MAX_JSON_DEPTH, '"\\ud800"'),
        '{"a": ' + "[" * (MAX_JSON_DEPTH - 1) + "1" + "]" * (MAX_JSON_DEPTH - 1) + "}",
        '{"a": ' + "[" * MAX_JSON_DEPTH + "1" + "]" * MAX_JSON_DEPTH + "}",
        '{"a": [{"b": [' * 21 + "1" + "]}]" * 21 + "}",
        '{"a": "' + "[" * 70 + '"}',
        '{"a": ' + "9" * 400 + "}",
        '{"a": 1e400}',
        '{"a": -0}',
        '{"a": "\\\\u"}',
    ],
)
def test_provably_strict_json_text_decodes_as_the_strict_copy(text: str) -> None:
    """Invariant: with or without the copy skipped, the value or the typed error is the same.

    The reference decodes with json (constants refused) and strictly copies.
    """

    def reject(name: str) -> Any:
        raise ValueError(name)

    def outcome(thunk: Callable[[], Any]) -> Any:
        try:
            return ("ok", _typed(thunk()))
        except TurnloomError as exc:
            return (type(exc), str(exc))
        except ValueError:
            return ("not json",)

    got = outcome(lambda: decode_json_text(text, where="w", field="f"))
    reference = outcome(lambda: _strict_copy(json.loads(text, parse_constant=reject), "w", "f"))
    if reference == ("not json",) or text.endswith("1e400}"):
        assert got[0] is InvalidMessageError
    else:
        assert got == reference


@pytest.mark.parametrize("gateway", list(GatewayType))
def test_renaming_a_continuation_in_one_pass_equals_renaming_each_message(
    gateway: GatewayType,
) -> None:
    """Invariant: ``rename_call_ids`` is sequential, so one pass over all items of a
    continuation equals per-message passes sharing the renamer (what build did before).
    """
    native = get_gateway(gateway)
    messages = [
        Message(
            role=Role.assistant,
            content=(ToolCallPart(call_id="c1", name="f"), ToolCallPart(call_id="c2", name="f")),
        ),
        Message(
            role=Role.tool, content=(ToolResultPart(call_id="c1", content=(TextPart(text="a"),)),)
        ),
        Message(
            role=Role.tool, content=(ToolResultPart(call_id="c2", content=(TextPart(text="b"),)),)
        ),
        Message(role=Role.assistant, content=(ToolCallPart(call_id="c1", name="g"),)),
        Message(
            role=Role.tool, content=(ToolResultPart(call_id="c1", content=(TextPart(text="c"),)),)
        ),
        Message(role=Role.assistant, content=(ToolCallPart(call_id="c1", name="h"),)),
    ]
    renders = [native.render(m) for m in messages]
    start = CallIdRenamer()
    rename_call_ids(gateway, [i for r in renders[:1] for i in r], start)
    one, each = start.copy(), start.copy()
    in_one_pass = rename_call_ids(gateway, [i for r in renders[1:] for i in r], one)
    per_message = [i for r in renders[1:] for i in rename_call_ids(gateway, r, each)]
    assert in_one_pass == per_message
    assert one.renamed == each.renamed
    assert [("c1" in one), ("c1#2" in one)] == [("c1" in each), ("c1#2" in each)]


def test_a_part_subclass_with_another_tag_is_refused_by_the_decode() -> None:
    """A subclass of a part class is typed by the decode, even in an exact Message.

    Its encoding carries its own tag, which no part of the union has.
    """
    message = Message(role=Role.assistant, content=(_Retagged(call_id="c1", name="f"),))
    with pytest.raises(InvalidMessageError) as info:
        check_message(message, where="m")
    assert str(info.value) == (
        "m has a field of the wrong type: \"Invalid value 'weird' - at `$.content[0].type`\"."
    )


def _result_message(part: ToolResultPart) -> Message:
    return Message(role=Role.tool, content=(part,))


@pytest.mark.parametrize(
    ("part", "field", "problem"),
    [
        (
            ToolResultPart(call_id="c", name=3),  # type: ignore[arg-type]
            "content[0].name",
            "m content[0].name must be a string or None, not an object of type int.",
        ),
        (
            ToolResultPart(call_id="c", name=math.nan),  # type: ignore[arg-type]
            "content[0].name",
            "m content[0].name must be a string or None, not an object of type float.",
        ),
        (
            ToolResultPart(call_id="", name="f"),
            "content[0].call_id",
            "m content[0].call_id must be a non-empty string.",
        ),
        (
            ToolResultPart(call_id="c", content=(TextPart(text="t", extras={"type": "x"}),)),
            "content[0].content[0].extras.type",
            "m content[0].content[0].extras holds 'type', a key the a gateway writes itself; "
            "extras never replace it.",
        ),
        (
            ToolResultPart(call_id="c", extras={"tool_call_id": "d"}),
            "content[0].extras.tool_call_id",
            "m content[0].extras holds 'tool_call_id', a key the a gateway writes itself; "
            "extras never replace it.",
        ),
    ],
)
def test_each_malformed_field_of_a_tool_result_is_refused_by_its_inline_test(
    part: ToolResultPart, field: str, problem: str
) -> None:
    """Invariant (the result branch of check_message tests its common case inline and
    calls the rule's helper otherwise): each malformed field of a result of the exact
    classes (whose typing decode is skipped) still gets its typed error, naming the
    field. Mutants tried: skipping the name test, and the extras of a result's text
    (each let its case through)."""
    with pytest.raises(InvalidMessageError) as info:
        check_message(_result_message(part), where="m")
    assert (str(info.value), info.value.field) == (problem, field)


def test_the_extras_of_a_results_text_are_copied_at_the_door() -> None:
    """Invariant (private copies): the extras of a text inside a tool result are the
    door's copy once checked; changing the caller's dict changes nothing held."""
    extras = {"cache_control": {"type": "ephemeral"}}
    text = TextPart(text="t", extras=extras)
    message = _result_message(ToolResultPart(call_id="c", name="f", content=(text,)))
    check_message(message, where="m")
    assert message.parts[0].content[0].extras is extras  # type: ignore[union-attr]
    admitted = admit_message(message, where="m")[0]
    extras["cache_control"]["type"] = "changed"
    held = admitted.parts[0].content[0]  # type: ignore[union-attr]
    assert type(held) is TextPart
    assert held.extras == {"cache_control": {"type": "ephemeral"}}
    assert held.extras is not extras

"""A refused value's type is named one way everywhere: ``errors.what_type``.

Invariants: the phrase is "an object of type X" (grammatical for any name, never
"a int"); a type name that is not a short identifier is quoted through
``excerpt`` so a host class cannot flood or forge a message line; the door's
messages use the phrase verbatim.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from turnloom.context import (
    Message,
    Role,
    ToolCallPart,
    ToolResultPart,
    check_message,
    plan_collection,
)
from turnloom.context.tokens import count_tokens
from turnloom.errors import (
    TYPE_NAME_LIMIT,
    DuplicateIdError,
    HostCallbackError,
    InputError,
    InvalidMessageError,
    type_name,
    what_type,
)
from turnloom.runtime import Foundation, TurnSnapshot


@pytest.mark.parametrize(
    ("value", "phrase"),
    [
        (5, "an object of type int"),
        (None, "an object of type NoneType"),
        ({"role": "user"}, "an object of type dict"),
        (iter([]), "an object of type list_iterator"),
    ],
)
def test_what_type_says_an_object_of_type_and_the_plain_name(value: object, phrase: str) -> None:
    assert what_type(value) == phrase


def test_a_type_name_at_the_limit_is_printed_as_it_is() -> None:
    name = "T" * TYPE_NAME_LIMIT
    assert type_name(type(name, (), {})()) == name


def test_a_long_or_multiline_type_name_is_quoted_and_escaped() -> None:
    """A host class named with type() cannot flood a message or forge a log line."""
    long = type("T" * (TYPE_NAME_LIMIT + 1), (), {})()
    assert type_name(long) == repr("T" * (TYPE_NAME_LIMIT + 1))
    forged = type("Counter\nERROR forged", (), {})()
    assert what_type(forged) == "an object of type 'Counter\\nERROR forged'"


def test_the_door_refuses_a_non_message_naming_its_type() -> None:
    with pytest.raises(InvalidMessageError) as caught:
        check_message(5, where="turn 't1' messages[0]")
    assert (
        str(caught.value)
        == "turn 't1' messages[0] is an object of type int, not a turnloom Message."
    )


@pytest.mark.anyio
async def test_a_dict_given_as_a_message_is_told_how_to_become_one() -> None:
    """A provider-native dict in place of a Message: the refusal names the two ways to a Message.

    Covers the door (check_message) and record on a manager; nothing is recorded.
    """
    hint = (
        " Build one with Message(role=Role.user, content=...), or convert a"
        " provider-native item with manager.gateway.parse(item)."
    )
    item = {"role": "assistant", "content": "hi"}
    with pytest.raises(InvalidMessageError) as caught:
        check_message(item, where="turn 't1' messages[0]")
    assert str(caught.value) == (
        "turn 't1' messages[0] is an object of type dict, not a turnloom Message." + hint
    )
    async with Foundation(gateway="openai_chat") as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(
                context_id="c", turn_id="t1", input=(Message(role=Role.user, content="hi"),)
            )
        )
        with pytest.raises(InvalidMessageError) as recorded:
            manager.record("c", "t1", [item])  # type: ignore[list-item]
        assert str(recorded.value).endswith("not a turnloom Message." + hint)
        assert manager.history("c").turn_messages("t1") == (Message(role=Role.user, content="hi"),)
        assert manager.gateway.parse(item) == Message(role=Role.assistant, content="hi")
        with pytest.raises(DuplicateIdError) as again:
            manager.accept_turn(
                TurnSnapshot(
                    context_id="c", turn_id="t1", input=(Message(role=Role.user, content="again"),)
                )
            )
        assert str(again.value) == (
            "Turn 't1' was already committed to this context; each turn of a context "
            "takes a new turn_id."
        )


def test_a_str_tool_result_and_dict_arguments_are_told_their_shape() -> None:
    """The two shapes a newcomer gets wrong first: the refusal shows the right one."""
    result = ToolResultPart(call_id="c1", content="Gate 4")  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError) as caught:
        check_message(Message(role=Role.tool, content=(result,)), where="m")
    assert str(caught.value) == (
        "m content[0].content must be a tuple of parts, not an object of type str; "
        "for text, (TextPart(text=...),)."
    )
    assert caught.value.field == "content[0].content"
    call = ToolCallPart(call_id="c1", name="f", arguments={"x": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError) as caught:
        check_message(Message(role=Role.assistant, content=(call,)), where="m")
    assert str(caught.value) == (
        "m content[0].arguments must be JSON text (str), not an object of type dict; "
        "for a dict, json.dumps(arguments)."
    )
    assert caught.value.field == "content[0].arguments"


def test_plan_collection_names_both_refused_types() -> None:
    ranges: object = None
    retired: object = {0: True}
    with pytest.raises(InputError) as caught:
        plan_collection(ranges, retired)  # type: ignore[arg-type]
    assert str(caught.value) == (
        "plan_collection takes sequences of EffectRange and of bool, not an object of type "
        "NoneType and an object of type dict."
    )


def test_a_counter_with_a_forged_name_is_quoted_in_its_refusal() -> None:
    """The counter's own name is printed by type_name as well."""

    def count(self: object, messages: Sequence[Message]) -> object:
        return "3"

    counter = type("Tok\nERROR", (), {"count": count})()
    with pytest.raises(HostCallbackError) as caught:
        count_tokens(counter, [Message(role="user", content="hi")])  # type: ignore[arg-type]
    assert str(caught.value) == (
        "The token counter 'Tok\\nERROR' returned an object of type str ('3'), not an int "
        "count of tokens."
    )

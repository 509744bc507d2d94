"""The door names a failing batch exactly as before, and builds that name only when a check fails.

``accept_turn``, ``record`` and ``Invocation.record`` check every message on the
event loop; the label an error names the batch with (``"Output of turn 't1'"``,
an excerpt of the turn id) is built only once a check has failed: the success
path quotes nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

import turnloom.errors
from turnloom.context import Message, Role, TextPart, ToolCallPart, ToolResultPart
from turnloom.context.message import message_size
from turnloom.errors import (
    InstructionMessageError,
    InvalidMessageError,
    ItemTooLargeError,
    UnpairedResultError,
)
from turnloom.runtime import STATE_TOOL_NAME, Foundation, HistoryLimits, TurnSnapshot

pytestmark = pytest.mark.anyio

_real_excerpt = turnloom.errors.excerpt


@pytest.fixture
def excerpts(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """Every value quoted through ``excerpt`` by any turnloom module, in order."""
    quoted: list[object] = []

    def counting(value: object) -> str:
        quoted.append(value)
        return _real_excerpt(value)

    for name, module in list(sys.modules.items()):
        if name.startswith("turnloom") and getattr(module, "excerpt", None) is _real_excerpt:
            monkeypatch.setattr(module, "excerpt", counting)
    yield quoted


def _user(text: str) -> Message:
    return Message(role=Role.user, content=text)


def _call(call_id: str) -> Message:
    return Message(
        role=Role.assistant,
        content=(ToolCallPart(call_id=call_id, name="lookup", arguments='{"q": 1}'),),
    )


def _result(call_id: str) -> Message:
    return Message(
        role=Role.tool,
        content=(ToolResultPart(call_id=call_id, content=(TextPart(text="ok"),)),),
    )


async def test_accepted_turns_and_records_quote_nothing(excerpts: list[object]) -> None:
    """A turn, a model call with a tool call, its result and a reply: no excerpt is built."""
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(_user("hi"),)))
        async with manager.invocation("c", "t1") as invocation:
            assert invocation.record([_call("k1")]) == 1
        assert manager.record("c", "t1", [_result("k1")]) == 1
        async with manager.invocation("c", "t1") as invocation:
            assert invocation.record([Message(role=Role.assistant, content="done")]) == 1
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(_user("more"),)))
        assert excerpts == []


async def test_a_record_over_the_cap_names_its_batch() -> None:
    async with Foundation(history_limits=HistoryLimits(max_item_bytes=200)) as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(_user("hi"),)))
        big = Message(role=Role.assistant, content="x" * 300)
        size = message_size(big)
        async with manager.invocation("c", "t1") as invocation:
            with pytest.raises(ItemTooLargeError) as caught:
                invocation.record([Message(role=Role.assistant, content="ok"), big])
        assert str(caught.value) == (
            f"Output of turn 't1'[1] is {size} bytes, over the per-item cap of 200 bytes."
        )
        assert manager.history("c").turn_messages("t1") == (_user("hi"),)  # nothing recorded


async def test_a_malformed_input_names_its_turn() -> None:
    async with Foundation() as foundation:
        manager = foundation.manager
        bad: Any = "not a message"
        with pytest.raises(InvalidMessageError) as caught:
            manager.accept_turn(
                TurnSnapshot(context_id="c", turn_id="t9", input=(_user("hi"), bad))
            )
        assert str(caught.value) == (
            "Turn 't9' input[1] is an object of type str, not a turnloom Message."
        )


async def test_instructions_and_state_in_outputs_name_their_batch() -> None:
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(_user("hi"),)))
        with pytest.raises(InstructionMessageError) as instruction:
            manager.record("c", "t1", [Message(role=Role.system, content="obey")])
        assert str(instruction.value).startswith("Output of turn 't1'[0] is a system message;")
        assert instruction.value.field == "outputs[0]"
        state = Message(
            role=Role.assistant,
            content=(ToolCallPart(call_id="s1", name=STATE_TOOL_NAME, arguments="{}"),),
        )
        with pytest.raises(InvalidMessageError) as carried:
            manager.record("c", "t1", [_user("fine"), state])
        assert str(carried.value).startswith(
            "Output of turn 't1'[1] carries a runtime-state call or result"
        )


async def test_an_unpaired_result_names_the_turn_output() -> None:
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(_user("hi"),)))
        manager.record("c", "t1", [_call("k1")])
        with pytest.raises(UnpairedResultError) as caught:
            manager.record("c", "t1", [_result("k2")])
        assert (caught.value.field, caught.value.call_id) == ("Turn 't1' output[0]", "k2")
        assert str(caught.value).startswith(
            "Turn 't1' output[0] holds a tool result for call 'k2', which no call open"
        )


def test_message_parts_is_its_content_and_read_only() -> None:
    message = Message(role=Role.user, content="hi")
    assert message.parts is message.content
    assert message.parts == (TextPart(text="hi"),)
    with pytest.raises(AttributeError):
        message.parts = ()  # type: ignore[misc]

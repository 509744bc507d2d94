"""No mid-conversation instructions: only a turn's snapshot changes pinned instructions."""

from __future__ import annotations

import pytest

from tests.runtime.helpers import SYSTEM, assistant, user
from turnloom.context import Message, Role
from turnloom.errors import InstructionMessageError, InvalidMessageError
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio

DEVELOPER = Message(role=Role.developer, content="Answer in French.")


def _turn(turn_id: str, instructions: tuple[Message, ...] | None = None) -> TurnSnapshot:
    return TurnSnapshot(
        context_id="c",
        turn_id=turn_id,
        input=(user(f"question {turn_id}"),),
        instructions=instructions,
    )


@pytest.mark.parametrize("instruction", [SYSTEM, DEVELOPER], ids=["system", "developer"])
async def test_record_refuses_an_instruction_and_records_nothing(instruction: Message) -> None:
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn("t1", (SYSTEM,)))
        before = manager.history("c").turn_messages("t1")
        with pytest.raises(InstructionMessageError) as caught:
            manager.record("c", "t1", [assistant("fine"), instruction])
        assert (caught.value.field, caught.value.role) == ("outputs[1]", str(instruction.role))
        assert isinstance(caught.value, InvalidMessageError)
        async with manager.invocation("c", "t1") as invocation:
            with pytest.raises(InstructionMessageError):
                invocation.record([instruction])
        assert manager.history("c").turn_messages("t1") == before == (user("question t1"),)
        assert manager.statistics().history.items == 1


@pytest.mark.parametrize("instruction", [SYSTEM, DEVELOPER], ids=["system", "developer"])
async def test_build_refuses_an_instruction_in_the_continuation(instruction: Message) -> None:
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn("t1", (SYSTEM,)))
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        with pytest.raises(InstructionMessageError) as caught:
            manager.build(prefix, [assistant("a"), user("more"), instruction])
        assert caught.value.field == "continuation[2]"
        assert [i["role"] for i in manager.build(prefix, [assistant("a")])] == [
            "system",
            "user",
            "assistant",
        ]


async def test_a_turn_input_instruction_is_the_same_typed_error() -> None:
    async with Foundation() as foundation:
        with pytest.raises(InstructionMessageError) as caught:
            foundation.manager.accept_turn(
                TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"), DEVELOPER))
            )
        assert caught.value.field == "input[1]"
        assert foundation.manager.context_ids() == ()


async def test_a_new_turns_instructions_replace_the_pinned_ones_and_restart_the_cache() -> None:
    """The README's rule: new instructions go in the next turn's snapshot; the prefix changes
    from its first byte, so nothing of the previous prefix is reused."""
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn("t1", (SYSTEM,)))
        await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        manager.record("c", "t1", [assistant("answer 1")])
        manager.accept_turn(_turn("t2"))  # instructions kept
        kept = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        assert kept.items[0] == {"role": "system", "content": SYSTEM.parts[0].text}  # type: ignore[union-attr]
        assert kept.reused_bytes > 0
        manager.accept_turn(_turn("t3", (DEVELOPER,)))  # instructions replaced
        changed = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t3"))
        assert [i["role"] for i in changed.items] == [
            "developer",
            "user",
            "assistant",
            "user",
            "user",
        ]
        assert changed.items[0]["content"] == "Answer in French."
        assert changed.reused_bytes == 0
        assert manager.history("c").pinned == (DEVELOPER,)

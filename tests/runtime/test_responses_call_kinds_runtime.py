"""Responses call kinds through the runtime: a call left unanswered never reaches the provider.

A turn whose model emitted a ``computer_call`` (or any opaque call kind of
``CALL_KINDS``) and was then interrupted before the host recorded its output
is closed by the next turn. The input prepared for that next turn must be one
the Responses API accepts (``validate`` finds nothing), under both
``open_calls`` policies: ``"exclude"`` leaves the call out; ``"cancel"``
closes it with a cancelled output where its kind can say so, and leaves it
out where it cannot (a ``computer_call_output`` must hold a screenshot).
The history renders each turn as its own span, so this is the case that
pairing a whole input at once does not exercise.
"""

from __future__ import annotations

from typing import Any

import pytest

from turnloom.context._call_kinds import CALL_KINDS, cancelled_output
from turnloom.context.pairing import CANCELLED_RESULT_TEXT
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio

KINDS = [kind for kind in CALL_KINDS if kind != "function_call"]


def _call(kind: str) -> dict[str, Any]:
    return {"type": kind, "id": f"it_{kind}", "call_id": "call_1", "status": "completed"}


@pytest.mark.parametrize("policy", ["exclude", "cancel"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_call_left_open_by_an_interrupted_turn_is_closed_in_the_next_input(
    anyio_backend: str, kind: str, policy: str
) -> None:
    """Invariant: the next turn's prepared input validates; the open call is in it
    exactly when the policy is "cancel" and its kind has a cancelled output (then
    followed by that output), and the item list is the one expected.

    Mutant tried: complete_pairs not leaving out, under "cancel", a call with no
    cancelled output at the end of a span a later span continues: the
    computer_call, tool_search_call and program cases fail."""
    async with Foundation(gateway="openai_responses", open_calls=policy) as foundation:
        manager = foundation.manager
        gateway = manager.gateway
        ask = gateway.parse_items([{"role": "user", "content": "Do it."}])
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=tuple(ask)))
        reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
        manager.record("c", "t1", gateway.parse_items([reasoning, _call(kind)]))
        then = gateway.parse_items([{"role": "user", "content": "Never mind."}])
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=tuple(then)))
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        items = manager.request_body(prefix)["input"]
        assert gateway.validate(items) == []
        output = cancelled_output(f"{CALL_KINDS[kind]} call_1", CANCELLED_RESULT_TEXT)
        user_1 = {"role": "user", "content": "Do it."}
        user_2 = {"role": "user", "content": "Never mind."}
        if policy == "cancel" and output is not None:
            assert items == [user_1, reasoning, _call(kind), output, user_2]
        else:
            assert items == [user_1, user_2]


@pytest.mark.parametrize("policy", ["exclude", "cancel"])
async def test_an_output_stored_in_an_assistant_message_still_answers_its_call(
    anyio_backend: str, policy: str
) -> None:
    """Invariant: a history written before outputs of these kinds parsed to tool
    messages (the call and its output in one assistant message, as a stored log
    restores it) still renders both, and the input validates: the upgrade drops
    nothing from a stored conversation.

    Mutant tried: the assistant message's output not answering its call: the
    call is left out and the output sent alone: fails."""
    from turnloom.context import Message, OpaquePart, Role

    call = _call("computer_call")
    output = {
        "type": "computer_call_output",
        "call_id": "call_1",
        "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA=="},
    }
    legacy = Message(
        role=Role.assistant,
        content=(
            OpaquePart(gateway="openai_responses", item=call),
            OpaquePart(gateway="openai_responses", item=output),
        ),
    )
    async with Foundation(gateway="openai_responses", open_calls=policy) as foundation:
        manager = foundation.manager
        gateway = manager.gateway
        ask = gateway.parse_items([{"role": "user", "content": "Do it."}])
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=tuple(ask)))
        manager.record("c", "t1", [legacy])
        then = gateway.parse_items([{"role": "user", "content": "Thanks."}])
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=tuple(then)))
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        items = manager.request_body(prefix)["input"]
        assert gateway.validate(items) == []
        assert items == [
            {"role": "user", "content": "Do it."},
            call,
            output,
            {"role": "user", "content": "Thanks."},
        ]

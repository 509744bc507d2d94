"""OpenAI Responses call kinds beyond ``function_call`` through the manager.

A model step that calls a computer, a shell or a custom tool and is interrupted
before the host sends the output leaves the call open: the invocation is
cancelled while the host waits for the action, or the step is recorded and the
turn abandoned. The next turn's prepared input closes it by the Foundation's
``open_calls`` policy as it closes an unanswered ``function_call``, so the API
never sees a call without its output: ``"exclude"`` leaves the call out;
``"cancel"`` answers it with a cancelled output of its own type where that type
can say so, and leaves it out where it cannot (a ``computer_call_output`` must
hold a screenshot). The history renders each turn as its own span, so this is
the case that pairing a whole input at once does not exercise. An output
answering no call is refused at the door with UnpairedResultError, nothing
changed; an output stored inside an assistant message (a log written before
these outputs parsed to tool messages) still answers its call.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from turnloom.context import (
    CANCELLED_RESULT_TEXT,
    Message,
    OpaquePart,
    OpenCallPolicy,
    Role,
    get_gateway,
)
from turnloom.errors import InvalidMessageError, UnpairedResultError
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio

GATEWAY = get_gateway("openai_responses")
ASK = {"role": "user", "content": "Open the settings page."}
NEXT = {"role": "user", "content": "Stop, do something else."}
# Written out, not read from CALL_KINDS: a kind dropped from the table fails its cases.
OUTPUTS = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "computer_call": "computer_call_output",
    "local_shell_call": "local_shell_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "tool_search_call": "tool_search_output",
    "program": "program_output",
}
KINDS = [kind for kind in OUTPUTS if kind != "function_call"]
# The cancelled output answering call k1 of each kind whose output can say so,
# written out; the other kinds' calls are left out under "cancel" too.
CANCELLED: dict[str, dict[str, Any]] = {
    "custom_tool_call": {
        "type": "custom_tool_call_output",
        "call_id": "k1",
        "output": CANCELLED_RESULT_TEXT,
    },
    "local_shell_call": {
        "type": "local_shell_call_output",
        "id": "k1",
        "output": CANCELLED_RESULT_TEXT,
    },
    "shell_call": {
        "type": "shell_call_output",
        "call_id": "k1",
        "output": [
            {
                "stdout": "",
                "stderr": CANCELLED_RESULT_TEXT,
                "outcome": {"type": "exit", "exit_code": 1},
            }
        ],
    },
    "apply_patch_call": {
        "type": "apply_patch_call_output",
        "call_id": "k1",
        "status": "failed",
        "output": CANCELLED_RESULT_TEXT,
    },
}
REASONING: dict[str, Any] = {"type": "reasoning", "id": "rs_1", "summary": []}


def _call(kind: str, call_id: str) -> dict[str, Any]:
    return {"type": kind, "id": f"it_{call_id}", "call_id": call_id, "status": "completed"}


def _output(kind: str, call_id: str) -> dict[str, Any]:
    return {"type": OUTPUTS[kind], "call_id": call_id, "output": "done"}


def _message(item: dict[str, Any]) -> Message:
    return GATEWAY.parse(item)


async def _cancelled_turn(manager: Any, kind: str) -> list[dict[str, Any]]:
    """t1: the model calls ``kind`` (k1); the invocation is cancelled before the output.

    Returns the items t1 keeps before the call when the call is kept: none."""
    manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(_message(ASK),)))
    with anyio.move_on_after(0.01) as scope:
        async with manager.invocation("c", "t1") as invocation:
            invocation.record([_message(_call(kind, "k1"))])
            await anyio.sleep(10)  # the host waits for the action: cancelled here
    assert scope.cancelled_caught
    return []


async def _abandoned_turn(manager: Any, kind: str) -> list[dict[str, Any]]:
    """t1: the model reasons, then calls ``kind`` (k1); the step is recorded outside
    an invocation and no output follows before t2.

    Returns the items t1 keeps before the call when the call is kept: the reasoning."""
    manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(_message(ASK),)))
    manager.record("c", "t1", GATEWAY.parse_items([REASONING, _call(kind, "k1")]))
    return [REASONING]


INTERRUPTIONS = {"invocation cancelled": _cancelled_turn, "step abandoned": _abandoned_turn}


@pytest.mark.parametrize("interruption", list(INTERRUPTIONS))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("policy", ["exclude", "cancel"])
async def test_a_call_left_open_by_an_interrupted_turn_is_closed_in_the_next_input(
    anyio_backend: str, interruption: str, kind: str, policy: OpenCallPolicy
) -> None:
    """Invariant: after a turn interrupted with a call of each kind unanswered (its
    invocation cancelled, or its step recorded and abandoned after a reasoning
    item), the next turn's prepared input, and the request body's ``input``, hold
    no call without its output: under "cancel", for a kind whose output can say
    cancelled, the call (with the items before it) followed by exactly that
    cancelled output; otherwise the call and its step are left out. The input
    validates.

    Mutants tried: "computer_call" removed from CALL_KINDS: the computer_call
    cases keep the call and validate flags it; complete_pairs not leaving out,
    under "cancel", a call with no cancelled output at the end of a span a later
    span continues: the computer_call, tool_search_call and program cases fail;
    cancelled_output giving shell_call no cancelled output, or naming a
    local_shell_call's call in ``call_id``: that kind's "cancel" cases fail."""
    async with Foundation(gateway="openai_responses", open_calls=policy) as foundation:
        manager = foundation.manager
        before_call = await INTERRUPTIONS[interruption](manager, kind)
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(_message(NEXT),)))
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        expected: list[dict[str, Any]]
        if policy == "cancel" and kind in CANCELLED:
            expected = [ASK, *before_call, _call(kind, "k1"), CANCELLED[kind], NEXT]
        else:
            expected = [ASK, NEXT]
        assert list(prepared.items) == expected
        assert manager.request_body(prepared)["input"] == expected
        assert GATEWAY.validate(expected) == []


@pytest.mark.parametrize("kind", KINDS)
async def test_an_output_answering_the_open_call_is_kept(anyio_backend: str, kind: str) -> None:
    """Invariant: the output of a call of each kind, committed as the next turn's input,
    answers the call left open by the cancelled turn: both are in the prepared input,
    exactly, and it validates."""
    async with Foundation(gateway="openai_responses") as foundation:
        manager = foundation.manager
        await _cancelled_turn(manager, kind)
        answer = _message(_output(kind, "k1"))
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(answer,)))
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        assert list(prepared.items) == [ASK, _call(kind, "k1"), _output(kind, "k1")]
        assert GATEWAY.validate(list(prepared.items)) == []


@pytest.mark.parametrize("kind", [*KINDS, "mcp_approval_request"])
async def test_an_output_answering_no_call_is_refused_at_the_door(
    anyio_backend: str, kind: str
) -> None:
    """Invariant: an output of each kind (and an MCP approval response) answering no call
    of the context, after user text, is refused by accept_turn with UnpairedResultError
    naming the message and the call's pairing key, as a function_call_output is; the
    context keeps its turns and prepares exactly as before."""
    if kind == "mcp_approval_request":
        stray = {"type": "mcp_approval_response", "approval_request_id": "k9", "approve": True}
        key = "mcp_approval_response k9"
    else:
        stray, key = _output(kind, "k9"), f"{OUTPUTS[kind]} k9"
    async with Foundation(gateway="openai_responses") as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(_message(ASK),)))
        request = ContextPrepareRequest(context_id="c", turn_id="t1")
        before = list((await manager.prepare(request)).items)
        statistics = manager.statistics()
        given = (_message(NEXT), _message(stray))
        with pytest.raises(UnpairedResultError) as caught:
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=given))
        assert (caught.value.field, caught.value.call_id) == ("Turn 't2' input[1]", key)
        assert isinstance(caught.value, InvalidMessageError)
        assert manager.history("c").turn_ids == ("t1",)
        assert manager.statistics() == statistics
        assert list((await manager.prepare(request)).items) == before


@pytest.mark.parametrize("policy", ["exclude", "cancel"])
async def test_an_output_stored_in_an_assistant_message_still_answers_its_call(
    anyio_backend: str, policy: OpenCallPolicy
) -> None:
    """Invariant: a history written before outputs of these kinds parsed to tool
    messages (the call and its output in one assistant message, as a stored log
    restores it) still renders both, and the input validates: the upgrade drops
    nothing from a stored conversation.

    Mutant tried: the assistant message's output not answering its call: the
    call is left out and the output sent alone: fails."""
    call = _call("computer_call", "k1")
    output = {
        "type": "computer_call_output",
        "call_id": "k1",
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
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(_message(ASK),)))
        manager.record("c", "t1", [legacy])
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(_message(NEXT),)))
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        items = manager.request_body(prepared)["input"]
        assert GATEWAY.validate(items) == []
        assert items == [ASK, call, output, NEXT]

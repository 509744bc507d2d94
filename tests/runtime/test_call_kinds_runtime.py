"""OpenAI Responses call kinds beyond ``function_call`` through the manager.

A model step that calls a computer, a shell or a custom tool and is cancelled
before the host sends the output leaves the call open; the next turn's prepared
input closes it by the Foundation's ``open_calls`` policy as it closes an
unanswered ``function_call`` (left out, or answered by a cancelled output of its
own type where that type can say so), so the API never sees a call without its
output. An output answering no call is refused at the door with
UnpairedResultError, nothing changed.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from turnloom.context import CANCELLED_RESULT_TEXT, Message, OpenCallPolicy, get_gateway
from turnloom.context._call_kinds import cancelled_output
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
CANCELLABLE = {"custom_tool_call", "local_shell_call", "shell_call", "apply_patch_call"}


def _call(kind: str, call_id: str) -> dict[str, Any]:
    return {"type": kind, "id": f"it_{call_id}", "call_id": call_id, "status": "completed"}


def _output(kind: str, call_id: str) -> dict[str, Any]:
    return {"type": OUTPUTS[kind], "call_id": call_id, "output": "done"}


def _message(item: dict[str, Any]) -> Message:
    return GATEWAY.parse(item)


async def _cancelled_turn(manager: Any, kind: str) -> None:
    """t1: the model calls ``kind`` (k1); the invocation is cancelled before the output."""
    manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(_message(ASK),)))
    with anyio.move_on_after(0.01) as scope:
        async with manager.invocation("c", "t1") as invocation:
            invocation.record([_message(_call(kind, "k1"))])
            await anyio.sleep(10)  # the host waits for the action: cancelled here
    assert scope.cancelled_caught


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("policy", ["exclude", "cancel"])
async def test_a_cancelled_turn_leaves_no_call_without_its_output(
    anyio_backend: str, kind: str, policy: OpenCallPolicy
) -> None:
    """Invariant: after a turn cancelled with a call of each kind unanswered, the next
    turn's prepared input holds no call without its output: the call is left out
    ("exclude", and "cancel" for a kind whose output cannot say cancelled) or answered
    by a cancelled output of its type ("cancel"); the input validates.

    Mutant tried: "computer_call" removed from CALL_KINDS: the computer_call case
    keeps the call and validate flags it (this test fails)."""
    async with Foundation(gateway="openai_responses", open_calls=policy) as foundation:
        manager = foundation.manager
        await _cancelled_turn(manager, kind)
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(_message(NEXT),)))
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        items = list(prepared.items)
        if policy == "cancel" and kind in CANCELLABLE:
            cancelled = cancelled_output(f"{OUTPUTS[kind]} k1", CANCELLED_RESULT_TEXT)
            assert items == [ASK, _call(kind, "k1"), cancelled, NEXT]
        else:
            assert items == [ASK, NEXT]
        assert GATEWAY.validate(items) == []


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

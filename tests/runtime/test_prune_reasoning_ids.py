"""Pruning old reasoning on the OpenAI Responses gateway keeps the next input acceptable.

A reasoning model's response is ``[reasoning, function_call (id fc_...), ...]``;
the Responses API refuses an item of such a response sent without its reasoning
item ("Item 'fc_...' of type 'function_call' was provided without its required
'reasoning' item: 'rs_...'", a 400; the same holds for the response's output
message). Pruning (``PrunePolicy``) drops the reasoning parts of old turns.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from turnloom.context import Message, PrunePolicy, Role
from turnloom.context.summaries import prune_messages
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio


def _response(n: int) -> list[dict[str, Any]]:
    return [
        {"type": "reasoning", "id": f"rs_{n}", "summary": [], "encrypted_content": f"enc-{n}"},
        {
            "type": "function_call",
            "call_id": f"c{n}",
            "name": "look",
            "arguments": "{}",
            "id": f"fc_{n}",
            "status": "completed",
        },
    ]


def _unaccompanied(items: list[dict[str, Any]]) -> list[str]:
    """Ids of function_call items whose response's reasoning item is not before them."""
    out: list[str] = []
    for index, item in enumerate(items):
        if item.get("type") != "function_call" or "id" not in item:
            continue
        before = index - 1
        while before >= 0 and items[before].get("type") == "function_call":
            before -= 1
        if before < 0 or items[before].get("type") != "reasoning":
            out.append(item["id"])
    return out


@pytest.mark.parametrize("apart", [False, True], ids=["one message", "reasoning apart"])
async def test_a_pruned_turns_calls_are_not_sent_with_ids_that_need_their_reasoning(
    anyio_backend: str, apart: bool
) -> None:
    """Invariant: no function_call of the prepared input carries a reasoning response's
    item id (fc_...) without that response's reasoning item before it, whether the
    reasoning was recorded in the call's message or apart (one item per message).
    Before the fix pruning dropped the reasoning and kept fc_0 and fc_1.

    Mutant tried: the id kept (no ``unreasoned`` branch in prune_messages): fails."""
    async with Foundation(gateway="openai_responses") as foundation:
        manager = foundation.manager
        gateway = manager.gateway
        manager.summaries.prune = PrunePolicy(keep_turns=1, note="[pruned]")
        for n in range(3):
            question = Message(role=Role.user, content=f"Question {n}.")
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id=f"t{n}", input=(question,)))
            output = {"type": "function_call_output", "call_id": f"c{n}", "output": "found"}
            items = [*_response(n), output]
            if apart:
                messages = [gateway.parse(item) for item in items]
            else:
                messages = gateway.parse_items(items)
            manager.record("c", f"t{n}", messages)
            for _ in range(5):  # the safe point's pruning
                await anyio.sleep(0)
        more = Message(role=Role.user, content="More?")
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t9", input=(more,)))
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t9"))
        items = json.loads(json.dumps(list(prepared.items)))
        assert [i.get("output") for i in items if "output" in i] == ["[pruned]"] * 2 + ["found"]
        assert _unaccompanied(items) == []
        calls = [i for i in items if i.get("type") == "function_call"]
        assert [(c["call_id"], c.get("id")) for c in calls] == [
            ("c0", None),
            ("c1", None),
            ("c2", "fc_2"),
        ]
        assert gateway.validate(items) == []


async def test_a_pruned_turns_reply_is_not_sent_with_an_id_that_needs_its_reasoning(
    anyio_backend: str,
) -> None:
    """Invariant: no output message of the prepared input carries a reasoning response's
    item id (msg_...) without that response's reasoning item before it; the pruned
    replies go in input form while the history keeps their Message.id (its id index's
    key), and pruning them again changes nothing.

    Mutant tried: no ``"unreasoned"`` hint set in prune_messages: fails (msg_0, msg_1)."""
    async with Foundation(gateway="openai_responses") as foundation:
        manager = foundation.manager
        gateway = manager.gateway
        manager.summaries.prune = PrunePolicy(keep_turns=1, note="[pruned]")
        for n in range(3):
            question = Message(role=Role.user, content=f"Question {n}.")
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id=f"t{n}", input=(question,)))
            reply = {
                "type": "message",
                "role": "assistant",
                "id": f"msg_{n}",
                "status": "completed",
                "content": [{"type": "output_text", "text": f"Answer {n}.", "annotations": []}],
            }
            manager.record("c", f"t{n}", gateway.parse_items([_response(n)[0], reply]))
            for _ in range(5):  # the safe point's pruning
                await anyio.sleep(0)
        more = Message(role=Role.user, content="More?")
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t9", input=(more,)))
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t9"))
        items = list(prepared.items)
        unaccompanied = [
            item["id"]
            for index, item in enumerate(items)
            if item.get("type") == "message"
            and "id" in item
            and (index == 0 or items[index - 1].get("type") != "reasoning")
        ]
        assert unaccompanied == []
        replies = [i for i in items if i.get("role") == "assistant"]
        assert replies == [
            {"role": "assistant", "content": "Answer 0."},
            {"role": "assistant", "content": "Answer 1."},
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_2",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Answer 2.", "annotations": []}],
            },
        ]
        assert gateway.validate(items) == []
        view = manager.history("c")
        held = [m for m in view.messages() if m.role is Role.assistant]
        assert [m.id for m in held] == ["msg_0", "msg_1", "msg_2"]
        assert prune_messages(held[:2], "[pruned]") is None

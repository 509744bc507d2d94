"""The item shapes a real OpenAI Agents SDK run stores, through ``TurnloomSession``.

Every item kind the SDK hands ``add_items`` comes back from ``get_items``
exactly; what ``get_items`` hands back is a valid Responses input (no output
cut from its call, no call without its output, no reasoning item without the
item it belongs to); ``pop_item`` never leaves the session holding less than
every item but the newest.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("agents")

from agents import Agent, Runner, UserError, function_tool, set_tracing_disabled
from openai.types.responses import ResponseFunctionWebSearch, ResponseReasoningItem
from openai.types.responses.response_reasoning_item import Summary

from tests.integrations.agents_fakes import ScriptedModel, call, say
from turnloom.errors import InvalidMessageError
from turnloom.integrations.openai_agents import TurnloomSession, complete_window
from turnloom.runtime import Foundation
from turnloom.stores import open_context_store

set_tracing_disabled(True)

USER = {"role": "user", "content": "Check it."}
USER_2 = {"role": "user", "content": "And now?"}
REASONING = {
    "type": "reasoning",
    "id": "rs_1",
    "summary": [{"type": "summary_text", "text": "Look it up."}],
    "encrypted_content": "gAAAAB-enc",
}
CALL = {
    "type": "function_call",
    "call_id": "c1",
    "name": "look",
    "arguments": "{}",
    "id": "fc_1",
    "status": "completed",
}
CALL_2 = {**CALL, "call_id": "c2", "id": "fc_2"}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "one"}
OUTPUT_2 = {"type": "function_call_output", "call_id": "c2", "output": "two"}
LIST_OUTPUT = {
    "type": "function_call_output",
    "call_id": "c1",
    "output": [
        {"type": "input_text", "text": "The chart:"},
        {"type": "input_image", "image_url": "https://example.com/c.png", "detail": "auto"},
    ],
}
REPLY = {
    "type": "message",
    "role": "assistant",
    "id": "msg_1",
    "status": "completed",
    "content": [{"type": "output_text", "text": "Done.", "annotations": []}],
}
REPLY_2 = {**REPLY, "id": "msg_2"}
CITED = {
    "type": "message",
    "role": "assistant",
    "id": "msg_c",
    "status": "completed",
    "content": [
        {
            "type": "output_text",
            "text": "See [1].",
            "annotations": [
                {
                    "type": "url_citation",
                    "start_index": 4,
                    "end_index": 7,
                    "url": "https://example.com",
                    "title": "E",
                }
            ],
            "logprobs": [],
        },
        {"type": "refusal", "refusal": "Not the rest."},
    ],
}
WEB_SEARCH = {
    "type": "web_search_call",
    "id": "ws_1",
    "status": "completed",
    "action": {"type": "search", "query": "q"},
}
FILE_SEARCH = {
    "type": "file_search_call",
    "id": "fs_1",
    "status": "completed",
    "queries": ["q"],
    "results": None,
}
CODE = {
    "type": "code_interpreter_call",
    "id": "ci_1",
    "code": "1+1",
    "container_id": "cntr_1",
    "outputs": None,
    "status": "completed",
}
IMAGE = {"type": "image_generation_call", "id": "ig_1", "result": "iVBORw0K", "status": "completed"}
MCP_TOOLS = {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "s", "tools": []}
MCP_CALL = {
    "type": "mcp_call",
    "id": "mcp_1",
    "arguments": "{}",
    "name": "t",
    "server_label": "s",
    "output": "o",
}
APPROVAL_REQUEST = {
    "type": "mcp_approval_request",
    "id": "mcpr_1",
    "arguments": "{}",
    "name": "t",
    "server_label": "s",
}
APPROVAL = {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}
COMPUTER = {
    "type": "computer_call",
    "id": "cu_1",
    "call_id": "cc1",
    "action": {"type": "click", "button": "left", "x": 1, "y": 2},
    "pending_safety_checks": [],
    "status": "completed",
}
COMPUTER_OUTPUT = {
    "type": "computer_call_output",
    "call_id": "cc1",
    "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,iVBO"},
}
SHELL = {
    "type": "local_shell_call",
    "id": "ls_1",
    "call_id": "lc1",
    "action": {"type": "exec", "command": ["ls"], "env": {}},
    "status": "completed",
}
SHELL_OUTPUT = {"type": "local_shell_call_output", "call_id": "lc1", "output": "a.txt"}
SHELL_OUTPUT_BY_ID = {"type": "local_shell_call_output", "id": "lc1", "output": "a.txt"}
CUSTOM = {"type": "custom_tool_call", "call_id": "ct1", "name": "g", "input": "raw", "id": "ctc_1"}
CUSTOM_OUTPUT = {"type": "custom_tool_call_output", "call_id": "ct1", "output": "done"}
HANDOFF = {**CALL, "call_id": "h1", "name": "transfer_to_billing", "id": "fc_h"}
HANDOFF_OUTPUT = {
    "type": "function_call_output",
    "call_id": "h1",
    "output": '{"assistant": "billing"}',
}
REFERENCE = {"type": "item_reference", "id": "msg_0"}

ITEMS = {
    "reasoning then a call": [REASONING, CALL, OUTPUT, REPLY],
    "list output": [CALL, LIST_OUTPUT, REPLY],
    "hosted tools": [WEB_SEARCH, FILE_SEARCH, CODE, IMAGE, REPLY],
    "mcp": [MCP_TOOLS, APPROVAL_REQUEST, APPROVAL, MCP_CALL, REPLY],
    "computer": [COMPUTER, COMPUTER_OUTPUT, REPLY],
    "local shell": [SHELL, SHELL_OUTPUT, REPLY],
    "local shell output by id": [SHELL, SHELL_OUTPUT_BY_ID, REPLY],
    "custom tool": [CUSTOM, CUSTOM_OUTPUT, REPLY],
    "handoff": [HANDOFF, HANDOFF_OUTPUT, REPLY],
    "annotations and refusal": [CITED],
    "item reference": [REFERENCE, REPLY],
}

pytestmark = pytest.mark.anyio


def _kinds(items: list[Any]) -> list[str]:
    return [item.get("type", item.get("role")) for item in items]


@pytest.mark.parametrize("name", list(ITEMS))
async def test_each_item_kind_the_sdk_stores_comes_back_exactly(name: str) -> None:
    """Invariant: get_items returns what add_items was given, item for item, as a
    valid input (the gateway's validate finds nothing), in one batch or one item
    per batch."""
    stored = [USER, *ITEMS[name]]
    for batches in ([stored], [[item] for item in stored]):
        async with Foundation(gateway="openai_responses") as foundation:
            session = TurnloomSession("s1", foundation.manager)
            for batch in batches:
                await session.add_items(copy.deepcopy(batch))  # type: ignore[arg-type]
            got = await session.get_items()
            assert got == stored
            assert foundation.manager.gateway.validate([*got, USER_2]) == []


async def test_reasoning_added_in_a_batch_of_its_own_is_not_lost() -> None:
    """Invariant: a reasoning item added alone (a host storing one item per call)
    comes back in front of the output item added after it; before the fix
    get_items left it out (a debug log line only).

    Mutant tried: _all_items rendering the held messages without join_steps: fails."""
    stored = [USER, REASONING, CALL, CALL_2, OUTPUT_2, OUTPUT, REPLY]
    async with Foundation(gateway="openai_responses") as foundation:
        session = TurnloomSession("s1", foundation.manager)
        for item in stored:
            await session.add_items([copy.deepcopy(item)])  # type: ignore[list-item]
        assert await session.get_items() == stored
        assert await session.get_items(limit=6) == stored[1:]
        assert await session.pop_item() == REPLY
        assert await session.get_items() == stored[:-1]


async def test_a_call_left_open_takes_its_reasoning_out_of_the_window() -> None:
    """Invariant: get_items never hands out a reasoning item without the item it
    belongs to: a call left open (an interrupted run) goes, and the reasoning
    items directly before it go with it. Before the fix get_items returned
    [user, reasoning], which the Responses API rejects.

    Mutant tried: complete_window without its reasoning pass: fails."""
    second = {**REASONING, "id": "rs_2"}
    async with Foundation(gateway="openai_responses") as foundation:
        session = TurnloomSession("s1", foundation.manager)
        await session.add_items([USER, REASONING, second, CALL])  # type: ignore[list-item]
        assert await session.get_items() == [USER]
    assert complete_window([USER, REASONING, CALL, REPLY]) == [USER, REPLY]
    assert complete_window([USER, REASONING, CALL, OUTPUT]) == [USER, REASONING, CALL, OUTPUT]


PAIRS = [
    (COMPUTER, COMPUTER_OUTPUT),
    (SHELL, SHELL_OUTPUT),
    (SHELL, SHELL_OUTPUT_BY_ID),
    (CUSTOM, CUSTOM_OUTPUT),
    (
        {"type": "shell_call", "call_id": "sh1", "action": {"commands": ["ls"]}, "id": "sh_1"},
        {"type": "shell_call_output", "call_id": "sh1", "output": []},
    ),
    (
        {"type": "apply_patch_call", "call_id": "ap1", "operation": {}, "id": "ap_1"},
        {"type": "apply_patch_call_output", "call_id": "ap1", "status": "completed"},
    ),
    (APPROVAL_REQUEST, APPROVAL),
]


@pytest.mark.parametrize(("call_item", "output_item"), PAIRS, ids=lambda p: p["type"])
async def test_a_window_never_starts_with_an_output_cut_from_its_call(
    call_item: dict[str, Any], output_item: dict[str, Any]
) -> None:
    """Invariant: get_items(limit=N) leaves out an output of any call kind the SDK
    runs locally (computer, shell, custom tool, apply patch, MCP approval) whose
    call was cut off, and a call of those kinds never answered. Before the fix only
    function_call pairs were completed: the window began with the orphan output.

    Mutant tried: complete_window pairing function_call items only: fails."""
    async with Foundation(gateway="openai_responses") as foundation:
        session = TurnloomSession("s1", foundation.manager)
        items = [USER, call_item, output_item, REPLY, USER_2, REPLY_2]
        await session.add_items(copy.deepcopy(items))  # type: ignore[arg-type]
        assert await session.get_items(limit=5) == items[1:]
        assert await session.get_items(limit=4) == [REPLY, USER_2, REPLY_2]
    if call_item is not APPROVAL_REQUEST:  # a request not answered yet stays
        assert complete_window([USER, REASONING, call_item]) == [USER]


@function_tool
def look() -> str:
    """Look something up."""
    return "seen"


@function_tool(failure_error_function=None)
def explode() -> str:
    """Fail."""
    raise RuntimeError("the tool failed")


def _reasoning(item_id: str) -> ResponseReasoningItem:
    summary = [Summary(type="summary_text", text="Look it up.")]
    return ResponseReasoningItem(
        id=item_id, type="reasoning", summary=summary, encrypted_content="enc"
    )


def test_a_real_run_with_parallel_calls_then_a_failed_tool_then_a_new_run() -> None:
    """Invariant: the items of a Runner.run with reasoning, two parallel calls and a
    hosted web search come back exactly; a run whose tool raised stored its user
    input only (the SDK saves the step after its tools), and the next run's model
    input is the whole held history then the new input."""

    async def main() -> None:
        web = ResponseFunctionWebSearch(
            id="ws_1", type="web_search_call", status="completed", action={"type": "search"}
        )
        model = ScriptedModel(
            [
                [_reasoning("rs_1"), call("p1", "look", "{}"), call("p2", "look", "{}")],
                [web, say("Done.", "msg_1")],
                [_reasoning("rs_2"), call("b1", "explode", "{}")],
                [say("Again.", "msg_2")],
            ]
        )
        agent = Agent(name="a", model=model, tools=[look, explode])
        async with Foundation(gateway="openai_responses") as foundation:
            session = TurnloomSession("s1", foundation.manager)
            await Runner.run(agent, "Go.", session=session)
            first = await session.get_items()
            assert _kinds(first) == [
                "user",
                "reasoning",
                "function_call",
                "function_call",
                "function_call_output",
                "function_call_output",
                "web_search_call",
                "message",
            ]
            assert first[1]["encrypted_content"] == "enc"
            assert [i.get("call_id") for i in first[2:6]] == ["p1", "p2", "p1", "p2"]
            with pytest.raises(UserError):
                await Runner.run(agent, "Blow up.", session=session)
            assert await session.get_items() == [*first, {"role": "user", "content": "Blow up."}]
            result = await Runner.run(agent, "Retry.", session=session)
            assert result.final_output == "Again."
            held = [*first, {"role": "user", "content": "Blow up."}]
            assert [dict(i) for i in model.inputs[3]] == [
                *held,
                {"role": "user", "content": "Retry."},
            ]
            assert foundation.manager.gateway.validate(await session.get_items()) == []

    asyncio.run(main())


async def test_a_pop_cancelled_during_its_rebuild_still_holds_every_item_but_the_newest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant: pop_item cancelled while it rebuilds the context (here at the
    store flush of its clear) finishes: it returns the newest item and the session
    holds every other; the cancellation reaches the caller at its next checkpoint.
    Before the fix the session was left empty: four items gone.

    Mutant tried: the rebuild not shielded: fails."""
    async with Foundation(gateway="openai_responses") as foundation:
        session = TurnloomSession("s1", foundation.manager)
        await session.add_items([USER, CALL, OUTPUT, REPLY])  # type: ignore[list-item]
        leases = type(foundation.manager.leases)
        flush = leases.flush
        with anyio.CancelScope() as scope:

            async def cancelling_flush(self: Any, context_id: str) -> None:
                scope.cancel()
                await flush(self, context_id)
                await anyio.sleep(0)

            monkeypatch.setattr(leases, "flush", cancelling_flush)
            popped = await session.pop_item()
            monkeypatch.setattr(leases, "flush", flush)
            assert scope.cancel_called
            assert popped == REPLY
        assert await session.get_items() == [USER, CALL, OUTPUT]


async def test_a_pop_whose_rebuild_fails_puts_every_item_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant: when adding the items back fails during pop_item, the error is
    raised and the session holds what it held before. Before the fix it was left
    empty.

    Mutant tried: no restore on failure: fails."""
    async with Foundation(gateway="openai_responses") as foundation:
        session = TurnloomSession("s1", foundation.manager)
        held = [USER, CALL, OUTPUT, REPLY]
        await session.add_items(copy.deepcopy(held))  # type: ignore[arg-type]
        apply = session._apply
        calls: list[int] = []

        def failing_once(messages: list[Any], turn_id: str | None = None) -> None:
            calls.append(len(messages))
            apply(messages, turn_id)
            if len(calls) == 1:  # the kept items went in; the rebuild then fails
                raise InvalidMessageError("refused")

        monkeypatch.setattr(session, "_apply", failing_once)
        with pytest.raises(InvalidMessageError):
            await session.pop_item()
        assert calls == [3, 4]
        assert await session.get_items() == held


FAKE = "__fake_id__"


def test_replies_of_a_model_without_item_ids_are_all_kept_exactly(tmp_path: Path) -> None:
    """Invariant: the SDK's placeholder id (FAKE_RESPONSES_ID, given to every output
    item of a Chat Completions or LiteLLM model) on several assistant messages, the
    same reply text twice included, is no duplicate id: every run's items come back
    exactly, placeholder included, from memory and from the store after a restart,
    and each run's model input holds the whole history. Before the fix the second
    Runner.run raised DuplicateIdError, and so did every later one.

    Mutant tried: add_items without _hold_placeholder: fails."""
    url = f"sqlite:{tmp_path / 'contexts.db'}"

    def fake_call(call_id: str) -> Any:
        item = call(call_id, "look", "{}")
        item.id = FAKE
        return item

    def fake_reply(text: str) -> dict[str, Any]:
        return {
            "type": "message",
            "role": "assistant",
            "id": FAKE,
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }

    def fake_call_item(call_id: str) -> dict[str, Any]:
        return {**CALL, "call_id": call_id, "id": FAKE}

    expected = [
        {"role": "user", "content": "One."},
        fake_call_item("c1"),
        {"type": "function_call_output", "call_id": "c1", "output": "seen"},
        fake_reply("Same."),
        {"role": "user", "content": "Two."},
        fake_call_item("c2"),
        {"type": "function_call_output", "call_id": "c2", "output": "seen"},
        fake_reply("Same."),
        {"role": "user", "content": "Three."},
        fake_reply("Other."),
    ]

    async def main() -> None:
        model = ScriptedModel(
            [
                [fake_call("c1")],
                [say("Same.", FAKE)],
                [fake_call("c2")],
                [say("Same.", FAKE)],
                [say("Other.", FAKE)],
            ]
        )
        agent = Agent(name="a", model=model, tools=[look])
        async with open_context_store(url) as store:
            async with Foundation(gateway="openai_responses", store=store) as foundation:
                session = TurnloomSession("s1", foundation.manager)
                for text in ("One.", "Two.", "Three."):
                    await Runner.run(agent, text, session=session)
                assert await session.get_items() == expected
                assert [dict(i) for i in model.inputs[-1]] == expected[:-1]
                assert foundation.manager.statistics().history.duplicate_outputs_total == 0
                assert await session.pop_item() == expected[-1]
                assert await session.get_items() == expected[:-1]
        async with open_context_store(url) as store:
            async with Foundation(gateway="openai_responses", store=store) as foundation:
                session = TurnloomSession("s1", foundation.manager)
                assert await session.get_items() == expected[:-1]

    asyncio.run(main())


async def test_a_hosts_own_id_like_the_held_placeholder_is_kept() -> None:
    """Invariant: only the ids the session made itself are turned back into the
    placeholder: a host's id that merely starts with "__fake_id__#" comes back as
    it was added."""
    own = {**REPLY, "id": f"{FAKE}#mine"}
    async with Foundation(gateway="openai_responses") as foundation:
        session = TurnloomSession("s1", foundation.manager)
        await session.add_items([USER, own])  # type: ignore[list-item]
        assert await session.get_items() == [USER, own]


async def test_a_blank_reply_is_counted_and_a_blank_input_refused_with_the_session_unchanged() -> (
    None
):
    """Invariant (as the module documents): an assistant message of blank text is
    not held and is counted in dropped_blank_outputs_total; a blank user input is
    refused with InvalidMessageError and the session holds what it held."""
    blank = {**REPLY, "content": [{"type": "output_text", "text": "", "annotations": []}]}
    async with Foundation(gateway="openai_responses") as foundation:
        session = TurnloomSession("s1", foundation.manager)
        await session.add_items([USER, blank])  # type: ignore[list-item]
        assert await session.get_items() == [USER]
        assert foundation.manager.statistics().history.dropped_blank_outputs_total == 1
        with pytest.raises(InvalidMessageError):
            await session.add_items([{"role": "user", "content": " "}, REPLY_2])  # type: ignore[list-item]
        assert await session.get_items() == [USER]
        assert len(foundation.manager.history("s1").turn_ids) == 1

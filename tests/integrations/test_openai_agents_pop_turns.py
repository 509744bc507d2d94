"""``TurnloomSession.pop_item``: the newest held item, and the turns of what stays.

Found by the state machine of ``test_openai_agents_reasoning_stateful``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("agents")

from tests.integrations.test_openai_agents_items import CALL, OUTPUT, REASONING, REPLY, USER, USER_2
from turnloom.context import CompactionPolicy, Message, Role
from turnloom.context.history import HistoryLimits
from turnloom.context.summaries import is_summary_turn
from turnloom.integrations.openai_agents import TurnloomSession
from turnloom.runtime import Foundation
from turnloom.stores import open_context_store

pytestmark = pytest.mark.anyio


def _user(n: int) -> dict[str, Any]:
    return {"role": "user", "content": f"Question {n}."}


def _reply(n: int) -> dict[str, Any]:
    return {**REPLY, "id": f"msg_{n}"}


async def test_a_reasoning_item_added_last_is_the_item_popped(anyio_backend: str) -> None:
    """Invariant: pop_item removes and returns the newest item added, also a reasoning
    item stored on its own (a host storing one item per call; its output not added
    yet), and the session keeps every other item. Before the fix pop_item returned the
    user input before it and the reasoning item was lost with it: the session held
    [user, reply] instead of [user, reply, user].

    Mutant tried: pop_item reading _all_items() without the unfollowed reasoning: fails."""
    async with Foundation(gateway="openai_responses") as foundation:
        session = TurnloomSession("s1", foundation.manager)
        for item in (USER, REPLY, USER_2, REASONING):
            await session.add_items([copy.deepcopy(item)])  # type: ignore[list-item]
        assert await session.get_items() == [USER, REPLY, USER_2]
        assert await session.pop_item() == REASONING
        assert session._all_items(unfollowed=True) == [USER, REPLY, USER_2]
        # the step goes on as if the reasoning had never been added
        for item in (REASONING, CALL, OUTPUT):
            await session.add_items([copy.deepcopy(item)])  # type: ignore[list-item]
        assert await session.get_items() == [USER, REPLY, USER_2, REASONING, CALL, OUTPUT]
        assert await session.pop_item() == OUTPUT
        assert await session.pop_item() == CALL
        assert await session.pop_item() == REASONING
        assert await session.get_items() == [USER, REPLY, USER_2]


async def test_a_pop_keeps_each_turn_a_turn(anyio_backend: str, tmp_path: Path) -> None:
    """Invariant: pop_item's rebuild keeps the held turns as they were: a turn whose
    reply was popped (its input alone) stays a turn of its own, so the history limit
    evicts the same turns as without the pop, and the store restores them. Before the
    fix the rebuild merged that input into the next turn's input: a later commit past
    max_turns=3 kept Question 1, evicted with its own turn.

    Mutant tried: the rebuild parsing every kept item in one batch (as before): fails."""
    async with open_context_store(f"sqlite:{tmp_path / 's.db'}") as store:
        async with Foundation(
            gateway="openai_responses",
            store=store,
            history_limits=HistoryLimits(max_turns=3),
        ) as foundation:
            session = TurnloomSession("s1", foundation.manager)
            await session.add_items([_user(1), _reply(1)])  # type: ignore[list-item]
            assert await session.pop_item() == _reply(1)
            await session.add_items([_user(2), _reply(2)])  # type: ignore[list-item]
            await session.add_items([_user(3), _reply(3)])  # type: ignore[list-item]
            assert await session.pop_item() == _reply(3)
            assert len(foundation.manager.history("s1").turn_ids) == 3
            await session.add_items([_user(4), _reply(4)])  # type: ignore[list-item]
            expected = [_user(2), _reply(2), _user(3), _user(4), _reply(4)]
            assert await session.get_items() == expected
        async with Foundation(
            gateway="openai_responses",
            store=store,
            history_limits=HistoryLimits(max_turns=3),
        ) as restored:
            session = TurnloomSession("s1", restored.manager)
            assert await session.get_items() == expected
            assert len(restored.manager.history("s1").turn_ids) == 3


async def test_a_pop_leaves_the_reasoning_before_the_item_it_took_as_if_added_alone(
    anyio_backend: str,
) -> None:
    """Invariant: after pop_item the session behaves as if the popped item had never
    been added: a reasoning item whose output item was popped goes in front of the next
    output item added, as a reasoning item added on its own does. Before the fix the
    rebuild joined it to the message before it, where it never renders: get_items lost
    it for good once the next reply came.

    Mutant tried: the rebuild without _split_reasoning: fails."""
    reasoning = {**REASONING, "id": "rs_3"}
    async with Foundation(gateway="openai_responses") as foundation:
        session = TurnloomSession("s1", foundation.manager)
        await session.add_items([USER, _reply(2)])  # type: ignore[list-item]
        await session.add_items([copy.deepcopy(reasoning), _reply(4)])  # type: ignore[list-item]
        assert await session.pop_item() == _reply(4)
        await session.add_items([_reply(6)])  # type: ignore[list-item]
        assert await session.get_items() == [USER, _reply(2), reasoning, _reply(6)]
        assert foundation.manager.gateway.validate([*await session.get_items(), USER_2]) == []


async def _summary(messages: tuple[Message, ...]) -> list[Message]:
    return [Message(role=Role.user, content=f"Summary of {len(messages)} messages.")]


async def test_a_pop_keeps_the_summary_turn_and_every_turn_id(anyio_backend: str) -> None:
    """Invariant: pop_item rebuilds each held turn under its own id, so a summary turn
    (summary compaction) stays the summary turn: the history limit evicts it last.
    Before the fix every turn got a new id: the summary became an ordinary oldest
    turn, and the next commit past max_turns evicted it first, losing what it
    summarized.

    Mutant tried: the rebuild committing under new ids (as before): fails."""
    async with Foundation(
        gateway="openai_responses", history_limits=HistoryLimits(max_turns=4)
    ) as foundation:
        manager = foundation.manager
        manager.summaries.summarizer = _summary
        manager.summaries.policy = CompactionPolicy(trigger_turns=3, keep_turns=1, timeout=60.0)
        session = TurnloomSession("s1", manager)
        for n in range(4):
            await session.add_items([_user(n), _reply(n)])  # type: ignore[list-item]
            for _ in range(10):  # the summarizer's task runs
                await anyio.sleep(0)
        manager.summaries.policy = None
        before = manager.history("s1").turn_ids
        assert is_summary_turn(before[0])
        summary = {"role": "user", "content": "Summary of 6 messages."}
        assert await session.get_items() == [summary, _user(3), _reply(3)]
        assert await session.pop_item() == _reply(3)
        assert manager.history("s1").turn_ids == before
        for n in range(4, 8):
            await session.add_items([_user(n), _reply(n)])  # type: ignore[list-item]
        assert is_summary_turn(manager.history("s1").turn_ids[0])
        assert await session.get_items() == [
            summary,
            *(i for n in range(5, 8) for i in (_user(n), _reply(n))),
        ]


async def test_a_window_never_cuts_a_responses_items_from_their_reasoning(
    anyio_backend: str,
) -> None:
    """Invariant: get_items(limit) never starts inside a model response after its
    reasoning item: the Responses API refuses a function_call or output message whose
    response's reasoning item is missing ("Item 'fc_...' of type 'function_call' was
    provided without its required 'reasoning' item"). The response's items are left
    out with the reasoning, and their outputs with them. Before the fix
    get_items(limit=4) began with the second parallel call.

    Mutant tried: the window cut at len - limit (as before): fails."""
    call_2 = {**CALL, "call_id": "c2", "id": "fc_2"}
    output_2 = {**OUTPUT, "call_id": "c2"}
    stored = [USER, REASONING, CALL, call_2, OUTPUT, output_2, REPLY]
    async with Foundation(gateway="openai_responses") as foundation:
        session = TurnloomSession("s1", foundation.manager)
        await session.add_items(copy.deepcopy(stored))  # type: ignore[arg-type]
        assert await session.get_items(limit=6) == stored[1:]
        for limit in (5, 4):
            assert await session.get_items(limit=limit) == [REPLY]
        assert await session.get_items(limit=1) == [REPLY]

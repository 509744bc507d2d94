"""``TurnloomSession.add_items`` is all or nothing when the door refuses an output.

a93bd72 made ``manager.record`` refuse a tool result answering no open call
(UnpairedResultError). ``add_items`` commits the batch's user input first and
records the outputs after it, so such a refusal leaves the new turn committed.
"""

from __future__ import annotations

import pytest

pytest.importorskip("agents")

from turnloom.errors import UnpairedResultError
from turnloom.integrations.openai_agents import TurnloomSession
from turnloom.runtime import Foundation

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "Hi."}
REPLY = {"type": "message", "role": "assistant", "content": "Hello."}
ASK = {"role": "user", "content": "Delete the old branch."}
CALL = {"type": "function_call", "call_id": "c1", "name": "delete_branch", "arguments": "{}"}
STRAY = {"type": "function_call_output", "call_id": "c2", "output": "deleted"}


async def test_a_refused_output_leaves_the_session_as_it_was(anyio_backend: str) -> None:
    """Invariant: add_items([user, call c1, output c2]) (an output answering no call) is
    refused with UnpairedResultError naming the output, and the session holds exactly
    what it held before: the docstring says the items are "checked before anything
    changes", and an SDK that retries the batch must not find its user input twice.

    Mutant tried: the committed input left in place when its outputs are refused:
    this test fails."""
    async with Foundation(gateway="openai_responses") as foundation:
        session = TurnloomSession("s1", foundation.manager)
        await session.add_items([USER, REPLY])  # type: ignore[list-item]
        before = await session.get_items()
        turns = foundation.manager.history("s1").turn_ids
        with pytest.raises(UnpairedResultError) as caught:
            await session.add_items([ASK, CALL, STRAY])  # type: ignore[list-item]
        assert caught.value.call_id == "c2"
        assert await session.get_items() == before
        assert foundation.manager.history("s1").turn_ids == turns


@pytest.mark.parametrize("limit", [3, 4, 5, 6, 8, 100])
async def test_a_limit_above_the_items_held_returns_every_item(
    anyio_backend: str, limit: int
) -> None:
    """Invariant: get_items(limit) with more room than items held returns them all.
    Before the fix a limit between the count and twice the count sliced from a
    negative start (len - limit) and returned only the newest 2 * len - limit
    items: with 4 items held, get_items(5) returned 1 and get_items(6) 2, so the
    SDK sent the model a history cut at an arbitrary point.

    Mutant tried: the old slice (items[len(items) - limit:]): limits 5 and 6 fail."""
    async with Foundation(gateway="openai_responses") as foundation:
        session = TurnloomSession("s1", foundation.manager)
        items = [USER, REPLY, ASK, {**REPLY, "content": "Done."}]
        await session.add_items(items)  # type: ignore[arg-type]
        expected = items if limit >= 4 else items[-limit:]
        assert await session.get_items(limit) == expected

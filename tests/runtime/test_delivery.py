"""The runtime never loses, repeats or leaks: pairing across turns, failed renders,
removal, late delivery and voice interruption.

Every async test runs on asyncio and on trio (``anyio_backend`` fixture).
"""

from __future__ import annotations

import pytest

from tests.runtime.helpers import CHAT, call, result, user
from tests.runtime.stress import run_stress
from turnloom.context import complete_pairs
from turnloom.context.pairing import OpenCallPolicy
from turnloom.runtime import ContextPrepareRequest, Foundation, PreparedContext, TurnSnapshot
from turnloom.runtime.manager import ContextManager

pytestmark = pytest.mark.anyio


def cold_render(manager: ContextManager, context_id: str, turn_id: str) -> list[object]:
    """The oracle: the retained history paired as one input and rendered without caches."""
    messages = manager.history(context_id).input_messages(turn_id)
    policy = manager.open_calls
    return [i for m in complete_pairs(list(messages), open_calls=policy) for i in CHAT.render(m)]


def history_items(prepared: PreparedContext) -> list[object]:
    """The prepared items before the runtime-state pair and the area section."""
    return list(prepared.items[: prepared.area_start - (2 if prepared.state_call_id else 0)])


@pytest.mark.parametrize("policy", ["exclude", "cancel"])
async def test_a_tool_result_given_as_the_next_turns_input_pairs_with_its_call(
    policy: OpenCallPolicy,
) -> None:
    """Issue small input: t2's input is the result of t1's call (an approval flow):
    prepare(t2) holds the user message, the call and its result, in that order, and
    under open_calls="cancel" nothing claims the call was cancelled."""
    async with Foundation(open_calls=policy) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(context_id="c", turn_id="t1", input=(user("Delete the old branch."),))
        )
        manager.record("c", "t1", [call("c1", "delete_branch")])
        manager.accept_turn(
            TurnSnapshot(context_id="c", turn_id="t2", input=(result("c1", "deleted"),))
        )
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        assert list(prepared.items) == [
            {"role": "user", "content": "Delete the old branch."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "delete_branch", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "deleted"},
        ]
        assert prepared.turn_start == 2
        assert CHAT.validate(prepared.items) == []
        assert list(prepared.items) == cold_render(manager, "c", "t2")


@pytest.mark.parametrize("policy", ["exclude", "cancel"])
async def test_after_failed_renders_every_prepared_input_equals_a_cold_render(
    anyio_backend: str, policy: OpenCallPolicy
) -> None:
    """Invariant: with a gateway failing renders at random points, every prepared input
    equals a cold render of the retained history and passes validate() (a short run of
    scripts/stress_render_failures.py)."""
    report = await run_stress(prepares=1_500, seed=len(anyio_backend) + len(policy), policy=policy)
    assert report.prepares == 1_500
    assert report.failed > 50  # failures really were injected mid-render
    assert report.approvals > 20
    assert report.evicted_turns > 100
    assert (report.wrong, report.invalid) == (0, 0)

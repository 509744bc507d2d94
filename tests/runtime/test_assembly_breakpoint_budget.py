"""The stratified strategy's Anthropic breakpoint within the budget of 4 (issue 30).

Anthropic refuses a request with more than 4 ``cache_control`` breakpoints
(prompt caching guide). The strategy's mark on the assembled system prompt
counts the host's own marks (message ``extras``) in the prefix: when they
already use the budget, the prompt goes without its mark, counted in
``statistics().assembly.breakpoints_skipped_total``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.runtime.helpers import SYSTEM
from turnloom.context import Message, Role, TextPart
from turnloom.context.cache import anthropic_breakpoints
from turnloom.context.gateways import AnthropicGateway
from turnloom.runtime import ContextPrepareRequest, Foundation, StrategyOptions, TurnSnapshot

pytestmark = pytest.mark.anyio

MARK = {"type": "ephemeral"}


def _marked_user(*texts: str) -> Message:
    parts = tuple(TextPart(text=text, extras={"cache_control": dict(MARK)}) for text in texts)
    return Message(role=Role.user, content=parts)


async def _body(host_marks: int) -> tuple[dict[str, Any], int]:
    options = StrategyOptions(instructions="policy " * 900)  # long enough to be marked
    texts = [f"note {n}" for n in range(host_marks)]
    async with Foundation(
        gateway="anthropic", strategy="stratified", strategy_options=options
    ) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(
                context_id="c",
                turn_id="t1",
                instructions=(SYSTEM,),
                input=(
                    _marked_user(*texts[:2])
                    if texts[:2]
                    else Message(role=Role.user, content="hi"),
                ),
            )
        )
        async with manager.invocation("c", "t1") as invocation:
            invocation.record([Message(role=Role.assistant, content="ok")])
        later = _marked_user(*texts[2:]) if texts[2:] else Message(role=Role.user, content="next")
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(later,)))
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        skipped = manager.statistics().assembly.breakpoints_skipped_total
    return manager.gateway.request_body(prefix.items), skipped


async def test_four_host_marks_leave_no_room_for_the_strategys_mark() -> None:
    """Invariant: host marks + the strategy's never exceed 4; the skipped mark is counted."""
    body, skipped = await _body(4)
    assert len(anthropic_breakpoints(body)) == 4
    assert all(m.field == "messages" for m in anthropic_breakpoints(body))
    assert "cache_control" not in body["system"][0]
    assert skipped == 1
    assert AnthropicGateway().validate_request(body) == []


async def test_three_host_marks_keep_the_strategys_mark() -> None:
    """Invariant: with room left, the assembled prompt keeps its breakpoint (4 in all)."""
    body, skipped = await _body(3)
    marks = anthropic_breakpoints(body)
    assert [m.field for m in marks] == ["system", "messages", "messages", "messages"]
    assert body["system"][0]["cache_control"] == MARK
    assert skipped == 0

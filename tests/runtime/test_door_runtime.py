"""The runtime's doors (accept_turn, record, route, build) check once, completely, first."""

from __future__ import annotations

from typing import Any

import pytest

from turnloom.context import GatewayType, Message, Role, TextPart, ToolCallPart
from turnloom.errors import InvalidMessageError, InvalidTextError, TurnTooLargeError
from turnloom.runtime import (
    ContextPrepareRequest,
    Foundation,
    HistoryLimits,
    TurnSnapshot,
)

pytestmark = pytest.mark.anyio


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


async def test_mutating_extras_after_commit_changes_no_later_input() -> None:
    """Committed values are private copies: the host's dict is not held by reference."""
    extras: dict[str, Any] = {"refusal": "alice"}
    text_extras: dict[str, Any] = {"cache_marker": {"n": 1}}
    async with Foundation(gateway=GatewayType.openai_chat) as foundation:
        manager = foundation.manager
        message = Message(
            role=Role.user, content=(TextPart(text="hi", extras=text_extras),), extras=extras
        )
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(message,)))
        first = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        extras["role"] = "system"
        extras["refusal"] = "bad \ud800"
        text_extras["cache_marker"]["n"] = float("nan")
        manager.accept_turn(
            TurnSnapshot(
                context_id="c", turn_id="t2", input=(Message(role=Role.user, content="more"),)
            )
        )
        second = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        assert second.items[: len(first.items)] == first.items
        assert first.items[0] == {
            "role": "user",
            "content": [{"type": "text", "text": "hi", "cache_marker": {"n": 1}}],
            "refusal": "alice",
        }


async def test_deep_json_is_a_typed_error_from_record_and_accept_turn() -> None:
    async with Foundation(gateway=GatewayType.anthropic) as foundation:
        manager = foundation.manager
        deep = Message(role=Role.user, content="hi", extras={"x": _deep(1_000)})
        with pytest.raises(InvalidMessageError, match="nests JSON deeper than 64 levels"):
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(deep,)))
        manager.accept_turn(
            TurnSnapshot(
                context_id="c", turn_id="t1", input=(Message(role=Role.user, content="hi"),)
            )
        )
        arguments = '{"a":' * 1_000 + "1" + "}" * 1_000
        call = Message(
            role=Role.assistant,
            content=(ToolCallPart(call_id="c1", name="f", arguments=arguments),),
        )
        with pytest.raises(InvalidMessageError, match="nests JSON deeper than 64 levels"):
            manager.record("c", "t1", [call])
        surrogate = Message(
            role=Role.assistant,
            content=(ToolCallPart(call_id="c1", name="f", arguments='{"q": "\\ud83c"}'),),
        )
        with pytest.raises(InvalidTextError):
            manager.record("c", "t1", [surrogate])
        assert manager.history("c").turn_messages("t1") == (Message(role=Role.user, content="hi"),)


async def test_a_million_message_turn_is_refused_by_its_length_first() -> None:
    """With max_items=4096 a 1,000,000-message turn never reaches per-message checks."""
    async with Foundation(history_limits=HistoryLimits(max_items=4096)) as foundation:
        manager = foundation.manager
        batch: tuple[Any, ...] = ("not a message",) * 1_000_000
        with pytest.raises(TurnTooLargeError) as info:
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=batch))
        assert (info.value.unit, info.value.size, info.value.limit) == ("items", 1_000_000, 4096)
        assert manager.context_ids() == ()
        manager.accept_turn(
            TurnSnapshot(
                context_id="c", turn_id="t1", input=(Message(role=Role.user, content="hi"),)
            )
        )
        with pytest.raises(TurnTooLargeError) as info:
            manager.record("c", "t1", list(batch[:4096]))
        assert (info.value.unit, info.value.size) == ("items", 4097)
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        with pytest.raises(TurnTooLargeError):
            manager.build(prefix, list(batch[:5000]))


async def test_route_refuses_deep_items_typed() -> None:
    async with Foundation(gateway=GatewayType.openai_chat) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(
                context_id="c", turn_id="t1", input=(Message(role=Role.user, content="hi"),)
            )
        )
        with pytest.raises(InvalidMessageError):
            manager.areas.route("c", {"role": "assistant", "content": "x", "meta": _deep(5_000)})
        with pytest.raises(InvalidMessageError):
            manager.areas.route("c", {"role": "assistant", "content": "x", "meta": _deep(100)})

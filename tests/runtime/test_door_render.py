"""Provider rules fail at the door: a message the gateway cannot render is never committed."""

from __future__ import annotations

import pytest

from turnloom.context import (
    GatewayType,
    Message,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)
from turnloom.errors import InvalidMessageError, ItemTooLargeError
from turnloom.runtime import (
    ContextContribution,
    ContextPrepareRequest,
    Foundation,
    HistoryLimits,
    TurnSnapshot,
)

pytestmark = pytest.mark.anyio

_TRUNCATED = Message(
    role=Role.assistant,
    content=(
        TextPart(text="Looking it up."),
        ToolCallPart(call_id="c1", name="find_bag", arguments='{"tag": 1'),
    ),
)


@pytest.mark.parametrize("gateway", list(GatewayType))
async def test_truncated_tool_arguments_are_rejected_at_record_and_history_is_unchanged(
    gateway: GatewayType,
) -> None:
    """Invariant: one bad output cannot break every later prepare of its context."""
    async with Foundation(gateway=gateway) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(
                context_id="c",
                turn_id="t1",
                input=(Message(role=Role.user, content="Where is my bag?"),),
            )
        )
        before = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        with pytest.raises(InvalidMessageError, match=r"Output of turn 't1'\[0\]") as info:
            manager.record("c", "t1", [_TRUNCATED])
        assert info.value.field == "content[1].arguments"
        manager.accept_turn(
            TurnSnapshot(
                context_id="c",
                turn_id="t2",
                input=(Message(role=Role.user, content="Any news?"),),
            )
        )
        after = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        assert after.item_count == before.item_count + 1
        assert after.items[: before.item_count] == before.items


@pytest.mark.parametrize("gateway", list(GatewayType))
async def test_truncated_tool_arguments_in_turn_input_are_rejected_before_commit(
    gateway: GatewayType,
) -> None:
    """Arguments are strict JSON object text on every gateway: refused at the door."""
    async with Foundation(gateway=gateway) as foundation:
        manager = foundation.manager
        with pytest.raises(InvalidMessageError, match=r"Turn 't1' input\[1\]"):
            manager.accept_turn(
                TurnSnapshot(
                    context_id="c",
                    turn_id="t1",
                    input=(Message(role=Role.user, content="Hi"), _TRUNCATED),
                )
            )
        assert manager.context_ids() == ()


async def test_openai_chat_carries_arguments_text_verbatim() -> None:
    """OpenAI Chat sends valid arguments text as it came (whitespace and key order kept)."""
    async with Foundation(gateway=GatewayType.openai_chat) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(
                context_id="c", turn_id="t1", input=(Message(role=Role.user, content="Hi"),)
            )
        )
        text = '{"z": 1,   "a": [2]}'
        call = Message(
            role=Role.assistant, content=(ToolCallPart(call_id="c1", name="f", arguments=text),)
        )
        assert manager.record("c", "t1", [call]) == 1
        assert manager.gateway.render(call)[0]["tool_calls"][0]["function"]["arguments"] == text


@pytest.mark.parametrize("gateway", list(GatewayType))
@pytest.mark.parametrize("text", ["", "   ", "\n\n"])
async def test_a_turn_whose_input_renders_to_nothing_is_rejected_before_commit(
    gateway: GatewayType, text: str
) -> None:
    """Invariant: no prepared input is ever an empty request (every provider rejects one)."""
    async with Foundation(gateway=gateway) as foundation:
        manager = foundation.manager
        with pytest.raises(InvalidMessageError, match="has no input that renders to content"):
            manager.accept_turn(
                TurnSnapshot(
                    context_id="c", turn_id="t1", input=(Message(role=Role.user, content=text),)
                )
            )
        assert manager.context_ids() == ()


_KEPT_BLANK = {
    kind: Message(role=Role.user, content=" ", layout={"gateway": kind.value, "keep_blank": True})
    for kind in (GatewayType.gemini, GatewayType.openai_responses)
}
_ORPHAN = Message(
    role=Role.tool, content=(ToolResultPart(call_id="c9", content=(TextPart(text="r"),)),)
)


@pytest.mark.parametrize(
    ("gateway", "message"),
    [
        *(pytest.param(k, m, id=f"kept-blank-{k.value}") for k, m in _KEPT_BLANK.items()),
        *(pytest.param(k, _ORPHAN, id=f"orphan-result-{k.value}") for k in GatewayType),
    ],
)
async def test_a_first_turn_whose_input_the_prepared_input_leaves_out_is_rejected_before_commit(
    gateway: GatewayType, message: Message
) -> None:
    """Invariant: no prepared input is ever an empty request, also when the input renders
    alone but pairing leaves it out (blank text the gateway would keep for a recording,
    a result answering no call)."""
    async with Foundation(gateway=gateway) as foundation:
        manager = foundation.manager
        assert manager.gateway.render(message) != []
        with pytest.raises(InvalidMessageError, match="has no input that renders to content"):
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(message,)))
        assert manager.context_ids() == ()


@pytest.mark.parametrize("gateway", list(_KEPT_BLANK))
async def test_a_later_turn_of_kept_blank_text_only_is_rejected_not_left_out_of_the_input(
    gateway: GatewayType,
) -> None:
    """Invariant: a committed turn's input is in its prepared input (never silently lost)."""
    async with Foundation(gateway=gateway) as foundation:
        manager = foundation.manager
        hello = Message(role=Role.user, content="Hello")
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(hello,)))
        with pytest.raises(InvalidMessageError, match="has no input that renders to content"):
            manager.accept_turn(
                TurnSnapshot(context_id="c", turn_id="t2", input=(_KEPT_BLANK[gateway],))
            )
        assert manager.history("c").turn_ids == ("t1",)


async def test_runtime_state_over_the_item_cap_is_rejected_at_the_call_without_a_slot() -> None:
    """Invariant: the state result obeys the per-item byte cap like any history item."""
    limits = HistoryLimits(max_item_bytes=1000)
    async with Foundation(history_limits=limits) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(
                context_id="c", turn_id="t1", input=(Message(role=Role.user, content="Hi"),)
            )
        )
        big = ContextContribution(name="memory", content="x" * 995)
        with pytest.raises(ItemTooLargeError, match="carries at least 1001 bytes") as caught:
            await manager.prepare(
                ContextPrepareRequest(context_id="c", turn_id="t1", contributions=(big,))
            )
        assert (caught.value.size, caught.value.limit) == (1001, 1000)
        assert manager.statistics().preparations.pending == 0


async def test_runtime_state_whose_encoding_exceeds_the_cap_fails_the_preparation() -> None:
    """Escaping can push the encoded result over the cap: the worker measures it exactly."""
    limits = HistoryLimits(max_item_bytes=1000)
    async with Foundation(history_limits=limits) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(
                context_id="c", turn_id="t1", input=(Message(role=Role.user, content="Hi"),)
            )
        )
        # 400 quotes: 406 characters carried, each quote escaped twice over
        # (in the state document, then in the native item's JSON string).
        quoted = ContextContribution(name="memory", content='"' * 400)
        with pytest.raises(ItemTooLargeError, match="runtime-state result of turn 't1'"):
            await manager.prepare(
                ContextPrepareRequest(context_id="c", turn_id="t1", contributions=(quoted,))
            )
        stats = manager.statistics()
        assert (stats.preparations.pending, stats.preparations.failed_total) == (0, 1)
        ok = await manager.prepare(
            ContextPrepareRequest(
                context_id="c",
                turn_id="t1",
                contributions=(ContextContribution(name="memory", content="fits"),),
            )
        )
        assert ok.state_call_id is not None


async def test_a_cancelled_call_that_only_began_to_think_is_not_recorded() -> None:
    """Issue 5: an empty partial output (blank text, unsigned blank reasoning) is not recorded."""
    async with Foundation(gateway=GatewayType.anthropic) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(
                context_id="c", turn_id="t1", input=(Message(role=Role.user, content="Hi"),)
            )
        )
        partial = Message(
            role=Role.assistant,
            content=(ReasoningPart(text="  ", gateway="anthropic"), TextPart(text="\n\n")),
        )
        signed = Message(
            role=Role.assistant,
            content=(ReasoningPart(text="", signature="sig", gateway="anthropic"),),
        )
        assert manager.record("c", "t1", [partial]) == 0
        assert manager.record("c", "t1", [signed]) == 1
        assert manager.history("c").turn_messages("t1")[1:] == (signed,)


async def test_an_anthropic_call_id_the_api_rejects_is_sent_renamed() -> None:
    """Invariant: a recorded call id outside Anthropic's pattern never reaches the wire.

    ``functions.get_weather:0`` (another provider's id) is recorded as it is,
    and every prepared input carries it as ``functions_get_weather_0`` in the
    call and its result, so the request validates.
    """
    foreign = Message(
        role=Role.assistant,
        content=(ToolCallPart(call_id="functions.get_weather:0", name="get_weather"),),
    )
    answer = Message(
        role=Role.tool,
        content=(
            ToolResultPart(call_id="functions.get_weather:0", content=(TextPart(text="Sunny"),)),
        ),
    )
    async with Foundation(gateway=GatewayType.anthropic) as foundation:
        manager = foundation.manager
        for turn in ("t1", "t2"):
            manager.accept_turn(
                TurnSnapshot(
                    context_id="c", turn_id=turn, input=(Message(role=Role.user, content="Hi"),)
                )
            )
            if turn == "t1":
                assert manager.record("c", "t1", [foreign, answer]) == 2
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        body = manager.gateway.request_body(prefix.items)
        blocks = [
            b
            for item in body["messages"][1:3]
            for b in item["content"]
            if b["type"] in ("tool_use", "tool_result")
        ]
        assert [b.get("id") or b.get("tool_use_id") for b in blocks] == [
            "functions_get_weather_0",
            "functions_get_weather_0",
        ]
        assert manager.gateway.validate(body["messages"]) == []

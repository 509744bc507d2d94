"""An OpenAI Chat reply of only ``audio`` or ``refusal`` survives into later inputs.

Regression: such a reply parsed to a message with no parts (the fields were
kept as extras), which the history took for an empty output: not recorded,
counted as blank, and missing from every later input. Through the public
API: the reply is recorded, the next turn's input is prepared, and the reply
is in it (on every gateway, as what that provider can carry), or it is left
out and counted in ``unrendered_messages_total``.
"""

from __future__ import annotations

from typing import Any

import pytest

from turnloom.context import GatewayType, Message, Role, get_gateway
from turnloom.errors import InvalidMessageError
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio

_CHAT = get_gateway(GatewayType.openai_chat)
_HI = {"role": "user", "content": "Hi"}
_MORE = {"role": "user", "content": "More"}

_REFUSAL = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
_AUDIO_ID = {"role": "assistant", "content": None, "audio": {"id": "audio_abc123"}}
_AUDIO_TRANSCRIPT = {
    "role": "assistant",
    "content": None,
    "audio": {"id": "audio_abc123", "expires_at": 1729018505, "transcript": "Hello there."},
}


async def _next_input(gateway: GatewayType, reply: dict[str, Any]) -> tuple[tuple[Any, ...], Any]:
    """Record ``reply`` (parsed by the OpenAI Chat gateway) in turn t1; prepare turn t2."""
    async with Foundation(gateway=gateway) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(
                context_id="c", turn_id="t1", input=(Message(role=Role.user, content="Hi"),)
            )
        )
        assert manager.record("c", "t1", [_CHAT.parse(reply)]) == 1
        manager.accept_turn(
            TurnSnapshot(
                context_id="c", turn_id="t2", input=(Message(role=Role.user, content="More"),)
            )
        )
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        return prepared.items, manager.statistics().history


@pytest.mark.parametrize("reply", [_REFUSAL, _AUDIO_ID, _AUDIO_TRANSCRIPT])
async def test_openai_chat_sends_a_fields_only_reply_back_exactly(reply: dict[str, Any]) -> None:
    """Invariant: the recorded reply is in the next input, exactly as OpenAI Chat returned it."""
    items, history = await _next_input(GatewayType.openai_chat, reply)
    assert items == (_HI, reply, _MORE)
    assert (history.dropped_blank_outputs_total, history.unrendered_messages_total) == (0, 0)


_AS_TEXT: dict[GatewayType, Any] = {
    GatewayType.anthropic: lambda text: {
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
    },
    GatewayType.gemini: lambda text: {"role": "model", "parts": [{"text": text}]},
    GatewayType.openai_responses: lambda text: {"role": "assistant", "content": text},
}


@pytest.mark.parametrize("gateway", list(_AS_TEXT))
@pytest.mark.parametrize(
    ("reply", "text"),
    [(_REFUSAL, "I can't help with that."), (_AUDIO_TRANSCRIPT, "Hello there.")],
)
async def test_other_gateways_carry_a_refusal_or_transcript_as_assistant_text(
    gateway: GatewayType, reply: dict[str, Any], text: str
) -> None:
    items, history = await _next_input(gateway, reply)
    assert items[1] == _AS_TEXT[gateway](text)
    assert len(items) == 3
    assert (history.dropped_blank_outputs_total, history.unrendered_messages_total) == (0, 0)


@pytest.mark.parametrize("gateway", list(_AS_TEXT))
async def test_other_gateways_leave_out_an_audio_reference_and_count_it(
    gateway: GatewayType,
) -> None:
    """Never silently: held (another gateway may carry it), left out here, counted once."""
    items, history = await _next_input(gateway, _AUDIO_ID)
    assert len(items) == 2  # the two user messages (Gemini and Anthropic may join them)
    assert (history.dropped_blank_outputs_total, history.unrendered_messages_total) == (0, 1)
    assert history.items == 3


@pytest.mark.parametrize("gateway", list(GatewayType))
async def test_a_legacy_function_call_is_refused_at_the_door_naming_tool_calls(
    gateway: GatewayType,
) -> None:
    """The deprecated form cannot reach a history: a typed error, nothing recorded."""
    async with Foundation(gateway=gateway) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(
                context_id="c", turn_id="t1", input=(Message(role=Role.user, content="Hi"),)
            )
        )
        with pytest.raises(InvalidMessageError, match="tool_calls entry") as info:
            manager.record(
                "c",
                "t1",
                [
                    _CHAT.parse(
                        {
                            "role": "assistant",
                            "content": None,
                            "function_call": {"name": "get_weather", "arguments": "{}"},
                        }
                    )
                ],
            )
        assert info.value.field == "function_call"
        assert manager.statistics().history.items == 1

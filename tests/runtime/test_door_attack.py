"""Real host flows against the door's refusal of unpaired tool results (a93bd72).

Each test is a flow a real host produces; the docstrings say what the correct outcome
is. Tests marked failing here are bugs the attack found.
"""

from __future__ import annotations

import pytest

from turnloom.context import GatewayType, Message, Role, get_gateway
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio

ASK = Message(role=Role.user, content="Weather in Paris?")
NEXT = Message(role=Role.user, content="And tomorrow?")

GEMINI_CALL = {
    "role": "model",
    "parts": [
        {"text": "Let me check."},
        {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}},
    ],
}
GEMINI_RESPONSE = {
    "role": "user",
    "parts": [{"functionResponse": {"name": "get_weather", "response": {"temp": 20}}}],
}


async def test_a_gemini_call_without_id_after_text_pairs_with_its_response(
    anyio_backend: str,
) -> None:
    """Invariant: a Gemini exchange parsed by the gemini gateway (a model content with
    text, then a functionCall without id; the user content answering it with a
    functionResponse without id) is recorded and sent whole: ids are optional on Gemini
    and "calls and responses without one are matched by name" (gateway docs).

    Today the call parses as 'get_weather#1' (its part index) and the response as
    'get_weather#0', so record refuses the response with UnpairedResultError (before
    a93bd72 both were silently left out of every input). Correct: they pair (e.g. the
    synthesized id counts function calls, not parts, or matches by name).

    Mutant tried: n/a (fails on main)."""
    gateway = get_gateway(GatewayType.gemini)
    call, response = gateway.parse_items([GEMINI_CALL, GEMINI_RESPONSE])
    async with Foundation(gateway=GatewayType.gemini) as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(ASK,)))
        manager.record("c", "t1", [call])
        assert manager.record("c", "t1", [response]) == 1
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(NEXT,)))
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        assert list(prepared.items) == [
            {"role": "user", "parts": [{"text": "Weather in Paris?"}]},
            GEMINI_CALL,
            GEMINI_RESPONSE,
            {"role": "user", "parts": [{"text": "And tomorrow?"}]},
        ]

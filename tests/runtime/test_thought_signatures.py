"""Gemini thought signatures survive the runtime: the state call and excluded first calls."""

from __future__ import annotations

import pytest

from turnloom.context import GatewayType, Message, Role, get_gateway
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio

GEMINI = get_gateway(GatewayType.gemini)
PLACEHOLDER = "c2tpcF90aG91Z2h0X3NpZ25hdHVyZV92YWxpZGF0b3I="  # base64 of the documented dummy


async def test_the_state_call_is_signed_and_an_excluded_signed_call_passes_its_signature() -> None:
    """Invariants: the injected runtime-state call carries Google's placeholder signature;
    a parallel step whose signed first call has no result goes out signed, and the
    request passes validate() (which flags unsigned current-turn steps)."""
    async with Foundation(gateway=GatewayType.gemini, behavior_rules="Be brief.") as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(
                context_id="c", turn_id="t1", input=(Message(role=Role.user, content="go"),)
            )
        )
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        state_call = prefix.items[-2]
        assert state_call == {
            "role": "model",
            "parts": [
                {
                    "functionCall": {
                        "id": prefix.state_call_id,
                        "name": "turnloom_runtime_context",
                        "args": {},
                    },
                    "thoughtSignature": PLACEHOLDER,
                }
            ],
        }
        step = GEMINI.parse(
            {
                "role": "model",
                "parts": [
                    {
                        "functionCall": {"id": "a", "name": "f", "args": {}},
                        "thoughtSignature": "U0lHX0E=",
                    },
                    {"functionCall": {"id": "b", "name": "f", "args": {}}},
                ],
            }
        )
        answer_b = GEMINI.parse(
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"id": "b", "name": "f", "response": {"output": "B"}}}
                ],
            }
        )
        items = manager.build(prefix, [step, answer_b])
        assert items[len(prefix.items)] == {
            "role": "model",
            "parts": [
                {
                    "functionCall": {"id": "b", "name": "f", "args": {}},
                    "thoughtSignature": "U0lHX0E=",
                }
            ],
        }
        assert GEMINI.validate(GEMINI.request_body(items)["contents"]) == []

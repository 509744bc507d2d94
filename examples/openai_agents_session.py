"""An OpenAI Agents SDK agent whose session is a turnloom context (offline, scripted model).

Run: ``python examples/openai_agents_session.py`` (needs ``pip install 'turnloom[openai-agents]'``).
The model is a stand-in that answers from a script, so nothing goes to the network.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agents import Agent, ModelResponse, Runner, Usage, function_tool, set_tracing_disabled
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from turnloom.context import HistoryLimits
from turnloom.integrations.openai_agents import TurnloomSession
from turnloom.runtime import Foundation


class ScriptedModel(Model):
    """Stands in for the LLM: the first call asks for the tool, later calls answer."""

    def __init__(self) -> None:
        self.calls = 0

    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **k: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            item: Any = ResponseFunctionToolCall(
                id="fc_1", type="function_call", call_id="c1", name="find_bag",
                arguments='{"tag": "X1"}', status="completed",
            )  # fmt: skip
        else:
            text = f"Answer {self.calls} (I saw {len(input)} items)."
            part = ResponseOutputText(type="output_text", text=text, annotations=[])
            item = ResponseOutputMessage(
                id=f"msg_{self.calls}", type="message", role="assistant",
                status="completed", content=[part],
            )  # fmt: skip
        return ModelResponse(output=[item], usage=Usage(), response_id=None)

    def stream_response(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError


# --- host code: the scenario (a tool call, then the caller hangs up) ---
@function_tool
def find_bag(tag: str) -> str:
    """Find a bag by its tag."""
    return f"Gate 4 ({tag})"


async def main() -> None:
    agent = Agent(name="airline", instructions="Be brief.", model=ScriptedModel(), tools=[find_bag])
    limits = HistoryLimits(max_turns=8)
    async with Foundation(gateway="openai_responses", history_limits=limits) as foundation:
        session = TurnloomSession("call-42", foundation.manager)
        for question in ("Where is my bag?", "Thanks."):
            result = await Runner.run(agent, question, session=session)
            print("agent:", result.final_output)
        print("items held:", [i.get("type", i.get("role")) for i in await session.get_items()])
        await session.clear_session()  # the caller hung up
        print("after hang-up:", await session.get_items())


# --- end of host code ---

if __name__ == "__main__":
    set_tracing_disabled(True)
    asyncio.run(main())

"""A LiveKit Agents voice agent whose context is turnloom's (offline, scripted LLM).

Run: ``python examples/livekit_voice_agent.py`` (needs ``pip install 'turnloom[livekit]'``).
The LLM is a stand-in that streams scripted replies; the turns are text turns
(``session.run``), the barge-in is LiveKit's own ``conversation_item_added``
event for an interrupted reply, so nothing touches the network or audio.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from livekit.agents import AgentSession, function_tool, llm
from livekit.agents.llm import StopResponse
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS

from turnloom.integrations.livekit import TurnloomAgent
from turnloom.runtime import ContextManager, Foundation


class _Stream(llm.LLMStream):
    def __init__(self, owner: ScriptedLLM, reply: list[Any], **kwargs: Any) -> None:
        super().__init__(owner, **kwargs)
        self._owner, self._reply = owner, reply

    async def _run(self) -> None:
        for piece in self._reply:
            if piece is None:  # the caller cuts in here: the rest is never played
                self._owner.spoken.set()
                await asyncio.Event().wait()
            if isinstance(piece, str):
                delta = llm.ChoiceDelta(role="assistant", content=piece)
            else:
                delta = llm.ChoiceDelta(role="assistant", tool_calls=[piece])
            self._event_ch.send_nowait(llm.ChatChunk(id="r", delta=delta))


class ScriptedLLM(llm.LLM):  # type: ignore[type-arg]
    """Stands in for the LLM: asks for the tool, answers, then starts a long reply."""

    def __init__(self) -> None:
        super().__init__()
        self.spoken = asyncio.Event()
        call = llm.FunctionToolCall(name="find_bag", arguments='{"tag": "X1"}', call_id="c1")
        self.replies: list[list[Any]] = [
            [call],
            ["Your bag is at gate 4."],
            ["You can also ", None, "ask at the desk."],
        ]

    def chat(self, *, chat_ctx: llm.ChatContext, tools: Any = None, **kwargs: Any) -> llm.LLMStream:
        reply = self.replies.pop(0) if self.replies else ["Goodbye."]
        options = kwargs.get("conn_options", DEFAULT_API_CONNECT_OPTIONS)
        return _Stream(self, reply, chat_ctx=chat_ctx, tools=tools or [], conn_options=options)


async def barge_in(session: AgentSession[None], model: ScriptedLLM) -> None:
    """The caller speaks over the reply: LiveKit interrupts it once some text was played."""
    await model.spoken.wait()
    for _ in range(100):  # let the played text reach LiveKit's output (event-loop turns)
        await asyncio.sleep(0)
    await session.interrupt()


async def speak(agent: TurnloomAgent, text: str) -> None:
    """What LiveKit does when speech ends: call the agent's user-turn-completed hook."""
    with contextlib.suppress(StopResponse):  # a false start answers nothing
        await agent.on_user_turn_completed(llm.ChatContext.empty(), llm.ChatMessage(
            role="user", content=[text]))  # fmt: skip


def show(manager: ContextManager, context_id: str) -> None:
    view = manager.history(context_id)
    for message in (m for turn in view.turn_ids for m in view.turn_messages(turn)):
        print(message.role.value, [getattr(p, "text", type(p).__name__) for p in message.content])


# --- host code: tool call, barge-in, false start, hang-up ---
@function_tool
async def find_bag(tag: str) -> str:
    """Find a bag by its tag."""
    return f"Gate 4 ({tag})"


async def main() -> None:
    async with Foundation(gateway="openai_chat") as foundation:
        agent = TurnloomAgent(
            manager=foundation.manager, context_id="call-42", instructions="Be brief.",
            tools=[find_bag], false_start=lambda text: text.strip() in {"", "uh", "hm"},
        )  # fmt: skip
        session: AgentSession[None] = AgentSession(llm=(model := ScriptedLLM()))
        session.on("close", lambda _: agent.aclose_context())  # hang-up removes the context
        await session.start(agent)
        await session.run(user_input="Where is my bag?")  # tool call, then the reply
        session.generate_reply(user_input="Anything else?")
        await barge_in(session, model)  # the caller spoke over the reply
        await speak(agent, "uh")  # a false start: committed, then retracted
        show(foundation.manager, "call-42")
        await session.aclose()  # the caller hung up
        print("contexts after hang-up:", foundation.manager.context_ids())


# --- end of host code ---

if __name__ == "__main__":
    asyncio.run(main())

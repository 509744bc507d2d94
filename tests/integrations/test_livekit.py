"""``TurnloomAgent`` driven by the real LiveKit ``AgentSession`` with a scripted LLM.

LiveKit Agents is asyncio-only, so these tests run on asyncio only. The
session runs text turns (``session.run(user_input=...)``, LiveKit's own test
path); the speech-only hooks (``on_user_turn_completed``, a played reply
cut by a barge-in) are driven with LiveKit's real event objects.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import AgentSession, function_tool, llm
from livekit.agents.llm import StopResponse

from tests.integrations.livekit_fakes import ScriptedLLM
from turnloom.context import HistoryLimits, Message, Role, TextPart, ToolCallPart, ToolResultPart
from turnloom.errors import InvalidArgumentError
from turnloom.integrations.livekit import TurnloomAgent
from turnloom.runtime import ContextManager, ContextPrepareRequest, Foundation, TurnSnapshot


@function_tool
async def find_bag(tag: str) -> str:
    """Find a bag by its tag."""
    return f"Gate 4 ({tag})"


def _script() -> ScriptedLLM:
    return ScriptedLLM(
        [
            [llm.FunctionToolCall(name="find_bag", arguments='{"tag": "X1"}', call_id="c1")],
            ["It is at ", "gate 4."],
            ["Bye."],
        ]
    )


def _shape(ctx: llm.ChatContext) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for item in ctx.items:
        if isinstance(item, llm.ChatMessage):
            out.append((item.role, item.text_content or ""))
        elif isinstance(item, llm.FunctionCall):
            out.append(("call", f"{item.call_id} {item.name} {item.arguments}"))
        elif isinstance(item, llm.FunctionCallOutput):
            out.append(("result", f"{item.call_id} {item.output}"))
    return out


def _history(manager: ContextManager, context_id: str) -> list[tuple[str, str]]:
    view = manager.history(context_id)
    out: list[tuple[str, str]] = []
    for turn in view.turn_ids:
        for message in view.turn_messages(turn):
            for part in message.content:
                if isinstance(part, TextPart):
                    out.append((message.role.value, part.text))
                elif isinstance(part, ToolCallPart):
                    out.append(("call", f"{part.call_id} {part.name} {part.arguments}"))
                elif isinstance(part, ToolResultPart):
                    text = part.content[0]
                    assert isinstance(text, TextPart)
                    out.append(("result", f"{part.call_id} {text.text}"))
    return out


def _agent(manager: ContextManager, context_id: str = "call-1", **kwargs: Any) -> TurnloomAgent:
    return TurnloomAgent(
        manager=manager,
        context_id=context_id,
        instructions="Be brief.",
        tools=[find_bag],
        **kwargs,
    )


HISTORY = [
    ("user", "Where is my bag?"),
    ("call", 'c1 find_bag {"tag": "X1"}'),
    ("result", "c1 Gate 4 (X1)"),
    ("assistant", "It is at gate 4."),
    ("user", "Thanks."),
    ("assistant", "Bye."),
]


async def _two_turns(manager: ContextManager, model: ScriptedLLM, context_id: str) -> None:
    async with AgentSession(llm=model) as session:
        await session.start(_agent(manager, context_id))
        await session.run(user_input="Where is my bag?")
        await session.run(user_input="Thanks.")


def test_a_call_with_a_tool_records_the_exact_history_and_sends_the_exact_next_input() -> None:
    async def main() -> None:
        model = _script()
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            await _two_turns(manager, model, "call-1")
            assert _history(manager, "call-1") == HISTORY
            system = ("system", "Be brief.")
            assert [_shape(c) for c in model.seen] == [
                [system, *HISTORY[:1]],
                [system, *HISTORY[:3]],
                [system, *HISTORY[:5]],
            ]
            # the next turn's provider input, as turnloom prepares it (OpenAI Chat)
            manager.accept_turn(
                TurnSnapshot(
                    context_id="call-1",
                    turn_id="t3",
                    input=(Message(role=Role.user, content="One more."),),
                )
            )
            prefix = await manager.prepare(ContextPrepareRequest(context_id="call-1", turn_id="t3"))
            call = {
                "id": "c1",
                "type": "function",
                "function": {"name": "find_bag", "arguments": '{"tag": "X1"}'},
            }
            assert list(prefix.items) == [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Where is my bag?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "Gate 4 (X1)"},
                {"role": "assistant", "content": "It is at gate 4."},
                {"role": "user", "content": "Thanks."},
                {"role": "assistant", "content": "Bye."},
                {"role": "user", "content": "One more."},
            ]

    asyncio.run(main())


def _text(value: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": value}]


TOOL_USE = {"type": "tool_use", "id": "c1", "name": "find_bag", "input": {"tag": "X1"}}


def test_the_exact_anthropic_inputs_of_the_call_and_of_the_next_turn() -> None:
    """What LiveKit's Anthropic plugin would send for turnloom's input (LiveKit's own
    ``to_provider_format("anthropic")`` of the context the LLM got), and the next turn's
    input on turnloom's Anthropic gateway, from the history the session recorded."""

    async def main() -> None:
        model = _script()
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            await _two_turns(manager, model, "call-1")
            messages, data = model.seen[-1].to_provider_format("anthropic")
            assert data.system_messages == ["Be brief."]
            assert messages == [
                {"role": "user", "content": _text("Where is my bag?")},
                {"role": "assistant", "content": [TOOL_USE]},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "c1",
                            "content": "Gate 4 (X1)",
                            "is_error": False,
                        }
                    ],
                },
                {"role": "assistant", "content": _text("It is at gate 4.")},
                {"role": "user", "content": _text("Thanks.")},
            ]
            view = manager.history("call-1")
            turns = [view.turn_messages(turn) for turn in view.turn_ids]
        async with Foundation(gateway="anthropic") as replay:
            system = Message(role=Role.system, content="Be brief.")
            for n, turn in enumerate([*turns, (Message(role=Role.user, content="One more."),)]):
                replay.manager.accept_turn(
                    TurnSnapshot(
                        context_id="c",
                        turn_id=f"t{n}",
                        instructions=(system,) if n == 0 else None,
                        input=turn[:1],
                    )
                )
                if turn[1:]:
                    replay.manager.record("c", f"t{n}", turn[1:])
            prefix = await replay.manager.prepare(
                ContextPrepareRequest(context_id="c", turn_id="t2")
            )
            assert replay.manager.gateway.request_body(prefix.items) == {
                "system": _text("Be brief."),
                "messages": [
                    {"role": "user", "content": _text("Where is my bag?")},
                    {"role": "assistant", "content": [TOOL_USE]},
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "c1",
                                "content": _text("Gate 4 (X1)"),
                                "is_error": False,
                            }
                        ],
                    },
                    {"role": "assistant", "content": _text("It is at gate 4.")},
                    {"role": "user", "content": _text("Thanks.")},
                    {"role": "assistant", "content": _text("Bye.")},
                    {"role": "user", "content": _text("One more.")},
                ],
            }

    asyncio.run(main())


def test_a_barge_in_records_only_the_played_text_of_the_interrupted_reply() -> None:
    """session.interrupt() mid-reply: LiveKit adds the reply as interrupted, with the
    text played before the cut, and only that enters turnloom's history."""

    async def main() -> None:
        spoken, never = asyncio.Event(), asyncio.Event()

        class Cut(ScriptedLLM):
            def chat(self, **kwargs: Any) -> llm.LLMStream:
                stream = super().chat(**kwargs)

                async def run() -> None:
                    delta = llm.ChoiceDelta(role="assistant", content="Three flights go. ")
                    stream._event_ch.send_nowait(llm.ChatChunk(id="r", delta=delta))
                    spoken.set()
                    await never.wait()  # the rest never comes: the caller cuts in

                stream._run = run  # type: ignore[method-assign]
                return stream

        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            async with AgentSession(llm=Cut([])) as session:
                items: list[llm.ChatMessage] = []
                session.on("conversation_item_added", lambda e: items.append(e.item))
                await session.start(_agent(manager))
                session.generate_reply(user_input="Which flights go to Oslo?")
                await spoken.wait()
                for _ in range(100):  # let the text reach LiveKit's text output (loop turns)
                    await asyncio.sleep(0)
                await session.interrupt()
                never.set()
            reply = items[-1]
            assert (reply.role, reply.interrupted) == ("assistant", True)
            assert _history(manager, "call-1") == [
                ("user", "Which flights go to Oslo?"),
                ("assistant", "Three flights go. "),
            ]

    asyncio.run(main())


def test_a_false_start_retracts_the_turn_and_answers_nothing() -> None:
    async def main() -> None:
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            async with AgentSession(llm=_script()) as session:
                agent = _agent(manager, false_start=lambda text: text.strip() in {"", "uh"})
                await session.start(agent)
                await session.run(user_input="Where is my bag?")
                ctx = llm.ChatContext.empty()
                cough = llm.ChatMessage(role="user", content=["uh"])
                with pytest.raises(StopResponse):
                    await agent.on_user_turn_completed(ctx, cough)
                assert _history(manager, "call-1") == HISTORY[:4]
                real = llm.ChatMessage(role="user", content=["Thanks."])
                await agent.on_user_turn_completed(ctx, real)  # speech: committed, answered
                assert _history(manager, "call-1") == HISTORY[:5]

    asyncio.run(main())


def test_a_hang_up_while_the_model_streams_removes_the_context() -> None:
    """Closing the session mid-reply, then the close hook: no context, nothing recorded late."""

    async def main() -> None:
        release = asyncio.Event()

        class Slow(ScriptedLLM):
            def chat(self, **kwargs: Any) -> llm.LLMStream:
                stream = super().chat(**kwargs)
                run = stream._run

                async def slow() -> None:
                    await release.wait()
                    await run()

                stream._run = slow  # type: ignore[method-assign]
                return stream

        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            agent = _agent(manager)
            session: AgentSession[None] = AgentSession(llm=Slow([["A long answer."]]))
            session.on("close", lambda _: agent.aclose_context())
            await session.start(agent)
            session.generate_reply(user_input="Tell me everything.")
            while "call-1" not in manager.context_ids():
                await asyncio.sleep(0)
            await session.aclose()  # the caller hung up while the model streams
            release.set()
            assert manager.context_ids() == ()
            agent.aclose_context()  # idempotent
            assert manager.statistics().history.turns == 0

    asyncio.run(main())


def test_livekits_own_chat_context_stays_bounded_after_300_turns() -> None:
    """Invariant: LiveKit's own ChatContext holds the 8 newest items plus the turn's
    pair however many turns pass (300: nearly ten times the history's 32 turns)."""

    async def main() -> None:
        limits = HistoryLimits(max_turns=32)
        async with Foundation(gateway="openai_chat", history_limits=limits) as foundation:
            manager = foundation.manager
            async with AgentSession(llm=ScriptedLLM([])) as session:
                agent = _agent(manager, framework_items=8)
                await session.start(agent)
                for n in range(300):
                    await session.run(user_input=f"Question {n}.")
                kinds = [i.type for i in agent.chat_ctx.items]
                # the 8 newest kept at the turn's start (LiveKit puts its instructions
                # back first), then this turn's user message and reply
                assert len(kinds) == 11, kinds
                assert len(manager.history("call-1").turn_ids) == 32
                assert _history(manager, "call-1")[-2:] == [
                    ("user", "Question 299."),
                    ("assistant", "OK."),
                ]

    asyncio.run(main())


def test_fifty_concurrent_calls_each_keep_their_own_exact_history() -> None:
    async def main() -> None:
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            ids = [f"call-{n}" for n in range(50)]
            await asyncio.gather(*(_two_turns(manager, _script(), i) for i in ids))
            for context_id in ids:
                assert _history(manager, context_id) == HISTORY

    asyncio.run(main())


def test_a_wrong_gateway_or_framework_bound_is_an_invalid_argument() -> None:
    async def main() -> None:
        async with Foundation(gateway="anthropic") as foundation:
            with pytest.raises(InvalidArgumentError) as caught:
                _agent(foundation.manager)
            assert caught.value.field == "manager"
        async with Foundation(gateway="openai_chat") as foundation:
            with pytest.raises(InvalidArgumentError) as caught:
                _agent(foundation.manager, framework_items=0)
            assert caught.value.field == "framework_items"

    asyncio.run(main())

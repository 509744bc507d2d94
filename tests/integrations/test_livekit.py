"""``TurnloomAgent`` driven by the real LiveKit ``AgentSession`` with a scripted LLM.

LiveKit Agents is asyncio-only, so these tests run on asyncio only. The
session runs text turns (``session.run(user_input=...)``, LiveKit's own test
path); the speech-only hooks (``on_user_turn_completed``, a played reply
cut by a barge-in) are driven with LiveKit's real event objects.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

pytest.importorskip("livekit.agents")

from livekit.agents import Agent, AgentSession, RunContext, function_tool, llm
from livekit.agents.llm import StopResponse
from livekit.agents.llm.async_toolset import AsyncToolset

from tests.integrations.livekit_fakes import MarkupTTS, ScriptedLLM
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
    """The items of a ChatContext; turnloom's runtime-state pair (its ids vary with the
    turn id) shows as one ``("notes", "name: content | ...")`` item."""
    out: list[tuple[str, str]] = []
    for item in ctx.items:
        if isinstance(item, llm.ChatMessage):
            out.append((item.role, item.text_content or ""))
        elif isinstance(item, llm.FunctionCall):
            if item.name != "turnloom_runtime_context":
                out.append(("call", f"{item.call_id} {item.name} {item.arguments}"))
        elif isinstance(item, llm.FunctionCallOutput):
            if item.call_id.startswith("tlrs_"):
                sections = json.loads(item.output)["sections"]
                notes = " | ".join(f"{s['name']}: {s['content']}" for s in sections)
                out.append(("notes", notes))
            else:
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


def test_a_greeting_before_the_first_user_turn_opens_its_input() -> None:
    """Invariant: what the agent says before the caller's first turn (a greeting, run
    with generate_reply before anyone spoke) is kept: the first turn's input opens with
    it, so turnloom's history and every later model call hold it before the caller.

    Mutant tried: the greeting left out of the first turn's input (as before): the
    history and the next model call lack it."""

    async def main() -> None:
        model = ScriptedLLM([["Hello, ", "how can I help?"], *_script().script])
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            async with AgentSession(llm=model) as session:
                await session.start(_agent(manager))
                await session.generate_reply(instructions="Greet the caller.")
                await session.run(user_input="Where is my bag?")
                await session.run(user_input="Thanks.")
            greeting = ("assistant", "Hello, how can I help?")
            assert _history(manager, "call-1") == [greeting, *HISTORY]
            system = ("system", "Be brief.")
            assert [_shape(c) for c in model.seen[1:]] == [
                [system, greeting, *HISTORY[:1]],
                [system, greeting, *HISTORY[:3]],
                [system, greeting, *HISTORY[:5]],
            ]

    asyncio.run(main())


def test_a_greeting_outlives_a_false_first_turn() -> None:
    """Invariant: when the caller's first turn is a false start (retracted), the greeting
    it opened with opens the next turn's input instead, so it is never lost.

    Mutant tried: the greeting not given back on the retraction: the history lacks it."""

    async def main() -> None:
        model = ScriptedLLM([["Hello."], ["It is at gate 4."]])
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            async with AgentSession(llm=model) as session:
                agent = _agent(manager, false_start=lambda text: text.strip() == "uh")
                await session.start(agent)
                await session.generate_reply(instructions="Greet the caller.")
                ctx = llm.ChatContext.empty()
                with pytest.raises(StopResponse):
                    await agent.on_user_turn_completed(
                        ctx, llm.ChatMessage(role="user", content=["uh"])
                    )
                await session.run(user_input="Where is my bag?")
                assert _history(manager, "call-1") == [
                    ("assistant", "Hello."),
                    ("user", "Where is my bag?"),
                    ("assistant", "It is at gate 4."),
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


def test_every_hook_after_the_foundation_closed_raises_nothing_into_livekit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Invariant: a host that closes the Foundation before LiveKit's session ends (either
    teardown order is real) gets no exception from any hook that runs after the close: a
    played reply and an executed tool batch are refused records (counted in
    ``record_errors``, one warning each), a spoken turn answers nothing (``StopResponse``),
    a text turn's model call runs no model (LiveKit's run ends normally), the close hook
    (``aclose_context``) leaves the context (one INFO record); history is as at the close.

    Mutants tried, one at a time (as before): the reply's record not refused: LiveKit's
    emitter logs the FoundationClosedError and ``record_errors`` stays 0; no closed check in
    ``on_user_turn_completed``/``llm_node``: FoundationClosedError instead of
    StopResponse / out of ``session.run``; ``aclose_context`` catching only
    UnknownContextError: it raises FoundationClosedError."""
    from livekit.agents.voice.events import ConversationItemAddedEvent, FunctionToolsExecutedEvent

    async def main() -> None:
        model = ScriptedLLM([["One."], ["Two."]])
        async with AgentSession(llm=model) as session:
            async with Foundation(gateway="openai_chat") as foundation:
                manager = foundation.manager
                agent = _agent(manager)
                await session.start(agent)
                await session.run(user_input="Where is my bag?")
            with caplog.at_level(logging.INFO, logger="turnloom.integrations.livekit"):
                reply = llm.ChatMessage(role="assistant", content=["Anything else?"], id="r9")
                session.emit("conversation_item_added", ConversationItemAddedEvent(item=reply))
                call = llm.FunctionCall(call_id="c9", name="find_bag", arguments="{}", id="f9")
                out = llm.FunctionCallOutput(call_id="c9", output="Gate 4", is_error=False, id="o9")
                session.emit(
                    "function_tools_executed",
                    FunctionToolsExecutedEvent(function_calls=[call], function_call_outputs=[out]),
                )
                with pytest.raises(StopResponse):
                    await agent.on_user_turn_completed(
                        llm.ChatContext.empty(), llm.ChatMessage(role="user", content=["Hello?"])
                    )
                await session.run(user_input="Still there?")
                agent.aclose_context()
        assert len(model.seen) == 1
        assert agent.record_errors == 2
        assert _history(manager, "call-1") == [("user", "Where is my bag?"), ("assistant", "One.")]
        closed = "TurnloomAgent 'call-1': the Foundation closed before LiveKit's session ended; "
        refused = "TurnloomAgent 'call-1': turnloom refused LiveKit's items {} for turn {!r}: "
        turn = manager.history("call-1").turn_ids[0]
        drained = (
            "FoundationClosedError('The Foundation is closed; its output streams were drained "
            "and no more outputs are recorded.')"
        )
        assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
            ("WARNING", refused.format(["r9"], turn) + drained),
            ("WARNING", refused.format(["f9", "o9"], turn) + drained),
            ("WARNING", closed + "the caller's turn is not committed and gets no reply."),
            ("WARNING", closed + "no model call runs."),
            (
                "INFO",
                "TurnloomAgent 'call-1': the call's context was not removed: the Foundation "
                "closed first; it stays as the Foundation left it (in its store, if it has one).",
            ),
        ]

    asyncio.run(main())


class _StuckAssembly:
    """An assembly strategy that never finishes: the turn's preparation waits in it."""

    name = "stuck"

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    def tool_definitions(self, gateway: Any) -> list[dict[str, Any]]:
        return []

    async def assemble(self, **kwargs: Any) -> Any:
        self.entered.set()
        await asyncio.Event().wait()


def test_a_model_call_whose_preparation_the_foundations_close_ends_runs_no_model(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Invariant: when the Foundation closes while a model call's input is prepared, the
    call runs no model and LiveKit's run ends normally (no FoundationClosedError into its
    inference task); one warning says so.

    Mutant tried: ``prepare`` in ``llm_node`` without its FoundationClosedError handling:
    ``session.run`` raises it."""

    async def main() -> None:
        model = ScriptedLLM([["One."]])
        stuck = _StuckAssembly()
        options: Any = {"strategy": stuck, "close_grace_period": 0.05}
        with caplog.at_level(logging.WARNING, logger="turnloom.integrations.livekit"):
            async with AgentSession(llm=model) as session:
                async with Foundation(gateway="openai_chat", **options) as foundation:
                    await session.start(_agent(foundation.manager))
                    run: asyncio.Future[Any] = asyncio.ensure_future(
                        session.run(user_input="Where is my bag?")
                    )
                    await stuck.entered.wait()
                await run
        assert model.seen == []
        assert [r.getMessage() for r in caplog.records] == [
            "TurnloomAgent 'call-1': the Foundation closed before LiveKit's session ended; "
            "no model call runs."
        ]

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


def _gated_find_bag(started: asyncio.Event, release: asyncio.Event) -> Any:
    @function_tool
    async def find_bag(tag: str) -> str:
        """Find a bag by its tag."""
        started.set()
        await release.wait()
        return f"Gate 4 ({tag})"

    return find_bag


BARGE_IN_HISTORY = [
    ("user", "Where is my bag?"),
    ("call", 'c1 find_bag {"tag": "X1"}'),
    ("result", "c1 Gate 4 (X1)"),
    ("user", "Thanks."),
    ("assistant", "You are welcome."),
    ("user", "Bye now."),
    ("assistant", "Bye."),
]


async def _barge_in_during_a_tool(*, message_before_result: bool) -> tuple[Any, TurnloomAgent]:
    """Turn 1's model calls find_bag; the caller cuts in while it runs (session.interrupt()).
    LiveKit waits for the tool, then adds its call and output by creation time: both before
    the next user message, or (``message_before_result``: that message was sent while the
    tool still ran) the output after it and after turn 2's reply."""
    started, release = asyncio.Event(), asyncio.Event()
    call = llm.FunctionToolCall(name="find_bag", arguments='{"tag": "X1"}', call_id="c1")
    model = ScriptedLLM([[call], ["You are welcome."], ["Bye."]])
    async with Foundation(gateway="openai_chat") as foundation:
        manager = foundation.manager
        agent = TurnloomAgent(
            manager=manager,
            context_id="call-1",
            instructions="Be brief.",
            tools=[_gated_find_bag(started, release)],
        )
        async with AgentSession(llm=model) as session:
            await session.start(agent)
            session.generate_reply(user_input="Where is my bag?")
            await started.wait()
            cut = session.interrupt()
            if message_before_result:
                reply = session.generate_reply(user_input="Thanks.")
                await asyncio.sleep(0.05)
                release.set()
                await cut
                await reply
            else:
                release.set()
                await cut
                await session.run(user_input="Thanks.")
            livekit = _shape(agent.chat_ctx)
            await session.run(user_input="Bye now.")
        history = _history(manager, "call-1")
    return (livekit, [_shape(c) for c in model.seen], history), agent


def test_a_tool_cut_by_a_barge_in_is_recorded_to_its_turn_before_the_next_message() -> None:
    """Invariant: a tool call of turn 1 that LiveKit executed despite a barge-in, with its
    output, enters turn 1 (not lost, not turn 2), call before result, once each, and the
    next model calls get it. LiveKit keeps both: it waits for the running tool and adds
    the pair before the next user message (agent_activity.py, "commit results of tools
    that finished despite the interruption").

    Mutants tried: no ``function_tools_executed`` handler (only the items after the
    current user message, as before the fix): history lacks the pair; a batch recorded
    results first (``messages.reverse()``): UnpairedResultError, refused, pair missing."""

    async def main() -> None:
        (livekit, seen, history), agent = await _barge_in_during_a_tool(message_before_result=False)
        assert livekit == [
            ("system", "Be brief."),
            *BARGE_IN_HISTORY[:5],
        ]
        assert history == BARGE_IN_HISTORY
        system = ("system", "Be brief.")
        assert seen == [
            [system, *BARGE_IN_HISTORY[:1]],
            [system, *BARGE_IN_HISTORY[:4]],
            [system, *BARGE_IN_HISTORY[:6]],
        ]
        assert agent.record_errors == 0

    asyncio.run(main())


def test_a_tool_output_landing_after_the_next_turn_is_recorded_late_to_its_turn() -> None:
    """Invariant: when the next user message was sent while turn 1's tool still ran,
    LiveKit adds the call before that message and the output after turn 2's reply; the
    pair is recorded late to turn 1 (``manager.record`` to the earlier turn), once, and
    turn 3's model input holds it in turn 1.

    Mutants tried: record a batch to the current turn instead of its call's turn:
    turnloom refuses the output (UnpairedResultError), ``record_errors`` is 1 and the pair
    is missing; ``deque(maxlen=1)`` (turn 1 forgotten when turn 2 starts): the same."""

    async def main() -> None:
        (livekit, seen, history), agent = await _barge_in_during_a_tool(message_before_result=True)
        assert livekit == [
            ("system", "Be brief."),
            *BARGE_IN_HISTORY[0:2],
            *BARGE_IN_HISTORY[3:5],
            BARGE_IN_HISTORY[2],
        ]
        assert history == BARGE_IN_HISTORY
        system = ("system", "Be brief.")
        assert seen == [
            [system, *BARGE_IN_HISTORY[:1]],
            [system, BARGE_IN_HISTORY[0], BARGE_IN_HISTORY[3]],
            [system, *BARGE_IN_HISTORY[:6]],
        ]
        assert agent.record_errors == 0

    asyncio.run(main())


def test_an_output_whose_call_livekit_never_added_is_counted_and_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Invariant: a batch turnloom refuses records nothing, logs one warning naming the
    error and the item, counts 1 in ``record_errors``, and the call goes on: the reply and
    the next turn are recorded exactly. Driven by a tool that adds an output answering no
    call (``c9``) to the agent's ChatContext; LiveKit merges it into the tool reply's
    context after the user message, where turnloom refuses it (UnpairedResultError).

    Mutants tried: re-raise the error: the tool reply fails, the history lacks "It is at
    gate 4." and the rest; swallow it without counting: ``record_errors`` stays 0;
    without the warning: no log record."""
    holder: list[TurnloomAgent] = []
    strays: list[llm.FunctionCallOutput] = []

    @function_tool
    async def find_bag(tag: str) -> str:
        """Find a bag by its tag."""
        stray = llm.FunctionCallOutput(call_id="c9", name="find_bag", output="?", is_error=False)
        strays.append(stray)
        ctx = holder[0].chat_ctx.copy()
        ctx.insert(stray)
        await holder[0].update_chat_ctx(ctx, exclude_invalid_function_calls=False)
        return f"Gate 4 ({tag})"

    async def main() -> None:
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            async with AgentSession(llm=_script()) as session:
                agent = TurnloomAgent(
                    manager=manager, context_id="call-1", instructions="Be brief.", tools=[find_bag]
                )
                holder.append(agent)
                await session.start(agent)
                with caplog.at_level(logging.WARNING, logger="turnloom.integrations.livekit"):
                    await session.run(user_input="Where is my bag?")
                assert agent.record_errors == 1
                [warning] = caplog.records
                assert "UnpairedResultError" in warning.getMessage()
                assert strays[0].id in warning.getMessage()
                await session.run(user_input="Thanks.")
            assert _history(manager, "call-1") == HISTORY

    asyncio.run(main())


def test_the_adapter_remembers_two_turns_however_many_tool_turns_pass() -> None:
    """Invariant: memory per call is bounded: after 60 turns each running a tool, the
    adapter remembers the previous and the newest turn only, each with its own items.

    Mutants tried: ``deque()`` without ``maxlen``: 60 turns remembered; no skip of
    recorded item ids: the scan records each pair the event recorded again (history
    holds it twice; this and four other tests fail)."""

    async def main() -> None:
        call = [llm.FunctionToolCall(name="find_bag", arguments='{"tag": "X1"}', call_id="c")]
        script: list[list[str | llm.FunctionToolCall]] = []
        for n in range(60):
            script += [[call[0].model_copy(update={"call_id": f"c{n}"})], ["Found."]]
        async with Foundation(gateway="openai_chat") as foundation:
            async with AgentSession(llm=ScriptedLLM(script)) as session:
                agent = _agent(foundation.manager)
                await session.start(agent)
                for n in range(60):
                    await session.run(user_input=f"Question {n}.")
                turns = agent._turns
                assert [sorted(t.calls) for t in turns] == [["c58"], ["c59"]]
                assert [len(t.recorded) for t in turns] == [3, 3]  # call, result, reply
            assert len(foundation.manager.history("call-1").turn_ids) == 32  # the default
            assert _history(foundation.manager, "call-1")[-4:] == [
                ("user", "Question 59."),
                ("call", 'c59 find_bag {"tag": "X1"}'),
                ("result", "c59 Gate 4 (X1)"),
                ("assistant", "Found."),
            ]

    asyncio.run(main())


def test_livekits_in_progress_placeholder_for_a_running_tool_is_never_recorded() -> None:
    """Invariant: the flagged pair LiveKit injects into a model call's context for a tool
    still running from an earlier turn (``_inject_running_tool_calls``: "The tool call is
    still in progress.") is not an executed call: nothing of it enters history. Driven by
    LiveKit's own injector on the context of the turn's model call.

    Mutant tried: no placeholder skip in ``_record_items``: the pair (``c7``) is recorded."""
    from livekit.agents.voice import ModelSettings
    from livekit.agents.voice.generation import _inject_running_tool_calls

    async def main() -> None:
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            async with AgentSession(llm=_script()) as session:
                agent = _agent(manager)
                await session.start(agent)
                await session.run(user_input="Where is my bag?")
                ctx = agent.chat_ctx.copy()
                ctx.add_message(role="user", content="Thanks.")
                running = llm.FunctionCall(call_id="c7", name="find_bag", arguments="{}")
                _inject_running_tool_calls(ctx, [running])
                assert _shape(ctx)[-2:] == [
                    ("call", "c7 find_bag {}"),
                    ("result", "c7 The tool call is still in progress."),
                ]
                async for _ in agent.llm_node(ctx, [], ModelSettings()):
                    pass
            assert _history(manager, "call-1") == HISTORY[:5]
            assert agent.record_errors == 0

    asyncio.run(main())


_UPDATE = (
    "The tool `find_bag` has updated, message: Looking for the bag.\n"
    "The task is still running, so DON'T make up or give information not included in the "
    "message above."
)


async def _async_tool_call(*, next_turn_first: bool) -> tuple[Any, TurnloomAgent]:
    """A LiveKit async tool (``AsyncToolset``): ``find_bag`` sends ``ctx.update`` (LiveKit
    answers the call ``c1`` with it and the model replies), then, once released, returns
    its result, which LiveKit delivers as a new pair (``c1_final``) and a reply generated
    for it. With ``next_turn_first`` the caller's next turn runs before the release."""
    release = asyncio.Event()

    @function_tool
    async def find_bag(ctx: RunContext, tag: str) -> str:
        """Find a bag by its tag."""
        await ctx.update("Looking for the bag.")
        await release.wait()
        return f"Gate 4 ({tag})"

    call = llm.FunctionToolCall(name="find_bag", arguments='{"tag": "X1"}', call_id="c1")
    script: list[list[str | llm.FunctionToolCall]] = [[call], ["I am looking."]]
    if next_turn_first:
        script.append(["You are welcome."])
    script.append(["It is at gate 4."])
    model = ScriptedLLM(script)
    async with Foundation(gateway="openai_chat") as foundation:
        manager = foundation.manager
        agent = TurnloomAgent(manager=manager, context_id="call-1", instructions="Be brief.")
        toolset = AsyncToolset(id="bags", tools=[find_bag])
        async with AgentSession(llm=model, tools=[toolset]) as session:
            await session.start(agent)
            await session.run(user_input="Where is my bag?")
            if next_turn_first:
                await session.run(user_input="Thanks.")
            release.set()
            for _ in range(200):  # the deferred reply runs on LiveKit's own task
                if not model.script and len(model.seen) == len(script):
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            livekit = _shape(agent.chat_ctx)
        history = _history(manager, "call-1")
    return (livekit, [_shape(c) for c in model.seen], history), agent


def test_an_async_tools_update_and_deferred_result_are_recorded_to_the_turn() -> None:
    """Invariant: a LiveKit async tool's first ``ctx.update`` (the call's output) and its
    deferred result (LiveKit's new ``c1_final`` pair) enter the turn once each, calls before
    results, in LiveKit's order, and each model call gets exactly what came before it.

    Mutant tried: items after the turn's user message whose call no stream emitted are
    skipped instead of going to the current turn: the ``c1_final`` pair is missing."""

    async def main() -> None:
        (livekit, seen, history), agent = await _async_tool_call(next_turn_first=False)
        system = ("system", "Be brief.")
        expected = [
            ("user", "Where is my bag?"),
            ("call", 'c1 find_bag {"tag": "X1"}'),
            ("result", f"c1 {_UPDATE}"),
            ("assistant", "I am looking."),
            ("call", 'c1_final find_bag {"tag": "X1"}'),
            ("result", "c1_final Gate 4 (X1)"),
            ("assistant", "It is at gate 4."),
        ]
        assert livekit == [system, *expected]
        assert history == expected
        # LiveKit answers the deferred result with generate_reply(instructions=...): that
        # reply's own system message, last
        assert seen == [
            [system, *expected[:1]],
            [system, *expected[:3]],
            [system, *expected[:6], ("system", _ASYNC_REPLY_INSTRUCTIONS)],
        ]
        assert agent.record_errors == 0

    asyncio.run(main())


_ASYNC_REPLY_INSTRUCTIONS = (
    "New results arrived from background tool calls (call_ids: ['c1_final']).\n"
    "Summarize the results naturally. Do NOT repeat information you have already told the user."
)


def test_an_async_tools_result_arriving_after_the_next_turn_is_recorded_to_that_turn() -> None:
    """Invariant: when the caller's next turn ran while the async tool still worked, its
    deferred result (``c1_final`` and its output, a pair of its own) comes after that
    turn's reply in LiveKit's context and is recorded there, once, with nothing refused:
    turnloom's history equals LiveKit's context item for item.

    Mutant tried: as in the test above: the ``c1_final`` pair is missing."""

    async def main() -> None:
        (livekit, seen, history), agent = await _async_tool_call(next_turn_first=True)
        system = ("system", "Be brief.")
        expected = [
            ("user", "Where is my bag?"),
            ("call", 'c1 find_bag {"tag": "X1"}'),
            ("result", f"c1 {_UPDATE}"),
            ("assistant", "I am looking."),
            ("user", "Thanks."),
            ("assistant", "You are welcome."),
            ("call", 'c1_final find_bag {"tag": "X1"}'),
            ("result", "c1_final Gate 4 (X1)"),
            ("assistant", "It is at gate 4."),
        ]
        assert livekit == [system, *expected]
        assert history == expected
        assert seen == [
            [system, *expected[:1]],
            [system, *expected[:3]],
            [system, *expected[:5]],
            [system, *expected[:8], ("system", _ASYNC_REPLY_INSTRUCTIONS)],
        ]
        assert agent.record_errors == 0

    asyncio.run(main())


# -- what LiveKit hosts add to the model's context -------------------------------------

_RAG = "Additional information: gate 4 closes at 9."


async def _speak(session: AgentSession, text: str) -> None:
    """One spoken user turn down LiveKit's own end-of-turn path (the real
    ``on_user_turn_completed`` with its temporary ``turn_ctx``), then its reply."""
    from livekit.agents.voice.audio_recognition import _EndOfTurnInfo, _EndOfTurnMetrics

    activity = session._activity
    assert activity is not None
    info = _EndOfTurnInfo(
        skip_reply=False,
        new_transcript=text,
        transcript_confidence=1.0,
        metrics=_EndOfTurnMetrics(None, None, None, None),
    )
    handles: list[Any] = []

    def created(event: Any) -> None:
        handles.append(event.speech_handle)

    session.on("speech_created", created)
    activity._user_turn_completed_atask = asyncio.current_task()
    await activity._user_turn_completed_impl(None, info)
    session.off("speech_created", created)
    for handle in handles:  # its playout includes the tool calls and follow-up replies
        await handle


class _RagAgent(TurnloomAgent):
    """LiveKit's RAG pattern: notes added to ``turn_ctx`` before and after the base hook."""

    async def on_user_turn_completed(
        self, turn_ctx: llm.ChatContext, new_message: llm.ChatMessage
    ) -> None:
        if "bag" in (new_message.text_content or ""):
            turn_ctx.add_message(role="assistant", content=_RAG)
            new_message.content.append("(caller: gold tier)")
        await super().on_user_turn_completed(turn_ctx, new_message)
        if "bag" in (new_message.text_content or ""):
            turn_ctx.add_message(role="system", content="Answer in one sentence.")


def test_notes_added_to_turn_ctx_reach_every_model_call_of_the_turn_as_data() -> None:
    """Invariant: the messages a host adds to ``turn_ctx`` in ``on_user_turn_completed``
    (LiveKit's RAG pattern, before or after the base hook, any role) reach every model call
    of that turn, once each, in LiveKit's order, as contributions of turnloom's runtime-state
    pair, never as history messages or mid-conversation system messages; the next turn
    keeps that pair in its place; an edit of ``new_message`` before the base hook is the
    turn's input.

    Mutant tried: no notes taken in ``llm_node`` (as before): no model call sees them."""

    async def main() -> None:
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            agent = _RagAgent(
                manager=manager, context_id="call-1", instructions="Be brief.", tools=[find_bag]
            )
            model = _script()
            async with AgentSession(llm=model) as session:
                await session.start(agent)
                await _speak(session, "Where is my bag?")
                await _speak(session, "Thanks.")
            user = ("user", "Where is my bag?\n(caller: gold tier)")
            history = [user, *HISTORY[1:]]
            assert _history(manager, "call-1") == history
            system = ("system", "Be brief.")
            notes = (
                "notes",
                f"assistant_message_1: {_RAG} | system_message_2: Answer in one sentence.",
            )
            assert [_shape(c) for c in model.seen] == [
                [system, user, notes],
                [system, user, notes, *history[1:3]],
                [system, user, notes, *history[1:5]],
            ]
            assert agent.record_errors == 0

    asyncio.run(main())


def test_a_message_added_with_update_chat_ctx_reaches_the_next_model_call_once() -> None:
    """Invariant: a message the host adds with ``agent.update_chat_ctx`` mid-call (a system
    note) reaches the next model call as a contribution of that turn's runtime-state pair,
    once: later turns keep that pair in its place and add no second copy; turnloom's history
    holds no system message.

    Mutant tried: ``update_chat_ctx`` not overridden (as before): no model call sees it."""

    async def main() -> None:
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            model = ScriptedLLM([["One."], ["Two."], ["Three."]])
            agent = _agent(manager)
            async with AgentSession(llm=model) as session:
                await session.start(agent)
                await session.run(user_input="Where is my bag?")
                ctx = agent.chat_ctx.copy()
                ctx.add_message(role="system", content="The caller is gold tier.")
                await agent.update_chat_ctx(ctx)
                await session.run(user_input="Thanks.")
                await session.run(user_input="Bye.")
            turns = [
                ("user", "Where is my bag?"),
                ("assistant", "One."),
                ("user", "Thanks."),
                ("assistant", "Two."),
                ("user", "Bye."),
                ("assistant", "Three."),
            ]
            assert _history(manager, "call-1") == turns
            system = ("system", "Be brief.")
            notes = ("notes", "system_message_1: The caller is gold tier.")
            assert [_shape(c) for c in model.seen] == [
                [system, *turns[:1]],
                [system, *turns[:3], notes],
                [system, *turns[:3], notes, *turns[3:5]],
            ]

    asyncio.run(main())


async def _instructed_reply(agent: Agent, model: ScriptedLLM, **options: Any) -> None:
    """Turn 1; a reply given instructions that calls a tool (its follow-up answers); a
    reply without; turn 2. ``options`` go to the ``AgentSession``."""
    async with AgentSession(llm=model, **options) as session:
        await session.start(agent)
        await session.run(user_input="Where is my bag?")
        await session.generate_reply(instructions="Mention the lounge.")
        await session.generate_reply()
        await session.run(user_input="Thanks.")


def _instructed_script() -> ScriptedLLM:
    call = llm.FunctionToolCall(name="find_bag", arguments='{"tag": "X1"}', call_id="c1")
    return ScriptedLLM([["One."], [call], ["Two."], ["Three."], ["Four."]])


def _system_messages(contexts: list[llm.ChatContext]) -> list[list[str]]:
    return [[text for role, text in _shape(c) if role == "system"] for c in contexts]


def test_generate_reply_instructions_reach_only_the_reply_they_were_given_for() -> None:
    """Invariant: ``session.generate_reply(instructions=...)`` after the caller's first
    turn reaches that reply's model calls (its tool follow-up's too) and no other: not a
    later reply of the same turn, not a later turn; each model call carries exactly the
    system messages LiveKit's own ``Agent`` sends (``_pipeline_reply_task_impl`` adds them
    to that reply's copy of the context only); nothing of them enters history.

    Mutant tried: the reply's instructions taken as a note of the turn (as before): the
    later reply and turn 2 still carry them."""

    async def main() -> None:
        plain = _instructed_script()
        await _instructed_reply(Agent(instructions="Be brief.", tools=[find_bag]), plain)
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            model = _instructed_script()
            await _instructed_reply(_agent(manager), model)
            turns = [
                ("user", "Where is my bag?"),
                ("assistant", "One."),
                ("call", 'c1 find_bag {"tag": "X1"}'),
                ("result", "c1 Gate 4 (X1)"),
                ("assistant", "Two."),
                ("assistant", "Three."),
                ("user", "Thanks."),
                ("assistant", "Four."),
            ]
            assert _history(manager, "call-1") == turns
            system, lounge = ("system", "Be brief."), ("system", "Mention the lounge.")
            assert [_shape(c) for c in model.seen] == [
                [system, *turns[:1]],
                [system, *turns[:2], lounge],
                [system, *turns[:4], lounge],
                [system, *turns[:5]],
                [system, *turns[:7]],
            ]
            assert _system_messages(model.seen) == _system_messages(plain.seen)

    asyncio.run(main())


def test_livekits_expressive_tts_guide_reaches_every_model_call_as_livekit_sends_it() -> None:
    """Invariant: with a TTS that has a markup dialect and ``expressive=True``, LiveKit adds
    its markup guide (``lk.expressive.instructions``, ``agent_activity.py``
    ``_inject_expressive_instructions``) to every reply's model calls; the adapter sends it
    too, as the last system message of each call (after a reply's own instructions, as
    LiveKit orders them): each call carries exactly the system messages LiveKit's own
    ``Agent`` sends, and nothing of the guide enters history.

    Mutant tried: the guide skipped like LiveKit's instructions message (as before): no
    model call carries it."""

    async def main() -> None:
        options: dict[str, Any] = {"tts": MarkupTTS(), "expressive": True}
        plain = _instructed_script()
        await _instructed_reply(Agent(instructions="Be brief.", tools=[find_bag]), plain, **options)
        guide = _system_messages(plain.seen)[0][-1]
        assert guide.startswith("You can control how you speak using the following formatting")
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            model = _instructed_script()
            options["tts"] = MarkupTTS()
            await _instructed_reply(_agent(manager), model, **options)
            assert [text for _, text in _history(manager, "call-1")] == [
                "Where is my bag?",
                *("One.", 'c1 find_bag {"tag": "X1"}', "c1 Gate 4 (X1)", "Two.", "Three."),
                *("Thanks.", "Four."),
            ]
            brief, lounge = "Be brief.", "Mention the lounge."
            assert _system_messages(model.seen) == [
                [brief, guide],
                [brief, lounge, guide],
                [brief, lounge, guide],
                [brief, guide],
                [brief, guide],
            ]
            assert _system_messages(model.seen) == _system_messages(plain.seen)
            assert all(_shape(c)[-1] == ("system", guide) for c in model.seen)

    asyncio.run(main())


def test_update_instructions_mid_call_pins_them_from_the_next_turn() -> None:
    """Invariant: ``agent.update_instructions`` mid-call becomes turnloom's pinned
    instructions from the caller's next turn on: that turn's model call sends the new
    system message, once, first.

    Mutant tried: ``update_instructions`` not overridden (as before): the old instructions
    stay."""

    async def main() -> None:
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            model = ScriptedLLM([["One."], ["Two."]])
            agent = _agent(manager)
            async with AgentSession(llm=model) as session:
                await session.start(agent)
                await session.run(user_input="Where is my bag?")
                await agent.update_instructions("Be very brief.")
                await session.run(user_input="Thanks.")
            turns = [
                ("user", "Where is my bag?"),
                ("assistant", "One."),
                ("user", "Thanks."),
                ("assistant", "Two."),
            ]
            assert _history(manager, "call-1") == turns
            assert [_shape(c) for c in model.seen] == [
                [("system", "Be brief."), *turns[:1]],
                [("system", "Be very brief."), *turns[:3]],
            ]

    asyncio.run(main())


def test_say_and_generate_reply_user_input_mid_call_reach_history_and_the_model() -> None:
    """Invariant: ``session.say(..., add_to_chat_ctx=True)`` after the first turn is
    recorded to the current turn, and ``generate_reply(user_input=...)`` is a turn of its
    own; every later model call sends both."""

    async def main() -> None:
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            model = ScriptedLLM([["One."], ["Two."], ["Three."]])
            async with AgentSession(llm=model) as session:
                await session.start(_agent(manager))
                await session.run(user_input="Where is my bag?")
                await session.say("Please hold on.", add_to_chat_ctx=True)
                await session.generate_reply(user_input="And my coat?")
                await session.run(user_input="Thanks.")
            turns = [
                ("user", "Where is my bag?"),
                ("assistant", "One."),
                ("assistant", "Please hold on."),
                ("user", "And my coat?"),
                ("assistant", "Two."),
                ("user", "Thanks."),
                ("assistant", "Three."),
            ]
            assert _history(manager, "call-1") == turns
            system = ("system", "Be brief.")
            assert [_shape(c) for c in model.seen] == [
                [system, *turns[:1]],
                [system, *turns[:4]],
                [system, *turns[:6]],
            ]

    asyncio.run(main())


class _LateEditAgent(TurnloomAgent):
    """Edits ``new_message`` after the base hook committed the turn."""

    async def on_user_turn_completed(
        self, turn_ctx: llm.ChatContext, new_message: llm.ChatMessage
    ) -> None:
        await super().on_user_turn_completed(turn_ctx, new_message)
        new_message.content.append("(caller: gold tier)")


def test_an_edit_of_new_message_after_the_commit_is_logged_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Invariant: an edit of ``new_message`` after the base ``on_user_turn_completed``
    committed the turn cannot change the committed input: turnloom keeps and sends the
    committed text, and the edit is not silent: one warning (lengths, not the caller's
    words) and ``late_edits`` grows by one per edited turn.

    Mutant tried: the check removed (as before): no warning, ``late_edits`` stays 0."""

    async def main() -> None:
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            model = ScriptedLLM([["One."]])
            agent = _LateEditAgent(manager=manager, context_id="call-1", instructions="Be brief.")
            async with AgentSession(llm=model) as session:
                await session.start(agent)
                with caplog.at_level(logging.WARNING, logger="turnloom.integrations.livekit"):
                    await _speak(session, "Where is my bag?")
            turns = [("user", "Where is my bag?"), ("assistant", "One.")]
            assert _history(manager, "call-1") == turns
            assert [_shape(c) for c in model.seen] == [[("system", "Be brief."), turns[0]]]
            assert agent.late_edits == 1
            warnings = [r.getMessage() for r in caplog.records if r.name.endswith("livekit")]
            assert len(warnings) == 1
            assert "committed text (16 characters), not the edit (36 characters)" in warnings[0]
            assert "bag" not in warnings[0]

    asyncio.run(main())


def test_items_livekits_context_dropped_at_its_bound_never_become_notes() -> None:
    """Invariant: the items the adapter cuts from LiveKit's own context at a turn's start
    (``framework_items``) are not host notes, though the model call's context (LiveKit's
    copy from before the cut) still holds them: every model input is exactly turnloom's
    history, with no runtime-state pair.

    Mutant tried: the cut items not remembered: the old replies come back as notes."""

    async def main() -> None:
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            model = ScriptedLLM([["One."], ["Two."], ["Three."]])
            async with AgentSession(llm=model) as session:
                await session.start(_agent(manager, framework_items=2))
                for text in ("Where is my bag?", "Thanks.", "Bye."):
                    await session.run(user_input=text)
            turns = [
                ("user", "Where is my bag?"),
                ("assistant", "One."),
                ("user", "Thanks."),
                ("assistant", "Two."),
                ("user", "Bye."),
                ("assistant", "Three."),
            ]
            assert _history(manager, "call-1") == turns
            system = ("system", "Be brief.")
            assert [_shape(c) for c in model.seen] == [
                [system, *turns[:1]],
                [system, *turns[:3]],
                [system, *turns[:5]],
            ]

    asyncio.run(main())


def test_livekits_own_chat_context_stays_bounded_on_spoken_turns() -> None:
    """Invariant: spoken turns (committed in ``on_user_turn_completed``) cut LiveKit's own
    ChatContext at each turn's start too: the ``framework_items`` newest items (LiveKit
    puts its instructions back first), then the turn's user message and reply, however
    many turns pass.

    Mutant tried: the cut only on text turns (as before): the context grows every turn."""

    async def main() -> None:
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            async with AgentSession(llm=ScriptedLLM([])) as session:
                agent = _agent(manager, framework_items=2)
                await session.start(agent)
                for n in range(12):
                    await _speak(session, f"Question {n}.")
                assert _shape(agent.chat_ctx) == [
                    ("system", "Be brief."),
                    ("user", "Question 10."),
                    ("assistant", "OK."),
                    ("user", "Question 11."),
                    ("assistant", "OK."),
                ]
            assert len(_history(manager, "call-1")) == 24

    asyncio.run(main())


@pytest.mark.parametrize(
    ("final", "reply", "calls"),
    [
        ("Where is my bag?", "Two.", 2),  # the second preemptive generation is used
        ("Where is my coat?", "Three.", 3),  # both discarded: LiveKit answers anew
    ],
)
def test_preemptive_generations_leave_one_turn_with_the_final_transcript(
    final: str, reply: str, calls: int
) -> None:
    """Invariant: LiveKit's preemptive generations (on by default: a model call on an
    interim transcript before the end of the turn) leave exactly one user turn, the final
    transcript, in turnloom's history; a model call never sees an earlier guess's turn.

    Mutant tried: every model call's new user message committed for good (as before): the
    interim transcripts stay as turns of their own and reach the next model calls."""
    from livekit.agents.voice.audio_recognition import _PreemptiveGenerationInfo

    async def main() -> None:
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            model = ScriptedLLM([["One."], ["Two."], ["Three."]])
            handles: list[Any] = []
            async with AgentSession(llm=model) as session:
                session.on("speech_created", lambda event: handles.append(event.speech_handle))
                await session.start(_agent(manager))
                activity = session._activity
                assert activity is not None
                for n, interim in enumerate(("Where is my", "Where is my bag")):
                    info = _PreemptiveGenerationInfo(interim, 1.0, None)
                    activity.on_preemptive_generation(info)
                    while len(model.seen) <= n:
                        await asyncio.sleep(0.01)
                await _speak(session, final)
                for handle in handles:
                    await handle
            assert _history(manager, "call-1") == [("user", final), ("assistant", reply)]
            system = ("system", "Be brief.")
            assert [_shape(c) for c in model.seen] == [
                [system, ("user", "Where is my")],
                [system, ("user", "Where is my bag")],
                [system, ("user", final)],
            ][:calls]

    asyncio.run(main())


def test_a_used_preemptive_generations_tool_steps_stay_in_the_final_turn() -> None:
    """Invariant: when LiveKit uses a preemptive generation that called a tool, the
    follow-up model call (whose context holds the preemptive user message, not the end of
    turn's one) belongs to the final turn: one user turn, the tool pair and the reply.

    Mutant tried: the retracted guess's message not answering to the final turn: the
    follow-up commits it as a second user turn."""
    from livekit.agents.voice.audio_recognition import _PreemptiveGenerationInfo

    async def main() -> None:
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            model = _script()
            handles: list[Any] = []
            async with AgentSession(llm=model) as session:
                session.on("speech_created", lambda event: handles.append(event.speech_handle))
                agent = _agent(manager)
                await session.start(agent)
                activity = session._activity
                assert activity is not None
                info = _PreemptiveGenerationInfo("Where is my bag", 1.0, None)
                activity.on_preemptive_generation(info)
                while not model.seen:
                    await asyncio.sleep(0.01)
                await _speak(session, "Where is my bag?")
                for handle in handles:
                    await handle
            assert _history(manager, "call-1") == HISTORY[:4]
            system = ("system", "Be brief.")
            assert [_shape(c) for c in model.seen] == [
                [system, ("user", "Where is my bag")],
                [system, *HISTORY[:3]],
            ]
            assert agent.record_errors == 0

    asyncio.run(main())


def test_a_used_preemptive_generations_follow_up_records_only_its_own_tool_steps() -> None:
    """Invariant: the follow-up model call of a used preemptive generation (its context
    holds the guess's user message, not the final one) records only the tool items after
    that message: the tool pairs of turns three and more back, which the adapter no longer
    remembers (it keeps two turns) and LiveKit's context still holds, are not recorded
    again; history is each turn once, exactly, and nothing is refused.

    Mutant tried: the guess's message id left out of the lookup in ``_record_tools``
    (``ids = {current.user_item}``): the scan starts at the context's start and records
    the pairs of turns 1 and 2 again, to turn 4."""
    from livekit.agents.voice.audio_recognition import _PreemptiveGenerationInfo

    def tool_turn(n: int) -> list[list[str | llm.FunctionToolCall]]:
        arguments = json.dumps({"tag": f"X{n}"})
        return [[llm.FunctionToolCall(name="find_bag", arguments=arguments, call_id=f"c{n}")]]

    def turn(n: int, question: str, reply: str) -> list[tuple[str, str]]:
        return [
            ("user", question),
            ("call", f'c{n} find_bag {{"tag": "X{n}"}}'),
            ("result", f"c{n} Gate 4 (X{n})"),
            ("assistant", reply),
        ]

    async def main() -> None:
        script: list[list[str | llm.FunctionToolCall]] = []
        for n in range(1, 5):
            script += [*tool_turn(n), [f"Found {n}."]]
        model = ScriptedLLM(script)
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            handles: list[Any] = []
            async with AgentSession(llm=model) as session:
                session.on("speech_created", lambda event: handles.append(event.speech_handle))
                agent = _agent(manager, framework_items=50)  # LiveKit keeps every item
                await session.start(agent)
                for n in range(1, 4):
                    await session.run(user_input=f"Question {n}.")
                activity = session._activity
                assert activity is not None
                activity.on_preemptive_generation(
                    _PreemptiveGenerationInfo("Question 4", 1.0, None)
                )
                while len(model.seen) < 7:
                    await asyncio.sleep(0.01)
                await _speak(session, "Question 4.")
                for handle in handles:
                    await handle
            history = [e for n in range(1, 5) for e in turn(n, f"Question {n}.", f"Found {n}.")]
            assert _history(manager, "call-1") == history
            assert _shape(model.seen[-1]) == [("system", "Be brief."), *history[:-1]]
            assert len(model.seen) == 8
            assert agent.record_errors == 0

    asyncio.run(main())

"""Hostile use of the framework glue, as real LiveKit / Pipecat / OpenAI Agents hosts call it.

The failing tests here each name the docstring line they hold the glue to. The passing
ones pin contracts that hold today (TurnloomSession's isolation and edge values).
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

pytest.importorskip("agents")
pytest.importorskip("livekit.agents")
pytest.importorskip("pipecat")

from livekit.agents import AgentSession, llm
from livekit.agents.llm import StopResponse

from tests.integrations.livekit_fakes import ScriptedLLM
from tests.integrations.test_livekit import _agent
from tests.integrations.test_livekit import _history as _lk_history
from turnloom.context import HistoryLimits
from turnloom.errors import InvalidArgumentError
from turnloom.integrations.openai_agents import TurnloomSession
from turnloom.integrations.pipecat import TurnloomContextAggregatorPair
from turnloom.runtime import ContextManager, Foundation


def _texts(manager: ContextManager, context_id: str) -> list[tuple[str, str]]:
    view = manager.history(context_id)
    return [
        (message.role.value, message.text)
        for turn in view.turn_ids
        for message in view.turn_messages(turn)
    ]


# -- Pipecat: a push the door refuses ------------------------------------------------


def test_pipecat_a_refused_oversized_user_turn_does_not_duplicate_the_reply_before_it() -> None:
    """Pipecat's user aggregator pushes [reply "Hello.", an oversized user message]; the
    door refuses the user message (ItemTooLargeError, over history_max_item_bytes). The
    reply was already recorded, but ``synced`` was not moved, so the next push takes
    "Hello." again and records it a second time.

    Violated: DESIGN.md rule 5, "Every operation either completes or leaves the state as
    it was", and the module docstring: "what Pipecat's aggregators wrote since the last
    push is taken into turnloom" (once)."""

    async def main() -> None:
        limits = HistoryLimits(max_item_bytes=2000)
        async with Foundation(gateway="openai_chat", history_limits=limits) as foundation:
            manager = foundation.manager
            pair = TurnloomContextAggregatorPair(
                manager=manager, context_id="c", instructions="Be brief."
            )
            conversation = pair._conversation  # what both aggregators' push_context_frame run
            pair.context.add_message({"role": "user", "content": "Hi."})
            assert await conversation.sync()
            pair.context.add_message({"role": "assistant", "content": "Hello."})
            pair.context.add_message({"role": "user", "content": "x" * 5000})
            # Refused, counted and left out; no new turn: no inference.
            assert await conversation.sync() is False
            assert pair.record_errors == 1
            pair.context.add_message({"role": "user", "content": "Second try."})
            assert await conversation.sync() is True
            # Was: [user Hi., assistant Hello., assistant Hello.] (the reply taken twice).
            assert _texts(manager, "c") == [
                ("user", "Hi."),
                ("assistant", "Hello."),
                ("user", "Second try."),
            ]
            assert all("x" * 5000 != m.get("content") for m in pair.context.get_messages())

    asyncio.run(main())


def test_pipecat_an_oversized_reply_does_not_block_every_later_user_turn() -> None:
    """The assistant aggregator writes an oversized reply; its record is refused
    (ItemTooLargeError). It stays after ``synced`` in Pipecat's context, so every later
    push retries it first and raises again: the caller's next turns ("Next.", "Again.")
    are never committed and no inference ever runs again: the call is dead.

    Violated: the module docstring, "whenever either aggregator pushes its context to
    the LLM, what Pipecat's aggregators wrote since the last push is taken into
    turnloom: a user message commits a turn"; and DESIGN.md rule 4, "Nothing already
    committed is lost"."""

    async def main() -> None:
        limits = HistoryLimits(max_item_bytes=2000)
        async with Foundation(gateway="openai_chat", history_limits=limits) as foundation:
            manager = foundation.manager
            pair = TurnloomContextAggregatorPair(
                manager=manager, context_id="d", instructions="Be brief."
            )
            conversation = pair._conversation
            pair.context.add_message({"role": "user", "content": "Hi."})
            assert await conversation.sync()
            pair.context.add_message({"role": "assistant", "content": "y" * 5000})
            pair.context.add_message({"role": "user", "content": "Next."})
            assert await conversation.sync() is True  # the reply refused, the turn taken
            assert pair.record_errors == 1
            pair.context.add_message({"role": "user", "content": "Again."})
            assert await conversation.sync() is True
            # Was: [user Hi.] only: "Next." and "Again." never reached turnloom.
            assert _texts(manager, "d") == [
                ("user", "Hi."),
                ("user", "Next."),
                ("user", "Again."),
            ]
            assert pair.record_errors == 1

    asyncio.run(main())


# -- LiveKit ---------------------------------------------------------------------------


def test_livekit_a_call_id_reused_in_the_next_turn_is_recorded_to_that_turn() -> None:
    """A model that reuses call ids across turns (call id "c1" in turn 1 and again in
    turn 2: many OpenAI-compatible servers number calls per response). The adapter
    looks the id up in the remembered turns oldest first, so turn 2's call and result
    are recorded to turn 1 (after its reply), and the next model input sends the Y2 call
    before the question "And Y2?" that caused it.

    Violated: TurnloomAgent docstring, "A function call is recorded to the turn whose
    model call streamed it (the adapter notes its call id from the stream)"."""

    async def main() -> None:
        model = ScriptedLLM(
            [
                [llm.FunctionToolCall(name="find_bag", arguments='{"tag": "X1"}', call_id="c1")],
                ["Gate 4."],
                [llm.FunctionToolCall(name="find_bag", arguments='{"tag": "Y2"}', call_id="c1")],
                ["Gate 5."],
            ]
        )
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            async with AgentSession(llm=model) as session:
                await session.start(_agent(manager))
                await session.run(user_input="Where is X1?")
                await session.run(user_input="And Y2?")
            # observed: the Y2 call and its result sit in the first turn, after "Gate 4.",
            # before the question that caused them.
            assert _lk_history(manager, "call-1") == [
                ("user", "Where is X1?"),
                ("call", 'c1 find_bag {"tag": "X1"}'),
                ("result", "c1 Gate 4 (X1)"),
                ("assistant", "Gate 4."),
                ("user", "And Y2?"),
                ("call", 'c1 find_bag {"tag": "Y2"}'),
                ("result", "c1 Gate 4 (Y2)"),
                ("assistant", "Gate 5."),
            ]

    asyncio.run(main())


def test_livekit_say_after_a_false_start_is_not_silently_lost() -> None:
    """After a false start is retracted (``false_start`` returned True), the agent says
    "Sorry, go on." with ``session.say(..., add_to_chat_ctx=True)``. ``_on_item`` sees no
    current turn and a non-empty turn memory, and returns: the line is in LiveKit's
    context but never in turnloom's history nor any later model input, with no error
    and no counter (``record_errors`` stays 0).

    Violated: module docstring, "``session.say(..., add_to_chat_ctx=True)`` is recorded
    like a reply, to the current turn (before the first turn: as a greeting, above)",
    and "Refused records ... record_errors grows by one"."""

    async def main() -> None:
        model = ScriptedLLM([["One."], ["Two."]])
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            async with AgentSession(llm=model) as session:
                agent = _agent(manager, false_start=lambda text: text.strip() == "uh")
                await session.start(agent)
                await session.run(user_input="Where is my bag?")
                with pytest.raises(StopResponse):
                    await agent.on_user_turn_completed(
                        llm.ChatContext.empty(), llm.ChatMessage(role="user", content=["uh"])
                    )
                await session.say("Sorry, go on.", add_to_chat_ctx=True)
                await session.run(user_input="Thanks.")
            # Was: [user Where is my bag?, assistant One., user Thanks., assistant Two.]
            assert _lk_history(manager, "call-1") == [
                ("user", "Where is my bag?"),
                ("assistant", "One."),
                ("assistant", "Sorry, go on."),
                ("user", "Thanks."),
                ("assistant", "Two."),
            ]
            assert agent.record_errors == 0

    asyncio.run(main())


# -- OpenAI Agents Session: contracts that hold ----------------------------------------

USER = {"role": "user", "content": "Check it."}
WEB = {
    "type": "web_search_call",
    "id": "ws_1",
    "status": "completed",
    "action": {"type": "search", "query": "q", "sources": [{"type": "url", "url": "https://a"}]},
}
UNKNOWN = {"type": "frobnicate_call", "id": "fr_1", "payload": {"x": [1, 2]}}
REPLY = {
    "type": "message",
    "role": "assistant",
    "id": "msg_1",
    "status": "completed",
    "content": [{"type": "output_text", "text": "Hello.", "annotations": []}],
}


@pytest.mark.anyio
async def test_session_items_edited_after_add_or_get_change_nothing_held(
    anyio_backend: str,
) -> None:
    """Holds. DESIGN.md: "What a host gets back ... is never shared with what turnloom
    keeps"; get_items: "The items are fresh dicts: editing them changes nothing". Nested
    containers of verbatim-kept items (web_search_call, an unknown item type) included."""
    async with Foundation(gateway="openai_responses") as foundation:
        session = TurnloomSession("s1", foundation.manager)
        given = [copy.deepcopy(USER), copy.deepcopy(WEB), copy.deepcopy(REPLY)]
        given.append(copy.deepcopy(UNKNOWN))
        await session.add_items(given)  # type: ignore[arg-type]
        expected = [USER, WEB, REPLY, UNKNOWN]
        assert await session.get_items() == expected
        given[1]["action"]["sources"].append({"type": "url", "url": "https://evil"})
        given[2]["content"][0]["text"] = "edited"
        given[3]["payload"]["x"].append(3)
        assert await session.get_items() == expected
        got: list[Any] = await session.get_items()
        got[1]["action"]["query"] = "edited"
        got[2]["content"][0]["annotations"].append("edited")
        got[3]["payload"]["x"].clear()
        assert await session.get_items() == expected


@pytest.mark.anyio
async def test_session_limit_edges_pop_on_empty_and_clear_then_reuse(anyio_backend: str) -> None:
    """Holds. get_items(0) is empty, a huge limit is everything, a negative one is an
    InvalidArgumentError; pop_item on an empty (or cleared) session is None;
    clear_session is idempotent and the session takes a new turn afterwards."""
    async with Foundation(gateway="openai_responses") as foundation:
        session = TurnloomSession("s1", foundation.manager)
        assert await session.pop_item() is None
        await session.add_items([USER, REPLY])  # type: ignore[list-item]
        assert await session.get_items(0) == []
        assert await session.get_items(10**18) == [USER, REPLY]
        with pytest.raises(InvalidArgumentError):
            await session.get_items(-1)
        await session.clear_session()
        await session.clear_session()
        assert await session.pop_item() is None
        await session.add_items([USER, REPLY])  # type: ignore[list-item]
        assert await session.get_items() == [USER, REPLY]


def _reply(item_id: str, text: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return {**REPLY, "id": item_id, "content": content}


def test_session_concurrent_add_items_and_pop_after_eviction() -> None:
    """Holds. Two tasks adding whole turns at once both land, each whole; after the
    history limits evicted turns, pop_item takes the newest held item and the rest stay."""

    async def main() -> None:
        limits = HistoryLimits(max_turns=2)
        async with Foundation(gateway="openai_responses", history_limits=limits) as foundation:
            session = TurnloomSession("s1", foundation.manager)
            a = [{"role": "user", "content": "A"}, _reply("msg_a", "a")]
            b = [{"role": "user", "content": "B"}, _reply("msg_b", "b")]
            await asyncio.gather(session.add_items(a), session.add_items(b))  # type: ignore[arg-type]
            held = await session.get_items()
            assert sorted(map(str, held)) == sorted(map(str, a + b))
            for n in range(3):
                await session.add_items(  # type: ignore[arg-type]
                    [{"role": "user", "content": f"u{n}"}, _reply(f"m{n}", f"r{n}")]
                )
            assert await session.pop_item() == _reply("m2", "r2")
            assert await session.get_items() == [
                {"role": "user", "content": "u1"},
                _reply("m1", "r1"),
                {"role": "user", "content": "u2"},
            ]

    asyncio.run(main())

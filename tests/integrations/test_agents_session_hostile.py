"""Attacks (hunt12) on ``TurnloomSession`` driven by the real OpenAI Agents SDK ``Runner``.

The model is the SDK's own ``agents.testing.ScriptedModel`` (no network), which also
streams. A recording wrapper keeps every batch the runner hands ``add_items``; the
invariant checked after each run: ``get_items()`` is exactly the concatenation of
those batches (order and content) and passes the gateway's ``validate``.

Finding (failing on the code it was written against): reasoning items without an
``id`` (``RunConfig(reasoning_item_id_policy="omit")``) vanished from ``get_items``
and from the next run's model input, with no error and no counter.

Holding (contracts checked): streamed runs cancelled mid-stream (immediate and
after_turn, also during a slow tool), ``MaxTurnsExceeded``, handoffs (alone, with a
parallel call), parallel calls with a tool that raises, reasoning / message /
reasoning / call in one response, input and output guardrail tripwires, a tool
approval interruption resumed from its ``RunState``, and the items returned not
being shared with what the session keeps.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import (
    Agent,
    GuardrailFunctionOutput,
    InputGuardrailTripwireTriggered,
    MaxTurnsExceeded,
    OutputGuardrailTripwireTriggered,
    RunConfig,
    Runner,
    UserError,
    function_tool,
    input_guardrail,
    output_guardrail,
    set_tracing_disabled,
)
from agents.testing.model import ScriptedModel, assistant_message, function_call
from openai.types.responses import ResponseReasoningItem
from openai.types.responses.response_reasoning_item import Summary

from turnloom.integrations.openai_agents import TurnloomSession
from turnloom.runtime import Foundation

set_tracing_disabled(True)


class Recording:
    """A Session that hands every call to a ``TurnloomSession`` and keeps each batch added."""

    def __init__(self, inner: TurnloomSession) -> None:
        self.inner = inner
        self.session_id = inner.session_id
        self.session_settings = inner.session_settings
        self.batches: list[list[Any]] = []

    async def get_items(self, limit: int | None = None) -> list[Any]:
        return await self.inner.get_items(limit)

    async def add_items(self, items: list[Any]) -> None:
        self.batches.append(copy.deepcopy(items))
        await self.inner.add_items(items)

    async def pop_item(self) -> Any:
        return await self.inner.pop_item()

    async def clear_session(self) -> None:
        await self.inner.clear_session()

    @property
    def saved(self) -> list[Any]:
        return [item for batch in self.batches for item in batch]


def _reasoning(item_id: str) -> ResponseReasoningItem:
    summary = [Summary(type="summary_text", text="Think first.")]
    return ResponseReasoningItem(
        id=item_id, type="reasoning", summary=summary, encrypted_content="gAAAA-enc"
    )


def _kinds(items: list[Any]) -> list[tuple[str, Any]]:
    return [(i.get("type", i.get("role")), i.get("call_id") or i.get("id")) for i in items]


@function_tool
def look(q: str) -> str:
    """Look something up."""
    return f"found {q}"


@function_tool(failure_error_function=None)
def boom(q: str) -> str:
    """Always fails."""
    raise RuntimeError("kaboom")


@function_tool
async def slow(q: str) -> str:
    """A tool the host cancels while it runs."""
    await asyncio.sleep(0.2)
    return f"slow {q}"


@function_tool(needs_approval=True)
def risky(q: str) -> str:
    """A tool that needs the host's approval."""
    return f"did {q}"


async def _holds(foundation: Foundation, session: Recording) -> list[Any]:
    """get_items is exactly what the SDK saved, and a valid Responses input."""
    got = await session.inner.get_items()
    assert got == session.saved
    assert foundation.manager.gateway.validate(got) == []
    return got


# -- Findings: fail on the current code -------------------------------------------------


def test_reasoning_items_saved_without_an_id_come_back_from_get_items() -> None:
    """FAILS. Module doc of turnloom/integrations/openai_agents.py: the items are
    "parsed and rendered by turnloom's ``openai_responses`` gateway, exactly
    round-trip", and "every other item (... reasoning ...) is recorded to the newest
    turn"; its ``Not held`` list names only blank assistant messages (counted) and blank
    user input (refused). The SDK's documented ``RunConfig(reasoning_item_id_policy=
    "omit")`` saves reasoning items with ``encrypted_content`` but no ``id``; the
    gateway renders a ReasoningPart only ``if part.gateway == _GATEWAY and part.id``
    and drops the rest as "reasoning produced by another provider" (a DEBUG log), so
    both reasoning items vanish from get_items and from the next run's model input."""

    async def main() -> None:
        model = ScriptedModel(
            [
                [
                    _reasoning("rs_1"),
                    function_call("look", {"q": "a"}, call_id="c1", item_id="fc_1"),
                ],
                [_reasoning("rs_2"), assistant_message("Found it.", item_id="msg_1")],
                [assistant_message("Bye.", item_id="msg_2")],
            ]
        )
        agent = Agent(name="a", model=model, tools=[look])
        config = RunConfig(reasoning_item_id_policy="omit")
        async with Foundation(gateway="openai_responses") as foundation:
            session = Recording(TurnloomSession("s", foundation.manager))
            await Runner.run(agent, "Go.", session=session, run_config=config)
            saved = [i.get("type", i.get("role")) for i in session.saved]
            assert saved == ["user", "reasoning", "function_call", "function_call_output",
                             "reasoning", "message"]  # fmt: skip
            assert all("id" not in i for i in session.saved if i.get("type") == "reasoning")
            # Observed: [user, function_call, function_call_output, message].
            assert await session.inner.get_items() == session.saved
            await Runner.run(agent, "More.", session=session, run_config=config)
            sent = [i.get("type", i.get("role")) for i in model.calls[-1].input]
            assert sent.count("reasoning") == 2

    asyncio.run(main())


# -- Contracts that hold -----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["immediate", "after_turn"])
@pytest.mark.parametrize("stop_after", [1, 3, 8])
def test_a_streamed_run_cancelled_mid_stream_then_a_new_run(mode: str, stop_after: int) -> None:
    """Holds: whatever a cancelled streamed run saved (nothing, the input, or the whole
    first step) comes back exactly, valid, and the next run continues from it."""

    async def main() -> None:
        model = ScriptedModel(
            [
                [
                    _reasoning("rs_1"),
                    function_call("look", {"q": "a"}, call_id="c1", item_id="fc_1"),
                    function_call("look", {"q": "b"}, call_id="c2", item_id="fc_2"),
                ],
                [assistant_message("Done.", item_id="msg_1")],
                [assistant_message("Again.", item_id="msg_2")],
            ]
        )
        agent = Agent(name="a", model=model, tools=[look])
        async with Foundation(gateway="openai_responses") as foundation:
            session = Recording(TurnloomSession("s", foundation.manager))
            result = Runner.run_streamed(agent, "Go.", session=session)
            seen = 0
            async for _ in result.stream_events():
                seen += 1
                if seen == stop_after:
                    result.cancel(mode=mode)
            held = await session.inner.get_items()
            assert held == session.saved
            await Runner.run(agent, "More.", session=session)
            await _holds(foundation, session)
            assert [dict(i) for i in model.calls[-1].input][: len(held)] == held

    asyncio.run(main())


@pytest.mark.parametrize("mode", ["immediate", "after_turn"])
def test_a_streamed_run_cancelled_while_a_slow_tool_runs(mode: str) -> None:
    """Holds: the SDK saves the step with both outputs; get_items gives it back."""

    async def main() -> None:
        model = ScriptedModel(
            [
                [
                    _reasoning("rs_1"),
                    function_call("look", {"q": "a"}, call_id="c1", item_id="fc_1"),
                    function_call("slow", {"q": "b"}, call_id="c2", item_id="fc_2"),
                ],
                [assistant_message("Done.", item_id="msg_1")],
                [assistant_message("Again.", item_id="msg_2")],
            ]
        )
        agent = Agent(name="a", model=model, tools=[look, slow])
        async with Foundation(gateway="openai_responses") as foundation:
            session = Recording(TurnloomSession("s", foundation.manager))
            result = Runner.run_streamed(agent, "Go.", session=session)
            async for event in result.stream_events():
                if getattr(event, "name", None) == "tool_output":
                    result.cancel(mode=mode)
            await _holds(foundation, session)
            await Runner.run(agent, "More.", session=session)
            await _holds(foundation, session)

    asyncio.run(main())


def test_max_turns_exceeded_then_a_new_run() -> None:
    """Holds: the input and the step saved before MaxTurnsExceeded stay exact."""

    async def main() -> None:
        model = ScriptedModel(
            [
                [
                    _reasoning("rs_1"),
                    function_call("look", {"q": "a"}, call_id="c1", item_id="fc_1"),
                ],
                [assistant_message("Late.", item_id="msg_1")],
            ]
        )
        agent = Agent(name="a", model=model, tools=[look])
        async with Foundation(gateway="openai_responses") as foundation:
            session = Recording(TurnloomSession("s", foundation.manager))
            with pytest.raises(MaxTurnsExceeded):
                await Runner.run(agent, "Go.", session=session, max_turns=1)
            assert len(await _holds(foundation, session)) == 4
            await Runner.run(agent, "More.", session=session)
            await _holds(foundation, session)

    asyncio.run(main())


@pytest.mark.parametrize("with_parallel_call", [False, True])
def test_a_handoff_then_a_new_run(with_parallel_call: bool) -> None:
    """Holds: the handoff call and its output, the other agent's reasoning and reply."""

    async def main() -> None:
        first = [function_call("transfer_to_b", {}, call_id="h1", item_id="fc_h1")]
        if with_parallel_call:
            first.insert(0, function_call("look", {"q": "x"}, call_id="p1", item_id="fc_p1"))
        model = ScriptedModel(
            [
                first,
                [_reasoning("rs_b"), assistant_message("From b.", item_id="msg_b")],
                [assistant_message("B again.", item_id="msg_b2")],
            ]
        )
        b = Agent(name="b", model=model, tools=[look])
        agent = Agent(name="a", model=model, tools=[look], handoffs=[b])
        async with Foundation(gateway="openai_responses") as foundation:
            session = Recording(TurnloomSession("s", foundation.manager))
            assert (await Runner.run(agent, "Hi.", session=session)).final_output == "From b."
            await _holds(foundation, session)
            await Runner.run(agent, "More.", session=session)
            await _holds(foundation, session)

    asyncio.run(main())


def test_parallel_calls_with_a_tool_that_raises_then_a_new_run() -> None:
    """Holds: the SDK saves the finished call with its output and drops the failed
    one; nothing saved is lost and the held window stays valid."""

    async def main() -> None:
        model = ScriptedModel(
            [
                [
                    _reasoning("rs_1"),
                    function_call("look", {"q": "x"}, call_id="p1", item_id="fc_p1"),
                    function_call("boom", {"q": "y"}, call_id="p2", item_id="fc_p2"),
                ],
                [assistant_message("Ok.", item_id="msg_2")],
            ]
        )
        agent = Agent(name="a", model=model, tools=[look, boom])
        async with Foundation(gateway="openai_responses") as foundation:
            session = Recording(TurnloomSession("s", foundation.manager))
            with pytest.raises(UserError):
                await Runner.run(agent, "Hi.", session=session)
            await _holds(foundation, session)
            await Runner.run(agent, "More.", session=session)
            await _holds(foundation, session)

    asyncio.run(main())


def test_reasoning_message_reasoning_call_in_one_response() -> None:
    """Holds: two reasoning items of one response, each before its own output item."""

    async def main() -> None:
        model = ScriptedModel(
            [
                [
                    _reasoning("rs_1"),
                    assistant_message("Let me look.", item_id="msg_0"),
                    _reasoning("rs_2"),
                    function_call("look", {"q": "x"}, call_id="p1", item_id="fc_p1"),
                ],
                [assistant_message("Ok.", item_id="msg_2")],
                [assistant_message("Ok again.", item_id="msg_3")],
            ]
        )
        agent = Agent(name="a", model=model, tools=[look])
        async with Foundation(gateway="openai_responses") as foundation:
            session = Recording(TurnloomSession("s", foundation.manager))
            await Runner.run(agent, "Hi.", session=session)
            held = await _holds(foundation, session)
            await Runner.run(agent, "More.", session=session)
            await _holds(foundation, session)
            assert [dict(i) for i in model.calls[-1].input][: len(held)] == held

    asyncio.run(main())


def test_guardrail_tripwires_keep_what_was_saved() -> None:
    """Holds: an input tripwire saves the input, an output tripwire the steps before."""

    @input_guardrail
    async def trip_in(ctx: Any, agent: Any, given: Any) -> GuardrailFunctionOutput:
        return GuardrailFunctionOutput(output_info=None, tripwire_triggered=True)

    @output_guardrail
    async def trip_out(ctx: Any, agent: Any, output: Any) -> GuardrailFunctionOutput:
        return GuardrailFunctionOutput(output_info=None, tripwire_triggered=True)

    async def main() -> None:
        async with Foundation(gateway="openai_responses") as foundation:
            model = ScriptedModel([[assistant_message("Ok.", item_id="msg_1")]])
            agent = Agent(name="a", model=model, input_guardrails=[trip_in])
            session = Recording(TurnloomSession("in", foundation.manager))
            with pytest.raises(InputGuardrailTripwireTriggered):
                await Runner.run(agent, "Hi.", session=session)
            assert await _holds(foundation, session) == [{"role": "user", "content": "Hi."}]
            model = ScriptedModel(
                [
                    [function_call("look", {"q": "x"}, call_id="p1", item_id="fc_p1")],
                    [assistant_message("Ok.", item_id="msg_2")],
                ]
            )
            agent = Agent(name="a", model=model, tools=[look], output_guardrails=[trip_out])
            session = Recording(TurnloomSession("out", foundation.manager))
            with pytest.raises(OutputGuardrailTripwireTriggered):
                await Runner.run(agent, "Hi.", session=session)
            assert len(await _holds(foundation, session)) == 3

    asyncio.run(main())


def test_an_approval_interruption_resumed_from_its_run_state() -> None:
    """Holds: while the run waits for approval the open call is held but left out of
    the window (module doc: get_items never returns "a call without its output (a call
    left open ...)"); the resumed run's output closes it and every item comes back."""

    async def main() -> None:
        model = ScriptedModel(
            [
                [
                    _reasoning("rs_1"),
                    function_call("look", {"q": "a"}, call_id="c1", item_id="fc_1"),
                    function_call("risky", {"q": "b"}, call_id="c2", item_id="fc_2"),
                ],
                [assistant_message("Done.", item_id="msg_1")],
                [assistant_message("Again.", item_id="msg_2")],
            ]
        )
        agent = Agent(name="a", model=model, tools=[look, risky])
        async with Foundation(gateway="openai_responses") as foundation:
            session = Recording(TurnloomSession("s", foundation.manager))
            first = await Runner.run(agent, "Go.", session=session)
            assert len(first.interruptions) == 1
            window = await session.inner.get_items()
            assert _kinds(window) == [
                ("user", None),
                ("reasoning", "rs_1"),
                ("function_call", "c1"),
                ("function_call_output", "c1"),
            ]
            assert foundation.manager.gateway.validate(window) == []
            state = first.to_state()
            state.approve(first.interruptions[0])
            assert (await Runner.run(agent, state, session=session)).final_output == "Done."
            await _holds(foundation, session)
            await Runner.run(agent, "More.", session=session)
            await _holds(foundation, session)

    asyncio.run(main())


def test_items_from_a_real_run_are_not_shared_with_the_session() -> None:
    """Holds. get_items: "The items are fresh dicts: editing them changes nothing"; the
    batches the runner handed add_items, edited afterwards, change nothing either."""

    async def main() -> None:
        model = ScriptedModel(
            [
                [
                    _reasoning("rs_1"),
                    function_call("look", {"q": "a"}, call_id="c1", item_id="fc_1"),
                ],
                [assistant_message("Done.", item_id="msg_1")],
            ]
        )
        agent = Agent(name="a", model=model, tools=[look])
        async with Foundation(gateway="openai_responses") as foundation:
            inner = TurnloomSession("s", foundation.manager)
            given: list[list[Any]] = []

            class Keeping(Recording):
                async def add_items(self, items: list[Any]) -> None:
                    given.append(items)
                    await super().add_items(items)

            session = Keeping(inner)
            await Runner.run(agent, "Go.", session=session)
            expected = await _holds(foundation, session)
            for batch in given:
                for item in batch:
                    item["id"] = "edited"
                    for value in item.values():
                        if isinstance(value, list) and value and isinstance(value[0], dict):
                            value[0]["text"] = "edited"
            assert await inner.get_items() == expected
            got = await inner.get_items()
            got[1]["summary"][0]["text"] = "edited"
            got[2]["arguments"] = "edited"
            got[4]["content"][0]["text"] = "edited"
            got.clear()
            assert await inner.get_items() == expected

    asyncio.run(main())

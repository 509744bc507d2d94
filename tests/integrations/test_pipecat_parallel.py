"""Pipecat parallel function calls, one still running when the caller speaks again.

Pipecat writes each call of a parallel batch as its own assistant message with its
``tool`` message (``IN_PROGRESS`` until its result is final), and runs inferences
while a call is in progress (the caller's next turn). Every input the LLM service
gets must be a valid OpenAI Chat input. Pipecat is asyncio-only.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

pytest.importorskip("pipecat")

from tests.integrations.pipecat_fakes import (
    Call,
    FakeCall,
    ScriptedLLM,
    Wait,
    find_bag,
    run_calls,
)
from tests.integrations.test_pipecat import _history
from turnloom.context import get_gateway
from turnloom.runtime import Foundation

CALL_2 = {
    "role": "assistant",
    "tool_calls": [
        {
            "id": "c2",
            "function": {"name": "find_bag", "arguments": '{"tag": "SLOW"}'},
            "type": "function",
        }
    ],
}


def _placeholders(call: FakeCall) -> int:
    """How many IN_PROGRESS placeholders (tool messages of calls still running) Pipecat holds."""
    return sum(
        isinstance(m, dict) and m.get("role") == "tool" and m.get("content") == "IN_PROGRESS"
        for m in call.pair.context.get_messages()
    )


async def _inferred_and_played(call: FakeCall, model: ScriptedLLM, count: int) -> None:
    """Wait until the model was asked ``count`` times and ``count`` replies ended."""
    await call.until(lambda: len(model.seen) >= count)
    await call.replies(count)


def _slow_call_scenario() -> list[tuple[str, str]]:
    """A parallel batch whose slow call is IN_PROGRESS while the caller speaks again;
    asserts every input valid and the third exact; returns the history at the end."""
    gate = asyncio.Event()

    async def bag(params: Any) -> None:
        if params.arguments["tag"] == "SLOW":
            await gate.wait()
        await find_bag(params)

    histories: list[list[tuple[str, str]]] = []

    async def main() -> None:
        model = ScriptedLLM(
            [
                [
                    "Checking. ",
                    Call("c1", "find_bag", {"tag": "X1"}),
                    Call("c2", "find_bag", {"tag": "SLOW"}),
                ],
                ["Both found."],
                ["Sure."],
            ]
        )
        model.register_function("find_bag", bag)
        async with Foundation(gateway="openai_chat") as foundation:
            call = FakeCall(foundation.manager, model)

            def answered(call_id: str) -> bool:
                return any(
                    m.get("role") == "tool"
                    and m.get("tool_call_id") == call_id
                    and m.get("content") != "IN_PROGRESS"
                    for m in call.pair.context.get_messages()
                )

            async def script() -> None:
                await call.say("Where are my bags?")
                await call.until(lambda: answered("c1") and len(model.seen) >= 2)
                await call.say("Also, my flight?")
                await call.until(lambda: len(model.seen) >= 3)
                gate.set()
                # c2's result (CANCELLED by the caller's barge-in) and the reply "Sure."
                # are taken into turnloom (by the push the result brings).
                await call.until(
                    lambda: (
                        ("assistant", "Sure.") in _history(foundation.manager, "call-1")
                        and any(
                            kind == "result" and text.startswith("c2 ")
                            for kind, text in _history(foundation.manager, "call-1")
                        )
                    )
                )
                histories.append(_history(foundation.manager, "call-1"))
                await call.end()

            await run_calls([call], script)
        gateway = get_gateway("openai_chat")
        assert [gateway.validate(seen) for seen in model.seen] == [[]] * len(model.seen)
        third = model.seen[2]
        assert third[-4:] == [
            CALL_2,
            {"role": "tool", "content": "IN_PROGRESS", "tool_call_id": "c2"},
            {"role": "assistant", "content": "Both found."},
            {"role": "user", "content": "Also, my flight?"},
        ]

    asyncio.run(main())
    return histories[0]


def test_a_call_in_progress_keeps_its_call_before_its_placeholder_in_every_input() -> None:
    """Invariant: every input Pipecat sends holds a tool message only right after the
    assistant message with its call. A parallel batch's slow call still IN_PROGRESS
    when the caller's next turn runs an inference is sent as Pipecat holds it (its call,
    then its placeholder). Before the fix turnloom recorded the call (an open call,
    left out of its input) and left the placeholder behind: the input held a tool
    message answering no call, which OpenAI rejects.

    Mutant tried: recording up to the IN_PROGRESS tool message (as before): the third
    input has the violation tool_result_without_call."""
    _slow_call_scenario()


def test_a_reply_to_a_turn_said_during_a_running_call_follows_that_turn() -> None:
    """Invariant: a reply is recorded after the user message it answered. The caller's
    "Also, my flight?" (said while a parallel batch's slow call runs) is sent to the
    model, which answers "Sure."; history must end with that question, then "Sure."."""
    history = _slow_call_scenario()
    assert history[-2:] == [("user", "Also, my flight?"), ("assistant", "Sure.")]


@pytest.mark.parametrize("calls", [1, 2])
@pytest.mark.parametrize("result", ["before the reply", "after the reply"])
def test_a_turn_said_during_running_calls_is_committed_before_its_reply_whenever_they_end(
    calls: int, result: str
) -> None:
    """Invariant: a turn said while calls of the previous turn are IN_PROGRESS (one, or
    two of a parallel batch; the caller's speech interrupts nothing) is committed at
    once, so the reply to it is recorded to it; each call and its result, whenever the
    result comes (before the reply is recorded or after), are recorded together to the
    turn that made the call; nothing said is lost or doubled, every call stays paired,
    and every input passes the gateway's ``validate()``.

    Mutant tried: the user message waits behind the call as before (``_held`` marks
    every message from the first call in progress): "Sure." is recorded to the first
    turn, before "Also, my flight?", in all four cases."""
    slow = [f"SLOW{n}" for n in range(1, calls + 1)]
    results = asyncio.Event()  # the calls' results come
    speak = asyncio.Event()  # the model streams its reply to the second turn
    read = asyncio.Event()  # the history was read: the model answers the third turn

    async def bag(params: Any) -> None:
        await results.wait()
        await find_bag(params)

    histories: list[list[tuple[str, str]]] = []

    async def main() -> None:
        model = ScriptedLLM(
            [
                [
                    "Checking. ",
                    *(Call(f"c{n}", "find_bag", {"tag": t}) for n, t in enumerate(slow, 1)),
                ],
                [Wait(speak), "Sure."],
                ["Both found."],
                [Wait(read), "You're welcome."],
            ]
        )
        model.register_function("find_bag", bag)
        async with Foundation(gateway="openai_chat") as foundation:
            call = FakeCall(foundation.manager, model, interruptions=False)

            def history() -> list[tuple[str, str]]:
                return _history(foundation.manager, "call-1")

            def recorded() -> bool:
                return sum(kind == "result" for kind, _ in history()) == calls

            async def script() -> None:
                await call.say("Where are my bags?")
                await call.until(lambda: _placeholders(call) == calls)
                await call.say("Also, my flight?")
                await call.until(lambda: len(model.seen) >= 2)
                if result == "before the reply":
                    results.set()
                    await call.until(recorded)
                    speak.set()
                else:
                    speak.set()
                    await call.replies(2)
                    results.set()
                    await call.until(recorded)
                await _inferred_and_played(call, model, 3)
                await call.say("Thanks.")
                await call.until(lambda: len(model.seen) >= 4)
                histories.append(history())
                read.set()
                await call.end()

            await run_calls([call], script)
        gateway = get_gateway("openai_chat")
        assert [gateway.validate(seen) for seen in model.seen] == [[]] * 4
        made = [
            (kind, text)
            for n, tag in enumerate(slow, 1)
            for kind, text in [
                ("call", f'c{n} find_bag {{"tag": "{tag}"}}'),
                ("result", f'c{n} "Gate 4 ({tag})"'),
            ]
        ]
        assert histories == [
            [
                ("user", "Where are my bags?"),
                ("assistant", "Checking."),
                *made,
                ("user", "Also, my flight?"),
                ("assistant", "Sure."),
                ("assistant", "Both found."),
                ("user", "Thanks."),
            ]
        ]

    asyncio.run(main())


def test_calls_of_two_turns_running_across_a_third_each_settle_to_their_own_turn() -> None:
    """Invariant: outputs wait for a call in progress only within their own turn. A call
    of the first turn and one of the second are both IN_PROGRESS when the caller says a
    third turn; each call and its result (the first's result comes first) are recorded
    to the turn that made it, every reply to the turn it answers, and every input
    passes the gateway's ``validate()``.

    Mutant tried: after a user message taken before, the waiting outputs go to the
    reply's turn (``owner = None``): the second call and its result land in the third
    turn."""
    first, second = asyncio.Event(), asyncio.Event()  # each call's result comes
    read = asyncio.Event()

    async def bag(params: Any) -> None:
        await (first if params.arguments["tag"] == "SLOW1" else second).wait()
        await find_bag(params)

    histories: list[list[tuple[str, str]]] = []

    async def main() -> None:
        model = ScriptedLLM(
            [
                ["Checking. ", Call("c1", "find_bag", {"tag": "SLOW1"})],
                ["Sure. ", Call("c2", "find_bag", {"tag": "SLOW2"})],
                ["Noted."],
                ["One found."],
                ["Both found."],
                [Wait(read), "Bye."],
            ]
        )
        model.register_function("find_bag", bag)
        async with Foundation(gateway="openai_chat") as foundation:
            call = FakeCall(foundation.manager, model, interruptions=False)

            async def script() -> None:
                await call.say("Where are my bags?")
                await call.until(lambda: _placeholders(call) == 1)
                await call.say("Also, my flight?")
                await call.until(lambda: _placeholders(call) == 2)
                await call.say("And my seat?")
                await _inferred_and_played(call, model, 3)
                first.set()
                await _inferred_and_played(call, model, 4)
                second.set()
                await _inferred_and_played(call, model, 5)
                await call.say("Thanks.")
                await call.until(lambda: len(model.seen) >= 6)
                histories.append(_history(foundation.manager, "call-1"))
                read.set()
                await call.end()

            await run_calls([call], script)
        gateway = get_gateway("openai_chat")
        assert [gateway.validate(seen) for seen in model.seen] == [[]] * 6
        assert histories == [
            [
                ("user", "Where are my bags?"),
                ("assistant", "Checking."),
                ("call", 'c1 find_bag {"tag": "SLOW1"}'),
                ("result", 'c1 "Gate 4 (SLOW1)"'),
                ("user", "Also, my flight?"),
                ("assistant", "Sure."),
                ("call", 'c2 find_bag {"tag": "SLOW2"}'),
                ("result", 'c2 "Gate 4 (SLOW2)"'),
                ("user", "And my seat?"),
                ("assistant", "Noted."),
                ("assistant", "One found."),
                ("assistant", "Both found."),
                ("user", "Thanks."),
            ]
        ]

    asyncio.run(main())


def test_a_false_start_said_during_a_running_call_is_taken_out_and_the_next_turn_is_not() -> None:
    """Invariant: a false start said while a call of the previous turn is IN_PROGRESS is
    never committed, runs no inference and leaves Pipecat's context; the real turn said
    after it is committed at once and the model reads it right after the call's
    placeholder; the call's result still pairs with its call in the first turn.

    Mutant tried: the false start is not removed from Pipecat's context (no
    ``dropped``): it waits there and is judged again at later pushes (the hook hears
    seven texts, "Um." among them more than once)."""
    results = asyncio.Event()
    read = asyncio.Event()
    heard: list[str] = []

    def false_start(text: str) -> bool:
        heard.append(text)
        return text == "Um."

    async def bag(params: Any) -> None:
        await results.wait()
        await find_bag(params)

    histories: list[list[tuple[str, str]]] = []

    async def main() -> None:
        model = ScriptedLLM(
            [
                ["Checking. ", Call("c1", "find_bag", {"tag": "SLOW1"})],
                ["Sure."],
                ["Found it."],
                [Wait(read), "Bye."],
            ]
        )
        model.register_function("find_bag", bag)
        async with Foundation(gateway="openai_chat") as foundation:
            call = FakeCall(foundation.manager, model, interruptions=False, false_start=false_start)

            async def script() -> None:
                await call.say("Where are my bags?")
                await call.until(lambda: _placeholders(call) >= 1)
                await call.say("Um.")
                await call.until(lambda: "Um." in heard)
                await call.say("Also, my flight?")
                await _inferred_and_played(call, model, 2)
                results.set()
                await _inferred_and_played(call, model, 3)
                await call.say("Thanks.")
                await call.until(lambda: len(model.seen) >= 4)
                histories.append(_history(foundation.manager, "call-1"))
                read.set()
                await call.end()

            await run_calls([call], script)
        gateway = get_gateway("openai_chat")
        assert [gateway.validate(seen) for seen in model.seen] == [[]] * 4
        assert heard == ["Where are my bags?", "Um.", "Also, my flight?", "Thanks."]
        assert model.seen[1][-3:] == [
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "c1",
                        "function": {"name": "find_bag", "arguments": '{"tag": "SLOW1"}'},
                        "type": "function",
                    }
                ],
            },
            {"role": "tool", "content": "IN_PROGRESS", "tool_call_id": "c1"},
            {"role": "user", "content": "Also, my flight?"},
        ]
        assert histories == [
            [
                ("user", "Where are my bags?"),
                ("assistant", "Checking."),
                ("call", 'c1 find_bag {"tag": "SLOW1"}'),
                ("result", 'c1 "Gate 4 (SLOW1)"'),
                ("user", "Also, my flight?"),
                ("assistant", "Sure."),
                ("assistant", "Found it."),
                ("user", "Thanks."),
            ]
        ]

    asyncio.run(main())


def test_a_services_own_message_is_counted_and_warned_not_dropped_silently(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Invariant: nothing Pipecat's context is handed vanishes without a trace: a
    service's own ``LLMSpecificMessage`` (Gemini's thought signature, appended by
    Pipecat's GoogleLLMService with an ``LLMMessagesAppendFrame``), which turnloom cannot
    hold, is counted in ``specific_messages_dropped`` (one WARNING per call), and the
    inference after it reads turnloom's input. Before the fix it was dropped silently.

    Mutant tried: no _drop_specific call: the counter stays 0, no warning."""
    from pipecat.frames.frames import LLMMessagesAppendFrame
    from pipecat.processors.aggregators.llm_context import LLMSpecificMessage

    def signature(n: int) -> LLMSpecificMessage:
        message = {"type": "thought_signature", "signature": f"sig{n}", "bookmark": {"text": "x"}}
        return LLMSpecificMessage(llm="google", message=message)

    async def main() -> None:
        model = ScriptedLLM([["Hello."], ["Still here."]])
        async with Foundation(gateway="openai_chat") as foundation:
            call = FakeCall(foundation.manager, model)

            async def script() -> None:
                await call.say("Hi.")
                await call.replies(1)
                frame = LLMMessagesAppendFrame([signature(1), signature(2)], run_llm=True)
                await call.worker.queue_frame(frame)
                await call.replies(2)
                await call.end()

            with caplog.at_level(logging.WARNING, logger="turnloom.integrations.pipecat"):
                await run_calls([call], script)
            assert call.pair.specific_messages_dropped == 2
        assert model.seen[1] == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi."},
            {"role": "assistant", "content": "Hello."},
        ]
        assert [r.getMessage() for r in caplog.records] == [
            "Context 'call-1': left out a message of Pipecat's context that turnloom cannot "
            "hold (an LLMSpecificMessage for 'google', type 'thought_signature'); the pair "
            "counts them in specific_messages_dropped."
        ]

    asyncio.run(main())

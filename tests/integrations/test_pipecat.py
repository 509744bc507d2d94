"""``TurnloomContextAggregatorPair`` in a real Pipecat pipeline with a scripted LLM and TTS.

Pipecat is asyncio-only, so these tests run on asyncio only. Each call is a
real ``Pipeline`` of the pair's aggregators around a real ``LLMService``
subclass (scripted replies, Pipecat's own function-call runner) and a TTS
stand-in that releases words as they play, run by Pipecat's ``WorkerRunner``
as Pipecat's own tests do; the caller's turns are an external turn
detector's frames and transcripts (no audio, no network).

Invariants: turnloom's history is the exact conversation (a reply as played,
a tool call and its result, an asynchronous call's placeholder and later
results, no false start); every input the LLM is sent is
exactly turnloom's (OpenAI Chat, and Anthropic as Pipecat's adapter converts
it); Pipecat's own context stays bounded; the pipeline's end removes the
context, even while the model streams.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from typing import Any

import pytest

pytest.importorskip("pipecat")

from pipecat.frames.frames import (
    FunctionCallResultProperties,
    LLMMessagesAppendFrame,
    LLMMessagesTransformFrame,
    LLMMessagesUpdateFrame,
    LLMRunFrame,
    ProposedUserStartedSpeakingFrame,
    ProposedUserStoppedSpeakingFrame,
    TranscriptionFrame,
)
from pipecat.processors.aggregators import async_tool_messages
from pipecat.processors.frame_processor import FrameDirection
from pipecat.utils import deprecation

from tests.integrations.pipecat_fakes import (
    Call,
    FakeCall,
    ScriptedLLM,
    anthropic_service,
    find_bag,
    openai_service,
    run_calls,
)
from turnloom.context import (
    HistoryLimits,
    ImagePart,
    Message,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)
from turnloom.errors import InvalidArgumentError
from turnloom.integrations.pipecat import TurnloomContextAggregatorPair
from turnloom.runtime import ContextManager, ContextPrepareRequest, Foundation, TurnSnapshot

CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "find_bag", "arguments": '{"tag": "X1"}'},
}
SYSTEM = {"role": "system", "content": "Be brief."}
# Pipecat encodes a function's result as JSON: the string result arrives quoted.
CHAT = [
    {"role": "user", "content": "Where is my bag?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": '"Gate 4 (X1)"'},
    {"role": "assistant", "content": "It is at gate 4."},
    {"role": "user", "content": "Thanks."},
    {"role": "assistant", "content": "Bye."},
]
ANTHROPIC = [
    {"role": "user", "content": "Where is my bag?"},
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "c1", "name": "find_bag", "input": {"tag": "X1"}}],
    },
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "c1", "content": '"Gate 4 (X1)"'}],
    },
    {"role": "assistant", "content": "It is at gate 4."},
    {"role": "user", "content": "Thanks."},
]


# Twenty words at 50 ms each: a barge-in after the third lands long before the end.
LONG_REPLY = [
    *("Three ", "flights ", "go ", "to ", "Oslo ", "today, ", "at ", "nine, ", "noon "),
    *("and ", "six; ", "the ", "first ", "is ", "nearly ", "full, ", "the ", "others ", "are "),
    "not.",
]


def _native(message: Any) -> Any:
    """``message`` as Pipecat's loosely typed message lists take it (a plain dict, untyped)."""
    return message


def _script(*greeting: str) -> ScriptedLLM:
    model = ScriptedLLM(
        [
            *([list(greeting)] if greeting else []),
            [Call("c1", "find_bag", {"tag": "X1"})],
            ["It is at ", "gate 4."],
            ["Bye."],
        ]
    )
    model.register_function("find_bag", find_bag)
    return model


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


HISTORY = [
    ("user", "Where is my bag?"),
    ("call", 'c1 find_bag {"tag": "X1"}'),
    ("result", 'c1 "Gate 4 (X1)"'),
    ("assistant", "It is at gate 4."),
    ("user", "Thanks."),
    ("assistant", "Bye."),
]


async def _two_turns(call: FakeCall[ScriptedLLM]) -> None:
    await call.say("Where is my bag?")
    await call.replies(2)  # the tool call's (silent) reply, then the answer
    await call.say("Thanks.")
    await call.replies(3)


def test_a_call_with_a_tool_records_the_exact_history_and_sends_the_exact_inputs() -> None:
    """Every input Pipecat's LLM was sent is turnloom's, in OpenAI Chat and, through
    Pipecat's Anthropic adapter, Anthropic shape; the next turn's prepared input holds
    the whole exact conversation."""

    async def main() -> None:
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            call = FakeCall(manager, _script())
            histories: list[list[tuple[str, str]]] = []

            async def script() -> None:
                await _two_turns(call)
                histories.append(_history(manager, "call-1"))
                await call.end()

            await run_calls([call], script)
            assert histories == [HISTORY]
            assert call.llm.seen == [[SYSTEM, *CHAT[:1]], [SYSTEM, *CHAT[:3]], [SYSTEM, *CHAT[:5]]]
            assert call.llm.anthropic == [
                {"system": "Be brief.", "messages": ANTHROPIC[:1]},
                {
                    "system": "Be brief.",
                    "messages": [
                        *ANTHROPIC[:2],
                        {
                            "role": "user",
                            "content": [
                                {
                                    "type": "tool_result",
                                    "tool_use_id": "c1",
                                    "content": '"Gate 4 (X1)"',
                                }
                            ],
                        },
                    ],
                },
                {"system": "Be brief.", "messages": ANTHROPIC},
            ]
            # The pipeline's end removed the call's context.
            assert manager.context_ids() == ()

    asyncio.run(main())


def test_the_next_input_after_the_call_is_exact_for_openai_chat_and_anthropic() -> None:
    """The history the pipeline recorded renders, in a third turn, as the exact next
    input on turnloom's own OpenAI Chat and Anthropic gateways."""

    async def main() -> None:
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            call = FakeCall(manager, _script())
            inputs: list[Any] = []

            async def script() -> None:
                await _two_turns(call)
                view = manager.history("call-1")
                messages = [m for t in view.turn_ids for m in view.turn_messages(t)]
                inputs.append(messages)
                await call.end()

            await run_calls([call], script)
            messages = inputs[0]
            one_more = Message(role=Role.user, content="One more.")
            system = Message(role=Role.system, content="Be brief.")
            for gateway in ("openai_chat", "anthropic"):
                async with Foundation(gateway=gateway) as replay:
                    replay.manager.accept_turn(
                        TurnSnapshot(
                            context_id="c",
                            turn_id="t1",
                            instructions=(system,),
                            input=(messages[0],),
                        )
                    )
                    replay.manager.record("c", "t1", messages[1:4])
                    replay.manager.accept_turn(
                        TurnSnapshot(context_id="c", turn_id="t2", input=(messages[4],))
                    )
                    replay.manager.record("c", "t2", messages[5:])
                    replay.manager.accept_turn(
                        TurnSnapshot(context_id="c", turn_id="t3", input=(one_more,))
                    )
                    prefix = await replay.manager.prepare(
                        ContextPrepareRequest(context_id="c", turn_id="t3")
                    )
                    body = replay.manager.gateway.request_body(prefix.items)
                    inputs.append((gateway, body))
            assert inputs[1] == (
                "openai_chat",
                {"messages": [SYSTEM, *CHAT, {"role": "user", "content": "One more."}]},
            )

            def text(value: str) -> list[dict[str, str]]:
                return [{"type": "text", "text": value}]

            assert inputs[2] == (
                "anthropic",
                {
                    "system": text("Be brief."),
                    "messages": [
                        {"role": "user", "content": text("Where is my bag?")},
                        {
                            "role": "assistant",
                            "content": [
                                {
                                    "type": "tool_use",
                                    "id": "c1",
                                    "name": "find_bag",
                                    "input": {"tag": "X1"},
                                }
                            ],
                        },
                        {
                            "role": "user",
                            "content": [
                                {
                                    "type": "tool_result",
                                    "tool_use_id": "c1",
                                    "content": text('"Gate 4 (X1)"'),
                                    "is_error": False,
                                }
                            ],
                        },
                        {"role": "assistant", "content": text("It is at gate 4.")},
                        {"role": "user", "content": text("Thanks.")},
                        {"role": "assistant", "content": text("Bye.")},
                        {"role": "user", "content": text("One more.")},
                    ],
                },
            )

    asyncio.run(main())


def test_a_barge_in_records_only_the_words_played_before_it() -> None:
    """The caller speaks while the TTS plays the reply: Pipecat's InterruptionFrame cuts
    the playback, and turnloom holds only the words the TTS released before it."""

    async def main() -> None:
        model = ScriptedLLM([LONG_REPLY, ["Yes."]])
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            call = FakeCall(manager, model, word_seconds=0.05)
            histories: list[list[tuple[str, str]]] = []

            async def script() -> None:
                await call.say("Which flights go to Oslo?")
                await call.until(lambda: len(call.tts.played) >= 3)
                await call.say("The morning one?", replies_before_stop=1)  # barge-in
                await call.replies(2)
                histories.append(_history(manager, "call-1"))
                await call.end()

            await run_calls([call], script)
            played = "".join(call.stopped[0].content)
            assert call.stopped[0].interrupted
            assert 3 <= len(played.split()) < len(LONG_REPLY)
            assert histories == [
                [
                    ("user", "Which flights go to Oslo?"),
                    ("assistant", played),
                    ("user", "The morning one?"),
                    ("assistant", "Yes."),
                ]
            ]
            assert model.seen[1][-2:] == [
                {"role": "assistant", "content": played},
                {"role": "user", "content": "The morning one?"},
            ]

    asyncio.run(main())


def test_a_cut_reply_taken_after_the_barge_ins_turn_goes_to_the_turn_it_answered() -> None:
    """The caller's short barge-in ends before the cut reply reaches the assistant
    aggregator (Pipecat's context then holds the reply after the new question): turnloom
    records the played words to the turn they answered, so history keeps the order."""

    async def main() -> None:
        model = ScriptedLLM([LONG_REPLY, ["Yes."]])
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            call = FakeCall(manager, model, word_seconds=0.05)
            histories: list[list[tuple[str, str]]] = []

            async def script() -> None:
                await call.say("Which flights go to Oslo?")
                await call.until(lambda: len(call.tts.played) >= 3)
                await call.say("The morning one?")
                await call.replies(2)
                await call.say("Thanks.")
                await call.replies(3)
                histories.append(_history(manager, "call-1"))
                await call.end()

            await run_calls([call], script)
            played = "".join(call.stopped[0].content)
            assert call.stopped[0].interrupted and played
            assert histories == [
                [
                    ("user", "Which flights go to Oslo?"),
                    ("assistant", played),
                    ("user", "The morning one?"),
                    ("assistant", "Yes."),
                    ("user", "Thanks."),
                    ("assistant", "OK."),
                ]
            ]
            assert model.seen[2][1:] == [
                {"role": "user", "content": "Which flights go to Oslo?"},
                {"role": "assistant", "content": played},
                {"role": "user", "content": "The morning one?"},
                {"role": "assistant", "content": "Yes."},
                {"role": "user", "content": "Thanks."},
            ]

    asyncio.run(main())


def test_a_result_still_in_progress_is_recorded_only_once_final() -> None:
    """The model speaks, then calls a slow tool: Pipecat writes the spoken text and the
    call while it shows the result as IN_PROGRESS, and pushes the spoken reply then;
    turnloom records the call's final result, never the placeholder."""

    async def slow_find_bag(params: Any) -> None:
        await asyncio.sleep(0.2)
        await find_bag(params)

    async def main() -> None:
        model = ScriptedLLM(
            [["Let me check. ", Call("c1", "find_bag", {"tag": "X1"})], ["Gate 4."]]
        )
        model.register_function("find_bag", slow_find_bag)
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            call = FakeCall(manager, model)
            histories: list[list[tuple[str, str]]] = []

            async def script() -> None:
                await call.say("Where is my bag?")
                await call.replies(2)
                histories.append(_history(manager, "call-1"))
                await call.end()

            await run_calls([call], script)
            assert histories == [
                [
                    ("user", "Where is my bag?"),
                    ("assistant", "Let me check."),
                    ("call", 'c1 find_bag {"tag": "X1"}'),
                    ("result", 'c1 "Gate 4 (X1)"'),
                    ("assistant", "Gate 4."),
                ]
            ]
            assert model.seen[1][2:] == [
                {"role": "assistant", "content": "Let me check."},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "c1", "content": '"Gate 4 (X1)"'},
            ]

    asyncio.run(main())


def _async_find_bag(model: ScriptedLLM, *, update: str | None = None) -> asyncio.Event:
    """Register ``find_bag`` on ``model`` as an asynchronous call
    (``cancel_on_interruption=False``) that reports ``update`` as an intermediate result
    first (when given) and its result once the returned event is set."""
    release = asyncio.Event()

    async def slow_find_bag(params: Any) -> None:
        if update is not None:
            properties = FunctionCallResultProperties(is_final=False)
            await params.result_callback(update, properties=properties)
        await release.wait()
        await find_bag(params)

    model.register_function("find_bag", slow_find_bag, cancel_on_interruption=False)
    return release


# Pipecat's own messages for an asynchronous call (``cancel_on_interruption=False``).
STARTED = async_tool_messages.build_started_message("c1")["content"]
FINAL = async_tool_messages.build_final_result_message("c1", '"Gate 4 (X1)"')["content"]
SEARCHING = async_tool_messages.build_intermediate_result_message("c1", '"Searching"')["content"]


def test_an_async_calls_result_after_the_next_user_turn_is_recorded_and_sent() -> None:
    """An asynchronous call's result comes after the caller spoke again: Pipecat writes
    it as a developer message (a deferred final result), which turnloom records to the
    turn then current as a user message of its text (Pipecat's own conversion for
    providers without a developer role) and sends in the inference it starts; the
    placeholder the model saw stays the call's result. Nothing Pipecat wrote is lost."""

    async def main() -> None:
        model = ScriptedLLM(
            [["Let me look. ", Call("c1", "find_bag", {"tag": "X1"})], ["Noon."], ["Gate 4."]]
        )
        release = _async_find_bag(model)
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            call = FakeCall(manager, model)
            histories: list[list[tuple[str, str]]] = []

            async def script() -> None:
                await call.say("Where is my bag?")
                await call.replies(1)
                await call.say("What time is it?")
                await call.replies(2)
                release.set()
                await call.replies(3)
                histories.append(_history(manager, "call-1"))
                await call.end()

            await run_calls([call], script)
            assert histories == [
                [
                    ("user", "Where is my bag?"),
                    ("assistant", "Let me look."),
                    ("call", 'c1 find_bag {"tag": "X1"}'),
                    ("result", f"c1 {STARTED}"),
                    ("user", "What time is it?"),
                    ("assistant", "Noon."),
                    ("user", FINAL),
                    ("assistant", "Gate 4."),
                ]
            ]
            assert model.seen[2][1:] == [
                {"role": "user", "content": "Where is my bag?"},
                {"role": "assistant", "content": "Let me look."},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "c1", "content": STARTED},
                {"role": "user", "content": "What time is it?"},
                {"role": "assistant", "content": "Noon."},
                {"role": "user", "content": FINAL},
            ]

    asyncio.run(main())


def test_an_async_calls_result_settled_in_place_after_turnloom_took_it_is_recorded() -> None:
    """A synchronous sibling's result runs an inference while an asynchronous call
    still runs, so turnloom records its placeholder; its result then comes with nothing
    but model output after the placeholder, and Pipecat writes it over the placeholder
    in the context turnloom gave it. turnloom records it as Pipecat's final-result
    message (a user message of its text) and the inference it starts sends it."""

    async def weather(params: Any) -> None:
        await params.result_callback("Sunny", properties=FunctionCallResultProperties(run_llm=True))

    async def main() -> None:
        model = ScriptedLLM(
            [
                [Call("c1", "find_bag", {"tag": "X1"}), Call("c2", "weather", {})],
                ["Sunny; still looking."],
                ["Gate 4."],
            ]
        )
        release = _async_find_bag(model)
        model.register_function("weather", weather)
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            call = FakeCall(manager, model)
            histories: list[list[tuple[str, str]]] = []

            async def script() -> None:
                await call.say("My bag, and the weather?")
                await call.replies(2)
                release.set()
                await call.replies(3)
                histories.append(_history(manager, "call-1"))
                await call.end()

            await run_calls([call], script)
            assert histories == [
                [
                    ("user", "My bag, and the weather?"),
                    ("call", 'c1 find_bag {"tag": "X1"}'),
                    ("result", f"c1 {STARTED}"),
                    ("call", "c2 weather {}"),
                    ("result", 'c2 "Sunny"'),
                    ("assistant", "Sunny; still looking."),
                    ("user", FINAL),
                    ("assistant", "Gate 4."),
                ]
            ]
            assert model.seen[2][-2:] == [
                {"role": "assistant", "content": "Sunny; still looking."},
                {"role": "user", "content": FINAL},
            ]

    asyncio.run(main())


def test_an_async_calls_intermediate_and_final_results_are_recorded_in_order() -> None:
    """An asynchronous call reports an intermediate result, then its final one: both
    of Pipecat's developer messages are recorded, in order, as user messages of their
    text, and each inference they start sends what came before it."""

    async def main() -> None:
        model = ScriptedLLM(
            [[Call("c1", "find_bag", {"tag": "X1"})], ["Still searching."], ["Gate 4."]]
        )
        release = _async_find_bag(model, update="Searching")
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            call = FakeCall(manager, model)
            histories: list[list[tuple[str, str]]] = []

            async def script() -> None:
                await call.say("Where is my bag?")
                await call.replies(2)
                release.set()
                await call.replies(3)
                histories.append(_history(manager, "call-1"))
                await call.end()

            await run_calls([call], script)
            assert histories == [
                [
                    ("user", "Where is my bag?"),
                    ("call", 'c1 find_bag {"tag": "X1"}'),
                    ("result", f"c1 {STARTED}"),
                    ("user", SEARCHING),
                    ("assistant", "Still searching."),
                    ("user", FINAL),
                    ("assistant", "Gate 4."),
                ]
            ]
            assert model.seen[1][-1] == {"role": "user", "content": SEARCHING}
            assert model.seen[2][-2:] == [
                {"role": "assistant", "content": "Still searching."},
                {"role": "user", "content": FINAL},
            ]

    asyncio.run(main())


IDLE = "The user is quiet. Ask if they are still there."


@pytest.mark.parametrize("role", ["system", "developer"])
def test_a_hosts_appended_note_is_recorded_as_a_user_message_and_runs_an_inference(
    role: str,
) -> None:
    """A host appends a note mid-call (``LLMMessagesAppendFrame(run_llm=True)``, as
    Pipecat's idle handling does): turnloom records it to the current turn as a user
    message of its text (instructions never land mid-history; Pipecat's Anthropic
    adapter converts it alike), and the inference the host asked for runs on
    turnloom's input with it."""

    async def main() -> None:
        model = ScriptedLLM([["Hello."], ["Are you still there?"]])
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            call = FakeCall(manager, model)
            histories: list[list[tuple[str, str]]] = []

            async def script() -> None:
                await call.say("Hi.")
                await call.replies(1)
                note = LLMMessagesAppendFrame(
                    [_native({"role": role, "content": IDLE})], run_llm=True
                )
                await call.worker.queue_frame(note)
                await call.replies(2)
                histories.append(_history(manager, "call-1"))
                await call.end()

            await run_calls([call], script)
            assert histories == [
                [
                    ("user", "Hi."),
                    ("assistant", "Hello."),
                    ("user", IDLE),
                    ("assistant", "Are you still there?"),
                ]
            ]
            assert model.seen == [
                [SYSTEM, {"role": "user", "content": "Hi."}],
                [
                    SYSTEM,
                    {"role": "user", "content": "Hi."},
                    {"role": "assistant", "content": "Hello."},
                    {"role": "user", "content": IDLE},
                ],
            ]

    asyncio.run(main())


def test_an_llm_run_frame_after_the_first_turn_runs_an_inference_on_turnlooms_input() -> None:
    """The host asks for a reply with no new message (``LLMRunFrame`` mid-call): the
    inference runs, on turnloom's input, and its reply is recorded to the turn."""

    async def main() -> None:
        model = ScriptedLLM([["Hello."], ["Anything else?"]])
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            call = FakeCall(manager, model)
            histories: list[list[tuple[str, str]]] = []

            async def script() -> None:
                await call.say("Hi.")
                await call.replies(1)
                await call.worker.queue_frame(LLMRunFrame())
                await call.replies(2)
                histories.append(_history(manager, "call-1"))
                await call.end()

            await run_calls([call], script)
            assert histories == [
                [("user", "Hi."), ("assistant", "Hello."), ("assistant", "Anything else?")]
            ]
            assert model.seen[1] == [
                SYSTEM,
                {"role": "user", "content": "Hi."},
                {"role": "assistant", "content": "Hello."},
            ]

    asyncio.run(main())


def test_a_hosts_note_before_the_first_turn_opens_its_input_as_a_user_message() -> None:
    """The host starts the call with a note and a reply (``LLMMessagesAppendFrame
    (run_llm=True)`` before the caller speaks, Pipecat's greeting pattern): every
    inference reads it as the same user message of its text, the greeting's as every
    later one, whose first turn's input opens with it and the greeting."""
    hello = "Introduce yourself."

    async def main() -> None:
        model = ScriptedLLM([["I am the bag desk."], ["Gate 4."]])
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            call = FakeCall(manager, model)
            histories: list[list[tuple[str, str]]] = []

            async def script() -> None:
                note = LLMMessagesAppendFrame([{"role": "system", "content": hello}], run_llm=True)
                await call.worker.queue_frame(note)
                await call.replies(1)
                await call.say("Where is my bag?")
                await call.replies(2)
                histories.append(_history(manager, "call-1"))
                await call.end()

            await run_calls([call], script)
            assert histories == [
                [
                    ("user", hello),
                    ("assistant", "I am the bag desk."),
                    ("user", "Where is my bag?"),
                    ("assistant", "Gate 4."),
                ]
            ]
            assert model.seen[0] == [SYSTEM, {"role": "user", "content": hello}]
            assert model.seen[1] == [
                SYSTEM,
                {"role": "user", "content": hello},
                {"role": "assistant", "content": "I am the bag desk."},
                {"role": "user", "content": "Where is my bag?"},
            ]

    asyncio.run(main())


@pytest.mark.parametrize("rewrite", ["update", "transform"])
def test_a_frame_rewriting_the_context_is_refused_loudly_and_changes_nothing(rewrite: str) -> None:
    """``LLMMessagesUpdateFrame`` and ``LLMMessagesTransformFrame`` would rewrite the
    context turnloom holds: each is refused with an InvalidArgumentError, which
    Pipecat reports as an ErrorFrame (``on_pipeline_error``); turnloom's history and
    Pipecat's context are unchanged and the call goes on."""

    async def main() -> None:
        model = ScriptedLLM([["Hello."], ["Bye."]])
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            call = FakeCall(manager, model)
            errors: list[Any] = []
            histories: list[list[tuple[str, str]]] = []

            @call.worker.event_handler("on_pipeline_error")  # type: ignore[misc]
            async def _error(worker: Any, frame: Any) -> None:
                errors.append(frame.exception)

            reset: list[Any] = [{"role": "user", "content": "Forget everything."}]
            frame = (
                LLMMessagesUpdateFrame(reset, run_llm=True)
                if rewrite == "update"
                else LLMMessagesTransformFrame(lambda messages: reset, run_llm=True)
            )

            async def script() -> None:
                await call.say("Hi.")
                await call.replies(1)
                await call.worker.queue_frame(frame)
                await call.until(lambda: bool(errors))
                histories.append(_history(manager, "call-1"))
                await call.say("Thanks.")
                await call.replies(2)
                await call.end()

            await run_calls([call], script)
            assert [type(error) for error in errors] == [InvalidArgumentError]
            assert histories == [[("user", "Hi."), ("assistant", "Hello.")]]
            assert model.seen[1] == [
                SYSTEM,
                {"role": "user", "content": "Hi."},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Thanks."},
            ]

    asyncio.run(main())


def test_a_user_message_with_an_image_is_committed_with_it_and_sent() -> None:
    """A user message carrying an image (a host's ``LLMMessagesAppendFrame``, the shape
    Pipecat's vision frames add) commits a turn holding its text and its image, as
    turnloom's OpenAI Chat gateway parses it, and the model is sent both."""
    url = "data:image/png;base64,iVBORw0KGgo="
    native = {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is on this tag?"},
            {"type": "image_url", "image_url": {"url": url}},
        ],
    }

    async def main() -> None:
        model = ScriptedLLM([["Hello."], ["It reads X1."]])
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            call = FakeCall(manager, model)
            turns: list[tuple[Message, ...]] = []

            async def script() -> None:
                await call.say("Hi.")
                await call.replies(1)
                await call.worker.queue_frame(
                    LLMMessagesAppendFrame([_native(native)], run_llm=True)
                )
                await call.replies(2)
                view = manager.history("call-1")
                turns.extend(view.turn_messages(turn) for turn in view.turn_ids)
                await call.end()

            await run_calls([call], script)
            assert [len(messages) for messages in turns] == [2, 2]
            assert turns[1][0] == Message(
                role=Role.user,
                content=(
                    TextPart(text="What is on this tag?"),
                    ImagePart(data="iVBORw0KGgo=", media_type="image/png"),
                ),
            )
            assert model.seen[1][-1] == native

    asyncio.run(main())


@pytest.mark.parametrize("moved_on", [True, False])
def test_an_async_result_held_back_by_a_false_start_still_runs_its_inference(
    moved_on: bool,
) -> None:
    """An asynchronous call's result arrives while the caller speaks (Pipecat holds its
    push back until the turn ends) and what they said is a false start: the false start
    is not committed, but the result is recorded and the inference Pipecat owes it runs,
    so the model is told the result (before, no inference ran and it was never said).
    ``moved_on``: the caller spoke after the call, so the result is Pipecat's deferred
    final-result message; else Pipecat settles it in place, as the call's result."""

    async def main() -> None:
        model = ScriptedLLM([[Call("c1", "find_bag", {"tag": "X1"})], ["Still."], ["Gate 4."]])
        release = _async_find_bag(model)
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            call = FakeCall(manager, model, false_start=lambda text: text == "Um.")
            histories: list[list[tuple[str, str]]] = []

            def held() -> list[Any]:
                return [_native(m).get("content") for m in call.pair.context.get_messages()]

            async def script() -> None:
                await call.say("Where is my bag?")
                await call.replies(1)
                if moved_on:
                    await call.say("Well?")
                    await call.replies(2)
                await call.worker.queue_frame(ProposedUserStartedSpeakingFrame())
                await call.worker.queue_frame(TranscriptionFrame("Um.", "caller", "t"))
                await call.until(lambda: call.pair.assistant()._user_speaking)
                release.set()
                await call.until(lambda: (FINAL if moved_on else '"Gate 4 (X1)"') in held())
                await call.worker.queue_frame(ProposedUserStoppedSpeakingFrame())
                await call.replies(2 + moved_on)
                histories.append(_history(manager, "call-1"))
                await call.end()

            await run_calls([call], script)
            if moved_on:
                assert histories == [
                    [
                        ("user", "Where is my bag?"),
                        ("call", 'c1 find_bag {"tag": "X1"}'),
                        ("result", f"c1 {STARTED}"),
                        ("user", "Well?"),
                        ("assistant", "Still."),
                        ("user", FINAL),
                        ("assistant", "Gate 4."),
                    ]
                ]
                assert len(model.seen) == 3
                assert model.seen[2][-2:] == [
                    {"role": "assistant", "content": "Still."},
                    {"role": "user", "content": FINAL},
                ]
            else:
                assert histories == [
                    [
                        ("user", "Where is my bag?"),
                        ("call", 'c1 find_bag {"tag": "X1"}'),
                        ("result", 'c1 "Gate 4 (X1)"'),
                        ("assistant", "Still."),
                    ]
                ]
                assert len(model.seen) == 2
                assert model.seen[1][1:] == [
                    {"role": "user", "content": "Where is my bag?"},
                    {"role": "assistant", "content": None, "tool_calls": [CALL]},
                    {"role": "tool", "tool_call_id": "c1", "content": '"Gate 4 (X1)"'},
                ]

    asyncio.run(main())


@pytest.mark.parametrize("synced", [False, True])
def test_a_greetings_async_result_with_a_false_start_still_runs_its_inference(
    synced: bool,
) -> None:
    """The greeting starts an asynchronous call whose result comes while the caller
    speaks, before the first user turn (Pipecat settles it in place, its push held back
    until the turn ends), and what they said is a false start: the inference Pipecat
    owes the result still runs, on the greeting with the result (``synced``: a host's
    ``LLMRunFrame`` had sent the placeholder first), and the first turn opens with it."""

    async def main() -> None:
        model = ScriptedLLM(
            [["Welcome. ", Call("c1", "find_bag", {"tag": "X1"})], ["R2"], ["R3"], ["R4"]]
        )
        release = _async_find_bag(model)
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            call = FakeCall(manager, model, false_start=lambda text: text == "Um.")
            histories: list[list[tuple[str, str]]] = []

            def held() -> list[Any]:
                return [_native(m).get("content") for m in call.pair.context.get_messages()]

            async def script() -> None:
                await call.worker.queue_frame(LLMRunFrame())
                await call.replies(1)
                if synced:
                    await call.worker.queue_frame(LLMRunFrame())
                    await call.replies(2)
                await call.worker.queue_frame(ProposedUserStartedSpeakingFrame())
                await call.worker.queue_frame(TranscriptionFrame("Um.", "caller", "t"))
                await call.until(lambda: call.pair.assistant()._user_speaking)
                release.set()
                await call.until(lambda: '"Gate 4 (X1)"' in held())
                await call.worker.queue_frame(ProposedUserStoppedSpeakingFrame())
                await call.replies(2 + synced)
                await call.say("Hello?")
                await call.replies(3 + synced)
                histories.append(_history(manager, "call-1"))
                await call.end()

            await run_calls([call], script)
            replies = [("assistant", "R2"), ("assistant", "R3")][: 1 + synced]
            assert histories == [
                [
                    ("assistant", "Welcome."),
                    ("call", 'c1 find_bag {"tag": "X1"}'),
                    ("result", 'c1 "Gate 4 (X1)"'),
                    *replies,
                    ("user", "Hello?"),
                    ("assistant", "R4" if synced else "R3"),
                ]
            ]
            assert len(model.seen) == 3 + synced
            assert [m.get("content") for m in model.seen[1 + synced][1:]] == [
                "Welcome.",
                None,
                '"Gate 4 (X1)"',
                *(["R2"] if synced else []),
            ]

    asyncio.run(main())


def test_a_greetings_async_result_after_the_only_turn_was_retracted_is_recorded_once() -> None:
    """The greeting starts an asynchronous call; the first turn is retracted while the
    call runs; its result then comes. Pipecat settles it over the greeting's placeholder
    (the greeting is its context again) and the next turn opens with the call's result,
    recorded once, as the model saw it (before, Pipecat's final-result message was
    recorded too, which the model never saw)."""

    async def main() -> None:
        model = ScriptedLLM(
            [
                ["Welcome. ", Call("c1", "find_bag", {"tag": "X1"})],
                ["Sorry, ", "what ", "was ", "that?"],
                ["Gate 4."],
                ["Hi."],
            ],
            chunk_seconds=0.02,
        )
        release = _async_find_bag(model)
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            call = FakeCall(manager, model)
            histories: list[list[tuple[str, str]]] = []

            async def script() -> None:
                await call.worker.queue_frame(LLMRunFrame())
                await call.replies(1)
                await call.say("Um.")
                await call.until(lambda: len(model.seen) == 2)
                call.pair.retract_turn()
                await call.replies(2)
                release.set()
                await call.replies(3)
                await call.say("Hello?")
                await call.replies(4)
                histories.append(_history(manager, "call-1"))
                await call.end()

            await run_calls([call], script)
            assert histories == [
                [
                    ("assistant", "Welcome."),
                    ("call", 'c1 find_bag {"tag": "X1"}'),
                    ("result", 'c1 "Gate 4 (X1)"'),
                    ("assistant", "Sorry, what was that?"),
                    ("assistant", "Gate 4."),
                    ("user", "Hello?"),
                    ("assistant", "Hi."),
                ]
            ]
            assert [m.get("content") for m in model.seen[3][1:]] == [
                "Welcome.",
                None,
                '"Gate 4 (X1)"',
                "Sorry, what was that?",
                "Gate 4.",
                "Hello?",
            ]

    asyncio.run(main())


def test_a_false_start_commits_no_turn_and_runs_no_inference() -> None:
    async def main() -> None:
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            call = FakeCall(manager, _script(), false_start=lambda text: text.strip() in {"uh"})
            histories: list[list[tuple[str, str]]] = []

            async def script() -> None:
                await call.say("Where is my bag?")
                await call.replies(2)
                await call.say("uh")
                await asyncio.sleep(0.2)
                histories.append(_history(manager, "call-1"))
                await call.say("Thanks.")
                await call.replies(3)
                histories.append(_history(manager, "call-1"))
                await call.end()

            await run_calls([call], script)
            assert histories == [HISTORY[:4], HISTORY]
            assert len(call.llm.seen) == 3  # nothing ran for "uh"
            assert call.llm.seen[2] == [SYSTEM, *CHAT[:5]]

    asyncio.run(main())


def test_a_hang_up_while_the_model_streams_removes_the_context() -> None:
    """CancelFrame (the caller hung up) while the LLM streams: the context is gone,
    nothing is recorded late, and the pair's close stays idempotent."""

    async def main() -> None:
        model = ScriptedLLM(
            [["A ", "long ", "answer ", "that ", "never ", "ends."]], chunk_seconds=0.2
        )
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            call = FakeCall(manager, model)

            async def script() -> None:
                await call.say("Tell me everything.")
                await call.until(lambda: model.streaming.is_set())
                await call.worker.cancel()

            await run_calls([call], script)
            assert manager.context_ids() == ()
            call.pair.close()  # idempotent
            stats = manager.statistics()
            assert (stats.history.turns, stats.invocations) == (0, 0)
            assert len(model.seen) == 1

    asyncio.run(main())


async def _close_foundation_first(
    model: ScriptedLLM, after_close: Any, errors: list[str]
) -> tuple[ContextManager, FakeCall[ScriptedLLM]]:
    """One turn, then the host's ``async with Foundation`` exits while the pipeline still
    runs; then ``after_close(call)`` and the pipeline's ``EndFrame``. ``errors`` gets every
    message Pipecat logs at ERROR (a processor's cleanup that raised, a handler's exception)."""
    from loguru import logger
    from pipecat.workers.runner import WorkerRunner

    sink = logger.add(lambda message: errors.append(str(message)), level="ERROR")
    runner = WorkerRunner(handle_sigint=False)
    try:
        async with Foundation(gateway="openai_chat") as foundation:
            call = FakeCall(foundation.manager, model)
            await runner.add_workers(call.worker)
            running = asyncio.ensure_future(runner.run())
            await call.started.wait()
            await call.say("Where is my bag?")
            await call.replies(1)
        await after_close(call)
        await call.end()
        async with asyncio.timeout(10):
            await running
    finally:
        logger.remove(sink)
    return foundation.manager, call


# The history when the Foundation closed, and the record of the pipeline's end after it.
_AT_CLOSE = [("user", "Where is my bag?"), ("assistant", "It is at gate 4.")]
_NOT_REMOVED = (
    "INFO",
    "Context 'call-1' was not removed at the pipeline's end: the Foundation closed first; "
    "it stays as the Foundation left it (in its store, if it has one).",
)


def test_the_pipelines_end_after_the_foundation_closed_raises_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Invariant: a host that closes the Foundation before the pipeline's ``EndFrame`` is
    processed (either teardown order is real) gets no exception from the pair's cleanup:
    Pipecat logs no error, the pair's close stays idempotent, history is as it was at the
    close, and one INFO record says the context was not removed.

    Mutant tried: ``close`` without its ``FoundationClosedError`` handling (as before):
    Pipecat logs "Error cleaning up TurnloomAssistantAggregator#...: The Foundation is
    closed; ...", and ``pair.close()`` raises."""

    async def nothing(call: FakeCall[ScriptedLLM]) -> None:
        pass

    async def main() -> None:
        errors: list[str] = []
        with caplog.at_level(logging.INFO, logger="turnloom.integrations.pipecat"):
            manager, call = await _close_foundation_first(
                ScriptedLLM([["It is at gate 4."]]), nothing, errors
            )
            call.pair.close()  # idempotent, raises nothing
        assert errors == []
        assert _history(manager, "call-1") == _AT_CLOSE
        assert [(r.levelname, r.getMessage()) for r in caplog.records] == [_NOT_REMOVED]
        assert call.pair.turn_id is None

    asyncio.run(main())


def test_a_user_turn_flushed_after_the_foundation_closed_runs_nothing_and_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Invariant: what the pipeline pushes after the Foundation closed (here the caller's
    words still held when ``EndFrame`` arrives: Pipecat's user aggregator flushes them as a
    turn on the way out) is not taken and runs no inference; one warning says so, Pipecat
    logs no error, and history is as it was at the close.

    Mutant tried: ``sync`` without its closed-Foundation path (as before): Pipecat logs the
    ``FoundationClosedError`` raised by ``accept_turn`` as an error of its own."""

    async def speak_on(call: FakeCall[ScriptedLLM]) -> None:
        await call.worker.queue_frame(ProposedUserStartedSpeakingFrame())
        await call.worker.queue_frame(TranscriptionFrame("Still there?", "caller", "now"))

    async def main() -> None:
        errors: list[str] = []
        model = ScriptedLLM([["It is at gate 4."]])
        with caplog.at_level(logging.INFO, logger="turnloom.integrations.pipecat"):
            manager, _ = await _close_foundation_first(model, speak_on, errors)
        assert errors == []
        assert len(model.seen) == 1
        assert _history(manager, "call-1") == _AT_CLOSE
        assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
            (
                "WARNING",
                "Context 'call-1': the Foundation closed before the Pipecat pipeline ended; "
                "what the pipeline wrote since the last inference is not taken into turnloom, "
                "and no inference runs.",
            ),
            _NOT_REMOVED,
        ]

    asyncio.run(main())


def test_pipecats_own_context_stays_bounded_by_turnlooms_limits() -> None:
    async def main() -> None:
        limits = HistoryLimits(max_turns=4)
        async with Foundation(gateway="openai_chat", history_limits=limits) as foundation:
            manager = foundation.manager
            call = FakeCall(manager, ScriptedLLM([]))
            sizes: list[int] = []

            async def script() -> None:
                for n in range(40):
                    await call.say(f"Question {n}.")
                    await call.replies(n + 1)
                    sizes.append(len(call.pair.context.get_messages()))
                await call.end()

            await run_calls([call], script)
            # 4 turns of (user, reply): 8 messages at most, whatever the call's length (the
            # instructions are the LLM service's system_instruction, not a message).
            assert max(sizes) == 8
            assert sizes[-1] == 8
            assert call.llm.seen[-1][-1] == {"role": "user", "content": "Question 39."}
            assert len(call.llm.seen[-1]) == 8  # system + 3 earlier turns + the question

    asyncio.run(main())


def test_fifty_concurrent_calls_each_keep_their_own_exact_history() -> None:
    async def main() -> None:
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            calls = [FakeCall(manager, _script(), context_id=f"call-{n}") for n in range(50)]
            histories: dict[str, list[tuple[str, str]]] = {}

            async def script() -> None:
                async def one(call: FakeCall[ScriptedLLM]) -> None:
                    await _two_turns(call)
                    histories[call.pair.context_id] = _history(manager, call.pair.context_id)
                    await call.end()

                await asyncio.gather(*(one(call) for call in calls))

            await run_calls(calls, script)
            assert histories == {f"call-{n}": HISTORY for n in range(50)}
            assert all(call.llm.seen[2] == [SYSTEM, *CHAT[:5]] for call in calls)
            assert manager.context_ids() == ()

    asyncio.run(main())


def test_the_instructions_reach_the_llm_service_and_never_pipecats_context() -> None:
    """Invariant: no system message is ever written to Pipecat's LLMContext; turnloom's
    pinned instructions are the LLM service's system_instruction at every inference
    (handed once, by an LLMUpdateSettingsFrame before the host's greeting, the first
    inference, and unchanged after), and Pipecat warns of no deprecation. What the bot
    said before the caller spoke (the host's greeting) opens the first turn's input:
    turnloom's history and every later inference hold it.

    Mutants tried: the leading system items kept in the context (``_split_instructions``
    returning every item): the contexts hold the system message and Pipecat's
    DeprecationWarning is caught; ``send_instruction`` sending nothing: the service's
    instruction stays None; its "changed since sent" check removed: four updates; the
    greeting not taken into the first turn's input (as before): it is missing from the
    history and from every later context.
    """

    async def main() -> None:
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            call = FakeCall(manager, _script("Hello."))
            pair_contexts: list[list[Any]] = []

            async def script() -> None:
                # The host's greeting before the caller speaks (no turn yet).
                await call.worker.queue_frame(LLMRunFrame())
                await call.replies(1)
                await call.say("Where is my bag?")
                await call.replies(3)
                pair_contexts.append(list(call.pair.context.get_messages()))
                await call.say("Thanks.")
                await call.replies(4)
                pair_contexts.append(list(call.pair.context.get_messages()))
                histories.append(_history(manager, "call-1"))
                await call.end()

            histories: list[list[tuple[str, str]]] = []
            deprecation._warned_sites.clear()  # Pipecat warns once per site and process
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                await run_calls([call], script)
            model = call.llm
            # The greeting ran on Pipecat's empty context; its reply opens the first
            # turn's input, so every later inference reads it before the caller.
            greeting = {"role": "assistant", "content": "Hello."}
            assert model.contexts[0] == []
            assert model.contexts == [
                [],
                [greeting, *CHAT[:1]],
                [greeting, *CHAT[:3]],
                [greeting, *CHAT[:5]],
            ]
            assert pair_contexts == [[greeting, *CHAT[:4]], [greeting, *CHAT]]
            assert histories == [[("assistant", "Hello."), *HISTORY]]
            assert model.instructions == ["Be brief."] * 4
            assert model.updates == [("Be brief.", FrameDirection.DOWNSTREAM)]
            assert model.seen[1:] == [
                [SYSTEM, greeting, *CHAT[:1]],
                [SYSTEM, greeting, *CHAT[:3]],
                [SYSTEM, greeting, *CHAT[:5]],
            ]
            assert [str(w.message) for w in caught if w.category is DeprecationWarning] == []

    asyncio.run(main())


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_real_pipecat_services_send_turnlooms_instructions_over_their_own(provider: str) -> None:
    """Pipecat's own OpenAILLMService and AnthropicLLMService (their SDK clients over a fake
    HTTP transport), built with a system_instruction of the host's as Pipecat's docs say and
    with one appended by a Pipecat component: every request holds turnloom's instructions,
    once, in the provider's system place, followed by Pipecat's appended one; the host's is
    replaced; the messages are exactly turnloom's history.

    Invariant: the instructions turnloom pins are the ones the model reads, whatever the
    service held; Pipecat's composition of its own additions is kept.
    Mutant tried: ``send_instruction`` sending nothing: the host's prompt is sent instead.
    """

    async def main() -> None:
        make = openai_service if provider == "openai" else anthropic_service
        llm, server = make(["Gate 4.", "Bye."], system_instruction="You are a host prompt.")
        llm.append_system_instruction("Use short sentences.")
        async with Foundation(gateway="openai_chat") as foundation:
            call = FakeCall(foundation.manager, llm)

            async def script() -> None:
                await call.say("Where is my bag?")
                await call.replies(1)
                await call.say("Thanks.")
                await call.replies(2)
                await call.end()

            deprecation._warned_sites.clear()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                await run_calls([call], script)
        system = "Be brief.\n\nUse short sentences."
        turns = [
            {"role": "user", "content": "Where is my bag?"},
            {"role": "assistant", "content": "Gate 4."},
            {"role": "user", "content": "Thanks."},
        ]
        if provider == "openai":
            sent = [body["messages"] for body in server.bodies]
            assert sent == [
                [{"role": "system", "content": system}, turns[0]],
                [{"role": "system", "content": system}, *turns],
            ]
        else:
            sent = [(body["system"], body["messages"]) for body in server.bodies]
            assert sent == [(system, turns[:1]), (system, turns)]
        assert [str(w.message) for w in caught if w.category is DeprecationWarning] == []

    asyncio.run(main())


def test_a_wrong_gateway_is_an_invalid_argument() -> None:
    async def main() -> None:
        async with Foundation(gateway="anthropic") as foundation:
            with pytest.raises(InvalidArgumentError) as caught:
                TurnloomContextAggregatorPair(
                    manager=foundation.manager, context_id="c", instructions="Be brief."
                )
            assert caught.value.field == "manager"

    asyncio.run(main())


def test_a_message_pipecat_appends_while_turnloom_prepares_is_kept_and_recorded() -> None:
    """Pipecat appends to its context from another task (its empty-turn recovery, a
    stop strategy's timer) while turnloom prepares the new turn's input: the message
    stays in Pipecat's context after turnloom's input, the next push records it to the
    current turn and the inference reads it. Invariant: nothing Pipecat hands in
    vanishes (writing turnloom's input over the context once the preparation ends
    dropped it)."""

    async def main() -> None:
        model = ScriptedLLM([["Hello."], ["Say that again?"]])
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            call = FakeCall(manager, model)
            user = call.pair.user()
            entered, release = asyncio.Event(), asyncio.Event()
            prepare = manager.prepare

            async def held_prepare(request: ContextPrepareRequest) -> Any:
                entered.set()
                await release.wait()
                return await prepare(request)

            manager.prepare = held_prepare  # type: ignore[method-assign]
            pushes: list[asyncio.Task[None]] = []

            async def script() -> None:
                await call.say("Hi.")
                await entered.wait()  # "Hi." is committed; its input is being prepared
                user.context.add_message({"role": "developer", "content": IDLE})
                pushes.append(asyncio.create_task(user.push_context_frame()))
                await asyncio.sleep(0.05)  # the push waits for the sync in flight
                release.set()
                await call.replies(2)
                await asyncio.gather(*pushes)
                histories.append(_history(manager, "call-1"))
                await call.end()

            histories: list[list[tuple[str, str]]] = []
            await run_calls([call], script)
            assert histories[0] == [
                ("user", "Hi."),
                ("user", IDLE),
                ("assistant", "Hello."),
                ("assistant", "Say that again?"),
            ]
            assert model.seen[1] == [
                SYSTEM,
                {"role": "user", "content": "Hi."},
                {"role": "user", "content": IDLE},
            ]

    asyncio.run(main())

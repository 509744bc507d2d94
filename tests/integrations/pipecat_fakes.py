"""Stand-ins for a Pipecat pipeline's LLM and TTS services: scripted, offline.

``ScriptedLLM`` is a real Pipecat ``LLMService`` that streams scripted replies
as ``LLMTextFrame``\\ s (and runs scripted function calls through the service's
own ``run_function_calls``), recording each context it was sent (Pipecat's
``LLMContext`` messages), its ``system_instruction`` then, and the request
Pipecat's OpenAI and Anthropic adapters make of both, as Pipecat's OpenAI and
Anthropic services send them. ``SpeakingTTS``
turns each ``LLMTextFrame`` into a ``TTSTextFrame`` after ``word_seconds``, as
an output transport releases words while their audio plays, so an
interruption (Pipecat's ``InterruptionFrame`` clears its queue) leaves only
the words played before it.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import httpx2
from anthropic import AsyncAnthropic
from loguru import logger
from openai import AsyncOpenAI
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.adapters.llm.services.anthropic_adapter import AnthropicLLMAdapter
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    EndFrame,
    Frame,
    FunctionCallFromLLM,
    InterruptionFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    LLMUpdateSettingsFrame,
    ProposedUserStartedSpeakingFrame,
    ProposedUserStoppedSpeakingFrame,
    TranscriptionFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_response_universal import (
    AssistantTurnStoppedMessage,
    LLMUserAggregatorParams,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams, LLMService
from pipecat.services.settings import LLMSettings
from pipecat.turns.user_start import ExternalUserTurnStartStrategy
from pipecat.turns.user_stop import ExternalUserTurnStopStrategy
from pipecat.turns.user_turn_strategies import UserTurnStrategies
from pipecat.utils.time import time_now_iso8601
from pipecat.workers.runner import WorkerRunner

from turnloom.integrations.pipecat import TurnloomContextAggregatorPair
from turnloom.runtime import ContextManager

# Pipecat logs every frame at DEBUG through loguru: keep warnings and errors only.
logger.remove()
logger.add(sys.stderr, level="WARNING")


@dataclass(frozen=True)
class Call:
    """A function call the scripted model makes."""

    call_id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Wait:
    """The scripted model waits for ``event`` before it streams the rest of its reply."""

    event: asyncio.Event


Reply = Sequence[str | Call | Wait]


class ScriptedLLM(LLMService):  # type: ignore[misc]
    """Streams one scripted reply per context it is sent; ``["OK."]`` once the script ends."""

    def __init__(self, replies: Sequence[Reply], *, chunk_seconds: float = 0.0) -> None:
        super().__init__(
            settings=LLMSettings(
                model="scripted",
                system_instruction=None,
                temperature=None,
                max_tokens=None,
                top_p=None,
                top_k=None,
                frequency_penalty=None,
                presence_penalty=None,
                seed=None,
                filter_incomplete_user_turns=None,
                user_turn_completion_config=None,
            )
        )
        self.replies = list(replies)
        self.chunk_seconds = chunk_seconds
        self.contexts: list[list[dict[str, Any]]] = []  # each LLMContext's messages
        self.instructions: list[str | None] = []  # the service's system_instruction then
        self.seen: list[list[dict[str, Any]]] = []  # each input as Pipecat sends it to OpenAI
        self.anthropic: list[dict[str, Any]] = []  # each input as Pipecat sends it to Anthropic
        self.streaming = asyncio.Event()  # set once a reply's first chunk went out
        # The system_instruction of each LLMUpdateSettingsFrame that reached it, and its direction.
        self.updates: list[tuple[str | None, FrameDirection]] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        if isinstance(frame, LLMUpdateSettingsFrame) and frame.delta is not None:
            self.updates.append((cast(str | None, frame.delta.system_instruction), direction))
        await super().process_frame(frame, direction)
        if not isinstance(frame, LLMContextFrame):
            await self.push_frame(frame, direction)
            return
        context = frame.context
        self.contexts.append(copy.deepcopy(cast(list[dict[str, Any]], context.get_messages())))
        # The service's composed system_instruction, read as OpenAILLMService and
        # AnthropicLLMService read it for each inference.
        given = self._settings.system_instruction
        system = given if isinstance(given, str) else None
        self.instructions.append(system)
        chat = await self.get_llm_adapter().get_llm_invocation_params(
            context, system_instruction=system, convert_developer_to_user=False
        )
        self.seen.append(json.loads(json.dumps(chat["messages"])))
        adapter = AnthropicLLMAdapter()  # type: ignore[no-untyped-call]
        params = await adapter.get_llm_invocation_params(
            context, system_instruction=system, enable_prompt_caching=False
        )
        self.anthropic.append(
            json.loads(json.dumps({"system": params["system"], "messages": params["messages"]}))
        )
        reply = self.replies.pop(0) if self.replies else ["OK."]
        await self.push_frame(LLMFullResponseStartFrame())
        calls: list[FunctionCallFromLLM] = []
        for piece in reply:
            if isinstance(piece, Wait):
                await piece.event.wait()
                continue
            if isinstance(piece, Call):
                calls.append(
                    FunctionCallFromLLM(
                        context=context,
                        tool_call_id=piece.call_id,
                        function_name=piece.name,
                        arguments=piece.arguments,
                    )
                )
                continue
            await self.push_frame(LLMTextFrame(piece))
            self.streaming.set()
            if self.chunk_seconds:
                await asyncio.sleep(self.chunk_seconds)
        if calls:
            await self.run_function_calls(calls)
        await self.push_frame(LLMFullResponseEndFrame())


class SpeakingTTS(FrameProcessor):  # type: ignore[misc]
    """Speaks each ``LLMTextFrame`` for ``word_seconds``, then reports it as a ``TTSTextFrame``."""

    def __init__(self, *, word_seconds: float = 0.0) -> None:
        super().__init__()
        self.word_seconds = word_seconds
        self._speaking = False
        self.played: list[str] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMTextFrame):
            if not self._speaking:
                self._speaking = True
                await self.push_frame(BotStartedSpeakingFrame())
            if self.word_seconds:
                await asyncio.sleep(self.word_seconds)  # its audio plays
            spoken = TTSTextFrame(frame.text, text_type="word")
            spoken.includes_inter_frame_spaces = True
            self.played.append(frame.text)
            await self.push_frame(spoken)
            return
        if isinstance(frame, (LLMFullResponseEndFrame, InterruptionFrame)) and self._speaking:
            self._speaking = False
            await self.push_frame(frame, direction)
            await self.push_frame(BotStoppedSpeakingFrame())
            return
        await self.push_frame(frame, direction)


def turn_strategies(*, interruptions: bool = True) -> UserTurnStrategies:
    """Turns announced by the test as an external turn detector would (no VAD, no model).

    ``ProposedUserStartedSpeakingFrame`` makes Pipecat's user aggregator start
    the turn and broadcast an ``InterruptionFrame`` (a barge-in when the bot
    speaks); ``ProposedUserStoppedSpeakingFrame`` ends it once its transcript came.
    ``interruptions=False``: no ``InterruptionFrame`` (a function call in progress
    is not cancelled when the caller speaks).
    """
    return UserTurnStrategies(
        start=[ExternalUserTurnStartStrategy(enable_interruptions=interruptions)],
        stop=[ExternalUserTurnStopStrategy(timeout=0.02)],
    )


LLM = TypeVar("LLM", bound=LLMService)


class FakeCall(Generic[LLM]):
    """One call's pipeline: the pair's user aggregator, the LLM, the TTS, the assistant one."""

    def __init__(
        self,
        manager: ContextManager,
        llm: LLM,
        *,
        context_id: str = "call-1",
        word_seconds: float = 0.0,
        false_start: Callable[[str], bool] | None = None,
        interruptions: bool = True,
    ) -> None:
        self.llm = llm
        self.pair = TurnloomContextAggregatorPair(
            manager=manager,
            context_id=context_id,
            instructions="Be brief.",
            tools=TOOLS,
            false_start=false_start,
            # No empty-turn recovery: under load the caller's stop frame can land
            # after the stop strategy's timeout ended the turn, which starts an
            # empty one that Pipecat would answer with an extra inference.
            user_params=LLMUserAggregatorParams(
                user_turn_strategies=turn_strategies(interruptions=interruptions),
                empty_user_turn=None,
            ),
        )
        self.tts = SpeakingTTS(word_seconds=word_seconds)
        pipeline = Pipeline([self.pair.user(), llm, self.tts, self.pair.assistant()])
        self.worker = PipelineWorker(pipeline, cancel_on_idle_timeout=False)
        self.started = asyncio.Event()
        self.stopped: list[AssistantTurnStoppedMessage] = []

        @self.worker.event_handler("on_pipeline_started")  # type: ignore[misc]
        async def _started(worker: Any, frame: Any) -> None:
            self.started.set()

        @self.pair.assistant().event_handler("on_assistant_turn_stopped")  # type: ignore[misc]
        async def _stopped(aggregator: Any, message: AssistantTurnStoppedMessage) -> None:
            self.stopped.append(message)

    async def say(self, text: str, *, replies_before_stop: int = 0) -> None:
        """The caller speaks ``text`` (an external turn detector's frames and a final transcript).

        ``replies_before_stop``: the caller is still speaking until that many
        assistant turns ended (a barge-in: the cut reply ends while they talk).
        """
        await self.worker.queue_frame(ProposedUserStartedSpeakingFrame())
        await self.worker.queue_frame(TranscriptionFrame(text, "caller", time_now_iso8601()))
        await self.replies(replies_before_stop)
        await self.worker.queue_frame(ProposedUserStoppedSpeakingFrame())

    async def until(self, condition: Callable[[], bool], seconds: float = 10.0) -> None:
        """Wait (polling the event loop) until ``condition()`` holds."""
        async with asyncio.timeout(seconds):
            while not condition():
                await asyncio.sleep(0.005)

    async def replies(self, count: int) -> None:
        """Wait until ``count`` assistant turns ended (played to the end, or cut)."""
        await self.until(lambda: len(self.stopped) >= count)

    async def end(self) -> None:
        """The host ends the call normally (``EndFrame``)."""
        await self.worker.queue_frame(EndFrame())


async def run_calls(calls: Sequence[FakeCall[Any]], script: Callable[[], Awaitable[None]]) -> None:
    """Run the calls' pipelines in one ``WorkerRunner`` while ``script`` drives them.

    A script that fails (a wait timed out) cancels the pipelines, so the test fails
    instead of hanging on a runner that never ends.
    """
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(*(call.worker for call in calls))

    async def drive() -> None:
        try:
            for call in calls:
                await call.started.wait()
            await script()
        except BaseException:
            for call in calls:
                await call.worker.cancel()
            raise

    await asyncio.gather(runner.run(), drive())


async def find_bag(params: FunctionCallParams) -> None:
    """The bag lookup the scripted model calls (Pipecat's function-call handler)."""
    await params.result_callback(f"Gate 4 ({params.arguments['tag']})")


TOOLS = ToolsSchema(
    standard_tools=[
        FunctionSchema(
            name="find_bag",
            description="Find a bag by its tag.",
            properties={"tag": {"type": "string"}},
            required=["tag"],
        )
    ]
)


class _Replies:
    """An httpx2 (the SDKs' HTTP client) handler: records each body, answers the next reply."""

    def __init__(self, replies: Sequence[str], stream: Callable[[str], bytes]) -> None:
        self.replies = list(replies)
        self.stream = stream
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: Any) -> Any:
        self.bodies.append(json.loads(request.content))
        text = self.replies.pop(0) if self.replies else "OK."
        headers = {"content-type": "text/event-stream"}
        return httpx2.Response(200, headers=headers, content=self.stream(text))


def _sse(events: Sequence[tuple[str | None, dict[str, Any]]]) -> bytes:
    lines = []
    for event, data in events:
        lines.append((f"event: {event}\n" if event else "") + f"data: {json.dumps(data)}\n\n")
    return "".join(lines).encode()


def _openai_stream(text: str) -> bytes:
    """One streamed Chat Completions answer of ``text`` (OpenAI's SSE chunks)."""
    chunk = {"id": "r1", "object": "chat.completion.chunk", "created": 0, "model": "gpt-4.1"}
    return (
        _sse(
            [
                (
                    None,
                    {
                        **chunk,
                        "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}],
                    },
                ),
                (None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            ]
        )
        + b"data: [DONE]\n\n"
    )


def _anthropic_stream(text: str) -> bytes:
    """One streamed Messages answer of ``text`` (Anthropic's SSE events)."""
    message: dict[str, Any] = {
        "id": "m1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
    block = {"type": "text", "text": ""}
    delta = {"type": "text_delta", "text": text}
    stop = {"stop_reason": "end_turn", "stop_sequence": None}
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": block},
        {"type": "content_block_delta", "index": 0, "delta": delta},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": stop, "usage": {"output_tokens": 1}},
        {"type": "message_stop"},
    ]
    return _sse([(event["type"], event) for event in events])


def openai_service(
    replies: Sequence[str], *, system_instruction: str | None
) -> tuple[Any, _Replies]:
    """Pipecat's real ``OpenAILLMService`` (its own ``AsyncOpenAI`` client) over a fake transport.

    Returns the service and the handler holding each request body it sent.
    """
    from pipecat.services.openai.llm import OpenAILLMService

    handler = _Replies(replies, _openai_stream)

    class Service(OpenAILLMService):  # type: ignore[misc]
        def create_client(self, *args: Any, **kwargs: Any) -> Any:
            transport = httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
            return AsyncOpenAI(
                api_key="test", base_url="http://model.test/v1", http_client=transport
            )

    settings = OpenAILLMService.Settings(model="gpt-4.1", system_instruction=system_instruction)
    return Service(api_key="test", settings=settings), handler


def anthropic_service(
    replies: Sequence[str], *, system_instruction: str | None
) -> tuple[Any, _Replies]:
    """Pipecat's real ``AnthropicLLMService`` with its ``AsyncAnthropic`` over a fake transport
    (httpx2: the Anthropic SDK's HTTP client)."""
    from pipecat.services.anthropic.llm import AnthropicLLMService

    handler = _Replies(replies, _anthropic_stream)
    client = AsyncAnthropic(
        api_key="test",
        base_url="http://model.test",
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)),
    )
    settings = AnthropicLLMService.Settings(
        model="claude-sonnet-4-5", system_instruction=system_instruction
    )
    return AnthropicLLMService(api_key="test", client=client, settings=settings), handler

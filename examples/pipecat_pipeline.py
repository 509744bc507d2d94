"""A Pipecat pipeline whose LLM context is turnloom's (offline, scripted LLM and TTS).

Run: ``python examples/pipecat_pipeline.py`` (needs ``pip install 'turnloom[pipecat]'``).
The LLM is a stand-in ``LLMService`` streaming scripted replies, the TTS a
stand-in that releases each word as it "plays", and the caller is a stand-in
turn detector pushing Pipecat's own frames (turn start, transcript, turn
end), so nothing touches the network or audio. Pipecat runs on asyncio only.

The pair's ``instructions`` never enter Pipecat's ``LLMContext`` (a system
message there is deprecated since Pipecat 1.9): the pair hands them to the LLM
service as its ``system_instruction`` (an ``LLMUpdateSettingsFrame`` before the
first inference), so build the service without one of its own.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from loguru import logger
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (
    Frame,
    FunctionCallFromLLM,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    ProposedUserStartedSpeakingFrame,
    ProposedUserStoppedSpeakingFrame,
    TranscriptionFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_response_universal import LLMUserAggregatorParams
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams, LLMService
from pipecat.services.settings import LLMSettings
from pipecat.turns.user_start import ExternalUserTurnStartStrategy
from pipecat.turns.user_stop import ExternalUserTurnStopStrategy
from pipecat.turns.user_turn_strategies import UserTurnStrategies
from pipecat.utils.time import time_now_iso8601
from pipecat.workers.runner import WorkerRunner

from turnloom.integrations.pipecat import TurnloomContextAggregatorPair
from turnloom.runtime import ContextManager, Foundation

logger.remove()  # Pipecat logs every frame; keep its warnings only
logger.add(sys.stderr, level="WARNING")

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
# Turns come from a turn detector outside the aggregator (here: the stand-in caller).
# No empty-turn recovery: on a loaded machine the stop strategy's 20 ms timer can end
# a turn as its stop frame arrives, and Pipecat would answer the empty turn this
# starts with a prompt and an extra inference (the printed output would vary).
PARAMS = LLMUserAggregatorParams(
    user_turn_strategies=UserTurnStrategies(
        start=[ExternalUserTurnStartStrategy()], stop=[ExternalUserTurnStopStrategy(timeout=0.02)]
    ),
    empty_user_turn=None,
)


class ScriptedLLM(LLMService):
    """Stands in for the LLM: asks for the tool, answers, then starts a long reply."""

    def __init__(self) -> None:
        none: dict[str, Any] = dict.fromkeys(
            ("system_instruction", "temperature", "max_tokens", "top_p", "top_k"), None
        )
        none |= dict.fromkeys(("frequency_penalty", "presence_penalty", "seed"), None)
        none |= dict.fromkeys(("filter_incomplete_user_turns", "user_turn_completion_config"))
        super().__init__(settings=LLMSettings(model="scripted", **none))
        self.paused = asyncio.Event()
        self.replies: list[list[Any]] = [
            [("c1", "find_bag", {"tag": "X1"})],
            ["Your bag ", "is at ", "gate 4."],
            ["You can ", "also ", None, "ask at the desk."],  # None: the caller cuts in here
        ]

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if not isinstance(frame, LLMContextFrame):
            await self.push_frame(frame, direction)
            return
        roles = [m["role"] for m in frame.context.get_messages()]  # type: ignore[index]
        print("LLM:", self._settings.system_instruction, "+", roles)
        await self.push_frame(LLMFullResponseStartFrame())
        for piece in self.replies.pop(0) if self.replies else ["Goodbye."]:
            if piece is None:
                self.paused.set()
                await asyncio.Event().wait()  # cancelled by Pipecat's interruption
            elif isinstance(piece, tuple):
                call_id, name, arguments = piece
                call = FunctionCallFromLLM(
                    context=frame.context, tool_call_id=call_id, function_name=name,
                    arguments=arguments,
                )  # fmt: skip
                await self.run_function_calls([call])
            else:
                await self.push_frame(LLMTextFrame(piece))
        await self.push_frame(LLMFullResponseEndFrame())


class SpeakingTTS(FrameProcessor):
    """Stands in for TTS and output transport: each word is reported as it plays."""

    def __init__(self) -> None:
        super().__init__()
        self.played: list[str] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMTextFrame):
            spoken = TTSTextFrame(frame.text, text_type="word")
            spoken.includes_inter_frame_spaces = True
            self.played.append(frame.text)
            frame = spoken
        await self.push_frame(frame, direction)


async def say(worker: PipelineWorker, text: str) -> None:
    """The caller speaks: a turn detector's start, the transcript, its end."""
    await worker.queue_frame(ProposedUserStartedSpeakingFrame())
    await worker.queue_frame(TranscriptionFrame(text, "caller", time_now_iso8601()))
    await worker.queue_frame(ProposedUserStoppedSpeakingFrame())


async def until(condition: Any) -> None:
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.005)


def messages(manager: ContextManager, context_id: str) -> list[Any]:
    if context_id not in manager.context_ids():
        return []
    view = manager.history(context_id)
    return [m for turn in view.turn_ids for m in view.turn_messages(turn)]


def show(manager: ContextManager, context_id: str) -> None:
    for message in messages(manager, context_id):
        print(message.role.value, [getattr(p, "text", type(p).__name__) for p in message.content])


async def caller(
    worker: PipelineWorker, llm: ScriptedLLM, tts: SpeakingTTS, manager: ContextManager
) -> None:
    """The call: a tool call, a barge-in that was a false start ("uh"), the caller hangs up."""
    try:
        await say(worker, "Where is my bag?")
        await until(lambda: len(messages(manager, "call-42")) == 4)  # the whole reply played
        await say(worker, "Anything else?")
        await llm.paused.wait()
        await until(lambda: "also " in tts.played)
        await say(worker, "uh")  # speaks over the reply (it is cut), then nothing: a false start
        await asyncio.sleep(0.2)
        show(manager, "call-42")
    finally:
        await worker.cancel()  # the caller hung up


async def run(worker: PipelineWorker, call: Any) -> None:
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await asyncio.gather(runner.run(), call)


# --- host code: tool call, barge-in, false start, hang-up ---
async def find_bag(params: FunctionCallParams) -> None:
    await params.result_callback(f"Gate 4 ({params.arguments['tag']})")


async def main() -> None:
    async with Foundation(gateway="openai_chat") as foundation:
        pair = TurnloomContextAggregatorPair(
            manager=foundation.manager, context_id="call-42", instructions="Be brief.",
            tools=TOOLS, false_start=lambda text: text.strip() in {"", "uh", "hm"},
            user_params=PARAMS,
        )  # fmt: skip
        llm = ScriptedLLM()
        llm.register_function("find_bag", find_bag)
        tts = SpeakingTTS()
        pipeline = Pipeline([pair.user(), llm, tts, pair.assistant()])
        worker = PipelineWorker(pipeline, cancel_on_idle_timeout=False)
        await run(worker, caller(worker, llm, tts, foundation.manager))  # until the hang-up
        print("contexts after hang-up:", foundation.manager.context_ids())


# --- end of host code ---

if __name__ == "__main__":
    asyncio.run(main())

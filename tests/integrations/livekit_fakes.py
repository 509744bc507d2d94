"""A scripted LiveKit LLM (each ``chat`` streams the next scripted reply) and a TTS with a
markup dialect; no network."""

from __future__ import annotations

from typing import Any

from livekit.agents import llm, tts
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, APIConnectOptions

__all__ = ("MarkupTTS", "ScriptedLLM")


class _Stream(llm.LLMStream):
    def __init__(
        self,
        owner: ScriptedLLM,
        script: list[str | llm.FunctionToolCall],
        *,
        chat_ctx: llm.ChatContext,
        tools: list[llm.Tool],
        conn_options: APIConnectOptions,
    ) -> None:
        super().__init__(owner, chat_ctx=chat_ctx, tools=tools, conn_options=conn_options)
        self._script = script

    async def _run(self) -> None:
        for piece in self._script:
            if isinstance(piece, str):
                delta = llm.ChoiceDelta(role="assistant", content=piece)
            else:
                delta = llm.ChoiceDelta(role="assistant", tool_calls=[piece])
            self._event_ch.send_nowait(llm.ChatChunk(id="reply", delta=delta))


class ScriptedLLM(llm.LLM):  # type: ignore[type-arg]
    """Streams scripted replies (text pieces and tool calls); keeps each context it got."""

    def __init__(self, script: list[list[str | llm.FunctionToolCall]]) -> None:
        super().__init__()
        self.script = list(script)
        self.seen: list[llm.ChatContext] = []

    def chat(
        self,
        *,
        chat_ctx: llm.ChatContext,
        tools: list[llm.Tool] | None = None,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
        **kwargs: Any,
    ) -> llm.LLMStream:
        self.seen.append(chat_ctx.copy())
        reply: list[str | llm.FunctionToolCall] = self.script.pop(0) if self.script else ["OK."]
        return _Stream(self, reply, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options)


class MarkupTTS(tts.TTS):  # type: ignore[type-arg]
    """A non-streaming TTS with Cartesia's markup dialect: with ``expressive=True`` LiveKit
    adds its markup guide to each reply's model calls. It never synthesizes (the tests'
    sessions have no audio output)."""

    class Markup(tts.TTS.Markup):
        def _provider_key(self) -> str:
            return "cartesia"

    def __init__(self) -> None:
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=False), sample_rate=24000, num_channels=1
        )

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> tts.ChunkedStream:
        raise NotImplementedError("MarkupTTS never speaks")

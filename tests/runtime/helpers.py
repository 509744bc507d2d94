"""Test helpers for the runtime: message builders and a gateway that can block."""

from __future__ import annotations

import threading

from turnloom.context import (
    GatewayType,
    Message,
    NativeContent,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    get_gateway,
)
from turnloom.context.gateways import OpenAIChatGateway

CHAT = get_gateway(GatewayType.openai_chat)
SYSTEM = Message(role=Role.system, content="You are an airline agent.")


def user(text: str) -> Message:
    return Message(role=Role.user, content=text)


def assistant(text: str) -> Message:
    return Message(role=Role.assistant, content=text)


def call(call_id: str, name: str = "lookup", arguments: str = "{}") -> Message:
    return Message(
        role=Role.assistant,
        content=(ToolCallPart(call_id=call_id, name=name, arguments=arguments),),
    )


def result(call_id: str, text: str = "ok") -> Message:
    return Message(
        role=Role.tool,
        content=(ToolResultPart(call_id=call_id, content=(TextPart(text=text),)),),
    )


class BlockingGateway(OpenAIChatGateway):
    """The OpenAI Chat gateway whose ``render`` can be held in the worker thread.

    While ``hold`` is set, a render signals ``entered`` and waits for
    ``release``; the test thereby cancels a preparation mid-render.
    """

    def __init__(self) -> None:
        self.hold = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self.renders = 0
        self.returned = 0  # renders that finished (none abandoned mid-render)

    def render(self, message: Message) -> list[NativeContent]:
        self.renders += 1
        if self.hold:
            self.entered.set()
            self.release.wait(10)
        try:
            return super().render(message)
        finally:
            self.returned += 1

"""Test helpers for the runtime: message builders and a gateway that can block."""

from __future__ import annotations

import threading
from typing import Any

import anyio

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
from turnloom.context.memory import TenantScope
from turnloom.runtime.assembly import AssembledContext, AssemblyMetadata

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


class GatedStrategy:
    """An assembly strategy whose assembly of a turn waits until the test opens its gate.

    A preparation of a committed turn is admitted (holds its slot, counted in
    ``pending``) and waits on the event loop in its assembly until
    ``open(query)`` (the query is the turn input's text): the way a test
    holds slots now that a prepare waiting for an uncommitted turn holds
    none, freed one at a time. ``entered`` lists the queries whose assembly
    began, in order. It assembles nothing (no system prompt, no memory).
    """

    name = "gated"

    def __init__(self) -> None:
        self.gates: dict[str, anyio.Event] = {}
        self.entered: list[str] = []

    def gate(self, query: str) -> anyio.Event:
        return self.gates.setdefault(query, anyio.Event())

    def open(self, query: str) -> None:
        self.gate(query).set()

    def tool_definitions(self, gateway: Any) -> list[dict[str, Any]]:
        return []

    async def assemble(
        self,
        *,
        query: str,
        scope: TenantScope | None,
        intent_verdict: Any | None,
        auto_hydrate: bool = True,
    ) -> AssembledContext:
        self.entered.append(query)
        await self.gate(query).wait()
        return AssembledContext(
            metadata=AssemblyMetadata(strategy_name=self.name, latency_ms=0.0, entries_count=0),
            tenant=scope,
        )

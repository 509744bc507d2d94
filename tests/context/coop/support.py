"""Shared helpers for the CoopContext tests: gateway parametrization and a scripted area."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from turnloom.context import (
    AreaFlowState,
    AreaLifeState,
    Context,
    GatewayType,
    Message,
    NativeContent,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    get_gateway,
)
from turnloom.errors import InputError


def gateway_or_skip(kind: GatewayType) -> GatewayType:
    """Return ``kind`` when this build has its gateway, else skip the test with the reason."""
    try:
        get_gateway(kind)
    except InputError as exc:
        pytest.skip(f"gateway {kind.value} is not available in this build ({exc})")
    return kind


def user(text: str) -> Message:
    return Message(role=Role.user, content=text)


def assistant(text: str) -> Message:
    return Message(role=Role.assistant, content=text)


def call(call_id: str, name: str = "lookup") -> Message:
    return Message(
        role=Role.assistant, content=(ToolCallPart(call_id=call_id, name=name, arguments="{}"),)
    )


def result(call_id: str, text: str = "ok", name: str = "lookup") -> Message:
    return Message(
        role=Role.tool,
        content=(ToolResultPart(call_id=call_id, name=name, content=(TextPart(text=text),)),),
    )


def native(kind: GatewayType, *messages: Message) -> list[NativeContent]:
    """The native items the gateway renders for ``messages``, in order."""
    gateway = get_gateway(kind)
    return [item for m in messages for item in gateway.render(m)]


def push(context: Context, *messages: Message) -> list[NativeContent]:
    """Push model output (rendered natively) to ``context``; return the pushed items."""
    items = native(context.gateway.type, *messages)
    for item in items:
        context.push_back(item)
    return items


def items(context: Context) -> list[NativeContent]:
    return list(context.snapshot())


class Boom(Exception):
    """The error a ScriptedArea raises on purpose."""


class ScriptedArea:
    """A plain area whose behaviour each test sets; it logs every call to ``log``.

    ``script`` holds the message lists of successive renders (empty once used
    up). ``fail_in`` names a member that raises :class:`Boom`.
    """

    def __init__(
        self,
        name: str,
        log: list[tuple[str, str]] | None = None,
        *,
        script: Sequence[Sequence[Message]] = (),
        flow: AreaFlowState = AreaFlowState.yielded,
        retire_on_render: bool = False,
        retire_on_observe: bool = False,
        promoted: Sequence[Message] = (),
        fail_in: str | None = None,
    ) -> None:
        self.name = name
        self.log = log if log is not None else []
        self.script = [list(s) for s in script]
        self.life = AreaLifeState.retain
        self.flow = flow
        self.retire_on_render = retire_on_render
        self.retire_on_observe = retire_on_observe
        self.promoted = tuple(promoted)
        self.fail_in = fail_in
        self.observed: list[list[NativeContent]] = []
        self.snapshots: list[Sequence[NativeContent]] = []
        self.renders = 0

    def _maybe_fail(self, phase: str) -> None:
        if self.fail_in == phase:
            raise Boom(f"{self.name} fails in {phase}")

    @property
    def life_state(self) -> AreaLifeState:
        self._maybe_fail("life_state")
        return self.life

    @property
    def flow_state(self) -> AreaFlowState:
        self._maybe_fail("flow_state")
        return self.flow

    def observe(self, context: Sequence[NativeContent]) -> None:
        self.log.append((self.name, "observe"))
        self._maybe_fail("observe")
        self.observed.append(list(context))
        self.snapshots.append(context)
        if self.retire_on_observe:
            self.life = AreaLifeState.retired

    def render(self) -> list[Message]:
        self.log.append((self.name, "render"))
        self._maybe_fail("render")
        self.renders += 1
        if self.retire_on_render:
            self.life = AreaLifeState.retired
        return self.script.pop(0) if self.script else []

    def promote(self) -> tuple[Message, ...]:
        self.log.append((self.name, "promote"))
        self._maybe_fail("promote")
        return self.promoted

    def gc_prologue(self) -> None:
        self.log.append((self.name, "gc_prologue"))
        self._maybe_fail("gc_prologue")

    def __repr__(self) -> str:
        return f"<ScriptedArea {self.name}>"

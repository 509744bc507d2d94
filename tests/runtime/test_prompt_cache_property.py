"""Property: Anthropic's automatic breakpoints stay within the budget and on stable bytes.

A host plays random turns (marks of its own in its inputs' ``extras``, in
``tools`` and as the top-level automatic mark; parallel tool calls, some
steps longer than Anthropic's 20-block lookback; evictions at
``max_turns=3``) through ``manager.request_body`` with
``prompt_cache=PromptCache()``, on asyncio and trio. For every body:

* it holds at most 4 ``cache_control`` marks, or the host's own when they
  alone are more (the policy then adds none), and it passes
  ``validate_request`` whenever the host's marks fit the budget;
* the policy never marks the host's content differently: with every mark
  removed it is the body without the policy;
* when the budget leaves room, the policy marks the end of the last closed
  turn, and the bytes up to a mark it placed on a closed turn (the cache
  entry that mark wrote, marks removed) open every later input, unchanged,
  until an eviction removes turns from the history.
"""

from __future__ import annotations

import copy
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.runtime.helpers import SYSTEM
from turnloom.context import Message, Role, TextPart, ToolCallPart, ToolResultPart
from turnloom.context.cache import PromptCache, anthropic_breakpoints
from turnloom.context.gateways import AnthropicGateway
from turnloom.context.history import HistoryLimits
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.runtime.manager import ContextManager

_encode = msgspec.json.Encoder().encode
_GATEWAY = AnthropicGateway()
_MARK = {"type": "ephemeral"}


class Turn(msgspec.Struct, frozen=True):
    """One turn: the host's marks in its input, and its model steps (parallel calls each)."""

    input_marks: int
    steps: tuple[int, ...]


class Host(msgspec.Struct, frozen=True):
    """The host's request fields: a marked tool, the top-level automatic mark."""

    tools_mark: bool
    automatic: bool


_TURNS = st.lists(
    st.builds(
        Turn,
        input_marks=st.integers(0, 2),
        steps=st.lists(st.integers(1, 12), max_size=3).map(tuple),
    ),
    min_size=1,
    max_size=6,
)
_HOSTS = st.builds(Host, tools_mark=st.booleans(), automatic=st.booleans())


def _strip(value: Any) -> Any:
    """``value`` without any ``cache_control`` key, a string system as one text block."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _blocks(body: dict[str, Any]) -> list[bytes]:
    """The body's system and message blocks in reading order, marks removed, with roles."""
    system = body.get("system")
    if isinstance(system, str):
        system = [{"type": "text", "text": system}]
    out = [b"system:" + _encode(_strip(block)) for block in system or ()]
    for message in body["messages"]:
        content = message["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        out.extend(message["role"].encode() + b":" + _encode(_strip(b)) for b in content)
    return out


def _flat_index(body: dict[str, Any], item: int, block: int) -> int:
    return sum(len(m["content"]) for m in body["messages"][:item]) + block


def _input(number: int, marks: int) -> Message:
    parts = [TextPart(text=f"Question {number}.")]
    parts += [
        TextPart(text=f"Attachment {number}.{n}.", extras={"cache_control": dict(_MARK)})
        for n in range(marks)
    ]
    return Message(role=Role.user, content=tuple(parts))


def _step(number: int, step: int, calls: int) -> list[Message]:
    ids = [f"call_{number}_{step}_{i}" for i in range(calls)]
    parts = tuple(ToolCallPart(call_id=i, name="lookup", arguments="{}") for i in ids)
    results = [
        Message(role=Role.tool, content=(ToolResultPart(call_id=i, content=(TextPart(text=i),)),))
        for i in ids
    ]
    return [Message(role=Role.assistant, content=parts), *results]


class _Checker:
    """Checks each body in turn; keeps the cache entries the policy's closed-turn marks wrote."""

    def __init__(self, manager: ContextManager, fields: dict[str, Any]) -> None:
        self.manager = manager
        self.fields = fields
        self.entries: list[list[bytes]] = []
        self.oldest = ""
        self.bodies = 0

    def check(self, prefix: Any, continuation: list[Message]) -> None:
        manager = self.manager
        body = manager.request_body(prefix, continuation, fields=self.fields)
        items = manager.build(prefix, continuation)
        plain = {**copy.deepcopy(self.fields), **manager.gateway.request_body(items)}
        host = len(anthropic_breakpoints(plain))
        marks = anthropic_breakpoints(body)
        # The policy adds marks only within the budget, and removes none of the host's.
        assert len(marks) == host if host >= 4 else host <= len(marks) <= 4
        if host <= 4:
            assert _GATEWAY.validate_request(body) == []
        assert _strip(body) == _strip(plain) or _blocks(body) == _blocks(plain)
        blocks = _blocks(body)
        oldest = manager.history("c").turn_ids[0]
        if oldest != self.oldest:  # eviction removed the oldest turn(s)
            self.entries, self.oldest = [], oldest
        for entry in self.entries:
            assert blocks[: len(entry)] == entry
        # The closed history: the body of the items before the turn's input.
        closed_body = manager.gateway.request_body(items[: prefix.turn_start])
        closed = sum(len(m["content"]) for m in closed_body["messages"])
        lead = len(_blocks({"messages": [], **{k: v for k, v in body.items() if k == "system"}}))
        policy = [
            _flat_index(body, m.item, m.block)
            for m in marks
            if m.field == "messages" and "cache_control" not in _plain_block(plain, m.item, m.block)
        ]
        if closed and host <= 2 and not self.fields.get("cache_control"):
            assert closed - 1 in policy  # room for the rolling mark and this one
        for at in policy:
            if at < closed:
                self.entries.append(blocks[: lead + at + 1])
        self.bodies += 1


def _plain_block(plain: dict[str, Any], item: int, block: int) -> dict[str, Any]:
    content = plain["messages"][item]["content"]
    return content[block] if isinstance(content, list) else {}


async def _drive(turns: list[Turn], host: Host) -> int:
    fields: dict[str, Any] = {"model": "m"}
    if host.tools_mark:
        fields["tools"] = [{"name": "lookup", "input_schema": {"type": "object"}}]
        fields["tools"][0]["cache_control"] = dict(_MARK)
    if host.automatic:
        fields["cache_control"] = dict(_MARK)
    limits = HistoryLimits(max_turns=3)
    async with Foundation(
        gateway="anthropic", history_limits=limits, prompt_cache=PromptCache()
    ) as foundation:
        manager = foundation.manager
        checker = _Checker(manager, fields)
        for number, turn in enumerate(turns, start=1):
            turn_id = f"t{number}"
            manager.accept_turn(
                TurnSnapshot(
                    context_id="c",
                    turn_id=turn_id,
                    instructions=(SYSTEM,) if number == 1 else None,
                    input=(_input(number, turn.input_marks),),
                )
            )
            prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id=turn_id))
            checker.check(prefix, [])
            continuation: list[Message] = []
            for step, calls in enumerate(turn.steps):
                outputs = _step(number, step, calls)
                manager.record("c", turn_id, outputs)
                continuation += outputs
                checker.check(prefix, continuation)
            manager.record("c", turn_id, [Message(role=Role.assistant, content=f"A{number}.")])
    return checker.bodies


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=40)
@given(turns=_TURNS, host=_HOSTS)
def test_breakpoints_stay_within_budget_and_on_stable_bytes(
    backend: str, turns: list[Turn], host: Host
) -> None:
    """Invariant: no body over 4 marks (unless the host's alone), every body valid when the
    host's marks fit, and the bytes up to each closed-turn mark open every later input
    until an eviction."""
    assert anyio.run(_drive, turns, host, backend=backend) >= len(turns)


def test_the_property_sees_closed_turn_marks_and_bridges() -> None:
    """The property is not vacuous: a fixed run places closed-turn marks and bridges."""
    turns = [Turn(input_marks=0, steps=(12,)), Turn(input_marks=0, steps=(12, 1))]
    host = Host(tools_mark=False, automatic=False)

    async def run() -> list[list[str]]:
        seen: list[list[str]] = []
        async with Foundation(gateway="anthropic", prompt_cache=PromptCache()) as foundation:
            manager = foundation.manager
            for number, turn in enumerate(turns, start=1):
                turn_id = f"t{number}"
                manager.accept_turn(
                    TurnSnapshot(
                        context_id="c",
                        turn_id=turn_id,
                        instructions=(SYSTEM,) if number == 1 else None,
                        input=(_input(number, 0),),
                    )
                )
                prefix = await manager.prepare(
                    ContextPrepareRequest(context_id="c", turn_id=turn_id)
                )
                outputs = _step(number, 0, turn.steps[0])
                manager.record("c", turn_id, outputs)
                body = manager.request_body(prefix, outputs)
                seen.append([m.field for m in anthropic_breakpoints(body)])
                manager.record("c", turn_id, [Message(role=Role.assistant, content="A.")])
        return seen

    assert anyio.run(run) == [
        ["system", "messages", "messages"],  # 25 blocks in the open turn: one bridge
        ["system", "messages", "messages", "messages"],  # closed end, bridge, rolling
    ]
    assert anyio.run(_drive, turns, host) == 5

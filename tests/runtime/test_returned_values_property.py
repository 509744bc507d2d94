"""Property: a host that changes, at random, everything turnloom returned changes no later input.

Two managers see the same turns (pinned instructions, parallel tool calls,
runtime-state pairs, area notices, messages holding extras, evictions). The
host of one changes, at random, every value it got back (request bodies,
``prefix.items``, ``build``'s items, history renders and messages,
statistics) as soon as it has it and again later; every input that manager
gives afterwards (the request body's dict and ``request_bytes``) equals the
twin's, whose host changed nothing.
"""

from __future__ import annotations

import random
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.runtime.helpers import SYSTEM
from turnloom.areas import OneShotNotice
from turnloom.context import (
    GatewayType,
    Message,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    get_gateway,
)
from turnloom.context.history import HistoryLimits
from turnloom.runtime import ContextContribution, ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.runtime.manager import ContextManager

_encode = msgspec.json.Encoder().encode

# A user item holding a provider-native field the neutral model keeps as extras.
_EXTRAS_ITEM: dict[GatewayType, dict[str, Any]] = {
    GatewayType.openai_chat: {
        "role": "user",
        "content": [{"type": "text", "text": "hi", "x_note": {"tags": ["a"]}}],
    },
    GatewayType.openai_responses: {
        "role": "user",
        "content": [{"type": "input_text", "text": "hi", "x_note": {"tags": ["a"]}}],
    },
    GatewayType.anthropic: {
        "role": "user",
        "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
    },
    GatewayType.gemini: {"role": "user", "parts": [{"text": "hi", "x_note": {"tags": ["a"]}}]},
}


class Turn(msgspec.Struct, frozen=True):
    """One turn: its input's kind, model steps (parallel calls per step), state, notice."""

    extras: bool
    steps: tuple[int, ...]
    state: bool
    notice: bool


_TURNS = st.lists(
    st.builds(
        Turn,
        extras=st.booleans(),
        steps=st.lists(st.integers(1, 3), max_size=2).map(tuple),
        state=st.booleans(),
        notice=st.booleans(),
    ),
    min_size=1,
    max_size=5,
)


class _Host:
    """What a host does with each value it gets back: nothing, or change it at random."""

    def __init__(self, rng: random.Random | None) -> None:
        self.rng = rng
        self.held: list[Any] = []

    def got(self, value: Any) -> None:
        rng = self.rng
        if rng is None:
            return
        self.held.append(value)
        if rng.random() < 0.8:
            _vandalize(value, rng)
        if rng.random() < 0.5:
            _vandalize(rng.choice(self.held), rng)


def _vandalize(value: Any, rng: random.Random) -> None:
    """Change dicts and lists reachable from ``value`` (Structs' fields included), at random.

    At most 300 containers a call: values shared with a cache (a mutant) that
    grow at each change stay small.
    """
    stack = [value]
    budget = 300
    while stack and budget:
        budget -= 1
        node = stack.pop()
        if isinstance(node, msgspec.Struct):
            stack.extend(getattr(node, name) for name in node.__struct_fields__)
        elif isinstance(node, tuple):
            stack.extend(node)
        elif isinstance(node, dict):
            stack.extend(node.values())
            choice = rng.random()
            if choice < 0.3:
                node["cache_control"] = {"type": "ephemeral"}
            elif choice < 0.5 and node:
                key = rng.choice(list(node))
                node[key] = "edited" if isinstance(node[key], str) else 0
            elif choice < 0.6 and node:
                del node[rng.choice(list(node))]
        elif isinstance(node, list):
            stack.extend(node)
            choice = rng.random()
            if choice < 0.3:
                node.append({"type": "text", "text": "edited"})
            elif choice < 0.4:
                node.clear()
            elif choice < 0.5 and node:
                node.reverse()


def _user(kind: GatewayType, number: int, extras: bool) -> Message:
    if not extras:
        return Message(role=Role.user, content=f"Question {number}.")
    return get_gateway(kind).parse(msgspec.json.decode(_encode(_EXTRAS_ITEM[kind])))


def _step(number: int, step: int, calls: int) -> list[Message]:
    ids = [f"call_{number}_{step}_{i}" for i in range(calls)]
    parts = tuple(
        ToolCallPart(call_id=i, name="lookup", arguments=f'{{"n": {number}}}') for i in ids
    )
    results = [
        Message(
            role=Role.tool,
            content=(ToolResultPart(call_id=i, content=(TextPart(text=f"found {i}"),)),),
        )
        for i in ids
    ]
    return [Message(role=Role.assistant, content=parts), *results]


async def _play(
    manager: ContextManager, kind: GatewayType, number: int, turn: Turn, host: _Host
) -> list[tuple[bytes, bytes]]:
    """One turn as a host plays it; every model input, as (body's JSON, request_bytes)."""
    gateway = manager.gateway
    turn_id = f"t{number}"
    manager.accept_turn(
        TurnSnapshot(
            context_id="c",
            turn_id=turn_id,
            instructions=(SYSTEM,) if number == 1 else None,
            input=(_user(kind, number, turn.extras),),
        )
    )
    if turn.notice:
        manager.areas.attach("c", OneShotNotice(f"Notice {number}."))
    state = (ContextContribution(name="memory", content=f"fact {number}"),) if turn.state else ()
    prefix = await manager.prepare(
        ContextPrepareRequest(context_id="c", turn_id=turn_id, contributions=state)
    )
    host.got(prefix)
    items = prefix.items
    body = gateway.request_body(items)
    inputs = [(_encode(body), manager.request_bytes(prefix))]
    host.got(body)
    # A retry from the same items: what the host did to the first body is not in it.
    retry = gateway.request_body(items)
    inputs.append((_encode(retry), manager.request_bytes(prefix)))
    host.got(items)
    host.got(retry)
    # A render under the other open-call policy renders the earlier turns'
    # messages anew (another cache slot): what the host did to the messages it
    # got from the history is not in it.
    other = manager.history("c").render(gateway, turn_id, open_calls="cancel")
    inputs.append((_encode(other.items), b""))
    host.got(other.items)
    continuation: list[Message] = []
    for step, calls in enumerate(turn.steps):
        outputs = _step(number, step, calls)
        manager.record("c", turn_id, outputs)
        continuation += outputs
        built = manager.build(prefix, continuation)
        body = gateway.request_body(built)
        inputs.append((_encode(body), manager.request_bytes(prefix, continuation)))
        host.got(built)
        host.got(body)
        host.got(prefix.items)
    manager.record("c", turn_id, [Message(role=Role.assistant, content=f"Answer {number}.")])
    view = manager.history("c")
    host.got(view.render(gateway, turn_id).items)
    host.got(view.turn_messages(turn_id))
    host.got(view.messages())
    host.got(view.pinned)
    host.got(manager.statistics())
    return inputs


async def _drive(kind: GatewayType, turns: list[Turn], seed: int) -> None:
    limits = HistoryLimits(max_turns=3)
    async with (
        Foundation(gateway=kind, history_limits=limits) as edited_foundation,
        Foundation(gateway=kind, history_limits=limits) as twin_foundation,
    ):
        edited, twin = _Host(random.Random(seed)), _Host(None)
        seen: list[tuple[bytes, bytes]] = []
        expected: list[tuple[bytes, bytes]] = []
        for number, turn in enumerate(turns, start=1):
            seen += await _play(edited_foundation.manager, kind, number, turn, edited)
            expected += await _play(twin_foundation.manager, kind, number, turn, twin)
        assert seen == expected
        # The twin's dict body and bytes agree: the comparison is of real inputs.
        assert [msgspec.json.decode(a) for a, b in expected if b] == [
            msgspec.json.decode(b) for _, b in expected if b
        ]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("kind", list(GatewayType))
@settings(max_examples=15)
@given(turns=_TURNS, seed=st.integers(0, 2**32 - 1))
def test_a_host_changing_what_it_got_back_changes_no_later_input(
    backend: str, kind: GatewayType, turns: list[Turn], seed: int
) -> None:
    """Invariant: after any turns in which the host changes, at random, every
    body, prefix, ``items``, ``build`` result, history render and message and
    statistics snapshot it got back, every later input (body and bytes, a
    retried body of the same items, a history render under the other
    open-call policy) equals that of a manager that saw the same turns and no
    change."""
    anyio.run(_drive, kind, turns, seed, backend=backend)


def test_the_host_changes_are_not_vacuous() -> None:
    """The property's host really changes what it gets back: a fixed run leaves
    cache_control marks in the values it held (in the old, shared design they
    reached the next input)."""
    turns = [Turn(extras=True, steps=(2,), state=True, notice=True)] * 3

    async def run() -> int:
        host = _Host(random.Random(0))
        async with Foundation(gateway=GatewayType.anthropic) as foundation:
            for number, turn in enumerate(turns, start=1):
                await _play(foundation.manager, GatewayType.anthropic, number, turn, host)
        return sum(_encode(v).count(b"edited") for v in host.held if isinstance(v, tuple | dict))

    assert anyio.run(run) > 0

"""What turnloom returns is never shared with what it keeps.

A host may change anything it gets back (request bodies, ``PreparedContext.items``,
``build``'s result, a history render's items): the change never reaches a later
input. The most common edit is Anthropic's rolling ``cache_control`` mark on the
last block of the body; the API refuses more than four marks in one request.
"""

from __future__ import annotations

import gc
from typing import Any

import msgspec
import pytest

from tests.runtime.helpers import SYSTEM, call, result, user
from turnloom.context import GatewayType, Message, NativeContent, Role, get_gateway
from turnloom.runtime import ContextPrepareRequest, Foundation, PreparedContext, TurnSnapshot
from turnloom.runtime.manager import ContextManager

pytestmark = pytest.mark.anyio

_CONTAINERS = (dict, list, tuple)


async def _turn(manager: ContextManager, number: int) -> PreparedContext:
    """Commit and prepare turn ``t<number>`` of context ``c`` (its outputs recorded after)."""
    turn_id = f"t{number}"
    manager.accept_turn(
        TurnSnapshot(
            context_id="c",
            turn_id=turn_id,
            instructions=(SYSTEM,) if number == 1 else None,
            input=(user(f"Question {number}."),),
        )
    )
    return await manager.prepare(ContextPrepareRequest(context_id="c", turn_id=turn_id))


def _record(manager: ContextManager, number: int) -> list[Message]:
    outputs = [
        call(f"call_{number}"),
        result(f"call_{number}", f"found {number}"),
        Message(role=Role.assistant, content=f"Answer {number}."),
    ]
    manager.record("c", f"t{number}", outputs)
    return outputs


def _marks(value: Any) -> int:
    """How many ``cache_control`` keys ``value`` holds, at any depth."""
    stack, found = [value], 0
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found += "cache_control" in node
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)
    return found


def _mark_last_block(body: dict[str, Any]) -> None:
    """A host's rolling prompt-cache mark: on the last block of the last message."""
    last = body["messages"][-1]
    if isinstance(last["content"], str):
        last["content"] = [{"type": "text", "text": last["content"]}]
    last["content"][-1]["cache_control"] = {"type": "ephemeral"}


async def test_a_rolling_cache_control_mark_stays_one_mark_on_anthropic() -> None:
    """Invariant: a host that marks the last block of each body it sends finds
    none of its marks in any later body (7 turns, two model calls each), nor in
    the bytes or the prefix's items: each body it marks holds exactly its one mark."""
    async with Foundation(gateway="anthropic") as foundation:
        manager = foundation.manager
        gateway = manager.gateway
        counts = []
        for number in range(1, 8):
            prefix = await _turn(manager, number)
            body = gateway.request_body(prefix.items)
            counts.append(
                (_marks(body), _marks(msgspec.json.decode(manager.request_bytes(prefix))))
            )
            _mark_last_block(body)
            outputs = _record(manager, number)
            again = gateway.request_body(manager.build(prefix, outputs[:2]))
            counts.append((_marks(again), _marks(prefix.items)))
            _mark_last_block(again)
        assert counts == [(0, 0)] * 14


@pytest.mark.parametrize("kind", list(GatewayType))
async def test_editing_returned_values_changes_no_later_input(kind: GatewayType) -> None:
    """Invariant: editing a body's items, ``prefix.items[i]["content"]``,
    ``build``'s items and a history render's items, on every gateway, leaves
    every later body and bytes equal to those of a manager that saw no edit."""
    async with (
        Foundation(gateway=kind) as edited_foundation,
        Foundation(gateway=kind) as twin_foundation,
    ):
        edited, twin = edited_foundation.manager, twin_foundation.manager
        gateway = get_gateway(kind)
        seen: list[tuple[Any, bytes]] = []
        expected: list[tuple[Any, bytes]] = []
        for number in range(1, 5):
            prefix = await _turn(edited, number)
            twin_prefix = await _turn(twin, number)
            seen.append((gateway.request_body(prefix.items), edited.request_bytes(prefix)))
            expected.append(
                (gateway.request_body(twin_prefix.items), twin.request_bytes(twin_prefix))
            )
            body = gateway.request_body(prefix.items)
            for item in body[gateway.items_field]:
                _vandalize(item)
            for item in prefix.items:
                _vandalize(item)
            outputs = _record(edited, number)
            twin_outputs = _record(twin, number)
            for item in edited.build(prefix, outputs):
                _vandalize(item)
            for item in edited.history("c").render(gateway, f"t{number}").items:
                _vandalize(item)
            seen.append(
                (
                    gateway.request_body(edited.build(prefix, outputs)),
                    edited.request_bytes(prefix, outputs),
                )
            )
            expected.append(
                (
                    gateway.request_body(twin.build(twin_prefix, twin_outputs)),
                    twin.request_bytes(twin_prefix, twin_outputs),
                )
            )
        assert seen == expected


def _vandalize(item: NativeContent) -> None:
    """Change every container of ``item``: a new key in each dict, an element in each list."""
    stack: list[Any] = [item]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
            if "content" in node:
                node["content"] = "edited"
            node["edited"] = True
        elif isinstance(node, list):
            stack.extend(node)
            node.append("edited")


@pytest.mark.parametrize("kind", list(GatewayType))
async def test_returned_containers_are_new_and_tracked(kind: GatewayType) -> None:
    """Invariant: two reads give no container in common, and every container
    handed out is one the cyclic collector sees (a dict of atoms only may be
    untracked: CPython tracks it once a container is stored in it), so a
    host's reference cycle through one is collected, never leaked."""
    async with Foundation(gateway=kind) as foundation:
        manager = foundation.manager
        gateway = manager.gateway
        prefix = await _turn(manager, 1)
        outputs = _record(manager, 1)
        prefix = await _turn(manager, 2)
        reads = [
            prefix.items,
            prefix.items,
            manager.build(prefix, outputs),
            manager.build(prefix, outputs),
            gateway.request_body(prefix.items),
            gateway.request_body(prefix.items),
            manager.history("c").render(gateway, "t2").items,
        ]
        ids = [{id(node) for node in _containers(read)} for read in reads]
        assert [len(a & b) for i, a in enumerate(ids) for b in ids[i + 1 :]] == [0] * 21
        untracked = [
            node
            for read in reads
            for node in _containers(read)
            if not gc.is_tracked(node)
            and not (type(node) is dict and not any(type(v) in _CONTAINERS for v in node.values()))
        ]
        assert untracked == []


def _containers(value: Any) -> list[Any]:
    out, stack = [], [value]
    while stack:
        node = stack.pop()
        if type(node) in _CONTAINERS:
            out.append(node)
            stack.extend(node.values() if type(node) is dict else node)
    return out


def test_request_body_shares_no_container_with_its_items() -> None:
    """Invariant: on every gateway, a body built twice from the same items
    shares no container with them or with the other body, so a host's edit of
    one body (or of its own items) changes nothing else."""
    for kind in GatewayType:
        gateway = get_gateway(kind)
        items = [
            *gateway.render(SYSTEM),
            *gateway.render(user("Hi.")),
            *gateway.render(call("c1")),
            *gateway.render(result("c1")),
        ]
        first, second = gateway.request_body(items), gateway.request_body(items)
        shared = {id(n) for n in _containers(first)} & {id(n) for n in _containers(second)}
        mine = {id(n) for n in _containers(items)}
        assert (kind, shared, mine & {id(n) for n in _containers(first)}) == (kind, set(), set())
        assert first == second

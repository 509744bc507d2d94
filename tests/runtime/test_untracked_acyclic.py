"""Objects turnloom takes out of the cyclic garbage collector are in no reference cycle.

A per-context object untracked with ``PyObject_GC_UnTrack`` (see
:mod:`turnloom.context._untrack`) is never visited by a full collection, which
keeps the pause bounded by what is allocated, not by what is held. It is
only safe for an object that can be in no reference cycle: an untracked
object in a cycle makes the whole cycle leak. Two invariants:

* **In no cycle**: with untracking switched off (so the collector sees every
  object), a rich workload on every gateway (evictions with reused call ids,
  kept runtime-state pairs, areas with routed items, approvals, late
  outputs, a removed context, the Foundation closed) leaves no instance of
  an untracked class in a reference cycle.
* **Untracked**: with untracking on, after a prepare without host objects in
  the way, each of those objects is out of the collector; one holding a
  host's objects (an area section's items, a host gateway's writer) stays in.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator

import pytest

from tests.context.history_patch import history_modules
from tests.runtime.helpers import SYSTEM, assistant, call, result, user
from turnloom.areas import OneShotNotice, PinnedNotice, SubtaskArea
from turnloom.context import GatewayType, Message, _untrack, get_gateway
from turnloom.context.body import BodyRun, EncodedBody
from turnloom.context.gateways.anthropic import _AnthropicBody
from turnloom.context.gateways.gemini import GeminiGateway, _GeminiBody
from turnloom.context.gateways.openai_chat import _ChatBody
from turnloom.context.gateways.openai_responses import _ResponsesBody
from turnloom.context.history import HistoryLimits, RenderedHistory
from turnloom.context.history._run import _Run
from turnloom.context.items import NativeItems
from turnloom.errors import TurnloomError
from turnloom.runtime import (
    ContextContribution,
    ContextPrepareRequest,
    Foundation,
    PreparedContext,
    TurnSnapshot,
)
from turnloom.runtime._render import DeliveredPrefix
from turnloom.runtime.manager import ContextManager

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        sys.implementation.name != "cpython", reason="untracking is CPython's (elsewhere a no-op)"
    ),
]

UNTRACKED = (
    DeliveredPrefix,
    RenderedHistory,
    NativeItems,
    EncodedBody,
    BodyRun,
    _Run,
    _ChatBody,
    _ResponsesBody,
    _AnthropicBody,
    _GeminiBody,
)
WRITERS = {
    GatewayType.openai_chat: _ChatBody,
    GatewayType.openai_responses: _ResponsesBody,
    GatewayType.anthropic: _AnthropicBody,
    GatewayType.gemini: _GeminiBody,
}
POOL = ("call_1", "call_2")  # call ids reused within and across turns and contexts
STATE = (ContextContribution(name="memory", content="likes tea"),)


def _request(context_id: str, turn_id: str, state: bool) -> ContextPrepareRequest:
    return ContextPrepareRequest(
        context_id=context_id, turn_id=turn_id, contributions=STATE if state else ()
    )


async def _turns(manager: ContextManager, context_id: str, kind: GatewayType) -> PreparedContext:
    """Eight turns of one context: calls reusing the pool's ids, an open call
    approved by the next turn's input, late outputs to an evicted turn, state
    pairs on every other prepare, builds and request bytes."""
    gateway = get_gateway(kind)
    approve: str | None = None
    prepared: PreparedContext | None = None
    for n in range(8):
        turn_id = f"t{n}"
        inputs: tuple[Message, ...] = (
            (result(approve, "approved"),) if approve is not None else (user(f"question {n}"),)
        )
        manager.accept_turn(
            TurnSnapshot(
                context_id=context_id,
                turn_id=turn_id,
                input=inputs,
                instructions=(SYSTEM,) if n == 0 else None,
            )
        )
        if context_id == "areas" and n == 1:
            manager.areas.attach(context_id, PinnedNotice("The customer is a gold member."))
            manager.areas.attach(context_id, OneShotNotice("Mention the baggage policy."))
            manager.areas.attach(
                context_id, SubtaskArea("Check the booking.", done=lambda a: False, summary="ok")
            )
        if context_id == "areas" and n == 3:
            for message in (assistant("Looking."), call("k1", "booking"), result("k1", "AB12")):
                for item in gateway.render(message):
                    manager.areas.route(context_id, item)
        prepared = await manager.prepare(_request(context_id, turn_id, n % 2 == 0))
        assert len(prepared.items) == prepared.item_count
        manager.build(prepared, [assistant("partial")])
        assert manager.request_bytes(prepared)
        a, b = POOL[n % 2], POOL[(n + 1) % 2]
        async with manager.invocation(context_id, turn_id) as invocation:
            invocation.record([call(a), call(b), result(a, f"r{n}"), result(b, f"s{n}")])
        approve = None
        if n % 3 == 1:
            manager.record(context_id, turn_id, [call(a, "approve")])
            approve = a
        else:
            manager.record(context_id, turn_id, [assistant(f"answer {n}")])
        if n >= 5:
            try:  # a late output to a turn evicted by now: dropped and counted
                manager.record(context_id, "t0", [result(POOL[0], "late")])
            except TurnloomError:
                pass
    assert prepared is not None
    return prepared


async def _workload(kind: GatewayType) -> dict[type, int]:
    """Three contexts (one with areas, one removed) until the Foundation closes;
    the live instances of each untracked class while it was open."""
    limits = HistoryLimits(max_turns=3, max_items=40, max_bytes=100_000)
    # No collector policy: gc.get_objects() does not list what it froze.
    async with Foundation(
        gateway=kind, history_limits=limits, worker_threads=1, collector=None
    ) as foundation:
        manager = foundation.manager
        held = [await _turns(manager, context_id, kind) for context_id in ("a", "areas", "gone")]
        manager.remove_context("gone")
        live: dict[type, int] = dict.fromkeys(UNTRACKED, 0)
        for obj in gc.get_objects():
            if type(obj) in live:
                live[type(obj)] += 1
        del held
    return live


def _in_cycles(garbage: list[object]) -> list[object]:
    """The instances of untracked classes among ``garbage`` that can reach themselves."""
    within = {id(obj) for obj in garbage}
    found = []
    for obj in garbage:
        if type(obj) not in UNTRACKED:
            continue
        seen: set[int] = set()
        stack = list(gc.get_referents(obj))
        while stack:
            node = stack.pop()
            if node is obj:
                found.append(obj)
                break
            if id(node) in seen or id(node) not in within:
                continue
            seen.add(id(node))
            stack.extend(gc.get_referents(node))
    return found


@pytest.fixture
def untracking_off(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every untrack call a no-op: the collector sees every object."""
    monkeypatch.setattr(_untrack, "GC_UNTRACK", None)
    for module in history_modules():
        if hasattr(module, "_GC_UNTRACK"):
            monkeypatch.setattr(module, "_GC_UNTRACK", None)
    yield


@pytest.mark.parametrize("kind", list(GatewayType))
@pytest.mark.usefixtures("untracking_off")
async def test_untracked_classes_are_in_no_reference_cycle(kind: GatewayType) -> None:
    """Invariant: no instance of a class turnloom untracks is ever in a
    reference cycle (with untracking off, every cycle the rich workload left
    is saved by the collector; none holds one)."""
    gc.collect()
    debug = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)  # every collection, automatic ones too, keeps what it frees
    try:
        live = await _workload(kind)
        gc.collect()
        cycles = _in_cycles(gc.garbage)
    finally:
        gc.set_debug(debug)
        gc.garbage.clear()
    others = set(WRITERS.values()) - {WRITERS[kind]}
    assert [cls.__name__ for cls, count in live.items() if not count] == [
        cls.__name__ for cls in UNTRACKED if cls in others
    ]  # the workload made every class but the other gateways' writers
    assert [type(obj).__name__ for obj in cycles] == []


def _held_objects(manager: ContextManager, context_id: str) -> dict[str, object]:
    """A context's delivered prefix, its parts and its history's render run."""
    state = manager._table.contexts[context_id]
    prefix = state.last
    assert prefix is not None
    shared = state.history._shared
    (run,) = shared.runs.values()
    assert run.body is not None and prefix.body is not None
    return {
        "prefix": prefix,
        "items": prefix.items,
        "rendered": prefix.rendered,
        "rendered items": prefix.rendered.native_items,
        "body": prefix.body,
        "run": run,
        "body run": run.body,
        "writer": run.body._writer,
        "lock": shared.lock,
    }


@pytest.mark.parametrize("kind", list(GatewayType))
async def test_a_prepared_contexts_objects_are_untracked(kind: GatewayType) -> None:
    """Invariant: after prepares (state pairs, evictions), a context's
    delivered prefix, its items, render and body, its history's render run,
    body cache and writer, and its lock are out of the collector; with an
    area section's items in the prefix, the prefix, its items and body stay
    tracked (host items), the history's objects are untracked still."""
    limits = HistoryLimits(max_turns=3, max_items=40, max_bytes=100_000)
    async with Foundation(gateway=kind, history_limits=limits) as foundation:
        manager = foundation.manager
        await _turns(manager, "a", kind)
        await _turns(manager, "areas", kind)
        plain = _held_objects(manager, "a")
        areas = _held_objects(manager, "areas")
        assert type(plain["writer"]) is WRITERS[kind]
        assert {name: gc.is_tracked(obj) for name, obj in plain.items()} == dict.fromkeys(
            plain, False
        )
        assert [name for name, obj in areas.items() if gc.is_tracked(obj)] == [
            "prefix",
            "items",
            "body",
        ]


class _HostGemini(GeminiGateway):
    """A host's gateway: it may refer to anything (here, back to its manager)."""

    __slots__ = ("manager",)

    manager: ContextManager


async def test_a_host_gateways_writer_keeps_the_render_run_tracked() -> None:
    """Invariant: a body writer holding a host's gateway stays tracked, and so
    do the body cache, render run, body, render and prefix holding it (the
    items, of the history and the state pair only, are untracked)."""
    gateway = _HostGemini()
    async with Foundation(gateway=gateway) as foundation:
        gateway.manager = foundation.manager
        await _turns(foundation.manager, "a", GatewayType.gemini)
        held = _held_objects(foundation.manager, "a")
        assert [name for name, obj in held.items() if not gc.is_tracked(obj)] == [
            "items",
            "rendered items",
            "lock",
        ]


def test_a_lock_refers_to_nothing_but_its_type() -> None:
    """The premise of untracking a history's lock."""
    lock = threading.Lock()
    assert [r for r in gc.get_referents(lock) if r is not type(lock)] == []

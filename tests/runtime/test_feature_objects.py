"""The host features reached from a ContextManager share its lifecycle.

``manager.leases``, ``areas``, ``bridge``, ``outputs``, ``voice`` and
``assembly`` exist from construction on, are the same objects for the
manager's whole life, and each method raises :class:`StateError` before the
Foundation opens and :class:`FoundationClosedError` once it closed, exactly
as the manager's own calls do. Every async test runs on asyncio and on trio
(``anyio_backend`` fixture).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from tests.runtime.helpers import assistant, user
from turnloom.areas import OneShotNotice
from turnloom.context.message import ToolCallPart
from turnloom.errors import StateError
from turnloom.runtime import (
    Areas,
    Assembly,
    Bridge,
    ContextManager,
    ContextPrepareRequest,
    Foundation,
    FoundationClosedError,
    Leases,
    OutputRecord,
    OutputStreams,
    PreparedContext,
    TurnSnapshot,
    Voice,
)

pytestmark = pytest.mark.anyio

Call = Callable[[ContextManager, PreparedContext], object]


class _NoOutputs:
    """An output stream that ends at once (holds no resource to close)."""

    def __aiter__(self) -> _NoOutputs:
        return self

    async def __anext__(self) -> OutputRecord:
        raise StopAsyncIteration


def _calls() -> dict[str, Call]:
    """One call of every method of every feature object, by name."""
    area = OneShotNotice("n")
    item = {"role": "assistant", "content": "routed"}
    hydrate = ToolCallPart(call_id="h1", name="hydrate_context", arguments='{"query": "q"}')
    return {
        "leases.claim": lambda m, p: m.leases.claim("c"),
        "areas.attach": lambda m, p: m.areas.attach("c", area),
        "areas.route": lambda m, p: m.areas.route("c", item),
        "bridge.working_context": lambda m, p: m.bridge.working_context("c"),
        "bridge.briefing": lambda m, p: m.bridge.briefing("c"),
        "bridge.fold": lambda m, p: m.bridge.fold("c", "t1", "done", agent="a"),
        "outputs.consume": lambda m, p: m.outputs.consume(_NoOutputs()),
        "voice.record_interrupted": lambda m, p: m.voice.record_interrupted(
            "c", "t1", assistant("Okay"), played=2
        ),
        "voice.retract_turn": lambda m, p: m.voice.retract_turn("c", "t1"),
        "assembly.hydrate_context": lambda m, p: m.assembly.hydrate_context(p, hydrate),
    }


async def _call(call: Call, manager: ContextManager, prefix: PreparedContext) -> None:
    result = call(manager, prefix)
    if isinstance(result, Awaitable):
        await result


async def _prefix() -> PreparedContext:
    """A prefix delivered by another (closed) manager: only the lifecycle is under test."""
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),)))
        return await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))


def test_each_feature_object_exists_from_construction_with_its_public_type() -> None:
    manager = ContextManager()
    objects = (
        manager.leases,
        manager.areas,
        manager.bridge,
        manager.outputs,
        manager.voice,
        manager.assembly,
    )
    types = (Leases, Areas, Bridge, OutputStreams, Voice, Assembly)
    assert [type(o) for o in objects] == list(types)
    # What needs no Foundation answers before it opens.
    assert manager.leases.store is None
    assert manager.leases.takeovers == 0
    assert manager.assembly.strategy is None
    assert manager.assembly.tool_definitions() == []
    assert manager.outputs.statistics() == manager.statistics().outputs


@pytest.mark.parametrize("name", sorted(_calls()))
async def test_a_feature_call_before_the_foundation_opens_raises_state_error(name: str) -> None:
    prefix = await _prefix()
    manager = ContextManager()
    with pytest.raises(StateError, match="not bound to an open Foundation"):
        await _call(_calls()[name], manager, prefix)


@pytest.mark.parametrize("name", sorted(_calls()))
async def test_a_feature_call_after_the_foundation_closed_raises_foundation_closed(
    name: str,
) -> None:
    manager = ContextManager()
    async with Foundation(manager) as foundation:
        objects = (manager.leases, manager.areas, manager.bridge)
        more = (manager.outputs, manager.voice, manager.assembly)
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),)))
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
    assert foundation.closed
    # The very objects of the open manager, not new ones.
    assert (manager.leases, manager.areas, manager.bridge) == objects
    assert (manager.outputs, manager.voice, manager.assembly) == more
    with pytest.raises(FoundationClosedError):
        await _call(_calls()[name], manager, prefix)

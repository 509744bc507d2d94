"""The cyclic garbage collector's work stays bounded by what a turn allocates.

A full collection pauses the event loop for as long as it takes to visit
every tracked object, and it runs more often the more garbage survives into
the oldest generation. Two invariants keep both bounded under load:

* **No cyclic garbage per prepare**: preparing, invoking, recording and
  building leave nothing that only the collector can free (every
  per-prepare object dies by reference counting, on both backends, through
  the waiting, inline, worker-thread and queue-full paths).
* **Few tracked objects per held context**: a context and the prefix its
  host holds add a fixed, small number of tracked objects, whatever its
  history holds (its caches, renamers and offsets are untracked).
"""

from __future__ import annotations

import gc
import sys

import anyio
import pytest

from turnloom.context import Message
from turnloom.errors import QueueFullError
from turnloom.runtime import ContextPrepareRequest, Foundation, PreparedContext
from turnloom.runtime.manager import ContextManager
from turnloom.tools.trajectories import builtin_trajectories, check_trajectory
from turnloom.tools.transcript import Reply, Turn, snapshot, walk

pytestmark = pytest.mark.anyio

cpython_only = pytest.mark.skipif(
    sys.implementation.name != "cpython", reason="the collector's bookkeeping is CPython's"
)


def _scripts(count: int, turns: int) -> list[list[Message]]:
    scripts = []
    for trajectory in builtin_trajectories(count, turns=(turns, turns)):
        checked = check_trajectory(trajectory)
        assert isinstance(checked, list)
        scripts.append(checked)
    return scripts


async def _session(
    manager: ContextManager, context_id: str, script: list[Message], held: dict[str, object]
) -> None:
    """One host session as ``turnloom loadtest`` runs it; keeps its last prefix in ``held``."""
    prefix: PreparedContext | None = None
    continuation: list[Message] = []
    turn_id = ""
    for step in walk(script):
        if isinstance(step, Turn):
            turn_id = step.turn_id
            manager.accept_turn(snapshot(context_id, step))
            request = ContextPrepareRequest(context_id=context_id, turn_id=turn_id)
            try:
                prefix = await manager.prepare_nowait(request)
            except QueueFullError:
                prefix = None
            if prefix is None:
                prefix = await manager.prepare(request)
            continuation = []
        elif prefix is None:
            continue
        elif isinstance(step, Reply):
            if continuation:
                manager.build(prefix, continuation)
            async with manager.invocation(context_id, turn_id) as invocation:
                await anyio.lowlevel.checkpoint()
                invocation.record([step.message])
            continuation.append(step.message)
        else:
            manager.record(context_id, turn_id, [step.message])
            continuation.append(step.message)
    held[context_id] = prefix


async def _sessions(
    manager: ContextManager, first: int, count: int, scripts: list[list[Message]]
) -> dict[str, object]:
    held: dict[str, object] = {}
    async with anyio.create_task_group() as group:
        for number in range(first, first + count):
            group.start_soon(
                _session, manager, f"session-{number}", scripts[number % len(scripts)], held
            )
    return held


@cpython_only
async def test_prepares_under_load_leave_no_cyclic_garbage() -> None:
    """Invariant: after warm-up, 24 concurrent sessions (a 2-slot queue, so
    prepares wait for slots and fall back from ``QueueFullError``; inline
    and worker-thread renders) leave exactly 0 objects for the collector."""
    scripts = _scripts(8, 6)
    # No collector policy: its steps would collect (and count) garbage themselves.
    async with Foundation(
        gateway="openai_chat", max_pending_preparations=2, collector=None
    ) as foundation:
        manager = foundation.manager
        await _sessions(manager, 0, 24, scripts)  # warm-up: first-use caches, worker threads
        gc.collect()
        gc.disable()
        try:
            held = await _sessions(manager, 24, 24, scripts)
            stats = manager.statistics().preparations
            unreachable = gc.collect()
        finally:
            gc.enable()
    assert len(held) == 24
    assert stats.rejected_total > 0  # the queue-full fallback ran
    assert unreachable == 0


def _reach(roots: list[object], stop: dict[int, object]) -> dict[int, object]:
    """Every object the collector tracks that ``roots`` lead to through tracked
    objects, not passing through those in ``stop``."""
    found: dict[int, object] = {}
    stack = [root for root in roots if gc.is_tracked(root)]
    while stack:
        node = stack.pop()
        if id(node) in found or id(node) in stop:
            continue
        found[id(node)] = node
        stack.extend(r for r in gc.get_referents(node) if gc.is_tracked(r))
    return found


@cpython_only
async def test_a_held_context_adds_a_fixed_number_of_tracked_objects() -> None:
    """Invariant: a context that ran 12 turns (tool calls, builds), with the
    prefix its host holds, leads the collector to exactly 8 tracked objects
    of its own: its state, history, the history's shared caches (which hold
    the host's token counter and gateway) and their three dicts, the
    history's tuple of turns and the host's prepared prefix; none per
    message, per turn or per call id, and none for its render run, body
    cache, body writer or delivered prefix (untracked: in no cycle, see
    test_untracked_acyclic)."""
    script = _scripts(1, 12)[0]
    async with Foundation(gateway="openai_chat", collector=None) as foundation:
        manager = foundation.manager
        held: dict[str, object] = {}
        await _session(manager, "warm-up", script, held)
        # What every context shares: the manager, its gateway, the modules.
        shared = _reach([foundation, manager], {})
        for number in range(5):  # the last one's transient objects are not counted
            await _session(manager, f"session-{number}", script, held)
        # CPython untracks a tuple of atoms lazily, in the first collection
        # that sees it: count what a full collection would visit.
        gc.collect()
        contexts = manager._table.contexts
        own = [
            len(_reach([contexts[f"session-{n}"], held[f"session-{n}"]], shared)) for n in range(4)
        ]
        items = [contexts[f"session-{n}"].history.held_items for n in range(4)]
    assert items == [45] * 4  # 45 messages held, 8 tracked objects: none per message
    assert own == [8] * 4

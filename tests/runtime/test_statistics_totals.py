"""The manager's running totals equal a brute-force recount after any sequence of operations.

``ContextManager.statistics()`` is O(1) in the number of contexts: it reads
totals kept up to date where histories and area sections change. The oracle
here walks every context (and remembers the histories of removed ones) the
way the statistics used to be computed, after each operation.
"""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.runtime.helpers import SYSTEM, assistant, call, result, user
from turnloom.areas import OneShotNotice
from turnloom.context import Message, Role
from turnloom.context.history import HistoryLimits, TurnHistory
from turnloom.errors import TurnloomError
from turnloom.runtime import (
    ContextManager,
    ContextPrepareRequest,
    Foundation,
    HistoryTotals,
    ManagerStatistics,
    TurnSnapshot,
)

CONTEXTS = ("a", "b", "c")
LIMITS = HistoryLimits(max_turns=3, max_items=6)
OPERATIONS = (
    "accept",
    "record",
    "record_blank",
    "record_late",
    "call_in_flight",
    "attach",
    "prepare",
    "remove",
)


def _recount(manager: ContextManager, removed: list[TurnHistory]) -> tuple[HistoryTotals, int]:
    """The history totals and attached areas, summed over every context by brute force."""
    held = [state.history for state in manager._table.contexts.values()]
    live = [h.statistics() for h in held]
    gone = [h.statistics() for h in removed]
    every = live + gone
    totals = HistoryTotals(
        turns=sum(s.turns for s in live),
        items=sum(s.items for s in live),
        bytes=sum(s.bytes for s in live),
        evicted_turns_total=sum(s.evicted_turns for s in every),
        evicted_items_total=sum(s.evicted_items for s in every),
        dropped_late_outputs_total=sum(s.dropped_late_outputs for s in every),
        dropped_blank_outputs_total=sum(s.dropped_blank_outputs for s in every),
        tokens=sum(s.tokens for s in live),
    )
    attached = sum(
        len(state.areas.attached)
        for state in manager._table.contexts.values()
        if state.areas is not None
    )
    return totals, attached


async def _drive(steps: list[tuple[str, str]]) -> ManagerStatistics:
    removed: list[TurnHistory] = []
    turns = dict.fromkeys(CONTEXTS, 0)
    async with Foundation(history_limits=LIMITS) as foundation:
        manager = foundation.manager
        for operation, context_id in steps:
            turn_id = f"t{turns[context_id] - 1}"
            held = context_id in manager.context_ids()
            try:
                if operation == "accept" or not held:
                    turns[context_id] += 1
                    manager.accept_turn(
                        TurnSnapshot(
                            context_id=context_id,
                            turn_id=f"t{turns[context_id] - 1}",
                            input=(user("hello there"),),
                            instructions=(SYSTEM,) if not held else None,
                        )
                    )
                elif operation == "record":
                    manager.record(context_id, turn_id, [call("c1"), result("c1"), assistant("ok")])
                elif operation == "record_blank":
                    manager.record(context_id, turn_id, [Message(role=Role.assistant, content=" ")])
                elif operation == "record_late":
                    manager.record(context_id, "t0", [assistant("late")])
                elif operation == "call_in_flight":
                    async with manager.invocation(context_id, turn_id) as invocation:
                        invocation.record([assistant("answer")])
                        turns[context_id] += 1
                        manager.accept_turn(
                            TurnSnapshot(
                                context_id=context_id,
                                turn_id=f"t{turns[context_id] - 1}",
                                input=(user("next"),),
                            )
                        )
                elif operation == "attach":
                    manager.areas.attach(context_id, OneShotNotice("note"))
                elif operation == "prepare":
                    await manager.prepare(
                        ContextPrepareRequest(context_id=context_id, turn_id=turn_id)
                    )
                else:
                    removed.append(manager._table.contexts[context_id].history)
                    manager.remove_context(context_id)
                    turns[context_id] = 0
            except TurnloomError:
                pass  # a refused call changes nothing; the totals must still match
            stats = manager.statistics()
            totals, attached = _recount(manager, removed)
            assert stats.history == totals
            assert stats.areas.attached == attached
            assert stats.contexts == len(manager.context_ids())
        before_close = manager.statistics()
    closed = manager.statistics()
    # Closing releases every history: nothing held, every total kept.
    assert (closed.history.turns, closed.history.items, closed.history.bytes) == (0, 0, 0)
    assert closed.history.evicted_turns_total == before_close.history.evicted_turns_total
    assert closed.areas.attached == 0
    return before_close


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=40)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(OPERATIONS), st.sampled_from(CONTEXTS)), min_size=1, max_size=40
    )
)
def test_running_totals_equal_a_brute_force_recount(
    backend: str, steps: list[tuple[str, str]]
) -> None:
    """Invariant: after every operation (commits, records, blank and late outputs,
    evictions held back by a model call, area attach and collection, removals,
    close), the O(1) statistics equal the totals recounted over all contexts."""
    anyio.run(_drive, steps, backend=backend)


def test_the_recount_is_not_vacuous() -> None:
    """A fixed sequence moves every counter the recount compares: three evictions
    (4 items each: the limit is 6 items), one blank and one late output dropped,
    an area attached, then the context removed and created again."""
    steps: list[tuple[str, str]] = [("accept", "a")] + [("record", "a"), ("accept", "a")] * 4
    steps += [("record_blank", "a"), ("record_late", "a"), ("attach", "a"), ("prepare", "a")]
    steps += [("remove", "a"), ("accept", "a")]
    stats = anyio.run(_drive, steps)
    history = stats.history
    assert (history.turns, history.items) == (1, 1)
    assert (history.evicted_turns_total, history.evicted_items_total) == (3, 12)
    assert (history.dropped_late_outputs_total, history.dropped_blank_outputs_total) == (1, 1)
    assert (stats.areas.registered_total, stats.areas.attached) == (1, 0)

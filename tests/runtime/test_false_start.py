"""A voice host's false start at the history limits, through the manager.

Invariant: ``voice.retract_turn`` of a false start whose acceptance evicted
turns gives them back: the next turn's prepare holds them, byte for byte as
before the false start, and the manager's eviction totals (statistics and
Prometheus counters, which only grow) never counted them. Turns held aside
count as evicted once they can no longer be restored: at the context's next
change, or its removal.
"""

from __future__ import annotations

import pytest

from tests.runtime.helpers import SYSTEM, assistant, user
from turnloom.context.history import HistoryLimits
from turnloom.runtime import ContextManager, ContextPrepareRequest, Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio


def _accept(manager: ContextManager, turn_id: str, text: str) -> None:
    first = turn_id == "t1"
    manager.accept_turn(
        TurnSnapshot(
            context_id="c",
            turn_id=turn_id,
            input=(user(text),),
            instructions=(SYSTEM,) if first else None,
        )
    )


async def _prefix(manager: ContextManager, turn_id: str) -> bytes:
    prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id=turn_id))
    return manager.request_bytes(prepared)


async def test_the_next_prepare_after_a_false_start_at_the_limit_holds_the_restored_turn() -> None:
    """Invariant: at max_turns=3, the false start t4 evicts t1 (held aside: turns 3, no
    eviction counted); after its retraction the history holds t1..t3 again and t5's
    prepare is what it would have been without the false start; t5's answer then lets
    t1 go for good (evicted_turns_total 1, once)."""
    limits = HistoryLimits(max_turns=3)
    async with (
        Foundation(history_limits=limits) as foundation,
        Foundation(history_limits=limits) as control,
    ):
        manager, plain = foundation.manager, control.manager
        for m in (manager, plain):
            for n in (1, 2, 3):
                _accept(m, f"t{n}", f"question {n}")
                m.record("c", f"t{n}", [assistant(f"answer {n}")])
        held = manager.statistics().history
        assert (held.turns, held.items, held.evicted_turns_total) == (3, 6, 0)
        _accept(manager, "t4", "uh")
        assert manager.history("c").turn_ids == ("t2", "t3", "t4")
        totals = manager.statistics().history
        assert (totals.turns, totals.items, totals.evicted_turns_total) == (3, 5, 0)
        await _prefix(manager, "t4")  # the false start was prepared before it was seen as one
        manager.voice.retract_turn("c", "t4")
        assert manager.history("c").turn_ids == ("t1", "t2", "t3")
        totals = manager.statistics().history
        assert (totals.turns, totals.items, totals.bytes, totals.tokens) == (
            held.turns,
            held.items,
            held.bytes,
            held.tokens,
        )
        assert (totals.evicted_turns_total, totals.evicted_items_total) == (0, 0)
        assert totals.retracted_turns_total == 1
        for m in (manager, plain):
            _accept(m, "t5", "question 5")
        assert manager.history("c").turn_ids == plain.history("c").turn_ids == ("t2", "t3", "t5")
        assert await _prefix(manager, "t5") == await _prefix(plain, "t5")
        assert manager.statistics().history.evicted_turns_total == 0  # t1 held aside for t5
        manager.record("c", "t5", [assistant("answer 5")])
        totals = manager.statistics().history
        assert (totals.turns, totals.evicted_turns_total, totals.evicted_items_total) == (3, 1, 2)


async def test_removing_a_context_counts_the_turns_it_held_aside_as_evicted() -> None:
    """Invariant: a removed context's turns held aside can no longer be restored: the
    removal counts them (evicted_turns_total 1, evicted_items_total 2), and the held
    totals drop to zero."""
    async with Foundation(history_limits=HistoryLimits(max_turns=1)) as foundation:
        manager = foundation.manager
        _accept(manager, "t1", "question 1")
        manager.record("c", "t1", [assistant("answer 1")])
        _accept(manager, "t2", "uh")
        assert manager.statistics().history.evicted_turns_total == 0
        manager.remove_context("c")
        totals = manager.statistics().history
        assert (totals.turns, totals.items, totals.bytes, totals.tokens) == (0, 0, 0, 0)
        assert (totals.evicted_turns_total, totals.evicted_items_total) == (1, 2)

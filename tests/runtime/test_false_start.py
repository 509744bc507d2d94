"""A voice host's false start at the history limits, through the manager.

Invariant: ``voice.retract_turn`` of a false start whose acceptance evicted
turns gives them back: the next turn's prepare holds them, byte for byte as
before the false start, and the manager's eviction totals (statistics and
Prometheus counters, which only grow) never counted them. Turns held aside
count as evicted once they can no longer be restored: at the context's next
change, or its removal.
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import pytest

from tests.runtime.helpers import SYSTEM, BlockingGateway, assistant, user
from turnloom.context.history import HistoryLimits
from turnloom.errors import (
    InvalidMessageError,
    StateError,
    UnknownContextError,
    UnknownTurnError,
)
from turnloom.runtime import (
    ContextManager,
    ContextPrepareRequest,
    Foundation,
    TurnSnapshot,
)

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
    limits = HistoryLimits(low_water=1.0, max_turns=3)
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
    async with Foundation(history_limits=HistoryLimits(low_water=1.0, max_turns=1)) as foundation:
        manager = foundation.manager
        _accept(manager, "t1", "question 1")
        manager.record("c", "t1", [assistant("answer 1")])
        _accept(manager, "t2", "uh")
        assert manager.statistics().history.evicted_turns_total == 0
        manager.remove_context("c")
        totals = manager.statistics().history
        assert (totals.turns, totals.items, totals.bytes, totals.tokens) == (0, 0, 0, 0)
        assert (totals.evicted_turns_total, totals.evicted_items_total) == (1, 2)


async def _observed(manager: ContextManager) -> tuple[Any, ...]:
    """The history, its turns held aside, the totals and t3's next request bytes."""
    view = manager.history("c")
    history = manager._table.contexts["c"].history
    return (
        [(t, view.turn_messages(t)) for t in view.turn_ids],
        history.restorable_ids,
        history.evicted_ids,
        history.statistics(),
        manager.statistics().history,
        await _prefix(manager, "t3"),
    )


async def test_a_refused_retraction_changes_nothing_and_a_retry_after_the_call_restores() -> None:
    """Invariant: with t1 held aside by the false start t4 (max_turns=3), retracting a
    malformed id, an unknown turn, the held-aside t1, an older turn, or t4 while its model
    call is in flight raises the documented typed error and changes nothing (history,
    turns held aside, statistics, totals, the next request bytes); t4's aborted call ends
    (a safe point, nothing more to evict), and retracting t4 then restores t1; a second
    retraction of t4 raises UnknownTurnError and changes nothing."""
    async with Foundation(history_limits=HistoryLimits(low_water=1.0, max_turns=3)) as foundation:
        manager = foundation.manager
        for n in (1, 2, 3):
            _accept(manager, f"t{n}", f"question {n}")
            manager.record("c", f"t{n}", [assistant(f"answer {n}")])
        before = await _observed(manager)
        _accept(manager, "t4", "uh")
        held = await _observed(manager)
        assert held[1] == ("t1",)
        refusals: list[tuple[str, type[Exception]]] = [
            ("", InvalidMessageError),
            ("t9", UnknownTurnError),
            ("t1", UnknownTurnError),
            ("t2", StateError),
        ]
        for turn_id, error in refusals:
            with pytest.raises(error):
                manager.voice.retract_turn("c", turn_id)
            assert await _observed(manager) == held, turn_id
        with pytest.raises(UnknownContextError):
            manager.voice.retract_turn("d", "t4")
        async with manager.invocation("c", "t4"):
            with pytest.raises(StateError, match="in flight"):
                manager.voice.retract_turn("c", "t4")
        assert await _observed(manager) == held
        manager.voice.retract_turn("c", "t4")
        after = await _observed(manager)
        stats = msgspec.structs.replace(before[3], retracted_turns=1)
        totals = msgspec.structs.replace(before[4], retracted_turns_total=1)
        assert after == (before[0], (), ("t4",), stats, totals, before[5])
        with pytest.raises(UnknownTurnError):
            manager.voice.retract_turn("c", "t4")
        assert await _observed(manager) == after


@pytest.mark.parametrize("phase", ["waiting", "rendering"])
async def test_a_false_start_retracted_while_its_prepare_waits_or_renders(phase: str) -> None:
    """Invariant: the false start t4 (evicting t1 at max_turns=3) is retracted while a
    prepare of it waits for its commit ("waiting") or renders in a worker thread
    ("rendering": its result is discarded, counted as discarded); either way the prepare
    raises UnknownTurnError and delivers nothing, the history is t1..t3 again, no
    eviction is counted, and t5's request bytes equal a manager's that never saw t4."""
    gateway = BlockingGateway()
    limits = HistoryLimits(low_water=1.0, max_turns=3)
    async with (
        Foundation(gateway=gateway, history_limits=limits) as foundation,
        Foundation(gateway="openai_chat", history_limits=limits) as control,
    ):
        manager, plain = foundation.manager, control.manager
        for m in (manager, plain):
            for n in (1, 2, 3):
                _accept(m, f"t{n}", f"question {n}")
                m.record("c", f"t{n}", [assistant(f"answer {n}")])
        outcome: list[object] = []

        async def prepare_t4() -> None:
            try:
                request = ContextPrepareRequest(context_id="c", turn_id="t4", loop_budget=1)
                outcome.append(await manager.prepare(request))
            except UnknownTurnError as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            if phase == "waiting":
                tg.start_soon(prepare_t4)
                await anyio.wait_all_tasks_blocked()
                _accept(manager, "t4", "uh")
            else:
                _accept(manager, "t4", "uh")
                gateway.hold = True
                tg.start_soon(prepare_t4)
                with anyio.fail_after(10):
                    await anyio.to_thread.run_sync(gateway.entered.wait, 10)
            assert manager._table.contexts["c"].history.restorable_ids == ("t1",)
            manager.voice.retract_turn("c", "t4")
            gateway.hold = False
            gateway.release.set()
        assert manager.history("c").turn_ids == ("t1", "t2", "t3")
        # Either way, not by the race: the retracted turn's input is never delivered.
        assert [type(o) for o in outcome] == [UnknownTurnError]
        stats = manager.statistics()
        assert (stats.preparations.prepared_total, stats.preparations.discarded_total) == (
            0,
            1 if phase == "rendering" else 0,
        )
        assert stats.history.evicted_turns_total == 0
        for m in (manager, plain):
            _accept(m, "t5", "question 5")
        assert await _prefix(manager, "t5") == await _prefix(plain, "t5")

"""A false start at the history limits, through a durable store.

Every test runs on a real SQLite file (asyncio and trio) and on the real Redis
server (asyncio). Invariant: the log a host writes for a false start accepted
at the limits (evicting) and retracted replays into the history the live host
holds, whether the store compacted the log into a checkpoint in between (the
checkpoint holds the turns held aside, then logs their eviction) or not; and a
host restoring the log before the retraction restores the same turns when it
retracts.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.runtime.helpers import SYSTEM, assistant, call, result, user
from tests.stores.helpers import hosting
from turnloom.context.history import HistoryLimits
from turnloom.runtime import (
    ContextContribution,
    ContextManager,
    ContextPrepareRequest,
    TurnSnapshot,
    _durable,
)

pytestmark = pytest.mark.anyio

LIMITS = HistoryLimits(max_turns=3)


def _request(turn_id: str) -> ContextPrepareRequest:
    return ContextPrepareRequest(
        context_id="c",
        turn_id=turn_id,
        contributions=(ContextContribution(name="memory", content="likes aisles"),),
    )


async def _converse(manager: ContextManager) -> None:
    """t0..t2: a call, its result and an answer each, a kept pair on each (prepared)."""
    for i in range(3):
        manager.accept_turn(
            TurnSnapshot(
                context_id="c",
                turn_id=f"t{i}",
                input=(user(f"question {i}"),),
                instructions=(SYSTEM,) if i == 0 else None,
            )
        )
        await manager.prepare(_request(f"t{i}"))
        manager.record("c", f"t{i}", [call(f"k{i}"), result(f"k{i}", f"found {i}")])
        manager.record("c", f"t{i}", [assistant(f"answer {i}")])


def _held(manager: ContextManager) -> dict[str, Any]:
    """Everything the context's history holds, and the turn ids it remembers as gone."""
    view = manager.history("c")
    history = manager._table.contexts["c"].history
    return {
        "turns": [(t, view.turn_messages(t), view.turn_state(t)) for t in view.turn_ids],
        "pinned": view.pinned,
        "evicted": history.evicted_ids,
        "restorable": history.restorable_ids,
    }


@pytest.fixture(params=[False, True], ids=["log", "checkpoint"])
def compacting(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """With True, every flush compacts the log (a checkpoint while turns are held aside)."""
    if request.param:
        monkeypatch.setattr(_durable, "_COMPACT_MIN", 1)
        monkeypatch.setattr(_durable, "_COMPACT_PER_TURN", 1)
    return bool(request.param)


async def test_a_retracted_false_start_replays_into_the_live_history(
    store_url: str, compacting: bool
) -> None:
    """Invariant: t3 (a false start, prepared: its pair kept) evicts t0; the log (maybe
    compacted while t0 is held aside) and the retraction replay into what the live host
    holds: t0..t2 with their pairs, t3 remembered as gone, the same request bytes."""
    async with hosting(store_url, history_limits=LIMITS) as first:
        manager = first.manager
        await manager.leases.claim("c")
        await _converse(manager)
        before = _held(manager)
        expected = manager.request_bytes(await manager.prepare(_request("t2")))
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t3", input=(user("uh"),)))
        await manager.prepare(_request("t3"))
        assert _held(manager)["restorable"] == ("t0",)
        await manager.leases.flush()
        stats = manager.statistics().store
        assert stats is not None and (stats.compactions_total > 0) is compacting
        manager.voice.retract_turn("c", "t3")
        await manager.leases.flush()
        live = _held(manager)
        assert live == {**before, "evicted": ("t3",)}
        assert manager.request_bytes(await manager.prepare(_request("t2"))) == expected
    async with hosting(store_url, history_limits=LIMITS) as second:
        manager = second.manager
        assert await manager.leases.claim("c") is True
        assert _held(manager) == live
        assert manager.request_bytes(await manager.prepare(_request("t2"))) == expected


async def test_a_host_restoring_a_false_start_restores_its_evicted_turns_on_retraction(
    store_url: str, compacting: bool
) -> None:
    """Invariant: the first host accepts the false start t3 (evicting t0) and stops; the
    second restores the log (maybe a checkpoint holding t0, then t0's eviction), holds
    t0 aside as the first did, and retracting t3 there brings t0 back: the history and
    the request bytes of t2 are the first host's before the false start."""
    async with hosting(store_url, history_limits=LIMITS) as first:
        manager = first.manager
        await manager.leases.claim("c")
        await _converse(manager)
        before = _held(manager)
        expected = manager.request_bytes(await manager.prepare(_request("t2")))
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t3", input=(user("uh"),)))
        await manager.prepare(_request("t3"))
        aside = _held(manager)
        await manager.leases.flush()
        stats = manager.statistics().store
        assert stats is not None and (stats.compactions_total > 0) is compacting
    async with hosting(store_url, history_limits=LIMITS) as second:
        manager = second.manager
        assert await manager.leases.claim("c") is True
        assert _held(manager) == aside
        assert aside["restorable"] == ("t0",)
        manager.voice.retract_turn("c", "t3")
        assert _held(manager) == {**before, "evicted": ("t3",)}
        assert manager.request_bytes(await manager.prepare(_request("t2"))) == expected
        totals = manager.statistics().history
        assert (totals.evicted_turns_total, totals.retracted_turns_total) == (0, 1)

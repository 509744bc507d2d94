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

from tests.runtime import test_false_start_summary as summary_case
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
from turnloom.runtime._records import decode_record, replay
from turnloom.stores import open_context_store

pytestmark = pytest.mark.anyio

# Per-turn eviction (t3 evicts t0), and down to a low-water mark of 2 turns (t3
# evicts t0 and t1 at once: a retraction must restore both).
EVICTIONS = {
    "per-turn": (HistoryLimits(low_water=1.0, max_turns=3), ("t0",)),
    "low-water": (HistoryLimits(max_turns=3, low_water=0.67), ("t0", "t1")),
}


@pytest.fixture(params=list(EVICTIONS))
def eviction(request: pytest.FixtureRequest) -> tuple[HistoryLimits, tuple[str, ...]]:
    """The history limits, and the turns the false start t3 evicts under them."""
    return EVICTIONS[request.param]


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


async def _accept_false_start(
    manager: ContextManager, compacting: bool, gone: tuple[str, ...] = ("t0",)
) -> tuple[dict[str, Any], bytes]:
    """After t0..t2, the false start t3 (prepared: its pair kept) evicts t0; the log is
    flushed, compacted when ``compacting``. Returns what the history held and t2's
    request bytes before t3."""
    await _converse(manager)
    before = _held(manager)
    expected = manager.request_bytes(await manager.prepare(_request("t2")))
    manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t3", input=(user("uh"),)))
    await manager.prepare(_request("t3"))
    assert _held(manager)["restorable"] == gone
    await manager.leases.flush()
    stats = manager.statistics().store
    assert stats is not None and (stats.compactions_total > 0) is compacting
    return before, expected


@pytest.fixture(params=[False, True], ids=["log", "checkpoint"])
def compacting(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """With True, every flush compacts the log (a checkpoint while turns are held aside)."""
    if request.param:
        monkeypatch.setattr(_durable, "_COMPACT_MIN", 1)
        monkeypatch.setattr(_durable, "_COMPACT_PER_TURN", 1)
    return bool(request.param)


async def test_a_retracted_false_start_replays_into_the_live_history(
    store_url: str, compacting: bool, eviction: tuple[HistoryLimits, tuple[str, ...]]
) -> None:
    """Invariant: t3 (a false start, prepared: its pair kept) evicts t0 (and t1 down to a
    low-water mark); the log (maybe compacted while they are held aside) and the
    retraction replay into what the live host holds: t0..t2 with their pairs, t3
    remembered as gone, the same request bytes."""
    limits, gone = eviction
    async with hosting(store_url, history_limits=limits) as first:
        manager = first.manager
        await manager.leases.claim("c")
        before, expected = await _accept_false_start(manager, compacting, gone)
        manager.voice.retract_turn("c", "t3")
        await manager.leases.flush()
        live = _held(manager)
        assert live == {**before, "evicted": ("t3",)}
        assert manager.request_bytes(await manager.prepare(_request("t2"))) == expected
    async with hosting(store_url, history_limits=limits) as second:
        manager = second.manager
        assert await manager.leases.claim("c") is True
        assert _held(manager) == live
        assert manager.request_bytes(await manager.prepare(_request("t2"))) == expected


async def test_a_host_restoring_a_false_start_restores_its_evicted_turns_on_retraction(
    store_url: str, compacting: bool, eviction: tuple[HistoryLimits, tuple[str, ...]]
) -> None:
    """Invariant: the first host accepts the false start t3 (evicting t0, and t1 down to
    a low-water mark) and stops; the second restores the log (maybe a checkpoint holding
    them, then their eviction), holds them aside as the first did, and retracting t3
    there brings them back: the history and the request bytes of t2 are the first
    host's before the false start."""
    limits, gone = eviction
    async with hosting(store_url, history_limits=limits) as first:
        manager = first.manager
        await manager.leases.claim("c")
        before, expected = await _accept_false_start(manager, compacting, gone)
        aside = _held(manager)
    async with hosting(store_url, history_limits=limits) as second:
        manager = second.manager
        assert await manager.leases.claim("c") is True
        assert _held(manager) == aside
        assert aside["restorable"] == gone
        manager.voice.retract_turn("c", "t3")
        assert _held(manager) == {**before, "evicted": ("t3",)}
        assert manager.request_bytes(await manager.prepare(_request("t2"))) == expected
        totals = manager.statistics().history
        assert (totals.evicted_turns_total, totals.retracted_turns_total) == (0, 1)


async def _aborted_false_start(manager: ContextManager, change: str) -> None:
    """t3 (a false start) evicts t0, then its kept pair changes: it "shrank" (a pair
    over max_items=20 evicted t0 at the end of an aborted model call, then a prepare
    without contributions keeps none) or it "grew" (the commit over max_bytes=3800
    evicted t0, then a prepare keeps a pair putting the history over again: keeping
    does not evict)."""
    manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t3", input=(user("uh"),)))
    if change == "shrank":
        await manager.prepare(_request("t3"))  # t3 keeps a pair: 21 items
        async with manager.invocation("c", "t3"):
            pass  # aborted: no output; its end evicts t0
        await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t3"))
    else:
        contribution = ContextContribution(name="memory", content="x" * 700)
        await manager.prepare(
            ContextPrepareRequest(context_id="c", turn_id="t3", contributions=(contribution,))
        )


@pytest.mark.parametrize(
    ("change", "limits"),
    [
        ("shrank", HistoryLimits(low_water=1.0, max_items=20)),
        ("grew", HistoryLimits(low_water=1.0, max_bytes=3800)),
    ],
)
async def test_a_checkpoint_replays_the_evictions_a_false_start_caused_before_its_pair_changed(
    store_url: str, change: str, limits: HistoryLimits
) -> None:
    """Invariant: the checkpoint written while turns are held aside replays into the live
    history when the false start's kept pair changed after the eviction it caused: it
    holds t3 as that eviction found it, then the eviction, then t3's pair now; the
    stored log replays into the live history (t0 held aside, t3's pair; over the limits
    when it grew, as live: keeping does not evict), a second host restores it, and
    retracting t3 there gives back the first host's history and t2 request bytes."""
    async with hosting(store_url, history_limits=limits) as first:
        manager = first.manager
        await manager.leases.claim("c")
        await _converse(manager)  # t0..t2: 6 items (input, pair, call, result, answer) each
        expected = manager.request_bytes(await manager.prepare(_request("t2")))
        before = _held(manager)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_durable, "_COMPACT_MIN", 1)
            patch.setattr(_durable, "_COMPACT_PER_TURN", 1)
            await _aborted_false_start(manager, change)  # every flush compacts
            await manager.leases.flush()
            async with open_context_store(store_url) as store:
                log = await store.load("c")
        aside = _held(manager)
        assert aside["restorable"] == ("t0",)
        assert len(aside["turns"][-1][2]) == (0 if change == "shrank" else 2)  # t3's pair
        kinds = [type(decode_record(data, "c", i)).__name__ for i, data in enumerate(log)]
        assert kinds == ["Checkpoint", "TurnsEvicted", "StateKept"]
        replayed = replay("c", log, limits)
        assert (replayed.view().turn_ids, replayed.restorable_ids) == (("t1", "t2", "t3"), ("t0",))
        assert replayed.view().turn_state("t3") == aside["turns"][-1][2]
    async with hosting(store_url, history_limits=limits) as second:
        manager = second.manager
        assert await manager.leases.claim("c") is True
        assert _held(manager) == aside
        manager.voice.retract_turn("c", "t3")
        assert _held(manager) == {**before, "evicted": ("t3",)}
        assert manager.request_bytes(await manager.prepare(_request("t2"))) == expected


async def test_a_host_restoring_a_false_start_that_evicted_the_summary_restores_it_first(
    store_url: str, compacting: bool
) -> None:
    """Invariant: the first host's false start t5 evicts t3 at its commit, then t4 and the
    summary turn at the end of its model call (no output; its kept pair puts the summary
    and t5 alone over max_tokens) and stops; the second host restores the log (maybe a
    checkpoint holding them aside, then their evictions) and retracting t5 there gives
    back (summary, t3, t4) in that order: the first host's history and t4 request bytes
    before the false start."""
    limits = summary_case.LIMITS
    async with hosting(store_url, history_limits=limits) as first:
        manager = first.manager
        await manager.leases.claim("c")
        await summary_case._summarized(manager)
        summary = manager.history("c").turn_ids[0]
        before = _held(manager)
        expected, _ = await summary_case._prepare(manager, "t4")
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t5", input=(user("uh"),)))
        await summary_case._prepare(manager, "t5", summary_case.NOTES)
        async with manager.invocation("c", "t5"):
            pass
        aside = _held(manager)
        assert [t[0] for t in aside["turns"]] == ["t5"]
        assert aside["restorable"] == (summary, "t3", "t4")
        await manager.leases.flush()
        stats = manager.statistics().store
        assert stats is not None and (stats.compactions_total > 0) is compacting
    async with hosting(store_url, history_limits=limits) as second:
        manager = second.manager
        assert await manager.leases.claim("c") is True
        assert _held(manager) == aside
        manager.voice.retract_turn("c", "t5")
        assert _held(manager) == {**before, "evicted": (*before["evicted"], "t5")}
        assert [t[0] for t in _held(manager)["turns"]] == [summary, "t3", "t4"]
        assert (
            manager.request_bytes(
                await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t4"))
            )
            == expected
        )

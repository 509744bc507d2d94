"""Durable round trips: what a host held, another host restores and prepares byte for byte.

SQLite on asyncio and trio. The real tau-bench transcripts are driven by
:mod:`tests.stores.roundtrip` (barge-ins, retractions, cancelled calls, kept
runtime-state pairs, ids reused across turns and contexts, approval chains,
refused commits and records, checkpoints written while a model call is in
flight); the exact case below is the one those found.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runtime.helpers import SYSTEM, assistant, call, result, user
from tests.stores.helpers import hosting
from tests.stores.roundtrip import FORMS, round_trip, transcripts
from turnloom.context import GatewayType
from turnloom.context.history import HistoryLimits
from turnloom.errors import PairedTurnsTooLargeError
from turnloom.runtime import ContextPrepareRequest, TurnSnapshot, _durable

pytestmark = pytest.mark.anyio

ROUND_TRIP_LIMITS = (
    HistoryLimits(max_turns=2),
    HistoryLimits(max_turns=4, max_items=20, max_bytes=6000),
    HistoryLimits(max_turns=6, max_items=30, max_bytes=9000, low_water=0.5),
)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """SQLite runs on both loops (the stores' conftest adds Redis, not needed here)."""
    return str(request.param)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(
    "limits", ROUND_TRIP_LIMITS, ids=("turns2", "turns4-items20-bytes6k", "low-water")
)
@pytest.mark.parametrize("kind", list(GatewayType), ids=lambda k: k.value)
async def test_real_transcripts_restore_to_the_same_request_bytes(
    tau_bench_path: Path, tmp_path: Path, kind: GatewayType, limits: HistoryLimits, form: str
) -> None:
    """Invariant: two tau-bench transcripts, each on two contexts, driven with every awkward
    host move; every refusal leaves the history and the log as they were, and after a
    release another host's prepare of each newest turn equals the first host's request
    bytes exactly, though its log was compacted into checkpoints along the way."""
    refusals = compactions = 0
    for index, transcript in enumerate(transcripts(tau_bench_path, 2)):
        outcome = await round_trip(tmp_path / f"{index}.db", transcript, kind, limits, form, index)
        assert outcome.mismatches == []
        assert outcome.refusals_that_changed == []
        refusals += sum(outcome.refusals.values())
        compactions += outcome.compactions
    assert refusals > 0 and compactions > 0  # the moves above were exercised


async def test_an_output_landing_after_a_barge_in_restores_from_a_checkpoint_written_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: t2 answers t1's call (t1..t2 tied, 3 items of max_items=4); while t2's
    model call is in flight the user barges in (t3) and the store compacts the log into a
    checkpoint (t1..t3, eviction held back). The call's two-message output, landing late
    on t2, would make t1..t2 hold 5 items: it is refused as it would be were t2 newest
    (PairedTurnsTooLargeError), nothing logged; one message is recorded. Another host
    restores the checkpoint and the records after it and prepares t3 byte for byte as the
    first host did (before, the record was accepted, and a checkpoint written while the
    call was still in flight held t1..t2 over the limit and failed to replay with
    StoreRecordError: a host crashing then left a context no claim could restore)."""
    monkeypatch.setattr(_durable, "_COMPACT_MIN", 1)
    monkeypatch.setattr(_durable, "_COMPACT_PER_TURN", 1)
    url = f"sqlite:{tmp_path / 'c.db'}"
    limits = HistoryLimits(max_items=4)
    request = ContextPrepareRequest(context_id="c", turn_id="t3")
    async with hosting(url, history_limits=limits) as first:
        manager = first.manager
        await manager.leases.claim("c")
        manager.accept_turn(
            TurnSnapshot(
                context_id="c", turn_id="t1", input=(user("Rebook me."),), instructions=(SYSTEM,)
            )
        )
        manager.record("c", "t1", [call("c1", "rebook")])
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(result("c1"),)))
        async with manager.invocation("c", "t2") as invocation:
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t3", input=(user("Wait."),)))
            await manager.leases.flush()
            stats = manager.statistics().store
            assert stats is not None and stats.compactions_total == 1
            messages = manager.history("c").messages()
            with pytest.raises(PairedTurnsTooLargeError) as caught:
                invocation.record([assistant("Rebooked."), assistant("Anything else?")])
            assert (caught.value.turn_id, caught.value.first_turn_id) == ("t2", "t1")
            assert manager.history("c").messages() == messages
            stats = manager.statistics().store
            assert stats is not None and stats.pending_records == 0
            assert invocation.record([assistant("Rebooked.")]) == 1
        assert manager.history("c").turn_ids == ("t3",)  # t1..t2 left together
        expected = manager.request_bytes(await manager.prepare(request))
    async with hosting(url, history_limits=limits) as second:
        manager = second.manager
        assert await manager.leases.claim("c") is True
        assert manager.history("c").turn_ids == ("t3",)
        assert manager.request_bytes(await manager.prepare(request)) == expected

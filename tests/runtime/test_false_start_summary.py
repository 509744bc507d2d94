"""A voice host's false start whose model call's end evicts the summary turn, through the manager.

Invariant: a false start whose commit evicts an answered turn, whose delivered
runtime-state pair then makes the summary turn and the false start alone
exceed a hard limit (the end of its model call, with no output, evicts the
summary turn too), is retracted by ``voice.retract_turn`` into the history
as it was before the false start, in its order: the summary turn first, then
the turns both evictions held aside. The next prepares are byte for byte a
manager's that never saw the false start, and a cold render of the history.
Runs on asyncio and trio.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from tests.runtime.helpers import SYSTEM, assistant, user
from tests.runtime.stress import cold_render
from tests.runtime.test_summaries import Fake, _settle
from turnloom.context import CompactionPolicy
from turnloom.context.history import HistoryLimits
from turnloom.context.summaries import is_summary_turn
from turnloom.runtime import (
    ContextContribution,
    ContextManager,
    ContextPrepareRequest,
    Foundation,
    TurnSnapshot,
)

pytestmark = pytest.mark.anyio

# Three turns; 120 tokens hold the summary and two short turns (about 40), not
# the false start's runtime-state pair (about 190) beside anything.
LIMITS = HistoryLimits(low_water=1.0, max_turns=3, max_tokens=120)
NOTES = (ContextContribution(name="memory", content="note " * 100),)


def _accept(manager: ContextManager, turn_id: str, text: str) -> None:
    manager.accept_turn(
        TurnSnapshot(
            context_id="c",
            turn_id=turn_id,
            input=(user(text),),
            instructions=(SYSTEM,) if turn_id == "t1" else None,
        )
    )


async def _prepare(
    manager: ContextManager, turn_id: str, contributions: Sequence[ContextContribution] = ()
) -> tuple[bytes, bool]:
    """The turn's request bytes, and whether its items before the state pair are a cold render."""
    request = ContextPrepareRequest(
        context_id="c", turn_id=turn_id, contributions=tuple(contributions)
    )
    prepared = await manager.prepare(request)
    pair = 0 if prepared.state_call_id is None else 2
    core = list(prepared.items[: prepared.area_start - pair])
    return manager.request_bytes(prepared), core == cold_render(manager, "c", turn_id)


async def _summarized(manager: ContextManager) -> None:
    """t1, t2 summarized, then t3 and t4 answered: the history is (summary, t3, t4)."""
    manager.summaries.summarizer = Fake()
    manager.summaries.policy = CompactionPolicy(trigger_turns=2, keep_turns=1)
    for n in (1, 2, 3):
        _accept(manager, f"t{n}", f"question {n}")
        manager.record("c", f"t{n}", [assistant(f"answer {n}")])
        await _settle()
    manager.summaries.policy = None  # no later summary: the false start meets this one
    _accept(manager, "t4", "question 4")
    await _prepare(manager, "t4")
    manager.record("c", "t4", [assistant("answer 4")])


@pytest.mark.parametrize("end", ["returned", "cancelled"])
async def test_a_summary_evicted_by_a_false_starts_call_end_is_restored_first(end: str) -> None:
    """Invariant: at max_turns=3, max_tokens=120, the false start t5 evicts t3 at its
    commit; its prepare keeps a large runtime-state pair; its model call ends with no
    output (the block returns, or a barge-in cancels it) and evicts t4 and the summary
    turn (t5 alone is held). voice.retract_turn(t5) restores (summary, t3, t4) in that
    order, with the messages and totals of before t5 and no eviction counted; t4's and
    t6's prepares are byte for byte a manager's that never saw t5, and cold renders."""
    async with (
        Foundation(history_limits=LIMITS) as foundation,
        Foundation(history_limits=LIMITS) as control,
    ):
        manager, plain = foundation.manager, control.manager
        for m in (manager, plain):
            await _summarized(m)
        summary = plain.history("c").turn_ids[0]
        assert is_summary_turn(summary)
        assert manager.history("c").turn_ids == plain.history("c").turn_ids == (summary, "t3", "t4")
        before = manager.history("c")
        held = manager.statistics().history
        prefix, cold = await _prepare(manager, "t4")
        assert cold

        _accept(manager, "t5", "uh")  # the first eviction: t3, held aside
        assert manager.history("c").turn_ids == (summary, "t4", "t5")
        await _prepare(manager, "t5", NOTES)  # keeps t5's large pair; evicts nothing
        assert manager.history("c").turn_ids == (summary, "t4", "t5")
        if end == "returned":
            async with manager.invocation("c", "t5"):
                pass
        else:
            with anyio.CancelScope() as barge_in:
                async with manager.invocation("c", "t5"):
                    barge_in.cancel()
                    await anyio.sleep_forever()
        # The second eviction: t4, and the summary, which with t5 alone is over 120 tokens.
        assert manager.history("c").turn_ids == ("t5",)
        assert manager.statistics().history.evicted_turns_total == 0

        manager.voice.retract_turn("c", "t5")
        assert manager.history("c").turn_ids == (summary, "t3", "t4")
        assert manager.history("c").messages() == before.messages()
        totals = manager.statistics().history
        assert (totals.turns, totals.items, totals.bytes, totals.tokens) == (
            held.turns,
            held.items,
            held.bytes,
            held.tokens,
        )
        assert (totals.evicted_turns_total, totals.retracted_turns_total) == (0, 1)
        assert await _prepare(manager, "t4") == (prefix, True)
        assert (await _prepare(plain, "t4"))[0] == prefix

        for m in (manager, plain):
            _accept(m, "t6", "question 6")
        assert manager.history("c").turn_ids == plain.history("c").turn_ids == (summary, "t4", "t6")
        next_turn = await _prepare(manager, "t6")
        assert next_turn == await _prepare(plain, "t6")
        assert next_turn[1]

"""A prepare that no tracer records takes the span-free path and ends as the traced one does.

Source: DESIGN rule 5 (a cancelled requester's preparation still settles and
frees its slot) and the tracing contract of ``turnloom.runtime._tracing``
(without a recording tracer nothing is traced, and the result is the same).
"""

from __future__ import annotations

import anyio
import pytest

from tests.runtime.helpers import SYSTEM, assistant, user
from turnloom.runtime import (
    ContextPrepareRequest,
    Foundation,
    PreparedContext,
    TurnSnapshot,
    _tracing,
)

pytestmark = pytest.mark.anyio


def _commit(manager: object, turn: int) -> None:
    manager.accept_turn(  # type: ignore[attr-defined]
        TurnSnapshot(
            context_id="c",
            turn_id=f"t{turn}",
            input=(user(f"question {turn}"),),
            instructions=(SYSTEM,) if turn == 0 else None,
        )
    )


def _fields(prepared: PreparedContext) -> tuple[object, ...]:
    return (
        prepared.items,
        prepared.item_count,
        prepared.bytes,
        prepared.tokens,
        prepared.turn_start,
        prepared.reused_bytes,
        prepared.reserved_ids,
    )


async def test_an_untraced_prepare_leaves_no_trace_in_the_task_and_delivers_the_prefix() -> None:
    """Three turns, each prepared and answered: exact items; reuse counted from the
    last delivered prefix (delivery ran); no prepare trace is left current."""
    assert _tracing.current_prepare() is None
    async with Foundation() as foundation:
        manager = foundation.manager
        seen = []
        for turn in range(3):
            _commit(manager, turn)
            prepared = await manager.prepare(
                ContextPrepareRequest(context_id="c", turn_id=f"t{turn}")
            )
            assert _tracing.current_prepare() is None
            seen.append(_fields(prepared))
            async with manager.invocation("c", f"t{turn}") as invocation:
                invocation.record([assistant(f"answer {turn}")])
        assert seen[2][0] == (
            {"role": "system", "content": SYSTEM.content[0].text},  # type: ignore[union-attr]
            {"role": "user", "content": "question 0"},
            {"role": "assistant", "content": "answer 0"},
            {"role": "user", "content": "question 1"},
            {"role": "assistant", "content": "answer 1"},
            {"role": "user", "content": "question 2"},
        )
        # The second and third prefixes reuse all of the one delivered before them.
        assert [fields[5] for fields in seen] == [0, seen[0][2], seen[1][2]]
        stats = manager.statistics().preparations
        assert (stats.prepared_total, stats.discarded_total, stats.pending) == (3, 0, 0)


async def test_prepare_nowait_cancelled_at_its_checkpoint_after_an_inline_render_discards_it() -> (
    None
):
    """prepare_nowait renders a small prepare inline, then passes one checkpoint holding
    its slot: a requester cancelled there gets nothing delivered (the context's last
    prefix is unchanged, so the next prefix reuses nothing), the preparation counts as
    discarded and its slot is free."""
    async with Foundation(max_pending_preparations=1) as foundation:
        manager = foundation.manager
        _commit(manager, 0)
        request = ContextPrepareRequest(context_id="c", turn_id="t0")
        with anyio.CancelScope() as scope:
            scope.cancel()
            await manager.prepare_nowait(request)
        assert scope.cancelled_caught
        stats = manager.statistics().preparations
        assert (stats.prepared_total, stats.discarded_total, stats.failed_total) == (0, 1, 0)
        assert (stats.pending, stats.waiting_for_slot) == (0, 0)
        assert manager._life.check_bound().queue._slots.free == 1
        prepared = await manager.prepare_nowait(request)
        assert prepared.reused_bytes == 0  # the discarded prefix was never delivered
        assert manager.statistics().preparations.prepared_total == 1

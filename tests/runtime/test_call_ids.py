"""Prepared inputs (prepare and build) carry each call id once, with a byte-stable prefix."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.context.gateways._support import ITEM_FIELD, call_sites
from tests.runtime.helpers import call, result, user
from turnloom.context import GatewayType, get_gateway
from turnloom.runtime import ContextPrepareRequest, EarlierStatePolicy, Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("policy", ["keep", "drop"])
@pytest.mark.parametrize("kind", list(GatewayType))
async def test_prepare_and_build_rename_reused_ids_the_same_way(
    kind: GatewayType, policy: EarlierStatePolicy
) -> None:
    """Invariants: every prepared or built input holds each call id once; a renamed id
    is the same in build's continuation and in the next turn's prefix; turn 1's last
    input (prefix, state pair, continuation) is the start of turn 2's prefix, item for
    item (``keep``), or turn 1's history and input are, then its continuation
    (``drop``)."""
    async with Foundation(
        gateway=kind, behavior_rules="Answer briefly.", earlier_state=policy
    ) as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("one"),)))
        p1 = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        # Two model steps of turn 1 reuse the call id c1.
        steps = [call("c1"), result("c1", "first"), call("c1"), result("c1", "second")]
        async with manager.invocation("c", "t1") as invocation:
            invocation.record(steps[:2])
        manager.record("c", "t1", steps[2:])
        built = manager.build(p1, steps)
        continuation = list(built[len(p1.items) :])
        sites = call_sites(kind.value, list(built))
        assert [s[2] for s in sites if s[2] != p1.state_call_id] == ["c1", "c1", "c1_r2", "c1_r2"]
        assert max(Counter(s[2] for s in sites if s[0] == "call").values()) == 1

        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(user("two"),)))
        p2 = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        if policy == "keep":
            assert p2.items[: len(built)] == tuple(built)
        else:
            stable = p1.items[: p1.area_start - 2]  # history and input, before the state pair
            assert p2.items[: len(stable)] == stable
            assert list(p2.items[len(stable) : len(stable) + len(continuation)]) == continuation
        sites = call_sites(kind.value, list(p2.items))
        assert max(Counter(s[2] for s in sites if s[0] == "call").values()) == 1
        gateway = get_gateway(kind)
        body = gateway.request_body(manager.build(p2, [call("c1"), result("c1", "third")]))
        items = body[ITEM_FIELD[kind.value]]
        assert [s[2] for s in call_sites(kind.value, items) if s[0] == "call"][-1] == "c1_r3"
        assert gateway.validate(items) == []

"""Prepared inputs (prepare and build) carry each call id once, with a byte-stable prefix."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from tests.context.gateways._support import ITEM_FIELD, call_sites
from tests.runtime.helpers import assistant, call, result, user
from turnloom.context import GatewayType, Message, Role, get_gateway
from turnloom.context.history import HistoryLimits
from turnloom.errors import InstructionMessageError
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


@pytest.mark.parametrize("policy", ["keep", "drop"])
@pytest.mark.parametrize("kind", list(GatewayType))
async def test_request_bytes_equal_the_encoded_body_of_build(
    kind: GatewayType, policy: EarlierStatePolicy
) -> None:
    """Invariant: ``request_bytes(prefix, continuation)`` is byte for byte
    ``msgspec.json.encode(request_body(build(prefix, continuation)))`` for every
    gateway, turn after turn (the closed turns come from the render cache), and a
    continuation refused by ``build`` is refused the same way."""
    encode = msgspec.json.Encoder().encode
    limits = HistoryLimits(max_turns=3)
    async with Foundation(
        gateway=kind, history_limits=limits, behavior_rules="Be brief.", earlier_state=policy
    ) as foundation:
        manager = foundation.manager
        gateway = manager.gateway
        for n in range(6):
            manager.accept_turn(
                TurnSnapshot(context_id="c", turn_id=f"t{n}", input=(user(f"q{n}"),))
            )
            prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id=f"t{n}"))
            assert manager.request_bytes(prefix) == encode(gateway.request_body(prefix.items))
            steps = [call("c1"), result("c1", f"r{n}"), assistant(f"a{n}")]
            built = manager.build(prefix, steps)
            assert manager.request_bytes(prefix, steps) == encode(gateway.request_body(built))
            manager.record("c", f"t{n}", steps)
        with pytest.raises(InstructionMessageError):
            manager.request_bytes(prefix, [Message(role=Role.system, content="no")])

"""Through the manager: eviction never strands an approval turn's results.

Invariant: a turn whose input answers the calls of the turn before it (an approval)
leaves only together with that turn, so every prepared input's request body passes
the gateway's validate(); an approval the limits cannot hold with its calls is
refused at accept_turn, before anything changes. Runs on asyncio and trio.
"""

from __future__ import annotations

import pytest

from tests.runtime.helpers import assistant, call, result, user
from turnloom.context import GatewayType, Message, Role, get_gateway
from turnloom.context.history import HistoryLimits
from turnloom.errors import PairedTurnsTooLargeError
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio

SYSTEM = Message(role=Role.system, content="You manage the repository.")


@pytest.mark.parametrize("kind", list(GatewayType), ids=lambda k: k.value)
async def test_an_approval_leaves_with_its_call_and_every_prepare_is_valid(
    anyio_backend: str, kind: GatewayType
) -> None:
    """Invariant: with max_turns=2, the turn of plain input after an approval evicts the
    calls' turn and the approval together; each prepared body passes validate()."""
    gateway = get_gateway(kind)
    async with Foundation(gateway=kind, history_limits=HistoryLimits(max_turns=2)) as foundation:
        manager = foundation.manager

        async def prepare_valid(turn_id: str) -> list[object]:
            prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id=turn_id))
            body = gateway.request_body(list(prepared.items))
            assert gateway.validate(body[gateway.items_field]) == []
            return list(prepared.items)

        ask = user("Delete the old branch.")
        manager.accept_turn(
            TurnSnapshot(context_id="c", turn_id="t1", input=(ask,), instructions=(SYSTEM,))
        )
        manager.record("c", "t1", [call("c1", "delete_branch")])
        manager.accept_turn(
            TurnSnapshot(context_id="c", turn_id="t2", input=(result("c1", "deleted"),))
        )
        items = await prepare_valid("t2")
        assert len(items) == len(gateway.render(SYSTEM)) + 3
        manager.record("c", "t2", [assistant("Deleted.")])
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t3", input=(user("Next."),)))
        assert manager.history("c").turn_ids == ("t3",)
        # Held aside while t3 could still be retracted; evicted for good once it answers.
        assert manager.statistics().history.evicted_turns_total == 0
        assert await prepare_valid("t3") == [
            *gateway.render(SYSTEM),
            *gateway.render(user("Next.")),
        ]
        manager.record("c", "t3", [assistant("Done.")])
        assert manager.statistics().history.evicted_turns_total == 2


async def test_an_approval_the_limits_cannot_hold_with_its_call_is_refused_at_the_door(
    anyio_backend: str,
) -> None:
    """Invariant: with max_turns=1, accepting the approval raises PairedTurnsTooLargeError;
    the context is unchanged (its turn still prepares exactly as before) and a turn of
    plain input with the same id is then accepted."""
    async with Foundation(
        gateway=GatewayType.anthropic, history_limits=HistoryLimits(max_turns=1)
    ) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(
                context_id="c",
                turn_id="t1",
                input=(user("Delete the old branch."),),
                instructions=(SYSTEM,),
            )
        )
        manager.record("c", "t1", [call("c1", "delete_branch")])
        request = ContextPrepareRequest(context_id="c", turn_id="t1")
        before = list((await manager.prepare(request)).items)
        with pytest.raises(PairedTurnsTooLargeError) as caught:
            manager.accept_turn(
                TurnSnapshot(context_id="c", turn_id="t2", input=(result("c1", "deleted"),))
            )
        assert (caught.value.unit, caught.value.size, caught.value.limit) == ("turns", 2, 1)
        assert manager.history("c").turn_ids == ("t1",)
        assert manager.statistics().history.evicted_turns_total == 0
        assert list((await manager.prepare(request)).items) == before
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(user("Skip it."),)))
        assert manager.history("c").turn_ids == ("t2",)

"""Earlier turns' runtime-state pairs: kept exactly as sent (default) or dropped."""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
import pytest

from tests.context.gateways._support import ITEM_FIELD
from tests.runtime.helpers import SYSTEM, assistant, call, result, user
from turnloom.context import GatewayType, get_gateway
from turnloom.context.history import HistoryLimits
from turnloom.context.scope import LastNTurns
from turnloom.errors import ConfigError, InputError
from turnloom.runtime import (
    ContextContribution,
    ContextManager,
    ContextPrepareRequest,
    EarlierStatePolicy,
    Foundation,
    PreparedContext,
    TurnSnapshot,
    build_context_manager,
    parse_config,
)
from turnloom.runtime.state import state_messages

pytestmark = pytest.mark.anyio


def request(turn_id: str, note: str | None = "n", **extra: Any) -> ContextPrepareRequest:
    contributions = () if note is None else (ContextContribution(name="note", content=note),)
    return ContextPrepareRequest(
        context_id="c", turn_id=turn_id, contributions=contributions, **extra
    )


def pair_of(prefix: PreparedContext) -> tuple[Any, ...]:
    """The state pair items of a prefix (call, result), as sent."""
    return prefix.items[prefix.area_start - 2 : prefix.area_start]


async def converse(
    manager: ContextManager, turns: int
) -> list[tuple[PreparedContext, tuple[Any, ...]]]:
    """Turns of one tool call each; per turn its prefix and its last built input."""
    out = []
    for n in range(turns):
        manager.accept_turn(
            TurnSnapshot(
                context_id="c",
                turn_id=f"t{n}",
                input=(user(f"question {n}"),),
                instructions=(SYSTEM,) if n == 0 else None,
            )
        )
        prefix = await manager.prepare(request(f"t{n}", f"turn {n}"))
        steps = [call(f"k{n}"), result(f"k{n}", "found")]
        manager.record("c", f"t{n}", steps)
        out.append((prefix, manager.build(prefix, steps)))
        manager.record("c", f"t{n}", [assistant(f"answer {n}")])
    return out


@pytest.mark.parametrize("kind", list(GatewayType))
async def test_each_turns_prefix_begins_with_the_previous_input_by_default(
    kind: GatewayType,
) -> None:
    """Invariant (keep): the last input of turn n, state pair included, is the start of
    turn n+1's prefix, item for item; every request body passes the gateway's rules."""
    async with Foundation(gateway=kind) as foundation:
        manager = foundation.manager
        assert manager.earlier_state == "keep"
        turns = await converse(manager, 3)
        gateway = get_gateway(kind)
        for (prefix, built), (following, _) in itertools.pairwise(turns):
            assert following.items[: len(built)] == built
            assert following.reused_bytes == prefix.bytes  # the whole previous prefix
        for prefix, built in turns:
            for items in (prefix.items, built):
                body = gateway.request_body(items)
                assert gateway.validate(body[ITEM_FIELD[kind.value]]) == []


@pytest.mark.parametrize("kind", list(GatewayType))
async def test_drop_sends_only_the_current_turns_pair(kind: GatewayType) -> None:
    """Invariant (drop): no earlier turn's pair is sent; turn n+1's prefix repeats turn
    n's input and stops before its pair."""
    async with Foundation(gateway=kind, earlier_state="drop") as foundation:
        manager = foundation.manager
        turns = await converse(manager, 3)
        for (prefix, _), (following, _) in itertools.pairwise(turns):
            before_pair = prefix.area_start - 2
            assert following.items[:before_pair] == prefix.items[:before_pair]
            assert following.items[before_pair] != prefix.items[before_pair]
        last = turns[-1][0]
        assert manager.history("c").turn_state("t0") == ()
        calls = [i for i in last.items if "tlrs_" in str(i)]
        assert len(calls) == 2  # the current turn's call and result only


async def test_the_last_delivered_unscoped_pair_is_kept_and_a_scoped_prepare_changes_nothing() -> (
    None
):
    """Invariant: a turn keeps the pair of its last delivered unscoped prepare, byte for
    byte; a scoped prepare delivered later neither keeps its own nor shows kept ones."""
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t0", input=(user("a"),)))
        await manager.prepare(request("t0", "first"))
        second = await manager.prepare(request("t0", "second"))
        manager.record("c", "t0", [assistant("ok")])
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("b"),)))
        scoped_t0 = await manager.prepare(request("t0", "scoped", scope=LastNTurns(5)))
        assert scoped_t0.reused_bytes == 0
        next_prefix = await manager.prepare(request("t1"))
        assert next_prefix.items[1:3] == pair_of(second)
        assert "second" in str(next_prefix.items[2])
        scoped = await manager.prepare(request("t1", "scoped", scope=LastNTurns(5)))
        assert [i for i in scoped.items if "tlrs_" in str(i)] == list(pair_of(scoped))
        again = await manager.prepare(request("t1"))
        assert again.items == next_prefix.items  # the scoped prepares changed nothing


async def test_a_turn_whose_last_prepare_had_no_state_keeps_no_pair() -> None:
    """Invariant: no state, no pair; a stateless prepare after one with state keeps none."""
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t0", input=(user("a"),)))
        with_state = await manager.prepare(request("t0"))
        assert with_state.state_call_id is not None
        assert len(manager.history("c").turn_state("t0")) == 2
        without = await manager.prepare(request("t0", None))
        assert without.state_call_id is None
        assert manager.history("c").turn_state("t0") == ()
        manager.record("c", "t0", [assistant("ok")])
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("b"),)))
        prefix = await manager.prepare(request("t1", None))
        assert list(prefix.items) == [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "b"},
        ]


async def test_prepared_tokens_and_history_totals_count_the_kept_pairs() -> None:
    """Invariant: PreparedContext.tokens is the counter over every message the input
    renders, kept pairs included; the history's items, bytes and tokens count them."""
    async with Foundation() as foundation:
        manager = foundation.manager
        turns = await converse(manager, 2)
        view = manager.history("c")
        kept = view.turn_state("t0")
        assert len(kept) == 2
        counter = manager.options.token_counter
        last = turns[-1][0]
        messages = [*view.input_messages("t1")]
        assert kept[0] in messages and kept[1] in messages
        current = view.turn_state("t1")  # the pair t1's prefix carried, kept on delivery
        assert len(current) == 2
        assert last.tokens == counter.count([*messages, *current])
        totals = manager.statistics().history
        recorded = [m for t in view.turn_ids for m in view.turn_messages(t)]
        states = [m for t in view.turn_ids for m in view.turn_state(t)]
        assert (totals.items, totals.tokens) == (
            len(recorded) + len(states),
            counter.count([*recorded, *states]),
        )


async def test_a_kept_pair_leaves_with_its_turn() -> None:
    """Invariant: eviction and retraction take a turn's kept pair with it; the history's
    totals go back to what the remaining turns hold (a false start's retraction restores
    the turn its commit evicted, with that turn's own kept pair)."""
    limits = HistoryLimits(low_water=1.0, max_turns=2)
    async with Foundation(history_limits=limits) as foundation:
        manager = foundation.manager
        await converse(manager, 3)
        view = manager.history("c")
        assert view.turn_ids == ("t1", "t2")
        assert "t0" not in str(manager.build(await manager.prepare(request("t2")), []))
        held = manager.statistics().history
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t3", input=(user("x"),)))
        assert manager.history("c").turn_ids == ("t2", "t3")  # t1 held aside
        before = manager.statistics().history
        await manager.prepare(request("t3"))
        grown = manager.statistics().history
        assert grown.items == before.items + 2
        manager.voice.retract_turn("c", "t3")
        after = manager.statistics().history
        assert manager.history("c").turn_ids == ("t1", "t2")
        # The input and its kept pair are gone, t1 and its pair are back.
        assert (after.turns, after.items, after.bytes, after.tokens) == (
            held.turns,
            held.items,
            held.bytes,
            held.tokens,
        )
        assert (after.evicted_turns_total, after.retracted_turns_total) == (
            held.evicted_turns_total,
            held.retracted_turns_total + 1,
        )


async def test_an_interrupted_output_follows_the_kept_pair() -> None:
    """Invariant: the played part of an interrupted reply is recorded after the turn's
    kept pair, so the next turn's prefix still begins with the interrupted input."""
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t0", input=(user("a"),)))
        prefix = await manager.prepare(request("t0"))
        async with manager.invocation("c", "t0") as invocation:
            invocation.record_interrupted(assistant("Your flight leaves at nine."), played=11)
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("b"),)))
        following = await manager.prepare(request("t1"))
        assert following.items[:3] == prefix.items
        assert following.items[3] == {"role": "assistant", "content": "Your flight"}


async def test_an_unknown_policy_is_refused_at_the_door() -> None:
    """Bad input fails with a typed error naming the option."""
    with pytest.raises(InputError, match="earlier_state must be 'keep' or 'drop'"):
        ContextManager(earlier_state="forget")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="earlier_state must be 'keep' or 'drop'"):
        Foundation(earlier_state="forget")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="earlier_state"):
        Foundation(ContextManager(), earlier_state="drop")
    with pytest.raises(ConfigError) as caught:
        parse_config({"context": {"init_config": {"earlier_state": "forget"}}})
    assert caught.value.key == "context.init_config.earlier_state"
    config = parse_config({"context": {"init_config": {"earlier_state": "drop"}}})
    assert config.context.init_config.earlier_state == "drop"  # type: ignore[attr-defined]


@pytest.mark.parametrize("policy", ["keep", "drop"])
async def test_the_configured_policy_reaches_the_manager(policy: EarlierStatePolicy) -> None:
    config = parse_config({"context": {"init_config": {"earlier_state": policy}}})
    assert build_context_manager(config).earlier_state == policy


@pytest.mark.parametrize("kind", list(GatewayType))
async def test_a_pair_within_the_cap_as_sent_but_over_it_as_a_message_is_delivered_not_kept(
    kind: GatewayType,
) -> None:
    """Invariant: a prefix whose pair passed the per-item cap as sent is delivered; when
    the pair is over the cap as a history message it is not kept (nor the turn's earlier
    pair: what a turn keeps is its last delivered pair or none), like a memory pair."""
    cap = 1_000
    gateway = get_gateway(kind)

    def native_size(note: str) -> int:
        pair = request("t0", note)
        messages = state_messages("c", "t0", contributions=pair.contributions)
        assert messages is not None
        return len(msgspec.json.encode(gateway.render(messages[1])[-1]))

    note = "x" * max(n for n in range(cap) if native_size("x" * n) <= cap)
    async with Foundation(
        gateway=kind, history_limits=HistoryLimits(low_water=1.0, max_item_bytes=cap)
    ) as f:
        manager = f.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t0", input=(user("a"),)))
        await manager.prepare(request("t0", "small"))
        assert len(manager.history("c").turn_state("t0")) == 2
        prefix = await manager.prepare(request("t0", note))
        assert note in str(pair_of(prefix))
        assert manager.history("c").turn_state("t0") == ()
        manager.record("c", "t0", [assistant("ok")])
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("b"),)))
        following = await manager.prepare(request("t1", None))
        assert "tlrs_" not in str(following.items)

"""Token budgets, scoped prepares and the sub-agent bridge, through the runtime.

Invariants:

* one estimator: each message is counted once, by the Foundation's counter,
  when it enters; the history's statistics, ``max_tokens`` eviction,
  ``PreparedContext.tokens`` and ``WorkingContext.tokens()`` report the same
  number for the same messages (approximate and exact counters);
* a scoped prepare renders the sliced view with every call/result pair
  complete, keeps the pinned instructions and the turn's input, leaves the
  history untouched, and never disturbs the unscoped prepares: they stay
  byte-identical to a cold render and byte-stable from one to the next;
* a bad scope fails at the door with a typed error, before a slot is taken;
* the bridge: a context's retained history as a WorkingContext / FrozenContext
  (sliced, paired, independent of the history), and a sub-agent's result
  folded back into a turn through ``record``'s door.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.runtime.helpers import SYSTEM, assistant, call, result, user
from turnloom.context import (
    AllOf,
    ApproxTokenCounter,
    ContextScope,
    FrozenContext,
    LastNTurns,
    Message,
    Not,
    OpenAITokenCounter,
    Role,
    RoleFilter,
    Since,
    Tagged,
    TextPart,
    TokenCounter,
    ToolResultPart,
    WorkingContext,
    complete_pairs,
    get_gateway,
)
from turnloom.context.callids import CallIdRenamer, rename_call_ids
from turnloom.context.history import HistoryLimits, TurnHistory
from turnloom.errors import InvalidArgumentError, PositionalScopeError, UnknownTurnError
from turnloom.runtime import ContextManager, ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.tools.transcript import Output, Reply, Turn, snapshot, walk

pytestmark = pytest.mark.anyio

CHAT = get_gateway("openai_chat")


def _tau_messages(path: Path, trajectories: int) -> list[list[Message]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return [[CHAT.parse(m) for m in t["traj"]] for t in data[:trajectories]]


def _load(manager: ContextManager, context_id: str, messages: list[Message]) -> list[str]:
    """Commit a transcript's turns and record their outputs; return the turn ids."""
    ids: list[str] = []
    for step in walk(messages):
        if isinstance(step, Turn):
            manager.accept_turn(snapshot(context_id, step))
            ids.append(step.turn_id)
        elif isinstance(step, Reply | Output):
            manager.record(context_id, step.turn_id, (step.message,))
    return ids


def _parsed(items: tuple[Any, ...]) -> list[Message]:
    return [CHAT.parse(item) for item in items]


def _cold_items(messages: list[Message]) -> tuple[Any, ...]:
    """A cold render of ``messages``: complete pairs, render each, unique call ids."""
    out: list[Any] = []
    for message in complete_pairs(messages):
        out.extend(CHAT.render(message))
    return tuple(rename_call_ids(CHAT.type, out, CallIdRenamer()))


# -- one estimator -------------------------------------------------------------------


@pytest.mark.parametrize("exact", [False, True], ids=["approx", "o200k_base"])
async def test_history_prepare_and_working_context_report_one_token_number(
    tau_bench_path: Path, exact: bool
) -> None:
    """On real tau-bench traffic the history statistics, PreparedContext.tokens, the
    counter over the prepared messages and WorkingContext.tokens() are one number."""
    counter: TokenCounter = OpenAITokenCounter("o200k_base") if exact else ApproxTokenCounter()
    (messages,) = _tau_messages(tau_bench_path, 1)
    async with Foundation(token_counter=counter) as foundation:
        manager = foundation.manager
        ids = _load(manager, "c", messages)
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="next", input=(user("And?"),)))
        stats = manager.history("c")
        view_messages = [m for t in stats.turn_ids for m in stats.turn_messages(t)]
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="next"))
        briefing = await manager.bridge.working_context("c")
    pinned = list(stats.pinned)
    assert len(ids) >= 1 and pinned
    whole = counter.count(pinned + view_messages)
    assert prepared.tokens == whole
    # The messages as recorded: the request renames reused call ids (a wire
    # detail), which the count does not follow.
    renamed = counter.count(_parsed(prepared.items))
    assert renamed >= prepared.tokens
    assert briefing.tokens() == whole
    assert briefing.token_counter is counter
    history = TurnHistory(token_counter=counter)
    history.commit("t", [m for m in view_messages if m.role.value != "system"][:1])
    assert history.statistics().tokens == counter.count(view_messages[:1])


async def test_prepared_tokens_count_the_state_pair_and_area_section() -> None:
    """The runtime-state pair is counted as the messages it is, the area section as
    the messages its items parse to."""
    from turnloom.areas import OneShotNotice
    from turnloom.runtime import ContextContribution
    from turnloom.runtime.state import state_messages

    contribution = ContextContribution(name="time", content="09:00")
    pair = state_messages("c", "t1", contributions=(contribution,))
    assert pair is not None

    counter = ApproxTokenCounter()
    async with Foundation(token_counter=counter) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),), instructions=(SYSTEM,))
        )
        manager.areas.attach("c", OneShotNotice("Flights to Lisbon are delayed."))
        prepared = await manager.prepare(
            ContextPrepareRequest(
                context_id="c",
                turn_id="t1",
                contributions=(contribution,),
            )
        )
    assert prepared.area_items == 1 and prepared.state_call_id is not None
    area = _parsed(prepared.items[prepared.area_start :])
    assert [m.text for m in area] == ["Flights to Lisbon are delayed."]
    assert prepared.tokens == counter.count([SYSTEM, user("hi"), *pair, *area])


def _turn_tokens(text: str) -> int:
    return ApproxTokenCounter().count([user(text), assistant(text)])


async def test_max_tokens_evicts_whole_turns_oldest_first_and_pinned_are_not_counted() -> None:
    """max_tokens evicts whole turns, oldest first, exactly down to the bound; the
    pinned instructions (far over the bound) are never counted or evicted."""
    per_turn = _turn_tokens("x" * 40)  # user 3+1+10, assistant 3+3+10
    assert per_turn == 30
    big_system = Message(role=Role.system, content="S" * 4000)
    limits = HistoryLimits(low_water=1.0, max_tokens=per_turn * 3)
    async with Foundation(history_limits=limits) as foundation:
        manager = foundation.manager
        for n in range(5):
            manager.accept_turn(
                TurnSnapshot(
                    context_id="c",
                    turn_id=f"t{n}",
                    input=(user("x" * 40),),
                    instructions=(big_system,) if n == 0 else None,
                )
            )
            manager.record("c", f"t{n}", [assistant("x" * 40)])
        view = manager.history("c")
        assert view.turn_ids == ("t2", "t3", "t4")
        assert view.pinned == (big_system,)
        totals = manager.statistics().history
        assert (totals.turns, totals.items) == (3, 6)
        # The next turn's input (14 tokens) puts the total over: t2 goes.
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t5", input=(user("x" * 40),)))
        assert manager.history("c").turn_ids == ("t3", "t4", "t5")


def test_history_token_statistics_follow_every_change() -> None:
    """tokens, pinned_tokens and evicted_tokens are exact sums of per-message counts."""
    counter = ApproxTokenCounter()
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=2))
    history.commit("a", [user("one")], instructions=[SYSTEM])
    history.record("a", [call("k1"), result("k1", "done")])
    history.commit("b", [user("two")])
    history.commit("c", [user("three")])
    history.evict()
    stats = history.statistics()
    assert stats.pinned_tokens == counter.count([SYSTEM])
    assert stats.tokens == counter.count([user("two"), user("three")])
    assert stats.evicted_tokens == 0  # "a" held aside: c's retraction would restore it
    history.record("c", [assistant("three")])
    stats = history.statistics()
    assert stats.tokens == counter.count([user("two"), user("three"), assistant("three")])
    assert stats.evicted_tokens == counter.count([user("one"), call("k1"), result("k1", "done")])
    assert history.token_counter.count([]) == 0


def test_max_tokens_and_token_counter_are_checked() -> None:
    """max_tokens must be None or a positive int; a counter needs count()."""
    for bad in (0, -1, True, 1.5, "9"):
        with pytest.raises(InvalidArgumentError) as info:
            HistoryLimits(low_water=1.0, max_tokens=bad)  # type: ignore[arg-type]
        assert info.value.field == "max_tokens"
    assert HistoryLimits(low_water=1.0, max_tokens=None).max_tokens is None
    with pytest.raises(InvalidArgumentError) as info:
        Foundation(token_counter=object())  # type: ignore[arg-type]
    assert info.value.field == "token_counter"
    with pytest.raises(InvalidArgumentError):
        TurnHistory(token_counter=object())  # type: ignore[arg-type]


# -- scoped prepares -----------------------------------------------------------------


async def _voice_history(manager: ContextManager) -> None:
    """Four turns: t0 and t2 call a tool; t3 is the one prepared."""
    manager.accept_turn(
        TurnSnapshot(context_id="c", turn_id="t0", input=(user("u0"),), instructions=(SYSTEM,))
    )
    manager.record("c", "t0", [call("k0"), result("k0", "r0"), assistant("a0")])
    manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("u1"),)))
    manager.record("c", "t1", [assistant("a1")])
    manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(user("u2"),)))
    manager.record("c", "t2", [call("k2"), result("k2", "r2"), assistant("a2")])
    manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t3", input=(user("u3"),)))


async def test_scoped_prepare_is_the_sliced_view_with_pinned_and_turn_input() -> None:
    """LastNTurns(2) keeps t2 and t3's input; the pinned prompt stays; exact items."""
    async with Foundation() as foundation:
        manager = foundation.manager
        await _voice_history(manager)
        before = manager.statistics().history
        prepared = await manager.prepare(
            ContextPrepareRequest(context_id="c", turn_id="t3", scope=LastNTurns(2))
        )
        assert manager.statistics().history == before
        assert manager.history("c").turn_ids == ("t0", "t1", "t2", "t3")
        # The scoped prefix is continued by build like any other.
        outputs = [call("k3"), result("k3", "r3")]
        manager.record("c", "t3", outputs)
        built = manager.build(prepared, outputs)
    expected = [SYSTEM, user("u2"), call("k2"), result("k2", "r2"), assistant("a2"), user("u3")]
    assert built == _cold_items([*expected, *outputs])
    assert prepared.items == _cold_items(expected)
    assert prepared.turn_start == 5
    assert prepared.tokens == ApproxTokenCounter().count(expected)
    assert prepared.reused_bytes == 0


@pytest.mark.parametrize(
    ("scope", "kept"),
    [
        # Results dropped: their calls are excluded, the assistant text stays.
        (RoleFilter("user", "assistant"), ["u0", "a0", "u1", "a1", "u2", "a2", "u3"]),
        # Calls dropped (Since cuts inside t0): the orphan result is dropped.
        (Since(2), ["a0", "u1", "a1", "u2", "k2", "r2", "a2", "u3"]),
        # Nothing of the earlier turns: only pinned and the turn's input.
        (LastNTurns(0), ["u3"]),
        # The user messages of the last two turns (index-set algebra).
        (AllOf(RoleFilter("user"), LastNTurns(2)), ["u2", "u3"]),
        (Not(RoleFilter("tool")), ["u0", "a0", "u1", "a1", "u2", "a2", "u3"]),
    ],
)
async def test_scoped_prepare_keeps_every_pair_complete(scope: Any, kept: list[str]) -> None:
    """After slicing no call is left without its result nor a result without its call;
    the request body passes the gateway's own validate()."""
    async with Foundation() as foundation:
        manager = foundation.manager
        await _voice_history(manager)
        prepared = await manager.prepare(
            ContextPrepareRequest(context_id="c", turn_id="t3", scope=scope)
        )
    names: list[str] = []
    for message in _parsed(prepared.items)[1:]:
        if message.tool_calls:
            names.extend(c.call_id for c in message.tool_calls)
        elif message.tool_results:
            names.extend("r" + r.call_id[1:] for r in message.tool_results)
        else:
            names.append(message.text)
    assert names == kept
    body = CHAT.request_body(prepared.items)
    assert CHAT.validate(body[CHAT.items_field]) == []


async def test_a_scope_that_keeps_everything_renders_the_unscoped_input() -> None:
    """AllOf() keeps every message: the scoped render equals the unscoped one."""
    async with Foundation() as foundation:
        manager = foundation.manager
        await _voice_history(manager)
        whole = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t3"))
        scoped = await manager.prepare(
            ContextPrepareRequest(context_id="c", turn_id="t3", scope=AllOf())
        )
    assert scoped.items == whole.items
    assert (scoped.tokens, scoped.bytes, scoped.turn_start) == (
        whole.tokens,
        whole.bytes,
        whole.turn_start,
    )


async def test_scoped_prepares_never_disturb_unscoped_ones(tau_bench_path: Path) -> None:
    """Interleaved with scoped prepares, every unscoped prepare is byte-identical to a
    cold render of the history and reuses the whole previous prefix (byte-stable)."""
    trajectories = _tau_messages(tau_bench_path, 3)
    scopes: list[ContextScope] = [
        LastNTurns(1),
        RoleFilter("user", "assistant"),
        Since(3),
        LastNTurns(3),
    ]
    async with Foundation() as foundation:
        manager = foundation.manager
        previous = None
        n = 0
        for messages in trajectories:
            for step in walk(messages, ids=iter(f"t{i}" for i in range(n, 10_000))):
                if isinstance(step, Turn):
                    n += 1
                    manager.accept_turn(snapshot("c", step))
                    scoped = await manager.prepare(
                        ContextPrepareRequest(
                            context_id="c", turn_id=step.turn_id, scope=scopes[n % 4]
                        )
                    )
                    whole = await manager.prepare(
                        ContextPrepareRequest(context_id="c", turn_id=step.turn_id)
                    )
                    view = manager.history("c")
                    cold = [*view.pinned]
                    for turn_id in view.turn_ids[:-1]:
                        cold.extend(view.turn_messages(turn_id))
                    cold.extend(view.turn_input(step.turn_id))
                    assert whole.items == _cold_items(cold)
                    if previous is not None:
                        assert whole.items[: previous.item_count] == previous.items
                        assert whole.reused_bytes == previous.bytes
                    assert scoped.item_count <= whole.item_count
                    body = CHAT.request_body(scoped.items)[CHAT.items_field]
                    assert CHAT.validate(body) == []  # pairs complete, call ids unique
                    previous = whole
                elif isinstance(step, Reply | Output):
                    manager.record("c", step.turn_id, (step.message,))
        prefix = manager.statistics().prefix
    assert n >= 6
    assert prefix.reused_bytes_total == prefix.bytes_total


async def test_a_bad_scope_fails_at_the_door_before_a_slot_is_taken() -> None:
    """prepare, prepare_nowait and working_context refuse a non-scope with
    InvalidArgumentError(field="scope"); nothing is admitted."""
    async with Foundation() as foundation:
        manager = foundation.manager
        await _voice_history(manager)
        for bad in (object(), "LastNTurns(2)", 4):
            request = ContextPrepareRequest(
                context_id="c",
                turn_id="t3",
                scope=bad,  # type: ignore[arg-type]
            )
            with pytest.raises(InvalidArgumentError) as info:
                await manager.prepare(request)
            assert info.value.field == "scope"
            with pytest.raises(InvalidArgumentError):
                await manager.prepare_nowait(request)
            with pytest.raises(InvalidArgumentError):
                await manager.bridge.working_context("c", scope=bad)  # type: ignore[arg-type]
        stats = manager.statistics().preparations
        assert (stats.pending, stats.prepared_total, stats.failed_total) == (0, 0, 0)


async def test_a_positional_scope_behind_a_user_predicate_fails_the_preparation() -> None:
    """A user scope that asks LastNTurns.matches fails with PositionalScopeError."""

    class Delegating:
        def matches(self, message: Message, index: int) -> bool:
            return LastNTurns(1).matches(message, index)

    async with Foundation() as foundation:
        manager = foundation.manager
        await _voice_history(manager)
        with pytest.raises(PositionalScopeError):
            await manager.prepare(
                ContextPrepareRequest(context_id="c", turn_id="t3", scope=Delegating())
            )
        whole = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t3"))
    assert whole.item_count == 12  # pinned 1, t0 4, t1 2, t2 4, t3's input 1


# -- the bridge ------------------------------------------------------------------------


async def test_working_context_is_the_retained_history_paired_and_independent() -> None:
    """Pinned as the prefix, every kept message in order, an open call excluded;
    changing the WorkingContext changes no history."""
    async with Foundation() as foundation:
        manager = foundation.manager
        await _voice_history(manager)
        manager.record("c", "t3", [call("open")])  # no result yet
        ctx = await manager.bridge.working_context("c")
        assert ctx.prefix.as_messages() == [SYSTEM]
        assert [m.text or m.role.value for m in ctx.messages][:4] == [
            "u0",
            "assistant",
            "tool",
            "a0",
        ]
        assert len(ctx.messages) == 11  # 12 kept, the open call excluded
        assert all(c.call_id != "open" for m in ctx.messages for c in m.tool_calls)
        ctx.append(user("sub-agent scribble")).note("plan", [1, 2])
        assert manager.history("c").turn_messages("t3") == (user("u3"), call("open"))
        sliced = await manager.bridge.working_context("c", scope=LastNTurns(1))
        assert sliced.messages == [user("u3")]
        frozen = await manager.bridge.briefing("c", scope=LastNTurns(2))
    assert isinstance(frozen, FrozenContext)
    assert frozen.messages == (
        user("u2"),
        call("k2"),
        result("k2", "r2"),
        assistant("a2"),
        user("u3"),
    )
    assert frozen.prefix.grounding == (SYSTEM,)


async def test_working_context_tokens_equal_a_scoped_prepare() -> None:
    """The same slice, briefed or prepared, is the same number of tokens."""
    async with Foundation(token_counter=OpenAITokenCounter("cl100k_base")) as foundation:
        manager = foundation.manager
        await _voice_history(manager)
        for scope in (LastNTurns(2), RoleFilter("user", "assistant"), Since(4)):
            prepared = await manager.prepare(
                ContextPrepareRequest(context_id="c", turn_id="t3", scope=scope)
            )
            ctx = await manager.bridge.working_context("c", scope=scope)
            assert ctx.tokens() == prepared.tokens


async def test_fold_records_a_sub_agent_result_as_the_delegating_call_result() -> None:
    """fold(call_id=...) answers the turn's open call with the sub-agent's last
    assistant text; the tool name comes from the call; the next build shows it."""
    async with Foundation() as foundation:
        manager = foundation.manager
        await _voice_history(manager)
        manager.record("c", "t3", [call("delegate", name="research")])
        brief = await manager.bridge.working_context("c", scope=LastNTurns(1))
        sub = WorkingContext(prefix=brief.prefix, messages=brief.messages)
        sub.append(assistant("thinking")).append(assistant("Lisbon is sunny."))
        assert manager.bridge.fold("c", "t3", sub, call_id="delegate") == 1
        outputs = manager.history("c").turn_messages("t3")[1:]
        assert outputs[-1] == Message(
            role=Role.tool,
            content=(
                ToolResultPart(
                    call_id="delegate",
                    name="research",
                    content=(TextPart(text="Lisbon is sunny."),),
                ),
            ),
        )
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t3"))
        items = manager.build(prefix, outputs)
        assert items[-1] == {
            "role": "tool",
            "tool_call_id": "delegate",
            "content": "Lisbon is sunny.",
        }
        assert manager.bridge.fold("c", "t3", sub.freeze(), agent="researcher") == 1
        tagged = await manager.bridge.working_context("c", scope=Tagged("researcher"))
        assert [m.text for m in tagged.messages] == ["Lisbon is sunny."]


async def test_fold_refuses_bad_results_before_recording() -> None:
    """Each kind of bad fold input is a typed error naming its field; nothing recorded."""
    async with Foundation() as foundation:
        manager = foundation.manager
        await _voice_history(manager)
        manager.record("c", "t3", [call("d1"), result("d1")])
        before = manager.history("c").turn_messages("t3")
        cases: list[tuple[dict[str, Any], str]] = [
            ({"result": 42}, "result"),
            ({"result": "   "}, "result"),
            ({"result": WorkingContext(messages=[user("no answer")])}, "result"),
            ({"result": "ok", "call_id": "d1"}, "call_id"),  # answered already
            ({"result": "ok", "call_id": "nope"}, "call_id"),
            ({"result": "ok", "agent": ""}, "agent"),
            ({"result": "ok", "agent": "x", "call_id": "d1"}, "agent"),
        ]
        for kwargs, field in cases:
            with pytest.raises(InvalidArgumentError) as info:
                manager.bridge.fold("c", "t3", **kwargs)
            assert info.value.field == field
        with pytest.raises(UnknownTurnError):
            manager.bridge.fold("c", "t9", "ok", call_id="d1")
        assert manager.history("c").turn_messages("t3") == before


async def test_working_context_leaves_no_thread_behind_when_cancelled() -> None:
    """A cancelled working_context changes nothing and frees its worker token."""
    async with Foundation() as foundation:
        manager = foundation.manager
        await _voice_history(manager)
        with anyio.CancelScope() as scope:
            scope.cancel()
            await manager.bridge.working_context("c")
        assert foundation.limiter.borrowed_tokens == 0
        assert manager.history("c").turn_ids == ("t0", "t1", "t2", "t3")


async def test_scoped_prepares_show_the_area_section_as_it_stands_without_a_pass() -> None:
    """A scoped prepare never runs an area pass ("reused_scoped") and never marks a
    section delivered: the unscoped prepares run and collect exactly as alone."""
    from turnloom.areas import OneShotNotice

    async with Foundation() as foundation:
        manager = foundation.manager
        await _voice_history(manager)
        manager.areas.attach("c", OneShotNotice("Gate change: B12."))

        async def prepare(scope: ContextScope | None) -> Any:
            request = ContextPrepareRequest(context_id="c", turn_id="t3", scope=scope)
            return await manager.prepare(request)

        first = await prepare(LastNTurns(1))
        assert (first.area_pass, first.area_items) == ("reused_scoped", 0)
        whole = await prepare(None)
        assert (whole.area_pass, whole.area_items) == ("rendered", 1)
        voice = await prepare(LastNTurns(1))
        assert (voice.area_pass, voice.area_items) == ("reused_scoped", 1)
        assert voice.items[voice.area_start :] == whole.items[whole.area_start :]
        again = await prepare(None)  # the one-shot notice retired: collected now
        assert (again.area_pass, again.area_items) == ("rendered", 0)
        areas = manager.statistics().areas
    assert (areas.renders_total, areas.collected_total, areas.passes_reused_total) == (2, 1, 2)


async def test_a_scoped_prepare_cancelled_mid_render_leaves_the_unscoped_prefix() -> None:
    """Cancelled while its worker renders, a scoped prepare settles, frees its slot
    and changes nothing the next unscoped prepare compares with or reuses."""
    from tests.runtime.helpers import BlockingGateway
    from turnloom.runtime import ContextContribution

    gateway = BlockingGateway()
    async with Foundation(gateway=gateway, worker_threads=1) as foundation:
        manager = foundation.manager
        await _voice_history(manager)
        whole = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t3"))
        gateway.hold = True
        with anyio.CancelScope() as scope:

            async def cancel_when_rendering() -> None:
                await anyio.to_thread.run_sync(gateway.entered.wait, 10)
                scope.cancel()
                gateway.release.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_when_rendering)
                # The state pair is rendered fresh: the worker blocks there.
                await manager.prepare(
                    ContextPrepareRequest(
                        context_id="c",
                        turn_id="t3",
                        scope=Since(0),
                        contributions=(ContextContribution(name="time", content="09:00"),),
                    )
                )
        gateway.hold = False
        with anyio.fail_after(10):
            while manager.statistics().preparations.pending:
                await anyio.sleep(0.005)
        again = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t3"))
        stats = manager.statistics()
    assert gateway.entered.is_set() and gateway.returned == gateway.renders
    assert again.items == whole.items
    assert again.reused_bytes == whole.bytes
    assert stats.preparations.discarded_total == 1
    assert stats.prefix.reused_bytes_total == stats.prefix.bytes_total == whole.bytes


async def test_a_scoped_prepare_never_counts_as_delivering_an_undelivered_section() -> None:
    """An area pass whose unscoped preparation was discarded is still reused by the
    next unscoped prepare ("reused_undelivered"), even after a scoped one showed it."""
    from tests.runtime.helpers import BlockingGateway
    from turnloom.areas import OneShotNotice

    gateway = BlockingGateway()
    async with Foundation(gateway=gateway, worker_threads=1) as foundation:
        manager = foundation.manager
        await _voice_history(manager)
        manager.areas.attach("c", OneShotNotice("Gate change: B12."))
        gateway.hold = True  # the notice is rendered fresh in the area pass: it blocks
        with anyio.CancelScope() as scope:

            async def cancel_when_rendering() -> None:
                await anyio.to_thread.run_sync(gateway.entered.wait, 10)
                scope.cancel()
                gateway.release.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_when_rendering)
                await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t3"))
        gateway.hold = False
        with anyio.fail_after(10):
            while manager.statistics().preparations.pending:
                await anyio.sleep(0.005)
        voice = await manager.prepare(
            ContextPrepareRequest(context_id="c", turn_id="t3", scope=LastNTurns(1))
        )
        whole = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t3"))
    assert (voice.area_pass, voice.area_items) == ("reused_scoped", 1)
    assert (whole.area_pass, whole.area_items) == ("reused_undelivered", 1)
    assert whole.items[whole.area_start :] == voice.items[voice.area_start :]


async def test_the_foundations_own_counter_is_the_one_every_number_comes_from() -> None:
    """A host counter (here one token per message) drives max_tokens, the statistics,
    PreparedContext.tokens and working_context().tokens() alike."""

    class OnePerMessage:
        def count(self, messages: Any) -> int:
            return len(messages)

    limits = HistoryLimits(low_water=1.0, max_tokens=5)
    async with Foundation(history_limits=limits, token_counter=OnePerMessage()) as foundation:
        manager = foundation.manager
        await _voice_history(manager)  # 4 + 2 + 4 + 1 messages: only t2 and t3 fit
        assert manager.history("c").turn_ids == ("t2", "t3")
        assert manager.statistics().history.tokens == 5
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t3"))
        assert prepared.tokens == 1 + 4 + 1  # pinned (not counted against limits) + t2 + input
        ctx = await manager.bridge.working_context("c")
        assert ctx.tokens() == prepared.tokens

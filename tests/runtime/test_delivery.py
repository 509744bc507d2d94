"""The runtime never loses, repeats or leaks: pairing across turns, failed renders,
removal, late delivery and voice interruption.

Every async test runs on asyncio and on trio (``anyio_backend`` fixture).
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import pytest

from tests.runtime.helpers import CHAT, GatedStrategy, assistant, call, result, user
from tests.runtime.stress import cold_render, run_stress
from turnloom.areas import OneShotNotice
from turnloom.context import Message, Role, TextPart, ToolCallPart
from turnloom.context.history import HistoryLimits
from turnloom.context.pairing import OpenCallPolicy
from turnloom.errors import ContextRemovedError, DuplicateIdError, StateError, UnknownTurnError
from turnloom.runtime import ContextPrepareRequest, Foundation, PreparedContext, TurnSnapshot
from turnloom.runtime import _preparing as preparing_module

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("policy", ["exclude", "cancel"])
async def test_a_tool_result_given_as_the_next_turns_input_pairs_with_its_call(
    policy: OpenCallPolicy,
) -> None:
    """Issue small input: t2's input is the result of t1's call (an approval flow):
    prepare(t2) holds the user message, the call and its result, in that order, and
    under open_calls="cancel" nothing claims the call was cancelled."""
    async with Foundation(open_calls=policy) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(context_id="c", turn_id="t1", input=(user("Delete the old branch."),))
        )
        manager.record("c", "t1", [call("c1", "delete_branch")])
        manager.accept_turn(
            TurnSnapshot(context_id="c", turn_id="t2", input=(result("c1", "deleted"),))
        )
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        assert list(prepared.items) == [
            {"role": "user", "content": "Delete the old branch."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "delete_branch", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "deleted"},
        ]
        assert prepared.turn_start == 2
        assert CHAT.validate(prepared.items) == []
        assert list(prepared.items) == cold_render(manager, "c", "t2")


@pytest.mark.parametrize("policy", ["exclude", "cancel"])
async def test_after_failed_renders_every_prepared_input_equals_a_cold_render(
    anyio_backend: str, policy: OpenCallPolicy
) -> None:
    """Invariant: with a gateway failing renders at random points, every prepared input
    equals a cold render of the retained history and passes validate() (a short run of
    scripts/stress_render_failures.py)."""
    report = await run_stress(prepares=1_500, seed=len(anyio_backend) + len(policy), policy=policy)
    assert report.prepares == 1_500
    assert report.failed > 50  # failures really were injected mid-render
    assert report.approvals > 20
    assert report.evicted_turns > 100
    assert (report.wrong, report.invalid) == (0, 0)


# -- removal settles waiters ---------------------------------------------------------


async def test_removing_a_context_settles_its_waiters_and_frees_their_slots() -> None:
    """Issue small input: sixteen callers hang up while their next turn is awaited
    (waiting for its commit, each holds no slot: pending stays 0); remove_context
    ends all sixteen at once with ContextRemovedError (never admitted: counted
    neither failed nor discarded), and another session is served without
    QueueFullError."""
    async with Foundation(max_pending_preparations=16) as foundation:
        manager = foundation.manager
        errors: list[ContextRemovedError] = []
        for n in range(16):
            manager.accept_turn(
                TurnSnapshot(context_id=f"call-{n}", turn_id="t1", input=(user("hello"),))
            )

        async def waits_for_next_turn(context_id: str) -> None:
            try:
                await manager.prepare(ContextPrepareRequest(context_id=context_id, turn_id="t2"))
            except ContextRemovedError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as group:
            for n in range(16):
                group.start_soon(waits_for_next_turn, f"call-{n}")
            await anyio.wait_all_tasks_blocked()
            stats = manager.statistics()
            assert (stats.preparations.pending, stats.preparations.waiting_for_turn) == (0, 16)
            for n in range(16):
                manager.remove_context(f"call-{n}")
        assert sorted((e.context_id, e.turn_id) for e in errors) == sorted(
            (f"call-{n}", "t2") for n in range(16)
        )
        stats = manager.statistics()
        assert (
            stats.preparations.pending,
            stats.preparations.waiting_for_turn,
            stats.preparations.failed_total,
            stats.preparations.discarded_total,
        ) == (0, 0, 0, 0)
        manager.accept_turn(TurnSnapshot(context_id="other", turn_id="t1", input=(user("hi"),)))
        prepared = await manager.prepare_nowait(
            ContextPrepareRequest(context_id="other", turn_id="t1")
        )
        assert list(prepared.items) == [{"role": "user", "content": "hi"}]


async def test_a_context_created_again_never_serves_a_request_for_the_removed_one() -> None:
    """Issue small input: a request made for a context that is then removed and created
    again with the same id gets ContextRemovedError, never the new conversation. (It
    waits for the only slot, held by an admitted preparation whose assembly waits at
    a closed gate, while its context is removed and created again.)"""
    strategy = GatedStrategy()
    for query in ("old 2", "new 2"):
        strategy.open(query)
    async with Foundation(max_pending_preparations=1, strategy=strategy) as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="a", turn_id="t1", input=(user("a"),)))
        manager.accept_turn(TurnSnapshot(context_id="a", turn_id="t2", input=(user("a2"),)))
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("old"),)))
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(user("old 2"),)))
        outcome: list[object] = []

        async def holds_the_slot() -> None:
            outcome.append(
                await manager.prepare(ContextPrepareRequest(context_id="a", turn_id="t2"))
            )

        async def old_request() -> None:
            try:
                await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
            except ContextRemovedError as exc:
                outcome.append(exc.context_id)

        async with anyio.create_task_group() as group:
            group.start_soon(holds_the_slot)
            await anyio.wait_all_tasks_blocked()
            group.start_soon(old_request)  # waits for the slot
            await anyio.wait_all_tasks_blocked()
            assert manager.statistics().preparations.waiting_for_slot == 1
            manager.remove_context("c")
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("new"),)))
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(user("new 2"),)))
            strategy.open("a2")
        assert isinstance(outcome[0], PreparedContext) and outcome[1] == "c"
        assert strategy.entered == ["a2"]  # the old request never reached its assembly
        assert manager.statistics().preparations.pending == 0


# -- late delivery -------------------------------------------------------------------


async def test_a_section_whose_requester_was_cancelled_after_its_render_is_delivered_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue small input: the deadline fires after the worker's render returned but
    before its requester resumed: prepare raises the cancellation, and the one-shot
    notice the preparation rendered reaches the next requester, exactly once."""
    scopes: list[anyio.CancelScope] = []
    render_in_thread = preparing_module.Preparer._render_in_thread
    token = anyio.lowlevel.current_token()

    def returned_then_cancelled(self: Any, *args: Any) -> Any:
        rendered = render_in_thread(self, *args)
        if scopes:  # the requester's deadline fires as the render returns
            anyio.from_thread.run_sync(scopes.pop().cancel, token=token)
        return rendered

    monkeypatch.setattr(preparing_module.Preparer, "_render_in_thread", returned_then_cancelled)
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),)))
        manager.areas.attach("c", OneShotNotice("Boarding closes at 10:40."))
        request = ContextPrepareRequest(context_id="c", turn_id="t1")
        received: list[PreparedContext] = []
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            received.append(await manager.prepare(request))
        received.append(await manager.prepare(request))
        received.append(await manager.prepare(request))
        notice = {"role": "user", "content": "Boarding closes at 10:40."}
        carried = [p for p in received if notice in p.items]
        assert len(carried) == 1
        assert len(received) == 2  # the first requester got the cancellation
        stats = manager.statistics()
        assert stats.preparations.prepared_total == len(received)
        assert stats.preparations.discarded_total == 3 - len(received)
        assert stats.preparations.pending == 0


# -- duplicate records and late outputs --------------------------------------------


async def test_a_reply_committed_twice_is_kept_once() -> None:
    """Issue small input: the same message id recorded twice to a turn is stored and sent
    once (counted), and the same id with other content is a typed error."""
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),)))
        reply = Message(role=Role.assistant, content="Hello, how can I help?", id="r1")
        assert manager.record("c", "t1", [reply]) == 1
        assert manager.record("c", "t1", [reply]) == 0
        with pytest.raises(DuplicateIdError, match="'r1'"):
            manager.record("c", "t1", [Message(role=Role.assistant, content="Hel", id="r1")])
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(user("bye"),)))
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        assert [i["content"] for i in prepared.items] == ["hi", "Hello, how can I help?", "bye"]
        assert manager.statistics().history.duplicate_outputs_total == 1


async def test_late_outputs_long_after_eviction_or_for_a_reused_id_are_dropped() -> None:
    """Issue small inputs: a late output for a turn evicted more than 1,024 turns ago is
    dropped and counted (no UnknownTurnError); a late output of an invocation whose
    turn id was since reused never lands in the new turn."""
    async with Foundation(history_limits=HistoryLimits(max_turns=1)) as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t0", input=(user("q"),)))
        async with manager.invocation("c", "t0") as invocation:
            pass
        for n in range(1, 1_027):
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id=f"t{n}", input=(user("q"),)))
        assert manager.record("c", "t0", [assistant("late")]) == 0
        assert manager.record("c", "t1", [assistant("late too")]) == 0
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t0", input=(user("again"),)))
        assert invocation.record([assistant("late for the first t0")]) == 0
        assert manager.history("c").turn_messages("t0") == (user("again"),)
        assert manager.statistics().history.dropped_late_outputs_total == 3
        manager.remove_context("c")
        assert invocation.record([assistant("after removal")]) == 0
        assert manager.statistics().history.dropped_late_outputs_total == 4


async def test_a_record_to_a_turn_never_committed_names_the_context_and_changes_nothing() -> None:
    """Invariant: record to a turn id the context never held (a host mixing up its
    contexts or ids) raises UnknownTurnError naming the turn and the context, and
    nothing is recorded or counted."""
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="call-7", turn_id="t1", input=(user("hi"),)))
        statistics = manager.statistics()
        with pytest.raises(UnknownTurnError) as caught:
            manager.record("call-7", "t9", [assistant("Hello")])
        assert str(caught.value) == (
            "Turn 't9' was never committed to context 'call-7'; commit it with accept_turn "
            "before recording its outputs."
        )
        assert manager.history("call-7").turn_messages("t1") == (user("hi"),)
        assert manager.statistics() == statistics


# -- visible waiting -----------------------------------------------------------------


async def test_a_mistyped_turn_id_waits_visibly_and_the_timeout_names_it() -> None:
    """Invariant: a prepare for a turn never committed keeps waiting (prepare-before-
    accept), is counted in waiting_for_turn (not in pending: it holds no slot), and
    the documented fail_after pattern raises a TimeoutError naming the context and
    turn ids; never admitted, it is not counted as discarded."""
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="call-7", turn_id="t1", input=(user("hi"),)))
        request = ContextPrepareRequest(context_id="call-7", turn_id="t-1")
        caught: list[TimeoutError] = []
        deadlines: list[anyio.CancelScope] = []

        async def documented_pattern() -> None:
            reason = f"turn {request.turn_id!r} of context {request.context_id!r} not prepared"
            try:
                with anyio.fail_after(30, reason=reason) as deadline:
                    deadlines.append(deadline)
                    await manager.prepare(request)
            except TimeoutError as exc:
                caught.append(exc)

        async with anyio.create_task_group() as group:
            group.start_soon(documented_pattern)
            await anyio.wait_all_tasks_blocked()
            stats = manager.statistics()
            assert (stats.preparations.waiting_for_turn, stats.preparations.pending) == (1, 0)
            deadlines[0].deadline = anyio.current_time()  # the caller's deadline passes
        await anyio.wait_all_tasks_blocked()
        assert str(caught[0]) == "turn 't-1' of context 'call-7' not prepared"
        stats = manager.statistics()
        assert (
            stats.preparations.waiting_for_turn,
            stats.preparations.pending,
            stats.preparations.discarded_total,
        ) == (0, 0, 0)


# -- voice interruption ------------------------------------------------------------


async def test_an_interrupted_reply_is_recorded_as_far_as_it_was_played() -> None:
    """Issue: a barge-in records the assistant output truncated to what was played;
    its open call follows the open_calls policy in the next input."""
    for policy in ("exclude", "cancel"):
        async with Foundation(open_calls=policy) as foundation:
            manager = foundation.manager
            manager.accept_turn(
                TurnSnapshot(context_id="v", turn_id="t1", input=(user("Any flights?"),))
            )
            spoken = Message(
                role=Role.assistant,
                content=(
                    TextPart(text="There are three flights. "),
                    TextPart(text="The first leaves at nine."),
                    ToolCallPart(call_id="c1", name="hold_seat", arguments="{}"),
                ),
            )
            async with manager.invocation("v", "t1") as invocation:
                assert invocation.record_interrupted(spoken, played=31) == 1
            manager.accept_turn(TurnSnapshot(context_id="v", turn_id="t2", input=(user("Stop."),)))
            prepared = await manager.prepare(ContextPrepareRequest(context_id="v", turn_id="t2"))
            assert list(prepared.items) == cold_render(manager, "v", "t2")
            said = prepared.items[1]
            assert said["content"] == [
                {"type": "text", "text": "There are three flights. "},
                {"type": "text", "text": "The fi"},
            ]
            if policy == "exclude":
                assert "tool_calls" not in said
                assert len(prepared.items) == 3
            else:
                assert [c["id"] for c in said["tool_calls"]] == ["c1"]
                assert prepared.items[2]["tool_call_id"] == "c1"
            assert CHAT.validate(prepared.items) == []
            assert manager.voice.record_interrupted("v", "t2", assistant("Okay"), played=0) == 0


async def test_a_false_start_is_retracted_and_the_next_input_does_not_hold_it() -> None:
    """Issue: a committed turn that produced no answer (the user's speech was a false
    start) is retracted; the next prepared input does not hold it."""
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="v", turn_id="t1", input=(user("Hi."),)))
        manager.record("v", "t1", [assistant("Hello!")])
        manager.accept_turn(TurnSnapshot(context_id="v", turn_id="t2", input=(user("uhm"),)))
        manager.voice.retract_turn("v", "t2")
        manager.accept_turn(TurnSnapshot(context_id="v", turn_id="t3", input=(user("Book it."),)))
        prepared = await manager.prepare(ContextPrepareRequest(context_id="v", turn_id="t3"))
        assert [i["content"] for i in prepared.items] == ["Hi.", "Hello!", "Book it."]
        with pytest.raises(UnknownTurnError, match="retracted"):
            await manager.prepare(ContextPrepareRequest(context_id="v", turn_id="t2"))
        with pytest.raises(StateError, match="newest"):
            manager.voice.retract_turn("v", "t1")
        async with manager.invocation("v", "t3"):
            with pytest.raises(StateError, match="in flight"):
                manager.voice.retract_turn("v", "t3")
        assert manager.statistics().history.retracted_turns_total == 1

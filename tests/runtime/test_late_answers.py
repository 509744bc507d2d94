"""A late record never strands the results a later turn's input gave.

An approval flow gives the results of turn t1's calls as turn t2's input. An
output recorded to t1 afterwards (a model stream that finished late, a host
that answers the same call twice) lands in t1, before t2's input: an assistant
message or a second result for the call ends the group t2's results answered,
and pairing would then drop them, so t2's own prepared input would not hold
its input (only an assistant message on Anthropic and Gemini, which they
refuse). Such a record is refused with StateError before anything changes,
as a host expects of a record that contradicts what the model was already
shown; a late result for another call of the group is accepted.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.context.test_history_pairs import NEXT, calls
from tests.context.test_history_ties import _LIMITS, DONE, NOTED, _op, _step, cold_ties, tied
from tests.runtime.helpers import assistant, call, result, user
from turnloom.context import (
    GatewayType,
    Message,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    get_gateway,
)
from turnloom.context.history import HistoryLimits, TurnHistory
from turnloom.errors import (
    PairedTurnsTooLargeError,
    StateError,
    StrandedResultsError,
    TurnTooLargeError,
)
from turnloom.runtime import ContextManager, ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.runtime._records import checkpoint, replay

pytestmark = pytest.mark.anyio

SYSTEM = Message(role=Role.system, content="You manage the repository.")
ASK = user("Delete the old branches.")
TWO_CALLS = Message(
    role=Role.assistant,
    content=(
        ToolCallPart(call_id="c1", name="delete_branch", arguments='{"name": "a"}'),
        ToolCallPart(call_id="c2", name="delete_branch", arguments='{"name": "b"}'),
    ),
)
LATE = {
    "answer-again": result("c1", "deleted twice"),
}
# Assistant messages right after t1's calls continue their model step: they end nothing.
CONTINUING = {
    "text": assistant("Never mind, I will not delete it."),
    "new-call": call("c3", "list_branches"),
}


def _rules(manager: ContextManager, items: Any) -> list[str]:
    gateway = manager.gateway
    body = gateway.request_body(list(items))
    return [v.rule for v in gateway.validate(body[gateway.items_field])]


async def _approved(manager: ContextManager) -> ContextPrepareRequest:
    """t1 asks, the model calls c1 and c2; t2's input approves c1 (its result)."""
    manager.accept_turn(
        TurnSnapshot(context_id="c", turn_id="t1", input=(ASK,), instructions=(SYSTEM,))
    )
    manager.record("c", "t1", [TWO_CALLS])
    manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(result("c1"),)))
    return ContextPrepareRequest(context_id="c", turn_id="t2")


@pytest.mark.parametrize("kind", list(GatewayType), ids=lambda k: k.value)
@pytest.mark.parametrize("late", list(LATE))
async def test_a_late_record_that_would_strand_a_later_input_is_refused_state_unchanged(
    anyio_backend: str, kind: GatewayType, late: str
) -> None:
    """Invariant: a record to t1 that ends the group t2's input answers (a second
    result for c1) is a StrandedResultsError (a StateError) naming both turns
    and the stranded result's call id, in its message and fields; t1 and t2 hold what they
    held, t2 prepares byte for byte as before and its prepared input ends with its own
    result of c1, valid for the gateway."""
    async with Foundation(gateway=kind) as foundation:
        manager = foundation.manager
        request = await _approved(manager)
        before = await manager.prepare(request)
        held = manager.history("c").messages()
        with pytest.raises(StateError) as caught:
            manager.record("c", "t1", [LATE[late]])
        assert str(caught.value) == (
            "A late output of turn 't1' would leave results that turn 't2' holds answering "
            "no tool call (it ends their call group, or answers their call first), so they "
            "would leave every later model input; nothing was recorded."
        )
        assert type(caught.value) is StrandedResultsError
        assert isinstance(caught.value, StateError)  # an ``except StateError`` still holds
        assert (caught.value.turn_id, caught.value.stranded_turn_id) == ("t1", "t2")
        assert caught.value.call_ids == ("c1",)
        assert manager.history("c").messages() == held
        after = await manager.prepare(request)
        assert list(after.items) == list(before.items)
        assert manager.request_bytes(after, []) == manager.request_bytes(before, [])
        assert _rules(manager, after.items) == []
        assert manager.history("c").turn_input("t2") == (result("c1"),)
        assert manager.request_bytes(after, []).count(b'"c1"') == 2  # the call and t2's result


@pytest.mark.parametrize("kind", list(GatewayType), ids=lambda k: k.value)
@pytest.mark.parametrize("late", list(CONTINUING))
async def test_a_late_assistant_message_continues_the_step_and_strands_nothing(
    anyio_backend: str, kind: GatewayType, late: str
) -> None:
    """A late text or call to t1 continues the step of its calls (no response follows a
    call before its result): recorded, and t2's input still answers c1, valid."""
    async with Foundation(gateway=kind) as foundation:
        manager = foundation.manager
        request = await _approved(manager)
        assert manager.record("c", "t1", [CONTINUING[late]]) == 1
        after = await manager.prepare(request)
        assert _rules(manager, after.items) == []
        assert manager.request_bytes(after, []).count(b'"c1"') == 2  # the call and t2's result


@pytest.mark.parametrize("kind", list(GatewayType), ids=lambda k: k.value)
async def test_a_late_result_of_another_call_of_the_group_is_recorded(
    anyio_backend: str, kind: GatewayType
) -> None:
    """The contrast: a late result of c2 (the group's other call) ends nothing, so t2 keeps
    its answer to c1; the record is accepted and t2's prepared input holds both results,
    valid for the gateway."""
    async with Foundation(gateway=kind) as foundation:
        manager = foundation.manager
        request = await _approved(manager)
        assert manager.record("c", "t1", [result("c2", "kept")]) == 1
        prepared = await manager.prepare(request)
        assert _rules(manager, prepared.items) == []
        results = [
            (p.call_id, p.content)
            for m in manager.history("c").messages()
            for p in m.parts
            if isinstance(p, ToolResultPart)
        ]
        assert results == [
            ("c2", (TextPart(text="kept"),)),
            ("c1", (TextPart(text="ok"),)),
        ]
        encoded = manager.request_bytes(prepared, [])
        assert encoded.count(b'"c1"') == 2 and encoded.count(b'"c2"') == 2


def test_a_late_call_that_ties_turns_the_limits_cannot_hold_is_refused() -> None:
    """Invariant: a late record that makes a later input answer a call (the host committed
    the result before recording the call) ties the turns as that input's commit would, so
    they must fit the limits together: t1 and t2 would hold 5 items (max_items=4), so the
    record is a PairedTurnsTooLargeError and nothing changes; otherwise the history would
    hold what no checkpoint of it can restore."""
    history = TurnHistory(HistoryLimits(max_items=4))
    history.commit("t1", [ASK], instructions=[SYSTEM])
    history.commit("t2", [result("c1"), user("Go on.")])
    history.record("t2", [assistant("Done.")])
    messages = history.view().messages()
    with pytest.raises(PairedTurnsTooLargeError) as caught:
        history.record("t1", [call("c1", "delete_branch")])
    assert str(caught.value) == (
        "Turn 't1' output would make turns 't1' to 't2', which eviction keeps together "
        "(results given as a turn's input stay with their calls), hold at least 5 items, "
        "over the history's max_items of 4."
    )
    assert (caught.value.turn_id, caught.value.first_turn_id) == ("t1", "t1")
    assert history.view().messages() == messages
    assert tied(history) == cold_ties(history) == ()
    restored = replay("c", [checkpoint(history.view(), history.evicted_ids, None)], history.limits)
    assert restored.view().messages() == messages


def test_a_late_record_to_an_earlier_tied_unit_is_held_to_its_limits() -> None:
    """Invariant: t2 answers t1's call (t1..t2 tied, 3 items, max_items=4), then plain t3
    arrives before t2's answer is recorded (a barge-in while t2's model call was in
    flight). The late record of two messages to t2 would make t1..t2 hold 5 items: it is
    refused as it would be were t2 still the newest (PairedTurnsTooLargeError naming
    t2 and t1), nothing changes, and the history restores from its checkpoint (which
    records t2's outputs while t2 is its newest turn, so it holds them to t1..t2's
    limits). One message fits and is recorded; at the next safe point t1..t2 leave
    together."""
    history = TurnHistory(HistoryLimits(max_items=4))
    history.commit("t1", [ASK], instructions=[SYSTEM])
    history.record("t1", [calls("c1")])
    history.commit("t2", [result("c1")])
    history.commit("t3", [NEXT])
    assert tied(history) == ("t2",)
    messages = history.view().messages()
    with pytest.raises(PairedTurnsTooLargeError) as caught:
        history.record("t2", [NOTED, DONE])
    assert (caught.value.unit, caught.value.size, caught.value.limit) == ("items", 5, 4)
    assert (caught.value.turn_id, caught.value.first_turn_id) == ("t2", "t1")
    assert history.view().messages() == messages
    assert history.record("t2", [DONE]) == 1
    restored = replay("c", [checkpoint(history.view(), (), None)], history.limits)
    assert restored.view().messages() == history.view().messages()
    assert tied(restored) == tied(history) == ("t2",)
    assert history.evict() == ("t1", "t2")


def _same_as_restored(history: TurnHistory) -> None:
    """The checkpoint of ``history`` restores to the same turns, ties and renders."""
    data = checkpoint(history.view(), history.evicted_ids, history.sequence)
    restored = replay("c", [data], history.limits)
    assert restored.turn_ids == history.turn_ids
    assert restored.view().messages() == history.view().messages()
    assert tied(restored) == tied(history)
    for kind in GatewayType:
        gateway = get_gateway(kind)
        newest = history.turn_ids[-1]
        assert list(restored.view().render(gateway, newest).items) == list(
            history.view().render(gateway, newest).items
        )


_RESTORE_LIMITS = st.one_of(
    _LIMITS,
    st.builds(HistoryLimits, max_bytes=st.integers(200, 2000)),
    st.builds(HistoryLimits, max_tokens=st.integers(20, 300)),
)


@settings(max_examples=300)
@given(_RESTORE_LIMITS, st.lists(_op, min_size=1, max_size=25))
# A late record to an earlier tied unit (t0..t2; t3 committed, not evicted yet).
@example(HistoryLimits(max_bytes=522), [("calls", 0), ("answer", 0), ("user", 0), ("calls", 1)])
def test_every_history_restores_from_its_checkpoint_and_renders_valid(
    limits: HistoryLimits, ops: list[tuple[str, int]]
) -> None:
    """Invariant: after every commit, record (late or not), kept state, retraction and
    eviction, a checkpoint of the history restores to the same turns, messages and ties,
    and its newest turn renders the same items on every gateway (the door's refusals are
    the runtime's: see test_manager_stateful); refused steps change nothing."""
    history = TurnHistory(limits)
    history.commit("t0", [user("hello")], instructions=[SYSTEM])
    for step, (kind, n) in enumerate(ops, start=1):
        before = history.view().messages()
        try:
            _step(history, kind, n, step)
        except (TurnTooLargeError, StateError):
            assert history.view().messages() == before
        _same_as_restored(history)

"""A tie never outlives its reason.

A turn is *tied* to the turn before it when its input (or a later turn's, past
results-only turns) answers calls made before it; eviction never separates tied
turns, and a commit or record the tied turns cannot fit together is refused.
The ties must be exactly what the kept turns say now: a late record, kept state
or a retraction can end the group a later input answered, and a tie left behind
would keep turns together (and refuse records) for nothing. The oracle is a cold
rebuild: one CallTracker fed the kept turns from scratch.
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.context.test_history_pairs import ASK, NEXT, SYSTEM, calls, result
from turnloom.context import CallTracker, GatewayType, Message, Role, get_gateway
from turnloom.context.history import HistoryLimits, TurnHistory
from turnloom.errors import (
    AmbiguousStepError,
    PairedTurnsTooLargeError,
    StateError,
    StrandedResultsError,
    TurnTooLargeError,
)

NEVER_MIND = Message(role=Role.assistant, content="Never mind, I will not delete it.")
DONE = Message(role=Role.assistant, content="Deleted.")
NOTED = Message(role=Role.assistant, content="Noted.")
CHAT = get_gateway(GatewayType.openai_chat)


def tied(history: TurnHistory) -> tuple[str, ...]:
    """The kept turns tied to the turn before them, oldest first (the history's own set)."""
    linked = history._linked
    return tuple(t for t in history.turn_ids if history.turn_serial(t) in linked)


def cold_ties(history: TurnHistory) -> tuple[str, ...]:
    """The oracle: the ties a cold rebuild of the kept turns computes.

    One tracker is fed every kept message, oldest first (input, kept state,
    outputs of each turn); a turn whose input pairs a result with a call of
    an earlier turn ties every turn after the calls' turn up to itself.
    """
    view = history.view()
    tracker = CallTracker()
    owner = -1  # index of the turn whose assistant message opened the current group
    linked: set[int] = set()
    for index, turn_id in enumerate(view.turn_ids):
        given = view.turn_input(turn_id)
        rest = view.turn_state(turn_id) + view.turn_messages(turn_id)[len(given) :]
        for message in given:
            if tracker.feed(message).paired and owner < index:
                linked.update(range(owner + 1, index + 1))
            if message.role is Role.assistant and tracker.open:
                owner = index
        for message in rest:
            tracker.feed(message)
            if message.role is Role.assistant and tracker.open:
                owner = index
    return tuple(t for i, t in enumerate(view.turn_ids) if i in linked)


# A late user message ends t1's call group (a late assistant message would
# continue the calls' model step instead, see CallTracker).
HOLD_ON = Message(role=Role.user, content="Hold on.")


def _asked(limits: HistoryLimits, *ids: str) -> TurnHistory:
    """t1 asks, and the model calls ``ids``."""
    history = TurnHistory(limits)
    history.commit("t1", [ASK], instructions=[SYSTEM])
    history.record("t1", [calls(*ids)])
    return history


def test_a_late_output_that_would_close_the_approved_calls_is_refused_state_unchanged() -> None:
    """Invariant: t2 answers t1's call (tied); a late output of t1 would end t1's call group
    so that t2's result answers nothing and t2's input leaves its own render: it is a
    StateError and nothing changes (messages, tie, render): t2's answer is recorded and
    t1 and t2 (4 items, max_items=4) stay together."""
    history = _asked(HistoryLimits(low_water=1.0, max_items=4), "c1")
    history.commit("t2", [result("c1")])
    assert tied(history) == ("t2",)
    before = history.view()
    rendered = list(before.render(CHAT, "t2").items)
    with pytest.raises(StateError, match="turn 't2' holds answering no tool call"):
        history.record("t1", [HOLD_ON])
    assert history.view().messages() == before.messages()
    assert list(history.view().render(CHAT, "t2").items) == rendered
    assert tied(history) == cold_ties(history) == ("t2",)
    assert history.record("t2", [DONE]) == 1
    assert history.evict() == ()


def test_a_stranding_record_names_the_later_turn_and_its_results_in_held_order() -> None:
    """Invariant: the refusal is a StrandedResultsError (a StateError) whose fields name the
    turn recorded to, the first later turn whose results would answer nothing and those
    results' call ids in the order that turn holds them (c3, then c1: not sorted); t3's
    result of c4 would be stranded too, but only the first such turn is named. Nothing
    changes."""
    history = _asked(HistoryLimits(low_water=1.0, max_turns=6), "c1", "c2", "c3", "c4")
    history.commit("t2", [result("c3"), result("c1")])
    history.commit("t3", [result("c4")])
    before = history.view().messages()
    with pytest.raises(StrandedResultsError) as caught:
        history.record("t1", [HOLD_ON])
    assert isinstance(caught.value, StateError)
    assert (caught.value.turn_id, caught.value.stranded_turn_id) == ("t1", "t2")
    assert caught.value.call_ids == ("c3", "c1")
    assert history.view().messages() == before
    assert tied(history) == cold_ties(history) == ("t2", "t3")


def test_the_same_record_is_refused_while_the_tie_holds() -> None:
    """The contrast: t1's text comes before its call, so the group stays open, t2's result
    answers it and t1..t2 (4 items with the record's) cannot take a fifth."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_items=4))
    history.commit("t1", [ASK], instructions=[SYSTEM])
    history.record("t1", [NOTED, calls("c1")])
    history.commit("t2", [result("c1")])
    assert tied(history) == cold_ties(history) == ("t2",)
    with pytest.raises(PairedTurnsTooLargeError) as caught:
        history.record("t2", [DONE])
    assert (caught.value.unit, caught.value.size, caught.value.limit) == ("items", 5, 4)
    assert (caught.value.turn_id, caught.value.first_turn_id) == ("t2", "t1")


def test_an_input_answering_its_own_calls_is_not_tied_to_the_open_ones() -> None:
    """Invariant: an input that makes calls and answers them (a replayed exchange) ends the
    open group first; its results answer its own calls, so it is not tied."""
    history = _asked(HistoryLimits(low_water=1.0, max_turns=2), "c1")
    history.commit("t2", [calls("c1"), result("c1")])
    assert tied(history) == cold_ties(history) == ()
    history.commit("t3", [NEXT])
    assert history.evict() == ("t1",)


def test_kept_state_that_would_end_the_group_a_later_input_answers_is_not_kept() -> None:
    """Invariant: t2 answers c1 and t3 answers c2 of t1 (t1..t3 tied); state kept on t2
    later would sit between t2's input and t3's result and end t1's group, so t3's result
    would answer nothing: keep_state returns False and nothing changes; t1..t3 stay tied
    and with max_turns=3 a plain t4 evicts them together. State that does not end the
    group (none, on t3) is kept."""
    history = _asked(HistoryLimits(low_water=1.0, max_turns=3), "c1", "c2")
    history.commit("t2", [result("c1")])
    history.commit("t3", [result("c2")])
    assert tied(history) == ("t2", "t3")
    messages = history.view().messages()
    assert history.keep_state("t2", [NOTED]) is False
    assert history.view().messages() == messages
    assert history.view().turn_state("t2") == ()
    assert history.keep_state("t3", [NOTED]) is True
    assert tied(history) == cold_ties(history) == ("t2", "t3")
    history.commit("t4", [NEXT])
    assert history.evict() == ("t1", "t2", "t3")
    assert history.turn_ids == ("t4",)


def test_retracting_the_answer_unties_the_turns_it_tied() -> None:
    """Invariant: t2's input answers nothing (an unknown call id) and t3 answers t1's call
    past it (t2, t3 tied for t3's sake); retracting t3 unties t2, so with max_turns=3
    plain t3b and t4 evict t1 alone."""
    history = _asked(HistoryLimits(low_water=1.0, max_turns=3), "c1")
    history.commit("t2", [result("z9")])
    assert tied(history) == ()
    history.commit("t3", [result("c1")])
    assert tied(history) == ("t2", "t3")
    history.retract("t3")
    assert tied(history) == cold_ties(history) == ()
    history.commit("t3b", [NEXT])
    history.commit("t4", [NEXT])
    assert history.evict() == ("t1",)
    assert history.turn_ids == ("t2", "t3b", "t4")


def test_a_late_call_answered_by_the_next_input_ties_it() -> None:
    """Ties are still added by a late record: t1's late call c1 is answered by t2's input."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=3))
    history.commit("t1", [ASK])
    history.commit("t2", [result("c1")])
    assert tied(history) == ()
    history.record("t1", [calls("c1")])
    assert tied(history) == cold_ties(history) == ("t2",)


# -- property: the tie set equals a cold rebuild after every step ------------------

_op = st.one_of(
    st.tuples(st.just("user"), st.integers(0, 5)),
    st.tuples(st.just("calls"), st.integers(0, 5)),
    st.tuples(st.just("text"), st.integers(0, 5)),
    st.tuples(st.just("answer"), st.integers(0, 5)),
    st.tuples(st.just("orphan"), st.integers(0, 5)),
    st.tuples(st.just("inline"), st.integers(0, 5)),
    st.tuples(st.just("state"), st.integers(0, 5)),
    st.tuples(st.just("retract"), st.integers(0, 5)),
    st.tuples(st.just("evict"), st.integers(0, 5)),
)

_LIMITS = st.one_of(
    st.builds(HistoryLimits, max_turns=st.integers(1, 6)),
    st.builds(HistoryLimits, max_items=st.integers(3, 14)),
    st.builds(HistoryLimits, max_turns=st.integers(2, 8), max_items=st.integers(6, 20)),
)


def _step(history: TurnHistory, kind: str, n: int, step: int) -> None:
    """One host step; ``n`` picks the turn (counted back from the newest) and the ids."""
    turn_ids = history.turn_ids
    target = turn_ids[-1 - n % len(turn_ids)]
    call_ids = [f"c{k}" for k in range(n % 3 + 1)]  # reused ids across turns, on purpose
    if kind == "user":
        history.commit(f"t{step}", [Message(role=Role.user, content=f"question {step}")])
    elif kind == "calls":
        # A call id the target's open step holds already is refused (AmbiguousStepError).
        with contextlib.suppress(AmbiguousStepError):
            history.record(target, [calls(*call_ids)])
    elif kind == "text":
        history.record(target, [Message(role=Role.assistant, content=f"answer {step}")])
    elif kind == "answer":
        open_ids = [c.call_id for c in history.open_calls()]
        answered = open_ids[: 1 + n % max(len(open_ids), 1)] or call_ids[:1]
        history.commit(f"t{step}", [result(i) for i in answered])
    elif kind == "orphan":
        history.commit(f"t{step}", [result(f"z{n}")])
    elif kind == "inline":
        history.commit(f"t{step}", [calls(*call_ids), *(result(i) for i in call_ids[: n % 2 + 1])])
    elif kind == "state":
        state = [NOTED] if n % 2 else [calls(f"s{step}"), result(f"s{step}")]
        history.keep_state(target, state if n % 3 else [])
    elif kind == "retract":
        if len(turn_ids) > 1:
            history.retract(turn_ids[-1])
    else:
        history.evict()


@settings(max_examples=300)
@given(_LIMITS, st.lists(_op, min_size=1, max_size=30))
@example(
    HistoryLimits(low_water=1.0, max_turns=6),
    [("calls", 1), ("answer", 0), ("answer", 0), ("text", 2)],
)
@example(
    HistoryLimits(low_water=1.0, max_turns=6),
    [("calls", 1), ("answer", 0), ("answer", 0), ("state", 1)],
)
@example(
    HistoryLimits(low_water=1.0, max_turns=6),
    [("calls", 0), ("orphan", 0), ("answer", 0), ("retract", 0)],
)
def test_the_ties_always_equal_a_cold_rebuild_of_the_kept_turns(
    limits: HistoryLimits, ops: list[tuple[str, int]]
) -> None:
    """Invariant: after every commit, record (late or not), kept state, retraction and
    eviction, the history's tie set is exactly what a cold rebuild of the kept turns
    computes, so it is bounded by them (never more ties than kept turns less one, and
    none for a gone turn). Refused steps change nothing."""
    history = TurnHistory(limits)
    history.commit("t0", [Message(role=Role.user, content="hello")], instructions=[SYSTEM])
    for step, (kind, n) in enumerate(ops, start=1):
        try:
            _step(history, kind, n, step)
        except (TurnTooLargeError, StateError):
            pass
        assert tied(history) == cold_ties(history)
        assert len(history._linked) == len(tied(history)) < len(history.turn_ids)
        assert history.turn_ids[0] not in tied(history)

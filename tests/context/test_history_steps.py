"""The pairing state a history keeps after a turn's last step (issue 32: the door's cut).

A record of tool results reads the pairing state after its turn's last model
step twice (the door's sent ids, then the step check); the history keeps it
(``TurnHistory._steps``) and advances it per record instead of walking the
step again. A hypothesis state machine drives a history through commits,
door checks, records (calls from a pool of three ids, results answering them
or nothing, text, blank and duplicate messages, user messages holding
results), late records, evictions and retractions, many of them refused, and
checks after every step:

1. the kept state equals a cold computation from its turn (``cold_steps``):
   the step's start, the tracker (open calls in order, group, model turn),
   the renamed calls' sent ids and the closed call ids;
2. a twin history that gets the same calls with its kept state dropped
   before each one (every read cold, as before the cut) raises the same
   errors (type and text) and sends every entry with the same ids.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from turnloom.context import (
    Message,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    get_gateway,
)
from turnloom.context._untrack import GC_UNTRACK
from turnloom.context.history import HistoryLimits, TurnHistory
from turnloom.context.history._steps import _StepState, cold_steps
from turnloom.errors import TurnloomError, UnpairedResultError

IDS = ("c0", "c1", "c2")
GATEWAY = get_gateway("openai_chat")
LIMITS = HistoryLimits(low_water=1.0, max_turns=3, max_items=24, max_bytes=1 << 20)


def _calls(ids: tuple[str, ...], text: str | None = None) -> Message:
    parts: list[Any] = [TextPart(text=text)] if text else []
    parts += [ToolCallPart(call_id=i, name="f", arguments="{}") for i in ids]
    return Message(role=Role.assistant, content=tuple(parts))


def _result(call_id: str, user: bool = False) -> Message:
    part = ToolResultPart(call_id=call_id, content=(TextPart(text=f"r {call_id}"),))
    return Message(role=Role.user if user else Role.tool, content=(part,))


_MESSAGES = st.one_of(
    st.lists(st.sampled_from(IDS), min_size=1, max_size=2, unique=True).map(
        lambda ids: _calls(tuple(ids))
    ),
    st.sampled_from(IDS).map(lambda i: _calls((i,), "and")),
    st.sampled_from(IDS).map(_result),
    st.sampled_from(IDS).map(lambda i: _result(i, user=True)),
    st.sampled_from(["hello", " ", "done"]).map(lambda t: Message(role=Role.assistant, content=t)),
    st.just(Message(role=Role.user, content="more")),
    st.just(Message(role=Role.assistant, content="again", id="m1")),
)


def _state(step: _StepState) -> tuple[object, ...]:
    tracker = step.tracker
    return (
        step.count,
        step.start,
        None if tracker is None else list(tracker.open.items()),
        None if tracker is None else tracker.group,
        None if tracker is None else tracker._in_model_turn,
        step.sent,
        step.closed,
    )


def _sent(history: TurnHistory) -> list[list[tuple[str, ...]]]:
    return [[e.sent_ids() for e in t.entries(True)] for t in history._turns]


class StepMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.kept = TurnHistory(LIMITS)  # keeps and advances its step state
        self.cold = TurnHistory(LIMITS)  # its step state dropped before every call
        self.turns = 0

    def _both(self, action: Any) -> None:
        """Apply ``action`` to both histories: the same outcome, error or not."""
        outcomes = []
        for history in (self.kept, self.cold):
            if history is self.cold:
                history._steps = None
            try:
                outcomes.append(("ok", action(history)))
            except TurnloomError as exc:
                outcomes.append((type(exc), str(exc)))
        assert outcomes[0] == outcomes[1]

    @rule(results=st.lists(st.sampled_from(IDS), max_size=2))
    def commit(self, results: list[str]) -> None:
        turn_id = f"t{self.turns}"
        self.turns += 1
        batch = [_result(i) for i in results] + [Message(role=Role.user, content=turn_id)]

        def act(history: TurnHistory) -> None:
            history.check_batch(batch, "input", gateway=GATEWAY)
            history.commit(turn_id, batch)

        self._both(act)

    @precondition(lambda self: self.kept.turn_ids)
    @rule(
        batch=st.lists(_MESSAGES, min_size=1, max_size=3),
        back=st.integers(0, 2),
        door=st.booleans(),
    )
    def record(self, batch: list[Message], back: int, door: bool) -> None:
        ids = self.kept.turn_ids
        turn_id = ids[max(0, len(ids) - 1 - back)]

        def act(history: TurnHistory) -> int:
            if door:
                history.check_batch(batch, "output", turn_id=turn_id, gateway=GATEWAY)
            return history.record(turn_id, batch)

        self._both(act)

    @rule()
    def evict(self) -> None:
        self._both(lambda history: history.evict())

    @precondition(lambda self: self.kept.turn_ids)
    @rule()
    def retract(self) -> None:
        turn_id = self.kept.turn_ids[-1]
        self._both(lambda history: history.retract(turn_id))

    @invariant()
    def kept_equals_cold(self) -> None:
        # (1) the kept state is what a cold walk of its turn gives
        step = self.kept._steps
        if step is not None:
            assert _state(step) == _state(cold_steps(step.turn))
        # (2) the same sent ids, entry by entry, and the same ids held
        assert _sent(self.kept) == _sent(self.cold)
        assert self.kept._sent.present == self.cold._sent.present


TestSteps = StepMachine.TestCase
TestSteps.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


def _renamed_step(history: TurnHistory, ids: tuple[str, ...]) -> None:
    """Turns t0 and t1 both calling ``ids``: t1's calls are sent renamed, so the door pairs."""
    history.commit("t0", [Message(role=Role.user, content="hi")])
    history.record("t0", [_calls(ids)])
    history.commit("t1", [_result(ids[0]), Message(role=Role.user, content="go")])
    history.record("t1", [_calls(ids)])


def test_door_of_two_results_leaves_the_kept_state() -> None:
    """The door reads the kept state of the newest step without changing it: a batch of
    two results (the door feeds the first before deciding the second) leaves it equal
    to a cold walk, and the record then pairs both (no UnpairedResultError)."""
    history = TurnHistory()
    _renamed_step(history, ("c0", "c1"))
    history.record("t1", [_result("c0")])  # keeps t1's state
    history.record("t1", [_calls(("c2",), "more")])
    history.record("t1", [_result("c2")])
    step = history._steps
    assert step is not None and step.turn is history._turns[-1]
    history.record("t1", [_calls(("c0", "c1"), "again")])
    history.check_batch([_result("c0")], "output", turn_id="t1", gateway=GATEWAY)
    step = history._steps
    assert step is not None and step.turn is history._turns[-1]
    batch = [_result("c0"), _result("c1")]
    history.check_batch(batch, "output", turn_id="t1", gateway=GATEWAY)
    assert _state(step) == _state(cold_steps(step.turn))
    assert history.record("t1", batch) == 2
    assert [e.sent_ids() for e in history._turns[-1].outputs[-2:]] == [("c0_r3",), ("c1_r3",)]


def test_door_of_a_commit_leaves_the_kept_state() -> None:
    """A commit's door (a new turn: the tracker crosses a turn boundary) reads a copy of
    the newest turn's kept state: after it, the state still equals a cold walk."""
    history = TurnHistory()
    _renamed_step(history, ("c0", "c1"))
    history.check_batch([_result("c0")], "output", turn_id="t1", gateway=GATEWAY)
    step = history._steps
    assert step is not None and step.tracker is not None and step.tracker._in_model_turn
    history.check_batch([_result("c0")], "input", gateway=GATEWAY)
    assert _state(step) == _state(cold_steps(step.turn))
    assert step.tracker._in_model_turn


def test_steps_advance_over_results() -> None:
    """A step of three calls answered one result per record: the state is advanced
    (the same object, its turn each new one), equal to a cold walk after each record."""
    history = TurnHistory()
    _renamed_step(history, IDS)
    kept = None
    for call_id in IDS:
        batch = [_result(call_id)]
        history.check_batch(batch, "output", turn_id="t1", gateway=GATEWAY)
        history.record("t1", batch)
        step = history._steps
        assert step is not None and step.turn is history._turns[-1]
        assert kept is None or step is kept
        kept = step
        assert _state(step) == _state(cold_steps(step.turn))
    assert kept is not None and kept.tracker is not None
    assert list(kept.tracker.open) == []
    if GC_UNTRACK is not None:  # kept out of the cyclic collector, as other bookkeeping
        held = (kept, kept.tracker, kept.tracker.open, kept.sent, kept.closed)
        assert [gc.is_tracked(o) for o in held] == [False] * 5
    assert kept.start == 2  # after the input's two messages
    assert kept.sent == {"c0": "c0_r2", "c1": "c1_r2", "c2": "c2_r2"}


def test_refused_record_names_the_message_and_keeps_no_fed_state() -> None:
    """A record refused by the step check (its second result answers no open call)
    names that message, as a check from a cold walk does, and leaves no state fed with
    its first result: the history's state is None or equal to a cold walk."""
    history = TurnHistory()
    _renamed_step(history, ("c0", "c1"))
    history.record("t1", [_result("c0")])  # keeps t1's state
    batch = [_result("c1"), _result("c0")]
    with pytest.raises(UnpairedResultError) as caught:
        history.record("t1", batch)
    assert caught.value.field == "Turn 't1' output[1]"
    assert caught.value.call_id == "c0"
    assert str(caught.value).startswith("Turn 't1' output[1] holds a tool result for call 'c0'")
    step = history._steps
    assert step is None or _state(step) == _state(cold_steps(step.turn))
    assert history.record("t1", [_result("c1")]) == 1


def test_late_record_leaves_the_newest_turns_state() -> None:
    """A late record (a result for a call of the turn before the newest) changes
    another turn than the one whose state is kept: the kept state stays the newest
    turn's, equal to a cold walk of it."""
    history = TurnHistory()
    history.commit("t0", [Message(role=Role.user, content="hi")])
    history.record("t0", [_calls(("a0",))])
    history.commit("t1", [Message(role=Role.user, content="meanwhile")])
    history.record("t1", [_calls(("b0", "b1"))])
    history.record("t1", [_result("b0")])
    newest = history._turns[-1]
    step = history._steps
    assert step is not None and step.turn is newest
    assert history.record("t0", [_result("a0")]) == 1  # late: t0 is not the newest
    assert history._turns[-1] is newest
    assert history._steps is step and step.turn is newest
    assert _state(step) == _state(cold_steps(newest))
    assert history.record("t1", [_result("b1")]) == 1

"""The held turns (``_Turns``): each change a new sequence; every view keeps its turns.

A history's turns change at every commit (appended), record (the newest
replaced), eviction (dropped at the front), retraction (the newest popped)
and summary (the oldest replaced by one in front), and a late record, kept
state, restored sent ids or pruning replace an earlier turn. ``_Turns`` holds them in
blocks of immutable tuples, so a change copies a block and the tuple of
blocks, never every turn (issue 32: nothing proportional to history on the
event loop), and shares the rest with the sequence it was made from.

Two hypothesis state machines, with blocks of 2 turns or of 1 (so a handful
of turns spans many blocks and every path between blocks is taken):

* :class:`TurnsMachine` compares ``_Turns`` with a plain tuple model through
  appends, replacements, front drops, pops, prepends and rebuilds, with
  snapshots taken in between: every snapshot keeps exactly its turns.
* :class:`TurnStoreMachine` drives real histories (the eviction machine's
  commits, records, late records, kept state, evictions, retractions, false
  starts and renders, plus summaries and pruning) and takes views in
  between: every view keeps the very turns, ids and messages it was taken
  with, and the history's turns stay well formed. Its false starts run with
  a summary turn held too (one the second eviction of a false start drops is
  restored in front), and renders after a pruning equal cold renders.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import turnloom.context.history._turns as store
from tests.context.test_history import assistant, user
from tests.context.test_history_evict_stateful import HISTORIES, EvictionMachine
from turnloom.context.history import (
    TurnHistory,
    apply_summary,
    next_summary_id,
    prune_turns,
    summary_range,
)
from turnloom.context.history._turns import EMPTY, _Turns
from turnloom.errors import TurnloomError


@contextlib.contextmanager
def blocks_of(shift: int) -> Iterator[None]:
    """Blocks of ``2 ** shift`` turns for the block (every ``_Turns`` made within it)."""
    saved = (store._SHIFT, store.BLOCK, store._MASK)
    store._SHIFT, store.BLOCK, store._MASK = shift, 1 << shift, (1 << shift) - 1
    try:
        yield
    finally:
        store._SHIFT, store.BLOCK, store._MASK = saved


def well_formed(turns: _Turns) -> None:
    """The block invariant every read relies on."""
    blocks = turns.blocks
    assert all(type(b) is tuple and b for b in blocks)
    assert all(len(b) <= store.BLOCK for b in blocks)
    assert all(len(b) == store.BLOCK for b in blocks[1:-1])  # all full but the ends
    assert turns.first == (len(blocks[0]) if blocks else 0)
    assert turns.size == sum(map(len, blocks))
    assert (turns is EMPTY) or turns.size > 0


def same(turns: _Turns, model: tuple[Any, ...]) -> None:
    """``turns`` reads as ``model`` (the very objects) by every read the history uses."""
    well_formed(turns)
    n = len(model)
    assert (len(turns), bool(turns)) == (n, bool(model))
    assert len(list(turns)) == n and all(a is b for a, b in zip(turns, model, strict=True))
    assert all(a is b for a, b in zip(reversed(turns), reversed(model), strict=True))
    for index in range(-n - 2, n + 2):
        if -n <= index < n:
            assert turns[index] is model[index]
        else:
            with pytest.raises(IndexError):
                turns[index]


class TurnsMachine(RuleBasedStateMachine):
    """``_Turns`` against a plain tuple, with snapshots (views) taken in between."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = blocks_of(1)
        self.blocks.__enter__()
        self.turns: _Turns = EMPTY
        self.model: tuple[Any, ...] = ()
        self.made = 0
        self.snapshots: list[tuple[_Turns, tuple[Any, ...]]] = []

    def teardown(self) -> None:
        self.blocks.__exit__(None, None, None)

    def _new(self) -> object:
        self.made += 1
        return f"turn {self.made}"  # a new object each time: compared by identity

    @rule(n=st.integers(1, 6))
    def append(self, n: int) -> None:
        for _ in range(n):
            turn = self._new()
            self.turns, self.model = self.turns.appended(turn), (*self.model, turn)  # type: ignore[arg-type]

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def replace(self, data: st.DataObject) -> None:
        position = data.draw(st.integers(0, len(self.model) - 1))
        turn = self._new()
        self.turns = self.turns.replaced(position, turn)  # type: ignore[arg-type]
        self.model = (*self.model[:position], turn, *self.model[position + 1 :])

    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        count = data.draw(st.integers(0, len(self.model) + 1))
        self.turns, self.model = self.turns.dropped(count), self.model[count:]

    @precondition(lambda self: self.model)
    @rule()
    def pop(self) -> None:
        self.turns, self.model = self.turns.popped(), self.model[:-1]

    @rule()
    def prepend(self) -> None:
        turn = self._new()
        self.turns, self.model = self.turns.prepended(turn), (turn, *self.model)  # type: ignore[arg-type]

    @rule()
    def rebuild(self) -> None:
        self.turns = _Turns.of(self.model)

    @rule()
    def snapshot(self) -> None:
        self.snapshots.append((self.turns, self.model))

    @rule(data=st.data())
    def slice(self, data: st.DataObject) -> None:
        n = len(self.model)
        start = data.draw(st.none() | st.integers(-n - 2, n + 2))
        stop = data.draw(st.none() | st.integers(-n - 2, n + 2))
        step = data.draw(st.sampled_from([None, None, 1, 2, -1, -3]))
        got = self.turns[start:stop:step]
        assert type(got) is tuple
        want = self.model[start:stop:step]
        assert len(got) == len(want) and all(a is b for a, b in zip(got, want, strict=True))

    @invariant()
    def reads_as_the_model(self) -> None:
        same(self.turns, self.model)

    @invariant()
    def snapshots_keep_their_turns(self) -> None:
        for turns, model in self.snapshots:
            same(turns, model)


TurnsMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=50, deadline=None)
test_turns_read_as_a_tuple_and_snapshots_keep_theirs = TurnsMachine.TestCase


@given(st.lists(st.integers(), max_size=300), st.sampled_from([1, 2, 6]))
def test_of_holds_the_turns_in_full_blocks(values: list[int], shift: int) -> None:
    """Invariant: ``_Turns.of`` reads as the tuple it was given, in well-formed blocks."""
    with blocks_of(shift):
        same(_Turns.of(values), tuple(values))  # type: ignore[arg-type]


class TurnStoreMachine(EvictionMachine):
    """The eviction machine's histories, with summaries and views kept."""

    SHIFT = 0  # a block per turn: a view of 3 turns spans 3 blocks

    def __init__(self) -> None:
        self.blocks = blocks_of(self.SHIFT)
        self.blocks.__enter__()  # before any history holds a turn
        super().__init__()
        self.checked: dict[str, dict[int, object]] = {}
        self.views: list[tuple[Any, tuple[Any, ...], tuple[str, ...], tuple[Any, ...]]] = []

    def teardown(self) -> None:
        self.blocks.__exit__(None, None, None)

    @rule(h=st.sampled_from(HISTORIES), keep=st.integers(1, 3))
    def summarize(self, h: str, keep: int) -> None:
        """Summarize the oldest turns (after an answer, as a summary waits for one)."""
        history = self.histories[h]
        with contextlib.suppress(TurnloomError):
            history.record(history.turn_ids[-1], [assistant(f"before s{keep}")])
        with contextlib.suppress(TurnloomError):
            turn_ids = summary_range(history, keep)
            if turn_ids:
                apply_summary(history, turn_ids, next_summary_id(history), [user(f"s{keep}")])

    @rule(h=st.sampled_from(HISTORIES), keep=st.integers(1, 3), memo=st.booleans())
    def prune(self, h: str, keep: int, memo: bool) -> None:
        """Prune the tool output of the turns before the newest ``keep``."""
        history = self.histories[h]
        checked = self.checked.setdefault(h, {}) if memo else None
        with contextlib.suppress(TurnloomError):
            prune_turns(history, keep, "[pruned]", checked)

    @rule(h=st.sampled_from(HISTORIES))
    def take_view(self, h: str) -> None:
        view = self.histories[h].view()
        self.views.append((view, tuple(view._turns), view.turn_ids, view.messages()))

    @invariant()
    def views_keep_their_turns(self) -> None:
        for view, turns, turn_ids, messages in self.views:
            same(view._turns, turns)
            assert view.turn_ids == turn_ids
            assert view.messages() == messages

    @invariant()
    def turns_are_well_formed(self) -> None:
        for history in getattr(self, "histories", {}).values():
            assert isinstance(history, TurnHistory)
            well_formed(history._turns)
            ids = [t.turn_id for t in history._turns]
            assert len(ids) == len(history._ids) and set(ids) == set(history._ids)


class TurnStoreMachinePairs(TurnStoreMachine):
    """The same with blocks of 2: a block not full yet is appended to, replaced in."""

    SHIFT = 1


for _machine in (TurnStoreMachine, TurnStoreMachinePairs):
    _machine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
test_history_views_keep_their_turns = TurnStoreMachine.TestCase
test_history_views_keep_their_turns_blocks_of_two = TurnStoreMachinePairs.TestCase

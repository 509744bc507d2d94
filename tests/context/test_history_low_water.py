"""Cache-aware eviction: a history over a limit evicts down to its low-water marks at once.

Invariants: an eviction runs only when a hard limit is crossed, and then drops
whole turns (with the turns tied to them), oldest first, until every limit's
low-water mark holds (``HistoryLimits.low_water`` times the limit), never the
newest turn or the turns tied to it, so the cached prefix breaks once per many
turns; the hard limits hold after it; pinned instructions stay; a retracted
false start restores every turn its commit evicted; counters are exact; every
render equals a cold render.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.context.test_history import (
    CHAT,
    SYSTEM,
    _answer,
    assistant,
    call,
    cold_render,
    result,
    user,
)
from tests.context.test_history_evict_stateful import Counter, _false_start, _observe
from tests.context.test_history_false_start import observe
from turnloom.context import Message, message_size
from turnloom.context.history import HistoryLimits, TurnHistory
from turnloom.errors import (
    AmbiguousStepError,
    InvalidArgumentError,
    StateError,
    TurnTooLargeError,
    UnpairedResultError,
)

# -- the marks ----------------------------------------------------------------------


def test_low_water_marks_are_each_limit_times_the_fraction_rounded_down() -> None:
    """Invariant: the marks are ``floor(limit * low_water)`` per limit (a fraction written
    in decimal counts as written: 0.29 of 100 is 29), None for no token bound, and the
    limits themselves at 1.0."""
    limits = HistoryLimits(
        max_turns=16, max_items=100, max_bytes=1001, max_tokens=31, low_water=0.5
    )
    assert limits.low_water_marks() == (8, 50, 500, 15)
    assert HistoryLimits(max_turns=100, low_water=0.29).low_water_marks()[0] == 29
    assert HistoryLimits(max_turns=3, low_water=0.2).low_water_marks()[:1] == (0,)
    assert HistoryLimits(low_water=1).low_water_marks() == (32, 4096, 8 * 1024 * 1024, None)
    # The default, 1.0 (per-turn eviction: logs written before low_water replay).
    assert HistoryLimits().low_water_marks() == (32, 4096, 8 * 1024 * 1024, None)
    # At 1.0 a token bound is its own mark too (not dropped with the other marks' work).
    assert HistoryLimits(max_tokens=31).low_water_marks() == (32, 4096, 8 * 1024 * 1024, 31)
    assert HistoryLimits(low_water=0.4).low_water_marks() == (12, 1638, 3355443, None)


@pytest.mark.parametrize(
    "value", [0, 0.0, -0.5, 1.01, 2, float("nan"), float("inf"), True, "0.5", None]
)
def test_low_water_must_be_a_fraction_above_0_and_at_most_1(value: object) -> None:
    """Invariant: bad input fails at the door with a typed error naming the field."""
    with pytest.raises(InvalidArgumentError, match="low_water") as caught:
        HistoryLimits(low_water=value)  # type: ignore[arg-type]
    assert caught.value.field == "low_water"


# -- exact evictions ----------------------------------------------------------------


def _converse(limits: HistoryLimits, turns: int) -> tuple[TurnHistory, list[tuple[str, ...]]]:
    """Turns t1..t{turns}: each committed (then evicted, as the runtime does), then
    answered. Returns the history and what each commit's eviction dropped."""
    history = TurnHistory(limits)
    evicted: list[tuple[str, ...]] = []
    for i in range(1, turns + 1):
        history.commit(f"t{i}", [user(f"u{i}")], instructions=[SYSTEM] if i == 1 else None)
        evicted.append(history.evict())
        history.record(f"t{i}", [assistant(f"a{i}")])
    return history, evicted


def test_at_max_turns_one_eviction_drops_down_to_the_mark_and_the_next_ones_wait() -> None:
    """Invariant: max_turns=4, low_water=0.5: the commit making 5 turns evicts down to 2
    (three turns at once), the next two commits evict nothing, so the prefix after the
    instructions breaks once per three turns; per-turn eviction (1.0) breaks it on
    every commit past the limit. Counters are exact; the render is the cold one and
    starts with the pinned instructions."""
    history, evicted = _converse(HistoryLimits(max_turns=4, low_water=0.5), 11)
    assert evicted == [
        *([()] * 4),
        ("t1", "t2", "t3"),
        (),
        (),
        ("t4", "t5", "t6"),
        (),
        (),
        ("t7", "t8", "t9"),
    ]
    assert history.turn_ids == ("t10", "t11")
    gone = [m for i in range(1, 10) for m in (user(f"u{i}"), assistant(f"a{i}"))]
    stats = history.statistics()
    assert (stats.turns, stats.items, stats.restorable_turns) == (2, 4, 0)
    assert (stats.evicted_turns, stats.evicted_items, stats.evicted_bytes) == (
        9,
        18,
        sum(message_size(m) for m in gone),
    )
    assert (stats.pinned_items, stats.pinned_bytes) == (1, message_size(SYSTEM))
    rendered = list(history.view().render(CHAT, "t11").items)
    assert rendered == cold_render(history, "t11")
    assert [i["content"] for i in rendered] == ["You are terse.", "u10", "a10", "u11"]
    _, per_turn = _converse(HistoryLimits(max_turns=4, low_water=1.0), 11)
    assert per_turn == [*([()] * 4), *[(f"t{i}",) for i in range(1, 8)]]


def _doubled(text: str) -> list[Message]:
    return [user(text), user(text)]


class _FiveTokens:
    """Five tokens a message."""

    def count(self, messages: Sequence[Message]) -> int:
        return 5 * len(messages)


@pytest.mark.parametrize("unit", ["turns", "items", "bytes", "tokens"])
def test_each_limit_evicts_down_to_its_own_mark(unit: str) -> None:
    """Invariant: turns of two equal messages, each limit set to four such turns and
    low_water=0.5: the fifth commit crosses it and one eviction drops t1, t2 and t3
    (two turns, four messages, their bytes and tokens are each limit's mark); the
    sixth and seventh evict nothing."""
    size = message_size(user("xxxx"))
    bound = {
        "turns": {"max_turns": 4},
        "items": {"max_items": 8},
        "bytes": {"max_bytes": 8 * size},
        "tokens": {"max_tokens": 40},
    }[unit]
    history = TurnHistory(
        HistoryLimits(**{"max_turns": 100, **bound}, low_water=0.5),
        token_counter=_FiveTokens(),
    )
    evicted = []
    for i in range(1, 8):
        history.commit(f"t{i}", _doubled("xxxx"))
        evicted.append(history.evict())
    assert evicted == [(), (), (), (), ("t1", "t2", "t3"), (), ()]
    stats = history.statistics()
    assert (stats.turns, stats.items, stats.bytes, stats.tokens) == (4, 8, 8 * size, 40)
    assert (stats.evicted_turns, stats.restorable_turns) == (3, 0)


def test_every_mark_holds_after_an_eviction_not_only_the_crossed_ones() -> None:
    """Invariant: max_turns=4, max_items=12, low_water=0.5 (marks 2 turns, 6 items):
    a fifth turn of five messages crosses max_items; the turns mark alone would stop
    after t3, the items mark takes t4 too."""
    history = TurnHistory(HistoryLimits(max_turns=4, max_items=12, low_water=0.5))
    for i in range(1, 5):
        history.commit(f"t{i}", _doubled(f"u{i}"))
    assert history.evict() == ()
    history.commit("t5", [user(f"v{k}") for k in range(5)])
    assert history.evict() == ("t1", "t2", "t3", "t4")
    assert (history.turn_ids, history.statistics().items) == (("t5",), 5)


def _tied(limits: HistoryLimits) -> TurnHistory:
    """t1; t2 makes a call that t3's input answers (t2 and t3 are evicted together); t4."""
    history = TurnHistory(limits)
    history.commit("t1", [user("one")], instructions=[SYSTEM])
    history.record("t1", [assistant("One.")])
    history.commit("t2", [user("Delete the old branch.")])
    history.record("t2", [call("c1", "delete_branch")])
    history.commit("t3", [result("c1", "deleted"), user("Thanks.")])
    history.record("t3", [assistant("Done.")])
    history.commit("t4", [user("four")])
    return history


def test_a_tied_pair_of_turns_straddling_the_mark_leaves_whole() -> None:
    """Invariant: max_turns=4, low_water=0.75 (mark 3): t5 crosses the limit; t1 goes,
    then t2 with t3 (its call's answer) together, leaving 2 turns, under the mark:
    a call and its result are never split, and the render is the cold one."""
    history = _tied(HistoryLimits(max_turns=4, low_water=0.75))
    history.commit("t5", [user("five")])
    assert history.evict() == ("t1", "t2", "t3")
    assert history.turn_ids == ("t4", "t5")
    assert list(history.view().render(CHAT, "t5").items) == cold_render(history, "t5")


def test_the_newest_turn_and_the_turns_tied_to_it_stay_above_the_mark() -> None:
    """Invariant: max_turns=2, low_water=0.5 (mark 1): t3 answers t2's call, so the
    eviction that t3 causes drops t1 and stops at 2 turns, above the mark and within
    the hard limit."""
    history = _tied(HistoryLimits(max_turns=2, low_water=0.5))
    # _tied commits t4 too: undo it to end on the tied pair.
    history.retract("t4")
    assert history.evict() == ("t1",)
    assert history.turn_ids == ("t2", "t3")
    assert not history.over_limits()


def test_a_retracted_false_start_restores_every_turn_its_eviction_dropped() -> None:
    """Invariant: max_turns=4, low_water=0.5: the false start t5 evicts t1..t3 at once,
    held aside (restorable, not counted evicted); retracting t5 holds them again, and the
    history is what it was before t5 in every observable but the retraction counter,
    its renders included."""
    history, _ = _converse(HistoryLimits(max_turns=4, low_water=0.5), 4)
    before = observe(history)
    rendered = list(history.view().render(CHAT, "t4").items)
    history.commit("t5", [user("*cough*")])
    assert history.evict() == ("t1", "t2", "t3")
    assert history.restorable_ids == ("t1", "t2", "t3")
    stats = history.statistics()
    assert (stats.turns, stats.restorable_turns, stats.evicted_turns) == (2, 3, 0)
    history.retract("t5")
    assert observe(history) == before
    assert history.statistics().retracted_turns == 1
    assert history.evicted_ids == ("t5",)
    again = list(history.view().render(CHAT, "t4").items)
    assert again == rendered == cold_render(history, "t4")


# -- the property -------------------------------------------------------------------

_op = st.one_of(
    st.tuples(st.just("commit"), st.integers(0, 3)),
    st.tuples(st.just("text"), st.integers(0, 3)),
    st.tuples(st.just("call"), st.integers(0, 3)),
    st.tuples(st.just("result"), st.integers(0, 3)),
    st.tuples(st.just("answer"), st.integers(0, 3)),
    st.tuples(st.just("state"), st.integers(0, 3)),
    st.tuples(st.just("late"), st.integers(0, 3)),
    st.tuples(st.just("false_start"), st.integers(0, 3)),
)


def _expected_eviction(history: TurnHistory, counter: Counter) -> tuple[str, ...]:
    """The oracle: what an eviction of ``history`` now drops, from its view alone.

    Over a hard limit (and more than one turn held), the smallest run of oldest
    whole units (a turn and the later turns tied to it) after which every measure
    is at most its mark, or every unit but the newest when none is.
    """
    view = history.view()
    limits = history._limits
    measures: list[tuple[int, int, int]] = []
    for turn_id in view.turn_ids:
        messages = [*view.turn_messages(turn_id), *view.turn_state(turn_id)]
        measures.append(
            (len(messages), sum(message_size(m) for m in messages), counter.count(messages))
        )
    turn_ids = view.turn_ids
    units: list[list[int]] = []
    for index, turn_id in enumerate(turn_ids):
        if units and history.turn_serial(turn_id) in history._linked:
            units[-1].append(index)
        else:
            units.append([index])

    def over(first: int, bounds: tuple[int, int, int, int | None]) -> bool:
        kept = measures[first:]
        turns, items, size, tokens = bounds
        return (
            len(kept) > turns
            or sum(m[0] for m in kept) > items
            or sum(m[1] for m in kept) > size
            or (tokens is not None and sum(m[2] for m in kept) > tokens)
        )

    hard = (limits.max_turns, limits.max_items, limits.max_bytes, limits.max_tokens)
    if len(turn_ids) < 2 or not over(0, hard):
        return ()
    marks = limits.low_water_marks()
    first = 0
    for unit in units[:-1]:
        if not over(first, marks):
            break
        first = unit[-1] + 1
    return turn_ids[:first]


def _evict_checked(history: TurnHistory, counter: Counter) -> None:
    """Evict; the turns dropped are the oracle's, and the hard limits hold after,
    unless what is left is the newest unit alone (kept state is never refused)."""
    expected = _expected_eviction(history, counter)
    assert history.evict() == expected
    if history.over_limits():
        turn_ids = history.turn_ids
        assert all(history.turn_serial(t) in history._linked for t in turn_ids[1:])


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(_op, min_size=1, max_size=50),
    max_turns=st.integers(1, 6),
    max_items=st.integers(4, 24),
    max_tokens=st.sampled_from([None, None, 40, 120]),
    low_water=st.one_of(st.sampled_from([1.0, 0.75, 0.5, 0.34]), st.floats(0.01, 1.0)),
)
def test_low_water_eviction_holds_the_limits_restores_false_starts_and_renders_cold(
    ops: list[tuple[str, int]],
    max_turns: int,
    max_items: int,
    max_tokens: int | None,
    low_water: float,
) -> None:
    """Invariant: over commits (each evicting, as the runtime does), records (text,
    calls, results, approvals answering the newest turn's calls, late outputs), kept
    state pairs and false starts, with any limits and low_water: every eviction drops
    exactly the oracle's turns and leaves the hard limits holding; a false start
    committed, evicting and retracted leaves the history as it was before (see
    ``_false_start``); every render equals a cold render."""
    counter = Counter()
    limits = HistoryLimits(
        max_turns=max_turns, max_items=max_items, max_tokens=max_tokens, low_water=low_water
    )
    history = TurnHistory(limits, token_counter=counter)
    history.commit("t0", [user("u0")], instructions=[SYSTEM])
    turn = 0
    for kind, n in ops:
        turns = history.turn_ids
        with contextlib.suppress(
            TurnTooLargeError, StateError, AmbiguousStepError, UnpairedResultError
        ):
            if kind == "commit":
                history.commit(f"t{turn + 1}", [user(f"u{turn + 1}")] * (n % 2 + 1))
                turn += 1
            elif kind == "text":
                history.record(turns[-1], [assistant(f"a{n}")])
            elif kind == "call":
                history.record(turns[-1], [call(f"c{turn}.{n}")])
            elif kind == "result":
                history.record(turns[-1], [result(f"c{turn}.{n}", f"r{n}")])
            elif kind == "answer":  # commits "<newest>-answer", its input answering calls
                _answer(history, n)
            elif kind == "state":
                pair = [call(f"tlrs_{n}", "turnloom_runtime_context"), result(f"tlrs_{n}", "s" * n)]
                history.keep_state(turns[-1], pair)
            elif kind == "late":
                history.record(turns[n % len(turns)], [assistant(f"late{n}")])
        if kind == "false_start":
            before = _observe(history, counter)
            turn += 1
            try:
                history.commit(f"t{turn}", [user(f"cough {k}") for k in range(n + 1)])
            except TurnTooLargeError:
                assert _observe(history, counter) == before
                continue
            _evict_checked(history, counter)
            history.retract(f"t{turn}")
            _false_start(before, _observe(history, counter), f"t{turn}", 1024)
        else:
            _evict_checked(history, counter)
        newest = history.turn_ids[-1]
        assert list(history.view().render(CHAT, newest).items) == cold_render(history, newest)

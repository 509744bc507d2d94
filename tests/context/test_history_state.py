"""Kept state (``TurnHistory.keep_state``): placed after its turn's input, counted, and
always rendered as a cold render of the history would render it."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.runtime.helpers import CHAT, SYSTEM, assistant, call, result, user
from turnloom.context import Message, Role, complete_pairs, rename_call_ids
from turnloom.context.history import HistoryLimits, TurnHistory
from turnloom.errors import (
    InstructionMessageError,
    InvalidMessageError,
    ItemTooLargeError,
)


def pair(tag: str) -> tuple[Message, Message]:
    return call(f"tlrs_{tag}", "turnloom_runtime_context"), result(f"tlrs_{tag}", f"state {tag}")


def cold(history: TurnHistory, turn_id: str) -> list[Any]:
    """The oracle: the history's messages paired as one input, rendered without a cache."""
    messages = history.view().sent_messages(turn_id)
    completed = complete_pairs(list(messages), open_calls="exclude")
    return rename_call_ids(CHAT.type, [item for m in completed for item in CHAT.render(m)])


def test_kept_state_sits_after_its_turns_input_once_the_turn_is_earlier() -> None:
    history = TurnHistory()
    history.commit("t0", [user("a")], instructions=[SYSTEM])
    assert history.keep_state("t0", pair("0")) is True
    own = history.view().render(CHAT, "t0")
    assert list(own.items) == [CHAT.render(SYSTEM)[0], CHAT.render(user("a"))[0]]
    history.record("t0", [assistant("ok")])
    history.commit("t1", [user("b")])
    items = list(history.view().render(CHAT, "t1").items)
    expected = [SYSTEM, user("a"), *pair("0"), assistant("ok"), user("b")]
    assert items == [CHAT.render(m)[0] for m in expected]
    assert history.view().turn_messages("t0") == (user("a"), assistant("ok"))
    assert history.view().turn_state("t0") == pair("0")


def test_keep_state_refuses_bad_messages_and_changes_nothing() -> None:
    history = TurnHistory(HistoryLimits(max_item_bytes=200))
    history.commit("t0", [user("a")])
    before = history.statistics()
    with pytest.raises(InvalidMessageError):
        history.keep_state("t0", ["not a message"])  # type: ignore[list-item]
    with pytest.raises(InstructionMessageError):
        history.keep_state("t0", [SYSTEM])
    with pytest.raises(InvalidMessageError, match="carry no id"):
        history.keep_state("t0", [Message(role=Role.user, content="x", id="m1")])
    with pytest.raises(ItemTooLargeError):
        history.keep_state("t0", [user("x" * 300)])
    assert history.statistics() == before
    assert history.view().turn_state("t0") == ()


def test_keep_state_for_a_gone_turn_changes_nothing() -> None:
    history = TurnHistory(HistoryLimits(max_turns=1))
    history.commit("t0", [user("a")])
    serial = history.turn_serial("t0")
    history.commit("t1", [user("b")])
    history.evict()
    before = history.statistics()
    assert history.keep_state("t0", pair("0")) is False
    assert history.keep_state("t1", pair("1"), serial=serial) is False
    assert history.statistics() == before


_step = st.one_of(
    st.tuples(st.just("commit"), st.none()),
    st.tuples(st.just("record"), st.sampled_from(["text", "call"])),
    st.tuples(st.just("keep"), st.integers(0, 3)),  # 0 clears; else n turns back (1: newest)
    st.tuples(st.just("render"), st.none()),
)


@settings(max_examples=80)
@given(steps=st.lists(_step, min_size=1, max_size=30))
def test_renders_with_kept_state_equal_a_cold_render_and_totals_count_it(
    steps: list[tuple[str, Any]],
) -> None:
    """Invariants: after any sequence of commits, records, kept state on any held turn
    (the newest or an earlier one) and evictions, the incremental render equals the cold
    render of ``input_messages``; items, bytes and tokens count kept state."""
    history = TurnHistory(HistoryLimits(max_turns=4, max_items=14))
    n = 0
    history.commit("t0", [user("q0")], instructions=[SYSTEM])
    for kind, arg in steps:
        turns = history.turn_ids
        if kind == "commit":
            n += 1
            history.commit(f"t{n}", [user(f"q{n}")])
        elif kind == "record":
            outputs = (
                [assistant("a")]
                if arg == "text"
                else [call(f"k{n}"), result(f"k{n}")]  # ids reused across turns on purpose
            )
            history.record(turns[-1], outputs)
        elif kind == "keep" and arg <= len(turns):
            target = turns[-arg] if arg else turns[-1]
            history.keep_state(target, pair(f"{target}-{len(steps)}") if arg else ())
        history.evict()
        newest = history.turn_ids[-1]
        assert list(history.view().render(CHAT, newest).items) == cold(history, newest)
        view = history.view()
        messages = [m for t in view.turn_ids for m in (*view.turn_messages(t), *view.turn_state(t))]
        stats = history.statistics()
        assert stats.items == len(messages)
        assert stats.bytes == sum(len(msgspec.json.encode(m)) for m in messages)

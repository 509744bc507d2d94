"""A host's token counter is checked where its count is taken.

Invariant (DESIGN rule 4, "check once at the door"): every count turnloom
takes from a counter goes through :func:`count_tokens`; a count that is not
an int in ``[0, MAX_TOKEN_COUNT]`` (negative, fractional, boolean, huge), or
a counter that raises, fails the commit, record, kept state or render with a
:class:`HostCallbackError` before anything changed, so ``max_tokens`` and the
token totals can never be defeated by a counter's bug.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import pytest

from tests.runtime.helpers import CHAT, SYSTEM, assistant, call, user
from turnloom.context import ApproxTokenCounter, Message, PrefixContext, WorkingContext
from turnloom.context.history import HistoryLimits, TurnHistory
from turnloom.context.tokens import MAX_TOKEN_COUNT, count_tokens
from turnloom.errors import HostCallbackError, InvalidArgumentError

APPROX = ApproxTokenCounter()


class Scripted:
    """A counter answering ``answer(messages)``; ``good`` first answers honestly."""

    def __init__(self, answer: Callable[[Sequence[Message]], Any], good: int = 0) -> None:
        self.answer = answer
        self.good = good

    def count(self, messages: Sequence[Message]) -> Any:
        if self.good > 0:
            self.good -= 1
            return APPROX.count(messages)
        return self.answer(messages)


class Seven(enum.IntEnum):
    SEVEN = 7


def _raise(messages: Sequence[Message]) -> int:
    raise KeyError("vocabulary")


_BAD_COUNTS: tuple[object, ...] = (-1, 2.5, True, False, float("nan"), 2**63, "3", None)


def _state(history: TurnHistory) -> tuple[object, ...]:
    """Everything a refused call must leave as it was."""
    return (
        msgspec.structs.asdict(history.statistics()),
        history.turn_ids,
        tuple(history.view().turn_messages(t) for t in history.turn_ids),
        history.view().pinned,
    )


@pytest.mark.parametrize("bad", _BAD_COUNTS, ids=repr)
def test_a_count_that_is_not_a_non_negative_int_is_refused(bad: object) -> None:
    with pytest.raises(HostCallbackError) as caught:
        count_tokens(Scripted(lambda m: bad), [user("hi")])
    assert caught.value.callback == "token_counter"
    assert caught.value.__cause__ is None


def test_the_refusal_says_what_the_counter_returned() -> None:
    with pytest.raises(HostCallbackError) as caught:
        count_tokens(Scripted(lambda m: -5), [user("hi")])
    assert str(caught.value) == (
        "The token counter Scripted returned -5 tokens; a count is an int from 0 to "
        "9223372036854775807."
    )
    with pytest.raises(HostCallbackError) as caught:
        count_tokens(Scripted(lambda m: 2.5), [user("hi")])
    assert str(caught.value) == (
        "The token counter Scripted returned an object of type float (2.5), not an int "
        "count of tokens."
    )


def test_the_bounds_are_inclusive_and_an_int_subclass_becomes_an_int() -> None:
    assert count_tokens(Scripted(lambda m: 0), [user("hi")]) == 0
    assert count_tokens(Scripted(lambda m: MAX_TOKEN_COUNT), [user("hi")]) == MAX_TOKEN_COUNT
    seven = count_tokens(Scripted(lambda m: Seven.SEVEN), [user("hi")])
    assert (seven, type(seven)) == (7, int)


def test_a_counter_that_raises_is_wrapped_with_its_exception_as_the_cause() -> None:
    with pytest.raises(HostCallbackError) as caught:
        count_tokens(Scripted(_raise), [user("hi")])
    assert str(caught.value) == "The token counter Scripted raised KeyError: \"'vocabulary'\"."
    assert caught.value.callback == "token_counter"
    assert type(caught.value.__cause__) is KeyError


def test_a_turnloom_error_of_the_counter_passes_unchanged() -> None:
    """The built-in counters' own typed errors are not re-wrapped."""
    with pytest.raises(InvalidArgumentError) as caught:
        count_tokens(APPROX, "not messages")  # type: ignore[arg-type]
    assert caught.value.field == "messages"


@pytest.mark.parametrize("bad", [-1_000, 0.5, True, 2**64], ids=repr)
def test_commit_record_and_keep_state_refuse_a_bad_count_and_change_nothing(bad: object) -> None:
    """The count is taken at the door: a refused message leaves the history exactly as it was."""
    counter = Scripted(lambda m: bad, good=3)  # the instructions, t1's input, its output
    history = TurnHistory(HistoryLimits(max_tokens=100), token_counter=counter)
    history.commit("t1", [user("hi")], instructions=[SYSTEM])
    history.record("t1", [assistant("hello")])
    before = _state(history)
    attempts: tuple[Callable[[], object], ...] = (
        lambda: history.commit("t2", [user("again")]),
        lambda: history.commit("t2", [user("again")], instructions=[SYSTEM]),
        lambda: history.record("t1", [assistant("more")]),
        lambda: history.keep_state("t1", [assistant("state")]),
    )
    for attempt in attempts:
        with pytest.raises(HostCallbackError):
            attempt()
        assert _state(history) == before
    # Nothing half-made blocks the ids: with an honest count the same calls succeed.
    counter.good = 10
    history.commit("t2", [user("again")])
    assert history.turn_ids == ("t1", "t2")
    assert history.statistics().tokens == APPROX.count(
        [user("hi"), assistant("hello"), user("again")]
    )


def test_a_negative_count_can_no_longer_defeat_max_tokens() -> None:
    """Before the check, -10**6 per message kept every turn under any max_tokens."""
    history = TurnHistory(HistoryLimits(max_tokens=10), token_counter=Scripted(lambda m: -(10**6)))
    with pytest.raises(HostCallbackError):
        history.commit("t1", [user("x" * 400)])
    assert (history.turn_ids, history.statistics().tokens) == ((), 0)


def test_a_render_whose_counter_fails_raises_typed_and_the_next_render_is_cold() -> None:
    """The cancelled result pairing adds is counted at render time, through the same check."""
    counter = Scripted(_raise, good=3)  # t1's input, its open call, t2's input
    history = TurnHistory(token_counter=counter)
    history.commit("t1", [user("hi")])
    history.record("t1", [call("k1")])
    history.commit("t2", [user("again")])
    with pytest.raises(HostCallbackError) as caught:
        history.view().render(CHAT, "t2", open_calls="cancel")
    assert type(caught.value.__cause__) is KeyError
    counter.good = 10
    rendered = history.view().render(CHAT, "t2", open_calls="cancel")
    cold = TurnHistory()
    cold.commit("t1", [user("hi")])
    cold.record("t1", [call("k1")])
    cold.commit("t2", [user("again")])
    expected = cold.view().render(CHAT, "t2", open_calls="cancel")
    assert (rendered.items, rendered.tokens) == (expected.items, expected.tokens)
    assert len(rendered.items) == 4  # hi, the call, its cancelled result, again


def test_working_context_tokens_checks_its_counter() -> None:
    context = WorkingContext(
        PrefixContext(grounding=(SYSTEM,)), token_counter=Scripted(lambda m: -3), limit=100
    )
    with pytest.raises(HostCallbackError):
        context.tokens()
    with pytest.raises(HostCallbackError):
        context.headroom()

"""The door's one-message shortcuts give exactly what the general paths give.

``count_message_tokens`` estimates one message for the default counter
without the counter's calls; every other counter goes through
``count_tokens``. Compared on generated messages (the door property's
strategy) and on every recorded provider message (``../shared/data``).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings

from tests.context.gateways.test_door_property import messages, recorded_messages
from turnloom.context import ApproxTokenCounter, ImagePart, Message, Role, check_message
from turnloom.context.tokens import count_message_tokens, count_tokens
from turnloom.errors import HostCallbackError, TurnloomError

_COUNTERS = (
    ApproxTokenCounter(),
    ApproxTokenCounter(image_rule="anthropic"),
    ApproxTokenCounter(image_rule="gemini", image_size=lambda part: (640, 480)),
    ApproxTokenCounter(image_size=lambda part: None),
)


class _Sub(ApproxTokenCounter):
    """A subclass: not the exact class, so counted through ``count_tokens``."""

    def count(self, messages: Any) -> int:
        return 7


def _outcome(fn: Any) -> Any:
    try:
        return ("ok", fn())
    except TurnloomError as exc:
        return (type(exc), str(exc), getattr(exc, "field", None))


def _same_counts(message: Message) -> None:
    for counter in _COUNTERS:
        assert _outcome(lambda c=counter: count_message_tokens(c, message)) == _outcome(
            lambda c=counter: count_tokens(c, (message,))
        )
    assert count_message_tokens(_Sub(), message) == 7


@settings(max_examples=400)
@given(message=messages)
def test_one_message_count_equals_count_tokens_on_generated_messages(message: Message) -> None:
    """Invariant: count_message_tokens(c, m) == count_tokens(c, (m,)) for a checked message."""
    try:
        check_message(message)
    except TurnloomError:
        return
    _same_counts(message)


def test_one_message_count_equals_count_tokens_on_recorded_messages(
    recordings_dir: Any,
) -> None:
    """Invariant: the same on every message of the recorded provider requests."""
    seen = 0
    for data in recorded_messages():
        message = msgspec.convert(data, Message)
        check_message(message)
        _same_counts(message)
        seen += 1
    assert seen > 1000


def test_a_count_over_the_maximum_raises_as_count_tokens_does() -> None:
    """Invariant: an image priced over MAX_TOKEN_COUNT fails the same way on both paths."""
    counter = ApproxTokenCounter(image_rule="gemini", image_size=lambda part: (2**40, 2**40))
    message = Message(role=Role.user, content=(ImagePart(url="https://x/a.png"),))
    check_message(message)
    fast = _outcome(lambda: count_message_tokens(counter, message))
    assert fast[0] is HostCallbackError
    assert fast == _outcome(lambda: count_tokens(counter, (message,)))


@pytest.mark.parametrize("text", ["", "a", "abcd", "abcde", "\u00e9\u00e9\u00e9"])
def test_one_message_count_is_the_documented_estimate(text: str) -> None:
    """Invariant: the exact numbers (3 framing + role + a quarter of each text, rounded up)."""
    message = Message(role=Role.user, content=text, name="bob")
    expected = 3 + (len("user") + 3) // 4 + 1 + 1 + (len(text) + 3) // 4
    assert count_message_tokens(ApproxTokenCounter(), message) == expected

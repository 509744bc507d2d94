"""OpenAI Responses ``parse_items``: a reasoning item goes with the output item after it.

A valid input whose reasoning item directly precedes an output message
(``[..., message, reasoning, message]``: a reasoning model's second response
after one that ended with text, or a GPT-5 preamble) must round-trip item for
item: parse_items then render gives the input back, and ``validate`` finds
nothing. Before the fix the reasoning item was joined to the message before
it, where it has no item to follow, and rendering left it out (a debug log).
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from turnloom.context import ReasoningPart, TextPart, get_gateway

gw = get_gateway("openai_responses")

USER = {"role": "user", "content": "Check it."}


def _msg(n: int) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "id": f"msg_{n}",
        "status": "completed",
        "content": [{"type": "output_text", "text": f"Text {n}.", "annotations": []}],
    }


def _rs(n: int) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": f"rs_{n}",
        "summary": [{"type": "summary_text", "text": f"Think {n}."}],
        "encrypted_content": f"enc-{n}",
    }


def _call(n: int) -> dict[str, Any]:
    return {
        "type": "function_call",
        "call_id": f"c{n}",
        "name": "look",
        "arguments": "{}",
        "id": f"fc_{n}",
        "status": "completed",
    }


def _out(n: int) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": f"c{n}", "output": f"out {n}"}


def _round_trip(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [out for message in gw.parse_items(items) for out in gw.render(message)]


def test_reasoning_between_two_output_messages_stays_before_the_second() -> None:
    """Invariant: [user, message, reasoning, message] round-trips exactly; the reasoning
    part opens the second message's parts.

    Mutant tried: parse_items without moving the trailing reasoning (as before): the
    round trip lacks rs_2."""
    items = [USER, _msg(1), _rs(2), _msg(3)]
    assert _round_trip(items) == items
    messages = gw.parse_items(items)
    assert [m.id for m in messages] == [None, "msg_1", "msg_3"]
    assert [type(p) for p in messages[2].parts] == [ReasoningPart, TextPart]
    assert gw.validate(items) == []


# One response's output: optional reasoning, then a message or calls (with their outputs).
_STEP = st.tuples(st.booleans(), st.booleans(), st.integers(0, 2), st.booleans())


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(_STEP, min_size=1, max_size=6))
def test_valid_reasoning_inputs_round_trip_exactly(
    steps: list[tuple[bool, bool, int, bool]],
) -> None:
    """Invariant: any valid input of responses (each: a reasoning item or not, a text
    message, parallel calls answered after them) parses and renders back item for item.
    """
    items: list[dict[str, Any]] = [USER]
    n = 0
    for reasoning, text, calls, more_reasoning in steps:
        n += 1
        if reasoning:
            items.append(_rs(n))
        if text or not calls:
            items.append(_msg(n))
        if calls and more_reasoning and text:
            items.append(_rs(n + 1000))  # a reasoning item between a preamble and calls
        made = list(range(n * 10, n * 10 + calls))
        items += [_call(c) for c in made]
        items += [_out(c) for c in made]
    assert gw.validate(items) == []
    assert _round_trip(items) == items

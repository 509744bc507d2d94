"""``played_prefix``: ``played`` counts code points, and valid text stays valid.

Invariant: the text kept is exactly the output's text (its text parts joined)
cut after ``played`` code points, as ``text[:played]`` cuts a Python str; it
always encodes to UTF-8 (a cut never splits a code point) and the other
parts stay in place.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnloom.context import Message, Role, TextPart, ToolCallPart, played_prefix
from turnloom.context.message import Part, check_message

THUMBS_UP_MEDIUM = "\U0001f44d\U0001f3fd"  # thumbs up + Fitzpatrick type-4 modifier
E_ACUTE = "e\u0301"  # e + combining acute accent


def _said(message: Message) -> str:
    return "".join(p.text for p in message.parts if type(p) is TextPart)


@pytest.mark.parametrize(
    ("text", "played", "kept"),
    [
        # Code points, not UTF-16 units (the emoji pair is 2 code points, 4 units).
        (THUMBS_UP_MEDIUM + " ok", 1, "\U0001f44d"),
        (THUMBS_UP_MEDIUM + " ok", 2, THUMBS_UP_MEDIUM),
        (THUMBS_UP_MEDIUM + " ok", 4, THUMBS_UP_MEDIUM + " o"),
        # Not bytes either: the accent is 1 code point, 2 UTF-8 bytes.
        (E_ACUTE + "t" + E_ACUTE, 1, "e"),
        (E_ACUTE + "t" + E_ACUTE, 3, E_ACUTE + "t"),
        ("caf\u00e9 ok", 4, "caf\u00e9"),
    ],
)
def test_played_counts_code_points(text: str, played: int, kept: str) -> None:
    output = Message(role=Role.assistant, content=text)
    cut = played_prefix(output, played)
    assert _said(cut) == kept
    check_message(cut)  # valid: a cut never splits a code point


@settings(max_examples=200)
@given(
    texts=st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=4),
    played=st.integers(0, 60),
)
def test_the_kept_text_is_the_code_point_prefix_and_stays_valid(
    texts: list[str], played: int
) -> None:
    call = ToolCallPart(call_id="k", name="f", arguments="{}")
    parts: list[Part] = [TextPart(text=texts[0]), call, *(TextPart(text=t) for t in texts[1:])]
    output = Message(role=Role.assistant, content=tuple(parts))
    cut = played_prefix(output, played)
    whole = "".join(texts)
    assert _said(cut) == whole[:played]
    assert call in cut.parts
    _said(cut).encode("utf-8")  # never half a code point
    if played >= len(whole):
        assert cut is output

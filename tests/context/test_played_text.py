"""``played_count``: a played transcript cuts the model's own text where the audio stopped.

Invariant: the TTS's normalisation of the model's text (numbers spelt out, "Dr."
read as "doctor", symbols read as words, punctuation and case lost, hyphens and
apostrophes) never moves the cut: it lands after the output word the last played
word stands for, with the punctuation attached to it, and what is recorded is the
model's own text, never the transcript. A transcript of something else is refused
typed, not cut at a guess.
"""

from __future__ import annotations

import pytest

from turnloom.context import Message, Role, TextPart, ToolCallPart, played_count, played_prefix
from turnloom.errors import InvalidMessageError, PlayedTextMismatchError


def _reply(text: str) -> Message:
    return Message(role=Role.assistant, content=text)


def _heard(text: str, played_text: str) -> str:
    return text[: played_count(_reply(text), played_text)]


# (model text, what the TTS reported as spoken when the user barged in, the cut).
# The played strings are the shapes TTS word timestamps and transcriptions of
# played audio take: spelt-out numbers and times, expanded titles and symbols,
# no punctuation, lower case, hyphens split.
CASES = [
    (
        "Your flight to Boston costs $25. It leaves at 3:30 PM from gate 12.",
        "your flight to boston costs twenty-five dollars",
        "Your flight to Boston costs $25.",
    ),
    (
        "Your flight to Boston costs $25. It leaves at 3:30 PM from gate 12.",
        "Your flight to Boston costs twenty five dollars. It leaves at three thirty",
        "Your flight to Boston costs $25. It leaves at 3:30",
    ),
    (
        "Dr. Smith will see you at 10:15 tomorrow. Please arrive early.",
        "Doctor Smith will see you at ten fifteen tomorrow",
        "Dr. Smith will see you at 10:15 tomorrow.",
    ),
    (
        "I've booked 2 seats, rows 14 and 15. Anything else?",
        "I've booked two seats rows fourteen and fifteen",
        "I've booked 2 seats, rows 14 and 15.",
    ),
    (
        "Sure! The total is 1,250.75 dollars, charged to your Visa.",
        "sure the total is one thousand two hundred fifty point seven five",
        "Sure! The total is 1,250.75",
    ),
    (
        "Your reservation number is ABC123, for the 21st of March.",
        "your reservation number is a b c one two three for the twenty first",
        "Your reservation number is ABC123, for the 21st",
    ),
    (
        "We're at 42 Main St., about 5 minutes away.",
        "we are at forty two main street about five",
        "We're at 42 Main St., about 5",
    ),
    (
        "The discount is 15% — that's the best I can do.",
        "The discount is fifteen percent that's",
        "The discount is 15% — that's",
    ),
    (
        "Okay, let me check that for you.",
        "OK, let me check that for you.",
        "Okay, let me check that for you.",
    ),
    ("Hello there.", "   ", ""),
    ("Hello there.", "…", ""),
]


@pytest.mark.parametrize(("text", "played", "cut"), CASES)
def test_a_tts_normalised_transcript_cuts_the_model_text_at_the_last_played_word(
    text: str, played: str, cut: str
) -> None:
    """Invariant: the cut is at the model's word the last played word stands for."""
    assert _heard(text, played) == cut


def test_the_cut_counts_over_text_parts_in_order_and_keeps_tool_calls() -> None:
    """Invariant: the count is over the text parts joined, as played_prefix counts."""
    call = ToolCallPart(call_id="c1", name="lookup", arguments="{}")
    output = Message(
        role=Role.assistant,
        content=(TextPart(text="Let me check "), call, TextPart(text="flight 12 for you.")),
    )
    count = played_count(output, "let me check flight twelve")
    assert count == len("Let me check flight 12")
    assert played_prefix(output, count).content == (
        TextPart(text="Let me check "),
        call,
        TextPart(text="flight 12"),
    )


def test_a_transcript_of_something_else_is_refused_typed() -> None:
    """Invariant: fewer than half the played words matching is an error, not a guess."""
    with pytest.raises(PlayedTextMismatchError) as caught:
        played_count(_reply("Hello there, how are you?"), "completely unrelated words here")
    assert (caught.value.words, caught.value.matched, caught.value.field) == (4, 0, "played_text")
    assert isinstance(caught.value, InvalidMessageError)


def test_half_the_words_matching_is_enough() -> None:
    """The boundary: 2 of 4 played words match -> accepted; 1 of 3 -> refused. Unknown
    played words at the end are as cheap as added words as changed ones: on a tie the
    earlier cut wins (the history never claims words that may not have been heard)."""
    assert _heard("red green blue cyan magenta", "red green xx yy") == "red green"
    with pytest.raises(PlayedTextMismatchError):
        played_count(_reply("alpha beta gamma"), "alpha xx yy")


@pytest.mark.parametrize("bad", [None, 5, b"bytes"])
def test_played_text_must_be_a_str(bad: object) -> None:
    with pytest.raises(InvalidMessageError) as caught:
        played_count(_reply("hi"), bad)  # type: ignore[arg-type]
    assert caught.value.field == "played_text"


def test_only_an_assistant_output_is_cut() -> None:
    with pytest.raises(InvalidMessageError) as caught:
        played_count(Message(role=Role.user, content="hi"), "hi")
    assert caught.value.field == "output"

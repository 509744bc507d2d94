"""What a voice host records when the user barges in while the model speaks.

A spoken reply is played as it streams; when the user interrupts it, the
model must not later believe it said the words nobody heard. The interrupted
output is recorded truncated to what was played.
"""

from __future__ import annotations

__all__ = ("interrupted_output", "played_count", "played_prefix")

import re
import unicodedata

import msgspec

from turnloom.context.message import Message, Part, Role, TextPart
from turnloom.errors import InvalidMessageError, PlayedTextMismatchError, excerpt, what_type


def played_prefix(output: Message, played: int) -> Message:
    """The part of an assistant output that was played before an interruption.

    The output's text parts, taken in order as one text, keep their first
    ``played`` characters (code points): the part holding the cut is
    shortened and text parts after it are dropped. Every other part stays
    where it is: tool calls (without a result they are then excluded or
    cancelled by the ``open_calls`` policy, or answered if their results are
    recorded), reasoning and images. The message keeps its id, extras and
    layout. A result with no text and no other part is blank, which
    ``record`` does not store.

    The unit is the Unicode code point, what ``len(text)`` counts: not
    UTF-16 code units (a JavaScript ``charIndex`` counts an emoji as 2;
    convert it first), not UTF-8 bytes and not user-perceived characters
    (grapheme clusters). A cut never splits a code point, so valid text stays
    valid UTF-8. It may split a cluster, which then keeps its leading code
    points: an emoji followed by a skin-tone modifier, cut after 1, keeps the
    emoji alone; an ``e`` followed by a combining acute accent keeps the
    ``e``.

    Args:
        output: the whole assistant message the model produced.
        played: how many code points of its text were played (0 or more; a
            count beyond the text keeps all of it).

    Returns:
        the truncated message (``output`` itself when nothing was cut).

    Raises:
        InvalidMessageError: ``output`` is not an assistant Message, or
            ``played`` is not a non-negative int.
    """
    if not isinstance(output, Message) or output.role is not Role.assistant:
        raise InvalidMessageError(
            f"An interrupted output must be an assistant Message, not {_describe(output)}.",
            field="output",
        )
    if not isinstance(played, int) or isinstance(played, bool) or played < 0:
        raise InvalidMessageError(
            f"played must be a non-negative number of characters, not {excerpt(played)}.",
            field="played",
        )
    left = played
    parts: list[Part] = []
    cut = False
    for part in output.parts:
        if type(part) is TextPart:
            if left >= len(part.text):
                left -= len(part.text)
                parts.append(part)
                continue
            cut = True
            if left:
                parts.append(msgspec.structs.replace(part, text=part.text[:left]))
                left = 0
            continue
        parts.append(part)
    if not cut:
        return output
    return msgspec.structs.replace(output, content=tuple(parts))


# Combining diacritical marks (the blocks of Latin, Greek and Cyrillic accents): part of
# the word they follow, so a decomposed "cafe\u0301" is one word, as a composed "caf\u00e9".
_MARKS = "\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f"
# A word: letters or digits (any script) and their marks, apostrophes inside it joined
# ("don't").
_WORD = re.compile(rf"[^\W_](?:[^\W_]|[{_MARKS}])*(?:['\u2019][^\W_](?:[^\W_]|[{_MARKS}])*)*")
# What may stand between two parts of one written number: nothing but spaces ("one
# hundred"), or one of ":.,/-" with no space ("3:30", "1,250.75", "24/7", "1-800").
_IN_NUMBER = re.compile(r"\s*|[:.,/\-\u2010\u2011\u2013]")
# Characters that may follow a word and still belong to what was played with it.
_TRAILING = re.compile(r"[^\w\s]*")
_NUMBER_WORDS = frozenset(
    (
        "zero oh one two three four five six seven eight nine ten eleven twelve thirteen "
        "fourteen fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty "
        "seventy eighty ninety hundred thousand million billion trillion point "
        "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth "
        "thirteenth fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth twentieth "
        "thirtieth fortieth fiftieth sixtieth seventieth eightieth ninetieth hundredth "
        "thousandth millionth half quarter"
    ).split()
)
# Joins number words into one number ("one hundred and five"), never starts one.
_NUMBER_JOINERS = frozenset(("and", "point"))
# Spoken form -> written form: what TTS front ends expand (Dr. -> doctor).
_ABBREVIATIONS = {
    "doctor": "dr",
    "mister": "mr",
    "missus": "mrs",
    "misses": "mrs",
    "saint": "st",
    "street": "st",
    "avenue": "ave",
    "road": "rd",
    "junior": "jr",
    "senior": "sr",
    "okay": "ok",
    "versus": "vs",
    "et": "etc",
    "percent": "%",
}
_NUMBER = "#"  # the token every number, written or spoken, becomes
_MAX_SKEW = 16  # model words past twice the played words are never aligned


def _words(text: str) -> tuple[list[str], list[int], list[bool]]:
    """``text`` as normalised words, for each the code-point offset where it ends, and
    whether it is a number that goes on the number before it past punctuation.

    Case folded, apostrophes dropped, composed (NFC), abbreviations written
    short, and each run of numbers (digits, or number words joined by
    "and"/"point") one ``#`` token ending where the run ends. A run stops
    at punctuation between two numbers other than one of ``:.,/-`` with no
    space ("12. 3", "4, 5"): the number after it is a ``#`` of its own,
    marked as going on (a spoken transcript, unpunctuated, says such a list
    as one run).
    """
    words: list[str] = []
    ends: list[int] = []
    goes_on: list[bool] = []
    pending_joiner: tuple[str, int] | None = None
    for match in _WORD.finditer(text):
        word = match.group().casefold().replace("'", "").replace("\u2019", "")
        if not word.isascii():
            word = unicodedata.normalize("NFC", word)
        end = match.end()
        numeric = word in _NUMBER_WORDS or any(c.isdigit() for c in word)
        if numeric and words and words[-1] == _NUMBER:
            if pending_joiner is not None or _IN_NUMBER.fullmatch(text, ends[-1], match.start()):
                ends[-1] = end  # the run goes on (through a joiner, if one waited)
                pending_joiner = None
                continue
            words.append(_NUMBER)  # past punctuation: a number of its own
            ends.append(end)
            goes_on.append(True)
            continue
        if pending_joiner is not None:  # no number followed: the joiner is a word
            words.append(pending_joiner[0])
            ends.append(pending_joiner[1])
            goes_on.append(False)
            pending_joiner = None
        if numeric:
            words.append(_NUMBER)
            ends.append(end)
            goes_on.append(False)
            continue
        if (
            word in _NUMBER_JOINERS
            and words
            and words[-1] == _NUMBER
            and text[ends[-1] : match.start()].isspace()
        ):
            pending_joiner = (word, end)  # joins only when a number follows
            continue
        words.append(_ABBREVIATIONS.get(word, word))
        ends.append(end)
        goes_on.append(False)
    if pending_joiner is not None:
        words.append(pending_joiner[0])
        ends.append(pending_joiner[1])
        goes_on.append(False)
    return words, ends, goes_on


def played_count(output: Message, played_text: str) -> int:
    """How many code points of an output's text a played transcript covers.

    A voice host often has what was played as text, not as a count: the
    words its TTS reported as spoken (word timestamps), or a transcription
    of the audio that went out. That text is the TTS's normalisation of the
    model's text ("$25" spoken as "twenty-five dollars", "Dr." as "doctor",
    punctuation and case lost), so it cannot be cut by its length. The rule:

    1. Both texts are split into words: runs of letters and digits (any
       script) with their combining accents; an apostrophe inside a word is
       dropped ("don't" = "dont"); everything else (spaces, punctuation,
       symbols such as ``$`` and ``%``) only separates words. Words are
       compared case folded and composed (Unicode NFC: "cafe\u0301" =
       "caf\u00e9").
    2. Numbers compare by kind, not value: each run of digit words ("25",
       "3:30" = "3", "30", "1st") and of number words ("twenty-five",
       "one hundred and five", "three point five", "first") is one number
       word. In the output, punctuation other than ``:.,/-`` with no space
       ends a run ("12. 3", "4, 5, 6"): each number after it is one of its
       own, which a played number may cover with no edit (an unpunctuated
       transcript says "four five six" as one run) and, at the cut, does
       not (the earliest cut below). A few spoken expansions compare equal
       to their written form:
       doctor/dr, mister/mr, missus/mrs, saint/st, street/st, avenue/ave,
       road/rd, junior/jr, senior/sr, okay/ok, versus/vs, percent/%.
    3. The played words are aligned with the output's words by the fewest
       edits (a word the TTS added, such as "dollars", a word it left out,
       a word it changed: one edit each), the played words against the
       start of the output (its words after the alignment cost nothing).
       The cut is after the output word the last played word aligns with,
       plus the punctuation directly after it (no space between); when the
       alignment reaches the output's last word, the whole text. Between
       alignments with as few edits and as many matched words, the earliest
       cut wins: history never claims words that may not have been heard.

    So a cut lands at a word boundary of the output and never drifts by the
    TTS's normalisation; it can only be wrong by the words of an edit at
    the very end (a played word the TTS changed beyond recognition counts
    as the output word at its place). Cost: O(played words x output
    words), the output's words counted up to twice the played words plus 16.

    Args:
        output: the whole assistant message the model produced (its text
            parts, in order, as one text, as :func:`played_prefix` counts).
        played_text: the text that was played (empty or without words:
            nothing was played).

    Returns:
        the count to pass to :func:`played_prefix` (code points, 0 to the
        text's length).

    Raises:
        InvalidMessageError: ``output`` is not an assistant Message, or
            ``played_text`` is not a str.
        PlayedTextMismatchError: fewer than half of the played words match
            the output's words (the transcript of another reply).
    """
    if not isinstance(output, Message) or output.role is not Role.assistant:
        raise InvalidMessageError(
            f"An interrupted output must be an assistant Message, not {_describe(output)}.",
            field="output",
        )
    if not isinstance(played_text, str):
        raise InvalidMessageError(
            f"played_text must be a str, not {what_type(played_text)}.", field="played_text"
        )
    text = "".join(part.text for part in output.parts if type(part) is TextPart)
    played, _, _ = _words(played_text)
    if not played:
        return 0
    words, ends, goes_on = _words(text)
    limit = min(len(words), 2 * len(played) + _MAX_SKEW)
    # Rolling rows of (edits, -matches) for played[:i] against words[:j].
    previous = [(j, 0) for j in range(limit + 1)]
    for i, spoken in enumerate(played, 1):
        row = [(i, 0)]
        for j in range(1, limit + 1):
            cost, negative = previous[j - 1]
            if words[j - 1] == spoken:
                best = (cost, negative - 1)
            else:
                best = (cost + 1, negative)
            up = previous[j]
            left = row[j - 1]
            if (up[0] + 1, up[1]) < best:
                best = (up[0] + 1, up[1])
            if (left[0] + 1, left[1]) < best:
                best = (left[0] + 1, left[1])
            if spoken == _NUMBER and goes_on[j - 1] and left < best:
                best = left  # the spoken number goes on over the written list's next one
            row.append(best)
        previous = row
    # The fewest edits (then the most matches, then the earliest end) over every end.
    end = min(range(limit + 1), key=lambda j: (previous[j], j))
    matched = -previous[end][1]
    if 2 * matched < len(played):
        raise PlayedTextMismatchError(
            f"Only {matched} of the {len(played)} played words match the output's text "
            f"({excerpt(played_text)}); it is not what this output played.",
            words=len(played),
            matched=matched,
        )
    if end == 0:
        return 0
    if end == len(words):
        return len(text)
    cut = ends[end - 1]
    trailing = _TRAILING.match(text, cut)
    return trailing.end() if trailing is not None else cut


def interrupted_output(output: Message, played: int | None, played_text: str | None) -> Message:
    """What ``record_interrupted`` records: by count (:func:`played_prefix`) or by text.

    Exactly one of ``played`` (code points) and ``played_text`` (matched by
    :func:`played_count`) is given.

    Raises:
        InvalidMessageError: both or neither are given; and as
            :func:`played_prefix` and :func:`played_count`.
        PlayedTextMismatchError: as :func:`played_count`.
    """
    if (played is None) == (played_text is None):
        raise InvalidMessageError(
            "record_interrupted takes exactly one of played (a count) and played_text.",
            field="played",
        )
    if played_text is not None:
        played = played_count(output, played_text)
    assert played is not None
    return played_prefix(output, played)


def _describe(value: object) -> str:
    if isinstance(value, Message):
        return f"a {value.role!s} message"
    return what_type(value)

"""What a voice host records when the user barges in while the model speaks.

A spoken reply is played as it streams; when the user interrupts it, the
model must not later believe it said the words nobody heard. The interrupted
output is recorded truncated to what was played.
"""

from __future__ import annotations

__all__ = ("played_prefix",)

import msgspec

from turnloom.context.message import Message, Part, Role, TextPart
from turnloom.errors import InvalidMessageError, excerpt, what_type


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


def _describe(value: object) -> str:
    if isinstance(value, Message):
        return f"a {value.role!s} message"
    return what_type(value)

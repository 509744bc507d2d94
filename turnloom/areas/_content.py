"""Turning the content a caller hands to a built-in area into checked messages."""

from __future__ import annotations

__all__ = ("MessageContent", "as_messages")

from collections.abc import Sequence
from typing import TypeAlias, cast

from turnloom.context.message import Message, Role, check_message
from turnloom.errors import InputError

MessageContent: TypeAlias = "str | Message | Sequence[Message]"
"""Text (one message of the given role), one message, or messages oldest first."""


def as_messages(content: MessageContent, *, role: Role, where: str) -> tuple[Message, ...]:
    """Normalise ``content`` to a tuple of checked messages, oldest first.

    Raises:
        InputError: ``content`` is empty text, an empty sequence, or not text
            or messages.
        InvalidMessageError, InvalidTextError, DuplicateIdError: a message is
            malformed (see :func:`~turnloom.context.check_message`).
    """
    if isinstance(content, str):
        if not content.strip():
            raise InputError(f"{where} is empty or whitespace-only text.")
        messages: tuple[Message, ...] = (Message(role=role, content=content),)
    elif isinstance(content, Message):
        messages = (content,)
    elif isinstance(content, Sequence):
        messages = tuple(cast("Sequence[Message]", content))
        if not messages:
            raise InputError(f"{where} is an empty sequence of messages.")
    else:
        raise InputError(
            f"{where} must be text or turnloom Messages, not {type(content).__name__}."
        )
    for index, message in enumerate(messages):
        check_message(message, where=f"{where}[{index}]")
    return messages

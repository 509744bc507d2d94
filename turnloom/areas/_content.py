"""Turning the content a caller hands to a built-in area into checked messages."""

from __future__ import annotations

__all__ = ("MessageContent", "as_messages", "text_role")

from collections.abc import Sequence
from typing import TypeAlias, cast

from turnloom.context.message import Message, Role, admit_message, is_blank_part
from turnloom.errors import InputError, excerpt, what_type

MessageContent: TypeAlias = "str | Message | Sequence[Message]"
"""Text (one message of the given role), one message, or messages oldest first."""


def text_role(role: object, *, where: str) -> Role:
    """Check the role given for text content: a :class:`Role` that carries text.

    Raises:
        InputError: ``role`` is not a Role, or is ``tool`` (a tool message
            carries tool results only; the OpenAI gateways render its text to
            nothing).
    """
    try:
        checked = Role(cast("str", role))
    except ValueError:
        raise InputError(
            f"The role {excerpt(role)} given for {where} text is not a Role."
        ) from None
    if checked is Role.tool:
        raise InputError(
            f"The role tool given for {where} text carries tool results only; "
            "use user, assistant, developer or system."
        )
    return checked


def as_messages(content: MessageContent, *, role: Role, where: str) -> tuple[Message, ...]:
    """Normalise ``content`` to a tuple of checked messages, oldest first.

    Raises:
        InputError: ``content`` is empty text, an empty sequence, a message
            with no content (no part but blank text without extras, see
            :func:`~turnloom.context.message.is_blank_part`: no gateway
            renders it), or not text or messages; ``role`` is not a Role
            that carries text (see :func:`text_role`).
        InvalidMessageError, InvalidTextError, DuplicateIdError: a message is
            malformed (see :func:`~turnloom.context.check_message`).
    """
    role = text_role(role, where=where)
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
        raise InputError(f"{where} must be text or turnloom Messages, not {what_type(content)}.")
    held = tuple([admit_message(m, where=f"{where}[{i}]")[0] for i, m in enumerate(messages)])
    for index, message in enumerate(held):
        if all(map(is_blank_part, message.parts)):
            raise InputError(
                f"{where}[{index}] has no content: it holds only blank text, which no "
                "gateway renders."
            )
    return held

"""Walk a transcript into turns: the one driver of every job that replays messages.

A transcript is a list of messages, oldest first, as an agent exchanged them:

* ``system``/``developer`` messages become the pinned instructions of the next
  turn;
* every ``user`` message opens a turn (:class:`Turn`);
* every ``assistant`` message answers one model call of the current turn
  (:class:`Reply`);
* any other message (a ``tool`` result) is an output of the current turn
  (:class:`Output`).

Replies and outputs before the first turn belong to no turn and are skipped.
Synchronous and pure: the jobs (``replay``, ``loadtest``, the GC benchmark,
the history tests) decide what each step does.
"""

from __future__ import annotations

__all__ = ("Output", "Reply", "Step", "Turn", "snapshot", "turn_ids", "walk")

import itertools
from collections.abc import Iterable, Iterator

import msgspec

from turnloom.context.message import Message, Role
from turnloom.runtime.schemas import TurnSnapshot


class Turn(msgspec.Struct, frozen=True, kw_only=True):
    """A ``user`` message that opens a turn.

    Attributes:
        index: the message's position in the transcript, from 0.
        number: the turn's position in this walk, from 0.
        turn_id: the turn's id.
        input: the user message.
        instructions: the ``system``/``developer`` messages since the previous
            turn, or None when there were none.
    """

    index: int
    number: int
    turn_id: str
    input: Message
    instructions: tuple[Message, ...] | None


class Reply(msgspec.Struct, frozen=True, kw_only=True):
    """An ``assistant`` message: the answer of one model call of ``turn_id``."""

    index: int
    turn_id: str
    message: Message


class Output(msgspec.Struct, frozen=True, kw_only=True):
    """Any other message of ``turn_id`` (a tool result)."""

    index: int
    turn_id: str
    message: Message


Step = Turn | Reply | Output
"""One step of a walk."""


def turn_ids(prefix: str = "t") -> Iterator[str]:
    """``prefix + "0"``, ``prefix + "1"``, ...: turn ids for :func:`walk`."""
    return (f"{prefix}{n}" for n in itertools.count())


def walk(
    messages: Iterable[Message],
    *,
    ids: Iterator[str] | None = None,
    max_turns: int | None = None,
) -> Iterator[Step]:
    """The steps of a transcript, in order.

    Args:
        messages: the transcript, oldest first.
        ids: where turn ids come from (default ``turn_ids()``); pass one
            iterator to several walks to number their turns as one history.
        max_turns: stop before the turn after this many, if given.
    """
    names = ids if ids is not None else turn_ids()
    instructions: list[Message] = []
    turn_id: str | None = None
    number = 0
    for index, message in enumerate(messages):
        role = message.role
        if role in (Role.system, Role.developer):
            instructions.append(message)
        elif role is Role.user:
            if max_turns is not None and number >= max_turns:
                return
            turn_id = next(names)
            yield Turn(
                index=index,
                number=number,
                turn_id=turn_id,
                input=message,
                instructions=tuple(instructions) if instructions else None,
            )
            instructions = []
            number += 1
        elif turn_id is None:
            continue
        elif role is Role.assistant:
            yield Reply(index=index, turn_id=turn_id, message=message)
        else:
            yield Output(index=index, turn_id=turn_id, message=message)


def snapshot(context_id: str, turn: Turn) -> TurnSnapshot:
    """The :class:`~turnloom.runtime.TurnSnapshot` that commits ``turn`` to ``context_id``."""
    return TurnSnapshot(
        context_id=context_id,
        turn_id=turn.turn_id,
        input=(turn.input,),
        instructions=turn.instructions,
    )

"""Which result answers which call across turns, and the ties that follow."""

from __future__ import annotations

from collections.abc import Sequence

from turnloom.context.history._cells import _Turn
from turnloom.context.message import (
    Message,
    Role,
    ToolCallPart,
)
from turnloom.context.pairing import (
    CallTracker,
)
from turnloom.errors import (
    AmbiguousStepError,
    excerpt,
)


def _step_tail(turn: _Turn) -> list[Message]:
    """The last step of ``turn``, oldest first: what outputs may continue or answer.

    Its last run of assistant messages and the results after it; nothing
    when a message that is not a result follows the run (or the turn has none).
    """
    tail: list[Message] = []
    seen = False  # an assistant message was met
    for entries in (turn.outputs, turn.state, turn.input):
        for entry in reversed(entries):
            message = entry.message
            if message.role is Role.assistant:
                seen = True
            elif seen or not (
                message.role is Role.tool or (message.role is Role.user and message.tool_results)
            ):
                tail.reverse()
                return tail if seen else []
            tail.append(message)
    tail.reverse()
    return tail if seen else []


def _check_turn_start(before: _Turn, first: Message, where: str) -> None:
    """Refuse ``first`` starting the turn after ``before`` when it would continue ``before``'s step.

    A step never spans turns (each turn renders as its own span), so a turn
    cannot start with an assistant message that, read after the previous
    turn's trailing assistant messages, would continue their step.

    Raises:
        AmbiguousStepError: it would (``reason`` ``"across_turns"``).
    """
    if first.role is not Role.assistant:
        return
    tail = _step_tail(before)
    if not tail:
        return
    tracker = CallTracker()
    for message in tail:
        tracker.feed(message)
    if tracker.continues(first):
        calls = first.tool_calls
        raise AmbiguousStepError(
            f"{where} is an assistant message that would continue the model step turn "
            f"{excerpt(before.turn_id)} ends with (its calls are still open); a model step "
            "belongs to one turn: record its messages to that turn.",
            field=where,
            call_id=calls[0].call_id if calls else "",
            reason="across_turns",
        )


def _calls_after(turns: Sequence[_Turn]) -> tuple[dict[str, ToolCallPart], int]:
    """The calls still open after ``turns`` (each whole), and the index of their turn.

    Pairing follows :class:`~turnloom.context.CallTracker`, as the render
    does, from the first kept turn (calls of evicted turns are not carried).
    The state after a message that starts or ends a call group does not
    depend on the messages before it, so the walk goes back only to the last
    turn holding such a message (the tracker's ``group`` moved): O(that turn
    and the results-only turns after it), the newest turn in practice.

    Returns:
        the open calls by call id, in call order, and the index in ``turns``
        of the turn whose assistant message made them (-1 when none is open).
    """
    for index in range(len(turns) - 1, -1, -1):
        tracker = CallTracker()
        for message in turns[index].messages(True):
            tracker.feed(message)
        if tracker.group:
            for turn in turns[index + 1 :]:
                tracker.new_turn()
                for message in turn.messages(True):
                    tracker.feed(message)
            return tracker.open, (index if tracker.open else -1)
    return {}, -1


def _answers(calls: dict[str, ToolCallPart], messages: Sequence[Message]) -> bool:
    """True when a tool result of ``messages`` answers one of the open ``calls``.

    Once their group ends (an assistant message of ``messages`` opens another),
    a later result answers the calls of ``messages`` themselves, not ``calls``.
    """
    if not calls:
        return False
    tracker = CallTracker(calls.values())
    for message in messages:
        if tracker.group:
            return False
        if tracker.feed(message).paired:
            return True
    return False


def _paired_after(turns: Sequence[_Turn], position: int) -> dict[tuple[int, int, str], None]:
    """The results of the turns after ``position`` that answer calls open after it.

    Each is named by (turn index, message index in its whole turn, call id),
    in the order the turns hold them (an ordered set: the keys).
    Only the messages before the first one that ends the carried group are
    walked: where a group ends depends on the messages' roles alone, so
    pairing after it does not depend on the turns up to ``position``.
    """
    calls, _ = _calls_after(turns[: position + 1])
    paired: dict[tuple[int, int, str], None] = {}
    if not calls:
        return paired
    tracker = CallTracker(calls.values())
    for index in range(position + 1, len(turns)):
        tracker.new_turn()
        for number, message in enumerate(turns[index].messages(True)):
            if tracker.group:
                return paired
            paired.update(((index, number, r.call_id), None) for r in tracker.feed(message).paired)
    return paired


def _strands(
    old: Sequence[_Turn], new: Sequence[_Turn], position: int
) -> tuple[int, tuple[str, ...]]:
    """Where changing turn ``position`` (``old`` to ``new``) would orphan a later result.

    The one rule for changes to an earlier turn (a late record, kept state):
    a result a later turn holds that answers a call stays answered, because
    pairing drops a result answering nothing, and a later turn's input made
    of such results would leave that turn's own model input. A change may
    make a later result answer a call it did not answer before.

    Returns:
        the index of the first later turn holding a result that answers a
        call in ``old`` and none in ``new``, with the call ids of those
        results in the order the turn holds them; ``(-1, ())`` when there is
        none.
    """
    kept = _paired_after(new, position)
    lost = [key for key in _paired_after(old, position) if key not in kept]
    if not lost:
        return -1, ()
    first = lost[0][0]  # keys are in turn order
    return first, tuple(call_id for index, _, call_id in lost if index == first)

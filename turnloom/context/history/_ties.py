"""Which result answers which call across turns, and the ties that follow."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from turnloom.context.history._cells import _Entry, _Turn
from turnloom.context.history._turns import _Turns
from turnloom.context.history.limits import HistoryLimits
from turnloom.context.message import (
    Message,
    Role,
    ToolCallPart,
    ToolResultPart,
)
from turnloom.context.pairing import (
    CallTracker,
)
from turnloom.errors import (
    AmbiguousStepError,
    PairedTurnsTooLargeError,
    excerpt,
)


def last_step_start(entries: Sequence[_Entry]) -> int:
    """Where the last step of ``entries`` starts, or -1 when they end without one.

    The last step is their last run of assistant messages and the results
    after it (tool messages, user messages holding results); none when a
    message that is not a result follows the run, or there is no run.
    O(the last step).
    """
    at = len(entries) - 1
    while at >= 0:
        message = entries[at].message
        if message.role is Role.tool or (message.role is Role.user and message.tool_results):
            at -= 1
        else:
            break
    if at < 0 or entries[at].message.role is not Role.assistant:
        return -1
    while at > 0 and entries[at - 1].message.role is Role.assistant:
        at -= 1
    return at


def _step_tail(turn: _Turn) -> list[Message]:
    """The last step of ``turn`` (:func:`last_step_start`), oldest first: what outputs
    may continue or answer; empty when the turn ends without one."""
    entries = turn.entries(True)
    start = last_step_start(entries)
    return [e.message for e in entries[start:]] if start >= 0 else []


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


class _TieState(Protocol):
    """The state of a :class:`TurnHistory` this file reads and changes."""

    _limits: HistoryLimits
    _linked: set[int]
    _turns: _Turns


def _unit_first(history: _TieState, index: int) -> int:
    """The index of the oldest turn eviction keeps together with ``history._turns[index]``.

    O(the turns tied together), at most ``max_turns`` once committed.
    """
    turns, linked = history._turns, history._linked
    while index > 0 and turns[index].serial in linked:
        index -= 1
    return index


def _holds_results(entries: tuple[_Entry, ...]) -> bool:
    """True when a message of ``entries`` holds a tool result (``any(m.tool_results)``,
    without building each message's tuple of results)."""
    for entry in entries:
        for part in entry.message.parts:
            if type(part) is ToolResultPart:
                return True
    return False


def _tie(history: _TieState, turn_id: str, entries: tuple[_Entry, ...], size: int) -> int:
    """Where a new turn's input answers calls: the index of their turn, or -1.

    Such a turn is evicted only together with that turn (and the turns
    tied to it), so they must fit every limit together.

    Raises:
        PairedTurnsTooLargeError: together they would be over a limit.
    """
    turns = history._turns
    if not turns.size or not _holds_results(entries):
        return -1
    calls, at = _calls_after(turns)
    if not _answers(calls, [e.message for e in entries]):
        return -1
    first = _unit_first(history, at)
    unit = turns[first:]
    limits = history._limits
    for kind, value, limit in (
        ("turns", len(unit) + 1, limits.max_turns),
        ("items", sum(t.items for t in unit) + len(entries), limits.max_items),
        ("bytes", sum(t.bytes for t in unit) + size, limits.max_bytes),
        (
            "tokens",
            sum(t.tokens for t in unit) + sum(e.tokens for e in entries),
            limits.max_tokens,
        ),
    ):
        if limit is not None and value > limit:
            raise PairedTurnsTooLargeError(
                f"Turn {excerpt(turn_id)} input answers tool calls of turn "
                f"{excerpt(turns[at].turn_id)}, and eviction never separates results "
                f"from their calls: turns {excerpt(unit[0].turn_id)} to "
                f"{excerpt(turn_id)} would be kept together with {value} {kind}, over "
                f"the history's max_{kind} of {limit}. Allow a turn making calls and "
                "the turns answering them to fit together.",
                unit=kind,
                size=value,
                limit=limit,
                turn_id=turn_id,
                first_turn_id=unit[0].turn_id,
            )
    return at


def _tied_error(
    where: str,
    kind: str,
    size: int,
    limit: int,
    unit: tuple[_Turn, ...],
    turn_id: str | None,
) -> PairedTurnsTooLargeError:
    """The error of a record that would make turns evicted only together too large."""
    return PairedTurnsTooLargeError(
        f"{where} would make turns {excerpt(unit[0].turn_id)} to "
        f"{excerpt(unit[-1].turn_id)}, which eviction keeps together (results given as "
        f"a turn's input stay with their calls), hold at least {size} {kind}, over the "
        f"history's max_{kind} of {limit}.",
        unit=kind,
        size=size,
        limit=limit,
        turn_id=turn_id or unit[-1].turn_id,
        first_turn_id=unit[0].turn_id,
    )


def _retie(history: _TieState, position: int) -> None:
    """Tie again the turns after ``position``, whose pairing may have changed.

    Called after the newest turn left (a retraction: ``position`` is the
    new newest); see :meth:`TurnHistory._relinked`.
    """
    linked = _relinked(history, history._turns, position)
    history._linked.clear()
    history._linked.update(linked)


def _relinked(history: _TieState, turns: _Turns, position: int) -> set[int]:
    """The tie set of ``turns``: the kept turns, but ``turns[position]`` changed.

    After the kept state or outputs of ``turns[position]`` changed while a
    later turn was held (a late record, kept state), or after the newest
    turn left (a retraction: ``position`` is the new newest), a later
    turn's input can answer calls it did not answer before, or no longer
    answer the calls it answered, so ties are recomputed, not only added:
    the tie set stays exactly what a cold rebuild of the kept turns
    computes, and a tie never outlives its reason.

    Proof that recomputing from ``first``, the oldest turn tied with
    ``position``, suffices: ``first`` is not tied (or is the oldest kept
    turn), so no tie crossed into it from an earlier turn; ties reaching
    before ``first`` come from inputs of turns before it, which the change
    (after ``position``'s input) cannot affect. Each turn after ``first``
    is judged as a commit judges it (``_calls_after``, ``_answers``),
    which may tie it back past ``first`` when the change reopened an older
    group. O(the turns from ``first`` on, each with its walk back).
    """
    first = _unit_first(history, position)
    linked = history._linked - {t.serial for t in turns[first + 1 :]}
    for index in range(first + 1, len(turns)):
        calls, at = _calls_after(turns[:index])
        if _answers(calls, turns[index].messages(False)):
            linked.update(t.serial for t in turns[at + 1 : index + 1])
    return linked


def _check_ties(
    history: _TieState,
    turns: _Turns,
    linked: set[int],
    position: int,
    where: str,
    turn_id: str,
) -> None:
    """Refuse a late change to ``turns[position]`` that tied turns cannot fit.

    Turns tied together must fit every limit as the commit of the last of
    them and the records after it found them (:meth:`TurnHistory._tie`, and
    :meth:`TurnHistory.check_batch` on items and bytes; tokens count the last one's
    input only, as records are not held to ``max_tokens``), which a
    restore from a checkpoint checks again: a late
    record or kept state that adds a tie (a later input now answers a call
    of the changed turn), or grows a turn tied to a later one, is held to
    it, so what a history holds it can always be rebuilt from.

    Raises:
        PairedTurnsTooLargeError: the turns tied together would be over
            ``max_turns``, ``max_items``, ``max_bytes`` or ``max_tokens``.
    """
    limits = history._limits
    added = linked - history._linked
    for index, turn in enumerate(turns):
        if index != position and turn.serial not in added:
            continue
        first = last = index
        while first > 0 and turns[first].serial in linked:
            first -= 1
        while last + 1 < len(turns) and turns[last + 1].serial in linked:
            last += 1
        if last <= position and index == position:
            continue  # nothing committed after the change is tied to it
        unit = turns[first : last + 1]
        for kind, value, limit in (
            ("turns", len(unit), limits.max_turns),
            ("items", sum(t.items for t in unit), limits.max_items),
            ("bytes", sum(t.bytes for t in unit), limits.max_bytes),
            (
                "tokens",
                sum(t.tokens for t in unit[:-1]) + sum(e.tokens for e in unit[-1].input),
                limits.max_tokens,
            ),
        ):
            if limit is not None and value > limit:
                raise _tied_error(where, kind, value, limit, unit, turn_id)

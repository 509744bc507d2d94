"""What a commit, a record and kept state check, then change: the turns and their totals."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from turnloom.context.history._batches import _DoorState, _entries
from turnloom.context.history._cells import _Entry, _Turn
from turnloom.context.history._evictions import _NOTHING_ASIDE, _EvictionState, _settle
from turnloom.context.history._sent import (
    assign_input,
    assign_outputs,
    assign_state,
    repair_results,
    unplanned,
)
from turnloom.context.history._steps import (
    _NO_CLOSED,
    _StepsState,
    _StepState,
    advance_steps,
    cold_steps,
    kept_steps,
)
from turnloom.context.history._ties import (
    _check_ties,
    _check_turn_start,
    _relinked,
    _step_tail,
    _strands,
    _tie,
    _TieState,
)
from turnloom.context.message import (
    _PINNED_ROLES,
    Message,
    Part,
    ReasoningPart,
    Role,
    _first_instruction,
    admit_message,
    check_id,
    is_blank_part,
    is_blank_text,
    reject_instructions,
)
from turnloom.context.pairing import (
    _check_fed,
    check_steps,
    steps_may_conflict,
)
from turnloom.context.tokens import count_tokens
from turnloom.errors import (
    DuplicateIdError,
    InvalidMessageError,
    ItemTooLargeError,
    OutOfOrderTurnError,
    PairedTurnsTooLargeError,
    StrandedResultsError,
    TurnloomError,
    UnknownTurnError,
    excerpt,
)


class _ChangeState(_DoorState, _EvictionState, _TieState, _StepsState, Protocol):
    """The state of a :class:`TurnHistory` this file reads and changes (with what the
    batch check, the evictions and the ties read)."""

    _blank_dropped: int
    _duplicates: int
    _kept_at: Sequence[int] | None
    _late_dropped: int
    _pinned_bytes: int
    _pinned_tokens: int
    _sequence: int | None
    _serial: int


def _blank(message: Message) -> bool:
    """True when the message has nothing but blank parts: an output not recorded.

    A blank part is :func:`~turnloom.context.message.is_blank_part`'s (a blank
    text part with extras is content). Reasoning with blank text and no
    signature, encrypted content or redaction counts as blank too: it is what
    a model call cancelled while it thought leaves behind, and no provider
    can verify or show it.
    """
    for part in message.parts:
        if type(part) is ReasoningPart:
            if not _blank_reasoning(part):
                return False
        elif not is_blank_part(part):
            return False
    return True


def _blank_reasoning(part: Part) -> bool:
    return (
        type(part) is ReasoningPart
        and is_blank_text(part.text)
        and part.signature is None
        and part.encrypted_content is None
        and not part.redacted
    )


def _commit(
    history: _ChangeState,
    turn_id: str,
    input: Sequence[Message],
    *,
    instructions: Sequence[Message] | None = None,
    sequence: int | None = None,
    keep_unpaired: bool = False,
) -> None:
    """The work of :meth:`TurnHistory.commit` (documented there)."""
    check_id(turn_id, "turn id")
    if turn_id in history._ids or turn_id in history._evicted_ids:  # (has_turn, inline)
        raise DuplicateIdError(
            f"Turn {excerpt(turn_id)} was already committed to this context; each turn "
            "of a context takes a new turn_id."
        )
    if sequence is not None:
        if not isinstance(sequence, int) or isinstance(sequence, bool) or sequence < 0:
            raise InvalidMessageError(
                f"Turn {excerpt(turn_id)} sequence must be a non-negative integer, not "
                f"{excerpt(sequence)}."
            )
        if history._sequence is not None and sequence <= history._sequence:
            raise OutOfOrderTurnError(
                f"Turn {excerpt(turn_id)} has sequence {sequence}, but turn sequence "
                f"{history._sequence} was already committed; turns must arrive in order."
            )
    if _first_instruction(input) >= 0:
        reject_instructions(input, "input", f"Turn {excerpt(turn_id)} input")
    # The checks below read the messages the entries hold, not the caller's.
    entries, sizes, planned, input = _entries(history, input, turn_id, "input")
    if steps_may_conflict(input, None):
        # Its leading results may answer the calls the kept turns leave open
        # (an approval), or a call recorded late to a kept turn.
        _check_steps_named(
            input, "Turn {} input", turn_id, late=bool(history._turns), unpaired=keep_unpaired
        )
    if input and input[0].role is Role.assistant and history._turns:
        # (Only an assistant message can continue a step: its label is built for it alone.)
        _check_turn_start(history._turns[-1], input[0], f"Turn {excerpt(turn_id)} input[0]")
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        message_id = entry.message.id
        if message_id is not None:
            if message_id in seen or message_id in history._message_ids:
                raise DuplicateIdError(
                    f"Turn {excerpt(turn_id)} input[{i}] has id {excerpt(message_id)}, "
                    f"which a message "
                    "of this context already has."
                )
            seen.add(message_id)
    pinned: tuple[_Entry, ...] | None = None
    pinned_sizes: tuple[int, ...] = ()
    if instructions is not None:
        for i, message in enumerate(instructions):
            if isinstance(message, Message) and message.role not in _PINNED_ROLES:
                raise InvalidMessageError(
                    f"Turn {excerpt(turn_id)} instructions[{i}] has role "
                    f"{excerpt(str(message.role))}; "
                    "instructions are system or developer messages.",
                    field="role",
                )
        pinned, pinned_sizes, _, _ = _entries(
            history, instructions, turn_id, "instructions", pinned=True
        )
    size = sum(sizes)
    tied = _tie(history, turn_id, entries, size)
    # Validated: change state.
    if history._aside is not None:
        _settle(history)
    history._aside = _NOTHING_ASIDE  # what evictions drop from now on can be restored
    if pinned is not None:
        history._pinned = pinned
        history._pinned_bytes = sum(pinned_sizes)
        history._pinned_tokens = sum(e.tokens for e in pinned)
    if sequence is not None:
        history._sequence = sequence
    history._serial += 1
    turn = _Turn.of(
        turn_id,
        entries,
        (),
        size,
        entries[0].tokens if len(entries) == 1 else sum([e.tokens for e in entries]),
        history._serial,
    )
    for entry in entries:
        if entry.message.id is not None:
            history._message_ids[entry.message.id] = (history._serial, entry.message)
    # Against the kept turns, before this one joins them (the door decided, in practice).
    assign_input(history, entries, planned)
    if tied >= 0:
        history._linked.update(t.serial for t in history._turns[tied + 1 :])
        history._linked.add(turn.serial)
    history._turns = history._turns.appended(turn)
    history._ids[turn_id] = None
    history._items += len(entries)  # turn.items (its cells are the entries), without the property
    history._bytes += turn.bytes
    history._tokens += turn.tokens
    history._view = None


def _check_steps_named(
    messages: Sequence[Message],
    label: str,
    turn_id: str,
    *,
    before: Sequence[Message] = (),
    indices: Sequence[int] | None = None,
    late: bool = False,
    unpaired: bool = False,
    step: _StepState | None = None,
) -> None:
    """:func:`check_steps`, its errors naming the batch ``label.format(excerpt(turn_id))``.

    The label is built only when the check fails: ``check_steps`` is pure, so
    a failed check runs again, labelled, and raises the very error named.
    With ``step`` (the state after ``before``, a turn's last step: see
    ``_steps``), the check feeds ``messages`` to that state itself instead of
    feeding ``before`` to a new one (a step starts a call group, so no result
    window is open): the caller took it out of the history, and puts it back
    only once the change is made. A failed check runs again from a cold one.
    """
    try:
        if step is None:
            check_steps(messages, "", before=before, indices=indices, late=late, unpaired=unpaired)
        else:
            assert step.tracker is not None
            closed = step.closed if step.closed is not _NO_CLOSED else set()  # (never changed)
            _check_fed(messages, "", step.tracker, closed, set(), indices, late, unpaired)
        return
    except TurnloomError as exc:
        failed = exc
    where = label.format(excerpt(turn_id))
    if step is None:
        check_steps(messages, where, before=before, indices=indices, late=late, unpaired=unpaired)
    else:
        cold = cold_steps(step.turn)
        assert cold.tracker is not None
        _check_fed(messages, where, cold.tracker, set(cold.closed), set(), indices, late, unpaired)
    raise failed  # not reached: the labelled run raises the same error


def _record(
    history: _ChangeState,
    turn_id: str,
    outputs: Sequence[Message],
    *,
    serial: int | None = None,
    keep_unpaired: bool = False,
) -> int:
    """The work of :meth:`TurnHistory.record` (documented there)."""
    held = history._turns
    newest = held.size - 1
    position = newest  # the newest, in practice
    old = held[position] if position >= 0 else None  # read once: a Python __getitem__
    while old is not None and old.turn_id != turn_id:
        position -= 1
        old = held[position] if position >= 0 else None
    if old is None or (serial is not None and old.serial != serial):
        known = position >= 0 or serial is not None or turn_id in history._evicted_ids
        if known or history._forgotten:
            # Validate anyway: a malformed late output is still an error.
            _entries(history, outputs, turn_id, "output")
            history._late_dropped += len(outputs)
            return 0
        raise UnknownTurnError(f"Turn {excerpt(turn_id)} was never committed to this context.")
    entries, sizes, planned, _ = _entries(history, outputs, turn_id, "output", turn_id)
    # (The door's check changes no turn: ``old`` is still ``history._turns[position]``.)
    kept: Sequence[_Entry]
    kept_at: Sequence[int]
    if len(entries) == 1 and entries[0].message.id is None and not _blank(entries[0].message):
        # One message without an id that says something (a record's usual batch): kept.
        kept, kept_at, kept_bytes, duplicates, blank = entries, (0,), sizes[0], 0, 0
    else:
        kept, kept_at, kept_bytes, duplicates, blank = _kept(history, turn_id, old, entries, sizes)
    history._kept_at = None if len(kept) == len(entries) else kept_at
    if not kept:
        history._duplicates += duplicates
        history._blank_dropped += blank
        return 0
    messages = [kept[0].message] if len(kept) == 1 else [e.message for e in kept]
    checked: _StepState | None = None  # the step state the check fed the outputs to
    if steps_may_conflict(messages, old.last_message()):
        # A turn that does not end in a step of its own is read whole: while
        # nothing in it starts or ends a call group, its results (and the
        # outputs') may answer calls an earlier turn left open or a call
        # recorded late to one (check_steps reads the group's bounds; a step
        # tail starts a group, so then nothing awaits), and one answering a
        # call id a second time is refused.
        step = kept_steps(history, old) if position == newest else None
        tail: Sequence[Message] = ()
        if step is not None and step.start >= 0:
            # The state after the turn's last step (kept, or walked once now): what
            # feeding its tail gives. The check feeds it the outputs: out of the
            # history until the record is made (a refused one leaves none kept).
            history._steps = None
            checked = step
        else:
            step = None
            tail = _step_tail(old) or [e.message for e in old.entries(True)]
        _check_steps_named(
            messages,
            "Turn {} output",
            turn_id,
            before=tail,
            indices=kept_at,
            late=position > 0,
            unpaired=keep_unpaired,
            step=step,
        )
    current = history._turns
    if position + 1 < current.size:
        later = current[position + 1].entries(True)
        if later:
            _check_turn_start(
                old.with_outputs(tuple(kept), 0),
                later[0].message,
                f"Turn {excerpt(current[position + 1].turn_id)} input[0], after turn "
                f"{excerpt(turn_id)}'s late output,",
            )
    late = position != current.size - 1
    # Nothing dropped (the usual case): the entries tuple is the outputs added.
    new = old.with_outputs(entries if len(kept) == len(entries) else tuple(kept), kept_bytes)
    turns = current.replaced(position, new)
    if late:
        stranded, call_ids = _strands(history._turns, turns, position)
        if stranded >= 0:
            raise StrandedResultsError(
                f"A late output of turn {excerpt(turn_id)} would leave results that turn "
                f"{excerpt(history._turns[stranded].turn_id)} holds answering no tool call "
                "(it ends their call group, or answers their call first), so they would "
                "leave every later model input; nothing was recorded.",
                turn_id=turn_id,
                stranded_turn_id=history._turns[stranded].turn_id,
                call_ids=call_ids,
            )
        linked = _relinked(history, turns, position)
        _check_ties(history, turns, linked, position, f"Turn {excerpt(turn_id)} output", turn_id)
    history._duplicates += duplicates
    history._blank_dropped += blank
    if history._aside is not None:
        _settle(history)
    if late:
        history._generation += 1
        history._linked.clear()
        history._linked.update(linked)
    for entry in kept:
        if entry.message.id is not None:
            history._message_ids[entry.message.id] = (old.serial, entry.message)
    # After the turn's outputs so far; the door's plan covers the whole batch only.
    if planned is not None and len(kept) != len(entries):
        unplanned(kept)
        planned = None
    assign_outputs(history, position, kept, planned)
    if late and position + 1 < turns.size:
        turns = repair_results(turns, position + 1)  # later results may answer a new call
    history._turns = turns
    history._items += len(kept)
    history._bytes += new.bytes - old.bytes
    history._tokens += new.tokens - old.tokens
    history._view = None
    advance_steps(history, old, new, kept, checked)  # after the ids are assigned: it reads them
    return len(kept)


def _kept(
    history: _ChangeState,
    turn_id: str,
    old: _Turn,
    entries: tuple[_Entry, ...],
    sizes: tuple[int, ...],
) -> tuple[list[_Entry], list[int], int, int, int]:
    """What a record keeps of ``entries`` (the outputs of turn ``old``): the entries, their
    indexes and bytes; and how many duplicates and blank messages it drops (see
    :meth:`TurnHistory.record`).

    Raises:
        DuplicateIdError: a message has the id of a held message with other
            content (or of another turn's message), or the batch repeats one.
    """
    kept: list[_Entry] = []
    kept_at: list[int] = []
    kept_bytes = 0
    added: dict[str, Message] = {}
    duplicates = blank = 0
    for i, entry in enumerate(entries):
        message = entry.message
        if message.id is not None:
            held = history._message_ids.get(message.id)
            same = (
                added.get(message.id)
                if held is None
                else (held[1] if held[0] == old.serial else None)
            )
            if same is not None and same == message:
                duplicates += 1
                continue
            if held is not None or message.id in added:
                raise DuplicateIdError(
                    f"Turn {excerpt(turn_id)} output[{i}] has id {excerpt(message.id)}, "
                    f"which a "
                    "message of this context already has with other content (or in "
                    "another turn); nothing was recorded."
                )
            added[message.id] = message
        if _blank(message):
            blank += 1
            continue
        kept.append(entry)
        kept_at.append(i)
        kept_bytes += sizes[i]
    return kept, kept_at, kept_bytes, duplicates, blank


def _keep_state(
    history: _ChangeState, turn_id: str, messages: Sequence[Message], *, serial: int | None = None
) -> bool:
    """The work of :meth:`TurnHistory.keep_state` (documented there)."""
    reject_instructions(messages, "state", f"Turn {excerpt(turn_id)} state")
    cap = history._limits.max_item_bytes
    counter = history._shared.counter
    entries: list[_Entry] = []
    state_bytes = 0
    for i, message in enumerate(messages):
        label = f"turn {excerpt(turn_id)} state[{i}]"
        message, size = admit_message(message, where=label)
        if size > cap:
            raise ItemTooLargeError(
                f"{label} is {size} bytes, over the per-item cap of {cap} bytes.",
                size=size,
                limit=cap,
            )
        if message.id is not None:
            raise InvalidMessageError(
                f"{label} has id {excerpt(message.id)}; kept state messages carry no id.",
                field="id",
            )
        entries.append(_Entry(message, count_tokens(counter, (message,))))
        state_bytes += size
    position = len(history._turns) - 1
    while position >= 0 and history._turns[position].turn_id != turn_id:
        position -= 1
    if position < 0 or (serial is not None and history._turns[position].serial != serial):
        return False
    old = history._turns[position]
    if len(old.state) == len(entries) and all(
        a.message == b.message for a, b in zip(old.state, entries, strict=True)
    ):
        return True
    new = old.with_state(tuple(entries), state_bytes)
    turns = history._turns.replaced(position, new)
    late = position != len(history._turns) - 1
    if late:
        if _strands(history._turns, turns, position)[0] >= 0:
            return False
        linked = _relinked(history, turns, position)
        try:
            _check_ties(history, turns, linked, position, f"Turn {excerpt(turn_id)} state", turn_id)
        except PairedTurnsTooLargeError:
            return False
        _settle(history)  # a turn before the newest changed: the evicted turns stay gone
        history._generation += 1
        history._linked.clear()
        history._linked.update(linked)
    aside = history._aside  # (None when late: settled above)
    # After the turn's input; the turns held aside still send their ids (see assign_state).
    assign_state(history, position, old.state, entries, aside.turns if aside is not None else ())
    if late:
        turns = repair_results(turns, position)  # its outputs, later results: answers may move
    history._turns = turns
    history._items += new.items - old.items
    history._bytes += new.bytes - old.bytes
    history._tokens += new.tokens - old.tokens
    history._view = None
    return True

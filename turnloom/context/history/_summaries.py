"""Summary compaction and pruning of one history (see :mod:`turnloom.context.summaries`).

Operations on one :class:`~turnloom.context.history.TurnHistory`, called on
the thread that owns it (the event loop), re-exported by the package:

* :func:`summary_range`: which turns a summarization is given (a plan, no change);
* :func:`apply_summary`: the turns still held among them replaced by a summary
  turn, atomically, everything checked before anything changes;
* :func:`prune_turns`: the tool output of turns older than the newest ``keep``
  replaced by a note (:func:`~turnloom.context.summaries.prune_messages`).

Each change to a turn before the newest bumps the history's generation, so the
next render builds its cached run anew (in a worker thread) and equals a cold
render of the history as it is now.
"""

from __future__ import annotations

__all__ = (
    "SummaryApplied",
    "apply_summary",
    "changeable",
    "next_summary_id",
    "prune_turns",
    "range_snapshot",
    "summary_range",
)

from collections.abc import Collection, Sequence
from typing import Protocol

import msgspec

from turnloom.context.history._batches import _entries
from turnloom.context.history._cells import _Entry, _Turn
from turnloom.context.history._changes import _ChangeState
from turnloom.context.history._evictions import _forget
from turnloom.context.history._sent import assign_summary, carry_sent, release, unplanned
from turnloom.context.history._turns import _Turns
from turnloom.context.message import Message, admit_message, check_id
from turnloom.context.summaries import (
    SUMMARY_TURN_PREFIX,
    check_summary,
    is_summary_turn,
    prune_each,
)
from turnloom.context.tokens import TokenCounter, count_tokens
from turnloom.errors import (
    DuplicateIdError,
    InvalidArgumentError,
    InvalidMessageError,
    StateError,
    TurnTooLargeError,
    UnknownTurnError,
    excerpt,
)


class _SummaryState(_ChangeState, Protocol):
    """The state of a :class:`TurnHistory` this file reads and changes."""

    _front: int
    _generation: int
    _ids: dict[str, None]
    _message_ids: dict[str, tuple[int, Message]]
    _serial: int


def _held_aside(history: _SummaryState) -> bool:
    aside = history._aside
    return aside is not None and bool(aside.turns)


def _has(history: _SummaryState, turn_id: str) -> bool:
    return turn_id in history._ids


def _remembered(history: _SummaryState, turn_id: str) -> bool:
    return turn_id in history._evicted_ids


class SummaryApplied(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`apply_summary` did.

    Attributes:
        replaced: ids of the held turns the summary turn replaced, oldest first.
        gone: ids given that were no longer held (evicted meanwhile: the
            summary covers them, their eviction was counted).
        tokens: tokens the replaced turns held (the history's counter).
        summary_tokens: tokens the summary turn holds.
    """

    replaced: tuple[str, ...]
    gone: tuple[str, ...]
    tokens: int
    summary_tokens: int


def changeable(history: _SummaryState) -> bool:
    """Whether a summary or a pruning may change ``history`` now.

    Not while turns are held aside for a retraction of the newest turn, nor
    while the newest turn has no output yet: a false start's retraction
    must find the history as its commit found it (``TurnHistory.retract``).
    O(1).
    """
    turns = history._turns
    return bool(turns) and bool(turns[-1].output_count) and not _held_aside(history)


def next_summary_id(history: _SummaryState) -> str:
    """A summary turn id that ``history`` neither holds nor remembers. O(1) in practice."""
    serial = history._serial + 1
    while True:
        summary_id = f"{SUMMARY_TURN_PREFIX}{serial}"
        if not _has(history, summary_id) and not _remembered(history, summary_id):
            return summary_id
        serial += 1


def summary_range(
    history: _SummaryState, keep: int, keep_tokens: int | None = None
) -> tuple[str, ...]:
    """Ids of the oldest turns to summarize so that about ``keep`` turns stay after them.

    With ``keep_tokens``, the cut moves later while the turns after it hold
    more than that many tokens (the newest turn always stays).

    The range starts at the oldest held turn (a summary turn, when one is
    held) and ends where eviction could cut: a turn tied to the one before it
    (its input answers that turn's calls, see ``TurnHistory``) goes with it.
    The cut moves later past tied turns (fewer than ``keep`` stay), or, when
    that would reach the newest turn, earlier. Never the newest turn. Empty
    when there is nothing but a summary turn to summarize, or while turns are
    held aside for a retraction of the newest (``restorable_ids``). O(turns).

    Raises:
        InvalidArgumentError: ``keep`` is not a positive int (``field``
            ``"keep"``), or ``keep_tokens`` is neither None nor a positive int
            (``"keep_tokens"``), as :class:`CompactionPolicy` requires of its
            ``keep_turns`` and ``keep_tokens``.
    """
    for name, value in (("keep", keep), ("keep_tokens", keep_tokens)):
        if value is None and name == "keep_tokens":
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidArgumentError(
                f"summary_range's {name} must be a positive int, not {excerpt(value)}.",
                field=name,
            )
    turns = history._turns
    linked = history._linked
    if _held_aside(history) or len(turns) <= keep:
        return ()
    cut = len(turns) - keep
    if keep_tokens is not None:
        kept = sum(t.tokens for t in turns[cut:])
        while cut < len(turns) - 1 and kept > keep_tokens:
            kept -= turns[cut].tokens
            cut += 1
    forward = cut
    while forward < len(turns) and turns[forward].serial in linked:
        forward += 1
    if forward < len(turns):
        cut = forward
    else:
        while cut > 0 and turns[cut].serial in linked:
            cut -= 1
    chosen = turns[:cut]
    if all(is_summary_turn(t.turn_id) for t in chosen):
        return ()
    return tuple(t.turn_id for t in chosen)


def range_snapshot(history: _SummaryState, turn_ids: Sequence[str]) -> tuple[object, ...]:
    """What the held turns of ``turn_ids`` are now (opaque; compare with ``is`` per item).

    A turn changed since (a late output recorded, tool output pruned) is
    another object: :func:`apply_summary` with ``snapshot`` refuses a summary
    written from turns that changed since, so nothing recorded meanwhile is
    lost unsaid. O(turns of the range).
    """
    wanted = set(turn_ids)
    return tuple(t for t in history._turns if t.turn_id in wanted)


def apply_summary(
    history: _SummaryState,
    turn_ids: Sequence[str],
    summary_id: str,
    summary: Sequence[Message],
    max_messages: int = 8,
    snapshot: tuple[object, ...] | None = None,
) -> SummaryApplied:
    """Replace the turns still held among ``turn_ids`` by one summary turn, first in the history.

    ``turn_ids`` are what a summarization was given (:func:`summary_range`,
    oldest first). Since then some may have been evicted (a hard limit does
    not wait for a slow summarizer): the summary covers them too, and the
    held ones must still be the oldest held turns, in order, ending where
    eviction could cut. The summary turn, ``summary_id``, holds the summary's
    ``user`` messages as its input and its ``assistant`` messages as outputs
    (:func:`~turnloom.context.summaries.check_summary`); it is placed before
    every retained turn, after the pinned instructions. The replaced turns'
    ids are remembered like evicted ones (a late output for them is dropped
    and counted), but they are not counted as evicted. Everything is checked
    before anything changes. Does not evict: a summary larger than what it
    replaced can leave the history over a limit; the caller evicts next, as
    after a commit.

    Raises:
        InvalidMessageError: ``summary_id`` is malformed or does not start
            with :data:`~turnloom.context.summaries.SUMMARY_TURN_PREFIX`; a
            summary that is not one (see ``check_summary``); an id it holds is
            a held message's.
        InvalidTextError, ItemTooLargeError, TurnTooLargeError: a summary
            message that is not valid text, over the per-item cap; the
            summary over ``max_items`` or ``max_bytes``.
        DuplicateIdError: ``summary_id`` is held or remembered.
        UnknownTurnError: an id of ``turn_ids`` was never held (or is no
            longer remembered).
        StateError: turns are held aside for a retraction of the newest
            turn; the held turns of ``turn_ids`` are not the oldest held
            turns in order; they include the newest turn; the turn after
            them is tied to them (the summary would split a call from its
            result); or, with ``snapshot`` (:func:`range_snapshot` when the
            summarizer was given them), one of them changed since.
        HostCallbackError: the token counter failed.
    """
    check_id(summary_id, "summary turn id")
    if not summary_id.startswith(SUMMARY_TURN_PREFIX):
        raise InvalidMessageError(
            f"A summary turn id starts with {SUMMARY_TURN_PREFIX!r}, not {excerpt(summary_id)}.",
            field="summary_id",
        )
    if _has(history, summary_id) or _remembered(history, summary_id):
        raise DuplicateIdError(f"Turn {excerpt(summary_id)} was already held by this context.")
    given, answer = check_summary(summary, max_messages)
    if _held_aside(history):
        raise StateError(
            "Turns are held aside for a retraction of the newest turn; a summary waits until "
            "they are let go or restored."
        )
    turns = history._turns
    held = 0
    gone: list[str] = []
    for turn_id in turn_ids:
        check_id(turn_id, "turn id")
        if held < len(turns) and turns[held].turn_id == turn_id:
            held += 1
        elif _has(history, turn_id):
            raise StateError(
                f"Turn {excerpt(turn_id)} is held, but not next after the turns before it in the "
                "summarized range; a summary replaces the oldest turns, in order."
            )
        elif _remembered(history, turn_id):
            gone.append(turn_id)  # evicted meanwhile (after a summary turn kept in front)
        else:
            raise UnknownTurnError(
                f"Turn {excerpt(turn_id)} of the summarized range is not known to this context."
            )
    if held >= len(turns):
        raise StateError("A summary never replaces the newest turn.")
    if snapshot is not None:
        before = {id(t) for t in snapshot}
        for turn in turns[:held]:
            if id(turn) not in before:
                raise StateError(
                    f"Turn {excerpt(turn.turn_id)} changed after the summarizer was given it "
                    "(an output recorded late); the summary would lose what it does not hold."
                )
    if held and turns[held].serial in history._linked:
        raise StateError(
            f"Turn {excerpt(turns[held].turn_id)} answers calls of the summarized turns; a "
            "summary never splits a call from its result."
        )
    messages = (*given, *answer)
    entries, sizes, planned, _ = _entries(history, messages, summary_id, "summary")
    if planned is not None:
        unplanned(entries)  # planned at the door for a commit; a summary decides its own
    size = sum(sizes)
    limits = history._limits
    if size > limits.max_bytes:
        raise TurnTooLargeError(
            f"The summary is {size} bytes, over the history's limit of {limits.max_bytes} bytes.",
            unit="bytes",
            size=size,
            limit=limits.max_bytes,
        )
    seen: set[str] = set()
    replaced_ids = {m for t in turns[:held] for m in _message_ids(t)}
    for i, entry in enumerate(entries):
        message_id = entry.message.id
        if message_id is None:
            continue
        if message_id in seen or (
            message_id in history._message_ids and message_id not in replaced_ids
        ):
            raise InvalidMessageError(
                f"summary[{i}] has id {excerpt(message_id)}, which a message of this context "
                "already has.",
                field=f"summary[{i}].id",
            )
        seen.add(message_id)
    # Checked: change state.
    replaced = turns[:held]
    release(history, replaced)
    assign_summary(history, entries)
    for turn in replaced:
        _forget(history, turn)
        history._items -= turn.items
        history._bytes -= turn.bytes
        history._tokens -= turn.tokens
    history._serial += 1
    serial = history._serial
    tokens = sum(e.tokens for e in entries)
    turn = _Turn.of(
        summary_id,
        entries[: len(given)],
        entries[len(given) :],
        size,
        tokens,
        serial,
    )
    for entry in entries:
        if entry.message.id is not None:
            history._message_ids[entry.message.id] = (serial, entry.message)
    history._turns = turns.dropped(held).prepended(turn)
    history._ids[summary_id] = None
    history._items += turn.items
    history._bytes += size
    history._tokens += tokens
    history._front += held
    history._generation += 1
    history._view = None
    return SummaryApplied(
        replaced=tuple(t.turn_id for t in replaced),
        gone=tuple(gone),
        tokens=sum(t.tokens for t in replaced),
        summary_tokens=tokens,
    )


def _message_ids(turn: _Turn) -> list[str]:
    return [e.message.id for e in turn.entries(True) if e.message.id is not None]


def prune_turns(
    history: _SummaryState,
    keep: int,
    note: str,
    checked: dict[int, object] | None = None,
    only: Collection[str] | None = None,
) -> tuple[str, ...]:
    """Prune the tool output of the held turns before the newest ``keep``; their ids.

    Each such turn's input and outputs go through
    :func:`~turnloom.context.summaries.prune_messages` (its kept state, the
    runtime-state pair, is left as it is); a turn already pruned, or without
    tool output or reasoning, is left as it is (not listed). The turns keep
    their ids, serials and ties; their byte and token counts change (they grow
    when the note is longer than what it replaces: the caller evicts then). O(the
    messages of the turns looked at); the next render rebuilds the cached
    run when a turn changed. With ``checked`` (the caller's, empty at first),
    a turn found pruned before (the same turn snapshot) is not looked at
    again, so a pass costs O(turns) plus the messages of turns that changed;
    ``checked`` then holds the turns of this pass (keeping them alive, so an
    id is never a reused one). With ``only``, the turns with other ids are
    not looked at (a replay of a logged pruning prunes what it lists).

    Raises:
        InputError: ``keep`` is not a positive int.
        StateError: turns are held aside for a retraction of the newest turn
            (a false start's retraction must find the history as its commit
            found it); nothing changed.
        HostCallbackError: the token counter failed; nothing changed.
    """
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise InvalidMessageError(f"keep must be a positive int, not {excerpt(keep)}.")
    if _held_aside(history):
        raise StateError(
            "Turns are held aside for a retraction of the newest turn; a pruning waits until "
            "they are let go or restored."
        )
    turns = list(history._turns)
    counter = history._shared.counter
    changed: list[tuple[int, _Turn]] = []
    for position in range(len(turns) - keep):
        turn = turns[position]
        if is_summary_turn(turn.turn_id) or (checked is not None and checked.get(id(turn)) is turn):
            continue
        if only is not None and turn.turn_id not in only:
            continue
        pruned_input = prune_each(turn.messages(False), note)
        pruned_outputs = prune_each([e.message for e in turn.outputs], note)
        if pruned_input is None and pruned_outputs is None:
            continue
        new_input, input_bytes = _pruned_entries(turn.input, pruned_input, counter)
        new_outputs, output_bytes = _pruned_entries(turn.outputs, pruned_outputs, counter)
        size = turn.state_bytes + input_bytes + output_bytes
        tokens = sum(e.tokens for e in new_input + turn.state + new_outputs)
        changed.append(
            (
                position,
                _Turn.of(
                    turn.turn_id,
                    new_input,
                    new_outputs,
                    size,
                    tokens,
                    turn.serial,
                    turn.state,
                    turn.state_bytes,
                ),
            )
        )
    if checked is not None:
        checked.clear()
        checked.update((id(t), t) for t in turns[: max(0, len(turns) - keep)])
        checked.update((id(t), t) for _, t in changed)
    if not changed:
        return ()
    # Checked and counted: change state.
    for position, new in changed:
        old = turns[position]
        carry_sent(old.input, new.input)  # pruned messages are sent with the same ids
        carry_sent(old.outputs, new.outputs)
        for message_id in _message_ids(old):
            history._message_ids.pop(message_id, None)
        for entry in new.entries(True):
            if entry.message.id is not None:
                history._message_ids[entry.message.id] = (new.serial, entry.message)
        history._items += new.items - old.items
        history._bytes += new.bytes - old.bytes
        history._tokens += new.tokens - old.tokens
        turns[position] = new
    history._turns = _Turns.of(turns)
    history._generation += 1
    history._view = None
    return tuple(turns[p].turn_id for p, _ in changed)


def _pruned_entries(
    entries: tuple[_Entry, ...], pruned: tuple[Message | None, ...] | None, counter: TokenCounter
) -> tuple[tuple[_Entry, ...], int]:
    """The entries after pruning, and the bytes of their messages' encodings.

    ``pruned`` is ``prune_each`` of the entries' messages, matched by
    position, not by message: one message object may be held twice (each
    entry with its own sent ids). An entry whose message pruning kept stays
    as it is; a pruned message gets a new entry holding the message
    :func:`~turnloom.context.admit_message` returns for it (its tokens
    counted), never one the check set anything on; a dropped one (None)
    leaves.
    """
    if pruned is None:
        return entries, sum([admit_message(entry.message)[1] for entry in entries])
    out: list[_Entry] = []
    size = 0
    for entry, message in zip(entries, pruned, strict=True):
        if message is None:
            continue
        held, n = admit_message(message)
        size += n
        if message is entry.message:
            out.append(entry)
        else:
            out.append(_Entry(held, count_tokens(counter, (held,))))
    return tuple(out), size

"""What an eviction drops, holds aside for a retraction, and restores."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol, cast

import msgspec

from turnloom.context.history._cells import _Entry, _Turn
from turnloom.context.history._run import _Shared
from turnloom.context.history._sent import _SentIds, hold, release
from turnloom.context.history._ties import _retie
from turnloom.context.history._turns import _Turns
from turnloom.context.history.limits import HistoryLimits
from turnloom.context.history.view import HistoryView
from turnloom.context.message import (
    Message,
    check_id,
)
from turnloom.context.summaries import SUMMARY_TURN_PREFIX
from turnloom.errors import (
    DuplicateIdError,
    StateError,
    UnknownTurnError,
    excerpt,
)


class _Aside(msgspec.Struct, gc=False, frozen=True):
    """What the evictions since the newest commit dropped, for its retraction to undo.

    ``turns``: the evicted turns, oldest first. ``linked``: the serials of
    those the tie set held. ``popped``: the remembered ids of gone turns that
    remembering theirs pushed out of the bounded memory, oldest first (each
    counted in ``_forgotten``). ``newest``: the newest turn as the latest of
    those evictions found it (its kept state may change since: a smaller one
    would not evict them all again). Ints, strs and untracked turns only: in
    no cycle.
    """

    turns: tuple[_Turn, ...] = ()
    linked: tuple[int, ...] = ()
    popped: tuple[str, ...] = ()
    newest: _Turn | None = None

    def remembered_before(self, remembered: Sequence[str]) -> list[str]:
        """The remembered ids ``remembered`` were before these evictions, oldest first.

        Remembering ids appends them and pops the oldest, so what was popped
        is a prefix of the ids remembered before followed by the evicted
        ones: those it holds of the former go back in front, the evicted
        ones leave.
        """
        gone = {t.turn_id for t in self.turns}
        return [i for i in self.popped if i not in gone] + [i for i in remembered if i not in gone]


_NOTHING_ASIDE = _Aside()


def _identified(turn: _Turn) -> list[Message]:
    """The messages of ``turn`` with an id (its input and outputs: kept state has none)."""
    return [m for m in turn.recorded() if m.id is not None]


class _EvictionState(Protocol):
    """The state of a :class:`TurnHistory` this file reads and changes."""

    _aside: _Aside | None
    _bytes: int
    _evicted: int
    _evicted_bytes: int
    _evicted_ids: OrderedDict[str, None]
    _evicted_items: int
    _evicted_tokens: int
    _forgotten: int
    _front: int
    _generation: int
    _ids: dict[str, None]
    _items: int
    _limits: HistoryLimits
    _linked: set[int]
    _message_ids: dict[str, tuple[int, Message]]
    _pinned: tuple[_Entry, ...]
    _remember: int
    _retracted: int
    _sent: _SentIds
    _shared: _Shared
    _tokens: int
    _turns: _Turns
    _view: HistoryView | None

    @property
    def evicted_ids(self) -> tuple[str, ...]: ...
    def has_turn(self, turn_id: str) -> bool: ...
    def view(self) -> HistoryView: ...


def _evict(history: _EvictionState) -> tuple[str, ...]:
    """The work of :meth:`TurnHistory.evict` (documented there)."""
    limits = history._limits
    turns, linked = history._turns, history._linked
    # A summary turn (summary compaction, first when held) stands for turns that
    # already left: it goes last, after every other turn eviction may drop.
    held = turns.size  # (not len(): a Python __len__)
    first = 1 if held > 1 and turns[0].turn_id.startswith(SUMMARY_TURN_PREFIX) else 0
    count = first
    items = total = tokens = 0

    def over(bounds: tuple[int, int, int, int | None]) -> bool:
        max_turns, max_items, max_bytes, max_tokens = bounds
        return (
            held - (count - first) > max_turns
            or history._items - items > max_items
            or history._bytes - total > max_bytes
            or (max_tokens is not None and history._tokens - tokens > max_tokens)
        )

    hard = (limits.max_turns, limits.max_items, limits.max_bytes, limits.max_tokens)
    if not over(hard):
        return ()
    # A hard limit is crossed: evict down to every limit's low-water mark
    # (the limits themselves at low_water 1.0), so the input's prefix breaks
    # here and not again for many turns. Replay and the checkpoint of turns
    # held aside rely on this being a function of the held turns alone.
    marks = limits.low_water_marks()
    while over(marks):
        # The oldest turn goes with the turns tied to it (their input
        # answers its calls), or not at all when they reach the newest.
        end = count + 1
        while end < held and turns[end].serial in linked:
            end += 1
        if end >= held:
            break
        for turn in turns[count:end]:
            items += turn.items
            total += turn.bytes
            tokens += turn.tokens
        count = end
    gone = turns[first:count]
    kept = turns.dropped(count)
    summary_gone = False
    if first and over(hard):
        # Only the summary is left to drop: a hard limit stays hard.
        summary = turns[0]
        items += summary.items
        total += summary.bytes
        tokens += summary.tokens
        gone = (summary, *gone)
        first = 0
        summary_gone = True
    if not gone:
        return ()
    release(history, gone)  # their calls' sent ids are free; the kept ones' stay as they are
    history._turns = kept.prepended(turns[0]) if first else kept
    history._items -= items
    history._bytes -= total
    history._tokens -= tokens
    if first:
        history._generation += 1  # turns left behind the summary: the run is rebuilt
    else:
        history._front += len(gone)
    aside = history._aside
    if aside is None:
        _count_evicted(history, gone)
        for turn in gone:
            _forget(history, turn)
    else:
        # Since the newest commit nothing else changed: held aside for its
        # retraction, counted as evicted once they cannot be restored.
        tied = tuple([t.serial for t in gone if t.serial in linked]) if linked else ()
        popped: list[str] = []
        if aside is _NOTHING_ASIDE:  # the first eviction since the commit, usually the only one
            for turn in gone:
                _forget(history, turn, popped)
            history._aside = _Aside(gone, tied, tuple(popped), turns[-1])
        elif summary_gone:
            # Held, and remembered, in their history order: a summary this
            # eviction dropped stood before every turn an earlier one dropped.
            # As one eviction of them all (a checkpoint's replay) remembers
            # them: the earlier evictions' remembering is undone first.
            held_aside = (gone[0], *aside.turns, *gone[1:])
            remembered = aside.remembered_before(tuple(history._evicted_ids))
            history._evicted_ids.clear()
            history._evicted_ids.update(dict.fromkeys(remembered))
            history._forgotten -= len(aside.popped)
            for turn in held_aside:
                _forget(history, turn, popped)
            history._aside = _Aside(held_aside, aside.linked + tied, tuple(popped), turns[-1])
        else:
            for turn in gone:
                _forget(history, turn, popped)
            history._aside = _Aside(
                (*aside.turns, *gone),
                aside.linked + tied,
                aside.popped + tuple(popped),
                turns[-1],
            )
    history._view = None
    return tuple([t.turn_id for t in gone])  # (a list, not a generator: one call)


def _head(turns: _Turns) -> tuple[_Turn, ...]:
    """The summary turn eviction kept in front of the turns it dropped, if any."""
    if len(turns) > 1 and turns[0].turn_id.startswith(SUMMARY_TURN_PREFIX):
        return turns[:1]
    return ()


def _count_evicted(history: _EvictionState, turns: tuple[_Turn, ...]) -> None:
    """Count ``turns`` as evicted for good (the statistics' ``evicted_*``)."""
    history._evicted += len(turns)
    for turn in turns:
        history._evicted_items += turn.items
        history._evicted_bytes += turn.bytes
        history._evicted_tokens += turn.tokens


def _settle(history: _EvictionState) -> None:
    """The turns held aside can no longer be restored: count them evicted, let them go."""
    aside = history._aside
    history._aside = None
    if aside is not None and aside.turns:
        _count_evicted(history, aside.turns)


def _restore(history: _EvictionState, aside: _Aside) -> None:
    """Undo the evictions held in ``aside``: each one's turns, counts, ids and ties back.

    The inverse of the evictions (:meth:`TurnHistory.evict`, :meth:`TurnHistory._forget`): the
    turns go back in front, held; their ids leave the remembered ids and
    the ids they pushed out come back; their ties are restored. Turns
    before the newest changed, so views render anew (the generation).
    """
    turns = aside.turns
    head = _head(history._turns)
    history._turns = _Turns.of((*head, *turns, *history._turns[len(head) :]))
    hold(history, turns)  # sent with the ids they had (the retracted turn's are released)
    for turn in turns:
        history._items += turn.items
        history._bytes += turn.bytes
        history._tokens += turn.tokens
        history._ids[turn.turn_id] = None
        for message in _identified(turn):
            history._message_ids[cast(str, message.id)] = (turn.serial, message)
    history._linked.update(aside.linked)
    remembered = aside.remembered_before(tuple(history._evicted_ids))
    history._evicted_ids.clear()
    history._evicted_ids.update(dict.fromkeys(remembered))
    history._forgotten -= len(aside.popped)
    history._generation += 1
    history._view = None


def _forget(history: _EvictionState, turn: _Turn, popped: list[str] | None = None) -> None:
    """Drop a turn's ids; remember its id as gone (a bounded number of them).

    With ``popped``, the remembered ids this pushes out are appended to it.
    """
    history._ids.pop(turn.turn_id, None)
    history._linked.discard(turn.serial)
    message_ids = history._message_ids
    if message_ids:
        for message in _identified(turn):
            message_ids.pop(cast(str, message.id), None)
    history._evicted_ids[turn.turn_id] = None
    while len(history._evicted_ids) > history._remember:
        turn_id, _ = history._evicted_ids.popitem(last=False)
        history._forgotten += 1
        if popped is not None:
            popped.append(turn_id)


def _before_evictions(history: _EvictionState) -> tuple[HistoryView, tuple[str, ...]]:
    """The work of :meth:`TurnHistory.before_evictions` (documented there)."""
    aside = history._aside
    if aside is None or not aside.turns:
        return history.view(), history.evicted_ids
    head = _head(history._turns)
    turns = _Turns.of(
        (*head, *aside.turns, *history._turns[len(head) : -1], cast(_Turn, aside.newest))
    )
    held = len(history._pinned) + sum(t.items for t in turns)
    view = HistoryView(history._pinned, turns, history._front, -1, history._shared, held)
    return view, tuple(aside.remembered_before(tuple(history._evicted_ids)))


def _retract(history: _EvictionState, turn_id: str) -> None:
    """The work of :meth:`TurnHistory.retract` (documented there)."""
    check_id(turn_id, "turn id")
    if not history.has_turn(turn_id):
        raise UnknownTurnError(f"Turn {excerpt(turn_id)} is not held by this context.")
    turn = history._turns[-1]
    if turn.turn_id != turn_id:
        raise StateError(
            f"Turn {excerpt(turn_id)} is not the newest turn ({excerpt(turn.turn_id)} "
            f"is); only the "
            "newest turn can be retracted."
        )
    if turn.output_count:
        raise StateError(
            f"Turn {excerpt(turn_id)} has {turn.output_count} recorded output(s); only a turn "
            "that produced no answer can be retracted."
        )
    aside, history._aside = history._aside, None
    release(history, (turn,))  # first: a restored turn may send an id it took since
    if aside is not None and aside.turns:
        _restore(history, aside)
    history._turns = history._turns.popped()
    history._items -= turn.items
    history._bytes -= turn.bytes
    history._tokens -= turn.tokens
    history._retracted += 1
    tied = turn.serial in history._linked
    _forget(history, turn)
    if tied:
        # Its input's tie may be the only reason turns before it were tied.
        _retie(history, len(history._turns) - 1)
    history._view = None


def _remember_evicted(history: _EvictionState, turn_ids: Sequence[str]) -> None:
    """The work of :meth:`TurnHistory.remember_evicted` (documented there)."""
    for turn_id in turn_ids:
        check_id(turn_id, "turn id")
        if history.has_turn(turn_id):
            raise DuplicateIdError(
                f"Turn {excerpt(turn_id)} is held by this history; it cannot be "
                f"remembered as evicted."
            )
    _settle(history)
    for turn_id in turn_ids:
        history._evicted_ids[turn_id] = None
    while len(history._evicted_ids) > history._remember:
        history._evicted_ids.popitem(last=False)

"""The pairing state after a turn's last model step, kept from one record to the next.

A record of tool results reads the state pairing is in after the turn's
last step twice: the door decides the results' sent ids against it
(``_sent.door_ids``, through ``_sent._context``), and the record checks
them against it (``check_steps`` after ``_ties._step_tail``). Both walk
the step from its first assistant message. A history keeps that state for
one turn (:class:`_StepState`, keyed by the very ``_Turn`` object, which a
change of the turn replaces): computed cold from the step when missing,
then advanced by each record to that turn with only what it added, so a
step of many results is not walked again per result.

The state is a function of the turn's entries alone (their messages and
sent ids: the walk starts at the step's first message, whatever came
before), so it equals a cold computation from the same turn; a failed
change replaces no turn and leaves it as it was. O(the messages a record
adds), and O(the step) once per turn.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import msgspec

from turnloom.context._untrack import untrack_atoms, untrack_container
from turnloom.context.history._cells import _Entry, _Turn, id_parts
from turnloom.context.history._ties import last_step_start
from turnloom.context.message import Role, ToolCallPart
from turnloom.context.pairing import CallTracker

_ASSISTANT = Role.assistant
_TOOL = Role.tool
_USER = Role.user


# The closed ids of a state none of whose messages closed a call (every state, in
# practice: a step's assistant messages closing calls repeat an open call id, which
# the door refuses). Never changed: a state gets its own set before adding to it.
_NO_CLOSED: set[str] = set()
untrack_container(_NO_CLOSED)


def feed_entries(
    tracker: CallTracker, sent: dict[str, str], entries: Iterable[_Entry]
) -> list[str] | None:
    """Feed ``entries``' messages (as given) to ``tracker``, noting each renamed call's sent id.

    ``sent`` maps a renamed call's own id to its sent id (a call sent as it
    is removes its id). Returns the ids of the calls an assistant message
    among them ended (None when none did: every step in practice).
    """
    ended_ids: list[str] | None = None
    for entry in entries:
        message = entry.message
        role = message.role
        if entry.sent is not None:
            for id_part, sent_id in zip(id_parts(message), entry.sent_ids(), strict=True):
                if type(id_part) is ToolCallPart:
                    sent[id_part.call_id] = sent_id
        elif sent and role is _ASSISTANT:
            for part in message.parts:
                if type(part) is ToolCallPart:
                    sent.pop(part.call_id, None)  # a newer call with the id, sent as it is
        ended = tracker.feed(message).closed
        if ended and role is _ASSISTANT:
            if ended_ids is None:
                ended_ids = []
            ended_ids.extend(c.call_id for c in ended)
    return ended_ids


class _StepState(msgspec.Struct, gc=False):
    """The pairing state after ``turn``'s entries, from the start of its last step.

    ``count``: the turn's entries it covers (all of them). ``start``: where
    the last step starts (:func:`~turnloom.context.history._ties.last_step_start`;
    -1 when the turn ends without one: then nothing else is kept).
    ``tracker``: a :class:`~turnloom.context.CallTracker` fed the step;
    ``sent``: the sent id of the newest call fed with each own id, for
    renamed calls only (as ``_sent._context`` keeps them); ``closed``: ids of
    the calls an assistant message of the step ended (as ``check_steps``
    collects them while it feeds the step; :data:`_NO_CLOSED` while none).
    Readers take copies (:meth:`context`), or read it without changing it,
    or take it out of the history while they feed it (see ``_changes._record``).

    Out of the cyclic collector, as the history's other bookkeeping (its
    own ``gc=False``; the tracker and the closed set untracked when made):
    it holds a turn (no GC type), str, int, and the tracker's dict of calls
    (parts of no GC type: CPython keeps it untracked), none of which can
    refer back to it; CPython never tracks the tracker or the set again.
    """

    turn: _Turn
    count: int
    start: int
    tracker: CallTracker | None
    sent: dict[str, str]
    closed: set[str]

    def feed(self, entries: Sequence[_Entry]) -> None:
        """Feed ``entries``: the step from its first message, or results that continue it."""
        assert self.tracker is not None
        ended = feed_entries(self.tracker, self.sent, entries)
        if ended:  # (as check_steps collects them while it feeds ``before``)
            if self.closed is _NO_CLOSED:
                self.closed = set()
                untrack_container(self.closed)
            self.closed.update(ended)
        self.count += len(entries)

    def context(self) -> tuple[CallTracker, dict[str, str]]:
        """A copy of the tracker and the sent map: what ``_sent._context`` returns (start >= 0)."""
        assert self.tracker is not None
        return self.tracker.copy(), dict(self.sent)


class _StepsState(Protocol):
    """The state of a :class:`TurnHistory` this file reads and changes."""

    _steps: _StepState | None


def cold_steps(turn: _Turn) -> _StepState:
    """The state after ``turn`` computed from its entries (what a kept one must equal)."""
    entries = turn.entries(True)
    start = last_step_start(entries)
    if start < 0:
        return _StepState(turn, len(entries), -1, None, {}, _NO_CLOSED)
    tracker = CallTracker()
    untrack_atoms(tracker)  # (see _StepState)
    state = _StepState(turn, start, start, tracker, {}, _NO_CLOSED)
    state.feed(entries[start:])  # its first message starts the step
    return state


def kept_steps(history: _StepsState, turn: _Turn) -> _StepState:
    """``turn``'s state: the kept one, else computed cold and kept."""
    state = history._steps
    if state is None or state.turn is not turn:
        state = history._steps = cold_steps(turn)
    return state


def advance_steps(
    history: _StepsState,
    old: _Turn,
    new: _Turn,
    added: Sequence[_Entry],
    checked: _StepState | None = None,
) -> None:
    """``new`` replaced ``old``, holding its entries then ``added`` (a record): keep
    ``new``'s state.

    Advanced over ``added`` when the kept state is ``old``'s and they
    continue its step (results); else let go (computed cold when next read:
    a record that starts a step has nothing to walk back over).
    ``checked``: ``old``'s state, taken out of the history, which the step
    check fed exactly the added messages (results change no sent id): put
    back as it is when they continue the step. Call it once the change is
    made (it never raises).
    """
    state = history._steps if checked is None else checked
    if state is None or state.turn is not old:
        return
    if state.start >= 0 and _continues(added):
        if checked is None:
            state.feed(added)
        else:
            state.count += len(added)
        state.turn = new
        history._steps = state
    else:
        history._steps = None


def _continues(added: Sequence[_Entry]) -> bool:
    """True when every entry of ``added`` is a result (the step goes on)."""
    for entry in added:
        message = entry.message
        role = message.role
        if not (role is _TOOL or (role is _USER and message.tool_results)):
            return False
    return True

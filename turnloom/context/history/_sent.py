"""The call ids a history sends: decided once, when a message is committed, kept until it leaves.

A history may reuse a call id in a later turn; a request must carry each call
id once (:mod:`turnloom.context.callids`). The history applies the renaming
rule to its neutral messages when they enter it (a turn's input, recorded
outputs, kept state, a summary turn), against the ids its kept messages are
sent with (:class:`_SentIds`), and keeps the outcome with each message
(``_Entry.sent``: only the ids, None when every id of it is sent as it
is; the message as sent, ``_Entry.wire``, is built where it is rendered
or read). Eviction only
removes the evicted messages' ids from that set: a retained message's sent
ids never change, so a cold render of the history equals the incremental one
and an eviction renames nothing.

The rule over the kept calls' sent ids (``present``), for a call with id ``c``:

* ``c`` when no kept call is sent with ``c``;
* else ``c_r<n>``, ``n`` the smallest number from 2 up with ``c_r<n>`` not
  present.

The newest turn's kept state, decided while evictions hold turns aside for
its retraction, counts their calls' sent ids as present too
(:func:`assign_state`): a checkpoint holds those turns before it, and a
retraction brings them back beside the calls they sent.

The door decides them a step earlier for a batch it renders
(:func:`door_ids`, the same rule over the same state, changing nothing), so
the batch renders once, as sent; the commit or record that follows in that
very state takes the plan (:class:`_DoorIds`) instead of deciding again, and
one in another state decides as if there were none.

It depends only on the set of ids present, so replaying a log, or restoring
a checkpoint's messages with the ids they were sent with
(:func:`restore_sent_ids`), gives the same ids from then on. Until an id
leaves the set (no eviction, no retraction, no replaced state or summary)
it is the rule a gateway applies to a whole request (numbers only grow),
so such a history sends what a gateway renaming its whole input sends.

A result is sent with the sent id of the call it answers, by the pairing
rule (:class:`~turnloom.context.CallTracker`, across turns as the render
pairs); a result that answers no call keeps its id (pairing drops it from
every render) and holds none. O(the calls and results of the messages
committed), plus the walk back to the open call group (the newest turn, in
practice); eviction O(the evicted calls).
"""

from __future__ import annotations

__all__ = ("restore_sent_ids",)

import heapq
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import msgspec

from turnloom.context._untrack import untrack_atoms, untrack_container
from turnloom.context.history._cells import _Entry, _Turn, _WireIds, id_parts, pack_ids
from turnloom.context.history._steps import _StepsState, feed_entries, kept_steps
from turnloom.context.history._ties import last_step_start
from turnloom.context.history._turns import EMPTY, _Turns
from turnloom.context.message import Message, Role, ToolCallPart, ToolResultPart
from turnloom.context.pairing import CallTracker
from turnloom.errors import InvalidMessageError, UnknownTurnError, excerpt


class _SentIds:
    """The sent ids of a history's kept calls, and where the search for a free number starts.

    ``present``: every kept call's sent id (unique: that is the rule). Per
    base id renamed so far, every free number below ``low[base]`` is in
    ``free[base]``, a heap (which may also hold numbers taken again since:
    checked when popped); numbers from ``low`` up are searched one by one.
    The pair only speeds up finding the smallest free number: dropping it
    for a base (``low`` 2, ``free`` empty) is always valid, so a base's
    entry goes once all its numbers below ``low`` are free. ``renamed``
    counts the kept calls sent renamed: while it is 0, a result answering a
    kept call keeps its id, and no pairing walk is needed. Holds str, int
    and lists of int only: in no cycle.
    """

    __slots__ = ("free", "low", "present", "renamed", "version")

    def __init__(self) -> None:
        # As keys (to None): a str-keyed dict holds about half the bytes of a
        # set of as many str.
        self.present: dict[str, None] = {}
        self.low: dict[str, int] = {}
        self.free: dict[str, list[int]] = {}
        self.renamed = 0  # kept calls sent with another id than their own
        # Changes with every change of ``present``: a plan decided at the door
        # (:func:`door_ids`) holds while it is the same number.
        self.version = 0
        # Out of the cyclic collector: a dict of str to None and one of str
        # to int (CPython leaves them untracked), a dict of str to untracked lists of
        # int (untracked again when a list joins it): nothing here can lead
        # back to anything, so a full collection visits no reference per call.
        untrack_container(self.present)
        untrack_atoms(self)

    def take(self, call_id: str) -> str:
        """The id a new call with ``call_id`` is sent with (now present)."""
        present = self.present
        if call_id not in present:
            present[call_id] = None
            self.version += 1
            return call_id
        sent = self.peek(call_id)
        self.claim(call_id, sent)
        return sent

    def peek(self, call_id: str, taken: set[str] | dict[str, None] | None = None) -> str:
        """The id :meth:`take` gives ``call_id`` with ``taken`` present too; changes nothing.

        The rule of the module docstring: ``call_id`` when free, else
        ``<call_id>_r<n>`` with ``n`` the smallest free number from 2 up.
        Every free number below ``low`` is in the heap (which may also hold
        numbers taken since), so the smallest free one there, if any, is
        the answer; else the search goes on from ``low``. O(the heap).
        """
        present = self.present
        if call_id not in present and (taken is None or call_id not in taken):
            return call_id
        heap = self.free.get(call_id)
        if heap:
            best = 0
            for number in heap:
                if (best == 0 or number < best) and (
                    (sent := f"{call_id}_r{number}") not in present
                    and (taken is None or sent not in taken)
                ):
                    best = number
            if best:
                return f"{call_id}_r{best}"
        number = self.low.get(call_id, 2)
        while (sent := f"{call_id}_r{number}") in present or (taken is not None and sent in taken):
            number += 1
        return sent

    def claim(self, call_id: str, sent: str) -> None:
        """A new call with ``call_id`` is sent with ``sent`` (what :meth:`peek` gave): present.

        A number from the heap leaves it (with the numbers below it there,
        taken since); one from ``low`` up moves ``low`` past it (every
        number between was present: ``sent`` was the smallest free one).
        """
        self.present[sent] = None
        self.version += 1
        if sent == call_id:
            return
        self.renamed += 1
        number = int(sent[len(call_id) + 2 :])
        heap = self.free.get(call_id)
        if heap is not None:
            while heap and heapq.heappop(heap) != number:
                pass
            if not heap:
                del self.free[call_id]
        if number >= self.low.get(call_id, 2):
            self.low[call_id] = number + 1

    def claim_all(self, claims: Iterable[tuple[str, str]]) -> None:
        """:meth:`claim` each (call id, sent id) of ``claims``, in order."""
        present = self.present
        for call_id, sent in claims:
            if sent is call_id or sent == call_id:
                present[sent] = None
            else:
                self.claim(call_id, sent)
        self.version += 1

    def hold(self, sent: str) -> None:
        """``sent`` is a kept call's id again (a restored turn; a checkpoint's id)."""
        self.present[sent] = None
        self.version += 1

    def drop(self, sent: str) -> None:
        """The call sent with ``sent`` left the history: its id is free again."""
        self.present.pop(sent, None)
        self.version += 1
        base, sep, number = sent.rpartition("_r")
        if not sep or not number.isdigit() or number[0] == "0":
            return
        low = self.low.get(base)
        if low is None:
            return
        value = int(number)
        if value < low:
            free = self.free
            heap = free.get(base)
            if heap is None:
                heap = free[base] = []
                untrack_container(heap)  # ints only
                untrack_container(free)  # a dict holding a list is tracked again
            heapq.heappush(heap, value)
            if len(heap) >= low - 2 and len(set(heap)) >= low - 2:
                # Every number below ``low`` is free: start afresh from 2.
                del self.free[base], self.low[base]


class _SentState(Protocol):
    """The state of a :class:`TurnHistory` this file reads and changes."""

    _sent: _SentIds
    _turns: _Turns


class _DoorSentState(_SentState, _StepsState, Protocol):
    """What :func:`door_ids` reads: the sent ids, the turns and the kept step state."""


_Context = tuple[CallTracker, dict[str, str]]
"""The pairing state after some messages (own ids), and the sent id of the newest call
fed with each own id."""


def _context(turns: Sequence[_Turn], stop: int, input_only: bool = False) -> _Context:
    """The pairing state after ``turns[:stop]``, the last whole or (``input_only``) its input.

    Walks back, as ``_ties._calls_after`` does, to the last turn where a call
    group starts or ends (the state after it does not depend on what came
    before): O(that turn and those after it), the newest turn in practice.
    The map holds only renamed calls (a call sent as it is maps to itself).
    """
    last = stop - 1
    for index in range(last, -1, -1):
        tracker = CallTracker()
        sent: dict[str, str] = {}
        entries = turns[index].entries(not (index == last and input_only))
        if index == last:
            # A step's first message starts a call group whatever came before
            # (CallTracker.feed), so a tracker fed from the newest turn's last
            # step ends as one fed the whole turn: O(the step) per record.
            start = last_step_start(entries)
            if start >= 0:
                feed_entries(tracker, sent, entries[start:])
                return tracker, sent
        feed_entries(tracker, sent, entries)
        if tracker.group:
            for at in range(index + 1, stop):
                tracker.new_turn()
                feed_entries(tracker, sent, turns[at].entries(not (at == last and input_only)))
            return tracker, sent
    return CallTracker(), {}


def _decide(
    messages: Sequence[Message],
    context: _Context | None,
    new_turn: bool,
    ids: _SentIds,
    claims: list[tuple[str, str]] | None = None,
) -> list[_WireIds | None] | None:
    """The sent ids of ``messages``, which follow ``context`` (see the module docstring).

    The one place the rule is applied, in the messages' order: each call
    takes its id from ``ids`` (:meth:`_SentIds.take`), or, for a plan at the
    door (``claims`` given), is only told it (:meth:`_SentIds.peek`, the
    batch's earlier calls counted as taken) and appends (own id, sent id)
    to ``claims``, changing nothing. Returns what ``_Entry.sent`` keeps
    for each message (None where every id is sent as it is), or None when
    no id of ``messages`` is renamed. ``context`` None: ``messages`` hold
    no result (only a result reads the context), or no kept call is sent
    renamed, so a result answering a call before ``messages`` keeps its id
    and only the calls of ``messages`` matter. There a result takes the
    sent id of the newest call with its id without asking the pairing
    whether it answers it: a result that answers no call is dropped from
    every render, and the id it gets matches no call of its group either
    way, so nothing pairs otherwise. ``context`` is used up: its tracker is
    left fed up to the last message, not with it.
    """
    tracker: CallTracker | None = None
    sent_of: dict[str, str] = {}
    if context is not None:
        tracker, sent_of = context
        if new_turn:
            tracker.new_turn()
    out: list[_WireIds | None] | None = None
    present = ids.present
    # The ids already taken: the batch's own (claims) or the present ones (take).
    taken: set[str] | dict[str, None] = set() if claims is not None else present
    last = len(messages) - 1
    for index, message in enumerate(messages):
        parts = message.parts
        renamed: list[tuple[int, str]] | None = None
        if sent_of and message.role is not Role.assistant:
            open_calls = tracker.open if tracker is not None else sent_of
            answered: set[str] = set()
            for at, part in enumerate(parts):
                if type(part) is ToolResultPart:
                    call_id = part.call_id
                    if call_id in open_calls and call_id not in answered:
                        answered.add(call_id)
                        sent = sent_of.get(call_id, call_id)
                        if sent != call_id:
                            if renamed is None:
                                renamed = []
                            renamed.append((at, sent))
        if tracker is not None and index < last:  # (no message reads it after the last)
            tracker.feed(message)
        for at, part in enumerate(parts):
            if type(part) is ToolCallPart:
                call_id = part.call_id
                if claims is None:
                    sent = ids.take(call_id)
                else:
                    if call_id in present or call_id in taken:
                        sent = ids.peek(call_id, taken)
                    else:
                        sent = call_id  # free: sent as it is (the common case)
                    taken.add(sent)  # type: ignore[union-attr]  # a set when claims is given
                    claims.append((call_id, sent))
                if sent != call_id:
                    sent_of[call_id] = sent
                    if renamed is None:
                        renamed = []
                    renamed.append((at, sent))
                elif sent_of:
                    sent_of.pop(call_id, None)
        if renamed is not None:
            if out is None:
                out = [None] * len(messages)
            out[index] = _renamed(message, renamed)
    return out


def _assign(
    ids: _SentIds, entries: Sequence[_Entry], context: _Context | None, new_turn: bool
) -> None:
    """Decide the sent ids of ``entries`` (:func:`_decide`), taking them from ``ids``.

    Sets ``_Entry.sent`` of each entry with a renamed id (and drops its
    render caches: a render made of the message as given carries its own ids).
    """
    decided = _decide([e.message for e in entries], context, new_turn, ids)
    if decided is not None:
        for entry, sent in zip(entries, decided, strict=True):
            if sent is not None:
                _set_sent(entry, sent)


def _renamed(message: Message, renamed: Sequence[tuple[int, str]]) -> _WireIds | None:
    """What ``_Entry.sent`` keeps for ``message`` with the parts at the given indexes
    carrying the given call ids (see :func:`~turnloom.context.history._cells.pack_ids`)."""
    if len(message.parts) == 1 and len(renamed) == 1:
        return renamed[0][1]  # its lone part, renamed (the common case): the id bare
    at_sent = dict(renamed)
    return pack_ids(message, [at_sent.get(at, own) for at, own in _parts_with_ids(message)])


def _set_sent(entry: _Entry, sent: _WireIds | None) -> None:
    """Give ``entry`` the ids it is sent with; its cached renders (of the other ids) go."""
    entry.sent = sent
    entry.native = entry.encoded = None
    entry.more = None


def sent_calls(entry: _Entry) -> list[tuple[str, str]]:
    """(own id, sent id) of each call of ``entry``."""
    if entry.sent is None:
        return [(p.call_id, p.call_id) for p in entry.message.parts if type(p) is ToolCallPart]
    return [
        (part.call_id, sent)
        for part, sent in zip(id_parts(entry.message), entry.sent_ids(), strict=True)
        if type(part) is ToolCallPart
    ]


def _drop_entries(ids: _SentIds, entries: Iterable[_Entry]) -> None:
    """The calls of ``entries`` left the history: their sent ids are free again."""
    drop = ids.drop
    for entry in entries:
        if entry.sent is None:
            for part in entry.message.parts:
                if type(part) is ToolCallPart:
                    drop(part.call_id)
        else:
            for own, sent in sent_calls(entry):
                drop(sent)
                if sent != own:
                    ids.renamed -= 1


def _hold_entries(ids: _SentIds, entries: Iterable[_Entry]) -> None:
    """The calls of ``entries`` are kept again, sent with the ids they were decided."""
    for entry in entries:
        for own, sent in sent_calls(entry):
            ids.hold(sent)
            if sent != own:
                ids.renamed += 1


def release(history: _SentState, turns: Iterable[_Turn]) -> None:
    """``turns`` left the history: their calls' sent ids are free again (O(their calls))."""
    ids = history._sent
    for turn in turns:
        _drop_entries(ids, turn.entries(True))


def hold(history: _SentState, turns: Iterable[_Turn]) -> None:
    """``turns`` are back in the history (a retraction restored them): their ids are held."""
    ids = history._sent
    for turn in turns:
        _hold_entries(ids, turn.entries(True))


class _DoorIds(msgspec.Struct, gc=False, frozen=True):
    """A batch's sent ids decided at the door, before it renders (:func:`door_ids`).

    They are the ids the commit or record of the batch decides, as long as
    it happens in the state the door saw: the history's very ``_turns``
    tuple (every change of a turn or of a kept entry's ids assigns another:
    see ``_batches._reuse``) and ``_sent.version`` (every change of the ids
    present, :func:`restore_sent_ids`' included); the same ``turn_id`` (a
    record to the newest turn holding it; None: a new turn's input); and the
    whole batch kept (a record keeps fewer when it drops blank or duplicate
    messages). Then the door renders each message as sent, once, and the
    change takes ``claims`` instead of deciding again (:func:`assign_input`,
    :func:`assign_outputs`); otherwise it decides as if there were no plan.
    Holds the history's ``_Turns`` (as the door's memo does), str and tuples: in no cycle.
    """

    turns: _Turns
    version: int
    turn_id: str | None
    # ``_Entry.sent`` of each message (None where every id is sent as it is),
    # or None when the batch renames nothing.
    sent: tuple[_WireIds | None, ...] | None
    # (own id, sent id) of each call of the batch, in order: what the change takes.
    claims: tuple[tuple[str, str], ...]

    def holds(self, history: _SentState, turn_id: str | None) -> bool:
        """True when the batch is committed or recorded (``turn_id``) in the state planned
        for, or holds no id (:data:`_NO_IDS`: the same in every state)."""
        return self.version < 0 or (
            self.turns is history._turns
            and self.version == history._sent.version
            and self.turn_id == turn_id
        )


def door_ids(
    history: _DoorSentState, messages: Sequence[Message], turn_id: str | None, position: int
) -> _DoorIds:
    """The sent ids ``messages`` would get now (:data:`_NO_IDS` when they carry no call
    or result id).

    ``turn_id`` None: the messages are a new turn's input (:func:`assign_input`);
    else they are recorded after the outputs of ``history._turns[position]``
    (:func:`assign_outputs`). Changes nothing: the ids come from
    :meth:`_SentIds.peek`, the batch's own calls counted as taken. O(what
    the change itself costs to decide).
    """
    carried = _carried(messages)
    if not carried:
        return _NO_IDS
    ids, turns = history._sent, history._turns
    if carried is _CALLS and len(messages) == 1:
        fresh = _fresh_calls(messages[0], ids.present)
        if fresh is not None:  # what _decide finds: each call sent as it is
            return _DoorIds(turns, ids.version, turn_id, None, fresh)
    paired = ids.renamed and carried is _RESULTS
    stop = position + 1 if turn_id is not None else len(turns)
    context = None
    if paired:
        step = kept_steps(history, turns[stop - 1]) if stop else None
        if step is None or step.start < 0:
            context = _context(turns, stop)
        elif turn_id is not None and len(messages) == 1:
            # _decide changes its context only by a new turn, feeding a message
            # before the last, or a call: none here (a checked message holding a
            # result is no assistant's, so it holds no call): read as it is.
            context = step.tracker, step.sent  # type: ignore[assignment]
        else:
            context = step.context()  # a copy of the state after the turn's last step
    claims: list[tuple[str, str]] = []
    decided = _decide(messages, context, turn_id is None, ids, claims)
    return _DoorIds(
        turns,
        ids.version,
        turn_id,
        None if decided is None else tuple(decided),
        tuple(claims),
    )


def _fresh_calls(message: Message, present: dict[str, None]) -> tuple[tuple[str, str], ...] | None:
    """(own id, sent id) of each call of ``message`` when each is sent as it is: its id
    is not ``present`` and not repeated in ``message``; else None (the general rule
    decides). A message without a result reads no pairing context, so then
    :func:`_decide` renames nothing and claims exactly these."""
    claims: list[tuple[str, str]] = []
    taken: set[str] = set()
    for part in message.parts:
        if type(part) is ToolCallPart:
            call_id = part.call_id
            if call_id in present or call_id in taken:
                return None
            taken.add(call_id)
            claims.append((call_id, call_id))
    return tuple(claims)


_NO_IDS = _DoorIds(EMPTY, -1, None, None, ())
"""The plan of a batch without a call or result: nothing to decide, in any state."""


def unplanned(entries: Iterable[_Entry]) -> None:
    """``entries`` are sent with their own ids until decided: the door's ids (and the
    renders of them) go, for a change that decides its own."""
    for entry in entries:
        if entry.sent is not None:
            _set_sent(entry, None)


def assign_input(
    history: _SentState, entries: Sequence[_Entry], planned: _DoorIds | None = None
) -> None:
    """A new turn's input ``entries`` follow the kept turns (a commit).

    ``planned``: the door's plan for these entries (see :class:`_DoorIds`) as
    ``_batches._entries`` gave it, so it holds: ``_entries`` gives a plan only
    when it holds, and a commit changes neither the turns nor the sent ids
    before it assigns them. The entries carry its ``sent``; its claims are taken.
    """
    if planned is not None:
        if planned.claims:  # (none for _NO_IDS)
            history._sent.claim_all(planned.claims)
        return
    carried = _carried_ids(entries)
    if carried:
        ids, turns = history._sent, history._turns
        paired = ids.renamed and carried is _RESULTS
        _assign(ids, entries, _context(turns, len(turns)) if paired else None, True)


def assign_outputs(
    history: _SentState,
    position: int,
    entries: Sequence[_Entry],
    planned: _DoorIds | None = None,
) -> None:
    """``entries`` are recorded after the outputs of ``history._turns[position]``.

    ``planned``: the door's plan for exactly these entries (see :class:`_DoorIds`)
    as ``_batches._entries`` gave it for that turn, so it holds (as for
    :func:`assign_input`: a record changes neither the turns nor the sent ids
    before it assigns them). The entries carry its ``sent``; its claims are taken.
    """
    if planned is not None:
        if planned.claims:  # (none for _NO_IDS)
            history._sent.claim_all(planned.claims)
        return
    carried = _carried_ids(entries)
    if carried:
        ids = history._sent
        paired = ids.renamed and carried is _RESULTS
        context = _context(history._turns, position + 1) if paired else None
        _assign(ids, entries, context, False)


def assign_state(
    history: _SentState,
    position: int,
    old: Sequence[_Entry],
    entries: Sequence[_Entry],
    aside: Sequence[_Turn] = (),
) -> None:
    """``entries`` are kept as the state of ``history._turns[position]``, replacing ``old``.

    The state sits after the turn's input: it pairs from there. ``aside``: the
    turns held aside for a retraction of the newest turn, when ``position`` is
    it (``TurnHistory.restorable_ids``). Their calls' sent ids are held while
    the state's are decided, so the rule counts them taken as it counts a kept
    call's: a checkpoint holds those turns before the newest one
    (``TurnHistory.before_evictions``) and a retraction brings them back, so
    an id both sent would repeat there. O(their calls) more, only for a state
    that carries a call or result id.
    """
    ids = history._sent
    _drop_entries(ids, old)
    if _carried_ids(entries):
        context = _context(history._turns, position + 1, input_only=True)
        present = ids.present
        held = [
            s for t in aside for e in t.entries(True) for _, s in sent_calls(e) if s not in present
        ]
        for sent in held:
            ids.hold(sent)
        try:
            _assign(ids, entries, context, False)
        finally:
            for sent in held:  # free again: only a retraction holds them
                ids.drop(sent)


def assign_summary(history: _SentState, entries: Sequence[_Entry]) -> None:
    """A summary turn's ``entries``, first in the history (after ``release`` of the replaced)."""
    if _carried_ids(entries):
        _assign(history._sent, entries, (CallTracker(), {}), True)


def carry_sent(old: Sequence[_Entry], new: Sequence[_Entry]) -> None:
    """Give ``new`` (``old`` pruned: the same calls and results, in order) ``old``'s sent ids.

    Pruning keeps every call and result, its id and its order (it drops
    reasoning and result bodies), so the ids are matched in order. An entry
    of ``old`` kept as it is keeps its own ``sent``.
    """
    if not any(e.sent is not None for e in old):
        return
    sent_ids = iter([i for e in old for i in e.sent_ids()])
    kept = {id(e) for e in old}
    for entry in new:
        if id(entry) in kept:
            for _ in entry.sent_ids():
                next(sent_ids)
            continue
        renamed = [
            (at, sent)
            for (at, call_id), sent in zip(_parts_with_ids(entry.message), sent_ids, strict=False)
            if sent != call_id
        ]
        if renamed:
            _set_sent(entry, _renamed(entry.message, renamed))


def _parts_with_ids(message: Message) -> list[tuple[int, str]]:
    """(index, call id) of each call and result part of ``message``."""
    return [
        (at, part.call_id)
        for at, part in enumerate(message.parts)
        if type(part) is ToolCallPart or type(part) is ToolResultPart
    ]


_CALLS = "calls"
_RESULTS = "results"


def _carried_ids(entries: Sequence[_Entry]) -> str:
    """:func:`_carried` of the entries' messages."""
    found = ""
    for entry in entries:
        for part in entry.message.parts:
            kind = type(part)
            if kind is ToolResultPart:
                return _RESULTS
            if kind is ToolCallPart:
                found = _CALLS
    return found


def _carried(messages: Sequence[Message]) -> str:
    """``_RESULTS`` when ``messages`` hold a tool result, else ``_CALLS`` when a call, else "".

    Only a result reads the pairing context before ``messages`` (which kept
    call it answers, and that call's sent id); a call's sent id depends on the
    ids present alone. So messages without a result are assigned without
    walking back for that context (:func:`_decide` with None): the same ids.
    """
    found = ""
    for message in messages:
        for part in message.parts:
            kind = type(part)
            if kind is ToolResultPart:
                return _RESULTS
            if kind is ToolCallPart:
                found = _CALLS
    return found


def _checkpoint_entries(turn: _Turn) -> tuple[_Entry, ...]:
    """A turn's entries in a checkpoint's order: input, outputs, then kept state."""
    return turn.input + turn.outputs + turn.state


def sent_ids(turn: _Turn) -> tuple[str, ...]:
    """The sent id of each call and result of ``turn`` (input, outputs, state), or ().

    () when every one is sent as it is (the common case). What
    :func:`restore_sent_ids` takes.
    """
    entries = _checkpoint_entries(turn)
    if all(e.sent is None for e in entries):
        return ()
    return tuple(i for e in entries for i in e.sent_ids())


class _RestoreState(_SentState, Protocol):
    _generation: int
    _view: Any  # HistoryView | None (view imports this file)
    _aside: Any  # _Aside | None: the turns a retraction of the newest turn brings back


def restore_sent_ids(
    history: _RestoreState, turn_id: str, ids: Sequence[str], *, given: bool = False
) -> None:
    """Send the calls and results of the held turn ``turn_id`` with ``ids`` (a checkpoint's).

    ``ids``: the sent id of each call and result of the turn, in the order of
    its input, outputs, then kept state (what a checkpoint stored: see
    ``CheckpointTurn.call_ids``); () leaves the turn as it is, unless
    ``given``: then () sends every id of the turn as given. Its calls'
    current ids are released first, so restoring the turns of a checkpoint
    one by one, oldest first, leaves the ids of the history that wrote it.
    O(the turn's messages).

    Raises:
        UnknownTurnError: ``turn_id`` is not held.
        InvalidMessageError: ``ids`` does not hold one id per call and result,
            holds an empty id, or gives two calls one id, or a call an id
            another kept call is sent with, or one a turn held aside for a
            retraction of the newest turn sends (``TurnHistory.restorable_ids``:
            the retraction would bring both back); checked before anything
            changes.
    """
    if not ids and not given:
        return
    for position, turn in enumerate(history._turns):  # noqa: B007
        if turn.turn_id == turn_id:
            break
    else:
        raise UnknownTurnError(f"The history holds no turn {excerpt(turn_id)}.")
    # Its entries are changed in place below: an equal live turn takes its place then
    # (a render in a worker thread may be closing this one).
    turn = turn.reopened()
    entries = _checkpoint_entries(turn)
    wanted = [p for e in entries for p in _parts_with_ids(e.message)]
    if not ids:
        if all(e.sent is None for e in entries):
            return
        ids = [call_id for _, call_id in wanted]
    if len(wanted) != len(ids) or not all(isinstance(i, str) and i for i in ids):
        raise InvalidMessageError(
            f"Turn {excerpt(turn_id)} has {len(wanted)} tool call and result ids; "
            f"{len(ids)} sent ids do not match them.",
            field="call_ids",
        )
    state = history._sent
    mine = {sent for e in entries for _, sent in sent_calls(e)}
    plan: list[tuple[_Entry, _WireIds | None]] = []
    calls: list[str] = []
    at = 0
    for entry in entries:
        pairs = _parts_with_ids(entry.message)
        renamed = []
        for (index, call_id), sent in zip(pairs, ids[at : at + len(pairs)], strict=True):
            if type(entry.message.parts[index]) is ToolCallPart:
                calls.append(sent)
            if sent != call_id:
                renamed.append((index, sent))
        at += len(pairs)
        plan.append((entry, _renamed(entry.message, renamed) if renamed else None))
    aside = history._aside
    held = (
        {s for t in aside.turns for e in t.entries(True) for _, s in sent_calls(e)}
        if aside is not None
        else ()
    )
    taken = [c for c in calls if (c in state.present or c in held) and c not in mine]
    if taken or len(set(calls)) != len(calls):
        raise InvalidMessageError(
            f"Turn {excerpt(turn_id)}'s sent call ids repeat an id the history sends: "
            f"{excerpt((taken or calls)[:3])}.",
            field="call_ids",
        )
    history._turns = history._turns.replaced(position, turn)
    _drop_entries(state, entries)
    for entry, wire_ids in plan:
        if entry.sent != wire_ids:
            _set_sent(entry, wire_ids)
    _hold_entries(state, entries)
    turn.renders = None
    history._generation += 1  # turns before the newest changed: views render anew
    history._view = None


def repair_results(turns: _Turns, position: int) -> _Turns:
    """``turns`` with each result after turn ``position`` sent with the id of the call it answers.

    For a change before the newest turn (a late record, kept state): it may
    make a result committed earlier answer another call (one renamed just
    now), whose sent id it must carry. Calls keep their ids; a result whose
    id changes gets a new entry in a new turn (views keep theirs). O(the
    turns from ``position``), plus the walk back to the call group open
    before it.
    """
    tracker, sent_of = _context(turns, position)
    out: list[_Turn] | None = None
    for index in range(position, len(turns)):
        turn = turns[index]
        tracker.new_turn()
        changed: dict[int, _Entry] = {}
        entries = turn.entries(True)  # read once: a closed turn's are new at each read
        for entry in entries:
            message = entry.message
            if sent_of and message.role is not Role.assistant:
                open_calls = tracker.open
                answered: set[str] = set()
                renamed: list[tuple[int, str]] = []
                differs = False
                sent_now = iter(entry.sent_ids())
                for at, part in enumerate(message.parts):
                    if type(part) is ToolCallPart:
                        renamed_to = next(sent_now)
                        if renamed_to != part.call_id:
                            renamed.append((at, renamed_to))
                    elif type(part) is ToolResultPart:
                        call_id = part.call_id
                        now = next(sent_now)
                        want = now
                        if call_id in open_calls and call_id not in answered:
                            answered.add(call_id)
                            want = sent_of.get(call_id, call_id)
                        differs = differs or want != now
                        if want != call_id:
                            renamed.append((at, want))
                if differs:
                    new = _Entry(message, entry.tokens)
                    _set_sent(new, _renamed(message, renamed))
                    changed[id(entry)] = new
            feed_entries(tracker, sent_of, (entry,))
        if changed:
            if out is None:
                out = list(turns)

            out[index] = turn.with_entries(tuple([changed.get(id(e), e) for e in entries]))
    return turns if out is None else _Turns.of(out)

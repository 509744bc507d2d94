"""The door's check of a batch of messages, and its memo."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Protocol, cast

from turnloom.context.gateway import Gateway, NativeContent
from turnloom.context.history._cells import (
    _Encoded,
    _Entry,
    _Native,
    _render_checked,
    _Turn,
    with_ids,
)
from turnloom.context.history._run import _Shared
from turnloom.context.history._sent import _NO_IDS, _DoorIds, _SentIds, door_ids, sent_calls
from turnloom.context.history._ties import _tied_error, _unit_first
from turnloom.context.history._turns import _Turns
from turnloom.context.history.limits import HistoryLimits, check_batch_length
from turnloom.context.message import (
    Message,
    admit_message,
)
from turnloom.context.tokens import count_message_tokens
from turnloom.errors import (
    ItemTooLargeError,
    TurnTooLargeError,
    excerpt,
)

_Checked = tuple[
    tuple[object, ...],
    tuple[int, ...],
    tuple[tuple[_Native, _Encoded], ...] | None,
    Gateway | None,
    _Turns | None,
    str | None,
    bool,
    _DoorIds | None,
    tuple[Message, ...],
]
"""``TurnHistory``'s memo of a batch checked: messages, sizes, renders, gateway,
and what its limits were checked against: the history's turns (the very
``_Turns``), the turn id and whether the batch was pinned instructions; then the
sent ids decided at the door, when it renamed any (the renders are of the
messages as sent: see :class:`~turnloom.context.history._sent._DoorIds`); last,
the messages to hold (:func:`~turnloom.context.admit_message`: the
given ones, or new ones holding the door's private copies), which the ids and
renders are of."""

_UNCHECKED: _Checked = ((), (), None, None, None, None, False, None, ())


class _DoorState(Protocol):
    """The state of a :class:`TurnHistory` this file reads and changes."""

    _checked: tuple[_Checked, _Checked]
    _limits: HistoryLimits
    _linked: set[int]
    _sent: _SentIds
    _shared: _Shared
    _turns: _Turns


def _check_batch(
    history: _DoorState,
    messages: Sequence[object],
    where: str,
    *,
    turn_id: str | None = None,
    pinned: bool = False,
    gateway: Gateway | None = None,
) -> tuple[int, ...]:
    """The work of :meth:`TurnHistory.check_batch` (documented there)."""
    memo = _memo(history, messages)
    kind = type(messages)
    if memo is _UNCHECKED and (kind is list or kind is tuple) and len(messages) == 1:
        # A record's usual batch, a list or tuple of one message (see _check_one).
        return _check_one(history, messages, where, turn_id, pinned, gateway)
    if memo is not _UNCHECKED and _reuse(history, memo, turn_id, pinned, gateway):
        return memo[1]
    limits = history._limits
    turns = history._turns
    at, held_items, held_bytes, unit = _held(history, turn_id)
    count = held_items + len(messages)
    if unit and count > limits.max_items:
        raise _tied_error(where, "items", count, limits.max_items, unit, turn_id)
    if count > limits.max_items:
        check_batch_length(count, limits, where)
    cap = limits.max_item_bytes
    max_bytes = limits.max_bytes
    total = held_bytes
    _, seen_sizes, seen_renders, seen_gateway, _, _, _, seen_plan, seen_held = memo
    known = memo is not _UNCHECKED
    found: list[int] = []
    admitted: list[Message] = []
    for i, message in enumerate(messages):
        if known:
            size = seen_sizes[i]
        else:
            message, size = admit_message(message, where=f"{where}[{i}]")
            admitted.append(message)
        if size > cap:
            raise _item_too_large(f"{where}[{i}]", size, cap)
        total += size
        if total > max_bytes and not pinned:
            raise _turn_too_large(where, total, max_bytes, unit, turn_id)
        found.append(size)
    sizes = seen_sizes if known else tuple(found)
    given = tuple(messages)
    held: tuple[Message, ...] = (
        seen_held
        if known
        else cast("tuple[Message, ...]", given)
        if all(map(operator.is_, admitted, given))
        else tuple(admitted)
    )
    renders: tuple[tuple[_Native, _Encoded], ...] | None = None
    plan: _DoorIds | None = None
    if gateway is not None:
        if not pinned and at >= 0:
            # The ids the commit or record will send, decided now so that each
            # message renders once, as sent (see _DoorIds).
            plan = door_ids(history, held, turn_id, at)  # type: ignore[arg-type]
        sent = plan.sent if plan is not None else None
        if (
            known
            and seen_gateway is gateway
            and seen_renders is not None
            and sent == (seen_plan.sent if seen_plan is not None else None)
        ):
            renders = seen_renders
        elif len(held) == 1:  # a record's usual batch: no comprehension, no zip
            message = held[0]
            if sent is not None and sent[0] is not None:
                message = with_ids(message, sent[0])
            renders = (_render_checked(message, gateway, where, 0),)
        elif sent is None:
            renders = tuple(
                [_render_checked(message, gateway, where, i) for i, message in enumerate(held)]
            )
        else:
            renders = tuple(
                [
                    _render_checked(
                        message if ids is None else with_ids(message, ids), gateway, where, i
                    )
                    for i, (message, ids) in enumerate(zip(held, sent, strict=True))
                ]
            )
    elif known and seen_renders is not None:
        renders, gateway, plan = seen_renders, seen_gateway, seen_plan
    checked: _Checked = (
        given,
        sizes,
        renders,
        gateway,
        turns,
        turn_id,
        bool(pinned),
        plan,
        held,
    )
    newest, older = history._checked
    history._checked = (checked, older if memo is newest else newest)
    return sizes


def _held(history: _DoorState, turn_id: str | None) -> tuple[int, int, int, tuple[_Turn, ...]]:
    """Where a change would add a batch to ``turn_id`` (-1: not held; a new turn's input,
    ``turn_id`` None: after the newest), the items and bytes the batch is held with, and
    the turns held with it when it is tied to others (else ``()``).
    """
    turns = history._turns
    if turn_id is None:
        return turns.size, 0, 0, ()
    linked = history._linked
    for position in range(turns.size - 1, -1, -1):  # the newest, in practice: O(1)
        turn = turns[position]
        if turn.turn_id == turn_id:
            if not linked:
                return position, turn.items, turn.bytes, ()
            # The turns eviction keeps with it, whether or not they
            # reach the newest: a record to an earlier unit (a model
            # call's output landing after a barge-in) is held to the
            # limits its records were held to while it was newest, as
            # a restore from a checkpoint holds it.
            first = _unit_first(history, position)
            last = position
            while last + 1 < len(turns) and turns[last + 1].serial in linked:
                last += 1
            if first == last:
                return position, turn.items, turn.bytes, ()
            unit = turns[first : last + 1]
            return position, sum(t.items for t in unit), sum(t.bytes for t in unit), unit
    return -1, 0, 0, ()


def _check_one(
    history: _DoorState,
    messages: Sequence[object],
    where: str,
    turn_id: str | None,
    pinned: bool,
    gateway: Gateway | None,
) -> tuple[int, ...]:
    """:func:`_check_batch` of a list or tuple of one message with no memo of it: the same
    checks in the same order, the same errors, sizes and memo, without the batch's loop."""
    limits = history._limits
    turns = history._turns
    at, held_items, held_bytes, unit = _held(history, turn_id)
    count = held_items + 1
    if count > limits.max_items:
        if unit:
            raise _tied_error(where, "items", count, limits.max_items, unit, turn_id)
        check_batch_length(count, limits, where)
    given = tuple(messages)
    message, size = admit_message(given[0], where=f"{where}[0]")
    held = cast("tuple[Message, ...]", given) if message is given[0] else (message,)
    cap = limits.max_item_bytes
    if size > cap:
        raise _item_too_large(f"{where}[0]", size, cap)
    total = held_bytes + size
    max_bytes = limits.max_bytes
    if total > max_bytes and not pinned:
        raise _turn_too_large(where, total, max_bytes, unit, turn_id)
    sizes = (size,)
    renders: tuple[tuple[_Native, _Encoded], ...] | None = None
    plan: _DoorIds | None = None
    if gateway is not None:
        if not pinned and at >= 0:
            plan = door_ids(history, held, turn_id, at)  # type: ignore[arg-type]
            sent = plan.sent
            if sent is not None and sent[0] is not None:
                message = with_ids(message, sent[0])
        renders = (_render_checked(message, gateway, where, 0),)
    newest, older = history._checked
    history._checked = (
        (given, sizes, renders, gateway, turns, turn_id, bool(pinned), plan, held),
        older if newest is _UNCHECKED else newest,
    )
    return sizes


def _memo(history: _DoorState, messages: Sequence[object]) -> _Checked:
    """The memo of an earlier :meth:`TurnHistory.check_batch` of these very messages, if any."""
    count = len(messages)
    for memo in history._checked:
        seen = memo[0]
        if len(seen) == count and (
            seen[0] is messages[0]  # a batch of one, the usual record: no iterator
            if count == 1
            else all(map(operator.is_, seen, messages))
        ):
            return memo
    return _UNCHECKED


def _reuse(
    history: _DoorState, memo: _Checked, turn_id: str | None, pinned: bool, gateway: Gateway | None
) -> bool:
    """True when ``memo`` is of the same check in the same state; it becomes the newest.

    The same check: of these very message objects (frozen, and checked
    into private copies: :meth:`TurnHistory._memo` found it), with the same
    ``turn_id`` and ``pinned``, rendered for ``gateway`` when one is
    given. The same state: the history's very ``_turns`` (a ``_Turns``). Every
    change to the turns or to the ties between them (``_linked``, the only
    other state the limits read) assigns another ``_Turns`` object, and the
    memo keeps its object alive, so no other can be it; the one
    exception, the empty ``EMPTY`` an emptied history holds again, holds no
    turn and no tie either. Such a check passes again with the same
    sizes, so it is not repeated (the door's check, then the commit or
    record of the same batch).
    """
    if (
        memo is _UNCHECKED
        or memo[4] is not history._turns
        or memo[5] != turn_id
        or memo[6] is not bool(pinned)
        or (gateway is not None and memo[3] is not gateway)
    ):
        return False
    newest = history._checked[0]
    if memo is not newest:
        history._checked = (memo, newest)
    return True


def _rendered_items(history: _DoorState) -> int:
    """The work of :meth:`TurnHistory.rendered_items` (documented there)."""
    renders = history._checked[0][2]
    if renders is None:
        return 0
    if len(renders) == 1:  # a one-message input: no generator
        native = renders[0][0]
        return len(native) if type(native) is tuple else 1
    return sum(len(native) if type(native) is tuple else 1 for native, _ in renders)


def _entries(
    history: _DoorState,
    messages: Sequence[Message],
    named: str,
    what: str,
    turn_id: str | None = None,
    *,
    pinned: bool = False,
) -> tuple[tuple[_Entry, ...], tuple[int, ...], _DoorIds | None, tuple[Message, ...]]:
    """The batch checked (:meth:`TurnHistory.check_batch`) as entries, each one's size,
    the door's plan of their sent ids when it holds in this state, and the
    messages the entries hold.

    Errors name the batch ``f"turn {excerpt(named)} {what}"``; the label
    is built only when the batch is checked here, not reused from the door.
    The entries hold the messages the check admitted (see
    :func:`~turnloom.context.admit_message`), never an object the
    caller can still change. The door's renders seed the entries' caches; when the door renamed ids
    (its renders are of the messages as sent), the entries carry those ids
    if its plan holds, else the renamed messages' renders are left out.
    """
    memo = _memo(history, messages)
    if _reuse(history, memo, turn_id, pinned, None):
        sizes = memo[1]
    else:
        sizes = _check_batch(
            history, messages, f"turn {excerpt(named)} {what}", turn_id=turn_id, pinned=pinned
        )
    counter = history._shared.counter
    checked, older = history._checked
    renders, gateway, plan, messages = checked[2], checked[3], checked[7], checked[8]
    if plan is not None and plan is not _NO_IDS and (pinned or not plan.holds(history, turn_id)):
        stale, plan = plan.sent, None  # the renders of renamed messages are of other ids
    else:
        stale = None
    entries: tuple[_Entry, ...]
    if renders is not None and gateway is not None:
        # The door's renders of these very messages seed their cache: slot 0's
        # render is the entry's own fields, another slot's goes in ``more``.
        slot = history._shared.gateway_slot(gateway)
        sent = plan.sent if plan is not None else None
        if stale is None and slot == 0:
            if len(messages) == 1:  # a record's usual batch: no comprehension, no zip
                m = messages[0]
                native, encoded = renders[0]
                tokens = count_message_tokens(counter, m)
                entries = (
                    (_Entry(m, tokens, native, encoded),)
                    if sent is None
                    else (_Entry(m, tokens, native, encoded, None, sent[0]),)
                )
            elif sent is None:
                entries = tuple(
                    [
                        _Entry(m, count_message_tokens(counter, m), native, encoded)
                        for m, (native, encoded) in zip(messages, renders, strict=True)
                    ]
                )
            else:
                entries = tuple(
                    [
                        _Entry(m, count_message_tokens(counter, m), native, encoded, None, ids)
                        for m, (native, encoded), ids in zip(messages, renders, sent, strict=True)
                    ]
                )
        else:
            entries = tuple([_Entry(m, count_message_tokens(counter, m)) for m in messages])
            for i, entry in enumerate(entries):
                if stale is not None and stale[i] is not None:
                    continue
                if sent is not None:
                    entry.sent = sent[i]
                entry.seed(slot, *renders[i])
    else:
        entries = tuple([_Entry(m, count_message_tokens(counter, m)) for m in messages])
    if messages is not checked[0]:  # the door held new messages for some of the given ones
        for entry, given in zip(entries, checked[0], strict=True):
            if entry.message is not given:
                entry.given = given  # type: ignore[assignment]
    history._checked = (_UNCHECKED, older)  # consumed: the batch's messages are held now
    return entries, sizes, plan, messages


def _output_renders(
    history: _DoorState,
    turn_id: str,
    gateway: Gateway,
    newest: int | None = None,
    renamed: dict[int, list[tuple[str, str]]] | None = None,
) -> dict[int, Sequence[NativeContent]]:
    """The work of :meth:`TurnHistory.output_renders` (documented there)."""
    for turn in reversed(history._turns):
        if turn.turn_id == turn_id:
            slot = history._shared.gateway_slot(gateway)
            renders: dict[int, Sequence[NativeContent]] = {}
            outputs = turn.outputs
            if newest is not None:
                outputs = outputs[max(0, len(outputs) - newest) :]
            for entry in outputs:
                native = entry.rendered(gateway, slot)[0]
                renders[id(entry.message)] = native if type(native) is tuple else (native,)  # type: ignore[assignment]
                if entry.given is not None:  # the caller's object the door held a new one for
                    renders[id(entry.given)] = renders[id(entry.message)]
                if renamed is not None and entry.sent is not None:
                    calls = [(own, sent) for own, sent in sent_calls(entry) if own != sent]
                    if calls:
                        renamed[id(entry.message)] = calls
                        if entry.given is not None:
                            renamed[id(entry.given)] = calls
            return renders
    return {}


def _item_too_large(where: str, size: int, cap: int) -> ItemTooLargeError:
    """The error for the message at ``where`` of ``size`` bytes, over the per-item ``cap``."""
    return ItemTooLargeError(
        f"{where} is {size} bytes, over the per-item cap of {cap} bytes.", size=size, limit=cap
    )


def _turn_too_large(
    where: str, total: int, max_bytes: int, unit: tuple[_Turn, ...], turn_id: str | None
) -> TurnTooLargeError:
    """The error for a batch that makes its turn (or its tied ``unit``) hold ``total`` bytes."""
    if unit:
        return _tied_error(where, "bytes", total, max_bytes, unit, turn_id)
    return TurnTooLargeError(
        f"{where} would make the turn hold at least {total} bytes, over the "
        f"history's limit of {max_bytes} bytes.",
        unit="bytes",
        size=total,
        limit=max_bytes,
    )

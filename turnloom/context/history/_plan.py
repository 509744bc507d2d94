"""The render plan of a turn: entries rendered as one span, renamed ids, joins."""

from __future__ import annotations

from collections.abc import Sequence

from turnloom.context._untrack import GC_UNTRACK as _GC_UNTRACK
from turnloom.context._untrack import untrack_container, untrack_json
from turnloom.context.callids import (
    CallIdRenamer,
    record_renames,
    rename_call_ids,
    reported_call_ids,
)
from turnloom.context.gateway import Gateway, GatewayType, NativeContent, step_join
from turnloom.context.history._cells import (
    _NO_KEY,
    _call_log,
    _CallLog,
    _Entry,
    _render_message,
    _Rendered,
    _span_key,
    _SpanKey,
    _Turn,
)
from turnloom.context.items import (
    encode_item,
)
from turnloom.context.message import (
    Message,
    Role,
    ToolCallPart,
)
from turnloom.context.pairing import (
    CallTracker,
    OpenCallPolicy,
    complete_pairs,
    is_cancelled_part,
)
from turnloom.context.tokens import TokenCounter, count_tokens


def _render_entries(
    entries: Sequence[_Entry],
    gateway: Gateway,
    slot: int,
    policy: OpenCallPolicy,
    counter: TokenCounter,
    carried: tuple[ToolCallPart, ...] = (),
    answered: frozenset[str] | None = None,
    key: _SpanKey = _NO_KEY,
    store: bool = True,
    wires: Sequence[Message] | None = None,
) -> _Rendered:
    """Render entries as one span with every call/result pair complete (see complete_pairs).

    A message kept as it is costs the tokens counted when it entered; one
    that pairing changed (a call left out, a cancelled result) is counted by
    ``counter`` here. With ``store`` False the entries' caches are read,
    never filled. ``wires``: the entries' messages as sent (``_Entry.wire``),
    when the caller built them already (a renamed one is built at each read).
    """
    # Alive below: an id in ``by_id`` is one of them.
    messages = list(wires) if wires is not None else [e.wire for e in entries]
    by_id = {id(m): e for m, e in zip(messages, entries, strict=True)}
    items: list[NativeContent] = []
    encoded: list[bytes] = []
    tokens = 0
    lead = -1
    completed = complete_pairs(
        messages,
        open_calls=policy,
        carried=carried,
        answered_later=answered,
        join=step_join(gateway),
    )
    for message in completed:
        entry = by_id.get(id(message))
        if lead < 0 and (entry is not None or not _is_cancelled_results(message)):
            lead = len(items)
        if entry is not None:  # the entry's message as sent, unchanged by pairing
            native, native_encoded = entry.rendered(gateway, slot, store, message)
            tokens += entry.tokens
        else:
            native, native_encoded = _render_message(message, gateway)
            tokens += count_tokens(counter, (message,))
        if type(native) is tuple:
            items.extend(native)
            encoded.extend(native_encoded)  # type: ignore[arg-type]
        else:
            items.append(native)  # type: ignore[arg-type]
            encoded.append(native_encoded)  # type: ignore[arg-type]
    rendered = tuple(items)
    if _GC_UNTRACK is not None:
        # Its items are untracked already (by _render_message); CPython keeps
        # a tuple holding dicts tracked, so untrack the tuple itself.
        _GC_UNTRACK(id(rendered))
    lead = len(items) if lead < 0 else lead
    return _Rendered(rendered, tuple(encoded), sum(map(len, encoded)), tokens, key, lead)


def _renamed(
    rendered: _Rendered,
    gateway: Gateway,
    call_ids: CallIdRenamer,
    logs: list[_CallLog | None] | None = None,
) -> _Rendered:
    """``rendered`` with call ids renamed by ``call_ids`` (advanced past it).

    Returns ``rendered`` itself when no id changed; else a new ``_Rendered``
    whose changed items are new objects, encoded and untracked like any
    cached item. With ``logs``, the renaming is recorded as a
    :class:`_CallLog` appended to it, or None when ``call_ids`` has renamed
    no id so far (the items keep their own ids).
    """
    kind = gateway.type
    if logs is None or not call_ids.renamed:
        # Renamed plainly; while nothing was renamed, no log is kept (see _Run).
        items = rename_call_ids(kind, rendered.items, call_ids)
        if logs is not None:
            logs.append(_first_log(kind, rendered.items, items) if call_ids.renamed else None)
    else:
        carriers: list[int] = []
        items, events, ids = record_renames(kind, rendered.items, call_ids, carriers)
        logs.append(_call_log(events, ids, carriers))
    if all(new is old for new, old in zip(items, rendered.items, strict=True)):
        return rendered
    encoded = tuple(
        kept if new is old else encode_item(new)
        for new, old, kept in zip(items, rendered.items, rendered.encoded, strict=True)
    )
    out = tuple(items)
    untrack_json(out)
    # Tokens are those of the messages as recorded: renaming is a wire detail.
    total = sum(map(len, encoded))
    return _Rendered(out, encoded, total, rendered.tokens, rendered.key, rendered.lead)


def _first_log(
    kind: GatewayType, originals: Sequence[NativeContent], renamed: Sequence[NativeContent]
) -> _CallLog:
    """The call log of items ``renamed`` from ``originals`` by a state that had renamed nothing.

    Events and carriers do not depend on the state, so they are recorded
    from a fresh one; the ids are those ``renamed`` carries.
    """
    carriers: list[int] = []
    _, events, _ = record_renames(kind, originals, CallIdRenamer(), carriers)
    ids = reported_call_ids(kind, renamed)
    return _call_log(events, ids, carriers)


def _is_cancelled_results(message: Message) -> bool:
    """True for the message of cancelled results ``complete_pairs`` adds to close calls."""
    return message.role is Role.tool and all(is_cancelled_part(p) for p in message.parts)


def _join(parts: Sequence[_Rendered]) -> _Rendered:
    """Renders one after the other, as one."""
    if len(parts) == 1:
        return parts[0]
    items: list[NativeContent] = []
    encoded: list[bytes] = []
    for part in parts:
        items.extend(part.items)
        encoded.extend(part.encoded)
    total = sum(p.bytes for p in parts)
    out = tuple(items)
    untrack_container(out)  # untracked native items only (CPython keeps such a tuple tracked)
    return _Rendered(out, tuple(encoded), total, sum(p.tokens for p in parts))


class _Plan:
    """How the turns after a run and a turn's input render (computed before any change).

    ``renders[i]`` renders ``turns[i]``; the first ``settled`` of them are
    final (the call group open at their end, if any, ended within ``turns``)
    and may join the run, after which ``carry`` is carried into the next;
    the rest and ``head`` (the turn's input) form the tail rendered for this
    prepare only. Renders are as cached: call ids are renamed by
    :meth:`rename`, in input order.
    """

    __slots__ = ("carry", "head", "renders", "settled")

    def __init__(
        self,
        renders: list[_Rendered],
        settled: int,
        carry: tuple[ToolCallPart, ...],
        head: _Rendered,
    ) -> None:
        self.renders = renders
        self.settled = settled
        self.carry = carry
        self.head = head

    def rename(
        self, gateway: Gateway, call_ids: CallIdRenamer, logs: list[_CallLog | None] | None = None
    ) -> tuple[list[_Rendered], _Rendered, CallIdRenamer]:
        """The settled renders renamed with ``call_ids`` (advancing it), then the tail.

        Returns the renamed settled renders, the tail (the other turns, then
        the head) renamed on a copy, and that copy, advanced past the tail.
        With ``logs``, each settled render's renaming is recorded there
        (:func:`_renamed`), for the run it joins.
        """
        settled = [_renamed(r, gateway, call_ids, logs) for r in self.renders[: self.settled]]
        after = call_ids.copy()
        tail = [_renamed(r, gateway, after) for r in self.renders[self.settled :]]
        tail.append(_renamed(self.head, gateway, after))
        return settled, _join(tail), after


def _plan(
    turns: Sequence[_Turn],
    head: _Turn,
    carry: tuple[ToolCallPart, ...],
    gateway: Gateway,
    slots: tuple[int, int],
    policy: OpenCallPolicy,
    counter: TokenCounter,
    store: bool = True,
) -> _Plan:
    """Pair ``turns`` and then ``head``'s input as one input continuing ``carry``; render them.

    One :class:`~turnloom.context.pairing.CallTracker` pass finds, for each
    turn, the calls carried into it and which of the calls open at its end a
    later turn answers; each turn is then rendered as a span with those (a
    cached render is reused when they are the same), so the spans together
    equal the whole input completed at once. Changes nothing shared except
    the per-turn caches, and not those when ``store`` is False.
    """
    tracker = CallTracker(carry)
    count = len(turns)
    starts: list[tuple[ToolCallPart, ...]] = []
    ends: list[tuple[int, tuple[ToolCallPart, ...]]] = []
    left: dict[int, set[str]] = {}  # group -> ids its end left without a result
    resolved: dict[int, int] = {}  # group -> index of the turn where it ended or was answered
    wires: list[list[Message]] = []  # each turn's messages as sent, built once per plan
    for index, turn in enumerate((*turns, head)):
        starts.append(tuple(tracker.open.values()))
        tracker.new_turn()  # each turn is a span: a step never spans two
        wires.append(turn.wire_messages(index < count))
        for message in wires[-1]:
            group = tracker.group
            step = tracker.feed(message)
            if step.closed:
                left[group] = {c.call_id for c in step.closed}
            if tracker.group != group or not tracker.open:
                resolved.setdefault(group, index)
        ends.append((tracker.group, tuple(tracker.open.values())))
    left.setdefault(tracker.group, set()).update(tracker.open)
    renders: list[_Rendered] = []
    settled = count
    for index, turn in enumerate(turns):
        group, still_open = ends[index]
        answered = frozenset(c.call_id for c in still_open) - left.get(group, set())
        renders.append(
            _render_turn(
                turn,
                gateway,
                slots,
                policy,
                counter,
                True,
                starts[index],
                answered,
                store,
                wires[index],
            )
        )
        if still_open and settled == count and resolved.get(group, count) >= count:
            settled = index  # its open group runs into the input: not final yet
    rendered_head = _render_turn(
        head, gateway, slots, policy, counter, False, starts[count], None, store, wires[count]
    )
    return _Plan(renders, settled, starts[settled], rendered_head)


def _render_turn(
    turn: _Turn,
    gateway: Gateway,
    slots: tuple[int, int],
    policy: OpenCallPolicy,
    counter: TokenCounter,
    whole: bool,
    carried: tuple[ToolCallPart, ...],
    answered: frozenset[str] | None,
    store: bool = True,
    wires: Sequence[Message] | None = None,
) -> _Rendered:
    """The turn (``whole``) or its input rendered as one span, cached per key slot.

    ``carried`` and ``answered`` are :func:`complete_pairs`' ``carried``
    and ``answered_later``. The cache holds one render per (slot, whole)
    and is filled by one assignment of a render that carries its span
    key, so a racing render at worst recomputes it; a private render
    (``store`` False) fills no cache. ``wires``: as :func:`_render_entries`.
    """
    at = (slots[1], whole)
    key = _span_key(carried, answered, policy)
    renders = turn.renders
    cached = renders.get(at) if renders is not None else None
    if cached is not None and cached.key == key:
        return cached
    entries = turn.entries(whole)
    rendered = _render_entries(
        entries, gateway, slots[0], policy, counter, carried, answered, key, store, wires
    )
    if not store:
        return rendered
    if renders is None:
        renders = turn.renders = {}  # a racing render at worst loses one cached value
    renders[at] = rendered
    return rendered

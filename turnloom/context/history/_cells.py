"""The cells of a history: entries, turns and their cached renders."""

from __future__ import annotations

import array
import sys
from collections.abc import Sequence

import msgspec

from turnloom.context._untrack import untrack_atoms, untrack_container, untrack_json
from turnloom.context.callids import (
    CallEvents,
)
from turnloom.context.gateway import Gateway, NativeContent
from turnloom.context.items import (
    encode_item,
)
from turnloom.context.message import (
    Message,
    Part,
    ToolCallPart,
    ToolResultPart,
    layout_with_ids,
)
from turnloom.context.pairing import (
    OpenCallPolicy,
)
from turnloom.errors import (
    ProviderRuleError,
)

_decode = msgspec.json.Decoder().decode


def _ends(copied: array.array[int] | None = None) -> array.array[int]:
    """A new array of int64 offsets (a copy of ``copied``), out of the cyclic collector.

    An array holds machine numbers only, so it can be in no cycle (see
    :func:`~turnloom.context._untrack.untrack_atoms`); a history and every
    render keep a few for as long as they live.
    """
    out = array.array("q") if copied is None else copied[:]
    untrack_atoms(out)
    return out


_Native = NativeContent | tuple[NativeContent, ...]
"""One message rendered: one item bare (the common case), else a tuple of them."""
_Encoded = bytes | tuple[bytes, ...]
"""Their JSON encodings (each item's size is its length), in the same shape."""


def _encode_native(native: _Native) -> _Encoded:
    if type(native) is tuple:
        return tuple(map(encode_item, native))
    return encode_item(native)


def _decode_native(encoded: _Encoded) -> _Native:
    if isinstance(encoded, tuple):
        return tuple(map(_decode, encoded))
    decoded: NativeContent = _decode(encoded)
    return decoded


_WireIds = str | tuple[str, ...]
"""The sent ids of a message's call and result parts: a lone id bare, else a tuple."""


def id_parts(message: Message) -> list[ToolCallPart | ToolResultPart]:
    """The call and result parts of ``message``: the parts that carry a call id, in order."""
    return [
        part for part in message.parts if type(part) is ToolCallPart or type(part) is ToolResultPart
    ]


def own_ids(message: Message) -> list[str]:
    """The call id of each call and result part of ``message``, in part order."""
    return [part.call_id for part in id_parts(message)]


def pack_ids(message: Message, ids: Sequence[str]) -> _WireIds | None:
    """What ``_Entry.sent`` keeps for ``message`` sent with ``ids`` (one per id part).

    None when every id is the part's own; an id equal to its part's own is
    kept as the part's very str (no new string is held).

    Raises:
        ValueError: ``ids`` does not hold one id per call and result part.
    """
    own = own_ids(message)
    if len(own) != len(ids):
        raise ValueError(f"{len(ids)} sent ids for {len(own)} call and result parts")
    if own == list(ids):
        return None
    packed = tuple([o if o == i else i for o, i in zip(own, ids, strict=True)])
    return packed[0] if len(packed) == 1 else packed


def with_ids(message: Message, sent: _WireIds) -> Message:
    """``message`` with its call and result parts carrying the ``sent`` ids (a new Message).

    Layout hints that name call ids (a gateway's ``"ids"`` hints, such as
    Gemini's ids it never sends) name the new ids.
    """
    parts = message.parts
    renamed: dict[str, str] = {}
    if type(sent) is str and len(parts) == 1:
        # A lone part renamed (the common case): a bare id is its one id part's.
        part = parts[0]
        if sent != part.call_id:  # type: ignore[union-attr]
            renamed[part.call_id] = sent  # type: ignore[union-attr]
            new_parts: tuple[Part, ...] = (msgspec.structs.replace(part, call_id=sent),)
        else:
            new_parts = parts
    else:
        ids = iter((sent,) if type(sent) is str else sent)
        changed = list(parts)
        for at, part in enumerate(changed):
            if type(part) is ToolCallPart or type(part) is ToolResultPart:
                call_id = next(ids)
                if call_id != part.call_id:
                    renamed[part.call_id] = call_id
                    changed[at] = msgspec.structs.replace(part, call_id=call_id)
        new_parts = tuple(changed)
    # A copy with the new content: what msgspec.structs.replace gives (its
    # __post_init__ changes only a str or list content), without running it.
    copied: Message = message.__copy__()  # type: ignore[attr-defined]  # msgspec's, in C
    msgspec.structs.force_setattr(copied, "content", new_parts)
    if renamed and message.layout:
        msgspec.structs.force_setattr(copied, "layout", layout_with_ids(message.layout, renamed))
    return copied


class _Entry(msgspec.Struct, gc=False, eq=False):
    """One message of a pinned instruction or a live turn, with its tokens and render cache.

    Its size in bytes is not kept: the turn keeps the sum (an int per
    message would be an object per message).

    A slot's cache is the message's native items and their JSON encoding.
    The native items go when the message's turn joins a run (:meth:`release`);
    the encoding stays when the run holds that very object, so a later
    render decodes it instead of rendering the message again, until no
    native render of the turn is left: then the turn closes and keeps its
    entries' messages, tokens and sent ids only (:class:`_Closed`).
    """

    message: Message
    tokens: int
    # Slot 0's render. ``encoded`` is assigned before ``native``.
    native: _Native | None = None
    encoded: _Encoded | None = None
    more: dict[int, tuple[_Native | None, _Encoded | None]] | None = None  # other slots
    # The id each call and result part of the message is sent with, in part
    # order, when one of them is sent renamed (decided when the message was
    # committed: see ``_sent``); None, the common case, when every id is sent
    # as it is. Only the ids are kept (a lone id bare, else a tuple; an id
    # sent as it is is the message's own str): the message as sent is built
    # from them where it is read (:attr:`wire`), and its renders are cached.
    sent: _WireIds | None = None
    # The caller's object ``message`` was admitted for, when the door held a new
    # message for it (see ``admit_message``); None when ``message`` is that very
    # object. Read for its identity only: a ``build`` continuation holding it is
    # the recorded output (``TurnHistory.output_renders``).
    given: Message | None = None

    @property
    def wire(self) -> Message:
        """The message as the history sends it: ``message`` with the ``sent`` ids in place.

        ``message`` itself when ``sent`` is None; else a new Message (its
        other parts shared with ``message``), built at each read:
        O(the message's parts).
        """
        sent = self.sent
        return self.message if sent is None else with_ids(self.message, sent)

    def sent_ids(self) -> tuple[str, ...]:
        """The id each call and result part is sent with, in part order (see ``sent``)."""
        sent = self.sent
        if sent is None:
            return tuple(own_ids(self.message))
        return (sent,) if type(sent) is str else sent  # type: ignore[return-value]

    def seed(self, slot: int, native: _Native, encoded: _Encoded) -> None:
        """Cache ``native`` (``_render_message``'s result for gateway slot ``slot``)."""
        if slot == 0:
            self.encoded = encoded
            self.native = native
        else:
            if self.more is None:
                self.more = {}
            pair = (native, encoded)
            untrack_json(pair)  # as ``rendered`` does
            self.more[slot] = pair

    def rendered(
        self, gateway: Gateway, slot: int, store: bool = True, wire: Message | None = None
    ) -> tuple[_Native, _Encoded]:
        """The message rendered for ``gateway`` (cache slot ``slot``): items and encodings.

        From the cache, else decoded from the cached encoding, else rendered
        (``wire``: :attr:`wire`, when the caller built it); cached unless
        ``store`` is False (a private render).
        """
        more = None
        if slot == 0:
            native, encoded = self.native, self.encoded
        else:
            more = self.more
            cached = more.get(slot) if more is not None else None
            native, encoded = cached if cached is not None else (None, None)
        if native is not None:
            # A racing release may have dropped the encoding after ``native`` was read.
            return native, encoded if encoded is not None else _encode_native(native)
        if encoded is not None:
            native = _decode_native(encoded)
        else:
            native, encoded = _render_message(self.wire if wire is None else wire, gateway)
        if store:
            if slot == 0:
                untrack_json(native)
                self.encoded = encoded
                self.native = native
            else:
                if more is None:
                    more = self.more = {}  # a racing thread at worst loses one cached value
                pair = (native, encoded)
                untrack_json(pair)  # the pair holds a dict, so CPython would keep it tracked
                more[slot] = pair
        return native, encoded

    def release(self, slot: int, kept: set[int]) -> None:
        """Drop the native render of ``slot``; its encoding too unless ``kept`` holds its ids.

        ``kept``: ``id()`` of the bytes objects the run holds for this
        message's turn (alive while the caller holds them).
        """
        more = self.more
        if slot == 0:
            self.native = None
            encoded = self.encoded
        elif more is None or slot not in more:
            return
        else:
            encoded = more[slot][1]
        if encoded is not None and not all(
            id(e) in kept for e in (encoded if isinstance(encoded, tuple) else (encoded,))
        ):
            encoded = None
        if slot == 0:
            self.encoded = encoded
        elif more is not None:
            if encoded is None:
                del more[slot]
            else:
                more[slot] = (None, encoded)


class _CallLog(msgspec.Struct, gc=False, eq=False):
    """A run turn's call-id events, the ids its items are sent with, and the items with ids.

    See :func:`~turnloom.context.callids.record_renames`: replaying
    ``events`` from a renaming state gives the ids a renaming of the turn's
    original items from that state gives, without visiting the items.
    Built by :func:`_call_log`. Kept per turn, so packed in one flat tuple of
    strings: the events (:data:`~turnloom.context.callids.CallEvents`), then
    the ids, then the carriers as one string of code points (interned: turns
    of one shape share it). Replaying ``packed`` itself replays the events
    (what follows them is not read).
    """

    packed: tuple[str, ...]

    def _count(self) -> int:
        """How many ids the log holds: one per call and result event."""
        packed = self.packed
        return len(packed[0]) - packed[0].count("e") if packed else 0

    @property
    def events(self) -> CallEvents:
        """The recorded events (see :func:`~turnloom.context.callids.record_renames`)."""
        packed = self.packed
        return packed[: len(packed) - 1 - self._count()] if packed else ()

    @property
    def ids(self) -> tuple[str, ...]:
        """The id each call and result of the turn is sent with, in order."""
        packed = self.packed
        return packed[len(packed) - 1 - self._count() : -1] if packed else ()

    @property
    def carriers(self) -> list[int]:
        """The indexes of the turn's items that carry those ids (see record_renames)."""
        return [ord(c) for c in self.packed[-1]] if self.packed else []


_NO_CALLS = _CallLog(())  # a turn without calls or results (shared)


def _call_log(events: CallEvents, ids: Sequence[str], carriers: Sequence[int]) -> _CallLog:
    """The :class:`_CallLog` of a turn; the shared empty one when it has no events."""
    if not events:
        return _NO_CALLS
    return _CallLog((*events, *ids, sys.intern("".join(map(chr, carriers)))))


_SpanKey = tuple[tuple[tuple[str, str], ...], tuple[str, ...] | None]
"""What a turn's render depends on besides its messages: the calls carried into
it (id, name) and, for a span that does not end the input, the ids of its open
calls that a later span answers (None when it ends the input)."""

_NO_KEY: _SpanKey = ((), None)


class _Rendered(msgspec.Struct, gc=False, eq=False):
    """Rendered entries: items, their JSON encodings, total bytes, tokens, the span key."""

    items: tuple[NativeContent, ...]
    encoded: tuple[bytes, ...]
    bytes: int
    tokens: int
    key: _SpanKey = _NO_KEY
    # Items before the first one rendered from an entry: cancelled results
    # closing a call group carried in from an earlier span.
    lead: int = 0


_CacheKey = tuple[Gateway, str]

_Chunks = Sequence[bytes]
"""Encoded items, one JSON ``bytes`` per item."""


def _span_key(
    carried: tuple[ToolCallPart, ...],
    answered: frozenset[str] | None,
    policy: OpenCallPolicy,
) -> _SpanKey:
    if answered is not None and policy == "cancel":
        answered = frozenset()  # under "cancel" a span that goes on changes nothing at its end
    return (
        tuple((c.call_id, c.name) for c in carried),
        None if answered is None else tuple(sorted(answered)),
    )


class _Closed(tuple):  # type: ignore[type-arg]
    """A closed turn's messages, compact: what its entries held but their render caches.

    A turn that joined a run (:meth:`_Turn.release`) is rendered from the
    run's encoded items, so its per-message caches are gone; what remains of
    each of its ``n`` entries is kept in this one tuple, with no object per
    message: ``n``, the messages (input, kept state, outputs, in order), each
    one's tokens, then, only when one is sent renamed, each one's
    :attr:`_Entry.sent` (None where its ids are its own). Holds ints,
    messages, str and tuples of str only: in no cycle, and out of the cyclic
    collector (CPython never untracks a tuple subclass by itself).
    """

    __slots__ = ()

    @classmethod
    def of(cls, entries: Sequence[_Entry]) -> _Closed:
        """The compact form of ``entries`` (their messages, tokens and sent ids)."""
        sent = [e.sent for e in entries]
        renamed = sent.count(None) != len(sent)
        packed = cls(
            (
                len(entries),
                *[e.message for e in entries],
                *[e.tokens for e in entries],
                *(sent if renamed else ()),
            )
        )
        untrack_container(packed)
        return packed

    @property
    def size(self) -> int:
        """How many messages the turn holds."""
        size: int = self[0]
        return size

    @property
    def messages(self) -> tuple[Message, ...]:
        """The turn's messages, in order (a new tuple)."""
        return self[1 : 1 + self[0]]

    def sent_ids(self) -> tuple[_WireIds | None, ...] | None:
        """Each message's :attr:`_Entry.sent`, in order, or None when all are None."""
        start = 1 + 2 * self[0]
        return self[start:] if len(self) > start else None

    def entries(self, start: int, stop: int) -> tuple[_Entry, ...]:
        """New entries (no render cached) for messages ``start`` to ``stop - 1``."""
        size = self[0]
        tokens = 1 + size
        if len(self) == 1 + 2 * size:
            return tuple([_Entry(self[1 + i], self[tokens + i]) for i in range(start, stop)])
        sent = tokens + size
        return tuple(
            [
                _Entry(self[1 + i], self[tokens + i], None, None, None, self[sent + i])
                for i in range(start, stop)
            ]
        )

    def wire(self, index: int) -> Message:
        """Message ``index`` as the history sends it (see :attr:`_Entry.wire`)."""
        message: Message = self[1 + index]
        at = 1 + 2 * self[0] + index
        wire_ids = self[at] if at < len(self) else None
        return message if wire_ids is None else with_ids(message, wire_ids)


def _cached(entry: _Entry) -> bool:
    """True while ``entry`` holds a native render (for any gateway slot)."""
    if entry.native is not None:
        return True
    more = entry.more
    return more is not None and any(pair[0] is not None for pair in more.values())


class _Turn(msgspec.Struct, gc=False, eq=False):
    """A snapshot of one turn. A change of what it holds makes a new ``_Turn``.

    ``cells`` is the whole turn: its input, its kept ``state``, then its
    outputs (``n_input`` and ``n_state`` messages, the rest outputs), as
    entries with their render caches while the turn is live, and once it
    joined a run and its native renders went (:meth:`release`) in the
    compact form of :class:`_Closed`. Closing assigns ``cells`` once and
    changes no value a reader sees: :attr:`input`, :attr:`outputs`,
    :attr:`state` and :meth:`entries` of a closed turn are new entries
    (without render caches) equal to the ones it had, and :meth:`messages`
    the same message objects. Read ``cells`` once per read (a render in a
    worker thread may close the turn meanwhile).

    ``renders`` holds the whole turn and its input rendered, by (render key
    slot, whole turn), each for the span key it holds (a cache of one per
    key), while the turn is live. ``bytes``, ``tokens`` and ``items``
    count the whole turn, ``state_bytes`` the kept state alone.
    """

    turn_id: str
    cells: tuple[_Entry, ...] | _Closed
    n_input: int
    n_state: int
    bytes: int
    tokens: int
    serial: int  # the history's commit count when it was committed: unique in the history
    state_bytes: int = 0
    renders: dict[tuple[int, bool], _Rendered] | None = None

    @classmethod
    def of(
        cls,
        turn_id: str,
        input: tuple[_Entry, ...],
        outputs: tuple[_Entry, ...],
        bytes: int,
        tokens: int,
        serial: int,
        state: tuple[_Entry, ...] = (),
        state_bytes: int = 0,
    ) -> _Turn:
        """A live turn of ``input``, kept ``state`` and ``outputs`` (``bytes`` and ``tokens``
        their sums, ``state_bytes`` the state's size)."""
        return cls(
            turn_id,
            input + state + outputs,
            len(input),
            len(state),
            bytes,
            tokens,
            serial,
            state_bytes,
        )

    @property
    def closed(self) -> bool:
        """True once the turn is kept in the compact form (see the class docstring)."""
        return type(self.cells) is _Closed

    @property
    def items(self) -> int:
        cells = self.cells
        return cells.size if type(cells) is _Closed else len(cells)

    def _slice(self, start: int, stop: int | None) -> tuple[_Entry, ...]:
        cells = self.cells
        if type(cells) is _Closed:
            return cells.entries(start, cells.size if stop is None else stop)
        if not start and stop is None:
            return cells  # whole: the tuple itself, no copy
        return cells[start:stop]

    @property
    def input(self) -> tuple[_Entry, ...]:
        """The input's entries, in order."""
        return self._slice(0, self.n_input)

    @property
    def state(self) -> tuple[_Entry, ...]:
        """The kept state's entries, in order (often ``()``)."""
        if not self.n_state:
            return ()
        return self._slice(self.n_input, self.n_input + self.n_state)

    @property
    def outputs(self) -> tuple[_Entry, ...]:
        """The outputs' entries, in order."""
        return self._slice(self.n_input + self.n_state, None)

    @property
    def output_count(self) -> int:
        """How many outputs the turn holds (O(1))."""
        return self.items - self.n_input - self.n_state

    def entries(self, whole: bool) -> tuple[_Entry, ...]:
        """The whole turn's entries (input, kept state, outputs), or its input only."""
        return self._slice(0, None if whole else self.n_input)

    def messages(self, whole: bool) -> list[Message]:
        """The turn's messages (``whole``), or its input only."""
        cells = self.cells
        stop = None if whole else self.n_input
        if type(cells) is _Closed:
            return list(cells.messages[:stop])
        return [e.message for e in cells[:stop]]

    def last_message(self) -> Message | None:
        """The turn's last message (of its input, kept state, then outputs), or None."""
        cells = self.cells
        if type(cells) is _Closed:
            return cells[cells.size] if cells.size else None
        return cells[-1].message if cells else None

    def recorded(self) -> list[Message]:
        """The turn's input then outputs (its kept state left out), in order."""
        cells = self.cells
        n_input, n_state = self.n_input, self.n_state
        if type(cells) is _Closed:
            messages = cells.messages
            if not n_state:
                return list(messages)
            return [*messages[:n_input], *messages[n_input + n_state :]]
        entries: tuple[_Entry, ...] = cells
        if n_state:
            entries = entries[:n_input] + entries[n_input + n_state :]
        return [e.message for e in entries]

    def wire_messages(self, whole: bool) -> list[Message]:
        """:meth:`messages` as the history sends them (renamed call ids: ``_Entry.wire``)."""
        cells = self.cells
        if type(cells) is _Closed:
            count = cells.size if whole else self.n_input
            return [cells.wire(i) for i in range(count)]
        return [e.wire for e in cells[: None if whole else self.n_input]]

    def reopened(self) -> _Turn:
        """A new live turn equal to this one, without its renders: its entries (shared) if
        it is live, new ones if it is closed. For entries changed in place: a render in a
        worker thread may close this turn meanwhile, reading its entries once."""
        return _Turn(
            self.turn_id,
            self.entries(True),
            self.n_input,
            self.n_state,
            self.bytes,
            self.tokens,
            self.serial,
            self.state_bytes,
        )

    def with_entries(self, entries: tuple[_Entry, ...]) -> _Turn:
        """A live turn holding ``entries`` in place of :meth:`entries` (as many, in the same
        places), with the same counts: for entries that only change their sent ids."""
        return _Turn(
            self.turn_id,
            entries,
            self.n_input,
            self.n_state,
            self.bytes,
            self.tokens,
            self.serial,
            self.state_bytes,
        )

    def with_outputs(self, added: tuple[_Entry, ...], added_bytes: int) -> _Turn:
        """This turn with ``added`` outputs (``added_bytes`` their size)."""
        tokens = self.tokens
        for entry in added:
            tokens += entry.tokens
        cells = self.cells
        return _Turn(
            self.turn_id,
            (self.entries(True) if type(cells) is _Closed else cells) + added,
            self.n_input,
            self.n_state,
            self.bytes + added_bytes,
            tokens,
            self.serial,
            self.state_bytes,
        )

    def with_state(self, state: tuple[_Entry, ...], state_bytes: int) -> _Turn:
        """This turn keeping ``state`` (``state_bytes`` its size) in place of its own."""
        old = self.state
        return _Turn.of(
            self.turn_id,
            self.input,
            self.outputs,
            self.bytes + state_bytes - self.state_bytes,
            self.tokens + sum(e.tokens for e in state) - sum(e.tokens for e in old),
            self.serial,
            state,
            state_bytes,
        )

    def release(self, slots: tuple[int, int], kept: _Chunks) -> None:
        """Drop this turn's native renders: it joined a run, which holds ``kept`` (its chunk).

        Its cached whole and input renders (key slot ``slots[1]``) go, and
        each message's native items for gateway slot ``slots[0]``; a
        message's encoding stays when ``kept`` holds those very bytes. Once
        no native render is left (of any slot), the turn is closed: its
        entries give way to their compact form (:class:`_Closed`), and the
        kept encodings go with them.
        """
        gateway_slot, key_slot = slots
        renders = self.renders
        if renders is not None:
            renders.pop((key_slot, True), None)
            renders.pop((key_slot, False), None)
        cells = self.cells
        if type(cells) is _Closed:
            return
        held = set(map(id, kept))
        for entry in cells:
            entry.release(gateway_slot, held)
        if not renders and not any(map(_cached, cells)):
            self.renders = None
            self.cells = _Closed.of(cells)


def _render_message(message: Message, gateway: Gateway) -> tuple[_Native, _Encoded]:
    """Render one message: a lone item and its JSON encoding bare, else tuples.

    Each item is untracked (see :func:`~turnloom.context._untrack.untrack_json`)
    once the JSON encoder has encoded it (which sizes it; the encoding is kept).
    """
    items = gateway.render(message)
    if len(items) == 1:
        item = items[0]
        encoded = encode_item(item)
        untrack_json(item)
        return item, encoded
    encodings = tuple(map(encode_item, items))
    native = tuple(items)
    untrack_json(native)
    return native, encodings


def _render_checked(
    message: Message, gateway: Gateway, where: str, index: int
) -> tuple[_Native, _Encoded]:
    """:func:`_render_message` at the door: a provider rule names ``where[index]``.

    Raises:
        ProviderRuleError: ``gateway`` cannot render ``message``.
    """
    try:
        return _render_message(message, gateway)
    except ProviderRuleError as exc:
        raise ProviderRuleError(f"{where}[{index}]: {exc}", exc.violations) from exc

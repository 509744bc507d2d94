"""``TurnHistory``: the bounded history of one context, kept in whole turns.

A history holds the pinned instructions
(``system`` and ``developer`` messages) and a sequence of committed turns,
oldest first. A turn is its input (the committed user messages), then its
*kept state* if any (messages the host kept in place, the runtime-state pair
its model was sent: :meth:`TurnHistory.keep_state`), then its outputs (model
messages and tool results recorded while answering it). A turn renders its
kept state only once it is an earlier turn: the render of a turn's own input
never holds it.

Limits count turns, items (neutral messages), bytes (the JSON encoding of
each message, see :func:`~turnloom.context.check_message`) and, optionally,
tokens (each message counted once, when it enters, by the history's
:class:`~turnloom.context.TokenCounter`). Eviction drops
whole turns, oldest first, and never the newest turn; a turn whose input
answers tool calls of the turn before it leaves only together with that turn
(see :class:`TurnHistory`). Pinned instructions are neither evicted nor
counted. A per-item byte cap rejects one oversized message before anything
changes.

Rendering is incremental. A view (:meth:`TurnHistory.view`) is an immutable
snapshot taken in O(1), so the event loop does no work proportional to the
history. :meth:`HistoryView.render` runs in a worker thread: each message is
rendered once per gateway (its native items and their JSON encoding, which
sizes them) and cached, each turn's items are cached, and the items of the
pinned instructions and all closed turns are kept as one run that is changed
in place (evicted turns dropped at the front by moving its start, newly
closed turns appended; once a sixteenth of it is dropped it is compacted into
new containers). A render does work only for new and evicted items, and
hands the run's encoded items out without a copy (the run only appends to
the containers it handed out), so :meth:`HistoryView.render_bounded` can
promise a small, bounded step that the event loop may take.

Closed turns are kept encoded. When a turn joins the run, the run keeps its
items only as JSON bytes (one ``bytes`` object per item, shared with the
encoded request body, :class:`~turnloom.context.body.BodyRun`) and the turn's
native renders are dropped from the per-message and per-turn caches (a
message's encoding stays cached when the run holds that very object). A
render hands its items out as :class:`~turnloom.context.items.NativeItems`,
decoded on first read (:attr:`RenderedHistory.items`), so the history holds
each closed turn once, encoded, besides its messages. A rebuilt run (below)
decodes the cached encodings, or renders again the messages whose encoding
was dropped (those the run renamed).

Call ids: a history may reuse a call id in a later turn; a rendered input
carries each call id once, by the rule of :mod:`turnloom.context.callids`.
The run applies it to each closed turn once, when the turn joins it, so a
rename depends only on the items before it and the run stays a byte-stable
prefix while only appends happen. The turns rendered per prepare and the
turn's input continue from the run's state (:attr:`RenderedHistory.call_ids`).
Eviction forgets the evicted items' ids; when a rename of a kept item
depended on an evicted item (the evicted turn held the first use of a reused
id), the kept items rename differently and are renamed anew after the
pinned instructions: a turn replays the call-id events recorded for it
the first time (O(its calls)), only items whose ids change are encoded
again, and the encoded body is rebuilt in one pass over the kept items,
so the run always equals a render of the kept history.

Thread safety: mutate a :class:`TurnHistory` from one thread (the event loop).
Views are immutable and may be rendered from any number of worker threads at
once: per-message and per-turn caches are filled and dropped by single
assignments (a racing render at worst recomputes a value), and the shared
run is changed only under a lock. A view older than the run renders
privately, without filling the caches.

Garbage-collector cost: neither the per-message and per-turn bookkeeping
nor (on CPython) the cached native items of open turns are tracked by
Python's cyclic collector (see the comment above ``_Entry`` and
:func:`~turnloom.context._untrack.untrack_json`), and the run holds bytes
in untracked lists, so a held history adds a few tracked objects per
history, and no reference per message, to what a full collection visits.
"""

from __future__ import annotations

__all__ = (
    "HistoryCounts",
    "HistoryLimits",
    "HistoryStatistics",
    "HistoryView",
    "RenderedHistory",
    "TurnHistory",
    "check_batch_length",
    "check_id",
    "reject_instructions",
)

import array
import bisect
import gc
import itertools
import operator
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import cast

import msgspec

from turnloom.context._fresh import fresh_messages
from turnloom.context._untrack import GC_UNTRACK as _GC_UNTRACK
from turnloom.context._untrack import untrack_atoms, untrack_container, untrack_json
from turnloom.context.body import BodyRun, EncodedBody, body_writer
from turnloom.context.callids import (
    CallEvents,
    CallIdRenamer,
    record_renames,
    rename_call_ids,
    reported_call_ids,
    restore_call_ids,
)
from turnloom.context.gateway import Gateway, GatewayType, NativeContent, step_join
from turnloom.context.items import (
    ChunkedSpan,
    NativeItems,
    compaction_due,
    decode_joined,
    encode_item,
    split_chunk,
)
from turnloom.context.message import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Message,
    Part,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    check_message,
    is_blank_text,
)
from turnloom.context.pairing import (
    CANCELLED_RESULT_TEXT,
    CallTracker,
    OpenCallPolicy,
    check_steps,
    complete_pairs,
)
from turnloom.context.scope import ContextScope, scope_indices
from turnloom.context.tokens import ApproxTokenCounter, TokenCounter, count_tokens
from turnloom.errors import (
    AmbiguousStepError,
    DuplicateIdError,
    InputError,
    InstructionMessageError,
    InvalidArgumentError,
    InvalidMessageError,
    ItemTooLargeError,
    OutOfOrderTurnError,
    PairedTurnsTooLargeError,
    ProviderRuleError,
    StateError,
    StrandedResultsError,
    TurnTooLargeError,
    UnknownTurnError,
    excerpt,
)

_decode = msgspec.json.Decoder().decode
_DEFAULT_COUNTER = ApproxTokenCounter()
_PINNED_ROLES = (Role.system, Role.developer)
_MAX_ID_LENGTH = 256


def reject_instructions(messages: Sequence[object], field: str, where: str, start: int = 0) -> None:
    """No mid-conversation instructions: refuse ``system`` and ``developer`` messages.

    Pinned instructions change only through a committed turn's
    ``instructions``; a turn's input, a model output, a tool result or a
    continuation never carries one, so none lands mid-history. Items that are
    not Messages are left to the message checks. ``messages[:start]`` passed
    this check already and are skipped.

    Raises:
        InstructionMessageError: ``messages[i]`` has role ``system`` or
            ``developer``; ``field`` is ``f"{field}[{i}]"``.
    """
    i = _first_instruction(messages, start)
    if i >= 0:
        role = cast("Message", messages[i]).role
        raise InstructionMessageError(
            f"{where}[{i}] is a {role!s} message; pinned instructions change "
            "only through a turn snapshot's instructions, never mid-conversation.",
            field=f"{field}[{i}]",
            role=str(role),
        )


def _first_instruction(messages: Sequence[object], start: int = 0) -> int:
    """The index of the first ``system`` or ``developer`` Message from ``start``, else -1.

    The rule :func:`reject_instructions` enforces; a caller that builds the
    error's label only when it is needed tests with this first.
    """
    for i in range(start, len(messages)):
        message = messages[i]
        if isinstance(message, Message) and message.role in _PINNED_ROLES:
            return i
    return -1


class HistoryLimits(msgspec.Struct, frozen=True, kw_only=True):
    """The bounds of one context's history.

    Attributes:
        max_turns: most turns kept (default 32).
        max_items: most messages kept across all turns (default 4,096); one
            turn never holds more (its input, or its messages once recorded),
            nor more pinned instructions than this.
        max_bytes: most bytes of serialized messages kept (default 8 MiB), and
            the most one turn holds. This bounds retained content, not
            process memory: besides the turns kept, a history holds aside
            the turns evicted since its newest commit until its next change
            (so that retracting that turn restores them, see
            :meth:`TurnHistory.retract`), at most the turns held when that
            turn was committed.
        max_item_bytes: the per-item cap: one message larger than this, in
            bytes, is rejected when it is committed or recorded (default 1 MiB).
        max_tokens: most tokens of messages kept across all turns, counted by
            the history's token counter (the Foundation's); ``None`` (default)
            for no token bound.

    Raises:
        InvalidArgumentError: a limit is not a positive integer (``field``
            names it; ``max_tokens`` may also be ``None``).
    """

    max_turns: int = 32
    max_items: int = 4096
    max_bytes: int = 8 * 1024 * 1024
    max_item_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_items", "max_bytes", "max_item_bytes", "max_tokens"):
            value = getattr(self, name)
            if value is None and name == "max_tokens":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidArgumentError(
                    f"History limit {name} must be a positive integer, not {excerpt(value)}.",
                    field=name,
                )


HistoryCounts = tuple[int, int, int, int, int, int, int, int, int, int]
"""What :meth:`TurnHistory.counts` returns: ``(turns, items, bytes, tokens,
evicted_turns, evicted_items, dropped_late_outputs, dropped_blank_outputs,
duplicate_outputs, retracted_turns)``, as in :class:`HistoryStatistics`."""


class HistoryStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A frozen snapshot of one history's counters.

    Attributes:
        turns: turns kept.
        items: messages kept in those turns (pinned instructions excluded),
            kept state messages (:meth:`TurnHistory.keep_state`) included;
            ``bytes`` and ``tokens`` count them too.
        bytes: serialized size of those messages, in bytes.
        pinned_items: pinned instruction messages (not counted in ``items``).
        pinned_bytes: their serialized size, in bytes.
        evicted_turns: turns evicted for good since the history was created.
            The turns the evictions since the newest commit dropped are held
            aside (``restorable_turns``) and counted here once they can no
            longer be restored: at the history's next change but a
            retraction of that turn, which restores them (see
            :meth:`TurnHistory.retract`).
        evicted_items: messages evicted with them.
        evicted_bytes: bytes evicted with them.
        dropped_late_outputs: messages recorded for a turn no longer held
            (evicted or retracted), dropped.
        dropped_blank_outputs: empty or whitespace-only messages not recorded.
        duplicate_outputs: messages recorded again with an id and content
            already held in their turn, not stored again.
        retracted_turns: turns retracted since the history was created.
        tokens: tokens of the kept messages (pinned instructions excluded),
            by the history's token counter.
        pinned_tokens: tokens of the pinned instructions.
        evicted_tokens: tokens evicted with the evicted turns.
        restorable_turns: turns evicted since the newest commit, held aside
            until the history's next change: a retraction of the newest turn
            restores them, else they count in ``evicted_turns``. Neither in
            ``turns`` nor in ``evicted_turns``.
    """

    turns: int
    items: int
    bytes: int
    pinned_items: int
    pinned_bytes: int
    evicted_turns: int
    evicted_items: int
    evicted_bytes: int
    dropped_late_outputs: int
    dropped_blank_outputs: int
    duplicate_outputs: int = 0
    retracted_turns: int = 0
    tokens: int = 0
    pinned_tokens: int = 0
    evicted_tokens: int = 0
    restorable_turns: int = 0


def _ends(copied: array.array[int] | None = None) -> array.array[int]:
    """A new array of int64 offsets (a copy of ``copied``), out of the cyclic collector.

    An array holds machine numbers only, so it can be in no cycle (see
    :func:`~turnloom.context._untrack.untrack_atoms`); a history and every
    render keep a few for as long as they live.
    """
    out = array.array("q") if copied is None else copied[:]
    untrack_atoms(out)
    return out


class RenderedHistory:
    """The native items of a history up to and including one turn's input.

    Attributes:
        items: tuple of NativeContent, oldest first: pinned instructions, the
            turns before the turn, then the turn's input. Decoded from
            ``native_items`` on first read (the closed turns are kept
            encoded) and kept; each read returns a new copy of them
            (:meth:`~turnloom.context.items.NativeItems.materialize`: new
            dicts and lists, shared with nothing), which the caller may change
            without changing any later render or input.
        native_items: the same items as :class:`~turnloom.context.items.NativeItems`,
            the closed turns still encoded (nothing decoded until read).
        item_count: ``len(items)``.
        bytes: serialized size of ``items`` (the sum of each item's JSON
            encoding), in bytes.
        tokens: tokens of the messages ``items`` render, by the history's
            token counter (each message counted once, when it entered).
        turn_start: index in ``items`` of the turn's first input item.
        call_ids: the call-id renaming state after ``items`` (see
            :mod:`turnloom.context.callids`): continue it over items appended
            to this input so their call ids stay unique. Owned by the caller.
        body: the gateway's request body of ``items``, with the body items
            of the pinned instructions and the closed turns kept encoded by
            the render cache (:class:`~turnloom.context.body.EncodedBody`):
            ``body.encode()`` equals
            ``msgspec.json.encode(gateway.request_body(items))`` and costs
            O(items after the cached run) plus one copy of the body's bytes.
            None for a private render (an older view,
            :meth:`HistoryView.render_scoped`) or a gateway without a body
            writer.
    """

    __slots__ = (
        "_pinned",
        "_run",
        "_tail",
        "body",
        "bytes",
        "call_ids",
        "item_count",
        "native_items",
        "tokens",
        "turn_start",
    )

    def __init__(
        self,
        pinned: _Rendered,
        tail: _Rendered,
        call_ids: CallIdRenamer,
        tokens: int,
        run: _Run | None = None,
        body: EncodedBody | None = None,
    ) -> None:
        self._pinned = pinned
        self._tail = tail  # everything after the run: unsettled turns, then the turn's input
        if run is None:
            self._run = _NO_SPAN
            native = NativeItems(pinned.items, (), tail.items)
        else:
            # The run's containers as they stand, without a copy: the run
            # only appends to them (or replaces them) while this lives.
            self._run = run.span()
            native = NativeItems(pinned.items, self._run, tail.items, run.epoch, run.origin)
        self.native_items = native
        self.item_count = len(pinned.items) + len(self._run) + len(tail.items)
        self.body = body
        self.call_ids = call_ids
        self.turn_start = 0
        self.bytes: int = pinned.bytes + self._run.size + tail.bytes
        self.tokens = tokens
        if type(self) is RenderedHistory and not any(map(gc.is_tracked, (native, body, call_ids))):
            # Its slots only ever hold two _Rendered (gc=False: see below),
            # a ChunkedSpan (bytes and ints), ints, and objects out of the
            # collector by their own proofs: its NativeItems (of those
            # renders' items), its body (a history body cache's snapshot) or
            # None, and a CallIdRenamer. Nothing it refers to can lead back to
            # it, so it can be in no cycle (a delivered prefix keeps one).
            untrack_atoms(self)

    @property
    def items(self) -> tuple[NativeContent, ...]:
        """A new copy of the items (see the class docstring), decoded on first read."""
        return self.native_items.materialize()

    def bytes_before(self, count: int) -> int:
        """Serialized size of ``items[:count]``, in bytes.

        Costs O(1) within the pinned instructions' and closed turns' items,
        else O(items after them), never a pass over the whole history.
        """
        count = max(0, min(count, self.item_count))
        pinned = self._pinned
        if count <= len(pinned.items):
            return sum(map(len, pinned.encoded[:count]))
        count -= len(pinned.items)
        run = self._run
        if count > len(run):
            inside = sum(map(len, self._tail.encoded[: count - len(run)]))
            return pinned.bytes + run.size + inside
        return pinned.bytes + run.size_before(count)


# Garbage-collector cost. A held history keeps one _Entry per message and one
# _Turn and a few _Rendered per turn. They are msgspec Structs with
# ``gc=False``: the cyclic collector never tracks them, so a full collection
# does not visit them, and the tuples and dicts holding only them (turn
# inputs and outputs, per-slot caches) are untracked by the collector too.
# This is safe because no reference cycle can pass through them:
#
# * they refer only to messages (JSON data, untracked themselves), str, bytes
#   and int values, tuples and int-keyed dicts of each other (a turn to its
#   entries and renders, never back), and native items;
# * native items were JSON-encoded when rendered (``_render_message``) or
#   decoded from JSON, so each is a finite tree of JSON values, which cannot
#   hold a cycle or refer to anything outside itself;
# * gateways (which may refer to anything, a manager for example) are never
#   stored in them: caches are indexed by a small int slot, and the
#   slot -> gateway map lives in the (tracked) ``_Shared``;
# * none of them is reachable from outside this module except through
#   ``RenderedHistory``, which is tracked and only refers to them.
#
# Slot 0 is the first gateway (and render key) the history is rendered with,
# in practice the manager's only gateway: its render goes in fields, with no
# container at all when a message renders to one item. Other slots use a
# small dict per entry or turn.

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


class _Entry(msgspec.Struct, gc=False, eq=False):
    """One message of a history with its tokens and render cache (see above).

    Its size in bytes is not kept: the turn keeps the sum (an int per
    message would be an object per message).

    A slot's cache is the message's native items and their JSON encoding.
    The native items go when the message's turn joins a run (:meth:`release`);
    the encoding stays when the run holds that very object, so a later
    render decodes it instead of rendering the message again.
    """

    message: Message
    tokens: int
    # Slot 0's render. ``encoded`` is assigned before ``native``.
    native: _Native | None = None
    encoded: _Encoded | None = None
    more: dict[int, tuple[_Native | None, _Encoded | None]] | None = None  # other slots

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

    def rendered(self, gateway: Gateway, slot: int, store: bool = True) -> tuple[_Native, _Encoded]:
        """The message rendered for ``gateway`` (cache slot ``slot``): items and encodings.

        From the cache, else decoded from the cached encoding, else rendered;
        cached unless ``store`` is False (a private render).
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
            native, encoded = _render_message(self.message, gateway)
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


class _Turn(msgspec.Struct, gc=False, eq=False):
    """An immutable snapshot of one turn. A change makes a new ``_Turn``.

    ``full`` and ``head`` are the whole turn and its input rendered for render
    key slot 0, each for the span key it holds (a cache of one); ``more``
    holds other slots, by (slot, whole turn). The whole turn is its input,
    its kept ``state``, then its outputs; ``bytes``, ``tokens`` and ``items``
    count all three, ``state_bytes`` the kept state alone.
    """

    turn_id: str
    input: tuple[_Entry, ...]
    outputs: tuple[_Entry, ...]
    bytes: int
    tokens: int
    serial: int  # the history's commit count when it was committed: unique in the history
    state: tuple[_Entry, ...] = ()  # the kept state, between the input and the outputs
    state_bytes: int = 0
    full: _Rendered | None = None
    head: _Rendered | None = None
    more: dict[tuple[int, bool], _Rendered] | None = None

    @property
    def items(self) -> int:
        return len(self.input) + len(self.state) + len(self.outputs)

    def entries(self, whole: bool) -> tuple[_Entry, ...]:
        """The whole turn's entries (input, kept state, outputs), or its input only."""
        return self.input + self.state + self.outputs if whole else self.input

    def messages(self, whole: bool) -> list[Message]:
        """The turn's messages (``whole``), or its input only."""
        return [e.message for e in self.entries(whole)]

    def with_outputs(self, added: tuple[_Entry, ...], added_bytes: int) -> _Turn:
        """This turn with ``added`` outputs (``added_bytes`` their size)."""
        tokens = self.tokens
        for entry in added:
            tokens += entry.tokens
        return _Turn(
            self.turn_id,
            self.input,
            self.outputs + added,
            self.bytes + added_bytes,
            tokens,
            self.serial,
            self.state,
            self.state_bytes,
        )

    def with_state(self, state: tuple[_Entry, ...], state_bytes: int) -> _Turn:
        """This turn keeping ``state`` (``state_bytes`` its size) in place of its own."""
        old = self.state
        return _Turn(
            self.turn_id,
            self.input,
            self.outputs,
            self.bytes + state_bytes - self.state_bytes,
            self.tokens + sum(e.tokens for e in state) - sum(e.tokens for e in old),
            self.serial,
            state,
            state_bytes,
        )

    def render(
        self,
        gateway: Gateway,
        slots: tuple[int, int],
        policy: OpenCallPolicy,
        counter: TokenCounter,
        whole: bool,
        carried: tuple[ToolCallPart, ...],
        answered: frozenset[str] | None,
        store: bool = True,
    ) -> _Rendered:
        """The turn (``whole``) or its input rendered as one span, cached per key slot.

        ``carried`` and ``answered`` are :func:`complete_pairs`' ``carried``
        and ``answered_later``. The cache holds one render per (slot, whole)
        and is filled by one assignment of a render that carries its span
        key, so a racing render at worst recomputes it; a private render
        (``store`` False) fills no cache.
        """
        slot = slots[1]
        key = _span_key(carried, answered, policy)
        if slot == 0:
            cached = self.full if whole else self.head
        else:
            cached = self.more.get((slot, whole)) if self.more is not None else None
        if cached is not None and cached.key == key:
            return cached
        entries = self.entries(whole)
        rendered = _render_entries(
            entries, gateway, slots[0], policy, counter, carried, answered, key, store
        )
        if not store:
            return rendered
        if slot == 0:
            if whole:
                self.full = rendered
            else:
                self.head = rendered
        else:
            if self.more is None:
                self.more = {}
            self.more[(slot, whole)] = rendered
        return rendered

    def release(self, slots: tuple[int, int], kept: _Chunks) -> None:
        """Drop this turn's native renders: it joined a run, which holds ``kept`` (its chunk).

        Its cached whole and input renders (key slot ``slots[1]``) go, and
        each message's native items for gateway slot ``slots[0]``; a
        message's encoding stays when ``kept`` holds those very bytes.
        """
        gateway_slot, key_slot = slots
        if key_slot == 0:
            self.full = self.head = None
        elif self.more is not None:
            self.more.pop((key_slot, True), None)
            self.more.pop((key_slot, False), None)
        held = set(map(id, kept))
        for entry in self.entries(True):
            entry.release(gateway_slot, held)


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


class _Run:
    """The rendered items of the pinned instructions and the closed turns.

    ``pinned`` is the pinned instructions' render (native, with encodings).
    The closed turns' items are kept only encoded, renamed as the run sends
    them: ``chunks`` holds one ``bytes`` per turn, its items' JSON joined by
    ``,`` (see :class:`~turnloom.context.items.ChunkedSpan`), and
    ``offsets`` where each item ends in running bytes, oldest first, after
    ``skip`` slots dropped at the front. Per turn, oldest first, after
    ``dead`` slots dropped at the front: its chunk, ``item_ends`` and ``byte_ends``
    (where it ends, in items and bytes, in running coordinates that begin
    at ``origin`` and ``base`` and are never rebased), ``turn_tokens``,
    ``turn_carried`` (1 when calls of an earlier turn were carried into it)
    and ``calls``: its :class:`_CallLog` (its call-id events, the ids its
    items are sent with and which items carry them), recorded when the run
    renamed it, or None while no call id of the run was renamed (its items
    carry their own ids, and no log is kept). ``last`` is the newest turn in
    the run. ``origin`` counts the
    items dropped at the front since ``epoch`` (an object made per run)
    began, so renders of the same run can tell shared items apart
    (:class:`~turnloom.context.items.NativeItems`). ``call_ids`` and
    ``carry`` are the call-id renaming and pairing states after the items.
    Dropping turns at the front moves ``skip`` and ``dead`` only, so a
    render hands out the containers as they stand, without copying them
    (the run only appends to them); :meth:`compact` replaces them once
    enough is dropped.
    ``body`` keeps the request body of the items encoded, one segment per
    turn: segment 0 is the pinned instructions, the run's first turn is
    segment ``first_tag``. Guarded by ``_Shared.lock``.
    """

    __slots__ = (
        "base",
        "body",
        "byte_ends",
        "call_ids",
        "calls",
        "carry",
        "chunks",
        "dead",
        "epoch",
        "evicted",
        "first_tag",
        "generation",
        "item_ends",
        "last",
        "offsets",
        "origin",
        "pinned",
        "pinned_entries",
        "skip",
        "tokens",
        "turn_carried",
        "turn_tokens",
    )

    def __init__(
        self,
        pinned_entries: tuple[_Entry, ...],
        pinned: _Rendered,
        evicted: int,
        generation: int,
        call_ids: CallIdRenamer,
    ) -> None:
        self.pinned_entries = pinned_entries
        self.pinned = pinned
        self.chunks: list[bytes] = []
        # Bytes only, so in no cycle: out of the cyclic collector, so a full
        # collection visits no reference per turn.
        untrack_container(self.chunks)
        self.offsets = _ends()
        self.item_ends = _ends()
        self.byte_ends = _ends()
        self.base = 0
        self.origin = 0
        # Dropped at the front but still in the containers (see drop_turns):
        # items in ``offsets``, turns in the per-turn ones.
        self.skip = 0
        self.dead = 0
        self.epoch = object()
        self.turn_tokens = _ends()
        self.turn_carried = bytearray()
        self.calls: list[_CallLog | None] = []
        untrack_container(self.calls)  # untracked structs only
        self.tokens = pinned.tokens
        self.last: _Turn | None = None
        self.evicted = evicted
        self.generation = generation
        # The call-id renaming state after ``items``: a turn is renamed once,
        # when it joins the run, and what it became depends only on the items
        # before it, so the run stays a byte-stable prefix while only appends happen.
        self.call_ids = call_ids
        # The calls still open after the run's last turn, carried into the next.
        self.carry: tuple[ToolCallPart, ...] = ()
        self.body: BodyRun | None = None
        self.first_tag = 1

    @property
    def turns(self) -> int:
        """How many closed turns the run holds."""
        return len(self.item_ends) - self.dead

    @property
    def count(self) -> int:
        """How many items the run holds (the pinned instructions' aside)."""
        return len(self.offsets) - self.skip

    def span(self) -> ChunkedSpan:
        """The run's encoded items, oldest first, in O(1) (valid while the run lives)."""
        return ChunkedSpan(
            self.chunks,
            self.dead,
            len(self.chunks),
            self.item_ends,
            self.byte_ends,
            self.origin,
            self.base,
            self.offsets,
            self.skip,
        )

    def _item_ends(self, index: int) -> tuple[array.array[int], int]:
        """Where each item of turn ``index`` ends, and where its first begins (running bytes)."""
        at = self.dead + index
        start = self.item_ends[at - 1] if at > self.dead else self.origin
        base = self.byte_ends[at - 1] if at > self.dead else self.base
        first = self.skip + start - self.origin
        return self.offsets[first : first + self.item_ends[at] - start], base

    def encodings(self, index: int) -> list[bytes]:
        """The encoded items of the run's turn ``index`` (0 = oldest held), one ``bytes`` each."""
        ends, base = self._item_ends(index)
        return split_chunk(self.chunks[self.dead + index], ends, base)

    def ends(self, index: int) -> tuple[int, int]:
        """Where the run's turn ``index`` (0 = oldest held) ends: (items, bytes), running."""
        at = self.dead + index
        return self.item_ends[at], self.byte_ends[at]

    def compaction_due(self) -> bool:
        """True when the slots dropped at the front are due to be copied out (:meth:`compact`)."""
        return (
            compaction_due(self.skip, self.count)
            or compaction_due(self.dead, self.turns)
            or (self.body is not None and self.body.compaction_due())
        )

    def drop_turns(self, dropped: int) -> None:
        """Drop the ``dropped`` oldest turns (not from the body): O(1) but for their tokens.

        The containers keep the dropped slots (a render's span of them stays
        valid, no copy is made) until :meth:`compact` copies the kept ones
        into new containers.
        """
        origin, base = self.ends(dropped - 1)
        self.skip += origin - self.origin
        self.tokens -= sum(self.turn_tokens[self.dead : self.dead + dropped])
        self.dead += dropped
        self.origin, self.base = origin, base

    def compact(self) -> None:
        """Copy the kept slots into new containers (O(kept)); spans handed out stay valid."""
        if self.body is not None:
            self.body.compact()
        if self.skip:
            self.offsets = _ends(self.offsets[self.skip :])
            self.skip = 0
        dead = self.dead
        if dead:
            self.chunks = self.chunks[dead:]
            untrack_container(self.chunks)
            self.item_ends = _ends(self.item_ends[dead:])
            self.byte_ends = _ends(self.byte_ends[dead:])
            self.turn_tokens = _ends(self.turn_tokens[dead:])
            self.turn_carried = self.turn_carried[dead:]
            self.calls = self.calls[dead:]
            untrack_container(self.calls)
            self.dead = 0

    def join(self, renamed: _Rendered, carried: bool, calls: _CallLog | None) -> bytes:
        """Append one closed turn, ``renamed`` with the run's call ids (``calls``); its chunk."""
        chunk = self.add(renamed.encoded, renamed.bytes, renamed.tokens, carried, calls)
        if self.body is not None:
            tag = self.first_tag + self.turns - 1
            self.body.append(renamed.items, tag, renamed.encoded, chunk)
        return chunk

    def add(
        self,
        encoded: Sequence[bytes],
        size: int,
        tokens: int,
        carried: bool,
        calls: _CallLog | None,
        chunk: bytes | None = None,
    ) -> bytes:
        """Append one closed turn's encoded items (``size`` bytes in all); not to the body.

        Returns the turn's chunk: ``chunk`` when given (it must be the items
        joined by ``,``), else the items joined.
        """
        if chunk is None:
            chunk = b",".join(encoded)
        self.chunks.append(chunk)
        items_at = self.item_ends[-1] if self.item_ends else self.origin
        bytes_at = self.byte_ends[-1] if self.byte_ends else self.base
        ends = itertools.accumulate(map(len, encoded), initial=bytes_at)
        self.offsets.extend(itertools.islice(ends, 1, None))  # past the initial value
        self.item_ends.append(items_at + len(encoded))
        self.byte_ends.append(bytes_at + size)
        self.turn_tokens.append(tokens)
        self.turn_carried.append(1 if carried else 0)
        self.calls.append(calls)
        self.tokens += tokens
        return chunk

    def add_kept(self, run: _Run, first: int, stop: int) -> None:
        """Append ``run``'s turns ``first`` to ``stop - 1`` (0 = oldest held) as they are.

        Their chunks, item sizes, tokens, carried flags and ``calls`` are
        ``run``'s, moved to this run's running coordinates: C-speed copies,
        O(their items), without cutting an item out of a chunk.
        """
        if first >= stop:
            return
        dead = run.dead
        at, end = dead + first, dead + stop
        start = run.item_ends[at - 1] if at > dead else run.origin
        base = run.byte_ends[at - 1] if at > dead else run.base
        items_at = self.item_ends[-1] if self.item_ends else self.origin
        bytes_at = self.byte_ends[-1] if self.byte_ends else self.base
        item = run.skip + start - run.origin
        shift = (bytes_at - base).__add__
        self.offsets.extend(map(shift, run.offsets[item : item + run.item_ends[end - 1] - start]))
        self.item_ends.extend(map((items_at - start).__add__, run.item_ends[at:end]))
        self.byte_ends.extend(map(shift, run.byte_ends[at:end]))
        tokens = run.turn_tokens[at:end]
        self.turn_tokens.extend(tokens)
        self.tokens += sum(tokens)
        self.turn_carried.extend(run.turn_carried[at:end])
        self.chunks.extend(run.chunks[at:end])
        self.calls.extend(run.calls[at:end])

    def natives(self, first: int, stop: int) -> list[NativeContent]:
        """The items of the run's turns ``first`` to ``stop - 1`` decoded (O(their bytes))."""
        return decode_joined(
            b",".join(filter(None, self.chunks[self.dead + first : self.dead + stop]))
        )


class _Shared:
    """Render caches shared by all views of one history, and the cache slots."""

    __slots__ = ("counter", "gateway_slots", "key_slots", "lock", "runs")

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter  # counts messages the renders make (a cancelled result)
        self.lock = threading.Lock()
        # A lock refers to nothing but its type: in no cycle. (This object
        # and its dicts hold the host's counter and gateways: tracked.)
        untrack_atoms(self.lock)
        self.runs: dict[_CacheKey, _Run] = {}
        # Gateways and render keys are referred to by slot number in the
        # untracked entries and turns (see above); assigned in first-use order.
        self.gateway_slots: dict[Gateway, int] = {}
        self.key_slots: dict[_CacheKey, int] = {}

    def gateway_slot(self, gateway: Gateway) -> int:
        """The gateway slot of ``gateway``, assigned on first use."""
        slot = self.gateway_slots.get(gateway)  # assigned once, never changed: no lock to read
        if slot is not None:
            return slot
        with self.lock:
            return self.gateway_slots.setdefault(gateway, len(self.gateway_slots))

    def slots(self, key: _CacheKey) -> tuple[int, int]:
        """The (gateway slot, key slot) of a render key, assigned on first use."""
        with self.lock:
            gateway_slot = self.gateway_slots.setdefault(key[0], len(self.gateway_slots))
            key_slot = self.key_slots.setdefault(key, len(self.key_slots))
        return gateway_slot, key_slot


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
) -> _Rendered:
    """Render entries as one span with every call/result pair complete (see complete_pairs).

    A message kept as it is costs the tokens counted when it entered; one
    that pairing changed (a call left out, a cancelled result) is counted by
    ``counter`` here. With ``store`` False the entries' caches are read,
    never filled.
    """
    messages = [e.message for e in entries]
    by_id = {id(e.message): e for e in entries}
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
        if entry is not None and entry.message is message:
            native, native_encoded = entry.rendered(gateway, slot, store)
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


_CANCELLED_CONTENT = (TextPart(text=CANCELLED_RESULT_TEXT),)


def _is_cancelled_results(message: Message) -> bool:
    """True for the message of cancelled results ``complete_pairs`` adds to close calls."""
    return message.role is Role.tool and all(
        type(p) is ToolResultPart and p.is_error and p.content == _CANCELLED_CONTENT
        for p in message.parts
    )


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
    for index, turn in enumerate((*turns, head)):
        starts.append(tuple(tracker.open.values()))
        tracker.new_turn()  # each turn is a span: a step never spans two
        for message in turn.messages(index < count):
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
            turn.render(gateway, slots, policy, counter, True, starts[index], answered, store)
        )
        if still_open and settled == count and resolved.get(group, count) >= count:
            settled = index  # its open group runs into the input: not final yet
    rendered_head = head.render(gateway, slots, policy, counter, False, starts[count], None, store)
    return _Plan(renders, settled, starts[settled], rendered_head)


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


_Checked = tuple[
    tuple[object, ...],
    tuple[int, ...],
    tuple[tuple[_Native, _Encoded], ...] | None,
    Gateway | None,
    tuple["_Turn", ...] | None,
    str | None,
    bool,
]
"""``TurnHistory``'s memo of a batch checked: messages, sizes, renders, gateway,
and what its limits were checked against: the history's turns (the very
tuple), the turn id and whether the batch was pinned instructions."""

_UNCHECKED: _Checked = ((), (), None, None, None, None, False)


class HistoryView:
    """An immutable view of a history at one moment; safe to render in a thread.

    Obtained from :meth:`TurnHistory.view` in O(1). The view keeps the turns
    it saw alive, so a later eviction does not change what it renders.

    What it returns is never shared with what the history keeps: a message
    holding a dict (``extras``, ``layout``, an opaque part's ``item``) is
    returned as a copy with new dicts (the others are frozen all through and
    returned as they are), and a render's ``items`` are new containers each
    read (see :class:`RenderedHistory`); a caller's edit of them reaches no
    later render or prepared input.
    """

    __slots__ = ("_evicted", "_generation", "_held", "_pinned", "_shared", "_turns")

    def __init__(
        self,
        pinned: tuple[_Entry, ...],
        turns: tuple[_Turn, ...],
        evicted: int,
        generation: int,
        shared: _Shared,
        held: int = 0,
    ) -> None:
        self._pinned = pinned
        self._turns = turns
        self._held = held  # messages in the view, pinned included
        # Turns dropped at the front so far (restored ones included: a restore
        # changes turns before the newest, so it bumps the generation).
        self._evicted = evicted
        self._generation = generation  # bumped when a turn before the newest changes
        self._shared = shared

    @property
    def pinned(self) -> tuple[Message, ...]:
        """The pinned instruction messages, in order (see the class docstring: copies)."""
        return fresh_messages(e.message for e in self._pinned)

    @property
    def turn_ids(self) -> tuple[str, ...]:
        """Ids of the turns in the view, oldest first."""
        return tuple(t.turn_id for t in self._turns)

    def turn_messages(self, turn_id: str) -> tuple[Message, ...]:
        """The input then output messages of ``turn_id``, in order.

        Raises:
            UnknownTurnError: the view holds no turn ``turn_id``.
        """
        for turn in self._turns:
            if turn.turn_id == turn_id:
                return fresh_messages(e.message for e in turn.input + turn.outputs)
        raise UnknownTurnError(f"The history holds no turn {excerpt(turn_id)}.")

    def turn_input(self, turn_id: str) -> tuple[Message, ...]:
        """The input messages of ``turn_id``, in order.

        Raises:
            UnknownTurnError: the view holds no turn ``turn_id``.
        """
        for turn in reversed(self._turns):
            if turn.turn_id == turn_id:
                return fresh_messages(e.message for e in turn.input)
        raise UnknownTurnError(f"The history holds no turn {excerpt(turn_id)}.")

    def turn_state(self, turn_id: str) -> tuple[Message, ...]:
        """The kept state messages of ``turn_id`` (see :meth:`TurnHistory.keep_state`), or ().

        Raises:
            UnknownTurnError: the view holds no turn ``turn_id``.
        """
        for turn in reversed(self._turns):
            if turn.turn_id == turn_id:
                state = turn.state
                return fresh_messages(e.message for e in state) if state else ()
        raise UnknownTurnError(f"The history holds no turn {excerpt(turn_id)}.")

    def render(
        self, gateway: Gateway, turn_id: str, *, open_calls: OpenCallPolicy = "exclude"
    ) -> RenderedHistory:
        """Render the pinned instructions, the turns before ``turn_id`` and its input.

        The outputs of ``turn_id`` itself are not included: they are the
        continuation of the turn's model calls (see ``ContextManager.build``);
        neither is its kept state. Each turn before it is its input, its kept
        state, then its outputs.
        The retained turns and the turn's input are paired as one input
        (see the class docstring of :class:`TurnHistory`): the items equal
        ``complete_pairs(input_messages(turn_id), open_calls=open_calls)``
        rendered message by message. When a render raises (a gateway error,
        a MemoryError), the shared render cache is dropped, so the next
        render equals a cold one.

        Args:
            gateway: the provider to render for.
            turn_id: the turn whose model input is being prepared.
            open_calls: what to do with calls left without a result.

        Returns:
            the rendered items, their byte size and where the turn's input begins.

        Raises:
            UnknownTurnError: the view holds no turn ``turn_id``.
            ProviderRuleError: the gateway rejects a message's content.
            HostCallbackError: the token counter failed on a message the
                pairing made (a cancelled result).
        """
        return cast(RenderedHistory, self._render(gateway, turn_id, open_calls, None))

    def render_bounded(
        self,
        gateway: Gateway,
        turn_id: str,
        budget: int,
        *,
        open_calls: OpenCallPolicy = "exclude",
    ) -> RenderedHistory | None:
        """:meth:`render`, when it costs at most about ``budget`` items' worth of work; else None.

        Work is counted in items: those rendered (turns not yet in the
        cached run, and the turn's input), those decoded (turns evicted
        since the last render, to forget their call ids) and, when the
        cached run must be built, rebuilt, renamed anew or compacted, every
        item held. Nothing else a render does grows with the history (the
        run's encoded items are handed out without a copy), so a bounded
        render is a small, bounded step: one the event loop may take. A
        render of an earlier turn or an older view (a private render,
        O(history)) returns None when the view holds more than ``budget``
        items.

        Returns None before anything is rendered, or once the evicted turns
        are dropped from the cached run when only the new turns are over
        the budget (the cache stays exact: the next render continues it).

        Raises:
            as :meth:`render`.
        """
        return self._render(gateway, turn_id, open_calls, budget)

    def _render(
        self,
        gateway: Gateway,
        turn_id: str,
        open_calls: OpenCallPolicy,
        budget: int | None,
    ) -> RenderedHistory | None:
        """:meth:`render` (``budget`` None) or :meth:`render_bounded`."""
        turns = self._turns
        position = len(turns) - 1
        if position < 0 or turns[position].turn_id != turn_id:
            for position, turn in enumerate(turns):  # noqa: B007
                if turn.turn_id == turn_id:
                    break
            else:
                raise UnknownTurnError(f"The history holds no turn {excerpt(turn_id)}.")
        key: _CacheKey = (gateway, open_calls)
        shared = self._shared
        slots = shared.slots(key)
        head = turns[position]
        # Bounded: no O(history) step (not even a tuple copy) unless the view is small.
        small = budget is None or self._held <= budget
        with shared.lock:
            run = shared.runs.get(key)
            newest = position == len(turns) - 1 and (
                run is None or (self._evicted >= run.evicted and self._generation >= run.generation)
            )
            if not newest and not small:
                return None
            if newest:
                # ``turns`` up to ``position`` are the closed turns (not copied).
                try:
                    if run is not None:
                        run = self._advance(run, turns, position, gateway, slots, budget)
                    if run is None:
                        if not small:
                            return None  # nothing changed
                        run = self._build(gateway, slots, open_calls)
                    shared.runs[key] = run
                    fresh = turns[run.turns : position]
                    if not small and sum(t.items for t in fresh) + head.items > cast(int, budget):
                        return None  # the run is exact as it stands
                    # Everything that can fail (a gateway, an area of memory)
                    # runs before the run changes.
                    plan = _plan(
                        fresh,
                        head,
                        run.carry,
                        gateway,
                        slots,
                        open_calls,
                        shared.counter,
                    )
                    logs: list[_CallLog | None] = []
                    settled, tail, call_ids = plan.rename(gateway, run.call_ids, logs)
                    self._append(run, turns, plan, settled, logs, slots)
                    # The run's containers are handed out as they stand (no copy).
                    rendered = RenderedHistory(
                        run.pinned,
                        tail,
                        call_ids,
                        run.tokens + tail.tokens,
                        run,
                        run.body.snapshot(tail.items) if run.body is not None else None,
                    )
                except BaseException:
                    # The run may be half changed: drop it; the next render rebuilds it.
                    shared.runs.pop(key, None)
                    raise
        if not newest:
            # An older view (or an earlier turn): rendered privately, the caches
            # read but neither filled nor changed.
            closed = turns[:position]
            call_ids = CallIdRenamer()
            pinned = _renamed(
                _render_entries(self._pinned, gateway, slots[0], open_calls, shared.counter),
                gateway,
                call_ids,
            )
            plan = _plan(closed, head, (), gateway, slots, open_calls, shared.counter, False)
            settled, tail, call_ids = plan.rename(gateway, call_ids)
            tail = _join([*settled, tail])
            tokens = pinned.tokens + tail.tokens
            rendered = RenderedHistory(pinned, tail, call_ids, tokens)
        rendered.turn_start = rendered.item_count - len(plan.head.items) + plan.head.lead
        return rendered

    def render_scoped(
        self,
        gateway: Gateway,
        turn_id: str,
        scope: ContextScope,
        *,
        open_calls: OpenCallPolicy = "exclude",
    ) -> RenderedHistory:
        """Render the sliced view of what :meth:`render` renders for ``turn_id``.

        ``scope`` selects among the turns' messages: those of the turns before
        ``turn_id`` then its input, indexed from 0 in that order (the list
        :meth:`scope_messages` returns). The pinned instructions and the
        turn's own input are always kept. The kept messages are then paired
        as one input, as :meth:`render` pairs (across turns), so a call whose
        result the scope left out is excluded or cancelled (by
        ``open_calls``) and a result whose call it left out is dropped.

        Renders privately: the shared run and the per-turn renders that
        :meth:`render` reuses are neither read nor changed (only per-message
        renders, which do not depend on the scope, are shared). Call ids are
        made unique over the sliced view by the same renaming rule. Kept state
        (:meth:`TurnHistory.keep_state`) is not part of the sliced view: a
        scope indexes and renders recorded messages only. A scope that keeps
        every message of a history without kept state renders what
        :meth:`render` renders.

        Raises:
            UnknownTurnError: the view holds no turn ``turn_id``.
            PositionalScopeError: a scope without ``indices`` asked a
                positional scope's ``matches``.
            ProviderRuleError: the gateway rejects a message's content.
            HostCallbackError: the token counter failed on a message the
                pairing made (a cancelled result).
        """
        position = self._position(turn_id)
        turns = self._turns[:position]
        entries = [e for t in turns for e in (*t.input, *t.outputs)]
        ends = list(itertools.accumulate(t.items for t in turns))  # where each turn ends
        head = self._turns[position].input
        keep = scope_indices(scope, [e.message for e in (*entries, *head)])
        # Group the kept entries by turn, each turn's in order; cost follows the kept.
        kept_spans: list[list[_Entry]] = []
        span_at = -1
        for i in sorted(i for i in keep if 0 <= i < len(entries)):
            span = bisect.bisect_right(ends, i)
            if span != span_at:
                kept_spans.append([])
                span_at = span
            kept_spans[-1].append(entries[i])
        kept_spans.append(list(head))  # the turn's input, whole
        shared = self._shared
        slots = shared.slots((gateway, open_calls))
        counter = shared.counter
        call_ids = CallIdRenamer()
        pinned = _renamed(
            _render_entries(self._pinned, gateway, slots[0], open_calls, counter),
            gateway,
            call_ids,
        )
        # Each turn's kept messages as a throwaway turn, so the render caches
        # of the history's own turns are not touched; paired as one input.
        spans = [_Turn("", tuple(e), (), 0, sum(x.tokens for x in e), 0) for e in kept_spans[:-1]]
        own = self._turns[position]
        head_turn = _Turn(own.turn_id, own.input, (), 0, 0, 0)
        plan = _plan(spans, head_turn, (), gateway, slots, open_calls, counter)
        settled, tail, call_ids = plan.rename(gateway, call_ids)
        body = _join([*settled, tail]) if settled else tail
        tokens = pinned.tokens + body.tokens
        rendered = RenderedHistory(pinned, body, call_ids, tokens)
        rendered.turn_start = rendered.item_count - len(plan.head.items) + plan.head.lead
        return rendered

    def messages(self) -> tuple[Message, ...]:
        """Every kept turn's input then outputs, oldest first (pinned excluded)."""
        return fresh_messages(e.message for t in self._turns for e in (*t.input, *t.outputs))

    def scope_messages(self, turn_id: str) -> tuple[Message, ...]:
        """The messages a scope of :meth:`render_scoped` indexes, in order.

        The turns before ``turn_id`` (input then outputs), then its input.

        Raises:
            UnknownTurnError: the view holds no turn ``turn_id``.
        """
        position = self._position(turn_id)
        out = [e.message for t in self._turns[:position] for e in (*t.input, *t.outputs)]
        out.extend(e.message for e in self._turns[position].input)
        return fresh_messages(out)

    def _position(self, turn_id: str) -> int:
        for position in range(len(self._turns) - 1, -1, -1):
            if self._turns[position].turn_id == turn_id:
                return position
        raise UnknownTurnError(f"The history holds no turn {excerpt(turn_id)}.")

    def input_messages(self, turn_id: str) -> tuple[Message, ...]:
        """The messages a render of ``turn_id`` is made of, before pairing.

        The pinned instructions, every message of the turns before
        ``turn_id`` (its input, kept state, then outputs), then its input,
        oldest first. Rendering
        ``complete_pairs(input_messages(t))`` message by message, with call
        ids renamed by ``rename_call_ids`` over the whole list, gives exactly
        :meth:`render`'s items (a cold render, without any cache).

        Raises:
            UnknownTurnError: the view holds no turn ``turn_id``.
        """
        out = [e.message for e in self._pinned]
        for turn in self._turns:
            if turn.turn_id == turn_id:
                out.extend(e.message for e in turn.input)
                return fresh_messages(out)
            out.extend(turn.messages(True))
        raise UnknownTurnError(f"The history holds no turn {excerpt(turn_id)}.")

    def _build(self, gateway: Gateway, slots: tuple[int, int], policy: OpenCallPolicy) -> _Run:
        call_ids = CallIdRenamer()
        pinned = _renamed(
            _render_entries(self._pinned, gateway, slots[0], policy, self._shared.counter),
            gateway,
            call_ids,
        )
        run = _Run(self._pinned, pinned, self._evicted, self._generation, call_ids)
        run.body = _body_run(gateway, run)
        _untrack_run(run)
        return run

    def _advance(
        self,
        run: _Run,
        closed: tuple[_Turn, ...],
        position: int,
        gateway: Gateway,
        slots: tuple[int, int],
        budget: int | None = None,
    ) -> _Run | None:
        """Drop the turns evicted since the run was built: the run to use, or None.

        ``closed[:position]`` are the view's closed turns. None when the kept
        turns render differently without the evicted ones (the caller builds
        a new run); a new run when only their call ids do
        (:meth:`_renamed_anew`); else ``run``, changed in place. With a
        ``budget`` (see :meth:`render_bounded`) under the items held, a step
        over it (those two, rebuilding the body, compacting, decoding more
        evicted items) is not taken: None is returned, ``run`` unchanged.
        """
        small = budget is None or self._held <= budget
        dropped = self._evicted - run.evicted
        kept = run.turns - dropped
        if not small and run.compaction_due():
            return None
        if (
            run.pinned_entries is not self._pinned
            or run.generation != self._generation
            or not 0 <= kept <= position
            # Turns only change at the end (the generation counts other
            # changes), so the last kept turn being the same object means the
            # whole kept run is this view's prefix.
            or (kept and closed[kept - 1] is not run.last)
            # The first kept turn answered calls of an evicted turn: without
            # them its results are orphans, so its render changes.
            or (dropped and kept and run.turn_carried[run.dead + dropped])
        ):
            return None
        if dropped:
            count = run.ends(dropped - 1)[0] - run.origin
            if budget is not None and not small and count > budget:
                return None
            evicted_ids = CallIdRenamer()
            rename_call_ids(gateway.type, run.natives(0, dropped), evicted_ids)
            if not run.call_ids.can_forget(evicted_ids):
                # A rename of a kept item depended on an evicted one: a render
                # of the kept turns alone renames differently, so their call
                # ids are renamed anew (see _renamed_anew).
                return self._renamed_anew(run, dropped, closed, gateway, slots) if small else None
            first_kept = run.first_tag + dropped
            drop = run.body.plan_drop(first_kept, evicted_ids) if run.body is not None else None
            # Without a plan the kept body differs from the cached one (a
            # turn merged across the cut, say): rebuilt from the kept items, once.
            rebuild = run.body is not None and drop is None
            if rebuild and not small:
                return None
            run.call_ids.forget(evicted_ids)
            if drop is not None:
                cast(BodyRun, run.body).apply_drop(drop)
            elif rebuild:
                run.body = None
            run.first_tag = first_kept
            run.drop_turns(dropped)
            if small and run.compaction_due():
                run.compact()
            run.evicted = self._evicted
            if not kept:
                run.carry = ()  # the calls it carried were evicted with their turn
                run.last = None
            if rebuild:
                run.body = _body_run(gateway, run)
        return run

    def _renamed_anew(
        self,
        run: _Run,
        dropped: int,
        closed: tuple[_Turn, ...],
        gateway: Gateway,
        slots: tuple[int, int],
    ) -> _Run:
        """A run of ``run``'s turns after the first ``dropped``, their call ids renamed anew.

        Only valid when the kept turns render as they did (the caller checked
        that nothing but the evicted call ids changes them): each kept turn
        is renamed from scratch after the pinned instructions, as a cold
        render of the kept turns renames it. A turn without a log (its items
        carry their own ids) is decoded and renamed while its log is
        recorded. A turn with a :class:`_CallLog` replays its call-id events
        (O(its calls), no pass over its items); when the ids it replays are
        those it has, it is kept as it is: its chunk, item sizes and log
        copied with the other such turns (:meth:`_Run.add_kept`), never
        decoded or cut. One whose ids change
        has the items that carry ids (its log's ``carriers``) decoded, the
        new ids written into them and those that change encoded again; the
        others keep their bytes. The encoded body is built in one pass of
        the body writer, which decodes a turn's chunk only when it does not
        pass its items through
        (:meth:`~turnloom.context.body.BodyWriter.passes_through`). No
        message is rendered again.
        """
        kind = gateway.type
        call_ids = CallIdRenamer()
        rename_call_ids(kind, run.pinned.items, call_ids)  # renamed: unchanged
        new = _Run(self._pinned, run.pinned, self._evicted, self._generation, call_ids)
        writer = body_writer(gateway, renamed=True) if run.body is not None else None
        # A writer that passes items through takes a kept chunk as it is (see BodyRun.append).
        split = writer is not None and not writer.passes_through()
        segments: list[_Segment] = [(run.pinned.items, 0, run.pinned.encoded, None)]
        kept = dropped  # turns kept as they are from here, not yet added (one copy of them all)
        for index in range(dropped, run.turns):
            calls = run.calls[run.dead + index]
            encoded: Sequence[bytes]
            carriers: Sequence[int]
            if calls is None:  # its items carry their own ids: renamed, recorded
                encoded = run.encodings(index)
                items = run.natives(index, index + 1)
                found: list[int] = []
                written, events, ids = record_renames(kind, items, call_ids, found)
                calls = _call_log(events, ids, found)
                carriers = range(len(items))
            else:
                ids = call_ids.replay(calls.packed)  # reads the events only
                if ids == calls.ids:  # the turn stays as it is, undecoded
                    chunk = run.chunks[run.dead + index]
                    encodings = run.encodings(index) if split else ()
                    segments.append((None, new.first_tag + index - dropped, encodings, chunk))
                    continue
                # Only the items that carry ids are decoded and renamed.
                carriers = calls.carriers
                encoded = run.encodings(index)
                items = decode_joined(b",".join([encoded[i] for i in carriers]))
                written = restore_call_ids(kind, items, ids)
                calls = _call_log(calls.events, ids, carriers)
            new.add_kept(run, kept, index)
            kept = index + 1
            chunk = run.chunks[run.dead + index]
            changed = list(encoded)
            anew = False  # an item's encoding changed: the turn is joined anew
            for at, new_item, item in zip(carriers, written, items, strict=True):
                if new_item is not item and new_item != item:
                    changed[at] = encode_item(new_item)
                    anew = True
            if anew:
                encoded = changed
            joined = new.add(
                encoded,
                sum(map(len, encoded)),
                run.turn_tokens[run.dead + index],
                bool(run.turn_carried[run.dead + index]),
                calls,
                None if anew else chunk,
            )
            if anew:
                closed[index - dropped].release(slots, (joined,))
            # Its items are decoded from its chunk only if the body writer needs them.
            segments.append((None, new.first_tag + index - dropped, encoded, joined))
        new.add_kept(run, kept, run.turns)
        if writer is not None:
            new.body = BodyRun.of(writer, segments)
        if new.turns:
            new.last, new.carry = run.last, run.carry
        _untrack_run(new)
        return new  # else no turn is kept: none is last, no call is carried

    def _append(
        self,
        run: _Run,
        closed: tuple[_Turn, ...],
        plan: _Plan,
        renders: list[_Rendered],
        logs: list[_CallLog | None],
        slots: tuple[int, int],
    ) -> None:
        """Append the plan's settled turns, renamed (``renders``, recorded in ``logs``), to the run.

        ``closed`` holds them after the run's turns. Each joins the run
        encoded, and its native renders leave the caches (:meth:`_Turn.release`).
        """
        if not plan.settled:
            return
        reuse = run.turns
        joined = closed[reuse : reuse + plan.settled]
        for turn, rendered, renamed, log in zip(joined, plan.renders, renders, logs, strict=False):
            chunk = run.join(renamed, bool(rendered.key[0]), log)
            turn.release(slots, (chunk,))
        run.last = joined[-1]
        run.carry = plan.carry


_NO_ENDS: array.array[int] = array.array("q")
_Segment = tuple[Sequence[NativeContent] | None, int, Sequence[bytes], bytes | None]
"""A body segment: items (None: not decoded), tag, their encodings, and their chunk
(see ``BodyRun.append``)."""
_NO_SPAN = ChunkedSpan([], 0, 0, _NO_ENDS, _NO_ENDS, 0, 0, _NO_ENDS, 0)


def _body_run(gateway: Gateway, run: _Run) -> BodyRun | None:
    """The encoded request body of a run's items (segment 0 the pinned, then each turn)."""
    writer = body_writer(gateway, renamed=True)  # fed the run's renamed items
    if writer is None:
        return None
    segments: list[_Segment] = [(run.pinned.items, 0, run.pinned.encoded, None)]
    for index in range(run.turns):
        # Its items are decoded from its chunk only if the writer needs them.
        chunk = run.chunks[run.dead + index]
        segments.append((None, run.first_tag + index, run.encodings(index), chunk))
    body = BodyRun.of(writer, segments)
    if gc.is_tracked(body) and not gc.is_tracked(run):
        # A run out of the collector holds no tracked body (see _untrack_run):
        # a gateway whose writer changed kind gets no cached body (its body
        # is encoded whole, the same bytes).
        return None
    return body


def _untrack_run(run: _Run) -> None:
    """Take a new run out of the cyclic collector when its body is out of it (or None).

    Its slots only ever hold gc=False structs (its pinned entries and
    render, its last turn: see above), tuples of them and of message parts
    (``carry``: gc=False, copied at the door), ints, arrays of ints, a
    bytearray, lists of bytes and of _CallLog (untracked), a plain
    ``object()``, a CallIdRenamer and a BodyRun or None; every BodyRun it
    gets later comes from the same gateway (``_body_run`` gives it none
    that is tracked). With the renamer and the body out of the collector by
    their own proofs, nothing it refers to can lead back to it, so it can
    be in no cycle (a history's render cache holds one per render key).
    """
    if not gc.is_tracked(run.call_ids) and (run.body is None or not gc.is_tracked(run.body)):
        untrack_atoms(run)


def _identified(turn: _Turn) -> list[Message]:
    """The messages of ``turn`` with an id (its input and outputs: kept state has none)."""
    return [e.message for e in turn.input + turn.outputs if e.message.id is not None]


def _blank(message: Message) -> bool:
    """True when the message has nothing but empty or whitespace-only text.

    A blank text part with extras (a Gemini thought signature on an empty
    text) is content. Reasoning with blank text and no signature, encrypted
    content or redaction counts as blank too: it is what a model call cancelled while
    it thought leaves behind, and no provider can verify or show it.
    """
    for part in message.parts:
        if not _blank_part(part):
            return False
    return True


def _blank_part(part: Part) -> bool:
    if type(part) is TextPart:
        # Extras are content: a blank text part may carry a Gemini thought
        # signature (the SDK keeps {"text": "", "thoughtSignature": ...}).
        return is_blank_text(part.text) and not part.extras
    if type(part) is ReasoningPart:
        return (
            is_blank_text(part.text)
            and part.signature is None
            and part.encrypted_content is None
            and not part.redacted
        )
    return False


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


def check_batch_length(count: int, limits: HistoryLimits, where: str) -> None:
    """Refuse a batch that makes one turn hold more than ``limits.max_items`` messages.

    Raises:
        TurnTooLargeError: ``count`` is over the limit (``unit="items"``).
    """
    if count > limits.max_items:
        raise TurnTooLargeError(
            f"{where} would make the turn hold {count} messages, over the history's "
            f"limit of {limits.max_items}.",
            unit="items",
            size=count,
            limit=limits.max_items,
        )


def check_id(value: object, what: str) -> str:
    """Validate a context or turn id: a non-empty str of at most 256 characters.

    The one id rule of turnloom: :class:`TurnHistory` applies it to turn ids,
    the runtime's ContextManager to context and turn ids at its door.

    Args:
        value: the id to check.
        what: how the error names it (``"context id"``, ``"turn id"``).

    Returns:
        ``value``, checked.

    Raises:
        InvalidMessageError: the id is not such a string (its excerpt is cut
            to 32 characters), or is not valid UTF-8.
    """
    if not isinstance(value, str) or not value:
        raise InvalidMessageError(f"The {what} must be a non-empty string, not {excerpt(value)}.")
    if len(value) > _MAX_ID_LENGTH:
        raise InvalidMessageError(
            f"The {what} {excerpt(value[:32])}... is {len(value)} characters; at most "
            f"{_MAX_ID_LENGTH} are allowed."
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidMessageError(f"The {what} {excerpt(value)} is not valid UTF-8.") from None
    return value


class TurnHistory:
    """The bounded history of one context, in whole turns.

    Pairing across turns. Tool calls and results pair over the whole retained
    history, by the rule of :class:`~turnloom.context.CallTracker`, not turn
    by turn: a result recorded late to its turn, or given as the next turn's
    input (an approval flow: the model asks, a person approves, the result
    arrives with the next turn), answers the call it follows. A turn whose
    call group is still open at its end renders once the turns after it show
    whether they answer it; until then it is rendered with each prepare
    rather than cached in the shared run.

    Eviction and calls. Eviction never separates a turn's input from the
    calls it answers: a turn whose input holds results of calls made before it
    (an approval) is *tied* to the turn before it, and eviction drops the
    oldest turn together with the turns tied to it, oldest first. The limits
    stay hard: eviction may drop more turns than a limit alone asks for,
    never keep more. The newest turn is never evicted, so the newest turn and
    the turns it is tied to must fit every limit together: a commit whose
    input would tie turns over ``max_turns``, ``max_items``, ``max_bytes`` or
    ``max_tokens``, or a record that would make them hold more than
    ``max_items`` or ``max_bytes``, is refused with
    :class:`~turnloom.errors.PairedTurnsTooLargeError` before anything
    changes (``max_tokens`` is not checked on records, as for a single turn:
    tied turns over it are kept until a turn that is not tied to them
    arrives). A record to tied turns that are no longer the newest (a model
    call's output landing after a barge-in) is held to the same limits, so a
    checkpoint, which records each turn's outputs while it is its newest turn,
    restores what the history holds. A chain of approvals (each turn answering the calls of the one
    before) is tied end to end and ends at a turn whose input answers
    nothing, such as plain user text. So no render holds a result without its
    call, and no turn's input loses results to eviction: without this rule a
    newest turn made only of results would render no input at all, which
    Anthropic and Gemini refuse. Source: seed 004 (whole-turn history
    ownership; incomplete tool-call/output pairs are excluded from the next
    model input); every provider's rule that a result follows its call.
    A change to an earlier turn never takes an answer away from a later one:
    a late record that would leave a result a later turn holds answering no
    call (an output ending the calls' group, or answering the call first) is
    refused with :class:`~turnloom.errors.StrandedResultsError`, and kept state that
    would is not kept (see :meth:`record`, :meth:`keep_state`); pairing would
    drop those results, and a later input made of them would leave its own
    turn's model input. Ties follow what the kept turns say now: a late
    record, kept state on an earlier turn or a retraction that changes what a
    later input answers ties those turns again, or unties them, so the tie
    set is always what a cold rebuild of the kept turns computes (never a tie
    without its reason).

    Calls still open when their turn is evicted are evicted with it; results
    given as turn input can answer only calls of the newest turn (or of turns
    tied to it), which are never evicted. A result recorded to a turn after
    that turn was evicted is dropped and counted in ``dropped_late_outputs``.

    Args:
        limits: the bounds; see :class:`HistoryLimits`.
        remember_evicted: how many evicted turn ids are remembered, so that late
            outputs for them are dropped (and counted) rather than rejected as
            unknown, and their ids are not reused.
        token_counter: counts each message once, when it is committed or
            recorded; ``max_tokens``, the statistics and every rendered
            ``tokens`` use that count (:class:`ApproxTokenCounter` by default).
            It must count a list as the sum of its messages, as the built-in
            counters do. Each answer is checked where it is taken
            (:func:`~turnloom.context.tokens.count_tokens`): a counter that
            raises or returns anything but an int in ``[0, MAX_TOKEN_COUNT]``
            fails the commit, record or render with
            :class:`~turnloom.errors.HostCallbackError`, nothing changed.

    Raises:
        InputError: ``remember_evicted`` is negative.
        InvalidArgumentError: ``token_counter`` has no ``count`` method.
    """

    __slots__ = (
        "_aside",
        "_blank_dropped",
        "_bytes",
        "_checked",
        "_duplicates",
        "_evicted",
        "_evicted_bytes",
        "_evicted_ids",
        "_evicted_items",
        "_evicted_tokens",
        "_forgotten",
        "_front",
        "_generation",
        "_ids",
        "_items",
        "_late_dropped",
        "_limits",
        "_linked",
        "_message_ids",
        "_pinned",
        "_pinned_bytes",
        "_pinned_tokens",
        "_remember",
        "_retracted",
        "_sequence",
        "_serial",
        "_shared",
        "_tokens",
        "_turns",
        "_view",
    )

    def __init__(
        self,
        limits: HistoryLimits | None = None,
        *,
        remember_evicted: int = 1024,
        token_counter: TokenCounter | None = None,
    ) -> None:
        if remember_evicted < 0:
            raise InputError("remember_evicted must not be negative.")
        counter = _DEFAULT_COUNTER if token_counter is None else token_counter
        if not callable(getattr(counter, "count", None)):
            raise InvalidArgumentError(
                "token_counter must have a count(messages) method.", field="token_counter"
            )
        self._limits = limits if limits is not None else HistoryLimits()
        # The last two batches check_batch passed (a turn's input and its
        # instructions), newest first: their messages' sizes and, when they
        # were rendered at the door, their renders and the gateway, and the
        # state their limits were checked on. Messages are frozen, so the
        # same objects checked again (the door, then the commit or record they
        # pass) reuse their sizes and seed the render cache: each message is
        # checked, sized and rendered once, and the limits of an unchanged
        # state are not checked twice (see ``_reuse``).
        self._checked: tuple[_Checked, _Checked] = (_UNCHECKED, _UNCHECKED)
        self._remember = remember_evicted
        self._pinned: tuple[_Entry, ...] = ()
        self._pinned_bytes = 0
        self._turns: tuple[_Turn, ...] = ()
        self._ids: set[str] = set()
        untrack_container(self._ids)  # turn ids only: no cycle can pass through it
        self._generation = 0  # changes of a turn other than the newest
        self._items = 0
        self._bytes = 0
        self._tokens = 0
        self._pinned_tokens = 0
        self._evicted = 0  # turns evicted for good (not those held aside)
        self._front = 0  # turns dropped at the front, restored ones included: what views count
        # The turns the evictions since the newest commit dropped, while nothing
        # else changed: retracting that turn puts them back (see ``retract``).
        # None once they cannot be restored, or when no commit came since.
        self._aside: _Aside | None = None
        self._evicted_items = 0
        self._evicted_bytes = 0
        self._evicted_tokens = 0
        self._evicted_ids: OrderedDict[str, None] = OrderedDict()
        untrack_container(self._evicted_ids)  # turn ids to None only: no cycle through it
        # Serials of the kept turns tied to the turn before them: their input
        # (or a later turn's, past results-only turns) answers calls made
        # before them, so eviction never separates them (see ``evict``).
        self._linked: set[int] = set()
        untrack_container(self._linked)  # ints only: no cycle through it
        self._late_dropped = 0
        self._blank_dropped = 0
        self._duplicates = 0
        self._retracted = 0
        self._forgotten = 0  # ids of gone turns no longer remembered
        self._serial = 0
        # message id -> (serial of its turn, message), for every held message with an id
        self._message_ids: dict[str, tuple[int, Message]] = {}
        self._sequence: int | None = None
        self._shared = _Shared(counter)
        self._view: HistoryView | None = None

    # -- reading ---------------------------------------------------------

    @property
    def limits(self) -> HistoryLimits:
        """The bounds of this history."""
        return self._limits

    @property
    def held_items(self) -> int:
        """Messages held: the kept turns' and the pinned instructions (O(1))."""
        return self._items + len(self._pinned)

    @property
    def token_counter(self) -> TokenCounter:
        """The counter every token number of this history comes from."""
        return self._shared.counter

    @property
    def turn_ids(self) -> tuple[str, ...]:
        """Ids of the kept turns, oldest first."""
        return tuple(t.turn_id for t in self._turns)

    @property
    def latest_turn_id(self) -> str | None:
        """The id of the newest turn, or None before the first commit."""
        return self._turns[-1].turn_id if self._turns else None

    def open_calls(self) -> tuple[ToolCallPart, ...]:
        """The tool calls the kept turns leave open: those a next turn's input can answer.

        Pairing follows :class:`~turnloom.context.CallTracker` over the kept
        turns (inputs, kept state and outputs), as the render pairs them: a
        call already answered, closed by a later message, or made in an
        evicted turn is not open. O(the newest turn and the results-only
        turns before it), in practice.

        Returns:
            the open calls, in call order; empty for an empty history (a call
            holding ``extras`` is a copy with new dicts, as a view returns).
        """
        return fresh_messages(_calls_after(self._turns)[0].values())

    def has_turn(self, turn_id: str) -> bool:
        """True when ``turn_id`` is kept (committed and not evicted); O(1)."""
        return turn_id in self._ids

    def was_evicted(self, turn_id: str) -> bool:
        """True when ``turn_id`` was committed and has since been evicted (and is remembered)."""
        return turn_id in self._evicted_ids

    @property
    def sequence(self) -> int | None:
        """The sequence of the newest turn committed with one, or None."""
        return self._sequence

    @property
    def evicted_ids(self) -> tuple[str, ...]:
        """The remembered evicted turn ids, oldest first."""
        return tuple(self._evicted_ids)

    def remember_evicted(self, turn_ids: Sequence[str]) -> None:
        """Remember turn ids as evicted without ever holding them (restoring a checkpoint).

        Afterwards they behave as turns this history evicted itself: late
        outputs for them are dropped and counted, and their ids cannot be
        committed again. Only the newest ``remember_evicted`` ids are kept.

        Raises:
            InvalidMessageError: a malformed id.
            DuplicateIdError: an id is a turn this history holds; nothing changed.
        """
        for turn_id in turn_ids:
            check_id(turn_id, "turn id")
            if self.has_turn(turn_id):
                raise DuplicateIdError(
                    f"Turn {excerpt(turn_id)} is held by this history; it cannot be "
                    f"remembered as evicted."
                )
        self._settle()
        for turn_id in turn_ids:
            self._evicted_ids[turn_id] = None
        while len(self._evicted_ids) > self._remember:
            self._evicted_ids.popitem(last=False)

    def view(self) -> HistoryView:
        """An immutable view of the history as it is now, in O(1)."""
        view = self._view
        if view is None:
            view = self._view = HistoryView(
                self._pinned,
                self._turns,
                self._front,
                self._generation,
                self._shared,
                self.held_items,
            )
        return view

    def counts(self) -> HistoryCounts:
        """The counters a runtime sums over its histories: a plain :data:`HistoryCounts` tuple.

        The same values as :meth:`statistics`' fields, without building a
        snapshot (taken before and after every change).
        """
        return (
            len(self._turns),
            self._items,
            self._bytes,
            self._tokens,
            self._evicted,
            self._evicted_items,
            self._late_dropped,
            self._blank_dropped,
            self._duplicates,
            self._retracted,
        )

    def statistics(self) -> HistoryStatistics:
        """A frozen snapshot of the counters."""
        return HistoryStatistics(
            turns=len(self._turns),
            items=self._items,
            bytes=self._bytes,
            pinned_items=len(self._pinned),
            pinned_bytes=self._pinned_bytes,
            evicted_turns=self._evicted,
            evicted_items=self._evicted_items,
            evicted_bytes=self._evicted_bytes,
            dropped_late_outputs=self._late_dropped,
            dropped_blank_outputs=self._blank_dropped,
            duplicate_outputs=self._duplicates,
            retracted_turns=self._retracted,
            tokens=self._tokens,
            pinned_tokens=self._pinned_tokens,
            evicted_tokens=self._evicted_tokens,
            restorable_turns=len(self._aside.turns) if self._aside is not None else 0,
        )

    def over_limits(self) -> bool:
        """True when the kept turns exceed a limit and more than one turn is kept.

        :meth:`evict` may still evict nothing: the newest turn and the turns
        tied to it are never evicted.
        """
        limits = self._limits
        return len(self._turns) > 1 and (
            len(self._turns) > limits.max_turns
            or self._items > limits.max_items
            or self._bytes > limits.max_bytes
            or (limits.max_tokens is not None and self._tokens > limits.max_tokens)
        )

    # -- changing --------------------------------------------------------

    def check_batch(
        self,
        messages: Sequence[object],
        where: str,
        *,
        turn_id: str | None = None,
        pinned: bool = False,
        gateway: Gateway | None = None,
    ) -> tuple[int, ...]:
        """Check a batch of messages at the door; return each one's size in bytes.

        The batch's length is checked first, in O(1): a turn (its input, or
        its messages so far plus ``messages``) holds at most ``max_items``
        messages. Then each message passes
        :func:`~turnloom.context.check_message` and the per-item cap, and the
        running total is checked against ``max_bytes`` (with the turn's bytes
        so far), so a batch far over a limit costs at most about ``max_bytes``
        of work before it is refused. Nothing changes but a memo: the same
        message objects checked again (the batch the door checked, then
        committed) reuse their sizes instead of being encoded again, and the
        same call on a history that did not change since returns at once.

        Pinned instructions are not counted against the history's limits, so
        for them (``pinned``) only the count is bounded (at ``max_items``)
        besides the per-item cap.

        With ``gateway``, each message of a batch that passed is then rendered
        for it (and its native items sized), so a provider rule fails here;
        the renders seed the render cache of the entries the same messages
        become when committed or recorded next (:meth:`rendered_items`
        counts them).

        A record to a turn tied to other turns (see :class:`TurnHistory`)
        counts the tied turns together, as eviction keeps them, whether or
        not they reach the newest turn.

        Args:
            messages: the batch, oldest first.
            where: how error messages name it (``"turn 't1' input"``).
            turn_id: the held turn the batch is added to (a record), if any.
            pinned: the batch is a turn's new pinned instructions.
            gateway: the gateway to render the batch for, if any.

        Raises:
            TurnTooLargeError: the turn would hold more than ``max_items``
                messages or ``max_bytes`` bytes
                (:class:`~turnloom.errors.PairedTurnsTooLargeError`: the turns
                tied with it would).
            ItemTooLargeError: one message is over the per-item byte cap.
            InvalidMessageError, InvalidTextError, DuplicateIdError: a
                malformed message.
            ProviderRuleError: ``gateway`` cannot render ``messages[i]``
                (the message names it).
        """
        memo = self._memo(messages)
        if self._reuse(memo, turn_id, pinned, gateway):
            return memo[1]
        limits = self._limits
        turns = self._turns
        held_items = held_bytes = 0
        unit: tuple[_Turn, ...] = ()  # the turns held with ``turn_id``, when it is tied
        if turn_id is not None:
            linked = self._linked
            for position in range(len(turns) - 1, -1, -1):  # the newest, in practice: O(1)
                turn = turns[position]
                if turn.turn_id == turn_id:
                    # The turns eviction keeps with it, whether or not they
                    # reach the newest: a record to an earlier unit (a model
                    # call's output landing after a barge-in) is held to the
                    # limits its records were held to while it was newest, as
                    # a restore from a checkpoint holds it.
                    first = self._unit_first(position) if linked else position
                    last = position
                    while last + 1 < len(turns) and turns[last + 1].serial in linked:
                        last += 1
                    if first == last:
                        held_items, held_bytes = turn.items, turn.bytes
                    else:
                        unit = turns[first : last + 1]
                        held_items = sum(t.items for t in unit)
                        held_bytes = sum(t.bytes for t in unit)
                    break
        count = held_items + len(messages)
        if unit and count > limits.max_items:
            raise self._tied_error(where, "items", count, limits.max_items, unit, turn_id)
        check_batch_length(count, limits, where)
        cap = limits.max_item_bytes
        max_bytes = limits.max_bytes
        total = held_bytes
        _, seen_sizes, seen_renders, seen_gateway, _, _, _ = memo
        known = memo is not _UNCHECKED
        found: list[int] = []
        for i, message in enumerate(messages):
            size = seen_sizes[i] if known else check_message(message, where=f"{where}[{i}]")
            if size > cap:
                raise ItemTooLargeError(
                    f"{where}[{i}] is {size} bytes, over the per-item cap of {cap} bytes.",
                    size=size,
                    limit=cap,
                )
            total += size
            if total > max_bytes and not pinned:
                if unit:
                    raise self._tied_error(where, "bytes", total, max_bytes, unit, turn_id)
                raise TurnTooLargeError(
                    f"{where} would make the turn hold at least {total} bytes, over the "
                    f"history's limit of {max_bytes} bytes.",
                    unit="bytes",
                    size=total,
                    limit=max_bytes,
                )
            found.append(size)
        sizes = seen_sizes if known else tuple(found)
        renders: tuple[tuple[_Native, _Encoded], ...] | None = None
        if gateway is not None:
            if known and seen_gateway is gateway and seen_renders is not None:
                renders = seen_renders
            else:
                renders = tuple(
                    [
                        _render_checked(message, gateway, where, i)  # type: ignore[arg-type]
                        for i, message in enumerate(messages)
                    ]
                )
        elif known and seen_renders is not None:
            renders, gateway = seen_renders, seen_gateway
        checked: _Checked = (
            tuple(messages),
            sizes,
            renders,
            gateway,
            turns,
            turn_id,
            bool(pinned),
        )
        newest, older = self._checked
        self._checked = (checked, older if memo is newest else newest)
        return sizes

    def _memo(self, messages: Sequence[object]) -> _Checked:
        """The memo of an earlier :meth:`check_batch` of these very message objects, if any."""
        count = len(messages)
        for memo in self._checked:
            seen = memo[0]
            if len(seen) == count and (
                seen[0] is messages[0]  # a batch of one, the usual record: no iterator
                if count == 1
                else all(map(operator.is_, seen, messages))
            ):
                return memo
        return _UNCHECKED

    def _reuse(
        self, memo: _Checked, turn_id: str | None, pinned: bool, gateway: Gateway | None
    ) -> bool:
        """True when ``memo`` is of the same check in the same state; it becomes the newest.

        The same check: of these very message objects (frozen, and checked
        into private copies: :meth:`_memo` found it), with the same
        ``turn_id`` and ``pinned``, rendered for ``gateway`` when one is
        given. The same state: the history's very ``_turns`` tuple. Every
        change to the turns or to the ties between them (``_linked``, the only
        other state the limits read) assigns another tuple object, and the
        memo keeps its tuple alive, so no other tuple can be it; the one
        exception, the empty tuple an emptied history holds again, holds no
        turn and no tie either. Such a check passes again with the same
        sizes, so it is not repeated (the door's check, then the commit or
        record of the same batch).
        """
        if (
            memo is _UNCHECKED
            or memo[4] is not self._turns
            or memo[5] != turn_id
            or memo[6] is not bool(pinned)
            or (gateway is not None and memo[3] is not gateway)
        ):
            return False
        newest = self._checked[0]
        if memo is not newest:
            self._checked = (memo, newest)
        return True

    def rendered_items(self) -> int:
        """How many native items the last batch :meth:`check_batch` rendered comes to."""
        renders = self._checked[0][2]
        if renders is None:
            return 0
        return sum(len(native) if type(native) is tuple else 1 for native, _ in renders)

    def _entries(
        self,
        messages: Sequence[Message],
        named: str,
        what: str,
        turn_id: str | None = None,
        *,
        pinned: bool = False,
    ) -> tuple[tuple[_Entry, ...], tuple[int, ...]]:
        """The batch checked (:meth:`check_batch`) as entries, and each one's size.

        Errors name the batch ``f"turn {excerpt(named)} {what}"``; the label
        is built only when the batch is checked here, not reused from the door.
        """
        memo = self._memo(messages)
        if self._reuse(memo, turn_id, pinned, None):
            sizes = memo[1]
        else:
            sizes = self.check_batch(
                messages, f"turn {excerpt(named)} {what}", turn_id=turn_id, pinned=pinned
            )
        counter = self._shared.counter
        checked, older = self._checked
        renders, gateway = checked[2], checked[3]
        if renders is not None and gateway is not None:
            # The door's renders of these very messages seed their cache: slot 0's
            # render is the entry's own fields, another slot's goes in ``more``.
            slot = self._shared.gateway_slot(gateway)
            if slot == 0:
                entries = tuple(
                    [
                        _Entry(m, count_tokens(counter, (m,)), native, encoded)
                        for m, (native, encoded) in zip(messages, renders, strict=True)
                    ]
                )
            else:
                entries = tuple([_Entry(m, count_tokens(counter, (m,))) for m in messages])
                for i, entry in enumerate(entries):
                    entry.seed(slot, *renders[i])
        else:
            entries = tuple([_Entry(m, count_tokens(counter, (m,))) for m in messages])
        self._checked = (_UNCHECKED, older)  # consumed: the batch's messages are held now
        return entries, sizes

    def _unit_first(self, index: int) -> int:
        """The index of the oldest turn eviction keeps together with ``self._turns[index]``.

        O(the turns tied together), at most ``max_turns`` once committed.
        """
        turns, linked = self._turns, self._linked
        while index > 0 and turns[index].serial in linked:
            index -= 1
        return index

    def _tie(self, turn_id: str, entries: tuple[_Entry, ...], size: int) -> int:
        """Where a new turn's input answers calls: the index of their turn, or -1.

        Such a turn is evicted only together with that turn (and the turns
        tied to it), so they must fit every limit together.

        Raises:
            PairedTurnsTooLargeError: together they would be over a limit.
        """
        turns = self._turns
        if not turns or not any(e.message.tool_results for e in entries):
            return -1
        calls, at = _calls_after(turns)
        if not _answers(calls, [e.message for e in entries]):
            return -1
        first = self._unit_first(at)
        unit = turns[first:]
        limits = self._limits
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
        self,
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

    def _retie(self, position: int) -> None:
        """Tie again the turns after ``position``, whose pairing may have changed.

        Called after the newest turn left (a retraction: ``position`` is the
        new newest); see :meth:`_relinked`.
        """
        linked = self._relinked(self._turns, position)
        self._linked.clear()
        self._linked.update(linked)

    def _relinked(self, turns: tuple[_Turn, ...], position: int) -> set[int]:
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
        first = self._unit_first(position)
        linked = self._linked - {t.serial for t in turns[first + 1 :]}
        for index in range(first + 1, len(turns)):
            calls, at = _calls_after(turns[:index])
            if _answers(calls, turns[index].messages(False)):
                linked.update(t.serial for t in turns[at + 1 : index + 1])
        return linked

    def _check_ties(
        self, turns: tuple[_Turn, ...], linked: set[int], position: int, where: str, turn_id: str
    ) -> None:
        """Refuse a late change to ``turns[position]`` that tied turns cannot fit.

        Turns tied together must fit every limit as the commit of the last of
        them and the records after it found them (:meth:`_tie`, and
        :meth:`check_batch` on items and bytes; tokens count the last one's
        input only, as records are not held to ``max_tokens``), which a
        restore from a checkpoint checks again: a late
        record or kept state that adds a tie (a later input now answers a call
        of the changed turn), or grows a turn tied to a later one, is held to
        it, so what a history holds it can always be rebuilt from.

        Raises:
            PairedTurnsTooLargeError: the turns tied together would be over
                ``max_turns``, ``max_items``, ``max_bytes`` or ``max_tokens``.
        """
        limits = self._limits
        added = linked - self._linked
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
                    raise self._tied_error(where, kind, value, limit, unit, turn_id)

    def commit(
        self,
        turn_id: str,
        input: Sequence[Message],
        *,
        instructions: Sequence[Message] | None = None,
        sequence: int | None = None,
    ) -> None:
        """Commit a new turn with its input; optionally replace the pinned instructions.

        Everything is validated before anything changes. Commit does not evict;
        call :meth:`evict` at a safe point. The turns evicted from then on
        until the history changes otherwise are held aside: retracting this
        turn restores them (see :meth:`retract`). Committing lets go of the
        turns held aside for the previous one; they count as evicted.

        Args:
            turn_id: the new turn's id, unique in this history.
            input: the turn's input messages, oldest first (``user`` messages,
                or ``tool`` results the host supplies); not ``system`` or
                ``developer``.
            instructions: the new pinned ``system``/``developer`` messages, or
                None to keep the current ones.
            sequence: when given, must be greater than the previous committed
                turn's sequence; lets a host detect turns arriving out of order.

        Raises:
            InvalidMessageError: a malformed message or id, an input message with
                a pinned role, or an instruction with another role.
            InvalidTextError: text that is not valid UTF-8.
            ItemTooLargeError: one message is over the per-item byte cap.
            TurnTooLargeError: the input is over ``max_items`` or ``max_bytes``,
                or the instructions over ``max_items`` (checked first).
            PairedTurnsTooLargeError: the input answers tool calls of the
                newest turn (or of turns tied to it), and those turns with
                this one would be over ``max_turns``, ``max_items``,
                ``max_bytes`` or ``max_tokens`` (a subclass of
                ``TurnTooLargeError``; ``unit`` names the limit).
            DuplicateIdError: ``turn_id`` is kept or was evicted (or retracted)
                recently, or an input message has the id of a held message.
            OutOfOrderTurnError: ``sequence`` is not greater than the previous one.
            AmbiguousStepError: the input splits a model step in a shape that
                cannot be paired without guessing, or its first message would
                continue the step the newest turn ends with.
            HostCallbackError: the token counter raised or returned a count
                that is not an int in ``[0, MAX_TOKEN_COUNT]``; nothing changed.
        """
        check_id(turn_id, "turn id")
        if self.has_turn(turn_id) or turn_id in self._evicted_ids:
            raise DuplicateIdError(
                f"Turn {excerpt(turn_id)} was already committed to this context."
            )
        if sequence is not None:
            if not isinstance(sequence, int) or isinstance(sequence, bool) or sequence < 0:
                raise InvalidMessageError(
                    f"Turn {excerpt(turn_id)} sequence must be a non-negative integer, not "
                    f"{excerpt(sequence)}."
                )
            if self._sequence is not None and sequence <= self._sequence:
                raise OutOfOrderTurnError(
                    f"Turn {excerpt(turn_id)} has sequence {sequence}, but turn sequence "
                    f"{self._sequence} was already committed; turns must arrive in order."
                )
        if _first_instruction(input) >= 0:
            reject_instructions(input, "input", f"Turn {excerpt(turn_id)} input")
        entries, sizes = self._entries(input, turn_id, "input")
        check_steps(input, f"Turn {excerpt(turn_id)} input")
        if input and self._turns:
            _check_turn_start(self._turns[-1], input[0], f"Turn {excerpt(turn_id)} input[0]")
        seen: set[str] = set()
        for i, entry in enumerate(entries):
            message_id = entry.message.id
            if message_id is not None:
                if message_id in seen or message_id in self._message_ids:
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
            pinned, pinned_sizes = self._entries(instructions, turn_id, "instructions", pinned=True)
        size = sum(sizes)
        tied = self._tie(turn_id, entries, size)
        # Validated: change state.
        if self._aside is not None:
            self._settle()
        self._aside = _NOTHING_ASIDE  # what evictions drop from now on can be restored
        if pinned is not None:
            self._pinned = pinned
            self._pinned_bytes = sum(pinned_sizes)
            self._pinned_tokens = sum(e.tokens for e in pinned)
        if sequence is not None:
            self._sequence = sequence
        self._serial += 1
        turn = _Turn(
            turn_id,
            entries,
            (),
            size,
            sum([e.tokens for e in entries]),
            self._serial,
        )
        for entry in entries:
            if entry.message.id is not None:
                self._message_ids[entry.message.id] = (self._serial, entry.message)
        if tied >= 0:
            self._linked.update(t.serial for t in self._turns[tied + 1 :])
            self._linked.add(turn.serial)
        self._turns = (*self._turns, turn)
        self._ids.add(turn_id)
        self._items += turn.items
        self._bytes += turn.bytes
        self._tokens += turn.tokens
        self._view = None

    def output_renders(
        self, turn_id: str, gateway: Gateway, newest: int | None = None
    ) -> dict[int, Sequence[NativeContent]]:
        """The held outputs of ``turn_id`` rendered for ``gateway``, by ``id()`` of their message.

        Each output message object the history holds (so one that passed
        :meth:`check_batch`) maps to its cached render, rendered and cached
        now if it was not yet (a history restored from a store). Empty when
        no turn ``turn_id`` is held. O(the turn's outputs), or O(``newest``)
        when given: only the turn's last ``newest`` outputs are mapped. The
        ids are valid while the caller holds the messages (the history holds
        them too).

        Raises:
            ProviderRuleError: ``gateway`` cannot render a held output (it
                rendered at the door unless the history was built without one).
        """
        for turn in reversed(self._turns):
            if turn.turn_id == turn_id:
                slot = self._shared.gateway_slot(gateway)
                renders: dict[int, Sequence[NativeContent]] = {}
                outputs = turn.outputs
                if newest is not None:
                    outputs = outputs[max(0, len(outputs) - newest) :]
                for entry in outputs:
                    native = entry.rendered(gateway, slot)[0]
                    renders[id(entry.message)] = native if type(native) is tuple else (native,)  # type: ignore[assignment]
                return renders
        return {}

    def turn_serial(self, turn_id: str) -> int:
        """The serial of the held turn ``turn_id``: unique in this history, never reused.

        Pass it to :meth:`record` so that outputs arriving after the turn is
        gone are dropped even when its id was forgotten and reused.

        Raises:
            UnknownTurnError: ``turn_id`` is not held.
        """
        for turn in reversed(self._turns):
            if turn.turn_id == turn_id:
                return turn.serial
        raise UnknownTurnError(f"Turn {excerpt(turn_id)} is not held by this context.")

    def record(self, turn_id: str, outputs: Sequence[Message], *, serial: int | None = None) -> int:
        """Append a turn's outputs (model messages, tool results), in order.

        Empty and whitespace-only messages (an interrupted model output) are
        not recorded, and counted. A message whose id the turn already holds
        with equal content (an output committed twice) is not stored again,
        and counted. Outputs for a turn no longer held are *late*: dropped and
        counted; they never bring the turn back. A turn is known to be gone
        when its id is remembered as evicted or retracted, when ``serial``
        names another turn than the one now holding ``turn_id`` (the id was
        reused), or when ids of gone turns were forgotten (an id never
        committed then cannot be told from one of them). Record does not
        evict; call :meth:`evict` at a safe point.

        Args:
            turn_id: the turn the outputs belong to.
            outputs: the messages, oldest first.
            serial: the turn's :meth:`turn_serial`, when the caller kept it.

        Returns:
            how many messages were recorded.

        Raises:
            UnknownTurnError: ``turn_id`` was certainly never committed (no id
                of a gone turn was forgotten yet).
            InvalidMessageError, InvalidTextError: a malformed message;
                nothing was recorded.
            DuplicateIdError: a message has the id of a held message with
                other content, or of a message of another turn; nothing was
                recorded.
            AmbiguousStepError: the kept outputs continue the turn's model
                step in a shape that cannot be paired without guessing (see
                :func:`~turnloom.context.check_steps`), or a late record would
                let the next turn's first message continue its step; nothing
                was recorded.
            ItemTooLargeError: one message is over the per-item byte cap;
                nothing was recorded.
            TurnTooLargeError: the turn would hold more than ``max_items``
                messages or ``max_bytes`` bytes; nothing was recorded.
                :class:`~turnloom.errors.PairedTurnsTooLargeError` when the
                turn is tied to other turns (see the class docstring), newest
                or not, and the tied turns together would.
            StrandedResultsError: ``turn_id`` is not the newest turn and the
                outputs would leave a result a later turn holds answering no
                call (they end its call group, or answer its call first):
                pairing would drop it from every later model input; nothing
                was recorded. A :class:`~turnloom.errors.StateError`; its
                fields name ``turn_id``, the later turn and the results'
                call ids.
            HostCallbackError: the token counter raised or returned a count
                that is not an int in ``[0, MAX_TOKEN_COUNT]``; nothing was
                recorded.
        """
        position = -1
        for i in range(len(self._turns) - 1, -1, -1):
            if self._turns[i].turn_id == turn_id:
                position = i
                break
        if position < 0 or (serial is not None and self._turns[position].serial != serial):
            known = position >= 0 or serial is not None or turn_id in self._evicted_ids
            if known or self._forgotten:
                # Validate anyway: a malformed late output is still an error.
                self._entries(outputs, turn_id, "output")
                self._late_dropped += len(outputs)
                return 0
            raise UnknownTurnError(f"Turn {excerpt(turn_id)} was never committed to this context.")
        entries, sizes = self._entries(outputs, turn_id, "output", turn_id)
        old = self._turns[position]
        kept: list[_Entry] = []
        kept_at: list[int] = []
        kept_bytes = 0
        added: dict[str, Message] = {}
        duplicates = blank = 0
        for i, entry in enumerate(entries):
            message = entry.message
            if message.id is not None:
                held = self._message_ids.get(message.id)
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
        if not kept:
            self._duplicates += duplicates
            self._blank_dropped += blank
            return 0
        check_steps(
            [e.message for e in kept],
            f"Turn {excerpt(turn_id)} output",
            before=_step_tail(old),
            indices=kept_at,
        )
        if position + 1 < len(self._turns):
            later = self._turns[position + 1].entries(True)
            if later:
                _check_turn_start(
                    old.with_outputs(tuple(kept), 0),
                    later[0].message,
                    f"Turn {excerpt(self._turns[position + 1].turn_id)} input[0], after turn "
                    f"{excerpt(turn_id)}'s late output,",
                )
        current = self._turns
        late = position != len(current) - 1
        # Nothing dropped (the usual case): the entries tuple is the outputs added.
        new = old.with_outputs(entries if len(kept) == len(entries) else tuple(kept), kept_bytes)
        turns = (
            (*current[:position], new, *current[position + 1 :]) if late else (*current[:-1], new)
        )
        if late:
            stranded, call_ids = _strands(self._turns, turns, position)
            if stranded >= 0:
                raise StrandedResultsError(
                    f"A late output of turn {excerpt(turn_id)} would leave results that turn "
                    f"{excerpt(self._turns[stranded].turn_id)} holds answering no tool call "
                    "(it ends their call group, or answers their call first), so they would "
                    "leave every later model input; nothing was recorded.",
                    turn_id=turn_id,
                    stranded_turn_id=self._turns[stranded].turn_id,
                    call_ids=call_ids,
                )
            linked = self._relinked(turns, position)
            self._check_ties(turns, linked, position, f"Turn {excerpt(turn_id)} output", turn_id)
        self._duplicates += duplicates
        self._blank_dropped += blank
        if self._aside is not None:
            self._settle()
        if late:
            self._generation += 1
            self._linked.clear()
            self._linked.update(linked)
        for entry in kept:
            if entry.message.id is not None:
                self._message_ids[entry.message.id] = (old.serial, entry.message)
        self._turns = turns
        self._items += len(kept)
        self._bytes += new.bytes - old.bytes
        self._tokens += new.tokens - old.tokens
        self._view = None
        return len(kept)

    def keep_state(
        self, turn_id: str, messages: Sequence[Message], *, serial: int | None = None
    ) -> bool:
        """Keep ``messages`` as the turn's state, in place of any it kept before.

        Kept state sits between the turn's input and its outputs once the turn
        is an earlier turn of a render (a render of the turn's own input never
        holds it), so a host that sent its model per-turn state there (the
        runtime-state pair) sends the same bytes again in later inputs. It
        counts like recorded messages (items, bytes, tokens, against the
        limits) and leaves with its turn (eviction, retraction). An empty
        ``messages`` keeps none. Keeping does not evict; call :meth:`evict`
        at a safe point.

        Args:
            turn_id: the held turn.
            messages: the state messages, oldest first; messages without an id.
            serial: the turn's :meth:`turn_serial`, when the caller kept it.

        Returns:
            True when the turn is held and now keeps ``messages``; False when
            it is no longer held (evicted, retracted, or ``serial`` names
            another turn), or when a later turn holds results answering calls
            of the turn that the kept messages would end (they sit before
            those results; pairing would then drop them): nothing changed.

        Raises:
            InvalidMessageError: a malformed message, one with a pinned role or
                one with an id; nothing changed.
            InvalidTextError: text that is not valid UTF-8; nothing changed.
            ItemTooLargeError: one message is over the per-item byte cap;
                nothing changed.
            HostCallbackError: the token counter raised or returned a count
                that is not an int in ``[0, MAX_TOKEN_COUNT]``; nothing changed.
        """
        reject_instructions(messages, "state", f"Turn {excerpt(turn_id)} state")
        cap = self._limits.max_item_bytes
        counter = self._shared.counter
        entries: list[_Entry] = []
        state_bytes = 0
        for i, message in enumerate(messages):
            label = f"turn {excerpt(turn_id)} state[{i}]"
            size = check_message(message, where=label)
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
        position = len(self._turns) - 1
        while position >= 0 and self._turns[position].turn_id != turn_id:
            position -= 1
        if position < 0 or (serial is not None and self._turns[position].serial != serial):
            return False
        old = self._turns[position]
        if len(old.state) == len(entries) and all(
            a.message == b.message for a, b in zip(old.state, entries, strict=True)
        ):
            return True
        new = old.with_state(tuple(entries), state_bytes)
        turns = (*self._turns[:position], new, *self._turns[position + 1 :])
        late = position != len(self._turns) - 1
        if late:
            if _strands(self._turns, turns, position)[0] >= 0:
                return False
            linked = self._relinked(turns, position)
            try:
                self._check_ties(turns, linked, position, f"Turn {excerpt(turn_id)} state", turn_id)
            except PairedTurnsTooLargeError:
                return False
            self._settle()  # a turn before the newest changed: the evicted turns stay gone
            self._generation += 1
            self._linked.clear()
            self._linked.update(linked)
        self._turns = turns
        self._items += new.items - old.items
        self._bytes += new.bytes - old.bytes
        self._tokens += new.tokens - old.tokens
        self._view = None
        return True

    def evict(self) -> tuple[str, ...]:
        """Drop whole turns, oldest first, until every limit holds.

        A turn leaves together with the later turns tied to it (their input
        answers its calls; see the class docstring), so eviction may drop more
        than a limit alone asks for. The newest turn, and the turns it is tied
        to, are never evicted: they are kept alone when over a limit (over
        ``max_tokens`` through records, or over any limit through kept state,
        which is never refused; commits and records refuse the rest).
        Pinned instructions are never evicted, and never counted against a
        limit. O(evicted turns), plus the turns tied to the newest when they
        stop it.

        The turns evicted while the newest turn and its kept state are all
        that changed since its commit are held aside, neither kept nor
        counted in ``evicted_turns`` (:attr:`restorable_ids`), until
        :meth:`retract` of that turn restores them or another change (a
        commit, a record that stores a message, kept state of an earlier
        turn, :meth:`remember_evicted`, :meth:`settle_evictions`) lets them
        go: at most the turns held when that turn was committed.

        Returns:
            the ids of the evicted turns, oldest first.
        """
        count = 0
        items = total = tokens = 0
        limits = self._limits
        max_tokens = limits.max_tokens
        turns, linked = self._turns, self._linked
        while (
            len(turns) - count > limits.max_turns
            or self._items - items > limits.max_items
            or self._bytes - total > limits.max_bytes
            or (max_tokens is not None and self._tokens - tokens > max_tokens)
        ):
            # The oldest turn goes with the turns tied to it (their input
            # answers its calls), or not at all when they reach the newest.
            end = count + 1
            while end < len(turns) and turns[end].serial in linked:
                end += 1
            if end >= len(turns):
                break
            for turn in turns[count:end]:
                items += turn.items
                total += turn.bytes
                tokens += turn.tokens
            count = end
        if not count:
            return ()
        gone = turns[:count]
        self._turns = turns[count:]
        self._items -= items
        self._bytes -= total
        self._tokens -= tokens
        self._front += count
        aside = self._aside
        if aside is None:
            self._count_evicted(gone)
            for turn in gone:
                self._forget(turn)
        else:
            # Since the newest commit nothing else changed: held aside for its
            # retraction, counted as evicted once they cannot be restored.
            tied = tuple([t.serial for t in gone if t.serial in linked]) if linked else ()
            popped: list[str] = []
            for turn in gone:
                self._forget(turn, popped)
            if aside is _NOTHING_ASIDE:  # the first eviction since the commit, usually the only one
                self._aside = _Aside(gone, tied, tuple(popped), turns[-1])
            else:
                self._aside = _Aside(
                    aside.turns + gone,
                    aside.linked + tied,
                    aside.popped + tuple(popped),
                    turns[-1],
                )
        self._view = None
        return tuple(t.turn_id for t in gone)

    def _count_evicted(self, turns: tuple[_Turn, ...]) -> None:
        """Count ``turns`` as evicted for good (the statistics' ``evicted_*``)."""
        self._evicted += len(turns)
        for turn in turns:
            self._evicted_items += turn.items
            self._evicted_bytes += turn.bytes
            self._evicted_tokens += turn.tokens

    def _settle(self) -> None:
        """The turns held aside can no longer be restored: count them evicted, let them go."""
        aside = self._aside
        self._aside = None
        if aside is not None and aside.turns:
            self._count_evicted(aside.turns)

    def settle_evictions(self) -> None:
        """Let go of the turns held aside (:attr:`restorable_ids`): they count as evicted now.

        For a history about to be dropped (its context removed). O(1) but for
        the turns held aside.
        """
        self._settle()

    @property
    def restorable_ids(self) -> tuple[str, ...]:
        """Ids of the turns a retraction of the newest turn would restore, oldest first.

        The turns the evictions since the newest commit dropped, held aside
        until the history changes otherwise (see :meth:`retract`); empty when
        there are none.
        """
        aside = self._aside
        return tuple(t.turn_id for t in aside.turns) if aside is not None else ()

    def before_evictions(self) -> tuple[HistoryView, tuple[str, ...]]:
        """The history as the evictions since the newest commit found it, for a checkpoint.

        Returns a view holding the turns held aside (:attr:`restorable_ids`)
        before the kept ones, the newest with the kept state the latest
        eviction found it with, and the evicted turn ids remembered then,
        oldest first; replaying that view, then :meth:`evict` (which evicts
        the turns held aside again: they were over the limits with that
        state), then keeping the newest turn's state now, rebuilds this
        history. Without turns held aside, :meth:`view` and
        :attr:`evicted_ids`. The view is meant to be read; it renders
        privately (as an older view). O(turns held and remembered ids).
        """
        aside = self._aside
        if aside is None or not aside.turns:
            return self.view(), self.evicted_ids
        turns = (*aside.turns, *self._turns[:-1], cast(_Turn, aside.newest))
        held = len(self._pinned) + sum(t.items for t in turns)
        view = HistoryView(self._pinned, turns, self._front, -1, self._shared, held)
        return view, tuple(aside.remembered_before(tuple(self._evicted_ids)))

    def _restore(self, aside: _Aside) -> None:
        """Undo the evictions held in ``aside``: each one's turns, counts, ids and ties back.

        The inverse of the evictions (:meth:`evict`, :meth:`_forget`): the
        turns go back in front, held; their ids leave the remembered ids and
        the ids they pushed out come back; their ties are restored. Turns
        before the newest changed, so views render anew (the generation).
        """
        turns = aside.turns
        self._turns = (*turns, *self._turns)
        for turn in turns:
            self._items += turn.items
            self._bytes += turn.bytes
            self._tokens += turn.tokens
            self._ids.add(turn.turn_id)
            for message in _identified(turn):
                self._message_ids[cast(str, message.id)] = (turn.serial, message)
        self._linked.update(aside.linked)
        remembered = aside.remembered_before(tuple(self._evicted_ids))
        self._evicted_ids.clear()
        self._evicted_ids.update(dict.fromkeys(remembered))
        self._forgotten -= len(aside.popped)
        self._generation += 1
        self._view = None

    def _forget(self, turn: _Turn, popped: list[str] | None = None) -> None:
        """Drop a turn's ids; remember its id as gone (a bounded number of them).

        With ``popped``, the remembered ids this pushes out are appended to it.
        """
        self._ids.discard(turn.turn_id)
        self._linked.discard(turn.serial)
        message_ids = self._message_ids
        if message_ids:
            for message in _identified(turn):
                message_ids.pop(cast(str, message.id), None)
        self._evicted_ids[turn.turn_id] = None
        while len(self._evicted_ids) > self._remember:
            turn_id, _ = self._evicted_ids.popitem(last=False)
            self._forgotten += 1
            if popped is not None:
                popped.append(turn_id)

    def retract(self, turn_id: str) -> None:
        """Take back the newest turn, which produced no output (a false start).

        The turn's input leaves the history as if it had never been
        committed: the next turn's input does not hold it, and the turns the
        evictions since its commit dropped (:attr:`restorable_ids`) are held
        again, oldest first, with their outputs, kept state, ties and
        message ids, no longer remembered as evicted (the ids their
        remembering pushed out are remembered again) and not counted in
        ``evicted_turns``. The history is then what it was before the commit
        but for the turn's own id, which is remembered like an evicted
        turn's: it cannot be committed again, and outputs recorded for it
        later are dropped and counted. The sequence it carried stays used,
        and pinned instructions the commit set stay set. Turns are
        restored only while nothing but evictions and the turn's own kept
        state changed since the commit (see :meth:`evict`). O(the turns
        restored and the remembered ids) when turns are restored; the next
        render of a view rebuilds its cached run (O(history), in a worker
        thread).

        Raises:
            InvalidMessageError: a malformed id.
            UnknownTurnError: ``turn_id`` is not held.
            StateError: ``turn_id`` is not the newest turn, or outputs were
                recorded for it (it answered: record a correction instead).
        """
        check_id(turn_id, "turn id")
        if not self.has_turn(turn_id):
            raise UnknownTurnError(f"Turn {excerpt(turn_id)} is not held by this context.")
        turn = self._turns[-1]
        if turn.turn_id != turn_id:
            raise StateError(
                f"Turn {excerpt(turn_id)} is not the newest turn ({excerpt(turn.turn_id)} "
                f"is); only the "
                "newest turn can be retracted."
            )
        if turn.outputs:
            raise StateError(
                f"Turn {excerpt(turn_id)} has {len(turn.outputs)} recorded output(s); only a turn "
                "that produced no answer can be retracted."
            )
        aside, self._aside = self._aside, None
        if aside is not None and aside.turns:
            self._restore(aside)
        self._turns = self._turns[:-1]
        self._items -= turn.items
        self._bytes -= turn.bytes
        self._tokens -= turn.tokens
        self._retracted += 1
        tied = turn.serial in self._linked
        self._forget(turn)
        if tied:
            # Its input's tie may be the only reason turns before it were tied.
            self._retie(len(self._turns) - 1)
        self._view = None

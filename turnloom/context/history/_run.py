"""The cached run of closed turns, shared by a history's views, and its encoded body."""

from __future__ import annotations

import array
import bisect
import gc
import itertools
import threading
from collections.abc import Sequence

from turnloom.context._untrack import untrack_atoms, untrack_container
from turnloom.context.body import BodyRun, WholeSegments, body_writer
from turnloom.context.callids import (
    CallIdRenamer,
)
from turnloom.context.gateway import Gateway, NativeContent
from turnloom.context.history._cells import _CacheKey, _CallLog, _ends, _Entry, _Rendered, _Turn
from turnloom.context.items import (
    ChunkedSpan,
    compaction_due,
    decode_joined,
    split_chunk,
)
from turnloom.context.message import (
    ToolCallPart,
)
from turnloom.context.tokens import TokenCounter


class _Run:
    """The rendered items of the pinned instructions and the closed turns.

    ``pinned`` is the pinned instructions' render (native, with encodings).
    The closed turns' items are kept only encoded, renamed as the run sends
    them, their JSON joined by ``,`` into ``chunks`` (see
    :class:`~turnloom.context.items.ChunkedSpan`): one ``bytes`` per turn
    for the newest turns (from ``loose_from`` on), and, once
    :data:`_BLOCK_TURNS` of those are held, one *block* joining theirs, so
    joining the run (a request body) copies about one piece per block of
    turns, not one per turn; the body shares the blocks
    (:meth:`~turnloom.context.body.BodyRun.adopt`). Per chunk:
    ``chunk_stops`` (one past its last turn's slot), ``chunk_items`` and
    ``chunk_bytes`` (where it ends, running); per-turn slot 0 begins at
    ``zero_items`` and ``zero_bytes``. ``offsets`` is where each item ends
    in running bytes, oldest first, after ``skip`` slots dropped at the
    front. Per turn, oldest first, after ``dead`` slots dropped at the
    front: ``item_ends`` and ``byte_ends``
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
        "chunk_bytes",
        "chunk_items",
        "chunk_stops",
        "chunks",
        "dead",
        "epoch",
        "evicted",
        "first_tag",
        "generation",
        "item_ends",
        "last",
        "loose_from",
        "offsets",
        "origin",
        "pinned",
        "pinned_entries",
        "skip",
        "tokens",
        "turn_carried",
        "turn_tokens",
        "zero_bytes",
        "zero_items",
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
        self.chunk_stops = _ends()
        self.chunk_items = _ends()
        self.chunk_bytes = _ends()
        self.loose_from = 0
        self.zero_items = 0
        self.zero_bytes = 0
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
        """The run's encoded items, oldest first, in O(log chunks) (valid while the run lives)."""
        first = bisect.bisect_right(self.chunk_stops, self.dead)
        lead, lead_base = self._slot_start(self.chunk_stops[first - 1] if first else 0)
        return ChunkedSpan(
            self.chunks,
            first,
            len(self.chunks),
            self.chunk_items,
            self.chunk_bytes,
            self.origin,
            self.base,
            self.offsets,
            self.skip,
            lead,
            lead_base,
        )

    def _slot_start(self, slot: int) -> tuple[int, int]:
        """Where per-turn slot ``slot`` begins: (items, bytes), running."""
        if slot:
            return self.item_ends[slot - 1], self.byte_ends[slot - 1]
        return self.zero_items, self.zero_bytes

    def _slot_length(self, slot: int) -> int:
        """The length of per-turn slot ``slot``'s items joined by ``,`` (bytes; 0: no item)."""
        items, size = self._slot_start(slot)
        count = self.item_ends[slot] - items
        return self.byte_ends[slot] - size + count - 1 if count else 0

    def _item_ends(self, index: int) -> tuple[array.array[int], int]:
        """Where each item of turn ``index`` ends, and where its first begins (running bytes)."""
        at = self.dead + index
        start = self.item_ends[at - 1] if at > self.dead else self.origin
        base = self.byte_ends[at - 1] if at > self.dead else self.base
        first = self.skip + start - self.origin
        return self.offsets[first : first + self.item_ends[at] - start], base

    def turn_chunk(self, index: int) -> bytes:
        """The encoded items of the run's turn ``index`` (0 = oldest held) joined by ``,``.

        The turn's own chunk, or its part of a block cut out (a copy).
        """
        slot = self.dead + index
        stops = self.chunk_stops
        number = bisect.bisect_right(stops, slot)
        begin = stops[number - 1] if number else 0
        chunk = self.chunks[number]
        if begin == slot and stops[number] == slot + 1:
            return chunk
        length = self._slot_length(slot)
        if not length:
            return b""
        chunk_items, chunk_bytes = self._slot_start(begin)
        items, size = self._slot_start(slot)
        at = size - chunk_bytes + items - chunk_items  # a separator after each earlier item
        return chunk[at : at + length]

    def encodings(self, index: int) -> list[bytes]:
        """The encoded items of the run's turn ``index`` (0 = oldest held), one ``bytes`` each."""
        ends, base = self._item_ends(index)
        return split_chunk(self.turn_chunk(index), ends, base)

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
        """Copy the kept slots into new containers (O(kept)); spans handed out stay valid.

        A block whose front was dropped is kept whole, with its dropped
        turns' slots (fewer than a block's turns).
        """
        if self.body is not None:
            self.body.compact()
        if self.skip:
            self.offsets = _ends(self.offsets[self.skip :])
            self.skip = 0
        number = bisect.bisect_right(self.chunk_stops, self.dead)
        cut = self.chunk_stops[number - 1] if number else 0  # the dropped chunks' slots
        if cut:
            self.zero_items, self.zero_bytes = self._slot_start(cut)
            self.chunks = self.chunks[number:]
            untrack_container(self.chunks)
            self.chunk_stops = _ends(array.array("q", [s - cut for s in self.chunk_stops[number:]]))
            self.chunk_items = _ends(self.chunk_items[number:])
            self.chunk_bytes = _ends(self.chunk_bytes[number:])
            self.loose_from = max(0, self.loose_from - number)
            self.item_ends = _ends(self.item_ends[cut:])
            self.byte_ends = _ends(self.byte_ends[cut:])
            self.turn_tokens = _ends(self.turn_tokens[cut:])
            self.turn_carried = self.turn_carried[cut:]
            self.calls = self.calls[cut:]
            untrack_container(self.calls)
            self.dead -= cut

    def join(self, renamed: _Rendered, carried: bool, calls: _CallLog | None) -> bytes:
        """Append one closed turn, ``renamed`` with the run's call ids (``calls``); its chunk."""
        chunk = self.add(renamed.encoded, renamed.bytes, renamed.tokens, carried, calls)
        body = self.body
        if body is not None:
            tag = self.first_tag + self.turns - 1
            body.append(renamed.items, tag, renamed.encoded, chunk)
        self.seal_blocks(body)
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
        joined by ``,``), else the items joined. It is held as one chunk of
        its own until :meth:`seal_blocks`.
        """
        if chunk is None:
            chunk = b",".join(encoded)
        items_at = self.item_ends[-1] if self.item_ends else self.zero_items
        bytes_at = self.byte_ends[-1] if self.byte_ends else self.zero_bytes
        ends = itertools.accumulate(map(len, encoded), initial=bytes_at)
        self.offsets.extend(itertools.islice(ends, 1, None))  # past the initial value
        self.item_ends.append(items_at + len(encoded))
        self.byte_ends.append(bytes_at + size)
        self.turn_tokens.append(tokens)
        self.turn_carried.append(1 if carried else 0)
        self.calls.append(calls)
        self.tokens += tokens
        self._add_chunk(chunk)
        return chunk

    def _add_chunk(self, chunk: bytes) -> None:
        """Hold ``chunk`` as the chunk of the turns after the last chunk's, up to the last turn."""
        self.chunks.append(chunk)
        self.chunk_stops.append(len(self.item_ends))
        self.chunk_items.append(self.item_ends[-1])
        self.chunk_bytes.append(self.byte_ends[-1])

    def seal_blocks(self, body: BodyRun | None = None) -> None:
        """Join each :data:`_BLOCK_TURNS` oldest one-turn chunks, all kept, into one block.

        With ``body`` (this run's, fed the same turns), a block is formed
        only when the body holds those turns' chunks as they are, and it
        :meth:`~turnloom.context.body.BodyRun.adopt`-s the block, so the
        bytes stay held once: while a turn of them is still open in the
        body, they wait for a later call; when the body holds one of them
        otherwise (an item merged across turns), they stay one chunk per
        turn. Spans handed out stay valid.
        """
        chunks, stops = self.chunks, self.chunk_stops
        while len(chunks) - self.loose_from >= _BLOCK_TURNS:
            first = self.loose_from
            begin = stops[first - 1] if first else 0
            if begin < self.dead:
                break  # it would hold dropped turns: the history keeps fewer than a block
            stop = first + _BLOCK_TURNS
            pieces = list(filter(None, chunks[first:stop]))
            if body is not None and pieces and body.holds(pieces) < 0:
                if body.open_through(self.first_tag + stops[stop - 1] - 1 - self.dead):
                    break  # the body seals its last turn once the next one is fed
                self.loose_from = stop  # never as they are: kept per turn, shared
                continue
            block = b",".join(pieces)
            # New containers: spans share the old ones (only ever appended to).
            chunks = self.chunks = [*chunks[:first], block, *chunks[stop:]]
            untrack_container(chunks)  # bytes only
            stops = self.chunk_stops = _cut(stops, first, stop)
            self.chunk_items = _cut(self.chunk_items, first, stop)
            self.chunk_bytes = _cut(self.chunk_bytes, first, stop)
            self.loose_from = first + 1
            if body is not None and pieces:
                body.adopt(block, pieces)

    def add_kept(self, run: _Run, first: int, stop: int) -> None:
        """Append ``run``'s turns ``first`` to ``stop - 1`` (0 = oldest held) as they are.

        Their chunks, item sizes, tokens, carried flags and ``calls`` are
        ``run``'s, moved to this run's running coordinates: C-speed copies,
        O(their items); a block of ``run``'s is shared when all its turns
        are taken, a turn of any other block is cut out of it.
        """
        if first >= stop:
            return
        dead = run.dead
        at, end = dead + first, dead + stop
        start = run.item_ends[at - 1] if at > dead else run.origin
        base = run.byte_ends[at - 1] if at > dead else run.base
        items_at = self.item_ends[-1] if self.item_ends else self.zero_items
        bytes_at = self.byte_ends[-1] if self.byte_ends else self.zero_bytes
        slots = len(self.item_ends) - at  # what a slot of ``run``'s is here, less its own
        item = run.skip + start - run.origin
        shift = (bytes_at - base).__add__
        self.offsets.extend(map(shift, run.offsets[item : item + run.item_ends[end - 1] - start]))
        self.item_ends.extend(map((items_at - start).__add__, run.item_ends[at:end]))
        self.byte_ends.extend(map(shift, run.byte_ends[at:end]))
        tokens = run.turn_tokens[at:end]
        self.turn_tokens.extend(tokens)
        self.tokens += sum(tokens)
        self.turn_carried.extend(run.turn_carried[at:end])
        self.calls.extend(run.calls[at:end])
        stops = run.chunk_stops
        number = bisect.bisect_right(stops, at)
        slot = at
        while slot < end:
            begin, chunk_stop = (stops[number - 1] if number else 0), stops[number]
            if begin >= at and chunk_stop <= end:
                self.chunks.append(run.chunks[number])
                self.chunk_stops.append(chunk_stop + slots)
                self.chunk_items.append(self.item_ends[chunk_stop + slots - 1])
                self.chunk_bytes.append(self.byte_ends[chunk_stop + slots - 1])
                if chunk_stop - begin > 1:
                    self.loose_from = len(self.chunks)
                slot = chunk_stop
            else:
                for cut in range(slot, min(chunk_stop, end)):
                    self.chunks.append(run.turn_chunk(cut - dead))
                    self.chunk_stops.append(cut + slots + 1)
                    self.chunk_items.append(self.item_ends[cut + slots])
                    self.chunk_bytes.append(self.byte_ends[cut + slots])
                slot = min(chunk_stop, end)
            number += 1

    def natives(self, first: int, stop: int) -> list[NativeContent]:
        """The items of the run's turns ``first`` to ``stop - 1`` decoded (O(their bytes))."""
        return decode_joined(b",".join(filter(None, map(self.turn_chunk, range(first, stop)))))

    def whole_segments(self) -> list[WholeSegments | _Segment]:
        """The body segments of the run's turns (see :func:`_body_run`), oldest first.

        A block whose turns are all kept is one :class:`WholeSegments`; any
        other turn is a segment of its own, its chunk cut out of a block.
        """
        out: list[WholeSegments | _Segment] = []
        stops, dead = self.chunk_stops, self.dead
        for number in range(bisect.bisect_right(stops, dead), len(self.chunks)):
            begin, stop = (stops[number - 1] if number else 0), stops[number]
            if begin >= dead and stop - begin > 1:
                lengths = [self._slot_length(slot) for slot in range(begin, stop)]
                tag = self.first_tag + begin - dead
                out.append(WholeSegments(self.chunks[number], tag, lengths))
                continue
            for slot in range(max(begin, dead), stop):
                index = slot - dead
                out.append((None, self.first_tag + index, (), self.turn_chunk(index)))
        return out


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


_BLOCK_TURNS = 64
"""How many turns' chunks a run joins into one block (see :class:`_Run`)."""
_NO_ENDS: array.array[int] = array.array("q")


def _cut(ends: array.array[int], first: int, stop: int) -> array.array[int]:
    """A new array of ``ends`` with entries ``first`` to ``stop - 2`` left out (a block's)."""
    out = _ends(ends[:first])
    out.extend(ends[stop - 1 :])
    return out


_Segment = tuple[Sequence[NativeContent] | None, int, Sequence[bytes], bytes | None]
"""A body segment: items (None: not decoded), tag, their encodings, and their chunk
(see ``BodyRun.append``)."""
_NO_SPAN = ChunkedSpan([], 0, 0, _NO_ENDS, _NO_ENDS, 0, 0, _NO_ENDS, 0)


def _body_run(gateway: Gateway, run: _Run) -> BodyRun | None:
    """The encoded request body of a run's items (segment 0 the pinned, then each turn)."""
    writer = body_writer(gateway, renamed=True)  # fed the run's renamed items
    if writer is None:
        return None
    segments: list[WholeSegments | _Segment] = [(run.pinned.items, 0, run.pinned.encoded, None)]
    # A turn's items are decoded from its chunk only if the writer needs them.
    segments.extend(run.whole_segments())
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

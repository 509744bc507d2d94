"""Native items with a run of them kept as JSON bytes, decoded when first read.

A history keeps the items of its pinned instructions and closed turns in a
*run* (see :class:`~turnloom.context.TurnHistory`): the closed turns' items
are held only as their JSON encoding (one ``bytes`` object per item, the same
objects the encoded request body is joined from), not as dicts. A render
hands them out as :class:`NativeItems`: the items before the run (native),
the run's encoded items, then the items after it (native). Building one is
O(1) beyond a C-speed copy of the run's references; the native tuple is
decoded once, on first read, and then kept by the
object (not by the history). Decoded items equal, by value, the items the
run was encoded from: items are JSON data (the door checks them), and
msgspec decodes its own encoding to equal values.
"""

from __future__ import annotations

__all__ = (
    "COPY_AHEAD_ITEMS",
    "TAKEN_BUILD",
    "TAKEN_ITEMS",
    "ChunkedSpan",
    "EncodedSpan",
    "NativeItems",
    "common_prefix",
    "compaction_due",
    "decode_joined",
    "encode_item",
    "exact_bytes",
    "split_chunk",
)

import bisect
import gc
from collections.abc import Iterable, Iterator, Sequence
from itertools import compress, count, islice, repeat
from operator import is_
from typing import Any, overload

import msgspec

from turnloom.context._fresh import fresh_items, fresh_json
from turnloom.context._untrack import untrack_atoms, untrack_container, untrack_json
from turnloom.context.gateway import NativeContent

TAKEN_ITEMS = 1
""":attr:`NativeItems.taken`: a copy was taken by a read of ``PreparedContext.items``."""
TAKEN_BUILD = 2
""":attr:`NativeItems.taken`: a copy was taken by ``build`` (or ``request_body``)."""
COPY_AHEAD_ITEMS = 512
"""The fewest items for which a host's copies of a prefix are made ahead, in the
render worker. A shorter prefix is copied where it is read, on the event loop:
at most this many items. Below it, copies made ahead cost more than they save:
a copy waiting for its taker is live data the cyclic collector tracks (a host
may build cycles through it), new since the collector's last step, so every
step and full collection walks it (measured with ``scripts/bench_loadtest.py``
at 1,000 sessions and a few hundred items per prefix: with a floor of 32, even
with each prefix's first copy reused from the one the turn before left
untaken, the collector's steps cost 78 ms of CPU instead of 18, CPU per
prepare 959 us instead of 734)."""

_decode = msgspec.json.Decoder().decode
# A JSON array straight into a tuple (inner arrays stay lists): a host copy in one C call.
_decode_tuple = msgspec.json.Decoder(tuple).decode
_encode = msgspec.json.Encoder().encode


def exact_bytes(encoded: bytes) -> bytes:
    """``encoded`` in a ``bytes`` object of exactly its size (a copy: one memcpy).

    msgspec returns its output buffer, which holds up to half as much again
    unused; an encoding that is kept is copied once.
    """
    return bytes(memoryview(encoded))


def encode_item(item: Any) -> bytes:
    """The JSON encoding of one native item, to keep (:func:`exact_bytes`)."""
    return exact_bytes(_encode(item))


def compaction_due(dead: int, live: int) -> bool:
    """True when a log holding ``dead`` dropped slots before ``live`` kept ones should compact.

    Caches that drop at the front only move their start (so what a render
    handed out stays valid without a copy) and copy the kept slots into a
    new container once the dropped ones are more than a sixteenth of them
    (and 64): memory held for dropped slots stays under that share, and
    each kept slot is copied O(1) times per sixteenth of the log dropped.
    """
    return dead > 64 + live // 16


class EncodedSpan(Sequence[bytes]):
    """Slots ``start:stop`` of a list of encodings, without copying them; immutable.

    The owner of the list only appends to it while a span of it lives (a
    cache dropping at the front moves its own start and compacts into a
    new list), so the span's slots never change. Made in O(1); a slice of
    it is a list (O(its length)).
    """

    __slots__ = ("_items", "_start", "_stop")

    def __init__(self, items: list[bytes], start: int, stop: int) -> None:
        self._items = items
        self._start = start
        self._stop = stop
        # It refers to a list of bytes and ints only: in no cycle, so out of
        # the cyclic collector (a held prefix adds no tracked object for it).
        untrack_atoms(self)

    def __len__(self) -> int:
        return self._stop - self._start

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        size = self._stop - self._start
        if isinstance(index, slice):
            start, stop, step = index.indices(size)
            if step != 1:
                return self.tolist()[index]
            return self._items[self._start + start : self._start + max(start, stop)]
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError("EncodedSpan index out of range")
        return self._items[self._start + index]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.tolist())

    def tolist(self) -> list[bytes]:
        """The slots as a new list (a C-speed copy of their references)."""
        return self._items[self._start : self._stop]


class ChunkedSpan(Sequence[bytes]):
    """Items ``origin`` onward of a log of encodings kept joined, a chunk per group; immutable.

    Each chunk is the JSON encodings of consecutive items joined by ``,``
    (empty for a group of no item): few large ``bytes`` objects instead of
    one per item, so joining the items (a request body, a decode) copies few
    objects. Chunks ``first:stop`` of ``chunks`` hold the span's items, the
    first being item ``origin`` in running numbers; per chunk, ``ends`` is
    where it ends in running item numbers and ``byte_ends`` in running bytes
    (the items' sizes summed, separators left out, the first item starting
    at ``base``); per item, ``offsets`` is where it ends in running bytes,
    the span's first at index ``at``. Chunk ``first`` may hold items
    before the span's first (a block of groups the log dropped the front
    of): it begins at running item ``lead`` and byte ``lead_base`` (by
    default ``origin`` and ``base``: it begins with the span). The owner
    only appends to these containers while a span of them lives (a log
    dropping at the front moves its own start and compacts into new
    containers), so the span never changes. Made in O(1); an item or a slice is cut out of its chunk
    (a copy of its bytes), :meth:`joined` joins whole chunks.
    """

    __slots__ = (
        "_at",
        "_base",
        "_byte_ends",
        "_chunks",
        "_count",
        "_ends",
        "_first",
        "_lead",
        "_lead_base",
        "_offsets",
        "_origin",
        "_stop",
    )

    def __init__(
        self,
        chunks: list[bytes],
        first: int,
        stop: int,
        ends: Sequence[int],
        byte_ends: Sequence[int],
        origin: int,
        base: int,
        offsets: Sequence[int],
        at: int,
        lead: int | None = None,
        lead_base: int | None = None,
    ) -> None:
        self._chunks = chunks
        self._first = first
        self._stop = stop
        self._ends = ends
        self._byte_ends = byte_ends
        self._origin = origin
        self._base = base
        self._offsets = offsets
        self._at = at
        self._lead = origin if lead is None else lead
        self._lead_base = base if lead_base is None else lead_base
        self._count = ends[stop - 1] - origin if stop > first else 0
        # It refers to a list of bytes and arrays of ints only: in no cycle,
        # so out of the cyclic collector (a held prefix adds no tracked object).
        untrack_atoms(self)

    def __len__(self) -> int:
        return self._count

    @property
    def size(self) -> int:
        """The items' sizes summed, in bytes (separators left out)."""
        stop = self._stop
        return self._byte_ends[stop - 1] - self._base if stop > self._first else 0

    def size_before(self, count: int) -> int:
        """The sizes of the first ``count`` items summed, in bytes (0 <= count <= len), in O(1)."""
        return self._offsets[self._at + count - 1] - self._base if count > 0 else 0

    def _place(self, index: int) -> tuple[int, int, int]:
        """(chunk, start, stop): where item ``index`` (0 <= index < len) is in its chunk's bytes."""
        at = self._origin + index
        first = self._first
        chunk = bisect.bisect_right(self._ends, at, first, self._stop)
        start = self._ends[chunk - 1] if chunk > first else self._lead
        base = self._byte_ends[chunk - 1] if chunk > first else self._lead_base
        end = self._offsets[self._at + index]
        begin = self._offsets[self._at + index - 1] if index else self._base
        position = begin - base + at - start  # a separator after each earlier item of the chunk
        return chunk, position, position + end - begin

    def _cut(self, index: int) -> bytes:
        """Item ``index`` (0 <= index < len) cut out of its chunk."""
        chunk, start, stop = self._place(index)
        return self._chunks[chunk][start:stop]

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        size = len(self)
        if isinstance(index, slice):
            return [self._cut(i) for i in range(*index.indices(size))]
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError("ChunkedSpan index out of range")
        return self._cut(index)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self[:])

    def tolist(self) -> list[bytes]:
        """The items as a new list of ``bytes`` (each cut out of its chunk)."""
        return self[:]

    def joined(self, start: int = 0, stop: int | None = None) -> bytes:
        """The encodings of items ``start:stop`` (all by default) joined by ``,``.

        ``0 <= start <= stop <= len``. A C-speed join of the chunks they
        span, the first and last cut where the range begins and ends inside
        them: O(chunks spanned), never a pass over the items.
        """
        count = self._count
        stop = count if stop is None else stop
        if start == 0 and stop == count and self._lead == self._origin:
            return b",".join(filter(None, self._chunks[self._first : self._stop]))
        if start >= stop:
            return b""
        first, begin, _ = self._place(start)
        last, _, end = self._place(stop - 1)
        chunks = self._chunks
        if first == last:
            return chunks[first][begin:end]
        middle = filter(None, chunks[first + 1 : last])
        return b",".join((chunks[first][begin:], *middle, chunks[last][:end]))

    def chunk_ranges(self) -> list[tuple[bytes, int, int, int]]:
        """Each chunk that holds items, oldest first: (chunk, start, stop, base).

        Its items are the span's ``start:stop``; ``base`` is where the first
        begins in running bytes (see :meth:`split`). O(chunks).
        """
        out = []
        ends, byte_ends, origin, chunks = self._ends, self._byte_ends, self._origin, self._chunks
        start, base = 0, self._base
        for index in range(self._first, self._stop):
            stop = ends[index] - origin
            if stop > start:
                chunk = chunks[index]
                if index == self._first and self._lead != origin:
                    # It begins with dropped items: its kept part, cut out (a new object).
                    chunk = chunk[self._place(0)[1] :]
                out.append((chunk, start, stop, base))
            start, base = stop, byte_ends[index]
        return out

    def split(self, chunk: bytes, start: int, stop: int, base: int) -> list[bytes]:
        """The items of one of :meth:`chunk_ranges` (its values), each cut out of ``chunk``."""
        return split_chunk(chunk, self._offsets[self._at + start : self._at + stop], base)


def split_chunk(chunk: bytes, ends: Iterable[int], base: int) -> list[bytes]:
    """The encodings ``chunk`` joins by ``,``, each cut out of it (a copy of its bytes).

    ``ends``: where each item ends in running bytes (the items' sizes
    summed, separators left out), the first beginning at ``base``.
    """
    out = []
    begin = 0
    for number, end in enumerate(ends):
        stop = end - base + number  # a separator after each earlier item
        out.append(chunk[begin:stop])
        begin = stop + 1
    return out


def decode_joined(joined: bytes) -> list[NativeContent]:
    """The items whose JSON encodings, joined by ``,``, are ``joined`` (``b""``: none).

    One C-speed decode of ``joined`` wrapped in brackets; the items are
    fresh and still tracked by the cyclic collector.
    """
    if not joined:
        return []
    decoded: list[NativeContent] = _decode(b"".join((b"[", joined, b"]")))
    return decoded


def _json_array(encoded: Sequence[bytes]) -> bytes:
    """The JSON array of the (non-empty) encoded items, in one join of their bytes.

    The brackets go onto the first and last pieces joined (an item, or a
    chunk of a :class:`ChunkedSpan`), which copies those two again, not
    the whole run.
    """
    if isinstance(encoded, ChunkedSpan):
        if encoded._lead != encoded._origin:
            return b"".join((b"[", encoded.joined(), b"]"))
        pieces = list(filter(None, encoded._chunks[encoded._first : encoded._stop]))
    elif isinstance(encoded, EncodedSpan):
        pieces = encoded.tolist()
    else:
        pieces = list(encoded)
    pieces[0] = b"[" + pieces[0]
    pieces[-1] += b"]"
    return b",".join(pieces)


def _decode_copy(
    encoded: Sequence[bytes], start: int = 0, stop: int | None = None
) -> list[NativeContent]:
    """Items ``start:stop`` (all by default) decoded from their JSON encodings, new and
    tracked (a host's copy). Of a :class:`ChunkedSpan`, the range is joined from its
    chunks (no item is cut out alone)."""
    stop = len(encoded) if stop is None else stop
    if start >= stop:
        return []
    if isinstance(encoded, ChunkedSpan):
        return decode_joined(encoded.joined(start, stop))
    whole = start == 0 and stop == len(encoded)
    return decode_joined(b",".join(encoded if whole else encoded[start:stop]))


def _decode_run(
    encoded: Sequence[bytes], start: int = 0, stop: int | None = None
) -> list[NativeContent]:
    """:func:`_decode_copy`, untracked.

    Decoded items are kept as long as the prefixes that share them live:
    untracked (see :func:`~turnloom.context._untrack.untrack_json`), a held
    prefix adds no objects to what a full collection visits.
    """
    decoded = _decode_copy(encoded, start, stop)
    untrack_json(decoded)
    return decoded


def _keys(encoded: Sequence[bytes]) -> Iterable[object]:
    """What names each encoded item while ``encoded`` lives.

    The ``id()`` of each ``bytes`` object a sequence holds; for a
    :class:`ChunkedSpan`, which holds none per item, each item's bytes (cut
    out of its chunk): equal bytes decode to equal items.
    """
    return encoded.tolist() if isinstance(encoded, ChunkedSpan) else map(id, encoded)


def _untrack_joined(joined: tuple[Any, ...], *parts: tuple[Any, ...]) -> tuple[Any, ...]:
    """``joined``, untracked when every part it was joined from is untracked.

    CPython keeps a tuple of native items tracked (they are dicts), so a
    tuple of them is untracked only by :func:`~turnloom.context._untrack.untrack_json`
    or :func:`~turnloom.context._untrack.untrack_container`, whose callers
    proved its items are read-only JSON values. ``joined`` holds those same
    items and the decoded run's (untracked by :func:`_decode_run`), nothing
    else, so the proof carries over: no cycle can pass through it, and a
    held prefix adds no reference per item to a full collection. A tracked
    part (an area's items, an assembled prompt) keeps it tracked.
    """
    if not any(map(gc.is_tracked, parts)):
        untrack_container(joined)
    return joined


def common_prefix(new: Sequence[Any], old: Sequence[Any]) -> int:
    """Length of the longest common prefix; tuple comparison checks identity first.

    The common case (the old prefix is kept whole) is one C-speed comparison;
    a first item that differs costs one comparison. Otherwise it gallops (1,
    2, 4, ... items) before bisecting, so the cost follows the common prefix,
    not the whole input, when they part early (after an eviction).
    """
    limit = min(len(new), len(old))
    if not limit or new[0] != old[0]:
        return 0
    if new[:limit] == (old if limit == len(old) else old[:limit]):
        return limit
    lo, step = 0, 1
    while lo + step < limit and new[lo : lo + step] == old[lo : lo + step]:
        lo += step
        step *= 2
    hi = min(limit, lo + step) - 1
    while lo < hi:  # new[:lo] == old[:lo] holds throughout
        mid = (lo + hi + 1) // 2
        if new[lo:mid] == old[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_span(a: Sequence[bytes], at: int, b: Sequence[bytes], b_at: int, span: int) -> int:
    """Length of the common prefix of ``a[at:at + span]`` and ``b[b_at:b_at + span]``.

    Gallops (1, 2, 4, ... items) then bisects, slicing only what it
    compares, so the cost follows the common prefix, not ``span``.
    """

    def same(start: int, stop: int) -> bool:
        return list(a[at + start : at + stop]) == list(b[b_at + start : b_at + stop])

    lo, step = 0, 1
    while lo + step <= span and same(lo, lo + step):
        lo += step
        step *= 2
    hi = lo + step - 1 if lo + step <= span else span  # the common prefix is at most hi
    while lo < hi:  # the first lo items are equal throughout
        mid = (lo + hi + 1) // 2
        if same(lo, mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _found(
    keys: Iterable[object], known: dict[object, NativeContent], encoded: Sequence[bytes]
) -> list[NativeContent]:
    """Each of ``encoded``, ``known``'s value for its key (see :func:`_keys`), else decoded."""
    # None where ``known`` does not hold the item: decoded below
    # (with any item that is null, decoded to None again).
    found: list[NativeContent] = list(map(known.get, keys))  # type: ignore[arg-type]
    if None in found:
        missing = list(compress(count(), map(is_, found, repeat(None))))
        fresh = _decode_run([encoded[i] for i in missing])
        for i, value in zip(missing, fresh, strict=True):
            found[i] = value
    return found


def _chunks_reused(
    encoded: ChunkedSpan, source: ChunkedSpan, values: tuple[NativeContent, ...], offset: int
) -> list[NativeContent]:
    """``encoded``'s items, reused from ``source``'s decoded ``values`` (from ``offset``) if it can.

    A chunk that is one ``source`` holds (the very object: both spans keep
    theirs alive) is a C-speed slice of ``values``. The items of any other
    chunk are looked up by their bytes among the items of the chunks of
    ``source`` that ``encoded`` does not hold, else decoded. So the cost
    follows the chunks that differ, not every item.
    """
    mine = encoded.chunk_ranges()
    theirs = source.chunk_ranges()
    held = {id(chunk): (start, stop) for chunk, start, stop, _ in theirs}
    known: dict[object, NativeContent] | None = None
    out: list[NativeContent] = []
    # Where ``out`` holds None for an item ``known`` lacks, and its bytes: decoded at once.
    missing: list[int] = []
    cut: list[bytes] = []
    for chunk, start, stop, base in mine:
        where = held.get(id(chunk))
        if where is not None and where[1] - where[0] == stop - start:
            out.extend(values[offset + where[0] : offset + where[1]])
            continue
        if known is None:
            ours = {id(c) for c, *_ in mine}
            known = {}
            for other, at, end, other_base in theirs:
                if id(other) not in ours:
                    keys = source.split(other, at, end, other_base)
                    known.update(zip(keys, values[offset + at : offset + end], strict=True))
        items = encoded.split(chunk, start, stop, base)
        found = list(map(known.get, items))
        if None in found:  # (an item that is null is decoded to None again)
            at = len(out)
            for index in compress(count(), map(is_, found, repeat(None))):
                missing.append(at + index)
                cut.append(items[index])
        out.extend(found)  # type: ignore[arg-type]
    for index, value in zip(missing, _decode_run(cut), strict=True):
        out[index] = value
    return out


class NativeItems:
    """Items of one model input, oldest first: natives, an encoded run, natives.

    Immutable. ``encoded`` holds one item's JSON per ``bytes`` object.
    ``epoch`` and ``origin`` name where the encoded run comes from: two
    :class:`NativeItems` with the same ``epoch`` object hold the very same
    ``bytes`` object at equal ``origin + index`` (a history's run is only
    appended to and dropped from the front between rebuilds), which lets
    :meth:`common_length` skip their shared run in O(1).

    Decoding reuses an earlier, decoded :class:`NativeItems` of the same
    run (:meth:`adopt`): the items they share are taken from it, not
    decoded again, so a host that reads every prefix's items decodes only
    what is new. The decoded tuple is kept (turnloom's own, untracked by the
    cyclic collector as the render cache's items are, and shared with the
    object it was reused from); what :meth:`materialize` and :meth:`item`
    return is a new copy of it each call, shared with nothing.

    Host copies made ahead (:meth:`make_copies`): a copy of the items costs
    one allocation per container, O(items), which must not run on the event
    loop. The runtime makes the copies a host will take in its worker thread
    (after the render, and again after each ``build``), and
    :meth:`take_copy` hands one over in O(1): each copy is made for one
    taker and given out once, so it is shared with nothing turnloom keeps
    and with no other copy. A copy no one took (made for a build that did
    not come) seeds the next prefix's: what of the run both hold moves into
    it. Without one ready, :meth:`materialize` copies on the calling
    thread. A copy waiting here is out of reach of everyone but the one
    call that takes it.

    Thread safety: any thread may read one; :meth:`_shared` caches its
    result by one assignment (a racing call at worst decodes twice); a copy
    is taken by one ``list.pop`` (atomic under the GIL: two racing takers
    never get the same copy).
    """

    __slots__ = (
        "_after",
        "_before",
        "_copies",
        "_encoded",
        "_epoch",
        "_origin",
        "_source",
        "_value",
        "taken",
    )

    def __init__(
        self,
        before: tuple[NativeContent, ...] = (),
        encoded: Sequence[bytes] = (),
        after: tuple[NativeContent, ...] = (),
        epoch: object = None,
        origin: int = 0,
    ) -> None:
        self._before = before
        self._encoded = encoded
        self._after = after
        self._epoch = epoch
        self._origin = origin
        self._value: tuple[NativeContent, ...] | None = None
        self._source: NativeItems | None = None  # decoded items of the same run to reuse
        # Host copies made ahead (make_copies), each to be taken once; None: none made.
        self._copies: list[tuple[NativeContent, ...]] | None = None
        # How copies were taken: TAKEN_ITEMS (materialize), TAKEN_BUILD (build), or'ed.
        self.taken = 0
        if type(self) is NativeItems and not any(
            map(gc.is_tracked, (before, encoded, after, epoch))
        ):
            # Its parts are out of the collector: tuples of native items
            # untracked by turnloom's proofs (JSON-encoded, or decoded from
            # JSON: nothing outside themselves) or by CPython (atoms only),
            # an EncodedSpan or ChunkedSpan (bytes and ints only), and a plain
            # object() or None as ``epoch``. Later it only gets a tuple of
            # them, or decoded, as ``_value``, as ``_source`` another
            # NativeItems out of the collector (see _reuse), and as
            # ``_copies`` an untracked list of fresh copies that refer to
            # nothing but new containers and atoms. Nothing it
            # refers to can lead back to it, so it can be in no cycle. Host
            # items, an area section's, stay in tracked tuples: then so does this.
            untrack_atoms(self)

    def __len__(self) -> int:
        return len(self._before) + len(self._encoded) + len(self._after)

    def __repr__(self) -> str:
        return f"NativeItems({len(self)} items, {len(self._encoded)} encoded)"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NativeItems):
            return NotImplemented
        return self is other or self._shared() == other._shared()

    __hash__ = None  # type: ignore[assignment]

    def materialize(self, taker: int = 1) -> tuple[NativeContent, ...]:
        """The items as a new tuple of NativeContent, oldest first, shared with nothing.

        Every dict and list in it is new (:meth:`fresh`: equal to the kept
        tuple, :meth:`_shared`, sharing nothing with it): the caller may change them, and
        neither a later call nor anything turnloom keeps or builds sees it.
        A copy made ahead (:meth:`make_copies`) is handed over in O(1);
        else :meth:`fresh` makes it here, O(items). ``taker`` is or'ed into
        :attr:`taken` (``TAKEN_ITEMS``: a read of ``PreparedContext.items``).
        """
        copy = self.take_copy(taker)
        return copy if copy is not None else self.fresh()

    def fresh(self) -> tuple[NativeContent, ...]:
        """A new copy of the items, oldest first, shared with nothing (what hosts are given).

        Every dict and list in it is new and tracked by the cyclic collector
        as CPython tracks new objects (a dict of atoms only until a container
        is stored in it), so a host may change it and a cycle it builds
        through it is collected. The encoded run is copied by decoding its
        bytes again (one C-speed decode of the joined run, about twice as
        fast as copying decoded items container by container, measured with
        ``scripts/bench_build.py``): equal, by value and by type, to the
        kept tuple (:meth:`_shared`), whose run items were decoded from the
        same bytes, and it neither needs nor makes that tuple. The native
        items before and after the run are copied (:func:`fresh_items`).
        O(items) on the calling thread; new strings for the run's values.
        """
        encoded, before, after = self._encoded, self._before, self._after
        if not encoded:
            # Natives only: nothing to decode, and nothing kept (not :meth:`_shared`,
            # whose decoding the runtime then repeats ahead for every later prefix).
            return fresh_items(before + after if after else before)
        copy: tuple[NativeContent, ...] = _decode_tuple(_json_array(encoded))
        if before or after:
            return (*fresh_items(before), *copy, *fresh_items(after))
        return copy

    def take_copy(self, taker: int) -> tuple[NativeContent, ...] | None:
        """A copy made ahead by :meth:`make_copies`, handed over (O(1)), or None when none is ready.

        ``taker`` (``TAKEN_ITEMS`` or ``TAKEN_BUILD``) is or'ed into
        :attr:`taken`, which tells the next prefix of the context how many
        copies to make ahead. Each copy is given out once (one atomic
        ``list.pop``): the caller owns it.
        """
        self.taken |= taker
        copies = self._copies
        if copies:
            try:
                return copies.pop()
            except IndexError:  # taken by a racing thread
                pass
        return None

    def make_copies(self, count: int, seed: NativeItems | None = None) -> None:
        """Make copies of the items ahead until ``count`` are ready, for :meth:`take_copy`.

        For the runtime's worker thread: O(items) per copy (:meth:`fresh`).
        Each copy is new throughout (as :meth:`materialize` copies)
        and tracked by the cyclic collector as any new object is, so a host
        cycle through it is collected once it is taken; the list holding
        them is untracked (it holds only such copies). One thread makes
        copies of one object at a time (the worker runs its jobs in order).

        ``seed``: an earlier prefix of the same run (the context's last).
        A copy of it made ahead and not taken is taken here (one atomic
        ``list.pop``: no other taker gets it) and its items of the run
        both hold go into a copy of these, moved, not copied: only the
        items it lacks are decoded, O(new items) plus a copy of references
        instead of O(items). Its other items are freed with it.
        """
        copies = self._copies
        if copies is None:
            copies = []
            untrack_container(copies)
            self._copies = copies
        while len(copies) < count:
            spare = seed.take_copy(0) if seed is not None else None
            copy = self._seeded(seed, spare) if spare is not None else None  # type: ignore[arg-type]
            copies.append(copy if copy is not None else self.fresh())

    def _seeded(
        self, seed: NativeItems, spare: tuple[NativeContent, ...]
    ) -> tuple[NativeContent, ...] | None:
        """A copy of the items (as :meth:`fresh`) holding ``spare``'s items of the run that
        ``seed`` and these both hold; None when they share none (another run).

        ``spare`` is a copy of ``seed`` that nobody holds: its items move into
        the result. Equal to :meth:`fresh` by value and type: the run's items
        at one position of one run (``epoch``) are the same bytes, and both
        copies decode them.
        """
        encoded, epoch = self._encoded, self._epoch
        if epoch is None or seed._epoch is not epoch or not encoded or not seed._encoded:
            return None
        start = max(seed._origin - self._origin, 0)
        stop = min(seed._origin + len(seed._encoded) - self._origin, len(encoded))
        if start >= stop:
            return None
        at = len(seed._before) + self._origin + start - seed._origin
        return (
            *fresh_items(self._before),
            *_decode_copy(encoded, 0, start),
            *spare[at : at + stop - start],
            *_decode_copy(encoded, stop, len(encoded)),
            *fresh_items(self._after),
        )

    def drop_copies(self) -> list[tuple[NativeContent, ...]] | None:
        """Forget the copies made ahead (a later taker copies); changes no value.

        Returns the list that held them (None: none were made), for the
        caller to release where freeing them costs nothing it cares about
        (freeing a copy is O(items): the runtime frees them in its worker).
        """
        copies, self._copies = self._copies, None
        return copies

    @property
    def copies_ready(self) -> int:
        """How many copies made ahead wait to be taken."""
        copies = self._copies
        return len(copies) if copies is not None else 0

    def count_encoded(self, needle: bytes) -> int:
        """Occurrences of ``needle`` in the items' JSON encodings, summed over the items.

        C-speed over the encoded run (``bytes.count``, nothing decoded);
        the items held as natives are encoded for it. O(bytes).
        """
        encoded = self._encoded
        joined = encoded.joined() if isinstance(encoded, ChunkedSpan) else b"\x00".join(encoded)
        natives = (*self._before, *self._after)
        return joined.count(needle) + sum(_encode(item).count(needle) for item in natives)

    def _shared(self) -> tuple[NativeContent, ...]:
        """The kept tuple of the items (decoded on the first call, then kept): turnloom's own.

        Shared with the render caches and other prefixes' items, untracked by
        the cyclic collector: for turnloom's readers (``build``, the body
        fallback), which copy what they hand out; never to be changed, never
        handed to a host. Costs O(encoded bytes) of C-speed JSON decoding on
        the first call, or after :meth:`adopt` only the items the earlier
        object did not hold, plus a C-speed copy of references.
        """
        value = self._value
        if value is None:
            if self._encoded:
                value = _untrack_joined(self._joined(), self._before, self._after)
            elif self._after:
                value = _untrack_joined(self._before + self._after, self._before, self._after)
            else:
                value = self._before
            self._value = value
            self._source = None
        return value

    @property
    def decoded(self) -> bool:
        """True once :meth:`_shared` ran (its tuple is kept; :meth:`materialize` runs it)."""
        return self._value is not None

    def _joined(self) -> tuple[NativeContent, ...]:
        """Every item, the encoded run's reused from the source where it has them, else decoded.

        From a source of the same run (``epoch``), the items both hold are
        one C-speed slice of its tuple; from another (a run rebuilt or
        renamed anew, most of whose items are the very same ``bytes``
        objects), each item whose ``bytes`` object the source holds is its
        decoded value there, matched at C speed.
        """
        before, encoded, after = self._before, self._encoded, self._after
        source = self._source
        if source is None or source._value is None or not source._encoded:
            return (*before, *_decode_run(encoded), *after)
        offset = len(source._before)
        values = source._value
        if source._epoch is self._epoch:
            start = max(source._origin - self._origin, 0)
            stop = min(source._origin + len(source._encoded) - self._origin, len(encoded))
            if start >= stop:
                return (*before, *_decode_run(encoded), *after)
            at = offset + self._origin + start - source._origin
            return (
                *before,
                *_decode_run(encoded, 0, start),
                *values[at : at + stop - start],
                *_decode_run(encoded, stop, len(encoded)),
                *after,
            )
        if isinstance(encoded, ChunkedSpan) and isinstance(source._encoded, ChunkedSpan):
            return (*before, *_chunks_reused(encoded, source._encoded, values, offset), *after)
        # The source keeps its items alive, so their keys (see _keys) are theirs alone.
        known = dict(zip(_keys(source._encoded), islice(values, offset, None), strict=False))
        return (*before, *_found(_keys(encoded), known, encoded), *after)

    def adopt(self, earlier: NativeItems) -> None:
        """Reuse ``earlier``'s decoded items when this one decodes (call before sharing it).

        ``earlier`` counts when it is decoded, or reused one that is: from
        the same run, what both hold is reused positionally, else item by
        item where they hold the same ``bytes`` object (see :meth:`_joined`).
        At most one earlier object is kept alive, until this one decodes.
        Changes no value.
        """
        if self._value is not None or not self._encoded:
            return
        source = earlier if earlier._value is not None else earlier._source
        if source is not None and source._encoded:
            self._reuse(source)

    def _reuse(self, source: NativeItems | None) -> None:
        """Keep ``source`` to reuse, unless it is tracked and this is not (see __init__).

        A NativeItems out of the collector may refer only to objects out of
        it too: a tracked one may hold a host's items, which could lead back.
        Then nothing is reused (the values are the same, decoded anew).
        """
        if source is None or gc.is_tracked(self) or not gc.is_tracked(source):
            self._source = source

    def item(self, index: int) -> NativeContent:
        """A new copy of the item at ``index`` (0 <= index < len), decoded alone when encoded."""
        return fresh_json(self._item(index))

    def _item(self, index: int) -> NativeContent:
        """The item at ``index``: kept (read-only), or decoded alone when it is encoded."""
        value = self._value
        if value is not None:
            return value[index]
        before = len(self._before)
        if index < before:
            return self._before[index]
        index -= before
        if index < len(self._encoded):
            decoded: NativeContent = _decode(self._encoded[index])  # a fresh copy each call
            return decoded
        return self._after[index - len(self._encoded)]

    def extended(self, items: tuple[NativeContent, ...]) -> NativeItems:
        """These items, then ``items`` (natives): O(len(items)) plus a copy of references."""
        if not items:
            return self
        other = NativeItems(
            self._before,
            self._encoded,
            _untrack_joined(self._after + items, self._after, items),
            self._epoch,
            self._origin,
        )
        other._reuse(self._source)
        return other

    def prefixed(self, items: tuple[NativeContent, ...]) -> NativeItems:
        """``items`` (natives), then these items."""
        if not items:
            return self
        other = NativeItems(
            _untrack_joined(items + self._before, items, self._before),
            self._encoded,
            self._after,
            self._epoch,
            self._origin,
        )
        other._reuse(self._source)
        return other

    def _part(self, index: int) -> tuple[int, int, int]:
        """(part, index in it, items left in it) of item ``index``: 0 before, 1 run, 2 after."""
        before = len(self._before)
        if index < before:
            return 0, index, before - index
        index -= before
        encoded = len(self._encoded)
        if index < encoded:
            return 1, index, encoded - index
        index -= encoded
        return 2, index, len(self._after) - index

    def same_run(self, other: NativeItems) -> bool:
        """True when :meth:`common_length` with ``other`` skips their encoded runs in O(1).

        That is when either has none, or both come from one run (``epoch``):
        aligned, the shared run is skipped at once; shifted by a drop at the
        front, the first items compared differ unless turns repeat.
        """
        return not self._encoded or not other._encoded or self._epoch is other._epoch

    def common_length(self, other: NativeItems) -> int:
        """Length of the longest common prefix with ``other``, items compared by value.

        Equal to :func:`common_prefix` of both materialized tuples, without
        materializing either: native parts are compared as tuples (identity
        first), encoded runs by their bytes (equal bytes decode to equal
        items; a run shared by ``epoch`` is skipped in O(1)), and where the
        parts do not line up or the bytes differ, item by item by value
        (decoding single items), so the cost follows the common prefix.
        """
        limit = min(len(self), len(other))
        i = 0
        while i < limit:
            part, at, left = self._part(i)
            other_part, other_at, other_left = other._part(i)
            span = min(left, other_left, limit - i)
            same = 0
            if part == other_part:
                if part == 0:
                    same = common_prefix(
                        self._before[at : at + span], other._before[other_at : other_at + span]
                    )
                elif part == 2:
                    same = common_prefix(
                        self._after[at : at + span], other._after[other_at : other_at + span]
                    )
                elif (
                    self._epoch is not None
                    and self._epoch is other._epoch
                    and self._origin + at == other._origin + other_at
                ):
                    same = span
                else:
                    same = _common_span(self._encoded, at, other._encoded, other_at, span)
            i += same
            if same == span and span:
                continue
            # The parts do not line up here, or the fast comparison stopped:
            # compare this one item by value.
            if i >= limit or self._item(i) != other._item(i):
                break
            i += 1
        return i

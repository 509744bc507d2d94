"""Request bodies built item by item, and kept encoded between model calls.

A gateway's :meth:`~turnloom.context.Gateway.request_body` is a fold over the
item list: call ids are renamed, instructions lifted into a top-level field,
adjacent turns merged (Anthropic, Gemini), replayed outputs left out (OpenAI
Responses). A :class:`BodyWriter` is that fold in streaming form: it is fed
items oldest first, hands out each body item once nothing later can change it
(a merged turn is held back until the next item shows whether it merges too),
and :meth:`BodyWriter.finish` returns the top-level fields. The built-in
gateways implement ``request_body`` with their writer, so the rule lives in
one place and both paths produce the same body.

:class:`EncodedBody` is a body whose settled part is kept as JSON bytes: the
encoded body items of the closed turns of a history (one ``bytes`` per body
item, kept by its render cache, see :class:`~turnloom.context.TurnHistory`),
the writer state after them, and the items that follow, not yet fed.
:meth:`EncodedBody.encode` returns exactly
``msgspec.json.encode(gateway.request_body(items))`` for all its items while
encoding only the items after the cached part; :meth:`EncodedBody.extend`
appends items (a continuation) in O(appended items).

:class:`BodyRun` is the mutable cache a history keeps per render key: items
appended segment by segment (one segment per closed turn), segments dropped
at the front on eviction when the body of the kept segments is provably what
is cached (else the caller rebuilds it from the kept items). A body item
that encodes to the bytes of an item the history keeps encoded is that very
``bytes`` object, so a closed turn is held once, not as items and body.
"""

from __future__ import annotations

__all__ = (
    "BodyRun",
    "BodyWriter",
    "EncodedBody",
    "WholeSegments",
    "body_writer",
    "encode_fields",
    "kept_body",
    "reserved_fields",
    "with_fields",
    "write_body",
    "written_body",
)

import array
import gc
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import msgspec

from turnloom.context._fresh import fresh_json
from turnloom.context._untrack import untrack_atoms, untrack_container
from turnloom.context.callids import CallIdRenamer
from turnloom.context.gateway import Gateway, NativeContent
from turnloom.context.items import (
    EncodedSpan,
    compaction_due,
    decode_joined,
    encode_item,
    exact_bytes,
)
from turnloom.errors import InvalidArgumentError, excerpt, what_type

_encode = msgspec.json.Encoder().encode
_G = TypeVar("_G")
# Sealed segments whose chunks are the body's alone, joined into one block:
# a body joins about one piece per block, not per segment, and a drop at the
# front copies at most one block's kept part.
_BLOCK_SEGMENTS = 64


class BodyWriter:
    """The request body of one gateway, built item by item (abstract base).

    A writer is fed items oldest first with :meth:`feed`; each body item is
    appended to the caller's list once it is final. :meth:`finish` flushes
    the items held back and returns the body's other top-level fields.
    A writer is changed by :meth:`feed` and :meth:`finish`; :meth:`copy`
    gives an independent one in the same state. Not thread-safe: a writer
    that others may read must not be fed (copy it first).

    ``marks``, when a list, receives one ``(origin, last)`` pair per body
    item handed out: the tags (see :meth:`feed`) of the first and last
    items it was built from. :class:`BodyRun` uses them to know which
    segment each body item belongs to.

    Attributes:
        field: the body field holding the item list (the gateway's
            ``items_field``).
        header: the other top-level fields :meth:`finish` may return (for
            example Anthropic's ``"system"``).
        spellings: other names the provider (and the gateway's
            ``parse_request``) reads as one of those fields (Gemini's
            ``"system_instruction"``); a request must not set them either.
        renamer: the call-id renaming state (:mod:`turnloom.context.callids`),
            or None for a writer made with ``rename=False``: one fed only
            items whose call ids were renamed already (see :func:`body_writer`),
            which it hands out with the ids they carry.
    """

    __slots__ = ("marks", "renamer")

    field: str = ""
    header: tuple[str, ...] = ()
    spellings: tuple[str, ...] = ()

    def __init__(self, *, rename: bool = True) -> None:
        self.renamer: CallIdRenamer | None = CallIdRenamer() if rename else None
        self.marks: list[tuple[int, int]] | None = None

    def feed(self, items: Sequence[NativeContent], out: list[NativeContent], tag: int = 0) -> None:
        """Feed ``items`` (oldest first); append the body items they settle to ``out``.

        Args:
            items: native items of the gateway, never modified.
            out: receives settled body items, in body order.
            tag: the segment the items belong to (non-decreasing from call
                to call), reported through ``marks``.
        """
        raise NotImplementedError

    def finish(self, out: list[NativeContent]) -> dict[str, Any]:
        """Append every held-back body item to ``out``; the body's other fields.

        Returns:
            the top-level fields that go before the item list, in body order
            (empty when there is none). The writer must not be fed after.
        """
        raise NotImplementedError

    def copy(self) -> BodyWriter:
        """An independent writer in the same state (``marks`` not copied)."""
        raise NotImplementedError

    def held_origin(self) -> int | None:
        """The tag of the oldest item held back (not yet handed out), or None."""
        raise NotImplementedError

    def passes_through(self) -> bool:
        """True when feeding items to this writer, as it stands, is the identity.

        That is: it hands out each item fed at once, unchanged (the same
        object), tagged with its own segment (``marks`` of ``(tag, tag)``),
        holds nothing back, lets any item open a segment (:meth:`can_open`)
        and changes no state of its own, whatever the items. A caller that
        keeps a segment's items encoded may then skip feeding them
        (:meth:`BodyRun.append` with no items). False unless a writer says so.
        """
        return False

    def can_open(self, body_item: NativeContent) -> bool:
        """True when ``body_item``, handed out first for a segment, may follow segment 0 directly.

        That is: had the segments between been absent, this item would have
        been handed out unchanged (not merged into, reordered after or left
        out because of an item before it). Checked when the item is handed
        out, so a cache need not keep the item.
        """
        return True

    def forget(self, first_kept: int, dropped: CallIdRenamer) -> bool:
        """Drop the segments tagged ``1 .. first_kept - 1`` from the state, when exact.

        Segment 0 (the pinned instructions) stays. The caller has checked
        that no body item spans from a dropped segment into a kept one,
        that nothing of a dropped segment is held back and that the first
        kept segment's first body item :meth:`can_open`. On True the state
        equals one fed segment 0 and the kept segments only, and the kept
        body items are what that state would have handed out; on False the
        state may be half changed and must be discarded.

        Args:
            first_kept: the tag of the first kept segment.
            dropped: a fresh renamer advanced over the dropped items.
        """
        raise NotImplementedError

    def _copied_renamer(self) -> CallIdRenamer | None:
        """A copy of :attr:`renamer` for :meth:`copy` (None without one)."""
        renamer = self.renamer
        return renamer.copy() if renamer is not None else None

    def _forget_ids(self, dropped: CallIdRenamer) -> bool:
        """:meth:`forget`'s part for call ids: the renamer forgets ``dropped``'s."""
        renamer = self.renamer
        return renamer is None or renamer.forget(dropped)

    def _hand_out(
        self, out: list[NativeContent], item: NativeContent, origin: int, last: int
    ) -> None:
        out.append(item)
        marks = self.marks
        if marks is not None:
            marks.append((origin, last))


def body_writer(gateway: Gateway, *, renamed: bool = False) -> BodyWriter | None:
    """A new writer for ``gateway``'s request body, or None when it has none.

    The built-in gateways provide one (``body_writer()``); a registered
    gateway without it gets None, and callers fall back to encoding
    ``request_body`` whole.

    With ``renamed``, the writer renames no call id (its ``renamer`` is
    None): for a caller that feeds it only the output of one renaming pass
    (:mod:`turnloom.context.callids`) from the items' first, such as a
    history's items and what is appended to them with the renaming state
    after them (ids that pass forgot are forgotten by the writer too, see
    :meth:`BodyWriter.forget`). Renaming that output again changes nothing,
    so the body is the same: the second pass finds each call's id (a fixed
    one, so ``fix`` keeps it) absent from the ids before it, because the ids
    it has seen are among those the first pass had seen there, and each
    result's id answering its call or kept as an orphan, as the first pass
    sent it; a writer that leaves items out feeds a subsequence, for which
    the same holds.
    """
    make = getattr(gateway, "body_writer", None)
    if make is None:
        return None
    writer = make()
    if not isinstance(writer, BodyWriter):
        return None
    if renamed:
        writer.renamer = None
    return writer


def write_body(writer: BodyWriter, items: Sequence[NativeContent]) -> dict[str, Any]:
    """The request body of ``items`` fed to the fresh ``writer``, in new containers.

    What the built-in gateways' ``request_body`` returns: the writer's
    top-level fields, then its item list (``writer.field``), copied by
    :func:`~turnloom.context._fresh.fresh_json` so that no dict or list of
    the body is one of ``items``' (or of anything turnloom keeps, when the
    items are a prefix's): the caller may change the body freely (a
    ``cache_control`` mark on its last block, say), and that change
    reaches neither ``items`` nor any later body.
    """
    return fresh_json(_written(writer, items))


def _written(writer: BodyWriter, items: Sequence[NativeContent]) -> dict[str, Any]:
    """The request body of ``items`` fed to the fresh ``writer``, sharing the items' containers."""
    out: list[NativeContent] = []
    writer.feed(items, out)
    return {**writer.finish(out), writer.field: out}


def kept_body(gateway: Gateway, items: Sequence[NativeContent]) -> dict[str, Any]:
    """``gateway.request_body(items)`` without the copy, for turnloom's own encoding.

    The body shares the items' containers: only for a caller that encodes
    it at once and hands out nothing of it (a gateway without a body
    writer gets its own ``request_body``).
    """
    writer = body_writer(gateway) if type(gateway).request_body in _WRITTEN else None
    if writer is None:
        return gateway.request_body(items)
    return _written(writer, items)


# The request_body functions that are write_body of their class's body_writer
# (the built-in gateways'; a subclass overriding request_body is not one).
_WRITTEN: set[Any] = set()


def written_body(cls: type[_G]) -> type[_G]:
    """Class decorator: ``cls.request_body`` is :func:`write_body` of ``cls.body_writer()``."""
    _WRITTEN.add(cls.request_body)  # type: ignore[attr-defined]
    return cls


def reserved_fields(gateway: Gateway) -> frozenset[str]:
    """The top-level fields ``gateway``'s request body writes itself (items, instructions).

    Every spelling of them the provider reads counts (see ``BodyWriter.spellings``).
    """
    writer = body_writer(gateway)
    if writer is None:
        return frozenset((gateway.items_field, *gateway.request_body(())))
    return frozenset((gateway.items_field, *writer.header, *writer.spellings))


def encode_fields(fields: Mapping[str, Any], reserved: frozenset[str]) -> bytes:
    """The JSON members of ``fields`` (``b'"model":"m","tools":[...]'``), braces left off.

    The caller's own top-level request fields (model name, tools, generation
    settings) to splice into an encoded body. Empty ``fields`` give ``b""``.

    Raises:
        InvalidArgumentError: ``fields`` is not a mapping with str keys, a key
            is one the body writes itself (``reserved``), or a value is not
            JSON data (or holds text that is not valid UTF-8, or a NaN or
            infinite float at any depth: JSON has none).
    """
    if not isinstance(fields, Mapping):
        raise InvalidArgumentError(
            f"fields must be a mapping of top-level request fields, not {what_type(fields)}.",
            field="fields",
        )
    for key in fields:
        if not isinstance(key, str):
            raise InvalidArgumentError(
                f"fields keys must be str, not {what_type(key)}.", field="fields"
            )
        if key in reserved:
            raise InvalidArgumentError(
                f"fields cannot set {excerpt(key)}: the request body writes it from the "
                f"prepared items (it writes {', '.join(sorted(reserved))}).",
                field=f"fields[{excerpt(key)}]",
            )
    try:
        encoded = _encode(dict(fields))
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise InvalidArgumentError(
            f"fields are not JSON data: {excerpt(str(exc))}.", field="fields"
        ) from None
    if b"null" in encoded:
        # msgspec writes NaN and the infinities as null; only then can one hide in here.
        _reject_non_finite(fields)
    return encoded[1:-1]


def _reject_non_finite(fields: Mapping[str, Any]) -> None:
    """Raise when a value of ``fields``, at any depth, is a NaN or infinite float.

    JSON has no such number (RFC 8259, section 6) and the providers refuse
    the ``null`` an encoder would write instead. Walks the values as
    ``msgspec.to_builtins`` gives them (structs as dicts), without recursion.
    """
    for key, value in fields.items():
        stack: list[tuple[Any, str]] = [(msgspec.to_builtins(value), "")]
        while stack:
            item, path = stack.pop()
            if isinstance(item, float):
                if not math.isfinite(item):
                    raise InvalidArgumentError(
                        f"fields[{excerpt(key)}]{path} is {item!r}, which JSON cannot carry "
                        "(it would be sent as null); send a finite number or leave it out.",
                        field=f"fields[{excerpt(key)}]",
                    )
            elif isinstance(item, dict):
                stack.extend((v, f"{path}[{excerpt(k)}]") for k, v in item.items())
            elif isinstance(item, list):
                stack.extend((v, f"{path}[{i}]") for i, v in enumerate(item))


def with_fields(body: bytes, members: bytes) -> bytes:
    """``body`` (an encoded JSON object with at least one member) with ``members`` first."""
    if not members:
        return body
    return b"".join((b"{", members, b",", body[1:]))


def _splice(head: bytes, chunks: list[bytes], members: bytes) -> bytes:
    """The encoded body: ``head`` (``b'{...,"messages":['``), the items, ``b"]}"``; one copy.

    ``members`` (the caller's fields, :func:`encode_fields`) go first. The
    item chunks are joined once, with the opening and closing bytes glued to
    the first and last chunk, so the body's bytes are copied once.
    """
    if members:
        head = b"".join((b"{", members, b",", head[1:]))
    if not chunks:
        return head + b"]}"
    chunks[0] = head + chunks[0]
    chunks[-1] += b"]}"
    return b",".join(chunks)


class EncodedBody:
    """A request body whose leading part is kept encoded; immutable.

    Holds the JSON bytes of the body items already settled (``lead``, then
    ``chunks``, then ``tail``, read and never changed; each one or more body
    items joined by ``,``), the writer state after them (never fed again:
    copied on use) and the native items after them (``rest``), not fed yet.

    Built by a history render (``RenderedHistory.body``) or
    :meth:`start`; extended with :meth:`extend`.
    """

    __slots__ = ("_chunks", "_lead", "_rest", "_tail", "_writer")

    def __init__(
        self,
        writer: BodyWriter,
        chunks: Sequence[bytes],
        rest: tuple[NativeContent, ...] = (),
        lead: tuple[bytes, ...] = (),
        tail: tuple[bytes, ...] = (),
    ) -> None:
        self._writer = writer
        self._lead = lead
        self._chunks = chunks
        self._tail = tail
        self._rest = rest

    @classmethod
    def start(cls, writer: BodyWriter, items: Sequence[NativeContent] = ()) -> EncodedBody:
        """A body of ``items`` with nothing cached (``writer`` is fresh and not fed)."""
        return cls(writer, (), tuple(items))

    def extend(self, items: Sequence[NativeContent]) -> EncodedBody:
        """This body with ``items`` appended (nothing is fed or encoded until :meth:`encode`).

        Costs O(len(items)) plus a C-speed copy of the references of the
        items not fed yet.
        """
        if not items:
            return self
        rest = self._rest + tuple(items)
        body = EncodedBody(self._writer, self._chunks, rest, self._lead, self._tail)
        if not gc.is_tracked(self) and type(items) is tuple and not gc.is_tracked(items):
            # This body is out of the collector (see BodyRun.snapshot), and so
            # are ``items``: by turnloom's proof (JSON-encoded native items,
            # see untrack_json) or CPython's (atoms only). The new body holds
            # what this one does and ``rest``, a tuple of both: nothing it
            # refers to can lead back to it, so it can be in no cycle.
            untrack_container(rest)
            untrack_atoms(body)
        return body

    def encode(self, members: bytes = b"") -> bytes:
        """The encoded request body of all the items, as UTF-8 JSON bytes.

        Equal, byte for byte, to ``msgspec.json.encode(gateway.request_body(items))``;
        with ``members`` (:func:`encode_fields` of the caller's top-level
        fields), to ``msgspec.json.encode({**fields, **gateway.request_body(items)})``.
        Costs: a copy of the writer state (O(log n) in the call ids seen),
        feeding and encoding the items not cached, a C-speed copy of the
        cached chunks' references, and one copy of the body's bytes.
        """
        writer = self._writer.copy()
        out: list[NativeContent] = []
        if self._rest:
            writer.feed(self._rest, out)
        header = writer.finish(out)
        head = _encode({**header, writer.field: []})
        # msgspec writes dict keys in insertion order with no whitespace, so the
        # body ends with the empty item list and the closing brace: b"[]}".
        held = self._chunks
        chunks = held.tolist() if isinstance(held, EncodedSpan) else list(held)
        if self._lead:
            chunks[:0] = self._lead
        chunks.extend(self._tail)
        chunks.extend(map(_encode, out))
        return _splice(head[:-2], chunks, members)


class WholeSegments(NamedTuple):
    """Consecutive segments whose body items are their own items, kept joined in one block.

    ``block`` is the segments' chunks joined by ``,`` (those of no item left
    out); ``lengths`` gives each chunk's length in bytes (0: no item), the
    first segment being tagged ``first_tag``. See :meth:`BodyRun.of`.
    """

    block: bytes
    first_tag: int
    lengths: Sequence[int]


class _Open:
    """A segment of a :class:`BodyRun` that may still get body items (see ``BodyRun._feed``)."""

    __slots__ = ("chunk", "encoded", "items", "next", "pending", "whole")

    def __init__(
        self, items: Sequence[NativeContent], encoded: Sequence[bytes], chunk: bytes | None
    ) -> None:
        self.items = items  # keeps the items alive, so their ids name them
        self.encoded = encoded
        self.chunk = chunk
        self.pending: list[bytes] = []  # its encoded body items so far
        self.next = 0  # how many of its items were handed out unchanged, in order, first
        self.whole = True  # nothing else was handed out for it

    def position(self, body_item: NativeContent, encoded: bytes | None) -> int:
        """The index of the segment's next item if ``body_item`` is it (or encodes so), else -1."""
        at = self.next
        items = self.items
        if at < len(items) and (
            items[at] is body_item
            or (encoded is not None and at < len(self.encoded) and self.encoded[at] == encoded)
        ):
            return at
        return -1


class BodyRun:
    """The encoded body of a run of segments, changed in place (see the module docstring).

    Segment tags increase from one :meth:`append` to the next; segment 0 is
    the pinned instructions and is never dropped. The body items are kept
    encoded in body order; a segment's body items are contiguous (a
    held-back item belongs to the segment it started in, before any item of
    a later one). Segment 0's come first and are kept apart (``_lead``, one
    ``bytes`` per body item); every other segment, once no body item can
    come for it any more (*sealed*), is one chunk in ``_chunks``: its body
    items joined by ``,`` (none when it has none). A segment whose body items
    are its own items, unchanged and in order, is the very chunk its caller
    joined them into (``append``'s ``chunk``), so a history that keeps its
    turns joined keeps such a turn once, not as items and body. Any other
    sealed segment's chunk is the body's alone: those are kept in
    ``_loose`` until :data:`_BLOCK_SEGMENTS` of them follow one another, then
    joined by ``,`` into one *block* in ``_chunks`` (the same bytes, held
    once), so joining a body copies about one piece per block of such
    segments instead of one per segment (what joining costs follows the
    pieces more than the bytes). Body items of the segments not sealed yet
    (the newest) are kept one ``bytes`` each in ``_open``. Dropped segments
    are always at the front: dropping moves the start of ``_chunks``
    (``_skip``), and when the first kept segment starts inside a block, the
    block's kept part is copied out as ``_head`` (O(one block)). Whole
    segments' chunks that their caller joins into one block of its own
    (a history keeps its closed turns in blocks) are held as that block once
    it is :meth:`adopt`-ed, so the body and the history share it too. A
    snapshot copies the references of the kept chunks (O(chunks), about one
    per block). The writer state is replaced, never changed, so a
    :meth:`snapshot` stays valid. Not thread-safe: guarded by the history's
    lock.
    """

    __slots__ = (
        "_base",
        "_chunks",
        "_dead",
        "_head",
        "_head_at",
        "_head_block",
        "_lead",
        "_loose",
        "_loose_at",
        "_offsets",
        "_open",
        "_opens",
        "_reach",
        "_skip",
        "_tags",
        "_where",
        "_writer",
    )

    def __init__(self, writer: BodyWriter) -> None:
        self._writer = writer
        # One entry per segment, oldest first: its tag, the last tag a body
        # item of it was built from, can_open of its first body item (0: none
        # handed out yet, 1: False, 2: True), the number of the ``_chunks``
        # entry holding its bytes (counted from the first entry ever
        # appended: ``_base`` is the number of ``_chunks[0]``; -1 while it
        # has none, is open or is loose) and where its bytes start in it.
        self._tags = array.array("q")
        self._reach = array.array("q")
        self._opens = bytearray()
        self._where = array.array("q")
        self._offsets = array.array("q")
        # The sealed segments whose chunk is the body's alone and not yet in
        # a block: their chunks, and their indices in the arrays above.
        self._loose: list[bytes] = []
        self._loose_at = array.array("q")
        for numbers in (self._tags, self._reach, self._where, self._offsets, self._loose_at):
            untrack_atoms(numbers)  # machine numbers only: in no cycle
        self._base = 0
        # The kept part of a block the front cut into, which stands for it
        # in the body: a copy of the block (number ``_head_block``) from
        # byte ``_head_at`` on; b"" and -1 when there is none.
        self._head = b""
        self._head_at = 0
        self._head_block = -1
        # Segments dropped but still in those arrays, after segment 0's slot
        # (when there is one): dropping is O(dropped segments), no move.
        self._dead = 0
        # Segment 0's body items, then the sealed segments' chunks after
        # ``_skip`` dropped ones. Only ever holding bytes, they can be in no
        # cycle: out of the cyclic collector, a full collection visits no
        # reference per body item.
        self._lead: list[bytes] = []
        self._chunks: list[bytes] = []
        self._skip = 0
        untrack_container(self._lead)
        untrack_container(self._chunks)
        untrack_container(self._loose)
        self._open: dict[int, _Open] = {}  # the segments not sealed yet, by tag, oldest first
        if not gc.is_tracked(writer):
            # Its writer is out of the collector: one of turnloom's, whose
            # class untracks it only when its state is turnloom's alone, and
            # every writer it holds later is a copy of it (the same class and
            # state). Its other slots only ever hold ints, bytes, the arrays
            # and lists of bytes above, a bytearray and a dict of _Open (the
            # items, encodings and chunks of the history segments it is fed,
            # JSON-encoded, and lists of bytes). Nothing it refers to can lead
            # back to it, so it can be in no cycle (a history's render cache
            # holds one per render key).
            untrack_atoms(self)

    def append(
        self,
        items: Sequence[NativeContent] | None,
        tag: int,
        encoded: Sequence[bytes] = (),
        chunk: bytes | None = None,
    ) -> None:
        """Feed one segment's items; encode the body items they settle.

        Args:
            items: the segment's native items, or None when the caller did
                not decode them (then ``chunk`` must hold them): they are
                decoded from ``chunk`` unless the writer
                :meth:`~BodyWriter.passes_through`, whose body items are
                the segment's chunk as it is.
            tag: the segment's tag (greater than the last one appended).
            encoded: the items' JSON encodings, when the caller keeps them:
                a body item encoded to equal bytes shares that object.
            chunk: ``encoded`` joined by ``,``, when the caller keeps that:
                the segment's chunk when its body items are its items.

        Raises:
            InvalidArgumentError: ``items`` and ``chunk`` are both None.
        """
        writer = self._writer.copy()
        self._feed(writer, items, tag, encoded, chunk)
        self._writer = writer

    @classmethod
    def of(
        cls,
        writer: BodyWriter,
        segments: Iterable[
            tuple[Sequence[NativeContent] | None, int, Sequence[bytes], bytes | None]
            | WholeSegments
        ],
    ) -> BodyRun:
        """A run of ``segments`` (items, tag, encodings, chunk) fed in order to ``writer`` (taken).

        The same as :meth:`append` of each segment to a run of a fresh
        ``writer``, with the one writer changed in place instead of copied
        per segment. A :class:`WholeSegments` stands for its segments, each
        fed with its chunk cut out of the block; when the writer passes
        items through (and nothing is held open), the block is kept as it
        is, its segments pointing into it: no chunk is cut or copied.
        """
        run = cls(writer)
        # A block fed segment by segment, adopted once its last segment is sealed.
        waiting: tuple[bytes, list[bytes], int] | None = None
        for segment in segments:
            if isinstance(segment, WholeSegments):
                waiting = run._feed_whole(writer, segment)
            else:
                items, tag, encoded, chunk = segment
                run._feed(writer, items, tag, encoded, chunk)
            if waiting is not None:
                block, pieces, last = waiting
                if run.adopt(block, pieces) or not run.open_through(last):
                    waiting = None
        return run

    def _feed_whole(
        self, writer: BodyWriter, segments: WholeSegments
    ) -> tuple[bytes, list[bytes], int] | None:
        """:meth:`of`'s step for one :class:`WholeSegments`.

        Returns the block, the chunks cut out of it and the last segment's
        tag when they were fed one by one (the block is to be adopted), else
        None.
        """
        block, first_tag, lengths = segments
        tags = self._tags
        if (
            not block
            or self._open
            or not first_tag
            or (tags and tags[-1] >= first_tag)
            or not writer.passes_through()
        ):
            at = 0
            pieces = []
            for tag, length in enumerate(lengths, first_tag):
                chunk = block[at : at + length]
                self._feed(writer, None, tag, (), chunk)
                if length:
                    pieces.append(chunk)
                    at += length + 1  # and the separator after it
            return block, pieces, first_tag + len(lengths) - 1
        self._flush_loose()  # they come before it
        number = self._base + len(self._chunks)
        at = 0
        for tag, length in enumerate(lengths, first_tag):
            # As _feed leaves a segment it hands out as its chunk, or one of no item.
            tags.append(tag)
            self._reach.append(tag)
            if length:
                self._opens.append(2)
                self._where.append(number)
                self._offsets.append(at)
                at += length + 1
            else:
                self._opens.append(0)
                self._where.append(-1)
                self._offsets.append(0)
        self._chunks.append(block)
        return None

    def holds(self, pieces: Sequence[bytes]) -> int:
        """Where the run holds ``pieces``, one sealed entry each, in order, among its newest.

        ``pieces``: chunks given to :meth:`append` (the very objects). The
        index of the first in the run's chunks, or -1 when they are not
        held so (a segment still open, or not handed out as its chunk).
        Looks at the newest ``2 * len(pieces)`` entries: O(pieces).
        """
        count = len(pieces)
        chunks = self._chunks
        if not count:
            return -1
        last = pieces[-1]
        lowest = max(self._skip + count - 1, len(chunks) - 2 * count)
        for at in range(len(chunks) - 1, lowest - 1, -1):
            if chunks[at] is last:
                first = at - count + 1
                if all(map(operator.is_, chunks[first : at + 1], pieces)):
                    return first
                return -1
        return -1

    def open_through(self, tag: int) -> bool:
        """True when a segment tagged ``tag`` or lower may still get body items (is open)."""
        return bool(self._open) and next(iter(self._open)) <= tag

    def adopt(self, block: bytes, pieces: Sequence[bytes]) -> bool:
        """Hold ``block`` in place of ``pieces`` when the run :meth:`holds` them.

        ``pieces`` are whole segments' chunks (the very objects given to
        :meth:`append`) and ``block`` is them joined by ``,``: the run keeps
        ``block`` instead (its caller keeps it too, so the bytes are held
        once). Returns whether it did; otherwise nothing changes. Costs
        O(pieces and the segments after them); snapshots stay valid.
        """
        count = len(pieces)
        first = self.holds(pieces)
        if first < 0 or len(block) != sum(map(len, pieces)) + count - 1:
            return False
        number = self._base + first
        starts: dict[int, int] = {}
        at = 0
        for offset, piece in enumerate(pieces):
            starts[number + offset] = at
            at += len(piece) + 1  # and the separator after it
        where, offsets = self._where, self._offsets
        stop = (1 if self._tags and self._tags[0] == 0 else 0) + self._dead
        index = len(where) - 1
        while index >= stop and (where[index] < 0 or where[index] >= number):
            held = where[index]
            if held >= number + count:
                where[index] = held - count + 1  # after the block: one entry for ``count``
            elif held >= 0:
                offsets[index] = starts[held]
                where[index] = number
            index -= 1
        # A new list: snapshots share the old one (only ever appended to).
        chunks = self._chunks
        self._chunks = [*chunks[:first], block, *chunks[first + count :]]
        untrack_container(self._chunks)  # bytes only
        return True

    def _feed(
        self,
        writer: BodyWriter,
        items: Sequence[NativeContent] | None,
        tag: int,
        encoded: Sequence[bytes],
        chunk: bytes | None,
    ) -> None:
        """:meth:`append` with ``writer`` (this run's, changed in place)."""
        tags, reach, opens = self._tags, self._reach, self._opens
        new = not tags or tags[-1] != tag
        if new and chunk and tag and not self._open and writer.passes_through():
            # Feeding it would hand out its items as they are: its chunk.
            self._seal_whole(tag, True, chunk)
            return
        if items is None:
            if chunk is None:
                raise InvalidArgumentError("A segment needs its items or its chunk.", field="items")
            items = decode_joined(chunk)
        out: list[NativeContent] = []
        marks: list[tuple[int, int]] = []
        writer.marks = marks
        writer.feed(items, out, tag)
        writer.marks = None
        if new:
            if (
                chunk
                and tag
                and not self._open
                and writer.held_origin() is None
                and len(out) == len(items)
                and all(map(operator.is_, out, items))
                and marks.count((tag, tag)) == len(marks)
            ):
                # Its body items are its items, unchanged and in order, and
                # nothing is held back: sealed at once, as its very chunk.
                self._seal_whole(tag, writer.can_open(out[0]), chunk)
                return
            tags.append(tag)
            reach.append(tag)
            opens.append(0)
            self._where.append(-1)
            self._offsets.append(0)
            self._open[tag] = _Open(items, encoded, chunk)
        count, start = len(out), 0
        while start < count:
            origin = marks[start][0]
            end, top = start, origin
            while end < count and marks[end][0] == origin:
                top = max(top, marks[end][1])
                end += 1
            index = len(tags) - 1
            while tags[index] > origin:  # an item held back from an earlier segment
                index -= 1
            if top > reach[index]:
                reach[index] = top
            if not opens[index]:
                opens[index] = 2 if writer.can_open(out[start]) else 1
            segment = self._open[tags[index]]
            for body_item in out[start:end]:
                # A body item that is the segment's next item (the same
                # object, or one encoded alike) is that item's encoding.
                at = segment.position(body_item, None)
                body = None
                if at < 0:
                    body = _encode(body_item)
                    at = segment.position(body_item, body)
                if at >= 0:
                    segment.next += 1
                    if at < len(segment.encoded):
                        segment.pending.append(segment.encoded[at])
                        continue
                else:
                    segment.whole = False
                segment.pending.append(
                    exact_bytes(body) if body is not None else encode_item(body_item)
                )
            start = end
        held = writer.held_origin()
        self._seal(tag + 1 if held is None else held)

    def _seal_whole(self, tag: int, can_open: bool, chunk: bytes) -> None:
        """Add segment ``tag``, sealed: its body items are its items, ``chunk`` as it is."""
        self._flush_loose()  # they come before it
        self._tags.append(tag)
        self._reach.append(tag)
        self._opens.append(2 if can_open else 1)
        self._where.append(self._base + len(self._chunks))
        self._offsets.append(0)
        self._chunks.append(chunk)

    def _flush_loose(self) -> None:
        """Join the loose chunks into one block at the end of ``_chunks`` (none: no change)."""
        loose = self._loose
        if not loose:
            return
        number = self._base + len(self._chunks)
        at = 0
        for index, chunk in zip(self._loose_at, loose, strict=True):
            self._where[index] = number
            self._offsets[index] = at
            at += len(chunk) + 1  # and the separator after it
        self._chunks.append(b",".join(loose))  # of one chunk: that very object
        loose.clear()  # snapshots took a tuple of it
        del self._loose_at[:]

    def _seal(self, below: int) -> None:
        """Seal the open segments tagged below ``below``: no body item can come for them now."""
        open_segments = self._open
        while open_segments:
            tag = next(iter(open_segments))
            if tag >= below:
                break
            segment = open_segments.pop(tag)
            index = len(self._tags) - 1
            while self._tags[index] != tag:
                index -= 1
            pending = segment.pending
            if tag == 0:
                self._lead.extend(pending)
                continue
            if not pending:
                continue
            chunk = segment.chunk
            if chunk is not None and segment.whole and segment.next == len(segment.items):
                # Its caller's chunk, kept once: its own entry.
                self._flush_loose()
                self._where[index] = self._base + len(self._chunks)
                self._chunks.append(chunk)
                continue
            self._loose.append(b",".join(pending))
            self._loose_at.append(index)
            if len(self._loose) >= _BLOCK_SEGMENTS:
                self._flush_loose()
        if not open_segments:
            # Empty, it refers to nothing; CPython tracks it again when an
            # _Open is stored in it.
            untrack_container(open_segments)

    def snapshot(self, rest: tuple[NativeContent, ...] = ()) -> EncodedBody:
        """The body as it stands, then ``rest``, in O(segment 0's and the open segments' items)."""
        chunks = EncodedSpan(self._chunks, self._skip, len(self._chunks))
        open_items = (b for segment in self._open.values() for b in segment.pending)
        tail = (*self._loose, *open_items)
        lead = (*self._lead, self._head) if self._head else tuple(self._lead)
        body = EncodedBody(self._writer, chunks, rest, lead, tail)
        if not gc.is_tracked(self) and not gc.is_tracked(rest):
            # As this run (see __init__), it holds the run's writer (out of
            # the collector), tuples of bytes, an EncodedSpan (out of the
            # collector itself) and ``rest``: native items out of the
            # collector too, by turnloom's proof (a history render's tail
            # items, JSON-encoded) or CPython's (atoms only). Nothing it
            # refers to can lead back to it, so it can be in no cycle.
            untrack_atoms(body)
        return body

    def _held(self) -> list[bytes]:
        """The encoded body, in body order (a copy): pieces of :meth:`_live_segments`, for tests."""
        return [piece for _, _, pieces in self._segment_pieces() for piece in pieces]

    def _live_segments(self) -> list[tuple[int, int, int]]:
        """Each held segment's (tag, reach, entries of :meth:`_held`), oldest first."""
        return [(tag, reach, len(pieces)) for tag, reach, pieces in self._segment_pieces()]

    def _segment_pieces(self) -> list[tuple[int, int, list[bytes]]]:
        """Each held segment's tag, reach and encoded body pieces, oldest first (O(held))."""
        tags, where, offsets = self._tags, self._where, self._offsets
        cut = 1 if tags and tags[0] == 0 else 0
        loose = dict(zip(self._loose_at, self._loose, strict=True))
        rows: list[tuple[int, int, list[bytes]]] = []
        for index in [*range(cut), *range(cut + self._dead, len(tags))]:
            tag, number = tags[index], where[index]
            pieces: list[bytes]
            if tag in self._open:
                pieces = list(self._open[tag].pending)
            elif tag == 0:
                pieces = list(self._lead)
            elif index in loose:
                pieces = [loose[index]]
            elif number >= 0:
                if number == self._head_block:
                    block, shift = self._head, self._head_at
                else:
                    block, shift = self._chunks[number - self._base], 0
                stop = len(block) + shift
                for later in range(index + 1, len(tags)):
                    if where[later] == number:
                        stop = offsets[later] - 1  # before its separator
                        break
                    if where[later] >= 0:
                        break
                pieces = [block[offsets[index] - shift : stop - shift]]
            else:
                pieces = []
            rows.append((tag, self._reach[index], pieces))
        return rows

    def compaction_due(self) -> bool:
        """True when what was dropped at the front is due to be copied out (:meth:`compact`)."""
        return compaction_due(self._skip, len(self._chunks) - self._skip) or compaction_due(
            self._dead, len(self._tags) - self._dead
        )

    def compact(self) -> None:
        """Copy the kept chunks and segments into new containers (O(kept)); snapshots stay valid."""
        if self._skip:
            self._chunks = self._chunks[self._skip :]
            untrack_container(self._chunks)
            self._base += self._skip
            self._skip = 0
        dead = self._dead
        if dead:
            cut = 1 if self._tags[0] == 0 else 0
            for segments in (self._tags, self._reach, self._where, self._offsets):
                del segments[cut : cut + dead]
            del self._opens[cut : cut + dead]
            # The loose segments are kept ones: after the dropped slots.
            for at in range(len(self._loose_at)):
                self._loose_at[at] -= dead
            self._dead = 0

    def drop(self, first_kept: int, dropped: CallIdRenamer) -> bool:
        """Drop the segments tagged below ``first_kept`` (but 0), when the rest stays exact.

        Returns False, changing nothing, when the kept body differs from
        what is cached (a body item spans the cut, or the gateway's state
        depends on the dropped items); the caller then builds a new run
        from the kept items. Costs O(dropped segments); what is dropped
        stays in the containers until :meth:`compact`.
        """
        plan = self.plan_drop(first_kept, dropped)
        if plan is None:
            return False
        self.apply_drop(plan)
        return True

    def plan_drop(self, first_kept: int, dropped: CallIdRenamer) -> _Drop | None:
        """What :meth:`drop` would do, or None when it would return False; changes nothing."""
        tags, reach = self._tags, self._reach
        cut = (1 if tags and tags[0] == 0 else 0) + self._dead  # the first held segment
        end = cut
        while end < len(tags) and tags[end] < first_kept:
            if reach[end] >= first_kept:
                return None
            end += 1
        if end == len(tags):
            return None  # nothing kept after the pinned segment: rebuild (cheap)
        held = self._writer.held_origin()
        if held is not None and 0 < held < first_kept:
            return None
        if tags[end] != first_kept or self._opens[end] != 2:
            return None
        writer = self._writer.copy()
        if not writer.forget(first_kept, dropped):
            return None
        return _Drop(writer, cut, end)

    def apply_drop(self, plan: _Drop) -> None:
        """Do what :meth:`plan_drop` planned (the run unchanged since)."""
        cut, end = plan.cut, plan.end
        self._writer = plan.writer
        # The first kept segment has body items (plan_drop checked can_open):
        # in a block, loose, or open (then every block is dropped).
        number = self._where[end]
        if number >= 0:
            index, at = number - self._base, self._offsets[end]
            if not at:
                self._skip, self._head, self._head_block = index, b"", -1
            else:
                if number == self._head_block:
                    head = self._head[at - self._head_at :]  # its block may be compacted away
                else:
                    head = self._chunks[index][at:]
                self._skip, self._head = index + 1, head
                self._head_at, self._head_block = at, number
        else:
            self._skip, self._head, self._head_block = len(self._chunks), b"", -1
            gone = 0
            while gone < len(self._loose_at) and self._loose_at[gone] < end:
                gone += 1
            del self._loose[:gone]
            del self._loose_at[:gone]
        self._dead += end - cut


class _Drop:
    """A planned :meth:`BodyRun.drop`: the writer after it and the segment slots it drops."""

    __slots__ = ("cut", "end", "writer")

    def __init__(self, writer: BodyWriter, cut: int, end: int) -> None:
        self.writer = writer
        self.cut = cut
        self.end = end

"""NativeItems: items kept partly encoded read exactly as the plain tuple would.

Oracle: the plain tuple of native items (and a plain scan for common prefixes).
"""

from __future__ import annotations

import array
import gc
import sys

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.context.test_history import plain_common_length
from turnloom.context.items import ChunkedSpan, NativeItems, common_prefix, encode_item

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["a", "b", "é"]),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.sampled_from("xy"), inner),
    max_leaves=4,
)
_item = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "v": _json})


def _split(
    items: list[dict[str, object]], cut: tuple[int, int], epoch: object, origin: int
) -> NativeItems:
    first, second = sorted(cut)
    first, second = min(first, len(items)), min(second, len(items))
    return NativeItems(
        tuple(items[:first]),
        tuple(map(encode_item, items[first:second])),
        tuple(items[second:]),
        epoch,
        origin,
    )


@settings(max_examples=300)
@given(
    st.lists(_item, max_size=8),
    st.lists(_item, max_size=8),
    st.tuples(st.integers(0, 8), st.integers(0, 8)),
    st.tuples(st.integers(0, 8), st.integers(0, 8)),
    st.booleans(),
)
def test_native_items_read_as_the_plain_tuple(
    a: list[dict[str, object]],
    b: list[dict[str, object]],
    cut_a: tuple[int, int],
    cut_b: tuple[int, int],
    shared: bool,
) -> None:
    """Invariant: whatever the split into native, encoded and native parts, an item
    read alone, the decoded tuple and the common length with another NativeItems
    (one of the same run when ``shared``: its encoded run then repeats ``a``'s at the
    same run coordinates) equal what the plain tuples give."""
    epoch = object()
    left = _split(a, cut_a, epoch, 0)
    if shared:
        # The same run as a later render sees it: ``a``'s run items with the
        # first ``drop`` of them evicted (its origin moves on), then more.
        start = min(sorted(cut_a)[0], len(a))
        run = a[start : min(sorted(cut_a)[1], len(a))]
        drop = min(cut_b[0], len(run))
        more = b[:2]
        b = [*a[:start], *run[drop:], *b]
        right = NativeItems(
            tuple(a[:start]),
            (*left._encoded[drop:], *map(encode_item, more)),
            tuple(b[start + len(run) - drop + len(more) :]),
            epoch,
            drop,
        )
    else:
        right = _split(b, cut_b, object(), 0)
    assert [left.item(i) for i in range(len(a))] == a
    assert left.common_length(right) == plain_common_length(tuple(a), tuple(b))
    assert right.common_length(left) == plain_common_length(tuple(b), tuple(a))
    assert left.materialize() == tuple(a)
    right.adopt(left)
    assert right.materialize() == tuple(b)
    assert len(right) == len(b)


def _shape(value: object) -> object:
    """``value`` with every container's type beside it: equal shapes mean equal types."""
    if isinstance(value, dict):
        return ("dict", [(k, _shape(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_shape(v) for v in value])
    return (type(value).__name__, value)


def _containers(value: object) -> set[int]:
    out, stack = set(), [value]
    while stack:
        node = stack.pop()
        if type(node) in (dict, list, tuple):
            if node != ():  # the empty tuple is one immutable object, shared by all
                out.add(id(node))
            stack.extend(node.values() if isinstance(node, dict) else node)  # type: ignore[arg-type]
    return out


@settings(max_examples=200)
@given(st.lists(_item, max_size=8), st.tuples(st.integers(0, 8), st.integers(0, 8)))
def test_a_host_copy_decoded_from_the_run_is_the_kept_tuple_shared_with_nothing(
    a: list[dict[str, object]], cut: tuple[int, int]
) -> None:
    """Invariant: ``fresh`` (the host's copy: the encoded run decoded again from its
    bytes, the natives around it copied) equals the kept tuple by value and by type
    of every container, shares no container with it or with another copy, and
    leaves the object undecoded (it needs no kept tuple)."""
    items = _split(a, cut, object(), 0)
    first, second = items.fresh(), items.fresh()
    assert not items.decoded
    kept = items._shared()
    assert first == second == kept == tuple(a)
    assert _shape(first) == _shape(kept)
    assert not _containers(first) & _containers(second)
    assert not _containers(first) & _containers(kept)
    assert not _containers(items.materialize()) & (_containers(kept) | _containers(first))


def test_adopted_items_are_the_earlier_decoded_objects() -> None:
    """Invariant: a NativeItems reuses the earlier one's decoded items (by identity)
    for the run coordinates both hold when it comes from the same run, for the same
    bytes objects when not, and decodes only the others."""
    items = [{"role": "user", "content": f"m{i}"} for i in range(6)]
    encoded = tuple(map(encode_item, items))
    epoch = object()
    earlier = NativeItems((), encoded[:4], (), epoch, 0)
    decoded = earlier._shared()
    later = NativeItems((), encoded[1:6], (), epoch, 1)  # one item dropped at the front
    later.adopt(earlier)
    got = later._shared()
    assert got == tuple(items[1:6])
    assert [x is y for x, y in zip(got, decoded[1:4], strict=False)] == [True, True, True]
    assert got[3] is not decoded[-1]
    # Another run (a run renamed anew): reused where it holds the very same bytes
    # objects, in any position; equal bytes in other objects are decoded anew.
    other = NativeItems((), (encoded[2], bytes(bytearray(encoded[1])), encoded[0]), (), object())
    other.adopt(earlier)
    got = other._shared()
    assert got == (items[2], items[1], items[0])
    assert [got[0] is decoded[2], got[1] is decoded[1], got[2] is decoded[0]] == [True, False, True]


def test_decoded_items_are_untracked_by_the_collector() -> None:
    """Invariant (CPython): the kept decoded items, like the render cache's, are not
    tracked by the cyclic collector (a held prefix adds no tracked objects per item);
    the copies ``materialize`` hands out are new and tracked."""
    if sys.implementation.name != "cpython":
        return
    item = {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f"}}]}
    items = NativeItems((), (encode_item(item),) * 3)._shared()
    assert items == (item,) * 3
    assert [gc.is_tracked(i) or gc.is_tracked(i["tool_calls"]) for i in items] == [False] * 3
    copies = NativeItems((), (encode_item(item),) * 3, (items[0],)).materialize()
    assert copies == (item,) * 4
    assert [gc.is_tracked(c) and gc.is_tracked(c["tool_calls"]) for c in copies] == [True] * 4
    assert not any(c is i or c["tool_calls"] is i["tool_calls"] for c in copies for i in items)


def test_a_cycle_a_host_builds_through_a_decoded_copy_is_seen_by_the_collector() -> None:
    """Invariant (CPython): a host copy decoded from the run (``fresh``) leaves a
    dict of atoms only untracked, as CPython does, and storing a container in it
    (a cycle through itself) tracks it, so the collector can free the cycle."""
    if sys.implementation.name != "cpython":
        return
    item = {"role": "user", "content": "hi"}
    copy = NativeItems((), (encode_item(item),)).fresh()
    assert copy == (item,)
    first = copy[0]
    assert not gc.is_tracked(first)
    first["self"] = first
    assert gc.is_tracked(first)


def test_encode_item_is_exact_and_equal_to_msgspec() -> None:
    """encode_item gives msgspec's bytes, held at their exact size."""
    item = {"role": "tool", "content": "x" * 700}
    encoded = encode_item(item)
    assert encoded == msgspec.json.encode(item)
    assert sys.getsizeof(encoded) == sys.getsizeof(b"") + len(encoded)


def test_common_prefix_of_an_empty_or_differing_start_is_zero() -> None:
    assert common_prefix((), (1,)) == 0
    assert common_prefix((1, 2), (2, 2)) == 0
    assert common_prefix((1, 2, 3), (1, 2, 4)) == 2


def _chunked(
    groups: list[list[bytes]], dropped: int, chunks: list[bytes] | None = None
) -> ChunkedSpan:
    """A span of ``groups`` (one chunk each, joined unless ``chunks`` are given), the first
    ``dropped`` dropped at the front, as a history's run lays them out."""
    ends, byte_ends, offsets = array.array("q"), array.array("q"), array.array("q")
    items = size = 0
    for group in groups:
        for encoded in group:
            size += len(encoded)
            offsets.append(size)
        items += len(group)
        ends.append(items)
        byte_ends.append(size)
    joined = [b",".join(g) for g in groups] if chunks is None else chunks
    origin = ends[dropped - 1] if dropped else 0
    base = byte_ends[dropped - 1] if dropped else 0
    return ChunkedSpan(joined, dropped, len(groups), ends, byte_ends, origin, base, offsets, origin)


_groups = st.lists(st.lists(_item, max_size=3), min_size=1, max_size=5)


@settings(max_examples=150)
@given(_groups, st.integers(0, 5))
def test_a_chunked_span_joins_and_cuts_any_range_as_its_items(
    groups: list[list[dict[str, object]]], dropped: int
) -> None:
    """Invariant: joining items start:stop of a span (chunks, some empty, some dropped
    at the front) equals joining their encodings; its chunk ranges cut into items
    give every item once, in order."""
    dropped = min(dropped, len(groups))
    encoded = [[encode_item(i) for i in g] for g in groups]
    span = _chunked(encoded, dropped)
    flat = [e for g in encoded[dropped:] for e in g]
    assert len(span) == len(flat)
    for start in range(len(flat) + 1):
        for stop in range(start, len(flat) + 1):
            assert span.joined(start, stop) == b",".join(flat[start:stop])
    assert span.joined() == b",".join(flat)
    ranges = span.chunk_ranges()
    assert [e for c, a, b, base in ranges for e in span.split(c, a, b, base)] == flat
    assert [(a, b) for _, a, b, _ in ranges] == [
        (sum(map(len, encoded[dropped:k])), sum(map(len, encoded[dropped : k + 1])))
        for k in range(dropped, len(groups))
        if encoded[k]
    ]


def test_items_of_another_chunked_run_are_reused_chunk_by_chunk() -> None:
    """Invariant: decoding a span of another run (renamed anew) equals decoding it
    cold; the items of a chunk both hold (the very object) are the earlier decoded
    objects, an item of another chunk is reused when an earlier chunk neither holds
    encodes it alike, and the rest are decoded anew."""
    items = [{"role": "user", "content": f"m{i}"} for i in range(7)]
    enc = [encode_item(i) for i in items]
    groups = [[enc[0], enc[1]], [enc[2]], [], [enc[3], enc[4]]]
    earlier = NativeItems((items[6],), _chunked(groups, 0), (), object())
    decoded = earlier._shared()
    old = earlier._encoded
    assert isinstance(old, ChunkedSpan)
    chunks = old._chunks
    changed = {"role": "user", "content": "changed"}
    # The first group dropped; the second kept (same chunk); the last changed
    # (enc[3] kept, enc[4] renamed): a new chunk; one new group after it.
    later_groups = [[enc[0], enc[1]], [enc[2]], [], [enc[3], encode_item(changed)], [enc[5]]]
    later_chunks = [
        chunks[0],
        chunks[1],
        chunks[2],
        b",".join(later_groups[3]),
        b",".join(later_groups[4]),
    ]
    later = NativeItems((items[6],), _chunked(later_groups, 1, later_chunks), (), object())
    later.adopt(earlier)
    got = later._shared()
    assert got == (items[6], items[2], items[3], changed, items[5])
    assert [g is d for g, d in zip(got, (decoded[0], decoded[3], decoded[4]), strict=False)] == [
        True,
        True,
        True,
    ]
    assert got[3] is not decoded[5] and got[4] not in decoded

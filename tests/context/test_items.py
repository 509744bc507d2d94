"""NativeItems: items kept partly encoded read exactly as the plain tuple would.

Oracle: the plain tuple of native items (and a plain scan for common prefixes).
"""

from __future__ import annotations

import gc
import sys

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.context.test_history import plain_common_length
from turnloom.context.items import NativeItems, common_prefix, encode_item

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


def test_adopted_items_are_the_earlier_decoded_objects() -> None:
    """Invariant: a NativeItems reuses the earlier one's decoded items (by identity)
    for the run coordinates both hold when it comes from the same run, for the same
    bytes objects when not, and decodes only the others."""
    items = [{"role": "user", "content": f"m{i}"} for i in range(6)]
    encoded = tuple(map(encode_item, items))
    epoch = object()
    earlier = NativeItems((), encoded[:4], (), epoch, 0)
    decoded = earlier.materialize()
    later = NativeItems((), encoded[1:6], (), epoch, 1)  # one item dropped at the front
    later.adopt(earlier)
    got = later.materialize()
    assert got == tuple(items[1:6])
    assert [x is y for x, y in zip(got, decoded[1:4], strict=False)] == [True, True, True]
    assert got[3] is not decoded[-1]
    # Another run (a run renamed anew): reused where it holds the very same bytes
    # objects, in any position; equal bytes in other objects are decoded anew.
    other = NativeItems((), (encoded[2], bytes(bytearray(encoded[1])), encoded[0]), (), object())
    other.adopt(earlier)
    got = other.materialize()
    assert got == (items[2], items[1], items[0])
    assert [got[0] is decoded[2], got[1] is decoded[1], got[2] is decoded[0]] == [True, False, True]


def test_decoded_items_are_untracked_by_the_collector() -> None:
    """Invariant (CPython): decoded items, like the render cache's, are not tracked
    by the cyclic collector (a held prefix adds no tracked objects per item)."""
    if sys.implementation.name != "cpython":
        return
    item = {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f"}}]}
    items = NativeItems((), (encode_item(item),) * 3).materialize()
    assert items == (item,) * 3
    assert [gc.is_tracked(i) or gc.is_tracked(i["tool_calls"]) for i in items] == [False] * 3


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

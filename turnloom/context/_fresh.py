"""New containers for what turnloom hands out: a fast deep copy of JSON-shaped data.

Native items are kept once and shared by turnloom's caches (the render
cache, decoded prefixes, merged bodies), untracked by the cyclic collector
(:mod:`turnloom.context._untrack`). Whatever a host gets back is a copy made
for that call: new dicts and lists (and tuples) all the way down, holding the
same atoms (str, int, float, bool, None are immutable, so they are shared),
so a host's edit of one reaches nothing turnloom keeps and no other value it
returned. Every container of a copy is one CPython made, tracked as CPython
tracks any new object (a dict holding atoms only stays untracked until a
container is stored in it, which tracks it), so a cycle a host builds
through one is collected, never leaked.

Copying the containers and sharing the atoms keeps every value's type (a
tuple stays a tuple) and allocates no string, but it is a Python-level walk:
where the kept JSON bytes of items exist (a history's closed turns), decoding
them again is about twice as fast and gives the same values and types
(:meth:`turnloom.context.items.NativeItems.fresh`; measured 1.7-2.2x on 200-
and 1,000-item OpenAI Chat histories, ``json.decode`` against
:func:`fresh_items`, thread CPU, this project's machine).
"""

from __future__ import annotations

__all__ = ("fresh_items", "fresh_json", "fresh_messages")

from collections.abc import Iterable
from typing import Any, TypeVar

import msgspec

_T = TypeVar("_T")


def _copy(value: Any) -> Any:
    """``value`` with every dict, list and tuple in it copied (recursive)."""
    kind = type(value)
    if kind is dict:
        out = dict(value)
        for key, child in value.items():
            child_kind = type(child)
            if child_kind is dict or child_kind is list or child_kind is tuple:
                out[key] = _copy(child)
        return out
    if kind is list:
        out_list = value.copy()
        for index, child in enumerate(value):
            child_kind = type(child)
            if child_kind is dict or child_kind is list or child_kind is tuple:
                out_list[index] = _copy(child)
        return out_list
    if kind is tuple:
        return tuple([_copy(child) for child in value])
    return value


def _copy_deep(value: Any) -> Any:
    """:func:`_copy` without recursion, for values nested deeper than the stack allows."""
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]
    tuples: list[tuple[list[Any], Any, Any]] = []  # built as lists, frozen innermost first
    while stack:
        node, into, key = stack.pop()
        kind = type(node)
        if kind is dict:
            copy: Any = dict(node)
            stack.extend((child, copy, k) for k, child in node.items())
        elif kind is list or kind is tuple:
            copy = list(node)
            stack.extend((child, copy, i) for i, child in enumerate(node))
            if kind is tuple:
                tuples.append((copy, into, key))
        else:
            copy = node
        into[key] = copy
    for as_list, into, key in reversed(tuples):
        into[key] = tuple(as_list)
    return root[0]


def fresh_json(value: _T) -> _T:
    """A copy of ``value`` whose dicts, lists and tuples are all new; atoms shared.

    Only exact ``dict``, ``list`` and ``tuple`` objects are copied (JSON
    data has no other container); anything else is kept as it is. A value
    nested deeper than the interpreter's stack allows is copied without
    recursion. Costs about one allocation per container.
    """
    try:
        return _copy(value)  # type: ignore[no-any-return]
    except RecursionError:
        return _copy_deep(value)  # type: ignore[no-any-return]


def fresh_items(items: Iterable[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """A new tuple of copies (:func:`fresh_json`) of native items, oldest first."""
    try:
        return tuple([_copy(item) for item in items])
    except RecursionError:
        return tuple([_copy_deep(item) for item in items])


def fresh_messages(messages: Iterable[_T]) -> tuple[_T, ...]:
    """``messages`` (frozen msgspec Structs) as a tuple, each copied where it holds a dict or list.

    A Message is frozen and its content a tuple of frozen parts, so most are
    handed out as they are; one whose ``extras``, ``layout`` or an opaque
    part's ``item`` (at any depth of its parts) is a dict or list is a new
    Message whose dicts and lists are new (:func:`fresh_json`): a host's
    edit of them never reaches the kept message, so never a later render.
    Costs a look at each field of each part; a copy only where one is mutable.
    """
    return tuple([_fresh_struct(m) if _mutable(m) else m for m in messages])


def _mutable(value: Any) -> bool:
    """True when the Message or part ``value`` holds a dict or list, at any depth of its parts."""
    if getattr(value, "extras", None) is not None or getattr(value, "layout", None) is not None:
        return True
    item = getattr(value, "item", None)
    if item is not None and type(item) in (dict, list):
        return True
    content = getattr(value, "content", None)
    return type(content) is tuple and any(map(_mutable, content))


def _fresh_struct(value: Any) -> Any:
    """``value`` (a Struct), or a copy of it with each mutable field copied (see above)."""
    changes: dict[str, Any] | None = None
    for name in value.__struct_fields__:
        field = getattr(value, name)
        kind = type(field)
        if kind is dict or kind is list:
            fresh = fresh_json(field)
        elif kind is tuple and field:
            fresh = _fresh_tuple(field)
        elif isinstance(field, msgspec.Struct):
            fresh = _fresh_struct(field)
        else:
            continue
        if fresh is not field:
            if changes is None:
                changes = {}
            changes[name] = fresh
    return msgspec.structs.replace(value, **changes) if changes else value


def _fresh_tuple(value: tuple[Any, ...]) -> tuple[Any, ...]:
    """``value``, or a new tuple where one of its elements needed a copy."""
    out = [
        _fresh_struct(v)
        if isinstance(v, msgspec.Struct)
        else (fresh_json(v) if type(v) in (dict, list, tuple) else v)
        for v in value
    ]
    return tuple(out) if any(a is not b for a, b in zip(out, value, strict=True)) else value

"""Keeping data that cannot form a reference cycle out of the cyclic garbage collector.

A full collection visits every tracked container and every reference it
holds, so its pause grows with what the process holds. Caches that hold
only JSON values (rendered native items), strings or bytes cannot form a
cycle; untracking them keeps full collections bounded by what is allocated
and dropped, not by what is held. Only CPython with the GIL untracks
(everywhere else these functions do nothing).
"""

from __future__ import annotations

__all__ = ("GC_UNTRACK", "untrack_atoms", "untrack_container", "untrack_json")

import ctypes
import gc
import sys
import sysconfig
from collections.abc import Callable, Iterable
from typing import Any


def _gc_untrack() -> Callable[[int], None] | None:
    """CPython's ``PyObject_GC_UnTrack``, taking an object's address (``id()``).

    None outside CPython, or where the GIL is disabled (untracking is only
    safe while the caller holds the GIL).
    """
    if sys.implementation.name != "cpython" or sysconfig.get_config_var("Py_GIL_DISABLED"):
        return None
    # An own prototype, so ctypes.pythonapi's shared function object is not changed.
    prototype = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)
    return prototype(("PyObject_GC_UnTrack", ctypes.pythonapi))


GC_UNTRACK = _gc_untrack()
_CONTAINERS = frozenset({dict, list, tuple})


def untrack_json(value: object) -> None:
    """Untrack cached native items (a tuple of them, or one) from the cyclic GC.

    An assistant item that calls tools is four containers (the item, its
    ``tool_calls`` list, a dict per call holding a dict) that CPython keeps
    tracked for as long as the render cache holds them, and a full collection
    visits every one. Untracking them is safe: the item was just JSON-encoded,
    so it is a finite tree of JSON values with no cycle, and the cache never
    changes it (prepared items are documented read-only). CPython tracks a
    dict again if a container is later stored in it; a list stays untracked,
    so a caller who broke the read-only rule by putting a reference cycle
    into one would leak that cycle, never crash. The tuples the caches keep
    the items in are untracked too: CPython untracks a tuple only when it
    holds no dict or list at all, tracked or not. Only exact dicts, lists and
    tuples are untracked (``PyObject_GC_UnTrack`` must be given a GC object),
    each while ``value`` keeps it alive, and nothing is done outside CPython
    with the GIL. Costs about a microsecond per tracked container, once per
    cached message; a plain text item is already untracked and costs a check.
    """
    untrack = GC_UNTRACK
    is_tracked = gc.is_tracked
    if untrack is None or not is_tracked(value):
        return  # nothing below an untracked container is tracked (see below)
    stack = [value]
    while stack:
        node = stack.pop()
        kind = type(node)
        children: Iterable[object]
        if kind is dict:
            children = node.values()  # type: ignore[attr-defined]
        elif kind is list or kind is tuple:
            children = node  # type: ignore[assignment]
        else:
            continue
        if not is_tracked(node):
            # Untracked already: by an earlier pass, which untracked its
            # containers too, or by CPython, which keeps a dict untracked only
            # while it holds no list, dict or tracked tuple, and a tuple only
            # when none it holds is tracked. Nothing below it needs untracking.
            continue
        untrack(id(node))
        for child in children:
            if type(child) in _CONTAINERS:
                stack.append(child)


def untrack_container(value: list[Any] | set[Any] | tuple[Any, ...] | dict[Any, Any]) -> None:
    """Untrack one container none of whose elements can be in a cycle with it.

    For a set of strings, a list of bytes or of untracked JSON items (see
    :func:`untrack_json`), a dict of strings: nothing it holds can refer back
    to it, so it can be in no cycle. CPython never tracks a list or set again
    once untracked (a dict, only when a container is stored in it), so later
    additions stay invisible to the collector: the caller keeps the element
    rule for as long as the container lives. (CPython untracks a
    tuple by itself only when it holds no dict or list at all, so a tuple of
    untracked native items needs this too.) Costs one C call.
    """
    if GC_UNTRACK is not None:
        GC_UNTRACK(id(value))


def untrack_atoms(value: object) -> None:
    """Untrack one object whose references can never lead back to it.

    For an ``array.array`` (machine numbers; its only reference is its
    type), or an instance of a ``__slots__`` class (a GC type: ``value``
    must be one) every slot of which holds only atoms (str, int, bool, None,
    bytes) or containers that can reach nothing but atoms and such
    containers (each caller states its proof). Nothing it refers to can
    refer back to it, so it can be in no cycle, and a full collection need
    not visit it or its references. CPython never tracks such an object
    again. Costs one C call; does nothing outside CPython with the GIL.
    """
    if GC_UNTRACK is not None:
        GC_UNTRACK(id(value))

"""The Context Area protocol: lifetime and scheduling states, and ``EffectRange``.

A Context Area is any object that contributes neutral :class:`Message` values
to a :class:`~turnloom.context.coop.CoopContext`. It is *structural*: an area
does not inherit from a turnloom class and is not decorated; an object with
the members of :class:`ContextAreaImplementation` is an area. Annotating a
construction site with ``ContextAreaImplementation`` asks a static type checker
to verify the whole contract there.

Two independent states drive an area:

* :class:`AreaLifeState` -- ``retain`` (may still observe and render) or
  ``retired`` (renders no more, may be collected). The transition is one-way;
  a CoopContext that has once read ``retired`` treats the area as retired for
  good, whatever the property says later.
* :class:`AreaFlowState` -- ``exclusive`` (keep the cursor, return the Context
  right after this area's render) or ``yielded`` (advance the cursor so the
  next area renders in the same pass).

An :class:`EffectRange` is the closed interval of Context indices an area has
influenced: from the first item of its first non-empty render to the last item
of its latest non-empty render. Items that the model or other areas appended
in between lie inside it too; the range is positional influence, not
ownership.
"""

from __future__ import annotations

__all__ = (
    "AreaFlowState",
    "AreaLifeState",
    "ContextAreaImplementation",
    "EffectRange",
)

import enum
from collections.abc import Sequence
from typing import Protocol

import msgspec

from turnloom.context.gateway import NativeContent
from turnloom.context.message import Message


class AreaLifeState(enum.StrEnum):
    """Whether an area is still active (``retain``) or finished (``retired``).

    The transition ``retain -> retired`` is
    irreversible; a retired area waits until the Collector can reclaim its
    tail and is then removed from the CoopContext.
    """

    retain = "retain"
    retired = "retired"


class AreaFlowState(enum.StrEnum):
    """How an area schedules the cursor after a successful ``render()``.

    * ``exclusive``: the cursor stays on this area and ``CoopContext.render()``
      returns at once, so only this area renders before the next model call.
    * ``yielded``: the cursor advances and later areas render in the same pass.
    """

    exclusive = "exclusive"
    yielded = "yielded"


class EffectRange(msgspec.Struct, frozen=True):
    """The closed interval ``[earliest, latest]`` of Context indices an area influenced.

    Both ends are indices of native items in the Context (0-based, inclusive).
    ``earliest`` is fixed by the area's first non-empty render; ``latest`` moves
    to the last item appended by its latest non-empty render.

    Attributes:
        earliest: index of the first native item of the area's first non-empty render.
        latest: index of the last native item of its latest non-empty render;
            ``latest >= earliest``.
    """

    earliest: int
    latest: int

    def overlaps(self, other: EffectRange) -> bool:
        """Whether the two closed intervals share at least one index.

        Touching ranges overlap: ``[2, 5]`` and ``[5, 9]`` share index 5.
        The Collector follows overlapping closed intervals.
        """
        return self.earliest <= other.latest and other.earliest <= self.latest

    def __len__(self) -> int:
        """The number of Context indices covered (``latest - earliest + 1``)."""
        return self.latest - self.earliest + 1


class ContextAreaImplementation(Protocol):
    """The structural contract of a Context Area (no base class, no decorator).

    A CoopContext reads and calls the members as follows:

    * ``life_state`` -- read at every collection (the safe point at the start
      of ``CoopContext.render()``), before observing, and again after
      ``observe()`` (before rendering).
    * ``flow_state`` -- read after every successful ``render()``.
    * ``observe(context)`` -- called only when the area is retained, has
      reached the cursor and already owns an :class:`EffectRange`; ``context``
      is a read-only, fixed-length snapshot of exactly that range (a Sequence
      of NativeContent, oldest first). The items are shared, not copied: treat
      them as read-only. Retiring inside ``observe()`` skips this pass's
      ``render()``.
    * ``render()`` -- called when a retained area reaches the cursor; returns a
      list of neutral messages, oldest first, which the CoopContext renders
      through the active gateway and appends. Never build native items here.
    * ``promote()`` -- called once, when the Collector has selected the area
      for reclamation; returns the messages (tuple, oldest first) that must
      survive it, or ``()``. Every collected area is promoted before any
      ``gc_prologue()`` runs. State changes here cannot cancel collection.
    * ``gc_prologue()`` -- the last notification before the tail is detached
      and the area removed; for external cleanup. State changes here have no
      effect on the collection plan.

    An area must also be hashable (any ordinary class is; prefer
    ``@dataclass(eq=False)`` for dataclasses). A CoopContext tells areas apart
    by identity, so two equal areas are still two areas.
    """

    @property
    def life_state(self) -> AreaLifeState:
        """Whether the area is retained or retired."""
        ...

    @property
    def flow_state(self) -> AreaFlowState:
        """Whether the area keeps the cursor (exclusive) or yields it."""
        ...

    def observe(self, context: Sequence[NativeContent]) -> None:
        """Look at a read-only snapshot of the area's current EffectRange."""
        ...

    def render(self) -> list[Message]:
        """The neutral messages to append now, oldest first (may be empty)."""
        ...

    def promote(self) -> tuple[Message, ...]:
        """The messages that survive the area's reclamation, oldest first."""
        ...

    def gc_prologue(self) -> None:
        """Release external resources before the area's tail is detached."""
        ...

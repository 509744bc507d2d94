"""What an eviction drops, holds aside for a retraction, and restores."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from turnloom.context.history._cells import _Turn
from turnloom.context.message import (
    Message,
)


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


def _identified(turn: _Turn) -> list[Message]:
    """The messages of ``turn`` with an id (its input and outputs: kept state has none)."""
    return [e.message for e in turn.input + turn.outputs if e.message.id is not None]

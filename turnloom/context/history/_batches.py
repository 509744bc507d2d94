"""The door's check of a batch of messages, and its memo."""

from __future__ import annotations

from turnloom.context.gateway import Gateway
from turnloom.context.history._cells import _Encoded, _Native, _Turn

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

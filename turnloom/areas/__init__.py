"""Built-in Context Areas.

Each is a plain class satisfying
:class:`~turnloom.context.area.ContextAreaImplementation` structurally:

* :class:`OneShotNotice` -- renders once, retires, leaves nothing behind.
* :class:`PinnedNotice` -- renders once, never retires (blocks collection of
  the tail components it overlaps and of everything before them).
* :class:`SubtaskArea` -- holds the cursor over several model calls until a
  completion predicate holds, then retires and promotes a summary.
"""

from __future__ import annotations

__all__ = (
    "MessageContent",
    "OneShotNotice",
    "PinnedNotice",
    "SubtaskArea",
    "SubtaskPredicate",
    "SubtaskSummary",
)

from turnloom.areas._content import MessageContent
from turnloom.areas.notice import OneShotNotice, PinnedNotice
from turnloom.areas.subtask import SubtaskArea, SubtaskPredicate, SubtaskSummary

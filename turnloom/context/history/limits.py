"""The bounds of a history and the counters it reports."""

from __future__ import annotations

import msgspec

from turnloom.context.message import (
    DEFAULT_MAX_MESSAGE_BYTES,
)
from turnloom.errors import (
    InvalidArgumentError,
    TurnTooLargeError,
    excerpt,
)


class HistoryLimits(msgspec.Struct, frozen=True, kw_only=True):
    """The bounds of one context's history.

    Attributes:
        max_turns: most turns kept (default 32).
        max_items: most messages kept across all turns (default 4,096); one
            turn never holds more (its input, or its messages once recorded),
            nor more pinned instructions than this.
        max_bytes: most bytes of serialized messages kept (default 8 MiB), and
            the most one turn holds. This bounds retained content, not
            process memory: besides the turns kept, a history holds aside
            the turns evicted since its newest commit until its next change
            (so that retracting that turn restores them, see
            :meth:`TurnHistory.retract`), at most the turns held when that
            turn was committed.
        max_item_bytes: the per-item cap: one message larger than this, in
            bytes, is rejected when it is committed or recorded (default 1 MiB).
        max_tokens: most tokens of messages kept across all turns, counted by
            the history's token counter (the Foundation's); ``None`` (default)
            for no token bound.

    Raises:
        InvalidArgumentError: a limit is not a positive integer (``field``
            names it; ``max_tokens`` may also be ``None``).
    """

    max_turns: int = 32
    max_items: int = 4096
    max_bytes: int = 8 * 1024 * 1024
    max_item_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_items", "max_bytes", "max_item_bytes", "max_tokens"):
            value = getattr(self, name)
            if value is None and name == "max_tokens":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidArgumentError(
                    f"History limit {name} must be a positive integer, not {excerpt(value)}.",
                    field=name,
                )


HistoryCounts = tuple[int, int, int, int, int, int, int, int, int, int]
"""What :meth:`TurnHistory.counts` returns: ``(turns, items, bytes, tokens,
evicted_turns, evicted_items, dropped_late_outputs, dropped_blank_outputs,
duplicate_outputs, retracted_turns)``, as in :class:`HistoryStatistics`."""


class HistoryStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A frozen snapshot of one history's counters.

    Attributes:
        turns: turns kept.
        items: messages kept in those turns (pinned instructions excluded),
            kept state messages (:meth:`TurnHistory.keep_state`) included;
            ``bytes`` and ``tokens`` count them too.
        bytes: serialized size of those messages, in bytes.
        pinned_items: pinned instruction messages (not counted in ``items``).
        pinned_bytes: their serialized size, in bytes.
        evicted_turns: turns evicted for good since the history was created.
            The turns the evictions since the newest commit dropped are held
            aside (``restorable_turns``) and counted here once they can no
            longer be restored: at the history's next change but a
            retraction of that turn, which restores them (see
            :meth:`TurnHistory.retract`).
        evicted_items: messages evicted with them.
        evicted_bytes: bytes evicted with them.
        dropped_late_outputs: messages recorded for a turn no longer held
            (evicted or retracted), dropped.
        dropped_blank_outputs: empty or whitespace-only messages not recorded.
        duplicate_outputs: messages recorded again with an id and content
            already held in their turn, not stored again.
        retracted_turns: turns retracted since the history was created.
        tokens: tokens of the kept messages (pinned instructions excluded),
            by the history's token counter.
        pinned_tokens: tokens of the pinned instructions.
        evicted_tokens: tokens evicted with the evicted turns.
        restorable_turns: turns evicted since the newest commit, held aside
            until the history's next change: a retraction of the newest turn
            restores them, else they count in ``evicted_turns``. Neither in
            ``turns`` nor in ``evicted_turns``.
    """

    turns: int
    items: int
    bytes: int
    pinned_items: int
    pinned_bytes: int
    evicted_turns: int
    evicted_items: int
    evicted_bytes: int
    dropped_late_outputs: int
    dropped_blank_outputs: int
    duplicate_outputs: int = 0
    retracted_turns: int = 0
    tokens: int = 0
    pinned_tokens: int = 0
    evicted_tokens: int = 0
    restorable_turns: int = 0


def check_batch_length(count: int, limits: HistoryLimits, where: str) -> None:
    """Refuse a batch that makes one turn hold more than ``limits.max_items`` messages.

    Raises:
        TurnTooLargeError: ``count`` is over the limit (``unit="items"``).
    """
    if count > limits.max_items:
        raise TurnTooLargeError(
            f"{where} would make the turn hold {count} messages, over the history's "
            f"limit of {limits.max_items}.",
            unit="items",
            size=count,
            limit=limits.max_items,
        )

"""The bounds of a history and the counters it reports."""

from __future__ import annotations

import math
from typing import Protocol

import msgspec

from turnloom.context.history._cells import _Entry
from turnloom.context.history._turns import _Turns
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
        low_water: how far an eviction goes, as a fraction of each limit
            (``0 < low_water <= 1``; default 1.0). A history evicts only
            once a limit above is crossed, and then down to every limit's
            mark (:meth:`low_water_marks`), not just below the crossed
            limit. At 1.0 it evicts just enough for the limits to hold: one
            turn as each new one arrives, once the history is full. The
            trade: providers cache an input by its exact prefix, and an
            eviction changes the input right after the pinned instructions,
            so the history's bytes in the next input are billed uncached; a
            lower mark keeps fewer turns on average (about ``(1 +
            low_water) / 2`` of a full history's) against far fewer such
            breaks (one per ``(1 - low_water) * max_turns`` turns instead of
            one per turn). Measured on tau-bench sessions of 200 turns
            (``scripts/bench_cache_reuse.py``, docs/prompt-cache.md), at
            ``max_turns=32``: 0.4 keeps 21.1 turns on average against 29.5
            and repeats 94.7% of the previous input's bytes across turns
            against 19.7%, at 0.12 of the uncached input price against
            0.44; 0.4 is the largest fraction measured that repeats at
            least 90% at ``max_turns=16`` too (0.5: 89.0%), and the one to
            set for a long conversation. The default stays 1.0 because a
            durable store's log replays only under the limits it was written
            with: a new default would make every log written before it
            unreadable after an upgrade (``StoreRecordError``).

    Raises:
        InvalidArgumentError: a limit is not a positive integer (``field``
            names it; ``max_tokens`` may also be ``None``), or ``low_water``
            is not a number in ``(0, 1]``.
    """

    max_turns: int = 32
    max_items: int = 4096
    max_bytes: int = 8 * 1024 * 1024
    max_item_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_tokens: int | None = None
    low_water: float = 1.0

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
        low = self.low_water
        if not isinstance(low, int | float) or isinstance(low, bool) or not 0 < low <= 1:
            raise InvalidArgumentError(
                f"History limit low_water must be a number above 0 and at most 1, not "
                f"{excerpt(low)}.",
                field="low_water",
            )

    def low_water_marks(self) -> tuple[int, int, int, int | None]:
        """What an eviction evicts down to: ``(turns, items, bytes, tokens)``.

        Each limit times ``low_water``, rounded down (a fraction written in
        decimal counts as written: 0.29 of 100 turns is 29, though the float
        0.29 is a hair below); tokens ``None`` when ``max_tokens`` is. At
        ``low_water`` 1.0, the limits themselves. A mark may be 0: the
        eviction then stops at the newest turn (and the turns tied to it),
        which is never evicted.
        """
        low = self.low_water
        if low == 1:  # the limits themselves (the default)
            return (self.max_turns, self.max_items, self.max_bytes, self.max_tokens)
        return (
            _mark(self.max_turns, low),
            _mark(self.max_items, low),
            _mark(self.max_bytes, low),
            None if self.max_tokens is None else _mark(self.max_tokens, low),
        )


def _mark(limit: int, fraction: float) -> int:
    """``floor(limit * fraction)``, read to 9 decimal places so float error never lowers it.

    ``fraction`` below 1: at 1 the caller takes the limit itself.
    """
    return math.floor(round(limit * fraction, 9))


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


class _CountState(Protocol):
    """The state of a :class:`TurnHistory` this file reads and changes."""

    _blank_dropped: int
    _bytes: int
    _duplicates: int
    _evicted: int
    _evicted_bytes: int
    _evicted_items: int
    _evicted_tokens: int
    _items: int
    _late_dropped: int
    _limits: HistoryLimits
    _pinned: tuple[_Entry, ...]
    _pinned_bytes: int
    _pinned_tokens: int
    _retracted: int
    _tokens: int
    _turns: _Turns


def _statistics(history: _CountState, restorable: int) -> HistoryStatistics:
    """The work of :meth:`TurnHistory.statistics` (documented there); ``restorable``
    is its count of turns held aside."""
    return HistoryStatistics(
        turns=len(history._turns),
        items=history._items,
        bytes=history._bytes,
        pinned_items=len(history._pinned),
        pinned_bytes=history._pinned_bytes,
        evicted_turns=history._evicted,
        evicted_items=history._evicted_items,
        evicted_bytes=history._evicted_bytes,
        dropped_late_outputs=history._late_dropped,
        dropped_blank_outputs=history._blank_dropped,
        duplicate_outputs=history._duplicates,
        retracted_turns=history._retracted,
        tokens=history._tokens,
        pinned_tokens=history._pinned_tokens,
        evicted_tokens=history._evicted_tokens,
        restorable_turns=restorable,
    )

"""MutationJournal: append-only authored history with a commit watermark."""

from __future__ import annotations

__all__ = ("MutationJournal",)

from collections.abc import Iterable
from typing import Generic, TypeVar, cast

from turnloom.errors import InvalidArgumentError, what_type

JournalEntryT = TypeVar("JournalEntryT")


def _batch(entries: object, field: str) -> list[object]:
    if isinstance(entries, str | bytes | bytearray) or not isinstance(entries, Iterable):
        raise InvalidArgumentError(
            f"{field} must be an iterable of journal entries, not {what_type(entries)}.",
            field=field,
        )
    return list(entries)


class MutationJournal(Generic[JournalEntryT]):
    """Append-only journal of entries, with a watermark for streaming upward.

    A child agent records entries; its parent absorbs :meth:`diff` (the
    entries past the watermark) and the child then calls
    :meth:`mark_committed`, so the next diff holds only newer entries. Entries
    are never rewritten or reordered: attribution stamped on them (an
    ``agent_id`` field, say) survives every merge into a parent's journal.

    The journal belongs to one agent and does no locking.

    Args:
        initial: entries to start from, oldest first. They count as already
            committed: the watermark starts past them (a journal rehydrated
            from a snapshot its parent has already seen).

    Raises:
        InvalidArgumentError: ``initial`` is not an iterable (a string is
            refused too).
    """

    __slots__ = ("_committed", "_entries")

    def __init__(self, initial: Iterable[JournalEntryT] | None = None) -> None:
        self._entries: list[JournalEntryT] = (
            [] if initial is None else cast("list[JournalEntryT]", _batch(initial, "initial"))
        )
        self._committed = len(self._entries)

    def record(self, entry: JournalEntryT) -> None:
        """Append one entry after every other; it is uncommitted until :meth:`mark_committed`."""
        self._entries.append(entry)

    def apply(self, entries: Iterable[JournalEntryT]) -> None:
        """Append a batch of entries in arrival order, each unchanged.

        This is how a parent absorbs a child's :meth:`diff`. The journal
        trusts its caller not to apply one diff twice.

        Raises:
            InvalidArgumentError: ``entries`` is not an iterable (or is a
                string); nothing was appended.
        """
        self._entries.extend(cast("list[JournalEntryT]", _batch(entries, "entries")))

    def view(self) -> tuple[JournalEntryT, ...]:
        """Every entry, committed and not, oldest first (a read-only tuple)."""
        return tuple(self._entries)

    def diff(self) -> tuple[JournalEntryT, ...]:
        """The uncommitted suffix: entries recorded past the watermark, oldest first."""
        return tuple(self._entries[self._committed :])

    def mark_committed(self) -> None:
        """Move the watermark past every entry now in the journal."""
        self._committed = len(self._entries)

    @property
    def has_uncommitted(self) -> bool:
        """True when :meth:`diff` would return at least one entry."""
        return self._committed < len(self._entries)

    @property
    def committed_index(self) -> int:
        """How many entries are committed: the index of the first uncommitted one."""
        return self._committed

    def copy(self) -> MutationJournal[JournalEntryT]:
        """A new journal with the same entries (by identity) and the same watermark."""
        clone: MutationJournal[JournalEntryT] = MutationJournal(self._entries)
        clone._committed = self._committed
        return clone

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"MutationJournal(entries={len(self._entries)}, committed={self._committed})"

"""MutationJournal (seed 002): append-only entries, a watermark, diffs past it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from turnloom.context import MutationJournal
from turnloom.errors import InvalidArgumentError


@dataclass(frozen=True)
class Edit:
    agent_id: str
    what: str


def test_mutation_journal_seed_entries_count_as_committed() -> None:
    journal = MutationJournal([Edit("a", "1"), Edit("a", "2")])
    assert journal.committed_index == 2
    assert journal.has_uncommitted is False
    assert journal.diff() == ()
    assert len(journal) == 2


def test_mutation_journal_record_appends_an_uncommitted_entry() -> None:
    journal: MutationJournal[Edit] = MutationJournal()
    journal.record(Edit("a", "1"))
    assert journal.view() == (Edit("a", "1"),)
    assert journal.has_uncommitted is True
    assert journal.committed_index == 0


def test_mutation_journal_diff_is_the_suffix_past_the_watermark() -> None:
    journal = MutationJournal([Edit("a", "seed")])
    journal.record(Edit("a", "1"))
    journal.record(Edit("a", "2"))
    assert journal.diff() == (Edit("a", "1"), Edit("a", "2"))


def test_mutation_journal_mark_committed_moves_the_watermark_past_everything() -> None:
    journal: MutationJournal[Edit] = MutationJournal()
    journal.record(Edit("a", "1"))
    journal.mark_committed()
    assert (journal.committed_index, journal.has_uncommitted, journal.diff()) == (1, False, ())
    journal.record(Edit("a", "2"))
    assert journal.diff() == (Edit("a", "2"),)


def test_mutation_journal_apply_keeps_order_and_attribution() -> None:
    """Invariant: a parent absorbing a child's diff keeps each entry, unchanged, in order."""
    child: MutationJournal[Edit] = MutationJournal()
    child.record(Edit("child", "x"))
    child.record(Edit("child", "y"))
    parent = MutationJournal([Edit("parent", "p")])
    parent.apply(child.diff())
    child.mark_committed()
    assert parent.view() == (Edit("parent", "p"), Edit("child", "x"), Edit("child", "y"))
    assert parent.view()[1] is child.view()[0]
    assert parent.diff() == (Edit("child", "x"), Edit("child", "y"))
    assert child.diff() == ()


def test_mutation_journal_view_is_read_only() -> None:
    journal = MutationJournal([1, 2])
    view = journal.view()
    assert isinstance(view, tuple)
    journal.record(3)
    assert view == (1, 2)


def test_mutation_journal_copy_keeps_entries_and_watermark() -> None:
    journal = MutationJournal([1])
    journal.record(2)
    clone = journal.copy()
    assert (clone.view(), clone.committed_index, clone.diff()) == ((1, 2), 1, (2,))
    clone.record(3)
    assert journal.view() == (1, 2)


@pytest.mark.parametrize("bad", [5, "abc", b"ab", None])
def test_mutation_journal_apply_rejects_a_non_iterable_batch(bad: object) -> None:
    journal = MutationJournal([1])
    with pytest.raises(InvalidArgumentError) as info:
        journal.apply(bad)  # type: ignore[arg-type]
    assert info.value.field == "entries"
    assert journal.view() == (1,)


def test_mutation_journal_rejects_a_string_as_its_seed() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        MutationJournal("abc")
    assert info.value.field == "initial"

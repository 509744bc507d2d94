"""A false start at the limit: retracting the newest turn undoes the evictions its commit made.

Invariant: commit a turn to a history at its limits, evict, retract the turn:
the history is what it was before the commit in every observable (held turns
and their order, counts and statistics but ``retracted_turns``, held and
remembered ids, ties, renders), but for the retracted id, remembered as used.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.context.test_history import CHAT, SYSTEM, assistant, call, cold_render, result
from turnloom.context import Message, Role, message_size
from turnloom.context.history import HistoryLimits, TurnHistory
from turnloom.errors import DuplicateIdError


def user(text: str, message_id: str | None = None) -> Message:
    return Message(role=Role.user, content=text, id=message_id)


def observe(history: TurnHistory) -> dict[str, Any]:
    """Everything a host can read of a history but the retraction counter and the ids gone."""
    view = history.view()
    stats = history.statistics()
    return {
        "turn_ids": view.turn_ids,
        "turns": [
            (
                view.turn_input(t),
                view.turn_messages(t),
                view.turn_state(t),
                history.turn_serial(t),
            )
            for t in view.turn_ids
        ],
        "pinned": view.pinned,
        "counts": history.counts()[:9],
        "statistics": msgspec_fields(stats),
        "open_calls": history.open_calls(),
        "sequence": history.sequence,
        "over_limits": history.over_limits(),
        "held": [history.has_turn(t) for t in view.turn_ids],
    }


def msgspec_fields(stats: object) -> dict[str, object]:
    fields = {k: getattr(stats, k) for k in stats.__struct_fields__}  # type: ignore[attr-defined]
    fields.pop("retracted_turns")
    return fields


def test_retracting_a_false_start_at_max_turns_brings_back_the_turn_its_commit_evicted() -> None:
    """Invariant: at max_turns=3, committing t4 evicts t1; retracting t4 holds t1 again,
    and the history (view, counts, statistics, renders) is what it was before t4."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=3))
    history.commit("t1", [user("one")], instructions=[SYSTEM])
    history.record("t1", [assistant("One.")])
    history.commit("t2", [user("two")])
    history.record("t2", [assistant("Two.")])
    history.commit("t3", [user("three")])
    history.record("t3", [assistant("Three.")])
    before = observe(history)
    rendered = history.view().render(CHAT, "t3")
    history.commit("t4", [user("*cough*")])
    assert history.evict() == ("t1",)
    assert history.turn_ids == ("t2", "t3", "t4")
    history.retract("t4")
    assert history.turn_ids == ("t1", "t2", "t3")
    assert observe(history) == before
    assert history.was_evicted("t4") and not history.was_evicted("t1")
    assert history.evicted_ids == ("t4",)
    again = history.view().render(CHAT, "t3")
    assert list(again.items) == list(rendered.items) == cold_render(history, "t3")


def _tied_history() -> TurnHistory:
    """t1 asks for a call, t2's input answers it (tied to t1), t3 is plain: at max_turns=3."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=3))
    history.commit("t1", [user("Delete the branch.", "m1")], instructions=[SYSTEM])
    history.record("t1", [call("c1", "delete_branch")])
    history.commit("t2", [result("c1", "deleted")])
    history.record("t2", [assistant("Deleted.")])
    history.commit("t3", [user("Thanks.")])
    history.record("t3", [assistant("Welcome.")])
    return history


def test_a_restored_unit_of_tied_turns_is_tied_again_and_leaves_together() -> None:
    """Invariant: the false start evicts t1 and t2 together (t2 answers t1's call); after
    its retraction they are held and tied again, so the next real turn evicts them
    together again, never t1 alone (which would orphan t2's results)."""
    history = _tied_history()
    before = observe(history)
    linked = set(history._linked)
    assert len(linked) == 1
    history.commit("t4", [user("uh")])
    assert history.evict() == ("t1", "t2")
    assert history.restorable_ids == ("t1", "t2")
    assert history._linked == set()
    history.retract("t4")
    assert observe(history) == before
    assert history._linked == linked
    history.commit("t5", [user("Next.")])
    assert history.evict() == ("t1", "t2")
    assert history.turn_ids == ("t3", "t5")


def test_a_restored_turns_message_ids_are_held_again() -> None:
    """Invariant: t1's input message id m1 is held again once t1 is restored: a record
    or commit reusing it with other content is refused (DuplicateIdError), as before
    the false start."""
    history = _tied_history()
    history.commit("t4", [user("uh")])
    assert history.evict() == ("t1", "t2")
    history.retract("t4")
    with pytest.raises(DuplicateIdError):
        history.record("t3", [Message(role=Role.assistant, content="other", id="m1")])
    with pytest.raises(DuplicateIdError):
        history.commit("t5", [user("Again.", "m1")])
    assert history.turn_ids == ("t1", "t2", "t3")


def test_evicted_turns_count_once_they_can_no_longer_be_restored() -> None:
    """Invariant: turns a commit's eviction holds aside are neither held nor counted
    evicted (restorable_turns counts them) until the next change: a record to the
    newest turn lets them go (counted, with their items, bytes and tokens), a blank or
    late record does not."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=2))
    history.commit("t1", [user("one")], instructions=[SYSTEM])
    history.record("t1", [assistant("One.")])
    history.commit("t2", [user("two")])
    history.commit("t3", [user("three")])
    assert history.evict() == ("t1",)
    stats = history.statistics()
    assert (stats.turns, stats.items, stats.restorable_turns, stats.evicted_turns) == (2, 2, 1, 0)
    assert history.counts()[4:6] == (0, 0)
    assert history.record("t3", [assistant("  ")]) == 0  # blank: nothing changes
    assert history.record("t1", [assistant("late")]) == 0  # t1 is gone: dropped
    assert history.restorable_ids == ("t1",)
    assert history.record("t3", [assistant("Three.")]) == 1
    stats = history.statistics()
    assert (stats.turns, stats.items, stats.restorable_turns, stats.evicted_turns) == (2, 3, 0, 1)
    one = [user("one"), assistant("One.")]
    assert (stats.evicted_items, stats.evicted_bytes, stats.evicted_tokens) == (
        2,
        sum(message_size(m) for m in one),
        sum(history.token_counter.count([m]) for m in one),
    )
    assert (stats.dropped_late_outputs, stats.dropped_blank_outputs) == (1, 1)


@pytest.mark.parametrize(
    "change",
    ["record", "late record", "earlier state", "commit", "remember", "settle"],
)
def test_a_change_after_the_eviction_lets_the_evicted_turns_go(change: str) -> None:
    """Invariant: once the history changed otherwise than by the newest turn's kept state
    and evictions, the turns held aside are evicted for good: a retraction (where still
    allowed) restores nothing, and they count in evicted_turns."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=3))
    for n in (1, 2, 3):
        history.commit(f"t{n}", [user(f"u{n}")], instructions=[SYSTEM] if n == 1 else None)
        history.record(f"t{n}", [assistant(f"a{n}")])
    history.commit("t4", [user("uh")])
    assert history.evict() == ("t1",)
    newest = "t4"
    if change == "record":
        history.record("t4", [assistant("Hm?")])
    elif change == "late record":
        history.record("t2", [assistant("more")])
    elif change == "earlier state":
        assert history.keep_state("t2", [call("tlrs_1", "state"), result("tlrs_1", "s")])
    elif change == "commit":
        history.commit("t5", [user("uh again")])
        newest = "t5"
    elif change == "remember":
        history.remember_evicted(["t0"])
    else:
        history.settle_evictions()
    assert history.restorable_ids == ()
    assert history.statistics().evicted_turns == 1
    if change != "record":
        history.retract(newest)
        assert history.turn_ids == (("t2", "t3", "t4") if change == "commit" else ("t2", "t3"))
        assert history.was_evicted("t1")


def test_the_false_starts_own_kept_state_does_not_stop_the_restore() -> None:
    """Invariant: a state pair kept on the false start (its prepare delivered one), and
    the turns a further eviction drops for it, are undone by its retraction too."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=3, max_items=6))
    for n in (1, 2, 3):
        history.commit(f"t{n}", [user(f"u{n}")], instructions=[SYSTEM] if n == 1 else None)
        history.record(f"t{n}", [assistant(f"a{n}")])
    before = observe(history)
    history.commit("t4", [user("uh")])
    assert history.evict() == ("t1",)
    assert history.keep_state("t4", [call("tlrs_1", "state"), result("tlrs_1", "s")])
    assert history.evict() == ("t2",)  # 2 + 2 + 3 items were over max_items=6
    assert history.restorable_ids == ("t1", "t2")
    assert history.statistics().restorable_turns == 2
    history.retract("t4")
    assert observe(history) == before
    assert history.turn_ids == ("t1", "t2", "t3")


def test_a_refused_commit_keeps_the_turns_held_aside() -> None:
    """Invariant: a commit refused before any change (a duplicate id) lets nothing go."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=1))
    history.commit("t1", [user("one")], instructions=[SYSTEM])
    history.commit("t2", [user("uh")])
    assert history.evict() == ("t1",)
    with pytest.raises(DuplicateIdError):
        history.commit("t1", [user("again")])
    assert history.restorable_ids == ("t1",)
    history.retract("t2")
    assert history.turn_ids == ("t1",)
    assert history.statistics().evicted_turns == 0


def test_remembered_ids_pushed_out_by_the_eviction_come_back_in_order() -> None:
    """Invariant: with remember_evicted=2, the false start's eviction of t3 and t4 pushes
    t1 and t2 out of the remembered ids (counted forgotten); its retraction gives back
    (t1, t2), then remembers the false start's own id, pushing out t1 only."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=2), remember_evicted=2)
    for n in range(1, 5):
        history.commit(f"t{n}", [user(f"u{n}")], instructions=[SYSTEM] if n == 1 else None)
        history.record(f"t{n}", [assistant(f"a{n}")])
        history.evict()
    assert (history.turn_ids, history.evicted_ids, history._forgotten) == (
        ("t3", "t4"),
        ("t1", "t2"),
        0,
    )
    history.commit("t5", [user("uh")])
    assert history.evict() == ("t3",)
    assert (history.evicted_ids, history._forgotten) == (("t2", "t3"), 1)
    history.retract("t5")
    assert history.turn_ids == ("t3", "t4")
    assert (history.evicted_ids, history._forgotten) == (("t2", "t5"), 1)

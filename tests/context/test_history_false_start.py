"""A false start at the limit: retracting the newest turn undoes the evictions its commit made.

Invariant: commit a turn to a history at its limits, evict, retract the turn:
the history is what it was before the commit in every observable (held turns
and their order, counts and statistics but ``retracted_turns``, held and
remembered ids, ties, renders), but for the retracted id, remembered as used.
"""

from __future__ import annotations

from typing import Any

from tests.context.test_history import CHAT, SYSTEM, assistant, cold_render, user
from turnloom.context.history import HistoryLimits, TurnHistory


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
    history = TurnHistory(HistoryLimits(max_turns=3))
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

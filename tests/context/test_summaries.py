"""Summary compaction and pruning on one history: the checks, the plan, the change, the log.

Invariants: a summary is data (user, then assistant, text only) and is checked
before anything changes; it replaces exactly the oldest held turns it was
given, never the newest, never splitting a call from the turn whose input
answers it, never while turns are held aside for a false start; the history
then renders as a cold rebuild of (instructions + summary + retained turns);
pruning keeps every call, id and name, replaces only result bodies and drops
reasoning, and a pruned turn prunes to itself; a log replays summaries and
prunings to the same history, and a log that does not fit is refused.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from tests.context.test_history import SYSTEM, assistant, call, result, user
from turnloom.context import (
    CompactionPolicy,
    GatewayType,
    Message,
    PrunePolicy,
    ReasoningPart,
    Role,
    TextPart,
    ToolResultPart,
    check_summary,
    get_gateway,
    prune_messages,
)
from turnloom.context.history import (
    HistoryLimits,
    TurnHistory,
    apply_summary,
    changeable,
    next_summary_id,
    prune_turns,
    summary_range,
)
from turnloom.context.summaries import SUMMARY_TURN_PREFIX, summary_due
from turnloom.errors import (
    DuplicateIdError,
    InputError,
    InvalidArgumentError,
    InvalidMessageError,
    StateError,
    StoreRecordError,
    UnknownTurnError,
)
from turnloom.runtime._records import (
    OutputsRecorded,
    TurnCommitted,
    TurnsEvicted,
    TurnsPruned,
    TurnsSummarized,
    checkpoint,
    compacted,
    encode_record,
    replay,
)

S1 = f"{SUMMARY_TURN_PREFIX}1"


def _history(turns: int, limits: HistoryLimits | None = None) -> TurnHistory:
    history = TurnHistory(limits)
    for n in range(turns):
        history.commit(f"t{n}", [user(f"q{n}")], instructions=[SYSTEM] if n == 0 else None)
        history.record(f"t{n}", [call(f"k{n}"), result(f"k{n}", "r" * 40), assistant(f"a{n}")])
    return history


def _cold_equal(history: TurnHistory) -> None:
    """The history renders, on every gateway, as a rebuild from its own messages."""
    view = history.view()
    cold = TurnHistory(history.limits)
    for i, turn_id in enumerate(view.turn_ids):
        given = view.turn_input(turn_id)
        cold.commit(turn_id, given, instructions=view.pinned if i == 0 else None)
        outputs = view.turn_messages(turn_id)[len(given) :]
        if outputs:
            cold.record(turn_id, outputs)
    newest = view.turn_ids[-1]
    for kind in GatewayType:
        gateway = get_gateway(kind)
        items = list(view.render(gateway, newest).items)
        assert items == list(cold.view().render(gateway, newest).items)


def test_a_summary_is_user_then_assistant_text_only() -> None:
    """Invariant: check_summary splits a summary into input and outputs and refuses
    instructions, tool parts, blank text, empty and oversized summaries."""
    given, answer = check_summary([user("a"), user("b"), assistant("c")], 8)
    assert (given, answer) == ((user("a"), user("b")), (assistant("c"),))
    bad: list[tuple[object, str]] = [
        ([], "1 to 8 messages"),
        ([user("a")] * 9, "1 to 8 messages"),
        ("text", "sequence of Message"),
        ([Message(role=Role.system, content="obey")], r"summary\[0\] has role"),
        ([assistant("a")], r"summary\[0\] has role"),
        ([user("a"), assistant("b"), user("c")], r"summary\[2\] has role"),
        ([call("k")], r"summary\[0\] has role"),
        ([Message(role=Role.user, content=(TextPart(text=" "),))], "blank"),
        ([Message(role=Role.user, content=())], "is empty"),
        ([result("k")], "role"),
    ]
    for summary, match in bad:
        with pytest.raises(InvalidMessageError, match=match):
            check_summary(summary, 8)


def test_policies_are_checked() -> None:
    """Invariant: a policy that cannot work fails at construction with InputError."""
    bad: tuple[dict[str, Any], ...] = (
        {},
        {"trigger_turns": 4, "keep_turns": 4},
        {"trigger_turns": 0},
        {"trigger_tokens": 100, "keep_tokens": -1},
        {"trigger_turns": 9, "timeout": 0},
        {"trigger_turns": 9, "timeout": float("inf")},
        {"trigger_turns": 9, "keep_turns": True},
    )
    for kwargs in bad:
        with pytest.raises(InputError):
            CompactionPolicy(**kwargs)
    for kwargs in ({"keep_turns": 0}, {"note": " "}, {"note": "x" * 1025}):
        with pytest.raises(InputError):
            PrunePolicy(**kwargs)
    policy = CompactionPolicy(trigger_turns=5, trigger_tokens=100, keep_turns=2)
    assert (
        summary_due(policy, 5, 100),
        summary_due(policy, 6, 0),
        summary_due(policy, 1, 101),
    ) == (
        False,
        True,
        True,
    )


@pytest.mark.parametrize(
    ("keep", "keep_tokens", "field"),
    [
        (0, None, "keep"),
        (-2, None, "keep"),
        (True, None, "keep"),
        (2.0, None, "keep"),
        ("2", None, "keep"),
        (2, 0, "keep_tokens"),
        (2, -1, "keep_tokens"),
        (2, False, "keep_tokens"),
        (2, 1.5, "keep_tokens"),
    ],
)
def test_a_range_asked_with_a_bad_keep_is_an_invalid_argument(
    keep: Any, keep_tokens: Any, field: str
) -> None:
    """Invariant: summary_range refuses a keep or keep_tokens that is not a positive int
    with InvalidArgumentError naming it (keep=0 and keep=-2 raised IndexError from inside
    the cut's walk), and the history is unchanged."""
    history = _history(4)
    before = history.view().turn_ids
    with pytest.raises(InvalidArgumentError) as caught:
        summary_range(history, keep, keep_tokens)
    assert caught.value.field == field
    assert history.view().turn_ids == before == ("t0", "t1", "t2", "t3")
    assert summary_range(history, 1) == ("t0", "t1", "t2")


def test_the_range_is_the_oldest_turns_cut_where_eviction_cuts() -> None:
    """Invariant: summary_range takes the oldest turns down to keep (and keep_tokens),
    moves the cut past a turn tied to the one before it, never takes the newest."""
    history = _history(6)
    assert summary_range(history, 2) == ("t0", "t1", "t2", "t3")
    assert summary_range(history, 6) == ()
    tokens = history.view()
    assert tokens.turn_ids == ("t0", "t1", "t2", "t3", "t4", "t5")
    assert summary_range(history, 5, keep_tokens=1) == ("t0", "t1", "t2", "t3", "t4")
    # An approval: t6 leaves a call open, t7's input answers it: t6 and t7 go together.
    history.commit("t6", [user("q6")])
    history.record("t6", [call("open6")])
    history.commit("t7", [result("open6")])
    history.record("t7", [assistant("a7")])
    history.commit("t8", [user("q8")])
    assert summary_range(history, 2) == ("t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7")
    assert summary_range(history, 3) == ("t0", "t1", "t2", "t3", "t4", "t5")


def test_a_summary_replaces_exactly_its_held_turns_and_renders_cold() -> None:
    """Invariant: the summary turn replaces t0..t2, comes first, leaves t3..t5 as they
    were; counts follow; renders equal a cold rebuild on every gateway; the replaced
    turns are remembered (a late output is dropped), not counted as evicted."""
    history = _history(6)
    before = history.view()
    summary_id = next_summary_id(history)
    assert summary_id == f"{SUMMARY_TURN_PREFIX}7"  # the history's serial after 6 commits, plus 1
    applied = apply_summary(
        history, ("t0", "t1", "t2"), summary_id, [user("earlier: q0 q1 q2"), assistant("ok")]
    )
    assert (applied.replaced, applied.gone) == (("t0", "t1", "t2"), ())
    view = history.view()
    assert view.turn_ids == (summary_id, "t3", "t4", "t5")
    assert view.turn_messages(summary_id) == (user("earlier: q0 q1 q2"), assistant("ok"))
    for turn_id in ("t3", "t4", "t5"):
        assert view.turn_messages(turn_id) == before.turn_messages(turn_id)
    counts = history.statistics()
    assert (counts.turns, counts.evicted_turns) == (4, 0)
    assert counts.items == 2 + 3 * 4
    assert history.record("t1", [assistant("late")]) == 0
    assert history.statistics().dropped_late_outputs == 1
    _cold_equal(history)


def test_a_summary_covers_turns_evicted_while_it_was_written() -> None:
    """Invariant: turns of the range evicted meanwhile are covered (``gone``); the held
    rest is replaced; a range whose held turns are not the oldest is refused."""
    history = _history(5, HistoryLimits(max_turns=5))
    history.commit("t5", [user("q5")])
    history.record("t5", [assistant("a5")])
    assert history.evict() == ("t0",)
    applied = apply_summary(history, ("t0", "t1", "t2"), S1, [user("s")])
    assert (applied.replaced, applied.gone) == (("t1", "t2"), ("t0",))
    assert history.view().turn_ids == (S1, "t3", "t4", "t5")
    _cold_equal(history)


@pytest.mark.parametrize(
    ("turn_ids", "error", "match"),
    [
        (("t1", "t2"), StateError, "not next after"),
        (("t0", "t2"), StateError, "not next after"),
        (("t0", "t1", "t2", "t3"), StateError, "never replaces the newest"),
        (("t0", "nope"), UnknownTurnError, "not known"),
    ],
)
def test_a_summary_that_does_not_fit_changes_nothing(
    turn_ids: tuple[str, ...], error: type[Exception], match: str
) -> None:
    """Invariant: a range that is not the oldest held turns in order, holds the newest
    turn or names an unknown turn is refused before any change."""
    history = _history(4)
    before, counts = history.view(), history.statistics()
    with pytest.raises(error, match=match):
        apply_summary(history, turn_ids, S1, [user("s")])
    assert history.view().turn_ids == before.turn_ids
    assert history.statistics() == counts
    assert not history.has_turn(S1) and not history.was_evicted(S1)


def test_a_summary_never_splits_a_call_from_the_turn_answering_it() -> None:
    """Invariant: t1's open call is answered by t2's input; a summary of t0, t1 alone
    is refused; with t2 it is taken."""
    history = _history(1)
    history.commit("t1", [user("q1")])
    history.record("t1", [call("open1")])
    history.commit("t2", [result("open1")])
    history.record("t2", [assistant("a2")])
    history.commit("t3", [user("q3")])
    history.record("t3", [assistant("a3")])
    with pytest.raises(StateError, match="answers calls of the summarized turns"):
        apply_summary(history, ("t0", "t1"), S1, [user("s")])
    apply_summary(history, ("t0", "t1", "t2"), S1, [user("s")])
    assert history.view().turn_ids == (S1, "t3")
    _cold_equal(history)


def test_a_summary_waits_for_a_false_start_and_ids_are_checked() -> None:
    """Invariant: while turns are held aside for a retraction, no summary applies and no
    pruning runs (the retraction restores them as they were); bad or duplicate summary
    ids are refused."""
    history = _history(4, HistoryLimits(max_turns=4))
    history.commit("t4", [user("uh")])
    assert history.evict() == ("t0",)
    assert not changeable(history)
    with pytest.raises(StateError, match="held aside"):
        apply_summary(history, ("t0", "t1"), S1, [user("s")])
    messages = history.view().messages()
    with pytest.raises(StateError, match="a pruning waits"):
        prune_turns(history, 1, "[p]")
    assert history.view().messages() == messages
    assert history.restorable_ids == ("t0",)
    history.retract("t4")
    assert history.view().turn_ids == ("t0", "t1", "t2", "t3")
    assert changeable(history)
    with pytest.raises(InvalidMessageError, match="starts with"):
        apply_summary(history, ("t0",), "summary-1", [user("s")])
    apply_summary(history, ("t0",), S1, [user("s")])
    with pytest.raises(DuplicateIdError):
        apply_summary(history, (S1,), S1, [user("s")])
    history.commit("t5", [msgspec.structs.replace(user("q5"), id="m5")])
    history.record("t5", [assistant("a5")])
    with pytest.raises(InvalidMessageError, match="'m5', which a message of this context"):
        apply_summary(
            history, (S1,), f"{SUMMARY_TURN_PREFIX}2", [msgspec.structs.replace(user("s"), id="m5")]
        )
    assert history.view().turn_ids == (S1, "t1", "t2", "t3", "t5")


def test_eviction_keeps_the_summary_turn_first_and_drops_it_last() -> None:
    """Invariant: over a limit, eviction drops the turns after the summary turn, oldest
    first (counted), and renders as a cold rebuild; only when the summary and the newest
    turn alone are over a limit does the summary go (a hard limit stays hard)."""
    history = _history(4, HistoryLimits(max_turns=4))
    apply_summary(history, ("t0", "t1"), S1, [user("s")])
    for n in (4, 5):
        history.commit(f"t{n}", [user(f"q{n}")])
        history.record(f"t{n}", [assistant(f"a{n}")])
        history.evict()
    assert history.view().turn_ids == (S1, "t3", "t4", "t5")
    assert history.evicted_ids[-1:] == ("t2",)
    assert history.statistics().evicted_turns == 1
    _cold_equal(history)
    tight = _history(2, HistoryLimits(max_turns=4, max_tokens=60))
    apply_summary(tight, ("t0",), S1, [user("summary " * 30)])
    assert tight.evict() == ("turnloom.summary.1",)
    assert tight.view().turn_ids == ("t1",)


def test_a_false_start_restores_the_turns_after_the_summary() -> None:
    """Invariant: a false start that evicts the turn after the summary turn, retracted,
    puts it back after the summary; a checkpoint taken while it is held aside replays
    to the same history and the same turns held aside."""
    history = _history(4, HistoryLimits(max_turns=4))
    apply_summary(history, ("t0", "t1"), S1, [user("s")])
    history.commit("t4", [user("q4")])
    history.record("t4", [assistant("a4")])
    history.commit("t5", [user("uh")])
    assert history.evict() == ("t2",)
    assert history.restorable_ids == ("t2",)
    view, evicted, after = compacted(history)
    assert view.turn_ids == (S1, "t2", "t3", "t4", "t5")
    log = [checkpoint(view, evicted, None), *(encode_record(r) for r in after)]
    rebuilt = replay("c", log, history.limits)
    assert rebuilt.view().turn_ids == (S1, "t3", "t4", "t5")
    assert rebuilt.restorable_ids == ("t2",)
    history.retract("t5")
    assert history.view().turn_ids == (S1, "t2", "t3", "t4")
    _cold_equal(history)


def test_a_summary_dropped_by_a_false_starts_second_eviction_is_restored_first() -> None:
    """Invariant: a false start whose first eviction drops t1 and whose second (after
    its kept state grew) drops the summary turn holds them aside, and restores them on
    retraction, in their history order (summary, t1, t2), as a checkpoint replays them."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=3, max_tokens=60))
    for n in range(3):
        history.commit(f"t{n}", [user(f"q{n}")], instructions=[SYSTEM] if n == 0 else None)
        history.record(f"t{n}", [assistant(f"a{n}")])
    apply_summary(history, ("t0",), S1, [user("s")])
    before = history.view()
    history.commit("t3", [user("uh")])
    assert history.evict() == ("t1",)
    history.keep_state("t3", [user("x " * 150)])
    assert history.evict() == (S1, "t2")
    assert history.restorable_ids == (S1, "t1", "t2")
    view, evicted, after = compacted(history)
    assert view.turn_ids == (S1, "t1", "t2", "t3")
    log = [checkpoint(view, evicted, None), *(encode_record(r) for r in after)]
    rebuilt = replay("c", log, history.limits)
    assert rebuilt.view().turn_ids == ("t3",)
    assert rebuilt.restorable_ids == (S1, "t1", "t2")
    history.retract("t3")
    assert history.view().turn_ids == (S1, "t1", "t2")
    assert history.view().messages() == before.messages()
    assert history.statistics().evicted_turns == 0
    _cold_equal(history)


def test_a_false_start_that_drops_the_summary_remembers_ids_as_its_checkpoint_replays() -> None:
    """Invariant: when a false start's second eviction drops the summary turn, the
    history remembers the evicted ids in history order (t0, summary, t1, t2), as
    the replay of a checkpoint taken then (one eviction of them all) does, and
    both keep remembering the same ids after the next commit settles them."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=3, max_tokens=60))
    for n in range(3):
        history.commit(f"t{n}", [user(f"q{n}")], instructions=[SYSTEM] if n == 0 else None)
        history.record(f"t{n}", [assistant(f"a{n}")])
    apply_summary(history, ("t0",), S1, [user("s")])
    history.commit("t3", [user("uh")])
    assert history.evict() == ("t1",)
    history.keep_state("t3", [user("x " * 150)])
    assert history.evict() == (S1, "t2")
    view, evicted, after = compacted(history)
    log = [checkpoint(view, evicted, None), *(encode_record(r) for r in after)]
    rebuilt = replay("c", log, history.limits)
    assert history.evicted_ids == rebuilt.evicted_ids == ("t0", S1, "t1", "t2")
    for h in (history, rebuilt):
        h.record("t3", [assistant("a3")])
    assert history.evicted_ids == rebuilt.evicted_ids == ("t0", S1, "t1", "t2")


def test_pruning_keeps_pairs_and_is_byte_stable() -> None:
    """Invariant: prune_messages replaces result bodies by the note, keeps every call,
    id, name and error flag, drops reasoning (a reasoning-only message goes), and
    pruned messages prune to themselves (None)."""
    thinking = Message(role=Role.assistant, content=(ReasoningPart(text="hmm " * 50),))
    both = Message(role=Role.assistant, content=(ReasoningPart(text="so"), TextPart(text="answer")))
    failed = Message(
        role=Role.tool,
        content=(
            ToolResultPart(
                call_id="k", name="f", is_error=True, content=(TextPart(text="x" * 99),)
            ),
        ),
    )
    messages = [call("k"), failed, thinking, both]
    pruned = prune_messages(messages, "[p]")
    assert pruned == (
        call("k"),
        Message(
            role=Role.tool,
            content=(
                ToolResultPart(
                    call_id="k", name="f", is_error=True, content=(TextPart(text="[p]"),)
                ),
            ),
        ),
        Message(role=Role.assistant, content=(TextPart(text="answer"),)),
    )
    assert prune_messages(pruned, "[p]") is None
    assert prune_messages([user("q"), assistant("a")], "[p]") is None


def test_prune_turns_prunes_old_turns_once_and_renders_cold() -> None:
    """Invariant: turns before the newest keep are pruned once (a second pass changes
    nothing, with or without the checked memo); bytes shrink; renders stay cold-equal."""
    history = _history(5)
    size = history.statistics().bytes
    checked: dict[int, object] = {}
    assert prune_turns(history, 2, "[p]", checked) == ("t0", "t1", "t2")
    assert history.statistics().bytes < size
    assert prune_turns(history, 2, "[p]", checked) == ()
    assert prune_turns(history, 2, "[p]") == ()
    old = history.view().turn_messages("t0")
    assert old[2].parts == (ToolResultPart(call_id="k0", content=(TextPart(text="[p]"),)),)
    assert history.view().turn_messages("t4")[2] == result("k4", "r" * 40)
    _cold_equal(history)


def test_pruning_a_turn_holding_one_call_message_twice_keeps_each_its_sent_ids() -> None:
    """Invariant: a call message object recorded twice in one turn (its id sent as k,
    then renamed k_r2) keeps each occurrence's own sent id once the turn is pruned (a
    reasoning-only message between dropped): both pairs still render (none vanishes)
    and the render equals a cold rebuild; only the two pruned results are counted anew."""
    counted: list[Message] = []

    class Counter:
        def count(self, messages: Any) -> int:
            counted.extend(messages)
            return 3 * len(messages)

    history = TurnHistory(token_counter=Counter())
    history.commit("t0", [user("q0")], instructions=[SYSTEM])
    lookup = call("k")
    thinking = Message(role=Role.assistant, content=(ReasoningPart(text="hmm"),))  # pruned away
    history.record(
        "t0",
        [lookup, result("k", "r" * 40), thinking, assistant("a"), lookup, result("k", "s" * 40)],
    )
    history.commit("t1", [user("q1")])
    history.view().render(get_gateway(GatewayType.openai_chat), "t1")
    counted.clear()
    assert prune_turns(history, 1, "[p]") == ("t0",)
    assert [m.parts for m in counted] == [
        (ToolResultPart(call_id="k", content=(TextPart(text="[p]"),)),)
    ] * 2
    sent = [
        p.call_id
        for m in history.view().sent_messages("t1")
        for p in m.parts
        if hasattr(p, "call_id")
    ]
    assert sent == ["k", "k", "k_r2", "k_r2"]
    _cold_equal(history)


def test_a_log_replays_summaries_and_prunings_and_refuses_one_that_does_not_fit() -> None:
    """Invariant: replaying commit, record, prune, summarize and evict records rebuilds
    the same history; a summarize record whose ``replaced`` differs from what the
    rebuilt history replaces is a StoreRecordError naming its index."""
    limits = HistoryLimits(max_turns=4)
    log: list[bytes] = []
    history = TurnHistory(limits)
    for n in range(4):
        turn_input = (user(f"q{n}"),)
        outputs = (call(f"k{n}"), result(f"k{n}", "r" * 40), assistant(f"a{n}"))
        history.commit(f"t{n}", turn_input, instructions=[SYSTEM] if n == 0 else None)
        history.record(f"t{n}", outputs)
        log.append(
            encode_record(
                TurnCommitted(
                    turn_id=f"t{n}",
                    input=turn_input,
                    instructions=(SYSTEM,) if n == 0 else None,
                )
            )
        )
        log.append(encode_record(OutputsRecorded(turn_id=f"t{n}", outputs=outputs)))
    pruned = prune_turns(history, 2, "[p]")
    log.append(encode_record(TurnsPruned(turn_ids=pruned, keep=2, note="[p]")))
    applied = apply_summary(history, ("t0", "t1"), S1, [user("s")])
    log.append(
        encode_record(
            TurnsSummarized(
                turn_ids=("t0", "t1"),
                summary_id=S1,
                summary=(user("s"),),
                replaced=applied.replaced,
            )
        )
    )
    history.commit("t4", [user("q4")])
    history.record("t4", [assistant("a4")])
    log.append(encode_record(TurnCommitted(turn_id="t4", input=(user("q4"),))))
    log.append(encode_record(OutputsRecorded(turn_id="t4", outputs=(assistant("a4"),))))
    history.commit("t5", [user("q5")])
    log.append(encode_record(TurnCommitted(turn_id="t5", input=(user("q5"),))))
    evicted = history.evict()
    assert evicted == ("t2",)  # the summary turn stays first; the turn after it goes
    log.append(encode_record(TurnsEvicted(turn_ids=evicted)))
    rebuilt = replay("c", log, limits)
    view, expected = rebuilt.view(), history.view()
    assert view.turn_ids == expected.turn_ids
    for turn_id in view.turn_ids:
        assert view.turn_messages(turn_id) == expected.turn_messages(turn_id)
    bad = list(log[:9])
    bad.append(
        encode_record(
            TurnsSummarized(
                turn_ids=("t0", "t1"), summary_id=S1, summary=(user("s"),), replaced=("t0",)
            )
        )
    )
    with pytest.raises(StoreRecordError, match="Record 9 of context 'c' replaces turns") as caught:
        replay("c", bad, limits)
    assert caught.value.index == 9

"""A closed turn reads back as it did live (``_Closed``, turnloom.context.history._cells).

A turn that joined a run keeps its messages, tokens and sent ids in one tuple,
with no entry per message. Two histories take the same random steps (commits,
some answering the newest turn's open calls; records, some late to an earlier
turn; kept state; evictions; retractions; pruning; sent ids restored), with
call ids reused everywhere so turns are sent renamed. One is rendered after
each step, so its turns close; the other never is, so its turns stay live.

Invariants:

1. every read of the two histories is the same (views, statistics, open calls,
   the ids turns are sent with, each turn's messages, tokens and counts);
2. the rendered one's incremental render equals a cold render of its messages
   as sent, and the turns its run holds are closed (a retraction may make a
   closed turn the newest again: it stays closed);
3. each history's id maps hold exactly what they stand for: its turn ids
   (``_ids``) the kept turns' (turns held aside for a retraction are not
   kept), the sent ids (``_SentIds.present``) every kept call's id as sent.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.context.marked_calls import marked_call, marked_result
from turnloom.context import (
    GatewayType,
    Message,
    NativeContent,
    Role,
    complete_pairs,
    get_gateway,
)
from turnloom.context.callids import rename_call_ids
from turnloom.context.gateway import step_join
from turnloom.context.history import (
    HistoryLimits,
    TurnHistory,
    prune_turns,
    restore_sent_ids,
)
from turnloom.context.history._cells import _Closed, _Entry, _Turn
from turnloom.context.message import ToolCallPart
from turnloom.errors import TurnloomError

IDS = ("a", "b")
SYSTEM = Message(role=Role.system, content="You are terse.")
LIMITS = HistoryLimits(low_water=1.0, max_turns=5, max_items=24, max_bytes=1 << 20)


_step = st.one_of(
    st.tuples(st.just("commit"), st.booleans(), st.just(0)),
    st.tuples(
        st.just("record"),
        st.lists(st.sampled_from(IDS), min_size=1, max_size=2, unique=True),
        st.integers(0, 3),  # 0-1: the newest turn; 2: an earlier one; 3: the last call stays open
    ),
    st.tuples(st.just("state"), st.integers(0, 2), st.integers(0, 2)),
    st.tuples(st.just("evict"), st.just(False), st.just(0)),
    st.tuples(st.just("retract"), st.just(False), st.just(0)),
    st.tuples(st.just("prune"), st.just(False), st.integers(1, 3)),
    st.tuples(st.just("restore"), st.integers(0, 3), st.just(0)),
)


def _apply(history: TurnHistory, step: tuple[str, Any, int], number: int) -> str | None:
    """Apply one step; the name of the error it raised, or None."""
    op, arg, n = step
    turn_ids = history.turn_ids
    newest = turn_ids[-1]
    try:
        if op == "commit":
            given: list[Message] = [Message(role=Role.user, content=f"u{number}")]
            if arg:  # an approval: results for the newest turn's open calls
                given = [
                    marked_result(c.call_id, msgspec.json.decode(c.arguments)["t"])
                    for c in history.open_calls()
                ] or given
            history.commit(f"t{number}", given)
        elif op == "record":
            target = turn_ids[-2] if n == 2 and len(turn_ids) > 1 else newest
            answered = arg[:-1] if n == 3 else arg
            outputs = [marked_call(c, f"{number}.{k}") for k, c in enumerate(arg)]
            outputs += [
                marked_result(c, f"{number}.{k}") for k, c in enumerate(arg) if c in answered
            ]
            outputs.append(Message(role=Role.assistant, content=f"a{number}"))
            history.record(target, outputs)
        elif op == "state":
            target = turn_ids[max(0, len(turn_ids) - 1 - arg)]
            state = [Message(role=Role.assistant, content=f"s{number}.{k}") for k in range(n)]
            history.keep_state(target, state)
        elif op == "evict":
            history.evict()
        elif op == "retract":
            if len(turn_ids) > 1:
                history.retract(newest)
        elif op == "prune":
            prune_turns(history, n, "[pruned]")
        else:
            target = turn_ids[max(0, len(turn_ids) - 1 - arg)]
            restore_sent_ids(history, target, history.view().sent_call_ids(target), given=True)
    except TurnloomError as exc:
        return type(exc).__name__
    return None


def _cells(turn: _Turn) -> tuple[object, ...]:
    """Everything a turn's accessors read back, whether it is live or closed."""

    def entries(of: tuple[_Entry, ...]) -> list[tuple[Message, int, object, Message]]:
        return [(e.message, e.tokens, e.sent, e.wire) for e in of]

    return (
        turn.turn_id,
        turn.items,
        turn.n_input,
        turn.n_state,
        turn.output_count,
        turn.bytes,
        turn.tokens,
        turn.serial,
        turn.state_bytes,
        entries(turn.entries(True)),
        entries(turn.entries(False)),
        entries(turn.input),
        entries(turn.state),
        entries(turn.outputs),
        turn.messages(True),
        turn.messages(False),
        turn.recorded(),
        turn.last_message(),
        turn.wire_messages(True),
        turn.wire_messages(False),
    )


def _reads(history: TurnHistory) -> dict[str, object]:
    """What a host (and the history's own code) reads of ``history``."""
    view = history.view()
    reads: dict[str, object] = {
        "statistics": history.statistics(),
        "open calls": history.open_calls(),
        "turn ids": view.turn_ids,
        "pinned": view.pinned,
        "messages": view.messages(),
        "restorable": history.restorable_ids,
        "evicted": history.evicted_ids,
        "cells": [_cells(t) for t in history._turns],
    }
    for turn_id in view.turn_ids:
        reads[turn_id] = (
            view.turn_messages(turn_id),
            view.turn_input(turn_id),
            view.turn_state(turn_id),
            view.input_messages(turn_id),
            view.sent_messages(turn_id),
            view.sent_call_ids(turn_id),
            view.scope_messages(turn_id),
        )
    before, remembered = history.before_evictions()
    reads["before evictions"] = (
        before.turn_ids,
        [before.sent_messages(t) for t in before.turn_ids],
        remembered,
    )
    return reads


def _check_id_maps(history: TurnHistory) -> None:
    """Invariant (3) of the module docstring."""
    view = history.view()
    assert sorted(history._ids) == sorted(view.turn_ids)
    assert all(history.has_turn(t) for t in view.turn_ids)
    assert not any(history.has_turn(t) for t in history.restorable_ids)
    calls = [
        part.call_id
        for turn in history._turns
        for message in turn.wire_messages(True)
        for part in message.parts
        if type(part) is ToolCallPart
    ]
    assert sorted(history._sent.present) == sorted(calls)


def _cold(history: TurnHistory, turn_id: str, kind: GatewayType) -> list[NativeContent]:
    gateway = get_gateway(kind)
    sent = list(history.view().sent_messages(turn_id))
    messages = complete_pairs(sent, join=step_join(gateway))
    return rename_call_ids(kind, [i for m in messages for i in gateway.render(m)])


@settings(max_examples=150, deadline=None)
@given(st.lists(_step, min_size=1, max_size=30), st.sampled_from(list(GatewayType)))
def test_closed_turns_read_back_as_live_ones(
    steps: list[tuple[str, Any, int]], kind: GatewayType
) -> None:
    """Invariants (1), (2) and (3) of the module docstring, after every step.

    Mutants tried: ``_Closed.entries`` leaving out the sent ids (a renamed turn
    read back with its own ids) and ``_Closed.of`` keeping the tokens in reverse
    order: both fail (1). ``_forget`` leaving an evicted turn's id in ``_ids``, and
    ``_SentIds.drop`` leaving a dropped call's id in ``present``: both fail (3)."""
    gateway = get_gateway(kind)
    rendered, live = TurnHistory(LIMITS), TurnHistory(LIMITS)
    for history in (rendered, live):
        history.commit("t0", [Message(role=Role.user, content="u0")], instructions=[SYSTEM])
    for number, step in enumerate(steps, start=1):
        assert _apply(rendered, step, number) == _apply(live, step, number)
        newest = rendered.turn_ids[-1]
        items = list(rendered.view().render(gateway, newest).items)
        assert items == _cold(rendered, newest, kind)  # (2)
        [run] = rendered._shared.runs.values()
        assert all(t.closed for t in rendered._turns[: run.turns])  # (2)
        assert not any(t.closed for t in live._turns)
        assert _reads(rendered) == _reads(live)  # (1)
        _check_id_maps(rendered)  # (3)
        _check_id_maps(live)


def test_a_closed_turn_holds_one_tuple_and_reads_back_its_entries() -> None:
    """Invariant (1), the representation itself: closing a rendered turn with a
    renamed call leaves one tuple holding the turn's messages, tokens and sent
    ids (no entry, no render), and its entries read back equal, new each read."""
    history = TurnHistory(LIMITS)
    history.commit("t1", [Message(role=Role.user, content="u1")], instructions=[SYSTEM])
    history.record("t1", [marked_call("a", "1"), marked_result("a", "1")])
    history.commit("t2", [Message(role=Role.user, content="u2")])
    history.record("t2", [marked_call("a", "2"), marked_result("a", "2")])  # sent a_r2
    live = [(e.message, e.tokens, e.sent) for e in history._turns[1].entries(True)]
    history.commit("t3", [Message(role=Role.user, content="u3")])
    history.view().render(get_gateway(GatewayType.anthropic), "t3")
    turn = history._turns[1]
    assert type(turn.cells) is _Closed and turn.renders is None
    messages = [m for m, _, _ in live]
    tokens = [t for _, t, _ in live]
    assert tuple(turn.cells) == (3, *messages, *tokens, None, "a_r2", "a_r2")
    assert [(e.message, e.tokens, e.sent) for e in turn.entries(True)] == live
    assert turn.entries(True)[0] is not turn.entries(True)[0]
    assert history.view().sent_call_ids("t2") == ("a_r2", "a_r2")
    # A turn whose ids are all its own keeps no sent ids.
    assert tuple(history._turns[0].cells)[-1] is None or len(history._turns[0].cells) == 1 + 2 * 3


def test_a_late_record_repairs_a_closed_later_turn() -> None:
    """Invariant (1) through a repair: a late record to t1 makes the result t2 was
    committed with answer a new call of t1, sent renamed; t2 was closed, and its
    result is sent with the new call's id, as in a history never rendered.

    Mutant tried: ``repair_results`` matching the changed entries against the
    turn's entries read again (a closed turn's are new at each read): the repair
    is lost and t2's result keeps ``a`` (fails)."""
    histories = [TurnHistory(LIMITS), TurnHistory(LIMITS)]
    gateway = get_gateway(GatewayType.openai_chat)
    for history in histories:
        history.commit("t1", [Message(role=Role.user, content="u1")], instructions=[SYSTEM])
        history.record("t1", [marked_call("a", "1")])
        history.commit("t2", [marked_result("a", "1")])  # answers t1's call: an approval
        history.record("t2", [Message(role=Role.assistant, content="ok")])
        history.commit("t3", [Message(role=Role.user, content="u3")])
    rendered, live = histories
    rendered.view().render(gateway, "t3")
    assert [t.closed for t in rendered._turns] == [True, True, False]
    late = [
        marked_result("a", "1"),
        Message(role=Role.assistant, content="more"),
        marked_call("a", "2"),
    ]
    for history in histories:
        history.record("t1", late)
    assert rendered.view().sent_call_ids("t2") == ("a_r2",)
    assert _reads(rendered) == _reads(live)
    items = list(rendered.view().render(gateway, "t3").items)
    assert items == _cold(rendered, "t3", GatewayType.openai_chat)


def test_restoring_sent_ids_changes_a_closed_turn() -> None:
    """Invariant (1) through restored ids: a checkpoint's sent ids given to a closed
    turn are what it sends from then on, and the render follows (cold equal).

    Mutant tried: ``restore_sent_ids`` changing the reopened turn's entries without
    putting it in the history: the closed turn keeps ``a_r2`` (fails)."""
    history = TurnHistory(LIMITS)
    history.commit("t1", [Message(role=Role.user, content="u1")], instructions=[SYSTEM])
    history.record("t1", [marked_call("a", "1"), marked_result("a", "1")])
    history.commit("t2", [Message(role=Role.user, content="u2")])
    history.record("t2", [marked_call("a", "2"), marked_result("a", "2")])  # sent a_r2
    history.commit("t3", [Message(role=Role.user, content="u3")])
    gateway = get_gateway(GatewayType.gemini)
    history.view().render(gateway, "t3")
    assert history._turns[1].closed
    restore_sent_ids(history, "t2", ("a_r5", "a_r5"))
    assert history.view().sent_call_ids("t2") == ("a_r5", "a_r5")
    items = list(history.view().render(gateway, "t3").items)
    assert items == _cold(history, "t3", GatewayType.gemini)
    assert history._turns[1].closed  # joined the rebuilt run: closed again

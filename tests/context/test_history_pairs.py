"""Eviction never strands an approval turn's results.

A turn whose input answers tool calls of the turn before it (an approval flow:
the model asks, a person approves, the results arrive as the next turn's input)
is evicted only together with the turn that made the calls; when the newest turn
and the turns it is tied to cannot fit a limit together, the commit (or the
record) is refused before anything changes.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.context.test_history import cold_render
from turnloom.context import (
    Gateway,
    GatewayType,
    Message,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    complete_pairs,
    get_gateway,
    message_size,
    open_call_ids,
)
from turnloom.context.history import HistoryLimits, TurnHistory
from turnloom.context.tokens import ApproxTokenCounter
from turnloom.errors import PairedTurnsTooLargeError, TurnTooLargeError

GATEWAYS = [get_gateway(kind) for kind in GatewayType]
SYSTEM = Message(role=Role.system, content="You manage the repository.")
HELLO = Message(role=Role.user, content="Hi.")
HELLO_BACK = Message(role=Role.assistant, content="Hello, how can I help?")
ASK = Message(role=Role.user, content="Delete the old branch.")
NEXT = Message(role=Role.user, content="Next.")


def calls(*ids: str) -> Message:
    return Message(
        role=Role.assistant,
        content=tuple(ToolCallPart(call_id=i, name="delete_branch", arguments="{}") for i in ids),
    )


def result(call_id: str, text: str = "deleted") -> Message:
    return Message(
        role=Role.tool,
        content=(
            ToolResultPart(call_id=call_id, name="delete_branch", content=(TextPart(text=text),)),
        ),
    )


def body_items(gateway: Gateway, items: Any) -> list[Any]:
    """The item list of the request body a host sends for ``items``."""
    return list(gateway.request_body(list(items))[gateway.items_field])


def rules(gateway: Gateway, items: Any) -> list[str]:
    """The rules the request body for ``items`` breaks (empty: the provider accepts it)."""
    return [v.rule for v in gateway.validate(body_items(gateway, items))]


def _bytes(*messages: Message) -> int:
    return sum(message_size(m) for m in messages)


def _tokens(*messages: Message) -> int:
    counter = ApproxTokenCounter()
    return sum(counter.count((m,)) for m in messages)


# t1 = [ASK, calls(c1)], t2 = [result(c1)] (the approval), t3 = [NEXT]; t0 = [HELLO, HELLO_BACK].
T0 = (HELLO, HELLO_BACK)
T1 = (ASK, calls("c1"))
T2 = (result("c1"),)
T3 = (NEXT,)

# Per limit kind: a limit the calls' turn and the approval fit together (with the
# newest turn after them, one turn too many), and one they do not fit together.
EVICTING: dict[str, HistoryLimits] = {
    "turns": HistoryLimits(max_turns=2),
    "items": HistoryLimits(max_items=3),
    "bytes": HistoryLimits(max_bytes=_bytes(*T1, *T2, *T3) - 1),
    "tokens": HistoryLimits(max_tokens=_tokens(*T1, *T2, *T3) - 1),
}
REFUSING: dict[str, tuple[HistoryLimits, int, int]] = {
    "turns": (HistoryLimits(max_turns=1), 2, 1),
    "items": (HistoryLimits(max_items=2), 3, 2),
    "bytes": (
        HistoryLimits(max_bytes=_bytes(*T1, *T2) - 1),
        _bytes(*T1, *T2),
        _bytes(*T1, *T2) - 1,
    ),
    "tokens": (
        HistoryLimits(max_tokens=_tokens(*T1, *T2) - 1),
        _tokens(*T1, *T2),
        _tokens(*T1, *T2) - 1,
    ),
}


def _approval(limits: HistoryLimits, *, with_hello: bool = False) -> TurnHistory:
    """t1 asks for a call; the history holds t0 before it when ``with_hello``."""
    history = TurnHistory(limits)
    if with_hello:
        history.commit("t0", [T0[0]], instructions=[SYSTEM])
        history.record("t0", [T0[1]])
    history.commit("t1", [T1[0]], instructions=None if with_hello else [SYSTEM])
    history.record("t1", [T1[1]])
    return history


@pytest.mark.parametrize("gateway", GATEWAYS, ids=lambda g: g.type.value)
@pytest.mark.parametrize("kind", list(EVICTING))
def test_the_calls_turn_and_the_approval_turn_are_evicted_together(
    kind: str, gateway: Gateway
) -> None:
    """Invariant: a limit that has to evict the turn holding calls evicts the turn whose
    input answers them with it (one turn more than the limit alone asks for): the kept
    input is the newest turn's, whole, and never a result without its call."""
    history = _approval(EVICTING[kind], with_hello=True)
    history.commit("t2", list(T2))
    assert history.evict() == ("t0",)
    history.commit("t3", list(T3))
    assert history.evict() == ("t1", "t2")
    assert history.turn_ids == ("t3",)
    rendered = list(history.view().render(gateway, "t3").items)
    assert rendered == [*gateway.render(SYSTEM), *gateway.render(NEXT)]
    assert rendered == cold_render(history, "t3", gateway=gateway)
    assert rules(gateway, rendered) == []


@pytest.mark.parametrize("gateway", GATEWAYS, ids=lambda g: g.type.value)
@pytest.mark.parametrize("kind", list(REFUSING))
@pytest.mark.parametrize("with_text", [False, True], ids=["results", "results+text"])
def test_an_approval_the_limits_cannot_hold_with_its_calls_is_refused_at_the_door(
    kind: str, gateway: Gateway, with_text: bool
) -> None:
    """Invariant: committing a turn whose input answers the newest turn's calls, when the
    two cannot fit a limit together, raises PairedTurnsTooLargeError naming both turns and
    the limit; nothing changed (statistics, turns, and the incremental render equals a
    cold render), and the calls' turn still renders and can be answered within limits."""
    limits, size, limit = REFUSING[kind]
    history = _approval(limits)
    before = list(history.view().render(gateway, "t1").items)  # the caches are warm
    statistics = history.statistics()
    answer = [*T2, NEXT] if with_text else list(T2)
    if with_text:
        size += {"turns": 0, "items": 1, "bytes": _bytes(NEXT), "tokens": _tokens(NEXT)}[kind]
    with pytest.raises(PairedTurnsTooLargeError) as caught:
        history.commit("t2", answer)
    error = caught.value
    assert isinstance(error, TurnTooLargeError)  # hosts catching the turn error see it
    assert (error.unit, error.size, error.limit) == (kind, size, limit)
    assert (error.turn_id, error.first_turn_id) == ("t2", "t1")
    assert str(error) == (
        "Turn 't2' input answers tool calls of turn 't1', and eviction never separates "
        f"results from their calls: turns 't1' to 't2' would be kept together with {size} "
        f"{kind}, over the history's max_{kind} of {limit}. Allow a turn making calls and "
        "the turns answering them to fit together."
    )
    assert history.statistics() == statistics
    assert history.turn_ids == ("t1",)
    assert not history.was_evicted("t2")
    after = list(history.view().render(gateway, "t1").items)
    assert after == before == cold_render(history, "t1", gateway=gateway)
    assert history.evict() == ()
    # The refused id was never used: the host may commit it (here: plain text).
    history.commit("t2", [NEXT])
    history.evict()
    rendered = list(history.view().render(gateway, "t2").items)
    assert rendered == cold_render(history, "t2", gateway=gateway)
    assert rules(gateway, rendered) == []


@pytest.mark.parametrize("kind", ["items", "bytes"])
def test_a_record_that_the_tied_turns_cannot_hold_together_is_refused(kind: str) -> None:
    """Invariant: once a turn answers calls of the turn before it, a record to either
    is checked against the limits of both together (as one turn's records are): over
    ``max_items`` or ``max_bytes`` it raises PairedTurnsTooLargeError, nothing recorded."""
    reply = Message(role=Role.assistant, content="Deleted.")
    limit = 3 if kind == "items" else _bytes(*T1, *T2)
    history = _approval(
        HistoryLimits(max_items=3) if kind == "items" else HistoryLimits(max_bytes=limit)
    )
    history.commit("t2", list(T2))
    statistics = history.statistics()
    with pytest.raises(PairedTurnsTooLargeError) as caught:
        history.record("t2", [reply])
    size = 4 if kind == "items" else _bytes(*T1, *T2, reply)
    assert (caught.value.unit, caught.value.size, caught.value.limit) == (kind, size, limit)
    assert (caught.value.turn_id, caught.value.first_turn_id) == ("t2", "t1")
    assert history.statistics() == statistics


def test_a_chain_of_approvals_is_one_unit_and_ends_at_a_turn_of_plain_input() -> None:
    """Invariant: t2 answers t1 and makes calls t3 answers: t1..t3 are tied; an approval
    t4 of t3's calls would tie four turns (over max_turns=3) and is refused; a plain t4
    ends the chain, and t1..t3 then leave together."""
    history = _approval(HistoryLimits(max_turns=3))
    history.commit("t2", [result("c1")])
    history.record("t2", [calls("c2")])
    history.commit("t3", [result("c2")])
    history.record("t3", [calls("c3")])
    assert history.evict() == ()
    with pytest.raises(PairedTurnsTooLargeError) as caught:
        history.commit("t4", [result("c3")])
    assert (caught.value.unit, caught.value.size, caught.value.limit) == ("turns", 4, 3)
    assert (caught.value.turn_id, caught.value.first_turn_id) == ("t4", "t1")
    assert "answers tool calls of turn 't3'" in str(caught.value)
    history.commit("t4", [NEXT])
    assert history.evict() == ("t1", "t2", "t3")
    assert history.turn_ids == ("t4",)
    for gateway in GATEWAYS:
        rendered = list(history.view().render(gateway, "t4").items)
        assert rendered == [*gateway.render(SYSTEM), *gateway.render(NEXT)]


# -- property: generated approval flows under every kind of limit ------------------

_flow_op = st.one_of(
    st.tuples(st.just("user"), st.integers(0, 3)),
    st.tuples(st.just("text"), st.integers(0, 3)),
    st.tuples(st.just("calls"), st.integers(1, 3)),
    st.tuples(st.just("paired"), st.integers(0, 3)),
    st.tuples(st.just("approve"), st.integers(0, 5)),
    st.tuples(st.just("ask"), st.integers(0, 5)),
)

_limits = st.one_of(
    st.builds(HistoryLimits, max_turns=st.integers(1, 4)),
    st.builds(HistoryLimits, max_items=st.integers(2, 9)),
    st.builds(HistoryLimits, max_bytes=st.integers(150, 900)),
    st.builds(HistoryLimits, max_tokens=st.integers(20, 200)),
    st.builds(
        HistoryLimits,
        max_turns=st.integers(2, 5),
        max_items=st.integers(4, 12),
        max_bytes=st.integers(300, 1200),
    ),
)


def _open_calls(history: TurnHistory) -> tuple[str, ...]:
    """The calls the newest turn leaves open (what an approval answers)."""
    view = history.view()
    newest = view.turn_ids[-1]
    tail = view.turn_messages(newest)[len(view.turn_input(newest)) :]
    return open_call_ids(view.input_messages(newest) + tail)


def _apply(history: TurnHistory, kind: str, n: int, step: int) -> None:
    """One step of a host; refused steps (a limit) must change nothing."""
    newest = history.turn_ids[-1]
    if kind == "user":
        history.commit(f"t{step}", [Message(role=Role.user, content=f"question {step}" * (n + 1))])
    elif kind == "text":
        history.record(newest, [Message(role=Role.assistant, content=f"answer {step}" * (n + 1))])
    elif kind == "calls":
        history.record(newest, [calls(*(f"c{step}_{i}" for i in range(n)))])
    elif kind == "paired":
        history.record(newest, [calls(f"p{step}"), result(f"p{step}", "x" * n)])
    else:
        open_ids = _open_calls(history)
        if not open_ids:
            return
        answered = open_ids[: 1 + n % len(open_ids)]
        answer = [result(i, f"approved {i}") for i in answered]
        if n >= 3:
            answer.append(Message(role=Role.user, content="and then?"))
        history.commit(f"t{step}", answer)


@settings(max_examples=150)
@given(_limits, st.lists(_flow_op, min_size=1, max_size=40))
@example(HistoryLimits(max_turns=2), [("ask", 0), ("user", 0)])
@example(HistoryLimits(max_items=3), [("ask", 0), ("text", 0)])
@example(HistoryLimits(max_bytes=400), [("ask", 1), ("text", 3), ("user", 0)])
@example(HistoryLimits(max_tokens=40), [("ask", 0), ("user", 3), ("ask", 1)])
def test_every_prepared_input_of_an_approval_flow_is_valid_and_strands_no_result(
    limits: HistoryLimits, ops: list[tuple[str, int]]
) -> None:
    """Invariant: under any limit, whatever the commits, approvals (results as the next
    turn's input), records and evictions, the newest turn's prepared input passes every
    gateway's validate() (its request body), holds every tool result the kept history
    holds (none stranded by eviction), has the newest turn's input in it, equals a cold
    render, and the kept history is within max_turns, max_items and max_bytes (and
    max_tokens unless only the newest turn and those tied to it are kept). A refused
    commit or record changes nothing."""
    history = TurnHistory(limits)
    history.commit("t0", [Message(role=Role.user, content="hello")], instructions=[SYSTEM])
    # "ask": the model asks (calls), then the approval arrives as the next turn's input.
    steps = [
        s
        for k, n in ops
        for s in ([("calls", 1 + n % 2), ("approve", n)] if k == "ask" else [(k, n)])
    ]
    for step, (kind, n) in enumerate(steps, start=1):
        statistics, turns = history.statistics(), history.turn_ids
        try:
            _apply(history, kind, n, step)
        except TurnTooLargeError:
            assert (history.statistics(), history.turn_ids) == (statistics, turns)
        history.evict()
        stats = history.statistics()
        assert stats.turns <= limits.max_turns
        assert stats.items <= limits.max_items
        assert stats.bytes <= limits.max_bytes
        newest = history.turn_ids[-1]
        view = history.view()
        if limits.max_tokens is not None and stats.tokens > limits.max_tokens:
            # Over max_tokens only when every earlier cut would strand a result.
            kept = view.turn_ids
            for cut in range(1, len(kept)):
                tail = [m for t in kept[cut:-1] for m in view.turn_messages(t)]
                tail += view.turn_input(newest)
                results = sum(len(m.tool_results) for m in tail)
                assert sum(len(m.tool_results) for m in complete_pairs(tail)) < results
        messages = list(view.input_messages(newest))
        held = sum(len(m.tool_results) for m in messages)
        assert sum(len(m.tool_results) for m in complete_pairs(messages)) == held
        for gateway in GATEWAYS:
            rendered = view.render(gateway, newest)
            items = list(rendered.items)
            assert rendered.turn_start < len(items)
            assert items == cold_render(history, newest, gateway=gateway)
            assert rules(gateway, items) == []
            assert msgspec.json.encode(items)  # JSON-serializable as sent

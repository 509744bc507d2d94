"""Call ids decided at commit and kept through evictions (turnloom.context.history, "Call ids").

Histories that reuse call ids from a tiny alphabet everywhere, changed by random
commits (some answering the newest turn's open calls), records, evictions and
retractions, rendered on every gateway after each step:

1. every request carries each call id once, and each result the id of the call
   it answers;
2. a retained turn's sent ids never change (eviction renames nothing kept);
3. the incremental render equals a cold render of the messages as sent;
4. replaying the full log, and a checkpoint then the records after it, rebuild
   histories that render the same bytes and send the same ids.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.context.gateways._support import call_sites
from tests.context.marked_calls import marked_call, marked_result
from turnloom.context import (
    GatewayType,
    Message,
    NativeContent,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    complete_pairs,
    get_gateway,
)
from turnloom.context.callids import rename_call_ids
from turnloom.context.gateway import step_join
from turnloom.context.history import (
    HistoryLimits,
    HistoryView,
    TurnHistory,
    _sent,
    restore_sent_ids,
)
from turnloom.errors import InvalidMessageError, StateError, TurnloomError, UnknownTurnError
from turnloom.runtime._records import (
    Checkpoint,
    OutputsRecorded,
    TurnCommitted,
    TurnRetracted,
    TurnsEvicted,
    checkpoint,
    compacted,
    encode_record,
    replay,
)

IDS = ("a", "b", "c")
KINDS = list(GatewayType)
SYSTEM = Message(role=Role.system, content="You are terse.")


def _has_id(part: object) -> bool:
    return isinstance(part, (ToolCallPart, ToolResultPart))


def _effective(view: HistoryView, turn_id: str) -> list[str]:
    """The id each call and result of the turn is sent with (input, outputs, state)."""
    sent = view.sent_call_ids(turn_id)
    if sent:
        return list(sent)
    given = view.turn_input(turn_id)
    messages = (*given, *view.turn_messages(turn_id)[len(given) :], *view.turn_state(turn_id))
    return [p.call_id for m in messages for p in m.parts if _has_id(p)]


def _cold(view: HistoryView, turn_id: str, kind: GatewayType) -> list[NativeContent]:
    gateway = get_gateway(kind)
    messages = complete_pairs(list(view.sent_messages(turn_id)), join=step_join(gateway))
    return rename_call_ids(kind, [i for m in messages for i in gateway.render(m)])


def _check_pairs(view: HistoryView, turn_id: str) -> None:
    """(1), neutral side: each result as sent carries the id of the call it answers
    (the token its call carries), and no two calls share an id."""
    messages = complete_pairs(list(view.sent_messages(turn_id)))
    tokens: dict[str, str] = {}
    for message in messages:
        for part in message.parts:
            if type(part) is ToolCallPart:
                assert part.call_id not in tokens
                tokens[part.call_id] = msgspec.json.decode(part.arguments)["t"]
            elif type(part) is ToolResultPart:  # none cancelled: open calls are excluded
                assert tokens[part.call_id] == part.content[0].text  # type: ignore[union-attr]


def _check_request(kind: GatewayType, items: list[NativeContent]) -> None:
    """(1), wire side: each call id once; each result after a call with its id."""
    sites = call_sites(kind.value, items)
    calls = [s for s in sites if s[0] == "call"]
    assert max(Counter(c[2] for c in calls).values(), default=1) == 1
    first = {c[2]: c[1] for c in calls}
    for _, index, call_id in (s for s in sites if s[0] == "result"):
        assert call_id in first and first[call_id] < index


def _check_renders(view: HistoryView, turn_id: str, kinds: list[GatewayType] = KINDS) -> None:
    """(1) on both sides and (3): the pairs as sent, each gateway's request, and
    the incremental render of ``turn_id`` equal to a cold one."""
    _check_pairs(view, turn_id)
    for kind in kinds:
        items = list(view.render(get_gateway(kind), turn_id).items)
        _check_request(kind, items)
        assert items == _cold(view, turn_id, kind)  # (3)


_step = st.one_of(
    st.tuples(
        st.just("record"),
        st.lists(st.sampled_from(IDS), min_size=1, max_size=2, unique=True),
        st.integers(0, 2),
    ),
    st.tuples(st.just("commit"), st.booleans(), st.integers(0, 2)),
    st.tuples(st.just("evict"), st.just(False), st.just(0)),
    st.tuples(st.just("retract"), st.just(False), st.just(0)),
)


def _run(
    steps: list[tuple[str, Any, int]],
    kinds: list[GatewayType],
    history: TurnHistory,
    door: GatewayType | None = None,
) -> tuple[list[bytes], dict[str, list[str]]]:
    """Apply ``steps`` to ``history``, checking (1)-(3) after each; the log written.

    ``door``: each batch is first checked and rendered for that gateway, as the
    runtime's door does (the renders seed the entries' caches).
    """
    log: list[bytes] = []
    fixed: dict[str, list[str]] = {}  # turn id -> its sent ids when last seen
    history.commit("t0", [Message(role=Role.user, content="u0")], instructions=[SYSTEM])
    first = TurnCommitted(
        turn_id="t0", input=history.view().turn_input("t0"), instructions=(SYSTEM,)
    )
    log.append(encode_record(first))
    number = 0
    for op, arg, n in steps:
        number += 1
        newest = history.turn_ids[-1]
        if op == "record":
            answered = arg[:-1] if n == 2 else arg  # the last call may stay open
            outputs: list[Message] = []
            for k, call_id in enumerate(arg):
                outputs.append(marked_call(call_id, f"{number}.{k}"))
            for k, call_id in enumerate(arg):
                if call_id in answered:
                    outputs.append(marked_result(call_id, f"{number}.{k}"))
            outputs.append(Message(role=Role.assistant, content=f"a{number}"))
            try:
                if door is not None:
                    history.check_batch(outputs, "door", turn_id=newest, gateway=get_gateway(door))
                history.record(newest, outputs)
            except TurnloomError:
                continue
            log.append(encode_record(OutputsRecorded(turn_id=newest, outputs=tuple(outputs))))
        elif op == "commit":
            turn_id = f"t{number}"
            given: list[Message] = [Message(role=Role.user, content=f"u{number}")]
            if arg:  # an approval: results for the newest turn's open calls
                given = [
                    marked_result(c.call_id, msgspec.json.decode(c.arguments)["t"])
                    for c in history.open_calls()
                ] or given
            try:
                if door is not None:
                    history.check_batch(given, "door", gateway=get_gateway(door))
                history.commit(turn_id, given)
            except TurnloomError:
                continue
            log.append(encode_record(TurnCommitted(turn_id=turn_id, input=tuple(given))))
        elif op == "evict":
            gone = history.evict()
            if gone:
                log.append(encode_record(TurnsEvicted(turn_ids=gone)))
        else:
            if len(history.turn_ids) == 1:
                continue
            try:
                history.retract(newest)
            except (StateError, UnknownTurnError):
                continue
            fixed.pop(newest, None)
            log.append(encode_record(TurnRetracted(turn_id=newest)))
        view = history.view()
        for turn_id in view.turn_ids:
            ids = _effective(view, turn_id)
            before = fixed.get(turn_id)
            if before is not None:
                assert ids[: len(before)] == before  # (2): kept ids never change
            fixed[turn_id] = ids
        newest = view.turn_ids[-1]
        _check_renders(view, newest, kinds)
    return log, fixed


def _renders(history: TurnHistory, kinds: list[GatewayType]) -> list[bytes]:
    view = history.view()
    newest = view.turn_ids[-1]
    return [
        b"".join(msgspec.json.encode(i) for i in view.render(get_gateway(k), newest).items)
        for k in kinds
    ]


LIMITS = HistoryLimits(low_water=1.0, max_turns=3, max_items=12, max_bytes=1 << 20)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(_step, min_size=1, max_size=24),
    st.lists(st.sampled_from(KINDS), min_size=1, max_size=3, unique=True),
)
def test_sent_ids_are_unique_fixed_cold_and_durable(
    steps: list[tuple[str, Any, int]], kinds: list[GatewayType]
) -> None:
    """Invariants (1)-(4) of the module docstring, over ids reused everywhere."""
    history = TurnHistory(LIMITS)
    log, _ = _run(steps, kinds, history)
    expected = _renders(history, kinds)
    ids = {t: _effective(history.view(), t) for t in history.turn_ids}
    # (4) the full log, replayed.
    replayed = replay("c", log, LIMITS)
    assert _renders(replayed, kinds) == expected
    assert {t: _effective(replayed.view(), t) for t in replayed.turn_ids} == ids
    # (4) a checkpoint, then the records after it.
    view, evicted, after = compacted(history)
    restored = replay(
        "c", [checkpoint(view, evicted, history.sequence), *map(encode_record, after)], LIMITS
    )
    assert _renders(restored, kinds) == expected
    assert {t: _effective(restored.view(), t) for t in restored.turn_ids} == ids


@settings(max_examples=120, deadline=None)
@given(
    st.lists(_step, min_size=4, max_size=24),
    st.sampled_from(KINDS),
    st.lists(st.sampled_from(KINDS), min_size=1, max_size=3, unique=True),
)
def test_door_renders_renamed_at_commit_equal_a_cold_render(
    steps: list[tuple[str, Any, int]], door: GatewayType, kinds: list[GatewayType]
) -> None:
    """Invariant (3) with each batch rendered at the door first, as the runtime
    does (the door's renders seed the entries' caches): every incremental render
    (the door's gateway and others) equals a cold render of the messages as sent,
    and the log replayed renders the same bytes.

    Mutant tried: a renamed entry keeping the door's render of its own ids
    (``_set_sent`` not dropping it): fails (a reused id reaches the request twice)."""
    history = TurnHistory(LIMITS)
    log, _ = _run(steps, [door, *[k for k in kinds if k is not door]], history, door)
    everything = list(GatewayType)
    assert _renders(replay("c", log, LIMITS), everything) == _renders(history, everything)


def _reuse_history() -> TurnHistory:
    """t1 sends a, t2 reuses it (sent a_r2), t3 is the newest."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=2))
    history.commit("t1", [Message(role=Role.user, content="u1")], instructions=[SYSTEM])
    history.record("t1", [marked_call("a", "1"), marked_result("a", "1")])
    history.commit("t2", [Message(role=Role.user, content="u2")])
    history.record("t2", [marked_call("a", "2"), marked_result("a", "2")])
    history.commit("t3", [Message(role=Role.user, content="u3")])
    return history


def test_a_checkpoint_restores_the_sent_ids_after_the_first_use_left() -> None:
    """Invariant (4), the case it exists for: once t1 (the first ``a``) is evicted, t2
    still sends ``a_r2``; a checkpoint carries it, so a restored history sends it too,
    while the host's messages keep the id it gave."""
    history = _reuse_history()
    assert history.evict() == ("t1",)
    view = history.view()
    assert view.sent_call_ids("t2") == ("a_r2", "a_r2")
    assert [p.call_id for m in view.turn_messages("t2") for p in m.parts if _has_id(p)] == [
        "a",
        "a",
    ]
    data = checkpoint(view, history.evicted_ids, None)
    assert msgspec.msgpack.decode(data, type=Checkpoint).turns[0].call_ids == ("a_r2", "a_r2")
    restored = replay("c", [data], history.limits)
    assert restored.view().sent_call_ids("t2") == ("a_r2", "a_r2")
    assert _renders(restored, KINDS) == _renders(history, KINDS)
    # Later reuses continue from the same ids: a is free again, a_r2 is not.
    for h in (history, restored):
        h.record("t3", [marked_call("a", "3"), marked_result("a", "3")])
        h.commit("t4", [Message(role=Role.user, content="u4")])
        h.record("t4", [marked_call("a", "4"), marked_result("a", "4")])
        h.commit("t5", [Message(role=Role.user, content="u5")])
    assert history.view().sent_call_ids("t4") == ("a_r3", "a_r3")
    assert restored.view().sent_call_ids("t4") == ("a_r3", "a_r3")
    assert _renders(restored, KINDS) == _renders(history, KINDS)


def test_an_old_checkpoint_without_call_ids_still_loads() -> None:
    """A checkpoint written before ``CheckpointTurn.call_ids`` (no such key) decodes and
    restores the ids its turns alone decide: every id sent once."""
    history = _reuse_history()
    history.evict()
    data = checkpoint(history.view(), history.evicted_ids, None)
    record = msgspec.msgpack.decode(data)
    del record["call_ids"]
    for turn in record["turns"]:
        del turn["call_ids"]
    old = msgspec.msgpack.encode(record)
    restored = replay("c", [old], history.limits)
    assert restored.view().sent_call_ids("t2") == ()
    for kind in KINDS:
        items = list(restored.view().render(get_gateway(kind), "t3").items)
        _check_request(kind, items)
        assert [s[2] for s in call_sites(kind.value, items)] == ["a", "a"]


def test_restore_sent_ids_refuses_bad_ids_and_changes_nothing() -> None:
    """Bad input: a wrong count, an empty id, or an id another kept call is sent with is
    a typed error, and the history sends what it sent before."""
    history = _reuse_history()
    before = _renders(history, KINDS)
    for ids in (("x",), ("", "x"), ("a", "a")):
        with pytest.raises(InvalidMessageError):
            restore_sent_ids(history, "t2", ids)
        assert history.view().sent_call_ids("t2") == ("a_r2", "a_r2")
    with pytest.raises(UnknownTurnError):
        restore_sent_ids(history, "nope", ("x", "x"))
    assert _renders(history, KINDS) == before


def test_eviction_frees_ids_and_reuses_the_smallest_free_number() -> None:
    """The rule: a reuse of an id a kept call is sent with gets the smallest free
    ``_r<n>``; an evicted call's id is free again (the accelerator never skips one)."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=3))
    history.commit("t0", [Message(role=Role.user, content="u0")])
    sent: list[tuple[str, ...]] = []
    for number in range(1, 9):
        history.record(
            f"t{number - 1}", [marked_call("a", str(number)), marked_result("a", str(number))]
        )
        history.commit(f"t{number}", [Message(role=Role.user, content=f"u{number}")])
        history.evict()
        sent.append(tuple(_effective(history.view(), f"t{number - 1}")))
    # Three turns kept: at most three a's at once, numbers recycled as turns leave.
    assert [s[0] for s in sent] == ["a", "a_r2", "a_r3", "a", "a_r2", "a_r3", "a", "a_r2"]


def _mutant_release(history: Any, turns: Any) -> None:
    """A mutant of eviction: re-decide the kept turns' ids as if they were all there was."""
    original_release(history, turns)
    gone = {id(t) for t in turns}
    kept = [t for t in history._turns if id(t) not in gone]
    history._sent = _sent._SentIds()
    for turn in kept:
        turn.cells = turn.entries(True)  # a closed turn live again, in place
        for entry in turn.entries(True):
            _sent._set_sent(entry, None)
    for index, turn in enumerate(kept):
        _sent._assign(history._sent, turn.entries(True), _sent._context(kept, index), True)


original_release = _sent.release


def test_the_fixed_ids_property_catches_an_eviction_that_renames_anew(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The test can fail: with eviction renaming the kept turns anew (the behaviour
    this replaced), invariant (2) is violated on the first eviction of a first use."""
    import turnloom.context.history._evictions as evictions

    monkeypatch.setattr(evictions, "release", _mutant_release)
    steps: list[tuple[str, Any, int]] = [
        ("record", ["a"], 0),
        ("commit", False, 0),
        ("record", ["a"], 0),
        ("commit", False, 0),
        ("commit", False, 0),
        ("evict", False, 0),  # t0 leaves: t2 held the reuse, sent a_r2
    ]
    with pytest.raises(AssertionError):
        _run(steps, [GatewayType.openai_chat], TurnHistory(LIMITS))
    monkeypatch.undo()
    _run(steps, [GatewayType.openai_chat], TurnHistory(LIMITS))


def test_a_late_call_that_an_earlier_result_now_answers_gives_it_its_sent_id() -> None:
    """Invariant (1) through a late record: t0's call c0 is closed unanswered, t3's
    result c0 was an orphan when committed; a late c0 recorded to t2 (sent c0_r2, c0 is
    kept) now has that result as its answer, so the result is sent c0_r2 too and the
    pair stays in the render, cold and restored alike."""
    history = TurnHistory(HistoryLimits(max_turns=4))
    history.commit("t0", [Message(role=Role.user, content="hello")], instructions=[SYSTEM])
    history.record("t0", [marked_call("c0", "0")])
    history.commit("t2", [Message(role=Role.user, content="question")])
    history.commit("t3", [marked_result("c0", "1")])
    history.record("t2", [marked_call("c0", "1")])  # late: t3 is the newest turn
    view = history.view()
    assert view.sent_call_ids("t2") == ("c0_r2",)
    assert view.sent_call_ids("t3") == ("c0_r2",)
    _check_pairs(view, "t3")
    for kind in KINDS:
        items = list(view.render(get_gateway(kind), "t3").items)
        _check_request(kind, items)
        assert items == _cold(view, "t3", kind)
        assert [s[2] for s in call_sites(kind.value, items)] == ["c0_r2", "c0_r2"]
    restored = replay("c", [checkpoint(view, (), None)], history.limits)
    assert _renders(restored, KINDS) == _renders(history, KINDS)


def test_a_result_recorded_apart_from_its_renamed_call_is_sent_with_the_calls_id() -> None:
    """Invariant (1), one message per record: the call of t1 reuses ``a`` (kept in t0),
    so it is sent ``a_r2``; its result, recorded alone after it, reads the pairing
    context before it (the walk back that only a batch holding a result needs) and is
    sent ``a_r2`` too. A batch of calls alone takes its ids from the ids present: the
    next reuse, also recorded alone, is ``a_r3``.

    Mutant tried: assigning every batch without that context (``paired = False`` in
    ``assign_outputs``); the result is then sent ``a`` and this test fails."""
    history = TurnHistory(HistoryLimits(max_turns=8))
    history.commit("t0", [Message(role=Role.user, content="u0")])
    history.record("t0", [marked_call("a", "0")])
    history.record("t0", [marked_result("a", "0")])
    history.commit("t1", [Message(role=Role.user, content="u1")])
    history.record("t1", [marked_call("a", "1")])
    history.record("t1", [marked_result("a", "1")])
    history.record("t1", [marked_call("a", "2")])
    view = history.view()
    assert view.sent_call_ids("t0") == ()  # sent as given
    assert view.sent_call_ids("t1") == ("a_r2", "a_r2", "a_r3")
    _check_renders(view, "t1")


def test_an_input_result_answering_a_renamed_call_is_sent_with_its_id() -> None:
    """Invariant (1) across a commit: t1's call is sent ``a_r2``; t2's input answers
    it (an approval), so the committed result reads the kept turns' pairing context
    and is sent ``a_r2``. Mutant tried: ``paired = False`` in ``assign_input`` (the
    result is sent ``a``)."""
    history = TurnHistory(HistoryLimits(max_turns=8))
    history.commit("t0", [Message(role=Role.user, content="u0")])
    history.record("t0", [marked_call("a", "0"), marked_result("a", "0")])
    history.commit("t1", [Message(role=Role.user, content="u1")])
    history.record("t1", [marked_call("a", "1")])
    history.commit("t2", [marked_result("a", "1")])
    view = history.view()
    assert view.sent_call_ids("t1") == ("a_r2",)
    assert view.sent_call_ids("t2") == ("a_r2",)
    _check_pairs(view, "t2")


def test_results_of_a_step_split_one_call_per_record_get_each_calls_sent_id() -> None:
    """Invariant (1) when a step is recorded one call per message and one message per
    record: both calls reuse kept ids (``a_r2``, ``b_r2``) and each result, recorded
    alone, is sent with its call's id, however many messages the turn held before
    the step (the pairing context is read from the start of the turn's last step,
    its whole run of assistant messages). Mutant tried: the context fed from the
    run's last assistant message only (result ``a`` is then sent ``a``)."""
    history = TurnHistory(HistoryLimits(max_turns=8))
    history.commit("t0", [Message(role=Role.user, content="u0")])
    history.record("t0", [marked_call("a", "0"), marked_call("b", "0")])
    history.record("t0", [marked_result("a", "0"), marked_result("b", "0")])
    history.commit("t1", [Message(role=Role.user, content="u1")])
    history.record("t1", [Message(role=Role.assistant, content="looking")])
    history.record("t1", [Message(role=Role.user, content="more")])
    for message in (
        marked_call("a", "1"),
        marked_call("b", "1"),
        marked_result("a", "1"),
        marked_result("b", "1"),
    ):
        history.record("t1", [message])
    view = history.view()
    assert view.sent_call_ids("t1") == ("a_r2", "b_r2", "a_r2", "b_r2")
    _check_renders(view, "t1")


def test_a_renamed_message_keeps_only_its_sent_ids() -> None:
    """Memory (issue 32): a message sent renamed keeps the ids it is sent with (a lone
    id bare, else a tuple in part order; an id sent as it is the part's own str), never
    a copy of the message; the message as sent is built from them where it is read."""
    history = _reuse_history()
    call, result = history._turns[1].outputs
    assert (call.sent, result.sent) == ("a_r2", "a_r2")
    assert (call.wire, result.wire) == (marked_call("a_r2", "2"), marked_result("a_r2", "2"))
    assert call.message == marked_call("a", "2")  # what the host gave stays as it was
    pair = Message(
        role=Role.assistant,
        content=(
            TextPart(text="two calls"),
            ToolCallPart(call_id="a", name="f", arguments='{"t": "3"}'),
            ToolCallPart(call_id="b", name="f", arguments='{"t": "3"}'),
        ),
    )
    history.record("t3", [pair, marked_result("a", "3"), marked_result("b", "3")])
    two, first, second = history._turns[2].outputs
    assert two.sent == ("a_r3", "b")
    assert two.sent[1] is pair.parts[2].call_id  # type: ignore[union-attr]
    assert (first.sent, second.sent) == ("a_r3", None)
    assert two.wire.parts[0] is pair.parts[0]
    assert [p.call_id for p in two.wire.parts[1:]] == ["a_r3", "b"]  # type: ignore[union-attr]
    assert history.view().sent_call_ids("t3") == ("a_r3", "b", "a_r3", "b")


def test_a_render_builds_each_renamed_message_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Render cost of kept ids (issue 32): a renamed message is built from its ids
    (``_Entry.wire``) once per render that plans its turn, in the pairing pass, and
    rendered from that build; a turn in the cached run is not built again."""
    from turnloom.context.history import _cells

    built: list[str] = []
    original = _cells.with_ids

    def counting(message: Message, sent: Any) -> Message:
        built.append(sent if isinstance(sent, str) else ",".join(sent))
        return original(message, sent)

    monkeypatch.setattr(_cells, "with_ids", counting)
    history = _reuse_history()  # t2's call and result are sent a_r2
    for kind in KINDS:  # a run per gateway: t1 and t2 join each, built once per render
        built.clear()
        history.view().render(get_gateway(kind), "t3")
        assert built == ["a_r2", "a_r2"]
    history.record("t3", [marked_call("a", "3"), marked_result("a", "3")])
    history.commit("t4", [Message(role=Role.user, content="u4")])
    built.clear()
    history.view().render(get_gateway(GatewayType.anthropic), "t4")
    assert built == ["a_r3", "a_r3"]  # t3 only: t2 is in the run


def _false_start_history() -> TurnHistory:
    """t1 sends a, t2 sends b, t3 is plain text: the history a false start t4 finds."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_items=8, max_bytes=1 << 20))
    history.commit("t1", [Message(role=Role.user, content="u1")], instructions=[SYSTEM])
    history.record("t1", [marked_call("a", "1"), marked_result("a", "1")])
    history.commit("t2", [Message(role=Role.user, content="u2")])
    history.record("t2", [marked_call("b", "2"), marked_result("b", "2")])
    history.commit("t3", [Message(role=Role.user, content="u3")])
    return history


def _all_renders(history: TurnHistory, turn_id: str) -> list[bytes]:
    """The render of ``turn_id`` on every gateway, as bytes."""
    view = history.view()
    return [
        b"".join(msgspec.json.encode(i) for i in view.render(get_gateway(k), turn_id).items)
        for k in GatewayType
    ]


def _held_aside_a() -> TurnHistory:
    """The false start t4: its first state evicts t1 (which sent a), held aside; its
    second reuses a and evicts t2 too."""
    history = _false_start_history()
    history.commit("t4", [Message(role=Role.user, content="u4")])
    assert history.keep_state("t4", [marked_call("s", "4"), marked_result("s", "4")])
    assert history.evict() == ("t1",)
    state = [
        marked_call("a", "4"),
        marked_result("a", "4"),
        marked_call("z", "4"),
        marked_result("z", "4"),
    ]
    assert history.keep_state("t4", state)
    assert history.evict() == ("t2",)
    assert history.restorable_ids == ("t1", "t2")
    return history


def _checkpoint_log(history: TurnHistory) -> list[bytes]:
    view, evicted, after = compacted(history)
    return [checkpoint(view, evicted, history.sequence), *map(encode_record, after)]


def test_kept_state_does_not_send_an_id_a_turn_held_aside_sends() -> None:
    """Invariant (4) across a false start: the newest turn's kept state never sends a call
    id that a turn held aside for its retraction (``restorable_ids``) sends, as it never
    sends one a kept turn sends. The checkpoint of such a history holds the turns held
    aside before the newest turn as the latest eviction found it, so an id both sent
    would repeat there and the checkpoint would not restore (``StoreRecordError``).

    The state reusing t1's a sends a_r2; the checkpoint restores, and the restored
    history renders the live one's bytes on every gateway, then with t4 retracted
    renders t3 as before the false start.

    Mutant tried: the state's ids decided without the held-aside ids: fails (the state
    sends a, and the checkpoint's replay raises ``StoreRecordError``)."""
    live = _false_start_history()
    before = _all_renders(live, "t3")
    history = _held_aside_a()
    assert history.view().sent_call_ids("t4") == ("a_r2", "a_r2", "z", "z")
    view, evicted, after = compacted(history)
    assert (view.turn_ids, evicted) == (("t1", "t2", "t3", "t4"), ())
    assert view.sent_call_ids("t1") == ()  # sent as given: a
    assert view.sent_call_ids("t4") == ("a_r2", "a_r2", "z", "z")
    assert after == (TurnsEvicted(turn_ids=("t1", "t2")),)
    restored = replay("c", _checkpoint_log(history), history.limits)
    assert restored.restorable_ids == ("t1", "t2")
    assert restored.view().sent_call_ids("t4") == ("a_r2", "a_r2", "z", "z")
    assert _all_renders(restored, "t4") == _all_renders(history, "t4")
    for h in (history, restored):
        h.retract("t4")
        assert h.turn_ids == ("t1", "t2", "t3")
        assert h.view().sent_call_ids("t1") == ()
        assert _all_renders(h, "t3") == before


def test_held_aside_ids_are_taken_only_while_held_aside() -> None:
    """Invariant (4), the other side: once the turns held aside are let go (a commit), the
    ids they sent are free again, in the live history and in one restored from its
    checkpoint alike; the kept state keeps the id it was sent with (a_r2), which the
    next turn's input carries on every gateway.

    Mutant tried: the held-aside ids left held after the state's are decided: fails (a
    later call a is sent a_r3)."""
    history = _held_aside_a()
    restored = replay("c", _checkpoint_log(history), history.limits)
    for h in (history, restored):
        h.commit("t5", [Message(role=Role.user, content="u5")])
        assert h.restorable_ids == ()
        assert h.evicted_ids == ("t1", "t2")
        items = list(h.view().render(get_gateway(GatewayType.openai_chat), "t5").items)
        assert [s[2] for s in call_sites("openai_chat", items)] == ["a_r2", "a_r2", "z", "z"]
        h.record("t5", [marked_call("a", "5"), marked_result("a", "5")])
        assert h.view().sent_call_ids("t5") == ()  # a is free: sent as given
    assert _all_renders(restored, "t5") == _all_renders(history, "t5")


def test_restore_sent_ids_refuses_an_id_a_turn_held_aside_sends() -> None:
    """Bad input: t1 (sending ``a``) is held aside by the eviction since t3's commit, so
    a retraction of t3 brings it back; restoring t2's ids to ``a`` would make two kept
    calls send one id then. Refused as one a kept call sends, and nothing changes: the
    retraction brings t1 back beside t2's ``a_r2``."""
    history = _reuse_history()
    assert history.evict() == ("t1",)
    assert history.restorable_ids == ("t1",)
    before = _renders(history, KINDS)
    with pytest.raises(InvalidMessageError, match="repeat an id the history sends"):
        restore_sent_ids(history, "t2", ("a", "a"))
    assert history.view().sent_call_ids("t2") == ("a_r2", "a_r2")
    assert _renders(history, KINDS) == before
    history.retract("t3")
    assert history.turn_ids == ("t1", "t2")
    assert history.view().sent_call_ids("t1") == ()
    assert history.view().sent_call_ids("t2") == ("a_r2", "a_r2")

"""Stored records: versioned encoding, typed decode errors, exact replay.

The invariant a restore relies on: replaying the log a ContextTable wrote
rebuilds the very history the table holds (turns, messages, pinned
instructions, evictions, including evictions an in-flight model call held
back), so a restored host prepares what the writing host would have.
"""

from __future__ import annotations

import contextlib

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.runtime.helpers import CHAT, SYSTEM, assistant, call, result, user
from turnloom.context import Message, Role
from turnloom.context.history import HistoryLimits, TurnHistory
from turnloom.context.tokens import ApproxTokenCounter
from turnloom.errors import (
    DuplicateIdError,
    StateError,
    StoreRecordError,
    TurnloomError,
    TurnTooLargeError,
)
from turnloom.runtime._contexts import ContextTable
from turnloom.runtime._counters import Counters
from turnloom.runtime._records import (
    SCHEMA_VERSION,
    OutputsRecorded,
    Record,
    StateKept,
    TurnCommitted,
    TurnsEvicted,
    checkpoint,
    compacted,
    decode_record,
    encode_record,
    replay,
)
from turnloom.runtime.schemas import TurnSnapshot

# A version-1 commit record exactly as turnloom wrote it; it must always decode.
V1_COMMIT = bytes.fromhex(
    "86a46b696e64a6636f6d6d6974a17601a77475726e5f6964a27431a5696e7075749186a4"
    "726f6c65a475736572a7636f6e74656e749183a474797065a474657874a474657874a268"
    "69a6657874726173c0a26964c0a6657874726173c0a66c61796f7574c0a46e616d65c0ac"
    "696e737472756374696f6e73c0a873657175656e636507"
)


def test_a_version_1_record_decodes() -> None:
    record = decode_record(V1_COMMIT, "c", 0)
    assert record == TurnCommitted(
        v=1, turn_id="t1", input=(Message(role=Role.user, content="hi"),), sequence=7
    )


def test_records_round_trip_and_carry_the_schema_version() -> None:
    records: list[Record] = [
        TurnCommitted(turn_id="t1", input=(user("hi"),), instructions=(SYSTEM,), sequence=3),
        OutputsRecorded(turn_id="t1", outputs=(call("k1"), result("k1"), assistant("ok"))),
        TurnsEvicted(turn_ids=("t0",)),
    ]
    for index, record in enumerate(records):
        decoded = decode_record(encode_record(record), "c", index)
        assert decoded == record
        assert decoded.v == SCHEMA_VERSION


def test_a_record_of_a_newer_schema_is_a_typed_error_naming_the_context() -> None:
    newer = msgspec.msgpack.encode(
        {"kind": "evict", "v": SCHEMA_VERSION + 1, "turn_ids": ["t0"], "added_later": 1}
    )
    with pytest.raises(StoreRecordError, match=f"schema version {SCHEMA_VERSION + 1},") as caught:
        decode_record(newer, "ctx-9", 4)
    assert (caught.value.context_id, caught.value.index) == ("ctx-9", 4)
    unknown_kind = msgspec.msgpack.encode({"kind": "teleport", "v": SCHEMA_VERSION + 1})
    with pytest.raises(StoreRecordError, match=f"schema version {SCHEMA_VERSION + 1},"):
        decode_record(unknown_kind, "ctx-9", 0)


@pytest.mark.parametrize(
    "data",
    [b"", b"\xc1", b"not msgpack at all", msgspec.msgpack.encode({"kind": "commit", "v": 1})],
)
def test_undecodable_bytes_are_a_typed_error_never_a_skip(data: bytes) -> None:
    commit = encode_record(TurnCommitted(turn_id="t", input=(user("x"),)))
    record = encode_record(OutputsRecorded(turn_id="t", outputs=(assistant("y"),)))
    with pytest.raises(StoreRecordError, match="Record 2 of context 'c' cannot be decoded") as e:
        replay("c", [commit, record, data, record], HistoryLimits())
    assert (e.value.context_id, e.value.index) == ("c", 2)


def test_a_record_that_does_not_apply_is_a_typed_error() -> None:
    commit = encode_record(TurnCommitted(turn_id="t1", input=(user("x"),)))
    with pytest.raises(StoreRecordError, match="Record 1 of context 'c' does not apply") as caught:
        replay("c", [commit, commit], HistoryLimits())
    assert isinstance(caught.value.__cause__, DuplicateIdError)
    bad_evict = encode_record(TurnsEvicted(turn_ids=("t1",)))
    with pytest.raises(StoreRecordError, match="logs the eviction of"):
        replay("c", [commit, bad_evict], HistoryLimits())  # one turn is never evicted


# -- the replay property ------------------------------------------------------------

_op = st.one_of(
    st.tuples(st.just("commit"), st.booleans(), st.text(max_size=30)),
    st.tuples(st.just("record"), st.integers(0, 12), st.lists(st.text(max_size=40), max_size=3)),
    st.tuples(st.just("call"), st.integers(0, 12), st.booleans()),
    st.tuples(st.just("retract")),
    st.tuples(st.just("keep"), st.integers(0, 12), st.booleans()),
)


def _same(left: TurnHistory, right: TurnHistory, *, counters: bool = True) -> None:
    a, b = left.view(), right.view()
    assert a.turn_ids == b.turn_ids
    assert a.pinned == b.pinned
    for turn_id in a.turn_ids:
        assert a.turn_messages(turn_id) == b.turn_messages(turn_id)
        assert a.turn_state(turn_id) == b.turn_state(turn_id)
        assert a.render(CHAT, turn_id).items == b.render(CHAT, turn_id).items
    # Drops are counted, not stored: a record that kept nothing is not logged.
    kept: tuple[str, ...] = ("turns", "items", "bytes", "pinned_items", "pinned_bytes")
    if counters:  # a checkpoint does not carry what left before it
        kept += ("evicted_turns",)
    assert [getattr(left.statistics(), k) for k in kept] == [
        getattr(right.statistics(), k) for k in kept
    ]
    assert all(left.was_evicted(t) == right.was_evicted(t) for t in (f"t{i}" for i in range(42)))
    assert left.sequence == right.sequence


@settings(max_examples=150)
@given(
    ops=st.lists(_op, max_size=40),
    max_turns=st.integers(1, 4),
    max_items=st.integers(2, 9),
    max_tokens=st.integers(5, 80),
    low_water=st.sampled_from([1.0, 1.0, 0.5, 0.01]),
)
# A checkpointed turn whose outputs fill it and whose pair was kept after
# them: restoring the pair before the outputs refused the outputs.
@example(
    ops=[("commit", False, ""), ("record", 0, ["0"]), ("keep", 0, True)],
    max_turns=1,
    max_items=2,
    max_tokens=5,
    low_water=1.0,
)
def test_replaying_the_log_rebuilds_the_history_exactly(
    ops: list[tuple[object, ...]], max_turns: int, max_items: int, max_tokens: int, low_water: float
) -> None:
    """Commits, records (also late and blank), kept state pairs (set, replaced,
    cleared, for gone turns), retractions, evictions by turns, items and tokens,
    one turn at a time or down to a low-water mark, evictions held back by a
    model call."""
    limits = HistoryLimits(
        max_turns=max_turns, max_items=max_items, max_tokens=max_tokens, low_water=low_water
    )
    counter = ApproxTokenCounter()
    table = ContextTable(limits, CHAT, Counters(), counter)
    log: list[bytes] = []
    table.log = lambda context_id, record: log.append(encode_record(record))
    committed: list[str] = []
    for op in ops:
        try:
            if op[0] == "commit":
                turn_id = f"t{len(committed)}"
                table.commit(
                    "c",
                    TurnSnapshot(
                        context_id="c",
                        turn_id=turn_id,
                        input=(user(str(op[2]) or "hi"),),
                        instructions=(SYSTEM,) if op[1] else None,
                        sequence=len(committed),
                    ),
                )
                committed.append(turn_id)
            elif committed and op[0] == "record":
                assert isinstance(op[1], int)
                turn_id = committed[op[1] % len(committed)]  # held, or evicted (late)
                texts = op[2]
                assert isinstance(texts, list)
                table.record(table.get("c"), turn_id, [assistant(t) for t in texts])
            elif committed and op[0] == "keep":
                assert isinstance(op[1], int)
                turn_id = committed[op[1] % len(committed)]
                state = table.get("c")
                if state.history.has_turn(turn_id):
                    serial = state.history.turn_serial(turn_id)
                    kept = (
                        call(f"tlrs_{op[1]}", "turnloom_runtime_context"),
                        result(f"tlrs_{op[1]}"),
                    )
                    table.keep_state(state, turn_id, kept if op[2] else (), serial)
            elif committed and op[0] == "retract":
                table.retract(table.get("c"), "c", committed[-1])
            elif committed and op[0] == "call":
                state = table.get("c")
                if state.in_flight is None and state.history.has_turn(committed[-1]):
                    table.begin_call("c", committed[-1])
                elif state.in_flight is not None:
                    table.end_call(state, evict=bool(op[2]))
        except TurnloomError:
            pass
    if not committed:
        assert log == []
        return
    history = table.get("c").history
    _same(replay("c", log, limits, counter), history)
    if not history.turn_ids:  # every turn retracted: nothing to checkpoint
        return
    # A checkpoint taken now, then more changes: the same history again.
    compacted = [checkpoint(history.view(), history.evicted_ids, history.sequence)]
    table.log = lambda context_id, record: compacted.append(encode_record(record))
    extra = f"t{len(committed)}"
    table.commit("c", TurnSnapshot(context_id="c", turn_id=extra, input=(user("after"),)))
    table.record(table.get("c"), extra, [assistant("answer after")])
    for turn_id in committed:  # late outputs for evicted turns are dropped again
        # (a turn still held by a model call in flight may be full: refused, no change)
        with contextlib.suppress(TurnTooLargeError):
            table.record(table.get("c"), turn_id, [assistant("late")])
        break
    log.extend(compacted[1:])
    _same(replay("c", log, limits, counter), history)
    _same(replay("c", compacted, limits, counter), history, counters=False)


def test_a_checkpoint_anywhere_but_first_is_a_typed_error() -> None:
    history = TurnHistory(HistoryLimits())
    with pytest.raises(StateError, match="without turns"):
        checkpoint(history.view(), (), None)
    history.commit("t1", (user("x"),))
    data = checkpoint(history.view(), (), None)
    assert replay("c", [data], HistoryLimits()).turn_ids == ("t1",)
    with pytest.raises(StoreRecordError, match="only ever opens a log") as caught:
        replay("c", [data, data], HistoryLimits())
    assert caught.value.index == 1


def test_kept_state_survives_a_checkpoint_and_a_state_record_for_a_gone_turn_is_an_error() -> None:
    """A restored history holds each turn's kept state (so a restarted host sends the
    same bytes again); a log that keeps the state of a turn it does not hold is corrupt."""
    history = TurnHistory(HistoryLimits())
    history.commit("t1", (user("x"),))
    kept = (call("tlrs_1", "turnloom_runtime_context"), result("tlrs_1", "state"))
    history.keep_state("t1", kept)
    history.record("t1", (assistant("ok"),))
    data = checkpoint(history.view(), (), None)
    restored = replay("c", [data], HistoryLimits())
    assert restored.view().turn_state("t1") == kept
    assert restored.statistics() == history.statistics()
    commit = encode_record(TurnCommitted(turn_id="t1", input=(user("x"),)))
    orphan = encode_record(StateKept(turn_id="t9", state=kept))
    with pytest.raises(StoreRecordError, match="keeps the state of turn 't9'") as caught:
        replay("c", [commit, orphan], HistoryLimits())
    assert caught.value.index == 1


def test_a_checkpoint_of_a_false_start_that_evicted_twice_down_to_low_water_replays() -> None:
    """Invariant: max_items=20, low_water=0.75 (mark 15). The false start t11 evicts
    t1..t3 down to 15 items; its kept state (6 items) crosses the limit again and a
    second eviction takes t4..t6. A checkpoint written now holds t1..t10 and t11 as the
    latest eviction found it, then one eviction record: replayed, that one eviction
    drops t1..t6, as the two did, so the replayed history holds the same turns aside,
    and retracting t11 there gives back t1..t10 as the live history does."""
    limits = HistoryLimits(max_items=20, low_water=0.75)
    history = TurnHistory(limits)
    for i in range(1, 11):
        history.commit(f"t{i}", [user(f"u{i}")], instructions=[SYSTEM] if i == 1 else None)
        history.record(f"t{i}", [assistant(f"a{i}")])
    history.commit("t11", [user("*cough*")])
    assert history.evict() == ("t1", "t2", "t3")
    state = [
        m
        for k in "abc"
        for m in (call(f"tlrs_{k}", "turnloom_runtime_context"), result(f"tlrs_{k}"))
    ]
    assert history.keep_state("t11", state)
    assert history.evict() == ("t4", "t5", "t6")
    assert history.restorable_ids == tuple(f"t{i}" for i in range(1, 7))
    view, evicted, tail = compacted(history)
    assert tail == (TurnsEvicted(turn_ids=history.restorable_ids),)
    log = [checkpoint(view, evicted, history.sequence), *map(encode_record, tail)]
    replayed = replay("c", log, limits)
    assert replayed.restorable_ids == history.restorable_ids
    _same(replayed, history, counters=False)
    for copy in (history, replayed):
        copy.retract("t11")
        assert copy.turn_ids == tuple(f"t{i}" for i in range(1, 11))
    _same(replayed, history, counters=False)

"""Sent call ids decided at the door (issue 32): one render per message, the same ids.

The door (``TurnHistory.check_batch`` with a gateway) decides the ids a batch
will be sent with before it renders, so it renders each message as sent and
the commit or record takes those renders and ids instead of deciding and
rendering again. Checked here against a twin history that gets the same
changes without the door (today's path: the change decides the ids), over
generated turns that reuse call ids from a tiny alphabet, with late records,
evictions, retractions, approvals, and the plan's fallbacks: door checks made
stale by a change between the check and the record, and blank outputs the
record drops:

1. every kept entry is sent with the ids the twin's entry is sent with, and
   both histories hold the same sent ids (``_SentIds.present``, ``renamed``);
2. every entry's cached render (the door's, seeded) equals a cold render of
   the message as sent (``_Entry.wire``), items and bytes;
3. the incremental render of the newest turn equals the twin's, on every gateway.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.context.marked_calls import marked_call, marked_result
from turnloom.context import (
    GatewayType,
    Message,
    Role,
    get_gateway,
)
from turnloom.context.history import HistoryLimits, TurnHistory, _batches, _cells, restore_sent_ids
from turnloom.errors import TurnloomError

IDS = ("a", "b", "c")
SYSTEM = Message(role=Role.system, content="You are terse.")
LIMITS = HistoryLimits(low_water=1.0, max_turns=3, max_items=14, max_bytes=1 << 20)


def _outputs(ids: list[str], open_last: bool, number: int) -> list[Message]:
    """A model step calling ``ids`` (one message per call), their results, a reply."""
    answered = ids[:-1] if open_last else ids
    out = [marked_call(c, f"{number}.{k}") for k, c in enumerate(ids)]
    out += [marked_result(c, f"{number}.{k}") for k, c in enumerate(ids) if c in answered]
    out.append(Message(role=Role.assistant, content=f"a{number}"))
    return out


def _sent(history: TurnHistory) -> list[list[tuple[str, ...]]]:
    """The sent ids of every entry, turn by turn (input, state, outputs)."""
    return [[e.sent_ids() for e in t.entries(True)] for t in history._turns]


def _check_caches(history: TurnHistory) -> int:
    """(2): each cached render, of every gateway slot, equals a cold render of the
    message as sent; how many were checked."""
    cached = 0
    for gateway, slot in history._shared.gateway_slots.items():
        for turn in history._turns:
            for entry in turn.entries(True):
                if slot == 0:
                    native, encoded = entry.native, entry.encoded
                elif entry.more is not None and slot in entry.more:
                    native, encoded = entry.more[slot]
                else:
                    continue
                if native is None and encoded is None:
                    continue
                cached += 1
                cold_native, cold_encoded = _cells._render_message(entry.wire, gateway)
                if native is not None:
                    assert native == cold_native
                if encoded is not None:
                    assert encoded == cold_encoded
    return cached


def _apply(history: TurnHistory, op: str, batch: list[Message] | None) -> bool:
    """One change (the door's check, if any, made before); False when it was refused."""
    try:
        if op == "evict":
            history.evict()
        elif op == "retract":
            if len(history.turn_ids) > 1:
                history.retract(history.turn_ids[-1])
        elif op.startswith("commit:"):
            assert batch is not None
            history.commit(op[7:], batch)
        else:  # "record:<turn id>"
            assert batch is not None
            history.record(op[7:], batch)
    except TurnloomError:
        return False
    return True


_step: st.SearchStrategy[tuple[str, list[str], bool]] = st.one_of(
    st.tuples(
        st.sampled_from(["record", "twice", "blank", "late", "stale"]),
        st.lists(st.sampled_from(IDS), min_size=1, max_size=3, unique=True),
        st.booleans(),
    ),
    st.tuples(st.sampled_from(["commit", "approve"]), st.just([]), st.booleans()),
    st.tuples(st.sampled_from(["evict", "retract"]), st.just([]), st.just(False)),
)


def _twins(
    steps: list[tuple[str, list[str], bool]], door: GatewayType
) -> tuple[TurnHistory, TurnHistory, int]:
    """Apply ``steps`` to a door-checked history and its twin, checking (1)-(3) after each.

    Returns both and how many batches the door renamed an id of, stale or not
    (for the caller to see the property reach the case it is about).
    """
    checked, twin = TurnHistory(LIMITS), TurnHistory(LIMITS)
    for history in (checked, twin):
        history.commit("t0", [Message(role=Role.user, content="u0")], instructions=[SYSTEM])
    renamed = 0
    for number, (kind, ids, flag) in enumerate(steps, start=1):
        turns = checked.turn_ids
        if kind in ("record", "twice", "blank", "stale", "late"):
            target = turns[-2] if kind == "late" and len(turns) > 1 else turns[-1]
            op, batch = f"record:{target}", _outputs(ids, flag, number)
            if kind == "twice":  # a second step reusing the ids in the same batch
                batch += _outputs(ids, False, -number)
            elif kind == "blank":  # a blank output the record drops: the plan is not taken
                batch.insert(len(ids), Message(role=Role.assistant, content=" "))
        elif kind in ("commit", "approve"):
            batch = [Message(role=Role.user, content=f"u{number}")]
            if kind == "approve":  # results for the newest turn's open calls, if any
                open_calls = checked.open_calls()
                batch = [
                    marked_result(c.call_id, msgspec.json.decode(c.arguments)["t"])
                    for c in open_calls
                ] or batch
            op = f"commit:t{number}"
        else:
            op, batch = kind, None
        if kind == "stale":
            # The door checks the batch, then another change comes first: the
            # record happens in another state than the door planned for.
            assert batch is not None
            try:
                checked.check_batch(batch, "door", turn_id=target, gateway=get_gateway(door))
            except TurnloomError:
                continue
            stale = checked._checked[0][7]
            renamed += stale is not None and stale.sent is not None
            # Between: a new turn, then (``flag``) a step calling the batch's ids
            # in it, which takes ids the door planned, or an eviction, which may
            # free them; then the batch goes to the newest turn, or (``flag``)
            # to the turn the door checked it for (a late record).
            between: list[tuple[str, list[Message] | None]] = [
                (f"commit:s{number}", [Message(role=Role.user, content=f"s{number}")])
            ]
            if flag:
                between.append((f"record:s{number}", _outputs(ids, False, 1000 + number)))
            else:
                between.append(("evict", None))
            for change, messages in between:
                assert _apply(checked, change, messages) == _apply(twin, change, messages)
            op = f"record:{target if flag else checked.turn_ids[-1]}"
            door_now: GatewayType | None = None
        else:
            door_now = door
        if batch is not None and door_now is not None:
            try:
                checked.check_batch(
                    batch,
                    "door",
                    turn_id=op[7:] if op.startswith("record:") else None,
                    gateway=get_gateway(door_now),
                )
            except TurnloomError:
                continue
            plan = checked._checked[0][7]
            renamed += plan is not None and plan.sent is not None
        assert _apply(checked, op, batch) == _apply(twin, op, batch)
        assert _sent(checked) == _sent(twin)  # (1)
        assert checked._sent.present == twin._sent.present  # (1)
        assert checked._sent.renamed == twin._sent.renamed  # (1)
        _check_caches(checked)  # (2)
        for gateway_kind in GatewayType:  # (3)
            newest = checked.turn_ids[-1]
            mine = checked.view().render(get_gateway(gateway_kind), newest).items
            theirs = twin.view().render(get_gateway(gateway_kind), newest).items
            assert mine == theirs
        _check_caches(checked)  # (2), after the render used the caches
    return checked, twin, renamed


@settings(max_examples=150, deadline=None)
@given(st.lists(_step, min_size=2, max_size=24), st.sampled_from(list(GatewayType)))
def test_door_ids_equal_the_change_s_ids_and_the_door_render_a_cold_render(
    steps: list[tuple[str, list[str], bool]], door: GatewayType
) -> None:
    """Invariants (1)-(3) of the module docstring, door-checked against unchecked."""
    _twins(steps, door)


# A history whose every record reuses ``a``: from the second on, renamed at the door.
REUSE: list[tuple[str, list[str], bool]] = [
    ("record", ["a", "b"], False),
    ("commit", [], False),
    ("record", ["a"], False),
    ("late", ["b"], False),
    ("commit", [], False),
    ("record", ["a", "c"], True),
    ("approve", [], False),
    ("evict", [], False),
    ("record", ["a"], False),
    ("stale", ["a", "b"], False),
    ("stale", ["a"], True),
]


def test_a_reused_id_renamed_at_the_door_renders_each_message_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The point of the plan (issue 32): each message of a batch the door renamed is
    rendered once, at the door, and the record and the next render render none
    again; the same ids and bytes as the twin (checked by ``_twins``)."""
    rendered: list[Message] = []
    original = _cells._render_message

    def counting(message: Message, gateway: Any) -> Any:
        rendered.append(message)
        return original(message, gateway)

    monkeypatch.setattr(_cells, "_render_message", counting)
    kind = GatewayType.openai_chat
    history = TurnHistory(LIMITS)
    history.commit("t0", [Message(role=Role.user, content="u0")], instructions=[SYSTEM])
    history.record("t0", _outputs(["a"], False, 0))
    history.commit("t1", [Message(role=Role.user, content="u1")])
    history.view().render(get_gateway(kind), "t1")
    batch = _outputs(["a"], False, 1)
    rendered.clear()
    history.check_batch(batch, "door", turn_id="t1", gateway=get_gateway(kind))
    assert [p.call_id for m in rendered for p in m.parts if hasattr(p, "call_id")] == [
        "a_r2",
        "a_r2",
    ]
    assert len(rendered) == 3  # call, result, reply: each once, as sent
    history.record("t1", batch)
    history.view().render(get_gateway(kind), "t1")
    assert len(rendered) == 3  # nothing rendered again
    assert [e.sent for e in history._turns[1].outputs] == ["a_r2", "a_r2", None]
    _, _, renamed = _twins(REUSE, kind)
    # The door renamed ids of 5 batches (3 taken as planned, 2 made stale): the
    # examples reach both the plan and its fallback.
    assert renamed == 5


def test_the_property_catches_a_door_render_of_the_ids_as_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The property can fail: a door that renders the messages as given while the
    record takes its planned ids (the mutant: renders not renamed) leaves cached
    renders that are not a cold render of the messages as sent."""

    def as_given(message: Message, sent: Any) -> Message:
        return message

    monkeypatch.setattr(_batches, "with_ids", as_given)
    with pytest.raises(AssertionError):
        _twins(REUSE, GatewayType.anthropic)
    monkeypatch.undo()
    _twins(REUSE, GatewayType.anthropic)


def test_a_plan_made_stale_by_restored_ids_is_not_taken() -> None:
    """The plan holds only while the ids present are those the door saw
    (``_SentIds.version``): restoring a kept turn's sent ids keeps the turns tuple
    but frees ``a``, so the record decides anew and sends ``a`` as given, as a
    history without the door does. (Mutant tried: ``holds`` without the version
    check: the record sends the stale ``a_r2``, and this fails.)"""
    histories = [TurnHistory(LIMITS), TurnHistory(LIMITS)]
    batch = _outputs(["a"], False, 2)
    for door, history in zip((True, False), histories, strict=True):
        history.commit("t0", [Message(role=Role.user, content="u0")], instructions=[SYSTEM])
        history.record("t0", _outputs(["a"], False, 1))
        history.commit("t1", [Message(role=Role.user, content="u1")])
        if door:
            history.check_batch(batch, "door", turn_id="t1", gateway=get_gateway("anthropic"))
            plan = history._checked[0][7]
            assert plan is not None and plan.sent == ("a_r2", "a_r2", None)
        restore_sent_ids(history, "t0", ("x", "x"))
        history.record("t1", batch)
    checked, twin = histories
    assert (
        _sent(checked)
        == _sent(twin)
        == [
            [(), ("x",), ("x",), ()],
            [(), ("a",), ("a",), ()],
        ]
    )
    assert _check_caches(checked) == 1  # the reply's door render; the renamed two dropped

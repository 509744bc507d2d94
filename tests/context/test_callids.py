"""Call ids are unique within a request, on every gateway (the callids rule)."""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.context.gateways._support import ITEM_FIELD, PROVIDERS, call_sites
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
from turnloom.context.callids import (
    CallIdRenamer,
    record_renames,
    rename_call_ids,
    restore_call_ids,
)
from turnloom.context.gateway import step_join
from turnloom.context.history import TurnHistory
from turnloom.errors import AmbiguousStepError

CHAT = GatewayType.openai_chat


def _chat_call(*ids: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids
        ],
    }


def _chat_result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "ok"}


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_the_first_occurrence_keeps_its_id_and_each_reuse_counts_up() -> None:
    """Rule: first keeps; reuses get _r2, _r3 ...; a result takes its call's new id."""
    items = [
        _user("a"),
        _chat_call("x"),
        _chat_result("x"),
        _user("b"),
        _chat_call("x"),
        _chat_result("x"),
        _user("c"),
        _chat_call("x", "y"),
        _chat_result("x"),
        _chat_result("y"),
    ]
    out = rename_call_ids(CHAT, items)
    assert call_sites("openai_chat", out) == [
        ("call", 1, "x"),
        ("result", 2, "x"),
        ("call", 4, "x_r2"),
        ("result", 5, "x_r2"),
        ("call", 7, "x_r3"),
        ("call", 7, "y"),
        ("result", 8, "x_r3"),
        ("result", 9, "y"),
    ]
    # Unchanged items are the same objects; the input is not modified.
    assert [a is b for a, b in zip(out, items, strict=True)] == [
        True, True, True, True, False, False, True, False, False, True,
    ]  # fmt: skip
    assert items[4]["tool_calls"][0]["id"] == "x"


def test_a_new_id_skips_ids_present_before_it() -> None:
    """Rule: x_r2 is taken by an earlier native id, so the reuse of x becomes x_r3."""
    items = [_chat_call("x_r2"), _chat_result("x_r2"), _chat_call("x"), _chat_result("x")]
    items += [_chat_call("x"), _chat_result("x")]
    out = rename_call_ids(CHAT, items)
    assert [s[2] for s in call_sites("openai_chat", out)] == [
        "x_r2",
        "x_r2",
        "x",
        "x",
        "x_r3",
        "x_r3",
    ]


def test_an_id_equal_to_an_earlier_new_id_is_a_reuse_there() -> None:
    """Rule: renaming never looks ahead; a later native x_r2 is renamed in its turn."""
    items = [_chat_call("x"), _chat_result("x"), _chat_call("x"), _chat_result("x")]
    items += [_chat_call("x_r2"), _chat_result("x_r2")]
    out = rename_call_ids(CHAT, items)
    assert [s[2] for s in call_sites("openai_chat", out)] == [
        "x", "x", "x_r2", "x_r2", "x_r2_r2", "x_r2_r2",
    ]  # fmt: skip


def test_renaming_is_idempotent_and_appending_keeps_the_prefix() -> None:
    """Invariant: renamed items rename to themselves; a renamed prefix never changes."""
    items = [_chat_call("x"), _chat_result("x"), _chat_call("x"), _chat_result("x")]
    once = rename_call_ids(CHAT, items)
    assert rename_call_ids(CHAT, once) == once
    longer = rename_call_ids(CHAT, [*items, _chat_call("x"), _chat_result("x")])
    assert longer[:4] == once


def test_a_counter_per_id_continues_without_probing_from_two() -> None:
    """The counter per id: the n-th reuse of one id is <id>_r<n+1>, over 500 reuses."""
    renamer = CallIdRenamer()
    got = []
    for _ in range(501):
        got.append(renamer.call("x"))
        renamer.result("x")
    assert got == ["x"] + [f"x_r{n}" for n in range(2, 502)]
    assert renamer.renamed == 500


def test_a_result_for_no_call_of_its_group_keeps_its_id() -> None:
    renamer = CallIdRenamer()
    assert renamer.call("x") == "x"
    assert renamer.result("x") == "x"
    renamer.end_group()
    assert renamer.result("x") == "x"  # answers no call of the (new, empty) group
    assert renamer.call("x") == "x_r2"
    assert renamer.result("x") == "x_r2"


def test_forget_is_exact_only_when_no_kept_rename_depended_on_the_dropped_ids() -> None:
    """Eviction: forgetting is refused exactly when a kept rename came from a dropped id."""

    def state(*ids: str) -> CallIdRenamer:
        renamer = CallIdRenamer()
        for call_id in ids:
            renamer.end_group()
            renamer.call(call_id)
        return renamer

    kept = state("y", "x", "x")  # the second x became x_r2
    assert kept.forget(state("y")) is True
    assert ("y" in kept, "x" in kept, "x_r2" in kept) == (False, True, True)
    # The dropped x is the first use whose reuse was renamed.
    assert state("x", "x").forget(state("x")) is False
    # A dropped x_r3 is a name the counter of x may have skipped.
    refused = state("x_r3", "x", "x")
    assert refused.forget(state("x_r3")) is False
    assert "x_r3" in refused


# -- every gateway: request_body renames, validate flags --------------------------


def _neutral_history() -> list[Message]:
    """Two turns that reuse call id c1 (as tau-bench does)."""

    def call(call_id: str) -> Message:
        return Message(
            role=Role.assistant,
            content=(ToolCallPart(call_id=call_id, name="lookup", arguments='{"q": 1}'),),
        )

    def result(call_id: str) -> Message:
        return Message(
            role=Role.tool,
            content=(
                ToolResultPart(call_id=call_id, name="lookup", content=(TextPart(text="ok"),)),
            ),
        )

    return [
        Message(role=Role.user, content="one"),
        call("c1"),
        result("c1"),
        Message(role=Role.user, content="two"),
        call("c1"),
        result("c1"),
    ]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_request_body_renames_a_reused_call_id_on_every_gateway(provider: str) -> None:
    """Invariant: each request carries each call id once; the reuse becomes c1_r2."""
    gateway = get_gateway(provider)
    items = [i for m in complete_pairs(_neutral_history()) for i in gateway.render(m)]
    body = gateway.request_body(items)
    sent = body[ITEM_FIELD[provider]]
    assert [(kind, call_id) for kind, _, call_id in call_sites(provider, sent)] == [
        ("call", "c1"),
        ("result", "c1"),
        ("call", "c1_r2"),
        ("result", "c1_r2"),
    ]
    assert gateway.validate(sent) == []
    # validate() flags the unrenamed items: the second call reuses c1.
    assert [v.rule for v in gateway.validate(items)] == ["duplicate_call_id"]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_validate_flags_a_result_whose_call_is_not_before_it(provider: str) -> None:
    gateway = get_gateway(provider)
    items = [i for m in complete_pairs(_neutral_history()[:3]) for i in gateway.render(m)]
    user, call, result = items
    rules = [v.rule for v in gateway.validate([user, result, call])]
    assert "tool_result_without_call" in rules


# -- property: over generated histories, through the incremental history render ---

_ids = st.sampled_from(["a", "b", "a_r2", "b_r2_r2"])
_step = st.tuples(st.lists(_ids, min_size=1, max_size=3, unique=True), st.integers(0, 3))
_turn = st.lists(_step, max_size=3)


def _turn_outputs(steps: list[tuple[list[str], int]]) -> list[Message]:
    out: list[Message] = []
    for ids, answered in steps:
        out.append(
            Message(
                role=Role.assistant,
                content=tuple(ToolCallPart(call_id=i, name="f", arguments="{}") for i in ids),
            )
        )
        # ``answered`` of the calls get a result (the rest stay open).
        out.extend(
            Message(
                role=Role.tool,
                content=(ToolResultPart(call_id=i, name="f", content=(TextPart(text=i),)),),
            )
            for i in ids[:answered]
        )
    return out


def _check_request(provider: str, items: list[NativeContent]) -> None:
    sites = call_sites(provider, items)
    calls = [s for s in sites if s[0] == "call"]
    assert max(Counter(c[2] for c in calls).values(), default=1) == 1
    first_call = {c[2]: c[1] for c in calls}
    for _, index, call_id in (s for s in sites if s[0] == "result"):
        assert call_id in first_call and first_call[call_id] < index


@settings(max_examples=60)
@given(
    st.lists(st.tuples(st.lists(_ids, max_size=2, unique=True), _turn), min_size=1, max_size=5),
    st.sampled_from(PROVIDERS),
)
def test_every_prepared_input_has_unique_ids_and_a_byte_stable_prefix(
    turns: list[tuple[list[str], list[tuple[list[str], int]]]], provider: str
) -> None:
    """Invariants, over histories reusing call ids, rendered incrementally turn by turn:
    every input carries each call id once; each result comes after its call; the
    input of turn k is a byte prefix of the input of turn k+1; the cached render
    equals a cold rename of the whole list; the request body validates."""
    gateway = get_gateway(provider)
    history = TurnHistory()
    previous: bytes | None = None
    previous_items: tuple[NativeContent, ...] = ()
    for k, (input_calls, steps) in enumerate(turns):
        # A host may commit answered calls as turn input, after the user text.
        extra = _turn_outputs([(input_calls, len(input_calls))]) if input_calls else []
        history.commit(f"t{k}", [Message(role=Role.user, content=f"u{k}"), *extra])
        rendered = history.view().render(gateway, f"t{k}")
        items = list(rendered.items)
        _check_request(provider, items)
        encoded = b"".join(msgspec.json.encode(i) for i in items)
        if previous is not None:
            assert items[: len(previous_items)] == list(previous_items)
            assert encoded.startswith(previous)
        cold: list[NativeContent] = []
        view = history.view()
        # As sent: a call reusing the id of a kept call (one left open too) is
        # renamed when committed; a cold render of those messages is the render.
        sent = view.sent_messages(f"t{k}")
        for message in complete_pairs(list(sent), join=step_join(gateway)):
            cold.extend(gateway.render(message))
        assert items == rename_call_ids(gateway.type, cold)
        body = gateway.request_body(items)
        assert gateway.validate(body[ITEM_FIELD[provider]]) == []
        previous, previous_items = encoded, rendered.items
        # A call id repeated within one model step is refused and changes nothing.
        with contextlib.suppress(AmbiguousStepError):
            history.record(f"t{k}", _turn_outputs(steps))


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["set", "hide", "copy"]),
            st.integers(0, 120),
        ),
        max_size=400,
    )
)
def test_layered_state_equals_a_plain_dict_after_any_sets_hides_and_copies(
    ops: list[tuple[str, int]],
) -> None:
    """Invariant: the renamer's layered map (frozen layers shared by copies, a small
    owned top, tombstones) reads exactly as a plain dict does, and a copy is
    independent of the map it came from, whatever the order of changes."""
    from turnloom.context.callids import _Layers

    layers, oracle = _Layers(), dict[str, object]()
    copies: list[tuple[_Layers, dict[str, object]]] = []
    for op, n in ops:
        key = f"k{n}"
        if op == "set":
            layers.set(key, n)
            oracle[key] = n
        elif op == "hide":
            layers.set(key, None)
            oracle.pop(key, None)
        else:
            copies.append((layers.copy(), dict(oracle)))
            layers, oracle = copies[-1][0].copy(), dict(oracle)
    final: list[tuple[_Layers, dict[str, object]]] = [*copies, (layers, oracle)]
    for layered, expected in final:
        assert {f"k{n}": layered.get(f"k{n}") for n in range(121)} == {
            f"k{n}": expected.get(f"k{n}") for n in range(121)
        }
        assert sorted(layered.present()) == sorted(expected)


def test_a_hidden_id_stays_hidden_while_an_older_layer_holds_it() -> None:
    """Invariant: a tombstone frozen above an older layer that holds the id hides it
    (it is dropped only once merged into the oldest layer)."""
    from turnloom.context.callids import _Layers

    layers = _Layers()
    for n in range(256):  # one large oldest layer
        layers.set(f"k{n}", n)
    layers.copy()
    layers.set("k0", None)
    layers.copy()  # the tombstone, frozen above it
    assert len(layers.frozen) == 2
    assert layers.get("k0") is None
    assert "k0" not in layers.present()
    assert layers.copy().get("k0") is None


def test_record_renames_names_the_items_that_carry_ids_and_restoring_only_them_is_exact() -> None:
    """Invariant: the carriers record_renames reports are the items in which the rewriter
    found a call or result id; writing replayed ids into just those items (in order)
    gives what renaming every item from that state gives."""
    items = [
        {"role": "user", "content": "a"},
        _chat_call("c1", "c2"),
        {"role": "tool", "tool_call_id": "c1", "content": "r1"},
        {"role": "assistant", "content": "b"},
        {"role": "tool", "tool_call_id": "c2", "content": "r2"},
        _chat_call("c1"),
    ]
    carriers: list[int] = []
    state = CallIdRenamer()
    renamed, events, ids = record_renames(CHAT, items, state, carriers)
    assert carriers == [1, 2, 4, 5]
    assert renamed == rename_call_ids(CHAT, items)
    assert ids == ("c1", "c2", "c1", "c2", "c1_r2")
    assert record_renames(CHAT, items, CallIdRenamer())[1:] == (events, ids)
    # From a state that saw c2 already: replayed ids written into the carriers only.
    seen = CallIdRenamer()
    rename_call_ids(CHAT, [_chat_call("c2")], seen)
    expected = rename_call_ids(CHAT, items, seen.copy())
    replayed = seen.replay(events)
    restored = restore_call_ids(CHAT, [renamed[i] for i in carriers], replayed)
    out = list(renamed)
    for at, item in zip(carriers, restored, strict=True):
        out[at] = item
    assert out == expected
    assert out[1]["tool_calls"][1]["id"] == "c2_r2"
